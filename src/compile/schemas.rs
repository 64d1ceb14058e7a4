//! User JSON Schemas (state keys, input, context, types, llm output, interrupt responses):
//! `$ref`s resolved, validators compiled, defaults checked.
//!
//! `#/types/Name` is resolved by attaching the workflow's types to the schema's root under
//! `types`, so the reference is an ordinary JSON pointer. A `$ref` to a file is inlined under
//! `files` with the file's own `#...` references rewritten to point into it, so validation
//! needs no retriever and never touches the network.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use indexmap::IndexMap;
use serde_json::{Map, Value};

use super::defs::Def;
use super::source::Source;
use crate::diag::{Code, Diagnostic};
use crate::spec::load::push_pointer;

/// Resolves schemas against a workflow's types.
pub(crate) struct Resolver<'a> {
    types: &'a IndexMap<String, Def<Value>>,
    /// Inlined files, by path, with their slot under `files`.
    files: IndexMap<PathBuf, Value>,
    resolved_types: Option<Map<String, Value>>,
}

impl<'a> Resolver<'a> {
    pub(crate) fn new(types: &'a IndexMap<String, Def<Value>>) -> Resolver<'a> {
        Resolver {
            types,
            files: IndexMap::new(),
            resolved_types: None,
        }
    }

    /// Resolves `schema` (found at `pointer` in `src`) into a self-contained root document.
    pub(crate) fn resolve(
        &mut self,
        src: &Source,
        pointer: &str,
        schema: &Value,
        diags: &mut Vec<Diagnostic>,
    ) -> Value {
        self.ensure_types(diags);
        let mut out = schema.clone();
        self.walk(src.path(), Some(src), pointer, &mut out, None, diags);
        self.attach(out)
    }

    /// The resolved form of a types-only root, for following `#/types/X` in analysis.
    fn ensure_types(&mut self, diags: &mut Vec<Diagnostic>) {
        if self.resolved_types.is_some() {
            return;
        }
        self.resolved_types = Some(Map::new());
        let mut resolved = Map::new();
        for (name, def) in self.types {
            let mut v = def.value.clone();
            self.walk(def.src.path(), Some(&def.src), &def.pointer, &mut v, None, diags);
            resolved.insert(name.clone(), v);
        }
        self.resolved_types = Some(resolved);
    }

    fn attach(&self, schema: Value) -> Value {
        let mut root = match schema {
            Value::Object(m) => m,
            Value::Bool(b) => {
                let mut m = Map::new();
                if !b {
                    m.insert("not".into(), Value::Object(Map::new()));
                }
                m
            }
            _ => Map::new(),
        };
        if let Some(t) = &self.resolved_types
            && !t.is_empty()
        {
            root.entry("types").or_insert_with(|| Value::Object(t.clone()));
        }
        if !self.files.is_empty() {
            let files: Map<String, Value> = self
                .files
                .values()
                .enumerate()
                .map(|(i, v)| (i.to_string(), v.clone()))
                .collect();
            root.insert("files".into(), Value::Object(files));
        }
        Value::Object(root)
    }

    /// Rewrites the `$ref`s under `value`. `file_slot` is set while walking an inlined file,
    /// whose local references must be redirected into its slot.
    fn walk(
        &mut self,
        base: &Path,
        src: Option<&Source>,
        pointer: &str,
        value: &mut Value,
        file_slot: Option<usize>,
        diags: &mut Vec<Diagnostic>,
    ) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref").cloned() {
                    let at = push_pointer(pointer, "$ref");
                    match self.reference(base, src, &at, &r, file_slot, diags) {
                        Ok(Some(new)) => {
                            map.insert("$ref".into(), Value::String(new));
                        }
                        Ok(None) => {}
                        // Already reported; dropping the reference keeps the rest of the schema
                        // usable instead of failing it a second time as unresolvable.
                        Err(()) => {
                            map.shift_remove("$ref");
                        }
                    }
                }
                for (k, v) in map.iter_mut() {
                    if k == "$ref" || k == "const" || k == "enum" || k == "default" || k == "examples" {
                        continue;
                    }
                    self.walk(base, src, &push_pointer(pointer, k), v, file_slot, diags);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter_mut().enumerate() {
                    self.walk(base, src, &push_pointer(pointer, &i.to_string()), v, file_slot, diags);
                }
            }
            _ => {}
        }
    }

    fn reference(
        &mut self,
        base: &Path,
        src: Option<&Source>,
        at: &str,
        r: &str,
        file_slot: Option<usize>,
        diags: &mut Vec<Diagnostic>,
    ) -> Result<Option<String>, ()> {
        if let Some(local) = r.strip_prefix('#') {
            if let Some(slot) = file_slot {
                return Ok(Some(format!("#/files/{slot}{local}")));
            }
            if let Some(name) = local.strip_prefix("/types/") {
                let name = name.split('/').next().unwrap_or_default();
                if !self.types.contains_key(name) {
                    let Some(src) = src else { return Err(()) };
                    diags.push(
                        src.diag(Code::UnknownType, at, format!("unknown type `{name}`"))
                            .suggest(name, self.types.keys().map(String::as_str))
                            .help_or("declare it under `types:`"),
                    );
                    return Err(());
                }
            }
            return Ok(None);
        }
        if r.contains("://") {
            if let Some(src) = src {
                diags.push(
                    src.diag(
                        Code::BadSchema,
                        at,
                        format!("`$ref` to `{r}`: schemas are never fetched over the network"),
                    )
                    .help("save the schema under schemas/ and refer to it by relative path"),
                );
            }
            return Err(());
        }
        let (file, fragment) = r.split_once('#').unwrap_or((r, ""));
        let path = super::relative_to(base, file);
        let slot = match self.files.get_index_of(&path) {
            Some(slot) => slot,
            None => {
                let loaded = match load_schema_file(&path) {
                    Ok(v) => v,
                    Err(msg) => {
                        if let Some(src) = src {
                            diags.push(if path.exists() {
                                src.diag(Code::BadSchema, at, msg)
                            } else {
                                super::defs::missing_file(src, at, &path, "schema file")
                            });
                        }
                        return Err(());
                    }
                };
                let slot = self.files.len();
                self.files.insert(path.clone(), Value::Null);
                let mut v = loaded;
                // Problems inside a referenced file are reported at the reference.
                let mut inner = Vec::new();
                self.walk(&path, None, "", &mut v, Some(slot), &mut inner);
                self.files.insert(path, v);
                slot
            }
        };
        Ok(Some(format!("#/files/{slot}{fragment}")))
    }

    /// Follows `$ref`s to types and files to the schema they name, for static analysis.
    pub(crate) fn follow<'v>(&'v self, schema: &'v Value) -> &'v Value {
        let mut cur = schema;
        for _ in 0..16 {
            let Some(r) = cur.get("$ref").and_then(Value::as_str) else {
                break;
            };
            let next = if let Some(name) = r.strip_prefix("#/types/") {
                self.resolved_types.as_ref().and_then(|t| t.get(name))
            } else if let Some(rest) = r.strip_prefix("#/files/") {
                let (slot, frag) = rest.split_once('/').map_or((rest, ""), |(s, f)| (s, f));
                slot.parse::<usize>()
                    .ok()
                    .and_then(|i| self.files.get_index(i))
                    .and_then(|(_, v)| {
                        if frag.is_empty() {
                            Some(v)
                        } else {
                            v.pointer(&format!("/{frag}"))
                        }
                    })
            } else {
                None
            };
            match next {
                Some(n) => cur = n,
                None => break,
            }
        }
        cur
    }

    /// The JSON types a schema declares (following references), if it says.
    pub(crate) fn types_of(&self, schema: &Value) -> Option<Vec<String>> {
        match self.follow(schema).get("type")? {
            Value::String(t) => Some(vec![t.clone()]),
            Value::Array(ts) => Some(ts.iter().filter_map(|t| t.as_str().map(str::to_string)).collect()),
            _ => None,
        }
    }
}

