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

pub mod events;
mod gates;
mod lease;
mod persist;
mod task;
pub mod values;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::{Map, Value, json};
use tokio::task::JoinSet;

use crate::checkpoint::{
    self, Checkpoint, Checkpointer, Fence, Lease, PendingWrite, Put, TaskSpec, Thread, ThreadStatus,
};
use crate::compile::{Branch, NodeIx, Plan, Reducer, Target, Validators};
use crate::nodes::{NodeError, Services};
use crate::providers::Usage;
use crate::spec::NodeSpec;
use events::{Event, Events};
use futures::FutureExt;
use gates::{is_before, reported, waiting_gates};
pub use lease::{DEFAULT_TTL as DEFAULT_LEASE_TTL, LeasePolicy, holder_gone, host};
use persist::Persister;
use task::{Next, Outcome};
use values::{Scope, to_jinja};

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

/// What to run.
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
    /// The thread's lease: taken for the run, or the caller's (a subgraph's).
    pub lease: LeasePolicy,
    pub recursion_limit: Option<u32>,
    pub persist: Persist,
    /// Continue a thread even though its workflow changed incompatibly.
    pub force: bool,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The end of a run.
#[derive(Debug, Clone)]
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
    pub steps: i64,
    pub usage: Usage,
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
    Store(#[from] checkpoint::CheckpointError),
}

/// What every task of a run shares.
pub struct Shared {
    pub plan: Arc<Plan>,
    /// Validators of llm output schemas, by node, each built when its node first runs.
    pub outputs: Arc<Validators<crate::compile::NodeIx>>,
    pub store: Arc<dyn Checkpointer>,
    pub services: Services,
    pub events: Events,
    pub thread_id: String,
    /// The lease the run writes under; a subgraph's child runs under it too.
    pub fence: Fence,
    /// Continue despite incompatible stored records (`--force`).
    pub force: bool,
    /// The first superstep the recursion limit no longer allows in this run.
    pub end_step: i64,
}

