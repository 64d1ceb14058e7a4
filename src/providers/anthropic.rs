//! Anthropic's Messages API: the system prompt is a top-level field, `max_tokens` is required,
//! and a stream is a sequence of named events (`message_start` with the input tokens,
//! `content_block_delta` with text, `message_delta` with the output tokens and stop reason,
//! `message_stop`, `ping`, `error`). Tool-use blocks come back in the OpenAI shape the llm node
//! reports for every provider.

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::http::{self, Key, Limits};
use super::{ChatRequest, ChatResponse, Provider, ProviderError, TokenSink, Usage};

/// Anthropic's API, used when a profile names no `base_url`.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
const VERSION: &str = "2023-06-01";
/// The completion cap when neither node nor profile sets one (the API requires one).
const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The Messages API.
#[derive(Debug)]
pub struct Anthropic {
    client: reqwest::Client,
    url: String,
    key: Key,
    limits: Limits,
}

impl Anthropic {
    pub fn new(client: reqwest::Client, base_url: Option<&str>, key: Key, limits: Limits) -> Anthropic {
        let base = base_url.unwrap_or(DEFAULT_BASE_URL).trim_end_matches('/');
        let url = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        Anthropic {
            client,
            url,
            key,
            limits,
        }
    }

    async fn call(&self, request: &ChatRequest, tokens: Option<TokenSink<'_>>) -> Result<ChatResponse, ProviderError> {
        let mut post = self
            .client
            .post(&self.url)
            .header("anthropic-version", VERSION)
            .json(&body(request));
        if let Some(key) = self.key.value() {
            post = post.header("x-api-key", key);
        }
        let response = http::send(post).await?;
        if !response.status().is_success() {
            return Err(http::error_response(response, &self.limits).await);
        }
        if !request.stream {
            let text = http::read_body(response, &self.limits).await?;
            let v: Value = serde_json::from_str(&text).map_err(|e| {
                ProviderError::Malformed(format!("the reply is not JSON ({e}): {}", http::excerpt(&text)))
            })?;
            let reply = parse_message(&v)?;
            self.limits
                .check_reply(http::reply_len(&reply.text, &reply.tool_calls))?;
            return Ok(reply);
        }
        let mut reply = Assembly::default();
        let done = http::read_events(response, &self.limits, |event| {
            if event.data.trim().is_empty() {
                return Ok(false);
            }
            let v: Value = serde_json::from_str(&event.data).map_err(|e| {
                ProviderError::Malformed(format!(
                    "a stream event is not JSON ({e}): {}",
                    http::excerpt(&event.data)
                ))
            })?;
            let done = reply.event(&v, event.event.as_deref(), tokens)?;
            let tool_json = reply.tool_calls.iter().map(|c| c.json.len()).sum::<usize>();
            self.limits.check_reply(reply.text.len().saturating_add(tool_json))?;
            Ok(done)
        })
        .await?;
        if !done {
            return Err(ProviderError::StreamCut(
                "the stream ended before `message_stop`".into(),
            ));
        }
        Ok(ChatResponse {
            text: reply.text,
            usage: Usage::tokens(reply.input_tokens, reply.output_tokens),
            finish_reason: reply.stop_reason,
            tool_calls: reply.tool_calls.into_iter().map(|c| c.finish()).collect(),
            model: reply.model,
        })
    }
}

impl Provider for Anthropic {
    fn chat<'a>(
        &'a self,
        request: ChatRequest,
        tokens: Option<TokenSink<'a>>,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            http::deadline(&self.limits, self.call(&request, tokens))
                .await
                .map_err(|e| self.key.scrub_error(e))
        })
    }
}

