//! `runner serve`'s library half: the LangGraph Server API over HTTP and server-sent events, so
//! that LangGraph's own clients (`langgraph-sdk`, agent-chat-ui) drive the workflows of a folder.
//!
//! The top layer beside the CLI: it may import the run builder, the engine, the compiler, the
//! checkpointer, diagnostics, the node kinds and the data store (`rag`, for the store
//! endpoints), never `cli` (and no clap type lives here). A
//! run it starts goes through the run builder ([`crate::run`]) and takes the thread's lease in
//! `Engine::run`, exactly as `runner run` does.
//!
//! - `graphs.rs`: the served workflows, their assistants, graph pictures and schemas, and
//!   clearing their node cache;
//! - `threads.rs`: threads, their state and history, read from the checkpointer;
//! - `runs.rs`: runs on a thread or stateless, streamed (SSE) or waited for;
//! - `manager/`: the run manager below HTTP: runs created, enqueued, claimed, cancelled,
//!   rolled back, joined, listed; the live runs of the process and its workers;
//! - `control.rs`: runs in the background, listed, looked at, joined, cancelled;
//! - `batch.rs`: `/runs/batch`, stateless runs started in the background together;
//! - `hub.rs`: a streamed run's frames, kept for the client that started it and any that join;
//! - `sse.rs`: the event stream's framing and the stream modes;
//! - `translate/`: how a run's engine events become the stream modes' events (`callbacks.rs`:
//!   the `events` mode);
//! - `store.rs`: the store endpoints, over the data store `store` nodes use;
//! - `metrics.rs`: `GET /metrics` in Prometheus's text format;
//! - `traces.rs`: runs' traces and threads' usage (runner's additions, for its Studio page);
//! - `crons.rs`, `cron/`: the API's crons, and the scheduler that fires them; `webhook/`:
//!   run webhooks, signed and delivered; `triggers.rs`: both started in every process;
//! - `conn.rs`: connections accepted and served (HTTP/1.1), closed when idle or too slow, and
//!   ended gracefully;
//! - `http.rs`: `{"detail": …}` errors (the run manager's mapped in one place), JSON bodies,
//!   CORS;
//! - `studio.rs`: the Studio page, embedded, at `/` and `/studio/…`.
//! - `auth/`: who calls (the shared key, JWTs, per-user keys), what they own, their quotas.

pub mod auth;
mod batch;
mod conn;
mod control;
mod cron;
mod crons;
mod graphs;
mod http;
mod hub;
mod log;
mod manager;
mod messages;
mod metrics;
mod routes;
mod runs;
mod sse;
mod store;
mod studio;
mod threads;
mod traces;
mod translate;
mod triggers;
mod ttl;
mod webhook;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;

pub(crate) use cron::cron_json;
pub use cron::{Clock, CronError};
pub use graphs::{Graph, Graphs, Rejected, Reloaded, assistant_id};
pub use triggers::TriggerOptions;
pub use ttl::ThreadTtls;

use crate::checkpoint::Checkpointer;
use crate::run::{RunError, RunSettings};

/// What every request handler shares.
pub(crate) struct App {
    graphs: Graphs,
    settings: RunSettings,
    /// Checkpoints, and the runs and thread metadata of the API (the run manager's store).
    store: Arc<dyn Checkpointer>,
    /// Every run's creation, line, end, cancel and rollback; the live runs of this process,
    /// with the frames readers join. On a database many processes share, its runs execute on
    /// workers (this process's `worker`, or others').
    runs: Arc<manager::RunManager<hub::Hub>>,
    /// This process's worker, on a database many processes share (none: API only, or an
    /// embedded store, whose runs execute in `runs`).
    worker: Option<Arc<manager::RunManager<hub::Hub>>>,
    /// How many runs the worker executes at once.
    slots: usize,
    /// Who may call, and what each caller owns and may spend.
    auth: auth::Auth,
    /// The data store (`--data-db`), opened once: the store endpoints and every run's `store`,
    /// `index` and `retrieve` nodes share it.
    data: crate::rag::DataStore,
    metrics: metrics::Metrics,
    /// Threads' time to live: the default, and how often expired threads are swept.
    ttls: ThreadTtls,
    /// Served by `runner dev`: a watcher reloads the folder as its files change.
    dev: bool,
    /// The scheduler's clock and what it did, and the webhooks' secret.
    triggers: triggers::Triggers,
}

pub(crate) type Shared = Arc<App>;

/// A server ready to accept connections: its graphs and its run settings, the checkpointer
/// opened once for every run.
pub struct Server {
    app: Shared,
}

