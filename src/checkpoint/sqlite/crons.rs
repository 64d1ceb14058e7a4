//! The SQLite [`CronStore`]: the `crons` and `webhook_deliveries` tables and their SQL. The
//! tables are additive (`CREATE TABLE IF NOT EXISTS` on every open, as `runs`): files written by
//! earlier builds gain them without a schema version change, and those builds ignore them.
//!
//! A tick's claim and a delivery's hold are conditional updates made by the writer, whose
//! transaction holds SQLite's write lock: of several processes on one file, one claims.

use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::SqliteCheckpointer;
use crate::checkpoint::Result;
use crate::checkpoint::crons::{
    Attempt, CRON_COLS, CronRow, CronStore, CronText, DELIVERY_COLS, Delivery, delivery_state,
};

/// Applied on every open (see the module doc).
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS crons (
    cron_id TEXT PRIMARY KEY NOT NULL,
    assistant_id TEXT NOT NULL,
    thread_id TEXT,
    owner TEXT,
    schedule TEXT NOT NULL,
    timezone TEXT,
    -- The run request each tick starts, and the cron's metadata: JSON.
    payload TEXT NOT NULL,
    metadata TEXT NOT NULL,
    on_run_completed TEXT,
    enabled INTEGER NOT NULL,
    -- Milliseconds since the Unix epoch, by the server's clock.
    end_ms INTEGER,
    next_run_at INTEGER,
    declared_by TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    seq INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS crons_due ON crons (next_run_at) WHERE enabled = 1;
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    delivery_id TEXT PRIMARY KEY NOT NULL,
    run_id TEXT NOT NULL,
    url TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    last_status INTEGER,
    last_error TEXT,
    -- Milliseconds since the Unix epoch.
    next_attempt_at INTEGER NOT NULL,
    -- The process attempting it, until when.
    claimed_by TEXT,
    claimed_until INTEGER,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    seq INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS webhook_deliveries_by_run ON webhook_deliveries (run_id);
";

fn cron_from_row(r: &Row<'_>) -> rusqlite::Result<CronText> {
    Ok(CronText {
        cron_id: r.get(0)?,
        assistant_id: r.get(1)?,
        thread_id: r.get(2)?,
        owner: r.get(3)?,
        schedule: r.get(4)?,
        timezone: r.get(5)?,
        payload: r.get(6)?,
        metadata: r.get(7)?,
        on_run_completed: r.get(8)?,
        enabled: r.get(9)?,
        end_ms: r.get(10)?,
        next_run_at: r.get(11)?,
        declared_by: r.get(12)?,
        created_at: r.get(13)?,
        updated_at: r.get(14)?,
    })
}

/// A delivery's row, its state still a name.
type DeliveryRaw = (
    String,
    String,
    String,
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
    i64,
    String,
    String,
);

fn delivery_from_row(r: &Row<'_>) -> rusqlite::Result<DeliveryRaw> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
    ))
}

fn into_delivery(raw: DeliveryRaw) -> Result<Delivery> {
    let (
        delivery_id,
        run_id,
        url,
        body,
        state,
        attempts,
        last_status,
        last_error,
        next_attempt_at,
        created_at,
        updated_at,
    ) = raw;
    Ok(Delivery {
        state: delivery_state(&delivery_id, &state)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        last_status: last_status.and_then(|s| u16::try_from(s).ok()),
        delivery_id,
        run_id,
        url,
        body,
        last_error,
        next_attempt_at,
        created_at,
        updated_at,
    })
}

