//! The PostgreSQL server the tests start (`support/postgres.rs`): it answers on loopback, hands
//! out empty schemas of one database with the settings durability tests rely on, restarts on
//! its port and data, and dies with the test process however that ends.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::postgres::{self, Server};

fn one(url: &str, sql: &str) -> String {
    let rows = postgres::query(url, sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
    rows[0]
        .iter()
        .map(|v| v.clone().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("|")
}

/// Whether `pid` is still a process (a zombie is not: its parent is gone, nobody reaped it yet).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[tokio::test]
async fn the_shared_server_hands_out_empty_schemas_of_one_database() {
    let a = postgres::fresh_url();
    let b = postgres::fresh_url();
    assert_ne!(a, b);
    let (plain, schema_a) = a.split_once("?schema=").unwrap();
    let (plain_b, schema_b) = b.split_once("?schema=").unwrap();
    assert!(
        plain.starts_with("postgres://runner@127.0.0.1:") && plain.ends_with("/runner_test"),
        "{a}"
    );
    assert_eq!(plain, plain_b, "one server, one database");
    assert!(
        schema_a.starts_with("s_") && schema_a != schema_b,
        "{schema_a} {schema_b}"
    );

    // A plain client reaches it, as the URL's user, a superuser, on the URL's database.
    let (client, connection) = tokio_postgres::connect(plain, tokio_postgres::NoTls).await.unwrap();
    let connection = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT 1, current_user::text, current_database()::text, \
             (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), \
             (SELECT count(*) FROM pg_namespace WHERE nspname IN ($1, $2))",
            &[&schema_a, &schema_b],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    assert_eq!(row.get::<_, String>(1), "runner");
    assert_eq!(row.get::<_, String>(2), "runner_test");
    assert!(row.get::<_, bool>(3), "a superuser");
    assert_eq!(
        row.get::<_, i64>(4),
        0,
        "a fresh schema does not exist yet: a test starts empty"
    );

    // What tests of durability and of many connections rely on.
    let settings = client
        .query_one(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'), \
             current_setting('listen_addresses'), current_setting('max_connections')",
            &[],
        )
        .await
        .unwrap();
    let settings: Vec<String> = (0..4).map(|i| settings.get(i)).collect();
    assert_eq!(settings, ["on", "on", "127.0.0.1", "200"]);
    drop(client);
    connection.await.unwrap().unwrap();

    // The helper honours `schema` as the search path, as the checkpointer does.
    assert_eq!(
        one(
            &a,
            &format!("CREATE SCHEMA {schema_a}; CREATE TABLE t (x int); SELECT current_schema()::text")
        ),
        schema_a
    );
    let err = postgres::query(&b, &format!("CREATE SCHEMA {schema_b}; SELECT count(*) FROM t")).unwrap_err();
    assert!(
        err.contains("\"t\" does not exist"),
        "another schema's table is not seen: {err}"
    );
}

#[test]
fn a_server_of_its_own_restarts_on_its_port_and_data() {
    // Started from a thread that then ends, as every test's thread does: the server lives on.
    // A parent-death signal would be sent a moment after the join returns (the kernel wakes
    // the joiner before it signals the children): that moment is waited for, as there is no
    // event to wait on when nothing goes wrong.
    let server = std::thread::spawn(Server::start).join().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = server.pid();
    assert!(alive(pid));
    let admin = server.admin_url();
    assert_eq!(one(&admin, "SELECT current_user::text"), "postgres");
    assert_ne!(admin, postgres::admin_url(), "not the shared server");
    postgres::query(&admin, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)").unwrap();
    let started = one(&admin, "SELECT pg_postmaster_start_time()::text");
    let url = server.fresh_url();

    server.restart();
    assert_eq!(server.admin_url(), admin, "the same port");
    assert_ne!(server.pid(), pid);
    assert!(!alive(pid), "the old postmaster is gone");
    assert_ne!(one(&admin, "SELECT pg_postmaster_start_time()::text"), started);
    assert_eq!(one(&admin, "SELECT x FROM kept"), "7", "the same data");
    assert_eq!(one(&url, "SELECT current_database()::text"), "runner_test");

    let pid = server.pid();
    drop(server);
    assert!(!alive(pid), "dropped, stopped");
    assert!(postgres::query(&admin, "SELECT 1").is_err());
}

/// Run by `a_server_dies_with_its_test_process` as a process of its own, killed by it.
#[test]
#[ignore = "started and killed by postgres::a_server_dies_with_its_test_process"]
fn serve_until_killed() {
    let server = Server::start();
    println!("postmaster {} {}", server.pid(), server.admin_url());
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_server_dies_with_its_test_process() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "postgres::serve_until_killed", "--ignored", "--nocapture"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (pid, admin) = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("no server started; the child said:\n{said}"));
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("postmaster ") {
            let (pid, url) = rest.split_once(' ').unwrap();
            break (pid.parse::<u32>().unwrap(), url.to_owned());
        }
        said.push_str(&line);
        said.push('\n');
    };
    assert_eq!(one(&admin, "SELECT 1"), "1");

    child.kill().unwrap(); // SIGKILL: no unwinding, no exit handler.
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        if Instant::now() > deadline {
            // SAFETY: a signal to a process this test made; not left running for whoever comes next.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGQUIT) };
            panic!("the postmaster outlived its test process");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(postgres::query(&admin, "SELECT 1").is_err());
}

mod queue {
    //! The run queue on PostgreSQL: what its calls write, and that each is one round trip.

    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use runner::checkpoint::postgres::PostgresCheckpointer;
    use runner::checkpoint::queue::{Depth, Ended, Notice, RunQueue};
    use runner::checkpoint::{Durability, LeaseClaim, RunRow, RunStatus, RunStore, ThreadMeta};
    use serde_json::json;

    use crate::support::postgres;

    /// A pending run of `thread`.
    fn run_row(id: &str, thread: &str) -> RunRow {
        crate::checkpoint::run_row(id, thread, RunStatus::Pending)
    }

    fn meta(thread: &str, owner: &str) -> ThreadMeta {
        ThreadMeta {
            thread_id: thread.into(),
            created_at: "2020-01-01T10:00:00.000Z".into(),
            updated_at: "2020-01-01T11:00:00.000Z".into(),
            metadata: json!({"graph_id": "g", "owner": owner}),
            ttl: None,
        }
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

    fn one(url: &str, sql: &str) -> String {
        super::one(url, sql)
    }

    /// An admission writes the thread's record with the run; one refused (`reject`, the thread
    /// busy) writes neither; a run on a thread whose older run is active waits for it, and a
    /// run refused is not in line.
    #[test]
    fn an_admission_writes_the_threads_record_with_the_run_or_nothing() {
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        assert!(store.admit(&run_row("r1", "t"), true, Some(&meta("t", "ann"))).unwrap());
        let m = store.get_thread_meta("t").unwrap().unwrap();
        assert_eq!(m.metadata, json!({"graph_id": "g", "owner": "ann"}));
        assert_eq!(
            store.list_thread_meta_of("ann").unwrap().len(),
            1,
            "its owner is indexed"
        );
        // Busy: refused, and the thread's record is left as it was.
        let mut other = meta("t", "bob");
        other.updated_at = "2021-01-01T00:00:00.000Z".into();
        assert!(!store.admit(&run_row("r2", "t"), true, Some(&other)).unwrap());
        assert_eq!(store.get_run("r2").unwrap(), None);
        assert_eq!(store.get_thread_meta("t").unwrap().unwrap(), m);
        // Not refused (`enqueue`): in line behind r1, the record written.
        assert!(store.admit(&run_row("r3", "t"), false, Some(&other)).unwrap());
        assert_eq!(store.get_thread_meta("t").unwrap().unwrap().metadata["owner"], "bob");
        // No record given: the run only.
        assert!(store.admit(&run_row("r4", "u"), true, None).unwrap());
        assert_eq!(store.get_thread_meta("u").unwrap(), None);
        assert_eq!(one(&url, "SELECT count(*) FROM runs"), "3");
    }

    /// An admission that stamps the thread's record (an API server's, which does not read it
    /// first) sets the stamp's keys over the metadata the record has, keeps its other keys,
    /// its creation time and its owner, and starts its time to live again from now; a thread
    /// with no record gets the one given; a thread that does not exist is refused unless it
    /// may be created, and a busy one when the run says so, with nothing written.
    #[test]
    fn an_admission_stamps_the_threads_record_as_it_finds_it() {
        use runner::checkpoint::ThreadTtl;
        use runner::checkpoint::queue::{Admission, Stamp};
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        let mut had = meta("t", "ann");
        had.metadata = json!({"topic": "x", "graph_id": "old", "owner": "ann"});
        had.ttl = Some(ThreadTtl::starting("delete", 2.5, 1_000));
        store.put_thread_meta(&had).unwrap();
        let now_ms = 1_700_000_000_000;
        let stamp = |thread: &str, create: bool| Stamp {
            keys: serde_json::Map::from_iter([
                ("graph_id".to_string(), json!("g2")),
                ("assistant_id".to_string(), json!("a2")),
            ]),
            new: ThreadMeta {
                metadata: json!({"graph_id": "g2", "assistant_id": "a2", "owner": "bob"}),
                ttl: Some(ThreadTtl::starting("delete", 1.0, now_ms)),
                ..meta(thread, "bob")
            },
            create,
            now_ms,
        };
        let mut later = stamp("t", false);
        later.new.updated_at = "2030-01-01T00:00:00.000Z".into();
        assert_eq!(
            store.admit_stamped(&run_row("r1", "t"), false, &later).unwrap(),
            Admission::Admitted
        );
        let m = store.get_thread_meta("t").unwrap().unwrap();
        assert_eq!(
            m.metadata,
            json!({"topic": "x", "graph_id": "g2", "owner": "ann", "assistant_id": "a2"})
        );
        assert_eq!(m.created_at, had.created_at);
        assert_eq!(m.updated_at, "2030-01-01T00:00:00.000Z");
        let ttl = m.ttl.unwrap();
        assert_eq!(
            (ttl.minutes, ttl.expires_at_ms),
            (2.5, now_ms + 150_000),
            "started again"
        );
        assert_eq!(store.list_thread_meta_of("ann").unwrap().len(), 1, "its owner is kept");
        // Busy, refused with `reject`: nothing written.
        assert_eq!(
            store.admit_stamped(&run_row("r2", "t"), true, &later).unwrap(),
            Admission::Busy
        );
        assert_eq!(store.get_run("r2").unwrap(), None);
        // No such thread: refused unless it may be created.
        assert_eq!(
            store
                .admit_stamped(&run_row("r3", "u"), false, &stamp("u", false))
                .unwrap(),
            Admission::NoThread
        );
        assert_eq!(
            (store.get_run("r3").unwrap(), store.get_thread_meta("u").unwrap()),
            (None, None)
        );
        assert_eq!(
            store
                .admit_stamped(&run_row("r4", "u"), false, &stamp("u", true))
                .unwrap(),
            Admission::Admitted
        );
        let m = store.get_thread_meta("u").unwrap().unwrap();
        assert_eq!(
            m.metadata,
            json!({"graph_id": "g2", "assistant_id": "a2", "owner": "bob"})
        );
        assert_eq!(m.ttl.unwrap().expires_at_ms, now_ms + 60_000);
        assert_eq!(store.list_thread_meta_of("bob").unwrap().len(), 1);
        assert_eq!(one(&url, "SELECT count(*) FROM runs"), "2");
    }

    /// Admission and claim are tried again by the client when an answer was lost (the
    /// connection broke after the statement committed): the same call made twice admits the
    /// run once and answers `true` both times, even for a run refused when its thread is busy;
    /// the same claim made twice answers the run it claimed both times, under its one lease,
    /// and leaves the next run pending.
    #[test]
    fn an_admission_or_a_claim_made_again_after_it_committed_is_the_same_one() {
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        assert!(store.admit(&run_row("r1", "t"), true, Some(&meta("t", "ann"))).unwrap());
        assert!(
            store.admit(&run_row("r1", "t"), true, Some(&meta("t", "ann"))).unwrap(),
            "admitted already, not refused as busy nor a duplicate"
        );
        assert!(store.admit(&run_row("r2", "u"), false, None).unwrap());
        assert_eq!(one(&url, "SELECT count(*) FROM runs"), "2");
        let first = store.claim("w1", &claim("c1")).unwrap().unwrap();
        assert_eq!(first.run.run_id, "r1");
        assert!(!first.orphaned);
        let again = store.claim("w1", &claim("c1")).unwrap().unwrap();
        assert_eq!(again.run.run_id, "r1", "the run claimed, not the next one");
        assert_eq!(again.lease, first.lease, "the same lease");
        assert_eq!(again.next_event, first.next_event);
        assert_eq!(
            one(
                &url,
                "SELECT string_agg(run_id || ':' || status, ',' ORDER BY run_id) FROM runs"
            ),
            "r1:running,r2:pending"
        );
        // Another claim takes the next run.
        assert_eq!(store.claim("w1", &claim("c2")).unwrap().unwrap().run.run_id, "r2");
    }

    /// A run's log and its end are written again by the client when an answer was lost (the
    /// connection broke after the statement committed): the same events appended twice, and
    /// the same end finished twice, answer as the first call did and are logged once; an
    /// append that goes on past what the first wrote adds the rest.
    #[test]
    fn a_runs_events_or_end_written_again_after_they_committed_are_the_same_ones() {
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        assert!(store.admit(&run_row("r", "t"), false, None).unwrap());
        let c = store.claim("w", &claim("c")).unwrap().unwrap();
        let first = [r#"{"n":1}"#.to_string(), r#"{"n":2}"#.to_string()];
        assert!(store.append("r", "c", c.next_event, &first).unwrap());
        assert!(
            store.append("r", "c", c.next_event, &first).unwrap(),
            "the same events again"
        );
        // Put back with what was recorded since: the rest is added.
        let more = [first[0].clone(), first[1].clone(), r#"{"n":3}"#.to_string()];
        assert!(store.append("r", "c", c.next_event, &more).unwrap());
        let end = Ended {
            status: RunStatus::Success,
            error: None,
            at: "2020-01-01T12:00:00.000Z",
            record: Some((c.next_event + 3, r#"{"type":"__end__"}"#)),
        };
        store.finish("r", "c", end).unwrap();
        store.finish("r", "c", end).unwrap();
        assert_eq!(store.get_run("r").unwrap().unwrap().status, RunStatus::Success);
        let logged: Vec<String> = store.events("r", 0, 10).unwrap().into_iter().map(|(_, b)| b).collect();
        assert_eq!(logged, [&more[..], &[r#"{"type":"__end__"}"#.to_string()]].concat());
    }

    /// A worker claims the runs of the assistants it serves only, oldest first, and leaves the
    /// others pending for a worker that serves them; a claim for any assistant (a worker of an
    /// earlier version, calling `claim_run` with six arguments) takes any.
    #[test]
    fn a_claim_takes_only_the_runs_of_the_assistants_its_worker_serves() {
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        for (run, thread, assistant) in [("r1", "a", "heavy"), ("r2", "b", "light"), ("r3", "c", "heavy")] {
            let mut row = run_row(run, thread);
            row.assistant_id = assistant.into();
            assert!(store.admit(&row, false, None).unwrap());
        }
        let light = ["light".to_string(), "other".to_string()];
        let first = store.claim_serving("w1", &claim("c1"), Some(&light)).unwrap().unwrap();
        assert_eq!(first.run.run_id, "r2", "the oldest run it serves, r1 left");
        assert!(
            store.claim_serving("w1", &claim("c2"), Some(&light)).unwrap().is_none(),
            "nothing else it serves"
        );
        assert!(store.claim_serving("w1", &claim("c2"), Some(&[])).unwrap().is_none());
        assert_eq!(
            one(
                &url,
                "SELECT string_agg(run_id || ':' || status, ',' ORDER BY run_id) FROM runs"
            ),
            "r1:pending,r2:running,r3:pending"
        );
        // A worker of version 10 calls the six-argument function: any run.
        let old = one(
            &url,
            "SELECT c_run_id FROM claim_run('w0', 'c0', 1, 'here', '2020-01-01T10:00:00.000Z', 30000)",
        );
        assert_eq!(old, "r1");
        assert_eq!(store.claim("w2", &claim("c3")).unwrap().unwrap().run.run_id, "r3");
    }

    /// The queue's depth: pending and running runs, the wait of the oldest run a worker could
    /// take now (not one that waits for its thread's earlier run), and the live workers.
    #[test]
    fn the_queues_depth_counts_its_runs_and_times_the_oldest_a_worker_could_take() {
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        assert_eq!(store.depth().unwrap(), Depth::default());
        let mut old = run_row("r1", "a");
        old.created_at = runner::clock::at_ms(runner::clock::now_ms() - 60_000);
        assert!(store.admit(&old, false, None).unwrap());
        assert!(store.admit(&run_row("r2", "a"), false, None).unwrap());
        store.heartbeat("w1", Duration::from_secs(30)).unwrap();
        let d = store.depth().unwrap();
        assert_eq!((d.pending, d.running, d.workers), (2, 0, 1));
        let waited = d.oldest_pending_ms.unwrap();
        assert!((59_000..120_000).contains(&waited), "{waited}");
        // r1 taken: r2 waits for it, not for a worker.
        assert_eq!(store.claim("w1", &claim("c1")).unwrap().unwrap().run.run_id, "r1");
        let d = store.depth().unwrap();
        assert_eq!((d.pending, d.running, d.oldest_pending_ms), (1, 1, None));
        store.retire("w1").unwrap();
        assert_eq!(store.depth().unwrap().workers, 0);
    }

    /// A claim takes the oldest pending run that is its thread's oldest active one and whose
    /// thread no live lease holds; then, none pending, a run whose worker's heartbeat stopped
    /// (`orphaned`, its log going on after its last event); nothing once every run is taken.
    #[test]
    fn a_claim_takes_a_threads_oldest_run_then_a_dead_workers() {
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        for (run, thread) in [("r1", "a"), ("r2", "a"), ("r3", "b")] {
            assert!(store.admit(&run_row(run, thread), false, None).unwrap());
        }
        store.heartbeat("w1", Duration::from_secs(30)).unwrap();
        store.heartbeat("w2", Duration::from_secs(30)).unwrap();
        let first = store.claim("w1", &claim("c1")).unwrap().unwrap();
        assert_eq!(
            (
                first.run.run_id.as_str(),
                first.run.status,
                first.orphaned,
                first.next_event
            ),
            ("r1", RunStatus::Running, false, 1)
        );
        assert_eq!(
            (first.lease.thread_id.as_str(), first.lease.owner.as_str()),
            ("a", "c1")
        );
        assert_eq!(first.lease.generation, 1);
        // r2 waits for r1 (same thread): r3 is next.
        let second = store.claim("w1", &claim("c2")).unwrap().unwrap();
        assert_eq!(second.run.run_id, "r3");
        assert!(store.claim("w2", &claim("c3")).unwrap().is_none());
        assert_eq!(
            one(
                &url,
                "SELECT string_agg(run_id || ':' || status || ':' || worker || ':' || claim, ',' ORDER BY run_id) FROM runs WHERE worker IS NOT NULL"
            ),
            "r1:running:w1:c1,r3:running:w1:c2"
        );
        // r1 logged two events; then w1 dies: its heartbeat and r1's lease expire.
        assert!(store.append("r1", "c1", 1, &["{}".into(), "{}".into()]).unwrap());
        one(
            &url,
            "UPDATE workers SET expires_at = 0 WHERE worker_id = 'w1' RETURNING 1",
        );
        one(
            &url,
            "UPDATE leases SET expires_at = 0 WHERE thread_id = 'a' RETURNING 1",
        );
        let taken = store.claim("w2", &claim("c4")).unwrap().unwrap();
        assert_eq!(
            (taken.run.run_id.as_str(), taken.orphaned, taken.next_event),
            ("r1", true, 3)
        );
        assert_eq!(taken.lease.generation, 2, "the thread's lease taken over");
        // r3's lease is live: not claimable although its worker is dead.
        assert!(store.claim("w2", &claim("c5")).unwrap().is_none());
        // The old claim writes nothing more: no event, no trace.
        assert!(!store.append("r1", "c1", 3, &["{}".into()]).unwrap());
        let trace = |calls: u64| runner::checkpoint::TraceRow {
            run_id: "r1".into(),
            thread_id: "a".into(),
            trace: json!({"spans": []}),
            usage: json!({"total": {"calls": calls}}),
            updated_at: "u".into(),
        };
        store.put_trace(&trace(1), Some("c4")).unwrap();
        store.put_trace(&trace(2), Some("c1")).unwrap();
        assert_eq!(store.get_trace("r1").unwrap().unwrap().usage["total"]["calls"], 1);
        store.put_trace(&trace(3), Some("c4")).unwrap();
        assert_eq!(store.get_trace("r1").unwrap().unwrap().usage["total"]["calls"], 3);
    }

    /// A run's end is written under its claim, with its last record and a notice; not under a
    /// claim the run no longer has. A run waiting behind it on its thread is told to the
    /// workers as an admission is (they wake on admissions only).
    #[test]
    fn a_runs_end_is_its_claims_with_its_last_record() {
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::PowerSafe).unwrap();
        let mut notices = store.subscribe(false).unwrap();
        assert!(store.admit(&run_row("r", "t"), false, None).unwrap());
        let c = store.claim("w", &claim("c")).unwrap().unwrap();
        assert!(store.admit(&run_row("next", "t"), false, None).unwrap());
        let end = |status| Ended {
            status,
            error: None,
            at: "2020-01-01T12:00:00.000Z",
            record: Some((c.next_event, r#"{"type":"__end__"}"#)),
        };
        store.finish("r", "stale", end(RunStatus::Error)).unwrap();
        assert_eq!(store.get_run("r").unwrap().unwrap().status, RunStatus::Running);
        store.finish("r", "c", end(RunStatus::Success)).unwrap();
        let row = store.get_run("r").unwrap().unwrap();
        assert_eq!(
            (row.status, row.updated_at.as_str()),
            (RunStatus::Success, "2020-01-01T12:00:00.000Z")
        );
        assert_eq!(
            store.events("r", 0, 10).unwrap(),
            vec![(1, r#"{"type":"__end__"}"#.to_string())]
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut told = Vec::new();
        while !told.ends_with(&[Notice::Ended("r".into()), Notice::Queued]) {
            match notices.try_recv() {
                Ok(Notice::Lagged) => {}
                Ok(n) => told.push(n),
                _ if std::time::Instant::now() > deadline => panic!("told only {told:?}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        // The next run is claimable once the run's engine lets go of the thread.
        one(
            &url,
            "UPDATE leases SET expires_at = 0 WHERE thread_id = 't' RETURNING 1",
        );
        assert_eq!(store.claim("w", &claim("c2")).unwrap().unwrap().run.run_id, "next");
    }

    /// A run's events are told only to the processes that read runs: a worker hears the
    /// queue's admissions and ends, and is not woken by every event of every run.
    #[test]
    fn a_runs_events_are_told_to_readers_not_to_workers() {
        let url = postgres::fresh_url();
        let worker = PostgresCheckpointer::open(&url, Durability::PowerSafe).unwrap();
        let reader = PostgresCheckpointer::open(&url, Durability::PowerSafe).unwrap();
        let mut to_worker = worker.subscribe(false).unwrap();
        let mut to_reader = reader.subscribe(true).unwrap();
        // Each listener says it listens (a lag notice: look again) once it does: the reader's
        // twice, once for the queue's channel, once for the events'.
        let heard = |notices: &mut tokio::sync::broadcast::Receiver<Notice>, until: &dyn Fn(&[Notice]) -> bool| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut told = Vec::new();
            while !until(&told) {
                match notices.try_recv() {
                    Ok(n) => told.push(n),
                    _ if std::time::Instant::now() > deadline => panic!("told only {told:?}"),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            told
        };
        let lags = |n: usize| move |told: &[Notice]| told.iter().filter(|t| **t == Notice::Lagged).count() == n;
        heard(&mut to_worker, &lags(1));
        heard(&mut to_reader, &lags(2));
        assert!(worker.admit(&run_row("r", "t"), false, None).unwrap());
        let c = worker.claim("w", &claim("c")).unwrap().unwrap();
        let token = c.lease.owner.clone();
        assert!(
            worker
                .append("r", &token, c.next_event, &[r#"{"type":"custom"}"#.to_string()])
                .unwrap()
        );
        let end = Ended {
            status: RunStatus::Success,
            error: None,
            at: "2020-01-01T12:00:00.000Z",
            record: Some((c.next_event + 1, r#"{"type":"__end__"}"#)),
        };
        worker.finish("r", &token, end).unwrap();
        let ended = |told: &[Notice]| told.contains(&Notice::Ended("r".into()));
        let to_worker = heard(&mut to_worker, &ended);
        let to_reader = heard(&mut to_reader, &ended);
        assert!(to_worker.contains(&Notice::Queued), "{to_worker:?}");
        assert!(
            !to_worker.iter().any(|n| matches!(n, Notice::Events(..))),
            "{to_worker:?}"
        );
        assert!(
            to_reader
                .iter()
                .any(|n| matches!(n, Notice::Events(r, Some(_)) if r == "r")),
            "{to_reader:?}"
        );
    }

    /// A schema whose name comes near PostgreSQL's 63 bytes is told its notices all the same:
    /// its channels' names, which would pass that length, take a hash of it.
    #[test]
    fn a_long_schema_names_notices_are_told() {
        let url = format!("{}_{}", postgres::fresh_url(), "x".repeat(55));
        let store = PostgresCheckpointer::open(&url, Durability::PowerSafe).unwrap();
        let mut notices = store.subscribe(true).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut told = Vec::new();
        let mut admitted = false;
        while !told.contains(&Notice::Queued) {
            match notices.try_recv() {
                Ok(n) => told.push(n),
                _ if std::time::Instant::now() > deadline => panic!("told only {told:?}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            // Once both channels are listened to (a lag notice for each).
            if !admitted && told.iter().filter(|t| **t == Notice::Lagged).count() == 2 {
                assert!(store.admit(&run_row("r", "t"), false, None).unwrap());
                admitted = true;
            }
        }
    }

    /// A claim's round trip finds the claimed run's thread by the claim's token through an
    /// index of the running runs' claims: one entry read, however many runs are running.
    #[test]
    fn a_running_run_is_found_by_its_claim_through_an_index() {
        let url = postgres::fresh_url();
        let store = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        assert!(store.admit(&run_row("r", "t"), false, None).unwrap());
        let claimed = store.claim("w", &claim("token")).unwrap().unwrap();
        assert_eq!(claimed.view.map(|v| v.meta.is_none()), Some(true));
        let plan = postgres::query(
            &url,
            "SET enable_seqscan = off; \
             EXPLAIN SELECT r.thread_id FROM runs r WHERE r.status = 'running' AND r.claim = 'token'",
        )
        .unwrap();
        let plan: Vec<String> = plan.into_iter().filter_map(|r| r[0].clone()).collect();
        assert!(plan.iter().any(|line| line.contains("runs_by_claim")), "{plan:#?}");
    }

    /// The queue's hot calls are one round trip each: an admission (with the thread's record),
    /// a claim (the lease with it), an append to a run's log and a run's end — each sent once
    /// and answered once (its statement prepared once per connection, the first time).
    #[test]
    fn the_queues_calls_are_one_round_trip_each() {
        let (relayed, sends) = crate::checkpoint::counted_url(&postgres::fresh_url());
        for durability in [Durability::PowerSafe, Durability::CrashSafe] {
            let store = PostgresCheckpointer::open(relayed.as_str(), durability).unwrap();
            let tag = format!("{durability:?}");
            let counted = |what: &str, f: &dyn Fn(usize)| {
                // The first of each prepares its statement.
                f(0);
                let before = sends.load(Ordering::SeqCst);
                f(1);
                assert_eq!(sends.load(Ordering::SeqCst) - before, 1, "{tag}: {what} is one send");
            };
            counted("an admission", &|i| {
                let thread = format!("{tag}-{i}");
                assert!(
                    store
                        .admit(
                            &run_row(&format!("{thread}-r"), &thread),
                            true,
                            Some(&meta(&thread, "ann"))
                        )
                        .unwrap()
                );
            });
            counted("a claim", &|i| {
                let c = store.claim("w", &claim(&format!("{tag}-c{i}"))).unwrap().unwrap();
                assert_eq!(c.run.run_id, format!("{tag}-{i}-r"));
            });
            counted("an append", &|i| {
                let run = format!("{tag}-{i}-r");
                assert!(store.append(&run, &format!("{tag}-c{i}"), 1, &["{}".into()]).unwrap());
            });
            counted("an end", &|i| {
                let run = format!("{tag}-{i}-r");
                let end = Ended {
                    status: RunStatus::Success,
                    error: None,
                    at: "2020-01-01T12:00:00.000Z",
                    record: Some((2, "{}")),
                };
                store.finish(&run, &format!("{tag}-c{i}"), end).unwrap();
            });
            for i in 0..2 {
                let run = store.get_run(&format!("{tag}-{i}-r")).unwrap().unwrap();
                assert_eq!(run.status, RunStatus::Success, "{tag}: ended under its claim");
                assert_eq!(store.events(&run.run_id, 0, 10).unwrap().len(), 2);
            }
        }
    }
}
