//! `retrieve`: hybrid search over an index for every query, each restricted to its documents
//! if asked, reranked, cut to `top_k`, then widened with each targeted document's leading
//! chunks and each hit's neighbours. Query vectors go through the embedding cache; the best
//! distance is also given as a relevance calibrated for the index's embedder. `output` is
//! `{chunks: [{id, document, text, score, position, heading?, page?}], best_score,
//! best_distance, relevance, calibration}`.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::rerank::{self, Ranked};
use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, value};
use crate::compile::ExprId;
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use crate::engine::kind::{Attempt, NodeKind};
use crate::error_class::ErrorClass;
use crate::providers::Usage;
use crate::rag::embed::choose;
use crate::rag::search::{self, ChunkRow, Request};
use crate::rag::{DataError, DataStore};
use crate::rag::{cache, calibrate};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Hybrid (keyword + vector) search over a named index.
/// `output` is `{chunks: [{id, document, text, score, position, heading?, page?}], best_score,
/// best_distance, relevance, calibration}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct RetrieveNode {
    /// The index name.
    pub index: String,
    /// Expression yielding a query or a list of queries (searched in parallel); a query may be
    /// an object `{query, documents}` restricted to its own documents.
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
    /// A cross-encoder served over HTTP: `POST /rerank` as text-embeddings-inference,
    /// Infinity, Jina or Cohere serve it.
    Http {
        /// The endpoint URL (e.g. `http://127.0.0.1:8080/rerank`).
        url: String,
        /// The model name, for servers that host several (Infinity, Jina, Cohere).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
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
    fn retries_by_default(&self) -> bool {
        true
    }

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
            Shape::fields(&["chunks", "best_score", "best_distance", "relevance", "calibration"]),
        ))
    }
}

impl NodeKind for Retrieve {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let spec = &config.n;
    let documents = strings(value(ctx, config.documents, "/documents")?.unwrap_or(Value::Null));
    let planned = planned_queries(
        value(ctx, config.queries, "/queries")?.unwrap_or(Value::Null),
        &documents,
    );
    let queries: Vec<String> = planned
        .iter()
        .map(|(q, _)| q.clone())
        .collect::<indexmap::IndexSet<_>>()
        .into_iter()
        .collect();
    let top_k = spec.top_k.unwrap_or(5).max(1) as usize;
    let rerank = spec.rerank.clone().unwrap_or(Rerank::Named(RerankName::Rrf));
    let candidates = match rerank {
        Rerank::Named(RerankName::Rrf) => top_k,
        _ => (top_k * 4).max(20),
    };
    let embedder = choose(&ctx.services.providers, spec.embeddings.as_deref());
    let data = &ctx.services.data;
    let mut usage = Usage::default();
    let embedded = cache::embed(data, embedder.as_ref(), &queries)
        .await
        .map_err(|e| embed_error(e, "embedding the queries"))?;
    usage.add(&embedded.usage);
    let vector_of: std::collections::HashMap<&str, &Vec<f32>> =
        queries.iter().map(String::as_str).zip(&embedded.vectors).collect();
    // One search per document restriction, each with the queries planned for it.
    let mut groups: indexmap::IndexMap<Vec<String>, Vec<(String, Vec<f32>)>> = indexmap::IndexMap::new();
    for (q, docs) in &planned {
        let group = groups.entry(docs.clone()).or_default();
        if !group.iter().any(|(t, _)| t == q)
            && let Some(v) = vector_of.get(q.as_str())
        {
            group.push((q.clone(), (*v).clone()));
        }
    }
    let mut requests: Vec<Request> = groups
        .into_iter()
        .map(|(docs, queries)| Request {
            index: spec.index.clone(),
            embedder: embedder.id().to_string(),
            queries,
            documents: docs,
            candidates,
        })
        .collect();
    if requests.is_empty() {
        requests.push(Request {
            index: spec.index.clone(),
            embedder: embedder.id().to_string(),
            queries: Vec::new(),
            documents: documents.clone(),
            candidates,
        });
    }
    let found = data
        .with(move |c| search::search_all(c, &requests))
        .await
        .map_err(|e| data_error(e).spent(usage))?;
    let calibration = match found.best_distance {
        Some(_) => calibration(data, embedder.as_ref(), &spec.index, &mut usage)
            .await
            .map_err(|e| e.spent(usage))?,
        None => None,
    };
    let relevance = found
        .best_distance
        .map(|d| calibrate::relevance(calibration.as_ref(), 1.0 - d));

