//! A thread's runs after they started: listed, looked at, joined, cancelled (interrupted, or
//! rolled back), deleted; runs started in the background, which nobody streams; and the runs a
//! server before this one left unfinished, resumed. What is shown of a run is its row in the
//! store, so runs outlive the server that started them.

use axum::Extension;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Shared;
use super::auth::{Caller, owner};
use super::http::{ApiError, JsonBody};
use super::manager::{Cancel, CreateRun};
use super::runs::run_json;
use super::threads::pending_interrupts;
use crate::checkpoint::{RunRow, RunStatus};

pub(super) async fn get_run(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &thread_id)?;
    Ok(Json(run_json(&app.runs.get(&thread_id, &run_id)?)))
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
    Extension(caller): Extension<Caller>,
    UrlPath(thread_id): UrlPath<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &thread_id)?;
    let runs = app.runs.list(
        &thread_id,
        q.status.as_deref(),
        q.offset.unwrap_or(0),
        q.limit.unwrap_or(10),
    )?;
    Ok(Json(Value::Array(runs.iter().map(run_json).collect())))
}

/// Creates a run nobody streams on `thread` (none: a thread of its own): answered at once with
/// the run as stored (`pending` until it has a worker and its thread), which goes on.
pub(super) async fn background(
    app: &Shared,
    caller: &Caller,
    thread: Option<String>,
    mut kwargs: Value,
) -> Result<RunRow, ApiError> {
    // Nobody is connected to go away: the run always goes on.
    if let Value::Object(k) = &mut kwargs {
        k.insert("on_disconnect".into(), json!("continue"));
    }
    let queued = super::runs::create(app, caller, thread, kwargs).await?;
    // As created: a worker of a shared database may have taken it already.
    let row = queued.row().clone();
    let app = app.clone();
    tokio::spawn(async move {
        // A run that cannot start has recorded why in its row.
        if let Ok(started) = queued.started(&app).await {
            // Nobody reads it now; a client may join it.
            super::hub::feed(&app, started);
        }
    });
    Ok(row)
}
/// `POST /threads/{id}/runs`: a run in the background.
pub(super) async fn create_on_thread(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(thread_id): UrlPath<String>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let run = background(&app, &caller, Some(thread_id), kwargs).await?;
    let location = format!("/threads/{}/runs/{}", run.thread_id, run.run_id);
    let mut response = Json(run_json(&run)).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::CONTENT_LOCATION, v);
    }
    Ok(response)
}

/// `POST /runs`: a stateless run in the background, on a thread of its own.
pub(super) async fn create_stateless(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let run = background(&app, &caller, None, kwargs).await?;
    let location = format!("/runs/{}", run.run_id);
    let mut response = Json(run_json(&run)).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::CONTENT_LOCATION, v);
    }
    Ok(response)
}

/// Waits for the run's end, then answers the thread's values as `runs/wait` does.
pub(super) async fn join(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &thread_id)?;
    let run = app.runs.join(&thread_id, &run_id).await?;
    if let Some(error) = run.error {
        return Ok(Json(json!({"__error__": error})));
    }
    let Some(cp) = app.store.get_checkpoint(&thread_id, None)? else {
        return Ok(Json(json!({})));
    };
    let graph = app
        .store
        .get_thread(&thread_id)?
        .and_then(|t| app.graphs.of_workflow(&t.workflow));
    let mut values = match &graph {
        Some(g) => {
            let (values, _) = crate::engine::Engine::pending_state(g.plan.clone(), app.store.clone(), &cp)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            super::messages::written_state(values, &cp, &g.plan)
        }
        None => app.store.state(&thread_id, &cp.versions)?,
    };
    let interrupts: Vec<Value> = pending_interrupts(&cp, &app.store.get_writes(&thread_id, &cp.checkpoint_id)?)
        .into_iter()
        .map(|(_, mut i)| {
            i["response_schema"] = Value::Null;
            i
        })
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

