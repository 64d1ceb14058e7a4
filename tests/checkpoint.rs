//! Checkpoint storage: one conformance suite, run against every [`Checkpointer`] (memory, and
//! SQLite and PostgreSQL at both durability levels), the run store through its trait on each
//! backend across openings, then what only SQLite promises — surviving a reopen, group commit,
//! readers that never see SQLITE_BUSY, the synchronous pragma, and storage that grows with what
//! changed rather than with steps × state size — and what PostgreSQL does: one lease among
//! processes' connections, data that outlives the store, a schema that is a store of its own.
//!
//! PostgreSQL is a real server on loopback, shared by the tests (`support/postgres.rs`); each
//! store is opened on a schema of its own, so every test starts empty.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use runner::checkpoint::memory::MemoryCheckpointer;
use runner::checkpoint::postgres::PostgresCheckpointer;
use runner::checkpoint::sqlite::{SCHEMA_VERSION, SqliteCheckpointer};
use runner::checkpoint::{
    Attempt, CacheEntry, CacheStore, Checkpoint, CheckpointError, Checkpointer, CronRow, Delivery, DeliveryState,
    Durability, Fence, LeaseClaim, PendingWrite, Put, Removal, Removed, RunRow, RunStatus, RunStore, TaskSpec, Thread,
    ThreadHead, ThreadMeta, ThreadStatus, ThreadTtl, new_id,
};
use serde_json::{Map, Value, json};

use crate::support::postgres::fresh_url;

// ---------------------------------------------------------------------------------------------
// Fixtures.

fn thread(id: &str) -> Thread {
    Thread {
        thread_id: id.into(),
        workflow: "workflows/research.yaml".into(),
        plan_hash: "plan-1".into(),
        input: json!({"query": "why is the sky blue?"}),
        context: json!({"user_id": "u1"}),
        config: json!({"max_subtopics": 3}),
        status: ThreadStatus::Running,
        created_at: "2020-01-01T10:00:00.000Z".into(),
        updated_at: "2020-01-01T10:00:00.000Z".into(),
        forked_from: None,
    }
}

fn versions(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn checkpoint(thread_id: &str, parent: Option<&Checkpoint>, step: i64, vs: &[(&str, u64)]) -> Checkpoint {
    Checkpoint {
        checkpoint_id: new_id(),
        thread_id: thread_id.into(),
        parent_id: parent.map(|p| p.checkpoint_id.clone()),
        step,
        versions: versions(vs),
        ran: vec!["plan".into()],
        changed: vs.iter().map(|(k, _)| k.to_string()).collect(),
        next: vec![
            TaskSpec {
                task_id: format!("task-{step}-a"),
                node: "search".into(),
                item: Some(json!({"q": step})),
            },
            TaskSpec {
                task_id: format!("task-{step}-b"),
                node: "scrape".into(),
                item: None,
            },
        ],
        meta: json!({"visits": {"plan": step + 1}, "barrier": []}),
        plan_hash: "plan-1".into(),
        created_at: "2020-01-01T10:00:01.000Z".into(),
    }
}

fn vals(items: &[(&str, u64, Value)]) -> Vec<(String, u64, Value)> {
    items.iter().map(|(k, v, x)| (k.to_string(), *v, x.clone())).collect()
}

fn write(task: &str, idx: u32, channel: &str, value: Value) -> PendingWrite {
    PendingWrite {
        task_id: task.into(),
        idx,
        channel: channel.into(),
        value,
    }
}

fn ids(checkpoints: &[Checkpoint]) -> Vec<&str> {
    checkpoints.iter().map(|c| c.checkpoint_id.as_str()).collect()
}

fn thread_ids(threads: &[Thread]) -> Vec<&str> {
    threads.iter().map(|t| t.thread_id.as_str()).collect()
}

fn obj(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// Three checkpoints on thread `id` (created if missing): `a` changes at every step, `b` only
/// at the first.
fn three_steps(cp: &dyn Checkpointer, id: &str) -> [Checkpoint; 3] {
    if cp.get_thread(id).unwrap().is_none() {
        cp.create_thread(&thread(id)).unwrap();
    }
    let c0 = checkpoint(id, None, -1, &[("a", 1), ("b", 1)]);
    cp.put_checkpoint(&c0, &vals(&[("a", 1, json!("a1")), ("b", 1, json!(["b1"]))]))
        .unwrap();
    let c1 = checkpoint(id, Some(&c0), 0, &[("a", 2), ("b", 1)]);
    cp.put_checkpoint(&c1, &vals(&[("a", 2, json!("a2"))])).unwrap();
    let c2 = checkpoint(id, Some(&c1), 1, &[("a", 3), ("b", 1)]);
    cp.put_checkpoint(&c2, &vals(&[("a", 3, json!("a3"))])).unwrap();
    [c0, c1, c2]
}

// ---------------------------------------------------------------------------------------------
// The conformance suite.

fn threads(cp: &dyn Checkpointer) {
    assert_eq!(cp.list_threads().unwrap(), vec![]);
    assert_eq!(cp.get_thread("t1").unwrap(), None);

    cp.create_thread(&thread("t1")).unwrap();
    let mut forked = thread("t2");
    forked.forked_from = Some(("t0".into(), "c0".into()));
    forked.status = ThreadStatus::Interrupted;
    cp.create_thread(&forked).unwrap();
    assert_eq!(cp.get_thread("t1").unwrap(), Some(thread("t1")));
    assert_eq!(cp.get_thread("t2").unwrap(), Some(forked.clone()));
    assert_eq!(thread_ids(&cp.list_threads().unwrap()), ["t2", "t1"]);

    let err = cp.create_thread(&thread("t1")).unwrap_err();
    assert!(
        matches!(err, CheckpointError::ThreadExists(ref id) if id == "t1"),
        "{err}"
    );
    assert_eq!(
        cp.get_thread("t2").unwrap(),
        Some(forked),
        "a refused create changes nothing"
    );

    cp.set_status("t1", ThreadStatus::Done).unwrap();
    let t1 = cp.get_thread("t1").unwrap().unwrap();
    assert_eq!(t1.status, ThreadStatus::Done);
    assert!(t1.updated_at > t1.created_at, "updated_at moves: {}", t1.updated_at);
    assert_eq!(t1.created_at, thread("t1").created_at);
    assert_eq!(
        thread_ids(&cp.list_threads().unwrap()),
        ["t1", "t2"],
        "most recently updated first"
    );
    cp.set_status("t2", ThreadStatus::Failed).unwrap();
    cp.set_status("t1", ThreadStatus::Running).unwrap();
    cp.set_status("t2", ThreadStatus::Interrupted).unwrap();
    assert_eq!(
        thread_ids(&cp.list_threads().unwrap()),
        ["t2", "t1"],
        "even within one millisecond"
    );
    let heads: Vec<ThreadHead> = cp.list_threads().unwrap().into_iter().map(ThreadHead::from).collect();
    assert_eq!(cp.list_thread_heads().unwrap(), heads);

    let err = cp.set_status("nope", ThreadStatus::Done).unwrap_err();
    assert!(
        matches!(err, CheckpointError::NoThread(ref id) if id == "nope"),
        "{err}"
    );
}

fn checkpoints(cp: &dyn Checkpointer) {
    let c = checkpoint("t", None, -1, &[]);
    assert!(matches!(cp.put_checkpoint(&c, &[]), Err(CheckpointError::NoThread(_))));
    assert_eq!(
        cp.get_checkpoint("t", None).unwrap(),
        None,
        "a missing thread has no checkpoint"
    );
    assert!(matches!(cp.history("t"), Err(CheckpointError::NoThread(_))));

    cp.create_thread(&thread("t")).unwrap();
    assert_eq!(cp.get_checkpoint("t", None).unwrap(), None, "no checkpoint yet");
    assert_eq!(cp.history("t").unwrap(), vec![]);

    let [c0, c1, c2] = three_steps(cp, "t");
    assert_eq!(cp.get_checkpoint("t", None).unwrap().as_ref(), Some(&c2), "latest");
    assert_eq!(
        cp.get_checkpoint("t", Some(&c1.checkpoint_id)).unwrap().as_ref(),
        Some(&c1)
    );
    assert_eq!(cp.get_checkpoint("t", Some("nope")).unwrap(), None);
    assert_eq!(cp.history("t").unwrap(), vec![c2.clone(), c1.clone(), c0.clone()]);

    // Newest first is by id (ids are time-ordered), whatever the step and the insertion order.
    let mut late = checkpoint("t", Some(&c2), 7, &[]);
    late.checkpoint_id = "ffff-b-late".into();
    let mut early = checkpoint("t", Some(&c2), 7, &[]);
    early.checkpoint_id = "ffff-a-early".into();
    let mut last = checkpoint("t", Some(&late), 3, &[]);
    last.checkpoint_id = "ffff-c-last".into();
    for c in [&last, &early, &late] {
        cp.put_checkpoint(c, &[]).unwrap();
    }
    let history = cp.history("t").unwrap();
    assert_eq!(ids(&history)[..3], ["ffff-c-last", "ffff-b-late", "ffff-a-early"]);
    assert_eq!(
        cp.get_checkpoint("t", None).unwrap().unwrap().checkpoint_id,
        "ffff-c-last"
    );

    let mut dup = c1.clone();
    dup.step = 99;
    let err = cp.put_checkpoint(&dup, &[]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Backend(ref m) if m.contains("already exists")),
        "{err}"
    );
    assert_eq!(
        cp.get_checkpoint("t", Some(&c1.checkpoint_id)).unwrap(),
        Some(c1),
        "refused put changes nothing"
    );

    // Another thread's checkpoints are not this one's.
    cp.create_thread(&thread("other")).unwrap();
    assert_eq!(cp.get_checkpoint("other", Some(&c0.checkpoint_id)).unwrap(), None);
    assert_eq!(cp.history("other").unwrap(), vec![]);
}

fn state(cp: &dyn Checkpointer) {
    let [c0, c1, c2] = three_steps(cp, "t");
    let at = |c: &Checkpoint| cp.state("t", &c.versions).unwrap();
    assert_eq!(at(&c0), obj(json!({"a": "a1", "b": ["b1"]})));
    assert_eq!(at(&c1), obj(json!({"a": "a2", "b": ["b1"]})));
    assert_eq!(at(&c2), obj(json!({"a": "a3", "b": ["b1"]})));
    assert_eq!(cp.state("t", &BTreeMap::new()).unwrap(), Map::new());
    assert_eq!(
        cp.state("t", &versions(&[("b", 1)])).unwrap(),
        obj(json!({"b": ["b1"]}))
    );

    // A version's value is stored once: a later put of the same version does not replace it.
    let c3 = checkpoint("t", Some(&c2), 2, &[("a", 3), ("b", 1)]);
    cp.put_checkpoint(&c3, &vals(&[("a", 3, json!("other"))])).unwrap();
    assert_eq!(at(&c3), obj(json!({"a": "a3", "b": ["b1"]})));

    let err = cp.state("t", &versions(&[("a", 9)])).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Corrupt(ref m) if m.contains("`a`") && m.contains('9')),
        "{err}"
    );
    let err = cp.state("t", &versions(&[("zzz", 1)])).unwrap_err();
    assert!(matches!(err, CheckpointError::Corrupt(_)), "{err}");
    assert!(matches!(
        cp.state("nope", &c0.versions),
        Err(CheckpointError::NoThread(_))
    ));
    assert!(matches!(
        cp.state("nope", &BTreeMap::new()),
        Err(CheckpointError::NoThread(_))
    ));

    // A checkpoint and its state read together: what the reads apart read.
    for c in [&c0, &c1, &c2, &c3] {
        let (got, state) = cp.checkpoint_state("t", Some(&c.checkpoint_id)).unwrap().unwrap();
        assert_eq!((&got, &state), (c, &at(c)));
    }
    assert_eq!(cp.checkpoint_state("t", None).unwrap().unwrap(), (c3.clone(), at(&c3)));
    assert_eq!(cp.checkpoint_state("t", Some("nope")).unwrap(), None);
    assert_eq!(cp.checkpoint_state("nope", None).unwrap(), None);

    // Values belong to their thread.
    cp.create_thread(&thread("other")).unwrap();
    assert!(matches!(
        cp.state("other", &c0.versions),
        Err(CheckpointError::Corrupt(_))
    ));
}

/// A key unchanged for 50 checkpoints is stored once; `rows` counts stored values.
fn values_stored_once(cp: &dyn Checkpointer, rows: &dyn Fn() -> u64) {
    let before = rows();
    cp.create_thread(&thread("t")).unwrap();
    let big = json!({"doc": "x".repeat(10_000)});
    let mut parent = checkpoint("t", None, -1, &[("big", 1), ("n", 0)]);
    cp.put_checkpoint(&parent, &vals(&[("big", 1, big.clone()), ("n", 0, json!(0))]))
        .unwrap();
    for step in 0..50u64 {
        let c = checkpoint("t", Some(&parent), step as i64, &[("big", 1), ("n", step + 1)]);
        cp.put_checkpoint(&c, &vals(&[("n", step + 1, json!(step + 1))]))
            .unwrap();
        parent = c;
    }
    assert_eq!(rows() - before, 2 + 50, "`big` once, `n` once per version");
    assert_eq!(
        cp.state("t", &parent.versions).unwrap(),
        obj(json!({"big": big, "n": 50}))
    );
}

fn writes(cp: &dyn Checkpointer) {
    assert!(matches!(
        cp.put_writes("t", "c", &[]),
        Err(CheckpointError::NoThread(_))
    ));
    assert!(matches!(cp.get_writes("t", "c"), Err(CheckpointError::NoThread(_))));
    let [c0, c1, _] = three_steps(cp, "t");
    let err = cp.put_writes("t", "nope", &[write("x", 0, "a", json!(1))]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::NoCheckpoint(ref t, ref c) if t == "t" && c == "nope"),
        "{err}"
    );
    assert!(matches!(
        cp.get_writes("t", "nope"),
        Err(CheckpointError::NoCheckpoint(..))
    ));
    assert_eq!(cp.get_writes("t", &c1.checkpoint_id).unwrap(), vec![]);

    // Tasks finish in any order; writes come back in (task, idx) order.
    let c = &c1.checkpoint_id;
    cp.put_writes(
        "t",
        c,
        &[
            write("t2", 1, "__goto__", json!("end")),
            write("t2", 0, "a", json!({"x": 2})),
        ],
    )
    .unwrap();
    cp.put_writes("t", c, &[write("t1", 0, "a", json!([1]))]).unwrap();
    cp.put_writes("t", c, &[]).unwrap();
    let expected = vec![
        write("t1", 0, "a", json!([1])),
        write("t2", 0, "a", json!({"x": 2})),
        write("t2", 1, "__goto__", json!("end")),
    ];
    assert_eq!(cp.get_writes("t", c).unwrap(), expected);

    // A task re-run after a crash re-puts its writes: idempotent, and the latest run wins.
    cp.put_writes("t", c, &[write("t1", 0, "a", json!([1]))]).unwrap();
    assert_eq!(cp.get_writes("t", c).unwrap(), expected);
    cp.put_writes("t", c, &[write("t2", 0, "a", json!({"x": 3}))]).unwrap();
    let mut replaced = expected.clone();
    replaced[1].value = json!({"x": 3});
    assert_eq!(cp.get_writes("t", c).unwrap(), replaced);

    // Writes belong to their checkpoint.
    assert_eq!(cp.get_writes("t", &c0.checkpoint_id).unwrap(), vec![]);
    cp.put_writes("t", &c0.checkpoint_id, &[write("t0", 0, "__error__", json!("boom"))])
        .unwrap();
    assert_eq!(cp.get_writes("t", c).unwrap(), replaced);
    assert_eq!(
        cp.get_writes("t", &c0.checkpoint_id).unwrap(),
        vec![write("t0", 0, "__error__", json!("boom"))]
    );
}

