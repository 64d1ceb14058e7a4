//! W223: a node's `output: {schema}` whose largest reply cannot fit its `max_tokens`. A model
//! that fills the schema's bounds is cut at the cap in the middle of its JSON, which then fails
//! to parse, is sent back for repair and is cut again: minutes spent on a reply that can never
//! arrive. Part of the compile stage; reads a node's merged fields and its resolved schema.

use serde_json::{Map, Value};

use super::nodes::Build;
use crate::diag::Code;
use crate::spec::load::push_pointer;

/// Bytes taken to be one token: the one estimate of a text's size in tokens, used here and by
/// the context fitting at run time (`nodes/llm/fit.rs`).
pub(crate) const BYTES_PER_TOKEN: u64 = 4;

/// The most bytes a number is taken to print in, when its bounds do not say.
const NUMBER_BYTES: u64 = 20;

/// How deep references are followed before a schema is taken as unbounded (a recursive type).
const MAX_DEPTH: usize = 32;

impl Build<'_, '_> {
    /// W223 for a node (its fields merged over its kind's defaults, at `pointer`) whose
    /// `output: {schema}` allows a reply that its completion cap (its `max_tokens`, else its
    /// model profile's) would cut.
    pub(super) fn check_reply(&mut self, pointer: &str, fields: &Map<String, Value>) {
        if self.src.generated {
            return;
        }
        let Some(schema) = fields.get("output").and_then(|o| o.get("schema")) else {
            return;
        };
        let model = fields.get("model").and_then(Value::as_str).unwrap_or("default");
        let (cap, cap_at) = match fields.get("max_tokens").and_then(Value::as_u64) {
            Some(cap) => (cap, None),
            None => match self.wf.models.get(model).and_then(|p| p.max_tokens) {
                Some(cap) => (u64::from(cap), Some(model)),
                None => return,
            },
        };
        let at = push_pointer(&push_pointer(pointer, "output"), "schema");
        // Problems in the schema were reported when the node's kind resolved it.
        let root = self.resolver.resolve(self.src, &at, schema, &mut Vec::new());
        let Some(bytes) = max_bytes(&root, &root) else {
            return;
        };
        let estimate = tokens(bytes);
        if estimate <= cap {
            return;
        }
        let whose = match cap_at {
            None => "its `max_tokens`".to_string(),
            Some(profile) => format!("model profile `{profile}`'s `max_tokens`"),
        };
        let parts: Vec<String> = largest_parts(&root, &root)
            .into_iter()
            .take(3)
            .map(|(name, b)| format!("`{name}` ~{}", tokens(b)))
            .collect();
        // At the `schema` key (its value may be a whole block), or the node when its kind's
        // defaults give it.
        let mut d = self.src.diag_key(
            Code::ReplyOverMaxTokens,
            if self.src.doc.value.pointer(&at).is_some() {
                &at
            } else {
                pointer
            },
            format!(
                "the output schema allows a reply of about {estimate} tokens, more than {whose} of {cap}: \
                 a reply that uses its bounds is cut at {cap} tokens, in the middle of its JSON"
            ),
        );
        if cap_at.is_none() {
            let cap_pointer = push_pointer(pointer, "max_tokens");
            if self.src.doc.value.pointer(&cap_pointer).is_some() {
                d = d.label(self.src.path(), self.src.doc.spans.value(&cap_pointer), "the cap");
            }
        }
        let largest = if parts.is_empty() {
            String::new()
        } else {
            format!(" (the largest parts: {})", parts.join(", "))
        };
        self.diags.push(d.help(format!(
            "lower the schema's `maxLength` and `maxItems` bounds until its largest reply fits{largest}, or raise \
             `max_tokens` (the estimate counts every string at its `maxLength` and every array at its `maxItems`, \
             at 4 bytes a token)"
        )));
    }
}

/// Tokens `bytes` are estimated to take: over [`BYTES_PER_TOKEN`], rounded up.
pub(crate) fn tokens(bytes: u64) -> u64 {
    bytes.div_ceil(BYTES_PER_TOKEN)
}

