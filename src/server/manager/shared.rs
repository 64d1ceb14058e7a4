//! Runs on a database many processes share (PostgreSQL): the API's side and the workers'.
//!
//! - The API's side ([`Role::Api`]) admits a run through the store's queue (atomic per thread
//!   whichever process asks), and reads what it does from the run's event log: its record
//!   among the live runs is a reader's ([`Place::Remote`]), fed by a tail of the log that wakes
//!   on the database's notices, and what it hands up (`Queued`: events, end, stopper) is what
//!   a run of this process would hand up, so streams, waits, joins and routes above do not
//!   know where the run executes. Its cancel is a request through the queue.
//! - A worker ([`Role::Worker`], [`Worker`]) claims runs from the queue — the thread's lease
//!   taken in the claim's transaction —, executes each as a run of its own process would be
//!   ([`Place::Claimed`]), and logs its events and its end for whichever process reads them;
//!   its heartbeat keeps its claims, and a worker whose heartbeat stops loses them to another
//!   once its leases expire: that one resumes each run from its last checkpoint.
//!
//! A log record is an engine event ([`Envelope`], as `--stream jsonl` writes it) or the run's
//! end: `{"type": "__end__", "outcome": …}` or `{"type": "__failed__", "error": …}`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Semaphore, broadcast, oneshot, watch};

use super::request::{CreateRun, Multitask};
use super::start::{Stopper, ThreadRecord, never_started, run_status};
use super::{Live, Place, RunManager, RunsError, lock};
use crate::checkpoint::queue::{Claimed, Ended, Notice, Records, RunQueue};
use crate::checkpoint::{CheckpointError, LeaseClaim, RunRow, RunStatus};
use crate::engine::events::{Envelope, Events};
use crate::engine::{EngineError, RunOutcome, Status};
use crate::server::Graph;

/// What a run manager is to its store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// The one process of an embedded store: its runs execute here, in its own line.
    Local,
    /// The API of a shared database: runs execute on workers; this process reads them.
    Api,
    /// A worker of a shared database, by its id: it executes the runs it claims.
    Worker(String),
}

/// How often a reader or a worker looks at the database when no notice woke it: the fallback
/// when notices are lost, and how soon a worker finds a run whose worker died.
const POLL: Duration = Duration::from_millis(500);
/// The most events one read of a run's log takes.
const BATCH: usize = 256;

/// A run's end, as logged.
fn end_record(outcome: &Result<RunOutcome, EngineError>) -> String {
    let record = match outcome {
        Ok(o) => json!({"type": "__end__", "outcome": o}),
        Err(e) => json!({"type": "__failed__", "error": error_kind(e), "message": e.to_string()}),
    };
    record.to_string()
}

/// The variant of an engine error a reader on another process rebuilds (its status code).
fn error_kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::Input(_) => "input",
        EngineError::NotInterrupted(_) => "not_interrupted",
        EngineError::BadAnswer(_) => "bad_answer",
        _ => "other",
    }
}

/// A logged record read back: an event, or the run's end.
enum Record {
    Event(Box<Envelope>),
    End(Box<Result<RunOutcome, EngineError>>),
}

fn parse_record(body: &str) -> Result<Record, String> {
    let value: Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
    match value.get("type").and_then(Value::as_str) {
        Some("__end__") => {
            let outcome =
                serde_json::from_value(value.get("outcome").cloned().unwrap_or_default()).map_err(|e| e.to_string())?;
            Ok(Record::End(Box::new(Ok(outcome))))
        }
        Some("__failed__") => {
            let message = value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let thread = String::new();
            let e = match value.get("error").and_then(Value::as_str) {
                Some("input") => EngineError::Input(message),
                Some("not_interrupted") => EngineError::NotInterrupted(thread),
                Some("bad_answer") => EngineError::BadAnswer(message),
                _ => EngineError::Incompatible(message),
            };
            Ok(Record::End(Box::new(Err(e))))
        }
        _ => Ok(Record::Event(Box::new(
            serde_json::from_value(value).map_err(|e| e.to_string())?,
        ))),
    }
}

/// Waits for a notice `wanted` accepts (or one saying notices were lost), at most `POLL`:
/// the notice `wanted` accepted, if that is what woke it.
async fn wake(notices: &mut broadcast::Receiver<Notice>, wanted: impl Fn(&Notice) -> bool) -> Option<Notice> {
    let deadline = tokio::time::sleep(POLL);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return None,
            notice = notices.recv() => match notice {
                Ok(n) if wanted(&n) => return Some(n),
                Ok(Notice::Lagged) => return None,
                Ok(_) => {}
                // Fell behind: whatever it missed is looked at again.
                Err(broadcast::error::RecvError::Lagged(_)) => return None,
                Err(broadcast::error::RecvError::Closed) => {
                    deadline.as_mut().await;
                    return None;
                }
            },
        }
    }
}

