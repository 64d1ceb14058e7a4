//! Model providers behind one interface: a chat request in, a reply (with usage) out, tokens
//! streamed to a callback as they arrive, failures typed so retry policies can choose.
//!
//! Architecture Invariant: only providers/ and nodes/ touch the network; the engine sees this
//! trait and nothing of HTTP.

pub mod anthropic;
pub mod cassette;
pub(crate) mod http;
pub mod mock;
pub mod openai;
pub mod sse;
pub mod trace;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error_class::ErrorClass;
use crate::spec::{ModelProfile, Pricing, Provider as ProviderKind};

/// A chat message: `system`, `user`, `assistant` (which may carry the tool calls it made) or
/// `tool` (one call's result, naming the call it answers).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant message's tool calls, in OpenAI's shape (`{id, type: "function", function:
    /// {name, arguments}}`, the arguments a JSON text), whichever provider made them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<Value>,
    /// A tool message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool message: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A tool message whose call failed (sent to the model as an error result).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl Message {
    /// A message of `role` with text `content` and nothing else.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            ..Message::default()
        }
    }

    /// A chat message as state holds it: `{role, content}` (OpenAI's names: `tool_calls`,
    /// `tool_call_id`, `name`) or LangChain's message dict (`type: human | ai | tool | system`,
    /// tool calls as `{id, name, args}`); a plain string is a user message. Content given as
    /// blocks is joined from their text.
    pub fn from_value(v: &Value) -> Message {
        let Value::Object(m) = v else {
            return Message::new("user", v.as_str().map_or_else(|| v.to_string(), str::to_string));
        };
        let role = match m.get("role").or_else(|| m.get("type")).and_then(Value::as_str) {
            Some("human") => "user",
            Some("ai") | Some("AIMessageChunk") => "assistant",
            Some(r) => r,
            None => "user",
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(blocks)) => blocks
                .iter()
                .filter_map(|b| b.as_str().or_else(|| b.get("text").and_then(Value::as_str)))
                .collect::<Vec<_>>()
                .join(""),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        let tool_calls = match m.get("tool_calls") {
            Some(Value::Array(calls)) => calls.iter().map(tool_call_openai).collect(),
            _ => Vec::new(),
        };
        Message {
            role: role.to_string(),
            content,
            tool_calls,
            tool_call_id: m.get("tool_call_id").and_then(Value::as_str).map(str::to_string),
            name: m.get("name").and_then(Value::as_str).map(str::to_string),
            is_error: m.get("status").and_then(Value::as_str) == Some("error")
                || m.get("is_error").and_then(Value::as_bool) == Some(true),
        }
    }
}

/// A tool call in OpenAI's shape, from that shape or LangChain's (`{id, name, args}`, the
/// arguments an object).
pub fn tool_call_openai(call: &Value) -> Value {
    if call.get("function").is_some() {
        return call.clone();
    }
    let args = match call.get("args").or_else(|| call.get("arguments")) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "{}".into(),
    };
    serde_json::json!({
        "id": call.get("id").and_then(Value::as_str).unwrap_or_default(),
        "type": "function",
        "function": {
            "name": call.get("name").and_then(Value::as_str).unwrap_or_default(),
            "arguments": args,
        }
    })
}

/// One model call.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatRequest {
    /// The node making the call (providers may key scripted replies on it).
    pub node: String,
    pub model: String,
    pub messages: Vec<Message>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub seed: Option<i64>,
    /// Ask for JSON matching this schema, where the provider supports it.
    pub json_schema: Option<Value>,
    /// Extra request fields passed through unchanged.
    pub options: serde_json::Map<String, Value>,
    pub stream: bool,
}

/// Tokens and cost of calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub cost: f64,
    pub calls: u64,
}

