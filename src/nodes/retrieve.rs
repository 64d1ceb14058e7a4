//! `retrieve`: hybrid search over an index for every query, restricted to named documents if
//! asked, reranked, cut to `top_k`, then widened with each targeted document's leading chunks
//! and each hit's neighbours. `output` is `{chunks: [{id, document, text, score, position,
//! heading?}], best_score, best_distance}`.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::rerank::{self, Ranked};
use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, value};
use crate::compile::ExprId;
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use crate::engine::kind::{Attempt, NodeKind};
use crate::error_class::ErrorClass;
use crate::providers::Usage;
use crate::rag::embed::{choose, normalize};
use crate::rag::search::{self, ChunkRow, Request};
use crate::rag::{DataError, DataStore};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Hybrid (keyword + vector) search over a named index.
/// `output` is `{chunks: [{id, document, text, score, position}], best_score, best_distance}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct RetrieveNode {
    /// The index name.
    pub index: String,
    /// Expression yielding a query or a list of queries (searched in parallel).
    pub queries: String,
    /// Expression yielding document names to restrict the search to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<String>,
    /// Chunks returned (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Neighbouring chunks added on each side of a hit (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbours: Option<u32>,
    /// Leading chunks always included from each targeted document (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intro_chunks: Option<u32>,
    /// How hits are reranked (default `rrf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerank: Option<Rerank>,
    /// The model profile used for embeddings (must match the index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<String>,
}

/// A reranker.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum Rerank {
    /// `rrf` (reciprocal-rank fusion) or `none`.
    Named(RerankName),
    /// An LLM scores each hit.
    Llm {
        /// The model profile that scores.
        llm: String,
    },
    /// A `/rerank` HTTP endpoint.
    Http {
        /// The endpoint URL.
        url: String,
    },
}

/// A built-in reranker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum RerankName {
    Rrf,
    None,
}

/// A `retrieve` node, compiled.
struct Config {
    n: RetrieveNode,
    queries: Option<ExprId>,
    documents: Option<ExprId>,
}

/// The `retrieve` kind.
pub(super) struct Retrieve;

impl KindDecl for Retrieve {
    fn name(&self) -> &'static str {
        "retrieve"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<RetrieveNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: RetrieveNode = cx.own()?;
        let queries = cx.expr("queries");
        let documents = cx.expr("documents");
        if let Some(m) = &n.embeddings {
            cx.model(&["embeddings"], m, false);
        }
        if let Some(Rerank::Llm { llm }) = &n.rerank {
            cx.model(&["rerank", "llm"], llm, false);
        }
        let config = Config { n, queries, documents };
        Some((
            KindConfig::new(config),
            Shape::fields(&["chunks", "best_score", "best_distance"]),
        ))
    }
}

