//! Runs: on a thread or stateless (a thread of its own, deleted when the run ends), streamed as
//! server-sent events or waited for. The handlers read the request, hand it to the run manager
//! ([`super::manager`]) and answer: the response starts only once the run holds the thread, so
//! a thread another run holds is a 409 before any byte of a stream.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Json, Response};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::Shared;
use super::auth::{Caller, owner};
use super::graphs::Graph;
use super::http::{ApiError, JsonBody};
use super::hub::{self, CancelOnDrop};
use super::manager::{self, CreateRun, Stopper};
use super::sse::Modes;
use super::translate::{RunInfo, Translate};
use crate::checkpoint::{RunRow, RunStatus};
use crate::engine::events::{Envelope, Receiver};
use crate::engine::{Engine, EngineError, RunOutcome, Status};

/// A stored run as the API shows it.
pub(super) fn run_json(row: &RunRow) -> Value {
    json!({
        "run_id": row.run_id, "thread_id": row.thread_id, "assistant_id": row.assistant_id,
        "created_at": row.created_at, "updated_at": row.updated_at, "status": row.status.as_str(),
        "metadata": row.metadata, "kwargs": shown_kwargs(row), "multitask_strategy": row.multitask_strategy,
        "langsmith_session_name": null,
    })
}

/// What a run was asked to do, as the reference shows a run's `kwargs`: every field named,
/// with its default where the request had none, and the configuration the run ran with. (The
/// row keeps the request as sent: a run resumed after a restart is made from it again.)
fn shown_kwargs(row: &RunRow) -> Value {
    let k = &row.kwargs;
    let field = |name: &str| k.get(name).cloned().unwrap_or(Value::Null);
    let stream_mode = match k.get("stream_mode") {
        None | Some(Value::Null) => json!(["values"]),
        Some(Value::String(one)) => json!([one]),
        Some(many) => many.clone(),
    };
    let mut configurable = k
        .get("config")
        .and_then(|c| c.get("configurable"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    // The user the run is for, as LangGraph's auth names them; "" on a server without users.
    let user = json!(crate::checkpoint::runs::owner_of(&row.metadata).unwrap_or_default());
    for (name, value) in [
        ("run_id", json!(row.run_id)),
        ("thread_id", json!(row.thread_id)),
        ("assistant_id", json!(row.assistant_id)),
        ("graph_id", row.metadata.get("graph_id").cloned().unwrap_or(Value::Null)),
        ("user_id", user.clone()),
        ("langgraph_auth_user_id", user),
        ("langgraph_auth_user", Value::Null),
        ("langgraph_auth_permissions", json!([])),
    ] {
        configurable.insert(name.into(), value);
    }
    let checkpoint = k
        .get("checkpoint_id")
        .cloned()
        .or_else(|| k.get("checkpoint").and_then(|c| c.get("checkpoint_id")).cloned());
    if let Some(id) = checkpoint.filter(|c| !c.is_null()) {
        configurable.insert("checkpoint_id".into(), id);
    }
    let mut config = k.get("config").and_then(Value::as_object).cloned().unwrap_or_default();
    config.insert("configurable".into(), Value::Object(configurable));
    let mut metadata = row.metadata.clone();
    // A run that has started is on its first attempt (runner never retries a whole run).
    if row.status != RunStatus::Pending
        && let Value::Object(m) = &mut metadata
    {
        m.insert("run_attempt".into(), json!(1));
    }
    config.insert("metadata".into(), metadata);
    let stateless = k.get("stateless") == Some(&Value::Bool(true));
    json!({
        "input": field("input"),
        "command": field("command"),
        "config": config,
        "context": k.get("context").filter(|c| !c.is_null()).cloned().unwrap_or_else(|| json!({})),
        "stream_mode": stream_mode,
        "interrupt_before": field("interrupt_before"),
        "interrupt_after": field("interrupt_after"),
        "webhook": field("webhook"),
        "feedback_keys": field("feedback_keys"),
        "temporary": stateless && k.get("on_completion").and_then(Value::as_str) != Some("keep"),
        "subgraphs": k.get("stream_subgraphs").and_then(Value::as_bool).unwrap_or(false),
        "resumable": k.get("stream_resumable").and_then(Value::as_bool).unwrap_or(false),
        "checkpoint_during": true,
        "durability": k.get("durability").filter(|d| !d.is_null()).cloned().unwrap_or_else(|| json!("sync")),
    })
}

/// A run in line (see [`manager::Queued`]), with the stream modes its readers get.
pub(super) struct Queued {
    run: manager::Queued,
    modes: Modes,
}

impl Queued {
    /// Its row as created.
    pub(super) fn row(&self) -> &RunRow {
        &self.run.row
    }

    /// Waits until the run holds its thread: the run as started, or why it could not start.
    pub(super) async fn started(self, app: &Shared) -> Result<Started, ApiError> {
        let r = app.runs.started(self.run).await?;
        let info = run_info(&r.row, &r.graph, r.new_input);
        Ok(Started {
            run_id: r.run_id,
            thread_id: r.thread_id,
            graph: r.graph,
            resumable: r.resumable,
            // On a shared database every reader rebuilds a run's frames from its whole log, so
            // ids count from the log's start, the same on every process.
            first_event_id: if app.runs.is_shared() { 0 } else { r.row.event_ids },
            stateless: r.stateless,
            first: r.first,
            events: r.events,
            done: r.done,
            stopper: r.stopper,
            release: r.release,
            modes: self.modes,
            cancel_on_disconnect: r.cancel_on_disconnect,
            info,
        })
    }
}

/// A run that holds its thread: the events it sends, and its end.
pub(super) struct Started {
    pub run_id: String,
    pub thread_id: String,
    pub graph: Arc<Graph>,
    /// Its frames carry ids and stay for readers that rejoin.
    pub resumable: bool,
    /// The ids its stream reserved before (a resumed run's): its frames are numbered after them.
    pub first_event_id: u64,
    /// A run without a thread of the client's: it runs on a thread of its own.
    stateless: bool,
    pub first: Envelope,
    pub events: Receiver,
    pub done: oneshot::Receiver<Result<RunOutcome, EngineError>>,
    stopper: Stopper,
    /// Dropped once the stream or the wait is done reading the run's thread: a thread of the
    /// run's own is deleted then.
    pub release: oneshot::Sender<()>,
    pub modes: Modes,
    cancel_on_disconnect: bool,
    /// What its stream says of it.
    pub info: RunInfo,
}

impl Started {
    /// What cancels the run when the stream that reads it is dropped before its end (unless
    /// the request said `on_disconnect: continue`).
    pub(super) fn cancel_guard(&self) -> CancelOnDrop {
        CancelOnDrop {
            stopper: self.stopper.clone(),
            armed: self.cancel_on_disconnect,
        }
    }

    /// The `Location` (the run's stream) and `Content-Location` (the run) of its answer.
    pub(super) fn locations(&self) -> [(header::HeaderName, String); 2] {
        if self.stateless {
            [
                (header::LOCATION, format!("/runs/{}/stream", self.run_id)),
                (header::CONTENT_LOCATION, format!("/runs/{}", self.run_id)),
            ]
        } else {
            [
                (
                    header::LOCATION,
                    format!("/threads/{}/runs/{}/stream", self.thread_id, self.run_id),
                ),
                (
                    header::CONTENT_LOCATION,
                    format!("/threads/{}/runs/{}", self.thread_id, self.run_id),
                ),
            ]
        }
    }
}

/// On a database many processes share: a reader of run `run_id` of `thread_id` when this
/// process has none (another process created it, and a worker executes it), so that a client
/// joining its stream here reads it from its log. Nothing when the run is unknown.
pub(super) async fn follow(app: &Shared, thread_id: &str, run_id: &str) -> Result<(), ApiError> {
    if !app.runs.is_shared() || app.runs.live(thread_id, run_id).is_some() {
        return Ok(());
    }
    let Some(row) = app.store.get_run(run_id)?.filter(|r| r.thread_id == thread_id) else {
        return Ok(());
    };
    let create = CreateRun::resumed(&app.graphs, row.clone())?;
    let modes = Modes::parse(create.stream_mode.as_ref(), create.stream_subgraphs).map_err(ApiError::invalid)?;
    let run = app.runs.follow(row, create.graph);
    // A run that ended before it started has nothing to join.
    if let Ok(started) = (Queued { run, modes }).started(app).await {
        super::hub::feed(app, started);
    }
    Ok(())
}

/// Hands the run `create` to the run manager: answered once it is in line.
pub(super) async fn queue(app: &Shared, create: CreateRun) -> Result<Queued, ApiError> {
    let modes = Modes::parse(create.stream_mode.as_ref(), create.stream_subgraphs).map_err(ApiError::invalid)?;
    let run = app.runs.start(create).await?;
    Ok(Queued { run, modes })
}

/// The run `kwargs` asks `caller`'s run to be on `thread` (none: a thread of its own), in
/// line: every run a client creates comes here, so that another user's thread is a 404, the
/// run is its caller's and their quota counts it.
pub(super) async fn create(
    app: &Shared,
    caller: &Caller,
    thread: Option<String>,
    kwargs: Value,
) -> Result<Queued, ApiError> {
    let mut create = CreateRun::parse(&app.graphs, thread, kwargs)?;
    owner::run(app, caller, &mut create)?;
    queue(app, create).await
}

/// Starts `caller`'s run of the request `kwargs` on `thread` (none: a thread of its own) and
/// waits until it holds the thread.
pub(super) async fn start(
    app: &Shared,
    caller: &Caller,
    thread: Option<String>,
    kwargs: Value,
) -> Result<Started, ApiError> {
    create(app, caller, thread, kwargs).await?.started(app).await
}

/// What the stream of the run `row` of `graph` says of it.
fn run_info(row: &RunRow, graph: &Graph, new_input: bool) -> RunInfo {
    let configurable = row
        .kwargs
        .get("config")
        .and_then(|c| c.get("configurable"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    RunInfo {
        run_id: row.run_id.clone(),
        thread_id: row.thread_id.clone(),
        graph_id: graph.graph_id.clone(),
        assistant_id: graph.assistant_id.clone(),
        metadata: manager::checkpoint_metadata(row),
        configurable,
        new_input,
        input: run_input(&row.kwargs),
    }
}

/// What a run was given, as its `events` stream's first chain says: its input, or its command
/// as LangGraph's `Command`.
fn run_input(kwargs: &Value) -> Value {
    match kwargs.get("command").filter(|c| c.is_object()) {
        Some(c) => json!({
            "graph": null,
            "update": c.get("update").cloned().unwrap_or(Value::Null),
            "resume": c.get("resume").cloned().unwrap_or(Value::Null),
            "goto": c.get("goto").cloned().unwrap_or(Value::Null),
        }),
        None => kwargs.get("input").cloned().unwrap_or(Value::Null),
    }
}

fn stream_response(app: Shared, s: Started) -> Response {
    let locations = s.locations();
    let guard = s.cancel_guard();
    let hub = hub::feed(&app, s);
    hub::response(hub, 0, Some(guard), locations)
}

/// Runs to the end and answers the final values: with `__interrupt__` when the run stopped at
/// a gate, `__error__` when it failed.
async fn wait_response(app: Shared, s: Started) -> Result<Response, ApiError> {
    let mut translate = Translate::new(s.modes, &app, s.info.clone(), s.graph.plan.clone());
    translate.on(s.first);
    let mut events = s.events;
    while let Some(envelope) = events.recv().await {
        translate.on(envelope);
    }
    let outcome = s
        .done
        .await
        .unwrap_or_else(|_| Err(EngineError::Input("the run's task ended without an outcome".into())));
    let mut values = match app.store.get_checkpoint(&s.thread_id, None)? {
        Some(cp) => {
            let (values, _) = Engine::pending_state(s.graph.plan.clone(), app.store.clone(), &cp)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            super::messages::written_state(values, &cp, &s.graph.plan)
        }
        None => translate.values(),
    };
    match &outcome {
        Ok(o) if o.status == Status::Interrupted => {
            values.insert("__interrupt__".into(), Value::Array(translate.interrupts.clone()));
        }
        Ok(o) if o.status == Status::Failed => {
            if let Some((_, error)) = translate.finish(&outcome).into_iter().next() {
                values = Map::from_iter([("__error__".to_string(), error)]);
            }
        }
        Err(_) => {
            if let Some((_, error)) = translate.finish(&outcome).into_iter().next() {
                values = Map::from_iter([("__error__".to_string(), error)]);
            }
        }
        Ok(_) => {}
    }
    drop(s.release);
    let (location, content_location) = if s.stateless {
        (format!("/runs/{}/join", s.run_id), format!("/runs/{}", s.run_id))
    } else {
        (
            format!("/threads/{}/runs/{}/join", s.thread_id, s.run_id),
            format!("/threads/{}/runs/{}", s.thread_id, s.run_id),
        )
    };
    let mut response = Json(Value::Object(values)).into_response();
    for (name, value) in [
        (header::LOCATION, location),
        (header::CONTENT_LOCATION, content_location),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, v);
        }
    }
    Ok(response)
}

pub(super) async fn stream_on_thread(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let started = start(&app, &caller, Some(id), kwargs).await?;
    Ok(stream_response(app, started))
}

pub(super) async fn stream_stateless(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let started = start(&app, &caller, None, kwargs).await?;
    Ok(stream_response(app, started))
}

pub(super) async fn wait_on_thread(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let started = start(&app, &caller, Some(id), kwargs).await?;
    wait_response(app, started).await
}

pub(super) async fn wait_stateless(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let started = start(&app, &caller, None, kwargs).await?;
    wait_response(app, started).await
}
