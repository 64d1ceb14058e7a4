//! `runner test`: run the cases of `*.test.yaml` files against their workflows, in process, on
//! an in-memory checkpointer with scripted (or replayed) model replies, and report like a test
//! runner. The file format is documented in docs/testing.md.

mod expect;
mod suite;
mod update;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::exit;
use crate::compile::{Plan, compile_file};
use crate::diag::{self, Format};
use crate::engine::events::{Event, Events};
use crate::engine::{Engine, Persist, RunOutcome, Status};
use crate::run::{CassetteOption, DbOption, Env, MockOption, RunOptions, Start, env};
use expect::Observed;
use suite::{Case, Models, Suite};

/// How results are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(super) enum TestFormat {
    /// One line per case, failure details, a summary line.
    #[default]
    Human,
    /// JUnit XML on stdout, for CI.
    Junit,
    /// The human report, and a GitHub Actions `::error` annotation for each failing case at
    /// its line in the test file.
    Github,
}

/// Run workflow test files (`*.test.yaml`).
///
/// Each case runs its workflow in process, on an in-memory checkpointer, with its scripted mock
/// replies or a recorded cassette, answers its interrupts in order and checks the status,
/// output, state, path of nodes and events. Exit 0 when every case passes, 1 when one fails,
/// 2 on a usage error (including a test file that is not valid).
///
/// Example: runner test workflows/ --format junit > junit.xml
#[derive(clap::Args)]
pub(super) struct Args {
    /// Test files, or directories searched for *.test.yaml (default: workflows/).
    paths: Vec<PathBuf>,
    /// How to report.
    #[arg(long, value_enum, default_value_t)]
    format: TestFormat,
    /// Run only the cases whose name contains this.
    #[arg(long, value_name = "SUBSTR")]
    filter: Option<String>,
    /// Accept what failing cases did: rewrite their `status`, `output`, `state`, `interrupt`,
    /// `path` and `visits` expectations in the test files (review the diff).
    #[arg(long)]
    update: bool,
    /// Let load and index read files under this directory besides each workflow's own
    /// directory tree (repeatable; also `RUNNER_ALLOW_READ`).
    #[arg(long = "allow-read", value_name = "DIR")]
    allow_read: Vec<PathBuf>,
}

/// One case's result.
struct Outcome {
    name: String,
    line: Option<u32>,
    duration: Duration,
    failures: Vec<String>,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    // A case runs the same whatever the shell says about the network or leases: only the
    // directories it may read come from the environment (and model keys, unused under a mock).
    let env = Env::process().without(env::ALLOW_NET).without(env::LEASE_TTL);
    let base = RunOptions {
        db: Some(DbOption::Scratch),
        data_db: Some(PathBuf::from(":memory:")),
        allow_read: args.allow_read.clone(),
        persist: Some(Persist::Sync),
        ..RunOptions::default()
    };
    // Checked once, before any case runs.
    base.clone().resolve(&env)?;
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from("workflows")]
    } else {
        args.paths
    };
    let files = test_files(&paths)?;
    let mut suites = vec![];
    let mut problems = vec![];
    for file in &files {
        match suite::read(file) {
            Ok(s) => suites.push(s),
            Err(p) => problems.extend(p),
        }
    }
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("error: {p}");
        }
        eprintln!("{} problem(s) in test files; nothing was run", problems.len());
        return Ok(exit::USAGE);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let human = args.format != TestFormat::Junit;
    let mut out = std::io::stdout().lock();
    let mut results: Vec<(&Suite, Vec<Outcome>)> = vec![];
    for suite in &suites {
        let cases: Vec<&Case> = suite
            .cases
            .iter()
            .filter(|c| args.filter.as_deref().is_none_or(|f| c.name.contains(f)))
            .collect();
        if cases.is_empty() {
            continue;
        }
        if human {
            writeln!(out, "{}", suite.path.display())?;
        }
        let (plan, compiled) = compile_file(&suite.workflow, &crate::nodes::builtin().decls());
        let mut outcomes = vec![];
        let mut updates = vec![];
        for case in cases {
            let started = Instant::now();
            let failures = match &plan {
                Some(plan) => {
                    let nodes: Vec<&str> = plan.nodes().values().map(|n| n.name.as_str()).collect();
                    let unknown = expect::unknown_nodes(&case.expect, &nodes);
                    if unknown.is_empty() {
                        let (failures, seen) =
                            runtime.block_on(run_case(plan.clone(), suite, case, case_options(&base, case), &env));
                        if args.update
                            && !failures.is_empty()
                            && let Some(seen) = seen
                        {
                            let new = update::refreshed(&case.expect, &seen);
                            if !new.is_empty() {
                                updates.push((case.index, new));
                            }
                        }
                        failures
                    } else {
                        unknown
                    }
                }
                None => vec![format!(
                    "the workflow {} does not compile:\n{}",
                    suite.workflow.display(),
                    diag::render(&compiled.diagnostics, &compiled.files, Format::Human)
                )],
            };
            let outcome = Outcome {
                name: case.name.clone(),
                line: case.line,
                duration: started.elapsed(),
                failures,
            };
            if human {
                let verdict = if outcome.failures.is_empty() {
                    "ok    "
                } else {
                    "FAILED"
                };
                writeln!(out, "  {verdict}  {}  ({})", outcome.name, ms(outcome.duration))?;
            }
            outcomes.push(outcome);
        }
        if !updates.is_empty() {
            update::rewrite(&suite.path, &updates)?;
            let keys: usize = updates.iter().map(|(_, k)| k.len()).sum();
            eprintln!(
                "updated {}: {keys} expectation(s) of {} case(s)",
                suite.path.display(),
                updates.len()
            );
        }
        results.push((suite, outcomes));
    }
    let all = || results.iter().flat_map(|(_, o)| o.iter());
    let failed = all().filter(|o| !o.failures.is_empty()).count();
    let passed = all().count() - failed;
    if human {
        if failed > 0 {
            writeln!(out, "\nfailures:")?;
            for (suite, outcomes) in &results {
                for o in outcomes.iter().filter(|o| !o.failures.is_empty()) {
                    writeln!(out, "\n{} — {}", suite.path.display(), o.name)?;
                    for f in &o.failures {
                        writeln!(out, "  {f}")?;
                    }
                }
            }
        }
        writeln!(out, "\n{passed} passed, {failed} failed")?;
        if args.format == TestFormat::Github {
            for (suite, outcomes) in &results {
                for o in outcomes.iter().filter(|o| !o.failures.is_empty()) {
                    let file = suite.path.display().to_string();
                    let title = format!("runner test: {}", o.name);
                    out.write_all(diag::github_error(&file, o.line, &title, &o.failures.join("\n")).as_bytes())?;
                }
            }
        }
    } else {
        out.write_all(junit(&results).as_bytes())?;
        eprintln!("{passed} passed, {failed} failed");
    }
    if passed + failed == 0 {
        eprintln!("no case matched the filter");
        return Ok(exit::USAGE);
    }
    Ok(if failed == 0 { exit::OK } else { exit::INVALID })
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Expands directories into the test files below them, sorted.
fn test_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    super::validate::files_under(paths, "test files (*.test.yaml)", is_test_file)
}

