//! Values at run time: the scope expressions and templates see, conversion between JSON and
//! minijinja values, and the reducers that fold writes into state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use minijinja::value::{Enumerator, Object, ObjectRepr, Value as JValue};
use serde_json::{Map, Value};

use crate::compile::{ExprId, Plan, REMOVE_ALL_MESSAGES, Reducer};

/// What expressions read: `state`, `input`, `config`, `context`, `run`, and per use `params`,
/// the fan-out item, `output`, `usage`, `error`. A scope is a stack of layers: a layer holds
/// only what it adds and defers to its parent, so a task's scope costs its own few variables.
/// Predicates are evaluated on first use in the layer that holds them (the step's base) and
/// remembered there: a predicate that cannot be evaluated fails every expression that reads it
/// (its value is an invalid value carrying the error, which minijinja refuses on lookup), and
/// every task of a step shares its value.
#[derive(Debug)]
pub struct Scope {
    vars: BTreeMap<String, JValue>,
    parent: Option<Arc<Scope>>,
    /// The plan whose predicates this layer evaluates, and the values computed so far.
    predicates: Option<(Arc<Plan>, Memo)>,
}

type Memo = Mutex<BTreeMap<String, JValue>>;

impl Scope {
    pub fn new(vars: BTreeMap<String, JValue>, plan: Option<Arc<Plan>>) -> Scope {
        Scope {
            vars,
            parent: None,
            predicates: plan.map(|p| (p, Mutex::new(BTreeMap::new()))),
        }
    }

    /// A layer over `parent` with its own variables and, when given, the plan's predicates
    /// (evaluated against this layer, once).
    pub fn over(parent: &Arc<Scope>, vars: BTreeMap<String, JValue>, plan: Option<Arc<Plan>>) -> Scope {
        Scope {
            vars,
            parent: Some(parent.clone()),
            predicates: plan.map(|p| (p, Mutex::new(BTreeMap::new()))),
        }
    }

    /// A layer over this scope with more variables.
    pub fn with(self: &Arc<Self>, extra: impl IntoIterator<Item = (String, JValue)>) -> Scope {
        Scope {
            vars: extra.into_iter().collect(),
            parent: Some(self.clone()),
            predicates: None,
        }
    }

    pub fn into_value(self) -> JValue {
        JValue::from_object(self)
    }

    /// The scope as a minijinja value, shared (not copied).
    pub fn value(self: &Arc<Self>) -> JValue {
        JValue::from_dyn_object(self.clone())
    }

    fn var(&self, name: &str) -> Option<JValue> {
        match self.vars.get(name) {
            Some(v) => Some(v.clone()),
            None => self.parent.as_ref()?.var(name),
        }
    }

    fn predicate(self: &Arc<Self>, name: &str) -> Option<JValue> {
        let Some((plan, memo)) = &self.predicates else {
            return self.parent.as_ref()?.predicate(name);
        };
        let id = *plan.predicates().get(name)?;
        if let Ok(memo) = memo.lock()
            && let Some(v) = memo.get(name)
        {
            return Some(v.clone());
        }
        // Predicates never read other predicates (the compiler refuses it), so evaluating one in
        // this very layer cannot recurse.
        let value = match plan.exprs().expr(id).eval(self.value()) {
            Ok(v) if v.is_undefined() => invalid(format!(
                "predicate `{name}` is undefined (give optional values a fallback with `| default(...)`)"
            )),
            Ok(v) => v,
            Err(e) => invalid(format!("predicate `{name}` cannot be evaluated: {}", describe(&e))),
        };
        if let Ok(mut memo) = memo.lock() {
            memo.insert(name.to_string(), value.clone());
        }
        Some(value)
    }

    fn names(&self, out: &mut Vec<JValue>) {
        if let Some(p) = &self.parent {
            p.names(out);
        }
        out.extend(self.vars.keys().map(|k| JValue::from(k.as_str())));
    }
}

/// A value that fails whatever reads it, with `msg`.
fn invalid(msg: String) -> JValue {
    JValue::from(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
}

impl Object for Scope {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &JValue) -> Option<JValue> {
        let name = key.as_str()?;
        self.var(name).or_else(|| self.predicate(name))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let mut keys = Vec::new();
        self.names(&mut keys);
        Enumerator::Values(keys)
    }
}

