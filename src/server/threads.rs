//! Threads, as the LangGraph API shows them: a thread's runs and checkpoints are the
//! checkpointer's; the API's metadata (`graph_id`, `assistant_id` and the client's own) is
//! stored beside them ([`crate::checkpoint::runs`]), from the thread's creation through the API
//! or its first run, so it outlives the server.

use axum::Extension;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Shared;
use super::auth::{Caller, owner};
use super::http::{ApiError, JsonBody};
use crate::checkpoint::{Checkpoint, PendingWrite, ThreadMeta, ThreadStatus};

/// A thread's API record made now.
pub(super) fn new_meta(thread_id: &str, metadata: Map<String, Value>) -> ThreadMeta {
    let now = crate::clock::now();
    ThreadMeta {
        thread_id: thread_id.to_string(),
        created_at: now.clone(),
        updated_at: now,
        metadata: Value::Object(metadata),
        ttl: None,
    }
}

/// A thread's API metadata as an object.
fn metadata_of(meta: &ThreadMeta) -> Map<String, Value> {
    meta.metadata.as_object().cloned().unwrap_or_default()
}

/// Whether a thread exists: created through the API or by a run.
pub(crate) fn exists(app: &Shared, thread_id: &str) -> Result<bool, ApiError> {
    if app.store.get_thread_meta(thread_id)?.is_some() {
        return Ok(true);
    }
    Ok(app.store.get_thread(thread_id)?.is_some())
}

/// A lock held for moments (a stream's frames, a connection's phase), never across a store
/// call: taken in place.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A handler that panicked while holding the lock left plain data behind, still usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The gates `writes` (the records of checkpoint `cp`) wait at, as LangGraph's `Interrupt`s
/// `{id, value}`, each with the task it stopped (a subgraph's task stands for each gate its
/// child waits at), in the order of `cp`'s tasks. Pauses before or after nodes are no
/// interrupts.
pub(crate) fn pending_interrupts(cp: &Checkpoint, writes: &[PendingWrite]) -> Vec<(String, Value)> {
    shown(cp, crate::engine::waiting_gates(writes))
}

/// Every interrupt recorded on checkpoint `cp`, answered or not: what a thread's history shows.
pub(crate) fn recorded_interrupts(cp: &Checkpoint, writes: &[PendingWrite]) -> Vec<(String, Value)> {
    shown(cp, crate::engine::recorded_gates(writes))
}

fn shown(cp: &Checkpoint, mut gates: Vec<&PendingWrite>) -> Vec<(String, Value)> {
    gates.sort_by_key(|w| cp.next.iter().position(|t| t.task_id == w.task_id));
    gates
        .into_iter()
        .filter(|w| !crate::engine::is_pause(w))
        .flat_map(|w| {
            super::translate::flatten(&w.task_id, &w.value)
                .into_iter()
                .map(|(id, value)| (w.task_id.clone(), json!({"id": id, "value": value})))
        })
        .collect()
}

/// The served graph a thread runs (none: its workflow is not served).
fn graph_of(app: &Shared, thread: Option<&crate::checkpoint::Thread>) -> Option<std::sync::Arc<super::Graph>> {
    thread.and_then(|t| app.graphs.of_workflow(&t.workflow))
}

/// A state as the API shows it for `graph` (none: as stored).
fn shown_state(values: Map<String, Value>, graph: Option<&super::Graph>) -> Map<String, Value> {
    match graph {
        Some(g) => super::messages::served_state(values, &g.plan),
        None => values,
    }
}

