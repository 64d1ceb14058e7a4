//! Building JSON Schema validators without the 2020-12 meta-schema where it cannot find
//! anything wrong: the embedded workflow schema (checked against it by a test) and user
//! schemas made only of plain keywords whose values this module checks itself.
//!
//! `jsonschema` checks every schema it compiles against its dialect's meta-schema, and the
//! first check in a process builds the 2020-12 meta-schema's own validator: about 40% of a
//! one-round run's instructions, for a workflow whose state keys say `type: integer`.
//!
//! Part of compile/; depends on nothing else in the crate.

use serde_json::Value;

/// Where [`unchecked`] registers the schema it compiles.
const REGISTERED: &str = "urn:runner:schema";

/// A 2020-12 validator for `schema`, built without checking `schema` against the 2020-12
/// meta-schema: for schemas known to be valid ([`plainly_valid`] ones, the embedded workflow
/// schema). `schema` is registered as a 2020-12 resource and the validator is built from a
/// root that only refers to it: that root alone is checked, against the far smaller draft 4
/// meta-schema. Formats are annotations, as in 2020-12. Errors are those of
/// `jsonschema::draft202012::new(schema)`, their schema paths starting with `/$ref`.
pub(crate) fn unchecked(schema: &Value) -> Result<jsonschema::Validator, String> {
    let registry = jsonschema::Registry::new()
        .add(REGISTERED, jsonschema::Draft::Draft202012.create_resource_ref(schema))
        .and_then(jsonschema::RegistryBuilder::prepare)
        .map_err(|e| e.to_string())?;
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .should_validate_formats(false)
        .with_registry(&registry)
        .build(&serde_json::json!({ "$ref": REGISTERED }))
        .map_err(|e| e.to_string())
}

/// A validator for a user schema: [`unchecked`] when the schema is [`plainly_valid`], else
/// `jsonschema::draft202012::new`, which checks it against the meta-schema first.
pub(crate) fn validator(schema: &Value) -> Result<jsonschema::Validator, jsonschema::ValidationError<'static>> {
    if plainly_valid(schema)
        && let Ok(v) = unchecked(schema)
    {
        return Ok(v);
    }
    jsonschema::draft202012::new(schema)
}

/// Whether `schema` is valid under the 2020-12 meta-schema by its shape alone: a boolean, or an
/// object of the plain keywords below with values of the types the meta-schema requires
/// (subschemas plainly valid in turn). Anything else (`$ref`, `$id`, combinators, keywords
/// not listed) is left to the meta-schema.
pub(crate) fn plainly_valid(schema: &Value) -> bool {
    match schema {
        Value::Bool(_) => true,
        Value::Object(m) => m.iter().all(|(k, v)| plain_keyword(k, v)),
        _ => false,
    }
}

fn plain_keyword(keyword: &str, v: &Value) -> bool {
    const TYPES: &[&str] = &["array", "boolean", "integer", "null", "number", "object", "string"];
    let count = |v: &Value| v.as_u64().is_some();
    let unique = |items: &Vec<Value>| items.iter().enumerate().all(|(i, a)| !items[..i].contains(a));
    match keyword {
        "type" => match v {
            Value::String(t) => TYPES.contains(&t.as_str()),
            Value::Array(ts) => {
                !ts.is_empty() && unique(ts) && ts.iter().all(|t| t.as_str().is_some_and(|t| TYPES.contains(&t)))
            }
            _ => false,
        },
        "title" | "description" => v.is_string(),
        "default" | "const" => true,
        "examples" | "enum" => v.is_array(),
        "deprecated" | "readOnly" | "writeOnly" => v.is_boolean(),
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => v.is_number(),
        "multipleOf" => v.as_f64().is_some_and(|x| x > 0.0),
        "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" => count(v),
        "uniqueItems" => v.is_boolean(),
        "required" => v
            .as_array()
            .is_some_and(|r| unique(r) && r.iter().all(Value::is_string)),
        "items" | "additionalProperties" => plainly_valid(v),
        "properties" => v.as_object().is_some_and(|p| p.values().all(plainly_valid)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Every schema called plainly valid is valid under the meta-schema, and the ones the
    /// meta-schema refuses are never called plainly valid.
    #[test]
    fn plainly_valid_schemas_are_valid_under_the_meta_schema() {
        let plain = [
            json!(true),
            json!({}),
            json!({"type": "integer"}),
            json!({"type": ["string", "null"], "description": "d", "default": null}),
            json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number", "minimum": 0}}},
                   "required": ["a"], "additionalProperties": false}),
            json!({"enum": [1, "x"], "title": "t", "minLength": 2, "multipleOf": 0.5}),
        ];
        for s in &plain {
            assert!(plainly_valid(s), "{s}");
            assert!(jsonschema::draft202012::meta::validate(s).is_ok(), "{s}");
        }
        let not_plain = [
            // Invalid under the meta-schema.
            json!({"type": "int"}),
            json!({"type": []}),
            json!({"type": ["string", "string"]}),
            json!({"required": ["a", "a"]}),
            json!({"minLength": -1}),
            json!({"minLength": 1.5}),
            json!({"multipleOf": 0}),
            json!({"enum": 3}),
            json!({"properties": {"a": {"type": "int"}}}),
            json!({"items": 5}),
            json!(3),
            // Valid, but left to the meta-schema.
            json!({"$ref": "#/$defs/a", "$defs": {"a": true}}),
            json!({"anyOf": [{"type": "string"}]}),
            json!({"format": "date"}),
        ];
        for s in &not_plain {
            assert!(!plainly_valid(s), "{s}");
        }
        for s in &not_plain[..11] {
            assert!(jsonschema::draft202012::meta::validate(s).is_err(), "{s}");
        }
    }

    /// A validator built without the meta-schema check reports what a checked one does.
    #[test]
    fn unchecked_validators_report_what_checked_ones_do() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1},
            "s": {"type": ["string", "null"], "maxLength": 2}, "when": {"type": "string"}},
            "required": ["n"], "additionalProperties": false});
        let fast = validator(&schema).unwrap();
        let checked = jsonschema::draft202012::new(&schema).unwrap();
        let values = [
            json!({"n": 1}),
            json!({"n": 0, "s": "abc", "x": 1}),
            json!({"s": 3}),
            // Formats are annotations in 2020-12, whichever way the validator was built.
            json!({"n": 2, "when": "not a date"}),
            json!([]),
        ];
        for v in &values {
            let errors = |val: &jsonschema::Validator| {
                val.iter_errors(v)
                    .map(|e| (e.instance_path().as_str().to_string(), e.to_string()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(errors(&fast), errors(&checked), "{v}");
        }
        // An invalid schema is still refused, by the meta-schema.
        assert!(validator(&json!({"type": "int"})).is_err());
    }
}
