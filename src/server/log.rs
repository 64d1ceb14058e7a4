//! A log line per request (method, path, status, duration) and a span around its handling.
//! The duration is the time to the response's head: a streamed body goes on after it.

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub(super) async fn request(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    // The path only: a query may carry a key.
    let path = req.uri().path().to_string();
    let started = Instant::now();
    let span = tracing::info_span!(
        "http.server.request",
        otel.name = tracing::field::Empty,
        otel.kind = "server",
        http.request.method = %method,
        url.path = %path,
        http.response.status_code = tracing::field::Empty,
    );
    if !span.is_disabled() {
        span.record("otel.name", method.as_str());
    }
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    if status >= 500 {
        tracing::warn!(method = %method, path = %path, status, duration_ms, "request");
    } else {
        tracing::info!(method = %method, path = %path, status, duration_ms, "request");
    }
    response
}
