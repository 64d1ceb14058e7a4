//! Rendering the event stream on stderr: a live view for people, or JSON lines.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use serde_json::Value;

use crate::engine::events::{Envelope, Event};

/// Renders events on stderr as they come.
pub(super) struct Renderer {
    jsonl: bool,
    /// Tokens are being written on the current line.
    streaming: bool,
    /// The thread of each run that started, by namespace (`None`: the run itself).
    threads: HashMap<Option<Arc<str>>, String>,
    /// On JSON lines, the run's own `run_end`, written by [`Renderer::finish`] after whatever
    /// the CLI says once the run is over, so that it is the stream's last line.
    last: Option<String>,
}

impl Renderer {
    pub(super) fn new(jsonl: bool) -> Renderer {
        Renderer {
            jsonl,
            streaming: false,
            threads: HashMap::new(),
            last: None,
        }
    }

    pub(super) fn render(&mut self, e: &Envelope) {
        let mut err = std::io::stderr().lock();
        if self.jsonl {
            let Ok(mut line) = serde_json::to_value(e) else {
                return;
            };
            // Which run a line is about: `ns` names a subgraph's (absent: the run's own), and
            // a run's end names its thread as its start does, so a child's `run_end` (they come
            // in the middle of the stream, as the child ends inside its parent's step) is
            // never taken for the run's.
            match &e.event {
                Event::RunStart { thread_id, .. } => {
                    self.threads.insert(e.ns.clone(), thread_id.clone());
                }
                Event::RunEnd { .. } => {
                    if let (Some(thread), Some(fields)) = (self.threads.get(&e.ns), line.as_object_mut()) {
                        fields.insert("thread_id".into(), Value::String(thread.clone()));
                    }
                    if e.ns.is_none() {
                        self.last = Some(line.to_string());
                        return;
                    }
                }
                _ => {}
            }
            let _ = writeln!(err, "{line}");
            return;
        }
        if self.streaming && !matches!(e.event, Event::Token { .. }) {
            let _ = writeln!(err);
            self.streaming = false;
        }
        let line = match &e.event {
            Event::RunStart {
                thread_id,
                workflow,
                resumed,
                ..
            } => {
                let name = std::path::Path::new(workflow)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Some(format!(
                    "▶ {} {name}  (thread {thread_id})",
                    if *resumed { "resuming" } else { "running" }
                ))
            }
            Event::StepStart { step, nodes, .. } => Some(format!("step {step}: {}", nodes.join(", "))),
            Event::NodeEnd {
                node,
                duration_ms,
                keys,
                cached,
                cache_hit,
                ..
            } => Some(format!(
                "  ✓ {node}{} {}",
                if *cached {
                    " (finished before, not re-run)".to_string()
                } else if *cache_hit {
                    " (cached result, not run)".to_string()
                } else {
                    format!(" ({duration_ms:.0} ms)")
                },
                if keys.is_empty() {
                    String::new()
                } else {
                    format!("→ {}", keys.join(", "))
                }
            )),
            Event::Token { text, .. } => {
                if !self.streaming {
                    let _ = write!(err, "  │ ");
                    self.streaming = true;
                }
                let _ = write!(err, "{}", text.replace('\n', "\n  │ "));
                None
            }
            Event::Custom { node, event, data } => Some(format!("  • {node}: {event} {}", short(data))),
            Event::Retry {
                node,
                attempt,
                error,
                delay_ms,
                ..
            } => Some(format!(
                "  ↻ {node}: attempt {attempt} failed ({error}); retrying in {:.1}s",
                delay_ms / 1000.0
            )),
            Event::Error { node, message, .. } => Some(format!(
                "  ✗ {}{message}",
                node.as_ref().map(|n| format!("{n}: ")).unwrap_or_default()
            )),
            Event::Interrupt { node, payload, .. } => {
                let message = payload.get("message").and_then(Value::as_str).unwrap_or("");
                let mut s = format!("⏸ waiting at {node}");
                if !message.is_empty() {
                    s.push_str(&format!(": {message}"));
                }
                if let Some(p) = payload.get("payload") {
                    s.push_str(&format!(
                        "\n  {}",
                        serde_json::to_string_pretty(p)
                            .unwrap_or_default()
                            .replace('\n', "\n  ")
                    ));
                }
                Some(s)
            }
            Event::RunEnd {
                status,
                steps,
                duration_ms,
                turn_usage,
                thread_usage,
            } => Some(format!(
                "■ {status} after {steps} step{} in {:.0} ms{}{}",
                if *steps == 1 { "" } else { "s" },
                duration_ms,
                if turn_usage.calls > 0 {
                    format!(
                        "; this turn {} LLM call(s), {} tokens, cost {:.4}",
                        turn_usage.calls, turn_usage.total_tokens, turn_usage.cost
                    )
                } else {
                    String::new()
                },
                if thread_usage.calls > turn_usage.calls {
                    format!(
                        "; the thread {} call(s), {} tokens, cost {:.4}",
                        thread_usage.calls, thread_usage.total_tokens, thread_usage.cost
                    )
                } else {
                    String::new()
                }
            )),
            Event::ToolEnd {
                node,
                tool,
                duration_ms,
                error,
                ..
            } => Some(match error {
                None => format!("  ⚙ {node}: {tool} ({duration_ms:.0} ms)"),
                Some(e) => format!("  ⚙ {node}: {tool} failed ({duration_ms:.0} ms): {e}"),
            }),
            Event::Http {
                node,
                method,
                url,
                status,
                duration_ms,
                error,
                ..
            } => Some(match (status, error) {
                (Some(status), _) => format!("  ↗ {node}: {method} {url} → {status} ({duration_ms:.0} ms)"),
                (None, e) => format!(
                    "  ↗ {node}: {method} {url} failed ({duration_ms:.0} ms): {}",
                    e.as_deref().unwrap_or_default()
                ),
            }),
            // Model calls show as their tokens, and their usage in the run's end.
            Event::NodeStart { .. }
            | Event::StateUpdate { .. }
            | Event::StepEnd { .. }
            | Event::Usage { .. }
            | Event::ModelStart { .. }
            | Event::ModelEnd { .. }
            | Event::ToolStart { .. } => None,
        };
        if let Some(line) = line {
            // A subgraph's lines are indented one level per nesting.
            let depth = e.ns.as_deref().map_or(0, |ns| ns.split('|').count());
            let indent = "    ".repeat(depth);
            let _ = writeln!(err, "{indent}{}", line.replace('\n', &format!("\n{indent}")));
        }
    }
}

impl Renderer {
    /// Writes what was held back: the run's own `run_end` on JSON lines.
    pub(super) fn finish(&mut self) {
        if let Some(line) = self.last.take() {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
    }
}

/// What the CLI itself says next to the event stream: a plain line for people, or on a
/// JSON-lines stream an object of type `kind` with `fields`, so that every line of that stream
/// is JSON.
pub(super) fn notice(jsonl: bool, kind: &str, fields: Value, text: &str) {
    let mut err = std::io::stderr().lock();
    if jsonl {
        let mut line = serde_json::json!({"type": kind, "ts": crate::clock::now()});
        if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), fields) {
            line.extend(fields);
        }
        let _ = writeln!(err, "{line}");
    } else {
        let _ = writeln!(err, "{text}");
    }
}

/// An error, as [`notice`] says it.
pub(super) fn error(jsonl: bool, message: &str) {
    notice(
        jsonl,
        "error",
        serde_json::json!({"message": message}),
        &format!("error: {message}"),
    );
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        format!("{}…", s.chars().take(120).collect::<String>())
    } else {
        s
    }
}
