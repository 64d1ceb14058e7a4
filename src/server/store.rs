//! The store endpoints (`/store/items`, `/store/items/search`, `/store/namespaces`) with the
//! reference server's shapes, over the data store the `store` node kind reads and writes: the
//! server opens it once and hands the same handle to every run, so a value put over HTTP is
//! what a `store` node gets, and the other way round.
//!
//! A user who is not an admin reaches their own namespaces and the shared ones (see
//! [`crate::rag::NamespaceScope`]): the namespaces they name are stored under theirs, and
//! those they are shown are theirs as they named them; an admin reaches every namespace as
//! stored.

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Shared;
use super::auth::Caller;
use super::http::{ApiError, JsonBody};
use crate::rag::{DataError, memory};

/// Namespace labels as the reference checks them before it looks at anything else: none
/// empty, none with a period (the GET endpoint joins them with periods in its query string),
/// a 422. The unit separator is refused too: the data store joins labels with it.
fn check(namespace: &[String]) -> Result<(), ApiError> {
    if let Some(label) = namespace
        .iter()
        .find(|l| l.is_empty() || l.contains('.') || l.contains('\u{1f}'))
    {
        return Err(ApiError::invalid(format!(
            "Namespace label '{label}' must be a non-empty string without periods"
        )));
    }
    Ok(())
}

/// A label with a NUL byte is refused (400), as the reference's store refuses it once the
/// request is otherwise valid: SQLite's `length()` stops at a NUL, so such a namespace would be
/// stored and then never found by a prefix search or a listing.
fn check_nul(namespace: &[String]) -> Result<(), ApiError> {
    if let Some(label) = namespace.iter().find(|l| l.contains('\0')) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "Invalid namespace label '{label}' found in {}. Namespace labels cannot contain NUL bytes ('\\x00').",
                py_tuple(namespace)
            ),
        ));
    }
    Ok(())
}

/// The namespace as the reference's message shows it: a Python tuple of its labels.
fn py_tuple(namespace: &[String]) -> String {
    let labels: Vec<String> = namespace
        .iter()
        .map(|l| {
            format!(
                "'{}'",
                l.replace('\\', "\\\\").replace('\'', "\\'").replace('\0', "\\x00")
            )
        })
        .collect();
    match labels.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", labels.join(", ")),
    }
}

fn failed(e: DataError) -> ApiError {
    match e {
        DataError::Invalid(m) => ApiError::invalid(m),
        e => ApiError::internal(e),
    }
}

#[derive(Deserialize)]
pub(super) struct Put {
    namespace: Vec<String>,
    key: String,
    value: Map<String, Value>,
    /// Minutes the item lives after it is written or read with a refresh; none: for good.
    ttl: Option<f64>,
    /// `false`: not embedded; a list of paths: embedded at those fields in place of the
    /// store index's; absent or null: the index's fields.
    #[serde(default)]
    index: Option<Value>,
}

/// What a put's `index` asks for.
fn indexing(index: Option<Value>) -> Result<memory::Indexing, ApiError> {
    match index {
        None | Some(Value::Null) | Some(Value::Bool(true)) => Ok(memory::Indexing::Default),
        Some(Value::Bool(false)) => Ok(memory::Indexing::Off),
        Some(Value::Array(fields)) => fields
            .into_iter()
            .map(|f| match f {
                Value::String(s) => Ok(s),
                other => Err(ApiError::invalid(format!(
                    "index: a field path is a string, not {other}"
                ))),
            })
            .collect::<Result<_, _>>()
            .map(memory::Indexing::Fields),
        Some(other) => Err(ApiError::invalid(format!(
            "index is false or a list of field paths, not {other}"
        ))),
    }
}

/// `PUT /store/items`: stores `value` (an object) under `namespace` and `key`, for `ttl`
/// minutes if given, embedded for semantic search when the store has an index (`index`
/// chooses the fields, or `false` none); 204.
pub(super) async fn put(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(mut p): JsonBody<Put>,
) -> Result<Response, ApiError> {
    check(&p.namespace)?;
    if p.namespace.is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "Namespace cannot be empty."));
    }
    check_nul(&p.namespace)?;
    // The reference stores an empty key, then refuses to GET it ("Key is required") while its
    // searches list it: refused here, so that every item stored can be read back by its key.
    if p.key.is_empty() {
        return Err(ApiError::invalid(
            "Key cannot be empty: GET /store/items could not read the item back",
        ));
    }
    let indexing = indexing(p.index)?;
    if let Some(scope) = caller.store_scope(&app) {
        p.namespace = scope.stored(&p.namespace);
    }
    memory::put_indexed(&app.data, p.namespace, p.key, Value::Object(p.value), p.ttl, &indexing)
        .await
        .map_err(failed)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
pub(super) struct GetQuery {
    #[serde(default)]
    namespace: String,
    key: Option<String>,
    refresh_ttl: Option<bool>,
}

