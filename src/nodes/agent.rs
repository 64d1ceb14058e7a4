//! `agent`: a prebuilt ReAct loop (LangGraph's `create_react_agent`) as data. The node's
//! fields — model, tools, system prompt, `max_iterations`, an optional structured final
//! answer — are compiled into an ordinary child workflow, generated here and compiled like a
//! file beside this one (`<file>#<node>`):
//!
//! ```text
//! START -> model -(tool calls, rounds left)-> tools -> model
//!          model -(tool calls, no rounds left)-> give_up -> END
//!          model -(no tool calls)-> END, or answer (output.schema) -> END
//! ```
//!
//! where `model` is named after the agent node (so mock scripts and cassettes address its calls
//! by the agent's name) and `answer` asks for the structured answer.
//!
//! The loop runs as a subgraph does, on a child thread under this task: every model turn and
//! every round of tool calls is a superstep with its checkpoint, tokens and tool events stream
//! as the child's, a crash resumes inside the loop without running a finished round again, and
//! `runner graph` draws the loop as the node's cluster. The node's output is
//! `{messages, answer, iterations, exhausted}`: the messages the loop added (with the ids the
//! loop gave them, scoped to this task so no other turn has them: `add_messages` appends them to
//! the parent's history, and a client that saw a reply streamed finds it stored under the same
//! id), the final answer (the last reply's
//! text, or the value matching `output.schema`), the rounds of tool calls run, and whether
//! `max_iterations` cut the loop short (the model's last call is then replaced by a reply
//! saying so, as LangGraph does).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, render_opt, value};
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape, optional};
use crate::compile::{ExprId, TemplateId};
use crate::diag::Code;
use crate::engine::kind::{Attempt, NodeKind};
use crate::spec::{JsonSchemaDoc, TextSource};

/// The rounds of tool calls an agent runs unless told otherwise.
const DEFAULT_MAX_ITERATIONS: u32 = 10;

/// What the model's last call becomes when `max_iterations` rounds were run and it still
/// calls tools (LangGraph's wording).
const NEED_MORE_STEPS: &str = "Sorry, need more steps to process this request.";

/// A tool-calling agent: the model is called with the conversation and the tools, the tools it
/// calls are run, and their results sent back, until it answers without calls.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct AgentNode {
    /// A model profile name (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The tools the model is offered and the loop runs, by name (declared under `tools:`).
    #[schemars(length(min = 1))]
    pub tools: Vec<String>,
    /// The system prompt template, rendered once in this node's scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<TextSource>,
    /// A user message template, rendered in this node's scope and added after `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<TextSource>,
    /// Expression yielding the conversation the agent starts from (default `state.messages`
    /// when the workflow has that key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<String>,
    /// The most rounds of tool calls (default 10); the model is called at most one more time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_iterations: Option<u32>,
    /// A structured final answer: once the model stops calling tools, it is asked once more
    /// for a JSON value matching `schema`, which becomes `output.answer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<AgentOutput>,
    /// Tools whose calls wait for a person's review before they run (see the `tools` kind).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub review: Vec<String>,
    /// How many tool calls run at once (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub concurrency: Option<u32>,
    /// Stream the model's tokens to the event stream as they arrive.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Completion token cap of each model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// An agent's structured final answer.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AgentOutput {
    /// JSON Schema the final answer must match.
    pub schema: JsonSchemaDoc,
}

/// An `agent` node, compiled (its loop is the plan's child plan of the node).
struct Config {
    system: Option<TemplateId>,
    prompt: Option<TemplateId>,
    messages: Option<ExprId>,
}

/// The `agent` kind.
pub(super) struct Agent;

