//! A run request as the run manager takes it: [`CreateRun`], typed, read from the JSON a client
//! sends (`RunCreateStateful` / `RunCreateStateless`), which is also what a run's row keeps, so
//! that a run left unfinished is made again from its row by whichever process resumes it.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::RunsError;
use crate::checkpoint::{RunRow, RunStatus};
use crate::engine::{EditError, Goto, NodeSet, Persist, RunGates, goto_target};
use crate::server::{Graph, Graphs};

/// `command` of a run: LangGraph's `Command`: `update` (written through the reducers) and
/// `goto` (what runs next) are applied to the thread first, then `resume` answers its gate.
#[derive(Deserialize, Default)]
struct Command {
    resume: Option<Value>,
    update: Option<Value>,
    goto: Option<Value>,
}

/// The request's fields runner reads; others are ignored as the reference ignores unknown ones.
#[derive(Deserialize)]
pub(crate) struct RunCreate {
    assistant_id: String,
    input: Option<Value>,
    command: Option<Command>,
    stream_mode: Option<Value>,
    #[serde(default)]
    stream_subgraphs: bool,
    #[serde(default)]
    stream_resumable: bool,
    #[serde(default)]
    metadata: Map<String, Value>,
    config: Option<Value>,
    context: Option<Value>,
    multitask_strategy: Option<String>,
    if_not_exists: Option<String>,
    on_disconnect: Option<String>,
    on_completion: Option<String>,
    interrupt_before: Option<Value>,
    interrupt_after: Option<Value>,
    durability: Option<String>,
    /// `{checkpoint_id, …}`: run from this checkpoint of the thread; an older one forks it.
    checkpoint: Option<Value>,
    /// The same, as the Python SDK's `checkpoint_id=` sends it.
    checkpoint_id: Option<String>,
    /// A URL POSTed the run when it ends (`server/webhook/`).
    webhook: Option<String>,
}

impl RunCreate {
    /// `kwargs` read as a run request, or why not.
    pub(crate) fn parse(kwargs: &Value) -> Result<RunCreate, RunsError> {
        serde_json::from_value(kwargs.clone()).map_err(|e| RunsError::Invalid(format!("invalid request body: {e}")))
    }
}

/// What a new run does when its thread already has runs (LangGraph's `multitask_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Multitask {
    /// A thread with a run (running or waiting for a worker) refuses the new one.
    Reject,
    /// The run waits for the runs before it to let go of the thread (the reference's default).
    Enqueue,
    /// The thread's runs are cancelled first.
    Interrupt,
    /// The thread's runs are cancelled and rolled back first.
    Rollback,
}

