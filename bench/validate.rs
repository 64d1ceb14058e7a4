//! Benchmark of `runner validate`: read + parse + schema check + compile into a `Plan`.
//!
//! Run with `cargo bench --bench validate` (release profile). It times, in process, each
//! shipped workflow, all of `workflows/` together, and generated workflows of 1,000 and 10,000
//! nodes; then the real binary end to end (process start and schema-validator construction
//! included); then the stages separately. It prints Markdown tables ready for README.
//!
//! Targets: a 1,000-node workflow validates and compiles in < 100 ms; a typical (shipped)
//! workflow in < 5 ms; 10,000 nodes fanned out from START in one superstep in < 1 s. The
//! 10,000-node chained case is reported for scale, without a target.
//!
//! Uses only std and the crate's own dependencies: no criterion.
//!
//! For a profiler, `VALIDATE_BENCH_LOOP=<file>` only checks that file over and over for 10 s:
//! `VALIDATE_BENCH_LOOP=target/bench-validate/bench-1000.yaml perf record -g <bench binary>`.

use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runner::compile::{Compilation, Compiler, compile_file, source};
use runner::diag::{self, Format};
use runner::spec::{Workflow, load, schema};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Nodes per generated segment (see [`segment`]).
const SEGMENT: usize = 20;
/// Distinct `v*` state keys in a generated workflow.
const VKEYS: usize = 100;
const MIN_ITERS: usize = 20;
const MIN_TIME: Duration = Duration::from_secs(2);
const TARGET_LARGE_MS: f64 = 100.0;
const TARGET_TYPICAL_MS: f64 = 5.0;
/// Branches of the generated fan-out from START (see [`generate_wide`]).
const WIDE: usize = 10_000;
/// Validation must not grow with the square of the parallel width: the wide case's target.
const TARGET_WIDE_MS: f64 = 1_000.0;

fn main() {
    if let Some(file) = std::env::var_os("VALIDATE_BENCH_LOOP") {
        let files = [PathBuf::from(file)];
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            black_box(check(&files));
        }
        return;
    }
    let root = Path::new(ROOT);
    let work = target_dir(root).join("bench-validate");
    let big = generate(&work, 1_000);
    let huge = generate(&work, 10_000);
    let wide = generate_wide(&work, WIDE);
    let mut report = String::new();
    let _ = writeln!(report, "### `runner validate` benchmark\n");
    let _ = writeln!(
        report,
        "Machine: {} ({} CPUs), load average at start {}  ",
        cpu_model(),
        nproc(),
        load_average()
    );
    let _ = writeln!(
        report,
        "Each case: warm-up, then at least {MIN_ITERS} iterations and {} s; times in ms.\n",
        MIN_TIME.as_secs()
    );

    // The first call in a process also builds the schema validators (kept for the process).
    let cold = time_once(|| check(std::slice::from_ref(&big)));

    // The files `runner validate workflows/` checks.
    let shipped = runner::cli::workflow_files(&[root.join("workflows")]).unwrap_or_default();
    let mut cases: Vec<Case> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut valid_shipped: Vec<PathBuf> = Vec::new();
    for file in &shipped {
        let result = check(std::slice::from_ref(file));
        if result.errors() > 0 {
            skipped.push(format!("`{}`: {}", rel(root, file), first_error(&result)));
        } else {
            valid_shipped.push(file.clone());
            cases.push(Case::new(rel(root, file), vec![file.clone()], Some(TARGET_TYPICAL_MS)));
        }
    }
    if !shipped.is_empty() {
        let all = check(&shipped);
        let label = format!("all of workflows/ ({} files{})", shipped.len(), errors_note(&all));
        cases.push(Case::new(label, shipped.clone(), None));
    }
    for (path, n) in [(&big, 1_000usize), (&huge, 10_000)] {
        assert_valid(path, n);
        let target = (n == 1_000).then_some(TARGET_LARGE_MS);
        cases.push(Case::new(
            format!("generated, {} nodes", thousands(n)),
            vec![path.clone()],
            target,
        ));
    }
    assert_valid(&wide, WIDE + 1);
    cases.push(Case::new(
        format!("generated, {} nodes fanned out from START", thousands(WIDE)),
        vec![wide.clone()],
        Some(TARGET_WIDE_MS),
    ));

    let _ = writeln!(report, "| case | nodes | min | median | p95 | iters | target |");
    let _ = writeln!(report, "|---|---:|---:|---:|---:|---:|---|");
    let mut missed = Vec::new();
    for case in &cases {
        let stats = bench(|| {
            black_box(check(&case.files));
        });
        if let Some(t) = case.target
            && stats.median > t
        {
            missed.push(format!("{}: median {:.2} ms > {t} ms", case.label, stats.median));
        }
        let _ = writeln!(
            report,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {} | {} |",
            case.label,
            node_count(&case.files),
            stats.min,
            stats.median,
            stats.p95,
            stats.iters,
            verdict(case.target, stats.median),
        );
        eprintln!("done: {}", case.label);
    }
    let _ = writeln!(
        report,
        "\nFirst call in a fresh process (1,000 nodes, schema validators built on the way): {cold:.2} ms."
    );
    if !skipped.is_empty() {
        let _ = writeln!(report, "\nSkipped (do not compile):\n");
        for s in &skipped {
            let _ = writeln!(report, "- {s}");
        }
    }

    end_to_end(root, &big, &mut report, &mut missed);
    stages(&valid_shipped, &big, &huge, &mut report);

    let _ = writeln!(report, "\nCommand: `cargo bench --bench validate`");
    if missed.is_empty() {
        let _ = writeln!(report, "\nAll targets met.");
    } else {
        let _ = writeln!(report, "\nTargets missed:\n");
        for m in &missed {
            let _ = writeln!(report, "- {m}");
        }
    }
    println!("{report}");
}

