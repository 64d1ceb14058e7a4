//! Shared definitions: `types`, `reducers`, `predicates` and `kinds` of a workflow and of
//! everything it imports, with where each was defined.

use std::path::PathBuf;
use std::sync::Arc;

use indexmap::IndexMap;
use serde_json::Value;

use super::kind::KindSet;
use super::source::Source;
use super::{Compiler, canonical, relative_to};
use crate::compile::plan::Reducer;
use crate::diag::{Code, Diagnostic};
use crate::spec::load::push_pointer;
use crate::spec::{KindDef, Workflow};

/// A definition and where it was written.
#[derive(Debug, Clone)]
pub(crate) struct Def<T> {
    pub value: T,
    pub src: Arc<Source>,
    pub pointer: String,
}

/// Every definition visible in a workflow.
#[derive(Debug, Default)]
pub(super) struct Defs {
    pub types: IndexMap<String, Def<Value>>,
    pub reducers: IndexMap<String, Def<String>>,
    pub predicates: IndexMap<String, Def<String>>,
    pub kinds: IndexMap<String, Def<KindDef>>,
}

/// Names that expressions use for their own namespaces; a predicate may not take one.
pub(super) const RESERVED_ROOTS: &[&str] = &[
    "state", "input", "config", "context", "params", "output", "usage", "error", "run", "item", "current", "update",
    "loop", "true", "false", "none", "True", "False", "None",
];

pub(super) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Collects the definitions of `src` and its imports.
pub(super) fn collect(c: &mut Compiler, src: &Arc<Source>, wf: &Workflow, diags: &mut Vec<Diagnostic>) -> Defs {
    let mut defs = Defs::default();
    let mut stack = vec![canonical(src.path())];
    import_all(c, src, wf, &mut defs, &mut stack, diags);
    add_local(&c.kinds, src, wf, &mut defs, diags);
    defs
}

fn import_all(
    c: &mut Compiler,
    src: &Arc<Source>,
    wf: &Workflow,
    defs: &mut Defs,
    stack: &mut Vec<PathBuf>,
    diags: &mut Vec<Diagnostic>,
) {
    for (i, rel) in wf.imports.iter().enumerate() {
        let pointer = format!("/imports/{i}");
        let path = relative_to(src.path(), rel);
        if !path.is_file() {
            diags.push(missing_file(src, &pointer, &path, "imported file"));
            continue;
        }
        let key = canonical(&path);
        if stack.contains(&key) {
            let chain: Vec<String> = stack
                .iter()
                .skip_while(|p| **p != key)
                .chain(std::iter::once(&key))
                .map(|p| super::display_name(p))
                .collect();
            diags.push(
                src.diag(
                    Code::ImportCycle,
                    &pointer,
                    format!("files import each other in a cycle: {}", chain.join(" -> ")),
                )
                .help("move the shared definitions into a file that imports neither"),
            );
            continue;
        }
        let Some(lib) = c.source(&path) else { continue };
        let Some(lib_wf) = lib.workflow.clone() else { continue };
        if !lib_wf.nodes.is_empty() || !lib_wf.edges.is_empty() || !lib_wf.tools.is_empty() {
            diags.push(
                src.diag(
                    Code::BadImport,
                    &pointer,
                    format!(
                        "`{rel}` defines nodes, edges or tools; an import shares only types, reducers, predicates and kinds"
                    ),
                )
                .help("use a `subgraph` node to run another workflow"),
            );
        }
        stack.push(key);
        import_all(c, &lib, &lib_wf, defs, stack, diags);
        stack.pop();
        add_local(&c.kinds, &lib, &lib_wf, defs, diags);
    }
}

