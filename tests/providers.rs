//! The real model providers against a fake server on 127.0.0.1: streaming, non-streamed
//! replies, structured output, tool calls, embeddings, Anthropic's Messages API, every error
//! class, the per-call deadline, the key kept out of every message, and whole runs (in process
//! and through the binary) that stream, retry and fan out.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{
    self,
    fake_llm::{FakeLlm, Reply, chunk, event},
};
use runner::checkpoint::memory::MemoryCheckpointer;
use runner::engine::events::{Event, Events};
use runner::engine::{Engine, RunOutcome, RunRequest, Status};
use runner::providers::{ChatRequest, Message, Provider, ProviderError, Providers, SetupError, Usage};
use runner::spec::ModelProfile;
use serde_json::{Value, json};

/// A key no test output may ever show.
const KEY: &str = "sk-test-Zq8vJ3kPp0wLx7";

fn env(name: &str) -> Option<String> {
    (name == "FAKE_KEY").then(|| KEY.to_string())
}

fn profile(fields: Value) -> ModelProfile {
    serde_json::from_value(fields).unwrap()
}

/// The provider of a single profile.
fn provider_for(p: ModelProfile) -> Arc<dyn Provider> {
    let models = indexmap::IndexMap::from([("default".to_string(), p)]);
    let providers = Providers::for_models_in(&models, None, false, &env).unwrap();
    providers.get("default").unwrap().0
}

fn openai(server: &FakeLlm) -> Arc<dyn Provider> {
    provider_for(profile(
        json!({"provider": "openai", "model": "gpt-test", "base_url": server.base_url, "api_key_env": "FAKE_KEY"}),
    ))
}

fn ask(text: &str, stream: bool) -> ChatRequest {
    ChatRequest {
        node: "n".into(),
        model: "gpt-test".into(),
        messages: vec![Message::new("system", "Be brief."), Message::new("user", text)],
        stream,
        ..ChatRequest::default()
    }
}

/// Calls `provider`, collecting streamed tokens with the time each arrived.
async fn call(
    provider: &dyn Provider,
    request: ChatRequest,
) -> (
    Result<runner::providers::ChatResponse, ProviderError>,
    Vec<(String, Instant)>,
) {
    let seen = Mutex::new(Vec::new());
    let sink = |t: &str| seen.lock().unwrap().push((t.to_string(), Instant::now()));
    let result = provider.chat(request, Some(&sink)).await;
    (result, seen.into_inner().unwrap())
}

fn texts(tokens: &[(String, Instant)]) -> Vec<&str> {
    tokens.iter().map(|(t, _)| t.as_str()).collect()
}

#[tokio::test]
async fn tokens_stream_as_they_arrive_with_usage_and_the_request_asks_for_it() {
    let server = FakeLlm::start().await;
    server.script([Reply::stream(&["Hel", "lo", " world"]).gap(Duration::from_millis(60))]);
    let started = Instant::now();
    let (reply, tokens) = call(&*openai(&server), ask("hi", true)).await;
    let reply = reply.unwrap();
    assert_eq!(reply.text, "Hello world");
    assert_eq!(texts(&tokens), ["Hel", "lo", " world"]);
    // The first token came well before the stream ended: tokens are passed on as they arrive.
    assert!(tokens[0].1.duration_since(started) < started.elapsed() - Duration::from_millis(150));
    assert_eq!(reply.usage, Usage::tokens(5, 3));
    assert_eq!(reply.finish_reason.as_deref(), Some("stop"));
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent.body["model"], "gpt-test");
    assert_eq!(
        sent.body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert!(sent.body.get("response_format").is_none());
}

#[tokio::test]
async fn runs_share_their_connections_to_the_model_server() {
    let server = FakeLlm::start().await;
    server.default_reply(Reply::completion("ok"));
    // Each run builds its providers from the workflow's profiles: two runs, one after the
    // other, as a server's runs or a test file's cases are.
    for _ in 0..2 {
        let (reply, _) = call(&*openai(&server), ask("hi", false)).await;
        assert_eq!(reply.unwrap().text, "ok");
    }
    assert_eq!(server.requests().len(), 2);
    assert_eq!(server.connections(), 1, "the second run opened a connection of its own");
}

#[tokio::test]
async fn keep_alives_crlf_and_events_split_across_network_chunks_are_read() {
    let server = FakeLlm::start().await;
    let whole = chunk(json!({"content": "split across writes"}), None).replace('\n', "\r\n");
    let (a, b) = whole.split_at(25);
    server.script([Reply::sse(&[
        ": keep-alive\r\n\r\n",
        a,
        b,
        ":\n\n",
        &chunk(json!({"content": "!"}), Some("stop")),
        "data: [DONE]\n\n",
    ])
    .gap(Duration::from_millis(20))]);
    let (reply, tokens) = call(&*openai(&server), ask("hi", true)).await;
    assert_eq!(reply.unwrap().text, "split across writes!");
    assert_eq!(texts(&tokens), ["split across writes", "!"]);
}

