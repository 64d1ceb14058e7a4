//! `runner serve` through the real binary on 127.0.0.1: LangGraph's own Python client
//! (`langgraph-sdk`, pinned in `tests/sdk/requirements.txt`, installed into a venv by this
//! file's set-up) drives it as an application would, and plain HTTP checks statuses, error
//! shapes, CORS, the SSE framing and the thread lease.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::fake_llm::{FakeLlm, Reply};
use super::support::install;

/// A `runner serve` over the test workflows, killed when dropped.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) base: String,
    /// Its folder (workflows, database); none once [`Server::kill9`] took it.
    pub(crate) dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Kills the server outright (SIGKILL: nothing of it runs after) and hands back its
    /// folder, for a server started again on the same database.
    pub(crate) fn kill9(&mut self) -> tempfile::TempDir {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.dir.take().unwrap()
    }
}

impl Server {
    /// Sends SIGTERM and waits (at most 30 s) for the server to exit: how it exited, and after
    /// how long.
    pub(crate) fn term(&mut self) -> (std::process::ExitStatus, Duration) {
        let sent = Instant::now();
        let termed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(termed.success());
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, sent.elapsed());
            }
            assert!(sent.elapsed() < Duration::from_secs(30), "the server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `runner serve` on a free port over `tests/fixtures/gate.yaml`, the workflows of
/// `tests/fixtures/serve/` and one that does not validate, on the scripted mock.
pub(crate) fn serve() -> Server {
    serve_with(&[], &[])
}

/// [`serve`] with more arguments and environment variables.
pub(crate) fn serve_with(args: &[&str], env: &[(&str, &str)]) -> Server {
    serve_in(tempfile::tempdir().unwrap(), args, env)
}

/// [`serve_with`] in `dir`: on the database a server before left there, if one did.
pub(crate) fn serve_in(dir: tempfile::TempDir, args: &[&str], env: &[(&str, &str)]) -> Server {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let workflows = dir.path().join("workflows");
    let _ = std::fs::create_dir(&workflows);
    std::fs::copy(fixtures.join("gate.yaml"), workflows.join("gate.yaml")).unwrap();
    for name in ["chat.yaml", "fan.yaml", "memo.yaml", "shout.yaml", "slow.yaml"] {
        std::fs::copy(fixtures.join("serve").join(name), workflows.join(name)).unwrap();
    }
    std::fs::write(
        workflows.join("broken.yaml"),
        "name: broken\nnodes: {a: {kind: nope}}\n",
    )
    .unwrap();
    std::fs::write(workflows.join("gate.test.yaml"), "not: a workflow\n").unwrap();
    let (child, base, said) = spawn(dir.path(), &workflows, &fixtures.join("serve/mock.yaml"), args, env);
    // The workflow that does not validate is reported and not served; the test file is no
    // workflow at all.
    assert!(said.contains("not served:") && said.contains("broken.yaml"), "{said}");
    assert!(said.contains("serving chat, fan, gate, memo, shout, slow\n"), "{said}");
    Server {
        child,
        base,
        dir: Some(dir),
    }
}

/// Starts `runner serve WORKFLOWS --mock MOCK` in `cwd` on a free port, its checkpoints in
/// `cwd/runner.db`: the child, its base URL and what it said before listening (the rest of its
/// stderr is drained so it never blocks).
pub(crate) fn spawn(
    cwd: &Path,
    workflows: &Path,
    mock: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Child, String, String) {
    let mock = mock.to_str().unwrap();
    let args: Vec<&str> = ["--mock", mock].iter().chain(args).copied().collect();
    spawn_live(cwd, workflows, &args, env)
}

/// [`spawn`] without a mock: the workflows' models are called as they say.
pub(crate) fn spawn_live(cwd: &Path, workflows: &Path, args: &[&str], env: &[(&str, &str)]) -> (Child, String, String) {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(cwd)
        .env("RUNNER_DB", cwd.join("runner.db"))
        .arg("serve")
        .arg(workflows)
        .args(["--port", "0"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    let base = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("runner serve ended before listening:\n{said}");
        }
        said.push_str(&line);
        if let Some(url) = line.trim().strip_prefix("listening on ") {
            break url.to_string();
        }
    };
    drain("serve", stderr);
    (child, base, said)
}

/// Reads a child runner's standard error to its end, passing on what says it failed — a panic
/// (and the lines after it) or an error — to this test's own standard error, which the test
/// harness shows when the test fails: a server that fails mid-test is otherwise silent.
pub(crate) fn drain(who: &'static str, stderr: impl BufRead + Send + 'static) {
    std::thread::spawn(move || {
        let mut after_panic = 0u32;
        for line in stderr.lines() {
            let Ok(line) = line else { break };
            if line.contains("panicked at") {
                after_panic = 20;
            }
            if after_panic > 0 || line.contains(" ERROR ") {
                after_panic = after_panic.saturating_sub(1);
                eprintln!("[{who}] {line}");
            }
        }
    });
}

pub(crate) fn client() -> reqwest::Client {
    runner::net::client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// `method url` with an optional JSON body: the status and the body as JSON (`null` when
/// empty or not JSON).
pub(crate) async fn call_at(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut req = client().request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Waits (up to 20 s) until `GET path` on the server at `base` answers `status`.
pub(crate) async fn until_status(base: &str, path: &str, status: u16) {
    let started = std::time::Instant::now();
    loop {
        let (now, body) = call_at(reqwest::Method::GET, format!("{base}{path}"), None).await;
        if now == status {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{path}: {now} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `method path` with an optional JSON body: the status, the headers and the body as JSON
/// (`null` when empty).
pub(crate) async fn call(
    s: &Server,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = client().request(method, format!("{}{path}", s.base));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: not JSON: {text}"))
    };
    (status, headers, value)
}

#[tokio::test(flavor = "multi_thread")]
async fn statuses_and_error_shapes_are_the_reference_servers() {
    use reqwest::Method;
    let s = serve();
    assert_eq!(call(&s, Method::GET, "/ok", None).await.0, 200);
    assert_eq!(call(&s, Method::GET, "/info", None).await.0, 200);

    // An assistant by its graph id or its uuid5 id; a missing one is a 404 with a detail.
    let (status, _, a) = call(&s, Method::GET, "/assistants/gate", None).await;
    assert_eq!((status, a["graph_id"].as_str()), (200, Some("gate")));
    let by_uuid = format!("/assistants/{}", a["assistant_id"].as_str().unwrap());
    assert_eq!(call(&s, Method::GET, &by_uuid, None).await.2["graph_id"], "gate");
    let (status, _, e) = call(&s, Method::GET, "/assistants/broken", None).await;
    assert_eq!(
        (status, e["detail"].as_str()),
        (404, Some("Assistant 'broken' not found"))
    );
    let (_, _, graph) = call(&s, Method::GET, "/assistants/gate/graph", None).await;
    let ids: Vec<&str> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"__start__") && ids.contains(&"write") && ids.contains(&"review"),
        "{graph}"
    );
    assert!(
        graph["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["source"] == "write" && e["target"] == "review")
    );
    let (_, _, schemas) = call(&s, Method::GET, "/assistants/gate/schemas", None).await;
    assert_eq!(schemas["input_schema"]["required"], json!(["topic"]));
    assert!(schemas["state_schema"]["properties"]["draft"].is_object(), "{schemas}");

    // Threads: a duplicate id is a 409 unless `if_exists: do_nothing`; unknown ones 404.
    let (status, _, t) = call(
        &s,
        Method::POST,
        "/threads",
        Some(json!({"thread_id": "t1", "metadata": {"k": 1}})),
    )
    .await;
    assert_eq!((status, t["status"].as_str()), (200, Some("idle")));
    let again = json!({"thread_id": "t1"});
    let (status, _, e) = call(&s, Method::POST, "/threads", Some(again)).await;
    assert_eq!(status, 409, "{e}");
    assert!(e["detail"].is_string(), "{e}");
    let quiet = json!({"thread_id": "t1", "if_exists": "do_nothing"});
    assert_eq!(
        call(&s, Method::POST, "/threads", Some(quiet)).await.2["metadata"]["k"],
        1
    );
    for path in ["/threads/nope", "/threads/nope/state"] {
        let (status, _, e) = call(&s, Method::GET, path, None).await;
        assert_eq!(
            (status, e["detail"].as_str()),
            (404, Some("Thread with ID nope not found")),
            "{path}"
        );
    }
    let run = json!({"assistant_id": "gate", "input": {"topic": "x"}});
    assert_eq!(
        call(&s, Method::POST, "/threads/nope/runs/wait", Some(run)).await.0,
        404
    );
    let (status, _, e) = call(&s, Method::POST, "/threads/t1/runs/wait", Some(json!({"input": {}}))).await;
    assert_eq!(status, 422, "{e}");
    assert!(e["detail"].as_str().unwrap().contains("assistant_id"), "{e}");
    let bad_durability = json!({"assistant_id": "shout", "durability": "never"});
    assert_eq!(call(&s, Method::POST, "/runs/wait", Some(bad_durability)).await.0, 422);
    // Only the run's last checkpoint is written: the same values, a shorter history. The run
    // writes no checkpoint of its steps but the last (`say`'s, step 1, is missing); the turn's
    // input and start checkpoints (steps -1 and 0) are written as the run opens its thread
    // (the reference writes neither in this mode: an engine matter, not the server's).
    let exit =
        json!({"assistant_id": "shout", "input": {"word": "hello"}, "durability": "exit", "if_not_exists": "create"});
    let (status, _, v) = call(&s, Method::POST, "/threads/ex/runs/wait", Some(exit)).await;
    assert_eq!((status, &v), (200, &json!({"said": "hello there"})));
    let (_, _, history) = call(&s, Method::GET, "/threads/ex/history", None).await;
    let steps: Vec<&Value> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &h["metadata"]["step"])
        .collect();
    assert_eq!(steps, [&json!(2), &json!(0), &json!(-1)], "{history}");
    let bad_mode = json!({"assistant_id": "gate", "stream_mode": "valuez"});
    assert_eq!(
        call(&s, Method::POST, "/threads/t1/runs/stream", Some(bad_mode))
            .await
            .0,
        422
    );
    // Input the workflow's input schema refuses.
    let (status, _, e) = call(
        &s,
        Method::POST,
        "/runs/wait",
        Some(json!({"assistant_id": "gate", "input": {}})),
    )
    .await;
    assert_eq!(status, 422, "{e}");
    assert!(e["detail"].as_str().unwrap().contains("topic"), "{e}");
    for path in ["/threads/t1/runs/nope", "/threads/t1/runs/nope/join"] {
        let (status, _, e) = call(&s, Method::GET, path, None).await;
        assert_eq!(
            (status, e["detail"].as_str()),
            (404, Some("Run nope not found")),
            "{path}"
        );
    }
    let rollback = "/threads/t1/runs/nope/cancel?action=rollback";
    assert_eq!(call(&s, Method::POST, rollback, None).await.0, 404);
    let unknown = "/threads/t1/runs/nope/cancel?action=explode";
    assert_eq!(call(&s, Method::POST, unknown, None).await.0, 422);
    let (status, _, e) = call(&s, Method::GET, "/no/such/route", None).await;
    assert_eq!((status, e["detail"].as_str()), (404, Some("Not Found")));

    // Search pages with the reference's headers.
    for id in ["t2", "t3"] {
        call(
            &s,
            Method::POST,
            "/threads",
            Some(json!({"thread_id": id, "metadata": {"k": 1}})),
        )
        .await;
    }
    let page = json!({"metadata": {"k": 1}, "limit": 2});
    let (_, headers, found) = call(&s, Method::POST, "/threads/search", Some(page)).await;
    assert_eq!(found.as_array().unwrap().len(), 2);
    assert_eq!(headers["x-pagination-total"], "3");
    assert_eq!(headers["x-pagination-next"], "2");

    assert_eq!(call(&s, Method::DELETE, "/threads/t2", None).await.0, 204);
    assert_eq!(call(&s, Method::GET, "/threads/t2", None).await.0, 404);
    assert_eq!(call(&s, Method::DELETE, "/threads/t2", None).await.0, 404);

    // CORS: a preflight is answered with the private-network grant; responses expose
    // `content-location`.
    let preflight = client()
        .request(Method::OPTIONS, format!("{}/threads", s.base))
        .header("origin", "http://localhost:3000")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type,x-api-key")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 200);
    let h = preflight.headers();
    assert_eq!(h["access-control-allow-origin"], "*");
    assert_eq!(h["access-control-allow-private-network"], "true");
    assert_eq!(h["access-control-allow-headers"], "content-type,x-api-key");
    let (_, headers, _) = call(&s, Method::GET, "/ok", None).await;
    assert!(
        headers["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .contains("content-location")
    );
}

/// The raw bytes of a streamed run: CRLF framing, `metadata` first, the interrupt in
/// `updates` and in the last `values`, and a failed run's `error` event last.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_is_framed_as_the_reference_frames_it() {
    let s = serve();
    let resp = client()
        .post(format!("{}/threads/t1/runs/stream", s.base))
        .json(&json!({"assistant_id": "gate", "input": {"topic": "tides"}, "stream_mode": ["values", "updates", "tasks"], "if_not_exists": "create"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream; charset=utf-8");
    let location = resp.headers()["content-location"].to_str().unwrap().to_string();
    assert!(location.starts_with("/threads/t1/runs/"), "{location}");
    let body = resp.text().await.unwrap();
    assert!(body.starts_with("event: metadata\r\ndata: {\"run_id\":"), "{body}");
    let events = parse(&body);
    assert!(
        events
            .iter()
            .any(|(e, d)| e == "updates" && d["write"]["draft"] == "first draft"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(e, d)| e == "updates" && d["__interrupt__"].is_array())
    );
    // `tasks`: the task's start, then its result (its writes, by key).
    let tasks: Vec<&Value> = events.iter().filter(|(e, _)| e == "tasks").map(|(_, d)| d).collect();
    assert_eq!(tasks[0]["name"], "write", "{tasks:?}");
    assert!(
        tasks[0].get("result").is_none() && tasks[0]["triggers"].is_array(),
        "{tasks:?}"
    );
    assert_eq!(tasks[1]["id"], tasks[0]["id"]);
    assert_eq!(
        tasks[1]["result"],
        json!({"draft": "first draft", "log": ["write"]}),
        "{tasks:?}"
    );
    let (last, data) = events.last().unwrap();
    assert_eq!(last, "values");
    assert_eq!(data["__interrupt__"][0]["value"]["payload"]["draft"], "first draft");
    // The run's end was recorded before the stream closed.
    let run = client().get(format!("{}{location}", s.base)).send().await.unwrap();
    assert_eq!(run.json::<Value>().await.unwrap()["status"], "success");

    let failed = client()
        .post(format!("{}/runs/stream", s.base))
        .json(&json!({"assistant_id": "shout", "input": {"word": "boom"}}))
        .send()
        .await
        .unwrap();
    assert!(failed.headers()["location"].to_str().unwrap().starts_with("/runs/"));
    let events = parse(&failed.text().await.unwrap());
    let (last, data) = events.last().unwrap();
    assert_eq!(last, "error", "{events:?}");
    assert!(data["message"].as_str().unwrap().contains("no reply"), "{data}");
    assert!(data["error"].is_string(), "{data}");
    // A stateless run's thread is its own: deleted once the run ends (unless
    // `on_completion: keep`).
    let kept = client()
        .post(format!("{}/runs/wait", s.base))
        .json(&json!({"assistant_id": "shout", "input": {"word": "hello"}, "on_completion": "keep"}))
        .send()
        .await
        .unwrap();
    let kept_thread = kept.headers()["content-location"].to_str().unwrap().to_string();
    assert!(kept_thread.starts_with("/runs/"), "{kept_thread}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Value = client()
            .post(format!("{}/threads/search", s.base))
            .json(&json!({"metadata": {"graph_id": "shout"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if found.as_array().unwrap().len() == 1 {
            assert_eq!(found[0]["values"]["said"], "hello there", "{found}");
            break;
        }
        assert!(Instant::now() < deadline, "stateless threads left behind: {found}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `(event, data)` of every event of an SSE body framed with CRLF.
pub(crate) fn parse(body: &str) -> Vec<(String, Value)> {
    body.split("\r\n\r\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut lines = e.split("\r\n");
            let event = lines.next().unwrap().strip_prefix("event: ").unwrap().to_string();
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            (event, serde_json::from_str(data).unwrap())
        })
        .collect()
}

/// A second run on a thread a run holds, with `multitask_strategy: reject`, is refused with 409
/// before any byte is streamed: the server's runs take the thread lease as the CLI's do. A run
/// that names no strategy is queued (`enqueue`, the reference's default).
#[tokio::test(flavor = "multi_thread")]
async fn a_second_run_on_a_busy_thread_is_a_conflict() {
    let s = serve();
    let first = client()
        .post(format!("{}/threads/busy/runs/stream", s.base))
        .json(&json!({"assistant_id": "slow", "if_not_exists": "create"}))
        .send()
        .await
        .unwrap();
    // The response has begun: the run holds the thread.
    assert_eq!(first.status(), 200);
    let first_run = first.headers()["content-location"].to_str().unwrap().to_string();
    let thread = client().get(format!("{}/threads/busy", s.base)).send().await.unwrap();
    assert_eq!(thread.json::<Value>().await.unwrap()["status"], "busy");
    let second = client()
        .post(format!("{}/threads/busy/runs/wait", s.base))
        .json(&json!({"assistant_id": "slow", "multitask_strategy": "reject"}))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 409);
    let detail = second.json::<Value>().await.unwrap();
    assert!(
        detail["detail"].as_str().unwrap().contains("already running"),
        "{detail}"
    );
    let strategy = client()
        .post(format!("{}/threads/busy/runs/wait", s.base))
        .json(&json!({"assistant_id": "slow", "multitask_strategy": "explode"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        strategy.status(),
        422,
        "a strategy that is none of LangGraph's is refused, not ignored"
    );
    // `enqueue` waits for the thread's lease: it runs once the first run has ended.
    let queued = tokio::spawn(
        client()
            .post(format!("{}/threads/busy/runs/wait", s.base))
            .json(&json!({"assistant_id": "slow", "multitask_strategy": "enqueue"}))
            .send(),
    );
    let events = parse(&first.text().await.unwrap());
    assert_eq!(events.last().unwrap().1["said"], "done", "{events:?}");
    let queued = queued.await.unwrap().unwrap();
    assert_eq!(queued.status(), 200);
    let queued_run = queued.headers()["content-location"].to_str().unwrap().to_string();
    assert_eq!(queued.json::<Value>().await.unwrap()["said"], "done");
    let runs: Value = client()
        .get(format!("{}/threads/busy/runs", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Newest first: the queued run, then the first, which named no strategy and so has the
    // default; the refused ones were never recorded.
    let statuses: Vec<(String, &str, &str)> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                format!("/threads/busy/runs/{}", r["run_id"].as_str().unwrap()),
                r["multitask_strategy"].as_str().unwrap(),
                r["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [(queued_run, "enqueue", "success"), (first_run, "enqueue", "success")],
        "{runs}"
    );
    // Once the first run ended, the thread takes another.
    let third = client()
        .post(format!("{}/threads/busy/runs/wait", s.base))
        .json(&json!({"assistant_id": "slow"}))
        .send()
        .await
        .unwrap();
    assert_eq!(third.status(), 200);
}

/// The Python interpreter of a venv holding `tests/sdk/requirements.txt`, created once per
/// target directory. Parallel test processes take turns through a lock directory; a venv is
/// used only once its marker says it holds exactly these requirements.
pub(crate) fn sdk_python() -> &'static Path {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PYTHON.get_or_init(make_venv) {
        Ok(p) => p,
        Err(e) => panic!("the Python SDK test client could not be installed: {e}"),
    }
}

/// Runs an SDK script: it must exit 0 and say `passed` (the line it prints once every check
/// held); else everything it printed is the failure.
pub(crate) fn script_passes(cmd: &mut Command, passed: &str) {
    let out = cmd.output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the script failed:\n{said}");
    assert!(said.contains(passed), "{said}");
}

fn make_venv() -> Result<PathBuf, String> {
    install::venv(
        "sdk-venv",
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/requirements.txt"),
    )
}

/// LangGraph's Python client drives the server through a whole conversation: assistants,
/// threads, streamed and waited runs, state, interrupt and resume, history, search, errors.
#[test]
fn the_python_sdk_drives_the_server() {
    let python = sdk_python();
    let s = serve();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/drive.py");
    script_passes(Command::new(python).arg(script).arg(&s.base), "sdk: every check passed");
}

/// A client that goes away cancels its run at once, as the API's cancel does (its running task
/// dropped, its write lost, the thread waiting for that node), unless it asked for the run to
/// go on (`on_disconnect: continue`, as agent-chat-ui does); either way the run's end is
/// recorded.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_cancels_its_run_unless_it_said_continue() {
    let s = serve();
    let mut runs = Vec::new();
    for (thread, on_disconnect) in [("gone", "cancel"), ("stays", "continue")] {
        let resp = client()
            .post(format!("{}/threads/{thread}/runs/stream", s.base))
            .json(&json!({"assistant_id": "slow", "if_not_exists": "create", "on_disconnect": on_disconnect}))
            .send()
            .await
            .unwrap();
        runs.push((thread, resp.headers()["content-location"].to_str().unwrap().to_string()));
        // The response is dropped unread: the client went away during the first step.
        drop(resp);
    }
    for (thread, run) in runs {
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            let r: Value = client()
                .get(format!("{}{run}", s.base))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if r["status"] != "running" && r["status"] != "pending" {
                break r["status"].clone();
            }
            assert!(Instant::now() < deadline, "{thread}: the run never ended");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let state: Value = client()
            .get(format!("{}/threads/{thread}/state", s.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if thread == "gone" {
            assert_eq!(status, "interrupted");
            // Gone during `tick`'s model call (a second long): `tick` never wrote.
            assert_eq!(
                (&state["values"]["said"], &state["next"]),
                (&json!(""), &json!(["tick"]))
            );
            let thread: Value = client()
                .get(format!("{}/threads/{thread}", s.base))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(thread["status"], "interrupted", "{thread}");
        } else {
            assert_eq!(status, "success");
            assert_eq!((&state["values"]["said"], &state["next"]), (&json!("done"), &json!([])));
        }
    }
}

/// SIGTERM: the server stops accepting, lets a running run reach its next step boundary (its
/// checkpoint intact), ends the stream, and exits 0; the next server on the database continues
/// the run to its end.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_runs_at_a_step_boundary_and_exits() {
    let mut s = serve();
    let resp = client()
        .post(format!("{}/threads/t/runs/stream", s.base))
        .json(&json!({"assistant_id": "slow", "if_not_exists": "create", "stream_mode": "values"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let run = resp.headers()["content-location"].to_str().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let events = parse(&resp.text().await.unwrap());
    // The first step ended; the second never started.
    assert_eq!(events.last().unwrap().1, json!({"said": "half"}), "{events:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");

    let s = serve_in(s.dir.take().unwrap(), &[], &[]);
    let (_, _, joined) = call(&s, reqwest::Method::GET, &format!("{run}/join"), None).await;
    assert_eq!(joined, json!({"said": "done"}));
    assert_eq!(call(&s, reqwest::Method::GET, &run, None).await.2["status"], "success");
}

/// `tests/fixtures/serve/slow.yaml` on an OpenAI-compatible server: its model calls can be
/// counted there.
const SLOW_LIVE: &str = r#"name: live
models: {default: {provider: openai, model: m, base_url: "${env:FAKE_BASE}", api_key_env: FAKE_KEY}}
state:
  said: {type: string, default: ""}
nodes:
  tick:
    kind: llm
    prompt: {text: "Take your time"}
    update: {said: output}
  tock:
    kind: llm
    prompt: {text: "Take your time again"}
    update: {said: output}
edges: [START -> tick -> tock -> END]
"#;

/// `runner serve` over [`SLOW_LIVE`] in `dir` (on the database a server before left there),
/// its model served by `llm`.
fn serve_live(dir: tempfile::TempDir, llm: &FakeLlm, args: &[&str]) -> Server {
    let workflows = dir.path().join("workflows");
    let _ = std::fs::create_dir(&workflows);
    std::fs::write(workflows.join("live.yaml"), SLOW_LIVE).unwrap();
    let env = [("FAKE_BASE", llm.base_url.as_str()), ("FAKE_KEY", "k")];
    let (child, base, said) = spawn_live(dir.path(), &workflows, args, &env);
    assert!(said.contains("serving live\n"), "{said}");
    Server {
        child,
        base,
        dir: Some(dir),
    }
}

/// How many calls `llm` got for each of [`SLOW_LIVE`]'s nodes: `(tick, tock)`.
fn calls(llm: &FakeLlm) -> (usize, usize) {
    let prompts: Vec<String> = llm.requests().iter().map(|r| r.body["messages"].to_string()).collect();
    let tock = prompts.iter().filter(|p| p.contains("Take your time again")).count();
    (prompts.len() - tock, tock)
}

/// Waits (at most 30 s) until every run of `runs` (`(thread, run)`) has ended: their statuses.
async fn ended(s: &Server, runs: &[(String, String)]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut statuses = Vec::new();
        for (thread, run) in runs {
            let (_, _, row) = call(s, reqwest::Method::GET, &format!("/threads/{thread}/runs/{run}"), None).await;
            statuses.push(row["status"].as_str().unwrap_or("missing").to_string());
        }
        if statuses.iter().all(|s| s != "pending" && s != "running") {
            return statuses;
        }
        assert!(Instant::now() < deadline, "the runs never ended: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM with runs in the background that nobody streams: the server stops accepting, each
/// running run finishes the model call it is in and checkpoints its step, and only then does
/// the server exit (0). The runs stay unfinished in the store, a run queued behind another
/// `pending`, and the next server on the database continues each where it stopped: every
/// model call is made exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_waits_for_background_runs_so_no_model_call_is_made_twice() {
    let llm = FakeLlm::start_in_background();
    llm.default_reply(Reply::completion("said").after(Duration::from_millis(1500)));
    let mut s = serve_live(tempfile::tempdir().unwrap(), &llm, &[]);
    let mut runs = Vec::new();
    for i in 0..4 {
        let thread = format!("bg{i}");
        let (status, _, run) = call(
            &s,
            reqwest::Method::POST,
            &format!("/threads/{thread}/runs"),
            Some(json!({"assistant_id": "live", "if_not_exists": "create"})),
        )
        .await;
        assert_eq!(status, 200, "{run}");
        runs.push((thread, run["run_id"].as_str().unwrap().to_string()));
    }
    let (status, _, queued) = call(
        &s,
        reqwest::Method::POST,
        "/threads/bg0/runs",
        Some(json!({"assistant_id": "live", "input": {}, "multitask_strategy": "enqueue"})),
    )
    .await;
    assert_eq!(status, 200, "{queued}");
    runs.push(("bg0".into(), queued["run_id"].as_str().unwrap().to_string()));
    // Every first call is under way: the server is stopped in the middle of them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls(&llm).0 < 4 {
        assert!(Instant::now() < deadline, "the runs never called their model");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, _) = s.term();
    assert!(status.success(), "{status:?}");
    // Stopped at the step boundary: no run started its second call.
    assert_eq!(calls(&llm), (4, 0));

    let s = serve_live(s.dir.take().unwrap(), &llm, &[]);
    assert_eq!(ended(&s, &runs).await, ["success"; 5]);
    // One call per node and run: the four stopped runs' second calls, then the queued run's two.
    assert_eq!(calls(&llm), (5, 5));
    for i in 0..4 {
        let (_, _, history) = call(
            &s,
            reqwest::Method::GET,
            &format!("/threads/bg{i}/history?limit=100"),
            None,
        )
        .await;
        let steps: Vec<i64> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["metadata"]["step"].as_i64().unwrap())
            .collect();
        // One checkpoint per step: the turn's input (-1) and start (0), tick's (1), tock's (2).
        // bg0 has a second turn after it: the queued run's.
        assert_eq!(steps[steps.len() - 4..], [2, 1, 0, -1], "bg{i}: {steps:?}");
        assert_eq!(steps.len() > 4, i == 0, "bg{i}: {steps:?}");
    }
}

/// Past `--shutdown-timeout` the server stops waiting and exits. The run it left in the middle
/// of a model call held its thread's lease only as long as the process lived: a server started
/// again on the same host resumes it at once, not once the lease (60 s here) has expired.
#[tokio::test(flavor = "multi_thread")]
async fn past_the_shutdown_timeout_the_server_exits_and_a_restart_resumes_at_once() {
    let llm = FakeLlm::start_in_background();
    // The first call outlasts the timeout by far; the rest are answered at once.
    llm.script([Reply::completion("said").after(Duration::from_secs(20))]);
    llm.default_reply(Reply::completion("said"));
    let mut s = serve_live(
        tempfile::tempdir().unwrap(),
        &llm,
        &["--shutdown-timeout", "0.5", "--lease-ttl", "60"],
    );
    let (status, _, run) = call(
        &s,
        reqwest::Method::POST,
        "/threads/cut/runs",
        Some(json!({"assistant_id": "live", "if_not_exists": "create"})),
    )
    .await;
    assert_eq!(status, 200, "{run}");
    let run = ("cut".to_string(), run["run_id"].as_str().unwrap().to_string());
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls(&llm).0 < 1 {
        assert!(Instant::now() < deadline, "the run never called its model");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, took) = s.term();
    assert!(status.success(), "{status:?}");
    assert!(
        took < Duration::from_secs(10),
        "the server waited {took:?} for a 20 s call"
    );

    let restarted = Instant::now();
    let s = serve_live(s.dir.take().unwrap(), &llm, &[]);
    while calls(&llm).0 < 2 {
        assert!(
            restarted.elapsed() < Duration::from_secs(20),
            "no call after {:?}: the lease of the server that exited is being waited out",
            restarted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ended(&s, &[run]).await, ["success"]);
    // The call cut short is made again: the timeout gave up on it.
    assert_eq!(calls(&llm), (2, 1));
}

/// A run the server starts is a child of the span of the HTTP request that started it: the
/// request, the run, its steps and its model calls are one trace.
#[tokio::test(flavor = "multi_thread")]
async fn a_served_run_is_a_child_of_its_requests_span() {
    let (served, spans) = super::trace::receiver();
    let endpoint = format!("http://{}", served.addr);
    let mut s = serve_with(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]);
    let (status, _, values) = call(
        &s,
        reqwest::Method::POST,
        "/threads/traced/runs/wait",
        Some(json!({"assistant_id": "shout", "if_not_exists": "create", "input": {"word": "hey"}})),
    )
    .await;
    assert_eq!(status, 200, "{values}");
    // SIGTERM: the server exports what it buffered as it ends.
    let termed = Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(termed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spans = spans.lock().unwrap().clone();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let run = spans
        .iter()
        .find(|s| s.name == "run shout")
        .unwrap_or_else(|| panic!("no run span in {names:?}"));
    let request = spans
        .iter()
        .find(|p| p.id == run.parent)
        .unwrap_or_else(|| panic!("the run span has no parent in {names:?}"));
    assert_eq!(request.attrs["url.path"], "/threads/traced/runs/wait", "{request:?}");
    assert_eq!(request.attrs["http.request.method"], "POST", "{request:?}");
    assert_eq!(run.trace, request.trace);
    assert!(
        spans.iter().any(|c| c.name.starts_with("step ") && c.parent == run.id),
        "{names:?}"
    );
}

/// With `--api-key-env`, every request but the open paths (`/ok`, `/info`, the Studio page) and
/// CORS preflights needs the key, as
/// `x-api-key` or `Authorization: Bearer`; without it, no address but loopback is accepted.
#[tokio::test(flavor = "multi_thread")]
async fn an_api_key_guards_every_route_but_the_open_ones() {
    let s = serve_with(&["--api-key-env", "SERVE_TEST_KEY"], &[("SERVE_TEST_KEY", "sesame")]);
    let get = |path: &str, header: Option<(&'static str, &'static str)>| {
        let mut req = client().get(format!("{}{path}", s.base));
        if let Some((name, value)) = header {
            req = req.header(name, value);
        }
        async move { req.send().await.unwrap() }
    };
    assert_eq!(get("/ok", None).await.status(), 200);
    // The page's files hold nothing of the server's; a POST to the page's paths is no read.
    assert_eq!(get("/", None).await.status(), 200);
    assert_eq!(get("/studio/assets/studio.js", None).await.status(), 200);
    let posted = client().post(format!("{}/studio/x", s.base)).send().await.unwrap();
    assert_eq!(posted.status(), 401);
    assert_eq!(get("/info", None).await.status(), 200);
    let refused = get("/metrics", None).await;
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["access-control-allow-origin"], "*");
    assert!(refused.json::<Value>().await.unwrap()["detail"].is_string());
    assert_eq!(get("/metrics", Some(("x-api-key", "wrong"))).await.status(), 401);
    assert_eq!(get("/metrics", Some(("x-api-key", "sesame"))).await.status(), 200);
    assert_eq!(
        get("/metrics", Some(("authorization", "Bearer sesame"))).await.status(),
        200
    );
    let preflight = client()
        .request(reqwest::Method::OPTIONS, format!("{}/threads", s.base))
        .header("origin", "http://localhost:3000")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 200);

    let open = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(open.status.code(), Some(2));
    let said = String::from_utf8_lossy(&open.stderr);
    assert!(said.contains("without credentials (--api-key-env"), "{said}");
}

/// A run created with `stream_resumable` is joined from its start (`Last-Event-ID: -1`) or after
/// the last event a client saw, its events numbered from 1; joining with no id reads only what
/// comes next.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumable_run_is_rejoined_with_last_event_id() {
    let s = serve();
    let created: Value = client()
        .post(format!("{}/threads/j/runs", s.base))
        .json(
            &json!({"assistant_id": "slow", "if_not_exists": "create", "stream_resumable": true,
                       "stream_mode": ["values", "updates"]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = format!(
        "{}/threads/j/runs/{}/stream",
        s.base,
        created["run_id"].as_str().unwrap()
    );
    let join = |last: Option<&'static str>| {
        let mut req = client().get(&url);
        if let Some(id) = last {
            req = req.header("last-event-id", id);
        }
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.headers()["content-type"], "text/event-stream; charset=utf-8");
            resp.text().await.unwrap()
        }
    };
    // Joined while it runs: every event from the first, then live to the end.
    let all = join(Some("-1")).await;
    let events: Vec<&str> = all
        .split("\r\n\r\n")
        .filter(|e| !e.starts_with(':') && !e.is_empty())
        .collect();
    assert!(events[0].starts_with("event: metadata\r\ndata: {\"run_id\":"), "{all}");
    for (i, e) in events.iter().enumerate() {
        assert!(e.ends_with(&format!("\r\nid: {}", i + 1)), "event {i}: {e}");
    }
    assert!(events.last().unwrap().contains("\"said\":\"done\""), "{all}");
    // After the second event: the same events from the third on.
    let rest = join(Some("2")).await;
    let again: Vec<&str> = rest
        .split("\r\n\r\n")
        .filter(|e| !e.starts_with(':') && !e.is_empty())
        .collect();
    assert_eq!(again, events[2..]);
    // The run has ended: nothing comes next.
    assert_eq!(join(None).await, "");
    let bad = client().get(&url).header("last-event-id", "x").send().await.unwrap();
    assert_eq!(bad.status(), 422);
}

/// A run's input goes through the state's reducers (agent-chat-ui sends one new message and
/// expects it appended to the history), and `threads.update_state` writes as a node, through
/// the reducers too, answering the checkpoint it made.
#[tokio::test(flavor = "multi_thread")]
async fn input_and_state_updates_go_through_the_reducers() {
    let s = serve();
    let (status, _, thread) = call(&s, reqwest::Method::POST, "/threads", Some(json!({}))).await;
    assert_eq!(status, 200, "{thread}");
    let id = thread["thread_id"].as_str().unwrap().to_string();
    let runs = format!("/threads/{id}/runs/wait");
    for word in ["hi", "again"] {
        let input = json!({"assistant_id": "chat", "input": {"messages": [{"type": "human", "content": word}]}});
        let (status, _, out) = call(&s, reqwest::Method::POST, &runs, Some(input)).await;
        assert_eq!(status, 200, "{out}");
    }
    let contents = |state: &Value| -> Vec<String> {
        state["values"]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    let path = format!("/threads/{id}/state");
    let (_, _, state) = call(&s, reqwest::Method::GET, &path, None).await;
    assert_eq!(contents(&state), ["hi", "echo: hi", "again", "echo: again"]);
    let edit = json!({"values": {"messages": [{"role": "user", "content": "edited"}]}, "as_node": "reply"});
    let (status, _, made) = call(&s, reqwest::Method::POST, &path, Some(edit)).await;
    assert_eq!(status, 200, "{made}");
    let (_, _, state) = call(&s, reqwest::Method::GET, &path, None).await;
    assert_eq!(contents(&state), ["hi", "echo: hi", "again", "echo: again", "edited"]);
    assert_eq!(
        state["checkpoint"]["checkpoint_id"],
        made["checkpoint"]["checkpoint_id"]
    );
    let bad = json!({"values": {"nope": 1}, "as_node": "reply"});
    let (status, _, err) = call(&s, reqwest::Method::POST, &path, Some(bad)).await;
    assert_eq!(status, 422, "{err}");
}

/// Runs `tests/sdk/durable.py` against `s` with `args`.
fn durable_py(s: &Server, args: &[String]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/durable.py");
    script_passes(
        Command::new(sdk_python()).arg(script).arg(&s.base).args(args),
        "durable: every check passed",
    );
}

/// The `id:` of each frame of an SSE body, and the `values` events' data.
fn ids_and_values(body: &str) -> (Vec<u64>, Vec<Value>) {
    let mut ids = Vec::new();
    let mut values = Vec::new();
    for frame in body.split("\r\n\r\n").filter(|f| !f.starts_with(':') && !f.is_empty()) {
        let field = |name: &str| frame.lines().find_map(|l| l.strip_prefix(name).map(str::to_string));
        if let Some(id) = field("id: ") {
            ids.push(id.parse().unwrap());
        }
        if field("event: ").as_deref() == Some("values") {
            values.push(serde_json::from_str(&field("data: ").unwrap()).unwrap());
        }
    }
    (ids, values)
}

/// Runs outlive the server: killed outright (SIGKILL) in the middle of two background runs
/// with a third queued behind one of them, a server started again on the same database resumes
/// all three. Each ends once (success), no node that had finished runs again (one checkpoint
/// per step), a client that lost its stream rejoins it from `Location` with `Last-Event-ID` and
/// reads the resumed run's events (their ids after every id it saw), and the SDK's `runs.join`
/// gets each run's result.
#[tokio::test(flavor = "multi_thread")]
async fn runs_outlive_a_killed_server_and_end_exactly_once() {
    sdk_python();
    let mut s = serve();
    let mut runs = Vec::new();
    for thread in ["d1", "d2"] {
        let (status, _, run) = call(
            &s,
            reqwest::Method::POST,
            &format!("/threads/{thread}/runs"),
            Some(json!({"assistant_id": "slow", "if_not_exists": "create", "stream_resumable": true})),
        )
        .await;
        assert_eq!(status, 200, "{run}");
        runs.push((thread.to_string(), run["run_id"].as_str().unwrap().to_string()));
    }
    // Queued behind d1's run: its request waits (and is cut off by the kill), its row pending.
    let queued = {
        let url = format!("{}/threads/d1/runs", s.base);
        tokio::spawn(async move {
            let body = json!({"assistant_id": "slow", "input": {}, "multitask_strategy": "enqueue"});
            let _ = client().post(url).json(&body).send().await;
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let pending = loop {
        let (_, _, listed) = call(&s, reqwest::Method::GET, "/threads/d1/runs", None).await;
        if let Some(p) = listed.as_array().unwrap().iter().find(|r| r["status"] == "pending") {
            break p["run_id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "the queued run was never recorded: {listed}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    runs.push(("d1".into(), pending));

    // A client reads d1's stream up to the end of its first step; then the server dies.
    let (d1_run, location) = (&runs[0].1, format!("/threads/d1/runs/{}/stream", runs[0].1));
    let mut stream = client()
        .get(format!("{}{location}", s.base))
        .header("last-event-id", "-1")
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("\"said\":\"half\"") {
        let chunk = stream
            .chunk()
            .await
            .unwrap()
            .expect("the stream ended before the first step did");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, state) = call(&s, reqwest::Method::GET, "/threads/d2/state", None).await;
        if state["values"]["said"] == "half" {
            break;
        }
        assert!(Instant::now() < deadline, "d2's first step never ended: {state}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (seen_ids, _) = ids_and_values(&seen);
    let last_seen = *seen_ids.last().unwrap();
    // Thread metadata set through the API is stored too: a thread's, and a thread never run.
    let patch = json!({"metadata": {"kept": true}});
    assert_eq!(
        call(&s, reqwest::Method::PATCH, "/threads/d2", Some(patch)).await.0,
        200
    );
    let idle = json!({"thread_id": "idle", "metadata": {"who": "me"}});
    assert_eq!(call(&s, reqwest::Method::POST, "/threads", Some(idle)).await.0, 200);
    let dir = s.kill9();
    let _ = queued.await;

    let s = serve_in(dir, &[], &[]);
    let (_, _, d2) = call(&s, reqwest::Method::GET, "/threads/d2", None).await;
    assert_eq!(
        (&d2["metadata"]["kept"], &d2["metadata"]["graph_id"]),
        (&json!(true), &json!("slow")),
        "{d2}"
    );
    let (status, _, idle) = call(&s, reqwest::Method::GET, "/threads/idle", None).await;
    assert_eq!((status, &idle["metadata"]["who"]), (200, &json!("me")), "{idle}");
    let rejoined = client()
        .get(format!("{}{location}", s.base))
        .header("last-event-id", last_seen.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(rejoined.status(), 200);
    let (ids, values) = ids_and_values(&rejoined.text().await.unwrap());
    assert!(
        ids.first().is_some_and(|first| *first > last_seen),
        "{ids:?} after {last_seen}"
    );
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    assert_eq!(values.last(), Some(&json!({"said": "done"})), "{values:?}");

    let pairs: Vec<String> = runs.iter().map(|(t, r)| format!("{t}:{r}")).collect();
    let args: Vec<String> = std::iter::once("join".to_string()).chain(pairs).collect();
    durable_py(&s, &args);

    // One checkpoint per step: the turn's input (-1) and start (0), tick's (step 1, made once,
    // before the kill) and tock's (step 2, once, after it). d1 has a second turn (the queued
    // run), after the first one's.
    let steps = |thread: &'static str| {
        let s = &s;
        async move {
            let (_, _, history) = call(
                s,
                reqwest::Method::GET,
                &format!("/threads/{thread}/history?limit=100"),
                None,
            )
            .await;
            history
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["metadata"]["step"].as_i64().unwrap())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(steps("d2").await, [2, 1, 0, -1]);
    let d1 = steps("d1").await;
    assert_eq!(d1[d1.len() - 4..], [2, 1, 0, -1], "{d1:?}");
    let (_, _, listed) = call(&s, reqwest::Method::GET, "/threads/d1/runs", None).await;
    let statuses: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["success", "success"], "{listed} ({d1_run})");
}

/// The run controls through the SDK: cancel with `action=rollback`, `multitask_strategy`
/// `interrupt` and `rollback`, deleting runs (see `tests/sdk/durable.py`).
#[test]
fn the_python_sdk_interrupts_rolls_back_and_deletes_runs() {
    let s = serve();
    durable_py(&s, &["controls".to_string()]);
}
