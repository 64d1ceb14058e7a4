//! Messages as LangGraph's clients read them. A workflow's `add_messages` keys hold chat
//! messages in whichever shape its nodes wrote — OpenAI's `{role, content, tool_calls}` from
//! `llm` and `tools` nodes, LangChain's `{type, content}` from agent-chat-ui's input — and the
//! engine reads both. What the server sends (stream events, thread state, history, `wait`
//! results) is LangChain's message dict, as the reference server serializes it: `type` (`human`,
//! `ai`, `tool`, `system`), `content`, `additional_kwargs`, `response_metadata`, `name`, `id`,
//! and for AI messages `tool_calls` as `{name, args, id, type: "tool_call"}`,
//! `invalid_tool_calls` and `usage_metadata`. agent-chat-ui renders a message by its `type`.
//! The stored state is left as written.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::compile::Plan;
use crate::compile::Reducer;

/// The state keys of `plan` that hold messages (their reducer is `add_messages`).
pub(crate) fn keys(plan: &Plan) -> Vec<String> {
    plan.state()
        .iter()
        .filter(|(_, c)| c.reducer == Reducer::AddMessages)
        .map(|(k, _)| k.clone())
        .collect()
}

/// The plan whose events carry the namespace `ns` (`node:task|node:task`, none: `plan`).
pub(crate) fn plan_of(plan: &Arc<Plan>, ns: Option<&str>) -> Option<Arc<Plan>> {
    let mut at = plan.clone();
    for part in ns.into_iter().flat_map(|ns| ns.split('|')) {
        let node = part.split(':').next().unwrap_or(part);
        let ix = at.node_by_name(node)?;
        at = at.subgraphs().get(&ix)?.clone();
    }
    Some(at)
}

/// `values` with the messages under `keys` as LangChain dicts.
pub(crate) fn served(mut values: Map<String, Value>, keys: &[String]) -> Map<String, Value> {
    for key in keys {
        if let Some(v) = values.get_mut(key) {
            *v = list(std::mem::take(v));
        }
    }
    values
}

/// A state as the API shows it: its messages as LangChain dicts, and without the keys that
/// were never set (a key with no default that nothing wrote: LangGraph has no value for it).
pub(crate) fn served_state(mut values: Map<String, Value>, plan: &Plan) -> Map<String, Value> {
    values.retain(|k, v| !(v.is_null() && plan.state().get(k).is_none_or(|c| c.default.is_null())));
    served(values, &keys(plan))
}

/// A run's final values as `runs.wait` and `join` answer them: the served state without the
/// keys nothing ever wrote (still at their defaults since the thread's first checkpoint), as
/// LangGraph's final values have only the channels that were written.
pub(crate) fn written_state(
    values: Map<String, Value>,
    cp: &crate::checkpoint::Checkpoint,
    plan: &Plan,
) -> Map<String, Value> {
    let mut values = served_state(values, plan);
    values.retain(|k, v| {
        cp.versions.get(k).is_none_or(|version| *version > 1) || plan.state().get(k).is_none_or(|c| c.default != *v)
    });
    values
}

/// A messages value (a list, or one message) as LangChain dicts.
pub(crate) fn list(v: Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.into_iter().map(message).collect()),
        Value::Null => Value::Null,
        one => message(one),
    }
}

