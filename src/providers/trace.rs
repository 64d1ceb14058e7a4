//! A span per model call, following OpenTelemetry's GenAI semantic conventions: every provider
//! of a run is wrapped once (`Providers::traced`), so each API, the mock and the cassette's
//! recording and replaying providers are traced alike.
//!
//! Without a subscriber that wants these spans the wrapper costs one disabled-callsite check per
//! call. Prompt and completion text go into a span only when content capture is switched on
//! (`set_capture_content`, by the process's telemetry set-up), scrubbed of known secrets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use tracing::{Instrument, field};

use super::{ChatRequest, ChatResponse, Embedder, Embeddings, Message, Provider, ProviderError, Providers, TokenSink};
use crate::spec::Provider as ProviderKind;

/// Whether prompts and completions are recorded in model-call spans.
static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Turns the recording of prompts and completions in model-call spans on or off.
pub fn set_capture_content(on: bool) {
    CAPTURE_CONTENT.store(on, Ordering::Relaxed);
}

/// Whether prompts and completions are recorded in model-call spans.
pub fn capture_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// The `gen_ai.provider.name` of a profile's API.
fn system_of(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Openai => "openai",
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::Mock => "mock",
    }
}

impl Providers {
    /// Every provider and embeddings model wrapped so that each call is a span.
    pub fn traced(mut self) -> Providers {
        for (provider, profile) in self.by_profile.values_mut() {
            *provider = Arc::new(Traced {
                inner: provider.clone(),
                system: system_of(profile.provider),
            });
        }
        self.fallback = self
            .fallback
            .map(|inner| Arc::new(Traced { inner, system: "mock" }) as Arc<dyn Provider>);
        for embedder in self.embedders.values_mut() {
            *embedder = Arc::new(TracedEmbedder {
                inner: embedder.clone(),
                system: "openai",
            });
        }
        self
    }
}

/// A provider whose calls are spans.
struct Traced {
    inner: Arc<dyn Provider>,
    system: &'static str,
}

impl Provider for Traced {
    fn chat<'a>(
        &'a self,
        request: ChatRequest,
        tokens: Option<TokenSink<'a>>,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        let span = tracing::info_span!(
            "chat",
            otel.name = field::Empty,
            otel.kind = "client",
            otel.status_code = field::Empty,
            gen_ai.operation.name = "chat",
            gen_ai.system = self.system,
            gen_ai.provider.name = self.system,
            gen_ai.request.model = %request.model,
            gen_ai.request.max_tokens = field::Empty,
            gen_ai.request.temperature = field::Empty,
            gen_ai.response.model = field::Empty,
            gen_ai.response.finish_reasons = field::Empty,
            gen_ai.usage.input_tokens = field::Empty,
            gen_ai.usage.output_tokens = field::Empty,
            gen_ai.input.messages = field::Empty,
            gen_ai.output.messages = field::Empty,
            "error.type" = field::Empty,
            runner.node = %request.node,
        );
        if span.is_disabled() {
            return self.inner.chat(request, tokens);
        }
        span.record("otel.name", format!("chat {}", request.model));
        if let Some(n) = request.max_tokens {
            span.record("gen_ai.request.max_tokens", n);
        }
        if let Some(t) = request.temperature {
            span.record("gen_ai.request.temperature", t);
        }
        let capture = capture_content();
        if capture {
            span.record("gen_ai.input.messages", input_messages(&request.messages).as_str());
        }
        let model = request.model.clone();
        let inner = self.inner.clone();
        let record = span.clone();
        Box::pin(
            async move {
                let result = inner.chat(request, tokens).await;
                match &result {
                    Ok(reply) => {
                        // The model the server says answered; else the one asked for.
                        let answered = reply.model.as_deref().unwrap_or(model.as_str());
                        record.record("gen_ai.response.model", answered);
                        if let Some(reason) = &reply.finish_reason {
                            record.record("gen_ai.response.finish_reasons", field::debug([reason]));
                        }
                        record.record("gen_ai.usage.input_tokens", reply.usage.prompt_tokens);
                        record.record("gen_ai.usage.output_tokens", reply.usage.completion_tokens);
                        if capture {
                            record.record("gen_ai.output.messages", output_messages(reply).as_str());
                        }
                        tracing::debug!(
                            input_tokens = reply.usage.prompt_tokens,
                            output_tokens = reply.usage.completion_tokens,
                            "model call"
                        );
                    }
                    Err(e) => {
                        record.record("error.type", e.class().name());
                        record.record("otel.status_code", "ERROR");
                        tracing::debug!(class = e.class().name(), "model call failed");
                    }
                }
                result
            }
            .instrument(span),
        )
    }
}

/// An embeddings model whose calls are spans.
struct TracedEmbedder {
    inner: Arc<dyn Embedder>,
    system: &'static str,
}

impl Embedder for TracedEmbedder {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        let span = tracing::info_span!(
            "embeddings",
            otel.kind = "client",
            otel.status_code = field::Empty,
            gen_ai.operation.name = "embeddings",
            gen_ai.system = self.system,
            gen_ai.provider.name = self.system,
            gen_ai.request.model = self.inner.id(),
            gen_ai.usage.input_tokens = field::Empty,
            "error.type" = field::Empty,
        );
        if span.is_disabled() {
            return self.inner.embed(texts);
        }
        let record = span.clone();
        Box::pin(
            async move {
                let result = self.inner.embed(texts).await;
                match &result {
                    Ok(e) => {
                        record.record("gen_ai.usage.input_tokens", e.usage.prompt_tokens);
                    }
                    Err(e) => {
                        record.record("error.type", e.class().name());
                        record.record("otel.status_code", "ERROR");
                    }
                }
                result
            }
            .instrument(span),
        )
    }
}

/// The prompt as the conventions' `gen_ai.input.messages` JSON, scrubbed.
fn input_messages(messages: &[Message]) -> String {
    let parts: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| {
            let mut parts = vec![serde_json::json!({"type": "text", "content": m.content})];
            parts.extend(
                m.tool_calls
                    .iter()
                    .map(|c| serde_json::json!({"type": "tool_call", "call": c})),
            );
            serde_json::json!({"role": m.role, "parts": parts})
        })
        .collect();
    crate::secrets::scrub_string(serde_json::Value::Array(parts).to_string())
}

/// The completion as the conventions' `gen_ai.output.messages` JSON, scrubbed.
fn output_messages(reply: &ChatResponse) -> String {
    let mut parts = vec![serde_json::json!({"type": "text", "content": reply.text})];
    parts.extend(
        reply
            .tool_calls
            .iter()
            .map(|c| serde_json::json!({"type": "tool_call", "call": c})),
    );
    let message = serde_json::json!([{
        "role": "assistant",
        "parts": parts,
        "finish_reason": reply.finish_reason,
    }]);
    crate::secrets::scrub_string(message.to_string())
}
