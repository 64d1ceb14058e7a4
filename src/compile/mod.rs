//! Stage 2: compile a checked [`spec::Workflow`](crate::spec::Workflow) into a [`Plan`].
//!
//! Compilation reports every problem it finds, never just the first: each step records
//! diagnostics and carries on with what it could make sense of. Only this module constructs a
//! `Plan`, and it constructs one only when no error was found.
//!
//! Architecture Invariant: compile/ knows nothing of tokio, SQLite or HTTP; it reads files
//! (workflows, prompts, schemas) and nothing else.

mod analysis;
mod cache;
mod costs;
mod defs;
mod exprs;
mod fields;
mod graph;
pub mod kind;
mod kinds;
mod loops;
pub mod mcp;
pub(crate) mod meta;
mod nodes;
pub mod picture;
pub mod plan;
mod reads;
mod replies;
pub mod routes;
pub mod schedule;
pub(crate) mod schemas;
pub mod source;
mod tools;
pub mod verdicts;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use plan::*;
pub(crate) use replies::{BYTES_PER_TOKEN, tokens as estimate_tokens};
pub(crate) use schemas::NodeValidators;
pub use schemas::Validators;

use crate::diag::{Code, Diagnostic, Files};
use source::Source;

/// The result of compiling one or more files.
#[derive(Debug, Default)]
pub struct Compilation {
    pub diagnostics: Vec<Diagnostic>,
    pub files: Files,
}

impl Compilation {
    pub fn errors(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }
    pub fn warnings(&self) -> usize {
        self.diagnostics.len() - self.errors()
    }
}

/// Compiles workflow files, sharing loaded files and compiled subgraphs between them.
#[derive(Default)]
pub struct Compiler {
    diags: Vec<Diagnostic>,
    files: Files,
    sources: HashMap<PathBuf, Option<Arc<Source>>>,
    plans: HashMap<PathBuf, Option<Arc<Plan>>>,
    /// Files being compiled, outermost first, for cycle detection across subgraphs.
    stack: Vec<PathBuf>,
    /// The node kinds nodes may have.
    kinds: kind::KindSet,
    /// Validators of kinds the embedded workflow schema does not list, by kind.
    kind_validators: HashMap<String, Option<Arc<(jsonschema::Validator, serde_json::Value)>>>,
}

impl Compiler {
    /// A compiler of workflows whose nodes have the kinds `kinds`.
    pub fn new(kinds: kind::KindSet) -> Compiler {
        Compiler {
            kinds,
            ..Compiler::default()
        }
    }

    /// Compiles the workflow at `path` (and its imports and subgraphs). `None` when it has
    /// errors, which are kept for [`Compiler::finish`].
    pub fn compile(&mut self, path: &Path) -> Option<Arc<Plan>> {
        let key = canonical(path);
        if let Some(done) = self.plans.get(&key) {
            return done.clone();
        }
        if self.stack.contains(&key) {
            return None;
        }
        self.stack.push(key.clone());
        let before = self.diags.len();
        let plan = self.compile_uncached(path).map(Arc::new);
        // Any error found on the way (in imports and subgraphs too) bars the plan.
        let plan = plan.filter(|_| !self.diags[before..].iter().any(Diagnostic::is_error));
        self.stack.pop();
        self.plans.insert(key, plan.clone());
        plan
    }

    /// Checks a file: a workflow is compiled; a library (no nodes or edges) has its
    /// definitions checked.
    pub fn check(&mut self, path: &Path) {
        let Some(src) = self.source(path) else { return };
        let is_library = src
            .workflow
            .as_ref()
            .is_some_and(|w| w.nodes.is_empty() && w.edges.is_empty())
            && src
                .doc
                .value
                .get("nodes")
                .is_none_or(|n| n.as_object().is_none_or(|o| o.is_empty()));
        if is_library {
            let mut diags = Vec::new();
            defs::check_library(self, &src, &mut diags);
            self.diags.extend(diags);
        } else {
            self.compile(path);
        }
    }

    /// All diagnostics so far, sorted, with the files they point into.
    pub fn finish(mut self) -> Compilation {
        crate::diag::sort(&mut self.diags);
        Compilation {
            diagnostics: self.diags,
            files: self.files,
        }
    }

    /// A validator of nodes of `kind` made from the kind's own schema, for kinds the embedded
    /// workflow schema does not list (built once per compiler).
    pub(super) fn kind_schema_validator(
        &mut self,
        kind: &str,
    ) -> Option<Arc<(jsonschema::Validator, serde_json::Value)>> {
        if let Some(v) = self.kind_validators.get(kind) {
            return v.clone();
        }
        let decl = self.kinds.get(kind)?.clone();
        let mut generator = crate::spec::schema::generator();
        let mut doc = decl.schema(&mut generator);
        let defs: serde_json::Map<String, serde_json::Value> = generator
            .definitions()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(obj) = doc.as_object_mut() {
            obj.insert("$defs".into(), serde_json::Value::Object(defs));
        }
        let v = jsonschema::draft202012::new(&doc).ok().map(|v| Arc::new((v, doc)));
        self.kind_validators.insert(kind.to_string(), v.clone());
        v
    }

