//! The scheduler: a task of every `runner serve` and `runner worker` that looks for due crons
//! once a second and starts one run per tick, however many processes serve the database.
//!
//! A due cron's tick is claimed in the database before its run is made: the claim moves the
//! cron's `next_run_at` from the tick to the first tick after now, only if it still is the
//! tick (a conditional update, on SQLite and PostgreSQL alike), so of the processes that saw
//! it due one claims it and starts the run, as a `POST /runs` would start it (through the run
//! queue on PostgreSQL). Missed ticks: a cron found due after ticks went by with no process
//! running (or a process busy longer than a tick) starts one run, and its next tick is the
//! first after now — the older ticks are skipped, as LangGraph's scheduler does (it runs a
//! due cron once and sets its next run from now). A cron whose `end_time` has passed starts
//! nothing. A process that dies between a claim and its run's row loses that tick.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::checkpoint::CronRow;
use crate::compile::schedule::Schedule;

/// How often due crons are looked for.
const POLL: Duration = Duration::from_secs(1);

/// Where the scheduler reads the time: the system's, or — for tests, which must not wait for
/// real minutes — a file holding milliseconds since the epoch, which the test moves forward.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    System,
    File(PathBuf),
}

impl Clock {
    /// Now, in milliseconds since the epoch; none when a clock file cannot be read (the
    /// scheduler then skips its pass).
    pub fn now_ms(&self) -> Option<i64> {
        match self {
            Clock::System => Some(crate::clock::now_ms()),
            Clock::File(path) => std::fs::read_to_string(path).ok()?.trim().parse().ok(),
        }
    }
}

/// What the scheduler of this process did, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Ticks {
    /// The clock's time at the end of the last pass (milliseconds; 0: none yet).
    pub last_pass: AtomicI64,
    /// Runs started for ticks this process claimed.
    pub started: AtomicU64,
    /// Ticks this process saw due but another claimed first.
    pub lost: AtomicU64,
}

/// The scheduler of one process.
pub(crate) struct Scheduler {
    pub(crate) app: crate::server::Shared,
}

impl Scheduler {
    /// Fires due ticks until `stop` turns true.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            if let Some(now) = self.app.triggers.clock.now_ms() {
                match self.pass(now).await {
                    Ok(()) => self.app.triggers.ticks.last_pass.store(now, Ordering::SeqCst),
                    Err(e) => tracing::warn!(error = %e, "the scheduler could not read the crons"),
                }
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Claims every tick due at `now` and starts its run.
    async fn pass(&self, now: i64) -> Result<(), crate::checkpoint::CheckpointError> {
        let store = self.app.store.clone();
        let due = tokio::task::spawn_blocking(move || store.due_crons(now))
            .await
            .map_err(|e| crate::checkpoint::CheckpointError::Backend(e.to_string()))??;
        for cron in due {
            let Some(at) = cron.next_run_at else { continue };
            // A schedule stored unreadable (written by another build) has no tick left.
            let next = Schedule::parse(&cron.schedule, cron.timezone.as_deref())
                .ok()
                .and_then(|s| s.next_after(now));
            let store = self.app.store.clone();
            let (id, stamp) = (cron.cron_id.clone(), crate::clock::at_ms(now));
            let claimed = tokio::task::spawn_blocking(move || store.claim_tick(&id, at, next, &stamp))
                .await
                .map_err(|e| crate::checkpoint::CheckpointError::Backend(e.to_string()))??;
            if !claimed {
                self.app.triggers.ticks.lost.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match start(&self.app, &cron).await {
                Ok(run_id) => {
                    self.app.triggers.ticks.started.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(cron_id = %cron.cron_id, run_id, tick = %crate::clock::at_ms(at), "a cron started a run");
                }
                Err(e) => tracing::warn!(
                    cron_id = %cron.cron_id, tick = %crate::clock::at_ms(at), error = e.detail,
                    "a cron's run could not be started"
                ),
            }
        }
        Ok(())
    }
}

/// Starts the run of one tick of `cron`, as `POST /runs` (or `/threads/{id}/runs`) starts a
/// run in the background: its request is the cron's payload, its metadata the cron's with the
/// payload's over it; a stateless cron's run keeps its thread when the cron says `keep`.
async fn start(app: &crate::server::Shared, cron: &CronRow) -> Result<String, crate::server::http::ApiError> {
    let mut kwargs = cron.payload.as_object().cloned().unwrap_or_default();
    let mut metadata = cron.metadata.as_object().cloned().unwrap_or_default();
    if let Some(Value::Object(own)) = kwargs.get("metadata") {
        metadata.extend(own.clone());
    }
    kwargs.insert("metadata".into(), Value::Object(metadata));
    if cron.thread_id.is_none() && cron.on_run_completed.as_deref() == Some("keep") {
        kwargs.entry("on_completion").or_insert(json!("keep"));
    }
    // The run is the cron owner's, as if they had started it; a cron nobody owns runs as the
    // server's own.
    let caller = crate::server::auth::Caller {
        user: cron.owner.clone(),
        admin: cron.owner.is_none(),
    };
    let row = crate::server::control::background(app, &caller, cron.thread_id.clone(), Value::Object(kwargs)).await?;
    Ok(row.run_id)
}
