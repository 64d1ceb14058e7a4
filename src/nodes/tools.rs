//! The `tools` kind (LangGraph's `ToolNode`): runs every tool call of the last assistant
//! message, in parallel up to `concurrency`, each against a tool the workflow declares under
//! `tools:`. Its `output` is the list of tool messages, in call order:
//! `{role: tool, tool_call_id, name, content, status: success | error}`. A call that fails
//! (unknown tool, arguments that do not fit the tool's schema, the tool's own error, its
//! timeout) becomes a message with status `error` for the model to read, unless
//! `on_tool_error: fail`.
//!
//! A tool of an MCP server is called through the kind's clients (`mcp.rs`): its arguments are
//! checked against the schema the server listed before anything is sent, and a result the
//! server flags `isError` is a message of status `error`.
//!
//! `review: [names]` stops before the calls of those tools for a person's decision, with the
//! shapes of LangChain's human-in-the-loop review (what agent-chat-ui shows and answers): one
//! interrupt for all the reviewed calls of the message, `{action_requests: [{name, args,
//! description}], review_configs: [{action_name, allowed_decisions}]}`, answered by
//! `{decisions: [...]}`, one per reviewed call in order: `{type: approve}`, `{type: edit,
//! edited_action: {name, args}}`, `{type: reject, message?}` or `{type: respond, message}`.
//! Agent Inbox's `HumanResponse` (`accept`, `edit`, `response`, `ignore`, or a list of one)
//! answers a message with one reviewed call. No call runs until every reviewed call is
//! decided, so a resumed node never runs one twice; an answer deciding more or fewer calls
//! than were asked about is refused before it is stored, the gate kept.
//!
//! The kind does not retry by default: each call's `run` node is retried by its own policy or
//! its kind's default (`NodeCtx::run_nested`), and what still fails is an answer the model can
//! act on (call again, call another tool, or give up); a node-level retry would repeat every
//! call of the message, the ones that worked included.

use std::sync::Arc;

use futures::StreamExt;
use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::mcp::McpClients;
use super::subgraph::child_thread_id;
use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, text_of, value};
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape, Tool, ToolRun};
use crate::compile::{ExprId, PlanNode};
use crate::diag::Code;
use crate::engine::events::{Event, PAYLOAD_LIMIT, bounded};
use crate::engine::kind::{Attempt, NodeKind};
use crate::engine::values::to_jinja;
use crate::engine::{Start, Status};
use crate::error_class::ErrorClass;
use crate::providers::{Message, Usage};

/// Runs the tool calls of the last assistant message. `output` is the list of tool messages.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct ToolsNode {
    /// The tools it may run, by name (default: every tool the workflow declares). A call of
    /// any other tool is answered with an error message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Expression yielding the message history (default `state.messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// How many calls run at once (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub concurrency: Option<u32>,
    /// What a failed call does: `message` (default) answers the model with a tool message of
    /// status `error`; `fail` fails the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_tool_error: Option<OnToolError>,
    /// Tools whose calls wait for a person's review before they run: accept, edit the
    /// arguments, respond instead (the message goes back to the model), or ignore.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub review: Vec<String>,
}

/// What a failed tool call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum OnToolError {
    Message,
    Fail,
}

/// A `tools` node, compiled.
struct Config {
    from: ExprId,
    tools: IndexMap<String, Arc<Tool>>,
    concurrency: usize,
    fail: bool,
    /// The tools whose calls are reviewed.
    review: Vec<String>,
    /// What an answer to a review must match.
    decision: Value,
}

/// The `tools` kind, with the clients of the MCP servers its calls have reached.
#[derive(Default)]
pub(super) struct Tools {
    mcp: super::mcp::McpClients,
}

