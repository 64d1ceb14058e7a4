//! Hybrid search over an index: for every query, the FTS5 keyword ranking (BM25) and the
//! vector ranking (cosine, brute force over the index's vectors), fused by reciprocal rank
//! (`Σ 1 / (60 + rank)` over every list of every query).
//!
//! Vectors are scanned in full for each search, once for all its queries: about 0.1 s for
//! 10^4 chunks at 512 dimensions (measured, optimised build, 2 cores), growing linearly, so
//! around a second at 10^5 chunks; past that an approximate index would be needed.

use std::collections::HashMap;

use rusqlite::{Connection, params_from_iter};

use super::embed::dot_blob;
use super::index::index_embedder;
use super::{DataError, fts_query};

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
pub fn search(c: &Connection, req: &Request) -> Result<Found, DataError> {
    match index_embedder(c, &req.index)? {
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
    let restrict = if docs.is_empty() {
        String::new()
    } else {
        format!(
            " AND c.doc_id IN ({})",
            docs.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
        )
    };
    let depth = req.candidates.max(20) * 2;

    // Vector rankings, one per query, from one scan.
    let mut stmt = c.prepare(&format!(
        "SELECT c.id, c.vector FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE d.index_name = ?1{restrict}"
    ))?;
    let mut sims: Vec<Vec<(i64, f64)>> = vec![Vec::new(); req.queries.len()];
    let mut best_cos: HashMap<i64, f64> = HashMap::new();
    let mut rows = stmt.query([&req.index])?;
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        let blob = r.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
        for (qi, (_, q)) in req.queries.iter().enumerate() {
            let s = f64::from(dot_blob(q, blob));
            sims[qi].push((id, s));
            let b = best_cos.entry(id).or_insert(f64::MIN);
            *b = b.max(s);
        }
    }
    let best_distance = best_cos.values().copied().reduce(f64::max).map(|s| (1.0 - s).max(0.0));

    let mut rrf: HashMap<i64, f64> = HashMap::new();
    for list in &mut sims {
        list.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (rank, (id, _)) in list.iter().take(depth).enumerate() {
            *rrf.entry(*id).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
    }
    // Keyword rankings.
    let mut fts = c.prepare(&format!(
        "SELECT c.id FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid JOIN documents d ON d.id = c.doc_id
         WHERE chunks_fts MATCH ?1 AND d.index_name = ?2{restrict}
         ORDER BY bm25(chunks_fts, 2.0, 1.0), c.id LIMIT ?3"
    ))?;
    for (text, _) in &req.queries {
        let Some(q) = fts_query(text) else { continue };
        let ids = fts
            .query_map(rusqlite::params![q, req.index, depth as i64], |r| r.get::<_, i64>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        for (rank, id) in ids.into_iter().enumerate() {
            *rrf.entry(id).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
        }
    }

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
    let rows = chunks_by_id(c, &ranked.iter().map(|r| r.0).collect::<Vec<_>>())?;
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
pub fn search_all(c: &Connection, reqs: &[Request]) -> Result<Found, DataError> {
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

const CHUNK_COLS: &str = "c.id, c.doc_id, d.name, c.position, c.heading, c.text, c.page";

fn chunk_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ChunkRow> {
    Ok(ChunkRow {
        id: r.get(0)?,
        doc_id: r.get(1)?,
        document: r.get(2)?,
        position: r.get(3)?,
        heading: r.get(4)?,
        text: r.get(5)?,
        page: r.get(6)?,
    })
}

fn chunks_by_id(c: &Connection, ids: &[i64]) -> Result<HashMap<i64, ChunkRow>, DataError> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let marks = vec!["?"; ids.len()].join(",");
    let mut stmt = c.prepare(&format!(
        "SELECT {CHUNK_COLS} FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE c.id IN ({marks})"
    ))?;
    let rows = stmt.query_map(params_from_iter(ids), chunk_row)?;
    let mut out = HashMap::new();
    for r in rows {
        let r = r?;
        out.insert(r.id, r);
    }
    Ok(out)
}

/// The chunks of document `doc_id` at positions `from..=to`, in order.
pub fn window(c: &Connection, doc_id: i64, from: i64, to: i64) -> Result<Vec<ChunkRow>, DataError> {
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {CHUNK_COLS} FROM chunks c JOIN documents d ON d.id = c.doc_id
         WHERE c.doc_id = ?1 AND c.position BETWEEN ?2 AND ?3 ORDER BY c.position"
    ))?;
    let rows = stmt.query_map(rusqlite::params![doc_id, from, to], chunk_row)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// The documents of `index` that `names` designate: by name, file name or path suffix
/// (`@policy.md`, `guide/policy.md`), or file stem (`policy`), ignoring case.
pub fn resolve_documents(c: &Connection, index: &str, names: &[String]) -> Result<Vec<i64>, DataError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let mut stmt = c.prepare_cached("SELECT id, name, path FROM documents WHERE index_name = ?1 ORDER BY id")?;
    let docs = stmt
        .query_map([index], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
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