/// Runs plans on threads.
#[derive(Clone)]
pub struct Engine {
    plan: Arc<Plan>,
    store: Arc<dyn Checkpointer>,
    services: Services,
    events: Events,
    cancel: Arc<AtomicBool>,
    validators: Arc<Validators<String>>,
    outputs: Arc<Validators<crate::compile::NodeIx>>,
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
const RESUME_TO: &str = "__resume_to__";

impl Engine {
    pub fn new(plan: Arc<Plan>, store: Arc<dyn Checkpointer>, services: impl Into<Services>, events: Events) -> Engine {
        let services = services.into();
        // Built when first used: a run compiles the schemas of what it writes and runs only.
        let validators = Validators::new(plan.state.iter().map(|(key, c)| (key.clone(), c.schema.clone())));
        let outputs = Validators::new(plan.nodes.iter().filter_map(
            |(ix, node)| match node.fields.get("/output/schema") {
                Some(crate::compile::Compiled::Literal(schema)) => Some((*ix, schema.clone())),
                _ => None,
            },
        ));
        Engine {
            outputs: Arc::new(outputs),
            plan,
            store,
            services,
            events,
            cancel: Arc::new(AtomicBool::new(false)),
            validators: Arc::new(validators),
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

    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// [`Engine::run`] as a boxed future, for nodes that run an engine themselves (subgraphs):
    /// the type erasure breaks the recursion between a task and the engine it runs.
    pub fn run_boxed(&self, req: RunRequest) -> futures::future::BoxFuture<'_, Result<RunOutcome, EngineError>> {
        Box::pin(self.run(req))
    }

    /// Runs (or continues) a thread until it is done, interrupted, failed or cancelled. The
    /// thread's lease is held from before the thread is opened (or created) until the run ends.
    pub async fn run(&self, req: RunRequest) -> Result<RunOutcome, EngineError> {
        let thread_id = req.thread_id.clone().unwrap_or_else(checkpoint::new_id);
        let held = lease::take(&self.store, &thread_id, &req.lease, &self.cancel).await?;
        let outcome = self.run_held(req, thread_id, &held).await;
        let released = held.release();
        let outcome = outcome?;
        released?;
        Ok(outcome)
    }

    async fn run_held(
        &self,
        req: RunRequest,
        thread_id: String,
        held: &lease::Held,
    ) -> Result<RunOutcome, EngineError> {
        let started = Instant::now();
        let fence = held.fence().clone();
        let (thread, mut cp, resumed) = self.open(&req, thread_id, &fence)?;
        let limit = run_limit(&req, &self.plan);
        // The limit counts the supersteps of this run, as LangGraph's does per invocation.
        let first_step = cp.step + 1;
        let shared = Arc::new(Shared {
            fence: fence.clone(),
            force: req.force,
            end_step: first_step + limit,
            outputs: self.outputs.clone(),
            plan: self.plan.clone(),
            store: self.store.clone(),
            services: self.services.clone(),
            events: self.events.clone(),
            thread_id: thread.thread_id.clone(),
        });
        self.events.send(Event::RunStart {
            thread_id: thread.thread_id.clone(),
            workflow: thread.workflow.clone(),
            resumed,
        });
        let config = effective_config(&self.plan.config, &thread.config);
        let mut meta: Meta = serde_json::from_value(cp.meta.clone()).unwrap_or_default();
        let input = meta.input.clone().unwrap_or_else(|| thread.input.clone());
        let constants = Arc::new(Scope::new(
            BTreeMap::from([
                ("input".to_string(), to_jinja(&input)),
                ("config".to_string(), to_jinja(&config)),
                ("context".to_string(), to_jinja(&thread.context)),
            ]),
            None,
        ));
        let mut state = self.store.state(&thread.thread_id, &cp.versions)?;
        self.check_stored(&thread.thread_id, &state)?;
        let mut pending = self.store.get_writes(&thread.thread_id, &cp.checkpoint_id)?;
        // Finished tasks' records must fit this workflow before anything is written.
        for w in pending.iter().filter(|w| w.channel == DONE) {
            decode(w, &self.plan, req.force).map_err(EngineError::Incompatible)?;
        }
        let mut skip_before = false;
        let persister = Persister::new(
            self.store.clone(),
            req.persist,
            cp.checkpoint_id.clone(),
            fence,
            self.events.clone(),
        );
        // Checked and written under the lease: of two racing answers, the second finds the
        // gate answered.
        let waiting = waiting_gates(&pending);
        if let Some(answer) = &req.answer {
            let (gate, inner) = self.addressed_gate(&thread.thread_id, &cp, &waiting, req.answer_to.as_deref())?;
            if gate.task_id == BEFORE || gate.task_id == AFTER {
                skip_before = is_before(gate);
            } else {
                self.validate_answer(gate, answer, inner.as_deref())?;
                let writes = vec![
                    PendingWrite {
                        task_id: gate.task_id.clone(),
                        idx: IDX_RESUME,
                        channel: RESUME.into(),
                        value: answer.clone(),
                    },
                    // Which of a subgraph's gates the answer is for (null: its only one).
                    PendingWrite {
                        task_id: gate.task_id.clone(),
                        idx: IDX_RESUME_TO,
                        channel: RESUME_TO.into(),
                        value: inner.map_or(Value::Null, Value::String),
                    },
                ];
                persister.write_now(vec![Put::Writes {
                    thread_id: thread.thread_id.clone(),
                    checkpoint_id: cp.checkpoint_id.clone(),
                    writes: writes.clone(),
                }])?;
                let task = gate.task_id.clone();
                pending.retain(|p| !(p.task_id == task && (p.idx == IDX_RESUME || p.idx == IDX_RESUME_TO)));
                pending.extend(writes);
            }
        } else if waiting.iter().any(|w| w.task_id == BEFORE && is_before(w)) {
            // Continuing a thread stopped before a node (no answer is needed) runs the node.
            skip_before = true;
        }
        persister.write_now(vec![Put::Status {
            thread_id: thread.thread_id.clone(),
            status: ThreadStatus::Running,
        }])?;
        let mut status = Status::Done;
        let mut error = None;
        let mut interrupts: Vec<Value> = Vec::new();
        let mut state_value = values::map_to_jinja(&state);
        loop {
            if held.lost() {
                // Whoever took the lease over owns the thread now: stop without writing.
                drop(persister);
                return Err(checkpoint::CheckpointError::LeaseLost(thread.thread_id.clone()).into());
            }
            if self.cancel.load(Ordering::SeqCst) {
                status = Status::Cancelled;
                break;
            }
            if cp.next.is_empty() {
                break;
            }
            let step = cp.step + 1;
            if step - first_step >= limit {
                status = Status::Failed;
                error = Some(format!(
                    "the recursion limit of {limit} supersteps was reached with {} still to run; raise `limits.recursion_limit` or pass --recursion-limit",
                    cp.next.iter().map(|t| t.node.as_str()).collect::<Vec<_>>().join(", ")
                ));
                break;
            }
            if !skip_before {
                let gated: Vec<String> = cp
                    .next
                    .iter()
                    .filter(|t| self.node_spec(&t.node).is_some_and(|s| s.common().interrupt_before))
                    .map(|t| t.node.clone())
                    .collect();
                if !gated.is_empty() {
                    interrupts.push(self.pause(&persister, &thread.thread_id, &cp, "before", &gated)?);
                    status = Status::Interrupted;
                    break;
                }
            }
            skip_before = false;
            if let Some(message) = self.over_visits(&cp, &meta) {
                status = Status::Failed;
                error = Some(message);
                break;
            }
            let step_started = Instant::now();
            self.events.send(Event::StepStart {
                step,
                tasks: cp.next.iter().map(|t| t.task_id.clone()).collect(),
            });
            let base = Arc::new(Scope::over(
                &constants,
                BTreeMap::from([("state".to_string(), state_value.clone())]),
                Some(self.plan.clone()),
            ));
            let (outcomes, deferred) = self
                .run_step(&shared, &cp, &pending, base, step, &persister, &meta)
                .await?;
            // A failure or an interrupt stops here: finished tasks' writes are stored, the last
            // checkpoint is untouched, and the thread resumes from it.
            let failed: Vec<(String, String)> = outcomes
                .iter()
                .filter_map(|(t, o)| match o {
                    StepResult::Failed(e) => Some((t.node.clone(), e.message.clone())),
                    _ => None,
                })
                .collect();
            if !failed.is_empty() {
                // The step is not applied and the thread's stored usage stays as it was, but
                // what the step's tasks spent on models was spent: the run's report counts it.
                for (_, o) in &outcomes {
                    match o {
                        StepResult::Done(d) => meta.usage.add(&d.usage),
                        StepResult::Failed(e) => meta.usage.add(&e.usage),
                        StepResult::Interrupt(_) => {}
                    }
                }
                status = Status::Failed;
                error = Some(
                    failed
                        .iter()
                        .map(|(n, m)| format!("node `{n}` failed: {m}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                );
                break;
            }
            let stopped: Vec<Value> = outcomes
                .iter()
                .flat_map(|(t, o)| match o {
                    StepResult::Interrupt(p) => reported(t, p),
                    _ => Vec::new(),
                })
                .collect();
            if !stopped.is_empty() {
                interrupts = stopped;
                status = Status::Interrupted;
                break;
            }
            match self.apply(&shared, &cp, &mut state, &mut meta, &outcomes, &constants, step) {
                Ok((next_cp, values, after)) => {
                    // The state the routing saw is the next step's state.
                    state_value = after;
                    if self.events.is_on() {
                        let changed: Map<String, Value> = next_cp
                            .changed
                            .iter()
                            .filter_map(|k| state.get(k).map(|v| (k.clone(), v.clone())))
                            .collect();
                        self.events.send(Event::StateUpdate { step, values: changed });
                    }
                    let mut after = deferred;
                    after.push(Event::StepEnd {
                        step,
                        checkpoint_id: next_cp.checkpoint_id.clone(),
                        duration_ms: step_started.elapsed().as_secs_f64() * 1000.0,
                    });
                    persister.put_checkpoint(&next_cp, values, after)?;
                    let after: Vec<String> = next_cp
                        .ran
                        .iter()
                        .filter(|n| self.node_spec(n).is_some_and(|s| s.common().interrupt_after))
                        .cloned()
                        .collect();
                    cp = next_cp;
                    pending = Vec::new();
                    if !after.is_empty() && !cp.next.is_empty() {
                        interrupts.push(self.pause(&persister, &thread.thread_id, &cp, "after", &after)?);
                        status = Status::Interrupted;
                        break;
                    }
                }
                Err(message) => {
                    // The tasks did finish: keep their writes so that a fixed workflow resumes
                    // without running them again.
                    self.keep_writes(&persister, &shared.thread_id, &cp, &pending, &outcomes)?;
                    for e in deferred {
                        self.events.send(e);
                    }
                    status = Status::Failed;
                    error = Some(message);
                    break;
                }
            }
        }
        persister.finish()?;
        let thread_status = match status {
            Status::Done => ThreadStatus::Done,
            Status::Interrupted => ThreadStatus::Interrupted,
            Status::Failed => ThreadStatus::Failed,
            Status::Cancelled => ThreadStatus::Running,
        };
        // Fenced too: a run that lost its lease does not report over its successor's status.
        self.store.put_batch(vec![
            Put::Fence(shared.fence.clone()),
            Put::Status {
                thread_id: thread.thread_id.clone(),
                status: thread_status,
            },
        ])?;
        if let Some(e) = &error {
            self.events.send(Event::Error {
                node: None,
                class: None,
                message: e.clone(),
            });
        }
        self.events.send(Event::RunEnd {
            status: status.as_str().into(),
            steps: cp.step + 1,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            usage: meta.usage,
        });
        Ok(RunOutcome {
            thread_id: thread.thread_id,
            status,
            output: self.output(&state),
            state,
            interrupt: interrupts.first().cloned(),
            interrupts,
            error,
            steps: cp.step + 1,
            usage: meta.usage,
        })
    }

    /// Stops durably before or after `nodes` (`interrupt_before` / `interrupt_after`): the
    /// pause is recorded against the checkpoint the run will continue from.
    fn pause(
        &self,
        persister: &Persister,
        thread_id: &str,
        cp: &Checkpoint,
        kind: &str,
        nodes: &[String],
    ) -> Result<Value, EngineError> {
        let payload = json!({"kind": kind, "nodes": nodes});
        let task_id = if kind == "after" { AFTER } else { BEFORE };
        let record = PendingWrite {
            task_id: task_id.into(),
            idx: IDX_INTERRUPT,
            channel: INTERRUPT.into(),
            value: payload.clone(),
        };
        persister.write_now(vec![Put::Writes {
            thread_id: thread_id.into(),
            checkpoint_id: cp.checkpoint_id.clone(),
            writes: vec![record],
        }])?;
        self.events.send(Event::Interrupt {
            node: nodes.join(","),
            task_id: task_id.into(),
            payload: payload.clone(),
        });
        Ok(json!({"node": nodes[0], "task_id": task_id, "kind": kind, "payload": payload}))
    }

    fn node_spec(&self, name: &str) -> Option<&NodeSpec> {
        self.plan.node_by_name(name).map(|ix| &self.plan.nodes[&ix].spec)
    }

    fn output(&self, state: &Map<String, Value>) -> Value {
        match &self.plan.output {
            Some(keys) => Value::Object(
                keys.iter()
                    .map(|k| (k.clone(), state.get(k).cloned().unwrap_or(Value::Null)))
                    .collect(),
            ),
            None => Value::Object(state.clone()),
        }
    }

    /// Opens (or creates) the thread and returns its latest checkpoint. The thread and its
    /// first checkpoint are written together; a thread stored without one (by an older build
    /// killed in between) starts from its recorded input.
    fn open(&self, req: &RunRequest, id: String, fence: &Fence) -> Result<(Thread, Checkpoint, bool), EngineError> {
        if let Some(thread) = self.store.get_thread(&id)? {
            let cp = match self.store.get_checkpoint(&id, None)? {
                Some(cp) => cp,
                None => {
                    let (cp, values) = self.initial_checkpoint(&thread, run_limit(req, &self.plan))?;
                    self.store.put_batch(vec![
                        Put::Fence(fence.clone()),
                        Put::Checkpoint(Box::new(cp.clone()), values),
                    ])?;
                    cp
                }
            };
            if thread.plan_hash != self.plan.hash && !req.force {
                self.check_compatible(&cp)?;
            }
            if let Some(input) = &req.input {
                return self.new_turn(thread, cp, input, fence, run_limit(req, &self.plan));
            }
            return Ok((thread, cp, true));
        }
        let input = with_defaults(
            self.plan.input_schema.as_ref(),
            req.input.clone().unwrap_or_else(|| json!({})),
        );
        check_schema(self.plan.input_schema.as_ref(), &input, "input")?;
        let context = req.context.clone().unwrap_or_else(|| json!({}));
        check_schema(self.plan.context_schema.as_ref(), &context, "context")?;
        let mut overrides = json!({});
        for (path, value) in &req.config {
            set_path(&mut overrides, path, value.clone(), &self.plan.config)?;
        }
        let now = crate::clock::now();
        let thread = Thread {
            thread_id: id,
            workflow: req.workflow.clone(),
            plan_hash: self.plan.hash.clone(),
            input,
            context,
            config: overrides,
            status: ThreadStatus::Running,
            created_at: now.clone(),
            updated_at: now.clone(),
            forked_from: None,
        };
        let (cp, values) = self.initial_checkpoint(&thread, run_limit(req, &self.plan))?;
        self.store
            .create_thread_with_checkpoint(Some(fence), &thread, &cp, values)?;
        Ok((thread, cp, false))
    }

    /// A thread's first checkpoint: the state's defaults, and what START schedules.
    fn initial_checkpoint(&self, thread: &Thread, limit: i64) -> Result<(Checkpoint, NewValues), EngineError> {
        let mut state = Map::new();
        let mut versions = BTreeMap::new();
        let mut values = Vec::new();
        for (key, channel) in &self.plan.state {
            state.insert(key.clone(), channel.default.clone());
            versions.insert(key.clone(), 1);
            values.push((key.clone(), 1, channel.default.clone()));
        }
        let tasks = self.entry_tasks(thread, &thread.input, &state, -1, limit)?;
        let meta = Meta::default();
        let cp = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            thread_id: thread.thread_id.clone(),
            parent_id: None,
            step: -1,
            versions,
            ran: Vec::new(),
            changed: self.plan.state.keys().cloned().collect(),
            next: tasks,
            meta: serde_json::to_value(&meta).unwrap_or_default(),
            plan_hash: self.plan.hash.clone(),
            created_at: crate::clock::now(),
        };
        Ok((cp, values))
    }

    /// What START schedules, given a turn's input and the state.
    fn entry_tasks(
        &self,
        thread: &Thread,
        input: &Value,
        state: &Map<String, Value>,
        step: i64,
        limit: i64,
    ) -> Result<Vec<TaskSpec>, EngineError> {
        let config = effective_config(&self.plan.config, &thread.config);
        let scope = Scope::new(
            BTreeMap::from([
                ("input".to_string(), to_jinja(input)),
                ("config".to_string(), to_jinja(&config)),
                ("context".to_string(), to_jinja(&thread.context)),
                ("state".to_string(), values::map_to_jinja(state)),
                // Nothing has run yet: every step of the run is still to come.
                (
                    "run".to_string(),
                    values::run_value(&thread.thread_id, step, "START", limit),
                ),
            ]),
            Some(self.plan.clone()),
        )
        .into_value();
        let shared = Shared {
            outputs: self.outputs.clone(),
            plan: self.plan.clone(),
            store: self.store.clone(),
            services: self.services.clone(),
            events: Events::none(),
            thread_id: thread.thread_id.clone(),
            // Routing from START writes nothing.
            fence: Fence {
                thread_id: thread.thread_id.clone(),
                owner: String::new(),
                generation: 0,
            },
            force: false,
            end_step: step + 1 + limit,
        };
        let mut next = Vec::new();
        for b in &self.plan.entry {
            follow(&shared, b, &scope, &mut next)
                .map_err(|e| EngineError::Input(format!("routing from START: {}", e.message)))?;
        }
        Ok(self.schedule(next))
    }

    /// A new input on a finished thread starts a new turn (LangGraph's `invoke(input, thread)`):
    /// START runs again on the thread's state, with the new input.
    fn new_turn(
        &self,
        thread: Thread,
        cp: Checkpoint,
        input: &Value,
        fence: &Fence,
        limit: i64,
    ) -> Result<(Thread, Checkpoint, bool), EngineError> {
        if !cp.next.is_empty() {
            return Err(EngineError::Input(format!(
                "thread `{}` has work pending (it is interrupted or was cut off): continue it with `runner resume`, or fork it, before giving it new input",
                thread.thread_id
            )));
        }
        let input = with_defaults(self.plan.input_schema.as_ref(), input.clone());
        check_schema(self.plan.input_schema.as_ref(), &input, "input")?;
        let state = self.store.state(&thread.thread_id, &cp.versions)?;
        let step = cp.step + 1;
        let next = self.entry_tasks(&thread, &input, &state, step, limit)?;
        let mut meta: Meta = serde_json::from_value(cp.meta.clone()).unwrap_or_default();
        meta.input = Some(input);
        meta.barriers.clear();
        meta.turn = Usage::default();
        meta.node_usage.clear();
        let turn = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            parent_id: Some(cp.checkpoint_id.clone()),
            step,
            ran: Vec::new(),
            changed: Vec::new(),
            next,
            meta: serde_json::to_value(&meta).unwrap_or_default(),
            plan_hash: self.plan.hash.clone(),
            created_at: crate::clock::now(),
            ..cp
        };
        self.store.put_batch(vec![
            Put::Fence(fence.clone()),
            Put::Checkpoint(Box::new(turn.clone()), Vec::new()),
        ])?;
        Ok((thread, turn, true))
    }

    /// A thread made by another version of the workflow may go on only if its state and
    /// scheduled nodes still exist.
    fn check_compatible(&self, cp: &Checkpoint) -> Result<(), EngineError> {
        let missing_keys: Vec<&String> = cp
            .versions
            .keys()
            .filter(|k| !self.plan.state.contains_key(*k))
            .collect();
        let missing_nodes: Vec<&String> = cp
            .next
            .iter()
            .map(|t| &t.node)
            .filter(|n| self.plan.node_by_name(n).is_none())
            .collect();
        if missing_keys.is_empty() && missing_nodes.is_empty() {
            return Ok(());
        }
        let mut why = Vec::new();
        if !missing_keys.is_empty() {
            why.push(format!("state keys {} are gone", list(&missing_keys)));
        }
        if !missing_nodes.is_empty() {
            why.push(format!("scheduled nodes {} are gone", list(&missing_nodes)));
        }
        Err(EngineError::Incompatible(format!(
            "the workflow changed since this thread started and its stored state no longer fits: {}; pass --force to continue anyway, or start a new thread",
            why.join(" and ")
        )))
    }

    /// Every value read back must fit its key's schema, as every value written did: a corrupt
    /// or hand-edited one is named here rather than failing somewhere later.
    fn check_stored(&self, thread: &str, state: &Map<String, Value>) -> Result<(), EngineError> {
        for (key, value) in state {
            if let Some(why) = self
                .validators
                .get(key)
                .and_then(|v| crate::compile::schemas::first_violation(v, value))
            {
                return Err(EngineError::StoredValue {
                    thread: thread.into(),
                    key: key.clone(),
                    why,
                });
            }
        }
        Ok(())
    }

    /// Runs the step's tasks: those already finished before a crash are taken from their stored
    /// writes; the others run concurrently, each storing its writes as it finishes.
    #[allow(clippy::too_many_arguments)]
    async fn run_step(
        &self,
        shared: &Arc<Shared>,
        cp: &Checkpoint,
        pending: &[PendingWrite],
        base: Arc<Scope>,
        step: i64,
        persister: &Persister,
        meta: &Meta,
    ) -> Result<(Vec<(TaskSpec, StepResult)>, Vec<Event>), EngineError> {
        let mut results: Vec<Option<StepResult>> = vec![None; cp.next.len()];
        let mut set = JoinSet::new();
        let mut to_run = Vec::new();
        for (i, t) in cp.next.iter().enumerate() {
            if let Some(done) = cached(pending, &t.task_id, &self.plan, shared.force) {
                let done = done.map_err(EngineError::Incompatible)?;
                self.events.send(Event::NodeEnd {
                    step,
                    node: t.node.clone(),
                    task_id: t.task_id.clone(),
                    duration_ms: 0.0,
                    keys: done.writes.iter().map(|(k, _)| k.clone()).collect(),
                    cached: true,
                });
                results[i] = Some(StepResult::Done(done));
                continue;
            }
            let Some(ix) = self.plan.node_by_name(&t.node) else {
                results[i] = Some(StepResult::Failed(NodeError::invalid(format!(
                    "node `{}` is not in this workflow",
                    t.node
                ))));
                continue;
            };
            let resume = pending
                .iter()
                .find(|w| w.task_id == t.task_id && w.channel == RESUME)
                .map(|w| {
                    let to = pending
                        .iter()
                        .find(|r| r.task_id == t.task_id && r.channel == RESUME_TO)
                        .and_then(|r| r.value.as_str().map(str::to_string));
                    (w.value.clone(), to)
                });
            to_run.push((i, ix, resume, self.spent(&t.node, meta)));
        }
        // A task's future is made when it starts, not before: a fan-out of a thousand holds a
        // thousand of them, so they are not also kept in a list.
        type Resume = Option<(Value, Option<String>)>;
        let start = |(i, ix, resume, spent): (usize, NodeIx, Resume, Option<NodeError>)| {
            let t = &cp.next[i];
            let fut = task::run(
                shared.clone(),
                ix,
                t.task_id.clone(),
                t.item.clone(),
                base.clone(),
                step,
                resume,
                spent,
            );
            // `map`, not an async block: a block awaiting a captured future keeps two copies.
            fut.map(move |out| (i, out))
        };
        // One task runs in place; several run on the runtime's workers, in parallel.
        let mut inline = if to_run.len() == 1 {
            to_run.pop().map(start)
        } else {
            None
        };
        for args in to_run {
            set.spawn(start(args));
        }
        let mut remaining = set.len() + usize::from(inline.is_some());
        let mut deferred = Vec::new();
        loop {
            let joined = match inline.take() {
                Some(fut) => Ok(fut.await),
                None => match set.join_next().await {
                    Some(joined) => joined,
                    None => break,
                },
            };
            remaining -= 1;
            let (i, (outcome, duration_ms)) = match joined {
                Ok(r) => r,
                Err(e) => {
                    return Err(EngineError::Store(checkpoint::CheckpointError::Backend(format!(
                        "a task panicked: {e}"
                    ))));
                }
            };
            let t = &cp.next[i];
            let end = |keys: Vec<String>| Event::NodeEnd {
                step,
                node: t.node.clone(),
                task_id: t.task_id.clone(),
                duration_ms,
                keys,
                cached: false,
            };
            let result = match outcome {
                Outcome::Done(done) => {
                    // The last task of a step is stored with the step's checkpoint, one commit
                    // for both; earlier ones are stored now so a crash cannot lose them. Either
                    // way `node_end` follows the commit.
                    let event = end(done.writes.iter().map(|(k, _)| k.clone()).collect());
                    if remaining > 0 {
                        let writes = encode(&t.task_id, &done, &self.plan);
                        tokio::task::block_in_place(|| {
                            persister.put_writes(&shared.thread_id, &cp.checkpoint_id, writes, vec![event])
                        })?;
                    } else {
                        deferred.push(event);
                    }
                    StepResult::Done(done)
                }
                Outcome::Interrupt(payload) => {
                    let mut payload = payload;
                    if let Value::Object(m) = &mut payload {
                        m.insert("thread_id".into(), Value::String(shared.thread_id.clone()));
                    }
                    let mut writes = vec![PendingWrite {
                        task_id: t.task_id.clone(),
                        idx: IDX_INTERRUPT,
                        channel: INTERRUPT.into(),
                        value: payload.clone(),
                    }];
                    // An answered task that stops again (a subgraph at its next gate) has used
                    // its answer: it is kept as a record, not passed again.
                    if let Some(answer) = pending.iter().find(|w| w.task_id == t.task_id && w.channel == RESUME) {
                        writes.push(PendingWrite {
                            channel: RESUMED.into(),
                            ..answer.clone()
                        });
                    }
                    persister.write_now(vec![Put::Writes {
                        thread_id: shared.thread_id.clone(),
                        checkpoint_id: cp.checkpoint_id.clone(),
                        writes,
                    }])?;
                    self.events.send(Event::Interrupt {
                        node: t.node.clone(),
                        task_id: t.task_id.clone(),
                        payload: payload.clone(),
                    });
                    self.events.send(end(Vec::new()));
                    StepResult::Interrupt(payload)
                }
                Outcome::Failed(e) => {
                    self.events.send(end(Vec::new()));
                    StepResult::Failed(e)
                }
            };
            results[i] = Some(result);
        }
        let mut out = Vec::new();
        for (t, r) in cp.next.iter().zip(results) {
            if let Some(r) = r {
                out.push((t.clone(), r));
            }
        }
        // A step that stops (failure, interrupt) keeps its finished tasks' writes: the last one
        // to finish was not stored yet.
        if out.iter().any(|(_, r)| !matches!(r, StepResult::Done(_))) {
            self.keep_writes(persister, &shared.thread_id, cp, pending, &out)?;
            for e in deferred.drain(..) {
                self.events.send(e);
            }
        }
        Ok((out, deferred))
    }

    /// Stores the writes of finished tasks that are not stored yet.
    fn keep_writes(
        &self,
        persister: &Persister,
        thread: &str,
        cp: &Checkpoint,
        pending: &[PendingWrite],
        outcomes: &[(TaskSpec, StepResult)],
    ) -> Result<(), EngineError> {
        let writes: Vec<PendingWrite> = outcomes
            .iter()
            .filter_map(|(t, r)| match r {
                StepResult::Done(done) if !pending.iter().any(|w| w.task_id == t.task_id && w.channel == DONE) => {
                    Some(encode(&t.task_id, done, &self.plan))
                }
                _ => None,
            })
            .flatten()
            .collect();
        persister.write_now(vec![Put::Writes {
            thread_id: thread.into(),
            checkpoint_id: cp.checkpoint_id.clone(),
            writes,
        }])?;
        Ok(())
    }

    /// Applies a step's writes in plan order through the reducers, checks them, and schedules
    /// the next step. Returns the new checkpoint and the values it introduces.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        shared: &Shared,
        cp: &Checkpoint,
        state: &mut Map<String, Value>,
        meta: &mut Meta,
        outcomes: &[(TaskSpec, StepResult)],
        constants: &Arc<Scope>,
        step: i64,
    ) -> Result<(Checkpoint, NewValues, minijinja::Value), String> {
        let order = |t: &TaskSpec| {
            let pos = self
                .plan
                .node_by_name(&t.node)
                .and_then(|ix| self.plan.nodes.get_index_of(&ix))
                .unwrap_or(usize::MAX);
            let n: usize = t
                .task_id
                .rsplit_once('#')
                .and_then(|(_, n)| n.parse().ok())
                .unwrap_or(0);
            (pos, n)
        };
        let mut done: Vec<(&TaskSpec, &task::Done)> = outcomes
            .iter()
            .filter_map(|(t, r)| match r {
                StepResult::Done(d) => Some((t, d)),
                _ => None,
            })
            .collect();
        done.sort_by_key(|(t, _)| order(t));
        let mut updates: BTreeMap<&str, Vec<(&str, &Value)>> = BTreeMap::new();
        for (t, d) in &done {
            for (k, v) in &d.writes {
                updates.entry(k.as_str()).or_default().push((t.node.as_str(), v));
            }
            meta.usage.add(&d.usage);
            meta.turn.add(&d.usage);
            if self.node_spec(&t.node).is_some_and(|s| s.common().budget.is_some()) {
                meta.node_usage.entry(t.node.clone()).or_default().add(&d.usage);
            }
        }
        let mut new_values = Vec::new();
        let mut versions = cp.versions.clone();
        let mut changed = Vec::new();
        let mut computed: Vec<(String, Value)> = Vec::with_capacity(updates.len());
        for (key, writes) in &updates {
            let Some(channel) = self.plan.state.get(*key) else {
                return Err(format!(
                    "node `{}` wrote `{key}`, which is not a state key",
                    writes[0].0
                ));
            };
            if !channel.reducer.combines() && writes.len() > 1 {
                let nodes: Vec<&str> = writes.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "write conflict: {} wrote `{key}` in the same superstep, and `{key}` has no reducer (give it one, e.g. `reducer: append`)",
                    nodes.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(" and ")
                ));
            }
            let current = state.get(*key).unwrap_or(&Value::Null);
            let value = values::reduce(
                &self.plan,
                &channel.reducer,
                current,
                writes.iter().map(|(_, v)| (*v).clone()).collect(),
            )
            .map_err(|e| format!("`{key}`: {e}"))?;
            if let Some(why) = self
                .validators
                .get(*key)
                .and_then(|v| crate::compile::schemas::first_violation(v, &value))
            {
                return Err(format!(
                    "the new value of `{key}` (written by `{}`) does not match its schema: {why}",
                    writes[0].0
                ));
            }
            let version = versions.get(*key).copied().unwrap_or(0) + 1;
            versions.insert(key.to_string(), version);
            changed.push(key.to_string());
            // Append-only keys store what the step added, extending the previous version; a full
            // value every `MAX_CHAIN` versions keeps reads short. (`exit` mode commits only the
            // last checkpoint: its persister folds the extensions of skipped versions together.)
            let added = match (&channel.reducer, current, &value) {
                (Reducer::Append | Reducer::Extend | Reducer::Union, Value::Array(old), Value::Array(new))
                    if new.len() >= old.len() =>
                {
                    let chain = meta.chains.entry(key.to_string()).or_insert(0);
                    if *chain < MAX_CHAIN {
                        *chain += 1;
                        Some(new[old.len()..].to_vec())
                    } else {
                        *chain = 0;
                        None
                    }
                }
                _ => None,
            };
            let stored = match added {
                Some(items) => checkpoint::extension(version - 1, items),
                None => value.clone(),
            };
            new_values.push((key.to_string(), version, stored));
            computed.push((key.to_string(), value));
        }
        // Routing sees the state after the step; if routing fails, the step did not happen.
        let previous: Vec<(String, Option<Value>)> = computed
            .into_iter()
            .map(|(k, v)| (k.clone(), state.insert(k, v)))
            .collect();
        let restore = |state: &mut Map<String, Value>| {
            for (k, old) in &previous {
                match old {
                    Some(v) => state.insert(k.clone(), v.clone()),
                    None => state.remove(k),
                };
            }
        };
        let state_value = values::map_to_jinja(state);
        let after_step = Arc::new(Scope::over(
            constants,
            BTreeMap::from([("state".to_string(), state_value.clone())]),
            Some(self.plan.clone()),
        ));
        let mut next: Vec<Next> = Vec::new();
        let mut ran = Vec::new();
        for (t, d) in &done {
            ran.push(t.node.clone());
            if self.node_spec(&t.node).is_some_and(|n| n.common().max_visits.is_some()) {
                *meta.visits.entry(t.node.clone()).or_insert(0) += 1;
            }
            let Some(ix) = self.plan.node_by_name(&t.node) else {
                continue;
            };
            next.extend(d.next.iter().cloned());
            if d.handled {
                continue;
            }
            let run = values::run_value(&shared.thread_id, step, &t.node, shared.end_step - step - 1);
            let scope = Arc::new(after_step.with([("run".to_string(), run)])).value();
            for b in &self.plan.nodes[&ix].branches {
                if let Err(e) = follow(shared, b, &scope, &mut next) {
                    restore(state);
                    return Err(format!("routing after `{}`: {}", t.node, e.message));
                }
            }
            for (j, (sources, target)) in self.plan.joins.iter().enumerate() {
                if sources.contains(&ix) {
                    let barrier = meta.barriers.entry(j).or_default();
                    barrier.insert(t.node.clone());
                    if sources.iter().all(|s| barrier.contains(self.plan.name_of(*s))) {
                        barrier.clear();
                        next.push(match target {
                            Target::Node(n) => Next::Node(*n),
                            Target::End => Next::End,
                        });
                    }
                }
            }
        }
        ran.dedup();
        let tasks = self.schedule(next);
        let cp = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            thread_id: shared.thread_id.clone(),
            parent_id: Some(cp.checkpoint_id.clone()),
            step,
            versions,
            ran,
            changed,
            next: tasks,
            meta: serde_json::to_value(&*meta).unwrap_or_default(),
            plan_hash: self.plan.hash.clone(),
            created_at: crate::clock::now(),
        };
        Ok((cp, new_values, state_value))
    }

    /// Turns successors into the next step's tasks: a node triggered several times runs once;
    /// each fan-out item is its own task; tasks are ordered by the plan.
    fn schedule(&self, next: Vec<Next>) -> Vec<TaskSpec> {
        let mut plain: BTreeSet<usize> = BTreeSet::new();
        let mut sends: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
        for n in next {
            match n {
                Next::End => {}
                Next::Node(ix) => {
                    plain.insert(self.plan.nodes.get_index_of(&ix).unwrap_or(usize::MAX));
                }
                Next::Send(ix, item) => sends
                    .entry(self.plan.nodes.get_index_of(&ix).unwrap_or(usize::MAX))
                    .or_default()
                    .push(item),
            }
        }
        let mut tasks = Vec::new();
        let positions: BTreeSet<usize> = plain.iter().chain(sends.keys()).copied().collect();
        for pos in positions {
            let Some((_, node)) = self.plan.nodes.get_index(pos) else {
                continue;
            };
            if plain.contains(&pos) {
                tasks.push(TaskSpec {
                    task_id: node.name.clone(),
                    node: node.name.clone(),
                    item: None,
                });
            }
            for (i, item) in sends.remove(&pos).unwrap_or_default().into_iter().enumerate() {
                tasks.push(TaskSpec {
                    task_id: format!("{}#{i}", node.name),
                    node: node.name.clone(),
                    item: Some(item),
                });
            }
        }
        tasks
    }

    /// A node about to run more often than its `max_visits` fails the step before it runs.
    /// Why node `name` may not call a model in this step: a budget of the turn, or of the node,
    /// is spent. Only llm nodes are held back; the others run on.
    fn spent(&self, name: &str, meta: &Meta) -> Option<NodeError> {
        let spec = self.node_spec(name)?;
        if !matches!(spec, crate::spec::NodeSpec::Llm(_)) {
            return None;
        }
        let why = spent_by(&self.plan.budget, &meta.turn, "limits").or_else(|| {
            let budget = spec.common().budget.as_ref()?;
            let used = meta.node_usage.get(name).copied().unwrap_or_default();
            spent_by(budget, &used, &format!("the budget of `{name}`"))
        })?;
        Some(NodeError::new(crate::error_class::ErrorClass::Budget, why))
    }

    fn over_visits(&self, cp: &Checkpoint, meta: &Meta) -> Option<String> {
        let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
        for t in &cp.next {
            *counts.entry(t.node.as_str()).or_default() += 1;
        }
        counts.into_iter().find_map(|(node, n)| {
            let max = self.node_spec(node)?.common().max_visits?;
            let total = meta.visits.get(node).copied().unwrap_or(0) + n;
            (total > max).then(|| format!("node `{node}` would run {total} times, more than its max_visits of {max}"))
        })
    }
}

