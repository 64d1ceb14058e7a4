//! The compiled plan: what the engine executes. Only `compile` constructs one.
//!
//! Architecture Invariant: inside a plan, nodes are [`NodeIx`] indices; names are kept only
//! for display and diagnostics. Expressions and templates are compiled once, here.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use indexmap::IndexMap;
use minijinja::{Environment, Expression};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
// The engine looks nodes up by index and by name several times per task: a fast hash for
// keys the workflow's author chose, not an attacker (SipHash was most of those lookups).
use rustc_hash::FxBuildHasher;
use serde_json::Value;

use super::{NodeValidators, Validators};
use crate::spec::NodeSpec;

/// A node's index in its plan.
pub type NodeIx = NodeIndex<u32>;

/// An executable workflow.
pub struct Plan {
    pub(in crate::compile) name: String,
    pub(in crate::compile) description: Option<String>,
    pub(in crate::compile) path: PathBuf,
    /// Identifies this version of the workflow: the resolved spec, prompts, schema files and
    /// subgraphs, hashed (SHA-256, hex). Comments and formatting do not change it.
    pub(in crate::compile) hash: String,
    /// The graph: START, END and every node; edge weights say how control flows.
    pub(in crate::compile) graph: StableDiGraph<Vertex, Flow>,
    pub(in crate::compile) start: NodeIx,
    pub(in crate::compile) end: NodeIx,
    /// Per node (by graph index): its resolved spec, compiled fields and outgoing branches.
    pub(in crate::compile) nodes: IndexMap<NodeIx, PlanNode, FxBuildHasher>,
    /// Node names to indices, for the engine's stored task records and the CLI.
    pub(in crate::compile) by_name: std::collections::HashMap<String, NodeIx, FxBuildHasher>,
    /// What runs first.
    pub(in crate::compile) entry: Vec<Branch>,
    /// Joins: the target runs once every source has run since it last ran.
    pub(in crate::compile) joins: Vec<(Vec<NodeIx>, Target)>,
    pub(in crate::compile) state: IndexMap<String, Channel>,
    pub(in crate::compile) input_schema: Option<Value>,
    pub(in crate::compile) context_schema: Option<Value>,
    pub(in crate::compile) config: Value,
    pub(in crate::compile) output: Option<Vec<String>>,
    pub(in crate::compile) recursion_limit: u32,
    /// What one turn of a thread may spend on models.
    pub(in crate::compile) budget: crate::spec::Budget,
    pub(in crate::compile) predicates: IndexMap<String, ExprId>,
    pub(in crate::compile) models: IndexMap<String, crate::spec::ModelProfile>,
    /// Child plans of subgraph nodes.
    pub(in crate::compile) subgraphs: IndexMap<NodeIx, Arc<Plan>>,
    /// Where this workflow hands off to a parent, when it runs as a subgraph: checked against
    /// each workflow that imports it.
    pub(in crate::compile) handoffs: Vec<HandoffSite>,
    /// The names of the workflow's declared tools (a tool's `run` node is named after it).
    pub(in crate::compile) tools: Vec<String>,
    pub(in crate::compile) exprs: ExprTable,
    /// The HTTP endpoints of the workflow's own (`serve.routes`).
    pub(in crate::compile) routes: Vec<Route>,
    /// The schedules it runs on by itself (`serve.schedules`).
    pub(in crate::compile) schedules: Vec<PlanSchedule>,
    /// Long-term memory's namespace prefixes every user shares (`serve.shared_store`).
    pub(in crate::compile) shared_store: std::sync::Arc<[Vec<String>]>,
    /// The validators of the state keys' schemas and of the nodes' result schemas, made on
    /// first use and shared by every run of the plan (a server's runs compile a schema once,
    /// not once a run).
    pub(in crate::compile) validators: OnceLock<Arc<Validators<String>>>,
    pub(in crate::compile) node_validators: OnceLock<Arc<NodeValidators>>,
}

/// Reads of a plan. Its fields are the compiler's: only compile/ builds or changes a `Plan`.
impl Plan {
    /// The HTTP endpoints of the workflow's own (`serve.routes`).
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The schedules it runs on by itself (`serve.schedules`).
    pub fn schedules(&self) -> &[PlanSchedule] {
        &self.schedules
    }