/// Writes `cron` with `verb` (`INSERT OR REPLACE`, or `INSERT … ON CONFLICT DO NOTHING`),
/// keeping a replaced row's place in the order; the number of rows written.
fn write_cron(conn: &Connection, v: &CronText, replace: bool) -> rusqlite::Result<usize> {
    let conflict = if replace {
        "DO UPDATE SET assistant_id = excluded.assistant_id, thread_id = excluded.thread_id, owner = excluded.owner, \
         schedule = excluded.schedule, timezone = excluded.timezone, payload = excluded.payload, \
         metadata = excluded.metadata, on_run_completed = excluded.on_run_completed, enabled = excluded.enabled, \
         end_ms = excluded.end_ms, next_run_at = excluded.next_run_at, declared_by = excluded.declared_by, \
         created_at = excluded.created_at, updated_at = excluded.updated_at"
    } else {
        "DO NOTHING"
    };
    conn.prepare_cached(&format!(
        "INSERT INTO crons ({CRON_COLS}, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, \
         (SELECT coalesce(max(seq), 0) + 1 FROM crons)) ON CONFLICT (cron_id) {conflict}"
    ))?
    .execute(params![
        v.cron_id,
        v.assistant_id,
        v.thread_id,
        v.owner,
        v.schedule,
        v.timezone,
        v.payload,
        v.metadata,
        v.on_run_completed,
        v.enabled,
        v.end_ms,
        v.next_run_at,
        v.declared_by,
        v.created_at,
        v.updated_at
    ])
}

impl CronStore for SqliteCheckpointer {
    fn put_cron(&self, cron: &CronRow) -> Result<()> {
        let v = CronText::from_cron(cron)?;
        self.exec(Box::new(move |conn: &Connection| {
            write_cron(conn, &v, true)?;
            Ok(())
        }))
    }

    fn insert_cron(&self, cron: &CronRow) -> Result<bool> {
        let v = CronText::from_cron(cron)?;
        let inserted = Arc::new(Mutex::new(false));
        let told = inserted.clone();
        self.exec(Box::new(move |conn: &Connection| {
            let n = write_cron(conn, &v, false)?;
            *told.lock().unwrap_or_else(|e| e.into_inner()) = n == 1;
            Ok(())
        }))?;
        Ok(*inserted.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn get_cron(&self, cron_id: &str) -> Result<Option<CronRow>> {
        let raw = self.read(|tx| {
            Ok(tx
                .prepare_cached(&format!("SELECT {CRON_COLS} FROM crons WHERE cron_id = ?1"))?
                .query_row([cron_id], cron_from_row)
                .optional()?)
        })?;
        raw.map(CronText::into_cron).transpose()
    }

    fn list_crons(&self) -> Result<Vec<CronRow>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!("SELECT {CRON_COLS} FROM crons ORDER BY seq"))?;
            let rows = stmt.query_map([], cron_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        raws.into_iter().map(CronText::into_cron).collect()
    }

    fn delete_cron(&self, cron_id: &str) -> Result<bool> {
        let id = cron_id.to_owned();
        let deleted = Arc::new(Mutex::new(false));
        let told = deleted.clone();
        self.exec(Box::new(move |conn: &Connection| {
            let n = conn
                .prepare_cached("DELETE FROM crons WHERE cron_id = ?1")?
                .execute([&id])?;
            *told.lock().unwrap_or_else(|e| e.into_inner()) = n == 1;
            Ok(())
        }))?;
        Ok(*deleted.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn due_crons(&self, now: i64) -> Result<Vec<CronRow>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {CRON_COLS} FROM crons WHERE enabled = 1 AND next_run_at <= ?1 \
                 AND (end_ms IS NULL OR ?1 < end_ms) ORDER BY next_run_at, seq"
            ))?;
            let rows = stmt.query_map([now], cron_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        raws.into_iter().map(CronText::into_cron).collect()
    }

    fn claim_tick(&self, cron_id: &str, at: i64, next: Option<i64>, updated_at: &str) -> Result<bool> {
        let (id, updated_at) = (cron_id.to_owned(), updated_at.to_owned());
        let claimed = Arc::new(Mutex::new(false));
        let told = claimed.clone();
        self.exec(Box::new(move |conn: &Connection| {
            let n = conn
                .prepare_cached(
                    "UPDATE crons SET next_run_at = ?3, updated_at = ?4 WHERE cron_id = ?1 AND next_run_at = ?2",
                )?
                .execute(params![id, at, next, updated_at])?;
            *told.lock().unwrap_or_else(|e| e.into_inner()) = n == 1;
            Ok(())
        }))?;
        Ok(*claimed.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn enqueue_delivery(&self, d: &Delivery) -> Result<()> {
        let d = d.clone();
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached(&format!(
                "INSERT INTO webhook_deliveries ({DELIVERY_COLS}, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, \
                 (SELECT coalesce(max(seq), 0) + 1 FROM webhook_deliveries)) \
                 ON CONFLICT (delivery_id) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at \
                 WHERE webhook_deliveries.attempts = 0 AND webhook_deliveries.state = 'pending'"
            ))?
            .execute(params![
                d.delivery_id,
                d.run_id,
                d.url,
                d.body,
                d.state.as_str(),
                d.attempts,
                d.last_status,
                d.last_error,
                d.next_attempt_at,
                d.created_at,
                d.updated_at
            ])?;
            Ok(())
        }))
    }

