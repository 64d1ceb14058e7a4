//! The bad-input corpus, run through the real `runner validate`.
//!
//! Every workflow in tests/fixtures/invalid/ has one defect. Its first line names the
//! diagnostic that defect must produce and the line it must point at:
//!
//!     # expect: E201 line 9
//!
//! A defect in another file (a prompt template) names that file, relative to the fixtures:
//!
//!     # expect: E302 line 4 in prompts/E302-typo.j2
//!
//! Files that cannot hold that comment (the empty file, a UTF-16 file) are listed in
//! [`TABLE`]. Each fixture runs with the fixture directory as the working directory and a
//! relative path, so outputs hold no temp paths; its human output is snapshotted per file.
//! Support files live in `prompts/` and `support/` beside the fixtures.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use runner::diag::Code;
use serde_json::Value;

/// Expectations of fixtures that cannot start with an `# expect:` comment.
const TABLE: &[(&str, &str, u32)] = &[("E003-empty.yaml", "E003", 1), ("E002-utf16-bom.yaml", "E002", 1)];

/// Codes whose fixtures are made by the tests themselves (see `unreadable_file_is_e001` and
/// `oversized_files_are_e004`): nothing committed can be unreadable or 4 MiB large.
const MADE_IN_TESTS: &[&str] = &["E001", "E004"];

/// Fixtures whose expectation src/ does not meet yet, with what it reports instead. The
/// corpus test checks that each still fails as described, so a fix forces an update here.
const KNOWN_WRONG: &[(&str, &str)] = &[];

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid")
}