/// Whether a file name is a test file's.
pub(super) fn is_test_file(name: &str) -> bool {
    name.ends_with(".test.yaml") || name.ends_with(".test.yml")
}

/// The options of one case: the command's, with the case's models and recursion limit.
fn case_options(base: &RunOptions, case: &Case) -> RunOptions {
    let (mock, cassette) = match &case.models {
        // A test never reaches a real model: without a script, every call fails as on an
        // empty one.
        Models::None => (Some(MockOption::Empty), None),
        Models::Mock(script) => (Some(MockOption::Script(script.clone())), None),
        Models::MockFile(path) => (Some(MockOption::File(path.clone())), None),
        Models::Cassette(path) => (None, Some(CassetteOption::Replay(path.clone()))),
    };
    RunOptions {
        mock,
        cassette,
        recursion_limit: case.recursion_limit,
        ..base.clone()
    }
}

/// Runs one case and returns its failures (none when it passed) and what it did (none when it
/// could not run).
async fn run_case(
    plan: Arc<Plan>,
    suite: &Suite,
    case: &Case,
    options: RunOptions,
    env: &Env,
) -> (Vec<String>, Option<Observed>) {
    // Replies scripted for a node the workflow lacks would never be used: a misspelt name.
    let script = match &case.models {
        Models::Mock(script) => Some(crate::providers::mock::MockProvider::from_value(script)),
        Models::MockFile(path) => Some(crate::providers::mock::MockProvider::from_file(path)),
        _ => None,
    };
    if let Some(Ok(mock)) = script {
        let names = plan.all_node_names();
        let unknown = mock.replies_for_unknown_nodes(&names);
        if !unknown.is_empty() {
            return (
                vec![format!(
                    "mock: replies for {}, which the workflow has no node of that name",
                    unknown.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                )],
                None,
            );
        }
    }
    let run = match options.resolve(env).and_then(|settings| settings.build(&plan)) {
        Ok(run) => run,
        Err(e) => return (vec![e.to_string()], None),
    };
    let cassette = run.services.cassette.clone();
    let collected: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink = collected.clone();
    let events = Events::sink(Arc::new(move |e| {
        if let Ok(mut v) = sink.lock() {
            v.push(e.event);
        }
    }));
    let mut request = run.overrides.start(Start {
        thread_id: Some("test".into()),
        workflow: suite.workflow.display().to_string(),
        input: case.input.clone(),
        input_given: true,
        context: case.context.clone(),
        config: case.set.clone(),
    });
    let overrides = run.overrides;
    let engine = Engine::new(plan, run.store, run.services, events);
    let mut answers = case.answers.iter();
    let mut failures = vec![];
    let result = loop {
        let outcome = match engine.run(request.clone()).await {
            Ok(o) => o,
            Err(e) => break Err(e.to_string()),
        };
        if outcome.status != Status::Interrupted {
            break Ok(outcome);
        }
        match answers.next() {
            Some(answer) => {
                request = overrides.answer(
                    outcome.thread_id.clone(),
                    request.workflow.clone(),
                    Some(answer.clone()),
                    // Several gates waiting: the answers take them in the order reported.
                    (outcome.interrupts.len() > 1)
                        .then(|| outcome.interrupts[0]["task_id"].as_str().map(str::to_string))
                        .flatten(),
                );
            }
            None => break Ok(outcome),
        }
    };
    let unused = answers.count();
    if unused > 0 {
        failures.push(format!(
            "answers: {unused} of {} were not used (the run asked for fewer)",
            case.answers.len()
        ));
    }
    drop(engine);
    // A request the cassette lacks fails the case even when an `on_error` handler took it.
    for miss in cassette.map(|c| c.misses()).unwrap_or_default() {
        failures.push(format!("cassette: {miss}"));
    }
    let events = collected.lock().map(|v| v.clone()).unwrap_or_default();
    let seen = observe(result, &events);
    failures.extend(expect::check(&case.expect, &seen));
    (failures, Some(seen))
}

