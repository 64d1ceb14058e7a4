//! Relevance calibrated per index and embedder. A raw cosine distance means different things
//! for different embedders (the offline lexical embedder puts a question 0.7 away from the
//! chunk that answers it; a semantic model, 0.4), so a fixed distance threshold holds for one
//! embedder only. An index is therefore calibrated with the embedder that built it: a sample
//! of its chunks each yield a pseudo-query (a span of [`QUERY_WORDS`] words from the chunk),
//! which is embedded and compared with its own chunk (a *matching* similarity) and with the
//! nearest chunk of another document (an *unrelated* one; of the same document, at least
//! [`FAR`] chunks away, in a one-document index). Relevance is then the cosine rescaled so that
//! the median unrelated similarity is 0 and the median matching one is 1, clamped to 0..1.
//!
//! The calibration is kept with the index and redone when its chunks change (a fingerprint of
//! their count and largest id). An index too small to calibrate (no unrelated pair) gets
//! none: relevance is then the raw cosine.

use super::DataError;
use super::backend::{Backend, StoredCalibration};
use super::embed::dot;
use crate::clock::now;

/// Chunks sampled.
pub const SAMPLES: usize = 32;
/// Words in a pseudo-query.
pub const QUERY_WORDS: usize = 12;
/// In a one-document index, chunks at least this far apart count as unrelated.
pub const FAR: i64 = 3;
/// Matching and unrelated medians closer than this say nothing: no calibration.
const MIN_SPREAD: f64 = 0.05;

/// An index's calibration: median cosine of a chunk's pseudo-query to its own chunk and to the
/// nearest unrelated chunk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub matching: f64,
    pub unrelated: f64,
    pub samples: usize,
}

impl Calibration {
    /// A cosine similarity as a relevance in 0..1.
    pub fn relevance(&self, cosine: f64) -> f64 {
        ((cosine - self.unrelated) / (self.matching - self.unrelated)).clamp(0.0, 1.0)
    }
}

/// A relevance in 0..1 for `cosine`: calibrated if the index has a calibration, else the
/// cosine itself.
pub fn relevance(calibration: Option<&Calibration>, cosine: f64) -> f64 {
    calibration.map_or(cosine.clamp(0.0, 1.0), |c| c.relevance(cosine))
}

/// A chunk sampled for calibration, with its pseudo-query.
#[derive(Debug, Clone)]
pub struct Sample {
    pub chunk: i64,
    pub doc: i64,
    pub position: i64,
    pub query: String,
}

/// What the index's chunks are now: their count and largest id.
fn fingerprint(c: &dyn Backend, index: &str) -> Result<String, DataError> {
    let (n, max) = c.chunk_count(index)?;
    Ok(format!("{n}:{}", max.unwrap_or(0)))
}

/// What is stored for an index.
#[derive(Debug, Clone)]
pub enum Stored {
    /// A calibration for the index as it is (`None`: too small to calibrate).
    Current(Option<Calibration>),
    /// None, or one for other chunks: it must be computed from these samples.
    Stale(Vec<Sample>),
}

/// The stored calibration of `index`, or the samples to compute it from.
pub fn stored(c: &dyn Backend, index: &str) -> Result<Stored, DataError> {
    let current = fingerprint(c, index)?;
    if let Some(k) = c.calibration(index)?
        && k.fingerprint == current
    {
        return Ok(Stored::Current(k.matching.zip(k.unrelated).map(
            |(matching, unrelated)| Calibration {
                matching,
                unrelated,
                samples: k.samples as usize,
            },
        )));
    }
    Ok(Stored::Stale(samples(c, index)?))
}

/// Up to [`SAMPLES`] chunks spread evenly over the index, each with a pseudo-query taken from
/// its second third.
fn samples(c: &dyn Backend, index: &str) -> Result<Vec<Sample>, DataError> {
    let rows = c.chunk_texts(index)?;
    let step = rows.len().div_ceil(SAMPLES).max(1);
    Ok(rows
        .into_iter()
        .step_by(step)
        .filter_map(|(chunk, doc, position, text)| {
            let words: Vec<&str> = text.split_whitespace().collect();
            if words.len() < 4 {
                return None;
            }
            let from = (words.len() / 3).min(words.len().saturating_sub(QUERY_WORDS));
            let query = words[from..(from + QUERY_WORDS).min(words.len())].join(" ");
            Some(Sample {
                chunk,
                doc,
                position,
                query,
            })
        })
        .collect())
}

/// Computes and stores the calibration of `index` from `samples` and their unit vectors.
pub fn compute(
    c: &dyn Backend,
    index: &str,
    samples: &[Sample],
    vectors: &[Vec<f32>],
) -> Result<Option<Calibration>, DataError> {
    let mut own = vec![None; samples.len()];
    let mut other: Vec<Option<f64>> = vec![None; samples.len()];
    let mut other_doc = vec![false; samples.len()];
    c.scan_vectors(index, &mut |chunk| {
        for (i, (s, q)) in samples.iter().zip(vectors).enumerate() {
            let sim = || f64::from(dot(q, chunk.vector));
            if chunk.id == s.chunk {
                own[i] = Some(sim());
            } else if chunk.doc != s.doc {
                // Another document's chunk outranks any far chunk of the same document.
                let v = sim();
                other[i] = Some(if other_doc[i] {
                    other[i].map_or(v, |o| o.max(v))
                } else {
                    v
                });
                other_doc[i] = true;
            } else if !other_doc[i] && (chunk.position - s.position).abs() >= FAR {
                let v = sim();
                other[i] = Some(other[i].map_or(v, |o| o.max(v)));
            }
        }
    })?;
    let pairs: Vec<(f64, f64)> = own.into_iter().zip(other).filter_map(|(m, u)| m.zip(u)).collect();
    let calibration = (!pairs.is_empty())
        .then(|| Calibration {
            matching: median(pairs.iter().map(|p| p.0).collect()),
            unrelated: median(pairs.iter().map(|p| p.1).collect()),
            samples: pairs.len(),
        })
        .filter(|c| c.matching - c.unrelated >= MIN_SPREAD);
    let stored = StoredCalibration {
        fingerprint: fingerprint(c, index)?,
        matching: calibration.map(|k| k.matching),
        unrelated: calibration.map(|k| k.unrelated),
        samples: calibration.map_or(0, |k| k.samples as i64),
    };
    c.put_calibration(index, &stored, &now())?;
    Ok(calibration)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relevance_maps_unrelated_to_0_and_matching_to_1() {
        let k = Calibration {
            matching: 0.4,
            unrelated: 0.1,
            samples: 8,
        };
        assert!((k.relevance(0.25) - 0.5).abs() < 1e-9);
        assert_eq!(k.relevance(0.05), 0.0);
        assert_eq!(k.relevance(0.9), 1.0);
        assert_eq!(relevance(None, 0.3), 0.3);
        assert_eq!(median(vec![3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}