impl<S: Send + Sync + 'static> RunManager<S> {
    /// The shared database's queue, when this manager's role uses one.
    pub(super) fn queue(&self) -> Result<&dyn RunQueue, RunsError> {
        self.store.queue().ok_or_else(|| {
            RunsError::Invalid("this checkpoint database is not one many processes share (use PostgreSQL)".into())
        })
    }

    /// Whether runs of this manager execute on workers elsewhere.
    pub(super) fn is_api(&self) -> bool {
        self.role == Role::Api
    }

    /// The worker id, for a worker's manager.
    fn worker_id(&self) -> Option<&str> {
        match &self.role {
            Role::Worker(id) => Some(id),
            _ => None,
        }
    }

    /// The API's start of a run: admitted through the queue, read from its log.
    pub(super) async fn start_remote(self: &Arc<Self>, req: CreateRun) -> Result<super::Queued, RunsError> {
        let thread_id = req.thread.clone().unwrap_or_else(crate::checkpoint::new_id);
        if matches!(req.strategy, Multitask::Interrupt | Multitask::Rollback) {
            self.stop_thread_runs(&thread_id, req.strategy == Multitask::Rollback)
                .await?;
        }
        let deleting = lock(&self.deleting).contains(&thread_id);
        // A run of input on a named thread, the common case: its thread's record is read,
        // stamped and written by the admission, which finds whether the thread exists.
        let stamped = req.thread.is_some()
            && !deleting
            && req.resume.is_none()
            && req.edit.is_none()
            && req.checkpoint_id.is_none()
            && req.resumed.is_none();
        let record = if stamped {
            ThreadRecord::Stamped
        } else {
            // The thread's record, read once: whether the thread exists, and what the run adds to.
            let meta = match &req.thread {
                Some(_) if deleting => None,
                Some(t) => self.store.get_thread_meta(t)?,
                None => None,
            };
            let known = match &req.thread {
                Some(_) if deleting => false,
                Some(t) => meta.is_some() || self.store.get_thread(t)?.is_some(),
                None => true,
            };
            if !known && !req.create_thread {
                return Err(RunsError::NotFound("Thread or assistant not found.".into()));
            }
            ThreadRecord::Read(meta)
        };
        let temporary = req.temporary;
        // Listening before the run is in line: no notice of its events can come before its
        // reader looks, so the reader's first look waits for one.
        let notices = self.queue()?.subscribe(true)?;
        let created = self.create(req, &thread_id, record)?;
        Ok(self.proxy(
            created.row,
            created.graph,
            Reading {
                new_input: created.new_input,
                resumable: created.resumable,
                stateless: created.stateless,
                cancel_on_disconnect: created.cancel_on_disconnect,
                temporary,
                admitted: Some(notices),
            },
        ))
    }

    /// A reader of run `row`, which a worker executes (or executed): for a client joining the
    /// stream of a run this process did not start.
    pub(crate) fn follow(self: &Arc<Self>, row: RunRow, graph: Arc<Graph>) -> super::Queued {
        self.proxy(
            row,
            graph,
            Reading {
                new_input: false,
                resumable: true,
                stateless: false,
                cancel_on_disconnect: false,
                temporary: false,
                admitted: None,
            },
        )
    }

    /// The record of a run executing elsewhere, and what its starter reads of it.
    fn proxy(self: &Arc<Self>, row: RunRow, graph: Arc<Graph>, r: Reading) -> super::Queued {
        let (run_id, thread_id) = (row.run_id.clone(), row.thread_id.clone());
        let (events, rx) = Events::channel();
        let (ended_tx, ended_rx) = watch::channel(false);
        let (done_tx, done) = oneshot::channel();
        let (release, released) = oneshot::channel::<()>();
        let store = self.store.clone();
        let cancelled = run_id.clone();
        let stopper = Stopper::remote(Arc::new(move || {
            if let Some(q) = store.queue() {
                // A cancel that cannot be stored leaves the run going: its reader is gone.
                let _ = q.cancel(&cancelled, "interrupt");
            }
        }));
        lock(&self.runs).insert(
            run_id.clone(),
            Live {
                run_id: run_id.clone(),
                thread_id: thread_id.clone(),
                status: row.status,
                rollback_to: None,
                stopper: stopper.clone(),
                ended: ended_rx,
                stream: None,
                // Its trace is its worker's, read from the store.
                trace: None,
                had_worker: true,
                place: Place::Remote,
            },
        );
        let manager = self.clone();
        let temporary = r.temporary;
        let admitted = r.admitted;
        tokio::spawn(async move {
            let outcome = manager.tail(&run_id, &thread_id, &events, admitted).await;
            drop(events);
            let status = match &outcome {
                Ok(Ok(o)) => Some(run_status(&Ok(o.clone()))),
                Ok(Err(_)) => Some(RunStatus::Error),
                Err(_) => None,
            };
            if let Some(live) = lock(&manager.runs).get_mut(&run_id) {
                live.status = status.unwrap_or(RunStatus::Error);
            }
            let _ = ended_tx.send(true);
            let outcome = outcome.unwrap_or_else(|e| Err(EngineError::Incompatible(e)));
            let _ = done_tx.send(outcome);
            let _ = released.await;
            if temporary {
                manager.remove_temporary(&thread_id);
                lock(&manager.runs).remove(&run_id);
            }
        });
        super::Queued {
            run_id: row.run_id.clone(),
            thread_id: row.thread_id.clone(),
            graph,
            row,
            new_input: r.new_input,
            resumable: r.resumable,
            stateless: r.stateless,
            cancel_on_disconnect: r.cancel_on_disconnect,
            events: rx,
            done,
            stopper,
            release,
        }
    }

    /// Relays run `run_id`'s logged events to `events` until its end: the end logged by its
    /// worker, or — a run that ended without one (cancelled before a worker took it, rolled
    /// back and deleted) — an end made from its row. `Err`: the log could not be read.
    /// `admitted`: the run was just admitted, and these notices listened to since before: its
    /// log is empty and its row pending until a notice says otherwise.
    async fn tail(
        &self,
        run_id: &str,
        thread_id: &str,
        events: &Events,
        admitted: Option<broadcast::Receiver<Notice>>,
    ) -> Result<Result<RunOutcome, EngineError>, String> {
        let queue = self.queue().map_err(|e| e.to_string())?;
        let id = run_id.to_string();
        let told = |n: &Notice| matches!(n, Notice::Events(r, _) | Notice::Ended(r) if *r == id);
        // Records a notice carried: read from it rather than from the log, when they follow
        // what was read.
        let mut carried = None;
        let mut notices = match admitted {
            Some(mut notices) => {
                carried = records(wake(&mut notices, told).await);
                notices
            }
            None => queue.subscribe(true).map_err(|e| e.to_string())?,
        };
        let mut after = 0;
        let mut sent = 0usize;
        loop {
            let batch = match carried.take().map(|r| following(&r, after)) {
                Some(Carried::New(batch)) => batch,
                // A read since covered them: nothing new.
                Some(Carried::Read) => {
                    carried = records(wake(&mut notices, told).await);
                    continue;
                }
                Some(Carried::Gap) | None => patiently(run_id, || queue.events(run_id, after, BATCH)).await?,
            };
            let read = batch.len();
            for (seq, body) in batch {
                after = seq;
                match parse_record(&body) {
                    Ok(Record::Event(envelope)) => {
                        events.forward(*envelope);
                        sent += 1;
                    }
                    Ok(Record::End(outcome)) => return Ok(*outcome),
                    Err(e) => tracing::warn!(run_id, seq, error = %e, "a logged event cannot be read"),
                }
            }
            if read == BATCH {
                continue;
            }
            if read > 0 {
                // What a notice told is read: the run goes on (its end is logged, or told by a
                // notice of its own, or found by the poll).
                carried = records(wake(&mut notices, told).await);
                continue;
            }
            let row = patiently(run_id, || self.store.get_run(run_id)).await?;
            if row.as_ref().is_none_or(|r| !r.status.is_active()) {
                // Its end may have been logged just before its row was marked: one more look.
                let last = patiently(run_id, || queue.events(run_id, after, BATCH)).await?;
                if !last.is_empty() {
                    continue;
                }
                return Ok(Ok(ended_without_record(thread_id, row.as_ref(), sent)));
            }
            carried = records(wake(&mut notices, told).await);
        }
    }

    /// The API's cancel of a run a worker executes: asked through the queue; with `wait` (or a
    /// rollback, which the worker does and then deletes the run), answered once it ended.
    pub(super) async fn cancel_remote(&self, run_id: &str, action: &str, wait: bool) -> Result<(), RunsError> {
        self.queue()?.cancel(run_id, action)?;
        if wait || action == "rollback" {
            self.wait_inactive(run_id).await?;
        }
        Ok(())
    }

    /// Stops every active run of `thread_id`, wherever it executes, newest first, each waited
    /// for.
    pub(super) async fn stop_thread_runs_remote(&self, thread_id: &str, rollback: bool) -> Result<(), RunsError> {
        let mut active = self
            .store
            .list_runs(Some(thread_id), &[RunStatus::Pending, RunStatus::Running])?;
        active.sort_by(|a, b| b.run_id.cmp(&a.run_id));
        let action = if rollback { "rollback" } else { "interrupt" };
        for run in active {
            self.cancel_remote(&run.run_id, action, true).await?;
        }
        Ok(())
    }

    /// Waits until run `run_id` is no longer active (or no longer exists).
    async fn wait_inactive(&self, run_id: &str) -> Result<(), RunsError> {
        let mut notices = self.queue()?.subscribe(false)?;
        loop {
            if self.store.get_run(run_id)?.is_none_or(|r| !r.status.is_active()) {
                return Ok(());
            }
            let id = run_id.to_string();
            wake(&mut notices, |n| matches!(n, Notice::Ended(r) if *r == id)).await;
        }
    }
}

