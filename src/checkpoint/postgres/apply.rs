//! The format's [`Op`]s applied with PostgreSQL's SQL, by the rules written in
//! [`crate::checkpoint::format`], and the reads the trait's methods share. Every function runs
//! inside the caller's transaction.

use std::future::Future;
use std::pin::Pin;

use deadpool_postgres::{GenericClient, Transaction};
use serde_json::Value;
use tokio_postgres::Row;

use crate::checkpoint::format::{self, CheckpointRow, Done, Op, ThreadRow};
use crate::checkpoint::{Checkpoint, CheckpointError, Lease, Result, Thread, ThreadStatus};

pub(super) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub(super) const THREAD_COLS: &str = "t.thread_id, t.workflow, t.plan_hash, i.input, i.context, i.config, t.status, \
     t.created_at, t.updated_at, t.forked_from_thread, t.forked_from_checkpoint";
pub(super) const THREAD_FROM: &str = "threads t JOIN thread_inputs i ON i.thread_id = t.thread_id";
pub(super) const LEASE_COLS: &str = "thread_id, owner, generation, pid, host, acquired_at, expires_at";
const CHECKPOINT_COLS: &str =
    "thread_id, checkpoint_id, parent_id, step, versions, ran, changed, next, meta, plan_hash, created_at";
pub(super) const CHECKPOINT_READ: &str = "thread_id, checkpoint_id, parent_id, step, versions, ran, changed, next, \
     meta, coalesce(plan_hash, (SELECT t.plan_hash FROM threads t WHERE t.thread_id = checkpoints.thread_id)), \
     created_at";
/// The database's clock in milliseconds since the epoch: leases are timed by it.
pub(super) const DB_NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

pub(super) fn thread_row(r: &Row) -> Result<ThreadRow> {
    let forked_thread: Option<String> = r.try_get(9)?;
    let forked_checkpoint: Option<String> = r.try_get(10)?;
    Ok(ThreadRow {
        thread_id: r.try_get(0)?,
        workflow: r.try_get(1)?,
        plan_hash: r.try_get(2)?,
        input: r.try_get(3)?,
        context: r.try_get(4)?,
        config: r.try_get(5)?,
        status: r.try_get(6)?,
        created_at: r.try_get(7)?,
        updated_at: r.try_get(8)?,
        forked_from: forked_thread.zip(forked_checkpoint),
    })
}

pub(super) fn checkpoint_row(r: &Row) -> Result<CheckpointRow> {
    Ok(CheckpointRow {
        thread_id: r.try_get(0)?,
        checkpoint_id: r.try_get(1)?,
        parent_id: r.try_get(2)?,
        step: r.try_get(3)?,
        versions: r.try_get(4)?,
        ran: r.try_get(5)?,
        changed: r.try_get(6)?,
        next: r.try_get(7)?,
        meta: r.try_get(8)?,
        plan_hash: r.try_get(9)?,
        created_at: r.try_get(10)?,
    })
}

pub(super) fn lease_row(r: &Row) -> Result<Lease> {
    lease_at(r, 0)
}

/// A lease from `r`'s columns `at..at + 7`, in [`LEASE_COLS`]' order.
pub(super) fn lease_at(r: &Row, at: usize) -> Result<Lease> {
    let generation: i64 = r.try_get(at + 2)?;
    let pid: i64 = r.try_get(at + 3)?;
    Ok(Lease {
        thread_id: r.try_get(at)?,
        owner: r.try_get(at + 1)?,
        generation: u64::try_from(generation)
            .map_err(|_| CheckpointError::Corrupt(format!("lease generation {generation}")))?,
        pid: u32::try_from(pid).map_err(|_| CheckpointError::Corrupt(format!("lease pid {pid}")))?,
        host: r.try_get(at + 4)?,
        acquired_at: r.try_get(at + 5)?,
        expires_at_ms: r.try_get(at + 6)?,
    })
}

/// Every hash a text refers to, read from the database: `decode`'s blob reader for texts that
/// hold references (rare), so an ordinary value costs no query.
async fn blobs_of(tx: &impl GenericClient, text: &str) -> Result<std::collections::HashMap<String, String>> {
    let mut found = std::collections::HashMap::new();
    if !refers_to_blobs(text) {
        return Ok(found);
    }
    // The references are collected by decoding once with a reader that records what it is
    // asked for, then the texts are read in one query.
    let mut wanted = Vec::new();
    let _ = format::decode("a stored value", text, &mut |hash: &str| {
        wanted.push(hash.to_owned());
        Ok(Some(String::new()))
    });
    let stmt = tx
        .prepare_cached("SELECT hash, text FROM blobs WHERE hash = ANY($1)")
        .await?;
    for row in tx.query(&stmt, &[&wanted]).await? {
        found.insert(row.try_get(0)?, row.try_get(1)?);
    }
    Ok(found)
}

/// A stored JSON text decoded, references to long strings read from `blobs`.
pub(super) async fn decode(tx: &impl GenericClient, what: &str, text: &str) -> Result<Value> {
    let blobs = blobs_of(tx, text).await?;
    format::decode(what, text, &mut |hash: &str| Ok(blobs.get(hash).cloned()))
}

pub(super) async fn resolve_thread(tx: &impl GenericClient, row: ThreadRow) -> Result<Thread> {
    let mut blobs = std::collections::HashMap::new();
    for text in [&row.input, &row.context, &row.config] {
        blobs.extend(blobs_of(tx, text).await?);
    }
    row.into_thread(&mut |hash: &str| Ok(blobs.get(hash).cloned()))
}

pub(super) async fn resolve_checkpoint(tx: &impl GenericClient, row: CheckpointRow) -> Result<Checkpoint> {
    let blobs = blobs_of(tx, &row.meta).await?;
    row.into_checkpoint(&mut |hash: &str| Ok(blobs.get(hash).cloned()))
}

pub(super) async fn load_thread(tx: &impl GenericClient, thread_id: &str) -> Result<Option<ThreadRow>> {
    let stmt = tx.prepare_cached(&thread_sql(Which::Thread)).await?;
    tx.query_opt(&stmt, &[&thread_id])
        .await?
        .map(|r| thread_row(&r))
        .transpose()
}

/// Which thread a read is of, from its parameter `$1`: the one it names, or the one whose run
/// claim `$1` holds (read in the claim's own round trip, sent behind it, before the claimant
/// knows which thread it took).
#[derive(Debug, Clone, Copy)]
pub(super) enum Which {
    Thread,
    Claimed,
}