fn add_local(kinds: &KindSet, src: &Arc<Source>, wf: &Workflow, defs: &mut Defs, diags: &mut Vec<Diagnostic>) {
    for (name, t) in &wf.types {
        let pointer = push_pointer("/types", name);
        check_name(src, &pointer, name, "type", diags);
        insert(
            &mut defs.types,
            name,
            Def {
                value: t.0.clone(),
                src: src.clone(),
                pointer,
            },
            "type",
            diags,
        );
    }
    for (name, r) in &wf.reducers {
        let pointer = push_pointer("/reducers", name);
        check_name(src, &pointer, name, "reducer", diags);
        if Reducer::builtin(name).is_some() {
            diags.push(
                src.diag_key(Code::ReservedName, &pointer, format!("`{name}` is a built-in reducer"))
                    .help("give the custom reducer another name"),
            );
        }
        insert(
            &mut defs.reducers,
            name,
            Def {
                value: r.expr().to_string(),
                src: src.clone(),
                pointer,
            },
            "reducer",
            diags,
        );
    }
    for (name, p) in &wf.predicates {
        let pointer = push_pointer("/predicates", name);
        check_name(src, &pointer, name, "predicate", diags);
        if RESERVED_ROOTS.contains(&name.as_str()) {
            diags.push(
                src.diag_key(
                    Code::ReservedName,
                    &pointer,
                    format!("`{name}` is reserved in expressions"),
                )
                .help("give the predicate another name"),
            );
        }
        insert(
            &mut defs.predicates,
            name,
            Def {
                value: p.expr().to_string(),
                src: src.clone(),
                pointer,
            },
            "predicate",
            diags,
        );
    }
    for (name, k) in &wf.kinds {
        let pointer = push_pointer("/kinds", name);
        check_name(src, &pointer, name, "kind", diags);
        if kinds.contains(name) {
            diags.push(
                src.diag_key(Code::ReservedName, &pointer, format!("`{name}` is a built-in kind"))
                    .help("give the user kind another name"),
            );
        }
        insert(
            &mut defs.kinds,
            name,
            Def {
                value: k.clone(),
                src: src.clone(),
                pointer,
            },
            "kind",
            diags,
        );
    }
}

fn insert<T>(map: &mut IndexMap<String, Def<T>>, name: &str, def: Def<T>, what: &str, diags: &mut Vec<Diagnostic>) {
    if let Some(prev) = map.get(name) {
        if Arc::ptr_eq(&prev.src, &def.src) {
            return;
        }
        diags.push(
            def.src
                .diag_key(
                    Code::DuplicateName,
                    &def.pointer,
                    format!("{what} `{name}` is already defined in {}", prev.src.path().display()),
                )
                .label(
                    prev.src.path(),
                    prev.src.doc.spans.key(&prev.pointer),
                    format!("`{name}` is first defined here"),
                )
                .help(format!("rename one of the two {what}s")),
        );
        return;
    }
    map.insert(name.to_string(), def);
}

/// Reports a name that is not an identifier or is reserved.
pub(super) fn check_name(src: &Source, pointer: &str, name: &str, what: &str, diags: &mut Vec<Diagnostic>) {
    if name == "START" || name == "END" {
        diags.push(
            src.diag_key(Code::ReservedName, pointer, format!("`{name}` is reserved"))
                .help(format!("name the {what} something else")),
        );
    } else if !is_identifier(name) {
        diags.push(
            src.diag_key(
                Code::ReservedName,
                pointer,
                format!("{what} name `{name}` is not an identifier"),
            )
            .help("use letters, digits and `_`, not starting with a digit"),
        );
    }
}

/// A missing referenced file, with "did you mean" among its would-be siblings.
pub(super) fn missing_file(src: &Source, pointer: &str, path: &std::path::Path, what: &str) -> Diagnostic {
    let siblings: Vec<String> = path
        .parent()
        .map(|d| {
            if d.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                d
            }
        })
        .and_then(|d| std::fs::read_dir(d).ok())
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    src.diag(
        Code::MissingFile,
        pointer,
        format!("{what} `{}` does not exist", path.display()),
    )
    .suggest(&name, siblings.iter().map(String::as_str))
}

impl Def<String> {
    /// Where the expression of a predicate or reducer is written: its value, or the `expr`
    /// of a predicate written as `{expr, description}`.
    pub(super) fn expr_pointer(&self) -> String {
        match self.src.doc.value.pointer(&self.pointer) {
            Some(Value::Object(_)) => push_pointer(&self.pointer, "expr"),
            _ => self.pointer.clone(),
        }
    }
}

/// Checks a library file (definitions only): names, imports, expression syntax, kinds.
pub(super) fn check_library(c: &mut Compiler, src: &Arc<Source>, diags: &mut Vec<Diagnostic>) {
    let Some(wf) = src.workflow.clone() else { return };
    let defs = collect(c, src, &wf, diags);
    let mut exprs = super::exprs::Exprs::new(None);
    for d in defs.reducers.values().chain(defs.predicates.values()) {
        if Arc::ptr_eq(&d.src, src)
            && let Err(e) = exprs.expr(&d.value)
        {
            diags.push(super::nodes::syntax_error(&d.src, &d.expr_pointer(), &d.value, &e));
        }
    }
    for (name, k) in &defs.kinds {
        if Arc::ptr_eq(&k.src, src)
            && let Err(d) = super::kinds::kind_chain(&c.kinds, &defs, name, &k.src, &k.pointer)
        {
            diags.push(d);
        }
    }
    super::kinds::check_defaults(c, src, &defs, diags);
}
