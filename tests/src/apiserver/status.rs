//! API errors and the `Status` bodies kube-apiserver sends for them, message for message.
//!
//! Clients branch on `reason` and `code` (kube-rs retries on 409, relists on 410; kubectl
//! prints `message`), so these mirror apimachinery's `k8s.io/apimachinery/pkg/api/errors`.

use serde_json::{Value, json};

use super::resource::ResourceDef;

pub type Result<T, E = ApiError> = std::result::Result<T, E>;

/// One field-level problem inside an Invalid or Conflict status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error("{resource} \"{name}\" not found")]
    NotFound {
        group: &'static str,
        resource: String,
        name: String,
    },
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists {
        group: &'static str,
        resource: String,
        name: String,
    },
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {reason}")]
    Conflict {
        group: &'static str,
        resource: String,
        name: String,
        reason: String,
    },
    #[error("{message}")]
    ApplyConflict { message: String, causes: Vec<Cause> },
    #[error("{kind} \"{name}\" is invalid: {}", causes_text(.causes))]
    Invalid {
        group: &'static str,
        kind: String,
        name: String,
        causes: Vec<Cause>,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("the server could not find the requested resource")]
    UnknownPath,
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    #[error("the body of the request was in an unknown format - accepted media types include: {0}")]
    UnsupportedMediaType(&'static str),
    #[error("the request is too large")]
    TooLarge,
    #[error("too old resource version: {requested} ({oldest})")]
    Expired { requested: u64, oldest: u64 },
    #[error("Timeout: Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: u64, current: u64 },
    #[error("Internal error occurred: {0}")]
    Internal(String),
    #[error("{message}")]
    Injected { code: u16, message: String },
}

fn causes_text(causes: &[Cause]) -> String {
    let parts: Vec<String> = causes
        .iter()
        .map(|c| {
            if c.field.is_empty() {
                c.message.clone()
            } else {
                format!("{}: {}", c.field, c.message)
            }
        })
        .collect();
    if parts.len() == 1 {
        parts.concat()
    } else {
        format!("[{}]", parts.join(", "))
    }
}

impl ApiError {
    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::NotFound {
            group: def.group,
            resource: def.qualified_resource(),
            name: name.to_string(),
        }
    }

    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::AlreadyExists {
            group: def.group,
            resource: def.qualified_resource(),
            name: name.to_string(),
        }
    }

    pub fn conflict(def: &ResourceDef, name: &str, reason: &str) -> Self {
        Self::Conflict {
            group: def.group,
            resource: def.qualified_resource(),
            name: name.to_string(),
            reason: reason.to_string(),
        }
    }

    /// The optimistic-concurrency failure clients retry on.
    pub fn modified(def: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            def,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(def: &ResourceDef, name: &str, field: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            group: def.group,
            kind: def.qualified_kind(),
            name: name.to_string(),
            causes: vec![Cause {
                reason: "FieldValueInvalid",
                message: message.into(),
                field: field.to_string(),
            }],
        }
    }

    pub fn code(&self) -> u16 {
        match self {
            Self::NotFound { .. } | Self::UnknownPath => 404,
            Self::AlreadyExists { .. } | Self::Conflict { .. } | Self::ApplyConflict { .. } => 409,
            Self::Invalid { .. } => 422,
            Self::BadRequest(_) => 400,
            Self::MethodNotAllowed => 405,
            Self::UnsupportedMediaType(_) => 415,
            Self::TooLarge => 413,
            Self::Expired { .. } => 410,
            Self::TooLargeResourceVersion { .. } => 504,
            Self::Internal(_) => 500,
            Self::Injected { code, .. } => *code,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } | Self::UnknownPath => "NotFound",
            Self::AlreadyExists { .. } => "AlreadyExists",
            Self::Conflict { .. } | Self::ApplyConflict { .. } => "Conflict",
            Self::Invalid { .. } => "Invalid",
            Self::BadRequest(_) => "BadRequest",
            Self::MethodNotAllowed => "MethodNotAllowed",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::TooLarge => "RequestEntityTooLarge",
            Self::Expired { .. } => "Expired",
            Self::TooLargeResourceVersion { .. } => "Timeout",
            Self::Internal(_) => "InternalError",
            Self::Injected { code, .. } => reason_for_code(*code),
        }
    }

    fn details(&self) -> Option<Value> {
        let named = |group: &str, kind: &str, name: &str| {
            let mut details = json!({"name": name, "kind": kind});
            if !group.is_empty() {
                details["group"] = json!(group);
            }
            details
        };
        let bare_resource =
            |qualified: &str| qualified.split('.').next().unwrap_or_default().to_string();
        match self {
            Self::NotFound {
                group,
                resource,
                name,
            }
            | Self::AlreadyExists {
                group,
                resource,
                name,
            }
            | Self::Conflict {
                group,
                resource,
                name,
                ..
            } => Some(named(group, &bare_resource(resource), name)),
            Self::Invalid {
                group,
                kind,
                name,
                causes,
            } => {
                let bare_kind = kind.split('.').next().unwrap_or_default();
                let mut details = named(group, bare_kind, name);
                details["causes"] = causes_json(causes);
                Some(details)
            }
            Self::ApplyConflict { causes, .. } => Some(json!({"causes": causes_json(causes)})),
            Self::TooLargeResourceVersion { .. } => Some(json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            })),
            Self::Internal(message) => Some(json!({"causes": [{"message": message}]})),
            _ => None,
        }
    }

    /// The `Status` object kube-apiserver sends for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if let Some(details) = self.details() {
            status["details"] = details;
        }
        status
    }
}

