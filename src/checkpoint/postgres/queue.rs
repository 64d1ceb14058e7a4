//! The [`RunQueue`] on PostgreSQL: admission under a per-thread advisory lock, claims with
//! `FOR UPDATE SKIP LOCKED` in the statement that takes the thread's lease (the hot calls are
//! one statement each, a function of the schema: see `schema.rs`, version 7), workers' heartbeats
//! and leases timed by the database's clock, the event log, and wake-ups by `LISTEN`/`NOTIFY`
//! (with the caller's polling as the fallback: a notice lost while a listening connection was
//! down is answered by [`Notice::Lagged`]). Two channels per schema: the queue's (admissions,
//! cancels, ends), which every process listens to, and the runs' events, which only a process
//! that reads runs listens to — a worker is not woken by every event of every run.

use std::time::Duration;

use tokio::sync::broadcast;

use super::PostgresCheckpointer;
use super::apply::{DB_NOW_MS, Which};
use crate::checkpoint::queue::{Admission, Claimed, Depth, Ended, Logged, Notice, Records, RunQueue, Stamp};
use crate::checkpoint::runs::{RunRow, RunText, ThreadMeta, ThreadMetaText, json_text};
use crate::checkpoint::{CheckpointError, LeaseClaim, Result};

/// How many notices a slow subscriber may fall behind before it is told it lagged.
const NOTICES: usize = 4096;

/// Records for a run's log, owned (a statement runs on the backend's runtime), with what
/// writing them needs besides: the thread a lost claim is told of (as a lost lease is), and
/// the notice that tells the readers.
pub(super) struct LogRows {
    pub(super) run_id: String,
    pub(super) claim: String,
    /// The first record's sequence number.
    pub(super) from: i64,
    pub(super) bodies: Vec<String>,
    pub(super) thread: String,
    pub(super) channel: String,
    pub(super) payload: String,
}

/// Appends `log`'s records in the caller's transaction if the run is still its claim's, and
/// tells the listeners: `false`, and nothing written, when it is not. One statement.
pub(super) async fn append_rows(tx: &deadpool_postgres::Transaction<'_>, log: &LogRows) -> Result<bool> {
    // Notices of one payload in one transaction are delivered once.
    let stmt = tx
        .prepare_cached(
            "WITH logged AS (INSERT INTO run_events (run_id, seq, body) \
               SELECT $1, $3 + n - 1, b FROM unnest($4::text[]) WITH ORDINALITY AS e(b, n) \
               WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = $1 AND claim = $2) RETURNING seq) \
             SELECT count(*) FROM (SELECT pg_notify($5, $6) FROM logged) told",
        )
        .await?;
    let told: i64 = tx
        .query_one(
            &stmt,
            &[
                &log.run_id,
                &log.claim,
                &log.from,
                &log.bodies,
                &log.channel,
                &log.payload,
            ],
        )
        .await?
        .try_get(0)?;
    Ok(told > 0)
}

impl PostgresCheckpointer {
    /// The queue's notification channel of this schema's processes.
    pub(super) fn channel(&self) -> String {
        channel_name("runner", &self.schema)
    }

    /// The channel of this schema's runs' events.
    pub(super) fn events_channel(&self) -> String {
        channel_name("runner_events", &self.schema)
    }
}

/// A channel's name: `{prefix}_{schema}`, or, where that is longer than PostgreSQL's
/// identifiers may be (63 bytes), the prefix and a hash of the schema.
fn channel_name(prefix: &str, schema: &str) -> String {
    let name = format!("{prefix}_{schema}");
    if name.len() <= 63 {
        return name;
    }
    use sha2::Digest;
    let hash = sha2::Sha256::digest(schema.as_bytes());
    let hex: String = hash.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}_{hex}")
}

/// What a process's listener listens to besides the queue's channel.
#[derive(Default)]
pub(super) struct Listening {
    /// A reader subscribed: the runs' events are listened to as well.
    events: std::sync::atomic::AtomicBool,
    /// Told when `events` is set.
    changed: tokio::sync::Notify,
}

