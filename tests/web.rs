//! The web kinds (http, search, scrape) through the real binary, against fake servers on
//! loopback: what lands in state for each behaviour of the guard, robots.txt, limits and
//! extraction, and the research workflow end to end.

use std::path::Path;
use std::process::Command;

use crate::support::fake_llm::{FakeLlm, Reply};
use crate::support::fake_web;
use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

struct Run {
    code: i32,
    output: Value,
    stderr: String,
}

/// Runs `workflow` (YAML text, written to a temp dir) with `args`, env vars and jsonl events.
fn run_yaml(workflow: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wf.yaml");
    std::fs::write(&file, workflow).unwrap();
    run_file(&file, args, env)
}

fn run_file(file: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
    cmd.current_dir(ROOT)
        .env_remove("RUNNER_ALLOW_NET")
        .env_remove("SEARXNG_URL")
        .args(["run", file.to_str().unwrap(), "--db", ":memory:", "--stream", "jsonl"])
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the runner binary starts");
    Run {
        code: out.status.code().unwrap_or(-1),
        output: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Run {
    fn done(self) -> Run {
        assert_eq!(self.code, 0, "the run should finish; stderr:\n{}", self.stderr);
        self
    }
}

/// A one-node workflow: `node` (YAML of its fields, indented 4) writes its output to `out`.
fn one_node(node: &str) -> String {
    format!(
        "name: web-test
input:
  type: object
  properties:
    urls: {{type: array}}
state:
  out: {{type: object, default: {{}}}}
  failure: {{type: object, default: {{}}}}
nodes:
  n:
{node}
    update: {{out: output}}
    on_error:
      to: failed
      update: {{failure: \"{{'class': error.class, 'message': error.message}}\"}}
  failed:
    kind: set
edges:
  - START -> n
  - n -> END
  - failed -> END
"
    )
}

fn scrape(urls: &[String], extra: &str, args: &[&str]) -> Value {
    let node = format!("    kind: scrape\n    urls: input.urls\n{extra}");
    let input = format!("urls={}", json!(urls));
    let mut all = vec!["--input", input.as_str()];
    all.extend_from_slice(args);
    run_yaml(&one_node(&node), &all, &[]).done().output["out"].clone()
}

fn page<'a>(out: &'a Value, url: &str) -> Option<&'a Value> {
    out["pages"].as_array()?.iter().find(|p| p["url"] == url)
}

fn error<'a>(out: &'a Value, url: &str) -> Option<&'a Value> {
    out["errors"].as_array()?.iter().find(|p| p["url"] == url)
}

// ── the client ──────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn runs_share_their_connections_to_a_site() {
    // The fake model server answers any path and counts the connections it accepts.
    let site = FakeLlm::start().await;
    site.default_reply(Reply::raw(200, "hello"));
    let config = runner::net::WebConfig {
        allow: runner::net::AllowList::parse(["127.0.0.1"]).unwrap(),
        ..Default::default()
    };
    // Each run has a web client of its own (its limits, robots.txt cache and cassette).
    for _ in 0..2 {
        let web = runner::net::Web::new(config.clone());
        let page = web
            .fetch(
                runner::net::Request::get(format!("{}/page", site.base_url)),
                &runner::net::FetchOptions::default(),
            )
            .await
            .unwrap();
        assert_eq!((page.status, &page.body[..]), (200, &b"hello"[..]));
    }
    assert_eq!(site.connections(), 1, "the second run opened a connection of its own");
}

// ── scrape ──────────────────────────────────────────────────────────────────────────────────

#[test]
fn scrape_extracts_the_article_without_its_boilerplate() {
    let site = fake_web::start("");
    let url = site.url("/articles/heat-pumps");
    let txt = site.url("/notes.txt");
    let out = scrape(&[url.clone(), txt.clone()], "", &["--allow-net", "127.0.0.1"]);
    let p = page(&out, &url).unwrap_or_else(|| panic!("the article is scraped: {out}"));
    assert_eq!(p["title"], "How heat pumps work | Energy Weekly");
    let content = p["content"].as_str().unwrap();
    assert!(content.contains("coefficient of performance (COP)"), "{content}");
    for boilerplate in ["SPONSORED", "Trending", "Celebrity", "Copyright 2025", "Newsletter"] {
        assert!(!content.contains(boilerplate), "`{boilerplate}` kept:\n{content}");
    }
    assert!(p["word_count"].as_u64().unwrap() > 150, "{p}");
    let q = p["quality_score"].as_f64().unwrap();
    assert!((0.5..=1.0).contains(&q), "quality {q}");
    let t = page(&out, &txt).unwrap_or_else(|| panic!("text is scraped: {out}"));
    assert_eq!(t["title"], "Field notes on heat pumps");
    assert_eq!(out["errors"], json!([]));
}

