//! `--record` and `--replay` through the real binary: a recorded run replays to the same result
//! with no mock script, a changed request fails naming the closest recorded one, and secrets
//! never reach the file.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The text of every streamed token event on stderr (`--stream jsonl`).
    fn tokens(&self) -> Vec<String> {
        self.stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["type"] == "token")
            .map(|e| e["text"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

fn runner(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(ROOT)
        .args(args)
        .args(["--db", ":memory:"])
        .envs(env.iter().copied())
        .output()
        .expect("the runner binary starts");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn mindmap(title: &str, models: &[&str], env: &[(&str, &str)]) -> Run {
    let title = format!("document_title={title}");
    let mut args = vec![
        "run",
        "workflows/mindmap.yaml",
        "--input",
        &title,
        "--input",
        "document_content=Heat pumps move heat from outside to inside.",
        "--input",
        "max_depth=2",
    ];
    args.extend(models);
    runner(&args, env)
}

fn cassette(dir: &Path) -> String {
    dir.join("run.jsonl").display().to_string()
}

#[test]
fn a_recorded_run_replays_to_the_same_result_without_its_mock() {
    let dir = tempfile::tempdir().unwrap();
    let c = cassette(dir.path());
    let mock = ["--mock", "tests/fixtures/mock/mindmap.yaml"];
    let recorded = mindmap("Heat pumps", &[&mock[..], &["--record", &c]].concat(), &[]);
    assert_eq!(recorded.code, 0, "{}", recorded.stderr);
    let text = std::fs::read_to_string(&c).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["cassette"], "runner", "a header line first");
    // analyze, root, one expansion of the root, two of its children.
    assert_eq!(lines.len(), 1 + 5, "{text}");
    assert!(lines[1..].iter().all(|l| l["kind"] == "llm"));
    assert_eq!(lines[1]["request"]["node"], "analyze_document");

    let replayed = mindmap("Heat pumps", &["--replay", &c], &[]);
    assert_eq!(replayed.code, 0, "{}", replayed.stderr);
    assert_eq!(replayed.stdout, recorded.stdout);
    assert!(replayed.stdout.contains("\"root.2.1\""), "{}", replayed.stdout);
}

#[test]
fn a_changed_prompt_fails_naming_the_closest_recorded_request() {
    let dir = tempfile::tempdir().unwrap();
    let c = cassette(dir.path());
    let mock = ["--mock", "tests/fixtures/mock/mindmap.yaml"];
    assert_eq!(
        mindmap("Heat pumps", &[&mock[..], &["--record", &c]].concat(), &[]).code,
        0
    );
    // The analysis has an on_error handler, so the run itself ends; the miss still fails it.
    let r = mindmap("Heat pumps today", &["--replay", &c], &[]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("holds no llm request like this one from node `analyze_document`"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(
            "the closest recorded is entry 1 (node `analyze_document`), which differs first at `/messages/1/content`"
        ),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("Title: Heat pumps today"),
        "the asked request is shown: {}",
        r.stderr
    );
    assert!(
        r.stderr.contains("1 request(s) were not in the cassette"),
        "{}",
        r.stderr
    );
}

#[test]
fn secrets_are_scrubbed_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let c = cassette(dir.path());
    let secret = "sk-live-7f3a9c0d41";
    let env = [("RUNNER_TEST_API_KEY", secret), ("DB_PASSWORD", "hunter2-pw")];
    let title = format!("Heat pumps {secret} hunter2-pw");
    let mock = ["--mock", "tests/fixtures/mock/mindmap.yaml"];
    let r = mindmap(&title, &[&mock[..], &["--record", &c]].concat(), &env);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let text = std::fs::read_to_string(&c).unwrap();
    assert!(!text.contains(secret) && !text.contains("hunter2-pw"), "{text}");
    assert!(text.contains("Title: Heat pumps [redacted] [redacted]"), "{text}");
    // Requests are scrubbed the same way on replay, so the cassette still serves the run.
    let replayed = mindmap(&title, &["--replay", &c], &env);
    assert_eq!(replayed.code, 0, "{}", replayed.stderr);
}

#[test]
fn streamed_replies_and_failures_replay_as_they_were_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let c = cassette(dir.path());
    // Both runs on a thread of one name (each in a database of its own): the ids of the
    // messages a run adds come from its thread's tasks, so the same thread gives the same.
    let rag = |models: &[&str]| {
        let args = [
            &[
                "run",
                "workflows/rag.yaml",
                "--thread",
                "chat",
                "--input",
                "question=Hello!",
                "--stream",
                "jsonl",
            ][..],
            models,
        ]
        .concat();
        runner(&args, &[])
    };
    let recorded = rag(&["--mock", "tests/fixtures/mock/rag-chat.yaml", "--record", &c]);
    assert_eq!(recorded.code, 0, "{}", recorded.stderr);
    let replayed = rag(&["--replay", &c]);
    assert_eq!(replayed.code, 0, "{}", replayed.stderr);
    assert_eq!(
        replayed.tokens(),
        ["Hello! ", "How can I help ", "with your documents today?"]
    );
    assert_eq!(replayed.stdout, recorded.stdout);

    // A recorded auth failure comes back as the same typed error (the plan's on_error records
    // its class and message).
    let research = |models: &[&str]| {
        let args = [
            &[
                "run",
                "workflows/research.yaml",
                "--input",
                "query=How do heat pumps work?",
            ][..],
            models,
        ]
        .concat();
        runner(&args, &[])
    };
    let recorded = research(&["--mock", "tests/fixtures/mock/research-plan-error.yaml", "--record", &c]);
    assert_eq!(recorded.code, 0, "{}", recorded.stderr);
    let replayed = research(&["--replay", &c]);
    assert_eq!(replayed.code, 0, "{}", replayed.stderr);
    // The same result but for when the error happened: a replay has its own clock.
    let undated = |stdout: &str| {
        let mut v: Value = serde_json::from_str(stdout).unwrap();
        for e in v["errors"].as_array_mut().unwrap() {
            assert!(e["at"].is_string(), "{e}");
            e["at"] = Value::Null;
        }
        v
    };
    assert_eq!(undated(&replayed.stdout), undated(&recorded.stdout));
    assert!(replayed.stdout.contains("\"class\": \"auth\""), "{}", replayed.stdout);
}

#[test]
fn the_offline_demo_in_the_readme_runs() {
    let r = runner(
        &[
            "run",
            "workflows/mindmap.yaml",
            "--replay",
            "tests/fixtures/cassettes/mindmap.jsonl",
            "--input",
            "document_title=Heat pumps",
            "--input",
            "document_content=@tests/fixtures/cassettes/mindmap-document.txt",
            "--input",
            "max_depth=2",
        ],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(out["nodes"].as_object().map(|n| n.len()), Some(5));
}

#[test]
fn a_missing_or_foreign_cassette_is_a_usage_error() {
    let r = mindmap("Heat pumps", &["--replay", "no/such.jsonl"], &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("no/such.jsonl"), "{}", r.stderr);
    let r = mindmap("Heat pumps", &["--replay", "workflows/mindmap.yaml"], &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("line 1: not JSON"), "{}", r.stderr);
    let r = mindmap(
        "Heat pumps",
        &["--replay", "a.jsonl", "--mock", "tests/fixtures/mock/mindmap.yaml"],
        &[],
    );
    assert_eq!(r.code, 2, "--replay and --mock exclude each other: {}", r.stderr);
}