/// The API's thread. One never run has `values: null` and no `error` or `interrupts`; a copy
/// not run since has no `values` either; one that ran has them all, as the reference shows
/// its threads.
pub(crate) fn thread_json(app: &Shared, thread_id: &str) -> Result<Option<Value>, ApiError> {
    let meta = app.store.get_thread_meta(thread_id)?;
    let stored = app.store.get_thread(thread_id)?;
    let busy = app.runs.busy(thread_id);
    let graph = graph_of(app, stored.as_ref());
    let (meta, status) = match (meta, &stored) {
        (None, None) => return Ok(None),
        (meta, Some(t)) => {
            let meta = meta.unwrap_or_else(|| {
                // A thread from before this server: its graph is the workflow it records.
                let mut m = Map::new();
                if let Some(g) = &graph {
                    m.insert("graph_id".into(), json!(g.graph_id));
                    m.insert("assistant_id".into(), json!(g.assistant_id));
                }
                ThreadMeta {
                    thread_id: thread_id.to_string(),
                    created_at: t.created_at.clone(),
                    updated_at: t.updated_at.clone(),
                    metadata: Value::Object(m),
                    ttl: None,
                }
            });
            (meta, status_name(t.status))
        }
        (Some(meta), None) => (meta, "idle"),
    };
    let runs = app.store.list_runs(Some(thread_id), &[])?;
    // A thread a run has touched (its record updated since it was made) shows its run
    // configuration, even if that run was rolled back since.
    let touched = !runs.is_empty() || meta.updated_at != meta.created_at;
    let mut out = json!({
        "thread_id": thread_id,
        "created_at": meta.created_at,
        "updated_at": stored.as_ref().map_or(meta.updated_at.clone(), |t| t.updated_at.clone()),
        "state_updated_at": meta.updated_at,
        "metadata": metadata_of(&meta),
        "status": if busy { "busy" } else { status },
        "config": {},
    });
    let cp = app.store.get_checkpoint(thread_id, None)?;
    if let Some(cp) = &cp {
        out["state_updated_at"] = json!(cp.created_at);
    }
    if touched {
        out["config"] = json!({"configurable": {}});
    }
    if runs.is_empty() {
        if cp.is_none() {
            out["values"] = Value::Null;
        }
        return Ok(Some(out));
    }
    let (values, interrupts) = match &cp {
        Some(cp) => {
            let (values, _) = head_state(app, graph.as_deref(), cp)?;
            let writes = app.store.get_writes(thread_id, &cp.checkpoint_id)?;
            let mut by_task = Map::new();
            for (task, i) in pending_interrupts(cp, &writes) {
                if let Value::Array(list) = by_task.entry(task).or_insert_with(|| json!([])) {
                    list.push(i);
                }
            }
            (Value::Object(shown_state(values, graph.as_deref())), by_task)
        }
        None => (Value::Null, Map::new()),
    };
    out["values"] = values;
    out["interrupts"] = Value::Object(interrupts);
    // A thread whose last run failed shows why; one whose last run was cancelled waits where
    // it stopped, interrupted, and says so.
    let last = runs.last();
    let cancelled = status == "idle"
        && last.is_some_and(|r| r.status == crate::checkpoint::RunStatus::Interrupted)
        && cp.as_ref().is_some_and(|cp| !cp.next.is_empty());
    if cancelled && !busy {
        out["status"] = json!("interrupted");
    }
    out["error"] = match status {
        "error" => last.and_then(|r| r.error.clone()).unwrap_or(Value::Null),
        _ if cancelled => last.and_then(|r| r.error.clone()).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    Ok(Some(out))
}

/// The state at a thread's head as `get_state` shows it: what its finished tasks stored
/// applied (a step cut short by a gate keeps them), and the tasks still to run.
fn head_state(
    app: &Shared,
    graph: Option<&super::Graph>,
    cp: &Checkpoint,
) -> Result<(Map<String, Value>, Vec<crate::checkpoint::TaskSpec>), ApiError> {
    match graph {
        Some(g) => crate::engine::Engine::pending_state(g.plan.clone(), app.store.clone(), cp)
            .map_err(|e| ApiError::internal(e.to_string())),
        None => Ok((app.store.state(&cp.thread_id, &cp.versions)?, cp.next.clone())),
    }
}

/// The API's name of a stored thread's status. A thread left `running` by a server that
/// stopped is not running now: it waits to be continued, as an idle thread does.
fn status_name(s: ThreadStatus) -> &'static str {
    match s {
        ThreadStatus::Interrupted => "interrupted",
        ThreadStatus::Failed => "error",
        ThreadStatus::Done | ThreadStatus::Running => "idle",
    }
}

/// A checkpoint's metadata as LangGraph's checkpoints keep it: the run's that made it (its
/// graph, assistant and id, and the client's), how it came to be and its step.
pub(crate) fn checkpoint_metadata(cp: &Checkpoint, thread_id: &str) -> Map<String, Value> {
    let mut m = crate::engine::checkpoint_run_metadata(cp).unwrap_or_default();
    m.insert("source".into(), json!(crate::engine::checkpoint_source(cp).as_str()));
    m.insert("step".into(), json!(cp.step));
    m.insert("parents".into(), json!({}));
    m.insert("thread_id".into(), json!(thread_id));
    m
}

