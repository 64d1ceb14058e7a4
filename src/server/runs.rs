//! Runs: on a thread or stateless (a thread of its own, deleted when the run ends), streamed as
//! server-sent events or waited for. Every run is built by the run builder and takes the
//! thread's lease in `Engine::run`; the response starts only once the run holds the thread, so
//! a thread another run holds is a 409 before any byte of a stream.
//!
//! Every run is a row in the checkpoint database ([`crate::checkpoint::runs`]), with the request
//! it was created with: a server that stops before a run ends starts it again when it comes back
//! ([`super::control::resume_unfinished`]), and the engine's resume runs no finished task again.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::Shared;
use super::graphs::Graph;
use super::http::{ApiError, JsonBody};
use super::hub::{self, CancelOnDrop, Hub};
use super::sse::Modes;
use super::threads::{exists, lock, new_meta, pending_interrupts};
use super::translate::{RunInfo, Translate};
use crate::checkpoint::{CheckpointError, RunRow, RunStatus};
use crate::engine::events::{Envelope, Events, Receiver};
use crate::engine::{
    EditError, Engine, EngineError, Goto, LeasePolicy, NodeSet, Persist, RunGates, RunOutcome, Status, goto_target,
};
use crate::run::Start;

/// A run this server started: what only a live run has (what is shown of a run is its row).
#[derive(Debug, Clone)]
pub(crate) struct RunRecord {
    pub run_id: String,
    pub thread_id: String,
    /// As stored; kept here too so that a thread's busy status reads no store.
    pub status: RunStatus,
    /// The thread's latest checkpoint when the run was created, with the writes it had then:
    /// what a rollback goes back to (none: the thread had no checkpoint, and a rollback deletes
    /// them all).
    pub rollback_to: Option<(String, Vec<crate::checkpoint::PendingWrite>)>,
    /// What stops it.
    pub stopper: Stopper,
    /// Becomes true once the run's end is recorded.
    pub ended: tokio::sync::watch::Receiver<bool>,
    /// Its frames, while readers may join it.
    pub hub: Option<Arc<Hub>>,
    /// It had a worker: it may have touched its thread (one cancelled in line never did).
    pub had_worker: bool,
}

impl RunRecord {
    pub(super) fn is_active(&self) -> bool {
        self.status.is_active()
    }

    /// Stops the run gracefully: a running one at its next step boundary (its running tasks
    /// finish and are stored), a pending one at once.
    pub(super) fn stop(&self) {
        self.stopper.stop();
    }

    /// Cancels the run (the API's cancel): a running one at once, its running tasks dropped
    /// where they are; a pending one before it starts.
    pub(super) fn cancel(&self) {
        self.stopper.cancel();
    }
}

/// What stops a run: the engine's cancel flag (at the next step boundary), its abort (at
/// once), and what wakes it while it waits for a worker.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stopper {
    flag: Arc<AtomicBool>,
    abort: crate::engine::Abort,
    wake: Arc<tokio::sync::Notify>,
}

impl Stopper {
    fn of(engine: &Engine) -> Stopper {
        Stopper {
            flag: engine.cancel_flag(),
            abort: engine.abort_handle(),
            wake: Arc::default(),
        }
    }

