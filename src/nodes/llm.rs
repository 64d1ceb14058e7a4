//! `llm`: render the prompts, send them (with a window of chat history) to the node's model,
//! and return text or JSON. JSON replies are validated against the node's schema; a reply that
//! does not parse or match is sent back with the error, up to `repair` times. Streamed tokens
//! go to the event stream; usage is priced from the model profile. A reply that calls tools
//! (the profile's or node's `options.tools`) is `{content, tool_calls}`.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, render};
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape, optional};
use crate::compile::{ExprId, TemplateId};
use crate::diag::Code;
use crate::engine::events::Event;
use crate::engine::kind::{Attempt, NodeKind};
use crate::engine::values;
use crate::error_class::ErrorClass;
use crate::providers::{ChatRequest, Message, Usage};
use crate::spec::{JsonSchemaDoc, TextSource};

mod cut;
mod fit;
use fit::Fit;

/// What an llm node produces.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum LlmOutput {
    /// `text` or `json` (json without a schema).
    Format(OutputFormat),
    /// The format with a schema and repair policy.
    Spec {
        /// `text` or `json`.
        format: OutputFormat,
        /// JSON Schema the reply must match (json only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<JsonSchemaDoc>,
        /// How often a reply that fails the schema is sent back with the error (default 2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repair: Option<u32>,
    },
}

/// Output format of an llm node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum OutputFormat {
    /// Plain text: `output` is a string.
    Text,
    /// A JSON value: `output` is the parsed value.
    Json,
}

/// Chat history for an llm node.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct History {
    /// Expression yielding the messages (e.g. `state.messages`).
    pub from: String,
    /// Keep only the last N messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<u32>,
    /// Keep only as many recent messages as fit this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// Calls a model.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct LlmNode {
    /// A model profile name (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The user prompt template. A node with a `history` may have none: it then sends the
    /// history as it is (an agent's model turn after tool results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<TextSource>,
    /// The system prompt template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<TextSource>,
    /// Prior conversation sent before the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<History>,
    /// `text` (default) or `json`, optionally with a schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<LlmOutput>,
    /// Stream tokens to the event stream as they arrive.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Completion token cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Sampling seed, where the provider supports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Extra request fields passed to the provider unchanged.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub options: IndexMap<String, Value>,
    /// Tools the workflow declares (under `tools:`) that the model is offered, by name: sent
    /// as `options.tools`, each with its description and argument schema.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// How the prompt is trimmed when it would not fit the model's context window (the
    /// profile's `context`, or the window a context-overflow reply names): variables cut to a
    /// size, oldest history dropped; the system prompt and the prompt are always kept. Without
    /// it, only the oldest history is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<Fit>,
}

/// A completion cap (the node's `max_tokens`, else its profile's) must leave room for a prompt
/// in the profile's `context`.
fn check_room(cx: &mut KindCx<'_, '_, '_>, n: &LlmNode, model: &str) {
    let Some(profile) = cx.workflow().models.get(model) else {
        return;
    };
    let (Some(context), Some(cap)) = (profile.context, n.max_tokens.or(profile.max_tokens)) else {
        return;
    };
    if cap < context {
        return;
    }
    let at = if n.max_tokens.is_some() {
        cx.at(&["max_tokens"])
    } else {
        cx.at(&["model"])
    };
    let d = cx
        .source()
        .diag(
            crate::diag::Code::NoRoomForPrompt,
            &at,
            format!("`max_tokens` {cap} leaves no room for a prompt in model profile `{model}`'s context of {context} tokens"),
        )
        .help("lower `max_tokens` well below the context (a quarter of it is a common choice), or use a model with a larger window");
    cx.report(d);
}

/// The most of an invalid reply a schema-repair call sends back, in estimated tokens.
const REPAIR_ECHO_TOKENS: u64 = 256;

