//! Reading a workflow file: bytes → UTF-8 → YAML (saphyr, with positions) → `serde_json::Value`
//! plus a map from every JSON pointer to where its key and value stand in the file.
//!
//! Every later stage reports problems by JSON pointer and gets the position from [`SpanMap`].
//! Hostile input is bounded here: file size, nesting depth and alias expansion all have limits,
//! and no input may panic the loader (a property test feeds it arbitrary bytes).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use serde_json::{Map, Number, Value};

use crate::diag::{Code, Diagnostic, Pos, Span};

/// The largest workflow file accepted.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;
/// The deepest nesting of mappings and sequences accepted.
pub const MAX_DEPTH: usize = 64;

/// A file's text, as read.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub path: Arc<Path>,
    pub text: Arc<str>,
}

/// A parsed YAML document as JSON, with positions.
#[derive(Debug, Clone)]
pub struct Document {
    pub file: SourceFile,
    pub value: Value,
    pub spans: SpanMap,
}

/// Where each JSON pointer's value (and, for mapping entries, its key) stands in the file.
#[derive(Debug, Clone, Default)]
pub struct SpanMap {
    places: HashMap<Box<str>, Place>,
}

/// One value's place: one entry per pointer, the pointer stored once.
#[derive(Debug, Clone, Copy)]
struct Place {
    value: Span,
    key: Option<Span>,
}

impl SpanMap {
    /// The span of the value at `pointer`, or of its nearest ancestor that has one.
    pub fn value(&self, pointer: &str) -> Option<Span> {
        let mut p = pointer;
        loop {
            if let Some(place) = self.places.get(p) {
                return Some(place.value);
            }
            p = parent(p)?;
        }
    }

    /// The span of the mapping key whose value is at `pointer`, falling back to the value.
    pub fn key(&self, pointer: &str) -> Option<Span> {
        self.places
            .get(pointer)
            .and_then(|place| place.key)
            .or_else(|| self.value(pointer))
    }

    /// The span of the value at `pointer` only if it has one itself.
    pub fn exact(&self, pointer: &str) -> Option<Span> {
        self.places.get(pointer).map(|place| place.value)
    }
}

fn parent(pointer: &str) -> Option<&str> {
    if pointer.is_empty() {
        return None;
    }
    Some(&pointer[..pointer.rfind('/').unwrap_or(0)])
}

/// Appends one reference token to a JSON pointer, escaped.
pub fn push_pointer(base: &str, token: &str) -> String {
    let mut p = String::with_capacity(base.len() + token.len() + 1);
    p.push_str(base);
    p.push('/');
    for c in token.chars() {
        match c {
            '~' => p.push_str("~0"),
            '/' => p.push_str("~1"),
            c => p.push(c),
        }
    }
    p
}

/// Whether a file name is a workflow's by the naming convention: `*.yaml` / `*.yml`, but not
/// a test file (`*.test.yaml`) or a mock script (`*.mock.yaml`) kept beside the workflows.
pub fn is_workflow_file_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".yaml").or_else(|| name.strip_suffix(".yml")) else {
        return false;
    };
    !stem.ends_with(".test") && !stem.ends_with(".mock")
}

/// The path that names standard input, as command-line tools spell it.
pub const STDIN: &str = "-";
/// How standard input is named in diagnostics.
pub const STDIN_NAME: &str = "<stdin>";

/// Reads a file's bytes into a [`SourceFile`]: size cap, UTF-8 check. The path `-` reads
/// standard input (once per process: a second read gets the same text), named `<stdin>`;
/// files it refers to are found relative to the current directory.
pub fn read(path: &Path) -> Result<SourceFile, Diagnostic> {
    if path == Path::new(STDIN) {
        let path: Arc<Path> = Arc::from(Path::new(STDIN_NAME));
        return match stdin_bytes() {
            Ok(bytes) => from_bytes(path, bytes.to_vec()),
            Err(e) => Err(Diagnostic::new(Code::Io, format!("cannot read standard input: {e}")).at(&path, None)),
        };
    }
    let path: Arc<Path> = Arc::from(path);
    let meta = std::fs::metadata(&path).map_err(|e| io_error(&path, &e))?;
    if meta.len() > MAX_FILE_BYTES as u64 {
        return Err(too_large(&path, meta.len()));
    }
    let bytes = std::fs::read(&path).map_err(|e| io_error(&path, &e))?;
    from_bytes(path, bytes)
}

