//! The thread lifecycle: what a run is asked to do with its thread (the entry points), opening
//! or creating the thread under its lease, new turns, whether a stored thread still fits the
//! workflow, and a new thread's input, context and config with their defaults.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::events::{Event, Events};
use super::persist::Persister;
use super::values::{self, Scope, to_jinja};
use super::{DONE, Engine, EngineError, Meta, NewValues, Run, RunRequest, Shared, Source, follow};
use crate::checkpoint::{self, Checkpoint, Fence, Put, TaskSpec, Thread, ThreadStatus};
use crate::providers::Usage;

/// A new thread.
#[derive(Debug, Clone, Default)]
pub struct Start {
    /// The new thread's id (none: a UUIDv7).
    pub thread_id: Option<String>,
    /// The workflow path recorded with the thread.
    pub workflow: String,
    /// The input (none: `{}`); its schema's defaults fill absent properties.
    pub input: Option<Value>,
    /// The context (none: `{}`).
    pub context: Option<Value>,
    /// `--set path=value` overrides of `config`, recorded with the thread.
    pub config: Vec<(String, Value)>,
}

/// The answer to a pending interrupt.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Which gate it is for (its task id or its node, `<task>/<gate>` inside a subgraph),
    /// when several wait.
    pub to: Option<String>,
    pub value: Value,
}

/// What a run does with its thread. Whether the thread exists is found out once, in
/// [`Engine::open`], under the thread's lease.
pub(super) struct Entry {
    pub(super) thread_id: Option<String>,
    /// How to create the thread when it does not exist (none: it must exist).
    pub(super) create: Option<Start>,
    /// The thread must not exist yet.
    pub(super) only_new: bool,
    /// On an existing thread, a new turn with this input.
    pub(super) new_turn: Option<Value>,
    pub(super) answer: Option<Answer>,
    /// Answers to other gates of the same step, taken with `answer`.
    pub(super) more_answers: Vec<Answer>,
    /// An answer for a thread this run creates is dropped rather than refused.
    pub(super) drop_answer_if_new: bool,
    /// The checkpoint to go on from (none: the latest); an older one forks the thread there.
    pub(super) at: Option<String>,
    /// The thread and its head, read by a caller whose claim holds the lease.
    pub(super) seen: Option<Box<super::Seen>>,
}

impl Entry {
    pub(super) fn start(start: Start) -> Entry {
        Entry {
            thread_id: start.thread_id.clone(),
            create: Some(start),
            only_new: true,
            new_turn: None,
            answer: None,
            more_answers: Vec::new(),
            drop_answer_if_new: false,
            at: None,
            seen: None,
        }
    }

    pub(super) fn existing(thread_id: &str) -> Entry {
        Entry {
            thread_id: Some(thread_id.to_string()),
            create: None,
            only_new: false,
            new_turn: None,
            answer: None,
            more_answers: Vec::new(),
            drop_answer_if_new: false,
            at: None,
            seen: None,
        }
    }

    pub(super) fn start_or_continue(start: Start, answer: Option<Answer>) -> Entry {
        Entry {
            only_new: false,
            answer,
            drop_answer_if_new: true,
            ..Entry::start(start)
        }
    }
}

impl From<RunRequest> for Entry {
    fn from(req: RunRequest) -> Entry {
        // Read under the lease only when the caller's claim holds it.
        let seen = req
            .seen
            .filter(|_| matches!(req.lease, super::LeasePolicy::Claimed { .. }));
        Entry {
            seen,
            thread_id: req.thread_id.clone(),
            only_new: false,
            new_turn: req.input.clone(),
            more_answers: req
                .more_answers
                .into_iter()
                .map(|(to, value)| Answer { to: Some(to), value })
                .collect(),
            answer: req.answer.map(|value| Answer {
                to: req.answer_to,
                value,
            }),
            drop_answer_if_new: false,
            at: req.checkpoint_id,
            create: Some(Start {
                thread_id: req.thread_id,
                workflow: req.workflow,
                input: req.input,
                context: req.context,
                config: req.config,
            }),
        }
    }
}

