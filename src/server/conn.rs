//! How connections are accepted and served: HTTP/1.1 on hyper, one task per connection, Nagle's
//! algorithm off, a connection that waits on its client too long closed, and a graceful end
//! (no new connections; each open one ends once its response has).
//!
//! HTTP/1.1 only, as the reference server (uvicorn) speaks it. Serving HTTP/2 beside it (what
//! axum's `serve` does) means reading the first bytes of every connection to tell the two apart;
//! hyper then gets those few bytes alone, reads the rest of the request head into a buffer
//! holding them, and the buffer doubles: 16 KiB a connection instead of 8, 3 MiB with 200
//! streams open.
//!
//! A connection is closed when no request is in progress on it for [`Timeouts::idle`], or
//! when a request's head, once its first byte came, is not complete within
//! [`Timeouts::header_read`] (a slowloris client). Both are timed here rather than by hyper's
//! `header_read_timeout`: hyper starts that timer as soon as a connection waits for its next
//! request, so a kept-alive connection could never idle longer than a head may take to
//! arrive. A request in progress is never timed: a handler may work for minutes
//! (`/runs/wait`) and a stream may send for hours.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, Response, header};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Timeouts;
use super::threads::lock;

/// The connections still open once the server stopped accepting new ones.
pub(super) struct Open(GracefulShutdown);

impl Open {
    /// Asks each connection to end once the response it is sending has (an idle one ends at
    /// once), and waits until every one has.
    pub(super) async fn close(self) {
        self.0.shutdown().await;
    }
}

/// Serves `router` on `listener` until `stop` resolves; then stops accepting (the listener is
/// closed) and hands back the connections still open.
pub(super) async fn serve(
    listener: TcpListener,
    router: Router,
    timeouts: Timeouts,
    stop: impl Future<Output = ()>,
) -> Open {
    let connections = GracefulShutdown::new();
    let http = http1::Builder::new();
    tokio::pin!(stop);
    loop {
        let tcp = tokio::select! {
            biased;
            () = &mut stop => break,
            tcp = accept(&listener) => tcp,
        };
        let watch = Arc::new(Watch::new());
        // Each connection calls a clone of the router (an `Arc`), as axum's make-service does.
        let service = Service {
            router: TowerToHyperService::new(router.clone()),
            watch: watch.clone(),
        };
        let io = TokioIo::new(Watched {
            tcp,
            watch: watch.clone(),
        });
        let served = connections.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            tokio::select! {
                // A connection that ends in an error (the client went away mid-request) ends
                // only itself; the request log has what was answered.
                ended = served => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended");
                },
                // Dropping the connection closes its socket: nothing is in progress on it.
                () = watch.expired(timeouts) => {
                    tracing::debug!("connection closed: idle, or a request's head too slow");
                }
            }
        });
    }
    drop(listener);
    Open(connections)
}

/// The next connection, with Nagle's algorithm off: a stream writes small events one after
/// another, and on a kept-alive connection each would otherwise wait for the client's delayed
/// ACK of the one before (a run's first state event came 41 ms after its `metadata`; 0.2 ms
/// without). An error accepting one is logged and waited out, never the end of the server.
async fn accept(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                // A socket that refuses the option still works, only slower.
                let _ = tcp.set_nodelay(true);
                return tcp;
            }
            // The client gave up before it was accepted: nothing to wait for.
            Err(e) if is_connection_error(&e) => {}
            // Out of file descriptors, or memory: accepting again at once would fail again.
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed; trying again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset)
}

/// What a connection is doing, as its timeouts see it: told by its socket (bytes came) and by
/// its service (a request began, its response was sent).
struct Watch {
    phase: Mutex<Phase>,
    /// Woken at every change of phase.
    changed: Notify,
    /// The request in progress was read to its end.
    body_read: AtomicBool,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// No request in progress since then, and no byte of the next one.
    Idle(Instant),
    /// The next request's first bytes came then; its head is not complete.
    Head(Instant),
    /// Requests in progress: handled, or their responses being sent.
    Busy(usize),
}

