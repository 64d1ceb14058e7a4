//! Crash safety through the real binary: SIGKILL in the middle of a fan-out step, resume the
//! thread, and prove from both runs' event logs that finished tasks did not run again and that
//! the final state equals an uninterrupted run's. Then the same at dozens of random moments —
//! the process's start, right after the thread is created, the first step, mid fan-out, a
//! subgraph's start, an answered gate — under each persist mode and power-safe durability.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const WORKFLOW: &str = r#"
name: crash
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {items: {type: array}}}
output: [results, total]
state:
  results: {type: array, reducer: append, default: []}
  total: {type: integer, reducer: sum, default: 0}
nodes:
  plan: {kind: set}
  work:
    kind: llm
    prompt: {text: "work on <{{ item }}>"}
    update: {results: "[output]", total: "1"}
  report: {kind: set, update: {total: "100"}}
edges:
  - START -> plan
  - {from: plan, send: {to: work, foreach: input.items}}
  - work -> report
  - report -> END
"#;

/// Item i answers after 0.15 + 0.35·i seconds, so tasks finish one by one.
fn script() -> String {
    let matches: Vec<String> = (0..6)
        .map(|i| {
            format!(
                "  - {{contains: \"<{i}>\", reply: {{text: \"done {i}\", delay: {:.2}}}}}",
                0.15 + 0.35 * i as f64
            )
        })
        .collect();
    format!("match:\n{}\n", matches.join("\n"))
}

fn runner() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("runner"))
}