/// The longest payload a notice carries records in: PostgreSQL refuses one of 8,000 bytes.
const CARRIED: usize = 7_000;

/// `notice` as the payload sent.
fn payload(notice: &Notice) -> String {
    match notice {
        Notice::Queued => "q".into(),
        Notice::Events(id, None) => format!("e:{id}"),
        Notice::Events(id, Some(records)) => events_payload(id, records.from, &records.bodies),
        Notice::Cancel(id) => format!("c:{id}"),
        Notice::Ended(id) => format!("x:{id}"),
        Notice::Lagged => "l".into(),
    }
}

/// The payload of a notice of run `id`'s records numbered from `from`: with them when they fit.
fn events_payload(id: &str, from: u64, bodies: &[String]) -> String {
    let carried = serde_json::to_string(bodies).unwrap_or_default();
    if carried.len() + id.len() + 24 > CARRIED {
        return format!("e:{id}");
    }
    format!("e:{id}:{from}:{carried}")
}

fn parse_payload(text: &str) -> Option<Notice> {
    Some(match text.split_once(':') {
        None if text == "q" => Notice::Queued,
        Some(("e", rest)) => match rest.split_once(':') {
            None => Notice::Events(rest.into(), None),
            Some((id, rest)) => {
                let (from, bodies) = rest.split_once(':')?;
                let records = Records {
                    from: from.parse().ok()?,
                    bodies: serde_json::from_str(bodies).ok()?,
                };
                Notice::Events(id.into(), Some(std::sync::Arc::new(records)))
            }
        },
        Some(("c", id)) => Notice::Cancel(id.into()),
        Some(("x", id)) => Notice::Ended(id.into()),
        _ => return None,
    })
}

/// What `admit_run` is given besides the run: the thread's record, and (stamping the record
/// the thread has) the stamp's keys as JSON, now in milliseconds and whether a missing thread
/// may be created.
struct AdmitArgs {
    run: RunText,
    reject_if_busy: bool,
    record: Option<ThreadMetaText>,
    stamp: Option<(String, i64, bool)>,
    channel: String,
}

impl PostgresCheckpointer {
    fn admit_with(
        &self,
        run: &RunRow,
        reject_if_busy: bool,
        record: Option<ThreadMetaText>,
        stamp: Option<(String, i64, bool)>,
    ) -> Result<Admission> {
        let args = std::sync::Arc::new(AdmitArgs {
            run: RunText::from_run(run)?,
            reject_if_busy,
            record,
            stamp,
            channel: self.channel(),
        });
        // On the admissions' own connection, driven by this thread; the pool's way when it
        // cannot be had.
        let direct = args.clone();
        let work: super::direct::Work<Admission> =
            Box::new(move |exec| Box::pin(async move { admit_on(exec, &direct).await }));
        if let Some(admitted) = self.admissions.run(&self.config, &self.tls, work) {
            return admitted;
        }
        let pool = self.pool.clone();
        self.retrying(move || {
            let (args, pool) = (args.clone(), pool.clone());
            async move { admit_on(&pool.get().await?, &args).await }
        })
    }
}

/// Admits a run on `client`: one statement, one round trip (`admit_run`, schema version 10),
/// in which the thread's lock, the busy check, the thread's record, the row and the notice are
/// committed together.
async fn admit_on(client: &(impl super::apply::Statements + Sync), a: &AdmitArgs) -> Result<Admission> {
    let (v, m) = (&a.run, a.record.as_ref());
    let queued = payload(&Notice::Queued);
    let (keys, now_ms, create) = match &a.stamp {
        Some((keys, now_ms, create)) => (Some(keys.as_str()), Some(*now_ms), *create),
        None => (None, None, false),
    };
    let row = client
        .query_opt_cached(
            "SELECT admit_run($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
             $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)",
            &[
                &v.run_id,
                &v.thread_id,
                &v.assistant_id,
                &v.status,
                &v.created_at,
                &v.updated_at,
                &v.kwargs,
                &v.multitask_strategy,
                &v.metadata,
                &v.error,
                &v.event_ids,
                &a.reject_if_busy,
                &m.map(|m| m.created_at.as_str()),
                &m.map(|m| m.updated_at.as_str()),
                &m.map(|m| m.metadata.as_str()),
                &m.and_then(|m| m.ttl.as_deref()),
                &m.and_then(|m| m.expires_at),
                &m.and_then(|m| m.owner.as_deref()),
                &keys,
                &now_ms,
                &create,
                &a.channel,
                &queued,
            ],
        )
        .await?;
    let answer: String = match row {
        Some(row) => row.try_get(0)?,
        None => return Err(CheckpointError::Backend("admit_run answered no row".into())),
    };
    match answer.as_str() {
        "admitted" => Ok(Admission::Admitted),
        "busy" => Ok(Admission::Busy),
        "missing" => Ok(Admission::NoThread),
        other => Err(CheckpointError::Backend(format!("admit_run answered {other:?}"))),
    }
}