fn load_schema_file(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("schema file `{}` does not exist", path.display()),
        _ => format!("cannot read schema file `{}`: {e}", path.display()),
    })?;
    let is_yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
    if is_yaml {
        let file = crate::spec::load::SourceFile {
            path: path.into(),
            text: text.into(),
        };
        crate::spec::load::parse(file).map(|d| d.value).map_err(|d| {
            format!(
                "schema file `{}` does not parse: {}",
                path.display(),
                d.first().map(|d| d.message.as_str()).unwrap_or("")
            )
        })
    } else {
        serde_json::from_str(&text).map_err(|e| format!("schema file `{}` is not valid JSON: {e}", path.display()))
    }
}

/// Compiles a resolved schema, reporting an invalid one at `pointer`.
pub(crate) fn validator(
    src: &Source,
    pointer: &str,
    root: &Value,
    diags: &mut Vec<Diagnostic>,
) -> Option<jsonschema::Validator> {
    match super::meta::validator(root) {
        Ok(v) => Some(v),
        Err(e) => {
            let at = e.instance_path().as_str().to_string();
            diags.push(schema_error(src, pointer, root, &at, &e.masked().to_string()));
            None
        }
    }
}

/// An invalid-schema diagnostic for a problem at `at` inside the schema. A `type` that names
/// no JSON Schema type (`int`, `str`, `list`) gets its own message rather than the meta-schema's
/// "not valid under any of the schemas listed in the 'anyOf' keyword".
fn schema_error(src: &Source, pointer: &str, root: &Value, at: &str, why: &str) -> Diagnostic {
    const TYPES: &[&str] = &["integer", "number", "string", "boolean", "object", "array", "null"];
    let bad_type = at
        .ends_with("/type")
        .then(|| root.pointer(at))
        .flatten()
        .and_then(|t| match t {
            Value::String(t) => Some(t.as_str()),
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).find(|t| !TYPES.contains(t)),
            _ => None,
        })
        .filter(|t| !TYPES.contains(t));
    // Point at the offending value itself when the workflow holds it there.
    let exact = format!("{pointer}{at}");
    let here = if !at.is_empty() && src.doc.spans.value(&exact).is_some() {
        exact.as_str()
    } else {
        pointer
    };
    match bad_type {
        Some(t) => {
            let alias = match t {
                "int" | "long" => Some("integer"),
                "str" | "text" => Some("string"),
                "bool" => Some("boolean"),
                "float" | "double" | "decimal" => Some("number"),
                "list" | "tuple" => Some("array"),
                "dict" | "map" | "mapping" => Some("object"),
                "none" | "nil" => Some("null"),
                _ => crate::diag::did_you_mean(t, TYPES.iter().copied()),
            };
            let d = src.diag(
                Code::BadSchema,
                here,
                format!("invalid JSON Schema: `{t}` is not a JSON Schema type"),
            );
            let types = "JSON Schema types are integer, number, string, boolean, object, array and null";
            match alias {
                Some(a) => d.help(format!("write `type: {a}`; {types}")),
                None => d.help(types),
            }
        }
        None => {
            let what = if at.is_empty() {
                why.to_string()
            } else {
                format!("at `{at}`: {why}")
            };
            src.diag(Code::BadSchema, here, format!("invalid JSON Schema: {what}"))
        }
    }
}

