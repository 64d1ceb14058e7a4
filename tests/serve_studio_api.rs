//! What the Studio page asks of the server, through the real binary on 127.0.0.1 with plain
//! HTTP (the page is a client like any other): LangGraph's graph drawing with `xray` and
//! runner's node metadata; the `events` stream mode (chains, model calls with their tokens and
//! usage, tool calls); a run's trace and a thread's usage, kept across a restart and for runs
//! executed by a `runner worker` on PostgreSQL; `GET /runner/workflows`; and `runner dev`,
//! which reloads its folder as its files change.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use super::serve::{Server, call, client, parse, spawn};
use super::serve_shared::Worker;
use super::support::{fake_web, postgres};

/// A parent whose subgraph has a subgraph of its own, with a route, a fan-out, a join, a gate
/// and a retry policy.
const PARENT: &str = r#"
name: parent
description: A workflow drawn for Studio.
state:
  items: {type: array, default: [a, b]}
  seen: {type: array, reducer: append, default: []}
  done: {type: boolean, default: false}
predicates:
  nothing_left: "state.items | length == 0"
nodes:
  plan: {kind: set, update: {done: "false"}, retry: {max_attempts: 4, retry_on: [network]}}
  work: {kind: set, update: {seen: "[item]"}}
  left: {kind: set, update: {seen: "['left']"}}
  right: {kind: set, update: {seen: "['right']"}}
  both: {kind: set, update: {seen: "['both']"}}
  inner: {kind: subgraph, workflow: parts/middle.yaml, update: {done: output.done}}
  ask: {kind: interrupt, message: "ok?", response: {type: string}}
edges:
  - START -> plan
  - from: plan
    route:
      - {when: nothing_left, to: ask}
      - {to: [left, right]}
  - {from: plan, send: {to: work, foreach: state.items, as: item}}
  - {from: [left, right], to: both}
  - both -> inner -> ask -> END
  - work -> END
"#;

const MIDDLE: &str = r#"
name: middle
state:
  done: {type: boolean, default: false}
nodes:
  first: {kind: set, update: {done: "false"}}
  deep: {kind: subgraph, workflow: leaf.yaml, update: {done: output.done}}
edges: [START -> first -> deep -> END]
"#;

const LEAF: &str = r#"
name: leaf
state:
  done: {type: boolean, default: false}
nodes:
  one: {kind: set, update: {done: "true"}}
  two: {kind: set, update: {done: "true"}}
edges: [START -> one -> two -> END]
"#;

/// A model turn that calls a tool (answered by a cheaper model), then an `http` request and a
/// large write: every kind of span a trace has.
const TRACED: &str = r#"
name: traced
models:
  default: {provider: mock, model: m-large, pricing: {input: 2, output: 10}}
  small: {provider: mock, model: m-small, pricing: {input: 1, output: 1}}
input: {type: object, properties: {question: {type: string}, url: {type: string}}}
state:
  question: {type: string, from_input: true}
  url: {type: string, from_input: true}
  messages: {type: array, reducer: add_messages, default: []}
  fetched: {type: object}
  big: {type: string}
tools:
  define:
    description: Define a word.
    args: {type: object, required: [word], properties: {word: {type: string}}}
    run: {kind: llm, model: small, prompt: {text: "Define {{ args.word }}"}}
nodes:
  ask:
    kind: llm
    stream: true
    prompt: {text: "{{ state.question }}"}
    tools: [define]
    retry: {max_attempts: 2, initial_interval: 0.01, jitter: false, retry_on: [rate_limit]}
    update: {messages: "[{'role': 'assistant', 'content': output.content, 'tool_calls': output.tool_calls}]"}
  tools: {kind: tools, update: {messages: output}}
  fetch: {kind: http, url: "{{ state.url }}", update: {fetched: output.body}}
  pad: {kind: set, update: {big: "'x' * 10000"}}
edges: [START -> ask -> tools -> fetch -> pad -> END]
"#;

const MOCK: &str = r#"
replies:
  ask:
    - {error: rate_limit, message: "slow down", retry_after: 0.01}
    - {text: "Let me look", chunks: ["Let me", " look"], tool_calls: [{name: define, args: {word: cop}, id: call_1}],
       usage: {prompt_tokens: 120, completion_tokens: 8}}
  define: {text: "cop: a police officer", usage: {prompt_tokens: 10, completion_tokens: 5}}
