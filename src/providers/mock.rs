//! The scripted `mock` provider: offline runs and tests. Replies are scripted per node (in call
//! order; the last reply repeats) or matched on the rendered prompt, and may stream in chunks,
//! take time, or fail with any provider error so retries and repairs can be exercised.
//!
//! ```yaml
//! replies:
//!   plan: ['{"subtopics": []}']
//!   summarize:
//!     - {error: rate_limit, retry_after: 0.01}
//!     - {text: "A summary.", chunks: ["A ", "summary."], usage: {prompt_tokens: 120, completion_tokens: 8}}
//!   agent:
//!     - {tool_calls: [{name: search, args: {q: "rust"}}]}   # ids default to call_1, call_2...
//!     - "The answer, from the search."
//!   "*": "a reply for any other node"
//! match:
//!   - {contains: "quantum", reply: "About quantum computing."}
//! ```

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use super::{ChatRequest, ChatResponse, Provider, ProviderError, TokenSink, Usage};

/// The fields a scripted reply may have.
const REPLY_KEYS: &[&str] = &[
    "text",
    "chunks",
    "usage",
    "delay",
    "tool_calls",
    "error",
    "message",
    "status",
    "retry_after",
];

/// The longest `delay` a script may ask for; longer ones are this.
const MAX_DELAY: Duration = Duration::from_secs(3600);

/// One scripted reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Text {
        text: String,
        chunks: Option<Vec<String>>,
        usage: Option<Usage>,
        delay: Duration,
        /// Tool calls the reply makes, in OpenAI's shape.
        tool_calls: Vec<Value>,
    },
    Fail {
        error: ProviderError,
        delay: Duration,
    },
}

/// Scripted replies.
#[derive(Debug, Default)]
pub struct MockProvider {
    replies: HashMap<String, Vec<Reply>>,
    matches: Vec<(String, Reply)>,
    calls: Mutex<HashMap<String, usize>>,
}

impl MockProvider {
    /// A mock with no script: every call fails with a message saying so.
    pub fn empty() -> MockProvider {
        MockProvider::default()
    }

    /// Reads a script (YAML or JSON) from a file.
    pub fn from_file(path: &std::path::Path) -> Result<MockProvider, String> {
        let file = crate::spec::load::read(path).map_err(|d| d.message)?;
        let doc =
            crate::spec::load::parse(file).map_err(|d| d.first().map(|d| d.message.clone()).unwrap_or_default())?;
        MockProvider::from_value(&doc.value)
    }

    /// Builds a mock from a script value.
    pub fn from_value(script: &Value) -> Result<MockProvider, String> {
        let mut mock = MockProvider::default();
        let obj = script
            .as_object()
            .ok_or("a mock script is a mapping with `replies` and/or `match`")?;
        for key in obj.keys() {
            if key != "replies" && key != "match" {
                return Err(format!("unknown field `{key}` (a script has `replies` and `match`)"));
            }
        }
        if let Some(replies) = obj.get("replies") {
            let replies = replies.as_object().ok_or("`replies` maps node names to replies")?;
            for (node, list) in replies {
                let list = match list {
                    Value::Array(items) => items.iter().map(parse_reply).collect::<Result<Vec<_>, _>>(),
                    one => parse_reply(one).map(|r| vec![r]),
                }
                .map_err(|e| format!("replies.{node}: {e}"))?;
                if list.is_empty() {
                    return Err(format!("replies.{node}: no reply"));
                }
                mock.replies.insert(node.clone(), list);
            }
        }
        if let Some(m) = obj.get("match") {
            for (i, entry) in m.as_array().ok_or("`match` is a list")?.iter().enumerate() {
                let contains = entry
                    .get("contains")
                    .and_then(Value::as_str)
                    .ok_or(format!("match[{i}]: needs `contains`"))?;
                let reply = entry.get("reply").ok_or(format!("match[{i}]: needs `reply`"))?;
                mock.matches.push((
                    contains.to_string(),
                    parse_reply(reply).map_err(|e| format!("match[{i}]: {e}"))?,
                ));
            }
        }
        Ok(mock)
    }