fn delete(cp: &dyn Checkpointer) {
    assert!(matches!(cp.delete_thread("a"), Err(CheckpointError::NoThread(_))));
    let [_, a1, a2] = three_steps(cp, "a");
    let [_, b1, b2] = three_steps(cp, "b");
    cp.put_writes("a", &a1.checkpoint_id, &[write("x", 0, "a", json!(1))])
        .unwrap();
    cp.put_writes("b", &b1.checkpoint_id, &[write("y", 0, "a", json!(2))])
        .unwrap();

    cp.delete_thread("a").unwrap();
    assert_eq!(cp.get_thread("a").unwrap(), None);
    assert_eq!(thread_ids(&cp.list_threads().unwrap()), ["b"]);
    assert_eq!(cp.get_checkpoint("a", None).unwrap(), None);
    assert_eq!(cp.get_checkpoint("a", Some(&a1.checkpoint_id)).unwrap(), None);
    assert!(matches!(cp.history("a"), Err(CheckpointError::NoThread(_))));
    assert!(matches!(
        cp.get_writes("a", &a1.checkpoint_id),
        Err(CheckpointError::NoThread(_))
    ));
    assert!(matches!(cp.delete_thread("a"), Err(CheckpointError::NoThread(_))));

    // The other thread is whole.
    assert_eq!(cp.history("b").unwrap().len(), 3);
    assert_eq!(
        cp.state("b", &b2.versions).unwrap(),
        obj(json!({"a": "a3", "b": ["b1"]}))
    );
    assert_eq!(
        cp.get_writes("b", &b1.checkpoint_id).unwrap(),
        vec![write("y", 0, "a", json!(2))]
    );

    // The id can be used again, and nothing of the old thread comes back with it.
    cp.create_thread(&thread("a")).unwrap();
    assert_eq!(cp.history("a").unwrap(), vec![]);
    assert!(matches!(cp.state("a", &a2.versions), Err(CheckpointError::Corrupt(_))));
}

/// A branch started from an older checkpoint of the same thread (a run or a state update from
/// it) is the thread's head once written, even at a lower step than the branch it leaves:
/// "latest" is the newest checkpoint written, as in LangGraph, not the highest step.
fn branch(cp: &dyn Checkpointer) {
    let [_, c1, c2] = three_steps(cp, "b");
    let b1 = checkpoint("b", Some(&c1), 1, &[("a", 4), ("b", 1)]);
    cp.put_checkpoint(&b1, &vals(&[("a", 4, json!("branch"))])).unwrap();
    let head = cp.get_checkpoint("b", None).unwrap().unwrap();
    assert_eq!(head.checkpoint_id, b1.checkpoint_id, "a branch at the head's step");
    // Lower than the old head's step: a branch from the first checkpoint.
    let c0 = cp
        .get_checkpoint("b", Some(&c1.parent_id.clone().unwrap()))
        .unwrap()
        .unwrap();
    let low = checkpoint("b", Some(&c0), 0, &[("a", 5), ("b", 1)]);
    cp.put_checkpoint(&low, &vals(&[("a", 5, json!("low"))])).unwrap();
    let head = cp.get_checkpoint("b", None).unwrap().unwrap();
    assert_eq!(
        head.checkpoint_id, low.checkpoint_id,
        "the newest checkpoint is the head"
    );
    assert_eq!(cp.state("b", &head.versions).unwrap()["a"], json!("low"));
    let history = cp.history("b").unwrap();
    assert_eq!(
        ids(&history),
        [
            low.checkpoint_id.as_str(),
            b1.checkpoint_id.as_str(),
            c2.checkpoint_id.as_str(),
            c1.checkpoint_id.as_str(),
            c0.checkpoint_id.as_str()
        ],
        "newest first"
    );
}

fn fork(cp: &dyn Checkpointer) {
    let [_, c1, c2] = three_steps(cp, "src");
    cp.put_writes("src", &c1.checkpoint_id, &[write("x", 0, "a", json!(1))])
        .unwrap();
    cp.set_status("src", ThreadStatus::Interrupted).unwrap();
    let source = cp.get_thread("src").unwrap().unwrap();
    let source_history = cp.history("src").unwrap();

    let forked = cp.fork("src", &c1.checkpoint_id, "f").unwrap();
    assert_eq!(forked.thread_id, "f");
    assert_ne!(forked.checkpoint_id, c1.checkpoint_id);
    assert_eq!(forked.parent_id, None);
    assert_eq!(
        (
            forked.step,
            &forked.versions,
            &forked.ran,
            &forked.changed,
            &forked.next,
            &forked.meta,
            &forked.plan_hash
        ),
        (
            c1.step,
            &c1.versions,
            &c1.ran,
            &c1.changed,
            &c1.next,
            &c1.meta,
            &c1.plan_hash
        )
    );

    let f = cp.get_thread("f").unwrap().unwrap();
    assert_eq!(f.forked_from, Some(("src".into(), c1.checkpoint_id.clone())));
    assert_eq!(f.status, ThreadStatus::Running);
    assert_eq!(
        (&f.workflow, &f.plan_hash, &f.input, &f.context, &f.config),
        (
            &source.workflow,
            &source.plan_hash,
            &source.input,
            &source.context,
            &source.config
        )
    );
    assert_eq!(thread_ids(&cp.list_threads().unwrap()), ["f", "src"]);
    assert_eq!(cp.history("f").unwrap(), vec![forked.clone()]);
    assert_eq!(cp.get_checkpoint("f", None).unwrap().as_ref(), Some(&forked));
    assert_eq!(
        cp.state("f", &forked.versions).unwrap(),
        cp.state("src", &c1.versions).unwrap()
    );
    assert_eq!(
        cp.get_writes("f", &forked.checkpoint_id).unwrap(),
        vec![],
        "the fork re-runs the step"
    );

    // The original is unchanged.
    assert_eq!(cp.get_thread("src").unwrap().as_ref(), Some(&source));
    assert_eq!(cp.history("src").unwrap(), source_history);
    assert_eq!(cp.get_writes("src", &c1.checkpoint_id).unwrap().len(), 1);

    // The fork is resumable from its checkpoint, and lives on after its source is deleted.
    cp.put_writes("f", &forked.checkpoint_id, &[write("y", 0, "a", json!("edited"))])
        .unwrap();
    let next = checkpoint("f", Some(&forked), forked.step + 1, &[("a", 3), ("b", 1)]);
    cp.put_checkpoint(&next, &vals(&[("a", 3, json!("forked a3"))]))
        .unwrap();
    assert_eq!(cp.get_checkpoint("f", None).unwrap().as_ref(), Some(&next));
    assert_eq!(
        cp.state("src", &c2.versions).unwrap(),
        obj(json!({"a": "a3", "b": ["b1"]})),
        "own values"
    );
    cp.delete_thread("src").unwrap();
    assert_eq!(
        cp.state("f", &next.versions).unwrap(),
        obj(json!({"a": "forked a3", "b": ["b1"]}))
    );
    assert_eq!(
        cp.state("f", &forked.versions).unwrap(),
        obj(json!({"a": "a2", "b": ["b1"]}))
    );

    // Errors, in this order: source thread, its checkpoint, then the new id.
    let [_, g1, _] = three_steps(cp, "g");
    assert!(matches!(cp.fork("nope", &g1.checkpoint_id, "x"), Err(CheckpointError::NoThread(ref t)) if t == "nope"));
    assert!(matches!(
        cp.fork("g", "nope", "f"),
        Err(CheckpointError::NoCheckpoint(..))
    ));
    assert!(matches!(cp.fork("g", &g1.checkpoint_id, "f"), Err(CheckpointError::ThreadExists(ref t)) if t == "f"));
    assert!(matches!(
        cp.fork("g", &g1.checkpoint_id, "g"),
        Err(CheckpointError::ThreadExists(_))
    ));

    // A fork is all or nothing: a missing value leaves no half-made thread.
    let broken = checkpoint("g", Some(&g1), 5, &[("a", 2), ("lost", 4)]);
    cp.put_checkpoint(&broken, &[]).unwrap();
    assert!(matches!(
        cp.fork("g", &broken.checkpoint_id, "h"),
        Err(CheckpointError::Corrupt(_))
    ));
    assert_eq!(cp.get_thread("h").unwrap(), None);
    cp.create_thread(&thread("h")).unwrap();
    assert_eq!(cp.history("h").unwrap(), vec![]);
}

// ---------------------------------------------------------------------------------------------
// Every backend runs every case.

fn plan_hashes(cp: &dyn Checkpointer) {
    // A checkpoint made by another version of the workflow than the thread's keeps its hash.
    cp.create_thread(&thread("h")).unwrap();
    let same = checkpoint("h", None, -1, &[]);
    let mut other = checkpoint("h", Some(&same), 0, &[]);
    other.plan_hash = "plan-2".into();
    cp.put_checkpoint(&same, &[]).unwrap();
    cp.put_checkpoint(&other, &[]).unwrap();
    let thread_hash = cp.get_thread("h").unwrap().unwrap().plan_hash;
    assert_eq!(
        cp.get_checkpoint("h", Some(&same.checkpoint_id))
            .unwrap()
            .unwrap()
            .plan_hash,
        same.plan_hash
    );
    assert_eq!(cp.get_checkpoint("h", None).unwrap().unwrap().plan_hash, "plan-2");
    assert_eq!(
        cp.history("h")
            .unwrap()
            .iter()
            .map(|c| c.plan_hash.clone())
            .collect::<Vec<_>>(),
        vec!["plan-2".to_string(), same.plan_hash.clone()]
    );
    assert_eq!(thread_hash, cp.get_thread("h").unwrap().unwrap().plan_hash);
}

fn batch(cp: &dyn Checkpointer) {
    cp.create_thread(&thread("b")).unwrap();
    let c0 = checkpoint("b", None, -1, &[("n", 1)]);
    let c1 = checkpoint("b", Some(&c0), 0, &[("n", 2)]);
    cp.put_batch(vec![
        Put::Checkpoint(Arc::new(c0.clone()), vals(&[("n", 1, json!(0))])),
        Put::Writes {
            thread_id: "b".into(),
            checkpoint_id: c0.checkpoint_id.clone(),
            writes: vec![write("t", 0, "n", json!(1))],
        },
        Put::Checkpoint(Arc::new(c1.clone()), vals(&[("n", 2, json!(1))])),
    ])
    .unwrap();
    assert_eq!(
        ids(&cp.history("b").unwrap()),
        vec![c1.checkpoint_id.as_str(), c0.checkpoint_id.as_str()]
    );
    assert_eq!(cp.get_writes("b", &c0.checkpoint_id).unwrap().len(), 1);
    assert_eq!(cp.state("b", &c1.versions).unwrap(), obj(json!({"n": 1})));
    // A batch with a bad put fails (SQLite's, being one transaction, leaves nothing behind).
    let c2 = checkpoint("b", Some(&c1), 1, &[("n", 3)]);
    let failed = cp.put_batch(vec![
        Put::Checkpoint(Arc::new(c2.clone()), vals(&[("n", 3, json!(2))])),
        Put::Writes {
            thread_id: "b".into(),
            checkpoint_id: "missing".into(),
            writes: vec![write("t", 0, "n", json!(1))],
        },
    ]);
    assert!(failed.is_err());
}

fn claim(thread_id: &str, owner: &str, ttl_ms: u64) -> LeaseClaim {
    LeaseClaim {
        thread_id: thread_id.into(),
        owner: owner.into(),
        pid: 4242,
        host: "host-a".into(),
        ttl: std::time::Duration::from_millis(ttl_ms),
        replace: None,
    }
}

/// One owner per thread: a lease is granted when free, expired, already the claimant's, or
/// explicitly replaced; otherwise the holder is named. It may exist before its thread.
fn leases(cp: &dyn Checkpointer) {
    assert_eq!(cp.lease("L").unwrap(), None);
    let a = cp.acquire_lease(&claim("L", "owner-a", 60_000)).unwrap();
    assert_eq!((a.owner.as_str(), a.generation, a.pid), ("owner-a", 1, 4242));
    assert_eq!(cp.get_thread("L").unwrap(), None, "the lease comes before the thread");
    assert_eq!(cp.lease("L").unwrap(), Some(a.clone()));

    // Another owner is refused, and told who holds it.
    match cp.acquire_lease(&claim("L", "owner-b", 60_000)) {
        Err(CheckpointError::Leased(holder)) => {
            assert_eq!(*holder, a);
            let message = CheckpointError::Leased(holder).to_string();
            assert!(
                message.starts_with("thread L is running in process 4242 on host host-a since "),
                "{message}"
            );
        }
        other => panic!("expected the lease to be held: {other:?}"),
    }
    // The holder claiming again keeps its generation and extends the expiry.
    let again = cp.acquire_lease(&claim("L", "owner-a", 120_000)).unwrap();
    assert_eq!(again.generation, 1);
    assert!(again.expires_at_ms > a.expires_at_ms);
    // Renewal extends; release frees.
    let renewed = cp.renew_lease(&a.fence(), std::time::Duration::from_secs(300)).unwrap();
    assert!(renewed.expires_at_ms > again.expires_at_ms);
    cp.release_lease(&a.fence()).unwrap();
    assert_eq!(cp.lease("L").unwrap(), None);

    // An expired lease is taken over, with the next generation; the old owner can neither
    // renew it nor release it.
    let old = cp.acquire_lease(&claim("M", "owner-a", 0)).unwrap();
    let new = cp.acquire_lease(&claim("M", "owner-b", 60_000)).unwrap();
    assert_eq!((new.owner.as_str(), new.generation), ("owner-b", old.generation + 1));
    assert!(matches!(
        cp.renew_lease(&old.fence(), std::time::Duration::from_secs(1)),
        Err(CheckpointError::LeaseLost(t)) if t == "M"
    ));
    cp.release_lease(&old.fence()).unwrap();
    assert_eq!(cp.lease("M").unwrap().map(|l| l.owner), Some("owner-b".to_string()));

    // A live lease is replaced only from the owner named (its process is known gone).
    let mut replace = claim("M", "owner-c", 60_000);
    replace.replace = Some("owner-a".into());
    assert!(matches!(cp.acquire_lease(&replace), Err(CheckpointError::Leased(_))));
    replace.replace = Some("owner-b".into());
    let c = cp.acquire_lease(&replace).unwrap();
    assert_eq!((c.owner.as_str(), c.generation), ("owner-c", new.generation + 1));
}