"#;

/// A folder of workflows for the tests, the mock script beside it.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let wf = dir.path().join("workflows");
    std::fs::create_dir_all(wf.join("parts")).unwrap();
    std::fs::write(wf.join("parent.yaml"), PARENT).unwrap();
    std::fs::write(wf.join("parts/middle.yaml"), MIDDLE).unwrap();
    std::fs::write(wf.join("parts/leaf.yaml"), LEAF).unwrap();
    std::fs::write(wf.join("traced.yaml"), TRACED).unwrap();
    std::fs::write(dir.path().join("mock.yaml"), MOCK).unwrap();
    dir
}

fn serve_project(dir: &Path, args: &[&str]) -> Server {
    let mut all = vec!["--allow-net", "127.0.0.1"];
    all.extend(args);
    let (child, base, _) = spawn(dir, &dir.join("workflows"), &dir.join("mock.yaml"), &all, &[]);
    Server { child, base, dir: None }
}

fn ids(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect()
}

fn edge<'a>(graph: &'a Value, source: &str, target: &str) -> &'a Value {
    graph["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["source"] == source && e["target"] == target)
        .unwrap_or_else(|| panic!("no edge {source} -> {target} in {graph}"))
}

/// `GET /assistants/{id}/graph`: LangGraph's drawing, with runner's metadata on every node and
/// edge kinds and conditions; `xray` expands subgraphs as LangGraph does, to the depth asked.
#[tokio::test(flavor = "multi_thread")]
async fn the_graph_is_drawn_as_langgraph_draws_it_with_subgraphs_expanded_by_xray() {
    let dir = project();
    let s = serve_project(dir.path(), &[]);
    let (status, _, flat) = call(&s, Method::GET, "/assistants/parent/graph", None).await;
    assert_eq!(status, 200, "{flat}");
    assert_eq!(
        ids(&flat, "nodes"),
        [
            "__start__",
            "plan",
            "work",
            "left",
            "right",
            "both",
            "inner",
            "ask",
            "__end__"
        ]
    );
    let node = |g: &Value, id: &str| -> Value {
        g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no node {id} in {g}"))
    };
    assert_eq!(
        node(&flat, "__start__"),
        json!({"id": "__start__", "type": "runnable", "data": {"name": "__start__"}})
    );
    assert_eq!(node(&flat, "__end__"), json!({"id": "__end__"}));
    assert_eq!(
        node(&flat, "plan")["data"],
        json!({"id": ["runner", "set"], "name": "plan"})
    );
    let plan = node(&flat, "plan")["metadata"].clone();
    assert_eq!((&plan["kind"], &plan["gate"]), (&json!("set"), &json!(false)), "{plan}");
    assert_eq!(plan["retry"]["max_attempts"], 4, "{plan}");
    assert_eq!(plan["retry"]["retry_on"], json!(["network"]), "{plan}");
    assert_eq!(node(&flat, "ask")["metadata"]["gate"], true);
    assert_eq!(node(&flat, "work")["metadata"]["fan_out"], true);
    assert_eq!(node(&flat, "both")["metadata"]["join"], json!(["left", "right"]));
    assert_eq!(node(&flat, "inner")["metadata"]["subgraph"], "middle");
    let route = edge(&flat, "plan", "ask");
    assert_eq!(
        (&route["kind"], &route["conditional"], &route["data"]),
        (&json!("route"), &json!(true), &json!("nothing_left"))
    );
    // The default clause has no condition to show.
    assert!(edge(&flat, "plan", "left")["data"].is_null());
    assert_eq!(edge(&flat, "plan", "work")["kind"], "fanout");
    assert_eq!(edge(&flat, "plan", "work")["data"], "item in state.items");
    assert_eq!(edge(&flat, "left", "both")["kind"], "join");
    assert!(edge(&flat, "left", "both").get("conditional").is_none());
    assert_eq!(edge(&flat, "__start__", "plan")["kind"], "static");

    // Every level: the subgraph nodes give way to their children, whose start and end are
    // dropped, and the edges around them go to the first and come from the last.
    let (_, _, deep) = call(&s, Method::GET, "/assistants/parent/graph?xray=true", None).await;
    let deep_ids = ids(&deep, "nodes");
    assert!(!deep_ids.contains(&"inner".to_string()), "{deep_ids:?}");
    assert!(!deep_ids.contains(&"inner:deep".to_string()), "{deep_ids:?}");
    for id in ["inner:first", "inner:deep:one", "inner:deep:two"] {
        assert!(deep_ids.contains(&id.to_string()), "{id} in {deep_ids:?}");
    }
    assert_eq!(node(&deep, "inner:deep:one")["data"]["name"], "inner:deep:one");
    edge(&deep, "both", "inner:first");
    edge(&deep, "inner:first", "inner:deep:one");
    edge(&deep, "inner:deep:one", "inner:deep:two");
    edge(&deep, "inner:deep:two", "ask");
    // One level: the middle workflow expanded, its own subgraph not.
    let (_, _, one) = call(&s, Method::GET, "/assistants/parent/graph?xray=1", None).await;
    let one_ids = ids(&one, "nodes");
    assert!(one_ids.contains(&"inner:deep".to_string()), "{one_ids:?}");
    assert_eq!(node(&one, "inner:deep")["metadata"]["subgraph"], "leaf");
    assert!(!one_ids.iter().any(|i| i.starts_with("inner:deep:")), "{one_ids:?}");
    let (_, _, off) = call(&s, Method::GET, "/assistants/parent/graph?xray=false", None).await;
    assert_eq!(off, flat);
    for bad in ["0", "-1", "deep"] {
        let (status, _, body) = call(&s, Method::GET, &format!("/assistants/parent/graph?xray={bad}"), None).await;
        assert_eq!(
            (status, &body["detail"]),
            (422, &json!("Invalid xray value")),
            "xray={bad}"
        );
    }
}

