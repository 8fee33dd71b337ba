//! Request handling: from an HTTP request to a response, one function per verb.
//!
//! Every write takes the store lock once and does read-check-write inside it, so
//! resourceVersion preconditions are exact and watchers see writes in commit order.

use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};

use super::discovery;
use super::log::RequestRecord;
use super::managed::{self, Manager};
use super::objects::{self, FieldValidation, Part};
use super::patch::{self, PatchType};
use super::resource::ResourceDef;
use super::routes::{self, ObjectPath, Query, Route};
use super::selectors::{FieldSelector, LabelSelector};
use super::server::Shared;
use super::status::{self, ApiError, Result};
use super::store::{Inner, ObjectKey};
use super::table;
use super::watch::{self, Start, WatchRequest};

pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The headers of a request that handlers look at.
struct Headers {
    accept: Option<String>,
    content_type: Option<String>,
    user_agent: Option<String>,
}

impl Headers {
    fn from(map: &HeaderMap) -> Self {
        let get = |name| {
            map.get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .map(str::to_string)
        };
        Self {
            accept: get(header::ACCEPT),
            content_type: get(header::CONTENT_TYPE),
            user_agent: get(header::USER_AGENT),
        }
    }

    fn wants_table(&self) -> bool {
        self.accept
            .as_deref()
            .is_some_and(|a| a.contains("as=Table"))
    }
}

/// A successful answer: a status, a JSON body (or a watch stream) and warnings.
enum Reply {
    Json {
        status: StatusCode,
        body: Value,
        content_type: &'static str,
        warnings: Vec<String>,
    },
    Watch(Body),
}

impl Reply {
    fn ok(body: Value) -> Self {
        Self::Json {
            status: StatusCode::OK,
            body,
            content_type: "application/json",
            warnings: Vec::new(),
        }
    }

    fn with(status: StatusCode, body: Value, warnings: Vec<String>) -> Self {
        Self::Json {
            status,
            body,
            content_type: "application/json",
            warnings,
        }
    }
}

pub async fn handle(shared: &Shared, req: http::Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let headers = Headers::from(req.headers());
    let path_and_query = if query.is_empty() {
        path.clone()
    } else {
        format!("{path}?{query}")
    };

    // The body is read before anything can fail, so the connection is always left at a
    // request boundary and a client can reuse it after an error.
    let body = read_body(req.into_body(), shared.options.max_body_bytes).await;
    let reply = match (
        body,
        shared.faults.take_failure(method.as_str(), &path_and_query),
    ) {
        (Err(error), _) => Err(error),
        (Ok(_), Some(code)) => Err(ApiError::Injected {
            code,
            message: format!("injected failure ({code}) for {method} {path_and_query}"),
        }),
        (Ok(body), None) => route(shared, &method, &path, &query, &headers, &body),
    };
    let mut response = match reply {
        Ok(reply) => render(reply),
        Err(error) => render_error(&error),
    };
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        // The rest of that body is still on the wire: this connection cannot carry another request.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    tracing::debug!(%method, %path_and_query, status = response.status().as_u16(), "request");
    shared.log.push(RequestRecord {
        method: method.to_string(),
        path,
        query,
        content_type: headers.content_type,
        accept: headers.accept,
        user_agent: headers.user_agent,
        status: response.status().as_u16(),
    });
    response
}