/// An `llm` node, compiled.
struct Config {
    n: LlmNode,
    prompt: Option<TemplateId>,
    system: Option<TemplateId>,
    history: Option<ExprId>,
    /// The output schema, resolved (self-contained).
    schema: Option<Value>,
    /// The node is offered tools (its own `tools`, or its or its profile's `options.tools`).
    tools: bool,
    /// The declared tools it offers, in OpenAI's function shape.
    offered: Vec<Value>,
    /// `fit.truncate`: each variable's path (its root variable first) and its size in tokens.
    truncate: Vec<(Vec<String>, u32)>,
}

/// The `llm` kind.
pub(super) struct Llm;

impl KindDecl for Llm {
    fn retries_by_default(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "llm"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<LlmNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: LlmNode = cx.own()?;
        let prompt = n.prompt.as_ref().map(|source| cx.text_source("prompt", source));
        if n.prompt.is_none() && n.history.is_none() {
            let d = cx
                .source()
                .diag_key(
                    Code::MissingField,
                    &cx.at(&[]),
                    "an llm node needs a `prompt`, a `history`, or both",
                )
                .help("add `prompt: {text: ...}` or `history: {from: state.messages}`");
            cx.report(d);
        }
        let system = n.system.as_ref().map(|source| cx.text_source("system", source));
        let history = n.history.as_ref().map(|h| {
            let at = cx.at(&["history", "from"]);
            cx.expr_at(&at, &h.from)
        });
        let model = n.model.as_deref().unwrap_or("default");
        cx.model(&["model"], model, n.model.is_none());
        check_room(cx, &n, model);
        let mut offered = Vec::new();
        let mut offered_ok = true;
        // A name may be an MCP server's entry: all the tools it imports.
        for (i, written) in n.tools.iter().enumerate() {
            for name in cx.expand_tools(std::slice::from_ref(written)) {
                match cx.tool(&["tools", &i.to_string()], &name) {
                    Some(tool) => offered.push(tool.function()),
                    None => offered_ok = false,
                }
            }
        }
        // A node offered tools may answer with calls: `{content, tool_calls}`.
        let tools = !n.tools.is_empty()
            || n.options.contains_key("tools")
            || cx
                .workflow()
                .models
                .get(model)
                .is_some_and(|m| m.options.contains_key("tools"));
        let mut schema = None;
        let text = matches!(
            &n.output,
            None | Some(LlmOutput::Format(OutputFormat::Text))
                | Some(LlmOutput::Spec {
                    format: OutputFormat::Text,
                    ..
                })
        );
        let shape = match &n.output {
            // A text node offered tools always answers `{content, tool_calls}` (no calls: an
            // empty list), so a loop can route on `output.tool_calls`.
            _ if tools && text => Shape::fields(&["content", "tool_calls"]),
            _ if tools => Shape::Any,
            None | Some(LlmOutput::Format(OutputFormat::Text)) => Shape::Text,
            Some(LlmOutput::Format(OutputFormat::Json)) => Shape::Any,
            Some(LlmOutput::Spec {
                format: OutputFormat::Text,
                ..
            }) => Shape::Text,
            Some(LlmOutput::Spec { schema: None, .. }) => Shape::Any,
            Some(LlmOutput::Spec { schema: Some(s), .. }) => {
                let root = cx.schema(&["output", "schema"], &s.0);
                let shape = Shape::of_schema(&cx.followed(&root));
                schema = Some(root);
                shape
            }
        };
        let mut truncate = Vec::new();
        let mut truncate_ok = true;
        for (path, tokens) in n.fit.iter().flat_map(|f| &f.truncate) {
            let at = cx.at(&["fit", "truncate", path]);
            if !fit::is_path(path) {
                let d = cx
                    .source()
                    .diag_key(
                        crate::diag::Code::InvalidValue,
                        &at,
                        format!("`{path}` is not a variable path"),
                    )
                    .help("name a variable the templates read, as identifiers joined by dots, e.g. `state.drafts`");
                cx.report(d);
                truncate_ok = false;
                continue;
            }
            // Compiled only to check that it names something the node can read.
            truncate_ok &= cx.expr_at(&at, path).is_some();
            truncate.push((path.split('.').map(str::to_string).collect(), *tokens));
        }
        let config = Config {
            truncate,
            prompt: optional(prompt)?,
            system: optional(system)?,
            history: optional(history)?,
            schema,
            tools,
            offered,
            n,
        };
        (offered_ok && truncate_ok).then(|| (KindConfig::new(config), shape))
    }
}