impl Watch {
    fn new() -> Watch {
        Watch {
            phase: Mutex::new(Phase::Idle(Instant::now())),
            changed: Notify::new(),
            body_read: AtomicBool::new(false),
        }
    }

    fn set(&self, phase: impl FnOnce(Phase) -> Option<Phase>) {
        {
            let mut current = lock(&self.phase);
            match phase(*current) {
                Some(next) => *current = next,
                None => return,
            }
        }
        // A permit is kept when the watch is not waiting: no change is missed.
        self.changed.notify_one();
    }

    /// Bytes came from the client: an idle connection is now reading a request's head.
    fn read(&self) {
        self.set(|p| match p {
            Phase::Idle(_) => Some(Phase::Head(Instant::now())),
            _ => None,
        });
    }

    /// Resolves once the connection has waited on its client longer than `timeouts` allow.
    async fn expired(&self, timeouts: Timeouts) {
        loop {
            let phase = *lock(&self.phase);
            let deadline = match phase {
                Phase::Idle(since) => since + timeouts.idle,
                Phase::Head(since) => since + timeouts.header_read,
                Phase::Busy(_) => {
                    self.changed.notified().await;
                    continue;
                }
            };
            if deadline <= Instant::now() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = self.changed.notified() => {}
            }
        }
    }
}

/// A request in progress on a connection, from its head to the end of its response's body.
struct Busy(Arc<Watch>);

impl Busy {
    fn begin(watch: &Arc<Watch>) -> Busy {
        watch.body_read.store(false, Ordering::SeqCst);
        watch.set(|p| match p {
            Phase::Busy(n) => Some(Phase::Busy(n + 1)),
            Phase::Idle(_) | Phase::Head(_) => Some(Phase::Busy(1)),
        });
        Busy(watch.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.set(|p| match p {
            Phase::Busy(n) if n > 1 => Some(Phase::Busy(n - 1)),
            _ => Some(Phase::Idle(Instant::now())),
        });
    }
}

/// A connection's socket, telling its watch when bytes come.
struct Watched {
    tcp: TcpStream,
    watch: Arc<Watch>,
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.watch.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// The router as a connection's service: each request marks the connection busy until its
/// response's body is dropped.
struct Service {
    router: TowerToHyperService<Router>,
    watch: Arc<Watch>,
}

type Answering = Pin<Box<dyn Future<Output = Result<Response<Answer>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<Answer>;
    type Error = Infallible;
    type Future = Answering;

    fn call(&self, request: Request<Incoming>) -> Answering {
        let busy = Busy::begin(&self.watch);
        let has_body = !hyper::body::Body::is_end_stream(request.body());
        let watch = self.watch.clone();
        let request = request.map(|body| Reading {
            body,
            watch: watch.clone(),
        });
        let answering = hyper::service::Service::call(&self.router, request);
        Box::pin(async move {
            let mut response = answering.await?;
            // Answered before its body was read (a refused key, an unknown route, a body too
            // large): hyper gives up on reading what is left once the response is written and
            // closes the connection. Said in the response, the client does not send its next
            // request on a connection about to close.
            if has_body && !watch.body_read.load(Ordering::SeqCst) {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| Answer { body, _busy: busy }))
        })
    }
}

/// A request's body, telling its connection once it has been read to its end.
struct Reading {
    body: Incoming,
    watch: Arc<Watch>,
}

impl hyper::body::Body for Reading {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || this.body.is_end_stream() {
            this.watch.body_read.store(true, Ordering::SeqCst);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A response's body, keeping its connection busy until it is dropped.
struct Answer {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> SizeHint {
        hyper::body::Body::size_hint(&self.body)
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn accepted_connections_send_without_delay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = super::accept(&listener).await;
        assert!(accepted.nodelay().unwrap());
    }
}