impl Multitask {
    fn parse(s: Option<&str>) -> Result<Multitask, RunsError> {
        Ok(match s {
            None | Some("enqueue") => Multitask::Enqueue,
            Some("reject") => Multitask::Reject,
            Some("interrupt") => Multitask::Interrupt,
            Some("rollback") => Multitask::Rollback,
            Some(other) => {
                return Err(RunsError::Invalid(format!(
                    "multitask_strategy must be `reject`, `enqueue`, `interrupt` or `rollback`, not `{other}`"
                )));
            }
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Multitask::Reject => "reject",
            Multitask::Enqueue => "enqueue",
            Multitask::Interrupt => "interrupt",
            Multitask::Rollback => "rollback",
        }
    }
}

/// `command.update` and `command.goto` as the thread edit they ask for.
pub(crate) type Edit = (Vec<(String, Value)>, Option<Vec<Goto>>);

/// A run a server left unfinished, made again from its row.
pub(crate) struct Resumed {
    pub row: RunRow,
    /// Whether the run held its thread when the server stopped: it continues the thread rather
    /// than applying its input (or answer) again.
    pub was_running: bool,
    /// A worker's claim of the run from a shared database: the thread's lease it took, and
    /// how long the lease lasts.
    pub claimed: Option<(crate::checkpoint::Lease, std::time::Duration)>,
    /// Where a claimed run's events are kept with its commits.
    pub journal: Option<Arc<dyn crate::engine::events::Journal>>,
    /// The run never executed before (a worker's claim of a run its log has nothing of): it
    /// has no trace to go on from.
    pub fresh: bool,
    /// Its thread as the claim read it (`None`: read when the run is created).
    pub view: Option<Box<crate::checkpoint::ThreadView>>,
}

impl Resumed {
    pub(crate) fn of(row: RunRow) -> Resumed {
        Resumed {
            was_running: row.status == RunStatus::Running,
            row,
            claimed: None,
            journal: None,
            fresh: false,
            view: None,
        }
    }
}

/// A run to create, checked against its graph: every field a run's start needs, none of them
/// HTTP's.
pub(crate) struct CreateRun {
    pub graph: Arc<Graph>,
    /// The client's thread; none: a thread of the run's own.
    pub thread: Option<String>,
    /// A run without a thread of the client's (recorded in its row, so that a resumed one
    /// still deletes its thread).
    pub stateless: bool,
    /// The run's thread is deleted when the run ends (stateless, without `on_completion: keep`).
    pub temporary: bool,
    /// A thread that does not exist is created (`if_not_exists: create`).
    pub create_thread: bool,
    pub strategy: Multitask,
    pub persist: Option<Persist>,
    pub gates: RunGates,
    /// `command.update` / `command.goto`, applied to the thread before it goes on.
    pub edit: Option<Edit>,
    /// `command.resume`: the answer to the thread's gate (or a map of gate ids to answers).
    pub resume: Option<Value>,
    /// New input (none: the thread goes on); what a workflow without an input schema is sent is
    /// dropped.
    pub input: Option<Value>,
    /// `config.configurable` values that override the workflow's `config`.
    pub config: Vec<(String, Value)>,
    pub context: Option<Value>,
    /// Where the run goes on from, when not the thread's head (a fork).
    pub checkpoint_id: Option<String>,
    pub recursion_limit: Option<u32>,
    /// The client's metadata of the run.
    pub metadata: Map<String, Value>,
    /// What its stream carries (`stream_mode`, as sent) and whether subgraphs' events too.
    pub stream_mode: Option<Value>,
    pub stream_subgraphs: bool,
    /// Its stream's frames carry ids and stay for readers that rejoin.
    pub resumable: bool,
    /// A client that goes away before the run has started cancels it.
    pub cancel_on_disconnect: bool,
    /// The request as sent: kept in the run's row.
    pub kwargs: Value,
    /// The run of that row again (same id, same thread), after a restart.
    pub resumed: Option<Resumed>,
    /// The user whose run it is (none: the server has no users, or the shared key's holder
    /// asked): stamped on its row and a thread it creates, its context's `user_id`, the owner
    /// of the long-term memory its `store` nodes reach.
    pub owner: Option<String>,
}

impl CreateRun {
    /// Makes the run `user`'s: its owner, and its context's `user_id` (over whatever the client
    /// sent, in the request its row keeps too) when the workflow has a context with room for
    /// one (a workflow that declares none takes none).
    pub(crate) fn owned_by(&mut self, user: &str) {
        self.owner = Some(user.to_string());
        let Some(schema) = self.graph.plan.context_schema() else {
            return;
        };
        let declared = schema.get("properties").is_some_and(|p| p.get("user_id").is_some());
        if !declared && schema.get("additionalProperties") == Some(&Value::Bool(false)) {
            return;
        }
        let mut context = match self.context.take() {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        context.insert("user_id".into(), json!(user));
        let context = Value::Object(context);
        if let Value::Object(k) = &mut self.kwargs {
            k.insert("context".into(), context.clone());
        }
        self.context = Some(context);
    }

    /// The run `kwargs` asks for on `thread` (none: a thread of its own), its assistant found
    /// among `graphs`.
    pub(crate) fn parse(graphs: &Graphs, thread: Option<String>, kwargs: Value) -> Result<CreateRun, RunsError> {
        let req = RunCreate::parse(&kwargs)?;
        let graph = find_assistant(graphs, &req.assistant_id)?;
        if let Some(url) = req
            .webhook
            .as_deref()
            .filter(|u| !u.is_empty() && !crate::compile::schedule::is_web_url(u))
        {
            return Err(RunsError::Invalid(format!(
                "webhook `{url}` is not an absolute http or https URL"
            )));
        }
        let strategy = Multitask::parse(req.multitask_strategy.as_deref())?;
        let persist = match req.durability.as_deref() {
            None => None,
            Some("sync") => Some(Persist::Sync),
            Some("async") => Some(Persist::Async),
            Some("exit") => Some(Persist::Exit),
            Some(other) => {
                return Err(RunsError::Invalid(format!(
                    "durability must be `sync`, `async` or `exit`, not `{other}`"
                )));
            }
        };
        let command = req.command.unwrap_or_default();
        let edit = commanded(&graph, command.update, command.goto)?;
        let gates = RunGates {
            before: node_set(&graph, "interrupt_before", req.interrupt_before.as_ref())?,
            after: node_set(&graph, "interrupt_after", req.interrupt_after.as_ref())?,
        };
        let (config, context) = configured(&graph, req.config.as_ref(), req.context.as_ref())?;
        let stateless = thread.is_none() || kwargs.get("stateless") == Some(&Value::Bool(true));
        let temporary = stateless && req.on_completion.as_deref() != Some("keep");
        // A workflow that declares no input takes none: what a client sends anyway (agent-chat-ui
        // sends its messages to every graph) is ignored, as LangGraph ignores keys it has no
        // channel for.
        let input = req.input.filter(|i| !i.is_null()).map(|i| {
            if graph.plan.input_schema().is_some() {
                i
            } else {
                json!({})
            }
        });
        let checkpoint_id = req.checkpoint_id.or_else(|| {
            req.checkpoint
                .as_ref()
                .and_then(|c| c.get("checkpoint_id"))
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        let recursion_limit = req
            .config
            .as_ref()
            .and_then(|c| c.get("recursion_limit"))
            .and_then(Value::as_u64)
            .map(|limit| u32::try_from(limit).unwrap_or(u32::MAX));
        Ok(CreateRun {
            graph,
            thread,
            stateless,
            temporary,
            create_thread: req.if_not_exists.as_deref() == Some("create"),
            strategy,
            persist,
            gates,
            edit,
            resume: command.resume,
            input,
            config,
            context,
            checkpoint_id,
            recursion_limit,
            metadata: req.metadata,
            stream_mode: req.stream_mode,
            stream_subgraphs: req.stream_subgraphs,
            resumable: req.stream_resumable,
            cancel_on_disconnect: req.on_disconnect.as_deref() != Some("continue"),
            kwargs,
            resumed: None,
            owner: None,
        })
    }

    /// The run of `row` again, on its thread, as its request asked.
    pub(crate) fn resumed(graphs: &Graphs, row: RunRow) -> Result<CreateRun, RunsError> {
        let mut run = CreateRun::parse(graphs, Some(row.thread_id.clone()), row.kwargs.clone())?;
        // The server that created the run stamped its owner.
        run.owner = crate::checkpoint::runs::owner_of(&row.metadata).map(str::to_string);
        run.resumed = Some(Resumed::of(row));
        Ok(run)
    }
}

/// The graph a run's `assistant_id` names: a graph's name or its assistant's id. A name no
/// graph has is refused as the reference refuses it (422); an unknown id is not found.
fn find_assistant(graphs: &Graphs, id: &str) -> Result<Arc<Graph>, RunsError> {
    if let Some(graph) = graphs.find(id) {
        return Ok(graph);
    }
    if uuid::Uuid::parse_str(id).is_ok() {
        return Err(RunsError::NotFound("Thread or assistant not found.".into()));
    }
    let mut names = graphs.ids();
    names.sort();
    Err(RunsError::Invalid(format!(
        "Invalid assistant: '{id}'. Must be either:\n- A valid assistant UUID, or\n- One of the registered graphs: {}",
        names.join(", ")
    )))
}

/// `interrupt_before` / `interrupt_after` of a request: `"*"` (every node) or node names of the
/// graph.
fn node_set(graph: &Graph, field: &str, value: Option<&Value>) -> Result<NodeSet, RunsError> {
    let names = match value {
        None | Some(Value::Null) => return Ok(NodeSet::None),
        Some(Value::String(all)) if all == "*" => return Ok(NodeSet::All),
        Some(Value::Array(names)) => names,
        Some(other) => {
            return Err(RunsError::Invalid(format!(
                "{field} is \"*\" or a list of node names, not {other}"
            )));
        }
    };
    let mut set = Vec::new();
    for name in names {
        match name.as_str() {
            Some(n) if graph.plan.node_by_name(n).is_some() => set.push(n.to_string()),
            _ => {
                return Err(RunsError::Invalid(format!(
                    "{field}: {name} is not a node of graph {}",
                    graph.graph_id
                )));
            }
        }
    }
    Ok(NodeSet::Named(set))
}

/// `update`: `{key: value}`, or LangGraph's `[[key, value], …]`; `goto`: a node or a `Send`
/// (`{"node": name, "input": argument}`), or a list of them. Each node must be one of `graph`'s
/// (or `END`), and a Send's one of its fan-out targets, whose tasks take the argument as their
/// item.
fn commanded(graph: &Graph, update: Option<Value>, goto: Option<Value>) -> Result<Option<Edit>, RunsError> {
    let bad_update = || RunsError::Invalid("command.update is an object, or a list of [key, value] pairs".into());
    let update: Vec<(String, Value)> = match update {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => m.into_iter().collect(),
        Some(Value::Array(pairs)) => pairs
            .into_iter()
            .map(|p| match p {
                Value::Array(kv) => match <[Value; 2]>::try_from(kv) {
                    Ok([Value::String(k), v]) => Some((k, v)),
                    _ => None,
                },
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(bad_update)?,
        Some(_) => return Err(bad_update()),
    };
    let target = |v: Value| -> Result<Goto, RunsError> {
        let goto = match v {
            Value::String(node) => Goto::Node(node),
            Value::Object(mut send) => match send.remove("node") {
                Some(Value::String(node)) => Goto::Send {
                    node,
                    arg: send.remove("input").unwrap_or(Value::Null),
                },
                _ => {
                    return Err(RunsError::Invalid(
                        "command.goto: a Send is {\"node\": name, \"input\": argument}".into(),
                    ));
                }
            },
            other => {
                return Err(RunsError::Invalid(format!(
                    "command.goto names a node or a Send ({{\"node\", \"input\"}}), not {other}"
                )));
            }
        };
        match goto_target(&graph.plan, &goto) {
            Ok(_) => Ok(goto),
            Err(EditError::NoSuchNode { node, .. }) => Err(RunsError::Invalid(format!(
                "command.goto: `{node}` is not a node of graph {}",
                graph.graph_id
            ))),
            Err(e) => Err(RunsError::Invalid(format!("command.goto: {e}"))),
        }
    };
    let goto = match goto {
        None | Some(Value::Null) => None,
        Some(Value::Array(targets)) => Some(targets.into_iter().map(target).collect::<Result<Vec<_>, _>>()?),
        Some(one) => Some(vec![target(one)?]),
    };
    Ok((!update.is_empty() || goto.is_some()).then_some((update, goto)))
}

/// A run's `config.configurable` and `context` as the workflow reads them: each configurable
/// value whose name is a key of the workflow's `config` overrides it for the run (as `--set`
/// does); `context` (or, where the workflow's context schema declares them, configurable
/// values such as `user_id`) is the run's context. Other configurable values are LangGraph's
/// own or the client's, and are ignored, as LangGraph ignores what no node reads.
type Configured = (Vec<(String, Value)>, Option<Value>);

fn configured(graph: &Graph, config: Option<&Value>, context: Option<&Value>) -> Result<Configured, RunsError> {
    let configurable = match config.map(|c| c.get("configurable")) {
        None | Some(None) | Some(Some(Value::Null)) => Map::new(),
        Some(Some(Value::Object(m))) => m.clone(),
        Some(Some(other)) => {
            return Err(RunsError::Invalid(format!(
                "config.configurable is an object, not {other}"
            )));
        }
    };
    let known = graph.plan.config().as_object().cloned().unwrap_or_default();
    let overrides: Vec<(String, Value)> = configurable
        .iter()
        .filter(|(k, _)| known.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let declared: Vec<String> = graph
        .plan
        .context_schema()
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let mut ctx = match context {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(RunsError::Invalid(format!("context is an object, not {other}"))),
    };
    for (k, v) in &configurable {
        if declared.contains(k) && !ctx.contains_key(k) {
            ctx.insert(k.clone(), v.clone());
        }
    }
    Ok((overrides, (!ctx.is_empty()).then_some(Value::Object(ctx))))
}
