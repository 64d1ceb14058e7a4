//! The engine's semantics, one test per rule, modelled on LangGraph's behaviour: reducers,
//! write conflicts, joins, loops, the recursion limit, fan-out order, goto, subgraphs,
//! interrupts, retries, on_error, timeouts, history and fork. All offline: the scripted mock
//! provider and the in-memory checkpointer.

use std::sync::Arc;

use runner::checkpoint::Checkpointer;
use runner::checkpoint::memory::MemoryCheckpointer;
use runner::compile::Plan;
use runner::engine::events::{Event, Events};
use runner::engine::{Engine, Persist, RunOutcome, RunRequest, Status};
use runner::providers::Providers;
use runner::providers::mock::MockProvider;
use serde_json::{Value, json};

use crate::support::Project;

struct Run {
    store: Arc<dyn Checkpointer>,
    mock: Arc<MockProvider>,
    events: Vec<Event>,
}

impl Run {
    fn new(script: Value) -> Run {
        Run {
            store: Arc::new(MemoryCheckpointer::new()),
            mock: Arc::new(MockProvider::from_value(&script).unwrap()),
            events: Vec::new(),
        }
    }

    fn go(&mut self, plan: &Arc<Plan>, req: RunRequest) -> RunOutcome {
        let providers = Providers::for_models_in(plan.models(), Some(self.mock.clone()), true, &|_| None).unwrap();
        let (events, mut rx) = Events::channel();
        let engine = Engine::new(plan.clone(), self.store.clone(), providers, events);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(engine.run(req)).unwrap();
        drop(engine);
        while let Ok(e) = rx.try_recv() {
            self.events.push(e.event);
        }
        out
    }

    /// The tasks that ran, as people read them (`node`, `worker#2`): each task's label is what
    /// its step's start said of it.
    fn ran(&self) -> Vec<String> {
        let mut labels = std::collections::HashMap::new();
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::StepStart { tasks, nodes, .. } => {
                    labels.extend(tasks.iter().cloned().zip(nodes.iter().cloned()));
                    None
                }
                Event::NodeEnd {
                    task_id, cached: false, ..
                } => Some(labels.get(task_id).cloned().expect("a task its step started")),
                _ => None,
            })
            .collect()
    }
}

fn req(input: Value) -> RunRequest {
    RunRequest {
        input: Some(input),
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    }
}

fn resume(thread: &str, answer: Option<Value>) -> RunRequest {
    RunRequest {
        thread_id: Some(thread.into()),
        answer,
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    }
}

const MODELS: &str = "models: {default: {provider: mock, model: m}}\n";

fn wf(body: &str) -> String {
    format!("name: t\n{MODELS}{body}")
}

/// The id of the task that runs `node` in `step` of `thread` (on its first branch, no fan-out
/// item): what its interrupts are addressed by and its messages' ids are made from.
fn task(thread: &str, node: &str, step: i64) -> String {
    runner::engine::task_id(thread, node, step, 0, None)
}

/// The id `add_messages` gives the `n`th message (1-based) of `task`'s write that is not its
/// first assistant message; `None`: that assistant message's own.
fn msg(task: &str, n: Option<usize>) -> String {
    let id = runner::engine::message_id(task);
    n.map_or(id.clone(), |n| format!("{id}:{n}"))
}

/// The `__start__` task of each turn of `thread`, oldest first: the one task each turn's
/// input checkpoint waits for, which writes the turn's input.
fn start_tasks(store: &Arc<dyn Checkpointer>, thread: &str) -> Vec<String> {
    store
        .history(thread)
        .unwrap()
        .iter()
        .rev()
        .filter(|cp| cp.next.len() == 1 && cp.next[0].node == runner::engine::START_TASK)
        .map(|cp| cp.next[0].task_id.clone())
        .collect()
}

#[test]
fn reducers_fold_writes_each_in_its_own_way() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state:
  total: {type: integer, reducer: sum, default: 0}
  best: {type: number, reducer: max, default: 0}
  tags: {type: array, reducer: union, default: [x]}
  log: {type: array, reducer: append, default: []}
  profile: {type: object, reducer: merge, default: {a: {b: 1}}}
  messages: {type: array, reducer: add_messages, default: []}
  ranked: {type: array, reducer: by_score, default: []}
  last: {type: string, default: ""}
reducers:
  by_score: "(current + update) | sort(attribute='score', reverse=true)"
nodes:
  one: {kind: set, update: {total: "2", best: "3.5", tags: "['x', 'y']", log: "'a'", profile: "{'a': {'c': 2}}", messages: "'hi'", ranked: "[{'score': 1}]", last: "'one'"}}
  two: {kind: set, update: {total: "5", best: "1", tags: "['y', 'z']", log: "['b', 'c']", messages: "[{'role': 'assistant', 'content': 'yo'}]", ranked: "[{'score': 9}, {'score': 4}]", last: "'two'"}}
edges: [START -> one -> two -> END]
"#),
    )]);
    let mut r = Run::new(json!({}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Done);
    let s = &out.state;
    assert_eq!(s["total"], json!(7));
    assert_eq!(s["best"], json!(3.5));
    assert_eq!(s["tags"], json!(["x", "y", "z"]));
    assert_eq!(s["log"], json!(["a", "b", "c"]));
    assert_eq!(s["profile"], json!({"a": {"b": 1, "c": 2}}));
    // Ids from their writers' tasks: `one`'s string, made a user message, is its write's first
    // message that is not an assistant's; `two`'s assistant message takes its task's id.
    let thread = &out.thread_id;
    assert_eq!(
        s["messages"],
        json!([
            {"role": "user", "content": "hi", "id": msg(&task(thread, "one", 1), Some(1))},
            {"role": "assistant", "content": "yo", "id": msg(&task(thread, "two", 2), None)}
        ])
    );
    assert_eq!(s["ranked"], json!([{"score": 9}, {"score": 4}, {"score": 1}]));
    assert_eq!(s["last"], json!("two"));
}

const PARALLEL: &str = r#"
state:
  x: {type: array, reducer: append, default: []}
  seen: {type: array, reducer: append, default: []}
nodes:
  split: {kind: set}
  a: {kind: set, update: {x: "['a']", seen: "[state.x | length]"}}
  b: {kind: set, update: {x: "['b']", seen: "[state.x | length]"}}
  c: {kind: set, update: {x: "['c']"}}
  after: {kind: set, update: {seen: "[state.x | length]"}}
edges:
  - START -> split
  - {from: split, to: [b, a, c]}
  - {from: [a, b, c], to: after}
  - after -> END
"#;

#[test]
fn parallel_nodes_read_the_step_start_state_and_merge_in_plan_order() {
    let p = Project::new(&[("w.yaml", &wf(PARALLEL))]);
    let mut r = Run::new(json!({}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    // a and b both saw x empty (the state as of the start of their step); the writes merged
    // in declaration order a, b, c whatever the finishing order; `after` saw all three.
    assert_eq!(out.state["x"], json!(["a", "b", "c"]));
    assert_eq!(out.state["seen"], json!([0, 0, 3]));
    assert_eq!(out.steps, 3);
}

#[test]
fn a_write_conflict_fails_the_step_and_leaves_the_thread_resumable() {
    let p = Project::new(&[("w.yaml", &wf(PARALLEL))]);
    // The compiler refuses two writers of a replace key in one step; a plan that slips past it
    // (here: edited after compilation) is still caught at run time.
    let mut plan = Arc::try_unwrap(p.plan("w.yaml")).unwrap();
    plan.tamper_with_state().get_mut("x").unwrap().reducer = runner::compile::Reducer::Replace;
    let broken = Arc::new(plan);
    let mut r = Run::new(json!({}));
    let out = r.go(&broken, req(json!({})));
    assert_eq!(out.status, Status::Failed);
    let err = out.error.unwrap();
    assert!(
        err.contains("write conflict") && err.contains("`a` and `b` and `c`") && err.contains("`x`"),
        "{err}"
    );
    // The last good checkpoint is intact; the fixed workflow resumes without re-running a, b, c.
    let history = r.store.history(&out.thread_id).unwrap();
    assert_eq!(history[0].step, 1);
    r.events.clear();
    let fixed = p.plan("w.yaml");
    let out = r.go(&fixed, resume(&out.thread_id, None));
    assert_eq!(out.status, Status::Done);
    assert_eq!(out.state["x"], json!(["a", "b", "c"]));
    assert_eq!(r.ran(), vec!["after"]);
}

#[test]
fn a_join_waits_for_every_source_even_on_branches_of_unequal_length() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {log: {type: array, reducer: append, default: []}}
nodes:
  s: {kind: set}
  short: {kind: set, update: {log: "['short']"}}
  long1: {kind: set, update: {log: "['long1']"}}
  long2: {kind: set, update: {log: "['long2']"}}
  joined: {kind: set, update: {log: "['joined']"}}
edges:
  - START -> s
  - {from: s, to: [short, long1]}
  - long1 -> long2
  - {from: [short, long2], to: joined}
  - joined -> END
"#),
    )]);
    let mut r = Run::new(json!({}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.state["log"], json!(["short", "long1", "long2", "joined"]));
    assert_eq!(r.ran().iter().filter(|t| *t == "joined").count(), 1);
}

#[test]
fn a_loop_exits_when_its_predicate_holds() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
config: {rounds: 4}
state: {n: {type: integer, default: 0}}
predicates: {enough: "state.n >= config.rounds"}
nodes: {inc: {kind: set, update: {n: "state.n + 1"}}}
edges:
  - START -> inc
  - {from: inc, route: [{when: enough, to: END}, {to: inc}]}
"#),
    )]);
    let mut r = Run::new(json!({}));
    let plan = p.plan("w.yaml");
    assert_eq!(r.go(&plan, req(json!({}))).state["n"], json!(4));
    let more = RunRequest {
        config: vec![("rounds".into(), json!(7))],
        ..req(json!({}))
    };
    assert_eq!(r.go(&plan, more).state["n"], json!(7));
}

#[test]
fn the_recursion_limit_counts_exactly_the_supersteps_it_says() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {n: {type: integer, default: 0}}
nodes: {inc: {kind: set, update: {n: "state.n + 1"}}}
edges:
  - START -> inc
  - {from: inc, route: [{when: "state.n >= 5", to: END}, {to: inc}]}
"#),
    )]);
    let plan = p.plan("w.yaml");
    // Five supersteps are needed: a limit of 5 allows them, 4 does not.
    let mut r = Run::new(json!({}));
    let ok = r.go(
        &plan,
        RunRequest {
            recursion_limit: Some(5),
            ..req(json!({}))
        },
    );
    assert_eq!((ok.status, ok.steps), (Status::Done, 5));
    let short = r.go(
        &plan,
        RunRequest {
            recursion_limit: Some(4),
            ..req(json!({}))
        },
    );
    assert_eq!(short.status, Status::Failed);
    assert!(short.error.unwrap().contains("recursion limit of 4"));
    assert_eq!(short.state["n"], json!(4));
}

