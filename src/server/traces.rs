//! Runs' traces and threads' usage, runner's additions to the API for its Studio page (and any
//! client): `GET /threads/{id}/runs/{run_id}/trace`, a run's spans and what it spent, as its
//! executing process builds it (`manager/trace.rs`) or, once stored, from the run store; and
//! `GET /threads/{id}/usage`, what the thread's runs spent, in all, by node and by model.

use axum::Extension;
use axum::extract::{Path as UrlPath, State};
use axum::response::Json;
use serde_json::{Value, json};

use super::Shared;
use super::auth::{Caller, owner};
use super::http::ApiError;
use super::manager::UsageSums;

/// A run's trace: `{run_id, thread_id, status, started_at, ended_at, spans, usage}`; `status`
/// is the run's. A run that has not started (or ran before traces were kept) has no spans.
pub(super) async fn run_trace(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath((thread_id, run_id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &thread_id)?;
    let row = app.runs.get(&thread_id, &run_id)?;
    let mut trace = match live(&app, &run_id) {
        Some((trace, _)) => trace,
        None => match app.store.get_trace(&run_id)? {
            Some(t) => t.trace,
            None => json!({"started_at": null, "ended_at": null, "spans": [], "usage": UsageSums::default().json()}),
        },
    };
    if let Value::Object(t) = &mut trace {
        // Kept for a resumed run's times only.
        t.remove("started_ms");
        t.insert("run_id".into(), json!(row.run_id));
        t.insert("thread_id".into(), json!(row.thread_id));
        t.insert("status".into(), json!(row.status.as_str()));
    }
    Ok(Json(trace))
}

/// What a thread's runs spent: `{total, by_node, by_model, runs}`, `runs` counting the runs
/// whose usage is summed.
pub(super) async fn thread_usage(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(thread_id): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &thread_id)?;
    if !app.runs.thread_exists(&thread_id)? {
        return Err(ApiError::not_found(format!("Thread with ID {thread_id} not found")));
    }
    let runs = app.store.list_runs(Some(&thread_id), &[])?;
    let stored = app.store.list_traces(&thread_id)?;
    let mut sums = UsageSums::default();
    let mut counted = 0;
    for run in &runs {
        let usage = match live(&app, &run.run_id) {
            Some((_, usage)) => usage,
            None => match stored.iter().find(|t| t.run_id == run.run_id) {
                Some(t) => UsageSums::from_json(&t.usage),
                None => continue,
            },
        };
        sums.add(&usage);
        counted += 1;
    }
    let mut out = sums.json();
    out["runs"] = json!(counted);
    Ok(Json(out))
}

/// The trace of a run executing (or executed) in this process, as its recorder has it now.
fn live(app: &Shared, run_id: &str) -> Option<(Value, UsageSums)> {
    app.runs
        .live_trace(run_id)
        .or_else(|| app.worker.as_ref().and_then(|w| w.live_trace(run_id)))
}
