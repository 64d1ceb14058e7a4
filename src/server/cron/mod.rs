//! Schedules, the LangGraph API's crons, below HTTP: created, read, changed, deleted, searched
//! and counted as `langgraph-api` does, with typed errors ([`CronError`]) the handlers
//! (`server/crons.rs`) map to statuses; `runner cron` uses the same functions on the database.
//!
//! A cron is a row ([`CronRow`]): the run request each tick starts (`payload`, the create body
//! as sent, with the assistant's id and `config.configurable.cron_id`), the schedule and its
//! time zone, and `next_run_at`. `scheduler.rs` fires due ticks; `declared.rs` registers the
//! schedules workflows declare. Every time a cron reads or writes comes from the server's
//! [`Clock`], which a test may drive.

mod declared;
mod scheduler;

pub(crate) use declared::register as register_declared;
pub use scheduler::Clock;
pub(crate) use scheduler::{Scheduler, Ticks};

use serde_json::{Map, Value, json};

use crate::checkpoint::{CheckpointError, Checkpointer, CronRow};
use crate::compile::schedule::{Schedule, ScheduleError, is_web_url, parse_time};
use crate::server::Graphs;

/// Why a cron request was refused.
#[derive(Debug, thiserror::Error)]
pub enum CronError {
    /// The request does not fit (HTTP 422).
    #[error("{0}")]
    Invalid(String),
    /// No such cron, assistant or thread (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The request says nothing to do (HTTP 400).
    #[error("{0}")]
    Empty(String),
    #[error(transparent)]
    Store(#[from] CheckpointError),
}

/// The fields of a cron a search may sort by and select.
const SORTABLE: &[&str] = &[
    "cron_id",
    "assistant_id",
    "thread_id",
    "next_run_date",
    "end_time",
    "created_at",
    "updated_at",
];
const SELECTABLE: &[&str] = &[
    "cron_id",
    "assistant_id",
    "thread_id",
    "end_time",
    "schedule",
    "timezone",
    "created_at",
    "updated_at",
    "user_id",
    "payload",
    "next_run_date",
    "metadata",
    "now",
    "on_run_completed",
    "enabled",
];

/// A cron as the API shows it.
pub(crate) fn cron_json(c: &CronRow) -> Value {
    json!({
        "cron_id": c.cron_id,
        "assistant_id": c.assistant_id,
        "thread_id": c.thread_id,
        // The caller who made it; without users, "" as LangGraph's server shows the
        // anonymous one.
        "user_id": c.owner.clone().unwrap_or_default(),
        "end_time": c.end_ms.map(crate::clock::at_ms),
        "schedule": c.schedule,
        "timezone": c.timezone,
        "payload": c.payload,
        "next_run_date": c.next_run_at.map(crate::clock::at_ms),
        "metadata": c.metadata,
        "on_run_completed": c.on_run_completed,
        "enabled": c.enabled,
        "created_at": c.created_at,
        "updated_at": c.updated_at,
    })
}

fn schedule(expr: &str, timezone: Option<&str>) -> Result<Schedule, CronError> {
    Schedule::parse(expr, timezone).map_err(|e| match e {
        ScheduleError::TimeZone(tz) => CronError::Invalid(format!(
            "Invalid timezone: '{tz}'. Use IANA timezone format (e.g. 'America/New_York')."
        )),
        ScheduleError::Expression { expr, reason } => CronError::Invalid(format!(
            "Invalid cron schedule: '{expr}'. Reason: {reason}. Ensure the schedule uses the standard cron format \
             (minute hour day_of_month month day_of_week). Example: '*/5 * * * *' for every 5 minutes."
        )),
    })
}

fn string_field<'a>(body: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, CronError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(CronError::Invalid(format!("{name} must be a string, not {other}"))),
    }
}

fn end_ms(body: &Map<String, Value>) -> Result<Option<i64>, CronError> {
    match string_field(body, "end_time")? {
        None => Ok(None),
        Some(text) => parse_time(text)
            .map(Some)
            .ok_or_else(|| CronError::Invalid(format!("end_time `{text}` is not an ISO 8601 time"))),
    }
}

fn check_webhook(body: &Map<String, Value>) -> Result<(), CronError> {
    match string_field(body, "webhook")? {
        Some(url) if !is_web_url(url) => Err(CronError::Invalid(format!(
            "webhook `{url}` is not an absolute http or https URL"
        ))),
        _ => Ok(()),
    }
}

fn on_run_completed(body: &Map<String, Value>) -> Result<Option<String>, CronError> {
    match string_field(body, "on_run_completed")? {
        None => Ok(None),
        Some(v @ ("delete" | "keep")) => Ok(Some(v.to_string())),
        Some(other) => Err(CronError::Invalid(format!(
            "on_run_completed must be `delete` or `keep`, not `{other}`"
        ))),
    }
}