/// A claimed run and what its claim read of its thread: the thread, its head and its record.
type ClaimedSeen = (
    Claimed,
    (
        Option<crate::checkpoint::format::ThreadRow>,
        Option<crate::checkpoint::format::CheckpointRow>,
        Option<ThreadMetaText>,
    ),
);

/// Claims a run for `worker` as `claim` says, on `client`: one statement (`claim_run`, schema
/// versions 7 and 10) takes the oldest claimable run, its row locked (rows another claimant holds are
/// skipped), its thread's lease and the run marked running under the claim, or nothing. The
/// claimed run's thread, its head and its record, found by the claim, are sent right behind it
/// on the connection (each statement runs once the one before it has committed): the claim and
/// what the run opens its thread from are one round trip.
async fn claim_on(
    client: &(impl super::apply::Statements + Sync),
    worker: &str,
    claim: &LeaseClaim,
    assistants: Option<&[String]>,
) -> Result<Option<ClaimedSeen>> {
    let ttl = i64::try_from(claim.ttl.as_millis()).unwrap_or(i64::MAX / 4);
    let at = crate::clock::now();
    let which = Which::Claimed;
    let pid = i64::from(claim.pid);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
        [&worker, &claim.owner, &pid, &claim.host, &at, &ttl, &assistants];
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&claim.owner];
    let (thread_sql, head_sql, meta_sql) = (
        super::apply::thread_sql(which),
        super::apply::head_sql(which),
        super::runs::meta_sql(which),
    );
    // Polled in this order each time (`biased`), so each statement is sent after the one
    // before it even when the first of them must be prepared (a round trip of its own) on a
    // new connection: a read sent before the claim would find no thread and the run would
    // start on an empty one.
    let (row, thread, head, record) = tokio::join!(
        biased;
        client.query_opt_cached("SELECT * FROM claim_run($1, $2, $3, $4, $5, $6, $7)", &params),
        client.query_opt_cached(&thread_sql, &key),
        client.query_opt_cached(&head_sql, &key),
        client.query_opt_cached(&meta_sql, &key),
    );
    let Some(row) = row? else {
        return Ok(None);
    };
    let run = super::runs::run_from_row(&row)?.into_run()?;
    let orphaned: bool = row.try_get(11)?;
    // The thread's lease, in the lease table's column order.
    let lease = super::apply::lease_at(&row, 12)?;
    let next: i64 = row.try_get(19)?;
    let seen = (
        thread?.map(|r| super::apply::thread_row(&r)).transpose()?,
        head?.map(|r| super::apply::checkpoint_row(&r)).transpose()?,
        record?.map(|r| super::runs::meta_from_row(&r)).transpose()?,
    );
    Ok(Some((
        Claimed {
            run,
            lease,
            orphaned,
            next_event: u64::try_from(next).unwrap_or(1),
            view: None,
        },
        seen,
    )))
}

impl RunQueue for PostgresCheckpointer {
    fn admit(&self, run: &RunRow, reject_if_busy: bool, thread: Option<&ThreadMeta>) -> Result<bool> {
        let record = thread.map(ThreadMetaText::from_meta).transpose()?;
        Ok(self.admit_with(run, reject_if_busy, record, None)? == Admission::Admitted)
    }

