//! `interrupt`: a human-in-the-loop gate. Without an answer it stops the run with its rendered
//! message and payload; resumed with an answer (already validated against the gate's response
//! schema by the engine) it outputs the answer. A gate with `inbox` speaks the agent-inbox
//! shapes (`inbox.rs`).

mod inbox;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{NodeCtx, NodeFailure, NodeOutput, data, render_opt};
use crate::compile::kind::{Data, KindConfig, KindCx, KindDecl, Shape, optional};
use crate::compile::{PlanNode, TemplateId};
use crate::diag::Code;
use crate::engine::kind::{Attempt, NodeKind};
use crate::spec::JsonSchemaDoc;

/// A human-in-the-loop gate: stops the run durably until `runner resume --answer`.
/// The answer is `output` in `update` and `goto`. A gate may instead ask several `questions`,
/// one at a time: each answer is checked before the next question is asked, and `output` is
/// the object of the answers by question id.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct InterruptNode {
    /// Text shown to the person answering (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Data shown with the message: a map of expressions.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub payload: IndexMap<String, Value>,
    /// JSON Schema an answer must match; a bad answer is refused and the gate stays open.
    /// Required unless the gate asks `questions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<JsonSchemaDoc>,
    /// Questions asked one after another (LangGraph's several `interrupt()` calls in one
    /// node); `output` is `{id: answer, ...}` once all are answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub questions: Vec<Question>,
    /// The gate speaks the agent-inbox shapes: its interrupt value is a `HumanInterrupt`
    /// (`action_request {action, args}`, `config {allow_accept, allow_edit, allow_respond,
    /// allow_ignore}`, `description`: the message) and agent-chat-ui's `{action_requests,
    /// review_configs}`; it takes a list of one `HumanResponse` (`accept`, `edit`, `response`,
    /// `ignore`) or `{decisions: [approve | edit | reject]}`, and `output` is then
    /// `{action: accept|edit|respond|ignore, edit: the edited args, feedback: the text}`.
    /// An answer of the gate's own `response` schema, if it has one, is taken as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbox: Option<inbox::InboxSpec>,
}

/// One question of a gate that asks several.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Question {
    /// The answer's name in `output`.
    pub id: String,
    /// Text shown to the person answering (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Data shown with the message: a map of expressions.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub payload: IndexMap<String, Value>,
    /// JSON Schema this question's answer must match.
    pub response: JsonSchemaDoc,
}

/// One question, compiled.
struct Asked {
    /// The answer's name in `output` (none: the gate's only question, whose answer is `output`).
    id: Option<String>,
    message: Option<TemplateId>,
    payload: Option<Data>,
    /// The response schema, resolved (self-contained); for an inbox gate, its answer schema.
    response: Value,
    /// The gate's own response schema, shown to a person (none: an inbox gate without one).
    shown_schema: Option<Value>,
}

/// An `interrupt` node, compiled: its questions, in order.
struct Config {
    questions: Vec<Asked>,
    /// The agent-inbox shapes, with what the gate shows (`action_request.args`).
    inbox: Option<(inbox::Inbox, Option<Data>)>,
}

/// The `interrupt` kind.
pub(super) struct Interrupt;