#[tokio::test]
async fn non_streamed_replies_and_replies_without_usage_or_content() {
    let server = FakeLlm::start().await;
    server.script([
        Reply::completion("Whole reply."),
        Reply::json(
            200,
            json!({"choices": [{"message": {"content": null}, "finish_reason": "content_filter"}], "extra": true}),
        ),
        // A stream without usage, ended by its finish reason alone.
        Reply::sse(&[
            &chunk(json!({"content": "ok"}), None),
            &chunk(json!({}), Some("length")),
        ]),
    ]);
    let p = openai(&server);
    let (reply, tokens) = call(&*p, ask("hi", false)).await;
    let reply = reply.unwrap();
    assert_eq!(reply.text, "Whole reply.");
    assert!(tokens.is_empty(), "a non-streamed call sends no tokens");
    assert_eq!(reply.usage, Usage::tokens(11, 7));
    assert_eq!(server.requests()[0].body["stream"], false);
    assert!(server.requests()[0].body.get("stream_options").is_none());

    let (reply, _) = call(&*p, ask("hi", false)).await;
    let reply = reply.unwrap();
    assert_eq!(reply.text, "");
    assert_eq!(reply.finish_reason.as_deref(), Some("content_filter"));
    assert_eq!((reply.usage.total_tokens, reply.usage.calls), (0, 1));

    let (reply, _) = call(&*p, ask("hi", true)).await;
    let reply = reply.unwrap();
    assert_eq!(
        (reply.text.as_str(), reply.finish_reason.as_deref()),
        ("ok", Some("length"))
    );
    assert_eq!((reply.usage.total_tokens, reply.usage.calls), (0, 1));
}

#[tokio::test]
async fn a_schema_is_sent_as_response_format_and_dropped_when_the_server_refuses_it() {
    let server = FakeLlm::start().await;
    server.script([
        Reply::json(
            400,
            json!({"error": {"message": "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model."}}),
        ),
        Reply::completion("{\"a\": 1}"),
    ]);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let mut request = ask("give json", false);
    request.json_schema = Some(schema.clone());
    let (reply, _) = call(&*openai(&server), request).await;
    assert_eq!(reply.unwrap().text, "{\"a\": 1}");
    let sent = server.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0].body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": false}})
    );
    assert!(sent[1].body.get("response_format").is_none());
    // The retry tells the model the schema in words instead.
    let system = sent[1].body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.starts_with("Be brief.") && system.contains("\"integer\""),
        "{system}"
    );

    // Any other 400 is not retried.
    server.script([Reply::json(400, json!({"error": {"message": "model not found"}}))]);
    let mut request = ask("give json", false);
    request.json_schema = Some(schema);
    let (reply, _) = call(&*openai(&server), request).await;
    assert!(matches!(reply, Err(ProviderError::BadRequest(m)) if m.contains("model not found")));
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn tools_pass_through_and_streamed_tool_call_deltas_assemble() {
    let server = FakeLlm::start().await;
    let call_delta = |v: Value| chunk(json!({"tool_calls": [v]}), None);
    server.script([Reply::sse(&[
        &chunk(json!({"role": "assistant", "content": null}), None),
        &call_delta(
            json!({"index": 0, "id": "call_a", "type": "function", "function": {"name": "weather", "arguments": ""}}),
        ),
        &call_delta(json!({"index": 0, "function": {"arguments": "{\"city\": "}})),
        &call_delta(json!({"index": 0, "function": {"arguments": "\"Oslo\"}"}})),
        &chunk(json!({}), Some("tool_calls")),
        "data: [DONE]\n\n",
    ])]);
    let mut request = ask("weather in Oslo?", true);
    let tools = json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]);
    request.options.insert("tools".into(), tools.clone());
    request.options.insert("tool_choice".into(), json!("auto"));
    let (reply, tokens) = call(&*openai(&server), request).await;
    let reply = reply.unwrap();
    assert!(tokens.is_empty());
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        reply.tool_calls,
        vec![
            json!({"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}})
        ]
    );
    let sent = &server.requests()[0].body;
    assert_eq!((&sent["tools"], &sent["tool_choice"]), (&tools, &json!("auto")));
}

#[tokio::test]
async fn statuses_and_bad_bodies_are_typed() {
    let server = FakeLlm::start().await;
    let in_a_minute = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(60));
    server.script([
        Reply::json(429, json!({"error": {"message": "slow down"}})).header("retry-after", "3"),
        Reply::json(429, json!({})).header("retry-after", &in_a_minute),
        Reply::json(500, json!({"error": {"message": "boom"}})),
        Reply::raw(503, "upstream unavailable"),
        Reply::json(401, json!({"error": {"message": "no key"}})),
        Reply::json(403, json!({"error": {"message": "forbidden"}})),
        Reply::json(404, json!({"error": {"message": "no such model"}})),
        Reply::raw(200, "this is not json"),
        Reply::sse(&["data: {not json\n\n"]),
        Reply::sse(&["data: {\"error\": {\"message\": \"overloaded mid-stream\"}}\n\n"]),
    ]);
    let p = openai(&server);
    let mut results = Vec::new();
    for stream in [false, false, false, false, false, false, false, false, true, true] {
        results.push(call(&*p, ask("hi", stream)).await.0.unwrap_err());
    }
    assert_eq!(results[0], ProviderError::RateLimited { retry_after: Some(3.0) });
    match results[1] {
        ProviderError::RateLimited { retry_after: Some(s) } => assert!((55.0..=60.0).contains(&s), "{s}"),
        ref other => panic!("{other:?}"),
    }
    assert_eq!(
        results[2],
        ProviderError::Server {
            status: 500,
            message: "boom".into()
        }
    );
    assert!(matches!(&results[3], ProviderError::Server { status: 503, message } if message == "upstream unavailable"));
    assert!(matches!(&results[4], ProviderError::Auth(m) if m.contains("no key")));
    assert!(matches!(&results[5], ProviderError::Auth(m) if m.contains("forbidden")));
    assert!(matches!(&results[6], ProviderError::BadRequest(m) if m.contains("404") && m.contains("no such model")));
    assert!(matches!(&results[7], ProviderError::Malformed(m) if m.contains("this is not json")));
    assert!(matches!(&results[8], ProviderError::Malformed(_)), "{:?}", results[8]);
    assert!(matches!(&results[9], ProviderError::Server { message, .. } if message.contains("overloaded mid-stream")));
}

