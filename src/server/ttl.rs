//! Threads' time to live, as LangGraph's API offers it: `ttl: {ttl: minutes, strategy:
//! "delete"}` (or a number of minutes) when a thread is created or patched, a server-wide
//! default for threads created without one (`--thread-ttl`), `GET /threads/{id}?include=ttl`,
//! and the sweeper every server and worker runs, which deletes a thread once it has been idle
//! for its time to live, as `DELETE /threads/{id}` would.
//!
//! A thread's expiry is kept in the API's record of it, in the database, and restarted whenever
//! the API touches the thread (a patch, a run created on it). The sweeper removes a thread only
//! if, in the removal's own transaction, the expiry has passed, nothing of the thread (its
//! record, its state, its runs) changed within its time to live, no run on it is active and no
//! live lease holds it: of several processes sweeping one database, exactly one deletes a given
//! thread, and a thread used meanwhile stays. "Now" is the database's clock on PostgreSQL (read
//! from it at each sweep), so processes whose clocks disagree do not sweep a thread early; on
//! SQLite it is the process's. The thread's crons go in the same transaction.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Clock;
use super::http::ApiError;
use crate::checkpoint::{Checkpointer, Removal, Removed, ThreadTtl};

/// The only strategy runner has: the thread is deleted whole.
const DELETE: &str = "delete";

/// How many expired threads one sweep looks at, at most (LangGraph's `sweep_limit`).
const SWEEP_LIMIT: usize = 1000;

/// A server's thread TTL settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThreadTtls {
    /// The time to live of a thread created without one, in minutes (none: it lives until
    /// deleted).
    pub default_minutes: Option<f64>,
    /// How often the sweeper looks for expired threads.
    pub sweep_every: Duration,
}

impl Default for ThreadTtls {
    fn default() -> Self {
        ThreadTtls {
            default_minutes: None,
            // LangGraph's `sweep_interval_minutes` default.
            sweep_every: Duration::from_secs(5 * 60),
        }
    }
}

/// A request's `ttl`: a number of minutes, or `{ttl, strategy}` (`strategy` `delete`, the
/// default). `null` or absent: none given.
pub(crate) fn parse(value: Option<&Value>) -> Result<Option<f64>, ApiError> {
    let (minutes, strategy) = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => (n.as_f64(), None),
        Some(Value::Object(m)) => (
            m.get("ttl").and_then(Value::as_f64),
            m.get("strategy").and_then(Value::as_str),
        ),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "ttl must be a number of minutes or {{\"ttl\": minutes, \"strategy\": \"delete\"}}, not {other}"
            )));
        }
    };
    if let Some(s) = strategy.filter(|s| *s != DELETE) {
        return Err(ApiError::invalid(format!(
            "Invalid thread TTL strategy: {s}. Expected 'delete' (runner has no other)"
        )));
    }
    match minutes {
        Some(m) if m.is_finite() && m > 0.0 => Ok(Some(m)),
        _ => Err(ApiError::invalid("ttl.ttl must be a number of minutes more than 0")),
    }
}

/// The time to live `minutes` gives, starting now.
pub(crate) fn starting(minutes: f64) -> ThreadTtl {
    ThreadTtl::starting(DELETE, minutes, crate::clock::now_ms())
}

/// A thread's time to live as `?include=ttl` shows it (the reference's `ttl` field).
pub(crate) fn shown(ttl: &ThreadTtl) -> Value {
    json!({
        "strategy": ttl.strategy,
        "ttl_minutes": ttl.minutes,
        "expires_at": crate::clock::at_ms(ttl.expires_at_ms),
    })
}

/// Deletes the threads whose time to live ran out by `now_ms` (the process's clock) and that
/// have been idle that long, as `DELETE /threads/{id}` would; a thread in use is left for a
/// later sweep. On a database with a clock of its own (PostgreSQL), "now" is the database's,
/// however far the process's is off. Returns the ids this process deleted.
pub(crate) fn sweep(store: &dyn Checkpointer, now_ms: i64) -> crate::checkpoint::Result<Vec<String>> {
    let now_ms = store.expiry_clock_ms(now_ms)?;
    let mut deleted = Vec::new();
    for thread_id in store.expired_threads(now_ms, SWEEP_LIMIT)? {
        let Some(ttl) = store.get_thread_meta(&thread_id)?.and_then(|m| m.ttl) else {
            continue;
        };
        let removal = Removal {
            expired_by: Some(now_ms),
            idle_before: Some(crate::clock::at_ms(
                now_ms.saturating_sub(ThreadTtl::millis(ttl.minutes)),
            )),
        };
        let claim = crate::engine::own_claim(Duration::from_secs(30));
        match store.remove_thread(&thread_id, &removal, &claim)? {
            Removed::Removed => deleted.push(thread_id),
            Removed::Busy(why) => tracing::debug!(thread_id, why, "an expired thread is in use: kept"),
            Removed::Missing | Removed::Kept => {}
        }
    }
    Ok(deleted)
}

/// Sweeps every `every` by `clock` (the scheduler's: the system's, or a test's clock file),
/// for as long as the task lives.
pub(crate) async fn sweeper(store: Arc<dyn Checkpointer>, every: Duration, clock: Clock) {
    loop {
        tokio::time::sleep(every).await;
        let Some(now) = clock.now_ms() else {
            continue;
        };
        let s = store.clone();
        match tokio::task::spawn_blocking(move || sweep(&*s, now)).await {
            Ok(Ok(deleted)) if !deleted.is_empty() => {
                tracing::info!(deleted = deleted.len(), "expired threads deleted");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "the thread TTL sweep failed"),
            _ => {}
        }
    }
}
