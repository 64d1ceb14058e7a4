//! The shipped workflows run end to end on the scripted mock provider, through the real binary.
//!
//! Each case runs `runner run workflows/<file> --mock tests/fixtures/mock/<workflow>-<case>.yaml
//! --stream jsonl` and checks what the run did: the result on stdout, the route taken (the tasks
//! of every top-level step), the custom and token events on stderr and the exit code. Most mock
//! scripts answer later nodes only through `match` on the rendered prompt, so a prompt that
//! stops showing what earlier nodes produced fails the run instead of passing unnoticed.
//!
//! The research workflow's search and scrape path runs against fake web servers in
//! tests/web.rs. RAG retrieval turns and deep-research's memory and knowledge base need an index
//! built first: they run in tests/rag.rs, in a temporary directory. Here deep-research's two
//! subgraphs run, each on its own.

use std::process::Command;

use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// What one `runner run` did.
struct Run {
    code: i32,
    /// The result printed on stdout (null when nothing parsed).
    output: Value,
    /// Every JSON event of stderr, in order.
    events: Vec<Value>,
    stderr: String,
}

impl Run {
    /// Asserts the run finished (exit 0) and returns it.
    fn done(self) -> Run {
        assert_eq!(self.code, 0, "the run should finish; stderr:\n{}", self.stderr);
        assert_eq!(
            self.events.last().map(|e| e["status"].clone()),
            Some(json!("done")),
            "the last event is run_end with status done"
        );
        self
    }

    /// Every event with the depth of the run it belongs to: 1 for the top-level run, 2 for a
    /// subgraph run nested in it (between the subgraph's own run_start and run_end), and so on.
    fn with_depth(&self) -> Vec<(usize, &Value)> {
        let mut depth = 0;
        self.events
            .iter()
            .map(|e| {
                if e["type"] == "run_start" {
                    depth += 1;
                }
                let d = depth;
                if e["type"] == "run_end" {
                    depth -= 1;
                }
                (d, e)
            })
            .collect()
    }

    /// The tasks of every step of the runs at `depth`, in order: the route taken.
    fn route_at(&self, depth: usize) -> Vec<Vec<String>> {
        tasks_of(
            self.with_depth()
                .into_iter()
                .filter(|(d, _)| *d == depth)
                .map(|(_, e)| e),
        )
    }

    /// The route of the top-level run.
    fn route(&self) -> Vec<Vec<String>> {
        self.route_at(1)
    }

    /// The `data` of every custom event called `name`, in order.
    fn custom(&self, name: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["type"] == "custom" && e["event"] == name)
            .map(|e| &e["data"])
            .collect()
    }

    /// The text of every streamed token of `node`, in order.
    fn tokens(&self, node: &str) -> Vec<&str> {
        self.events
            .iter()
            .filter(|e| e["type"] == "token" && e["node"] == node)
            .filter_map(|e| e["text"].as_str())
            .collect()
    }

    /// The error events (`type: error`) raised by `node`.
    fn errors_of(&self, node: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["type"] == "error" && e["node"] == node)
            .collect()
    }
}

fn tasks_of<'a>(events: impl IntoIterator<Item = &'a Value>) -> Vec<Vec<String>> {
    events
        .into_iter()
        .filter(|e| e["type"] == "step_start")
        .map(|e| {
            e["nodes"]
                .as_array()
                .expect("step_start names its tasks' nodes")
                .iter()
                .map(|t| t.as_str().expect("a node").to_string())
                .collect()
        })
        .collect()
}

fn route(steps: &[&[&str]]) -> Vec<Vec<String>> {
    steps
        .iter()
        .map(|s| s.iter().map(|t| t.to_string()).collect())
        .collect()
}

/// `runner run workflows/<workflow> --mock tests/fixtures/mock/<mock> --stream jsonl` plus
/// `args`, from the repository root, with an in-memory checkpoint database.
fn run(workflow: &str, mock: &str, args: &[&str]) -> Run {
    run_in(workflow, mock, ":memory:", args)
}

fn run_in(workflow: &str, mock: &str, db: &str, args: &[&str]) -> Run {
    run_env(workflow, mock, db, &[], args)
}

/// [`run_in`] with the environment variables `env` set.
fn run_env(workflow: &str, mock: &str, db: &str, env: &[(&str, &str)], args: &[&str]) -> Run {
    let out = runner()
        .envs(env.iter().copied())
        .args(["run", &format!("workflows/{workflow}")])
        .args(["--mock", &format!("tests/fixtures/mock/{mock}")])
        .args(["--db", db, "--stream", "jsonl"])
        .args(args)
        .output()
        .expect("the runner binary starts");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    Run {
        code: out.status.code().unwrap_or(-1),
        output: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        events: stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect(),
        stderr,
    }
}

fn runner() -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
    cmd.current_dir(ROOT);
    cmd
}

/// The `content` of every message, in order.
fn contents(messages: &Value) -> Vec<&str> {
    messages
        .as_array()
        .expect("messages is a list")
        .iter()
        .map(|m| m["content"].as_str().expect("a message has text content"))
        .collect()
}

