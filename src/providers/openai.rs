//! Any OpenAI-compatible Chat Completions and Embeddings endpoint: OpenAI, Azure OpenAI (when
//! the profile sets `api_version`), Ollama's /v1, vLLM, llama.cpp's llama-server, LM Studio,
//! OpenRouter, Groq, Together. Replies stream over server-sent events; servers differ in what
//! they leave out, so every field of a reply is optional here.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::http::{self, Key, Limits};
use super::{ChatRequest, ChatResponse, Embedder, Embeddings, Provider, ProviderError, TokenSink, Usage};

/// OpenAI's own API, used when a profile names no `base_url`.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Inputs per embeddings request (OpenAI takes up to 2048; local servers prefer fewer).
const EMBED_BATCH: usize = 64;

/// Where and how to reach one OpenAI-compatible server.
#[derive(Debug)]
pub struct Endpoint {
    client: reqwest::Client,
    base_url: String,
    /// Azure's `api-version`: deployment URLs and the `api-key` header.
    azure_version: Option<String>,
    key: Key,
    limits: Limits,
}

impl Endpoint {
    pub fn new(
        client: reqwest::Client,
        base_url: Option<&str>,
        azure_version: Option<String>,
        key: Key,
        limits: Limits,
    ) -> Endpoint {
        Endpoint {
            client,
            base_url: base_url.unwrap_or(DEFAULT_BASE_URL).trim_end_matches('/').to_string(),
            azure_version,
            key,
            limits,
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    fn url(&self, model: &str, path: &str) -> String {
        match &self.azure_version {
            Some(v) => format!(
                "{}/openai/deployments/{model}/{path}?api-version={}",
                self.base_url,
                url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
            ),
            None => format!("{}/{path}", self.base_url),
        }
    }

    /// Posts `body`; a non-success status becomes its typed error.
    async fn post(&self, url: &str, body: &Value) -> Result<reqwest::Response, ProviderError> {
        let mut request = self.client.post(url).json(body);
        if let Some(key) = self.key.value() {
            request = match self.azure_version {
                Some(_) => request.header("api-key", key),
                None => request.bearer_auth(key),
            };
        }
        let response = http::send(request).await?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(http::error_response(response, &self.limits).await)
    }
}

/// Chat completions.
#[derive(Debug)]
pub struct OpenAi {
    endpoint: Arc<Endpoint>,
}

impl OpenAi {
    pub fn new(endpoint: Arc<Endpoint>) -> OpenAi {
        OpenAi { endpoint }
    }

    async fn call(&self, request: &ChatRequest, tokens: Option<TokenSink<'_>>) -> Result<ChatResponse, ProviderError> {
        let url = self.endpoint.url(&request.model, "chat/completions");
        let mut body = body(request);
        // Servers that do not know a field we add answer 400 naming it: drop it and try again.
        for _ in 0..2 {
            match self.endpoint.post(&url, &body).await {
                Ok(response) => return read_reply(response, request.stream, tokens, &self.endpoint.limits).await,
                Err(ProviderError::BadRequest(why)) => {
                    let obj = body.as_object_mut().ok_or(ProviderError::BadRequest(why.clone()))?;
                    if mentions(&why, &["response_format", "json_schema"]) && obj.remove("response_format").is_some() {
                        if let Some(schema) = &request.json_schema {
                            instruct(obj, schema);
                        }
                    } else if !(mentions(&why, &["stream_options", "include_usage"])
                        && obj.remove("stream_options").is_some())
                    {
                        return Err(ProviderError::BadRequest(why));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let response = self.endpoint.post(&url, &body).await?;
        read_reply(response, request.stream, tokens, &self.endpoint.limits).await
    }
}

impl Provider for OpenAi {
    fn chat<'a>(
        &'a self,
        request: ChatRequest,
        tokens: Option<TokenSink<'a>>,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            http::deadline(&self.endpoint.limits, self.call(&request, tokens))
                .await
                .map_err(|e| self.endpoint.key.scrub_error(e))
        })
    }
}

fn mentions(text: &str, words: &[&str]) -> bool {
    let text = text.to_ascii_lowercase();
    words.iter().any(|w| text.contains(w))
}

/// A message as Chat Completions takes it: an assistant's tool calls (its content null when it
/// has none), a tool result with the id of the call it answers.
fn message(m: &super::Message) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), json!(m.role));
    if m.role == "assistant" && !m.tool_calls.is_empty() {
        out.insert(
            "content".into(),
            if m.content.is_empty() {
                Value::Null
            } else {
                json!(m.content)
            },
        );
        out.insert("tool_calls".into(), Value::Array(m.tool_calls.clone()));
    } else {
        out.insert("content".into(), json!(m.content));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    if m.role == "tool"
        && let Some(name) = &m.name
    {
        out.insert("name".into(), json!(name));
    }
    Value::Object(out)
}

/// The request body: the request's fields, then its `options` unchanged (they win).
fn body(request: &ChatRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("messages".into(), request.messages.iter().map(message).collect());
    body.insert("stream".into(), json!(request.stream));
    if request.stream {
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(m) = request.max_tokens {
        body.insert("max_tokens".into(), json!(m));
    }
    if !request.stop.is_empty() {
        body.insert("stop".into(), json!(request.stop));
    }
    if let Some(s) = request.seed {
        body.insert("seed".into(), json!(s));
    }
    if let Some(schema) = &request.json_schema {
        body.insert(
            "response_format".into(),
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": false}}),
        );
    }
    for (k, v) in &request.options {
        body.insert(k.clone(), v.clone());
    }
    Value::Object(body)
}

/// Tells the model the schema in words, for servers that cannot be given it as a field.
fn instruct(body: &mut Map<String, Value>, schema: &Value) {
    let note = super::schema_instruction(schema);
    if let Some(Value::Array(messages)) = body.get_mut("messages") {
        match messages.first_mut() {
            Some(Value::Object(m)) if m.get("role").and_then(Value::as_str) == Some("system") => {
                let text = m.get("content").and_then(Value::as_str).unwrap_or_default();
                let joined = if text.is_empty() {
                    note
                } else {
                    format!("{text}\n\n{note}")
                };
                m.insert("content".into(), json!(joined));
            }
            _ => messages.insert(0, json!({"role": "system", "content": note})),
        }
    }
}

async fn read_reply(
    response: reqwest::Response,
    stream: bool,
    tokens: Option<TokenSink<'_>>,
    limits: &Limits,
) -> Result<ChatResponse, ProviderError> {
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    // Trust what came over what was asked: some servers stream unasked, or answer a stream
    // request with one JSON body.
    if content_type.contains("event-stream") || (stream && !content_type.contains("json")) {
        return read_stream(response, tokens.filter(|_| stream), limits).await;
    }
    // Not streamed, or a server that answered a stream request with one JSON body.
    let text = http::read_body(response, limits).await?;
    let reply = parse_reply(&text)?;
    limits.check_reply(http::reply_len(&reply.text, &reply.tool_calls))?;
    if let (true, Some(sink)) = (stream, tokens)
        && !reply.text.is_empty()
    {
        sink(&reply.text);
    }
    Ok(reply)
}

/// A whole (non-streamed) reply.
pub fn parse_reply(text: &str) -> Result<ChatResponse, ProviderError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ProviderError::Malformed(format!("the reply is not JSON ({e}): {}", http::excerpt(text))))?;
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        return Err(in_band_error(e));
    }
    let choice = first_choice(&v)
        .ok_or_else(|| ProviderError::Malformed(format!("the reply has no choices: {}", http::excerpt(text))))?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let tool_calls = match message.get("tool_calls") {
        Some(Value::Array(calls)) => calls.clone(),
        _ => Vec::new(),
    };
    Ok(ChatResponse {
        text: content_text(message.get("content")),
        usage: usage_of(v.get("usage")),
        finish_reason: choice.get("finish_reason").and_then(Value::as_str).map(str::to_string),
        tool_calls,
        model: model_of(&v),
    })
}