#[tokio::test]
async fn a_refused_connection_is_a_network_error() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let p = provider_for(profile(
        json!({"provider": "openai", "model": "m", "base_url": format!("http://{addr}/v1")}),
    ));
    let (reply, _) = call(&*p, ask("hi", true)).await;
    assert!(matches!(reply, Err(ProviderError::Network(_))), "{reply:?}");
}

#[tokio::test]
async fn the_profile_timeout_bounds_each_call() {
    let server = FakeLlm::start().await;
    server.script([
        Reply::completion("late").after(Duration::from_secs(2)),
        // Headers come at once, but the stream stalls.
        Reply::stream(&["a", "b", "c"]).gap(Duration::from_secs(1)),
    ]);
    let p = provider_for(profile(
        json!({"provider": "openai", "model": "m", "base_url": server.base_url, "timeout": "300ms"}),
    ));
    for stream in [false, true] {
        let started = Instant::now();
        let (reply, _) = call(&*p, ask("hi", stream)).await;
        assert_eq!(reply, Err(ProviderError::Timeout));
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn a_stream_cut_mid_way_is_an_error_never_a_partial_reply() {
    let server = FakeLlm::start().await;
    server.script([
        // The connection breaks after two text chunks.
        Reply::stream(&["Hal", "f a", " reply"]).cut_after(3),
        // The body ends cleanly, but with neither finish_reason nor [DONE].
        Reply::stream(&["Hal", "f a", " reply"]).end_after(3),
        Reply::anthropic_stream(&["Hal", "f"]).cut_after(5),
    ]);
    let p = openai(&server);
    for _ in 0..2 {
        let (reply, tokens) = call(&*p, ask("hi", true)).await;
        assert!(matches!(reply, Err(ProviderError::StreamCut(_))), "{reply:?}");
        assert_eq!(texts(&tokens), ["Hal", "f a"]);
    }
    let (reply, _) = call(&*anthropic(&server), ask("hi", true)).await;
    assert!(matches!(reply, Err(ProviderError::StreamCut(_))), "{reply:?}");
}

#[tokio::test]
async fn the_key_never_appears_in_an_error_message() {
    let server = FakeLlm::start().await;
    // Servers do echo keys back.
    server.script([
        Reply::json(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {KEY}.")}}),
        ),
        Reply::raw(500, &format!("internal error handling key={KEY}")),
        Reply::raw(400, &format!("bad request from {KEY}")),
        Reply::sse(&[&format!("data: {{\"broken {KEY}\n\n")]),
    ]);
    let p = openai(&server);
    for stream in [false, false, false, true] {
        let e = call(&*p, ask("hi", stream)).await.0.unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains(KEY), "{text}");
        assert!(text.contains("***"), "{text}");
    }
    // Nor does the provider's debug output.
    assert!(
        !format!(
            "{:?}",
            Providers::for_models_in(&models_of(&p_openai(&server)), None, false, &env).unwrap()
        )
        .contains(KEY)
    );
}

fn p_openai(server: &FakeLlm) -> ModelProfile {
    profile(json!({"provider": "openai", "model": "m", "base_url": server.base_url, "api_key_env": "FAKE_KEY"}))
}

fn models_of(p: &ModelProfile) -> indexmap::IndexMap<String, ModelProfile> {
    indexmap::IndexMap::from([("default".to_string(), p.clone())])
}

#[tokio::test]
async fn keys_come_from_the_named_variable_and_local_servers_need_none() {
    let server = FakeLlm::start().await;
    let missing = profile(
        json!({"provider": "openai", "model": "m", "base_url": server.base_url, "api_key_env": "NOT_SET_ANYWHERE"}),
    );
    let e = Providers::for_models_in(&models_of(&missing), None, false, &env).unwrap_err();
    assert!(matches!(&e, SetupError::MissingKey { var, .. } if var == "NOT_SET_ANYWHERE"));
    assert!(e.to_string().contains("`NOT_SET_ANYWHERE`"), "{e}");
    // OpenAI's own API and Anthropic's default to their usual variables.
    for p in [
        json!({"provider": "openai", "model": "m"}),
        json!({"provider": "anthropic", "model": "m"}),
    ] {
        let e = Providers::for_models_in(&models_of(&profile(p)), None, false, &|_| None).unwrap_err();
        assert!(e.to_string().contains("_API_KEY`"), "{e}");
    }
    // A local server without `api_key_env` is called without a key.
    server.script([Reply::completion("local")]);
    let keyless = provider_for(profile(
        json!({"provider": "openai", "model": "m", "base_url": server.base_url}),
    ));
    assert_eq!(call(&*keyless, ask("hi", false)).await.0.unwrap().text, "local");
    assert!(!server.requests()[0].headers.contains_key("authorization"));
}

#[tokio::test]
async fn profile_fields_expand_environment_variables() {
    let server = FakeLlm::start().await;
    let base = server.base_url.clone();
    let lookup = move |name: &str| match name {
        "FAKE_BASE" => Some(base.clone()),
        _ => env(name),
    };
    let p = profile(
        json!({"provider": "openai", "model": "${env:RUNNER_MODEL_UNSET:-small-model}", "base_url": "${env:FAKE_BASE}", "api_key_env": "FAKE_KEY"}),
    );
    let providers = Providers::for_models_in(&models_of(&p), None, false, &lookup).unwrap();
    let (provider, resolved) = providers.get("default").unwrap();
    assert_eq!(resolved.model, "small-model");
    server.script([Reply::completion("ok")]);
    let mut request = ask("hi", false);
    request.model = resolved.model.clone();
    assert_eq!(call(&*provider, request).await.0.unwrap().text, "ok");
    assert_eq!(server.requests()[0].body["model"], "small-model");
    let bad = profile(json!({"provider": "openai", "model": "${env:NOPE}", "base_url": "http://x"}));
    let e = Providers::for_models_in(&models_of(&bad), None, false, &lookup).unwrap_err();
    assert!(e.to_string().contains("`NOPE`"), "{e}");
}

#[tokio::test]
async fn azure_deployments_take_the_version_and_an_api_key_header() {
    let server = FakeLlm::start().await;
    let base = server.base_url.trim_end_matches("/v1").to_string();
    server.script([Reply::completion("azure")]);
    let p = provider_for(profile(
        json!({"provider": "openai", "model": "my-gpt4o", "base_url": base, "api_key_env": "FAKE_KEY", "api_version": "2024-10-21"}),
    ));
    let mut request = ask("hi", false);
    request.model = "my-gpt4o".into();
    assert_eq!(call(&*p, request).await.0.unwrap().text, "azure");
    let sent = &server.requests()[0];
    assert_eq!(
        sent.path,
        "/openai/deployments/my-gpt4o/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(sent.headers["api-key"], KEY);
    assert!(!sent.headers.contains_key("authorization"));
}

#[tokio::test]
async fn embeddings_are_batched_and_kept_in_input_order() {
    let server = FakeLlm::start().await;
    let models = indexmap::IndexMap::from([
        ("embed".to_string(), p_openai(&server)),
        (
            "scripted".to_string(),
            profile(json!({"provider": "mock", "model": "m"})),
        ),
    ]);
    let providers = Providers::for_models_in(&models, None, false, &env).unwrap();
    assert!(providers.embedder("scripted").is_none());
    let embedder = providers.embedder("embed").unwrap();
    assert_eq!(embedder.id(), format!("openai:m@{}", server.base_url));
    let texts: Vec<String> = (0..150).map(|i| "x".repeat(i)).collect();
    let out = embedder.embed(&texts).await.unwrap();
    assert_eq!(out.vectors.len(), 150);
    for (i, v) in out.vectors.iter().enumerate() {
        // The fake server answers input i of each batch with [its length, i in batch, 1].
        assert_eq!(v, &vec![i as f32, (i % 64) as f32, 1.0], "{i}");
    }
    let sizes: Vec<usize> = server
        .requests()
        .iter()
        .map(|r| {
            assert_eq!(r.path, "/v1/embeddings");
            assert_eq!(r.headers["authorization"], format!("Bearer {KEY}"));
            r.body["input"].as_array().unwrap().len()
        })
        .collect();
    assert_eq!(sizes, [64, 64, 22]);
    assert_eq!((out.usage.prompt_tokens, out.usage.calls), (150, 3));
    // Under --mock every profile is scripted: no embedders.
    let mock = Arc::new(runner::providers::mock::MockProvider::empty());
    let providers = Providers::for_models_in(&models, Some(mock), true, &env).unwrap();
    assert!(providers.embedder("embed").is_none());
}

fn anthropic(server: &FakeLlm) -> Arc<dyn Provider> {
    provider_for(profile(
        json!({"provider": "anthropic", "model": "claude-test", "base_url": server.base_url, "api_key_env": "FAKE_KEY"}),
    ))
}

#[tokio::test]
async fn anthropic_streams_text_and_counts_both_token_kinds() {
    let server = FakeLlm::start().await;
    server.script([Reply::anthropic_stream(&["Bonjour", " le", " monde"]).gap(Duration::from_millis(10))]);
    let (reply, tokens) = call(&*anthropic(&server), ask("hi", true)).await;
    let reply = reply.unwrap();
    assert_eq!(reply.text, "Bonjour le monde");
    assert_eq!(texts(&tokens), ["Bonjour", " le", " monde"]);
    assert_eq!(reply.usage, Usage::tokens(12, 9));
    assert_eq!(reply.finish_reason.as_deref(), Some("end_turn"));
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.headers["x-api-key"], KEY);
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert_eq!(sent.body["system"], "Be brief.");
    assert_eq!(sent.body["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(sent.body["max_tokens"], 4096);
    assert_eq!(sent.body["stream"], true);
}

#[tokio::test]
async fn anthropic_errors_are_typed_like_openai_ones() {
    let server = FakeLlm::start().await;
    let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    server.script([
        Reply::sse(&[
            &event("message_start", json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}})),
            &event("error", overloaded.clone()),
        ]),
        Reply::json(529, overloaded),
        Reply::json(429, json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}))
            .header("retry-after", "4"),
        Reply::json(401, json!({"type": "error", "error": {"type": "authentication_error", "message": format!("bad key {KEY}")}})),
        Reply::json(
            200,
            json!({"content": [{"type": "text", "text": "whole"}], "stop_reason": "max_tokens", "usage": {"input_tokens": 3, "output_tokens": 2}}),
        ),
    ]);
    let p = anthropic(&server);
    let (r, _) = call(&*p, ask("hi", true)).await;
    assert!(
        matches!(r, Err(ProviderError::Server { status: 529, ref message }) if message.contains("Overloaded")),
        "{r:?}"
    );
    let (r, _) = call(&*p, ask("hi", true)).await;
    assert!(matches!(r, Err(ProviderError::Server { status: 529, .. })), "{r:?}");
    let (r, _) = call(&*p, ask("hi", true)).await;
    assert_eq!(r, Err(ProviderError::RateLimited { retry_after: Some(4.0) }));
    let (r, _) = call(&*p, ask("hi", true)).await;
    let e = r.unwrap_err();
    assert!(
        matches!(&e, ProviderError::Auth(m) if m.contains("bad key ***")),
        "{e:?}"
    );
    let (r, _) = call(&*p, ask("hi", false)).await;
    let r = r.unwrap();
    assert_eq!((r.text.as_str(), r.usage), ("whole", Usage::tokens(3, 2)));
}

