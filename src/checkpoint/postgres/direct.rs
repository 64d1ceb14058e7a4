//! One-statement calls on connections of their own, driven by the calling thread.
//!
//! A step's fenced write is one statement ([`super::apply::apply_one_statement`]), the
//! checkpointer's hottest call; a worker's claim and an API server's admission are the next
//! ones on a run's way to its first event. Through the pool each is handed to the backend's
//! runtime, whose connection task sends it, and the answer is handed back the same way: thread
//! wake-ups on both sides of the round trip, each of which waits for a core on a busy machine.
//! Here the calling thread sends the statements on the socket and waits on the socket for the
//! answer, as libpq does: no other thread takes part.
//!
//! The connection is tokio-postgres's, over a non-blocking TCP socket that this module polls
//! itself: [`drive`] polls the statements and the connection together and, when neither can
//! go on, blocks in a `peek` of the socket until the server sends something. No runtime is
//! needed, so it serves a caller on any runtime's thread (which it blocks for the round trip,
//! as the pool's way blocks it for the hand-offs) or on none.
//!
//! Connections of their own per kind of call and checkpointer ([`Direct`]: one for claims,
//! one for admissions, a few for steps, which many runs commit at once; each opened on first
//! use, so a process has only those it makes), each used by one caller at a time: a caller
//! that finds them all busy, or a database reached through a Unix socket, takes the pool's
//! way. One that fails is dropped and opened again by a later call, and the call that found
//! it broken is tried again on the pool, which retries while the database cannot be reached.

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::ArcWake;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use crate::checkpoint::{CheckpointError, Result};

/// How long a wait for the socket lasts before the statement and the connection are polled
/// again (a guard: a wake-up is never needed from outside).
const WAIT: Duration = Duration::from_secs(1);

/// After a connection could not be opened, how long writes take the pool's way before one
/// tries again.
const REOPEN_AFTER: Duration = Duration::from_secs(5);

/// The socket, non-blocking: a read with nothing to read is `Pending`, and [`drive`] waits.
struct Socket(TcpStream);

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match this.0.read(buf.initialize_unfilled()) {
            Ok(n) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            // Nothing to read: [`drive`] waits on the socket, then polls again. An interrupted
            // read is the same: the wait returns at once when there is something.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        loop {
            match this.0.write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // The send buffer is full (a statement larger than it): written blocking, which
                // the server reading it ends.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let blocking = this.0.set_nonblocking(false).and_then(|()| this.0.write(buf));
                    this.0.set_nonblocking(true)?;
                    return Poll::Ready(blocking);
                }
                other => return Poll::Ready(other),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(self.0.shutdown(std::net::Shutdown::Write))
    }
}

/// Set when something the polled futures wait for (a channel between the client and its
/// connection) is ready: they are polled again before the socket is waited on.
struct Woken(AtomicBool);

impl ArcWake for Woken {
    fn wake_by_ref(this: &Arc<Self>) {
        this.0.store(true, Ordering::Release);
    }
}

/// Polls `work` to its end on this thread, waiting on `socket` (a clone of the connection's)
/// whenever neither it nor what it waits for can go on; `None` when `deadline` passed first.
/// Past [`crate::blocking::PATIENCE`] (a slow server, or one that stopped answering), the rest of
/// the wait hands the thread's other tasks to another thread, as the pool's way does.
fn drive<F: Future>(socket: &TcpStream, deadline: Option<Instant>, work: F) -> Option<F::Output> {
    let mut work = std::pin::pin!(work);
    let patience = Instant::now() + crate::blocking::PATIENCE;
    match turn(socket, deadline, Some(patience), work.as_mut()) {
        Turn::Done(out) => out,
        Turn::Slow => crate::blocking::off_the_runtime(|| match turn(socket, deadline, None, work.as_mut()) {
            Turn::Done(out) => out,
            Turn::Slow => None,
        }),
    }
}

/// How [`turn`] ended.
enum Turn<T> {
    /// `work` ended (`Some`), or `deadline` passed or the socket could not be waited on (`None`).
    Done(Option<T>),
    /// `patience` passed first.
    Slow,
}

/// [`drive`]'s loop, until `work` ends, `deadline` passes, or `patience` does.
fn turn<F: Future>(
    socket: &TcpStream,
    deadline: Option<Instant>,
    patience: Option<Instant>,
    mut work: Pin<&mut F>,
) -> Turn<F::Output> {
    let woken = Arc::new(Woken(AtomicBool::new(false)));
    let waker = futures::task::waker(woken.clone());
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = work.as_mut().poll(&mut cx) {
            return Turn::Done(Some(out));
        }
        if woken.0.swap(false, Ordering::AcqRel) {
            continue;
        }
        let now = Instant::now();
        let mut wait = match deadline {
            Some(deadline) => match deadline.checked_duration_since(now) {
                Some(left) if !left.is_zero() => left.min(WAIT),
                _ => return Turn::Done(None),
            },
            None => WAIT,
        };
        if let Some(patience) = patience {
            match patience.checked_duration_since(now) {
                Some(left) if !left.is_zero() => wait = wait.min(left),
                _ => return Turn::Slow,
            }
        }
        // Until the server sends something (or the connection ends, or the wait is up): then
        // the connection reads it when polled. An error is the next read's to report.
        let _ = socket
            .set_nonblocking(false)
            .and_then(|()| socket.set_read_timeout(Some(wait)))
            .and_then(|()| socket.peek(&mut [0u8; 1]));
        if socket.set_nonblocking(true).is_err() {
            // The next read would block: let it fail rather than hang.
            return Turn::Done(None);
        }
    }
}