struct Case {
    label: String,
    files: Vec<PathBuf>,
    target: Option<f64>,
}

impl Case {
    fn new(label: String, files: Vec<PathBuf>, target: Option<f64>) -> Case {
        Case { label, files, target }
    }
}

/// The pipeline `runner validate` runs: one compiler, every file checked, diagnostics sorted.
fn check(files: &[PathBuf]) -> Compilation {
    let mut compiler = Compiler::new(runner::nodes::builtin().decls());
    for file in files {
        compiler.check(file);
    }
    compiler.finish()
}

struct Stats {
    min: f64,
    median: f64,
    p95: f64,
    iters: usize,
}

/// Runs `f` after a warm-up until both [`MIN_ITERS`] iterations and [`MIN_TIME`] are reached.
fn bench(mut f: impl FnMut()) -> Stats {
    let warm = Instant::now();
    for _ in 0..3 {
        f();
        if warm.elapsed() > Duration::from_millis(500) {
            break;
        }
    }
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < MIN_ITERS || start.elapsed() < MIN_TIME {
        samples.push(time_once(&mut f));
    }
    stats(samples)
}

fn stats(mut samples: Vec<f64>) -> Stats {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let p95 = samples[(n * 95).div_ceil(100).saturating_sub(1)];
    Stats {
        min: samples[0],
        median: samples[n / 2],
        p95,
        iters: n,
    }
}

fn time_once<T>(mut f: impl FnMut() -> T) -> f64 {
    let t = Instant::now();
    black_box(f());
    t.elapsed().as_secs_f64() * 1e3
}

fn verdict(target: Option<f64>, median: f64) -> String {
    match target {
        None => "—".into(),
        Some(t) if median <= t => format!("< {t} ms: met"),
        Some(t) => format!("< {t} ms: **missed**"),
    }
}