impl Server {
    /// A server over `graphs`, whose runs are built from `settings`, at most `workers` of them
    /// executing at once; `auth` says who may call it (every request but the open paths of
    /// [`auth::is_open`] must carry a credential when it requires any) and what users may spend.
    ///
    /// On a database many processes share (PostgreSQL), the API's runs go through its queue,
    /// and `workers` is what this process's worker executes at once: 0 serves the API only,
    /// for workers elsewhere (`runner worker`). On an embedded store the runs execute here,
    /// and `workers` must be at least 1.
    pub fn new(
        graphs: Graphs,
        settings: RunSettings,
        auth: auth::AuthConfig,
        workers: usize,
        ttls: ThreadTtls,
    ) -> Result<Server, RunError> {
        let store = settings.open_store()?;
        let data = settings.data_store()?;
        let shared = store.queue().is_some();
        if workers == 0 && !shared {
            return Err(RunError::Conflict(
                "--workers 0 serves the API only, for workers that share its database: the checkpoint database must \
                 be PostgreSQL (--db postgres://…)",
            ));
        }
        let role = if shared {
            manager::Role::Api
        } else {
            manager::Role::Local
        };
        let runs = Arc::new(
            manager::RunManager::new(settings.clone(), store.clone(), data.clone(), workers.max(1), role)
                .with_thread_ttl(ttls.default_minutes)
                .with_quotas(auth.quotas),
        );
        let worker = (shared && workers > 0).then(|| {
            Arc::new(
                manager::RunManager::new(
                    settings.clone(),
                    store.clone(),
                    data.clone(),
                    workers,
                    manager::Role::Worker(crate::checkpoint::new_id()),
                )
                .with_thread_ttl(ttls.default_minutes)
                .with_quotas(auth.quotas),
            )
        });
        Ok(Server {
            app: Arc::new(App {
                data,
                metrics: metrics::Metrics::default(),
                graphs,
                settings,
                runs,
                worker,
                slots: workers,
                ttls,
                dev: false,
                triggers: triggers::Triggers::default(),
                auth: auth::Auth::new(auth, store.clone()),
                store,
            }),
        })
    }

    /// The same server, saying that a watcher reloads its folder (`runner dev`).
    pub fn dev(mut self) -> Server {
        if let Some(app) = Arc::get_mut(&mut self.app) {
            app.dev = true;
        }
        self
    }

    /// This server with its schedules read by `options.clock` and its webhooks signed with
    /// `options.webhook_secret`. Given before it serves.
    pub fn with_triggers(mut self, options: TriggerOptions) -> Server {
        if let Some(app) = Arc::get_mut(&mut self.app) {
            app.triggers = triggers::Triggers::new(options);
        }
        self
    }

    /// Starts this process's worker, if it has one: it claims runs until `stop` turns true,
    /// then stops them at their step boundary and hands them back. Its end is awaited through
    /// the handle.
    fn start_worker(&self, stop: tokio::sync::watch::Receiver<bool>) -> Option<tokio::task::JoinHandle<()>> {
        let manager = self.app.worker.clone()?;
        let app = self.app.clone();
        let make = Arc::new(move |row: crate::checkpoint::RunRow| manager::CreateRun::resumed(&app.graphs, row));
        let app = self.app.clone();
        let serves = Arc::new(move || app.graphs.all().iter().map(|g| g.assistant_id.clone()).collect());
        let ttl = self.app.settings.lease_ttl.value;
        let worker = manager::Worker::new(manager, make, serves, self.app.slots, ttl);
        Some(tokio::spawn(async move {
            if let Err(e) = worker.work(stop).await {
                tracing::error!(error = %e, "the worker stopped");
            }
        }))
    }

    /// Executes runs only, as a worker of a database many processes share, until `shutdown`
    /// resolves; then stops its runs at their next step boundary and hands them back to the
    /// queue (bounded by `timeout`). With `ops`, answers `GET /ok` and `GET /metrics` there
    /// until it returns (a probe sees the worker alive while it drains).
    pub async fn work(
        self,
        timeout: Duration,
        ops: Option<tokio::net::TcpListener>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let triggers = triggers::start(&self.app, stopped.clone());
        let Some(worker) = self.start_worker(stopped) else {
            return;
        };
        let (ops_stop, ops_stopped) = tokio::sync::oneshot::channel::<()>();
        let ops = ops.map(|listener| {
            let timeouts = Timeouts {
                header_read: Duration::from_secs(30),
                idle: Duration::from_secs(120),
                shutdown: Duration::ZERO,
            };
            let router = ops_router(self.app.clone());
            tokio::spawn(async move {
                let open = conn::serve(listener, router, timeouts, async {
                    let _ = ops_stopped.await;
                })
                .await;
                open.close().await;
            })
        });
        let sweeper = self.start_sweeper();
        shutdown.await;
        sweeper.abort();
        let _ = stop.send(true);
        let _ = triggers.await;
        if tokio::time::timeout(timeout, worker).await.is_err() {
            tracing::warn!(
                timeout_s = timeout.as_secs_f64(),
                "stopped waiting for runs to reach a step boundary"
            );
        }
        let _ = ops_stop.send(());
        if let Some(ops) = ops {
            let _ = ops.await;
        }
    }