/// Reads `read` (of run `run_id`'s log or row) until the database answers it: a reader of a
/// run waits out an outage longer than a call keeps trying (the run waits it out too, and goes
/// on after it), its stream kept open, rather than ending with an error. Another failure is
/// the reader's to report.
async fn patiently<T>(run_id: &str, read: impl FnMut() -> Result<T, CheckpointError>) -> Result<T, String> {
    while_unreachable(run_id, "a run's log cannot be read", || false, read)
        .await
        .map_err(|e| e.to_string())
}

/// Makes `call` again while it fails because the database cannot be reached, pausing up to
/// 5 s between tries, until it answers otherwise or `give_up` says so. Each try is one
/// ([`crate::checkpoint::trying_once`]): the pauses hold no thread, however many runs and
/// readers wait.
async fn while_unreachable<T>(
    run_id: &str,
    what: &str,
    give_up: impl Fn() -> bool,
    mut call: impl FnMut() -> Result<T, CheckpointError>,
) -> Result<T, CheckpointError> {
    let mut pause = Duration::from_millis(50);
    loop {
        match crate::checkpoint::trying_once(&mut call) {
            Err(CheckpointError::Unavailable(why)) if !give_up() => {
                tracing::warn!(run_id, error = %why, "{what}: the database cannot be reached, trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            answered => return answered,
        }
    }
}

/// The records a notice carried.
fn records(notice: Option<Notice>) -> Option<Arc<Records>> {
    match notice {
        Some(Notice::Events(_, records)) => records,
        _ => None,
    }
}

/// What carried records are to a reader that read up to a sequence number.
enum Carried {
    /// The records after it, numbered.
    New(Vec<(u64, String)>),
    /// All read already.
    Read,
    /// Some between are missing: the log is to be read.
    Gap,
}

fn following(records: &Records, after: u64) -> Carried {
    if records.from == 0 || records.from > after + 1 {
        return Carried::Gap;
    }
    let batch: Vec<(u64, String)> = (records.from..)
        .zip(records.bodies.iter().cloned())
        .filter(|(seq, _)| *seq > after)
        .collect();
    if batch.is_empty() {
        Carried::Read
    } else {
        Carried::New(batch)
    }
}

/// What the reader of a run elsewhere was asked for.
struct Reading {
    new_input: bool,
    resumable: bool,
    stateless: bool,
    cancel_on_disconnect: bool,
    temporary: bool,
    /// A run this process just admitted: the notices listened to since before.
    admitted: Option<broadcast::Receiver<Notice>>,
}

/// The end of a run whose worker logged none: cancelled before a worker claimed it (nothing
/// was sent), or ended by its row (rolled back, or a worker lost it to an error it could not
/// log).
fn ended_without_record(thread_id: &str, row: Option<&RunRow>, sent: usize) -> RunOutcome {
    let mut outcome = never_started(thread_id);
    if sent > 0 {
        outcome.status = match row.map(|r| r.status) {
            Some(RunStatus::Error) => Status::Failed,
            Some(RunStatus::Success) => Status::Done,
            _ => Status::Cancelled,
        };
        outcome.error = row
            .and_then(|r| r.error.as_ref())
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    outcome
}

/// Whether a run a dead worker had claimed had started, so that it goes on from where its
/// thread is rather than from its request: its input, answer or command is in a checkpoint it
/// made (its id in the checkpoint's run metadata), or — an answer stored before the next
/// checkpoint — the gate it answers waits no more.
fn had_started(store: &dyn crate::checkpoint::Checkpointer, run: &RunRow) -> Result<bool, RunsError> {
    let Some(head) = store.get_checkpoint(&run.thread_id, None)? else {
        return Ok(false);
    };
    let made_it = crate::engine::checkpoint_run_metadata(&head)
        .is_some_and(|m| m.get("run_id").and_then(Value::as_str) == Some(run.run_id.as_str()));
    if made_it {
        return Ok(true);
    }
    let answers = run
        .kwargs
        .get("command")
        .and_then(|c| c.get("resume"))
        .is_some_and(|r| !r.is_null());
    Ok(answers
        && crate::server::threads::pending_interrupts(&head, &store.get_writes(&run.thread_id, &head.checkpoint_id)?)
            .is_empty())
}

/// A worker of a shared database: claims runs while it has room, executes them, keeps its
/// heartbeat, answers cancels, and hands its runs back when it stops.
pub(crate) struct Worker<S> {
    manager: Arc<RunManager<S>>,
    /// How a claimed run's row becomes a run to create (its graph found by its assistant).
    make: Arc<dyn Fn(RunRow) -> Result<CreateRun, RunsError> + Send + Sync>,
    /// The assistants of the workflows it serves now: the runs it claims.
    serves: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
    slots: usize,
    ttl: Duration,
}

impl<S: Send + Sync + 'static> Worker<S> {
    /// A worker executing at most `slots` runs at once through `manager` (whose role is
    /// [`Role::Worker`]), its claims' leases and heartbeat lasting `ttl`; it claims the runs of
    /// the assistants `serves` names as it claims.
    pub(crate) fn new(
        manager: Arc<RunManager<S>>,
        make: Arc<dyn Fn(RunRow) -> Result<CreateRun, RunsError> + Send + Sync>,
        serves: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
        slots: usize,
        ttl: Duration,
    ) -> Worker<S> {
        Worker {
            manager,
            make,
            serves,
            slots,
            ttl,
        }
    }

    /// Claims and executes runs until `stop` turns true; then stops its runs at their next
    /// step boundary, hands them back to the queue, and retires its heartbeat.
    pub(crate) async fn work(self, mut stop: watch::Receiver<bool>) -> Result<(), RunsError> {
        let manager = self.manager.clone();
        let Some(worker_id) = manager.worker_id().map(str::to_string) else {
            return Err(RunsError::Invalid("a worker's run manager has the worker role".into()));
        };
        let queue = manager.queue()?;
        // A database out of reach as the worker starts is waited for, not a reason to stop
        // claiming for good while the process lives on.
        while let Err(e) = queue.heartbeat(&worker_id, self.ttl) {
            tracing::warn!(error = %e, "the worker cannot register its heartbeat; trying again");
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                _ = stop.changed() => return Ok(()),
            }
        }
        let heartbeat = tokio::spawn(beat(manager.clone(), worker_id.clone(), self.ttl));
        let cancels = tokio::spawn(answer_cancels(manager.clone()));
        let room = Arc::new(Semaphore::new(self.slots));
        let mut notices = queue.subscribe(false)?;
        // How many runs may be waiting unclaimed, as far as this worker knows: one for each
        // admission told, all of them after a poll or lost notices.
        let mut news = usize::MAX;
        // A claim whose call failed: the next call makes it again, the same claim. A try of it
        // may have committed with its answer lost and the database then out of reach past the
        // call's retries: its run is running under that claim, which only that claim finds
        // again (this worker's heartbeat keeps others off it).
        let mut unanswered: Option<LeaseClaim> = None;
        loop {
            if *stop.borrow() {
                break;
            }
            let permit = tokio::select! {
                permit = room.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = stop.changed() => break,
            };
            // The claim looks at the queue as it is now: what the notices received so far told
            // is covered by it. A worker claims while runs may wait (as many as it was told
            // of, until one look finds none), then waits for news: one look per run told of,
            // not one more per claim, and none per notice of a burst a look covered.
            news = news.saturating_add(drain(&mut notices));
            let claim = unanswered.take().unwrap_or_else(|| LeaseClaim {
                thread_id: String::new(),
                owner: crate::checkpoint::new_id(),
                pid: std::process::id(),
                host: crate::engine::host().to_string(),
                ttl: self.ttl,
                replace: None,
            });
            let serves = (self.serves)();
            match manager.queue()?.claim_serving(&worker_id, &claim, Some(&serves)) {
                Ok(Some(claimed)) => {
                    let (manager, make) = (manager.clone(), self.make.clone());
                    tokio::spawn(async move {
                        execute(manager, make, claimed, self.ttl).await;
                        drop(permit);
                    });
                    news = news.saturating_sub(1);
                    if news == 0 {
                        tokio::select! {
                            told = queued(&mut notices) => news = told,
                            _ = stop.changed() => {}
                        }
                    }
                }
                Ok(None) => {
                    drop(permit);
                    news = 0;
                    tokio::select! {
                        told = queued(&mut notices) => news = told,
                        _ = stop.changed() => {}
                    }
                }
                Err(e) => {
                    drop(permit);
                    tracing::warn!(error = %e, "cannot claim a run");
                    unanswered = Some(claim);
                    tokio::select! {
                        () = tokio::time::sleep(POLL) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
        // Drain: every run stops at its step boundary and goes back to the queue.
        manager.stop_all().await;
        cancels.abort();
        heartbeat.abort();
        let _ = manager.queue()?.retire(&worker_id);
        Ok(())
    }
}

/// Waits for an admission's notice, at most `POLL`: how many runs may wait to be claimed (one
/// told of; all of them after the poll or lost notices).
async fn queued(notices: &mut broadcast::Receiver<Notice>) -> usize {
    let deadline = tokio::time::sleep(POLL);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return usize::MAX,
            notice = notices.recv() => match notice {
                Ok(Notice::Queued) => return 1,
                Ok(Notice::Lagged) | Err(broadcast::error::RecvError::Lagged(_)) => return usize::MAX,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    deadline.as_mut().await;
                    return usize::MAX;
                }
            },
        }
    }
}

/// Takes the notices received so far (a look at the queue follows, which covers them): how
/// many runs they say may wait to be claimed (all of them, when notices were lost).
fn drain(notices: &mut broadcast::Receiver<Notice>) -> usize {
    let mut queued = 0usize;
    loop {
        match notices.try_recv() {
            Ok(Notice::Queued) => queued = queued.saturating_add(1),
            Ok(Notice::Lagged) | Err(broadcast::error::TryRecvError::Lagged(_)) => queued = usize::MAX,
            Ok(_) => {}
            Err(_) => return queued,
        }
    }
}

/// Renews the worker's heartbeat every third of its time to live.
async fn beat<S: Send + Sync + 'static>(manager: Arc<RunManager<S>>, worker_id: String, ttl: Duration) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        if let Ok(q) = manager.queue()
            && let Err(e) = q.heartbeat(&worker_id, ttl)
        {
            tracing::warn!(error = %e, "the worker's heartbeat could not be stored");
        }
    }
}