/// Times the real binary: process start, argument parsing, validator construction, output.
fn end_to_end(root: &Path, big: &Path, report: &mut String, missed: &mut Vec<String>) {
    let bin = target_dir(root).join("release").join("runner");
    let _ = writeln!(report, "\nEnd to end, the release binary (`{}`):\n", rel(root, &bin));
    if !bin.exists() {
        let _ = writeln!(report, "Skipped: no release binary; run `cargo build --release` first.");
        return;
    }
    let _ = writeln!(report, "| command | exit | min | median | p95 | iters | target |");
    let _ = writeln!(report, "|---|---:|---:|---:|---:|---:|---|");
    let runs: [(String, Vec<String>, Option<f64>); 2] = [
        (
            "runner validate workflows/".into(),
            vec!["validate".into(), "workflows/".into()],
            None,
        ),
        (
            "runner validate <1,000 nodes>".into(),
            vec!["validate".into(), big.display().to_string()],
            Some(TARGET_LARGE_MS),
        ),
    ];
    for (label, args, target) in runs {
        let run = || {
            Command::new(&bin)
                .args(&args)
                .current_dir(root)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.code().unwrap_or(-1))
                .unwrap_or(-1)
        };
        let exit = run();
        let stats = bench(|| {
            black_box(run());
        });
        if let Some(t) = target
            && stats.median > t
        {
            missed.push(format!("{label} (end to end): median {:.2} ms > {t} ms", stats.median));
        }
        let _ = writeln!(
            report,
            "| `{label}` | {exit} | {:.2} | {:.2} | {:.2} | {} | {} |",
            stats.min,
            stats.median,
            stats.p95,
            stats.iters,
            verdict(target, stats.median)
        );
    }
}