    /// At the next step boundary.
    pub(crate) fn stop(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::SeqCst);
        // Kept until the run looks, if it is not waiting yet.
        self.wake.notify_one();
    }

    /// At once.
    pub(crate) fn cancel(&self) {
        self.abort.abort();
        self.stop();
    }

    fn stopped(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }
}

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
    for (name, value) in [
        ("run_id", json!(row.run_id)),
        ("thread_id", json!(row.thread_id)),
        ("assistant_id", json!(row.assistant_id)),
        ("graph_id", row.metadata.get("graph_id").cloned().unwrap_or(Value::Null)),
        ("user_id", json!("")),
        ("langgraph_auth_user_id", json!("")),
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

/// `command` of a run: LangGraph's `Command`: `update` (written through the reducers) and
/// `goto` (what runs next) are applied to the thread first, then `resume` answers its gate.
#[derive(Deserialize, Default)]
struct Command {
    resume: Option<Value>,
    update: Option<Value>,
    goto: Option<Value>,
}

/// A run request (`RunCreateStateful` / `RunCreateStateless`): the fields runner reads; others
/// are ignored as the reference ignores unknown ones.
#[derive(Deserialize)]
pub(super) struct RunCreate {
    assistant_id: String,
    input: Option<Value>,
    command: Option<Command>,
    stream_mode: Option<Value>,
    #[serde(default)]
    stream_subgraphs: bool,
    #[serde(default)]
    stream_resumable: bool,
    #[serde(default)]
    metadata: Map<String, Value>,
    config: Option<Value>,
    context: Option<Value>,
    multitask_strategy: Option<String>,
    if_not_exists: Option<String>,
    pub on_disconnect: Option<String>,
    on_completion: Option<String>,
    interrupt_before: Option<Value>,
    interrupt_after: Option<Value>,
    durability: Option<String>,
    /// `{checkpoint_id, …}`: run from this checkpoint of the thread; an older one forks it.
    checkpoint: Option<Value>,
    /// The same, as the Python SDK's `checkpoint_id=` sends it.
    checkpoint_id: Option<String>,
}

/// A run whose row is written and whose task waits for a worker, or runs: what its starter reads
/// of it until it holds its thread ([`Queued::started`]).
pub(super) struct Queued {
    pub run_id: String,
    pub thread_id: String,
    graph: Arc<Graph>,
    resumable: bool,
    first_event_id: u64,
    stateless: bool,
    events: Receiver,
    done: oneshot::Receiver<Result<RunOutcome, EngineError>>,
    stopper: Stopper,
    release: oneshot::Sender<()>,
    modes: Modes,
    cancel_on_disconnect: bool,
    info: RunInfo,
}

/// Stops a run whose client went away while it waited for the run to start, unless disarmed
/// (the run started) or the client said `on_disconnect: continue`.
struct Abandoned {
    stopper: Stopper,
    armed: bool,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if self.armed {
            self.stopper.cancel();
        }
    }
}

impl Queued {
    /// Waits until the run holds its thread (it sends `run_start` then): the run as started, or
    /// why it could not start.
    pub(super) async fn started(self, app: &Shared) -> Result<Started, ApiError> {
        let Queued {
            run_id,
            thread_id,
            graph,
            resumable,
            first_event_id,
            stateless,
            mut events,
            mut done,
            stopper,
            release,
            modes,
            cancel_on_disconnect,
            info,
        } = self;
        let mut abandoned = Abandoned {
            stopper: stopper.clone(),
            armed: cancel_on_disconnect,
        };
        let first = tokio::select! {
            biased;
            Some(first) = events.recv() => Some(first),
            outcome = &mut done => match outcome {
                Ok(Err(e)) => return Err(refused(e)),
                _ => None,
            },
        };
        let first = match first {
            Some(f) => f,
            // Its end came first: its events, if it sent any, are still to be read. None: it
            // was cancelled while it waited for a worker.
            None => events
                .recv()
                .await
                .ok_or_else(|| ApiError::conflict(format!("run {run_id} was cancelled before it started")))?,
        };
        // From here on the stream's own guard stops the run if its client goes away.
        abandoned.armed = false;
        set_status(app, &run_id, RunStatus::Running, None);
        Ok(Started {
            run_id,
            thread_id,
            graph,
            resumable,
            first_event_id,
            stateless,
            first,
            events,
            done,
            stopper,
            release,
            modes,
            cancel_on_disconnect,
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

/// Why a run could not start, as the reference answers it.
pub(super) fn refused(e: EngineError) -> ApiError {
    match e {
        EngineError::Busy(_) | EngineError::Store(CheckpointError::Leased(_)) => ApiError::conflict(BUSY),
        EngineError::NoThread(t) => ApiError::not_found(format!("Thread with ID {t} not found")),
        e @ (EngineError::Input(_)
        | EngineError::Incompatible(_)
        | EngineError::NotInterrupted(_)
        | EngineError::BadAnswer(_)
        | EngineError::AlreadyAnswered(_)
        | EngineError::WhichGate { .. }
        | EngineError::NoSuchGate { .. }
        | EngineError::Edit(_)) => ApiError::invalid(e.to_string()),
        e => ApiError::internal(e),
    }
}

/// `interrupt_before` / `interrupt_after` of a request: `"*"` (every node) or node names of the
/// graph.
fn node_set(graph: &Graph, field: &str, value: Option<&Value>) -> Result<NodeSet, ApiError> {
    let names = match value {
        None | Some(Value::Null) => return Ok(NodeSet::None),
        Some(Value::String(all)) if all == "*" => return Ok(NodeSet::All),
        Some(Value::Array(names)) => names,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "{field} is \"*\" or a list of node names, not {other}"
            )));
        }
    };
    let mut set = Vec::new();
    for name in names {
        match name.as_str() {
            Some(n) if graph.plan.node_by_name(n).is_some() => set.push(n.to_string()),
            _ => {
                return Err(ApiError::invalid(format!(
                    "{field}: {name} is not a node of graph {}",
                    graph.graph_id
                )));
            }
        }
    }
    Ok(NodeSet::Named(set))
}

