//! Operating a deployment: a statement that outlives the URL's `statement_timeout`, a step's
//! events committed with its checkpoint under the run's claim, threads' time to live (set,
//! shown, swept — once, whichever process sweeps), and deletes and prunes that take the
//! thread's lease and so refuse a thread a run on another process holds, on PostgreSQL (a real
//! server on loopback) and SQLite.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use runner::checkpoint::postgres::PostgresCheckpointer;
use runner::checkpoint::queue::{Logged, RunQueue};
use runner::checkpoint::{
    Checkpoint, CheckpointError, Checkpointer, Durability, LeaseClaim, Put, Removal, Removed, RunRow, RunStatus,
    RunStore, Thread, ThreadMeta, ThreadStatus, ThreadTtl, new_id,
};
use serde_json::{Value, json};

use super::serve::{Server, call_at as call, spawn, until_status};
use super::support::postgres;

fn thread(id: &str) -> Thread {
    Thread {
        thread_id: id.into(),
        workflow: "w.yaml".into(),
        plan_hash: "h".into(),
        input: json!({}),
        context: json!({}),
        config: json!({}),
        status: ThreadStatus::Running,
        created_at: "2020-01-01T10:00:00.000Z".into(),
        updated_at: "2020-01-01T10:00:00.000Z".into(),
        forked_from: None,
    }
}

fn checkpoint(thread_id: &str, step: i64) -> Checkpoint {
    Checkpoint {
        checkpoint_id: new_id(),
        thread_id: thread_id.into(),
        parent_id: None,
        step,
        versions: Default::default(),
        ran: Vec::new(),
        changed: Vec::new(),
        next: Vec::new(),
        meta: json!({}),
        plan_hash: "h".into(),
        created_at: "2020-01-01T10:00:01.000Z".into(),
    }
}

/// A pending run of `thread`.
fn run_row(id: &str, thread: &str) -> RunRow {
    super::checkpoint::run_row(id, thread, RunStatus::Pending)
}

fn claim(owner: &str) -> LeaseClaim {
    LeaseClaim {
        thread_id: String::new(),
        owner: owner.into(),
        pid: std::process::id(),
        host: "here".into(),
        ttl: Duration::from_secs(30),
        replace: None,
    }
}

/// `url` without its `?schema=…`, and the schema.
fn split(url: &str) -> (&str, &str) {
    url.split_once("?schema=").unwrap()
}