impl Usage {
    /// One call's usage from its token counts (cost is set by [`price`]).
    pub fn tokens(prompt_tokens: u64, completion_tokens: u64) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            cost: 0.0,
            calls: 1,
        }
    }

    /// This usage less `other` (a part of it), never below zero.
    pub fn less(&self, other: &Usage) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens.saturating_sub(other.prompt_tokens),
            completion_tokens: self.completion_tokens.saturating_sub(other.completion_tokens),
            total_tokens: self.total_tokens.saturating_sub(other.total_tokens),
            cost: (self.cost - other.cost).max(0.0),
            calls: self.calls.saturating_sub(other.calls),
        }
    }

    pub fn add(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        self.cost += other.cost;
        self.calls += other.calls;
    }
}

/// A model's reply.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatResponse {
    pub text: String,
    pub usage: Usage,
    pub finish_reason: Option<String>,
    /// Tool (function) calls the model asked for, as the API sent them (OpenAI's shape:
    /// `{id, type, function: {name, arguments}}`, streamed fragments joined).
    pub tool_calls: Vec<Value>,
    /// The model the server says made the reply (`model` in both APIs' replies), when it says:
    /// an alias or a router may answer with another model than the one asked for.
    pub model: Option<String>,
}

impl ChatResponse {
    /// The server stopped the reply at its completion cap (OpenAI's `finish_reason: length`,
    /// Anthropic's `stop_reason: max_tokens`): the text is cut, not finished.
    pub fn hit_cap(&self) -> bool {
        matches!(self.finish_reason.as_deref(), Some("length" | "max_tokens"))
    }
}

/// A failed call, typed so retry policies can choose.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    #[error("rate limited{}", retry_after.map(|s| format!(" (retry after {s:.1}s)")).unwrap_or_default())]
    RateLimited { retry_after: Option<f64> },
    #[error("server error {status}: {message}")]
    Server { status: u16, message: String },
    #[error("the call timed out")]
    Timeout,
    #[error("the connection failed: {0}")]
    Network(String),
    #[error("the stream was cut off: {0}")]
    StreamCut(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The server said the prompt does not fit the model's context window.
    #[error("the prompt does not fit the model's context: {0}")]
    ContextLength(String),
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The reply was larger than its profile allows (`max_reply_bytes`).
    #[error("reply too large: {0}")]
    TooLarge(String),
}

impl ProviderError {
    /// The error of a class named as in scripts and cassettes (`rate_limit`, `server`,
    /// `timeout`, `network`, `stream`, `bad_request`, `auth`, `context_length`, `malformed`,
    /// `too_large`); `None`
    /// for another name. A `retry_after` read from a file is kept within
    /// [`crate::net::http_error::MAX_RETRY_AFTER`], as a server's is.
    pub fn named(class: &str, message: String, status: Option<u16>, retry_after: Option<f64>) -> Option<ProviderError> {
        Some(match class {
            "rate_limit" => ProviderError::RateLimited {
                retry_after: retry_after
                    .filter(|s| *s >= 0.0)
                    .map(|s| s.min(crate::net::http_error::MAX_RETRY_AFTER.as_secs_f64())),
            },
            "server" => ProviderError::Server {
                status: status.unwrap_or(500),
                message,
            },
            "timeout" => ProviderError::Timeout,
            "network" => ProviderError::Network(message),
            "stream" => ProviderError::StreamCut(message),
            "bad_request" => ProviderError::BadRequest(message),
            "auth" => ProviderError::Auth(message),
            "context_length" => ProviderError::ContextLength(message),
            "malformed" => ProviderError::Malformed(message),
            "too_large" => ProviderError::TooLarge(message),
            _ => return None,
        })
    }