/// The `model` a reply (or a stream chunk) names, if any.
pub(super) fn model_of(v: &Value) -> Option<String> {
    v.get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
}

fn first_choice(v: &Value) -> Option<&Value> {
    let choices = v.get("choices")?.as_array()?;
    choices
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        .or(choices.first())
}

/// Message content: a string, null, or a list of parts with `text`.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.as_str().or_else(|| p.get("text").and_then(Value::as_str)))
            .collect(),
        _ => String::new(),
    }
}

/// Token counts in OpenAI's names (or Anthropic's); a reply without them is one call of zero
/// tokens.
pub fn usage_of(usage: Option<&Value>) -> Usage {
    let count = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| usage.and_then(|u| u.get(*n)).and_then(Value::as_u64))
            .unwrap_or(0)
    };
    Usage::tokens(
        count(&["prompt_tokens", "input_tokens"]),
        count(&["completion_tokens", "output_tokens"]),
    )
}

/// An `error` object inside a 200 reply or a stream.
fn in_band_error(e: &Value) -> ProviderError {
    let body = json!({"error": e}).to_string();
    let status = e
        .get("code")
        .and_then(|c| c.as_u64().or_else(|| c.as_str().and_then(|s| s.parse().ok())))
        .filter(|c| (400..600).contains(c));
    match status {
        Some(s) => http::status_error(s as u16, &Default::default(), &body),
        None => ProviderError::Server {
            status: 500,
            message: http::excerpt(&body),
        },
    }
}

