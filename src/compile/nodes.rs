//! Building a plan: symbols, state channels, nodes (kinds resolved, fields compiled), then
//! edges and graph analysis (in `graph`), then the immutable [`Plan`].

use std::path::PathBuf;
use std::sync::Arc;

use indexmap::IndexMap;
use petgraph::stable_graph::StableDiGraph;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::defs::{Def, Defs, check_name, missing_file};
use super::exprs::{Exprs, Scope, Shape, Symbols, declared_props};
use super::plan::*;
use super::schemas::{Resolver, first_violation, validator};
use super::source::{Source, kind_validator, schema_errors};
use super::{Compiler, graph, relative_to};
use crate::diag::{Code, Diagnostic};
use crate::spec::load::push_pointer;
use crate::spec::{BUILTIN_KINDS, LlmOutput, NodeSpec, OnError, OutputFormat, TextSource, Workflow};

/// A node while the plan is being built.
pub(super) struct Draft {
    pub name: String,
    pub pointer: String,
    pub user_kind: Option<String>,
    pub spec: Option<NodeSpec>,
    pub params: Vec<String>,
    pub shape: Shape,
    pub item: Option<String>,
    pub fields: IndexMap<String, Compiled>,
    pub update: Vec<(String, Writer)>,
    pub goto: Vec<Clause>,
    pub on_error: Option<ErrorHandler>,
    pub branches: Vec<Branch>,
    /// State keys the node may write, with the pointer of each write.
    pub writes: Vec<(String, String)>,
    pub subgraph: Option<Arc<Plan>>,
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
    prompts_dir: Option<PathBuf>,
    hashed_files: Vec<(String, String)>,
}

