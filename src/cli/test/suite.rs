//! Reading a `*.test.yaml` file into a [`Suite`]: every problem is collected, each with its
//! file:line:col, before anything runs.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::{Map, Value};

use crate::spec::load::{self, Document, push_pointer};

/// A test file: one workflow and its cases.
#[derive(Debug)]
pub(super) struct Suite {
    pub path: PathBuf,
    pub workflow: PathBuf,
    pub cases: Vec<Case>,
}

/// One case: how to run the workflow and what must come out.
#[derive(Debug)]
pub(super) struct Case {
    /// Its place in the file's `cases`.
    pub index: usize,
    pub name: String,
    /// The line the case starts on in its file.
    pub line: Option<u32>,
    pub input: Value,
    pub context: Value,
    pub set: Vec<(String, Value)>,
    pub models: Models,
    pub answers: Vec<Value>,
    pub recursion_limit: Option<u32>,
    pub expect: Expect,
}

/// Where a case's model replies come from.
#[derive(Debug)]
pub(super) enum Models {
    /// No script: mock profiles fail each call, saying that no reply is scripted.
    None,
    /// A mock script given inline.
    Mock(Value),
    /// A mock script file.
    MockFile(PathBuf),
    /// A recorded cassette, replayed.
    Cassette(PathBuf),
}

/// What a case checks. Every part but `status` is optional.
#[derive(Debug, Default)]
pub(super) struct Expect {
    /// `done`, `interrupted` or `failed` (default `done`).
    pub status: String,
    pub output: Option<Value>,
    pub state: Option<Value>,
    pub interrupt: Option<Value>,
    pub path: Option<Vec<String>>,
    pub visits: IndexMap<String, u64>,
    pub not_visited: Vec<String>,
    pub events: Vec<Map<String, Value>>,
    pub error_contains: Option<String>,
}

const TOP: &[&str] = &["workflow", "description", "cases"];
const CASE: &[&str] = &[
    "name",
    "description",
    "input",
    "input_file",
    "context",
    "set",
    "mock",
    "mock_file",
    "cassette",
    "answers",
    "recursion_limit",
    "expect",
];
const EXPECT: &[&str] = &[
    "status",
    "output",
    "state",
    "interrupt",
    "path",
    "visits",
    "not_visited",
    "events",
    "error_contains",
];
const STATUSES: &[&str] = &["done", "interrupted", "failed"];

/// Problems found in test files, each `file:line:col: message`.
struct Problems<'a> {
    doc: &'a Document,
    found: Vec<String>,
}

impl Problems<'_> {
    fn at(&mut self, pointer: &str, message: impl std::fmt::Display) {
        let file = self.doc.file.path.display();
        match self.doc.spans.key(pointer) {
            Some(s) => self
                .found
                .push(format!("{file}:{}:{}: {message}", s.start.line, s.start.col)),
            None => self.found.push(format!("{file}: {message}")),
        }
    }

    /// Unknown keys of the mapping at `pointer`, with "did you mean".
    fn keys(&mut self, map: &Map<String, Value>, pointer: &str, known: &[&str], what: &str) {
        for key in map.keys() {
            if known.contains(&key.as_str()) {
                continue;
            }
            let near = known
                .iter()
                .map(|k| (strsim::jaro_winkler(k, key), k))
                .filter(|(s, _)| *s > 0.8)
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let help = match near {
                Some((_, k)) => format!("; did you mean `{k}`?"),
                None => format!(" (expected one of: {})", known.join(", ")),
            };
            self.at(
                &push_pointer(pointer, key),
                format!("unknown field `{key}` in {what}{help}"),
            );
        }
    }
}

