//! Stage 3: running a plan. Pregel / bulk-synchronous supersteps with LangGraph's semantics:
//! the tasks of a step run concurrently on tokio and read the state as of the start of the step;
//! their writes are applied together at the end, through each key's reducer, in plan order (then
//! fan-out index), whatever order the tasks finished in; routes are evaluated on the state after
//! the step; a join waits for all its sources; the run ends when nothing is scheduled.
//!
//! Durability: every finished task's writes are stored at once (a crash never re-runs it), and
//! each step ends in a checkpoint. A failed step leaves the last checkpoint intact: fix the
//! cause and the thread resumes from there.
//!
//! Architecture Invariant: the engine knows no HTTP and no SQL: it talks to `Checkpointer`,
//! `Provider` and node kinds through their interfaces, and never prints.

mod apply;
mod budget;
mod cache;
mod edit;
pub mod events;
mod gates;
pub mod kind;
mod lease;
mod persist;
mod rollback;
mod services;
mod step;
mod task;
mod thread;
mod trace;
pub mod values;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::{Map, Value};
use tracing::Instrument;

use crate::checkpoint::{
    self, Checkpoint, Checkpointer, Fence, Lease, PendingWrite, Put, TaskSpec, Thread, ThreadStatus,
};
use crate::compile::NodeValidators;
use crate::compile::Plan;
use crate::providers::Usage;
use crate::spec::NodeSpec;
pub use edit::{EditError, Goto, goto_target};
use events::{Event, Events};
pub use gates::{
    CHILD_GATES, CHILD_NODE, CHILD_THREAD, is_pause, recorded_gates, task_errors, task_results, waiting_gates,
};
pub use kind::{Kinds, NodeKind};
pub use lease::{DEFAULT_TTL as DEFAULT_LEASE_TTL, LeasePolicy, holder_gone, host, own_claim};
use persist::Persister;
pub use rollback::RollbackTo;
pub use services::{Env, Origin, ReadRoots, Services};
use step::{StepResult, follow, stopped};
use thread::Entry;
pub use thread::{Answer, Start};
use values::Scope;
pub use values::message_id;

/// When checkpoints are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persist {
    /// Each step's checkpoint is committed before the next step starts.
    #[default]
    Sync,
    /// Checkpoints are committed in the background, in order; the run waits for them at its end.
    Async,
    /// Only the run's last checkpoint is written (when it ends, fails or is interrupted).
    Exit,
}

/// What to run, said through which fields are set: a thread that does not exist is started
/// from it; an existing one gets a new turn when `input` is set, the answer when `answer` is
/// set, and otherwise continues. The entry points ([`Engine::start`], [`Engine::resume`],
/// [`Engine::answer`], [`Engine::new_turn`]) say it explicitly.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// An existing thread to continue, or the id for a new one (new: a UUIDv7).
    pub thread_id: Option<String>,
    /// The workflow path recorded with a new thread.
    pub workflow: String,
    pub input: Option<Value>,
    pub context: Option<Value>,
    /// `--set path=value` overrides of `config`, recorded with a new thread.
    pub config: Vec<(String, Value)>,
    /// The answer to the thread's pending interrupt.
    pub answer: Option<Value>,
    /// Which pending interrupt `answer` is for (its id or its node), when several wait.
    pub answer_to: Option<String>,
    /// More answers, each addressed to its gate (id or node), taken with `answer` in the same
    /// run: the gates of one step answered together.
    pub more_answers: Vec<(String, Value)>,
    /// The thread's lease: taken for the run, or the caller's (a subgraph's).
    pub lease: LeasePolicy,
    pub recursion_limit: Option<u32>,
    pub persist: Persist,
    /// Continue a thread even though its workflow changed incompatibly.
    pub force: bool,
    /// Nodes this run stops before or after, besides those the workflow declares.
    pub gates: RunGates,
    /// The checkpoint of the thread to go on from (none: its latest). From an older one the
    /// thread forks: the run's checkpoints are a new branch from it, the old branch stays in
    /// the thread's history.
    pub checkpoint_id: Option<String>,
    /// New input on a thread that waits (at a gate, or cut off) starts the new turn anyway,
    /// dropping what waited, as LangGraph's server does; without it such input is refused.
    pub discard_pending: bool,
    /// What the run says of itself, kept with every checkpoint it makes (the API server's run
    /// id, graph and the client's metadata: LangGraph's checkpoint metadata).
    pub metadata: Option<Map<String, Value>>,
    /// `path=value` overrides of `config` for this run only (LangGraph's per-run
    /// `configurable`), over the thread's own.
    pub run_config: Vec<(String, Value)>,
    /// The context of this run only, in place of the thread's (LangGraph's per-run `context`).
    pub run_context: Option<Value>,
    /// What this run may spend on models besides the workflow's `limits` (a server's per-user
    /// quota, what is left of it): checked before each model call as `limits` are, against
    /// what this run has spent.
    pub quota: Option<crate::spec::Budget>,
    /// The thread and its latest checkpoint as the caller read them under the lease its claim
    /// holds ([`LeasePolicy::Claimed`]): the run opens the thread from them rather than
    /// reading them again. Ignored under any other lease policy.
    pub seen: Option<Box<Seen>>,
}