fn metadata_of(body: &Map<String, Value>) -> Result<Map<String, Value>, CronError> {
    match body.get("metadata") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(CronError::Invalid(format!("metadata is an object, not {other}"))),
    }
}

/// `payload` with `config.configurable.cron_id` set to `cron_id`.
fn stamp(payload: &mut Map<String, Value>, cron_id: &str) {
    let config = payload
        .entry("config")
        .and_modify(|c| {
            if !c.is_object() {
                *c = json!({});
            }
        })
        .or_insert_with(|| json!({}));
    let configurable = &mut config["configurable"];
    if !configurable.is_object() {
        *configurable = json!({});
    }
    configurable["cron_id"] = json!(cron_id);
}

/// Checks that `payload` makes a valid run of its graph on `thread` (none: a thread of its
/// own): the refusal a tick would meet, met at once.
fn check_run(graphs: &Graphs, thread: Option<&str>, payload: &Map<String, Value>) -> Result<(), CronError> {
    super::manager::CreateRun::parse(graphs, thread.map(str::to_string), Value::Object(payload.clone()))
        .map(|_| ())
        .map_err(|e| match e {
            super::manager::RunsError::NotFound(m) => CronError::NotFound(m),
            other => CronError::Invalid(other.to_string()),
        })
}

/// Creates a cron from a create request's `body`, on `thread` (none: a stateless cron, a new
/// thread each run), at `now` (milliseconds since the epoch), for `owner`.
pub(crate) fn create(
    graphs: &Graphs,
    store: &dyn Checkpointer,
    now: i64,
    thread: Option<&str>,
    body: Value,
    owner: Option<String>,
) -> Result<CronRow, CronError> {
    let Value::Object(mut payload) = body else {
        return Err(CronError::Invalid("a cron is created from a JSON object".into()));
    };
    let assistant = string_field(&payload, "assistant_id")?
        .ok_or_else(|| CronError::Invalid("assistant_id is required".into()))?
        .to_string();
    let graph = graphs
        .find(&assistant)
        .ok_or_else(|| CronError::NotFound(format!("Assistant '{assistant}' not found")))?;
    let expr = string_field(&payload, "schedule")?
        .ok_or_else(|| CronError::Invalid("schedule is required".into()))?
        .to_string();
    let timezone = string_field(&payload, "timezone")?.map(str::to_string);
    let sched = schedule(&expr, timezone.as_deref())?;
    check_webhook(&payload)?;
    let end = end_ms(&payload)?;
    let enabled = match payload.get("enabled") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(CronError::Invalid(format!(
                "enabled must be true or false, not {other}"
            )));
        }
    };
    let completed = match thread {
        Some(_) => None,
        None => Some(on_run_completed(&payload)?.unwrap_or_else(|| "delete".into())),
    };
    let metadata = metadata_of(&payload)?;
    if let Some(t) = thread
        && store.get_thread_meta(t)?.is_none()
        && store.get_thread(t)?.is_none()
    {
        return Err(CronError::NotFound(format!(
            "Thread with ID '{t}' not found. Please verify the ID is correct and the thread hasn't been deleted or expired."
        )));
    }
    let cron_id = uuid::Uuid::now_v7().to_string();
    payload.insert("assistant_id".into(), json!(graph.assistant_id));
    stamp(&mut payload, &cron_id);
    check_run(graphs, thread, &payload)?;
    let at = crate::clock::at_ms(now);
    let row = CronRow {
        cron_id,
        assistant_id: graph.assistant_id.clone(),
        thread_id: thread.map(str::to_string),
        owner,
        schedule: expr,
        timezone,
        payload: Value::Object(payload),
        metadata: Value::Object(metadata),
        on_run_completed: completed,
        enabled,
        end_ms: end,
        next_run_at: sched.next_after(now),
        declared_by: None,
        created_at: at.clone(),
        updated_at: at,
    };
    store.put_cron(&row)?;
    Ok(row)
}

/// The cron `cron_id`.
pub(crate) fn get(store: &dyn Checkpointer, cron_id: &str) -> Result<CronRow, CronError> {
    store
        .get_cron(cron_id)?
        .ok_or_else(|| CronError::NotFound(format!("Cron '{cron_id}' not found")))
}

