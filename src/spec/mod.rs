//! Stage 1 of the pipeline: a workflow as its author wrote it.
//!
//! These serde types mirror the YAML one to one. They are deliberately permissive about
//! meaning (names are plain strings, expressions are unparsed text): the JSON Schema in
//! `schemas/workflow.schema.json`, generated from these types by [`schema`], rejects malformed
//! shapes with a position, and `compile` checks meaning. The doc comments on every field become
//! the schema's descriptions, so they are written for workflow authors.
//!
//! Architecture Invariant: spec/ knows nothing of tokio, SQLite, HTTP or the engine.

pub mod interp;
pub mod load;
mod node;
pub mod scalar;
pub mod schema;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use node::*;

/// A workflow file: one agent graph, or a library of shared definitions pulled in by `imports`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "runner workflow")]
pub struct Workflow {
    /// The workflow's name: lowercase letters, digits, `_` and `-`.
    #[schemars(regex(pattern = r"^[a-z][a-z0-9_-]*$"))]
    pub name: String,
    /// What the workflow does, in a sentence or two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Other workflow files (paths relative to this one) whose `types`, `reducers`,
    /// `predicates` and `kinds` become usable here. Imported files may not define nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imports: Vec<String>,
    /// JSON Schema of the run input (`runner run --input k=v`). Expressions read it as `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<JsonSchemaDoc>,
    /// State keys returned as the run's result. Without it the whole final state is returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Vec<String>>,
    /// JSON Schema of the run context (`--context user_id=alice`): values that identify who the
    /// run is for, kept with the thread and never part of the state. Expressions read `context`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<JsonSchemaDoc>,
    /// Tunables with their default values (any JSON). Override per run with
    /// `--set path.to.key=value`. Expressions read them as `config`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub config: IndexMap<String, Value>,
    /// Named model profiles. Nodes pick one by name; `default` is used when a node names none.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub models: IndexMap<String, ModelProfile>,
    /// Reusable JSON Schemas, referenced anywhere as `{$ref: "#/types/Name"}`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub types: IndexMap<String, JsonSchemaDoc>,
    /// The state: every key a node may read or write, with its JSON Schema, default and reducer.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub state: IndexMap<String, StateKey>,
    /// Custom reducers: minijinja expressions over `current` (the key's value) and `update`
    /// (the value a node wrote), yielding the new value.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub reducers: IndexMap<String, NamedExpr>,
    /// Named boolean expressions. Any expression may use a predicate by its name, e.g.
    /// `when: over_budget` or `when: "not over_budget and state.done"`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub predicates: IndexMap<String, NamedExpr>,
    /// User-defined node kinds: a built-in (or other user) kind with defaults and parameters.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub kinds: IndexMap<String, KindDef>,
    /// Tools a model may call, by name: what each does, its arguments' JSON Schema, and what
    /// runs it (a node of any kind, or a workflow). `tools` nodes run them; `llm` nodes offer
    /// them with `tools: [names]`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub tools: IndexMap<String, ToolDef>,
    /// The nodes, by name. Each has a `kind` that decides which other fields it takes.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    #[schemars(with = "IndexMap<String, NodeSchemaRef>")]
    pub nodes: IndexMap<String, Value>,
    /// The edges: `"a -> b"` strings (chains allowed), or objects for joins, routes and fan-out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edges: Vec<Edge>,
    /// Run limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Directory that prompt paths are relative to (relative to this file). By default the
    /// nearest `prompts/` directory in this file's directory or one of its ancestors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts: Option<String>,
    /// How `runner serve` serves the workflow besides LangGraph's API: HTTP endpoints of its
    /// own, for a frontend that speaks its own API. A workflow in a subfolder of the served
    /// folder is served only when it has this section (`serve: {}` serves it through
    /// LangGraph's API alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<Serve>,
}