fn fan_out() -> (Project, Value) {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, properties: {items: {type: array}}}
state:
  results: {type: array, reducer: append, default: []}
  count: {type: integer, reducer: sum, default: 0}
nodes:
  plan: {kind: set}
  work:
    kind: llm
    prompt: {text: "item {{ job }}"}
    update: {results: "[output]", count: "1"}
  done: {kind: set}
edges:
  - START -> plan
  - {from: plan, send: {to: work, foreach: input.items, as: job}}
  - work -> done
  - done -> END
"#),
    )]);
    (p, json!({"replies": {"work": "ok"}}))
}

#[test]
fn fan_out_of_zero_one_and_a_thousand_items_merges_in_item_order() {
    for n in [0usize, 1, 1000] {
        let (p, script) = fan_out();
        let mut r = Run::new(script);
        let items: Vec<Value> = (0..n).map(|i| json!(i)).collect();
        let out = r.go(&p.plan("w.yaml"), req(json!({"items": items})));
        assert_eq!(out.status, Status::Done, "{n}: {:?}", out.error);
        assert_eq!(out.state["count"], json!(n), "{n}");
        assert_eq!(out.state["results"].as_array().unwrap().len(), n);
        // With no items the branch ends at the fan-out: `done` never runs.
        assert_eq!(r.ran().contains(&"done".to_string()), n > 0, "{n}");
    }
}

#[test]
fn fan_out_results_keep_item_order_whatever_order_tasks_finish_in() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, properties: {items: {type: array}}}
state: {results: {type: array, reducer: append, default: []}}
nodes:
  plan: {kind: set}
  work: {kind: llm, prompt: {text: "item <{{ job }}>"}, update: {results: "[output]"}}
edges:
  - START -> plan
  - {from: plan, send: {to: work, foreach: input.items, as: job}}
  - work -> END
"#),
    )]);
    // Item i answers after (10 - i) * 15 ms: the last item finishes first.
    let matches: Vec<Value> =
        (0..10).map(|i| json!({"contains": format!("<{i}>"), "reply": {"text": format!("r{i}"), "delay": 0.015 * (10 - i) as f64}})).collect();
    let mut r = Run::new(json!({"match": matches}));
    let out = r.go(&p.plan("w.yaml"), req(json!({"items": (0..10).collect::<Vec<_>>()})));
    let finished: Vec<String> = r.ran().into_iter().filter(|t| t.starts_with("work#")).collect();
    assert_eq!(
        finished.first().map(String::as_str),
        Some("work#9"),
        "tasks finished in reverse: {finished:?}"
    );
    assert_eq!(
        out.state["results"],
        json!((0..10).map(|i| format!("r{i}")).collect::<Vec<_>>())
    );
}

#[test]
fn goto_lets_a_node_choose_its_successor_from_its_output() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {path: {type: array, reducer: append, default: []}}
nodes:
  decide:
    kind: llm
    prompt: {text: "which?"}
    output: {format: json, schema: {type: object, required: [next], properties: {next: {enum: [left, right]}}}}
    update: {path: "['decide']"}
    goto:
      - {when: "output.next == 'left'", to: left}
      - {to: right}
  left: {kind: set, update: {path: "['left']"}}
  right: {kind: set, update: {path: "['right']"}}
edges: [left -> END, right -> END, START -> decide]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({"replies": {"decide": "{\"next\": \"right\"}"}}));
    assert_eq!(r.go(&plan, req(json!({}))).state["path"], json!(["decide", "right"]));
    let mut r = Run::new(json!({"replies": {"decide": "```json\n{\"next\": \"left\"}\n```"}}));
    assert_eq!(r.go(&plan, req(json!({}))).state["path"], json!(["decide", "left"]));
}

#[test]
fn a_json_reply_that_misses_the_schema_is_repaired_then_fails() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {n: {type: integer, default: 0}}
nodes:
  ask:
    kind: llm
    prompt: {text: "a number"}
    output: {format: json, repair: 1, schema: {type: object, required: [n], properties: {n: {type: integer}}}}
    update: {n: output.n}
edges: [START -> ask, ask -> END]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({"replies": {"ask": ["not json", "{\"n\": 3}"]}}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!((out.status, &out.state["n"]), (Status::Done, &json!(3)));
    assert_eq!(out.usage.calls, 2);
    let mut r = Run::new(json!({"replies": {"ask": ["{\"m\": 1}", "{\"n\": \"x\"}"]}}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Failed);
    assert!(
        out.error
            .unwrap()
            .contains("did not match the output schema (2 replies: the first and 1 repair)")
    );
}

/// An llm node whose replies never match its schema: two attempts of two calls each (a reply
/// and its repair).
const NEVER_MATCHES: &str = r#"
  ask:
    kind: llm
    prompt: {text: "a number"}
    output: {format: json, repair: 1, schema: {type: object, required: [n]}}
    retry: {max_attempts: 2, initial_interval: 0s, retry_on: [invalid]}
"#;

#[test]
fn what_a_failed_node_spent_counts_toward_the_run_and_its_budget() {
    let handled = format!(
        r#"
limits: {{max_llm_calls: 4}}
state: {{errors: {{type: array, reducer: append, default: []}}}}
nodes:{NEVER_MATCHES}    on_error: {{to: again, update: {{errors: "[error.class]"}}}}
  again:
    kind: llm
    prompt: {{text: "once more"}}
    on_error: {{to: END, update: {{errors: "[error.class]"}}}}
edges: [START -> ask, ask -> END, again -> END]
"#
    );
    let p = Project::new(&[("w.yaml", &wf(&handled))]);
    let mut r = Run::new(json!({"replies": {"ask": "{\"m\": 1}"}}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Done);
    assert_eq!(out.usage.calls, 4, "every call the failed node made is counted");
    // The budget saw them too: the next model call is refused.
    assert_eq!(out.state["errors"], json!(["invalid", "budget"]));
    let reported: u64 = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Usage { node, usage } if node == "ask" => Some(usage.calls),
            _ => None,
        })
        .sum();
    assert_eq!(reported, 4);

    // Without a handler the run fails, and its report still counts the calls.
    let failing = format!("nodes:{NEVER_MATCHES}edges: [START -> ask, ask -> END]\n");
    let p = Project::new(&[("w.yaml", &wf(&failing))]);
    let mut r = Run::new(json!({"replies": {"ask": "{\"m\": 1}"}}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Failed);
    assert_eq!(out.usage.calls, 4);
}

#[test]
fn a_subgraph_maps_input_and_output_and_keeps_its_own_state() {
    let child = r#"
name: child
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {topic: {type: string}}}
output: [summary]
state:
  summary: {type: string, default: ""}
  private: {type: integer, default: 41}
nodes:
  work: {kind: set, update: {summary: "'about ' ~ input.topic", private: "state.private + 1"}}
edges: [START -> work, work -> END]
"#;
    let p = Project::new(&[
        ("child.yaml", child),
        (
            "w.yaml",
            &wf(r#"
state: {result: {type: string, default: ""}}
nodes:
  sub: {kind: subgraph, workflow: child.yaml, input: {topic: "'rust'"}, update: {result: output.summary}}
edges: [START -> sub, sub -> END]
"#),
        ),
    ]);
    let mut r = Run::new(json!({}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(
        out.state,
        serde_json::from_value::<serde_json::Map<String, Value>>(json!({"result": "about rust"})).unwrap()
    );
    // The child's checkpoints live on a thread namespaced under the parent's.
    let child_threads: Vec<String> = r
        .store
        .list_threads()
        .unwrap()
        .into_iter()
        .map(|t| t.thread_id)
        .filter(|t| t.starts_with(&format!("{}/", out.thread_id)))
        .collect();
    assert_eq!(child_threads.len(), 1);
    let child_cp = r.store.get_checkpoint(&child_threads[0], None).unwrap().unwrap();
    assert_eq!(
        r.store.state(&child_threads[0], &child_cp.versions).unwrap()["private"],
        json!(42)
    );
}

const GATE: &str = r##"
types:
  Answer:
    type: object
    required: [action]
    properties: {action: {enum: [accept, respond]}, feedback: {type: string}}
    additionalProperties: false
state:
  plan: {type: string, default: "draft"}
  log: {type: array, reducer: append, default: []}
nodes:
  gate:
    kind: interrupt
    message: "Approve the plan: {{ state.plan }}?"
    payload: {plan: state.plan}
    response: {$ref: "#/types/Answer"}
    update: {log: "[output.action]"}
    goto:
      - {when: "output.action == 'accept'", to: go}
      - {to: revise}
  revise: {kind: set, update: {plan: "state.plan ~ '+'"}}
  go: {kind: set, update: {log: "['went']"}}
edges: [START -> gate, revise -> gate, go -> END]
"##;

#[test]
fn an_interrupt_stops_durably_and_resumes_with_a_validated_answer() {
    let p = Project::new(&[("w.yaml", &wf(GATE))]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    let pending = out.interrupt.unwrap();
    assert_eq!(pending["node"], "gate");
    assert_eq!(pending["payload"]["message"], "Approve the plan: draft?");
    assert_eq!(pending["payload"]["payload"], json!({"plan": "draft"}));
    let thread = out.thread_id.clone();
    // A bad answer is refused and the gate stays open.
    let providers = Providers::for_models_in(plan.models(), Some(r.mock.clone()), true, &|_| None).unwrap();
    let engine = Engine::new(plan.clone(), r.store.clone(), providers, Events::none());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(engine.run(resume(&thread, Some(json!({"action": "maybe"})))))
        .unwrap_err();
    assert!(
        err.to_string().contains("does not fit the gate's response schema"),
        "{err}"
    );
    assert_eq!(
        r.store.get_thread(&thread).unwrap().unwrap().status,
        runner::checkpoint::ThreadStatus::Interrupted
    );
    // respond → revise → the gate asks again with the revised plan; accept → go.
    let out = r.go(
        &plan,
        resume(&thread, Some(json!({"action": "respond", "feedback": "more"}))),
    );
    assert_eq!(out.status, Status::Interrupted);
    assert_eq!(out.interrupt.unwrap()["payload"]["payload"]["plan"], "draft+");
    let out = r.go(&plan, resume(&thread, Some(json!({"action": "accept"}))));
    assert_eq!(out.status, Status::Done);
    assert_eq!(out.state["log"], json!(["respond", "accept", "went"]));
}

#[test]
fn resuming_a_thread_that_waits_for_nothing_is_refused() {
    let p = Project::new(&[(
        "w.yaml",
        &wf("nodes: {a: {kind: set}}\nedges: [START -> a, a -> END]\n"),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    let engine = Engine::new(plan.clone(), r.store.clone(), Providers::default(), Events::none());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(engine.run(resume(&out.thread_id, Some(json!(1)))))
        .unwrap_err();
    assert!(err.to_string().contains("is not waiting for an answer"));
}

#[test]
fn interrupt_before_and_after_pause_around_a_node() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {log: {type: array, reducer: append, default: []}}
nodes:
  a: {kind: set, update: {log: "['a']"}, interrupt_after: true}
  b: {kind: set, update: {log: "['b']"}, interrupt_before: true}
  c: {kind: set, update: {log: "['c']"}}
edges: [START -> a -> b -> c -> END]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!((out.status, &out.state["log"]), (Status::Interrupted, &json!(["a"])));
    assert_eq!(out.interrupt.as_ref().unwrap()["kind"], "after");
    // Its own id: not the `__before__` of the other kind of pause.
    assert_eq!(out.interrupt.as_ref().unwrap()["task_id"], "__after__");
    let out = r.go(&plan, resume(&out.thread_id, None));
    assert_eq!((out.status, &out.state["log"]), (Status::Interrupted, &json!(["a"])));
    assert_eq!(out.interrupt.as_ref().unwrap()["kind"], "before");
    let out = r.go(&plan, resume(&out.thread_id, None));
    assert_eq!((out.status, &out.state["log"]), (Status::Done, &json!(["a", "b", "c"])));
}

const FLAKY: &str = r#"
state:
  answer: {type: string, default: ""}
  errors: {type: array, reducer: append, default: []}
nodes:
  ask:
    kind: llm
    prompt: {text: "q"}
    retry: {max_attempts: 3, initial_interval: 0.001, jitter: false}
    update: {answer: output}
    on_error:
      to: fallback
      update: {errors: "[{'node': error.node, 'class': error.class, 'attempts': error.attempts}]"}
  fallback: {kind: set, update: {answer: "'fallback'"}}
edges: [START -> ask, ask -> END, fallback -> END]
"#;

#[test]
fn retries_then_success() {
    let p = Project::new(&[("w.yaml", &wf(FLAKY))]);
    let mut r =
        Run::new(json!({"replies": {"ask": [{"error": "rate_limit"}, {"error": "server", "status": 503}, "fine"]}}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.state["answer"], "fine");
    assert_eq!(r.events.iter().filter(|e| matches!(e, Event::Retry { .. })).count(), 2);
    // Every call counts: two that failed and the one that answered.
    assert_eq!(out.usage.calls, 3);
}

#[test]
fn retries_exhausted_go_to_on_error_with_the_error_recorded() {
    let p = Project::new(&[("w.yaml", &wf(FLAKY))]);
    let mut r = Run::new(json!({"replies": {"ask": {"error": "server", "status": 500}}}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Done);
    assert_eq!(out.state["answer"], "fallback");
    assert_eq!(
        out.state["errors"],
        json!([{"node": "ask", "class": "server", "attempts": 3}])
    );
    // Errors that are not retried by default (bad request) fail at once.
    let mut r = Run::new(json!({"replies": {"ask": {"error": "bad_request"}}}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.state["errors"][0]["attempts"], 1);
}

#[test]
fn a_node_past_its_timeout_fails_with_the_timeout_class() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {errors: {type: array, reducer: append, default: []}}
nodes:
  slow:
    kind: llm
    prompt: {text: "q"}
    timeout: 50ms
    retry: {max_attempts: 1}
    on_error: {to: END, update: {errors: "[error.class]"}}
edges: [START -> slow, slow -> END]
"#),
    )]);
    let mut r = Run::new(json!({"replies": {"slow": {"text": "late", "delay": 2.0}}}));
    let started = std::time::Instant::now();
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(out.state["errors"], json!(["timeout"]));
}

#[test]
fn max_visits_stops_a_runaway_node() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {n: {type: integer, default: 0}}
nodes: {inc: {kind: set, update: {n: "state.n + 1"}, max_visits: 3}}
edges: [START -> inc, {from: inc, route: [{when: "state.n > 100", to: END}, {to: inc}]}]
"#),
    )]);
    let mut r = Run::new(json!({}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Failed);
    assert!(out.error.unwrap().contains("max_visits of 3"));
    assert_eq!(out.state["n"], json!(3));
}

#[test]
fn emit_sends_custom_events() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {ids: {type: array, default: [a, b]}}
nodes: {tell: {kind: emit, event: node_added, foreach: state.ids, data: {id: item, n: "state.ids | length"}}}
edges: [START -> tell, tell -> END]
"#),
    )]);
    let mut r = Run::new(json!({}));
    r.go(&p.plan("w.yaml"), req(json!({})));
    let custom: Vec<Value> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Custom { event, data, .. } if event == "node_added" => Some(data.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(custom, vec![json!({"id": "a", "n": 2}), json!({"id": "b", "n": 2})]);
}

