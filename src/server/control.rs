//! A thread's runs after they started: listed, looked at, joined, cancelled (interrupted, or
//! rolled back), deleted; runs started in the background, which nobody streams; and the runs a
//! server before this one left unfinished, resumed. What is shown of a run is its row in the
//! store, so runs outlive the server that started them.

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Shared;
use super::http::{ApiError, JsonBody};
use super::runs::{Resumed, RunRecord, run_json, start_run};
use super::threads::{lock, pending_interrupts};
use crate::checkpoint::{PendingWrite, RunRow, RunStatus, ThreadStatus};

fn no_run(run_id: &str) -> ApiError {
    ApiError::not_found(format!("Run {run_id} not found"))
}

/// The live run `run_id` of `thread_id`, if this server runs (or ran) it.
fn live(app: &Shared, thread_id: &str, run_id: &str) -> Option<RunRecord> {
    lock(&app.runs)
        .get(run_id)
        .filter(|r| r.thread_id == thread_id)
        .cloned()
}

/// How often a reader of a run that has not started yet looks again.
const STARTING: std::time::Duration = std::time::Duration::from_millis(50);

/// The live run `run_id` of `thread_id` once it streams: a run whose row is active but that
/// is not live here yet (a server just started is resuming it, or it is queued) is waited for.
/// `None` when the run has ended without being live here.
async fn once_started(app: &Shared, thread_id: &str, run_id: &str) -> Result<Option<RunRecord>, ApiError> {
    loop {
        if let Some(run) = live(app, thread_id, run_id)
            && (run.hub.is_some() || !run.is_active())
        {
            return Ok(Some(run));
        }
        if !stored(app, thread_id, run_id)?.status.is_active() {
            return Ok(live(app, thread_id, run_id));
        }
        tokio::time::sleep(STARTING).await;
    }
}

/// The stored run `run_id` of `thread_id`.
pub(super) fn stored(app: &Shared, thread_id: &str, run_id: &str) -> Result<RunRow, ApiError> {
    app.store
        .get_run(run_id)?
        .filter(|r| r.thread_id == thread_id)
        .ok_or_else(|| no_run(run_id))
}

pub(super) async fn get_run(
    State(app): State<Shared>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(run_json(&stored(&app, &thread_id, &run_id)?)))
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
    let runs = app.store.list_runs(Some(&thread_id), &[])?;
    // Oldest first from the store (run ids are UUIDv7: their order is their creation's).
    let page: Vec<Value> = runs
        .iter()
        .rev()
        .filter(|r| q.status.as_deref().is_none_or(|s| r.status.as_str() == s))
        .skip(q.offset.unwrap_or(0))
        .take(q.limit.unwrap_or(10))
        .map(run_json)
        .collect();
    Ok(Json(Value::Array(page)))
}

/// Creates a run nobody streams on `thread` (none: a thread of its own): answered at once with
/// the run as stored (`pending` until it has a worker and its thread), which goes on.
pub(super) async fn background(app: &Shared, thread: Option<String>, mut kwargs: Value) -> Result<RunRow, ApiError> {
    // Nobody is connected to go away: the run always goes on.
    if let Value::Object(k) = &mut kwargs {
        k.insert("on_disconnect".into(), json!("continue"));
    }
    let queued = start_run(app, thread, kwargs, None).await?;
    let row = stored(app, &queued.thread_id, &queued.run_id)?;
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
    UrlPath(thread_id): UrlPath<String>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let run = background(&app, Some(thread_id), kwargs).await?;
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
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let run = background(&app, None, kwargs).await?;
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
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    if let Some(run) = once_started(&app, &thread_id, &run_id).await? {
        let mut ended = run.ended;
        // A closed channel means the run's task is gone, after recording its end.
        let _ = ended.wait_for(|e| *e).await;
    }
    let run = stored(&app, &thread_id, &run_id)?;
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
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
    Query(q): Query<CancelQuery>,
) -> Result<Json<Value>, ApiError> {
    let rollback = match q.action.as_deref() {
        None | Some("interrupt") => false,
        Some("rollback") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "cancel action must be `interrupt` or `rollback`, not `{other}`"
            )));
        }
    };
    // Only a run that has not ended can be cancelled: the reference answers 404 for one that
    // has (it is no longer among the runs that can be).
    if !stored(&app, &thread_id, &run_id)?.status.is_active() {
        return Err(no_run(&run_id));
    }
    let Some(run) = live(&app, &thread_id, &run_id) else {
        // A run of no server now: it has ended (or waits for a server to resume it).
        if rollback {
            return Err(ApiError::conflict(format!(
                "run {run_id} is not running here: only a running run can be rolled back"
            )));
        }
        return Ok(Json(json!({})));
    };
    if rollback {
        stop(&app, run, true).await?;
        return Ok(Json(json!({})));
    }
    run.cancel();
    if matches!(q.wait.as_deref(), Some("1" | "true")) {
        let mut ended = run.ended;
        let _ = ended.wait_for(|e| *e).await;
    }
    Ok(Json(json!({})))
}

/// Deletes a run that has ended (a running one is a 409: cancel it first).
pub(super) async fn delete_run(
    State(app): State<Shared>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let run = stored(&app, &thread_id, &run_id)?;
    if run.status.is_active() {
        return Err(ApiError::conflict(format!(
            "run {run_id} is {}: cancel it before deleting it",
            run.status.as_str()
        )));
    }
    app.store.delete_run(&run_id)?;
    lock(&app.runs).remove(&run_id);
    Ok(StatusCode::NO_CONTENT)
}

