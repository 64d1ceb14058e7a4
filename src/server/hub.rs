//! A streamed run's events, framed once and kept for every reader: the client that started the
//! run, and any that join it later (`GET …/runs/{run_id}/stream`), from the start
//! (`Last-Event-ID: -1`), after an event they saw (`Last-Event-ID: N`, ids numbered from 1 when
//! the run was created with `stream_resumable`), or from now on.
//!
//! A resumable run's ids are reserved in its row ahead of use, a block at a time: a run
//! resumed by a restarted server numbers its events after every id the killed one may have
//! sent, so a client's `Last-Event-ID` from before the restart reads the resumed run's events
//! from their first. On a database many processes share, nothing is reserved: every reader
//! makes a run's frames from its whole event log, so a frame has the same id on every process
//! (its place in the log's frames), and a client may rejoin through any of them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::watch;

use super::Shared;
use super::runs::Started;
use super::sse::Frame;
use super::threads::lock;
use super::translate::Translate;
use crate::engine::events::Envelope;
use crate::engine::{EngineError, RunOutcome};

/// How long a stream stays silent before a heartbeat comment, as the reference server's.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(5);
/// How many event ids a resumable run reserves in its row at a time.
const RESERVE: u64 = 1000;

/// How far the run's frames have come.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    count: usize,
    ended: bool,
}

/// Where a resumable run's event ids are reserved: its row.
struct Reserve {
    store: Arc<dyn crate::checkpoint::Checkpointer>,
    run_id: String,
}

impl std::fmt::Debug for Reserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reserve").field("run_id", &self.run_id).finish()
    }
}

/// The frames of one run.
#[derive(Debug)]
pub(crate) struct Hub {
    frames: std::sync::Mutex<Vec<Bytes>>,
    progress: watch::Sender<Progress>,
    /// Frames carry ids, and the frames stay after the run for readers that rejoin.
    resumable: bool,
    /// The id before the first frame's (a resumed run's: the ids reserved before).
    base: u64,
    /// Where the ids are reserved: the store and the run's id, for a resumable run.
    reserve: Option<Reserve>,
    /// The ids reserved so far.
    reserved: std::sync::atomic::AtomicU64,
}

impl Hub {
    /// The number of frames so far: where a reader that wants only what comes next starts.
    pub(super) fn len(&self) -> usize {
        lock(&self.frames).len()
    }

    /// The frame index after event id `id`: ids before this run's first are before its start.
    pub(super) fn index_after(&self, id: u64) -> usize {
        usize::try_from(id.saturating_sub(self.base)).unwrap_or(usize::MAX)
    }

    fn push<F: Into<Frame>>(&self, frames: Vec<F>) {
        if frames.is_empty() {
            return;
        }
        let count = {
            let mut all = lock(&self.frames);
            let last = self.base + (all.len() + frames.len()) as u64;
            if let Some(Reserve { store, run_id }) = &self.reserve
                && last > self.reserved.load(Ordering::SeqCst)
            {
                // Stored before any frame with such an id is sent. A failure leaves the ids
                // unreserved (and is tried again with the next frames): only a run resumed
                // after a crash could then reuse some.
                let upto = last + RESERVE;
                if store.reserve_event_ids(run_id, upto).is_ok() {
                    self.reserved.store(upto, Ordering::SeqCst);
                }
            }
            for f in frames {
                let base = usize::try_from(self.base).unwrap_or(usize::MAX);
                let id = self.resumable.then(|| base.saturating_add(all.len() + 1));
                all.push(f.into().bytes(id));
            }
            all.len()
        };
        self.progress.send_modify(|p| p.count = count);
    }
}

/// What turns a run's events into the frames of its stream: LangGraph's stream modes
/// ([`Translate`]), or a served route's rules.
pub(super) trait Framer: Send + 'static {
    /// The frames the stream opens with, then those of the run's first event.
    fn start(&mut self, run_id: &str, first: Envelope) -> Vec<Frame>;
    fn on(&mut self, envelope: Envelope) -> Vec<Frame>;
    /// The frames that end the stream, once the run has ended.
    fn finish(&mut self, outcome: &Result<RunOutcome, EngineError>) -> Vec<Frame>;
}

impl Framer for Translate {
    fn start(&mut self, run_id: &str, first: Envelope) -> Vec<Frame> {
        let mut frames = vec![Frame::from((
            "metadata".to_string(),
            json!({"run_id": run_id, "attempt": 1}),
        ))];
        frames.extend(Translate::on(self, first).into_iter().map(Frame::from));
        frames
    }

    fn on(&mut self, envelope: Envelope) -> Vec<Frame> {
        Translate::on(self, envelope).into_iter().map(Frame::from).collect()
    }

