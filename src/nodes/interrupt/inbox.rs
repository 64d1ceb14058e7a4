//! A gate that speaks the agent-inbox shapes: its interrupt value is a `HumanInterrupt`
//! (`action_request`, `config`, `description`) and, in the same object, agent-chat-ui's
//! `{action_requests, review_configs}`; it takes the inbox's answer (a list of one
//! `HumanResponse`) and agent-chat-ui's `{decisions: [one decision]}`, each checked against
//! what the gate allows and the keys of what it shows for editing, and folds either into one
//! output, `{action, edit, feedback}`.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The agent-inbox shapes of a gate.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::nodes) struct InboxSpec {
    /// `action_request.action`: the name of what is reviewed (default: the node's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::nodes) action: Option<String>,
    /// `action_request.args`: what is reviewed, a map of expressions. An `edit` answer gives
    /// these keys back, edited: they are `output.edit`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub(in crate::nodes) args: IndexMap<String, Value>,
    /// The answers offered; all four when not given.
    #[serde(default = "every_action")]
    #[schemars(length(min = 1))]
    pub(in crate::nodes) allow: Vec<InboxAction>,
}

/// An answer an inbox gate may offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(in crate::nodes) enum InboxAction {
    /// Go on with what was shown.
    Accept,
    /// Go on with what was shown, edited.
    Edit,
    /// Send text feedback.
    Respond,
    /// Skip.
    Ignore,
}

impl InboxAction {
    fn name(self) -> &'static str {
        match self {
            InboxAction::Accept => "accept",
            InboxAction::Edit => "edit",
            InboxAction::Respond => "respond",
            InboxAction::Ignore => "ignore",
        }
    }
}

fn every_action() -> Vec<InboxAction> {
    vec![
        InboxAction::Accept,
        InboxAction::Edit,
        InboxAction::Respond,
        InboxAction::Ignore,
    ]
}

/// The fields of the output an inbox answer is folded into.
pub(in crate::nodes) const OUTPUT_FIELDS: [&str; 3] = ["action", "edit", "feedback"];

/// An inbox gate, compiled: what it is called, which answers it allows, the keys it shows.
pub(in crate::nodes) struct Inbox {
    pub(in crate::nodes) action: String,
    pub(in crate::nodes) allow: Vec<InboxAction>,
    pub(in crate::nodes) keys: Vec<String>,
}

impl Inbox {
    fn allows(&self, a: InboxAction) -> bool {
        self.allow.contains(&a)
    }

