//! A node's own fields: its kind resolved (user kinds merged with their defaults and
//! parameters checked), its expressions and templates compiled in the right scope, its state
//! writes, `goto` and `on_error`, and the shape of its `output`.

use indexmap::IndexMap;
use serde_json::{Map, Value};

use super::defs::{Def, missing_file};
use super::exprs::{Scope, Shape, declared_props};
use super::kinds::{kind_chain, merge_kind};
use super::nodes::{Build, check_env_name, check_interpolation, list_files};
use super::plan::*;
use super::schemas::{check, first_violation, validator};
use super::source::{kind_validator, schema_errors};
use super::{graph, relative_to};
use crate::diag::Code;
use crate::spec::load::push_pointer;
use crate::spec::{BUILTIN_KINDS, LlmOutput, NodeCommon, NodeSpec, OnError, OutputFormat, TextSource};

impl Build<'_, '_> {
    pub(super) fn node(&mut self, ix: NodeIx, name: &str) {
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
        // A node whose kind-specific fields do not fit was reported by the schema check. Its
        // common fields (`update`, `goto`, `on_error`) are still compiled, so its edges exist
        // and the one defect does not surface again as unreachable nodes and dead ends.
        let spec = serde_json::from_value::<NodeSpec>(Value::Object(merged.clone())).ok();
        let sym = self.sym.clone();
        let item = self.drafts[&ix].item.clone();
        let params = self.drafts[&ix].params.clone();
        let scope = Scope {
            params: Some(&params),
            item: item.as_deref(),
            ..Scope::base(&sym)
        };
        let (shape, common) = match &spec {
            Some(spec) => (
                self.kind_fields(ix, &pointer, spec, &merged, scope),
                spec.common().clone(),
            ),
            None => (
                Shape::Any,
                serde_json::from_value::<NodeCommon>(Value::Object(merged.clone())).unwrap_or_default(),
            ),
        };
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
        self.drafts[&ix].spec = spec;
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
            if !self.wf.state.contains_key(key) && !self.src.declares("state", key) {
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
                // A node offered tools may answer with calls: `{content, tool_calls}`.
                let model = n.kind.model.as_deref().unwrap_or("default");
                let tools = n.kind.options.contains_key("tools")
                    || self
                        .wf
                        .models
                        .get(model)
                        .is_some_and(|m| m.options.contains_key("tools"));
                match &n.kind.output {
                    _ if tools => Shape::Any,
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
                        check(self.src, &at, &root, self.diags);
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
                check(self.src, &at, &root, self.diags);
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
                            let mut misspelt = Vec::new();
                            if let Some(Some(props)) = child.input_schema.as_ref().map(declared_props) {
                                for key in n.kind.input.keys() {
                                    if !props.contains(key) {
                                        misspelt.extend(
                                            crate::diag::did_you_mean(key, props.iter().map(String::as_str))
                                                .map(str::to_string),
                                        );
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
                            // A required field given under a misspelt name was reported as such.
                            let required = child
                                .input_schema
                                .as_ref()
                                .and_then(|s| s.get("required"))
                                .and_then(Value::as_array);
                            let missing: Vec<&str> = required
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_str)
                                .filter(|r| !n.kind.input.contains_key(*r) && !misspelt.iter().any(|m| m == r))
                                .collect();
                            if !missing.is_empty() {
                                let list = missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ");
                                let at = if v.contains_key("input") {
                                    push_pointer(pointer, "input")
                                } else {
                                    pointer.to_string()
                                };
                                self.diags.push(
                                    self.src
                                        .diag_key(
                                            Code::MissingField,
                                            &at,
                                            format!(
                                                "the subgraph's input requires {list}, which this node does not give"
                                            ),
                                        )
                                        .help(format!("add `input: {{{}: <expression>}}`", missing.join(": ..., "))),
                                );
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
                check_interpolation(self.src, &push_pointer(pointer, "url"), &n.kind.url, self.diags);
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
                        check_interpolation(self.src, &at, text, self.diags);
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
                if let Some(var) = &n.kind.api_key_env {
                    check_env_name(self.src, &push_pointer(pointer, "api_key_env"), var, self.diags);
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
        if self.wf.models.contains_key(name) || self.src.declares("models", name) {
            return;
        }
        let d = if implicit {
            // The node names no model: point at the node.
            let node = pointer.strip_suffix("/model").unwrap_or(pointer);
            self.src
                .diag_key(
                    Code::UnknownModel,
                    node,
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