/// Standard input's bytes, read to its end at the first call (at most one byte past the
/// size cap, so a runaway pipe is not held in memory).
pub fn stdin_bytes() -> Result<&'static [u8], String> {
    use std::io::Read;
    static STDIN_BYTES: std::sync::OnceLock<Result<Vec<u8>, String>> = std::sync::OnceLock::new();
    STDIN_BYTES
        .get_or_init(|| {
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .take(MAX_FILE_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| e.to_string())?;
            Ok(bytes)
        })
        .as_deref()
        .map_err(Clone::clone)
}

/// Builds a [`SourceFile`] from bytes: size cap, UTF-8 check.
pub fn from_bytes(path: Arc<Path>, bytes: Vec<u8>) -> Result<SourceFile, Diagnostic> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(too_large(&path, bytes.len() as u64));
    }
    if bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]) {
        return Err(Diagnostic::new(Code::NotUtf8, "the file is UTF-16, not UTF-8")
            .at(&path, Some(Span::point(1, 1)))
            .help("save the file as UTF-8"));
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(SourceFile {
            path,
            text: Arc::from(text),
        }),
        Err(e) => {
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            // Invariant: the prefix up to `valid_up_to` is valid UTF-8.
            let prefix = std::str::from_utf8(valid).unwrap_or_default();
            let line = prefix.matches('\n').count() as u32 + 1;
            let col = prefix.rsplit('\n').next().unwrap_or("").chars().count() as u32 + 1;
            Err(Diagnostic::new(
                Code::NotUtf8,
                format!("invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()),
            )
            .at(&path, Some(Span::point(line, col)))
            .help("save the file as UTF-8"))
        }
    }
}

fn io_error(path: &Arc<Path>, e: &std::io::Error) -> Diagnostic {
    Diagnostic::new(Code::Io, format!("cannot read {}: {e}", path.display())).at(path, None)
}

fn too_large(path: &Arc<Path>, len: u64) -> Diagnostic {
    Diagnostic::new(
        Code::TooLarge,
        format!("the file has {len} bytes; a workflow file may have at most {MAX_FILE_BYTES}"),
    )
    .at(path, None)
    .help("split large data out of the workflow: load it at run time with a `load` node")
}

/// The first tab in a line's leading whitespace at or after line `from` (1-based), unless
/// line `from` itself has a tab anywhere (then the parser's position stands).
fn leading_tab_from(text: &str, from: u32) -> Option<Span> {
    let start = from.checked_sub(1)? as usize;
    let mut lines = text.split('\n').enumerate().skip(start);
    let (_, first) = lines.next()?;
    if first.contains('\t') {
        return None;
    }
    lines.find_map(|(i, l)| {
        let indent: String = l.chars().take_while(|c| *c == ' ' || *c == '\t').collect();
        let col = indent.chars().position(|c| c == '\t')?;
        let mut span = Span::point(i as u32 + 1, col as u32 + 1);
        span.end.col = span.start.col + 1;
        Some(span)
    })
}