impl Which {
    /// The thread's id in a statement.
    pub(super) fn sql(self) -> &'static str {
        match self {
            Which::Thread => "$1",
            // One entry of the index of running runs' claims (`runs_by_claim`, schema version 9).
            Which::Claimed => "(SELECT r.thread_id FROM runs r WHERE r.status = 'running' AND r.claim = $1)",
        }
    }
}

/// The statement reading the thread `which` names ([`THREAD_COLS`]).
pub(super) fn thread_sql(which: Which) -> String {
    format!(
        "SELECT {THREAD_COLS} FROM {THREAD_FROM} WHERE t.thread_id = {}",
        which.sql()
    )
}

/// Checkpoint `checkpoint_id` of `thread_id`, or its newest when `None`.
pub(super) async fn load_checkpoint_or_head(
    tx: &impl GenericClient,
    thread_id: &str,
    checkpoint_id: Option<&str>,
) -> Result<Option<CheckpointRow>> {
    if let Some(id) = checkpoint_id {
        return load_checkpoint(tx, thread_id, id).await;
    }
    let stmt = tx.prepare_cached(&head_sql(Which::Thread)).await?;
    tx.query_opt(&stmt, &[&thread_id])
        .await?
        .map(|r| checkpoint_row(&r))
        .transpose()
}

/// The statement reading the newest checkpoint of the thread `which` names ([`CHECKPOINT_READ`]).
pub(super) fn head_sql(which: Which) -> String {
    format!(
        "SELECT {CHECKPOINT_READ} FROM checkpoints WHERE thread_id = {} ORDER BY checkpoint_id DESC LIMIT 1",
        which.sql()
    )
}

/// Whether a stored text refers to long strings stored apart (`blobs`).
pub(super) fn refers_to_blobs(text: &str) -> bool {
    text.contains(crate::checkpoint::blobs::BLOB)
}

pub(super) async fn load_checkpoint(
    tx: &impl GenericClient,
    thread_id: &str,
    checkpoint_id: &str,
) -> Result<Option<CheckpointRow>> {
    let sql = format!("SELECT {CHECKPOINT_READ} FROM checkpoints WHERE thread_id = $1 AND checkpoint_id = $2");
    match tx
        .query_opt(&tx.prepare_cached(&sql).await?, &[&thread_id, &checkpoint_id])
        .await?
    {
        Some(r) => Ok(Some(checkpoint_row(&r)?)),
        None => Ok(None),
    }
}

/// The lease row; `lock`: held `FOR SHARE` until the transaction ends, so no takeover commits
/// between a fence's check and the writes it guards.
pub(super) async fn load_lease(tx: &impl GenericClient, thread_id: &str, lock: bool) -> Result<Option<Lease>> {
    let sql = format!(
        "SELECT {LEASE_COLS} FROM leases WHERE thread_id = $1{}",
        if lock { " FOR SHARE" } else { "" }
    );
    match tx.query_opt(&tx.prepare_cached(&sql).await?, &[&thread_id]).await? {
        Some(r) => Ok(Some(lease_row(&r)?)),
        None => Ok(None),
    }
}

pub(super) async fn thread_exists(tx: &impl GenericClient, thread_id: &str) -> Result<bool> {
    let stmt = tx.prepare_cached("SELECT 1 FROM threads WHERE thread_id = $1").await?;
    Ok(tx.query_opt(&stmt, &[&thread_id]).await?.is_some())
}

pub(super) async fn require_thread(tx: &impl GenericClient, thread_id: &str) -> Result<()> {
    if thread_exists(tx, thread_id).await? {
        Ok(())
    } else {
        Err(CheckpointError::NoThread(thread_id.into()))
    }
}

/// The checkpoint `op` stores, if it stores one: its thread and id.
pub(super) fn stored_checkpoint(op: &Op) -> Option<(&str, &str)> {
    let mut flat = Vec::new();
    flatten(std::slice::from_ref(op), &mut flat);
    flat.into_iter().find_map(|op| match op {
        Op::PutCheckpoint { row, .. } => Some((row.thread_id.as_str(), row.checkpoint_id.as_str())),
        _ => None,
    })
}

pub(super) async fn checkpoint_exists(tx: &impl GenericClient, thread_id: &str, checkpoint_id: &str) -> Result<bool> {
    let stmt = tx
        .prepare_cached("SELECT 1 FROM checkpoints WHERE thread_id = $1 AND checkpoint_id = $2")
        .await?;
    Ok(tx.query_opt(&stmt, &[&thread_id, &checkpoint_id]).await?.is_some())
}

/// The recursive part of a chain of values (`chain(key, version, value)` of thread `$1`): for
/// each value that extends an earlier version (`{"$runner_extends": base, "items": …}`, as
/// [`crate::checkpoint::extension`] writes it), that version's.
macro_rules! chain_down {
    () => {
        "UNION ALL \
           SELECT s.key, s.version, s.value FROM chain c \
           JOIN state_values s ON s.thread_id = $1 AND s.key = c.key AND s.version < c.version \
            AND s.version = substring(c.value FROM '^\\{\"\\$runner_extends\":([0-9]+),')::bigint \
           WHERE c.value LIKE '{\"$runner_extends\":%'"
    };
}

/// The stored values of `($2, $3)` (keys and versions) of thread `$1` and the earlier versions
/// they extend, down each chain to its end.
const CHAIN: &str = concat!(
    "WITH RECURSIVE chain(key, version, value) AS ( \
       SELECT s.key, s.version, s.value FROM unnest($2::text[], $3::bigint[]) AS w(key, version) \
       JOIN state_values s ON s.thread_id = $1 AND s.key = w.key AND s.version = w.version ",
    chain_down!(),
    ") SELECT key, version, value FROM chain"
);

/// A checkpoint of thread `$1` as [`CHECKPOINT_READ`] reads it, then the stored values its
/// versions name and the earlier versions they extend, as [`CHAIN`] reads them: a row of the
/// checkpoint's columns and three nulls, then a row of eleven nulls and each value's key,
/// version and text. `head`: the checkpoint's `WHERE` and order.
fn checkpoint_and_values_sql(head: &str) -> String {
    format!(
        "WITH RECURSIVE head AS (SELECT {CHECKPOINT_READ} FROM checkpoints WHERE {head} LIMIT 1), \
         chain(key, version, value) AS ( \
           SELECT s.key, s.version, s.value FROM head, json_each_text(head.versions::json) AS w(key, version) \
           JOIN state_values s ON s.thread_id = $1 AND s.key = w.key \
            AND s.version = CASE WHEN w.version ~ '^[0-9]{{1,18}}$' THEN w.version::bigint END {down}) \
         SELECT head.*, NULL::text, NULL::bigint, NULL::text FROM head \
         UNION ALL \
         SELECT NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text, \
                NULL::text, NULL::text, NULL::text, NULL::text, key, version, value FROM chain",
        down = chain_down!()
    )
}

