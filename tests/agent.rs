//! The `agent` kind: the ReAct loop compiled into a child plan of llm → tools → route, run
//! against the fake OpenAI-compatible server (parallel calls, what the model is sent back) and
//! the mock provider (`max_iterations`, a structured final answer), checked at validate time,
//! drawn by `runner graph`, and killed between a round of tool calls and the next model call.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runner::checkpoint::memory::MemoryCheckpointer;
use runner::compile::Plan;
use runner::engine::events::Events;
use runner::engine::{Engine, RunOutcome, RunRequest, Status};
use runner::providers::Providers;
use runner::providers::mock::MockProvider;
use serde_json::{Value, json};

use crate::support::fake_llm::{FakeLlm, Reply};
use crate::support::{Project, fake_web};

const DEFINE: &str = r#"name: define
input: {type: object, required: [word], properties: {word: {type: string}}}
state:
  meaning: {type: string}
nodes:
  say: {kind: set, update: {meaning: "input.word ~ ' means a ratio'"}}
edges: [START -> say -> END]
"#;

/// A workflow whose `helper` agent may call `define`; `extra` is added to the agent's fields.
fn workflow(models: &str, extra: &str) -> String {
    format!(
        r#"name: agentic
models: {models}
input: {{type: object, properties: {{q: {{type: string}}}}}}
state:
  messages: {{type: array, reducer: add_messages, default: [], from_input: q}}
  rounds: {{type: integer, default: 0}}
  answer: {{}}
  exhausted: {{type: boolean, default: false}}
tools:
  define:
    description: Say what a word means.
    workflow: define.yaml
nodes:
  helper:
    kind: agent
    tools: [define]
    system: {{text: "You define words for {{{{ input.q }}}}."}}
{extra}    update: {{messages: output.messages, rounds: output.iterations, answer: output.answer, exhausted: output.exhausted}}
edges: [START -> helper -> END]
"#
    )
}

const MOCK: &str = "{default: {provider: mock, model: m}}";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn run_mock(plan: &Arc<Plan>, script: Value) -> (RunOutcome, Arc<MockProvider>, Vec<Value>) {
    let mock = Arc::new(MockProvider::from_value(&script).unwrap());
    let providers = Providers::for_models(plan.models(), Some(mock.clone()), true).unwrap();
    let (events, mut rx) = Events::channel();
    let engine = Engine::new(plan.clone(), Arc::new(MemoryCheckpointer::new()), providers, events);
    let req = RunRequest {
        input: Some(json!({"q": "what is a cop?"})),
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    };
    let out = runtime().block_on(engine.run(req)).unwrap();
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        seen.push(serde_json::to_value(&e).unwrap());
    }
    (out, mock, seen)
}

fn roles(messages: &Value) -> Vec<&str> {
    messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect()
}