/// A thread as read under its lease (see [`RunRequest::seen`]).
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub thread: Option<checkpoint::Thread>,
    pub head: Option<Checkpoint>,
}

/// Nodes one run stops before (`interrupt_before`) or after (`interrupt_after`), besides the
/// gates the workflow declares on its nodes: LangGraph's per-run interrupt points. They hold for
/// the run's own graph only, not a subgraph's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunGates {
    pub before: NodeSet,
    pub after: NodeSet,
}

/// Some nodes of a graph, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NodeSet {
    #[default]
    None,
    /// Every node (LangGraph's `"*"`).
    All,
    Named(Vec<String>),
}

impl NodeSet {
    pub fn contains(&self, node: &str) -> bool {
        match self {
            NodeSet::None => false,
            NodeSet::All => true,
            NodeSet::Named(names) => names.iter().any(|n| n == node),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Done,
    Interrupted,
    Failed,
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Done => "done",
            Status::Interrupted => "interrupted",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }
}

/// The end of a run. Serialized for a reader on another process (a run executed by a worker
/// of a shared database).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunOutcome {
    pub thread_id: String,
    pub status: Status,
    /// The workflow's output keys (or the whole state).
    pub output: Value,
    pub state: Map<String, Value>,
    /// The first pending interrupt: `{node, task_id, kind, payload}`.
    pub interrupt: Option<Value>,
    /// Every pending interrupt, in plan order (a step may stop at several gates).
    pub interrupts: Vec<Value>,
    pub error: Option<String>,
    /// The error class of the node failure that failed the run, if one did.
    pub error_class: Option<String>,
    pub steps: i64,
    /// The thread's usage, every turn and run of it.
    pub usage: Usage,
    /// This turn's usage (a new input starts a turn; a resume does not).
    pub turn_usage: Usage,
    /// The thread's usage its caller has not been told of yet: all of it, less what a failed
    /// run of it before this one reported. A parent charges a child run this, so a child that
    /// failed and is run again is counted once.
    pub unreported_usage: Usage,
    /// What this run spent: the thread's usage since the run began.
    pub run_usage: Usage,
    /// A subgraph's child that ended by handing off to its parent: where to, and the writes.
    pub handoffs: Vec<kind::Handoff>,
}