impl KindDecl for Interrupt {
    fn name(&self) -> &'static str {
        "interrupt"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<InterruptNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let mut n: InterruptNode = cx.own()?;
        if let Some(spec) = n.inbox.take() {
            return compile_inbox(cx, n, spec);
        }
        let src = cx.source();
        match (&n.response, n.questions.is_empty()) {
            (Some(response), true) => {
                let (asked, followed) = question(cx, &[], None, n.message.as_deref(), n.payload, Some(response));
                let shape = Shape::of_schema(&followed);
                Some((
                    KindConfig::new(Config {
                        questions: vec![asked?],
                        inbox: None,
                    }),
                    shape,
                ))
            }
            (None, false) => {
                if n.message.is_some() || !n.payload.is_empty() {
                    let d = src
                        .diag_key(
                            Code::InterruptResponse,
                            &cx.at(&["questions"]),
                            "a gate that asks `questions` has no `message` or `payload` of its own",
                        )
                        .help("give each question its `message` and `payload`");
                    cx.report(d);
                }
                let mut seen = std::collections::HashMap::new();
                let mut questions = Vec::new();
                let mut ok = true;
                for (i, q) in n.questions.iter().enumerate() {
                    let index = i.to_string();
                    if let Some(first) = seen.insert(q.id.as_str(), index.clone()) {
                        let first_at = src.doc.spans.value(&cx.at(&["questions", &first, "id"]));
                        let d = src
                            .diag(
                                Code::DuplicateName,
                                &cx.at(&["questions", &index, "id"]),
                                format!("two questions of the gate are named `{}`", q.id),
                            )
                            .label(src.path(), first_at, "the first is here");
                        cx.report(d);
                        ok = false;
                    }
                    let (asked, _) = question(
                        cx,
                        &["questions", &index],
                        Some(q.id.clone()),
                        q.message.as_deref(),
                        q.payload.clone(),
                        Some(&q.response),
                    );
                    match asked {
                        Some(a) => questions.push(a),
                        None => ok = false,
                    }
                }
                let ids: Vec<&str> = n.questions.iter().map(|q| q.id.as_str()).collect();
                ok.then(|| (KindConfig::new(Config { questions, inbox: None }), Shape::fields(&ids)))
            }
            (Some(_), false) => {
                let d = src
                    .diag_key(
                        Code::InterruptResponse,
                        &cx.at(&["questions"]),
                        "a gate has either one `response` or several `questions`, not both",
                    )
                    .help("move the gate's `response` (and its `message`) into a question");
                cx.report(d);
                None
            }
            (None, true) => {
                let d = src
                    .diag_key(
                        Code::MissingField,
                        &cx.at(&[]),
                        format!("missing field `response` in node `{}`", cx.node()),
                    )
                    .help(
                        "a gate says what an answer looks like with a `response` schema, or asks several `questions`",
                    );
                cx.report(d);
                None
            }
        }
    }

    fn is_gate(&self) -> bool {
        true
    }
}

/// Compiles a gate that speaks the agent-inbox shapes: one question (its `response`, if any,
/// taken besides the inbox answers), what it shows, what it allows.
fn compile_inbox(cx: &mut KindCx<'_, '_, '_>, n: InterruptNode, spec: inbox::InboxSpec) -> Option<(KindConfig, Shape)> {
    let src = cx.source();
    if !n.questions.is_empty() {
        let d = src
            .diag_key(
                Code::InterruptResponse,
                &cx.at(&["inbox"]),
                "an inbox gate asks one question, not several `questions`",
            )
            .help("make each question its own gate, or drop `inbox`");
        cx.report(d);
        return None;
    }
    let mut ok = true;
    for (i, a) in spec.allow.iter().enumerate() {
        if spec.allow[..i].contains(a) {
            let d = src.diag(
                Code::InterruptResponse,
                &cx.at(&["inbox", "allow", &i.to_string()]),
                "this answer is allowed twice",
            );
            cx.report(d);
            ok = false;
        }
    }
    if spec.allow.contains(&inbox::InboxAction::Edit) && spec.args.is_empty() {
        let d = src
            .diag_key(
                Code::InterruptResponse,
                &cx.at(&["inbox", "allow"]),
                "the gate allows `edit` but shows nothing to edit",
            )
            .help("give `inbox.args`, the values shown for editing, or drop `edit` from `allow`");
        cx.report(d);
        ok = false;
    }
    let args = cx.data(
        &["inbox", "args"],
        &Value::Object(spec.args.clone().into_iter().collect()),
        None,
    );
    let (asked, followed) = question(cx, &[], None, n.message.as_deref(), n.payload, n.response.as_ref());
    let shape = match (&n.response, Shape::of_schema(&followed)) {
        (None, _) => Shape::fields(&inbox::OUTPUT_FIELDS),
        (Some(_), Shape::Fields(mut fields)) => {
            for f in inbox::OUTPUT_FIELDS {
                if !fields.iter().any(|x| x == f) {
                    fields.push(f.to_string());
                }
            }
            Shape::Fields(fields)
        }
        (Some(_), other) => other,
    };
    let inbox = inbox::Inbox {
        action: spec.action.unwrap_or_else(|| cx.node().to_string()),
        allow: spec.allow,
        keys: spec.args.keys().cloned().collect(),
    };
    let mut asked = asked?;
    asked.response = inbox.answer_schema(n.response.is_some().then_some(&asked.response));
    (ok && args.is_some()).then(|| {
        (
            KindConfig::new(Config {
                questions: vec![asked],
                inbox: Some((inbox, args)),
            }),
            shape,
        )
    })
}