impl KindDecl for Agent {
    fn name(&self) -> &'static str {
        "agent"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<AgentNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let mut n: AgentNode = cx.own()?;
        let errors = cx.errors();
        let model = n.model.as_deref().unwrap_or("default");
        cx.model(&["model"], model, n.model.is_none());
        // The tools are compiled here, in this file, so their problems are reported at their
        // lines; the loop compiles them again only once they are known to be good. A name may
        // be an MCP server's entry: the loop gets every tool it imports.
        let mut ok = true;
        let mut tools: Vec<String> = Vec::new();
        for (i, written) in n.tools.iter().enumerate() {
            for name in cx.expand_tools(std::slice::from_ref(written)) {
                ok &= cx.tool(&["tools", &i.to_string()], &name).is_some();
                if !tools.contains(&name) {
                    tools.push(name);
                }
            }
        }
        n.tools = tools;
        for (i, name) in n.review.iter().enumerate() {
            if !n.tools.contains(name) {
                let d = cx
                    .source()
                    .diag(
                        Code::UnknownTool,
                        &cx.at(&["review", &i.to_string()]),
                        format!("`{name}` is not one of this agent's tools"),
                    )
                    .suggest(name, n.tools.iter().map(String::as_str))
                    .help_or("`review` names tools listed in `tools`");
                cx.report(d);
                ok = false;
            }
        }
        let system = n.system.as_ref().map(|s| cx.text_source("system", s));
        let prompt = n.prompt.as_ref().map(|s| cx.text_source("prompt", s));
        let messages = match &n.messages {
            Some(_) => Some(cx.expr("messages")),
            None if cx.workflow().state.contains_key("messages") => {
                let at = cx.at(&["kind"]);
                Some(cx.expr_at(&at, "state.messages"))
            }
            None => None,
        };
        if messages.is_none() && n.prompt.is_none() {
            let d = cx
                .source()
                .diag_key(
                    Code::MissingField,
                    &cx.at(&[]),
                    "an agent needs a conversation to start from: `prompt`, `messages`, or a `messages` state key",
                )
                .help("add `prompt: {text: ...}` or `messages: <expression>`");
            cx.report(d);
            ok = false;
        }
        if let Some(out) = &n.output {
            // Checked here, at its line; the loop's own copy refers to the same types and files.
            cx.schema(&["output", "schema"], &out.schema.0);
        }
        // The loop is generated only from fields found good here, so its own compilation
        // reports nothing a second time, at a place the author never wrote.
        if !ok || cx.errors() > errors {
            return None;
        }
        let doc = loop_workflow(cx, &n);
        let child = cx.generated_child(&doc);
        let config = Config {
            system: optional(system)?,
            prompt: optional(prompt)?,
            messages: optional(messages)?,
        };
        child?;
        Some((
            KindConfig::new(config),
            Shape::fields(&["messages", "answer", "iterations", "exhausted"]),
        ))
    }
}

