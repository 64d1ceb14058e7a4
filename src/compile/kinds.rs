//! User kinds: the chain from a user kind down to its built-in kind, and a node's fields
//! merged over the chain's defaults (`with`) with the parameters they declare.

use std::sync::Arc;

use indexmap::IndexMap;
use jsonschema::error::ValidationErrorKind;
use serde_json::{Map, Value};

use super::Compiler;
use super::defs::{Def, Defs};
use super::kind::KindSet;
use super::source::{Source, kind_validator, schema_error};
use crate::diag::{Code, Diagnostic};
use crate::spec::KindDef;
use crate::spec::load::push_pointer;

/// The chain of user kinds from `name` down to a registered kind (most derived first).
pub(super) fn kind_chain<'d>(
    kinds: &KindSet,
    defs: &'d Defs,
    name: &str,
    src: &Source,
    pointer: &str,
) -> Result<(String, Vec<&'d Def<KindDef>>), Diagnostic> {
    let mut chain: Vec<&Def<KindDef>> = Vec::new();
    let mut cur = name.to_string();
    loop {
        if kinds.contains(&cur) {
            return Ok((cur, chain));
        }
        let Some(def) = defs.kinds.get(&cur) else {
            let (at_src, at) = match chain.last() {
                Some(d) => (&*d.src, push_pointer(&d.pointer, "extends")),
                None => (src, pointer.to_string()),
            };
            let mut all: Vec<&str> = kinds.names().collect();
            all.extend(defs.kinds.keys().map(String::as_str));
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

/// Fields whose maps a node merges with its kind's, entry by entry, rather than replacing.
const MERGED_MAPS: &[&str] = &["params", "update", "options"];

/// A node's fields merged over its kind chain's defaults, with where each came from.
pub(super) struct Merged<'d> {
    pub builtin: String,
    pub fields: Map<String, Value>,
    pub params: IndexMap<String, Def<Value>>,
    /// The kind whose `with` gave each field (or, for the merged maps, each entry, keyed
    /// `field/entry`) the node does not write itself.
    from_kind: IndexMap<String, &'d Def<KindDef>>,
}

impl<'d> Merged<'d> {
    /// The kind whose defaults hold the value at `path` (the first segments of a JSON pointer
    /// into the merged fields), or `None` when the node's own fields do.
    pub(super) fn origin(&self, path: &[&str]) -> Option<&'d Def<KindDef>> {
        let field = path.first()?;
        match path.get(1) {
            Some(entry) if MERGED_MAPS.contains(field) => self.from_kind.get(&format!("{field}/{entry}")).copied(),
            _ => self.from_kind.get(*field).copied(),
        }
    }
}

/// Merges a kind chain's `with` defaults and the node's own fields; maps merge one level.
pub(super) fn merge_kind<'d>(chain: &(String, Vec<&'d Def<KindDef>>), own: &Map<String, Value>) -> Merged<'d> {
    let (builtin, defs) = chain;
    let mut merged = Map::new();
    let mut params = IndexMap::new();
    let mut from_kind = IndexMap::new();
    let mut layer = |merged: &mut Map<String, Value>, fields: &Map<String, Value>, def: Option<&'d Def<KindDef>>| {
        for (k, v) in fields {
            match (merged.get_mut(k), v) {
                (Some(Value::Object(base)), Value::Object(over)) if MERGED_MAPS.contains(&k.as_str()) => {
                    for (kk, vv) in over {
                        base.insert(kk.clone(), vv.clone());
                        set_origin(&mut from_kind, format!("{k}/{kk}"), def);
                    }
                }
                _ => {
                    merged.insert(k.clone(), v.clone());
                    set_origin(&mut from_kind, k.clone(), def);
                    if let Value::Object(entries) = v
                        && MERGED_MAPS.contains(&k.as_str())
                    {
                        for kk in entries.keys() {
                            set_origin(&mut from_kind, format!("{k}/{kk}"), def);
                        }
                    }
                }
            }
        }
    };
    for def in defs.iter().rev() {
        let with: Map<String, Value> = def.value.with.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        layer(&mut merged, &with, Some(*def));
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
    layer(&mut merged, own, None);
    Merged {
        builtin: builtin.clone(),
        fields: merged,
        params,
        from_kind,
    }
}

fn set_origin<'d>(map: &mut IndexMap<String, &'d Def<KindDef>>, key: String, def: Option<&'d Def<KindDef>>) {
    match def {
        Some(d) => {
            map.insert(key, d);
        }
        None => {
            map.shift_remove(&key);
        }
    }
}

/// Checks the `with` defaults of the kinds `src` itself defines against the fields of the
/// built-in kind each rests on, whether or not a node uses the kind: a field the kind does not
/// have, or a value that does not fit its field (a duration that does not parse), is reported
/// in the kind, where it is written. What a node must add (its required fields) is not asked
/// of the defaults.
pub(super) fn check_defaults(c: &mut Compiler, src: &Arc<Source>, defs: &Defs, diags: &mut Vec<Diagnostic>) {
    for (name, def) in &defs.kinds {
        if !Arc::ptr_eq(&def.src, src) || def.value.with.is_empty() {
            continue;
        }
        let Ok((builtin, _)) = kind_chain(&c.kinds, defs, name, src, &def.pointer) else {
            // Reported where the chain breaks.
            continue;
        };
        // A kind the embedded workflow schema lists, or one registered from outside.
        let registered;
        let validator: &(jsonschema::Validator, Value) = match kind_validator(&builtin) {
            Some(v) => v,
            None => match c.kind_schema_validator(&builtin) {
                Some(v) => {
                    registered = v;
                    &registered
                }
                None => continue,
            },
        };
        let mut with: Map<String, Value> = def.value.with.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        with.insert("kind".into(), Value::String(builtin.clone()));
        let base = push_pointer(&def.pointer, "with");
        let value = Value::Object(with);
        for error in validator.0.iter_errors(&value) {
            let inside = !error.instance_path().as_str().is_empty();
            let unknown = matches!(error.kind(), ValidationErrorKind::AdditionalProperties { .. });
            if inside || unknown {
                let pointer = format!("{base}{}", error.instance_path().as_str());
                diags.push(schema_error(&error, &pointer, &src.doc, &validator.1));
            }
        }
    }
}