#[test]
fn input_is_validated_against_the_workflow_input_schema() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(
            "input: {type: object, required: [query], properties: {query: {type: string}}}\nnodes: {a: {kind: set}}\nedges: [START -> a, a -> END]\n",
        ),
    )]);
    let plan = p.plan("w.yaml");
    let engine = Engine::new(
        plan,
        Arc::new(MemoryCheckpointer::new()),
        Providers::default(),
        Events::none(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt.block_on(engine.run(req(json!({"query": 5})))).unwrap_err();
    assert!(err.to_string().contains("input: `query`"), "{err}");
    let err = rt.block_on(engine.run(req(json!({})))).unwrap_err();
    assert!(err.to_string().contains("\"query\" is a required property"), "{err}");
}

#[test]
fn fork_from_a_checkpoint_with_an_edit_branches_time() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {n: {type: integer, default: 0}, log: {type: array, reducer: append, default: []}}
nodes: {inc: {kind: set, update: {n: "state.n + 1", log: "[state.n]"}}}
edges: [START -> inc, {from: inc, route: [{when: "state.n >= 4", to: END}, {to: inc}]}]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.state["log"], json!([0, 1, 2, 3]));
    let history = r.store.history(&out.thread_id).unwrap();
    let at_step_2 = history.iter().find(|c| c.step == 2).unwrap();
    let fork = r
        .store
        .fork(&out.thread_id, &at_step_2.checkpoint_id, "branch")
        .unwrap();
    assert_eq!(fork.step, 2);
    // Edit `n` on the branch (what `runner fork --set n=10` does), then continue it.
    let mut versions = fork.versions.clone();
    let v = versions["n"] + 1;
    versions.insert("n".into(), v);
    let edited = runner::checkpoint::Checkpoint {
        checkpoint_id: runner::checkpoint::new_id(),
        parent_id: Some(fork.checkpoint_id.clone()),
        versions,
        changed: vec!["n".into()],
        ..fork.clone()
    };
    r.store.put_checkpoint(&edited, &[("n".into(), v, json!(10))]).unwrap();
    let branch = r.go(&plan, resume("branch", None));
    assert_eq!(branch.status, Status::Done);
    assert_eq!(branch.state["log"], json!([0, 1, 10]));
    // The original thread is unchanged.
    let cp = r.store.get_checkpoint(&out.thread_id, None).unwrap().unwrap();
    assert_eq!(
        r.store.state(&out.thread_id, &cp.versions).unwrap()["log"],
        json!([0, 1, 2, 3])
    );
}

#[test]
fn persist_modes_reach_the_same_state_with_fewer_commits() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {n: {type: integer, reducer: sum, default: 0}}
nodes: {inc: {kind: set, update: {n: "1"}}}
edges: [START -> inc, {from: inc, route: [{when: "state.n >= 10", to: END}, {to: inc}]}]
"#),
    )]);
    let plan = p.plan("w.yaml");
    // The turn's two first checkpoints (before and after its input), then one per step.
    for (mode, checkpoints) in [(Persist::Sync, 12), (Persist::Async, 12), (Persist::Exit, 3)] {
        let mut r = Run::new(json!({}));
        let out = r.go(
            &plan,
            RunRequest {
                persist: mode,
                ..req(json!({}))
            },
        );
        assert_eq!(out.state["n"], json!(10), "{mode:?}");
        let history = r.store.history(&out.thread_id).unwrap();
        assert_eq!(history.len(), checkpoints, "{mode:?}");
        let cp = &history[0];
        assert_eq!(
            r.store.state(&out.thread_id, &cp.versions).unwrap()["n"],
            json!(10),
            "{mode:?}"
        );
    }
}

#[test]
fn a_thread_refuses_an_incompatible_workflow_unless_forced() {
    let v1 = wf(
        "state: {a: {type: integer, default: 0}}\nnodes: {g: {kind: interrupt, response: {type: object}, update: {a: '1'}}}\nedges: [START -> g, g -> END]\n",
    );
    let v2 = wf(
        "state: {b: {type: integer, default: 0}}\nnodes: {g: {kind: interrupt, response: {type: object}, update: {b: '1'}}}\nedges: [START -> g, g -> END]\n",
    );
    let p = Project::new(&[("w.yaml", &v1)]);
    let mut r = Run::new(json!({}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    std::fs::write(p.path("w.yaml"), v2).unwrap();
    let plan2 = p.plan("w.yaml");
    let engine = Engine::new(plan2.clone(), r.store.clone(), Providers::default(), Events::none());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(engine.run(resume(&out.thread_id, Some(json!({})))))
        .unwrap_err();
    assert!(
        err.to_string().contains("state keys `a` are gone") && err.to_string().contains("--force"),
        "{err}"
    );
    let forced = rt
        .block_on(engine.run(RunRequest {
            force: true,
            ..resume(&out.thread_id, Some(json!({})))
        }))
        .unwrap();
    assert_eq!(forced.status, Status::Done);
}

#[test]
fn new_input_on_a_finished_thread_starts_a_new_turn_on_its_state() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, required: [q], properties: {q: {type: string}, polite: {type: boolean, default: true}}}
state: {turns: {type: array, reducer: append, default: []}}
nodes: {say: {kind: set, update: {turns: "[input.q ~ (' please' if input.polite else '')]"}}}
edges: [START -> say, say -> END]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let first = r.go(&plan, req(json!({"q": "hello"})));
    assert_eq!(
        first.state["turns"],
        json!(["hello please"]),
        "schema defaults fill absent input fields"
    );
    let second = r.go(
        &plan,
        RunRequest {
            thread_id: Some(first.thread_id.clone()),
            ..req(json!({"q": "again", "polite": false}))
        },
    );
    assert_eq!(second.status, Status::Done);
    assert_eq!(second.state["turns"], json!(["hello please", "again"]));
    // Continuing without input runs nothing more: the thread is done.
    let third = r.go(&plan, resume(&first.thread_id, None));
    assert_eq!(third.state["turns"], json!(["hello please", "again"]));
}

#[test]
fn new_input_is_refused_while_a_thread_waits_at_a_gate() {
    let p = Project::new(&[("w.yaml", &wf(GATE))]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    let engine = Engine::new(plan.clone(), r.store.clone(), Providers::default(), Events::none());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(engine.run(RunRequest {
            thread_id: Some(out.thread_id),
            ..req(json!({}))
        }))
        .unwrap_err();
    assert!(err.to_string().contains("has work pending"), "{err}");
}

#[test]
fn an_update_that_evaluates_to_undefined_fails_instead_of_writing_null() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, properties: {n: {type: integer}}}
state: {out: {type: [integer, "null"], default: 0}}
nodes: {copy: {kind: set, update: {out: input.n}}}
edges: [START -> copy, copy -> END]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Failed);
    assert!(out.error.unwrap().contains("undefined"));
    assert_eq!(r.go(&plan, req(json!({"n": 5}))).state["out"], json!(5));
}