// ── mindmap ─────────────────────────────────────────────────────────────────────────────────

const DOCUMENT: &str = "document_content=Heat pumps move heat from outside to inside.";

#[test]
fn mindmap_expands_two_levels_and_streams_every_node() {
    let r = run(
        "mindmap.yaml",
        "mindmap.yaml",
        &[
            "--input",
            "document_title=Heat pumps",
            "--input",
            DOCUMENT,
            "--input",
            "max_depth=2",
        ],
    )
    .done();

    // One expansion task per parent of the level, in parallel, then the level advances.
    assert_eq!(
        r.route(),
        route(&[
            &["analyze_document"],
            &["generate_root"],
            &["announce_root"],
            &["expand_level#0"],
            &["advance_level"],
            &["expand_level#0", "expand_level#1"],
            &["advance_level"],
            &["done"],
        ])
    );

    let out = &r.output;
    assert_eq!(out["root_id"], "root");
    assert_eq!(out["error"], Value::Null);
    let nodes = out["nodes"].as_object().expect("nodes by id");
    assert_eq!(
        nodes.keys().map(String::as_str).collect::<Vec<_>>(),
        ["root", "root.1", "root.2", "root.1.1", "root.2.1"]
    );
    assert_eq!(
        nodes["root"],
        json!({"id": "root", "label": "Heat pumps", "description": "Moving heat instead of making it.",
               "parent_id": null, "level": 0})
    );
    assert_eq!(nodes["root.2.1"]["parent_id"], "root.2");
    assert_eq!(nodes["root.2.1"]["level"], 2);
    let edges: Vec<(&str, &str)> = out["edges"]
        .as_array()
        .expect("edges")
        .iter()
        .map(|e| (e["source"].as_str().unwrap(), e["target"].as_str().unwrap()))
        .collect();
    assert_eq!(
        edges,
        [
            ("root", "root.1"),
            ("root", "root.2"),
            ("root.1", "root.1.1"),
            ("root.2", "root.2.1")
        ]
    );

    // A node_added event for every node, each with the node's data: the root first, a child
    // after its parent (siblings are announced by their expansion's parallel tasks).
    let added = r.custom("node_added");
    let ids: Vec<&str> = added.iter().map(|d| d["node_id"].as_str().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["root", "root.1", "root.1.1", "root.2", "root.2.1"]);
    let at = |id: &str| ids.iter().position(|i| *i == id).unwrap();
    assert_eq!(at("root"), 0);
    assert!(
        at("root.1") < at("root.1.1") && at("root.2") < at("root.2.1"),
        "{ids:?}"
    );
    for d in &added {
        let id = d["node_id"].as_str().unwrap();
        // The canvas's OutputEvent: its type with it, as a client of the server's custom
        // events (the data alone) reads it.
        assert_eq!(d["type"], "node_added", "{d}");
        assert_eq!(d["node_data"], nodes[id], "node_added carries {id}'s data");
        assert_eq!(d["parent_id"], nodes[id]["parent_id"]);
        assert_eq!(d["level"], nodes[id]["level"]);
    }

    assert_eq!(
        r.custom("mindmap_complete"),
        [
            &json!({"type": "mindmap_complete", "root_id": "root", "node_count": 5, "edge_count": 4, "depth": 2,
                 "error": null})
        ]
    );
}

