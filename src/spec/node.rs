//! Nodes as written: the fields every node takes, whatever its kind. A node's `kind:` names a
//! registered kind (the built-in ones live in `nodes/`, one module each, with their own
//! fields) or a user kind (`kinds:`), which `compile` resolves to the kind it extends.
//!
//! Conventions every kind follows: fields that hold data (`update`, `foreach`, `queries`,
//! `payload`, `data`, `when`...) are minijinja *expressions*; fields that hold text (`prompt`,
//! `url`, `path`, `message`, headers...) are minijinja *templates*. In `update` and other data
//! maps a YAML string is an expression and any other YAML value is a literal.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Duration, RouteClause};
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
    /// Run only when nothing else is scheduled (LangGraph's `defer=True`): a node triggered
    /// while other branches still have work waits for them, and runs once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub defer: bool,
    /// Stop the run durably before this node runs; `runner resume` continues it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupt_before: bool,
    /// Stop the run durably after this node runs; `runner resume` continues it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupt_after: bool,
    /// Reuse the node's result (LangGraph's `CachePolicy`): a task whose key was seen before,
    /// on any thread, takes the stored writes and successors instead of running. `true` (or
    /// `{}`) keys by the node's definition and everything it reads, until cleared; `{ttl: 10m}`
    /// lets entries expire; `{key: expression}` keys by the expression's value instead of
    /// what the node reads. Not for an `interrupt` node; failures are never cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CachePolicy>,
}

/// A node's cache policy: `true`/`false`, or its time to live and key.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum CachePolicy {
    /// `true`: kept until cleared, keyed by what the node reads; `false`: not cached (turns off
    /// a user kind's default).
    On(bool),
    /// The time to live and the key.
    Policy(CacheSpec),
}

impl CachePolicy {
    /// The policy's fields, or `None` when it is turned off.
    pub fn spec(&self) -> Option<CacheSpec> {
        match self {
            CachePolicy::On(false) => None,
            CachePolicy::On(true) => Some(CacheSpec::default()),
            CachePolicy::Policy(spec) => Some(spec.clone()),
        }
    }
}

/// How long a node's results are kept, and what identifies one.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheSpec {
    /// How long a result is reused, e.g. `10m` (default: until the cache is cleared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    /// An expression whose value identifies the result (LangGraph's `key_func`), seeing what
    /// `update` sees except `output` and `usage`. By default the key is everything the node
    /// reads: the state, `input`, `config`, `context` and its fan-out item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
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
        /// State writes; expressions see `error` (`node`, `class`, `message`, `attempts`,
        /// `usage`).
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

/// A node with its kind resolved to a registered one (a user kind to the kind it extends):
/// the kind's name and the fields every kind takes. The kind's own fields are read and
/// compiled by the kind itself (its module in `nodes/`).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NodeSpec {
    /// The kind's name.
    pub kind: String,
    #[serde(flatten)]
    pub common: NodeCommon,
}

impl NodeSpec {
    pub fn common(&self) -> &NodeCommon {
        &self.common
    }

    pub fn kind_name(&self) -> &str {
        &self.kind
    }
}