/// Why a run could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid input: {0}")]
    Input(String),
    #[error("{0}")]
    Incompatible(String),
    #[error("thread `{0}` is not waiting for an answer")]
    NotInterrupted(String),
    #[error("the answer does not fit the gate's response schema: {0}")]
    BadAnswer(String),
    #[error("thread `{0}` does not exist")]
    NoThread(String),
    #[error("thread `{0}` exists already: continue it, answer it, or give it a new turn")]
    Exists(String),
    /// Another run holds the thread's lease.
    #[error("{0}")]
    Busy(Box<Lease>),
    /// A value read back from the store does not fit its key's schema (a corrupt or
    /// hand-edited database, or a schema made stricter since).
    #[error("thread `{thread}`: the stored value of `{key}` does not match its schema: {why}")]
    StoredValue { thread: String, key: String, why: String },
    #[error("thread `{0}`: the gate was already answered")]
    AlreadyAnswered(String),
    /// A bare answer while several gates wait, or an address that fits several.
    #[error("thread `{thread}` waits at {} gates: give the answer as NODE_OR_ID=JSON, for one of {}", .pending.len(), .pending.join(", "))]
    WhichGate { thread: String, pending: Vec<String> },
    #[error("thread `{thread}` has no pending interrupt `{to}`; pending: {}", .pending.join(", "))]
    NoSuchGate {
        thread: String,
        to: String,
        pending: Vec<String>,
    },
    #[error(transparent)]
    Edit(#[from] EditError),
    #[error(transparent)]
    Store(#[from] checkpoint::CheckpointError),
}

/// What every task of a run shares.
pub struct Shared {
    pub plan: Arc<Plan>,
    /// Per node, a validator built on first use (a node's output schema), kept by the plan
    /// for all its runs.
    validators: Arc<NodeValidators>,
    pub store: Arc<dyn Checkpointer>,
    pub services: Arc<Services>,
    pub events: Events,
    pub thread_id: String,
    /// The lease the run writes under; a subgraph's child runs under it too.
    pub fence: Fence,
    /// Continue despite incompatible stored records (`--force`).
    pub force: bool,
    /// The first superstep the recursion limit no longer allows in this run.
    pub end_step: i64,
    /// The run is a subgraph's child, which may hand off to its parent.
    pub as_child: bool,
}

/// Runs plans on threads.
#[derive(Clone)]
pub struct Engine {
    plan: Arc<Plan>,
    store: Arc<dyn Checkpointer>,
    /// Shared by the engine's runs and their subgraphs' (a clone of a run's registry and
    /// providers per run was a few kilobytes each).
    services: Arc<Services>,
    events: Events,
    cancel: Arc<AtomicBool>,
    /// Stops the run at once, in the middle of a step (see [`Abort`]).
    abort: Abort,
    /// Validators of state keys' schemas, each built when a value of its key is first checked.
    validators: Arc<crate::compile::Validators<String>>,
    node_validators: Arc<NodeValidators>,
    options: RunOptions,
}

/// Engine bookkeeping kept in each checkpoint's `meta`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Meta {
    /// Per join (by index in the plan), the sources that have run since the target last ran.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    barriers: BTreeMap<usize, BTreeSet<String>>,
    /// How often each node with a `max_visits` has run (no other node needs counting).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    visits: BTreeMap<String, u32>,
    /// Usage so far on the thread.
    #[serde(default, skip_serializing_if = "is_zero")]
    usage: Usage,
    /// Usage of the current turn (what `limits` budgets count).
    #[serde(default, skip_serializing_if = "is_zero")]
    turn: Usage,
    /// Usage of the current turn by node, for the nodes that have a `budget`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    node_usage: BTreeMap<String, Usage>,
    /// Per append-only key, how many stored extensions follow its last full value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    chains: BTreeMap<String, u32>,
    /// The input of the current turn, when it is not the thread's first (a new `--input` on a
    /// finished thread starts a new turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input: Option<Value>,
    /// Deferred nodes triggered while other work was scheduled: they run when nothing else is.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    deferred: BTreeSet<String>,
    /// The handoffs to the parent the last step chose (a subgraph's child): the run ended there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    handoffs: Vec<kind::Handoff>,
    /// How the checkpoint came to be (none: a step of a run, or a thread's first checkpoint
    /// when its step is -1, as builds before sources were recorded made them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<Source>,
    /// The branch of the thread the checkpoint is on: 0 for the thread's first line, a new
    /// number for each run or edit that went on from an older checkpoint. Task ids (and with
    /// them the ids of the messages tasks write) carry it, so two branches never share one.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    branch: u32,
    /// What the run that made the checkpoint said of itself ([`RunOptions::metadata`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run: Option<Map<String, Value>>,
}

/// How a checkpoint came to be, as LangGraph's checkpoint metadata names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The state before a turn's input is written: its one task, `__start__`, writes it.
    Input,
    /// A superstep's result.
    Loop,
    /// A state edit (`update_state`, a command's `update` or `goto`).
    Update,
    /// A copy of an older checkpoint, the base of a new branch.
    Fork,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Input => "input",
            Source::Loop => "loop",
            Source::Update => "update",
            Source::Fork => "fork",
        }
    }
}

/// What a stored checkpoint says of itself beyond its fields: how it came to be, and the
/// metadata of the run that made it.
pub fn checkpoint_source(cp: &Checkpoint) -> Source {
    serde_json::from_value::<Meta>(cp.meta.clone())
        .ok()
        .and_then(|m| m.source)
        .unwrap_or(if cp.step < 0 { Source::Input } else { Source::Loop })
}

