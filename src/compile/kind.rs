//! What the compiler asks of a node kind: its name, the JSON Schema of its own fields, and a
//! compile step that checks those fields and turns them into the kind's typed configuration.
//!
//! A kind is declared once, in its own module of `nodes/`, which implements [`KindDecl`] (and
//! the engine's `NodeKind`, which extends it). The compiler knows no kind by name: it finds
//! each node's kind in the [`KindSet`] it was given and hands the node's fields to it through a
//! [`KindCx`], which offers what a kind needs to compile them (expressions and templates in the
//! node's scope, data maps, prompt files, schemas, model profiles, child workflows) and reports
//! every problem at its place in the file.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use indexmap::IndexMap;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::defs::missing_file;
use super::exprs::Scope;
pub use super::exprs::{Shape, declared_props};
use super::nodes::{Build, check_env_name, check_interpolation};
use super::plan::{Compiled, ExprId, Flow, Named, NodeIx, Plan, TemplateId};
use super::schemas::check;
use super::source::Source;
pub use super::tools::{Tool, ToolRun};
use crate::diag::{Code, Diagnostic};
use crate::spec::load::push_pointer;
use crate::spec::{TextSource, Workflow};

/// A node kind, as the compiler sees it.
pub trait KindDecl: Send + Sync + 'static {
    /// The kind's name as written after `kind:`.
    fn name(&self) -> &'static str;

    /// The JSON Schema of a node of this kind (common fields included), generated in
    /// `generator`: usually `crate::spec::schema::kind_def::<OwnFields>(generator, name)`.
    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value;

    /// Checks a node's own fields and compiles them into the kind's configuration, with the
    /// shape of the node's `output`. `None` when the fields do not make a node (every problem
    /// reported through `cx`); the node's common fields are compiled regardless.
    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)>;

    /// Whether a node of this kind stops the run for a person's answer (drawn as a gate).
    fn is_gate(&self) -> bool {
        false
    }

    /// Whether a node without a `retry` policy makes three attempts at transient failures
    /// (timeouts, rate limits, server and network errors): true for kinds that reach the
    /// network. Decided when the node compiles, into its plan's [`Retry`](super::plan::Retry).
    fn retries_by_default(&self) -> bool {
        false
    }
}

/// A kind's compiled configuration, kept in the plan and handed back to the kind at run time.
#[derive(Clone)]
pub struct KindConfig(Arc<dyn Any + Send + Sync>);

impl KindConfig {
    pub fn new<T: Any + Send + Sync>(config: T) -> KindConfig {
        KindConfig(Arc::new(config))
    }

    /// The configuration as the kind's own type: `None` only if a kind is handed another
    /// kind's node, which the registry (one kind per name) rules out.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for KindConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KindConfig")
    }
}

/// The kinds a compilation knows, by name, in the order they were given (the order the
/// workflow schema lists them).
#[derive(Clone, Default)]
pub struct KindSet {
    by_name: IndexMap<&'static str, Arc<dyn KindDecl>>,
}

impl KindSet {
    /// A set of `kinds`; a later kind of the same name replaces an earlier one.
    pub fn new(kinds: impl IntoIterator<Item = Arc<dyn KindDecl>>) -> KindSet {
        let mut by_name = IndexMap::new();
        for k in kinds {
            by_name.insert(k.name(), k);
        }
        KindSet { by_name }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn KindDecl>> {
        self.by_name.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The names, in order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.by_name.keys().copied()
    }

    /// Each kind's schema, generated in `generator`, in order.
    pub fn schemas(&self, generator: &mut schemars::SchemaGenerator) -> Vec<(&'static str, Value)> {
        self.by_name
            .iter()
            .map(|(name, k)| (*name, k.schema(generator)))
            .collect()
    }
}

impl fmt::Debug for KindSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.by_name.keys()).finish()
    }
}

/// An optional field compiled: `Some(None)` when the node does not have the field, `None`
/// when it has one that did not compile (and was reported), else the compiled value.
pub fn optional<T>(field: Option<Option<T>>) -> Option<Option<T>> {
    field.map_or(Some(None), |f| f.map(Some))
}

/// A compiled data field: one expression, a literal, or a map of expressions and literals (a
/// YAML string is an expression; any other YAML value is a literal).
#[derive(Debug, Clone)]
pub enum Data {
    One(Compiled),
    Map(Vec<(String, Compiled)>),
}

/// A kind's view of the compiler while it compiles one node.
pub struct KindCx<'x, 'c, 'a> {
    pub(super) b: &'x mut Build<'c, 'a>,
    pub(super) ix: NodeIx,
    pub(super) pointer: String,
    pub(super) fields: &'x Map<String, Value>,
    pub(super) scope: Scope<'x>,
    /// Names the fields' templates instead of the node (a tool's `run`, compiled once for
    /// every node that names the tool).
    pub(super) label: Option<String>,
}