impl KindDecl for Tools {
    fn name(&self) -> &'static str {
        "tools"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<ToolsNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: ToolsNode = cx.own()?;
        let from = match &n.from {
            Some(_) => cx.expr("from"),
            None => {
                let at = cx.at(&["kind"]);
                cx.expr_at(&at, "state.messages")
            }
        };
        let mut tools = IndexMap::new();
        let mut ok = true;
        match &n.tools {
            Some(names) => {
                // A name may be an MCP server's entry: all the tools it imports.
                for (i, written) in names.iter().enumerate() {
                    for name in cx.expand_tools(std::slice::from_ref(written)) {
                        match cx.tool(&["tools", &i.to_string()], &name) {
                            Some(t) => {
                                tools.insert(name, t);
                            }
                            None => ok = false,
                        }
                    }
                }
            }
            None => {
                for name in cx.tool_names() {
                    match cx.tool(&["kind"], &name) {
                        Some(t) => {
                            tools.insert(name, t);
                        }
                        None => ok = false,
                    }
                }
            }
        }
        for (i, name) in n.review.iter().enumerate() {
            if !tools.contains_key(name) && ok {
                let d = cx
                    .source()
                    .diag(
                        Code::UnknownTool,
                        &cx.at(&["review", &i.to_string()]),
                        format!("`{name}` is not one of the tools this node runs"),
                    )
                    .suggest(name, tools.keys().map(String::as_str))
                    .help_or("`review` names tools the node runs");
                cx.report(d);
                ok = false;
            }
        }
        let config = Config {
            from: from?,
            tools,
            concurrency: n.concurrency.unwrap_or(4).max(1) as usize,
            fail: n.on_tool_error == Some(OnToolError::Fail),
            review: n.review,
            decision: decision_schema(),
        };
        ok.then(|| (KindConfig::new(config), Shape::Any))
    }
}

impl NodeKind for Tools {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(
            async move { run(ctx, &self.mcp, ctx.config::<Config>()?).await },
        ))
    }

    fn answer_schema<'p>(&self, node: &'p PlanNode, _answered: usize) -> Option<&'p Value> {
        let config = node.config.get::<Config>()?;
        (!config.review.is_empty()).then_some(&config.decision)
    }

    /// An answer must decide each call the review asked about: one that decides more or
    /// fewer would fail the node once stored, and every resume after it.
    fn refuse_answer(&self, _node: &PlanNode, payload: &Value, answer: &Value) -> Option<String> {
        let asked = payload.get("action_requests")?.as_array()?.len();
        decisions(answer, asked).err().map(|e| e.message)
    }
}

/// What a review may be answered with: `{decisions: [...]}`, one decision per reviewed call
/// (LangChain's human-in-the-loop review), or, for a single reviewed call, Agent Inbox's
/// `HumanResponse` (or a list of one).
fn decision_schema() -> Value {
    let decision = json!({
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"enum": DECISIONS},
            "message": {"type": "string"},
        },
        "allOf": [
            {"if": {"properties": {"type": {"const": "edit"}}},
             "then": {"required": ["edited_action"], "properties": {"edited_action": {
                 "type": "object", "required": ["args"],
                 "properties": {"name": {"type": "string"}, "args": {"type": "object"}},
             }}}},
            {"if": {"properties": {"type": {"const": "respond"}}}, "then": {"required": ["message"]}},
        ],
    });
    let inbox = json!({
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"enum": ["accept", "edit", "response", "ignore"]},
            "args": {},
        },
        "allOf": [
            {"if": {"properties": {"type": {"const": "edit"}}},
             "then": {"required": ["args"], "properties": {"args": {
                 "type": "object", "required": ["args"],
                 "properties": {"action": {"type": "string"}, "args": {"type": "object"}},
             }}}},
            {"if": {"properties": {"type": {"const": "response"}}},
             "then": {"required": ["args"], "properties": {"args": {"type": "string"}}}},
        ],
    });
    json!({"anyOf": [
        {"type": "object", "required": ["decisions"],
         "properties": {"decisions": {"type": "array", "minItems": 1, "items": decision}}},
        inbox,
        {"type": "array", "minItems": 1, "maxItems": 1, "items": inbox},
    ]})
}

/// The decisions a reviewer may make on a call, as LangChain's review names them.
const DECISIONS: [&str; 4] = ["approve", "edit", "reject", "respond"];

/// A reviewer's decision on one call.
enum Decision {
    Approve,
    /// Run the call with these arguments instead.
    Edit(Value),
    /// Do not run it; the reason, if one was given.
    Reject(Option<String>),
    /// Do not run it; this text answers the model as the tool's result.
    Respond(String),
}