    fn admit_stamped(&self, run: &RunRow, reject_if_busy: bool, stamp: &Stamp) -> Result<Admission> {
        let record = ThreadMetaText::from_meta(&stamp.new)?;
        let keys = json_text(&serde_json::Value::Object(stamp.keys.clone()))?;
        self.admit_with(
            run,
            reject_if_busy,
            Some(record),
            Some((keys, stamp.now_ms, stamp.create)),
        )
    }

    fn claim_serving(
        &self,
        worker: &str,
        claim: &LeaseClaim,
        assistants: Option<&[String]>,
    ) -> Result<Option<Claimed>> {
        let (worker, claim) = (worker.to_owned(), claim.clone());
        let assistants = assistants.map(<[String]>::to_vec);
        // On the claims' own connection, driven by this thread; the pool's way when it cannot
        // be had.
        let (w, c, a) = (worker.clone(), claim.clone(), assistants.clone());
        let work: super::direct::Work<Option<ClaimedSeen>> =
            Box::new(move |exec| Box::pin(async move { claim_on(exec, &w, &c, a.as_deref()).await }));
        let claimed = match self.claims.run(&self.config, &self.tls, work) {
            Some(claimed) => claimed?,
            None => {
                let pool = self.pool.clone();
                self.retrying(move || {
                    let (pool, worker, claim, assistants) =
                        (pool.clone(), worker.clone(), claim.clone(), assistants.clone());
                    async move { claim_on(&pool.get().await?, &worker, &claim, assistants.as_deref()).await }
                })?
            }
        };
        let Some((mut claimed, (thread, head, record))) = claimed else {
            return Ok(None);
        };
        let view = self.view_of(&claimed.run.thread_id, thread, head, record)?;
        claimed.view = Some(Box::new(view));
        Ok(Some(claimed))
    }

