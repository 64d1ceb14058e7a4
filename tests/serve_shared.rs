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

use super::serve::{Server, client, drain, parse, spawn};
use super::support::postgres;

/// The served test workflows, in a temporary folder.
fn workflows() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::create_dir(dir.path().join("workflows")).unwrap();
    std::fs::copy(fixtures.join("gate.yaml"), dir.path().join("workflows/gate.yaml")).unwrap();
    for name in ["chat.yaml", "slow.yaml", "fan.yaml", "brief.yaml"] {
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

/// A `runner worker`, killed when dropped.
pub(crate) struct Worker(Child);

impl Worker {
    /// Starts `cmd` (a `runner worker …`) and waits until it says it is working.
    pub(crate) fn start(cmd: Command) -> Worker {
        Worker::start_saying(cmd, "working:").0
    }

    /// [`Worker::start`], with the rest of the first line it said that starts with `prefix`.
    fn start_saying(mut cmd: Command, prefix: &str) -> (Worker, String) {
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let (mut said, mut found) = (String::new(), None);
        loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                let _ = child.kill();
                panic!("runner worker ended before working:\n{said}");
            }
            said.push_str(&line);
            if found.is_none() {
                found = line.trim().strip_prefix(prefix).map(str::to_string);
            }
            if line.starts_with("working:") {
                break;
            }
        }
        drain("worker", stderr);
        let found = found.unwrap_or_else(|| panic!("runner worker did not say `{prefix}`:\n{said}"));
        (Worker(child), found)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(dir: &Path, db: &str) -> Worker {
    worker_of_ttl(dir, db, "1")
}

/// A `runner worker` whose leases and heartbeat live `ttl` seconds.
fn worker_of_ttl(dir: &Path, db: &str, ttl: &str) -> Worker {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
    cmd.current_dir(dir)
        .args(["worker", "workflows", "--db", db, "--lease-ttl", ttl, "--workers", "8"])
        .arg("--mock")
        .arg(mock());
    Worker::start(cmd)
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

/// The body of `GET base+path`, as text.
async fn text(base: &str, path: &str) -> String {
    client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
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

/// Creates a run of `assistant` in the background on thread `thread` (created if need be)
/// through `base`, with `input`: its id.
async fn create(base: &str, thread: &str, assistant: &str, input: Value) -> String {
    let (status, body) = post(
        base,
        &format!("/threads/{thread}/runs"),
        json!({"assistant_id": assistant, "if_not_exists": "create", "input": input}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    run_id(&body)
}

/// The run id of a created run's answer.
fn run_id(body: &str) -> String {
    let run: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    run["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no run_id: {body}"))
        .to_string()
}

async fn stream(base: &str, path: &str, last: Option<&str>) -> String {
    let mut req = client().get(format!("{base}{path}"));
    if let Some(id) = last {
        req = req.header("Last-Event-ID", id);
    }
    req.send().await.unwrap().text().await.unwrap()
}

/// What the database recorded of a run that did not succeed: its error.
fn why(db: &str, run: &Value) -> Result<Vec<Vec<Option<String>>>, String> {
    let id = run["run_id"].as_str().unwrap_or_default().replace('\'', "");
    postgres::query(db, &format!("SELECT status, error FROM runs WHERE run_id = '{id}'"))
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
        let run = run_id(&body);
        let path = format!("/threads/t2/runs/{run}/stream");
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
        let ended = ended(&b.base, "t2", &run).await;
        assert_eq!(ended["status"], "success", "{ended}");
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
        let cancelled = run_id(&body);
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
            .post(format!("{}/threads/t3/runs/{cancelled}/cancel?wait=1", b.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(asked.elapsed() < Duration::from_secs(1), "{:?}", asked.elapsed());
        let run = get(&a.base, &format!("/threads/t3/runs/{cancelled}")).await;
        assert_eq!(run["status"], "interrupted", "{run}");
        // `interrupt` through one server stops the run another started, then runs its own.
        let (_, body) = post(
            &a.base,
            "/threads/t3/runs",
            json!({"assistant_id": "slow", "input": {}}),
        )
        .await;
        let first = run_id(&body);
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

/// A rollback asked twice at once, through two servers, of a run a worker executes: done once
/// (a second rollback would find the thread's lease the first took), both answered once it is,
/// and the run is gone for every server, never seen ended in between.
#[test]
fn a_rollback_asked_twice_at_once_is_done_once_and_the_run_is_gone() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let (a, b) = (api(dir.path(), &db), api(dir.path(), &db));
    let _w = worker(dir.path(), &db);
    rt().block_on(async {
        for round in 0..3 {
            let thread = format!("r{round}");
            let (_, body) = post(
                &a.base,
                &format!("/threads/{thread}/runs"),
                json!({"assistant_id": "slow", "if_not_exists": "create", "input": {}}),
            )
            .await;
            let run = run_id(&body);
            let started = Instant::now();
            while get(&a.base, &format!("/threads/{thread}/runs/{run}")).await["status"] != "running" {
                assert!(started.elapsed() < Duration::from_secs(30), "run {run} never ran");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let cancel = |base: &str| {
                client()
                    .post(format!(
                        "{base}/threads/{thread}/runs/{run}/cancel?wait=1&action=rollback"
                    ))
                    .send()
            };
            let (x, y) = tokio::join!(cancel(&a.base), cancel(&b.base));
            for r in [x.unwrap(), y.unwrap()] {
                let status = r.status();
                assert!(status.is_success(), "{status}: {}", r.text().await.unwrap());
            }
            for base in [&a.base, &b.base] {
                let r = client()
                    .get(format!("{base}/threads/{thread}/runs/{run}"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 404, "{}", r.text().await.unwrap());
                assert_eq!(get(base, &format!("/threads/{thread}/runs")).await, json!([]));
            }
        }
    });
}

/// A run whose clients read whole steps only (`values`, the default) has its tasks' starts
/// logged by a commit (the turn's or the step's) rather than by writes of their own, when the
/// step ends soon enough (a 10 ms model call); its first step's start, which shows what the
/// run starts from, is written with the turn's commit (one write and one notice tell a reader
/// that the run started and what from), before the step's.
#[test]
fn a_runs_events_nobody_reads_as_they_come_are_logged_with_its_step() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let a = api(dir.path(), &db);
    let _w = worker(dir.path(), &db);
    let run = rt().block_on(async {
        let (status, body) = post(
            &a.base,
            "/threads/v/runs/wait",
            json!({"assistant_id": "brief", "if_not_exists": "create", "input": {}}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["said"], "thought");
        let runs = get(&a.base, "/threads/v/runs").await;
        runs[0]["run_id"].as_str().unwrap().to_string()
    });
    let rows = postgres::query(
        &db,
        &format!("SELECT xmin::text, body::json->>'type' FROM run_events WHERE run_id = '{run}' ORDER BY seq"),
    )
    .unwrap();
    let kinds: Vec<(String, String)> = rows
        .into_iter()
        .map(|r| (r[0].clone().unwrap_or_default(), r[1].clone().unwrap_or_default()))
        .collect();
    let xmin_of = |kind: &str| {
        kinds
            .iter()
            .find(|(_, k)| k == kind)
            .map(|(x, _)| x.clone())
            .unwrap_or_else(|| panic!("no {kind}: {kinds:?}"))
    };
    // The first step's start, with the turn's commit, before the step's.
    assert_eq!(xmin_of("step_start"), xmin_of("run_start"), "{kinds:?}");
    assert_ne!(xmin_of("step_start"), xmin_of("step_end"), "{kinds:?}");
    // The tasks' starts: with the commit of the turn (while it is under way: the step runs
    // beside it), with the step's start or with the step's commit, never each alone.
    let commits = [xmin_of("run_start"), xmin_of("step_end"), xmin_of("step_start")];
    for kind in ["node_start", "model_start"] {
        assert!(
            commits.contains(&xmin_of(kind)),
            "{kind} written apart from the commits: {kinds:?}"
        );
    }
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
        let run_id = run_id(&body);
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

/// A run that carries a command (`goto`, `update`) executes on a worker under the lease its
/// claim took: the command writes under it and the run goes on under it (agent-chat-ui's
/// "Mark as Resolved" sends `goto: END` at a gate).
#[test]
fn a_command_run_on_a_worker_writes_under_its_claims_lease() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let a = api(dir.path(), &db);
    let _w = worker(dir.path(), &db);
    rt().block_on(async {
        let (status, body) = post(
            &a.base,
            "/threads/t5/runs/wait",
            json!({"assistant_id": "gate", "if_not_exists": "create", "input": {"topic": "x"}}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let state = get(&a.base, "/threads/t5/state").await;
        assert_eq!(state["next"], json!(["review"]), "{state}");
        for command in [json!({"update": {"draft": "edited"}}), json!({"goto": "__end__"})] {
            let (status, body) = post(
                &a.base,
                "/threads/t5/runs",
                json!({"assistant_id": "gate", "command": command}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            let run = ended(&a.base, "t5", &run_id(&body)).await;
            assert_eq!(run["status"], "success", "{command}: {run}: {:?}", why(&db, &run));
        }
        let state = get(&a.base, "/threads/t5/state").await;
        assert_eq!(state["values"]["draft"], "edited", "{state}");
        assert_eq!(state["next"], json!([]), "{state}");
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

/// The chaos test: three workers (one with a pool of two connections for its eight runs at
/// once, so it waits for connections all along, the one started in its place too), two servers
/// of the API only, and fifty threads that fan out to three slow model calls, stop at a gate
/// answered through the other server, and finish with one more call: a hundred runs. Meanwhile
/// a worker picked at random is killed outright every second or two and another started,
/// every connection of runner's is terminated once (`pg_terminate_backend`), PostgreSQL is
/// restarted once, and once every connection the server takes is taken, so that it refuses new
/// ones for a while. Each of these happens while runs are in flight. Every run ends once, with
/// what one process alone makes of it; no task whose end was logged runs again; every stream
/// reads back with its ids in order, without a gap or a repeat.
#[test]
fn runs_end_once_with_their_single_process_result_while_workers_die_and_the_database_restarts() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    const THREADS: usize = 50;
    let pg = postgres::Server::start();
    let db = pg.fresh_url();
    let dir = workflows();
    std::fs::write(
        dir.path().join("workflows/chaos.yaml"),
        r#"name: chaos
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {items: {type: array}}}
state:
  done: {type: array, reducer: append, default: []}
  verdict: {type: string, default: ""}
nodes:
  work:
    kind: llm
    prompt: {text: "Work on {{ item }}"}
    update: {done: "[item ~ ':' ~ output]"}
  review:
    kind: interrupt
    message: "Accept?"
    response: {type: object, required: [action], properties: {action: {type: string}}}
    update: {verdict: output.action}
  finish:
    kind: llm
    prompt: {text: "Finish"}
    update: {verdict: "state.verdict ~ '+' ~ output"}
edges:
  - {from: START, send: {to: work, foreach: "input['items']", as: item}}
  - work -> review
  - review -> finish
  - finish -> END
"#,
    )
    .unwrap();
    let script = dir.path().join("chaos.mock.yaml");
    std::fs::write(
        &script,
        "match:\n  - {contains: \"Work on\", reply: {text: ok, delay: 0.4}}\n  - {contains: \"Finish\", reply: {text: fin, delay: 0.3}}\n",
    )
    .unwrap();
    let spawn_worker = |db: &str| -> Worker {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
        cmd.current_dir(dir.path())
            .args(["worker", "workflows", "--db", db, "--lease-ttl", "1", "--workers", "8"])
            .arg("--mock")
            .arg(&script);
        Worker::start(cmd)
    };
    let starved = format!("{db}&pool_size=2");
    // Each worker with its database URL: one killed is replaced by one on the same URL.
    let workers = Arc::new(Mutex::new(
        [db.clone(), db.clone(), starved]
            .into_iter()
            .map(|url| (spawn_worker(&url), url))
            .collect::<Vec<_>>(),
    ));
    let api_on = |db: &str| {
        let (child, base, _) = spawn(
            dir.path(),
            &dir.path().join("workflows"),
            &script,
            &["--db", db, "--workers", "0", "--lease-ttl", "1"],
            &[],
        );
        Server { child, base, dir: None }
    };
    let (a, b) = (api_on(&db), api_on(&db));
    let done = Arc::new(AtomicBool::new(false));
    // Threads whose runs are under way: started, not yet checked to the end.
    let in_flight = Arc::new(AtomicUsize::new(0));
    // The victims are random; the seed is told with what went wrong.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let chaos = {
        let (workers, done, in_flight, admin) = (workers.clone(), done.clone(), in_flight.clone(), pg.admin_url());
        let pg = &pg;
        move || {
            let mut faults = Faults::default();
            let (mut round, mut random) = (0u64, seed);
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(500));
                round += 1;
                let flying = in_flight.load(Ordering::SeqCst);
                match round {
                    2 => {
                        let terminated = postgres::query(
                            &admin,
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                             WHERE application_name LIKE 'runner%' AND pid <> pg_backend_pid()",
                        )
                        .unwrap();
                        let n: usize = terminated[0][0].as_deref().unwrap().parse().unwrap();
                        faults.terminated = Some((n, flying));
                    }
                    4 => {
                        pg.restart();
                        faults.restarted = Some(flying);
                    }
                    6 => faults.exhausted = Some((exhaust(&admin, Duration::from_millis(1500)), flying)),
                    _ => {}
                }
                // And a worker killed outright every round.
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                let mut w = workers.lock().unwrap();
                let victim = (random % w.len() as u64) as usize;
                let _ = w[victim].0.0.kill();
                let _ = w[victim].0.0.wait();
                if in_flight.load(Ordering::SeqCst) > 0 {
                    faults.kills_in_flight += 1;
                }
                let url = w[victim].1.clone();
                w[victim].0 = spawn_worker(&url);
            }
            faults
        }
    };
    // The chaos stops however the runs end (an assertion that fails among them included).
    struct Stop(Arc<AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let ended = std::thread::scope(|scope| {
        let faults = scope.spawn(chaos);
        let stop = Stop(done.clone());
        let ended = rt().block_on(async {
            let mut runs = Vec::new();
            for i in 0..THREADS {
                let (a, b, db, in_flight) = (a.base.clone(), b.base.clone(), db.clone(), in_flight.clone());
                runs.push(tokio::spawn(async move {
                    // Started over eight seconds, so the chaos meets runs at every stage.
                    tokio::time::sleep(Duration::from_millis(160 * i as u64)).await;
                    in_flight.fetch_add(1, Ordering::SeqCst);
                    let thread = format!("c{i}");
                    let (status, body) = post(
                        &a,
                        &format!("/threads/{thread}/runs"),
                        json!({"assistant_id": "chaos", "if_not_exists": "create",
                               "input": {"items": ["a", "b", "c"]},
                               "stream_mode": ["updates"], "stream_resumable": true}),
                    )
                    .await;
                    assert_eq!(status, 200, "{body}");
                    let first = run_id(&body);
                    let run = ended(&b, &thread, &first).await;
                    assert_eq!(run["status"], "success", "{run}: {:?}", why(&db, &run));
                    // The gate, answered through the other server.
                    let (status, body) = post(
                        &b,
                        &format!("/threads/{thread}/runs"),
                        json!({"assistant_id": "chaos", "command": {"resume": {"action": "yes"}},
                               "stream_mode": ["updates"], "stream_resumable": true}),
                    )
                    .await;
                    assert_eq!(status, 200, "{body}");
                    let second = run_id(&body);
                    let run = ended(&a, &thread, &second).await;
                    assert_eq!(run["status"], "success", "{run}: {:?}", why(&db, &run));
                    let state = get(&a, &format!("/threads/{thread}/state")).await;
                    // What one process alone makes of the thread.
                    assert_eq!(
                        (&state["values"]["done"], &state["values"]["verdict"]),
                        (&json!(["a:ok", "b:ok", "c:ok"]), &json!("yes+fin")),
                        "{thread}: {state}"
                    );
                    for (run_id, server) in [(&first, &b), (&second, &a)] {
                        let body = stream(server, &format!("/threads/{thread}/runs/{run_id}/stream"), Some("-1")).await;
                        let ids: Vec<u64> = body
                            .lines()
                            .filter_map(|l| l.strip_prefix("id: "))
                            .map(|id| id.parse().unwrap())
                            .collect();
                        assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{thread}: {body}");
                        assert!(!ids.is_empty(), "{thread}: {body}");
                    }
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    (thread, first, second)
                }));
            }
            let mut ended = Vec::new();
            for run in runs {
                ended.push(run.await.unwrap());
            }
            ended
        });
        drop(stop);
        let faults = faults.join().unwrap();
        eprintln!("chaos: {faults:?}, seed {seed}");
        // Every fault landed while runs were under way.
        let (terminated, flying) = faults.terminated.expect("no connection was terminated");
        assert!(
            terminated > 0 && flying > 0,
            "terminated {terminated} with {flying} threads in flight"
        );
        let flying = faults.restarted.expect("PostgreSQL was not restarted");
        assert!(flying > 0, "PostgreSQL restarted with no thread in flight");
        let (refused, flying) = faults.exhausted.expect("the server's connections were not exhausted");
        assert!(
            refused && flying > 0,
            "exhausted: refused {refused}, {flying} threads in flight"
        );
        assert!(
            faults.kills_in_flight >= 4,
            "{} workers killed while runs were under way (seed {seed})",
            faults.kills_in_flight
        );
        ended
    });
    // From the event logs: each run ended once, and no task whose end was logged ran again
    // (a task resumed from its stored result ends as `cached`).
    let rows = postgres::query(
        &db,
        "SELECT r.thread_id, e.run_id, e.body FROM run_events e JOIN runs r USING (run_id)",
    )
    .unwrap();
    let mut ends: std::collections::HashMap<String, usize> = Default::default();
    let mut finished: std::collections::HashMap<(String, String), usize> = Default::default();
    let mut ended_tasks: std::collections::HashSet<(String, String)> = Default::default();
    for row in rows {
        let (thread, run_id, body) = (
            row[0].clone().unwrap(),
            row[1].clone().unwrap(),
            row[2].clone().unwrap(),
        );
        let event: Value = serde_json::from_str(&body).unwrap();
        match event["type"].as_str() {
            Some("__end__" | "__failed__") => *ends.entry(run_id).or_default() += 1,
            Some("node_end") if event.get("outcome").is_none() => {
                let task = (thread, event["task_id"].as_str().unwrap().to_string());
                if event["cached"] == false {
                    *finished.entry(task.clone()).or_default() += 1;
                }
                // A task whose worker died before logging its end is told as ended from its
                // stored result (`cached`) by the run that resumes it.
                ended_tasks.insert(task);
            }
            _ => {}
        }
    }
    for (thread, first, second) in &ended {
        for run in [first, second] {
            assert_eq!(
                ends.get(run),
                Some(&1),
                "{thread}: run {run} ended {:?} times",
                ends.get(run)
            );
        }
    }
    let twice: Vec<_> = finished.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "tasks that finished and ran again: {twice:?}");
    // Three work tasks, the gate's answer and the finish, in every thread, each told as ended:
    // a step's events are committed with its checkpoint, so none is lost with a worker killed
    // the moment after the commit.
    assert_eq!(
        ended_tasks.len(),
        THREADS * 5,
        "tasks told as ended of {}: {ended_tasks:?}",
        THREADS * 5
    );
}

/// What the chaos did, and how many threads had runs under way when it did.
#[derive(Debug, Default)]
struct Faults {
    /// Connections terminated, threads in flight.
    terminated: Option<(usize, usize)>,
    /// Threads in flight.
    restarted: Option<usize>,
    /// Whether the server refused a connection, threads in flight.
    exhausted: Option<(bool, usize)>,
    kills_in_flight: usize,
}

/// Takes every connection the PostgreSQL server at `admin` accepts (its superuser may take
/// them all), holds them for `hold`, then lets them go. True if the server refused one (too
/// many clients): for that while, no process could open a connection.
fn exhaust(admin: &str, hold: Duration) -> bool {
    rt().block_on(async {
        let mut held = Vec::new();
        let refused = loop {
            match tokio_postgres::connect(admin, tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    held.push(client);
                }
                Err(e) => break e.as_db_error().is_some_and(|e| e.code().code() == "53300"),
            }
            assert!(held.len() < 1000, "the server takes connections without end");
        };
        tokio::time::sleep(hold).await;
        drop(held);
        refused
    })
}

/// Creating a run through a server of the API only takes one round trip to the database: its
/// admission, which reads the thread's record, stamps it with the run's graph and assistant
/// (its other keys kept) and writes it, checks the thread is idle, writes the run's row and
/// the notice, in one statement. No worker runs: the run waits in line, its reader waiting for
/// a notice without reading. The fewest sends of a few runs are counted: a server's own polls
/// (crons, webhooks) may fall in one run's window, never in all of them. A thread that does
/// not exist is still a 404, and a busy one a 409 with `reject`.
#[test]
fn a_run_is_admitted_through_an_api_server_in_one_round_trip() {
    let dir = workflows();
    let (relayed, sends) = super::checkpoint::counted_url(&postgres::fresh_url());
    let server = api(dir.path(), relayed.as_str());
    rt().block_on(async {
        let mut fewest = usize::MAX;
        let run = json!({"assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "hi"}]},
                         "multitask_strategy": "reject"});
        let mut thread = String::new();
        for i in 0..6 {
            let (status, body) = post(&server.base, "/threads", json!({"metadata": {"topic": "x"}})).await;
            assert_eq!(status, 200, "{body}");
            let made: Value = serde_json::from_str(&body).unwrap();
            thread = made["thread_id"].as_str().unwrap().to_string();
            let before = sends.load(std::sync::atomic::Ordering::SeqCst);
            let (status, body) = post(&server.base, &format!("/threads/{thread}/runs"), run.clone()).await;
            let sent = sends.load(std::sync::atomic::Ordering::SeqCst) - before;
            assert_eq!(status, 200, "{body}");
            // The first run prepares the statements on the connection.
            if i > 0 {
                fewest = fewest.min(sent);
            }
        }
        assert_eq!(fewest, 1, "round trips to admit a run");
        let record = get(&server.base, &format!("/threads/{thread}")).await;
        assert_eq!(record["metadata"]["topic"], "x", "{record}");
        assert_eq!(record["metadata"]["graph_id"], "chat", "{record}");
        assert!(record["metadata"]["assistant_id"].is_string(), "{record}");
        // Its run waits in line: another with `reject` is refused.
        let (status, body) = post(&server.base, &format!("/threads/{thread}/runs"), run.clone()).await;
        assert_eq!(status, 409, "{body}");
        let (status, body) = post(&server.base, "/threads/nobody/runs", run.clone()).await;
        assert_eq!(status, 404, "{body}");
    });
}

/// A value of a metric in Prometheus's text: the first sample whose name and labels are
/// `series`.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn a_worker_answers_probes_and_metrics_on_its_own_port_and_any_process_tells_the_queues_depth() {
    let pg = postgres::Server::start();
    let db = pg.fresh_url();
    let dir = workflows();
    let a = api(dir.path(), &db);
    rt().block_on(async {
        // Two runs and no worker yet: pending, as every process's metrics tell.
        for t in ["d1", "d2"] {
            create(
                &a.base,
                t,
                "chat",
                json!({"messages": [{"role": "user", "content": t}]}),
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let m = text(&a.base, "/metrics").await;
        assert_eq!(sample(&m, "runner_database_up"), Some(1.0), "{m}");
        assert_eq!(sample(&m, r#"runner_queue_runs{status="pending"}"#), Some(2.0), "{m}");
        assert_eq!(sample(&m, r#"runner_queue_runs{status="running"}"#), Some(0.0), "{m}");
        assert_eq!(sample(&m, "runner_queue_workers"), Some(0.0), "{m}");
        let waited = sample(&m, "runner_queue_oldest_pending_seconds").unwrap();
        assert!((0.2..30.0).contains(&waited), "{m}");
    });

    // A worker with a port of its own for its probes and its metrics.
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
    cmd.current_dir(dir.path())
        .args(["worker", "workflows", "--db", &db, "--lease-ttl", "1", "--port", "0"])
        .arg("--mock")
        .arg(mock());
    let (_w, ops) = Worker::start_saying(cmd, "health and metrics on ");
    rt().block_on(async {
        for t in ["d1", "d2"] {
            let runs = get(&a.base, &format!("/threads/{t}/runs")).await;
            let run_id = runs[0]["run_id"].as_str().unwrap().to_string();
            assert_eq!(ended(&a.base, t, &run_id).await["status"], "success");
        }
        let (ok, checked) = (
            get(&ops, "/ok").await,
            client().get(format!("{ops}/ok?check_db=1")).send().await.unwrap(),
        );
        assert_eq!(ok, json!({"ok": true}));
        assert_eq!(checked.status(), 200);
        // The worker's own runs, and the same depth as any process sees.
        let m = text(&ops, "/metrics").await;
        assert_eq!(sample(&m, r#"runner_runs_total{status="success"}"#), Some(2.0), "{m}");
        assert_eq!(sample(&m, r#"runner_queue_runs{status="pending"}"#), Some(0.0), "{m}");
        assert_eq!(sample(&m, "runner_queue_oldest_pending_seconds"), Some(0.0), "{m}");
        assert_eq!(sample(&m, "runner_queue_workers"), Some(1.0), "{m}");
        // Streams and step timings are an API server's: not a worker's.
        assert_eq!(sample(&m, "runner_active_streams"), None, "{m}");
        // Nothing else is served there.
        let other = client().get(format!("{ops}/threads/d1")).send().await.unwrap();
        assert_eq!(other.status(), 404);
    });

    // The database down: the probe that checks it says so, and so does the scrape.
    pg.halt();
    rt().block_on(async {
        let checked = client().get(format!("{ops}/ok?check_db=1")).send().await.unwrap();
        assert_eq!(checked.status(), 503);
        let (unchecked, m) = (
            client().get(format!("{ops}/ok")).send().await.unwrap().status(),
            text(&ops, "/metrics").await,
        );
        assert_eq!(unchecked, 200);
        assert_eq!(sample(&m, "runner_database_up"), Some(0.0), "{m}");
        assert_eq!(sample(&m, r#"runner_queue_runs{status="pending"}"#), None, "{m}");
    });
}

/// Workers given different folders (a pool for some workflows, or a deploy that has reached
/// some workers and not others): each claims the runs of the workflows it serves, and a run
/// of a workflow none of the running workers serves waits for one that does — it does not
/// fail on a worker that lacks it.
#[test]
fn a_worker_claims_only_the_runs_of_the_workflows_it_serves() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let a = api(dir.path(), &db);
    // A worker of one workflow, `chat`.
    let light = tempfile::tempdir().unwrap();
    std::fs::create_dir(light.path().join("workflows")).unwrap();
    std::fs::copy(
        dir.path().join("workflows/chat.yaml"),
        light.path().join("workflows/chat.yaml"),
    )
    .unwrap();
    let _light = worker(light.path(), &db);
    let fan = rt().block_on(async {
        let fan = create(&a.base, "f1", "fan", json!({"items": [{"name": "x"}]})).await;
        // Created after it, executed before it: the worker serves `chat`.
        let (status, body) = post(
            &a.base,
            "/threads/c1/runs/wait",
            json!({"assistant_id": "chat", "if_not_exists": "create",
                   "input": {"messages": [{"role": "user", "content": "hi"}]}}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(600)).await;
        let run = get(&a.base, &format!("/threads/f1/runs/{fan}")).await;
        assert_eq!(run["status"], "pending", "{run}: {:?}", why(&db, &run));
        fan
    });
    // A worker that serves it takes it.
    let _all = worker(dir.path(), &db);
    rt().block_on(async {
        let run = ended(&a.base, "f1", &fan).await;
        assert_eq!(run["status"], "success", "{run}: {:?}", why(&db, &run));
        let state = get(&a.base, "/threads/f1/state").await;
        assert_eq!(state["values"]["done"], json!(["x"]), "{state}");
    });
}

/// The database out of reach for longer than a call keeps trying (the URL's `retry_for`; a
/// managed database failing over takes a minute or two) while a run executes: the run did not
/// fail, its store did, so once the database is back it is resumed from its last checkpoint and
/// ends as it would have — not left `running` under a worker that no longer executes it, its
/// thread busy for good.
#[test]
fn a_run_cut_off_from_the_database_longer_than_its_calls_retry_goes_on_once_it_is_back() {
    let pg = postgres::Server::start();
    let plain = pg.fresh_url();
    let db = format!("{plain}&retry_for=1s");
    let dir = workflows();
    let a = api(dir.path(), &db);
    let _w = worker(dir.path(), &db);
    let run = rt().block_on(async {
        let run = create(&a.base, "s1", "slow", Value::Null).await;
        let started = Instant::now();
        while get(&a.base, &format!("/threads/s1/runs/{run}")).await["status"] != "running" {
            assert!(started.elapsed() < Duration::from_secs(10), "the run did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        run
    });
    // A client reading the run's stream through the API server all along.
    let reader = {
        let (base, path) = (a.base.clone(), format!("/threads/s1/runs/{run}/stream"));
        std::thread::spawn(move || rt().block_on(stream(&base, &path, None)))
    };
    std::thread::sleep(Duration::from_millis(200));
    // Down while `tick` waits for its model: its step's commit, the run's end and every other
    // call give up meanwhile.
    pg.halt();
    let halted = Instant::now();
    // Meanwhile the API server says the database is out of reach for now, and when to ask again.
    let answer = rt().block_on(async { client().get(format!("{}/threads/s1", a.base)).send().await.unwrap() });
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["retry-after"], "5");
    std::thread::sleep(Duration::from_secs(4).saturating_sub(halted.elapsed()));
    pg.resume();
    rt().block_on(async {
        let ended = ended(&a.base, "s1", &run).await;
        assert_eq!(ended["status"], "success", "{ended}: {:?}", why(&plain, &ended));
        let state = get(&a.base, "/threads/s1/state").await;
        assert_eq!(state["values"]["said"], "done", "{state}");
    });
    // The stream waited the outage out and read the run to its end, with no error.
    // (Kept open meanwhile by heartbeats.)
    let body = reader.join().unwrap().replace(": heartbeat\r\n\r\n", "");
    let events = parse(&body);
    assert!(events.iter().all(|(e, _)| e != "error"), "{body}");
    assert_eq!(
        events.last().map(|(_, d)| d["said"].clone()),
        Some(json!("done")),
        "{body}"
    );
    // Its log tells one end, the run's success: the execution cut off logged no failure.
    let told = postgres::query(
        &plain,
        "SELECT string_agg(body::jsonb ->> 'type' || ':' || coalesce(body::jsonb ->> 'status', ''), ',' ORDER BY seq) \
         FROM run_events WHERE body::jsonb ->> 'type' IN ('error', 'run_end', '__end__', '__failed__')",
    )
    .unwrap();
    assert_eq!(told[0][0].as_deref(), Some("run_end:done,__end__:"), "{told:?}");
}

/// A relay on loopback to `target` standing for a database that fails over once: the first
/// answer from the server that holds `at` is dropped, every connection through the relay is
/// broken with it, and new ones are refused for `down_for`; then it relays again. Its port, and
/// whether it has failed.
fn failing_over_once(
    target: std::net::SocketAddr,
    at: &'static [u8],
    down_for: Duration,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    #[derive(Default)]
    struct Outage {
        /// When the database is back (none: it has not failed).
        back: Option<Instant>,
        /// Every socket relayed.
        sockets: Vec<TcpStream>,
    }
    let state: Arc<Mutex<Outage>> = Arc::default();
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let told = failed.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            if state.lock().unwrap().back.is_some_and(|back| Instant::now() < back) {
                drop(client);
                continue;
            }
            let Ok(server) = TcpStream::connect(target) else {
                continue;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            state.lock().unwrap().sockets.extend([c, s]);
            let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(Shutdown::Both);
            });
            let (mut from, mut to, state, told) = (server, client, state.clone(), told.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    if buf[..n].windows(at.len()).any(|w| w == at) {
                        let mut state = state.lock().unwrap();
                        if state.back.is_none() {
                            state.back = Some(Instant::now() + down_for);
                            told.store(true, std::sync::atomic::Ordering::SeqCst);
                            for socket in state.sockets.drain(..) {
                                let _ = socket.shutdown(Shutdown::Both);
                            }
                            break;
                        }
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(Shutdown::Both);
            });
        }
    });
    (port, failed)
}

/// A worker's claim that committed and whose answer was lost, the database then out of reach
/// for longer than the call's retries (a managed database failing over), is made again by the
/// worker's next claim, the same claim: it finds its run and executes it. A new claim would
/// leave the run `running` under a claim nobody holds, kept from other workers by this one's
/// heartbeat, and its thread busy, for as long as the worker lives.
#[test]
fn a_claim_whose_answer_was_lost_in_a_failover_is_made_again_by_the_workers_next_claim() {
    let dir = workflows();
    let db = postgres::fresh_url();
    let a = api(dir.path(), &db);
    // The worker reaches the database through the relay, and gives a call 300 ms.
    let mut url = url::Url::parse(&db).unwrap();
    let target = std::net::ToSocketAddrs::to_socket_addrs(&(url.host_str().unwrap(), url.port().unwrap()))
        .unwrap()
        .next()
        .unwrap();
    // Only the claim's answer holds the run's metadata.
    let (port, failed) = failing_over_once(target, b"failover-marker-4e1c", Duration::from_secs(2));
    url.set_port(Some(port)).unwrap();
    url.query_pairs_mut().append_pair("retry_for", "300ms");
    // Its heartbeat outlives the outage: no other look would find the run.
    let _w = worker_of_ttl(dir.path(), url.as_str(), "30");
    rt().block_on(async {
        let (status, body) = post(
            &a.base,
            "/threads/f1/runs",
            json!({"assistant_id": "chat", "if_not_exists": "create",
                   "input": {"messages": [{"role": "user", "content": "hi"}]},
                   "metadata": {"mark": "failover-marker-4e1c"}}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let run = run_id(&body);
        let ended = ended(&a.base, "f1", &run).await;
        assert!(
            failed.load(std::sync::atomic::Ordering::SeqCst),
            "the claim's answer was not dropped"
        );
        assert_eq!(ended["status"], "success", "{ended}: {:?}", why(&db, &ended));
        let state = get(&a.base, "/threads/f1/state").await;
        assert_eq!(state["values"]["messages"].as_array().map(Vec::len), Some(2), "{state}");
    });
}

/// Three slow steps, `one` → `two` → `three`, each a model call of 0.6 s, in folder `dir`.
fn steps(dir: &Path) -> std::path::PathBuf {
    std::fs::write(
        dir.join("workflows/steps.yaml"),
        r#"name: steps
models: {default: {provider: mock, model: m}}
state:
  said: {type: array, reducer: append, default: []}
nodes:
  one: {kind: llm, prompt: {text: "Step one"}, update: {said: "[output]"}}
  two: {kind: llm, prompt: {text: "Step two"}, update: {said: "[output]"}}
  three: {kind: llm, prompt: {text: "Step three"}, update: {said: "[output]"}}
edges: [START -> one -> two -> three -> END]
"#,
    )
    .unwrap();
    let script = dir.join("steps.mock.yaml");
    std::fs::write(
        &script,
        "match:\n  - {contains: \"Step one\", reply: {text: a, delay: 0.6}}\n  - {contains: \"Step two\", reply: {text: b, delay: 0.6}}\n  - {contains: \"Step three\", reply: {text: c, delay: 0.6}}\n",
    )
    .unwrap();
    script
}

/// How many times each node of thread `thread` finished (not told from a stored result), by
/// the runs' logs.
fn finished_nodes(db: &str, thread: &str) -> std::collections::BTreeMap<String, usize> {
    let rows = postgres::query(
        db,
        &format!("SELECT e.body FROM run_events e JOIN runs r USING (run_id) WHERE r.thread_id = '{thread}'"),
    )
    .unwrap();
    let mut finished = std::collections::BTreeMap::new();
    for row in rows {
        let event: Value = serde_json::from_str(row[0].as_deref().unwrap()).unwrap();
        if event["type"] == "node_end" && event.get("outcome").is_none() && event["cached"] == false {
            *finished
                .entry(event["node"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    finished
}

/// A worker told to stop (SIGTERM) stops its run at the step boundary and hands it back: the
/// next worker goes on from the run's last checkpoint — the steps done are not run again, nor
/// is the run's input given again.
#[test]
fn a_run_a_stopping_worker_hands_back_goes_on_from_its_last_step_on_another() {
    let db = postgres::fresh_url();
    let dir = workflows();
    let script = steps(dir.path());
    let a = api(dir.path(), &db);
    let start = |db: &str| {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
        cmd.current_dir(dir.path())
            .args([
                "worker",
                "workflows",
                "--db",
                db,
                "--lease-ttl",
                "1",
                "--shutdown-timeout",
                "20",
            ])
            .arg("--mock")
            .arg(&script);
        Worker::start(cmd)
    };
    let mut first = start(&db);
    let run = rt().block_on(async {
        let run = create(&a.base, "h1", "steps", Value::Null).await;
        // `one` done, `two` under way.
        let started = Instant::now();
        while get(&a.base, "/threads/h1/state").await["values"]["said"] != json!(["a"]) {
            assert!(started.elapsed() < Duration::from_secs(10), "`one` did not end");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        run
    });
    // SAFETY: the worker is this test's child, not yet reaped.
    unsafe { libc::kill(first.0.id() as libc::pid_t, libc::SIGTERM) };
    let stopped = first.0.wait().unwrap();
    assert!(stopped.success(), "{stopped:?}");
    let _second = start(&db);
    rt().block_on(async {
        let ended = ended(&a.base, "h1", &run).await;
        assert_eq!(ended["status"], "success", "{ended}: {:?}", why(&db, &ended));
        let state = get(&a.base, "/threads/h1/state").await;
        assert_eq!(state["values"]["said"], json!(["a", "b", "c"]), "{state}");
    });
    let once: std::collections::BTreeMap<String, usize> = [("one", 1), ("two", 1), ("three", 1)]
        .map(|(n, k)| (n.to_string(), k))
        .into();
    assert_eq!(finished_nodes(&db, "h1"), once);
    // Handed back, not ended: the second worker's run went on from the first's checkpoint.
    let resumed = postgres::query(
        &db,
        "SELECT count(*) FROM run_events WHERE body::jsonb ->> 'type' = 'run_start' AND body::jsonb ->> 'resumed' = 'true'",
    )
    .unwrap();
    assert_eq!(resumed[0][0].as_deref(), Some("1"));
}

/// A database out of reach for longer than a call keeps trying holds up the calls that need
/// it, not the processes: with runs in flight on the worker, admissions waiting on the API
/// server and streams read through it, both still answer their probes at once, on two
/// runtime threads each; the streams' readers wait without a thread each; and everything goes
/// on once the database is back.
#[test]
fn an_api_server_and_a_worker_answer_at_once_while_their_database_is_out_of_reach() {
    const THREADS: (&str, &str) = ("TOKIO_WORKER_THREADS", "2");
    let pg = postgres::Server::start();
    // Calls keep trying for the default 20 s: longer than the outage.
    let db = pg.fresh_url();
    let dir = workflows();
    let script = steps(dir.path());
    let (child, base, _) = spawn(
        dir.path(),
        &dir.path().join("workflows"),
        &mock(),
        &["--db", &db, "--workers", "0", "--lease-ttl", "1"],
        &[THREADS],
    );
    let a = Server { child, base, dir: None };
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
    cmd.current_dir(dir.path())
        .env(THREADS.0, THREADS.1)
        .args([
            "worker",
            "workflows",
            "--db",
            &db,
            "--lease-ttl",
            "1",
            "--port",
            "0",
            "--workers",
            "12",
        ])
        .arg("--mock")
        .arg(&script);
    let (_w, ops) = Worker::start_saying(cmd, "health and metrics on ");
    let before: Vec<(String, String)> = rt().block_on(async {
        let mut runs = Vec::new();
        for i in 1..=12 {
            let t = format!("o{i}");
            let run = create(&a.base, &t, "steps", Value::Null).await;
            runs.push((t, run));
        }
        for (t, run) in &runs {
            let started = Instant::now();
            while get(&a.base, &format!("/threads/{t}/runs/{run}")).await["status"] != "running" {
                assert!(started.elapsed() < Duration::from_secs(10), "{run} did not start");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        runs
    });
    // A reader of each run's stream through the API server.
    let readers: Vec<_> = before
        .clone()
        .into_iter()
        .map(|(t, run)| {
            let base = a.base.clone();
            std::thread::spawn(move || rt().block_on(stream(&base, &format!("/threads/{t}/runs/{run}/stream"), None)))
        })
        .collect();
    let threads = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", a.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap_or(0)
    };
    std::thread::sleep(Duration::from_millis(300));
    let threads_before = threads();
    pg.halt();
    let halted = Instant::now();
    // Two runs asked for meanwhile: their admissions wait for the database.
    let asked: Vec<_> = ["o13", "o14"]
        .into_iter()
        .map(|t| {
            let base = a.base.clone();
            std::thread::spawn(move || rt().block_on(create(&base, t, "steps", Value::Null)))
        })
        .collect();
    let mut threads_most = 0;
    let slowest = rt().block_on(async {
        let mut slowest = Duration::ZERO;
        while halted.elapsed() < Duration::from_secs(4) {
            threads_most = threads_most.max(threads());
            for url in [format!("{}/ok", a.base), format!("{ops}/ok")] {
                let asked = Instant::now();
                let answer = client().get(&url).timeout(Duration::from_secs(3)).send().await;
                let took = asked.elapsed();
                assert!(
                    answer.as_ref().is_ok_and(|r| r.status() == 200),
                    "{url} after {took:?}, {:?} into the outage: {answer:?}",
                    halted.elapsed()
                );
                slowest = slowest.max(took);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        slowest
    });
    pg.resume();
    assert!(slowest < Duration::from_secs(1), "a probe took {slowest:?}");
    // Twelve readers waiting: a few threads more (the admissions'), not one a reader.
    assert!(
        threads_most < threads_before + 8,
        "the API server's threads: {threads_before} before the outage, {threads_most} during it"
    );
    let mut runs = before;
    runs.extend(
        asked
            .into_iter()
            .zip(["o13", "o14"])
            .map(|(h, t)| (t.to_string(), h.join().unwrap())),
    );
    rt().block_on(async {
        for (t, run) in &runs {
            let ended = ended(&a.base, t, run).await;
            assert_eq!(ended["status"], "success", "{ended}: {:?}", why(&db, &ended));
            let state = get(&a.base, &format!("/threads/{t}/state")).await;
            assert_eq!(state["values"]["said"], json!(["a", "b", "c"]), "{state}");
        }
    });
    for reader in readers {
        let body = reader.join().unwrap().replace(": heartbeat\r\n\r\n", "");
        let events = parse(&body);
        assert!(events.iter().all(|(e, _)| e != "error"), "{body}");
        assert_eq!(
            events.last().map(|(_, d)| d["said"].clone()),
            Some(json!(["a", "b", "c"])),
            "{body}"
        );
    }
}