#[derive(Debug, Clone)]
enum StepResult {
    Done(task::Done),
    Interrupt(Value),
    Failed(NodeError),
}

/// Which cap of `budget` (named `owner` in the message) `used` has reached, if any.
fn spent_by(budget: &crate::spec::Budget, used: &Usage, owner: &str) -> Option<String> {
    if let Some(max) = budget.max_cost
        && used.cost >= max
    {
        return Some(format!(
            "{owner}: max_cost of {max} is spent ({:.4} used); raise it, or handle the `budget` error with on_error",
            used.cost
        ));
    }
    if let Some(max) = budget.max_tokens
        && used.total_tokens >= max
    {
        return Some(format!(
            "{owner}: max_tokens of {max} is spent ({} used); raise it, or handle the `budget` error with on_error",
            used.total_tokens
        ));
    }
    if let Some(max) = budget.max_llm_calls
        && used.calls >= max
    {
        return Some(format!(
            "{owner}: max_llm_calls of {max} is spent ({} made); raise it, or handle the `budget` error with on_error",
            used.calls
        ));
    }
    None
}

fn is_zero(u: &Usage) -> bool {
    *u == Usage::default()
}

/// Where a branch leads, evaluated in `scope` (the state after the step).
fn follow(shared: &Shared, b: &Branch, scope: &minijinja::Value, next: &mut Vec<Next>) -> Result<(), NodeError> {
    match b {
        Branch::Always(ts) => next.extend(ts.iter().map(|t| match t {
            Target::Node(n) => Next::Node(*n),
            Target::End => Next::End,
        })),
        Branch::Route(clauses) => next.extend(task::choose(shared, clauses, scope)?),
        Branch::Send(s) => {
            let items = values::eval(&shared.plan, s.foreach, scope).map_err(NodeError::invalid)?;
            let Value::Array(items) = items else {
                return Err(NodeError::invalid("a fan-out's `foreach` did not yield an array"));
            };
            next.extend(items.into_iter().map(|i| Next::Send(s.to, i)));
        }
    }
    Ok(())
}

