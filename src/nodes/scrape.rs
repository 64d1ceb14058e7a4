//! The `scrape` kind: many pages fetched at once (bounded overall and per host), robots.txt
//! obeyed, the main content of each extracted and scored. A page that fails becomes an entry
//! of `output.errors` (or fails the node with `on_failure: fail`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, value};
use crate::compile::ExprId;
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use crate::engine::kind::{Attempt, NodeKind};
use crate::error_class::ErrorClass;
use crate::net::extract::{self, DocType};
use crate::net::{AllowList, FetchError, FetchOptions, Oversize, Request, host_of, normalize_url};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The content types the extractor reads; anything else is refused before its body is read.
const ACCEPT: &[&str] = &[
    "text/html",
    "application/xhtml+xml",
    "text/plain",
    "text/markdown",
    "text/x-markdown",
];

/// One page to fetch.
struct Target {
    url: String,
    tag: Value,
}

/// Fetches web pages and extracts their main content.
/// `output` is `{pages: [{url, title, content, quality_score, word_count, tag}], errors: [...]}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct ScrapeNode {
    /// Expression yielding URLs, or objects with a `url` (and optional `tag`).
    pub urls: String,
    /// Expression yielding URLs to skip (e.g. `state.seen_urls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip: Option<String>,
    /// Pages fetched at once (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Pages fetched at once from one host (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_host: Option<u32>,
    /// Per-page timeout (default `20s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<crate::spec::Duration>,
    /// Largest page accepted, in bytes (default 5 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Obey robots.txt (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robots: Option<bool>,
    /// Hosts or CIDRs allowed even though they are private or loopback (SSRF guard).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Drop pages whose quality score is below this (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_quality: Option<f64>,
    /// `record` (default) turns a failed page into an entry of `output.errors`; `fail` fails
    /// the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<FailurePolicy>,
}

/// What a failed item does to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum FailurePolicy {
    Record,
    Fail,
}

/// A `scrape` node, compiled.
struct Config {
    n: ScrapeNode,
    urls: Option<ExprId>,
    skip: Option<ExprId>,
}

/// The `scrape` kind.
pub(super) struct Scrape;

impl KindDecl for Scrape {
    fn retries_by_default(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "scrape"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<ScrapeNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: ScrapeNode = cx.own()?;
        let urls = cx.expr("urls");
        let skip = cx.expr("skip");
        let config = Config { n, urls, skip };
        Some((KindConfig::new(config), Shape::fields(&["pages", "errors"])))
    }
}

impl NodeKind for Scrape {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let n = &config.n;
    let targets = targets(value(ctx, config.urls, "/urls")?)?;
    let skip: HashSet<String> = match value(ctx, config.skip, "/skip")? {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(normalize_url).collect(),
        Some(Value::String(s)) => HashSet::from([normalize_url(&s)]),
        _ => HashSet::new(),
    };
    let mut seen = HashSet::new();
    let targets: Vec<Target> = targets
        .into_iter()
        .filter(|t| {
            let key = normalize_url(&t.url);
            !skip.contains(&key) && seen.insert(key)
        })
        .collect();
    let allow = AllowList::parse(&n.allow).map_err(|e| NodeError::invalid(format!("allow: {e}")))?;
    let opts = FetchOptions {
        allow,
        timeout: n
            .timeout
            .as_ref()
            .and_then(|d| d.to_std())
            .unwrap_or(Duration::from_secs(20)),
        max_bytes: n.max_bytes.unwrap_or(5 * 1024 * 1024),
        oversize: Oversize::Truncate,
        max_redirects: 5,
        accept: Some(ACCEPT.iter().map(|s| s.to_string()).collect()),
    };
    // The node's own timeout (which `timeout` also sets) cuts the whole attempt: pages stop a
    // little before it so that what was scraped is still returned.
    // A timeout too long to add to the clock is no deadline.
    let deadline = ctx
        .timeout()
        .and_then(|t| tokio::time::Instant::now().checked_add(t.mul_f64(0.9)));
    let scraper = Scraper {
        deadline,
        web: &ctx.services.web,
        opts,
        robots: n.robots.unwrap_or(true),
        overall: Arc::new(Semaphore::new(n.concurrency.unwrap_or(8).max(1) as usize)),
        per_host_limit: n.per_host.unwrap_or(2).max(1) as usize,
        hosts: std::sync::Mutex::new(HashMap::new()),
    };
    let results = join_all(targets.iter().map(|t| scraper.page(t))).await;
    let min_quality = n.min_quality.unwrap_or(0.0);
    let fail = n.on_failure == Some(FailurePolicy::Fail);
    let mut pages = Vec::new();
    let mut errors = Vec::new();
    for (t, r) in targets.iter().zip(results) {
        match r {
            Ok(page) => {
                if page.quality_score >= min_quality {
                    pages.push(json!({
                        "url": t.url,
                        "title": page.title,
                        "content": page.content,
                        "quality_score": page.quality_score,
                        "word_count": page.word_count,
                        "tag": t.tag,
                    }));
                }
            }
            Err(e) if fail => {
                return Err(NodeError {
                    retry_after: e.retry_after,
                    ..NodeError::new(e.class, format!("{}: {}", t.url, e.message))
                }
                .into());
            }
            // The fields of an `on_error` handler's `error` (one attempt per page), so a
            // workflow can keep both kinds of record in one list.
            Err(e) => errors.push(json!({
                "node": ctx.node.name,
                "class": e.class.name(),
                "message": e.message,
                "attempts": 1,
                "at": crate::clock::now(),
                "url": t.url,
                "tag": t.tag,
            })),
        }
    }
    Ok(NodeOutput {
        output: json!({"pages": pages, "errors": errors}),
        usage: Default::default(),
    })
}

