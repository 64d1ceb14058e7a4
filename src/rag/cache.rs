//! The query-embedding cache: a query embedded once is not sent to the embedder again. Vectors
//! are kept in the data database by embedder id and the SHA-256 of the text, so identical
//! queries across turns, runs and processes cost no embedding call. The offline embedder is
//! computed, never cached (it is cheaper than a lookup). The newest [`KEEP`] vectors of an
//! embedder are kept.

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use super::embed::{self, from_blob, normalize, to_blob};
use super::{DataError, DataStore};
use crate::clock::now;
use crate::providers::{Embedder, ProviderError, Usage};

/// Vectors kept per embedder; older ones are dropped as new ones arrive.
pub const KEEP: i64 = 10_000;

/// Why embedding through the cache failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("embedder `{0}` returned {1} vectors for {2} texts")]
    Count(String, usize, usize),
}

/// Unit vectors for `texts`, in order, and what embedding the ones not cached cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    pub usage: Usage,
    /// How many came from the cache.
    pub hits: usize,
}

/// The cache key of a text: its SHA-256, in hex.
pub fn key(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Embeds `texts` with `embedder`, reading and filling the cache in `store`.
pub async fn embed(store: &DataStore, embedder: &dyn Embedder, texts: &[String]) -> Result<Embedded, EmbedError> {
    if texts.is_empty() {
        return Ok(Embedded::default());
    }
    let id = embedder.id().to_string();
    let cached = id != embed::ID;
    let keys: Vec<String> = texts.iter().map(|t| key(t)).collect();
    let mut found: Vec<Option<Vec<f32>>> = if cached {
        let (i, k) = (id.clone(), keys.clone());
        store.with(move |c| lookup(c, &i, &k)).await?
    } else {
        vec![None; texts.len()]
    };
    let hits = found.iter().filter(|v| v.is_some()).count();
    let missing: Vec<usize> = (0..texts.len()).filter(|i| found[*i].is_none()).collect();
    let mut usage = Usage::default();
    if !missing.is_empty() {
        let asked: Vec<String> = missing.iter().map(|i| texts[*i].clone()).collect();
        let e = embedder.embed(&asked).await?;
        if e.vectors.len() != asked.len() {
            return Err(EmbedError::Count(id, e.vectors.len(), asked.len()));
        }
        usage = e.usage;
        let mut fresh = Vec::with_capacity(missing.len());
        for (i, mut v) in missing.iter().zip(e.vectors) {
            normalize(&mut v);
            fresh.push((keys[*i].clone(), v.clone()));
            found[*i] = Some(v);
        }
        if cached {
            let i = id.clone();
            store.with(move |c| put(c, &i, &fresh)).await?;
        }
    }
    Ok(Embedded {
        // Every slot was filled: from the cache, or by the embedder above.
        vectors: found.into_iter().map(Option::unwrap_or_default).collect(),
        usage,
        hits,
    })
}

fn lookup(c: &Connection, embedder: &str, keys: &[String]) -> Result<Vec<Option<Vec<f32>>>, DataError> {
    let mut stmt = c.prepare_cached("SELECT vector FROM query_embeddings WHERE embedder = ?1 AND hash = ?2")?;
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        let v: Option<Vec<u8>> = stmt.query_row(params![embedder, k], |r| r.get(0)).optional()?;
        out.push(v.map(|b| from_blob(&b)));
    }
    Ok(out)
}

fn put(c: &mut Connection, embedder: &str, fresh: &[(String, Vec<f32>)]) -> Result<(), DataError> {
    let tx = c.transaction()?;
    {
        let mut stmt = tx.prepare_cached(
            "INSERT OR REPLACE INTO query_embeddings (embedder, hash, vector, created_at) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let at = now();
        for (k, v) in fresh {
            stmt.execute(params![embedder, k, to_blob(v), at])?;
        }
    }
    tx.execute(
        "DELETE FROM query_embeddings WHERE embedder = ?1 AND rowid NOT IN
         (SELECT rowid FROM query_embeddings WHERE embedder = ?1 ORDER BY created_at DESC, rowid DESC LIMIT ?2)",
        params![embedder, KEEP],
    )?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_key_is_the_sha256_of_the_text() {
        assert_eq!(
            super::key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