fn events(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn tasks(events: &[Value], kind: &str, cached: Option<bool>) -> BTreeSet<String> {
    events
        .iter()
        .filter(|e| e["type"] == kind && cached.is_none_or(|c| e["cached"] == c))
        .filter_map(|e| e["task_id"].as_str().map(str::to_string))
        .collect()
}

fn setup(dir: &Path) {
    std::fs::write(dir.join("w.yaml"), WORKFLOW).unwrap();
    std::fs::write(dir.join("mock.yaml"), script()).unwrap();
}

const INPUT: &str = "items=[0,1,2,3,4,5]";

/// The id of `thread`'s fan-out task of `work` for item `i`: `plan` runs in step 1, the
/// items in step 2.
fn work_task(thread: &str, i: usize) -> String {
    runner::engine::task_id(thread, "work", 2, 0, Some(i))
}

#[test]
fn a_killed_run_resumes_without_rerunning_finished_tasks() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let db = dir.path().join("r.db");

    // The reference: the same run, uninterrupted.
    let clean = runner()
        .current_dir(dir.path())
        .args([
            "run",
            "w.yaml",
            "--mock",
            "mock.yaml",
            "--stream",
            "none",
            "--db",
            "clean.db",
            "--input",
            INPUT,
        ])
        .output()
        .unwrap();
    assert!(clean.status.success(), "{}", String::from_utf8_lossy(&clean.stderr));
    let expected: Value = serde_json::from_slice(&clean.stdout).unwrap();
    assert_eq!(expected["total"], 106);

    // Run and kill it once two of the six fan-out tasks have finished.
    let mut child = runner()
        .current_dir(dir.path())
        .args([
            "run",
            "w.yaml",
            "--mock",
            "mock.yaml",
            "--stream",
            "jsonl",
            "--thread",
            "t1",
            "--input",
            INPUT,
        ])
        .arg("--db")
        .arg(&db)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The six fan-out tasks, by id: the same in the resumed run, which goes on with them.
    let all_work: BTreeSet<String> = (0..6).map(|i| work_task("t1", i)).collect();
    let mut first = Vec::new();
    let reader = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    for line in reader.lines() {
        let line = line.unwrap();
        if let Ok(e) = serde_json::from_str::<Value>(&line) {
            first.push(e);
        }
        let finished = tasks(&first, "node_end", None).intersection(&all_work).count();
        if finished >= 2 || Instant::now() > deadline {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL on unix
    let status = child.wait().unwrap();
    assert!(!status.success(), "the run was killed, not finished");
    // The step that ran them named them so.
    let step = first
        .iter()
        .find(|e| e["type"] == "step_start" && e["step"] == 2)
        .expect("the fan-out's step started");
    assert_eq!(
        step["tasks"],
        json!((0..6).map(|i| work_task("t1", i)).collect::<Vec<_>>())
    );
    assert_eq!(
        step["nodes"],
        json!((0..6).map(|i| format!("work#{i}")).collect::<Vec<_>>())
    );
    let finished_before: BTreeSet<String> = tasks(&first, "node_end", None)
        .intersection(&all_work)
        .cloned()
        .collect();
    assert!(
        finished_before.len() >= 2 && finished_before.len() < 6,
        "killed mid-step: {finished_before:?}"
    );

    // Resume: the finished tasks come from their stored writes; only the others run.
    let resumed = runner()
        .current_dir(dir.path())
        .args(["resume", "--thread", "t1", "--mock", "mock.yaml", "--stream", "jsonl"])
        .arg("--db")
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    let second = events(&stderr);
    let started_again = tasks(&second, "node_start", None);
    assert!(
        finished_before.is_disjoint(&started_again),
        "re-ran {:?}",
        finished_before.intersection(&started_again).collect::<Vec<_>>()
    );
    assert_eq!(
        tasks(&second, "node_end", Some(true)),
        finished_before,
        "finished tasks are taken from their stored writes"
    );
    let ran_now: BTreeSet<String> = started_again.intersection(&all_work).cloned().collect();
    assert_eq!(ran_now, all_work.difference(&finished_before).cloned().collect());
    let result: Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(result, expected, "the resumed run ends where an uninterrupted one does");
}

// ---------------------------------------------------------------------------------------------
// Kills at random moments.

const FULL: &str = r#"
name: crash-full
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {items: {type: array}}}
output: [results, total, summary, verdict]
state:
  results: {type: array, reducer: append, default: []}
  total: {type: integer, reducer: sum, default: 0}
  summary: {type: string, default: ""}
  verdict: {type: boolean, default: false}
nodes:
  plan: {kind: llm, prompt: {text: "plan <p>"}, update: {total: "1"}}
  work: {kind: llm, prompt: {text: "work on <{{ item }}>"}, update: {results: "[output]", total: "1"}}
  sub: {kind: subgraph, workflow: child.yaml, input: {n: "state.total"}, update: {summary: output.summary}}
  gate:
    kind: interrupt
    message: "ok?"
    response: {type: object, required: [ok], properties: {ok: {type: boolean}}}
    update: {verdict: output.ok}
  final: {kind: llm, prompt: {text: "final <f>"}, update: {total: "100"}}
edges:
  - START -> plan
  - {from: plan, send: {to: work, foreach: input.items}}
  - work -> sub
  - sub -> gate
  - gate -> final
  - final -> END
"#;

const CHILD: &str = r#"
name: child
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {n: {type: integer}}}
output: [summary]
state:
  summary: {type: string, default: ""}
  steps: {type: array, reducer: append, default: []}
nodes:
  c1: {kind: llm, prompt: {text: "child one <c1>"}, update: {steps: "[output]"}}
  c2: {kind: llm, prompt: {text: "child two <c2>"}, update: {summary: "'n=' ~ input.n ~ ' ' ~ output"}}
edges: [START -> c1 -> c2 -> END]
"#;