/// Writes fenced with a lease that is no longer the writer's are refused, all of them.
fn fencing(cp: &dyn Checkpointer) {
    let first = cp.acquire_lease(&claim("F", "owner-a", 0)).unwrap();
    let t = thread("F");
    let c0 = checkpoint("F", None, -1, &[("n", 1)]);
    cp.create_thread_with_checkpoint(Some(&first.fence()), &t, &c0, vals(&[("n", 1, json!(0))]))
        .unwrap();
    // Expired but not taken: still the writer's.
    cp.put_batch(vec![
        Put::Fence(first.fence()),
        Put::Writes {
            thread_id: "F".into(),
            checkpoint_id: c0.checkpoint_id.clone(),
            writes: vec![write("t", 0, "n", json!(1))],
        },
    ])
    .unwrap();
    // Taken over: every put of a fenced batch is refused.
    let second = cp.acquire_lease(&claim("F", "owner-b", 60_000)).unwrap();
    let c1 = checkpoint("F", Some(&c0), 0, &[("n", 2)]);
    let refused = cp.put_batch(vec![
        Put::Fence(first.fence()),
        Put::Checkpoint(Arc::new(c1.clone()), vals(&[("n", 2, json!(5))])),
    ]);
    assert!(
        matches!(&refused, Err(CheckpointError::LeaseLost(t)) if t == "F"),
        "{refused:?}"
    );
    assert_eq!(ids(&cp.history("F").unwrap()), vec![c0.checkpoint_id.as_str()]);
    // A new thread under a lost lease is not created either.
    let refused = cp.create_thread_with_checkpoint(
        Some(&first.fence()),
        &thread("F/0/sub"),
        &checkpoint("F/0/sub", None, -1, &[]),
        vec![],
    );
    assert!(matches!(refused, Err(CheckpointError::LeaseLost(_))));
    assert_eq!(cp.get_thread("F/0/sub").unwrap(), None);
    // Nor is a status set.
    let refused = cp.put_batch(vec![
        Put::Fence(first.fence()),
        Put::Status {
            thread_id: "F".into(),
            status: ThreadStatus::Done,
        },
    ]);
    assert!(matches!(refused, Err(CheckpointError::LeaseLost(_))));
    assert_eq!(cp.get_thread("F").unwrap().unwrap().status, ThreadStatus::Running);
    // The new owner writes.
    cp.put_batch(vec![
        Put::Fence(second.fence()),
        Put::Checkpoint(Arc::new(c1.clone()), vals(&[("n", 2, json!(5))])),
    ])
    .unwrap();
    // A fence for a thread that was never leased holds nothing.
    let stranger = Fence {
        thread_id: "nobody".into(),
        owner: "x".into(),
        generation: 1,
    };
    assert!(matches!(
        cp.put_batch(vec![Put::Fence(stranger)]),
        Err(CheckpointError::LeaseLost(_))
    ));
}

/// A thread taken back to a checkpoint (a run rolled back) in one fenced batch: the newer
/// checkpoints go with their values and writes, the checkpoint's writes become those given, the
/// status is set; under a lease taken over, nothing of it is written. A thread deleted the same
/// way is kept under a lost lease.
fn rollback(cp: &dyn Checkpointer) {
    let [c0, c1, _c2] = three_steps(cp, "R");
    cp.put_writes("R", &c1.checkpoint_id, &[write("t1", 0, "a", json!("run's"))])
        .unwrap();
    let old = cp.acquire_lease(&claim("R", "owner-a", 0)).unwrap();
    let new = cp.acquire_lease(&claim("R", "owner-b", 60_000)).unwrap();
    let back = |fence: Fence| {
        vec![
            Put::Fence(fence),
            Put::Truncate {
                thread_id: "R".into(),
                to: c1.checkpoint_id.clone(),
            },
            Put::Writes {
                thread_id: "R".into(),
                checkpoint_id: c1.checkpoint_id.clone(),
                writes: vec![write("t0", 0, "a", json!("kept"))],
            },
            Put::Status {
                thread_id: "R".into(),
                status: ThreadStatus::Interrupted,
            },
        ]
    };
    let refused = cp.put_batch(back(old.fence()));
    assert!(matches!(refused, Err(CheckpointError::LeaseLost(_))), "{refused:?}");
    assert_eq!(cp.history("R").unwrap().len(), 3, "a lost lease truncates nothing");
    assert_eq!(
        cp.get_writes("R", &c1.checkpoint_id).unwrap(),
        vec![write("t1", 0, "a", json!("run's"))]
    );
    assert_eq!(cp.get_thread("R").unwrap().unwrap().status, ThreadStatus::Running);

    cp.put_batch(back(new.fence())).unwrap();
    assert_eq!(
        ids(&cp.history("R").unwrap()),
        vec![c1.checkpoint_id.as_str(), c0.checkpoint_id.as_str()]
    );
    assert_eq!(
        cp.get_writes("R", &c1.checkpoint_id).unwrap(),
        vec![write("t0", 0, "a", json!("kept"))]
    );
    assert_eq!(cp.get_thread("R").unwrap().unwrap().status, ThreadStatus::Interrupted);
    let head = cp.get_checkpoint("R", None).unwrap().unwrap();
    assert_eq!(
        cp.state("R", &head.versions).unwrap(),
        obj(json!({"a": "a2", "b": ["b1"]}))
    );
    // The values of the steps taken back are gone: a new step may use their versions again.
    let again = checkpoint("R", Some(&c1), 1, &[("a", 3), ("b", 1)]);
    cp.put_checkpoint(&again, &vals(&[("a", 3, json!("other"))])).unwrap();
    assert_eq!(
        cp.state("R", &again.versions).unwrap(),
        obj(json!({"a": "other", "b": ["b1"]}))
    );

    // Deleted under a lost lease: kept.
    let refused = cp.put_batch(vec![Put::Fence(old.fence()), Put::Delete("R".into())]);
    assert!(matches!(refused, Err(CheckpointError::LeaseLost(_))));
    assert!(cp.get_thread("R").unwrap().is_some());
    cp.put_batch(vec![Put::Fence(new.fence()), Put::Delete("R".into())])
        .unwrap();
    assert_eq!(cp.get_thread("R").unwrap(), None);
}

/// A thread and its first checkpoint are stored together: never a thread without one.
fn thread_with_checkpoint(cp: &dyn Checkpointer) {
    let c0 = checkpoint("N", None, -1, &[("n", 1)]);
    cp.create_thread_with_checkpoint(None, &thread("N"), &c0, vals(&[("n", 1, json!(7))]))
        .unwrap();
    assert_eq!(cp.get_thread("N").unwrap().map(|t| t.thread_id), Some("N".to_string()));
    assert_eq!(cp.get_checkpoint("N", None).unwrap(), Some(c0.clone()));
    assert_eq!(cp.state("N", &c0.versions).unwrap(), obj(json!({"n": 7})));
    // A second creation fails whole.
    let again = checkpoint("N", None, -1, &[("n", 1)]);
    assert!(matches!(
        cp.create_thread_with_checkpoint(None, &thread("N"), &again, vec![]),
        Err(CheckpointError::ThreadExists(_))
    ));
    assert_eq!(cp.history("N").unwrap().len(), 1);
}

/// Cached results: found by workflow, node and key until they expire; replaced by a put of
/// the same key; expired ones swept by every put and clear; cleared by workflow and node.
fn node_cache(cp: &dyn Checkpointer) {
    let entry = |workflow: &str, node: &str, key: &str, value: Value, expires: Option<i64>| CacheEntry {
        workflow: workflow.into(),
        node: node.into(),
        key: key.into(),
        value,
        created_at: "2020-01-01T10:00:00.000Z".into(),
        expires_at_ms: expires,
    };
    let listed = |now: i64| -> Vec<(String, String, String)> {
        cp.cache_list(now)
            .unwrap()
            .into_iter()
            .map(|h| (h.workflow, h.node, h.key))
            .collect()
    };
    let triple = |w: &str, n: &str, k: &str| (w.to_string(), n.to_string(), k.to_string());
    assert_eq!(cp.cache_get("w", "n", "k1", 1000).unwrap(), None);
    assert_eq!(listed(1000), vec![]);

    let done = json!({"writes": [["x", {"deep": [1, "two"]}]], "next": [{"to": "b"}]});
    cp.cache_put(&entry("w", "n", "k1", done.clone(), None), 1000).unwrap();
    cp.cache_put(&entry("w", "n", "k2", json!(2), Some(2000)), 1000)
        .unwrap();
    cp.cache_put(&entry("w", "m", "k1", json!(3), Some(5000)), 1000)
        .unwrap();
    cp.cache_put(&entry("v", "n", "k1", json!(4), None), 1000).unwrap();
    assert_eq!(cp.cache_get("w", "n", "k1", 1000).unwrap(), Some(done));
    assert_eq!(cp.cache_get("w", "n", "k2", 1999).unwrap(), Some(json!(2)));
    assert_eq!(
        cp.cache_get("w", "n", "k2", 2000).unwrap(),
        None,
        "expired at its expiry"
    );
    assert_eq!(cp.cache_get("w", "n", "k3", 1000).unwrap(), None);
    assert_eq!(cp.cache_get("v", "m", "k1", 1000).unwrap(), None);
    let heads = cp.cache_list(1000).unwrap();
    assert_eq!(
        heads.iter().map(|h| (h.expires_at_ms, h.bytes > 0)).collect::<Vec<_>>(),
        [(None, true), (Some(5000), true), (None, true), (Some(2000), true)]
    );
    assert_eq!(
        listed(2000),
        [triple("v", "n", "k1"), triple("w", "m", "k1"), triple("w", "n", "k1")]
    );

    // The same key again replaces the value (and its expiry).
    cp.cache_put(&entry("w", "n", "k1", json!("new"), Some(9000)), 1000)
        .unwrap();
    assert_eq!(cp.cache_get("w", "n", "k1", 8999).unwrap(), Some(json!("new")));
    assert_eq!(cp.cache_get("w", "n", "k1", 9000).unwrap(), None);

    // A put sweeps what expired by its time: looked for at an earlier time, it is gone.
    cp.cache_put(&entry("v", "n", "k2", json!(5), None), 6000).unwrap();
    assert_eq!(
        listed(0),
        [triple("v", "n", "k1"), triple("v", "n", "k2"), triple("w", "n", "k1")]
    );

    // Clearing: one node of one workflow, then a whole workflow, then everything.
    cp.cache_put(&entry("w", "m", "k1", json!(6), None), 6000).unwrap();
    assert_eq!(cp.cache_clear(Some("w"), Some("n"), 6000).unwrap(), 1);
    assert_eq!(
        listed(0),
        [triple("v", "n", "k1"), triple("v", "n", "k2"), triple("w", "m", "k1")]
    );
    assert_eq!(cp.cache_clear(Some("nope"), None, 6000).unwrap(), 0);
    assert_eq!(cp.cache_clear(None, Some("n"), 6000).unwrap(), 2);
    assert_eq!(listed(0), [triple("w", "m", "k1")]);
    cp.cache_put(&entry("w", "n", "k9", json!(7), Some(7000)), 6000)
        .unwrap();
    // An expired entry is swept by a clear, and not counted.
    assert_eq!(cp.cache_clear(None, None, 8000).unwrap(), 1);
    assert_eq!(listed(0), vec![]);
}