    /// The decisions of agent-chat-ui's review that stand for the allowed answers (`reject`
    /// is `respond` with a message and `ignore` without).
    fn decisions(&self) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.allows(InboxAction::Accept) {
            d.push("approve");
        }
        if self.allows(InboxAction::Edit) {
            d.push("edit");
        }
        if self.allows(InboxAction::Respond) || self.allows(InboxAction::Ignore) {
            d.push("reject");
        }
        d
    }

    /// The edited arguments an `edit` answer gives back: the keys shown, each present.
    fn edited_args(&self) -> Value {
        json!({
            "type": "object",
            "required": self.keys,
            "properties": self.keys.iter().map(|k| (k.clone(), json!({}))).collect::<Map<_, _>>(),
            "additionalProperties": false,
        })
    }

    /// The schema of an inbox answer: a list of one `HumanResponse`, or `{decisions: [one]}`;
    /// `native` (the gate's own `response` schema, self-contained) for anything else. The
    /// branches are chosen by `if`/`then` rather than `anyOf` so that a refused answer is told
    /// what is wrong with it in the shape it was given.
    pub(in crate::nodes) fn answer_schema(&self, native: Option<&Value>) -> Value {
        let types: Vec<&str> = self
            .allow
            .iter()
            .map(|a| match a {
                InboxAction::Respond => "response",
                other => other.name(),
            })
            .collect();
        let action = json!({"type": "object", "required": ["action", "args"],
                            "properties": {"action": {"const": self.action}, "args": self.edited_args()}});
        let human_response = json!({
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": types}},
            "allOf": [
                {"if": {"properties": {"type": {"const": "edit"}}},
                 "then": {"required": ["args"], "properties": {"args": action}}},
                {"if": {"properties": {"type": {"const": "response"}}},
                 "then": {"required": ["args"], "properties": {"args": {"type": "string", "minLength": 1}}}},
            ],
        });
        let edited_action = json!({"type": "object", "required": ["name", "args"],
                                   "properties": {"name": {"const": self.action}, "args": self.edited_args()}});
        let mut reject = vec![json!({"properties": {"message": {"type": "string"}}})];
        if !self.allows(InboxAction::Respond) {
            reject.push(json!({"properties": {"message": {"maxLength": 0}}}));
        }
        if !self.allows(InboxAction::Ignore) {
            reject.push(json!({"required": ["message"], "properties": {"message": {"minLength": 1}}}));
        }
        let decision = json!({
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": self.decisions()}},
            "allOf": [
                {"if": {"properties": {"type": {"const": "edit"}}},
                 "then": {"required": ["edited_action"], "properties": {"edited_action": edited_action}}},
                {"if": {"properties": {"type": {"const": "reject"}}}, "then": {"allOf": reject}},
            ],
        });
        let decisions = json!({
            "type": "object",
            "required": ["decisions"],
            "properties": {"decisions": {"type": "array", "minItems": 1, "maxItems": 1, "items": decision}},
        });
        let list = json!({"type": "array", "minItems": 1, "maxItems": 1, "items": human_response});
        // The gate's own schema keeps its `types`/`files` at the root, where its references
        // point; without one, nothing but the two inbox shapes is an answer.
        let (mut root, rest) = match native {
            Some(Value::Object(n)) => {
                let mut root = Map::new();
                let mut rest = n.clone();
                for k in ["types", "files", "$schema"] {
                    if let Some(v) = rest.remove(k) {
                        root.insert(k.into(), v);
                    }
                }
                (root, Value::Object(rest))
            }
            Some(other) => (Map::new(), other.clone()),
            None => (
                Map::new(),
                json!({"not": {}, "description": "an inbox answer: a list of one HumanResponse, or {decisions: [...]}"}),
            ),
        };
        root.insert("if".into(), json!({"type": "array"}));
        root.insert("then".into(), list);
        root.insert(
            "else".into(),
            json!({"if": {"type": "object", "required": ["decisions"]}, "then": decisions, "else": rest}),
        );
        Value::Object(root)
    }

    /// The interrupt value's inbox fields, for what is shown (`args`) and its text.
    pub(in crate::nodes) fn shown(&self, args: Value, description: Option<&str>) -> Map<String, Value> {
        let flag = |a| Value::Bool(self.allows(a));
        let mut m = Map::new();
        m.insert("action_request".into(), json!({"action": self.action, "args": args}));
        m.insert(
            "config".into(),
            json!({
                "allow_accept": flag(InboxAction::Accept),
                "allow_edit": flag(InboxAction::Edit),
                "allow_respond": flag(InboxAction::Respond),
                "allow_ignore": flag(InboxAction::Ignore),
            }),
        );
        m.insert("description".into(), description.map_or(Value::Null, Value::from));
        let mut request = json!({"name": self.action, "args": args});
        if let (Some(d), Value::Object(r)) = (description, &mut request) {
            r.insert("description".into(), Value::from(d));
        }
        m.insert("action_requests".into(), json!([request]));
        m.insert(
            "review_configs".into(),
            json!([{"action_name": self.action, "allowed_decisions": self.decisions()}]),
        );
        m
    }
}