/// Cancels the run at once, as LangGraph's server does: its running tasks are dropped where
/// they are (a model call's request with them) and their writes are not kept. `action=interrupt`
/// (the default) leaves the thread at the checkpoint the cancelled step started from, waiting
/// for those tasks; `action=rollback` waits for the run to stop, then takes its thread back to
/// where it was before the run and deletes the run. With `wait=1`, answers once it has stopped.
pub(super) async fn cancel(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
    Query(q): Query<CancelQuery>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &thread_id)?;
    let action = match q.action.as_deref() {
        None | Some("interrupt") => Cancel::Interrupt,
        Some("rollback") => Cancel::Rollback,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "cancel action must be `interrupt` or `rollback`, not `{other}`"
            )));
        }
    };
    let wait = matches!(q.wait.as_deref(), Some("1" | "true"));
    app.runs.cancel(&thread_id, &run_id, action, wait).await?;
    Ok(Json(json!({})))
}

/// Deletes a run that has ended (a running one is a 409: cancel it first).
pub(super) async fn delete_run(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    owner::thread(&app, &caller, &thread_id)?;
    app.runs.delete(&thread_id, &run_id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Joins a run's stream: from the start (`Last-Event-ID: -1`), after the event a client saw
/// (`Last-Event-ID: N`), or from now on. A run no reader may join any more (it ended and was not
/// created with `stream_resumable`) gives an empty stream.
pub(super) async fn join_stream(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    owner::thread(&app, &caller, &thread_id)?;
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let locations = [
        (header::LOCATION, format!("/threads/{thread_id}/runs/{run_id}/stream")),
        (header::CONTENT_LOCATION, format!("/threads/{thread_id}/runs/{run_id}")),
    ];
    super::runs::follow(&app, &thread_id, &run_id).await?;
    let Some(hub) = app.runs.joinable(&thread_id, &run_id).await?.and_then(|r| r.stream) else {
        return Ok(super::hub::response(super::hub::ended(), 0, None, locations));
    };
    let from = match last {
        Some("-1") => 0,
        // Ids count frames from the run's first id: after id N comes the frame N - base.
        Some(id) => hub.index_after(
            id.parse::<u64>()
                .map_err(|_| ApiError::invalid(format!("Last-Event-ID `{id}` is not an event id of this run")))?,
        ),
        None => hub.len(),
    };
    Ok(super::hub::response(hub, from, None, locations))
}

/// Starts again every run the store holds as pending or running: runs a server left unfinished
/// when it stopped or was killed. Each holds its thread again (waiting out the lease of a dead
/// server on another host) and is fed as a background run that a client joins by its id. The
/// runs of one thread go one after the other, oldest first, as they were queued.
pub(crate) fn resume_unfinished(app: &Shared) -> Result<usize, ApiError> {
    let rows = app.runs.unfinished()?;
    let count = rows.len();
    let mut by_thread: Vec<(String, Vec<RunRow>)> = Vec::new();
    for row in rows {
        match by_thread.iter_mut().find(|(t, _)| *t == row.thread_id) {
            Some((_, runs)) => runs.push(row),
            None => by_thread.push((row.thread_id.clone(), vec![row])),
        }
    }
    for (_, rows) in by_thread {
        let app = app.clone();
        tokio::spawn(async move {
            for row in rows {
                let (thread_id, run_id) = (row.thread_id.clone(), row.run_id.clone());
                let started = match CreateRun::resumed(&app.graphs, row) {
                    Ok(create) => match super::runs::queue(&app, create).await {
                        Ok(queued) => queued.started(&app).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e.into()),
                };
                match started {
                    Ok(started) => {
                        super::hub::feed(&app, started);
                        if let Some(run) = app.runs.live(&thread_id, &run_id) {
                            run.wait_end().await;
                        }
                    }
                    Err(e) => {
                        let error = json!({"error": "ResumeError", "message": e.detail});
                        // Nothing else is left to tell: the run's row is its only record.
                        let _ = app
                            .store
                            .set_run_status(&run_id, RunStatus::Error, Some(&error), &crate::clock::now());
                    }
                }
            }
        });
    }
    Ok(count)
}