/// `GET /store/items?namespace=a.b&key=k`: the item, or `null` when there is none or it has
/// expired (as the reference answers); its time to live starts again unless `refresh_ttl` is
/// false.
pub(super) async fn get(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<GetQuery>,
) -> Result<Response, ApiError> {
    let namespace: Vec<String> = q.namespace.split('.').map(str::to_string).collect();
    check(&namespace)?;
    let Some(key) = q.key.filter(|k| !k.is_empty()) else {
        return Ok((StatusCode::BAD_REQUEST, Json(json!({"error": "Key is required"}))).into_response());
    };
    check_nul(&namespace)?;
    let scope = caller.store_scope(&app);
    let namespace = scope.as_ref().map_or(namespace.clone(), |s| s.stored(&namespace));
    let item = app
        .data
        .with(move |c| memory::item(c, &namespace, &key, q.refresh_ttl.unwrap_or(true)))
        .await
        .map_err(failed)?;
    let item = match (item, &scope) {
        (Some(item), Some(scope)) => scope.shown_item(item),
        (item, _) => item,
    };
    Ok(Json(item.unwrap_or(Value::Null)).into_response())
}

#[derive(Deserialize)]
pub(super) struct Delete {
    #[serde(default)]
    namespace: Vec<String>,
    key: String,
}

/// `DELETE /store/items` with `{namespace, key}`: 204, whether or not the item was there.
pub(super) async fn delete(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(mut d): JsonBody<Delete>,
) -> Result<Response, ApiError> {
    check(&d.namespace)?;
    check_nul(&d.namespace)?;
    if let Some(scope) = caller.store_scope(&app) {
        d.namespace = scope.stored(&d.namespace);
    }
    app.data
        .with(move |c| memory::delete(c, &d.namespace, &d.key))
        .await
        .map_err(failed)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
pub(super) struct Search {
    #[serde(default)]
    namespace_prefix: Vec<String>,
    filter: Option<Map<String, Value>>,
    limit: Option<usize>,
    offset: Option<usize>,
    query: Option<String>,
    refresh_ttl: Option<bool>,
}

/// `POST /store/items/search`: `{items: [item with score]}`. With a `query`: by meaning when
/// the store has a semantic index (`runner serve --store-index`: cosine similarity, best
/// first), else keyword matches best first (the data store's BM25); without, the most recently
/// updated first. Expired items are gone, and the time to live of those returned starts again
/// unless `refresh_ttl` is false.
pub(super) async fn search(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(s): JsonBody<Search>,
) -> Result<Json<Value>, ApiError> {
    check(&s.namespace_prefix)?;
    check_nul(&s.namespace_prefix)?;
    let scope = caller.store_scope(&app);
    let query = memory::ItemQuery {
        prefix: scope
            .as_ref()
            .map_or(s.namespace_prefix.clone(), |sc| sc.stored(&s.namespace_prefix)),
        query: s.query,
        filter: s.filter,
        limit: s.limit.unwrap_or(10),
        offset: s.offset.unwrap_or(0),
        refresh: s.refresh_ttl.unwrap_or(true),
    };
    let mut items = memory::search_items(&app.data, query).await.map_err(failed)?;
    if let Some(scope) = &scope {
        items = items.into_iter().filter_map(|i| scope.shown_item(i)).collect();
    }
    Ok(Json(json!({"items": items})))
}

#[derive(Deserialize)]
pub(super) struct Namespaces {
    #[serde(default)]
    prefix: Vec<String>,
    #[serde(default)]
    suffix: Vec<String>,
    max_depth: Option<usize>,
    limit: Option<usize>,
    offset: Option<usize>,
}

/// `POST /store/namespaces`: `{namespaces: [[label, …], …]}`.
pub(super) async fn namespaces(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(mut n): JsonBody<Namespaces>,
) -> Result<Json<Value>, ApiError> {
    check(&n.prefix)?;
    check(&n.suffix)?;
    check_nul(&n.prefix)?;
    check_nul(&n.suffix)?;
    let scope = caller.store_scope(&app);
    if let Some(scope) = &scope {
        let stored = scope.stored(&n.prefix);
        // The depth counts the labels the user names, not the two of their prefix.
        n.max_depth = n.max_depth.map(|d| d + stored.len() - n.prefix.len());
        n.prefix = stored;
    }
    let found = app
        .data
        .with(move |c| {
            memory::namespaces(
                c,
                &n.prefix,
                &n.suffix,
                n.max_depth,
                n.limit.unwrap_or(100),
                n.offset.unwrap_or(0),
            )
        })
        .await
        .map_err(failed)?;
    let found: Vec<Vec<String>> = match &scope {
        Some(scope) => found.iter().filter_map(|ns| scope.shown(ns)).collect(),
        None => found,
    };
    Ok(Json(json!({"namespaces": found})))
}
