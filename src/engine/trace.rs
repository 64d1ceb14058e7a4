//! The spans of a run: the run itself, each superstep, each task and each checkpoint commit.
//! A subgraph's run is a child of the task that runs it, since a span's parent is whatever span
//! is current where it starts. Without a subscriber that wants them, each costs one
//! disabled-callsite check.

use tracing::{Span, field};

/// The span of one run of a thread, from taking its lease to releasing it.
pub(super) fn run(workflow: &str, thread_id: &str) -> Span {
    let span = tracing::info_span!(
        "run",
        otel.name = field::Empty,
        otel.status_code = field::Empty,
        runner.workflow = workflow,
        runner.thread_id = thread_id,
        gen_ai.conversation.id = thread_id,
        runner.status = field::Empty,
        "error.type" = field::Empty,
    );
    if !span.is_disabled() {
        span.record("otel.name", format!("run {workflow}"));
    }
    span
}

/// Records how a run ended on its span.
pub(super) fn run_ended(span: &Span, status: &str, failed: bool) {
    span.record("runner.status", status);
    if failed {
        span.record("otel.status_code", "ERROR");
        span.record("error.type", status);
    }
    span.in_scope(|| tracing::info!(status, "run ended"));
}

/// The span of superstep `step` with `tasks` tasks.
pub(super) fn step(step: i64, tasks: usize) -> Span {
    tracing::info_span!(
        "step",
        otel.name = field::Empty,
        runner.step = step,
        runner.tasks = tasks
    )
    .tap_name(|| format!("step {step}"))
}

/// The span of one task; its `runner.attempt` is recorded as attempts start.
pub(super) fn task(node: &str, task_id: &str, step: i64) -> Span {
    tracing::info_span!(
        "task",
        otel.name = field::Empty,
        otel.status_code = field::Empty,
        runner.node = node,
        runner.task_id = task_id,
        runner.step = step,
        runner.attempt = field::Empty,
    )
    .tap_name(|| format!("task {node}"))
}

/// The span of one commit of `puts` records to the checkpointer; `parent` for a commit made
/// off the run's own thread (the background committer).
pub(super) fn commit(parent: Option<&Span>, puts: usize, synced: bool) -> Span {
    match parent {
        Some(parent) => tracing::info_span!(
            parent: parent,
            "checkpoint.commit",
            runner.puts = puts,
            runner.synced = synced
        ),
        None => tracing::info_span!("checkpoint.commit", runner.puts = puts, runner.synced = synced),
    }
}

trait TapName {
    /// Sets the exported span name, computed only when the span is enabled.
    fn tap_name(self, name: impl FnOnce() -> String) -> Self;
}

impl TapName for Span {
    fn tap_name(self, name: impl FnOnce() -> String) -> Span {
        if !self.is_disabled() {
            self.record("otel.name", name());
        }
        self
    }
}