    let (mut ranked, failure) = rerank::rerank(ctx, &rerank, &queries, &found.hits, &mut usage).await;
    if let Some(err) = &failure {
        ctx.events.send(crate::engine::events::Event::Custom {
            node: ctx.node.name.clone(),
            event: "rerank_failed".into(),
            // The name in the payload too: a client of `runner serve` gets the payload alone.
            data: json!({"event": "rerank_failed", "error": err, "fallback": "rrf"}),
        });
    }
    ranked.truncate(top_k);
    let best_score = ranked.first().map(|r| r.score);

    let intro = spec.intro_chunks.unwrap_or(0) as i64;
    let around = i64::from(spec.neighbours.unwrap_or(0));
    let targeted = if planned.iter().all(|(_, d)| d.is_empty()) && documents.is_empty() {
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
        "relevance": relevance,
        "calibration": calibration.map(|k| json!({"matching": k.matching, "unrelated": k.unrelated, "samples": k.samples})),
    });
    if let Some(err) = failure {
        output["rerank_error"] = Value::String(err);
    }
    Ok(NodeOutput { output, usage })
}

/// The queries and the documents each is restricted to: a query is a string (restricted to
/// the node's `documents`) or an object `{query, documents}` (e.g. a search plan's entry,
/// restricted to its own documents, or to the node's when it names none).
fn planned_queries(v: Value, documents: &[String]) -> Vec<(String, Vec<String>)> {
    let items = match v {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        other => vec![other],
    };
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for item in items {
        let (texts, docs) = match item {
            Value::Object(mut o) => {
                let own = strings(o.remove("documents").unwrap_or(Value::Null));
                let text = o.remove("query").unwrap_or(Value::Null);
                (strings(text), own)
            }
            other => (strings(other), Vec::new()),
        };
        let mut docs: Vec<String> = docs
            .into_iter()
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty())
            .collect();
        if docs.is_empty() {
            docs = documents.to_vec();
        }
        docs.sort();
        docs.dedup();
        for t in texts {
            let t = t.trim().to_string();
            if !t.is_empty() && !out.iter().any(|(q, d)| *q == t && *d == docs) {
                out.push((t, docs.clone()));
            }
        }
    }
    out
}

/// The index's relevance calibration, computed (one embedding call for its pseudo-queries)
/// when the index changed since it was last computed.
async fn calibration(
    data: &DataStore,
    embedder: &dyn crate::providers::Embedder,
    index: &str,
    usage: &mut Usage,
) -> Result<Option<calibrate::Calibration>, NodeError> {
    let ix = index.to_string();
    let samples = match data
        .with(move |c| calibrate::stored(c, &ix))
        .await
        .map_err(data_error)?
    {
        calibrate::Stored::Current(known) => return Ok(known),
        calibrate::Stored::Stale(samples) => samples,
    };
    let texts: Vec<String> = samples.iter().map(|s| s.query.clone()).collect();
    let embedded = cache::embed(data, embedder, &texts)
        .await
        .map_err(|e| embed_error(e, "calibrating the index"))?;
    usage.add(&embedded.usage);
    let ix = index.to_string();
    data.with(move |c| calibrate::compute(c, &ix, &samples, &embedded.vectors))
        .await
        .map_err(data_error)
}

fn embed_error(e: cache::EmbedError, doing: &str) -> NodeError {
    match e {
        cache::EmbedError::Provider(e) => NodeError::new(e.class(), format!("{doing}: {e}")),
        cache::EmbedError::Data(e) => data_error(e),
        other => NodeError::new(ErrorClass::Server, format!("{doing}: {other}")),
    }
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
    if let Some(p) = row.page {
        v["page"] = json!(p);
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
