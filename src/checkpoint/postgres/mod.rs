//! PostgreSQL checkpointer: one database shared by many runner processes.
//!
//! The same format as SQLite (rows, encoding, ops and their rules: [`super::format`]), applied
//! with PostgreSQL's SQL over an asynchronous client (tokio-postgres) and a pool of connections
//! (deadpool-postgres). The [`Checkpointer`] trait is synchronous, as it is for SQLite: the
//! backend owns a small tokio runtime of its own on which every query runs, and a trait call
//! is a spawn onto it and a wait for the answer — the SQLite writer thread's design, with a
//! network database behind it. No call ever blocks that runtime, so a caller on any runtime
//! (or none) is served. The exception is a step's one-statement write, the hottest call: the
//! calling thread sends it and waits for its answer itself, on a connection of the steps' own
//! (`direct.rs`; up to [`STEP_LINKS`], for steps committing at once), with no hand-off to that
//! runtime and back.
//!
//! What PostgreSQL adds over SQLite:
//! - Every write is one transaction (a batch of [`Put`](super::Put)s: one superstep's commit).
//!   [`Durability::CrashSafe`] commits asynchronously (`synchronous_commit = off`: the server
//!   acknowledges before its WAL reaches the disk; a runner process may die at any time and
//!   lose nothing, the server's own crash may lose its last moments), [`Durability::PowerSafe`]
//!   waits for the flush. [`Checkpointer::put_batch_unsynced`] always commits asynchronously.
//! - Leases are timed by the database's clock, never a process's: `expires_at` is the server's
//!   `clock_timestamp()` plus the claim's time to live, so processes on hosts whose clocks
//!   disagree still agree on who holds a thread. A fence is checked with the lease row locked
//!   (`FOR SHARE`) until the batch commits, so no takeover slips between the check and the
//!   writes.
//! - The tables live in a schema of their own (`runner`, or the URL's `schema` parameter),
//!   created and migrated on open under an advisory lock, so many processes starting at once
//!   migrate once, and LangGraph's own tables (`checkpoints`, …) in the same database are left
//!   alone.
//!
//! The URL is libpq's, with runner's own parameters (`schema`, `pool_size`): see [`crate::pg`],
//! which the data store's PostgreSQL backend shares.

mod apply;
mod cache;
mod crons;
mod direct;
mod doubt;
mod queue;
mod remove;
mod runs;
mod schema;
mod users;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use serde_json::{Map, Value};

use super::format::{self, Done, Op};
use super::{
    Checkpoint, CheckpointError, Checkpointer, Durability, Fence, Lease, LeaseClaim, PendingWrite, Put, Result, Thread,
};

use crate::pg;

pub use schema::SCHEMA_VERSION;

impl From<tokio_postgres::Error> for CheckpointError {
    fn from(e: tokio_postgres::Error) -> Self {
        if unavailable(&e) {
            CheckpointError::Unavailable(pg::describe(&e))
        } else {
            CheckpointError::Backend(pg::describe(&e))
        }
    }
}

impl From<deadpool_postgres::PoolError> for CheckpointError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            deadpool_postgres::PoolError::Timeout(_) => CheckpointError::Unavailable(format!(
                "postgres: no connection became free within {}s (every connection of the pool is busy, or the \
                 server refuses new ones)",
                pg::POOL_WAIT.as_secs()
            )),
            other => CheckpointError::Backend(format!("postgres: {other}")),
        }
    }
}

/// Whether an error is the connection's, not the statement's: the server is down or
/// restarting, or the connection was closed or terminated. Nothing the transaction did was
/// committed (a lost `COMMIT` aside), so the call may be tried again.
fn unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(db) = e.as_db_error() {
        // Class 08: connection exception; class 57P: the server shutting down or starting
        // (57P01 admin_shutdown is what pg_terminate_backend sends); 53300: too many
        // connections.
        let code = db.code().code();
        return code.starts_with("08") || code.starts_with("57P") || code == "53300";
    }
    // No server answer at all: an I/O error (refused, reset) or a connect timeout.
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()) || e.to_string().contains("timed out")
}

