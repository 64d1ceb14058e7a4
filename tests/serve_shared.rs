//! Many runner processes on one PostgreSQL (a real server, started by the tests on loopback):
//! servers that serve the API only (`--workers 0`), `runner worker` processes that execute the
//! runs, a run created through one server and read, joined, cancelled or rejected through
//! another, and a worker killed outright whose run another worker resumes from its last
//! checkpoint.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::serve::{Server, client, parse, spawn};
use super::support::postgres;

/// The served test workflows, in a temporary folder.
fn workflows() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::create_dir(dir.path().join("workflows")).unwrap();
    std::fs::copy(fixtures.join("gate.yaml"), dir.path().join("workflows/gate.yaml")).unwrap();
    for name in ["chat.yaml", "slow.yaml", "fan.yaml"] {
        std::fs::copy(
            fixtures.join("serve").join(name),
            dir.path().join("workflows").join(name),
        )
        .unwrap();
    }
    dir
}

fn mock() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serve/mock.yaml")
}

/// A server of the API only on database `db`.
fn api(dir: &Path, db: &str) -> Server {
    let (child, base, _) = spawn(
        dir,
        &dir.join("workflows"),
        &mock(),
        &["--db", db, "--workers", "0", "--lease-ttl", "1"],
        &[],
    );
    Server { child, base, dir: None }
}

