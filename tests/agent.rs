//! The `agent` kind: the ReAct loop compiled into a child plan of llm → tools → route, run
//! against the fake OpenAI-compatible server (parallel calls, what the model is sent back) and
//! the mock provider (`max_iterations`, a structured final answer), checked at validate time,
//! drawn by `runner graph`, and killed between a round of tool calls and the next model call.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runner::checkpoint::Checkpointer;
use runner::checkpoint::memory::MemoryCheckpointer;
use runner::compile::Plan;
use runner::engine::events::Events;
use runner::engine::{Engine, RunOutcome, RunRequest, START_TASK, Status, message_id, task_id};
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
    let providers = Providers::for_models_in(plan.models(), Some(mock.clone()), true, &|_| None).unwrap();
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

/// The id of the task that ran `node` in `step` of the loop of `thread`'s agent `helper`: the
/// loop runs on the child thread of the agent's task (`<thread>/<step>/<task>`), which ran in
/// step 1.
fn loop_task(thread: &str, node: &str, step: i64) -> String {
    let child = format!("{thread}/1/{}", task_id(thread, "helper", 1, 0, None));
    task_id(&child, node, step, 0, None)
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
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let engine = Engine::new(plan.clone(), store.clone(), providers, events);
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
    // The question has the id its writer, the turn's `__start__` task, gave it. Each of the
    // loop's messages keeps the id the loop gave it, from the loop's task that wrote it (on
    // the agent's child thread): the model's turns, then the round's two tool results.
    let history = store.history(&out.thread_id).unwrap();
    let input = history.last().unwrap();
    assert_eq!(input.next.len(), 1);
    assert_eq!(input.next[0].node, START_TASK);
    let in_loop = |node: &str, step: i64| message_id(&loop_task(&out.thread_id, node, step));
    assert_eq!(
        ids,
        [
            format!("{}:1", message_id(&input.next[0].task_id)),
            in_loop("helper", 1),
            format!("{}:1", in_loop("tools", 2)),
            format!("{}:2", in_loop("tools", 2)),
            in_loop("helper", 3),
        ]
    );
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

/// Reviewed calls stop the run once, together, with the shapes of LangChain's
/// human-in-the-loop review (what agent-chat-ui shows and answers); no call runs until every
/// one is decided; an edit runs with the edited arguments and says so to the model, a reject
/// is an error result marked as LangChain marks it, a response goes back to the model as the
/// call's result, and a malformed decision is refused with the gate kept.
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
        "replies:\n  helper:\n    - {tool_calls: [{name: define, args: {word: cop}}, {name: erase, args: {word: x}}, \
         {name: erase, args: {word: y}}, {name: erase, args: {word: w}}]}\n    - \"done\"\n",
    )
    .unwrap();
    let base = ["--mock", "mock.yaml", "--db", "r.db", "--stream", "jsonl"];
    let (code, out, err) = cli(
        d,
        &[&["run", "w.yaml", "--thread", "t1", "--input", "q=cop"][..], &base].concat(),
    );
    assert_eq!(code, 3, "{err}");
    // The loop's gate, reported through the agent's task as a subgraph's is: one request for
    // the three reviewed calls, in call order; `define` is not reviewed.
    assert_eq!(out["interrupt"]["node"], "helper", "{out}");
    assert_eq!(out["interrupt"]["payload"]["node"], "tools", "{out}");
    let payload = &out["interrupt"]["payload"]["payload"];
    let requested: Vec<(&Value, &Value)> = payload["action_requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (&r["name"], &r["args"]))
        .collect();
    assert_eq!(
        requested,
        [
            (&json!("erase"), &json!({"word": "x"})),
            (&json!("erase"), &json!({"word": "y"})),
            (&json!("erase"), &json!({"word": "w"}))
        ],
        "{out}"
    );
    assert!(
        payload["action_requests"][0]["description"]
            .as_str()
            .is_some_and(|d| d.contains("erase")),
        "{out}"
    );
    let config = json!({"action_name": "erase", "allowed_decisions": ["approve", "edit", "reject", "respond"]});
    assert_eq!(payload["review_configs"], json!([config, config, config]), "{out}");
    let mut say = started(&err, "say");
    assert_eq!(say, 0, "no call runs before every reviewed call is decided");

    let resume = |answer: &str| {
        cli(
            d,
            &[&["resume", "--thread", "t1", "--answer", answer][..], &base].concat(),
        )
    };
    // Refused before anything runs, the gate kept: a decision of no known type, and an edit
    // without the edited call.
    let (code, _, err) = resume(r#"{"decisions": [{"type": "maybe"}, {"type": "approve"}, {"type": "approve"}]}"#);
    assert_eq!(code, 2, "a decision of no known type is refused: {err}");
    say += started(&err, "say");
    let (code, _, err) = resume(r#"{"decisions": [{"type": "edit"}, {"type": "approve"}, {"type": "approve"}]}"#);
    assert_eq!(code, 2, "an edit needs the edited call: {err}");
    say += started(&err, "say");
    // Nor may an answer decide fewer calls than were asked about: Agent Inbox's single
    // response, or a list one short. (Stored, it would fail the loop on every resume.)
    for short in [
        r#"{"type": "accept"}"#,
        r#"{"decisions": [{"type": "approve"}, {"type": "approve"}]}"#,
    ] {
        let (code, _, err) = resume(short);
        assert_eq!(code, 2, "{short}: {err}");
        assert!(err.contains("the review has 3 calls to decide"), "{short}: {err}");
        say += started(&err, "say");
    }
    assert_eq!(say, 0);
    // A new process replays the script from its start: the model's next reply is its answer.
    std::fs::write(d.join("mock.yaml"), "replies:\n  helper: [\"done\"]\n").unwrap();
    let (code, out, err) = resume(
        r#"{"decisions": [
            {"type": "edit", "edited_action": {"name": "erase", "args": {"word": "z"}}},
            {"type": "reject", "message": "Not that one."},
            {"type": "respond", "message": "Nothing to erase."}
        ]}"#,
    );
    assert_eq!(code, 0, "{out} {err}");
    say += started(&err, "say");
    assert_eq!(say, 2, "define and the edited erase ran once each");
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(
        roles(&out["messages"]),
        ["user", "assistant", "tool", "tool", "tool", "tool", "assistant"]
    );
    let content = |i: usize| messages[i]["content"].as_str().unwrap().to_string();
    assert!(content(2).contains("cop means a ratio"), "{}", content(2));
    assert_eq!(messages[2]["status"], "success");
    // The edit ran with the person's arguments, and its result tells the model so.
    assert!(
        content(3).starts_with("A person reviewing your call changed it before it ran")
            && content(3).contains("z means a ratio")
            && !content(3).contains("x means a ratio"),
        "the edited arguments: {}",
        content(3)
    );
    assert_eq!(messages[3]["status"], "success");
    // The reject ran nothing: an error result with the reason, marked as LangChain marks it.
    assert!(content(4).contains("Not that one."), "{}", content(4));
    assert_eq!(messages[4]["status"], "error");
    assert_eq!(messages[4]["additional_kwargs"]["lc_source"], "hitl_interrupt_decision");
    // The response is the call's result as the person wrote it.
    assert_eq!(content(5), "Nothing to erase.");
    assert_eq!(messages[5]["status"], "success");
    let call_ids: Vec<&Value> = messages[2..6].iter().map(|m| &m["tool_call_id"]).collect();
    let made: Vec<&Value> = messages[1]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["id"])
        .collect();
    assert_eq!(call_ids, made, "one result per call, in call order");
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
    let tokens: Vec<&Value> = events.iter().filter(in_loop).filter(|e| e["type"] == "token").collect();
    let text: String = tokens.iter().map(|e| e["text"].as_str().unwrap()).collect();
    assert_eq!(text, "A ratio.", "{events:?}");
    // The pieces carry the id the streamed reply has in the parent's history, as a client that
    // joins streamed and stored messages by id needs.
    let streamed: Vec<&str> = tokens.iter().map(|e| e["message_id"].as_str().unwrap()).collect();
    let stored = out.state["messages"].as_array().unwrap().last().unwrap()["id"].clone();
    assert_eq!(stored, message_id(&loop_task(&out.thread_id, "helper", 3)).as_str());
    assert!(streamed.iter().all(|id| *id == stored), "{streamed:?} vs {stored}");
    let tool_ends = events
        .iter()
        .filter(in_loop)
        .filter(|e| e["type"] == "node_end" && e["node"] == "tools")
        .count();
    assert_eq!(tool_ends, 1, "{events:?}");
}