/// An answer, the gate it is for (none: the only one waiting), and the answers to other gates.
type Answered = (Option<String>, Value, Vec<(String, Value)>);

/// The answer and the gate it is for, from `command.resume`: a map from pending interrupt ids
/// to values answers those gates; any other value answers the only gate waiting. A thread with
/// no gate waiting (or no state at all) has nothing to resume: refused before anything runs or
/// is written.
fn answer(
    app: &Shared,
    thread_id: &str,
    head: Option<&crate::checkpoint::Checkpoint>,
    resume: Value,
) -> Result<Answered, ApiError> {
    let pending: Vec<String> = match head {
        Some(cp) => pending_interrupts(cp, &app.store.get_writes(thread_id, &cp.checkpoint_id)?)
            .into_iter()
            .filter_map(|(_, i)| i.get("id").and_then(Value::as_str).map(str::to_string))
            .collect(),
        None => Vec::new(),
    };
    if pending.is_empty() {
        return Err(ApiError::conflict(format!(
            "Thread {thread_id} has no pending interrupt to resume: command.resume answers a thread waiting at a gate"
        )));
    }
    match resume {
        // Several gates of one step answered together: each by its id.
        Value::Object(m) if !m.is_empty() && m.keys().all(|k| pending.contains(k)) => {
            let mut answers = m.into_iter();
            let (id, value) = answers.next().unwrap_or_default();
            Ok((Some(id), value, answers.collect()))
        }
        other => Ok((None, other, Vec::new())),
    }
}

/// A run a server left unfinished, started again from its row.
pub(super) struct Resumed {
    pub row: RunRow,
    /// Whether the run held its thread when the server stopped: it continues the thread rather
    /// than applying its input (or answer) again.
    pub was_running: bool,
}

/// `command.update` and `command.goto` as the thread edit they ask for, if they ask for one.
type Edit = (Vec<(String, Value)>, Option<Vec<Goto>>);

