//! The data kinds: chunking, the offline embedder, indexes (keywords + vectors, re-indexing,
//! embedder checks), hybrid retrieval with its options and rerankers, long-term memory, load
//! and save — mostly through the real binary, in a temporary directory. Every case that
//! indexes, retrieves or stores runs twice, on a SQLite data store and on PostgreSQL (the list
//! at the end); the store's own API is tested against each backend in `data_store.rs`.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use crate::support::{self, fake_rerank, fake_web};
use runner::rag::chunk::{Chunking, split};
use runner::rag::embed::{DIMS, HashedEmbedder, dot};
use runner::rag::{DataStore, Location};
use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// A two-page PDF (a text layer in Helvetica): filing on page 1, renewal fees on page 2.
const PDF: &str = "tests/fixtures/rag/pdf/patent-guide.pdf";

// ── helpers ─────────────────────────────────────────────────────────────────────────────────

/// Where a test's data store is: the cases that index, retrieve or store run on each.
#[derive(Debug, Clone, Copy)]
enum Data {
    /// `data.db` in the project.
    Sqlite,
    /// A fresh schema on the test PostgreSQL server.
    Postgres,
}

/// Defines each `case(data: Data)` as a test on SQLite and on PostgreSQL.
macro_rules! on_both_stores {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $case() {
                    super::$case(super::Data::Sqlite);
                }
            )*
        }
        mod postgres {
            $(
                #[test]
                fn $case() {
                    super::$case(super::Data::Postgres);
                }
            )*
        }
    };
}

/// A temporary working directory holding the fixture documents under `docs/`, and where its
/// data store is.
struct Project(support::Project, String);

impl std::ops::Deref for Project {
    type Target = support::Project;
    fn deref(&self) -> &support::Project {
        &self.0
    }
}

impl Project {
    fn new() -> Project {
        Project::on(Data::Sqlite)
    }

    fn on(data: Data) -> Project {
        let p = support::Project::new(&[]);
        std::fs::create_dir(p.path("docs")).unwrap();
        for entry in std::fs::read_dir(Path::new(ROOT).join("tests/fixtures/rag/docs")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), p.path("docs").join(entry.file_name())).unwrap();
        }
        let data_db = match data {
            Data::Sqlite => "data.db".to_string(),
            Data::Postgres => support::postgres::fresh_url(),
        };
        Project(p, data_db)
    }

    /// The `--data-db` argument: a file in the project, or a PostgreSQL URL.
    fn data_db(&self) -> &str {
        &self.1
    }

    /// The project's data store, as another process would open it.
    fn data_store(&self) -> DataStore {
        match self.1.starts_with("postgres") {
            true => DataStore::new(Location::Postgres(self.1.clone())),
            false => DataStore::at(self.path(&self.1)),
        }
    }

    fn runner(&self) -> Command {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
        cmd.current_dir(self.dir.path())
            .env_remove("RUNNER_DATA_DB")
            .env_remove("RUNNER_ALLOW_NET")
            .env_remove("RUNNER_DB");
        cmd
    }

    /// `runner run` of a shipped workflow on a mock script from tests/fixtures/mock/.
    fn run_shipped(&self, workflow: &str, mock: &str) -> Command {
        let mut cmd = self.runner();
        cmd.arg("run")
            .arg(Path::new(ROOT).join("workflows").join(workflow))
            .arg("--mock")
            .arg(Path::new(ROOT).join("tests/fixtures/mock").join(mock));
        cmd
    }

    /// `runner index PATHS --index NAME --data-db DATA`: (exit code, stdout).
    fn index(&self, paths: &[&str], name: &str, extra: &[&str]) -> (i32, String) {
        let out = self
            .runner()
            .arg("index")
            .args(paths)
            .args(["--index", name, "--data-db", self.data_db()])
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.code().unwrap_or(-1), text)
    }

    /// Writes `wf.yaml` and runs it with `--data-db DATA` and `args`.
    fn run(&self, workflow: &str, args: &[&str]) -> Outcome {
        self.write("wf.yaml", workflow);
        let out = self
            .runner()
            .args([
                "run",
                "wf.yaml",
                "--db",
                ":memory:",
                "--data-db",
                self.data_db(),
                "--stream",
                "jsonl",
            ])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        Outcome {
            code: out.status.code().unwrap_or(-1),
            output: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            events: stderr.lines().filter_map(|l| serde_json::from_str(l).ok()).collect(),
            stderr,
        }
    }
}

struct Outcome {
    code: i32,
    output: Value,
    events: Vec<Value>,
    stderr: String,
}

impl Outcome {
    fn ok(self) -> Outcome {
        assert_eq!(self.code, 0, "the run failed: {}", self.stderr);
        self
    }

    /// The `document#position` ids of the chunks found.
    fn ids(&self) -> Vec<String> {
        self.output["chunks"]
            .as_array()
            .unwrap_or(&Vec::new())
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect()
    }

    fn custom(&self, name: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["type"] == "custom" && e["event"] == name)
            .collect()
    }
}

/// A workflow with one retrieve node over `index` with the extra YAML `fields` (indented by 4).
fn retrieve_wf(index: &str, fields: &str) -> String {
    format!(
        r#"name: ask
input: {{type: object, required: [question], properties: {{question: {{type: string}}, docs: {{type: array}}}}}}
output: [chunks, best_score, best_distance, relevance, calibration]
models:
  judge: {{provider: mock, model: judge-1}}
state:
  chunks: {{type: array, default: []}}
  best_score: {{type: [number, "null"], default: null}}
  best_distance: {{type: [number, "null"], default: null}}
  relevance: {{type: [number, "null"], default: null}}
  calibration: {{type: [object, "null"], default: null}}
nodes:
  search:
    kind: retrieve
    index: {index}
    queries: input.question
{fields}
    update:
      chunks: output.chunks
      best_score: output.best_score
      best_distance: output.best_distance
      relevance: output.relevance
      calibration: output.calibration
edges:
  - START -> search -> END
"#
    )
}

// ── chunking and embedding ──────────────────────────────────────────────────────────────────

#[test]
fn chunks_respect_size_and_overlap_and_never_cut_words() {
    let text = (0..400).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ");
    let chunks = split(&text, false, Chunking { size: 200, overlap: 40 });
    assert!(chunks.len() > 10);
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c.position, i);
        assert!(c.text.chars().count() <= 200, "chunk {i} is {} chars", c.text.len());
        assert_eq!(
            c.text,
            text.chars().skip(c.start).take(c.end - c.start).collect::<String>()
        );
        // Whole words only: every word is one of the text's.
        for w in c.text.split(' ') {
            assert!(w.starts_with("word") && w[4..].parse::<u32>().is_ok(), "cut word {w:?}");
        }
    }
    for pair in chunks.windows(2) {
        let overlap = pair[0].end.saturating_sub(pair[1].start);
        assert!(pair[1].start < pair[0].end, "neighbours share text");
        assert!((20..=60).contains(&overlap), "overlap {overlap}");
    }
    assert_eq!(chunks.last().unwrap().end, text.len());
}

#[test]
fn markdown_chunks_keep_their_heading_path() {
    let text = "# Guide\n\nIntro text.\n\n## Install\n\n### Linux\n\nRun the installer.\n\n```\n# not a heading\n```\n\n## Use\n\nRun it.\n";
    let chunks = split(text, true, Chunking::default());
    let headings: Vec<_> = chunks.iter().map(|c| c.heading.clone().unwrap()).collect();
    assert_eq!(headings, ["Guide", "Guide > Install > Linux", "Guide > Use"]);
    assert!(chunks[1].text.contains("# not a heading"));
    assert!(chunks[1].text.starts_with("### Linux"));
}

#[test]
fn the_offline_embedder_is_deterministic_normalised_and_lexical() {
    let a = HashedEmbedder::vector("Remote employees keep core hours");
    assert_eq!(a, HashedEmbedder::vector("Remote employees keep core hours"));
    assert_eq!(a.len(), DIMS);
    assert!((dot(&a, &a) - 1.0).abs() < 1e-5);
    let near = dot(
        &a,
        &HashedEmbedder::vector("what are the core hours of remote employees"),
    );
    let far = dot(&a, &HashedEmbedder::vector("meal allowance abroad"));
    assert!(near > 0.4 && far.abs() < 0.2, "near {near}, far {far}");
}