impl Engine {
    /// Opens (or creates) the thread, reads its state and stored records, takes the answer
    /// the entry gives, and marks the thread running. A turn this run starts (a new thread's,
    /// or new input's) is written with the thread's status, in one commit, and its state and
    /// records are what the turn made: nothing is read back.
    pub(super) fn begin(&self, entry: &Entry, thread_id: String, fence: &Fence) -> Result<Run, EngineError> {
        let Opened {
            thread,
            cp,
            resumed,
            made,
        } = self.open(entry, thread_id, fence)?;
        let limit = self.limit();
        // The limit counts the supersteps of this run, as LangGraph's does per invocation.
        let first_step = cp.step + 1;
        let shared = Arc::new(Shared {
            fence: fence.clone(),
            force: self.options.force,
            as_child: self.options.as_child,
            end_step: first_step + limit,
            validators: self.node_validators.clone(),
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
            checkpoint_id: cp.checkpoint_id.clone(),
        });
        let mut config = effective_config(self.plan.config(), &thread.config);
        for (path, value) in &self.options.run_config {
            set_path(&mut config, path, value.clone(), self.plan.config())?;
        }
        if let Some(context) = &self.options.run_context {
            check_schema(self.plan.context_schema(), context, "context")?;
        }
        let context = self.options.run_context.as_ref().unwrap_or(&thread.context);
        let meta: Meta = serde_json::from_value(cp.meta.clone()).unwrap_or_default();
        let input = meta.input.clone().unwrap_or_else(|| thread.input.clone());
        let constants = Arc::new(Scope::new(
            BTreeMap::from([
                ("input".to_string(), to_jinja(&input)),
                ("config".to_string(), to_jinja(&config)),
                ("context".to_string(), to_jinja(context)),
            ]),
            None,
        ));
        let (state, pending, mut opening) = match made {
            // A checkpoint just made has no records yet.
            Some((state, puts)) => (state, Vec::new(), puts),
            None => (
                self.store.state(&thread.thread_id, &cp.versions)?,
                self.store.get_writes(&thread.thread_id, &cp.checkpoint_id)?,
                Vec::new(),
            ),
        };
        self.check_stored(&thread.thread_id, &state)?;
        // Finished tasks' records must fit this workflow before anything is written.
        for w in pending.iter().filter(|w| w.channel == DONE) {
            super::apply::decode(w, &self.plan, self.options.force)?;
        }
        let persister = Persister::new(
            self.store.clone(),
            self.options.persist,
            cp.checkpoint_id.clone(),
            fence.clone(),
            self.events.clone(),
        );
        // A failed run reported what the thread had spent up to its end; its steps up to the
        // last checkpoint are in this meta, and are not to be reported again.
        let reported = if thread.status == ThreadStatus::Failed {
            meta.usage
        } else {
            Usage::default()
        };
        let mut run = Run {
            started_with: meta.usage,
            status_written: None,
            reported,
            shared,
            state_view: values::StateView::new(&state),
            thread,
            cp: Arc::new(cp),
            state,
            meta,
            pending,
            constants,
            persister,
            skip_before: false,
            first_step,
            limit,
        };
        let answer = entry.answer.as_ref().filter(|_| resumed || !entry.drop_answer_if_new);
        let more: Vec<&Answer> = entry.more_answers.iter().filter(|_| resumed).collect();
        if (answer.is_some() || !more.is_empty()) && !opening.is_empty() {
            // An answer is stored against the checkpoint it answers: that one first.
            run.persister.write_now(std::mem::take(&mut opening))?;
        }
        // The other gates' answers first: the one `answer` addresses is then still waiting
        // (an answer is taken only while its gate waits).
        for more in more {
            self.take_answer(&mut run, Some(more))?;
        }
        self.take_answer(&mut run, answer)?;
        opening.push(Put::Status {
            thread_id: run.thread.thread_id.clone(),
            status: ThreadStatus::Running,
        });
        // A claimed run's turn is made again from its queued row if the process dies before
        // this is committed: its first step need not wait for it.
        let reproducible = matches!(self.options.lease, super::LeasePolicy::Claimed { .. });
        run.persister.write_opening(opening, reproducible)?;
        run.status_written = Some(ThreadStatus::Running);
        Ok(run)
    }

