//! Stopping and racing runs through the binary: a cancel stops its run at once, the model
//! request it was in closed and its write lost; requests that race for one thread or one
//! thread id are decided one at a time.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::serve::{Server, call, client, spawn_live};
use super::support::fake_llm::{FakeLlm, Reply};

/// One streamed model call, then a second node: a run cancelled in the call never reaches it.
const STREAMED: &str = r#"name: streamed
models: {default: {provider: openai, model: m, base_url: "${env:FAKE_BASE}", api_key_env: FAKE_KEY}}
state:
  said: {type: string, default: ""}
  after: {type: boolean, default: false}
nodes:
  think:
    kind: llm
    stream: true
    prompt: {text: "Take your time"}
    update: {said: output}
  done: {kind: set, update: {after: "true"}}
edges: [START -> think -> done -> END]
"#;

fn serve_streamed(llm: &FakeLlm) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir(&workflows).unwrap();
    std::fs::write(workflows.join("streamed.yaml"), STREAMED).unwrap();
    let env = [("FAKE_BASE", llm.base_url.as_str()), ("FAKE_KEY", "k")];
    let (child, base, said) = spawn_live(dir.path(), &workflows, &[], &env);
    assert!(said.contains("serving streamed\n"), "{said}");
    Server {
        child,
        base,
        dir: Some(dir),
    }
}

/// Waits (at most 10 s) until `check` holds.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A cancel in the middle of a streamed model call (8 pieces, a second apart) stops the run
/// at once: the run is `interrupted` well before the call would have ended, the model's
/// request is closed, the task's write is lost, and the thread waits at that task,
/// `interrupted`, to be taken up again. Cancelling the run once it has ended is a 404 that
/// leaves its status alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_stops_a_streaming_model_call_at_once() {
    let llm = FakeLlm::start_in_background();
    let pieces = ["a ", "long ", "and ", "slow ", "answer ", "that ", "never ", "ends"];
    llm.script([Reply::stream(&pieces).gap(Duration::from_secs(1))]);
    llm.default_reply(Reply::stream(&["quick"]));
    let s = serve_streamed(&llm);
    let (status, _, run) = call(
        &s,
        reqwest::Method::POST,
        "/threads/c1/runs",
        Some(json!({"assistant_id": "streamed", "if_not_exists": "create", "input": {}})),
    )
    .await;
    assert_eq!(status, 200, "{run}");
    let run_path = format!("/threads/c1/runs/{}", run["run_id"].as_str().unwrap());
    // The call is under way: its first pieces have come.
    until("the model was called", async || !llm.requests().is_empty()).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let asked = Instant::now();
    let (status, _, body) = call(&s, reqwest::Method::POST, &format!("{run_path}/cancel"), None).await;
    assert_eq!((status, body), (200, json!({})));
    until("the run ended", async || {
        call(&s, reqwest::Method::GET, &run_path, None).await.2["status"] == "interrupted"
    })
    .await;
    let stopped = asked.elapsed();
    // Without the abort the run would end with the call, some 6 s later.
    assert!(stopped < Duration::from_millis(500), "stopped after {stopped:?}");
    until("the model request was closed", async || llm.abandoned() == 1).await;

    let (_, _, state) = call(&s, reqwest::Method::GET, "/threads/c1/state", None).await;
    assert_eq!(state["next"], json!(["think"]), "{state}");
    assert_eq!(
        state["values"],
        json!({"said": "", "after": false}),
        "the write is lost: {state}"
    );
    let (_, _, thread) = call(&s, reqwest::Method::GET, "/threads/c1", None).await;
    assert_eq!(thread["status"], "interrupted", "{thread}");
    assert_eq!(thread["error"]["error"], "UserInterrupt", "{thread}");

    // Taken up again, the task runs from its start.
    let (status, _, out) = call(
        &s,
        reqwest::Method::POST,
        "/threads/c1/runs/wait",
        Some(json!({"assistant_id": "streamed"})),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out, json!({"said": "quick", "after": true}));
    assert_eq!(llm.requests().len(), 2);

    // A run that had ended is not cancelled, nor reported so.
    let (_, _, done) = call(
        &s,
        reqwest::Method::POST,
        "/threads/c1/runs",
        Some(json!({"assistant_id": "streamed", "input": {}})),
    )
    .await;
    let done_path = format!("/threads/c1/runs/{}", done["run_id"].as_str().unwrap());
    until("the second run ended", async || {
        call(&s, reqwest::Method::GET, &done_path, None).await.2["status"] == "success"
    })
    .await;
    let (status, _, _) = call(&s, reqwest::Method::POST, &format!("{done_path}/cancel"), None).await;
    assert_eq!(status, 404);
    assert_eq!(
        call(&s, reqwest::Method::GET, &done_path, None).await.2["status"],
        "success"
    );
}

