//! The cassette behind the provider traits: a recording wrapper around any model provider or
//! embedder, and replaying ones that serve every call from a cassette (replies, typed
//! failures, streamed chunks, vectors).

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::{ChatRequest, ChatResponse, Embedder, Embeddings, Provider, ProviderError, TokenSink, Usage};
use crate::cassette::Cassette;

/// The kind of exchange a model call is recorded as.
pub const LLM: &str = "llm";
/// The kind of exchange an embeddings call is recorded as.
pub const EMBED: &str = "embed";

/// The canonical form of a model call: what decides its reply, never credentials.
pub fn request_key(request: &ChatRequest) -> Value {
    json!({
        "node": request.node,
        "model": request.model,
        "messages": request.messages,
        "json_schema": request.json_schema,
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
        "stop": request.stop,
        "seed": request.seed,
        "options": request.options,
        "stream": request.stream,
    })
}

/// A reply or failure as recorded.
fn response_value(result: &Result<ChatResponse, ProviderError>, chunks: Vec<String>) -> Value {
    match result {
        Ok(r) => {
            let mut m = Map::new();
            m.insert("text".into(), json!(r.text));
            if chunks.len() > 1 {
                m.insert("chunks".into(), json!(chunks));
            }
            m.insert("usage".into(), json!(r.usage));
            m.insert("finish_reason".into(), json!(r.finish_reason));
            if !r.tool_calls.is_empty() {
                m.insert("tool_calls".into(), json!(r.tool_calls));
            }
            if let Some(model) = &r.model {
                m.insert("model".into(), json!(model));
            }
            Value::Object(m)
        }
        Err(e) => json!({"error": error_value(e)}),
    }
}

fn error_value(e: &ProviderError) -> Value {
    match e {
        ProviderError::RateLimited { retry_after } => json!({"class": "rate_limit", "retry_after": retry_after}),
        ProviderError::Server { status, message } => {
            json!({"class": "server", "status": status, "message": message})
        }
        ProviderError::Timeout => json!({"class": "timeout"}),
        ProviderError::Network(m) => json!({"class": "network", "message": m}),
        ProviderError::StreamCut(m) => json!({"class": "stream", "message": m}),
        ProviderError::BadRequest(m) => json!({"class": "bad_request", "message": m}),
        ProviderError::Auth(m) => json!({"class": "auth", "message": m}),
        ProviderError::ContextLength(m) => json!({"class": "context_length", "message": m}),
        ProviderError::Malformed(m) => json!({"class": "malformed", "message": m}),
        ProviderError::TooLarge(m) => json!({"class": "too_large", "message": m}),
    }
}

fn error_from(v: &Value) -> ProviderError {
    let message = v.get("message").and_then(Value::as_str).unwrap_or_default().to_string();
    let class = v.get("class").and_then(Value::as_str).unwrap_or_default();
    let status = v.get("status").and_then(Value::as_u64).map(|s| s as u16);
    let retry_after = v.get("retry_after").and_then(Value::as_f64);
    ProviderError::named(class, message.clone(), status, retry_after).unwrap_or_else(|| {
        ProviderError::Malformed(format!("a recorded failure of unknown class `{class}`: {message}"))
    })
}

fn response_from(
    v: &Value,
    request: &ChatRequest,
    tokens: Option<TokenSink<'_>>,
) -> Result<ChatResponse, ProviderError> {
    if let Some(e) = v.get("error") {
        return Err(error_from(e));
    }
    let text = v
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| ProviderError::Malformed("a recorded reply has no `text`".into()))?
        .to_string();
    if let (Some(sink), true) = (tokens, request.stream) {
        match v.get("chunks").and_then(Value::as_array) {
            Some(chunks) => chunks.iter().filter_map(Value::as_str).for_each(sink),
            None => sink(&text),
        }
    }
    let usage: Usage = v
        .get("usage")
        .and_then(|u| serde_json::from_value(u.clone()).ok())
        .unwrap_or_default();
    Ok(ChatResponse {
        text,
        usage,
        finish_reason: v.get("finish_reason").and_then(Value::as_str).map(str::to_string),
        tool_calls: v
            .get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        model: v.get("model").and_then(Value::as_str).map(str::to_string),
    })
}