/// What every connection asks of the server: a transaction left open (its client gone, its
/// locks held) is ended after the URL's `idle_in_transaction_session_timeout` (a minute unless
/// said), and the server probes a quiet client as the client probes it. A URL's own libpq
/// `options` reach the server as written.
#[test]
fn a_transaction_left_open_is_ended_by_the_server_and_the_urls_options_reach_it() {
    let url = postgres::fresh_url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let connect = |url: &str| {
        let target = runner::pg::parse_url(url).unwrap();
        let (client, connection) = runtime.block_on(target.config.connect(tokio_postgres::NoTls)).unwrap();
        runtime.spawn(connection);
        client
    };
    let shown = |client: &tokio_postgres::Client, name: &str| -> String {
        runtime
            .block_on(client.query_one(&format!("SHOW {name}"), &[]))
            .unwrap()
            .get(0)
    };
    let plain = connect(&url);
    assert_eq!(shown(&plain, "idle_in_transaction_session_timeout"), "1min");
    assert_eq!(shown(&plain, "tcp_keepalives_idle"), "30");
    assert_eq!(shown(&plain, "tcp_keepalives_count"), "3");

    let with_options = format!("{url}&options=-c%20work_mem%3D7MB");
    assert_eq!(shown(&connect(&with_options), "work_mem"), "7MB");
    // The stores open on such a URL (they were refused: `-c+work_mem=7MB`).
    PostgresCheckpointer::open(&with_options, Durability::CrashSafe).unwrap();

    let short = connect(&format!("{url}&idle_in_transaction_session_timeout=300ms"));
    runtime.block_on(short.batch_execute("BEGIN; SELECT 1")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let e = runtime.block_on(short.query_one("SELECT 1", &[])).unwrap_err();
    assert!(
        e.is_closed() || e.as_db_error().is_some_and(|d| d.code().code() == "25P03"),
        "{e:?}"
    );
}

/// A statement that runs longer than the URL's `statement_timeout` fails at once, saying why;
/// the same statement on a connection without it waits as long as it must.
#[test]
fn a_statement_longer_than_the_urls_statement_timeout_fails_saying_so() {
    let url = postgres::fresh_url();
    let timed = PostgresCheckpointer::open(&format!("{url}&statement_timeout=300ms"), Durability::CrashSafe).unwrap();
    let patient = Arc::new(PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap());
    let (plain, schema) = split(&url);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, connection) = runtime
        .block_on(tokio_postgres::connect(plain, tokio_postgres::NoTls))
        .unwrap();
    runtime.spawn(connection);
    // Every read of a thread waits for this lock.
    runtime
        .block_on(client.batch_execute(&format!("BEGIN; LOCK TABLE {schema}.threads IN ACCESS EXCLUSIVE MODE")))
        .unwrap();
    let asked = Instant::now();
    let e = timed.get_thread("t").unwrap_err();
    assert!(asked.elapsed() < Duration::from_secs(5), "{:?}", asked.elapsed());
    assert!(matches!(e, CheckpointError::Backend(_)), "{e:?}");
    assert!(e.to_string().contains("statement_timeout"), "{e}");
    let waiting = std::thread::spawn({
        let patient = patient.clone();
        move || patient.get_thread("t")
    });
    std::thread::sleep(Duration::from_millis(800));
    assert!(!waiting.is_finished(), "without statement_timeout a statement waits");
    runtime.block_on(client.batch_execute("ROLLBACK")).unwrap();
    assert_eq!(waiting.join().unwrap().unwrap(), None);
}

/// A claimed run's commit carries its events: both land, or — the run claimed again since —
/// neither does.
#[test]
fn a_steps_events_are_committed_with_its_checkpoint_under_the_runs_claim() {
    let store = PostgresCheckpointer::open(&postgres::fresh_url(), Durability::CrashSafe).unwrap();
    store.create_thread(&thread("t")).unwrap();
    store.put_checkpoint(&checkpoint("t", -1), &[]).unwrap();
    assert!(store.admit(&run_row("r", "t"), false, None).unwrap());
    let claimed = store.claim("w", &claim(&new_id())).unwrap().unwrap();
    let token = claimed.lease.owner.clone();
    let step = checkpoint("t", 0);
    let bodies = vec![
        r#"{"type":"node_end"}"#.to_string(),
        r#"{"type":"step_end"}"#.to_string(),
    ];
    let durable = store
        .commit_logged(
            vec![
                Put::Fence(claimed.lease.fence()),
                Put::Checkpoint(Arc::new(step.clone()), Vec::new()),
            ],
            true,
            Logged {
                run_id: "r",
                claim: &token,
                from: claimed.next_event,
                bodies: &bodies,
            },
        )
        .unwrap();
    assert!(durable);
    assert_eq!(
        store.get_checkpoint("t", None).unwrap().unwrap().checkpoint_id,
        step.checkpoint_id
    );
    let logged: Vec<String> = store.events("r", 0, 10).unwrap().into_iter().map(|(_, b)| b).collect();
    assert_eq!(logged, bodies);
    // Under a claim the run no longer has: refused whole.
    let stale = checkpoint("t", 1);
    let e = store
        .commit_logged(
            vec![
                Put::Fence(claimed.lease.fence()),
                Put::Checkpoint(Arc::new(stale.clone()), Vec::new()),
            ],
            true,
            Logged {
                run_id: "r",
                claim: "an-older-claim",
                from: 3,
                bodies: &bodies,
            },
        )
        .unwrap_err();
    assert!(matches!(e, CheckpointError::LeaseLost(ref t) if t == "t"), "{e:?}");
    assert!(store.get_checkpoint("t", Some(&stale.checkpoint_id)).unwrap().is_none());
    assert_eq!(store.events("r", 0, 10).unwrap().len(), 2);
}

