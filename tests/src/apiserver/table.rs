//! Server-side printing: the `meta.k8s.io/v1 Table` kubectl asks for (`Accept: ...;as=Table`)
//! so `kubectl get` prints the same columns as against a real cluster.

use serde_json::{Value, json};

/// One printed column, computed from the object.
pub struct Column {
    pub name: &'static str,
    pub kind: &'static str,
    /// `name` marks the column kubectl treats as the object's name.
    pub format: &'static str,
    pub priority: u8,
    pub description: &'static str,
    pub cell: fn(&Value) -> Value,
}

fn text(object: &Value, pointer: &str) -> String {
    match object.pointer(pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

fn or_none(s: String) -> Value {
    if s.is_empty() {
        json!("<none>")
    } else {
        json!(s)
    }
}

fn items<'a>(object: &'a Value, pointer: &str) -> &'a [Value] {
    object
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn load_balancer_addresses(object: &Value) -> String {
    items(object, "/status/loadBalancer/ingress")
        .iter()
        .filter_map(|i| {
            i.get("ip")
                .or_else(|| i.get("hostname"))
                .and_then(Value::as_str)
        })
        .collect::<Vec<_>>()
        .join(",")
}

const NAME: Column = Column {
    name: "Name",
    kind: "string",
    format: "name",
    priority: 0,
    description: "Name must be unique within a namespace.",
    cell: |o| json!(text(o, "/metadata/name")),
};

const AGE: Column = Column {
    name: "Age",
    kind: "string",
    format: "",
    priority: 0,
    description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
    cell: |o| {
        json!(age(o
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)))
    },
};

/// A column as most resources print theirs: a string, shown at the default width (priority 0),
/// with no format and no description.
const fn column(name: &'static str, cell: fn(&Value) -> Value) -> Column {
    Column {
        name,
        kind: "string",
        format: "",
        priority: 0,
        description: "",
        cell,
    }
}

/// What resources without their own columns print, as the real default table convertor.
pub const DEFAULT: &[Column] = &[NAME, AGE];

pub const INGRESS: &[Column] = &[
    NAME,
    column("Class", |o| or_none(text(o, "/spec/ingressClassName"))),
    column("Hosts", |o| {
        let hosts: Vec<&str> = items(o, "/spec/rules")
            .iter()
            .filter_map(|r| r.get("host").and_then(Value::as_str))
            .collect();
        json!(if hosts.is_empty() {
            "*".to_string()
        } else {
            hosts.join(",")
        })
    }),
    column("Address", |o| json!(load_balancer_addresses(o))),
    column("Ports", |o| {
        json!(if items(o, "/spec/tls").is_empty() {
            "80"
        } else {
            "80, 443"
        })
    }),
    AGE,
];

pub const SERVICE: &[Column] = &[
    NAME,
    column("Type", |o| json!(text(o, "/spec/type"))),
    column("Cluster-IP", |o| or_none(text(o, "/spec/clusterIP"))),
    column("External-IP", |o| or_none(load_balancer_addresses(o))),
    column("Port(s)", |o| {
        let ports: Vec<String> = items(o, "/spec/ports")
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    text(p, "/port"),
                    p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                )
            })
            .collect();
        or_none(ports.join(","))
    }),
    AGE,
];

pub const SECRET: &[Column] = &[
    NAME,
    column("Type", |o| json!(text(o, "/type"))),
    Column {
        kind: "integer",
        ..column("Data", |o| {
            json!(
                o.get("data")
                    .and_then(Value::as_object)
                    .map_or(0, |d| d.len())
            )
        })
    },
    AGE,
];

pub const NAMESPACE: &[Column] = &[
    NAME,
    column("Status", |o| json!(text(o, "/status/phase"))),
    AGE,
];

pub const INGRESS_CLASS: &[Column] = &[
    NAME,
    column("Controller", |o| json!(text(o, "/spec/controller"))),
    column("Parameters", |o| or_none(text(o, "/spec/parameters/name"))),
    AGE,
];

