//! The `search` kind: queries run concurrently on one search engine (SearxNG, Tavily or
//! Brave), results normalised to `{url, title, snippet, score, provider, query, tag}` and
//! de-duplicated by normalised URL, the best-scored copy kept.

use std::time::Duration;

use futures::future::join_all;
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, value};
use crate::compile::ExprId;
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use crate::engine::kind::{Attempt, NodeKind};
use crate::error_class::ErrorClass;
use crate::net::{AllowList, FetchOptions, Oversize, Request, Web, normalize_url};

/// Web search. `output` is `{results: [{url, title, snippet, score, provider, query, tag}]}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct SearchNode {
    /// The search engine (default `searxng`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<SearchProvider>,
    /// The engine's base URL (may use `${env:NAME}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable holding the engine's API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Expression yielding a query or a list of queries.
    pub queries: String,
    /// Results per query (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Expression whose value is attached to every result as `tag` (e.g. a subtopic id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// A search engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum SearchProvider {
    Searxng,
    Tavily,
    Brave,
}

/// A `search` node, compiled.
struct Config {
    n: SearchNode,
    queries: Option<ExprId>,
    tag: Option<ExprId>,
}

/// The `search` kind.
pub(super) struct Search;

impl KindDecl for Search {
    fn retries_by_default(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "search"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<SearchNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: SearchNode = cx.own()?;
        let queries = cx.expr("queries");
        let tag = cx.expr("tag");
        if let Some(url) = &n.base_url {
            cx.check_interpolation(&["base_url"], url);
        }
        if let Some(var) = &n.api_key_env {
            cx.check_env_name(&["api_key_env"], var);
        }
        let config = Config { n, queries, tag };
        Some((KindConfig::new(config), Shape::fields(&["results"])))
    }
}

impl NodeKind for Search {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

/// One hit as the engine gave it.
#[derive(Debug, Clone, PartialEq)]
struct Hit {
    url: String,
    title: String,
    snippet: String,
    score: Option<f64>,
}

/// Where and how to ask one engine.
struct Engine {
    provider: SearchProvider,
    base: String,
    key: Option<String>,
    opts: FetchOptions,
    /// The base URL as written (its `${env:…}` not expanded), and the key's variable: what a
    /// failure names, with where the values came from.
    base_spec: String,
    key_env: Option<String>,
}

impl Engine {
    /// `e` naming the variables the engine was set up from, where the engine's answer says
    /// they may be wrong: a refused key, or a base URL that reaches nothing useful.
    fn failed(&self, mut e: NodeError, env: &crate::engine::Env) -> NodeError {
        let named = match e.class {
            ErrorClass::Auth => self
                .key_env
                .as_deref()
                .map(|name| format!("the key is {}", env.describe(name))),
            ErrorClass::Network | ErrorClass::BadRequest | ErrorClass::Invalid => {
                let vars = env.describe_refs(&self.base_spec);
                (!vars.is_empty()).then(|| format!("the base URL `{}` is from {vars}", self.base))
            }
            _ => None,
        };
        if let Some(named) = named {
            e.message = format!("{} ({named})", e.message);
        }
        e
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let n = &config.n;
    let queries = match value(ctx, config.queries, "/queries")? {
        Some(Value::String(q)) => vec![q],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => s,
                other => other.to_string(),
            })
            .collect(),
        Some(Value::Null) | None => Vec::new(),
        Some(other) => {
            return Err(NodeError::invalid(format!("queries: expected a string or a list, got {other}")).into());
        }
    };
    let queries: Vec<String> = queries.into_iter().filter(|q| !q.trim().is_empty()).collect();
    let tag = value(ctx, config.tag, "/tag")?.unwrap_or(Value::Null);
    let limit = n.limit.unwrap_or(5) as usize;
    let env = &ctx.services.env;
    let engine = engine(n, env)?;
    let web = &ctx.services.web;
    let answers = join_all(queries.iter().map(|q| ask(web, &engine, q, limit))).await;
    let mut best: IndexMap<String, Value> = IndexMap::new();
    for (q, answer) in queries.iter().zip(answers) {
        let hits = answer.map_err(|e| engine.failed(NodeError::from(e), env))?;
        for (rank, hit) in hits.into_iter().take(limit).enumerate() {
            if hit.url.is_empty() {
                continue;
            }
            let score = hit.score.unwrap_or(1.0 / (rank as f64 + 1.0));
            let item = json!({
                "url": hit.url,
                "title": hit.title,
                "snippet": hit.snippet,
                "score": score,
                "provider": provider_name(engine.provider),
                "query": q,
                "tag": tag,
            });
            let key = normalize_url(&hit.url);
            match best.get(&key) {
                Some(old) if old["score"].as_f64().unwrap_or(0.0) >= score => {}
                _ => {
                    best.insert(key, item);
                }
            }
        }
    }
    Ok(NodeOutput {
        output: json!({"results": best.into_values().collect::<Vec<_>>()}),
        usage: Default::default(),
    })
}