/// The request body: system messages joined into `system`, the schema (which this API takes
/// no field for) told in words, then `options` unchanged.
fn body(request: &ChatRequest) -> Value {
    let mut system: Vec<String> = Vec::new();
    let mut messages = Vec::new();
    for m in &request.messages {
        match m.role.as_str() {
            "system" => system.push(m.content.clone()),
            "assistant" if !m.tool_calls.is_empty() => {
                let mut blocks = Vec::new();
                if !m.content.is_empty() {
                    blocks.push(json!({"type": "text", "text": m.content}));
                }
                blocks.extend(m.tool_calls.iter().map(tool_use_block));
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            "assistant" => messages.push(json!({"role": "assistant", "content": m.content})),
            // A tool result is a `tool_result` block of a user turn; the results of one
            // assistant turn's calls go together in the turn that follows it.
            "tool" => {
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id.clone().unwrap_or_default(),
                    "content": m.content,
                });
                if m.is_error {
                    block["is_error"] = json!(true);
                }
                match messages.last_mut() {
                    Some(Value::Object(last))
                        if last.get("role") == Some(&json!("user"))
                            && last
                                .get("content")
                                .and_then(Value::as_array)
                                .is_some_and(|c| c.iter().all(|b| b["type"] == "tool_result")) =>
                    {
                        if let Some(Value::Array(blocks)) = last.get_mut("content") {
                            blocks.push(block);
                        }
                    }
                    _ => messages.push(json!({"role": "user", "content": [block]})),
                }
            }
            _ => messages.push(json!({"role": "user", "content": m.content})),
        }
    }
    if let Some(schema) = &request.json_schema {
        system.push(super::schema_instruction(schema));
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert(
        "max_tokens".into(),
        json!(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if !request.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(request.stop));
    }
    body.insert("stream".into(), json!(request.stream));
    for (k, v) in &request.options {
        body.insert(k.clone(), v.clone());
    }
    Value::Object(body)
}

/// A whole (non-streamed) message.
fn parse_message(v: &Value) -> Result<ChatResponse, ProviderError> {
    if v.get("type").and_then(Value::as_str) == Some("error") {
        return Err(error_event(v));
    }
    let content = v.get("content").and_then(Value::as_array).ok_or_else(|| {
        ProviderError::Malformed(format!("the reply has no content: {}", http::excerpt(&v.to_string())))
    })?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in content {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            Some("tool_use") => tool_calls.push(tool_call(block, block.get("input").map(Value::to_string))),
            _ => {}
        }
    }
    Ok(ChatResponse {
        text,
        usage: super::openai::usage_of(v.get("usage")),
        finish_reason: v.get("stop_reason").and_then(Value::as_str).map(str::to_string),
        tool_calls,
        model: super::openai::model_of(v),
    })
}

/// A tool call (OpenAI's shape, as calls are kept) as a `tool_use` block: the arguments, a JSON
/// text there, are an object here.
fn tool_use_block(call: &Value) -> Value {
    let f = &call["function"];
    let input = f["arguments"]
        .as_str()
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({"type": "tool_use", "id": call["id"], "name": f["name"], "input": input})
}

fn tool_call(block: &Value, arguments: Option<String>) -> Value {
    json!({
        "id": block.get("id").and_then(Value::as_str).unwrap_or_default(),
        "type": "function",
        "function": {
            "name": block.get("name").and_then(Value::as_str).unwrap_or_default(),
            "arguments": arguments.unwrap_or_else(|| "{}".into()),
        }
    })
}

/// An `error` event (or body): its type decides the class.
fn error_event(v: &Value) -> ProviderError {
    let e = v.get("error").unwrap_or(v);
    let message = http::excerpt(&json!({"error": e}).to_string());
    match e.get("type").and_then(Value::as_str).unwrap_or_default() {
        "rate_limit_error" => ProviderError::RateLimited { retry_after: None },
        "overloaded_error" => ProviderError::Server { status: 529, message },
        "authentication_error" | "permission_error" => ProviderError::Auth(message),
        "invalid_request_error" | "not_found_error" | "request_too_large" => ProviderError::BadRequest(message),
        _ => ProviderError::Server { status: 500, message },
    }
}

/// A tool-use block being streamed.
#[derive(Debug)]
struct ToolUse {
    block: Value,
    json: String,
}

impl ToolUse {
    fn finish(self) -> Value {
        let args = if self.json.trim().is_empty() {
            self.block.get("input").map(Value::to_string)
        } else {
            Some(self.json)
        };
        tool_call(&self.block, args)
    }
}

/// A reply put together from stream events.
#[derive(Debug, Default)]
struct Assembly {
    text: String,
    input_tokens: u64,
    output_tokens: u64,
    stop_reason: Option<String>,
    model: Option<String>,
    tool_calls: Vec<ToolUse>,
    /// Content block index → tool call, for `input_json_delta`s.
    tool_blocks: Vec<(u64, usize)>,
}