/// A `runner worker` on database `db`, killed when dropped.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(dir: &Path, db: &str) -> Worker {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir)
        .args(["worker", "workflows", "--db", db, "--lease-ttl", "1", "--workers", "8"])
        .arg("--mock")
        .arg(mock())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("runner worker ended before working:\n{said}");
        }
        said.push_str(&line);
        if line.starts_with("working:") {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    Worker(child)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn post(base: &str, path: &str, body: Value) -> (u16, String) {
    let r = client().post(format!("{base}{path}")).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn get(base: &str, path: &str) -> Value {
    client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn stream(base: &str, path: &str, last: Option<&str>) -> String {
    let mut req = client().get(format!("{base}{path}"));
    if let Some(id) = last {
        req = req.header("Last-Event-ID", id);
    }
    req.send().await.unwrap().text().await.unwrap()
}

/// Waits until run `run_id` of `thread_id` is no longer active, seen through `base`.
async fn ended(base: &str, thread_id: &str, run_id: &str) -> Value {
    let started = Instant::now();
    loop {
        let run = get(base, &format!("/threads/{thread_id}/runs/{run_id}")).await;
        if !matches!(run["status"].as_str(), Some("pending" | "running")) {
            return run;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "run {run_id} did not end: {run}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_run_created_through_one_server_executes_on_a_worker_and_streams_back() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let (a, b) = (api(dir.path(), &db), api(dir.path(), &db));
    let _w = worker(dir.path(), &db);
    rt().block_on(async {
        let (status, body) = post(
            &a.base,
            "/threads/t1/runs/stream",
            json!({"assistant_id": "chat", "if_not_exists": "create",
                   "input": {"messages": [{"role": "user", "content": "hi"}]},
                   "stream_mode": ["values", "updates"]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let events = parse(&body);
        let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(names, ["metadata", "values", "updates", "values"], "{body}");
        assert_eq!(events[2].1["reply"]["messages"][0]["content"], "echo: hi");
        // The other server reads the thread the worker wrote.
        let state = get(&b.base, "/threads/t1/state").await;
        assert_eq!(state["values"]["messages"][1]["content"], "echo: hi", "{state}");
        // A wait through the other server: the same worker pool runs it.
        let (status, body) = post(
            &b.base,
            "/threads/t1/runs/wait",
            json!({"assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "again"}]}}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let values: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(values["messages"][3]["content"], "echo: again", "{body}");
    });
}

#[test]
fn a_stream_is_joined_through_another_server_from_the_event_it_last_saw() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let (a, b) = (api(dir.path(), &db), api(dir.path(), &db));
    let _w = worker(dir.path(), &db);
    rt().block_on(async {
        let (status, body) = post(
            &a.base,
            "/threads/t2/runs",
            json!({"assistant_id": "slow", "if_not_exists": "create", "input": {},
                   "stream_mode": ["updates"], "stream_resumable": true}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let run: Value = serde_json::from_str(&body).unwrap();
        let run_id = run["run_id"].as_str().unwrap().to_string();
        let path = format!("/threads/t2/runs/{run_id}/stream");
        // The whole stream through one server, then the rest of it after its second event
        // through the other: the same ids, nothing lost, nothing twice.
        let whole = stream(&a.base, &path, Some("-1")).await;
        let ids: Vec<&str> = whole.lines().filter_map(|l| l.strip_prefix("id: ")).collect();
        assert_eq!(ids, ["1", "2", "3"], "{whole}");
        let rest = stream(&b.base, &path, Some("1")).await;
        let rest_ids: Vec<&str> = rest.lines().filter_map(|l| l.strip_prefix("id: ")).collect();
        assert_eq!(rest_ids, ["2", "3"], "{rest}");
        let updates: Vec<Value> = parse(&rest).into_iter().map(|(_, d)| d).collect();
        assert_eq!(
            updates,
            [json!({"tick": {"said": "half"}}), json!({"tock": {"said": "done"}})]
        );
        let run = ended(&b.base, "t2", &run_id).await;
        assert_eq!(run["status"], "success", "{run}");
    });
}

#[test]
fn a_busy_thread_is_refused_and_cancelled_through_any_server() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let (a, b) = (api(dir.path(), &db), api(dir.path(), &db));
    let _w = worker(dir.path(), &db);
    rt().block_on(async {
        let (_, body) = post(
            &a.base,
            "/threads/t3/runs",
            json!({"assistant_id": "slow", "if_not_exists": "create", "input": {}}),
        )
        .await;
        let run_id = serde_json::from_str::<Value>(&body).unwrap()["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        // Another server refuses a second run with `reject`, whoever holds the thread.
        let (status, body) = post(
            &b.base,
            "/threads/t3/runs",
            json!({"assistant_id": "slow", "input": {}, "multitask_strategy": "reject"}),
        )
        .await;
        assert_eq!(status, 409, "{body}");
        // Cancelled through the other server, at once.
        let asked = Instant::now();
        let r = client()
            .post(format!("{}/threads/t3/runs/{run_id}/cancel?wait=1", b.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(asked.elapsed() < Duration::from_secs(1), "{:?}", asked.elapsed());
        let run = get(&a.base, &format!("/threads/t3/runs/{run_id}")).await;
        assert_eq!(run["status"], "interrupted", "{run}");
        // `interrupt` through one server stops the run another started, then runs its own.
        let (_, body) = post(
            &a.base,
            "/threads/t3/runs",
            json!({"assistant_id": "slow", "input": {}}),
        )
        .await;
        let first = serde_json::from_str::<Value>(&body).unwrap()["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        let (status, body) = post(
            &b.base,
            "/threads/t3/runs/wait",
            json!({"assistant_id": "slow", "input": {}, "multitask_strategy": "interrupt"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["said"], "done");
        let run = get(&a.base, &format!("/threads/t3/runs/{first}")).await;
        assert_eq!(run["status"], "interrupted", "{run}");
    });
}

#[test]
fn a_killed_workers_run_is_resumed_by_another_without_running_a_finished_task_again() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let a = api(dir.path(), &db);
    let mut first = worker(dir.path(), &db);
    rt().block_on(async {
        let (_, body) = post(
            &a.base,
            "/threads/t4/runs",
            json!({"assistant_id": "slow", "if_not_exists": "create", "input": {},
                   "stream_mode": ["updates", "debug"], "stream_resumable": true}),
        )
        .await;
        let run_id = serde_json::from_str::<Value>(&body).unwrap()["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        // The first step takes a second: the worker dies in the second.
        let path = format!("/threads/t4/runs/{run_id}/stream");
        let started = Instant::now();
        loop {
            let state = get(&a.base, "/threads/t4/state").await;
            if state["values"]["said"] == "half" {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{state}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        first.0.kill().unwrap();
        first.0.wait().unwrap();
        let killed = Instant::now();
        let _second = worker(dir.path(), &db);
        let body = stream(&a.base, &path, Some("-1")).await;
        let run = ended(&a.base, "t4", &run_id).await;
        assert_eq!(run["status"], "success", "{run}");
        // Resumed after the lease expired (1 s), and well before LangGraph's sweeper would.
        assert!(killed.elapsed() < Duration::from_secs(10), "{:?}", killed.elapsed());
        let updates: Vec<Value> = parse(&body)
            .into_iter()
            .filter(|(e, _)| e == "updates")
            .map(|(_, d)| d)
            .collect();
        // `tick` finished before the kill: it ran once, and is not run again.
        assert_eq!(
            updates,
            [json!({"tick": {"said": "half"}}), json!({"tock": {"said": "done"}})],
            "{body}"
        );
        let state = get(&a.base, "/threads/t4/state").await;
        assert_eq!(state["values"]["said"], "done");
    });
}

#[test]
fn an_api_only_server_and_a_worker_need_a_shared_database() {
    let dir = workflows();
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir.path())
        .args([
            "serve",
            "workflows",
            "--workers",
            "0",
            "--port",
            "0",
            "--db",
            "local.db",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("--workers 0") && said.contains("PostgreSQL"), "{said}");
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir.path())
        .args(["worker", "workflows", "--db", "local.db"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("PostgreSQL"), "{said}");
}