impl KindCx<'_, '_, '_> {
    /// The node's name.
    pub fn node(&self) -> &str {
        &self.b.drafts[&self.ix].name
    }

    /// What the fields' templates are named after: the node, or the tool being compiled.
    fn label(&self) -> &str {
        self.label.as_deref().unwrap_or_else(|| self.node())
    }

    /// The node's fields as written (a user kind's defaults merged in).
    pub fn fields(&self) -> &Map<String, Value> {
        self.fields
    }

    /// The node's fields read as the kind's own type. `None` when they do not fit it: the
    /// schema check has reported why.
    pub fn own<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(Value::Object(self.fields.clone())).ok()
    }

    /// The pointer of the node's field at `path` (`["headers", "Accept"]`).
    pub fn at(&self, path: &[&str]) -> String {
        path.iter().fold(self.pointer.clone(), |p, part| push_pointer(&p, part))
    }

    /// The workflow the node belongs to.
    pub fn workflow(&self) -> &Workflow {
        self.b.wf
    }

    /// The file the node is written in, for building diagnostics.
    pub fn source(&self) -> Arc<Source> {
        self.b.src.clone()
    }

    /// How many errors the compilation of this file has reported so far.
    pub fn errors(&self) -> usize {
        self.b.diags.iter().filter(|d| d.is_error()).count()
    }

    /// Reports a problem.
    pub fn report(&mut self, d: Diagnostic) {
        self.b.diags.push(d);
    }

    /// The expression the string field `field` holds, compiled in the node's scope.
    pub fn expr(&mut self, field: &str) -> Option<ExprId> {
        let text = self.fields.get(field)?.as_str()?.to_string();
        let at = self.at(&[field]);
        self.b.expr(&at, &text, self.scope)
    }

    /// The expression `text` written at pointer `at` (see [`KindCx::at`]), compiled in the
    /// node's scope.
    pub fn expr_at(&mut self, at: &str, text: &str) -> Option<ExprId> {
        self.b.expr(at, text, self.scope)
    }

    /// The template `text` written at `path`, compiled in the node's scope.
    pub fn template(&mut self, path: &[&str], text: &str) -> Option<TemplateId> {
        let at = self.at(path);
        let name = format!("{}#/{}", self.label(), path.join("/"));
        self.b.template(&at, &name, text, self.scope)
    }

    /// The template of a text field given as a prompt file or inline (`{text: ...}`).
    pub fn text_source(&mut self, field: &str, source: &TextSource) -> Option<TemplateId> {
        match source {
            TextSource::File(file) => {
                let at = self.at(&[field]);
                let (name, text) = self.b.prompt_file(&at, file)?;
                self.b.template(&at, &name, &text, self.scope)
            }
            TextSource::Inline { text } => {
                let at = self.at(&[field, "text"]);
                let name = format!("{}#/{field}", self.label());
                self.b.template(&at, &name, text, self.scope)
            }
        }
    }

    /// The data value `value` written at `path`: a string is an expression, a map holds one
    /// level of expressions and literals, anything else is a literal. `item` names a loop
    /// variable the expressions may read besides the node's scope.
    pub fn data(&mut self, path: &[&str], value: &Value, item: Option<&str>) -> Option<Data> {
        let scope = match item {
            Some(item) => Scope {
                item: Some(item),
                ..self.scope
            },
            None => self.scope,
        };
        let at = self.at(path);
        match value {
            Value::Object(map) => {
                let mut out = Vec::with_capacity(map.len());
                for (k, v) in map {
                    let at = push_pointer(&at, k);
                    let c = match v {
                        Value::String(text) => Compiled::Expr(self.b.expr(&at, text, scope)?),
                        other => Compiled::Literal(other.clone()),
                    };
                    out.push((k.clone(), c));
                }
                Some(Data::Map(out))
            }
            Value::String(text) => Some(Data::One(Compiled::Expr(self.b.expr(&at, text, scope)?))),
            other => Some(Data::One(Compiled::Literal(other.clone()))),
        }
    }

    /// Checks that the model profile `name`, named at `path`, is declared. `implicit`: the
    /// node names none and gets `default` (`path` is then where it would be written).
    pub fn model(&mut self, path: &[&str], name: &str, implicit: bool) {
        let at = self.at(path);
        self.b.model_ref(&at, name, implicit);
    }

    /// The JSON Schema written at `path`, resolved (types and files inlined) and checked.
    pub fn schema(&mut self, path: &[&str], schema: &Value) -> Value {
        let at = self.at(path);
        let root = self.b.resolver.resolve(self.b.src, &at, schema, self.b.diags);
        check(self.b.src, &at, &root, self.b.diags);
        root
    }

    /// `schema` with its top-level reference followed (what an answer or output must be).
    pub fn followed(&self, schema: &Value) -> Value {
        self.b.resolver.follow(schema).clone()
    }

    /// Reports a `${env:}` inside a template expression of the text at `path`.
    pub fn check_interpolation(&mut self, path: &[&str], text: &str) {
        let at = self.at(path);
        check_interpolation(self.b.src, &at, text, self.b.diags);
    }

    /// Reports an environment variable name at `path` that is not one.
    pub fn check_env_name(&mut self, path: &[&str], name: &str) {
        let at = self.at(path);
        check_env_name(self.b.src, &at, name, self.b.diags);
    }

    /// The workflow file `path` (relative to this workflow's directory), named at field
    /// `field`, compiled as the node's child plan. `None` (reported) when it is missing or
    /// has errors. The child's handoffs are checked against this workflow: each node it hands
    /// off to must be one of this workflow's, each key it writes one of its state keys.
    pub fn child(&mut self, field: &str, path: &str) -> Option<Arc<Plan>> {
        let at = self.at(&[field]);
        // The child plan is kept on the node being compiled, which for a tool's `run` is the
        // node naming the tool: several tools would share it. A workflow tool runs its own
        // child thread per call instead.
        if self.label.is_some() {
            let d = self
                .b
                .src
                .diag(Code::InvalidValue, &at, "a tool's `run` cannot run a workflow")
                .help("write `workflow: file.yaml` on the tool itself to run a workflow as a tool");
            self.b.diags.push(d);
            return None;
        }
        let file = super::relative_to(self.b.src.path(), path);
        if !file.is_file() {
            let d = missing_file(self.b.src, &at, &file, "subgraph workflow");
            self.b.diags.push(d);
            return None;
        }
        let src = self.b.src.clone();
        let child = self.b.c.subgraph(&src, &at, &file, self.b.diags)?;
        self.b.hash_file(format!("subgraph:{path}"), child.hash.clone());
        self.b.drafts[&self.ix].subgraph = Some(child.clone());
        self.check_handoffs(&child, &at);
        Some(child)
    }

    /// The workflow `doc`, generated by the node's kind (an `agent` node's loop), compiled as
    /// the node's child plan, as if it were a file `<this file>#<node>` beside this one. `None`
    /// (reported) when it has errors.
    pub fn generated_child(&mut self, doc: &Value) -> Option<Arc<Plan>> {
        let path = std::path::PathBuf::from(format!("{}#{}", self.b.src.path().display(), self.node()));
        // Pretty JSON is YAML with one value per line, so a problem in it has a useful position.
        let text = serde_json::to_string_pretty(doc).ok()?;
        let child = self.b.c.generated(&path, text)?;
        self.b
            .hash_file(format!("generated:{}", self.node()), child.hash.clone());
        self.b.drafts[&self.ix].subgraph = Some(child.clone());
        Some(child)
    }

    /// E215 for each parent node or key a child's handoff names that this workflow lacks, at
    /// the child's line; the node's handoff targets become graph edges and its writes this
    /// workflow's writes, so the analysis (reachability, write conflicts) sees them.
    fn check_handoffs(&mut self, child: &Plan, at: &str) {
        let child_file: Arc<std::path::Path> = Arc::from(child.path.as_path());
        let parent = self.b.src.path().display().to_string();
        let in_child = |named: &Named, message: String| {
            Diagnostic::new(Code::BadHandoff, message)
                .at(&child_file, named.span)
                .pointer(named.pointer.clone())
        };
        for site in &child.handoffs {
            let to = &site.to.name;
            let target = match to.as_str() {
                "END" => Some(self.b.end),
                _ => self.b.index.get(to).copied(),
            };
            // An unknown name stands for the node it was probably meant to be, so the analysis
            // does not report that node again as unreachable (the error bars the plan anyway).
            let meant = target.or_else(|| {
                crate::diag::did_you_mean(to, self.b.index.keys().map(String::as_str))
                    .and_then(|m| self.b.index.get(m).copied())
            });
            if let Some(t) = meant {
                let label = Some(format!("handoff to `{to}`"));
                self.b.graph.add_edge(self.ix, t, Flow::Goto { label });
                if t != self.b.end {
                    self.b.drafts[&self.ix].handoffs.push(t);
                }
            }
            if target.is_none() {
                let d = in_child(
                    &site.to,
                    format!("`{to}` is not a node of `{parent}`, which runs this workflow as a subgraph"),
                )
                .suggest(to, self.b.index.keys().map(String::as_str).chain(["END"]))
                .help_or(format!("a handoff names a node of the parent workflow `{parent}`"));
                self.b.diags.push(d);
            }
            for key in &site.keys {
                let name = &key.name;
                if self.b.wf.state.contains_key(name) || self.b.src.declares("state", name) {
                    self.b.drafts[&self.ix].writes.push((name.clone(), at.to_string()));
                } else {
                    let d = in_child(
                        key,
                        format!("`{name}` is not a state key of `{parent}`, which runs this workflow as a subgraph"),
                    )
                    .suggest(name, self.b.wf.state.keys().map(String::as_str))
                    .help_or(format!("a handoff writes the state of the parent workflow `{parent}`"));
                    self.b.diags.push(d);
                }
            }
        }
    }
}