#[test]
fn without_an_allow_list_loopback_is_refused() {
    let site = fake_web::start("");
    let url = site.url("/articles/heat-pumps");
    let out = scrape(std::slice::from_ref(&url), "", &[]);
    let e = error(&out, &url).unwrap_or_else(|| panic!("refused: {out}"));
    assert_eq!(e["class"], "bad_request");
    assert!(e["message"].as_str().unwrap().contains("loopback"), "{e}");
    assert!(site.hits().is_empty(), "nothing reached the site: {:?}", site.hits());
    // The run-level allow-list also comes from the environment.
    let input = format!("urls={}", json!([url]));
    let r = run_yaml(
        &one_node("    kind: scrape\n    urls: input.urls\n"),
        &["--input", &input],
        &[("RUNNER_ALLOW_NET", "10.9.0.0/16, 127.0.0.1")],
    )
    .done();
    assert!(page(&r.output["out"], &url).is_some(), "{}", r.output);
}

#[test]
fn a_redirect_to_an_address_not_allowed_is_refused() {
    let bystander = fake_web::bystander("127.0.0.2");
    let site = fake_web::start(&format!("http://127.0.0.2:{}/", bystander.port));
    let out_url = site.url("/redirect-out");
    let in_url = site.url("/redirect-in");
    let out = scrape(&[out_url.clone(), in_url.clone()], "", &["--allow-net", "127.0.0.1"]);
    let e = error(&out, &out_url).unwrap_or_else(|| panic!("refused: {out}"));
    assert_eq!(e["class"], "bad_request");
    assert!(e["message"].as_str().unwrap().contains("127.0.0.2"), "{e}");
    assert!(
        bystander.hits().is_empty(),
        "the redirect target was reached: {:?}",
        bystander.hits()
    );
    // A redirect within the allowed host is followed.
    let p = page(&out, &in_url).unwrap_or_else(|| panic!("followed: {out}"));
    assert!(
        p["title"].as_str().unwrap().contains("coefficient of performance"),
        "{p}"
    );
}

#[test]
fn robots_txt_is_obeyed_and_read_once() {
    let site = fake_web::start("");
    let private = site.url("/private/secret");
    let a = site.url("/articles/heat-pumps");
    let b = site.url("/articles/cop");
    let out = scrape(
        &[private.clone(), a.clone(), b.clone()],
        "",
        &["--allow-net", "127.0.0.1"],
    );
    let e = error(&out, &private).unwrap_or_else(|| panic!("disallowed: {out}"));
    assert!(e["message"].as_str().unwrap().contains("robots.txt"), "{e}");
    assert!(page(&out, &a).is_some() && page(&out, &b).is_some(), "{out}");
    let hits = site.hits();
    assert!(!hits.iter().any(|h| h.starts_with("/private")), "{hits:?}");
    assert_eq!(hits.iter().filter(|h| *h == "/robots.txt").count(), 1, "{hits:?}");
    // robots: false skips it.
    let out = scrape(
        std::slice::from_ref(&private),
        "    robots: false\n",
        &["--allow-net", "127.0.0.1"],
    );
    assert!(page(&out, &private).is_some(), "{out}");
}

#[test]
fn limits_cut_huge_pages_time_out_slow_ones_and_refuse_other_types() {
    let site = fake_web::start("");
    let huge = site.url("/huge");
    let slow = site.url("/slow");
    let pdf = site.url("/report.pdf");
    let started = std::time::Instant::now();
    let out = scrape(
        &[huge.clone(), slow.clone(), pdf.clone()],
        "    timeout: 1s\n    max_bytes: 200000\n    robots: false\n",
        &["--allow-net", "127.0.0.1"],
    );
    assert!(started.elapsed().as_secs() < 8, "the slow page was waited for");
    let h = page(&out, &huge).unwrap_or_else(|| panic!("the huge page is kept, cut: {out}"));
    let content = h["content"].as_str().unwrap();
    assert!(content.len() < 200_000, "cut at max_bytes: {} bytes", content.len());
    assert!(content.contains("A heat pump moves heat"), "the start is kept");
    let s = error(&out, &slow).unwrap_or_else(|| panic!("timed out: {out}"));
    assert_eq!(s["class"], "timeout", "{s}");
    let p = error(&out, &pdf).unwrap_or_else(|| panic!("refused type: {out}"));
    assert_eq!(p["class"], "bad_request");
    assert!(
        p["message"]
            .as_str()
            .unwrap()
            .contains("unsupported content type `application/pdf`"),
        "{p}"
    );
}

