//! Expressions and templates: compiled once, and every name they read checked against what
//! is declared where they are used.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use minijinja::{Environment, ErrorKind, UndefinedBehavior};
use serde_json::Value;

use super::plan::{ExprId, ExprTable, TemplateId};
use super::source::Source;
use crate::diag::{Code, Diagnostic, did_you_mean};

/// Functions minijinja provides everywhere; they read like variables to the checker.
const GLOBALS: &[&str] = &["range", "dict", "namespace", "lipsum", "cycler", "joiner", "debug"];

/// Fields of `usage`, `error` and `run`.
pub(super) const USAGE_FIELDS: &[&str] = &["prompt_tokens", "completion_tokens", "total_tokens", "cost", "calls"];
pub(super) const ERROR_FIELDS: &[&str] = &["node", "class", "message", "attempts", "usage", "at"];
pub(super) const RUN_FIELDS: &[&str] = &["thread_id", "step", "node", "remaining_steps"];
/// What a served route's expressions read of the request.
pub(super) const REQUEST_FIELDS: &[&str] = &["body", "query", "headers", "path"];

/// The environment every plan's expressions and templates run in.
pub(super) fn environment(prompts: Option<PathBuf>) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // A write that bypasses its key's reducer, and the marker that empties an `add_messages`
    // key: LangGraph's `Overwrite(value)` and `RemoveMessage(id=REMOVE_ALL_MESSAGES)`.
    env.add_function("overwrite", |value: minijinja::Value| {
        minijinja::Value::from(std::collections::BTreeMap::from([(super::OVERWRITE, value)]))
    });
    env.add_function("remove_all_messages", || {
        minijinja::Value::from(std::collections::BTreeMap::from([
            ("type", "remove"),
            ("id", super::REMOVE_ALL_MESSAGES),
        ]))
    });
    if let Some(dir) = prompts {
        // `{% include %}` of partials under the prompts directory; names may not escape it.
        env.set_loader(move |name: &str| {
            if name.split('/').any(|p| p == ".." || p.is_empty()) || name.starts_with('/') {
                return Ok(None);
            }
            match std::fs::read_to_string(dir.join(name)) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(minijinja::Error::new(
                    minijinja::ErrorKind::TemplateNotFound,
                    e.to_string(),
                )),
            }
        });
    }
    env
}

/// Why an expression does not parse, and where in its text, when minijinja says.
#[derive(Debug, Clone)]
pub(super) struct SyntaxError {
    pub message: String,
    pub range: Option<std::ops::Range<usize>>,
}

impl std::fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Collects a plan's expressions and templates.
pub(super) struct Exprs {
    env: Environment<'static>,
    sources: Vec<String>,
    by_text: HashMap<String, (ExprId, Names)>,
    templates: HashMap<String, Names>,
}

impl Exprs {
    pub(super) fn new(prompts: Option<PathBuf>) -> Exprs {
        Exprs {
            env: environment(prompts),
            sources: Vec::new(),
            by_text: HashMap::new(),
            templates: HashMap::new(),
        }
    }

    /// Compiles an expression; returns its id, the dotted names it reads and what it calls.
    pub(super) fn expr(&mut self, text: &str) -> Result<(ExprId, Names), SyntaxError> {
        if let Some((id, names)) = self.by_text.get(text) {
            return Ok((*id, names.clone()));
        }
        if text.trim().is_empty() {
            return Err(SyntaxError {
                message: "the expression is empty".into(),
                range: None,
            });
        }
        self.env.compile_expression(text).map_err(|e| SyntaxError {
            message: first_line(&e),
            range: e.range(),
        })?;
        let names = self.names(text, true, super::reads::of_expr(text));
        let id = ExprId(self.sources.len() as u32);
        self.sources.push(text.to_string());
        self.by_text.insert(text.to_string(), (id, names.clone()));
        Ok((id, names))
    }