/// The metadata of the run that made a stored checkpoint ([`RunOptions::metadata`]).
pub fn checkpoint_run_metadata(cp: &Checkpoint) -> Option<Map<String, Value>> {
    cp.meta.get("run").and_then(Value::as_object).cloned()
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// The node name of a turn's first task, which writes its input (LangGraph's `__start__`).
pub const START_TASK: &str = "__start__";

/// A task as people read it: its node, with its fan-out index (`worker#2`) among the tasks of
/// its node in `tasks` (a step's, in order); the id itself is for machines.
pub fn task_label(tasks: &[TaskSpec], task: &TaskSpec) -> String {
    if task.item.is_none() {
        return task.node.clone();
    }
    let index = tasks
        .iter()
        .filter(|t| t.node == task.node && t.item.is_some())
        .position(|t| t.task_id == task.task_id)
        .unwrap_or(0);
    format!("{}#{index}", task.node)
}

/// The namespace task ids are derived in.
const TASK_IDS: uuid::Uuid = uuid::uuid!("2f1f6f2a-8a41-5d1c-9a43-1b6b9f0d7c11");

/// The id of the task running `node` in `step` of thread `thread` on `branch` (the `index`th
/// fan-out item of a `send`): a UUID, unique across threads, namespaces (a subgraph's child
/// runs on a thread of its own), steps and branches, so interrupts, child threads and the
/// messages a task writes are told apart everywhere; and derived from those, so a run
/// replayed on the same thread repeats them. Public so that whoever reads a thread (a test, a
/// client) can name a task without having seen it scheduled.
pub fn task_id(thread: &str, node: &str, step: i64, branch: u32, index: Option<usize>) -> String {
    let name = format!(
        "{thread}\n{step}\n{branch}\n{node}\n{}",
        index.map_or(String::new(), |i| i.to_string())
    );
    uuid::Uuid::new_v5(&TASK_IDS, name.as_bytes()).to_string()
}

/// The most extensions stored in a row for one key before a full value.
const MAX_CHAIN: u32 = 256;

/// Values a checkpoint introduces: `(key, version, value)`.
type NewValues = Vec<(String, u64, Value)>;

const DONE: &str = "__done__";
const INTERRUPT: &str = "__interrupt__";
const RESUME: &str = "__resume__";
const BEFORE: &str = "__before__";
/// The record of an `interrupt_after` pause (the nodes have run; the next step has not).
const AFTER: &str = "__after__";
/// An answer that was given to a task which then stopped at another gate (a subgraph's next
/// one): kept as the record that the gate it was for was answered, never passed again.
const RESUMED: &str = "__resumed__";
/// Record slots within a task: its pause, the answer to it, its result.
const IDX_INTERRUPT: u32 = 0;
const IDX_RESUME: u32 = 1;
const IDX_DONE: u32 = 2;
/// Which gate inside a subgraph an answer is for.
const IDX_RESUME_TO: u32 = 3;
/// Why a task failed (a record, not a result: the task runs again).
const IDX_ERROR: u32 = 4;
const ERROR: &str = "__error__";
const RESUME_TO: &str = "__resume_to__";
/// The answers a task has used, one record each from this slot on, in the order given (a gate
/// that asks several questions reads them all when the last is answered).
const IDX_ANSWERED: u32 = 16;

/// Stops a run at once: the tasks of the step that runs are dropped where they are (a model
/// call's request with them), their writes are not kept, and the thread waits at the
/// checkpoint the step started from, with those tasks still to run. What LangGraph's server
/// does to a cancelled run. (The cancel flag instead lets the step finish: a graceful stop.)
#[derive(Clone, Default)]
pub struct Abort(Arc<AbortState>);

#[derive(Default)]
struct AbortState {
    aborted: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Abort {
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    pub fn is_aborted(&self) -> bool {
        self.0.aborted.load(Ordering::SeqCst)
    }

    /// Resolves once the run is aborted.
    pub async fn aborted(&self) {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: an abort between the two still wakes it.
            notified.as_mut().enable();
            if self.is_aborted() {
                return;
            }
            notified.await;
        }
    }
}

impl std::fmt::Debug for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Abort").field(&self.is_aborted()).finish()
    }
}

