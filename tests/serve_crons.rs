//! Schedules and webhooks through the real binary: the LangGraph API's crons created and
//! changed through LangGraph's Python client, fired by the scheduler of two servers on one
//! database (SQLite, and PostgreSQL through the run queue) once per tick — the scheduler's time
//! read from a file the test moves forward (`--clock-file`), never waited for —, missed ticks,
//! `end_time`, schedules a workflow declares, `runner cron`; run webhooks delivered to a
//! receiver on loopback, retried, signed, refused by the network guard, delivered again after
//! a restart; and a route's signature check (an inbound webhook).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{Value, json};

use super::serve::{Server, client, script_passes, sdk_python, spawn_live};
use super::support::postgres;

/// 2030-01-01T00:00:00Z, in milliseconds since the epoch: a Tuesday.
const Y2030: i64 = 1_893_456_000_000;
const MINUTE: i64 = 60_000;

/// The scheduler's time, a file every server of a test reads.
struct Clock(PathBuf);

impl Clock {
    fn new(dir: &Path, ms: i64) -> Clock {
        let clock = Clock(dir.join("clock"));
        clock.set(ms);
        clock
    }

    /// Moves the time to `ms`, in one step (written aside, then renamed over).
    fn set(&self, ms: i64) {
        let aside = self.0.with_extension("next");
        std::fs::write(&aside, ms.to_string()).unwrap();
        std::fs::rename(&aside, &self.0).unwrap();
    }
}

/// A folder with `workflows/tick.yaml` and the workflows given as (name, text).
fn folder(extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir(&workflows).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crons");
    std::fs::copy(fixtures.join("tick.yaml"), workflows.join("tick.yaml")).unwrap();
    for (name, text) in extra {
        std::fs::write(workflows.join(name), text).unwrap();
    }
    dir
}

/// `runner serve` on `dir`'s workflows, its scheduler on `clock`, with `args`.
fn serve(dir: &Path, clock: &Clock, args: &[&str], env: &[(&str, &str)]) -> Server {
    let clock = clock.0.to_str().unwrap().to_string();
    let mut all: Vec<&str> = vec!["--clock-file", &clock];
    all.extend(args);
    let (child, base, _) = spawn_live(dir, &dir.join("workflows"), &all, env);
    Server { child, base, dir: None }
}

async fn get(s: &Server, path: &str) -> Value {
    let r = client().get(format!("{}{path}", s.base)).send().await.unwrap();
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    r.json().await.unwrap()
}

