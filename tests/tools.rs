//! Tools declared in YAML and the `tools` kind: the ReAct loop closed in YAML on the mock
//! provider (an llm node offered declared tools, a `tools` node running its calls, back to
//! the llm), parallel calls answered in call order, failed calls fed back to the model as
//! error messages, a workflow as a tool, and the tools an llm node sends to an
//! OpenAI-compatible server.

use std::process::Command;
use std::sync::Arc;

use runner::checkpoint::memory::MemoryCheckpointer;
use runner::compile::Plan;
use runner::engine::events::Events;
use runner::engine::{Engine, RunOutcome, RunRequest, Status};
use runner::providers::Providers;
use runner::providers::mock::MockProvider;
use serde_json::{Value, json};

use crate::support::fake_llm::{FakeLlm, Reply};
use crate::support::{Project, fake_web};

/// Runs `plan` in memory on the scripted mock `script` with `input`: the outcome and the mock.
pub(crate) fn run(plan: &Arc<Plan>, script: Value, input: Value) -> (RunOutcome, Arc<MockProvider>) {
    let mock = Arc::new(MockProvider::from_value(&script).unwrap());
    let providers = Providers::for_models_in(plan.models(), Some(mock.clone()), true, &|_| None).unwrap();
    let (events, _rx) = Events::channel();
    let engine = Engine::new(plan.clone(), Arc::new(MemoryCheckpointer::new()), providers, events);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let req = RunRequest {
        input: Some(input),
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    };
    let out = rt.block_on(engine.run(req)).unwrap();
    (out, mock)
}

/// A ReAct agent: `agent` is offered the declared tools, `act` runs its calls, back to
/// `agent` until it answers without calls.
fn agent(search_base: &str) -> String {
    format!(
        r#"name: react
models: {{default: {{provider: mock, model: m}}}}
input: {{type: object, properties: {{q: {{type: string}}}}}}
state:
  messages: {{type: array, reducer: add_messages, default: []}}
tools:
  web_search:
    description: Search the web.
    args: {{type: object, required: [q], properties: {{q: {{type: string}}}}}}
    run: {{kind: search, base_url: "{search_base}", queries: "args.q", limit: 1}}
  define:
    description: Say what a word means.
    workflow: define.yaml
nodes:
  start: {{kind: set, update: {{messages: "[{{'role': 'user', 'content': input.q}}]"}}}}
  agent:
    kind: llm
    prompt: {{text: "Go on."}}
    history: {{from: state.messages}}
    tools: [web_search, define]
    update:
      messages: "[{{'role': 'assistant', 'content': output.content, 'tool_calls': output.tool_calls}}]"
    goto:
      - {{when: "output.tool_calls", to: act}}
      - {{to: END}}
  act: {{kind: tools, update: {{messages: output}}}}
edges: [START -> start -> agent, act -> agent]
"#
    )
}

const DEFINE: &str = r#"name: define
input: {type: object, required: [word], properties: {word: {type: string}}}
state:
  meaning: {type: string}
nodes:
  say: {kind: set, update: {meaning: "input.word ~ ' means a ratio'"}}
edges: [START -> say -> END]
"#;