/// Changes cron `cron_id` as a patch request's `body` says, at `now`: `schedule` and
/// `timezone` move the next tick to the first after now; `end_time: null` clears the end;
/// `metadata` is merged into the cron's; every other field goes into the run request, whose
/// assistant and `cron_id` stay.
pub(crate) fn update(
    graphs: &Graphs,
    store: &dyn Checkpointer,
    now: i64,
    cron_id: &str,
    body: Value,
) -> Result<CronRow, CronError> {
    let Value::Object(patch) = body else {
        return Err(CronError::Invalid("a cron is changed with a JSON object".into()));
    };
    if patch.is_empty() {
        return Err(CronError::Empty("Request body cannot be empty".into()));
    }
    let mut cron = get(store, cron_id)?;
    let timezone = string_field(&patch, "timezone")?.map(str::to_string);
    let expr = string_field(&patch, "schedule")?.map(str::to_string);
    check_webhook(&patch)?;
    if let Some(tz) = &timezone {
        cron.timezone = Some(tz.clone());
    }
    if let Some(e) = &expr {
        cron.schedule = e.clone();
    }
    if expr.is_some() || timezone.is_some() {
        cron.next_run_at = schedule(&cron.schedule, cron.timezone.as_deref())?.next_after(now);
    }
    if patch.contains_key("end_time") {
        cron.end_ms = end_ms(&patch)?;
    }
    match patch.get("enabled") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            // A cron turned back on whose ticks had run out goes on from now.
            if *b && !cron.enabled && cron.next_run_at.is_none() {
                cron.next_run_at = schedule(&cron.schedule, cron.timezone.as_deref())?.next_after(now);
            }
            cron.enabled = *b;
        }
        Some(other) => {
            return Err(CronError::Invalid(format!(
                "enabled must be true or false, not {other}"
            )));
        }
    }
    if let Some(v) = on_run_completed(&patch)? {
        cron.on_run_completed = Some(v);
    }
    if patch.contains_key("metadata") {
        let mut merged = cron.metadata.as_object().cloned().unwrap_or_default();
        merged.extend(metadata_of(&patch)?);
        cron.metadata = Value::Object(merged);
    }
    let mut payload = cron.payload.as_object().cloned().unwrap_or_default();
    let assistant = payload.get("assistant_id").cloned();
    payload.extend(patch);
    if let Some(a) = assistant {
        payload.insert("assistant_id".into(), a);
    }
    stamp(&mut payload, &cron.cron_id);
    check_run(graphs, cron.thread_id.as_deref(), &payload)?;
    cron.payload = Value::Object(payload);
    cron.updated_at = crate::clock::at_ms(now);
    store.put_cron(&cron)?;
    Ok(cron)
}

/// Deletes cron `cron_id`.
pub(crate) fn delete(store: &dyn Checkpointer, cron_id: &str) -> Result<(), CronError> {
    if store.delete_cron(cron_id)? {
        Ok(())
    } else {
        Err(CronError::NotFound(format!("Cron '{cron_id}' not found")))
    }
}

/// What a search or a count filters by.
#[derive(Debug, Default)]
pub(crate) struct Filter {
    pub assistant_id: Option<String>,
    pub thread_id: Option<String>,
    pub enabled: Option<bool>,
    /// Every key's value must be contained in the cron's metadata.
    pub metadata: Option<Map<String, Value>>,
    /// Only this user's crons (none: everyone's).
    pub owner: Option<String>,
}

impl Filter {
    /// The filter a search or count `body` asks for.
    pub(crate) fn parse(body: &Map<String, Value>) -> Result<Filter, CronError> {
        // An assistant's id, not a graph's name, as the reference's search takes it.
        let assistant_id = match string_field(body, "assistant_id")? {
            None => None,
            Some(a) if uuid::Uuid::parse_str(a).is_ok() => Some(a.to_string()),
            Some(_) => return Err(CronError::Invalid("Invalid assistant ID: must be a UUID".into())),
        };
        let enabled = match body.get("enabled") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(other) => {
                return Err(CronError::Invalid(format!(
                    "enabled must be true or false, not {other}"
                )));
            }
        };
        let metadata = match body.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m.clone()),
            Some(other) => return Err(CronError::Invalid(format!("metadata is an object, not {other}"))),
        };
        Ok(Filter {
            assistant_id,
            thread_id: string_field(body, "thread_id")?.map(str::to_string),
            enabled,
            metadata,
            owner: None,
        })
    }

    fn holds(&self, c: &CronRow) -> bool {
        self.assistant_id.as_ref().is_none_or(|a| *a == c.assistant_id)
            && self.thread_id.as_ref().is_none_or(|t| c.thread_id.as_ref() == Some(t))
            && self.enabled.is_none_or(|e| e == c.enabled)
            && self.owner.as_ref().is_none_or(|o| c.owner.as_ref() == Some(o))
            && self
                .metadata
                .as_ref()
                .is_none_or(|m| contains(&c.metadata, &Value::Object(m.clone())))
    }
}

/// Whether `haystack` contains `needle` as PostgreSQL's `@>` says of JSON.
fn contains(haystack: &Value, needle: &Value) -> bool {
    match (haystack, needle) {
        (Value::Object(h), Value::Object(n)) => n.iter().all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        (Value::Array(h), Value::Array(n)) => n.iter().all(|v| h.iter().any(|hv| contains(hv, v))),
        (h, n) => h == n,
    }
}

