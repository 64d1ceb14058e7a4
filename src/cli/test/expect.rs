//! Comparing what a case did with what it expects: subset matches on values, the path of
//! nodes, visits and events. Every mismatch is one line naming where it is.

use serde_json::{Map, Value};

use super::suite::Expect;

/// What one case did.
pub(super) struct Observed {
    pub status: String,
    pub output: Value,
    pub state: Value,
    pub interrupt: Value,
    pub error: Option<String>,
    /// The top-level nodes run, step by step, in plan order within a step.
    pub path: Vec<String>,
    /// Every event, as its JSON form.
    pub events: Vec<Value>,
}

/// Every way `seen` differs from `expect`, one line each.
pub(super) fn check(expect: &Expect, seen: &Observed) -> Vec<String> {
    let mut out = vec![];
    if seen.status != expect.status {
        let why = match &seen.error {
            Some(e) => format!(" (error: {e})"),
            None => String::new(),
        };
        out.push(format!("status: expected {}, got {}{why}", expect.status, seen.status));
    }
    if let Some(want) = &expect.error_contains {
        match &seen.error {
            Some(e) if e.contains(want.as_str()) => {}
            Some(e) => out.push(format!(
                "error: expected it to contain {}, got {}",
                quote(want),
                quote(e)
            )),
            None => out.push(format!("error: expected one containing {}, got none", quote(want))),
        }
    }
    for (name, want, got) in [
        ("output", &expect.output, &seen.output),
        ("state", &expect.state, &seen.state),
        ("interrupt", &expect.interrupt, &seen.interrupt),
    ] {
        if let Some(want) = want {
            subset(want, got, name, &mut out);
        }
    }
    if let Some(want) = &expect.path
        && *want != seen.path
    {
        out.push(format!(
            "path: expected [{}]\n        got [{}]",
            want.join(", "),
            seen.path.join(", ")
        ));
    }
    for (node, n) in &expect.visits {
        let got = seen.path.iter().filter(|p| *p == node).count() as u64;
        if got != *n {
            out.push(format!("visits.{node}: expected {n}, got {got}"));
        }
    }
    for node in &expect.not_visited {
        if seen.path.contains(node) {
            out.push(format!("not_visited: `{node}` ran"));
        }
    }
    for (i, want) in expect.events.iter().enumerate() {
        event(i, want, &seen.events, &mut out);
    }
    out
}