const FULL_MOCK: &str = "match:
  - {contains: \"<p>\", reply: {text: planned, delay: 0.04}}
  - {contains: \"<0>\", reply: {text: \"done 0\", delay: 0.02}}
  - {contains: \"<1>\", reply: {text: \"done 1\", delay: 0.04}}
  - {contains: \"<2>\", reply: {text: \"done 2\", delay: 0.06}}
  - {contains: \"<3>\", reply: {text: \"done 3\", delay: 0.08}}
  - {contains: \"<c1>\", reply: {text: one, delay: 0.03}}
  - {contains: \"<c2>\", reply: {text: two, delay: 0.03}}
  - {contains: \"<f>\", reply: {text: fin, delay: 0.04}}
";

const ITEMS: &str = "items=[0,1,2,3]";
const ANSWER: &str = r#"{"ok": true}"#;

/// Where a kill is aimed.
#[derive(Debug, Clone, Copy)]
enum Moment {
    /// Any time from the process's start: before, at or after the thread's creation.
    Start,
    /// During the first step (the thread and its first checkpoint just written).
    FirstStep,
    /// Between the fan-out's tasks finishing.
    FanOut,
    /// As the subgraph starts (its child thread being created).
    SubgraphStart,
    /// During the resume that answers the gate.
    Gate,
}

/// A small xorshift: reproducible with RUNNER_CRASH_SEED.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A runner process whose event lines are read as they come.
struct Proc {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    events: Vec<Value>,
}

impl Proc {
    fn start(dir: &Path, flags: &[&str], args: &[&str]) -> Proc {
        let mut child = runner()
            .current_dir(dir)
            .args(args)
            .args(["--mock", "mock.yaml", "--stream", "jsonl", "--db", "r.db"])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines,
            events: Vec::new(),
        }
    }

    /// Reads events until one matches; false if the process ended first.
    fn until(&mut self, matches: impl Fn(&Value) -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if let Ok(e) = serde_json::from_str::<Value>(&line) {
                let hit = matches(&e);
                self.events.push(e);
                if hit {
                    return true;
                }
            }
        }
        false
    }

    /// SIGKILL, if it is still running; whether it was.
    fn kill(&mut self) -> bool {
        let alive = self.child.try_wait().unwrap().is_none();
        self.child.kill().ok();
        alive
    }

    /// Exit code, stdout, every event, stderr's other lines.
    fn finish(mut self) -> (Option<i32>, String, Vec<Value>, Vec<String>) {
        let out = self.child.wait_with_output().unwrap();
        let mut other = Vec::new();
        for line in self.lines.iter() {
            match serde_json::from_str::<Value>(&line) {
                Ok(e) if e.is_object() => self.events.push(e),
                _ => other.push(line),
            }
        }
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            self.events,
            other,
        )
    }
}

/// A task by its subgraph namespace and id.
fn key(e: &Value) -> (String, String) {
    (
        e["ns"].as_str().unwrap_or_default().to_string(),
        e["task_id"].as_str().unwrap_or_default().to_string(),
    )
}

/// Tasks whose results are stored: `node_end`s that ran and wrote (a gate that stopped wrote
/// nothing and ends again when answered).
fn finished(events: &[Value]) -> BTreeSet<(String, String)> {
    events
        .iter()
        .filter(|e| e["type"] == "node_end" && e["cached"] == false)
        .filter(|e| e["keys"].as_array().is_some_and(|k| !k.is_empty()))
        .map(key)
        .collect()
}

fn started_tasks(events: &[Value]) -> BTreeSet<(String, String)> {
    events.iter().filter(|e| e["type"] == "node_start").map(key).collect()
}

/// One kill at `moment`, then resumes until the thread is done. Returns whether a running
/// process was killed, and the final result.
fn kill_and_recover(dir: &Path, flags: &[&str], thread: &str, moment: Moment, rng: &mut Rng) -> (bool, Value) {
    let run_args = ["run", "w.yaml", "--thread", thread, "--input", ITEMS];
    let mut done: BTreeSet<(String, String)> = BTreeSet::new();
    if let Moment::Gate = moment {
        let (code, _, events, other) = Proc::start(dir, flags, &run_args).finish();
        assert_eq!(code, Some(3), "{other:?}");
        done.extend(finished(&events));
    }
    let mut p = match moment {
        Moment::Gate => Proc::start(dir, flags, &["resume", "--thread", thread, "--answer", ANSWER]),
        _ => Proc::start(dir, flags, &run_args),
    };
    let reached = match moment {
        Moment::Start | Moment::Gate => true,
        Moment::FirstStep => p.until(|e| e["type"] == "run_start"),
        Moment::FanOut => {
            let k = rng.below(4);
            let task = runner::engine::task_id(thread, "work", 2, 0, Some(k as usize));
            p.until(|e| e["type"] == "node_end" && e["task_id"] == task.as_str())
        }
        Moment::SubgraphStart => p.until(|e| e["type"] == "node_start" && e["node"] == "sub"),
    };
    // Every moment comes in a run left alone: one that never came was looked for wrongly, and
    // would quietly spare this kill.
    assert!(reached, "{moment:?} {flags:?}: the moment never came: {:?}", p.events);
    let extra = match moment {
        Moment::Start => rng.below(100),
        Moment::FirstStep => rng.below(50),
        Moment::FanOut => rng.below(15),
        Moment::SubgraphStart => rng.below(40),
        Moment::Gate => rng.below(100),
    };
    std::thread::sleep(Duration::from_millis(extra));
    let killed = reached && p.kill();
    let (_, _, events, _) = p.finish();
    done.extend(finished(&events));

    // Resume (answering the gate when it waits) until done; a thread the kill prevented from
    // existing is run again.
    let mut answer = false;
    for _ in 0..6 {
        let mut args = vec!["resume", "--thread", thread];
        if answer {
            args.extend(["--answer", ANSWER]);
        }
        let (code, stdout, events, other) = Proc::start(dir, flags, &args).finish();
        let (code, stdout, events, other) = if code == Some(2) && other.iter().any(|l| l.contains("does not exist")) {
            Proc::start(dir, flags, &run_args).finish()
        } else {
            (code, stdout, events, other)
        };
        let again: Vec<_> = started_tasks(&events).intersection(&done).cloned().collect();
        assert!(
            again.is_empty(),
            "{moment:?} {flags:?}: finished tasks ran again: {again:?}"
        );
        done.extend(finished(&events));
        match code {
            Some(0) => return (killed, serde_json::from_str(&stdout).unwrap()),
            Some(3) => answer = true,
            other_code => panic!("{moment:?} {flags:?}: resume exited {other_code:?}: {other:?}"),
        }
    }
    panic!("{moment:?} {flags:?}: thread {thread} did not finish");
}

#[test]
fn kills_at_random_moments_never_leave_a_thread_unresumable_or_rerun_a_finished_task() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("w.yaml"), FULL).unwrap();
    std::fs::write(d.join("child.yaml"), CHILD).unwrap();
    std::fs::write(d.join("mock.yaml"), FULL_MOCK).unwrap();
    let seed = std::env::var("RUNNER_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("RUNNER_CRASH_SEED={seed}");

    // The reference: uninterrupted, answered once.
    let (code, _, _, other) = Proc::start(d, &[], &["run", "w.yaml", "--thread", "ref", "--input", ITEMS]).finish();
    assert_eq!(code, Some(3), "{other:?}");
    let (code, stdout, _, other) = Proc::start(d, &[], &["resume", "--thread", "ref", "--answer", ANSWER]).finish();
    assert_eq!(code, Some(0), "{other:?}");
    let expected: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(expected["total"], json!(105));
    assert_eq!(expected["summary"], json!("n=5 two"));

    let configs: [&[&str]; 3] = [
        &["--persist", "sync"],
        &["--persist", "async"],
        &["--persist", "sync", "--durability", "power-safe"],
    ];
    let moments = [
        Moment::Start,
        Moment::FirstStep,
        Moment::FanOut,
        Moment::SubgraphStart,
        Moment::Gate,
    ];
    // One thread per configuration: the three run side by side on one database.
    let kills: usize = std::thread::scope(|s| {
        let handles: Vec<_> = configs
            .iter()
            .enumerate()
            .map(|(c, flags)| {
                let expected = expected.clone();
                s.spawn(move || {
                    let mut rng = Rng(seed.wrapping_add((c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
                    let mut kills = 0;
                    for round in 0..3 {
                        for (m, moment) in moments.iter().enumerate() {
                            let thread = format!("c{c}-r{round}-m{m}");
                            let (killed, result) = kill_and_recover(d, flags, &thread, *moment, &mut rng);
                            assert_eq!(result, expected, "{moment:?} {flags:?} (seed {seed})");
                            kills += usize::from(killed);
                        }
                    }
                    kills
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    eprintln!("{kills} kills hit a running process");
    assert!(
        kills >= 30,
        "only {kills} of 45 kills hit a running process (seed {seed})"
    );
}
