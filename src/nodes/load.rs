//! `load`: reads one document from a path (relative to the current directory) or an http(s)
//! URL. `output` is `{content, title, source, bytes, format}`: text for text, Markdown and HTML
//! (markup removed), the parsed value for JSON. PDF is refused (unsupported in this build).

use std::path::Path;

use serde_json::{Value, json};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, render};
use crate::rag::extract::{self, Format};
use crate::spec::{DocFormat, ErrorClass, NodeSpec};

/// Default `max_bytes`: 20 MiB.
const DEFAULT_MAX_BYTES: u64 = 20 << 20;

pub async fn run(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    let NodeSpec::Load(n) = &ctx.node.spec else {
        unreachable!("dispatched on kind")
    };
    let source = render(ctx, "/source")?.unwrap_or_default().trim().to_string();
    if source.is_empty() {
        return Err(NodeError::invalid("`source` rendered empty").into());
    }
    let max = n.kind.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    let (bytes, content_type) = if source.starts_with("http://") || source.starts_with("https://") {
        fetch(&source, max).await?
    } else {
        (read(Path::new(&source), max)?, None)
    };
    let format = match n.kind.format.unwrap_or(DocFormat::Auto) {
        DocFormat::Text => Format::Text,
        DocFormat::Markdown => Format::Markdown,
        DocFormat::Html => Format::Html,
        DocFormat::Pdf => Format::Pdf,
        DocFormat::Json => Format::Json,
        DocFormat::Auto => content_type
            .as_deref()
            .and_then(Format::from_content_type)
            .or_else(|| Format::from_path(Path::new(source.split(['?', '#']).next().unwrap_or(&source))))
            .unwrap_or_else(|| Format::sniff(&bytes)),
    };
    let extracted = extract::extract(&bytes, format).map_err(|e| NodeError::invalid(format!("{source}: {e}")))?;
    let content = if format == Format::Json {
        serde_json::from_str(&extracted.text).map_err(|e| NodeError::invalid(format!("{source} is not JSON: {e}")))?
    } else {
        Value::String(extracted.text)
    };
    let title = extracted.title.unwrap_or_else(|| {
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

fn read(path: &Path, max: u64) -> Result<Vec<u8>, NodeError> {
    let meta =
        std::fs::metadata(path).map_err(|e| NodeError::invalid(format!("cannot read {}: {e}", path.display())))?;
    if meta.len() > max {
        return Err(NodeError::invalid(format!(
            "{} is {} bytes, over `max_bytes` ({max})",
            path.display(),
            meta.len()
        )));
    }
    std::fs::read(path).map_err(|e| NodeError::invalid(format!("cannot read {}: {e}", path.display())))
}

/// Fetches a URL: at most `max` bytes, the body and its content type. The one place `load`
/// reaches the network.
async fn fetch(url: &str, max: u64) -> Result<(Vec<u8>, Option<String>), NodeError> {
    let net = |e: reqwest::Error| {
        let class = if e.is_timeout() {
            ErrorClass::Timeout
        } else {
            ErrorClass::Network
        };
        NodeError::new(class, format!("{url}: {e}"))
    };
    let client = crate::net::client_builder()
        .timeout(std::time::Duration::from_secs(60))
        .redirect(reqwest::redirect::Policy::limited(5))
        .build()
        .map_err(net)?;
    let mut response = client.get(url).send().await.map_err(net)?;
    let status = response.status();
    if !status.is_success() {
        let class = match status.as_u16() {
            429 => ErrorClass::RateLimit,
            500.. => ErrorClass::Server,
            _ => ErrorClass::BadRequest,
        };
        return Err(NodeError::new(class, format!("{url}: HTTP {status}")));
    }
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(net)? {
        if (body.len() + chunk.len()) as u64 > max {
            return Err(NodeError::invalid(format!(
                "{url}: the document is over `max_bytes` ({max})"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, content_type))
}