#[test]
fn the_bundled_sqlite_has_fts5() {
    let c = rusqlite::Connection::open_in_memory().unwrap();
    let on: i64 = c
        .query_row("SELECT sqlite_compileoption_used('ENABLE_FTS5')", [], |r| r.get(0))
        .unwrap();
    assert_eq!(on, 1);
    c.execute_batch("CREATE VIRTUAL TABLE t USING fts5(x); INSERT INTO t VALUES ('hello world');")
        .unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM t WHERE t MATCH 'world'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

// ── indexes ─────────────────────────────────────────────────────────────────────────────────

fn runner_index_reports_what_it_did_and_skips_unchanged_files(data: Data) {
    let p = Project::on(data);
    let (code, out) = p.index(&["docs"], "kb", &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("index `kb`: 3 files indexed") && out.contains("0 unchanged"),
        "{out}"
    );
    let (_, out) = p.index(&["docs"], "kb", &[]);
    assert!(out.contains("0 files indexed (0 chunks), 3 unchanged"), "{out}");
    p.write("docs/travel-expenses.md", "# Travel\n\nAll travel is now by bicycle.\n");
    let (_, out) = p.index(&["docs"], "kb", &[]);
    assert!(out.contains("1 files indexed (1 chunks), 2 unchanged"), "{out}");
    let (code, out) = p.index(&["docs"], "kb", &["--reset", "--chunk-size", "200", "--overlap", "20"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("3 files indexed"), "{out}");
}

// ── retrieval ───────────────────────────────────────────────────────────────────────────────

fn hybrid_retrieval_finds_the_chunk_that_answers(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    let r = p
        .run(
            &retrieve_wf("kb", "    top_k: 3"),
            &["-i", "question=What is the daily meal allowance abroad?"],
        )
        .ok();
    assert_eq!(r.ids()[0], "travel-expenses.md#1", "{:#}", r.output);
    let top = &r.output["chunks"][0];
    assert_eq!(top["heading"], "Travel and Expenses > Meals");
    assert!(top["text"].as_str().unwrap().contains("80 euros abroad"));
    assert_eq!(r.ids().len(), 3);
    // RRF scores: a chunk first in both rankings of one query scores 2/61.
    assert!((top["score"].as_f64().unwrap() - 2.0 / 61.0).abs() < 1e-9, "{top}");
    assert_eq!(r.output["best_score"], top["score"]);
    let d = r.output["best_distance"].as_f64().unwrap();
    assert!(d > 0.0 && d < 0.8, "{d}");
}

fn several_queries_are_fused_and_html_is_searchable(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    let wf = retrieve_wf("kb", "    top_k: 4").replace(
        "queries: input.question",
        "queries: \"[input.question, 'lost laptop phishing report']\"",
    );
    let r = p.run(&wf, &["-i", "question=How long must passwords be?"]).ok();
    // The page's headings make one chunk per section, each with its heading path.
    let chunks = r.output["chunks"].as_array().unwrap();
    let html: Vec<(&str, &str)> = chunks
        .iter()
        .filter(|c| c["id"].as_str().unwrap().starts_with("security-handbook.html#"))
        .map(|c| (c["heading"].as_str().unwrap_or(""), c["text"].as_str().unwrap()))
        .collect();
    assert_eq!(html.len(), 2, "{:#}", r.output);
    assert!(
        html.iter()
            .any(|(h, t)| *h == "Security Handbook > Passwords" && t.contains("sixteen characters"))
    );
    assert!(
        html.iter()
            .any(|(h, t)| *h == "Security Handbook > Incidents" && t.contains("lost laptop"))
    );
    let texts: String = chunks.iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert!(!texts.contains("console.log"));
}

fn documents_restrict_the_search_and_bring_their_intro_chunks(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    let wf = retrieve_wf("kb", "    top_k: 1\n    intro_chunks: 2\n    documents: input.docs");
    // "euros" is in both policies; the restriction keeps to the one named by @mention.
    let r = p
        .run(
            &wf,
            &[
                "-i",
                "question=how many euros",
                "-i",
                r#"docs=["@remote-work-policy.md"]"#,
            ],
        )
        .ok();
    let ids = r.ids();
    assert_eq!(
        &ids[..2],
        ["remote-work-policy.md#0", "remote-work-policy.md#1"],
        "{ids:?}"
    );
    assert!(ids.iter().all(|i| i.starts_with("remote-work-policy.md#")), "{ids:?}");
    assert!(
        ids.contains(&"remote-work-policy.md#3".to_string()),
        "the equipment chunk: {ids:?}"
    );
    // By stem, without the extension.
    let r = p
        .run(
            &wf,
            &["-i", "question=how many euros", "-i", r#"docs=["travel-expenses"]"#],
        )
        .ok();
    assert!(
        r.ids().iter().all(|i| i.starts_with("travel-expenses.md#")),
        "{:?}",
        r.ids()
    );
}

fn neighbours_widen_each_hit_in_document_order(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    let wf = retrieve_wf("kb", "    top_k: 1\n    neighbours: 1");
    let r = p.run(&wf, &["-i", "question=core hours home time zone"]).ok();
    assert_eq!(
        r.ids(),
        [
            "remote-work-policy.md#1",
            "remote-work-policy.md#2",
            "remote-work-policy.md#3"
        ]
    );
}

fn a_missing_index_says_how_to_build_it(data: Data) {
    let p = Project::on(data);
    let r = p.run(&retrieve_wf("nowhere", ""), &["-i", "question=x"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr
            .contains("index `nowhere` does not exist; build it with `runner index DIR --index nowhere`"),
        "{}",
        r.stderr
    );
}

fn rerank_none_orders_by_vector_similarity(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    let r = p
        .run(
            &retrieve_wf("kb", "    top_k: 4\n    rerank: none"),
            &["-i", "question=What is the daily meal allowance abroad?"],
        )
        .ok();
    let scores: Vec<f64> = r.output["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    // Cosine similarity, and the best one is 1 − best_distance.
    assert!((scores[0] - (1.0 - r.output["best_distance"].as_f64().unwrap())).abs() < 1e-6);
}

fn the_llm_reranker_orders_by_the_models_scores(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    // The model prefers whichever passage is [1] of the candidates: the order must follow it.
    p.write(
        "mock.yaml",
        "replies:\n  search: \"Here you go:\\n```json\\n{\\\"scores\\\": [{\\\"index\\\": 0, \\\"score\\\": 2}, {\\\"index\\\": 1, \\\"score\\\": 9.5}]}\\n```\"\n",
    );
    let wf = retrieve_wf("kb", "    top_k: 2\n    rerank: {llm: judge}");
    let rrf = p
        .run(&retrieve_wf("kb", "    top_k: 2"), &["-i", "question=meal allowance"])
        .ok();
    let r = p
        .run(&wf, &["-i", "question=meal allowance", "--mock", "mock.yaml"])
        .ok();
    assert_eq!(r.ids(), [rrf.ids()[1].clone(), rrf.ids()[0].clone()]);
    assert_eq!(r.output["best_score"], 9.5);
    assert!(r.custom("rerank_failed").is_empty());
}

fn a_failing_llm_reranker_falls_back_to_rrf_and_says_so(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    p.write("mock.yaml", "replies:\n  search: \"I cannot rate these.\"\n");
    let wf = retrieve_wf("kb", "    top_k: 2\n    rerank: {llm: judge}");
    let rrf = p
        .run(&retrieve_wf("kb", "    top_k: 2"), &["-i", "question=meal allowance"])
        .ok();
    let r = p
        .run(&wf, &["-i", "question=meal allowance", "--mock", "mock.yaml"])
        .ok();
    assert_eq!(r.ids(), rrf.ids());
    let failed = r.custom("rerank_failed");
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed[0]["data"]["event"], "rerank_failed",
        "named in its payload: {}",
        failed[0]
    );
    assert!(
        failed[0]["data"]["error"].as_str().unwrap().contains("no scores"),
        "{}",
        failed[0]
    );
}

fn the_http_reranker_posts_the_candidates_and_follows_the_endpoint(data: Data) {
    let server = fake_rerank::start("vpn");
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    let wf = retrieve_wf("kb", &format!("    top_k: 1\n    rerank: {{url: \"{}\"}}", server.url));
    let r = p.run(&wf, &["-i", "question=laptop security"]).ok();
    assert_eq!(r.ids(), ["remote-work-policy.md#4"], "{:#}", r.output);
    let requests = server.requests.lock().unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["query"], "laptop security");
    assert!(requests[0]["documents"].as_array().unwrap().len() > 1);
}

// ── acceptance: the project's own docs ─────────────────────────────────────────────────────

fn acceptance_runner_index_on_docs_then_retrieve_answers_from_the_right_section(data: Data) {
    let p = Project::on(data);
    let docs = Path::new(ROOT).join("docs");
    let (code, out) = p.index(&[docs.to_str().unwrap()], "docs", &[]);
    assert_eq!(code, 0, "{out}");
    for (question, section) in [
        (
            "Which reducer deep merges objects key by key?",
            "The workflow language > State and reducers",
        ),
        (
            "How does new input on a finished thread start a new turn?",
            "The workflow language > Threads and turns",
        ),
    ] {
        let r = p
            .run(
                &retrieve_wf("docs", "    top_k: 3"),
                &["-i", &format!("question={question}")],
            )
            .ok();
        let headings: Vec<&str> = r.output["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["heading"].as_str().unwrap_or(""))
            .collect();
        assert!(headings.contains(&section), "{question}: {headings:?}");
    }
}

// ── long-term memory ────────────────────────────────────────────────────────────────────────

const MEMORY_WF: &str = r#"name: memory
input:
  type: object
  properties:
    op: {type: string}
    key: {type: string}
    value: {}
    query: {type: string}
output: [result]
context:
  type: object
  properties:
    user_id: {type: string}
state:
  result: {default: null}
nodes:
  put:
    kind: store
    op: put
    namespace: [memory, "{{ context.user_id }}", prefs]
    key: "{{ input.key }}"
    value: input.value
    update: {result: output}
  get:
    kind: store
    op: get
    namespace: [memory, "{{ context.user_id }}", prefs]
    key: "{{ input.key }}"
    update: {result: output}
  get_all:
    kind: store
    op: get
    namespace: [memory, "{{ context.user_id }}", prefs]
    update: {result: output}
  delete:
    kind: store
    op: delete
    namespace: [memory, "{{ context.user_id }}", prefs]
    key: "{{ input.key }}"
    update: {result: output}
  search:
    kind: store
    op: search
    namespace: [memory, "{{ context.user_id }}"]
    query: "{{ input.query }}"
    limit: 2
    update: {result: output}
edges:
  - from: START
    route:
      - {when: "input.op == 'put'", to: put}
      - {when: "input.op == 'get'", to: get}
      - {when: "input.op == 'delete'", to: delete}
      - {when: "input.op == 'search'", to: search}
      - {to: get_all}
  - put -> END
  - get -> END
  - get_all -> END
  - delete -> END
  - search -> END
"#;

fn store_puts_gets_deletes_and_searches_per_user(data: Data) {
    let p = Project::on(data);
    let mem = |user: &str, args: &[&str]| {
        let mut all = vec!["--context".to_string(), format!("user_id={user}")];
        all.extend(args.iter().map(|s| s.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        p.run(MEMORY_WF, &all).ok().output["result"].clone()
    };
    let put = mem(
        "alice",
        &[
            "-i",
            "op=put",
            "-i",
            "key=tone",
            "-i",
            r#"value={"style": "concise bullet points"}"#,
        ],
    );
    assert_eq!(put, Value::Null);
    mem(
        "alice",
        &[
            "-i",
            "op=put",
            "-i",
            "key=topics",
            "-i",
            r#"value=["heat pumps", "solar panels"]"#,
        ],
    );
    mem(
        "bob",
        &["-i", "op=put", "-i", "key=tone", "-i", r#"value="formal prose""#],
    );

    assert_eq!(
        mem("alice", &["-i", "op=get", "-i", "key=tone"]),
        json!({"style": "concise bullet points"})
    );
    assert_eq!(mem("alice", &["-i", "op=get", "-i", "key=missing"]), Value::Null);
    assert_eq!(
        mem("alice", &["-i", "op=all"]),
        json!({"tone": {"style": "concise bullet points"}, "topics": ["heat pumps", "solar panels"]})
    );
    assert_eq!(mem("bob", &["-i", "op=all"]), json!({"tone": "formal prose"}));

    let found = mem("alice", &["-i", "op=search", "-i", "query=solar energy"]);
    let found = found["items"].as_array().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["key"], "topics");
    assert_eq!(found[0]["namespace"], json!(["memory", "alice", "prefs"]));
    assert_eq!(
        mem("bob", &["-i", "op=search", "-i", "query=solar"]),
        json!({"items": []})
    );

    assert_eq!(mem("alice", &["-i", "op=delete", "-i", "key=tone"]), Value::Null);
    assert_eq!(
        mem("alice", &["-i", "op=all"]),
        json!({"topics": ["heat pumps", "solar panels"]})
    );
    // Deleting what is not there is not an error.
    mem("alice", &["-i", "op=delete", "-i", "key=tone"]);
}

/// Long-term memory with LangGraph's store options on `store` nodes: a `put` may keep an item
/// out of the semantic index (`index: false`) or give it a time to live (`ttl`, minutes).
const SEMANTIC_WF: &str = r#"name: semantic
input:
  type: object
  properties:
    op: {type: string}
    key: {type: string}
    value: {}
    query: {type: string}
state:
  result: {default: null}
nodes:
  put:
    kind: store
    op: put
    namespace: [notes]
    key: "{{ input.key }}"
    value: input.value
    update: {result: output}
  put_plain:
    kind: store
    op: put
    namespace: [notes]
    key: "{{ input.key }}"
    value: input.value
    index: false
    update: {result: output}
  put_brief:
    kind: store
    op: put
    namespace: [notes]
    key: "{{ input.key }}"
    value: input.value
    ttl: 0.002
    update: {result: output}
  get:
    kind: store
    op: get
    namespace: [notes]
    key: "{{ input.key }}"
    update: {result: output}
  search:
    kind: store
    op: search
    namespace: [notes]
    query: "{{ input.query }}"
    limit: 3
    update: {result: output}
edges:
  - from: START
    route:
      - {when: "input.op == 'put'", to: put}
      - {when: "input.op == 'put_plain'", to: put_plain}
      - {when: "input.op == 'put_brief'", to: put_brief}
      - {when: "input.op == 'get'", to: get}
      - {to: search}
  - put -> END
  - put_plain -> END
  - put_brief -> END
  - get -> END
  - search -> END
"#;

/// With `--store-index`, a `store` search ranks by the similarity of the indexed field: the
/// item that shares no keyword with the query is still found, after the closer one, and an
/// item put with `index: false` only fills the room left, scoreless. Without the index the
/// same search is keyword search. A `ttl` item is gone once its time is up; bad index
/// settings are named before anything runs.
fn store_nodes_search_by_meaning_with_a_store_index(data: Data) {
    let p = Project::on(data);
    let indexed = ["--store-index", "offline", "--store-index-field", "text"];
    let mem = |args: &[&str], index: bool| {
        let mut all: Vec<&str> = args.to_vec();
        if index {
            all.extend(indexed);
        }
        p.run(SEMANTIC_WF, &all).ok().output["result"].clone()
    };
    for (op, key, text) in [
        ("put", "tides", "the moon pulls the tides of the sea"),
        ("put", "bread", "baking sourdough bread at home"),
        ("put_plain", "plain", "moon tides moon tides"),
    ] {
        let value = format!(r#"value={{"text": "{text}"}}"#);
        let k = format!("key={key}");
        assert_eq!(
            mem(&["-i", &format!("op={op}"), "-i", &k, "-i", &value], true),
            Value::Null
        );
    }
    let found = mem(&["-i", "op=search", "-i", "query=moon tides"], true);
    let items = found["items"].as_array().unwrap();
    let keys: Vec<&str> = items.iter().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!(keys, ["tides", "bread", "plain"], "{found}");
    let (first, second) = (items[0]["score"].as_f64().unwrap(), items[1]["score"].as_f64().unwrap());
    assert!(first > second && first <= 1.0 + 1e-6, "{found}");
    assert_eq!(
        items[2]["score"],
        Value::Null,
        "an item kept out of the index has no score"
    );
    assert_eq!(
        items[0].as_object().unwrap().keys().collect::<Vec<_>>(),
        ["namespace", "key", "value", "score"],
        "the node's items have the same fields whichever way they were found"
    );
    // Without the index the query is keywords: the bread shares none.
    let found = mem(&["-i", "op=search", "-i", "query=moon tides"], false);
    let mut keys: Vec<&str> = found["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["key"].as_str())
        .collect();
    keys.sort();
    assert_eq!(keys, ["plain", "tides"], "{found}");

    // A ttl of 0.002 minutes: 120 ms.
    mem(
        &[
            "-i",
            "op=put_brief",
            "-i",
            "key=brief",
            "-i",
            r#"value={"text": "soon gone"}"#,
        ],
        true,
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(mem(&["-i", "op=get", "-i", "key=brief"], true), Value::Null);

    for (args, says) in [
        (vec!["--store-index", "anthropic:claude-haiku"], "serves no embeddings"),
        (vec!["--store-index", "nowhere"], "PROVIDER:MODEL"),
        (vec!["--store-index-field", "text"], "no index is set"),
    ] {
        let mut all = vec!["-i", "op=search", "-i", "query=x"];
        all.extend(args.iter().copied());
        let r = p.run(SEMANTIC_WF, &all);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
}

/// `--store-index PROVIDER:MODEL@URL`: the values put and the query are embedded by that
/// model (its `/embeddings`), the vectors are recorded as that embedder's, and a query asked
/// again is answered from the query-embedding cache without another call.
fn a_store_index_served_by_a_model_embeds_values_and_queries_through_it(data: Data) {
    let llm = support::fake_llm::FakeLlm::start_in_background();
    let p = Project::on(data);
    let embedder = format!("openai:fake-embed@{}", llm.base_url);
    let args = |extra: &[&str]| {
        let mut all = vec!["--store-index", embedder.as_str(), "--store-index-field", "text"];
        all.extend(extra.iter().copied());
        all.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let all = args(extra);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        p.run(SEMANTIC_WF, &all).ok().output["result"].clone()
    };
    run(&[
        "-i",
        "op=put",
        "-i",
        "key=a",
        "-i",
        r#"value={"text": "the moon pulls the tides"}"#,
    ]);
    run(&["-i", "op=put", "-i", "key=b", "-i", r#"value={"text": "bread"}"#]);
    let embedded = |llm: &support::fake_llm::FakeLlm| {
        llm.requests()
            .iter()
            .filter(|r| r.path.ends_with("/embeddings") && r.body["model"] == "fake-embed")
            .count()
    };
    assert_eq!(embedded(&llm), 2, "one call per value put");
    let found = run(&["-i", "op=search", "-i", "query=moon"]);
    let items = found["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{found}");
    assert!(items.iter().all(|i| i["score"].is_f64()), "{found}");
    assert_eq!(embedded(&llm), 3, "the query embedded once");
    run(&["-i", "op=search", "-i", "query=moon"]);
    assert_eq!(embedded(&llm), 3, "the same query again comes from the cache");
    // Both values' vectors are the model's (its vectors have 3 dimensions), none the offline
    // embedder's.
    let (by_model, offline) = p
        .data_store()
        .with_blocking(|c| {
            Ok((
                c.memory_scores("", &embedder, &[0.0, 0.0, 1.0])?,
                c.memory_scores("", runner::rag::embed::ID, &[0.0; DIMS])?,
            ))
        })
        .unwrap();
    assert_eq!((by_model.len(), offline.len()), (2, 0), "{by_model:?}");
}

#[test]
fn a_namespace_with_a_missing_part_is_refused() {
    let p = Project::new();
    let wf = MEMORY_WF.replace("{{ context.user_id }}", "{{ context.user_id | default('') }}");
    let r = p.run(&wf, &["-i", "op=all"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("empty part"), "{}", r.stderr);
}

#[test]
fn runs_that_use_no_data_kind_never_create_the_data_database() {
    let p = Project::new();
    p.write(
        "plain.yaml",
        "name: plain\noutput: [x]\nstate: {x: {default: 0}}\nnodes:\n  s: {kind: set, update: {x: 1}}\nedges: [START -> s -> END]\n",
    );
    let out = p
        .runner()
        .args(["run", "plain.yaml", "--db", ":memory:"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!p.path(".runner/data.db").exists());
    assert!(!p.path(".runner").exists());
}

// ── load and save ───────────────────────────────────────────────────────────────────────────

const FILES_WF: &str = r#"name: files
input:
  type: object
  properties:
    source: {type: string}
    path: {type: string}
output: [loaded, saved]
state:
  loaded: {default: null}
  saved: {default: null}
nodes:
  load:
    kind: load
    source: "{{ input.source }}"
    update: {loaded: output}
  save:
    kind: save
    path: "{{ input.path }}"
    content: "state.loaded.content"
    update: {saved: output}
edges:
  - START -> load -> save -> END
"#;

#[test]
fn load_reads_documents_and_save_writes_under_out() {
    let p = Project::new();
    let r = p
        .run(
            FILES_WF,
            &[
                "-i",
                "source=docs/security-handbook.html",
                "-i",
                "path=notes/handbook.txt",
            ],
        )
        .ok();
    let loaded = &r.output["loaded"];
    assert_eq!(loaded["title"], "Security Handbook");
    assert_eq!(loaded["format"], "html");
    assert_eq!(loaded["source"], "docs/security-handbook.html");
    assert!(loaded["content"].as_str().unwrap().contains("sixteen characters"));
    assert!(!loaded["content"].as_str().unwrap().contains("<p>"));
    assert_eq!(r.output["saved"]["path"], "out/notes/handbook.txt");
    let written = std::fs::read_to_string(p.path("out/notes/handbook.txt")).unwrap();
    assert_eq!(written, loaded["content"].as_str().unwrap());
    assert_eq!(r.output["saved"]["bytes"], written.len());

    p.write("data.json", r#"{"a": [1, 2]}"#);
    let r = p
        .run(FILES_WF, &["-i", "source=data.json", "-i", "path=copy.json"])
        .ok();
    assert_eq!(r.output["loaded"]["content"], json!({"a": [1, 2]}));
    assert_eq!(r.output["loaded"]["format"], "json");
    let copy: Value = serde_json::from_str(&std::fs::read_to_string(p.path("out/copy.json")).unwrap()).unwrap();
    assert_eq!(copy, json!({"a": [1, 2]}));
}

#[test]
fn load_reads_a_pdf_page_by_page() {
    let p = Project::new();
    std::fs::copy(Path::new(ROOT).join(PDF), p.path("guide.pdf")).unwrap();
    let r = p
        .run(FILES_WF, &["-i", "source=guide.pdf", "-i", "path=guide.txt"])
        .ok();
    let loaded = &r.output["loaded"];
    assert_eq!(loaded["format"], "pdf");
    assert_eq!(loaded["title"], "Patent Filing Guide");
    let text = loaded["content"].as_str().unwrap();
    let pages: Vec<&str> = text.split('\u{c}').collect();
    assert_eq!(pages.len(), 2, "{text:?}");
    assert!(pages[0].contains("invention disclosure form"), "{text:?}");
    assert!(pages[1].contains("annual maintenance fee"), "{text:?}");
}

#[test]
fn load_refuses_a_broken_pdf_and_oversized_documents() {
    let p = Project::new();
    p.write("a.pdf", "%PDF-1.7 ...");
    let r = p.run(FILES_WF, &["-i", "source=a.pdf", "-i", "path=x"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("a.pdf: the PDF could not be"), "{}", r.stderr);
    let wf = FILES_WF.replace(
        "    update: {loaded: output}",
        "    max_bytes: 10\n    update: {loaded: output}",
    );
    let r = p.run(&wf, &["-i", "source=docs/travel-expenses.md", "-i", "path=x"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("over `max_bytes` (10)"), "{}", r.stderr);
}

/// A file sent in a chat message: the document block of the last message.
const BLOCK_WF: &str = r#"name: upload
input:
  type: object
  properties:
    messages: {type: array}
output: [loaded]
state:
  loaded: {default: null}
nodes:
  load:
    kind: load
    document: "input.messages[-1].content | selectattr('type', 'ne', 'text') | first"
    update: {loaded: output}
edges:
  - START -> load -> END
"#;

#[test]
fn load_reads_a_document_sent_as_a_content_block_in_every_clients_shape() {
    use base64::Engine as _;
    let p = Project::new();
    let pdf = base64::engine::general_purpose::STANDARD.encode(std::fs::read(Path::new(ROOT).join(PDF)).unwrap());
    // LangChain 0.3 (agent-chat-ui's older builds), LangChain JS v1 (agent-chat-ui today),
    // LangChain Python v1.
    let shapes = [
        json!({"type": "file", "source_type": "base64", "mime_type": "application/pdf", "data": pdf,
               "metadata": {"filename": "guide.pdf"}}),
        json!({"type": "file", "mimeType": "application/pdf", "data": pdf, "metadata": {"filename": "guide.pdf"}}),
        json!({"type": "file", "base64": pdf, "mime_type": "application/pdf", "extras": {"filename": "guide.pdf"}}),
    ];
    for block in shapes {
        let input = json!({"messages": [{"type": "human", "id": "m1",
                                          "content": [{"type": "text", "text": "Summarize this"}, block]}]});
        p.write("input.json", &input.to_string());
        let r = p.run(BLOCK_WF, &["--input-file", "input.json"]).ok();
        let loaded = &r.output["loaded"];
        assert_eq!(loaded["format"], "pdf", "{loaded}");
        assert_eq!(loaded["source"], "guide.pdf");
        assert_eq!(loaded["title"], "Patent Filing Guide");
        assert!(
            loaded["content"].as_str().unwrap().contains("annual maintenance fee"),
            "{loaded}"
        );
    }
    // A block without a document fails the node, saying what it found.
    let input = json!({"messages": [{"type": "human", "content": [{"type": "file", "file_id": "file-1"}]}]});
    p.write("input.json", &input.to_string());
    let r = p.run(BLOCK_WF, &["--input-file", "input.json"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr
            .contains("document: the block names a file stored by a provider"),
        "{}",
        r.stderr
    );
    // `source` and `document` together, or neither, are refused before anything runs.
    for (field, said) in [
        ("    source: x.pdf\n", "`source` or `document`, not both"),
        ("", "needs a `source` or a `document`"),
    ] {
        let wf = BLOCK_WF.replace("    document:", &format!("{field}    document:"));
        let wf = if field.is_empty() {
            wf.replace(
                "    document: \"input.messages[-1].content | selectattr('type', 'ne', 'text') | first\"\n",
                "",
            )
        } else {
            wf
        };
        p.write("bad.yaml", &wf);
        let out = p.runner().args(["validate", "bad.yaml"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains(said), "{text}");
    }
}

#[test]
fn load_from_a_url_goes_through_the_guard() {
    let site = fake_web::start("");
    let p = Project::new();
    let url = site.url("/notes.txt");
    let source = format!("source={url}");
    let r = p.run(FILES_WF, &["-i", &source, "-i", "path=notes.txt"]);
    assert_eq!(r.code, 1, "a loopback source is refused: {}", r.stderr);
    assert!(r.stderr.contains("loopback"), "{}", r.stderr);
    assert!(site.hits().is_empty(), "{:?}", site.hits());
    let r = p
        .run(
            FILES_WF,
            &["-i", &source, "-i", "path=notes.txt", "--allow-net", "127.0.0.1"],
        )
        .ok();
    assert_eq!(r.output["loaded"]["source"], url);
    assert_eq!(r.output["loaded"]["format"], "text");
    assert!(!r.output["loaded"]["content"].as_str().unwrap().is_empty());
    let small = FILES_WF.replace(
        "    update: {loaded: output}",
        "    max_bytes: 10\n    update: {loaded: output}",
    );
    let r = p.run(&small, &["-i", &source, "-i", "path=x", "--allow-net", "127.0.0.1"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("over `max_bytes` (10)"), "{}", r.stderr);
}

#[test]
fn save_stays_inside_its_directory() {
    let p = Project::new();
    std::fs::create_dir_all(p.path("out")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), p.path("out/escape")).unwrap();
    for (path, why) in [
        ("../x.txt", "may not contain `..`"),
        ("a/../../x.txt", "may not contain `..`"),
        ("/etc/x.txt", "must be relative"),
        ("escape/x.txt", "leads outside"),
    ] {
        let r = p.run(
            FILES_WF,
            &["-i", "source=docs/travel-expenses.md", "-i", &format!("path={path}")],
        );
        assert_eq!(r.code, 1, "{path}");
        assert!(r.stderr.contains(why), "{path}: {}", r.stderr);
    }
    assert!(!p.path("x.txt").exists());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    // A symlink that stays inside is fine.
    std::fs::create_dir_all(p.path("out/real")).unwrap();
    std::os::unix::fs::symlink(p.path("out/real"), p.path("out/alias")).unwrap();
    p.run(
        FILES_WF,
        &["-i", "source=docs/travel-expenses.md", "-i", "path=alias/x.md"],
    )
    .ok();
    assert!(p.path("out/real/x.md").exists());
}

// ── acceptance: the shipped RAG chat on an index built by `runner index` ──────────────────

fn acceptance_rag_workflow_answers_from_the_indexed_documents(data: Data) {
    let p = Project::on(data);
    let (code, out) = p.index(&["docs"], "ipr_docs", &[]);
    assert_eq!(code, 0, "{out}");
    let out = p
        .run_shipped("rag.yaml", "rag-retrieval.yaml")
        .args(["--db", ":memory:", "--data-db", p.data_db(), "--stream", "jsonl"])
        // The shipped thresholds, on the offline embedder: relevance is calibrated for it (its
        // raw distance to the answering chunk, about 0.7, was past a fixed 0.6 threshold).
        .args(["-i", "question=What does the policy say about reimbursing a monitor?"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let events: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let ran: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "node_end")
        .map(|e| e["node"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        ran,
        [
            "analyzing",
            "router",
            "planning",
            "rewriter_fast",
            "searching",
            "query_expander",
            "retriever",
            "generating",
            "generator",
            "cite_sources"
        ],
        "{stderr}"
    );
    // The seed's status events, in order, and a source event per document used.
    let custom = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["type"] == "custom" && e["event"] == name)
            .map(|e| &e["data"])
            .collect()
    };
    let stages: Vec<&str> = custom("status").iter().map(|d| d["stage"].as_str().unwrap()).collect();
    // Each names itself in its data, as the seed's client tells a status from a source.
    assert!(custom("status").iter().all(|d| d["event"] == "status"), "{events:?}");
    assert!(custom("source").iter().all(|d| d["event"] == "source"), "{events:?}");
    assert_eq!(stages, ["analyzing", "planning", "searching", "generating"]);
    let sourced: Vec<&str> = custom("source")
        .iter()
        .map(|d| d["document"].as_str().unwrap())
        .collect();
    // travel-expenses.md was retrieved too, but the answer does not draw on it.
    assert_eq!(sourced, ["remote-work-policy.md"], "{stderr}");
    for d in custom("source") {
        assert!(
            d["chunks"].as_array().is_some_and(|c| !c.is_empty()),
            "each source names its chunks: {d}"
        );
    }
    assert_eq!(result["intent"], "direct_rag");
    assert_eq!(
        result["answer"],
        "The company reimburses a monitor up to 250 euros once every three years [remote-work-policy.md]."
    );
    // The documents the answer used (it cites them), not every one retrieved.
    assert_eq!(result["sources"], json!(["remote-work-policy.md"]));
}

fn rag_sources_are_this_turns_and_only_what_its_answer_used(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "ipr_docs", &[]);
    let turn = |args: &[&str]| -> Value {
        let out = p
            .run_shipped("rag.yaml", "rag-retrieval.yaml")
            .args(["--db", "runs.db", "--data-db", p.data_db(), "--thread", "t"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let first = turn(&["-i", "question=What does the policy say about reimbursing a monitor?"]);
    assert_eq!(first["sources"], json!(["remote-work-policy.md"]));
    // A chat turn on the same thread: nothing was retrieved for it, so nothing is its source.
    let second = turn(&["-i", "question=Thanks!", "-i", "mode=chat"]);
    assert_eq!(second["intent"], "chat");
    assert_eq!(second["sources"], json!([]));
    // A retrieval turn whose answer cites no document draws on none of them.
    p.write(
        "q.json",
        r#"{"question": "Which document covers the weather on mars?", "mode": "rag"}"#,
    );
    let third = turn(&["--input-file", "q.json"]);
    assert_eq!(third["answer"], "The documents do not say.", "{third}");
    assert_eq!(third["sources"], json!([]));
}

fn rag_workflow_mentions_restrict_retrieval_to_the_named_document(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "ipr_docs", &[]);
    p.write(
        "q.json",
        r#"{"question": "@travel-expenses.md how much is reimbursed in euros?"}"#,
    );
    let out = p
        .run_shipped("rag.yaml", "rag-retrieval.yaml")
        .args(["--db", ":memory:", "--data-db", p.data_db(), "--stream", "jsonl"])
        // `-i key=@file` reads a file: the question comes in an input file.
        .args(["--input-file", "q.json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["intent"], "specific_doc_rag");
    let retrieved: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "node_end" && e["node"] == "retriever")
        .flat_map(|e| e["writes"]["documents"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(!retrieved.is_empty(), "{stderr}");
    assert!(
        retrieved.iter().all(|c| c["document"] == "travel-expenses.md"),
        "{retrieved:?}"
    );
}

// ── acceptance: deep-research's memory and knowledge base ─────────────────────────────────

/// deep-research's `memory_store`, as it is fed: one task per entry of a `send` fan-out, the
/// entry in scope as `entry`.
const MEMORY_STORE_WF: &str = r#"name: remember
input: {type: object, properties: {updates: {type: array}}}
context: {type: object, required: [user_id], properties: {user_id: {type: string}}}
output: [stored]
state:
  stored: {type: array, reducer: append, default: []}
nodes:
  start: {kind: set}
  memory_store:
    kind: store
    op: put
    namespace: [memory, "{{ context.user_id }}", deep_research]
    key: "{{ entry.key }}"
    value: entry.value
    update: {stored: "[entry.key]"}
edges:
  - from: START
    to: start
  - from: start
    route:
      - {send: {to: memory_store, foreach: input.updates, as: entry}}
  - memory_store -> END
"#;

fn acceptance_deep_research_reads_memory_per_user_and_its_knowledge_base(data: Data) {
    let p = Project::on(data);
    assert_eq!(p.index(&["docs"], "knowledge_base", &[]).0, 0);
    p.write(
        "updates.json",
        r#"{"updates": [
            {"key": "profile", "value": {"name": "Alice", "role": "heating engineer"}},
            {"key": "preferences", "value": {"depth": "technical"}}
        ]}"#,
    );
    let stored = p
        .run(
            MEMORY_STORE_WF,
            &["--input-file", "updates.json", "--context", "user_id=alice"],
        )
        .ok();
    let mut keys: Vec<&str> = stored.output["stored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["preferences", "profile"]);

    let deep = |user: &str| {
        let out = p
            .run_shipped("deep-research.yaml", "deep-research-start.yaml")
            .args(["--db", "runs.db", "--data-db", p.data_db(), "--thread", user])
            .args(["--context", &format!("user_id={user}")])
            .args([
                "-i",
                "query=What does the remote work policy say about laptop security?",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
        let state = p
            .runner()
            .args(["state", "--thread", user, "--db", "runs.db"])
            .output()
            .unwrap();
        assert!(state.status.success(), "{}", String::from_utf8_lossy(&state.stderr));
        serde_json::from_slice::<Value>(&state.stdout).unwrap()
    };
    let alice = deep("alice");
    let values = alice.get("values").unwrap_or(&alice);
    assert_eq!(
        values["memory"],
        json!({"preferences": {"depth": "technical"}, "profile": {"name": "Alice", "role": "heating engineer"}})
    );
    assert_eq!(values["returning_user"], true);
    let context = values["rag_context"].as_array().unwrap();
    assert!(!context.is_empty());
    assert_eq!(context[0]["document"], "remote-work-policy.md", "{context:?}");
    assert!(
        context
            .iter()
            .any(|c| c["text"].as_str().unwrap().contains("full-disk encryption"))
    );

    // Another user's memory is their own.
    let bob = deep("bob");
    let values = bob.get("values").unwrap_or(&bob);
    assert_eq!(values["memory"], json!({}));
    assert_eq!(values["returning_user"], false);
}

fn deep_research_without_a_knowledge_base_goes_on_with_no_context(data: Data) {
    let p = Project::on(data);
    let out = p
        .run_shipped("deep-research.yaml", "deep-research-start.yaml")
        .args(["--db", "runs.db", "--data-db", p.data_db(), "--thread", "carol"])
        .args(["--context", "user_id=carol", "-i", "query=How are heat pumps sized?"])
        .output()
        .unwrap();
    // The missing index is handled: the run reaches the plan gate.
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let state = p
        .runner()
        .args(["state", "--thread", "carol", "--db", "runs.db", "--key", "rag_context"])
        .output()
        .unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&state.stdout).unwrap(), json!([]));
}

// ── the index node ──────────────────────────────────────────────────────────────────────────

const INDEX_WF: &str = r#"name: learn
input: {type: object, properties: {docs: {type: array}, question: {type: string}}}
output: [indexed, chunks]
state:
  indexed: {default: null}
  chunks: {type: array, default: []}
nodes:
  add:
    kind: index
    index: notes
    documents: input.docs
    chunking: {size: 300, overlap: 30}
    update: {indexed: output}
  ask:
    kind: retrieve
    index: notes
    queries: input.question
    top_k: 1
    update: {chunks: output.chunks}
edges:
  - START -> add -> ask -> END
"#;

fn the_index_node_takes_paths_and_documents_and_skips_what_it_has(data: Data) {
    let p = Project::on(data);
    p.write(
        "in.json",
        r#"{"question": "who waters the office plants?", "docs": [
            "docs/travel-expenses.md",
            {"id": "office-notes", "text": "Priya waters the office plants every Friday.", "title": "Office"}
        ]}"#,
    );
    let r = p.run(INDEX_WF, &["--input-file", "in.json"]).ok();
    assert_eq!(
        r.output["indexed"],
        json!({"documents": ["docs/travel-expenses.md", "office-notes"], "chunks": 4, "skipped": []})
    );
    assert_eq!(r.output["chunks"][0]["id"], "office-notes#0");
    // Directories are walked; what did not change is skipped (a file is known by its real path,
    // whatever it was called).
    p.write("in.json", r#"{"question": "plants", "docs": ["docs", {"id": "office-notes", "text": "Priya waters the office plants every Friday.", "title": "Office"}]}"#);
    let r = p.run(INDEX_WF, &["--input-file", "in.json"]).ok();
    assert_eq!(
        r.output["indexed"],
        json!({
            "documents": ["remote-work-policy.md", "security-handbook.html"],
            // The handbook's two sections are a chunk each.
            "chunks": 7,
            "skipped": ["travel-expenses.md", "office-notes"]
        })
    );
}

/// deep-research's `save_report`, as it is written there.
const SAVE_REPORT_WF: &str = r#"name: save
input: {type: object, properties: {report: {type: string}}}
context: {type: object, required: [user_id], properties: {user_id: {type: string}}}
output: [report_path]
state:
  report: {type: string, default: ""}
  report_path: {type: [string, "null"], default: null}
nodes:
  start:
    kind: set
    update: {report: input.report}
  save_report:
    kind: save
    path: "reports/{{ context.user_id }}/{{ run.thread_id }}.md"
    content: state.report
    update:
      report_path: output.path
edges:
  - START -> start -> save_report -> END
"#;

#[test]
fn deep_research_save_report_writes_under_out_per_user_and_thread() {
    let p = Project::new();
    let r = p
        .run(
            SAVE_REPORT_WF,
            &[
                "-i",
                "report=# Heat pumps\n\nSized by load.",
                "--context",
                "user_id=alice",
                "--thread",
                "t1",
            ],
        )
        .ok();
    assert_eq!(r.output["report_path"], "out/reports/alice/t1.md");
    assert_eq!(
        std::fs::read_to_string(p.path("out/reports/alice/t1.md")).unwrap(),
        "# Heat pumps\n\nSized by load."
    );
}

// ── files stay where they belong ───────────────────────────────────────────────────────────

/// [`FILES_WF`] whose save node writes under `dir` (a template).
fn files_wf_with_dir(dir: &str) -> String {
    FILES_WF
        .replace(
            "    path: {type: string}\n",
            "    path: {type: string}\n    d: {type: string}\n",
        )
        .replace(
            "    path: \"{{ input.path }}\"\n",
            &format!("    path: \"{{{{ input.path }}}}\"\n    dir: \"{dir}\"\n"),
        )
}

#[test]
fn save_confines_a_rendered_dir_to_its_static_root() {
    let p = Project::new();
    std::fs::create_dir_all(p.path("out")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), p.path("out/escape")).unwrap();
    let wf = files_wf_with_dir("out/{{ input.d }}");
    let abs = outside.path().join("abs");
    // Where `../../NAME` from out/ lands: beside the project, in the shared temp directory.
    let name = format!("{}-escaped", p.dir.path().file_name().unwrap().to_string_lossy());
    let beside = p.dir.path().parent().unwrap().join(&name);
    for (d, why) in [
        (format!("../../{name}"), "may not contain `..`"),
        (format!("a/../../{name}"), "may not contain `..`"),
        ("..".to_string(), "may not contain `..`"),
        (abs.to_str().unwrap().to_string(), "must be relative"),
        ("escape".to_string(), "leads outside"),
    ] {
        let r = p.run(
            &wf,
            &[
                "-i",
                "source=docs/travel-expenses.md",
                "-i",
                "path=x.txt",
                "-i",
                &format!("d={d}"),
            ],
        );
        assert_eq!(r.code, 1, "d={d}: {}", r.stderr);
        assert!(r.stderr.contains(why), "d={d}: {}", r.stderr);
    }
    assert!(!p.path("x.txt").exists() && !p.path("out/x.txt").exists());
    assert!(!beside.exists(), "written outside out/: {}", beside.display());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    // A rendered dir inside the root is written there.
    let r = p
        .run(
            &wf,
            &[
                "-i",
                "source=docs/travel-expenses.md",
                "-i",
                "path=x.txt",
                "-i",
                "d=alice/2025",
            ],
        )
        .ok();
    assert_eq!(r.output["saved"]["path"], "out/alice/2025/x.txt");
    assert!(p.path("out/alice/2025/x.txt").exists());
    // A dir that is all template is confined to the current directory.
    let wf = files_wf_with_dir("{{ input.d }}");
    let d = format!("d=../{name}");
    let r = p.run(
        &wf,
        &["-i", "source=docs/travel-expenses.md", "-i", "path=x.txt", "-i", &d],
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        !beside.exists(),
        "written outside the current directory: {}",
        beside.display()
    );
}

#[test]
fn load_reads_only_inside_the_workflows_directory_and_allowed_roots() {
    let p = Project::new();
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("notes.txt"), "Notes from elsewhere.").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", p.path("docs/passwd.txt")).unwrap();
    let other = elsewhere.path().join("notes.txt");
    let other = other.to_str().unwrap();
    for source in [
        "/etc/passwd",
        "/proc/self/environ",
        "../../../../../../etc/hostname",
        "docs/passwd.txt",
        other,
    ] {
        let r = p.run(FILES_WF, &["-i", &format!("source={source}"), "-i", "path=x.txt"]);
        assert_eq!(r.code, 1, "{source} is refused: {}", r.stderr);
        assert!(
            r.stderr.contains(&format!("refused to read {source}")) && r.stderr.contains("--allow-read"),
            "{source}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("root:"), "{}", r.stderr);
    }
    // An allowed root is readable, by flag or from the environment.
    let dir = elsewhere.path().to_str().unwrap();
    let r = p
        .run(
            FILES_WF,
            &[
                "-i",
                &format!("source={other}"),
                "-i",
                "path=x.txt",
                "--allow-read",
                dir,
            ],
        )
        .ok();
    assert_eq!(r.output["loaded"]["content"], "Notes from elsewhere.");
    let out = p
        .runner()
        .args(["run", "wf.yaml", "--db", ":memory:", "--data-db", "data.db"])
        .args(["-i", &format!("source={other}"), "-i", "path=y.txt"])
        .env("RUNNER_ALLOW_READ", dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // The index node reads paths from data under the same rule.
    let wf = r#"name: idx
input: {type: object, properties: {paths: {type: array}}}
nodes:
  add:
    kind: index
    index: kb
    documents: input.paths
edges:
  - START -> add -> END
"#;
    let r = p.run(wf, &["-i", r#"paths=["/etc"]"#]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("refused to read /etc"), "{}", r.stderr);
    p.run(wf, &["-i", r#"paths=["docs"]"#]).ok();
}

// ── secrets ─────────────────────────────────────────────────────────────────────────────────

#[test]
fn a_key_across_the_excerpt_cut_leaks_no_prefix() {
    const KEY: &str = "sk-cut-0123456789abcdefghijklmnopqrstuvwx";
    // The reranker quotes 200 characters of the body: the key starts 20 characters before
    // the cut.
    let body = json!({"detail": format!("{}{KEY} is not valid", "x".repeat(200 - 11 - 20))});
    assert_eq!(body.to_string().find(KEY), Some(180));
    let server = fake_web::recorder(401, body);
    let p = Project::new();
    p.index(&["docs"], "kb", &[]);
    p.write(
        "wf.yaml",
        &retrieve_wf(
            "kb",
            &format!("    top_k: 1\n    rerank: {{url: \"{}\"}}", server.url("/rerank")),
        ),
    );
    let out = p
        .runner()
        .args([
            "run",
            "wf.yaml",
            "--db",
            "cp.db",
            "--data-db",
            "data.db",
            "--stream",
            "jsonl",
        ])
        .args(["-i", "question=laptop security", "--record", "c.jsonl"])
        .env("OPENAI_API_KEY", KEY)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("rerank_failed") && stderr.contains("HTTP 401"),
        "{stderr}"
    );
    let mut places = vec![
        ("stderr", stderr.into_bytes()),
        ("stdout", out.stdout),
        ("cassette", std::fs::read(p.path("c.jsonl")).unwrap()),
    ];
    for entry in std::fs::read_dir(p.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with("cp.db") {
            places.push(("checkpoint db", std::fs::read(&path).unwrap()));
        }
    }
    let prefix = &KEY.as_bytes()[..8];
    for (what, bytes) in &places {
        assert!(
            !bytes.windows(prefix.len()).any(|w| w == prefix),
            "{what} holds a prefix of the key"
        );
    }
}

#[test]
fn runner_test_reads_allowed_roots_too() {
    let p = Project::new();
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("notes.txt"), "Notes from elsewhere.").unwrap();
    let other = elsewhere.path().join("notes.txt");
    p.write("wf.yaml", FILES_WF);
    p.write(
        "wf.test.yaml",
        &format!(
            "workflow: wf.yaml\ncases:\n  - name: reads elsewhere\n    input: {{source: \"{}\", path: x.txt}}\n    expect:\n      output: {{loaded: {{content: Notes from elsewhere.}}}}\n",
            other.display()
        ),
    );
    let refused = p.runner().args(["test", "wf.test.yaml"]).output().unwrap();
    let text = String::from_utf8_lossy(&refused.stdout).into_owned();
    assert_eq!(refused.status.code(), Some(1), "{text}");
    assert!(text.contains("--allow-read"), "{text}");
    let dir = elsewhere.path().to_str().unwrap();
    let allowed = p
        .runner()
        .args(["test", "wf.test.yaml", "--allow-read", dir])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&allowed.stdout).into_owned();
    assert_eq!(allowed.status.code(), Some(0), "{text}");
}

// ── HTML extraction ─────────────────────────────────────────────────────────────────────────

/// Ordinary text whose `&` is followed by a multi-byte character, with headings and a code
/// block.
const MENU_HTML: &str = "<!doctype html><html><head><title>Caf\u{e9} &amp; co</title></head><body>\
<nav>Home | Menu | Contact</nav>\
<h1>Menu</h1><p>Fish &\u{e9}t\u{e9} and R&\u{d7}D &\u{1f600} for everyone, Tea &\u{65e5}\u{672c}\u{8336}\u{306e}\u{5e97} too.</p>\
<h2>Drinks</h2><p>Espresso is served all day.</p>\
<h3>Recipes</h3><pre>steam milk\n  pour slowly</pre>\
<footer>(c) Caf\u{e9}</footer></body></html>";

fn html_with_an_ampersand_before_a_multibyte_character_is_indexed_and_loaded(data: Data) {
    let p = Project::on(data);
    p.write("menu/menu.html", MENU_HTML);
    let (code, out) = p.index(&["menu"], "menu", &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 files indexed"), "{out}");
    let r = p
        .run(FILES_WF, &["-i", "source=menu/menu.html", "-i", "path=menu.md"])
        .ok();
    let loaded = &r.output["loaded"];
    assert_eq!(loaded["title"], "Caf\u{e9} & co");
    let content = loaded["content"].as_str().unwrap();
    assert!(
        content.contains("Fish &\u{e9}t\u{e9} and R&\u{d7}D &\u{1f600}"),
        "{content}"
    );
    assert!(
        content.contains("Tea &\u{65e5}\u{672c}\u{8336}\u{306e}\u{5e97} too"),
        "{content}"
    );
    assert!(content.contains("# Menu") && content.contains("## Drinks"), "{content}");
    assert!(content.contains("```\nsteam milk\n  pour slowly\n```"), "{content}");
    assert!(!content.contains("Contact") && !content.contains("(c)"), "{content}");
}

fn html_headings_become_chunk_heading_paths(data: Data) {
    let p = Project::on(data);
    p.write("menu/menu.html", MENU_HTML);
    p.index(&["menu"], "menu", &["--chunk-size", "60", "--overlap", "0"]);
    let r = p
        .run(
            &retrieve_wf("menu", "    top_k: 5"),
            &["-i", "question=How are milk recipes poured?"],
        )
        .ok();
    let headings: Vec<&str> = r.output["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["heading"].as_str())
        .collect();
    assert_eq!(headings.first(), Some(&"Menu > Drinks > Recipes"), "{:#}", r.output);
    assert!(headings.contains(&"Menu"), "{headings:?}");
}

// ── PDF, the embedding cache, calibrated relevance, segmentation, the index CLI ────────────

fn runner_index_reads_pdf_and_each_chunk_keeps_its_page(data: Data) {
    let p = Project::on(data);
    std::fs::create_dir(p.path("pdf")).unwrap();
    std::fs::copy(Path::new(ROOT).join(PDF), p.path("pdf/patent-guide.pdf")).unwrap();
    let (code, out) = p.index(&["pdf"], "kb", &["--chunk-size", "150", "--overlap", "0"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 files indexed"), "{out}");
    let wf = retrieve_wf("kb", "    top_k: 1");
    let r = p
        .run(&wf, &["-i", "question=When is the annual maintenance fee paid?"])
        .ok();
    let top = &r.output["chunks"][0];
    assert_eq!(top["document"], "patent-guide.pdf", "{:#}", r.output);
    assert_eq!(top["page"], 2, "{:#}", r.output);
    assert!(top["text"].as_str().unwrap().contains("every March"), "{top}");
    let r = p
        .run(&wf, &["-i", "question=Who submits the invention disclosure form?"])
        .ok();
    assert_eq!(r.output["chunks"][0]["page"], 1, "{:#}", r.output);
}

fn retrieve_embeds_a_repeated_query_once(data: Data) {
    let llm = support::fake_llm::FakeLlm::start_in_background();
    let p = Project::on(data);
    let model = format!("embed=openai:fake-embed@{}", llm.base_url);
    let (code, out) = p.index(&["docs"], "kb", &["--embeddings", "embed", "--model", &model]);
    assert_eq!(code, 0, "{out}");
    let wf = retrieve_wf("kb", "    top_k: 1\n    embeddings: embed").replace(
        "  judge: {provider: mock, model: judge-1}",
        "  judge: {provider: mock, model: judge-1}\n  embed: {provider: openai, model: fake-embed}",
    );
    let embedded = |llm: &support::fake_llm::FakeLlm| -> Vec<Value> {
        llm.requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/embeddings"))
            .map(|r| r.body["input"].clone())
            .collect()
    };
    let before = embedded(&llm).len();
    for _ in 0..2 {
        p.run(
            &wf,
            &[
                "-i",
                "question=meal allowance abroad",
                "--model",
                &model,
                "--allow-net",
                "127.0.0.1",
            ],
        )
        .ok();
    }
    let asked: Vec<Value> = embedded(&llm).split_off(before);
    let queries: Vec<&Value> = asked
        .iter()
        .filter(|i| {
            i.as_array()
                .is_some_and(|a| a.iter().any(|t| t == "meal allowance abroad"))
        })
        .collect();
    assert_eq!(
        queries.len(),
        1,
        "the second run's query came from the cache: {asked:?}"
    );
}

fn relevance_is_calibrated_for_the_embedder_and_separates_answered_from_unrelated(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    let wf = retrieve_wf("kb", "    top_k: 1");
    let ask = |q: &str| p.run(&wf, &["-i", &format!("question={q}")]).ok().output;
    let answered = ask("What does the policy say about reimbursing a monitor?");
    let unrelated = ask("What is the boiling point of mercury in kelvin?");
    let k = &answered["calibration"];
    let (matching, unrelated_cos) = (k["matching"].as_f64().unwrap(), k["unrelated"].as_f64().unwrap());
    assert!(matching > unrelated_cos, "{k}");
    assert!(k["samples"].as_u64().unwrap() >= 3, "{k}");
    let rel = |o: &Value| o["relevance"].as_f64().unwrap();
    // The raw distance says little on its own (about 0.7 for the answering chunk); the
    // calibrated relevance puts the two questions on either side of rag.yaml's thresholds.
    let d = answered["best_distance"].as_f64().unwrap();
    assert!(d > 0.6, "the lexical embedder's raw distance: {d}");
    assert!(rel(&answered) >= 0.2, "{answered:#}");
    assert!(rel(&unrelated) < 0.1, "{unrelated:#}");
    // Stored with the index and reused while it is unchanged; redone when it changes.
    let stored = p.data_store().with_blocking(|c| c.calibration("kb")).unwrap();
    assert_eq!(stored.map(|k| k.samples), k["samples"].as_i64());
    p.write(
        "docs/extra.md",
        "# Parking\n\nStaff park in the north car park free of charge.\n",
    );
    p.index(&["docs"], "kb", &[]);
    let again = ask("What does the policy say about reimbursing a monitor?");
    assert_ne!(
        again["calibration"], answered["calibration"],
        "recalibrated after the index changed"
    );
}

fn rag_workflow_leaves_the_knowledge_base_out_of_an_unrelated_question(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "ipr_docs", &[]);
    // The retrieval script, with variations of this question (the script's own are about the
    // monitor, which the knowledge base answers).
    let script = std::fs::read_to_string(Path::new(ROOT).join("tests/fixtures/mock/rag-retrieval.yaml")).unwrap();
    let variations = r#"["mercury boiling temperature", "boiling point of Hg", "liquid metal properties"]"#;
    let script = script.replace(
        r#"["monitor reimbursement amount", "home office equipment allowance", "screen expenses refund"]"#,
        variations,
    );
    assert!(script.contains(variations));
    p.write("mercury.yaml", &script);
    let out = p
        .runner()
        .arg("run")
        .arg(Path::new(ROOT).join("workflows/rag.yaml"))
        .args(["--mock", "mercury.yaml"])
        .args(["--db", ":memory:", "--data-db", p.data_db(), "--stream", "jsonl"])
        .args(["-i", "question=What is the boiling point of mercury?", "-i", "mode=rag"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["answer"], "The documents do not say.", "{stderr}");
    assert!(
        !stderr.contains(r#""event":"source""#),
        "no source for an answer not drawn from them"
    );
}

fn each_planned_query_searches_its_own_documents(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    // The plan asks about the monitor in the travel policy and about meals in the remote-work
    // policy: each query finds only its own document's chunks, though the words of each are
    // in the other document.
    let wf = retrieve_wf("kb", "    top_k: 6").replace(
        "queries: input.question",
        "queries: \"[{'query': 'monitor reimbursed euros', 'documents': ['travel-expenses.md']}, \
         {'query': 'meal allowance abroad euros', 'documents': ['@remote-work-policy.md']}]\"",
    );
    let r = p.run(&wf, &["-i", "question=unused"]).ok();
    let ids = r.ids();
    assert!(!ids.is_empty());
    assert!(
        ids.iter()
            .all(|i| i.starts_with("travel-expenses.md#") || i.starts_with("remote-work-policy.md#")),
        "{ids:?}"
    );
    assert!(ids.iter().any(|i| i.starts_with("travel-expenses.md#")), "{ids:?}");
    assert!(ids.iter().any(|i| i.starts_with("remote-work-policy.md#")), "{ids:?}");
    // A query restricted to one document finds nothing of the other.
    let wf = retrieve_wf("kb", "    top_k: 6").replace(
        "queries: input.question",
        "queries: \"[{'query': 'monitor reimbursed', 'documents': ['travel-expenses.md']}]\"",
    );
    let ids = p.run(&wf, &["-i", "question=unused"]).ok().ids();
    assert!(ids.iter().all(|i| i.starts_with("travel-expenses.md#")), "{ids:?}");
}

fn runner_index_model_serves_the_embeddings_profile_like_run(data: Data) {
    let llm = support::fake_llm::FakeLlm::start_in_background();
    let p = Project::on(data);
    let model = format!("embed=openai:fake-embed@{}", llm.base_url);
    let (code, out) = p.index(&["docs"], "kb", &["--embeddings", "embed", "--model", &model]);
    assert_eq!(code, 0, "{out}");
    assert!(
        llm.requests()
            .iter()
            .any(|r| r.path.ends_with("/embeddings") && r.body["model"] == "fake-embed"),
        "the documents went to the model --model named"
    );
    let built = p.data_store().with_blocking(|c| c.index_embedder("kb")).unwrap();
    assert_eq!(built, Some(format!("openai:fake-embed@{}", llm.base_url)));
    // Over a workflow's profile too.
    p.write("wf.yaml", &retrieve_wf("kb", "    embeddings: judge"));
    let judge = format!("judge=openai:fake-embed@{}", llm.base_url);
    let (code, out) = p.index(
        &["docs"],
        "kb2",
        &["--workflow", "wf.yaml", "--embeddings", "judge", "--model", &judge],
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = p.index(&["docs"], "kb3", &["--embeddings", "nowhere"]);
    assert_ne!(code, 0);
    assert!(out.contains("--model nowhere=PROVIDER:MODEL"), "{out}");
}

fn a_question_starting_with_a_mention_is_passed_with_a_double_at(data: Data) {
    let p = Project::on(data);
    p.index(&["docs"], "ipr_docs", &[]);
    let out = p
        .run_shipped("rag.yaml", "rag-retrieval.yaml")
        .args(["--db", ":memory:", "--data-db", p.data_db()])
        .args(["-i", "question=@@travel-expenses.md how much is reimbursed in euros?"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["intent"], "specific_doc_rag");
    assert_eq!(
        result["messages"][0]["content"],
        "@travel-expenses.md how much is reimbursed in euros?"
    );
    // A single `@` still reads a file, and a missing one says how to write the text instead.
    let out = p
        .run_shipped("rag.yaml", "rag-retrieval.yaml")
        .args(["--db", ":memory:", "--data-db", p.data_db()])
        .args(["-i", "question=@travel-expenses.md how much?"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("question=@@travel-expenses.md how much?"), "{stderr}");
}

/// A text-embeddings-inference `/rerank`: `{query, texts}` in, `[{index, score}]` out, best
/// first (not in input order); it scores by how often a text holds the favoured word.
fn fake_tei(favour: &'static str) -> (support::Served, Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::{Json, routing::post};
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let served = support::serve("127.0.0.1", move |_| {
        axum::Router::new().route(
            "/rerank",
            post(move |Json(body): Json<Value>| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push(body.clone());
                    let mut scored: Vec<(usize, f64)> = body["texts"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .enumerate()
                        .map(|(i, t)| (i, t.as_str().unwrap().to_lowercase().matches(favour).count() as f64))
                        .collect();
                    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
                    Json(Value::Array(
                        scored
                            .into_iter()
                            .map(|(i, s)| json!({"index": i, "score": s}))
                            .collect(),
                    ))
                }
            }),
        )
    });
    (served, seen)
}

fn the_cross_encoder_reranker_speaks_text_embeddings_inference(data: Data) {
    let (served, seen) = fake_tei("vpn");
    let p = Project::on(data);
    p.index(&["docs"], "kb", &[]);
    let url = format!("http://{}/rerank", served.addr);
    let wf = retrieve_wf(
        "kb",
        &format!("    top_k: 1\n    rerank: {{url: \"{url}\", model: bge-reranker-base}}"),
    );
    let r = p.run(&wf, &["-i", "question=laptop security"]).ok();
    assert_eq!(r.ids(), ["remote-work-policy.md#4"], "{:#}", r.output);
    assert!(r.custom("rerank_failed").is_empty());
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0]["query"], "laptop security");
    assert_eq!(seen[0]["truncate"], true);
    assert_eq!(seen[0]["model"], "bge-reranker-base");
    assert_eq!(seen[0]["texts"], seen[0]["documents"]);
}

/// With `report_store.url` set, the approved report is also POSTed to a REST table (PostgREST /
/// Supabase: `apikey` and a bearer token, `Prefer: return=minimal`); a store that refuses it is
/// recorded and the run still ends with the report on disk. Off by default: no request at all.
fn deep_research_stores_the_approved_report_through_a_rest_api_when_configured(data: Data) {
    let go = |store: Option<&support::fake_web::Recorder>, thread: &str| {
        let p = Project::on(data);
        let step = |args: &[&str], answer: Option<&str>| {
            let mut cmd = match answer {
                None => p.run_shipped("deep-research.yaml", "deep-research-served.yaml"),
                Some(a) => {
                    let mut c = p.runner();
                    c.args(["resume", "--mock"])
                        .arg(Path::new(ROOT).join("tests/fixtures/mock/deep-research-served.yaml"))
                        .args(["--answer", a]);
                    c
                }
            };
            cmd.args(["--db", "runs.db", "--data-db", p.data_db(), "--thread", thread])
                .args(args)
                .env("REPORT_STORE_KEY", "service-key");
            if let Some(s) = store {
                // The config is the thread's from its start: `--set` goes with the first run only.
                if answer.is_none() {
                    cmd.args(["--set", &format!("report_store.url={}", s.url("/rest/v1/reports"))]);
                }
                cmd.args(["--allow-net", "127.0.0.1"]);
            }
            cmd.output().unwrap()
        };
        let first = step(
            &["--context", "user_id=dana", "-i", "query=How are heat pumps sized?"],
            None,
        );
        assert_eq!(
            first.status.code(),
            Some(3),
            "{}",
            String::from_utf8_lossy(&first.stderr)
        );
        let mut last = first;
        for _ in 0..3 {
            if last.status.code() != Some(3) {
                break;
            }
            last = step(&[], Some(r#"[{"type": "accept", "args": null}]"#));
        }
        assert_eq!(last.status.code(), Some(0), "{}", String::from_utf8_lossy(&last.stderr));
        let out: Value = serde_json::from_slice(&last.stdout).unwrap();
        assert!(p.path(out["report_path"].as_str().unwrap()).exists(), "{out}");
        out
    };

    let store = support::fake_web::recorder(201, json!(null));
    let out = go(Some(&store), "stored");
    assert_eq!(out["report_stored"], json!({"status": 201}));
    let requests = store.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let sent = &requests[0];
    assert_eq!(sent["method"], "POST");
    assert_eq!(sent["uri"], "/rest/v1/reports");
    assert_eq!(sent["headers"]["apikey"], "service-key");
    assert_eq!(sent["headers"]["authorization"], "Bearer service-key");
    assert_eq!(sent["headers"]["prefer"], "return=minimal");
    let body: Value = serde_json::from_str(sent["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["thread_id"], "stored");
    assert_eq!(body["user_id"], "dana");
    assert_eq!(body["report"], out["report"]);
    assert_eq!(body["report_path"], out["report_path"]);

    let refusing = support::fake_web::recorder(401, json!({"message": "JWT expired"}));
    let out = go(Some(&refusing), "refused");
    assert_eq!(out["report_stored"]["class"], "auth", "{out}");

    let out = go(None, "off");
    assert_eq!(out["report_stored"], Value::Null);
}

// ── one PostgreSQL database for everything ─────────────────────────────────────────────────

/// With `--db postgres://…` and no data database named, the data store lives in the same
/// database: `runner db migrate` makes its tables too, `runner index` (reading `RUNNER_DB`)
/// builds the index there, and runs on it store and retrieve there.
#[test]
fn a_postgres_checkpoint_database_holds_the_data_store_too() {
    let p = Project::on(Data::Postgres);
    let url = p.data_db().to_string();
    let shown = url::Url::parse(&url).unwrap();
    let at = format!(
        "postgres://{}:{}{}",
        shown.host_str().unwrap(),
        shown.port().unwrap(),
        shown.path()
    );
    let migrate = || {
        let out = p.runner().args(["db", "migrate", "--db", &url]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let first = migrate();
    assert!(
        first.contains(&format!("data store {at} (schema ")) && first.contains("migrated from schema version 0 to 1"),
        "{first}"
    );
    assert!(migrate().contains("nothing to do"));
    let out = p
        .runner()
        .args(["index", "docs", "--index", "kb"])
        .env("RUNNER_DB", &url)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains(&at), "the index names where it went: {said}");
    assert!(!p.path(".runner").exists(), "no data file was made");
    p.write("wf.yaml", &retrieve_wf("kb", "    top_k: 1"));
    p.write("memory.yaml", MEMORY_WF);
    let run = |file: &str, args: &[&str]| {
        let out = p
            .runner()
            .args(["run", file, "--db", &url])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let found = run("wf.yaml", &["-i", "question=Who reimburses a monitor?"]);
    assert!(!found["chunks"].as_array().unwrap().is_empty(), "{found:#}");
    run(
        "memory.yaml",
        &[
            "--context",
            "user_id=ana",
            "-i",
            "op=put",
            "-i",
            "key=k",
            "-i",
            "value=\"kept\"",
        ],
    );
    let stored = p
        .data_store()
        .with_blocking(|c| runner::rag::memory::get(c, &["memory".into(), "ana".into(), "prefs".into()], "k", false))
        .unwrap();
    assert_eq!(stored, json!("kept"));
    assert!(!p.path(".runner").exists(), "no data file was made");
}

// ── every case above that takes a `Data`, on both stores ─────────────────────────────────

on_both_stores!(
    runner_index_reports_what_it_did_and_skips_unchanged_files,
    hybrid_retrieval_finds_the_chunk_that_answers,
    several_queries_are_fused_and_html_is_searchable,
    documents_restrict_the_search_and_bring_their_intro_chunks,
    neighbours_widen_each_hit_in_document_order,
    a_missing_index_says_how_to_build_it,
    rerank_none_orders_by_vector_similarity,
    the_llm_reranker_orders_by_the_models_scores,
    a_failing_llm_reranker_falls_back_to_rrf_and_says_so,
    the_http_reranker_posts_the_candidates_and_follows_the_endpoint,
    acceptance_runner_index_on_docs_then_retrieve_answers_from_the_right_section,
    store_puts_gets_deletes_and_searches_per_user,
    store_nodes_search_by_meaning_with_a_store_index,
    a_store_index_served_by_a_model_embeds_values_and_queries_through_it,
    acceptance_rag_workflow_answers_from_the_indexed_documents,
    rag_sources_are_this_turns_and_only_what_its_answer_used,
    rag_workflow_mentions_restrict_retrieval_to_the_named_document,
    acceptance_deep_research_reads_memory_per_user_and_its_knowledge_base,
    deep_research_without_a_knowledge_base_goes_on_with_no_context,
    the_index_node_takes_paths_and_documents_and_skips_what_it_has,
    html_with_an_ampersand_before_a_multibyte_character_is_indexed_and_loaded,
    html_headings_become_chunk_heading_paths,
    runner_index_reads_pdf_and_each_chunk_keeps_its_page,
    retrieve_embeds_a_repeated_query_once,
    relevance_is_calibrated_for_the_embedder_and_separates_answered_from_unrelated,
    rag_workflow_leaves_the_knowledge_base_out_of_an_unrelated_question,
    each_planned_query_searches_its_own_documents,
    runner_index_model_serves_the_embeddings_profile_like_run,
    a_question_starting_with_a_mention_is_passed_with_a_double_at,
    the_cross_encoder_reranker_speaks_text_embeddings_inference,
    deep_research_stores_the_approved_report_through_a_rest_api_when_configured,
);
