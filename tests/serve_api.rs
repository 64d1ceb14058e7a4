//! `runner serve`'s store endpoints, the stream modes beyond the common ones (legacy
//! `messages`, `checkpoints`, `debug`), `/runs/batch`, `/metrics` and reloading on SIGHUP,
//! through the real binary on 127.0.0.1 (the server of `serve.rs`); and LangGraph's JS client
//! (`@langchain/langgraph-sdk`, pinned in `tests/sdk/js/package-lock.json`, installed with
//! `npm ci` by this file's set-up) and its Python client driving the store.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use super::serve::{call, client, parse, sdk_python, serve};
use super::support::install;

/// Two servers on one PostgreSQL data store (each with its own checkpoints): what a client
/// puts through one, the other serves, to clients and to its runs; a key PostgreSQL cannot
/// store is refused as bad input, not a server error.
#[tokio::test(flavor = "multi_thread")]
async fn servers_on_one_postgres_data_store_share_it() {
    let url = super::support::postgres::fresh_url();
    let a = super::serve::serve_with(&["--data-db", &url], &[]);
    let b = super::serve::serve_with(&["--data-db", &url], &[]);
    let (status, _, _) = call(
        &a,
        Method::PUT,
        "/store/items",
        Some(json!({"namespace": ["users", "ann"], "key": "prefs", "value": {"theme": "dark", "text": "tides"}})),
    )
    .await;
    assert_eq!(status, 204);
    let (_, _, item) = call(&b, Method::GET, "/store/items?namespace=users.ann&key=prefs", None).await;
    assert_eq!(item["value"], json!({"theme": "dark", "text": "tides"}), "{item}");
    let (_, _, found) = call(
        &b,
        Method::POST,
        "/store/items/search",
        Some(json!({"namespace_prefix": ["users"], "query": "tides"})),
    )
    .await;
    assert_eq!(found["items"][0]["key"], "prefs", "{found}");
    assert!(found["items"][0]["score"].as_f64().unwrap() > 0.0, "{found}");
    // B's run reads what was put through A and leaves a note A serves.
    let (status, _, values) = call(
        &b,
        Method::POST,
        "/runs/wait",
        Some(json!({"assistant_id": "memo", "input": {"user": "ann"}})),
    )
    .await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["prefs"], json!({"theme": "dark", "text": "tides"}), "{values}");
    let (_, _, note) = call(
        &a,
        Method::GET,
        "/store/items?namespace=users.ann.notes&key=visit",
        None,
    )
    .await;
    assert_eq!(note["value"]["seen"], json!(true), "{note}");
    let (status, _, body) = call(
        &a,
        Method::PUT,
        "/store/items",
        Some(json!({"namespace": ["users"], "key": "a\u{0}b", "value": {}})),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("NUL"), "{body}");
}

/// A value put over HTTP is what a `store` node reads in a run, and what a `store` node
/// writes is read back over HTTP: one data store, in the reference's shapes.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_endpoints_share_the_data_store_with_store_nodes() {
    let s = serve();
    let (status, _, body) = call(
        &s,
        Method::PUT,
        "/store/items",
        Some(json!({"namespace": ["users", "ann"], "key": "prefs", "value": {"theme": "dark"}})),
    )
    .await;
    assert_eq!((status, body), (204, Value::Null));
    let (status, _, item) = call(&s, Method::GET, "/store/items?namespace=users.ann&key=prefs", None).await;
    assert_eq!(status, 200);
    assert_eq!(item["namespace"], json!(["users", "ann"]), "{item}");
    assert_eq!(
        (&item["key"], &item["value"]),
        (&json!("prefs"), &json!({"theme": "dark"}))
    );
    assert!(
        item["created_at"].is_string() && item["updated_at"].is_string(),
        "{item}"
    );

    // The run reads it, and leaves a note.
    let (status, _, values) = call(
        &s,
        Method::POST,
        "/runs/wait",
        Some(json!({"assistant_id": "memo", "input": {"user": "ann"}})),
    )
    .await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["prefs"], json!({"theme": "dark"}), "{values}");
    let (_, _, note) = call(
        &s,
        Method::GET,
        "/store/items?namespace=users.ann.notes&key=visit",
        None,
    )
    .await;
    assert_eq!(note["value"], json!({"seen": true, "theme": "dark"}), "{note}");

    // Search: under a prefix, by keyword, by an exact filter on the value, paged.
    let search = |body: Value| {
        let s = &s;
        async move { call(s, Method::POST, "/store/items/search", Some(body)).await.2 }
    };
    let all = search(json!({"namespace_prefix": ["users"]})).await;
    let mut keys: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["prefs", "visit"], "{all}");
    let filtered = search(json!({"namespace_prefix": ["users"], "filter": {"seen": true}})).await;
    assert_eq!(filtered["items"].as_array().unwrap().len(), 1, "{filtered}");
    assert_eq!(filtered["items"][0]["namespace"], json!(["users", "ann", "notes"]));
    let found = search(json!({"namespace_prefix": ["users"], "query": "dark"})).await;
    assert!(found["items"][0]["score"].is_number(), "{found}");
    let paged = search(json!({"namespace_prefix": ["users"], "limit": 1, "offset": 1})).await;
    assert_eq!(paged["items"].as_array().unwrap().len(), 1, "{paged}");
    assert_eq!(
        search(json!({"namespace_prefix": ["nobody"]})).await,
        json!({"items": []})
    );

    // Namespaces: every one, cut to a depth, or those ending with a suffix.
    let namespaces = |body: Value| {
        let s = &s;
        async move { call(s, Method::POST, "/store/namespaces", Some(body)).await.2 }
    };
    assert_eq!(
        namespaces(json!({})).await,
        json!({"namespaces": [["users", "ann"], ["users", "ann", "notes"]]})
    );
    assert_eq!(
        namespaces(json!({"max_depth": 2})).await,
        json!({"namespaces": [["users", "ann"]]})
    );
    assert_eq!(
        namespaces(json!({"prefix": ["users"], "suffix": ["notes"]})).await,
        json!({"namespaces": [["users", "ann", "notes"]]})
    );

    // Delete; a missing item is null, as the reference answers; bad labels are 422.
    let (status, _, _) = call(
        &s,
        Method::DELETE,
        "/store/items",
        Some(json!({"namespace": ["users", "ann"], "key": "prefs"})),
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, gone) = call(&s, Method::GET, "/store/items?namespace=users.ann&key=prefs", None).await;
    assert_eq!((status, gone), (200, Value::Null));
    let (status, _, error) = call(
        &s,
        Method::PUT,
        "/store/items",
        Some(json!({"namespace": ["a.b"], "key": "k", "value": {}})),
    )
    .await;
    assert_eq!(status, 422, "{error}");
    assert!(error["detail"].as_str().unwrap().contains("periods"), "{error}");
    let (status, _, _) = call(
        &s,
        Method::PUT,
        "/store/items",
        Some(json!({"namespace": ["a"], "key": "k", "value": "not an object"})),
    )
    .await;
    assert_eq!(status, 422);
}