/// A thread's removal: under its lease (refused, and the thread whole, while another holds it
/// live or one of its runs is active), only when it meets the removal's conditions (expired,
/// idle), and then whole — its subgraphs' threads, its record in the API, its runs — and its
/// lease free again.
fn removal(cp: &dyn Checkpointer) {
    let made = |id: &str| {
        cp.create_thread(&thread(id)).unwrap();
        cp.put_checkpoint(&checkpoint(id, None, -1, &[("n", 1)]), &vals(&[("n", 1, json!(0))]))
            .unwrap();
    };
    made("R");
    made("R/0/child");
    made("S");
    cp.put_thread_meta(&ThreadMeta {
        ttl: Some(ThreadTtl::starting("delete", 1.0, 1_000_000)),
        ..meta("R", json!({"k": "v"}))
    })
    .unwrap();
    cp.put_run(&run_row("r-done", "R", RunStatus::Success)).unwrap();
    let remover = || claim("", &new_id(), 30_000);
    let whole = |id: &str| cp.get_thread(id).unwrap().is_some() && cp.get_checkpoint(id, None).unwrap().is_some();

    // A live lease of another: refused, naming it.
    let held = cp.acquire_lease(&claim("R", "a-run", 60_000)).unwrap();
    match cp.remove_thread("R", &Removal::default(), &remover()).unwrap() {
        Removed::Busy(why) => assert!(why.contains("process 4242"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(whole("R") && whole("R/0/child"));
    cp.release_lease(&held.fence()).unwrap();
    // An active run: refused.
    cp.put_run(&run_row("r-next", "R", RunStatus::Pending)).unwrap();
    match cp.remove_thread("R", &Removal::default(), &remover()).unwrap() {
        Removed::Busy(why) => assert!(why.contains("r-next") && why.contains("pending"), "{why}"),
        other => panic!("{other:?}"),
    }
    cp.set_run_status("r-next", RunStatus::Interrupted, None, "2020-01-01T11:00:00.000Z")
        .unwrap();
    // Conditions it does not meet: kept.
    let expired_later = Removal {
        expired_by: Some(1_000_000 + 59_999),
        idle_before: None,
    };
    assert_eq!(
        cp.remove_thread("R", &expired_later, &remover()).unwrap(),
        Removed::Kept
    );
    // The run changed at 11:00: the thread was not idle since 10:30.
    let idle = Removal {
        expired_by: Some(1_000_000 + 60_000),
        idle_before: Some("2020-01-01T10:30:00.000Z".into()),
    };
    assert_eq!(cp.remove_thread("R", &idle, &remover()).unwrap(), Removed::Kept);
    assert!(whole("R"));
    // Met, and free: gone whole; its lease is free for whoever asks next.
    assert_eq!(
        cp.remove_thread("R", &Removal::default(), &remover()).unwrap(),
        Removed::Removed
    );
    assert!(cp.get_thread("R").unwrap().is_none() && cp.get_thread("R/0/child").unwrap().is_none());
    assert_eq!(cp.get_thread_meta("R").unwrap(), None);
    assert!(cp.list_runs(Some("R"), &[]).unwrap().is_empty());
    assert!(whole("S"), "another thread is left alone");
    cp.acquire_lease(&claim("R", "later", 60_000)).unwrap();
    assert_eq!(
        cp.remove_thread("gone", &Removal::default(), &remover()).unwrap(),
        Removed::Missing
    );
    // A thread the API made that never ran is removed too.
    cp.put_thread_meta(&meta("api-only", json!({}))).unwrap();
    assert_eq!(
        cp.remove_thread("api-only", &Removal::default(), &remover()).unwrap(),
        Removed::Removed
    );
    assert_eq!(cp.get_thread_meta("api-only").unwrap(), None);
}

/// A backend under test: the checkpointer, how many values it stores, and its temp dir.
fn cron(id: &str, next: Option<i64>) -> CronRow {
    CronRow {
        cron_id: id.into(),
        assistant_id: "a".into(),
        thread_id: None,
        owner: None,
        schedule: "* * * * *".into(),
        timezone: None,
        payload: json!({"input": {"n": 1}}),
        metadata: json!({"who": "me"}),
        on_run_completed: Some("delete".into()),
        enabled: true,
        end_ms: None,
        next_run_at: next,
        declared_by: None,
        created_at: "c".into(),
        updated_at: "u".into(),
    }
}

fn delivery(id: &str, run: &str, body: &str) -> Delivery {
    Delivery {
        delivery_id: id.into(),
        run_id: run.into(),
        url: "http://127.0.0.1:9/hook".into(),
        body: body.into(),
        state: DeliveryState::Pending,
        attempts: 0,
        last_status: None,
        last_error: None,
        next_attempt_at: 0,
        created_at: "c".into(),
        updated_at: "c".into(),
    }
}

/// Crons: put, read, replaced, due, each tick claimed once, deleted; webhook deliveries: held by
/// one process at a time, retried, recorded, never taken while their run goes on.
fn crons_and_deliveries(store: &dyn Checkpointer) {
    // Crons: put, read, replace, due, claimed once, deleted.
    store.put_cron(&cron("c1", Some(1_000))).unwrap();
    let mut ended = cron("c2", Some(500));
    ended.end_ms = Some(400);
    store.put_cron(&ended).unwrap();
    let mut off = cron("c3", Some(500));
    off.enabled = false;
    store.put_cron(&off).unwrap();
    assert!(!store.insert_cron(&cron("c1", Some(5))).unwrap(), "c1 exists");
    assert_eq!(store.get_cron("c1").unwrap().unwrap(), cron("c1", Some(1_000)));
    let ids = |rows: Vec<CronRow>| rows.into_iter().map(|c| c.cron_id).collect::<Vec<_>>();
    assert_eq!(ids(store.list_crons().unwrap()), ["c1", "c2", "c3"]);
    assert!(ids(store.due_crons(999).unwrap()).is_empty(), "nothing is due yet");
    assert_eq!(ids(store.due_crons(1_000).unwrap()), ["c1"], "c2 has ended, c3 is off");
    assert!(store.claim_tick("c1", 1_000, Some(2_000), "t").unwrap());
    assert!(
        !store.claim_tick("c1", 1_000, Some(2_000), "t").unwrap(),
        "one claim a tick"
    );
    let c1 = store.get_cron("c1").unwrap().unwrap();
    assert_eq!((c1.next_run_at, c1.updated_at.as_str()), (Some(2_000), "t"));
    assert!(store.claim_tick("c1", 2_000, None, "t2").unwrap());
    assert!(store.due_crons(i64::MAX).unwrap().is_empty(), "no tick is left");
    assert!(store.insert_cron(&cron("c4", None)).unwrap());
    assert!(store.delete_cron("c4").unwrap());
    assert!(!store.delete_cron("c4").unwrap());

    // Deliveries: held by one process, retried, recorded; never while the run goes on.
    let run = |id: &str, status: RunStatus| RunRow {
        run_id: id.into(),
        thread_id: "t".into(),
        assistant_id: "a".into(),
        status,
        created_at: "c".into(),
        updated_at: "u".into(),
        kwargs: json!({}),
        multitask_strategy: "enqueue".into(),
        metadata: json!({}),
        error: None,
        event_ids: 0,
    };
    store.put_run(&run("r1", RunStatus::Running)).unwrap();
    store.enqueue_delivery(&delivery("d1", "r1", "first")).unwrap();
    store.enqueue_delivery(&delivery("d2", "gone", "orphan")).unwrap();
    let taken = store.claim_deliveries(10, "p1", 100, 10).unwrap();
    assert_eq!(
        taken.iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(),
        ["d2"],
        "d1's run is still running; d2's is gone"
    );
    assert!(
        store.claim_deliveries(10, "p2", 100, 10).unwrap().is_empty(),
        "p1 holds d2"
    );
    store.set_run_status("r1", RunStatus::Success, None, "x").unwrap();
    // The run ended again (after a restart): an unattempted delivery takes the new body.
    store.enqueue_delivery(&delivery("d1", "r1", "second")).unwrap();
    let d1 = store.claim_deliveries(10, "p2", 100, 10).unwrap();
    assert_eq!(d1.len(), 1);
    assert_eq!(d1[0].body, "second");
    let retry = Attempt {
        state: DeliveryState::Pending,
        status: Some(500),
        error: Some("500 Internal Server Error".into()),
        next_attempt_at: 50,
        at: "a1".into(),
    };
    assert!(!store.record_attempt("d1", "p1", &retry).unwrap(), "p2 holds d1");
    assert!(store.record_attempt("d1", "p2", &retry).unwrap());
    assert!(
        store.claim_deliveries(49, "p1", 100, 10).unwrap().is_empty(),
        "its retry is not due"
    );
    // An attempted delivery keeps its body when the run ends again.
    store.enqueue_delivery(&delivery("d1", "r1", "third")).unwrap();
    let again = store.claim_deliveries(200, "p1", 300, 10).unwrap();
    assert_eq!(
        again
            .iter()
            .map(|d| (d.delivery_id.as_str(), d.body.as_str()))
            .collect::<Vec<_>>(),
        [("d1", "second"), ("d2", "orphan")],
        "d2's hold expired at 100"
    );
    let done = Attempt {
        state: DeliveryState::Delivered,
        status: Some(200),
        error: None,
        next_attempt_at: 200,
        at: "a2".into(),
    };
    assert!(store.record_attempt("d1", "p1", &done).unwrap());
    assert!(store.claim_deliveries(i64::MAX / 2, "p3", i64::MAX, 10).unwrap().len() == 1);
    let recorded = store.list_deliveries(Some("r1")).unwrap();
    assert_eq!(recorded.len(), 1);
    let d1 = &recorded[0];
    assert_eq!(
        (
            d1.state,
            d1.attempts,
            d1.last_status,
            d1.last_error.as_deref(),
            d1.updated_at.as_str()
        ),
        (DeliveryState::Delivered, 2, Some(200), None, "a2")
    );
    assert_eq!(store.list_deliveries(None).unwrap().len(), 2);
}

struct Backend {
    cp: Arc<dyn Checkpointer>,
    value_rows: Box<dyn Fn() -> u64>,
    _dir: Option<tempfile::TempDir>,
}

fn memory() -> Backend {
    let cp = Arc::new(MemoryCheckpointer::new());
    let counted = Arc::clone(&cp);
    Backend {
        cp,
        value_rows: Box::new(move || counted.value_rows().unwrap()),
        _dir: None,
    }
}

fn sqlite(durability: Durability) -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let cp = Arc::new(SqliteCheckpointer::open(&dir.path().join("runs.db"), durability).unwrap());
    let counted = Arc::clone(&cp);
    Backend {
        cp,
        value_rows: Box::new(move || counted.stats().unwrap().value_rows),
        _dir: Some(dir),
    }
}

fn postgres(durability: Durability) -> Backend {
    let cp = Arc::new(PostgresCheckpointer::open(&fresh_url(), durability).unwrap());
    let counted = Arc::clone(&cp);
    Backend {
        cp,
        value_rows: Box::new(move || counted.value_rows().unwrap()),
        _dir: None,
    }
}

macro_rules! conformance {
    ($name:ident, $backend:expr) => {
        conformance!(
            $name,
            $backend,
            [
                threads,
                checkpoints,
                state,
                writes,
                delete,
                fork,
                branch,
                batch,
                plan_hashes,
                leases,
                fencing,
                rollback,
                thread_with_checkpoint,
                node_cache,
                removal,
                crons_and_deliveries
            ]
        );
    };
    ($name:ident, $backend:expr, [$($case:ident),*]) => {
        mod $name {
            $(
                #[test]
                fn $case() {
                    let backend = $backend;
                    super::$case(&*backend.cp);
                }
            )*

            #[test]
            fn values_stored_once() {
                let backend = $backend;
                super::values_stored_once(&*backend.cp, &*backend.value_rows);
            }
        }
    };
}

conformance!(memory, super::memory());
conformance!(
    sqlite_crash_safe,
    super::sqlite(runner::checkpoint::Durability::CrashSafe)
);
conformance!(
    sqlite_power_safe,
    super::sqlite(runner::checkpoint::Durability::PowerSafe)
);
conformance!(
    postgres_crash_safe,
    super::postgres(runner::checkpoint::Durability::CrashSafe)
);
conformance!(
    postgres_power_safe,
    super::postgres(runner::checkpoint::Durability::PowerSafe)
);

// ---------------------------------------------------------------------------------------------
// Runs and thread metadata, through the public `RunStore` trait, on every backend: what one
// opening stores, the next reads, changes and deletes, and the one after sees.

pub(crate) fn run_row(id: &str, thread: &str, status: RunStatus) -> RunRow {
    RunRow {
        run_id: id.into(),
        thread_id: thread.into(),
        assistant_id: "agent".into(),
        status,
        created_at: "2020-01-01T10:00:00.000Z".into(),
        updated_at: "2020-01-01T10:00:00.000Z".into(),
        kwargs: json!({"input": {"x": 1, "text": "naïve ✓"}, "stream_mode": ["values"]}),
        multitask_strategy: "reject".into(),
        metadata: json!({"who": "me"}),
        error: None,
        event_ids: 0,
    }
}

fn meta(thread_id: &str, metadata: Value) -> ThreadMeta {
    ThreadMeta {
        thread_id: thread_id.into(),
        created_at: "2020-01-01T09:00:00.000Z".into(),
        updated_at: "2020-01-01T09:30:00.000Z".into(),
        metadata,
        ttl: None,
    }
}

fn run_ids(runs: Vec<RunRow>) -> Vec<String> {
    runs.into_iter().map(|r| r.run_id).collect()
}

fn metas(store: &dyn RunStore) -> Vec<(String, Value)> {
    let mut all: Vec<_> = store
        .list_thread_meta()
        .unwrap()
        .into_iter()
        .map(|m| (m.thread_id, m.metadata))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

fn runs_fill(store: &dyn RunStore) {
    store.put_run(&run_row("r1", "t1", RunStatus::Running)).unwrap();
    store.put_run(&run_row("r2", "t1", RunStatus::Pending)).unwrap();
    store.put_run(&run_row("r3", "t2", RunStatus::Success)).unwrap();
    store.put_run(&run_row("r4", "t3", RunStatus::Pending)).unwrap();
    let mut replaced = run_row("r3", "t2", RunStatus::Success);
    replaced.metadata = json!({"who": "you"});
    store.put_run(&replaced).unwrap();
    store
        .set_run_status(
            "r2",
            RunStatus::Error,
            Some(&json!({"error": "E", "message": "boom"})),
            "later",
        )
        .unwrap();
    store.set_run_status("gone", RunStatus::Success, None, "x").unwrap();
    // A start told after the end (two writers, unordered) does not revive the run; a pending
    // one starts.
    store.set_run_status("r3", RunStatus::Running, None, "late").unwrap();
    store.set_run_status("r4", RunStatus::Running, None, "started").unwrap();
    store.reserve_event_ids("r1", 1000).unwrap();
    store.reserve_event_ids("r1", 10).unwrap();
    store.reserve_event_ids("gone", 10).unwrap();

    assert!(store.create_thread_meta(&meta("t1", json!({"graph_id": "g"}))).unwrap());
    assert!(
        !store
            .create_thread_meta(&meta("t1", json!({"graph_id": "other"})))
            .unwrap(),
        "created once"
    );
    store.put_thread_meta(&meta("t2", json!({"a": 1}))).unwrap();
    store.put_thread_meta(&meta("t2", json!({"a": 2}))).unwrap();
    assert!(store.create_thread_meta(&meta("t3", json!({}))).unwrap());
}

fn runs_verify(store: &dyn RunStore) {
    let r1 = store.get_run("r1").unwrap().unwrap();
    let mut expected = run_row("r1", "t1", RunStatus::Running);
    expected.event_ids = 1000;
    assert_eq!(r1, expected, "every field kept; event ids never lowered");
    let r2 = store.get_run("r2").unwrap().unwrap();
    assert_eq!(
        (r2.status, r2.error, r2.updated_at.as_str(), r2.created_at.as_str()),
        (
            RunStatus::Error,
            Some(json!({"error": "E", "message": "boom"})),
            "later",
            "2020-01-01T10:00:00.000Z"
        )
    );
    let r3 = store.get_run("r3").unwrap().unwrap();
    assert_eq!((r3.status, &r3.metadata), (RunStatus::Success, &json!({"who": "you"})));
    assert_eq!(store.get_run("r4").unwrap().unwrap().status, RunStatus::Running);
    assert_eq!(
        store.get_run("gone").unwrap(),
        None,
        "a status set on no run makes none"
    );

    assert_eq!(run_ids(store.list_runs(Some("t1"), &[]).unwrap()), ["r1", "r2"]);
    assert_eq!(run_ids(store.list_runs(None, &[]).unwrap()), ["r1", "r2", "r3", "r4"]);
    assert_eq!(
        run_ids(
            store
                .list_runs(None, &[RunStatus::Running, RunStatus::Pending])
                .unwrap()
        ),
        ["r1", "r4"]
    );
    assert_eq!(
        run_ids(store.list_runs(Some("t2"), &[RunStatus::Running]).unwrap()),
        Vec::<String>::new()
    );
    assert_eq!(
        run_ids(store.list_runs(Some("nope"), &[]).unwrap()),
        Vec::<String>::new()
    );

    assert_eq!(
        store.get_thread_meta("t1").unwrap(),
        Some(meta("t1", json!({"graph_id": "g"})))
    );
    assert_eq!(store.get_thread_meta("nope").unwrap(), None);
    assert_eq!(
        metas(store),
        [
            ("t1".to_string(), json!({"graph_id": "g"})),
            ("t2".to_string(), json!({"a": 2})),
            ("t3".to_string(), json!({}))
        ]
    );

    assert!(store.delete_run("r3").unwrap());
    assert!(!store.delete_run("r3").unwrap());
    store.delete_thread_meta("t1").unwrap();
    store.delete_thread_meta("nope").unwrap();
}

/// After `runs_verify`'s deletes: the thread's runs went with its metadata, nothing else did.
fn runs_after_deletes(store: &dyn RunStore) {
    assert_eq!(run_ids(store.list_runs(None, &[]).unwrap()), ["r4"]);
    assert_eq!(store.get_run("r1").unwrap(), None);
    assert_eq!(store.get_thread_meta("t1").unwrap(), None);
    assert_eq!(
        metas(store),
        [("t2".to_string(), json!({"a": 2})), ("t3".to_string(), json!({}))]
    );
    assert!(store.create_thread_meta(&meta("t1", json!({"again": true}))).unwrap());
}

#[test]
fn memory_run_store() {
    let store = MemoryCheckpointer::new();
    runs_fill(&store);
    runs_verify(&store);
    runs_after_deletes(&store);
}

#[test]
fn sqlite_run_store_across_openings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let open = || SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap();
    runs_fill(&open());
    runs_verify(&open());
    runs_after_deletes(&open());
}

#[test]
fn postgres_run_store_across_openings() {
    let url = fresh_url();
    let open = || PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
    runs_fill(&open());
    runs_verify(&open());
    runs_after_deletes(&open());
}

// ---------------------------------------------------------------------------------------------
// SQLite only.

/// Thread creation is one transaction: a batch whose checkpoint fails leaves no thread behind
/// (a thread without a checkpoint could not be resumed by older builds).
#[test]
fn sqlite_thread_and_first_checkpoint_are_one_transaction() {
    let backend = sqlite(Durability::CrashSafe);
    let cp = &*backend.cp;
    let c0 = checkpoint("A", None, -1, &[("n", 1)]);
    let broken = cp.put_batch(vec![
        Put::Thread(Box::new(thread("A"))),
        Put::Checkpoint(Arc::new(c0.clone()), vals(&[("n", 1, json!(0))])),
        Put::Checkpoint(Arc::new(c0.clone()), vals(&[("n", 1, json!(0))])),
    ]);
    assert!(broken.is_err());
    assert_eq!(cp.get_thread("A").unwrap(), None);
}

/// Two processes' worth of claimants racing on one file: exactly one holds the lease.
#[test]
fn sqlite_one_lease_among_racing_claimants() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let stores: Vec<_> = (0..4)
        .map(|_| Arc::new(SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap()))
        .collect();
    let barrier = Arc::new(Barrier::new(stores.len() * 2));
    let handles: Vec<_> = stores
        .iter()
        .flat_map(|s| [s.clone(), s.clone()])
        .enumerate()
        .map(|(i, s)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                s.acquire_lease(&claim("race", &format!("owner-{i}"), 60_000)).is_ok()
            })
        })
        .collect();
    let granted = handles.into_iter().map(|h| h.join().unwrap()).filter(|g| *g).count();
    assert_eq!(granted, 1);
}

