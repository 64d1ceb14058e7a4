//! A subgraph hands off to its parent (`goto` with `handoff:`): the child ends, the subgraph
//! node continues at the named parent node instead of its own edges, and the handoff's writes
//! go through the parent's reducers; after a crash the parent reads the handoff again from the
//! child's last checkpoint, running nothing twice.

use std::sync::Arc;

use runner::checkpoint::Checkpointer;
use runner::checkpoint::memory::MemoryCheckpointer;
use runner::compile::Plan;
use runner::engine::events::Events;
use runner::engine::{Engine, RunOptions, RunOutcome, RunRequest, Start, Status};
use runner::providers::Providers;
use runner::providers::mock::MockProvider;
use serde_json::{Value, json};

use crate::support::Project;

/// Runs `plan` on `store` with the scripted model replies of `mock`.
fn go(store: &Arc<dyn Checkpointer>, mock: &Arc<MockProvider>, plan: &Arc<Plan>, req: RunRequest) -> RunOutcome {
    let providers = Providers::for_models_in(plan.models(), Some(mock.clone()), true, &|_| None).unwrap();
    let engine = Engine::new(plan.clone(), store.clone(), providers, Events::none());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(engine.run(req)).unwrap()
}

/// The child thread of the `sub` task of `thread`'s first step: `<thread>/<step>/<task>`.
fn child_thread(thread: &str) -> String {
    format!("{thread}/1/{}", runner::engine::task_id(thread, "sub", 1, 0, None))
}

fn req(thread: Option<&str>, input: Option<Value>) -> RunRequest {
    RunRequest {
        thread_id: thread.map(str::to_string),
        input,
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    }
}

/// A child whose `a` hands off to the parent's `target` while `b` runs beside it (and would
/// go on to `c`).
const CHILD: &str = r#"
name: child
models: {default: {provider: mock, model: m}}
state:
  seen: {type: array, reducer: append, default: []}
nodes:
  a:
    kind: set
    update: {seen: "'a'"}
    goto:
      - when: "true"
        handoff: {to: target, update: {notes: "['from a']", log: "'handoff'"}}
      - {to: END}
  b: {kind: set, update: {seen: "'b'"}}
  c: {kind: set, update: {seen: "'c'"}}
edges:
  - START -> a
  - START -> b
  - b -> c -> END
"#;

const PARENT: &str = r#"
name: parent
models: {default: {provider: mock, model: m}}
state:
  log: {type: array, reducer: append, default: []}
  notes: {type: array, reducer: extend, default: [x]}
nodes:
  sub: {kind: subgraph, workflow: child.yaml, update: {log: "'sub'"}}
  after: {kind: set, update: {log: "'after'"}}
  target: {kind: set, update: {log: "'target'"}}
edges:
  - START -> sub -> after -> END
  - target -> END
"#;

#[test]
fn a_handoff_ends_the_child_and_continues_the_parent_at_its_target_through_its_reducers() {
    let p = Project::new(&[("child.yaml", CHILD), ("w.yaml", PARENT)]);
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let mock = Arc::new(MockProvider::from_value(&json!({})).unwrap());
    let out = go(&store, &mock, &p.plan("w.yaml"), req(None, Some(json!({}))));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    // The node's own update, then the handoff's writes (as the node's), then the target's;
    // `after`, the subgraph node's edge, is not taken.
    assert_eq!(out.state["log"], json!(["sub", "handoff", "target"]));
    // Through the parent's reducer: extended, not replaced.
    assert_eq!(out.state["notes"], json!(["x", "from a"]));
    let history = store.history(&out.thread_id).unwrap();
    // Newest first.
    let ran: Vec<&str> = history
        .iter()
        .rev()
        .flat_map(|cp| cp.ran.iter().map(String::as_str))
        .collect();
    assert_eq!(ran, ["sub", "target"]);
    // The child finished the step it handed off in (`b` too), and nothing after it (`c`).
    let child = child_thread(&out.thread_id);
    let last = store.get_checkpoint(&child, None).unwrap().unwrap();
    assert!(last.next.is_empty(), "{:?}", last.next);
    let state = store.state(&child, &last.versions).unwrap();
    assert_eq!(state["seen"], json!(["a", "b"]));
    // Its thread records how it ended.
    assert_eq!(
        last.meta["handoffs"],
        json!([{"to": "target", "writes": [["notes", ["from a"]], ["log", "handoff"]]}])
    );
    let thread = store.get_thread(&child).unwrap().unwrap();
    assert_eq!(thread.status, runner::checkpoint::ThreadStatus::Done);
}