/// Times the stages of loading one file separately, with public pieces of the crate:
/// read (size cap, UTF-8), parse (YAML with spans → JSON), schema check, deserialize, and the
/// rest of the compiler (names, expressions, templates, graph, plan) as the remainder.
fn stages(shipped: &[PathBuf], big: &Path, huge: &Path, report: &mut String) {
    let build = time_once(|| jsonschema::draft202012::new(schema::workflow_schema()).is_ok());
    let Ok(validator) = jsonschema::draft202012::new(schema::workflow_schema()) else {
        return;
    };
    let _ = writeln!(report, "\nStages (median ms; compile = total − load):\n");
    let _ = writeln!(
        report,
        "| case | read | parse (YAML + spans) | schema | deserialize | load total | compile | total |"
    );
    let _ = writeln!(report, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut cases: Vec<(String, PathBuf)> = Vec::new();
    if let Some(largest) = shipped
        .iter()
        .max_by_key(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
    {
        cases.push((rel(Path::new(ROOT), largest), largest.clone()));
    }
    cases.push(("generated, 1,000 nodes".into(), big.to_path_buf()));
    cases.push(("generated, 10,000 nodes".into(), huge.to_path_buf()));
    for (label, path) in cases {
        let Ok(file) = load::read(&path) else { continue };
        let Ok(doc) = load::parse(file.clone()) else { continue };
        let read = bench(|| {
            black_box(load::read(&path).is_ok());
        });
        let parse = bench(|| {
            black_box(load::parse(file.clone()).is_ok());
        });
        let schema = bench(|| {
            black_box(validator.iter_errors(&doc.value).count());
        });
        let de = bench(|| {
            black_box(serde_json::from_value::<Workflow>(doc.value.clone()).is_ok());
        });
        let loaded = bench(|| {
            black_box(source::load_source(&path, &mut Vec::new()).is_some());
        });
        let total = bench(|| {
            black_box(check(std::slice::from_ref(&path)));
        });
        let _ = writeln!(
            report,
            "| {label} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            read.median,
            parse.median,
            schema.median,
            de.median,
            loaded.median,
            total.median - loaded.median,
            total.median
        );
        eprintln!("done: stages of {label}");
    }
    let _ = writeln!(report, "\nBuilding the workflow-schema validator once: {build:.2} ms.");
}

/// Fails the benchmark (exit 1) unless the generated workflow compiles with no problems.
fn assert_valid(path: &Path, nodes: usize) {
    let (plan, result) = compile_file(path, &runner::nodes::builtin().decls());
    if result.diagnostics.is_empty() && plan.as_ref().is_some_and(|p| p.nodes().len() == nodes) {
        return;
    }
    eprint!("{}", diag::render(&result.diagnostics, &result.files, Format::Human));
    eprintln!(
        "generated workflow {} is not clean: {} errors, {} warnings, plan with {:?} nodes (want {nodes})",
        path.display(),
        result.errors(),
        result.warnings(),
        plan.map(|p| p.nodes().len())
    );
    std::process::exit(1);
}

fn first_error(result: &Compilation) -> String {
    let n = result.errors();
    let first = result.diagnostics.iter().find(|d| d.is_error());
    let what = first.map_or_else(String::new, |d| {
        let at = match (&d.file, d.span) {
            (Some(f), Some(s)) => format!(
                " at {}:{}",
                f.file_name().unwrap_or_default().to_string_lossy(),
                s.start.line
            ),
            _ => String::new(),
        };
        format!("; first: {}{at}: {}", d.code, d.message)
    });
    format!("{n} error{}{what}", if n == 1 { "" } else { "s" })
}

fn errors_note(result: &Compilation) -> String {
    match result.errors() {
        0 => String::new(),
        n => format!(", {n} errors"),
    }
}

/// Nodes in the files (counted from the YAML: files with errors have no plan).
fn node_count(files: &[PathBuf]) -> usize {
    files
        .iter()
        .filter_map(|f| load::read(f).ok())
        .filter_map(|f| load::parse(f).ok())
        .map(|d| d.value.get("nodes").and_then(|n| n.as_object()).map_or(0, |n| n.len()))
        .sum()
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

fn nproc() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

// ---------------------------------------------------------------------------------------------
// The generated workflow.

const PLAN_PROMPT: &str = "\
Plan the next step of the research on: {{ input.query }}
Budget left: {{ config.costs.max_cost - state.total_cost }}
{% for t in state.tasks %}- {{ t.name }} (weight {{ t.weight }})
{% endfor %}
The log has {{ state.log | length }} entries; the best score so far is {{ state.best }}.
";

const REVIEW_PROMPT: &str = "\
Review these results for {{ input.query }}:
{% for r in state.results %}{{ loop.index }}. {{ r.answer }} (score {{ r.score }})
{% endfor %}
Tags: {{ state.tags | join(', ') }}
";

const PLAN_SCHEMA: &str = r#"{
  "type": "object",
  "required": ["tasks", "score", "summary"],
  "properties": {
    "tasks": {
      "type": "array",
      "items": {
        "type": "object",
        "required": ["name", "weight"],
        "properties": {"name": {"type": "string"}, "weight": {"type": "number"}}
      }
    },
    "score": {"type": "number"},
    "summary": {"type": "string"}
  }
}
"#;

/// Writes `bench-<nodes>.yaml` with its prompts/ and schemas/ under `dir`; returns its path.
fn generate(dir: &Path, nodes: usize) -> PathBuf {
    let write = |rel: &str, text: &str| {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
        }
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    };
    write("prompts/bench/plan.j2", PLAN_PROMPT);
    write("prompts/bench/review.j2", REVIEW_PROMPT);
    write("schemas/plan.json", PLAN_SCHEMA);
    write(&format!("bench-{nodes}.yaml"), &workflow(nodes))
}

fn workflow(nodes: usize) -> String {
    assert!(
        nodes.is_multiple_of(SEGMENT),
        "node count must be a multiple of {SEGMENT}"
    );
    let segments = nodes / SEGMENT;
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# Generated by bench/validate.rs: {segments} segments of {SEGMENT} nodes."
    );
    let _ = writeln!(y, "name: bench-{nodes}");
    let _ = writeln!(
        y,
        "description: A generated {nodes}-node workflow for the validation benchmark."
    );
    y.push_str(
        "\
input: {type: object, required: [query], properties: {query: {type: string, minLength: 3}}}
output: [results, log, v0]
config:
  costs: {max_cost: 1.0}
  limits: {max_count: 1000, fanout: 4}
  step: 2
models:
  default: {provider: mock, model: bench}
types:
  Task:
    type: object
    required: [name, weight]
    properties: {name: {type: string}, weight: {type: number}}
state:
  tasks: {type: array, items: {$ref: \"#/types/Task\"}, default: []}
  results: {type: array, reducer: append, default: []}
  log: {type: array, items: {type: string}, reducer: append, default: []}
  tags: {type: array, items: {type: string}, reducer: union, default: []}
  meta: {type: object, reducer: merge, default: {}}
  counter: {type: integer, reducer: sum, default: 0}
  total_cost: {type: number, reducer: sum, default: 0}
  best: {type: number, reducer: max, default: 0}
  ranked: {type: array, reducer: by_score, default: []}
",
    );
    for k in 0..VKEYS.min(segments) {
        let _ = writeln!(y, "  v{k}: {{type: string, default: \"\"}}");
    }
    y.push_str(
        "\
reducers:
  by_score: \"(current + update) | sort(attribute='score', reverse=true)\"
predicates:
  over_budget: \"state.total_cost >= config.costs.max_cost\"
  too_many: {expr: \"state.counter > config.limits.max_count\", description: Enough steps.}
  has_tasks: \"state.tasks | length > 0\"
nodes:
",
    );
    let mut edges = String::from("edges:\n  - START -> s0_plan\n");
    for i in 0..segments {
        let next = if i + 1 == segments {
            "END".to_string()
        } else {
            format!("s{}_plan", i + 1)
        };
        segment(i, &next, &mut y, &mut edges);
    }
    y.push_str(&edges);
    let _ = writeln!(y, "limits: {{recursion_limit: {}}}", nodes * 2);
    y
}

/// Writes `bench-wide-<width>.yaml`: `width` nodes fanned out from START in one superstep, each
/// appending to one key, joined into one node. Every pair of them can run together, so an
/// analysis that looks at pairs (rather than at the keys they write) is quadratic here.
fn generate_wide(dir: &Path, width: usize) -> PathBuf {
    let names: Vec<String> = (0..width).map(|i| format!("w{i}")).collect();
    let mut y = format!(
        "# Generated by bench/validate.rs: {width} nodes fanned out from START.\nname: bench-wide-{width}\n\
         state:\n  seen: {{type: array, reducer: append, default: []}}\n  done: {{type: boolean, default: false}}\nnodes:\n"
    );
    for n in &names {
        let _ = writeln!(y, "  {n}: {{kind: set, update: {{seen: \"['{n}']\"}}}}");
    }
    y.push_str("  join: {kind: set, update: {done: \"true\"}}\nedges:\n");
    let _ = writeln!(y, "  - {{from: START, to: [{}]}}", names.join(", "));
    let _ = writeln!(y, "  - {{from: [{}], to: join}}", names.join(", "));
    y.push_str("  - join -> END\n");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let path = dir.join(format!("bench-wide-{width}.yaml"));
    std::fs::write(&path, y).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// One segment of [`SEGMENT`] nodes: an `llm` planner, a chain of `set` nodes with a route in
/// the middle and one at the end, a fan-out (`send`) to an `llm` worker, two parallel branches
/// after it and a join, then `next`.
fn segment(i: usize, next: &str, y: &mut String, e: &mut String) {
    let v = format!("v{}", i % VKEYS);
    let chain = SEGMENT - 7;
    let mid = chain / 2;
    let schema = if i.is_multiple_of(2) {
        "{$ref: \"schemas/plan.json\"}".to_string()
    } else {
        "{type: object, required: [tasks, score, summary], properties: {tasks: {type: array, items: \
         {type: object, required: [name, weight], properties: {name: {type: string}, weight: {type: number}}}}, \
         score: {type: number}, summary: {type: string}}}"
            .to_string()
    };
    let _ = writeln!(
        y,
        "  s{i}_plan:\n    kind: llm\n    description: Plans segment {i}.\n    prompt: bench/plan.j2\n    \
         system: {{text: \"You plan segment {i} of {{{{ input.query }}}}.\"}}\n    temperature: 0.2\n    \
         output: {{format: json, schema: {schema}}}\n    update: {{tasks: \"output.tasks[:config.limits.fanout]\", \
         best: output.score, total_cost: usage.cost, {v}: output.summary}}"
    );
    for j in 0..chain {
        let update = match j % 4 {
            0 => format!("{{counter: config.step, {v}: \"state.{v} ~ '.' ~ (run.step | string)\"}}"),
            1 => format!("{{meta: \"{{'s{i}_c{j}': state.counter + 1}}\", log: \"['s{i}_c{j}: ' ~ state.{v}]\"}}"),
            2 => format!("{{tags: \"[input.query]\", ranked: \"[{{'score': state.best, 'name': 's{i}_c{j}'}}]\"}}"),
            _ => "{counter: \"state.tasks | length\", log: \"[run.node]\"}".to_string(),
        };
        let _ = writeln!(y, "  s{i}_c{j}: {{kind: set, update: {update}}}");
    }
    let _ = writeln!(
        y,
        "  s{i}_alt: {{kind: set, description: Over budget., update: {{log: \"['s{i} skipped']\", counter: 1}}}}"
    );
    let _ = writeln!(
        y,
        "  s{i}_fan: {{kind: set, update: {{meta: \"{{'fan{i}': state.tasks | length}}\"}}}}"
    );
    let _ = writeln!(
        y,
        "  s{i}_worker:\n    kind: llm\n    prompt: {{text: \"Work on {{{{ task.name }}}} (weight {{{{ task.weight }}}}) for \
         {{{{ input.query }}}}.\"}}\n    output: {{format: json, schema: {{type: object, required: [answer, score], \
         properties: {{answer: {{type: string}}, score: {{type: number}}}}}}}}\n    update: {{results: \"[output]\", \
         ranked: \"[{{'score': output.score, 'name': task.name}}]\", total_cost: usage.cost}}"
    );
    let _ = writeln!(
        y,
        "  s{i}_a: {{kind: llm, prompt: bench/review.j2, update: {{log: \"[output]\", total_cost: usage.cost}}}}"
    );
    let _ = writeln!(
        y,
        "  s{i}_b: {{kind: set, update: {{tags: \"['s{i}']\", counter: \"state.results | length\"}}}}"
    );
    let _ = writeln!(
        y,
        "  s{i}_join: {{kind: set, update: {{{v}: \"state.log | join(', ')\", best: \"state.ranked | length\"}}}}"
    );

    let names = |from: usize, to: usize| {
        (from..to)
            .map(|j| format!("s{i}_c{j}"))
            .collect::<Vec<_>>()
            .join(" -> ")
    };
    let _ = writeln!(e, "  - s{i}_plan -> {}", names(0, mid + 1));
    let _ = writeln!(
        e,
        "  - {{from: s{i}_c{mid}, route: [{{when: too_many, to: s{i}_c{}, label: skip ahead}}, {{to: s{i}_c{}}}]}}",
        chain - 1,
        mid + 1
    );
    let _ = writeln!(e, "  - {}", names(mid + 1, chain));
    let _ = writeln!(
        e,
        "  - from: s{i}_c{}\n    route:\n      - {{when: over_budget, to: s{i}_alt, label: budget}}\n      \
         - {{when: \"state.counter > config.limits.max_count * 2\", to: s{i}_alt}}\n      - {{to: s{i}_fan}}",
        chain - 1
    );
    if i.is_multiple_of(2) {
        let _ = writeln!(
            e,
            "  - {{from: s{i}_fan, send: {{to: s{i}_worker, foreach: state.tasks, as: task}}}}"
        );
    } else {
        let _ = writeln!(
            e,
            "  - from: s{i}_fan\n    route:\n      - {{when: has_tasks, send: {{to: s{i}_worker, foreach: state.tasks, as: task}}}}\n      \
             - {{to: [s{i}_a, s{i}_b]}}"
        );
    }
    let _ = writeln!(e, "  - {{from: s{i}_worker, to: [s{i}_a, s{i}_b]}}");
    let _ = writeln!(e, "  - {{from: [s{i}_a, s{i}_b], to: s{i}_join}}");
    let _ = writeln!(e, "  - s{i}_join -> {next}");
    let _ = writeln!(e, "  - s{i}_alt -> {next}");
}