/// How `runner serve` serves a workflow besides LangGraph's API.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Serve {
    /// HTTP endpoints that each start (or continue) a run from a request and answer with its
    /// events as server-sent events, or with a value once it ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// When the workflow runs by itself: each schedule is registered as a cron (LangGraph's
    /// scheduled runs) when `runner serve` loads the workflow, once however many servers load
    /// it, and removed when the workflow no longer declares it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<ScheduleSpec>,
    /// Long-term memory every user of a server with users shares: namespace prefixes (e.g.
    /// `[[docs], [kb, public]]`) that `store` nodes and the store endpoints read and write as
    /// named. Any other namespace is the calling user's own, stored under `[users, USER_ID]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "shared_store_schema")]
    pub shared_store: Vec<Vec<String>>,
}

/// A list of namespace prefixes: non-empty labels without periods, none starting with `users`
/// (the users' own namespaces).
fn shared_store_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "minLength": 1, "pattern": "^[^.]+$"},
            "prefixItems": [{"not": {"const": "users"}}]
        }
    })
}

/// A schedule the workflow runs on: a cron expression, and the run each tick starts.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// The cron expression, five fields: minute hour day-of-month month day-of-week
    /// (`0 9 * * 1`: Mondays at 09:00; `*/15 * * * *`: every fifteen minutes; `@daily`).
    pub cron: String,
    /// The IANA time zone the expression is read in (e.g. `Europe/Paris`); default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// What the schedule is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The input each run starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Values of the workflow's `config` for these runs (as a run's `config.configurable`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub config: IndexMap<String, Value>,
    /// The runs' context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Value>,
    /// Metadata of the schedule, which each of its runs carries.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub metadata: IndexMap<String, Value>,
    /// A thread every run continues (created on the first run); without it each run has a
    /// thread of its own, deleted when the run ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// When the schedule stops: an RFC 3339 time (`2031-01-01T00:00:00Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// A URL called with the run when each run ends (a run's `webhook`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
}

/// One HTTP endpoint of the workflow's own. Its expressions read `request` (`body`, `query`,
/// `headers` — lowercase names —, `path`: the path's `{name}` segments) and `config`; a
/// stream rule's also read `event` (what happened), `state` (the state after the run's last
/// step) and `run` (`run_id`, `thread_id`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The path, from `/`; a `{name}` segment matches any one segment, read as
    /// `request.path.name`. It may not start with a path of LangGraph's API (`/threads`,
    /// `/runs`, `/assistants`, `/store`, `/ok`, `/info`, `/metrics`).
    pub path: String,
    /// The HTTP method (default `POST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<RouteMethod>,
    /// What the endpoint is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Expression: the thread the run is on (a string; created when it does not exist, a
    /// request on a thread with a run waits for it). Without it, or when it is null, the run
    /// has a thread of its own, deleted after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The run's input: a map of input fields to expressions, or one expression that is the
    /// whole input object. Without it the run takes no new input (it goes on from where the
    /// thread stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<RouteInput>,
    /// Expression: when it is not null, the run answers the gate the thread waits at with it
    /// (LangGraph's `command.resume`) instead of starting a new turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
    /// Answer with server-sent events: the rules, each turning one kind of run event into an
    /// SSE event, in the order the run makes them. A run that fails and has no `error` rule
    /// ends the stream with `event: error` (`{error, message}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<Vec<StreamRule>>,
    /// Expression: without `stream`, the JSON answered once the run ends (its scope is a stream
    /// rule's at `end`). Default: the run's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub respond: Option<String>,
    /// Check the request's signature before anything runs, for an endpoint other services
    /// call (an inbound webhook): a request whose body is not signed with the secret is
    /// refused with 401.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifySpec>,
}

/// How a route checks that a request's body was signed with a shared secret (HMAC-SHA256).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifySpec {
    /// The environment variable that holds the shared secret.
    pub secret_env: String,
    /// The header that carries the signature (default `runner-signature`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// How the signature is made: `timestamped` (the default: `t=UNIX_SECONDS,v1=HEX`, the
    /// HMAC-SHA256 of the timestamp, a `.` and the body, at most five minutes old — runner's
    /// own webhooks sign so, as Stripe does) or `hex` (the HMAC-SHA256 of the body in hex,
    /// after an optional `sha256=`, as GitHub's `X-Hub-Signature-256`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<VerifyScheme>,
}

