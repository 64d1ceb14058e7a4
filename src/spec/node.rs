//! The built-in node kinds, as written. A node is a closed enum tagged by `kind:`; user kinds
//! (`kinds:`) are resolved to one of these by `compile` before they are deserialized.
//!
//! Conventions every kind follows: fields that hold data (`update`, `foreach`, `queries`,
//! `payload`, `data`, `when`...) are minijinja *expressions*; fields that hold text (`prompt`,
//! `url`, `path`, `message`, headers...) are minijinja *templates*. In `update` and other data
//! maps a YAML string is an expression and any other YAML value is a literal.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Duration, JsonSchemaDoc, RouteClause};
use crate::error_class::ErrorClass;

/// Fields every node takes, whatever its kind.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct NodeCommon {
    /// What the node does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// State writes: `key: expression`. Expressions see `output` (what the node produced),
    /// `usage`, `state` (as of the start of the step), `input`, `config`, `context`, `params`,
    /// and the fan-out item. A non-string YAML value is written as a literal.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub update: IndexMap<String, Value>,
    /// The node chooses its successor (LangGraph's `Command(goto=...)`): clauses as in a
    /// `route`, evaluated when the node finishes, with `output` in scope.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub goto: Vec<RouteClause>,
    /// Constants (or a user kind's parameters), read as `params.name` in expressions and
    /// templates.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub params: IndexMap<String, Value>,
    /// Retry a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Fail an attempt that takes longer than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Fail the run if this node would run more often than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_visits: Option<u32>,
    /// Caps on this node's model usage within a turn (all its runs together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::Budget>,
    /// Where to go when the node fails after its retries, instead of failing the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<OnError>,
    /// Stop the run durably before this node runs; `runner resume` continues it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupt_before: bool,
    /// Stop the run durably after this node runs; `runner resume` continues it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupt_after: bool,
}

/// How a failed node is retried.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_attempts: Option<u32>,
    /// Wait before the first retry (default `0.5s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_interval: Option<Duration>,
    /// Each wait is the last times this (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_factor: Option<f64>,
    /// The longest wait (default `128s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<Duration>,
    /// Randomize waits (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<bool>,
    /// Which errors are retried (default: timeout, rate_limit, server, network, stream).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_on: Vec<ErrorClass>,
}

/// Error handling: a handler node, optionally with state writes that record the error.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum OnError {
    /// The handler node.
    To(String),
    /// The handler node and writes that record the error.
    Handler {
        /// The handler node (or `END`).
        to: String,
        /// State writes; expressions see `error` (`node`, `class`, `message`, `attempts`).
        #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
        update: IndexMap<String, Value>,
    },
}

/// A template given as a file under the prompts directory, or inline.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum TextSource {
    /// A path under the prompts directory, e.g. `research/plan.j2`.
    File(String),
    /// Inline template text.
    Inline {
        /// The template text.
        text: String,
    },
}

/// What an llm node produces.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum LlmOutput {
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
pub enum OutputFormat {
    /// Plain text: `output` is a string.
    Text,
    /// A JSON value: `output` is the parsed value.
    Json,
}

/// Chat history for an llm node.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct History {
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
pub struct LlmNode {
    /// A model profile name (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The user prompt template.
    pub prompt: TextSource,
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
}

/// Pure state updates: only `update` (and `goto`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct SetNode {}

/// Emits a custom event on the run's event stream (e.g. a mindmap's `node_added`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct EmitNode {
    /// The event name.
    pub event: String,
    /// The event payload: an expression, or a map of expressions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Emit one event per element of this expression's array (seen as `item` in `data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreach: Option<String>,
}

/// A human-in-the-loop gate: stops the run durably until `runner resume --answer`.
/// The answer is `output` in `update` and `goto`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct InterruptNode {
    /// Text shown to the person answering (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Data shown with the message: a map of expressions.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub payload: IndexMap<String, Value>,
    /// JSON Schema an answer must match; a bad answer is refused and the gate stays open.
    pub response: JsonSchemaDoc,
}

