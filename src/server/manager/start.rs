//! A run's start: admitted to its thread (its multitask strategy, the thread's existence, a
//! thread being deleted), written as a `pending` row, entered in the line for a worker
//! (enqueue), then, in its own task, given a worker and the thread's lease (claim) and run on
//! the engine; its end recorded in its row, whoever still listens.
//!
//! One process on SQLite: the line is this process's [`super::workers::Workers`] and the claim
//! is its turn there, then the lease `Engine::run` takes. Many processes on one database would
//! claim the row from the store instead, in the transaction that takes the lease; nothing above
//! [`RunManager::start`] changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::request::{CreateRun, Multitask};
use super::{BUSY, Live, RunManager, RunsError, lock};
use crate::checkpoint::queue::Admission;
use crate::checkpoint::{Checkpoint, RunRow, RunStatus, ThreadMeta};
use crate::engine::events::{Envelope, Events, Receiver};
use crate::engine::{Engine, EngineError, LeasePolicy, RunOutcome, Status};
use crate::run::Start;
use crate::server::Graph;

/// What stops a run: the engine's cancel flag (at the next step boundary), its abort (at
/// once), and what wakes it while it waits for a worker.
#[derive(Debug, Clone, Default)]
pub(crate) struct Stopper {
    flag: Arc<AtomicBool>,
    abort: crate::engine::Abort,
    wake: Arc<tokio::sync::Notify>,
    /// A run executing on another process: its cancel is asked of the shared database.
    remote: Option<RemoteCancel>,
    /// Held by whoever stops the run (and rolls it back): one at a time.
    stopping: Arc<tokio::sync::Mutex<()>>,
}

/// Asks a run executing elsewhere to stop.
#[derive(Clone)]
pub(crate) struct RemoteCancel(Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for RemoteCancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteCancel")
    }
}

impl Stopper {
    fn of(engine: &Engine) -> Stopper {
        Stopper {
            flag: engine.cancel_flag(),
            abort: engine.abort_handle(),
            ..Stopper::default()
        }
    }

    /// The stopper of a run executing on another process: `cancel` asks it through `ask`; a
    /// stop (this process shutting down) leaves it going.
    pub(super) fn remote(ask: Arc<dyn Fn() + Send + Sync>) -> Stopper {
        Stopper {
            remote: Some(RemoteCancel(ask)),
            ..Stopper::default()
        }
    }

