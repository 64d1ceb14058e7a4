//! The HTTP edges every endpoint shares: errors as `{"detail": …}` with the reference server's
//! statuses, JSON bodies read leniently (unknown fields ignored, an empty body is `{}`), CORS.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// An error answered as `{"detail": message}` with its status.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub detail: String,
    /// Seconds until a refused request may succeed (`Retry-After`): a spent quota's.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            detail: detail.into(),
            retry_after: None,
        }
    }

    pub(super) fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, detail.into())
    }

    pub(super) fn conflict(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, detail.into())
    }

    pub(super) fn invalid(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, detail.into())
    }

    pub(super) fn internal(detail: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, detail.to_string())
    }
}

/// How long a client is told to wait before it tries again a request the database could not
/// take.
const UNREACHABLE_RETRY_AFTER: u64 = 5;

impl From<crate::checkpoint::CheckpointError> for ApiError {
    fn from(e: crate::checkpoint::CheckpointError) -> Self {
        match e {
            // The database cannot be reached for now (restarting, failing over, every
            // connection taken), which the same request may not find in a moment: a 503 that
            // says when to try again, not a 500.
            crate::checkpoint::CheckpointError::Unavailable(_) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                detail: e.to_string(),
                retry_after: Some(UNREACHABLE_RETRY_AFTER),
            },
            e => ApiError::internal(e),
        }
    }
}

impl From<crate::run::RunError> for ApiError {
    fn from(e: crate::run::RunError) -> Self {
        ApiError::internal(e)
    }
}

/// The one place a run manager's error becomes a status, as the reference answers each.
impl From<super::manager::RunsError> for ApiError {
    fn from(e: super::manager::RunsError) -> Self {
        use super::manager::RunsError;
        match e {
            RunsError::Invalid(m) => ApiError::invalid(m),
            RunsError::NotFound(m) => ApiError::not_found(m),
            RunsError::Conflict(m) => ApiError::conflict(m),
            RunsError::Engine(e) => refused(e),
            RunsError::Store(e) => e.into(),
            RunsError::Build(e) => e.into(),
        }
    }
}

/// Why the engine would not start or continue a run, as the reference answers it.
pub(crate) fn refused(e: crate::engine::EngineError) -> ApiError {
    use crate::checkpoint::CheckpointError;
    use crate::engine::EngineError;
    match e {
        EngineError::Busy(_) | EngineError::Store(CheckpointError::Leased(_)) => {
            ApiError::conflict(super::manager::BUSY)
        }
        EngineError::NoThread(t) => ApiError::not_found(format!("Thread with ID {t} not found")),
        e @ (EngineError::Input(_)
        | EngineError::Incompatible(_)
        | EngineError::NotInterrupted(_)
        | EngineError::BadAnswer(_)
        | EngineError::AlreadyAnswered(_)
        | EngineError::WhichGate { .. }
        | EngineError::NoSuchGate { .. }
        | EngineError::Edit(_)) => ApiError::invalid(e.to_string()),
        EngineError::Store(e @ CheckpointError::Unavailable(_)) => e.into(),
        e => ApiError::internal(e),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(json!({"detail": self.detail}))).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A request body read as `T`: an empty body is `{}`; anything that is not `T` is a 422
/// naming why. The body's bytes are dropped as soon as they are parsed, before the handler
/// runs: hyper reads a request into a buffer that the body's bytes are a slice of, and while
/// any slice of it lives, the next read (hyper's check for a closed connection, made while a
/// handler waits or a response streams) takes a new 8 KiB buffer instead of reusing it.
pub(crate) struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        parse(&bytes).map(JsonBody).map_err(IntoResponse::into_response)
    }
}

fn parse<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(text).map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))
}

/// `GET /ok`: the process answers. With `check_db=1` (as LangGraph's server), the checkpoint
/// database must answer too: 503 naming why when it does not (a load balancer takes the process
/// out of rotation; its runs are not affected).
pub(crate) async fn ok(
    axum::extract::State(app): axum::extract::State<super::Shared>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if q.get("check_db").is_some_and(|v| matches!(v.as_str(), "1" | "true")) {
        let store = app.store.clone();
        let answered = tokio::task::spawn_blocking(move || store.ping()).await;
        let failed = match answered {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(detail) = failed {
            return (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(json!({"ok": false, "detail": detail})),
            )
                .into_response();
        }
    }
    axum::Json(json!({"ok": true})).into_response()
}

pub(crate) async fn info() -> axum::Json<Value> {
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "langgraph_py_version": null,
        "flags": {"assistants": true, "crons": true, "langsmith": false, "langsmith_tracing_replicas": false},
        "host": {"kind": "runner", "project_id": null, "revision_id": null, "tenant_id": null},
    }))
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("Not Found")
}

/// The headers a browser may read from a response: without `content-location` a JS client
/// never learns the id of the run it started.
const EXPOSED: &str = "x-pagination-total, x-pagination-next, content-location";
const METHODS: &str = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";

/// CORS as the reference server answers it: any origin, method and header; preflights answered
/// here (with `Access-Control-Allow-Private-Network`, which Chrome needs before a public page
/// may call a server on loopback).
pub(crate) async fn cors(request: Request, next: Next) -> Response {
    let preflight =
        request.method() == Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(METHODS));
        let asked = request
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("*"));
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
        headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        headers.insert("access-control-allow-private-network", HeaderValue::from_static("true"));
        return (StatusCode::OK, headers, "OK").into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSED));
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::body::{Body, Bytes};
    use axum::extract::{FromRequest, Request};
    use serde_json::{Value, json};

    use super::JsonBody;

    /// Request bytes that say when they are freed.
    struct Watched(&'static [u8], Arc<AtomicBool>);

    impl AsRef<[u8]> for Watched {
        fn as_ref(&self) -> &[u8] {
            self.0
        }
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }

    async fn read(text: &'static [u8]) -> (Result<Value, (u16, Value)>, bool) {
        let freed = Arc::new(AtomicBool::new(false));
        let body = Body::from(Bytes::from_owner(Watched(text, freed.clone())));
        let request = Request::builder().method("POST").body(body).unwrap();
        // Looked at while the handler would hold what was read.
        let extracted = JsonBody::<Value>::from_request(request, &()).await;
        let freed = freed.load(Ordering::SeqCst);
        let read = match extracted {
            Ok(JsonBody(v)) => Ok(v),
            Err(response) => {
                let status = response.status().as_u16();
                let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
                Err((status, serde_json::from_slice(&body).unwrap()))
            }
        };
        (read, freed)
    }

    #[tokio::test]
    async fn a_body_is_parsed_and_its_bytes_freed_before_the_handler_runs() {
        assert_eq!(
            read(br#"{"input": {"topic": "tides"}}"#).await,
            (Ok(json!({"input": {"topic": "tides"}})), true)
        );
        // An empty body is an empty object.
        assert_eq!(read(b" \r\n").await, (Ok(json!({})), true));
        let (read, freed) = read(b"{\"input\": ").await;
        let (status, error) = read.unwrap_err();
        assert_eq!(status, 422);
        assert!(
            error["detail"].as_str().unwrap().starts_with("invalid request body: "),
            "{error}"
        );
        assert!(freed);
    }
}
