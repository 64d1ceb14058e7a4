//! What makes workflows run by themselves, in every process that serves a database: the cron
//! scheduler (`cron/scheduler.rs`), the webhook deliverer (`webhook/deliver.rs`), and the
//! registration of the schedules workflows declare (`cron/declared.rs`) at start and after
//! each reload.

use std::sync::Arc;

use tokio::sync::watch;

use super::Shared;
use super::cron::{Clock, Scheduler, Ticks};
use super::webhook::deliver::Deliverer;

/// How a server's schedules and webhooks are run: what `runner serve` and `runner worker`
/// give.
#[derive(Debug, Clone, Default)]
pub struct TriggerOptions {
    /// Where the scheduler reads the time.
    pub clock: Clock,
    /// The secret every webhook call is signed with (`--webhook-secret-env`); none: unsigned.
    pub webhook_secret: Option<String>,
}

/// The server's part of them.
#[derive(Debug, Default)]
pub(crate) struct Triggers {
    pub(crate) clock: Clock,
    pub(crate) webhook_secret: Option<String>,
    pub(crate) ticks: Ticks,
}

impl Triggers {
    pub(crate) fn new(options: TriggerOptions) -> Triggers {
        Triggers {
            clock: options.clock,
            webhook_secret: options.webhook_secret,
            ticks: Ticks::default(),
        }
    }
}

/// Registers the served workflows' schedules; a store that cannot take them is reported, and
/// the server goes on.
pub(crate) fn register(app: &Shared) {
    let Some(now) = app.triggers.clock.now_ms() else {
        tracing::warn!("the server's clock cannot be read: the workflows' schedules are not registered");
        return;
    };
    if let Err(e) = super::cron::register_declared(&app.graphs, &*app.store, now) {
        tracing::warn!(error = %e, "the workflows' schedules could not be registered");
    }
}

/// Starts the scheduler and the deliverer; they stop when `stop` turns true, and the handle
/// resolves once both have.
pub(crate) fn start(app: &Shared, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    register(app);
    let scheduler = Scheduler { app: app.clone() };
    let deliverer = Deliverer::new(
        Arc::clone(&app.store),
        app.settings.allow_net.clone(),
        app.triggers.webhook_secret.clone().map(String::into_bytes),
    );
    let (a, b) = (stop.clone(), stop);
    tokio::spawn(async move {
        tokio::join!(scheduler.run(a), deliverer.run(b));
    })
}

/// The scheduler's lines of `/metrics`.
pub(crate) fn render_metrics(app: &Shared, out: &mut String) {
    use std::fmt::Write as _;
    use std::sync::atomic::Ordering;
    let t = &app.triggers.ticks;
    let _ = writeln!(
        out,
        "# HELP runner_cron_scheduler_clock_seconds The scheduler's time at the end of its last pass over the crons.\n\
         # TYPE runner_cron_scheduler_clock_seconds gauge\nrunner_cron_scheduler_clock_seconds {}",
        t.last_pass.load(Ordering::SeqCst) as f64 / 1000.0
    );
    let _ = writeln!(
        out,
        "# HELP runner_cron_runs_started_total Runs this process started for cron ticks it claimed.\n\
         # TYPE runner_cron_runs_started_total counter\nrunner_cron_runs_started_total {}",
        t.started.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP runner_cron_ticks_lost_total Due cron ticks another process claimed first.\n\
         # TYPE runner_cron_ticks_lost_total counter\nrunner_cron_ticks_lost_total {}",
        t.lost.load(Ordering::Relaxed)
    );
}
