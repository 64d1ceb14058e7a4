//! A workflow's own HTTP endpoints (`serve.routes`) through the binary: a frontend that speaks
//! its own API (an SSE stream of its own event names, a JSON answer) drives a served workflow
//! with no code; the thread comes from the request, so turns go on across requests. Workflows
//! in subfolders are served when they declare `serve:`.

use std::path::Path;

use serde_json::{Value, json};

use super::serve::{Server, call, client, spawn};

const CHATTY: &str = r#"name: chatty
models: {default: {provider: mock, model: m}}
input:
  type: object
  required: [question]
  properties: {question: {type: string}, tone: {type: string, default: plain}}
state:
  asked: {type: array, reducer: append, default: []}
  answer: {type: string, default: ""}
nodes:
  thinking: {kind: emit, event: status, data: {event: "'status'", message: "'Thinking...'"}}
  reply:
    kind: llm
    stream: true
    prompt: {text: "Say hello"}
    update: {answer: output, asked: "[input.question ~ ' (' ~ input.tone ~ ')']"}
edges: [START -> thinking -> reply -> END]
serve:
  routes:
    - path: /chat/stream
      description: The chat frontend's stream.
      thread: request.body.session_id
      input: {question: request.body.message, tone: request.query.tone}
      stream:
        - {on: custom, when: "event.data.event == 'status'", event: status, data: event.data.message}
        - {on: token, event: token, data: event.text}
        - on: end
          event: done
          data: "{'answer': state.answer, 'asked': state.asked, 'session': run.thread_id, 'status': event.status}"
    - path: /sessions/{id}/ask
      thread: request.path.id
      input: {question: request.body.message}
      respond: "{'answer': state.answer, 'turns': state.asked | length}"
    - path: /once
      input: {question: request.body.message}
"#;

const BOOM: &str = r#"name: boom
models: {default: {provider: mock, model: m}}
state:
  said: {type: string, default: ""}
nodes:
  explode: {kind: llm, prompt: {text: "Say boom"}, retry: {max_attempts: 1}, update: {said: output}}
edges: [START -> explode -> END]
serve:
  routes:
    - path: /boom/stream
      stream:
        - {on: end, event: end, data: event.status}
    - path: /boom
"#;

/// Served beside `chatty`: `parts/served.yaml` declares `serve:`, `parts/part.yaml` does not.
const PART: &str = r#"name: part
state:
  n: {type: integer, default: 0}
nodes:
  inc: {kind: set, update: {n: "state.n + 1"}}
edges: [START -> inc -> END]
"#;

fn serve_routes() -> (Server, String) {
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir_all(workflows.join("parts")).unwrap();
    std::fs::write(workflows.join("chatty.yaml"), CHATTY).unwrap();
    std::fs::write(workflows.join("boom.yaml"), BOOM).unwrap();
    std::fs::write(workflows.join("parts/part.yaml"), PART).unwrap();
    std::fs::write(
        workflows.join("parts/served.yaml"),
        PART.replace("name: part", "name: served") + "serve: {}\n",
    )
    .unwrap();
    let mock = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serve/mock.yaml");
    let (child, base, said) = spawn(dir.path(), &workflows, &mock, &[], &[]);
    (
        Server {
            child,
            base,
            dir: Some(dir),
        },
        said,
    )
}

/// The frames of an SSE body: `(event name, data)` with the data's lines joined.
fn frames(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\r\n\r\n")
        .filter(|f| !f.trim().is_empty() && !f.starts_with(':'))
        .map(|f| {
            let mut event = None;
            let mut data = Vec::new();
            for line in f.split("\r\n") {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = Some(e.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push(d);
                }
            }
            (event, data.join("\n"))
        })
        .collect()
}

async fn post_raw(s: &Server, path: &str, body: Value) -> (u16, String, String) {
    let resp = client()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let kind = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, kind, resp.text().await.unwrap())
}