/// A checkpoint as LangGraph's `ThreadState`. `head`: the thread's latest, shown as
/// `get_state` shows it (its finished tasks' results applied, only the tasks still to run
/// next, the interrupts that wait); otherwise as history shows it (as stored, every task next,
/// every interrupt recorded on it).
pub(crate) fn state_json(app: &Shared, thread_id: &str, cp: &Checkpoint, head: bool) -> Result<Value, ApiError> {
    let thread = app.store.get_thread(thread_id)?;
    let graph = graph_of(app, thread.as_ref());
    let (values, next) = if head {
        head_state(app, graph.as_deref(), cp)?
    } else {
        (app.store.state(thread_id, &cp.versions)?, cp.next.clone())
    };
    let writes = app.store.get_writes(thread_id, &cp.checkpoint_id)?;
    let interrupts = if head {
        pending_interrupts(cp, &writes)
    } else {
        recorded_interrupts(cp, &writes)
    };
    let results = crate::engine::task_results(&writes);
    let errors = crate::engine::task_errors(&writes);
    let tasks: Vec<Value> = cp
        .next
        .iter()
        .map(|t| {
            let mine: Vec<&Value> = interrupts
                .iter()
                .filter(|(id, _)| *id == t.task_id)
                .map(|(_, i)| i)
                .collect();
            let child = graph.as_ref().is_some_and(|g| {
                g.plan
                    .node_by_name(&t.node)
                    .is_some_and(|ix| g.plan.subgraphs().contains_key(&ix))
            });
            // A turn's input is shown as it was given.
            let served = t.node != crate::engine::START_TASK;
            let result = results.get(&t.task_id).map(|writes| {
                let writes = writes.clone();
                if !served {
                    return Value::Object(writes);
                }
                Value::Object(match &graph {
                    Some(g) => super::messages::served(writes, &super::messages::keys(&g.plan)),
                    None => writes,
                })
            });
            json!({
                "id": t.task_id, "name": t.node,
                "path": [if t.item.is_some() { "__pregel_push" } else { "__pregel_pull" }, t.node],
                "error": errors.get(&t.task_id), "interrupts": mine,
                "checkpoint": child.then(|| json!({"checkpoint_ns": format!("{}:{}", t.node, t.task_id), "thread_id": thread_id})),
                "state": null, "result": result,
            })
        })
        .collect();
    let reference = |id: &str| json!({"checkpoint_id": id, "thread_id": thread_id, "checkpoint_ns": ""});
    Ok(json!({
        "values": shown_state(values, graph.as_deref()),
        "next": next.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(),
        "tasks": tasks,
        "metadata": checkpoint_metadata(cp, thread_id),
        "created_at": cp.created_at,
        "checkpoint": reference(&cp.checkpoint_id),
        "parent_checkpoint": cp.parent_id.as_deref().map(reference),
        "interrupts": interrupts.into_iter().map(|(_, i)| i).collect::<Vec<_>>(),
        "checkpoint_id": cp.checkpoint_id,
        "parent_checkpoint_id": cp.parent_id,
    }))
}

fn no_thread(id: &str) -> ApiError {
    ApiError::not_found(format!("Thread with ID {id} not found"))
}

#[derive(Deserialize)]
pub(super) struct Create {
    thread_id: Option<String>,
    #[serde(default)]
    metadata: Map<String, Value>,
    if_exists: Option<String>,
    graph_id: Option<String>,
    /// `{ttl: minutes, strategy: "delete"}`, or a number of minutes.
    ttl: Option<Value>,
}

pub(super) async fn create(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(c): JsonBody<Create>,
) -> Result<Json<Value>, ApiError> {
    let id = c.thread_id.unwrap_or_else(crate::checkpoint::new_id);
    let mut metadata = c.metadata;
    // The caller's, unless an admin names its owner.
    if caller.restricted() || !metadata.contains_key("owner") {
        caller.stamp(&mut metadata);
    }
    if let Some(g) = c.graph_id {
        metadata.insert("graph_id".into(), json!(g));
    }
    let mut meta = new_meta(&id, metadata);
    meta.ttl = super::ttl::parse(c.ttl.as_ref())?
        .or(app.ttls.default_minutes)
        .map(super::ttl::starting);
    // Whether the thread exists is decided with its creation, in one transaction: of two
    // creates of one id, one makes it and the other finds it. (A thread a run made without
    // the API has no metadata yet: it exists too.)
    let created = app.store.get_thread(&id)?.is_none() && app.store.create_thread_meta(&meta)?;
    if !created {
        // Another user's thread exists as much as one's own: its id is taken either way.
        let visible = owner::thread(&app, &caller, &id).is_ok();
        return match c.if_exists.as_deref() {
            Some("do_nothing") if visible => Ok(Json(thread_json(&app, &id)?.ok_or_else(|| no_thread(&id))?)),
            Some("do_nothing") => Err(ApiError::conflict(format!("Thread with ID {id} already exists"))),
            None | Some("raise") => Err(ApiError::conflict(format!("Thread with ID {id} already exists"))),
            Some(other) => Err(ApiError::invalid(format!(
                "if_exists must be `raise` or `do_nothing`, not `{other}`"
            ))),
        };
    }
    Ok(Json(thread_json(&app, &id)?.ok_or_else(|| no_thread(&id))?))
}