fn provider_name(p: SearchProvider) -> &'static str {
    match p {
        SearchProvider::Searxng => "searxng",
        SearchProvider::Tavily => "tavily",
        SearchProvider::Brave => "brave",
    }
}

/// The engine of a node: its base URL (the host of a configured base URL is trusted by the
/// guard: the workflow's author or the environment chose it) and its key.
fn engine(n: &SearchNode, env: &crate::engine::Env) -> Result<Engine, NodeError> {
    let provider = n.provider.unwrap_or(SearchProvider::Searxng);
    let default_base = match provider {
        SearchProvider::Searxng => "${env:SEARXNG_URL:-http://127.0.0.1:8888}",
        SearchProvider::Tavily => "${env:TAVILY_URL:-https://api.tavily.com}",
        SearchProvider::Brave => "${env:BRAVE_SEARCH_URL:-https://api.search.brave.com}",
    };
    let base_spec = n.base_url.as_deref().unwrap_or(default_base);
    let base = env
        .expand(base_spec)
        .map_err(|e| NodeError::new(ErrorClass::BadRequest, format!("base_url: {e}")))?;
    let base = base.trim_end_matches('/').to_string();
    let parsed = url::Url::parse(&base).map_err(|e| {
        let vars = env.describe_refs(base_spec);
        let from = if vars.is_empty() {
            String::new()
        } else {
            format!(" (from {vars})")
        };
        NodeError::new(ErrorClass::BadRequest, format!("base_url `{base}`{from}: {e}"))
    })?;
    let mut allow = AllowList::default();
    if let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default()) {
        allow
            .add_origin(host, port)
            .map_err(|e| NodeError::new(ErrorClass::BadRequest, format!("base_url: {e}")))?;
    }
    let key_env = n.api_key_env.clone().or(match provider {
        SearchProvider::Searxng => None,
        SearchProvider::Tavily => Some("TAVILY_API_KEY".into()),
        SearchProvider::Brave => Some("BRAVE_API_KEY".into()),
    });
    let key = match &key_env {
        Some(name) => match env.get(name).filter(|v| !v.is_empty()) {
            Some(v) => {
                crate::secrets::register(&v);
                Some(v)
            }
            None if provider == SearchProvider::Searxng => None,
            None => {
                return Err(NodeError::new(
                    ErrorClass::Auth,
                    format!(
                        "the environment variable `{name}` (the {} API key) is not set",
                        provider_name(provider)
                    ),
                ));
            }
        },
        None => None,
    };
    Ok(Engine {
        provider,
        base,
        key,
        base_spec: base_spec.to_string(),
        key_env,
        opts: FetchOptions {
            allow,
            timeout: Duration::from_secs(30),
            max_bytes: 5 * 1024 * 1024,
            oversize: Oversize::Fail,
            max_redirects: 3,
            accept: None,
        },
    })
}