#[test]
fn a_workflow_that_hands_off_run_on_its_own_fails_saying_why() {
    let p = Project::new(&[("child.yaml", CHILD)]);
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let mock = Arc::new(MockProvider::from_value(&json!({})).unwrap());
    let out = go(&store, &mock, &p.plan("child.yaml"), req(None, Some(json!({}))));
    assert_eq!(out.status, Status::Failed);
    let error = out.error.unwrap_or_default();
    assert!(
        error.contains(
            "routing after `a`: it hands off to the parent's node `target`, but this workflow runs on its own"
        ),
        "{error}"
    );
}

/// The parent killed after its child handed off, before the parent stored the subgraph task's
/// result: the child's thread is finished with the handoff in its last checkpoint. Resuming
/// the parent goes to the handoff's target, and the child's model is not called again.
#[test]
fn a_parent_resumed_after_its_child_handed_off_goes_to_the_target_and_reruns_nothing() {
    let child = r#"
name: child
models: {default: {provider: mock, model: m}}
state: {reply: {type: string, default: ""}}
nodes:
  think:
    kind: llm
    prompt: {text: "Think"}
    update: {reply: output}
    goto:
      - when: "true"
        handoff: {to: target, update: {log: "'handoff: ' ~ output"}}
      - {to: END}
edges: [START -> think]
"#;
    let parent = r#"
name: parent
models: {default: {provider: mock, model: m}}
state:
  log: {type: array, reducer: append, default: []}
nodes:
  sub: {kind: subgraph, workflow: child.yaml, interrupt_before: true}
  after: {kind: set, update: {log: "'after'"}}
  target: {kind: set, update: {log: "'target'"}}
edges:
  - START -> sub -> after -> END
  - target -> END
"#;
    let p = Project::new(&[("child.yaml", child), ("w.yaml", parent)]);
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    // A second call would reply "second": the log shows whether the child ran again.
    let mock = Arc::new(MockProvider::from_value(&json!({"replies": {"think": ["first", "second"]}})).unwrap());
    let plan = p.plan("w.yaml");
    let out = go(&store, &mock, &plan, req(None, Some(json!({}))));
    assert_eq!(out.status, Status::Interrupted);
    // What the subgraph task had done when the parent was killed: its child ran and handed off.
    let child_plan = p.plan("child.yaml");
    let providers = Providers::for_models_in(child_plan.models(), Some(mock.clone()), true, &|_| None).unwrap();
    let engine = Engine::new(child_plan.clone(), store.clone(), providers, Events::none()).with_options(RunOptions {
        as_child: true,
        ..RunOptions::default()
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let child_out = rt
        .block_on(engine.start(Start {
            thread_id: Some(child_thread(&out.thread_id)),
            workflow: "child.yaml".into(),
            input: Some(json!({})),
            context: None,
            config: Vec::new(),
        }))
        .unwrap();
    assert_eq!(child_out.status, Status::Done);
    assert_eq!(child_out.handoffs.len(), 1);
    let out = go(&store, &mock, &plan, req(Some(&out.thread_id), None));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["log"], json!(["handoff: first", "target"]));
}

/// A step that fails beside a subgraph that handed off keeps the subgraph task's result,
/// handoff included: resuming goes to the handoff's target without running the child again.
#[test]
fn a_handed_off_task_kept_from_a_failed_step_is_not_run_again() {
    let child = r#"
name: child
models: {default: {provider: mock, model: m}}
state: {reply: {type: string, default: ""}}
nodes:
  think:
    kind: llm
    prompt: {text: "Think"}
    update: {reply: output}
    goto:
      - when: "true"
        handoff: {to: target, update: {log: "'handoff: ' ~ output"}}
      - {to: END}
edges: [START -> think]
"#;
    let parent = r#"
name: parent
models: {default: {provider: mock, model: m}}
state:
  log: {type: array, reducer: append, default: []}
nodes:
  sub: {kind: subgraph, workflow: child.yaml}
  flaky: {kind: llm, prompt: {text: "Flaky"}, update: {log: "'flaky: ' ~ output"}}
  after: {kind: set, update: {log: "'after'"}}
  target: {kind: set, update: {log: "'target'"}}
edges:
  - START -> sub -> after -> END
  - START -> flaky -> END
  - target -> END
"#;
    let p = Project::new(&[("child.yaml", child), ("w.yaml", parent)]);
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let mock = Arc::new(
        MockProvider::from_value(&json!({"replies": {
            "think": ["first", "second"],
            "flaky": [{"error": "auth", "message": "no key"}, "ok"],
        }}))
        .unwrap(),
    );
    let plan = p.plan("w.yaml");
    let out = go(&store, &mock, &plan, req(None, Some(json!({}))));
    assert_eq!(out.status, Status::Failed);
    let out = go(&store, &mock, &plan, req(Some(&out.thread_id), None));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["log"], json!(["handoff: first", "flaky: ok", "target"]));
}