/// A reply put together from stream chunks.
#[derive(Debug, Default)]
struct Assembly {
    text: String,
    tool_calls: Vec<Value>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    model: Option<String>,
}

impl Assembly {
    fn chunk(&mut self, v: &Value, tokens: Option<TokenSink<'_>>) -> Result<(), ProviderError> {
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            return Err(in_band_error(e));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage_of(Some(u)));
        }
        if self.model.is_none() {
            self.model = model_of(v);
        }
        let Some(choice) = first_choice(v) else {
            return Ok(());
        };
        let delta = choice
            .get("delta")
            .or_else(|| choice.get("message"))
            .unwrap_or(&Value::Null);
        let piece = content_text(delta.get("content"));
        if !piece.is_empty() {
            if let Some(sink) = tokens {
                sink(&piece);
            }
            self.text.push_str(&piece);
        }
        if let Some(Value::Array(calls)) = delta.get("tool_calls") {
            for call in calls {
                merge_tool_call(&mut self.tool_calls, call);
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
        Ok(())
    }
}

/// Adds one streamed tool-call fragment: fragments with the same `index` are one call, whose
/// `function.arguments` arrive in pieces.
fn merge_tool_call(calls: &mut Vec<Value>, delta: &Value) {
    let index = match delta.get("index").and_then(Value::as_u64) {
        Some(i) => i as usize,
        // Without an index, a fragment with an id starts a call and others continue the last.
        None if delta.get("id").is_some() || calls.is_empty() => calls.len(),
        None => calls.len() - 1,
    };
    while calls.len() <= index {
        calls.push(json!({"id": "", "type": "function", "function": {"name": "", "arguments": ""}}));
    }
    let call = &mut calls[index];
    for field in ["id", "type"] {
        if let Some(s) = delta.get(field).and_then(Value::as_str).filter(|s| !s.is_empty()) {
            call[field] = json!(s);
        }
    }
    let Some(f) = delta.get("function") else { return };
    if let Some(name) = f.get("name").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        let current = call["function"]["name"].as_str().unwrap_or_default();
        // Some servers repeat the whole name in every fragment.
        if current != name {
            call["function"]["name"] = json!(format!("{current}{name}"));
        }
    }
    match f.get("arguments") {
        Some(Value::String(piece)) => {
            let mut args = call["function"]["arguments"].as_str().unwrap_or_default().to_string();
            args.push_str(piece);
            call["function"]["arguments"] = json!(args);
        }
        // Arguments sent as an object (some local servers) are the whole arguments.
        Some(other) if !other.is_null() => call["function"]["arguments"] = json!(other.to_string()),
        _ => {}
    }
}