    /// Starts the sweeper of expired threads: every server and worker on a database runs one,
    /// and the database has each thread deleted once.
    fn start_sweeper(&self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(ttl::sweeper(
            self.app.store.clone(),
            self.app.ttls.sweep_every,
            self.app.triggers.clock.clone(),
        ))
    }

    /// A handle that reloads the served workflows while the server runs.
    pub fn reloader(&self) -> Reloader {
        Reloader { app: self.app.clone() }
    }

    /// Serves on `listener` until `shutdown` resolves; then stops accepting connections, stops
    /// every run at its next step boundary (its checkpoint intact, its thread resumable) and
    /// returns once every run has stopped and every response has ended, or once
    /// `timeouts.shutdown` has passed.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        timeouts: Timeouts,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        // Runs a server before this one left unfinished (stopped, or killed) go on. A store
        // that cannot list them cannot serve anything else either: its requests will say why.
        // On a shared database the queue's workers take them over instead.
        if !self.app.runs.is_shared() {
            let _ = control::resume_unfinished(&self.app);
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let triggers = triggers::start(&self.app, stopped.clone());
        let worker = self.start_worker(stopped);
        let sweeper = self.start_sweeper();
        let open = conn::serve(listener, router(self.app.clone()), timeouts, shutdown).await;
        sweeper.abort();
        let app = self.app;
        let _ = stop.send(true);
        let drained = async {
            if let Some(w) = worker {
                let _ = w.await;
            }
            let _ = triggers.await;
        };
        // From here on a run that stops stays unfinished in the store, for the next server.
        let ended = async { tokio::join!(app.runs.stop_all(), open.close(), drained) };
        if tokio::time::timeout(timeouts.shutdown, ended).await.is_err() {
            // The runs still going are cut off mid-step when the process exits: the next
            // server runs that step again. Their leases need no release: a holder on this host
            // whose process is gone is replaced at once.
            tracing::warn!(
                runs = app.runs.running(),
                timeout_s = timeouts.shutdown.as_secs_f64(),
                "stopped waiting for runs to reach a step boundary"
            );
        }
    }
}

/// How long a server waits on others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// A request's head, from its first byte: a client slower than this (a slowloris) is cut
    /// off.
    pub header_read: Duration,
    /// A connection with no request in progress, before it is closed.
    pub idle: Duration,
    /// Once told to stop: the runs, to reach their next step boundary, and the responses, to
    /// end.
    pub shutdown: Duration,
}

/// Reloads a running server's workflows (see [`Graphs::reload`]).
#[derive(Clone)]
pub struct Reloader {
    app: Shared,
}

impl Reloader {
    pub fn reload(&self, dir: &Path) -> std::io::Result<Reloaded> {
        let reloaded = self.app.graphs.reload(dir)?;
        triggers::register(&self.app);
        Ok(reloaded)
    }

    /// Every file the served (and rejected) workflows' compilations read.
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        self.app.graphs.files()
    }
}

/// Creates a cron as `POST /runs/crons` (or, on `thread`, `POST /threads/{id}/runs/crons`)
/// does, from a create request's `body`, its first tick the first after `now` (milliseconds
/// since the epoch): `runner cron add`'s way in.
pub fn cron_create(
    graphs: &Graphs,
    store: &dyn Checkpointer,
    now: i64,
    thread: Option<&str>,
    body: serde_json::Value,
) -> Result<crate::checkpoint::CronRow, CronError> {
    cron::create(graphs, store, now, thread, body, None)
}

/// Loads every workflow of `dir`: the graphs that compile, and why the others do not.
pub fn load(dir: &Path) -> std::io::Result<(Graphs, Vec<Rejected>)> {
    graphs::load(dir)
}