    /// Compiles a template under `name` (shared by every node using the same file).
    pub(super) fn template(&mut self, name: &str, text: &str) -> Result<(TemplateId, Names), minijinja::Error> {
        if let Some(names) = self.templates.get(name) {
            return Ok((TemplateId(Arc::from(name)), names.clone()));
        }
        self.env.add_template_owned(name.to_string(), text.to_string())?;
        let names = self.names(text, false, super::reads::of_template(text));
        self.templates.insert(name.to_string(), names.clone());
        Ok((TemplateId(Arc::from(name)), names))
    }

    fn names(&self, text: &str, in_expr: bool, reads: Vec<super::reads::Read>) -> Names {
        let (called, unknown) = scan_calls(&self.env, text, in_expr);
        // A called function is checked as a function, not as a variable.
        let reads: Vec<super::reads::Read> = reads.into_iter().filter(|r| !called.contains(&r.name)).collect();
        let mut vars: Vec<String> = reads.iter().map(|r| r.name.clone()).collect();
        vars.sort();
        Names {
            vars: vars.into(),
            reads: reads.into(),
            calls: called.into(),
            unknown: unknown.into(),
        }
    }

    /// What an expression compiled earlier reads and calls.
    /// The text of an expression compiled earlier.
    pub(super) fn source(&self, id: ExprId) -> Option<&str> {
        self.sources.get(id.0 as usize).map(String::as_str)
    }

    pub(super) fn names_of(&self, text: &str) -> Option<&Names> {
        self.by_text.get(text).map(|(_, names)| names)
    }

    pub(super) fn into_table(self) -> Result<ExprTable, minijinja::Error> {
        ExprTable::build(self.env, self.sources)
    }
}

pub(super) fn first_line(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    if let Some(i) = msg.find(" (in ") {
        msg.truncate(i);
    }
    if let Some(line) = e.line() {
        if msg.contains('\n') {
            msg = msg.lines().next().unwrap_or_default().to_string();
        }
        if e.name().is_some_and(|n| n != "<expression>") {
            msg.push_str(&format!(" (template line {line})"));
        }
    }
    msg
}

/// The names declared by a workflow, for checking expressions.
#[derive(Debug, Default)]
pub(super) struct Symbols {
    pub state: Vec<String>,
    /// `None`: no input declared. `Some(None)`: declared but open.
    pub input: Option<Option<Vec<String>>>,
    pub context: Option<Option<Vec<String>>>,
    pub config: Value,
    pub predicates: Vec<String>,
}

/// What a node's `output` is, for checking `output.x`.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Anything may be read.
    Any,
    /// The node produces nothing.
    Null,
    /// A string.
    Text,
    /// An object with these fields.
    Fields(Vec<String>),
}

impl Shape {
    /// An object with the fields `names`.
    pub fn fields(names: &[&str]) -> Shape {
        Shape::Fields(names.iter().map(|s| s.to_string()).collect())
    }

    /// The shape described by a JSON Schema: its properties when closed, else anything.
    pub fn of_schema(schema: &Value) -> Shape {
        let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
        match schema.get("properties").and_then(Value::as_object) {
            Some(props) if closed || !props.is_empty() => Shape::Fields(props.keys().cloned().collect()),
            _ => Shape::Any,
        }
    }
}

/// What an expression may read where it is used.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scope<'a> {
    pub sym: &'a Symbols,
    pub params: Option<&'a [String]>,
    pub item: Option<&'a str>,
    pub output: Option<&'a Shape>,
    pub usage: bool,
    pub error: bool,
    pub reducer: bool,
    pub predicates: bool,
    /// A served route's: `request` can be read (its `body`, `query`, `headers`, `path`).
    pub request: bool,
    /// A route's request expressions: before any run, only `request` and `config` exist.
    pub request_only: bool,
    /// A route's stream rule: the fields of the run event it reads as `event`.
    pub event: Option<&'a [&'a str]>,
}