/// The header runner's outgoing webhooks sign with, and a route's `verify` reads by default.
pub const SIGNATURE_HEADER: &str = "runner-signature";

/// A signature scheme a route verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerifyScheme {
    Timestamped,
    Hex,
}

/// An HTTP method a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum RouteMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

/// A route's input: fields to expressions, or one expression.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RouteInput {
    Fields(IndexMap<String, String>),
    Expr(String),
}

/// One rule of a route's stream: which run events it sends, and as what.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamRule {
    /// The kind of run event: `custom` (an `emit`: `event.node`, `event.name`, `event.data`),
    /// `token` (a piece of a streamed model reply: `event.node`, `event.text`,
    /// `event.message_id`), `node_start` / `node_end` (`event.node`, `event.task_id`; at the end
    /// also `event.writes`, what it wrote), `interrupt` (`event.node`, `event.id`,
    /// `event.value`), `error` (`event.error`, `event.message`) or `end` (the run is over:
    /// `event.status` — `success`, `interrupted` or `error` —, `event.output`,
    /// `event.interrupts`, `event.error`).
    pub on: StreamOn,
    /// Condition: the rule sends only the events for which it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// The SSE event's name (its `event:` line); without it the event has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Expression: the event's data. A string is sent as it is; anything else as JSON.
    pub data: String,
    /// Also the events of subgraphs (`event.namespace` says whose); without it only the run's
    /// own graph's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub subgraphs: bool,
}

/// The kinds of run events a stream rule sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamOn {
    Custom,
    Token,
    NodeStart,
    NodeEnd,
    Interrupt,
    Error,
    End,
}

impl StreamOn {
    /// The fields `event` has for this kind.
    pub fn fields(self) -> &'static [&'static str] {
        match self {
            StreamOn::Custom => &["node", "name", "data", "namespace"],
            StreamOn::Token => &["node", "text", "message_id", "namespace"],
            StreamOn::NodeStart => &["node", "task_id", "namespace"],
            StreamOn::NodeEnd => &["node", "task_id", "writes", "namespace"],
            StreamOn::Interrupt => &["node", "id", "value", "namespace"],
            StreamOn::Error => &["error", "message"],
            StreamOn::End => &["status", "output", "interrupts", "error"],
        }
    }
}

/// A JSON Schema (draft 2020-12), written inline in YAML. `$ref: "#/types/Name"` points at a
/// workflow type; any other `$ref` is a file path relative to the workflow file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct JsonSchemaDoc(pub Value);

impl JsonSchema for JsonSchemaDoc {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "JsonSchema".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A JSON Schema (draft 2020-12). `$ref: \"#/types/Name\"` names a workflow type; other `$ref`s are file paths relative to the workflow file.",
            "type": ["object", "boolean"]
        })
    }
}

/// One state key: a JSON Schema for its values plus how updates combine.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct StateKey {
    /// How a node's write combines with the current value: a built-in (`replace`, `append`,
    /// `extend`, `concat`, `add_messages`, `merge`, `sum`, `max`, `min`, `union`) or a name from
    /// `reducers`. Default `replace`, which allows one writer per superstep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reducer: Option<String>,
    /// The value before any node writes the key. Without it the key starts as null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// The key is fed from the run's input: when a thread starts and at each new turn, the
    /// input's field of the same name (`true`), or of the name given, is written to the key
    /// through its reducer, as LangGraph applies a run's input (a new message is appended by
    /// `add_messages`). An input without the field writes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_input: Option<FromInput>,
    /// What the key holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Any other JSON Schema keywords (`type`, `items`, `properties`, `$ref`, `enum`, ...).
    #[serde(flatten)]
    pub schema: IndexMap<String, Value>,
}