    fn claim_deliveries(&self, now: i64, owner: &str, hold_until: i64, limit: usize) -> Result<Vec<Delivery>> {
        let owner = owner.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let taken: Arc<Mutex<Vec<DeliveryRaw>>> = Arc::default();
        let told = taken.clone();
        self.exec(Box::new(move |conn: &Connection| {
            let rows = conn
                .prepare_cached(&format!(
                    "SELECT {DELIVERY_COLS} FROM webhook_deliveries w WHERE state = 'pending' AND next_attempt_at <= ?1 \
                     AND (claimed_until IS NULL OR claimed_until < ?1) \
                     AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = w.run_id AND r.status IN ('pending', 'running')) \
                     ORDER BY seq LIMIT ?2"
                ))?
                .query_map(params![now, limit], delivery_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut hold = conn.prepare_cached(
                "UPDATE webhook_deliveries SET claimed_by = ?2, claimed_until = ?3 WHERE delivery_id = ?1",
            )?;
            for row in &rows {
                hold.execute(params![row.0, owner, hold_until])?;
            }
            *told.lock().unwrap_or_else(|e| e.into_inner()) = rows;
            Ok(())
        }))?;
        let rows = std::mem::take(&mut *taken.lock().unwrap_or_else(|e| e.into_inner()));
        rows.into_iter().map(into_delivery).collect()
    }

    fn record_attempt(&self, delivery_id: &str, owner: &str, a: &Attempt) -> Result<bool> {
        let (id, owner, a) = (delivery_id.to_owned(), owner.to_owned(), a.clone());
        let recorded = Arc::new(Mutex::new(false));
        let told = recorded.clone();
        self.exec(Box::new(move |conn: &Connection| {
            let n = conn
                .prepare_cached(
                    "UPDATE webhook_deliveries SET state = ?3, attempts = attempts + 1, last_status = ?4, last_error = ?5, \
                     next_attempt_at = ?6, updated_at = ?7, claimed_by = NULL, claimed_until = NULL \
                     WHERE delivery_id = ?1 AND claimed_by = ?2",
                )?
                .execute(params![
                    id,
                    owner,
                    a.state.as_str(),
                    a.status,
                    a.error,
                    a.next_attempt_at,
                    a.at
                ])?;
            *told.lock().unwrap_or_else(|e| e.into_inner()) = n == 1;
            Ok(())
        }))?;
        Ok(*recorded.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn list_deliveries(&self, run_id: Option<&str>) -> Result<Vec<Delivery>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {DELIVERY_COLS} FROM webhook_deliveries WHERE (?1 IS NULL OR run_id = ?1) ORDER BY seq"
            ))?;
            let rows = stmt.query_map([run_id], delivery_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        raws.into_iter().map(into_delivery).collect()
    }
}
