//! No input panics the loader or the compiler.
//!
//! Three generators — arbitrary bytes, strings of YAML-ish tokens, and mutations of a valid
//! workflow — feed `spec::load::{from_bytes, parse}` and the whole compile of a temp file. The
//! property: nothing panics; the loader returns a document or a non-empty list of diagnostics;
//! every diagnostic names its file and a position inside it; the compiler produces a plan
//! exactly when it reports no error; and rendering the diagnostics does not panic either.
//!
//! The default case count is modest; for a long run: `PROPTEST_CASES=20000 cargo test
//! --release --test integration loader_props::`.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use runner::compile::{Compiler, compile_file};
use runner::diag::{self, Diagnostic, Format};
use runner::spec::load;

/// A small valid workflow touching most of the language, for the mutation generator.
const VALID: &str = r##"name: props
input: {type: object, properties: {query: {type: string}}}
config: {limit: 3}
models:
  default: {provider: mock, model: m}
types:
  Topic: {type: object, properties: {title: {type: string}}}
state:
  topics: {type: array, items: {$ref: "#/types/Topic"}, default: []}
  notes: {type: array, reducer: append, default: []}
  answer: {type: string, default: ""}
  errors: {type: array, reducer: append, default: []}
predicates:
  enough: "state.notes | length >= config.limit"
kinds:
  writer:
    extends: llm
    params:
      style: {type: string, enum: [brief, long], default: brief}
    with: {prompt: {text: "Write, {{ params.style }}, about {{ topic.title }}"}}
nodes:
  plan:
    kind: llm
    prompt: {text: "Plan {{ input.query }}"}
    output: {format: json, schema: {type: object, properties: {topics: {type: array}}}}
    update: {topics: output.topics}
    on_error: {to: fail, update: {errors: "[error.message]"}}
  work: {kind: writer, params: {style: long}, update: {notes: "[output]"}}
  gate:
    kind: interrupt
    message: "Enough?"
    response: {type: object, required: [ok], properties: {ok: {type: boolean}}}
    goto:
      - {when: "output.ok", to: write}
      - {to: plan}
  write: {kind: set, update: {answer: "state.notes | join(' ')"}}
  fail: {kind: set, update: {answer: "'failed'"}}
edges:
  - START -> plan
  - {from: plan, send: {to: work, foreach: state.topics, as: topic}}
  - from: work
    route:
      - {when: enough, to: gate}
      - {to: END}
  - write -> END
  - fail -> END
"##;

const TOKENS: &[&str] = &[
    ":",
    ": ",
    "-",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a",
    "*a",
    "&b",
    "*b",
    "!tag",
    "!!str",
    "\"",
    "'",
    "#",
    "\n",
    "\r\n",
    "\t",
    " ",
    "  ",
    "    ",
    "---",
    "...",
    "?",
    "|",
    ">",
    "%YAML 1.2",
    "~",
    "null",
    ".nan",
    "1e400",
    "0x1F",
    "name",
    "nodes",
    "edges",
    "kind",
    "state",
    "llm",
    "set",
    "START",
    "END",
    "->",
    "START -> a",
    "a -> END",
    "a",
    "b",
    "route",
    "when",
    "to",
    "send",
    "foreach",
    "update",
    "reducer",
    "append",
    "prompt",
    "text",
    "{{",
    "}}",
    "{%",
    "%}",
    "${env:",
    "$ref",
    "#/types/T",
    "é",
    "\u{feff}",
    "\0",
];

fn yamlish() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..80).prop_map(|t| t.concat())
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    Insert { line: usize, at: usize, c: char },
    Indent(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let insertable = prop_oneof![
        prop::sample::select(
            &[
                ':', '-', '[', ']', '{', '}', '"', '\'', '#', '&', '*', '!', '\t', ' ', '\n', '|', '>', '%', '@', '`'
            ][..]
        ),
        any::<char>(),
    ];
    prop_oneof![
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Duplicate),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        (any::<usize>(), any::<usize>(), insertable).prop_map(|(line, at, c)| Mutation::Insert { line, at, c }),
        (any::<usize>(), 0..6usize).prop_map(|(l, n)| Mutation::Indent(l, n)),
    ]
}