    /// Long-term memory's namespace prefixes every user shares (`serve.shared_store`).
    pub fn shared_store(&self) -> &std::sync::Arc<[Vec<String>]> {
        &self.shared_store
    }

    /// The state channels, to change: only for tests of the engine's own run-time checks,
    /// which need a plan the compiler would have refused.
    #[doc(hidden)]
    pub fn tamper_with_state(&mut self) -> &mut IndexMap<String, Channel> {
        self.validators = OnceLock::new();
        &mut self.state
    }

    /// The validators of the state keys' schemas, each compiled when a value of its key is
    /// first checked by any run of this plan.
    pub fn state_validators(&self) -> Arc<Validators<String>> {
        self.validators
            .get_or_init(|| {
                Arc::new(Validators::new(
                    self.state.iter().map(|(key, c)| (key.clone(), c.schema.clone())),
                ))
            })
            .clone()
    }

    /// The validators of the nodes' result schemas, each compiled when its node first checks
    /// a result in any run of this plan.
    pub(crate) fn node_validators(&self) -> Arc<NodeValidators> {
        self.node_validators
            .get_or_init(|| Arc::new(NodeValidators::new(self.nodes.keys().copied())))
            .clone()
    }

    pub fn exprs(&self) -> &ExprTable {
        &self.exprs
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> Option<&String> {
        self.description.as_ref()
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn hash(&self) -> &str {
        &self.hash
    }

    pub fn graph(&self) -> &StableDiGraph<Vertex, Flow> {
        &self.graph
    }

    pub fn start(&self) -> NodeIx {
        self.start
    }

    pub fn end(&self) -> NodeIx {
        self.end
    }

    pub fn nodes(&self) -> &IndexMap<NodeIx, PlanNode, FxBuildHasher> {
        &self.nodes
    }

    pub fn by_name(&self) -> &std::collections::HashMap<String, NodeIx, FxBuildHasher> {
        &self.by_name
    }

    pub fn entry(&self) -> &[Branch] {
        &self.entry
    }

    pub fn joins(&self) -> &[(Vec<NodeIx>, Target)] {
        &self.joins
    }

    pub fn state(&self) -> &IndexMap<String, Channel> {
        &self.state
    }

    pub fn input_schema(&self) -> Option<&Value> {
        self.input_schema.as_ref()
    }

    pub fn context_schema(&self) -> Option<&Value> {
        self.context_schema.as_ref()
    }

    pub fn config(&self) -> &Value {
        &self.config
    }

    pub fn output(&self) -> Option<&[String]> {
        self.output.as_deref()
    }

    pub fn recursion_limit(&self) -> u32 {
        self.recursion_limit
    }

    pub fn budget(&self) -> &crate::spec::Budget {
        &self.budget
    }

    pub fn predicates(&self) -> &IndexMap<String, ExprId> {
        &self.predicates
    }

    pub fn models(&self) -> &IndexMap<String, crate::spec::ModelProfile> {
        &self.models
    }

    pub fn subgraphs(&self) -> &IndexMap<NodeIx, Arc<Plan>> {
        &self.subgraphs
    }

    pub fn handoffs(&self) -> &[HandoffSite] {
        &self.handoffs
    }
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("name", &self.name)
            .field("hash", &self.hash)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// A node's name, for display.
    pub fn name_of(&self, ix: NodeIx) -> &str {
        match &self.graph[ix] {
            Vertex::Start => "START",
            Vertex::End => "END",
            Vertex::Node(name) => name,
        }
    }

    /// Every name a model call of a run of this plan can come from: its nodes, its tools and,
    /// recursively, its subgraphs'.
    pub fn all_node_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.nodes.values().map(|n| n.name.as_str()).collect();
        names.extend(self.tools.iter().map(String::as_str));
        for child in self.subgraphs.values() {
            names.extend(child.all_node_names());
        }
        names
    }

    /// The node called `name`, if any.
    pub fn node_by_name(&self, name: &str) -> Option<NodeIx> {
        self.by_name.get(name).copied()
    }
}

/// A vertex of the plan graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vertex {
    Start,
    End,
    Node(String),
}