/// An answer (already checked against [`Inbox::answer_schema`]) as the gate's output:
/// an inbox answer folded into `{action, edit, feedback}`, any other answer as it is.
pub(in crate::nodes) fn folded(answer: &Value) -> Value {
    let out =
        |action: &str, edit: Value, feedback: Value| json!({"action": action, "edit": edit, "feedback": feedback});
    let text = |v: Option<&Value>| match v.and_then(Value::as_str) {
        Some(s) if !s.is_empty() => Value::from(s),
        _ => Value::Null,
    };
    if let Some([one]) = answer.as_array().map(Vec::as_slice) {
        return match one.get("type").and_then(Value::as_str) {
            Some("edit") => out("edit", one["args"]["args"].clone(), Value::Null),
            Some("response") => out("respond", Value::Null, text(one.get("args"))),
            Some("ignore") => out("ignore", Value::Null, Value::Null),
            _ => out("accept", Value::Null, Value::Null),
        };
    }
    if let Some([one]) = answer.get("decisions").and_then(Value::as_array).map(Vec::as_slice) {
        return match one.get("type").and_then(Value::as_str) {
            Some("edit") => out("edit", one["edited_action"]["args"].clone(), Value::Null),
            Some("reject") => match text(one.get("message")) {
                Value::Null => out("ignore", Value::Null, Value::Null),
                message => out("respond", Value::Null, message),
            },
            _ => out("accept", Value::Null, Value::Null),
        };
    }
    answer.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(allow: Vec<InboxAction>) -> Inbox {
        Inbox {
            action: "review_plan".into(),
            allow,
            keys: vec!["plan".into()],
        }
    }

    fn check(inbox: &Inbox, native: Option<&Value>, answer: Value) -> Result<Value, String> {
        let v = jsonschema::draft202012::new(&inbox.answer_schema(native)).map_err(|e| e.to_string())?;
        match crate::compile::schemas::first_violation(&v, &answer) {
            Some(why) => Err(why),
            None => Ok(folded(&answer)),
        }
    }

    #[test]
    fn every_inbox_answer_folds_into_action_edit_feedback() {
        let g = gate(every_action());
        let edited = json!({"plan": {"title": "t"}});
        for (answer, action, edit, feedback) in [
            (
                json!([{"type": "accept", "args": null}]),
                "accept",
                Value::Null,
                Value::Null,
            ),
            (
                json!([{"type": "edit", "args": {"action": "review_plan", "args": edited}}]),
                "edit",
                edited.clone(),
                Value::Null,
            ),
            (
                json!([{"type": "response", "args": "more"}]),
                "respond",
                Value::Null,
                json!("more"),
            ),
            (
                json!([{"type": "ignore", "args": null}]),
                "ignore",
                Value::Null,
                Value::Null,
            ),
            (
                json!({"decisions": [{"type": "approve"}]}),
                "accept",
                Value::Null,
                Value::Null,
            ),
            (
                json!({"decisions": [{"type": "edit", "edited_action": {"name": "review_plan", "args": edited}}]}),
                "edit",
                edited.clone(),
                Value::Null,
            ),
            (
                json!({"decisions": [{"type": "reject", "message": "more"}]}),
                "respond",
                Value::Null,
                json!("more"),
            ),
            (
                json!({"decisions": [{"type": "reject"}]}),
                "ignore",
                Value::Null,
                Value::Null,
            ),
        ] {
            let got = check(&g, None, answer.clone()).unwrap_or_else(|e| panic!("{answer}: {e}"));
            assert_eq!(
                got,
                json!({"action": action, "edit": edit, "feedback": feedback}),
                "{answer}"
            );
        }
    }

    #[test]
    fn answers_outside_what_the_gate_allows_and_shows_are_refused() {
        let g = gate(vec![InboxAction::Accept, InboxAction::Respond]);
        for answer in [
            json!([{"type": "ignore", "args": null}]),
            json!([{"type": "edit", "args": {"action": "review_plan", "args": {"plan": 1}}}]),
            json!([{"type": "response", "args": ""}]),
            json!([{"type": "accept"}, {"type": "accept"}]),
            json!([]),
            json!({"decisions": [{"type": "reject"}]}),
            json!({"decisions": [{"type": "edit", "edited_action": {"name": "review_plan", "args": {"plan": 1}}}]}),
            json!({"decisions": []}),
            json!({"action": "accept"}),
        ] {
            assert!(check(&g, None, answer.clone()).is_err(), "{answer} was taken");
        }
        let all = gate(every_action());
        for answer in [
            // The edited arguments are the keys shown, no fewer and no more.
            json!([{"type": "edit", "args": {"action": "review_plan", "args": {}}}]),
            json!([{"type": "edit", "args": {"action": "review_plan", "args": {"plan": 1, "x": 2}}}]),
            json!([{"type": "edit", "args": {"action": "other", "args": {"plan": 1}}}]),
            json!({"decisions": [{"type": "edit", "edited_action": {"name": "review_plan", "args": {"x": 1}}}]}),
        ] {
            let why = check(&all, None, answer.clone()).expect_err(&answer.to_string());
            assert!(!why.is_empty());
        }
    }

    #[test]
    fn the_gates_own_answers_still_go_through_its_response_schema() {
        let native = json!({"$ref": "#/types/R", "types": {"R": {"type": "object", "required": ["action"],
                            "properties": {"action": {"enum": ["accept", "respond"]}, "target": {"type": "string"}}}}});
        let g = gate(every_action());
        let answer = json!({"action": "respond", "target": "plan"});
        assert_eq!(check(&g, Some(&native), answer.clone()), Ok(answer));
        assert!(check(&g, Some(&native), json!({"action": "maybe"})).is_err());
        assert!(check(&g, Some(&native), json!([{"type": "accept", "args": null}])).is_ok());
    }

    #[test]
    fn the_interrupt_value_is_a_human_interrupt_and_a_review_request() {
        let g = gate(vec![InboxAction::Accept, InboxAction::Ignore]);
        let shown = Value::Object(g.shown(json!({"plan": {"title": "t"}}), Some("Review it")));
        assert_eq!(
            shown["action_request"],
            json!({"action": "review_plan", "args": {"plan": {"title": "t"}}})
        );
        assert_eq!(
            shown["config"],
            json!({"allow_accept": true, "allow_edit": false, "allow_respond": false, "allow_ignore": true})
        );
        assert_eq!(shown["description"], "Review it");
        assert_eq!(
            shown["action_requests"],
            json!([{"name": "review_plan", "args": {"plan": {"title": "t"}}, "description": "Review it"}])
        );
        assert_eq!(
            shown["review_configs"],
            json!([{"action_name": "review_plan", "allowed_decisions": ["approve", "reject"]}])
        );
    }
}