/// Which input field feeds a state key.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum FromInput {
    /// `true`: the input field named like the key; `false`: none.
    Same(bool),
    /// The input field of this name.
    Field(String),
}

impl FromInput {
    /// The input field that feeds `key`, if any.
    pub fn field<'a>(&'a self, key: &'a str) -> Option<&'a str> {
        match self {
            FromInput::Same(true) => Some(key),
            FromInput::Same(false) => None,
            FromInput::Field(f) => Some(f),
        }
    }
}

/// A named expression: the expression text alone, or with a description.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum NamedExpr {
    /// The minijinja expression.
    Expr(String),
    /// The expression with a description.
    Described {
        /// The minijinja expression.
        expr: String,
        /// What it computes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
    },
}

impl NamedExpr {
    pub fn expr(&self) -> &str {
        match self {
            NamedExpr::Expr(e) | NamedExpr::Described { expr: e, .. } => e,
        }
    }
}

/// A model profile. String fields may use `${env:NAME}` or `${env:NAME:-default}`.
/// API keys are never written here: `api_key_env` names the environment variable holding one.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelProfile {
    /// Which API speaks to the model. `openai` is any OpenAI-compatible server (OpenAI, Azure,
    /// Ollama's /v1, vLLM, llama.cpp, LM Studio, OpenRouter, Groq, Together...).
    pub provider: Provider,
    /// The model name the server expects.
    pub model: String,
    /// The API's base URL, e.g. `http://127.0.0.1:11434/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable that holds the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Azure OpenAI: the `api-version` query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Sampling temperature used unless a node sets its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Completion token cap used unless a node sets its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The model's context window in tokens, the prompt and the reply together (e.g. 4096 for
    /// a llama.cpp server started with `-c 4096`). An llm node's prompt that would not fit,
    /// with room kept for its `max_tokens`, is trimmed by the node's `fit` policy before the
    /// call; without it only a server's overflow reply does that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub context: Option<u32>,
    /// Price in currency units per million tokens, for usage and cost budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
    /// The deadline of one call, the whole reply read included, e.g. `60s` (default `10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// The longest a call may wait for the next piece of a reply once the response has
    /// started (a stalled stream), e.g. `30s` (default `120s`). A call past it fails with the
    /// class `timeout`; waiting for the response to start is bounded by `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// The largest reply accepted, its text and tool calls together, in bytes (default 1 MiB).
    /// A larger reply fails the call with the class `invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_reply_bytes: Option<u64>,
    /// Extra request fields passed through to the provider unchanged.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub options: IndexMap<String, Value>,
}

impl ModelProfile {
    /// A profile with nothing said but its provider (`mock`), for a `--model` spec to fill in.
    pub fn unset() -> ModelProfile {
        ModelProfile {
            provider: Provider::Mock,
            model: String::new(),
            base_url: None,
            api_key_env: None,
            api_version: None,
            temperature: None,
            max_tokens: None,
            context: None,
            pricing: None,
            timeout: None,
            idle_timeout: None,
            max_reply_bytes: None,
            options: IndexMap::new(),
        }
    }
}

/// Which API a model profile speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Any OpenAI-compatible Chat Completions endpoint.
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
    /// Scripted replies for tests and offline runs.
    Mock,
}

/// Token prices per million tokens.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// Price per million prompt tokens.
    pub input: f64,
    /// Price per million completion tokens.
    pub output: f64,
}

