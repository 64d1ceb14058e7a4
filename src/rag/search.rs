//! Hybrid search over an index: for every query, the keyword ranking (the backend's: FTS5's
//! BM25 on SQLite, `ts_rank` on PostgreSQL) and the vector ranking (cosine), fused by
//! reciprocal rank (`Σ 1 / (60 + rank)` over every list of every query). Only ranks are fused,
//! never the engines' scores, so results stay comparable across backends; every cosine a
//! result reports is computed here, from the stored vectors.
//!
//! Without pgvector the vectors are scanned in full for each search, once for all its queries:
//! about 0.1 s for 10^4 chunks at 512 dimensions (measured on SQLite, optimised build, 2
//! cores), growing linearly, so around a second at 10^5 chunks; past that an approximate index
//! would be needed.

use std::collections::HashMap;

use super::backend::Backend;
use super::embed::dot;
use super::{DataError, keywords};

/// The RRF constant (as in Cormack et al., and most hybrid search engines).
pub const RRF_K: f64 = 60.0;

/// A stored chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkRow {
    pub id: i64,
    pub doc_id: i64,
    pub document: String,
    pub position: i64,
    pub heading: Option<String>,
    /// The page it starts on (paged formats such as PDF).
    pub page: Option<i64>,
    pub text: String,
}

/// A chunk found, with its scores.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub chunk: ChunkRow,
    /// The fused reciprocal-rank score.
    pub rrf: f64,
    /// Its best cosine similarity to any query.
    pub cosine: f64,
}

/// What a search found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// Best first by RRF, at most the candidates asked for.
    pub hits: Vec<Hit>,
    /// 1 − cosine of the nearest chunk to any query; `None` when nothing was searched.
    pub best_distance: Option<f64>,
    /// The documents searched, when the search was restricted.
    pub documents: Vec<i64>,
}

/// One search.
#[derive(Debug, Clone)]
pub struct Request {
    pub index: String,
    pub embedder: String,
    /// Each query's text and unit vector.
    pub queries: Vec<(String, Vec<f32>)>,
    /// Document names to restrict to (empty: all).
    pub documents: Vec<String>,
    /// How many fused hits to return.
    pub candidates: usize,
}

/// Runs a search.
pub fn search(c: &dyn Backend, req: &Request) -> Result<Found, DataError> {
    match c.index_embedder(&req.index)? {
        None => return Err(DataError::NoIndex(req.index.clone())),
        Some(built) if built != req.embedder => {
            return Err(DataError::EmbedderMismatch {
                index: req.index.clone(),
                built,
                given: req.embedder.clone(),
            });
        }
        Some(_) => {}
    }
    let docs = resolve_documents(c, &req.index, &req.documents)?;
    let depth = req.candidates.max(20) * 2;
    let vectors: Vec<Vec<f32>> = req.queries.iter().map(|(_, v)| v.clone()).collect();

    let mut rrf: HashMap<i64, f64> = HashMap::new();
    // Vector rankings, one per query.
    for list in c.nearest(&req.index, &docs, &vectors, depth)? {
        for (rank, (id, _)) in list.iter().take(depth).enumerate() {
            *rrf.entry(*id).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
    }
    // Keyword rankings.
    for (text, _) in &req.queries {
        let words = keywords(text);
        if words.is_empty() {
            continue;
        }
        for (rank, id) in c.keyword(&req.index, &docs, &words, depth)?.into_iter().enumerate() {
            *rrf.entry(id).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
    }
    // Every candidate's best cosine to any query, from its stored vector. The nearest chunk of
    // the index to each query heads that query's vector ranking, so it is a candidate: the
    // best of these is the best of the index.
    let ids: Vec<i64> = rrf.keys().copied().collect();
    let best_cos: HashMap<i64, f64> = c
        .chunk_vectors(&ids)?
        .into_iter()
        .filter_map(|(id, v)| {
            vectors
                .iter()
                .map(|q| f64::from(dot(q, &v)))
                .reduce(f64::max)
                .map(|s| (id, s))
        })
        .collect();
    let best_distance = best_cos.values().copied().reduce(f64::max).map(|s| (1.0 - s).max(0.0));

    let mut ranked: Vec<(i64, f64)> = rrf.into_iter().collect();
    ranked.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then_with(|| {
                best_cos
                    .get(&b.0)
                    .unwrap_or(&0.0)
                    .total_cmp(best_cos.get(&a.0).unwrap_or(&0.0))
            })
            .then(a.0.cmp(&b.0))
    });
    ranked.truncate(req.candidates);
    let rows = c.chunks(&ranked.iter().map(|r| r.0).collect::<Vec<_>>())?;
    let hits = ranked
        .into_iter()
        .filter_map(|(id, score)| {
            rows.get(&id).map(|chunk| Hit {
                chunk: chunk.clone(),
                rrf: score,
                cosine: best_cos.get(&id).copied().unwrap_or(0.0),
            })
        })
        .collect();
    Ok(Found {
        hits,
        best_distance,
        documents: docs,
    })
}