fn mutate(mutations: &[Mutation]) -> String {
    let mut lines: Vec<String> = VALID.lines().map(str::to_string).collect();
    for m in mutations {
        if lines.is_empty() {
            break;
        }
        let n = lines.len();
        match *m {
            Mutation::Delete(i) => {
                lines.remove(i % n);
            }
            Mutation::Duplicate(i) => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Mutation::Swap(a, b) => lines.swap(a % n, b % n),
            Mutation::Insert { line, at, c } => {
                let l = &mut lines[line % n];
                let chars: Vec<char> = l.chars().collect();
                let at = at % (chars.len() + 1);
                *l = chars[..at].iter().chain([c].iter()).chain(chars[at..].iter()).collect();
            }
            Mutation::Indent(i, k) => {
                let l = &mut lines[i % n];
                *l = format!("{}{}", " ".repeat(k), l.trim_start());
            }
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// A diagnostic names its file, and its position (if any) lies within the text or just past
/// its end (the YAML parser reports "unexpected end of input" on the line after the last).
fn well_placed(d: &Diagnostic, text: Option<&str>) -> Result<(), TestCaseError> {
    prop_assert!(d.file.is_some(), "no file: {:?}", d);
    if let (Some(span), Some(text)) = (d.span, text) {
        let lines = text.split('\n').count() as u32;
        prop_assert!(
            span.start.line >= 1 && span.start.line <= lines + 1,
            "line out of range ({} lines): {:?}",
            lines,
            d
        );
        prop_assert!(span.start.col >= 1, "column 0: {:?}", d);
    }
    Ok(())
}

/// The loader on raw bytes: a document, or diagnostics that say where.
fn check_loader(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let path: Arc<Path> = Arc::from(Path::new("prop.yaml"));
    let text = String::from_utf8(bytes.clone()).ok();
    let file = match load::from_bytes(path, bytes) {
        Ok(f) => f,
        Err(d) => {
            prop_assert!(
                text.is_none() || d.code == diag::Code::TooLarge,
                "valid UTF-8 refused: {:?}",
                d
            );
            return well_placed(&d, None);
        }
    };
    prop_assert_eq!(Some(&*file.text), text.as_deref());
    if let Err(diags) = load::parse(file.clone()) {
        prop_assert!(!diags.is_empty(), "an error without diagnostics");
        for d in &diags {
            well_placed(d, Some(&file.text))?;
        }
    }
    Ok(())
}

/// The whole compile of a temp file, and the rendering of what it reports.
fn check_compile(bytes: &[u8]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let path = dir.path().join("prop.yaml");
    std::fs::write(&path, bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let text = std::str::from_utf8(bytes).ok();

    let mut checker = Compiler::new(runner::nodes::builtin().decls());
    checker.check(&path);
    let checked = checker.finish();
    for d in &checked.diagnostics {
        well_placed(d, text)?;
    }

    let (plan, result) = compile_file(&path, &runner::nodes::builtin().decls());
    for d in &result.diagnostics {
        well_placed(d, text)?;
    }
    prop_assert!(
        plan.is_some() == (result.errors() == 0),
        "a plan exactly when there is no error: plan: {}, {:?}",
        plan.is_some(),
        result.diagnostics
    );
    for format in [Format::Human, Format::Github] {
        let out = diag::render(&result.diagnostics, &result.files, format);
        prop_assert_eq!(out.is_empty(), result.diagnostics.is_empty());
    }
    let json = diag::render(&result.diagnostics, &result.files, Format::Json);
    let parsed: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| TestCaseError::fail(format!("{e}: {json}")))?;
    prop_assert_eq!(
        parsed["diagnostics"].as_array().map(Vec::len),
        Some(result.diagnostics.len())
    );
    Ok(())
}

proptest! {
    // Failures are not persisted to a file: a minimized failure becomes a fixture or a named
    // regression test below instead.
    #![proptest_config(crate::props::config(256))]

    #[test]
    fn loader_survives_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_loader(bytes)?;
    }

    #[test]
    fn loader_survives_yamlish_text(text in yamlish()) {
        check_loader(text.into_bytes())?;
    }

    #[test]
    fn loader_survives_mutated_workflows(m in prop::collection::vec(mutation(), 1..6)) {
        check_loader(mutate(&m).into_bytes())?;
    }

    #[test]
    fn compiler_survives_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_compile(&bytes)?;
    }

    #[test]
    fn compiler_survives_yamlish_text(text in yamlish()) {
        check_compile(text.as_bytes())?;
    }

    #[test]
    fn compiler_survives_mutated_workflows(m in prop::collection::vec(mutation(), 1..6)) {
        check_compile(mutate(&m).as_bytes())?;
    }
}

#[test]
fn the_unmutated_workflow_compiles() {
    // Mutations start from a valid workflow, or they would test only one error path.
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("valid.yaml");
    std::fs::write(&path, VALID).expect("write");
    let (plan, result) = compile_file(&path, &runner::nodes::builtin().decls());
    assert!(
        plan.is_some() && result.diagnostics.is_empty(),
        "{:#?}",
        result.diagnostics
    );
    assert_eq!(mutate(&[]), VALID);
}

/// Error codes of the schema check (stage E100–E103).
#[test]
fn a_schema_error_alone_bars_a_plan() {
    // Found by `compiler_survives_mutated_workflows` (one ':' inserted into `update:`): the
    // schema reported the unknown field, yet a plan was built from the rest of the file.
    let text = VALID.replacen(
        "    update: {topics: output.topics}",
        "    u:pdate: {topics: output.topics}",
        1,
    );
    assert_ne!(text, VALID);
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("mutated.yaml");
    std::fs::write(&path, &text).expect("write");
    let (plan, result) = compile_file(&path, &runner::nodes::builtin().decls());
    let codes: Vec<_> = result.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, vec![diag::Code::UnknownField]);
    assert!(plan.is_none(), "a workflow with a schema error has no plan");
}