type ConnectionFuture = Pin<Box<dyn Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send>>;

/// An open connection: the client, the connection future that does its I/O when polled, the
/// socket to wait on, and the statements prepared on it.
struct Link {
    /// `None` only while dropping.
    client: Option<Client>,
    connection: ConnectionFuture,
    socket: TcpStream,
    statements: Mutex<HashMap<String, Statement>>,
}

impl Drop for Link {
    /// Says goodbye to the server (the connection sends `Terminate` once its client is gone)
    /// rather than dropping the socket under it.
    fn drop(&mut self) {
        drop(self.client.take());
        let deadline = Instant::now() + Duration::from_millis(500);
        let _ = drive(&self.socket, Some(deadline), &mut self.connection);
    }
}

/// The direct way of one kind of call: its links, each while open, or when it may be opened
/// again.
pub(super) struct Direct {
    /// The connections' `application_name`, for whoever looks at the server's connections.
    name: &'static str,
    /// Each used by one caller at a time; a caller takes the first that is free, and a link is
    /// opened only when every one before it was busy.
    links: Vec<Mutex<State>>,
}

/// What a call does on the link: its statements on the [`Exec`] it is given.
pub(super) type Work<T> = Box<dyn for<'a> FnOnce(&'a Exec<'a>) -> futures::future::BoxFuture<'a, Result<T>> + Send>;

#[derive(Default)]
struct State {
    link: Option<Link>,
    closed_until: Option<Instant>,
}