/// The decisions an answer makes on `count` reviewed calls, in call order.
fn decisions(answer: &Value, count: usize) -> Result<Vec<Decision>, NodeError> {
    let text = |v: &Value| v.as_str().map(str::to_string);
    let listed = match answer.get("decisions").and_then(Value::as_array) {
        Some(list) => list
            .iter()
            .map(|d| match d["type"].as_str() {
                Some("edit") => Decision::Edit(d["edited_action"]["args"].clone()),
                Some("reject") => Decision::Reject(text(&d["message"])),
                Some("respond") => Decision::Respond(text(&d["message"]).unwrap_or_default()),
                _ => Decision::Approve,
            })
            .collect(),
        // Agent Inbox's HumanResponse, alone or in a list of one.
        None => {
            let one = match answer {
                Value::Array(one) => one.first().unwrap_or(answer),
                _ => answer,
            };
            vec![match one["type"].as_str() {
                Some("edit") => Decision::Edit(one["args"]["args"].clone()),
                Some("response") => Decision::Respond(text_of(&one["args"])),
                Some("ignore") => Decision::Reject(None),
                _ => Decision::Approve,
            }]
        }
    };
    if listed.len() != count {
        return Err(NodeError::invalid(format!(
            "the review has {count} call{} to decide, and the answer decides {}",
            if count == 1 { "" } else { "s" },
            listed.len()
        )));
    }
    Ok(listed)
}

/// One call of the message: its id, the tool's name and the arguments as the model wrote them.
#[derive(Clone)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

async fn run(ctx: &NodeCtx<'_>, mcp: &McpClients, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let messages = match value(ctx, Some(config.from), "/from")? {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => Vec::new(),
        Some(other) => {
            return Err(NodeError::invalid(format!("from: expected a list of messages, got {other}")).into());
        }
    };
    let calls: Vec<Call> = messages
        .iter()
        .map(Message::from_value)
        .rfind(|m| m.role == "assistant")
        .map(|m| m.tool_calls.iter().map(call_of).collect())
        .unwrap_or_default();
    let reviewed: Vec<&Call> = calls.iter().filter(|c| config.review.contains(&c.name)).collect();
    let decided_now: Vec<(&str, Decision)> = match ctx.resume {
        _ if reviewed.is_empty() => Vec::new(),
        None => return Err(NodeFailure::Interrupt(review_request(&reviewed))),
        Some(answer) => reviewed
            .iter()
            .map(|c| c.id.as_str())
            .zip(decisions(answer, reviewed.len())?)
            .collect(),
    };
    let pending: Vec<_> = calls
        .iter()
        .map(|call| {
            let decision = decided_now.iter().find(|(id, _)| *id == call.id).map(|d| &d.1);
            decided(ctx, mcp, config, call, decision)
        })
        .collect();
    let results: Vec<Result<(Value, Usage), NodeFailure>> = futures::stream::iter(pending)
        .buffered(config.concurrency)
        .collect()
        .await;
    let mut usage = Usage::default();
    let mut out = Vec::with_capacity(results.len());
    for r in results {
        let (message, spent) = r?;
        usage.add(&spent);
        out.push(message);
    }
    Ok(NodeOutput {
        output: Value::Array(out),
        usage,
    })
}

fn call_of(call: &Value) -> Call {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Call {
        id: text(&call["id"]),
        name: text(&call["function"]["name"]),
        arguments: text(&call["function"]["arguments"]),
    }
}

/// What a person reviewing the calls is shown: LangChain's review request, one action request
/// and one review configuration per call.
fn review_request(reviewed: &[&Call]) -> Value {
    let requests: Vec<Value> = reviewed
        .iter()
        .map(|call| {
            let args =
                serde_json::from_str::<Value>(&call.arguments).unwrap_or_else(|_| Value::String(call.arguments.clone()));
            json!({
                "name": call.name,
                "args": args,
                "description": format!("The model calls `{}` with {}. Approve it, edit its arguments, reject it, or answer in its place.", call.name, args),
            })
        })
        .collect();
    let configs: Vec<Value> = reviewed
        .iter()
        .map(|call| json!({"action_name": call.name, "allowed_decisions": DECISIONS}))
        .collect();
    json!({"action_requests": requests, "review_configs": configs})
}