/// Parses a file's YAML into a [`Document`].
pub fn parse(file: SourceFile) -> Result<Document, Vec<Diagnostic>> {
    let path = file.path.clone();
    let docs = MarkedYaml::load_from_str(&file.text).map_err(|e| {
        let m = e.marker();
        let info = e.info();
        let code = if info.contains("duplicated key") {
            Code::DuplicateKey
        } else if info.contains("alias expansion") {
            Code::AliasBomb
        } else if info.contains("recursion limit") {
            Code::TooDeep
        } else {
            Code::YamlSyntax
        };
        let line = m.line() as u32;
        // A position past the end (an error at end of input) is shown on the last line.
        let lines = file.text.lines().count().max(1) as u32;
        let (line, col) = if line > lines {
            (
                lines,
                file.text.lines().last().map_or(0, |l| l.chars().count()) as u32 + 1,
            )
        } else {
            (line, m.col() as u32 + 1)
        };
        let mut span = Span::point(line, col);
        if code == Code::YamlSyntax && info.contains("tab") {
            // The parser may blame the construct (a block scalar's `|` line) rather than the
            // line holding the tab: point at the first tab in leading whitespace from there on.
            if let Some(at) = leading_tab_from(&file.text, line) {
                span = at;
            }
        }
        let mut message = yaml_message(code, info);
        if code == Code::DuplicateKey {
            span = key_span_at(&file.text, span);
            if let Some(key) = text_at(&file.text, span) {
                message = format!("duplicate key `{key}` in mapping");
            }
        }
        let d = Diagnostic::new(code, message).at(&path, Some(span));
        vec![match code {
            Code::DuplicateKey => d.help("each key may appear once in a mapping; merge the two entries"),
            Code::AliasBomb => d.help("aliases may expand to at most 100000 values in all"),
            Code::YamlSyntax if info.contains("tab") => {
                d.help("indent with spaces: YAML does not allow tabs for indentation")
            }
            _ => d,
        }]
    })?;
    let mut docs = docs.into_iter();
    let Some(root) = docs.next().filter(|r| !matches!(r.data, YamlData::Value(Scalar::Null))) else {
        return Err(vec![
            Diagnostic::new(Code::Empty, "the file holds no YAML document")
                .at(&path, Some(Span::point(1, 1)))
                .help("a workflow needs at least `name`, `nodes` and `edges`"),
        ]);
    };
    let mut diags = Vec::new();
    if let Some(second) = docs.next() {
        diags.push(
            Diagnostic::new(Code::MultipleDocuments, "a second YAML document starts here")
                .at(&path, Some(span_of(&second)))
                .help("a workflow file holds one document; remove the `---` separator"),
        );
    }
    let mut spans = SpanMap::default();
    let mut converter = Converter {
        path: &path,
        spans: &mut spans,
        diags: &mut diags,
    };
    let value = converter.convert(&root, String::new(), None, 0);
    if diags.is_empty() {
        Ok(Document { file, value, spans })
    } else {
        Err(diags)
    }
}

fn yaml_message(code: Code, info: &str) -> String {
    match code {
        Code::DuplicateKey => "duplicate key in mapping".into(),
        Code::AliasBomb => "aliases expand to too many values (a \"billion laughs\" document)".into(),
        Code::TooDeep => format!("values are nested too deeply ({info})"),
        _ => info.to_string(),
    }
}

/// saphyr reports a duplicate key at the key's start; widen the caret to the key's text.
fn key_span_at(text: &str, at: Span) -> Span {
    let Some(line) = text.split('\n').nth(at.start.line as usize - 1) else {
        return at;
    };
    let rest: String = line.chars().skip(at.start.col as usize - 1).collect();
    let len = rest
        .find(':')
        .map(|i| rest[..i].trim_end().chars().count())
        .unwrap_or(0);
    let mut span = at;
    span.end.col = at.start.col + len as u32;
    span
}

/// The text a one-line span covers.
fn text_at(text: &str, span: Span) -> Option<String> {
    let line = text.lines().nth(span.start.line.checked_sub(1)? as usize)?;
    let s: String = line
        .chars()
        .skip(span.start.col as usize - 1)
        .take((span.end.col - span.start.col) as usize)
        .collect();
    (!s.is_empty()).then_some(s)
}

fn span_of(node: &MarkedYaml) -> Span {
    let s = node.span.start;
    let e = node.span.end;
    Span {
        start: Pos {
            line: s.line() as u32,
            col: s.col() as u32 + 1,
        },
        end: Pos {
            line: e.line() as u32,
            col: e.col() as u32 + 1,
        },
    }
}

