//! `GET /metrics` in Prometheus's text format (version 0.0.4), kept without a metrics crate:
//! runs by status, the workers, open event streams, and histograms of step and model-call latency;
//! on a database many processes share, the queue's depth across all of them too.
//!
//! Counted where the server already sees things happen: a run's end where its status is
//! recorded, steps and model calls in the events the stream translator reads, event streams
//! in a layer that wraps every `text/event-stream` response body.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::Shared;

/// Upper bounds of the latency buckets, in seconds (`+Inf` is implied).
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A cumulative histogram of durations.
pub(crate) struct Histogram {
    /// Observations at most `BUCKETS[i]` (not yet cumulative: summed when rendered).
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// The sum in microseconds, so that it adds atomically.
    sum_us: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe_ms(&self, ms: f64) {
        let secs = (ms / 1000.0).max(0.0);
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        // Saturating: a duration beyond u64 microseconds is no duration a run has.
        self.sum_us.fetch_add((ms * 1000.0).round() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, n) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// What the server counts.
pub(crate) struct Metrics {
    /// Event-stream responses being sent.
    streams: AtomicI64,
    /// Each superstep, from its start to its checkpoint.
    pub steps: Histogram,
    /// Each model call, from its request to its reply (or failure).
    pub model_calls: Histogram,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            streams: AtomicI64::new(0),
            steps: Histogram::new(),
            model_calls: Histogram::new(),
        }
    }
}

/// Whose metrics a port shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The API's: its runs, its streams, and the steps and model calls of the runs it reads.
    Api,
    /// A worker's (`runner worker --port`): the runs it executes.
    Worker,
}

/// The text `GET /metrics` answers: the part's own, and the queue's depth as asked of the
/// database (none: its store has no queue).
fn render(
    app: &Shared,
    part: Part,
    depth: Option<crate::checkpoint::Result<crate::checkpoint::queue::Depth>>,
) -> String {
    let m = &app.metrics;
    let runs = match (part, &app.worker) {
        (Part::Worker, Some(worker)) => worker,
        _ => &app.runs,
    };
    let mut out = String::new();
    let active = runs.active();
    out.push_str("# HELP runner_runs Runs not yet ended, by status.\n# TYPE runner_runs gauge\n");
    for (status, n) in &active {
        let _ = writeln!(out, "runner_runs{{status=\"{status}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP runner_workers Runs that may execute at once (--workers).\n# TYPE runner_workers gauge\nrunner_workers {}",
        runs.workers()
    );
    out.push_str("# HELP runner_runs_total Runs ended since the server started, by final status.\n# TYPE runner_runs_total counter\n");
    let ended = runs.ended();
    for status in ["success", "error", "interrupted", "timeout"] {
        let _ = writeln!(
            out,
            "runner_runs_total{{status=\"{status}\"}} {}",
            ended.get(status).copied().unwrap_or(0)
        );
    }
    if part == Part::Api {
        let _ = writeln!(
            out,
            "# HELP runner_active_streams Event streams being sent.\n# TYPE runner_active_streams gauge\nrunner_active_streams {}",
            m.streams.load(Ordering::Relaxed)
        );
        m.steps.render(
            &mut out,
            "runner_step_duration_seconds",
            "Supersteps, from start to checkpoint.",
        );
        m.model_calls.render(
            &mut out,
            "runner_llm_duration_seconds",
            "Model calls, from request to reply or failure.",
        );
    }
    super::triggers::render_metrics(app, &mut out);
    if let Some(depth) = depth {
        render_depth(&mut out, depth);
    }
    out
}

/// The queue's gauges: the same on every process of the database.
fn render_depth(out: &mut String, depth: crate::checkpoint::Result<crate::checkpoint::queue::Depth>) {
    let up = depth.is_ok();
    let _ = writeln!(
        out,
        "# HELP runner_database_up Whether the shared database answered this scrape.\n# TYPE runner_database_up gauge\nrunner_database_up {}",
        u8::from(up)
    );
    let Ok(d) = depth else { return };
    out.push_str(
        "# HELP runner_queue_runs Runs of every process not yet ended, by status: pending (waiting for a worker or for their thread) and running.\n# TYPE runner_queue_runs gauge\n",
    );
    let _ = writeln!(out, "runner_queue_runs{{status=\"pending\"}} {}", d.pending);
    let _ = writeln!(out, "runner_queue_runs{{status=\"running\"}} {}", d.running);
    let _ = writeln!(
        out,
        "# HELP runner_queue_oldest_pending_seconds How long the oldest pending run a worker could take now has waited (0: none waits for a worker).\n# TYPE runner_queue_oldest_pending_seconds gauge\nrunner_queue_oldest_pending_seconds {}",
        d.oldest_pending_ms.unwrap_or(0) as f64 / 1000.0
    );
    let _ = writeln!(
        out,
        "# HELP runner_queue_workers Workers whose heartbeat is fresh.\n# TYPE runner_queue_workers gauge\nrunner_queue_workers {}",
        d.workers
    );
}

/// The queue's depth, asked of the database off the async threads; none when the store has no
/// queue (one process on SQLite or in memory).
async fn depth(app: &Shared) -> Option<crate::checkpoint::Result<crate::checkpoint::queue::Depth>> {
    app.store.queue()?;
    let store = app.store.clone();
    let asked = tokio::task::spawn_blocking(move || store.queue().map(|q| q.depth())).await;
    match asked {
        Ok(d) => d,
        Err(e) => Some(Err(crate::checkpoint::CheckpointError::Backend(e.to_string()))),
    }
}

pub(super) async fn metrics(State(app): State<Shared>) -> Response {
    let depth = depth(&app).await;
    text(render(&app, Part::Api, depth))
}

/// `GET /metrics` of a worker's own port (`runner worker --port`): the runs it executes.
pub(super) async fn worker_metrics(State(app): State<Shared>) -> Response {
    let depth = depth(&app).await;
    text(render(&app, Part::Worker, depth))
}

fn text(body: String) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// Counts every event-stream response as open from when it is sent until its body ends or is
/// dropped.
pub(super) async fn count_streams(State(app): State<Shared>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let is_stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_stream {
        return response;
    }
    let (parts, body) = response.into_parts();
    app.metrics.streams.fetch_add(1, Ordering::Relaxed);
    let guard = StreamGuard(app);
    let stream = body.into_data_stream().map(move |chunk| {
        // The closure owns the guard: it is dropped with the body, however the body ends.
        let _held = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Takes an open stream off the count when dropped with the body it is moved into.
struct StreamGuard(Shared);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.metrics.streams.fetch_sub(1, Ordering::Relaxed);
    }
}