#[derive(Deserialize)]
pub(super) struct Include {
    /// Optional fields, comma-separated: `ttl`.
    #[serde(default)]
    include: String,
}

/// `GET /threads/{id}`; with `?include=ttl`, the thread's time to live too (when it has one).
pub(super) async fn get(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<Include>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    let mut thread = thread_json(&app, &id)?.ok_or_else(|| no_thread(&id))?;
    if q.include.split(',').any(|f| f.trim() == "ttl")
        && let Some(ttl) = app.store.get_thread_meta(&id)?.and_then(|m| m.ttl)
    {
        thread["ttl"] = super::ttl::shown(&ttl);
    }
    Ok(Json(thread))
}

/// `DELETE /threads/{id}`: the thread, its checkpoints and its runs, as the reference deletes
/// them. A run in progress or queued on it is cancelled first, and no run is admitted to the
/// thread meanwhile, so none brings it back.
pub(super) async fn delete(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    owner::thread(&app, &caller, &id)?;
    app.runs.delete_thread(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(super) struct Search {
    #[serde(default)]
    metadata: Map<String, Value>,
    status: Option<String>,
    ids: Option<Vec<String>>,
    #[serde(default = "ten")]
    limit: usize,
    #[serde(default)]
    offset: usize,
}

fn ten() -> usize {
    10
}

/// Threads whose metadata holds every pair asked for, newest first, with the reference's
/// pagination headers.
pub(super) async fn search(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(q): JsonBody<Search>,
) -> Result<Response, ApiError> {
    // A user's own threads, found by the owner's index; an admin's, every thread.
    let (metas, heads) = match (&caller.user, caller.restricted()) {
        (Some(user), true) => (app.store.list_thread_meta_of(user)?, Vec::new()),
        (None, true) => (Vec::new(), Vec::new()),
        _ => (app.store.list_thread_meta()?, app.store.list_thread_heads()?),
    };
    let mut ids: Vec<String> = metas.into_iter().map(|m| m.thread_id).collect();
    for head in heads {
        // A child thread of a subgraph or a thread of another program is not this server's.
        if app.graphs.of_workflow(&head.workflow).is_some() && !ids.contains(&head.thread_id) {
            ids.push(head.thread_id);
        }
    }
    let mut found = Vec::new();
    for id in ids {
        if q.ids.as_ref().is_some_and(|wanted| !wanted.contains(&id)) {
            continue;
        }
        let Some(t) = thread_json(&app, &id)? else { continue };
        let fits = q.metadata.iter().all(|(k, v)| t["metadata"].get(k) == Some(v))
            && q.status.as_ref().is_none_or(|s| t["status"] == *s);
        if fits {
            found.push(t);
        }
    }
    found.sort_by(|a, b| b["updated_at"].as_str().cmp(&a["updated_at"].as_str()));
    let total = found.len();
    let page: Vec<Value> = found.into_iter().skip(q.offset).take(q.limit).collect();
    let mut headers = HeaderMap::new();
    headers.insert("x-pagination-total", HeaderValue::from(total));
    if q.offset + page.len() < total {
        headers.insert("x-pagination-next", HeaderValue::from(q.offset + page.len()));
    }
    Ok((headers, Json(Value::Array(page))).into_response())
}

/// The head of a thread. A thread created but never run has empty values and nothing next.
pub(super) async fn state(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    match app.store.get_checkpoint(&id, None)? {
        Some(cp) => Ok(Json(state_json(&app, &id, &cp, true)?)),
        None if exists(&app, &id)? => Ok(Json(json!({
            "values": {}, "next": [], "tasks": [], "metadata": null, "created_at": null,
            "checkpoint": null, "parent_checkpoint": null, "interrupts": [], "checkpoint_id": null,
            "parent_checkpoint_id": null,
        }))),
        None => Err(no_thread(&id)),
    }
}

#[derive(Deserialize)]
pub(super) struct HistoryQuery {
    #[serde(default = "ten")]
    limit: usize,
    before: Option<Value>,
}

pub(super) async fn history_post(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    JsonBody(q): JsonBody<HistoryQuery>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    history(&app, &id, q)
}

pub(super) async fn history_get(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    Query(params): Query<Map<String, Value>>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    let limit = match params.get("limit") {
        Some(Value::String(s)) => s.parse().map_err(|_| ApiError::invalid("limit must be a number"))?,
        _ => 10,
    };
    let before = params.get("before").cloned().map(|b| json!({"checkpoint_id": b}));
    history(&app, &id, HistoryQuery { limit, before })
}

/// The thread's checkpoints newest first, each as a `ThreadState`; `before` starts after the
/// checkpoint it names.
fn history(app: &Shared, id: &str, q: HistoryQuery) -> Result<Json<Value>, ApiError> {
    if !exists(app, id)? {
        return Err(no_thread(id));
    }
    // A thread no run has touched yet has no checkpoints: its history is empty.
    if app.store.get_checkpoint(id, None)?.is_none() {
        return Ok(Json(json!([])));
    }
    let before = q
        .before
        .as_ref()
        .and_then(|b| b.get("checkpoint_id").and_then(Value::as_str).map(str::to_string));
    let mut out = Vec::new();
    let mut started = before.is_none();
    for cp in app.store.history(id)? {
        if !started {
            started = Some(&cp.checkpoint_id) == before.as_ref();
            continue;
        }
        if out.len() == q.limit {
            break;
        }
        out.push(state_json(app, id, &cp, false)?);
    }
    Ok(Json(Value::Array(out)))
}

/// The state at one checkpoint of the thread.
fn state_at(app: &Shared, id: &str, checkpoint_id: &str) -> Result<Json<Value>, ApiError> {
    match app.store.get_checkpoint(id, Some(checkpoint_id))? {
        Some(cp) => {
            let head = app
                .store
                .get_checkpoint(id, None)?
                .is_some_and(|h| h.checkpoint_id == cp.checkpoint_id);
            Ok(Json(state_json(app, id, &cp, head)?))
        }
        None if exists(app, id)? => Err(ApiError::not_found(format!(
            "Checkpoint {checkpoint_id} of thread {id} not found"
        ))),
        None => Err(no_thread(id)),
    }
}

pub(super) async fn state_at_get(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath((id, checkpoint_id)): UrlPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    state_at(&app, &id, &checkpoint_id)
}

#[derive(Deserialize)]
pub(super) struct AtCheckpoint {
    checkpoint: CheckpointRef,
}

#[derive(Deserialize)]
struct CheckpointRef {
    checkpoint_id: String,
}

pub(super) async fn state_at_post(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    JsonBody(at): JsonBody<AtCheckpoint>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    state_at(&app, &id, &at.checkpoint.checkpoint_id)
}

#[derive(Deserialize)]
pub(super) struct StateUpdate {
    #[serde(default)]
    values: Option<Value>,
    #[serde(default)]
    as_node: Option<String>,
    /// `{checkpoint_id, …}`: edit this checkpoint of the thread; an older one forks it.
    #[serde(default)]
    checkpoint: Option<Value>,
    /// The same, as the Python SDK's `checkpoint_id=` sends it.
    #[serde(default)]
    checkpoint_id: Option<String>,
}

/// `threads.update_state`: the values written as node `as_node`'s writes, through the state's
/// reducers, the thread then going on from that node's edges (LangGraph's
/// `update_state(values, as_node)`); without `as_node`, the values replace the keys' values.
/// With a `checkpoint_id` (or `checkpoint`) older than the latest, the edit forks the thread
/// there, as a run from that checkpoint does. Answers the new checkpoint.
pub(super) async fn update_state(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    JsonBody(req): JsonBody<StateUpdate>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    let at = match (req.checkpoint_id, &req.checkpoint) {
        (Some(id), _) => Some(id),
        (None, None | Some(Value::Null)) => None,
        (None, Some(c)) => match c.get("checkpoint_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some(id.clone()),
            Some(other) => {
                return Err(ApiError::invalid(format!(
                    "checkpoint.checkpoint_id is a checkpoint's id, not {other}"
                )));
            }
        },
    };
    let values: Vec<(String, Value)> = match req.values {
        Some(Value::Object(m)) => m.into_iter().collect(),
        None | Some(Value::Null) => Vec::new(),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`values` is an object of state keys, not {other}"
            )));
        }
    };
    let thread = app.store.get_thread(&id)?.ok_or_else(|| no_thread(&id))?;
    let graph = app.graphs.of_workflow(&thread.workflow).ok_or_else(|| {
        ApiError::conflict(format!(
            "the workflow of thread {id} ({}) is not served",
            thread.workflow
        ))
    })?;
    let services = app.settings.services(&graph.plan)?;
    let engine = crate::engine::Engine::new(
        graph.plan.clone(),
        app.store.clone(),
        services,
        crate::engine::events::Events::none(),
    )
    .with_options(crate::engine::RunOptions {
        lease: app.settings.overrides.lease.clone(),
        ..crate::engine::RunOptions::default()
    });
    let cp = engine
        .update_state_at(&id, values, req.as_node.as_deref(), at.as_deref())
        .await
        .map_err(super::http::refused)?;
    Ok(Json(json!({
        "checkpoint": {"thread_id": id, "checkpoint_ns": "", "checkpoint_id": cp.checkpoint_id, "checkpoint_map": null},
        "configurable": {"thread_id": id, "checkpoint_ns": "", "checkpoint_id": cp.checkpoint_id},
    })))
}

