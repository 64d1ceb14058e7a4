//! `load`: reads one document from a path (relative to the current directory; inside the
//! workflow's directory tree or a root the run allows with `--allow-read`), an http(s) URL
//! (through the run's guarded web client), or a file sent in a message as a content block
//! (`document`: base64 data in LangChain's shapes, as agent-chat-ui and the SDKs send it).
//! `output` is `{content, title, source, bytes, format}`: text for text, Markdown and HTML
//! (markup removed), the parsed value for JSON. PDF as its text, pages separated by form feeds.
//! A PowerPoint template (`.pptx`) as its design context: `{theme_name, colors, fonts,
//! slide_size, layouts, slides}` (see [`crate::rag::pptx`]).

use std::path::Path;

use serde_json::{Value, json};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, render};
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use crate::compile::{ExprId, TemplateId};
use crate::diag::Code;
use crate::engine::kind::{Attempt, NodeKind};
use crate::net::{AllowList, FetchOptions, Oversize, Request, Response};
use crate::rag::extract::{self, Format};
use crate::rag::pptx;

mod block;

/// Default `max_bytes`: 20 MiB.
const DEFAULT_MAX_BYTES: u64 = 20 << 20;

/// Reads a document from a path or URL, or one sent as a content block. `output` is
/// `{content, title, source, bytes, format}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct LoadNode {
    /// A path or an http(s) URL (template). Give this or `document`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// An expression yielding a file sent in a message, as a content block: `{type: file,
    /// source_type: base64, mime_type, data, metadata: {filename}}`, `{type: file, mimeType,
    /// data, metadata: {filename}}` or `{type: file, base64, mime_type, extras: {filename}}`
    /// (a `url` instead of the data is fetched as `source` is; `text-plain` blocks may carry
    /// `text`); a string is a path or URL, as `source` takes. Give this or `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<String>,
    /// The document format (default `auto`, from the extension or content type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DocFormat>,
    /// Largest document accepted, in bytes (default 20 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// A document format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum DocFormat {
    Auto,
    Text,
    Markdown,
    Html,
    Pdf,
    Json,
    Pptx,
}

/// A `load` node, compiled.
struct Config {
    n: LoadNode,
    from: From,
}

/// Where a `load` node's document comes from.
enum From {
    /// `source`: a path or a URL.
    Source(TemplateId),
    /// `document`: a content block.
    Block(ExprId),
}

/// The `load` kind.
pub(super) struct Load;

impl KindDecl for Load {
    fn retries_by_default(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "load"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<LoadNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: LoadNode = cx.own()?;
        let from = match (&n.source, &n.document) {
            (Some(source), None) => From::Source(cx.template(&["source"], source)?),
            (None, Some(_)) => From::Block(cx.expr("document")?),
            (source, _) => {
                let (code, at, message) = if source.is_some() {
                    (
                        Code::InvalidValue,
                        cx.at(&["document"]),
                        "a load node reads `source` or `document`, not both",
                    )
                } else {
                    (
                        Code::MissingField,
                        cx.at(&[]),
                        "a load node needs a `source` or a `document`",
                    )
                };
                let d = cx
                    .source()
                    .diag_key(code, &at, message)
                    .help("`source` for a path or URL; `document` for a file sent in a message (a content block)");
                cx.report(d);
                return None;
            }
        };
        let config = Config { n, from };
        Some((
            KindConfig::new(config),
            Shape::fields(&["content", "title", "source", "bytes", "format"]),
        ))
    }
}

