//! One task: a node run for one superstep (and one fan-out item). Attempts run under the
//! node's timeout and are retried by its policy; the output becomes state writes (`update`) and
//! a successor choice (`goto`); a failure after the last attempt goes to `on_error` if the node
//! has one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Shared;
use super::events::Event;
use super::kind::{self, HandedOff, Handoff, NodeCtx, NodeError, NodeFailure, NodeOutput};
use super::values::{self, Scope, to_jinja};
use crate::compile::Retry;
use crate::compile::{Clause, ClauseTarget, NodeIx, Target, Writer};
use crate::error_class::ErrorClass;
use crate::net::http_error;
use crate::providers::Usage;

/// Where a task sends control, besides the node's edges.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Next {
    Node(NodeIx),
    End,
    Send(NodeIx, Value),
    /// End this workflow's run and continue in the parent's (a subgraph's handoff).
    Handoff(Handoff),
}

/// The answer a task resumes with.
#[derive(Debug, Clone)]
pub(super) struct Resume {
    pub answer: Value,
    /// Which of a subgraph's gates it is for, when it waits at several.
    pub to: Option<String>,
    /// The answers the task was given before, in order (a gate that asks several questions).
    pub earlier: Vec<Value>,
}

/// A finished task.
#[derive(Debug, Clone, Default)]
pub(super) struct Done {
    pub writes: Vec<(String, Value)>,
    /// Successors chosen by `goto` (or the `on_error` handler).
    pub next: Vec<Next>,
    /// Its edges are not followed: the node failed and its `on_error` handler took over, or
    /// its subgraph handed off and `next` holds the handoff's targets.
    pub handled: bool,
    pub usage: Usage,
}

/// How a task ended.
#[derive(Debug, Clone)]
pub(super) enum Outcome {
    Done(Done),
    Interrupt(Value),
    Failed(NodeError),
}

/// Runs a task to its end; `spent` is a budget error that stops it before it calls a model.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    shared: Arc<Shared>,
    ix: NodeIx,
    task_id: String,
    item: Option<Value>,
    base: Arc<Scope>,
    step: i64,
    resume: Option<Resume>,
    spent: Option<NodeError>,
) -> (Outcome, f64) {
    let plan = &shared.plan;
    let node = &plan.nodes()[&ix];
    let scope = task_scope(&shared, node, item.as_ref(), &base, step);
    let scope_value = scope.value();
    let policy = &node.retry;
    let timeout = node.timeout;
    let mut attempt = 0u32;
    // What failed attempts spent on models: the task's usage counts every attempt.
    let mut spent_before = Usage::default();
    let started = Instant::now();
    if shared.events.is_on() {
        shared.events.send(Event::NodeStart {
            step,
            node: node.name.clone(),
            task_id: task_id.clone(),
            item: item
                .as_ref()
                .map(|i| super::events::bounded(i, super::events::PAYLOAD_LIMIT).0),
        });
    }
    if let Some(e) = spent {
        let outcome = handle_error(&shared, node, &scope, e, 0);
        return (outcome, started.elapsed().as_secs_f64() * 1000.0);
    }
    let outcome = loop {
        attempt += 1;
        tracing::Span::current().record("runner.attempt", attempt);
        let ctx = NodeCtx {
            plan,
            node,
            ix,
            base: &scope,
            scope: scope_value.clone(),
            task_id: &task_id,
            step,
            events: &shared.events,
            services: &shared.services,
            resume: resume.as_ref().map(|r| &r.answer),
            resume_to: resume.as_ref().and_then(|r| r.to.as_deref()),
            answered: resume.as_ref().map_or(&[], |r| &r.earlier),
            store: &shared.store,
            thread_id: &shared.thread_id,
            fence: &shared.fence,
            validators: &shared.validators,
        };
        let result = match execute_within(&ctx, timeout).await {
            Ok(out) => {
                let mut usage = spent_before;
                usage.add(&out.usage);
                after(&shared, node, &scope, out.output, usage)
            }
            Err(NodeFailure::Interrupt(payload)) => break Outcome::Interrupt(payload),
            Err(NodeFailure::Handoff(h)) => {
                let HandedOff { output, handoffs } = *h;
                let mut usage = spent_before;
                usage.add(&output.usage);
                after(&shared, node, &scope, output.output, usage).and_then(|done| handed_off(&shared, done, handoffs))
            }
            Err(NodeFailure::Error(mut e)) => {
                e.usage.add(&spent_before);
                Err(e)
            }
        };
        match result {
            Ok(done) => break Outcome::Done(done),
            Err(e) => {
                if let Some(delay) = retry_delay(policy, attempt, &e) {
                    wait_to_retry(&shared, &node.name, &task_id, attempt, &e, delay).await;
                    spent_before = e.usage;
                    continue;
                }
                break handle_error(&shared, node, &scope, e, attempt);
            }
        }
    };
    report_usage(&shared, &node.name, &outcome);
    // `node_end` is sent by the step once the result is stored: an observer that sees it may
    // rely on the task never running again.
    (outcome, started.elapsed().as_secs_f64() * 1000.0)
}