impl NodeKind for Llm {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }

    fn held_by_budget(&self) -> bool {
        true
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let spec = &config.n;
    let profile_name = spec.model.as_deref().unwrap_or("default");
    let (provider, profile) = ctx.services.providers.get(profile_name).ok_or_else(|| {
        NodeError::new(
            ErrorClass::BadRequest,
            format!("no provider is set up for model profile `{profile_name}`"),
        )
    })?;
    // Room kept for the reply when the prompt is trimmed: the completion cap, at most half
    // the window; the cap sent is lowered before each call so prompt and reply fit.
    let cap = spec.max_tokens.or(profile.max_tokens).map(u64::from);
    let mut window = profile.context.map(u64::from);
    let target = window.map(|w| w.saturating_sub(cap.map_or(0, |c| fit::reply_room(c, w))));
    let messages = compose(ctx, config, target, 1)?;
    let (json, schema, repairs) = match &spec.output {
        None | Some(LlmOutput::Format(OutputFormat::Text)) => (false, None, 0),
        Some(LlmOutput::Format(OutputFormat::Json)) => (true, None, 2),
        Some(LlmOutput::Spec { format, repair, .. }) => (
            *format == OutputFormat::Json,
            config.schema.clone(),
            repair.unwrap_or(2),
        ),
    };
    let validator = match &schema {
        Some(schema) => Some(
            ctx.validator(schema)
                .map_err(|e| NodeError::invalid(format!("output: {}", e.message)))?,
        ),
        None => None,
    };
    let mut request = ChatRequest {
        node: ctx.node.name.clone(),
        model: profile.model.clone(),
        messages,
        temperature: spec.temperature.or(profile.temperature),
        max_tokens: spec.max_tokens.or(profile.max_tokens),
        stop: spec.stop.clone(),
        seed: spec.seed,
        json_schema: schema.clone(),
        options: profile
            .options
            .iter()
            .chain(spec.options.iter())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        stream: spec.stream,
    };
    if !config.offered.is_empty() {
        // Declared tools come after any written by hand in `options.tools`.
        let mut all = match request.options.remove("tools") {
            Some(Value::Array(given)) => given,
            _ => Vec::new(),
        };
        all.extend(config.offered.iter().cloned());
        request.options.insert("tools".into(), Value::Array(all));
    }
    let mut usage = Usage::default();
    let node = ctx.node.name.clone();
    let task = ctx.task_id.to_string();
    let message_id = crate::engine::message_id(ctx.task_id);
    let events = ctx.events.clone();
    // Streamed tokens are events like any other: no known secret may pass, even split
    // across two tokens.
    let scrubber = crate::secrets::StreamScrubber::new();
    let send = move |text: String| {
        if !text.is_empty() {
            events.send(Event::Token {
                node: node.clone(),
                task_id: task.clone(),
                message_id: message_id.clone(),
                text,
            });
        }
    };
    let sink = |text: &str| send(scrubber.push(text));
    let mut attempt = 0;
    // A reply cut at the completion cap is asked for again, shorter, once.
    let mut asked_shorter = false;
    let mut refitted = false;
    let mut lowered_to = None;
    loop {
        if let (Some(cap), Some(window)) = (cap, window) {
            let prompt = fit::estimate(&request.messages);
            let sent = fit::reply_cap(cap, window, prompt);
            if sent < cap && lowered_to != Some(sent) {
                lowered_to = Some(sent);
                ctx.events.send(Event::Custom {
                    node: ctx.node.name.clone(),
                    event: "max_tokens_lowered".into(),
                    // The name in the payload too: a client of `runner serve` gets the payload alone.
                    data: serde_json::json!({
                        "event": "max_tokens_lowered",
                        "max_tokens": cap, "sent": sent, "context": window, "prompt_estimate": prompt,
                    }),
                });
            }
            request.max_tokens = u32::try_from(sent).ok().or(request.max_tokens);
        }
        let tokens = if spec.stream && ctx.events.is_on() {
            Some(&sink as &(dyn Fn(&str) + Send + Sync))
        } else {
            None
        };
        let reply = ctx
            .chat(&*provider, profile_name, profile, request.clone(), tokens)
            .await;
        if tokens.is_some() {
            send(scrubber.finish());
        }
        let reply = match reply {
            Err(crate::providers::ProviderError::ContextLength(why)) if !refitted => {
                // The server knows the window better than the estimate: trim harder, once.
                refitted = true;
                usage.calls += 1;
                let sent = fit::estimate(&request.messages);
                // The server's window, when it names one, is the one the cap is fitted to.
                window = fit::overflow_numbers(&why).1.or(window);
                let target = harder_target(&why, sent, cap);
                let messages = compose(ctx, config, Some(target), 2).map_err(|e| e.spent(usage))?;
                if fit::estimate(&messages) < sent {
                    request.messages = messages;
                    attempt = 0;
                    continue;
                }
                Err(crate::providers::ProviderError::ContextLength(format!(
                    "{why} (nothing left to trim: declare `fit.truncate` for the variables that may be cut)"
                )))
            }
            other => other,
        };
        let reply = reply.map_err(|e| {
            let retry_after = match &e {
                crate::providers::ProviderError::RateLimited { retry_after } => *retry_after,
                _ => None,
            };
            // A failed call is still a call (its tokens, if any, are unknown).
            let mut spent = usage;
            spent.calls += 1;
            NodeError {
                retry_after,
                ..NodeError::new(e.class(), e.to_string())
            }
            .spent(spent)
        })?;
        // Priced, and counted as a call, by `NodeCtx::chat`.
        usage.add(&reply.usage);
        // A reply that calls tools is for the workflow to act on, whatever the format; a text
        // node offered tools answers in that shape even without calls.
        if !reply.tool_calls.is_empty() || (config.tools && !json) {
            return Ok(NodeOutput {
                output: serde_json::json!({"content": reply.text, "tool_calls": reply.tool_calls}),
                usage,
            });
        }
        if !json {
            return Ok(NodeOutput {
                output: Value::String(reply.text),
                usage,
            });
        }
        let valid = |v: &Value| validator.is_none_or(|val| crate::compile::schemas::first_violation(val, v).is_none());
        let problem = match parse_json(&reply.text) {
            Ok(v) => match validator.and_then(|val| crate::compile::schemas::first_violation(val, &v)) {
                None => return Ok(NodeOutput { output: v, usage }),
                Some(why) => why,
            },
            Err(e) => format!("the reply is not JSON: {e}"),
        };
        if reply.hit_cap() {
            // Sending it back as it was would get the same reply, cut at the same place.
            let cap = request
                .max_tokens
                .map(u64::from)
                .or(Some(reply.usage.completion_tokens).filter(|t| *t > 0));
            let closed = cut::closings(&reply.text)
                .iter()
                .filter_map(|t| serde_json::from_str::<Value>(t).ok())
                .find(|v| valid(v));
            let action = if closed.is_some() {
                "closed"
            } else if !asked_shorter && attempt < repairs {
                "asked_shorter"
            } else {
                "failed"
            };
            ctx.events.send(Event::Custom {
                node: ctx.node.name.clone(),
                event: "reply_cut".into(),
                // The name in the payload too: a client of `runner serve` gets the payload alone.
                data: serde_json::json!({"event": "reply_cut", "max_tokens": cap, "action": action}),
            });
            if let Some(v) = closed {
                return Ok(NodeOutput { output: v, usage });
            }
            let at = match cap {
                Some(n) => format!("at its {n}-token cap (`max_tokens`)"),
                None => "at the server's length limit".to_string(),
            };
            if action == "failed" {
                let again = if asked_shorter {
                    ", and so was the shorter reply asked for"
                } else {
                    ""
                };
                return Err(NodeError::invalid(format!(
                    "the model's reply was cut {at} before its JSON was complete{again}: raise `max_tokens`, or ask for less in the prompt or the output schema"
                ))
                .spent(usage)
                .into());
            }
            asked_shorter = true;
            attempt += 1;
            let limit = cap.map_or_else(|| "the length limit".to_string(), |n| format!("{n} tokens"));
            request.messages.push(Message::new(
                "assistant",
                fit::cut_text(&reply.text, REPAIR_ECHO_TOKENS),
            ));
            request.messages.push(Message::new("user", format!(
                "Your reply (its start is shown above) was cut off at {limit}, the most you may write, before the JSON value was complete. \
                 Reply again with the whole JSON value, matching the schema, well within {limit}: shorten the texts and lists."
            )));
            continue;
        }
        if attempt >= repairs {
            // `attempt` counts the repairs of this one attempt of the node (`error.attempts`).
            let tried = match attempt {
                0 => "1 reply, no repair asked for".to_string(),
                1 => "2 replies: the first and 1 repair".to_string(),
                n => format!("{} replies: the first and {n} repairs", n + 1),
            };
            return Err(NodeError::invalid(format!(
                "the model's reply did not match the output schema ({tried}): {problem}"
            ))
            .spent(usage)
            .into());
        }
        attempt += 1;
        // A runaway reply (a string that never closes, a list that never ends) is not sent
        // back whole: its start shows the model what went wrong, and the rest would only fill
        // the context it needs for a second try.
        let echoed = fit::cut_text(&reply.text, REPAIR_ECHO_TOKENS);
        let cut = if echoed.len() < reply.text.len() {
            format!(" (shown above cut to its first {REPAIR_ECHO_TOKENS} tokens; it was too long)")
        } else {
            String::new()
        };
        request.messages.push(Message::new("assistant", echoed));
        request.messages.push(Message::new("user", format!(
                "Your reply{cut} was not valid: {problem}. Reply again with only the JSON value, matching the schema exactly."
            )));
    }
}