    /// Opens the thread the entry names, or makes it: its latest checkpoint, whether it
    /// existed, and the turn it starts, not yet written.
    fn open(&self, entry: &Entry, id: String, fence: &Fence) -> Result<Opened, EngineError> {
        let (found, head) = match entry.seen.as_deref() {
            Some(seen) => (seen.thread.clone(), seen.head.clone()),
            None => self.store.thread_and_head(&id)?,
        };
        if let Some(thread) = found {
            if entry.only_new {
                return Err(EngineError::Exists(id));
            }
            let answering = entry.answer.is_some();
            let (thread, cp, made) = self.reopen(
                thread,
                head,
                entry.new_turn.as_ref(),
                entry.at.as_deref(),
                answering,
                fence,
            )?;
            return Ok(Opened {
                thread,
                cp,
                resumed: true,
                made,
            });
        }
        let Some(start) = &entry.create else {
            return Err(EngineError::NoThread(id));
        };
        let thread = self.new_thread(start, id)?;
        let turn = self.first_turn(&thread, self.limit())?;
        let cp = turn.cp.clone();
        // The thread and its first checkpoints are written together.
        let state = turn.state.clone();
        let mut puts = vec![Put::Thread(Box::new(thread.clone()))];
        puts.extend(turn.puts());
        Ok(Opened {
            thread,
            cp,
            resumed: false,
            made: Some((state, puts)),
        })
    }

    /// An existing thread's latest checkpoint (`head`, read with the thread; or checkpoint
    /// `at`, which forks the thread when it is an older one), checked against this workflow;
    /// with `input`, the checkpoint of a new turn, not yet written. A thread stored without a
    /// checkpoint (by an older build killed in between) starts from its recorded input.
    fn reopen(
        &self,
        thread: Thread,
        head: Option<Checkpoint>,
        input: Option<&Value>,
        at: Option<&str>,
        answering: bool,
        fence: &Fence,
    ) -> Result<(Thread, Checkpoint, Option<Made>), EngineError> {
        let cp = match head {
            Some(cp) => cp,
            None => {
                let turn = self.first_turn(&thread, self.limit())?;
                let cp = turn.cp.clone();
                let mut puts = vec![Put::Fence(fence.clone())];
                puts.extend(turn.puts());
                self.store.put_batch(puts)?;
                cp
            }
        };
        let (cp, carried) = match at.filter(|at| *at != cp.checkpoint_id) {
            Some(at) => {
                let from = self.store.get_checkpoint(&thread.thread_id, Some(at))?.ok_or_else(|| {
                    EngineError::Input(format!("thread `{}` has no checkpoint `{at}`", thread.thread_id))
                })?;
                let (cp, carried) = self.branch(&thread.thread_id, from)?;
                (cp, Some(carried))
            }
            None => (cp, None),
        };
        if thread.plan_hash != self.plan.hash() && !self.options.force {
            self.check_compatible(&cp)?;
        }
        // A turn's first checkpoint, waiting to write its input (a branch from it, a thread
        // copied at it): the turn is made again with the input it recorded.
        let recorded = (input.is_none() && is_input_checkpoint(&cp)).then(|| self.recorded_input(&thread, &cp));
        match (input.or(recorded.as_ref()), carried) {
            (Some(input), carried) => {
                let turn = self.turn(&thread, cp, input, carried.unwrap_or_default(), self.limit())?;
                let (head, state) = (turn.cp.clone(), turn.state.clone());
                Ok((thread, head, Some((state, turn.puts()))))
            }
            (None, Some(carried)) => Ok((thread, self.fork_here(cp, carried, answering, fence)?, None)),
            (None, None) => Ok((thread, cp, None)),
        }
    }

    /// The input a turn's first checkpoint recorded: its own, or the thread's for its first.
    fn recorded_input(&self, thread: &Thread, cp: &Checkpoint) -> Value {
        let meta: Meta = serde_json::from_value(cp.meta.clone()).unwrap_or_default();
        meta.input.unwrap_or_else(|| thread.input.clone())
    }