/// Whether a mapping used as a key is what YAML makes of an unquoted `{{ name }}`: a flow
/// mapping whose entries have no values.
fn looks_like_braces(m: &saphyr::AnnotatedMapping<'_, MarkedYaml<'_>>) -> bool {
    !m.is_empty() && m.values().all(|v| matches!(v.data, YamlData::Value(Scalar::Null)))
}

struct Converter<'a> {
    path: &'a Arc<Path>,
    spans: &'a mut SpanMap,
    diags: &'a mut Vec<Diagnostic>,
}

impl Converter<'_> {
    fn err(&mut self, code: Code, node: &MarkedYaml, message: String, help: &str) {
        self.diags.push(
            Diagnostic::new(code, message)
                .at(self.path, Some(span_of(node)))
                .help(help),
        );
    }

    /// The value of `node` (at `pointer`; `key` is its mapping key's span), its place recorded.
    fn convert(&mut self, node: &MarkedYaml, pointer: String, key: Option<Span>, depth: usize) -> Value {
        let value = self.value(node, &pointer, depth);
        let place = Place {
            value: span_of(node),
            key,
        };
        self.spans.places.insert(pointer.into_boxed_str(), place);
        value
    }

    fn value(&mut self, node: &MarkedYaml, pointer: &str, depth: usize) -> Value {
        match &node.data {
            YamlData::Value(scalar) => self.scalar(node, scalar),
            YamlData::Sequence(items) => {
                if depth >= MAX_DEPTH {
                    self.too_deep(node);
                    return Value::Null;
                }
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    out.push(self.convert(item, push_pointer(pointer, &i.to_string()), None, depth + 1));
                }
                Value::Array(out)
            }
            YamlData::Mapping(map) => {
                if depth >= MAX_DEPTH {
                    self.too_deep(node);
                    return Value::Null;
                }
                let mut out = Map::with_capacity(map.len());
                for (key, value) in map {
                    let Some(name) = self.key(key) else { continue };
                    let child = push_pointer(pointer, &name);
                    let v = self.convert(value, child, Some(span_of(key)), depth + 1);
                    out.insert(name, v);
                }
                Value::Object(out)
            }
            YamlData::Tagged(tag, _) => {
                self.err(
                    Code::UnsupportedYaml,
                    node,
                    format!("YAML tag `{tag}` is not supported"),
                    "workflows are plain data: remove the tag",
                );
                Value::Null
            }
            YamlData::Alias(_) | YamlData::BadValue | YamlData::Representation(..) => {
                self.err(
                    Code::UnsupportedYaml,
                    node,
                    "a value that cannot be read as plain data".into(),
                    "check tags and aliases on this value",
                );
                Value::Null
            }
        }
    }

    fn too_deep(&mut self, node: &MarkedYaml) {
        self.err(
            Code::TooDeep,
            node,
            format!("values are nested more than {MAX_DEPTH} levels deep"),
            "flatten the structure",
        );
    }

    fn scalar(&mut self, node: &MarkedYaml, scalar: &Scalar) -> Value {
        match scalar {
            Scalar::Null => Value::Null,
            Scalar::Boolean(b) => Value::Bool(*b),
            Scalar::Integer(i) => Value::Number((*i).into()),
            Scalar::FloatingPoint(f) => match Number::from_f64(f.into_inner()) {
                Some(n) => Value::Number(n),
                None => {
                    self.err(
                        Code::UnsupportedYaml,
                        node,
                        format!("`{}` is not a JSON number", f.into_inner()),
                        "use a finite number, or quote it to make a string",
                    );
                    Value::Null
                }
            },
            Scalar::String(s) => Value::String(s.to_string()),
        }
    }

    fn key(&mut self, key: &MarkedYaml) -> Option<String> {
        match &key.data {
            YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
            YamlData::Value(Scalar::Integer(i)) => Some(i.to_string()),
            YamlData::Value(Scalar::Boolean(b)) => Some(b.to_string()),
            YamlData::Value(Scalar::FloatingPoint(f)) => Some(f.into_inner().to_string()),
            YamlData::Value(Scalar::Null) => {
                self.err(Code::UnsupportedYaml, key, "a null mapping key".into(), "name the key");
                None
            }
            // `x: {{ state.y }}` unquoted: YAML reads `{{ ... }}` as a mapping used as a key.
            YamlData::Mapping(m) if looks_like_braces(m) => {
                self.err(
                    Code::UnsupportedYaml,
                    key,
                    "an unquoted `{{ ... }}`: YAML reads it as a mapping, not as text".into(),
                    "quote it: `\"{{ ... }}\"` (a value that starts with `{` or `[` must be quoted)",
                );
                None
            }
            _ => {
                self.err(
                    Code::UnsupportedYaml,
                    key,
                    "a mapping key that is not a scalar".into(),
                    "keys must be plain names",
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Document, Vec<Diagnostic>> {
        parse(SourceFile {
            path: Arc::from(Path::new("t.yaml")),
            text: Arc::from(text),
        })
    }

    fn codes(text: &str) -> Vec<(Code, u32, u32)> {
        match load(text) {
            Ok(_) => vec![],
            Err(d) => d
                .iter()
                .map(|d| {
                    (
                        d.code,
                        d.span.map_or(0, |s| s.start.line),
                        d.span.map_or(0, |s| s.start.col),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn pointers_map_to_key_and_value_positions() {
        let doc = load("name: x\nnodes:\n  a/b:\n    kind: llm\n").unwrap();
        assert_eq!(doc.value["nodes"]["a/b"]["kind"], "llm");
        let v = doc.spans.value("/nodes/a~1b/kind").unwrap();
        assert_eq!((v.start.line, v.start.col), (4, 11));
        let k = doc.spans.key("/nodes/a~1b/kind").unwrap();
        assert_eq!((k.start.line, k.start.col), (4, 5));
        // A pointer below a scalar falls back to the nearest ancestor.
        assert_eq!(doc.spans.value("/nodes/a~1b/kind/x"), Some(v));
    }

    #[test]
    fn hostile_yaml_is_reported_not_panicked_on() {
        assert_eq!(codes("a: 1\nb: 2\na: 3\n"), vec![(Code::DuplicateKey, 3, 1)]);
        assert_eq!(codes("a:\n\tb: 1\n")[0].0, Code::YamlSyntax);
        assert_eq!(codes(""), vec![(Code::Empty, 1, 1)]);
        assert_eq!(codes("# only a comment\n"), vec![(Code::Empty, 1, 1)]);
        assert_eq!(codes("a: 1\n---\nb: 2\n")[0].0, Code::MultipleDocuments);
        assert_eq!(codes("a: .nan\n"), vec![(Code::UnsupportedYaml, 1, 4)]);
        assert_eq!(codes("? [a, b]\n: 1\n")[0].0, Code::UnsupportedYaml);
        let deep = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(codes(&deep)[0].0, Code::TooDeep);
        let nested: String = (0..100).map(|i| format!("{}k{i}:\n", "  ".repeat(i))).collect();
        assert_eq!(codes(&nested)[0].0, Code::TooDeep);
    }

    #[test]
    fn alias_bomb_is_refused() {
        let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
        for (name, prev) in [("b", "a"), ("c", "b"), ("d", "c"), ("e", "d"), ("f", "e"), ("g", "f")] {
            let refs = vec![format!("*{prev}"); 9].join(", ");
            text.push_str(&format!("{name}: &{name} [{refs}]\n"));
        }
        assert_eq!(codes(&text)[0].0, Code::AliasBomb);
    }

    #[test]
    fn invalid_utf8_points_at_the_byte() {
        let err = from_bytes(Arc::from(Path::new("t.yaml")), b"name: x\nab\xffc\n".to_vec()).unwrap_err();
        assert_eq!(err.code, Code::NotUtf8);
        assert_eq!(err.span, Some(Span::point(2, 3)));
    }
}