/// The messages of a call: the system prompt, the history and the prompt. When they would not
/// fit `target` tokens (by [`fit::estimate`]), the node's `fit` policy trims them: its
/// variables cut to their sizes divided by `shrink`, then the oldest history dropped.
fn compose(ctx: &NodeCtx<'_>, config: &Config, target: Option<u64>, shrink: u32) -> Result<Vec<Message>, NodeError> {
    let spec = &config.n;
    let assemble = |scope: &minijinja::Value, history: Vec<Message>| -> Result<Vec<Message>, NodeError> {
        let mut messages = Vec::with_capacity(history.len() + 2);
        if let Some(system) = &config.system {
            messages.push(Message::new("system", render_in(ctx, system, "/system", scope)?));
        }
        messages.extend(history);
        if let Some(prompt) = &config.prompt {
            messages.push(Message::new("user", render_in(ctx, prompt, "/prompt", scope)?));
        }
        Ok(messages)
    };
    let history_of = |scope: &minijinja::Value| history(ctx, spec, config.history, scope);
    let messages = assemble(&ctx.scope, history_of(&ctx.scope)?)?;
    let Some(target) = target.filter(|t| fit::estimate(&messages) > *t) else {
        return Ok(messages);
    };
    let policy = spec.fit.clone().unwrap_or_default();
    let scope = if config.truncate.is_empty() {
        ctx.scope.clone()
    } else {
        cut_scope(ctx, &config.truncate, shrink)?
    };
    let mut history = history_of(&scope)?;
    let fixed = assemble(&scope, Vec::new())?;
    if policy.drop_history.unwrap_or(true) {
        let base = fit::estimate(&fixed);
        fit::drop_oldest(&mut history, |rest| base + fit::estimate(rest) <= target);
    }
    assemble(&scope, history)
}