fn full(bytes: Vec<u8>) -> Body {
    Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn render(reply: Reply) -> Response<Body> {
    match reply {
        Reply::Json {
            status,
            body,
            content_type,
            warnings,
        } => {
            let mut bytes = serde_json::to_vec(&body).unwrap_or_default();
            bytes.push(b'\n');
            let mut response = Response::new(full(bytes));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            for warning in warnings {
                let text = format!("299 - {}", serde_json::Value::String(warning));
                if let Ok(value) = HeaderValue::from_str(&text) {
                    response.headers_mut().append(header::WARNING, value);
                }
            }
            response
        }
        Reply::Watch(body) => {
            let mut response = Response::new(body);
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
    }
}

fn render_error(error: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(error.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    render(Reply::Json {
        status,
        body: error.to_status(),
        content_type: "application/json",
        warnings: Vec::new(),
    })
}

fn route(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: &str,
    headers: &Headers,
    body: &[u8],
) -> Result<Reply> {
    let route = routes::parse_path(path)?;
    let get_only = |reply: Option<Value>| -> Result<Reply> {
        if method != Method::GET {
            return Err(ApiError::MethodNotAllowed);
        }
        reply.map(Reply::ok).ok_or(ApiError::UnknownPath)
    };
    match route {
        Route::Version => get_only(Some(discovery::version(shared.options.minor_version))),
        Route::Health => {
            if method != Method::GET {
                return Err(ApiError::MethodNotAllowed);
            }
            Ok(Reply::Json {
                status: StatusCode::OK,
                body: json!("ok"),
                content_type: "text/plain",
                warnings: Vec::new(),
            })
        }
        Route::CoreVersions | Route::Groups
            if discovery::wants_aggregated(headers.accept.as_deref()) =>
        {
            if method != Method::GET {
                return Err(ApiError::MethodNotAllowed);
            }
            let body = discovery::aggregated(route == Route::CoreVersions);
            Ok(Reply::Json {
                status: StatusCode::OK,
                body,
                content_type: discovery::AGGREGATED_V2,
                warnings: Vec::new(),
            })
        }
        Route::CoreVersions => get_only(Some(discovery::core_versions(&shared.addr.to_string()))),
        Route::Groups => get_only(Some(discovery::groups())),
        Route::Group(group) => get_only(discovery::group(&group)),
        Route::Resources { group, version } => get_only(discovery::resources(&group, &version)),
        // Without v2, kubectl uses v3, which tells it to validate through fieldValidation.
        Route::OpenApiV2 => Err(ApiError::UnknownPath),
        Route::OpenApiV3Index => get_only(Some(discovery::openapi_v3_index())),
        Route::OpenApiV3 { group, version } => get_only(discovery::openapi_v3(&group, &version)),
        Route::Object(target) => {
            let query = routes::parse_query(query)?;
            object_route(shared, method, &target, &query, headers, body)
        }
    }
}

fn object_route(
    shared: &Shared,
    method: &Method,
    target: &ObjectPath,
    query: &Query,
    headers: &Headers,
    body: &[u8],
) -> Result<Reply> {
    let has_name = target.name.is_some();
    match *method {
        Method::GET if target.watch_prefix || (query.watch && !has_name) => {
            watch(shared, target, query, headers)
        }
        Method::GET if has_name => get(shared, target, query, headers),
        Method::GET => list(shared, target, query, headers),
        Method::POST if !has_name && target.part == Part::Main => {
            create(shared, target, query, headers, body)
        }
        Method::PUT if has_name => update(shared, target, query, headers, body),
        Method::PATCH if has_name => patch(shared, target, query, headers, body),
        Method::DELETE if has_name && target.part == Part::Main => {
            delete(shared, target, query, body)
        }
        Method::DELETE if !has_name => delete_collection(shared, target, query),
        _ => Err(ApiError::MethodNotAllowed),
    }
}

async fn read_body(body: Incoming, limit: usize) -> Result<Bytes> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => Err(ApiError::TooLarge),
        Err(err) => Err(ApiError::BadRequest(format!(
            "reading the request body: {err}"
        ))),
    }
}

fn selectors(def: &ResourceDef, query: &Query) -> Result<(LabelSelector, FieldSelector)> {
    let labels = LabelSelector::parse(query.label_selector.as_deref().unwrap_or_default())
        .map_err(|e| ApiError::BadRequest(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(query.field_selector.as_deref().unwrap_or_default(), def)
        .map_err(ApiError::BadRequest)?;
    Ok((labels, fields))
}

fn name_of(target: &ObjectPath) -> &str {
    target.name.as_deref().unwrap_or_default()
}

fn key_of(target: &ObjectPath) -> ObjectKey {
    ObjectKey::new(target.def, target.namespace.as_deref(), name_of(target))
}

/// The object at `target` as clients see it, if it exists.
fn stored(inner: &Inner, target: &ObjectPath) -> Option<Value> {
    inner
        .get(&key_of(target))
        .cloned()
        .map(|o| target.def.present(o))
}

/// The object at `target` as clients see it, or the API's 404 for it: what an update, a patch
/// or a delete starts from.
fn existing(inner: &Inner, target: &ObjectPath) -> Result<Value> {
    stored(inner, target).ok_or_else(|| ApiError::not_found(target.def, name_of(target)))
}

/// Who a write of `part` is recorded under in `managedFields`: `?fieldManager=`, else a name
/// made from the User-Agent, as the real API server does.
fn manager_of(target: &ObjectPath, query: &Query, headers: &Headers, part: Part) -> Manager {
    Manager::new(
        target.def,
        query.field_manager.as_deref(),
        headers.user_agent.as_deref(),
        part,
    )
}

fn get(shared: &Shared, target: &ObjectPath, query: &Query, headers: &Headers) -> Result<Reply> {
    let def = target.def;
    let object = shared
        .store
        .get(def, target.namespace.as_deref(), name_of(target))
        .ok_or_else(|| ApiError::not_found(def, name_of(target)))?;
    if headers.wants_table() {
        let rv = objects::meta(&object, "resourceVersion")
            .unwrap_or_default()
            .to_string();
        return Ok(Reply::ok(table::table(
            def.columns,
            &[object],
            &rv,
            query.include_object.as_deref(),
        )));
    }
    Ok(Reply::ok(object))
}

fn list(shared: &Shared, target: &ObjectPath, query: &Query, headers: &Headers) -> Result<Reply> {
    let def = target.def;
    let (labels, fields) = selectors(def, query)?;
    let requested = routes::parse_resource_version(query.resource_version.as_deref())?;
    let (items, rv) = {
        let inner = shared.store.lock();
        if let Some(requested) = requested {
            if requested > inner.rv() {
                return Err(ApiError::TooLargeResourceVersion {
                    requested,
                    current: inner.rv(),
                });
            }
            // Only an exact read of the past can be too old; other reads serve the present.
            if query.resource_version_match.as_deref() == Some("Exact") && requested != inner.rv() {
                return Err(ApiError::Expired {
                    requested,
                    oldest: inner.oldest_rv().max(inner.rv()),
                });
            }
        }
        let items: Vec<Value> = inner
            .list(def, target.namespace.as_deref())
            .into_iter()
            .map(|(_, object)| def.present(object))
            .filter(|object| labels.matches(object) && fields.matches(object))
            .collect();
        (items, inner.rv().to_string())
    };
    if headers.wants_table() {
        return Ok(Reply::ok(table::table(
            def.columns,
            &items,
            &rv,
            query.include_object.as_deref(),
        )));
    }
    Ok(Reply::ok(json!({
        "kind": format!("{}List", def.kind),
        "apiVersion": def.api_version(),
        "metadata": {"resourceVersion": rv},
        "items": items,
    })))
}

fn watch(shared: &Shared, target: &ObjectPath, query: &Query, headers: &Headers) -> Result<Reply> {
    if target.name.is_some() {
        // `/watch/.../<name>` is the deprecated single-object watch; clients use fieldSelector.
        return Err(ApiError::BadRequest("watching a single object by path is not supported; use fieldSelector=metadata.name=<name>".into()));
    }
    let def = target.def;
    let (labels, fields) = selectors(def, query)?;
    let requested = routes::parse_resource_version(query.resource_version.as_deref())?;
    let start = match (query.send_initial_events, requested) {
        (Some(true), _) => Start::CurrentState { end_bookmark: true },
        (Some(false), None) => Start::Now,
        (_, None) => Start::CurrentState {
            end_bookmark: false,
        },
        (_, Some(rv)) => Start::After(rv),
    };
    let stream_body = |stream| {
        let frames = futures_util::TryStreamExt::map_ok(stream, Frame::data)
            .map_err(|cut| Box::new(cut) as Box<dyn std::error::Error + Send + Sync>);
        Reply::Watch(BodyExt::boxed_unsync(StreamBody::new(frames)))
    };
    if shared.faults.take_watch_expiry() {
        let rv = shared.store.resource_version();
        let expired = ApiError::Expired {
            requested: requested.unwrap_or(0),
            oldest: rv,
        };
        return Ok(stream_body(watch::error_stream(&expired).boxed_stream()));
    }
    let request = WatchRequest {
        def,
        namespace: target.namespace.clone(),
        labels,
        fields,
        start,
        bookmarks: query
            .allow_watch_bookmarks
            .then_some(shared.options.bookmark_interval),
        timeout: query.timeout_seconds.map(Duration::from_secs),
        cut: shared.faults.watch_cut(),
        table: headers.wants_table().then(|| watch::TableFormat {
            columns: def.columns,
            include_object: query.include_object.clone(),
        }),
    };
    match watch::open(&shared.store, request) {
        Ok(stream) => Ok(stream_body(stream.boxed_stream())),
        // The real server answers 200 and reports watch errors as an ERROR event.
        Err(error) => Ok(stream_body(watch::error_stream(&error).boxed_stream())),
    }
}

/// Boxing gives both watch stream types one name.
trait BoxedStream:
    futures_util::Stream<Item = std::result::Result<Bytes, watch::WatchCut>> + Send + Sized + 'static
{
    fn boxed_stream(
        self,
    ) -> futures_util::stream::BoxStream<'static, std::result::Result<Bytes, watch::WatchCut>> {
        Box::pin(self)
    }
}

impl<S> BoxedStream for S where
    S: futures_util::Stream<Item = std::result::Result<Bytes, watch::WatchCut>> + Send + 'static
{
}

/// Parses a write body: JSON, or YAML when the client says so.
fn parse_object(headers: &Headers, body: &[u8]) -> Result<Value> {
    let yaml = headers
        .content_type
        .as_deref()
        .is_some_and(|ct| ct.contains("yaml"));
    patch::parse_body(body, yaml)
}

/// The namespace a namespaced write needs, created on demand unless strict.
fn ensure_namespace(
    shared: &Shared,
    inner: &mut Inner,
    def: &ResourceDef,
    namespace: Option<&str>,
    dry_run: bool,
) -> Result<()> {
    let Some(namespace) = namespace.filter(|_| def.namespaced) else {
        return Ok(());
    };
    if inner.namespace_exists(namespace) {
        return Ok(());
    }
    let Some(namespaces) = super::resource("", "v1", "namespaces") else {
        return Ok(());
    };
    if shared.options.strict_namespaces {
        return Err(ApiError::not_found(namespaces, namespace));
    }
    let mut ns = json!({"metadata": {"name": namespace}});
    objects::check_type(namespaces, &mut ns)?;
    objects::prepare_create(namespaces, None, &mut ns, inner.rv() + 1)?;
    if !dry_run {
        inner.put(ObjectKey::new(namespaces, None, namespace), ns);
    }
    Ok(())
}

/// Validates a new object's body and stores it. `operation` names the managedFields entry.
fn insert_new(
    shared: &Shared,
    inner: &mut Inner,
    target: &ObjectPath,
    mut object: Value,
    manager: &Manager,
    operation: &str,
    dry_run: bool,
) -> Result<Value> {
    let def = target.def;
    let namespace = target.namespace.as_deref();
    objects::prepare_create(def, namespace, &mut object, inner.rv() + 1)?;
    let name = objects::meta(&object, "name")
        .unwrap_or_default()
        .to_string();
    let key = ObjectKey::new(def, namespace, &name);
    if inner.get(&key).is_some() {
        return Err(ApiError::already_exists(def, &name));
    }
    ensure_namespace(shared, inner, def, namespace, dry_run)?;
    managed::record_create(def, &mut object, manager, operation);
    if dry_run {
        return Ok(object);
    }
    Ok(def.present(inner.put(key, def.store_form(object))))
}

fn create(
    shared: &Shared,
    target: &ObjectPath,
    query: &Query,
    headers: &Headers,
    body: &[u8],
) -> Result<Reply> {
    let def = target.def;
    let mut object = parse_object(headers, body)?;
    objects::check_type(def, &mut object)?;
    let warnings = objects::check_schema(
        def,
        &mut object,
        FieldValidation::parse(query.field_validation.as_deref())?,
    )?;
    let manager = manager_of(target, query, headers, Part::Main);
    let mut inner = shared.store.lock();
    let created = insert_new(
        shared,
        &mut inner,
        target,
        object,
        &manager,
        "Update",
        query.dry_run,
    )?;
    Ok(Reply::with(StatusCode::CREATED, created, warnings))
}

/// Records `manager` for what changed from `old` to `next` (built by `objects::prepare_update`;
/// None: nothing changed), commits it and answers 200 with `warnings`: the end of an update
/// and of a patch that is not an apply.
fn commit_write(
    inner: &mut Inner,
    target: &ObjectPath,
    old: Value,
    mut next: Option<Value>,
    manager: &Manager,
    dry_run: bool,
    warnings: Vec<String>,
) -> Reply {
    if let Some(next) = next.as_mut() {
        managed::record_update(target.def, &old, next, manager);
    }
    let stored = commit_update(inner, target.def, key_of(target), old, next, dry_run);
    Reply::with(StatusCode::OK, stored, warnings)
}

/// Commits an update built by `objects::prepare_update` (None: nothing changed), finishing
/// deletion when the last finalizer is gone.
fn commit_update(
    inner: &mut Inner,
    def: &ResourceDef,
    key: ObjectKey,
    old: Value,
    next: Option<Value>,
    dry_run: bool,
) -> Value {
    let Some(next) = next else { return old };
    if dry_run {
        return next;
    }
    if objects::is_deleting(&next) && !objects::has_finalizers(&next) {
        return inner
            .remove(&key)
            .map(|gone| def.present(gone))
            .unwrap_or(next);
    }
    def.present(inner.put(key, def.store_form(next)))
}

fn check_identity(target: &ObjectPath, object: &mut Value) -> Result<()> {
    let name = name_of(target);
    match objects::meta(object, "name") {
        Some(body_name) if !body_name.is_empty() && body_name != name => {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        _ => {
            if let Some(meta) = objects::meta_mut(object) {
                meta.insert("name".into(), json!(name));
            }
        }
    }
    if let (Some(body_ns), Some(url_ns)) = (
        objects::meta(object, "namespace"),
        target.namespace.as_deref(),
    ) && !body_ns.is_empty()
        && body_ns != url_ns
        && target.def.namespaced
    {
        return Err(ApiError::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        ));
    }
    Ok(())
}

fn update(
    shared: &Shared,
    target: &ObjectPath,
    query: &Query,
    headers: &Headers,
    body: &[u8],
) -> Result<Reply> {
    let def = target.def;
    let mut object = parse_object(headers, body)?;
    objects::check_type(def, &mut object)?;
    check_identity(target, &mut object)?;
    let warnings = objects::check_schema(
        def,
        &mut object,
        FieldValidation::parse(query.field_validation.as_deref())?,
    )?;
    let manager = manager_of(target, query, headers, target.part);
    let mut inner = shared.store.lock();
    let old = existing(&inner, target)?;
    let next = objects::prepare_update(def, &old, object, target.part)?;
    Ok(commit_write(
        &mut inner,
        target,
        old,
        next,
        &manager,
        query.dry_run,
        warnings,
    ))
}

fn patch(
    shared: &Shared,
    target: &ObjectPath,
    query: &Query,
    headers: &Headers,
    body: &[u8],
) -> Result<Reply> {
    let def = target.def;
    let kind = PatchType::from_content_type(headers.content_type.as_deref())?;
    let validation = FieldValidation::parse(query.field_validation.as_deref())?;
    let manager = manager_of(target, query, headers, target.part);
    if kind == PatchType::Apply {
        return apply(shared, target, query, &manager, validation, body);
    }
    let mut inner = shared.store.lock();
    let old = existing(&inner, target)?;
    let mut patched = old.clone();
    patch::patch(kind, &mut patched, body)?;
    objects::check_type(def, &mut patched)?;
    let warnings = objects::check_schema(def, &mut patched, validation)?;
    let next = objects::prepare_update(def, &old, patched, target.part)?;
    Ok(commit_write(
        &mut inner,
        target,
        old,
        next,
        &manager,
        query.dry_run,
        warnings,
    ))
}

/// Entries compared without their timestamps: did ownership change?
fn ownership(object: &Value) -> Value {
    let mut entries = object
        .pointer("/metadata/managedFields")
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(list) = entries.as_array_mut() {
        for entry in list.iter_mut().filter_map(Value::as_object_mut) {
            entry.remove("time");
        }
    }
    entries
}

fn apply(
    shared: &Shared,
    target: &ObjectPath,
    query: &Query,
    manager: &Manager,
    validation: FieldValidation,
    body: &[u8],
) -> Result<Reply> {
    let def = target.def;
    let mut applied = patch::parse_body(body, true)?;
    if query.field_manager.as_deref().is_none_or(str::is_empty) {
        return Err(ApiError::BadRequest(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
        ));
    }
    for field in ["apiVersion", "kind"] {
        if applied
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(ApiError::BadRequest(format!(
                "{field} must be set in an apply configuration"
            )));
        }
    }
    objects::check_type(def, &mut applied)?;
    check_identity(target, &mut applied)?;
    let warnings = objects::check_schema(def, &mut applied, validation)?;
    let precondition = objects::meta(&applied, "resourceVersion")
        .filter(|rv| !rv.is_empty())
        .map(str::to_string);

    let key = key_of(target);
    let mut inner = shared.store.lock();
    let Some(old) = stored(&inner, target) else {
        if target.part == Part::Status {
            return Err(ApiError::not_found(def, name_of(target)));
        }
        if let Some(meta) = objects::meta_mut(&mut applied) {
            meta.remove("resourceVersion");
        }
        let created = insert_new(
            shared,
            &mut inner,
            target,
            applied,
            manager,
            "Apply",
            query.dry_run,
        )?;
        return Ok(Reply::with(StatusCode::CREATED, created, warnings));
    };
    if let Some(rv) = precondition
        && Some(rv.as_str()) != objects::meta(&old, "resourceVersion")
    {
        return Err(ApiError::modified(def, name_of(target)));
    }
    let merged = managed::apply(def, &old, &applied, manager, query.force)?;
    let managed_fields = merged.pointer("/metadata/managedFields").cloned();
    let ownership_changed = ownership(&merged) != ownership(&old);
    let next = objects::prepare_update(def, &old, merged, target.part)?;
    let next = match next {
        None if ownership_changed => Some(old.clone()),
        other => other,
    }
    .map(|mut next| {
        if let Some(meta) = objects::meta_mut(&mut next) {
            match managed_fields {
                Some(fields) => meta.insert("managedFields".into(), fields),
                None => meta.remove("managedFields"),
            };
        }
        next
    });
    let stored = commit_update(&mut inner, def, key, old, next, query.dry_run);
    Ok(Reply::with(StatusCode::OK, stored, warnings))
}

/// The parts of `DeleteOptions` the server honours.
fn delete_options(body: &[u8]) -> Result<Value> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("error decoding DeleteOptions: {e}")))
}