/// The stored texts of values, by key and stored version.
pub(super) type ValueTexts = std::collections::HashMap<(String, i64), String>;

/// A checkpoint (the thread's latest when `checkpoint_id` is `None`) and the stored texts of
/// the values it names, down their chains: one statement, one snapshot. `None`: no such
/// checkpoint. What the statement could not follow is left to [`resolved_values`].
pub(super) async fn load_checkpoint_and_values(
    client: &impl GenericClient,
    thread_id: &str,
    checkpoint_id: Option<&str>,
) -> Result<Option<(CheckpointRow, ValueTexts)>> {
    let rows = match checkpoint_id {
        Some(id) => {
            let sql = checkpoint_and_values_sql("thread_id = $1 AND checkpoint_id = $2");
            client
                .query(&client.prepare_cached(&sql).await?, &[&thread_id, &id])
                .await?
        }
        None => {
            let sql = checkpoint_and_values_sql("thread_id = $1 ORDER BY checkpoint_id DESC");
            client.query(&client.prepare_cached(&sql).await?, &[&thread_id]).await?
        }
    };
    let mut head = None;
    let mut texts = ValueTexts::new();
    for row in &rows {
        match row.try_get::<_, Option<String>>(11)? {
            None => head = Some(checkpoint_row(row)?),
            Some(key) => {
                texts.insert((key, row.try_get(12)?), row.try_get(13)?);
            }
        }
    }
    Ok(head.map(|h| (h, texts)))
}

/// The values of `versions` (key → version), extensions resolved: the stored values, and the
/// earlier versions they extend, each key's chain read by one statement down to its full
/// value (an append-only key extends its previous version at every step: a chain as long as
/// the thread). A link the statement could not follow (a text not in the form `extension`
/// writes) is read by a statement of its own; a corrupt chain that does not go down stops at
/// once. `texts`: what was read already.
pub(super) async fn resolved_values(
    tx: &impl GenericClient,
    thread_id: &str,
    versions: &std::collections::BTreeMap<String, u64>,
    mut texts: ValueTexts,
) -> Result<serde_json::Map<String, Value>> {
    use std::collections::{HashMap, HashSet};
    let mut fetched: HashMap<(String, u64), Value> = HashMap::new();
    let mut asked: HashSet<(String, u64)> = HashSet::new();
    let mut pending: Vec<(String, u64)> = versions.iter().map(|(k, v)| (k.clone(), *v)).collect();
    while !pending.is_empty() {
        let mut ask: Vec<(&str, i64)> = Vec::new();
        for (key, v) in &pending {
            let stored = format::version_to_stored(*v)?;
            if !texts.contains_key(&(key.clone(), stored)) {
                // Asked before and not found: there is no such version.
                if !asked.insert((key.clone(), *v)) {
                    return Err(format::missing_value(thread_id, key, *v));
                }
                ask.push((key, stored));
            }
        }
        if !ask.is_empty() {
            let keys: Vec<&str> = ask.iter().map(|a| a.0).collect();
            let stored: Vec<i64> = ask.iter().map(|a| a.1).collect();
            // Prepared only when something is left to read (a checkpoint read with its
            // values may have read them all).
            let stmt = tx.prepare_cached(CHAIN).await?;
            for row in tx.query(&stmt, &[&thread_id, &keys, &stored]).await? {
                texts.insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
            }
        }
        let mut next = Vec::new();
        for (key, mut v) in pending {
            // Down the chain as far as what was read goes.
            while !fetched.contains_key(&(key.clone(), v)) {
                let Some(text) = texts.get(&(key.clone(), format::version_to_stored(v)?)).cloned() else {
                    next.push((key.clone(), v));
                    break;
                };
                let value = decode(tx, "a state value", &text).await?;
                let base = crate::checkpoint::as_extension(&value).map(|(base, _)| base);
                fetched.insert((key.clone(), v), value);
                match base {
                    Some(base) if base < v => v = base,
                    _ => break,
                }
            }
        }
        pending = next;
    }
    let mut state = serde_json::Map::new();
    for (key, version) in versions {
        let value = crate::checkpoint::resolve(key, *version, |v| {
            fetched
                .remove(&(key.clone(), v))
                .ok_or_else(|| format::missing_value(thread_id, key, v))
        })?;
        state.insert(key.clone(), value);
    }
    Ok(state)
}