/// The most bytes of compact JSON a value of `schema` can take: each string at its
/// `maxLength` (its characters counted as bytes), each array at its `maxItems`, every declared
/// property present, plus quotes, brackets, colons and commas. `None` when a string or an
/// array is unbounded, or an object may have properties it does not declare: the reply can be
/// any length, so there is nothing to compare. `root` is the resolved document `#/...`
/// references point into.
pub(super) fn max_bytes(schema: &Value, root: &Value) -> Option<u64> {
    bound(schema, root, 0)
}

/// The properties of an object schema (its references followed) with each one's bound,
/// largest first: what a message names as the reply's largest parts.
pub(super) fn largest_parts(schema: &Value, root: &Value) -> Vec<(String, u64)> {
    let mut cur = schema;
    for _ in 0..MAX_DEPTH {
        match cur.get("$ref").and_then(Value::as_str).and_then(|r| target(r, root)) {
            Some(next) => cur = next,
            None => break,
        }
    }
    let mut parts: Vec<(String, u64)> = cur
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), max_bytes(v, root)?)))
        .collect();
    parts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    parts
}

fn target<'r>(reference: &str, root: &'r Value) -> Option<&'r Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        Some(root)
    } else {
        root.pointer(pointer)
    }
}

fn bound(schema: &Value, root: &Value, depth: usize) -> Option<u64> {
    if depth > MAX_DEPTH {
        return None;
    }
    let obj = match schema {
        Value::Bool(false) => return Some(0),
        Value::Object(o) => o,
        _ => return None,
    };
    // A value must fit every `allOf` branch and the schema's own keywords: the tightest
    // bound any of them sets holds.
    let mut bounds: Vec<u64> = Vec::new();
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        bounds.extend(target(r, root).and_then(|t| bound(t, root, depth + 1)));
    }
    for branch in obj.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        bounds.extend(bound(branch, root, depth + 1));
    }
    bounds.extend(own(obj, root, depth));
    bounds.into_iter().min()
}

/// The bound the schema's own keywords (not `$ref`, not `allOf`) set.
fn own(obj: &serde_json::Map<String, Value>, root: &Value, depth: usize) -> Option<u64> {
    if let Some(c) = obj.get("const") {
        return Some(c.to_string().len() as u64);
    }
    if let Some(values) = obj.get("enum").and_then(Value::as_array) {
        return values.iter().map(|v| v.to_string().len() as u64).max();
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = obj.get(key).and_then(Value::as_array) {
            let mut most = 0;
            for b in branches {
                most = most.max(bound(b, root, depth + 1)?);
            }
            return Some(most);
        }
    }
    let types: Vec<&str> = match obj.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if obj.contains_key("properties") => vec!["object"],
        _ if obj.contains_key("items") || obj.contains_key("prefixItems") || obj.contains_key("maxItems") => {
            vec!["array"]
        }
        _ if obj.contains_key("maxLength") => vec!["string"],
        _ => return None,
    };
    let mut most = 0;
    for t in types {
        let b = match t {
            "null" => 4,
            "boolean" => 5,
            "integer" | "number" => number(obj, t),
            "string" => string(obj)?,
            "array" => array(obj, root, depth)?,
            "object" => object(obj, root, depth)?,
            _ => return None,
        };
        most = most.max(b);
    }
    Some(most)
}

fn number(obj: &serde_json::Map<String, Value>, t: &str) -> u64 {
    let lo = obj.get("minimum").or_else(|| obj.get("exclusiveMinimum"));
    let hi = obj.get("maximum").or_else(|| obj.get("exclusiveMaximum"));
    match (lo, hi) {
        (Some(lo), Some(hi)) if t == "integer" => lo.to_string().len().max(hi.to_string().len()) as u64,
        _ => NUMBER_BYTES,
    }
}

