//! The run verbs through the real binary: run, resume, threads, history, state, fork, their
//! exit codes, and Ctrl-C.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A workflow with a human gate: write, then ask; `respond` loops back to write.
const GATE: &str = include_str!("fixtures/gate.yaml");

// Each resume is a new process, so replies are matched on the prompt, not on call order.
const MOCK: &str = "match:\n  - {contains: \"(version 0)\", reply: first draft}\n  - {contains: \"(version 2)\", reply: second draft}\n";

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gate.yaml"), GATE).unwrap();
    std::fs::write(dir.path().join("mock.yaml"), MOCK).unwrap();
    dir
}

fn runner(dir: &Path, args: &[&str]) -> Output {
    Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir)
        .env("RUNNER_DB", dir.join("runner.db"))
        .args(args)
        .output()
        .unwrap()
}

/// `run gate.yaml` on the mock with `topic=tides` on thread `thread`, plus `extra` arguments.
fn run_gate(dir: &Path, thread: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "gate.yaml",
        "--mock",
        "mock.yaml",
        "--thread",
        thread,
        "--input",
        "topic=tides",
    ];
    args.extend_from_slice(extra);
    runner(dir, &args)
}

fn json_out(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("stdout is not JSON: {}", String::from_utf8_lossy(&o.stdout)))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn run_interrupt_resume_history_state_and_fork() {
    let dir = project();
    let d = dir.path();
    let run = run_gate(d, "t1", &["--set", "style=lyrical"]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    let waiting = json_out(&run);
    assert_eq!(waiting["interrupt"]["node"], "review");
    assert_eq!(waiting["interrupt"]["payload"]["payload"]["draft"], "first draft");
    assert!(stderr(&run).contains("runner resume --thread t1"));

    // An answer that does not fit the gate is refused; the thread keeps waiting.
    let bad = runner(
        d,
        &[
            "resume",
            "--thread",
            "t1",
            "--mock",
            "mock.yaml",
            "--answer",
            r#"{"action": "later"}"#,
        ],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("does not fit the gate's response schema"),
        "{}",
        stderr(&bad)
    );
    let threads = String::from_utf8(runner(d, &["threads"]).stdout).unwrap();
    assert!(threads.starts_with("t1  interrupted"), "{threads}");

    // respond: back to write (the second draft), then the gate again; accept ends the run.
    let again = runner(
        d,
        &[
            "resume",
            "--thread",
            "t1",
            "--mock",
            "mock.yaml",
            "--answer",
            r#"{"action": "respond", "feedback": "shorter"}"#,
        ],
    );
    assert_eq!(again.status.code(), Some(3), "{}", stderr(&again));
    assert_eq!(
        json_out(&again)["interrupt"]["payload"]["payload"]["draft"],
        "second draft"
    );
    let answer_file = d.join("accept.json");
    std::fs::write(&answer_file, r#"{"action": "accept"}"#).unwrap();
    let done = runner(
        d,
        &[
            "resume",
            "--thread",
            "t1",
            "--mock",
            "mock.yaml",
            "--answer",
            "@accept.json",
            "--output",
            "yaml",
        ],
    );
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(
        String::from_utf8(done.stdout).unwrap(),
        "draft: second draft\nlog:\n  - write\n  - respond\n  - write\n  - accept\n"
    );

    // history: newest first, one line per checkpoint, with what ran and what changed; the
    // turn's first two checkpoints are the state before its input (waiting for `__start__`,
    // which writes it) and after.
    let history = String::from_utf8(runner(d, &["history", "--thread", "t1"]).stdout).unwrap();
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len(), 6, "{history}");
    assert!(
        lines[0].contains("step    4") && lines[0].contains("ran [review]") && lines[0].contains("next []"),
        "{history}"
    );
    assert!(
        lines[4].contains("step    0") && lines[4].contains("next [write]"),
        "{history}"
    );
    assert!(
        lines[5].contains("step   -1") && lines[5].contains("next [__start__]"),
        "{history}"
    );
    let step0 = lines[3].split_whitespace().next().unwrap().to_string();
    assert!(
        lines[3].contains("step    1") && lines[3].contains("changed [draft, log]"),
        "{history}"
    );

    // The same listings as JSON, for scripts: the checkpoints newest first with their parent
    // links, and the thread with its status.
    let listed = json_out(&runner(d, &["history", "--thread", "t1", "--format", "json"]));
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 6);
    assert_eq!(
        (listed[0]["step"].clone(), listed[0]["ran"].clone()),
        (json!(4), json!(["review"]))
    );
    assert_eq!(listed[3]["checkpoint_id"], json!(step0));
    assert_eq!(listed[0]["parent_id"], listed[1]["checkpoint_id"]);
    assert_eq!(listed[4]["next"], json!(["write"]));
    let threads = json_out(&runner(d, &["threads", "--format", "json"]));
    assert_eq!(threads[0]["thread_id"], "t1");
    assert_eq!(threads[0]["status"], "done");

    // state at the latest and at an earlier checkpoint.
    let state = runner(d, &["state", "--thread", "t1", "--key", "draft"]);
    assert_eq!(json_out(&state), json!("second draft"));
    let earlier = runner(d, &["state", "--thread", "t1", "--checkpoint", &step0]);
    assert_eq!(json_out(&earlier)["log"], json!(["write"]));

    // fork from step 0 with an edited draft: the gate shows the edit; the original is unchanged.
    let fork = runner(
        d,
        &[
            "fork",
            "--thread",
            "t1",
            "--checkpoint",
            &step0,
            "--set",
            "draft=\"edited\"",
            "--new-thread",
            "t2",
        ],
    );
    assert_eq!(fork.status.code(), Some(0), "{}", stderr(&fork));
    assert_eq!(String::from_utf8(fork.stdout).unwrap(), "t2\n");
    let branch = runner(d, &["resume", "--thread", "t2", "--mock", "mock.yaml"]);
    assert_eq!(branch.status.code(), Some(3), "{}", stderr(&branch));
    assert_eq!(json_out(&branch)["interrupt"]["payload"]["payload"]["draft"], "edited");
    assert_eq!(
        json_out(&runner(d, &["state", "--thread", "t1", "--key", "draft"])),
        json!("second draft")
    );
}