/// The node's scope with each `fit.truncate` variable cut to its size divided by `shrink`.
fn cut_scope(ctx: &NodeCtx<'_>, truncate: &[(Vec<String>, u32)], shrink: u32) -> Result<minijinja::Value, NodeError> {
    let mut roots: IndexMap<&str, Value> = IndexMap::new();
    for (path, tokens) in truncate {
        let Some((root, rest)) = path.split_first() else {
            continue;
        };
        if !roots.contains_key(root.as_str()) {
            let value = ctx
                .scope
                .get_attr(root)
                .map_err(|e| NodeError::invalid(values::describe(&e)))
                .and_then(|v| values::to_json(&v).map_err(|e| NodeError::invalid(e.to_string())))?;
            roots.insert(root, value);
        }
        let tokens = u64::from(*tokens / shrink.max(1));
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        if let Some(value) = roots.get_mut(root.as_str()) {
            fit::cut_at(value, &rest, |v| fit::cut_value(v, tokens));
        }
    }
    let layer = roots.into_iter().map(|(k, v)| (k.to_string(), values::to_jinja(&v)));
    Ok(ctx.base.with(layer).into_value())
}

/// How many tokens (by the estimate) a prompt may take after the server refused `sent`
/// estimated tokens with overflow message `why`: scaled by the server's own counts when it
/// gives them (its window less the reply's room, [`fit::reply_room`] of the completion cap
/// `cap`, with a tenth to spare), else three quarters of what was sent.
fn harder_target(why: &str, sent: u64, cap: Option<u64>) -> u64 {
    match fit::overflow_numbers(why) {
        (Some(counted), Some(window)) if counted > 0 => {
            let reserve = cap.map_or(0, |c| fit::reply_room(c, window));
            let room = window.saturating_sub(reserve) as f64;
            (room * sent as f64 / counted as f64 * 0.9) as u64
        }
        _ => sent * 3 / 4,
    }
}