async fn read_stream(
    response: reqwest::Response,
    tokens: Option<TokenSink<'_>>,
    limits: &Limits,
) -> Result<ChatResponse, ProviderError> {
    let mut reply = Assembly::default();
    let done = http::read_events(response, limits, |event| {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            ProviderError::Malformed(format!("a stream chunk is not JSON ({e}): {}", http::excerpt(data)))
        })?;
        reply.chunk(&v, tokens)?;
        limits.check_reply(http::reply_len(&reply.text, &reply.tool_calls))?;
        Ok(false)
    })
    .await?;
    if !done && reply.finish_reason.is_none() {
        return Err(ProviderError::StreamCut(
            "the stream ended before the reply was finished (no finish_reason, no [DONE])".into(),
        ));
    }
    Ok(ChatResponse {
        text: reply.text,
        usage: reply.usage.unwrap_or_else(|| Usage::tokens(0, 0)),
        finish_reason: reply.finish_reason,
        tool_calls: reply.tool_calls,
        model: reply.model,
    })
}

/// Embeddings from an OpenAI-compatible `/embeddings`.
#[derive(Debug)]
pub struct OpenAiEmbedder {
    endpoint: Arc<Endpoint>,
    model: String,
    id: String,
}

impl OpenAiEmbedder {
    pub fn new(endpoint: Arc<Endpoint>, model: &str) -> OpenAiEmbedder {
        OpenAiEmbedder {
            id: format!("openai:{model}@{}", endpoint.base_url()),
            endpoint,
            model: model.to_string(),
        }
    }