    /// Takes `bytes` (a workflow read from standard input) as the text of the file `path`,
    /// which need not exist: relative paths in it resolve from `path`'s directory and its
    /// diagnostics name `path`. Checked by [`Compiler::check`] or compiled like any file, and
    /// read in its stead wherever `path` is imported or embedded.
    pub fn read_as(&mut self, path: &Path, bytes: Vec<u8>) {
        let key = canonical(path);
        let mut diags = Vec::new();
        let src = match crate::spec::load::from_bytes(Arc::from(path), bytes) {
            Ok(file) => {
                self.files.add(&file.path, file.text.clone());
                source::source_of(file, &mut diags).map(Arc::new)
            }
            Err(d) => {
                diags.push(d);
                None
            }
        };
        self.diags.extend(diags);
        self.sources.insert(key, src);
    }

    /// Compiles a workflow a kind generates (an `agent` node's loop) as if it were the file
    /// `path`, which need not exist: relative paths in it resolve from its directory. Compiled
    /// once per path, like a file.
    fn generated(&mut self, path: &Path, text: String) -> Option<Arc<Plan>> {
        let key = canonical(path);
        if !self.sources.contains_key(&key) {
            let mut diags = Vec::new();
            let file = crate::spec::load::SourceFile {
                path: Arc::from(path),
                text: Arc::from(text),
            };
            self.files.add(&file.path, file.text.clone());
            let src = source::source_of(file, &mut diags).map(|s| Arc::new(Source { generated: true, ..s }));
            self.diags.extend(diags);
            self.sources.insert(key, src);
        }
        self.compile(path)
    }

    /// Loads (once) and schema-checks a file.
    fn source(&mut self, path: &Path) -> Option<Arc<Source>> {
        let key = canonical(path);
        if let Some(s) = self.sources.get(&key) {
            return s.clone();
        }
        let mut diags = Vec::new();
        let src = source::load_source(path, &mut diags).map(Arc::new);
        if let Some(s) = &src {
            self.files.add(s.path(), s.doc.file.text.clone());
        } else if let Ok(text) = std::fs::read_to_string(path) {
            self.files.add(path, Arc::from(text));
        }
        self.diags.extend(diags);
        self.sources.insert(key, src.clone());
        src
    }

    fn compile_uncached(&mut self, path: &Path) -> Option<Plan> {
        let src = self.source(path)?;
        let wf = src.workflow.as_ref()?;
        let mut diags = Vec::new();
        let defs = defs::collect(self, &src, wf, &mut diags);
        kinds::check_defaults(self, &src, &defs, &mut diags);
        let mut build = nodes::Build::new(self, &src, wf, &defs, &mut diags);
        let plan = build.run();
        // Schema errors were reported when the file was loaded; they bar a plan as much as any.
        let errors = src.schema_errors || diags.iter().any(Diagnostic::is_error);
        self.diags.extend(diags);
        if errors { None } else { plan }
    }

    /// Compiles a subgraph's workflow, reporting a cycle at `pointer` of `from`.
    fn subgraph(
        &mut self,
        from: &Source,
        pointer: &str,
        path: &Path,
        diags: &mut Vec<Diagnostic>,
    ) -> Option<Arc<Plan>> {
        let key = canonical(path);
        if self.stack.contains(&key) {
            let chain: Vec<String> = self
                .stack
                .iter()
                .skip_while(|p| **p != key)
                .chain(std::iter::once(&key))
                .map(|p| display_name(p))
                .collect();
            diags.push(
                from.diag(
                    Code::ImportCycle,
                    pointer,
                    format!("subgraphs embed each other in a cycle: {}", chain.join(" -> ")),
                )
                .help("a workflow cannot contain itself; break the cycle"),
            );
            return None;
        }
        self.compile(path)
    }
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

fn display_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// Resolves `rel` against the directory of the file `base`.
pub(crate) fn relative_to(base: &Path, rel: &str) -> PathBuf {
    let dir = base.parent().unwrap_or_else(|| Path::new(""));
    let joined = dir.join(rel);
    // Keep paths as the user would write them (no canonicalization): they appear in
    // diagnostics. Fold `a/../` segments for readability.
    let mut out = PathBuf::new();
    for part in joined.components() {
        match part {
            std::path::Component::ParentDir
                if out
                    .components()
                    .next_back()
                    .is_some_and(|c| matches!(c, std::path::Component::Normal(_))) =>
            {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Compiles one workflow file, whose nodes have the kinds `kinds`, and returns the plan, or
/// the diagnostics that prevent one.
pub fn compile_file(path: &Path, kinds: &kind::KindSet) -> (Option<Arc<Plan>>, Compilation) {
    let mut c = Compiler::new(kinds.clone());
    let plan = c.compile(path);
    (plan, c.finish())
}
