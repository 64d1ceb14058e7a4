//! Building a plan: symbols, state channels, nodes (kinds resolved, fields compiled), then
//! edges and graph analysis (in `graph`), then the immutable [`Plan`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use petgraph::stable_graph::StableDiGraph;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::defs::{Defs, check_name};
use super::exprs::{self, Exprs, Names, Scope, Shape, Symbols, TextSpan, UnknownCall, declared_props};
use super::plan::*;
use super::schemas::{Resolver, check, first_violation, validator};
use super::source::Source;
use super::{Compiler, analysis, graph, loops, relative_to};
use crate::diag::{Code, Diagnostic, Pos, Span};
use crate::spec::load::push_pointer;
use crate::spec::{NodeSpec, Workflow};

/// A node while the plan is being built.
pub(super) struct Draft {
    pub name: String,
    pub pointer: String,
    pub user_kind: Option<String>,
    pub spec: Option<NodeSpec>,
    pub params: Vec<String>,
    pub shape: Shape,
    pub item: Option<String>,
    /// The kind's compiled configuration (none when the kind's fields did not compile).
    pub config: Option<super::kind::KindConfig>,
    /// The node's kind is a gate.
    pub gate: bool,
    /// The node's kind retries transient failures by default.
    pub retries: bool,
    pub update: Vec<(String, Writer)>,
    pub goto: Vec<Clause>,
    pub on_error: Option<ErrorHandler>,
    pub branches: Vec<Branch>,
    /// State keys the node may write, with the pointer of each write.
    pub writes: Vec<(String, String)>,
    pub subgraph: Option<Arc<Plan>>,
    /// Parent nodes its subgraph may hand off to (instead of the node's own edges).
    pub handoffs: Vec<NodeIx>,
    /// Its `cache:` policy, when it has one.
    pub cache: Option<super::cache::DraftCache>,
}

pub(super) struct Build<'c, 'a> {
    pub c: &'c mut Compiler,
    pub src: &'a Arc<Source>,
    pub wf: &'a Workflow,
    pub defs: &'a Defs,
    pub diags: &'a mut Vec<Diagnostic>,
    pub exprs: Exprs,
    pub sym: Arc<Symbols>,
    pub resolver: Resolver<'a>,
    pub graph: StableDiGraph<Vertex, Flow>,
    pub start: NodeIx,
    pub end: NodeIx,
    pub index: IndexMap<String, NodeIx>,
    pub drafts: IndexMap<NodeIx, Draft>,
    pub entry: Vec<Branch>,
    pub joins: Vec<(Vec<NodeIx>, Target)>,
    pub state: IndexMap<String, Channel>,
    pub state_schemas: IndexMap<String, Value>,
    pub predicates: IndexMap<String, ExprId>,
    /// The resolved (self-contained) input and context schemas.
    pub io_schemas: (Option<Value>, Option<Value>),
    pub prompts_dir: Option<PathBuf>,
    /// The files (and child plans' hashes) the plan hash covers, by name, added through
    /// [`Build::hash_file`].
    pub hashed_files: Vec<(String, String)>,
    /// For each of `hashed_files`, the node that read it (`None`: the workflow itself, or a
    /// tool, which any node may call): a node's cache fingerprint covers its own files only.
    pub file_owners: Vec<Option<NodeIx>>,
    /// The node being compiled.
    pub compiling: Option<NodeIx>,
    /// An edge is malformed, or named an unknown node and stands for a guess: the graph
    /// analysis would report that one defect again as dead ends, unreachable nodes or loops,
    /// so it is skipped.
    pub broken_edges: bool,
    /// The pointer of the edge that made each of `joins`, in order.
    pub join_sites: Vec<String>,
    /// Route conditions: the node routed from, the pointer of its `when` and its text.
    pub conditions: Vec<(NodeIx, String, String)>,
    /// Handoffs to a parent, by where they are written.
    pub handoffs: Vec<HandoffSite>,
    /// The workflow's tools compiled so far, by name (`None`: did not compile, reported).
    pub tools: std::collections::HashMap<String, Option<Arc<super::kind::Tool>>>,
    /// The tools being compiled, innermost last (a tool whose `run` offers tools names them).
    pub tools_open: Vec<String>,
    /// The model profiles nodes call, with the pointer of the node's `model` field.
    pub model_uses: Vec<(String, String)>,
    /// Every tool name and what declares it, MCP servers' tools read from the lock.
    pub(super) catalog: super::mcp::Catalog,
    /// The workflow's own HTTP endpoints, compiled.
    pub routes: Vec<Route>,
    pub schedules: Vec<super::plan::PlanSchedule>,
}