/// Claimants racing for the same ticks through several openings of one database, as the
/// schedulers of several processes do: each tick is claimed exactly once.
fn one_claim_a_tick(stores: Vec<Arc<dyn Checkpointer>>) {
    stores[0].put_cron(&cron("race", Some(1_000))).unwrap();
    for tick in 1..=10i64 {
        let at = tick * 1_000;
        let barrier = Arc::new(Barrier::new(stores.len() * 2));
        let handles: Vec<_> = stores
            .iter()
            .flat_map(|s| [s.clone(), s.clone()])
            .map(|s| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    // What a scheduler does: read the cron as due, then claim the tick it read.
                    let due = s.due_crons(at).unwrap();
                    let seen = due.first().and_then(|c| c.next_run_at);
                    seen.is_some_and(|seen| s.claim_tick("race", seen, Some(seen + 1_000), "t").unwrap())
                })
            })
            .collect();
        let claimed = handles.into_iter().map(|h| h.join().unwrap()).filter(|c| *c).count();
        assert_eq!(claimed, 1, "tick {tick}");
    }
}

#[test]
fn sqlite_one_claim_a_tick_among_racing_schedulers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    one_claim_a_tick(
        (0..4)
            .map(|_| Arc::new(SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap()) as Arc<dyn Checkpointer>)
            .collect(),
    );
}

#[test]
fn postgres_one_claim_a_tick_among_racing_schedulers() {
    let url = fresh_url();
    one_claim_a_tick(
        (0..4)
            .map(|_| {
                Arc::new(PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap()) as Arc<dyn Checkpointer>
            })
            .collect(),
    );
}

#[test]
fn sqlite_data_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dirs/runs.db");
    let (cs, thread_before, writes_before) = {
        let cp = SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap();
        let cs = three_steps(&cp, "t");
        cp.put_writes("t", &cs[2].checkpoint_id, &[write("x", 0, "a", json!({"k": [1, 2]}))])
            .unwrap();
        cp.set_status("t", ThreadStatus::Interrupted).unwrap();
        cp.fork("t", &cs[1].checkpoint_id, "f").unwrap();
        let thread = cp.get_thread("t").unwrap().unwrap();
        let writes = cp.get_writes("t", &cs[2].checkpoint_id).unwrap();
        (cs, thread, writes)
        // Dropped here: the writer flushes and the file closes.
    };
    let cp = SqliteCheckpointer::open(&path, Durability::PowerSafe).unwrap();
    assert_eq!(cp.get_thread("t").unwrap(), Some(thread_before));
    assert_eq!(cp.history("t").unwrap(), cs.iter().rev().cloned().collect::<Vec<_>>());
    assert_eq!(
        cp.state("t", &cs[2].versions).unwrap(),
        obj(json!({"a": "a3", "b": ["b1"]}))
    );
    assert_eq!(cp.get_writes("t", &cs[2].checkpoint_id).unwrap(), writes_before);
    assert_eq!(thread_ids(&cp.list_threads().unwrap()), ["f", "t"]);
    let stats = cp.stats().unwrap();
    assert_eq!(
        (stats.threads, stats.checkpoints, stats.value_rows, stats.write_rows),
        (2, 4, 6, 1)
    );
}

/// Closing the store, its last connection, folds its WAL into the main file and removes it:
/// the file alone (copied without its `-wal`) holds every commit, and a read-only open and the
/// next writer read it. With another connection open the WAL stays for it, every commit in it.
#[test]
fn sqlite_closing_folds_the_wal_into_the_file_unless_another_connection_is_open() {
    for durability in [Durability::CrashSafe, Durability::PowerSafe] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let wal = dir.path().join("runs.db-wal");
        let cs = {
            let cp = SqliteCheckpointer::open(&path, durability).unwrap();
            let cs = three_steps(&cp, "t");
            cp.set_status("t", ThreadStatus::Done).unwrap();
            cs
        };
        assert!(!wal.exists(), "{durability:?}: the WAL was left at close");
        let files = |d: &std::path::Path| {
            let mut names: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(files(dir.path()), ["runs.db"]);
        let elsewhere = tempfile::tempdir().unwrap();
        let copy = elsewhere.path().join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        let read_only = SqliteCheckpointer::open_read_only(&copy).unwrap();
        assert_eq!(read_only.get_thread("t").unwrap().unwrap().status, ThreadStatus::Done);
        assert_eq!(
            read_only.history("t").unwrap(),
            cs.iter().rev().cloned().collect::<Vec<_>>()
        );
        drop(read_only);

        // Another program's read-only connection is open: closing leaves the WAL for it.
        let conn = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let count = |c: &rusqlite::Connection| -> i64 {
            c.query_row("SELECT count(*) FROM checkpoints", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(count(&conn), 3, "{durability:?}");
        {
            let cp = SqliteCheckpointer::open(&path, durability).unwrap();
            assert_eq!(cp.history("t").unwrap(), cs.iter().rev().cloned().collect::<Vec<_>>());
            three_steps(&cp, "u");
        }
        assert!(
            wal.exists(),
            "{durability:?}: the WAL was folded under an open connection"
        );
        assert_eq!(count(&conn), 6, "{durability:?}");
        drop(conn);
        let cp = SqliteCheckpointer::open(&path, durability).unwrap();
        assert_eq!(
            cp.state("t", &cs[2].versions).unwrap(),
            obj(json!({"a": "a3", "b": ["b1"]}))
        );
        drop(cp);
        assert_eq!(files(dir.path()), ["runs.db"], "{durability:?}");
    }
}

#[test]
fn sqlite_refuses_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    drop(SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    drop(conn);
    let err = SqliteCheckpointer::open(&path, Durability::CrashSafe).err().unwrap();
    assert!(
        matches!(err, CheckpointError::Backend(ref m) if m.contains("newer") && m.contains("upgrade")),
        "{err}"
    );
}

#[test]
fn sqlite_durability_sets_synchronous() {
    for (durability, expected) in [(Durability::CrashSafe, "normal"), (Durability::PowerSafe, "full")] {
        let backend_dir = tempfile::tempdir().unwrap();
        let cp = SqliteCheckpointer::open(&backend_dir.path().join("runs.db"), durability).unwrap();
        let stats = cp.stats().unwrap();
        assert_eq!(stats.synchronous, expected, "{durability:?}");
        assert_eq!(stats.journal_mode, "wal");
    }
}

/// 16 tasks finishing at once cost fewer commits than writes: the writer groups them.
#[test]
fn sqlite_a_batch_is_one_commit() {
    let backend = sqlite(Durability::PowerSafe);
    let store = SqliteCheckpointer::open(
        &backend._dir.as_ref().unwrap().path().join("batch.db"),
        Durability::PowerSafe,
    )
    .unwrap();
    store.create_thread(&thread("b")).unwrap();
    let before = store.stats().unwrap().commits;
    let mut parent = None;
    let mut puts = Vec::new();
    for step in 0..50 {
        let c = checkpoint("b", parent.as_ref(), step, &[("n", step as u64 + 1)]);
        puts.push(Put::Checkpoint(
            Arc::new(c.clone()),
            vals(&[("n", step as u64 + 1, json!(step))]),
        ));
        parent = Some(c);
    }
    store.put_batch(puts).unwrap();
    assert_eq!(store.stats().unwrap().commits - before, 1);
    assert_eq!(store.history("b").unwrap().len(), 50);
}

/// A step's task writes may be committed without an fsync: the step's synced checkpoint commit
/// covers them. Power-safe says so (they are not durable yet); crash-safe never syncs a commit.
#[test]
fn sqlite_unsynced_writes_wait_for_the_next_synced_commit() {
    for durability in [Durability::CrashSafe, Durability::PowerSafe] {
        let dir = tempfile::tempdir().unwrap();
        let cp = SqliteCheckpointer::open(&dir.path().join("runs.db"), durability).unwrap();
        let [_, _, c2] = three_steps(&cp, "t");
        let before = cp.stats().unwrap().synced_commits;
        for i in 0..10 {
            let id = format!("task-{i}");
            let durable = cp
                .put_batch_unsynced(vec![Put::Writes {
                    thread_id: "t".into(),
                    checkpoint_id: c2.checkpoint_id.clone(),
                    writes: vec![write(&id, 0, "a", json!(i))],
                }])
                .unwrap();
            assert_eq!(durable, durability == Durability::CrashSafe, "{durability:?}");
        }
        assert_eq!(
            cp.stats().unwrap().synced_commits,
            before,
            "{durability:?}: no fsync for the writes"
        );
        assert_eq!(
            cp.get_writes("t", &c2.checkpoint_id).unwrap().len(),
            10,
            "committed all the same"
        );
        let c3 = checkpoint("t", Some(&c2), 2, &[("a", 4), ("b", 1)]);
        cp.put_batch(vec![Put::Checkpoint(Arc::new(c3), vals(&[("a", 4, json!("a4"))]))])
            .unwrap();
        let synced = cp.stats().unwrap().synced_commits - before;
        assert_eq!(synced, u64::from(durability == Durability::PowerSafe), "{durability:?}");
    }
}

#[test]
fn sqlite_concurrent_writes_are_group_committed() {
    const TASKS: usize = 16;
    const PER_TASK: usize = 25;
    for durability in [Durability::CrashSafe, Durability::PowerSafe] {
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(SqliteCheckpointer::open(&dir.path().join("runs.db"), durability).unwrap());
        let [_, _, c2] = three_steps(&*cp, "t");
        let before = cp.stats().unwrap();
        let start = Arc::new(Barrier::new(TASKS));
        let handles: Vec<_> = (0..TASKS)
            .map(|task| {
                let (cp, start, c) = (Arc::clone(&cp), Arc::clone(&start), c2.checkpoint_id.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..PER_TASK {
                        let id = format!("task-{task:02}-{i:02}");
                        cp.put_writes(
                            "t",
                            &c,
                            &[write(&id, 0, "a", json!(i)), write(&id, 1, "__goto__", json!(task))],
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        let after = cp.stats().unwrap();
        let (ops, commits) = (after.write_ops - before.write_ops, after.commits - before.commits);
        eprintln!("{durability:?}: {ops} put_writes calls from {TASKS} threads took {commits} commits");
        assert_eq!(ops, (TASKS * PER_TASK) as u64);
        assert!(commits < ops, "{commits} commits for {ops} writes: no group commit");
        let writes = cp.get_writes("t", &c2.checkpoint_id).unwrap();
        assert_eq!(writes.len(), TASKS * PER_TASK * 2, "every write landed");
        assert_eq!(writes[0], write("task-00-00", 0, "a", json!(0)));
        assert_eq!(after.write_rows, (TASKS * PER_TASK * 2) as u64);
    }
}

/// Readers run beside the writer and never see SQLITE_BUSY or a half-written checkpoint.
#[test]
fn sqlite_readers_never_block_on_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let cp = Arc::new(SqliteCheckpointer::open(&dir.path().join("runs.db"), Durability::CrashSafe).unwrap());
    let [_, _, mut parent] = three_steps(&*cp, "t");
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (cp, stop) = (Arc::clone(&cp), Arc::clone(&stop));
            std::thread::spawn(move || -> Result<usize, CheckpointError> {
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) || reads == 0 {
                    let history = cp.history("t")?;
                    let latest = &history[0];
                    let state = cp.state("t", &latest.versions)?;
                    assert_eq!(state.len(), latest.versions.len());
                    cp.get_writes("t", &latest.checkpoint_id)?;
                    cp.list_threads()?;
                    reads += 1;
                }
                Ok(reads)
            })
        })
        .collect();
    for step in 2..302u64 {
        let c = checkpoint("t", Some(&parent), step as i64, &[("a", step + 2), ("b", 1)]);
        cp.put_checkpoint(&c, &vals(&[("a", step + 2, json!(vec![step; 50]))]))
            .unwrap();
        cp.put_writes("t", &c.checkpoint_id, &[write("w", 0, "a", json!(step))])
            .unwrap();
        parent = c;
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let reads = reader.join().unwrap().unwrap();
        assert!(reads > 0);
    }
    assert_eq!(cp.history("t").unwrap().len(), 303);
}

/// 1,000 checkpoints; `items` grows by one item per step and `big` never changes. Storing each
/// key only when its version changes keeps `big` once: 1,001 value rows, not 2,000.
#[test]
fn sqlite_append_only_state_grows_with_what_changed() {
    const STEPS: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let cp = SqliteCheckpointer::open(&dir.path().join("runs.db"), Durability::CrashSafe).unwrap();
    cp.create_thread(&thread("t")).unwrap();
    let big = json!({"document": "lorem ipsum ".repeat(8_000)});
    let big_len = big.to_string().len() as u64;
    let mut items = Vec::new();
    let mut naive_bytes = 0u64; // what storing the whole state at every checkpoint would write
    let mut parent: Option<Checkpoint> = None;
    for version in 1..=STEPS {
        items.push(json!(format!("item-{version:04}")));
        let items_value = Value::Array(items.clone());
        naive_bytes += big_len + items_value.to_string().len() as u64;
        let mut values = vals(&[("items", version, items_value)]);
        if version == 1 {
            values.push(("big".into(), 1, big.clone()));
        }
        let c = checkpoint(
            "t",
            parent.as_ref(),
            version as i64 - 2,
            &[("big", 1), ("items", version)],
        );
        cp.put_checkpoint(&c, &values).unwrap();
        parent = Some(c);
    }
    let stats = cp.stats().unwrap();
    let last = parent.unwrap();
    let state = cp.state("t", &last.versions).unwrap();
    assert_eq!(state["items"].as_array().unwrap().len(), STEPS as usize);
    assert_eq!(state["big"], big);
    eprintln!(
        "{STEPS} checkpoints: {} value rows, db {} KiB ({} KiB on disk with WAL); \
         whole-state-per-step would write {} KiB",
        stats.value_rows,
        stats.db_bytes / 1024,
        stats.file_bytes / 1024,
        naive_bytes / 1024
    );
    assert_eq!(stats.value_rows, STEPS + 1);
    assert_eq!(stats.checkpoints, STEPS);
    assert!(
        stats.db_bytes * 5 < naive_bytes,
        "db {} bytes vs {naive_bytes} for whole-state-per-step",
        stats.db_bytes
    );
}

/// A large input is stored once: the thread row, which every status change rewrites whole,
/// does not hold it (before, each status change copied it again).
#[test]
fn sqlite_a_large_input_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let cp = SqliteCheckpointer::open(&dir.path().join("runs.db"), Durability::CrashSafe).unwrap();
    let mut t = thread("t");
    t.input = json!({"text": "lorem ipsum ".repeat(400_000)});
    let input_len = t.input.to_string().len() as u64;
    cp.create_thread(&t).unwrap();
    for status in [
        ThreadStatus::Running,
        ThreadStatus::Interrupted,
        ThreadStatus::Running,
        ThreadStatus::Done,
    ] {
        cp.set_status("t", status).unwrap();
    }
    let c0 = checkpoint("t", None, -1, &[("count", 1)]);
    cp.put_checkpoint(&c0, &vals(&[("count", 1, json!(4_800_000))]))
        .unwrap();
    let stats = cp.stats().unwrap();
    assert!(
        stats.db_bytes < input_len + input_len / 4,
        "{} bytes for a {input_len}-byte input",
        stats.db_bytes
    );
    let back = cp.get_thread("t").unwrap().unwrap();
    assert_eq!((back.input, back.status), (t.input, ThreadStatus::Done));
    assert_eq!(cp.list_threads().unwrap().len(), 1);
    // A listing reads no input: one that is not even JSON does not stop it.
    rusqlite::Connection::open(dir.path().join("runs.db"))
        .unwrap()
        .execute("UPDATE thread_inputs SET input = '{not json'", [])
        .unwrap();
    assert!(matches!(cp.list_threads(), Err(CheckpointError::Corrupt(_))));
    let heads = cp.list_thread_heads().unwrap();
    assert_eq!(
        (heads[0].thread_id.as_str(), heads[0].status),
        ("t", ThreadStatus::Done)
    );
    cp.delete_thread("t").unwrap();
    assert_eq!(cp.get_thread("t").unwrap(), None);
}

/// `value` reads one key: another key's stored value, even a corrupt one, is never touched,
/// while the whole state cannot be read past it.
#[test]
fn sqlite_one_key_is_read_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let cp = SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap();
    let [_, _, c2] = three_steps(&cp, "t");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("UPDATE state_values SET value = '{not json' WHERE key = 'b'", [])
        .unwrap();
    assert_eq!(cp.value("t", "a", c2.versions["a"]).unwrap(), json!("a3"));
    assert_eq!(cp.value("t", "a", 1).unwrap(), json!("a1"));
    assert!(matches!(cp.state("t", &c2.versions), Err(CheckpointError::Corrupt(_))));
    assert!(matches!(cp.value("t", "b", 1), Err(CheckpointError::Corrupt(_))));
    assert!(cp.value("t", "a", 9).is_err());
    let memory = MemoryCheckpointer::new();
    let [_, _, m2] = three_steps(&memory, "t");
    assert_eq!(memory.value("t", "a", m2.versions["a"]).unwrap(), json!("a3"));
}

/// A file of schema version 1 (input in the thread row) is migrated when opened to write, and
/// read as it is when opened read-only.
#[test]
fn sqlite_version_1_files_are_read_and_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = wal;
             CREATE TABLE threads (thread_id TEXT PRIMARY KEY NOT NULL, workflow TEXT NOT NULL,
                 plan_hash TEXT NOT NULL, input TEXT NOT NULL, context TEXT NOT NULL, config TEXT NOT NULL,
                 status TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
                 touched INTEGER NOT NULL, forked_from_thread TEXT, forked_from_checkpoint TEXT) STRICT;
             CREATE INDEX threads_by_touched ON threads (touched);
             CREATE TABLE checkpoints (thread_id TEXT NOT NULL REFERENCES threads (thread_id),
                 checkpoint_id TEXT NOT NULL, parent_id TEXT, step INTEGER NOT NULL, versions TEXT NOT NULL,
                 ran TEXT NOT NULL, changed TEXT NOT NULL, next TEXT NOT NULL, meta TEXT NOT NULL,
                 plan_hash TEXT, created_at TEXT NOT NULL, PRIMARY KEY (thread_id, checkpoint_id)) STRICT, WITHOUT ROWID;
             CREATE INDEX checkpoints_by_step ON checkpoints (thread_id, step, checkpoint_id);
             CREATE TABLE state_values (thread_id TEXT NOT NULL REFERENCES threads (thread_id), key TEXT NOT NULL,
                 version INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (thread_id, key, version)) STRICT;
             CREATE TABLE writes (thread_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, task_id TEXT NOT NULL,
                 idx INTEGER NOT NULL, channel TEXT NOT NULL, value TEXT NOT NULL,
                 PRIMARY KEY (thread_id, checkpoint_id, task_id, idx)) STRICT;
             INSERT INTO threads VALUES ('old', 'w.yaml', 'h', '{\"q\":1}', '{}', '{\"k\":2}', 'done',
                 '2020-01-01T00:00:00.000Z', '2020-01-01T00:00:00.000Z', 1, NULL, NULL);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let old = SqliteCheckpointer::open_read_only(&path).unwrap();
    let t = old.get_thread("old").unwrap().unwrap();
    assert_eq!((t.input, t.config), (json!({"q": 1}), json!({"k": 2})));
    assert_eq!(thread_ids(&old.list_threads().unwrap()), ["old"]);
    // Written before leases existed: read-only, no run holds any thread.
    assert_eq!(old.lease("old").unwrap(), None);
    // Nor any cached result.
    assert_eq!(old.cache_list(0).unwrap(), vec![]);
    assert_eq!(old.cache_get("w", "n", "k", 0).unwrap(), None);
    assert!(old.create_thread(&thread("new")).is_err());
    drop(old);

    let cp = SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap();
    let t = cp.get_thread("old").unwrap().unwrap();
    assert_eq!((t.input, t.status), (json!({"q": 1}), ThreadStatus::Done));
    cp.create_thread(&thread("new")).unwrap();
    assert_eq!(thread_ids(&cp.list_threads().unwrap()), ["new", "old"]);
    drop(cp);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    // A new file is created with the current schema directly: the same tables, columns and
    // indexes as a migrated one.
    let fresh = dir.path().join("fresh.db");
    drop(SqliteCheckpointer::open(&fresh, Durability::CrashSafe).unwrap());
    assert_eq!(layout(&rusqlite::Connection::open(&fresh).unwrap()), layout(&conn));
}