    /// Checkpoint `from`, as the base of a new branch of its thread: each key's version raised
    /// above every version the thread has stored for it (on any branch), with the values stored
    /// again under those versions (returned, to be stored with the branch's first checkpoint).
    /// Versions are numbered from a checkpoint's own, so a branch that kept `from`'s would
    /// number its writes as the abandoned branch did, and the store keeps the first value of a
    /// key's version: the branch would read the abandoned branch's values.
    pub(super) fn branch(&self, thread_id: &str, mut from: Checkpoint) -> Result<(Checkpoint, NewValues), EngineError> {
        let mut highest: BTreeMap<String, u64> = BTreeMap::new();
        let mut branches = 0;
        for cp in self.store.history(thread_id)? {
            branches = branches.max(serde_json::from_value::<Meta>(cp.meta).map_or(0, |m| m.branch));
            for (key, v) in cp.versions {
                let h = highest.entry(key).or_default();
                *h = (*h).max(v);
            }
        }
        // The branch is numbered after every branch of the thread: its tasks' ids are new.
        let mut meta: Meta = serde_json::from_value(from.meta.clone()).unwrap_or_default();
        meta.branch = branches + 1;
        from.meta = serde_json::to_value(&meta).unwrap_or_default();
        let state = self.store.state(thread_id, &from.versions)?;
        let mut carried = Vec::new();
        for (key, version) in &mut from.versions {
            let top = highest.get(key).copied().unwrap_or(*version);
            if top > *version
                && let Some(value) = state.get(key)
            {
                *version = top + 1;
                carried.push((key.clone(), *version, value.clone()));
            }
        }
        Ok((from, carried))
    }