/// How control flows along a graph edge (for pictures and analysis; the engine uses
/// [`Branch`]es).
#[derive(Debug, Clone, PartialEq)]
pub enum Flow {
    /// Always taken.
    Static,
    /// Taken when the condition holds (`None`: the default clause).
    Conditional { label: Option<String> },
    /// Part of a join: the target waits for all its sources.
    Join,
    /// Fan-out: one task per item.
    Send { foreach: String, item: String },
    /// A node's own `goto` choice.
    Goto { label: Option<String> },
    /// To the node's error handler.
    OnError,
}

/// A compiled node. Its fields are the crate's; other crates read them through its methods.
#[derive(Debug)]
pub struct PlanNode {
    pub(crate) name: String,
    /// The user kind it was declared with, when not a built-in.
    pub(crate) user_kind: Option<String>,
    pub(crate) spec: NodeSpec,
    /// Compiled `update` entries: key → expression or literal.
    pub(crate) update: Vec<(String, Writer)>,
    /// The kind's own fields, compiled by the kind into its own configuration.
    pub(crate) config: super::kind::KindConfig,
    /// The node stops the run for a person's answer (its kind is a gate).
    pub(crate) gate: bool,
    /// Outgoing control flow, evaluated after the node runs.
    pub(crate) branches: Vec<Branch>,
    /// The node's own `goto` clauses, evaluated with its output.
    pub(crate) goto: Vec<Clause>,
    pub(crate) on_error: Option<ErrorHandler>,
    /// Set when this node is a fan-out target: the name its item has.
    pub(crate) item: Option<String>,
    /// Its results are reused across threads (`cache:`).
    pub(crate) cache: Option<NodeCache>,
    /// Its retry policy, its kind's default filled in.
    pub(crate) retry: Retry,
    /// The limit of each attempt.
    pub(crate) timeout: Option<std::time::Duration>,
}

impl PlanNode {
    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The user kind it was declared with, when not a built-in.
    pub fn user_kind(&self) -> Option<&str> {
        self.user_kind.as_deref()
    }

    /// The node as written, its kind's defaults merged.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// Its compiled `update` entries: key → expression or literal.
    pub fn update(&self) -> &[(String, Writer)] {
        &self.update
    }

    /// Whether it stops the run for a person's answer.
    pub fn is_gate(&self) -> bool {
        self.gate
    }

    /// Its retry policy, resolved.
    pub fn retry(&self) -> &Retry {
        &self.retry
    }

    /// The limit of each attempt, if it has one.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.timeout
    }
}

/// A node's retry policy as it runs: its `retry:` fields, each one left out given its default,
/// and without `retry:` its kind's default ([`KindDecl::retries_by_default`]: three attempts at
/// transient failures for kinds that reach the network, one attempt for the others).
///
/// [`KindDecl::retries_by_default`]: super::kind::KindDecl::retries_by_default
#[derive(Debug, Clone, PartialEq)]
pub struct Retry {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    pub initial: std::time::Duration,
    pub factor: f64,
    pub max: std::time::Duration,
    pub jitter: bool,
    pub retry_on: Vec<crate::error_class::ErrorClass>,
}

impl Retry {
    /// The policy of a node whose `retry:` is `written`, of a kind that retries by default or not.
    pub(crate) fn resolve(written: Option<&crate::spec::RetryPolicy>, by_default: bool) -> Retry {
        use crate::error_class::ErrorClass;
        use std::time::Duration;
        let p = written;
        Retry {
            max_attempts: p
                .and_then(|p| p.max_attempts)
                .unwrap_or(if p.is_some() || by_default { 3 } else { 1 }),
            initial: p
                .and_then(|p| p.initial_interval.as_ref())
                .and_then(|d| d.to_std())
                .unwrap_or(Duration::from_millis(500)),
            factor: p.and_then(|p| p.backoff_factor).unwrap_or(2.0),
            max: p
                .and_then(|p| p.max_interval.as_ref())
                .and_then(|d| d.to_std())
                .unwrap_or(Duration::from_secs(128)),
            jitter: p.and_then(|p| p.jitter).unwrap_or(true),
            retry_on: match p {
                Some(p) if !p.retry_on.is_empty() => p.retry_on.clone(),
                _ => vec![
                    ErrorClass::Timeout,
                    ErrorClass::RateLimit,
                    ErrorClass::Server,
                    ErrorClass::Network,
                    ErrorClass::Stream,
                ],
            },
        }
    }
}

