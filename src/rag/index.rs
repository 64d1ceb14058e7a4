//! Filling an index: documents are split into chunks, embedded, and stored with their text, a
//! keyword entry and their vector. A document is keyed by its path (or id); indexing it
//! again replaces its chunks, unless its content hash (text and chunk sizes) is unchanged, in
//! which case it is skipped. An index records the embedder that made its vectors and refuses
//! another.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::backend::Backend;
use super::chunk::{self, Chunk, Chunking};
use super::embed::normalize;
use super::extract::{self, Format};
use super::{DataError, DataStore};
use crate::clock::now;
use crate::providers::{Embedder, Usage};

/// A document ready to be indexed.
#[derive(Debug, Clone)]
pub struct Document {
    /// What identifies it in the index: a canonical path, or the id it was given.
    pub key: String,
    /// What it is called in results and matched by `documents:` (e.g. `guide/install.md`).
    pub name: String,
    pub title: Option<String>,
    pub format: Format,
    pub text: String,
    pub metadata: Value,
}

/// What an indexing pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub indexed: Vec<String>,
    pub skipped: Vec<String>,
    pub chunks: usize,
    pub failed: Vec<(String, String)>,
    pub usage: Usage,
}

/// The document files under `paths` (directories walked, hidden entries and files that are
/// not documents left out), sorted, each with its name relative to the directory given.
pub fn collect_files(paths: &[PathBuf]) -> Result<Vec<(PathBuf, String)>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            walk(p, p, &mut out).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        } else if p.is_file() {
            let name = p
                .file_name()
                .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned());
            out.push((p.clone(), name));
        } else {
            return Err(format!("{} does not exist", p.display()));
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(root, &path, out)?;
        } else if kind.is_file() && Format::from_path(&path).is_some() {
            let name = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.push((path, name));
        }
    }
    Ok(())
}

/// Reads a document file.
pub fn read_file(path: &Path, name: &str) -> Result<Document, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let format = Format::from_path(path).unwrap_or_else(|| Format::sniff(&bytes));
    let e = extract::extract(&bytes, format).map_err(|e| format!("{}: {e}", path.display()))?;
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(Document {
        key: key.display().to_string(),
        name: name.to_string(),
        title: e.title,
        format,
        text: e.text,
        metadata: Value::Object(Default::default()),
    })
}

/// Indexes `docs` into `index`, embedding with `embedder`; `progress(done, total, name)` is
/// called after each document.
pub async fn index_documents(
    store: &DataStore,
    index: &str,
    embedder: Arc<dyn Embedder>,
    docs: Vec<Result<Document, (String, String)>>,
    chunking: Chunking,
    progress: &(dyn Fn(usize, usize, &str) + Send + Sync),
) -> Result<Summary, DataError> {
    let mut summary = Summary::default();
    let total = docs.len();
    let embedder_id = embedder.id().to_string();
    let mut known = false;
    for (i, doc) in docs.into_iter().enumerate() {
        let doc = match doc {
            Ok(d) => d,
            Err((name, e)) => {
                progress(i + 1, total, &name);
                summary.failed.push((name, e));
                continue;
            }
        };
        let hash = content_hash(&doc, chunking);
        let (ix, key, h, eid) = (index.to_string(), doc.key.clone(), hash.clone(), embedder_id.clone());
        let unchanged = store
            .with(move |c| {
                check_embedder(c, &ix, &eid)?;
                unchanged(c, &ix, &key, &h)
            })
            .await?;
        if unchanged {
            summary.skipped.push(doc.name.clone());
            progress(i + 1, total, &doc.name);
            continue;
        }
        // HTML is extracted as Markdown, so its headings give chunks their paths too.
        let markdown = matches!(doc.format, Format::Markdown | Format::Html);
        let chunks = chunk::split(&doc.text, markdown, chunking);
        let texts: Vec<String> = chunks.iter().map(embedding_text).collect();
        let mut vectors = Vec::with_capacity(texts.len());
        for batch in texts.chunks(64) {
            let e = embedder
                .embed(batch)
                .await
                .map_err(|e| DataError::Invalid(format!("embedding {}: {e}", doc.name)))?;
            if e.vectors.len() != batch.len() {
                return Err(DataError::Invalid(format!(
                    "embedder `{embedder_id}` returned {} vectors for {} texts",
                    e.vectors.len(),
                    batch.len()
                )));
            }
            summary.usage.add(&e.usage);
            vectors.extend(e.vectors);
        }
        for v in &mut vectors {
            normalize(v);
        }
        if !known {
            let dims = vectors.first().map_or(0, Vec::len);
            let (ix, eid) = (index.to_string(), embedder_id.clone());
            store.with(move |c| ensure_index(c, &ix, &eid, dims)).await?;
            known = true;
        }
        summary.chunks += chunks.len();
        summary.indexed.push(doc.name.clone());
        let ix = index.to_string();
        let name = doc.name.clone();
        store
            .with(move |c| c.replace_document(&ix, &doc, &hash, &now(), &chunks, &vectors))
            .await?;
        progress(i + 1, total, &name);
    }
    Ok(summary)
}

/// The text a chunk is embedded and keyword-indexed with: its heading path, then its text.
fn embedding_text(c: &Chunk) -> String {
    match &c.heading {
        Some(h) => format!("{h}\n{}", c.text),
        None => c.text.clone(),
    }
}

fn content_hash(doc: &Document, c: Chunking) -> String {
    let mut h = Sha256::new();
    h.update(format!("{}:{}:{}\n", c.size, c.overlap, doc.format.name()));
    h.update(doc.title.as_deref().unwrap_or(""));
    h.update("\n");
    h.update(doc.metadata.to_string());
    h.update("\n");
    h.update(&doc.text);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The embedder an index was built with, if the index exists.
pub fn index_embedder(c: &dyn Backend, index: &str) -> Result<Option<String>, DataError> {
    c.index_embedder(index)
}

/// Fails when `index` exists and was built by another embedder.
pub fn check_embedder(c: &dyn Backend, index: &str, embedder: &str) -> Result<(), DataError> {
    match c.index_embedder(index)? {
        Some(built) if built != embedder => Err(DataError::EmbedderMismatch {
            index: index.to_string(),
            built,
            given: embedder.to_string(),
        }),
        _ => Ok(()),
    }
}

fn ensure_index(c: &dyn Backend, index: &str, embedder: &str, dims: usize) -> Result<(), DataError> {
    check_embedder(c, index, embedder)?;
    c.create_index(index, embedder, dims, &now())
}

fn unchanged(c: &dyn Backend, index: &str, key: &str, hash: &str) -> Result<bool, DataError> {
    Ok(c.document_hash(index, key)?.as_deref() == Some(hash))
}

/// Drops an index with its documents and chunks.
pub fn drop_index(c: &dyn Backend, index: &str) -> Result<(), DataError> {
    c.drop_index(index)
}