/// What a task's expressions read on top of the step's scope: `params`, its fan-out item,
/// and `run`.
pub(super) fn task_scope(
    shared: &Shared,
    node: &crate::compile::PlanNode,
    item: Option<&Value>,
    base: &Arc<Scope>,
    step: i64,
) -> Arc<Scope> {
    let mut extra = vec![("params".to_string(), to_jinja(&params(node)))];
    if let (Some(name), Some(item)) = (&node.item, item) {
        extra.push((name.clone(), to_jinja(item)));
    }
    extra.push((
        "run".to_string(),
        values::run_value(&shared.thread_id, step, &node.name, shared.end_step - step - 1),
    ));
    Arc::new(base.with(extra))
}

/// One attempt of the node's kind, cut off at `timeout`.
async fn execute_within(ctx: &NodeCtx<'_>, timeout: Option<Duration>) -> Result<NodeOutput, NodeFailure> {
    match timeout {
        Some(limit) => match tokio::time::timeout(limit, kind::execute(ctx)).await {
            Ok(r) => r,
            Err(_) => Err(NodeFailure::Error(NodeError::new(
                ErrorClass::Timeout,
                format!("the node ran longer than its timeout of {:.3}s", limit.as_secs_f64()),
            ))),
        },
        None => kind::execute(ctx).await,
    }
}

/// How long to wait before attempt `attempt + 1`, if the policy retries this error (a spent
/// budget is never retried).
pub(super) fn retry_delay(policy: &Retry, attempt: u32, e: &NodeError) -> Option<Duration> {
    let retryable =
        e.class != ErrorClass::Budget && policy.retry_on.iter().any(|c| *c == e.class || *c == ErrorClass::All);
    (attempt < policy.max_attempts && retryable).then(|| backoff(policy, attempt, e.retry_after))
}

/// Reports the retry, and waits `delay` before it.
async fn wait_to_retry(shared: &Shared, node: &str, task_id: &str, attempt: u32, e: &NodeError, delay: Duration) {
    shared.events.send(Event::Retry {
        node: node.to_string(),
        task_id: task_id.to_string(),
        attempt,
        error: e.message.clone(),
        delay_ms: delay.as_secs_f64() * 1000.0,
    });
    tokio::time::sleep(delay).await;
}

/// Reports what the task spent on models, if anything.
fn report_usage(shared: &Shared, node: &str, outcome: &Outcome) {
    let usage = match outcome {
        Outcome::Done(d) => d.usage,
        Outcome::Failed(e) => e.usage,
        Outcome::Interrupt(_) => Usage::default(),
    };
    if usage.calls > 0 {
        shared.events.send(Event::Usage {
            node: node.to_string(),
            usage,
        });
    }
}