// ---- whole runs, in process ----

/// A project whose workflow is `w.yaml`.
struct Project(support::Project);

impl std::ops::Deref for Project {
    type Target = support::Project;
    fn deref(&self) -> &support::Project {
        &self.0
    }
}

impl Project {
    fn new(workflow: &str) -> Project {
        Project(support::Project::new(&[("w.yaml", workflow)]))
    }

    /// Runs the workflow against `server`, returning the outcome and the events.
    fn run(&self, server: &FakeLlm, input: Value) -> (RunOutcome, Vec<Event>, Duration) {
        let plan = self.plan("w.yaml");
        let base = server.base_url.clone();
        let lookup = move |name: &str| match name {
            "FAKE_BASE" => Some(base.clone()),
            _ => env(name),
        };
        let providers = Providers::for_models_in(plan.models(), None, false, &lookup).unwrap();
        let (events, mut rx) = Events::channel();
        let engine = Engine::new(plan, Arc::new(MemoryCheckpointer::new()), providers, events);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let started = Instant::now();
        let out = rt
            .block_on(engine.run(RunRequest {
                input: Some(input),
                workflow: "w.yaml".into(),
                ..RunRequest::default()
            }))
            .unwrap();
        let took = started.elapsed();
        drop(engine);
        let mut seen = Vec::new();
        while let Ok(e) = rx.try_recv() {
            seen.push(e.event);
        }
        (out, seen, took)
    }
}