impl Direct {
    /// A direct way of up to `links` connections (at least one), named `name`
    /// (`application_name`).
    pub(super) fn new(name: &'static str, links: usize) -> Direct {
        Direct {
            name,
            links: (0..links.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    /// Does `work` on the first free link, opening it first when needed; `None` when the
    /// pool's way is to be taken instead: every link is busy with another caller or cannot be
    /// opened for now, or the one taken cannot be opened, or broke before the work got its
    /// answers.
    pub(super) fn run<T>(
        &self,
        config: &tokio_postgres::Config,
        tls: &tokio_postgres_rustls::MakeRustlsConnect,
        work: Work<T>,
    ) -> Option<Result<T>> {
        let mut state = self.links.iter().find_map(|link| {
            let state = link.try_lock().ok()?;
            let closed = state.link.is_none() && state.closed_until.is_some_and(|t| Instant::now() < t);
            (!closed).then_some(state)
        })?;
        if state.link.is_none() {
            // Rare (a process's first call of the kind, or one after a failure), and as long as
            // the server takes to answer, or a connect timeout when it cannot be reached.
            match crate::blocking::off_the_runtime(|| open(config, tls, self.name)) {
                Some(link) => state.link = Some(link),
                None => {
                    state.closed_until = Some(Instant::now() + REOPEN_AFTER);
                    return None;
                }
            }
        }
        let outcome = {
            let link = state.link.as_mut()?;
            let exec = Exec {
                client: link.client.as_ref()?,
                statements: &link.statements,
            };
            let work = work(&exec);
            let connection = &mut link.connection;
            drive(&link.socket, None, async move {
                match futures::future::select(connection, work).await {
                    futures::future::Either::Left(_) => None,
                    futures::future::Either::Right((done, _)) => Some(done),
                }
            })
        };
        match outcome.flatten() {
            // The connection ended, or its socket could not be waited on: its statements had
            // no answer, so nothing was committed by them (a lost acknowledgement of a commit
            // aside, as on the pool's way).
            None => {
                state.link = None;
                None
            }
            Some(Err(CheckpointError::Unavailable(_))) => {
                state.link = None;
                None
            }
            Some(done) => Some(done),
        }
    }
}

/// Opens a connection to the first of the configuration's TCP hosts that answers; `None` for
/// a database reached through a Unix socket, or when none answers.
fn open(config: &tokio_postgres::Config, tls: &tokio_postgres_rustls::MakeRustlsConnect, name: &str) -> Option<Link> {
    // Named apart from the pool's, for whoever looks at the server's connections.
    let mut config = config.clone();
    config.application_name(name);
    let config = &config;
    let timeout = config.get_connect_timeout().copied().unwrap_or(Duration::from_secs(10));
    let ports = config.get_ports();
    for (i, host) in config.get_hosts().iter().enumerate() {
        let tokio_postgres::config::Host::Tcp(name) = host else {
            return None;
        };
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let addrs: Vec<SocketAddr> = match config.get_hostaddrs().get(i) {
            Some(ip) => vec![SocketAddr::new(*ip, port)],
            None => (name.as_str(), port).to_socket_addrs().ok()?.collect(),
        };
        for addr in addrs {
            if let Some(link) = connect(config, tls, name, addr, timeout) {
                return Some(link);
            }
        }
    }
    None
}

fn connect(
    config: &tokio_postgres::Config,
    tls: &tokio_postgres_rustls::MakeRustlsConnect,
    name: &str,
    addr: SocketAddr,
    timeout: Duration,
) -> Option<Link> {
    let deadline = Instant::now() + timeout;
    let stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_nodelay(true).ok()?;
    silence_found_out(&stream, config).ok()?;
    stream.set_nonblocking(true).ok()?;
    let socket = stream.try_clone().ok()?;
    let connector = MakeTlsConnect::<Socket>::make_tls_connect(&mut tls.clone(), name).ok()?;
    let (client, connection) = drive(&socket, Some(deadline), config.connect_raw(Socket(stream), connector))?.ok()?;
    Some(Link {
        client: Some(client),
        connection: Box::pin(connection),
        socket,
        statements: Mutex::new(HashMap::new()),
    })
}

/// Sets the URL's keepalive and unacknowledged-data timeout on `stream` (see
/// [`crate::pg::SILENCE`]), as tokio-postgres sets them on the pool's connections: a server
/// gone silent fails the step's wait as a broken connection does, instead of holding it.
fn silence_found_out(stream: &TcpStream, config: &tokio_postgres::Config) -> std::io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    if config.get_keepalives() {
        #[allow(unused_mut)]
        let mut keepalive = socket2::TcpKeepalive::new().with_time(config.get_keepalives_idle());
        #[cfg(any(target_os = "linux", target_os = "macos"))]
        {
            if let Some(interval) = config.get_keepalives_interval() {
                keepalive = keepalive.with_interval(interval);
            }
            if let Some(retries) = config.get_keepalives_retries() {
                keepalive = keepalive.with_retries(retries);
            }
        }
        socket.set_tcp_keepalive(&keepalive)?;
    }
    #[cfg(target_os = "linux")]
    if let Some(timeout) = config.get_tcp_user_timeout() {
        socket.set_tcp_user_timeout(Some(*timeout))?;
    }
    Ok(())
}

/// Runs statements on the link, each prepared once per connection.
pub(super) struct Exec<'a> {
    client: &'a Client,
    statements: &'a Mutex<HashMap<String, Statement>>,
}

impl Exec<'_> {
    /// `sql`, prepared on this connection once.
    async fn prepared(&self, sql: &str) -> std::result::Result<Statement, tokio_postgres::Error> {
        let known = self.statements.lock().ok().and_then(|s| s.get(sql).cloned());
        if let Some(statement) = known {
            return Ok(statement);
        }
        let statement = self.client.prepare(sql).await?;
        if let Ok(mut s) = self.statements.lock() {
            s.insert(sql.to_owned(), statement.clone());
        }
        Ok(statement)
    }
}

impl super::apply::Statements for Exec<'_> {
    async fn execute_cached(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        self.client.execute(&self.prepared(sql).await?, params).await
    }

    async fn query_opt_cached(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
        self.client.query_opt(&self.prepared(sql).await?, params).await
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The steps' sockets take the URL's keepalive and timeout, runner's defaults or its own.
    #[test]
    fn a_step_connections_socket_finds_a_silent_server_out_as_the_url_says() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        for (url, idle, interval, retries, unacknowledged) in [
            ("postgres://h/db", 30, 10, 3, crate::pg::SILENCE),
            (
                "postgres://h/db?keepalives_idle=100&keepalives_interval=7&keepalives_retries=5&tcp_user_timeout=2500",
                100,
                7,
                5,
                Duration::from_millis(2500),
            ),
        ] {
            let config = crate::pg::parse_url(url).unwrap().config;
            let stream = TcpStream::connect(addr).unwrap();
            silence_found_out(&stream, &config).unwrap();
            let socket = socket2::SockRef::from(&stream);
            assert!(socket.keepalive().unwrap(), "{url}");
            assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(idle), "{url}");
            assert_eq!(
                socket.tcp_keepalive_interval().unwrap(),
                Duration::from_secs(interval),
                "{url}"
            );
            assert_eq!(socket.tcp_keepalive_retries().unwrap(), retries, "{url}");
            assert_eq!(socket.tcp_user_timeout().unwrap(), Some(unacknowledged), "{url}");
        }
        // Keepalives off: none set.
        let config = crate::pg::parse_url("postgres://h/db?keepalives=0").unwrap().config;
        let stream = TcpStream::connect(addr).unwrap();
        silence_found_out(&stream, &config).unwrap();
        assert!(!socket2::SockRef::from(&stream).keepalive().unwrap());
    }
}