    fn finish(&mut self, outcome: &Result<RunOutcome, EngineError>) -> Vec<Frame> {
        Translate::finish(self, outcome).into_iter().map(Frame::from).collect()
    }
}

/// Starts the task that turns the run's events into frames in LangGraph's stream modes, and
/// returns their hub (see [`feed_with`]).
pub(super) fn feed(app: &Shared, s: Started) -> Arc<Hub> {
    let translate = Translate::new(s.modes, app, s.info.clone(), s.graph.plan.clone());
    feed_with(app, s, translate)
}

/// Starts the task that turns the run's events into frames with `framer`, and returns their
/// hub. The run's record offers the hub to joining readers; a run that is not resumable
/// withdraws it when it ends (its frames then live only as long as the readers that hold them).
pub(super) fn feed_with(app: &Shared, s: Started, mut framer: impl Framer) -> Arc<Hub> {
    let hub = Arc::new(Hub {
        frames: std::sync::Mutex::new(Vec::new()),
        progress: watch::channel(Progress::default()).0,
        resumable: s.resumable,
        base: s.first_event_id,
        reserve: (s.resumable && !app.runs.is_shared()).then(|| Reserve {
            store: app.store.clone(),
            run_id: s.run_id.clone(),
        }),
        reserved: std::sync::atomic::AtomicU64::new(s.first_event_id),
    });
    hub.push(framer.start(&s.run_id, s.first));
    app.runs.attach(&s.run_id, hub.clone());
    let (app, fed) = (app.clone(), hub.clone());
    let (run_id, mut events, done, release) = (s.run_id, s.events, s.done, s.release);
    tokio::spawn(async move {
        while let Some(envelope) = events.recv().await {
            fed.push(framer.on(envelope));
        }
        let outcome = done
            .await
            .unwrap_or_else(|_| Err(EngineError::Input("the run's task ended without an outcome".into())));
        fed.push(framer.finish(&outcome));
        fed.progress.send_modify(|p| p.ended = true);
        if !fed.resumable {
            app.runs.detach(&run_id);
        }
        drop(release);
    });
    hub
}

/// A hub with no frames whose run has ended: what a reader of a run nobody may join reads.
pub(super) fn ended() -> Arc<Hub> {
    Arc::new(Hub {
        frames: std::sync::Mutex::new(Vec::new()),
        progress: watch::channel(Progress { count: 0, ended: true }).0,
        resumable: false,
        base: 0,
        reserve: None,
        reserved: std::sync::atomic::AtomicU64::new(0),
    })
}

/// Stops the run when its reader is dropped before the end (the client went away).
pub(super) struct CancelOnDrop {
    pub stopper: super::manager::Stopper,
    pub armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            // As LangGraph's server cancels a run whose client went away (`on_disconnect:
            // cancel`): at once.
            self.stopper.cancel();
        }
    }
}

/// One reader of a hub.
struct Reader {
    hub: Arc<Hub>,
    next: usize,
    progress: watch::Receiver<Progress>,
    guard: Option<CancelOnDrop>,
}

impl Reader {
    /// The next frame (a heartbeat after a silence), or `None` once the run has ended and
    /// every frame was read.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            // Marked seen before the frames are read: a frame pushed after this wakes the wait.
            let progress = *self.progress.borrow_and_update();
            if let Some(b) = lock(&self.hub.frames).get(self.next).cloned() {
                self.next += 1;
                return Some(b);
            }
            if progress.ended {
                if let Some(g) = &mut self.guard {
                    g.armed = false;
                }
                return None;
            }
            match tokio::time::timeout(HEARTBEAT, self.progress.changed()).await {
                // Silence: a comment keeps proxies from closing the stream and finds out
                // whether the client is still there.
                Err(_) => return Some(Bytes::from_static(b": heartbeat\r\n\r\n")),
                // The hub (which this reader holds) owns the sender: it cannot be gone.
                Ok(Err(_)) => return None,
                Ok(Ok(())) => {}
            }
        }
    }
}

/// An SSE response reading `hub` from frame `from`; `guard` cancels the run if this reader
/// goes away first.
pub(super) fn response(
    hub: Arc<Hub>,
    from: usize,
    guard: Option<CancelOnDrop>,
    locations: [(header::HeaderName, String); 2],
) -> Response {
    let reader = Reader {
        progress: hub.progress.subscribe(),
        hub,
        next: from,
        guard,
    };
    let body = futures::stream::unfold(reader, |mut r| async move {
        r.next().await.map(|b| (Ok::<_, std::convert::Infallible>(b), r))
    });
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    for (name, value) in locations {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    response
}