/// A finished task's result as one stored write: its state writes, the successors it chose
/// (by node name: indices shift when the workflow is edited), whether its error handler took
/// over, and its usage.
fn encode(task_id: &str, done: &task::Done, plan: &Plan) -> Vec<PendingWrite> {
    let next: Vec<Value> = done
        .next
        .iter()
        .map(|n| match n {
            Next::Node(ix) => json!({"to": plan.name_of(*ix)}),
            Next::End => json!({"end": true}),
            Next::Send(ix, item) => json!({"send": plan.name_of(*ix), "item": item}),
        })
        .collect();
    let writes: Vec<Value> = done.writes.iter().map(|(k, v)| json!([k, v])).collect();
    let mut value = json!({"writes": writes});
    if !next.is_empty() {
        value["next"] = Value::Array(next);
    }
    if done.handled {
        value["handled"] = Value::Bool(true);
    }
    if done.usage.calls > 0 {
        value["usage"] = serde_json::to_value(done.usage).unwrap_or_default();
    }
    vec![PendingWrite {
        task_id: task_id.into(),
        idx: IDX_DONE,
        channel: DONE.into(),
        value,
    }]
}

/// A task finished before (its result stored), decoded. A successor whose node is gone from
/// the workflow is an error, or dropped with `force`.
fn cached(pending: &[PendingWrite], task_id: &str, plan: &Plan, force: bool) -> Option<Result<task::Done, String>> {
    let w = pending.iter().find(|w| w.task_id == task_id && w.channel == DONE)?;
    Some(decode(w, plan, force))
}

