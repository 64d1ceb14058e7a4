//! The offline embedder: a hashed bag of words. Lowercased word unigrams and bigrams (words
//! lightly stemmed) are hashed (FNV-1a) into [`DIMS`] buckets with a sign bit, weighted by
//! sublinear term frequency (1 + ln tf) and L2-normalised. Deterministic and free, it needs no
//! model and no network — but it is *lexical* retrieval: texts are near when they share words,
//! not when they mean the same thing. Configure an embeddings profile for semantic search.

use futures::future::BoxFuture;

use crate::providers::{Embedder, Embeddings, ProviderError};

/// Vector width.
pub const DIMS: usize = 512;
/// The embedder's id as recorded with an index.
pub const ID: &str = "runner:hashed-bow-512";

/// The hashed bag-of-words embedder.
#[derive(Debug, Clone, Copy, Default)]
pub struct HashedEmbedder;

impl HashedEmbedder {
    /// One text's vector.
    pub fn vector(text: &str) -> Vec<f32> {
        let words: Vec<String> = text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(|w| stem(&w.to_lowercase()))
            .collect();
        let mut counts: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
        for w in &words {
            *counts.entry(w.clone()).or_default() += 1;
        }
        for pair in words.windows(2) {
            *counts.entry(format!("{} {}", pair[0], pair[1])).or_default() += 1;
        }
        let mut v = vec![0f32; DIMS];
        for (term, tf) in counts {
            let h = fnv1a(term.as_bytes());
            let weight = 1.0 + (tf as f32).ln();
            // Bigrams count half: they sharpen, unigrams carry.
            let weight = if term.contains(' ') { weight * 0.5 } else { weight };
            let sign = if h >> 63 == 1 { -1.0 } else { 1.0 };
            v[(h % DIMS as u64) as usize] += sign * weight;
        }
        normalize(&mut v);
        v
    }
}

impl Embedder for HashedEmbedder {
    fn id(&self) -> &str {
        ID
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(async move {
            Ok(Embeddings {
                vectors: texts.iter().map(|t| HashedEmbedder::vector(t)).collect(),
                usage: Default::default(),
            })
        })
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A light English suffix stripper, so `indexes`, `indexed` and `indexing` meet.
fn stem(w: &str) -> String {
    if w.len() <= 4 || !w.is_ascii() {
        return w.to_string();
    }
    for suffix in ["ations", "ation", "ings", "ing", "edly", "ies", "es", "ed", "ly", "s"] {
        if let Some(base) = w.strip_suffix(suffix)
            && base.len() >= 3
        {
            return if suffix == "ies" {
                format!("{base}y")
            } else {
                base.to_string()
            };
        }
    }
    w.to_string()
}

/// Vectors as stored: little-endian f32s.
pub fn to_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn from_blob(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The dot product of `a` and a stored vector, read in place (no copy per row).
pub fn dot_blob(a: &[f32], blob: &[u8]) -> f32 {
    a.iter()
        .zip(blob.chunks_exact(4))
        .map(|(x, b)| x * f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .sum()
}

/// The dot product (the cosine of unit vectors).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The embedder of profile `profile`, or the offline one when the node names none or the
/// profile's provider serves no embeddings (mock profiles, every profile under `--mock`).
pub fn choose(providers: &crate::providers::Providers, profile: Option<&str>) -> std::sync::Arc<dyn Embedder> {
    profile
        .and_then(|p| providers.embedder(p))
        .unwrap_or_else(|| std::sync::Arc::new(HashedEmbedder))
}