fn causes_json(causes: &[Cause]) -> Value {
    Value::Array(
        causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect(),
    )
}

fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// The `Status` a successful immediate delete answers with.
pub fn deleted_status(def: &ResourceDef, name: &str, uid: &str) -> Value {
    let mut details = json!({"name": name, "kind": def.resource, "uid": uid});
    if !def.group.is_empty() {
        details["group"] = json!(def.group);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_match_kube_apiserver() {
        let ingresses = crate::apiserver::resource("networking.k8s.io", "v1", "ingresses").unwrap();
        let services = crate::apiserver::resource("", "v1", "services").unwrap();
        let cases = [
            (
                ApiError::not_found(ingresses, "web"),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                    "message":"ingresses.networking.k8s.io \"web\" not found","reason":"NotFound",
                    "details":{"name":"web","group":"networking.k8s.io","kind":"ingresses"},"code":404}),
            ),
            (
                ApiError::already_exists(services, "web"),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                    "message":"services \"web\" already exists","reason":"AlreadyExists",
                    "details":{"name":"web","kind":"services"},"code":409}),
            ),
            (
                ApiError::modified(services, "web"),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                    "message":"Operation cannot be fulfilled on services \"web\": the object has been modified; please apply your changes to the latest version and try again",
                    "reason":"Conflict","details":{"name":"web","kind":"services"},"code":409}),
            ),
            (
                ApiError::Expired {
                    requested: 5,
                    oldest: 9,
                },
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                    "message":"too old resource version: 5 (9)","reason":"Expired","code":410}),
            ),
            (
                ApiError::invalid(
                    ingresses,
                    "Web",
                    "metadata.name",
                    "Invalid value: \"Web\": must be lower case",
                ),
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                    "message":"Ingress.networking.k8s.io \"Web\" is invalid: metadata.name: Invalid value: \"Web\": must be lower case",
                    "reason":"Invalid","details":{"name":"Web","group":"networking.k8s.io","kind":"Ingress",
                    "causes":[{"reason":"FieldValueInvalid","message":"Invalid value: \"Web\": must be lower case","field":"metadata.name"}]},"code":422}),
            ),
        ];
        for (error, want) in cases {
            assert_eq!(error.to_status(), want, "{error:?}");
        }
    }
}