/// Records every call of the provider it wraps.
pub struct Recording {
    inner: Arc<dyn Provider>,
    cassette: Arc<Cassette>,
}

impl Recording {
    pub fn new(inner: Arc<dyn Provider>, cassette: Arc<Cassette>) -> Recording {
        Recording { inner, cassette }
    }
}

impl Provider for Recording {
    fn chat<'a>(
        &'a self,
        request: ChatRequest,
        tokens: Option<TokenSink<'a>>,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            let key = request_key(&request);
            let chunks = Mutex::new(Vec::new());
            // Chunks are captured even when nobody watches, so a replay can stream them.
            let capture = |text: &str| {
                if let Ok(mut c) = chunks.lock() {
                    c.push(text.to_string());
                }
                if let Some(sink) = tokens {
                    sink(text);
                }
            };
            let sink: Option<TokenSink<'_>> = request.stream.then_some(&capture as _);
            let result = self.inner.chat(request, sink).await;
            let recorded = response_value(&result, chunks.into_inner().unwrap_or_default());
            self.cassette
                .store(LLM, &key, &recorded)
                .map_err(|e| ProviderError::BadRequest(format!("cannot record: {e}")))?;
            result
        })
    }
}

/// Serves every call from a cassette.
pub struct Replaying {
    cassette: Arc<Cassette>,
}

impl Replaying {
    pub fn new(cassette: Arc<Cassette>) -> Replaying {
        Replaying { cassette }
    }
}

impl Provider for Replaying {
    fn chat<'a>(
        &'a self,
        request: ChatRequest,
        tokens: Option<TokenSink<'a>>,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        Box::pin(async move {
            // A miss is a bad request: it is not retried, and the CLI reports it after the run
            // even when an `on_error` handler absorbed it.
            let recorded = self
                .cassette
                .serve(LLM, &request_key(&request))
                .map_err(|e| ProviderError::BadRequest(e.to_string()))?;
            response_from(&recorded, &request, tokens)
        })
    }
}

/// Records every call of the embedder it wraps (the embedder of model profile `profile`).
pub struct RecordingEmbedder {
    profile: String,
    inner: Arc<dyn Embedder>,
    cassette: Arc<Cassette>,
}

impl RecordingEmbedder {
    pub fn new(profile: &str, inner: Arc<dyn Embedder>, cassette: Arc<Cassette>) -> RecordingEmbedder {
        RecordingEmbedder {
            profile: profile.to_string(),
            inner,
            cassette,
        }
    }
}

fn embed_key(profile: &str, id: &str, texts: &[String]) -> Value {
    json!({"profile": profile, "embedder": id, "texts": texts})
}

impl Embedder for RecordingEmbedder {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(async move {
            let result = self.inner.embed(texts).await;
            let recorded = match &result {
                Ok(e) => json!({"vectors": e.vectors, "usage": e.usage}),
                Err(e) => json!({"error": error_value(e)}),
            };
            self.cassette
                .store(EMBED, &embed_key(&self.profile, self.inner.id(), texts), &recorded)
                .map_err(|e| ProviderError::BadRequest(format!("cannot record: {e}")))?;
            result
        })
    }
}

/// Serves the embeddings calls of one model profile from a cassette, under the embedder id
/// they were recorded with (an index built by it stays searchable).
pub struct ReplayingEmbedder {
    profile: String,
    id: String,
    cassette: Arc<Cassette>,
}

impl Embedder for ReplayingEmbedder {
    fn id(&self) -> &str {
        &self.id
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(async move {
            let recorded = self
                .cassette
                .serve(EMBED, &embed_key(&self.profile, &self.id, texts))
                .map_err(|e| ProviderError::BadRequest(e.to_string()))?;
            if let Some(e) = recorded.get("error") {
                return Err(error_from(e));
            }
            let vectors = serde_json::from_value(recorded.get("vectors").cloned().unwrap_or_default())
                .map_err(|e| ProviderError::Malformed(format!("recorded vectors: {e}")))?;
            let usage = serde_json::from_value(recorded.get("usage").cloned().unwrap_or_default()).unwrap_or_default();
            Ok(Embeddings { vectors, usage })
        })
    }
}