    /// The nodes the script has replies for (`*` aside) that are not among `nodes`: replies a
    /// run would never use, most often a misspelt node name.
    pub fn replies_for_unknown_nodes<'a>(&'a self, nodes: &[&str]) -> Vec<&'a str> {
        let mut unknown: Vec<&str> = self
            .replies
            .keys()
            .map(String::as_str)
            .filter(|n| *n != "*" && !nodes.contains(n))
            .collect();
        unknown.sort_unstable();
        unknown
    }

    /// How many calls each node has made.
    pub fn calls(&self) -> HashMap<String, usize> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn next_reply(&self, request: &ChatRequest) -> Result<Reply, ProviderError> {
        let prompt: String = request
            .messages
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let n = {
            let mut calls = self
                .calls
                .lock()
                .map_err(|_| ProviderError::Malformed("mock state poisoned".into()))?;
            let n = calls.entry(request.node.clone()).or_insert(0);
            *n += 1;
            *n - 1
        };
        if let Some((_, reply)) = self.matches.iter().find(|(needle, _)| prompt.contains(needle.as_str())) {
            return Ok(reply.clone());
        }
        let list = self
            .replies
            .get(&request.node)
            .or_else(|| self.replies.get("*"))
            .ok_or_else(|| {
                ProviderError::BadRequest(format!(
                    "the mock script has no reply for node `{}` (add `replies: {{{}: [...]}}`)",
                    request.node, request.node
                ))
            })?;
        Ok(list[n.min(list.len() - 1)].clone())
    }
}

fn parse_reply(v: &Value) -> Result<Reply, String> {
    match v {
        Value::String(s) => Ok(Reply::Text {
            text: s.clone(),
            chunks: None,
            usage: None,
            delay: Duration::ZERO,
            tool_calls: Vec::new(),
        }),
        Value::Object(o) => {
            if let Some(key) = o.keys().find(|k| !REPLY_KEYS.contains(&k.as_str())) {
                return Err(format!(
                    "unknown field `{key}` in a reply (a reply takes {})",
                    REPLY_KEYS.join(", ")
                ));
            }
            let delay = match o.get("delay") {
                None => Duration::ZERO,
                Some(d) => serde_json::from_value::<crate::spec::Duration>(d.clone())
                    .ok()
                    .and_then(|d| d.to_std())
                    .ok_or_else(|| {
                        format!("`delay` is a duration: seconds, or text such as `200ms` or `1.5s`, not {d}")
                    })?
                    .min(MAX_DELAY),
            };
            if let Some(kind) = o.get("error") {
                let kind = kind.as_str().ok_or("`error` is a name")?;
                let message = o
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("scripted failure")
                    .to_string();
                let status = o.get("status").and_then(Value::as_u64).map(|s| s as u16);
                let retry_after = o.get("retry_after").and_then(Value::as_f64);
                let error = ProviderError::named(kind, message, status, retry_after)
                    .ok_or_else(|| format!("unknown error `{kind}`"))?;
                return Ok(Reply::Fail { error, delay });
            }
            let tool_calls = match o.get("tool_calls") {
                Some(Value::Array(calls)) => calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        if c.get("name").and_then(Value::as_str).is_none() && c.get("function").is_none() {
                            return Err(format!("tool_calls[{i}]: a call needs a `name`"));
                        }
                        let mut call = super::tool_call_openai(c);
                        if call["id"].as_str().is_none_or(str::is_empty) {
                            call["id"] = Value::String(format!("call_{}", i + 1));
                        }
                        Ok(call)
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(_) => return Err("`tool_calls` is a list of {name, args}".into()),
                None => Vec::new(),
            };
            let text = match o.get("text") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None if !tool_calls.is_empty() => String::new(),
                None => return Err("a reply needs `text`, `tool_calls` or `error`".into()),
            };
            let chunks = match o.get("chunks") {
                Some(Value::Array(c)) => Some(c.iter().map(|x| x.as_str().unwrap_or_default().to_string()).collect()),
                _ => None,
            };
            let usage = o.get("usage").map(|u| {
                let p = u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
                let c = u.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0);
                Usage::tokens(p, c)
            });
            Ok(Reply::Text {
                text,
                chunks,
                usage,
                delay,
                tool_calls,
            })
        }
        // A JSON value scripted as data is the reply's text.
        other => Ok(Reply::Text {
            text: other.to_string(),
            chunks: None,
            usage: None,
            delay: Duration::ZERO,
            tool_calls: Vec::new(),
        }),
    }
}