fn events_named<'a>(events: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|(e, d)| e == "events" && d["event"] == kind)
        .map(|(_, d)| d)
        .collect()
}

/// `stream_mode: events`: the graph's and each task's chain, the model calls with their
/// streamed pieces, reply and usage (and runner's model name and cost), the tool call with its
/// arguments and result, a retry and the `http` request, as they happen.
#[tokio::test(flavor = "multi_thread")]
async fn the_events_mode_streams_chains_model_calls_tokens_usage_and_tool_calls() {
    let dir = project();
    let web = fake_web::recorder(200, json!({"ok": true}));
    let s = serve_project(dir.path(), &[]);
    let body = client()
        .post(format!("{}/runs/stream", s.base))
        .json(
            &json!({"assistant_id": "traced", "input": {"question": "Define cop", "url": web.url("/x")},
                      "stream_mode": "events"}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = parse(&body);
    assert!(events.iter().all(|(e, _)| e == "metadata" || e == "events"), "{body}");
    let run_id = events[0].1["run_id"].clone();
    let chains = events_named(&events, "on_chain_start");
    assert_eq!(
        (&chains[0]["name"], &chains[0]["run_id"], &chains[0]["parent_ids"]),
        (&json!("traced"), &run_id, &json!([]))
    );
    assert_eq!(chains[0]["data"]["input"]["question"], "Define cop");
    let ask = chains.iter().find(|c| c["name"] == "ask").unwrap();
    assert_eq!(ask["metadata"]["langgraph_node"], "ask");
    assert_eq!(ask["tags"], json!(["graph:step:1"]));
    assert_eq!(ask["parent_ids"], json!([run_id]));
    assert_eq!(ask["data"]["input"]["question"], "Define cop");

    // Two calls: the first failed (and was retried), the second streamed two pieces.
    let starts = events_named(&events, "on_chat_model_start");
    let ends = events_named(&events, "on_chat_model_end");
    assert_eq!((starts.len(), ends.len()), (3, 3), "{body}");
    assert_eq!(starts[0]["metadata"]["ls_model_name"], "m-large");
    assert_eq!(starts[0]["parent_ids"], json!([run_id, ask["run_id"]]));
    assert!(
        ends[0]["data"]["error"].as_str().unwrap().contains("rate limited"),
        "{}",
        ends[0]
    );
    let pieces: Vec<&Value> = events_named(&events, "on_chat_model_stream")
        .iter()
        .map(|e| &e["data"]["chunk"]["content"])
        .collect();
    assert_eq!(pieces, [&json!("Let me"), &json!(" look"), &json!("")]);
    let reply = &ends[1]["data"]["output"];
    assert_eq!(
        (&reply["type"], &reply["content"]),
        (&json!("ai"), &json!("Let me look"))
    );
    assert_eq!(reply["tool_calls"][0]["name"], "define");
    assert_eq!(
        reply["usage_metadata"],
        json!({"input_tokens": 120, "output_tokens": 8, "total_tokens": 128})
    );
    let cost = ends[1]["metadata"]["cost_usd"].as_f64().unwrap();
    assert!((cost - (120.0 * 2.0 + 8.0 * 10.0) / 1e6).abs() < 1e-12, "{cost}");
    // The tool's own model call, inside the tool call.
    assert_eq!(ends[2]["metadata"]["ls_model_name"], "m-small");
    let tool_start = events_named(&events, "on_tool_start");
    let tool_end = events_named(&events, "on_tool_end");
    assert_eq!((tool_start.len(), tool_end.len()), (1, 1), "{body}");
    assert_eq!(
        (&tool_start[0]["name"], &tool_start[0]["data"]["input"]),
        (&json!("define"), &json!({"word": "cop"}))
    );
    assert_eq!(tool_end[0]["data"]["output"], "cop: a police officer");
    assert_eq!(tool_end[0]["run_id"], tool_start[0]["run_id"]);
    let custom: Vec<&Value> = events_named(&events, "on_custom_event");
    let names: Vec<&Value> = custom.iter().map(|e| &e["name"]).collect();
    assert_eq!(names, [&json!("runner.retry"), &json!("runner.http")], "{body}");
    assert_eq!(custom[1]["data"]["status"], 200);
    // Each task's chain ends with what it wrote; the graph's with the state.
    let chain_ends = events_named(&events, "on_chain_end");
    let fetch = chain_ends.iter().find(|c| c["name"] == "fetch").unwrap();
    assert_eq!(fetch["data"]["output"]["fetched"], json!({"ok": true}));
    let last = chain_ends.last().unwrap();
    assert_eq!((&last["name"], &last["run_id"]), (&json!("traced"), &run_id));
    assert_eq!(last["data"]["output"]["fetched"], json!({"ok": true}));
}

/// Waits until `path` answers something `done` accepts.
async fn until(s: &Server, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let (_, _, v) = call(s, Method::GET, path, None).await;
        if done(&v) {
            return v;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{path} stayed {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn spans<'a>(trace: &'a Value, kind: &str) -> Vec<&'a Value> {
    trace["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == kind)
        .collect()
}

/// Checks a finished `traced` run's trace.
fn check_trace(trace: &Value) {
    assert_eq!(trace["status"], "success", "{trace}");
    assert!(
        trace["started_at"].is_string() && trace["ended_at"].is_string(),
        "{trace}"
    );
    let run = spans(trace, "run");
    assert_eq!(
        (run.len(), &run[0]["name"], &run[0]["status"]),
        (1, &json!("traced"), &json!("ok"))
    );
    let steps = spans(trace, "step");
    assert_eq!(steps.len(), 4, "{trace}");
    assert!(
        steps
            .iter()
            .all(|s| s["parent"] == run[0]["id"] && s["checkpoint_id"].is_string())
    );
    let tasks = spans(trace, "task");
    let names: Vec<&Value> = tasks.iter().map(|t| &t["name"]).collect();
    assert_eq!(names, [&json!("ask"), &json!("tools"), &json!("fetch"), &json!("pad")]);
    // A span's times are relative to the run's start and nest inside their parent's.
    for t in &tasks {
        let step = steps.iter().find(|s| s["id"] == t["parent"]).unwrap();
        assert!(t["start_ms"].as_f64() >= step["start_ms"].as_f64() && t["end_ms"].as_f64() <= step["end_ms"].as_f64());
    }
    // A large write is cut, and the span says how long it was.
    let pad = tasks[3];
    assert!(pad["writes"].as_str().unwrap().len() <= 4096, "{pad}");
    assert!(pad["truncated"]["writes"].as_u64().unwrap() > 10_000, "{pad}");
    let models = spans(trace, "model");
    assert_eq!(models.len(), 3, "{trace}");
    assert_eq!(
        (&models[0]["status"], &models[0]["parent"]),
        (&json!("error"), &tasks[0]["id"])
    );
    assert_eq!(models[1]["usage"]["input_tokens"], 120);
    assert_eq!(models[1]["model"], "m-large");
    let tool = spans(trace, "tool");
    assert_eq!(
        (tool.len(), &tool[0]["name"], &tool[0]["parent"]),
        (1, &json!("define"), &tasks[1]["id"])
    );
    assert_eq!(tool[0]["input"], json!({"word": "cop"}));
    assert_eq!(models[2]["model"], "m-small");
    let http = spans(trace, "http");
    assert_eq!(
        (http.len(), &http[0]["http_status"], &http[0]["parent"]),
        (1, &json!(200), &tasks[2]["id"])
    );
    assert!(
        http[0]["name"].as_str().unwrap().starts_with("GET http://127.0.0.1:"),
        "{}",
        http[0]
    );
    let retry = spans(trace, "retry");
    assert_eq!((retry.len(), &retry[0]["parent"]), (1, &tasks[0]["id"]));
    // What the run spent: a failed call, the agent's and the tool's.
    let usage = &trace["usage"];
    assert_eq!(usage["total"]["calls"], 3, "{usage}");
    assert_eq!(usage["total"]["input_tokens"], 130);
    assert_eq!(usage["total"]["output_tokens"], 13);
    assert_eq!(usage["by_node"]["ask"]["calls"], 2);
    assert_eq!(usage["by_node"]["define"]["input_tokens"], 10);
    assert_eq!(usage["by_model"]["m-large"]["cost_usd"], json!(0.00032));
    assert_eq!(usage["by_model"]["m-small"]["cost_usd"], json!(0.000015));
}

/// A run's trace (every kind of span, with its usage) and a thread's usage are read back after
/// the server is killed and another started on its database.
#[tokio::test(flavor = "multi_thread")]
async fn a_runs_trace_and_its_threads_usage_are_kept_across_a_restart() {
    let dir = project();
    let web = fake_web::recorder(200, json!({"ok": true}));
    let db = dir.path().join("kept.db");
    let db = db.to_str().unwrap();
    let mut s = serve_project(dir.path(), &["--db", db]);
    let mut runs = Vec::new();
    for question in ["Define cop", "Define cop again"] {
        let (status, _, run) = call(
            &s,
            Method::POST,
            "/threads/t1/runs",
            Some(json!({"assistant_id": "traced", "if_not_exists": "create",
                        "input": {"question": question, "url": web.url("/x")}})),
        )
        .await;
        assert_eq!(status, 200, "{run}");
        let run_id = run["run_id"].as_str().unwrap().to_string();
        let (_, _, joined) = call(&s, Method::GET, &format!("/threads/t1/runs/{run_id}/join"), None).await;
        assert_eq!(joined["fetched"], json!({"ok": true}), "{joined}");
        runs.push(run_id);
    }
    let path = format!("/threads/t1/runs/{}/trace", runs[0]);
    let before = until(&s, &path, |t| t["status"] == "success").await;
    check_trace(&before);
    let usage = until(&s, "/threads/t1/usage", |u| u["runs"] == 2).await;
    assert_eq!(usage["total"]["calls"], 6, "{usage}");
    assert_eq!(usage["by_model"]["m-large"]["cost_usd"], json!(0.00064), "{usage}");

    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let s = serve_project(dir.path(), &["--db", db]);
    let (status, _, after) = call(&s, Method::GET, &path, None).await;
    assert_eq!(status, 200);
    assert_eq!(after, before);
    let (_, _, again) = call(&s, Method::GET, "/threads/t1/usage", None).await;
    assert_eq!(again, usage);
    // Neither a run of another thread nor a thread nobody made has one.
    let (status, _, _) = call(&s, Method::GET, &format!("/threads/t2/runs/{}/trace", runs[0]), None).await;
    assert_eq!(status, 404);
    let (status, _, _) = call(&s, Method::GET, "/threads/nobody/usage", None).await;
    assert_eq!(status, 404);
    // Deleting the thread deletes its runs' traces.
    let (status, _, _) = call(&s, Method::DELETE, "/threads/t1", None).await;
    assert!(status == 200 || status == 204);
    let (status, _, _) = call(&s, Method::GET, &path, None).await;
    assert_eq!(status, 404);
}

/// A run executed by a `runner worker` on PostgreSQL is traced there, and any server of the
/// API reads its trace.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_executed_on_a_worker_is_traced_for_every_server() {
    let dir = project();
    let web = fake_web::recorder(200, json!({"ok": true}));
    let db = postgres::fresh_url();
    let (child, base, _) = spawn(
        dir.path(),
        &dir.path().join("workflows"),
        &dir.path().join("mock.yaml"),
        &["--db", &db, "--workers", "0", "--allow-net", "127.0.0.1"],
        &[],
    );
    let api = Server { child, base, dir: None };
    let _worker = worker(dir.path(), &db);
    let (status, _, run) = call(
        &api,
        Method::POST,
        "/threads/w1/runs",
        Some(json!({"assistant_id": "traced", "if_not_exists": "create",
                    "input": {"question": "Define cop", "url": web.url("/x")}})),
    )
    .await;
    assert_eq!(status, 200, "{run}");
    let run_id = run["run_id"].as_str().unwrap();
    let path = format!("/threads/w1/runs/{run_id}/trace");
    let trace = until(&api, &path, |t| t["status"] == "success" && !t["ended_at"].is_null()).await;
    check_trace(&trace);
    let usage = until(&api, "/threads/w1/usage", |u| u["runs"] == 1).await;
    assert_eq!(usage["total"]["calls"], 3, "{usage}");
}

/// A `runner worker` on `db` that fetches from loopback, killed when dropped.
fn worker(dir: &Path, db: &str) -> Worker {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
    cmd.current_dir(dir)
        .args([
            "worker",
            "workflows",
            "--db",
            db,
            "--workers",
            "4",
            "--allow-net",
            "127.0.0.1",
        ])
        .arg("--mock")
        .arg(dir.join("mock.yaml"));
    Worker::start(cmd)
}

/// `runner serve` says what it serves and why a file is not: each diagnostic with its file,
/// line and column; it has no watcher (`dev: false`).
#[tokio::test(flavor = "multi_thread")]
async fn runner_workflows_lists_the_served_graphs_and_the_rejected_files_diagnostics() {
    let dir = project();
    std::fs::write(
        dir.path().join("workflows/broken.yaml"),
        "name: broken\nnodes:\n  a: {kind: nope}\nedges: [START -> a -> END]\n",
    )
    .unwrap();
    let s = serve_project(dir.path(), &[]);
    let (status, _, listed) = call(&s, Method::GET, "/runner/workflows", None).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["dev"], false);
    assert!(listed["reloaded_at"].is_string(), "{listed}");
    let graphs: Vec<&Value> = listed["graphs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["graph_id"])
        .collect();
    assert_eq!(graphs, [&json!("parent"), &json!("traced")]);
    let parent = &listed["graphs"][0];
    assert_eq!(
        (&parent["file"], &parent["name"], &parent["description"]),
        (
            &json!("parent.yaml"),
            &json!("parent"),
            &json!("A workflow drawn for Studio.")
        )
    );
    let rejected = listed["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 1, "{listed}");
    assert_eq!(rejected[0]["file"], "broken.yaml");
    let d = &rejected[0]["diagnostics"][0];
    assert_eq!(
        (&d["file"], &d["line"], &d["severity"]),
        (&json!("broken.yaml"), &json!(3), &json!("error")),
        "{d}"
    );
    assert!(
        d["col"].as_u64().unwrap() > 0 && d["code"].is_string() && d["message"].is_string(),
        "{d}"
    );
}

/// A running `runner dev`: its stderr, read as it comes.
struct Dev {
    server: Server,
    said: std::sync::Arc<std::sync::Mutex<String>>,
}

fn dev(dir: &Path, args: &[&str]) -> Dev {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir)
        .env_remove("RUNNER_DB")
        .args(["dev", "workflows", "--port", "0", "--mock"])
        .arg(dir.join("mock.yaml"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    let base = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("runner dev ended before listening:\n{said}");
        }
        said.push_str(&line);
        if let Some(url) = line.trim().strip_prefix("listening on ") {
            break url.to_string();
        }
    };
    let said = std::sync::Arc::new(std::sync::Mutex::new(said));
    let kept = said.clone();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            kept.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    Dev {
        server: Server { child, base, dir: None },
        said,
    }
}

/// `runner dev`: the page's URL printed, checkpoints in memory, and the folder watched: an
/// edited workflow is served as edited, a broken one is reported with its diagnostic's line
/// and column (its last good version still served), and once fixed it is served again.
#[tokio::test(flavor = "multi_thread")]
async fn runner_dev_reloads_a_workflow_as_it_is_edited_broken_and_fixed() {
    let dir = project();
    let d = dev(dir.path(), &[]);
    let s = &d.server;
    let started = Instant::now();
    while !d.said.lock().unwrap().contains("watching") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            d.said.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = d.said.lock().unwrap().clone();
    assert!(said.contains(&format!("Studio: {}/", s.base)), "{said}");
    assert!(said.contains("checkpoints: in memory"), "{said}");
    assert!(
        !dir.path().join(".runner/runner.db").exists(),
        "runner dev keeps its checkpoints in memory"
    );
    let (_, _, listed) = call(s, Method::GET, "/runner/workflows", None).await;
    assert_eq!(
        (&listed["dev"], &listed["rejected"]),
        (&json!(true), &json!([])),
        "{listed}"
    );

    // Time travel needs every checkpoint: the in-memory store keeps them.
    let (status, _, _) = call(
        s,
        Method::POST,
        "/threads/h/runs/wait",
        Some(json!({"assistant_id": "parent", "if_not_exists": "create", "input": {}})),
    )
    .await;
    assert_eq!(status, 200);
    let (_, _, history) = call(s, Method::POST, "/threads/h/history", Some(json!({"limit": 100}))).await;
    assert!(history.as_array().unwrap().len() > 2, "{history}");

    let file = dir.path().join("workflows/parts/leaf.yaml");
    let graph = "/assistants/parent/graph?xray=true";
    std::fs::write(
        &file,
        LEAF.replace("one -> two", "one -> two -> three").replace(
            "  two: {kind: set, update: {done: \"true\"}}",
            "  two: {kind: set, update: {done: \"true\"}}\n  three: {kind: set, update: {done: \"true\"}}",
        ),
    )
    .unwrap();
    until(s, graph, |g| {
        g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == "inner:deep:three")
    })
    .await;

    // Broken: reported at the misspelt kind's line and column; the last good version is
    // still served.
    let broken = LEAF.replace("  two: {kind: set,", "  two: {kind: sett,");
    let line = broken.lines().position(|l| l.contains("sett")).unwrap() + 1;
    let col = broken.lines().nth(line - 1).unwrap().find("sett").unwrap() + 1;
    std::fs::write(&file, &broken).unwrap();
    let listed = until(s, "/runner/workflows", |l| {
        !l["rejected"].as_array().unwrap().is_empty()
    })
    .await;
    let rejected = &listed["rejected"][0];
    assert_eq!(rejected["file"], "parent.yaml", "{listed}");
    assert_eq!(rejected["previous_version_served"], true, "{listed}");
    let d0 = rejected["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["file"] == "parts/leaf.yaml")
        .unwrap_or_else(|| panic!("no diagnostic in leaf.yaml: {listed}"));
    assert_eq!((&d0["line"], &d0["col"]), (&json!(line), &json!(col)), "{d0}");
    assert!(d0["help"].as_str().unwrap_or_default().contains("set"), "{d0}");
    let (_, _, kept) = call(s, Method::GET, graph, None).await;
    assert!(
        kept["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == "inner:deep:three"),
        "{kept}"
    );

    // Fixed: served again, as it now is.
    std::fs::write(&file, LEAF).unwrap();
    until(s, "/runner/workflows", |l| l["rejected"] == json!([])).await;
    until(s, graph, |g| {
        !g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == "inner:deep:three")
    })
    .await;
    let said = d.said.lock().unwrap().clone();
    assert!(said.contains("not served:") && said.contains("reloaded"), "{said}");
}