    /// A branch started without new input, as LangGraph forks: a checkpoint that is `base`
    /// again, one step on (source `fork`), as `base`'s child, with `carried` values and
    /// `base`'s tasks under the branch's ids. They run again: the results `base`'s tasks had
    /// stay `base`'s (a regenerated reply is a new message). With `answering`, the records of
    /// the gates they stopped at come along, so the answer finds its gate.
    fn fork_here(
        &self,
        base: Checkpoint,
        carried: NewValues,
        answering: bool,
        fence: &Fence,
    ) -> Result<Checkpoint, EngineError> {
        let mut meta: Meta = serde_json::from_value(base.meta.clone()).unwrap_or_default();
        meta.source = Some(Source::Fork);
        meta.run = self.options.metadata.as_deref().cloned();
        let step = base.step + 1;
        let renamed: Vec<(String, TaskSpec)> = base
            .next
            .iter()
            .map(|t| {
                let index = t.item.is_some().then(|| {
                    base.next
                        .iter()
                        .filter(|o| o.node == t.node && o.item.is_some())
                        .position(|o| o.task_id == t.task_id)
                        .unwrap_or(0)
                });
                let task_id = super::task_id(&base.thread_id, &t.node, step + 1, meta.branch, index);
                (t.task_id.clone(), TaskSpec { task_id, ..t.clone() })
            })
            .collect();
        let gates: Vec<checkpoint::PendingWrite> = if answering {
            self.store
                .get_writes(&base.thread_id, &base.checkpoint_id)?
                .into_iter()
                .filter(|w| w.channel == super::INTERRUPT)
                .filter_map(|w| {
                    let (_, t) = renamed.iter().find(|(old, _)| *old == w.task_id)?;
                    Some(checkpoint::PendingWrite {
                        task_id: t.task_id.clone(),
                        ..w
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let fork = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            parent_id: Some(base.checkpoint_id.clone()),
            step,
            ran: Vec::new(),
            changed: carried.iter().map(|(k, _, _)| k.clone()).collect(),
            next: renamed.into_iter().map(|(_, t)| t).collect(),
            created_at: crate::clock::now(),
            meta: serde_json::to_value(&meta).unwrap_or_default(),
            ..base
        };
        let mut puts = vec![
            Put::Fence(fence.clone()),
            Put::Checkpoint(Arc::new(fork.clone()), carried),
        ];
        if !gates.is_empty() {
            puts.push(Put::Writes {
                thread_id: fork.thread_id.clone(),
                checkpoint_id: fork.checkpoint_id.clone(),
                writes: gates,
            });
        }
        self.store.put_batch(puts)?;
        Ok(fork)
    }

    /// A new thread's record: its input and context checked against their schemas, its
    /// config overrides against the workflow's config.
    fn new_thread(&self, start: &Start, id: String) -> Result<Thread, EngineError> {
        let input = with_defaults(
            self.plan.input_schema(),
            start.input.clone().unwrap_or_else(|| json!({})),
        );
        check_schema(self.plan.input_schema(), &input, "input")?;
        let context = start.context.clone().unwrap_or_else(|| json!({}));
        check_schema(self.plan.context_schema(), &context, "context")?;
        let mut overrides = json!({});
        for (path, value) in &start.config {
            set_path(&mut overrides, path, value.clone(), self.plan.config())?;
        }
        let now = crate::clock::now();
        Ok(Thread {
            thread_id: id,
            workflow: start.workflow.clone(),
            plan_hash: self.plan.hash().to_string(),
            input,
            context,
            config: overrides,
            status: ThreadStatus::Running,
            created_at: now.clone(),
            updated_at: now,
            forked_from: None,
        })
    }

    /// The most supersteps a run may take: the options' recursion limit, else the plan's.
    pub(super) fn limit(&self) -> i64 {
        i64::from(self.options.recursion_limit.unwrap_or(self.plan.recursion_limit()))
    }

    /// A new thread's first turn: from the state's defaults (each key's version 1).
    fn first_turn(&self, thread: &Thread, limit: i64) -> Result<Turn, EngineError> {
        let mut state = Map::new();
        let mut versions = BTreeMap::new();
        let mut values = Vec::new();
        for (key, channel) in self.plan.state() {
            state.insert(key.clone(), channel.default.clone());
            versions.insert(key.clone(), 1);
            values.push((key.clone(), 1, channel.default.clone()));
        }
        let before = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            thread_id: thread.thread_id.clone(),
            parent_id: None,
            step: -1,
            versions,
            ran: Vec::new(),
            changed: self.plan.state().keys().cloned().collect(),
            next: Vec::new(),
            meta: Value::Null,
            plan_hash: self.plan.hash().to_string(),
            created_at: crate::clock::now(),
        };
        self.input_turn(
            thread,
            before,
            state,
            values,
            Meta::default(),
            None,
            &thread.input,
            limit,
        )
    }
    /// What START schedules, given a turn's input and the state of checkpoint `step`.
    fn entry_tasks(
        &self,
        thread: &Thread,
        input: &Value,
        state: &Map<String, Value>,
        step: i64,
        limit: i64,
        branch: u32,
    ) -> Result<Vec<TaskSpec>, EngineError> {
        let next = self
            .route_outside(thread, input, state, step, limit, "START", self.plan.entry())
            .map_err(|e| EngineError::Input(format!("routing from START: {e}")))?;
        Ok(self.schedule(next, &thread.thread_id, step + 1, branch))
    }

    /// Where `branches` (of START, or of `node`) lead on `state`, outside a run (the start of a
    /// turn, a state edit): the scope has the turn's input, the thread's config and context,
    /// and the state.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn route_outside(
        &self,
        thread: &Thread,
        input: &Value,
        state: &Map<String, Value>,
        step: i64,
        limit: i64,
        node: &str,
        branches: &[crate::compile::Branch],
    ) -> Result<Vec<super::task::Next>, String> {
        let config = effective_config(self.plan.config(), &thread.config);
        let scope = Scope::new(
            BTreeMap::from([
                ("input".to_string(), to_jinja(input)),
                ("config".to_string(), to_jinja(&config)),
                ("context".to_string(), to_jinja(&thread.context)),
                ("state".to_string(), values::map_to_jinja(state)),
                // Nothing has run yet: every step of the run is still to come.
                (
                    "run".to_string(),
                    values::run_value(&thread.thread_id, step, node, limit),
                ),
            ]),
            Some(self.plan.clone()),
        )
        .into_value();
        let shared = Shared {
            validators: self.node_validators.clone(),
            plan: self.plan.clone(),
            store: self.store.clone(),
            services: self.services.clone(),
            events: Events::none(),
            thread_id: thread.thread_id.clone(),
            // Routing writes nothing.
            fence: Fence {
                thread_id: thread.thread_id.clone(),
                owner: String::new(),
                generation: 0,
            },
            force: false,
            as_child: false,
            end_step: step + 1 + limit,
        };
        let mut next = Vec::new();
        for b in branches {
            follow(&shared, b, &scope, &mut next).map_err(|e| e.message)?;
        }
        Ok(next)
    }

    /// A new input on a finished thread starts a new turn (LangGraph's `invoke(input, thread)`):
    /// START runs again on the thread's state, with the new input. A thread that waits (at a
    /// gate, or cut off) takes new input only with [`RunOptions::discard_pending`], which drops
    /// what waited, or when all that waits is a turn's input not yet written.
    /// `carried`: values a branch stores again under new versions (see [`Engine::branch`]).
    fn turn(
        &self,
        thread: &Thread,
        cp: Checkpoint,
        input: &Value,
        carried: NewValues,
        limit: i64,
    ) -> Result<Turn, EngineError> {
        if !cp.next.is_empty() && !is_input_checkpoint(&cp) && !self.options.discard_pending {
            return Err(EngineError::Input(format!(
                "thread `{}` has work pending (it is interrupted or was cut off): continue it with `runner resume`, or fork it, before giving it new input",
                thread.thread_id
            )));
        }
        let input = with_defaults(self.plan.input_schema(), input.clone());
        check_schema(self.plan.input_schema(), &input, "input")?;
        // A carried value is not stored yet: it is read from `carried`, the rest from the store.
        let stored_before: BTreeMap<String, u64> = cp
            .versions
            .iter()
            .filter(|(k, _)| !carried.iter().any(|(c, _, _)| c == *k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let mut state = self.store.state(&thread.thread_id, &stored_before)?;
        for (key, _, value) in &carried {
            state.insert(key.clone(), value.clone());
        }
        let meta: Meta = serde_json::from_value(cp.meta.clone()).unwrap_or_default();
        let before = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            parent_id: Some(cp.checkpoint_id.clone()),
            step: cp.step + 1,
            ran: Vec::new(),
            changed: carried.iter().map(|(k, _, _)| k.clone()).collect(),
            created_at: crate::clock::now(),
            ..cp
        };
        self.input_turn(thread, before, state, carried, meta, Some(input.clone()), &input, limit)
    }

    /// A turn's two checkpoints from `before` (the state the turn starts from, its step,
    /// versions and parent set): as LangGraph makes them, `before` waits for the turn's one
    /// task, `__start__`, whose result — the input written to the keys it feeds — is stored
    /// with it; its child has that result applied and waits for what START schedules.
    #[allow(clippy::too_many_arguments)]
    fn input_turn(
        &self,
        thread: &Thread,
        mut before: Checkpoint,
        mut state: Map<String, Value>,
        before_values: NewValues,
        mut meta: Meta,
        recorded: Option<Value>,
        input: &Value,
        limit: i64,
    ) -> Result<Turn, EngineError> {
        let step = before.step + 1;
        meta.barriers.clear();
        meta.deferred.clear();
        meta.handoffs.clear();
        meta.input = recorded;
        meta.turn = Usage::default();
        meta.node_usage.clear();
        meta.run = self.options.metadata.as_deref().cloned();
        let start_task = super::task_id(&thread.thread_id, super::START_TASK, step, meta.branch, None);
        let writes = self.input_fields(input);
        let mut before_meta = meta.clone();
        before_meta.source = Some(Source::Input);
        before.next = vec![TaskSpec {
            task_id: start_task.clone(),
            node: super::START_TASK.to_string(),
            item: None,
        }];
        before.meta = serde_json::to_value(&before_meta).unwrap_or_default();
        before.plan_hash = self.plan.hash().to_string();
        // The input goes through the reducers of the keys it feeds, on the turn's state.
        let fed = self.input_writes(&state, &before.versions, &mut meta, &writes, &start_task)?;
        for (key, value) in fed.values {
            state.insert(key, value);
        }
        meta.source = None;
        let entry = self.entry_tasks(thread, input, &state, step, limit, meta.branch)?;
        let next = self.hold_deferred(&mut meta, entry, &thread.thread_id, step + 1);
        let after = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            parent_id: Some(before.checkpoint_id.clone()),
            step,
            versions: fed.versions,
            ran: Vec::new(),
            changed: fed.changed,
            next,
            meta: serde_json::to_value(&meta).unwrap_or_default(),
            created_at: crate::clock::now(),
            ..before.clone()
        };
        let done = super::task::Done {
            writes,
            ..Default::default()
        };
        let start_write = super::apply::encode(&start_task, &done, &self.plan);
        Ok(Turn {
            before,
            before_values,
            start_write,
            cp: after,
            values: fed.stored,
            state,
        })
    }

    /// What a turn's input writes: the field each key is fed from (`from_input`), for each key
    /// whose field the input has.
    fn input_fields(&self, input: &Value) -> Vec<(String, Value)> {
        self.plan
            .state()
            .iter()
            .filter_map(|(key, channel)| {
                let value = input.get(channel.from_input.as_deref()?)?;
                Some((key.clone(), value.clone()))
            })
            .collect()
    }

    /// A turn's input `writes` ([`Engine::input_fields`]) through the reducers of the keys
    /// they feed, on `state`, as the turn's `__start__` task `writer`: the new versions and
    /// values.
    fn input_writes(
        &self,
        state: &Map<String, Value>,
        versions: &BTreeMap<String, u64>,
        meta: &mut Meta,
        writes: &[(String, Value)],
        writer: &str,
    ) -> Result<super::apply::Folded, EngineError> {
        let writes: super::apply::Updates = writes
            .iter()
            .map(|(key, value)| (key.as_str(), vec![("input", writer, value)]))
            .collect();
        self.fold_writes(state, versions, meta, &writes)
            .map_err(|e| EngineError::Input(e.to_string()))
    }

    /// A thread made by another version of the workflow may go on only if its state and
    /// scheduled nodes still exist.
    fn check_compatible(&self, cp: &Checkpoint) -> Result<(), EngineError> {
        let missing_keys: Vec<&String> = cp
            .versions
            .keys()
            .filter(|k| !self.plan.state().contains_key(*k))
            .collect();
        let missing_nodes: Vec<&String> = cp
            .next
            .iter()
            .map(|t| &t.node)
            .filter(|n| *n != super::START_TASK && self.plan.node_by_name(n).is_none())
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
            // A key's default fits its schema (compile checked it), so a value equal to it needs
            // no validator: a new thread's state is all defaults. A key with no default starts
            // unset (null) whatever its schema: that is no defect of the record either.
            if self.plan.state().get(key).is_some_and(|c| &c.default == value) {
                continue;
            }
            if let Some(why) = self.validators.violation(key, value) {
                return Err(EngineError::StoredValue {
                    thread: thread.into(),
                    key: key.clone(),
                    why,
                });
            }
        }
        Ok(())
    }
}

/// The plan's config with a thread's overrides merged in.
pub(super) fn effective_config(base: &Value, overrides: &Value) -> Value {
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
    let v = crate::compile::meta::validator(schema).map_err(|e| EngineError::Input(format!("{what} schema: {e}")))?;
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

/// A turn's two checkpoints and what is stored with them (see [`Engine::input_turn`]).
struct Turn {
    before: Checkpoint,
    before_values: NewValues,
    /// The `__start__` task's result, stored against `before`.
    start_write: Vec<checkpoint::PendingWrite>,
    cp: Checkpoint,
    values: NewValues,
    /// The state at `cp`.
    state: Map<String, Value>,
}

/// A checkpoint made and not yet written: the state at it, and what writes it (after the
/// run's fence).
type Made = (Map<String, Value>, Vec<Put>);

/// A thread as a run opens it.
struct Opened {
    thread: Thread,
    /// Its latest checkpoint: where the run starts.
    cp: Checkpoint,
    /// The thread existed.
    resumed: bool,
    /// The turn the run starts there, when it starts one.
    made: Option<Made>,
}

impl Turn {
    /// What stores the turn, in order (after the caller's fence), in one commit.
    fn puts(self) -> Vec<Put> {
        let thread_id = self.before.thread_id.clone();
        let before_id = self.before.checkpoint_id.clone();
        vec![
            Put::Checkpoint(Arc::new(self.before), self.before_values),
            Put::Writes {
                thread_id,
                checkpoint_id: before_id,
                writes: self.start_write,
            },
            Put::Checkpoint(Arc::new(self.cp), self.values),
        ]
    }
}

/// Whether `cp` is a turn's first checkpoint, whose one task writes the turn's input.
fn is_input_checkpoint(cp: &Checkpoint) -> bool {
    matches!(cp.next.as_slice(), [t] if t.node == super::START_TASK)
}
