//! `runner test --update`: the expectations of failing cases rewritten to what the cases did,
//! in the test file itself, everything else in the file left as written.
//!
//! What is rewritten: `status`, and each of `output`, `state`, `interrupt`, `path` and
//! `visits` that the case gives and that failed. A subset expectation stays a subset: the keys
//! it names get the values the run produced, keys the run did not produce are dropped, keys it
//! did not name stay unnamed. `events`, `not_visited` and `error_contains` are never rewritten:
//! they say what must or must not happen, which a run cannot decide.

use std::path::Path;

use serde_json::{Map, Value};

use super::expect::{Observed, subset};
use super::suite::Expect;
use crate::spec::load::{self, push_pointer};

/// The expectations of one failing case to rewrite, by key, with their new values.
pub(super) fn refreshed(expect: &Expect, seen: &Observed) -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    if seen.status != expect.status {
        out.push(("status", Value::String(seen.status.clone())));
    }
    for (name, want, got) in [
        ("output", &expect.output, &seen.output),
        ("state", &expect.state, &seen.state),
        ("interrupt", &expect.interrupt, &seen.interrupt),
    ] {
        if let Some(want) = want {
            let mut failures = Vec::new();
            subset(want, got, name, &mut failures);
            if !failures.is_empty() {
                out.push((name, refresh(want, got)));
            }
        }
    }
    if let Some(want) = &expect.path
        && *want != seen.path
    {
        out.push(("path", Value::from(seen.path.clone())));
    }
    if !expect.visits.is_empty() {
        let counts: Map<String, Value> = expect
            .visits
            .keys()
            .map(|node| {
                (
                    node.clone(),
                    Value::from(seen.path.iter().filter(|p| *p == node).count()),
                )
            })
            .collect();
        if expect.visits.iter().any(|(n, c)| counts[n] != *c) {
            out.push(("visits", Value::Object(counts)));
        }
    }
    out
}

/// `want` with the values `got` has where `want` names them.
fn refresh(want: &Value, got: &Value) -> Value {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) if !(w.len() == 1 && w.contains_key("$contains")) => Value::Object(
            w.iter()
                .filter_map(|(k, v)| Some((k.clone(), refresh(v, g.get(k)?))))
                .collect(),
        ),
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            Value::Array(w.iter().zip(g).map(|(w, g)| refresh(w, g)).collect())
        }
        _ => got.clone(),
    }
}

/// Rewrites the expectations of the cases `updates` names (by index in the file's `cases`) in
/// the test file at `path`. Block-style entries are replaced line by line (a value written as
/// JSON, which YAML reads as it is); a flow-style `expect: {...}` is rewritten whole.
pub(super) fn rewrite(path: &Path, updates: &[(usize, Vec<(&'static str, Value)>)]) -> anyhow::Result<()> {
    let file = load::read(path).map_err(|d| anyhow::anyhow!("{}: {}", path.display(), d.message))?;
    let doc = load::parse(file).map_err(|_| anyhow::anyhow!("{}: cannot read it again", path.display()))?;
    let mut lines: Vec<String> = doc.file.text.split('\n').map(str::to_string).collect();
    // Edits from the bottom of the file up, so the lines above keep their numbers.
    let mut edits: Vec<Edit> = Vec::new();
    for (case, keys) in updates {
        let at = format!("/cases/{case}/expect");
        let (Some(expect), Some(span)) = (doc.value.pointer(&at), doc.spans.value(&at)) else {
            continue;
        };
        let line = &lines[span.start.line as usize - 1];
        let flow = line.chars().nth(span.start.col as usize - 1).is_some_and(|c| c == '{');
        if flow {
            let mut whole = expect.as_object().cloned().unwrap_or_default();
            for (key, value) in keys {
                whole.insert(key.to_string(), value.clone());
            }
            let key_span = doc.spans.key(&at).unwrap_or(span);
            edits.push(Edit::replace(
                &lines,
                key_span.start.line,
                key_span.end.col,
                &Value::Object(whole),
            ));
            continue;
        }
        for (key, value) in keys {
            let pointer = push_pointer(&at, key);
            match doc.spans.key(&pointer).filter(|_| expect.get(*key).is_some()) {
                Some(k) => edits.push(Edit::replace(&lines, k.start.line, k.end.col, value)),
                // Not given (a status left to its default): a new first entry of `expect`.
                None => edits.push(Edit::insert(span.start.line, span.start.col, key, value)),
            }
        }
    }
    // On one line, the replacement before the insertion above it.
    edits.sort_by_key(|e| std::cmp::Reverse((e.line, e.remove)));
    for edit in edits {
        edit.apply(&mut lines);
    }
    std::fs::write(path, lines.join("\n"))?;
    Ok(())
}

/// One change of the file's lines: lines `line..line + remove` (1-based) replaced by `with`.
struct Edit {
    line: u32,
    remove: usize,
    with: Vec<String>,
}

impl Edit {
    /// The value of the entry whose key ends at `key_end_col` on `line` (and the lines
    /// indented below it) replaced by `value` on the key's line.
    fn replace(lines: &[String], line: u32, key_end_col: u32, value: &Value) -> Edit {
        let text = &lines[line as usize - 1];
        let key_end = text
            .char_indices()
            .nth(key_end_col as usize - 1)
            .map_or(text.len(), |(i, _)| i);
        let indent = indent_of(text);
        let mut remove = 1;
        for next in &lines[line as usize..] {
            if next.trim().is_empty() || indent_of(next) > indent {
                remove += 1;
            } else {
                break;
            }
        }
        // Blank lines after the value stay.
        while remove > 1 && lines[line as usize - 1 + remove - 1].trim().is_empty() {
            remove -= 1;
        }
        let head = text[..key_end].trim_end_matches([' ', ':']);
        Edit {
            line,
            remove,
            with: vec![format!("{head}: {}", json(value))],
        }
    }

    /// A new entry `key: value` as the first of the block mapping starting at `line`, `col`.
    fn insert(line: u32, col: u32, key: &str, value: &Value) -> Edit {
        Edit {
            line,
            remove: 0,
            with: vec![format!("{}{key}: {}", " ".repeat(col as usize - 1), json(value))],
        }
    }

    fn apply(self, lines: &mut Vec<String>) {
        let at = self.line as usize - 1;
        lines.splice(at..at + self.remove, self.with);
    }
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// A value as one line of YAML: JSON, which YAML reads as the same value.
fn json(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
