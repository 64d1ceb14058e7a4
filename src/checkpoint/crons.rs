//! Schedules (the LangGraph API's crons) and webhook deliveries, beside the runs: a cron is a
//! row whose `next_run_at` says when it fires next, and a tick is claimed by moving it on with
//! a conditional update (`… WHERE next_run_at = the value read`), so of every process serving
//! the database exactly one claims each tick. A delivery is a row written when its run ends
//! and taken by one process at a time (`claimed_until`), so a delivery outlives the process
//! that made it and is retried by whichever comes next.
//!
//! A [`CronStore`] is part of every [`super::Checkpointer`]. This module is the format, shared
//! by every backend: the traits, their types and their stored shape; the SQL is the
//! backends' (`sqlite/crons.rs`, `postgres/crons.rs`, `memory/crons.rs`).
//!
//! Architecture Invariant: like the rest of checkpoint/, this knows nothing of schedules'
//! syntax, the server or HTTP: a cron's payload and a delivery's body are opaque JSON here, and
//! every time is given by the caller (the server's clock, which a test may drive).

use serde_json::Value;

use super::{CheckpointError, Result};

/// One cron.
#[derive(Debug, Clone, PartialEq)]
pub struct CronRow {
    pub cron_id: String,
    pub assistant_id: String,
    /// The thread every run continues; none: each run has a thread of its own.
    pub thread_id: Option<String>,
    /// Who created it (the API's `user_id`); none until callers are known.
    pub owner: Option<String>,
    /// The cron expression.
    pub schedule: String,
    /// IANA time zone; none: UTC.
    pub timezone: Option<String>,
    /// The run request each tick starts.
    pub payload: Value,
    /// A JSON object.
    pub metadata: Value,
    /// A cron without a thread: `delete` or `keep` each run's thread.
    pub on_run_completed: Option<String>,
    pub enabled: bool,
    /// Milliseconds since the epoch: no tick at or after it fires.
    pub end_ms: Option<i64>,
    /// Milliseconds since the epoch of the next tick; none: no tick is left.
    pub next_run_at: Option<i64>,
    /// The graph that declares it (`serve.schedules`); none: made through the API or the CLI.
    pub declared_by: Option<String>,
    /// RFC 3339 UTC.
    pub created_at: String,
    pub updated_at: String,
}

/// Crons, and the webhooks of ended runs. Every method is durable when it returns.
pub trait CronStore: Send + Sync {
    /// Creates or replaces a cron.
    fn put_cron(&self, cron: &CronRow) -> Result<()>;

    /// Creates a cron unless one has its id: whether it did. One atomic step, so that of many
    /// processes registering one declared schedule exactly one creates it.
    fn insert_cron(&self, cron: &CronRow) -> Result<bool>;

    fn get_cron(&self, cron_id: &str) -> Result<Option<CronRow>>;

    /// Every cron, oldest first.
    fn list_crons(&self) -> Result<Vec<CronRow>>;

    /// Deletes a cron; whether it existed.
    fn delete_cron(&self, cron_id: &str) -> Result<bool>;

    /// The enabled crons whose next tick is at or before `now` (milliseconds) and before their
    /// end.
    fn due_crons(&self, now: i64) -> Result<Vec<CronRow>>;

    /// Claims the tick `at` of a cron: moves its next tick from `at` to `next` (none: no tick
    /// is left) if it is still `at`, atomically. Whether this call moved it: of several
    /// processes claiming one tick, exactly one does.
    fn claim_tick(&self, cron_id: &str, at: i64, next: Option<i64>, updated_at: &str) -> Result<bool>;

    /// Records a webhook delivery to make once run `run_id` has ended. A delivery of the same
    /// id not yet attempted takes the new body (the run ended again, after a restart); one
    /// attempted already is left as it is.
    fn enqueue_delivery(&self, delivery: &Delivery) -> Result<()>;

    /// Takes up to `limit` deliveries that are due at `now` (milliseconds), pending, not held
    /// by another process, and whose run is no longer pending or running (or is gone): each is
    /// held for `owner` until `hold_until`, so no other process attempts it meanwhile.
    fn claim_deliveries(&self, now: i64, owner: &str, hold_until: i64, limit: usize) -> Result<Vec<Delivery>>;

    /// Records an attempt of a delivery `owner` holds, and lets go of it; whether it still
    /// held it.
    fn record_attempt(&self, delivery_id: &str, owner: &str, attempt: &Attempt) -> Result<bool>;