#[test]
fn a_react_loop_in_yaml_runs_every_call_and_feeds_failures_back_as_error_messages() {
    let site = fake_web::start("");
    let p = Project::new(&[("w.yaml", &agent(&site.base())), ("define.yaml", DEFINE)]);
    let plan = p.plan("w.yaml");
    let script = json!({"replies": {"agent": [
        {"tool_calls": [
            {"name": "web_search", "args": {"q": "heat pump cop"}},
            {"name": "define", "args": {"word": "cop"}},
            {"name": "web_search", "args": {"query": "the wrong field"}},
            {"name": "weather", "args": {}}
        ]},
        "A heat pump's COP is a ratio."
    ]}});
    let (out, mock) = run(&plan, script, json!({"q": "what is a heat pump's cop?"}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let messages = out.state["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "tool", "tool", "tool", "assistant"]
    );
    let tool = &messages[2..6];
    let ids: Vec<&str> = tool.iter().map(|m| m["tool_call_id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["call_1", "call_2", "call_3", "call_4"],
        "one message per call, in call order"
    );
    let names: Vec<&str> = tool.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["web_search", "define", "web_search", "weather"]);
    let status: Vec<&str> = tool.iter().map(|m| m["status"].as_str().unwrap()).collect();
    assert_eq!(status, ["success", "success", "error", "error"]);
    // The search ran on the fake engine with the model's query; its output is the content.
    let found: Value = serde_json::from_str(tool[0]["content"].as_str().unwrap()).unwrap();
    assert_eq!(found["results"][0]["query"], "heat pump cop", "{found}");
    assert!(
        site.hits().iter().any(|h| h.starts_with("/search?q=heat+pump+cop")),
        "{:?}",
        site.hits()
    );
    // The workflow tool got the arguments as its input.
    let meaning: Value = serde_json::from_str(tool[1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(meaning, json!({"meaning": "cop means a ratio"}));
    // Arguments that do not fit the schema never reach the tool; an unknown tool is named.
    let bad_args = tool[2]["content"].as_str().unwrap();
    assert!(
        bad_args.contains("do not fit") && bad_args.contains("\"q\""),
        "{bad_args}"
    );
    assert_eq!(
        site.hits().iter().filter(|h| h.starts_with("/search")).count(),
        1,
        "only the good call searched"
    );
    let unknown = tool[3]["content"].as_str().unwrap();
    assert!(
        unknown.contains("no tool `weather`") && unknown.contains("web_search, define"),
        "{unknown}"
    );
    assert_eq!(messages[6]["content"], "A heat pump's COP is a ratio.");
    assert_eq!(mock.calls()["agent"], 2);
}

#[test]
fn a_failing_tool_is_an_error_message_unless_the_node_fails_on_it() {
    // Nothing listens on the search engine's port: every call fails.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let text = agent(&closed);
    let p = Project::new(&[("w.yaml", &text), ("define.yaml", DEFINE)]);
    let script = json!({"replies": {"agent": [
        {"tool_calls": [{"name": "web_search", "args": {"q": "a"}}, {"name": "define", "args": {"word": "b"}}]},
        "Sorry."
    ]}});
    let (out, _) = run(&p.plan("w.yaml"), script.clone(), json!({"q": "?"}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let messages = out.state["messages"].as_array().unwrap();
    assert_eq!(messages[2]["status"], "error");
    assert!(
        messages[2]["content"].as_str().unwrap().starts_with("Error: "),
        "{}",
        messages[2]
    );
    assert_eq!(messages[3]["status"], "success", "the other call still ran");
    assert_eq!(
        messages[4]["content"], "Sorry.",
        "the model read the error and answered"
    );

    p.write(
        "w.yaml",
        &text.replace("{kind: tools,", "{kind: tools, on_tool_error: fail,"),
    );
    let (out, _) = run(&p.plan("w.yaml"), script, json!({"q": "?"}));
    assert_eq!(out.status, Status::Failed);
    let error = out.error.unwrap_or_default();
    assert!(error.contains("tool `web_search` (call call_1)"), "{error}");
}

/// A server whose `/gate?need=N` answers `together` once N requests are in flight at once,
/// or `alone` when 1.5s pass without that.
fn gate() -> crate::support::Served {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    // Requests waiting now, and whether as many as asked for ever waited at once: a request
    // counts only while it waits, so calls made one after another never add up.
    let waiting = Arc::new(AtomicUsize::new(0));
    let met = Arc::new(AtomicBool::new(false));
    crate::support::serve("127.0.0.1", move |_| {
        axum::Router::new().route(
            "/gate",
            axum::routing::get(
                move |q: axum::extract::Query<std::collections::HashMap<String, usize>>| {
                    let (waiting, met) = (waiting.clone(), met.clone());
                    async move {
                        let need = q.get("need").copied().unwrap_or(1);
                        if waiting.fetch_add(1, Ordering::SeqCst) + 1 >= need {
                            met.store(true, Ordering::SeqCst);
                        }
                        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(1500);
                        let answer = loop {
                            if met.load(Ordering::SeqCst) {
                                break "together";
                            }
                            if tokio::time::Instant::now() > deadline {
                                break "alone";
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        };
                        waiting.fetch_sub(1, Ordering::SeqCst);
                        answer
                    }
                },
            ),
        )
    })
}

/// Three calls of a tool that answers `together` only when three requests wait at once.
fn gated(base: &str, concurrency: u32, timeout: &str) -> String {
    format!(
        r#"name: gated
state:
  messages: {{type: array, reducer: add_messages, default: []}}
tools:
  fetch:
    description: Fetch a page.
    args: {{type: object, required: [n], properties: {{n: {{type: integer}}}}}}
    run: {{kind: http, url: "{base}/gate?need=3&n={{{{ args.n }}}}", response: text}}
    timeout: {timeout}
nodes:
  start:
    kind: set
    update:
      messages: >-
        [{{'role': 'assistant', 'content': '', 'tool_calls': [{{'id': 'a', 'name': 'fetch', 'args': {{'n': 1}}}},
          {{'id': 'b', 'name': 'fetch', 'args': {{'n': 2}}}}, {{'id': 'c', 'name': 'fetch', 'args': {{'n': 3}}}}]}}]
  act: {{kind: tools, concurrency: {concurrency}, update: {{messages: output}}}}
edges: [START -> start -> act -> END]
"#
    )
}

fn tool_messages(text: &str) -> Vec<Value> {
    let p = Project::new(&[("w.yaml", text)]);
    let (out, _) = run(&p.plan("w.yaml"), json!({}), json!({}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    out.state["messages"].as_array().unwrap()[1..].to_vec()
}

#[test]
fn calls_run_in_parallel_up_to_the_concurrency_bound_answered_in_call_order() {
    let server = gate();
    let base = format!("http://{}", server.addr);
    let all = tool_messages(&gated(&base, 3, "10s"));
    let ids: Vec<&str> = all.iter().map(|m| m["tool_call_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    for m in &all {
        assert_eq!(m["status"], "success", "{m}");
        assert!(
            m["content"].as_str().unwrap().contains("together"),
            "three at once: {m}"
        );
    }
    drop(server);
    let server = gate();
    let base = format!("http://{}", server.addr);
    let bounded = tool_messages(&gated(&base, 2, "10s"));
    let alone: Vec<bool> = bounded
        .iter()
        .map(|m| m["content"].as_str().unwrap().contains("alone"))
        .collect();
    assert_eq!(alone, [true, true, true], "never more than two at once: {bounded:?}");
}

#[test]
fn a_call_that_outlives_its_tools_timeout_is_an_error_message() {
    let server = gate();
    let base = format!("http://{}", server.addr);
    // One at a time: the first two wait for company and time out; the third arrives third.
    let late = tool_messages(&gated(&base, 1, "200ms"));
    for m in &late[..2] {
        assert_eq!(m["status"], "error", "{m}");
        assert!(m["content"].as_str().unwrap().contains("did not finish within"), "{m}");
    }
    assert_eq!(
        late[2]["status"], "success",
        "a timed-out call does not stop the next: {}",
        late[2]
    );
}

/// `runner validate` on `w.yaml` of the files (in a temp dir): its exit code and report.
pub(crate) fn validate(files: &[(&str, &str)]) -> (i32, String) {
    let p = Project::new(files);
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .args(["validate", p.path("w.yaml").to_str().unwrap()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn validate_checks_tool_names_and_each_tools_run_at_its_line() {
    let text = agent("http://127.0.0.1:9")
        .replace("tools: [web_search, define]", "tools: [web_serch, define]")
        .replace("queries: \"args.q\"", "queries: \"args.q ~ state.nope\"");
    let (code, out) = validate(&[("w.yaml", &text), ("define.yaml", DEFINE)]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("E217") && out.contains("no tool `web_serch`"), "{out}");
    assert!(out.contains("web_search"), "did you mean: {out}");
    // The run node's fields are compiled by its kind, in the scope of `args`.
    assert!(out.contains("E302") && out.contains("nope"), "{out}");
    let (code, out) = validate(&[("w.yaml", &agent("http://127.0.0.1:9")), ("define.yaml", DEFINE)]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn a_workflow_tool_takes_its_args_schema_from_the_workflows_input() {
    let p = Project::new(&[("w.yaml", &agent("http://127.0.0.1:9")), ("define.yaml", DEFINE)]);
    let script = json!({"replies": {"agent": [
        {"tool_calls": [{"name": "define", "args": {"term": "cop"}}]},
        "ok"
    ]}});
    let (out, _) = run(&p.plan("w.yaml"), script, json!({"q": "?"}));
    let m = &out.state["messages"][2];
    assert_eq!(m["status"], "error");
    assert!(m["content"].as_str().unwrap().contains("\"word\""), "{m}");
}

#[test]
fn an_llm_node_sends_the_declared_tools_to_the_model_as_functions() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(FakeLlm::start());
    server.script([Reply::completion("No tools needed.")]);
    let text = agent("http://127.0.0.1:9").replace(
        "models: {default: {provider: mock, model: m}}",
        &format!(
            "models: {{default: {{provider: openai, model: gpt-test, base_url: \"{}\", api_key_env: FAKE_KEY}}}}",
            server.base_url
        ),
    );
    let p = Project::new(&[("w.yaml", &text), ("define.yaml", DEFINE)]);
    let plan = p.plan("w.yaml");
    let env = |name: &str| (name == "FAKE_KEY").then(|| "sk-test".to_string());
    let providers = Providers::for_models_in(plan.models(), None, false, &env).unwrap();
    let (events, _rx) = Events::channel();
    let engine = Engine::new(plan.clone(), Arc::new(MemoryCheckpointer::new()), providers, events);
    let req = RunRequest {
        input: Some(json!({"q": "hi"})),
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    };
    let out = rt.block_on(engine.run(req)).unwrap();
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let body = &server.requests()[0].body;
    let tools = body["tools"].as_array().unwrap();
    assert_eq!(
        tools[0],
        json!({"type": "function", "function": {
            "name": "web_search",
            "description": "Search the web.",
            "parameters": {"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}}
        }})
    );
    // A workflow tool's arguments are the workflow's input.
    assert_eq!(tools[1]["function"]["name"], "define");
    assert_eq!(tools[1]["function"]["parameters"]["required"], json!(["word"]));
}

/// The README's ReAct agent is a valid workflow.
#[test]
fn the_readme_react_agent_compiles() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split("## A ReAct agent")
        .nth(1)
        .expect("the README has the section");
    let yaml = section.split("```yaml\n").nth(1).unwrap().split("```").next().unwrap();
    assert!(yaml.contains("kind: tools"), "{yaml}");
    let plan = Project::new(&[("w.yaml", yaml)]).plan("w.yaml");
    assert!(plan.node_by_name("tools").is_some());
}

/// A server whose `/flaky` fails with 503 `fails` times, then answers `fine`; it counts hits.
fn flaky(fails: usize) -> (crate::support::Served, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    let served = crate::support::serve("127.0.0.1", move |_| {
        axum::Router::new().route(
            "/flaky",
            axum::routing::get(move || {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n < fails {
                        true => (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy"),
                        false => (axum::http::StatusCode::OK, "fine"),
                    }
                }
            }),
        )
    });
    (served, hits)
}

fn flaky_tool(base: &str, retry: &str) -> String {
    gated(base, 1, "10s")
        .replace(
            &format!("run: {{kind: http, url: \"{base}/gate?need=3&n={{{{ args.n }}}}\", response: text}}"),
            &format!("run: {{kind: http, url: \"{base}/flaky\", response: text{retry}}}"),
        )
        .replace(
            "{'id': 'b', 'name': 'fetch', 'args': {'n': 2}}, {'id': 'c', 'name': 'fetch', 'args': {'n': 3}}",
            "",
        )
        .replace("{'n': 1}},\n", "{'n': 1}}")
}

#[test]
fn a_tools_run_retries_as_its_kind_and_its_retry_policy_say() {
    use std::sync::atomic::Ordering;
    let (server, hits) = flaky(2);
    let base = format!("http://{}", server.addr);
    let text = flaky_tool(
        &base,
        ", retry: {max_attempts: 3, initial_interval: 10ms, jitter: false}",
    );
    assert!(text.contains("/flaky") && !text.contains("'b'"), "{text}");
    let m = tool_messages(&text);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0]["status"], "success", "{}", m[0]);
    assert!(m[0]["content"].as_str().unwrap().contains("fine"), "{}", m[0]);
    assert_eq!(hits.load(Ordering::SeqCst), 3, "two failed attempts, then the answer");

    let (server, hits) = flaky(1);
    let base = format!("http://{}", server.addr);
    let m = tool_messages(&flaky_tool(&base, ", retry: {max_attempts: 1}"));
    assert_eq!(m[0]["status"], "error", "one attempt only: {}", m[0]);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[test]
fn a_tool_whose_run_offers_itself_is_reported_not_compiled_forever() {
    let text = r#"name: loop
models: {default: {provider: mock, model: m}}
tools:
  ask:
    description: Ask a model that may ask again.
    args: {type: object, properties: {q: {type: string}}}
    run: {kind: llm, prompt: {text: "{{ args.q }}"}, tools: [ask]}
nodes:
  go: {kind: llm, prompt: {text: "hi"}, tools: [ask]}
edges: [START -> go -> END]
"#;
    let (code, out) = validate(&[("w.yaml", text)]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("the tool `ask` offers itself: ask -> ask"), "{out}");
}