    /// At the next step boundary (its running tasks finish and are stored); a pending run at
    /// once.
    pub(crate) fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        // Kept until the run looks, if it is not waiting yet.
        self.wake.notify_one();
    }

    /// At once (the API's cancel): its running tasks dropped where they are.
    pub(crate) fn cancel(&self) {
        if let Some(RemoteCancel(ask)) = &self.remote {
            ask();
            return;
        }
        self.abort.abort();
        self.stop();
    }

    /// Waits until no other caller is stopping the run: a cancel asked twice (by two clients,
    /// or told to a worker by a notice and found again by its poll) is done once, and the
    /// second finds the first's work done.
    pub(crate) async fn one_at_a_time(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.stopping.clone().lock_owned().await
    }

    fn stopped(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

/// A run whose row is written and whose task waits for a worker, or runs: what its starter
/// reads of it until it holds its thread ([`RunManager::started`]).
pub(crate) struct Queued {
    pub run_id: String,
    pub thread_id: String,
    pub graph: Arc<Graph>,
    /// Its row as created.
    pub row: RunRow,
    /// Its input starts a new turn.
    pub new_input: bool,
    /// Its stream's frames carry ids and stay for readers that rejoin.
    pub resumable: bool,
    pub stateless: bool,
    pub cancel_on_disconnect: bool,
    pub(super) events: Receiver,
    pub(super) done: oneshot::Receiver<Result<RunOutcome, EngineError>>,
    pub(super) stopper: Stopper,
    pub(super) release: oneshot::Sender<()>,
}

/// A run that holds its thread: the events it sends, and its end.
pub(crate) struct Running {
    pub run_id: String,
    pub thread_id: String,
    pub graph: Arc<Graph>,
    pub row: RunRow,
    pub new_input: bool,
    pub resumable: bool,
    pub stateless: bool,
    pub cancel_on_disconnect: bool,
    /// Its first event (`run_start`, sent once it holds the thread).
    pub first: Envelope,
    pub events: Receiver,
    pub done: oneshot::Receiver<Result<RunOutcome, EngineError>>,
    pub stopper: Stopper,
    /// Dropped once nobody reads the run's thread any more: a thread of the run's own is
    /// deleted then.
    pub release: oneshot::Sender<()>,
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

impl<S: Send + Sync + 'static> RunManager<S> {
    /// Creates the run `req` asks for and enqueues it: its thread's runs stopped first if its
    /// strategy says so, admitted to its thread, its row written `pending` and its place in
    /// line taken; answered once it is in line (its task claims a worker and the thread).
    pub(crate) async fn start(self: &Arc<Self>, mut req: CreateRun) -> Result<Queued, RunsError> {
        if self.is_api() {
            return self.start_remote(req).await;
        }
        let thread_id = req.thread.clone().unwrap_or_else(crate::checkpoint::new_id);
        if matches!(req.strategy, Multitask::Interrupt | Multitask::Rollback) {
            self.stop_thread_runs(&thread_id, req.strategy == Multitask::Rollback)
                .await?;
            // A rollback may have changed the thread since a claim read it: read it again.
            if let Some(resumed) = req.resumed.as_mut() {
                resumed.view = None;
            }
        }
        // From here until the run is among the live runs, one admission at a time: of two runs
        // asking for an idle thread with `reject`, one is refused; a thread being deleted takes
        // no run.
        let admitting = lock(&self.deleting);
        let known = match &req.thread {
            Some(_) if admitting.contains(&thread_id) => false,
            Some(t) => req.resumed.is_some() || self.thread_exists(t)?,
            None => true,
        };
        if !known && (admitting.contains(&thread_id) || !req.create_thread) {
            return Err(RunsError::NotFound("Thread or assistant not found.".into()));
        }
        // A run on the thread, running or waiting for a worker, holds it for the runs after it.
        if req.strategy == Multitask::Reject && req.resumed.is_none() && self.busy(&thread_id) {
            return Err(RunsError::Conflict(BUSY.into()));
        }
        let created = self.create(req, &thread_id, ThreadRecord::Unread)?;
        let (queued, task) = self.prepare(created)?;
        drop(admitting);
        self.enqueue(task);
        Ok(queued)
    }

    /// The run's engine request, its row and its record among the live runs. `record`: what
    /// the caller read of the thread's record.
    pub(super) fn create(
        &self,
        mut req: CreateRun,
        thread_id: &str,
        record: ThreadRecord,
    ) -> Result<Created, RunsError> {
        let graph = req.graph.clone();
        let reject = req.strategy == Multitask::Reject;
        let claimed = req.resumed.as_ref().and_then(|r| r.claimed.clone());
        let claim_view = req.resumed.as_mut().and_then(|r| r.view.take());
        let journal = req.resumed.as_ref().and_then(|r| r.journal.clone());
        let overrides = &self.settings.overrides;
        let workflow = graph.path.display().to_string();
        let was_running = req.resumed.as_ref().is_some_and(|r| r.was_running);
        let is_resumed = req.resumed.is_some();
        let fresh = req.resumed.as_ref().is_some_and(|r| r.fresh);
        // A resumed run that held its thread had applied its command.
        let edit = req.edit.filter(|_| !was_running);
        // The thread's head, where the run's request is checked against it (a fork, a command,
        // an answer) or kept to roll back to (a run this process executes): a server whose runs
        // execute elsewhere reads nothing for a run of plain input.
        // With the thread's record when the caller has not read it, and the thread: all in one
        // look. A worker's claim holds the thread's lease: its run opens the thread from what
        // is read here.
        let wants_head = !self.is_api() || edit.is_some() || req.checkpoint_id.is_some() || req.resume.is_some();
        // The thread as the look found it (none: not looked at).
        let mut looked = None;
        let stamped = matches!(record, ThreadRecord::Stamped);
        debug_assert!(!stamped || (self.is_api() && !wants_head && !is_resumed));
        let meta = match record {
            ThreadRecord::Unread => None,
            ThreadRecord::Read(meta) => Some(meta),
            // Not read: stamped by the admission as it finds it (see below).
            ThreadRecord::Stamped => Some(None),
        };
        let (head, meta) = match (wants_head, meta) {
            (true, None) => {
                let view = match claim_view {
                    Some(view) => *view,
                    None => self.store.thread_view(thread_id)?,
                };
                looked = Some(view.thread);
                (view.head, Some(view.meta))
            }
            (true, meta) => (self.store.get_checkpoint(thread_id, None)?, meta),
            (false, meta) => (None, meta),
        };
        // `checkpoint` names where the run goes on from: the head is no fork (agent-chat-ui
        // always sends the head it last saw).
        let checkpoint_id = req
            .checkpoint_id
            .filter(|id| head.as_ref().is_none_or(|h| h.checkpoint_id != *id))
            .filter(|_| !was_running);
        if edit.is_some() {
            if head.is_none() {
                return Err(RunsError::Invalid(
                    "command.update and command.goto apply to a thread's state: the thread has none yet".into(),
                ));
            }
            if checkpoint_id.is_some() {
                return Err(RunsError::Invalid(
                    "command.update and command.goto apply at the thread's latest checkpoint, not an older one".into(),
                ));
            }
        }
        let input = req.input;
        let new_input = input.is_some() && req.resume.is_none() && edit.is_none() && !was_running;
        let mut request = match req.resume {
            // A resumed run that held its thread had taken its answer: the thread goes on.
            _ if was_running => overrides.answer(thread_id.to_string(), workflow, None, None),
            Some(resume) => {
                let (to, value, more) = self.answer(thread_id, head.as_ref(), resume)?;
                let mut request = overrides.answer(thread_id.to_string(), workflow, Some(value), to);
                request.more_answers = more;
                request
            }
            // The command's edit, then the thread goes on from it.
            None if edit.is_some() => overrides.answer(thread_id.to_string(), workflow, None, None),
            None => overrides.start(Start {
                thread_id: Some(thread_id.to_string()),
                workflow,
                input_given: input.is_some(),
                input: input.clone().unwrap_or_else(|| json!({})),
                context: req.context.clone().unwrap_or_else(|| json!({})),
                config: req.config.clone(),
            }),
        };
        if let LeasePolicy::Take { wait, .. } = &mut request.lease {
            // A run waits for the runs before it to let go of the thread, unless it was told to
            // be refused then; a resumed run waits out the lease of the process that was killed
            // (on another host, or a process id taken again).
            *wait = req.strategy != Multitask::Reject || is_resumed;
        }
        if let Some((lease, ttl)) = claimed {
            // A worker's claim took the thread's lease with the run.
            request.lease = LeasePolicy::Claimed {
                lease: Box::new(lease),
                ttl,
            };
            // A command's edit writes a checkpoint before the run opens the thread: then it reads.
            request.seen = looked.filter(|_| edit.is_none()).map(|thread| {
                Box::new(crate::engine::Seen {
                    thread,
                    head: head.clone(),
                })
            });
        }
        if let Some(persist) = req.persist {
            request.persist = persist;
        }
        request.gates = req.gates;
        request.checkpoint_id = checkpoint_id;
        // New input on a thread that waits (at a gate) starts the new turn: LangGraph's server
        // drops what waited.
        request.discard_pending = true;
        request.run_config = overrides.run_config(graph.plan.config(), req.config);
        request.run_context = req.context;
        if let Some(limit) = req.recursion_limit {
            request.recursion_limit = Some(limit);
        }
        // The run's services, for a run this process executes: a server whose runs execute on
        // workers builds none (each worker builds the run's own).
        let services = if self.is_api() {
            None
        } else {
            let mut services = self.settings.services(&graph.plan)?;
            // One data store for the process: what the store endpoints write, runs read; a
            // user's run reads and writes that user's namespaces.
            let scope = req
                .owner
                .as_ref()
                .map(|o| crate::rag::NamespaceScope::new(o.clone(), graph.plan.shared_store().clone()));
            services.data = self.data.scoped(scope);
            Some(services)
        };
        // From here on the run starts, and its end (or refusal) releases a thread of its own.
        let existing = match meta {
            Some(meta) => meta,
            None => self.store.get_thread_meta(thread_id)?,
        };
        let new_thread = existing.is_none();
        let mut meta = match existing {
            Some(mut meta) => {
                // A run is a use of the thread: its time to live starts again.
                meta.ttl = meta.ttl.map(|t| t.restarted(crate::clock::now_ms()));
                meta
            }
            None => {
                let mut meta = new_meta(thread_id);
                meta.ttl = self
                    .thread_ttl()
                    .map(|m| crate::checkpoint::ThreadTtl::starting("delete", m, crate::clock::now_ms()));
                meta
            }
        };
        let thread_metadata = meta.metadata.as_object().cloned().unwrap_or_default();
        if let Value::Object(m) = &mut meta.metadata {
            m.insert("graph_id".into(), json!(graph.graph_id));
            m.insert("assistant_id".into(), json!(graph.assistant_id));
            // A thread the run creates is its user's.
            if new_thread && let Some(owner) = &req.owner {
                m.insert("owner".into(), json!(owner));
            }
        }
        meta.updated_at = crate::clock::now();
        let rollback_to = match &head {
            // A worker rolls back a run it executes; the server that created it keeps nothing.
            Some(cp) if !self.is_api() => {
                let writes = self.store.get_writes(thread_id, &cp.checkpoint_id)?;
                Some((cp.checkpoint_id.clone(), writes))
            }
            _ => None,
        };
        let now = crate::clock::now();
        let row = match req.resumed {
            Some(r) => r.row,
            None => {
                let mut kwargs = req.kwargs;
                if req.stateless
                    && let Value::Object(k) = &mut kwargs
                {
                    k.insert("stateless".into(), Value::Bool(true));
                }
                // The run's metadata: its assistant's (graph and id), then the client's.
                let mut metadata = Map::from_iter([
                    ("created_by".to_string(), json!("system")),
                    ("graph_id".into(), json!(graph.graph_id)),
                    ("assistant_id".into(), json!(graph.assistant_id)),
                ]);
                metadata.extend(req.metadata);
                // Whose run it is, as the server found its caller; never what a client wrote.
                match &req.owner {
                    Some(owner) => metadata.insert("owner".into(), json!(owner)),
                    None => metadata.remove("owner"),
                };
                RunRow {
                    run_id: uuid::Uuid::now_v7().to_string(),
                    thread_id: thread_id.to_string(),
                    assistant_id: graph.assistant_id.clone(),
                    status: RunStatus::Pending,
                    created_at: now.clone(),
                    updated_at: now,
                    kwargs,
                    multitask_strategy: req.strategy.as_str().to_string(),
                    metadata: Value::Object(metadata),
                    error: None,
                    event_ids: 0,
                }
            }
        };
        if stamped {
            // Admitted through the shared database, one admission per thread at a time
            // whichever process asks, the thread's record read, stamped and written by it:
            // one round trip. `meta` is the record of a thread that has none.
            let stamp = crate::checkpoint::queue::Stamp {
                keys: Map::from_iter([
                    ("graph_id".to_string(), json!(graph.graph_id)),
                    ("assistant_id".into(), json!(graph.assistant_id)),
                ]),
                new: meta.clone(),
                create: req.create_thread,
                now_ms: crate::clock::now_ms(),
            };
            match self.queue()?.admit_stamped(&row, reject, &stamp)? {
                Admission::Admitted => {}
                Admission::Busy => return Err(RunsError::Conflict(BUSY.into())),
                Admission::NoThread => return Err(RunsError::NotFound("Thread or assistant not found.".into())),
            }
        } else if self.is_api() && !is_resumed {
            // Admitted through the shared database, one admission per thread at a time
            // whichever process asks, with the thread's record: one round trip.
            if !self.queue()?.admit(&row, reject, Some(&meta))? {
                return Err(RunsError::Conflict(BUSY.into()));
            }
        } else if matches!(self.role, super::Role::Worker(_)) {
            // A claimed run: its row is the claim's, and the server that admitted it wrote the
            // thread's record then (a thread with none, made by `runner run`, gets one).
            if new_thread {
                self.store.put_thread_meta(&meta)?;
            }
        } else {
            self.store.put_thread_meta(&meta)?;
            self.store.put_run(&row)?;
        }
        // What each checkpoint the run makes keeps of it, as LangGraph's checkpoint metadata:
        // the thread's metadata as the run found it, then the run's own.
        let mut stamped = thread_metadata;
        stamped.extend(checkpoint_metadata(&row));
        let user = req.owner.clone().unwrap_or_default();
        stamped.insert("user_id".into(), json!(user));
        stamped.insert("langgraph_auth_user_id".into(), json!(user));
        // A user's run spends at most what the window leaves of their quota.
        if !self.is_api()
            && let (Some(quotas), Some(owner)) = (&self.quotas, &req.owner)
        {
            request.quota = Some(quotas.remaining(self.store.as_ref(), owner)?);
        }
        request.metadata = Some(stamped);
        Ok(Created {
            owner: req.owner,
            graph,
            row,
            request,
            journal,
            services,
            edit,
            rollback_to,
            new_input,
            // A resumed run's stream may be rejoined: its client lost it with the process.
            resumable: req.resumable || is_resumed,
            resumed: is_resumed && !fresh,
            stateless: req.stateless,
            temporary: req.temporary,
            cancel_on_disconnect: req.cancel_on_disconnect,
        })
    }

    /// The run's engine and its record among the live runs; the task that will run it.
    fn prepare(self: &Arc<Self>, c: Created) -> Result<(Queued, RunTask<S>), RunsError> {
        let run_id = c.row.run_id.clone();
        let thread_id = c.row.thread_id.clone();
        let (to_readers, rx) = Events::channel();
        // The run's trace is built from its events as they happen, beside its readers.
        let earlier = match c.resumed {
            true => self.store.get_trace(&run_id)?.map(|t| t.trace),
            false => None,
        };
        let recorder = Arc::new(std::sync::Mutex::new(super::trace::Recorder::new(
            &run_id,
            &thread_id,
            earlier.as_ref(),
        )));
        let traced = recorder.clone();
        let mut events = Events::sink(Arc::new(move |envelope: Envelope| {
            lock(&traced).on(&envelope);
            to_readers.forward(envelope);
        }));
        if let Some(journal) = c.journal {
            events = events.journaled(journal);
        }
        let services = c
            .services
            .ok_or_else(|| RunsError::Invalid("a run executing elsewhere has no engine here".into()))?;
        let engine = Engine::new(c.graph.plan.clone(), self.store.clone(), services, events);
        let stopper = Stopper::of(&engine);
        let (ended_tx, ended_rx) = tokio::sync::watch::channel(false);
        {
            let mut runs = lock(&self.runs);
            prune(&mut runs, KEPT_RUNS);
            runs.insert(
                run_id.clone(),
                Live {
                    run_id: run_id.clone(),
                    thread_id: thread_id.clone(),
                    status: RunStatus::Pending,
                    stopper: stopper.clone(),
                    ended: ended_rx,
                    stream: None,
                    rollback_to: c.rollback_to,
                    trace: Some(recorder.clone()),
                    had_worker: false,
                    place: if matches!(self.role, super::Role::Worker(_)) {
                        super::Place::Claimed
                    } else {
                        super::Place::Here
                    },
                },
            );
        }
        let (tx, done) = oneshot::channel();
        let (release, released) = oneshot::channel::<()>();
        let task = RunTask {
            manager: self.clone(),
            engine,
            request: Box::new(c.request),
            edit: c.edit,
            run_id: run_id.clone(),
            thread_id: thread_id.clone(),
            temporary: c.temporary,
            trace: recorder,
            owner: c.owner,
            wake: stopper.wake.clone(),
            ended: ended_tx,
            outcome: tx,
            released,
            webhook: (self.role == super::Role::Local && crate::server::webhook::url_of(&c.row).is_some())
                .then(|| c.graph.plan.clone()),
        };
        let queued = Queued {
            run_id,
            thread_id,
            graph: c.graph,
            row: c.row,
            new_input: c.new_input,
            resumable: c.resumable,
            stateless: c.stateless,
            cancel_on_disconnect: c.cancel_on_disconnect,
            events: rx,
            done,
            stopper,
            release,
        };
        Ok((queued, task))
    }

    /// Puts the run in line for a worker, as its row is written (runs get workers in the
    /// order they were created), and spawns the task that claims one and runs it.
    fn enqueue(self: &Arc<Self>, task: RunTask<S>) {
        let turn = self.workers.enter();
        // The run's span is a child of the request's that started it (none for a run resumed
        // at start): one trace from the HTTP request down to the model calls. A spawned task
        // does not inherit the current span by itself.
        let parent = tracing::Span::current();
        tokio::spawn(task.run(turn).instrument(parent));
    }

    /// Waits until the run holds its thread (it sends `run_start` then): the run as started,
    /// or why it could not start. A client that goes away meanwhile (this future dropped)
    /// cancels the run, unless it said `on_disconnect: continue`.
    pub(crate) async fn started(&self, q: Queued) -> Result<Running, RunsError> {
        let Queued {
            run_id,
            thread_id,
            graph,
            row,
            new_input,
            resumable,
            stateless,
            cancel_on_disconnect,
            mut events,
            mut done,
            stopper,
            release,
        } = q;
        let mut abandoned = Abandoned {
            stopper: stopper.clone(),
            armed: cancel_on_disconnect,
        };
        let first = first_event(&mut events, &mut done)
            .await
            .map_err(RunsError::Engine)?
            // None: it was cancelled while it waited for a worker.
            .ok_or_else(|| RunsError::Conflict(format!("run {run_id} was cancelled before it started")))?;
        // From here on the reader's own guard stops the run if its client goes away.
        abandoned.armed = false;
        self.set_status(&run_id, RunStatus::Running, None);
        Ok(Running {
            run_id,
            thread_id,
            graph,
            row,
            new_input,
            resumable,
            stateless,
            cancel_on_disconnect,
            first,
            events,
            done,
            stopper,
            release,
        })
    }

    /// The answer and the gate it is for, from `command.resume`: a map from pending interrupt
    /// ids to values answers those gates; any other value answers the only gate waiting. A
    /// thread with no gate waiting (or no state at all) has nothing to resume: refused before
    /// anything runs or is written.
    fn answer(&self, thread_id: &str, head: Option<&Checkpoint>, resume: Value) -> Result<Answered, RunsError> {
        let pending: Vec<String> = match head {
            Some(cp) => {
                crate::server::threads::pending_interrupts(cp, &self.store.get_writes(thread_id, &cp.checkpoint_id)?)
                    .into_iter()
                    .filter_map(|(_, i)| i.get("id").and_then(Value::as_str).map(str::to_string))
                    .collect()
            }
            None => Vec::new(),
        };
        if pending.is_empty() {
            return Err(RunsError::Conflict(format!(
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

    /// Records a run's status (and why it failed), among the live runs and in the store.
    pub(super) fn set_status(&self, run_id: &str, status: RunStatus, error: Option<Value>) {
        let now = crate::clock::now();
        let (was, cancelled) = {
            let mut runs = lock(&self.runs);
            let Some(r) = runs.get_mut(run_id) else { return };
            // A run that ended before its start was told stays ended.
            if status == RunStatus::Running && r.status != RunStatus::Pending {
                return;
            }
            let cancelled = r.stopper.stopped();
            if r.place != super::Place::Here {
                // Its row is its worker's to write, through the queue.
                r.status = status;
                return;
            }
            (std::mem::replace(&mut r.status, status), cancelled)
        };
        // A run the process stopped as it shuts down stays `running` (or `pending`) in the
        // store: the next process on this database continues it. One stopped while it waited
        // for its thread's lease (queued behind another run) ends in an error, but never
        // touched the thread.
        let stopped =
            status == RunStatus::Interrupted || (status == RunStatus::Error && was == RunStatus::Pending && cancelled);
        if stopped && self.stopping.load(Ordering::SeqCst) {
            return;
        }
        // A status that could not be stored leaves the run itself unharmed; only a process
        // restarted later would take it for unfinished and continue its thread, which has
        // nothing left to run.
        let _ = self.store.set_run_status(run_id, status, error.as_ref(), &now);
    }
}

/// An answer, the gate it is for (none: the only one waiting), and the answers to other gates.
type Answered = (Option<String>, Value, Vec<(String, Value)>);

/// A run created: what its task and its starter get.
pub(super) struct Created {
    /// Whose run it is.
    owner: Option<String>,
    pub(super) graph: Arc<Graph>,
    pub(super) row: RunRow,
    request: crate::engine::RunRequest,
    /// Where a claimed run's events are kept with its commits.
    journal: Option<Arc<dyn crate::engine::events::Journal>>,
    /// None for a run executing on a worker elsewhere.
    services: Option<crate::nodes::Services>,
    edit: Option<super::request::Edit>,
    rollback_to: Option<(String, Vec<crate::checkpoint::PendingWrite>)>,
    pub(super) new_input: bool,
    pub(super) resumable: bool,
    /// A run some process executed before (it goes on from its trace).
    resumed: bool,
    pub(super) stateless: bool,
    temporary: bool,
    pub(super) cancel_on_disconnect: bool,
}

/// The task of one run: it claims a worker, runs the engine, records the end.
struct RunTask<S> {
    manager: Arc<RunManager<S>>,
    engine: Engine,
    /// Boxed: the task holds what it was given for as long as it lives.
    request: Box<crate::engine::RunRequest>,
    edit: Option<super::request::Edit>,
    run_id: String,
    thread_id: String,
    temporary: bool,
    /// Its trace, as its events build it: stored as it goes and at its end.
    trace: Arc<std::sync::Mutex<super::trace::Recorder>>,
    /// The user whose quota the run spends.
    owner: Option<String>,
    wake: Arc<tokio::sync::Notify>,
    ended: tokio::sync::watch::Sender<bool>,
    outcome: oneshot::Sender<Result<RunOutcome, EngineError>>,
    released: oneshot::Receiver<()>,
    /// The run's graph, when its end calls a webhook this process records (a worker of a
    /// shared database records its own runs' as it ends them).
    webhook: Option<Arc<crate::compile::Plan>>,
}

impl<S: Send + Sync + 'static> RunTask<S> {
    async fn run(self, turn: super::workers::Turn) {
        let RunTask {
            manager,
            engine,
            request,
            edit,
            run_id,
            thread_id,
            temporary,
            trace,
            owner,
            wake,
            ended,
            outcome: tx,
            released,
            webhook,
        } = self;
        // A worker's claim on the run fences its trace's writes, as it fences its steps.
        let claim = match &request.lease {
            crate::engine::LeasePolicy::Claimed { lease, .. } => Some(lease.owner.clone()),
            _ => None,
        };
        let keeping = tokio::spawn(keep_trace(
            manager.store.clone(),
            trace.clone(),
            run_id.clone(),
            thread_id.clone(),
            claim.clone(),
        ));
        // The claim: a worker, unless the run is cancelled while it waits for one. The thread's
        // lease is the engine's to take.
        let worker = tokio::select! {
            biased;
            worker = turn.worker() => Some(worker),
            () = wake.notified() => None,
        };
        if worker.is_some()
            && let Some(r) = lock(&manager.runs).get_mut(&run_id)
        {
            r.had_worker = true;
        }
        let ran = worker.is_some();
        let outcome = match worker {
            // Cancelled while it waited: it ends without having run (or touched its thread).
            // A worker's claim took the thread's lease for it: given up here, as the engine
            // would have at the run's end.
            None => {
                if let crate::engine::LeasePolicy::Claimed { lease, .. } = &request.lease
                    && let Err(e) = manager.store.release_lease(&lease.fence())
                {
                    tracing::warn!(run_id, error = %e, "a claimed run's lease could not be given up");
                }
                Ok(never_started(&thread_id))
            }
            Some(_worker) => match edit {
                Some((update, goto)) => {
                    // The command's checkpoint is the run's: it keeps the run's metadata.
                    let commanding = engine.clone().with_options(crate::engine::RunOptions {
                        lease: request.lease.clone(),
                        metadata: request.metadata.clone().map(Arc::new),
                        ..Default::default()
                    });
                    match commanding.command(&thread_id, update, goto).await {
                        Ok(_) => engine.run(*request).await,
                        Err(e) => Err(e),
                    }
                }
                None => engine.run(*request).await,
            },
        };
        // The engine (and with it every sender of its events) is gone before its end is told.
        drop(engine);
        keeping.abort();
        // Its trace is whole now: stored before its end is, so whoever sees the run ended
        // finds all of it. A trace that could not be stored loses only itself.
        if ran {
            let _ = store_trace(&*manager.store, &trace, &run_id, &thread_id, claim.as_deref());
        }
        if let (Some(quotas), Some(owner), Ok(o)) = (&manager.quotas, &owner, &outcome) {
            quotas.spend(
                manager.store.as_ref(),
                owner,
                o.run_usage.total_tokens,
                o.run_usage.cost,
            );
        }
        let error = end_error(&outcome);
        // Recorded whether or not a client still listens, and before a stream closes: a client
        // that finds the stream closed asks the run's status to know whether to reconnect.
        let status = run_status(&outcome);
        // The webhook's call is recorded before the end: a process that dies between the two
        // leaves a delivery that waits for the run, which the next process ends.
        if let Some(plan) = webhook
            && let Ok(Some(row)) = manager.store.get_run(&run_id)
        {
            crate::server::webhook::enqueue(&manager.store, &plan, &row, status, error.as_ref());
        }
        manager.set_status(&run_id, status, error);
        *lock(&manager.ended).entry(status.as_str()).or_default() += 1;
        // Nobody waiting for the run's end is no failure.
        let _ = ended.send(true);
        let _ = tx.send(outcome);
        let _ = released.await;
        if temporary {
            // A thread nobody can name again: failing to delete it leaves only garbage behind.
            manager.remove_temporary(&thread_id);
            lock(&manager.runs).retain(|_, r| r.thread_id != thread_id);
        }
    }
}

/// How often a running run's trace is stored when it changed.
const TRACE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Stores the run's trace every [`TRACE_EVERY`] while it changes, so a run executing on one
/// process is traced on every other, and a killed one keeps what it did. Aborted at the run's
/// end, which stores it whole.
async fn keep_trace(
    store: Arc<dyn crate::checkpoint::Checkpointer>,
    trace: Arc<std::sync::Mutex<super::trace::Recorder>>,
    run_id: String,
    thread_id: String,
    claim: Option<String>,
) {
    loop {
        tokio::time::sleep(TRACE_EVERY).await;
        if !lock(&trace).dirty() {
            continue;
        }
        let (store, trace, run_id, thread_id, claim) = (
            store.clone(),
            trace.clone(),
            run_id.clone(),
            thread_id.clone(),
            claim.clone(),
        );
        let stored =
            tokio::task::spawn_blocking(move || store_trace(&*store, &trace, &run_id, &thread_id, claim.as_deref()))
                .await;
        if let Ok(Err(e)) = stored {
            tracing::warn!(error = %e, "a run's trace could not be stored");
        }
    }
}

/// Stores the run's trace as it is now (while the run is still `claim`'s, for a worker's).
fn store_trace(
    store: &dyn crate::checkpoint::Checkpointer,
    trace: &std::sync::Mutex<super::trace::Recorder>,
    run_id: &str,
    thread_id: &str,
    claim: Option<&str>,
) -> Result<(), crate::checkpoint::CheckpointError> {
    let (json, usage) = {
        let mut t = lock(trace);
        t.stored();
        (t.json(), t.usage().json())
    };
    store.put_trace(
        &crate::checkpoint::TraceRow {
            run_id: run_id.to_string(),
            thread_id: thread_id.to_string(),
            trace: json,
            usage,
            updated_at: crate::clock::now(),
        },
        claim,
    )
}

/// What a run's row records of its end: why it failed or was cancelled.
pub(super) fn end_error(outcome: &Result<RunOutcome, EngineError>) -> Option<Value> {
    match outcome {
        Ok(o) if o.status == Status::Failed => Some(failure(o)),
        // Cancelled: the thread waits where the run stopped, and says why.
        Ok(o) if o.status == Status::Cancelled => Some(json!({
            "error": "UserInterrupt",
            "message": "interrupt requested via POST /threads/{thread_id}/runs/{run_id}/cancel",
        })),
        Err(e) => Some(json!({"error": "EngineError", "message": e.to_string()})),
        Ok(_) => None,
    }
}

/// Why a run failed, as its row, its `error` event, its thread's `error` and a wait's
/// `__error__` say it: the error class of the failure and its message.
pub(crate) fn failure(o: &RunOutcome) -> Value {
    json!({
        "error": o.error_class.clone().unwrap_or_else(|| "RunError".into()),
        "message": o.error.clone().unwrap_or_default(),
    })
}

/// What the run's checkpoints and its stream say of it beside the thread's metadata.
pub(crate) fn checkpoint_metadata(row: &RunRow) -> Map<String, Value> {
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
    metadata
}

/// What the caller of [`RunManager::create`] read of the run's thread's record.
pub(super) enum ThreadRecord {
    /// Nothing: read there when needed.
    Unread,
    /// The record, or that there is none.
    Read(Option<ThreadMeta>),
    /// Nothing, and nothing is to be read: a server whose runs execute on workers has the
    /// admission stamp the record as it finds it, and say whether the thread exists. Only for
    /// a new run of input on a named thread (its caller decides): a command, an answer or a
    /// fork needs the thread read first.
    Stamped,
}

fn new_meta(thread_id: &str) -> ThreadMeta {
    let now = crate::clock::now();
    ThreadMeta {
        thread_id: thread_id.to_string(),
        created_at: now.clone(),
        updated_at: now,
        metadata: Value::Object(Map::new()),
        ttl: None,
    }
}

/// The run's first event, its end watched meanwhile: the error of a run that failed before it
/// started; `None` for one that ended without an event (cancelled while it waited for a
/// worker). An end that comes first (the run may send its events and its end between the two
/// channels' looks) is put back into `done` for its reader, who reads it after the events sent
/// before it: a oneshot answers once, and would panic if polled again.
async fn first_event(
    events: &mut Receiver,
    done: &mut oneshot::Receiver<Result<RunOutcome, EngineError>>,
) -> Result<Option<Envelope>, EngineError> {
    let ended = tokio::select! {
        biased;
        Some(first) = events.recv() => return Ok(Some(first)),
        outcome = &mut *done => outcome,
    };
    let (tx, again) = oneshot::channel();
    match ended {
        Ok(Err(e)) => return Err(e),
        Ok(outcome) => {
            let _ = tx.send(outcome);
        }
        // Its task went without an outcome: so does the one put back (`tx` dropped).
        Err(_) => {}
    }
    *done = again;
    // Its end came first: its events, if it sent any, are still to be read.
    Ok(events.recv().await)
}

/// The end of a run cancelled before it had a worker.
pub(super) fn never_started(thread_id: &str) -> RunOutcome {
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
        run_usage: Default::default(),
        handoffs: Vec::new(),
    }
}

/// A run's status as LangGraph reports it: a run that stopped at a gate succeeded (its thread
/// is `interrupted`).
pub(crate) fn run_status(outcome: &Result<RunOutcome, EngineError>) -> RunStatus {
    match outcome {
        Ok(o) => match o.status {
            Status::Done | Status::Interrupted => RunStatus::Success,
            Status::Failed => RunStatus::Error,
            Status::Cancelled => RunStatus::Interrupted,
        },
        Err(_) => RunStatus::Error,
    }
}

/// How many runs a process remembers: past it, the oldest ended ones are forgotten (their rows,
/// threads and checkpoints stay, and every reader of an ended run falls back to its row, as
/// after a restart). An ended run's record is about a kilobyte, more with the frames of a
/// resumable stream: with 10,000, a server under steady load had grown to 29.8 MiB after
/// 12,000 runs and was still growing; with 1,000 it levels off at 20.6 MiB.
const KEPT_RUNS: usize = 1_000;

/// Forgets the oldest ended runs once more than `keep` are remembered, down to nine tenths of
/// `keep`, so that the sort is paid once per tenth of `keep` runs. Runs whose frames readers
/// may still rejoin are forgotten after those with nothing but a status.
fn prune<S>(runs: &mut std::collections::HashMap<String, Live<S>>, keep: usize) {
    if runs.len() < keep {
        return;
    }
    let mut ended: Vec<(bool, String)> = runs
        .values()
        .filter(|r| !r.is_active())
        .map(|r| (r.stream.is_some(), r.run_id.clone()))
        .collect();
    // Run ids are UUIDv7: in creation order.
    ended.sort();
    let excess = runs.len() - keep * 9 / 10;
    for (_, id) in ended.into_iter().take(excess) {
        runs.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_run_whose_end_is_seen_before_its_first_event_still_answers_its_end() {
        let (sender, mut events) = crate::engine::events::Events::channel();
        let (tx, mut done) = oneshot::channel();
        // Its end is there at the first look, its events not yet (sent between the looks).
        tx.send(Ok(never_started("t"))).unwrap();
        let late = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            sender.send(crate::engine::events::Event::RunStart {
                thread_id: "t".into(),
                workflow: "w".into(),
                resumed: false,
                checkpoint_id: String::new(),
            });
        });
        let first = first_event(&mut events, &mut done)
            .await
            .unwrap()
            .expect("its first event");
        assert!(matches!(first.event, crate::engine::events::Event::RunStart { .. }));
        late.await.unwrap();
        // Its reader reads its end after its events (polled again, the first receiver panics).
        let outcome = done.await.expect("its end, put back").unwrap();
        assert_eq!(outcome.status, Status::Cancelled);

        // A run that ended without an outcome or an event: neither, and no panic.
        let (sender, mut events) = crate::engine::events::Events::channel();
        let (tx, mut done) = oneshot::channel::<Result<RunOutcome, EngineError>>();
        drop((tx, sender));
        assert!(first_event(&mut events, &mut done).await.unwrap().is_none());
        assert!(done.await.is_err());
    }

    fn record(run_id: &str, status: RunStatus) -> Live<()> {
        Live {
            run_id: run_id.into(),
            thread_id: "t".into(),
            status,
            stopper: Stopper::default(),
            ended: tokio::sync::watch::channel(false).1,
            stream: None,
            rollback_to: None,
            trace: None,
            had_worker: true,
            place: crate::server::manager::Place::Here,
        }
    }

    #[test]
    fn the_oldest_ended_runs_are_forgotten_never_a_running_one() {
        let mut runs: std::collections::HashMap<String, Live<()>> = (0..10)
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
        let mut runs: std::collections::HashMap<String, Live<()>> = (0..10)
            .map(|i| {
                let mut r = record(&format!("r{i}"), RunStatus::Success);
                // The oldest three were resumable: what readers join stays for them.
                if i < 3 {
                    r.stream = Some(Arc::new(()));
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