impl NodeKind for Load {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let n = &config.n;
    let max = n.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    let (source, bytes, content_type) = match &config.from {
        From::Source(template) => {
            let source = render(ctx, template, "/source")?.trim().to_string();
            let (bytes, content_type) = read_source(ctx, &source, "`source` rendered empty", max).await?;
            (source, bytes, content_type)
        }
        From::Block(id) => {
            let value = super::eval(ctx, *id, &ctx.scope)
                .map_err(|e| NodeError::invalid(format!("document: {}", e.message)))?;
            match &value {
                // A path or a URL, as `source` takes (a workflow whose document may come either
                // way picks one with one expression).
                Value::String(source) if !source.starts_with("data:") => {
                    let source = source.trim().to_string();
                    let (bytes, content_type) =
                        read_source(ctx, &source, "`document` yielded an empty path", max).await?;
                    (source, bytes, content_type)
                }
                _ => {
                    let block = block::Block::read(&value).map_err(|e| NodeError::invalid(format!("document: {e}")))?;
                    let (bytes, content_type) = match &block.body {
                        block::Body::Url(url) => {
                            let (bytes, content_type) = fetch(ctx, url, max).await?;
                            (bytes, content_type.or(block.mime_type.clone()))
                        }
                        body => (
                            body.bytes(max)
                                .map_err(|e| NodeError::invalid(format!("document: {e}")))?,
                            block.mime_type.clone(),
                        ),
                    };
                    (block.name(), bytes, content_type)
                }
            }
        }
    };
    let format = match n.format.unwrap_or(DocFormat::Auto) {
        DocFormat::Text => Format::Text,
        DocFormat::Markdown => Format::Markdown,
        DocFormat::Html => Format::Html,
        DocFormat::Pdf => Format::Pdf,
        DocFormat::Json => Format::Json,
        DocFormat::Pptx => Format::Pptx,
        DocFormat::Auto => content_type
            .as_deref()
            .and_then(Format::from_content_type)
            .or_else(|| Format::from_path(Path::new(source.split(['?', '#']).next().unwrap_or(&source))))
            .unwrap_or_else(|| Format::sniff(&bytes)),
    };
    let (content, title) = if format == Format::Pptx {
        let t = pptx::read(&bytes).map_err(|e| NodeError::invalid(format!("{source}: {e}")))?;
        (t.value, t.title)
    } else {
        let extracted = extract::extract(&bytes, format).map_err(|e| NodeError::invalid(format!("{source}: {e}")))?;
        let content = if format == Format::Json {
            serde_json::from_str(&extracted.text)
                .map_err(|e| NodeError::invalid(format!("{source} is not JSON: {e}")))?
        } else {
            Value::String(extracted.text)
        };
        (content, extracted.title)
    };
    let title = title.unwrap_or_else(|| {
        let path = source.split(['?', '#']).next().unwrap_or(&source).trim_end_matches('/');
        path.rsplit('/').next().unwrap_or(path).to_string()
    });
    Ok(NodeOutput {
        output: json!({
            "content": content,
            "title": title,
            "source": source,
            "bytes": bytes.len(),
            "format": format.name(),
        }),
        ..Default::default()
    })
}

fn is_url(source: &str) -> bool {
    source.starts_with("http://") || source.starts_with("https://")
}

/// The bytes of a path or a URL (at most `max`), and the content type a server gave; `empty`
/// is the error for an empty one.
async fn read_source(
    ctx: &NodeCtx<'_>,
    source: &str,
    empty: &str,
    max: u64,
) -> Result<(Vec<u8>, Option<String>), NodeError> {
    if source.is_empty() {
        return Err(NodeError::invalid(empty));
    }
    if is_url(source) {
        return fetch(ctx, source, max).await;
    }
    let path = ctx
        .services
        .read_roots
        .check(workflow_dir(ctx), Path::new(source))
        .map_err(NodeError::invalid)?;
    Ok((read(&path, Path::new(source), max)?, None))
}

/// The directory of the workflow a node belongs to (the current directory for one without a
/// file).
pub(super) fn workflow_dir<'a>(ctx: &'a NodeCtx<'_>) -> &'a Path {
    ctx.plan.path().parent().unwrap_or(Path::new(""))
}

/// Reads `path` (checked), naming it as `shown` (as written) in messages.
fn read(path: &Path, shown: &Path, max: u64) -> Result<Vec<u8>, NodeError> {
    let meta =
        std::fs::metadata(path).map_err(|e| NodeError::invalid(format!("cannot read {}: {e}", shown.display())))?;
    if meta.len() > max {
        return Err(NodeError::invalid(format!(
            "{} is {} bytes, over `max_bytes` ({max})",
            shown.display(),
            meta.len()
        )));
    }
    std::fs::read(path).map_err(|e| NodeError::invalid(format!("cannot read {}: {e}", shown.display())))
}

/// Fetches a URL through the run's web client: at most `max` bytes, the body and its content
/// type. The source is rendered from data, so only public addresses are reached unless the
/// run allows more (`--allow-net`).
async fn fetch(ctx: &NodeCtx<'_>, url: &str, max: u64) -> Result<(Vec<u8>, Option<String>), NodeError> {
    let opts = FetchOptions {
        allow: AllowList::default(),
        timeout: std::time::Duration::from_secs(60),
        max_bytes: max,
        oversize: Oversize::Fail,
        max_redirects: 5,
        accept: None,
    };
    let response = ctx
        .services
        .web
        .fetch(Request::get(url), &opts)
        .await
        .and_then(Response::error_for_status)
        .map_err(|e| {
            let message = if e.message.contains("is larger than") {
                format!("{url}: the document is over `max_bytes` ({max})")
            } else {
                format!("{url}: {e}")
            };
            NodeError::new(e.class, message)
        })?;
    let content_type = response.content_type().map(str::to_string);
    Ok((response.body.to_vec(), content_type))
}