/// The URLs of `urls`: a string, a list of strings, or objects with `url` (and `tag`).
fn targets(v: Option<Value>) -> Result<Vec<Target>, NodeError> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => vec![other],
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::String(url) => Ok(Target { url, tag: Value::Null }),
            Value::Object(mut m) => match m.remove("url") {
                Some(Value::String(url)) => Ok(Target {
                    url,
                    tag: m.remove("tag").unwrap_or(Value::Null),
                }),
                _ => Err(NodeError::invalid("urls: an object without a string `url`")),
            },
            other => Err(NodeError::invalid(format!(
                "urls: expected a URL or an object with `url`, got {other}"
            ))),
        })
        .collect()
}

struct Scraper<'a> {
    deadline: Option<tokio::time::Instant>,
    web: &'a crate::net::Web,
    opts: FetchOptions,
    robots: bool,
    overall: Arc<Semaphore>,
    per_host_limit: usize,
    hosts: std::sync::Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Scraper<'_> {
    async fn page(&self, t: &Target) -> Result<extract::Extracted, FetchError> {
        let host = host_of(&t.url);
        let per_host = {
            let mut map = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(host)
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_host_limit)))
                .clone()
        };
        let closed = |_| FetchError::new(ErrorClass::Network, "the scrape was stopped");
        let _host = per_host.acquire_owned().await.map_err(closed)?;
        let _slot = self.overall.clone().acquire_owned().await.map_err(closed)?;
        let mut opts = self.opts.clone();
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(FetchError::new(
                    ErrorClass::Timeout,
                    "the node's timeout came before this page was fetched",
                ));
            }
            opts.timeout = opts.timeout.min(left);
        }
        let opts = &opts;
        if self.robots && !self.web.robots_allow(&t.url, opts).await? {
            return Err(FetchError::new(
                ErrorClass::BadRequest,
                "disallowed by the site's robots.txt",
            ));
        }
        let resp = self
            .web
            .fetch(Request::get(t.url.clone()), opts)
            .await?
            .error_for_status()?;
        let doc = DocType::of(resp.content_type()).ok_or_else(|| {
            FetchError::new(
                ErrorClass::BadRequest,
                format!("unsupported content type `{}`", resp.content_type().unwrap_or_default()),
            )
        })?;
        let url = resp.url.clone();
        tokio::task::spawn_blocking(move || extract::extract(&String::from_utf8_lossy(&resp.body), doc, &url))
            .await
            .map_err(|e| FetchError::new(ErrorClass::Invalid, format!("extraction failed: {e}")))
    }
}