/// The loop as a workflow document, with the sections of this file a tool or a model profile
/// may rely on copied in (models, types, imports, config, context, prompts, the tools used).
fn loop_workflow(cx: &KindCx<'_, '_, '_>, n: &AgentNode) -> Value {
    let src = cx.source();
    let written = &src.doc.value;
    let max = n.max_iterations.unwrap_or(DEFAULT_MAX_ITERATIONS);
    let mut doc = Map::new();
    doc.insert("name".into(), json!("agent"));
    for section in ["imports", "models", "types", "config", "context", "prompts"] {
        if let Some(v) = written.get(section) {
            doc.insert(section.into(), v.clone());
        }
    }
    // Each tool's entry: its own, or the MCP server's that imports it, importing only the
    // agent's tools of that server (the rest of the entry was checked in this file).
    let mut tools = Map::new();
    for name in &n.tools {
        let Some((entry, imported)) = cx.tool_entry(name) else {
            continue;
        };
        let Some(def) = written.get("tools").and_then(|t| t.get(&entry)) else {
            continue;
        };
        let def = tools.entry(entry).or_insert_with(|| match imported {
            Some(_) => {
                let mut def = def.clone();
                if let Some(fields) = def.as_object_mut() {
                    fields.insert("import".into(), json!([]));
                }
                def
            }
            None => def.clone(),
        });
        if let (Some(tool), Some(list)) = (imported, def.get_mut("import").and_then(Value::as_array_mut)) {
            list.push(json!(tool));
        }
    }
    doc.insert("tools".into(), Value::Object(tools));
    doc.insert(
        "input".into(),
        json!({"type": "object", "properties": {
            "messages": {"type": "array"},
            "system": {"type": "string"},
        }}),
    );
    doc.insert(
        "state".into(),
        json!({
            "messages": {"type": "array", "reducer": "add_messages", "default": [], "from_input": true},
            "iterations": {"type": "integer", "reducer": "sum", "default": 0},
            "answer": {"description": "the final answer"},
            "exhausted": {"type": "boolean", "default": false},
        }),
    );
    let mut llm = Map::new();
    llm.insert("kind".into(), json!("llm"));
    if let Some(m) = &n.model {
        llm.insert("model".into(), json!(m));
    }
    if n.system.is_some() {
        llm.insert("system".into(), json!({"text": "{{ input.system }}"}));
    }
    llm.insert("history".into(), json!({"from": "state.messages"}));
    if n.stream {
        llm.insert("stream".into(), json!(true));
    }
    if let Some(t) = n.temperature {
        llm.insert("temperature".into(), json!(t));
    }
    if let Some(t) = n.max_tokens {
        llm.insert("max_tokens".into(), json!(t));
    }
    // A fresh answer node asks for the structured answer with the same model and system prompt.
    let mut answer = llm.clone();
    llm.insert("tools".into(), json!(n.tools));
    llm.insert(
        "update".into(),
        json!({
            "messages": "[{'role': 'assistant', 'content': output.content, 'tool_calls': output.tool_calls}]",
            "answer": "output.content",
        }),
    );
    let done = if n.output.is_some() { "answer" } else { "END" };
    llm.insert(
        "goto".into(),
        json!([
            {"when": format!("output.tool_calls and state.iterations < {max}"), "to": "tools"},
            {"when": "output.tool_calls", "to": "give_up"},
            {"to": done},
        ]),
    );
    let mut tools_node = json!({
        "kind": "tools",
        "tools": n.tools,
        "update": {"messages": "output", "iterations": "1"},
    });
    if let Some(c) = n.concurrency {
        tools_node["concurrency"] = json!(c);
    }
    if !n.review.is_empty() {
        tools_node["review"] = json!(n.review);
    }
    // The model's node is named after the agent, so a mock script or a cassette addresses its
    // calls by the name the author wrote.
    let model = match cx.node() {
        "tools" | "give_up" | "answer" => "model".to_string(),
        name => name.to_string(),
    };
    let mut nodes = Map::new();
    nodes.insert(model.clone(), Value::Object(llm));
    nodes.insert("tools".into(), tools_node);
    nodes.insert(
        "give_up".into(),
        json!({"kind": "set", "update": {
            "messages": format!("[{{'id': (state.messages | last).id, 'role': 'assistant', 'content': {NEED_MORE_STEPS:?}}}]"),
            "exhausted": "true",
        }}),
    );
    let mut edges = vec![
        format!("START -> {model}"),
        format!("tools -> {model}"),
        "give_up -> END".to_string(),
    ];
    if let Some(out) = &n.output {
        answer.insert(
            "prompt".into(),
            json!({"text": "Give your final answer now, as one JSON value matching the schema."}),
        );
        answer.insert("output".into(), json!({"format": "json", "schema": out.schema.0}));
        answer.insert("update".into(), json!({"answer": "output"}));
        nodes.insert("answer".into(), Value::Object(answer));
        edges.push("answer -> END".to_string());
    }
    doc.insert("nodes".into(), Value::Object(nodes));
    doc.insert("edges".into(), json!(edges));
    // Two steps a round, the last model turn, the answer or the give-up, and one to spare.
    doc.insert("limits".into(), json!({"recursion_limit": 2 * max + 4}));
    Value::Object(doc)
}

impl NodeKind for Agent {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }

    fn held_by_budget(&self) -> bool {
        true
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let Some(child) = ctx.plan.subgraphs().get(&ctx.ix).cloned() else {
        return Err(NodeError::invalid("the agent's loop is missing from the plan").into());
    };
    let mut messages = match value(ctx, config.messages, "/messages")? {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => Vec::new(),
        Some(other) => {
            return Err(NodeError::invalid(format!("messages: expected a list of messages, got {other}")).into());
        }
    };
    if let Some(prompt) = render_opt(ctx, config.prompt.as_ref(), "/prompt")? {
        messages.push(json!({"role": "user", "content": prompt}));
    }
    let given = messages.len();
    let mut input = json!({"messages": messages});
    if let Some(system) = render_opt(ctx, config.system.as_ref(), "/system")? {
        input["system"] = Value::String(system);
    }
    let out = super::subgraph::run_child(ctx, child, input, false).await?;
    Ok(NodeOutput {
        output: agent_output(out.output, given),
        usage: out.usage,
    })
}

/// The loop's final state as the node's output: the messages after the `given` ones, with
/// their ids (the child run's are scoped to this task: see [`crate::engine::message_id`]).
fn agent_output(mut state: Value, given: usize) -> Value {
    let added: Vec<Value> = match state.get_mut("messages").map(Value::take) {
        Some(Value::Array(all)) => all.into_iter().skip(given).collect(),
        _ => Vec::new(),
    };
    json!({
        "messages": added,
        "answer": state.get("answer").cloned().unwrap_or(Value::Null),
        "iterations": state.get("iterations").cloned().unwrap_or(json!(0)),
        "exhausted": state.get("exhausted").cloned().unwrap_or(json!(false)),
    })
}