const MODELS: &str =
    r#"models: {default: {provider: openai, model: m, base_url: "${env:FAKE_BASE}", api_key_env: FAKE_KEY}}"#;

#[test]
fn fifty_fanned_out_calls_of_200_ms_overlap() {
    let server = FakeLlm::start_in_background();
    server.default_reply(Reply::stream(&["done"]).after(Duration::from_millis(200)));
    let p = Project::new(&format!(
        r#"
name: fan
{MODELS}
input: {{type: object, properties: {{items: {{type: array}}}}}}
state: {{results: {{type: array, reducer: append, default: []}}}}
nodes:
  plan: {{kind: set}}
  work: {{kind: llm, stream: true, prompt: {{text: "item {{{{ job }}}}"}}, update: {{results: "[output]"}}}}
edges:
  - START -> plan
  - {{from: plan, send: {{to: work, foreach: input.items, as: job}}}}
  - work -> END
"#
    ));
    let (out, _, took) = p.run(&server, json!({"items": (0..50).collect::<Vec<_>>()}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["results"], json!(vec!["done"; 50]));
    assert_eq!(server.requests().len(), 50);
    assert!(took < Duration::from_secs(1), "50 calls of 200 ms took {took:?}");
}

fn retrying() -> Project {
    Project::new(&format!(
        r#"
name: retry
{MODELS}
state: {{messages: {{type: array, reducer: append, default: []}}}}
nodes:
  talk:
    kind: llm
    prompt: {{text: "Say hello"}}
    stream: true
    retry: {{max_attempts: 3, initial_interval: 0.001, jitter: false}}
    update: {{messages: "[output]"}}
edges: [START -> talk -> END]
"#
    ))
}

#[test]
fn a_rate_limit_then_success_stores_the_message_once() {
    let server = FakeLlm::start_in_background();
    server.script([
        Reply::json(429, json!({"error": {"message": "slow down"}})).header("retry-after", "0"),
        Reply::stream(&["Hello", " there"]),
    ]);
    let (out, events, _) = retrying().run(&server, json!({}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["messages"], json!(["Hello there"]));
    assert_eq!(server.requests().len(), 2);
    let retries: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::Retry { .. })).collect();
    assert_eq!(retries.len(), 1, "{retries:?}");
}

#[test]
fn a_cut_stream_then_success_leaves_no_half_message() {
    let server = FakeLlm::start_in_background();
    server.script([
        Reply::stream(&["Hel", "lo"]).cut_after(2),
        Reply::stream(&["Hello", " there"]),
    ]);
    let (out, events, _) = retrying().run(&server, json!({}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["messages"], json!(["Hello there"]));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Retry { error, .. } if error.contains("cut off")))
    );
}

