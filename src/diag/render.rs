//! Rendering diagnostics: human text with the source line and a caret, a stable JSON format,
//! and GitHub workflow-command annotations.

use std::fmt::Write;

use serde_json::{Value, json};

use super::{Diagnostic, Files, Severity};

/// An output format for diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Source excerpts with carets and help, for people.
    #[default]
    Human,
    /// One JSON document: `{"diagnostics": [...], "errors": N, "warnings": N}`.
    Json,
    /// `::error file=...,line=...,col=...::message` lines for GitHub Actions.
    Github,
}

/// Renders `diags` (already sorted) in `format`.
pub fn render(diags: &[Diagnostic], files: &Files, format: Format) -> String {
    match format {
        Format::Human => {
            let mut out = String::new();
            for d in diags {
                human(&mut out, d, files);
            }
            out
        }
        Format::Json => {
            let mut text = serde_json::to_string_pretty(&render_json_value(diags)).unwrap_or_default();
            text.push('\n');
            text
        }
        Format::Github => diags.iter().map(github).collect(),
    }
}

fn human(out: &mut String, d: &Diagnostic, files: &Files) {
    let label = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let _ = writeln!(out, "{label}[{}]: {}", d.code, d.message);
    let Some(file) = &d.file else {
        if let Some(help) = &d.help {
            let _ = writeln!(out, "  = help: {help}");
        }
        if let Some(note) = &d.note {
            let _ = writeln!(out, "  = note: {note}");
        }
        out.push('\n');
        return;
    };
    match d.span {
        Some(span) => {
            let _ = writeln!(out, "  --> {}:{}:{}", file.display(), span.start.line, span.start.col);
            let gutter = span.start.line.to_string().len();
            if let Some(line) = files.line(file, span.start.line) {
                let shown = line.replace('\t', " ");
                let _ = writeln!(out, "{:gutter$} |", "");
                let _ = writeln!(out, "{} | {}", span.start.line, shown);
                let start = span.start.col.max(1) as usize;
                let chars = shown.chars().count();
                let width = if span.end.line == span.start.line && span.end.col > span.start.col {
                    (span.end.col - span.start.col) as usize
                } else {
                    chars.saturating_sub(start - 1).max(1)
                };
                let width = width.min(chars.saturating_sub(start - 1).max(1));
                let _ = writeln!(out, "{:gutter$} | {}{}", "", " ".repeat(start - 1), "^".repeat(width));
            }
            if let Some(help) = &d.help {
                let _ = writeln!(out, "{:gutter$} = help: {help}", "");
            }
            if let Some(note) = &d.note {
                let _ = writeln!(out, "{:gutter$} = note: {note}", "");
            }
        }
        None => {
            let _ = writeln!(out, "  --> {}", file.display());
            if let Some(help) = &d.help {
                let _ = writeln!(out, "  = help: {help}");
            }
            if let Some(note) = &d.note {
                let _ = writeln!(out, "  = note: {note}");
            }
        }
    }
    out.push('\n');
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
                "help": d.help,
                "note": d.note.as_deref(),
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
    if let Some(note) = &d.note {
        message.push_str("\nnote: ");
        message.push_str(note);
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
            "error[E201]: unknown kind `serch`\n  --> w.yaml:3:13\n  |\n3 |   a: {kind: serch}\n  |             ^^^^^\n  = help: did you mean `search`?\n\n"
        );
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