#[test]
fn skip_min_quality_tags_and_on_failure_fail() {
    let site = fake_web::start("");
    let a = site.url("/articles/heat-pumps");
    let b = site.url("/articles/cop");
    let node = "    kind: scrape\n    urls: \"[{'url': input.urls[0], 'tag': 'st1'}, {'url': input.urls[1], 'tag': 'st2'}, input.urls[1] ~ '#dup']\"\n    skip: \"[input.urls[0] ~ '/']\"\n";
    let input = format!("urls={}", json!([a, b]));
    let r = run_yaml(&one_node(node), &["--input", &input, "--allow-net", "127.0.0.1"], &[]).done();
    let pages = r.output["out"]["pages"].as_array().unwrap().clone();
    assert_eq!(pages.len(), 1, "skipped and de-duplicated: {pages:?}");
    assert_eq!(
        (pages[0]["url"].clone(), pages[0]["tag"].clone()),
        (json!(b), json!("st2"))
    );
    // A quality floor above every page drops them all (they are not errors).
    let out = scrape(
        std::slice::from_ref(&a),
        "    min_quality: 0.99\n",
        &["--allow-net", "127.0.0.1"],
    );
    assert_eq!(out, json!({"pages": [], "errors": []}));
    // on_failure: fail fails the node with the page's class.
    let input = format!("urls={}", json!([site.url("/report.pdf")]));
    let r = run_yaml(
        &one_node("    kind: scrape\n    urls: input.urls\n    on_failure: fail\n"),
        &["--input", &input, "--allow-net", "127.0.0.1"],
        &[],
    )
    .done();
    assert_eq!(r.output["failure"]["class"], "bad_request", "{}", r.output);
}

// ── search ──────────────────────────────────────────────────────────────────────────────────

#[test]
fn searxng_results_are_normalised_deduplicated_and_tagged() {
    let site = fake_web::start("");
    let node = format!(
        "    kind: search\n    base_url: \"{}\"\n    queries: \"['heat pump cop', 'heat pump basics']\"\n    limit: 4\n    tag: \"'st1'\"\n",
        site.base()
    );
    let r = run_yaml(&one_node(&node), &[], &[]).done();
    let results = r.output["out"]["results"].as_array().unwrap().clone();
    let urls: Vec<&str> = results.iter().map(|x| x["url"].as_str().unwrap()).collect();
    assert_eq!(
        urls,
        vec![
            site.url("/articles/heat-pumps"),
            site.url("/articles/cop"),
            site.url("/private/secret")
        ],
        "one entry per normalised URL, the best-scored copy kept"
    );
    let cop = &results[1];
    assert_eq!(cop["score"], 0.8);
    assert_eq!(cop["provider"], "searxng");
    assert_eq!(cop["tag"], "st1");
    assert_eq!(cop["snippet"], "The coefficient of performance.");
    assert_eq!(results[0]["query"], "heat pump cop");
    let searches: Vec<String> = site.hits().into_iter().filter(|h| h.starts_with("/search")).collect();
    assert_eq!(searches.len(), 2, "both queries ran: {searches:?}");
    assert!(searches.iter().all(|h| h.contains("format=json")), "{searches:?}");
}