    /// The deliveries of run `run_id` (every run's when `None`), oldest first.
    fn list_deliveries(&self, run_id: Option<&str>) -> Result<Vec<Delivery>>;
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Not yet delivered: due at `next_attempt_at`.
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Given up: a 4xx answer, or every attempt failed.
    Failed,
    /// The address is one the network guard refuses: never called.
    Refused,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
            DeliveryState::Refused => "refused",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryState> {
        Some(match s {
            "pending" => DeliveryState::Pending,
            "delivered" => DeliveryState::Delivered,
            "failed" => DeliveryState::Failed,
            "refused" => DeliveryState::Refused,
            _ => return None,
        })
    }
}

/// A webhook call to make for a run that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub delivery_id: String,
    pub run_id: String,
    pub url: String,
    /// The JSON body, as text.
    pub body: String,
    pub state: DeliveryState,
    pub attempts: u32,
    /// The receiver's last HTTP status.
    pub last_status: Option<u16>,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// Milliseconds since the epoch.
    pub next_attempt_at: i64,
    /// RFC 3339 UTC.
    pub created_at: String,
    pub updated_at: String,
}

/// What one attempt of a delivery came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// `Pending` again when it will be retried.
    pub state: DeliveryState,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// When a retry is due (milliseconds since the epoch).
    pub next_attempt_at: i64,
    /// RFC 3339 UTC.
    pub at: String,
}

/// A [`CronRow`] as a backend stores it: JSON as text, `enabled` as 0 or 1.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CronText {
    pub(crate) cron_id: String,
    pub(crate) assistant_id: String,
    pub(crate) thread_id: Option<String>,
    pub(crate) owner: Option<String>,
    pub(crate) schedule: String,
    pub(crate) timezone: Option<String>,
    pub(crate) payload: String,
    pub(crate) metadata: String,
    pub(crate) on_run_completed: Option<String>,
    pub(crate) enabled: i64,
    pub(crate) end_ms: Option<i64>,
    pub(crate) next_run_at: Option<i64>,
    pub(crate) declared_by: Option<String>,
    pub(crate) created_at: String,
    pub(crate) updated_at: String,
}

/// The columns of a cron, in [`CronText`]'s order.
pub(crate) const CRON_COLS: &str = "cron_id, assistant_id, thread_id, owner, schedule, timezone, payload, metadata, \
                                    on_run_completed, enabled, end_ms, next_run_at, declared_by, created_at, updated_at";

impl CronText {
    pub(crate) fn from_cron(c: &CronRow) -> Result<Self> {
        Ok(CronText {
            cron_id: c.cron_id.clone(),
            assistant_id: c.assistant_id.clone(),
            thread_id: c.thread_id.clone(),
            owner: c.owner.clone(),
            schedule: c.schedule.clone(),
            timezone: c.timezone.clone(),
            payload: super::runs::json_text(&c.payload)?,
            metadata: super::runs::json_text(&c.metadata)?,
            on_run_completed: c.on_run_completed.clone(),
            enabled: i64::from(c.enabled),
            end_ms: c.end_ms,
            next_run_at: c.next_run_at,
            declared_by: c.declared_by.clone(),
            created_at: c.created_at.clone(),
            updated_at: c.updated_at.clone(),
        })
    }

    pub(crate) fn into_cron(self) -> Result<CronRow> {
        Ok(CronRow {
            payload: parse_json("payload", &self.payload)?,
            metadata: parse_json("metadata", &self.metadata)?,
            enabled: self.enabled != 0,
            cron_id: self.cron_id,
            assistant_id: self.assistant_id,
            thread_id: self.thread_id,
            owner: self.owner,
            schedule: self.schedule,
            timezone: self.timezone,
            on_run_completed: self.on_run_completed,
            end_ms: self.end_ms,
            next_run_at: self.next_run_at,
            declared_by: self.declared_by,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// The columns of a delivery.
pub(crate) const DELIVERY_COLS: &str = "delivery_id, run_id, url, body, state, attempts, last_status, last_error, \
                                        next_attempt_at, created_at, updated_at";

/// A delivery's state read back from its stored name.
pub(crate) fn delivery_state(id: &str, state: &str) -> Result<DeliveryState> {
    DeliveryState::parse(state)
        .ok_or_else(|| CheckpointError::Corrupt(format!("webhook delivery {id} has state `{state}`")))
}

fn parse_json(column: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| CheckpointError::Corrupt(format!("crons.{column}: {e}")))
}