/// A node's cache policy, compiled.
#[derive(Debug, Clone)]
pub struct NodeCache {
    /// How long a result is reused; `None`: until the cache is cleared.
    pub ttl: Option<std::time::Duration>,
    /// The key expression; `None`: the key is everything the node reads.
    pub key: Option<ExprId>,
    /// SHA-256 (hex) of what the node's behaviour depends on in its workflow (see
    /// `compile/cache.rs`): part of every key, so an edited node never reuses a result of its
    /// earlier definition.
    pub fingerprint: String,
}

/// A compiled state write.
#[derive(Debug, Clone)]
pub enum Writer {
    Expr(ExprId),
    Literal(Value),
}

/// A compiled field.
#[derive(Debug, Clone)]
pub enum Compiled {
    Expr(ExprId),
    Template(TemplateId),
    Literal(Value),
}

/// Where a node goes when it fails.
#[derive(Debug)]
pub struct ErrorHandler {
    pub to: Target,
    pub update: Vec<(String, Writer)>,
}

/// A node's outgoing control flow.
#[derive(Debug, Clone)]
pub enum Branch {
    /// Always run these next.
    Always(Vec<Target>),
    /// Run the first matching clause's targets.
    Route(Vec<Clause>),
    /// Fan out.
    Send(SendSpec),
}

/// A routing clause.
#[derive(Debug, Clone)]
pub struct Clause {
    pub when: Option<ExprId>,
    pub then: ClauseTarget,
    pub label: Option<String>,
}

/// Where a clause leads.
#[derive(Debug, Clone)]
pub enum ClauseTarget {
    Nodes(Vec<Target>),
    Send(SendSpec),
    /// End the subgraph and continue in its parent.
    Handoff(HandoffSpec),
}

/// A handoff to the parent workflow, compiled. The target is a name: it is resolved in the
/// parent, which is not known when the child is compiled (each parent checks it statically).
#[derive(Debug, Clone)]
pub struct HandoffSpec {
    pub to: String,
    pub update: Vec<(String, Writer)>,
}

/// Where a workflow names a parent node and parent keys, for the parent's checks.
#[derive(Debug, Clone)]
pub struct HandoffSite {
    pub to: Named,
    pub keys: Vec<Named>,
}

/// A name written in a workflow, with its place (for diagnostics in that file).
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
    pub pointer: String,
    pub span: Option<crate::diag::Span>,
}

/// A compiled fan-out.
#[derive(Debug, Clone)]
pub struct SendSpec {
    pub to: NodeIx,
    pub foreach: ExprId,
    pub item: String,
}

/// A successor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Node(NodeIx),
    End,
}

/// A state key.
#[derive(Debug, Clone)]
pub struct Channel {
    pub reducer: Reducer,
    pub default: Value,
    pub schema: Value,
    /// The input field written to the key through its reducer when a thread starts and at
    /// each new turn.
    pub from_input: Option<String>,
}

/// A write `{"__overwrite__": value}` sets its key to `value`, bypassing the key's reducer
/// (LangGraph's `Overwrite(value)`, in the JSON form LangGraph gives it). Expressions write it
/// with `overwrite(value)`.
pub const OVERWRITE: &str = "__overwrite__";

/// The id of a remove marker that removes every message of an `add_messages` key (LangGraph's
/// `RemoveMessage(id=REMOVE_ALL_MESSAGES)`). Expressions write it with `remove_all_messages()`.
pub const REMOVE_ALL_MESSAGES: &str = "__remove_all__";

/// The value an overwrite marker carries, if `v` is one.
pub fn overwritten(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(m) if m.len() == 1 => m.get(OVERWRITE),
        _ => None,
    }
}

/// How writes to a key combine.
#[derive(Debug, Clone, PartialEq)]
pub enum Reducer {
    Replace,
    Append,
    Extend,
    Union,
    AddMessages,
    Merge,
    Sum,
    Max,
    Min,
    Custom { name: String, expr: ExprId },
}

impl Reducer {
    /// A built-in reducer by name.
    pub fn builtin(name: &str) -> Option<Reducer> {
        Some(match name {
            "replace" => Reducer::Replace,
            "append" => Reducer::Append,
            "extend" | "concat" => Reducer::Extend,
            "union" => Reducer::Union,
            "add_messages" => Reducer::AddMessages,
            "merge" => Reducer::Merge,
            "sum" => Reducer::Sum,
            "max" => Reducer::Max,
            "min" => Reducer::Min,
            _ => return None,
        })
    }