    fn heartbeat(&self, worker: &str, ttl: Duration) -> Result<()> {
        let (pool, worker) = (self.pool.clone(), worker.to_owned());
        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4);
        self.retrying(move || {
            let (pool, worker, ttl) = (pool.clone(), worker.clone(), ttl);
            async move {
                let client = pool.get().await?;
                let sql = format!(
                    "INSERT INTO workers (worker_id, expires_at) VALUES ($1, {DB_NOW_MS} + $2) \
                     ON CONFLICT (worker_id) DO UPDATE SET expires_at = excluded.expires_at"
                );
                client
                    .execute(&client.prepare_cached(&sql).await?, &[&worker, &ttl])
                    .await?;
                Ok(())
            }
        })
    }

    fn depth(&self) -> Result<Depth> {
        let pool = self.pool.clone();
        self.block(async move {
            let client = pool.get().await?;
            // The oldest run a worker could take now (as `claim_run` finds them: its thread has
            // no earlier active run and no live lease) is the first by id (ids are ordered by
            // time); its age by the database's clock, from the creation time its admitting
            // process wrote. A run waiting for its thread's earlier run waits for no worker.
            let sql = format!(
                "SELECT (SELECT count(*) FROM runs WHERE status = 'pending'), \
                        (SELECT count(*) FROM runs WHERE status = 'running'), \
                        (SELECT {DB_NOW_MS} - (extract(epoch from p.created_at::timestamptz) * 1000)::bigint \
                           FROM runs p WHERE p.status = 'pending' \
                            AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p.thread_id \
                                            AND e.status IN ('pending', 'running') AND e.run_id < p.run_id) \
                            AND NOT EXISTS (SELECT 1 FROM leases h WHERE h.thread_id = p.thread_id \
                                            AND h.expires_at > {DB_NOW_MS}) \
                          ORDER BY p.run_id LIMIT 1), \
                        (SELECT count(*) FROM workers WHERE expires_at > {DB_NOW_MS})"
            );
            let row = client.query_one(&client.prepare_cached(&sql).await?, &[]).await?;
            let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
            Ok(Depth {
                pending: count(0),
                running: count(1),
                oldest_pending_ms: row.get::<_, Option<i64>>(2).map(|ms| u64::try_from(ms).unwrap_or(0)),
                workers: count(3),
            })
        })
    }

    fn retire(&self, worker: &str) -> Result<()> {
        let (pool, worker) = (self.pool.clone(), worker.to_owned());
        self.retrying(move || {
            let (pool, worker) = (pool.clone(), worker.clone());
            async move {
                let client = pool.get().await?;
                client
                    .execute("DELETE FROM workers WHERE worker_id = $1", &[&worker])
                    .await?;
                Ok(())
            }
        })
    }

    fn release(&self, run_id: &str, claim: &str) -> Result<()> {
        // The claim's token fences the run's writes: a run claimed again (its worker taken for
        // dead) is no longer this claim's.
        let worker = claim;
        let (pool, run_id, worker, channel) = (self.pool.clone(), run_id.to_owned(), worker.to_owned(), self.channel());
        self.retrying(move || {
            let (pool, run_id, worker, channel) = (pool.clone(), run_id.clone(), worker.clone(), channel.clone());
            async move {
                let mut client = pool.get().await?;
                let tx = client.transaction().await?;
                // `running` with no worker: claimable at once (its thread's lease is released by
                // its engine as it stops).
                tx.execute(
                    "UPDATE runs SET worker = NULL, claim = NULL WHERE run_id = $1 AND claim = $2 AND status IN ('pending', 'running')",
                    &[&run_id, &worker],
                )
                .await?;
                tx.execute("SELECT pg_notify($1, $2)", &[&channel, &payload(&Notice::Queued)])
                    .await?;
                tx.commit().await?;
                Ok(())
            }
        })
    }

    fn cancel(&self, run_id: &str, action: &str) -> Result<bool> {
        let (pool, run_id, action, channel, doubt) = (
            self.pool.clone(),
            run_id.to_owned(),
            action.to_owned(),
            self.channel(),
            super::doubt::InDoubt::new(),
        );
        self.retrying(move || {
            let (pool, run_id, action, channel, doubt) = (
                pool.clone(),
                run_id.clone(),
                action.clone(),
                channel.clone(),
                doubt.clone(),
            );
            async move {
                let mut client = pool.get().await?;
                // Ended by a try whose commit went unanswered: not found running now.
                if let Some(ended) = doubt.settled(&client).await? {
                    return Ok(ended);
                }
                let tx = client.transaction().await?;
                let xid = super::doubt::xid(&tx);
                let at = crate::clock::now();
                // A run nobody claimed ends here; a claim in progress holds the row, and this
                // waits for it, then finds the run running.
                let error = json_text(&serde_json::json!({
                    "error": "UserInterrupt",
                    "message": "interrupt requested via POST /threads/{thread_id}/runs/{run_id}/cancel",
                }))?;
                let (xid, ended) = tokio::join!(xid, async {
                    tx.execute(
                        "UPDATE runs SET status = 'interrupted', cancel = $2, error = $3, updated_at = $4 \
                             WHERE run_id = $1 AND status = 'pending' AND worker IS NULL",
                        &[&run_id, &action, &error, &at],
                    )
                    .await
                });
                let (xid, ended) = (xid?, ended? > 0);
                if ended {
                    tx.execute(
                        "SELECT pg_notify($1, $2)",
                        &[&channel, &payload(&Notice::Ended(run_id.clone()))],
                    )
                    .await?;
                    // The thread's next run is claimable now: the workers wake on admissions.
                    tx.execute(
                        "SELECT pg_notify($1, $2) FROM runs n WHERE n.status = 'pending' \
                         AND n.thread_id = (SELECT r.thread_id FROM runs r WHERE r.run_id = $3) LIMIT 1",
                        &[&channel, &payload(&Notice::Queued), &run_id],
                    )
                    .await?;
                } else {
                    tx.execute(
                        "UPDATE runs SET cancel = $2 WHERE run_id = $1 AND status IN ('pending', 'running')",
                        &[&run_id, &action],
                    )
                    .await?;
                    tx.execute(
                        "SELECT pg_notify($1, $2)",
                        &[&channel, &payload(&Notice::Cancel(run_id.clone()))],
                    )
                    .await?;
                }
                doubt.commit(tx, xid, ended).await
            }
        })
    }

    fn cancels_asked(&self, run_ids: &[String]) -> Result<Vec<(String, String)>> {
        if run_ids.is_empty() {
            return Ok(Vec::new());
        }
        let (pool, run_ids) = (self.pool.clone(), run_ids.to_vec());
        self.retrying(move || {
            let (pool, run_ids) = (pool.clone(), run_ids.clone());
            async move {
                let client = pool.get().await?;
                let stmt = client
                    .prepare_cached("SELECT run_id, cancel FROM runs WHERE run_id = ANY($1) AND cancel IS NOT NULL")
                    .await?;
                client
                    .query(&stmt, &[&run_ids])
                    .await?
                    .iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                    .collect()
            }
        })
    }

    fn append(&self, run_id: &str, claim: &str, from: u64, bodies: &[String]) -> Result<bool> {
        // The claim's token fences the run's writes: a run claimed again (its worker taken for
        // dead) is no longer this claim's.
        let worker = claim;
        let (pool, run_id, worker, channel) = (
            self.pool.clone(),
            run_id.to_owned(),
            worker.to_owned(),
            self.events_channel(),
        );
        // Shared by every try rather than copied into each.
        let payload = std::sync::Arc::new(events_payload(&run_id, from, bodies));
        let bodies = std::sync::Arc::new(bodies.to_vec());
        let first = i64::try_from(from).map_err(|_| CheckpointError::Backend(format!("event {from}")))?;
        self.retrying(move || {
            let (pool, run_id, worker, channel, bodies, payload) = (
                pool.clone(),
                run_id.clone(),
                worker.clone(),
                channel.clone(),
                bodies.clone(),
                payload.clone(),
            );
            async move {
                let client = pool.get().await?;
                // One statement (`append_events`, schema version 7), committed without waiting
                // for the disk: events can be replayed from the run's checkpoints.
                let stmt = client
                    .prepare_cached("SELECT append_events($1, $2, $3, $4, $5, $6)")
                    .await?;
                Ok(client
                    .query_one(&stmt, &[&run_id, &worker, &first, &*bodies, &channel, &*payload])
                    .await?
                    .try_get(0)?)
            }
        })
    }

    fn commit_logged(&self, puts: Vec<crate::checkpoint::Put>, synced: bool, log: Logged<'_>) -> Result<bool> {
        let fenced = puts
            .iter()
            .find_map(|p| match p {
                crate::checkpoint::Put::Fence(f) => Some(f.thread_id.clone()),
                _ => None,
            })
            .unwrap_or_else(|| log.run_id.to_owned());
        let rows = LogRows {
            run_id: log.run_id.to_owned(),
            claim: log.claim.to_owned(),
            from: i64::try_from(log.from).map_err(|_| CheckpointError::Backend(format!("event {}", log.from)))?,
            bodies: log.bodies.to_vec(),
            thread: fenced,
            channel: self.events_channel(),
            payload: events_payload(log.run_id, log.from, log.bodies),
        };
        self.write_logged(crate::checkpoint::format::batch_op(puts)?, synced, rows)?;
        Ok(synced || self.durability != crate::checkpoint::Durability::PowerSafe)
    }

    fn events(&self, run_id: &str, after: u64, limit: usize) -> Result<Vec<(u64, String)>> {
        let (pool, run_id) = (self.pool.clone(), run_id.to_owned());
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.retrying(move || {
            let (pool, run_id, after, limit) = (pool.clone(), run_id.clone(), after, limit);
            async move {
                let client = pool.get().await?;
                let stmt = client
                    .prepare_cached(
                        "SELECT seq, body FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    )
                    .await?;
                client
                    .query(&stmt, &[&run_id, &after, &limit])
                    .await?
                    .iter()
                    .map(|r| Ok((u64::try_from(r.try_get::<_, i64>(0)?).unwrap_or(0), r.try_get(1)?)))
                    .collect()
            }
        })
    }

    fn finish(&self, run_id: &str, claim: &str, end: Ended<'_>) -> Result<()> {
        // The claim's token fences the run's writes: a run claimed again (its worker taken for
        // dead) is no longer this claim's.
        let worker = claim;
        let error = end.error.map(json_text).transpose()?;
        let record = end
            .record
            .map(|(seq, body)| {
                Ok::<_, CheckpointError>((
                    i64::try_from(seq).map_err(|_| CheckpointError::Backend(format!("event {seq}")))?,
                    body.to_owned(),
                ))
            })
            .transpose()?;
        let (pool, run_id, worker, at, status, channel) = (
            self.pool.clone(),
            run_id.to_owned(),
            worker.to_owned(),
            end.at.to_owned(),
            end.status,
            self.channel(),
        );
        self.retrying(move || {
            let (error, record, pool, run_id, worker, at, status, channel) = (
                error.clone(),
                record.clone(),
                pool.clone(),
                run_id.clone(),
                worker.clone(),
                at.clone(),
                status,
                channel.clone(),
            );
            async move {
                let client = pool.get().await?;
                // One statement (`finish_run`, schema version 7): the row, the log's last
                // record and the notice together.
                let stmt = client
                    .prepare_cached("SELECT finish_run($1, $2, $3, $4, $5, $6, $7, $8, $9)")
                    .await?;
                let (seq, body) = match &record {
                    Some((seq, body)) => (Some(*seq), Some(body.as_str())),
                    None => (None, None),
                };
                let payload = payload(&Notice::Ended(run_id.clone()));
                client
                    .query_one(
                        &stmt,
                        &[
                            &run_id,
                            &worker,
                            &status.as_str(),
                            &error,
                            &at,
                            &seq,
                            &body,
                            &channel,
                            &payload,
                        ],
                    )
                    .await?;
                Ok(())
            }
        })
    }

    fn subscribe(&self, events: bool) -> Result<broadcast::Receiver<Notice>> {
        let sender = self.notices.get_or_init(|| {
            let (tx, _) = broadcast::channel(NOTICES);
            if let Some(runtime) = &self.runtime {
                runtime.spawn(listen(
                    self.config.clone(),
                    self.tls.clone(),
                    [self.channel(), self.events_channel()],
                    self.listening.clone(),
                    tx.clone(),
                ));
            }
            tx
        });
        let receiver = sender.subscribe();
        if events && !self.listening.events.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.listening.changed.notify_one();
        }
        Ok(receiver)
    }
}

