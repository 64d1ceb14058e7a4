//! User kinds: the chain from a user kind down to its built-in kind, and a node's fields
//! merged over the chain's defaults (`with`) with the parameters they declare.

use indexmap::IndexMap;
use serde_json::{Map, Value};

use super::defs::{Def, Defs};
use super::kind::KindSet;
use super::source::Source;
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

/// Merges a kind chain's `with` defaults and the node's own fields; maps merge one level.
pub(super) fn merge_kind(
    chain: &(String, Vec<&Def<KindDef>>),
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