/// A [`Checkpointer`] on a PostgreSQL database.
pub struct PostgresCheckpointer {
    pool: Pool,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    durability: Durability,
    /// Where the URL came from, for messages: the host, port, database and schema, never the
    /// password.
    display: String,
    /// The schema its tables live in.
    schema: String,
    /// The schema version the database had when it was opened (0: none) and has now.
    migrated: (i64, i64),
    /// How long a call keeps trying while the database cannot be reached (the URL's
    /// `retry_for`).
    retry_for: Duration,
    /// How to open a connection of its own (the queue's listener).
    config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    /// The queue's notices, once somebody subscribed.
    notices: std::sync::OnceLock<tokio::sync::broadcast::Sender<super::queue::Notice>>,
    /// Whether runs' events are listened to as well (a reader subscribed).
    listening: std::sync::Arc<queue::Listening>,
    /// The connections a step's one-statement write, a claim and an admission go on, driven
    /// by the calling thread (each opened on first use).
    steps: direct::Direct,
    claims: direct::Direct,
    admissions: direct::Direct,
}

impl PostgresCheckpointer {
    /// Connects to the database at `url`, creating the schema's tables or migrating them to
    /// this build's version. Fails at once when the server cannot be reached.
    pub fn open(url: &str, durability: Durability) -> Result<Self> {
        let mut store = Self::connect(url, durability)?;
        let (pool, schema) = (store.pool.clone(), store.schema.clone());
        store.migrated = store.block(async move { schema::migrate(&pool, &schema).await })?;
        Ok(store)
    }

    /// The pool and runtime; nothing is asked of the server yet.
    fn connect(url: &str, durability: Durability) -> Result<Self> {
        let mut target = pg::parse_url(url).map_err(CheckpointError::Backend)?;
        // A statement is planned once per connection, not at each execution: the server
        // otherwise plans a statement's first executions anew and keeps doing so while a
        // custom plan looks cheaper, which for a step's inserts from arrays it always does
        // (half the server's time on a step went to planning it). So no statement here has an
        // optional filter (`$1 IS NULL OR column = $1`), which a plan made once cannot serve
        // with an index: each filter is a statement of its own.
        let mut options = format!(
            "{} -c plan_cache_mode=force_generic_plan",
            target.config.get_options().unwrap_or_default()
        );
        if durability == Durability::CrashSafe {
            // Every commit of a crash-safe store is asynchronous: set once per connection, not
            // a statement (a round trip) per transaction.
            options.push_str(" -c synchronous_commit=off");
        }
        target.config.options(options.trim());
        let runtime = pg::runtime("runner-postgres").map_err(CheckpointError::Backend)?;
        let tls = pg::tls().map_err(CheckpointError::Backend)?;
        let pool = pg::pool(&target, tls.clone()).map_err(CheckpointError::Backend)?;
        Ok(PostgresCheckpointer {
            pool,
            runtime: Some(runtime),
            durability,
            display: target.display,
            schema: target.schema,
            migrated: (0, 0),
            retry_for: target.retry_for,
            config: target.config,
            tls,
            notices: std::sync::OnceLock::new(),
            listening: std::sync::Arc::default(),
            steps: direct::Direct::new("runner-steps", STEP_LINKS.min(target.pool_size)),
            claims: direct::Direct::new("runner-claims", 1),
            admissions: direct::Direct::new("runner-admissions", 1),
        })
    }

    /// The database and schema, for messages (no password).
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The schema the database at `url` keeps runner's tables in (runner's own unless the URL
    /// names one), without connecting; or why the URL is not valid.
    pub fn schema_of(url: &str) -> std::result::Result<String, String> {
        pg::parse_url(url).map(|t| t.schema)
    }

    /// Connects to the database at `url` to look only: nothing is created or migrated. `None`
    /// when the database has no runner schema (it holds no threads); a newer schema is refused.
    pub fn open_existing(url: &str) -> Result<Option<Self>> {
        let mut store = Self::connect(url, Durability::CrashSafe)?;
        let (pool, schema) = (store.pool.clone(), store.schema.clone());
        let version = store.block(async move { schema::version(&pool, &schema).await })?;
        Ok(version.map(|v| {
            store.migrated = (v, v);
            store
        }))
    }

    /// The schema version the database had when it was opened (0: none) and has now
    /// (`runner db migrate`).
    pub fn migrated(&self) -> (i64, i64) {
        self.migrated
    }