/// `POST /threads/{id}/copy`: the thread copied whole (its checkpoints, values and records)
/// as a new thread with the same metadata.
pub(super) async fn copy(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    if !exists(&app, &id)? {
        return Err(no_thread(&id));
    }
    let new = crate::checkpoint::new_id();
    if app.store.get_thread(&id)?.is_some() {
        // Written under the new thread's lease, as every write to a thread is.
        let lease = app.store.acquire_lease(&crate::checkpoint::LeaseClaim {
            thread_id: new.clone(),
            ..crate::engine::own_claim(app.settings.lease_ttl.value)
        })?;
        let copied = app.store.copy_thread(&id, &new, Some(&lease.fence()));
        let _ = app.store.release_lease(&lease.fence());
        copied?;
    }
    let source = app.store.get_thread_meta(&id)?;
    let mut metadata = source.as_ref().map(metadata_of).unwrap_or_default();
    // The copy is its maker's.
    caller.stamp(&mut metadata);
    let mut meta = new_meta(&new, metadata);
    // The copy lives as long as its original would: its time to live, started now.
    meta.ttl = match source.and_then(|m| m.ttl) {
        Some(ttl) => Some(ttl.restarted(crate::clock::now_ms())),
        None => app.ttls.default_minutes.map(super::ttl::starting),
    };
    app.store.put_thread_meta(&meta)?;
    Ok(Json(thread_json(&app, &new)?.ok_or_else(|| no_thread(&new))?))
}