    pub fn class(&self) -> ErrorClass {
        match self {
            ProviderError::RateLimited { .. } => ErrorClass::RateLimit,
            ProviderError::Server { .. } => ErrorClass::Server,
            ProviderError::Timeout => ErrorClass::Timeout,
            ProviderError::Network(_) => ErrorClass::Network,
            ProviderError::StreamCut(_) => ErrorClass::Stream,
            ProviderError::BadRequest(_) => ErrorClass::BadRequest,
            ProviderError::Auth(_) => ErrorClass::Auth,
            ProviderError::ContextLength(_) => ErrorClass::ContextLength,
            ProviderError::Malformed(_) | ProviderError::TooLarge(_) => ErrorClass::Invalid,
        }
    }
}

/// Receives streamed text as it arrives.
pub type TokenSink<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// A model provider.
pub trait Provider: Send + Sync {
    /// Makes one call. When `tokens` is given and the request streams, every chunk of text is
    /// passed to it as it arrives; the returned text is the whole reply. A call that fails
    /// mid-stream returns an error, never a partial reply.
    fn chat<'a>(
        &'a self,
        request: ChatRequest,
        tokens: Option<TokenSink<'a>>,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>>;
}

/// Vectors for texts, one per text, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub usage: Usage,
}

/// An embeddings model.
pub trait Embedder: Send + Sync {
    /// Who makes the vectors (e.g. `openai:text-embedding-3-small`): an index built by one
    /// embedder cannot be searched with another's vectors.
    fn id(&self) -> &str;

    /// Embeds `texts`, one vector per text.
    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>>;
}

/// The providers of a run, by model profile name.
#[derive(Clone, Default)]
pub struct Providers {
    by_profile: HashMap<String, (Arc<dyn Provider>, ModelProfile)>,
    /// Embeddings models by profile name (profiles whose API serves embeddings).
    embedders: HashMap<String, Arc<dyn Embedder>>,
    /// When set, every profile without its own is served by this (e.g. `--mock script.yaml`).
    fallback: Option<Arc<dyn Provider>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers")
            .field("profiles", &self.by_profile.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Why a provider could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(
        "model profile `{profile}` reads its API key from the environment variable `{var}`, which is not set (or set the profile's `api_key_env`, or run offline with `--mock FILE`)"
    )]
    MissingKey { profile: String, var: String },
    #[error("model profile `{0}`: {1}")]
    Profile(String, String),
    #[error("mock script: {0}")]
    Mock(String),
}