/// Runs another workflow file with its own state.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct SubgraphNode {
    /// The workflow file, relative to this one.
    pub workflow: String,
    /// The child's input: `key: expression`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub input: IndexMap<String, Value>,
}

/// An HTTP request.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct HttpNode {
    /// The method (default GET).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<HttpMethod>,
    /// The URL (template).
    pub url: String,
    /// Headers (templates). Secrets come only from the environment: `${env:NAME}`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<String, String>,
    /// Query parameters (templates).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub query: IndexMap<String, String>,
    /// A JSON body: an expression, or a map of expressions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// A form body (templates).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub form: IndexMap<String, String>,
    /// How the response body is parsed (default `auto`: JSON when the server says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ResponseFormat>,
    /// Largest response body accepted, in bytes (default 10 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Redirects followed (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redirects: Option<u32>,
}

/// An HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
    Head,
}

/// How a response body is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResponseFormat {
    Auto,
    Json,
    Text,
}

/// Web search. `output` is `{results: [{url, title, snippet, score, provider, query, tag}]}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct SearchNode {
    /// The search engine (default `searxng`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<SearchProvider>,
    /// The engine's base URL (may use `${env:NAME}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The environment variable holding the engine's API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Expression yielding a query or a list of queries.
    pub queries: String,
    /// Results per query (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Expression whose value is attached to every result as `tag` (e.g. a subtopic id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// A search engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SearchProvider {
    Searxng,
    Tavily,
    Brave,
}

/// Fetches web pages and extracts their main content.
/// `output` is `{pages: [{url, title, content, quality_score, word_count, tag}], errors: [...]}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ScrapeNode {
    /// Expression yielding URLs, or objects with a `url` (and optional `tag`).
    pub urls: String,
    /// Expression yielding URLs to skip (e.g. `state.seen_urls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip: Option<String>,
    /// Pages fetched at once (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Pages fetched at once from one host (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_host: Option<u32>,
    /// Per-page timeout (default `20s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Largest page accepted, in bytes (default 5 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Obey robots.txt (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robots: Option<bool>,
    /// Hosts or CIDRs allowed even though they are private or loopback (SSRF guard).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Drop pages whose quality score is below this (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_quality: Option<f64>,
    /// `record` (default) turns a failed page into an entry of `output.errors`; `fail` fails
    /// the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<FailurePolicy>,
}

/// What a failed item does to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    Record,
    Fail,
}

/// Chunking for an index.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Chunking {
    /// Target chunk size in characters (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// Characters shared by neighbouring chunks (default 150).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<u32>,
}

/// Adds documents to a named search index (chunks, keyword index and vectors).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct IndexNode {
    /// The index name.
    pub index: String,
    /// Expression yielding file paths, or documents `{id, text, title?, metadata?}`.
    pub documents: String,
    /// How documents are split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunking: Option<Chunking>,
    /// The model profile used for embeddings; without it an offline lexical embedder is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<String>,
}

/// Hybrid (keyword + vector) search over a named index.
/// `output` is `{chunks: [{id, document, text, score, position}], best_score, best_distance}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct RetrieveNode {
    /// The index name.
    pub index: String,
    /// Expression yielding a query or a list of queries (searched in parallel).
    pub queries: String,
    /// Expression yielding document names to restrict the search to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<String>,
    /// Chunks returned (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Neighbouring chunks added on each side of a hit (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbours: Option<u32>,
    /// Leading chunks always included from each targeted document (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intro_chunks: Option<u32>,
    /// How hits are reranked (default `rrf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerank: Option<Rerank>,
    /// The model profile used for embeddings (must match the index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<String>,
}

/// A reranker.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Rerank {
    /// `rrf` (reciprocal-rank fusion) or `none`.
    Named(RerankName),
    /// An LLM scores each hit.
    Llm {
        /// The model profile that scores.
        llm: String,
    },
    /// A `/rerank` HTTP endpoint.
    Http {
        /// The endpoint URL.
        url: String,
    },
}