#[test]
fn an_llm_node_that_calls_tools_outputs_content_and_tool_calls() {
    let server = FakeLlm::start_in_background();
    server.script([Reply::json(
        200,
        json!({"choices": [{"message": {"content": "Checking.", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}),
    )]);
    let p = Project::new(&format!(
        r#"
name: tools
{MODELS}
state: {{reply: {{type: object, default: {{}}}}, calls: {{type: array, default: []}}}}
nodes:
  ask:
    kind: llm
    prompt: {{text: "Weather?"}}
    stream: false
    options: {{tools: [{{type: function, function: {{name: weather, parameters: {{type: object}}}}}}]}}
    update: {{reply: output, calls: output.tool_calls}}
edges: [START -> ask -> END]
"#
    ));
    let (out, _, _) = p.run(&server, json!({}));
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(
        out.state["reply"],
        json!({"content": "Checking.", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]})
    );
    assert_eq!(out.state["calls"][0]["function"]["name"], "weather");
    assert_eq!(server.requests()[0].body["tools"][0]["function"]["name"], "weather");
}

// ---- through the binary ----

fn runner_cmd(dir: &std::path::Path, server: &FakeLlm) -> std::process::Command {
    let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("runner"));
    c.current_dir(dir)
        .env("FAKE_BASE", &server.base_url)
        .env("FAKE_KEY", KEY)
        .env_remove("RUNNER_DB");
    c
}

const CHAT: &str = r#"
name: chat
models: {default: {provider: openai, model: m, base_url: "${env:FAKE_BASE}", api_key_env: FAKE_KEY}}
input: {type: object, required: [topic], properties: {topic: {type: string}}}
output: [answer]
state: {answer: {type: string, default: ""}}
nodes:
  write: {kind: llm, stream: true, prompt: {text: "Write about {{ input.topic }}"}, retry: {max_attempts: 1}, update: {answer: output}}
edges: [START -> write -> END]
"#;

#[test]
fn the_binary_runs_an_openai_profile_and_streams_its_tokens() {
    let server = FakeLlm::start_in_background();
    server.script([Reply::stream(&["Heat ", "pumps ", "move heat."])]);
    let p = Project::new(CHAT);
    let out = runner_cmd(p.dir.path(), &server)
        .args([
            "run",
            "w.yaml",
            "--db",
            ":memory:",
            "--stream",
            "jsonl",
            "--input",
            "topic=heat",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result, json!({"answer": "Heat pumps move heat."}));
    let tokens: Vec<String> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "token")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tokens, ["Heat ", "pumps ", "move heat."]);
    assert_eq!(server.requests()[0].body["messages"][0]["content"], "Write about heat");
}

#[test]
fn the_key_reaches_no_output_event_or_checkpoint() {
    let server = FakeLlm::start_in_background();
    server.script([
        Reply::stream(&["first answer"]),
        Reply::json(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {KEY}")}}),
        ),
    ]);
    let p = Project::new(CHAT);
    let d = p.dir.path();
    let db = d.join("runs.db");
    let mut everything = Vec::new();
    for (thread, code) in [("ok", 0), ("denied", 1)] {
        let out = runner_cmd(d, &server)
            .args([
                "run",
                "w.yaml",
                "--stream",
                "jsonl",
                "--input",
                "topic=keys",
                "--thread",
                thread,
            ])
            .arg("--db")
            .arg(&db)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(code),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        everything.extend(out.stdout);
        everything.extend(out.stderr);
    }
    let text = String::from_utf8_lossy(&everything);
    assert!(text.contains("Incorrect API key provided: ***"), "{text}");
    for (what, bytes) in std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("runs.db"))
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .chain([("stdout and stderr".to_string(), everything.clone())])
    {
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "the key is in {what}"
        );
    }
    // The run really went through: the answer is stored.
    assert!(text.contains("first answer"), "{text}");
}

#[test]
fn model_overrides_point_a_profile_at_another_server() {
    let server = FakeLlm::start_in_background();
    server.script([Reply::stream(&["from llama.cpp"])]);
    let p = Project::new(&CHAT.replace(
        r#"{provider: openai, model: m, base_url: "${env:FAKE_BASE}", api_key_env: FAKE_KEY}"#,
        "{provider: mock, model: m}",
    ));
    let out = runner_cmd(p.dir.path(), &server)
        .args(["run", "w.yaml", "--db", ":memory:", "--input", "topic=x"])
        .arg("--model")
        .arg(format!("default=llamacpp:local-model@{}", server.base_url))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!({"answer": "from llama.cpp"})
    );
    let sent = &server.requests()[0];
    assert_eq!(sent.body["model"], "local-model");
    assert!(!sent.headers.contains_key("authorization"));

    let out = runner_cmd(p.dir.path(), &server)
        .args([
            "run",
            "w.yaml",
            "--db",
            ":memory:",
            "--input",
            "topic=x",
            "--model",
            "fast=ollama:llama3.2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no model profile `fast`") && stderr.contains("default"),
        "{stderr}"
    );
}

#[test]
fn a_missing_key_stops_the_run_before_it_starts_naming_the_variable() {
    let server = FakeLlm::start_in_background();
    let p = Project::new(CHAT);
    let out = runner_cmd(p.dir.path(), &server)
        .env_remove("FAKE_KEY")
        .args(["run", "w.yaml", "--db", ":memory:", "--input", "topic=x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`FAKE_KEY`"));
    assert!(server.requests().is_empty());
}

// ---- replies cut at the completion cap ----

/// A non-streamed completion the server stopped at its cap: `finish_reason: length`.
fn cut_at_cap(text: &str) -> Reply {
    Reply::json(
        200,
        json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
               "usage": {"prompt_tokens": 40, "completion_tokens": 60, "total_tokens": 100}}),
    )
}

/// A summary with a required list, capped at 60 tokens and retried like any llm node.
const SUMMARY: &str = r#"
name: summary
models: {default: {provider: openai, model: m, base_url: "${env:FAKE_BASE}", api_key_env: FAKE_KEY}}
output: [summary]
state: {summary: {type: object, default: {}}}
nodes:
  summarize:
    kind: llm
    prompt: {text: "Summarize heat pumps."}
    max_tokens: 60
    output:
      format: json
      schema:
        type: object
        required: [title, points]
        properties: {title: {type: string}, points: {type: array, items: {type: string}}}
    update: {summary: output}
edges: [START -> summarize -> END]
"#;