/// The fixture files, sorted (support files in subdirectories are not fixtures).
fn fixtures() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir())
        .expect("the fixture directory exists")
        .map(|e| {
            e.expect("a readable directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

/// What a fixture expects: its code and the line the diagnostic must point at.
fn expectation(name: &str) -> (String, u32) {
    let (code, line, _) = expected_at(name);
    (code, line)
}

/// What a fixture expects, with the file the diagnostic must point into.
fn expected_at(name: &str) -> (String, u32, String) {
    if let Some((_, code, line)) = TABLE.iter().find(|(n, _, _)| *n == name) {
        return (code.to_string(), *line, name.to_string());
    }
    let bytes = std::fs::read(fixtures_dir().join(name)).expect("the fixture is readable");
    let first = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    let first = String::from_utf8_lossy(first);
    let parsed = first.trim_end().strip_prefix("# expect: ").and_then(|rest| {
        let (code, at) = rest.split_once(" line ")?;
        let (line, file) = at.split_once(" in ").unwrap_or((at, name));
        Some((code.to_string(), line.parse().ok()?, file.to_string()))
    });
    let Some((code, line, file)) = parsed else {
        panic!("{name}: the first line must be `# expect: CODE line N` (or the file must be in TABLE), not {first:?}");
    };
    assert!(
        name.starts_with(&format!("{code}-")),
        "{name}: the file name must start with its code {code}"
    );
    (code, line, file)
}

/// Warnings fail validation only with `--deny-warnings`.
fn is_warning(code: &str) -> bool {
    code.starts_with('W')
}

/// Runs `runner validate` in `dir` with `args`; returns (exit code, stdout).
fn validate(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::cargo_bin("runner")
        .expect("the runner binary is built")
        .current_dir(dir)
        .arg("validate")
        .args(args)
        .output()
        .expect("runner runs");
    let code = out.status.code().expect("runner exits normally, not by a signal");
    (code, String::from_utf8(out.stdout).expect("runner prints UTF-8"))
}

/// Runs a fixture as the corpus does: `--deny-warnings` for warning fixtures.
fn run_fixture(name: &str, format: &str) -> (i32, String) {
    let (code, _) = expectation(name);
    let mut args = vec![name, "--format", format];
    if is_warning(&code) {
        args.push("--deny-warnings");
    }
    validate(&fixtures_dir(), &args)
}

fn diagnostics(json: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("--format json prints JSON ({e}): {json}"));
    v["diagnostics"].as_array().expect("`diagnostics` is an array").clone()
}

#[test]
fn every_fixture_reports_its_defect_at_its_line() {
    let mut failures = Vec::new();
    let names = fixtures();
    assert!(
        names.len() >= 60,
        "the corpus has {} fixtures; keep at least 60",
        names.len()
    );
    for name in &names {
        let (code, line, file) = expected_at(name);
        let (exit, out) = run_fixture(name, "json");
        let diags = diagnostics(&out);
        let found = diags
            .iter()
            .any(|d| d["code"] == code.as_str() && d["line"] == line && d["file"] == file.as_str());
        let got: Vec<String> = diags
            .iter()
            .map(|d| {
                format!(
                    "{} at {}:{}",
                    d["code"].as_str().unwrap_or("?"),
                    d["file"].as_str().unwrap_or("?"),
                    d["line"]
                )
            })
            .collect();
        if exit != 1 {
            failures.push(format!("{name}: exit code {exit}, expected 1"));
        }
        for d in &diags {
            let file = d["file"].as_str().unwrap_or_default();
            if Path::new(file).is_absolute() || file.is_empty() {
                failures.push(format!(
                    "{name}: diagnostic {} names file {file:?}, not the relative path given",
                    d["code"]
                ));
            }
        }
        match KNOWN_WRONG.iter().find(|(n, _)| n == name) {
            Some(_) if found => failures.push(format!(
                "{name}: now reports {code} at line {line}; remove it from KNOWN_WRONG"
            )),
            Some(_) => {}
            None if !found => failures.push(format!("{name}: expected {code} at {file}:{line}, got {got:?}")),
            None => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} problems:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn human_output_of_every_fixture() {
    let dir = fixtures_dir();
    // Prompt paths are resolved from the canonical workflow path and appear absolute.
    let abs = std::fs::canonicalize(&dir).expect("the fixture directory exists");
    insta::glob!("fixtures/invalid/*.yaml", |path| {
        let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
        let (_, out) = run_fixture(&name, "human");
        let out = out.replace(&*abs.to_string_lossy(), "[FIXTURES]");
        // Named without the module path, which depends on how the tests are linked, so that
        // the snapshots keep their names: `invalid__human_output_of_every_fixture@<file>`.
        let mut settings = insta::Settings::clone_current();
        settings.set_prepend_module_to_snapshot(false);
        settings.bind(|| insta::assert_snapshot!("invalid__human_output_of_every_fixture", out));
    });
}

#[test]
fn warnings_alone_pass_without_deny_warnings() {
    let warning_fixtures: Vec<String> = fixtures()
        .into_iter()
        .filter(|n| is_warning(&expectation(n).0))
        .collect();
    assert!(!warning_fixtures.is_empty());
    for name in warning_fixtures {
        let (code, line) = expectation(&name);
        let (exit, out) = validate(&fixtures_dir(), &[&name, "--format", "json"]);
        assert_eq!(
            exit, 0,
            "{name} has only warnings, so it passes without --deny-warnings: {out}"
        );
        let diags = diagnostics(&out);
        assert!(
            diags.iter().all(|d| d["severity"] == "warning"),
            "{name} must be otherwise valid: {out}"
        );
        assert!(
            diags.iter().any(|d| d["code"] == code.as_str() && d["line"] == line),
            "{name}: {out}"
        );
    }
}

#[test]
fn every_code_has_a_fixture() {
    let mut covered: BTreeSet<String> = fixtures().iter().map(|n| expectation(n).0).collect();
    covered.extend(MADE_IN_TESTS.iter().map(|c| c.to_string()));
    let missing: Vec<&str> = Code::ALL
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !covered.contains(*c))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a fixture in tests/fixtures/invalid/: {missing:?}"
    );
    let known: BTreeSet<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
    let stale: Vec<&String> = covered.iter().filter(|c| !known.contains(c.as_str())).collect();
    assert!(stale.is_empty(), "fixtures expect codes that do not exist: {stale:?}");
}

#[test]
fn every_code_is_documented() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/diagnostics.md");
    let doc = std::fs::read_to_string(&path).expect("docs/diagnostics.md exists");
    let headings: Vec<&str> = doc.lines().filter(|l| l.starts_with("### ")).collect();
    let mut missing = Vec::new();
    for code in Code::ALL {
        let heading = format!("### {} {}", code.as_str(), code.name());
        if !headings.iter().any(|h| h.trim_end() == heading) {
            missing.push(heading);
        }
    }
    assert!(missing.is_empty(), "docs/diagnostics.md lacks the headings {missing:?}");
    assert_eq!(
        headings.len(),
        Code::ALL.len(),
        "docs/diagnostics.md documents a code that does not exist: {headings:?}"
    );
}

#[cfg(unix)]
#[test]
fn unreadable_file_is_e001() {
    // Root can read any file whatever its mode; a dangling symlink met while listing a
    // directory cannot be read by anyone.
    let dir = tempfile::tempdir().expect("a temp dir");
    std::os::unix::fs::symlink("gone.yaml", dir.path().join("dangling.yaml")).expect("a symlink");
    let (exit, out) = validate(dir.path(), &[".", "--format", "json"]);
    assert_eq!(exit, 1, "{out}");
    let diags = diagnostics(&out);
    assert_eq!(diags.len(), 1, "{out}");
    assert_eq!(diags[0]["code"], "E001");
    assert_eq!(diags[0]["file"], "./dangling.yaml");
    assert!(
        diags[0]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("cannot read ./dangling.yaml")),
        "{out}"
    );

    // A path named on the command line that does not exist is a usage error, not a finding.
    let (exit, _) = validate(dir.path(), &["missing.yaml"]);
    assert_eq!(exit, 2);

    // Through the library the same file is an E001 diagnostic.
    let mut compiler = runner::compile::Compiler::new(runner::nodes::builtin().decls());
    compiler.check(&dir.path().join("missing.yaml"));
    let result = compiler.finish();
    let codes: Vec<Code> = result.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, vec![Code::Io]);
    assert!(result.diagnostics[0].file.is_some());
}