/// Node names the expectations give that the workflow does not have, each explained: a typo
/// in `not_visited` would otherwise pass forever.
pub(super) fn unknown_nodes(expect: &Expect, nodes: &[&str]) -> Vec<String> {
    let mut out = vec![];
    let named = expect
        .path
        .iter()
        .flatten()
        .map(|n| ("path", n))
        .chain(expect.visits.keys().map(|n| ("visits", n)))
        .chain(expect.not_visited.iter().map(|n| ("not_visited", n)));
    for (field, name) in named {
        if nodes.contains(&name.as_str()) {
            continue;
        }
        let near = nodes
            .iter()
            .map(|k| (strsim::jaro_winkler(k, name), k))
            .filter(|(s, _)| *s > 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let help = match near {
            Some((_, k)) => format!("; did you mean `{k}`?"),
            None => String::new(),
        };
        let line = format!("{field}: `{name}` is not a node of the workflow{help}");
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

fn event(i: usize, want: &Map<String, Value>, events: &[Value], out: &mut Vec<String>) {
    let mut pattern = Map::new();
    for (k, v) in want {
        match k.as_str() {
            "count" => {}
            // Custom events carry their name in `event`; `name` reads better in a test.
            "name" => {
                pattern.insert("event".into(), v.clone());
            }
            _ => {
                pattern.insert(k.clone(), v.clone());
            }
        }
    }
    let pattern = Value::Object(pattern);
    let found = events
        .iter()
        .filter(|e| {
            let mut m = vec![];
            subset(&pattern, e, "", &mut m);
            m.is_empty()
        })
        .count() as u64;
    let shown = compact(&Value::Object(want.clone()));
    match want.get("count").and_then(Value::as_u64) {
        Some(n) if n != found => out.push(format!("events[{i}]: expected {n} events like {shown}, got {found}")),
        None if found == 0 => out.push(format!("events[{i}]: expected an event like {shown}, got none")),
        _ => {}
    }
}

/// Checks that `got` has everything `want` has: mappings may hold more keys, lists must have
/// the same length (each item matched the same way), `{$contains: x}` matches a list holding
/// items like each of `x` or a string containing each of `x`, and numbers compare by value.
pub(super) fn subset(want: &Value, got: &Value, at: &str, out: &mut Vec<String>) {
    match want {
        Value::Object(w) if w.len() == 1 && w.contains_key("$contains") => contains(&w["$contains"], got, at, out),
        Value::Object(w) => {
            let Value::Object(g) = got else {
                out.push(format!("{}: expected a mapping, got {}", label(at), short(got)));
                return;
            };
            for (k, wv) in w {
                let here = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                match g.get(k) {
                    Some(gv) => subset(wv, gv, &here, out),
                    None => out.push(format!(
                        "{here}: expected {}, got nothing (keys: {})",
                        short(wv),
                        g.keys().cloned().collect::<Vec<_>>().join(", ")
                    )),
                }
            }
        }
        Value::Array(w) => {
            let Value::Array(g) = got else {
                out.push(format!("{}: expected a list, got {}", label(at), short(got)));
                return;
            };
            if w.len() != g.len() {
                out.push(format!(
                    "{}: expected {} items, got {}: {}",
                    label(at),
                    w.len(),
                    g.len(),
                    short(got)
                ));
                return;
            }
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                subset(wv, gv, &format!("{at}[{i}]"), out);
            }
        }
        Value::Number(w) => {
            if !got.as_f64().is_some_and(|g| w.as_f64().is_some_and(|w| close(w, g))) {
                out.push(format!("{}: expected {}, got {}", label(at), want, short(got)));
            }
        }
        _ => {
            if want != got {
                out.push(format!("{}: expected {}, got {}", label(at), short(want), short(got)));
            }
        }
    }
}

/// Numbers are equal within a relative 1e-9, so sums of costs compare as written.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-3)
}

fn contains(want: &Value, got: &Value, at: &str, out: &mut Vec<String>) {
    let wanted: Vec<&Value> = match want {
        Value::Array(items) => items.iter().collect(),
        one => vec![one],
    };
    for w in wanted {
        let ok = match (w, got) {
            (Value::String(needle), Value::String(hay)) => hay.contains(needle.as_str()),
            (_, Value::Array(items)) => items.iter().any(|item| {
                let mut m = vec![];
                subset(w, item, at, &mut m);
                m.is_empty()
            }),
            _ => false,
        };
        if !ok {
            out.push(format!(
                "{}: expected it to contain {}, got {}",
                label(at),
                short(w),
                short(got)
            ));
        }
    }
}

fn label(at: &str) -> &str {
    if at.is_empty() { "value" } else { at }
}

/// A value on one line, cut to a readable length.
fn short(v: &Value) -> String {
    let s = compact(v);
    if s.chars().count() > 160 {
        format!("{}…", s.chars().take(160).collect::<String>())
    } else {
        s
    }
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn quote(s: &str) -> String {
    short(&Value::String(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn diff(want: Value, got: Value) -> Vec<String> {
        let mut out = vec![];
        subset(&want, &got, "output", &mut out);
        out
    }

    #[test]
    fn subsets_name_each_mismatched_path() {
        assert!(diff(json!({"a": 1}), json!({"a": 1.0, "b": 2})).is_empty());
        assert!(diff(json!(0.00105), json!(0.0010500000000000002)).is_empty());
        assert_eq!(diff(json!(0.00105), json!(0.00106)).len(), 1);
        assert_eq!(
            diff(
                json!({"a": {"b": "x"}, "c": [1]}),
                json!({"a": {"b": "y"}, "c": [1, 2]})
            ),
            [
                "output.a.b: expected \"x\", got \"y\"",
                "output.c: expected 1 items, got 2: [1,2]"
            ]
        );
        assert_eq!(
            diff(json!({"z": 1}), json!({"a": 1})),
            ["output.z: expected 1, got nothing (keys: a)"]
        );
    }

    #[test]
    fn contains_matches_items_and_substrings() {
        assert!(diff(json!({"$contains": [{"id": 2}]}), json!([{"id": 1}, {"id": 2, "x": 0}])).is_empty());
        assert!(diff(json!({"$contains": "pumps"}), json!("Heat pumps")).is_empty());
        assert_eq!(diff(json!({"$contains": "cold"}), json!("warm")).len(), 1);
    }
}