/// Compiles one question written at `path` (the gate itself when empty); returns it with its
/// response schema followed (`null` when it has none: an inbox gate's).
fn question(
    cx: &mut KindCx<'_, '_, '_>,
    path: &[&str],
    id: Option<String>,
    message: Option<&str>,
    payload: IndexMap<String, Value>,
    response: Option<&JsonSchemaDoc>,
) -> (Option<Asked>, Value) {
    let at = |field: &'static str| [path, &[field]].concat();
    let message = message.map(|text| cx.template(&at("message"), text));
    let payload = cx.data(&at("payload"), &Value::Object(payload.into_iter().collect()), None);
    let Some(response) = response else {
        let asked = (|| {
            Some(Asked {
                id,
                message: optional(message)?,
                payload: Some(payload?),
                response: Value::Null,
                shown_schema: None,
            })
        })();
        return (asked, Value::Null);
    };
    let response = cx.schema(&at("response"), &response.0);
    let followed = cx.followed(&response);
    if accepts_anything(&followed) {
        let d = cx
            .source()
            .diag(Code::InterruptResponse, &cx.at(&at("response")), "the gate's response schema accepts any answer")
            .help("declare what an answer looks like, e.g. {type: object, required: [action], properties: {action: {enum: [accept, edit, respond, ignore]}}}");
        cx.report(d);
    }
    let asked = (|| {
        Some(Asked {
            id,
            message: optional(message)?,
            payload: Some(payload?),
            shown_schema: Some(strip_internal(&response)),
            response,
        })
    })();
    (asked, followed)
}

impl NodeKind for Interrupt {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Ready(
            ctx.config::<Config>()
                .map_err(NodeFailure::from)
                .and_then(|c| run(ctx, c)),
        )
    }

    fn answer_schema<'p>(&self, node: &'p PlanNode, answered: usize) -> Option<&'p Value> {
        let config = node.config.get::<Config>()?;
        config.questions.get(answered).map(|q| &q.response)
    }
}

fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let answers: Vec<&Value> = ctx.answered.iter().chain(ctx.resume).collect();
    if answers.len() >= config.questions.len() {
        let output = match config.questions.as_slice() {
            [_] if config.inbox.is_some() => answers.first().map_or(Value::Null, |a| inbox::folded(a)),
            [only] if only.id.is_none() => answers.first().map_or(Value::Null, |a| (*a).clone()),
            questions => Value::Object(
                questions
                    .iter()
                    .zip(&answers)
                    .map(|(q, a)| (q.id.clone().unwrap_or_default(), (*a).clone()))
                    .collect(),
            ),
        };
        return Ok(NodeOutput {
            output,
            ..Default::default()
        });
    }
    let asked = &config.questions[answers.len()];
    let mut payload = Map::new();
    let message = render_opt(ctx, asked.message.as_ref(), "/message")?;
    if let Some(message) = &message {
        payload.insert("message".into(), Value::String(message.clone()));
    }
    if let Some(data) = data(ctx, asked.payload.as_ref(), "/payload", &ctx.scope)? {
        payload.insert("payload".into(), data);
    }
    if let Some(schema) = &asked.shown_schema {
        payload.insert("response_schema".into(), schema.clone());
    }
    if let Some((inbox, args)) = &config.inbox {
        let args = data(ctx, args.as_ref(), "/inbox/args", &ctx.scope)?.unwrap_or_else(|| Value::Object(Map::new()));
        payload.extend(inbox.shown(args, message.as_deref()));
    }
    if let Some(id) = &asked.id {
        payload.insert("question".into(), Value::String(id.clone()));
        payload.insert("questions_answered".into(), Value::from(answers.len()));
        payload.insert("questions".into(), Value::from(config.questions.len()));
    }
    Err(NodeFailure::Interrupt(Value::Object(payload)))
}

/// The response schema as shown to a person: without the attached `types`/`files` containers
/// unless it refers into them.
fn strip_internal(schema: &Value) -> Value {
    let text = schema.to_string();
    let mut s = schema.clone();
    if let Value::Object(m) = &mut s {
        if !text.contains("#/types/") {
            m.remove("types");
        }
        if !text.contains("#/files/") {
            m.remove("files");
        }
    }
    s
}

/// Whether a schema admits any value (it constrains nothing a gate's answer could break).
fn accepts_anything(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => *b,
        Value::Object(m) => ![
            "type",
            "properties",
            "required",
            "enum",
            "const",
            "anyOf",
            "oneOf",
            "allOf",
            "$ref",
            "items",
        ]
        .iter()
        .any(|k| m.contains_key(*k)),
        _ => true,
    }
}
