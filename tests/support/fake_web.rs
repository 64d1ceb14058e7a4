//! Fake web servers for the web kinds' tests, on loopback only: a SearxNG JSON endpoint, a
//! Tavily endpoint, a small static site (articles wrapped in navigation, ads and footers, a
//! robots.txt, a redirect, a huge page, a slow page, a PDF) and a bystander server on
//! 127.0.0.2 that must never be reached.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::{Served, serve};

/// A running fake site.
pub(crate) struct FakeWeb {
    pub port: u16,
    /// Every path requested, in order.
    pub hits: Arc<Mutex<Vec<String>>>,
    served: Served,
}

impl FakeWeb {
    pub(crate) fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base())
    }

    pub(crate) fn hits(&self) -> Vec<String> {
        self.hits.lock().unwrap().clone()
    }

    /// Shuts the server down and waits until its port is closed.
    pub(crate) fn stop(&mut self) {
        self.served.stop();
    }
}

#[derive(Clone)]
struct Site {
    port: u16,
    /// Where `/redirect-out` sends clients.
    redirect_to: String,
    hits: Arc<Mutex<Vec<String>>>,
}

/// Starts the site on 127.0.0.1; `/redirect-out` redirects to `redirect_to`.
pub(crate) fn start(redirect_to: &str) -> FakeWeb {
    start_on("127.0.0.1", redirect_to)
}

/// A server on `ip` that only counts the requests it gets (the target of refused redirects).
pub(crate) fn bystander(ip: &str) -> FakeWeb {
    start_on(ip, "")
}

fn start_on(ip: &str, redirect_to: &str) -> FakeWeb {
    let hits = Arc::new(Mutex::new(Vec::new()));
    let served = serve(ip, |addr| {
        router(Site {
            port: addr.port(),
            redirect_to: redirect_to.to_string(),
            hits: hits.clone(),
        })
    });
    FakeWeb {
        port: served.addr.port(),
        hits,
        served,
    }
}

fn router(site: Site) -> Router {
    Router::new()
        .route("/search", get(searxng))
        .route("/tavily/search", post(tavily))
        .route("/robots.txt", get(|| async { "User-agent: *\nDisallow: /private/\n" }))
        .route("/articles/{slug}", get(article))
        .route("/private/{slug}", get(article))
        .route("/notes.txt", get(notes))
        .route("/redirect-out", get(redirect_out))
        .route(
            "/redirect-in",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/articles/cop")]) }),
        )
        .route("/huge", get(huge))
        .route("/slow", get(slow))
        .route("/report.pdf", get(pdf))
        .route("/busy", get(busy))
        .route("/api/echo", post(echo))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not here") })
        .layer(axum::middleware::from_fn_with_state(site.clone(), record))
        .with_state(site)
}

async fn record(State(site): State<Site>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
    site.hits.lock().unwrap().push(path);
    next.run(req).await
}

/// The hits of the fake engines: two articles, a duplicate with tracking parameters and a
/// worse score, and a page robots.txt disallows; a query about seasonal figures finds two
/// other pages, and one about private pages only the page robots.txt disallows.
fn hits_for(port: u16, query: &str) -> Vec<Value> {
    let base = format!("http://127.0.0.1:{port}");
    if query.contains("private") {
        return vec![json!({"url": format!("{base}/private/secret"), "title": "Private",
                           "content": "Not for robots.", "score": 0.5})];
    }
    if query.contains("SCOP") {
        return vec![
            json!({"url": format!("{base}/articles/seasonal"), "title": "Seasonal performance",
                   "content": "SCOP in field trials.", "score": 0.7}),
            json!({"url": format!("{base}/notes.txt"), "title": "Field notes",
                   "content": "Notes.", "score": 0.6}),
        ];
    }
    vec![
        json!({"url": format!("{base}/articles/heat-pumps"), "title": "How heat pumps work",
               "content": format!("Result for {query}: heat pumps move heat."), "score": 0.9}),
        json!({"url": format!("{base}/articles/cop?utm_source=feed#top"), "title": "COP explained",
               "content": "The coefficient of performance.", "score": 0.2}),
        json!({"url": format!("{base}/articles/cop"), "title": "COP explained",
               "content": "The coefficient of performance.", "score": 0.8}),
        json!({"url": format!("{base}/private/secret"), "title": "Private",
               "content": "Not for robots.", "score": 0.5}),
    ]
}

async fn searxng(State(site): State<Site>, Query(q): Query<std::collections::HashMap<String, String>>) -> Response {
    if q.get("format").map(String::as_str) != Some("json") {
        return (StatusCode::FORBIDDEN, "format=json required").into_response();
    }
    let query = q.get("q").cloned().unwrap_or_default();
    axum::Json(json!({"query": query, "results": hits_for(site.port, &query)})).into_response()
}

async fn tavily(State(site): State<Site>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    if headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some("Bearer tvly-test") {
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({"detail": "bad key"}))).into_response();
    }
    let query = body["query"].as_str().unwrap_or_default().to_string();
    let max = body["max_results"].as_u64().unwrap_or(5) as usize;
    let results: Vec<Value> = hits_for(site.port, &query).into_iter().take(max).collect();
    axum::Json(json!({"query": query, "results": results})).into_response()
}