impl Assembly {
    /// Takes one event; `Ok(true)` at `message_stop`.
    fn event(&mut self, v: &Value, name: Option<&str>, tokens: Option<TokenSink<'_>>) -> Result<bool, ProviderError> {
        let kind = v.get("type").and_then(Value::as_str).or(name).unwrap_or_default();
        match kind {
            "message_start" => {
                let usage = v.pointer("/message/usage");
                let count = |n: &str| usage.and_then(|u| u.get(n)).and_then(Value::as_u64).unwrap_or(0);
                self.input_tokens = count("input_tokens");
                self.output_tokens = count("output_tokens");
                self.model = v.get("message").and_then(super::openai::model_of);
            }
            "content_block_start" => {
                let block = v.get("content_block").unwrap_or(&Value::Null);
                match block.get("type").and_then(Value::as_str) {
                    Some("tool_use") => {
                        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                        self.tool_blocks.push((index, self.tool_calls.len()));
                        self.tool_calls.push(ToolUse {
                            block: block.clone(),
                            json: String::new(),
                        });
                    }
                    Some("text") => {
                        let text = block.get("text").and_then(Value::as_str).unwrap_or_default();
                        self.text_piece(text, tokens);
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = v.get("delta").unwrap_or(&Value::Null);
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        let text = delta.get("text").and_then(Value::as_str).unwrap_or_default();
                        self.text_piece(text, tokens);
                    }
                    Some("input_json_delta") => {
                        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                        let piece = delta.get("partial_json").and_then(Value::as_str).unwrap_or_default();
                        if let Some((_, at)) = self.tool_blocks.iter().find(|(i, _)| *i == index) {
                            self.tool_calls[*at].json.push_str(piece);
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_string());
                }
                // Output tokens are cumulative; some gateways put the input tokens here too.
                if let Some(n) = v.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    self.output_tokens = n;
                }
                if let Some(n) = v.pointer("/usage/input_tokens").and_then(Value::as_u64) {
                    self.input_tokens = n;
                }
            }
            "message_stop" => return Ok(true),
            "error" => return Err(error_event(v)),
            // ping, content_block_stop, and whatever comes later.
            _ => {}
        }
        Ok(false)
    }

    fn text_piece(&mut self, text: &str, tokens: Option<TokenSink<'_>>) {
        if text.is_empty() {
            return;
        }
        if let Some(sink) = tokens {
            sink(text);
        }
        self.text.push_str(text);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::providers::Message;

    #[test]
    fn the_system_prompt_is_top_level_and_max_tokens_defaults() {
        let request = ChatRequest {
            model: "claude".into(),
            messages: vec![Message::new("system", "Be brief."), Message::new("user", "Hi")],
            stop: vec!["END".into()],
            stream: true,
            ..ChatRequest::default()
        };
        let b = body(&request);
        assert_eq!(b["system"], "Be brief.");
        assert_eq!(b["messages"], json!([{"role": "user", "content": "Hi"}]));
        assert_eq!(b["max_tokens"], 4096);
        assert_eq!(b["stop_sequences"], json!(["END"]));
    }

    #[test]
    fn urls_take_a_base_with_or_without_v1() {
        let c = crate::net::client_builder().build().unwrap();
        assert_eq!(
            Anthropic::new(c.clone(), None, Key::default(), Limits::default()).url,
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(
            Anthropic::new(c, Some("http://127.0.0.1:9/v1/"), Key::default(), Limits::default()).url,
            "http://127.0.0.1:9/v1/messages"
        );
    }

    #[test]
    fn streamed_tool_use_comes_back_in_the_openai_shape() {
        let mut a = Assembly::default();
        for v in [
            json!({"type": "message_start", "message": {"model": "claude-x-20260101", "usage": {"input_tokens": 3}}}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"q\": "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"x\"}"}}),
        ] {
            a.event(&v, None, None).unwrap();
        }
        assert_eq!(a.model.as_deref(), Some("claude-x-20260101"));
        let calls: Vec<Value> = a.tool_calls.into_iter().map(ToolUse::finish).collect();
        assert_eq!(
            calls,
            vec![
                json!({"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}})
            ]
        );
    }
}
