//! The run's one typed event stream. The engine and the node kinds send (through
//! `NodeCtx::events`: model calls, tool calls, `http` requests); the terminal view,
//! `--stream jsonl`, the server's stream modes, its run traces, its metrics and the event log
//! of a database many processes share receive. The engine never prints.
//!
//! The JSON form (`--stream jsonl`) is stable: one object per line with `type`, `ts`
//! (RFC 3339 UTC), `elapsed_ms` and the fields of the variant below, in snake_case.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

pub use crate::providers::Usage;

/// Something that happened in a run.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    RunStart {
        thread_id: String,
        workflow: String,
        resumed: bool,
        /// The checkpoint the run goes on from (a new turn's: the one after its input).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        checkpoint_id: String,
    },
    StepStart {
        step: i64,
        tasks: Vec<String>,
        /// The tasks' nodes, in the same order (a fan-out item's as `node#index`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        nodes: Vec<String>,
    },
    NodeStart {
        step: i64,
        node: String,
        task_id: String,
        /// A fan-out task's item (cut to [`PAYLOAD_LIMIT`] bytes of JSON).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        item: Option<Value>,
    },
    /// A task ended. `cached`: its result was stored before a crash and is taken from the
    /// store, not run again; `cache_hit`: the node's cache (`cache:`) had its result, so it did
    /// not run.
    NodeEnd {
        step: i64,
        node: String,
        task_id: String,
        duration_ms: f64,
        keys: Vec<String>,
        /// What the task wrote, by key, before the reducers: the node's own update (a node
        /// appending `["b"]` wrote `["b"]`, whatever the key holds after the step).
        #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
        writes: serde_json::Map<String, Value>,
        cached: bool,
        /// How the task ended (a task that stopped at a gate or failed ends too, writing
        /// nothing).
        #[serde(default, skip_serializing_if = "TaskOutcome::is_done")]
        outcome: TaskOutcome,
        cache_hit: bool,
    },
    /// The keys a step changed, with their new values.
    StateUpdate {
        step: i64,
        values: serde_json::Map<String, Value>,
    },
    /// A piece of a model's reply as it streams. `message_id` is the id the reply gets when
    /// the task writes it to an `add_messages` key without one ([`super::message_id`]).
    Token {
        node: String,
        task_id: String,
        message_id: String,
        text: String,
    },
    Custom {
        node: String,
        event: String,
        data: Value,
    },
    Interrupt {
        node: String,
        task_id: String,
        payload: Value,
    },
    Retry {
        node: String,
        task_id: String,
        attempt: u32,
        error: String,
        delay_ms: f64,
    },
    Error {
        node: Option<String>,
        class: Option<String>,
        message: String,
    },
    Usage {
        node: String,
        usage: Usage,
    },
    /// A model call began: one request to a provider (an llm node's call, a repair of its
    /// reply, a reranker's). Its prompt is not carried unless content capture is on
    /// (`RUNNER_TRACE_CONTENT`), so the stream stays small.
    ModelStart {
        node: String,
        task_id: String,
        /// Unique to the call (a UUIDv7): its `model_end` names it too.
        call_id: String,
        /// The model profile the node names, and the model and provider it stands for.
        profile: String,
        model: String,
        provider: String,
        /// The messages sent, only with content capture on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        messages: Option<Value>,
    },
    /// A model call ended: how long it took, what it spent (priced by its profile), and its
    /// reply (text cut to [`REPLY_TEXT_LIMIT`] bytes, and tool calls) or why it failed.
    ModelEnd {
        node: String,
        task_id: String,
        call_id: String,
        profile: String,
        model: String,
        duration_ms: f64,
        usage: Usage,
        /// `{content, tool_calls, truncated?}`; none when the call failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A tool call began (a `tools` node's, an agent's): the tool and its arguments (cut to
    /// [`PAYLOAD_LIMIT`] bytes).
    ToolStart {
        node: String,
        task_id: String,
        /// The model's id for the call (`call_1`).
        call_id: String,
        tool: String,
        args: Value,
    },
    /// A tool call ended: its result (cut to [`PAYLOAD_LIMIT`] bytes) or why it failed.
    ToolEnd {
        node: String,
        task_id: String,
        call_id: String,
        tool: String,
        duration_ms: f64,
        #[serde(default)]
        result: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// An `http` node's request, once answered (or failed): its URL with credentials
    /// redacted.
    Http {
        node: String,
        task_id: String,
        method: String,
        url: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        duration_ms: f64,
        #[serde(default)]
        bytes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    StepEnd {
        step: i64,
        checkpoint_id: String,
        duration_ms: f64,
        /// The checkpoint itself, in a run's log on a shared database (committed with it): a
        /// reader on another process has it without reading it back. Absent elsewhere.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint: Option<std::sync::Arc<crate::checkpoint::Checkpoint>>,
    },
    RunEnd {
        status: String,
        steps: i64,
        duration_ms: f64,
        /// What this turn of the thread spent (its resumes included).
        turn_usage: Usage,
        /// What the thread has spent over all its turns.
        thread_usage: Usage,
    },
}

/// The most of a model's reply text a `model_end` event carries, in bytes.
pub const REPLY_TEXT_LIMIT: usize = 8 * 1024;
/// The most of a tool call's arguments or result an event carries, as JSON text in bytes.
pub const PAYLOAD_LIMIT: usize = 4 * 1024;

/// `value`, or when its JSON text is longer than `limit` bytes, that text cut at `limit` (on
/// a character boundary) and how long it was: what an event or a trace carries of a payload
/// that may be large.
pub fn bounded(value: &Value, limit: usize) -> (Value, Option<usize>) {
    let text = match value {
        Value::String(s) if s.len() <= limit => return (value.clone(), None),
        Value::String(s) => s.clone(),
        other => match serde_json::to_string(other) {
            Ok(t) if t.len() <= limit => return (value.clone(), None),
            Ok(t) => t,
            Err(_) => return (Value::Null, None),
        },
    };
    (Value::String(cut(&text, limit).to_string()), Some(text.len()))
}

/// The first `limit` bytes of `text` at most, ending on a character boundary.
pub fn cut(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// How a task ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskOutcome {
    /// It finished: its writes are the step's.
    #[default]
    Done,
    /// It stopped at a gate.
    Interrupted,
    /// It failed.
    Failed,
}

impl TaskOutcome {
    fn is_done(&self) -> bool {
        *self == TaskOutcome::Done
    }
}

/// An event with when it happened. Read back from its JSON by a reader on another process.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Envelope {
    pub ts: String,
    pub elapsed_ms: f64,
    /// The subgraph the event comes from (`node:task_id` segments joined by `|`); absent for
    /// the top-level graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns: Option<Arc<str>>,
    #[serde(flatten)]
    pub event: Event,
}

/// The receiving end of [`Events::channel`]: the run's events in the order they happened.
///
/// They wait in the channel boxed: it allocates room for its items 32 at a time, which for
/// envelopes themselves (176 bytes) is 5.5 KiB for every run from its first event, and
/// 256 bytes for boxes.
#[derive(Debug)]
pub struct Receiver(mpsc::UnboundedReceiver<Box<Envelope>>);

impl Receiver {
    /// The next event, waiting for it; `None` once every sender is gone and all were read.
    /// Cancel-safe: an event is taken only when returned.
    pub async fn recv(&mut self) -> Option<Envelope> {
        self.0.recv().await.map(|e| *e)
    }

    /// The next event if one waits.
    pub fn try_recv(&mut self) -> Result<Envelope, mpsc::error::TryRecvError> {
        self.0.try_recv().map(|e| *e)
    }
}

/// A function that receives every event as it happens.
pub type Sink = Arc<dyn Fn(Envelope) + Send + Sync>;

/// A run's events kept with its commits: given by whoever runs the engine and logs the events
/// in the database its checkpoints are in (a worker of a shared database), so that a commit
/// and the events that tell of it are durable together. Every event is recorded as it is sent,
/// and the run's persister commits through the journal: the events that tell of a commit
/// (a task's `node_end`, a step's `step_end`, sent once it is durable) go into that commit's
/// transaction with everything recorded before them, so whoever reads the log never finds a
/// commit it does not tell of.
pub trait Journal: Send + Sync {
    /// An event, as it is sent.
    fn record(&self, envelope: &Envelope);

    /// Commits `puts` as [`Checkpointer::put_batch`](crate::checkpoint::Checkpointer::put_batch)
    /// does (`synced` false: as `put_batch_unsynced`, whose answer it gives), in one transaction
    /// with the events recorded so far and `told`, the events that tell of what `puts` store.
    /// A commit that fails logs none of them.
    fn commit(
        &self,
        puts: Vec<crate::checkpoint::Put>,
        synced: bool,
        told: &[Envelope],
    ) -> Result<bool, crate::checkpoint::CheckpointError>;

    /// The next [`Journal::commit`] is on its way from another thread: whatever else writes the
    /// journal's events (between commits) leaves what is recorded from now on for that commit
    /// to take, so no event reaches the log before the commit that comes ahead of it.
    fn commit_coming(&self) {}
}

/// Where a run's events go: nowhere, a channel (collected later), or a sink called in place
/// (so a slow reader slows the run instead of letting events pile up in memory).
#[derive(Clone)]
pub struct Events {
    to: To,
    started: Instant,
    /// Where in the graph the sender runs: empty at the top, `node:task_id` segments joined by
    /// `|` inside subgraphs (LangGraph's namespace).
    ns: Option<Arc<str>>,
    /// Where `Custom` events go when not under `ns`: a subgraph whose custom events are its
    /// parent task's own (see [`Events::nested_forwarding`]) sends them under its parent's.
    custom_ns: Option<Option<Arc<str>>>,
    /// Where the events are kept with the run's commits, if anywhere.
    journal: Option<Arc<dyn Journal>>,
}

#[derive(Clone)]
enum To {
    Nowhere,
    Channel(mpsc::UnboundedSender<Box<Envelope>>),
    Sink(Sink),
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").field("on", &self.is_on()).finish()
    }
}