/// Each expansion announces its nodes as soon as it is done, whatever the other expansions of
/// its level are still doing. The model server holds back the expansion of `root.2` until the
/// run has streamed the children of `root.1`: a map that announced a level only once the whole
/// level was expanded would never stream them first (the server gives up waiting after 30 s,
/// and the test fails).
#[test]
fn mindmap_announces_each_expansion_as_it_finishes() {
    use std::io::BufRead;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::Json;
    use axum::routing::post;

    let go = Arc::new(tokio::sync::Notify::new());
    let waited_for_the_signal = Arc::new(AtomicBool::new(false));
    let (server_go, server_waited) = (go.clone(), waited_for_the_signal.clone());
    let server = crate::support::serve("127.0.0.1", move |_| {
        axum::Router::new().route(
            "/v1/chat/completions",
            post(move |Json(body): Json<Value>| {
                let (go, waited) = (server_go.clone(), server_waited.clone());
                async move {
                    let prompt = body["messages"]
                        .as_array()
                        .and_then(|m| m.last())
                        .and_then(|m| m["content"].as_str())
                        .unwrap_or_default()
                        .to_string();
                    let reply = if prompt.contains("## Task: analyze the document") {
                        json!({"main_topic": "Heat pumps", "summary": "How heat pumps move heat.", "document_type": "article",
                               "themes": [{"name": "Cycle", "description": "The cycle", "importance": 5}], "key_terms": []})
                    } else if prompt.contains("## Task: create the root node") {
                        json!({"label": "Heat pumps", "description": "Moving heat."})
                    } else if prompt.contains("(id `root`,") {
                        json!({"children": [{"label": "Cycle", "description": "The cycle."},
                                            {"label": "Efficiency", "description": "COP."}]})
                    } else if prompt.contains("(id `root.1`,") {
                        json!({"children": [{"label": "Compressor", "description": "Raises pressure."}]})
                    } else if prompt.contains("(id `root.2`,") {
                        let signalled = tokio::time::timeout(std::time::Duration::from_secs(30), go.notified()).await;
                        waited.store(signalled.is_ok(), Ordering::SeqCst);
                        json!({"children": [{"label": "COP", "description": "Heat out per work in."}]})
                    } else {
                        json!({"children": []})
                    };
                    Json(json!({
                        "id": "c1", "object": "chat.completion",
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": reply.to_string()}}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
                    }))
                }
            }),
        )
    });

    let mut child = runner()
        .args(["run", "workflows/mindmap.yaml", "--db", ":memory:", "--stream", "jsonl"])
        .arg("--model")
        .arg(format!("default=llamacpp:any@http://{}/v1", server.addr))
        .args([
            "--input",
            "document_title=Heat pumps",
            "--input",
            DOCUMENT,
            "--input",
            "max_depth=2",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the runner binary starts");
    let mut events = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let Ok(event) = serde_json::from_str::<Value>(&line.unwrap()) else {
            continue;
        };
        if event["type"] == "custom" && event["event"] == "node_added" && event["data"]["node_id"] == "root.1.1" {
            go.notify_one();
        }
        events.push(event);
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{events:#?}");

    let added: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "custom" && e["event"] == "node_added")
        .map(|e| e["data"]["node_id"].as_str().unwrap())
        .collect();
    assert!(
        waited_for_the_signal.load(Ordering::SeqCst),
        "root.1's children were not streamed while root.2 was still being expanded: {added:?}"
    );
    assert_eq!(added.len(), 5, "{added:?}");
    let at = |id: &str| added.iter().position(|i| *i == id).unwrap();
    assert!(at("root.1.1") < at("root.2.1"), "{added:?}");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["nodes"].as_object().map(|n| n.len()), Some(5));
}

#[test]
fn mindmap_keeps_going_when_one_expansion_fails() {
    let r = run(
        "mindmap.yaml",
        "mindmap-expand-error.yaml",
        &[
            "--input",
            "document_title=Heat pumps",
            "--input",
            DOCUMENT,
            "--input",
            "max_depth=2",
        ],
    )
    .done();

    // The failed expansion's on_error handler is the node the edge leads to anyway.
    assert_eq!(
        r.route()[5..],
        route(&[&["expand_level#0", "expand_level#1"], &["advance_level"], &["done"]])
    );
    let failures = r.errors_of("expand_level");
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["class"], "invalid");

    let error = r.output["error"].as_str().expect("the error is recorded");
    assert!(error.starts_with("expansion of root.2 failed: "), "{error}");
    let nodes: Vec<&str> = r.output["nodes"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(nodes, ["root", "root.1", "root.2", "root.1.1"]);
    assert_eq!(
        r.custom("mindmap_complete"),
        [
            &json!({"type": "mindmap_complete", "root_id": "root", "node_count": 4, "edge_count": 3, "depth": 2,
                 "error": error})
        ]
    );
}

#[test]
fn mindmap_reports_a_failed_analysis_and_stops() {
    let r = run(
        "mindmap.yaml",
        "mindmap-analysis-error.yaml",
        &["--input", "document_title=Heat pumps", "--input", DOCUMENT],
    )
    .done();
    assert_eq!(r.route(), route(&[&["analyze_document"], &["done"]]));
    assert_eq!(
        r.output,
        json!({"root_id": null, "nodes": {}, "edges": [],
               "error": "analysis failed: authentication failed: bad key"})
    );
    assert!(r.custom("node_added").is_empty());
    assert_eq!(r.custom("mindmap_complete")[0]["node_count"], 0);
    assert_eq!(r.custom("mindmap_complete")[0]["error"], r.output["error"]);
}

// ── rag ─────────────────────────────────────────────────────────────────────────────────────

const RAG_ANSWER: &str = "Hello! How can I help with your documents today?";

/// A chat turn: router -> generator (each stage announced by a status event), the answer
/// streamed as tokens and added to the messages.
fn assert_chat_turn(r: &Run, question: &str) {
    assert_eq!(
        r.route(),
        route(&[
            &["analyzing"],
            &["router"],
            &["generating"],
            &["generator"],
            &["cite_sources"]
        ]),
        "no retrieval for a chat turn"
    );
    assert_eq!(r.output["intent"], "chat");
    assert_eq!(r.output["answer"], RAG_ANSWER);
    assert_eq!(r.output["sources"], json!([]));
    let messages = &r.output["messages"];
    assert_eq!(contents(messages), [question, RAG_ANSWER]);
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[1]["role"], "assistant");
    let ids: Vec<&str> = messages
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "add_messages gives every message an id: {messages}");
    assert_ne!(ids[0], ids[1]);
    // `stream: true`: the chunks arrive as token events, before the node ends.
    assert_eq!(
        r.tokens("generator"),
        ["Hello! ", "How can I help ", "with your documents today?"]
    );
    let last_token = r.events.iter().rposition(|e| e["type"] == "token").unwrap();
    let generator_end = r
        .events
        .iter()
        .position(|e| e["type"] == "node_end" && e["node"] == "generator")
        .unwrap();
    assert!(last_token < generator_end, "tokens stream before the node ends");
}