/// How a run holds its thread, counts its steps and stores its checkpoints, whichever entry
/// point starts it.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The thread's lease: taken for the run, or the caller's (a subgraph's).
    pub lease: LeasePolicy,
    pub recursion_limit: Option<u32>,
    pub persist: Persist,
    /// Continue a thread even though its workflow changed incompatibly.
    pub force: bool,
    /// The run is a subgraph's child: a handoff ends it and goes to the parent (a workflow run
    /// on its own that hands off fails).
    pub as_child: bool,
    /// Nodes this run stops before or after, besides those the workflow declares.
    pub gates: RunGates,
    /// See [`RunRequest::discard_pending`].
    pub discard_pending: bool,
    /// See [`RunRequest::metadata`].
    pub metadata: Option<Arc<Map<String, Value>>>,
    /// See [`RunRequest::run_config`].
    pub run_config: Vec<(String, Value)>,
    /// See [`RunRequest::run_context`].
    pub run_context: Option<Value>,
    /// See [`RunRequest::quota`].
    pub quota: Option<crate::spec::Budget>,
}

/// A run in progress: its thread, where it stands, and what it holds back for the store.
struct Run {
    shared: Arc<Shared>,
    thread: Thread,
    /// Shared with the store it is put in.
    cp: Arc<Checkpoint>,
    state: Map<String, Value>,
    /// `state` as expressions see it: the state the last routing saw.
    state_view: values::StateView,
    meta: Meta,
    /// The records stored against `cp`: finished tasks, pauses, answers.
    pending: Vec<PendingWrite>,
    /// `input`, `config` and `context`: what every scope of the run holds.
    constants: Arc<Scope>,
    persister: Persister,
    /// The run goes on past an `interrupt_before` gate: the gated nodes run this time.
    skip_before: bool,
    /// The first superstep of this run, and how many it may take.
    first_step: i64,
    limit: i64,
    /// The thread's usage a failed run before this one reported (see
    /// `RunOutcome::unreported_usage`).
    reported: Usage,
    /// The thread's usage when this run began: what the run spends is counted from it.
    started_with: Usage,
    /// The thread's status as the run's last commit wrote it (a step after which nothing
    /// runs writes `done` with its checkpoint): the run's end writes it only if it differs.
    status_written: Option<ThreadStatus>,
}

/// How a run stopped.
struct End {
    status: Status,
    error: Option<String>,
    /// The error class of the failure that ended it, when a node's failure did.
    error_class: Option<String>,
    interrupts: Vec<Value>,
}

impl End {
    fn with(status: Status) -> End {
        End {
            status,
            error: None,
            error_class: None,
            interrupts: Vec::new(),
        }
    }

    fn failed(message: String) -> End {
        End {
            error: Some(message),
            ..End::with(Status::Failed)
        }
    }

    fn interrupted(interrupts: Vec<Value>) -> End {
        End {
            interrupts,
            ..End::with(Status::Interrupted)
        }
    }
}

impl Engine {
    pub fn new(plan: Arc<Plan>, store: Arc<dyn Checkpointer>, services: impl Into<Services>, events: Events) -> Engine {
        Engine::sharing(plan, store, Arc::new(services.into()), events)
    }

    /// An engine whose runs use `services` with other engines' (a run's subgraphs use their
    /// parent's).
    pub fn sharing(plan: Arc<Plan>, store: Arc<dyn Checkpointer>, services: Arc<Services>, events: Events) -> Engine {
        Engine {
            // The plan's: each schema is compiled when a run first checks a value against it.
            validators: plan.state_validators(),
            node_validators: plan.node_validators(),
            plan,
            store,
            services,
            events,
            cancel: Arc::new(AtomicBool::new(false)),
            abort: Abort::default(),
            options: RunOptions::default(),
        }
    }