impl<'c, 'a> Build<'c, 'a> {
    pub(super) fn new(
        c: &'c mut Compiler,
        src: &'a Arc<Source>,
        wf: &'a Workflow,
        defs: &'a Defs,
        diags: &'a mut Vec<Diagnostic>,
    ) -> Self {
        let prompts_dir = prompts_dir(src, wf);
        let catalog = super::mcp::catalog(src, &wf.tools, diags);
        let mut hashed_files = Vec::new();
        let mut file_owners = Vec::new();
        if let Some(text) = &catalog.lock_text {
            hashed_files.push(("mcp-lock".to_string(), text.clone()));
            file_owners.push(None);
        }
        let mut graph = StableDiGraph::default();
        let start = graph.add_node(Vertex::Start);
        let end = graph.add_node(Vertex::End);
        Build {
            c,
            src,
            wf,
            defs,
            diags,
            exprs: Exprs::new(prompts_dir.clone()),
            sym: Arc::new(Symbols::default()),
            resolver: Resolver::new(&defs.types),
            graph,
            start,
            end,
            index: IndexMap::new(),
            drafts: IndexMap::new(),
            entry: Vec::new(),
            joins: Vec::new(),
            state: IndexMap::new(),
            state_schemas: IndexMap::new(),
            predicates: IndexMap::new(),
            io_schemas: (None, None),
            prompts_dir,
            hashed_files,
            file_owners,
            compiling: None,
            broken_edges: false,
            join_sites: Vec::new(),
            conditions: Vec::new(),
            handoffs: Vec::new(),
            tools: std::collections::HashMap::new(),
            tools_open: Vec::new(),
            model_uses: Vec::new(),
            catalog,
            routes: Vec::new(),
            schedules: Vec::new(),
        }
    }

    pub(super) fn run(&mut self) -> Option<Plan> {
        if self.src.doc.value.get("nodes").is_none() {
            self.diags.push(
                self.src
                    .diag(Code::MissingField, "", "the workflow has no `nodes`")
                    .help(
                        "a workflow needs `nodes` and `edges`; a file of shared definitions is used through `imports`",
                    ),
            );
        }
        self.register_nodes();
        self.symbols();
        self.state_channels();
        self.named_exprs();
        self.models();
        graph::edges(self);
        let names: Vec<(NodeIx, String)> = self.drafts.iter().map(|(ix, d)| (*ix, d.name.clone())).collect();
        for (ix, name) in names {
            self.compiling = Some(ix);
            self.node(ix, &name);
            self.compiling = None;
        }
        self.outputs();
        self.routes = super::routes::routes(self);
        self.schedules = super::schedule::schedules(self);
        // A join that can never fire is reported as such; the analysis would only report what
        // follows from it (write conflicts between its sources) in other words.
        if !self.broken_edges && !loops::dead_joins(self) {
            analysis::analyze(self);
            loops::constant_exits(self);
            loops::replaced_in_loops(self);
        }
        if self.diags.iter().any(Diagnostic::is_error) {
            return None;
        }
        self.finish()
    }