#[test]
fn append_only_keys_store_what_each_step_added() {
    use runner::checkpoint::sqlite::SqliteCheckpointer;
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
config: {rounds: 600}
state:
  log: {type: array, reducer: append, default: []}
  payload: {type: string, default: ""}
nodes: {add: {kind: set, update: {log: "['entry number ' ~ (state.log | length)]"}}}
edges: [START -> add, {from: add, route: [{when: "state.log | length >= config.rounds", to: END}, {to: add}]}]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Arc::new(SqliteCheckpointer::open(&dir.path().join("r.db"), Default::default()).unwrap());
    let mut r = Run::new(json!({}));
    r.store = sqlite.clone();
    let out = r.go(
        &plan,
        RunRequest {
            recursion_limit: Some(1000),
            ..req(json!({}))
        },
    );
    let expected: Vec<String> = (0..600).map(|i| format!("entry number {i}")).collect();
    assert_eq!(out.state["log"], json!(expected));
    // Every checkpoint's state reads back whole, across the full values stored every 256 steps.
    let history = sqlite.history(&out.thread_id).unwrap();
    for cp in history
        .iter()
        .filter(|c| [1, 256, 257, 258, 512, 600].contains(&c.step))
    {
        let log = &sqlite.state(&out.thread_id, &cp.versions).unwrap()["log"];
        assert_eq!(log.as_array().unwrap().len() as i64, cp.step, "step {}", cp.step);
        assert_eq!(
            log[cp.step as usize - 1],
            json!(format!("entry number {}", cp.step - 1))
        );
    }
    // A fork copies the value resolved, so the new thread stands on its own.
    let at = history.iter().find(|c| c.step == 400).unwrap();
    sqlite.fork(&out.thread_id, &at.checkpoint_id, "branch").unwrap();
    sqlite.delete_thread(&out.thread_id).unwrap();
    let cp = sqlite.get_checkpoint("branch", None).unwrap().unwrap();
    assert_eq!(
        sqlite.state("branch", &cp.versions).unwrap()["log"]
            .as_array()
            .unwrap()
            .len(),
        400
    );
    // Storing the whole list at each of 600 versions would take about 600²/2 entries of ~20
    // bytes (3.6 MB); extensions take a few hundred kB, mostly the checkpoint rows.
    let stats = sqlite.stats().unwrap();
    assert!(stats.db_bytes < 1_000_000, "{} bytes", stats.db_bytes);
}

const BUDGETED: &str = r#"
models: {default: {provider: mock, model: m, pricing: {input: 1000000, output: 0}}}
state:
  n: {type: integer, default: 0}
  errors: {type: array, reducer: append, default: []}
nodes:
  ask:
    kind: llm
    prompt: {text: "round {{ state.n }}"}
    update: {n: "state.n + 1"}
    on_error: {to: report, update: {errors: "[{'class': error.class, 'message': error.message}]"}}
  report: {kind: set, update: {n: "state.n"}}
edges:
  - START -> ask
  - {from: ask, route: [{when: "state.n >= 10", to: report}, {to: ask}]}
  - report -> END
"#;

fn budgeted(limits: &str) -> Project {
    Project::new(&[("w.yaml", &format!("name: t\n{limits}{BUDGETED}"))])
}

#[test]
fn a_spent_turn_budget_hands_the_next_model_call_to_on_error() {
    // Each call costs 1.0 (one prompt token at a price of one million per million).
    let script = json!({"replies": {"ask": {"text": "ok", "usage": {"prompt_tokens": 1, "completion_tokens": 2}}}});
    for (limits, calls, why) in [
        (
            "limits: {max_llm_calls: 3}\n",
            3,
            "max_llm_calls of 3 is spent (3 made)",
        ),
        ("limits: {max_cost: 2.5}\n", 3, "max_cost of 2.5 is spent (3.0000 used)"),
        ("limits: {max_tokens: 4}\n", 2, "max_tokens of 4 is spent (6 used)"),
    ] {
        let p = budgeted(limits);
        let mut r = Run::new(script.clone());
        let out = r.go(&p.plan("w.yaml"), req(json!({})));
        assert_eq!(out.status, Status::Done, "{limits}");
        assert_eq!(out.state["n"], json!(calls), "{limits}");
        assert_eq!(out.state["errors"][0]["class"], "budget", "{limits}");
        let message = out.state["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(why), "{limits}: {message}");
        assert_eq!(
            out.usage.calls, calls as u64,
            "{limits}: no call is made past the budget"
        );
        // A budget error is never retried, whatever the policy.
        assert!(!r.events.iter().any(|e| matches!(e, Event::Retry { .. })));
    }
}

#[test]
fn a_node_budget_caps_that_node_and_a_new_turn_starts_afresh() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, properties: {q: {type: string}}}
state: {n: {type: integer, default: 0}}
nodes:
  ask:
    kind: llm
    prompt: {text: "round {{ state.n }}"}
    budget: {max_llm_calls: 2}
    retry: {max_attempts: 5, retry_on: [all]}
    update: {n: "state.n + 1"}
edges:
  - START -> ask
  - {from: ask, route: [{when: "state.n >= 10", to: END}, {to: ask}]}
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({"replies": {"ask": "ok"}}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Failed);
    let why = "the budget of `ask`: max_llm_calls of 2 is spent (2 made)";
    assert!(out.error.as_deref().unwrap().contains(why), "{:?}", out.error);
    assert_eq!(out.state["n"], json!(2));
    // Resuming continues the same turn: its budget stays spent.
    let again = r.go(&plan, resume(&out.thread_id, None));
    assert_eq!(again.status, Status::Failed);
    assert!(again.error.as_deref().unwrap().contains(why));
    assert_eq!(again.state["n"], json!(2));
}

#[test]
fn a_new_turn_has_a_fresh_budget() {
    let p = budgeted("limits: {max_llm_calls: 3}\n");
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({"replies": {"ask": "ok"}}));
    let first = r.go(&plan, req(json!({})));
    assert_eq!(first.state["n"], json!(3));
    let second = r.go(
        &plan,
        RunRequest {
            thread_id: Some(first.thread_id.clone()),
            ..req(json!({}))
        },
    );
    assert_eq!(second.status, Status::Done);
    assert_eq!(second.state["n"], json!(6));
    assert_eq!(second.state["errors"].as_array().unwrap().len(), 2);
}

/// The engine with `r`'s store and mock, for runs whose error is the point.
fn try_run(r: &Run, plan: &Arc<Plan>, req: RunRequest) -> Result<RunOutcome, runner::engine::EngineError> {
    let providers = Providers::for_models_in(plan.models(), Some(r.mock.clone()), true, &|_| None).unwrap();
    let engine = Engine::new(plan.clone(), r.store.clone(), providers, Events::none());
    tokio::runtime::Runtime::new().unwrap().block_on(engine.run(req))
}

fn answer(thread: &str, to: Option<&str>, value: Value) -> RunRequest {
    RunRequest {
        answer_to: to.map(str::to_string),
        ..resume(thread, Some(value))
    }
}

const TWO_GATES: &str = r#"
state: {log: {type: array, reducer: append, default: []}}
nodes:
  pa: {kind: interrupt, message: "a?", response: {type: string}, update: {log: "['a:' ~ output]"}}
  pb: {kind: interrupt, message: "b?", response: {type: string}, update: {log: "['b:' ~ output]"}}
  after: {kind: set, update: {log: "['after']"}}
edges: [START -> pa, START -> pb, pa -> after, pb -> after, after -> END]
"#;