fn decode(w: &PendingWrite, plan: &Plan, force: bool) -> Result<task::Done, String> {
    let mut done = task::Done::default();
    for pair in w.value.get("writes").and_then(Value::as_array).into_iter().flatten() {
        if let (Some(k), Some(v)) = (pair.get(0).and_then(Value::as_str), pair.get(1)) {
            done.writes.push((k.to_string(), v.clone()));
        }
    }
    done.handled = w.value.get("handled").and_then(Value::as_bool).unwrap_or(false);
    done.usage = w
        .value
        .get("usage")
        .and_then(|u| serde_json::from_value(u.clone()).ok())
        .unwrap_or_default();
    // Names; databases written by earlier builds hold plan indices (and `"to": "END"`).
    let to_ix = |v: &Value| -> Result<Option<NodeIx>, String> {
        match v {
            Value::String(name) => match plan.node_by_name(name) {
                Some(ix) => Ok(Some(ix)),
                None if force => Ok(None),
                None => Err(format!(
                    "the workflow changed since task `{}` finished: the node `{name}` it chose next is gone; pass --force to continue without it, or start a new thread",
                    w.task_id
                )),
            },
            _ => Ok(v
                .as_u64()
                .map(|i| petgraph::stable_graph::NodeIndex::new(i as usize))
                .filter(|ix| plan.nodes.contains_key(ix))),
        }
    };
    for n in w.value.get("next").and_then(Value::as_array).into_iter().flatten() {
        if n.get("end").is_some() || n.get("to") == Some(&json!("END")) {
            done.next.push(Next::End);
        } else if let Some(to) = n.get("to") {
            done.next.extend(to_ix(to)?.map(Next::Node));
        } else if let Some(to) = n.get("send") {
            let item = n.get("item").cloned().unwrap_or(Value::Null);
            done.next.extend(to_ix(to)?.map(|ix| Next::Send(ix, item)));
        }
    }
    Ok(done)
}

