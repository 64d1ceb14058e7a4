//! Positions inside a string scalar: where a part of the value YAML decoded stands in the file.
//!
//! An expression or inline template is a YAML string, and a defect in it has a byte range in
//! the decoded string. YAML may have moved that text about on its way from the file: a quoted
//! scalar drops its quotes and escapes, a literal block scalar (`|`) its indentation, a folded
//! one (`>`) and a multi-line plain or quoted scalar also turn line breaks into spaces. The
//! decoded string is walked alongside the file's text from the scalar's start: whitespace the
//! file has and the value lacks (indentation, folded breaks), quotes, and escape sequences are
//! stepped over, and every other character of the value must be the next such character of the
//! file. A value that cannot be walked so (it was not written as it reads) gives no position,
//! and the caller keeps the whole value's span.

use std::ops::Range;

use crate::diag::{Pos, Span};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// Plain or block: no quotes, no escapes.
    Bare,
    Single,
    Double,
}

/// Where bytes `range` of `value` (the string the scalar at `span` of `text` decodes to)
/// stand in `text`: from the first character of the range to just past its last when both are
/// on one line, else to the end of the first line's part. `None` when the walk fails.
pub fn locate(text: &str, span: Span, value: &str, range: Range<usize>) -> Option<Span> {
    if range.start > range.end || range.end > value.len() {
        return None;
    }
    let from = offset_of(text, span.start)?;
    walk(text, from, value, &range).or_else(|| {
        // A block scalar's content may start with indentation it keeps, before where the
        // parser marks its start: walk it from the start of its line.
        let line_start = text[..from].rfind('\n').map_or(0, |i| i + 1);
        (line_start < from && text[line_start..from].trim().is_empty())
            .then(|| walk(text, line_start, value, &range))
            .flatten()
    })
}

/// [`locate`] with the scalar starting at byte `p` of `text`.
fn walk(text: &str, mut p: usize, value: &str, range: &Range<usize>) -> Option<Span> {
    let first = text[p..].chars().next()?;
    let style = match first {
        '"' => Style::Double,
        '\'' => Style::Single,
        _ => Style::Bare,
    };
    if style != Style::Bare {
        p += 1;
    } else if (first == '|' || first == '>') && !value.starts_with(first) {
        // A block scalar's header: its content starts on the next line.
        p += text[p..].find('\n')? + 1;
    }
    let mut start = None;
    let mut last = None;
    for (i, d) in value.char_indices() {
        if i >= range.end.max(range.start + 1) {
            break;
        }
        let at = walk_to(text, &mut p, d, style)?;
        if i == range.start {
            start = Some(at);
        }
        if i < range.end {
            last = Some(at);
        }
    }
    let start = match start {
        Some(s) => s,
        // An empty range at the end of the value: just past its last character.
        None if range.start == value.len() => p,
        None => return None,
    };
    let begin = pos_of(text, start);
    let end = match last {
        Some(l) if range.end > range.start => {
            let c = text[l..].chars().next()?;
            let end = pos_of(text, l + c.len_utf8());
            if end.line == begin.line {
                end
            } else {
                // Across a line break: to the end of the first line.
                let line_end = text[start..].find('\n').map_or(text.len(), |n| start + n);
                pos_of(text, line_end)
            }
        }
        _ => begin,
    };
    Some(Span { start: begin, end })
}

/// Advances `p` past what the file has before the value's next character `d`, and past `d`
/// itself; returns where `d` stands. `None` when the file does not go on with `d`.
fn walk_to(text: &str, p: &mut usize, d: char, style: Style) -> Option<usize> {
    loop {
        let rest = &text[*p..];
        let s = rest.chars().next()?;
        match style {
            Style::Double if s == '\\' => {
                let (decoded, len) = escape(rest)?;
                let at = *p;
                *p += len;
                match decoded {
                    Some(c) if c == d => return Some(at),
                    Some(_) => return None,
                    // An escaped line break: nothing of the value.
                    None => continue,
                }
            }
            Style::Double if s == '"' => return None,
            Style::Single if s == '\'' => {
                // `''` is one quote; a lone quote closes the scalar.
                if d == '\'' && rest[1..].starts_with('\'') {
                    let at = *p;
                    *p += 2;
                    return Some(at);
                }
                return None;
            }
            _ => {}
        }
        if s == d {
            let at = *p;
            *p += s.len_utf8();
            return Some(at);
        }
        match s {
            // A folded line break reads as a space.
            '\n' if d == ' ' => {
                let at = *p;
                *p += 1;
                return Some(at);
            }
            ' ' | '\t' | '\n' | '\r' => *p += 1,
            _ => return None,
        }
    }
}