#[test]
fn rag_chat_mode_answers_without_retrieval_and_streams_tokens() {
    // A question full of document words: the user's `chat` mode wins over the heuristics.
    let question = "What does section 4 of the contract say?";
    let r = run(
        "rag.yaml",
        "rag-chat.yaml",
        &["--input", &format!("question={question}"), "--input", "mode=chat"],
    )
    .done();
    assert_chat_turn(&r, question);
}

#[test]
fn rag_auto_mode_routes_small_talk_to_chat_by_keywords() {
    // Tier 2: "hello" and "thanks" are chat keywords, no word is a document keyword, so the
    // router decides without the vector probe or the LLM validator.
    for question in ["Hello!", "Thanks, bye."] {
        let r = run(
            "rag.yaml",
            "rag-chat.yaml",
            &["--input", &format!("question={question}")],
        )
        .done();
        assert_chat_turn(&r, question);
    }
}

#[test]
fn rag_second_turn_on_a_thread_sees_the_first() {
    // rag.yaml is "one conversation turn per run (threads keep the history)", as a LangGraph
    // thread is: invoking it again with new input runs the graph again on the kept state.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rag.db");
    let db = db.to_str().unwrap();
    let first = run_in(
        "rag.yaml",
        "rag-history.yaml",
        db,
        &["--thread", "chat", "--input", "question=Hello!"],
    )
    .done();
    assert_chat_turn(&first, "Hello!");
    let second = run_in(
        "rag.yaml",
        "rag-history.yaml",
        db,
        &["--thread", "chat", "--input", "question=Thanks, what did I just say?"],
    )
    .done();
    assert_eq!(second.output["answer"], "You greeted me a moment ago.");
    assert_eq!(
        contents(&second.output["messages"]),
        [
            "Hello!",
            RAG_ANSWER,
            "Thanks, what did I just say?",
            "You greeted me a moment ago."
        ]
    );
}

// ── research ────────────────────────────────────────────────────────────────────────────────

const QUERY: &str = "query=How do heat pumps work?";

#[test]
fn research_with_no_subtopics_goes_straight_to_synthesis() {
    let r = run("research.yaml", "research-no-subtopics.yaml", &["--input", QUERY]).done();
    assert_eq!(
        r.route(),
        route(&[&["plan"], &["synthesize"]]),
        "no search without subtopics"
    );
    assert_eq!(
        r.output["final_report"],
        "# What a heat pump is\n\n## Summary\nNo sources were consulted."
    );
    let meta = &r.output["report_metadata"];
    assert_eq!(meta["query"], "How do heat pumps work?");
    assert_eq!(meta["subtopics_planned"], 0);
    assert_eq!(meta["budget_exhausted"], false);
    assert_eq!(meta["sources"], json!([]));
    // Both calls are priced (0.15 / 0.60 per million tokens) and summed.
    let run_cost = r.events.last().unwrap()["turn_usage"]["cost"].as_f64().unwrap();
    let cost = meta["total_cost"].as_f64().unwrap();
    assert!(cost > 0.0 && (cost - run_cost).abs() < 1e-12, "{cost} vs {run_cost}");
    assert_eq!(r.output["subtopic_summaries"], json!([]));
    assert_eq!(r.output["errors"], json!([]));
}

#[test]
fn research_over_the_cost_cap_skips_to_a_partial_report() {
    let r = run("research.yaml", "research-over-budget.yaml", &["--input", QUERY]).done();
    assert_eq!(
        r.route(),
        route(&[&["plan"], &["synthesize"]]),
        "over budget: no search"
    );
    assert!(
        r.output["final_report"]
            .as_str()
            .unwrap()
            .starts_with("# Heat pumps (partial)")
    );
    let meta = &r.output["report_metadata"];
    assert_eq!(meta["budget_exhausted"], true);
    assert_eq!(meta["subtopics_planned"], 2);
    assert_eq!(meta["subtopics_done"], 0);
    assert!(meta["total_cost"].as_f64().unwrap() >= 1.5, "{meta}");
}

#[test]
fn research_cost_cap_follows_config_overrides() {
    // A plan with a subtopic at an ordinary cost: a cap lowered with --set sends it to the
    // partial report instead of the search.
    let r = run(
        "research.yaml",
        "research-low-cap.yaml",
        &["--input", QUERY, "--set", "costs.max_cost_per_run=0.00001"],
    )
    .done();
    assert_eq!(
        r.route(),
        route(&[&["plan"], &["synthesize"]]),
        "over the lowered cap: no search"
    );
    assert_eq!(
        r.output["final_report"],
        "# Heat pumps (partial)\n\nThe budget ran out."
    );
    assert_eq!(r.output["report_metadata"]["budget_exhausted"], true);
    assert_eq!(r.output["report_metadata"]["subtopics_planned"], 1);
}

