//! The CLI through the real binary: `validate`, `graph`, `schema`, help and exit codes, and
//! every shipped workflow validated and drawn.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

fn runner() -> Command {
    let mut cmd = Command::cargo_bin("runner").unwrap();
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

fn shipped_workflows() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "yaml") && !p.to_string_lossy().ends_with(".test.yaml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_committed_schema_is_what_the_types_generate() {
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/workflow.schema.json")).unwrap();
    let generated = runner::spec::schema::generate_text(|g| runner::nodes::builtin().decls().schemas(g));
    assert!(
        committed == generated,
        "schemas/workflow.schema.json is stale: run `cargo run -q -- schema --generate > schemas/workflow.schema.json`"
    );
    let out = runner().arg("schema").assert().success().get_output().stdout.clone();
    assert_eq!(String::from_utf8(out).unwrap(), committed);
}

#[test]
fn every_shipped_workflow_is_valid_with_no_warnings() {
    let out = runner()
        .args(["validate", "workflows", "--deny-warnings", "--format", "json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["diagnostics"],
        Value::Array(vec![]),
        "{}",
        serde_json::to_string_pretty(&report).unwrap()
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn the_five_seed_systems_are_all_shipped() {
    let names: Vec<String> = shipped_workflows()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for seed in [
        "research.yaml",
        "rag.yaml",
        "mindmap.yaml",
        "deep-research.yaml",
        "slides.yaml",
    ] {
        assert!(
            names.contains(&seed.to_string()),
            "workflows/{seed} is missing: {names:?}"
        );
    }
}

#[test]
fn every_shipped_workflow_draws_in_every_format() {
    for path in shipped_workflows() {
        let yaml = std::fs::read_to_string(&path).unwrap();
        let mermaid = runner()
            .arg("graph")
            .arg(&path)
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let mermaid = String::from_utf8(mermaid).unwrap();
        assert!(mermaid.starts_with("flowchart TD\n"), "{}", path.display());
        assert!(mermaid.contains("__start__([START])"));
        let dot = runner()
            .arg("graph")
            .arg(&path)
            .args(["--format", "dot"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let dot = String::from_utf8(dot).unwrap();
        assert!(dot.starts_with("digraph ") && dot.trim_end().ends_with('}'));
        assert_eq!(
            dot.matches('{').count(),
            dot.matches('}').count(),
            "unbalanced dot for {}",
            path.display()
        );
        let json = runner()
            .arg("graph")
            .arg(&path)
            .args(["--format", "json"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let json: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(json["hash"].as_str().map(str::len), Some(64));
        for node in json["nodes"].as_array().unwrap() {
            let name = node["name"].as_str().unwrap();
            assert!(
                yaml.contains(&format!("{name}:")),
                "{name} is not a node of {}",
                path.display()
            );
        }
    }
}

#[test]
fn graph_marks_conditions_fan_out_gates_and_subgraphs() {
    let out = runner()
        .args(["graph", "workflows/deep-research.yaml", "--format", "dot"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let dot = String::from_utf8(out).unwrap();
    assert!(dot.contains("shape=hexagon"), "interrupt gates are hexagons");
    assert!(dot.contains("subgraph \"cluster_"), "subgraphs are clusters");
    assert!(dot.contains("style=bold"), "fan-out edges are marked");
    assert!(dot.contains("style=dashed"), "conditional edges are dashed");
    let out = runner()
        .args(["graph", "workflows/research.yaml"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let mermaid = String::from_utf8(out).unwrap();
    assert!(mermaid.contains("-.->|"), "conditional edges are dashed and labelled");
}

fn broken_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "name: bad\nnodes:\n  a: {kind: serch, queries: x}\nedges: [START -> a, a -> END]\n",
    )
    .unwrap();
    dir
}

#[test]
fn validate_reports_in_three_formats_and_exits_1() {
    let dir = broken_project();
    let human = Command::cargo_bin("runner")
        .unwrap()
        .current_dir(dir.path())
        .args(["validate", "bad.yaml"])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let human = String::from_utf8(human).unwrap();
    assert_eq!(
        human,
        "error[E201]: unknown kind `serch`\n --> bad.yaml:3:13\n  |\n3 |   a: {kind: serch, queries: x}\n  |             ^^^^^\n  |\n  = help: did you mean `search`?\n\n1 error, 0 warnings in 1 file\n"
    );
    let github = Command::cargo_bin("runner")
        .unwrap()
        .current_dir(dir.path())
        .args(["validate", "bad.yaml", "--format", "github"])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    assert_eq!(
        String::from_utf8(github).unwrap(),
        "::error file=bad.yaml,line=3,col=13,endColumn=18,title=E201 unknown-kind::unknown kind `serch`%0Ahelp: did you mean `search`?\n"
    );
    let json = Command::cargo_bin("runner")
        .unwrap()
        .current_dir(dir.path())
        .args(["validate", "bad.yaml", "--format", "json"])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let json: Value = serde_json::from_slice(&json).unwrap();
    let d = &json["diagnostics"][0];
    for field in [
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
        "help",
    ] {
        assert!(d.get(field).is_some(), "json diagnostics have `{field}`");
    }
    assert_eq!(d["pointer"], "/nodes/a/kind");
    assert_eq!((json["errors"].as_u64(), json["warnings"].as_u64()), (Some(1), Some(0)));
}

#[test]
fn usage_and_io_errors_exit_2() {
    runner().args(["validate", "no/such/dir"]).assert().code(2);
    runner().args(["validate", "--format", "xml"]).assert().code(2);
    runner().args(["graph", "no-such.yaml"]).assert().code(2);
    runner().arg("frobnicate").assert().code(2);
}

#[test]
fn graph_of_an_invalid_workflow_shows_why_and_exits_1() {
    let dir = broken_project();
    let out = Command::cargo_bin("runner")
        .unwrap()
        .current_dir(dir.path())
        .args(["graph", "bad.yaml"])
        .assert()
        .code(1)
        .get_output()
        .clone();
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8(out.stderr).unwrap().contains("error[E201]"));
}

#[test]
fn every_verb_has_help_with_an_example() {
    for verb in ["validate", "graph", "schema"] {
        let out = runner()
            .args([verb, "--help"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("Example: runner "),
            "`runner {verb} --help` shows an example"
        );
    }
}

/// The completion scripts come from the CLI's own definition: every verb and flag is in them,
/// for each shell; an unknown shell is a usage error.
#[test]
fn completions_know_every_verb() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let out = assert_cmd::Command::cargo_bin("runner")
            .unwrap()
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for word in ["validate", "resume", "serve", "fork", "thread", "answer"] {
            assert!(script.contains(word), "{shell}: no `{word}`");
        }
    }
    let out = assert_cmd::Command::cargo_bin("runner")
        .unwrap()
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

const ECHO: &str = "name: echo\ninput: {type: object, properties: {word: {type: string}}}\nstate:\n  said: {type: string, default: \"\"}\nnodes:\n  say: {kind: set, update: {said: input.word}}\nedges: [START -> say -> END]\noutput: [said]\n";

/// `-` reads standard input wherever a file is taken: `validate -` and `graph -` (problems
/// named `<stdin>`), `--input-file -`, `-i key=@-`; `run -` is refused (a thread records its
/// workflow's path to be resumed).
#[test]
fn a_dash_reads_standard_input() {
    let out = runner().args(["validate", "-"]).write_stdin(ECHO).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 file valid"));
    let out = runner()
        .args(["validate", "-"])
        .write_stdin(ECHO.replace("input.word", "input.wrod"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("<stdin>:6:"), "{text}");
    let out = runner().args(["graph", "-"]).write_stdin(ECHO).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("say"));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("echo.yaml");
    std::fs::write(&file, ECHO).unwrap();
    let run = |args: &[&str], stdin: &str| {
        let out = runner()
            .arg("run")
            .arg(&file)
            .args(["--db", ":memory:", "--output", "json"])
            .args(args)
            .write_stdin(stdin.to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    assert_eq!(run(&["--input-file", "-"], "word: from-yaml\n")["said"], "from-yaml");
    assert_eq!(run(&["-i", "word=@-"], "from stdin")["said"], "from stdin");

    let out = runner().args(["run", "-"]).write_stdin(ECHO).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a workflow file"));
}

/// The environment variables that stand for a flag are named by `--help`, in its text: the
/// run builder reads them, not clap, so a bad value is reported by the variable's name.
#[test]
fn help_shows_the_environment_variables_of_flags() {
    for (verb, vars) in [
        ("run", &["$RUNNER_DB", "$RUNNER_DATA_DB", "$RUNNER_LEASE_TTL"][..]),
        ("serve", &["$RUNNER_DB", "$RUNNER_DATA_DB", "$RUNNER_LEASE_TTL"][..]),
        ("threads", &["$RUNNER_DB"][..]),
        ("index", &["$RUNNER_DATA_DB"][..]),
    ] {
        let out = runner().args([verb, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for var in vars {
            assert!(help.contains(var), "{verb} --help lacks {var}:\n{help}");
        }
    }
}

/// A bad setting is reported by where it was set: the variable (never the flag that clap
/// used to fill from it), the `.env` file that set the variable, or the key of `runner.toml`;
/// by every verb that reads it, and for a database that cannot be opened too.
#[test]
fn a_bad_setting_names_the_variable_and_the_file_that_set_it() {
    let project = tempfile::tempdir().unwrap();
    let root = project.path();
    std::fs::write(root.join("echo.yaml"), ECHO).unwrap();
    std::fs::write(root.join("notes.md"), "# Notes\n\nSome text.\n").unwrap();
    let fails = |env: &[(&str, &str)], args: &[&str]| -> String {
        let mut cmd = Command::cargo_bin("runner").unwrap();
        cmd.current_dir(root)
            .env_remove("RUNNER_DB")
            .env_remove("RUNNER_DATA_DB")
            .env_remove("RUNNER_LEASE_TTL")
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let run = ["run", "echo.yaml", "-i", "word=hi"];
    // The process's variable.
    for args in [&run[..], &["threads"], &["history", "--thread", "t"], &["serve", "."]] {
        let err = fails(&[("RUNNER_DB", "mysql://u:pw@db.example/runs")], args);
        assert!(err.contains("error: RUNNER_DB: `mysql://`"), "{args:?}: {err}");
        assert!(!err.contains("--db") && !err.contains("pw@"), "{args:?}: {err}");
    }
    let err = fails(&[("RUNNER_DB", "/proc/no/such/dir/runs.db")], &run);
    assert!(
        err.contains("cannot open the checkpoint database /proc/no/such/dir/runs.db (from RUNNER_DB)"),
        "{err}"
    );
    let err = fails(
        &[("RUNNER_DATA_DB", "/proc/no/such/dir/data.db")],
        &["index", "notes.md", "--index", "x"],
    );
    assert!(err.contains("(from RUNNER_DATA_DB)"), "{err}");
    // Set by `.env`: the file is named.
    let dot_env = root.join(".env");
    std::fs::write(&dot_env, "RUNNER_DB=mysql://db.example/runs\nRUNNER_LEASE_TTL=0\n").unwrap();
    for args in [&run[..], &["threads"]] {
        let err = fails(&[], args);
        assert!(
            err.contains(&format!("error: RUNNER_DB (from {}): `mysql://`", dot_env.display())),
            "{args:?}: {err}"
        );
    }
    let err = fails(&[], &["run", "echo.yaml", "--db", ":memory:"]);
    assert!(
        err.contains(&format!(
            "error: RUNNER_LEASE_TTL (from {}): the lease",
            dot_env.display()
        )),
        "{err}"
    );
    // The process's environment wins over `.env`, and is named as such.
    let err = fails(
        &[("RUNNER_LEASE_TTL", "soon")],
        &["run", "echo.yaml", "--db", ":memory:"],
    );
    assert!(err.contains("error: RUNNER_LEASE_TTL: `soon`"), "{err}");
    std::fs::remove_file(&dot_env).unwrap();
    // Set by `runner.toml`: its key and the file are named, and a URL is not taken for a path.
    let toml = root.join("runner.toml");
    std::fs::write(&toml, "db = \"pg://db.example/runs\"\nlease_ttl = 100000\n").unwrap();
    let err = fails(&[], &run);
    assert!(
        err.contains(&format!("error: `db` in {}: `pg://`", toml.display())),
        "{err}"
    );
    let err = fails(&[], &["run", "echo.yaml", "--db", ":memory:"]);
    assert!(
        err.contains(&format!("error: `lease_ttl` in {}: the lease", toml.display())),
        "{err}"
    );
    assert!(!root.join("pg:").exists(), "a URL became a path");
}

/// `runner.toml` is found from a subdirectory and its paths are relative to it; `.env` beside
/// it wins over it, the process's environment over both, a flag over everything; its model
/// overrides apply to the workflows that have the profile; a key it does not know is an error
/// naming the file.
#[test]
fn a_project_file_and_dot_env_give_defaults() {
    let project = tempfile::tempdir().unwrap();
    let root = project.path();
    std::fs::create_dir_all(root.join("flows/deep")).unwrap();
    std::fs::write(root.join("flows/echo.yaml"), ECHO).unwrap();
    std::fs::write(
        root.join("runner.toml"),
        "db = \"state/from-toml.db\"\ndata_db = \"state/data.db\"\n[models]\ndefault = \"mock:m\"\n",
    )
    .unwrap();
    let run_from = |dir: &Path, extra: &[(&str, &str)], args: &[&str]| {
        let mut cmd = Command::cargo_bin("runner").unwrap();
        cmd.current_dir(dir)
            .env_remove("RUNNER_DB")
            .env_remove("RUNNER_DATA_DB")
            .args(["run", "../echo.yaml", "-i", "word=hi", "--thread", "t1"])
            .args(args);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let deep = root.join("flows/deep");
    run_from(&deep, &[], &[]);
    assert!(
        root.join("state/from-toml.db").is_file(),
        "runner.toml's db, relative to the file"
    );

    std::fs::write(
        root.join(".env"),
        "# a comment\nexport RUNNER_DB=\"state/from-env-file.db\"\n",
    )
    .unwrap();
    run_from(&deep, &[], &[]);
    // `.env` holds plain variables: a relative path is relative to the working directory.
    assert!(
        deep.join("state/from-env-file.db").is_file(),
        ".env wins over runner.toml"
    );

    let from_process = root.join("state/from-process.db");
    run_from(&deep, &[("RUNNER_DB", from_process.to_str().unwrap())], &[]);
    assert!(from_process.is_file(), "the environment wins over .env");

    let from_flag = root.join("state/from-flag.db");
    run_from(
        &deep,
        &[("RUNNER_DB", from_process.to_str().unwrap())],
        &["--db", from_flag.to_str().unwrap()],
    );
    assert!(from_flag.is_file(), "a flag wins over everything");

    std::fs::write(root.join("runner.toml"), "db = \"x.db\"\nmodel = \"oops\"\n").unwrap();
    let out = Command::cargo_bin("runner")
        .unwrap()
        .current_dir(&deep)
        .args(["run", "../echo.yaml", "-i", "word=hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runner.toml") && err.contains("model"), "{err}");
}

/// `runner man` prints the manual page; `--dir` writes one per command.
#[test]
fn man_pages_come_from_the_cli() {
    let out = runner().arg("man").output().unwrap();
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.starts_with(".ie") || page.contains(".TH runner 1"), "{page}");
    assert!(page.contains("validate"));
    let dir = tempfile::tempdir().unwrap();
    runner().args(["man", "--dir"]).arg(dir.path()).assert().success();
    for page in ["runner.1", "runner-run.1", "runner-threads-prune.1", "runner-serve.1"] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_else(|_| panic!("no {page}"));
        assert!(text.contains(".TH"), "{page}");
    }
}

/// `runner new NAME` writes a workflow, its prompt, a test file and a mock script that pass
/// `validate` and `test` as written and run on the mock; it never overwrites a file and
/// refuses a name that is not one.
#[test]
fn new_scaffolds_a_workflow_that_validates_tests_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let in_dir = |args: &[&str]| {
        Command::cargo_bin("runner")
            .unwrap()
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap()
    };
    let out = in_dir(&["new", "hello"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for file in [
        "workflows/hello.yaml",
        "workflows/prompts/hello/answer.j2",
        "workflows/hello.test.yaml",
        "workflows/hello.mock.yaml",
    ] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
    let out = in_dir(&["validate", "workflows", "--deny-warnings"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 file valid"),
        "the mock script is no workflow"
    );
    let out = in_dir(&["test", "workflows"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 passed, 0 failed"));
    let out = in_dir(&[
        "run",
        "workflows/hello.yaml",
        "--mock",
        "workflows/hello.mock.yaml",
        "--db",
        ":memory:",
        "--output",
        "json",
        "-i",
        "question=What is a heat pump?",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(result["answer"].as_str().unwrap().contains("heat pump"));

    // A prompts folder above is the one used; nothing is overwritten; bad names are refused.
    std::fs::create_dir(dir.path().join("prompts")).unwrap();
    let out = in_dir(&["new", "other", "--dir", "flows"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.path().join("prompts/other/answer.j2").is_file());
    assert!(in_dir(&["validate", "flows"]).status.success());
    let before = std::fs::read_to_string(dir.path().join("workflows/hello.yaml")).unwrap();
    let out = in_dir(&["new", "hello"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists already"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("workflows/hello.yaml")).unwrap(),
        before
    );
    assert_eq!(in_dir(&["new", "Bad Name"]).status.code(), Some(2));
}

/// Diagnostics are coloured only for a terminal (or when CLICOLOR_FORCE asks); a pipe gets
/// plain text, and NO_COLOR wins over everything.
#[test]
fn diagnostics_are_coloured_only_when_asked() {
    let bad = "name: w\nnodes:\n  a: {kind: serch}\nedges: [START -> a -> END]\n";
    let out = runner().args(["validate", "-"]).write_stdin(bad).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains('\u{1b}'));
    let out = runner()
        .env("CLICOLOR_FORCE", "1")
        .args(["validate", "-"])
        .write_stdin(bad)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("\u{1b}["));
    let out = runner()
        .env("CLICOLOR_FORCE", "1")
        .env("NO_COLOR", "1")
        .args(["validate", "-"])
        .write_stdin(bad)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains('\u{1b}'));
}

/// docs/seeds.md shows each seed as `runner graph` draws it today: a section names its file
/// (`` `workflows/….yaml` `` in its heading) and the mermaid block under it is that picture.
/// Regenerate a stale one with `runner graph workflows/<file> --format mermaid`.
#[test]
fn the_seed_pictures_in_the_docs_are_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/seeds.md")).unwrap();
    let mut checked = 0;
    for section in doc.split("\n## ").skip(1) {
        let heading = section.lines().next().unwrap();
        let file = heading
            .split('`')
            .find(|part| part.starts_with("workflows/") && part.ends_with(".yaml"))
            .unwrap_or_else(|| panic!("the heading `{heading}` names no workflow file"));
        let block = section
            .split_once("```mermaid\n")
            .and_then(|(_, rest)| rest.split_once("```"))
            .map(|(block, _)| block)
            .unwrap_or_else(|| panic!("no mermaid block under `{heading}`"));
        let drawn = runner().args(["graph", file, "--format", "mermaid"]).assert().success();
        let drawn = String::from_utf8(drawn.get_output().stdout.clone()).unwrap();
        assert_eq!(
            block.trim_end(),
            drawn.trim_end(),
            "docs/seeds.md's picture of {file} is stale: regenerate it with `runner graph {file} --format mermaid`"
        );
        checked += 1;
    }
    assert!(checked >= 5, "docs/seeds.md pictures {checked} workflows");
}

/// The entries of a verdict cache directory.
fn verdicts(cache: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(dirs) = std::fs::read_dir(cache.join("verdicts")) else {
        return out;
    };
    for d in dirs {
        out.extend(std::fs::read_dir(d.unwrap().path()).unwrap().map(|e| e.unwrap().path()));
    }
    out
}

#[test]
fn a_check_that_passed_is_remembered_and_one_that_found_problems_never_is() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let good = tmp.path().join("good.yaml");
    let bad = tmp.path().join("bad.yaml");
    let typo = "name: bad\nnodes:\n  a: {kind: set, updat: {}}\nedges: [START -> a -> END]\n";
    let counter = |default: &str| {
        format!(
            "name: good\nstate:\n  n: {{type: integer, default: {default}}}\nnodes:\n  a: {{kind: set, update: {{n: 1}}}}\nedges: [START -> a -> END]\n"
        )
    };
    std::fs::write(&good, counter("0")).unwrap();
    std::fs::write(&bad, typo).unwrap();
    let validate = |file: &Path, extra: &[(&str, &str)]| {
        let mut cmd = runner();
        cmd.env("RUNNER_CACHE_DIR", &cache).env_remove("RUNNER_NO_CACHE");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let out = cmd.args(["validate", "--format", "json"]).arg(file).output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), report["diagnostics"].as_array().unwrap().len())
    };

    assert_eq!(validate(&bad, &[]), (Some(1), 1));
    assert!(
        verdicts(&cache).is_empty(),
        "a document with problems is not remembered"
    );
    // The document against the workflow schema, the default against its key's schema.
    assert_eq!(validate(&good, &[]), (Some(0), 0));
    assert_eq!(verdicts(&cache).len(), 2);
    // Remembered: the same answers, no new entries; the bad file still gets its diagnostic.
    assert_eq!(validate(&good, &[]), (Some(0), 0));
    assert_eq!(verdicts(&cache).len(), 2);
    assert_eq!(validate(&bad, &[]), (Some(1), 1));
    // Comments and layout are not the document: the same entries.
    std::fs::write(
        &good,
        format!("# edited\n{}", counter("0").replace("  a: {", "  a:   {")),
    )
    .unwrap();
    assert_eq!(validate(&good, &[]), (Some(0), 0));
    assert_eq!(verdicts(&cache).len(), 2);
    // A default that does not fit: the document passes (remembered), the default never does.
    std::fs::write(&good, counter("'zero'")).unwrap();
    assert_eq!(validate(&good, &[]), (Some(1), 1));
    assert_eq!(validate(&good, &[]), (Some(1), 1));
    assert_eq!(verdicts(&cache).len(), 3);
    // Turned off: nothing new is written.
    std::fs::write(&good, counter("2")).unwrap();
    assert_eq!(validate(&good, &[("RUNNER_NO_CACHE", "1")]), (Some(0), 0));
    assert_eq!(verdicts(&cache).len(), 3);
    assert_eq!(validate(&good, &[]), (Some(0), 0));
    assert_eq!(verdicts(&cache).len(), 5);
}
