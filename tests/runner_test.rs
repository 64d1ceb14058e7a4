//! `runner test` through the real binary: the shipped workflows' test files pass, and the
//! runner reports failures, JUnit, bad test files and interrupts as documented in
//! docs/testing.md.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A workflow with a human gate: write, then ask; `respond` loops back to write.
const GATE: &str = include_str!("fixtures/gate.yaml");

const MOCK: &str = r#"
    mock:
      match:
        - {contains: "(version 0)", reply: first draft}
        - {contains: "(version 2)", reply: second draft}
"#;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn runner(dir: &Path, args: &[&str]) -> Run {
    let out: Output = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir)
        // The research case replays a cassette recorded at SearxNG's default address.
        .env_remove("SEARXNG_URL")
        .args(args)
        .output()
        .expect("the runner binary starts");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A temp dir holding gate.yaml and `gate.test.yaml` with `cases`.
fn suite(cases: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gate.yaml"), GATE).unwrap();
    std::fs::write(
        dir.path().join("gate.test.yaml"),
        format!("workflow: gate.yaml\ncases:\n{cases}"),
    )
    .unwrap();
    dir
}

#[test]
fn the_shipped_workflows_pass_their_tests() {
    let r = runner(Path::new(ROOT), &["test", "workflows/"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let last = r.stdout.lines().last().unwrap_or_default();
    let (passed, rest) = last.split_once(" passed, ").expect("a summary line");
    assert!(passed.parse::<u32>().unwrap() >= 15, "{last}");
    assert_eq!(rest, "0 failed");
    for file in [
        "mindmap",
        "rag",
        "research",
        "slides",
        "deep-research/report",
        "handoff",
    ] {
        assert!(
            r.stdout.contains(&format!("workflows/{file}.test.yaml")),
            "{}",
            r.stdout
        );
    }
}

#[test]
fn interrupts_are_answered_in_order_and_the_run_resumes() {
    let dir = suite(&format!(
        r#"
  - name: accepted after one revision
    input: {{topic: heat pumps}}
    answers: [{{action: respond}}, {{action: accept}}]
{MOCK}
    expect:
      status: done
      output: {{draft: second draft, log: [write, respond, write, accept]}}
      visits: {{write: 2}}
      events: [{{type: interrupt, node: review, count: 2}}]
  - name: waits at the gate without an answer
    input: {{topic: heat pumps}}
{MOCK}
    expect:
      status: interrupted
      interrupt: {{node: review, payload: {{message: Publish this draft?, payload: {{draft: first draft}}}}}}
      path: [write, review]
"#
    ));
    let r = runner(dir.path(), &["test", "."]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.ends_with("\n2 passed, 0 failed\n"), "{}", r.stdout);
}

#[test]
fn a_failing_case_exits_1_with_a_diff_of_what_differs() {
    let dir = suite(&format!(
        r#"
  - name: wrong draft
    input: {{topic: heat pumps}}
    answers: [{{action: accept}}]
{MOCK}
    expect:
      output: {{draft: a better draft}}
      path: [write, review, write]
      not_visited: [write]
  - name: unused answers
    input: {{topic: heat pumps}}
    answers: [{{action: accept}}, {{action: accept}}]
{MOCK}
    expect: {{status: done}}
  - name: a typo in a node name
    input: {{topic: heat pumps}}
{MOCK}
    expect: {{not_visited: [reveiw]}}
  - name: right draft
    input: {{topic: heat pumps}}
    answers: [{{action: accept}}]
{MOCK}
    expect: {{output: {{draft: first draft}}}}
"#
    ));
    let r = runner(dir.path(), &["test"]);
    // No argument means workflows/, which this directory does not have.
    assert_eq!(r.code, 2, "{}", r.stderr);
    let r = runner(dir.path(), &["test", "gate.test.yaml"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("  FAILED  wrong draft  ("), "{}", r.stdout);
    assert!(r.stdout.contains("  ok      right draft  ("), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("output.draft: expected \"a better draft\", got \"first draft\""),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("path: expected [write, review, write]"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("not_visited: `write` ran"), "{}", r.stdout);
    assert!(r.stdout.contains("answers: 1 of 2 were not used"), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("not_visited: `reveiw` is not a node of the workflow; did you mean `review`?"),
        "{}",
        r.stdout
    );
    assert_eq!(r.stdout.lines().last(), Some("1 passed, 3 failed"));

    let r = runner(dir.path(), &["test", ".", "--filter", "right"]);
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert!(r.stdout.ends_with("\n1 passed, 0 failed\n"), "{}", r.stdout);
}

#[test]
fn junit_reports_every_case_and_its_failure() {
    let dir = suite(&format!(
        r#"
  - name: "fails <here>"
    input: {{topic: heat pumps}}
{MOCK}
    expect: {{status: done}}
  - name: passes
    input: {{topic: heat pumps}}
{MOCK}
    expect: {{status: interrupted}}
"#
    ));
    let r = runner(dir.path(), &["test", ".", "--format", "junit"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let x = &r.stdout;
    assert!(
        x.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites "),
        "{x}"
    );
    assert!(
        x.contains("<testsuite name=\"./gate.test.yaml\" tests=\"2\" failures=\"1\""),
        "{x}"
    );
    assert!(x.contains("<testcase name=\"fails &lt;here&gt;\""), "{x}");
    assert!(
        x.contains("<failure message=\"status: expected done, got interrupted\">"),
        "{x}"
    );
    assert!(
        x.contains("<testcase name=\"passes\" classname=\"./gate.test.yaml\""),
        "{x}"
    );
    assert_eq!(x.matches("<testcase ").count(), 2);
    assert_eq!(x.matches("</failure>").count(), 1);
    assert!(x.trim_end().ends_with("</testsuites>"), "{x}");
}

/// `--format github`: the human report, then one `::error` annotation per failing case, at the
/// line the case starts on, its failures joined with escaped newlines.
#[test]
fn github_annotations_point_at_failing_cases() {
    let dir = suite(&format!(
        r#"
  - name: passes
    input: {{topic: heat pumps}}
{MOCK}
    expect: {{status: interrupted}}
  - name: "fails, here"
    input: {{topic: heat pumps}}
{MOCK}
    expect: {{status: done}}
"#
    ));
    let r = runner(dir.path(), &["test", ".", "--format", "github"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.contains("1 passed, 1 failed"), "{}", r.stdout);
    let annotations: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("::error ")).collect();
    assert_eq!(annotations.len(), 1, "{}", r.stdout);
    let text = std::fs::read_to_string(dir.path().join("gate.test.yaml")).unwrap();
    let line = text.lines().position(|l| l.contains("fails, here")).unwrap() + 1;
    assert_eq!(
        annotations[0],
        format!(
            "::error file=./gate.test.yaml,line={line},title=runner test%3A fails%2C here::status: expected done, got interrupted"
        )
    );
}

#[test]
fn a_bad_test_file_is_refused_with_positions_before_anything_runs() {
    let dir = suite(
        r#"
  - name: typo
    input: {topic: heat pumps}
    expct: {status: done}
  - name: typo
    mock: {replies: {write: x}}
    mock_file: nowhere.yaml
    expect: {status: finished, path: write, colour: red}
"#,
    );
    let r = runner(dir.path(), &["test", "."]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.is_empty(), "nothing runs: {}", r.stdout);
    for needle in [
        "gate.test.yaml:6:5: unknown field `expct` in a case; did you mean `expect`?",
        "gate.test.yaml:4:5: a case needs `expect`",
        "gate.test.yaml:7:5: two cases are named `typo`",
        "a case takes one of `mock`, `mock_file` and `cassette`, not `mock` and `mock_file`",
        "`status` is one of done, interrupted, failed",
        "`path` is a list of node names",
        "unknown field `colour` in `expect`",
    ] {
        assert!(r.stderr.contains(needle), "missing {needle:?} in:\n{}", r.stderr);
    }

    std::fs::write(dir.path().join("gate.test.yaml"), "workflow: missing.yaml\ncases: []\n").unwrap();
    let r = runner(dir.path(), &["test", "gate.test.yaml"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("gate.test.yaml:1:1: the workflow"), "{}", r.stderr);
    assert!(r.stderr.contains("`cases` is a non-empty list"), "{}", r.stderr);
}

#[test]
fn a_case_fails_on_a_request_its_cassette_lacks_even_when_on_error_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let cassette = Path::new(ROOT).join("tests/fixtures/cassettes/mindmap.jsonl");
    std::fs::write(
        dir.path().join("mindmap.test.yaml"),
        format!(
            "workflow: {}\ncases:\n  - name: another title\n    input: {{document_title: Heat, document_content: x}}\n    cassette: {}\n    expect: {{status: done}}\n",
            Path::new(ROOT).join("workflows/mindmap.yaml").display(),
            cassette.display()
        ),
    )
    .unwrap();
    let r = runner(dir.path(), &["test", "."]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("cassette: the cassette ")
            && r.stdout
                .contains("the closest recorded is entry 1 (node `analyze_document`)"),
        "{}",
        r.stdout
    );
}

#[test]
fn validate_skips_test_files_beside_workflows() {
    let dir = suite("  - {name: a, expect: {status: interrupted}}\n");
    let r = runner(dir.path(), &["validate", "."]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(r.stdout.trim_end(), "1 file valid");
}

/// Two gates waiting in the same superstep.
const TWO_GATES: &str = include_str!("fixtures/two-gates.yaml");

#[test]
fn answers_take_several_waiting_gates_in_the_order_reported() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("two.yaml"), TWO_GATES).unwrap();
    std::fs::write(
        dir.path().join("two.test.yaml"),
        r#"workflow: two.yaml
cases:
  - name: both gates answered
    answers: ["A", "B"]
    expect:
      status: done
      state: {log: ["a:A", "b:B"]}
"#,
    )
    .unwrap();
    let r = runner(dir.path(), &["test", "."]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

/// Every shipped test file and mock script names its JSON Schema (for editors) and is valid
/// against it; a schema that drifts from what `runner test` accepts fails here or in the unit
/// tests beside the readers.
#[test]
fn the_shipped_test_files_and_mock_scripts_match_their_schemas() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let schema = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(root.join("schemas").join(name)).unwrap()).unwrap()
    };
    let (mut test_schema, mock_schema) = (schema("test.schema.json"), schema("mock.schema.json"));
    // The test schema refers to the mock schema beside it; embedded (it has its own `$id`), the
    // reference needs no retrieval.
    let mock = &mut test_schema["$defs"]["case"]["properties"]["mock"];
    assert_eq!(mock["$ref"], "mock.schema.json");
    *mock = mock_schema.clone();
    let tests = jsonschema::validator_for(&test_schema).unwrap();
    let mocks = jsonschema::validator_for(&mock_schema).unwrap();
    let mut files = Vec::new();
    let mut stack = vec![root.join("workflows"), root.join("tests/fixtures/mock")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".test.yaml") || p.starts_with(root.join("tests/fixtures/mock")) {
                files.push(p);
            }
        }
    }
    files.push(root.join("tests/fixtures/serve/mock.yaml"));
    assert!(files.len() > 20, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let is_test = file.to_string_lossy().ends_with(".test.yaml");
        let name = if is_test {
            "test.schema.json"
        } else {
            "mock.schema.json"
        };
        let modeline = text.lines().next().unwrap_or_default();
        assert!(
            modeline.starts_with("# yaml-language-server: $schema=") && modeline.ends_with(name),
            "{}: the first line names schemas/{name}",
            file.display()
        );
        let doc = runner::spec::load::parse(runner::spec::load::read(&file).unwrap()).unwrap();
        let validator = if is_test { &tests } else { &mocks };
        let errors: Vec<String> = validator
            .iter_errors(&doc.value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:#?}", file.display());
    }
    // The schemas refuse what runner refuses.
    assert!(!mocks.is_valid(&serde_json::json!({"replies": {"a": {"txt": "typo"}}})));
    assert!(
        !tests.is_valid(
            &serde_json::json!({"workflow": "w.yaml", "cases": [{"name": "x", "expect": {"stauts": "done"}}]})
        )
    );
}

/// `--update` rewrites what failing cases expect to what they did: block entries in place, a
/// missing `status` added, a flow `expect` whole, a subset kept to the keys it names; comments
/// and passing cases stay as written, and the file then passes.
#[test]
fn update_accepts_what_failing_cases_did() {
    let dir = suite(&format!(
        r#"
  # Stays as written.
  - name: passes
    input: {{topic: heat pumps}}
    answers: [{{action: accept}}]
{MOCK}
    expect:
      status: done
  - name: block
    input: {{topic: heat pumps}}
    answers: [{{action: accept}}]
{MOCK}
    expect:
      output:
        draft: an old draft   # a comment in the value goes with it
        log: [write]
      path: [write]

  - name: flow
    input: {{topic: heat pumps}}
{MOCK}
    expect: {{status: done, output: {{draft: x}}}}
"#
    ));
    let r = runner(dir.path(), &["test", ".", "--update"]);
    assert_eq!(
        r.code, 1,
        "the run that updates still reports the failures: {}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains("updated ./gate.test.yaml: 4 expectation(s) of 2 case(s)"),
        "{}",
        r.stderr
    );
    let text = std::fs::read_to_string(dir.path().join("gate.test.yaml")).unwrap();
    assert!(text.contains("  # Stays as written.\n  - name: passes"), "{text}");
    assert!(
        text.contains(
            "    expect:\n      output: {\"draft\":\"first draft\",\"log\":[\"write\",\"accept\"]}\n      path: [\"write\",\"review\",\"review\"]\n\n  - name: flow"
        ),
        "{text}"
    );
    assert!(
        text.contains("    expect: {\"status\":\"interrupted\",\"output\":{\"draft\":\"first draft\"}}\n"),
        "{text}"
    );
    let r = runner(dir.path(), &["test", "."]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.ends_with("\n3 passed, 0 failed\n"), "{}", r.stdout);
}