/// Replaying embedders for every model profile whose embeddings calls `cassette` holds.
pub fn replaying_embedders(cassette: &Arc<Cassette>) -> Vec<(String, Arc<dyn Embedder>)> {
    let mut out: Vec<(String, Arc<dyn Embedder>)> = vec![];
    cassette.for_each_recorded(EMBED, |request| {
        let (Some(profile), Some(id)) = (
            request.get("profile").and_then(Value::as_str),
            request.get("embedder").and_then(Value::as_str),
        ) else {
            return;
        };
        if out.iter().any(|(p, _)| p == profile) {
            return;
        }
        let embedder = ReplayingEmbedder {
            profile: profile.to_string(),
            id: id.to_string(),
            cassette: cassette.clone(),
        };
        out.push((profile.to_string(), Arc::new(embedder)));
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::Message;

    fn request(node: &str, prompt: &str) -> ChatRequest {
        ChatRequest {
            node: node.into(),
            model: "m".into(),
            messages: vec![Message::new("user", prompt)],
            ..ChatRequest::default()
        }
    }

    struct Fixed;

    impl Embedder for Fixed {
        fn id(&self) -> &str {
            "fixed:v1"
        }

        fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
            Box::pin(async move {
                Ok(Embeddings {
                    vectors: texts.iter().map(|t| vec![t.len() as f32, 0.5]).collect(),
                    usage: Usage::tokens(3, 0),
                })
            })
        }
    }

    #[tokio::test]
    async fn embeddings_replay_under_the_recorded_embedder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        let rec = Arc::new(Cassette::record_with(&path, vec![]).unwrap());
        let texts = vec!["heat".to_string(), "pumps!".to_string()];
        let recorded = RecordingEmbedder::new("default", Arc::new(Fixed), rec)
            .embed(&texts)
            .await
            .unwrap();
        let play = Arc::new(Cassette::replay_with(&path, vec![]).unwrap());
        let embedders = replaying_embedders(&play);
        assert_eq!(embedders.len(), 1);
        let (profile, embedder) = &embedders[0];
        assert_eq!((profile.as_str(), embedder.id()), ("default", "fixed:v1"));
        assert_eq!(embedder.embed(&texts).await.unwrap(), recorded);
        assert!(embedder.embed(&["other".to_string()]).await.is_err());
    }

    #[test]
    fn failures_round_trip_as_typed_errors() {
        for e in [
            ProviderError::RateLimited { retry_after: Some(1.5) },
            ProviderError::Server {
                status: 503,
                message: "busy".into(),
            },
            ProviderError::Timeout,
            ProviderError::Auth("bad key".into()),
        ] {
            assert_eq!(error_from(&error_value(&e)), e);
        }
    }

    #[tokio::test]
    async fn a_recorded_exchange_is_replayed_in_order_and_a_miss_names_the_closest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        let rec = Cassette::record_with(&path, vec![]).unwrap();
        for (i, prompt) in ["same", "same", "Summarize the heat pump article"].iter().enumerate() {
            let key = request_key(&request("a", prompt));
            let got = rec
                .exchange(LLM, key, async move { Ok::<_, String>(json!({"text": i.to_string()})) })
                .await
                .unwrap();
            assert_eq!(got, json!({"text": i.to_string()}));
        }
        drop(rec);
        let play = Cassette::replay_with(&path, vec![]).unwrap();
        let never = async { Err::<Value, String>("live call during replay".into()) };
        let first = play
            .exchange(LLM, request_key(&request("a", "same")), never)
            .await
            .unwrap();
        let second = play.serve(LLM, &request_key(&request("a", "same"))).unwrap();
        assert_eq!((first, second), (json!({"text": "0"}), json!({"text": "1"})));
        let miss = play
            .serve(LLM, &request_key(&request("a", "Summarize the heat pump articles")))
            .unwrap_err()
            .to_string();
        assert!(miss.contains("entry 3 (node `a`)"), "{miss}");
        assert!(miss.contains("/messages/0/content"), "{miss}");
        assert_eq!(play.misses().len(), 1);
    }
}