/// Reads and checks a test file. On failure, every problem found.
pub(super) fn read(path: &Path) -> Result<Suite, Vec<String>> {
    let file = load::read(path).map_err(|d| vec![format!("{}: {}", path.display(), d.message)])?;
    let doc = load::parse(file).map_err(|ds| {
        ds.iter()
            .map(|d| match d.span {
                Some(s) => format!("{}:{}:{}: {}", path.display(), s.start.line, s.start.col, d.message),
                None => format!("{}: {}", path.display(), d.message),
            })
            .collect::<Vec<_>>()
    })?;
    let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
    let mut p = Problems {
        doc: &doc,
        found: vec![],
    };
    let Some(top) = doc.value.as_object() else {
        p.at("", "a test file is a mapping with `workflow` and `cases`");
        return Err(p.found);
    };
    p.keys(top, "", TOP, "a test file");
    let workflow = match top.get("workflow") {
        Some(Value::String(w)) => {
            let w = dir.join(w);
            if !w.is_file() {
                p.at("/workflow", format!("the workflow {} does not exist", w.display()));
            }
            w
        }
        Some(_) => {
            p.at("/workflow", "`workflow` is a path, relative to the test file");
            PathBuf::new()
        }
        None => {
            p.at("", "missing `workflow`: the workflow file, relative to the test file");
            PathBuf::new()
        }
    };
    let mut cases = vec![];
    match top.get("cases") {
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut names = std::collections::HashSet::new();
            for (i, item) in items.iter().enumerate() {
                let at = format!("/cases/{i}");
                if let Some(mut case) = read_case(&mut p, &dir, item, &at) {
                    case.index = i;
                    if !names.insert(case.name.clone()) {
                        p.at(&format!("{at}/name"), format!("two cases are named `{}`", case.name));
                    }
                    cases.push(case);
                }
            }
        }
        _ => p.at("/cases", "`cases` is a non-empty list of cases"),
    }
    if p.found.is_empty() {
        Ok(Suite {
            path: path.to_path_buf(),
            workflow,
            cases,
        })
    } else {
        Err(p.found)
    }
}

fn read_case(p: &mut Problems<'_>, dir: &Path, item: &Value, at: &str) -> Option<Case> {
    let Some(c) = item.as_object() else {
        p.at(at, "a case is a mapping with `name` and `expect`");
        return None;
    };
    p.keys(c, at, CASE, "a case");
    let name = match c.get("name") {
        Some(Value::String(n)) if !n.trim().is_empty() => n.clone(),
        _ => {
            p.at(at, "a case needs a `name` (a non-empty string)");
            String::new()
        }
    };
    let mut input = match c.get("input") {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            p.at(&format!("{at}/input"), "`input` is a mapping of input fields");
            Value::Object(Map::new())
        }
    };
    if let Some(f) = c.get("input_file") {
        match f.as_str().map(|f| read_data(&dir.join(f))) {
            Some(Ok(Value::Object(from_file))) => {
                // Fields given inline win over the file's.
                let mut merged = from_file;
                if let Value::Object(inline) = input {
                    merged.extend(inline);
                }
                input = Value::Object(merged);
            }
            Some(Ok(_)) => p.at(&format!("{at}/input_file"), "the input file must hold a mapping"),
            Some(Err(e)) => p.at(&format!("{at}/input_file"), e),
            None => p.at(
                &format!("{at}/input_file"),
                "`input_file` is a path, relative to the test file",
            ),
        }
    }
    let context = match c.get("context") {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            p.at(&format!("{at}/context"), "`context` is a mapping");
            Value::Object(Map::new())
        }
    };
    let set = match c.get("set") {
        None => vec![],
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Some(_) => {
            p.at(
                &format!("{at}/set"),
                "`set` maps config paths to values, like `--set path=value`",
            );
            vec![]
        }
    };
    let given: Vec<&str> = ["mock", "mock_file", "cassette"]
        .into_iter()
        .filter(|k| c.contains_key(*k))
        .collect();
    if given.len() > 1 {
        p.at(
            &format!("{at}/{}", given[1]),
            format!(
                "a case takes one of `mock`, `mock_file` and `cassette`, not `{}` and `{}`",
                given[0], given[1]
            ),
        );
    }
    let path_of = |p: &mut Problems<'_>, key: &str| -> PathBuf {
        match c.get(key).and_then(Value::as_str) {
            Some(f) => {
                let f = dir.join(f);
                if !f.is_file() {
                    p.at(&format!("{at}/{key}"), format!("{} does not exist", f.display()));
                }
                f
            }
            None => {
                p.at(
                    &format!("{at}/{key}"),
                    format!("`{key}` is a path, relative to the test file"),
                );
                PathBuf::new()
            }
        }
    };
    let models = match given.first().copied() {
        Some("mock") => {
            let script = c.get("mock").cloned().unwrap_or_default();
            if let Err(e) = crate::providers::mock::MockProvider::from_value(&script) {
                p.at(&format!("{at}/mock"), format!("mock script: {e}"));
            }
            Models::Mock(script)
        }
        Some("mock_file") => Models::MockFile(path_of(p, "mock_file")),
        Some("cassette") => Models::Cassette(path_of(p, "cassette")),
        _ => Models::None,
    };
    let answers = match c.get("answers") {
        None => vec![],
        Some(Value::Array(a)) => a.clone(),
        Some(_) => {
            p.at(
                &format!("{at}/answers"),
                "`answers` is a list: one answer per interrupt, in order",
            );
            vec![]
        }
    };
    let recursion_limit = match c.get("recursion_limit") {
        None => None,
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => Some(n),
            None => {
                p.at(
                    &format!("{at}/recursion_limit"),
                    "`recursion_limit` is a positive integer",
                );
                None
            }
        },
    };
    let expect = match c.get("expect") {
        Some(Value::Object(e)) => read_expect(p, e, &format!("{at}/expect")),
        Some(_) => {
            p.at(
                &format!("{at}/expect"),
                "`expect` is a mapping (status, output, state, path, ...)",
            );
            Expect::default()
        }
        None => {
            p.at(at, "a case needs `expect` (at least `status: done`)");
            Expect::default()
        }
    };
    Some(Case {
        index: 0,
        name,
        line: p.doc.spans.value(at).map(|s| s.start.line),
        input,
        context,
        set,
        models,
        answers,
        recursion_limit,
        expect,
    })
}