/// What the store could not give back is refused, with the statuses and messages of the
/// reference server (LangGraph's `langgraph dev`, langgraph-api 0.16.7, asked the same): a
/// label with a NUL byte (400), an empty namespace (400), an empty label or one with a period
/// (422). An empty key, which the reference stores and then refuses to GET ("Key is
/// required", 400) while its searches list it, is refused when put (422). Nothing refused is
/// stored; keys with a NUL or a period are read back.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_refuses_what_it_could_not_read_back() {
    let s = serve();
    let put = |namespace: Value, key: &str| {
        let body = json!({"namespace": namespace, "key": key, "value": {"v": 1}});
        let s = &s;
        async move { call(s, Method::PUT, "/store/items", Some(body)).await }
    };
    let (status, _, error) = put(json!(["a"]), "").await;
    assert_eq!(status, 422, "{error}");
    let (status, _, error) = call(&s, Method::GET, "/store/items?namespace=a&key=", None).await;
    assert_eq!((status, error), (400, json!({"error": "Key is required"})));

    let nul =
        "Invalid namespace label 'a\u{0}b' found in ('a\\x00b',). Namespace labels cannot contain NUL bytes ('\\x00').";
    let (status, _, error) = put(json!(["a\u{0}b"]), "k").await;
    assert_eq!((status, &error), (400, &json!({"detail": nul})));
    let (status, _, error) = put(json!(["x", "a\u{0}b"]), "k").await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["detail"].as_str().unwrap().contains("found in ('x', 'a\\x00b')"),
        "{error}"
    );
    for (method, path, body) in [
        (Method::GET, "/store/items?namespace=a%00b&key=k", None),
        (
            Method::DELETE,
            "/store/items",
            Some(json!({"namespace": ["a\u{0}b"], "key": "k"})),
        ),
        (
            Method::POST,
            "/store/items/search",
            Some(json!({"namespace_prefix": ["a\u{0}b"]})),
        ),
        (Method::POST, "/store/namespaces", Some(json!({"prefix": ["a\u{0}b"]}))),
        (Method::POST, "/store/namespaces", Some(json!({"suffix": ["a\u{0}b"]}))),
    ] {
        let (status, _, error) = call(&s, method.clone(), path, body).await;
        assert_eq!((status, &error), (400, &json!({"detail": nul})), "{method} {path}");
    }

    let (status, _, error) = put(json!([]), "k").await;
    assert_eq!((status, error), (400, json!({"detail": "Namespace cannot be empty."})));
    for (label, namespace) in [("", json!(["a", ""])), ("a.b", json!(["a.b"]))] {
        let (status, _, error) = put(namespace, "k").await;
        let detail = format!("Namespace label '{label}' must be a non-empty string without periods");
        assert_eq!((status, error), (422, json!({"detail": detail})));
    }
    let (_, _, found) = call(&s, Method::POST, "/store/items/search", Some(json!({}))).await;
    assert_eq!(found, json!({"items": []}));
    let (_, _, listed) = call(&s, Method::POST, "/store/namespaces", Some(json!({}))).await;
    assert_eq!(listed, json!({"namespaces": []}));

    for (key, query) in [("k\u{0}z", "k%00z"), ("k.z", "k.z")] {
        assert_eq!(put(json!(["a"]), key).await.0, 204);
        let (status, _, item) = call(&s, Method::GET, &format!("/store/items?namespace=a&key={query}"), None).await;
        assert_eq!((status, &item["key"]), (200, &json!(key)), "{item}");
    }
}

