//! A JSON reply the server cut at its completion cap (`finish_reason: length`, Anthropic's
//! `max_tokens`): the ways to close it. A reply cut inside a trailing string is closed where
//! it stops; one cut inside a list or an object is closed after its last complete value.
//! Whether a closed reply is kept is the schema's call, made by the node.

/// Texts that close `reply`, best first: the reply closed where it stops (the string it was
/// cut in ended there), then the reply cut back to its last complete value and closed. Empty
/// when the reply is not the beginning of a JSON object or list (a Markdown fence before it is
/// skipped).
pub(super) fn closings(reply: &str) -> Vec<String> {
    let text = strip_fence(reply);
    if !matches!(text.as_bytes().first(), Some(b'{' | b'[')) {
        return Vec::new();
    }
    let scan = scan(text);
    let mut out = Vec::new();
    if let Some(end) = scan.in_place {
        let mut closed = text[..end].to_string();
        if scan.in_string {
            closed.push('"');
        }
        closed.push_str(&closers(&scan.open));
        out.push(closed);
    }
    if let Some((end, open)) = scan.last_complete {
        let closed = format!("{}{}", &text[..end], closers(&open));
        if !out.contains(&closed) {
            out.push(closed);
        }
    }
    out
}

/// The reply without a Markdown code fence opened before it (a cut reply never closes it).
fn strip_fence(reply: &str) -> &str {
    let t = reply.trim_start();
    let t = t.strip_prefix("```json").or_else(|| t.strip_prefix("```")).unwrap_or(t);
    t.trim_start()
}

/// What a container still expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// An object's key (after `{` or a comma).
    Key,
    /// The colon after a key.
    Colon,
    /// A value (after a colon, after `[` or a comma in a list).
    Value,
    /// A comma or the container's end.
    Next,
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    object: bool,
    expect: Expect,
}

/// Where a cut reply can be closed.
#[derive(Debug, Default)]
struct Scan {
    /// Containers still open at the end, outermost first (true: an object).
    open: Vec<bool>,
    /// The reply ends inside a string value.
    in_string: bool,
    /// The reply can be closed where it stops: up to here (a partial escape dropped), closing
    /// its string if it is in one. None when it stops after a key, a colon or a comma.
    in_place: Option<usize>,
    /// The end of the last complete value inside a container, with the containers open there.
    last_complete: Option<(usize, Vec<bool>)>,
}

fn closers(open: &[bool]) -> String {
    open.iter()
        .rev()
        .map(|&object| if object { '}' } else { ']' })
        .collect()
}

fn scan(text: &str) -> Scan {
    let bytes = text.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    let mut last_complete = None;
    // Inside a string: whether it is a key, where its pending escape began, hex digits left.
    let mut string: Option<bool> = None;
    let mut escape: Option<usize> = None;
    let mut hex_left = 0;
    let mut scalar = false;
    let kinds = |stack: &[Frame]| stack.iter().map(|f| f.object).collect::<Vec<_>>();
    // A value ended at `end`: its container expects a comma or its end.
    let ended = |stack: &mut Vec<Frame>, end: usize, last: &mut Option<(usize, Vec<bool>)>| {
        if let Some(top) = stack.last_mut() {
            top.expect = Expect::Next;
            *last = Some((end, kinds(stack)));
        }
    };
    for (i, &b) in bytes.iter().enumerate() {
        if let Some(key) = string {
            if hex_left > 0 {
                hex_left -= 1;
                if hex_left == 0 {
                    escape = None;
                }
            } else if escape.is_some() {
                if b == b'u' {
                    hex_left = 4;
                } else {
                    escape = None;
                }
            } else if b == b'\\' {
                escape = Some(i);
            } else if b == b'"' {
                string = None;
                if key {
                    if let Some(top) = stack.last_mut() {
                        top.expect = Expect::Colon;
                    }
                } else {
                    ended(&mut stack, i + 1, &mut last_complete);
                }
            }
            continue;
        }
        if scalar {
            if b.is_ascii_whitespace() || matches!(b, b',' | b']' | b'}') {
                scalar = false;
                ended(&mut stack, i, &mut last_complete);
            } else {
                continue;
            }
        }
        match b {
            b'{' | b'[' => {
                stack.push(Frame {
                    object: b == b'{',
                    expect: if b == b'{' { Expect::Key } else { Expect::Value },
                });
                // An empty container is a complete value of its parent once closed.
                last_complete = Some((i + 1, kinds(&stack)));
            }
            b'}' | b']' => {
                stack.pop();
                ended(&mut stack, i + 1, &mut last_complete);
                if stack.is_empty() {
                    // A whole value: the reply was not cut inside it.
                    return Scan::default();
                }
            }
            b'"' => {
                let key = stack.last().is_some_and(|f| f.object && f.expect == Expect::Key);
                string = Some(key);
            }
            b':' => {
                if let Some(top) = stack.last_mut() {
                    top.expect = Expect::Value;
                }
            }
            b',' => {
                if let Some(top) = stack.last_mut() {
                    top.expect = if top.object { Expect::Key } else { Expect::Value };
                }
            }
            b if b.is_ascii_whitespace() => {}
            _ => scalar = true,
        }
    }
    let in_string = string == Some(false);
    let expect = stack.last().map(|f| f.expect);
    let in_place = if in_string {
        Some(escape.unwrap_or(bytes.len()))
    } else if string.is_none() && (scalar || expect == Some(Expect::Next)) {
        Some(bytes.len())
    } else {
        None
    };
    Scan {
        open: kinds(&stack),
        in_string,
        in_place,
        last_complete,
    }
}

#[cfg(test)]
mod tests {
    use super::closings;

    fn parsed(reply: &str) -> Vec<serde_json::Value> {
        closings(reply)
            .iter()
            .filter_map(|t| serde_json::from_str(t).ok())
            .collect()
    }

    #[test]
    fn a_string_cut_mid_way_is_closed_where_it_stops() {
        assert_eq!(
            parsed(r#"{"summary": "Heat pumps move heat", "points": ["one", "tw"#)[0],
            serde_json::json!({"summary": "Heat pumps move heat", "points": ["one", "tw"]})
        );
        assert_eq!(
            parsed(
                r#"```json
{"a": "x\u00"#
            )[0],
            serde_json::json!({"a": "x"}),
            "a partial escape is dropped"
        );
    }

    #[test]
    fn a_list_cut_after_a_comma_or_a_key_ends_at_its_last_complete_value() {
        assert_eq!(
            parsed(r#"{"a": [1, 2, {"b": 3}, "#),
            [serde_json::json!({"a": [1, 2, {"b": 3}]})]
        );
        assert_eq!(
            parsed(r#"{"a": "x", "b"#),
            [serde_json::json!({"a": "x"})],
            "a cut key is dropped, never closed as a value"
        );
        assert_eq!(parsed(r#"{"a": ["#), [serde_json::json!({"a": []})]);
        assert_eq!(parsed(r#"[{"n": 12"#)[0], serde_json::json!([{"n": 12}]));
    }

    #[test]
    fn whole_values_and_prose_have_nothing_to_close() {
        assert!(closings(r#"{"a": 1}"#).is_empty());
        assert!(closings("Sure! Here it is").is_empty());
    }
}