impl Default for Events {
    fn default() -> Self {
        Events::none()
    }
}

impl Events {
    /// A sink that drops everything.
    pub fn none() -> Events {
        Events {
            to: To::Nowhere,
            started: Instant::now(),
            ns: None,
            custom_ns: None,
            journal: None,
        }
    }

    /// A sink and the receiving end.
    pub fn channel() -> (Events, Receiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Events {
                to: To::Channel(tx),
                started: Instant::now(),
                ns: None,
                custom_ns: None,
                journal: None,
            },
            Receiver(rx),
        )
    }

    /// Events delivered to `sink` as they happen, on the sending thread.
    pub fn sink(sink: Sink) -> Events {
        Events {
            to: To::Sink(sink),
            started: Instant::now(),
            ns: None,
            custom_ns: None,
            journal: None,
        }
    }

    /// The same destination, for events sent from inside the task `task_id` of `node` (a
    /// subgraph's run): they carry the namespace `…|node:task_id`.
    pub fn nested(&self, node: &str, task_id: &str) -> Events {
        let segment = format!("{node}:{task_id}");
        Events {
            to: self.to.clone(),
            started: self.started,
            ns: Some(match &self.ns {
                Some(outer) => format!("{outer}|{segment}").into(),
                None => segment.into(),
            }),
            custom_ns: None,
            journal: self.journal.clone(),
        }
    }

    /// [`Events::nested`], with the child's custom events sent as this task's own: under this
    /// sender's namespace (as a LangGraph node that streams its subgraph's custom events and
    /// writes each to its own stream writer), so a client that does not ask for subgraphs'
    /// events gets them, and one that does gets them once.
    pub fn nested_forwarding(&self, node: &str, task_id: &str) -> Events {
        Events {
            custom_ns: Some(self.custom_ns.clone().unwrap_or_else(|| self.ns.clone())),
            ..self.nested(node, task_id)
        }
    }

    pub fn is_on(&self) -> bool {
        !matches!(self.to, To::Nowhere)
    }

    /// The same destination, every event recorded in `journal` too (see [`Journal`]).
    pub fn journaled(self, journal: Arc<dyn Journal>) -> Events {
        Events {
            journal: Some(journal),
            ..self
        }
    }

    /// The journal the run's commits go through, if it has one.
    pub(crate) fn journal(&self) -> Option<&Arc<dyn Journal>> {
        self.journal.as_ref()
    }

    /// `event` as it would be sent now, without sending it: for an event told once a commit
    /// is durable, recorded with that commit and delivered after it by [`Events::forward`].
    pub(crate) fn stamp(&self, event: Event) -> Envelope {
        let ns = match (&event, &self.custom_ns) {
            (Event::Custom { .. }, Some(ns)) => ns.clone(),
            _ => self.ns.clone(),
        };
        Envelope {
            ts: crate::clock::now(),
            elapsed_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            ns,
            event,
        }
    }

    /// Delivers an envelope as it is, its time and namespace kept: a run's events relayed from
    /// another process. `false` once nobody receives them any more.
    pub fn forward(&self, envelope: Envelope) -> bool {
        match &self.to {
            To::Nowhere => false,
            To::Channel(tx) => tx.send(Box::new(envelope)).is_ok(),
            To::Sink(f) => {
                f(envelope);
                true
            }
        }
    }

    pub fn send(&self, event: Event) {
        if matches!(self.to, To::Nowhere) && self.journal.is_none() {
            return;
        }
        let envelope = self.stamp(event);
        if let Some(journal) = &self.journal {
            journal.record(&envelope);
        }
        match &self.to {
            To::Nowhere => {}
            // A closed receiver means nobody is listening any more; the run goes on.
            To::Channel(tx) => {
                let _ = tx.send(Box::new(envelope));
            }
            To::Sink(f) => f(envelope),
        }
    }
}