/// The plan's config with a thread's overrides merged in.
/// The most supersteps the run may take: the request's `--recursion-limit`, else the plan's.
fn run_limit(req: &RunRequest, plan: &Plan) -> i64 {
    i64::from(req.recursion_limit.unwrap_or(plan.recursion_limit))
}

fn effective_config(base: &Value, overrides: &Value) -> Value {
    let mut out = base.clone();
    merge(&mut out, overrides);
    out
}

fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// Sets `a.b.c` in `target` to `value`; the path must exist in the workflow's config.
fn set_path(target: &mut Value, path: &str, value: Value, known: &Value) -> Result<(), EngineError> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut k = known;
    for (i, p) in parts.iter().enumerate() {
        match k.get(p) {
            Some(next) => k = next,
            None => {
                let siblings: Vec<&str> = k
                    .as_object()
                    .map(|m| m.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                let hint = crate::diag::did_you_mean(p, siblings.iter().copied())
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                return Err(EngineError::Input(format!(
                    "--set {path}: `{}` is not in the workflow's config{hint}",
                    parts[..=i].join(".")
                )));
            }
        }
    }
    let mut cur = target;
    for p in &parts[..parts.len() - 1] {
        if !cur.is_object() {
            *cur = json!({});
        }
        cur = cur
            .as_object_mut()
            .map(|m| m.entry(p.to_string()).or_insert_with(|| json!({})))
            .unwrap_or_else(|| unreachable!("made an object above"));
    }
    if let Value::Object(m) = cur {
        m.insert(parts[parts.len() - 1].to_string(), value);
    }
    Ok(())
}