fn read_expect(p: &mut Problems<'_>, e: &Map<String, Value>, at: &str) -> Expect {
    p.keys(e, at, EXPECT, "`expect`");
    let here = |key: &str| format!("{at}/{key}");
    let status = match e.get("status") {
        None => "done".to_string(),
        Some(Value::String(s)) if STATUSES.contains(&s.as_str()) => s.clone(),
        Some(_) => {
            p.at(&here("status"), format!("`status` is one of {}", STATUSES.join(", ")));
            "done".to_string()
        }
    };
    let names = |p: &mut Problems<'_>, key: &str| -> Option<Vec<String>> {
        let v = e.get(key)?;
        let list = v.as_array().and_then(|a| {
            a.iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        });
        if list.is_none() {
            p.at(&here(key), format!("`{key}` is a list of node names"));
        }
        list
    };
    let path = names(p, "path");
    let not_visited = names(p, "not_visited").unwrap_or_default();
    let mut visits = IndexMap::new();
    match e.get("visits") {
        None => {}
        Some(Value::Object(m)) => {
            for (node, n) in m {
                match n.as_u64() {
                    Some(n) => {
                        visits.insert(node.clone(), n);
                    }
                    None => p.at(&push_pointer(&here("visits"), node), "a visit count is an integer"),
                }
            }
        }
        Some(_) => p.at(&here("visits"), "`visits` maps node names to how often they ran"),
    }
    let mut events = vec![];
    match e.get("events") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let at = format!("{}/{i}", here("events"));
                match item.as_object() {
                    Some(m) if m.get("type").is_some_and(Value::is_string) => {
                        if m.get("count").is_some_and(|c| !c.is_u64()) {
                            p.at(&push_pointer(&at, "count"), "`count` is an integer");
                        }
                        events.push(m.clone());
                    }
                    _ => p.at(
                        &at,
                        "an event expectation is a mapping with a `type` (custom, token, error, ...)",
                    ),
                }
            }
        }
        Some(_) => p.at(&here("events"), "`events` is a list of event expectations"),
    }
    let error_contains = match e.get("error_contains") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            p.at(&here("error_contains"), "`error_contains` is a string");
            None
        }
    };
    Expect {
        status,
        output: e.get("output").cloned(),
        state: e.get("state").cloned(),
        interrupt: e.get("interrupt").cloned(),
        path,
        visits,
        not_visited,
        events,
        error_contains,
    }
}

fn read_data(path: &Path) -> Result<Value, String> {
    let file = load::read(path).map_err(|d| format!("{}: {}", path.display(), d.message))?;
    let doc = load::parse(file).map_err(|d| {
        format!(
            "{}: {}",
            path.display(),
            d.first().map(|d| d.message.clone()).unwrap_or_default()
        )
    })?;
    Ok(doc.value)
}

/// The JSON Schema of test files (schemas/test.schema.json, for editors) lists exactly the
/// keys the reader accepts.
#[cfg(test)]
mod schema_tests {
    use super::*;

    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v["properties"].as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    fn sorted(k: &[&str]) -> Vec<String> {
        let mut k: Vec<String> = k.iter().map(|s| s.to_string()).collect();
        k.sort();
        k
    }

    #[test]
    fn the_test_file_schema_lists_the_keys_read() {
        let schema: Value = serde_json::from_str(include_str!("../../../schemas/test.schema.json")).unwrap();
        assert_eq!(keys(&schema), sorted(TOP));
        assert_eq!(keys(&schema["$defs"]["case"]), sorted(CASE));
        assert_eq!(keys(&schema["$defs"]["expect"]), sorted(EXPECT));
        assert_eq!(
            schema["$defs"]["expect"]["properties"]["status"]["enum"],
            serde_json::json!(STATUSES)
        );
    }
}