/// A deterministic token estimate: about four characters a token.
fn estimate(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

/// Waits `delay`, to a fraction of a millisecond: the runtime's timer counts whole
/// milliseconds and rounds up (a 1 ms sleep there takes 1–2 ms, which would double a scripted
/// model's short latency), so the last two milliseconds are slept on a blocking thread.
async fn pause(delay: Duration) {
    const COARSE: Duration = Duration::from_millis(2);
    if delay.is_zero() {
        return;
    }
    let deadline = std::time::Instant::now() + delay;
    if delay > COARSE {
        tokio::time::sleep(delay - COARSE).await;
    }
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if !left.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(left)).await;
    }
}

impl Provider for MockProvider {
    fn chat<'a>(
        &'a self,
        request: ChatRequest,
        tokens: Option<TokenSink<'a>>,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let reply = self.next_reply(&request)?;
            match reply {
                Reply::Fail { error, delay } => {
                    pause(delay).await;
                    Err(error)
                }
                Reply::Text {
                    text,
                    chunks,
                    usage,
                    delay,
                    tool_calls,
                } => {
                    pause(delay).await;
                    if let (Some(sink), true) = (tokens, request.stream) {
                        match &chunks {
                            Some(parts) => parts.iter().for_each(|p| sink(p)),
                            None => sink(&text),
                        }
                    }
                    let usage = usage.unwrap_or_else(|| {
                        let p: u64 = request.messages.iter().map(|m| estimate(&m.content)).sum();
                        Usage::tokens(p, estimate(&text))
                    });
                    Ok(ChatResponse {
                        text,
                        usage,
                        finish_reason: Some(if tool_calls.is_empty() { "stop" } else { "tool_calls" }.into()),
                        tool_calls,
                        model: None,
                    })
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    /// The JSON Schema of mock scripts (schemas/mock.schema.json, for editors) lists exactly
    /// the reply keys the reader accepts.
    #[test]
    fn the_mock_schema_lists_the_reply_keys_read() {
        let schema: Value = serde_json::from_str(include_str!("../../schemas/mock.schema.json")).unwrap();
        let object = &schema["$defs"]["reply"]["anyOf"][4];
        let mut listed: Vec<&str> = object["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut read = REPLY_KEYS.to_vec();
        listed.sort_unstable();
        read.sort_unstable();
        assert_eq!(listed, read);
    }

    use super::{MockProvider, REPLY_KEYS, Reply};
    use serde_json::Value;
    use serde_json::json;
    use std::time::Duration;

    /// A delay is a duration as everywhere in the language: `200ms` is 0.2 s, not 0.
    #[test]
    fn a_delay_is_a_duration() {
        let mock = MockProvider::from_value(
            &json!({"replies": {"a": {"text": "x", "delay": "200ms"}, "b": {"text": "y", "delay": 1.5}}}),
        )
        .unwrap();
        let delay = |node: &str| match &mock.replies[node][0] {
            Reply::Text { delay, .. } => *delay,
            Reply::Fail { delay, .. } => *delay,
        };
        assert_eq!(delay("a"), Duration::from_millis(200));
        assert_eq!(delay("b"), Duration::from_millis(1500));
        let err = MockProvider::from_value(&json!({"replies": {"a": {"text": "x", "delay": "soon"}}})).unwrap_err();
        assert!(err.contains("`delay` is a duration"), "{err}");
    }

    /// A reply's unknown field is an error naming it, not silently ignored.
    #[test]
    fn an_unknown_reply_field_is_refused() {
        let err = MockProvider::from_value(&json!({"replies": {"a": {"text": "x", "colour": "red"}}})).unwrap_err();
        assert!(err.contains("unknown field `colour`"), "{err}");
    }

    /// Replies for nodes a workflow lacks are found (`*` serves any node).
    #[test]
    fn replies_for_nodes_the_workflow_lacks_are_found() {
        let mock = MockProvider::from_value(&json!({"replies": {"ask": "a", "aks": "b", "*": "c"}})).unwrap();
        assert_eq!(mock.replies_for_unknown_nodes(&["ask"]), ["aks"]);
    }
}