/// Checks that a resolved schema is a valid JSON Schema, without building a validator for it
/// (schemas only checked here are compiled where they are used, at run time).
pub(crate) fn check(src: &Source, pointer: &str, root: &Value, diags: &mut Vec<Diagnostic>) {
    if super::meta::plainly_valid(root) {
        return;
    }
    if let Err(e) = jsonschema::draft202012::meta::validate(root) {
        let at = e.instance_path().as_str().to_string();
        diags.push(schema_error(src, pointer, root, &at, &e.masked().to_string()));
    }
}

/// The validators of nodes' result schemas (an `llm` node's `output.schema`), one per node,
/// each built the first time the node checks a result: a plan's runs compile only the schemas
/// they use, once for all of them.
#[derive(Default)]
pub(crate) struct NodeValidators {
    by_node: HashMap<super::NodeIx, OnceLock<Result<jsonschema::Validator, String>>>,
}

impl NodeValidators {
    /// A slot for each of `nodes`.
    pub(crate) fn new(nodes: impl IntoIterator<Item = super::NodeIx>) -> NodeValidators {
        NodeValidators {
            by_node: nodes.into_iter().map(|ix| (ix, OnceLock::new())).collect(),
        }
    }

    /// The validator of `schema`, the schema node `ix` checks its results against, built on
    /// the first call. A node not given at construction gets an error.
    pub(crate) fn get(&self, ix: super::NodeIx, schema: &Value) -> Result<&jsonschema::Validator, String> {
        let cell = self
            .by_node
            .get(&ix)
            .ok_or_else(|| "the node is not in the engine's plan".to_string())?;
        cell.get_or_init(|| super::meta::validator(schema).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| format!("the schema does not compile: {e}"))
    }
}