    /// The stored `(key, version)` values, for tests of what a step stores.
    pub fn value_rows(&self) -> Result<u64> {
        let pool = self.pool.clone();
        self.block(async move {
            let client = pool.get().await?;
            let n: i64 = client.query_one("SELECT count(*) FROM state_values", &[]).await?.get(0);
            Ok(n as u64)
        })
    }

    /// Whether the database answers, and how long it took: a health check.
    pub fn round_trip(&self) -> Result<Duration> {
        let pool = self.pool.clone();
        self.block(async move {
            let started = std::time::Instant::now();
            let client = pool.get().await?;
            client.simple_query("SELECT 1").await?;
            Ok(started.elapsed())
        })
    }

    /// Runs `work` on the backend's runtime and waits for its answer.
    fn block<T: Send + 'static>(&self, work: impl Future<Output = Result<T>> + Send + 'static) -> Result<T> {
        let stopped = || CheckpointError::Backend("the PostgreSQL client has stopped".into());
        let runtime = self.runtime.as_ref().ok_or_else(stopped)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(work.await);
        });
        crate::blocking::wait(&rx).map_err(|_| stopped())?
    }

    /// Runs the work `make` gives on the backend's runtime, made again and tried again while
    /// the database cannot be reached (for the URL's `retry_for`), and waits for its answer.
    pub(super) fn retrying<T, F, Fut>(&self, make: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let retry_for = if super::tried_once() {
            Duration::ZERO
        } else {
            self.retry_for
        };
        self.block(async move {
            let deadline = tokio::time::Instant::now() + retry_for;
            let mut pause = Duration::from_millis(50);
            loop {
                match make().await {
                    Err(CheckpointError::Unavailable(why)) => {
                        if tokio::time::Instant::now() + pause > deadline {
                            return Err(CheckpointError::Unavailable(why));
                        }
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                    other => return other,
                }
            }
        })
    }

    /// Applies `op` in one transaction; `synced: false` commits without waiting for the flush.
    fn write(&self, op: Op, synced: bool) -> Result<Done> {
        self.write_with(Arc::new(op), synced, None)
    }

    /// [`Self::write`], with `log`'s records (if any) appended to its run's log in the same
    /// transaction, fenced by its claim. A step's write (see [`apply::one_statement`]) and its
    /// records are one statement ([`Self::write_one`]), the fences and the claim checked by it.
    fn write_with(&self, op: Arc<Op>, synced: bool, log: Option<Arc<queue::LogRows>>) -> Result<Done> {
        // A crash-safe store's connections commit asynchronously already.
        let unsynced = !synced && self.durability == Durability::PowerSafe;
        // A step's fenced checkpoint and writes: one statement, committed on its own (one
        // round trip), unless its commit is to be asynchronous on a power-safe store.
        if !unsynced && apply::one_statement(&op) {
            return self.write_one(op, log);
        }
        let (pool, doubt) = (self.pool.clone(), doubt::InDoubt::new());
        self.retrying(move || {
            let (pool, op, log, doubt) = (pool.clone(), op.clone(), log.clone(), doubt.clone());
            async move {
                let mut client = pool.get().await?;
                if let Some(done) = doubt.settled(&client).await? {
                    return Ok(done);
                }
                let tx = client.transaction().await?;
                if unsynced {
                    tx.batch_execute("SET LOCAL synchronous_commit = off").await?;
                }
                let (xid, done) = tokio::join!(doubt::xid(&tx), apply::apply(&tx, &op));
                let (xid, done) = (xid?, done?);
                if let Some(log) = log.filter(|l| !l.bodies.is_empty())
                    && !queue::append_rows(&tx, &log).await?
                {
                    return Err(CheckpointError::LeaseLost(log.thread.clone()));
                }
                doubt.commit(tx, xid, done).await
            }
        })
    }

    /// Applies `op` (see [`apply::one_statement`]) and `log`'s records as one statement: on the
    /// calling thread, with no hand-off to the backend's runtime, when the step's connection is
    /// free; the pool's way otherwise, or when it broke.
    ///
    /// The statement is one transaction, so a try whose answer was lost (its connection broke)
    /// either committed all of it or nothing. Made again, one that had committed meets its own
    /// rows; it is found by its checkpoint, stored, and answers as the first try would have.
    fn write_one(&self, op: Arc<Op>, log: Option<Arc<queue::LogRows>>) -> Result<Done> {
        use std::sync::atomic::{AtomicBool, Ordering};
        // Whether a try was sent, which may have committed.
        let tried = Arc::new(AtomicBool::new(false));
        let (o, l, t) = (op.clone(), log.clone(), tried.clone());
        let work: direct::Work<Done> = Box::new(move |exec| {
            Box::pin(async move {
                t.store(true, Ordering::SeqCst);
                apply::apply_one_statement(exec, &o, l.as_deref()).await
            })
        });
        if let Some(done) = self.steps.run(&self.config, &self.tls, work) {
            return done;
        }
        let pool = self.pool.clone();
        self.retrying(move || {
            let (pool, op, log, tried) = (pool.clone(), op.clone(), log.clone(), tried.clone());
            async move {
                let client = pool.get().await?;
                let again = tried.swap(true, Ordering::SeqCst);
                match apply::apply_one_statement(&client, &op, log.as_deref()).await {
                    Err(e) if again && !matches!(e, CheckpointError::Unavailable(_)) => {
                        match apply::stored_checkpoint(&op) {
                            Some((thread, id)) if apply::checkpoint_exists(&client, thread, id).await? => {
                                Ok(Done::Unit)
                            }
                            _ => Err(e),
                        }
                    }
                    done => done,
                }
            }
        })
    }

    /// [`Self::write`], with `log`'s records appended to its run's log in the same transaction
    /// (the queue's `commit_logged`).
    fn write_logged(&self, op: Op, synced: bool, log: queue::LogRows) -> Result<Done> {
        self.write_with(Arc::new(op), synced, Some(Arc::new(log)))
    }

    /// A thread, its latest checkpoint and (with `meta`) its record: the statements sent
    /// together on one connection, one round trip. A row whose long strings are stored apart
    /// is read again with them.
    fn look(&self, thread_id: &str, meta: bool) -> Result<crate::checkpoint::ThreadView> {
        let id = thread_id.to_owned();
        let (thread, head, record) = self.read(Read::One, move |client| {
            Box::pin(async move {
                let record = async {
                    match meta {
                        true => runs::load_meta(client, &id).await,
                        false => Ok(None),
                    }
                };
                let (thread, head, record) = tokio::join!(
                    apply::load_thread(client, &id),
                    apply::load_checkpoint_or_head(client, &id, None),
                    record
                );
                Ok((thread?, head?, record?))
            })
        })?;
        self.view_of(thread_id, thread, head, record)
    }

    /// The thread `thread_id` from its rows as read: a row whose long strings are stored apart
    /// is read again with them.
    pub(super) fn view_of(
        &self,
        thread_id: &str,
        thread: Option<format::ThreadRow>,
        head: Option<format::CheckpointRow>,
        record: Option<crate::checkpoint::runs::ThreadMetaText>,
    ) -> Result<crate::checkpoint::ThreadView> {
        let long = |t: &str| apply::refers_to_blobs(t);
        let thread = match thread {
            None => None,
            Some(t) if [&t.input, &t.context, &t.config].iter().any(|s| long(s)) => self.get_thread(thread_id)?,
            Some(t) => Some(t.into_thread(&mut |_| Ok(None))?),
        };
        let head = match head {
            None => None,
            Some(h) if long(&h.meta) => self.get_checkpoint(thread_id, None)?,
            Some(h) => Some(h.into_checkpoint(&mut |_| Ok(None))?),
        };
        let meta = record
            .map(crate::checkpoint::runs::ThreadMetaText::into_meta)
            .transpose()?;
        Ok(crate::checkpoint::ThreadView { thread, head, meta })
    }

    fn write_unit(&self, op: Op) -> Result<()> {
        self.write(op, true).map(|_| ())
    }

    /// Runs `f` on a pooled connection, as `how` says: [`Read::One`], a read of one statement
    /// (its own snapshot), with no transaction around it; [`Read::Snapshot`], in one read-only
    /// transaction, in as few round trips as its statements allow: the `BEGIN` is sent with
    /// `f`'s first statement, not waited for first, and the transaction's end is not waited for
    /// at all (a read-only transaction's `ROLLBACK` is its `COMMIT`; the connection goes back to
    /// the pool once it is answered, and anything sent on it after waits behind it).
    fn read<T, F>(&self, how: Read, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c deadpool_postgres::Client) -> apply::BoxFuture<'c, Result<T>>
            + Clone
            + Send
            + Sync
            + 'static,
    {
        let pool = self.pool.clone();
        self.retrying(move || {
            let (pool, f) = (pool.clone(), f.clone());
            async move {
                let client = pool.get().await?;
                if how == Read::One {
                    return f(&client).await;
                }
                // Sent in this order on the connection: `join!` polls the `BEGIN` first.
                let (began, out) = tokio::join!(client.batch_execute(READ_ONLY), f(&client));
                tokio::spawn(async move {
                    let _ = client.batch_execute("ROLLBACK").await;
                });
                began?;
                out
            }
        })
    }
}