/// Stops the runs this worker executes when some process asks: on the notice (that run's row
/// looked at), and by one look at every claimed run's row on each poll or lost notice (a notice
/// lost while the listener reconnected).
async fn answer_cancels<S: Send + Sync + 'static>(manager: Arc<RunManager<S>>) {
    let Ok(queue) = manager.queue() else { return };
    let Ok(mut notices) = queue.subscribe(false) else {
        return;
    };
    // The runs whose cancel is under way here: a poll during one does not ask it again.
    let asking: Arc<Mutex<HashSet<String>>> = Arc::default();
    loop {
        let told = tokio::select! {
            () = tokio::time::sleep(POLL) => None,
            notice = notices.recv() => match notice {
                Ok(Notice::Cancel(id)) => Some(id),
                Ok(Notice::Lagged) | Err(broadcast::error::RecvError::Lagged(_)) => None,
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Closed) => {
                    tokio::time::sleep(POLL).await;
                    None
                }
            },
        };
        let claimed: Vec<(String, String)> = lock(&manager.runs)
            .values()
            .filter(|r| r.place == Place::Claimed && r.is_active())
            .filter(|r| told.as_ref().is_none_or(|id| *id == r.run_id))
            .filter(|r| !lock(&asking).contains(&r.run_id))
            .map(|r| (r.run_id.clone(), r.thread_id.clone()))
            .collect();
        if claimed.is_empty() {
            continue;
        }
        let ids: Vec<String> = claimed.iter().map(|(run, _)| run.clone()).collect();
        let Ok(asked) = queue.cancels_asked(&ids) else { continue };
        for (run_id, asked) in asked {
            let Some((_, thread_id)) = claimed.iter().find(|(run, _)| *run == run_id) else {
                continue;
            };
            let action = match asked.as_str() {
                "rollback" => super::Cancel::Rollback,
                _ => super::Cancel::Interrupt,
            };
            let (m, thread_id, asking) = (manager.clone(), thread_id.clone(), asking.clone());
            lock(&asking).insert(run_id.clone());
            tokio::spawn(async move {
                let cancelled = m.cancel(&thread_id, &run_id, action, false).await;
                lock(&asking).remove(&run_id);
                if let Err(e) = cancelled {
                    tracing::warn!(run_id, error = %e, "a cancel asked through the queue failed");
                    // A rollback that could not be done leaves the run stopped where it was.
                    if let (super::Cancel::Rollback, Ok(q), Some(worker)) = (action, m.queue(), m.worker_id()) {
                        let error = json!({"error": "RollbackError", "message": e.to_string()});
                        let _ = q.finish(
                            &run_id,
                            worker,
                            Ended {
                                status: RunStatus::Interrupted,
                                error: Some(&error),
                                at: &crate::clock::now(),
                                record: None,
                            },
                        );
                    }
                }
            });
        }
    }
}

