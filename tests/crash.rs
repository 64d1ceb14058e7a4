//! Crash safety through the real binary: SIGKILL in the middle of a fan-out step, resume the
//! thread, and prove from both runs' event logs that finished tasks did not run again and that
//! the final state equals an uninterrupted run's.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

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
    let mut first = Vec::new();
    let reader = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    for line in reader.lines() {
        let line = line.unwrap();
        if let Ok(e) = serde_json::from_str::<Value>(&line) {
            first.push(e);
        }
        let finished = tasks(&first, "node_end", None)
            .iter()
            .filter(|t| t.starts_with("work#"))
            .count();
        if finished >= 2 || Instant::now() > deadline {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL on unix
    let status = child.wait().unwrap();
    assert!(!status.success(), "the run was killed, not finished");
    let finished_before: BTreeSet<String> = tasks(&first, "node_end", None)
        .into_iter()
        .filter(|t| t.starts_with("work#"))
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
    let all_work: BTreeSet<String> = (0..6).map(|i| format!("work#{i}")).collect();
    let ran_now: BTreeSet<String> = started_again.into_iter().filter(|t| t.starts_with("work#")).collect();
    assert_eq!(ran_now, all_work.difference(&finished_before).cloned().collect());
    let result: Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(result, expected, "the resumed run ends where an uninterrupted one does");
}