    fn register_nodes(&mut self) {
        for name in self.wf.nodes.keys() {
            let pointer = push_pointer("/nodes", name);
            check_name(self.src, &pointer, name, "node", self.diags);
            let ix = self.graph.add_node(Vertex::Node(name.clone()));
            self.index.insert(name.clone(), ix);
            self.drafts.insert(
                ix,
                Draft {
                    name: name.clone(),
                    pointer,
                    user_kind: None,
                    spec: None,
                    params: Vec::new(),
                    shape: Shape::Any,
                    item: None,
                    config: None,
                    gate: false,
                    retries: false,
                    update: Vec::new(),
                    goto: Vec::new(),
                    on_error: None,
                    branches: Vec::new(),
                    writes: Vec::new(),
                    subgraph: None,
                    handoffs: Vec::new(),
                    cache: None,
                },
            );
        }
    }

    fn symbols(&mut self) {
        let mut sym = Symbols {
            // Keys whose definition is malformed still exist (the schema reported them).
            state: self.src.doc.value.get("state").and_then(Value::as_object).map_or_else(
                || self.wf.state.keys().cloned().collect(),
                |m| m.keys().cloned().collect(),
            ),
            predicates: self.defs.predicates.keys().cloned().collect(),
            config: Value::Object(self.wf.config.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            ..Symbols::default()
        };
        for (which, schema) in [("input", &self.wf.input), ("context", &self.wf.context)] {
            let Some(schema) = schema else { continue };
            let root = self
                .resolver
                .resolve(self.src, &format!("/{which}"), &schema.0, self.diags);
            check(self.src, &format!("/{which}"), &root, self.diags);
            let props = declared_props(self.resolver.follow(&root));
            if which == "input" {
                sym.input = Some(props);
                self.io_schemas.0 = Some(root);
            } else {
                sym.context = Some(props);
                self.io_schemas.1 = Some(root);
            }
        }
        self.sym = Arc::new(sym);
    }

    fn state_channels(&mut self) {
        for (key, spec) in &self.wf.state {
            let pointer = push_pointer("/state", key);
            check_name(self.src, &pointer, key, "state key", self.diags);
            let schema = Value::Object(
                spec.schema
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Map<_, _>>(),
            );
            let root = self.resolver.resolve(self.src, &pointer, &schema, self.diags);
            let types = self.resolver.types_of(&root);
            let reducer = match spec.reducer.as_deref() {
                None => Reducer::Replace,
                Some(name) => match Reducer::builtin(name) {
                    Some(r) => r,
                    None => match self.defs.reducers.get(name) {
                        Some(def) => match self.exprs.expr(&def.value) {
                            Ok((id, names)) => {
                                let mut scope = Scope::base(&self.sym);
                                scope.reducer = true;
                                scope.predicates = false;
                                scope.check(&def.src, &def.pointer, &def.value, &names, self.diags);
                                unknown_calls(&def.src, &def.pointer, &def.value, &names, self.diags);
                                Reducer::Custom {
                                    name: name.to_string(),
                                    expr: id,
                                }
                            }
                            Err(e) => {
                                self.diags.push(syntax_error(&def.src, &def.pointer, &def.value, &e));
                                Reducer::Replace
                            }
                        },
                        None => {
                            let all: Vec<&str> = Reducer::BUILTIN_NAMES
                                .iter()
                                .copied()
                                .chain(self.defs.reducers.keys().map(String::as_str))
                                .collect();
                            self.diags.push(
                                self.src
                                    .diag(
                                        Code::UnknownReducer,
                                        &push_pointer(&pointer, "reducer"),
                                        format!("unknown reducer `{name}`"),
                                    )
                                    .suggest(name, all.iter().copied())
                                    .help_or(format!("reducers: {}", all.join(", "))),
                            );
                            Reducer::Replace
                        }
                    },
                },
            };
            if let Some(types) = &types {
                check_reducer_fits(self.src, &pointer, &reducer, spec.reducer.as_deref(), types, self.diags);
            }
            let default = spec.default.clone().unwrap_or(Value::Null);
            let fits = super::verdicts::Check::Value;
            if spec.default.is_some() && !super::verdicts::passed(fits, &[&root, &default]) {
                let before = self.diags.len();
                if let Some(v) = validator(self.src, &pointer, &root, self.diags)
                    && let Some(why) = first_violation(&v, &default)
                {
                    self.diags.push(self.src.diag(
                        Code::DefaultType,
                        &push_pointer(&pointer, "default"),
                        format!("the default of `{key}` does not match its schema: {why}"),
                    ));
                }
                if self.diags.len() == before {
                    super::verdicts::remember(fits, &[&root, &default]);
                }
            } else if spec.default.is_none() {
                check(self.src, &pointer, &root, self.diags);
            }
            let from_input = spec.from_input.as_ref().and_then(|f| f.field(key)).map(str::to_string);
            if let Some(field) = &from_input {
                self.check_input_feed(&pointer, key, field);
            }
            self.state_schemas.insert(key.clone(), root.clone());
            self.state.insert(
                key.clone(),
                Channel {
                    reducer,
                    default,
                    schema: root,
                    from_input,
                },
            );
        }
    }

    /// E216: a key fed from an input field the input cannot hold: the workflow declares no
    /// input (so a run's input must be empty), or its schema lists its fields and not this one.
    fn check_input_feed(&mut self, pointer: &str, key: &str, field: &str) {
        let at = push_pointer(pointer, "from_input");
        let d = match &self.sym.input {
            None => self
                .src
                .diag(
                    Code::InputFeed,
                    &at,
                    format!("`{key}` is fed from the input field `{field}`, but the workflow declares no `input`"),
                )
                .help(format!(
                    "declare `input: {{type: object, properties: {{{field}: ...}}}}`"
                )),
            Some(Some(fields)) if !fields.iter().any(|f| f == field) => self
                .src
                .diag(
                    Code::InputFeed,
                    &at,
                    format!("`{key}` is fed from the input field `{field}`, which the input schema does not declare"),
                )
                .suggest(field, fields.iter().map(String::as_str))
                .help_or(format!(
                    "declare `{field}` under `input.properties`, or name a declared field: `from_input: FIELD`"
                )),
            _ => return,
        };
        self.diags.push(d);
    }

    fn named_exprs(&mut self) {
        for (name, def) in &self.defs.predicates {
            let at = def.expr_pointer();
            match self.exprs.expr(&def.value) {
                Ok((id, names)) => {
                    let mut scope = Scope::base(&self.sym);
                    scope.predicates = false;
                    scope.check(&def.src, &at, &def.value, &names, self.diags);
                    unknown_calls(&def.src, &at, &def.value, &names, self.diags);
                    self.predicates.insert(name.clone(), id);
                }
                Err(e) => self.diags.push(syntax_error(&def.src, &at, &def.value, &e)),
            }
        }
    }

    fn models(&mut self) {
        for (name, model) in &self.wf.models {
            let base = push_pointer("/models", name);
            let Ok(Value::Object(fields)) = serde_json::to_value(model) else {
                continue;
            };
            for (field, value) in fields {
                if let Value::String(s) = value {
                    let at = push_pointer(&base, &field);
                    if field == "api_key_env" {
                        check_env_name(self.src, &at, &s, self.diags);
                    } else {
                        check_interpolation(self.src, &at, &s, self.diags);
                    }
                }
            }
        }
    }

    /// Compiles one expression at `pointer`, checking its names in `scope`.
    pub(super) fn expr(&mut self, pointer: &str, text: &str, scope: Scope) -> Option<ExprId> {
        match self.exprs.expr(text) {
            Ok((id, names)) => {
                scope.check(self.src, pointer, text, &names, self.diags);
                unknown_calls(self.src, pointer, text, &names, self.diags);
                Some(id)
            }
            Err(e) => {
                self.diags.push(syntax_error(self.src, pointer, text, &e));
                None
            }
        }
    }

    /// Compiles a template. An inline template's defects are reported at its field; a prompt
    /// file's at their own line and column in the file, with a note naming the field that uses it.
    pub(super) fn template(&mut self, pointer: &str, name: &str, text: &str, scope: Scope) -> Option<TemplateId> {
        let file = self.template_file(name, text);
        let mut found = Vec::new();
        let id = match self.exprs.template(name, text) {
            Ok((id, names)) => {
                for read in names.reads.iter() {
                    let Some(mut d) = scope.check_one(self.src, pointer, text, &read.name) else {
                        continue;
                    };
                    match &file {
                        Some(file) => move_into(&mut d, file, Some(text_span(text, read.range.start, read.range.end))),
                        None => self.src.narrow(&mut d, pointer, text, read.range.clone()),
                    }
                    found.push(d);
                }
                for call in names.unknown.iter() {
                    let mut d = unknown_call(self.src, pointer, call);
                    match &file {
                        Some(file) => move_into(&mut d, file, Some(call.at)),
                        None => self.src.narrow(&mut d, pointer, text, call.range.clone()),
                    }
                    found.push(d);
                }
                Some(id)
            }
            Err(e) => {
                let mut msg = exprs::first_line(&e);
                if file.is_some()
                    && let Some(i) = msg.find(" (template line ")
                {
                    // The diagnostic itself points at the line.
                    msg.truncate(i);
                }
                let mut d = self.src.diag(
                    Code::TemplateSyntax,
                    pointer,
                    match name.split_once('#') {
                        Some((node, field)) => format!(
                            "the inline template of node `{node}` ({}) does not parse: {msg}",
                            field.trim_start_matches('/')
                        ),
                        None => format!("the template `{name}` does not parse: {msg}"),
                    },
                );
                if let Some(file) = &file {
                    let at = e.range().map(|r| text_span(text, r.start, r.end)).or_else(|| {
                        e.line().map(|l| TextSpan {
                            line: l as u32,
                            col: 1,
                            end_col: 1,
                        })
                    });
                    move_into(&mut d, file, at);
                } else if let Some(range) = e.range() {
                    self.src.narrow(&mut d, pointer, text, range);
                }
                found.push(d);
                None
            }
        };
        self.diags.extend(found);
        id
    }

    /// The path of a prompt file's template (its text registered for rendering), or `None`
    /// for an inline template (named `node#/field`).
    fn template_file(&mut self, name: &str, text: &str) -> Option<Arc<Path>> {
        if name.contains('#') {
            return None;
        }
        let path: Arc<Path> = Arc::from(self.prompts_dir.as_ref()?.join(name));
        self.c.files.add(&path, Arc::from(text));
        Some(path)
    }

    /// Resolves a node's kind, merges its kind's defaults, and compiles its fields.
    fn outputs(&mut self) {
        let Some(keys) = &self.wf.output else { return };
        for (i, key) in keys.iter().enumerate() {
            if !self.wf.state.contains_key(key) && !self.src.declares("state", key) {
                self.diags.push(
                    self.src
                        .diag(
                            Code::UnknownStateKey,
                            &format!("/output/{i}"),
                            format!("output key `{key}` is not a declared state key"),
                        )
                        .suggest(key, self.wf.state.keys().map(String::as_str)),
                );
            }
        }
    }

    fn finish(&mut self) -> Option<Plan> {
        let hash = self.hash();
        let exprs = std::mem::replace(&mut self.exprs, Exprs::new(None));
        let exprs = match exprs.into_table() {
            Ok(t) => t,
            Err(e) => {
                // Every expression compiled once already; a failure here is a bug in this module.
                self.diags.push(self.src.diag(
                    Code::ExprSyntax,
                    "",
                    format!("internal error recompiling expressions: {e}"),
                ));
                return None;
            }
        };
        let mut nodes = IndexMap::with_capacity_and_hasher(self.drafts.len(), Default::default());
        let mut subgraphs = IndexMap::new();
        let mut caches: std::collections::HashMap<NodeIx, NodeCache> = self
            .drafts
            .iter()
            .filter_map(|(ix, d)| Some((*ix, self.node_cache(*ix, d.cache.as_ref()?, d.item.as_deref()))))
            .collect();
        for (ix, d) in std::mem::take(&mut self.drafts) {
            let spec = d.spec?;
            let config = d.config?;
            if let Some(child) = d.subgraph {
                subgraphs.insert(ix, child);
            }
            nodes.insert(
                ix,
                PlanNode {
                    name: d.name,
                    user_kind: d.user_kind,
                    retry: Retry::resolve(spec.common().retry.as_ref(), d.retries),
                    timeout: spec.common().timeout.as_ref().and_then(|t| t.to_std()),
                    spec,
                    update: d.update,
                    config,
                    gate: d.gate,
                    branches: d.branches,
                    goto: d.goto,
                    on_error: d.on_error,
                    item: d.item,
                    cache: caches.remove(&ix),
                },
            );
        }
        self.check_cost_caps();
        let by_name = nodes.iter().map(|(ix, n)| (n.name.clone(), *ix)).collect();
        Some(Plan {
            by_name,
            name: self.wf.name.clone(),
            description: self.wf.description.clone(),
            path: self.src.path().to_path_buf(),
            hash,
            graph: std::mem::take(&mut self.graph),
            start: self.start,
            end: self.end,
            nodes,
            entry: std::mem::take(&mut self.entry),
            joins: std::mem::take(&mut self.joins),
            state: std::mem::take(&mut self.state),
            input_schema: self.io_schemas.0.take(),
            context_schema: self.io_schemas.1.take(),
            config: self.sym.config.clone(),
            output: self.wf.output.clone(),
            recursion_limit: self.wf.limits.as_ref().and_then(|l| l.recursion_limit).unwrap_or(25),
            budget: self.wf.limits.as_ref().map(|l| l.budget()).unwrap_or_default(),
            predicates: std::mem::take(&mut self.predicates),
            models: self.wf.models.clone(),
            subgraphs,
            handoffs: std::mem::take(&mut self.handoffs),
            tools: self.catalog.names.keys().cloned().collect(),
            exprs,
            routes: std::mem::take(&mut self.routes),
            schedules: std::mem::take(&mut self.schedules),
            shared_store: self
                .wf
                .serve
                .as_ref()
                .map(|s| s.shared_store.clone())
                .unwrap_or_default()
                .into(),
            validators: Default::default(),
            node_validators: Default::default(),
        })
    }

    /// SHA-256 over the workflow's data (not its formatting), its definitions from imports,
    /// the prompts and schema files it uses, and its subgraphs' hashes.
    fn hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"runner-plan-v1\0");
        h.update(self.src.doc.value.to_string().as_bytes());
        self.hash_defs(&mut h);
        for (name, text) in &self.hashed_files {
            h.update(format!("\0{name}\0{text}").as_bytes());
        }
        for schema in self.state_schemas.values() {
            h.update(schema.to_string().as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Records a file (or a child plan's hash) the plan hash covers, with the node that read
    /// it: none when a tool is being compiled (every node naming the tool depends on it).
    pub(super) fn hash_file(&mut self, name: String, text: String) {
        self.hashed_files.push((name, text));
        let owner = if self.tools_open.is_empty() {
            self.compiling
        } else {
            None
        };
        self.file_owners.push(owner);
    }

    /// Hashes the definitions of the file and its imports: types, reducers, predicates, kinds.
    pub(super) fn hash_defs(&self, h: &mut Sha256) {
        for (kind, defs) in [
            (
                "type",
                self.defs
                    .types
                    .iter()
                    .map(|(k, d)| (k, d.value.to_string()))
                    .collect::<Vec<_>>(),
            ),
            (
                "reducer",
                self.defs.reducers.iter().map(|(k, d)| (k, d.value.clone())).collect(),
            ),
            (
                "predicate",
                self.defs.predicates.iter().map(|(k, d)| (k, d.value.clone())).collect(),
            ),
            (
                "kind",
                self.defs
                    .kinds
                    .iter()
                    .map(|(k, d)| (k, serde_json::to_string(&d.value).unwrap_or_default()))
                    .collect(),
            ),
        ] {
            for (name, text) in defs {
                h.update(format!("\0{kind}:{name}\0{text}").as_bytes());
            }
        }
    }
}

/// Reports the filters, tests and functions a text calls that do not exist, at `pointer`.
/// E310 for each filter, test or function the expression `text` at `pointer` calls that does
/// not exist, at the name.
pub(super) fn unknown_calls(src: &Source, pointer: &str, text: &str, names: &Names, diags: &mut Vec<Diagnostic>) {
    for call in names.unknown.iter() {
        let mut d = unknown_call(src, pointer, call);
        src.narrow(&mut d, pointer, text, call.range.clone());
        diags.push(d);
    }
}

/// E300 for the expression `text` at `pointer`, at the place minijinja blames when it says.
pub(super) fn syntax_error(src: &Source, pointer: &str, text: &str, e: &exprs::SyntaxError) -> Diagnostic {
    let mut d = src.diag(
        Code::ExprSyntax,
        pointer,
        format!("the expression does not parse: {}", e.message),
    );
    if let Some(range) = e.range.clone() {
        src.narrow(&mut d, pointer, text, range);
    }
    d
}

fn unknown_call(src: &Source, pointer: &str, call: &UnknownCall) -> Diagnostic {
    let d = src.diag(
        Code::UnknownFilter,
        pointer,
        format!("unknown {} `{}`", call.what.noun(), call.name),
    );
    match &call.help {
        Some(help) => d.help(help.clone()),
        None => d.help(format!(
            "see the {}s minijinja provides: https://docs.rs/minijinja/latest/minijinja/{}/",
            call.what.noun(),
            match call.what {
                exprs::Callable::Filter => "filters",
                exprs::Callable::Test => "tests",
                exprs::Callable::Function => "functions",
            }
        )),
    }
}

/// Moves a diagnostic reported at a workflow field into the template file it is about, at
/// `at` (or the file's start), keeping the field as a note.
fn move_into(d: &mut Diagnostic, file: &Arc<Path>, at: Option<TextSpan>) {
    let field = match (&d.file, d.span) {
        (Some(f), Some(s)) => format!("{}:{}:{}", f.display(), s.start.line, s.start.col),
        (Some(f), None) => f.display().to_string(),
        _ => String::new(),
    };
    let node = d
        .pointer
        .as_deref()
        .and_then(|p| p.strip_prefix("/nodes/"))
        .and_then(|p| p.split('/').next())
        .map(|n| format!("node `{n}`"))
        .unwrap_or_else(|| "the workflow".into());
    d.set_note(format!("the template is used by {node} at {field}"));
    d.file = Some(file.clone());
    d.span = Some(match at {
        Some(t) => Span {
            start: Pos {
                line: t.line,
                col: t.col,
            },
            end: Pos {
                line: t.line,
                col: t.end_col,
            },
        },
        None => Span::point(1, 1),
    });
}

/// The line and columns of byte range `start..end` of `text`.
fn text_span(text: &str, start: usize, end: usize) -> TextSpan {
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() as u32 + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() as u32 + 1;
    let len = text
        .get(start..end)
        .map_or(0, |s| s.split('\n').next().unwrap_or_default().chars().count());
    TextSpan {
        line,
        col,
        end_col: col + len as u32,
    }
}

/// Which reducers fit which JSON types.
fn check_reducer_fits(
    src: &Source,
    pointer: &str,
    reducer: &Reducer,
    name: Option<&str>,
    types: &[String],
    diags: &mut Vec<Diagnostic>,
) {
    let needs: &[&str] = match reducer {
        Reducer::Append | Reducer::Extend | Reducer::Union | Reducer::AddMessages => &["array"],
        Reducer::Merge => &["object"],
        Reducer::Sum | Reducer::Max | Reducer::Min => &["number", "integer"],
        Reducer::Replace | Reducer::Custom { .. } => return,
    };
    if types.iter().any(|t| needs.contains(&t.as_str())) {
        return;
    }
    let name = name.unwrap_or("replace");
    diags.push(
        src.diag(
            Code::ReducerType,
            &push_pointer(pointer, "reducer"),
            format!(
                "reducer `{name}` needs {}, but the key is {}",
                needs.join(" or "),
                types.join(" or ")
            ),
        )
        .help(match needs[0] {
            "array" => "declare `type: array`, or use `replace` or `sum`",
            "object" => "declare `type: object`, or use another reducer",
            _ => "declare `type: number`, or use another reducer",
        }),
    );
}

/// Checks that `api_key_env` is the name of an environment variable (the key is read from it
/// when a run starts), not an interpolation that would expand to the key itself.
pub(super) fn check_env_name(src: &Source, pointer: &str, name: &str, diags: &mut Vec<Diagnostic>) {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        return;
    }
    let d = src.diag(
        Code::InvalidValue,
        pointer,
        format!("`api_key_env` is the name of an environment variable, not `{name}`"),
    );
    let inner = name
        .strip_prefix("${env:")
        .and_then(|r| r.strip_suffix('}'))
        .map(|r| r.split_once(":-").map_or(r, |(n, _)| n));
    diags.push(match inner {
        Some(var) => d.help(format!(
            "write `api_key_env: {var}`: runner reads the key from that variable itself, and never writes it into the workflow"
        )),
        None => d.help("a name is letters, digits and `_`, not starting with a digit, e.g. `OPENAI_API_KEY`"),
    });
}

/// Checks `${env:NAME}` / `${env:NAME:-default}` interpolations in `text`.
pub(super) fn check_interpolation(src: &Source, pointer: &str, text: &str, diags: &mut Vec<Diagnostic>) {
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        // `${env:}` is expanded in the workflow's literal text only, never inside a template's
        // `{{ }}` or `{% %}`, where it would go out as it is written.
        let before = &text[..text.len() - rest.len() + i];
        let opened = before.rfind("{{").max(before.rfind("{%"));
        let closed = before.rfind("}}").max(before.rfind("%}"));
        if opened > closed {
            diags.push(
                src.diag(
                    Code::BadInterpolation,
                    pointer,
                    "`${env:...}` inside `{{ }}` or `{% %}` is not expanded",
                )
                .help("write the `${env:NAME}` in the field's literal text, outside the template's braces"),
            );
            return;
        }
        let after = &rest[i + 2..];
        let Some(close) = after.find('}') else {
            diags.push(
                src.diag(Code::BadInterpolation, pointer, "`${` is not closed")
                    .help("write `${env:NAME}` or `${env:NAME:-default}`"),
            );
            return;
        };
        let inner = &after[..close];
        let body = inner.strip_prefix("env:");
        let name = body.map(|b| b.split_once(":-").map_or(b, |(n, _)| n));
        let ok = name.is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if !ok {
            diags.push(
                src.diag(
                    Code::BadInterpolation,
                    pointer,
                    format!("`${{{inner}}}` is not an interpolation runner knows"),
                )
                .help("write `${env:NAME}` or `${env:NAME:-default}`"),
            );
        }
        rest = &after[close + 1..];
    }
}

/// The prompts directory: `prompts:` if set, else the nearest `prompts/` at or above the file.
fn prompts_dir(src: &Source, wf: &Workflow) -> Option<PathBuf> {
    if let Some(p) = &wf.prompts {
        return Some(relative_to(src.path(), p));
    }
    // Walk up from the file's directory as the user wrote it, so paths in messages stay
    // relative (`prompts/plan.j2`, not an absolute path); stop at the filesystem root. The
    // file itself need not exist (a workflow read from standard input), its directory must.
    let mut dir = src.path().parent().map(Path::to_path_buf).unwrap_or_default();
    let here = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir.as_path()
    };
    let depth = std::fs::canonicalize(here).ok()?.ancestors().count() + 1;
    for _ in 0..depth {
        let candidate: PathBuf = dir
            .join("prompts")
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        if candidate.is_dir() {
            return Some(candidate);
        }
        dir = match dir.file_name() {
            Some(name) if name != ".." => dir.parent().map(Path::to_path_buf).unwrap_or_default(),
            _ => dir.join(".."),
        };
    }
    None
}

pub(super) fn list_files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                if out.len() < 10_000 {
                    stack.push(p);
                }
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out
}