/// Every table and index of a database, by name: a table's columns (name, type, not null,
/// primary key position), an index's table and columns.
fn layout(conn: &rusqlite::Connection) -> Vec<String> {
    let objects: Vec<(String, String, String)> = conn
        .prepare("SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(objects.len() > 5, "{objects:?}");
    objects
        .into_iter()
        .map(|(kind, name, table)| {
            let columns: Vec<String> = if kind == "table" {
                conn.prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1)")
                    .unwrap()
                    .query_map([&name], |r| {
                        Ok(format!(
                            "{}:{}:{}:{}",
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, i64>(2)?,
                            r.get::<_, i64>(3)?
                        ))
                    })
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            } else {
                conn.prepare("SELECT name FROM pragma_index_info(?1)")
                    .unwrap()
                    .query_map([&name], |r| r.get::<_, String>(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            };
            format!("{kind} {name} on {table}: {}", columns.join(", "))
        })
        .collect()
}

/// A long text held in several places (the input, a state value, a task's write, the meta) is
/// stored once; a fork shares it, and it goes when the last thread using it is deleted.
#[test]
fn sqlite_a_long_text_is_stored_once_wherever_it_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let cp = SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap();
    let text = "lorem ipsum ".repeat(400_000);
    let len = text.len() as u64;
    let mut t = thread("t");
    t.input = json!({"text": text});
    cp.create_thread(&t).unwrap();
    let mut c0 = checkpoint("t", None, -1, &[("doc", 1), ("n", 1)]);
    c0.meta = json!({"input": {"text": text}});
    cp.put_checkpoint(&c0, &vals(&[("doc", 1, json!(text)), ("n", 1, json!(0))]))
        .unwrap();
    cp.put_writes(
        "t",
        &c0.checkpoint_id,
        &[write("task-a", 0, "doc", json!([text, text]))],
    )
    .unwrap();
    let stats = cp.stats().unwrap();
    assert!(
        stats.db_bytes < len + len / 4,
        "{} bytes for a {len}-byte text",
        stats.db_bytes
    );

    assert_eq!(cp.get_thread("t").unwrap().unwrap().input, t.input);
    assert_eq!(cp.value("t", "doc", 1).unwrap(), json!(text));
    assert_eq!(cp.get_checkpoint("t", None).unwrap().unwrap().meta, c0.meta);
    assert_eq!(
        cp.get_writes("t", &c0.checkpoint_id).unwrap()[0].value,
        json!([text, text])
    );

    let blobs = || -> i64 {
        rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("SELECT count(*) FROM blobs", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(blobs(), 1);
    cp.fork("t", &c0.checkpoint_id, "f").unwrap();
    cp.delete_thread("t").unwrap();
    assert_eq!(blobs(), 1, "the fork still uses it");
    assert_eq!(cp.get_thread("f").unwrap().unwrap().input, t.input);
    assert_eq!(cp.value("f", "doc", 1).unwrap(), json!(text));
    cp.delete_thread("f").unwrap();
    assert_eq!(blobs(), 0);
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL only.

/// Four processes' worth of stores (each its own pool) on one schema, two claimants each, in
/// several rounds: exactly one holds each lease.
#[test]
fn postgres_one_lease_among_racing_claimants() {
    let url = fresh_url();
    let stores: Vec<_> = (0..4)
        .map(|_| Arc::new(PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap()))
        .collect();
    for round in 0..5 {
        let barrier = Arc::new(Barrier::new(stores.len() * 2));
        let handles: Vec<_> = stores
            .iter()
            .flat_map(|s| [s.clone(), s.clone()])
            .enumerate()
            .map(|(i, s)| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    s.acquire_lease(&claim(&format!("race-{round}"), &format!("owner-{i}"), 60_000))
                        .is_ok()
                })
            })
            .collect();
        let granted = handles.into_iter().map(|h| h.join().unwrap()).filter(|g| *g).count();
        assert_eq!(granted, 1, "round {round}");
    }
}

#[test]
fn postgres_data_survives_reopening() {
    let url = fresh_url();
    let (cs, thread_before, writes_before, rows_before) = {
        let cp = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        let cs = three_steps(&cp, "t");
        cp.put_writes("t", &cs[2].checkpoint_id, &[write("x", 0, "a", json!({"k": [1, 2]}))])
            .unwrap();
        cp.set_status("t", ThreadStatus::Interrupted).unwrap();
        cp.fork("t", &cs[1].checkpoint_id, "f").unwrap();
        let thread = cp.get_thread("t").unwrap().unwrap();
        let writes = cp.get_writes("t", &cs[2].checkpoint_id).unwrap();
        (cs, thread, writes, cp.value_rows().unwrap())
        // Dropped here: its connections close.
    };
    let cp = PostgresCheckpointer::open(&url, Durability::PowerSafe).unwrap();
    assert_eq!(cp.get_thread("t").unwrap(), Some(thread_before));
    assert_eq!(cp.history("t").unwrap(), cs.iter().rev().cloned().collect::<Vec<_>>());
    assert_eq!(
        cp.state("t", &cs[2].versions).unwrap(),
        obj(json!({"a": "a3", "b": ["b1"]}))
    );
    assert_eq!(cp.get_writes("t", &cs[2].checkpoint_id).unwrap(), writes_before);
    assert_eq!(thread_ids(&cp.list_threads().unwrap()), ["f", "t"]);
    assert_eq!(cp.history("f").unwrap().len(), 1, "the fork's checkpoint");
    assert!(rows_before > 0);
    assert_eq!(cp.value_rows().unwrap(), rows_before);
}

/// The `schema` of the URL is the store: another schema on the same database sees nothing of
/// it, and the same schema opened again sees all of it.
#[test]
fn postgres_a_schema_is_a_store_of_its_own() {
    let url = fresh_url();
    let a = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
    three_steps(&a, "t");
    let b = PostgresCheckpointer::open(&fresh_url(), Durability::CrashSafe).unwrap();
    assert_eq!(b.list_threads().unwrap(), vec![]);
    assert_eq!(b.get_checkpoint("t", None).unwrap(), None);
    b.create_thread(&thread("t")).unwrap();
    let again = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
    assert_eq!(again.history("t").unwrap().len(), 3);
}

/// `url` (a fresh database's) reached through a [`counting_relay`], with a pool of one
/// connection: the URL, and the count of the clients' sends.
pub(crate) fn counted_url(url: &str) -> (url::Url, Arc<std::sync::atomic::AtomicUsize>) {
    let url = url::Url::parse(url).unwrap();
    let target = std::net::ToSocketAddrs::to_socket_addrs(&(url.host_str().unwrap(), url.port().unwrap()))
        .unwrap()
        .next()
        .unwrap();
    let (port, sends) = counting_relay(target);
    let mut relayed = url.clone();
    relayed.set_port(Some(port)).unwrap();
    relayed.query_pairs_mut().append_pair("pool_size", "1");
    (relayed, sends)
}

/// A relay on loopback to `target` that counts the reads it passes on from its clients: a
/// client that waits for each answer before it sends the next statement makes one read per
/// statement, one that sends a whole write at once makes one.
pub(crate) fn counting_relay(target: std::net::SocketAddr) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    let (port, sends, _) = relay(target, b"", Lose::Answer);
    (port, sends)
}

/// Which message [`relay`]'s switch drops.
#[derive(Clone, Copy, PartialEq)]
enum Lose {
    /// The server's answer: the connection is broken both ways (an answer lost after the
    /// statement was done).
    Answer,
    /// The client's message: the client's side of the connection is broken, the server's left
    /// open and silent (a connection cut without a word, the statement never received).
    Request,
}

/// [`counting_relay`], and a switch: set, the next message that holds `at` (any, if empty),
/// whichever connection it is on, is dropped as `lose` says.
fn relay(
    target: std::net::SocketAddr,
    at: &'static [u8],
    lose: Lose,
) -> (
    u16,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sends = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (counted, cutting) = (sends.clone(), cut.clone());
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = std::net::TcpStream::connect(target) else {
                return;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            // `from` is the server when `answers`; `cut`, the switch if this way is the one.
            let pipe = |mut from: std::net::TcpStream,
                        mut to: std::net::TcpStream,
                        answers: bool,
                        count: Option<Arc<std::sync::atomic::AtomicUsize>>,
                        cut: Option<Arc<std::sync::atomic::AtomicBool>>| {
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut server_left_open = false;
                    while let Ok(n @ 1..) = from.read(&mut buf) {
                        if let Some(count) = &count {
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        let holds = at.is_empty() || buf[..n].windows(at.len()).any(|w| w == at);
                        if holds && cut.as_ref().is_some_and(|c| c.swap(false, Ordering::SeqCst)) {
                            // Answers: `from` is the server's. Requests: the client's, and the
                            // server's (`to`) stays open.
                            let _ = from.shutdown(std::net::Shutdown::Both);
                            server_left_open = !answers;
                            break;
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    if !server_left_open {
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    }
                });
            };
            let (to_server, to_client) = match lose {
                Lose::Answer => (None, Some(cutting.clone())),
                Lose::Request => (Some(cutting.clone()), None),
            };
            pipe(
                client.try_clone().unwrap(),
                server.try_clone().unwrap(),
                false,
                Some(counted.clone()),
                to_server,
            );
            pipe(server, client, true, None, to_client);
        }
    });
    (port, sends, cut)
}

/// A step of thread `parent.thread_id` under `fence`: task `t`'s write of `n` to `n` against
/// `parent`, and the next checkpoint (returned), where `n` is `n`, in one batch.
fn fenced_step(
    cp: &PostgresCheckpointer,
    fence: &Fence,
    parent: &Checkpoint,
    n: u64,
) -> (Checkpoint, runner::checkpoint::Result<()>) {
    let id = parent.thread_id.as_str();
    let next = checkpoint(id, Some(parent), n as i64, &[("n", n + 1)]);
    let written = cp.put_batch(vec![
        Put::Fence(fence.clone()),
        Put::Writes {
            thread_id: id.into(),
            checkpoint_id: parent.checkpoint_id.clone(),
            writes: vec![write("t", 0, "n", json!(n))],
        },
        Put::Checkpoint(Arc::new(next.clone()), vals(&[("n", n + 1, json!(n))])),
    ]);
    (next, written)
}

/// A power-safe checkpointer on a fresh database through [`relay`], whose switch drops the next
/// message that holds `at` as `lose` says.
fn dropping(at: &'static [u8], lose: Lose) -> (PostgresCheckpointer, Arc<AtomicBool>) {
    let url = url::Url::parse(&fresh_url()).unwrap();
    let target = std::net::ToSocketAddrs::to_socket_addrs(&(url.host_str().unwrap(), url.port().unwrap()))
        .unwrap()
        .next()
        .unwrap();
    let (port, _, cut) = relay(target, at, lose);
    let mut relayed = url.clone();
    relayed.set_port(Some(port)).unwrap();
    (
        PostgresCheckpointer::open(relayed.as_str(), Durability::PowerSafe).unwrap(),
        cut,
    )
}