impl<'a> Scope<'a> {
    pub(super) fn base(sym: &'a Symbols) -> Scope<'a> {
        Scope {
            sym,
            params: None,
            item: None,
            output: None,
            usage: false,
            error: false,
            reducer: false,
            predicates: true,
            request: false,
            request_only: false,
            event: None,
        }
    }

    fn roots(&self) -> Vec<&str> {
        if self.reducer {
            return vec!["current", "update"];
        }
        if self.request_only {
            return vec!["request", "config"];
        }
        let mut r = vec!["state", "input", "config", "context", "run"];
        if self.request {
            r.push("request");
        }
        if self.event.is_some() {
            r.push("event");
        }
        if self.params.is_some() {
            r.push("params");
        }
        if let Some(i) = self.item {
            r.push(i);
        }
        if self.output.is_some() {
            r.push("output");
        }
        if self.usage {
            r.push("usage");
        }
        if self.error {
            r.push("error");
        }
        if self.predicates {
            r.extend(self.sym.predicates.iter().map(String::as_str));
        }
        r
    }

    /// Checks every name the expression `text`, written at `pointer` of `src`, reads; each
    /// problem is shown where the name is read.
    pub(super) fn check(&self, src: &Source, pointer: &str, text: &str, names: &Names, diags: &mut Vec<Diagnostic>) {
        for read in names.reads.iter() {
            if let Some(mut d) = self.check_one(src, pointer, text, &read.name) {
                src.narrow(&mut d, pointer, text, read.range.clone());
                diags.push(d);
            }
        }
    }

    /// Checks the name `var` that `text` reads, reporting a problem at `pointer` as a whole.
    pub(super) fn check_one(&self, src: &Source, pointer: &str, text: &str, var: &str) -> Option<Diagnostic> {
        let mut parts = var.split('.');
        let root = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        let field = rest.first().copied();
        let bad = |msg: String| Some(src.diag(Code::UndeclaredVariable, pointer, msg));
        if GLOBALS.contains(&root) {
            return None;
        }
        if self.reducer {
            return if root == "current" || root == "update" {
                None
            } else {
                bad(format!("a reducer reads only `current` and `update`, not `{root}`"))
            };
        }
        if self.request_only && !matches!(root, "request" | "config") {
            return bad(format!(
                "a route's `thread`, `input` and `resume` are read from the request before the run starts: they read `request` and `config`, not `{root}`"
            ));
        }
        match root {
            "request" if self.request => check_fields(src, pointer, "request", field, REQUEST_FIELDS),
            "event" if self.event.is_some() => {
                check_fields(src, pointer, "event", field, self.event.unwrap_or_default())
            }
            "state" => {
                let key = field?;
                if self.sym.state.iter().any(|k| k == key) {
                    return None;
                }
                bad(format!("`state.{key}` is not a declared state key")).map(|d| {
                    d.suggest(key, self.sym.state.iter().map(String::as_str))
                        .help_or("declare it under `state:`")
                })
            }
            "input" | "context" => {
                let declared = if root == "input" {
                    &self.sym.input
                } else {
                    &self.sym.context
                };
                match (declared, field) {
                    (None, _) => bad(format!("the workflow declares no `{root}`"))
                        .map(|d| d.help(format!("declare `{root}:` as a JSON Schema with the fields you read"))),
                    (Some(None), _) | (_, None) => None,
                    (Some(Some(props)), Some(f)) if props.iter().any(|p| p == f) => None,
                    (Some(Some(props)), Some(f)) => bad(format!(
                        "`{root}.{f}` is not declared in the workflow's `{root}` schema"
                    ))
                    .map(|d| d.suggest(f, props.iter().map(String::as_str))),
                }
            }
            "config" => self.check_config(src, pointer, &rest),
            "run" if self.request => check_fields(src, pointer, "run", field, &["run_id", "thread_id"]),
            "run" => check_fields(src, pointer, "run", field, RUN_FIELDS),
            "params" if self.params.is_some() => {
                let names = self.params.unwrap_or_default();
                match field {
                    Some(f) if !names.iter().any(|n| n == f) => {
                        bad(format!("`params.{f}` is not a parameter of this node")).map(|d| {
                            d.suggest(f, names.iter().map(String::as_str))
                                .help_or("declare it under the node's `params:`")
                        })
                    }
                    _ => None,
                }
            }
            "output" if self.output.is_some() => match (self.output?, field) {
                (_, None) | (Shape::Any, _) => None,
                (Shape::Null, Some(_)) => bad("this node produces no output to read".into()),
                (Shape::Text, Some(f)) => bad(format!("`output.{f}`: this node's output is text"))
                    .map(|d| d.help("use `output` itself, or declare `output: {format: json, schema: ...}`")),
                (Shape::Fields(fields), Some(f)) if fields.iter().any(|x| x == f) => None,
                (Shape::Fields(fields), Some(f)) => bad(format!("`output.{f}` is not a field of this node's output"))
                    .map(|d| {
                        d.suggest(f, fields.iter().map(String::as_str))
                            .help_or(format!("its fields are: {}", fields.join(", ")))
                    }),
            },
            "usage" if self.usage => check_fields(src, pointer, "usage", field, USAGE_FIELDS),
            "error" if self.error => check_fields(src, pointer, "error", field, ERROR_FIELDS),
            _ if self.item == Some(root) => None,
            _ if self.predicates && self.sym.predicates.iter().any(|p| p == root) => None,
            _ => {
                let bare = text.trim() == root;
                // Only a condition is a place for a predicate; elsewhere a bare word is more
                // likely text the author forgot to quote.
                let condition = pointer.ends_with("/when");
                let code = if bare && self.predicates && condition {
                    Code::UnknownPredicate
                } else {
                    Code::UndeclaredVariable
                };
                let what = if code == Code::UnknownPredicate {
                    "predicate"
                } else {
                    "name"
                };
                let d = src.diag(code, pointer, format!("unknown {what} `{root}`"));
                let d = if self.sym.state.iter().any(|k| k == root) {
                    d.help(format!("state keys are read as `state.{root}`"))
                } else if root == "output" {
                    d.help("`output` can be read only in a node's `update` and `goto`")
                } else if root == "item" || root == "params" || root == "error" || root == "usage" {
                    d.help(format!("`{root}` is not available here"))
                } else {
                    d.suggest(root, self.roots())
                };
                let d = if bare && !condition {
                    let mut d = d;
                    let quote = format!("for the text `{root}`, quote it as a string literal: `\"'{root}'\"`");
                    match d.help.take() {
                        Some(h) => d.help(format!("{h} ({quote})")),
                        None => d.help(quote),
                    }
                } else {
                    d
                };
                Some(d)
            }
        }
    }

    fn check_config(&self, src: &Source, pointer: &str, path: &[&str]) -> Option<Diagnostic> {
        let mut cur = &self.sym.config;
        let mut walked = String::from("config");
        for seg in path {
            let Value::Object(map) = cur else { return None };
            match map.get(*seg) {
                Some(v) => {
                    cur = v;
                    walked.push('.');
                    walked.push_str(seg);
                }
                None => {
                    return Some(
                        src.diag(
                            Code::UndeclaredVariable,
                            pointer,
                            format!("`{walked}.{seg}` is not in the workflow's `config`"),
                        )
                        .suggest(seg, map.keys().map(String::as_str))
                        .help_or("give it a default under `config:`"),
                    );
                }
            }
        }
        None
    }
}

fn check_fields(src: &Source, pointer: &str, root: &str, field: Option<&str>, known: &[&str]) -> Option<Diagnostic> {
    let f = field?;
    if known.contains(&f) {
        return None;
    }
    Some(
        src.diag(
            Code::UndeclaredVariable,
            pointer,
            format!("`{root}.{f}` does not exist"),
        )
        .suggest(f, known.iter().copied())
        .help_or(format!("`{root}` has: {}", known.join(", "))),
    )
}

/// A JSON Schema's declared property names: `None` when it does not close them off.
pub fn declared_props(schema: &Value) -> Option<Vec<String>> {
    let props = schema.get("properties").and_then(Value::as_object)?;
    if schema
        .get("additionalProperties")
        .is_some_and(|a| a != &Value::Bool(false))
    {
        return None;
    }
    Some(props.keys().cloned().collect())
}

/// What a filter, test or function is, in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Callable {
    Filter,
    Test,
    Function,
}

