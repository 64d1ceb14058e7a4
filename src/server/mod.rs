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
//! - `control.rs`: runs in the background, listed, looked at, joined, cancelled;
//! - `batch.rs`: `/runs/batch`, stateless runs started in the background together;
//! - `hub.rs`: a streamed run's frames, kept for the client that started it and any that join;
//! - `sse.rs`: the event stream's framing and the stream modes;
//! - `translate.rs`: how a run's engine events become the stream modes' events;
//! - `store.rs`: the store endpoints, over the data store `store` nodes use;
//! - `metrics.rs`: `GET /metrics` in Prometheus's text format;
//! - `conn.rs`: connections accepted and served (HTTP/1.1), closed when idle or too slow, and
//!   ended gracefully;
//! - `http.rs`: `{"detail": …}` errors, JSON bodies, CORS, the API key;
//! - `workers.rs`: how many runs execute at once, and the line of pending runs.

mod batch;
mod conn;
mod control;
mod graphs;
mod http;
mod hub;
mod log;
mod messages;
mod metrics;
mod routes;
mod runs;
mod sse;
mod store;
mod threads;
mod translate;
mod workers;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

pub use graphs::{Graph, Graphs, Rejected, Reloaded, assistant_id};

use crate::checkpoint::Checkpointer;
use crate::run::{RunError, RunSettings};

/// What every request handler shares.
pub(crate) struct App {
    graphs: Graphs,
    settings: RunSettings,
    /// Checkpoints, and the runs and thread metadata of the API.
    store: Arc<dyn Checkpointer>,
    /// Runs this server started, by run id: what only a live run has (its cancel flag, its
    /// end, its frames); what is shown of a run is its row in `store`.
    runs: Mutex<HashMap<String, runs::RunRecord>>,
    /// The key every request but `/ok` must carry, when set.
    api_key: Option<String>,
    /// The data store (`--data-db`), opened once: the store endpoints and every run's `store`,
    /// `index` and `retrieve` nodes share it.
    data: crate::rag::DataStore,
    metrics: metrics::Metrics,
    /// How many runs execute at once; the others wait `pending`, in the order they came.
    workers: workers::Workers,
    /// The server is shutting down: the runs it stops stay unfinished in the store, for the
    /// next server to continue.
    stopping: std::sync::atomic::AtomicBool,
    /// Threads being deleted. Held while a run is admitted to a thread (until it is among
    /// `runs`): admissions are decided one at a time, and none to a thread being deleted.
    deleting: Mutex<std::collections::HashSet<String>>,
}

pub(crate) type Shared = Arc<App>;

/// A server ready to accept connections: its graphs and its run settings, the checkpointer
/// opened once for every run.
pub struct Server {
    app: Shared,
}