/// The chat frontend's stream: its own event names and data (text as it is, objects as JSON),
/// in the order the run makes them; the session id is the thread, so a second request is the
/// conversation's second turn, and the LangGraph API sees the same thread.
#[tokio::test(flavor = "multi_thread")]
async fn a_route_streams_the_events_its_frontend_expects_and_keeps_the_session() {
    let (s, said) = serve_routes();
    assert!(said.contains("serving boom, chatty, parts-served\n"), "{said}");
    assert!(said.contains("route POST /chat/stream -> chatty\n"), "{said}");
    assert!(said.contains("route POST /sessions/{id}/ask -> chatty\n"), "{said}");

    let (status, kind, body) = post_raw(
        &s,
        "/chat/stream?tone=warm",
        json!({"session_id": "s1", "message": "hi"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    let done = json!({"answer": "hello there", "asked": ["hi (warm)"], "session": "s1", "status": "success"});
    assert_eq!(
        frames(&body),
        [
            (Some("status".into()), "Thinking...".into()),
            (Some("token".into()), "hello".into()),
            (Some("token".into()), " there".into()),
            (Some("done".into()), done.to_string()),
        ],
        "{body}"
    );

    // The same session: the thread's second turn (the tone left to its default).
    let (_, _, body) = post_raw(&s, "/chat/stream", json!({"session_id": "s1", "message": "again"})).await;
    let last = frames(&body).pop().unwrap();
    let last: Value = serde_json::from_str(&last.1).unwrap();
    assert_eq!(last["asked"], json!(["hi (warm)", "again (plain)"]), "{body}");

    // The thread is LangGraph's too.
    let (status, _, state) = call(&s, reqwest::Method::GET, "/threads/s1/state", None).await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["values"]["asked"], json!(["hi (warm)", "again (plain)"]));
}

/// A route without `stream` answers JSON once the run ends: its `respond` value (its path's
/// parameter naming the thread), or the run's output; a run that fails is a 500 with its error
/// (a stream ends with `event: error`); a body that is not JSON is a 422, an unknown path a 404.
#[tokio::test(flavor = "multi_thread")]
async fn a_route_answers_json_reads_its_path_and_says_when_the_run_failed() {
    let (s, _) = serve_routes();
    let (status, _, body) = call(
        &s,
        reqwest::Method::POST,
        "/sessions/a%20b/ask",
        Some(json!({"message": "one"})),
    )
    .await;
    assert_eq!((status, body), (200, json!({"answer": "hello there", "turns": 1})));
    let (_, _, body) = call(
        &s,
        reqwest::Method::POST,
        "/sessions/a%20b/ask",
        Some(json!({"message": "two"})),
    )
    .await;
    assert_eq!(body["turns"], 2);
    let (status, _, state) = call(&s, reqwest::Method::GET, "/threads/a b/state", None).await;
    assert_eq!(status, 200, "{state}");

    // No thread: the run has one of its own, gone after it.
    let (status, _, out) = call(&s, reqwest::Method::POST, "/once", Some(json!({"message": "x"}))).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["answer"], "hello there", "{out}");

    // The input's required field missing: the run is refused as the API refuses it.
    let (status, _, body) = call(&s, reqwest::Method::POST, "/once", Some(json!({}))).await;
    assert_eq!(status, 422, "{body}");

    let (status, _, body) = call(&s, reqwest::Method::POST, "/boom", None).await;
    assert_eq!(status, 500, "{body}");
    assert!(body["message"].as_str().unwrap().contains("explode"), "{body}");
    let (status, _, body) = post_raw(&s, "/boom/stream", Value::Null).await;
    assert_eq!(status, 200);
    let got = frames(&body);
    assert_eq!(got.len(), 2, "{body}");
    assert_eq!(got[0].0.as_deref(), Some("error"), "{body}");
    assert_eq!(got[1], (Some("end".into()), "error".into()), "{body}");

    let resp = client()
        .post(format!("{}/chat/stream", s.base))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 422);
    let (status, _, body) = call(&s, reqwest::Method::POST, "/nowhere", None).await;
    assert_eq!((status, body), (404, json!({"detail": "Not Found"})));
    // A route answers its own method only.
    let (status, _, _) = call(&s, reqwest::Method::GET, "/once", None).await;
    assert_eq!(status, 404);
}

/// A workflow in a subfolder is a graph when it declares `serve:` (named by its path), and a
/// part of other workflows when it does not.
#[tokio::test(flavor = "multi_thread")]
async fn subfolder_workflows_that_declare_serve_are_served() {
    let (s, _) = serve_routes();
    let (_, _, found) = call(&s, reqwest::Method::POST, "/assistants/search", Some(json!({}))).await;
    let mut ids: Vec<&str> = found
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["graph_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["boom", "chatty", "parts-served"]);
    let (status, _, out) = call(
        &s,
        reqwest::Method::POST,
        "/runs/wait",
        Some(json!({"assistant_id": "parts-served", "input": {}})),
    )
    .await;
    assert_eq!((status, out), (200, json!({"n": 1})));
}

/// `runner validate` checks a route's path and expressions like the rest of the workflow.
#[test]
fn validate_reports_a_bad_route() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    let bad = CHATTY
        .replace("path: /chat/stream", "path: /threads/mine")
        .replace(
            "respond: \"{'answer': state.answer,",
            "respond: \"{'answer': state.answr,",
        )
        .replace("thread: request.path.id", "thread: state.answer");
    std::fs::write(&file, bad).unwrap();
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .args(["validate"])
        .arg(&file)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("E500") && said.contains("`/threads/mine` is under `/threads`"),
        "{said}"
    );
    assert!(said.contains("`state.answr` is not a declared state key"), "{said}");
    assert!(said.contains("they read `request` and `config`, not `state`"), "{said}");
}
