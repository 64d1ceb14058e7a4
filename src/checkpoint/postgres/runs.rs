//! The PostgreSQL [`RunStore`]: the `runs`, `run_traces` and `thread_meta` tables and their
//! SQL. The rows' shape is the format's ([`RunText`], [`TraceText`], [`ThreadMetaText`]).

use serde_json::Value;
use tokio_postgres::Row;

use super::PostgresCheckpointer;
use crate::checkpoint::Result;
use crate::checkpoint::runs::{
    RunRow, RunStatus, RunStore, RunText, ThreadMeta, ThreadMetaText, TraceRow, TraceText, json_text,
};

const RUN_COLS: &str = "run_id, thread_id, assistant_id, status, created_at, updated_at, kwargs, \
                        multitask_strategy, metadata, error, event_ids";

/// A run's row, its columns in `RUN_COLS`'s order (the queue's claim reads them so too).
pub(super) fn run_from_row(r: &Row) -> Result<RunText> {
    Ok(RunText {
        run_id: r.try_get(0)?,
        thread_id: r.try_get(1)?,
        assistant_id: r.try_get(2)?,
        status: r.try_get(3)?,
        created_at: r.try_get(4)?,
        updated_at: r.try_get(5)?,
        kwargs: r.try_get(6)?,
        multitask_strategy: r.try_get(7)?,
        metadata: r.try_get(8)?,
        error: r.try_get(9)?,
        event_ids: r.try_get(10)?,
    })
}

const META_COLS: &str = "thread_id, created_at, updated_at, metadata, ttl, expires_at";

/// The statement reading the record of the thread `which` names ([`META_COLS`]).
pub(super) fn meta_sql(which: super::apply::Which) -> String {
    format!("SELECT {META_COLS} FROM thread_meta WHERE thread_id = {}", which.sql())
}

/// A thread's record, on `client` (`None`: it has none).
pub(super) async fn load_meta(
    client: &impl deadpool_postgres::GenericClient,
    thread_id: &str,
) -> Result<Option<ThreadMetaText>> {
    let stmt = client.prepare_cached(&meta_sql(super::apply::Which::Thread)).await?;
    client
        .query_opt(&stmt, &[&thread_id])
        .await?
        .map(|r| meta_from_row(&r))
        .transpose()
}

pub(super) fn meta_from_row(r: &Row) -> Result<ThreadMetaText> {
    Ok(ThreadMetaText {
        thread_id: r.try_get(0)?,
        created_at: r.try_get(1)?,
        updated_at: r.try_get(2)?,
        metadata: r.try_get(3)?,
        ttl: r.try_get(4)?,
        expires_at: r.try_get(5)?,
        owner: None,
    })
}

impl PostgresCheckpointer {
    /// Runs one statement with `params` on a pooled connection, committed at once; the number
    /// of rows it touched.
    pub(super) fn execute(&self, sql: &'static str, params: Vec<Param>) -> Result<u64> {
        let (pool, params) = (self.pool.clone(), std::sync::Arc::new(params));
        self.retrying(move || {
            let (pool, params) = (pool.clone(), params.clone());
            async move {
                let client = pool.get().await?;
                let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params.iter().map(Param::as_sql).collect();
                Ok(client.execute(&client.prepare_cached(sql).await?, &refs).await?)
            }
        })
    }

    /// Runs one query with `params` on a pooled connection.
    pub(super) fn query(&self, sql: String, params: Vec<Param>) -> Result<Vec<Row>> {
        let (pool, params, sql) = (self.pool.clone(), std::sync::Arc::new(params), std::sync::Arc::new(sql));
        self.retrying(move || {
            let (pool, params, sql) = (pool.clone(), params.clone(), sql.clone());
            async move {
                let client = pool.get().await?;
                let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params.iter().map(Param::as_sql).collect();
                Ok(client.query(&client.prepare_cached(&sql).await?, &refs).await?)
            }
        })
    }
}

/// An owned statement parameter (a query runs on the backend's runtime, after the call's
/// borrows would have ended).
pub(super) enum Param {
    Text(String),
    OptText(Option<String>),
    Int(i64),
    OptInt(Option<i64>),
    Float(f64),
    Bool(bool),
}

impl Param {
    fn as_sql(&self) -> &(dyn tokio_postgres::types::ToSql + Sync) {
        match self {
            Param::Text(v) => v,
            Param::OptText(v) => v,
            Param::Int(v) => v,
            Param::OptInt(v) => v,
            Param::Float(v) => v,
            Param::Bool(v) => v,
        }
    }
}

pub(super) fn text(s: &str) -> Param {
    Param::Text(s.to_owned())
}

