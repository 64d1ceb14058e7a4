//! Model providers behind one interface: a chat request in, a reply (with usage) out, tokens
//! streamed to a callback as they arrive, failures typed so retry policies can choose.
//!
//! Architecture Invariant: only providers/ and nodes/ touch the network; the engine sees this
//! trait and nothing of HTTP.

pub mod mock;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{ErrorClass, ModelProfile, Provider as ProviderKind};

/// A chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
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
    #[error("malformed response: {0}")]
    Malformed(String),
}

impl ProviderError {
    pub fn class(&self) -> ErrorClass {
        match self {
            ProviderError::RateLimited { .. } => ErrorClass::RateLimit,
            ProviderError::Server { .. } => ErrorClass::Server,
            ProviderError::Timeout => ErrorClass::Timeout,
            ProviderError::Network(_) => ErrorClass::Network,
            ProviderError::StreamCut(_) => ErrorClass::Stream,
            ProviderError::BadRequest(_) => ErrorClass::BadRequest,
            ProviderError::Auth(_) => ErrorClass::Auth,
            ProviderError::Malformed(_) => ErrorClass::Invalid,
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
        "model profile `{0}` uses provider `{1}`, which this build cannot reach yet; run offline with `--mock FILE`"
    )]
    Unsupported(String, String),
    #[error("mock script: {0}")]
    Mock(String),
}

impl Providers {
    /// Providers for a plan's model profiles. `mock` serves every profile whose provider is
    /// `mock`, and every other profile too when `override_all` is set.
    pub fn for_models(
        models: &indexmap::IndexMap<String, ModelProfile>,
        mock: Option<Arc<mock::MockProvider>>,
        override_all: bool,
    ) -> Result<Providers, SetupError> {
        let mut out = Providers::default();
        for (name, profile) in models {
            let provider: Arc<dyn Provider> = match (profile.provider, &mock) {
                (_, Some(m)) if override_all => m.clone(),
                (ProviderKind::Mock, Some(m)) => m.clone(),
                (ProviderKind::Mock, None) => Arc::new(mock::MockProvider::empty()),
                (kind, _) => {
                    return Err(SetupError::Unsupported(
                        name.clone(),
                        format!("{kind:?}").to_lowercase(),
                    ));
                }
            };
            out.by_profile.insert(name.clone(), (provider, profile.clone()));
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

/// The cost of `usage` under a profile's pricing (per million tokens).
pub fn price(profile: &ModelProfile, usage: &mut Usage) {
    if let Some(p) = &profile.pricing {
        usage.cost = (usage.prompt_tokens as f64 * p.input + usage.completion_tokens as f64 * p.output) / 1_000_000.0;
    }
}