/// A double-quoted scalar's escape sequence at the start of `s` (which starts with `\`): the
/// character it stands for (`None` for an escaped line break, which stands for nothing) and
/// its length in bytes, the indentation after an escaped line break included.
fn escape(s: &str) -> Option<(Option<char>, usize)> {
    let mut chars = s[1..].chars();
    let c = chars.next()?;
    let simple = match c {
        '0' => Some('\0'),
        'a' => Some('\u{7}'),
        'b' => Some('\u{8}'),
        't' | '\t' => Some('\t'),
        'n' => Some('\n'),
        'v' => Some('\u{b}'),
        'f' => Some('\u{c}'),
        'r' => Some('\r'),
        'e' => Some('\u{1b}'),
        ' ' => Some(' '),
        '"' => Some('"'),
        '/' => Some('/'),
        '\\' => Some('\\'),
        'N' => Some('\u{85}'),
        '_' => Some('\u{a0}'),
        'L' => Some('\u{2028}'),
        'P' => Some('\u{2029}'),
        _ => None,
    };
    if let Some(ch) = simple {
        return Some((Some(ch), 1 + c.len_utf8()));
    }
    let hex = |n: usize| {
        let digits = s.get(2..2 + n)?;
        let code = u32::from_str_radix(digits, 16).ok()?;
        Some((Some(char::from_u32(code)?), 2 + n))
    };
    match c {
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        '\r' | '\n' => {
            let mut len = 1 + c.len_utf8();
            if c == '\r' && s[len..].starts_with('\n') {
                len += 1;
            }
            len += s[len..].len() - s[len..].trim_start_matches([' ', '\t']).len();
            Some((None, len))
        }
        _ => None,
    }
}

/// The byte offset of `pos` (1-based line, 1-based column in characters) in `text`.
fn offset_of(text: &str, pos: Pos) -> Option<usize> {
    let mut offset = 0;
    for _ in 1..pos.line {
        offset += text[offset..].find('\n')? + 1;
    }
    let line = &text[offset..];
    let col = pos.col.checked_sub(1)? as usize;
    let within = line.char_indices().nth(col).map_or(line.len(), |(i, _)| i);
    Some(offset + within)
}

/// The position of byte `offset` of `text`.
fn pos_of(text: &str, offset: usize) -> Pos {
    let before = &text[..offset];
    let line = before.matches('\n').count() as u32 + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Pos {
        line,
        col: before[line_start..].chars().count() as u32 + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::load::{SourceFile, parse};
    use std::path::Path;
    use std::sync::Arc;

    /// Where the first `needle` in the value at `/v` of the YAML `text` stands, as
    /// (line, col, end col).
    fn at(text: &str, needle: &str) -> Option<(u32, u32, u32)> {
        let doc = parse(SourceFile {
            path: Arc::from(Path::new("t.yaml")),
            text: Arc::from(text),
        })
        .expect("the YAML parses");
        let value = doc.value["v"].as_str().expect("a string");
        let i = value.find(needle).expect("the needle is in the value");
        let span = locate(text, doc.spans.exact("/v")?, value, i..i + needle.len())?;
        Some((span.start.line, span.start.col, span.end.col))
    }

    #[test]
    fn plain_and_quoted_scalars_on_one_line() {
        assert_eq!(at("v: output ~ state.anser\n", "state.anser"), Some((1, 13, 24)));
        assert_eq!(at("v: \"output ~ state.anser\"\n", "state.anser"), Some((1, 14, 25)));
        assert_eq!(at("v: 'it''s ~ state.anser'\n", "state.anser"), Some((1, 13, 24)));
        assert_eq!(at("v: \"\\\"q\\\" ~ state.anser\"\n", "state.anser"), Some((1, 13, 24)));
        assert_eq!(at("v: \"\\u00e9 ~ state.anser\"\n", "state.anser"), Some((1, 14, 25)));
    }

    #[test]
    fn literal_and_folded_block_scalars() {
        let literal = "v: |\n  output ~\n  ' and ' ~\n  state.anser\nw: 1\n";
        assert_eq!(at(literal, "state.anser"), Some((4, 3, 14)));
        let folded = "v: >-\n    output ~\n    ' and ' ~\n    state.anser\n";
        assert_eq!(at(folded, "state.anser"), Some((4, 5, 16)));
        // Kept indentation, an empty line and a header with an indentation indicator.
        let more = "v: |2-\n    output ~\n\n  state.anser\n";
        assert_eq!(at(more, "state.anser"), Some((4, 3, 14)));
        let header_comment = "v: > # the answer\n  output ~\n  state.anser\n";
        assert_eq!(at(header_comment, "state.anser"), Some((3, 3, 14)));
    }

    #[test]
    fn multi_line_flow_scalars_fold_too() {
        let plain = "v: output ~\n  state.anser\n";
        assert_eq!(at(plain, "state.anser"), Some((2, 3, 14)));
        let double = "v: \"output ~ \\\n  state.anser\"\n";
        assert_eq!(at(double, "state.anser"), Some((2, 3, 14)));
        let single = "v: 'output ~\n\n  state.anser'\n";
        assert_eq!(at(single, "state.anser"), Some((3, 3, 14)));
    }

    #[test]
    fn a_range_across_a_fold_ends_with_its_first_line() {
        let folded = "v: >-\n  a b\n  c d\n";
        assert_eq!(at(folded, "b c"), Some((2, 5, 6)));
    }

    #[test]
    fn a_value_that_does_not_walk_gives_no_position() {
        let span = Span::point(1, 4);
        assert_eq!(locate("v: abc\n", span, "abd", 2..3), None);
        assert_eq!(locate("v: abc\n", span, "abc", 2..9), None);
    }
}