/// An OpenAI chat completion that calls `calls` (name, arguments) in parallel.
fn tool_calls(calls: &[(&str, Value)]) -> Reply {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    Reply::json(
        200,
        json!({"id": "c1", "object": "chat.completion", "model": "gpt-test",
               "choices": [{"index": 0, "finish_reason": "tool_calls",
                            "message": {"role": "assistant", "content": null, "tool_calls": calls}}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}),
    )
}

#[test]
fn an_agent_loops_through_parallel_tool_calls_and_returns_the_messages_it_added() {
    let rt = runtime();
    let server = rt.block_on(FakeLlm::start());
    server.script([
        tool_calls(&[("define", json!({"word": "cop"})), ("define", json!({"word": "scop"}))]),
        Reply::completion("COP is a ratio."),
    ]);
    let models = format!(
        "{{default: {{provider: openai, model: gpt-test, base_url: \"{}\", api_key_env: FAKE_KEY}}}}",
        server.base_url
    );
    let p = Project::new(&[("w.yaml", &workflow(&models, "")), ("define.yaml", DEFINE)]);
    let plan = p.plan("w.yaml");
    let env = |name: &str| (name == "FAKE_KEY").then(|| "sk-test".to_string());
    let providers = Providers::for_models_in(plan.models(), None, false, &env).unwrap();
    let (events, mut rx) = Events::channel();
    let engine = Engine::new(plan.clone(), Arc::new(MemoryCheckpointer::new()), providers, events);
    let req = RunRequest {
        input: Some(json!({"q": "what is a cop?"})),
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    };
    let out = rt.block_on(engine.run(req)).unwrap();
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let messages = &out.state["messages"];
    assert_eq!(roles(messages), ["user", "assistant", "tool", "tool", "assistant"]);
    // The loop's messages join the parent's history as new ones, after the question.
    let ids: Vec<&str> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m0", "m1", "m2", "m3", "m4"]);
    assert_eq!(messages[2]["tool_call_id"], "call_0");
    assert_eq!(messages[3]["tool_call_id"], "call_1");
    assert_eq!(
        serde_json::from_str::<Value>(messages[3]["content"].as_str().unwrap()).unwrap(),
        json!({"meaning": "scop means a ratio"})
    );
    assert_eq!(out.state["answer"], "COP is a ratio.");
    assert_eq!(out.state["rounds"], 1);
    assert_eq!(out.state["exhausted"], false);

    // The second call sends the whole loop back: system prompt rendered in the parent's scope,
    // the question, the calls and both results, and the tools again.
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let sent = &requests[1].body["messages"];
    assert_eq!(roles(sent), ["system", "user", "assistant", "tool", "tool"]);
    assert_eq!(sent[0]["content"], "You define words for what is a cop?.");
    assert_eq!(sent[2]["tool_calls"][1]["function"]["name"], "define");
    assert_eq!(sent[4]["tool_call_id"], "call_1");
    assert_eq!(requests[1].body["tools"][0]["function"]["name"], "define");

    // Each turn of the loop is a step of the child run: model, tools, model.
    let mut steps = Vec::new();
    while let Ok(e) = rx.try_recv() {
        let e = serde_json::to_value(&e).unwrap();
        if e["type"] == "node_start"
            && e["ns"]
                .as_str()
                .is_some_and(|ns| ns.starts_with("helper:") && !ns.contains('|'))
        {
            steps.push(e["node"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(steps, ["helper", "tools", "helper"], "child steps");
}

#[test]
fn max_iterations_ends_the_loop_with_the_last_call_replaced_by_a_reply() {
    let p = Project::new(&[
        ("w.yaml", &workflow(MOCK, "    max_iterations: 2\n")),
        ("define.yaml", DEFINE),
    ]);
    // The model never stops calling tools (the last reply repeats).
    let script = json!({"replies": {"helper": [{"tool_calls": [{"name": "define", "args": {"word": "x"}}]}]}});
    let (out, mock, _) = run_mock(&p.plan("w.yaml"), script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(mock.calls()["helper"], 3, "two rounds, then one last call");
    assert_eq!(out.state["rounds"], 2);
    assert_eq!(out.state["exhausted"], true);
    let messages = out.state["messages"].as_array().unwrap();
    assert_eq!(
        roles(&out.state["messages"]),
        ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    );
    let last = messages.last().unwrap();
    assert_eq!(last["content"], "Sorry, need more steps to process this request.");
    assert!(
        last.get("tool_calls")
            .is_none_or(|c| c.as_array().is_some_and(Vec::is_empty)),
        "no unanswered calls are left in the history: {last}"
    );
}

#[test]
fn a_structured_final_answer_is_asked_for_once_the_model_stops_calling_tools() {
    let extra = "    output: {schema: {type: object, required: [word, meaning], properties: {word: {type: string}, meaning: {type: string}}}}\n";
    let p = Project::new(&[("w.yaml", &workflow(MOCK, extra)), ("define.yaml", DEFINE)]);
    let script = json!({"replies": {
        "helper": [{"tool_calls": [{"name": "define", "args": {"word": "cop"}}]}, "It is a ratio."],
        "answer": ["{\"word\": \"cop\"}", "{\"word\": \"cop\", \"meaning\": \"a ratio\"}"],
    }});
    let (out, mock, _) = run_mock(&p.plan("w.yaml"), script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["answer"], json!({"word": "cop", "meaning": "a ratio"}));
    assert_eq!(mock.calls()["answer"], 2, "a reply that misses the schema is repaired");
    assert_eq!(
        roles(&out.state["messages"]),
        ["user", "assistant", "tool", "assistant"]
    );
}

fn runner() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("runner"))
}

#[test]
fn validate_reports_an_agents_unknown_tools_and_reviews_at_their_lines() {
    let (code, out) = super::tools::validate(&[("w.yaml", &workflow(MOCK, "")), ("define.yaml", DEFINE)]);
    assert_eq!(code, 0, "{out}");
    let text = workflow(MOCK, "    review: [defin]\n").replace("tools: [define]", "tools: [defne]");
    let (code, out) = super::tools::validate(&[("w.yaml", &text), ("define.yaml", DEFINE)]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("E217") && out.contains("no tool `defne`"), "{out}");
    assert!(out.contains("`defin` is not one of this agent's tools"), "{out}");
    // Reported in the file as written, never in the generated loop.
    assert!(!out.contains("w.yaml#helper"), "{out}");
}

#[test]
fn runner_graph_draws_the_agents_loop_as_its_cluster() {
    let p = Project::new(&[("w.yaml", &workflow(MOCK, "")), ("define.yaml", DEFINE)]);
    let out = runner()
        .args(["graph", p.path("w.yaml").to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let picture: Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = picture.to_string();
    let helper = picture["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "helper")
        .unwrap_or_else(|| panic!("{text}"));
    let inner: Vec<&str> = helper["subgraph"]["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{text}"))
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    for node in ["helper", "tools", "give_up"] {
        assert!(inner.contains(&node), "{inner:?}");
    }
}

/// Killed after a round of tool calls finished and while the model's next call is under way,
/// the resumed run calls the model again but runs no finished tool call again.
#[test]
fn a_killed_agent_resumes_without_running_its_finished_tool_calls_again() {
    let site = fake_web::start("");
    let text = workflow(MOCK, "").replace(
        "    workflow: define.yaml\n",
        &format!("    run: {{kind: http, url: \"{}/notes.txt\"}}\n", site.base()),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.yaml"), &text).unwrap();
    // The second model call takes long enough for the kill to land inside it.
    std::fs::write(
        dir.path().join("mock.yaml"),
        "replies:\n  helper:\n    - {tool_calls: [{name: define, args: {}}, {name: define, args: {}}]}\n    - {text: \"done\", delay: 30}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("resume.yaml"), "replies:\n  helper: [\"done\"]\n").unwrap();
    let db = dir.path().join("r.db");
    let mut child = runner()
        .current_dir(dir.path())
        .args([
            "run",
            "w.yaml",
            "--mock",
            "mock.yaml",
            "--stream",
            "jsonl",
            "--thread",
            "t1",
        ])
        .args(["--allow-net", "127.0.0.1", "--input", "q=cop"])
        .arg("--db")
        .arg(&db)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reader = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let mut model_turns = 0;
    for line in reader.lines() {
        let line = line.unwrap();
        let Ok(e) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if e["type"] == "node_start" && e["node"] == "helper" && e["ns"].is_string() {
            model_turns += 1;
        }
        seen.push(e);
        if model_turns == 2 || Instant::now() > deadline {
            break;
        }
    }
    assert_eq!(model_turns, 2, "the second model call started: {seen:?}");
    child.kill().unwrap(); // SIGKILL on unix
    assert!(!child.wait().unwrap().success(), "the run was killed, not finished");
    let notes = || site.hits().iter().filter(|h| h.starts_with("/notes.txt")).count();
    assert_eq!(notes(), 2, "both calls ran before the kill");

    let resumed = runner()
        .current_dir(dir.path())
        .args(["resume", "--thread", "t1", "--mock", "resume.yaml", "--stream", "jsonl"])
        .args(["--allow-net", "127.0.0.1"])
        .arg("--db")
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert_eq!(notes(), 2, "no finished tool call ran again: {stderr}");
    let state: Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(
        roles(&state["messages"]),
        ["user", "assistant", "tool", "tool", "assistant"]
    );
    assert_eq!(state["answer"], "done");
    let tools_started = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "node_start" && e["node"] == "tools")
        .count();
    assert_eq!(tools_started, 0, "{stderr}");
}

/// `runner` in `dir` with `args`: exit code, stdout as JSON (null when it is not), stderr.
fn cli(dir: &std::path::Path, args: &[&str]) -> (i32, Value, String) {
    let out = runner().current_dir(dir).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn started(stderr: &str, node: &str) -> usize {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "node_start" && e["node"] == node)
        .count()
}

/// Reviewed calls stop the run one at a time with agent-inbox's shapes; no call runs until
/// every one is decided; an edit runs with the edited arguments, a response goes back to the
/// model as the call's result, and a malformed decision is refused with the gate kept.
#[test]
fn reviewed_calls_wait_for_each_decision_and_run_as_decided() {
    let text = workflow(MOCK, "    review: [erase]\n").replace(
        "    workflow: define.yaml\n",
        "    workflow: define.yaml\n  erase:\n    description: Erase a word.\n    workflow: define.yaml\n",
    );
    let text = text.replace("tools: [define]", "tools: [define, erase]");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("w.yaml"), &text).unwrap();
    std::fs::write(d.join("define.yaml"), DEFINE).unwrap();
    std::fs::write(
        d.join("mock.yaml"),
        "replies:\n  helper:\n    - {tool_calls: [{name: define, args: {word: cop}}, {name: erase, args: {word: x}}, {name: erase, args: {word: y}}]}\n    - \"done\"\n",
    )
    .unwrap();
    let base = ["--mock", "mock.yaml", "--db", "r.db", "--stream", "jsonl"];
    let (code, out, err) = cli(
        d,
        &[&["run", "w.yaml", "--thread", "t1", "--input", "q=cop"][..], &base].concat(),
    );
    assert_eq!(code, 3, "{err}");
    // The loop's gate, reported through the agent's task as a subgraph's is.
    let payload = &out["interrupt"]["payload"]["payload"];
    assert_eq!(out["interrupt"]["payload"]["node"], "tools", "{out}");
    assert_eq!(
        payload["action_request"],
        json!({"action": "erase", "args": {"word": "x"}}),
        "{out}"
    );
    assert_eq!(
        payload["config"],
        json!({"allow_accept": true, "allow_edit": true, "allow_respond": true, "allow_ignore": true})
    );
    let mut say = started(&err, "say");
    assert_eq!(say, 0, "no call runs before every reviewed call is decided");

    let resume = |answer: &str| {
        cli(
            d,
            &[&["resume", "--thread", "t1", "--answer", answer][..], &base].concat(),
        )
    };
    let (code, _, err) = resume(r#"{"type": "maybe"}"#);
    assert_eq!(code, 2, "a decision of no known type is refused: {err}");
    let (code, out, err) = resume(r#"{"type": "edit", "args": {"action": "erase", "args": {"word": "z"}}}"#);
    assert_eq!(code, 3, "{err}");
    assert_eq!(
        out["interrupt"]["payload"]["payload"]["action_request"]["args"],
        json!({"word": "y"})
    );
    say += started(&err, "say");
    assert_eq!(say, 0);
    // A new process replays the script from its start: the model's next reply is its answer.
    std::fs::write(d.join("mock.yaml"), "replies:\n  helper: [\"done\"]\n").unwrap();
    let (code, out, err) = resume(r#"[{"type": "response", "args": "Do not erase that."}]"#);
    assert_eq!(code, 0, "{out} {err}");
    say += started(&err, "say");
    assert_eq!(say, 2, "define and the edited erase ran once each");
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(
        roles(&out["messages"]),
        ["user", "assistant", "tool", "tool", "tool", "assistant"]
    );
    let content = |i: usize| messages[i]["content"].as_str().unwrap().to_string();
    assert!(content(2).contains("cop means a ratio"), "{}", content(2));
    assert!(
        content(3).contains("z means a ratio"),
        "the edited arguments: {}",
        content(3)
    );
    assert_eq!(content(4), "Do not erase that.");
    assert_eq!(messages[4]["status"], "error");
    assert_eq!(out["answer"], "done");
}

/// The README's agent-kind example is a valid workflow whose `model` node runs a loop.
#[test]
fn the_readme_agent_compiles_into_a_loop() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let yaml = readme
        .split("```yaml\n")
        .map(|block| block.split("```").next().unwrap())
        .find(|block| block.contains("kind: agent"))
        .expect("the README shows an agent node");
    let plan = Project::new(&[("w.yaml", yaml)]).plan("w.yaml");
    let ix = plan.node_by_name("model").unwrap();
    let child = plan.subgraphs().get(&ix).expect("the agent's loop is its child plan");
    assert!(child.node_by_name("tools").is_some());
}

#[test]
fn a_tools_node_reviews_only_tools_it_runs() {
    let text = r#"name: w
models: {default: {provider: mock, model: m}}
state:
  messages: {type: array, reducer: add_messages, default: []}
tools:
  define: {description: Define., workflow: define.yaml}
nodes:
  act: {kind: tools, tools: [define], review: [defne], update: {messages: output}}
edges: [START -> act -> END]
"#;
    let (code, out) = super::tools::validate(&[("w.yaml", text), ("define.yaml", DEFINE)]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("E217") && out.contains("`defne` is not one of the tools this node runs"),
        "{out}"
    );
    let (code, out) = super::tools::validate(&[
        ("w.yaml", &text.replace("[defne]", "[define]")),
        ("define.yaml", DEFINE),
    ]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn an_agents_problems_are_reported_once_in_the_file_as_written() {
    let text = workflow(MOCK, "    model: smrt\n    output: {schema: {type: objct}}\n");
    let (code, out) = super::tools::validate(&[("w.yaml", &text), ("define.yaml", DEFINE)]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("smrt"), "{out}");
    assert!(
        !out.contains("w.yaml#helper"),
        "nothing reported inside the generated loop: {out}"
    );
}

#[test]
fn an_agent_streams_its_models_tokens_and_its_tool_events_as_the_loops() {
    let p = Project::new(&[
        ("w.yaml", &workflow(MOCK, "    stream: true\n")),
        ("define.yaml", DEFINE),
    ]);
    let script = json!({"replies": {"helper": [
        {"tool_calls": [{"name": "define", "args": {"word": "cop"}}]},
        {"text": "A ratio.", "chunks": ["A ", "ratio."]}
    ]}});
    let (out, _, events) = run_mock(&p.plan("w.yaml"), script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let in_loop = |e: &&Value| e["ns"].as_str().is_some_and(|ns| ns.starts_with("helper:"));
    let tokens: Vec<&str> = events
        .iter()
        .filter(in_loop)
        .filter(|e| e["type"] == "token")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), "A ratio.", "{events:?}");
    let tool_ends = events
        .iter()
        .filter(in_loop)
        .filter(|e| e["type"] == "node_end" && e["node"] == "tools")
        .count();
    assert_eq!(tool_ends, 1, "{events:?}");
}