/// The legacy `messages` mode sends each streamed message's metadata once, then the message
/// so far at each token (the whole once more for the stream's last, empty piece, as the
/// reference does); `checkpoints` every checkpoint of the run linked to its parent; `debug` the
/// checkpoints and tasks wrapped with their step and type.
#[tokio::test(flavor = "multi_thread")]
async fn the_legacy_messages_checkpoints_and_debug_modes_stream_the_references_shapes() {
    let s = serve();
    let resp = client()
        .post(format!("{}/threads/m1/runs/stream", s.base))
        .json(
            &json!({"assistant_id": "shout", "input": {"word": "hello"}, "if_not_exists": "create",
                      "stream_mode": ["messages", "checkpoints", "debug"]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = parse(&resp.text().await.unwrap());
    let named = |name: &str| -> Vec<&Value> { events.iter().filter(|(e, _)| e == name).map(|(_, d)| d).collect() };

    let meta = named("messages/metadata");
    assert_eq!(meta.len(), 1, "{events:?}");
    let (id, m) = meta[0].as_object().unwrap().iter().next().unwrap();
    assert_eq!(m["metadata"]["langgraph_node"], "say", "{m}");
    let partial: Vec<(&str, &str)> = named("messages/partial")
        .iter()
        .map(|d| (d[0]["content"].as_str().unwrap(), d[0]["id"].as_str().unwrap()))
        .collect();
    assert_eq!(
        partial,
        [
            ("hello", id.as_str()),
            ("hello there", id.as_str()),
            ("hello there", id.as_str())
        ]
    );
    assert_eq!(named("messages/partial")[0][0]["type"], "ai");
    assert!(named("messages").is_empty(), "messages-tuple was not asked for");

    // The turn's input checkpoint, its start (the input applied) and one per step, each the
    // parent of the next.
    let checkpoints = named("checkpoints");
    assert_eq!(checkpoints.len(), 4, "{checkpoints:?}");
    assert_eq!(checkpoints[0]["parent_config"], Value::Null);
    for pair in checkpoints.windows(2) {
        assert_eq!(
            pair[1]["parent_config"]["configurable"]["checkpoint_id"],
            pair[0]["config"]["configurable"]["checkpoint_id"]
        );
    }
    let sources: Vec<(&Value, &Value)> = checkpoints
        .iter()
        .map(|c| (&c["metadata"]["source"], &c["metadata"]["step"]))
        .collect();
    assert_eq!(
        sources,
        [
            (&json!("input"), &json!(-1)),
            (&json!("loop"), &json!(0)),
            (&json!("loop"), &json!(1)),
            (&json!("loop"), &json!(2))
        ]
    );
    assert_eq!(checkpoints[0]["next"], json!(["__start__"]));
    assert_eq!(checkpoints[1]["next"], json!(["say"]));
    assert_eq!(checkpoints[2]["values"]["said"], "hello there");
    assert_eq!(checkpoints[3]["next"], json!([]));
    assert_eq!(checkpoints[3]["config"]["configurable"]["thread_id"], "m1");
    let state: Value = client()
        .get(format!("{}/threads/m1/state", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        checkpoints[3]["config"]["configurable"]["checkpoint_id"],
        state["checkpoint"]["checkpoint_id"]
    );

    let debug: Vec<(&str, &str)> = named("debug")
        .iter()
        .map(|d| (d["type"].as_str().unwrap(), d["payload"]["name"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        debug,
        [
            ("checkpoint", ""),
            ("checkpoint", ""),
            ("task", "say"),
            ("task_result", "say"),
            ("checkpoint", ""),
            ("task", "tell"),
            ("task_result", "tell"),
            ("checkpoint", "")
        ]
    );
    assert!(
        named("debug")
            .iter()
            .all(|d| d["step"].is_i64() && d["timestamp"].is_string())
    );
}

/// `/runs/batch` starts every run in the background at once, each on a thread of its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_starts_every_run_in_the_background() {
    let s = serve();
    let (status, _, runs) = call(
        &s,
        Method::POST,
        "/runs/batch",
        Some(json!([
            {"assistant_id": "memo", "input": {"user": "bo"}},
            {"assistant_id": "memo", "input": {"user": "cy"}},
        ])),
    )
    .await;
    assert_eq!(status, 200, "{runs}");
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_ne!(runs[0]["run_id"], runs[1]["run_id"]);
    assert_ne!(runs[0]["thread_id"], runs[1]["thread_id"]);
    // Both ran: each left its note.
    let deadline = Instant::now() + Duration::from_secs(20);
    for user in ["bo", "cy"] {
        loop {
            let path = format!("/store/items?namespace=users.{user}.notes&key=visit");
            let (_, _, note) = call(&s, Method::GET, &path, None).await;
            if note["value"]["seen"] == true {
                break;
            }
            assert!(Instant::now() < deadline, "the batch's run for {user} left no note");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // A request that is not a run starts none.
    let (status, _, _) = call(
        &s,
        Method::POST,
        "/runs/batch",
        Some(json!([{"assistant_id": "memo", "input": {"user": "di"}}, {"input": {}}])),
    )
    .await;
    assert_eq!(status, 422);
    let (_, _, none) = call(&s, Method::GET, "/store/items?namespace=users.di.notes&key=visit", None).await;
    assert_eq!(none, Value::Null);
}

/// The value of the sample `name` (with its labels) in a Prometheus text page.
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in:\n{page}"))
        .parse()
        .unwrap()
}

async fn metrics(s: &super::serve::Server) -> String {
    let resp = client().get(format!("{}/metrics", s.base)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    resp.text().await.unwrap()
}

/// `/metrics` counts runs by status, the streams open now, and every step and model call.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_runs_streams_steps_and_model_calls() {
    let s = serve();
    let page = metrics(&s).await;
    assert_eq!(sample(&page, "runner_runs_total{status=\"success\"}"), 0.0);
    assert_eq!(sample(&page, "runner_active_streams"), 0.0);
    assert!(page.contains("# TYPE runner_step_duration_seconds histogram"), "{page}");

    for word in ["hello", "boom"] {
        let (status, _, _) = call(
            &s,
            Method::POST,
            "/runs/wait",
            Some(json!({"assistant_id": "shout", "input": {"word": word}})),
        )
        .await;
        assert_eq!(status, 200);
    }
    // A stream held open: the slow workflow's first model call takes a second.
    let open = client()
        .post(format!("{}/runs/stream", s.base))
        .json(&json!({"assistant_id": "slow"}))
        .send()
        .await
        .unwrap();
    let page = metrics(&s).await;
    assert_eq!(sample(&page, "runner_active_streams"), 1.0, "{page}");
    assert_eq!(sample(&page, "runner_runs{status=\"running\"}"), 1.0, "{page}");
    assert_eq!(sample(&page, "runner_runs_total{status=\"success\"}"), 1.0, "{page}");
    assert_eq!(sample(&page, "runner_runs_total{status=\"error\"}"), 1.0, "{page}");
    // shout's `hello` run: two steps; a model call each for `hello` and `boom` (a call that
    // failed took its time too).
    assert!(sample(&page, "runner_step_duration_seconds_count") >= 2.0, "{page}");
    assert_eq!(sample(&page, "runner_llm_duration_seconds_count"), 2.0, "{page}");
    let inf = sample(&page, "runner_step_duration_seconds_bucket{le=\"+Inf\"}");
    assert_eq!(inf, sample(&page, "runner_step_duration_seconds_count"));
    let body = open.text().await.unwrap();
    assert!(body.contains("event: values"), "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = metrics(&s).await;
        if sample(&page, "runner_active_streams") == 0.0
            && sample(&page, "runner_runs_total{status=\"success\"}") == 2.0
        {
            assert_eq!(sample(&page, "runner_llm_duration_seconds_count"), 4.0, "{page}");
            break;
        }
        assert!(Instant::now() < deadline, "the stream stayed counted:\n{page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `runner_active_streams` counts every event stream being sent, whether its client reads it
/// or not, from its start until its body is dropped: streams of runs, and readers that joined
/// one.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_every_open_stream_read_or_not() {
    let s = serve();
    let mut open = Vec::new();
    for i in 0..8 {
        let started = client()
            .post(format!("{}/threads/m{i}/runs/stream", s.base))
            .json(&json!({"assistant_id": "slow", "if_not_exists": "create"}))
            .send()
            .await
            .unwrap();
        assert_eq!(started.status(), 200);
        let joined = client()
            .get(format!(
                "{}{}/stream",
                s.base,
                started.headers()["content-location"].to_str().unwrap()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(joined.status(), 200);
        open.extend([started, joined]);
    }
    let page = metrics(&s).await;
    assert_eq!(sample(&page, "runner_active_streams"), 16.0, "{page}");
    // Clients that go away take their streams with them.
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&metrics(&s).await, "runner_active_streams") != 0.0 {
        assert!(Instant::now() < deadline, "closed streams stayed counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// LangGraph's Python client reads and writes the store a run uses, and searches it by meaning
/// (`--store-index`).
#[test]
fn the_python_sdk_drives_the_store() {
    let python = sdk_python();
    let s = super::serve::serve_with(&["--store-index", "offline"], &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/store.py");
    super::serve::script_passes(
        Command::new(python).arg(script).arg(&s.base),
        "sdk store: every check passed",
    );
}

/// `tests/sdk/js/` with `@langchain/langgraph-sdk` installed by `npm ci` from its lock file,
/// once per target directory (copied there, so the source tree stays clean). Parallel test
/// processes take turns through a lock directory; an install is used only once its marker
/// holds exactly this lock file. A failed install fails the test: it is never skipped.
fn sdk_js() -> &'static Path {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match DIR.get_or_init(npm_ci) {
        Ok(p) => p,
        Err(e) => panic!("the JS SDK test client could not be installed: {e}"),
    }
}

fn npm_ci() -> Result<PathBuf, String> {
    install::npm_ci("sdk-js", &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/js"))
}

/// LangGraph's JS client drives the server as an application would: threads, streams in each
/// mode, wait, state, history, search, an interrupt resumed, a run cancelled, a stream
/// rejoined with `Last-Event-ID`, the store.
#[test]
fn the_js_sdk_drives_the_server() {
    let dir = sdk_js();
    let s = serve();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/js/drive.mjs");
    // The script is run from the install so that its imports resolve to the installed SDK.
    std::fs::copy(&script, dir.join("drive.mjs")).unwrap();
    super::serve::script_passes(
        Command::new("node")
            .arg(dir.join("drive.mjs"))
            .arg(&s.base)
            .current_dir(dir),
        "js sdk: every check passed",
    );
}

/// SIGHUP reloads the folder: a new workflow is served, a changed one recompiled (its
/// assistant's version goes up), a removed one dropped, and one that stops validating keeps
/// serving its previous version.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_the_workflow_folder() {
    let s = serve();
    let workflows = s.dir.as_ref().unwrap().path().join("workflows");
    let chat = std::fs::read_to_string(workflows.join("chat.yaml")).unwrap();
    std::fs::write(workflows.join("echo.yaml"), &chat).unwrap();
    std::fs::write(workflows.join("chat.yaml"), chat.replace("'echo: '", "'echo again: '")).unwrap();
    std::fs::write(workflows.join("shout.yaml"), "name: shout\nnodes: {a: {kind: nope}}\n").unwrap();
    std::fs::remove_file(workflows.join("slow.yaml")).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());

    let deadline = Instant::now() + Duration::from_secs(20);
    let served = loop {
        let (_, _, found) = call(&s, Method::POST, "/assistants/search", Some(json!({"limit": 100}))).await;
        let ids: Vec<String> = found
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["graph_id"].as_str().unwrap().to_string())
            .collect();
        if ids.contains(&"echo".to_string()) {
            break ids;
        }
        assert!(Instant::now() < deadline, "no reload: {ids:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(served, ["chat", "echo", "fan", "gate", "memo", "shout"]);
    let (status, _, _) = call(&s, Method::GET, "/assistants/slow", None).await;
    assert_eq!(status, 404);
    let (_, _, chat) = call(&s, Method::GET, "/assistants/chat", None).await;
    assert_eq!(chat["version"], 2, "{chat}");
    let (_, _, gate) = call(&s, Method::GET, "/assistants/gate", None).await;
    assert_eq!(gate["version"], 1, "an unchanged file is not reloaded: {gate}");

    let input = json!({"messages": [{"type": "human", "content": "hi"}]});
    let (_, _, changed) = call(
        &s,
        Method::POST,
        "/runs/wait",
        Some(json!({"assistant_id": "chat", "input": input})),
    )
    .await;
    assert_eq!(changed["messages"][1]["content"], "echo again: hi", "{changed}");
    let (_, _, added) = call(
        &s,
        Method::POST,
        "/runs/wait",
        Some(json!({"assistant_id": "echo", "input": input})),
    )
    .await;
    assert_eq!(added["messages"][1]["content"], "echo: hi", "{added}");
    // The broken file's previous version still answers.
    let (_, _, kept) = call(
        &s,
        Method::POST,
        "/runs/wait",
        Some(json!({"assistant_id": "shout", "input": {"word": "hello"}})),
    )
    .await;
    assert_eq!(kept["said"], "hello there", "{kept}");
}

/// A run from an older checkpoint of the thread forks it there, as agent-chat-ui's edit of a
/// message does: the new branch's state is the old checkpoint's plus the new input (not the
/// values the abandoned branch stored after it), the history keeps both branches with their
/// parent links, and a run from the abandoned branch's head with no input takes that branch up
/// again, after which a new turn goes on from it.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_from_an_older_checkpoint_forks_the_thread() {
    let s = serve();
    let say = |text: &str, checkpoint: Option<&str>| {
        let mut body = json!({"assistant_id": "chat", "if_not_exists": "create",
                              "input": {"messages": [{"type": "human", "content": text}]}});
        if let Some(id) = checkpoint {
            body["checkpoint"] = json!({"checkpoint_id": id, "checkpoint_ns": ""});
        }
        body
    };
    let texts = |values: &Value| -> Vec<String> {
        values["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    let wait = |body: Value| async {
        let (status, _, values) = call(&s, Method::POST, "/threads/f/runs/wait", Some(body)).await;
        assert_eq!(status, 200, "{values}");
        values
    };
    wait(say("hi", None)).await;
    let first = wait(say("more", None)).await;
    assert_eq!(texts(&first), ["hi", "echo: hi", "more", "echo: more"]);
    let (_, _, history) = call(&s, Method::POST, "/threads/f/history", Some(json!({"limit": 50}))).await;
    let history = history.as_array().unwrap().clone();
    let old_head = history[0]["checkpoint_id"].as_str().unwrap().to_string();
    // The checkpoint where `more` first appears (the second turn's start); its parent, where
    // agent-chat-ui's edit of `more` forks, is the second turn's input checkpoint, which holds
    // the first turn's values.
    let more = history
        .iter()
        .rev()
        .find(|h| texts(&h["values"]).contains(&"more".to_string()))
        .unwrap();
    let fork = more["parent_checkpoint"]["checkpoint_id"].as_str().unwrap().to_string();
    let at_fork = history.iter().find(|h| h["checkpoint_id"] == fork.as_str()).unwrap();
    assert_eq!(texts(&at_fork["values"]), ["hi", "echo: hi"]);

    let edited = wait(say("other", Some(&fork))).await;
    assert_eq!(texts(&edited), ["hi", "echo: hi", "other", "echo: other"]);
    let (_, _, after) = call(&s, Method::POST, "/threads/f/history", Some(json!({"limit": 50}))).await;
    let after = after.as_array().unwrap();
    let ids: Vec<&str> = after.iter().map(|h| h["checkpoint_id"].as_str().unwrap()).collect();
    for h in &history {
        assert!(
            ids.contains(&h["checkpoint_id"].as_str().unwrap()),
            "the old branch stays"
        );
    }
    assert_eq!(
        after.len(),
        history.len() + 3,
        "a turn's input and start checkpoints, and its step's"
    );
    let new: Vec<&Value> = after
        .iter()
        .filter(|h| !history.iter().any(|o| o["checkpoint_id"] == h["checkpoint_id"]))
        .collect();
    let parent = |h: &Value| h["parent_checkpoint"]["checkpoint_id"].as_str().unwrap().to_string();
    let child_of = |id: &str| {
        let id = id.to_string();
        *new.iter()
            .find(|h| parent(h) == id)
            .unwrap_or_else(|| panic!("no new checkpoint is a child of {id}: {new:?}"))
    };
    let input = child_of(&fork);
    let start = child_of(input["checkpoint_id"].as_str().unwrap());
    let step = child_of(start["checkpoint_id"].as_str().unwrap());
    assert_eq!(
        (&input["metadata"]["source"], &input["next"]),
        (&json!("input"), &json!(["__start__"]))
    );
    assert_eq!(texts(&input["values"]), ["hi", "echo: hi"]);
    assert_eq!(texts(&start["values"]), ["hi", "echo: hi", "other"]);
    assert_eq!(texts(&step["values"]), texts(&edited));
    // The abandoned branch's values are intact.
    let (_, _, old) = call(&s, Method::GET, &format!("/threads/f/state/{old_head}"), None).await;
    assert_eq!(texts(&old["values"]), ["hi", "echo: hi", "more", "echo: more"]);

    // Back to the first branch, then on from it.
    let (status, _, back) = call(
        &s,
        Method::POST,
        "/threads/f/runs/wait",
        Some(json!({"assistant_id": "chat", "checkpoint_id": old_head})),
    )
    .await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(texts(&back), ["hi", "echo: hi", "more", "echo: more"]);
    let on = wait(say("again", None)).await;
    assert_eq!(
        texts(&on),
        ["hi", "echo: hi", "more", "echo: more", "again", "echo: again"]
    );
    let (_, _, state) = call(&s, Method::GET, "/threads/f/state", None).await;
    assert_eq!(texts(&state["values"]), texts(&on));
}

/// `command.update` (through the reducers) and `command.goto`, from LangGraph's Python client.
#[test]
fn the_python_sdk_sends_command_update_and_goto() {
    let python = sdk_python();
    let s = serve();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/command.py");
    super::serve::script_passes(
        Command::new(python).arg(script).arg(&s.base),
        "sdk command: every check passed",
    );
}

/// A state update at a checkpoint older than the latest forks the thread there, as a run from
/// it does: the edit is that checkpoint's child and the thread's head, written through the
/// reducers on the old checkpoint's values, and the branch it leaves keeps every checkpoint and
/// value. An update at the old branch's head takes that branch up again.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_update_at_an_older_checkpoint_forks_the_thread() {
    let s = serve();
    let texts = |values: &Value| -> Vec<String> {
        values["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    for text in ["hi", "more"] {
        let body = json!({"assistant_id": "chat", "if_not_exists": "create",
                          "input": {"messages": [{"type": "human", "content": text}]}});
        let (status, _, values) = call(&s, Method::POST, "/threads/u/runs/wait", Some(body)).await;
        assert_eq!(status, 200, "{values}");
    }
    let history = |s: &super::serve::Server| {
        let url = format!("{}/threads/u/history", s.base);
        async move {
            let h: Value = client()
                .post(url)
                .json(&json!({"limit": 50}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            h.as_array().unwrap().clone()
        }
    };
    let before = history(&s).await;
    let old_head = before[0]["checkpoint_id"].as_str().unwrap().to_string();
    // The first turn's last checkpoint: the parent of the one where `more` first appears.
    let more = before
        .iter()
        .rev()
        .find(|h| texts(&h["values"]).contains(&"more".to_string()))
        .unwrap();
    let end_of_first = more["parent_checkpoint"]["checkpoint_id"].as_str().unwrap().to_string();

    let (status, _, updated) = call(
        &s,
        Method::POST,
        "/threads/u/state",
        Some(json!({"values": {"messages": [{"type": "human", "content": "edited"}]},
                    "as_node": "reply", "checkpoint_id": end_of_first})),
    )
    .await;
    assert_eq!(status, 200, "{updated}");
    let edit = updated["checkpoint"]["checkpoint_id"].as_str().unwrap().to_string();
    let (_, _, state) = call(&s, Method::GET, "/threads/u/state", None).await;
    assert_eq!(
        state["checkpoint"]["checkpoint_id"],
        json!(edit),
        "the edit is the thread's head"
    );
    assert_eq!(state["parent_checkpoint"]["checkpoint_id"], json!(end_of_first));
    assert_eq!(
        texts(&state["values"]),
        ["hi", "echo: hi", "edited"],
        "appended by add_messages"
    );
    let after = history(&s).await;
    assert_eq!(after.len(), before.len() + 1, "{after:?}");
    assert_eq!(after[0]["checkpoint_id"], json!(edit), "newest first");
    for (old, kept) in before.iter().zip(&after[1..]) {
        assert_eq!(
            (&old["checkpoint_id"], &old["parent_checkpoint"], &old["values"]),
            (&kept["checkpoint_id"], &kept["parent_checkpoint"], &kept["values"]),
            "the branch left keeps its checkpoints, links and values"
        );
    }
    let (_, _, old) = call(&s, Method::GET, &format!("/threads/u/state/{old_head}"), None).await;
    assert_eq!(texts(&old["values"]), ["hi", "echo: hi", "more", "echo: more"]);

    // The old branch's head, named as the JS client and `checkpoint=` name it: a fork back.
    let (status, _, back) = call(
        &s,
        Method::POST,
        "/threads/u/state",
        Some(
            json!({"values": {"messages": [{"type": "human", "content": "back"}]}, "as_node": "reply",
                    "checkpoint": {"checkpoint_id": old_head, "checkpoint_ns": ""}}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{back}");
    let (_, _, state) = call(&s, Method::GET, "/threads/u/state", None).await;
    assert_eq!(state["parent_checkpoint"]["checkpoint_id"], json!(old_head));
    assert_eq!(
        texts(&state["values"]),
        ["hi", "echo: hi", "more", "echo: more", "back"]
    );
    // A run goes on from the head the update made.
    let body = json!({"assistant_id": "chat", "input": {"messages": [{"type": "human", "content": "on"}]}});
    let (status, _, values) = call(&s, Method::POST, "/threads/u/runs/wait", Some(body)).await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(
        texts(&values),
        ["hi", "echo: hi", "more", "echo: more", "back", "on", "echo: on"]
    );
    let (status, _, refused) = call(
        &s,
        Method::POST,
        "/threads/u/state",
        Some(json!({"values": {}, "checkpoint_id": "no-such-checkpoint"})),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
}

/// `--workers 1`: one run executes at a time. A run created meanwhile is answered at once as
/// `pending` and stays so (in its row and in `/metrics`) until the run before it ends; a wait
/// request waits for its run's turn; a pending run cancelled ends at once without running; the
/// others all run, in the order they were created.
#[tokio::test(flavor = "multi_thread")]
async fn with_one_worker_runs_wait_pending_in_line() {
    let s = super::serve::serve_with(&["--workers", "1"], &[]);
    let create = |thread: &str| {
        let url = format!("{}/threads/{thread}/runs", s.base);
        async move {
            let resp = client()
                .post(url)
                .json(&json!({"assistant_id": "slow", "if_not_exists": "create"}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.json::<Value>().await.unwrap()
        }
    };
    let status = |thread: String, run: String| {
        let url = format!("{}/threads/{thread}/runs/{run}", s.base);
        async move {
            let run: Value = client().get(url).send().await.unwrap().json().await.unwrap();
            run["status"].as_str().unwrap().to_string()
        }
    };
    let first = create("w1").await;
    let second = create("w2").await;
    let third = create("w3").await;
    assert_eq!(second["status"], "pending", "answered at once: {second}");
    let id = |r: &Value| r["run_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    while status("w1".into(), id(&first)).await != "running" {
        assert!(Instant::now() < deadline, "the first run never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A wait request's run is in line behind the others.
    let waited = tokio::spawn(
        client()
            .post(format!("{}/threads/w4/runs/wait", s.base))
            .json(&json!({"assistant_id": "slow", "if_not_exists": "create"}))
            .send(),
    );
    assert_eq!(status("w2".into(), id(&second)).await, "pending");
    let page = metrics(&s).await;
    assert!(page.contains("runner_runs{status=\"running\"} 1\n"), "{page}");
    assert!(page.contains("runner_workers 1\n"), "{page}");
    // The second, the third, and the wait's (whose row may not be written yet).
    let pending = page
        .lines()
        .find_map(|l| l.strip_prefix("runner_runs{status=\"pending\"} "))
        .unwrap();
    assert!(matches!(pending, "2" | "3"), "{page}");

    // The third is cancelled while it waits: it ends now, before the first has.
    let cancel = client()
        .post(format!("{}/threads/w3/runs/{}/cancel?wait=1", s.base, id(&third)))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    assert_eq!(cancel.json::<Value>().await.unwrap(), json!({}));
    assert_eq!(status("w3".into(), id(&third)).await, "interrupted");
    assert_eq!(status("w1".into(), id(&first)).await, "running");
    let (_, _, w3) = call(&s, Method::GET, "/threads/w3/state", None).await;
    assert_eq!(w3["values"], json!({}), "a run cancelled in line never ran: {w3}");

    // The second runs once the first has ended; the wait's after it.
    let joined = client()
        .get(format!("{}/threads/w1/runs/{}/join", s.base, id(&first)))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.json::<Value>().await.unwrap()["said"], "done");
    let second_state = status("w2".into(), id(&second)).await;
    assert!(matches!(second_state.as_str(), "pending" | "running"), "{second_state}");
    let waited = waited.await.unwrap().unwrap();
    assert_eq!(waited.status(), 200);
    assert_eq!(waited.json::<Value>().await.unwrap()["said"], "done");
    assert_eq!(
        status("w2".into(), id(&second)).await,
        "success",
        "created before the wait's run, the second ended before it"
    );
    let page = metrics(&s).await;
    assert!(page.contains("runner_runs{status=\"pending\"} 0\n"), "{page}");
    assert!(page.contains("runner_runs_total{status=\"success\"} 3\n"), "{page}");
}

/// `command.goto` with LangGraph's `Send` (`{"node", "input"}`): the node runs as one of its
/// fan-out tasks with the input as its item, alone or beside plain nodes; a goto to a node the
/// graph lacks, or a Send to a node no `send` reaches (it takes no item), is refused with a 422
/// that says so, and the thread is unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn command_goto_sends_run_a_fan_out_target_on_the_given_item() {
    let s = serve();
    let wait = |body: Value| {
        let s = &s;
        async move { call(s, Method::POST, "/threads/fan/runs/wait", Some(body)).await }
    };
    let (status, _, values) = wait(json!({"assistant_id": "fan", "if_not_exists": "create",
                                          "input": {"items": [{"name": "a"}]}}))
    .await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["done"], json!(["a"]));

    // Two Sends to the target: two tasks, each with its own item.
    let (status, _, values) = wait(json!({"assistant_id": "fan", "command": {"goto": [
        {"node": "work", "input": {"name": "b"}}, {"node": "work", "input": {"name": "c"}}]}}))
    .await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["done"], json!(["a", "b", "c"]));
    // One Send alone (not in a list), beside nothing else.
    let (status, _, values) =
        wait(json!({"assistant_id": "fan", "command": {"goto": {"node": "work", "input": {"name": "d"}}}})).await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["done"], json!(["a", "b", "c", "d"]));
    // A node and a Send together: `plan` fans out again over the thread's input (after the
    // step in which the Send's task ran beside it).
    let (status, _, values) = wait(json!({"assistant_id": "fan", "command": {"goto": [
        "plan", {"node": "work", "input": {"name": "e"}}]}}))
    .await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["done"], json!(["a", "b", "c", "d", "e", "a"]));

    // Refusals: what is wrong, by name; nothing ran.
    for (goto, says) in [
        (json!({"node": "plan", "input": {"name": "x"}}), "`plan` is not one"),
        (
            json!({"node": "nowhere", "input": {}}),
            "`nowhere` is not a node of graph fan",
        ),
        (json!(["work", "nowhere"]), "`nowhere` is not a node of graph fan"),
        (json!({"input": {"name": "x"}}), "a Send is {\"node\""),
        (json!(7), "names a node or a Send"),
    ] {
        let (status, _, error) = wait(json!({"assistant_id": "fan", "command": {"goto": goto}})).await;
        assert_eq!(status, 422, "{goto}: {error}");
        let detail = error["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(says), "{goto}: {detail}");
    }
    let (_, _, state) = call(&s, Method::GET, "/threads/fan/state", None).await;
    assert_eq!(state["values"]["done"], json!(["a", "b", "c", "d", "e", "a"]));
}

/// An `agent` node served as agent-chat-ui drives it (`messages-tuple` with
/// `stream_subgraphs`): the loop's model tokens arrive as `messages|helper:…` chunks whose id
/// is the id the reply then has in the thread's messages, so the UI joins the streamed reply
/// with the stored one instead of showing it twice; the tool round's messages (the model's
/// tool call, the tool's answer), written whole, are sent whole once each, as the reference
/// sends them, under the ids they are stored under.
#[tokio::test(flavor = "multi_thread")]
async fn an_agents_streamed_reply_has_the_id_it_is_stored_under() {
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    let lib = dir.path().join("lib");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(
        lib.join("define.yaml"),
        "name: define\ninput: {type: object, required: [word], properties: {word: {type: string}}}\n\
         state:\n  meaning: {type: string}\nnodes:\n  say: {kind: set, update: {meaning: \"input.word ~ ' means a ratio'\"}}\n\
         edges: [START -> say -> END]\n",
    )
    .unwrap();
    std::fs::write(
        workflows.join("helper.yaml"),
        r#"name: helper
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {messages: {type: array}}}
state:
  messages: {type: array, reducer: add_messages, default: [], from_input: true}
tools:
  define:
    description: Say what a word means.
    workflow: ../lib/define.yaml
nodes:
  helper:
    kind: agent
    tools: [define]
    stream: true
    update: {messages: output.messages}
edges: [START -> helper -> END]
"#,
    )
    .unwrap();
    let mock = dir.path().join("mock.yaml");
    std::fs::write(
        &mock,
        "replies:\n  helper:\n    - {tool_calls: [{name: define, args: {word: cop}}]}\n    - {text: A ratio., chunks: [\"A \", ratio.]}\n",
    )
    .unwrap();
    let (child, base, said) = super::serve::spawn(dir.path(), &workflows, &mock, &[], &[]);
    let s = super::serve::Server {
        child,
        base,
        dir: Some(dir),
    };
    assert!(said.contains("serving helper"), "{said}");
    let resp = client()
        .post(format!("{}/threads/t1/runs/stream", s.base))
        .json(
            &json!({"assistant_id": "helper", "if_not_exists": "create", "stream_subgraphs": true,
                      "stream_mode": ["values", "messages-tuple"],
                      "input": {"messages": [{"type": "human", "content": "what is a cop?"}]}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = parse(&resp.text().await.unwrap());
    let sent: Vec<&Value> = events
        .iter()
        .filter(|(e, _)| e.starts_with("messages|helper:"))
        .map(|(_, d)| d)
        .collect();
    let (chunks, whole): (Vec<&Value>, Vec<&Value>) = sent.iter().partition(|d| d[0]["type"] == "AIMessageChunk");
    let text: String = chunks
        .iter()
        .map(|d| d[0]["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(text, "A ratio.", "{events:?}");
    let id = chunks[0][0]["id"].as_str().unwrap();
    assert!(chunks.iter().all(|d| d[0]["id"] == id), "{chunks:?}");
    let (status, _, state) = call(&s, Method::GET, "/threads/t1/state", None).await;
    assert_eq!(status, 200, "{state}");
    let messages = state["values"]["messages"].as_array().unwrap();
    let types: Vec<&str> = messages.iter().filter_map(|m| m["type"].as_str()).collect();
    assert_eq!(types, ["human", "ai", "tool", "ai"], "{state}");
    assert_eq!(messages[3]["id"], id, "the streamed reply is the stored one: {state}");
    let whole: Vec<(&Value, &Value)> = whole.iter().map(|d| (&d[0]["type"], &d[0]["id"])).collect();
    assert_eq!(
        whole,
        [(&json!("ai"), &messages[1]["id"]), (&json!("tool"), &messages[2]["id"])],
        "{events:?}"
    );
    let ids: std::collections::BTreeSet<&str> = messages.iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids.len(), 4, "every message has its own id: {state}");
}

/// A message a node writes without streaming it reaches `messages-tuple` whole, once, as a
/// LangChain dict under its stored id (and the legacy mode as `messages/complete`); the run's
/// input message is not sent back.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_written_whole_is_sent_whole_and_input_is_not_sent_back() {
    let s = serve();
    let resp = client()
        .post(format!("{}/threads/w/runs/stream", s.base))
        .json(&json!({"assistant_id": "chat", "if_not_exists": "create",
                      "stream_mode": ["messages-tuple", "messages", "values"],
                      "input": {"messages": [{"type": "human", "content": "hi", "id": "h1"}]}}))
        .send()
        .await
        .unwrap();
    let events = parse(&resp.text().await.unwrap());
    let whole: Vec<&Value> = events.iter().filter(|(e, _)| e == "messages").map(|(_, d)| d).collect();
    assert_eq!(whole.len(), 1, "{events:?}");
    assert_eq!(whole[0][0]["type"], "ai");
    assert_eq!(whole[0][0]["content"], "echo: hi");
    assert_eq!(whole[0][1]["langgraph_node"], "reply");
    let complete: Vec<&Value> = events
        .iter()
        .filter(|(e, _)| e == "messages/complete")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(complete.len(), 1, "{events:?}");
    assert_eq!(complete[0][0]["id"], whole[0][0]["id"]);
    let (_, _, state) = call(&s, Method::GET, "/threads/w/state", None).await;
    assert_eq!(state["values"]["messages"][1]["id"], whole[0][0]["id"], "{state}");
}

/// `--store-index` is LangGraph's store `index`: items put are embedded at its fields (or at
/// the fields a put names), a search's `query` ranks by similarity (cosine, best first, paged),
/// an item put with `index: false` only fills the room a page has left, with a null score,
/// and without a query items come in the order they were put, as LangGraph's store lists them.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_index_makes_search_rank_by_meaning() {
    let s = super::serve::serve_with(&["--store-index", "offline", "--store-index-field", "text"], &[]);
    for (key, value, index) in [
        (
            "tides",
            json!({"text": "the moon pulls the tides of the sea", "title": "bread"}),
            Value::Null,
        ),
        ("bread", json!({"text": "baking sourdough bread at home"}), Value::Null),
        (
            "titled",
            json!({"text": "nothing alike", "title": "moon tides"}),
            json!(["title"]),
        ),
        ("plain", json!({"text": "moon tides moon tides"}), json!(false)),
        ("later", json!({"text": "moon tides, later"}), json!(false)),
    ] {
        let body = json!({"namespace": ["notes"], "key": key, "value": value, "index": index});
        let (status, _, error) = call(&s, Method::PUT, "/store/items", Some(body)).await;
        assert_eq!(status, 204, "{error}");
    }
    let search = |body: Value| {
        let s = &s;
        async move {
            let (status, _, found) = call(s, Method::POST, "/store/items/search", Some(body)).await;
            assert_eq!(status, 200, "{found}");
            found["items"].as_array().unwrap().clone()
        }
    };
    let keys = |items: &[Value]| {
        items
            .iter()
            .map(|i| i["key"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let found = search(json!({"namespace_prefix": ["notes"], "query": "moon tides"})).await;
    // `titled` was embedded at its title only (the whole of "moon tides"), `tides` at its text;
    // the items not embedded fill the page in the order they were put, as LangGraph's store
    // fills it.
    assert_eq!(
        keys(&found),
        ["titled", "tides", "bread", "plain", "later"],
        "{found:#?}"
    );
    let scores: Vec<Option<f64>> = found.iter().map(|i| i["score"].as_f64()).collect();
    assert!(scores[0] > scores[1] && scores[1] > scores[2], "{scores:?}");
    assert_eq!(scores[3..], [None, None]);
    assert!(found[0]["created_at"].is_string() && found[0]["updated_at"].is_string());
    // Pages are cut from the ranking; a filter applies first.
    let page = search(json!({"namespace_prefix": ["notes"], "query": "moon tides", "limit": 1, "offset": 1})).await;
    assert_eq!(keys(&page), ["tides"]);
    let filtered = search(json!({"namespace_prefix": ["notes"], "query": "moon", "filter": {"title": "bread"}})).await;
    assert_eq!(keys(&filtered), ["tides"]);
    // No query: the oldest first, no score.
    let oldest = search(json!({"namespace_prefix": ["notes"], "limit": 2})).await;
    assert_eq!(keys(&oldest), ["tides", "bread"]);
    assert!(oldest.iter().all(|i| i["score"].is_null()));
    // A bad `index` is refused.
    for index in [json!("text"), json!([1])] {
        let body = json!({"namespace": ["notes"], "key": "x", "value": {}, "index": index});
        let (status, _, error) = call(&s, Method::PUT, "/store/items", Some(body)).await;
        assert_eq!(status, 422, "{index}: {error}");
    }
}

/// Store items put with a `ttl` (minutes, fractional as LangGraph's) expire: gone from get,
/// search and the namespaces; a read refreshes the time to live unless `refresh_ttl` is false;
/// an item without a ttl stays; a ttl that is not a positive number is refused.
#[tokio::test(flavor = "multi_thread")]
async fn store_items_with_a_ttl_expire_unless_reads_refresh_them() {
    let s = serve();
    // 0.01 minutes: 600 ms.
    for (namespace, key, ttl) in [
        (json!(["gone"]), "short", json!(0.01)),
        (json!(["kept"]), "forever", Value::Null),
        (json!(["kept"]), "read", json!(0.01)),
        (json!(["found"]), "searched", json!(0.01)),
    ] {
        let body = json!({"namespace": namespace, "key": key, "value": {"k": key}, "ttl": ttl});
        let (status, _, error) = call(&s, Method::PUT, "/store/items", Some(body)).await;
        assert_eq!(status, 204, "{error}");
    }
    let get = |path: &'static str| {
        let s = &s;
        async move { call(s, Method::GET, path, None).await.2 }
    };
    let search = |prefix: &'static str, refresh: bool| {
        let s = &s;
        let body = json!({"namespace_prefix": [prefix], "refresh_ttl": refresh});
        async move { call(s, Method::POST, "/store/items/search", Some(body)).await.2["items"].clone() }
    };
    // Read without a refresh, it is there and its clock runs on.
    assert_eq!(
        get("/store/items?namespace=gone&key=short&refresh_ttl=false").await["key"],
        "short"
    );
    // Over a second, `read` is read (refreshed) and `searched` found every 200 ms.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1000) {
        assert_eq!(get("/store/items?namespace=kept&key=read").await["key"], "read");
        assert_eq!(search("found", true).await.as_array().map(Vec::len), Some(1));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get("/store/items?namespace=gone&key=short").await, Value::Null);
    assert_eq!(search("gone", true).await, json!([]));
    let (_, _, listed) = call(&s, Method::POST, "/store/namespaces", Some(json!({}))).await;
    assert_eq!(listed, json!({"namespaces": [["found"], ["kept"]]}));
    assert_eq!(get("/store/items?namespace=kept&key=forever").await["key"], "forever");
    // Reads that do not refresh let the others expire too.
    assert_eq!(
        get("/store/items?namespace=kept&key=read&refresh_ttl=false").await["key"],
        "read"
    );
    assert_eq!(search("found", false).await.as_array().map(Vec::len), Some(1));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(get("/store/items?namespace=kept&key=read").await, Value::Null);
    assert_eq!(search("found", true).await, json!([]));
    assert_eq!(get("/store/items?namespace=kept&key=forever").await["key"], "forever");

    for ttl in [json!(-1), json!(0), json!("soon")] {
        let body = json!({"namespace": ["x"], "key": "k", "value": {}, "ttl": ttl});
        let (status, _, error) = call(&s, Method::PUT, "/store/items", Some(body)).await;
        assert_eq!(status, 422, "{ttl}: {error}");
    }
}