/// A step's write whose answer was lost after it committed (its connection broken between
/// the two) is made again, finds its own rows, and answers as the first try would have: the
/// step is stored once, and the run goes on.
#[test]
fn postgres_a_step_committed_whose_answer_was_lost_is_written_once() {
    let (cp, cut) = dropping(b"", Lose::Answer);
    let id = "lost";
    let lease = cp.acquire_lease(&claim(id, "owner", 60_000)).unwrap();
    let c0 = checkpoint(id, None, -1, &[("n", 1)]);
    cp.create_thread_with_checkpoint(Some(&lease.fence()), &thread(id), &c0, vals(&[("n", 1, json!(0))]))
        .unwrap();
    let step = |parent: &Checkpoint, n: u64| fenced_step(&cp, &lease.fence(), parent, n);
    let (c1, written) = step(&c0, 1);
    written.unwrap();
    cut.store(true, Ordering::SeqCst);
    let (c2, written) = step(&c1, 2);
    assert!(!cut.load(Ordering::SeqCst), "an answer was dropped");
    written.unwrap();
    let (_, written) = step(&c2, 3);
    written.unwrap();
    assert_eq!(cp.history(id).unwrap().len(), 4);
    assert_eq!(cp.get_writes(id, &c1.checkpoint_id).unwrap().len(), 1);
}

/// Writes that take a transaction (a fork, a step with a long string, a thread's removal, a
/// queued run's cancel) and whose `COMMIT` was sent with no answer back, as `lose` says, are
/// made once: found committed, they answer as the first try would have; never committed, they
/// are made again.
fn transactions_made_once(lose: Lose) {
    use runner::checkpoint::queue::RunQueue;
    // A `COMMIT`: the client's Query message, or the tag of the server's answer (its
    // CommandComplete message).
    let (cp, cut) = dropping(b"COMMIT\0", lose);
    let lost = |what: &str| assert!(!cut.swap(true, Ordering::SeqCst), "{what}: nothing was dropped");
    let id = "origin";
    let c0 = checkpoint(id, None, -1, &[("n", 1)]);
    cp.create_thread_with_checkpoint(None, &thread(id), &c0, vals(&[("n", 1, json!(0))]))
        .unwrap();

    // A fork: once, not "already exists".
    cut.store(true, Ordering::SeqCst);
    let forked = cp.fork(id, &c0.checkpoint_id, "forked").unwrap();
    lost("fork");
    assert_eq!(cp.get_checkpoint("forked", None).unwrap().unwrap(), forked);
    assert_eq!(cp.history("forked").unwrap().len(), 1);

    // A step whose state holds a long string (stored apart, in a transaction): once.
    let lease = cp.acquire_lease(&claim(id, "owner", 60_000)).unwrap();
    let long = "x".repeat(100_000);
    let c1 = checkpoint(id, Some(&c0), 0, &[("n", 2)]);
    cut.store(true, Ordering::SeqCst);
    cp.put_batch(vec![
        Put::Fence(lease.fence()),
        Put::Checkpoint(Arc::new(c1.clone()), vals(&[("n", 2, json!(long))])),
    ])
    .unwrap();
    lost("a step with a long string");
    assert_eq!(cp.history(id).unwrap().len(), 2);
    assert_eq!(cp.state(id, &c1.versions).unwrap()["n"], json!(long));
    cp.release_lease(&lease.fence()).unwrap();

    // A queued run's cancel: it ended the run, and says so.
    assert!(
        cp.admit(&run_row("r", "queued", RunStatus::Pending), false, None)
            .unwrap()
    );
    cut.store(true, Ordering::SeqCst);
    assert!(cp.cancel("r", "interrupt").unwrap(), "the run ended by the cancel");
    lost("cancel");
    assert_eq!(cp.get_run("r").unwrap().unwrap().status, RunStatus::Interrupted);

    // A removal: removed, not found missing.
    cut.store(true, Ordering::SeqCst);
    let removed = cp
        .remove_thread("forked", &Removal::default(), &claim("forked", "remover", 60_000))
        .unwrap();
    lost("removal");
    assert!(matches!(removed, Removed::Removed), "{removed:?}");
    assert!(cp.get_thread("forked").unwrap().is_none());
}

/// A transaction whose `COMMIT` committed and whose answer was lost is not made again blindly:
/// the next try finds it committed and answers as the first would have (a fork, not "already
/// exists"; a cancel that ended the run, not "not queued"; a removal, not "missing").
#[test]
fn postgres_a_transaction_committed_whose_answer_was_lost_answers_as_it_would_have() {
    transactions_made_once(Lose::Answer);
}

/// A transaction whose `COMMIT` never reached the server, on a connection cut without a word
/// (the server's session left waiting, its transaction in progress, for a minute or more), is
/// made again at once: the next try ends that session, which aborts the transaction, and does
/// the work once; it neither waits the session out nor fails as unavailable meanwhile.
#[test]
fn postgres_a_transaction_whose_commit_never_arrived_is_made_again_without_waiting() {
    transactions_made_once(Lose::Request);
}

/// A worker's claim reads the claimed run's thread — the thread, its head and its record — in
/// the claim's own round trip, as the separate read of them finds them; a run on a thread
/// with nothing stored yet finds none of them.
#[test]
fn postgres_a_claim_reads_its_runs_thread_in_its_round_trip() {
    use runner::checkpoint::queue::RunQueue;
    let (relayed, sends) = counted_url(&fresh_url());
    let cp = PostgresCheckpointer::open(relayed.as_str(), Durability::CrashSafe).unwrap();
    let c0 = checkpoint("claimed", None, -1, &[("n", 1)]);
    cp.create_thread_with_checkpoint(None, &thread("claimed"), &c0, vals(&[("n", 1, json!(0))]))
        .unwrap();
    let c1 = checkpoint("claimed", Some(&c0), 0, &[("n", 2)]);
    cp.put_checkpoint(&c1, &vals(&[("n", 2, json!(1))])).unwrap();
    let meta = |thread: &str| ThreadMeta {
        thread_id: thread.into(),
        created_at: "2020-01-01T10:00:00.000Z".into(),
        updated_at: "2020-01-01T11:00:00.000Z".into(),
        metadata: json!({"graph_id": "g"}),
        ttl: None,
    };
    // Claimed in the order they were admitted.
    assert!(
        cp.admit(&run_row("r0", "warm", RunStatus::Pending), false, None)
            .unwrap()
    );
    assert!(
        cp.admit(
            &run_row("r1", "claimed", RunStatus::Pending),
            false,
            Some(&meta("claimed"))
        )
        .unwrap()
    );
    assert!(
        cp.admit(&run_row("r2", "empty", RunStatus::Pending), false, None)
            .unwrap()
    );
    let claim = |owner: &str| LeaseClaim {
        thread_id: String::new(),
        owner: owner.into(),
        pid: std::process::id(),
        host: "here".into(),
        ttl: std::time::Duration::from_secs(30),
        replace: None,
    };
    // The first prepares the statements.
    let warm = cp.claim("w", &claim("c0")).unwrap().unwrap();
    assert_eq!(warm.run.run_id, "r0");
    let before = sends.load(Ordering::SeqCst);
    let claimed = cp.claim("w", &claim("c1")).unwrap().unwrap();
    assert_eq!(
        sends.load(Ordering::SeqCst) - before,
        1,
        "the claim and its thread are one send"
    );
    assert_eq!(claimed.run.run_id, "r1");
    let view = claimed.view.expect("the claimed run's thread, read with the claim");
    let separate = cp.thread_view("claimed").unwrap();
    assert_eq!(view.thread, separate.thread);
    assert_eq!(view.thread.map(|t| t.thread_id), Some("claimed".to_string()));
    assert_eq!(view.head, separate.head);
    assert_eq!(view.head.map(|h| h.checkpoint_id), Some(c1.checkpoint_id.clone()));
    assert_eq!(view.meta, separate.meta);
    assert_eq!(view.meta.map(|m| m.metadata), Some(json!({"graph_id": "g"})));
    let empty = cp.claim("w", &claim("c2")).unwrap().unwrap();
    assert_eq!(empty.run.run_id, "r2");
    let view = empty.view.expect("read with the claim");
    assert!(view.thread.is_none() && view.head.is_none() && view.meta.is_none());
    // Nothing left to claim: nothing read.
    assert!(cp.claim("w", &claim("c3")).unwrap().is_none());
}

/// A claim's reads of its thread go after the claim even on a connection that has prepared
/// nothing yet (each statement is prepared first, in a round trip of its own, and the reads
/// must not be sent before the claim then): the claimed run finds its thread's head, not an
/// empty thread.
#[test]
fn postgres_a_first_claim_on_a_new_connection_reads_its_thread_after_the_claim() {
    use runner::checkpoint::queue::RunQueue;
    let url = fresh_url();
    for i in 0..12 {
        let cp = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        let id = format!("first-{i}");
        let c0 = checkpoint(&id, None, -1, &[("n", 1)]);
        cp.create_thread_with_checkpoint(None, &thread(&id), &c0, vals(&[("n", 1, json!(0))]))
            .unwrap();
        assert!(
            cp.admit(&run_row(&format!("r{i}"), &id, RunStatus::Pending), false, None)
                .unwrap()
        );
        drop(cp);
        // A new checkpointer: its connections have prepared nothing.
        let cp = PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap();
        let claim = LeaseClaim {
            thread_id: String::new(),
            owner: format!("claim-{i}"),
            pid: std::process::id(),
            host: "here".into(),
            ttl: std::time::Duration::from_secs(30),
            replace: None,
        };
        let claimed = cp.claim("w", &claim).unwrap().expect("a run to claim");
        assert_eq!(claimed.run.thread_id, id);
        let view = claimed.view.expect("read with the claim");
        assert_eq!(
            view.head.map(|h| h.checkpoint_id),
            Some(c0.checkpoint_id.clone()),
            "claim {i}: the thread's head"
        );
        assert_eq!(view.thread.map(|t| t.thread_id), Some(id.clone()));
    }
}

/// A fenced step (its checkpoint, values and writes) is written in one round trip: the client
/// sends it once and waits once, as a single `INSERT` and its commit would (the statement's
/// text is prepared once per connection, the first time).
#[test]
fn postgres_a_fenced_step_is_one_round_trip() {
    let (relayed, sends) = counted_url(&fresh_url());
    for durability in [Durability::PowerSafe, Durability::CrashSafe] {
        let cp = PostgresCheckpointer::open(relayed.as_str(), durability).unwrap();
        let id = format!("one-{durability:?}");
        let lease = cp.acquire_lease(&claim(&id, "owner-a", 60_000)).unwrap();
        let mut parent = checkpoint(&id, None, -1, &[("n", 1)]);
        cp.create_thread_with_checkpoint(Some(&lease.fence()), &thread(&id), &parent, vals(&[("n", 1, json!(0))]))
            .unwrap();
        let step = |parent: &Checkpoint, n: u64| {
            let next = checkpoint(&id, Some(parent), n as i64, &[("n", n + 1)]);
            cp.put_batch(vec![
                Put::Fence(lease.fence()),
                Put::Writes {
                    thread_id: id.clone(),
                    checkpoint_id: parent.checkpoint_id.clone(),
                    writes: vec![write("t", 0, "n", json!(n))],
                },
                Put::Checkpoint(Arc::new(next.clone()), vals(&[("n", n + 1, json!(n))])),
            ])
            .unwrap();
            next
        };
        // The first prepares the statement.
        parent = step(&parent, 1);
        let before = sends.load(Ordering::SeqCst);
        for n in 2..7 {
            parent = step(&parent, n);
        }
        assert_eq!(
            sends.load(Ordering::SeqCst) - before,
            5,
            "{durability:?}: one send a step"
        );
        assert_eq!(cp.history(&id).unwrap().len(), 7);
        assert_eq!(
            cp.get_writes(&id, &cp.history(&id).unwrap()[1].checkpoint_id)
                .unwrap()
                .len(),
            1
        );
    }
}

/// A thread whose input, or a checkpoint whose metadata, holds long strings (stored apart) is
/// read whole: the one-statement read finds the references and reads again in one snapshot.
#[test]
fn postgres_long_strings_of_a_thread_and_a_checkpoint_are_read_whole() {
    let backend = postgres(Durability::CrashSafe);
    let cp = &*backend.cp;
    let mut t = thread("long");
    t.input = json!({"text": "lorem ipsum ".repeat(8_000)});
    cp.create_thread(&t).unwrap();
    let mut c0 = checkpoint("long", None, -1, &[("n", 1)]);
    c0.meta = json!({"note": "dolor sit amet ".repeat(8_000)});
    cp.put_checkpoint(&c0, &vals(&[("n", 1, json!(0))])).unwrap();
    assert_eq!(cp.get_thread("long").unwrap().unwrap().input, t.input);
    assert_eq!(cp.get_checkpoint("long", None).unwrap().unwrap(), c0);
    assert_eq!(cp.get_checkpoint("long", Some(&c0.checkpoint_id)).unwrap().unwrap(), c0);
}

/// An append-only key extends its previous version at every step: read at its last version,
/// its whole chain comes back from one statement, not one a step (a chat thread's messages
/// after 30 turns: 30 round trips before). Counted through a relay, as a read's sends.
#[test]
fn postgres_a_values_chain_is_read_by_one_statement() {
    let (relayed, sends) = counted_url(&fresh_url());
    let cp = PostgresCheckpointer::open(relayed.as_str(), Durability::CrashSafe).unwrap();
    let mut parent = checkpoint("chain", None, -1, &[("m", 1), ("n", 1)]);
    cp.create_thread_with_checkpoint(
        None,
        &thread("chain"),
        &parent,
        vals(&[("m", 1, json!(["m1"])), ("n", 1, json!(0))]),
    )
    .unwrap();
    for v in 2..=30u64 {
        let next = checkpoint("chain", Some(&parent), v as i64, &[("m", v), ("n", 1)]);
        let item = format!("m{v}");
        cp.put_checkpoint(
            &next,
            &vals(&[("m", v, runner::checkpoint::extension(v - 1, vec![json!(item)]))]),
        )
        .unwrap();
        parent = next;
    }
    let versions = parent.versions.clone();
    // The first prepares the statement.
    let state = cp.state("chain", &versions).unwrap();
    let all: Vec<Value> = (1..=30).map(|v| json!(format!("m{v}"))).collect();
    assert_eq!(state["m"], Value::Array(all));
    assert_eq!(state["n"], json!(0));
    let before = sends.load(Ordering::SeqCst);
    assert_eq!(cp.state("chain", &versions).unwrap(), state);
    let sent = sends.load(Ordering::SeqCst) - before;
    assert!(sent <= 3, "{sent} sends for one read of a 30-link chain");
    // A version in the middle of the chain, read alone.
    let mut at_ten = BTreeMap::new();
    at_ten.insert("m".to_string(), 10);
    let ten: Vec<Value> = (1..=10).map(|v| json!(format!("m{v}"))).collect();
    assert_eq!(cp.state("chain", &at_ten).unwrap()["m"], Value::Array(ten));
    // A version that was never stored is told as missing.
    at_ten.insert("m".to_string(), 99);
    assert!(matches!(cp.state("chain", &at_ten), Err(CheckpointError::Corrupt(_))));
    // The head and its state, chain and all, from one statement (the first prepares it).
    assert_eq!(
        cp.checkpoint_state("chain", None).unwrap().unwrap(),
        (parent.clone(), state.clone())
    );
    let before = sends.load(Ordering::SeqCst);
    assert_eq!(cp.checkpoint_state("chain", None).unwrap().unwrap(), (parent, state));
    assert_eq!(
        sends.load(Ordering::SeqCst) - before,
        1,
        "one send for a checkpoint and its state"
    );
}