/// Runs several searches (e.g. each planned query restricted to its own documents) and fuses
/// them: a chunk's RRF scores add up, its cosine is its best; the documents searched are the
/// union of each search's.
pub fn search_all(c: &dyn Backend, reqs: &[Request]) -> Result<Found, DataError> {
    let mut merged: Vec<Hit> = Vec::new();
    let mut at: HashMap<i64, usize> = HashMap::new();
    let mut out = Found::default();
    let mut candidates = 0;
    for req in reqs {
        candidates = candidates.max(req.candidates);
        let found = search(c, req)?;
        out.best_distance = match (out.best_distance, found.best_distance) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        for d in found.documents {
            if !out.documents.contains(&d) {
                out.documents.push(d);
            }
        }
        for h in found.hits {
            match at.get(&h.chunk.id) {
                Some(&i) => {
                    merged[i].rrf += h.rrf;
                    merged[i].cosine = merged[i].cosine.max(h.cosine);
                }
                None => {
                    at.insert(h.chunk.id, merged.len());
                    merged.push(h);
                }
            }
        }
    }
    merged.sort_by(|a, b| {
        b.rrf
            .total_cmp(&a.rrf)
            .then(b.cosine.total_cmp(&a.cosine))
            .then(a.chunk.id.cmp(&b.chunk.id))
    });
    merged.truncate(candidates);
    out.hits = merged;
    Ok(out)
}

/// The chunks of document `doc_id` at positions `from..=to`, in order.
pub fn window(c: &dyn Backend, doc_id: i64, from: i64, to: i64) -> Result<Vec<ChunkRow>, DataError> {
    c.window(doc_id, from, to)
}

/// The documents of `index` that `names` designate: by name, file name or path suffix
/// (`@policy.md`, `guide/policy.md`), or file stem (`policy`), ignoring case.
pub fn resolve_documents(c: &dyn Backend, index: &str, names: &[String]) -> Result<Vec<i64>, DataError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let docs = c.documents(index)?;
    let wanted: Vec<String> = names
        .iter()
        .map(|n| n.trim().trim_start_matches('@').to_lowercase().replace('\\', "/"))
        .filter(|n| !n.is_empty())
        .collect();
    let mut out = Vec::new();
    for (id, name, path) in docs {
        let (name, path) = (name.to_lowercase(), path.to_lowercase().replace('\\', "/"));
        let file = name.rsplit('/').next().unwrap_or(&name).to_string();
        let stem = file.rsplit_once('.').map_or(file.as_str(), |(s, _)| s).to_string();
        let hit = wanted.iter().any(|w| {
            *w == name
                || *w == file
                || *w == stem
                || name.ends_with(&format!("/{w}"))
                || path.ends_with(&format!("/{w}"))
                || *w == path
        });
        if hit {
            out.push(id);
        }
    }
    Ok(out)
}
