//! A node's fields: its kind resolved (user kinds merged with their defaults and parameters
//! checked), its own fields compiled by its kind (see [`super::kind`]), its state writes,
//! `goto` and `on_error` in the scope of the shape of its `output`.

use indexmap::IndexMap;
use serde_json::{Map, Value};

use super::defs::Def;
use super::exprs::{Scope, Shape};
use super::graph;
use super::kind::KindCx;
use super::kinds::{Merged, kind_chain, merge_kind};
use super::nodes::{Build, list_files};
use super::plan::*;
use super::schemas::{first_violation, validator};
use super::source::{kind_validator, schema_error, schema_errors, schema_lists_kind};
use crate::diag::Code;
use crate::spec::load::push_pointer;
use crate::spec::{NodeCommon, NodeSpec, OnError};

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
        let errors_before = self.diags.iter().filter(|d| d.is_error()).count();
        let (builtin, merged, declared_params) = if self.c.kinds.contains(&kind) {
            (kind.clone(), own.clone(), IndexMap::new())
        } else {
            let chain = match kind_chain(&self.c.kinds, self.defs, &kind, self.src, &kind_pointer) {
                Ok(c) => c,
                Err(d) => {
                    self.diags.push(d);
                    return;
                }
            };
            let mut m = merge_kind(&chain, &own);
            m.fields.insert("kind".into(), Value::String(m.builtin.clone()));
            if let Some((v, schema)) = kind_validator(&m.builtin) {
                let value = Value::Object(m.fields.clone());
                for error in v.iter_errors(&value) {
                    self.diags.push(self.merged_error(&error, &pointer, &m, schema));
                }
            }
            self.drafts[&ix].user_kind = Some(kind.clone());
            (m.builtin, m.fields, m.params)
        };
        let mut merged = merged;
        merged.insert("kind".into(), Value::String(builtin.clone()));
        // A kind the embedded workflow schema does not list has its fields checked against
        // its own schema here (a user kind's were checked above, after merging).
        if !schema_lists_kind(&builtin)
            && self.drafts[&ix].user_kind.is_none()
            && let Some(v) = self.c.kind_schema_validator(&builtin)
        {
            schema_errors(
                &v.0,
                &v.1,
                &Value::Object(merged.clone()),
                &self.src.doc,
                &pointer,
                self.diags,
            );
        }
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
        let decl = self.c.kinds.get(&builtin).cloned();
        self.drafts[&ix].gate = decl.as_ref().is_some_and(|d| d.is_gate());
        self.drafts[&ix].retries = decl.as_ref().is_some_and(|d| d.retries_by_default());
        // Fields the workflow schema checked when the file was loaded were reported then.
        let checked_here = self.drafts[&ix].user_kind.is_some() || !schema_lists_kind(&builtin);
        let compiled = match (&spec, decl) {
            (Some(_), Some(decl)) => {
                let mut cx = KindCx {
                    b: self,
                    ix,
                    pointer: pointer.clone(),
                    fields: &merged,
                    scope,
                    label: None,
                };
                let compiled = decl.compile(&mut cx);
                // A kind that makes no node says why; if nothing did, say that it did not.
                if compiled.is_none()
                    && checked_here
                    && self.diags.iter().filter(|d| d.is_error()).count() == errors_before
                {
                    self.diags.push(self.src.diag_key(
                        Code::InvalidValue,
                        &pointer,
                        format!("the node's fields do not make a `{builtin}` node"),
                    ));
                }
                compiled
            }
            _ => None,
        };
        let (shape, common) = match (&spec, compiled) {
            (Some(spec), Some((config, shape))) => {
                self.drafts[&ix].config = Some(config);
                self.check_reply(&pointer, &merged);
                (shape, spec.common().clone())
            }
            _ => (
                Shape::Any,
                serde_json::from_value::<NodeCommon>(Value::Object(merged.clone())).unwrap_or_default(),
            ),
        };
        if common.defer && self.drafts[&ix].item.is_some() {
            self.diags.push(
                self.src
                    .diag(
                        Code::BadDefer,
                        &push_pointer(&pointer, "defer"),
                        "a fan-out's target runs once per item: it cannot be deferred",
                    )
                    .help("defer the node that gathers the fan-out's results instead"),
            );
        }
        self.drafts[&ix].shape = shape.clone();
        // `update` and `goto` see the output; `on_error` sees the error instead.
        let params = self.drafts[&ix].params.clone();
        // A cache key sees what the node's own fields see: the node has not run yet.
        let before = Scope {
            params: Some(&params),
            item: item.as_deref(),
            ..Scope::base(&sym)
        };
        self.cache(ix, &pointer, &common, &merged, before);
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

    /// A schema error in a node of a user kind, its fields merged over the kind's defaults:
    /// reported where the offending value is written, in the node or in the `with` of the kind
    /// that gave it (which may be in an imported file).
    fn merged_error(
        &self,
        error: &jsonschema::ValidationError,
        pointer: &str,
        merged: &Merged<'_>,
        schema: &Value,
    ) -> crate::diag::Diagnostic {
        let path = error.instance_path().as_str();
        let mut segments: Vec<&str> = path.split('/').skip(1).collect();
        // An unknown field is reported at its own key.
        if let jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } = error.kind()
            && let Some(name) = unexpected.first()
        {
            segments.push(name);
        }
        match merged.origin(&segments) {
            Some(def) => {
                let at = format!("{}{path}", push_pointer(&def.pointer, "with"));
                schema_error(error, &at, &def.src.doc, schema)
            }
            None => schema_error(error, &format!("{pointer}{path}"), &self.src.doc, schema),
        }
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
                    Some(id) => {
                        self.check_bypass(ix, &at, key, text);
                        Writer::Expr(id)
                    }
                    None => continue,
                },
                other => Writer::Literal(other.clone()),
            };
            self.drafts[&ix].writes.push((key.clone(), at));
            out.push((key.clone(), writer));
        }
        out
    }

    /// E311: a write that bypasses its key's reducer where it cannot work: every message
    /// removed from a key that does not hold messages, or an overwrite by a node that runs
    /// once per fan-out item (its copies would overwrite the key together, and only one may).
    fn check_bypass(&mut self, ix: NodeIx, at: &str, key: &str, text: &str) {
        let Some(calls) = self.exprs.names_of(text).map(|n| n.calls.clone()) else {
            return;
        };
        let calls_fn = |name: &str| calls.iter().any(|c| c == name);
        if calls_fn("remove_all_messages")
            && let Some(channel) = self.state.get(key)
            && channel.reducer != Reducer::AddMessages
        {
            self.diags.push(
                self.src
                    .diag(
                        Code::ReducerBypass,
                        at,
                        format!("`remove_all_messages()` is written to `{key}`, whose reducer is not `add_messages`"),
                    )
                    .help(format!(
                        "give `{key}` `reducer: add_messages`, or empty it with `overwrite([])`"
                    )),
            );
        }
        if calls_fn("overwrite")
            && let Some(item) = self.drafts[&ix].item.clone()
        {
            let node = self.drafts[&ix].name.clone();
            self.diags.push(
                self.src
                    .diag(
                        Code::ReducerBypass,
                        at,
                        format!("node `{node}` runs once per fan-out item (`{item}`) and overwrites `{key}`"),
                    )
                    .help(format!(
                        "only one write may overwrite `{key}` in a superstep: let the copies write through its reducer, and overwrite it in a node after them"
                    )),
            );
        }
    }

    pub(super) fn model_ref(&mut self, pointer: &str, name: &str, implicit: bool) {
        self.model_uses.push((pointer.to_string(), name.to_string()));
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
    pub(super) fn prompt_file(&mut self, pointer: &str, rel: &str) -> Option<(String, String)> {
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
                self.hash_file(format!("prompt:{rel}"), text.clone());
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
