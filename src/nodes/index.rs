//! `index`: adds documents to a named index. `documents` yields file paths (relative to the
//! current directory; inside the workflow's directory tree or a root allowed by
//! `--allow-read`) or documents `{id, text, title?, metadata?}`. `output` is `{documents,
//! chunks, skipped}`: the documents indexed, the chunks written, the documents left as they
//! were because their content had not changed.

use serde_json::{Value, json};

use super::retrieve::data_error;
use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, value};
use crate::compile::ExprId;
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use crate::engine::kind::{Attempt, NodeKind};
use crate::rag::chunk;
use crate::rag::embed::choose;
use crate::rag::extract::Format;
use crate::rag::index::{self, Document};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Adds documents to a named search index (chunks, keyword index and vectors).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct IndexNode {
    /// The index name.
    pub index: String,
    /// Expression yielding file paths, or documents `{id, text, title?, metadata?}`.
    pub documents: String,
    /// How documents are split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunking: Option<Chunking>,
    /// The model profile used for embeddings; without it an offline lexical embedder is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<String>,
}

/// Chunking for an index.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Chunking {
    /// Target chunk size in characters (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// Characters shared by neighbouring chunks (default 150).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<u32>,
}

/// A `index` node, compiled.
struct Config {
    n: IndexNode,
    documents: Option<ExprId>,
}

/// The `index` kind.
pub(super) struct Index;

impl KindDecl for Index {
    fn retries_by_default(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "index"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<IndexNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: IndexNode = cx.own()?;
        let documents = cx.expr("documents");
        if let Some(m) = &n.embeddings {
            cx.model(&["embeddings"], m, false);
        }
        let config = Config { n, documents };
        Some((
            KindConfig::new(config),
            Shape::fields(&["documents", "chunks", "skipped"]),
        ))
    }
}

impl NodeKind for Index {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let spec = &config.n;
    let given = value(ctx, config.documents, "/documents")?.unwrap_or(Value::Null);
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
        .map_or_else(chunk::Chunking::default, |c| chunk::Chunking::new(c.size, c.overlap));
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
