//! The `tools` kind (LangGraph's `ToolNode`): runs every tool call of the last assistant
//! message, in parallel up to `concurrency`, each against a tool the workflow declares under
//! `tools:`. Its `output` is the list of tool messages, in call order:
//! `{role: tool, tool_call_id, name, content, status: success | error}`. A call that fails
//! (unknown tool, arguments that do not fit the tool's schema, the tool's own error, its
//! timeout) becomes a message with status `error` for the model to read, unless
//! `on_tool_error: fail`.
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

use super::subgraph::child_thread_id;
use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, text_of, value};
use crate::compile::ExprId;
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape, Tool, ToolRun};
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
}

/// The `tools` kind.
pub(super) struct Tools;

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
                for (i, name) in names.iter().enumerate() {
                    match cx.tool(&["tools", &i.to_string()], name) {
                        Some(t) => {
                            tools.insert(name.clone(), t);
                        }
                        None => ok = false,
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
        let config = Config {
            from: from?,
            tools,
            concurrency: n.concurrency.unwrap_or(4).max(1) as usize,
            fail: n.on_tool_error == Some(OnToolError::Fail),
        };
        ok.then(|| (KindConfig::new(config), Shape::Any))
    }
}

impl NodeKind for Tools {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

/// One call of the message: its id, the tool's name and the arguments as the model wrote them.
struct Call {
    id: String,
    name: String,
    arguments: String,
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
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
    let pending: Vec<_> = calls.iter().map(|call| answer(ctx, config, call)).collect();
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

/// The tool message answering `call`, and what the call spent; an error only when a failed
/// call fails the node.
async fn answer(ctx: &NodeCtx<'_>, config: &Config, call: &Call) -> Result<(Value, Usage), NodeFailure> {
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
    let result = tracing::Instrument::instrument(call_tool(ctx, config, call), span.clone()).await;
    if let Err(e) = &result {
        span.record("error.type", e.class.name());
        span.record("otel.status_code", "ERROR");
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

async fn call_tool(ctx: &NodeCtx<'_>, config: &Config, call: &Call) -> Result<NodeOutput, NodeError> {
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
    let running = run_tool(ctx, tool, call, args);
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

async fn run_tool(ctx: &NodeCtx<'_>, tool: &Tool, call: &Call, args: Value) -> Result<NodeOutput, NodeFailure> {
    match &tool.run {
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
                    usage: outcome.usage,
                }),
                Status::Failed => Err(NodeError::invalid(format!(
                    "workflow `{}` failed: {}",
                    child.name(),
                    outcome.error.unwrap_or_default()
                ))
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