/// Applies one op; a failure leaves the caller's transaction to be rolled back.
pub(super) fn apply<'a>(tx: &'a Transaction<'a>, op: &'a Op) -> BoxFuture<'a, Result<Done>> {
    Box::pin(async move {
        match op {
            Op::Batch(ops) => {
                // Consecutive checkpoints and writes (and the long strings they refer to) go in
                // one statement per table: a batch of many steps (async persistence) costs a
                // few round trips, not a few per step.
                let mut flat = Vec::with_capacity(ops.len());
                flatten(ops, &mut flat);
                let mut i = 0;
                while i < flat.len() {
                    let end = (i..flat.len()).find(|&k| !groupable(flat[k])).unwrap_or(flat.len());
                    if end - i > 1 {
                        put_many(tx, &flat[i..end]).await?;
                        i = end;
                    } else {
                        apply(tx, flat[i]).await?;
                        i += 1;
                    }
                }
            }
            Op::CreateThread(row) => {
                if thread_exists(tx, &row.thread_id).await? {
                    return Err(CheckpointError::ThreadExists(row.thread_id.clone()));
                }
                insert_thread(tx, row).await?;
            }
            Op::Blobs { thread_id, blobs } => store_blobs(tx, thread_id, blobs).await?,
            Op::SetStatus { thread_id, status, at } => {
                let stmt = tx
                    .prepare_cached(
                        "UPDATE threads SET status = $2, updated_at = $3, touched = nextval('thread_touches') \
                         WHERE thread_id = $1",
                    )
                    .await?;
                if tx.execute(&stmt, &[thread_id, &status.as_str(), at]).await? == 0 {
                    return Err(CheckpointError::NoThread(thread_id.clone()));
                }
            }
            Op::PutCheckpoint { row, values } => {
                // Its thread and a repeated id are the tables' keys' to check: no query of
                // its own (a round trip each, every step).
                insert_checkpoint(tx, row).await?;
                if !values.is_empty() {
                    // One statement for every value of the step.
                    let stmt = tx
                        .prepare_cached(
                            "INSERT INTO state_values (thread_id, key, version, value) \
                             SELECT $1, * FROM unnest($2::text[], $3::bigint[], $4::text[]) \
                             ON CONFLICT DO NOTHING",
                        )
                        .await?;
                    let keys: Vec<&str> = values.iter().map(|v| v.0.as_str()).collect();
                    let versions: Vec<i64> = values.iter().map(|v| v.1).collect();
                    let texts: Vec<&str> = values.iter().map(|v| v.2.as_str()).collect();
                    tx.execute(&stmt, &[&row.thread_id, &keys, &versions, &texts]).await?;
                }
            }
            Op::PutWrites {
                thread_id,
                checkpoint_id,
                writes,
            } => {
                if writes.is_empty() {
                    // Nothing for the keys to check: what it refers to is looked up.
                    require_thread(tx, thread_id).await?;
                    if !checkpoint_exists(tx, thread_id, checkpoint_id).await? {
                        return Err(CheckpointError::NoCheckpoint(thread_id.clone(), checkpoint_id.clone()));
                    }
                } else {
                    let stmt = tx
                        .prepare_cached(
                            "INSERT INTO writes (thread_id, checkpoint_id, task_id, idx, channel, value) \
                             SELECT $1, $2, * FROM unnest($3::text[], $4::bigint[], $5::text[], $6::text[]) \
                             ON CONFLICT (thread_id, checkpoint_id, task_id, idx) DO UPDATE \
                             SET channel = excluded.channel, value = excluded.value",
                        )
                        .await?;
                    let tasks: Vec<&str> = writes.iter().map(|w| w.0.as_str()).collect();
                    let idxs: Vec<i64> = writes.iter().map(|w| w.1).collect();
                    let channels: Vec<&str> = writes.iter().map(|w| w.2.as_str()).collect();
                    let texts: Vec<&str> = writes.iter().map(|w| w.3.as_str()).collect();
                    // The checkpoint (and so the thread) is the foreign key's to check.
                    tx.execute(&stmt, &[thread_id, checkpoint_id, &tasks, &idxs, &channels, &texts])
                        .await
                        .map_err(|e| match violated(&e) {
                            Some(FOREIGN_KEY) => {
                                CheckpointError::NoCheckpoint(thread_id.clone(), checkpoint_id.clone())
                            }
                            _ => e.into(),
                        })?;
                }
            }
            Op::DeleteThread(thread_id) => {
                require_thread(tx, thread_id).await?;
                let hashes: Vec<String> = tx
                    .query(
                        &tx.prepare_cached("DELETE FROM blob_refs WHERE thread_id = $1 RETURNING hash")
                            .await?,
                        &[thread_id],
                    )
                    .await?
                    .iter()
                    .map(|r| r.try_get(0))
                    .collect::<std::result::Result<_, _>>()?;
                for table in ["writes", "state_values", "checkpoints", "thread_inputs", "threads"] {
                    let stmt = tx
                        .prepare_cached(&format!("DELETE FROM {table} WHERE thread_id = $1"))
                        .await?;
                    tx.execute(&stmt, &[thread_id]).await?;
                }
                if !hashes.is_empty() {
                    let stmt = tx
                        .prepare_cached(
                            "DELETE FROM blobs b WHERE b.hash = ANY($1) \
                             AND NOT EXISTS (SELECT 1 FROM blob_refs r WHERE r.hash = b.hash)",
                        )
                        .await?;
                    tx.execute(&stmt, &[&hashes]).await?;
                }
            }
            Op::Truncate { thread_id, to } => truncate(tx, thread_id, to).await?,
            Op::Fence(fence) => {
                crate::checkpoint::check_fence(load_lease(tx, &fence.thread_id, true).await?.as_ref(), fence)?
            }
            Op::AcquireLease { claim, at, .. } => {
                // One statement, as on SQLite, but timed by the database's clock: insert, or
                // take over a lease that expired, is already ours, or belongs to the owner the
                // claim replaces.
                let sql = format!(
                    "INSERT INTO leases ({LEASE_COLS}) VALUES ($1, $2, 1, $3, $4, $5, {DB_NOW_MS} + $6) \
                     ON CONFLICT (thread_id) DO UPDATE SET \
                       generation = CASE WHEN leases.owner = excluded.owner THEN leases.generation \
                                    ELSE leases.generation + 1 END, \
                       acquired_at = CASE WHEN leases.owner = excluded.owner THEN leases.acquired_at \
                                     ELSE excluded.acquired_at END, \
                       owner = excluded.owner, pid = excluded.pid, host = excluded.host, \
                       expires_at = excluded.expires_at \
                     WHERE leases.expires_at <= {DB_NOW_MS} OR leases.owner = excluded.owner \
                       OR leases.owner = $7 \
                     RETURNING {LEASE_COLS}"
                );
                let ttl = ttl_ms(claim.ttl);
                let granted = tx
                    .query_opt(
                        &tx.prepare_cached(&sql).await?,
                        &[
                            &claim.thread_id,
                            &claim.owner,
                            &i64::from(claim.pid),
                            &claim.host,
                            at,
                            &ttl,
                            &claim.replace,
                        ],
                    )
                    .await?;
                return match granted {
                    Some(row) => Ok(Done::Lease(Box::new(lease_row(&row)?))),
                    None => match load_lease(tx, &claim.thread_id, false).await? {
                        Some(holder) => Err(CheckpointError::Leased(Box::new(holder))),
                        None => Err(CheckpointError::Backend("a lease was neither granted nor held".into())),
                    },
                };
            }
            Op::RenewLease { fence, ttl, .. } => {
                let sql = format!(
                    "UPDATE leases SET expires_at = {DB_NOW_MS} + $4 \
                     WHERE thread_id = $1 AND owner = $2 AND generation = $3 RETURNING {LEASE_COLS}"
                );
                let renewed = tx
                    .query_opt(
                        &tx.prepare_cached(&sql).await?,
                        &[
                            &fence.thread_id,
                            &fence.owner,
                            &format::generation_to_stored(fence.generation)?,
                            &ttl_ms(*ttl),
                        ],
                    )
                    .await?;
                return match renewed {
                    Some(row) => Ok(Done::Lease(Box::new(lease_row(&row)?))),
                    None => Err(CheckpointError::LeaseLost(fence.thread_id.clone())),
                };
            }
            Op::ReleaseLease(fence) => {
                let stmt = tx
                    .prepare_cached("DELETE FROM leases WHERE thread_id = $1 AND owner = $2 AND generation = $3")
                    .await?;
                tx.execute(
                    &stmt,
                    &[
                        &fence.thread_id,
                        &fence.owner,
                        &format::generation_to_stored(fence.generation)?,
                    ],
                )
                .await?;
            }
            Op::Fork {
                from,
                checkpoint_id,
                new,
                new_checkpoint_id,
                at,
            } => {
                return fork(tx, from, checkpoint_id, new, new_checkpoint_id, at)
                    .await
                    .map(|c| Done::Forked(Box::new(c)));
            }
        }
        Ok(Done::Unit)
    })
}