/// The longest a claimed run's event that nobody reads as it comes waits for a commit to
/// write it (see [`execute`]).
const LINGER: Duration = Duration::from_millis(100);

/// Which of a run's events its clients read as they come, by the stream modes the run was
/// created with (a joined stream shows some of them): every event for `tasks`, `debug` and
/// `events` (a task's start), a model's tokens for `messages` and `messages-tuple`, custom
/// events for `custom`; the run's first step's start for `values` and `checkpoints` (what the
/// run starts from is shown then, before its first step ends), unless the commit opening the
/// run's turn took it; a gate's question always. The others (with `values` and `updates`
/// alone: a later step's and a task's start, a model call's, the tokens) are written with the
/// step's commit; the run's own failure and end with its end (at once: nothing comes between),
/// so that a run cut off from its database, which is not ended but handed back, never logs
/// them.
#[derive(Debug, Clone, Copy)]
struct AsItComes {
    all: bool,
    tokens: bool,
    custom: bool,
    /// The first step's start is shown (`values`, `checkpoints`) and has not come yet.
    start: bool,
}

impl AsItComes {
    fn of(run: &RunRow) -> AsItComes {
        match crate::server::sse::Modes::parse(run.kwargs.get("stream_mode"), false) {
            Ok(m) => AsItComes {
                all: m.tasks || m.debug || m.events,
                tokens: m.messages || m.partial,
                custom: m.custom,
                start: m.values || m.checkpoints,
            },
            Err(_) => AsItComes {
                all: true,
                tokens: true,
                custom: true,
                start: true,
            },
        }
    }