impl<'c, 'a> Build<'c, 'a> {
    pub fn new(
        c: &'c mut Compiler,
        src: &'a Arc<Source>,
        wf: &'a Workflow,
        defs: &'a Defs,
        diags: &'a mut Vec<Diagnostic>,
    ) -> Self {
        let prompts_dir = prompts_dir(src, wf);
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
            prompts_dir,
            hashed_files: Vec::new(),
        }
    }

    pub fn run(&mut self) -> Option<Plan> {
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
            self.node(ix, &name);
        }
        self.outputs();
        graph::analyze(self);
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
                    fields: IndexMap::new(),
                    update: Vec::new(),
                    goto: Vec::new(),
                    on_error: None,
                    branches: Vec::new(),
                    writes: Vec::new(),
                    subgraph: None,
                },
            );
        }
    }

    fn symbols(&mut self) {
        let mut sym = Symbols {
            state: self.wf.state.keys().cloned().collect(),
            predicates: self.defs.predicates.keys().cloned().collect(),
            config: Value::Object(self.wf.config.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
            ..Symbols::default()
        };
        for (which, schema) in [("input", &self.wf.input), ("context", &self.wf.context)] {
            let Some(schema) = schema else { continue };
            let root = self
                .resolver
                .resolve(self.src, &format!("/{which}"), &schema.0, self.diags);
            validator(self.src, &format!("/{which}"), &root, self.diags);
            let props = declared_props(self.resolver.follow(&root));
            if which == "input" {
                sym.input = Some(props);
            } else {
                sym.context = Some(props);
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
                            Ok((id, vars)) => {
                                let mut scope = Scope::base(&self.sym);
                                scope.reducer = true;
                                scope.predicates = false;
                                scope.check(&def.src, &def.pointer, &def.value, &vars, self.diags);
                                Reducer::Custom {
                                    name: name.to_string(),
                                    expr: id,
                                }
                            }
                            Err(e) => {
                                self.diags.push(def.src.diag(Code::ExprSyntax, &def.pointer, e));
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
            if spec.default.is_some() {
                if let Some(v) = validator(self.src, &pointer, &root, self.diags)
                    && let Some(why) = first_violation(&v, &default)
                {
                    self.diags.push(self.src.diag(
                        Code::DefaultType,
                        &push_pointer(&pointer, "default"),
                        format!("the default of `{key}` does not match its schema: {why}"),
                    ));
                }
            } else {
                validator(self.src, &pointer, &root, self.diags);
            }
            self.state_schemas.insert(key.clone(), root.clone());
            self.state.insert(
                key.clone(),
                Channel {
                    reducer,
                    default,
                    schema: root,
                },
            );
        }
    }

    fn named_exprs(&mut self) {
        for (name, def) in &self.defs.predicates {
            match self.exprs.expr(&def.value) {
                Ok((id, vars)) => {
                    let mut scope = Scope::base(&self.sym);
                    scope.predicates = false;
                    scope.check(&def.src, &def.pointer, &def.value, &vars, self.diags);
                    self.predicates.insert(name.clone(), id);
                }
                Err(e) => self.diags.push(def.src.diag(Code::ExprSyntax, &def.pointer, e)),
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
                    check_interpolation(self.src, &push_pointer(&base, &field), &s, self.diags);
                }
            }
        }
    }

    /// Compiles one expression at `pointer`, checking its names in `scope`.
    pub fn expr(&mut self, pointer: &str, text: &str, scope: Scope) -> Option<ExprId> {
        match self.exprs.expr(text) {
            Ok((id, vars)) => {
                scope.check(self.src, pointer, text, &vars, self.diags);
                Some(id)
            }
            Err(e) => {
                self.diags.push(self.src.diag(
                    Code::ExprSyntax,
                    pointer,
                    format!("the expression does not parse: {e}"),
                ));
                None
            }
        }
    }

    fn template(&mut self, pointer: &str, name: &str, text: &str, scope: Scope) -> Option<TemplateId> {
        match self.exprs.template(name, text) {
            Ok((id, vars)) => {
                scope.check(self.src, pointer, text, &vars, self.diags);
                Some(id)
            }
            Err(e) => {
                self.diags.push(self.src.diag(
                    Code::TemplateSyntax,
                    pointer,
                    format!("the template `{name}` does not parse: {e}"),
                ));
                None
            }
        }
    }

    /// Resolves a node's kind, merges its kind's defaults, and compiles its fields.
    fn node(&mut self, ix: NodeIx, name: &str) {
        let pointer = self.drafts[&ix].pointer.clone();
        let Some(Value::Object(own)) = self.wf.nodes.get(name).cloned() else {
            return;
        };
        let Some(kind) = own.get("kind").and_then(Value::as_str).map(str::to_string) else {
            return;
        };
        let kind_pointer = push_pointer(&pointer, "kind");
        let (builtin, merged, declared_params) = if BUILTIN_KINDS.contains(&kind.as_str()) {
            (kind.clone(), own.clone(), IndexMap::new())
        } else {
            let chain = match kind_chain(self.defs, &kind, self.src, &kind_pointer) {
                Ok(c) => c,
                Err(d) => {
                    self.diags.push(d);
                    return;
                }
            };
            let (builtin, mut merged, params) = merge_kind(&chain, &own);
            merged.insert("kind".into(), Value::String(builtin.clone()));
            if let Some(v) = kind_validator(&builtin) {
                schema_errors(v, &Value::Object(merged.clone()), &self.src.doc, &pointer, self.diags);
            }
            self.drafts[&ix].user_kind = Some(kind.clone());
            (builtin, merged, params)
        };
        let mut merged = merged;
        merged.insert("kind".into(), Value::String(builtin.clone()));
        self.check_params(ix, &pointer, &mut merged, &declared_params);
        let Ok(spec) = serde_json::from_value::<NodeSpec>(Value::Object(merged.clone())) else {
            // The schema reported why; the node stays in the graph without its fields.
            return;
        };
        let sym = self.sym.clone();
        let item = self.drafts[&ix].item.clone();
        let params = self.drafts[&ix].params.clone();
        let scope = Scope {
            params: Some(&params),
            item: item.as_deref(),
            ..Scope::base(&sym)
        };
        let shape = self.kind_fields(ix, &pointer, &spec, &merged, scope);
        self.drafts[&ix].shape = shape.clone();
        // `update` and `goto` see the output; `on_error` sees the error instead.
        let params = self.drafts[&ix].params.clone();
        let after = Scope {
            params: Some(&params),
            item: item.as_deref(),
            output: Some(&shape),
            usage: true,
            ..Scope::base(&sym)
        };
        let common = spec.common().clone();
        let update = self.writes(ix, &push_pointer(&pointer, "update"), &common.update, after);
        self.drafts[&ix].update = update;
        let goto_pointer = push_pointer(&pointer, "goto");
        let goto = graph::clauses(self, Some(ix), &goto_pointer, &common.goto, after, true);
        self.drafts[&ix].goto = goto;
        if let Some(on_error) = &common.on_error {
            let on_pointer = push_pointer(&pointer, "on_error");
            let (to, upd) = match on_error {
                OnError::To(t) => (t.clone(), IndexMap::new()),
                OnError::Handler { to, update } => (to.clone(), update.clone()),
            };
            let to_pointer = if matches!(on_error, OnError::To(_)) {
                on_pointer.clone()
            } else {
                push_pointer(&on_pointer, "to")
            };
            let target = graph::target(self, &to_pointer, &to);
            let err_scope = Scope {
                params: Some(&params),
                item: item.as_deref(),
                error: true,
                ..Scope::base(&sym)
            };
            let update = self.writes(ix, &push_pointer(&on_pointer, "update"), &upd, err_scope);
            if let Some(target) = target {
                let t = match target {
                    Target::Node(n) => n,
                    Target::End => self.end,
                };
                self.graph.add_edge(ix, t, Flow::OnError);
                self.drafts[&ix].on_error = Some(ErrorHandler { to: target, update });
            }
        }
        self.drafts[&ix].spec = Some(spec);
    }

    fn check_params(
        &mut self,
        ix: NodeIx,
        pointer: &str,
        merged: &mut Map<String, Value>,
        declared: &IndexMap<String, Def<Value>>,
    ) {
        let given: Map<String, Value> = merged
            .get("params")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut params = given.clone();
        let ppointer = push_pointer(pointer, "params");
        if !declared.is_empty() {
            for (name, value) in &given {
                if !declared.contains_key(name) {
                    self.diags.push(
                        self.src
                            .diag_key(
                                Code::BadParams,
                                &push_pointer(&ppointer, name),
                                format!("`{name}` is not a parameter of this node's kind"),
                            )
                            .suggest(name, declared.keys().map(String::as_str))
                            .help_or(format!(
                                "its parameters: {}",
                                declared.keys().cloned().collect::<Vec<_>>().join(", ")
                            )),
                    );
                    let _ = value;
                }
            }
            for (name, def) in declared {
                match (given.get(name), def.value.get("default")) {
                    (Some(v), _) => {
                        let root = self.resolver.resolve(&def.src, &def.pointer, &def.value, self.diags);
                        if let Some(val) = validator(&def.src, &def.pointer, &root, self.diags)
                            && let Some(why) = first_violation(&val, v)
                        {
                            self.diags.push(self.src.diag(
                                Code::BadParams,
                                &push_pointer(&ppointer, name),
                                format!("parameter `{name}` does not fit its schema: {why}"),
                            ));
                        }
                    }
                    (None, Some(d)) => {
                        params.insert(name.clone(), d.clone());
                    }
                    (None, None) => self.diags.push(
                        self.src
                            .diag_key(
                                Code::BadParams,
                                pointer,
                                format!("the node's kind requires parameter `{name}`"),
                            )
                            .help(format!("add `params: {{{name}: ...}}`")),
                    ),
                }
            }
        }
        // Declared parameters are in scope even when missing (that is reported once, above).
        let mut names: Vec<String> = params.keys().cloned().collect();
        names.extend(declared.keys().filter(|k| !params.contains_key(*k)).cloned());
        self.drafts[&ix].params = names;
        merged.insert("params".into(), Value::Object(params));
    }

    /// Compiles a `key: expression` map of state writes.
    fn writes(
        &mut self,
        ix: NodeIx,
        pointer: &str,
        update: &IndexMap<String, Value>,
        scope: Scope,
    ) -> Vec<(String, Writer)> {
        let mut out = Vec::new();
        for (key, value) in update {
            let at = push_pointer(pointer, key);
            if !self.wf.state.contains_key(key) {
                self.diags.push(
                    self.src
                        .diag_key(
                            Code::UnknownStateKey,
                            &at,
                            format!("`{key}` is not a declared state key"),
                        )
                        .suggest(key, self.wf.state.keys().map(String::as_str))
                        .help_or("declare it under `state:`"),
                );
            }
            let writer = match value {
                Value::String(text) => match self.expr(&at, text, scope) {
                    Some(id) => Writer::Expr(id),
                    None => continue,
                },
                other => Writer::Literal(other.clone()),
            };
            self.drafts[&ix].writes.push((key.clone(), at));
            out.push((key.clone(), writer));
        }
        out
    }

    /// Compiles a data value: a string is an expression, a map holds data values, anything
    /// else is a literal.
    fn data(
        &mut self,
        fields: &mut IndexMap<String, Compiled>,
        pointer: &str,
        rel: &str,
        value: &Value,
        scope: Scope,
        map_level: bool,
    ) {
        match value {
            Value::String(text) => {
                if let Some(id) = self.expr(pointer, text, scope) {
                    fields.insert(rel.to_string(), Compiled::Expr(id));
                }
            }
            Value::Object(map) if map_level => {
                for (k, v) in map {
                    self.data(
                        fields,
                        &push_pointer(pointer, k),
                        &push_pointer(rel, k),
                        v,
                        scope,
                        false,
                    );
                }
            }
            other => {
                fields.insert(rel.to_string(), Compiled::Literal(other.clone()));
            }
        }
    }

    fn kind_fields(
        &mut self,
        ix: NodeIx,
        pointer: &str,
        spec: &NodeSpec,
        v: &Map<String, Value>,
        scope: Scope,
    ) -> Shape {
        let mut fields = IndexMap::new();
        let name = self.drafts[&ix].name.clone();
        let fixed = |names: &[&str]| Shape::Fields(names.iter().map(|s| s.to_string()).collect());
        let expr_field = |b: &mut Self, fields: &mut IndexMap<String, Compiled>, field: &str, scope: Scope| {
            if let Some(Value::String(text)) = v.get(field)
                && let Some(id) = b.expr(&push_pointer(pointer, field), text, scope)
            {
                fields.insert(format!("/{field}"), Compiled::Expr(id));
            }
        };
        let template_field =
            |b: &mut Self, fields: &mut IndexMap<String, Compiled>, rel: &str, at: &str, text: &str, scope: Scope| {
                if let Some(id) = b.template(at, &format!("{name}#{rel}"), text, scope) {
                    fields.insert(rel.to_string(), Compiled::Template(id));
                }
            };
        let shape = match spec {
            NodeSpec::Llm(n) => {
                for (field, source) in [("prompt", Some(&n.kind.prompt)), ("system", n.kind.system.as_ref())] {
                    let Some(source) = source else { continue };
                    let at = push_pointer(pointer, field);
                    match source {
                        TextSource::File(rel) => {
                            if let Some((tname, text)) = self.prompt_file(&at, rel)
                                && let Some(id) = self.template(&at, &tname, &text, scope)
                            {
                                fields.insert(format!("/{field}"), Compiled::Template(id));
                            }
                        }
                        TextSource::Inline { text } => template_field(
                            self,
                            &mut fields,
                            &format!("/{field}"),
                            &push_pointer(&at, "text"),
                            text,
                            scope,
                        ),
                    }
                }
                if let Some(h) = &n.kind.history {
                    let at = push_pointer(&push_pointer(pointer, "history"), "from");
                    if let Some(id) = self.expr(&at, &h.from, scope) {
                        fields.insert("/history/from".into(), Compiled::Expr(id));
                    }
                }
                self.model_ref(
                    &push_pointer(pointer, "model"),
                    n.kind.model.as_deref().unwrap_or("default"),
                    n.kind.model.is_none(),
                );
                match &n.kind.output {
                    None | Some(LlmOutput::Format(OutputFormat::Text)) => Shape::Text,
                    Some(LlmOutput::Format(OutputFormat::Json)) => Shape::Any,
                    Some(LlmOutput::Spec {
                        format: OutputFormat::Text,
                        ..
                    }) => Shape::Text,
                    Some(LlmOutput::Spec { schema: None, .. }) => Shape::Any,
                    Some(LlmOutput::Spec { schema: Some(s), .. }) => {
                        let at = push_pointer(&push_pointer(pointer, "output"), "schema");
                        let root = self.resolver.resolve(self.src, &at, &s.0, self.diags);
                        validator(self.src, &at, &root, self.diags);
                        let shape = Shape::of_schema(self.resolver.follow(&root));
                        fields.insert("/output/schema".into(), Compiled::Literal(root));
                        shape
                    }
                }
            }
            NodeSpec::Set(_) => Shape::Null,
            NodeSpec::Emit(n) => {
                expr_field(self, &mut fields, "foreach", scope);
                if let Some(data) = &n.kind.data {
                    let item_scope = if n.kind.foreach.is_some() {
                        Scope {
                            item: Some("item"),
                            ..scope
                        }
                    } else {
                        scope
                    };
                    self.data(
                        &mut fields,
                        &push_pointer(pointer, "data"),
                        "/data",
                        data,
                        item_scope,
                        true,
                    );
                }
                Shape::Any
            }
            NodeSpec::Interrupt(n) => {
                if let Some(msg) = &n.kind.message {
                    template_field(
                        self,
                        &mut fields,
                        "/message",
                        &push_pointer(pointer, "message"),
                        msg,
                        scope,
                    );
                }
                let payload = Value::Object(n.kind.payload.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
                self.data(
                    &mut fields,
                    &push_pointer(pointer, "payload"),
                    "/payload",
                    &payload,
                    scope,
                    true,
                );
                let at = push_pointer(pointer, "response");
                let root = self.resolver.resolve(self.src, &at, &n.kind.response.0, self.diags);
                validator(self.src, &at, &root, self.diags);
                let followed = self.resolver.follow(&root).clone();
                if accepts_anything(&followed) {
                    self.diags.push(
                        self.src
                            .diag(Code::InterruptResponse, &at, "the gate's response schema accepts any answer")
                            .help("declare what an answer looks like, e.g. {type: object, required: [action], properties: {action: {enum: [accept, edit, respond, ignore]}}}"),
                    );
                }
                fields.insert("/response".into(), Compiled::Literal(root));
                Shape::of_schema(&followed)
            }
            NodeSpec::Subgraph(n) => {
                let at = push_pointer(pointer, "workflow");
                let path = relative_to(self.src.path(), &n.kind.workflow);
                let input = Value::Object(n.kind.input.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
                self.data(
                    &mut fields,
                    &push_pointer(pointer, "input"),
                    "/input",
                    &input,
                    scope,
                    true,
                );
                if !path.is_file() {
                    self.diags.push(missing_file(self.src, &at, &path, "subgraph workflow"));
                    Shape::Any
                } else {
                    let src = self.src.clone();
                    match self.c.subgraph(&src, &at, &path, self.diags) {
                        Some(child) => {
                            if let Some(Some(props)) = child.input_schema.as_ref().map(declared_props) {
                                for key in n.kind.input.keys() {
                                    if !props.contains(key) {
                                        self.diags.push(
                                            self.src
                                                .diag_key(
                                                    Code::UnknownField,
                                                    &push_pointer(&push_pointer(pointer, "input"), key),
                                                    format!("the subgraph's input has no field `{key}`"),
                                                )
                                                .suggest(key, props.iter().map(String::as_str)),
                                        );
                                    }
                                }
                            }
                            let keys = child
                                .output
                                .clone()
                                .unwrap_or_else(|| child.state.keys().cloned().collect());
                            self.hashed_files
                                .push((format!("subgraph:{}", n.kind.workflow), child.hash.clone()));
                            self.drafts[&ix].subgraph = Some(child);
                            Shape::Fields(keys)
                        }
                        None => Shape::Any,
                    }
                }
            }
            NodeSpec::Http(n) => {
                template_field(
                    self,
                    &mut fields,
                    "/url",
                    &push_pointer(pointer, "url"),
                    &n.kind.url,
                    scope,
                );
                for (group, map) in [
                    ("headers", &n.kind.headers),
                    ("query", &n.kind.query),
                    ("form", &n.kind.form),
                ] {
                    for (k, text) in map {
                        let at = push_pointer(&push_pointer(pointer, group), k);
                        if group == "headers" {
                            check_interpolation(self.src, &at, text, self.diags);
                        }
                        template_field(self, &mut fields, &format!("/{group}/{k}"), &at, text, scope);
                    }
                }
                if let Some(body) = &n.kind.body {
                    self.data(&mut fields, &push_pointer(pointer, "body"), "/body", body, scope, true);
                }
                fixed(&["status", "headers", "body"])
            }
            NodeSpec::Search(n) => {
                expr_field(self, &mut fields, "queries", scope);
                expr_field(self, &mut fields, "tag", scope);
                if let Some(url) = &n.kind.base_url {
                    check_interpolation(self.src, &push_pointer(pointer, "base_url"), url, self.diags);
                }
                fixed(&["results"])
            }
            NodeSpec::Scrape(_) => {
                expr_field(self, &mut fields, "urls", scope);
                expr_field(self, &mut fields, "skip", scope);
                fixed(&["pages", "errors"])
            }
            NodeSpec::Index(n) => {
                expr_field(self, &mut fields, "documents", scope);
                if let Some(m) = &n.kind.embeddings {
                    self.model_ref(&push_pointer(pointer, "embeddings"), m, false);
                }
                fixed(&["documents", "chunks", "skipped"])
            }
            NodeSpec::Retrieve(n) => {
                expr_field(self, &mut fields, "queries", scope);
                expr_field(self, &mut fields, "documents", scope);
                if let Some(m) = &n.kind.embeddings {
                    self.model_ref(&push_pointer(pointer, "embeddings"), m, false);
                }
                if let Some(crate::spec::Rerank::Llm { llm }) = &n.kind.rerank {
                    self.model_ref(&push_pointer(&push_pointer(pointer, "rerank"), "llm"), llm, false);
                }
                fixed(&["chunks", "best_score", "best_distance"])
            }
            NodeSpec::Store(n) => {
                for (i, part) in n.kind.namespace.iter().enumerate() {
                    let at = push_pointer(&push_pointer(pointer, "namespace"), &i.to_string());
                    template_field(self, &mut fields, &format!("/namespace/{i}"), &at, part, scope);
                }
                for (field, text) in [("key", &n.kind.key), ("query", &n.kind.query)] {
                    if let Some(text) = text {
                        template_field(
                            self,
                            &mut fields,
                            &format!("/{field}"),
                            &push_pointer(pointer, field),
                            text,
                            scope,
                        );
                    }
                }
                if let Some(value) = &n.kind.value {
                    self.data(
                        &mut fields,
                        &push_pointer(pointer, "value"),
                        "/value",
                        value,
                        scope,
                        true,
                    );
                }
                Shape::Any
            }
            NodeSpec::Load(n) => {
                template_field(
                    self,
                    &mut fields,
                    "/source",
                    &push_pointer(pointer, "source"),
                    &n.kind.source,
                    scope,
                );
                fixed(&["content", "title", "source", "bytes", "format"])
            }
            NodeSpec::Save(n) => {
                template_field(
                    self,
                    &mut fields,
                    "/path",
                    &push_pointer(pointer, "path"),
                    &n.kind.path,
                    scope,
                );
                expr_field(self, &mut fields, "content", scope);
                if let Some(dir) = &n.kind.dir {
                    template_field(self, &mut fields, "/dir", &push_pointer(pointer, "dir"), dir, scope);
                }
                fixed(&["path", "bytes"])
            }
        };
        self.drafts[&ix].fields = fields;
        shape
    }

    fn model_ref(&mut self, pointer: &str, name: &str, implicit: bool) {
        if self.wf.models.contains_key(name) {
            return;
        }
        let d = if implicit {
            self.src
                .diag(
                    Code::UnknownModel,
                    pointer,
                    "the node uses the `default` model profile, which is not declared",
                )
                .help("declare `models: {default: {provider: ..., model: ...}}` or set the node's `model`")
        } else {
            self.src
                .diag(Code::UnknownModel, pointer, format!("unknown model profile `{name}`"))
                .suggest(name, self.wf.models.keys().map(String::as_str))
                .help_or("declare it under `models:`")
        };
        self.diags.push(d);
    }

    /// Reads a prompt file under the prompts directory; returns its template name and text.
    fn prompt_file(&mut self, pointer: &str, rel: &str) -> Option<(String, String)> {
        let Some(dir) = self.prompts_dir.clone() else {
            self.diags.push(
                self.src
                    .diag(
                        Code::MissingPrompt,
                        pointer,
                        format!("prompt `{rel}`: no prompts directory was found"),
                    )
                    .help("create prompts/ beside or above the workflow, or set `prompts:`"),
            );
            return None;
        };
        if rel.split('/').any(|p| p == "..") || rel.starts_with('/') {
            self.diags.push(self.src.diag(
                Code::MissingPrompt,
                pointer,
                format!("prompt `{rel}` is outside the prompts directory"),
            ));
            return None;
        }
        let path = dir.join(rel);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                self.hashed_files.push((format!("prompt:{rel}"), text.clone()));
                Some((rel.to_string(), text))
            }
            Err(_) => {
                let known = list_files(&dir);
                self.diags.push(
                    self.src
                        .diag(
                            Code::MissingPrompt,
                            pointer,
                            format!("prompt file `{}` does not exist", path.display()),
                        )
                        .suggest(rel, known.iter().map(String::as_str)),
                );
                None
            }
        }
    }

    fn outputs(&mut self) {
        let Some(keys) = &self.wf.output else { return };
        for (i, key) in keys.iter().enumerate() {
            if !self.wf.state.contains_key(key) {
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
        let mut nodes = IndexMap::new();
        let mut subgraphs = IndexMap::new();
        for (ix, d) in std::mem::take(&mut self.drafts) {
            let spec = d.spec?;
            if let Some(child) = d.subgraph {
                subgraphs.insert(ix, child);
            }
            nodes.insert(
                ix,
                PlanNode {
                    name: d.name,
                    user_kind: d.user_kind,
                    spec,
                    update: d.update,
                    fields: d.fields,
                    branches: d.branches,
                    goto: d.goto,
                    on_error: d.on_error,
                    item: d.item,
                },
            );
        }
        Some(Plan {
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
            input_schema: self.wf.input.as_ref().map(|s| s.0.clone()),
            context_schema: self.wf.context.as_ref().map(|s| s.0.clone()),
            config: self.sym.config.clone(),
            output: self.wf.output.clone(),
            recursion_limit: self.wf.limits.as_ref().and_then(|l| l.recursion_limit).unwrap_or(25),
            predicates: std::mem::take(&mut self.predicates),
            models: self.wf.models.clone(),
            subgraphs,
            exprs,
        })
    }

    /// SHA-256 over the workflow's data (not its formatting), its definitions from imports,
    /// the prompts and schema files it uses, and its subgraphs' hashes.
    fn hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"runner-plan-v1\0");
        h.update(self.src.doc.value.to_string().as_bytes());
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
        for (name, text) in &self.hashed_files {
            h.update(format!("\0{name}\0{text}").as_bytes());
        }
        for schema in self.state_schemas.values() {
            h.update(schema.to_string().as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The chain of user kinds from `name` down to its built-in kind (most derived first).
pub(super) fn kind_chain<'d>(
    defs: &'d Defs,
    name: &str,
    src: &Source,
    pointer: &str,
) -> Result<(String, Vec<&'d Def<crate::spec::KindDef>>), Diagnostic> {
    let mut chain: Vec<&Def<crate::spec::KindDef>> = Vec::new();
    let mut cur = name.to_string();
    loop {
        if BUILTIN_KINDS.contains(&cur.as_str()) {
            return Ok((cur, chain));
        }
        let Some(def) = defs.kinds.get(&cur) else {
            let (at_src, at) = match chain.last() {
                Some(d) => (&*d.src, push_pointer(&d.pointer, "extends")),
                None => (src, pointer.to_string()),
            };
            let all: Vec<&str> = BUILTIN_KINDS
                .iter()
                .copied()
                .chain(defs.kinds.keys().map(String::as_str))
                .collect();
            return Err(at_src
                .diag(Code::UnknownKind, &at, format!("unknown kind `{cur}`"))
                .suggest(&cur, all.iter().copied())
                .help_or(format!("kinds: {}", all.join(", "))));
        };
        if chain.iter().any(|d| std::ptr::eq(*d, def)) {
            let names: Vec<String> = chain
                .iter()
                .map(|d| d.pointer.rsplit('/').next().unwrap_or("").to_string())
                .collect();
            return Err(def.src.diag(
                Code::KindCycle,
                &push_pointer(&def.pointer, "extends"),
                format!("kinds extend each other in a cycle: {} -> {cur}", names.join(" -> ")),
            ));
        }
        chain.push(def);
        cur = def.value.extends.clone();
    }
}

/// Merges a kind chain's `with` defaults and the node's own fields; maps merge one level.
fn merge_kind(
    chain: &(String, Vec<&Def<crate::spec::KindDef>>),
    own: &Map<String, Value>,
) -> (String, Map<String, Value>, IndexMap<String, Def<Value>>) {
    let (builtin, defs) = chain;
    let mut merged = Map::new();
    let mut params = IndexMap::new();
    let layer = |merged: &mut Map<String, Value>, fields: &Map<String, Value>| {
        for (k, v) in fields {
            match (merged.get_mut(k), v) {
                (Some(Value::Object(base)), Value::Object(over))
                    if k == "params" || k == "update" || k == "options" =>
                {
                    for (kk, vv) in over {
                        base.insert(kk.clone(), vv.clone());
                    }
                }
                _ => {
                    merged.insert(k.clone(), v.clone());
                }
            }
        }
    };
    for def in defs.iter().rev() {
        let with: Map<String, Value> = def.value.with.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        layer(&mut merged, &with);
        for (name, schema) in &def.value.params {
            params.insert(
                name.clone(),
                Def {
                    value: schema.0.clone(),
                    src: def.src.clone(),
                    pointer: push_pointer(&push_pointer(&def.pointer, "params"), name),
                },
            );
        }
    }
    layer(&mut merged, own);
    (builtin.clone(), merged, params)
}

fn accepts_anything(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => *b,
        Value::Object(m) => ![
            "type",
            "properties",
            "required",
            "enum",
            "const",
            "anyOf",
            "oneOf",
            "allOf",
            "$ref",
            "items",
        ]
        .iter()
        .any(|k| m.contains_key(*k)),
        _ => true,
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

/// Checks `${env:NAME}` / `${env:NAME:-default}` interpolations in `text`.
pub(super) fn check_interpolation(src: &Source, pointer: &str, text: &str, diags: &mut Vec<Diagnostic>) {
    let mut rest = text;
    while let Some(i) = rest.find("${") {
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
    let abs = std::fs::canonicalize(src.path()).ok()?;
    let mut dir = abs.parent();
    while let Some(d) = dir {
        let candidate = d.join("prompts");
        if candidate.is_dir() {
            return Some(candidate);
        }
        dir = d.parent();
    }
    None
}

fn list_files(dir: &std::path::Path) -> Vec<String> {
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