/// A streamed run whose client goes away mid-call is cancelled as at once as by the endpoint:
/// its model request is closed too.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_gone_mid_call_closes_the_model_request() {
    let llm = FakeLlm::start_in_background();
    let pieces = ["a ", "long ", "and ", "slow ", "answer"];
    llm.script([Reply::stream(&pieces).gap(Duration::from_secs(1))]);
    let s = serve_streamed(&llm);
    let resp = client()
        .post(format!("{}/threads/gone/runs/stream", s.base))
        .json(
            &json!({"assistant_id": "streamed", "if_not_exists": "create", "input": {},
                      "stream_mode": ["messages-tuple"]}),
        )
        .send()
        .await
        .unwrap();
    let run = resp.headers()["content-location"].to_str().unwrap().to_string();
    until("the model was called", async || !llm.requests().is_empty()).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    drop(resp);
    until("the run ended", async || {
        call(&s, reqwest::Method::GET, &run, None).await.2["status"] == "interrupted"
    })
    .await;
    until("the model request was closed", async || llm.abandoned() == 1).await;
}

/// Concurrent requests for one idle thread with `multitask_strategy: reject`: exactly one run
/// gets the thread; every other request is a 409, none a failed run.
#[tokio::test(flavor = "multi_thread")]
async fn of_concurrent_rejecting_runs_on_one_thread_exactly_one_runs() {
    let s = super::serve::serve();
    let (status, _, _) = call(
        &s,
        reqwest::Method::POST,
        "/threads",
        Some(json!({"thread_id": "race"})),
    )
    .await;
    assert_eq!(status, 200);
    let asks = (0..5).map(|_| {
        let base = s.base.clone();
        async move {
            let resp = client()
                .post(format!("{base}/threads/race/runs"))
                .json(&json!({"assistant_id": "slow", "input": {}, "multitask_strategy": "reject"}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    });
    let answers = futures::future::join_all(asks).await;
    let mut statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409, 409], "{answers:?}");
    let (_, run) = answers.iter().find(|(s, _)| *s == 200).unwrap();
    let (_, _, joined) = call(
        &s,
        reqwest::Method::GET,
        &format!("/threads/race/runs/{}/join", run["run_id"].as_str().unwrap()),
        None,
    )
    .await;
    assert!(joined.get("__error__").is_none(), "{joined}");
    let (_, _, runs) = call(&s, reqwest::Method::GET, "/threads/race/runs", None).await;
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
    assert_eq!(runs[0]["status"], "success", "{runs}");
}

/// Ten concurrent creates of one thread id: one 200, nine 409s.
#[tokio::test(flavor = "multi_thread")]
async fn of_concurrent_creates_of_one_thread_id_exactly_one_succeeds() {
    let s = super::serve::serve();
    let asks = (0..10).map(|_| {
        let base = s.base.clone();
        async move {
            client()
                .post(format!("{base}/threads"))
                .json(&json!({"thread_id": "one", "metadata": {"n": 1}}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    let mut statuses = futures::future::join_all(asks).await;
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409, 409, 409, 409, 409, 409, 409]);
}

/// A thread deleted while runs are queued on it stays deleted: its queued runs end without
/// running, and none brings the thread back.
#[tokio::test(flavor = "multi_thread")]
async fn a_thread_deleted_under_queued_runs_stays_deleted() {
    let s = super::serve::serve();
    let (status, _, _) = call(
        &s,
        reqwest::Method::POST,
        "/threads",
        Some(json!({"thread_id": "doomed"})),
    )
    .await;
    assert_eq!(status, 200);
    for _ in 0..3 {
        let (status, _, run) = call(
            &s,
            reqwest::Method::POST,
            "/threads/doomed/runs",
            Some(json!({"assistant_id": "slow", "input": {}, "multitask_strategy": "enqueue"})),
        )
        .await;
        assert_eq!(status, 200, "{run}");
    }
    let (status, _, body) = call(&s, reqwest::Method::DELETE, "/threads/doomed", None).await;
    assert_eq!(status, 204, "{body}");
    // Long enough for every queued run to have run, had it been left to.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, _, thread) = call(&s, reqwest::Method::GET, "/threads/doomed", None).await;
    assert_eq!(status, 404, "{thread}");
    let (status, _, state) = call(&s, reqwest::Method::GET, "/threads/doomed/state", None).await;
    assert_eq!(status, 404, "{state}");
    let (_, _, found) = call(&s, reqwest::Method::POST, "/threads/search", Some(json!({}))).await;
    assert!(
        !found.as_array().unwrap().iter().any(|t| t["thread_id"] == "doomed"),
        "{found}"
    );
}
