//! `index`: adds documents to a named index. `documents` yields file paths (relative to the
//! current directory; inside the workflow's directory tree or a root allowed by
//! `--allow-read`) or documents `{id, text, title?, metadata?}`. `output` is `{documents,
//! chunks, skipped}`: the documents indexed, the chunks written, the documents left as they
//! were because their content had not changed.

use serde_json::{Value, json};

use super::retrieve::data_error;
use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data};
use crate::engine::kind::{Attempt, NodeKind};
use crate::rag::chunk::Chunking;
use crate::rag::embed::choose;
use crate::rag::extract::Format;
use crate::rag::index::{self, Document};
use crate::spec::NodeSpec;

pub async fn run(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    let NodeSpec::Index(n) = &ctx.node.spec else {
        unreachable!("dispatched on kind")
    };
    let spec = &n.kind;
    let given = data(ctx, "/documents", &ctx.scope)?.unwrap_or(Value::Null);
    let items = match given {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        one => vec![one],
    };
    let mut docs = Vec::new();
    for item in items {
        match item {
            Value::String(path) => {
                let dir = super::load::workflow_dir(ctx);
                let roots = &ctx.services.read_roots;
                roots.check(dir, path.as_ref()).map_err(NodeError::invalid)?;
                let files = index::collect_files(&[path.clone().into()]).map_err(NodeError::invalid)?;
                for (file, name) in files {
                    // A file inside the directory may be a symlink that leads out of it.
                    roots.check(dir, &file).map_err(NodeError::invalid)?;
                    let shown = if file.as_os_str() == path.as_str() {
                        path.clone()
                    } else {
                        name.clone()
                    };
                    docs.push(index::read_file(&file, &shown).map_err(|e| (shown, e)));
                }
            }
            Value::Object(o) => {
                let id = o
                    .get("id")
                    .map(super::text_of)
                    .ok_or_else(|| NodeError::invalid("a document object needs an `id`"))?;
                let text = o
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| NodeError::invalid(format!("document `{id}` needs a `text` string")))?;
                let markdown = id.ends_with(".md") || text.trim_start().starts_with('#');
                docs.push(Ok(Document {
                    key: id.clone(),
                    name: id,
                    title: o.get("title").and_then(Value::as_str).map(str::to_string),
                    format: if markdown { Format::Markdown } else { Format::Text },
                    text: text.to_string(),
                    metadata: o.get("metadata").cloned().unwrap_or_else(|| json!({})),
                }));
            }
            other => {
                return Err(NodeError::invalid(format!(
                    "`documents` items are paths or {{id, text}} objects, not {other}"
                ))
                .into());
            }
        }
    }
    let chunking = spec
        .chunking
        .as_ref()
        .map_or_else(Chunking::default, |c| Chunking::new(c.size, c.overlap));
    let embedder = choose(&ctx.services.providers, spec.embeddings.as_deref());
    let summary = index::index_documents(&ctx.services.data, &spec.index, embedder, docs, chunking, &|_, _, _| {})
        .await
        .map_err(data_error)?;
    if let Some((name, e)) = summary.failed.first() {
        return Err(NodeError::invalid(format!("cannot index {name}: {e}")).into());
    }
    Ok(NodeOutput {
        output: json!({
            "documents": summary.indexed,
            "chunks": summary.chunks,
            "skipped": summary.skipped,
        }),
        usage: summary.usage,
    })
}

/// The `index` kind.
pub struct Index;

impl NodeKind for Index {
    fn name(&self) -> &'static str {
        "index"
    }

    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(run(ctx)))
    }

    fn retries_by_default(&self) -> bool {
        true
    }
}
