//! The query-embedding cache: a query embedded once is not sent to the embedder again. Vectors
//! are kept in the data database by embedder id and the SHA-256 of the text, so identical
//! queries across turns, runs and processes cost no embedding call. The offline embedder is
//! computed, never cached (it is cheaper than a lookup). The newest [`KEEP`] vectors of an
//! embedder are kept.

use sha2::{Digest, Sha256};

use super::embed::{self, normalize};
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
        store.with(move |c| c.cached_vectors(&i, &k)).await?
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
            store.with(move |c| c.cache_vectors(&i, &fresh, &now(), KEEP)).await?;
        }
    }
    Ok(Embedded {
        // Every slot was filled: from the cache, or by the embedder above.
        vectors: found.into_iter().map(Option::unwrap_or_default).collect(),
        usage,
        hits,
    })
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