/// One message as a LangChain dict; a string is a human message; a `remove` marker and what is
/// not a message are left as they are.
pub(crate) fn message(v: Value) -> Value {
    let mut m = match v {
        Value::String(s) => Map::from_iter([
            ("content".to_string(), Value::String(s)),
            ("type".into(), json!("human")),
        ]),
        Value::Object(m) => m,
        other => return other,
    };
    let named = m.get("type").and_then(Value::as_str).map(str::to_string);
    let role = m.get("role").and_then(Value::as_str).map(str::to_string);
    let kind = match (named.as_deref(), role.as_deref()) {
        (Some("remove"), _) => return Value::Object(m),
        (Some(t @ ("human" | "ai" | "tool" | "system" | "function" | "chat")), _) => t.to_string(),
        (Some("AIMessageChunk" | "AIMessage"), _) => "ai".into(),
        (Some("HumanMessage"), _) => "human".into(),
        (Some("ToolMessage"), _) => "tool".into(),
        (Some("SystemMessage"), _) => "system".into(),
        (_, Some("user")) => "human".into(),
        (_, Some("assistant")) => "ai".into(),
        (_, Some("tool")) => "tool".into(),
        (_, Some("system" | "developer")) => "system".into(),
        (None, None) if m.contains_key("content") => "human".into(),
        _ => return Value::Object(m),
    };
    m.remove("role");
    let mut out = Map::new();
    out.insert(
        "content".into(),
        match m.remove("content") {
            None | Some(Value::Null) => json!(""),
            Some(c) => c,
        },
    );
    out.insert(
        "additional_kwargs".into(),
        m.remove("additional_kwargs").unwrap_or_else(|| json!({})),
    );
    out.insert(
        "response_metadata".into(),
        m.remove("response_metadata").unwrap_or_else(|| json!({})),
    );
    out.insert("type".into(), json!(kind));
    m.remove("type");
    out.insert("name".into(), m.remove("name").unwrap_or(Value::Null));
    out.insert("id".into(), m.remove("id").unwrap_or(Value::Null));
    match kind.as_str() {
        "ai" => {
            let calls = match m.remove("tool_calls") {
                Some(Value::Array(calls)) => calls.into_iter().map(tool_call).collect(),
                _ => Vec::new(),
            };
            out.insert("tool_calls".into(), Value::Array(calls));
            out.insert(
                "invalid_tool_calls".into(),
                m.remove("invalid_tool_calls").unwrap_or_else(|| json!([])),
            );
            out.insert(
                "usage_metadata".into(),
                m.remove("usage_metadata").unwrap_or(Value::Null),
            );
        }
        "tool" => {
            out.insert("tool_call_id".into(), m.remove("tool_call_id").unwrap_or(Value::Null));
            let status = match (m.remove("status"), m.remove("is_error")) {
                (Some(s), _) => s,
                (None, Some(Value::Bool(true))) => json!("error"),
                _ => json!("success"),
            };
            out.insert("status".into(), status);
            out.insert("artifact".into(), m.remove("artifact").unwrap_or(Value::Null));
        }
        _ => {}
    }
    // Whatever else the message holds is kept, after the fields the clients read.
    out.extend(m);
    Value::Object(out)
}

/// A tool call as LangChain's `{name, args, id, type: "tool_call"}`, from OpenAI's
/// `{id, type: "function", function: {name, arguments}}`; arguments that are not JSON are kept
/// as their text.
fn tool_call(call: Value) -> Value {
    let Value::Object(mut c) = call else {
        return call;
    };
    let Some(Value::Object(mut function)) = c.remove("function") else {
        c.entry("type").or_insert_with(|| json!("tool_call"));
        return Value::Object(c);
    };
    let args = match function.remove("arguments") {
        Some(Value::String(text)) => serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
        Some(v) => v,
        None => json!({}),
    };
    json!({
        "name": function.remove("name").unwrap_or(Value::Null),
        "args": args,
        "id": c.remove("id").unwrap_or(Value::Null),
        "type": "tool_call",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shaped_messages_become_langchain_dicts() {
        let ai = message(json!({"role": "assistant", "content": null, "id": "m1", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "define", "arguments": "{\"word\":\"cop\"}"}}
        ]}));
        assert_eq!(
            ai,
            json!({"content": "", "additional_kwargs": {}, "response_metadata": {}, "type": "ai", "name": null,
                   "id": "m1", "tool_calls": [{"name": "define", "args": {"word": "cop"}, "id": "call_1", "type": "tool_call"}],
                   "invalid_tool_calls": [], "usage_metadata": null})
        );
        let tool =
            message(json!({"role": "tool", "content": "x", "tool_call_id": "call_1", "name": "define", "id": "m2"}));
        assert_eq!(tool["type"], "tool");
        assert_eq!(tool["status"], "success");
        assert_eq!(tool["tool_call_id"], "call_1");
        assert_eq!(tool["name"], "define");
        assert!(tool.get("role").is_none());
        assert_eq!(message(json!({"role": "user", "content": "hi"}))["type"], "human");
        assert_eq!(
            message(json!({"role": "system", "content": "be brief"}))["type"],
            "system"
        );
        assert_eq!(message(json!("hello"))["type"], "human");
        // LangChain's own shape is kept, with the fields clients read filled in.
        let human = message(json!({"type": "human", "content": [{"type": "text", "text": "hi"}], "id": "h1"}));
        assert_eq!(human["content"], json!([{"type": "text", "text": "hi"}]));
        assert_eq!(
            (human["type"].as_str(), human["id"].as_str()),
            (Some("human"), Some("h1"))
        );
        let lc_call = json!({"name": "define", "args": {"word": "a"}, "id": "c2", "type": "tool_call"});
        assert_eq!(
            message(json!({"type": "ai", "content": "", "tool_calls": [lc_call.clone()]}))["tool_calls"],
            json!([lc_call])
        );
        // Extra fields stay; a removal marker and what is no message are left alone.
        assert_eq!(
            message(json!({"role": "user", "content": "hi", "lang": "en"}))["lang"],
            "en"
        );
        assert_eq!(
            message(json!({"type": "remove", "id": "m1"})),
            json!({"type": "remove", "id": "m1"})
        );
        assert_eq!(message(json!(7)), json!(7));
        assert_eq!(message(json!({"score": 1})), json!({"score": 1}));
    }
}