#[test]
fn oversized_files_are_e004() {
    const VALID: &str = "name: big\nmodels:\n  default: {provider: mock, model: m}\nnodes:\n  \
                         s: {kind: set}\nedges:\n  - START -> s -> END\n";
    let max = runner::spec::load::MAX_FILE_BYTES;
    let dir = tempfile::tempdir().expect("a temp dir");
    // A valid workflow padded with a comment to exactly the limit, to one byte over, and to
    // 10 MB (where reading the whole file first would be the mistake).
    let padded = |len: usize| {
        let mut text = String::from(VALID);
        text.push('#');
        text.push_str(&"x".repeat(len - VALID.len() - 2));
        text.push('\n');
        assert_eq!(text.len(), len);
        text
    };
    for (name, len) in [
        ("at-limit.yaml", max),
        ("over-limit.yaml", max + 1),
        ("ten-mb.yaml", 10_000_000),
    ] {
        std::fs::write(dir.path().join(name), padded(len)).expect("write the file");
    }
    let (exit, out) = validate(dir.path(), &["at-limit.yaml"]);
    assert_eq!((exit, out.as_str()), (0, "1 file valid\n"));
    for name in ["over-limit.yaml", "ten-mb.yaml"] {
        let (exit, out) = validate(dir.path(), &[name, "--format", "json"]);
        assert_eq!(exit, 1, "{out}");
        let diags = diagnostics(&out);
        assert_eq!(diags.len(), 1, "{out}");
        assert_eq!(diags[0]["code"], "E004");
        assert_eq!(diags[0]["file"], name);
    }
    let (_, human) = validate(dir.path(), &["ten-mb.yaml"]);
    insta::assert_snapshot!(human, @r"
    error[E004]: the file has 10000000 bytes; a workflow file may have at most 4194304
    --> ten-mb.yaml
     = help: split large data out of the workflow: load it at run time with a `load` node

    1 error, 0 warnings in 1 file
    ");
}

#[test]
fn github_format_is_one_annotation_per_diagnostic() {
    let (exit, out) = validate(&fixtures_dir(), &["E201-unknown-kind.yaml", "--format", "github"]);
    assert_eq!(exit, 1);
    assert_eq!(
        out,
        "::error file=E201-unknown-kind.yaml,line=9,col=11,endColumn=16,title=E201 unknown-kind::unknown kind `serch`%0Ahelp: did you mean `search`?\n"
    );
    let (exit, out) = validate(
        &fixtures_dir(),
        &[
            "W405-route-without-default.yaml",
            "--format",
            "github",
            "--deny-warnings",
        ],
    );
    assert_eq!(exit, 1);
    assert!(
        out.starts_with("::warning file=W405-route-without-default.yaml,line=14,"),
        "{out}"
    );
}

#[test]
fn json_format_has_a_stable_shape() {
    let (exit, out) = validate(&fixtures_dir(), &["E200-unknown-send-target.yaml", "--format", "json"]);
    assert_eq!(exit, 1);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let top: BTreeSet<&str> = v.as_object().expect("an object").keys().map(String::as_str).collect();
    assert_eq!(top, BTreeSet::from(["diagnostics", "errors", "warnings"]));
    let diags = v["diagnostics"].as_array().expect("an array");
    assert_eq!(v["errors"], diags.iter().filter(|d| d["severity"] == "error").count());
    assert_eq!(
        v["warnings"],
        diags.iter().filter(|d| d["severity"] == "warning").count()
    );
    assert!(v["errors"].as_u64() > Some(0), "{out}");
    let fields = BTreeSet::from([
        "code",
        "name",
        "severity",
        "message",
        "file",
        "line",
        "column",
        "end_line",
        "end_column",
        "pointer",
        "labels",
        "help",
        "note",
    ]);
    for d in diags {
        let keys: BTreeSet<&str> = d.as_object().expect("an object").keys().map(String::as_str).collect();
        assert_eq!(keys, fields);
        let code = d["code"].as_str().expect("a code");
        let known = Code::ALL.iter().find(|c| c.as_str() == code).expect("a known code");
        assert_eq!(d["name"], known.name());
        assert_eq!(d["file"], "E200-unknown-send-target.yaml");
        assert!(d["line"].as_u64() >= Some(1) && d["column"].as_u64() >= Some(1), "{d}");
        assert!(
            d["pointer"]
                .as_str()
                .is_some_and(|p| p.starts_with("/nodes/") || p.starts_with("/edges/")),
            "{d}"
        );
    }
    let target = diags.iter().find(|d| d["code"] == "E200").expect("the E200");
    assert_eq!(target["pointer"], "/edges/1/send/to");
    assert_eq!(
        (target["line"].as_u64(), target["column"].as_u64()),
        (Some(13), Some(29))
    );
    assert_eq!(
        (target["end_line"].as_u64(), target["end_column"].as_u64()),
        (Some(13), Some(33))
    );
    assert_eq!(target["help"], "did you mean `work`?");
}

#[test]
fn a_directory_reports_every_file_sorted_by_file_then_line() {
    let dir = tempfile::tempdir().expect("a temp dir");
    // Copied under names that sort the other way round from the originals.
    for (from, to) in [
        ("E200-unknown-send-target.yaml", "b.yaml"),
        ("E100-unknown-top-level-field.yaml", "a.yaml"),
    ] {
        std::fs::copy(fixtures_dir().join(from), dir.path().join(to)).expect("copy a fixture");
    }
    let (exit, out) = validate(dir.path(), &[".", "--format", "json"]);
    assert_eq!(exit, 1, "{out}");
    let diags = diagnostics(&out);
    let keys: Vec<(String, u64, u64)> = diags
        .iter()
        .map(|d| {
            (
                d["file"].as_str().unwrap_or_default().to_string(),
                d["line"].as_u64().unwrap_or(0),
                d["column"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "diagnostics are sorted by file, then line");
    let files: BTreeSet<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    assert_eq!(files, BTreeSet::from(["./a.yaml", "./b.yaml"]));
    // The directory reports exactly what the files report one by one.
    for name in ["a.yaml", "b.yaml"] {
        let (_, alone) = validate(dir.path(), &[name, "--format", "json"]);
        let alone: Vec<(String, u64)> = diagnostics(&alone)
            .iter()
            .map(|d| (d["code"].to_string(), d["line"].as_u64().unwrap_or(0)))
            .collect();
        let together: Vec<(String, u64)> = diags
            .iter()
            .filter(|d| d["file"] == format!("./{name}").as_str())
            .map(|d| (d["code"].to_string(), d["line"].as_u64().unwrap_or(0)))
            .collect();
        assert_eq!(alone, together, "{name}");
    }
    let (_, human) = validate(dir.path(), &["."]);
    assert!(human.ends_with("3 errors, 0 warnings in 2 files\n"), "{human}");
}

#[test]
fn the_whole_corpus_at_once_reports_what_each_file_reports_alone() {
    // One compiler for every file shares loaded imports, subgraphs and schema files; that
    // must not change what any file reports.
    let dir = fixtures_dir();
    let (exit, out) = validate(&dir, &[".", "--format", "json"]);
    assert_eq!(exit, 1);
    let together = diagnostics(&out);
    let mut failures = Vec::new();
    for name in fixtures() {
        let (_, alone) = validate(&dir, &[&name, "--format", "json"]);
        let strip = |d: &Value| {
            let mut d = d.clone();
            d["file"] = Value::Null;
            // A label in the same file is named as the diagnostic's file is.
            for label in d["labels"].as_array_mut().into_iter().flatten() {
                let file = label["file"]
                    .as_str()
                    .unwrap_or_default()
                    .trim_start_matches("./")
                    .to_string();
                label["file"] = Value::String(file);
            }
            d.to_string()
        };
        let alone: Vec<String> = diagnostics(&alone)
            .iter()
            .filter(|d| d["file"] == name.as_str())
            .map(strip)
            .collect();
        let mine: Vec<String> = together
            .iter()
            .filter(|d| d["file"] == format!("./{name}").as_str())
            .map(strip)
            .collect();
        if alone != mine {
            failures.push(format!("{name}:\n  alone:    {alone:?}\n  together: {mine:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `runner validate - --stdin-filename PATH`: the workflow on standard input resolves its
/// prompts and schemas from PATH's directory (which it cannot do as `<stdin>` from elsewhere),
/// and every problem is reported in PATH; without `-` the flag is a usage error.
#[test]
fn stdin_filename_resolves_relative_files_and_names_the_input() {
    let project = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(project.path().join("flows/prompts")).unwrap();
    std::fs::create_dir_all(project.path().join("flows/schemas")).unwrap();
    std::fs::write(
        project.path().join("flows/prompts/ask.j2"),
        "Say hi to {{ state.name }}.",
    )
    .unwrap();
    std::fs::write(
        project.path().join("flows/schemas/reply.json"),
        r#"{"type": "object", "properties": {"greeting": {"type": "string"}}}"#,
    )
    .unwrap();
    let workflow = r#"name: hello
models:
  default: {provider: mock, model: m}
state:
  name: {type: string, default: ""}
  reply: {type: object, default: {}}
nodes:
  ask: {kind: llm, prompt: ask.j2, output: {format: json, schema: {$ref: "schemas/reply.json"}}, update: {reply: output}}
edges:
  - START -> ask -> END
"#;
    let elsewhere = tempfile::tempdir().unwrap();
    let run = |args: &[&str], stdin: &str| {
        let out = Command::cargo_bin("runner")
            .unwrap()
            .current_dir(elsewhere.path())
            .arg("validate")
            .args(args)
            .write_stdin(stdin.to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.code().unwrap(), text)
    };
    let name = project.path().join("flows/hello.yaml");
    let name = name.to_str().unwrap();
    // As `<stdin>`, from another directory, the prompt and the schema are not found.
    let (code, text) = run(&["-"], workflow);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("<stdin>:8:"), "{text}");
    // As `<stdin>`, from the workflow's own directory, they are found.
    let out = Command::cargo_bin("runner")
        .unwrap()
        .current_dir(project.path().join("flows"))
        .args(["validate", "-"])
        .write_stdin(workflow)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    // Named, they are, though no file is there.
    let (code, text) = run(&["-", "--stdin-filename", name], workflow);
    assert_eq!(
        (code, text.trim_end().lines().last()),
        (0, Some("1 file valid")),
        "{text}"
    );
    // A defect is reported in the named file, at its place; `-` is implied.
    let (code, text) = run(
        &["--stdin-filename", name, "--format", "json"],
        &workflow.replace("reply: output", "replyy: output"),
    );
    assert_eq!(code, 1, "{text}");
    let ds = diagnostics(&text);
    assert_eq!(ds.len(), 1, "{text}");
    assert_eq!(
        (ds[0]["code"].as_str(), ds[0]["file"].as_str(), ds[0]["line"].as_u64()),
        (Some("E211"), Some(name), Some(8))
    );
    // A defect in the prompt the named file refers to is reported in the prompt.
    std::fs::write(
        project.path().join("flows/prompts/ask.j2"),
        "Say hi to {{ state.nmae }}.",
    )
    .unwrap();
    let (code, text) = run(&["-", "--stdin-filename", name], workflow);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("prompts/ask.j2:1:"), "{text}");
    // Without `-` among the paths the flag names nothing.
    let (code, text) = run(&[name, "--stdin-filename", name], workflow);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("give `-` among the paths"), "{text}");
}
