//! The published JSON Schema of workflow files, generated from the spec types.
//!
//! `schemas/workflow.schema.json` is this generator's output, committed so editors can use it
//! (`# yaml-language-server: $schema=...`); a test fails when the file is stale. At run time
//! the committed text is embedded, so validation costs no generation.
//!
//! Nodes are composed by hand: one definition per kind (`node_llm`, ...) with the common
//! fields flattened in and unknown fields refused, selected by `if kind == ...`. That keeps
//! errors precise ("unknown field `promt`") where `oneOf` would only say "no match". The
//! kinds are not known here: each kind generates its own definition ([`kind_def`]) and the
//! caller passes them in.

use std::sync::OnceLock;

use schemars::{JsonSchema, generate::SchemaSettings};
use serde::Serialize;
use serde_json::{Value, json};

use super::{Workflow, node::NodeCommon};

/// The committed schema text, embedded at build time.
pub const WORKFLOW_SCHEMA: &str = include_str!("../../schemas/workflow.schema.json");

/// The embedded schema, parsed once.
pub fn workflow_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        // Invariant: the embedded text is this module's own output, checked by a test.
        serde_json::from_str(WORKFLOW_SCHEMA).expect("embedded workflow schema is valid JSON")
    })
}

#[derive(JsonSchema, Serialize)]
#[schemars(deny_unknown_fields)]
struct KindSchema<K: JsonSchema> {
    /// The node's kind.
    kind: String,
    #[serde(flatten)]
    common: NodeCommon,
    #[serde(flatten)]
    fields: K,
}

/// The definition of a node of kind `kind` whose own fields are `K`: `K`'s fields and the
/// common ones, nothing else.
pub fn kind_def<K: JsonSchema>(generator: &mut schemars::SchemaGenerator, kind: &str) -> Value {
    let mut def = generator.subschema_for::<KindSchema<K>>().to_value();
    // `subschema_for` registers the generic wrapper under a generated name and returns a $ref;
    // inline the definition instead so each kind owns one readable entry.
    if let Some(reference) = def.get("$ref").and_then(Value::as_str) {
        let name = reference.trim_start_matches("#/$defs/").to_string();
        if let Some(defs) = generator.definitions_mut().shift_remove(&name) {
            def = defs;
        }
    }
    if let Some(props) = def.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("kind".into(), json!({"const": kind, "description": "The node's kind."}));
    }
    def
}

/// The generator every kind definition is made in.
pub fn generator() -> schemars::SchemaGenerator {
    SchemaSettings::draft2020_12().into_generator()
}

/// Generates the workflow schema from the spec types and the kinds' definitions, which
/// `kinds` makes in the generator it is given (see [`kind_def`]), in the order to list them.
pub fn generate(kinds: impl FnOnce(&mut schemars::SchemaGenerator) -> Vec<(&'static str, Value)>) -> Value {
    let mut generator = generator();
    let mut root = generator.root_schema_for::<Workflow>().to_value();
    let kinds = kinds(&mut generator);
    let names: Vec<&str> = kinds.iter().map(|(name, _)| *name).collect();
    let mut defs = serde_json::Map::new();
    for (name, def) in generator.definitions() {
        defs.insert(name.clone(), def.clone());
    }
    let mut selectors = Vec::new();
    let listed = names.join(", ");
    for (kind, def) in kinds {
        let name = format!("node_{kind}");
        selectors.push(json!({
            "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
            "then": {"$ref": format!("#/$defs/{name}")}
        }));
        defs.insert(name, def);
    }
    defs.insert(
        "Node".into(),
        json!({
            "description": "A node. `kind` is a built-in kind or a name from `kinds`; it decides which other fields the node takes.",
            "type": "object",
            "required": ["kind"],
            "properties": {"kind": {
                "type": "string",
                "description": format!("A built-in kind ({listed}) or a name from `kinds`.")
            }},
            "allOf": selectors
        }),
    );
    if let Some(obj) = root.as_object_mut() {
        obj.insert("$defs".into(), Value::Object(sort_defs(defs)));
        obj.insert("$id".into(), json!("https://runner.dev/schemas/workflow.schema.json"));
    }
    strip_null(&mut root);
    root
}

/// Optional fields are optional by omission; an explicit YAML `null` is a mistake, so the
/// `null` alternatives schemars adds for `Option` are removed.
fn strip_null(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    map.insert("type".into(), only);
                }
            }
            if let Some(Value::Array(branches)) = map.get_mut("anyOf") {
                branches.retain(|b| b != &json!({"type": "null"}));
                if branches.len() == 1 {
                    let only = branches.remove(0);
                    map.shift_remove("anyOf");
                    if let Value::Object(inner) = only {
                        for (k, v) in inner {
                            map.entry(k).or_insert(v);
                        }
                    }
                }
            }
            map.values_mut().for_each(strip_null);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_null),
        _ => {}
    }
}

fn sort_defs(defs: serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    let mut entries: Vec<_> = defs.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().collect()
}

/// The schema as committed: pretty JSON with a trailing newline.
pub fn generate_text(kinds: impl FnOnce(&mut schemars::SchemaGenerator) -> Vec<(&'static str, Value)>) -> String {
    let mut text = serde_json::to_string_pretty(&generate(kinds)).unwrap_or_default();
    text.push('\n');
    text
}