impl NodeKind for Retrieve {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }

    fn retries_by_default(&self) -> bool {
        true
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let spec = &config.n;
    let queries: Vec<String> = strings(value(ctx, config.queries, "/queries")?.unwrap_or(Value::Null))
        .into_iter()
        .map(|q| q.trim().to_string())
        .filter(|q| !q.is_empty())
        .collect::<indexmap::IndexSet<_>>()
        .into_iter()
        .collect();
    let documents = strings(value(ctx, config.documents, "/documents")?.unwrap_or(Value::Null));
    let top_k = spec.top_k.unwrap_or(5).max(1) as usize;
    let rerank = spec.rerank.clone().unwrap_or(Rerank::Named(RerankName::Rrf));
    let candidates = match rerank {
        Rerank::Named(RerankName::Rrf) => top_k,
        _ => (top_k * 4).max(20),
    };
    let embedder = choose(&ctx.services.providers, spec.embeddings.as_deref());
    let mut usage = Usage::default();
    let mut vectors = Vec::new();
    if !queries.is_empty() {
        let e = embedder
            .embed(&queries)
            .await
            .map_err(|e| NodeError::new(e.class(), format!("embedding the queries: {e}")))?;
        usage.add(&e.usage);
        vectors = e.vectors;
        vectors.iter_mut().for_each(|v| normalize(v));
    }
    let request = Request {
        index: spec.index.clone(),
        embedder: embedder.id().to_string(),
        queries: queries.iter().cloned().zip(vectors).collect(),
        documents: documents.clone(),
        candidates,
    };
    let found = ctx
        .services
        .data
        .with(move |c| search::search(c, &request))
        .await
        .map_err(|e| data_error(e).spent(usage))?;

    let (mut ranked, failure) = rerank::rerank(ctx, &rerank, &queries, &found.hits, &mut usage).await;
    if let Some(err) = &failure {
        ctx.events.send(crate::engine::events::Event::Custom {
            node: ctx.node.name.clone(),
            event: "rerank_failed".into(),
            data: json!({"error": err, "fallback": "rrf"}),
        });
    }
    ranked.truncate(top_k);
    let best_score = ranked.first().map(|r| r.score);

    let intro = spec.intro_chunks.unwrap_or(0) as i64;
    let around = i64::from(spec.neighbours.unwrap_or(0));
    let targeted = if documents.is_empty() {
        Vec::new()
    } else {
        found.documents.clone()
    };
    let chunks = expand(&ctx.services.data, ranked, targeted, intro, around)
        .await
        .map_err(|e| e.spent(usage))?;
    let mut output = json!({
        "chunks": chunks,
        "best_score": best_score,
        "best_distance": found.best_distance,
    });
    if let Some(err) = failure {
        output["rerank_error"] = Value::String(err);
    }
    Ok(NodeOutput { output, usage })
}

/// Intro chunks of the targeted documents first, then each hit with its neighbours in
/// document order; every chunk once. A neighbour or intro chunk carries the score of the hit
/// (or 0) it came with.
async fn expand(
    store: &DataStore,
    ranked: Vec<Ranked>,
    targeted: Vec<i64>,
    intro: i64,
    around: i64,
) -> Result<Vec<Value>, NodeError> {
    store
        .with(move |c| {
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            if intro > 0 {
                for doc in &targeted {
                    for row in search::window(c, *doc, 0, intro - 1)? {
                        if seen.insert(row.id) {
                            out.push(chunk_json(&row, 0.0));
                        }
                    }
                }
            }
            for r in &ranked {
                let rows = if around > 0 {
                    search::window(c, r.chunk.doc_id, r.chunk.position - around, r.chunk.position + around)?
                } else {
                    vec![r.chunk.clone()]
                };
                for row in rows {
                    if seen.insert(row.id) {
                        out.push(chunk_json(&row, r.score));
                    }
                }
            }
            Ok(out)
        })
        .await
        .map_err(data_error)
}

fn chunk_json(row: &ChunkRow, score: f64) -> Value {
    let mut v = json!({
        "id": format!("{}#{}", row.document, row.position),
        "document": row.document,
        "text": row.text,
        "score": score,
        "position": row.position,
    });
    if let Some(h) = &row.heading {
        v["heading"] = Value::String(h.clone());
    }
    v
}

/// A string, or a list of strings (other values as their JSON text), as strings.
pub(crate) fn strings(v: Value) -> Vec<String> {
    match v {
        Value::Null => Vec::new(),
        Value::Array(items) => items.into_iter().flat_map(strings).collect(),
        Value::String(s) => vec![s],
        other => vec![other.to_string()],
    }
}

/// A data-store failure as a node error: a missing or mismatched index is the workflow's
/// problem (not retried), anything else is the store's.
pub(crate) fn data_error(e: DataError) -> NodeError {
    let class = match e {
        DataError::NoIndex(_) | DataError::EmbedderMismatch { .. } | DataError::Invalid(_) => ErrorClass::BadRequest,
        _ => ErrorClass::Server,
    };
    NodeError::new(class, e.to_string())
}
