//! `runner serve`'s library half: the LangGraph Server API over HTTP and server-sent events, so
//! that LangGraph's own clients (`langgraph-sdk`, agent-chat-ui) drive the workflows of a folder.
//!
//! The top layer beside the CLI: it may import the run builder, the engine, the compiler, the
//! checkpointer, diagnostics and the node kinds, never `cli` (and no clap type lives here). A
//! run it starts goes through the run builder ([`crate::run`]) and takes the thread's lease in
//! `Engine::run`, exactly as `runner run` does.
//!
//! - `graphs.rs`: the served workflows, their assistants, graph pictures and schemas;
//! - `threads.rs`: threads, their state and history, read from the checkpointer;
//! - `runs.rs`: runs on a thread or stateless, streamed (SSE) or waited for;
//! - `control.rs`: runs in the background, listed, looked at, joined, cancelled;
//! - `hub.rs`: a streamed run's frames, kept for the client that started it and any that join;
//! - `sse.rs`: the event stream's framing and how engine events become stream-mode events;
//! - `http.rs`: `{"detail": …}` errors, JSON bodies, CORS, the API key.

mod control;
mod graphs;
mod http;
mod hub;
mod log;
mod runs;
mod sse;
mod threads;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};

pub use graphs::{Graph, Graphs, Rejected, assistant_id};

use crate::checkpoint::Checkpointer;
use crate::run::{RunError, RunSettings};

/// What every request handler shares.
pub(crate) struct App {
    graphs: Graphs,
    settings: RunSettings,
    store: Arc<dyn Checkpointer>,
    /// Threads created through the API, with their metadata (a thread's runs and checkpoints
    /// are in the checkpointer; its API metadata lives as long as the server).
    threads: Mutex<HashMap<String, threads::ThreadMeta>>,
    /// Runs this server started, by run id.
    runs: Mutex<HashMap<String, runs::RunRecord>>,
    /// The key every request but `/ok` must carry, when set.
    api_key: Option<String>,
}

pub(crate) type Shared = Arc<App>;

/// A server ready to accept connections: its graphs and its run settings, the checkpointer
/// opened once for every run.
pub struct Server {
    app: Shared,
}

impl Server {
    /// A server over `graphs`, whose runs are built from `settings`; with `api_key`, every
    /// request but `GET /ok` must carry it.
    pub fn new(graphs: Graphs, settings: RunSettings, api_key: Option<String>) -> Result<Server, RunError> {
        let store = settings.open_store()?;
        Ok(Server {
            app: Arc::new(App {
                graphs,
                settings,
                store,
                threads: Mutex::new(HashMap::new()),
                runs: Mutex::new(HashMap::new()),
                api_key,
            }),
        })
    }

    /// Serves on `listener` until `shutdown` resolves; then stops accepting connections, stops
    /// every run at its next step boundary (its checkpoint intact, its thread resumable) and
    /// returns once every response has ended.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = self.app.clone();
        let stop = async move {
            shutdown.await;
            for run in threads::lock(&app.runs).values().filter(|r| r.is_active()) {
                run.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        };
        axum::serve(listener, router(self.app))
            .with_graceful_shutdown(stop)
            .await
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
        .route("/threads", post(threads::create))
        .route("/threads/search", post(threads::search))
        .route(
            "/threads/{id}",
            get(threads::get).delete(threads::delete).patch(threads::patch),
        )
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
        .route("/threads/{id}/runs/{run_id}", get(control::get_run))
        .route("/threads/{id}/runs/{run_id}/join", get(control::join))
        .route("/threads/{id}/runs/{run_id}/stream", get(control::join_stream))
        .route("/threads/{id}/runs/{run_id}/cancel", post(control::cancel))
        .route("/runs/stream", post(runs::stream_stateless))
        .route("/runs/wait", post(runs::wait_stateless))
        .fallback(http::not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), http::auth))
        .layer(axum::middleware::from_fn(http::cors))
        .layer(axum::middleware::from_fn(log::request))
        .with_state(app)
}
