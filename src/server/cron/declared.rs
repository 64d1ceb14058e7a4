//! The schedules workflows declare (`serve.schedules`), registered as crons whenever the
//! server loads its workflows (at start and on each reload): idempotently, so that reloads and
//! many processes loading the same workflows make one cron per declared schedule.
//!
//! A declared schedule's cron has a fixed id (a UUIDv5 of its graph and its place in the
//! list) and records the graph that declares it. A new one is inserted unless it exists (one
//! process inserts it); one whose declaration changed is rewritten, keeping its next tick
//! unless its schedule or time zone changed; one whose graph no longer declares it, or is no
//! longer served, is deleted. Changes made to it through the API last until the next load.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::checkpoint::{CheckpointError, Checkpointer, CronRow};
use crate::compile::schedule::Schedule;
use crate::server::Graphs;

/// Registers the schedules `graphs` declare, at `now` (milliseconds since the epoch).
pub(crate) fn register(graphs: &Graphs, store: &dyn Checkpointer, now: i64) -> Result<(), CheckpointError> {
    let existing = store.list_crons()?;
    let mut wanted = HashSet::new();
    let at = crate::clock::at_ms(now);
    for graph in graphs.all() {
        for (i, s) in graph.plan.schedules().iter().enumerate() {
            let cron_id = uuid::Uuid::new_v5(
                &uuid::Uuid::NAMESPACE_URL,
                format!("runner:schedule:{}:{i}", graph.graph_id).as_bytes(),
            )
            .to_string();
            wanted.insert(cron_id.clone());
            let mut configurable: Map<String, Value> = s.config.clone();
            configurable.insert("cron_id".into(), json!(cron_id));
            let mut payload = Map::from_iter([
                ("assistant_id".to_string(), json!(graph.assistant_id)),
                ("config".into(), json!({"configurable": configurable})),
                ("metadata".into(), Value::Object(s.metadata.clone())),
            ]);
            for (name, value) in [
                ("input", s.input.clone()),
                ("context", s.context.clone()),
                ("webhook", s.webhook.clone().map(Value::String)),
            ] {
                if let Some(v) = value {
                    payload.insert(name.into(), v);
                }
            }
            if s.thread.is_some() {
                // A declared thread is made by the schedule's first run.
                payload.insert("if_not_exists".into(), json!("create"));
            }
            let next = Schedule::parse(&s.cron, s.timezone.as_deref())
                .ok()
                .and_then(|sched| sched.next_after(now));
            let row = CronRow {
                cron_id: cron_id.clone(),
                assistant_id: graph.assistant_id.clone(),
                thread_id: s.thread.clone(),
                owner: None,
                schedule: s.cron.clone(),
                timezone: s.timezone.clone(),
                payload: Value::Object(payload),
                metadata: Value::Object(s.metadata.clone()),
                on_run_completed: s.thread.is_none().then(|| "delete".to_string()),
                enabled: true,
                end_ms: s.until,
                next_run_at: next,
                declared_by: Some(graph.graph_id.clone()),
                created_at: at.clone(),
                updated_at: at.clone(),
            };
            match existing.iter().find(|c| c.cron_id == cron_id) {
                None => {
                    // Of many processes loading the workflow at once, one inserts it.
                    store.insert_cron(&row)?;
                }
                Some(old) if same_declaration(old, &row) => {}
                Some(old) => {
                    let moved = old.schedule != row.schedule || old.timezone != row.timezone;
                    let kept = CronRow {
                        next_run_at: if moved { row.next_run_at } else { old.next_run_at },
                        created_at: old.created_at.clone(),
                        ..row
                    };
                    store.put_cron(&kept)?;
                }
            }
        }
    }
    for c in existing {
        if c.declared_by.is_some() && !wanted.contains(&c.cron_id) {
            store.delete_cron(&c.cron_id)?;
        }
    }
    Ok(())
}

/// Whether a stored declared cron already says what `row` says (its next tick, times and
/// whether it is on aside).
fn same_declaration(old: &CronRow, row: &CronRow) -> bool {
    old.assistant_id == row.assistant_id
        && old.thread_id == row.thread_id
        && old.schedule == row.schedule
        && old.timezone == row.timezone
        && old.payload == row.payload
        && old.metadata == row.metadata
        && old.on_run_completed == row.on_run_completed
        && old.end_ms == row.end_ms
        && old.declared_by == row.declared_by
        && old.enabled
}