    async fn batch(&self, texts: &[String]) -> Result<Embeddings, ProviderError> {
        let url = self.endpoint.url(&self.model, "embeddings");
        let body = json!({"model": self.model, "input": texts});
        let response = self.endpoint.post(&url, &body).await?;
        let text = http::read_body(response, &self.endpoint.limits).await?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ProviderError::Malformed(format!("the reply is not JSON ({e}): {}", http::excerpt(&text))))?;
        let data = v
            .get("data")
            .and_then(Value::as_array)
            .ok_or_else(|| ProviderError::Malformed(format!("the reply has no `data`: {}", http::excerpt(&text))))?;
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; texts.len()];
        for (i, item) in data.iter().enumerate() {
            let at = item.get("index").and_then(Value::as_u64).map_or(i, |x| x as usize);
            let vector = item
                .get("embedding")
                .and_then(Value::as_array)
                .map(|xs| {
                    xs.iter()
                        .map(|x| x.as_f64().map(|f| f as f32))
                        .collect::<Option<Vec<f32>>>()
                })
                .and_then(|v| v)
                .ok_or_else(|| ProviderError::Malformed(format!("item {i} has no numeric `embedding`")))?;
            let slot = vectors
                .get_mut(at)
                .ok_or_else(|| ProviderError::Malformed(format!("item index {at} is out of range")))?;
            *slot = Some(vector);
        }
        let vectors = vectors
            .into_iter()
            .enumerate()
            .map(|(i, v)| v.ok_or_else(|| ProviderError::Malformed(format!("no embedding for input {i}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let usage = usage_of(v.get("usage"));
        Ok(Embeddings { vectors, usage })
    }
}

impl Embedder for OpenAiEmbedder {
    fn id(&self) -> &str {
        &self.id
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(async move {
            let mut out = Embeddings::default();
            for batch in texts.chunks(EMBED_BATCH) {
                let part = http::deadline(&self.endpoint.limits, self.batch(batch))
                    .await
                    .map_err(|e| self.endpoint.key.scrub_error(e))?;
                out.vectors.extend(part.vectors);
                out.usage.add(&part.usage);
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn streamed_tool_call_fragments_assemble_by_index() {
        let mut calls = Vec::new();
        for d in [
            json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}),
            json!({"index": 1, "id": "call_2", "function": {"name": "get_time", "arguments": "{}"}}),
            json!({"index": 0, "function": {"arguments": "{\"city\":"}}),
            json!({"index": 0, "function": {"arguments": "\"Paris\"}"}}),
        ] {
            merge_tool_call(&mut calls, &d);
        }
        assert_eq!(
            calls,
            vec![
                json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}),
                json!({"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}),
            ]
        );
    }

    #[test]
    fn replies_tolerate_missing_and_null_fields() {
        let r = parse_reply(r#"{"choices": [{"message": {"content": null, "tool_calls": [{"id": "c"}]}}]}"#).unwrap();
        assert_eq!(r.text, "");
        assert_eq!(r.usage, Usage::tokens(0, 0));
        assert_eq!(r.usage.calls, 1);
        assert_eq!(r.tool_calls, vec![json!({"id": "c"})]);
        let r = parse_reply(
            r#"{"id": "x", "extra": 1, "choices": [{"index": 0, "message": {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}"#,
        )
        .unwrap();
        assert_eq!((r.text.as_str(), r.finish_reason.as_deref()), ("ab", Some("length")));
        assert_eq!(r.usage.total_tokens, 5);
        assert_eq!(r.model, None, "a reply that names no model");
        assert!(matches!(parse_reply("{}"), Err(ProviderError::Malformed(_))));
        assert!(matches!(parse_reply("<html>"), Err(ProviderError::Malformed(_))));
        assert!(matches!(
            parse_reply(r#"{"error": {"message": "slow down", "code": 429}}"#),
            Err(ProviderError::RateLimited { .. })
        ));
    }

    #[test]
    fn a_reply_names_the_model_that_made_it_whole_or_streamed() {
        let r =
            parse_reply(r#"{"model": "gpt-4o-mini-2024-07-18", "choices": [{"message": {"content": "a"}}]}"#).unwrap();
        assert_eq!(r.model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
        let mut a = Assembly::default();
        for v in [
            json!({"model": "m-2026", "choices": [{"index": 0, "delta": {"content": "a"}}]}),
            json!({"model": "", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ] {
            a.chunk(&v, None).unwrap();
        }
        assert_eq!(a.model.as_deref(), Some("m-2026"));
    }

    #[test]
    fn the_body_carries_the_schema_and_options_win() {
        let mut options = Map::new();
        options.insert("tools".into(), json!([{"type": "function"}]));
        options.insert("temperature".into(), json!(0.9));
        let request = ChatRequest {
            model: "m".into(),
            temperature: Some(0.1),
            json_schema: Some(json!({"type": "object"})),
            options,
            stream: true,
            ..ChatRequest::default()
        };
        let b = body(&request);
        assert_eq!(b["response_format"]["type"], "json_schema");
        assert_eq!(b["response_format"]["json_schema"]["schema"], json!({"type": "object"}));
        assert_eq!(b["response_format"]["json_schema"]["strict"], false);
        assert_eq!(b["stream_options"], json!({"include_usage": true}));
        assert_eq!(b["temperature"], 0.9);
        assert_eq!(b["tools"], json!([{"type": "function"}]));
    }

    #[test]
    fn azure_urls_name_the_deployment_and_version() {
        let client = crate::net::client_builder().build().unwrap();
        let e = Endpoint::new(
            client.clone(),
            Some("https://r.openai.azure.com/"),
            Some("2024-10-21".into()),
            Key::default(),
            Limits::default(),
        );
        assert_eq!(
            e.url("gpt4o", "chat/completions"),
            "https://r.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"
        );
        let e = Endpoint::new(client, None, None, Key::default(), Limits::default());
        assert_eq!(e.url("x", "embeddings"), "https://api.openai.com/v1/embeddings");
    }
}