fn ttl_ms(ttl: std::time::Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4)
}

async fn insert_thread(tx: &Transaction<'_>, row: &ThreadRow) -> Result<()> {
    let (forked_thread, forked_checkpoint) = row.forked_from.clone().unzip();
    let stmt = tx
        .prepare_cached(
            "INSERT INTO threads (thread_id, workflow, plan_hash, status, created_at, updated_at, \
             forked_from_thread, forked_from_checkpoint, touched) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nextval('thread_touches'))",
        )
        .await?;
    tx.execute(
        &stmt,
        &[
            &row.thread_id,
            &row.workflow,
            &row.plan_hash,
            &row.status,
            &row.created_at,
            &row.updated_at,
            &forked_thread,
            &forked_checkpoint,
        ],
    )
    .await?;
    let stmt = tx
        .prepare_cached("INSERT INTO thread_inputs (thread_id, input, context, config) VALUES ($1, $2, $3, $4)")
        .await?;
    tx.execute(&stmt, &[&row.thread_id, &row.input, &row.context, &row.config])
        .await?;
    Ok(())
}

/// The ops of nested batches, in order.
fn flatten<'a>(ops: &'a [Op], into: &mut Vec<&'a Op>) {
    for op in ops {
        match op {
            Op::Batch(inner) => flatten(inner, into),
            op => into.push(op),
        }
    }
}

/// Whether an op may be applied together with its neighbours of the same kinds: what the
/// tables' keys check alone.
fn groupable(op: &Op) -> bool {
    match op {
        Op::PutCheckpoint { .. } | Op::Blobs { .. } => true,
        Op::PutWrites { writes, .. } => !writes.is_empty(),
        _ => false,
    }
}

/// Applies checkpoints, their values, writes and long strings (see [`groupable`]): the long
/// strings first, then every checkpoint, value and write in one statement.
async fn put_many(tx: &Transaction<'_>, ops: &[&Op]) -> Result<()> {
    for op in ops {
        if let Op::Blobs { thread_id, blobs } = op {
            store_blobs(tx, thread_id, blobs).await?;
        }
    }
    put_rows(tx, &[], ops, None).await
}

/// Whether `op` can be applied as one statement outside a transaction: only fences, thread
/// creations, statuses, checkpoints and writes (what the tables' keys and the schema's
/// `hold_leases` and `hold_threads` check), as a step and a run's first write store. Long
/// strings (locked while referred to), deletions and the rest take the transaction's way.
pub(super) fn one_statement(op: &Op) -> bool {
    let mut flat = Vec::new();
    flatten(std::slice::from_ref(op), &mut flat);
    flat.iter().all(|op| match op {
        // A thread's creation and status (the thread found missing by `hold_threads`).
        Op::Fence(_) | Op::CreateThread(_) | Op::SetStatus { .. } => true,
        Op::Blobs { .. } => false,
        op => groupable(op),
    })
}

/// Applies `op` (see [`one_statement`]) as one statement on its own: the fences checked and
/// their lease rows locked by the schema's `hold_leases` (which raises when one was taken
/// over, so the statement writes nothing), every checkpoint, value and write inserted by the
/// same statement, committed as it ends. One round trip, one commit: a step's whole write.
/// `log`: a claimed run's events, written by the same statement under its claim.
pub(super) async fn apply_one_statement<C: Statements + Sync>(
    client: &C,
    op: &Op,
    log: Option<&super::queue::LogRows>,
) -> Result<Done> {
    let mut flat = Vec::new();
    flatten(std::slice::from_ref(op), &mut flat);
    let mut fences: Vec<&crate::checkpoint::Fence> = Vec::new();
    let mut rows = Vec::with_capacity(flat.len());
    for op in flat {
        match op {
            Op::Fence(fence) => {
                if !fences.contains(&fence) {
                    fences.push(fence);
                }
            }
            op => rows.push(op),
        }
    }
    put_rows(client, &fences, &rows, log).await?;
    Ok(Done::Unit)
}

