//! Context budgeting against a fake OpenAI-compatible server on 127.0.0.1: overflow replies
//! classed as `context_length`, prompts trimmed by a node's `fit` policy before the call when a
//! profile declares its window, and trimmed harder once after an overflow reply instead of
//! being retried blindly.

use std::sync::Arc;

use crate::support::{
    self,
    fake_llm::{FakeLlm, Reply},
};
use runner::checkpoint::memory::MemoryCheckpointer;
use runner::engine::events::{Event, Events};
use runner::engine::{Engine, RunOutcome, RunRequest, Status};
use runner::error_class::ErrorClass;
use runner::providers::{ChatRequest, Message, ProviderError, Providers};
use serde_json::{Value, json};

/// llama.cpp's reply to a prompt over its window (400), as `llama-server` sends it.
fn llamacpp_overflow() -> Reply {
    Reply::json(
        400,
        json!({"error": {"code": 400, "message": "request (4148 tokens) exceeds the available context size (4096 tokens), try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 4148, "n_ctx": 4096}}),
    )
}

fn run(workflow: &str, server: &FakeLlm, input: Value) -> (RunOutcome, Vec<Event>) {
    run_in(workflow, server, input, None)
}

/// [`run`] with the default profile's window given at run time (as `--model-context` gives
/// it), which the workflow's validation never saw.
fn run_in(workflow: &str, server: &FakeLlm, input: Value, window: Option<u32>) -> (RunOutcome, Vec<Event>) {
    let project = support::Project::new(&[("w.yaml", workflow)]);
    let plan = project.plan("w.yaml");
    let base = server.base_url.clone();
    let lookup = move |name: &str| (name == "FAKE_BASE").then(|| base.clone());
    let mut models = plan.models().clone();
    if let Some(window) = window {
        models.get_mut("default").unwrap().context = Some(window);
    }
    let providers = Providers::for_models_in(&models, None, false, &lookup).unwrap();
    let (events, mut rx) = Events::channel();
    let engine = Engine::new(plan, Arc::new(MemoryCheckpointer::new()), providers, events);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let out = rt
        .block_on(engine.run(RunRequest {
            input: Some(input),
            workflow: "w.yaml".into(),
            ..RunRequest::default()
        }))
        .unwrap();
    drop(engine);
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        seen.push(e.event);
    }
    (out, seen)
}

/// The texts of a recorded request's messages.
fn contents(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn overflow_replies_of_every_server_are_context_length() {
    let server = FakeLlm::start().await;
    server.script([
        llamacpp_overflow(),
        Reply::json(500, json!({"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}})),
        Reply::json(
            400,
            json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 8425 tokens.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        ),
        // Neither is an overflow: the classes stay what they were.
        Reply::json(400, json!({"error": {"message": "no such model"}})),
        Reply::json(500, json!({"error": {"message": "boom"}})),
    ]);
    let models = indexmap::IndexMap::from([(
        "default".to_string(),
        serde_json::from_value(json!({"provider": "openai", "model": "m", "base_url": server.base_url})).unwrap(),
    )]);
    let provider = Providers::for_models_in(&models, None, false, &|_| None)
        .unwrap()
        .get("default")
        .unwrap()
        .0;
    let mut classes = Vec::new();
    for _ in 0..5 {
        let request = ChatRequest {
            node: "n".into(),
            model: "m".into(),
            messages: vec![Message::new("user", "hi")],
            ..ChatRequest::default()
        };
        let e = provider.chat(request, None).await.unwrap_err();
        if let ProviderError::ContextLength(m) = &e {
            assert!(!m.is_empty());
        }
        classes.push(e.class());
    }
    use ErrorClass::*;
    assert_eq!(
        classes,
        [ContextLength, ContextLength, ContextLength, BadRequest, Server]
    );
}

/// A model with a 300-token window, replies capped at 100 tokens: 200 left for the prompt.
const SMALL: &str =
    r#"models: {default: {provider: openai, model: m, base_url: "${env:FAKE_BASE}", context: 300, max_tokens: 100}}"#;

#[test]
fn a_prompt_over_the_declared_context_is_trimmed_by_the_fit_policy_before_the_call() {
    let server = FakeLlm::start_in_background();
    server.default_reply(Reply::completion("ok"));
    let workflow = format!(
        r#"
name: fit
{SMALL}
input: {{type: object, properties: {{doc: {{type: string}}, chat: {{type: array}}}}}}
state:
  doc: {{type: string, from_input: doc}}
  chat: {{type: array, from_input: chat}}
nodes:
  ask:
    kind: llm
    system: {{text: "You are terse."}}
    history: {{from: state.chat}}
    prompt: {{text: "Summarise: {{{{ state.doc }}}}"}}
    fit: {{truncate: {{state.doc: 50}}}}
    update: {{doc: output}}
edges: [START -> ask -> END]
"#
    );
    // Six history messages of ~100 tokens each and a document of ~500: about 1,100 tokens.
    let chat: Vec<Value> = (0..6)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("m{i} {}", "x".repeat(400))}))
        .collect();
    let doc = "word ".repeat(400);
    let (out, _) = run(&workflow, &server, json!({"doc": doc, "chat": chat}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let sent = server.requests();
    assert_eq!(sent.len(), 1);
    let texts = contents(&sent[0].body);
    // The system prompt and the prompt are kept; the document is cut to 50 tokens (200 bytes)
    // and says so; the oldest history went, the newest stayed.
    assert_eq!(texts.first().map(String::as_str), Some("You are terse."));
    let prompt = texts.last().unwrap();
    assert!(prompt.starts_with("Summarise: word"), "{prompt}");
    assert!(prompt.ends_with("…[cut]"), "{prompt}");
    assert!(prompt.len() < 260, "{}", prompt.len());
    assert!(texts.iter().any(|t| t.starts_with("m5 ")), "{texts:?}");
    assert!(!texts.iter().any(|t| t.starts_with("m0 ")), "{texts:?}");
    let bytes: usize = texts.iter().map(String::len).sum();
    assert!(
        bytes.div_ceil(4) + 4 * texts.len() <= 200,
        "{bytes} bytes in {} messages",
        texts.len()
    );
}

#[test]
fn a_prompt_that_fits_is_sent_whole() {
    let server = FakeLlm::start_in_background();
    server.default_reply(Reply::completion("ok"));
    let workflow = format!(
        r#"
name: fits
{SMALL}
input: {{type: object, properties: {{doc: {{type: string}}}}}}
state: {{doc: {{type: string, from_input: doc}}}}
nodes:
  ask: {{kind: llm, prompt: {{text: "Summarise: {{{{ state.doc }}}}"}}, fit: {{truncate: {{state.doc: 5}}}}, update: {{doc: output}}}}
edges: [START -> ask -> END]
"#
    );
    let (out, _) = run(&workflow, &server, json!({"doc": "a short note"}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(contents(&server.requests()[0].body), ["Summarise: a short note"]);
}

#[test]
fn a_completion_cap_over_a_run_time_window_is_lowered_so_prompt_and_reply_fit() {
    let server = FakeLlm::start_in_background();
    server.default_reply(Reply::completion("ok"));
    // max_tokens 8000 against a 4,096-token window given at run time: the reply keeps at most
    // half the window, so the prompt (about 1,000 tokens) is sent whole, and the cap sent is
    // what the window leaves after it.
    let workflow = r#"
name: cap
models: {default: {provider: openai, model: m, base_url: "${env:FAKE_BASE}"}}
input: {type: object, properties: {doc: {type: string}}}
state: {doc: {type: string, from_input: doc}}
nodes:
  ask:
    kind: llm
    max_tokens: 8000
    prompt: {text: "Summarise: {{ state.doc }}"}
    fit: {truncate: {state.doc: 100}}
    update: {doc: output}
edges: [START -> ask -> END]
"#;
    let doc = "word ".repeat(800);
    let (out, events) = run_in(workflow, &server, json!({"doc": doc}), Some(4096));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let sent = server.requests();
    assert_eq!(sent.len(), 1);
    let prompt = contents(&sent[0].body).concat();
    assert_eq!(prompt.len(), "Summarise: ".len() + 4000, "the prompt was cut");
    let cap = sent[0].body["max_tokens"].as_u64().unwrap();
    let estimate = (prompt.len() as u64).div_ceil(4) + 4;
    assert!(
        cap < 8000 && estimate + cap <= 4096,
        "max_tokens {cap} after a prompt of {estimate}"
    );
    assert!(cap >= 2800, "max_tokens {cap}");
    // The run says so.
    let lowered = events
        .iter()
        .find_map(|e| match e {
            Event::Custom { node, event, data } if event == "max_tokens_lowered" => Some((node.clone(), data.clone())),
            _ => None,
        })
        .expect("a max_tokens_lowered event");
    assert_eq!(lowered.0, "ask");
    assert_eq!(lowered.1["max_tokens"], 8000);
    assert_eq!(lowered.1["sent"], cap);
    assert_eq!(lowered.1["context"], 4096);
    // Named in its payload: what a client of `runner serve` receives is the payload alone.
    assert_eq!(lowered.1["event"], "max_tokens_lowered");

    // A cap that fits is sent as written, and nothing is said.
    let server = FakeLlm::start_in_background();
    server.default_reply(Reply::completion("ok"));
    let (out, events) = run_in(
        &workflow.replace("8000", "500"),
        &server,
        json!({"doc": "a note"}),
        Some(4096),
    );
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(server.requests()[0].body["max_tokens"], 500);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::Custom { event, .. } if event == "max_tokens_lowered"))
    );
}

/// A node without a declared window, its variable `state.doc` cut only after an overflow.
/// With `handled`, an `on_error` handler records the error's class.
fn overflowing(handled: bool) -> String {
    let (on_error, note, edge) = if handled {
        (
            "on_error: {to: note, update: {why: \"error.class\"}}",
            "note: {kind: set, update: {why: \"state.why ~ ' noted'\"}}",
            ", note -> END",
        )
    } else {
        ("", "", "")
    };
    format!(
        r#"
name: overflow
models: {{default: {{provider: openai, model: m, base_url: "${{env:FAKE_BASE}}"}}}}
input: {{type: object, properties: {{doc: {{type: string}}}}}}
state:
  doc: {{type: string, from_input: doc}}
  why: {{type: string, default: ""}}
nodes:
  ask:
    kind: llm
    prompt: {{text: "Summarise: {{{{ state.doc }}}}"}}
    fit: {{truncate: {{state.doc: 400}}}}
    update: {{doc: output}}
    {on_error}
  {note}
edges: [START -> ask -> END{edge}]
"#
    )
}

#[test]
fn an_overflow_reply_trims_harder_once_instead_of_a_blind_retry() {
    let server = FakeLlm::start_in_background();
    server.script([llamacpp_overflow(), Reply::completion("short")]);
    let doc = "word ".repeat(4000);
    let (out, _) = run(&overflowing(false), &server, json!({"doc": doc}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["doc"], "short");
    let sent = server.requests();
    assert_eq!(sent.len(), 2);
    let first = contents(&sent[0].body).concat().len();
    let second = contents(&sent[1].body).concat();
    assert_eq!(first, "Summarise: ".len() + 20_000);
    // Halved: 400 tokens become 200, about 800 bytes.
    assert!(second.ends_with("…[cut]") && second.len() < 900, "{}", second.len());
    // Both calls are counted, the refused one too.
    assert_eq!(out.usage.calls, 2);
}

#[test]
fn an_overflow_that_trimming_cannot_cure_fails_as_context_length_without_retries() {
    let server = FakeLlm::start_in_background();
    server.default_reply(Reply::json(
        500,
        json!({"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}),
    ));
    let doc = "word ".repeat(4000);
    let (out, events) = run(&overflowing(true), &server, json!({"doc": doc}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    // Once as written, once trimmed: never the three retries a server error gets.
    assert_eq!(server.requests().len(), 2);
    assert!(!events.iter().any(|e| matches!(e, Event::Retry { .. })));
    assert_eq!(out.state["why"], "context_length noted");
    assert_eq!(out.usage.calls, 2);
}

#[test]
fn a_schema_repair_sends_back_only_the_start_of_a_runaway_reply() {
    let server = FakeLlm::start_in_background();
    let runaway = format!("{{\"title\": \"{}", "la ".repeat(5000));
    server.script([Reply::completion(&runaway), Reply::completion(r#"{"title": "Short"}"#)]);
    let workflow = r#"
name: repair
models: {default: {provider: openai, model: m, base_url: "${env:FAKE_BASE}"}}
state: {title: {type: string, default: ""}}
nodes:
  name_it:
    kind: llm
    prompt: {text: "Name it"}
    output: {format: json, schema: {type: object, properties: {title: {type: string, maxLength: 40}}, required: [title]}}
    update: {title: output.title}
edges: [START -> name_it -> END]
"#;
    let (out, _) = run(workflow, &server, json!({}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["title"], "Short");
    let sent = server.requests();
    assert_eq!(sent.len(), 2);
    let texts = contents(&sent[1].body);
    let echoed = &texts[texts.len() - 2];
    assert!(echoed.starts_with("{\"title\": \"la la"), "{echoed}");
    assert!(echoed.len() < 1100, "{} bytes sent back", echoed.len());
    assert!(texts.last().unwrap().contains("cut to its first"), "{texts:?}");
    assert_eq!(out.usage.calls, 2);
}
