//! A thread's removal takes the crons that run on it, whichever way it goes — `DELETE
//! /threads/{id}`, the TTL sweeper, `runner db prune`, or the store's `remove_thread` itself —
//! on every store; and on PostgreSQL a thread's expiry is judged by the database's clock, so a
//! process whose own clock runs ahead does not sweep a thread early.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use runner::checkpoint::memory::MemoryCheckpointer;
use runner::checkpoint::postgres::PostgresCheckpointer;
use runner::checkpoint::sqlite::SqliteCheckpointer;
use runner::checkpoint::{
    Checkpoint, Checkpointer, CronRow, Durability, LeaseClaim, Removal, Removed, Thread, ThreadMeta, ThreadStatus,
    new_id,
};
use serde_json::json;

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
        status: ThreadStatus::Done,
        created_at: "2020-01-01T10:00:00.000Z".into(),
        updated_at: "2020-01-01T10:00:00.000Z".into(),
        forked_from: None,
    }
}

fn checkpoint(thread_id: &str) -> Checkpoint {
    Checkpoint {
        checkpoint_id: new_id(),
        thread_id: thread_id.into(),
        parent_id: None,
        step: -1,
        versions: Default::default(),
        ran: Vec::new(),
        changed: Vec::new(),
        next: Vec::new(),
        meta: json!({}),
        plan_hash: "h".into(),
        created_at: "2020-01-01T10:00:01.000Z".into(),
    }
}

fn cron(id: &str, thread_id: Option<&str>) -> CronRow {
    CronRow {
        cron_id: id.into(),
        assistant_id: "a".into(),
        thread_id: thread_id.map(str::to_string),
        owner: None,
        schedule: "0 0 1 1 *".into(),
        timezone: None,
        payload: json!({}),
        metadata: json!({}),
        on_run_completed: None,
        enabled: true,
        end_ms: None,
        next_run_at: None,
        declared_by: None,
        created_at: "2020-01-01T10:00:00.000Z".into(),
        updated_at: "2020-01-01T10:00:00.000Z".into(),
    }
}

/// A thread (with its first checkpoint and the API's record of it) and a cron on it, and a
/// cron on another thread and one without a thread; the thread removed, only its cron goes.
fn removes_its_crons(store: &dyn Checkpointer) {
    for id in ["gone", "stays"] {
        store.create_thread(&thread(id)).unwrap();
        store.put_checkpoint(&checkpoint(id), &[]).unwrap();
        store
            .put_thread_meta(&ThreadMeta {
                thread_id: id.into(),
                created_at: "2020-01-01T10:00:00.000Z".into(),
                updated_at: "2020-01-01T10:00:00.000Z".into(),
                metadata: json!({}),
                ttl: None,
            })
            .unwrap();
    }
    store.put_cron(&cron("on-gone", Some("gone"))).unwrap();
    store.put_cron(&cron("on-stays", Some("stays"))).unwrap();
    store.put_cron(&cron("threadless", None)).unwrap();
    let claim = LeaseClaim {
        thread_id: String::new(),
        owner: new_id(),
        pid: std::process::id(),
        host: "here".into(),
        ttl: Duration::from_secs(30),
        replace: None,
    };
    let removed = store.remove_thread("gone", &Removal::default(), &claim).unwrap();
    assert_eq!(removed, Removed::Removed);
    let left: Vec<String> = store.list_crons().unwrap().into_iter().map(|c| c.cron_id).collect();
    assert_eq!(left, ["on-stays", "threadless"]);
}

#[test]
fn every_store_removes_a_threads_crons_with_the_thread() {
    removes_its_crons(&MemoryCheckpointer::new());
    let dir = tempfile::tempdir().unwrap();
    removes_its_crons(&SqliteCheckpointer::open(&dir.path().join("runs.db"), Durability::CrashSafe).unwrap());
    removes_its_crons(&PostgresCheckpointer::open(&postgres::fresh_url(), Durability::CrashSafe).unwrap());
}

/// The served chat workflow, in a temporary folder.
fn served() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serve");
    std::fs::create_dir(dir.path().join("workflows")).unwrap();
    std::fs::copy(fixtures.join("chat.yaml"), dir.path().join("workflows/chat.yaml")).unwrap();
    dir
}