/// `runner run` of SUMMARY against `server`: exit code, result, and the `reply_cut` events.
fn summarize_on(server: &FakeLlm) -> (i32, Value, Vec<Value>, String) {
    let p = Project::new(SUMMARY);
    let out = runner_cmd(p.dir.path(), server)
        .args(["run", "w.yaml", "--db", ":memory:", "--stream", "jsonl"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let cuts = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "custom" && e["event"] == "reply_cut")
        .map(|e| e["data"].clone())
        .collect();
    let result = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), result, cuts, stderr)
}

#[test]
fn a_json_reply_cut_in_a_trailing_list_is_closed_when_the_schema_holds() {
    let server = FakeLlm::start_in_background();
    server.script([cut_at_cap(
        r#"{"title": "Heat pumps", "points": ["They move heat.", "A COP of three to f"#,
    )]);
    let (code, result, cuts, stderr) = summarize_on(&server);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        result["summary"],
        json!({"title": "Heat pumps", "points": ["They move heat.", "A COP of three to f"]})
    );
    assert_eq!(server.requests().len(), 1, "closed, not asked again");
    assert_eq!(
        cuts,
        [json!({"event": "reply_cut", "max_tokens": 60, "action": "closed"})]
    );
}

#[test]
fn a_json_reply_cut_before_a_required_field_is_asked_for_once_shorter() {
    let server = FakeLlm::start_in_background();
    server.script([
        cut_at_cap(r#"{"title": "Heat pumps: how a refrigerant cycle moves heat from the cold outside"#),
        Reply::completion(r#"{"title": "Heat pumps", "points": ["They move heat."]}"#),
    ]);
    let (code, result, cuts, stderr) = summarize_on(&server);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(result["summary"]["points"], json!(["They move heat."]));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let asked = requests[1].body["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        asked.contains("cut off at 60 tokens") && asked.contains("shorten"),
        "{asked}"
    );
    assert_eq!(cuts[0]["action"], "asked_shorter");
}

#[test]
fn a_json_reply_cut_twice_fails_fast_naming_the_cap() {
    let server = FakeLlm::start_in_background();
    let cut = cut_at_cap(r#"{"title": "Heat pumps: how a refrigerant cycle moves heat from the cold outside"#);
    server.default_reply(cut);
    let (code, _, cuts, stderr) = summarize_on(&server);
    assert_eq!(code, 1, "{stderr}");
    // Once asked for shorter, then failed: not three identical requests, nor a node retry.
    assert_eq!(server.requests().len(), 2, "{stderr}");
    assert!(
        stderr.contains("cut at its 60-token cap (`max_tokens`)") && stderr.contains("raise `max_tokens`"),
        "{stderr}"
    );
    let actions: Vec<&Value> = cuts.iter().map(|c| &c["action"]).collect();
    assert_eq!(actions, [&json!("asked_shorter"), &json!("failed")]);
}

#[tokio::test]
async fn a_server_that_never_answers_or_stalls_is_cut_off() {
    let server = FakeLlm::start().await;
    server.script([
        // Never answers (within any test's lifetime): the profile's deadline ends the call.
        Reply::completion("never").after(Duration::from_secs(3600)),
        // Answers at once, then the stream stalls: the idle timeout ends it.
        Reply::stream(&["a", "b", "c"]).gap(Duration::from_secs(3600)),
        // A slow but steady stream outlives the idle timeout in total, and is read whole.
        Reply::stream(&["s", "l", "o", "w", "l", "y"]).gap(Duration::from_millis(100)),
    ]);
    let never = provider_for(profile(
        json!({"provider": "openai", "model": "m", "base_url": server.base_url, "timeout": "400ms"}),
    ));
    let started = Instant::now();
    assert_eq!(call(&*never, ask("hi", false)).await.0, Err(ProviderError::Timeout));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    // The total deadline is far away: only the idle timeout can end a stalled stream.
    let p = provider_for(profile(
        json!({"provider": "openai", "model": "m", "base_url": server.base_url,
        "timeout": "1h", "idle_timeout": "400ms"}),
    ));
    let started = Instant::now();
    let (reply, tokens) = call(&*p, ask("hi", true)).await;
    assert_eq!(reply, Err(ProviderError::Timeout));
    assert!(texts(&tokens).len() <= 1, "{:?}", texts(&tokens));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let started = Instant::now();
    let (reply, _) = call(&*p, ask("hi", true)).await;
    assert_eq!(reply.unwrap().text, "slowly");
    assert!(
        started.elapsed() > Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    // A timeout is retried as one.
    assert_eq!(ProviderError::Timeout.class(), runner::error_class::ErrorClass::Timeout);
}

#[tokio::test]
async fn replies_larger_than_the_profile_allows_are_refused() {
    let server = FakeLlm::start().await;
    let big = "x".repeat(5_000);
    let pieces: Vec<String> = (0..50).map(|_| "y".repeat(100)).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    server.script([
        Reply::completion(&big),
        Reply::stream(&pieces),
        Reply::completion(&"z".repeat(900)),
        Reply::anthropic_stream(&pieces),
        // Without `max_reply_bytes`, 1 MiB is the cap.
        Reply::completion(&"w".repeat(1_100_000)),
    ]);
    let p = provider_for(profile(
        json!({"provider": "openai", "model": "m", "base_url": server.base_url,
        "max_reply_bytes": 1000}),
    ));
    for stream in [false, true] {
        let (reply, _) = call(&*p, ask("hi", stream)).await;
        assert!(
            matches!(&reply, Err(ProviderError::TooLarge(m)) if m.contains("1000")),
            "{reply:?}"
        );
        assert_eq!(reply.unwrap_err().class(), runner::error_class::ErrorClass::Invalid);
    }
    assert_eq!(call(&*p, ask("hi", false)).await.0.unwrap().text.len(), 900);
    let a = provider_for(profile(json!({"provider": "anthropic", "model": "m",
        "base_url": server.base_url.trim_end_matches("/v1"), "api_key_env": "FAKE_KEY", "max_reply_bytes": 1000})));
    let (reply, tokens) = call(&*a, ask("hi", true)).await;
    assert!(matches!(reply, Err(ProviderError::TooLarge(_))), "{reply:?}");
    assert!(tokens.len() <= 11, "reading stopped at the cap: {}", tokens.len());
    let unbounded = provider_for(profile(
        json!({"provider": "openai", "model": "m", "base_url": server.base_url}),
    ));
    let (reply, _) = call(&*unbounded, ask("hi", false)).await;
    assert!(matches!(reply, Err(ProviderError::TooLarge(_))), "{reply:?}");
}

#[tokio::test]
async fn a_key_placed_across_the_excerpt_cut_is_scrubbed_whole() {
    let server = FakeLlm::start().await;
    let offsets: Vec<usize> = (250..650).step_by(3).collect();
    server.script(offsets.iter().map(|at| {
        Reply::json(
            401,
            json!({"error": {"message": format!("{}{KEY} is not a valid key", "x".repeat(*at))}}),
        )
    }));
    let p = openai(&server);
    for at in offsets {
        let e = call(&*p, ask("hi", false)).await.0.unwrap_err();
        let text = format!("{e} {e:?}");
        // No four characters of the key in a row, wherever the cut fell.
        assert!(!text.contains(&KEY[..4]), "offset {at}: {text}");
    }
}

#[tokio::test]
async fn an_absurd_retry_after_is_capped_not_passed_on() {
    let server = FakeLlm::start().await;
    server.script([
        Reply::json(429, json!({})).header("retry-after", "1e300"),
        Reply::json(429, json!({})).header("retry-after", "inf"),
        Reply::json(429, json!({})).header("retry-after", "-4"),
        Reply::json(429, json!({})).header("retry-after-ms", "1e308"),
    ]);
    let p = openai(&server);
    let max = runner::net::http_error::MAX_RETRY_AFTER.as_secs_f64();
    let mut waits = Vec::new();
    for _ in 0..4 {
        match call(&*p, ask("hi", false)).await.0 {
            Err(ProviderError::RateLimited { retry_after }) => waits.push(retry_after),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(waits, [Some(max), Some(max), None, Some(max)]);
}

/// A conversation that went through a tool call: the user's question, the assistant's call,
/// the tool's result (and a failed one), as state holds it in LangChain's shape.
fn tool_history() -> Vec<Message> {
    [
        json!({"type": "human", "content": "Weather in Paris?"}),
        json!({"type": "ai", "content": "", "tool_calls": [
            {"id": "c1", "name": "weather", "args": {"city": "Paris"}},
            {"id": "c2", "name": "forecast", "args": {"city": "Paris", "days": 2}}
        ]}),
        json!({"type": "tool", "tool_call_id": "c1", "name": "weather", "content": "18C, sunny"}),
        json!({"type": "tool", "tool_call_id": "c2", "name": "forecast", "content": "no such tool", "status": "error"}),
    ]
    .iter()
    .map(Message::from_value)
    .collect()
}

/// Messages carry tool calls end to end: the assistant's calls go out in OpenAI's shape and
/// each tool result names the call it answers; a reply's calls come back whole.
#[tokio::test]
async fn openai_sends_tool_calls_and_results_and_reads_calls_back() {
    let server = FakeLlm::start().await;
    server.script([Reply::json(
        200,
        json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Lyon\"}"}}
        ]}, "finish_reason": "tool_calls"}]}),
    )]);
    let request = ChatRequest {
        messages: tool_history(),
        ..ask("", false)
    };
    let (reply, _) = call(&*openai(&server), request).await;
    let reply = reply.unwrap();
    assert_eq!(reply.tool_calls[0]["function"]["name"], "weather");
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
    let sent = &server.requests()[0].body["messages"];
    assert_eq!(sent[0], json!({"role": "user", "content": "Weather in Paris?"}));
    assert_eq!(
        sent[1],
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "forecast", "arguments": "{\"city\":\"Paris\",\"days\":2}"}}
        ]})
    );
    assert_eq!(
        sent[2],
        json!({"role": "tool", "content": "18C, sunny", "tool_call_id": "c1", "name": "weather"})
    );
    assert_eq!(sent[3]["tool_call_id"], "c2");
}

/// The same conversation as Anthropic's Messages API takes it: the calls as `tool_use` blocks
/// with object inputs, both results as `tool_result` blocks of one user turn, the failed one
/// marked as an error.
#[tokio::test]
async fn anthropic_sends_tool_use_and_tool_result_blocks() {
    let server = FakeLlm::start().await;
    server.script([Reply::json(
        200,
        json!({"type": "message", "content": [{"type": "text", "text": "Sunny."}], "stop_reason": "end_turn",
               "usage": {"input_tokens": 5, "output_tokens": 2}}),
    )]);
    let request = ChatRequest {
        messages: tool_history(),
        ..ask("", false)
    };
    let (reply, _) = call(&*anthropic(&server), request).await;
    assert_eq!(reply.unwrap().text, "Sunny.");
    let sent = &server.requests()[0].body["messages"];
    assert_eq!(sent.as_array().unwrap().len(), 3, "{sent:#}");
    assert_eq!(
        sent[1],
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "c2", "name": "forecast", "input": {"city": "Paris", "days": 2}}
        ]})
    );
    assert_eq!(
        sent[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "18C, sunny"},
            {"type": "tool_result", "tool_use_id": "c2", "content": "no such tool", "is_error": true}
        ]})
    );
}