// ── the seeds' agents, recorded against fake servers ──────────────────────────────────────

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A plain OpenAI chat completion answering `text`.
fn says(text: &str) -> Reply {
    Reply::completion(text)
}

/// A run of a shipped workflow against the fake OpenAI-compatible server (`replies`, answered in
/// order: each seed's recording has one agent, so its calls come in one order) and the fake
/// search engine and site. Returns the run's output, the requests the model server got and the
/// cassette with the site's port rewritten to SearxNG's default (`127.0.0.1:8888`), which is
/// where the workflows look when `SEARXNG_URL` is unset, as it is under `runner test`.
fn record_seed(
    workflow: &str,
    args: &[&str],
    replies: impl FnOnce(&fake_web::FakeWeb) -> Vec<Reply>,
) -> (Value, Vec<Value>, String) {
    let site = fake_web::start("");
    let server = FakeLlm::start_in_background();
    let replies = replies(&site);
    let scripted = replies.len();
    server.script(replies);
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("seed.jsonl");
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(ROOT)
        .env_remove("RUNNER_ALLOW_NET")
        .env_remove("RUNNER_MODEL")
        .env("SEARXNG_URL", site.base())
        .env("RUNNER_BASE_URL", &server.base_url)
        .env("OPENAI_API_KEY", "sk-fake-0123456789")
        .args(["run", workflow, "--db", ":memory:", "--allow-net", "127.0.0.1"])
        .args(["--record", cassette.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let output: Value = serde_json::from_slice(&out.stdout).unwrap();
    let requests: Vec<Value> = server
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/chat/completions"))
        .map(|r| r.body)
        .collect();
    assert_eq!(requests.len(), scripted, "every scripted reply was asked for: {stderr}");
    // `runner test` serves every profile from the case's replies and asks with the model as
    // the workflow writes it, unexpanded: the recorded calls name it so.
    let text = std::fs::read_to_string(&cassette)
        .unwrap()
        .replace(&format!("127.0.0.1:{}", site.port), "127.0.0.1:8888")
        .replace(
            r#""model":"gpt-4o-mini""#,
            r#""model":"${env:RUNNER_MODEL:-gpt-4o-mini}""#,
        );
    (output, requests, text)
}

/// The messages of a request, as text, to find what the model was sent.
fn sent(request: &Value) -> String {
    request["messages"].to_string()
}

/// The offered tools' names of a request.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// deep-research's research subgraph: one task, whose agent searches, reads two pages (one
/// robots.txt forbids) and answers from the one it could read.
fn record_deep_research() -> (Value, Vec<Value>, String) {
    record_seed(
        "workflows/deep-research/research.yaml",
        &["--input-file", "tests/fixtures/input/deep-research-research.json"],
        |site| {
            let cop = site.url("/articles/cop");
            let private = site.url("/private/secret");
            vec![
                says(&json!({"tasks": [{"id": "t1", "title": "COP", "question": "What COP do heat pumps reach?",
                    "search_queries": ["heat pump COP"], "rationale": "core"}], "notes": "One task."}).to_string()),
                tool_calls(&[("web_search", json!({"query": "heat pump COP"}))]),
                tool_calls(&[("read_pages", json!({"urls": [cop, private]}))]),
                says("The COP article answers the question."),
                says(&json!({"answer": format!("Air-source heat pumps reach a COP of three to four in mild weather [{cop}]."),
                    "key_findings": [{"claim": "COP of three to four in mild weather", "sources": [cop], "strength": "strong"}],
                    "sources": [cop], "confidence": "medium", "gaps": ["COP at -15C"]}).to_string()),
                says(&json!({"approved": true, "assessment": "Answered with one source.", "gaps": [],
                    "follow_up_questions": []}).to_string()),
                says(&json!({"findings": [{"id": "f1", "claim": "COP of three to four in mild weather",
                    "sources": [cop], "confidence": "medium", "task_ids": ["t1"]}],
                    "discovery": "Heat pumps deliver three to four times the heat of the electricity they use.",
                    "sources": [cop], "open_questions": ["COP at -15C"]}).to_string()),
            ]
        },
    )
}

/// slides: a plan with one researcher step, whose one worker searches twice and answers.
fn record_slides() -> (Value, Vec<Value>, String) {
    record_seed(
        "workflows/slides.yaml",
        &["--input", "request=A deck on heat pump efficiency"],
        |site| {
            let heat = site.url("/articles/heat-pumps");
            let seasonal = site.url("/articles/seasonal");
            vec![
                says(&json!({"action": "handoff_to_planner", "response": "On it.", "brief": "Research, then a deck."}).to_string()),
                says(&json!({"steps": [{"id": 1, "role": "researcher", "instruction": "Find heat pump efficiency figures.",
                    "description": "Research", "status": "pending", "result_summary": null}]}).to_string()),
                says(&json!({"tasks": [{"id": "task1", "focus": "Efficiency figures", "search_queries": ["heat pump efficiency"]}]}).to_string()),
                tool_calls(&[("web_search", json!({"query": "heat pump efficiency"}))]),
                tool_calls(&[("web_search", json!({"query": "heat pump SCOP"}))]),
                says("The results cover the focus."),
                says(&json!({"summary": "Heat pumps move heat; field SCOP is 2.5 to 3.5.",
                    "findings": [{"fact": "Heat pumps move heat rather than make it.", "source": heat, "date": null},
                                 {"fact": "Field trials measured SCOP of 2.5 to 3.5.", "source": seasonal, "date": null}],
                    "sources": [heat, seasonal]}).to_string()),
                says(&json!({"summary": "Heat pumps are efficient: SCOP 2.5 to 3.5 in the field.",
                    "themes": [{"title": "Efficiency", "facts": [{"fact": "SCOP 2.5 to 3.5", "source": seasonal}]}],
                    "headline_messages": ["Three units of heat per unit of power"], "sources": [heat, seasonal], "gaps": []}).to_string()),
            ]
        },
    )
}

#[test]
fn the_deep_research_task_agent_searches_and_reads_pages_with_its_tools() {
    let (output, requests, cassette) = record_deep_research();
    // The agent's model turns are offered both tools and get each tool's result back.
    let agent: Vec<&Value> = requests.iter().filter(|r| !offered(r).is_empty()).collect();
    assert_eq!(agent.len(), 3, "three turns of the task agent");
    assert_eq!(offered(agent[0]), ["web_search", "read_pages"]);
    assert!(
        sent(agent[1]).contains("/articles/cop"),
        "the search results reach the model"
    );
    let read = sent(agent[2]);
    assert!(
        read.contains("coefficient of performance (COP)"),
        "the page's text reaches the model: {read}"
    );
    assert!(read.contains("robots.txt"), "an unreadable page is reported: {read}");
    // As its URL and reason only: a timestamp in a prompt would make every replay differ.
    assert!(
        !read.contains("\\\"at\\\""),
        "no error record's time reaches the model: {read}"
    );
    assert!(!read.contains("Celebrity homes"), "boilerplate is stripped");
    // Each page's text is cut to the tool's bound, whatever the page's length.
    let tool_msg = agent[2]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap();
    let pages: Value = serde_json::from_str(tool_msg["content"].as_str().unwrap()).unwrap();
    for p in pages["pages"].as_array().unwrap() {
        assert!(p["content"].as_str().unwrap().chars().count() <= 3000, "{p}");
    }
    assert_eq!(output["findings"][0]["task_ids"], json!(["t1"]));
    // The cassette holds the model calls and every web exchange of the tools.
    assert!(
        cassette.contains("http://127.0.0.1:8888/search?"),
        "the search is recorded"
    );
    assert!(
        cassette.contains("\"node\":\"task_agent\""),
        "the agent's turns are recorded"
    );
}

#[test]
fn each_slides_research_worker_searches_with_its_own_tool_calls() {
    let (output, requests, _) = record_slides();
    let worker: Vec<&Value> = requests.iter().filter(|r| !offered(r).is_empty()).collect();
    assert_eq!(worker.len(), 3, "three turns of the worker");
    assert_eq!(offered(worker[0]), ["web_search"]);
    assert!(
        sent(worker[2]).contains("Seasonal performance"),
        "the second search's results reach the model"
    );
    let plan = output["plan"].as_array().unwrap();
    assert_eq!(plan[0]["status"], "complete");
    assert_eq!(
        output["artifacts"]["step_1_research"]["headline_messages"][0],
        "Three units of heat per unit of power"
    );
}

/// Re-records the seed agents' cassettes that `workflows/deep-research/research.test.yaml`
/// and `workflows/slides.test.yaml` replay.
/// Run with `cargo test --test integration -- --ignored agent::record_the_seed_agent_cassettes`.
#[test]
#[ignore = "writes committed fixtures"]
fn record_the_seed_agent_cassettes() {
    let dir = std::path::Path::new(ROOT).join("tests/fixtures/cassettes");
    std::fs::write(dir.join("deep-research-agents.jsonl"), record_deep_research().2).unwrap();
    std::fs::write(dir.join("slides-researcher.jsonl"), record_slides().2).unwrap();
}

/// The seeds' agents stay within what a small local model holds: each caps its replies
/// (`max_tokens`) and its rounds of tool calls (`max_iterations`), and every argument its tools
/// take is bounded (a string by `maxLength`, a list by `maxItems`).
#[test]
fn the_seed_agents_bound_their_turns_and_their_tools_arguments() {
    fn bounded(schema: &Value, at: &str) {
        if let Some(m) = schema.as_object() {
            match m.get("type").and_then(Value::as_str) {
                Some("string") => assert!(m.contains_key("maxLength"), "{at}: a string without maxLength"),
                Some("array") => assert!(m.contains_key("maxItems"), "{at}: a list without maxItems"),
                _ => {}
            }
            for (k, v) in m {
                bounded(v, &format!("{at}/{k}"));
            }
        }
    }
    let root = std::path::Path::new(ROOT);
    let mut agents = 0;
    for file in [
        "workflows/deep-research/research.yaml",
        "workflows/slides/researcher.yaml",
    ] {
        let doc = runner::spec::load::parse(runner::spec::load::read(&root.join(file)).unwrap()).unwrap();
        let tools = &doc.value["tools"];
        for (name, node) in doc.value["nodes"].as_object().unwrap() {
            if node["kind"] != "agent" {
                continue;
            }
            agents += 1;
            assert!(
                node.get("max_tokens").is_some(),
                "{file}: agent `{name}` has no max_tokens"
            );
            assert!(
                node.get("max_iterations").is_some(),
                "{file}: agent `{name}` has no max_iterations"
            );
            for tool in node["tools"].as_array().unwrap() {
                let def = &tools[tool.as_str().unwrap()];
                let args = match def.get("workflow").and_then(Value::as_str) {
                    Some(w) => {
                        let path = root.join(file).parent().unwrap().join(w);
                        let child = runner::spec::load::parse(runner::spec::load::read(&path).unwrap()).unwrap();
                        child.value["input"].clone()
                    }
                    None => def["args"].clone(),
                };
                assert!(args.is_object(), "{file}: tool {tool} declares its arguments");
                bounded(&args, &format!("{file}: tool {tool}"));
            }
        }
    }
    assert_eq!(agents, 2, "one agent in each seed's research subgraph");
}