    /// Whether `e` is written as it comes. `unwritten`: whether the run's first step's start
    /// still waits to be written (a commit under way may have taken it already).
    fn wants(&mut self, e: &Envelope, unwritten: impl Fn() -> bool) -> bool {
        use crate::engine::events::Event;
        match e.event {
            Event::Error { .. } | Event::RunEnd { .. } if e.ns.is_none() => false,
            _ if self.all => true,
            Event::Token { .. } => self.tokens,
            Event::Custom { .. } => self.custom,
            Event::StepStart { .. } if e.ns.is_none() => std::mem::take(&mut self.start) && unwritten(),
            Event::Interrupt { .. } | Event::Error { .. } | Event::RunEnd { .. } => true,
            _ => false,
        }
    }
}

/// Executes one claimed run: created as a run of this process, its events logged, its end
/// recorded — or, when the worker stops first, handed back to the queue.
async fn execute<S: Send + Sync + 'static>(
    manager: Arc<RunManager<S>>,
    make: Arc<dyn Fn(RunRow) -> Result<CreateRun, RunsError> + Send + Sync>,
    claimed: Claimed,
    ttl: Duration,
) {
    let Claimed {
        run,
        lease,
        orphaned,
        next_event,
        view,
    } = claimed;
    let run_id = run.run_id.clone();
    let mut as_it_comes = AsItComes::of(&run);
    // What this claim writes under: its own token, so a run claimed again (this worker taken
    // for dead meanwhile) is not written by this execution any more.
    let token = lease.owner.clone();
    let Ok(queue) = manager.queue() else { return };
    // The run's events: kept with its commits, the rest written here as they come.
    let log = Arc::new(super::journal::RunLog::new(
        manager.store.clone(),
        &run_id,
        &token,
        next_event,
    ));
    let started = async {
        let mut create = make(run.clone())?;
        let had_started = orphaned && had_started(&*manager.store, &run)?;
        create.resumed = Some(super::request::Resumed {
            row: run,
            was_running: had_started,
            claimed: Some((lease, ttl)),
            journal: Some(log.clone()),
            // Nothing logged: no worker executed it before (an engine's first event is logged
            // with its first write).
            fresh: next_event <= 1,
            view,
        });
        // The reader's process deletes a thread of the run's own when its reader is done.
        create.temporary = false;
        create.cancel_on_disconnect = false;
        let queued = manager.start(create).await?;
        manager.started(queued).await
    }
    .await;
    let running = match started {
        Ok(r) => r,
        Err(e) => {
            let error = json!({"error": "RunError", "message": e.to_string()});
            let outcome: Result<RunOutcome, EngineError> = Err(match e {
                RunsError::Engine(e) => e,
                other => EngineError::Incompatible(other.to_string()),
            });
            let body = end_record(&outcome);
            let _ = log.flush();
            let _ = queue.finish(
                &run_id,
                &token,
                Ended {
                    status: RunStatus::Error,
                    error: Some(&error),
                    at: &crate::clock::now(),
                    record: Some((log.next(), &body)),
                },
            );
            return;
        }
    };
    let super::start::Running {
        mut events,
        done,
        stopper,
        release,
        row,
        graph,
        ..
    } = running;
    // The events were recorded as they were sent: what comes through the channel only says
    // when to write what waits. A step's commit writes what was recorded before it: events
    // the run's clients do not read as they come wait a moment for it rather than taking a
    // write of their own.
    while let Some(first) = events.recv().await {
        if !as_it_comes.wants(&first, || log.start_unwritten()) {
            let linger = tokio::time::sleep(LINGER);
            tokio::pin!(linger);
            loop {
                tokio::select! {
                    () = &mut linger => break,
                    next = events.recv() => match next {
                        Some(e) if !as_it_comes.wants(&e, || log.start_unwritten()) => {}
                        _ => break,
                    },
                }
            }
        }
        while events.try_recv().is_ok() {}
        match log.flush() {
            Ok(true) => {}
            // Another worker took the run over: this one stops writing.
            Ok(false) => stopper.cancel(),
            Err(e) => tracing::warn!(run_id, error = %e, "a run's events could not be logged"),
        }
    }
    let outcome = done
        .await
        .unwrap_or_else(|_| Err(EngineError::Input("the run's task ended without an outcome".into())));
    drop(release);
    if log.is_lost() {
        return;
    }
    // The database could not be reached for longer than a call keeps trying (a managed
    // database failing over takes a minute or two): the run did not fail, its store did. What
    // it recorded since its last commit (that step's events, its failure and end) is dropped;
    // once the database answers again the run goes back to the queue, and whichever worker
    // claims it (this one too) goes on from its last checkpoint.
    if matches!(&outcome, Err(EngineError::Store(CheckpointError::Unavailable(_)))) {
        log.discard();
        tracing::warn!(
            run_id,
            "the database could not be reached: the run goes back to the queue once it can be"
        );
        until_reachable(&manager, &run_id, "a run could not be handed back", || {
            queue.release(&run_id, &token)
        })
        .await;
        return;
    }
    if matches!(log.flush(), Ok(false)) {
        return;
    }
    // A run this worker stopped as it shuts down goes back to the queue for another.
    let stopped_here = manager.stopping.load(std::sync::atomic::Ordering::SeqCst)
        && matches!(&outcome, Ok(o) if o.status == Status::Cancelled);
    if stopped_here {
        let _ = queue.release(&run_id, &token);
        return;
    }
    // A rollback is the cancel's to finish: it takes the thread back, then deletes the run, so
    // a reader waiting for the run sees it gone, never ended first.
    if matches!(&outcome, Ok(o) if o.status == Status::Cancelled)
        && queue.cancel_asked(&run_id).ok().flatten().as_deref() == Some("rollback")
    {
        return;
    }
    let status = run_status(&outcome);
    let error = super::start::end_error(&outcome);
    // Recorded before the end, as a run of one process records it (`start.rs`).
    crate::server::webhook::enqueue(&manager.store, &graph.plan, &row, status, error.as_ref());
    let body = end_record(&outcome);
    let end = Ended {
        status,
        error: error.as_ref(),
        at: &crate::clock::now(),
        record: Some((log.next(), &body)),
    };
    // Not given up while the database cannot be reached: a run whose end is not recorded
    // stays `running` under a worker that lives, its thread busy, until that worker stops.
    until_reachable(&manager, &run_id, "a run's end could not be recorded", || {
        queue.finish(&run_id, &token, end)
    })
    .await;
}