    /// A flag that stops the run at the next step boundary (Ctrl-C).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    pub fn with_cancel(mut self, flag: Arc<AtomicBool>) -> Engine {
        self.cancel = flag;
        self
    }

    /// What stops the run at once, its running tasks dropped (see [`Abort`]).
    pub fn abort_handle(&self) -> Abort {
        self.abort.clone()
    }

    /// The lease, recursion limit, persist mode and `force` of the runs this engine makes.
    pub fn with_options(mut self, options: RunOptions) -> Engine {
        self.options = options;
        self
    }

    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// Runs a new thread; a thread that exists already is refused.
    pub async fn start(&self, start: Start) -> Result<RunOutcome, EngineError> {
        self.enter(Entry::start(start)).await
    }

    /// Continues an existing thread from its last checkpoint (after a crash, a cancel, a
    /// failure that was fixed, or past an `interrupt_before`/`interrupt_after` pause).
    pub async fn resume(&self, thread_id: &str) -> Result<RunOutcome, EngineError> {
        self.enter(Entry::existing(thread_id)).await
    }

    /// Answers a pending interrupt of an existing thread and continues it.
    pub async fn answer(&self, thread_id: &str, answer: Answer) -> Result<RunOutcome, EngineError> {
        self.enter(Entry {
            answer: Some(answer),
            ..Entry::existing(thread_id)
        })
        .await
    }

    /// Starts a new turn on a finished thread (LangGraph's `invoke(input, thread)`): START runs
    /// again on the thread's state, with the new input.
    pub async fn new_turn(&self, thread_id: &str, input: Value) -> Result<RunOutcome, EngineError> {
        self.enter(Entry {
            new_turn: Some(input),
            ..Entry::existing(thread_id)
        })
        .await
    }

    /// Starts the thread if it does not exist, else continues it, with `answer` when it waits
    /// for one (an answer for a thread that is only now started is dropped). For a run nested
    /// in a task, which may have been cut off or interrupted before: a subgraph's child.
    pub fn start_or_continue(
        &self,
        start: Start,
        answer: Option<Answer>,
    ) -> futures::future::BoxFuture<'_, Result<RunOutcome, EngineError>> {
        // Boxed: the type erasure breaks the recursion between a task and the engine it runs.
        Box::pin(self.enter(Entry::start_or_continue(start, answer)))
    }

    /// [`Engine::run`] as a boxed future.
    pub fn run_boxed(&self, req: RunRequest) -> futures::future::BoxFuture<'_, Result<RunOutcome, EngineError>> {
        Box::pin(self.run(req))
    }

    /// Runs what a [`RunRequest`] describes: a thread that does not exist is started from it; an
    /// existing one gets a new turn when the request has input, the answer when it has one, and
    /// otherwise continues.
    pub fn run(&self, req: RunRequest) -> impl Future<Output = Result<RunOutcome, EngineError>> + Send + use<> {
        // Made before the future: it holds the engine and the boxed entry, not the request
        // too (a future keeps what it was given for as long as it lives).
        let engine = self.clone().with_options(RunOptions {
            lease: req.lease.clone(),
            recursion_limit: req.recursion_limit,
            persist: req.persist,
            force: req.force,
            as_child: false,
            gates: req.gates.clone(),
            discard_pending: req.discard_pending,
            metadata: req.metadata.clone().map(Arc::new),
            run_config: req.run_config.clone(),
            run_context: req.run_context.clone(),
            quota: req.quota.clone(),
        });
        let entry = Box::new(Entry::from(req));
        async move { engine.enter_boxed(entry).await }
    }

    /// Runs (or continues) a thread until it is done, interrupted, failed or cancelled. The
    /// thread's lease is held from before the thread is opened (or created) until the run ends.
    fn enter(&self, entry: Entry) -> impl Future<Output = Result<RunOutcome, EngineError>> + Send + '_ {
        self.enter_boxed(Box::new(entry))
    }

    /// [`Engine::enter`] with the entry on the heap: every future between here and a step
    /// holds it, and a future keeps both what it was given and what it moved that into.
    async fn enter_boxed(&self, entry: Box<Entry>) -> Result<RunOutcome, EngineError> {
        let thread_id = entry.thread_id.clone().unwrap_or_else(checkpoint::new_id);
        let span = trace::run(self.plan.name(), &thread_id);
        let outcome = async {
            let held = lease::take(&self.store, &thread_id, &self.options.lease, &self.cancel).await?;
            let outcome = self.run_held(entry, thread_id, &held).await;
            let released = held.release();
            let outcome = outcome?;
            released?;
            Ok::<_, EngineError>(outcome)
        }
        .instrument(span.clone())
        .await;
        match &outcome {
            Ok(o) => trace::run_ended(&span, o.status.as_str(), o.status == Status::Failed),
            Err(_) => trace::run_ended(&span, "error", true),
        }
        outcome
    }

    async fn run_held(
        &self,
        entry: Box<Entry>,
        thread_id: String,
        held: &lease::Held,
    ) -> Result<RunOutcome, EngineError> {
        let started = Instant::now();
        let mut run = self.begin(&entry, thread_id, held.fence())?;
        let end = loop {
            if held.lost() {
                // Whoever took the lease over owns the thread now: stop without writing.
                return Err(checkpoint::CheckpointError::LeaseLost(run.thread.thread_id.clone()).into());
            }
            if let Some(end) = self.superstep(&mut run).await? {
                break end;
            }
        };
        self.end(run, end, started)
    }

    /// One superstep: the checks that may stop the run before it, its tasks, and its
    /// checkpoint. `Some` when the run stops.
    async fn superstep(&self, run: &mut Run) -> Result<Option<End>, EngineError> {
        if self.cancel.load(Ordering::SeqCst) || self.abort.is_aborted() {
            return Ok(Some(End::with(Status::Cancelled)));
        }
        if run.cp.next.is_empty() {
            return Ok(Some(End::with(Status::Done)));
        }
        let step = run.cp.step + 1;
        if step - run.first_step >= run.limit {
            return Ok(Some(End::failed(format!(
                "the recursion limit of {} supersteps was reached with {} still to run; raise `limits.recursion_limit` or pass --recursion-limit",
                run.limit,
                run.cp
                    .next
                    .iter()
                    .map(|t| t.node.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))));
        }
        if let Some(end) = self.gate_before(run)? {
            return Ok(Some(end));
        }
        if let Some(message) = self.over_visits(&run.cp, &run.meta) {
            return Ok(Some(End::failed(message)));
        }
        let step_started = Instant::now();
        // Built only for someone listening: its task list is a copy of every task id.
        if self.events.is_on() {
            self.events.send(Event::StepStart {
                step,
                tasks: run.cp.next.iter().map(|t| t.task_id.clone()).collect(),
                nodes: run.cp.next.iter().map(|t| task_label(&run.cp.next, t)).collect(),
            });
        }
        // The turn's opening commit, waiting for this start to go with it (the first step's).
        run.persister.launch_opening()?;
        let span = trace::step(step, run.cp.next.len());
        // An abort drops the step's running tasks (and their requests) where they are: their
        // writes are not kept and the thread waits at the checkpoint the step started from.
        // What finished before it and was stored stays stored.
        let stepped = tokio::select! {
            biased;
            () = self.abort.aborted() => None,
            stepped = self.run_step(run, step).instrument(span.clone()) => Some(stepped),
        };
        let Some(stepped) = stepped else {
            return Ok(Some(End::with(Status::Cancelled)));
        };
        let (outcomes, deferred) = stepped?;
        // A failure or an interrupt stops here: finished tasks' writes are stored, the last
        // checkpoint is untouched, and the thread resumes from it.
        if let Some(end) = stopped(&mut run.meta, &outcomes) {
            return Ok(Some(end));
        }
        let _in_step = span.enter();
        self.commit_step(run, &outcomes, deferred, step, step_started)
    }

    /// Applies a step that ran to its end and stores its checkpoint; stops at an
    /// `interrupt_after` gate, or when the writes cannot be applied.
    fn commit_step(
        &self,
        run: &mut Run,
        outcomes: &[(TaskSpec, StepResult)],
        deferred: step::Deferred,
        step: i64,
        step_started: Instant,
    ) -> Result<Option<End>, EngineError> {
        let (next_cp, values) = match self.apply(run, outcomes, step) {
            Ok(applied) => applied,
            Err(message) => {
                // The tasks did finish: keep their writes so that a fixed workflow resumes
                // without running them again.
                self.keep_writes(&run.persister, &run.shared.thread_id, &run.cp, &run.pending, outcomes)?;
                for e in deferred.events {
                    self.events.send(e);
                }
                return Ok(Some(End::failed(message.to_string())));
            }
        };
        if self.events.is_on() {
            let changed: Map<String, Value> = next_cp
                .changed
                .iter()
                .filter_map(|k| run.state.get(k).map(|v| (k.clone(), v.clone())))
                .collect();
            self.events.send(Event::StateUpdate { step, values: changed });
        }
        let last = (!deferred.writes.is_empty()).then(|| Put::Writes {
            thread_id: run.shared.thread_id.clone(),
            checkpoint_id: run.cp.checkpoint_id.clone(),
            writes: deferred.writes,
        });
        let next_cp = Arc::new(next_cp);
        let mut after = deferred.events;
        after.push(Event::StepEnd {
            step,
            checkpoint_id: next_cp.checkpoint_id.clone(),
            duration_ms: step_started.elapsed().as_secs_f64() * 1000.0,
            // Logged with the checkpoint's commit (`exit` commits it only at the run's end).
            checkpoint: (self.events.journal().is_some() && self.options.persist != Persist::Exit)
                .then(|| next_cp.clone()),
        });
        // Nothing runs after this step: the run ends here (unless it is cancelled first), and
        // the thread's status goes with the checkpoint rather than in a commit of its own.
        let done = next_cp.next.is_empty().then(|| Put::Status {
            thread_id: run.shared.thread_id.clone(),
            status: ThreadStatus::Done,
        });
        let wrote_done = done.is_some();
        if run.persister.put_checkpoint(&next_cp, values, last, done, after)? && wrote_done {
            run.status_written = Some(ThreadStatus::Done);
        }
        let gated: Vec<String> = next_cp
            .ran
            .iter()
            .filter(|n| {
                self.node_spec(n).is_some_and(|s| s.common().interrupt_after) || self.options.gates.after.contains(n)
            })
            .cloned()
            .collect();
        run.cp = next_cp;
        run.pending = Vec::new();
        if !gated.is_empty() && !run.cp.next.is_empty() {
            let pause = self.pause(&run.persister, &run.thread.thread_id, &run.cp, "after", &gated)?;
            return Ok(Some(End::interrupted(vec![pause])));
        }
        Ok(None)
    }

    /// Commits what is left, records the thread's status, and reports the run.
    fn end(&self, run: Run, end: End, started: Instant) -> Result<RunOutcome, EngineError> {
        let Run {
            shared,
            thread,
            cp,
            state,
            meta,
            persister,
            reported,
            started_with,
            status_written,
            ..
        } = run;
        persister.finish()?;
        let thread_status = match end.status {
            Status::Done => ThreadStatus::Done,
            Status::Interrupted => ThreadStatus::Interrupted,
            Status::Failed => ThreadStatus::Failed,
            Status::Cancelled => ThreadStatus::Running,
        };
        // Fenced too: a run that lost its lease does not report over its successor's status.
        if status_written != Some(thread_status) {
            self.store.put_batch(vec![
                Put::Fence(shared.fence.clone()),
                Put::Status {
                    thread_id: thread.thread_id.clone(),
                    status: thread_status,
                },
            ])?;
        }
        if let Some(e) = &end.error {
            self.events.send(Event::Error {
                node: None,
                class: None,
                message: e.clone(),
            });
        }
        self.events.send(Event::RunEnd {
            status: end.status.as_str().into(),
            steps: cp.step,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            turn_usage: meta.turn,
            thread_usage: meta.usage,
        });
        let handoffs = if end.status == Status::Done {
            meta.handoffs
        } else {
            Vec::new()
        };
        Ok(RunOutcome {
            handoffs,
            thread_id: thread.thread_id,
            status: end.status,
            output: self.output(&state),
            state,
            interrupt: end.interrupts.first().cloned(),
            interrupts: end.interrupts,
            error: end.error,
            error_class: end.error_class,
            steps: cp.step,
            usage: meta.usage,
            turn_usage: meta.turn,
            unreported_usage: meta.usage.less(&reported),
            run_usage: meta.usage.less(&started_with),
        })
    }

    fn node_spec(&self, name: &str) -> Option<&NodeSpec> {
        self.plan.node_by_name(name).map(|ix| &self.plan.nodes()[&ix].spec)
    }

    fn output(&self, state: &Map<String, Value>) -> Value {
        match &self.plan.output() {
            Some(keys) => Value::Object(
                keys.iter()
                    .map(|k| (k.clone(), state.get(k).cloned().unwrap_or(Value::Null)))
                    .collect(),
            ),
            None => Value::Object(state.clone()),
        }
    }
}

fn is_zero(u: &Usage) -> bool {
    *u == Usage::default()
}
