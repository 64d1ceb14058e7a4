//! Usage accounting on the mock provider: every model call counts once — a failed child
//! run's calls reach its parent, a child run again after failing is not counted twice — and
//! `run_end` names this turn's usage and the thread's.

use std::sync::Arc;

use crate::support::Project;
use runner::checkpoint::Checkpointer;
use runner::checkpoint::memory::MemoryCheckpointer;
use runner::engine::events::{Event, Events};
use runner::engine::{Engine, RunOutcome, RunRequest, Status};
use runner::providers::mock::MockProvider;
use runner::providers::{Providers, Usage};
use serde_json::{Value, json};

/// Runs `req` on `plan` over `store`, with `mock` serving every model.
fn go(
    store: &Arc<dyn Checkpointer>,
    mock: &Arc<MockProvider>,
    plan: &Arc<runner::compile::Plan>,
    req: RunRequest,
) -> (RunOutcome, Vec<Event>) {
    let providers = Providers::for_models_in(plan.models(), Some(mock.clone()), true, &|_| None).unwrap();
    let (events, mut rx) = Events::channel();
    let engine = Engine::new(plan.clone(), store.clone(), providers, events);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(engine.run(req)).unwrap();
    drop(engine);
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        seen.push(e.event);
    }
    (out, seen)
}

fn req(thread: &str, input: Value) -> RunRequest {
    RunRequest {
        thread_id: Some(thread.into()),
        input: Some(input),
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    }
}

const CHILD: &str = r#"
name: child
models: {default: {provider: mock, model: m}}
state: {a: {type: string, default: ""}, b: {type: string, default: ""}}
output: [b]
nodes:
  first: {kind: llm, prompt: {text: "one"}, update: {a: output}}
  second: {kind: llm, prompt: {text: "two"}, update: {b: output}}
edges: [START -> first -> second -> END]
"#;

/// A parent whose subgraph node has `extra` fields.
fn parent(extra: &str) -> String {
    format!(
        r#"
name: parent
models: {{default: {{provider: mock, model: m}}}}
state: {{b: {{type: string, default: ""}}}}
nodes:
  sub:
    kind: subgraph
    workflow: child.yaml
    update: {{b: output.b}}
    {extra}
edges: [START -> sub -> END]
"#
    )
}

#[test]
fn a_failed_subgraphs_calls_are_its_parents() {
    let p = Project::new(&[("child.yaml", CHILD), ("w.yaml", &parent("on_error: END"))]);
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let mock = Arc::new(
        MockProvider::from_value(
            &json!({"replies": {"first": ["A"], "second": [{"error": "bad_request", "message": "no"}]}}),
        )
        .unwrap(),
    );
    let (out, _) = go(&store, &mock, &p.plan("w.yaml"), req("t1", json!({})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    // `first` succeeded and `second` failed inside the child: two calls, both the parent's.
    assert_eq!(out.usage.calls, 2);
}

#[test]
fn a_subgraph_run_again_after_failing_counts_each_call_once() {
    let p = Project::new(&[
        ("child.yaml", CHILD),
        (
            "w.yaml",
            &parent("retry: {max_attempts: 2, retry_on: [invalid], initial_interval: 0.001, jitter: false}"),
        ),
    ]);
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let mock = Arc::new(
        MockProvider::from_value(
            &json!({"replies": {"first": ["A"], "second": [{"error": "bad_request", "message": "no"}, "B"]}}),
        )
        .unwrap(),
    );
    let (out, _) = go(&store, &mock, &p.plan("w.yaml"), req("t2", json!({})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["b"], "B");
    // first, second (failed), second again: three calls. The second child run continues from
    // its checkpoint after `first`, whose call the failed run had already reported.
    assert_eq!(out.usage.calls, 3);
}

#[test]
fn run_end_names_this_turns_usage_and_the_threads() {
    let p = Project::new(&[(
        "w.yaml",
        r#"
name: chat
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {q: {type: string}}}
state: {a: {type: string, default: ""}}
nodes:
  answer: {kind: llm, prompt: {text: "{{ input.q }}"}, update: {a: output}}
edges: [START -> answer -> END]
"#,
    )]);
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let mock = Arc::new(
        MockProvider::from_value(
            &json!({"replies": {"answer": [{"text": "hi", "usage": {"prompt_tokens": 10, "completion_tokens": 5}}]}}),
        )
        .unwrap(),
    );
    let plan = p.plan("w.yaml");
    let ends = |events: &[Event]| -> Vec<(Usage, Usage)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::RunEnd {
                    turn_usage,
                    thread_usage,
                    ..
                } => Some((*turn_usage, *thread_usage)),
                _ => None,
            })
            .collect()
    };
    let (_, first) = go(&store, &mock, &plan, req("chat", json!({"q": "one"})));
    let (out, second) = go(&store, &mock, &plan, req("chat", json!({"q": "two"})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let (turn, thread) = ends(&first)[0];
    assert_eq!((turn.calls, thread.calls), (1, 1));
    let (turn, thread) = ends(&second)[0];
    assert_eq!((turn.calls, turn.total_tokens), (1, 15));
    assert_eq!((thread.calls, thread.total_tokens), (2, 30));
    assert_eq!(out.turn_usage.calls, 1);
    assert_eq!(out.usage.calls, 2);
}

#[test]
fn an_error_handler_sees_what_the_failed_attempts_spent() {
    let p = Project::new(&[(
        "w.yaml",
        r#"
name: tally
models: {default: {provider: mock, model: m}}
state:
  calls: {type: integer, reducer: sum, default: 0}
  tokens: {type: integer, reducer: sum, default: 0}
nodes:
  ask:
    kind: llm
    prompt: {text: "json please"}
    output: {format: json, schema: {type: object, required: [m]}}
    on_error: {to: END, update: {calls: error.usage.calls, tokens: error.usage.total_tokens}}
edges: [START -> ask -> END]
"#,
    )]);
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let mock = Arc::new(
        MockProvider::from_value(
            &json!({"replies": {"ask": [{"text": "nope", "usage": {"prompt_tokens": 4, "completion_tokens": 1}}]}}),
        )
        .unwrap(),
    );
    let (out, _) = go(&store, &mock, &p.plan("w.yaml"), req("t3", json!({})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    // The reply and its two repairs: three calls of five tokens, in the workflow's own tally
    // as in the run's.
    assert_eq!(
        (out.state["calls"].clone(), out.state["tokens"].clone()),
        (json!(3), json!(15))
    );
    assert_eq!(out.usage.calls, 3);
}
