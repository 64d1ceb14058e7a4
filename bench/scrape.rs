//! Benchmark of the `scrape` kind: 200 article pages (navigation, ads, sidebar and footer
//! around ~600 words) served by a server this benchmark starts on 127.0.0.1, scraped by one
//! node with `concurrency: 16` through the engine: robots.txt, the guard, fetching, main-content
//! extraction and scoring included. Prints pages per second for a few rounds (a fresh web
//! client each round, so robots.txt is fetched again).
//!
//! Run with `cargo bench --bench scrape` (release profile). Uses the crate's own and dev
//! dependencies only: no criterion.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::Path;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use runner::checkpoint::memory::MemoryCheckpointer;
use runner::compile::compile_file;
use runner::engine::events::Events;
use runner::engine::{Engine, RunRequest, Status};
use runner::net::{AllowList, Web, WebConfig};
use runner::nodes::Services;
use serde_json::json;

const PAGES: usize = 200;
const ROUNDS: usize = 5;

fn page(i: usize) -> String {
    let para = "Heat pumps move heat from a cold reservoir to a warm one by compressing a refrigerant. \
                The coefficient of performance compares the heat delivered with the electricity used, \
                and typical air-source units reach three to four in mild weather, less in frost. ";
    let body: String = (0..8).map(|_| format!("<p>{para}{para}</p>\n")).collect();
    let links: String = (0..30)
        .map(|j| format!("<li><a href=\"/p/{j}\">Related story {j}</a></li>"))
        .collect();
    format!(
        "<!doctype html><html><head><title>Article {i}</title><style>body{{font:1em serif}}</style>\
         <script>var tracking = {i};</script></head><body>\
         <nav class=\"menu\"><a href=\"/\">Home</a><a href=\"/news\">News</a><a href=\"/deals\">Deals</a></nav>\
         <div class=\"ad\">Advertisement: buy now</div>\
         <aside class=\"sidebar\"><ul>{links}</ul></aside>\
         <main><article><h1>Article {i}</h1>{body}</article></main>\
         <footer>Copyright. <a href=\"/privacy\">Privacy</a></footer></body></html>"
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new()
        .route("/robots.txt", get(|| async { "User-agent: *\nDisallow: /private/\n" }))
        .route(
            "/p/{i}",
            get(|Path(i): Path<usize>| async move { ([(header::CONTENT_TYPE, "text/html")], page(i)).into_response() }),
        );
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scrape.yaml");
    std::fs::write(
        &file,
        "name: scrape-bench
input: {type: object, properties: {urls: {type: array}}}
state:
  pages: {type: array, default: []}
  errors: {type: array, default: []}
nodes:
  scrape:
    kind: scrape
    urls: input.urls
    concurrency: 16
    per_host: 16
    update: {pages: output.pages, errors: output.errors}
edges: [START -> scrape, scrape -> END]
",
    )
    .unwrap();
    let (plan, comp) = compile_file(&file, &runner::nodes::builtin().decls());
    let plan = plan.unwrap_or_else(|| panic!("{:?}", comp.diagnostics));
    let urls: Vec<String> = (0..PAGES).map(|i| format!("http://127.0.0.1:{port}/p/{i}")).collect();

    println!("scrape: {PAGES} local pages, concurrency 16");
    let mut rates = Vec::new();
    for round in 0..ROUNDS {
        let web = Web::new(WebConfig {
            allow: AllowList::parse(["127.0.0.1"]).unwrap(),
            per_host: 16,
            ..WebConfig::default()
        });
        let services = Services {
            web: Arc::new(web),
            ..Services::default()
        };
        let engine = Engine::new(
            plan.clone(),
            Arc::new(MemoryCheckpointer::new()),
            services,
            Events::none(),
        );
        let req = RunRequest {
            input: Some(json!({"urls": urls})),
            workflow: "scrape.yaml".into(),
            ..RunRequest::default()
        };
        let start = Instant::now();
        let out = rt.block_on(engine.run(req)).unwrap();
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(out.status, Status::Done, "{:?}", out.error);
        let pages = out.state["pages"].as_array().map_or(0, Vec::len);
        let errors = out.state["errors"].as_array().map_or(0, Vec::len);
        assert_eq!((pages, errors), (PAGES, 0), "{:?}", out.state["errors"]);
        let rate = PAGES as f64 / secs;
        println!("  round {}: {:.1} ms, {rate:.0} pages/s", round + 1, secs * 1e3);
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    println!("median: {:.0} pages/s", rates[rates.len() / 2]);
}