pub const ENDPOINT_SLICE: &[Column] = &[
    NAME,
    column("AddressType", |o| json!(text(o, "/addressType"))),
    column("Ports", |o| {
        let ports: Vec<String> = items(o, "/ports")
            .iter()
            .map(|p| text(p, "/port"))
            .collect();
        or_none(ports.join(","))
    }),
    column("Endpoints", |o| {
        let addresses: Vec<&str> = items(o, "/endpoints")
            .iter()
            .flat_map(|e| items(e, "/addresses"))
            .filter_map(Value::as_str)
            .collect();
        or_none(addresses.join(","))
    }),
    AGE,
];

pub const LEASE: &[Column] = &[
    NAME,
    column("Holder", |o| json!(text(o, "/spec/holderIdentity"))),
    AGE,
];

pub const EVENT: &[Column] = &[
    Column {
        description: "Time since the event was last seen",
        ..column("Last Seen", |o| {
            let seen = [
                "/lastTimestamp",
                "/eventTime",
                "/metadata/creationTimestamp",
            ]
            .iter()
            .find_map(|p| o.pointer(p).and_then(Value::as_str));
            json!(age(seen))
        })
    },
    column("Type", |o| json!(text(o, "/type"))),
    column("Reason", |o| json!(text(o, "/reason"))),
    column("Object", |o| {
        json!(format!(
            "{}/{}",
            text(o, "/involvedObject/kind").to_ascii_lowercase(),
            text(o, "/involvedObject/name")
        ))
    }),
    column("Message", |o| json!(text(o, "/message"))),
];

/// kubectl's `HumanDuration`: "45s", "3m10s", "5h", "12d", "2y".
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let seconds = seconds.max(0);
    let minutes = seconds / 60;
    let hours = minutes / 60;
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        }
    } else if hours < 24 * 365 * 2 {
        format!("{}d", hours / 24)
    } else if hours < 24 * 365 * 8 {
        match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            d => format!("{}y{d}d", hours / 24 / 365),
        }
    } else {
        format!("{}y", hours / 24 / 365)
    }
}

fn age(timestamp: Option<&str>) -> String {
    let Some(Ok(then)) = timestamp.map(str::parse::<jiff::Timestamp>) else {
        return "<unknown>".into();
    };
    human_duration(jiff::Timestamp::now().as_second() - then.as_second())
}

/// Which copy of the object each row carries (`includeObject`, default Metadata).
pub fn row_object(object: &Value, include: Option<&str>) -> Value {
    match include {
        Some("None") => Value::Null,
        Some("Object") => object.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }),
    }
}

/// The Table for `objects`; an empty column list prints Name and Age.
pub fn table(
    columns: &[Column],
    objects: &[Value],
    resource_version: &str,
    include: Option<&str>,
) -> Value {
    let columns = if columns.is_empty() { DEFAULT } else { columns };
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| json!({"name": c.name, "type": c.kind, "format": c.format, "description": c.description, "priority": c.priority}))
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let cells: Vec<Value> = columns.iter().map(|c| (c.cell)(object)).collect();
            json!({"cells": cells, "object": row_object(object, include)})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (47 * 3600, "47h"),
            (50 * 3600, "2d2h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}");
        }
    }

    #[test]
    fn ingress_rows() {
        let ing = json!({"metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"ingressClassName": "ours", "rules": [{"host": "a.example"}, {"host": "b.example"}], "tls": [{}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}});
        let t = table(INGRESS, &[ing], "7", None);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["Name", "Class", "Hosts", "Address", "Ports", "Age"]);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "ours");
        assert_eq!(cells[2], "a.example,b.example");
        assert_eq!(cells[3], "10.0.0.1");
        assert_eq!(cells[4], "80, 443");
        assert!(cells[5].as_str().unwrap().contains('y'), "{}", cells[5]);
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["metadata"]["resourceVersion"], "7");
    }
}