#[test]
fn research_records_a_failed_plan_and_still_reports() {
    let r = run("research.yaml", "research-plan-error.yaml", &["--input", QUERY]).done();
    assert_eq!(r.route(), route(&[&["plan"], &["synthesize"]]));
    assert_eq!(r.errors_of("plan").len(), 1);
    assert_eq!(
        r.output["errors"],
        json!([{"node": "plan", "class": "auth", "message": "authentication failed: invalid api key",
                "attempts": 1, "at": r.output["errors"][0]["at"], "url": null, "tag": null}])
    );
    // Dated when it failed, as every error record is.
    let at = r.output["errors"][0]["at"].as_str().expect("a timestamp");
    assert!(at.len() == 24 && at.ends_with('Z') && at.as_bytes()[10] == b'T', "{at}");
    assert_eq!(r.output["report_metadata"]["errors"], 1);
    assert_eq!(r.output["final_report"], "# Heat pumps\n\nNo sources were consulted.");
}

/// `runner run workflows/research.yaml` on `site` (a fake SearxNG and web site), on the mock
/// script `script` (JSON).
fn research_on(site: &crate::support::fake_web::FakeWeb, script: &Value) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let mock = dir.path().join("mock.json");
    std::fs::write(&mock, script.to_string()).unwrap();
    let out = runner()
        .env("SEARXNG_URL", site.base())
        .env_remove("RUNNER_ALLOW_NET")
        .args([
            "run",
            "workflows/research.yaml",
            "--db",
            ":memory:",
            "--stream",
            "jsonl",
        ])
        .arg("--mock")
        .arg(&mock)
        .args(["--allow-net", "127.0.0.1", "--input", QUERY])
        .output()
        .expect("the runner binary starts");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    Run {
        code: out.status.code().unwrap_or(-1),
        output: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        events: stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect(),
        stderr,
    }
}

/// Three subtopics on `site`: the second one's search finds exactly the pages the first one
/// read (the fake engine answers every query without "SCOP" with the same hits), the third's
/// finds only a page robots.txt disallows. `synthesize` is the synthesis's scripted reply.
fn three_subtopics(site: &crate::support::fake_web::FakeWeb, synthesize: Value) -> Value {
    let heat = site.url("/articles/heat-pumps");
    let cop = site.url("/articles/cop");
    let summary = |text: &str, cites: &[&str]| {
        json!({"summary": text, "key_points": [text], "citations": cites, "confidence": "medium", "gaps": []})
            .to_string()
    };
    let plan = json!({"subtopics": [
        {"id": "st1", "title": "Mechanism", "description": "How the cycle moves heat.",
         "search_queries": ["how heat pumps work"], "status": "pending"},
        {"id": "st2", "title": "Efficiency", "description": "What COP means.",
         "search_queries": ["heat pump COP"], "status": "pending"},
        {"id": "st3", "title": "Nothing", "description": "A subtopic whose only page cannot be read.",
         "search_queries": ["private heat pump notes"], "status": "pending"}],
        "rationale": "Mechanism, then performance."});
    // Each summary is written only when its prompt holds the subtopic's two pages.
    let sources = |title: &str, what: &str| {
        format!("**{title}**\nWhat it must establish: {what}\n\n\nYou have 2 scraped source(s)")
    };
    json!({
        "replies": {"plan": plan.to_string(), "synthesize": synthesize},
        "match": [
            {"contains": sources("Mechanism", "How the cycle moves heat."),
             "reply": summary(&format!("A refrigerant moves heat [{heat}]."), &[&heat])},
            {"contains": sources("Efficiency", "What COP means."),
             "reply": summary(&format!("A COP of three to four [{cop}]."), &[&cop])},
        ]
    })
}