fn string(obj: &serde_json::Map<String, Value>) -> Option<u64> {
    let chars = match obj.get("maxLength").and_then(Value::as_u64) {
        Some(n) => n,
        None => match obj.get("format").and_then(Value::as_str)? {
            "date" => 10,
            "time" => 21,
            "date-time" => 35,
            "uuid" => 36,
            "ipv4" => 15,
            "ipv6" => 45,
            _ => return None,
        },
    };
    Some(chars + 2)
}

fn array(obj: &serde_json::Map<String, Value>, root: &Value, depth: usize) -> Option<u64> {
    let prefix: Vec<&Value> = obj
        .get("prefixItems")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let max_items = obj.get("maxItems").and_then(Value::as_u64);
    let listed = max_items.map_or(prefix.len(), |m| {
        prefix.len().min(usize::try_from(m).unwrap_or(usize::MAX))
    });
    let mut total: u64 = 2;
    for p in &prefix[..listed] {
        total = total.saturating_add(bound(p, root, depth + 1)? + 1);
    }
    match obj.get("items") {
        Some(Value::Bool(false)) => {}
        items => {
            let extra = max_items?.saturating_sub(listed as u64);
            if extra > 0 {
                let each = bound(items?, root, depth + 1)?;
                total = total.saturating_add(extra.saturating_mul(each + 1));
            }
        }
    }
    Some(total)
}

fn object(obj: &serde_json::Map<String, Value>, root: &Value, depth: usize) -> Option<u64> {
    // Properties the schema does not declare could be anything.
    if obj.contains_key("patternProperties")
        || matches!(obj.get("additionalProperties"), Some(v) if v != &Value::Bool(false))
    {
        return None;
    }
    let props = obj.get("properties").and_then(Value::as_object)?;
    let mut total: u64 = 2;
    for (name, schema) in props {
        // `"name":value,`
        total = total.saturating_add(name.len() as u64 + 4 + bound(schema, root, depth + 1)?);
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strings_and_arrays_count_at_their_bounds() {
        let s = json!({"type": "object", "properties": {
            "summary": {"type": "string", "maxLength": 100},
            "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 10}},
            "level": {"enum": ["high", "low"]},
            "n": {"type": ["integer", "null"], "minimum": 0, "maximum": 100},
        }});
        // {} + "summary":(102), + "tags":[3 × (12 + 1)] + "level":"high" + "n":100
        let expected = 2 + (7 + 4 + 102) + (4 + 4 + 2 + 3 * 13) + (5 + 4 + 6) + (1 + 4 + 4);
        assert_eq!(max_bytes(&s, &s), Some(expected));
        assert_eq!(tokens(expected), expected.div_ceil(4));
    }

    #[test]
    fn unbounded_strings_arrays_and_open_objects_cannot_be_told() {
        for s in [
            json!({"type": "string"}),
            json!({"type": "array", "items": {"type": "string", "maxLength": 3}}),
            json!({"type": "array", "maxItems": 3, "items": {"type": "string"}}),
            json!({"type": "object"}),
            json!({"type": "object", "properties": {"a": {"type": "boolean"}}, "additionalProperties": true}),
            json!({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "string"}]}),
            json!(true),
        ] {
            assert_eq!(max_bytes(&s, &s), None, "{s}");
        }
    }

    #[test]
    fn references_are_followed_and_recursion_is_unbounded() {
        let root = json!({
            "$defs": {
                "word": {"type": "string", "maxLength": 8},
                "tree": {"type": "object", "properties": {"kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/tree"}}}},
            },
            "type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/word"},
        });
        assert_eq!(max_bytes(&root, &root), Some(2 + 2 * 11));
        assert_eq!(max_bytes(&json!({"$ref": "#/$defs/tree"}), &root), None);
        // The tightest of `allOf` and the schema's own bounds.
        let both = json!({"allOf": [{"type": "string", "maxLength": 50}], "maxLength": 5, "type": "string"});
        assert_eq!(max_bytes(&both, &both), Some(7));
    }
}
