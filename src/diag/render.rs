//! Rendering diagnostics: human text with source excerpts (annotate-snippets, the renderer
//! rustc uses: display-width-aware underlines, secondary labels, colour), a stable JSON format,
//! and GitHub workflow-command annotations.

use std::borrow::Cow;
use std::ops::Range;

use annotate_snippets::{AnnotationKind, Group, Level, Origin, Renderer, Snippet};
use serde_json::{Value, json};

use super::{Diagnostic, Files, Label, Severity, Span};

/// An output format for diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Source excerpts with underlines and help, for people.
    #[default]
    Human,
    /// The same, coloured with ANSI escapes (for a terminal).
    HumanColor,
    /// One JSON document: `{"diagnostics": [...], "errors": N, "warnings": N}`.
    Json,
    /// `::error file=...,line=...,col=...::message` lines for GitHub Actions.
    Github,
}

/// Renders `diags` (already sorted) in `format`.
pub fn render(diags: &[Diagnostic], files: &Files, format: Format) -> String {
    match format {
        Format::Human => human(diags, files, &Renderer::plain()),
        Format::HumanColor => human(diags, files, &Renderer::styled()),
        Format::Json => {
            let mut text = serde_json::to_string_pretty(&render_json_value(diags)).unwrap_or_default();
            text.push('\n');
            text
        }
        Format::Github => diags.iter().map(github).collect(),
    }
}

fn human(diags: &[Diagnostic], files: &Files, renderer: &Renderer) -> String {
    let mut out = String::new();
    for d in diags {
        let code = d.code.to_string();
        let report = [group(d, &code, files)];
        out.push_str(&renderer.render(&report));
        out.push_str("\n\n");
    }
    out
}

/// One diagnostic as a report group: the title, an excerpt of each file it points into (its
/// own place underlined, its labels' places marked with their text), then help and note.
fn group<'a>(d: &'a Diagnostic, code: &'a str, files: &'a Files) -> Group<'a> {
    let level = match d.severity {
        Severity::Error => Level::ERROR,
        Severity::Warning => Level::WARNING,
    };
    let mut group = Group::with_title(level.primary_title(d.message.as_str()).id(code));
    if let Some(file) = &d.file {
        let path: Cow<'a, str> = Cow::Owned(file.display().to_string());
        match (d.span, files.get(file)) {
            (Some(span), Some(text)) => {
                let mut snippet = Snippet::source(text)
                    .path(path)
                    .annotation(AnnotationKind::Primary.span(byte_range(text, span)));
                for label in d.labels().iter().filter(|l| l.file == *file) {
                    snippet = snippet.annotation(context(text, label));
                }
                group = group.element(snippet);
            }
            (Some(span), None) => {
                group = group.element(
                    Origin::path(path)
                        .line(span.start.line as usize)
                        .char_column(span.start.col.max(1) as usize),
                );
            }
            (None, _) => group = group.element(Origin::path(path)),
        }
    }
    for label in d.labels().iter().filter(|l| d.file.as_ref() != Some(&l.file)) {
        let path: Cow<'a, str> = Cow::Owned(label.file.display().to_string());
        group = match files.get(&label.file) {
            Some(text) => group.element(Snippet::source(text).path(path).annotation(context(text, label))),
            None => group.element(
                Origin::path(path)
                    .line(label.span.start.line as usize)
                    .char_column(label.span.start.col.max(1) as usize),
            ),
        };
    }
    if let Some(help) = &d.help {
        group = group.element(Level::HELP.message(help.as_str()));
    }
    if let Some(note) = d.note_text() {
        group = group.element(Level::NOTE.message(note));
    }
    group
}

fn context<'a>(text: &str, label: &'a Label) -> annotate_snippets::Annotation<'a> {
    AnnotationKind::Context
        .span(byte_range(text, label.span))
        .label(label.message.as_str())
}

/// The bytes of `text` a span covers. Lines and columns count from 1, columns in characters;
/// a span that ends on a later line is shown up to the end of its first line, and an empty
/// span (a point) covers the character there (or the line's end).
fn byte_range(text: &str, span: Span) -> Range<usize> {
    let line_start = text
        .split_inclusive('\n')
        .take(span.start.line.saturating_sub(1) as usize)
        .map(str::len)
        .sum::<usize>()
        .min(text.len());
    let line = &text[line_start..];
    let line = &line[..line.find('\n').unwrap_or(line.len())];
    let line = line.strip_suffix('\r').unwrap_or(line);
    let at_col = |col: u32| {
        line.char_indices()
            .nth(col.saturating_sub(1) as usize)
            .map_or(line.len(), |(i, _)| i)
    };
    let start = at_col(span.start.col.max(1));
    let end = if span.end.line == span.start.line && span.end.col > span.start.col {
        at_col(span.end.col)
    } else if span.end.line > span.start.line {
        line.len()
    } else {
        // A point: the character under it.
        line[start..].chars().next().map_or(start, |c| start + c.len_utf8())
    };
    line_start + start..line_start + end.max(start)
}