#[derive(Deserialize)]
pub(super) struct Patch {
    #[serde(default)]
    metadata: Map<String, Value>,
    /// A new time to live (see [`Create`]).
    ttl: Option<Value>,
}

/// Merges metadata into the thread's.
pub(super) async fn patch(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    JsonBody(mut p): JsonBody<Patch>,
) -> Result<Json<Value>, ApiError> {
    owner::thread(&app, &caller, &id)?;
    // Only an admin gives a thread to someone else.
    if caller.restricted() {
        p.metadata.remove("owner");
    }
    if !exists(&app, &id)? {
        return Err(no_thread(&id));
    }
    // A thread from before this server starts its API metadata from what it records.
    let current = thread_json(&app, &id)?.ok_or_else(|| no_thread(&id))?;
    let mut meta = app.store.get_thread_meta(&id)?.unwrap_or_else(|| ThreadMeta {
        thread_id: id.clone(),
        created_at: current["created_at"].as_str().unwrap_or_default().to_string(),
        updated_at: String::new(),
        metadata: current["metadata"].clone(),
        ttl: None,
    });
    let mut metadata = metadata_of(&meta);
    metadata.extend(p.metadata);
    meta.metadata = Value::Object(metadata);
    meta.updated_at = crate::clock::now();
    // A new time to live replaces the old; an update is a use of the thread, which starts the
    // one it has again.
    meta.ttl = match super::ttl::parse(p.ttl.as_ref())? {
        Some(minutes) => Some(super::ttl::starting(minutes)),
        None => meta.ttl.map(|t| t.restarted(crate::clock::now_ms())),
    };
    app.store.put_thread_meta(&meta)?;
    Ok(Json(thread_json(&app, &id)?.ok_or_else(|| no_thread(&id))?))
}