/// The tool message answering `call` as the person reviewing it decided (no decision: the
/// call is not reviewed).
async fn decided(
    ctx: &NodeCtx<'_>,
    mcp: &McpClients,
    config: &Config,
    call: &Call,
    decision: Option<&Decision>,
) -> Result<(Value, Usage), NodeFailure> {
    let reply = |content: String, status: &str| {
        let message = json!({
            "role": "tool",
            "tool_call_id": call.id,
            "name": call.name,
            "content": content,
            "status": status,
        });
        Ok((message, Usage::default()))
    };
    match decision {
        None | Some(Decision::Approve) => answer(ctx, mcp, config, call).await,
        Some(Decision::Edit(args)) => {
            let edited = Call {
                arguments: args.to_string(),
                ..call.clone()
            };
            let (mut message, usage) = answer(ctx, mcp, config, &edited).await?;
            // The model's own message still shows the call it made: its result says that a
            // person changed the call, so that the model does not make it again.
            if let Some(Value::String(text)) = message.get_mut("content") {
                *text = format!(
                    "A person reviewing your call changed it before it ran, on purpose: `{}` ran with {} \
                     instead of the arguments you gave. Do not call it again with yours.\n\nTool response:\n{text}",
                    call.name, edited.arguments
                );
            }
            Ok((message, usage))
        }
        Some(Decision::Respond(text)) => reply(text.clone(), "success"),
        Some(Decision::Reject(why)) => {
            let content = match why {
                Some(why) => format!("The person reviewing this call of `{}` rejected it: {why}", call.name),
                None => format!("The person reviewing this call of `{}` chose not to run it.", call.name),
            };
            let (mut message, usage) = reply(content, "error")?;
            // As LangChain's review marks the message, for clients that show decisions.
            message["additional_kwargs"] = json!({
                "lc_source": "hitl_interrupt_decision",
                "lc_data": {"decision": "reject"},
            });
            Ok((message, usage))
        }
    }
}