impl Server {
    /// A server over `graphs`, whose runs are built from `settings`, at most `workers` of them
    /// executing at once; with `api_key`, every request but `GET /ok` must carry it.
    pub fn new(
        graphs: Graphs,
        settings: RunSettings,
        api_key: Option<String>,
        workers: usize,
    ) -> Result<Server, RunError> {
        let store = settings.open_store()?;
        let data = settings.data_store()?;
        Ok(Server {
            app: Arc::new(App {
                data,
                metrics: metrics::Metrics::default(),
                workers: workers::Workers::new(workers),
                graphs,
                settings,
                store,
                runs: Mutex::new(HashMap::new()),
                api_key,
                stopping: std::sync::atomic::AtomicBool::new(false),
                deleting: Mutex::new(Default::default()),
            }),
        })
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
        let _ = control::resume_unfinished(&self.app);
        let open = conn::serve(listener, router(self.app.clone()), timeouts, shutdown).await;
        let app = self.app;
        // From here on a run that stops stays unfinished in the store, for the next server.
        app.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let ended = async { tokio::join!(stop_runs(&app), open.close()) };
        if tokio::time::timeout(timeouts.shutdown, ended).await.is_err() {
            // The runs still going are cut off mid-step when the process exits: the next
            // server runs that step again. Their leases need no release: a holder on this host
            // whose process is gone is replaced at once.
            let left = threads::lock(&app.runs).values().filter(|r| r.is_active()).count();
            tracing::warn!(
                runs = left,
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

/// Stops every run at its next step boundary and waits until each has ended: its step
/// checkpointed, its lease released. A run started meanwhile (by a request already being
/// handled) is stopped in turn.
async fn stop_runs(app: &Shared) {
    // Each run is waited for once: one whose task died without recording its end still looks
    // active, and looking again would spin.
    let mut waited = std::collections::HashSet::new();
    loop {
        let active: Vec<runs::RunRecord> = threads::lock(&app.runs)
            .values()
            .filter(|r| r.is_active() && !waited.contains(&r.run_id))
            .cloned()
            .collect();
        if active.is_empty() {
            return;
        }
        for run in &active {
            run.stop();
        }
        for run in active {
            waited.insert(run.run_id);
            let mut ended = run.ended;
            // A closed channel means the run's task is gone.
            let _ = ended.wait_for(|e| *e).await;
        }
    }
}

/// Reloads a running server's workflows (see [`Graphs::reload`]).
#[derive(Clone)]
pub struct Reloader {
    app: Shared,
}

impl Reloader {
    pub fn reload(&self, dir: &Path) -> std::io::Result<Reloaded> {
        self.app.graphs.reload(dir)
    }
}

/// Loads every workflow of `dir`: the graphs that compile, and why the others do not.
pub fn load(dir: &Path) -> std::io::Result<(Graphs, Vec<Rejected>)> {
    graphs::load(dir)
}

fn router(app: Shared) -> Router {
    Router::new()
        .route("/ok", get(http::ok))
        .route("/info", get(http::info))
        .route("/assistants/search", post(graphs::search))
        .route("/assistants/{id}", get(graphs::get_assistant))
        .route("/assistants/{id}/graph", get(graphs::get_graph))
        .route("/assistants/{id}/schemas", get(graphs::get_schemas))
        .route("/assistants/{id}/cache", axum::routing::delete(graphs::clear_cache))
        .route("/threads", post(threads::create))
        .route("/threads/search", post(threads::search))
        .route(
            "/threads/{id}",
            get(threads::get).delete(threads::delete).patch(threads::patch),
        )
        .route("/threads/{id}/copy", post(threads::copy))
        .route("/threads/{id}/state", get(threads::state).post(threads::update_state))
        .route("/threads/{id}/state/checkpoint", post(threads::state_at_post))
        .route("/threads/{id}/state/{checkpoint_id}", get(threads::state_at_get))
        .route(
            "/threads/{id}/history",
            post(threads::history_post).get(threads::history_get),
        )
        .route("/threads/{id}/runs/stream", post(runs::stream_on_thread))
        .route("/threads/{id}/runs/wait", post(runs::wait_on_thread))
        .route(
            "/threads/{id}/runs",
            post(control::create_on_thread).get(control::list_runs),
        )
        .route(
            "/threads/{id}/runs/{run_id}",
            get(control::get_run).delete(control::delete_run),
        )
        .route("/threads/{id}/runs/{run_id}/join", get(control::join))
        .route("/threads/{id}/runs/{run_id}/stream", get(control::join_stream))
        .route("/threads/{id}/runs/{run_id}/cancel", post(control::cancel))
        .route("/runs/stream", post(runs::stream_stateless))
        .route("/runs/wait", post(runs::wait_stateless))
        .route("/runs", post(control::create_stateless))
        .route("/runs/batch", post(batch::batch))
        .route(
            "/store/items",
            axum::routing::put(store::put).get(store::get).delete(store::delete),
        )
        .route("/store/items/search", post(store::search))
        .route("/store/namespaces", post(store::namespaces))
        .route("/metrics", get(metrics::metrics))
        .fallback(routes::dispatch)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            metrics::count_streams,
        ))
        .layer(axum::middleware::from_fn_with_state(app.clone(), http::auth))
        .layer(axum::middleware::from_fn(http::cors))
        .layer(axum::middleware::from_fn(log::request))
        .with_state(app)
}