async fn ask(web: &Web, engine: &Engine, query: &str, limit: usize) -> Result<Vec<Hit>, crate::net::FetchError> {
    let req = match engine.provider {
        SearchProvider::Searxng => {
            let mut u = url_of(&format!("{}/search", engine.base))?;
            u.query_pairs_mut()
                .append_pair("q", query)
                .append_pair("format", "json");
            let mut r = Request::get(u.to_string());
            r.headers.push(("accept".into(), "application/json".into()));
            if let Some(key) = &engine.key {
                r.headers.push(("authorization".into(), format!("Bearer {key}")));
            }
            r
        }
        SearchProvider::Tavily => Request {
            method: "POST".into(),
            url: format!("{}/search", engine.base),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                (
                    "authorization".into(),
                    format!("Bearer {}", engine.key.as_deref().unwrap_or_default()),
                ),
            ],
            body: Some(
                json!({"query": query, "max_results": limit, "search_depth": "basic"})
                    .to_string()
                    .into_bytes(),
            ),
            secret_headers: Vec::new(),
        },
        SearchProvider::Brave => {
            let mut u = url_of(&format!("{}/res/v1/web/search", engine.base))?;
            u.query_pairs_mut()
                .append_pair("q", query)
                .append_pair("count", &limit.min(20).to_string());
            let mut r = Request::get(u.to_string());
            r.headers.push(("accept".into(), "application/json".into()));
            r.headers
                .push(("x-subscription-token".into(), engine.key.clone().unwrap_or_default()));
            r
        }
    };
    let resp = web.fetch(req, &engine.opts).await?.error_for_status()?;
    let body: Value = serde_json::from_slice(&resp.body).map_err(|e| {
        crate::net::FetchError::new(
            ErrorClass::Invalid,
            format!("the {} answer is not JSON: {e}", provider_name(engine.provider)),
        )
    })?;
    Ok(parse_hits(engine.provider, &body))
}

fn url_of(s: &str) -> Result<url::Url, crate::net::FetchError> {
    url::Url::parse(s).map_err(|e| crate::net::FetchError::new(ErrorClass::BadRequest, format!("bad URL: {e}")))
}

/// The hits of an engine's JSON answer.
fn parse_hits(provider: SearchProvider, body: &Value) -> Vec<Hit> {
    let (list, snippet_field) = match provider {
        SearchProvider::Searxng | SearchProvider::Tavily => (&body["results"], "content"),
        SearchProvider::Brave => (&body["web"]["results"], "description"),
    };
    let text = |v: &Value| v.as_str().unwrap_or_default().trim().to_string();
    list.as_array()
        .map(|items| {
            items
                .iter()
                .map(|r| Hit {
                    url: text(&r["url"]),
                    title: text(&r["title"]),
                    snippet: strip_tags(&text(&r[snippet_field])),
                    score: match provider {
                        SearchProvider::Brave => None,
                        _ => r["score"].as_f64(),
                    },
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Brave marks matches with `<strong>`; snippets are plain text.
fn strip_tags(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_engine_answer_is_read() {
        let searx =
            json!({"results": [{"url": "https://a.example/x", "title": "A", "content": "about a", "score": 2.5}]});
        assert_eq!(
            parse_hits(SearchProvider::Searxng, &searx),
            vec![Hit {
                url: "https://a.example/x".into(),
                title: "A".into(),
                snippet: "about a".into(),
                score: Some(2.5)
            }]
        );
        let brave = json!({"web": {"results": [{"url": "https://b.example/", "title": "B", "description": "a <strong>bold</strong> claim"}]}});
        let hits = parse_hits(SearchProvider::Brave, &brave);
        assert_eq!((hits[0].snippet.as_str(), hits[0].score), ("a bold claim", None));
        assert!(parse_hits(SearchProvider::Tavily, &json!({"error": "x"})).is_empty());
    }
}