#[test]
fn research_gives_each_subtopic_the_pages_its_search_found_read_once() {
    let site = crate::support::fake_web::start("");
    let r = research_on(&site, &three_subtopics(&site, json!("# Heat pumps\n\nA report."))).done();
    let summaries = r.output["subtopic_summaries"].as_array().unwrap();
    assert_eq!(
        summaries.iter().map(|s| &s["subtopic_id"]).collect::<Vec<_>>(),
        ["st1", "st2"],
        "the second subtopic is summarized from the pages the first one read: {}",
        r.stderr
    );
    // Each page was fetched once, for the first subtopic.
    let hits = site.hits();
    for page in ["/articles/heat-pumps", "/articles/cop"] {
        assert_eq!(hits.iter().filter(|h| *h == page).count(), 1, "{page}: {hits:?}");
    }
    assert_eq!(r.output["report_metadata"]["pages_scraped"], 2);
    // The third subtopic's only page could not be read (robots.txt, found when the first
    // subtopic tried it; not tried again): not summarized, and failed rather than done.
    let errors = r.output["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["url"], site.url("/private/secret"));
    assert_eq!(r.output["report_metadata"]["subtopics_done"], 2);
    assert_eq!(r.output["report_metadata"]["subtopics_failed"], json!(["st3"]));
    assert_eq!(
        r.route(),
        route(&[
            &["plan"],
            &["search"],
            &["scrape"],
            &["summarize"],
            &["next_subtopic"],
            &["search"],
            &["scrape"],
            &["summarize"],
            &["next_subtopic"],
            &["search"],
            &["scrape"],
            &["skip_subtopic"],
            &["synthesize"],
        ])
    );
}

#[test]
fn research_whose_synthesis_fails_still_ends_with_a_report_of_the_summaries() {
    let site = crate::support::fake_web::start("");
    let script = three_subtopics(&site, json!({"error": "auth", "message": "invalid api key"}));
    let r = research_on(&site, &script).done();
    let report = r.output["final_report"].as_str().unwrap_or_default();
    let heat = site.url("/articles/heat-pumps");
    let cop = site.url("/articles/cop");
    assert_eq!(
        report,
        format!(
            "# How do heat pumps work? (partial report)\n\nThe final synthesis failed (authentication failed: invalid api key), so this report is the summary of each\nresearched subtopic as it was written, not a combined answer.\n\n## Mechanism\n\nA refrigerant moves heat [{heat}].\n\n## Efficiency\n\nA COP of three to four [{cop}].\n\n## Sources\n\n1. {heat}\n2. {cop}\n"
        ),
        "{}",
        r.stderr
    );
    let errors = r.output["errors"].as_array().unwrap();
    let failed = errors
        .iter()
        .find(|e| e["node"] == "synthesize")
        .expect("the failure is recorded");
    assert_eq!(failed["class"], "auth");
    assert_eq!(failed["message"], "authentication failed: invalid api key");
    let meta = &r.output["report_metadata"];
    assert_eq!(meta["partial"], true);
    assert_eq!(meta["sources"], json!([heat, cop]));
    assert_eq!(r.route().last().unwrap(), &["partial_report".to_string()]);
}

// ── slides ──────────────────────────────────────────────────────────────────────────────────

#[test]
fn slides_coordinator_answers_without_a_handoff() {
    let r = run(
        "slides.yaml",
        "slides-respond.yaml",
        &["--input", "request=Hi, what can you do?"],
    )
    .done();
    assert_eq!(
        r.route(),
        route(&[&["intake"], &["coordinator"]]),
        "conversation only: END after the coordinator"
    );
    assert_eq!(r.output["plan"], json!([]));
    assert_eq!(r.output["artifacts"], json!({}));
    assert_eq!(
        contents(&r.output["messages"]),
        [
            "Hi, what can you do?",
            "I make slide decks: tell me the topic and the audience."
        ]
    );
}

#[test]
fn slides_handoff_runs_every_storywriter_step_of_the_plan() {
    let r = run(
        "slides.yaml",
        "slides-storywriter.yaml",
        &["--input", "request=A short deck about heat pumps"],
    )
    .done();
    assert_eq!(
        r.route(),
        route(&[
            &["intake"],
            &["coordinator"],
            &["planner"],
            &["supervisor"],
            &["storywriter"],
            &["supervisor"],
            &["storywriter"],
            &["supervisor"],
            &["reply"],
        ])
    );
    let plan = r.output["plan"].as_array().unwrap();
    assert_eq!(plan.len(), 2);
    assert!(plan.iter().all(|s| s["status"] == "complete"), "{plan:?}");
    assert_eq!(plan[0]["result_summary"], "Wrote a 3-slide storyline.");
    assert_eq!(plan[1]["result_summary"], "Rewrote the titles as action titles.");
    let artifacts = r.output["artifacts"].as_object().unwrap();
    assert_eq!(artifacts.keys().collect::<Vec<_>>(), ["step_1_story", "step_2_story"]);
    assert_eq!(
        artifacts["step_2_story"]["slides"][0]["title"],
        "Heat pumps halve heating bills"
    );
    assert_eq!(
        contents(&r.output["messages"]),
        [
            "A short deck about heat pumps",
            "Starting on your deck.",
            "Plan: Storyline → Action titles",
            "[storywriter] Wrote a 3-slide storyline.",
            "[storywriter] Rewrote the titles as action titles.",
            "Done: all 2 step(s) of the plan are complete.",
        ]
    );
}

#[test]
fn slides_plan_runs_analyst_writer_and_visualizer_with_a_template() {
    let r = run(
        "slides.yaml",
        "slides-workers.yaml",
        &[
            "--input",
            "request=Two slides on heat pump sales: 2022 100, 2023 150, 2024 200 units",
            "--input",
            r##"design_context={"theme_name": "Corporate", "colors": {"accent": "#112233"}}"##,
            "--set",
            "images.enabled=false",
        ],
    )
    .done();
    // Images disabled: the visualizer goes back to the supervisor without rendering.
    assert_eq!(
        r.route(),
        route(&[
            &["intake"],
            &["coordinator"],
            &["planner"],
            &["supervisor"],
            &["data_analyst"],
            &["supervisor"],
            &["storywriter"],
            &["supervisor"],
            &["visualizer"],
            &["supervisor"],
            &["reply"],
        ])
    );
    let plan = r.output["plan"].as_array().unwrap();
    let roles: Vec<_> = plan
        .iter()
        .map(|s| (s["role"].as_str().unwrap(), s["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        roles,
        [
            ("data_analyst", "complete"),
            ("storywriter", "complete"),
            ("visualizer", "complete")
        ]
    );
    let artifacts = r.output["artifacts"].as_object().unwrap();
    assert_eq!(
        artifacts.keys().collect::<Vec<_>>(),
        ["step_1_data", "step_2_story", "step_3_visual"]
    );
    assert_eq!(artifacts["step_1_data"]["charts"][0]["id"], "chart1");
    assert_eq!(artifacts["step_3_visual"]["images"][0]["control_image"], "Title Slide");
}

#[test]
fn slides_researcher_step_runs_the_research_subgraph() {
    let r = run(
        "slides.yaml",
        "slides-researcher.yaml",
        &["--input", "request=A deck on heat pump adoption in Europe"],
    )
    .done();
    assert_eq!(
        r.route(),
        route(&[
            &["intake"],
            &["coordinator"],
            &["planner"],
            &["supervisor"],
            &["researcher"],
            &["supervisor"],
            &["storywriter"],
            &["supervisor"],
            &["reply"],
        ])
    );
    // Inside the subgraph: nothing to search, so the manager hands over to the aggregation.
    assert_eq!(r.route_at(2), route(&[&["manager"], &["aggregate"]]));
    // Its events carry the namespace of the task that runs it; the parent's carry none.
    for (depth, e) in r.with_depth() {
        let ns = e.get("ns").and_then(Value::as_str);
        match depth {
            1 => assert_eq!(ns, None, "{e}"),
            _ => assert!(ns.is_some_and(|ns| ns.starts_with("researcher:")), "{e}"),
        }
    }
    assert_eq!(
        r.output["artifacts"]["step_1_research"],
        json!({"summary": "Nothing could be researched.", "themes": [], "headline_messages": [],
               "sources": [], "gaps": ["adoption figures"]})
    );
    let plan = r.output["plan"].as_array().unwrap();
    assert_eq!(plan[0]["result_summary"], "Nothing could be researched.");
    assert_eq!(plan[1]["result_summary"], "A storyline that flags the missing figures.");
    assert_eq!(
        contents(&r.output["messages"])[3..],
        [
            "[researcher] Nothing could be researched.",
            "[storywriter] A storyline that flags the missing figures.",
            "Done: all 2 step(s) of the plan are complete."
        ]
    );
}

#[test]
fn slides_step_that_fails_on_a_later_turn_is_failed_and_the_reply_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("slides.db");
    let db = db.to_str().unwrap();
    let first = run_in(
        "slides.yaml",
        "slides-second-turn.yaml",
        db,
        &["--thread", "deck", "--input", "request=A short deck about heat pumps"],
    )
    .done();
    assert_eq!(first.output["plan"][0]["status"], "complete");
    let second = run_in(
        "slides.yaml",
        "slides-second-turn.yaml",
        db,
        &["--thread", "deck", "--input", "request=Make it shorter"],
    )
    .done();
    assert_eq!(second.errors_of("storywriter").len(), 1, "{}", second.stderr);
    // Step 1's artifact from the first turn is still there, but this turn's step 1 failed.
    assert!(second.output["artifacts"]["step_1_story"].is_object());
    assert_eq!(
        second.output["plan"],
        json!([{"id": 1, "role": "storywriter", "instruction": "Cut every slide to two bullets.",
                "description": "Shorter", "status": "failed",
                "result_summary": "storywriter failed: authentication failed: invalid api key"}])
    );
    // The turn's reply ends by telling the user what failed, not at the plan.
    let messages = contents(&second.output["messages"]);
    assert_eq!(
        messages[messages.len() - 2..],
        [
            "Plan: Shorter",
            "0 of 1 step(s) complete; 1 failed:\n- Step 1 (storywriter: Shorter) failed: storywriter failed: authentication failed: invalid api key"
        ]
    );
}

#[test]
fn slides_image_renders_that_all_fail_fail_their_step_and_the_reply_says_so() {
    let api = crate::support::fake_web::recorder(401, json!({"error": {"message": "Incorrect API key"}}));
    let endpoint = format!("images.endpoint={}", api.url("/v1/images/generations"));
    let r = run_env(
        "slides.yaml",
        "slides-renders-fail.yaml",
        ":memory:",
        &[("OPENAI_API_KEY", "sk-test-image-key")],
        &[
            "--input",
            "request=Three slides on heat pumps",
            "--set",
            &endpoint,
            "--allow-net",
            "127.0.0.1",
        ],
    )
    .done();
    assert_eq!(api.requests.lock().unwrap().len(), 3, "{}", r.stderr);
    let step = &r.output["plan"][0];
    assert_eq!(step["status"], "failed", "{step}");
    let summary = step["result_summary"].as_str().unwrap();
    assert!(
        summary.starts_with("Three slides, one image each.; 3 of 3 image renders failed: "),
        "{summary}"
    );
    let reply = *contents(&r.output["messages"]).last().unwrap();
    assert!(
        reply.starts_with("0 of 1 step(s) complete; 1 failed:\n- Step 1 (visualizer: Design) failed: Three slides")
            && reply.contains("3 of 3 image renders failed"),
        "{reply}"
    );
}

// ── deep-research (its subgraphs; the main graph starts with store and retrieve nodes) ─────

#[test]
fn deep_research_report_subgraph_writes_sections_in_parallel() {
    let input = "tests/fixtures/input/deep-research-report.json";
    // Without the optional inputs, and with them (as the main graph passes them).
    let with_optional = [
        "--input",
        r#"feedback=["Keep it practical"]"#,
        "--input",
        r#"preferences={"tone": "plain"}"#,
    ];
    for extra in [&[][..], &with_optional[..]] {
        let args: Vec<&str> = ["--input-file", input].iter().chain(extra).copied().collect();
        let r = run("deep-research/report.yaml", "deep-research-report.yaml", &args).done();
        assert_eq!(
            r.route(),
            route(&[
                &["report_supervisor"],
                &["writer#0", "writer#1"],
                &["section_reviewer"],
                &["report_assembler"],
            ]),
            "one writer per section, in one step"
        );
        assert_eq!(
            r.output["report"],
            "# Heat pumps in the cold\n\n## Executive summary\nA COP near 2 at -15C."
        );
        // Five calls of 1000 + 100 tokens at 0.15 / 0.60 per million: 5 × 0.00021.
        let cost = r.output["total_cost"].as_f64().unwrap();
        assert!((cost - 0.00105).abs() < 1e-12, "{cost}");
    }
}

#[test]
fn deep_research_report_subgraph_keeps_every_draft_in_state() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("report.db");
    let db = db.to_str().unwrap();
    run_in(
        "deep-research/report.yaml",
        "deep-research-report.yaml",
        db,
        &[
            "--thread",
            "r1",
            "--input-file",
            "tests/fixtures/input/deep-research-report.json",
        ],
    )
    .done();
    let out = runner().args(["state", "--thread", "r1", "--db", db]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["report_title"], "Heat pumps in the cold");
    let mut drafts: Vec<(&str, &str)> = state["drafts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["section_id"].as_str().unwrap(), d["title"].as_str().unwrap()))
        .collect();
    drafts.sort();
    assert_eq!(drafts, [("s1", "Performance"), ("s2", "Costs")]);
    assert_eq!(state["review"]["section_reviews"][0]["verdict"], "revise");
}

#[test]
fn deep_research_research_subgraph_without_tasks_synthesises_at_once() {
    // Only `query` and `plan` (the optional inputs left out): the prompts must not need them.
    let r = run(
        "deep-research/research.yaml",
        "deep-research-research.yaml",
        &["--input-file", "tests/fixtures/input/deep-research-research.json"],
    )
    .done();
    assert_eq!(
        r.route(),
        route(&[&["research_supervisor"], &["discovery_synthesiser"]])
    );
    assert_eq!(r.output["findings"][0]["id"], "f1");
    assert_eq!(
        r.output["discovery"],
        "Modern cold-climate units keep a COP near 2 at -15C."
    );
    assert_eq!(r.output["sources"], json!(["https://example.org/cop"]));
    assert!(r.output["total_cost"].as_f64().unwrap() > 0.0);
}

/// What a small local model needs of the seeds that died on one (slides, deep research): every
/// llm node caps its reply (`max_tokens`), and every structured output schema bounds its
/// strings and lists, so a reply constrained by the schema cannot ramble into truncated JSON.
#[test]
fn the_agent_seeds_bound_what_their_models_write() {
    let root = std::path::Path::new(ROOT);
    for file in [
        "workflows/slides.yaml",
        "workflows/slides/researcher.yaml",
        "workflows/deep-research.yaml",
        "workflows/deep-research/report.yaml",
        "workflows/deep-research/research.yaml",
    ] {
        let doc = runner::spec::load::parse(runner::spec::load::read(&root.join(file)).unwrap()).unwrap();
        for (name, node) in doc.value["nodes"].as_object().unwrap() {
            if node["kind"] == "llm" {
                assert!(
                    node.get("max_tokens").is_some(),
                    "{file}: llm node `{name}` has no max_tokens"
                );
            }
        }
    }
    fn unbounded(schema: &Value, at: &str, out: &mut Vec<String>) {
        match schema {
            Value::Object(m) => {
                let types: Vec<&str> = match &m.get("type") {
                    Some(Value::String(t)) => vec![t.as_str()],
                    Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
                    _ => vec![],
                };
                let fixed = m.contains_key("enum") || m.contains_key("const");
                if types.contains(&"string") && !fixed && !m.contains_key("maxLength") {
                    out.push(format!("{at}: a string without maxLength"));
                }
                if types.contains(&"array") && !m.contains_key("maxItems") {
                    out.push(format!("{at}: a list without maxItems"));
                }
                for (k, v) in m {
                    unbounded(v, &format!("{at}/{k}"), out);
                }
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .for_each(|(i, v)| unbounded(v, &format!("{at}/{i}"), out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for dir in ["schemas/slides", "schemas/deep-research", "schemas/rag"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let schema: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            unbounded(&schema, &path.display().to_string(), &mut found);
        }
    }
    assert!(found.is_empty(), "unbounded output fields:\n{}", found.join("\n"));
}