/// Stops every active run of `thread_id` and waits for their ends (a newer run's
/// `multitask_strategy` `interrupt` or `rollback`); with `rollback`, each is rolled back.
pub(super) async fn stop_runs_of(app: &Shared, thread_id: &str, rollback: bool) -> Result<(), ApiError> {
    let mut active: Vec<RunRecord> = lock(&app.runs)
        .values()
        .filter(|r| r.thread_id == thread_id && r.is_active())
        .cloned()
        .collect();
    // Newest first: a rollback of each goes back to where the one before it started.
    active.sort_by(|a, b| b.run_id.cmp(&a.run_id));
    for run in active {
        stop(app, run, rollback).await?;
    }
    Ok(())
}

/// Stops `run` and waits for its end; with `rollback`, then takes its thread back to the
/// checkpoint it started from (with that checkpoint's writes as they were) and deletes the run.
async fn stop(app: &Shared, run: RunRecord, rollback: bool) -> Result<(), ApiError> {
    run.cancel();
    let mut ended = run.ended.clone();
    let _ = ended.wait_for(|e| *e).await;
    if !rollback {
        return Ok(());
    }
    // A run cancelled while it waited for a worker never touched its thread: rolling it back
    // is forgetting it (its thread may have moved on since it was created, by the runs before it).
    if !lock(&app.runs).get(&run.run_id).is_some_and(|r| r.had_worker) {
        app.store.delete_run(&run.run_id)?;
        lock(&app.runs).remove(&run.run_id);
        return Ok(());
    }
    let thread_id = &run.thread_id;
    // The thread's lease, held while it is taken back, as every write to a thread is: a run
    // that took the thread since (one queued behind) is left alone.
    let claim = crate::checkpoint::LeaseClaim {
        thread_id: thread_id.clone(),
        owner: crate::checkpoint::new_id(),
        pid: std::process::id(),
        host: crate::engine::host().to_string(),
        ttl: crate::engine::DEFAULT_LEASE_TTL,
        replace: None,
    };
    let lease = match app.store.acquire_lease(&claim) {
        Ok(lease) => lease,
        Err(crate::checkpoint::CheckpointError::Leased(_)) => {
            return Err(ApiError::conflict(format!(
                "run {} stopped, but another run took thread {thread_id} before it could be rolled back",
                run.run_id
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let rolled = roll_back(app, &run);
    // A lease that cannot be given up expires on its own.
    let _ = app.store.release_lease(&lease.fence());
    rolled
}

/// Takes `run`'s thread back to where it was before the run, and deletes the run.
fn roll_back(app: &Shared, run: &RunRecord) -> Result<(), ApiError> {
    let thread_id = &run.thread_id;
    match &run.rollback_to {
        Some((to, writes)) => {
            app.store.rollback_thread(thread_id, to, writes)?;
            let status = thread_status(app, thread_id, to, writes)?;
            app.store.set_status(thread_id, status)?;
        }
        // The run made the thread's first checkpoint: none is left. The API's record of the
        // thread (its metadata) stays, as a thread created and never run.
        None => {
            if app.store.get_thread(thread_id)?.is_some() {
                app.store.delete_thread(thread_id)?;
            }
        }
    }
    app.store.delete_run(&run.run_id)?;
    lock(&app.runs).remove(&run.run_id);
    Ok(())
}

/// A thread's status at checkpoint `to` with its pending `writes`.
fn thread_status(app: &Shared, thread_id: &str, to: &str, writes: &[PendingWrite]) -> Result<ThreadStatus, ApiError> {
    if !crate::engine::waiting_gates(writes).is_empty() {
        return Ok(ThreadStatus::Interrupted);
    }
    let done = app
        .store
        .get_checkpoint(thread_id, Some(to))?
        .is_some_and(|cp| cp.next.is_empty());
    Ok(if done {
        ThreadStatus::Done
    } else {
        ThreadStatus::Running
    })
}

/// Joins a run's stream: from the start (`Last-Event-ID: -1`), after the event a client saw
/// (`Last-Event-ID: N`), or from now on. A run no reader may join any more (it ended and was not
/// created with `stream_resumable`) gives an empty stream.
pub(super) async fn join_stream(
    State(app): State<Shared>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let locations = [
        (header::LOCATION, format!("/threads/{thread_id}/runs/{run_id}/stream")),
        (header::CONTENT_LOCATION, format!("/threads/{thread_id}/runs/{run_id}")),
    ];
    let Some(hub) = once_started(&app, &thread_id, &run_id).await?.and_then(|r| r.hub) else {
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
    let rows = app.store.list_runs(None, &[RunStatus::Pending, RunStatus::Running])?;
    let count = rows.len();
    let mut by_thread: Vec<(String, Vec<RunRow>)> = Vec::new();
    for row in rows {
        match by_thread.iter_mut().find(|(t, _)| *t == row.thread_id) {
            Some((_, runs)) => runs.push(row),
            None => by_thread.push((row.thread_id.clone(), vec![row])),
        }
    }
    for (thread_id, rows) in by_thread {
        let app = app.clone();
        tokio::spawn(async move {
            for row in rows {
                let run_id = row.run_id.clone();
                let kwargs = row.kwargs.clone();
                let resumed = Resumed {
                    was_running: row.status == RunStatus::Running,
                    row,
                };
                let started = match start_run(&app, Some(thread_id.clone()), kwargs, Some(resumed)).await {
                    Ok(queued) => queued.started(&app).await,
                    Err(e) => Err(e),
                };
                match started {
                    Ok(started) => {
                        super::hub::feed(&app, started);
                        let ended = lock(&app.runs).get(&run_id).map(|r| r.ended.clone());
                        if let Some(mut ended) = ended {
                            // A closed channel means the run's task is gone, after its end.
                            let _ = ended.wait_for(|e| *e).await;
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