#[test]
fn several_gates_in_one_step_are_all_reported_and_answered_one_at_a_time() {
    let p = Project::new(&[("w.yaml", &wf(TWO_GATES))]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    let thread = out.thread_id.clone();
    let ids: Vec<&str> = out.interrupts.iter().map(|i| i["task_id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [task(&thread, "pa", 1), task(&thread, "pb", 1)],
        "every pending gate, with its id: its task's"
    );
    let nodes: Vec<&str> = out.interrupts.iter().map(|i| i["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["pa", "pb"]);
    assert_eq!(out.interrupts[1]["payload"]["message"], "b?");

    // A bare answer is ambiguous: refused, listing the gates; nothing changes.
    let err = try_run(&r, &plan, resume(&thread, Some(json!("x")))).unwrap_err();
    assert!(
        matches!(&err, runner::engine::EngineError::WhichGate { pending, .. } if pending.len() == 2),
        "{err}"
    );
    assert!(
        err.to_string().contains("`pa`") && err.to_string().contains("`pb`"),
        "{err}"
    );
    // An address that names no pending gate is refused too.
    let err = try_run(&r, &plan, answer(&thread, Some("nope"), json!("x"))).unwrap_err();
    assert!(err.to_string().contains("no pending interrupt `nope`"), "{err}");

    // Answer the second gate first, by node: the thread still waits at the first.
    let out = r.go(&plan, answer(&thread, Some("pb"), json!("B")));
    assert_eq!(out.status, Status::Interrupted);
    assert_eq!(out.interrupts.len(), 1, "{:#?}", out.interrupts);
    assert_eq!(out.interrupts[0]["task_id"], task(&thread, "pa", 1));
    // The same gate again, by node or by id: already answered.
    let err = try_run(&r, &plan, answer(&thread, Some("pb"), json!("B2"))).unwrap_err();
    assert!(matches!(err, runner::engine::EngineError::AlreadyAnswered(_)), "{err}");
    let err = try_run(&r, &plan, answer(&thread, Some(&task(&thread, "pb", 1)), json!("B2"))).unwrap_err();
    assert!(matches!(err, runner::engine::EngineError::AlreadyAnswered(_)), "{err}");
    // Now a bare answer fits the only gate left, and the step completes.
    let out = r.go(&plan, resume(&thread, Some(json!("A"))));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["log"], json!(["a:A", "b:B", "after"]));
    // pb stopped once and finished once with its answer: the last resume took it as stored.
    assert_eq!(r.ran().iter().filter(|t| *t == "pb").count(), 2);
}

const GOTO_AND_GATE: &str = r#"
state: {path: {type: array, reducer: append, default: []}}
nodes:
  decide:
    kind: llm
    prompt: {text: "which?"}
    output: {format: json, schema: {type: object, required: [next], properties: {next: {enum: [left, right]}}}}
    update: {path: "['decide']"}
    goto:
      - {when: "output.next == 'left'", to: left}
      - {to: right}
  EXTRA
  left: {kind: set, update: {path: "['left']"}}
  right: {kind: set, update: {path: "['right']"}}
  gate: {kind: interrupt, response: {type: object}}
edges: [left -> END, right -> END, START -> decide, START -> gate, gate -> END EDGE]
"#;

#[test]
fn a_finished_tasks_successor_is_stored_by_name_and_survives_an_edit() {
    let v1 = wf(&GOTO_AND_GATE.replace("  EXTRA\n", "").replace(" EDGE", ""));
    // A node declared before `left` shifts every later node's index.
    let v2 = wf(&GOTO_AND_GATE
        .replace("EXTRA", "extra: {kind: set}")
        .replace(" EDGE", ", START -> extra, extra -> END"));
    let p = Project::new(&[("v1.yaml", &v1), ("v2.yaml", &v2)]);
    let mut r = Run::new(json!({"replies": {"decide": "{\"next\": \"right\"}"}}));
    let out = r.go(&p.plan("v1.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    // decide finished (its choice, `right`, stored); the gate waits. Resume on the edit.
    let out = r.go(&p.plan("v2.yaml"), resume(&out.thread_id, Some(json!({}))));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["path"], json!(["decide", "right"]));
}

#[test]
fn a_stored_successor_that_the_edit_removed_is_refused_unless_forced() {
    let v1 = wf(&GOTO_AND_GATE.replace("  EXTRA\n", "").replace(" EDGE", ""));
    let v3 = wf(&GOTO_AND_GATE
        .replace("  EXTRA\n", "")
        .replace(" EDGE", "")
        .replace(
            "      - {when: \"output.next == 'left'\", to: left}\n      - {to: right}",
            "      - {to: left}",
        )
        .replace("  right: {kind: set, update: {path: \"['right']\"}}\n", "")
        .replace("right -> END, ", ""));
    let p = Project::new(&[("v1.yaml", &v1), ("v3.yaml", &v3)]);
    let mut r = Run::new(json!({"replies": {"decide": "{\"next\": \"right\"}"}}));
    let out = r.go(&p.plan("v1.yaml"), req(json!({})));
    let plan3 = p.plan("v3.yaml");
    let err = try_run(&r, &plan3, resume(&out.thread_id, Some(json!({})))).unwrap_err();
    assert!(
        err.to_string().contains("`right`") && err.to_string().contains("--force"),
        "{err}"
    );
    let forced = try_run(
        &r,
        &plan3,
        RunRequest {
            force: true,
            ..resume(&out.thread_id, Some(json!({})))
        },
    )
    .unwrap();
    assert_eq!(forced.status, Status::Done);
    assert_eq!(forced.state["path"], json!(["decide"]));
}

/// A thread row without a checkpoint (written by a build killed between the two) starts from
/// its recorded input rather than "does not exist".
#[test]
fn a_thread_stored_without_a_checkpoint_runs_from_its_recorded_input() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, properties: {n: {type: integer}}}
state: {out: {type: integer, default: 0}}
nodes: {a: {kind: set, update: {out: "input.n * 2"}}}
edges: [START -> a, a -> END]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    r.store
        .create_thread(&runner::checkpoint::Thread {
            thread_id: "orphan".into(),
            workflow: "w.yaml".into(),
            plan_hash: plan.hash().to_string(),
            input: json!({"n": 21}),
            context: json!({}),
            config: json!({}),
            status: runner::checkpoint::ThreadStatus::Running,
            created_at: runner::clock::now(),
            updated_at: runner::clock::now(),
            forked_from: None,
        })
        .unwrap();
    let out = r.go(&plan, resume("orphan", None));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["out"], json!(42));
}

/// The parent killed as its subgraph started: the child's thread row exists, its checkpoint
/// does not. Resuming the parent completes.
#[test]
fn a_subgraph_child_cut_off_at_its_start_is_completed_by_the_parents_resume() {
    let child = r#"
name: child
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {topic: {type: string}}}
output: [summary]
state: {summary: {type: string, default: ""}}
nodes: {work: {kind: set, update: {summary: "'about ' ~ input.topic"}}}
edges: [START -> work, work -> END]
"#;
    let p = Project::new(&[
        ("child.yaml", child),
        (
            "w.yaml",
            &wf(r#"
state: {result: {type: string, default: ""}}
nodes:
  sub: {kind: subgraph, workflow: child.yaml, input: {topic: "'rust'"}, update: {result: output.summary}, interrupt_before: true}
edges: [START -> sub, sub -> END]
"#),
        ),
    ]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    let child_plan = p.plan("child.yaml");
    r.store
        .create_thread(&runner::checkpoint::Thread {
            thread_id: format!("{}/1/sub:1", out.thread_id),
            workflow: "child.yaml".into(),
            plan_hash: child_plan.hash().to_string(),
            input: json!({"topic": "rust"}),
            context: json!({}),
            config: json!({}),
            status: runner::checkpoint::ThreadStatus::Running,
            created_at: runner::clock::now(),
            updated_at: runner::clock::now(),
            forked_from: None,
        })
        .unwrap();
    let out = r.go(&plan, resume(&out.thread_id, None));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["result"], json!("about rust"));
}

fn foreign_claim(thread: &str, ttl: std::time::Duration) -> runner::checkpoint::LeaseClaim {
    runner::checkpoint::LeaseClaim {
        thread_id: thread.into(),
        owner: "someone-else".into(),
        pid: 1,
        host: "another-host".into(),
        ttl,
        replace: None,
    }
}

#[test]
fn a_thread_leased_by_another_run_is_refused_or_waited_for() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(
            "state: {n: {type: integer, reducer: sum, default: 0}}\nnodes: {a: {kind: set, update: {n: '1'}}}\nedges: [START -> a, a -> END]\n",
        ),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let held = r
        .store
        .acquire_lease(&foreign_claim("T", std::time::Duration::from_secs(60)))
        .unwrap();
    let err = try_run(
        &r,
        &plan,
        RunRequest {
            thread_id: Some("T".into()),
            ..req(json!({}))
        },
    )
    .unwrap_err();
    assert!(matches!(err, runner::engine::EngineError::Busy(_)), "{err}");
    assert!(
        err.to_string()
            .starts_with("thread T is running in process 1 on host another-host since "),
        "{err}"
    );
    assert_eq!(r.store.get_thread("T").unwrap(), None, "nothing was created");

    // With `wait`, the run starts once the holder lets go.
    let store = r.store.clone();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        store.release_lease(&held.fence()).unwrap();
    });
    let out = r.go(
        &plan,
        RunRequest {
            thread_id: Some("T".into()),
            lease: runner::engine::LeasePolicy::Take {
                ttl: std::time::Duration::from_secs(5),
                wait: true,
            },
            ..req(json!({}))
        },
    );
    releaser.join().unwrap();
    assert_eq!((out.status, &out.state["n"]), (Status::Done, &json!(1)));
    assert_eq!(r.store.lease("T").unwrap(), None, "released at the end of the run");
    // An expired lease is simply taken.
    r.store
        .acquire_lease(&foreign_claim("T", std::time::Duration::ZERO))
        .unwrap();
    let out = r.go(&plan, resume("T", None));
    assert_eq!(out.status, Status::Done);
}

/// One model call; the mock script decides how long it takes.
const ONE_SLOW_CALL: &str = r#"
state: {out: {type: string, default: ""}}
nodes: {slow: {kind: llm, prompt: {text: "slow"}, update: {out: output}}}
edges: [START -> slow, slow -> END]
"#;

#[test]
fn a_run_whose_lease_was_taken_over_writes_nothing_more() {
    let p = Project::new(&[("w.yaml", &wf(ONE_SLOW_CALL))]);
    let plan = p.plan("w.yaml");
    let r = Run::new(json!({"match": [{"contains": "slow", "reply": {"text": "late", "delay": 0.5}}]}));
    let store = r.store.clone();
    let thief = std::thread::spawn(move || {
        // Once the run holds the lease and has its first checkpoint, take the lease over.
        let holder = loop {
            if let Some(l) = store.lease("X").unwrap()
                && store.get_checkpoint("X", None).unwrap().is_some()
            {
                break l;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let mut claim = foreign_claim("X", std::time::Duration::from_secs(60));
        claim.replace = Some(holder.owner);
        store.acquire_lease(&claim).unwrap();
    });
    let err = try_run(
        &r,
        &plan,
        RunRequest {
            thread_id: Some("X".into()),
            ..req(json!({}))
        },
    )
    .unwrap_err();
    thief.join().unwrap();
    assert!(
        matches!(
            err,
            runner::engine::EngineError::Store(runner::checkpoint::CheckpointError::LeaseLost(_))
        ),
        "{err}"
    );
    assert_eq!(
        r.store.history("X").unwrap().len(),
        2,
        "the step's checkpoint was refused"
    );
    assert_eq!(r.store.lease("X").unwrap().unwrap().owner, "someone-else");
}

#[test]
fn a_stored_value_that_does_not_fit_its_schema_is_named_on_resume() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(
            "state: {n: {type: integer, default: 0}}\nnodes: {g: {kind: interrupt, response: {type: object}, update: {n: '1'}}}\nedges: [START -> g, g -> END]\n",
        ),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    // A hand-edited database: a newer checkpoint whose `n` is not an integer.
    let latest = r.store.get_checkpoint(&out.thread_id, None).unwrap().unwrap();
    let mut edited = latest.clone();
    edited.checkpoint_id = runner::checkpoint::new_id();
    edited.parent_id = Some(latest.checkpoint_id.clone());
    edited.step += 1;
    edited.versions.insert("n".into(), latest.versions["n"] + 1);
    r.store
        .put_checkpoint(&edited, &[("n".into(), latest.versions["n"] + 1, json!("seven"))])
        .unwrap();
    let err = try_run(&r, &plan, resume(&out.thread_id, None)).unwrap_err();
    assert!(
        err.to_string()
            .contains("the stored value of `n` does not match its schema"),
        "{err}"
    );
}

/// A server makes an engine per run: each finds the schemas the plan's earlier runs compiled
/// instead of compiling them again.
#[test]
fn the_runs_of_a_plan_compile_each_schema_once() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(
            "state: {n: {type: integer, maximum: 3}}\nnodes: {a: {kind: set, update: {n: '2'}}}\nedges: [START -> a, a -> END]\n",
        ),
    )]);
    let plan = p.plan("w.yaml");
    assert_eq!(
        plan.state_validators().built(),
        0,
        "nothing is compiled before a run checks a value"
    );
    for _ in 0..3 {
        let out = Run::new(json!({})).go(&plan, req(json!({})));
        assert_eq!(out.status, Status::Done);
        assert_eq!(out.state["n"], json!(2));
        assert_eq!(
            plan.state_validators().built(),
            1,
            "`n`'s schema, compiled by the first run"
        );
    }
}