/// Makes `call` (a record of one of the worker's runs) until the database takes it, for as
/// long as the worker is not stopping (see [`while_unreachable`]). A worker that stops first
/// leaves the run to the queue: its heartbeat ends, and another worker takes the run over once
/// its lease has expired.
async fn until_reachable<S>(
    manager: &RunManager<S>,
    run_id: &str,
    what: &str,
    call: impl FnMut() -> Result<(), CheckpointError>,
) {
    let stopping = || manager.stopping.load(std::sync::atomic::Ordering::SeqCst);
    if let Err(e) = while_unreachable(run_id, what, stopping, call).await {
        tracing::warn!(run_id, error = %e, "{what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::events::Event;

    fn run(modes: Value) -> RunRow {
        RunRow {
            run_id: "r".into(),
            thread_id: "t".into(),
            assistant_id: "a".into(),
            status: RunStatus::Pending,
            created_at: String::new(),
            updated_at: String::new(),
            kwargs: json!({"stream_mode": modes}),
            multitask_strategy: "reject".into(),
            metadata: json!({}),
            error: None,
            event_ids: 0,
        }
    }

    fn at(ns: Option<&str>, event: Event) -> Envelope {
        Envelope {
            ts: String::new(),
            elapsed_ms: 0.0,
            ns: ns.map(Into::into),
            event,
        }
    }

    fn step_start(ns: Option<&str>) -> Envelope {
        at(
            ns,
            Event::StepStart {
                step: 0,
                tasks: vec![],
                nodes: vec![],
            },
        )
    }

    #[test]
    fn the_first_steps_start_goes_at_once_where_it_shows_what_the_run_starts_from() {
        for modes in [json!("values"), json!(["checkpoints"]), json!(["updates", "values"])] {
            let mut shown = AsItComes::of(&run(modes.clone()));
            // A subgraph's step does not show the run's start.
            assert!(!shown.wants(&step_start(Some("inner:1")), || true), "{modes}");
            assert!(shown.wants(&step_start(None), || true), "{modes}");
            // Later steps' starts wait for their commits.
            assert!(!shown.wants(&step_start(None), || true), "{modes}");
            // Not when a commit under way took it already.
            let mut taken = AsItComes::of(&run(modes.clone()));
            assert!(!taken.wants(&step_start(None), || false), "{modes}");
        }
        let mut updates = AsItComes::of(&run(json!("updates")));
        assert!(!updates.wants(&step_start(None), || true));
        let node = at(
            None,
            Event::NodeStart {
                step: 0,
                node: "n".into(),
                task_id: "t".into(),
                item: None,
            },
        );
        assert!(!AsItComes::of(&run(json!("values"))).wants(&node, || true));
        assert!(AsItComes::of(&run(json!("tasks"))).wants(&node, || true));
    }
}