    pub const BUILTIN_NAMES: &[&str] = &[
        "replace",
        "append",
        "extend",
        "concat",
        "union",
        "add_messages",
        "merge",
        "sum",
        "max",
        "min",
    ];

    /// Whether several writes in one superstep can be combined.
    pub fn combines(&self) -> bool {
        *self != Reducer::Replace
    }
}

/// An expression in the plan's [`ExprTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExprId(pub u32);

/// A template in the plan's environment, by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TemplateId(pub Arc<str>);

type CompiledExprs<'env> = Vec<Expression<'env, 'static>>;

self_cell::self_cell!(
    /// The plan's minijinja environment (templates) and its compiled expressions, which borrow
    /// from it.
    pub struct ExprTable {
        owner: Environment<'static>,
        #[covariant]
        dependent: CompiledExprs,
    }
);

impl std::fmt::Debug for ExprTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExprTable")
            .field("exprs", &self.borrow_dependent().len())
            .finish()
    }
}

impl ExprTable {
    /// Builds the table, compiling `sources` in order: `ExprId(i)` is `sources[i]`.
    /// Every source was compiled once already while checking, so failure here is a bug.
    pub(crate) fn build(env: Environment<'static>, sources: Vec<String>) -> Result<ExprTable, minijinja::Error> {
        ExprTable::try_new(env, |env| {
            sources.into_iter().map(|s| env.compile_expression_owned(s)).collect()
        })
    }

    pub fn env(&self) -> &Environment<'static> {
        self.borrow_owner()
    }

    pub fn expr(&self, id: ExprId) -> &Expression<'_, 'static> {
        &self.borrow_dependent()[id.0 as usize]
    }

    pub fn len(&self) -> usize {
        self.borrow_dependent().len()
    }

    pub fn is_empty(&self) -> bool {
        self.borrow_dependent().is_empty()
    }
}

/// One HTTP endpoint of a workflow's own (see [`crate::spec::Route`]), its expressions compiled.
#[derive(Debug, Clone)]
pub struct Route {
    /// As written, for messages.
    pub path: String,
    pub segments: Vec<Segment>,
    pub method: crate::spec::RouteMethod,
    /// The thread's id, from the request.
    pub thread: Option<ExprId>,
    pub input: Option<RouteInput>,
    /// The answer to the gate the thread waits at, from the request.
    pub resume: Option<ExprId>,
    /// Answered as server-sent events by these rules; none: answered with `respond`.
    pub stream: Option<Vec<StreamRule>>,
    /// The JSON answered once the run ends (none: the run's output).
    pub respond: Option<ExprId>,
    /// The signature a request must carry (an inbound webhook's).
    pub verify: Option<Verify>,
}

/// How a route checks a request's signature (see [`crate::spec::VerifySpec`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verify {
    /// The variable holding the shared secret, read when a request comes.
    pub secret_env: String,
    /// Lowercase.
    pub header: String,
    pub scheme: crate::spec::VerifyScheme,
}

/// A schedule the workflow declares (`serve.schedules`), checked: what the server registers as
/// a cron.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSchedule {
    pub cron: String,
    pub timezone: Option<String>,
    pub input: Option<Value>,
    /// The runs' `config.configurable`.
    pub config: serde_json::Map<String, Value>,
    pub context: Option<Value>,
    pub metadata: serde_json::Map<String, Value>,
    pub thread: Option<String>,
    /// Milliseconds since the epoch.
    pub until: Option<i64>,
    pub webhook: Option<String>,
}

/// A segment of a route's path.
#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    Literal(String),
    /// `{name}`: any one segment, read as `request.path.name`.
    Param(String),
}

/// A route's input: fields, or one expression for the whole object.
#[derive(Debug, Clone)]
pub enum RouteInput {
    Fields(Vec<(String, ExprId)>),
    Expr(ExprId),
}

/// One rule of a route's stream.
#[derive(Debug, Clone)]
pub struct StreamRule {
    pub on: crate::spec::StreamOn,
    pub when: Option<ExprId>,
    /// The SSE event's name.
    pub event: Option<String>,
    pub data: ExprId,
    pub subgraphs: bool,
}