/// Validators of schemas a run may check values against, each built the first time it is
/// asked for: a run compiles only the schemas of the keys it writes and of the nodes it runs.
/// The schemas were checked when the workflow was compiled; one that still fails to build
/// gives no validator, as if it had none.
#[derive(Debug, Default)]
pub struct Validators<K> {
    /// Each key's schema, whether it says only a type, and its validator once built.
    slots: HashMap<K, (Value, bool, OnceLock<Option<jsonschema::Validator>>)>,
}

impl<K: Hash + Eq> Validators<K> {
    /// The schemas, by key; none is compiled yet.
    pub fn new(schemas: impl IntoIterator<Item = (K, Value)>) -> Validators<K> {
        Validators {
            slots: schemas
                .into_iter()
                .map(|(k, schema)| {
                    let type_only = type_only(&schema);
                    (k, (schema, type_only, OnceLock::new()))
                })
                .collect(),
        }
    }

    /// The validator of `key`'s schema, compiled on the first call.
    pub fn get<Q>(&self, key: &Q) -> Option<&jsonschema::Validator>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (schema, _, slot) = self.slots.get(key)?;
        slot.get_or_init(|| super::meta::validator(schema).ok()).as_ref()
    }

    /// Why `value` does not fit `key`'s schema, or `None` when it does (or `key` has no
    /// schema). A schema that says nothing but a type (`{type: integer}`, most state keys) is
    /// checked by that type first and builds no validator for a value that fits; a value that
    /// does not fit is told what the validator says.
    pub fn violation<Q>(&self, key: &Q, value: &Value) -> Option<String>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (schema, type_only, _) = self.slots.get(key)?;
        if *type_only && fits_type(schema, value) {
            return None;
        }
        self.get(key).and_then(|v| first_violation(v, value))
    }

    /// How many of the schemas have been compiled so far (by every run of the plan, for a
    /// plan's state validators).
    pub fn built(&self) -> usize {
        self.slots.values().filter(|(_, _, slot)| slot.get().is_some()).count()
    }
}