impl Providers {
    /// Providers for a plan's model profiles. `mock` serves every profile whose provider is
    /// `mock`, and every other profile too when `override_all` is set. Other profiles get their
    /// API's client, with `${env:...}` in their fields expanded and their key read through
    /// `env` (the run's environment: the run builder gives its `Env`, a test a map; never the
    /// process's own); every `openai` profile also gets an embedder.
    pub fn for_models_in(
        models: &indexmap::IndexMap<String, ModelProfile>,
        mock: Option<Arc<mock::MockProvider>>,
        override_all: bool,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Providers, SetupError> {
        let mut out = Providers::default();
        let mut client = None;
        for (name, profile) in models {
            let (provider, profile): (Arc<dyn Provider>, ModelProfile) = match (profile.provider, &mock) {
                (_, Some(m)) if override_all => (m.clone(), profile.clone()),
                (ProviderKind::Mock, Some(m)) => (m.clone(), profile.clone()),
                (ProviderKind::Mock, None) => (Arc::new(mock::MockProvider::empty()), profile.clone()),
                (kind, _) => {
                    let (profile, key) = resolve(name, profile, env)?;
                    let client = match &client {
                        Some(c) => Clone::clone(c),
                        None => {
                            let c = http_client().map_err(|e| SetupError::Profile(name.clone(), e))?;
                            client = Some(c.clone());
                            c
                        }
                    };
                    let limits = http::Limits::of(&profile);
                    let provider: Arc<dyn Provider> = if kind == ProviderKind::Anthropic {
                        Arc::new(anthropic::Anthropic::new(
                            client,
                            profile.base_url.as_deref(),
                            key,
                            limits,
                        ))
                    } else {
                        let endpoint = Arc::new(openai::Endpoint::new(
                            client,
                            profile.base_url.as_deref(),
                            profile.api_version.clone(),
                            key,
                            limits,
                        ));
                        out.embedders.insert(
                            name.clone(),
                            Arc::new(openai::OpenAiEmbedder::new(endpoint.clone(), &profile.model)),
                        );
                        Arc::new(openai::OpenAi::new(endpoint))
                    };
                    (provider, profile)
                }
            };
            out.by_profile.insert(name.clone(), (provider, profile));
        }
        if let Some(m) = mock {
            out.fallback = Some(m);
        }
        Ok(out)
    }

    /// Every profile of `models` served by `provider`, whatever its own provider is (a
    /// cassette replay: nothing else may be reached).
    pub fn serve_all(models: &indexmap::IndexMap<String, ModelProfile>, provider: Arc<dyn Provider>) -> Providers {
        let mut out = Providers::default();
        for (name, profile) in models {
            out.by_profile.insert(name.clone(), (provider.clone(), profile.clone()));
        }
        out.fallback = Some(provider);
        out
    }

    /// Every provider (and the fallback) passed through `wrap`, e.g. to record their calls.
    pub fn wrap(mut self, wrap: impl Fn(Arc<dyn Provider>) -> Arc<dyn Provider>) -> Providers {
        for (provider, _) in self.by_profile.values_mut() {
            *provider = wrap(provider.clone());
        }
        self.fallback = self.fallback.map(&wrap);
        self
    }

    /// Every embeddings model passed through `wrap` with its profile name, e.g. to record calls.
    pub fn wrap_embedders(mut self, wrap: impl Fn(&str, Arc<dyn Embedder>) -> Arc<dyn Embedder>) -> Providers {
        for (name, embedder) in self.embedders.iter_mut() {
            *embedder = wrap(name, embedder.clone());
        }
        self
    }

    /// Sets the embeddings model of profile `name` (e.g. one replayed from a cassette).
    pub fn set_embedder(&mut self, name: &str, embedder: Arc<dyn Embedder>) {
        self.embedders.insert(name.to_string(), embedder);
    }

    /// The embeddings model of profile `name`, when its API serves one. Mock profiles (and
    /// every profile under `--mock`) have none: callers fall back to an offline embedder.
    pub fn embedder(&self, name: &str) -> Option<Arc<dyn Embedder>> {
        self.embedders.get(name).cloned()
    }

    /// The provider and profile for `name`.
    pub fn get(&self, name: &str) -> Option<(Arc<dyn Provider>, &ModelProfile)> {
        self.by_profile.get(name).map(|(p, m)| (p.clone(), m))
    }
}

/// A profile with `${env:...}` expanded in its string fields, and its API key. The key comes
/// from the variable `api_key_env` names; without one, OpenAI's own API reads
/// `OPENAI_API_KEY` and Anthropic's `ANTHROPIC_API_KEY`, and any other server is keyless.
fn resolve(
    name: &str,
    profile: &ModelProfile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(ModelProfile, http::Key), SetupError> {
    let expand = |field: &str, text: &str| {
        crate::spec::interp::expand_env(text, env)
            .map_err(|e| SetupError::Profile(name.into(), format!("`{field}`: {e}")))
    };
    let mut p = profile.clone();
    p.model = expand("model", &p.model)?;
    for (field, slot) in [
        ("base_url", &mut p.base_url),
        ("api_key_env", &mut p.api_key_env),
        ("api_version", &mut p.api_version),
    ] {
        if let Some(v) = slot {
            *v = expand(field, v)?;
        }
    }
    if let Some(base) = &p.base_url
        && url::Url::parse(base).map(|u| !u.has_host()).unwrap_or(true)
    {
        return Err(SetupError::Profile(
            name.into(),
            format!("`base_url` `{base}` is not an http(s) URL"),
        ));
    }
    let var = p
        .api_key_env
        .clone()
        .filter(|v| !v.is_empty())
        .or_else(|| match p.provider {
            ProviderKind::Anthropic => Some("ANTHROPIC_API_KEY".into()),
            ProviderKind::Openai if p.base_url.is_none() => Some("OPENAI_API_KEY".into()),
            _ => None,
        });
    let key = match var {
        Some(var) => match env(&var).filter(|v| !v.is_empty()) {
            Some(v) => http::Key::new(Some(v)),
            None => {
                // The message names the variable as the workflow wrote it: `api_key_env:
                // "${env:KEY}"` expands to the key itself, which must never be printed.
                let var = profile
                    .api_key_env
                    .clone()
                    .filter(|raw| !raw.is_empty() && *raw != var)
                    .unwrap_or(var);
                return Err(SetupError::MissingKey {
                    profile: name.into(),
                    var,
                });
            }
        },
        None => http::Key::default(),
    };
    Ok((p, key))
}

/// A profile overridden by a `--model` spec: `provider:model` with an optional `@base_url`.
/// Providers are `openai`, `anthropic`, `mock`, and the local OpenAI-compatible servers
/// `ollama`, `llamacpp`, `vllm` and `lmstudio` (keyless, at their usual local address).
/// Sampling settings, timeout and options are kept. Pricing belongs to a model: the profile's
/// own is kept when the model stays the same, a local server's is zero, a model of
/// [`KNOWN_PRICES`] gets its price, and any other is left without one (the caller states it,
/// and `--price` gives one).
pub fn override_profile(profile: &ModelProfile, spec: &str) -> Result<ModelProfile, String> {
    let (provider, rest) = spec
        .split_once(':')
        .ok_or_else(|| format!("`{spec}` is not PROVIDER:MODEL[@BASE_URL]"))?;
    let (model, base) = match rest.split_once('@') {
        Some((m, b)) => (m, Some(b.to_string())),
        None => (rest, None),
    };
    if model.is_empty() {
        return Err(format!("`{spec}` names no model"));
    }
    let local = |url: &str| (ProviderKind::Openai, Some(url.to_string()), None);
    let (kind, default_base, key_env) = match provider {
        "openai" => (ProviderKind::Openai, None, Some("OPENAI_API_KEY".to_string())),
        "anthropic" => (ProviderKind::Anthropic, None, Some("ANTHROPIC_API_KEY".to_string())),
        "mock" => (ProviderKind::Mock, None, None),
        "ollama" => local("http://127.0.0.1:11434/v1"),
        "llamacpp" | "llama.cpp" => local("http://127.0.0.1:8080/v1"),
        "vllm" => local("http://127.0.0.1:8000/v1"),
        "lmstudio" => local("http://127.0.0.1:1234/v1"),
        other => {
            return Err(format!(
                "unknown provider `{other}` in `{spec}` (openai, anthropic, ollama, llamacpp, vllm, lmstudio, mock)"
            ));
        }
    };
    let same = profile.provider == kind;
    let key_env = match (provider, &base) {
        // A server of the user's choosing: the profile's key variable if it spoke this API.
        ("openai", Some(_)) => profile.api_key_env.clone().filter(|_| same),
        ("anthropic", _) => profile.api_key_env.clone().filter(|_| same).or(key_env),
        _ => key_env,
    };
    let local_server = !matches!(provider, "openai" | "anthropic" | "mock");
    let pricing = if same && profile.model == model {
        profile.pricing.clone()
    } else if local_server {
        Some(Pricing {
            input: 0.0,
            output: 0.0,
        })
    } else if base.is_some() {
        // Another server may price the same name differently.
        None
    } else {
        known_price(provider, model)
    };
    let mut p = profile.clone();
    p.provider = kind;
    p.model = model.to_string();
    p.base_url = base.or(default_base);
    p.api_key_env = key_env;
    p.api_version = None;
    p.pricing = pricing;
    Ok(p)
}

/// Prices per million tokens (input, output) of common hosted models, in US dollars as their
/// providers list them (2025); a model name matches its longest listed prefix, so dated
/// snapshots (`gpt-4o-mini-2024-07-18`) and `-latest` names are found too.
pub const KNOWN_PRICES: &[(&str, &str, f64, f64)] = &[
    ("openai", "gpt-4o-mini", 0.15, 0.60),
    ("openai", "gpt-4o", 2.50, 10.00),
    ("openai", "gpt-4.1-nano", 0.10, 0.40),
    ("openai", "gpt-4.1-mini", 0.40, 1.60),
    ("openai", "gpt-4.1", 2.00, 8.00),
    ("openai", "o4-mini", 1.10, 4.40),
    ("openai", "o3-mini", 1.10, 4.40),
    ("anthropic", "claude-3-haiku", 0.25, 1.25),
    ("anthropic", "claude-3-5-haiku", 0.80, 4.00),
    ("anthropic", "claude-haiku-4-5", 1.00, 5.00),
    ("anthropic", "claude-3-5-sonnet", 3.00, 15.00),
    ("anthropic", "claude-3-7-sonnet", 3.00, 15.00),
    ("anthropic", "claude-sonnet-4", 3.00, 15.00),
    ("anthropic", "claude-opus-4", 15.00, 75.00),
];

/// The listed price of `model` on `provider`'s own API, by its longest matching prefix.
pub fn known_price(provider: &str, model: &str) -> Option<Pricing> {
    KNOWN_PRICES
        .iter()
        .filter(|(p, prefix, ..)| *p == provider && model.starts_with(prefix))
        .max_by_key(|(_, prefix, ..)| prefix.len())
        .map(|&(_, _, input, output)| Pricing { input, output })
}

/// A `--price` value, `IN,OUT` per million tokens.
pub fn parse_price(text: &str) -> Result<Pricing, String> {
    let bad = || format!("`{text}` is not IN,OUT (prices per million prompt and completion tokens, e.g. 0.15,0.6)");
    let (input, output) = text.split_once(',').ok_or_else(bad)?;
    let number = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
            .ok_or_else(bad)
    };
    Ok(Pricing {
        input: number(input)?,
        output: number(output)?,
    })
}

/// What a model is told when the schema cannot be sent as a request field.
pub(crate) fn schema_instruction(schema: &Value) -> String {
    format!("Reply with only a JSON value (no prose, no code fence) that matches this JSON Schema:\n{schema}")
}

/// The cost of `usage` under a profile's pricing (per million tokens).
pub fn price(profile: &ModelProfile, usage: &mut Usage) {
    if let Some(p) = &profile.pricing {
        usage.cost = (usage.prompt_tokens as f64 * p.input + usage.completion_tokens as f64 * p.output) / 1_000_000.0;
    }
}

/// The HTTP client every model provider sends through, made once per process: its connection
/// pool (and the TLS roots it loads) outlives a run, so a server's runs, a workflow's test
/// cases and a run's nodes reuse their connections to the model's API instead of opening and
/// securing one per run.
fn http_client() -> Result<reqwest::Client, String> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    let c = crate::net::client_builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| format!("no HTTP client: {e}"))?;
    Ok(CLIENT.get_or_init(|| c).clone())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn profile(v: Value) -> ModelProfile {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_missing_key_message_never_prints_a_value() {
        let p = profile(json!({"provider": "openai", "model": "m", "api_key_env": "${env:REAL_KEY}"}));
        let env = |name: &str| (name == "REAL_KEY").then(|| "sk-canary-123".to_string());
        let Err(e) = resolve("default", &p, &env) else {
            panic!("a key variable named by a key's value is not set")
        };
        let msg = e.to_string();
        assert!(!msg.contains("sk-canary"), "{msg}");
        assert!(msg.contains("`${env:REAL_KEY}`"), "{msg}");
        let p = profile(json!({"provider": "openai", "model": "m", "api_key_env": "NOT_SET"}));
        let Err(e) = resolve("default", &p, &env) else {
            panic!("NOT_SET is not set")
        };
        assert!(e.to_string().contains("variable `NOT_SET`"), "{e}");
    }

    #[test]
    fn model_specs_override_provider_model_url_and_key() {
        let base = profile(json!({"provider": "openai", "model": "gpt-4o", "api_key_env": "MY_KEY",
            "temperature": 0.2, "pricing": {"input": 1, "output": 2}}));
        let o = override_profile(&base, "ollama:llama3.2").unwrap();
        assert_eq!((o.provider, o.model.as_str()), (ProviderKind::Openai, "llama3.2"));
        assert_eq!(o.base_url.as_deref(), Some("http://127.0.0.1:11434/v1"));
        assert_eq!(o.api_key_env, None);
        assert_eq!(o.temperature, Some(0.2));
        // A local server costs nothing, and says so.
        assert_eq!(o.pricing.map(|p| (p.input, p.output)), Some((0.0, 0.0)));
        let o = override_profile(&base, "llamacpp:any@http://10.0.0.2:8080/v1").unwrap();
        assert_eq!(o.base_url.as_deref(), Some("http://10.0.0.2:8080/v1"));
        let o = override_profile(&base, "openai:gpt-4o-mini").unwrap();
        assert_eq!((o.base_url, o.api_key_env.as_deref()), (None, Some("OPENAI_API_KEY")));
        // A server of the user's choosing keeps the profile's key variable.
        let o = override_profile(&base, "openai:m@https://openrouter.ai/api/v1").unwrap();
        assert_eq!(o.api_key_env.as_deref(), Some("MY_KEY"));
        let o = override_profile(&base, "anthropic:claude-3-5-haiku-latest").unwrap();
        assert_eq!(
            (o.provider, o.api_key_env.as_deref()),
            (ProviderKind::Anthropic, Some("ANTHROPIC_API_KEY"))
        );
        assert!(override_profile(&base, "gpt-4o").is_err());
        assert!(override_profile(&base, "openai:").is_err());
        assert!(
            override_profile(&base, "bard:x")
                .unwrap_err()
                .contains("unknown provider `bard`")
        );
    }

    #[test]
    fn an_override_keeps_or_states_its_price() {
        let base = profile(json!({"provider": "openai", "model": "gpt-4o", "pricing": {"input": 1, "output": 2}}));
        let price = |spec: &str| {
            override_profile(&base, spec)
                .unwrap()
                .pricing
                .map(|p| (p.input, p.output))
        };
        assert_eq!(price("openai:gpt-4o"), Some((1.0, 2.0)));
        assert_eq!(price("openai:gpt-4o-mini"), Some((0.15, 0.60)));
        assert_eq!(price("openai:gpt-4o-mini-2024-07-18"), Some((0.15, 0.60)));
        assert_eq!(price("anthropic:claude-3-5-haiku-latest"), Some((0.80, 4.00)));
        assert_eq!(price("llamacpp:smollm2"), Some((0.0, 0.0)));
        assert_eq!(price("openai:unknown-model"), None);
        assert_eq!(price("openai:gpt-4o-mini@https://openrouter.ai/api/v1"), None);
        let p = parse_price("0.15, 0.6").unwrap();
        assert_eq!((p.input, p.output), (0.15, 0.6));
        assert!(parse_price("0.15").is_err());
        assert!(parse_price("-1,2").is_err());
    }

    #[test]
    fn a_base_url_that_is_not_a_url_is_refused_at_setup() {
        let models = indexmap::IndexMap::from([(
            "default".to_string(),
            profile(json!({"provider": "openai", "model": "m", "base_url": "localhost:8080"})),
        )]);
        let e = Providers::for_models_in(&models, None, false, &|_| None).unwrap_err();
        assert!(e.to_string().contains("`localhost:8080`"), "{e}");
    }
}