impl RunStore for PostgresCheckpointer {
    fn put_run(&self, run: &RunRow) -> Result<()> {
        let v = RunText::from_run(run)?;
        self.execute(
            "INSERT INTO runs (run_id, thread_id, assistant_id, status, created_at, updated_at, kwargs, \
             multitask_strategy, metadata, error, event_ids) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (run_id) DO UPDATE SET thread_id = excluded.thread_id, assistant_id = excluded.assistant_id, \
             status = excluded.status, created_at = excluded.created_at, updated_at = excluded.updated_at, \
             kwargs = excluded.kwargs, multitask_strategy = excluded.multitask_strategy, \
             metadata = excluded.metadata, error = excluded.error, event_ids = excluded.event_ids",
            vec![
                Param::Text(v.run_id),
                Param::Text(v.thread_id),
                Param::Text(v.assistant_id),
                Param::Text(v.status),
                Param::Text(v.created_at),
                Param::Text(v.updated_at),
                Param::Text(v.kwargs),
                Param::Text(v.multitask_strategy),
                Param::Text(v.metadata),
                Param::OptText(v.error),
                Param::Int(v.event_ids),
            ],
        )
        .map(|_| ())
    }

    fn set_run_status(&self, run_id: &str, status: RunStatus, error: Option<&Value>, at: &str) -> Result<()> {
        let error = error.map(json_text).transpose()?;
        self.execute(
            "UPDATE runs SET status = $2, error = $3, updated_at = $4 \
             WHERE run_id = $1 AND ($2 <> 'running' OR status = 'pending')",
            vec![text(run_id), text(status.as_str()), Param::OptText(error), text(at)],
        )
        .map(|_| ())
    }

    fn reserve_event_ids(&self, run_id: &str, upto: u64) -> Result<()> {
        let upto = crate::checkpoint::runs::event_ids_to_stored(upto);
        self.execute(
            "UPDATE runs SET event_ids = greatest(event_ids, $2) WHERE run_id = $1",
            vec![text(run_id), Param::Int(upto)],
        )
        .map(|_| ())
    }

    fn get_run(&self, run_id: &str) -> Result<Option<RunRow>> {
        let rows = self.query(
            format!("SELECT {RUN_COLS} FROM runs WHERE run_id = $1"),
            vec![text(run_id)],
        )?;
        rows.first().map(|r| run_from_row(r)?.into_run()).transpose()
    }

    fn list_runs(&self, thread_id: Option<&str>, statuses: &[RunStatus]) -> Result<Vec<RunRow>> {
        let rows = match thread_id {
            Some(t) => self.query(
                format!("SELECT {RUN_COLS} FROM runs WHERE thread_id = $1 ORDER BY run_id"),
                vec![text(t)],
            )?,
            None => self.query(format!("SELECT {RUN_COLS} FROM runs ORDER BY run_id"), vec![])?,
        };
        let mut out = Vec::new();
        for row in &rows {
            let run = run_from_row(row)?.into_run()?;
            if statuses.is_empty() || statuses.contains(&run.status) {
                out.push(run);
            }
        }
        Ok(out)
    }

    fn delete_run(&self, run_id: &str) -> Result<bool> {
        Ok(self.execute(
            "WITH logged AS (DELETE FROM run_events WHERE run_id = $1), traced AS (DELETE FROM run_traces WHERE \
             run_id = $1) DELETE FROM runs WHERE run_id = $1",
            vec![text(run_id)],
        )? > 0)
    }

    fn put_thread_meta(&self, meta: &ThreadMeta) -> Result<()> {
        let v = ThreadMetaText::from_meta(meta)?;
        self.execute(
            "INSERT INTO thread_meta (thread_id, created_at, updated_at, metadata, ttl, expires_at, owner) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (thread_id) DO UPDATE SET created_at = excluded.created_at, \
             updated_at = excluded.updated_at, metadata = excluded.metadata, ttl = excluded.ttl, \
             expires_at = excluded.expires_at, owner = excluded.owner",
            vec![
                Param::Text(v.thread_id),
                Param::Text(v.created_at),
                Param::Text(v.updated_at),
                Param::Text(v.metadata),
                Param::OptText(v.ttl),
                Param::OptInt(v.expires_at),
                Param::OptText(v.owner),
            ],
        )
        .map(|_| ())
    }

    fn create_thread_meta(&self, meta: &ThreadMeta) -> Result<bool> {
        let v = ThreadMetaText::from_meta(meta)?;
        Ok(self.execute(
            "INSERT INTO thread_meta (thread_id, created_at, updated_at, metadata, ttl, expires_at, owner) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (thread_id) DO NOTHING",
            vec![
                Param::Text(v.thread_id),
                Param::Text(v.created_at),
                Param::Text(v.updated_at),
                Param::Text(v.metadata),
                Param::OptText(v.ttl),
                Param::OptInt(v.expires_at),
                Param::OptText(v.owner),
            ],
        )? == 1)
    }