/// Listens on the queue's channel on a connection of its own, and on the events' once a
/// reader asks, forwarding every notice; reconnects when the connection is lost, telling
/// subscribers they may have missed some (as it does once it hears the events: a reader that
/// subscribed before looks again).
async fn listen(
    config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    [queue, events]: [String; 2],
    listening: std::sync::Arc<Listening>,
    tx: broadcast::Sender<Notice>,
) {
    let mut pause = Duration::from_millis(100);
    loop {
        if let Ok((client, mut connection)) = config.connect(tls.clone()).await {
            {
                let (notes_tx, mut notes) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                    use futures::StreamExt;
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                let _ = notes_tx.send(n.payload().to_owned());
                            }
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                });
                if client.batch_execute(&format!("LISTEN {queue}")).await.is_ok() {
                    pause = Duration::from_millis(100);
                    // Whatever happened while nobody listened is looked at again.
                    let _ = tx.send(Notice::Lagged);
                    let mut hearing_events = false;
                    loop {
                        if !hearing_events && listening.events.load(std::sync::atomic::Ordering::SeqCst) {
                            if client.batch_execute(&format!("LISTEN {events}")).await.is_err() {
                                break;
                            }
                            hearing_events = true;
                            let _ = tx.send(Notice::Lagged);
                        }
                        tokio::select! {
                            text = notes.recv() => match text {
                                Some(text) => {
                                    if let Some(notice) = parse_payload(&text) {
                                        let _ = tx.send(notice);
                                    }
                                }
                                None => break,
                            },
                            () = listening.changed.notified(), if !hearing_events => {}
                        }
                    }
                }
                driver.abort();
            }
        }
        let _ = tx.send(Notice::Lagged);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