/// The input with the defaults its schema gives for absent top-level properties.
fn with_defaults(schema: Option<&Value>, input: Value) -> Value {
    let (Some(props), Value::Object(mut map)) = (
        schema.and_then(|s| s.get("properties")).and_then(Value::as_object),
        input.clone(),
    ) else {
        return input;
    };
    for (name, prop) in props {
        if let Some(default) = prop.get("default")
            && !map.contains_key(name)
        {
            map.insert(name.clone(), default.clone());
        }
    }
    Value::Object(map)
}

fn check_schema(schema: Option<&Value>, value: &Value, what: &str) -> Result<(), EngineError> {
    let Some(schema) = schema else {
        return match value {
            Value::Object(m) if m.is_empty() => Ok(()),
            _ => Err(EngineError::Input(format!(
                "the workflow declares no `{what}`, but one was given"
            ))),
        };
    };
    let v = jsonschema::draft202012::new(schema).map_err(|e| EngineError::Input(format!("{what} schema: {e}")))?;
    let errors: Vec<String> = v
        .iter_errors(value)
        .map(|e| {
            let at = e.instance_path().as_str().to_string();
            if at.is_empty() {
                e.masked().to_string()
            } else {
                format!("`{}`: {}", at.trim_start_matches('/'), e.masked())
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(EngineError::Input(format!("{what}: {}", errors.join("; "))))
    }
}

fn list(items: &[&String]) -> String {
    items.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
}