/// A claimed run's step — its fence, its thread's status, its checkpoint — and its events are
/// written by one statement in one round trip (the claim and the lease checked by it), and the
/// readers are told: counted through a relay, sent once a step after the first (which
/// prepares it); before, each took five (begin, lease, status, checkpoint, events, commit).
#[test]
fn a_claimed_step_with_its_status_and_events_is_one_round_trip() {
    let (relayed, sends) = super::checkpoint::counted_url(&postgres::fresh_url());
    let store = PostgresCheckpointer::open(relayed.as_str(), Durability::PowerSafe).unwrap();
    store.create_thread(&thread("t")).unwrap();
    let mut parent = checkpoint("t", -1);
    store.put_checkpoint(&parent, &[]).unwrap();
    assert!(store.admit(&run_row("r", "t"), false, None).unwrap());
    let claimed = store.claim("w", &claim(&new_id())).unwrap().unwrap();
    let token = claimed.lease.owner.clone();
    let mut notices = store.subscribe(true).unwrap();
    let mut next = claimed.next_event;
    let mut step = |n: i64, status: ThreadStatus| {
        let mut cp = checkpoint("t", n);
        cp.parent_id = Some(parent.checkpoint_id.clone());
        let bodies = vec![format!(r#"{{"type":"step_end","step":{n}}}"#)];
        store
            .commit_logged(
                vec![
                    Put::Fence(claimed.lease.fence()),
                    Put::Status {
                        thread_id: "t".into(),
                        status,
                    },
                    Put::Checkpoint(Arc::new(cp.clone()), Vec::new()),
                ],
                true,
                Logged {
                    run_id: "r",
                    claim: &token,
                    from: next,
                    bodies: &bodies,
                },
            )
            .unwrap();
        next += 1;
        parent = cp;
    };
    step(0, ThreadStatus::Running);
    // A read ends its transaction after it has answered (the claim's reads among them): let
    // those ends go before counting.
    std::thread::sleep(Duration::from_millis(300));
    let before = sends.load(std::sync::atomic::Ordering::SeqCst);
    for n in 1..5 {
        step(n, ThreadStatus::Running);
    }
    assert_eq!(
        sends.load(std::sync::atomic::Ordering::SeqCst) - before,
        4,
        "one send a step"
    );
    step(5, ThreadStatus::Done);
    let t = store.get_thread("t").unwrap().unwrap();
    assert_eq!(t.status, ThreadStatus::Done);
    assert_eq!(store.history("t").unwrap().len(), 7);
    assert_eq!(store.events("r", 0, 10).unwrap().len(), 6);
    // Each step's notice carries its records: a reader on another process needs no read. (The
    // first notices may come before the listener is: a reader's poll covers those.)
    let logged: Vec<(u64, String)> = store.events("r", 0, 10).unwrap();
    let last = logged.last().unwrap().0;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match notices.try_recv() {
            Ok(runner::checkpoint::queue::Notice::Events(r, records)) if r == "r" => {
                let records = records.expect("a step's few events travel with its notice");
                assert_eq!(records.bodies.len(), 1);
                let at = logged.iter().find(|(seq, _)| *seq == records.from);
                assert_eq!(
                    at.map(|(_, body)| body),
                    Some(&records.bodies[0]),
                    "the notices carry what the log holds, numbered as there"
                );
                if records.from == last {
                    break;
                }
            }
            Ok(_) => {}
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("the readers were not told of the last step's events: {e:?}"),
        }
    }
    // Records too long for a notice are told of, and left to be read from the log.
    let long = vec![format!(r#"{{"type":"custom","data":"{}"}}"#, "x".repeat(9_000))];
    assert!(store.append("r", &token, next, &long).unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match notices.try_recv() {
            Ok(runner::checkpoint::queue::Notice::Events(r, records)) if r == "r" => {
                assert!(records.is_none(), "a long record is read from the log");
                break;
            }
            Ok(_) => {}
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("the readers were not told of the long record: {e:?}"),
        }
    }
    assert_eq!(store.events("r", 6, 10).unwrap(), vec![(next, long[0].clone())]);
}

/// A one-node workflow run on PostgreSQL through a relay that counts the client's sends.
struct Counted {
    pg: Arc<PostgresCheckpointer>,
    sends: Arc<std::sync::atomic::AtomicUsize>,
    plan: Arc<runner::compile::Plan>,
    rt: tokio::runtime::Runtime,
    _project: super::support::Project,
}

impl Counted {
    fn new() -> Counted {
        let (relayed, sends) = super::checkpoint::counted_url(&postgres::fresh_url());
        let project = super::support::Project::new(&[(
            "w.yaml",
            "name: one\nstate: {a: {type: string, default: \"\"}}\nnodes:\n  set_a: {kind: set, update: {a: \"'x'\"}}\nedges: [START -> set_a -> END]\n",
        )]);
        Counted {
            pg: Arc::new(PostgresCheckpointer::open(relayed.as_str(), Durability::PowerSafe).unwrap()),
            sends,
            plan: project.plan("w.yaml"),
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
            _project: project,
        }
    }

    fn store(&self) -> Arc<dyn Checkpointer> {
        self.pg.clone()
    }

    /// Runs `req` (a turn of `{}` on `thread`) to its end: the sends it took.
    fn run(&self, thread: &str, req: runner::engine::RunRequest) -> usize {
        let providers = runner::providers::Providers::for_models_in(self.plan.models(), None, true, &|_| None).unwrap();
        let engine = runner::engine::Engine::new(
            self.plan.clone(),
            self.store(),
            providers,
            runner::engine::events::Events::none(),
        );
        // A read's transaction ends after it answered: let those ends go before counting.
        std::thread::sleep(Duration::from_millis(300));
        let before = self.sends.load(std::sync::atomic::Ordering::SeqCst);
        let out = self
            .rt
            .block_on(engine.run(runner::engine::RunRequest {
                thread_id: Some(thread.into()),
                input: Some(json!({})),
                workflow: "w.yaml".into(),
                ..req
            }))
            .unwrap();
        assert_eq!(out.status, runner::engine::Status::Done);
        std::thread::sleep(Duration::from_millis(300));
        self.sends.load(std::sync::atomic::Ordering::SeqCst) - before
    }
}

/// A run that starts a thread writes the thread, its first turn and its status in one round
/// trip and reads none of it back. Before, the turn and the status were two writes with the
/// turn's state and its records read between them: 15 sends for this run, then 10; 9 since
/// the status a finished run leaves goes with its last step's checkpoint.
#[test]
fn a_new_threads_start_is_one_write_and_nothing_read_back() {
    let c = Counted::new();
    let run = |thread: &str| c.run(thread, runner::engine::RunRequest::default());
    run("warm");
    let n = run("t");
    // The step after which nothing runs writes the thread's status with its checkpoint: the
    // run's end writes nothing more (10 sends when it did).
    assert!(n <= 9, "a one-node run on a new thread took {n} round trips");
    // A turn on a thread that exists: the thread and its head are one look (14 sends; 17
    // when they were two and the end wrote the status apart).
    let again = run("t");
    assert!(again <= 14, "a second turn took {again} round trips");
    let store = c.store();
    let t = store.get_thread("t").unwrap().unwrap();
    assert_eq!(t.status, ThreadStatus::Done);
    assert_eq!(
        store
            .state("t", &store.get_checkpoint("t", None).unwrap().unwrap().versions)
            .unwrap()["a"],
        json!("x")
    );
}

/// A worker's claimed run opens its thread from what the worker read under the claim's lease
/// (`RunRequest::seen`): no look of its own. The same run without it looks once more; a run
/// not under a claim ignores what it is handed and looks itself.
#[test]
fn a_claimed_run_opens_its_thread_from_what_its_worker_read() {
    use runner::engine::{LeasePolicy, RunRequest, Seen};
    let c = Counted::new();
    let run = |thread: &str, seen: bool, claimed: bool| {
        let lease = if claimed {
            assert!(
                c.pg.admit(&run_row(&format!("r-{thread}"), thread), false, None)
                    .unwrap()
            );
            let claimed = c.pg.claim("w", &claim(&new_id())).unwrap().unwrap();
            LeasePolicy::Claimed {
                lease: Box::new(claimed.lease),
                ttl: Duration::from_secs(30),
            }
        } else {
            LeasePolicy::default()
        };
        c.run(
            thread,
            RunRequest {
                lease,
                seen: seen.then(|| Box::new(Seen::default())),
                ..RunRequest::default()
            },
        )
    };
    run("warm", false, true);
    run("warm2", true, true);
    let looked = run("t1", false, true);
    let handed = run("t2", true, true);
    assert_eq!(handed + 1, looked, "a claimed run handed its thread looks no more");
    // Not under a claim, what it is handed is ignored: the thread is read under the run's own
    // lease (here it exists, and its new turn is stored on it).
    run("t3", false, false);
    let own = run("t3", true, false);
    assert!(own >= handed, "{own} sends");
    assert_eq!(c.store().history("t3").unwrap().len(), 6);
}

/// Two sweepers on one database, racing over the same expired threads: each thread is
/// removed once, by one of them, and every one is gone.
#[test]
fn two_sweepers_remove_each_expired_thread_once() {
    const THREADS: usize = 24;
    let url = postgres::fresh_url();
    let a = Arc::new(PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap());
    let b = Arc::new(PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap());
    let ids: Vec<String> = (0..THREADS).map(|i| format!("x{i}")).collect();
    for id in &ids {
        a.create_thread(&thread(id)).unwrap();
        a.put_checkpoint(&checkpoint(id, -1), &[]).unwrap();
        a.put_thread_meta(&ThreadMeta {
            thread_id: id.clone(),
            created_at: "2020-01-01T10:00:00.000Z".into(),
            updated_at: "2020-01-01T10:00:00.000Z".into(),
            metadata: json!({}),
            ttl: Some(ThreadTtl::starting("delete", 1.0, 0)),
        })
        .unwrap();
    }
    let now = runner::clock::now_ms();
    assert_eq!(a.expired_threads(now, 1000).unwrap().len(), THREADS);
    let removal = Removal {
        expired_by: Some(now),
        idle_before: Some(runner::clock::at_ms(now - 60_000)),
    };
    let start = Arc::new(Barrier::new(2));
    let sweep = |store: Arc<PostgresCheckpointer>| {
        let (ids, removal, start) = (ids.clone(), removal.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            ids.iter()
                .filter(|id| store.remove_thread(id, &removal, &claim(&new_id())).unwrap() == Removed::Removed)
                .count()
        })
    };
    let (by_a, by_b) = (sweep(a.clone()), sweep(b));
    let (by_a, by_b) = (by_a.join().unwrap(), by_b.join().unwrap());
    assert_eq!(by_a + by_b, THREADS, "{by_a} + {by_b}");
    assert!(a.list_thread_heads().unwrap().is_empty());
    assert!(a.expired_threads(now, 1000).unwrap().is_empty());
}

/// The served test workflows, in a temporary folder, with a mock whose two slow calls take
/// `delay` seconds each (`mock.yaml` in the folder).
fn served_workflows(delay: f64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serve");
    std::fs::create_dir(dir.path().join("workflows")).unwrap();
    for name in ["chat.yaml", "slow.yaml"] {
        std::fs::copy(fixtures.join(name), dir.path().join("workflows").join(name)).unwrap();
    }
    std::fs::write(
        dir.path().join("mock.yaml"),
        format!(
            "match:\n  - {{contains: \"Take your time again\", reply: {{text: done, delay: {delay}}}}}\n  \
             - {{contains: \"Take your time\", reply: {{text: half, delay: {delay}}}}}\n"
        ),
    )
    .unwrap();
    dir
}

/// A thread's time to live through the API (on SQLite): set on creation or by the server's
/// default, shown with `?include=ttl`, replaced by a patch; an expired thread is swept as a
/// delete would, one a run holds only once the run is over and the thread idle that long.
#[test]
fn threads_live_as_long_as_their_ttl_says() {
    let dir = served_workflows(2.0);
    let (child, base, _) = spawn(
        dir.path(),
        &dir.path().join("workflows"),
        &dir.path().join("mock.yaml"),
        &["--thread-ttl", "0.02", "--ttl-sweep-interval", "0.2"],
        &[],
    );
    let _server = Server { child, base, dir: None };
    let base = _server.base.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use reqwest::Method;
        let (status, t) = call(
            Method::POST,
            format!("{base}/threads"),
            Some(json!({"thread_id": "kept", "ttl": {"ttl": 0.05, "strategy": "delete"}})),
        )
        .await;
        assert_eq!(status, 200, "{t}");
        assert!(t.get("ttl").is_none(), "only asked for: {t}");
        let (_, shown) = call(Method::GET, format!("{base}/threads/kept?include=ttl"), None).await;
        assert_eq!(
            (&shown["ttl"]["strategy"], &shown["ttl"]["ttl_minutes"]),
            (&json!("delete"), &json!(0.05)),
            "{shown}"
        );
        assert!(shown["ttl"]["expires_at"].as_str().unwrap().ends_with('Z'), "{shown}");
        // The server's default for a thread created without one.
        let (_, _) = call(
            Method::POST,
            format!("{base}/threads"),
            Some(json!({"thread_id": "plain"})),
        )
        .await;
        let (_, shown) = call(Method::GET, format!("{base}/threads/plain?include=ttl"), None).await;
        assert_eq!(shown["ttl"]["ttl_minutes"], json!(0.02), "{shown}");
        // A strategy runner does not have is refused.
        let (status, refused) = call(
            Method::POST,
            format!("{base}/threads"),
            Some(json!({"ttl": {"ttl": 1, "strategy": "keep_latest"}})),
        )
        .await;
        assert_eq!(status, 422, "{refused}");
        // A patch replaces it: `kept` now lives ten minutes.
        let (status, _) = call(
            Method::PATCH,
            format!("{base}/threads/kept"),
            Some(json!({"ttl": {"ttl": 10, "strategy": "delete"}})),
        )
        .await;
        assert_eq!(status, 200);
        let (_, shown) = call(Method::GET, format!("{base}/threads/kept?include=ttl"), None).await;
        assert_eq!(shown["ttl"]["ttl_minutes"], json!(10.0), "{shown}");
        // A thread a run holds past its time to live stays while the run goes on (two model
        // calls of two seconds each, against 1.2 s).
        let (status, run) = call(
            Method::POST,
            format!("{base}/threads/busy/runs"),
            Some(json!({"assistant_id": "slow", "if_not_exists": "create", "input": {}})),
        )
        .await;
        assert_eq!(status, 200, "{run}");
        until_status(&base, "/threads/plain", 404).await;
        let (status, _) = call(Method::GET, format!("{base}/threads/busy"), None).await;
        assert_eq!(status, 200, "the run holds it");
        let run_id = run["run_id"].as_str().unwrap().to_string();
        let (status, ended) = call(Method::GET, format!("{base}/threads/busy/runs/{run_id}/join"), None).await;
        assert_eq!(status, 200, "{ended}");
        // Idle for its time to live after the run: swept.
        until_status(&base, "/threads/busy", 404).await;
        let (status, _) = call(Method::GET, format!("{base}/threads/kept"), None).await;
        assert_eq!(status, 200, "its ttl was made ten minutes");
    });
}