    fn get_thread_meta(&self, thread_id: &str) -> Result<Option<ThreadMeta>> {
        let rows = self.query(
            format!("SELECT {META_COLS} FROM thread_meta WHERE thread_id = $1"),
            vec![text(thread_id)],
        )?;
        rows.first().map(|r| meta_from_row(r)?.into_meta()).transpose()
    }

    fn list_thread_meta(&self) -> Result<Vec<ThreadMeta>> {
        let rows = self.query(format!("SELECT {META_COLS} FROM thread_meta"), vec![])?;
        rows.iter().map(|r| meta_from_row(r)?.into_meta()).collect()
    }

    fn expired_threads(&self, now_ms: i64, limit: usize) -> Result<Vec<String>> {
        let rows = self.query(
            "SELECT thread_id FROM thread_meta WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2".into(),
            vec![Param::Int(now_ms), Param::Int(i64::try_from(limit).unwrap_or(i64::MAX))],
        )?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    fn expiry_clock_ms(&self, _process_ms: i64) -> Result<i64> {
        let rows = self.query(format!("SELECT {}", super::apply::DB_NOW_MS), vec![])?;
        let row = rows
            .first()
            .ok_or_else(|| crate::checkpoint::CheckpointError::Backend("the database told no time".into()))?;
        Ok(row.try_get(0)?)
    }

    fn list_thread_meta_of(&self, owner: &str) -> Result<Vec<ThreadMeta>> {
        let rows = self.query(
            "SELECT thread_id, created_at, updated_at, metadata, ttl, expires_at FROM thread_meta WHERE owner = $1"
                .into(),
            vec![text(owner)],
        )?;
        rows.iter().map(|r| meta_from_row(r)?.into_meta()).collect()
    }

    fn delete_thread_meta(&self, thread_id: &str) -> Result<()> {
        let pool = self.pool.clone();
        let thread_id = thread_id.to_owned();
        self.block(async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            delete_thread_records(&tx, &thread_id).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn put_trace(&self, trace: &TraceRow, claim: Option<&str>) -> Result<()> {
        let v = TraceText::from_trace(trace)?;
        let mut params = vec![
            Param::Text(v.run_id),
            Param::Text(v.thread_id),
            Param::Text(v.trace),
            Param::Text(v.usage),
            Param::Text(v.updated_at),
        ];
        let sql = match claim {
            None => {
                "INSERT INTO run_traces (run_id, thread_id, trace, usage, updated_at) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (run_id) DO UPDATE SET thread_id = excluded.thread_id, trace = excluded.trace, \
                 usage = excluded.usage, updated_at = excluded.updated_at"
            }
            Some(claim) => {
                params.push(Param::Text(claim.to_owned()));
                "INSERT INTO run_traces (run_id, thread_id, trace, usage, updated_at) \
                 SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = $1 AND claim = $6) \
                 ON CONFLICT (run_id) DO UPDATE SET thread_id = excluded.thread_id, trace = excluded.trace, \
                 usage = excluded.usage, updated_at = excluded.updated_at"
            }
        };
        self.execute(sql, params).map(|_| ())
    }

    fn get_trace(&self, run_id: &str) -> Result<Option<TraceRow>> {
        let rows = self.query(
            format!("SELECT {TRACE_COLS} FROM run_traces WHERE run_id = $1"),
            vec![text(run_id)],
        )?;
        rows.first().map(|r| trace_from_row(r)?.into_trace()).transpose()
    }

    fn list_traces(&self, thread_id: &str) -> Result<Vec<TraceRow>> {
        let rows = self.query(
            format!("SELECT {TRACE_COLS} FROM run_traces WHERE thread_id = $1 ORDER BY run_id"),
            vec![text(thread_id)],
        )?;
        rows.iter().map(|r| trace_from_row(r)?.into_trace()).collect()
    }
}

const TRACE_COLS: &str = "run_id, thread_id, trace, usage, updated_at";

fn trace_from_row(r: &Row) -> Result<TraceText> {
    Ok(TraceText {
        run_id: r.try_get(0)?,
        thread_id: r.try_get(1)?,
        trace: r.try_get(2)?,
        usage: r.try_get(3)?,
        updated_at: r.try_get(4)?,
    })
}

/// Deletes, in `tx`, what the API keeps of a thread: its runs and their logs and traces, its
/// record, and its crons (which go with it, as the reference deletes them, whichever removal
/// it is).
pub(super) async fn delete_thread_records(
    tx: &deadpool_postgres::Transaction<'_>,
    thread_id: &str,
) -> std::result::Result<(), tokio_postgres::Error> {
    tx.execute(
        "DELETE FROM run_events WHERE run_id IN (SELECT run_id FROM runs WHERE thread_id = $1)",
        &[&thread_id],
    )
    .await?;
    for table in ["runs", "run_traces", "thread_meta", "crons"] {
        tx.execute(&format!("DELETE FROM {table} WHERE thread_id = $1"), &[&thread_id])
            .await?;
    }
    Ok(())
}