/// The tool message answering `call`, and what the call spent; an error only when a failed
/// call fails the node.
async fn answer(
    ctx: &NodeCtx<'_>,
    mcp: &McpClients,
    config: &Config,
    call: &Call,
) -> Result<(Value, Usage), NodeFailure> {
    let message = |content: String, status: &str| {
        json!({
            "role": "tool",
            "tool_call_id": call.id,
            "name": call.name,
            "content": content,
            "status": status,
        })
    };
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
        "error.type" = tracing::field::Empty,
    );
    if !span.is_disabled() {
        span.record("otel.name", format!("execute_tool {}", call.name));
    }
    let on = ctx.events.is_on();
    if on {
        let args =
            serde_json::from_str::<Value>(&call.arguments).unwrap_or_else(|_| Value::String(call.arguments.clone()));
        ctx.events.send(Event::ToolStart {
            node: ctx.node.name.clone(),
            task_id: ctx.task_id.to_string(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            args: bounded(&crate::secrets::scrub_value(args), PAYLOAD_LIMIT).0,
        });
    }
    let started = std::time::Instant::now();
    let result = tracing::Instrument::instrument(call_tool(ctx, mcp, config, call), span.clone()).await;
    if let Err(e) = &result {
        span.record("error.type", e.class.name());
        span.record("otel.status_code", "ERROR");
    }
    if on {
        let (result, error) = match &result {
            // Scrubbed of known secrets, as every node output is before the engine sees it.
            Ok(out) => (
                bounded(&crate::secrets::scrub_value(out.output.clone()), PAYLOAD_LIMIT).0,
                None,
            ),
            Err(e) => (Value::Null, Some(crate::secrets::scrub_string(e.message.clone()))),
        };
        ctx.events.send(Event::ToolEnd {
            node: ctx.node.name.clone(),
            task_id: ctx.task_id.to_string(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            result,
            error,
        });
    }
    match result {
        Ok(out) => Ok((message(text_of(&out.output), "success"), out.usage)),
        Err(e) if config.fail => Err(NodeError {
            message: format!("tool `{}` (call {}): {}", call.name, call.id, e.message),
            ..e
        }
        .into()),
        Err(e) => Ok((message(format!("Error: {}", e.message), "error"), e.usage)),
    }
}

async fn call_tool(ctx: &NodeCtx<'_>, mcp: &McpClients, config: &Config, call: &Call) -> Result<NodeOutput, NodeError> {
    let Some(tool) = config.tools.get(&call.name) else {
        let names: Vec<&str> = config.tools.keys().map(String::as_str).collect();
        return Err(NodeError::invalid(format!(
            "there is no tool `{}`; the tools are: {}",
            call.name,
            names.join(", ")
        )));
    };
    let args: Value = match call.arguments.trim() {
        "" => json!({}),
        text => {
            serde_json::from_str(text).map_err(|e| NodeError::invalid(format!("the arguments are not JSON: {e}")))?
        }
    };
    check_args(&tool.args, &args)?;
    let running = run_tool(ctx, mcp, tool, call, args);
    let result = match tool.timeout {
        Some(limit) => match tokio::time::timeout(limit, running).await {
            Ok(r) => r,
            Err(_) => {
                Err(NodeError::new(ErrorClass::Timeout, format!("the call did not finish within {limit:?}")).into())
            }
        },
        None => running.await,
    };
    result.map_err(|f| match f {
        NodeFailure::Error(e) => e,
        NodeFailure::Interrupt(_) | NodeFailure::Handoff(_) => {
            NodeError::invalid("the tool stopped for a person's answer or handed off, which a tool call cannot do")
        }
    })
}

/// Checks the arguments against the tool's schema, every violation named by its path.
fn check_args(schema: &Value, args: &Value) -> Result<(), NodeError> {
    let validator = jsonschema::draft202012::new(schema)
        .map_err(|e| NodeError::invalid(format!("the tool's argument schema does not compile: {e}")))?;
    let problems: Vec<String> = validator
        .iter_errors(args)
        .map(|e| {
            let path = e.instance_path().to_string();
            match path.as_str() {
                "" => e.to_string(),
                _ => format!("{path}: {e}"),
            }
        })
        .collect();
    match problems.is_empty() {
        true => Ok(()),
        false => Err(NodeError::invalid(format!(
            "the arguments do not fit the tool's schema: {}",
            problems.join("; ")
        ))),
    }
}

async fn run_tool(
    ctx: &NodeCtx<'_>,
    mcp: &McpClients,
    tool: &Tool,
    call: &Call,
    args: Value,
) -> Result<NodeOutput, NodeFailure> {
    match &tool.run {
        ToolRun::Mcp { server, tool: name } => Ok(mcp.call_with(ctx.services, server, name, args).await?),
        ToolRun::Node(node) => ctx.run_nested(node, vec![("args".into(), to_jinja(&args))]).await,
        ToolRun::Workflow(child) => {
            // One child thread per call, so parallel calls of one tool do not share a thread.
            let thread = format!("{}/{}", child_thread_id(ctx.thread_id, ctx.step, ctx.task_id), call.id);
            let engine = ctx.child_engine(child.clone());
            let start = Start {
                thread_id: Some(thread),
                workflow: child.path().display().to_string(),
                input: Some(args),
                context: None,
                config: Vec::new(),
            };
            let outcome = engine
                .start_or_continue(start, None)
                .await
                .map_err(|e| NodeError::invalid(format!("workflow `{}`: {e}", child.name())))?;
            match outcome.status {
                Status::Done => Ok(NodeOutput {
                    output: outcome.output,
                    usage: outcome.unreported_usage,
                }),
                Status::Failed => Err(NodeError::invalid(format!(
                    "workflow `{}` failed: {}",
                    child.name(),
                    outcome.error.unwrap_or_default()
                ))
                .spent(outcome.unreported_usage)
                .into()),
                Status::Interrupted => Err(NodeError::invalid(format!(
                    "workflow `{}` stopped for a person's answer, which a tool call cannot wait for",
                    child.name()
                ))
                .into()),
                Status::Cancelled => {
                    Err(NodeError::invalid(format!("workflow `{}` was cancelled", child.name())).into())
                }
            }
        }
    }
}