/// A tool a model may call, or an MCP server whose tools are imported (`mcp` and `import`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    /// What the tool does, for the model (required, except for an MCP server, whose tools
    /// bring their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of the tool's arguments (an object). By default, for a `workflow`
    /// tool, the workflow's `input` schema; otherwise any object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<JsonSchemaDoc>,
    /// The node that runs the tool: any kind, its fields with `args` in scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<NodeSchemaRef>")]
    pub run: Option<Value>,
    /// A workflow file (relative to this one) run as the tool, the arguments as its input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// The limit of one call (e.g. `30s`; for an MCP server's tools, 60s by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// An MCP server whose tools this entry imports: started as a child process speaking over
    /// stdio (`command`), or reached over streamable HTTP (`url`). Its tool list is read from
    /// the workflow's lock file (`<workflow>.mcp.lock.json`, written by `runner mcp lock`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpServer>,
    /// The server's tools to import: a list of their names, or `all` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<McpImport>,
    /// Put before each imported tool's name (e.g. `fs_`), so tools of two servers cannot clash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]*$"))]
    pub prefix: Option<String>,
}

/// An MCP server: exactly one of `command` (stdio) and `url` (streamable HTTP).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The program that serves MCP over its standard input and output, and its arguments
    /// (e.g. `[npx, -y, "@modelcontextprotocol/server-filesystem", "."]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub command: Option<Vec<String>>,
    /// More arguments, after `command`'s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables set for the server's process; `${env:NAME}` reads runner's own.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub env: IndexMap<String, String>,
    /// The working directory of the server's process, relative to the workflow's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The URL of a server speaking streamable HTTP (e.g. `http://127.0.0.1:8931/mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP headers sent with every request to `url`; `${env:NAME}` reads runner's environment.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<String, String>,
    /// How long starting the server and the MCP handshake may take (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout: Option<Duration>,
}

/// Which of an MCP server's tools are imported.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum McpImport {
    /// Every tool the server lists.
    All(ImportAll),
    /// These tools, by the server's names.
    Names(Vec<String>),
}

/// `all`: every tool the server lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImportAll {
    All,
}

/// A user-defined node kind.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KindDef {
    /// The kind this one builds on: a built-in kind or another user kind.
    pub extends: String,
    /// What nodes of this kind do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Parameters a node of this kind takes under `params`, each a JSON Schema (with an optional
    /// `default`). Templates and expressions read them as `params.name`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub params: IndexMap<String, JsonSchemaDoc>,
    /// Field defaults for every node of this kind; a node's own fields override them.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub with: IndexMap<String, Value>,
}

/// An edge. As a string: `"a -> b"`, `"a -> b -> c"`, `"START -> a"`, `"z -> END"`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Edge {
    /// `"a -> b -> c"`.
    Chain(String),
    /// An edge object.
    Object(EdgeObject),
}

/// An edge object: exactly one of `to`, `route` or `send`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EdgeObject {
    /// The source node. A list makes a join: the targets run once every source has run.
    pub from: OneOrMany,
    /// Targets that always run next (several run in parallel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<OneOrMany>,
    /// Conditional routing: the first clause whose `when` holds is taken; a clause without
    /// `when` is the default and must come last. Evaluated on the state after the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Vec<RouteClause>>,
    /// Fan-out: one task of the target node per item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<Send>,
}

/// One name or a list of names.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One name.
    One(String),
    /// Several names.
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn as_slice(&self) -> &[String] {
        match self {
            OneOrMany::One(s) => std::slice::from_ref(s),
            OneOrMany::Many(v) => v,
        }
    }
}

/// A routing clause: where to go when `when` holds (or always, without `when`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteClause {
    /// A boolean expression, or a predicate name. Omit it on the final, default clause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// The node(s) to run next, or `END`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<OneOrMany>,
    /// Fan out instead of naming targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send: Option<Send>,
    /// In a subgraph's `goto` only: end the subgraph here and continue at a node of the
    /// workflow that runs it, writing that workflow's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
    /// A label for pictures of the graph (defaults to the condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// A handoff to the parent (LangGraph's `Command(graph=Command.PARENT, goto=..., update=...)`):
/// the subgraph's run ends, and the subgraph node of the workflow that runs it continues at `to`
/// instead of its own edges, with `update` written to that workflow's state as the subgraph
/// node's writes.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Handoff {
    /// The node of the parent workflow to run next.
    pub to: String,
    /// Writes to the parent's state: `key: expression` (with `output` in scope), through the
    /// parent's reducers.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub update: IndexMap<String, Value>,
}