/// A page of crons: the crons (each its selected fields), and the offset of the next page.
pub(crate) struct Page {
    pub crons: Vec<Value>,
    pub next: Option<usize>,
}

/// The crons a search `body` asks for: filtered, sorted (by `sort_by`, default newest first),
/// paged (`limit`, default 10, from `offset`), each with only the `select`ed fields; of
/// `owner`'s only, when given.
pub(crate) fn search(
    store: &dyn Checkpointer,
    body: &Map<String, Value>,
    owner: Option<&str>,
) -> Result<Page, CronError> {
    let mut filter = Filter::parse(body)?;
    filter.owner = owner.map(str::to_string);
    let number = |name: &str, default: usize| match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| CronError::Invalid(format!("{name} must be a whole number, not {v}"))),
    };
    let (limit, offset) = (number("limit", 10)?, number("offset", 0)?);
    let select: Option<Vec<String>> = match body.get("select") {
        None | Some(Value::Null) => None,
        Some(Value::Array(fields)) => {
            let mut out = Vec::new();
            for f in fields {
                match f.as_str() {
                    Some(name) if SELECTABLE.contains(&name) => out.push(name.to_string()),
                    _ => {
                        return Err(CronError::Invalid(format!(
                            "Invalid select column: {f}. Valid options are: {}",
                            SELECTABLE.join(", ")
                        )));
                    }
                }
            }
            (!out.is_empty()).then_some(out)
        }
        Some(other) => return Err(CronError::Invalid(format!("select is a list of fields, not {other}"))),
    };
    let sort_by = string_field(body, "sort_by")?.map(str::to_lowercase);
    if let Some(s) = &sort_by
        && !SORTABLE.contains(&s.as_str())
    {
        return Err(CronError::Invalid(format!(
            "Invalid sort_by field: '{s}'. Valid options are: {}",
            SORTABLE.join(", ")
        )));
    }
    let ascending = string_field(body, "sort_order")?.is_some_and(|o| o.eq_ignore_ascii_case("asc"));
    let mut crons: Vec<CronRow> = store.list_crons()?.into_iter().filter(|c| filter.holds(c)).collect();
    match sort_by.as_deref() {
        None => crons.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.cron_id.cmp(&a.cron_id))),
        Some(field) => {
            let key = |c: &CronRow| -> (Option<i64>, String) {
                match field {
                    "cron_id" => (None, c.cron_id.to_lowercase()),
                    "assistant_id" => (None, c.assistant_id.to_lowercase()),
                    "thread_id" => (None, c.thread_id.clone().unwrap_or_default().to_lowercase()),
                    "next_run_date" => (c.next_run_at.or(Some(i64::MIN)), String::new()),
                    "end_time" => (c.end_ms.or(Some(i64::MIN)), String::new()),
                    "created_at" => (None, c.created_at.clone()),
                    _ => (None, c.updated_at.clone()),
                }
            };
            crons.sort_by_key(key);
            if !ascending {
                crons.reverse();
            }
        }
    }
    let total = crons.len();
    let page: Vec<Value> = crons
        .iter()
        .skip(offset)
        .take(limit)
        .map(|c| {
            let full = cron_json(c);
            match (&select, full) {
                (Some(fields), Value::Object(m)) => {
                    Value::Object(m.into_iter().filter(|(k, _)| fields.contains(k)).collect())
                }
                (_, full) => full,
            }
        })
        .collect();
    let next = (offset + limit < total).then_some(offset + limit);
    Ok(Page { crons: page, next })
}

/// How many crons a count `body` matches (of `owner`'s only, when given).
pub(crate) fn count(
    store: &dyn Checkpointer,
    body: &Map<String, Value>,
    owner: Option<&str>,
) -> Result<usize, CronError> {
    let mut filter = Filter::parse(body)?;
    filter.owner = owner.map(str::to_string);
    // A count filters by assistant, thread and metadata only, as the reference's does.
    filter.enabled = None;
    Ok(store.list_crons()?.iter().filter(|c| filter.holds(c)).count())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn metadata_containment_is_jsonbs() {
        let have = json!({"team": "a", "tags": ["x", "y"], "n": {"deep": 1, "other": 2}});
        for (want, holds) in [
            (json!({}), true),
            (json!({"team": "a"}), true),
            (json!({"team": "b"}), false),
            (json!({"tags": ["y"]}), true),
            (json!({"tags": ["z"]}), false),
            (json!({"n": {"deep": 1}}), true),
            (json!({"missing": null}), false),
        ] {
            assert_eq!(super::contains(&have, &want), holds, "{want}");
        }
    }
}