/// How a read is made (see [`PostgresCheckpointer::read`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// One statement, its own snapshot.
    One,
    /// Several statements that see one snapshot.
    Snapshot,
}

/// At most how many connections of their own a process's step writes take (each opened when
/// the ones before it are all busy with another step: as many as steps commit at once), and
/// no more than the pool's size.
const STEP_LINKS: usize = 4;

/// How a read begins: one snapshot for all its statements, and no write among them.
const READ_ONLY: &str = "START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";

impl Drop for PostgresCheckpointer {
    /// Every acknowledged write is committed when its call returns: nothing is pending. The
    /// runtime is let go without waiting (a drop may happen on another runtime's thread, where
    /// blocking is not allowed); its connections close with it.
    fn drop(&mut self) {
        self.pool.close();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Checkpointer for PostgresCheckpointer {
    fn create_thread(&self, thread: &Thread) -> Result<()> {
        self.write_unit(format::create_thread_op(thread)?)
    }

    fn set_status(&self, thread_id: &str, status: super::ThreadStatus) -> Result<()> {
        self.write_unit(format::status_op(thread_id.to_owned(), status))
    }

    fn get_thread(&self, thread_id: &str) -> Result<Option<Thread>> {
        let thread_id = thread_id.to_owned();
        // One statement, unless the thread's texts refer to long strings stored apart: those
        // are read in the same snapshot as the row.
        let id = thread_id.clone();
        let row = self.read(Read::One, move |c| {
            Box::pin(async move { apply::load_thread(c, &id).await })
        })?;
        match row {
            None => return Ok(None),
            Some(row)
                if ![&row.input, &row.context, &row.config]
                    .iter()
                    .any(|t| apply::refers_to_blobs(t)) =>
            {
                return row.into_thread(&mut |_| Ok(None)).map(Some);
            }
            Some(_) => {}
        }
        self.read(Read::Snapshot, move |tx| {
            Box::pin(async move {
                match apply::load_thread(tx, &thread_id).await? {
                    Some(row) => Ok(Some(apply::resolve_thread(tx, row).await?)),
                    None => Ok(None),
                }
            })
        })
    }

    fn list_threads(&self) -> Result<Vec<Thread>> {
        self.read(Read::Snapshot, |tx| {
            Box::pin(async move {
                let sql = format!(
                    "SELECT {} FROM {} ORDER BY t.touched DESC",
                    apply::THREAD_COLS,
                    apply::THREAD_FROM
                );
                let rows = tx.query(&tx.prepare_cached(&sql).await?, &[]).await?;
                let mut out = Vec::with_capacity(rows.len());
                for row in rows {
                    out.push(apply::resolve_thread(tx, apply::thread_row(&row)?).await?);
                }
                Ok(out)
            })
        })
    }

    fn list_thread_heads(&self) -> Result<Vec<super::ThreadHead>> {
        self.read(Read::One, |tx| {
            Box::pin(async move {
                let rows = tx
                    .query(
                        "SELECT thread_id, workflow, status, created_at, updated_at FROM threads ORDER BY touched DESC",
                        &[],
                    )
                    .await?;
                rows.iter()
                    .map(|r| {
                        Ok(super::ThreadHead {
                            thread_id: r.try_get(0)?,
                            workflow: r.try_get(1)?,
                            status: format::parse_status(r.try_get(2)?)?,
                            created_at: r.try_get(3)?,
                            updated_at: r.try_get(4)?,
                        })
                    })
                    .collect()
            })
        })
    }

    fn put_checkpoint(&self, checkpoint: &Checkpoint, values: &[(String, u64, Value)]) -> Result<()> {
        self.write_unit(format::checkpoint_op(checkpoint, values)?)
    }

    fn put_batch_unsynced(&self, puts: Vec<Put>) -> Result<bool> {
        self.write(format::batch_op(puts)?, false)?;
        Ok(self.durability != Durability::PowerSafe)
    }

    fn put_batch(&self, puts: Vec<Put>) -> Result<()> {
        self.write_unit(format::batch_op(puts)?)
    }

    fn thread_and_head(&self, thread_id: &str) -> Result<(Option<Thread>, Option<Checkpoint>)> {
        let view = self.look(thread_id, false)?;
        Ok((view.thread, view.head))
    }

    fn thread_view(&self, thread_id: &str) -> Result<crate::checkpoint::ThreadView> {
        self.look(thread_id, true)
    }

    fn get_checkpoint(&self, thread_id: &str, checkpoint_id: Option<&str>) -> Result<Option<Checkpoint>> {
        let (thread_id, checkpoint_id) = (thread_id.to_owned(), checkpoint_id.map(str::to_owned));
        // One statement, unless the checkpoint's metadata refers to long strings stored apart:
        // those are read in the same snapshot as the row.
        let (t, c) = (thread_id.clone(), checkpoint_id.clone());
        let row = self.read(Read::One, move |client| {
            Box::pin(async move { apply::load_checkpoint_or_head(client, &t, c.as_deref()).await })
        })?;
        match row {
            None => return Ok(None),
            Some(row) if !apply::refers_to_blobs(&row.meta) => return row.into_checkpoint(&mut |_| Ok(None)).map(Some),
            Some(_) => {}
        }
        self.read(Read::Snapshot, move |tx| {
            Box::pin(async move {
                let row = apply::load_checkpoint_or_head(tx, &thread_id, checkpoint_id.as_deref()).await?;
                match row {
                    Some(row) => Ok(Some(apply::resolve_checkpoint(tx, row).await?)),
                    None => Ok(None),
                }
            })
        })
    }

    fn checkpoint_state(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<(Checkpoint, Map<String, Value>)>> {
        let (thread_id, checkpoint_id) = (thread_id.to_owned(), checkpoint_id.map(str::to_owned));
        // One statement: the checkpoint and its values' texts. Checkpoints and values are
        // never changed once written, so what it could not follow (long strings stored apart,
        // a link of a chain not in the form it reads) is read by statements of their own.
        self.read(Read::One, move |client| {
            Box::pin(async move {
                let Some((row, texts)) =
                    apply::load_checkpoint_and_values(client, &thread_id, checkpoint_id.as_deref()).await?
                else {
                    return Ok(None);
                };
                let cp = apply::resolve_checkpoint(client, row).await?;
                let state = apply::resolved_values(client, &thread_id, &cp.versions, texts).await?;
                Ok(Some((cp, state)))
            })
        })
    }

    fn history(&self, thread_id: &str) -> Result<Vec<Checkpoint>> {
        let thread_id = thread_id.to_owned();
        self.read(Read::Snapshot, move |tx| {
            Box::pin(async move {
                apply::require_thread(tx, &thread_id).await?;
                let sql = format!(
                    "SELECT {} FROM checkpoints WHERE thread_id = $1 ORDER BY checkpoint_id DESC",
                    apply::CHECKPOINT_READ
                );
                let rows = tx.query(&tx.prepare_cached(&sql).await?, &[&thread_id]).await?;
                let mut out = Vec::with_capacity(rows.len());
                for row in rows {
                    out.push(apply::resolve_checkpoint(tx, apply::checkpoint_row(&row)?).await?);
                }
                Ok(out)
            })
        })
    }

    fn state(&self, thread_id: &str, versions: &BTreeMap<String, u64>) -> Result<Map<String, Value>> {
        let (thread_id, versions) = (thread_id.to_owned(), versions.clone());
        self.read(Read::Snapshot, move |tx| {
            Box::pin(async move {
                // Sent together: the thread's check and the values' first read.
                let (exists, state) = tokio::join!(
                    apply::require_thread(tx, &thread_id),
                    apply::resolved_values(tx, &thread_id, &versions, apply::ValueTexts::new())
                );
                exists?;
                state
            })
        })
    }

    fn put_writes(&self, thread_id: &str, checkpoint_id: &str, writes: &[PendingWrite]) -> Result<()> {
        self.write_unit(format::writes_op(
            thread_id.to_owned(),
            checkpoint_id.to_owned(),
            writes,
        )?)
    }

    fn get_writes(&self, thread_id: &str, checkpoint_id: &str) -> Result<Vec<PendingWrite>> {
        let (thread_id, checkpoint_id) = (thread_id.to_owned(), checkpoint_id.to_owned());
        self.read(Read::Snapshot, move |tx| {
            Box::pin(async move {
                let read = async {
                    let stmt = tx
                        .prepare_cached(
                            "SELECT task_id, idx, channel, value FROM writes WHERE thread_id = $1 AND \
                             checkpoint_id = $2 ORDER BY task_id, idx",
                        )
                        .await?;
                    Ok::<_, CheckpointError>(tx.query(&stmt, &[&thread_id, &checkpoint_id]).await?)
                };
                // Sent together; answered in the order a caller is told (no thread, then no
                // checkpoint).
                let (thread, checkpoint, rows) = tokio::join!(
                    apply::require_thread(tx, &thread_id),
                    apply::checkpoint_exists(tx, &thread_id, &checkpoint_id),
                    read
                );
                thread?;
                if !checkpoint? {
                    return Err(CheckpointError::NoCheckpoint(thread_id, checkpoint_id));
                }
                let rows = rows?;
                let mut out = Vec::with_capacity(rows.len());
                for r in rows {
                    let idx: i64 = r.try_get(1)?;
                    let text: String = r.try_get(3)?;
                    out.push(PendingWrite {
                        task_id: r.try_get(0)?,
                        idx: u32::try_from(idx).map_err(|_| CheckpointError::Corrupt(format!("write index {idx}")))?,
                        channel: r.try_get(2)?,
                        value: apply::decode(tx, "a pending write", &text).await?,
                    });
                }
                Ok(out)
            })
        })
    }

    fn delete_thread(&self, thread_id: &str) -> Result<()> {
        self.write_unit(Op::DeleteThread(thread_id.to_owned()))
    }

    fn acquire_lease(&self, claim: &LeaseClaim) -> Result<Lease> {
        // The database's clock times the lease: `now` and `expires` are not read.
        self.write(
            Op::AcquireLease {
                claim: claim.clone(),
                now: 0,
                expires: 0,
                at: crate::clock::now(),
            },
            true,
        )?
        .into_lease()
    }

    fn renew_lease(&self, fence: &Fence, ttl: Duration) -> Result<Lease> {
        self.write(
            Op::RenewLease {
                fence: fence.clone(),
                expires: 0,
                ttl,
            },
            true,
        )?
        .into_lease()
    }

    fn release_lease(&self, fence: &Fence) -> Result<()> {
        self.write_unit(Op::ReleaseLease(fence.clone()))
    }

    fn lease(&self, thread_id: &str) -> Result<Option<Lease>> {
        let thread_id = thread_id.to_owned();
        self.read(Read::One, move |c| {
            Box::pin(async move { apply::load_lease(c, &thread_id, false).await })
        })
    }

    fn fork(&self, from: &str, checkpoint_id: &str, new: &str) -> Result<Checkpoint> {
        let op = Op::Fork {
            from: from.to_owned(),
            checkpoint_id: checkpoint_id.to_owned(),
            new: new.to_owned(),
            new_checkpoint_id: super::new_id(),
            at: crate::clock::now(),
        };
        self.write(op, true)?.into_forked()
    }

    fn queue(&self) -> Option<&dyn super::queue::RunQueue> {
        Some(self)
    }

    fn remove_thread(&self, thread_id: &str, removal: &super::Removal, claim: &LeaseClaim) -> Result<super::Removed> {
        self.remove(thread_id, removal, claim)
    }

    fn ping(&self) -> Result<()> {
        self.round_trip().map(|_| ())
    }
}