/// Renders template `id` in `scope`; `field` names it in an error.
fn render_in(
    ctx: &NodeCtx<'_>,
    id: &crate::compile::TemplateId,
    field: &str,
    scope: &minijinja::Value,
) -> Result<String, NodeError> {
    if std::ptr::eq(scope, &ctx.scope) {
        return render(ctx, id, field);
    }
    let template = ctx
        .plan
        .exprs()
        .env()
        .get_template(&id.0)
        .map_err(|e| NodeError::invalid(values::describe(&e)))?;
    template
        .render(scope.clone())
        .map_err(|e| NodeError::invalid(format!("{field}: {}", values::describe(&e))))
}

/// The chat history: the `history.from` expression's messages, windowed.
fn history(
    ctx: &NodeCtx<'_>,
    spec: &LlmNode,
    from: Option<ExprId>,
    scope: &minijinja::Value,
) -> Result<Vec<Message>, NodeError> {
    let (Some(h), Some(id)) = (&spec.history, from) else {
        return Ok(Vec::new());
    };
    let value = values::eval(ctx.plan, id, scope).map_err(NodeError::invalid)?;
    let Value::Array(items) = value else {
        return Err(NodeError::invalid("`history.from` did not yield a list of messages"));
    };
    // Tool calls and tool results travel with their messages, so an agent loop's history is
    // sent back to the model whole.
    let mut messages: Vec<Message> = items.iter().map(Message::from_value).collect();
    if let Some(last) = h.last {
        let skip = messages.len().saturating_sub(last as usize);
        messages.drain(..skip);
    }
    if let Some(budget) = h.max_tokens {
        // Keep the most recent messages that fit, at about four characters a token.
        let mut used = 0u64;
        let mut keep = messages.len();
        for (i, m) in messages.iter().enumerate().rev() {
            used += (m.content.chars().count() as u64).div_ceil(4);
            if used > budget as u64 {
                break;
            }
            keep = i;
        }
        messages.drain(..keep);
    }
    Ok(messages)
}

/// Parses a reply as JSON, tolerating a Markdown code fence around it.
fn parse_json(text: &str) -> Result<Value, serde_json::Error> {
    let t = text.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .and_then(|rest| rest.trim_end().strip_suffix("```"))
        .unwrap_or(t);
    serde_json::from_str(t.trim())
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_replies_may_be_fenced() {
        assert_eq!(
            super::parse_json("```json\n{\"a\": 1}\n```").unwrap(),
            serde_json::json!({"a": 1})
        );
        assert_eq!(super::parse_json(" [1] ").unwrap(), serde_json::json!([1]));
        assert!(super::parse_json("not json").is_err());
    }
}