fn serve(dir: &Path, args: &[&str]) -> Server {
    let mock = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serve/mock.yaml");
    let (child, base, _) = spawn(dir, &dir.join("workflows"), &mock, args, &[]);
    Server { child, base, dir: None }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The threads of the crons the API lists, in order.
async fn cron_threads(base: &str) -> Vec<String> {
    let (status, crons) = call(
        reqwest::Method::POST,
        format!("{base}/runs/crons/search"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{crons}");
    let mut threads: Vec<String> = crons
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["thread_id"].as_str().unwrap_or_default().to_string())
        .collect();
    threads.sort();
    threads
}

/// Three threads with a cron each (yearly: none fires meanwhile): one deleted through the API,
/// one swept when its time to live runs out, one pruned by `runner db prune`; each takes its
/// cron with it.
fn every_removal_takes_the_crons(dir: &Path, db: &str) {
    let server = serve(dir, &["--db", db, "--ttl-sweep-interval", "0.2"]);
    let base = server.base.clone();
    rt().block_on(async {
        use reqwest::Method;
        for (id, ttl) in [("deleted", None), ("swept", Some(0.02)), ("pruned", None)] {
            let (status, t) = call(
                Method::POST,
                format!("{base}/threads"),
                Some(json!({"thread_id": id, "ttl": ttl})),
            )
            .await;
            assert_eq!(status, 200, "{t}");
            let (status, c) = call(
                Method::POST,
                format!("{base}/threads/{id}/runs/crons"),
                Some(json!({"assistant_id": "chat", "schedule": "0 0 1 1 *",
                            "input": {"messages": [{"role": "user", "content": "hi"}]}})),
            )
            .await;
            assert_eq!(status, 200, "{c}");
        }
        assert_eq!(cron_threads(&base).await, ["deleted", "pruned", "swept"]);
        let (status, _) = call(Method::DELETE, format!("{base}/threads/deleted"), None).await;
        assert_eq!(status, 204);
        until_status(&base, "/threads/swept", 404).await;
        assert_eq!(cron_threads(&base).await, ["pruned"]);
    });
    let pruned = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir)
        .args(["db", "prune", "--older-than", "0s", "--db", db])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&pruned.stderr);
    assert_eq!(pruned.status.code(), Some(0), "{said}");
    assert_eq!(String::from_utf8_lossy(&pruned.stdout), "pruned\n", "{said}");
    rt().block_on(async {
        assert_eq!(cron_threads(&base).await, Vec::<String>::new());
    });
}

#[test]
fn a_deleted_swept_or_pruned_thread_takes_its_crons_on_sqlite() {
    let dir = served();
    let db = dir.path().join("runs.db");
    every_removal_takes_the_crons(dir.path(), db.to_str().unwrap());
}

#[test]
fn a_deleted_swept_or_pruned_thread_takes_its_crons_on_postgres() {
    let dir = served();
    every_removal_takes_the_crons(dir.path(), &postgres::fresh_url());
}

/// A server whose clock (`--clock-file`, read by its scheduler and its TTL sweeper) runs an
/// hour ahead sweeps a thread of a short time to live and one of ten minutes: both expired by
/// its clock. Returns whether the ten-minute thread is still there once the short one is gone.
fn long_thread_outlives_a_skewed_sweep(dir: &Path, db: &str) -> bool {
    let clock = dir.join("clock");
    std::fs::write(&clock, (runner::clock::now_ms() + 3_600_000).to_string()).unwrap();
    let server = serve(
        dir,
        &[
            "--db",
            db,
            "--ttl-sweep-interval",
            "0.2",
            "--clock-file",
            clock.to_str().unwrap(),
        ],
    );
    let base = server.base.clone();
    rt().block_on(async {
        use reqwest::Method;
        for (id, minutes) in [("long", 10.0), ("short", 0.02)] {
            let (status, t) = call(
                Method::POST,
                format!("{base}/threads"),
                Some(json!({"thread_id": id, "ttl": {"ttl": minutes, "strategy": "delete"}})),
            )
            .await;
            assert_eq!(status, 200, "{t}");
        }
        until_status(&base, "/threads/short", 404).await;
        // A sweep after the one that took `short`: whatever it would take, it has.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let (status, _) = call(Method::GET, format!("{base}/threads/long"), None).await;
        status == 200
    })
}

/// On PostgreSQL the database's clock judges expiry: the ten-minute thread stays, however far
/// ahead the sweeping process's clock is. On SQLite the process's clock does (there is no
/// other), and the skew shows: the ten-minute thread goes at once.
#[test]
fn a_thread_expires_by_the_databases_clock_on_postgres_not_a_skewed_process_clock() {
    let dir = served();
    assert!(long_thread_outlives_a_skewed_sweep(dir.path(), &postgres::fresh_url()));
    let dir = served();
    let db = dir.path().join("runs.db");
    assert!(!long_thread_outlives_a_skewed_sweep(dir.path(), db.to_str().unwrap()));
}