impl Callable {
    pub(super) fn noun(self) -> &'static str {
        match self {
            Callable::Filter => "filter",
            Callable::Test => "test",
            Callable::Function => "function",
        }
    }
}

/// A position inside an expression or template text: 1-based line, 1-based column in
/// characters, and the column just past the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct TextSpan {
    pub line: u32,
    pub col: u32,
    pub end_col: u32,
}

/// A filter, test or function a text calls that the plan's environment does not have.
#[derive(Debug, Clone)]
pub(super) struct UnknownCall {
    pub what: Callable,
    pub name: String,
    pub at: TextSpan,
    /// The bytes of the name in the text.
    pub range: std::ops::Range<usize>,
    pub help: Option<String>,
}

/// What compiling a text found beyond its syntax: the names it reads (functions it calls,
/// which read like variables to minijinja's analysis, left out) and the filters, tests and
/// functions it calls that the environment lacks.
#[derive(Debug, Clone, Default)]
pub(super) struct Names {
    pub vars: Arc<[String]>,
    /// Each name of `vars` with where the text first reads it.
    pub reads: Arc<[super::reads::Read]>,
    /// The filters, tests and functions it calls, by name.
    pub calls: Arc<[String]>,
    pub unknown: Arc<[UnknownCall]>,
}