const PARAGRAPHS: &[&str] = &[
    "A heat pump moves heat from a cold place to a warm one. It does this by evaporating a \
     refrigerant at low pressure, compressing the vapour, and condensing it at high pressure, \
     where it gives up the heat it absorbed outside together with the work of the compressor.",
    "The coefficient of performance (COP) compares the heat delivered with the electricity used. \
     Air-source heat pumps typically reach a COP of three to four in mild weather, falling as \
     the outdoor temperature drops, while ground-source units stay closer to four all year.",
    "Seasonal figures such as SCOP average the performance over a heating season. Field trials \
     in the United Kingdom measured seasonal values between 2.5 and 3.5 for well installed \
     systems, with undersized radiators and high flow temperatures the most common losses.",
    "Because a heat pump delivers more heat than the electricity it consumes, its running \
     emissions depend on the electricity mix; with a grid at 200 grams of carbon dioxide per \
     kilowatt hour, a unit with a COP of three emits about 67 grams per kilowatt hour of heat.",
];

fn article_html(title: &str) -> String {
    let body: String = PARAGRAPHS.iter().map(|p| format!("<p>{p}</p>\n")).collect();
    format!(
        r#"<!doctype html><html><head><title>{title} | Energy Weekly</title></head><body>
<header><nav class="main-nav"><a href="/">Home</a> <a href="/news">News</a> <a href="/reviews">Reviews</a>
<a href="/deals">Deals</a> <a href="/newsletter">Newsletter</a> <a href="/about">About</a></nav></header>
<div class="ad-banner advertisement">SPONSORED: Save 50% on solar panels today only! Click here.</div>
<aside class="sidebar"><h3>Trending</h3><ul><li><a href="/x">Ten gadgets you need</a></li>
<li><a href="/y">Celebrity homes tour</a></li><li><a href="/z">Quiz: which boiler are you?</a></li></ul></aside>
<main><article><h1>{title}</h1>
{body}</article></main>
<footer class="site-footer"><p>Copyright 2025 Energy Weekly Ltd. All rights reserved.</p>
<a href="/privacy">Privacy policy</a> <a href="/cookies">Cookie settings</a></footer>
</body></html>"#
    )
}

async fn article(Path(slug): Path<String>) -> Response {
    let title = match slug.as_str() {
        "heat-pumps" => "How heat pumps work",
        "cop" => "The coefficient of performance explained",
        "seasonal" => "Seasonal performance in the field",
        _ => "An article",
    };
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        article_html(title),
    )
        .into_response()
}

async fn notes() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain")],
        format!("Field notes on heat pumps\n\n{}", PARAGRAPHS.join("\n\n")),
    )
        .into_response()
}

async fn redirect_out(State(site): State<Site>) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, site.redirect_to.clone())]).into_response()
}

/// An article followed by 8 MB of padding, streamed in chunks without a length.
async fn huge() -> Response {
    let head = article_html("A very long page");
    let head = head.replace("</body></html>", "");
    let chunks = std::iter::once(head).chain((0..128).map(|_| format!("<p>{}</p>", "padding ".repeat(8 * 1024))));
    let stream = futures::stream::iter(chunks.map(Ok::<_, std::io::Error>));
    (
        [(header::CONTENT_TYPE, "text/html")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

async fn slow() -> Response {
    tokio::time::sleep(Duration::from_secs(10)).await;
    ([(header::CONTENT_TYPE, "text/html")], article_html("Too late")).into_response()
}

async fn pdf() -> Response {
    (
        [(header::CONTENT_TYPE, "application/pdf")],
        b"%PDF-1.4 not really".to_vec(),
    )
        .into_response()
}

async fn busy() -> Response {
    (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "2")], "slow down").into_response()
}

/// Echoes the request: method, the headers the test sets, and the JSON body.
async fn echo(headers: HeaderMap, body: String) -> Response {
    let h = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    axum::Json(json!({
        "content_type": h("content-type"),
        "authorized": h("authorization") == "Bearer sekrit-value",
        "body": serde_json::from_str::<Value>(&body).unwrap_or(Value::String(body)),
    }))
    .into_response()
}

/// A server on 127.0.0.1 that keeps every request it gets and answers each with one status
/// and body (a service whose credentials and inputs are under test).
pub(crate) struct Recorder {
    pub port: u16,
    /// Each request as `{method, uri, headers: {name: value}, body}`, in order.
    pub requests: Arc<Mutex<Vec<Value>>>,
    _served: Served,
}

impl Recorder {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every request as one text (to search for a value wherever it was sent).
    pub(crate) fn seen(&self) -> String {
        serde_json::to_string(&*self.requests.lock().unwrap()).unwrap()
    }
}

/// Starts a [`Recorder`] answering `status` with the JSON `body`; it stops when dropped.
pub(crate) fn recorder(status: u16, body: Value) -> Recorder {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let kept = requests.clone();
    let served = serve("127.0.0.1", |_| {
        Router::new().fallback(move |req: axum::extract::Request| {
            let kept = kept.clone();
            let body = body.clone();
            async move {
                let (parts, raw) = req.into_parts();
                let raw = axum::body::to_bytes(raw, 1 << 20).await.unwrap_or_default();
                let headers: serde_json::Map<String, Value> = parts
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(String::from_utf8_lossy(v.as_bytes()))))
                    .collect();
                kept.lock().unwrap().push(json!({
                    "method": parts.method.to_string(),
                    "uri": parts.uri.to_string(),
                    "headers": headers,
                    "body": String::from_utf8_lossy(&raw),
                }));
                (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response()
            }
        })
    });
    Recorder {
        port: served.addr.port(),
        requests,
        _served: served,
    }
}