#[test]
fn a_subgraph_waiting_at_several_gates_reports_each_and_takes_answers_addressed_inside_it() {
    let child = r#"
name: child
models: {default: {provider: mock, model: m}}
output: [log]
state: {log: {type: array, reducer: append, default: []}}
nodes:
  pa: {kind: interrupt, message: "a?", response: {type: string}, update: {log: "['a:' ~ output]"}}
  pb: {kind: interrupt, message: "b?", response: {type: string}, update: {log: "['b:' ~ output]"}}
edges: [START -> pa, START -> pb, pa -> END, pb -> END]
"#;
    let p = Project::new(&[
        ("child.yaml", child),
        (
            "w.yaml",
            &wf(r#"
state: {result: {type: array, default: []}}
nodes:
  sub: {kind: subgraph, workflow: child.yaml, update: {result: output.log}}
edges: [START -> sub, sub -> END]
"#),
        ),
    ]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    let thread = out.thread_id.clone();
    // Each gate is addressed through the subgraph's task: `<sub's task>/<the gate's task>`,
    // the gate's task being its own child thread's (`<thread>/<step>/<sub's task>`).
    let sub = task(&thread, "sub", 1);
    let child = format!("{thread}/1/{sub}");
    let expected = [
        format!("{sub}/{}", task(&child, "pa", 1)),
        format!("{sub}/{}", task(&child, "pb", 1)),
    ];
    let ids: Vec<&str> = out.interrupts.iter().map(|i| i["task_id"].as_str().unwrap()).collect();
    assert_eq!(ids, expected);
    assert_eq!(out.interrupts[1]["payload"]["subgraph_thread"], child.as_str());
    assert_eq!(out.interrupts[1]["payload"]["payload"]["message"], "b?");

    let err = try_run(&r, &plan, resume(&thread, Some(json!("x")))).unwrap_err();
    assert!(
        err.to_string().contains(&format!("`{}`", expected[0]))
            && err.to_string().contains(&format!("`{}`", expected[1])),
        "{err}"
    );
    // The child's schema applies to an answer addressed inside it.
    let err = try_run(&r, &plan, answer(&thread, Some("sub/pb"), json!(1))).unwrap_err();
    assert!(matches!(err, runner::engine::EngineError::BadAnswer(_)), "{err}");

    let out = r.go(&plan, answer(&thread, Some("sub/pb"), json!("B")));
    assert_eq!(out.status, Status::Interrupted, "{:?}", out.error);
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(out.interrupts[0]["payload"]["payload"]["message"], "a?");
    let out = r.go(&plan, resume(&thread, Some(json!("A"))));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["result"], json!(["a:A", "b:B"]));
}

#[test]
fn the_heartbeat_keeps_a_lease_held_past_its_time_to_live() {
    let p = Project::new(&[("w.yaml", &wf(ONE_SLOW_CALL))]);
    let plan = p.plan("w.yaml");
    // The step takes three times the lease's time to live.
    let mut r = Run::new(json!({"match": [{"contains": "slow", "reply": {"text": "late", "delay": 0.9}}]}));
    let store = r.store.clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished = done.clone();
    let claimant = std::thread::spawn(move || {
        let mut tries = 0;
        while !finished.load(std::sync::atomic::Ordering::SeqCst) {
            if store.lease("H").unwrap().is_some() {
                tries += 1;
                let taken = store.acquire_lease(&foreign_claim("H", std::time::Duration::from_secs(60)));
                assert!(taken.is_err(), "the lease lapsed while its run was alive");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        tries
    });
    let out = r.go(
        &plan,
        RunRequest {
            thread_id: Some("H".into()),
            lease: runner::engine::LeasePolicy::Take {
                ttl: std::time::Duration::from_millis(300),
                wait: false,
            },
            ..req(json!({}))
        },
    );
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let tries = claimant.join().unwrap();
    assert_eq!(out.status, Status::Done);
    assert!(tries >= 10, "the claimant tried throughout the run ({tries} tries)");
}

#[test]
fn a_predicate_that_cannot_be_evaluated_fails_the_run() {
    // One predicate errors (a number plus a string), one is undefined (a missing field). Read
    // by a route, each fails the step with its name, never reads as false (which would take
    // the default branch silently); an inline condition behaves the same.
    for (when, names) in [
        ("broken", "predicate `broken`"),
        ("missing", "predicate `missing`"),
        ("not broken", "predicate `broken`"),
        ("state.d.flag", "undefined"),
    ] {
        let p = Project::new(&[(
            "w.yaml",
            &wf(&format!(
                r#"
state:
  n: {{type: integer, default: 1}}
  s: {{type: string, default: "x"}}
  d: {{type: object, default: {{}}}}
  seen: {{type: array, reducer: append, default: []}}
predicates: {{broken: "state.n + state.s > 1", missing: "state.d.flag"}}
nodes:
  first: {{kind: set, update: {{seen: "'first'"}}}}
  fallback: {{kind: set, update: {{seen: "'fallback'"}}}}
edges:
  - START -> first
  - {{from: first, route: [{{when: "{when}", to: END}}, {{to: fallback}}]}}
  - fallback -> END
"#
            )),
        )]);
        let mut r = Run::new(json!({}));
        let out = r.go(&p.plan("w.yaml"), req(json!({})));
        assert_eq!(out.status, Status::Failed, "{when}: {:?}", out.state);
        let error = out.error.unwrap_or_default();
        assert!(error.contains(names), "{when}: {error}");
        assert!(!r.ran().contains(&"fallback".to_string()), "{when}: {:?}", r.ran());
    }
}

/// `run.remaining_steps` (LangGraph's `RemainingSteps`): how many supersteps the run may still
/// take after the current one, so a loop can wrap up instead of hitting the recursion limit.
/// START sees the whole limit; a node and its routes see what is left after their step.
#[test]
fn a_loop_wraps_up_before_the_recursion_limit_with_remaining_steps() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state:
  n: {type: integer, default: 0}
  seen: {type: array, reducer: append, default: []}
  at_start: {type: integer, default: -1}
  wrapped: {type: boolean, default: false}
nodes:
  first: {kind: set, update: {at_start: "run.remaining_steps"}}
  work: {kind: set, update: {n: "state.n + 1", seen: "[run.remaining_steps]"}}
  wrap_up: {kind: set, update: {wrapped: true}}
edges:
  - from: START
    route: [{when: "run.remaining_steps >= 3", to: first}, {to: END}]
  - first -> work
  - {from: work, route: [{when: "run.remaining_steps > 1", to: work}, {to: wrap_up}]}
  - wrap_up -> END
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(
        &plan,
        RunRequest {
            recursion_limit: Some(6),
            ..req(json!({}))
        },
    );
    // Steps 0..5: first (5 left after it), work ×4 (4, 3, 2, 1), wrap_up in the last one.
    assert_eq!((out.status, out.steps), (Status::Done, 6), "{:?}", out.error);
    assert_eq!(out.state["at_start"], json!(5));
    assert_eq!(out.state["seen"], json!([4, 3, 2, 1]));
    assert_eq!(out.state["wrapped"], json!(true));
    // A limit too small for the work: START's route sees it and ends at once.
    let out = r.go(
        &plan,
        RunRequest {
            recursion_limit: Some(2),
            ..req(json!({}))
        },
    );
    assert_eq!((out.status, out.state["n"].clone()), (Status::Done, json!(0)));
}

/// A state key declared without a default starts unset (null), whatever its type: a run of a
/// workflow with `said: {type: string}` and no default starts instead of refusing its own
/// first checkpoint.
#[test]
fn a_typed_key_without_a_default_starts_unset() {
    let p = Project::new(&[(
        "w.yaml",
        r#"
name: w
state:
  said: {type: string}
nodes:
  a: {kind: set, update: {said: "'hi'"}}
edges: [START -> a, a -> END]
"#,
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["said"], json!("hi"));
}

#[test]
fn each_entry_point_says_what_it_does_with_the_thread() {
    use runner::engine::{Answer, EngineError, Start};
    let p = Project::new(&[("w.yaml", &wf(TWO_GATES))]);
    let plan = p.plan("w.yaml");
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let engine = Engine::new(plan.clone(), store.clone(), Providers::default(), Events::none());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let start = || Start {
        thread_id: Some("t1".into()),
        workflow: "w.yaml".into(),
        ..Start::default()
    };
    // A thread that does not exist cannot be resumed, answered or given a new turn, and
    // none of these creates it.
    let err = rt.block_on(engine.resume("t1")).unwrap_err();
    assert!(matches!(err, EngineError::NoThread(ref t) if t == "t1"), "{err}");
    let to_a = || Answer {
        to: Some("pa".into()),
        value: json!("yes"),
    };
    assert!(matches!(
        rt.block_on(engine.answer("t1", to_a())),
        Err(EngineError::NoThread(_))
    ));
    assert!(matches!(
        rt.block_on(engine.new_turn("t1", json!({}))),
        Err(EngineError::NoThread(_))
    ));
    assert!(store.get_thread("t1").unwrap().is_none());
    let out = rt.block_on(engine.start(start())).unwrap();
    assert_eq!(out.status, Status::Interrupted);
    assert_eq!(out.interrupts.len(), 2);
    // Starting it again is refused: the thread exists, and stays as it was.
    let err = rt.block_on(engine.start(start())).unwrap_err();
    assert!(matches!(err, EngineError::Exists(ref t) if t == "t1"), "{err}");
    assert_eq!(
        err.to_string(),
        "thread `t1` exists already: continue it, answer it, or give it a new turn"
    );
    // Resuming goes on to the same gates; answering takes one of them.
    let out = rt.block_on(engine.resume("t1")).unwrap();
    assert_eq!(out.status, Status::Interrupted);
    let out = rt.block_on(engine.answer("t1", to_a())).unwrap();
    assert_eq!(out.interrupts.len(), 1);
    let out = rt
        .block_on(engine.answer(
            "t1",
            Answer {
                to: None,
                value: json!("no"),
            },
        ))
        .unwrap();
    assert_eq!(out.status, Status::Done);
    assert_eq!(out.state["log"], json!(["a:yes", "b:no", "after"]));
    // A new turn runs START again on the thread's state.
    let out = rt.block_on(engine.new_turn("t1", json!({}))).unwrap();
    assert_eq!(out.status, Status::Interrupted);
    assert_eq!(out.state["log"], json!(["a:yes", "b:no", "after"]));
    // start_or_continue starts a thread that does not exist (dropping an answer meant for
    // it) and continues one that does, with the answer.
    let fresh = Start {
        thread_id: Some("t2".into()),
        ..start()
    };
    let out = rt
        .block_on(engine.start_or_continue(fresh.clone(), Some(to_a())))
        .unwrap();
    assert_eq!(out.interrupts.len(), 2, "the answer was not taken by a new thread");
    let out = rt.block_on(engine.start_or_continue(fresh, Some(to_a()))).unwrap();
    assert_eq!(out.interrupts.len(), 1);
    assert_eq!(out.interrupts[0]["node"], "pb");
}

const QUESTIONS: &str = r#"
state:
  brief: {type: object, default: {}}
nodes:
  ask:
    kind: interrupt
    questions:
      - {id: audience, message: "Who is it for?", response: {type: string, enum: [experts, everyone]}}
      - {id: length, message: "How many pages for {{ state.brief }}?", response: {type: integer, minimum: 1}}
    update: {brief: output}
edges: [START -> ask, ask -> END]
"#;

/// A gate asks its questions one at a time (LangGraph's several `interrupt()` calls in one
/// node): each answer is checked against its own question's schema, the next question is asked
/// only once the last is answered, and `output` holds every answer by question id. The answers
/// given so far are stored: another engine on the same store carries on where the first was.
#[test]
fn a_gate_asks_its_questions_one_at_a_time() {
    let p = Project::new(&[("w.yaml", &wf(QUESTIONS))]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    let asked = &out.interrupt.as_ref().unwrap()["payload"];
    assert_eq!(asked["message"], "Who is it for?");
    assert_eq!(
        (asked["question"].clone(), asked["questions"].clone()),
        (json!("audience"), json!(2))
    );
    let thread = out.thread_id.clone();
    // An answer that fits the second question but not the first is refused.
    let err = try_run(&r, &plan, resume(&thread, Some(json!(3)))).unwrap_err();
    assert!(err.to_string().contains("not of type \"string\""), "{err}");
    let out = r.go(&plan, resume(&thread, Some(json!("experts"))));
    assert_eq!(out.status, Status::Interrupted, "{:?}", out.error);
    let asked = &out.interrupt.as_ref().unwrap()["payload"];
    assert_eq!(asked["question"], "length");
    assert_eq!(asked["questions_answered"], 1);
    // Now the first question's answer no longer fits: the second question's schema applies.
    let err = try_run(&r, &plan, resume(&thread, Some(json!("everyone")))).unwrap_err();
    assert!(err.to_string().contains("integer"), "{err}");
    // A fresh engine on the same store finishes the gate with both answers.
    let providers = Providers::for_models_in(plan.models(), Some(r.mock.clone()), true, &|_| None).unwrap();
    let engine = Engine::new(plan.clone(), r.store.clone(), providers, Events::none());
    let out = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(engine.run(resume(&thread, Some(json!(12)))))
        .unwrap();
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["brief"], json!({"audience": "experts", "length": 12}));
}

/// LangGraph's deferred-node example: `d` is reached by a short branch (`c`) and a long one
/// (`b -> b_2`). Deferred, it waits until nothing else is scheduled and runs once, after both;
/// not deferred, it runs twice, once per branch.
#[test]
fn a_deferred_node_waits_for_every_branch_and_runs_once() {
    let graph = |defer: bool| {
        wf(&format!(
            r#"
state: {{log: {{type: array, reducer: append, default: []}}}}
nodes:
  a: {{kind: set, update: {{log: "['a']"}}}}
  b: {{kind: set, update: {{log: "['b']"}}}}
  b_2: {{kind: set, update: {{log: "['b_2']"}}}}
  c: {{kind: set, update: {{log: "['c']"}}}}
  d: {{kind: set, defer: {defer}, update: {{log: "['d after ' ~ (state.log | join(','))]"}}}}
edges: [START -> a, a -> b, a -> c, b -> b_2, b_2 -> d, c -> d, d -> END]
"#
        ))
    };
    let p = Project::new(&[("deferred.yaml", &graph(true)), ("eager.yaml", &graph(false))]);
    let out = Run::new(json!({})).go(&p.plan("deferred.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["log"], json!(["a", "b", "c", "b_2", "d after a,b,c,b_2"]));
    let out = Run::new(json!({})).go(&p.plan("eager.yaml"), req(json!({})));
    assert_eq!(
        out.state["log"],
        json!(["a", "b", "c", "b_2", "d after a,b,c", "d after a,b,c,b_2,d after a,b,c"])
    );
}

/// A deferred node started from START beside other work waits for it too, and the wait is
/// stored: a thread stopped at a gate in between still runs the deferred node once after.
#[test]
fn a_deferred_node_waits_across_a_gate() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
state: {log: {type: array, reducer: append, default: []}}
nodes:
  ask: {kind: interrupt, message: "go?", response: {type: string}, update: {log: "['ask']"}}
  wrap: {kind: set, defer: true, update: {log: "['wrap']"}}
edges: [START -> ask, START -> wrap, ask -> END, wrap -> END]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let out = r.go(&plan, req(json!({})));
    assert_eq!(out.status, Status::Interrupted);
    assert_eq!(out.state["log"], json!([]));
    let out = r.go(&plan, resume(&out.thread_id, Some(json!("yes"))));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["log"], json!(["ask", "wrap"]));
}

/// The tool loop closes in YAML: the model's tool calls are kept in the history through
/// `add_messages`, a tool's result answers its call by id, and the model is called again with
/// the whole exchange until it answers without calls.
#[test]
fn a_tool_calling_loop_keeps_calls_and_results_in_the_history() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, properties: {q: {type: string}}}
state:
  messages: {type: array, reducer: add_messages, default: []}
nodes:
  start: {kind: set, update: {messages: "[{'role': 'user', 'content': input.q}]"}}
  agent:
    kind: llm
    prompt: {text: "Go on."}
    history: {from: state.messages}
    options: {tools: [{type: function, function: {name: lookup, parameters: {type: object}}}]}
    update:
      messages: "[{'role': 'assistant', 'content': output.content, 'tool_calls': output.tool_calls}]"
    goto:
      - {when: "output.tool_calls", to: tools}
      - {to: END}
  tools:
    kind: set
    update:
      messages: >-
        [{'role': 'tool', 'tool_call_id': (state.messages | last).tool_calls[0].id,
          'name': (state.messages | last).tool_calls[0].function.name, 'content': 'found it'}]
edges: [START -> start, start -> agent, tools -> agent]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({"replies": {"agent": [
        {"tool_calls": [{"name": "lookup", "args": {"q": "rust"}}]},
        "It is a language."
    ]}}));
    let out = r.go(&plan, req(json!({"q": "what is rust?"})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let messages = out.state["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(messages[1]["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        messages[1]["tool_calls"][0]["function"]["arguments"],
        "{\"q\":\"rust\"}"
    );
    assert_eq!(messages[2]["tool_call_id"], "call_1");
    assert_eq!(messages[3]["content"], "It is a language.");
    assert_eq!(r.mock.calls()["agent"], 2);
}

#[test]
fn overwrite_bypasses_the_reducer_and_remove_all_messages_empties_the_history() {
    let body = |b_log: &str| {
        wf(&format!(
            r#"
state:
  log: {{type: array, reducer: append, default: [old]}}
  n: {{type: integer, reducer: sum, default: 5}}
  messages: {{type: array, reducer: add_messages, default: []}}
nodes:
  seed: {{kind: set, update: {{messages: "['a', 'b']"}}}}
  a: {{kind: set, update: {{log: "overwrite(['fresh'])", n: "overwrite(1)"}}}}
  b: {{kind: set, update: {{log: "{b_log}", n: "2"}}}}
  trim: {{kind: set, update: {{messages: "[remove_all_messages(), 'kept']"}}}}
edges:
  - START -> seed
  - {{from: seed, to: [a, b]}}
  - {{from: [a, b], to: trim}}
  - trim -> END
"#
        ))
    };
    let p = Project::new(&[
        ("w.yaml", &body("['dropped']")),
        ("two.yaml", &body("overwrite(['two'])")),
    ]);
    let mut r = Run::new(json!({}));
    let out = r.go(&p.plan("w.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    // The overwrite wins over the step's other writes of the key, as LangGraph's does.
    assert_eq!(out.state["log"], json!(["fresh"]));
    assert_eq!(out.state["n"], json!(1));
    assert_eq!(
        out.state["messages"],
        json!([{"role": "user", "content": "kept", "id": msg(&task(&out.thread_id, "trim", 3), Some(1))}])
    );
    // What was stored reads back the same (an overwritten value is no extension of the old).
    let cp = r.store.get_checkpoint(&out.thread_id, None).unwrap().unwrap();
    let stored = r.store.state(&out.thread_id, &cp.versions).unwrap();
    assert_eq!(stored["log"], json!(["fresh"]));
    assert_eq!(stored["messages"], out.state["messages"]);
    // Two overwrites of one key in one step: neither can win, and the step fails.
    let out = r.go(&p.plan("two.yaml"), req(json!({})));
    assert_eq!(out.status, Status::Failed);
    let err = out.error.unwrap();
    assert!(err.contains("`log`") && err.contains("overwrite"), "{err}");
}

#[test]
fn input_feeds_state_keys_through_their_reducers_at_start_and_each_turn() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, required: [question], properties: {question: {type: string}, tags: {type: array}}}
state:
  messages: {type: array, reducer: add_messages, default: [], from_input: question}
  tags: {type: array, reducer: union, default: [base], from_input: true}
  seen: {type: integer, default: 0}
nodes:
  reply: {kind: set, update: {messages: "[{'role': 'assistant', 'content': 'saw ' ~ (state.messages | length)}]", seen: "state.tags | length"}}
edges: [START -> reply, reply -> END]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let first = r.go(&plan, req(json!({"question": "hi", "tags": ["a"]})));
    assert_eq!(first.status, Status::Done, "{:?}", first.error);
    // The first node already sees the question in the history: no node copied it there. The
    // question was written by the turn's `__start__` task, and has an id of that task's.
    let thread = first.thread_id.clone();
    let starts = start_tasks(&r.store, &thread);
    assert_eq!(starts.len(), 1, "one turn, one input checkpoint");
    assert_eq!(
        first.state["messages"],
        json!([
            {"role": "user", "content": "hi", "id": msg(&starts[0], Some(1))},
            {"role": "assistant", "content": "saw 1", "id": msg(&task(&thread, "reply", 1), None)}
        ])
    );
    assert_eq!(first.state["tags"], json!(["base", "a"]));
    assert_eq!(first.state["seen"], json!(2));
    // A new turn appends its question to the history rather than replacing it; an input
    // without a fed field writes nothing to that key.
    let second = r.go(
        &plan,
        RunRequest {
            thread_id: Some(first.thread_id.clone()),
            ..req(json!({"question": "again"}))
        },
    );
    assert_eq!(second.status, Status::Done, "{:?}", second.error);
    let contents: Vec<&str> = second.state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["hi", "saw 1", "again", "saw 3"]);
    // Steps go on across turns, and so do the ids of the messages each step's writer adds.
    let ids: Vec<&str> = second.state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    let starts = start_tasks(&r.store, &thread);
    assert_eq!(starts.len(), 2, "two turns, two input checkpoints");
    assert_ne!(starts[0], starts[1], "each turn's input has a writer of its own");
    assert_eq!(
        ids,
        [
            msg(&starts[0], Some(1)),
            msg(&task(&thread, "reply", 1), None),
            msg(&starts[1], Some(1)),
            msg(&task(&thread, "reply", 4), None)
        ]
    );
    assert_eq!(second.state["tags"], json!(["base", "a"]));
    // The turn's checkpoint stored the fed value: it reads back from the store.
    let cp = r.store.get_checkpoint(&first.thread_id, None).unwrap().unwrap();
    let stored = r.store.state(&first.thread_id, &cp.versions).unwrap();
    assert_eq!(stored["messages"], second.state["messages"]);
}

#[test]
fn a_state_edit_as_a_node_goes_through_the_reducers_and_continues_from_its_edges() {
    let p = Project::new(&[(
        "w.yaml",
        &wf(r#"
input: {type: object, properties: {q: {type: string}}}
state:
  messages: {type: array, reducer: add_messages, default: [], from_input: q}
  log: {type: array, reducer: append, default: []}
nodes:
  human: {kind: set, update: {log: "['human']"}}
  agent: {kind: set, update: {messages: "[{'role': 'assistant', 'content': 'reply to ' ~ state.messages[-1].content}]", log: "['agent']"}}
edges: [START -> human -> agent -> END]
"#),
    )]);
    let plan = p.plan("w.yaml");
    let mut r = Run::new(json!({}));
    let first = r.go(&plan, req(json!({"q": "hi"})));
    assert_eq!(first.status, Status::Done, "{:?}", first.error);
    let engine = Engine::new(plan.clone(), r.store.clone(), Providers::default(), Events::none());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let thread = first.thread_id.clone();
    let before = r.store.get_checkpoint(&thread, None).unwrap().unwrap();
    // As `human`: the message is appended by add_messages (not replacing the history), and
    // the thread goes on from human's edge, to `agent`.
    let edited = rt
        .block_on(engine.update_state(&thread, vec![("messages".into(), json!("more please"))], Some("human")))
        .unwrap();
    assert_eq!(edited.step, before.step + 1);
    assert_eq!(edited.ran, ["human"]);
    assert_eq!(
        edited.next.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(),
        ["agent"]
    );
    // The done thread has work again.
    let status = r.store.get_thread(&thread).unwrap().unwrap().status;
    assert_eq!(status, runner::checkpoint::ThreadStatus::Running);
    let out = r.go(&plan, resume(&thread, None));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let contents: Vec<&str> = out.state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["hi", "reply to hi", "more please", "reply to more please"]);
    // The edit stood for `human`: only `agent` ran again.
    assert_eq!(out.state["log"], json!(["human", "agent", "agent"]));
    // Without a node the values replace outright, and nothing new is scheduled.
    let replaced = rt
        .block_on(engine.update_state(&thread, vec![("log".into(), json!(["reset"]))], None))
        .unwrap();
    assert!(replaced.next.is_empty());
    let state = r.store.state(&thread, &replaced.versions).unwrap();
    assert_eq!(state["log"], json!(["reset"]));
    // Unknown nodes and keys, and values that do not fit, are refused with the thread unchanged.
    let err = rt
        .block_on(engine.update_state(&thread, vec![("log".into(), json!(["x"]))], Some("agnet")))
        .unwrap_err();
    assert!(
        err.to_string().contains("no node `agnet` (did you mean `agent`?)"),
        "{err}"
    );
    let err = rt
        .block_on(engine.update_state(&thread, vec![("logs".into(), json!(["x"]))], Some("agent")))
        .unwrap_err();
    assert!(err.to_string().contains("no key `logs` (did you mean `log`?)"), "{err}");
    let err = rt
        .block_on(engine.update_state(&thread, vec![("log".into(), json!(3))], None))
        .unwrap_err();
    assert!(err.to_string().contains("does not match its schema"), "{err}");
    let latest = r.store.get_checkpoint(&thread, None).unwrap().unwrap();
    assert_eq!(latest.checkpoint_id, replaced.checkpoint_id);
}

/// The journal tests' workflow: two `set` nodes in a row.
const TWO_SETS: &str = "name: two\nstate: {a: {type: string, default: \"\"}}\nnodes:\n  one: {kind: set, update: {a: \"'x'\"}}\n  two: {kind: set, update: {a: \"state.a ~ 'y'\"}}\nedges: [START -> one -> two -> END]\n";

/// Runs `yaml` once on thread `t` of `store`, with `{}` as input, under `lease`, its events sent
/// to the receiver returned and, when given, recorded in `journal` (whose commits the run
/// makes). The run must end `done`.
fn run_journaled(
    yaml: &str,
    store: &Arc<dyn Checkpointer>,
    journal: Option<Arc<dyn runner::engine::events::Journal>>,
    lease: runner::engine::LeasePolicy,
) -> (RunOutcome, runner::engine::events::Receiver) {
    let project = Project::new(&[("w.yaml", yaml)]);
    let plan = project.plan("w.yaml");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (events, rx) = Events::channel();
    let events = match journal {
        Some(j) => events.journaled(j),
        None => events,
    };
    let providers = Providers::for_models_in(plan.models(), None, true, &|_| None).unwrap();
    let engine = Engine::new(plan, store.clone(), providers, events);
    let out = rt
        .block_on(engine.run(RunRequest {
            thread_id: Some("t".into()),
            input: Some(json!({})),
            workflow: "w.yaml".into(),
            lease,
            ..RunRequest::default()
        }))
        .unwrap();
    assert_eq!(out.status, Status::Done);
    (out, rx)
}

/// A run whose events are kept with its commits (a worker's, on a shared database) tells each
/// step's checkpoint in its `step_end`, as stored: a reader on another process has it without
/// reading it back. Without a journal (`--stream jsonl`, a run's own readers) `step_end` only
/// names it.
#[test]
fn a_journaled_runs_step_end_carries_its_checkpoint_as_stored() {
    use runner::checkpoint::{CheckpointError, Put};
    use runner::engine::events::{Envelope, Journal};

    /// Commits as the store does, keeping no events.
    struct Kept(Arc<dyn Checkpointer>);
    impl Journal for Kept {
        fn record(&self, _: &Envelope) {}
        fn commit(&self, puts: Vec<Put>, _: bool, _: &[Envelope]) -> Result<bool, CheckpointError> {
            self.0.put_batch(puts)?;
            Ok(true)
        }
    }

    for journaled in [true, false] {
        let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
        let journal = journaled.then(|| Arc::new(Kept(store.clone())) as Arc<dyn Journal>);
        let (_, mut rx) = run_journaled(TWO_SETS, &store, journal, Default::default());
        let mut ends = 0;
        while let Ok(e) = rx.try_recv() {
            if let Event::StepEnd {
                checkpoint_id,
                checkpoint,
                ..
            } = e.event
            {
                ends += 1;
                match checkpoint {
                    Some(cp) => {
                        assert!(journaled, "a run of its own process names its checkpoint only");
                        assert_eq!(*cp, store.get_checkpoint("t", Some(&checkpoint_id)).unwrap().unwrap());
                    }
                    None => assert!(!journaled, "a journaled step_end carries its checkpoint"),
                }
            }
        }
        assert_eq!(ends, 2);
    }
}

/// The step after which nothing runs ends the run: it writes the thread's `done` status with
/// its checkpoint, in one commit (a journaled run's step commits go through its journal; that
/// the run's end then sends nothing more is counted on PostgreSQL in `pg_ops`).
#[test]
fn a_finished_runs_status_goes_with_its_last_checkpoint() {
    use runner::checkpoint::{CheckpointError, Put, ThreadStatus};
    use runner::engine::events::{Envelope, Journal};
    use std::sync::Mutex;

    /// Commits as the store does, noting each commit's statuses and whether it had a checkpoint.
    struct Noted(Arc<dyn Checkpointer>, Mutex<Vec<(bool, Vec<ThreadStatus>)>>);
    impl Journal for Noted {
        fn record(&self, _: &Envelope) {}
        fn commit(&self, puts: Vec<Put>, _: bool, _: &[Envelope]) -> Result<bool, CheckpointError> {
            let checkpoint = puts.iter().any(|p| matches!(p, Put::Checkpoint(..)));
            let statuses = puts
                .iter()
                .filter_map(|p| match p {
                    Put::Status { status, .. } => Some(*status),
                    _ => None,
                })
                .collect();
            self.1.lock().unwrap().push((checkpoint, statuses));
            self.0.put_batch(puts)?;
            Ok(true)
        }
    }

    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let noted = Arc::new(Noted(store.clone(), Mutex::new(Vec::new())));
    run_journaled(
        TWO_SETS,
        &store,
        Some(noted.clone() as Arc<dyn Journal>),
        Default::default(),
    );
    assert_eq!(store.get_thread("t").unwrap().unwrap().status, ThreadStatus::Done);
    let commits = noted.1.lock().unwrap().clone();
    // The opening (with `running`), step one, step two with `done`: nothing after it.
    assert_eq!(
        commits,
        vec![
            (true, vec![ThreadStatus::Running]),
            (true, vec![]),
            (true, vec![ThreadStatus::Done]),
        ]
    );
}

/// A run claimed from a queue (its input kept in its queued row) runs its first step while the
/// commit opening its turn is under way, and commits that step only after it; the step's
/// events reach the log after the turn's, never before. A run under a lease of its own waits
/// for the opening first.
#[test]
fn a_claimed_runs_first_step_runs_while_its_turn_commits() {
    use runner::checkpoint::{CheckpointError, LeaseClaim, Put};
    use runner::engine::LeasePolicy;
    use runner::engine::events::{Envelope, Journal};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Commits as the store does, the first commit slowly; notes the nodes' starts and the
    /// commits' ends, in order.
    struct Slow {
        store: Arc<dyn Checkpointer>,
        first: AtomicBool,
        seen: Mutex<Vec<String>>,
    }
    impl Journal for Slow {
        fn record(&self, e: &Envelope) {
            if let Event::NodeStart { node, .. } = &e.event {
                self.seen.lock().unwrap().push(format!("start {node}"));
            }
        }
        fn commit(&self, puts: Vec<Put>, _: bool, _: &[Envelope]) -> Result<bool, CheckpointError> {
            if self.first.swap(false, Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            let checkpoints = puts.iter().filter(|p| matches!(p, Put::Checkpoint(..))).count();
            self.store.put_batch(puts)?;
            self.seen.lock().unwrap().push(format!("commit {checkpoints}"));
            Ok(true)
        }
    }

    for claimed in [true, false] {
        let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
        let journal = Arc::new(Slow {
            store: store.clone(),
            first: AtomicBool::new(true),
            seen: Mutex::new(Vec::new()),
        });
        let lease = if claimed {
            let lease = store
                .acquire_lease(&LeaseClaim {
                    thread_id: "t".into(),
                    owner: "claim".into(),
                    pid: std::process::id(),
                    host: "here".into(),
                    ttl: std::time::Duration::from_secs(30),
                    replace: None,
                })
                .unwrap();
            LeasePolicy::Claimed {
                lease: Box::new(lease),
                ttl: std::time::Duration::from_secs(30),
            }
        } else {
            LeasePolicy::default()
        };
        let one = "name: one\nstate: {a: {type: string, default: \"\"}}\nnodes:\n  one: {kind: set, update: {a: \"'x'\"}}\nedges: [START -> one -> END]\n";
        let (out, _) = run_journaled(one, &store, Some(journal.clone() as Arc<dyn Journal>), lease);
        assert_eq!(out.state["a"], json!("x"));
        let seen = journal.seen.lock().unwrap().clone();
        // The turn (its checkpoints before and after the input, committed slowly), then the
        // step's: claimed, the step starts before the turn's commit ends.
        let expected = if claimed {
            ["start one", "commit 2", "commit 1"]
        } else {
            ["commit 2", "start one", "commit 1"]
        };
        assert_eq!(seen, expected, "claimed: {claimed}");
    }
}