async fn send(s: &Server, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
    let r = client()
        .request(method, format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A metric of `s`'s `/metrics`, 0 when absent.
async fn metric(s: &Server, name: &str) -> f64 {
    let text = client()
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Moves the clock to `ms` and waits until every server's scheduler has made a whole pass at
/// that time: every tick due by then has been claimed, and its run's row written.
async fn settle(servers: &[&Server], clock: &Clock, ms: i64) {
    clock.set(ms);
    let deadline = Instant::now() + Duration::from_secs(30);
    for s in servers {
        while metric(s, "runner_cron_scheduler_clock_seconds").await < ms as f64 / 1000.0 - 0.0005 {
            assert!(Instant::now() < deadline, "a scheduler never passed at {ms}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The runs of thread `thread`, oldest first.
async fn runs(s: &Server, thread: &str) -> Vec<Value> {
    let mut runs = get(s, &format!("/threads/{thread}/runs?limit=1000")).await;
    let list = runs.as_array_mut().unwrap();
    list.reverse();
    list.clone()
}

/// Waits until every run of `thread` has ended; their statuses.
async fn ended(s: &Server, thread: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let statuses: Vec<String> = runs(s, thread)
            .await
            .iter()
            .map(|r| r["status"].as_str().unwrap().to_string())
            .collect();
        if statuses.iter().all(|s| s != "pending" && s != "running") {
            return statuses;
        }
        assert!(Instant::now() < deadline, "runs never ended: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A thread cron firing every minute on `servers` (one database): exactly one run per tick
/// whichever server claims it, one run for many missed ticks, none after `end_time`; its runs
/// carry the cron's metadata and id.
async fn fires_once_per_tick(servers: &[&Server], clock: &Clock) -> (String, String) {
    let s = servers[0];
    let start = Y2030 + 30_000;
    settle(servers, clock, start).await;
    let (status, thread) = send(s, reqwest::Method::POST, "/threads", json!({})).await;
    assert_eq!(status, 200, "{thread}");
    let thread = thread["thread_id"].as_str().unwrap().to_string();
    let (status, cron) = send(
        s,
        reqwest::Method::POST,
        &format!("/threads/{thread}/runs/crons"),
        json!({"assistant_id": "tick", "schedule": "* * * * *", "input": {"note": "scheduled"},
               "metadata": {"source": "cron-test"}}),
    )
    .await;
    assert_eq!(status, 200, "{cron}");
    let cron_id = cron["cron_id"].as_str().unwrap().to_string();
    assert_eq!(cron["next_run_date"], "2030-01-01T00:01:00.000Z");
    settle(servers, clock, start).await;
    assert_eq!(runs(s, &thread).await.len(), 0, "nothing is due yet");

    for (n, at) in [(1, Y2030 + MINUTE + 500), (2, Y2030 + 2 * MINUTE + 500)] {
        settle(servers, clock, at).await;
        assert_eq!(runs(s, &thread).await.len(), n, "one run for tick {n}");
        settle(servers, clock, at + 20_000).await;
        assert_eq!(runs(s, &thread).await.len(), n, "no second run for tick {n}");
    }

    // Ten ticks go by while the scheduler looks elsewhere: one run, then the next tick after now.
    settle(servers, clock, Y2030 + 12 * MINUTE + 30_000).await;
    assert_eq!(runs(s, &thread).await.len(), 3, "missed ticks start one run");
    let now = get(s, &format!("/runs/crons/{cron_id}")).await;
    assert_eq!(now["next_run_date"], "2030-01-01T00:13:00.000Z");

    // `end_time` stops it.
    let (status, patched) = send(
        s,
        reqwest::Method::PATCH,
        &format!("/runs/crons/{cron_id}"),
        json!({"end_time": "2030-01-01T00:13:30Z"}),
    )
    .await;
    assert_eq!(
        (status, &patched["end_time"]),
        (200, &json!("2030-01-01T00:13:30.000Z"))
    );
    settle(servers, clock, Y2030 + 13 * MINUTE + 10_000).await;
    assert_eq!(runs(s, &thread).await.len(), 4, "the last tick before the end");
    for later in [14, 20, 60] {
        settle(servers, clock, Y2030 + later * MINUTE + 10_000).await;
        assert_eq!(runs(s, &thread).await.len(), 4, "no run after the end ({later} min)");
    }

    assert_eq!(ended(s, &thread).await, ["success"; 4]);
    for run in runs(s, &thread).await {
        assert_eq!(run["metadata"]["source"], "cron-test", "{run}");
        assert_eq!(
            run["kwargs"]["config"]["configurable"]["cron_id"],
            cron_id.as_str(),
            "{run}"
        );
    }
    let state = get(s, &format!("/threads/{thread}/state")).await;
    assert_eq!(state["values"], json!({"count": 4, "note": "scheduled"}));
    let mut started = 0.0;
    for s in servers {
        started += metric(s, "runner_cron_runs_started_total").await;
    }
    assert_eq!(started, 4.0, "each run was started by the server that claimed its tick");
    (thread, cron_id)
}

/// Two servers on one SQLite file fire each tick once; a tick missed while no server ran
/// starts one run when a server comes back, and the cron goes on from the next tick after now.
#[tokio::test(flavor = "multi_thread")]
async fn a_cron_fires_once_per_tick_with_two_servers_on_sqlite() {
    let dir = folder(&[]);
    let clock = Clock::new(dir.path(), Y2030);
    let mut a = serve(dir.path(), &clock, &[], &[]);
    let mut b = serve(dir.path(), &clock, &[], &[]);
    let (thread, cron_id) = fires_once_per_tick(&[&a, &b], &clock).await;
    let (status, _) = send(
        &a,
        reqwest::Method::PATCH,
        &format!("/runs/crons/{cron_id}"),
        json!({"end_time": null}),
    )
    .await;
    assert_eq!(status, 200);
    settle(&[&a, &b], &clock, Y2030 + 61 * MINUTE + 10_000).await;
    assert_eq!(
        runs(&a, &thread).await.len(),
        5,
        "the tick at 01:01 after the end was cleared"
    );
    ended(&a, &thread).await;
    // Both servers stop; an hour of ticks goes by; one comes back.
    a.term();
    b.term();
    clock.set(Y2030 + 2 * 60 * MINUTE + 30_000);
    let c = serve(dir.path(), &clock, &[], &[]);
    settle(&[&c], &clock, Y2030 + 2 * 60 * MINUTE + 30_000).await;
    assert_eq!(runs(&c, &thread).await.len(), 6, "the missed hour starts one run");
    let cron = get(&c, &format!("/runs/crons/{cron_id}")).await;
    assert_eq!(cron["next_run_date"], "2030-01-01T02:01:00.000Z");
    assert_eq!(ended(&c, &thread).await, ["success"; 6]);
}

/// Two servers on one PostgreSQL database, each with its worker: a tick's run goes through the
/// run queue to whichever worker claims it, and still exactly one run a tick.
#[tokio::test(flavor = "multi_thread")]
async fn a_cron_fires_once_per_tick_with_two_servers_on_postgres() {
    let dir = folder(&[]);
    let clock = Clock::new(dir.path(), Y2030);
    let db = postgres::fresh_url();
    let a = serve(dir.path(), &clock, &["--db", &db, "--lease-ttl", "2"], &[]);
    let b = serve(dir.path(), &clock, &["--db", &db, "--lease-ttl", "2"], &[]);
    fires_once_per_tick(&[&a, &b], &clock).await;
}

/// A stateless cron's each run has a thread of its own: kept with `on_run_completed: keep`,
/// deleted after the run otherwise; a cron's `webhook` is each run's.
#[tokio::test(flavor = "multi_thread")]
async fn a_stateless_crons_runs_each_have_a_thread_of_their_own() {
    let dir = folder(&[]);
    let clock = Clock::new(dir.path(), Y2030);
    let s = serve(dir.path(), &clock, &["--allow-net", "127.0.0.1"], &[]);
    let receiver = Receiver::start("127.0.0.1", 0, vec![200]);
    for (note, completed) in [("kept", "keep"), ("gone", "delete")] {
        let (status, cron) = send(
            &s,
            reqwest::Method::POST,
            "/runs/crons",
            json!({"assistant_id": "tick", "schedule": "*/30 * * * *", "input": {"note": note},
                   "on_run_completed": completed, "webhook": receiver.url}),
        )
        .await;
        assert_eq!((status, &cron["on_run_completed"]), (200, &json!(completed)), "{cron}");
    }
    for tick in [30, 60] {
        settle(&[&s], &clock, Y2030 + tick * MINUTE + 1_000).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while receiver.calls().len() < 4 {
        assert!(Instant::now() < deadline, "{} webhooks", receiver.calls().len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut notes: Vec<String> = receiver
        .calls()
        .iter()
        .map(|(_, b)| serde_json::from_slice::<Value>(b).unwrap()["values"]["note"].to_string())
        .collect();
    notes.sort();
    assert_eq!(notes, ["\"gone\"", "\"gone\"", "\"kept\"", "\"kept\""]);
    // Two ticks of the kept cron: two threads, each with one run; the others deleted.
    let threads = loop {
        let (_, threads) = send(&s, reqwest::Method::POST, "/threads/search", json!({})).await;
        let threads = threads.as_array().unwrap().clone();
        if threads.len() == 2 {
            break threads;
        }
        assert!(Instant::now() < deadline, "{threads:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for t in threads {
        assert_eq!(t["values"], json!({"count": 1, "note": "kept"}), "{t}");
    }
    assert_eq!(metric(&s, "runner_cron_runs_started_total").await, 4.0);
}

/// LangGraph's Python client creates, reads, searches, counts, changes and deletes crons, and
/// meets the API's errors, unchanged.
#[test]
fn the_python_sdk_manages_crons() {
    let python = sdk_python();
    let dir = folder(&[]);
    let clock = Clock::new(dir.path(), Y2030 + 30_000);
    let s = serve(dir.path(), &clock, &[], &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/crons.py");
    script_passes(
        Command::new(python).arg(script).arg(&s.base),
        "sdk crons: every check passed",
    );
}

/// A workflow's `serve.schedules` become crons once, however many servers load it; a reload
/// changes them in place, and a schedule the workflow drops is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn schedules_a_workflow_declares_are_registered_once() {
    let declared = |cron: &str| {
        format!(
            "name: digest\nconfig: {{topic: news}}\nstate: {{seen: {{type: string, default: \"\"}}}}\n\
             nodes: {{read: {{kind: set, update: {{seen: \"config.topic ~ ':' ~ input.week\"}}}}}}\n\
             input: {{type: object, properties: {{week: {{type: string}}}}}}\n\
             edges: [START -> read -> END]\n\
             serve:\n  schedules:\n    - cron: \"{cron}\"\n      timezone: Europe/Paris\n      thread: weekly-digest\n\
             \x20     input: {{week: current}}\n      config: {{topic: tides}}\n      metadata: {{digest: weekly}}\n"
        )
    };
    let dir = folder(&[("digest.yaml", &declared("0 9 * * 1"))]);
    let clock = Clock::new(dir.path(), Y2030);
    let a = serve(dir.path(), &clock, &[], &[]);
    let b = serve(dir.path(), &clock, &[], &[]);
    let (_, found) = send(&a, reqwest::Method::POST, "/runs/crons/search", json!({})).await;
    let found = found.as_array().unwrap().clone();
    assert_eq!(found.len(), 1, "{found:?}");
    let cron = &found[0];
    assert_eq!(cron["schedule"], "0 9 * * 1");
    assert_eq!(cron["thread_id"], "weekly-digest");
    assert_eq!(cron["metadata"], json!({"digest": "weekly"}));
    // Monday 2030-01-07 09:00 in Paris is 08:00 UTC.
    assert_eq!(cron["next_run_date"], "2030-01-07T08:00:00.000Z");
    // It fires once, creating its thread, with the schedule's input and config.
    settle(
        &[&a, &b],
        &clock,
        Y2030 + 6 * 24 * 60 * MINUTE + 8 * 60 * MINUTE + 1_000,
    )
    .await;
    assert_eq!(ended(&a, "weekly-digest").await, ["success"]);
    let state = get(&a, "/threads/weekly-digest/state").await;
    assert_eq!(state["values"]["seen"], "tides:current");
    // Changed and reloaded: the same cron, its new schedule.
    std::fs::write(dir.path().join("workflows/digest.yaml"), declared("0 18 * * 5")).unwrap();
    for s in [&a, &b] {
        let hup = Command::new("kill")
            .args(["-HUP", &s.child.id().to_string()])
            .status()
            .unwrap();
        assert!(hup.success());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, found) = send(&b, reqwest::Method::POST, "/runs/crons/search", json!({})).await;
        let found = found.as_array().unwrap().clone();
        if found.len() == 1 && found[0]["schedule"] == "0 18 * * 5" {
            assert_eq!(found[0]["cron_id"], cron["cron_id"]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reload never changed the cron: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Dropped from the workflow: deleted.
    let plain = declared("0 9 * * 1");
    let plain = plain.split("serve:").next().unwrap();
    std::fs::write(dir.path().join("workflows/digest.yaml"), plain).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &a.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    loop {
        let (_, n) = send(&a, reqwest::Method::POST, "/runs/crons/count", json!({})).await;
        if n == json!(0) {
            break;
        }
        assert!(Instant::now() < deadline, "the dropped schedule's cron stayed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `runner cron add`, `list` and `delete` on the database directly; a server fires what the CLI
/// added.
#[tokio::test(flavor = "multi_thread")]
async fn runner_cron_adds_lists_and_deletes_schedules() {
    let dir = folder(&[]);
    let db = dir.path().join("runner.db");
    let runner = || {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
        cmd.current_dir(dir.path()).env("RUNNER_DB", &db);
        cmd
    };
    let out = runner()
        .args([
            "cron",
            "add",
            "tick",
            "--schedule",
            "*/5 * * * *",
            "--thread",
            "cli-thread",
        ])
        .args(["--input", "note=from the cli", "--metadata", "by=cli"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cron_id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(String::from_utf8_lossy(&out.stderr).contains("next run"));
    let out = runner().args(["cron", "list"]).output().unwrap();
    let listed = String::from_utf8(out.stdout).unwrap();
    assert!(
        listed.starts_with(&format!("{cron_id}\t*/5 * * * *\tUTC\t")) && listed.contains("thread cli-thread"),
        "{listed}"
    );
    let out = runner()
        .args(["cron", "add", "nope", "--schedule", "* * * * *"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Assistant 'nope' not found"));
    let out = runner()
        .args(["cron", "add", "tick", "--schedule", "99 * * * *"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Invalid cron schedule"));

    // A server fires it at its next tick after the time it was added.
    let clock = Clock::new(dir.path(), now_ms() + 10 * 60 * MINUTE);
    let s = serve(dir.path(), &clock, &[], &[]);
    settle(&[&s], &clock, now_ms() + 10 * 60 * MINUTE).await;
    assert_eq!(ended(&s, "cli-thread").await, ["success"]);
    assert_eq!(
        get(&s, "/threads/cli-thread/state").await["values"]["note"],
        "from the cli"
    );
    drop(s);

    let out = runner().args(["cron", "list", "--format", "json"]).output().unwrap();
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all[0]["cron_id"], cron_id.as_str());
    assert_eq!(all[0]["metadata"], json!({"by": "cli"}));
    let out = runner().args(["cron", "delete", &cron_id]).output().unwrap();
    assert!(out.status.success());
    let out = runner().args(["cron", "delete", &cron_id]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = runner().args(["cron", "list"]).output().unwrap();
    assert!(out.stdout.is_empty());
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Webhooks.

/// The requests a receiver got: headers and body.
type Calls = Arc<Mutex<Vec<(axum::http::HeaderMap, Vec<u8>)>>>;

/// A webhook receiver on loopback: it records every request and answers each with the next
/// status of its script (the last one once the script runs out).
struct Receiver {
    url: String,
    seen: Calls,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listens on `ip:port` (0: any free port).
    fn start(ip: &str, port: u16, script: Vec<u16>) -> Receiver {
        let listener = std::net::TcpListener::bind((ip, port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Calls = Arc::default();
        let recorded = seen.clone();
        let script = Arc::new(script);
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let (recorded, script) = (recorded.clone(), script.clone());
                async move {
                    let mut seen = recorded.lock().unwrap();
                    let status = script.get(seen.len()).or(script.last()).copied().unwrap_or(200);
                    seen.push((headers, body.to_vec()));
                    axum::http::StatusCode::from_u16(status).unwrap()
                }
            }),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Receiver {
            url: format!("http://{addr}/hook"),
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn calls(&self) -> Vec<(axum::http::HeaderMap, Vec<u8>)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A webhook delivery as recorded: run id, state, attempts, last status, last error.
type Recorded = (String, String, i64, Option<i64>, Option<String>);

/// The webhook deliveries recorded in SQLite database `db`.
fn deliveries(db: &Path) -> Vec<Recorded> {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut stmt = conn
        .prepare("SELECT run_id, state, attempts, last_status, last_error FROM webhook_deliveries ORDER BY seq")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Waits until `check` holds of the deliveries of `db`.
async fn until_deliveries(db: &Path, what: &str, check: impl Fn(&[Recorded]) -> bool) -> Vec<Recorded> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = deliveries(db);
        if check(&d) {
            return d;
        }
        assert!(Instant::now() < deadline, "{what}: {d:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks a `runner-signature` header against the body, as a receiver would.
fn verify(secret: &str, header: &str, body: &[u8]) -> bool {
    let mut t = "";
    let mut v1 = "";
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", v)) => t = v,
            Some(("v1", v)) => v1 = v,
            _ => {}
        }
    }
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    let want: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    want == v1
}

/// A run's webhook is called when it ends, with the run and its values, signed; a 500 is tried
/// again until the receiver takes it; an address the network guard refuses is never called; a
/// delivery pending when the server is killed is made by the next server.
#[tokio::test(flavor = "multi_thread")]
async fn webhooks_are_signed_retried_guarded_and_survive_a_restart() {
    let dir = folder(&[]);
    let clock = Clock::new(dir.path(), Y2030);
    let db = dir.path().join("runner.db");
    let env = [("HOOK_SECRET", "whsec-test")];
    let args = ["--allow-net", "127.0.0.1", "--webhook-secret-env", "HOOK_SECRET"];
    let mut s = serve(dir.path(), &clock, &args, &env);

    // What is not an http(s) URL is refused with the run.
    let (status, refused) = send(
        &s,
        reqwest::Method::POST,
        "/runs/wait",
        json!({"assistant_id": "tick", "webhook": "ftp://127.0.0.1/hook"}),
    )
    .await;
    assert_eq!(status, 422, "{refused}");

    // Two 500s, then 200.
    let receiver = Receiver::start("127.0.0.1", 0, vec![500, 500, 200]);
    let (status, waited) = send(
        &s,
        reqwest::Method::POST,
        "/runs/wait",
        json!({"assistant_id": "tick", "input": {"note": "hooked"}, "webhook": receiver.url,
               "metadata": {"who": "hook-test"}}),
    )
    .await;
    assert_eq!((status, &waited), (200, &json!({"count": 1, "note": "hooked"})));
    let done = until_deliveries(&db, "the webhook was never delivered", |d| {
        d.first().is_some_and(|x| x.1 == "delivered")
    })
    .await;
    assert_eq!((done[0].2, done[0].3), (3, Some(200)), "{done:?}");
    let calls = receiver.calls();
    assert_eq!(calls.len(), 3);
    for (headers, body) in &calls {
        let signature = headers["runner-signature"].to_str().unwrap();
        assert!(verify("whsec-test", signature, body), "{signature}");
        assert!(!verify("another secret", signature, body));
        assert_eq!(headers["content-type"], "application/json");
    }
    let body: Value = serde_json::from_slice(&calls[2].1).unwrap();
    assert_eq!(body["run_id"], done[0].0.as_str());
    assert_eq!(body["status"], "success");
    assert_eq!(body["values"], json!({"count": 1, "note": "hooked"}));
    assert_eq!(body["metadata"]["who"], "hook-test");
    assert_eq!(body["kwargs"]["webhook"], receiver.url.as_str());
    for field in ["run_started_at", "run_ended_at", "webhook_sent_at", "created_at"] {
        assert!(body[field].as_str().is_some_and(|t| t.len() >= 20), "{field}: {body}");
    }
    assert!(body.get("error").is_none());

    // An address the guard refuses (loopback, but not the one --allow-net allows) is never
    // called, however it answers.
    let bystander = Receiver::start("127.0.0.2", 0, vec![200]);
    let (status, _) = send(
        &s,
        reqwest::Method::POST,
        "/runs/wait",
        json!({"assistant_id": "tick", "webhook": bystander.url}),
    )
    .await;
    assert_eq!(status, 200);
    let refused = until_deliveries(&db, "the refusal was never recorded", |d| {
        d.len() == 2 && d[1].1 != "pending"
    })
    .await;
    assert_eq!((refused[1].1.as_str(), refused[1].2), ("refused", 1), "{refused:?}");
    assert!(
        refused[1]
            .4
            .as_deref()
            .is_some_and(|e| e.contains("127.0.0.2") && e.contains("loopback")),
        "{refused:?}"
    );
    assert!(bystander.calls().is_empty());

    // A receiver that is down: the delivery waits for its retry when the server is killed,
    // and the next server on the database makes it.
    let port = {
        let l = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        l.local_addr().unwrap().port()
    };
    let later = format!("http://127.0.0.1:{port}/hook");
    let (status, _) = send(
        &s,
        reqwest::Method::POST,
        "/runs/wait",
        json!({"assistant_id": "tick", "webhook": later}),
    )
    .await;
    assert_eq!(status, 200);
    let waiting = until_deliveries(&db, "the first attempt was never recorded", |d| {
        d.len() == 3 && d[2].2 >= 1
    })
    .await;
    assert_eq!(waiting[2].1, "pending", "{waiting:?}");
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let receiver = Receiver::start("127.0.0.1", port, vec![200]);
    let _s = serve(dir.path(), &clock, &args, &env);
    let done = until_deliveries(&db, "the delivery never survived the restart", |d| {
        d.len() == 3 && d[2].1 == "delivered"
    })
    .await;
    assert!(done[2].2 >= 2, "{done:?}");
    assert_eq!(receiver.calls().len(), 1);
}

/// On PostgreSQL, with two servers each delivering, one of them calls the receiver once.
#[tokio::test(flavor = "multi_thread")]
async fn on_postgres_one_server_delivers_a_webhook() {
    let dir = folder(&[]);
    let clock = Clock::new(dir.path(), Y2030);
    let db = postgres::fresh_url();
    let args = ["--db", db.as_str(), "--allow-net", "127.0.0.1"];
    let a = serve(dir.path(), &clock, &args, &[]);
    let _b = serve(dir.path(), &clock, &args, &[]);
    let receiver = Receiver::start("127.0.0.1", 0, vec![200]);
    for i in 0..5 {
        let (status, _) = send(
            &a,
            reqwest::Method::POST,
            "/runs/wait",
            json!({"assistant_id": "tick", "input": {"note": format!("run {i}")}, "webhook": receiver.url}),
        )
        .await;
        assert_eq!(status, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let rows = loop {
        let rows = postgres::query(&db, "SELECT state, attempts FROM webhook_deliveries ORDER BY seq").unwrap();
        if rows.len() == 5 && rows.iter().all(|r| r[0].as_deref() == Some("delivered")) {
            break rows;
        }
        assert!(Instant::now() < deadline, "{rows:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(rows.iter().all(|r| r[1].as_deref() == Some("1")), "{rows:?}");
    let notes: Vec<String> = receiver
        .calls()
        .iter()
        .map(|(_, b)| serde_json::from_slice::<Value>(b).unwrap()["values"]["note"].to_string())
        .collect();
    assert_eq!(notes.len(), 5, "each webhook called once: {notes:?}");
}

/// A route with `verify` is an inbound webhook: a request signed with the secret starts its
/// run; an unsigned or wrongly signed one is refused with 401 and runs nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_route_that_verifies_refuses_unsigned_requests() {
    let hooked = "name: inbound\ninput: {type: object, properties: {note: {type: string}}}\n\
                  state: {got: {type: string, default: \"\"}}\n\
                  nodes: {take: {kind: set, update: {got: input.note}}}\n\
                  edges: [START -> take -> END]\n\
                  serve:\n  routes:\n    - path: /hooks/inbound\n      input: request.body\n      respond: state.got\n\
                  \x20     verify: {secret_env: INBOUND_SECRET}\n";
    let dir = folder(&[("inbound.yaml", hooked)]);
    let clock = Clock::new(dir.path(), Y2030);
    let s = serve(dir.path(), &clock, &[], &[("INBOUND_SECRET", "in-secret")]);
    let body = br#"{"note": "signed"}"#;
    let post = |signature: Option<String>| {
        let mut r = client()
            .post(format!("{}/hooks/inbound", s.base))
            .header("content-type", "application/json")
            .body(body.to_vec());
        if let Some(sig) = signature {
            r = r.header("runner-signature", sig);
        }
        r.send()
    };
    let t = now_ms() / 1000;
    let sign = |secret: &str, t: i64| {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}.").as_bytes());
        mac.update(body);
        let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        format!("t={t},v1={hex}")
    };
    let r = post(Some(sign("in-secret", t))).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!("signed"));
    for (signature, says) in [
        (None, "no `runner-signature` header"),
        (Some(sign("wrong", t)), "does not match"),
        (Some(sign("in-secret", t - 3600)), "more than five minutes"),
    ] {
        let r = post(signature).await.unwrap();
        assert_eq!(r.status(), 401);
        let detail = r.json::<Value>().await.unwrap()["detail"].as_str().unwrap().to_string();
        assert!(detail.contains(says), "{detail}");
    }
    let threads = client()
        .post(format!("{}/threads/search", s.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(
        threads,
        json!([]),
        "nothing ran for the refused requests (the signed run's thread was its own)"
    );
}
