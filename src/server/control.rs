//! A thread's runs after they started: listed, looked at, joined, cancelled; and runs started in
//! the background, which nobody streams.

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Shared;
use super::http::{ApiError, body};
use super::runs::{RunRecord, start};
use super::threads::{lock, pending_interrupts};

fn no_run(run_id: &str) -> ApiError {
    ApiError::not_found(format!("Run {run_id} not found"))
}

/// The run `run_id` of `thread_id`.
fn record(app: &Shared, thread_id: &str, run_id: &str) -> Result<RunRecord, ApiError> {
    match lock(&app.runs).get(run_id) {
        Some(r) if r.thread_id == thread_id => Ok(r.clone()),
        _ => Err(no_run(run_id)),
    }
}

pub(super) async fn get_run(
    State(app): State<Shared>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(record(&app, &thread_id, &run_id)?.json()))
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    limit: Option<usize>,
    offset: Option<usize>,
    status: Option<String>,
}

/// The thread's runs, newest first.
pub(super) async fn list_runs(
    State(app): State<Shared>,
    UrlPath(thread_id): UrlPath<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    if !super::threads::exists(&app, &thread_id)? {
        return Err(ApiError::not_found(format!("Thread with ID {thread_id} not found")));
    }
    let mut runs: Vec<RunRecord> = lock(&app.runs)
        .values()
        .filter(|r| r.thread_id == thread_id)
        .filter(|r| q.status.as_deref().is_none_or(|s| r.status == s))
        .cloned()
        .collect();
    // Run ids are UUIDv7: their order is their creation's.
    runs.sort_by(|a, b| b.run_id.cmp(&a.run_id));
    let page: Vec<Value> = runs
        .iter()
        .skip(q.offset.unwrap_or(0))
        .take(q.limit.unwrap_or(10))
        .map(RunRecord::json)
        .collect();
    Ok(Json(Value::Array(page)))
}

/// Starts a run nobody streams: answered at once with the run, which goes on.
pub(super) async fn create_on_thread(
    State(app): State<Shared>,
    UrlPath(thread_id): UrlPath<String>,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let mut req: super::runs::RunCreate = body(&bytes)?;
    // Nobody is connected to go away: the run always goes on.
    req.on_disconnect = Some("continue".into());
    let started = start(&app, Some(thread_id), req).await?;
    let location = format!("/threads/{}/runs/{}", started.thread_id, started.run_id);
    let (thread_id, run_id) = (started.thread_id.clone(), started.run_id.clone());
    // Nobody reads it now; a client may join it.
    super::hub::feed(&app, started);
    let run = record(&app, &thread_id, &run_id)?;
    let mut response = Json(run.json()).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::CONTENT_LOCATION, v);
    }
    Ok(response)
}

/// Waits for the run's end, then answers the thread's values as `runs/wait` does.
pub(super) async fn join(
    State(app): State<Shared>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut ended = record(&app, &thread_id, &run_id)?.ended;
    // A closed channel means the run's task is gone, after recording its end.
    let _ = ended.wait_for(|e| *e).await;
    let run = record(&app, &thread_id, &run_id)?;
    if let Some(error) = run.error {
        return Ok(Json(json!({"__error__": error})));
    }
    let Some(cp) = app.store.get_checkpoint(&thread_id, None)? else {
        return Ok(Json(json!({})));
    };
    let mut values = app.store.state(&thread_id, &cp.versions)?;
    let interrupts: Vec<Value> = pending_interrupts(&app.store.get_writes(&thread_id, &cp.checkpoint_id)?)
        .into_iter()
        .map(|(_, i)| i)
        .collect();
    if !interrupts.is_empty() {
        values.insert("__interrupt__".into(), Value::Array(interrupts));
    }
    Ok(Json(Value::Object(values)))
}

#[derive(Deserialize)]
pub(super) struct CancelQuery {
    wait: Option<String>,
    action: Option<String>,
}

/// Stops the run at its next step boundary (its last checkpoint stays: the thread can be
/// continued); with `wait=1`, answers once it has stopped.
pub(super) async fn cancel(
    State(app): State<Shared>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
    Query(q): Query<CancelQuery>,
) -> Result<StatusCode, ApiError> {
    match q.action.as_deref() {
        None | Some("interrupt") => {}
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "cancel action `{other}` is not supported yet; `interrupt` stops the run and keeps its checkpoints"
            )));
        }
    }
    let run = record(&app, &thread_id, &run_id)?;
    run.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
    if matches!(q.wait.as_deref(), Some("1" | "true")) {
        let mut ended = run.ended;
        let _ = ended.wait_for(|e| *e).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Joins a run's stream: from the start (`Last-Event-ID: -1`), after the event a client saw
/// (`Last-Event-ID: N`), or from now on. A run no reader may join any more (it ended and was not
/// created with `stream_resumable`) gives an empty stream.
pub(super) async fn join_stream(
    State(app): State<Shared>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let run = record(&app, &thread_id, &run_id)?;
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let locations = [
        (header::LOCATION, format!("/threads/{thread_id}/runs/{run_id}/stream")),
        (header::CONTENT_LOCATION, format!("/threads/{thread_id}/runs/{run_id}")),
    ];
    let Some(hub) = run.hub else {
        return Ok(super::hub::response(super::hub::ended(), 0, None, locations));
    };
    let from = match last {
        Some("-1") => 0,
        // Ids count frames from 1: after id N comes the frame at index N.
        Some(id) => id
            .parse::<usize>()
            .map_err(|_| ApiError::invalid(format!("Last-Event-ID `{id}` is not an event id of this run")))?,
        None => hub.len(),
    };
    Ok(super::hub::response(hub, from, None, locations))
}