#[test]
fn bad_input_and_unknown_config_are_usage_errors() {
    let dir = project();
    let d = dir.path();
    let o = runner(d, &["run", "gate.yaml", "--mock", "mock.yaml", "--db", ":memory:"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("\"topic\" is a required property"),
        "{}",
        stderr(&o)
    );
    let o = runner(
        d,
        &[
            "run",
            "gate.yaml",
            "--mock",
            "mock.yaml",
            "--db",
            ":memory:",
            "--input",
            "topic=x",
            "--set",
            "stlye=x",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("did you mean `style`?"), "{}", stderr(&o));
    let o = runner(d, &["resume", "--thread", "nope"]);
    assert_eq!(o.status.code(), Some(2));
    let o = runner(d, &["run", "missing.yaml"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_failed_run_exits_1_and_names_the_node() {
    let dir = project();
    let d = dir.path();
    std::fs::write(
        d.join("fail.yaml"),
        "replies:\n  write: {error: auth, message: bad key}\n",
    )
    .unwrap();
    let o = runner(d, &["run", "gate.yaml", "--mock", "fail.yaml", "--input", "topic=x"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("node `write` failed: authentication failed: bad key"),
        "{err}"
    );
    assert!(err.contains("runner resume --thread"), "{err}");
}

#[test]
fn ctrl_c_stops_at_a_step_boundary_and_the_thread_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("slow.yaml"),
        r#"
name: slow
models: {default: {provider: mock, model: m}}
state: {n: {type: integer, reducer: sum, default: 0}}
nodes: {tick: {kind: llm, prompt: {text: "tick"}, update: {n: "1"}}}
edges: [START -> tick, {from: tick, route: [{when: "state.n >= 8", to: END}, {to: tick}]}]
"#,
    )
    .unwrap();
    std::fs::write(d.join("mock.yaml"), "replies:\n  tick: {text: ok, delay: 0.2}\n").unwrap();
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(d)
        .args([
            "run",
            "slow.yaml",
            "--mock",
            "mock.yaml",
            "--thread",
            "c1",
            "--db",
            "r.db",
            "--stream",
            "none",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the run did not stop after Ctrl-C");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(d)
        .args(["state", "--thread", "c1", "--db", "r.db", "--key", "n"])
        .output()
        .unwrap();
    let n: i64 = serde_json::from_slice::<Value>(&out.stdout).unwrap().as_i64().unwrap();
    assert!((1..8).contains(&n), "stopped part-way: n = {n}");
    let resumed = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(d)
        .args([
            "resume",
            "--thread",
            "c1",
            "--db",
            "r.db",
            "--mock",
            "mock.yaml",
            "--stream",
            "none",
        ])
        .output()
        .unwrap();
    assert_eq!(resumed.status.code(), Some(0));
    assert_eq!(serde_json::from_slice::<Value>(&resumed.stdout).unwrap()["n"], 8);
}

/// A loop of `STEPS` steps: `text` (no reducer) is rewritten whole and grows by 1 KB a step,
/// `log` (append) gains one item a step, `n` counts.
const GROWING: &str = r#"name: growing
input: {type: object, properties: {steps: {type: integer}}}
state:
  n: {type: integer, default: 0}
  text: {type: string, default: ""}
  log: {type: array, reducer: append, default: []}
nodes:
  grow:
    kind: set
    update: {n: "state.n + 1", text: "state.text ~ ('x' * 1000)", log: "['step ' ~ state.n]"}
edges:
  - START -> grow
  - from: grow
    route:
      - {when: "state.n < input.steps", to: grow}
      - {to: END}
limits: {recursion_limit: 1000}
"#;

/// `--persist exit` commits only the last checkpoint, and only the values it references: the
/// database holds the initial checkpoint and the last one, and two values per key (the
/// default and the last), however many steps ran and however much the value grew on the way.
#[test]
fn persist_exit_stores_only_what_the_last_checkpoint_references() {
    const STEPS: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("growing.yaml"), GROWING).unwrap();
    let steps = format!("steps={STEPS}");
    let run = runner(
        d,
        &[
            "run",
            "growing.yaml",
            "--thread",
            "g",
            "--persist",
            "exit",
            "--input",
            &steps,
        ],
    );
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));

    let store = ::runner::checkpoint::sqlite::SqliteCheckpointer::open(
        &d.join("runner.db"),
        ::runner::checkpoint::Durability::CrashSafe,
    )
    .unwrap();
    let stats = store.stats().unwrap();
    // The turn's two first checkpoints, and the last.
    assert_eq!(stats.checkpoints, 3, "{stats:?}");
    assert_eq!(stats.value_rows, 6, "{stats:?}");
    // Every intermediate `text` stored would be ~STEPS²/2 KB (45 MB); the last one is 300 KB.
    let last_text = STEPS as u64 * 1000;
    assert!(stats.db_bytes < 3 * last_text, "{stats:?}");

    // The stored state is the run's last state, whole, and `state` and `history` read it.
    let state = runner(d, &["state", "--thread", "g", "--key", "log"]);
    assert_eq!(state.status.code(), Some(0), "{}", stderr(&state));
    let log = json_out(&state);
    assert_eq!(log.as_array().map(Vec::len), Some(STEPS));
    assert_eq!(log[STEPS - 1], json!(format!("step {}", STEPS - 1)));
    let text = runner(d, &["state", "--thread", "g", "--key", "text"]);
    assert_eq!(json_out(&text).as_str().map(str::len), Some(STEPS * 1000));
    let history = runner(d, &["history", "--thread", "g"]);
    assert_eq!(String::from_utf8_lossy(&history.stdout).lines().count(), 3);

    // A new turn continues from it (and extends what was stored).
    let more = runner(
        d,
        &[
            "run",
            "growing.yaml",
            "--thread",
            "g",
            "--persist",
            "exit",
            "--input",
            &format!("steps={}", STEPS + 2),
        ],
    );
    assert_eq!(more.status.code(), Some(0), "{}", stderr(&more));
    let log = json_out(&runner(d, &["state", "--thread", "g", "--key", "log"]));
    assert_eq!(log.as_array().map(Vec::len), Some(STEPS + 2));
    assert_eq!(
        json_out(&runner(d, &["state", "--thread", "g", "--key", "n"])),
        json!(STEPS + 2)
    );
}

/// `threads`, `history` and `state` only read: they work on a database another connection is
/// writing to (holding the write lock), and on a read-only file in a read-only folder, and they
/// leave nothing behind (no `-wal`, no `-shm`).
#[test]
fn inspection_opens_the_database_read_only() {
    let dir = project();
    let d = dir.path();
    let run = run_gate(d, "t1", &[]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    let db = d.join("runner.db");
    let inspect = |why: &str| {
        let started = Instant::now();
        let threads = runner(d, &["threads"]);
        assert_eq!(threads.status.code(), Some(0), "{why}: {}", stderr(&threads));
        assert!(
            String::from_utf8_lossy(&threads.stdout).starts_with("t1  interrupted"),
            "{why}"
        );
        let history = runner(d, &["history", "--thread", "t1"]);
        assert_eq!(history.status.code(), Some(0), "{why}: {}", stderr(&history));
        let state = runner(d, &["state", "--thread", "t1", "--key", "draft"]);
        assert_eq!(state.status.code(), Some(0), "{why}: {}", stderr(&state));
        assert_eq!(json_out(&state), json!("first draft"), "{why}");
        // Waiting for the write lock (10 s) is not reading.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{why}: {:?}",
            started.elapsed()
        );
    };

    // Another process holds the write lock.
    let writer = rusqlite::Connection::open(&db).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    inspect("while another connection writes");
    writer.execute_batch("ROLLBACK").unwrap();
    drop(writer);

    // A read-only file in a read-only folder (root ignores the modes; the other checks hold).
    let before = files_in(d);
    set_mode(&db, 0o444);
    set_mode(d, 0o555);
    inspect("read-only file and folder");
    let after = files_in(d);
    set_mode(d, 0o755);
    set_mode(&db, 0o644);
    assert_eq!(after, before);
    // A missing database holds no threads, and looking does not create it.
    let missing = runner(d, &["threads", "--db", "nowhere.db"]);
    assert_eq!(missing.status.code(), Some(0), "{}", stderr(&missing));
    assert!(missing.stdout.is_empty());
    assert!(!d.join("nowhere.db").exists(), "looking created a database");
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A database URL with a scheme runner does not store in is a usage error naming the forms it
/// takes, not a SQLite file under `./mysql:/…`; `sqlite://PATH` is a path.
#[test]
fn a_database_url_runner_does_not_support_is_a_usage_error() {
    let dir = project();
    let d = dir.path();
    for verb in [
        &["run", "gate.yaml", "--mock", "mock.yaml", "--input", "topic=tides"][..],
        &["threads"][..],
        &["state", "--thread", "t1"][..],
    ] {
        let mut args = verb.to_vec();
        args.extend(["--db", "mysql://user:secret@db.example:3306/runs"]);
        let out = runner(d, &args);
        assert_eq!(out.status.code(), Some(2), "{verb:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("`mysql://` databases are not supported"), "{err}");
        assert!(err.contains("sqlite://PATH") && err.contains(":memory:"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }
    assert_eq!(files_in(d), ["gate.yaml", "mock.yaml"], "a file was created");

    let run = run_gate(d, "s", &["--db", "sqlite://runs.db"]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    assert!(d.join("runs.db").is_file());
    let threads = runner(d, &["threads", "--db", "sqlite://runs.db"]);
    assert!(String::from_utf8_lossy(&threads.stdout).starts_with("s  interrupted"));
}

// ---------------------------------------------------------------------------------------------
// One process per thread.

/// A slow step after a gate: whoever holds the thread holds it for a while.
const RACE: &str = r#"
name: race
models: {default: {provider: mock, model: m}}
state: {log: {type: array, reducer: append, default: []}}
nodes:
  gate:
    kind: interrupt
    message: "go?"
    response: {type: object, required: [action], properties: {action: {enum: [accept, reject]}}}
    update: {log: "[output.action]"}
  slow: {kind: llm, prompt: {text: "slow work"}, update: {log: "['slow:' ~ output]"}}
edges: [START -> gate -> slow -> END]
"#;

/// The same slow step, paused before it (no answer needed to continue).
const PAUSED: &str = r#"
name: paused
models: {default: {provider: mock, model: m}}
state: {log: {type: array, reducer: append, default: []}}
nodes:
  slow: {kind: llm, prompt: {text: "slow work"}, update: {log: "['slow:' ~ output]"}, interrupt_before: true}
edges: [START -> slow -> END]
"#;

fn race_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("race.yaml"), RACE).unwrap();
    std::fs::write(dir.path().join("paused.yaml"), PAUSED).unwrap();
    std::fs::write(
        dir.path().join("direct.yaml"),
        PAUSED.replace(", interrupt_before: true", "").replace(
            "state:",
            "input: {type: object, properties: {x: {type: integer}}}\nstate:",
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("mock.yaml"),
        "match:\n  - {contains: \"slow work\", reply: {text: done, delay: 1.0}}\n",
    )
    .unwrap();
    dir
}

/// A runner process whose JSON-lines events are read as they come.
struct Live {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<Value>,
}

impl Live {
    fn start(dir: &Path, args: &[&str]) -> Live {
        let mut child = Command::new(assert_cmd::cargo::cargo_bin("runner"))
            .current_dir(dir)
            .env("RUNNER_DB", dir.join("runner.db"))
            .args(args)
            .args(["--stream", "jsonl"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Live {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits until the process reports an event of this type.
    fn wait_for(&mut self, kind: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let line = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("no `{kind}` event; saw {:?}", self.seen));
            if let Ok(e) = serde_json::from_str::<Value>(&line) {
                let found = e["type"] == kind;
                self.seen.push(e);
                if found {
                    return;
                }
            }
        }
    }

    /// The exit code, stdout, and every stderr line.
    fn finish(self) -> (Option<i32>, String, Vec<String>) {
        let out = self.child.wait_with_output().unwrap();
        let mut lines: Vec<String> = self.seen.iter().map(Value::to_string).collect();
        lines.extend(self.lines.iter());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            lines,
        )
    }
}

fn started(lines: &[String], node: &str) -> usize {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "node_start" && e["node"] == node)
        .count()
}

#[test]
fn a_second_process_on_a_running_thread_is_refused_or_waits_and_runs_nothing_again() {
    let dir = race_project();
    let d = dir.path();
    let first = runner(d, &["run", "paused.yaml", "--mock", "mock.yaml", "--thread", "p1"]);
    assert_eq!(first.status.code(), Some(3), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("continue with `runner resume --thread p1`"),
        "{}",
        stderr(&first)
    );

    // The first resume holds the thread while its model call is under way.
    let mut a = Live::start(d, &["resume", "--thread", "p1", "--mock", "mock.yaml"]);
    a.wait_for("node_start");
    let refused = runner(d, &["resume", "--thread", "p1", "--mock", "mock.yaml"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let pid = a.child.id();
    let message = stderr(&refused);
    assert!(
        message.contains(&format!("thread p1 is running in process {pid} on host ")) && message.contains(" since "),
        "{message}"
    );
    assert!(refused.stdout.is_empty());
    // `run` on the thread is refused the same way, new input or not.
    let run_again = runner(d, &["run", "paused.yaml", "--mock", "mock.yaml", "--thread", "p1"]);
    assert_eq!(run_again.status.code(), Some(2), "{}", stderr(&run_again));
    assert!(stderr(&run_again).contains("thread p1 is running in process"));

    // With --wait the next one waits for the first, then finds nothing left to run.
    let waiter = Live::start(d, &["resume", "--thread", "p1", "--mock", "mock.yaml", "--wait"]);
    let (code_a, out_a, lines_a) = a.finish();
    assert_eq!(code_a, Some(0), "{lines_a:?}");
    let (code_w, out_w, lines_w) = waiter.finish();
    assert_eq!(code_w, Some(0), "{lines_w:?}");
    assert_eq!(started(&lines_a, "slow"), 1);
    assert_eq!(
        started(&lines_w, "slow"),
        0,
        "the waiting process ran nothing again: {lines_w:?}"
    );
    let result: Value = serde_json::from_str(&out_a).unwrap();
    assert_eq!(result["log"], json!(["slow:done"]));
    assert_eq!(serde_json::from_str::<Value>(&out_w).unwrap(), result);
}

#[test]
fn of_two_racing_answers_exactly_one_is_accepted() {
    let dir = race_project();
    let d = dir.path();
    for thread in ["r1", "r2"] {
        let run = runner(d, &["run", "race.yaml", "--mock", "mock.yaml", "--thread", thread]);
        assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    }

    // Started together: one is accepted, the other refused (busy, or already answered).
    let accept = Live::start(
        d,
        &[
            "resume",
            "--thread",
            "r1",
            "--mock",
            "mock.yaml",
            "--answer",
            r#"{"action": "accept"}"#,
        ],
    );
    let reject = Live::start(
        d,
        &[
            "resume",
            "--thread",
            "r1",
            "--mock",
            "mock.yaml",
            "--answer",
            r#"{"action": "reject"}"#,
        ],
    );
    let (code_a, out_a, lines_a) = accept.finish();
    let (code_r, out_r, lines_r) = reject.finish();
    let mut codes = [code_a, code_r];
    codes.sort();
    assert_eq!(codes, [Some(0), Some(2)], "{lines_a:?} {lines_r:?}");
    let (winner, loser) = if code_a == Some(0) {
        (out_a, lines_r)
    } else {
        (out_r, lines_a)
    };
    let loser = loser.join("\n");
    assert!(
        loser.contains("is running in process") || loser.contains("the gate was already answered"),
        "{loser}"
    );
    let log = serde_json::from_str::<Value>(&winner).unwrap()["log"].clone();
    assert!(
        log == json!(["accept", "slow:done"]) || log == json!(["reject", "slow:done"]),
        "{log}"
    );
    let state = runner(d, &["state", "--thread", "r1", "--key", "log"]);
    assert_eq!(json_out(&state), log, "the thread keeps the accepted answer only");

    // In order: while the first answer runs, a second is refused as busy; with --wait it is
    // told the gate was answered.
    let mut first = Live::start(
        d,
        &[
            "resume",
            "--thread",
            "r2",
            "--mock",
            "mock.yaml",
            "--answer",
            r#"{"action": "accept"}"#,
        ],
    );
    first.wait_for("node_start");
    let busy = runner(
        d,
        &[
            "resume",
            "--thread",
            "r2",
            "--mock",
            "mock.yaml",
            "--answer",
            r#"{"action": "reject"}"#,
        ],
    );
    assert_eq!(busy.status.code(), Some(2));
    assert!(
        stderr(&busy).contains("thread r2 is running in process"),
        "{}",
        stderr(&busy)
    );
    let late = Live::start(
        d,
        &[
            "resume",
            "--thread",
            "r2",
            "--mock",
            "mock.yaml",
            "--wait",
            "--answer",
            r#"{"action": "reject"}"#,
        ],
    );
    assert_eq!(first.finish().0, Some(0));
    let (code, out, lines) = late.finish();
    assert_eq!(code, Some(2), "{lines:?}");
    assert!(out.is_empty());
    assert!(lines.join("\n").contains("the gate was already answered"), "{lines:?}");
    let state = runner(d, &["state", "--thread", "r2", "--key", "log"]);
    assert_eq!(json_out(&state), json!(["accept", "slow:done"]));
}

#[test]
fn two_runs_racing_on_a_new_thread_id_one_runs_the_other_is_told_it_is_busy() {
    let dir = race_project();
    let d = dir.path();
    let runs: Vec<Live> = (0..2)
        .map(|_| {
            Live::start(
                d,
                &[
                    "run",
                    "direct.yaml",
                    "--mock",
                    "mock.yaml",
                    "--thread",
                    "new",
                    "--input",
                    "x=1",
                ],
            )
        })
        .collect();
    let results: Vec<_> = runs.into_iter().map(Live::finish).collect();
    let mut codes: Vec<Option<i32>> = results.iter().map(|r| r.0).collect();
    codes.sort();
    assert_eq!(codes, [Some(0), Some(2)], "{results:?}");
    // The loser met the winner's lease: never "does not exist" or "has work pending".
    let loser = results.iter().find(|r| r.0 == Some(2)).unwrap().2.join("\n");
    assert!(loser.contains("thread new is running in process"), "{loser}");
    let winner = results.iter().find(|r| r.0 == Some(0)).unwrap();
    assert_eq!(started(&winner.2, "slow"), 1);
}

/// Two gates waiting in the same superstep.
const TWO_GATES: &str = include_str!("fixtures/two-gates.yaml");

#[test]
fn several_gates_are_listed_and_answered_by_node_or_id() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("two.yaml"), TWO_GATES).unwrap();
    let run = runner(d, &["run", "two.yaml", "--thread", "g"]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    let pending = json_out(&run);
    // Each gate by its task's id and its node.
    let (pa, pb) = (
        runner::engine::task_id("g", "pa", 1, 0, None),
        runner::engine::task_id("g", "pb", 1, 0, None),
    );
    let listed: Vec<(&str, &str)> = pending["interrupts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["task_id"].as_str().unwrap(), i["node"].as_str().unwrap()))
        .collect();
    assert_eq!(listed, [(pa.as_str(), "pa"), (pb.as_str(), "pb")]);
    assert!(stderr(&run).contains("--answer '<gate>=<json>'"), "{}", stderr(&run));

    let bare = runner(d, &["resume", "--thread", "g", "--answer", r#""x""#]);
    assert_eq!(bare.status.code(), Some(2));
    assert!(
        stderr(&bare).contains("waits at 2 gates") && stderr(&bare).contains("`pb`"),
        "{}",
        stderr(&bare)
    );

    // Answered by its id; then by its node, it is already answered.
    let one = runner(d, &["resume", "--thread", "g", "--answer", &format!(r#"{pb}="B""#)]);
    assert_eq!(one.status.code(), Some(3), "{}", stderr(&one));
    assert_eq!(
        json_out(&one)["interrupt"]["task_id"],
        pa.as_str(),
        "the other gate is reported again"
    );
    let again = runner(d, &["resume", "--thread", "g", "--answer", r#"pb="B""#]);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("already answered"), "{}", stderr(&again));
    let done = runner(d, &["resume", "--thread", "g", "--answer", r#""A""#]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(json_out(&done)["log"], json!(["a:A", "b:B"]));
}

#[test]
fn a_thread_whose_run_was_killed_shows_as_cut_off_and_resumes_at_once() {
    let dir = race_project();
    let d = dir.path();
    let first = runner(d, &["run", "paused.yaml", "--mock", "mock.yaml", "--thread", "k1"]);
    assert_eq!(first.status.code(), Some(3), "{}", stderr(&first));
    let mut a = Live::start(
        d,
        &["resume", "--thread", "k1", "--mock", "mock.yaml", "--lease-ttl", "60"],
    );
    a.wait_for("node_start");
    let threads = String::from_utf8(runner(d, &["threads"]).stdout).unwrap();
    assert!(threads.starts_with("k1  running"), "{threads}");
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let threads = String::from_utf8(runner(d, &["threads"]).stdout).unwrap();
    assert!(threads.starts_with("k1  cut-off"), "{threads}");
    // The lease has a minute to run, but its process is gone: no wait, no --force.
    let started = Instant::now();
    let resumed = runner(d, &["resume", "--thread", "k1", "--mock", "mock.yaml"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(json_out(&resumed)["log"], json!(["slow:done"]));
    let threads = String::from_utf8(runner(d, &["threads"]).stdout).unwrap();
    assert!(threads.starts_with("k1  done"), "{threads}");
}

#[test]
fn a_bad_lease_ttl_is_a_usage_error() {
    let dir = race_project();
    let d = dir.path();
    for ttl in ["0", "-1", "nan", "1e300"] {
        let out = runner(d, &["run", "paused.yaml", "--mock", "mock.yaml", "--lease-ttl", ttl]);
        assert_eq!(out.status.code(), Some(2), "{ttl}: {}", stderr(&out));
    }
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(d)
        .env("RUNNER_DB", d.join("runner.db"))
        .env("RUNNER_LEASE_TTL", "soon")
        .args(["run", "paused.yaml", "--mock", "mock.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("RUNNER_LEASE_TTL"), "{}", stderr(&out));
}

#[test]
fn on_a_json_lines_stream_every_line_is_json_the_thread_and_errors_included() {
    let dir = race_project();
    let d = dir.path();
    let all_json = |o: &Output| -> Vec<Value> {
        stderr(o)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
            .collect()
    };
    // Done.
    let done = runner(
        d,
        &[
            "run",
            "direct.yaml",
            "--mock",
            "mock.yaml",
            "--thread",
            "j1",
            "--stream",
            "jsonl",
        ],
    );
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    let events = all_json(&done);
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "run_start" && e["thread_id"] == "j1"),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap()["type"], "run_end", "{events:?}");
    // Interrupted (paused), then a usage error: an answer to a thread that waits for none.
    let paused = runner(
        d,
        &[
            "run",
            "paused.yaml",
            "--mock",
            "mock.yaml",
            "--thread",
            "j2",
            "--stream",
            "jsonl",
        ],
    );
    assert_eq!(paused.status.code(), Some(3));
    all_json(&paused);
    let done_again = runner(d, &["resume", "--thread", "j1", "--answer", "1", "--stream", "jsonl"]);
    assert_eq!(done_again.status.code(), Some(2));
    let events = all_json(&done_again);
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "error" && e["message"].as_str().unwrap().contains("not waiting for an answer")),
        "{events:?}"
    );
    // Failed.
    std::fs::write(
        d.join("bad-mock.yaml"),
        "match:\n  - {contains: \"slow\", reply: {error: auth}}\n",
    )
    .unwrap();
    let failed = runner(
        d,
        &["run", "direct.yaml", "--mock", "bad-mock.yaml", "--stream", "jsonl"],
    );
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    let events = all_json(&failed);
    assert!(events.iter().any(|e| e["type"] == "error"), "{events:?}");
}

/// A model that echoes a secret in a streamed reply, split across tokens: no token event, and
/// no other output, shows any of it.
#[test]
fn a_secret_streamed_across_tokens_never_reaches_the_event_stream() {
    const KEY: &str = "sk-echo-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("echo.yaml"),
        "name: echo\nmodels: {default: {provider: mock, model: m}}\nstate: {said: {type: string, default: \"\"}}\nnodes:\n  say: {kind: llm, prompt: {text: \"say it\"}, stream: true, update: {said: output}}\nedges: [START -> say, say -> END]\n",
    )
    .unwrap();
    std::fs::write(
        d.join("mock.yaml"),
        format!(
            "replies:\n  say: {{text: \"key {KEY} ok\", chunks: [\"key {}\", \"{}\", \" ok\"]}}\n",
            &KEY[..10],
            &KEY[10..]
        ),
    )
    .unwrap();
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(d)
        .env("RUNNER_DB", d.join("runner.db"))
        .env("ECHO_SERVICE_KEY", KEY)
        .args(["run", "echo.yaml", "--mock", "mock.yaml", "--stream", "jsonl"])
        .output()
        .unwrap();
    let events = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{events}");
    let tokens: String = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "token")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tokens, "key [redacted] ok", "{events}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for text in [&events, &stdout.to_string()] {
        assert!(!text.contains(&KEY[..8]), "{text}");
    }
}

#[test]
fn fork_as_a_node_appends_through_the_reducer_and_continues_from_its_edges() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("chat.yaml"),
        r#"name: chat
input: {type: object, properties: {q: {type: string}}}
state:
  messages: {type: array, reducer: add_messages, default: [], from_input: q}
nodes:
  human: {kind: set}
  agent: {kind: set, update: {messages: "[{'role': 'assistant', 'content': 'reply to ' ~ state.messages[-1].content}]"}}
edges: [START -> human -> agent -> END]
"#,
    )
    .unwrap();
    let first = runner(d, &["run", "chat.yaml", "--thread", "c1", "--input", "q=hi"]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let history = String::from_utf8(runner(d, &["history", "--thread", "c1"]).stdout).unwrap();
    let latest = history.split_whitespace().next().unwrap().to_string();
    let contents = |thread: &str| -> Vec<String> {
        let o = runner(d, &["state", "--thread", thread, "--key", "messages"]);
        json_out(&o)
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    let fork = |new: &str, extra: &[&str]| {
        let mut args = vec!["fork", "--thread", "c1", "--checkpoint", &latest, "--new-thread", new];
        args.extend_from_slice(extra);
        runner(d, &args)
    };
    let o = fork("c2", &["--set", "messages=\"more\"", "--as-node", "human"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = runner(d, &["resume", "--thread", "c2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(contents("c2"), ["hi", "reply to hi", "more", "reply to more"]);
    // Without --as-node the value replaces the history outright.
    let o = fork("c3", &["--set", "messages=[]"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(contents("c3").is_empty());
    // An unknown node is refused, and the fork is not left behind.
    let o = fork("c4", &["--set", "messages=\"x\"", "--as-node", "humn"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("did you mean `human`?"), "{}", stderr(&o));
    let threads = String::from_utf8(runner(d, &["threads"]).stdout).unwrap();
    assert!(!threads.contains("c4"), "{threads}");
}

/// A mock script with replies for a node the workflow does not have (a misspelt name, which
/// would leave the real node unscripted) is refused before the run, naming the node.
#[test]
fn a_mock_script_for_a_node_the_workflow_lacks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("w.yaml"),
        "name: w\nmodels: {default: {provider: mock, model: m}}\nstate: {said: {type: string, default: ''}}\nnodes:\n  ask: {kind: llm, prompt: {text: hi}, update: {said: output}}\nedges: [START -> ask, ask -> END]\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("m.yaml"), "replies:\n  aks: hello\n").unwrap();
    let out = assert_cmd::Command::cargo_bin("runner")
        .unwrap()
        .current_dir(dir.path())
        .args(["run", "w.yaml", "--mock", "m.yaml", "--db", ":memory:"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("replies for `aks`") && err.contains("did you mean `ask`?"),
        "{err}"
    );
}

/// Threads are deleted one by one (one that does not exist is refused, nothing deleted) or
/// pruned by age (and status), by `runner threads prune` or its alias `runner db prune`; what a
/// prune deletes is named on stdout.
#[test]
fn threads_are_deleted_and_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("w.yaml"),
        "name: w\nstate: {n: {type: integer, default: 0}}\nnodes:\n  a: {kind: set, update: {n: 1}}\nedges: [START -> a, a -> END]\n",
    )
    .unwrap();
    for t in ["one", "two", "three"] {
        assert_eq!(runner(d, &["run", "w.yaml", "--thread", t]).status.code(), Some(0));
    }
    let ids = |d: &Path| -> Vec<String> {
        let listed = json_out(&runner(d, &["threads", "--format", "json"]));
        let mut ids: Vec<String> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["thread_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(d), ["one", "three", "two"]);
    let refused = runner(d, &["threads", "delete", "one", "nope"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("thread `nope` does not exist"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(ids(d), ["one", "three", "two"], "nothing deleted");
    assert_eq!(runner(d, &["threads", "delete", "one"]).status.code(), Some(0));
    assert_eq!(ids(d), ["three", "two"]);
    // Nothing is a day old; everything is older than nothing.
    let kept = runner(d, &["threads", "prune", "--older-than", "1d"]);
    assert_eq!((kept.status.code(), kept.stdout.len()), (Some(0), 0));
    assert_eq!(
        runner(d, &["threads", "prune", "--older-than", "0s", "--status", "failed"])
            .stdout
            .len(),
        0
    );
    let pruned = runner(d, &["db", "prune", "--older-than", "0s", "--status", "done"]);
    let mut gone: Vec<&str> = std::str::from_utf8(&pruned.stdout).unwrap().lines().collect();
    gone.sort();
    assert_eq!(gone, ["three", "two"]);
    assert!(ids(d).is_empty());
    let bad = runner(d, &["threads", "prune", "--older-than", "soon"]);
    assert_eq!(bad.status.code(), Some(2));
}

/// A gate that declares `inbox`, answered from `runner resume --answer` in the Agent Inbox's
/// shape (a list of one HumanResponse) and in agent-chat-ui's (`{decisions: [...]}`); an answer
/// the gate does not allow is refused and the gate stays open.
#[test]
fn an_inbox_gate_takes_the_inbox_answers_from_resume() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let inbox = GATE.replace(
        "    response: {$ref: \"#/types/Answer\"}\n    update: {log: \"[output.action]\"}",
        "    inbox: {action: publish, args: {draft: state.draft}, allow: [accept, edit, respond]}\n    \
         update: {log: \"[output.action]\", draft: \"output.edit.draft if output.action == 'edit' else state.draft\"}",
    );
    let inbox = inbox.replace(
        "{when: \"output.action == 'accept'\", to: END}",
        "{when: \"output.action in ['accept', 'edit']\", to: END}",
    );
    assert_eq!(
        inbox.matches("output.edit.draft").count() + inbox.matches("'edit']").count(),
        2
    );
    std::fs::write(d.join("gate.yaml"), inbox).unwrap();
    std::fs::write(d.join("mock.yaml"), MOCK).unwrap();
    let run = run_gate(d, "t1", &[]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    let payload = &json_out(&run)["interrupt"]["payload"];
    assert_eq!(
        payload["action_request"],
        json!({"action": "publish", "args": {"draft": "first draft"}})
    );
    assert_eq!(payload["description"], "Publish this draft?");
    assert_eq!(payload["config"]["allow_ignore"], false);
    let resume = |answer: &str| {
        runner(
            d,
            &["resume", "--thread", "t1", "--mock", "mock.yaml", "--answer", answer],
        )
    };
    let refused = resume(r#"[{"type": "ignore", "args": null}]"#);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let again = resume(r#"[{"type": "response", "args": "shorter"}]"#);
    assert_eq!(again.status.code(), Some(3), "{}", stderr(&again));
    let done =
        resume(r#"{"decisions": [{"type": "edit", "edited_action": {"name": "publish", "args": {"draft": "mine"}}}]}"#);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(
        json_out(&done),
        json!({"draft": "mine", "log": ["write", "respond", "write", "edit"]})
    );
}

/// The threads a copy of the database file alone holds (without its `-wal`), as `runner
/// threads` lists them: what a user who copies `runner.db` to back it up gets.
fn threads_in_a_copy_of(db: &Path) -> Vec<String> {
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("copy.db");
    std::fs::copy(db, &copy).unwrap();
    let out = runner(elsewhere.path(), &["threads", "--db", copy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .collect()
}

/// After a command that wrote exits cleanly, the database file alone holds everything (the
/// WAL is folded into it and removed), so a copy of `runner.db` is a backup. Another process
/// that holds the file open is neither waited for nor cut off: the WAL stays for it, and the
/// next command to exit after it closed folds it.
#[test]
fn a_clean_exit_folds_the_wal_into_the_database_file() {
    let dir = project();
    let d = dir.path();
    let db = d.join("runner.db");
    let wal = d.join("runner.db-wal");
    let run = run_gate(d, "t1", &[]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    assert!(!wal.exists(), "run left a WAL: {:?}", files_in(d));
    assert_eq!(threads_in_a_copy_of(&db), ["t1 interrupted"]);
    let resumed = runner(
        d,
        &[
            "resume",
            "--thread",
            "t1",
            "--mock",
            "mock.yaml",
            "--answer",
            r#"{"action": "accept"}"#,
        ],
    );
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert!(!wal.exists(), "resume left a WAL: {:?}", files_in(d));
    assert_eq!(threads_in_a_copy_of(&db), ["t1 done"]);
    let history = runner(d, &["history", "--thread", "t1", "--format", "json"]);
    let first = json_out(&history).as_array().unwrap().last().unwrap()["checkpoint_id"]
        .as_str()
        .unwrap()
        .to_string();
    let fork = runner(
        d,
        &["fork", "--thread", "t1", "--checkpoint", &first, "--new-thread", "t2"],
    );
    assert_eq!(fork.status.code(), Some(0), "{}", stderr(&fork));
    assert!(!wal.exists(), "fork left a WAL: {:?}", files_in(d));
    let ids: Vec<String> = threads_in_a_copy_of(&db)
        .iter()
        .map(|t| t.split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["t2", "t1"]);

    // A reader in another process: the run does not wait for it, and its snapshot holds.
    let reader = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let count =
        |c: &rusqlite::Connection| -> i64 { c.query_row("SELECT count(*) FROM threads", [], |r| r.get(0)).unwrap() };
    reader.execute_batch("BEGIN").unwrap();
    assert_eq!(count(&reader), 2);
    let started = Instant::now();
    let run = run_gate(d, "t3", &[]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(count(&reader), 2, "the reader's snapshot is its own");
    reader.execute_batch("COMMIT").unwrap();
    assert_eq!(count(&reader), 3);
    assert!(wal.exists(), "the WAL stays while another connection has the file open");
    drop(reader);
    let run = run_gate(d, "t4", &[]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    assert!(!wal.exists(), "{:?}", files_in(d));
    assert_eq!(threads_in_a_copy_of(&db).len(), 4);
}

/// `runner serve`'s graceful stop folds the WAL into the database file too.
#[tokio::test]
async fn a_served_database_is_whole_after_a_graceful_stop() {
    let mut s = crate::serve::serve();
    let (status, _, out) = crate::serve::call(
        &s,
        reqwest::Method::POST,
        "/threads/kept/runs/wait",
        Some(json!({"assistant_id": "shout", "input": {"word": "hello"}, "if_not_exists": "create"})),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let dir = s.dir.take().unwrap();
    let (exited, _) = s.term();
    assert!(exited.success(), "{exited:?}");
    assert!(!dir.path().join("runner.db-wal").exists(), "{:?}", files_in(dir.path()));
    let threads = threads_in_a_copy_of(&dir.path().join("runner.db"));
    assert_eq!(threads, ["kept done"]);
}

/// `runner db backup PATH` writes one file holding every commit, those still in the WAL (a
/// reader elsewhere keeps it) included, while another connection holds the write lock; it
/// never replaces a file, a database that keeps nothing has nothing to back up, and a
/// PostgreSQL database is left to PostgreSQL's tools, which the error names.
#[test]
fn db_backup_copies_every_commit_while_the_database_is_in_use() {
    let dir = project();
    let d = dir.path();
    let db = d.join("runner.db");
    let run = run_gate(d, "t1", &[]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    let reader = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    reader
        .query_row("SELECT count(*) FROM threads", [], |r| r.get::<_, i64>(0))
        .unwrap();
    let run = run_gate(d, "t2", &[]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    assert!(d.join("runner.db-wal").exists(), "t2 is in the WAL the reader keeps");
    let writer = rusqlite::Connection::open(&db).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();

    let started = Instant::now();
    let backup = runner(d, &["db", "backup", "copy.db"]);
    assert_eq!(backup.status.code(), Some(0), "{}", stderr(&backup));
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    writer.execute_batch("ROLLBACK").unwrap();
    drop((writer, reader));
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::rename(d.join("copy.db"), elsewhere.path().join("copy.db")).unwrap();
    assert!(
        files_in(elsewhere.path()) == ["copy.db"],
        "{:?}",
        files_in(elsewhere.path())
    );
    let copy = elsewhere.path().join("copy.db");
    let threads = runner(d, &["threads", "--db", copy.to_str().unwrap()]);
    let listed = String::from_utf8_lossy(&threads.stdout);
    assert!(
        listed.contains("t1  interrupted") && listed.contains("t2  interrupted"),
        "{listed}"
    );
    // The copy is a database a run continues from.
    let resumed = runner(
        d,
        &[
            "resume",
            "--db",
            copy.to_str().unwrap(),
            "--thread",
            "t2",
            "--mock",
            "mock.yaml",
            "--answer",
            r#"{"action": "accept"}"#,
        ],
    );
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));

    let again = runner(d, &["db", "backup", copy.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        stderr(&again).contains("exists: a backup never replaces a file"),
        "{}",
        stderr(&again)
    );
    let memory = runner(d, &["db", "backup", "m.db", "--db", ":memory:"]);
    assert_eq!(memory.status.code(), Some(2));
    assert!(
        stderr(&memory).contains("`:memory:` keeps nothing to back up"),
        "{}",
        stderr(&memory)
    );
    assert!(!d.join("m.db").exists());
    // A PostgreSQL database: PostgreSQL's tools, told the schema; the password not repeated.
    let url = "postgres://runner:hunter2@127.0.0.1:1/runs?schema=prod";
    let postgres = runner(d, &["db", "backup", "p.db", "--db", url]);
    assert_eq!(postgres.status.code(), Some(2));
    let said = stderr(&postgres);
    assert!(said.contains("pg_dump --schema=prod"), "{said}");
    assert!(!said.contains("hunter2"), "{said}");
    assert!(!d.join("p.db").exists());
}

/// On a JSON-lines stream each line says which run it is about: a subgraph's lines carry its
/// `ns`, and each `run_end` names its thread as its `run_start` does, so a child's `run_end`
/// (in the middle of the stream: the child ends inside its parent's step) is never taken for
/// the run's. The run's own `run_end` is the last line, after what the CLI says about the run
/// once it is over (here, the requests a replay's cassette lacked).
#[test]
fn on_a_json_lines_stream_a_subgraphs_run_end_names_its_run_and_the_runs_own_is_last() {
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("mindmap.jsonl");
    let cassette = cassette.to_str().unwrap();
    let mindmap = |title: &str, args: &[&str]| -> (Option<i32>, Vec<Value>) {
        let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["run", "workflows/mindmap.yaml", "--db", ":memory:", "--stream", "jsonl"])
            .args(["--input", &format!("document_title={title}")])
            .args([
                "--input",
                "document_content=Heat pumps move heat from outside to inside.",
            ])
            .args(["--input", "max_depth=2"])
            .args(args)
            .output()
            .unwrap();
        let lines = String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
            .collect();
        (out.status.code(), lines)
    };
    let (code, lines) = mindmap(
        "Heat pumps",
        &["--mock", "tests/fixtures/mock/mindmap.yaml", "--record", cassette],
    );
    assert_eq!(code, Some(0), "{lines:#?}");
    let own_thread = lines
        .iter()
        .find(|l| l["type"] == "run_start" && l.get("ns").is_none())
        .unwrap()["thread_id"]
        .clone();
    let ends: Vec<&Value> = lines.iter().filter(|l| l["type"] == "run_end").collect();
    assert!(ends.len() > 1, "the mindmap's expansions are subgraphs: {lines:#?}");
    for end in &ends[..ends.len() - 1] {
        let ns = end["ns"]
            .as_str()
            .unwrap_or_else(|| panic!("a child's run_end has its ns: {end}"));
        let start = lines
            .iter()
            .find(|l| l["type"] == "run_start" && l["ns"] == ns)
            .unwrap();
        assert_eq!(end["thread_id"], start["thread_id"], "{end}");
        assert!(
            end["thread_id"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{}/", own_thread.as_str().unwrap())),
            "{end}"
        );
    }
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "run_end", "{lines:#?}");
    assert!(last.get("ns").is_none(), "{last}");
    assert_eq!(last["thread_id"], own_thread);
    assert_eq!(last["status"], "done");

    // A replay that misses: the run ends (an on_error handler took the miss), the CLI reports
    // the miss, and the run's own run_end still comes last.
    let (code, lines) = mindmap("Heat pumps today", &["--replay", cassette]);
    assert_eq!(code, Some(1), "{lines:#?}");
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "run_end", "{lines:#?}");
    assert!(last.get("ns").is_none(), "{last}");
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "error" && l["message"].as_str().unwrap().contains("were not in the cassette")),
        "{lines:#?}"
    );
}
