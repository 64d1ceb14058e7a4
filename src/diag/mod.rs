//! Diagnostics: every problem any stage finds, with a stable code, a position and help.
//!
//! Stages collect diagnostics rather than stopping at the first; the CLI renders them all,
//! sorted by file and position, as human text, JSON or GitHub annotations.

mod code;
mod render;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Serialize;

pub use code::Code;
pub use render::{Format, github_error, render, render_json_value};

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// A position in a source file: 1-based line and column (columns count characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

/// A range in a source file. `end` is exclusive; on one line it sets the caret width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
pub struct Span {
    pub start: Pos,
    pub end: Pos,
}

impl Span {
    pub fn point(line: u32, col: u32) -> Span {
        let p = Pos { line, col };
        Span { start: p, end: p }
    }
}

/// One problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub file: Option<Arc<Path>>,
    pub span: Option<Span>,
    /// The JSON pointer of the offending value in the workflow document, where there is one.
    pub pointer: Option<String>,
    pub help: Option<String>,
    /// The note and the other places, when there are any. Boxed: diagnostics travel in
    /// `Result`s, and most have neither.
    more: Option<Box<More>>,
}

/// What few diagnostics have.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct More {
    /// Where else the problem shows, e.g. the node that uses a template whose line is reported.
    note: Option<String>,
    /// Other places the problem involves, each with what it is there (the first definition of
    /// a duplicated name, the other writer of a conflicting key).
    labels: Vec<Label>,
}

/// A second place a diagnostic points at, with what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub file: Arc<Path>,
    pub span: Span,
    pub message: String,
}

impl Diagnostic {
    /// A problem of `code`'s default severity.
    pub fn new(code: Code, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            code,
            severity: code.severity(),
            message: message.into(),
            file: None,
            span: None,
            pointer: None,
            help: None,
            more: None,
        }
    }

    /// Points at another place the problem involves (nothing when `span` is unknown).
    pub fn label(mut self, file: &Arc<Path>, span: Option<Span>, message: impl Into<String>) -> Diagnostic {
        if let Some(span) = span {
            self.more.get_or_insert_default().labels.push(Label {
                file: file.clone(),
                span,
                message: message.into(),
            });
        }
        self
    }

    /// The other places the problem involves.
    pub fn labels(&self) -> &[Label] {
        self.more.as_deref().map_or(&[], |m| m.labels.as_slice())
    }

    /// Where else the problem shows, if said.
    pub fn note_text(&self) -> Option<&str> {
        self.more.as_deref().and_then(|m| m.note.as_deref())
    }

    pub fn at(mut self, file: &Arc<Path>, span: Option<Span>) -> Diagnostic {
        self.file = Some(file.clone());
        self.span = span;
        self
    }

    pub fn pointer(mut self, pointer: impl Into<String>) -> Diagnostic {
        self.pointer = Some(pointer.into());
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Diagnostic {
        self.set_note(note);
        self
    }

    /// Sets the note of a diagnostic in place.
    pub fn set_note(&mut self, note: impl Into<String>) {
        self.more.get_or_insert_default().note = Some(note.into());
    }

    /// Sets the help unless a suggestion already did.
    pub fn help_or(self, help: impl Into<String>) -> Diagnostic {
        if self.help.is_none() { self.help(help) } else { self }
    }

    /// Adds "did you mean `x`?" when a candidate is close to `name`.
    pub fn suggest<'a>(self, name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Self {
        match did_you_mean(name, candidates) {
            Some(best) => self.help(format!("did you mean `{best}`?")),
            None => self,
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    fn sort_key(&self) -> (Option<&Path>, Pos, Code) {
        (
            self.file.as_deref(),
            self.span.map(|s| s.start).unwrap_or_default(),
            self.code,
        )
    }
}

/// Sorts diagnostics by file, then position, then code, and drops exact repeats.
pub fn sort(diags: &mut Vec<Diagnostic>) {
    diags.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    diags.dedup();
}

/// The closest candidate to `name`, if one is close enough to be a likely typo.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(f64, &str)> = None;
    for candidate in candidates {
        if candidate == name {
            continue;
        }
        let score = strsim::jaro_winkler(name, candidate);
        let close = score >= 0.8 || strsim::levenshtein(name, candidate) <= name.len().min(3) / 2 + 1 && name.len() > 2;
        if close && best.is_none_or(|(s, _)| score > s) {
            best = Some((score, candidate));
        }
    }
    best.map(|(_, c)| c)
}

/// The text of every file diagnostics may point into, for rendering source lines.
#[derive(Debug, Default, Clone)]
pub struct Files {
    files: IndexMap<PathBuf, Arc<str>>,
}

impl Files {
    pub fn add(&mut self, path: &Path, text: Arc<str>) {
        self.files.insert(path.to_path_buf(), text);
    }

    pub fn get(&self, path: &Path) -> Option<&str> {
        self.files.get(path).map(|t| &**t)
    }

    /// The files read, in the order they were.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.keys().map(PathBuf::as_path)
    }

    /// The text of line `line` (1-based) of `path`, without its line break.
    pub fn line(&self, path: &Path, line: u32) -> Option<&str> {
        let text = self.get(path)?;
        text.split('\n')
            .nth(line.checked_sub(1)? as usize)
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_find_typos_not_strangers() {
        let names = ["search", "scrape", "summarize", "synthesize"];
        assert_eq!(did_you_mean("serch", names), Some("search"));
        assert_eq!(did_you_mean("summarise", names), Some("summarize"));
        assert_eq!(did_you_mean("plan", names), None);
        assert_eq!(did_you_mean("search", names), None);
    }
}