/// The LangGraph API's routes: each path with its methods and handlers, written once for the
/// router and for [`api_routes`], the list a test walks to hold every route to the ownership
/// rules (a route added here without a check fails it).
macro_rules! api {
    ($($path:literal => [$($method:ident($handler:path)),+ $(,)?]),+ $(,)?) => {
        /// Every route of the LangGraph API the server answers, as `(method, path)`, besides
        /// the workflows' own (`serve.routes`).
        #[doc(hidden)]
        pub fn api_routes() -> Vec<(&'static str, &'static str)> {
            vec![$($((stringify!($method), $path)),+),+]
        }

        fn api_router() -> Router<Shared> {
            Router::new()
                $(.route($path, axum::routing::MethodRouter::new()
                    $(.on(axum::routing::MethodFilter::$method, $handler))+))+
        }
    };
}

api! {
    "/ok" => [GET(http::ok)],
    "/info" => [GET(http::info)],
    "/assistants/search" => [POST(graphs::search)],
    "/assistants/{id}" => [GET(graphs::get_assistant)],
    "/assistants/{id}/graph" => [GET(graphs::get_graph)],
    "/assistants/{id}/schemas" => [GET(graphs::get_schemas)],
    "/assistants/{id}/cache" => [DELETE(graphs::clear_cache)],
    "/threads" => [POST(threads::create)],
    "/threads/search" => [POST(threads::search)],
    "/threads/{id}" => [GET(threads::get), DELETE(threads::delete), PATCH(threads::patch)],
    "/threads/{id}/copy" => [POST(threads::copy)],
    "/threads/{id}/state" => [GET(threads::state), POST(threads::update_state)],
    "/threads/{id}/state/checkpoint" => [POST(threads::state_at_post)],
    "/threads/{id}/state/{checkpoint_id}" => [GET(threads::state_at_get)],
    "/threads/{id}/history" => [POST(threads::history_post), GET(threads::history_get)],
    "/threads/{id}/runs/stream" => [POST(runs::stream_on_thread)],
    "/threads/{id}/runs/wait" => [POST(runs::wait_on_thread)],
    "/threads/{id}/runs" => [POST(control::create_on_thread), GET(control::list_runs)],
    "/threads/{id}/runs/{run_id}" => [GET(control::get_run), DELETE(control::delete_run)],
    "/threads/{id}/runs/{run_id}/join" => [GET(control::join)],
    "/threads/{id}/runs/{run_id}/stream" => [GET(control::join_stream)],
    "/threads/{id}/runs/{run_id}/cancel" => [POST(control::cancel)],
    "/threads/{id}/runs/{run_id}/trace" => [GET(traces::run_trace)],
    "/threads/{id}/usage" => [GET(traces::thread_usage)],
    "/threads/{id}/runs/crons" => [POST(crons::create_on_thread)],
    "/runner/workflows" => [GET(graphs::workflows)],
    "/runs/stream" => [POST(runs::stream_stateless)],
    "/runs/wait" => [POST(runs::wait_stateless)],
    "/runs" => [POST(control::create_stateless)],
    "/runs/batch" => [POST(batch::batch)],
    "/runs/crons" => [POST(crons::create_stateless)],
    "/runs/crons/search" => [POST(crons::search)],
    "/runs/crons/count" => [POST(crons::count)],
    "/runs/crons/{cron_id}" => [GET(crons::get), PATCH(crons::patch), DELETE(crons::delete)],
    "/store/items" => [PUT(store::put), GET(store::get), DELETE(store::delete)],
    "/store/items/search" => [POST(store::search)],
    "/store/namespaces" => [POST(store::namespaces)],
    "/metrics" => [GET(metrics::metrics)],
}

/// The routes of a worker's own port (`runner worker --port`): whether it is up, and its
/// metrics. No run can be started or read there, so it needs no credentials.
fn ops_router(app: Shared) -> Router {
    Router::new()
        .route("/ok", axum::routing::get(http::ok))
        .route("/metrics", axum::routing::get(metrics::worker_metrics))
        .layer(axum::middleware::from_fn(log::request))
        .with_state(app)
}

fn router(app: Shared) -> Router {
    api_router()
        .route("/", axum::routing::get(studio::index))
        .route("/studio", axum::routing::get(studio::index))
        .route("/studio/", axum::routing::get(studio::index))
        .route("/studio/{*path}", axum::routing::get(studio::asset))
        .fallback(routes::dispatch)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            metrics::count_streams,
        ))
        .layer(axum::middleware::from_fn_with_state(app.clone(), auth::authenticate))
        .layer(axum::middleware::from_fn(http::cors))
        .layer(axum::middleware::from_fn(log::request))
        .with_state(app)
}