#[test]
fn tavily_takes_its_key_from_the_environment() {
    let site = fake_web::start("");
    let node = format!(
        "    kind: search\n    provider: tavily\n    base_url: \"{}/tavily\"\n    api_key_env: FAKE_TAVILY_KEY\n    queries: \"'heat pumps'\"\n    limit: 2\n",
        site.base()
    );
    let r = run_yaml(&one_node(&node), &[], &[("FAKE_TAVILY_KEY", "tvly-test")]).done();
    let results = r.output["out"]["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0]["provider"], "tavily");
    assert!(!r.stderr.contains("tvly-test"), "the key never reaches events");
    // A refused key is an auth error; a missing one is named.
    let r = run_yaml(&one_node(&node), &[], &[("FAKE_TAVILY_KEY", "wrong")]).done();
    assert_eq!(r.output["failure"]["class"], "auth", "{}", r.output);
    let r = run_yaml(&one_node(&node), &[], &[]).done();
    assert_eq!(r.output["failure"]["class"], "auth");
    assert!(
        r.output["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("FAKE_TAVILY_KEY")
    );
}

// ── http ────────────────────────────────────────────────────────────────────────────────────

#[test]
fn http_sends_templates_and_a_json_body_and_parses_the_answer() {
    let site = fake_web::start("");
    let node = format!(
        "    kind: http\n    method: POST\n    url: \"{}/api/echo\"\n    headers:\n      Authorization: \"Bearer ${{env:ECHO_TOKEN}}\"\n    query: {{lang: \"{{{{ input.urls[0] }}}}\"}}\n    body: {{items: input.urls, n: \"input.urls | length\"}}\n",
        site.base()
    );
    let r = run_yaml(
        &one_node(&node),
        &["--input", "urls=[\"en\"]"],
        &[("ECHO_TOKEN", "sekrit-value")],
    )
    .done();
    let out = &r.output["out"];
    assert_eq!(out["status"], 200);
    assert_eq!(out["headers"]["content-type"], "application/json");
    assert_eq!(
        out["body"],
        json!({"content_type": "application/json", "authorized": true, "body": {"items": ["en"], "n": 1}})
    );
    assert!(
        site.hits().iter().any(|h| h == "/api/echo?lang=en"),
        "{:?}",
        site.hits()
    );
    assert!(!r.stderr.contains("sekrit-value") && !r.output.to_string().contains("sekrit-value"));
}

#[test]
fn http_errors_are_typed_for_retry_policies() {
    let site = fake_web::start("");
    let node = format!(
        "    kind: http\n    url: \"{}/busy\"\n    retry: {{max_attempts: 1}}\n",
        site.base()
    );
    let r = run_yaml(&one_node(&node), &[], &[]).done();
    assert_eq!(r.output["failure"]["class"], "rate_limit", "{}", r.output);
    let node = format!("    kind: http\n    url: \"{}/missing\"\n", site.base());
    let r = run_yaml(&one_node(&node), &[], &[]).done();
    assert_eq!(r.output["failure"]["class"], "bad_request");
    // A URL whose host comes from data is not trusted: loopback is refused.
    let node = "    kind: http\n    url: \"{{ input.urls[0] }}\"\n";
    let input = format!("urls={}", json!([site.url("/articles/cop")]));
    let r = run_yaml(&one_node(node), &["--input", &input], &[]).done();
    assert_eq!(r.output["failure"]["class"], "bad_request");
    assert!(r.output["failure"]["message"].as_str().unwrap().contains("loopback"));
}

// ── the research workflow ───────────────────────────────────────────────────────────────────

/// The research workflow on `site`, its model replies scripted from what earlier nodes
/// produced; `args` are added to the run's.
fn research_on(site: &fake_web::FakeWeb, args: &[&str]) -> Run {
    let heat = site.url("/articles/heat-pumps");
    let cop = site.url("/articles/cop");
    let seasonal = site.url("/articles/seasonal");
    let notes = site.url("/notes.txt");
    let dir = tempfile::tempdir().unwrap();
    let plan = json!({"subtopics": [
        {"id": "st1", "title": "Mechanism", "description": "How the cycle moves heat.",
         "search_queries": ["heat pump refrigeration cycle", "how heat pumps work"], "status": "pending"},
        {"id": "st2", "title": "Efficiency", "description": "Seasonal figures.",
         "search_queries": ["heat pump SCOP"], "status": "pending"}],
        "rationale": "Mechanism, then performance."});
    let summary = |text: String, cites: &[&str]| {
        json!({"summary": text, "key_points": [text], "citations": cites, "confidence": "medium", "gaps": []})
            .to_string()
    };
    let s1 = summary(
        format!("A heat pump compresses a refrigerant to move heat [{heat}]; COP is three to four [{cop}]."),
        &[&heat, &cop],
    );
    let s2 = summary(
        format!("Field trials measured SCOP between 2.5 and 3.5 [{seasonal}]."),
        &[&seasonal],
    );
    let report = format!(
        "# Heat pumps\n\n## Summary\nThey move heat [{heat}] with a COP of three to four [{cop}] and a SCOP of 2.5 to 3.5 [{seasonal}].\n\n## Sources\n1. {heat}\n2. {cop}\n3. {seasonal}\n"
    );
    // Each reply answers only when its prompt shows what earlier nodes produced: the scraped
    // pages inside <source> tags, and the summaries with their sources for the synthesis.
    let script = json!({
        "replies": {"plan": plan.to_string()},
        "match": [
            {"contains": format!("Sources: {heat}, {cop}"), "reply": report},
            {"contains": format!("url=\"{heat}\""), "reply": s1},
            {"contains": format!("url=\"{notes}\""), "reply": s2},
        ]
    });
    let mock = dir.path().join("mock.yaml");
    std::fs::write(&mock, script.to_string()).unwrap();
    let mut all = vec![
        "--mock",
        mock.to_str().unwrap(),
        "--allow-net",
        "127.0.0.1",
        "--input",
        "query=How do heat pumps work?",
    ];
    all.extend_from_slice(args);
    run_file(
        &Path::new(ROOT).join("workflows/research.yaml"),
        &all,
        &[("SEARXNG_URL", &site.base())],
    )
}

#[test]
fn research_runs_end_to_end_on_the_fake_web() {
    let site = fake_web::start("");
    let heat = site.url("/articles/heat-pumps");
    let cop = site.url("/articles/cop");
    let seasonal = site.url("/articles/seasonal");
    let r = research_on(&site, &[]).done();
    let out = &r.output;
    let errors = out["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "only the page robots.txt disallows: {errors:?}");
    assert!(
        errors[0]["message"].as_str().unwrap().contains("robots.txt"),
        "{errors:?}"
    );
    let summaries = out["subtopic_summaries"].as_array().unwrap();
    assert_eq!(summaries.len(), 2, "{out}");
    assert_eq!(summaries[0]["citations"], json!([heat, cop]));
    assert_eq!(summaries[1]["citations"], json!([seasonal]));
    let final_report = out["final_report"].as_str().unwrap();
    for url in [&heat, &cop, &seasonal] {
        assert!(final_report.contains(url.as_str()), "{url} cited:\n{final_report}");
    }
    let meta = &out["report_metadata"];
    assert_eq!(meta["sources"], json!([heat, cop, seasonal]));
    assert_eq!(meta["subtopics_done"], 2);
    assert_eq!(meta["pages_scraped"], 4, "{meta}");
    let hits = site.hits();
    assert!(hits.iter().any(|h| h == "/articles/heat-pumps"), "{hits:?}");
    assert!(!hits.iter().any(|h| h.starts_with("/private")), "{hits:?}");
}

// ── record and replay ───────────────────────────────────────────────────────────────────────

/// Search, scrape the results, then call an API with a credential header.
fn web_pipeline(base: &str) -> String {
    format!(
        "name: web-cassette
state:
  found: {{type: object, default: {{}}}}
  pages: {{type: object, default: {{}}}}
  api: {{type: object, default: {{}}}}
nodes:
  find:
    kind: search
    base_url: \"{base}\"
    queries: \"['heat pump cop']\"
    limit: 3
    update: {{found: output}}
  read:
    kind: scrape
    urls: \"state.found.results | map(attribute='url') | list\"
    update: {{pages: output}}
  call:
    kind: http
    method: POST
    url: \"{base}/api/echo\"
    headers:
      Authorization: \"Bearer ${{env:ECHO_CREDENTIAL}}\"
    body: {{n: 1}}
    update: {{api: output}}
edges:
  - START -> find -> read -> call -> END
"
    )
}

#[test]
fn a_recorded_web_run_replays_with_the_servers_gone() {
    let mut site = fake_web::start("");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wf.yaml");
    std::fs::write(&file, web_pipeline(&site.base())).unwrap();
    let cassette = dir.path().join("web.jsonl");
    let cassette = cassette.to_str().unwrap();
    // The credential's variable name does not look secret: only the header name protects it.
    let secret = [("ECHO_CREDENTIAL", "sekrit-value")];
    let recorded = run_file(&file, &["--record", cassette, "--allow-net", "127.0.0.1"], &secret).done();
    assert_eq!(
        recorded.output["api"]["body"]["authorized"], true,
        "{}",
        recorded.output
    );
    let pages = recorded.output["pages"]["pages"].as_array().unwrap();
    assert!(!pages.is_empty(), "{}", recorded.output);
    let text = std::fs::read_to_string(cassette).unwrap();
    assert!(
        !text.contains("sekrit-value"),
        "the credential never reaches the cassette"
    );
    assert!(
        text.contains("/robots.txt") && text.contains("\"kind\":\"http\""),
        "{text}"
    );
    let hits = site.hits().len();
    site.stop();

    // Replayed with no server, no allow-list, and another credential: the same output.
    let replayed = run_file(&file, &["--replay", cassette], &[("ECHO_CREDENTIAL", "other-value")]).done();
    assert_eq!(replayed.output, recorded.output);
    assert_eq!(site.hits().len(), hits, "replay reaches no server");

    // A request the cassette does not hold fails the run, naming the closest recorded one.
    std::fs::write(&file, web_pipeline(&site.base()).replace("/api/echo", "/api/echoes")).unwrap();
    let missed = run_file(&file, &["--replay", cassette], &secret);
    assert_eq!(missed.code, 1, "{}", missed.stderr);
    assert!(missed.stderr.contains("holds no http request"), "{}", missed.stderr);
    assert!(missed.stderr.contains("/url"), "{}", missed.stderr);
    assert!(
        missed.stderr.contains(&format!("{}/api/echo", site.base())),
        "{}",
        missed.stderr
    );
}

/// Re-records `tests/fixtures/cassettes/research-web.jsonl`, the cassette of the research
/// workflow's search and scrape path that `workflows/research.test.yaml` replays. The fake
/// site's port is rewritten to SearxNG's default (127.0.0.1:8888), which is where the workflow
/// looks when `SEARXNG_URL` is unset, as it is under `runner test`.
/// Run with `cargo test --test integration -- --ignored web::record_the_research_cassette`.
#[test]
#[ignore = "writes a committed fixture"]
fn record_the_research_cassette() {
    let site = fake_web::start("");
    let dir = tempfile::tempdir().unwrap();
    let recorded = dir.path().join("research.jsonl");
    research_on(&site, &["--record", recorded.to_str().unwrap()]).done();
    let text = std::fs::read_to_string(&recorded)
        .unwrap()
        .replace(&format!("127.0.0.1:{}", site.port), "127.0.0.1:8888");
    std::fs::write(
        Path::new(ROOT).join("tests/fixtures/cassettes/research-web.jsonl"),
        text,
    )
    .unwrap();
}

// ── secrets and trust ───────────────────────────────────────────────────────────────────────

const OPENAI_CANARY: &str = "sk-canary-openai-0123456789abcdef0123456789";
const SVC_CANARY: &str = "svc-canary-cred-9876543210";
const QUERY_CANARY: &str = "svc-query-canary-5555555555";

/// An http node whose url, headers, query and form mix the workflow's own `${env:...}` with
/// templates of input that itself holds `${env:...}` text.
const ENV_WF: &str = r#"name: env-in-data
input:
  type: object
  properties:
    q: {type: string}
    p: {type: string}
state:
  out: {type: object, default: {}}
nodes:
  call:
    kind: http
    method: POST
    url: "${env:RUNNER_TEST_UNSET_SVC_URL:-http://127.0.0.1:PORT}/api?q={{ input.q }}&p={{ input.p }}"
    headers:
      X-Query: "{{ input.q }}"
      X-Auth: "${env:SVC_CRED}"
      X-Both: "{{ input.p }}/${env:SVC_CRED}"
    query: {q2: "{{ input.q }}", k: "${env:SVC_QUERY_CRED}"}
    form: {f: "{{ input.q }} {{ input.p }}"}
    update: {out: output}
edges:
  - START -> call -> END
"#;

#[test]
fn env_is_expanded_in_the_workflows_own_text_never_in_rendered_data() {
    let server = fake_web::recorder(200, json!({"ok": true}));
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("env.jsonl");
    let wf = ENV_WF.replace("PORT", &server.port.to_string());
    let r = run_yaml(
        &wf,
        &[
            "--input",
            "q=${env:OPENAI_API_KEY}",
            "--input",
            "p=${env:SVC_CRED}",
            "--record",
            cassette.to_str().unwrap(),
        ],
        &[
            ("OPENAI_API_KEY", OPENAI_CANARY),
            ("SVC_CRED", SVC_CANARY),
            ("SVC_QUERY_CRED", QUERY_CANARY),
        ],
    )
    .done();
    assert_eq!(r.output["out"]["status"], 200, "{}", r.output);
    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let seen = server.seen();
    assert!(!seen.contains(OPENAI_CANARY), "an input expanded the key: {seen}");
    let headers = &requests[0]["headers"];
    assert_eq!(headers["x-query"], "${env:OPENAI_API_KEY}", "{seen}");
    assert_eq!(headers["x-auth"], SVC_CANARY, "the workflow's own text is expanded");
    assert_eq!(headers["x-both"], format!("${{env:SVC_CRED}}/{SVC_CANARY}"));
    assert_eq!(
        seen.matches(SVC_CANARY).count(),
        2,
        "only the headers that say so: {seen}"
    );
    // The url's `${env:NAME:-default}` was expanded before it was parsed.
    assert!(requests[0]["uri"].as_str().unwrap().starts_with("/api?q="), "{seen}");
    // A header from `${env:...}` is a secret whatever its name: not in the cassette, not in
    // events.
    let recorded = std::fs::read_to_string(&cassette).unwrap();
    assert!(!recorded.contains(SVC_CANARY), "{recorded}");
    assert!(!recorded.contains(OPENAI_CANARY), "{recorded}");
    assert!(seen.contains(&format!("k={QUERY_CANARY}")), "{seen}");
    assert!(
        !recorded.contains(QUERY_CANARY),
        "a query value from the environment: {recorded}"
    );
    let entry: Value = serde_json::from_str(recorded.lines().nth(1).unwrap()).unwrap();
    assert_eq!(entry["request"]["headers"]["x-auth"], "[redacted]", "{entry}");
    assert!(!r.stderr.contains(SVC_CANARY) && !r.output.to_string().contains(SVC_CANARY));
    // The redacted request still matches on replay.
    let replayed = run_yaml(
        &wf,
        &[
            "--input",
            "q=${env:OPENAI_API_KEY}",
            "--input",
            "p=${env:SVC_CRED}",
            "--replay",
            cassette.to_str().unwrap(),
        ],
        &[
            ("OPENAI_API_KEY", OPENAI_CANARY),
            ("SVC_CRED", SVC_CANARY),
            ("SVC_QUERY_CRED", QUERY_CANARY),
        ],
    )
    .done();
    assert_eq!(replayed.output["out"]["status"], 200, "{}", replayed.output);
    assert_eq!(server.requests.lock().unwrap().len(), 1, "replay never connects");
}

#[test]
fn a_host_written_in_the_workflow_is_trusted_on_its_own_port_only() {
    let bystander = fake_web::bystander("127.0.0.1");
    let site = fake_web::start(&format!("http://127.0.0.1:{}/", bystander.port));
    let node = format!("    kind: http\n    url: \"{}\"\n", site.url("/redirect-out"));
    let r = run_yaml(&one_node(&node), &[], &[]).done();
    assert_eq!(r.output["failure"]["class"], "bad_request", "{}", r.output);
    assert!(
        r.output["failure"]["message"].as_str().unwrap().contains("loopback"),
        "{}",
        r.output
    );
    assert!(site.hits().contains(&"/redirect-out".to_string()));
    assert!(
        bystander.hits().is_empty(),
        "another port was reached: {:?}",
        bystander.hits()
    );
    // A redirect on the trusted port is followed; --allow-net still allows a whole host.
    let node = format!("    kind: http\n    url: \"{}\"\n", site.url("/redirect-in"));
    let r = run_yaml(&one_node(&node), &[], &[]).done();
    assert_eq!(r.output["out"]["status"], 200, "{}", r.output);
    let node = format!("    kind: http\n    url: \"{}\"\n", site.url("/redirect-out"));
    let r = run_yaml(&one_node(&node), &["--allow-net", "127.0.0.1"], &[]).done();
    let message = r.output["failure"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("{} answered HTTP 404", bystander.port)),
        "{}",
        r.output
    );
    assert_eq!(bystander.hits().len(), 1);
}

#[test]
fn embedded_ipv4_and_documentation_addresses_are_refused() {
    let site = fake_web::start("");
    let port = site.port;
    let urls: Vec<String> = [
        format!("http://[::127.0.0.1]:{port}/notes.txt"),
        format!("http://[::ffff:0:7f00:1]:{port}/notes.txt"),
        format!("http://[::ffff:127.0.0.1]:{port}/notes.txt"),
        format!("http://[64:ff9b::7f00:1]:{port}/notes.txt"),
        format!("http://192.0.2.1:{port}/x"),
        format!("http://198.51.100.1:{port}/x"),
        format!("http://203.0.113.1:{port}/x"),
    ]
    .into();
    let out = scrape(&urls, "    robots: false\n", &[]);
    for url in &urls {
        let e = error(&out, url).unwrap_or_else(|| panic!("{url} refused: {out}"));
        assert_eq!(e["class"], "bad_request", "{url}: {e}");
        assert!(e["message"].as_str().unwrap().contains("refused"), "{url}: {e}");
    }
    assert!(site.hits().is_empty(), "{:?}", site.hits());
}

// ── the run's environment ───────────────────────────────────────────────────────────────────

/// An http node and a search node whose URLs and keys are in the project's `.env`, not the
/// process's environment.
const DOT_ENV_WF: &str = r#"name: dot-env
state:
  echo: {type: object, default: {}}
  found: {type: object, default: {}}
  failure: {type: object, default: {}}
nodes:
  call:
    kind: http
    method: POST
    url: "${env:ECHO_BASE}/api/echo"
    headers: {Authorization: "Bearer ${env:ECHO_TOKEN}"}
    body: {hello: "'world'"}
    update: {echo: output.body}
  look:
    kind: search
    provider: tavily
    api_key_env: FAKE_TAVILY_KEY
    queries: "'heat pumps'"
    limit: 1
    update: {found: output}
    on_error:
      to: failed
      update: {failure: "{'class': error.class, 'message': error.message}"}
  failed: {kind: set}
edges:
  - START -> call -> look -> END
  - failed -> END
"#;

/// A key in `.env` works wherever a process variable does: an http node's `${env:…}` (its
/// host trusted as if written in the workflow), a search engine's key and base URL. The
/// process's environment still wins, and a refused key names the `.env` file it came from.
#[test]
fn keys_in_dot_env_reach_http_and_search_nodes() {
    let site = fake_web::start("");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wf.yaml"), DOT_ENV_WF).unwrap();
    let dot_env = dir.path().join(".env");
    let write_env = |tavily_key: &str| {
        std::fs::write(
            &dot_env,
            format!(
                "ECHO_BASE={}\nECHO_TOKEN=sekrit-value\nTAVILY_URL={}/tavily\nFAKE_TAVILY_KEY={tavily_key}\n",
                site.base(),
                site.base()
            ),
        )
        .unwrap();
    };
    let run = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
        cmd.current_dir(dir.path())
            .args(["run", "wf.yaml", "--db", ":memory:"])
            .env_remove("RUNNER_ALLOW_NET");
        for name in ["ECHO_BASE", "ECHO_TOKEN", "TAVILY_URL", "FAKE_TAVILY_KEY"] {
            cmd.env_remove(name);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        (serde_json::from_slice::<Value>(&out.stdout).unwrap(), stderr)
    };
    write_env("tvly-test");
    let (out, stderr) = run(&[]);
    assert_eq!(out["echo"]["authorized"], true, "{out}");
    assert_eq!(out["found"]["results"][0]["provider"], "tavily", "{out}");
    assert!(site.hits().iter().any(|h| h == "/tavily/search"), "{:?}", site.hits());
    assert!(!stderr.contains("sekrit-value") && !out.to_string().contains("tvly-test"));
    // The process's variable wins over `.env`'s.
    let (out, _) = run(&[("ECHO_TOKEN", "from-the-process")]);
    assert_eq!(out["echo"]["authorized"], false, "{out}");
    // A key the engine refuses is named with the file that set it.
    write_env("wrong");
    let (out, _) = run(&[]);
    assert_eq!(out["failure"]["class"], "auth", "{out}");
    let message = out["failure"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("the key is FAKE_TAVILY_KEY (from {})", dot_env.display())),
        "{message}"
    );
    // Set by the process, it is named as the process's.
    let (out, _) = run(&[("FAKE_TAVILY_KEY", "also-wrong")]);
    let message = out["failure"]["message"].as_str().unwrap();
    assert!(message.contains("the key is FAKE_TAVILY_KEY)"), "{message}");
}

// ── the server's run settings ───────────────────────────────────────────────────────────────

/// A served workflow whose http URL, greeting and file come from its `config`, each step's
/// failure kept in state.
const SERVED_WF: &str = r#"name: served
config:
  base: "http://192.0.2.1"
  greeting: "the workflow's"
  file: "/nonexistent/notes.txt"
state:
  echo: {type: object, default: {}}
  greeting: {type: string, default: ""}
  loaded: {default: null}
  failures: {type: array, reducer: append, default: []}
nodes:
  call:
    kind: http
    method: POST
    url: "{{ config.base }}/api/echo"
    body: {hello: "'world'"}
    update: {echo: output.body}
    on_error:
      to: greet
      update: {failures: "[{'node': 'call', 'message': error.message}]"}
  greet: {kind: set, update: {greeting: config.greeting}}
  read:
    kind: load
    source: "{{ config.file }}"
    update: {loaded: output.content}
    on_error:
      to: done
      update: {failures: "[{'node': 'read', 'message': error.message}]"}
  done: {kind: set}
edges:
  - START -> call -> greet -> read -> done -> END
"#;

/// `runner serve` takes `runner run`'s run settings: `--allow-net` lets served http nodes
/// reach a loopback host (only that one), `--allow-read` lets load nodes read a directory, and
/// `--set` overrides the config of every run, under a run's own `config.configurable`.
#[tokio::test]
async fn serve_takes_allow_net_allow_read_and_set() {
    use reqwest::Method;
    let site = fake_web::start("");
    let bystander = fake_web::bystander("127.0.0.2");
    let elsewhere = tempfile::tempdir().unwrap();
    let notes = elsewhere.path().join("notes.txt");
    std::fs::write(&notes, "Notes kept elsewhere.").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir(&workflows).unwrap();
    std::fs::write(workflows.join("served.yaml"), SERVED_WF).unwrap();
    let base = format!("base={}", site.base());
    let file = format!("file={}", notes.display());
    let args = [
        "--set",
        base.as_str(),
        "--set",
        "greeting=the server's",
        "--set",
        file.as_str(),
        "--allow-net",
        "127.0.0.1",
        "--allow-read",
        elsewhere.path().to_str().unwrap(),
    ];
    let (child, url, _) = crate::serve::spawn_live(dir.path(), &workflows, &args, &[("RUNNER_ALLOW_NET", "")]);
    let server = crate::serve::Server {
        child,
        base: url,
        dir: None,
    };
    let run = |body: Value| {
        let server = &server;
        async move {
            let (status, _, out) = crate::serve::call(server, Method::POST, "/runs/wait", Some(body)).await;
            assert_eq!(status, 200, "{out}");
            out
        }
    };
    let out = run(json!({"assistant_id": "served", "input": {}})).await;
    // A key nothing wrote (the failures) is not in a served run's values.
    assert!(out["failures"].as_array().is_none_or(Vec::is_empty), "{out}");
    assert_eq!(out["echo"]["body"], json!({"hello": "world"}), "{out}");
    assert_eq!(out["greeting"], "the server's", "{out}");
    assert_eq!(out["loaded"], "Notes kept elsewhere.", "{out}");
    // A run's own configurable wins; the allow-list is the flag's host and no other.
    let other = format!("http://127.0.0.2:{}", bystander.port);
    let out = run(json!({
        "assistant_id": "served",
        "input": {},
        "config": {"configurable": {"greeting": "the run's", "base": other}},
    }))
    .await;
    assert_eq!(out["greeting"], "the run's", "{out}");
    assert_eq!(out["failures"][0]["node"], "call", "{out}");
    assert!(
        out["failures"][0]["message"].as_str().unwrap().contains("loopback"),
        "{out}"
    );
    assert!(bystander.hits().is_empty(), "{:?}", bystander.hits());
    drop(server);
    // A path no served workflow's config has is refused at start.
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir.path())
        .args(["serve", "workflows", "--port", "0", "--set", "greting=hi"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--set greting: no served workflow has `greting` in its config (did you mean `greeting`?)"),
        "{stderr}"
    );
}