/// Why an expression gave no value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// What minijinja reported, in one line.
    #[error("{0}")]
    Expr(String),
    #[error("the value is undefined (give optional values a fallback with `| default(...)`)")]
    Undefined,
    #[error("the condition is undefined (give optional values a fallback with `| default(...)`)")]
    UndefinedCondition,
    #[error("the condition cannot be evaluated: {0}")]
    InvalidCondition(String),
    #[error("the value cannot be stored as JSON: {0}")]
    NotJson(String),
}

/// Why a reducer could not fold an update into a key's value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReduceError {
    #[error("`{reducer}` needs the key to hold an array, not {found}")]
    NotAnArray { reducer: &'static str, found: &'static str },
    #[error("`extend` needs an array to add, got {0}")]
    ExtendNeedsAnArray(&'static str),
    #[error("`merge` combines objects, not {0} and {1}")]
    MergeNeedsObjects(&'static str, &'static str),
    #[error("a numeric reducer needs a number, got {0}")]
    NotANumber(&'static str),
    #[error("a numeric reducer needs the key to hold a number, not {0}")]
    KeyNotANumber(&'static str),
    #[error("the sum is not a finite number")]
    NotFinite,
    #[error("a message is an object or a string, not {0}")]
    NotAMessage(&'static str),
    #[error("`add_messages` cannot remove message `{0}`: no message has that id")]
    NoSuchMessage(String),
    #[error("a remove marker needs the `id` of the message to remove")]
    RemoveWithoutId,
    #[error("two writes overwrite the key in the same superstep; only one can (have one of them write another key)")]
    TwoOverwrites,
    #[error("reducer `{0}` needs its plan")]
    NoPlan(String),
    #[error("reducer `{name}`: {source}")]
    Custom {
        name: String,
        #[source]
        source: EvalError,
    },
}

/// JSON to a minijinja value.
pub fn to_jinja(v: &Value) -> JValue {
    JValue::from(minijinja::value::Serde(v))
}

/// The `run` variable: where an expression is evaluated, and how many supersteps the run may
/// still take after the current one (`remaining_steps`, 0 in the last one the recursion limit
/// allows: LangGraph's `RemainingSteps`).
pub fn run_value(thread_id: &str, step: i64, node: &str, remaining_steps: i64) -> JValue {
    minijinja::context! {
        thread_id => thread_id,
        step => step,
        node => node,
        remaining_steps => remaining_steps.max(0),
    }
}

/// A JSON object to a minijinja value, serialized by reference (no copy of the map first).
pub fn map_to_jinja(m: &serde_json::Map<String, Value>) -> JValue {
    JValue::from(minijinja::value::Serde(m))
}

/// `state` as expressions see it, kept up to date with the state: a step converts only the
/// keys it changed, not the whole state (a long list is not copied again for every step that
/// leaves it alone). The map itself is rebuilt from the converted values, which are shared.
pub(crate) struct StateView {
    keys: HashMap<String, (JValue, JValue)>,
    value: JValue,
}

impl StateView {
    pub(crate) fn new(state: &Map<String, Value>) -> StateView {
        let keys = state
            .iter()
            .map(|(k, v)| (k.clone(), (JValue::from(k.as_str()), to_jinja(v))))
            .collect();
        let mut view = StateView {
            keys,
            value: JValue::UNDEFINED,
        };
        view.rebuild(state);
        view
    }

    /// After `changed` (and only they) took new values in `state`, or were added to it.
    pub(crate) fn update<'a>(&mut self, state: &Map<String, Value>, changed: impl IntoIterator<Item = &'a str>) {
        for key in changed {
            match state.get(key) {
                Some(v) => {
                    let converted = to_jinja(v);
                    match self.keys.get_mut(key) {
                        Some(entry) => entry.1 = converted,
                        None => {
                            self.keys.insert(key.to_string(), (JValue::from(key), converted));
                        }
                    }
                }
                None => {
                    self.keys.remove(key);
                }
            }
        }
        self.rebuild(state);
    }

    /// The map in the state's own key order (what a whole conversion would give).
    fn rebuild(&mut self, state: &Map<String, Value>) {
        self.value = JValue::from_pairs(
            state
                .keys()
                .filter_map(|k| self.keys.get(k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
    }

    /// The view, shared (not copied).
    pub(crate) fn value(&self) -> JValue {
        self.value.clone()
    }
}

/// A minijinja value back to JSON. Undefined becomes null.
pub fn to_json(v: &JValue) -> Result<Value, EvalError> {
    if v.is_undefined() {
        return Ok(Value::Null);
    }
    serde_json::to_value(v).map_err(|e| EvalError::NotJson(e.to_string()))
}

/// Evaluates a compiled expression in a scope, as JSON. The error is the message of an
/// [`EvalError`], for the node kinds that wrap it in their own.
pub fn eval(plan: &Plan, id: ExprId, scope: &JValue) -> Result<Value, String> {
    eval_value(plan, id, scope).map_err(|e| e.to_string())
}

/// [`eval`] with its typed error.
pub fn eval_value(plan: &Plan, id: ExprId, scope: &JValue) -> Result<Value, EvalError> {
    let v = plan
        .exprs()
        .expr(id)
        .eval(scope.clone())
        .map_err(|e| EvalError::Expr(describe(&e)))?;
    if v.is_undefined() {
        // Strict mode only trips on using an undefined value; a data expression that *is* one
        // (a missing optional input, a key absent from an object) must not become null silently.
        return Err(EvalError::Undefined);
    }
    to_json(&v)
}

/// Evaluates a compiled expression as a condition. A condition that is undefined or invalid
/// (a predicate that failed) is an error, never false: a branch must not be skipped silently.
pub fn eval_bool(plan: &Plan, id: ExprId, scope: &JValue) -> Result<bool, EvalError> {
    let v = plan
        .exprs()
        .expr(id)
        .eval(scope.clone())
        .map_err(|e| EvalError::Expr(describe(&e)))?;
    if v.is_undefined() {
        return Err(EvalError::UndefinedCondition);
    }
    if v.kind() == minijinja::value::ValueKind::Invalid {
        return Err(EvalError::InvalidCondition(v.to_string()));
    }
    Ok(v.is_true())
}

/// A minijinja error in one line, with what it was doing.
pub fn describe(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    if let Some(i) = s.find(" (in ") {
        s.truncate(i);
    }
    s
}

/// A key's new value, and whether an overwrite set it (then it need not extend the old one).
#[derive(Debug, Clone, PartialEq)]
pub struct Reduced {
    pub value: Value,
    pub overwritten: bool,
}

/// Folds `updates` (in their deterministic order) into `current` with a key's reducer. An
/// overwrite (`{"__overwrite__": value}`) sets the value and the step's other writes of the key
/// are dropped, as LangGraph's `Overwrite` does; two overwrites of one key in one step are an
/// error, since neither can win.
/// Each update comes with the base of the ids its id-less messages get (see [`message_id`]).
pub fn reduce(
    plan: &Plan,
    reducer: &Reducer,
    current: &Value,
    updates: Vec<(Value, String)>,
) -> Result<Reduced, ReduceError> {
    let mut overwrites = updates.iter().filter_map(|(u, _)| crate::compile::overwritten(u));
    if let Some(value) = overwrites.next() {
        if overwrites.next().is_some() {
            return Err(ReduceError::TwoOverwrites);
        }
        return Ok(Reduced {
            value: value.clone(),
            overwritten: true,
        });
    }
    let mut value = current.clone();
    let mut overwritten = false;
    for (update, ids) in updates {
        // Removing every message starts the key afresh, as an overwrite does.
        overwritten |= *reducer == Reducer::AddMessages && removes_all(&update);
        value = reduce_one(Some(plan), reducer, value, update, &ids)?;
    }
    Ok(Reduced { value, overwritten })
}

/// Whether a write to an `add_messages` key holds the marker that removes every message.
fn removes_all(update: &Value) -> bool {
    match update {
        Value::Array(items) => items.iter().any(is_remove_all),
        one => is_remove_all(one),
    }
}

/// Whether one message is the marker that removes every message.
fn is_remove_all(m: &Value) -> bool {
    m.get("type").and_then(Value::as_str) == Some("remove")
        && m.get("id").and_then(Value::as_str) == Some(REMOVE_ALL_MESSAGES)
}

/// `ids`: the base of the ids the update's id-less messages get, for `add_messages`.
fn reduce_one(
    plan: Option<&Plan>,
    reducer: &Reducer,
    current: Value,
    update: Value,
    ids: &str,
) -> Result<Value, ReduceError> {
    Ok(match reducer {
        Reducer::Replace => update,
        Reducer::Append => {
            let mut items = as_array(current, "append")?;
            match update {
                Value::Array(more) => items.extend(more),
                one => items.push(one),
            }
            Value::Array(items)
        }
        Reducer::Extend => {
            let mut items = as_array(current, "extend")?;
            match update {
                Value::Array(more) => items.extend(more),
                other => return Err(ReduceError::ExtendNeedsAnArray(kind(&other))),
            }
            Value::Array(items)
        }
        Reducer::Union => {
            let mut items = as_array(current, "union")?;
            let mut seen: HashSet<String> = items.iter().map(Value::to_string).collect();
            let more = match update {
                Value::Array(more) => more,
                one => vec![one],
            };
            for item in more {
                if seen.insert(item.to_string()) {
                    items.push(item);
                }
            }
            Value::Array(items)
        }
        Reducer::AddMessages => add_messages(as_array(current, "add_messages")?, update, ids)?,
        Reducer::Merge => match (current, update) {
            (Value::Null, u) => u,
            (Value::Object(mut base), Value::Object(over)) => {
                deep_merge(&mut base, over);
                Value::Object(base)
            }
            (c, u) => return Err(ReduceError::MergeNeedsObjects(kind(&c), kind(&u))),
        },
        Reducer::Sum | Reducer::Max | Reducer::Min => numeric(reducer, current, update)?,
        Reducer::Custom { name, expr } => {
            let Some(plan) = plan else {
                return Err(ReduceError::NoPlan(name.clone()));
            };
            let mut vars = BTreeMap::new();
            vars.insert("current".to_string(), to_jinja(&current));
            vars.insert("update".to_string(), to_jinja(&update));
            let scope = Scope::new(vars, None).into_value();
            eval_value(plan, *expr, &scope).map_err(|source| ReduceError::Custom {
                name: name.clone(),
                source,
            })?
        }
    })
}

fn as_array(v: Value, reducer: &'static str) -> Result<Vec<Value>, ReduceError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => Ok(a),
        other => Err(ReduceError::NotAnArray {
            reducer,
            found: kind(&other),
        }),
    }
}

/// What a JSON value is, with its article, for messages ("got a string").
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn deep_merge(base: &mut Map<String, Value>, over: Map<String, Value>) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(Value::Object(b)), Value::Object(o)) => deep_merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn numeric(reducer: &Reducer, current: Value, update: Value) -> Result<Value, ReduceError> {
    let u = update.as_f64().ok_or_else(|| ReduceError::NotANumber(kind(&update)))?;
    if current.is_null() {
        return Ok(update);
    }
    let c = current
        .as_f64()
        .ok_or_else(|| ReduceError::KeyNotANumber(kind(&current)))?;
    let both_int = current.is_i64() && update.is_i64();
    let r = match reducer {
        Reducer::Sum if both_int => {
            return Ok(Value::from(
                current
                    .as_i64()
                    .unwrap_or(0)
                    .saturating_add(update.as_i64().unwrap_or(0)),
            ));
        }
        Reducer::Sum => c + u,
        Reducer::Max => return Ok(if u > c { update } else { current }),
        _ => return Ok(if u < c { update } else { current }),
    };
    serde_json::Number::from_f64(r)
        .map(Value::Number)
        .ok_or(ReduceError::NotFinite)
}

/// The id of the message a writer adds without one: `writer` is the task that writes it
/// (`__start__`'s for a turn's input, `__update__`'s for a command's update, the node's for a
/// state edit as a node); task ids are unique everywhere, so the id is known before the write
/// exists (a model call's streamed pieces carry it), differs on every thread, step and branch
/// (a regenerated reply is a new message), and a replay on the same thread gives the same. The
/// writer's first id-less assistant message takes it; its other id-less messages take it with
/// `:1`, `:2`, … in the order they are written. A subgraph's child (an `agent` node's loop)
/// gives its messages ids of its own tasks, which they keep when handed to the parent: the
/// pieces a client saw streamed and the message stored in the parent share an id.
pub fn message_id(writer: &str) -> String {
    format!("msg:{writer}")
}

/// Whether a message is the model's (an assistant or AI message).
fn is_ai(m: &Value) -> bool {
    matches!(m.get("role").and_then(Value::as_str), Some("assistant" | "ai"))
        || matches!(
            m.get("type").and_then(Value::as_str),
            Some("ai" | "AIMessage" | "AIMessageChunk")
        )
}

/// A task's write to an `add_messages` key with the ids its messages will have: each id-less
/// message (a string is a user message) given the id the reducer would give it
/// ([`message_id`] of the task: the first assistant message `ids`, the others `ids:N`), so
/// that what a task is shown to have written (its update on the stream, its result in the
/// history) is what the state holds. Markers (`remove`, an overwrite) are left as they are.
pub(crate) fn identify_messages(update: Value, ids: &str) -> Value {
    if crate::compile::overwritten(&update).is_some() {
        return update;
    }
    let one = !update.is_array();
    let items = match update {
        Value::Array(items) => items,
        one => vec![one],
    };
    let mut based = false;
    let mut others = 0;
    let identified: Vec<Value> = items
        .into_iter()
        .map(|msg| {
            let mut msg = match msg {
                Value::String(s) => serde_json::json!({"role": "user", "content": s}),
                Value::Object(o) => Value::Object(o),
                other => return other,
            };
            let remove = msg.get("type").and_then(Value::as_str) == Some("remove");
            if remove || msg.get("id").and_then(Value::as_str).is_some() {
                return msg;
            }
            let id = if is_ai(&msg) && !based {
                based = true;
                ids.to_string()
            } else {
                others += 1;
                format!("{ids}:{others}")
            };
            if let Value::Object(o) = &mut msg {
                o.insert("id".into(), Value::String(id));
            }
            msg
        })
        .collect();
    match (one, identified.len()) {
        (true, 1) => identified.into_iter().next().unwrap_or(Value::Null),
        _ => Value::Array(identified),
    }
}

/// LangGraph's `add_messages`: a message whose `id` exists replaces it in place; `{type:
/// remove, id}` deletes (an id no message has is an error); others are appended with an id
/// made from `ids`, the writer's [`message_id`] (should a message already hold it, it is
/// followed by `.2`, `.3`, …). A string is a user message. `{type: remove, id:
/// "__remove_all__"}` removes every message before it, those of the key and those earlier in
/// the same update.
fn add_messages(mut current: Vec<Value>, update: Value, ids: &str) -> Result<Value, ReduceError> {
    let mut incoming = match update {
        Value::Array(items) => items,
        one => vec![one],
    };
    if let Some(last) = incoming.iter().rposition(is_remove_all) {
        current.clear();
        incoming.drain(..=last);
    }
    let mut based = false;
    let mut others = 0;
    for msg in incoming {
        let mut msg = match msg {
            Value::String(s) => serde_json::json!({"role": "user", "content": s}),
            Value::Object(o) => Value::Object(o),
            other => return Err(ReduceError::NotAMessage(kind(&other))),
        };
        let id = msg.get("id").and_then(Value::as_str).map(str::to_string);
        let is_remove = msg.get("type").and_then(Value::as_str) == Some("remove");
        match (id, is_remove) {
            (Some(id), true) => {
                // LangGraph raises on removing a message that is not there; so does runner.
                let before = current.len();
                current.retain(|m| m.get("id").and_then(Value::as_str) != Some(&id));
                if current.len() == before {
                    return Err(ReduceError::NoSuchMessage(id));
                }
            }
            (None, true) => return Err(ReduceError::RemoveWithoutId),
            (Some(id), false) => match current
                .iter_mut()
                .find(|m| m.get("id").and_then(Value::as_str) == Some(&id))
            {
                Some(slot) => *slot = msg,
                None => current.push(msg),
            },
            (None, false) => {
                let wanted = if is_ai(&msg) && !based {
                    based = true;
                    ids.to_string()
                } else {
                    others += 1;
                    format!("{ids}:{others}")
                };
                let taken = |id: &str| current.iter().any(|m| m.get("id").and_then(Value::as_str) == Some(id));
                let mut id = wanted.clone();
                let mut n = 1;
                while taken(&id) {
                    n += 1;
                    id = format!("{wanted}.{n}");
                }
                if let Value::Object(o) = &mut msg {
                    o.insert("id".into(), Value::String(id));
                }
                current.push(msg);
            }
        }
    }
    Ok(Value::Array(current))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn r(reducer: Reducer, current: Value, updates: Vec<Value>) -> Result<Value, String> {
        let mut c = current;
        for u in updates {
            c = reduce_one(None, &reducer, c, u, "msg:1:t").map_err(|e| e.to_string())?;
        }
        Ok(c)
    }

    /// The view kept up to date key by key is the state converted whole: the same keys, in
    /// the state's order, with the same values, through changes, additions and removals.
    #[test]
    fn the_state_view_follows_the_state_it_was_updated_with() {
        let whole = |m: &Map<String, Value>| map_to_jinja(m).to_string();
        let mut state = json!({"log": [1, 2], "n": 1, "doc": {"a": [true]}})
            .as_object()
            .cloned()
            .unwrap();
        let mut view = StateView::new(&state);
        assert_eq!(view.value().to_string(), whole(&state));
        state.insert("n".into(), json!(2));
        state.insert("new".into(), json!("x"));
        view.update(&state, ["n", "new"]);
        assert_eq!(view.value().to_string(), whole(&state));
        state.remove("log");
        state.insert("doc".into(), json!(null));
        view.update(&state, ["log", "doc"]);
        assert_eq!(view.value().to_string(), whole(&state));
        assert_eq!(view.value().get_attr("n").unwrap(), JValue::from(2));
        assert!(view.value().get_attr("log").unwrap().is_undefined());
    }

    #[test]
    fn numeric_reducers_keep_integers_integral() {
        assert_eq!(r(Reducer::Sum, json!(1), vec![json!(2), json!(3)]), Ok(json!(6)));
        assert_eq!(r(Reducer::Sum, json!(0.5), vec![json!(0.25)]), Ok(json!(0.75)));
        assert_eq!(r(Reducer::Max, json!(3), vec![json!(7), json!(5)]), Ok(json!(7)));
        assert_eq!(r(Reducer::Min, Value::Null, vec![json!(4), json!(2)]), Ok(json!(2)));
        assert!(r(Reducer::Sum, json!(1), vec![json!("x")]).is_err());
    }

    #[test]
    fn add_messages_replaces_by_id_appends_new_and_removes() {
        let base = json!([{"id": "a", "role": "user", "content": "hi"}]);
        let v = r(
            Reducer::AddMessages,
            base,
            vec![json!([{"id": "a", "role": "user", "content": "hello"}, {"role": "assistant", "content": "yo"}, "next"])],
        )
        .unwrap();
        assert_eq!(
            v,
            json!([
                {"id": "a", "role": "user", "content": "hello"},
                {"id": "msg:1:t", "role": "assistant", "content": "yo"},
                {"id": "msg:1:t:1", "role": "user", "content": "next"}
            ])
        );
        let v = r(
            Reducer::AddMessages,
            v,
            vec![json!({"type": "remove", "id": "msg:1:t"})],
        )
        .unwrap();
        assert_eq!(v.as_array().unwrap().len(), 2);
        let err = r(
            Reducer::AddMessages,
            v,
            vec![json!({"type": "remove", "id": "msg:1:t"})],
        )
        .unwrap_err();
        assert!(err.contains("`msg:1:t`"), "{err}");
    }

    /// An id-less message's id is its writer's: the first assistant message takes the
    /// writer's id (the one its streamed pieces carried), the others it with a number; an id
    /// some message already holds is never taken again, so nothing is replaced by accident.
    #[test]
    fn id_less_messages_take_their_writers_ids() {
        let v = r(
            Reducer::AddMessages,
            json!([]),
            vec![json!(["q", {"role": "assistant", "content": "a"}, {"type": "ai", "content": "b"}])],
        )
        .unwrap();
        let ids: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["msg:1:t:1", "msg:1:t", "msg:1:t:2"]);
        assert_eq!(message_id("t"), "msg:t");
        // The same writer again (a state edit on the same step): fresh ids, nothing replaced.
        let v = r(
            Reducer::AddMessages,
            v,
            vec![json!({"role": "assistant", "content": "c"})],
        )
        .unwrap();
        assert_eq!(v[3]["id"], "msg:1:t.2");
        assert_eq!(v[1]["content"], "a");
    }

    #[test]
    fn remove_all_messages_drops_the_history_and_what_came_before_it_in_the_update() {
        let base = json!([{"id": "a", "role": "user", "content": "hi"}]);
        let marker = json!({"type": "remove", "id": REMOVE_ALL_MESSAGES});
        let v = r(
            Reducer::AddMessages,
            base,
            vec![json!(["dropped", marker, {"id": "a", "role": "user", "content": "kept"}, "new"])],
        )
        .unwrap();
        assert_eq!(
            v,
            json!([
                {"id": "a", "role": "user", "content": "kept"},
                {"id": "msg:1:t:1", "role": "user", "content": "new"}
            ])
        );
    }

    #[test]
    fn merge_is_deep() {
        let v = r(
            Reducer::Merge,
            json!({"a": {"x": 1, "y": 2}, "b": 1}),
            vec![json!({"a": {"y": 3, "z": 4}, "c": 5})],
        );
        assert_eq!(v, Ok(json!({"a": {"x": 1, "y": 3, "z": 4}, "b": 1, "c": 5})));
        assert!(r(Reducer::Merge, json!([1]), vec![json!({})]).is_err());
    }

    #[test]
    fn union_keeps_order_and_drops_repeats() {
        let v = r(
            Reducer::Union,
            json!(["a", "b"]),
            vec![json!(["b", "c", "a", "d"]), json!("e")],
        )
        .unwrap();
        assert_eq!(v, json!(["a", "b", "c", "d", "e"]));
        assert_eq!(
            r(Reducer::Append, json!([1]), vec![json!([2, 3]), json!(4)]),
            Ok(json!([1, 2, 3, 4]))
        );
        assert!(r(Reducer::Extend, json!([1]), vec![json!(2)]).is_err());
    }

    #[test]
    fn reducer_errors_are_typed_and_keep_their_messages() {
        let check = |reducer: Reducer, current: Value, update: Value, expected: ReduceError, message: &str| {
            let err = reduce_one(None, &reducer, current, update, "msg:1:t").unwrap_err();
            assert_eq!(err, expected);
            assert_eq!(err.to_string(), message);
        };
        check(
            Reducer::Append,
            json!(1),
            json!(2),
            ReduceError::NotAnArray {
                reducer: "append",
                found: "a number",
            },
            "`append` needs the key to hold an array, not a number",
        );
        check(
            Reducer::Extend,
            json!([1]),
            json!(2),
            ReduceError::ExtendNeedsAnArray("a number"),
            "`extend` needs an array to add, got a number",
        );
        check(
            Reducer::Merge,
            json!([1]),
            json!({}),
            ReduceError::MergeNeedsObjects("an array", "an object"),
            "`merge` combines objects, not an array and an object",
        );
        check(
            Reducer::Sum,
            json!("x"),
            json!(1),
            ReduceError::KeyNotANumber("a string"),
            "a numeric reducer needs the key to hold a number, not a string",
        );
        check(
            Reducer::AddMessages,
            json!([]),
            json!({"type": "remove"}),
            ReduceError::RemoveWithoutId,
            "a remove marker needs the `id` of the message to remove",
        );
    }
}