/// The first way `value` fails `validator`, as text.
/// Whether `schema` says nothing but its type: a boolean `true`, or an object of `type` (one
/// JSON Schema type or a list of them) and annotations only.
fn type_only(schema: &Value) -> bool {
    const ANNOTATIONS: &[&str] = &[
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
    ];
    let known = |t: &Value| t.as_str().is_some_and(|t| TYPES.contains(&t));
    match schema {
        Value::Bool(b) => *b,
        Value::Object(m) => m.iter().all(|(k, v)| {
            ANNOTATIONS.contains(&k.as_str())
                || (k == "type"
                    && match v {
                        Value::Array(ts) => ts.iter().all(known),
                        one => known(one),
                    })
        }),
        _ => false,
    }
}

/// JSON Schema's type names.
const TYPES: &[&str] = &["array", "boolean", "integer", "null", "number", "object", "string"];

/// Whether `value` has one of the types a type-only schema (see [`type_only`]) allows.
/// As in JSON Schema, an integer is any number without a fractional part (`1.0` too).
fn fits_type(schema: &Value, value: &Value) -> bool {
    let is = |name: &Value| match (name.as_str(), value) {
        (Some("null"), Value::Null) | (Some("boolean"), Value::Bool(_)) | (Some("string"), Value::String(_)) => true,
        (Some("array"), Value::Array(_)) | (Some("object"), Value::Object(_)) | (Some("number"), Value::Number(_)) => {
            true
        }
        (Some("integer"), Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.is_finite() && f.fract() == 0.0)
        }
        _ => false,
    };
    match schema.get("type") {
        None => true,
        Some(Value::Array(names)) => names.iter().any(is),
        Some(name) => is(name),
    }
}

pub(crate) fn first_violation(validator: &jsonschema::Validator, value: &Value) -> Option<String> {
    validator.iter_errors(value).next().map(|e| {
        let at = e.instance_path().as_str().to_string();
        if at.is_empty() {
            e.masked().to_string()
        } else {
            format!("at `{at}`: {}", e.masked())
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn validators_are_built_when_first_asked_for() {
        let v = Validators::new([
            ("n".to_string(), json!({"type": "integer"})),
            ("s".to_string(), json!({"type": "string"})),
            ("bad".to_string(), json!({"type": "int"})),
        ]);
        assert_eq!(v.built(), 0);
        let n = v.get("n").expect("a valid schema gives a validator");
        assert!(n.is_valid(&json!(3)) && !n.is_valid(&json!("3")));
        assert_eq!(v.built(), 1);
        assert!(std::ptr::eq(n, v.get("n").unwrap()), "built once");
        assert_eq!(v.built(), 1);
        assert!(v.get("bad").is_none());
        assert!(v.get("missing").is_none());
        assert_eq!(v.built(), 2);
    }

    #[test]
    fn a_type_only_schema_checks_fitting_values_without_a_validator() {
        let v = Validators::new([
            (
                "n".to_string(),
                json!({"type": "integer", "description": "a count", "default": 0}),
            ),
            ("either".to_string(), json!({"type": ["string", "null"]})),
            ("any".to_string(), json!({})),
            ("bounded".to_string(), json!({"type": "integer", "maximum": 3})),
        ]);
        for (key, value) in [
            ("n", json!(3)),
            ("n", json!(-3)),
            ("n", json!(2.0)),
            ("either", json!("x")),
            ("either", Value::Null),
            ("any", json!([1])),
        ] {
            assert_eq!(v.violation(key, &value), None, "{key} = {value}");
        }
        assert_eq!(v.built(), 0, "no validator for values that fit a type-only schema");
        // A value that does not fit is told what the validator says.
        let n = v.violation("n", &json!(2.5)).unwrap();
        assert_eq!(Some(n), first_violation(v.get("n").unwrap(), &json!(2.5)));
        assert!(v.violation("n", &json!("3")).is_some());
        assert!(v.violation("either", &json!(1)).is_some());
        // A schema that says more than a type always asks its validator.
        assert!(v.violation("bounded", &json!(4)).is_some());
        assert_eq!(v.violation("bounded", &json!(2)), None);
        assert_eq!(v.violation("missing", &json!(2)), None);
    }
}