fn observe(result: Result<RunOutcome, String>, events: &[Event]) -> Observed {
    // The path is the tasks of every step of the top-level run: a subgraph's own run is nested
    // between its run_start and run_end.
    let mut depth = 0;
    let mut path = vec![];
    for e in events {
        match e {
            Event::RunStart { .. } => depth += 1,
            Event::RunEnd { .. } => depth -= 1,
            Event::StepStart { nodes, .. } if depth == 1 => {
                path.extend(nodes.iter().map(|n| n.split('#').next().unwrap_or(n).to_string()));
            }
            _ => {}
        }
    }
    let events = events
        .iter()
        .map(|e| serde_json::to_value(e).unwrap_or(Value::Null))
        .collect();
    match result {
        Ok(o) => Observed {
            status: o.status.as_str().to_string(),
            output: o.output,
            state: Value::Object(o.state),
            interrupt: o.interrupt.unwrap_or(Value::Null),
            error: o.error,
            path,
            events,
        },
        // The run could not start or go on (input that does not fit, a refused answer).
        Err(e) => Observed {
            status: "failed".into(),
            output: Value::Null,
            state: Value::Null,
            interrupt: Value::Null,
            error: Some(e),
            path,
            events,
        },
    }
}

fn junit(results: &[(&Suite, Vec<Outcome>)]) -> String {
    let secs = |d: Duration| format!("{:.3}", d.as_secs_f64());
    let total = |o: &[Outcome]| o.iter().map(|o| o.duration).sum::<Duration>();
    let tests: usize = results.iter().map(|(_, o)| o.len()).sum();
    let failures: usize = results
        .iter()
        .map(|(_, o)| o.iter().filter(|o| !o.failures.is_empty()).count())
        .sum();
    let time: Duration = results.iter().map(|(_, o)| total(o)).sum();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites name=\"runner\" tests=\"{tests}\" failures=\"{failures}\" time=\"{}\">\n",
        secs(time)
    ));
    for (suite, outcomes) in results {
        let name = xml(&suite.path.display().to_string());
        let failed = outcomes.iter().filter(|o| !o.failures.is_empty()).count();
        x.push_str(&format!(
            "  <testsuite name=\"{name}\" tests=\"{}\" failures=\"{failed}\" errors=\"0\" time=\"{}\">\n",
            outcomes.len(),
            secs(total(outcomes))
        ));
        for o in outcomes {
            let head = format!(
                "    <testcase name=\"{}\" classname=\"{name}\" time=\"{}\"",
                xml(&o.name),
                secs(o.duration)
            );
            match o.failures.first() {
                None => x.push_str(&format!("{head}/>\n")),
                Some(first) => {
                    let first = first.lines().next().unwrap_or_default();
                    x.push_str(&format!(
                        "{head}>\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                        xml(first),
                        xml(&o.failures.join("\n"))
                    ));
                }
            }
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

/// Text escaped for XML attributes and content; characters XML 1.0 cannot hold are dropped.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_drops_control_characters() {
        assert_eq!(xml("a<b>&\"c'\u{1}"), "a&lt;b&gt;&amp;&quot;c&apos;");
    }

    #[test]
    fn the_path_skips_subgraph_steps_and_fan_out_indices() {
        let start = || Event::RunStart {
            thread_id: "t".into(),
            workflow: "w".into(),
            resumed: false,
            checkpoint_id: String::new(),
        };
        let end = || Event::RunEnd {
            status: "done".into(),
            steps: 1,
            duration_ms: 0.0,
            turn_usage: Default::default(),
            thread_usage: Default::default(),
        };
        let step = |tasks: &[&str]| Event::StepStart {
            step: 1,
            tasks: tasks.iter().map(|t| t.to_string()).collect(),
            nodes: tasks.iter().map(|t| t.to_string()).collect(),
        };
        let events = [
            start(),
            step(&["a"]),
            start(),
            step(&["inner"]),
            end(),
            step(&["b#0", "b#1"]),
            end(),
        ];
        let seen = observe(Err("x".into()), &events);
        assert_eq!(seen.path, ["a", "b", "b"]);
    }
}