/// Fan-out (LangGraph's `Send`): one task of `to` per item of `foreach`, each seeing its item
/// under the name `as`. Results merge into the state through the keys' reducers.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Send {
    /// The node that runs once per item.
    pub to: String,
    /// An expression yielding an array.
    pub foreach: String,
    /// The name the item has in the target's expressions and templates (default `item`).
    #[serde(default, rename = "as", skip_serializing_if = "Option::is_none")]
    pub as_: Option<String>,
}

impl Send {
    pub fn item_name(&self) -> &str {
        self.as_.as_deref().unwrap_or("item")
    }
}

/// Run limits.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The most supersteps one run may take (default 25, as in LangGraph).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recursion_limit: Option<u32>,
    /// Spend at most this much in one turn of a thread (in the currency of the profiles'
    /// `pricing`). A new input starts a new turn; resuming an interrupted or crashed turn does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_cost: Option<f64>,
    /// Use at most this many tokens (prompt and completion) in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Make at most this many model calls in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_llm_calls: Option<u64>,
}

impl Limits {
    /// The turn's usage budget.
    pub fn budget(&self) -> Budget {
        Budget {
            max_cost: self.max_cost,
            max_tokens: self.max_tokens,
            max_llm_calls: self.max_llm_calls,
        }
    }
}

/// Caps on model usage. Once one is reached, an llm node that would call a model fails with
/// the error class `budget` instead (never retried): its `on_error` handler takes over, or the
/// run fails with the last checkpoint intact.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Spend at most this much (in the currency of the profiles' `pricing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_cost: Option<f64>,
    /// Use at most this many tokens, prompt and completion together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Make at most this many model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_llm_calls: Option<u64>,
}

impl Budget {
    pub fn is_empty(&self) -> bool {
        self.max_cost.is_none() && self.max_tokens.is_none() && self.max_llm_calls.is_none()
    }
}

/// A duration: seconds as a number, or a string such as `500ms`, `30s`, `2m`, `1h`, `30d`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Duration {
    Seconds(f64),
    Text(String),
}

impl Duration {
    /// The duration, or `None` when the text is not a duration.
    pub fn to_std(&self) -> Option<std::time::Duration> {
        match self {
            Duration::Seconds(s) => std::time::Duration::try_from_secs_f64(*s).ok(),
            Duration::Text(t) => parse_duration(t),
        }
    }
}

fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        _ => return None,
    };
    std::time::Duration::try_from_secs_f64(secs).ok()
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration: seconds as a number, or text such as `500ms`, `30s`, `2m`, `1h`, `1d`.",
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(ms|s|m|h|d)$"}
            ]
        })
    }
}

/// Stand-in used only to point `nodes` at the composed node definition in the schema.
pub(crate) struct NodeSchemaRef;

impl JsonSchema for NodeSchemaRef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Node".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // Replaced by `schema::compose` with the per-kind definitions.
        schemars::json_schema!({"type": "object"})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let d = |t: &str| Duration::Text(t.into()).to_std();
        assert_eq!(d("500ms"), Some(std::time::Duration::from_millis(500)));
        assert_eq!(d("2m"), Some(std::time::Duration::from_secs(120)));
        assert_eq!(d("1.5s"), Some(std::time::Duration::from_millis(1500)));
        assert_eq!(d("30d"), Some(std::time::Duration::from_secs(30 * 86_400)));
        // Too long for a duration: not one, rather than a panic.
        assert_eq!(d(&format!("{}h", "9".repeat(30))), None);
        assert_eq!(Duration::Seconds(1e300).to_std(), None);
        assert_eq!(Duration::Seconds(f64::INFINITY).to_std(), None);
        assert_eq!(Duration::Seconds(-1.0).to_std(), None);
        assert_eq!(d("3 weeks"), None);
        assert_eq!(d("s"), None);
        assert_eq!(Duration::Seconds(-1.0).to_std(), None);
    }
}