fn params(node: &crate::compile::PlanNode) -> Value {
    Value::Object(
        node.spec
            .common()
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

/// Evaluates `update` and `goto` with the node's output in scope.
fn after(
    shared: &Shared,
    node: &crate::compile::PlanNode,
    scope: &Arc<Scope>,
    output: Value,
    usage: Usage,
) -> Result<Done, NodeError> {
    let scope = scope
        .with([
            ("output".to_string(), to_jinja(&output)),
            (
                "usage".to_string(),
                minijinja::Value::from(minijinja::value::Serde(&usage)),
            ),
        ])
        .into_value();
    let writes = writes(shared, &node.update, &scope)?;
    let next = choose(shared, &node.goto, &scope)?;
    Ok(Done {
        writes,
        next,
        handled: false,
        usage,
    })
}

/// A subgraph node whose child handed off: the handoffs' writes are the node's writes (after
/// its own `update`), their targets its successors, instead of its `goto` and edges.
fn handed_off(shared: &Shared, mut done: Done, handoffs: Vec<Handoff>) -> Result<Done, NodeError> {
    let mut next = Vec::new();
    for h in handoffs {
        next.push(match h.to.as_str() {
            "END" => Next::End,
            name => shared.plan.node_by_name(name).map(Next::Node).ok_or_else(|| {
                // The compiler checks every target against this workflow; a child edited since
                // would be refused as an incompatible plan.
                NodeError::invalid(format!("the subgraph handed off to `{name}`, which is not a node here"))
            })?,
        });
        done.writes.extend(h.writes);
    }
    done.next = next;
    done.handled = true;
    Ok(done)
}

fn writes(
    shared: &Shared,
    update: &[(String, Writer)],
    scope: &minijinja::Value,
) -> Result<Vec<(String, Value)>, NodeError> {
    update
        .iter()
        .map(|(key, w)| match w {
            Writer::Literal(v) => Ok((key.clone(), v.clone())),
            Writer::Expr(id) => values::eval(&shared.plan, *id, scope)
                .map(|v| (key.clone(), v))
                .map_err(|e| NodeError::invalid(format!("update of `{key}`: {e}"))),
        })
        .collect()
}

/// The targets of the first clause that holds (clauses of a `goto`, or of a route).
pub(super) fn choose(shared: &Shared, clauses: &[Clause], scope: &minijinja::Value) -> Result<Vec<Next>, NodeError> {
    for clause in clauses {
        let holds = match clause.when {
            Some(id) => values::eval_bool(&shared.plan, id, scope).map_err(|e| {
                NodeError::invalid(format!("condition `{}`: {e}", clause.label.as_deref().unwrap_or("?")))
            })?,
            None => true,
        };
        if !holds {
            continue;
        }
        return match &clause.then {
            ClauseTarget::Nodes(ts) => Ok(ts
                .iter()
                .map(|t| match t {
                    Target::Node(n) => Next::Node(*n),
                    Target::End => Next::End,
                })
                .collect()),
            ClauseTarget::Send(s) => {
                let items = values::eval(&shared.plan, s.foreach, scope).map_err(NodeError::invalid)?;
                let Value::Array(items) = items else {
                    return Err(NodeError::invalid("a fan-out's `foreach` did not yield an array"));
                };
                Ok(items.into_iter().map(|i| Next::Send(s.to, i)).collect())
            }
            ClauseTarget::Handoff(h) => Ok(vec![Next::Handoff(Handoff {
                to: h.to.clone(),
                writes: writes(shared, &h.update, scope)?,
            })]),
        };
    }
    Ok(Vec::new())
}

fn handle_error(
    shared: &Shared,
    node: &crate::compile::PlanNode,
    scope: &Arc<Scope>,
    e: NodeError,
    attempts: u32,
) -> Outcome {
    shared.events.send(Event::Error {
        node: Some(node.name.clone()),
        class: Some(e.class.name().to_string()),
        message: e.message.clone(),
    });
    let Some(handler) = &node.on_error else {
        return Outcome::Failed(e);
    };
    // `usage`: what the failed attempts spent, so a workflow's own cost tally can count it;
    // `at`: when the last attempt failed, so error records a workflow keeps are dated.
    let error = json!({"node": node.name, "class": e.class.name(), "message": e.message, "attempts": attempts,
                       "usage": e.usage, "at": crate::clock::now()});
    let scope = scope.with([("error".to_string(), to_jinja(&error))]).into_value();
    match writes(shared, &handler.update, &scope) {
        Ok(writes) => {
            let next = vec![match handler.to {
                Target::Node(n) => Next::Node(n),
                Target::End => Next::End,
            }];
            Outcome::Done(Done {
                writes,
                next,
                handled: true,
                usage: e.usage,
            })
        }
        Err(e2) => Outcome::Failed(
            NodeError::invalid(format!(
                "{} (and its on_error update failed: {})",
                e.message, e2.message
            ))
            .spent(e.usage),
        ),
    }
}

/// The wait before retry number `attempt` (1-based), at least what the server asked for.
fn backoff(p: &Retry, attempt: u32, retry_after: Option<f64>) -> Duration {
    let base = p.initial.as_secs_f64() * p.factor.powi(attempt as i32 - 1);
    let mut secs = base.min(p.max.as_secs_f64());
    if p.jitter {
        secs *= 0.75 + 0.5 * unit_random();
    }
    if let Some(after) = retry_after.filter(|a| !a.is_nan()) {
        // A wait asked for from outside (a server, a script, a cassette) is bounded here too.
        secs = secs.max(after.min(http_error::MAX_RETRY_AFTER.as_secs_f64()));
    }
    http_error::delay(secs, Duration::MAX)
}

/// A number in [0, 1) for jitter; not for anything that needs real randomness.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_honours_retry_after() {
        let p = Retry {
            max_attempts: 5,
            initial: Duration::from_millis(100),
            factor: 2.0,
            max: Duration::from_millis(300),
            jitter: false,
            retry_on: vec![],
        };
        assert_eq!(backoff(&p, 1, None), Duration::from_millis(100));
        assert_eq!(backoff(&p, 2, None), Duration::from_millis(200));
        assert_eq!(backoff(&p, 3, None), Duration::from_millis(300));
        assert_eq!(backoff(&p, 1, Some(2.0)), Duration::from_secs(2));
        let max = http_error::MAX_RETRY_AFTER;
        for after in [f64::INFINITY, 1e300, f64::MAX] {
            assert_eq!(backoff(&p, 1, Some(after)), max);
        }
        assert_eq!(backoff(&p, 1, Some(f64::NAN)), Duration::from_millis(100));
        assert_eq!(backoff(&p, 1, Some(-5.0)), Duration::from_millis(100));
        let j = Retry { jitter: true, ..p };
        for _ in 0..100 {
            let d = backoff(&j, 1, None).as_secs_f64();
            assert!((0.075..=0.125).contains(&d), "{d}");
        }
    }
}