/// Runs statements prepared once per connection: the pool's connections (their statement
/// cache) and the connections driven by the caller ([`super::direct`]).
pub(super) trait Statements {
    fn execute_cached(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> impl Future<Output = std::result::Result<u64, tokio_postgres::Error>> + Send;

    fn query_opt_cached(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> impl Future<Output = std::result::Result<Option<Row>, tokio_postgres::Error>> + Send;
}

/// [`Statements`] for a type with deadpool's statement cache.
macro_rules! cached_statements {
    ($t:ty) => {
        impl Statements for $t {
            async fn execute_cached(
                &self,
                sql: &str,
                params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
            ) -> std::result::Result<u64, tokio_postgres::Error> {
                self.execute(&self.prepare_cached(sql).await?, params).await
            }

            async fn query_opt_cached(
                &self,
                sql: &str,
                params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
            ) -> std::result::Result<Option<Row>, tokio_postgres::Error> {
                self.query_opt(&self.prepare_cached(sql).await?, params).await
            }
        }
    };
}
cached_statements!(deadpool_postgres::Client);
cached_statements!(Transaction<'_>);

/// SQLSTATE `hold_leases` raises for a lease that is no longer the fence's (its detail: the
/// thread).
const LEASE_LOST: &str = "RL001";
/// SQLSTATE `hold_threads` raises for a thread that does not exist (its detail: the thread).
const NO_THREAD: &str = "RL002";

/// Every checkpoint, value and write of `ops` (and no other kind) in one statement, after the
/// `fences` hold: a data-modifying `WITH` per table that has rows, the fences' check as its
/// query (the last of a repeated write's `(task, idx)` kept, as applying them in turn would).
async fn put_rows<C: Statements + Sync>(
    client: &C,
    fences: &[&crate::checkpoint::Fence],
    ops: &[&Op],
    log: Option<&super::queue::LogRows>,
) -> Result<()> {
    let mut checkpoints: Vec<&CheckpointRow> = Vec::new();
    // Threads created: inserted with the status the batch leaves them in.
    let mut created: Vec<ThreadRow> = Vec::new();
    // The last status of each thread that is not created here (a statement may not update one
    // row twice, nor see a row another part of it inserts).
    let mut statuses: Vec<(&str, &str, &str)> = Vec::new();
    let (mut v_threads, mut v_keys, mut v_versions, mut v_texts) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut writes: Vec<(&str, &str, &str, i64, &str, &str)> = Vec::new();
    for op in ops {
        match op {
            Op::Blobs { .. } => {}
            Op::CreateThread(row) => {
                if created.iter().any(|t| t.thread_id == row.thread_id) {
                    return Err(CheckpointError::ThreadExists(row.thread_id.clone()));
                }
                created.push(row.clone());
            }
            Op::SetStatus { thread_id, status, at } => {
                if let Some(t) = created.iter_mut().find(|t| t.thread_id == *thread_id) {
                    t.status = status.as_str().to_owned();
                    t.updated_at = at.clone();
                    continue;
                }
                statuses.retain(|s| s.0 != thread_id.as_str());
                statuses.push((thread_id, status.as_str(), at));
            }
            Op::PutCheckpoint { row, values } => {
                checkpoints.push(row);
                for (key, version, text) in values {
                    v_threads.push(row.thread_id.as_str());
                    v_keys.push(key.as_str());
                    v_versions.push(*version);
                    v_texts.push(text.as_str());
                }
            }
            Op::PutWrites {
                thread_id,
                checkpoint_id,
                writes: rows,
            } => {
                for (task, idx, channel, value) in rows {
                    writes.push((thread_id, checkpoint_id, task, *idx, channel, value));
                }
            }
            _ => {
                return Err(CheckpointError::Backend(
                    "an op that cannot be grouped was grouped".into(),
                ));
            }
        }
    }
    // A statement may not update one row twice: the last put of a key wins.
    if writes.len() > 1 {
        let mut last = std::collections::HashMap::with_capacity(writes.len());
        for (i, w) in writes.iter().enumerate() {
            last.insert((w.0, w.1, w.2, w.3), i);
        }
        let mut i = 0;
        writes.retain(|w| {
            i += 1;
            last.get(&(w.0, w.1, w.2, w.3)) == Some(&(i - 1))
        });
    }

    // Column arrays, owned here so the parameters can borrow them.
    let c_col = |f: fn(&CheckpointRow) -> &str| checkpoints.iter().map(|c| f(c)).collect::<Vec<&str>>();
    let c_threads = c_col(|c| &c.thread_id);
    let c_ids = c_col(|c| &c.checkpoint_id);
    let c_parents: Vec<Option<&str>> = checkpoints.iter().map(|c| c.parent_id.as_deref()).collect();
    let c_steps: Vec<i64> = checkpoints.iter().map(|c| c.step).collect();
    let c_versions = c_col(|c| &c.versions);
    let c_ran = c_col(|c| &c.ran);
    let c_changed = c_col(|c| &c.changed);
    let c_next = c_col(|c| &c.next);
    let c_meta = c_col(|c| &c.meta);
    let c_plans = c_col(|c| &c.plan_hash);
    let c_created = c_col(|c| &c.created_at);
    let w_threads: Vec<&str> = writes.iter().map(|w| w.0).collect();
    let w_cps: Vec<&str> = writes.iter().map(|w| w.1).collect();
    let w_tasks: Vec<&str> = writes.iter().map(|w| w.2).collect();
    let w_idxs: Vec<i64> = writes.iter().map(|w| w.3).collect();
    let w_channels: Vec<&str> = writes.iter().map(|w| w.4).collect();
    let w_texts: Vec<&str> = writes.iter().map(|w| w.5).collect();
    let f_threads: Vec<&str> = fences.iter().map(|f| f.thread_id.as_str()).collect();
    let f_owners: Vec<&str> = fences.iter().map(|f| f.owner.as_str()).collect();
    let f_generations = fences
        .iter()
        .map(|f| format::generation_to_stored(f.generation))
        .collect::<Result<Vec<i64>>>()?;
    let t_col = |f: fn(&ThreadRow) -> &str| created.iter().map(f).collect::<Vec<&str>>();
    let t_ids = t_col(|t| &t.thread_id);
    let t_workflows = t_col(|t| &t.workflow);
    let t_plans = t_col(|t| &t.plan_hash);
    let t_statuses = t_col(|t| &t.status);
    let t_created = t_col(|t| &t.created_at);
    let t_updated = t_col(|t| &t.updated_at);
    let t_inputs = t_col(|t| &t.input);
    let t_contexts = t_col(|t| &t.context);
    let t_configs = t_col(|t| &t.config);
    let t_forked: Vec<Option<&str>> = created
        .iter()
        .map(|t| t.forked_from.as_ref().map(|f| f.0.as_str()))
        .collect();
    let t_forked_at: Vec<Option<&str>> = created
        .iter()
        .map(|t| t.forked_from.as_ref().map(|f| f.1.as_str()))
        .collect();
    let s_threads: Vec<&str> = statuses.iter().map(|s| s.0).collect();
    let s_statuses: Vec<&str> = statuses.iter().map(|s| s.1).collect();
    let s_ats: Vec<&str> = statuses.iter().map(|s| s.2).collect();
    let log = log.filter(|l| !l.bodies.is_empty());

    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = Vec::new();
    let mut ctes: Vec<String> = Vec::new();
    // `$n` for the next parameters, `k` of them.
    let next = |params: &Vec<&(dyn tokio_postgres::types::ToSql + Sync)>, k: usize| {
        let first = params.len() + 1;
        (first..first + k).map(|n| format!("${n}")).collect::<Vec<_>>()
    };
    if !created.is_empty() {
        let p = next(&params, 11);
        // A checkpoint inserted by the same statement finds its thread: the keys are checked
        // at the statement's end.
        ctes.push(format!(
            "nt AS (INSERT INTO threads (thread_id, workflow, plan_hash, status, created_at, updated_at, \
             forked_from_thread, forked_from_checkpoint, touched) \
             SELECT t.*, nextval('thread_touches') FROM unnest({}::text[], {}::text[], {}::text[], {}::text[], \
             {}::text[], {}::text[], {}::text[], {}::text[]) AS t), \
             ni AS (INSERT INTO thread_inputs (thread_id, input, context, config) \
             SELECT * FROM unnest({}::text[], {}::text[], {}::text[], {}::text[]))",
            p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[0], p[8], p[9], p[10]
        ));
        params.extend([
            &t_ids as &(dyn tokio_postgres::types::ToSql + Sync),
            &t_workflows,
            &t_plans,
            &t_statuses,
            &t_created,
            &t_updated,
            &t_forked,
            &t_forked_at,
            &t_inputs,
            &t_contexts,
            &t_configs,
        ]);
    }
    if !checkpoints.is_empty() {
        let p = next(&params, 11);
        ctes.push(format!(
            "c AS (INSERT INTO checkpoints ({CHECKPOINT_COLS}) \
             SELECT c.thread_id, c.checkpoint_id, c.parent_id, c.step, c.versions, c.ran, c.changed, c.next, c.meta, \
                    nullif(c.plan_hash, (SELECT t.plan_hash FROM threads t WHERE t.thread_id = c.thread_id)), c.created_at \
             FROM unnest({}::text[], {}::text[], {}::text[], {}::bigint[], {}::text[], {}::text[], {}::text[], \
                         {}::text[], {}::text[], {}::text[], {}::text[]) \
                  AS c(thread_id, checkpoint_id, parent_id, step, versions, ran, changed, next, meta, plan_hash, created_at))",
            p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10]
        ));
        params.extend([
            &c_threads as &(dyn tokio_postgres::types::ToSql + Sync),
            &c_ids,
            &c_parents,
            &c_steps,
            &c_versions,
            &c_ran,
            &c_changed,
            &c_next,
            &c_meta,
            &c_plans,
            &c_created,
        ]);
    }
    if !v_keys.is_empty() {
        let p = next(&params, 4);
        ctes.push(format!(
            "v AS (INSERT INTO state_values (thread_id, key, version, value) \
             SELECT * FROM unnest({}::text[], {}::text[], {}::bigint[], {}::text[]) ON CONFLICT DO NOTHING)",
            p[0], p[1], p[2], p[3]
        ));
        params.extend([
            &v_threads as &(dyn tokio_postgres::types::ToSql + Sync),
            &v_keys,
            &v_versions,
            &v_texts,
        ]);
    }
    if !writes.is_empty() {
        let p = next(&params, 6);
        ctes.push(format!(
            "w AS (INSERT INTO writes (thread_id, checkpoint_id, task_id, idx, channel, value) \
             SELECT * FROM unnest({}::text[], {}::text[], {}::text[], {}::bigint[], {}::text[], {}::text[]) \
             ON CONFLICT (thread_id, checkpoint_id, task_id, idx) DO UPDATE \
             SET channel = excluded.channel, value = excluded.value)",
            p[0], p[1], p[2], p[3], p[4], p[5]
        ));
        params.extend([
            &w_threads as &(dyn tokio_postgres::types::ToSql + Sync),
            &w_cps,
            &w_tasks,
            &w_idxs,
            &w_channels,
            &w_texts,
        ]);
    }
    if !statuses.is_empty() {
        let p = next(&params, 3);
        ctes.push(format!(
            "s AS (UPDATE threads t SET status = u.status, updated_at = u.at, touched = nextval('thread_touches') \
             FROM unnest({}::text[], {}::text[], {}::text[]) AS u(thread_id, status, at) \
             WHERE t.thread_id = u.thread_id)",
            p[0], p[1], p[2]
        ));
        params.extend([
            &s_threads as &(dyn tokio_postgres::types::ToSql + Sync),
            &s_statuses,
            &s_ats,
        ]);
    }
    // The query itself: the fences' check (their lease rows locked until the commit) and the
    // claim's, the notice of the events logged; or nothing. A data-modifying `WITH` runs
    // whether or not the query reads it.
    let mut checks: Vec<String> = Vec::new();
    if !statuses.is_empty() {
        // The threads whose status is set exist (a fresh snapshot: one removed meanwhile is
        // missing).
        let p = next(&params, 1);
        params.push(&s_threads);
        checks.push(format!("hold_threads({}::text[])", p[0]));
    }
    if !fences.is_empty() {
        let p = next(&params, 3);
        params.extend([
            &f_threads as &(dyn tokio_postgres::types::ToSql + Sync),
            &f_owners,
            &f_generations,
        ]);
        checks.push(format!(
            "hold_leases({}::text[], {}::text[], {}::bigint[])",
            p[0], p[1], p[2]
        ));
    }
    if let Some(l) = log {
        let p = next(&params, 7);
        ctes.push(format!(
            "logged AS (INSERT INTO run_events (run_id, seq, body) \
             SELECT {run}, {from} + n - 1, b FROM unnest({bodies}::text[]) WITH ORDINALITY AS e(b, n) \
             WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = {run} AND claim = {claim}) \
             ON CONFLICT (run_id, seq) DO NOTHING RETURNING seq)",
            run = p[0],
            claim = p[1],
            from = p[3],
            bodies = p[4],
        ));
        checks.push(format!("hold_claim({}, {}, {})", p[0], p[1], p[2]));
        checks.push(format!(
            "(SELECT count(*) FROM (SELECT pg_notify({}, {}) FROM (SELECT 1 FROM logged LIMIT 1) one) told)",
            p[5], p[6]
        ));
        params.extend([
            &l.run_id as &(dyn tokio_postgres::types::ToSql + Sync),
            &l.claim,
            &l.thread,
            &l.from,
            &l.bodies,
            &l.channel,
            &l.payload,
        ]);
    }
    if ctes.is_empty() && checks.is_empty() {
        return Ok(());
    }
    let query = if checks.is_empty() {
        "SELECT 0".to_owned()
    } else {
        format!("SELECT {}", checks.join(", "))
    };
    let sql = if ctes.is_empty() {
        query
    } else {
        format!("WITH {} {query}", ctes.join(", "))
    };
    client.execute_cached(&sql, &params).await.map_err(|e| {
        let Some(db) = e.as_db_error() else { return e.into() };
        match (db.code().code(), db.table()) {
            (LEASE_LOST, _) => CheckpointError::LeaseLost(
                db.detail()
                    .map(str::to_owned)
                    .or_else(|| f_threads.first().map(|t| (*t).to_owned()))
                    .unwrap_or_default(),
            ),
            (NO_THREAD, _) => CheckpointError::NoThread(db.detail().unwrap_or_default().to_owned()),
            (UNIQUE, Some("threads" | "thread_inputs")) if !created.is_empty() => {
                CheckpointError::ThreadExists(created[0].thread_id.clone())
            }
            (FOREIGN_KEY, Some("checkpoints")) if !checkpoints.is_empty() => {
                CheckpointError::NoThread(checkpoints[0].thread_id.clone())
            }
            (UNIQUE, Some("checkpoints")) if !checkpoints.is_empty() => {
                format::duplicate_checkpoint(&checkpoints[0].thread_id, &checkpoints[0].checkpoint_id)
            }
            (FOREIGN_KEY, Some("writes")) if !writes.is_empty() => {
                CheckpointError::NoCheckpoint(w_threads[0].to_owned(), w_cps[0].to_owned())
            }
            _ => e.into(),
        }
    })?;
    Ok(())
}

/// SQLSTATEs of a violated key.
const FOREIGN_KEY: &str = "23503";
const UNIQUE: &str = "23505";

/// The SQLSTATE of a constraint the statement violated, if that is why it failed.
fn violated(e: &tokio_postgres::Error) -> Option<&'static str> {
    match e.code().map(tokio_postgres::error::SqlState::code) {
        Some(FOREIGN_KEY) => Some(FOREIGN_KEY),
        Some(UNIQUE) => Some(UNIQUE),
        _ => None,
    }
}

/// Inserts a checkpoint row: its thread missing is [`CheckpointError::NoThread`], its id
/// stored already a duplicate, as the tables' keys find them.
async fn insert_checkpoint(tx: &Transaction<'_>, row: &CheckpointRow) -> Result<()> {
    // The plan hash is stored only when it is not the thread's (nearly never).
    let sql = format!(
        "INSERT INTO checkpoints ({CHECKPOINT_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, \
         nullif($10, (SELECT plan_hash FROM threads WHERE thread_id = $1)), $11)"
    );
    tx.execute(
        &tx.prepare_cached(&sql).await?,
        &[
            &row.thread_id,
            &row.checkpoint_id,
            &row.parent_id,
            &row.step,
            &row.versions,
            &row.ran,
            &row.changed,
            &row.next,
            &row.meta,
            &row.plan_hash,
            &row.created_at,
        ],
    )
    .await
    .map_err(|e| match violated(&e) {
        Some(FOREIGN_KEY) => CheckpointError::NoThread(row.thread_id.clone()),
        Some(UNIQUE) => format::duplicate_checkpoint(&row.thread_id, &row.checkpoint_id),
        _ => e.into(),
    })?;
    Ok(())
}

/// Stores long strings `(hash, text)` that `thread_id` refers to; a text already stored is not
/// sent again. A stored one is locked `FOR SHARE` until the transaction ends, so a thread
/// deletion elsewhere cannot remove it before this reference to it commits.
async fn store_blobs(tx: &Transaction<'_>, thread_id: &str, blobs: &[(String, String)]) -> Result<()> {
    let known = tx
        .prepare_cached("SELECT 1 FROM blobs WHERE hash = $1 FOR SHARE")
        .await?;
    let text = tx
        .prepare_cached("INSERT INTO blobs (hash, text) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .await?;
    let uses = tx
        .prepare_cached("INSERT INTO blob_refs (thread_id, hash) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .await?;
    for (hash, blob) in blobs {
        if tx.query_opt(&known, &[hash]).await?.is_none() {
            tx.execute(&text, &[hash, blob]).await?;
        }
        tx.execute(&uses, &[&thread_id, hash]).await?;
    }
    Ok(())
}

async fn fork(
    tx: &Transaction<'_>,
    from: &str,
    checkpoint_id: &str,
    new: &str,
    new_id: &str,
    at: &str,
) -> Result<Checkpoint> {
    let mut thread = load_thread(tx, from)
        .await?
        .ok_or_else(|| CheckpointError::NoThread(from.into()))?;
    let mut row = load_checkpoint(tx, from, checkpoint_id)
        .await?
        .ok_or_else(|| CheckpointError::NoCheckpoint(from.into(), checkpoint_id.into()))?;
    if thread_exists(tx, new).await? {
        return Err(CheckpointError::ThreadExists(new.into()));
    }
    thread.thread_id = new.into();
    thread.status = ThreadStatus::Running.as_str().into();
    thread.created_at = at.into();
    thread.updated_at = at.into();
    thread.forked_from = Some((from.into(), checkpoint_id.into()));
    insert_thread(tx, &thread).await?;
    // The copies refer to the same long strings.
    let stmt = tx
        .prepare_cached(
            "INSERT INTO blob_refs (thread_id, hash) SELECT $1, hash FROM blob_refs WHERE thread_id = $2 \
             ON CONFLICT DO NOTHING",
        )
        .await?;
    tx.execute(&stmt, &[&new, &from]).await?;

    row.thread_id = new.into();
    row.checkpoint_id = new_id.into();
    row.parent_id = None;
    row.created_at = at.into();
    insert_checkpoint(tx, &row).await?;
    let checkpoint = resolve_checkpoint(tx, row).await?;
    // Values are copied resolved, so no extension in the new thread refers to the old one.
    let write = tx
        .prepare_cached("INSERT INTO state_values (thread_id, key, version, value) VALUES ($1, $2, $3, $4)")
        .await?;
    for (key, value) in resolved_values(tx, from, &checkpoint.versions, ValueTexts::new()).await? {
        let version = checkpoint.versions[&key];
        let mut blobs = Vec::new();
        let text = format::encode(&value, &mut blobs)?;
        tx.execute(&write, &[&new, &key, &format::version_to_stored(version)?, &text])
            .await?;
        store_blobs(tx, new, &blobs).await?;
    }
    Ok(checkpoint)
}

/// Deletes the checkpoints of `thread_id` newer than `to` with the values they introduced, and
/// the writes stored against `to` and them.
async fn truncate(tx: &Transaction<'_>, thread_id: &str, to: &str) -> Result<()> {
    let row = load_checkpoint(tx, thread_id, to)
        .await?
        .ok_or_else(|| CheckpointError::NoCheckpoint(thread_id.into(), to.into()))?;
    let versions = row.versions()?;
    // Checkpoint ids are UUIDv7 within a thread: newer is greater.
    let stmt = tx
        .prepare_cached("DELETE FROM writes WHERE thread_id = $1 AND checkpoint_id >= $2")
        .await?;
    tx.execute(&stmt, &[&thread_id, &to]).await?;
    let stmt = tx
        .prepare_cached("DELETE FROM checkpoints WHERE thread_id = $1 AND checkpoint_id > $2")
        .await?;
    tx.execute(&stmt, &[&thread_id, &to]).await?;
    // Every value newer than the checkpoint's version of its key, and every value of a key it
    // does not have, in one statement.
    let keys: Vec<&str> = versions.keys().map(String::as_str).collect();
    let kept: Vec<i64> = versions
        .values()
        .map(|v| format::version_to_stored(*v))
        .collect::<Result<_>>()?;
    let stmt = tx
        .prepare_cached(
            "DELETE FROM state_values s WHERE s.thread_id = $1 AND NOT EXISTS ( \
               SELECT 1 FROM unnest($2::text[], $3::bigint[]) AS k(key, version) \
               WHERE k.key = s.key AND s.version <= k.version)",
        )
        .await?;
    tx.execute(&stmt, &[&thread_id, &keys, &kept]).await?;
    Ok(())
}