/// Filters and tests minijinja can provide, for "did you mean" (each is offered only when
/// the environment really has it).
#[rustfmt::skip]
const FILTER_NAMES: &[&str] = &[
    "abs", "attr", "batch", "bool", "capitalize", "chain", "count", "d", "default", "dictsort", "e", "escape",
    "first", "float", "format", "groupby", "indent", "int", "items", "join", "last", "length", "lines", "list",
    "lower", "map", "max", "min", "pprint", "reject", "rejectattr", "replace", "reverse", "round", "safe",
    "select", "selectattr", "slice", "sort", "split", "string", "sum", "title", "tojson", "trim", "unique",
    "upper", "urlencode", "zip",
];
#[rustfmt::skip]
const TEST_NAMES: &[&str] = &[
    "boolean", "defined", "divisibleby", "endingwith", "eq", "equalto", "escaped", "even", "false", "filter",
    "float", "ge", "greaterthan", "gt", "in", "int", "integer", "iterable", "le", "lessthan", "lower", "lt",
    "mapping", "ne", "none", "number", "odd", "safe", "sameas", "sequence", "startingwith", "string", "test",
    "true", "undefined", "upper",
];
/// Words of the template language that may stand before a parenthesis.
#[rustfmt::skip]
const KEYWORDS: &[&str] = &[
    "if", "elif", "else", "in", "not", "and", "or", "is", "for", "set", "with", "include", "import", "from", "as",
    "call", "filter", "macro", "return", "recursive", "block", "extends", "autoescape", "do", "true", "false",
    "none", "True", "False", "None",
];
/// Names bound by the template machinery itself, callable without being globals.
const MACHINERY: &[&str] = &["caller", "super", "loop", "self", "varargs", "kwargs"];
/// Python builtins people reach for, and the filter that does the same.
const PYTHON_BUILTINS: &[(&str, &str)] = &[
    ("len", "length"),
    ("str", "string"),
    ("sorted", "sort"),
    ("reversed", "reverse"),
    ("abs", "abs"),
    ("int", "int"),
    ("float", "float"),
    ("list", "list"),
    ("sum", "sum"),
    ("min", "min"),
    ("max", "max"),
    ("round", "round"),
    ("bool", "bool"),
];

/// Whether `env` has a filter (or test) named `name`: minijinja reports an unknown one as
/// such when it is applied, before looking at arguments.
fn has_filter(env: &Environment<'_>, name: &str) -> bool {
    !matches!(env.empty_state().apply_filter(name, &[]), Err(e) if e.kind() == ErrorKind::UnknownFilter)
}

fn has_test(env: &Environment<'_>, name: &str) -> bool {
    !matches!(env.empty_state().perform_test(name, &[]), Err(e) if e.kind() == ErrorKind::UnknownTest)
}