/// `update`: `{key: value}`, or LangGraph's `[[key, value], …]`; `goto`: a node or a `Send`
/// (`{"node": name, "input": argument}`), or a list of them. Each node must be one of `graph`'s
/// (or `END`), and a Send's one of its fan-out targets, whose tasks take the argument as their
/// item.
fn commanded(graph: &Graph, update: Option<Value>, goto: Option<Value>) -> Result<Option<Edit>, ApiError> {
    let bad_update = || ApiError::invalid("command.update is an object, or a list of [key, value] pairs");
    let update: Vec<(String, Value)> = match update {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => m.into_iter().collect(),
        Some(Value::Array(pairs)) => pairs
            .into_iter()
            .map(|p| match p {
                Value::Array(kv) => match <[Value; 2]>::try_from(kv) {
                    Ok([Value::String(k), v]) => Some((k, v)),
                    _ => None,
                },
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(bad_update)?,
        Some(_) => return Err(bad_update()),
    };
    let target = |v: Value| -> Result<Goto, ApiError> {
        let goto = match v {
            Value::String(node) => Goto::Node(node),
            Value::Object(mut send) => match send.remove("node") {
                Some(Value::String(node)) => Goto::Send {
                    node,
                    arg: send.remove("input").unwrap_or(Value::Null),
                },
                _ => {
                    return Err(ApiError::invalid(
                        "command.goto: a Send is {\"node\": name, \"input\": argument}",
                    ));
                }
            },
            other => {
                return Err(ApiError::invalid(format!(
                    "command.goto names a node or a Send ({{\"node\", \"input\"}}), not {other}"
                )));
            }
        };
        match goto_target(&graph.plan, &goto) {
            Ok(_) => Ok(goto),
            Err(EditError::NoSuchNode { node, .. }) => Err(ApiError::invalid(format!(
                "command.goto: `{node}` is not a node of graph {}",
                graph.graph_id
            ))),
            Err(e) => Err(ApiError::invalid(format!("command.goto: {e}"))),
        }
    };
    let goto = match goto {
        None | Some(Value::Null) => None,
        Some(Value::Array(targets)) => Some(targets.into_iter().map(target).collect::<Result<Vec<_>, _>>()?),
        Some(one) => Some(vec![target(one)?]),
    };
    Ok((!update.is_empty() || goto.is_some()).then_some((update, goto)))
}

/// Starts a run of the request `kwargs` on `thread` (none: a thread of its own) and waits until
/// it holds the thread.
pub(super) async fn start(app: &Shared, thread: Option<String>, kwargs: Value) -> Result<Started, ApiError> {
    start_run(app, thread, kwargs, None).await?.started(app).await
}

/// What a stream or a wait for a run answers when the thread already has a run and the request
/// said `multitask_strategy: reject` (or nothing).
const BUSY: &str = "Thread is already running a task. Wait for it to finish or choose a different multitask strategy.";

/// Creates a run of the request `kwargs` on `thread` (none: a thread of its own), or with
/// `resumed` the run of that row again (same id, same thread): its row is written `pending` and
/// its task waits for a worker; answered once it is in line.
pub(super) async fn start_run(
    app: &Shared,
    thread: Option<String>,
    kwargs: Value,
    resumed: Option<Resumed>,
) -> Result<Queued, ApiError> {
    let req: RunCreate =
        serde_json::from_value(kwargs.clone()).map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))?;
    let graph: Arc<Graph> = find_assistant(app, &req.assistant_id)?;
    let modes = Modes::parse(req.stream_mode.as_ref(), req.stream_subgraphs).map_err(ApiError::invalid)?;
    // `enqueue` (the reference's default): the run waits for the thread's lease (the runs
    // before it end first). `reject`: a thread with a run is a 409. `interrupt` / `rollback`:
    // the thread's running runs are cancelled (and rolled back) first.
    let strategy = match req.multitask_strategy.as_deref() {
        None | Some("enqueue") => "enqueue",
        Some("reject") => "reject",
        Some("interrupt") => "interrupt",
        Some("rollback") => "rollback",
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "multitask_strategy must be `reject`, `enqueue`, `interrupt` or `rollback`, not `{other}`"
            )));
        }
    };
    let persist = match req.durability.as_deref() {
        None => None,
        Some("sync") => Some(Persist::Sync),
        Some("async") => Some(Persist::Async),
        Some("exit") => Some(Persist::Exit),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "durability must be `sync`, `async` or `exit`, not `{other}`"
            )));
        }
    };
    let command = req.command.unwrap_or_default();
    let edit = commanded(&graph, command.update, command.goto)?;
    let gates = RunGates {
        before: node_set(&graph, "interrupt_before", req.interrupt_before.as_ref())?,
        after: node_set(&graph, "interrupt_after", req.interrupt_after.as_ref())?,
    };
    let (run_config, run_context) = configured(&graph, req.config.as_ref(), req.context.as_ref())?;
    // A stateless run records so in its row, so that a resumed one still deletes its thread.
    let stateless = thread.is_none() || kwargs.get("stateless") == Some(&Value::Bool(true));
    let temporary = stateless && req.on_completion.as_deref() != Some("keep");
    let thread_id = thread.clone().unwrap_or_else(crate::checkpoint::new_id);
    if matches!(strategy, "interrupt" | "rollback") {
        super::control::stop_runs_of(app, &thread_id, strategy == "rollback").await?;
    }
    // From here until the run is among the server's runs, one admission at a time: of two
    // runs asking for an idle thread with `reject`, one is refused; a thread being deleted
    // takes no run.
    let admitting = lock(&app.deleting);
    let known = match &thread {
        Some(_) if admitting.contains(&thread_id) => false,
        Some(t) => resumed.is_some() || exists(app, t)?,
        None => true,
    };
    if !known && (admitting.contains(&thread_id) || req.if_not_exists.as_deref() != Some("create")) {
        return Err(ApiError::not_found("Thread or assistant not found."));
    }
    // A run on the thread, running or waiting for a worker, holds it for the runs after it.
    if strategy == "reject"
        && resumed.is_none()
        && lock(&app.runs)
            .values()
            .any(|r| r.thread_id == thread_id && r.is_active())
    {
        return Err(ApiError::conflict(BUSY));
    }
    let overrides = &app.settings.overrides;
    let workflow = graph.path.display().to_string();
    let was_running = resumed.as_ref().is_some_and(|r| r.was_running);
    let is_resumed = resumed.is_some();
    // A resumed run that held its thread had applied its command.
    let edit = edit.filter(|_| !was_running);
    let head = app.store.get_checkpoint(&thread_id, None)?;
    // `checkpoint` names where the run goes on from: the head is no fork (agent-chat-ui always
    // sends the head it last saw).
    let checkpoint_id = req
        .checkpoint_id
        .or_else(|| {
            req.checkpoint
                .as_ref()
                .and_then(|c| c.get("checkpoint_id"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .filter(|id| head.as_ref().is_none_or(|h| h.checkpoint_id != *id))
        .filter(|_| !was_running);
    if edit.is_some() {
        if head.is_none() {
            return Err(ApiError::invalid(
                "command.update and command.goto apply to a thread's state: the thread has none yet",
            ));
        }
        if checkpoint_id.is_some() {
            return Err(ApiError::invalid(
                "command.update and command.goto apply at the thread's latest checkpoint, not an older one",
            ));
        }
    }
    // A workflow that declares no input takes none: what a client sends anyway (agent-chat-ui
    // sends its messages to every graph) is ignored, as LangGraph ignores keys it has no
    // channel for.
    let input = req.input.filter(|i| !i.is_null()).map(|i| {
        if graph.plan.input_schema().is_some() {
            i
        } else {
            json!({})
        }
    });
    let new_input = input.is_some() && command.resume.is_none() && edit.is_none() && !was_running;
    let mut request = match command.resume {
        // A resumed run that held its thread had taken its answer: the thread goes on.
        _ if was_running => overrides.answer(thread_id.clone(), workflow, None, None),
        Some(resume) => {
            let (to, value, more) = answer(app, &thread_id, head.as_ref(), resume)?;
            let mut request = overrides.answer(thread_id.clone(), workflow, Some(value), to);
            request.more_answers = more;
            request
        }
        // The command's edit, then the thread goes on from it.
        None if edit.is_some() => overrides.answer(thread_id.clone(), workflow, None, None),
        None => overrides.start(Start {
            thread_id: Some(thread_id.clone()),
            workflow,
            input_given: input.is_some(),
            input: input.clone().unwrap_or_else(|| json!({})),
            context: run_context.clone().unwrap_or_else(|| json!({})),
            config: run_config.clone(),
        }),
    };
    if let LeasePolicy::Take { wait, .. } = &mut request.lease {
        // A run waits for the runs before it to let go of the thread, unless it was told to be
        // refused then; a resumed run waits out the lease of the server that was killed (on
        // another host, or a process id taken again).
        *wait = strategy != "reject" || is_resumed;
    }
    if let Some(persist) = persist {
        request.persist = persist;
    }
    request.gates = gates;
    request.checkpoint_id = checkpoint_id;
    // New input on a thread that waits (at a gate) starts the new turn: LangGraph's server
    // drops what waited.
    request.discard_pending = true;
    request.run_config = overrides.run_config(graph.plan.config(), run_config);
    request.run_context = run_context;
    if let Some(limit) = req
        .config
        .as_ref()
        .and_then(|c| c.get("recursion_limit"))
        .and_then(Value::as_u64)
    {
        request.recursion_limit = Some(u32::try_from(limit).unwrap_or(u32::MAX));
    }
    let mut services = app.settings.services(&graph.plan)?;
    // One data store for the server: what the store endpoints write, runs read.
    services.data = app.data.clone();
    // From here on the run starts, and its end (or refusal) releases a thread of its own.
    let mut meta = app
        .store
        .get_thread_meta(&thread_id)?
        .unwrap_or_else(|| new_meta(&thread_id, Map::new()));
    let thread_metadata = meta.metadata.as_object().cloned().unwrap_or_default();
    if let Value::Object(m) = &mut meta.metadata {
        m.insert("graph_id".into(), json!(graph.graph_id));
        m.insert("assistant_id".into(), json!(graph.assistant_id));
    }
    meta.updated_at = crate::clock::now();
    app.store.put_thread_meta(&meta)?;
    let rollback_to = match &head {
        Some(cp) => {
            let writes = app.store.get_writes(&thread_id, &cp.checkpoint_id)?;
            Some((cp.checkpoint_id.clone(), writes))
        }
        None => None,
    };
    let now = crate::clock::now();
    let row = match resumed {
        Some(r) => r.row,
        None => {
            let mut kwargs = kwargs;
            if stateless && let Value::Object(k) = &mut kwargs {
                k.insert("stateless".into(), Value::Bool(true));
            }
            // The run's metadata: its assistant's (graph and id), then the client's.
            let mut metadata = Map::from_iter([
                ("created_by".to_string(), json!("system")),
                ("graph_id".into(), json!(graph.graph_id)),
                ("assistant_id".into(), json!(graph.assistant_id)),
            ]);
            metadata.extend(req.metadata);
            RunRow {
                run_id: uuid::Uuid::now_v7().to_string(),
                thread_id: thread_id.clone(),
                assistant_id: graph.assistant_id.clone(),
                status: RunStatus::Pending,
                created_at: now.clone(),
                updated_at: now,
                kwargs,
                multitask_strategy: strategy.to_string(),
                metadata: Value::Object(metadata),
                error: None,
                event_ids: 0,
            }
        }
    };
    app.store.put_run(&row)?;
    let run_id = row.run_id.clone();
    let info = run_info(&row, &graph, new_input);
    // What each checkpoint the run makes keeps of it, as LangGraph's checkpoint metadata: the
    // thread's metadata as the run found it, then the run's own.
    let mut stamped = thread_metadata;
    stamped.extend(info.metadata.clone());
    stamped.insert("user_id".into(), json!(""));
    stamped.insert("langgraph_auth_user_id".into(), json!(""));
    request.metadata = Some(stamped);
    let (events, rx) = Events::channel();
    let engine = Engine::new(graph.plan.clone(), app.store.clone(), services, events);
    let stopper = Stopper::of(&engine);
    let (ended_tx, ended_rx) = tokio::sync::watch::channel(false);
    {
        let mut runs = lock(&app.runs);
        prune(&mut runs, KEPT_RUNS);
        runs.insert(
            run_id.clone(),
            RunRecord {
                run_id: run_id.clone(),
                thread_id: thread_id.clone(),
                status: RunStatus::Pending,
                stopper: stopper.clone(),
                ended: ended_rx,
                hub: None,
                rollback_to,
                had_worker: false,
            },
        );
    }
    drop(admitting);
    // In line as the row is written: runs get workers in the order they were created.
    let turn = app.workers.enter();
    let (tx, done) = oneshot::channel();
    let (release, released) = oneshot::channel::<()>();
    let ended = Ended {
        app: app.clone(),
        thread_id: thread_id.clone(),
        temporary,
    };
    let ended_run = run_id.clone();
    // The run's span is a child of the request's that started it (none for a run resumed at
    // start): one trace from the HTTP request down to the model calls. A spawned task does
    // not inherit the current span by itself.
    let parent = tracing::Span::current();
    let request_thread = thread_id.clone();
    let woken = stopper.wake.clone();
    // Boxed: the task holds what it was given for as long as it lives.
    let request = Box::new(request);
    tokio::spawn(
        async move {
            let worker = tokio::select! {
                biased;
                worker = turn.worker() => Some(worker),
                () = woken.notified() => None,
            };
            if worker.is_some()
                && let Some(r) = lock(&ended.app.runs).get_mut(&ended_run)
            {
                r.had_worker = true;
            }
            let outcome = match worker {
                // Cancelled while it waited: it ends without having run (or touched its thread).
                None => Ok(never_started(&request_thread)),
                Some(_worker) => match edit {
                    Some((update, goto)) => {
                        // The command's checkpoint is the run's: it keeps the run's metadata.
                        let commanding = engine.clone().with_options(crate::engine::RunOptions {
                            lease: request.lease.clone(),
                            metadata: request.metadata.clone().map(Arc::new),
                            ..Default::default()
                        });
                        match commanding.command(&request_thread, update, goto).await {
                            Ok(_) => engine.run(*request).await,
                            Err(e) => Err(e),
                        }
                    }
                    None => engine.run(*request).await,
                },
            };
            // The engine (and with it every sender of its events) is gone before its end is told.
            drop(engine);
            let error = match &outcome {
                Ok(o) if o.status == Status::Failed => Some(super::translate::failure(o)),
                // Cancelled: the thread waits where the run stopped, and says why.
                Ok(o) if o.status == Status::Cancelled => Some(json!({
                    "error": "UserInterrupt",
                    "message": "interrupt requested via POST /threads/{thread_id}/runs/{run_id}/cancel",
                })),
                Err(e) => Some(json!({"error": "EngineError", "message": e.to_string()})),
                Ok(_) => None,
            };
            // Recorded whether or not a client still listens, and before a stream closes: a
            // client that finds the stream closed asks the run's status to know whether to
            // reconnect.
            set_status(&ended.app, &ended_run, run_status(&outcome), error);
            ended.app.metrics.run_ended(run_status(&outcome).as_str());
            // Nobody waiting for the run's end is no failure.
            let _ = ended_tx.send(true);
            let _ = tx.send(outcome);
            let _ = released.await;
            ended.release();
        }
        .instrument(parent),
    );
    Ok(Queued {
        // A resumed run's stream may be rejoined: its client lost it with the server.
        resumable: req.stream_resumable || is_resumed,
        first_event_id: row.event_ids,
        graph,
        run_id,
        thread_id,
        stateless,
        events: rx,
        done,
        stopper,
        release,
        modes,
        cancel_on_disconnect: req.on_disconnect.as_deref() != Some("continue"),
        info,
    })
}

/// What the stream of the run `row` of `graph` says of it.
fn run_info(row: &RunRow, graph: &Graph, new_input: bool) -> RunInfo {
    let mut metadata = row.metadata.as_object().cloned().unwrap_or_default();
    // A run from a given checkpoint says which, as LangGraph's run configuration does.
    let checkpoint = row.kwargs.get("checkpoint_id").cloned().or_else(|| {
        row.kwargs
            .get("checkpoint")
            .and_then(|c| c.get("checkpoint_id"))
            .cloned()
    });
    if let Some(id) = checkpoint.filter(|c| !c.is_null()) {
        metadata.insert("checkpoint_id".into(), id);
    }
    metadata.insert("run_attempt".into(), json!(1));
    metadata.insert("run_id".into(), json!(row.run_id));
    metadata.insert("thread_id".into(), json!(row.thread_id));
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
        metadata,
        configurable,
        new_input,
    }
}

/// The graph a run's `assistant_id` names: a graph's name or its assistant's id. A name no
/// graph has is refused as the reference refuses it (422); an unknown id is not found.
fn find_assistant(app: &Shared, id: &str) -> Result<Arc<Graph>, ApiError> {
    if let Some(graph) = app.graphs.find(id) {
        return Ok(graph);
    }
    if uuid::Uuid::parse_str(id).is_ok() {
        return Err(ApiError::not_found("Thread or assistant not found."));
    }
    let mut names = app.graphs.ids();
    names.sort();
    Err(ApiError::invalid(format!(
        "Invalid assistant: '{id}'. Must be either:\n- A valid assistant UUID, or\n- One of the registered graphs: {}",
        names.join(", ")
    )))
}

/// A run's `config.configurable` and `context` as the workflow reads them: each configurable
/// value whose name is a key of the workflow's `config` overrides it for the run (as `--set`
/// does); `context` (or, where the workflow's context schema declares them, configurable
/// values such as `user_id`) is the run's context. Other configurable values are LangGraph's
/// own or the client's, and are ignored, as LangGraph ignores what no node reads.
type Configured = (Vec<(String, Value)>, Option<Value>);

fn configured(graph: &Graph, config: Option<&Value>, context: Option<&Value>) -> Result<Configured, ApiError> {
    let configurable = match config.map(|c| c.get("configurable")) {
        None | Some(None) | Some(Some(Value::Null)) => Map::new(),
        Some(Some(Value::Object(m))) => m.clone(),
        Some(Some(other)) => {
            return Err(ApiError::invalid(format!(
                "config.configurable is an object, not {other}"
            )));
        }
    };
    let known = graph.plan.config().as_object().cloned().unwrap_or_default();
    let overrides: Vec<(String, Value)> = configurable
        .iter()
        .filter(|(k, _)| known.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let declared: Vec<String> = graph
        .plan
        .context_schema()
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let mut ctx = match context {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(ApiError::invalid(format!("context is an object, not {other}"))),
    };
    for (k, v) in &configurable {
        if declared.contains(k) && !ctx.contains_key(k) {
            ctx.insert(k.clone(), v.clone());
        }
    }
    Ok((overrides, (!ctx.is_empty()).then_some(Value::Object(ctx))))
}

/// The end of a run cancelled before it had a worker.
fn never_started(thread_id: &str) -> RunOutcome {
    RunOutcome {
        thread_id: thread_id.to_string(),
        status: Status::Cancelled,
        output: Value::Null,
        state: Map::new(),
        interrupt: None,
        interrupts: Vec::new(),
        error: None,
        error_class: None,
        steps: 0,
        usage: Default::default(),
        turn_usage: Default::default(),
        unreported_usage: Default::default(),
        handoffs: Vec::new(),
    }
}

/// How many runs a server remembers: past it, the oldest ended ones are forgotten (their rows,
/// threads and checkpoints stay, and every reader of an ended run falls back to its row, as
/// after a restart). An ended run's record is about a kilobyte, more with the frames of a
/// resumable stream: with 10,000, a server under steady load had grown to 29.8 MiB after
/// 12,000 runs and was still growing; with 1,000 it levels off at 20.6 MiB.
const KEPT_RUNS: usize = 1_000;

/// Forgets the oldest ended runs once more than `keep` are remembered, down to nine tenths of
/// `keep`, so that the sort is paid once per tenth of `keep` runs. Runs whose frames readers
/// may still rejoin (resumable streams) are forgotten after those with nothing but a status.
fn prune(runs: &mut std::collections::HashMap<String, RunRecord>, keep: usize) {
    if runs.len() < keep {
        return;
    }
    let mut ended: Vec<(bool, String)> = runs
        .values()
        .filter(|r| !r.is_active())
        .map(|r| (r.hub.is_some(), r.run_id.clone()))
        .collect();
    // Run ids are UUIDv7: in creation order.
    ended.sort();
    let excess = runs.len() - keep * 9 / 10;
    for (_, id) in ended.into_iter().take(excess) {
        runs.remove(&id);
    }
}

/// Records a run's status (and why it failed), in memory and in the store.
fn set_status(app: &Shared, run_id: &str, status: RunStatus, error: Option<Value>) {
    let now = crate::clock::now();
    let (was, cancelled) = {
        let mut runs = lock(&app.runs);
        let Some(r) = runs.get_mut(run_id) else { return };
        // A run that ended before its start was told stays ended.
        if status == RunStatus::Running && r.status != RunStatus::Pending {
            return;
        }
        let cancelled = r.stopper.stopped();
        (std::mem::replace(&mut r.status, status), cancelled)
    };
    // A run the server stopped as it shuts down stays `running` (or `pending`) in the store: the
    // next server on this database continues it. One stopped while it waited for its thread's
    // lease (queued behind another run) ends in an error, but never touched the thread.
    let stopped =
        status == RunStatus::Interrupted || (status == RunStatus::Error && was == RunStatus::Pending && cancelled);
    if stopped && app.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    // A status that could not be stored leaves the run itself unharmed; only a server
    // restarted later would take it for unfinished and continue its thread, which has nothing
    // left to run.
    let _ = app.store.set_run_status(run_id, status, error.as_ref(), &now);
}

/// A run's thread, released when nobody reads the run any more.
struct Ended {
    app: Shared,
    thread_id: String,
    /// A thread of the run's own, deleted with it (unless `on_completion: keep`).
    temporary: bool,
}

impl Ended {
    fn release(self) {
        if self.temporary {
            // A thread nobody can name again: failing to delete it leaves only garbage behind.
            let _ = self.app.store.delete_thread(&self.thread_id);
            let _ = self.app.store.delete_thread_meta(&self.thread_id);
            lock(&self.app.runs).retain(|_, r| r.thread_id != self.thread_id);
        }
    }
}

/// A run's status as LangGraph reports it: a run that stopped at a gate succeeded (its thread
/// is `interrupted`).
fn run_status(outcome: &Result<RunOutcome, EngineError>) -> RunStatus {
    match outcome {
        Ok(o) => match o.status {
            Status::Done | Status::Interrupted => RunStatus::Success,
            Status::Failed => RunStatus::Error,
            Status::Cancelled => RunStatus::Interrupted,
        },
        Err(_) => RunStatus::Error,
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
    UrlPath(id): UrlPath<String>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let started = start(&app, Some(id), kwargs).await?;
    Ok(stream_response(app, started))
}

pub(super) async fn stream_stateless(
    State(app): State<Shared>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let started = start(&app, None, kwargs).await?;
    Ok(stream_response(app, started))
}

pub(super) async fn wait_on_thread(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let started = start(&app, Some(id), kwargs).await?;
    wait_response(app, started).await
}

pub(super) async fn wait_stateless(
    State(app): State<Shared>,
    JsonBody(kwargs): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let started = start(&app, None, kwargs).await?;
    wait_response(app, started).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(run_id: &str, status: RunStatus) -> RunRecord {
        RunRecord {
            run_id: run_id.into(),
            thread_id: "t".into(),
            status,
            stopper: Stopper::default(),
            ended: tokio::sync::watch::channel(false).1,
            hub: None,
            rollback_to: None,
            had_worker: true,
        }
    }

    #[test]
    fn the_oldest_ended_runs_are_forgotten_never_a_running_one() {
        let mut runs: std::collections::HashMap<String, RunRecord> = (0..10)
            .map(|i| {
                let status = if i < 3 { RunStatus::Running } else { RunStatus::Success };
                (format!("r{i}"), record(&format!("r{i}"), status))
            })
            .collect();
        prune(&mut runs, 20);
        assert_eq!(runs.len(), 10, "under the limit nothing is forgotten");
        prune(&mut runs, 10);
        let mut kept: Vec<&str> = runs.keys().map(String::as_str).collect();
        kept.sort();
        // Down to 9: the running r0..r2 stay, the oldest ended one (r3) goes.
        assert_eq!(kept, ["r0", "r1", "r2", "r4", "r5", "r6", "r7", "r8", "r9"]);
    }

    #[test]
    fn ended_runs_with_frames_to_rejoin_are_forgotten_last() {
        let mut runs: std::collections::HashMap<String, RunRecord> = (0..10)
            .map(|i| {
                let mut r = record(&format!("r{i}"), RunStatus::Success);
                // The oldest three were resumable: their frames stay for readers that rejoin.
                if i < 3 {
                    r.hub = Some(super::super::hub::ended());
                }
                (format!("r{i}"), r)
            })
            .collect();
        prune(&mut runs, 5);
        let mut kept: Vec<&str> = runs.keys().map(String::as_str).collect();
        kept.sort();
        // Down to 4: the three with frames, then the newest without.
        assert_eq!(kept, ["r0", "r1", "r2", "r9"]);
    }
}