/// On PostgreSQL a thread's creation, its status and its first checkpoint are one statement
/// (a step's write): all of it or none, the status the batch leaves the thread in, a thread
/// created twice refused, a status on a missing thread refused with the rest.
#[test]
fn postgres_a_thread_its_status_and_first_checkpoint_are_one_statement() {
    let backend = postgres(Durability::CrashSafe);
    let cp = &*backend.cp;
    let c0 = checkpoint("A", None, -1, &[("n", 1)]);
    let status = |thread: &str, status| Put::Status {
        thread_id: thread.into(),
        status,
    };
    let broken = cp.put_batch(vec![
        Put::Thread(Box::new(thread("A"))),
        status("A", ThreadStatus::Interrupted),
        Put::Checkpoint(Arc::new(c0.clone()), vals(&[("n", 1, json!(0))])),
        Put::Checkpoint(Arc::new(c0.clone()), vals(&[("n", 1, json!(0))])),
    ]);
    assert!(broken.is_err());
    assert_eq!(cp.get_thread("A").unwrap(), None);
    cp.put_batch(vec![
        Put::Thread(Box::new(thread("A"))),
        status("A", ThreadStatus::Interrupted),
        Put::Checkpoint(Arc::new(c0.clone()), vals(&[("n", 1, json!(0))])),
    ])
    .unwrap();
    assert_eq!(cp.get_thread("A").unwrap().unwrap().status, ThreadStatus::Interrupted);
    assert_eq!(cp.history("A").unwrap().len(), 1);
    let again = cp.put_batch(vec![Put::Thread(Box::new(thread("A")))]).unwrap_err();
    assert!(
        matches!(again, CheckpointError::ThreadExists(ref t) if t == "A"),
        "{again:?}"
    );
    let c1 = checkpoint("A", Some(&c0), 0, &[("n", 2)]);
    let missing = cp
        .put_batch(vec![
            Put::Checkpoint(Arc::new(c1.clone()), vals(&[("n", 2, json!(1))])),
            status("A", ThreadStatus::Done),
            status("nope", ThreadStatus::Done),
        ])
        .unwrap_err();
    assert!(
        matches!(missing, CheckpointError::NoThread(ref t) if t == "nope"),
        "{missing:?}"
    );
    assert!(cp.get_checkpoint("A", Some(&c1.checkpoint_id)).unwrap().is_none());
    assert_eq!(cp.get_thread("A").unwrap().unwrap().status, ThreadStatus::Interrupted);
}

/// A read waits for one answer, however many statements it takes: its `BEGIN` goes with its
/// statements, its values are read together (three keys, one statement), and its end is not
/// waited for. Counted as the relay's reads from the client: before, a state of three keys
/// sent six times (begin, thread, one a key, commit) and a checkpoint's pending writes five.
#[test]
fn postgres_a_read_is_sent_at_once() {
    let (relayed, sends) = counted_url(&fresh_url());
    let cp = PostgresCheckpointer::open(relayed.as_str(), Durability::CrashSafe).unwrap();
    let first = checkpoint("reads", None, -1, &[("a", 1), ("b", 1), ("c", 1)]);
    cp.create_thread_with_checkpoint(
        None,
        &thread("reads"),
        &first,
        vals(&[("a", 1, json!("x")), ("b", 1, json!([1, 2])), ("c", 1, json!({"k": 1}))]),
    )
    .unwrap();
    cp.put_writes("reads", &first.checkpoint_id, &[write("t", 0, "a", json!("y"))])
        .unwrap();
    let versions: BTreeMap<String, u64> = first.versions.clone();
    // The first of each prepares its statements.
    let state = cp.state("reads", &versions).unwrap();
    assert_eq!(state["b"], json!([1, 2]));
    cp.get_writes("reads", &first.checkpoint_id).unwrap();
    let reads = 5;
    let before = sends.load(Ordering::SeqCst);
    for _ in 0..reads {
        assert_eq!(cp.state("reads", &versions).unwrap(), state);
        assert_eq!(cp.get_writes("reads", &first.checkpoint_id).unwrap().len(), 1);
    }
    let sent = sends.load(Ordering::SeqCst) - before;
    // Each read: what it asks (one send, or a few when the client's writes are split), and
    // its end (one).
    assert!(sent <= reads * 2 * 3, "{sent} sends for {} reads", reads * 2);
    // A read of one statement (a checkpoint, a thread, a lease) is sent once: no transaction
    // around it. The statements are prepared first, and the ends of the reads before let go.
    cp.get_checkpoint("reads", None).unwrap();
    cp.get_thread("reads").unwrap();
    cp.lease("reads").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = sends.load(Ordering::SeqCst);
    for _ in 0..reads {
        assert_eq!(cp.get_checkpoint("reads", None).unwrap().unwrap(), first);
        assert_eq!(cp.get_thread("reads").unwrap().unwrap().thread_id, "reads");
        assert_eq!(cp.lease("reads").unwrap(), None);
    }
    assert_eq!(
        sends.load(Ordering::SeqCst) - before,
        reads * 3,
        "one send a read of one statement"
    );
    // A thread, its head and its record, read together: one send, what the reads apart read.
    cp.put_thread_meta(&meta("reads", json!({"k": "v"}))).unwrap();
    cp.thread_view("reads").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = sends.load(Ordering::SeqCst);
    for _ in 0..reads {
        let view = cp.thread_view("reads").unwrap();
        assert_eq!(view.thread.unwrap(), cp.get_thread("reads").unwrap().unwrap());
        assert_eq!(view.head.unwrap(), first);
        assert_eq!(view.meta.unwrap().metadata, json!({"k": "v"}));
    }
    assert_eq!(
        sends.load(Ordering::SeqCst) - before,
        reads * 2,
        "one send a thread with its head and record (and one a thread alone)"
    );
    let view = cp.thread_view("nope").unwrap();
    assert!(view.thread.is_none() && view.head.is_none() && view.meta.is_none());
    // A thread and its head, read together: one send.
    cp.thread_and_head("reads").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = sends.load(Ordering::SeqCst);
    for _ in 0..reads {
        let (found, head) = cp.thread_and_head("reads").unwrap();
        assert_eq!(found.unwrap(), cp.get_thread("reads").unwrap().unwrap());
        assert_eq!(head.unwrap(), first);
    }
    assert_eq!(
        sends.load(Ordering::SeqCst) - before,
        reads * 2,
        "one send a thread with its head (and one a thread alone)"
    );
    let (found, head) = cp.thread_and_head("nope").unwrap();
    assert!(found.is_none() && head.is_none());
    // Missing things are told as before, in the same order.
    assert!(matches!(cp.state("nope", &versions), Err(CheckpointError::NoThread(_))));
    assert!(matches!(
        cp.get_writes("reads", "no-such-checkpoint"),
        Err(CheckpointError::NoCheckpoint(..))
    ));
}

/// A fenced step is written by the calling thread on the checkpointer's step connection
/// (`application_name` `runner-steps`), not a pooled one; a write that finds that connection
/// closed by the server is stored all the same, once (on the pool), and the next write opens
/// it again; a write whose lease was taken over fails on it and stores nothing.
#[test]
fn postgres_a_step_is_written_on_the_step_connection_and_survives_its_loss() {
    let server = crate::support::postgres::Server::start();
    let (url, admin) = (server.fresh_url(), server.admin_url());
    let cp = PostgresCheckpointer::open(&url, Durability::PowerSafe).unwrap();
    let id = "stepped";
    let steps = || {
        crate::support::postgres::query(
            &admin,
            "SELECT pid::text, query FROM pg_stat_activity WHERE application_name = 'runner-steps'",
        )
        .unwrap()
    };
    // The step connection, open, its last statement beginning with `sql`: its process id.
    let last_step = |sql: &str| {
        let seen = steps();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0][1].as_deref().unwrap().starts_with(sql), "{seen:?}");
        seen[0][0].clone().unwrap()
    };
    let lease = cp.acquire_lease(&claim(id, "owner-a", 60_000)).unwrap();
    assert_eq!(steps().len(), 0, "opened on first use");
    // The thread, its first checkpoint and its status: one statement too.
    let c0 = checkpoint(id, None, -1, &[("n", 1)]);
    cp.create_thread_with_checkpoint(Some(&lease.fence()), &thread(id), &c0, vals(&[("n", 1, json!(0))]))
        .unwrap();
    last_step("WITH nt AS (INSERT INTO threads");
    let step = |parent: &Checkpoint, n: u64| fenced_step(&cp, &lease.fence(), parent, n);
    let (c1, written) = step(&c0, 1);
    written.unwrap();
    let first = last_step("WITH c AS (INSERT INTO checkpoints");

    crate::support::postgres::query(&admin, &format!("SELECT pg_terminate_backend({first})")).unwrap();
    let (c2, written) = step(&c1, 2);
    written.unwrap();
    let (c3, written) = step(&c2, 3);
    written.unwrap();
    let seen = steps();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_ne!(seen[0][0].as_deref(), Some(first.as_str()), "opened again");
    assert_eq!(cp.history(id).unwrap().len(), 4);
    assert_eq!(cp.get_writes(id, &c2.checkpoint_id).unwrap().len(), 1);

    crate::support::postgres::query(
        &url,
        &format!("UPDATE leases SET owner = 'owner-b', generation = generation + 1 WHERE thread_id = '{id}'"),
    )
    .unwrap();
    let (c4, written) = step(&c3, 4);
    assert!(
        matches!(&written, Err(CheckpointError::LeaseLost(t)) if t == id),
        "{written:?}"
    );
    assert!(cp.get_checkpoint(id, Some(&c4.checkpoint_id)).unwrap().is_none());
    assert_eq!(cp.get_writes(id, &c3.checkpoint_id).unwrap(), vec![]);
}

/// Steps committing at once each take a step connection of their own, opened as they are
/// needed, up to four, rather than the pool's (whose connections plan every statement anew).
#[test]
fn postgres_steps_committing_at_once_take_step_connections_up_to_four() {
    let server = crate::support::postgres::Server::start();
    let (url, admin) = (server.fresh_url(), server.admin_url());
    let cp = Arc::new(PostgresCheckpointer::open(&url, Durability::CrashSafe).unwrap());
    const WRITERS: usize = 8;
    let together = Arc::new(std::sync::Barrier::new(WRITERS));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (cp, together) = (cp.clone(), together.clone());
            std::thread::spawn(move || {
                let id = format!("together-{w}");
                let lease = cp.acquire_lease(&claim(&id, "owner", 60_000)).unwrap();
                let mut parent = checkpoint(&id, None, -1, &[("n", 1)]);
                cp.create_thread_with_checkpoint(
                    Some(&lease.fence()),
                    &thread(&id),
                    &parent,
                    vals(&[("n", 1, json!(0))]),
                )
                .unwrap();
                for n in 1..=30u64 {
                    let next = checkpoint(&id, Some(&parent), n as i64, &[("n", n + 1)]);
                    together.wait();
                    cp.put_batch(vec![
                        Put::Fence(lease.fence()),
                        Put::Checkpoint(Arc::new(next.clone()), vals(&[("n", n + 1, json!(n))])),
                    ])
                    .unwrap();
                    parent = next;
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let open = crate::support::postgres::query(
        &admin,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'runner-steps'",
    )
    .unwrap();
    let open: usize = open[0][0].as_deref().unwrap().parse().unwrap();
    assert!((2..=4).contains(&open), "{open} step connections");
    for w in 0..WRITERS {
        assert_eq!(cp.history(&format!("together-{w}")).unwrap().len(), 31);
    }
}

/// Waits (up to 20 s) until `sql` on the server answers `true`.
fn until_true(url: &str, sql: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let rows = crate::support::postgres::query(url, sql).unwrap();
        if rows[0][0].as_deref() == Some("t") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "never true: {sql}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A fenced write racing a takeover of its lease: it waits for the takeover's transaction
/// (which holds the lease row), then fails and writes nothing when the takeover commits, and
/// is written when it rolls back. The fence is checked as the row is once the wait ends.
#[test]
fn postgres_a_fenced_write_waits_for_a_takeover_and_sees_it() {
    let url = fresh_url();
    let cp = Arc::new(PostgresCheckpointer::open(&url, Durability::PowerSafe).unwrap());
    for (case, end) in [("committed", "COMMIT"), ("rolled-back", "ROLLBACK")] {
        let id = format!("race-{case}");
        let lease = cp.acquire_lease(&claim(&id, "owner-a", 60_000)).unwrap();
        let c0 = checkpoint(&id, None, -1, &[("n", 1)]);
        cp.create_thread_with_checkpoint(Some(&lease.fence()), &thread(&id), &c0, vals(&[("n", 1, json!(0))]))
            .unwrap();
        let marker = format!("takeover-{case}-{}", new_id());
        let takeover = {
            let (url, sql) = (
                url.clone(),
                format!(
                    "/* {marker} */ BEGIN; UPDATE leases SET owner = 'owner-b', generation = generation + 1 \
                     WHERE thread_id = '{id}'; SELECT pg_sleep(2); {end}"
                ),
            );
            std::thread::spawn(move || crate::support::postgres::query(&url, &sql).unwrap())
        };
        until_true(
            &url,
            &format!(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE '%{marker}%' AND wait_event = 'PgSleep'"
            ),
        );
        let c1 = checkpoint(&id, Some(&c0), 0, &[("n", 2)]);
        let writer = {
            let (cp, fence, id, c0, c1) = (cp.clone(), lease.fence(), id.clone(), c0.clone(), c1.clone());
            std::thread::spawn(move || {
                cp.put_batch(vec![
                    Put::Fence(fence),
                    Put::Writes {
                        thread_id: id,
                        checkpoint_id: c0.checkpoint_id.clone(),
                        writes: vec![write("t", 0, "n", json!(1))],
                    },
                    Put::Checkpoint(Arc::new(c1), vals(&[("n", 2, json!(1))])),
                ])
            })
        };
        // The write waits on the lease row while the takeover's transaction is open (its
        // statement's text as the server shows it: the first 1 KiB).
        until_true(
            &url,
            "SELECT count(*) > 0 FROM pg_stat_activity \
             WHERE query LIKE 'WITH c AS (INSERT INTO checkpoints%' AND wait_event_type = 'Lock'",
        );
        assert!(!writer.is_finished(), "{case}: the write did not wait");
        takeover.join().unwrap();
        let written = writer.join().unwrap();
        if end == "COMMIT" {
            assert!(
                matches!(&written, Err(CheckpointError::LeaseLost(t)) if *t == id),
                "{case}: {written:?}"
            );
            assert_eq!(ids(&cp.history(&id).unwrap()), vec![c0.checkpoint_id.as_str()]);
            assert_eq!(cp.get_writes(&id, &c0.checkpoint_id).unwrap(), vec![]);
        } else {
            written.unwrap();
            assert_eq!(
                ids(&cp.history(&id).unwrap()),
                vec![c1.checkpoint_id.as_str(), c0.checkpoint_id.as_str()]
            );
            assert_eq!(cp.get_writes(&id, &c0.checkpoint_id).unwrap().len(), 1);
        }
    }
}