/// The JSON format: stable field names, one object per diagnostic.
pub fn render_json_value(diags: &[Diagnostic]) -> Value {
    let items: Vec<Value> = diags
        .iter()
        .map(|d| {
            json!({
                "code": d.code,
                "name": d.code.name(),
                "severity": d.severity,
                "message": d.message,
                "file": d.file.as_ref().map(|f| f.display().to_string()),
                "line": d.span.map(|s| s.start.line),
                "column": d.span.map(|s| s.start.col),
                "end_line": d.span.map(|s| s.end.line),
                "end_column": d.span.map(|s| s.end.col),
                "pointer": d.pointer,
                "labels": d.labels().iter().map(|l| json!({
                    "file": l.file.display().to_string(),
                    "line": l.span.start.line,
                    "column": l.span.start.col,
                    "end_line": l.span.end.line,
                    "end_column": l.span.end.col,
                    "message": l.message,
                })).collect::<Vec<_>>(),
                "help": d.help,
                "note": d.note_text(),
            })
        })
        .collect();
    let errors = diags.iter().filter(|d| d.is_error()).count();
    json!({"diagnostics": items, "errors": errors, "warnings": diags.len() - errors})
}

fn github(d: &Diagnostic) -> String {
    let level = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let mut props = Vec::new();
    if let Some(file) = &d.file {
        props.push(format!("file={}", escape_property(&file.display().to_string())));
    }
    if let Some(span) = d.span {
        props.push(format!("line={}", span.start.line));
        props.push(format!("col={}", span.start.col));
        if span.end.line == span.start.line && span.end.col > span.start.col {
            props.push(format!("endColumn={}", span.end.col));
        }
    }
    props.push(format!(
        "title={}",
        escape_property(&format!("{} {}", d.code, d.code.name()))
    ));
    let mut message = d.message.clone();
    if let Some(help) = &d.help {
        message.push_str("\nhelp: ");
        message.push_str(help);
    }
    if let Some(note) = d.note_text() {
        message.push_str("\nnote: ");
        message.push_str(note);
    }
    for l in d.labels() {
        message.push_str(&format!(
            "\n{}:{}:{}: {}",
            l.file.display(),
            l.span.start.line,
            l.span.start.col,
            l.message
        ));
    }
    format!("::{level} {}::{}\n", props.join(","), escape_data(&message))
}

/// A GitHub Actions `::error` annotation for something that is not a diagnostic (a failed
/// test case): `file` and `line` place it, `title` heads it.
pub fn github_error(file: &str, line: Option<u32>, title: &str, message: &str) -> String {
    let mut props = vec![format!("file={}", escape_property(file))];
    if let Some(line) = line {
        props.push(format!("line={line}"));
    }
    props.push(format!("title={}", escape_property(title)));
    format!("::error {}::{}\n", props.join(","), escape_data(message))
}

fn escape_data(s: &str) -> String {
    s.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::diag::{Code, Span};

    fn sample() -> (Vec<Diagnostic>, Files) {
        let path: Arc<Path> = Arc::from(Path::new("w.yaml"));
        let mut files = Files::default();
        files.add(&path, Arc::from("name: w\nnodes:\n  a: {kind: serch}\n"));
        let mut span = Span::point(3, 13);
        span.end.col = 18;
        let d = Diagnostic::new(Code::UnknownKind, "unknown kind `serch`")
            .at(&path, Some(span))
            .pointer("/nodes/a/kind")
            .help("did you mean `search`?");
        (vec![d], files)
    }

    #[test]
    fn human_shows_line_and_caret() {
        let (d, files) = sample();
        assert_eq!(
            render(&d, &files, Format::Human),
            "error[E201]: unknown kind `serch`\n --> w.yaml:3:13\n  |\n3 |   a: {kind: serch}\n  |             ^^^^^\n  |\n  = help: did you mean `search`?\n\n"
        );
    }

    /// Underlines count display columns: a CJK character is two wide, so the caret under
    /// `世界` is four long and starts after the two-column `名` (columns count characters).
    #[test]
    fn underlines_count_display_width() {
        let path: Arc<Path> = Arc::from(Path::new("w.yaml"));
        let mut files = Files::default();
        files.add(&path, Arc::from("名: 世界\n"));
        let d = Diagnostic::new(Code::WrongType, "not a mapping").at(
            &path,
            Some(Span {
                start: crate::diag::Pos { line: 1, col: 4 },
                end: crate::diag::Pos { line: 1, col: 6 },
            }),
        );
        let out = render(&[d], &files, Format::Human);
        assert!(out.contains("1 | 名: 世界\n  |     ^^^^\n"), "{out}");
    }

    /// A second place is shown with its label; colour only when asked for.
    #[test]
    fn labels_and_colour() {
        let (d, files) = sample();
        let path: Arc<Path> = Arc::from(Path::new("w.yaml"));
        let d = vec![d[0].clone().label(&path, Some(Span::point(1, 7)), "the workflow")];
        let plain = render(&d, &files, Format::Human);
        assert!(plain.contains("1 | name: w\n  |       - the workflow\n"), "{plain}");
        assert!(!plain.contains('\u{1b}'));
        assert!(render(&d, &files, Format::HumanColor).contains("\u{1b}["));
        let json = render_json_value(&d);
        assert_eq!(json["diagnostics"][0]["labels"][0]["message"], "the workflow");
        assert!(render(&d, &files, Format::Github).contains("%0Aw.yaml:1:7: the workflow"));
    }

    #[test]
    fn github_escapes() {
        let (d, files) = sample();
        assert_eq!(
            render(&d, &files, Format::Github),
            "::error file=w.yaml,line=3,col=13,endColumn=18,title=E201 unknown-kind::unknown kind `serch`%0Ahelp: did you mean `search`?\n"
        );
    }

    #[test]
    fn json_is_stable() {
        let (d, _) = sample();
        let v = render_json_value(&d);
        assert_eq!(v["errors"], 1);
        assert_eq!(v["diagnostics"][0]["code"], "E201");
        assert_eq!(v["diagnostics"][0]["line"], 3);
        assert_eq!(v["diagnostics"][0]["pointer"], "/nodes/a/kind");
    }
}
