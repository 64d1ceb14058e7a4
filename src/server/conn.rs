//! How connections are accepted and served: HTTP/1.1 on hyper, one task per connection, Nagle's
//! algorithm off, a response to a request whose body was not read saying the connection
//! closes, and a graceful end (no new connections; each open one ends once its response has).
//!
//! HTTP/1.1 only, as the reference server (uvicorn) speaks it. Serving HTTP/2 beside it (what
//! axum's `serve` does) means reading the first bytes of every connection to tell the two apart;
//! hyper then gets those few bytes alone, reads the rest of the request head into a buffer
//! holding them, and the buffer doubles: 16 KiB a connection instead of 8, 3 MiB with 200
//! streams open.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
use tokio::net::{TcpListener, TcpStream};

/// Serves `router` on `listener` until `stop` resolves, then waits for every open connection's
/// response to end.
pub(super) async fn serve(listener: TcpListener, router: Router, stop: impl Future<Output = ()>) {
    let connections = GracefulShutdown::new();
    let http = http1::Builder::new();
    tokio::pin!(stop);
    loop {
        let tcp = tokio::select! {
            biased;
            () = &mut stop => break,
            tcp = accept(&listener) => tcp,
        };
        // Each connection calls a clone of the router (an `Arc`), as axum's make-service does.
        let service = Service {
            router: TowerToHyperService::new(router.clone()),
            body_read: Arc::new(AtomicBool::new(false)),
        };
        let served = connections.watch(http.serve_connection(TokioIo::new(tcp), service));
        tokio::spawn(async move {
            // A connection that ends in an error (the client went away mid-request) ends only
            // itself; the request log has what was answered.
            if let Err(e) = served.await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
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

/// The router as a connection's service.
struct Service {
    router: TowerToHyperService<Router>,
    /// The request in progress was read to its end (HTTP/1.1 serves one at a time).
    body_read: Arc<AtomicBool>,
}

type Answering = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answering;

    fn call(&self, request: Request<Incoming>) -> Answering {
        self.body_read.store(false, Ordering::SeqCst);
        let has_body = !hyper::body::Body::is_end_stream(request.body());
        let body_read = self.body_read.clone();
        let request = request.map(|body| Reading {
            body,
            read: body_read.clone(),
        });
        let answering = hyper::service::Service::call(&self.router, request);
        Box::pin(async move {
            let mut response = answering.await?;
            // Answered before its body was read (a refused key, an unknown route, a body too
            // large): hyper gives up on reading what is left once the response is written and
            // closes the connection. Said in the response, the client does not send its next
            // request on a connection about to close.
            if has_body && !body_read.load(Ordering::SeqCst) {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response)
        })
    }
}

/// A request's body, telling its connection once it has been read to its end.
struct Reading {
    body: Incoming,
    read: Arc<AtomicBool>,
}

impl hyper::body::Body for Reading {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || this.body.is_end_stream() {
            this.read.store(true, Ordering::SeqCst);
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