/// A built-in reranker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RerankName {
    Rrf,
    None,
}

/// Long-term memory: JSON values by namespace and key.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct StoreNode {
    /// What to do.
    pub op: StoreOp,
    /// The namespace: a list of templates, e.g. `[memory, "{{ context.user_id }}", prefs]`.
    pub namespace: Vec<String>,
    /// The key (template); `get` without a key reads the whole namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `put`: the value (expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// `search`: the query (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// `search`: the most items returned (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// A store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StoreOp {
    Get,
    Put,
    Delete,
    Search,
}

/// Reads a document from a path or URL. `output` is `{content, title, source, bytes, format}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct LoadNode {
    /// A path or an http(s) URL (template).
    pub source: String,
    /// The document format (default `auto`, from the extension or content type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DocFormat>,
    /// Largest document accepted, in bytes (default 20 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// A document format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DocFormat {
    Auto,
    Text,
    Markdown,
    Html,
    Pdf,
    Json,
}

/// Writes an artifact under an output directory. `output` is `{path, bytes}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct SaveNode {
    /// The file path (template), relative to `dir`; it may not escape it.
    pub path: String,
    /// The content: an expression. Strings are written as they are, other values as JSON.
    pub content: String,
    /// The output directory (default `out`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// A node with its kind resolved to a built-in one. Each kind is boxed, so a node takes the
/// memory of its own kind's fields, not of the largest kind's.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeSpec {
    Llm(Box<Node<LlmNode>>),
    Set(Box<Node<SetNode>>),
    Emit(Box<Node<EmitNode>>),
    Interrupt(Box<Node<InterruptNode>>),
    Subgraph(Box<Node<SubgraphNode>>),
    Http(Box<Node<HttpNode>>),
    Search(Box<Node<SearchNode>>),
    Scrape(Box<Node<ScrapeNode>>),
    Index(Box<Node<IndexNode>>),
    Retrieve(Box<Node<RetrieveNode>>),
    Store(Box<Node<StoreNode>>),
    Load(Box<Node<LoadNode>>),
    Save(Box<Node<SaveNode>>),
}

/// A node of one kind: the common fields and the kind's own.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Node<K> {
    #[serde(flatten)]
    pub common: NodeCommon,
    #[serde(flatten)]
    pub kind: K,
}

/// The built-in kinds, in the order the schema lists them.
pub const BUILTIN_KINDS: &[&str] = &[
    "llm",
    "set",
    "emit",
    "interrupt",
    "subgraph",
    "http",
    "search",
    "scrape",
    "index",
    "retrieve",
    "store",
    "load",
    "save",
];

impl NodeSpec {
    pub fn common(&self) -> &NodeCommon {
        match self {
            NodeSpec::Llm(n) => &n.common,
            NodeSpec::Set(n) => &n.common,
            NodeSpec::Emit(n) => &n.common,
            NodeSpec::Interrupt(n) => &n.common,
            NodeSpec::Subgraph(n) => &n.common,
            NodeSpec::Http(n) => &n.common,
            NodeSpec::Search(n) => &n.common,
            NodeSpec::Scrape(n) => &n.common,
            NodeSpec::Index(n) => &n.common,
            NodeSpec::Retrieve(n) => &n.common,
            NodeSpec::Store(n) => &n.common,
            NodeSpec::Load(n) => &n.common,
            NodeSpec::Save(n) => &n.common,
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            NodeSpec::Llm(_) => "llm",
            NodeSpec::Set(_) => "set",
            NodeSpec::Emit(_) => "emit",
            NodeSpec::Interrupt(_) => "interrupt",
            NodeSpec::Subgraph(_) => "subgraph",
            NodeSpec::Http(_) => "http",
            NodeSpec::Search(_) => "search",
            NodeSpec::Scrape(_) => "scrape",
            NodeSpec::Index(_) => "index",
            NodeSpec::Retrieve(_) => "retrieve",
            NodeSpec::Store(_) => "store",
            NodeSpec::Load(_) => "load",
            NodeSpec::Save(_) => "save",
        }
    }
}