fn delete(shared: &Shared, target: &ObjectPath, query: &Query, body: &[u8]) -> Result<Reply> {
    let def = target.def;
    let options = delete_options(body)?;
    let dry_run = query.dry_run
        || options
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    let key = key_of(target);
    let mut inner = shared.store.lock();
    let old = existing(&inner, target)?;
    for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        let want = options
            .pointer(&format!("/preconditions/{field}"))
            .and_then(Value::as_str);
        let have = objects::meta(&old, field).unwrap_or_default();
        if let Some(want) = want
            && want != have
        {
            return Err(ApiError::conflict(
                def,
                name_of(target),
                &format!(
                    "Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"
                ),
            ));
        }
    }
    let (status, body) = delete_one(&mut inner, def, &key, old, dry_run);
    Ok(Reply::with(status, body, Vec::new()))
}

/// Deletes (or, with finalizers, marks for deletion) one object; returns what to answer.
fn delete_one(
    inner: &mut Inner,
    def: &ResourceDef,
    key: &ObjectKey,
    old: Value,
    dry_run: bool,
) -> (StatusCode, Value) {
    if objects::has_finalizers(&old) {
        if objects::is_deleting(&old) || dry_run {
            return (StatusCode::OK, old);
        }
        let mut marked = old;
        if let Some(meta) = objects::meta_mut(&mut marked) {
            meta.insert("deletionTimestamp".into(), json!(objects::now()));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        let stored = inner.put(key.clone(), def.store_form(marked));
        return (StatusCode::OK, def.present(stored));
    }
    let name = objects::meta(&old, "name").unwrap_or_default().to_string();
    let uid = objects::meta(&old, "uid").unwrap_or_default().to_string();
    if !dry_run {
        if (def.group, def.resource) == ("", "namespaces") {
            // No namespace controller here: the contents go with the namespace, at once.
            let contents: Vec<ObjectKey> = inner
                .keys()
                .filter(|k| !k.namespace.is_empty() && k.namespace == name)
                .cloned()
                .collect();
            for content in contents {
                inner.remove(&content);
            }
        }
        inner.remove(key);
    }
    (StatusCode::OK, status::deleted_status(def, &name, &uid))
}

fn delete_collection(shared: &Shared, target: &ObjectPath, query: &Query) -> Result<Reply> {
    let def = target.def;
    let (labels, fields) = selectors(def, query)?;
    let mut inner = shared.store.lock();
    let chosen: Vec<(ObjectKey, Value)> = inner
        .list(def, target.namespace.as_deref())
        .into_iter()
        .map(|(key, object)| (key, def.present(object)))
        .filter(|(_, object)| labels.matches(object) && fields.matches(object))
        .collect();
    let mut items = Vec::new();
    for (key, object) in chosen {
        let (_, answer) = delete_one(&mut inner, def, &key, object.clone(), query.dry_run);
        items.push(
            if answer.get("kind").and_then(Value::as_str) == Some("Status") {
                object
            } else {
                answer
            },
        );
    }
    Ok(Reply::ok(json!({
        "kind": format!("{}List", def.kind),
        "apiVersion": def.api_version(),
        "metadata": {"resourceVersion": inner.rv().to_string()},
        "items": items,
    })))
}
