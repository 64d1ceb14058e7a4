//! Support code shared by the integration tests, compiled once: fake servers on loopback, the
//! thread each of them is served from, a real PostgreSQL (`postgres.rs`), and projects in
//! temporary directories.

pub(crate) mod fake_llm;
pub(crate) mod fake_rerank;
pub(crate) mod fake_web;
pub(crate) mod install;
pub(crate) mod postgres;
mod project;

pub(crate) use project::Project;

use std::net::SocketAddr;

/// A server answering on a thread and tokio runtime of its own, so that it keeps answering
/// whatever the test's own runtime (or the binary it starts) is doing. Dropping it starts a
/// graceful shutdown; [`Served::stop`] also waits until the port is closed. All tests share
/// one process, so no server outlives the test that started it.
pub(crate) struct Served {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// Shuts the server down and waits until its port is closed.
    pub(crate) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves the router `app` makes for the address it gets: a free port of `ip` (a loopback
/// address).
pub(crate) fn serve(ip: &str, app: impl FnOnce(SocketAddr) -> axum::Router) -> Served {
    let listener = std::net::TcpListener::bind((ip, 0)).expect("bind a loopback port");
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app(addr);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
    });
    Served {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    }
}