fn runner_cmd(dir: &Path) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
    cmd.current_dir(dir);
    cmd
}

/// A run in progress in another process (`runner run` on the shared database) holds its
/// thread: the API's delete answers 409 and `runner db prune` keeps it, and the run ends as if
/// nobody had asked; once it is over, both remove the thread whole, its runs and their event
/// logs with it.
#[test]
fn deletes_and_prunes_take_the_lease_and_refuse_a_thread_a_run_holds() {
    let dir = served_workflows(4.0);
    let db = postgres::fresh_url();
    let (child, base, _) = spawn(
        dir.path(),
        &dir.path().join("workflows"),
        &dir.path().join("mock.yaml"),
        &["--db", &db, "--workers", "1"],
        &[],
    );
    let server = Server { child, base, dir: None };
    // Eight seconds holding its thread, in a process of its own.
    let run = runner_cmd(dir.path())
        .args([
            "run",
            "workflows/slow.yaml",
            "--thread",
            "held",
            "--db",
            &db,
            "--mock",
            "mock.yaml",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while postgres::query(
        &db,
        "SELECT 1 FROM leases l JOIN threads t USING (thread_id) WHERE thread_id = 'held'",
    )
    .map(|r| r.is_empty())
    .unwrap_or(true)
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the run never took its thread"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let base = server.base.clone();
    rt.block_on(async {
        let (status, body) = call(reqwest::Method::DELETE, format!("{base}/threads/held"), None).await;
        assert_eq!(status, 409, "{body}");
        assert!(body["detail"].as_str().unwrap().contains("busy"), "{body}");
    });
    let pruned = runner_cmd(dir.path())
        .args(["db", "prune", "--older-than", "0s", "--db", &db])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&pruned.stderr);
    assert_eq!(pruned.status.code(), Some(0), "{said}");
    assert!(pruned.stdout.is_empty(), "{}", String::from_utf8_lossy(&pruned.stdout));
    assert!(said.contains("kept held: in use"), "{said}");
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    rt.block_on(async {
        // A thread of the server's own, run to its end: its run and event log are pruned with it.
        let (status, body) = call(
            reqwest::Method::POST,
            format!("{base}/threads/served/runs/wait"),
            Some(json!({"assistant_id": "chat", "if_not_exists": "create",
                        "input": {"messages": [{"role": "user", "content": "hi"}]}})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let (status, _) = call(reqwest::Method::DELETE, format!("{base}/threads/held"), None).await;
        assert_eq!(status, 204);
        let (status, _) = call(reqwest::Method::GET, format!("{base}/threads/held"), None).await;
        assert_eq!(status, 404);
    });
    let count = |sql: &str| postgres::query(&db, sql).unwrap()[0][0].clone().unwrap();
    assert_ne!(
        count("SELECT count(*) FROM run_events e JOIN runs r USING (run_id) WHERE r.thread_id = 'served'"),
        "0"
    );
    let pruned = runner_cmd(dir.path())
        .args(["db", "prune", "--older-than", "0s", "--db", &db])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&pruned.stdout), "served\n");
    for table in ["threads", "checkpoints", "thread_meta", "runs", "run_events", "leases"] {
        assert_eq!(count(&format!("SELECT count(*) FROM {table}")), "0", "{table}");
    }
}

/// A `runner run` killed outright leaves its thread's lease behind; a prune on the same host
/// takes it over at once (its process is gone), as a resume does, instead of keeping the thread
/// until the lease expires.
#[test]
fn a_prune_takes_over_the_lease_of_a_run_whose_process_is_gone() {
    let dir = served_workflows(30.0);
    let mut run = runner_cmd(dir.path())
        .args([
            "run",
            "workflows/slow.yaml",
            "--thread",
            "killed",
            "--db",
            "runs.db",
            "--mock",
            "mock.yaml",
        ])
        .args(["--lease-ttl", "600"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        let listed = runner_cmd(dir.path())
            .args(["threads", "--format", "json", "--db", "runs.db"])
            .output()
            .unwrap();
        let threads: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
        if threads
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["status"] == "running"))
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the run never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    run.kill().unwrap();
    run.wait().unwrap();
    let pruned = runner_cmd(dir.path())
        .args(["db", "prune", "--older-than", "0s", "--db", "runs.db"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&pruned.stdout),
        "killed\n",
        "{}",
        String::from_utf8_lossy(&pruned.stderr)
    );
}