/// The filters, tests and functions `text` calls, checked against `env`.
fn scan_calls(env: &Environment<'_>, text: &str, in_expr: bool) -> (Vec<String>, Vec<UnknownCall>) {
    use minijinja::machinery::{Span, Token, tokenize};
    let tokens: Vec<(Token<'_>, Span)> = tokenize(text, in_expr, Default::default())
        .map_while(Result::ok)
        .collect();
    let ident = |i: usize| match tokens.get(i) {
        Some((Token::Ident(n), _)) => Some(*n),
        _ => None,
    };
    let at = |i: usize| {
        let span = tokens[i].1;
        TextSpan {
            line: u32::from(span.start_line),
            col: u32::from(span.start_col) + 1,
            end_col: u32::from(span.end_col) + 1,
        }
    };
    // Names a template binds itself (macros, imports, `set`, loop variables) may be called.
    let mut local: Vec<&str> = Vec::new();
    let mut binding = false;
    for (tok, _) in &tokens {
        match tok {
            Token::Ident("macro" | "set" | "for" | "import" | "as" | "with") => binding = true,
            Token::Ident("in") | Token::BlockEnd | Token::Assign | Token::ParenOpen => binding = false,
            Token::Ident(n) if binding => local.push(n),
            _ => {}
        }
    }
    let mut found: Vec<(Callable, &str, usize)> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let prev = i.checked_sub(1).map(|p| &tokens[p].0);
        match (&tokens[i].0, ident(i + 1)) {
            (Token::Pipe, Some(name)) => {
                found.push((Callable::Filter, name, i + 1));
                i += 2;
                continue;
            }
            (Token::BlockStart, Some("filter")) if ident(i + 2).is_some() => {
                found.push((Callable::Filter, ident(i + 2).unwrap_or_default(), i + 2));
                i += 3;
                continue;
            }
            (Token::Ident("is"), Some(next)) => {
                let test = if next == "not" { i + 2 } else { i + 1 };
                if let Some(name) = ident(test) {
                    found.push((Callable::Test, name, test));
                    i = test + 1;
                    continue;
                }
            }
            (Token::Ident(name), _)
                if !KEYWORDS.contains(name)
                    && matches!(tokens.get(i + 1), Some((Token::ParenOpen, _)))
                    && !matches!(prev, Some(Token::Dot | Token::Ident("macro" | "call"))) =>
            {
                found.push((Callable::Function, *name, i));
            }
            _ => {}
        }
        i += 1;
    }
    let globals: Vec<&str> = env.globals().map(|(n, _)| n).collect();
    let mut called = Vec::new();
    let mut unknown = Vec::new();
    for (what, name, ix) in found {
        let known = match what {
            Callable::Filter => has_filter(env, name),
            Callable::Test => has_test(env, name),
            Callable::Function => {
                called.push(name.to_string());
                globals.contains(&name) || local.contains(&name) || MACHINERY.contains(&name)
            }
        };
        if known || unknown.iter().any(|u: &UnknownCall| u.what == what && u.name == name) {
            continue;
        }
        let help = match what {
            Callable::Filter if FILTER_NAMES.contains(&name) => {
                Some(format!("minijinja's `{name}` filter is not enabled in runner"))
            }
            Callable::Filter => did_you_mean(name, FILTER_NAMES.iter().copied().filter(|f| has_filter(env, f)))
                .map(|b| format!("did you mean `{b}`?")),
            Callable::Test => did_you_mean(name, TEST_NAMES.iter().copied().filter(|t| has_test(env, t)))
                .map(|b| format!("did you mean `{b}`?")),
            Callable::Function => {
                let as_filter = PYTHON_BUILTINS
                    .iter()
                    .find(|(f, _)| *f == name)
                    .map(|(_, filter)| *filter)
                    .or_else(|| has_filter(env, name).then_some(name))
                    .filter(|f| has_filter(env, f));
                match as_filter {
                    Some(filter) => Some(format!("use the filter: `x | {filter}` instead of `{name}(x)`")),
                    None => did_you_mean(name, globals.iter().copied()).map(|b| format!("did you mean `{b}`?")),
                }
            }
        };
        let span = tokens[ix].1;
        unknown.push(UnknownCall {
            what,
            name: name.to_string(),
            at: at(ix),
            range: span.start_offset as usize..span.end_offset as usize,
            help,
        });
    }
    (called, unknown)
}
