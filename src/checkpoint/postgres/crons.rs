//! The PostgreSQL [`CronStore`]: the `crons` and `webhook_deliveries` tables and their SQL.
//!
//! A tick is claimed by a conditional update (`… WHERE next_run_at = the tick`): of every
//! process that saw the cron due, the one whose update finds the tick still there claims it.
//! Deliveries are taken `FOR UPDATE SKIP LOCKED` and held for a while, so each attempt is one
//! process's.

use tokio_postgres::Row;

use super::PostgresCheckpointer;
use super::runs::{Param, text};
use crate::checkpoint::Result;
use crate::checkpoint::crons::{
    Attempt, CRON_COLS, CronRow, CronStore, CronText, DELIVERY_COLS, Delivery, delivery_state,
};

fn cron_from_row(r: &Row) -> Result<CronText> {
    Ok(CronText {
        cron_id: r.try_get(0)?,
        assistant_id: r.try_get(1)?,
        thread_id: r.try_get(2)?,
        owner: r.try_get(3)?,
        schedule: r.try_get(4)?,
        timezone: r.try_get(5)?,
        payload: r.try_get(6)?,
        metadata: r.try_get(7)?,
        on_run_completed: r.try_get(8)?,
        enabled: r.try_get(9)?,
        end_ms: r.try_get(10)?,
        next_run_at: r.try_get(11)?,
        declared_by: r.try_get(12)?,
        created_at: r.try_get(13)?,
        updated_at: r.try_get(14)?,
    })
}

fn delivery_from_row(r: &Row) -> Result<Delivery> {
    let id: String = r.try_get(0)?;
    let state: String = r.try_get(4)?;
    let attempts: i64 = r.try_get(5)?;
    let status: Option<i64> = r.try_get(6)?;
    Ok(Delivery {
        state: delivery_state(&id, &state)?,
        run_id: r.try_get(1)?,
        url: r.try_get(2)?,
        body: r.try_get(3)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        last_status: status.and_then(|s| u16::try_from(s).ok()),
        last_error: r.try_get(7)?,
        next_attempt_at: r.try_get(8)?,
        created_at: r.try_get(9)?,
        updated_at: r.try_get(10)?,
        delivery_id: id,
    })
}

fn cron_params(c: &CronRow) -> Result<Vec<Param>> {
    let v = CronText::from_cron(c)?;
    Ok(vec![
        Param::Text(v.cron_id),
        Param::Text(v.assistant_id),
        Param::OptText(v.thread_id),
        Param::OptText(v.owner),
        Param::Text(v.schedule),
        Param::OptText(v.timezone),
        Param::Text(v.payload),
        Param::Text(v.metadata),
        Param::OptText(v.on_run_completed),
        Param::Int(v.enabled),
        Param::OptInt(v.end_ms),
        Param::OptInt(v.next_run_at),
        Param::OptText(v.declared_by),
        Param::Text(v.created_at),
        Param::Text(v.updated_at),
    ])
}

/// A cron's insert, its columns in `CRON_COLS`'s order.
macro_rules! insert_cron {
    () => {
        "INSERT INTO crons (cron_id, assistant_id, thread_id, owner, schedule, timezone, payload, metadata, \
         on_run_completed, enabled, end_ms, next_run_at, declared_by, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
    };
}

impl CronStore for PostgresCheckpointer {
    fn put_cron(&self, cron: &CronRow) -> Result<()> {
        const SQL: &str = concat!(
            insert_cron!(),
            " ON CONFLICT (cron_id) DO UPDATE SET assistant_id = excluded.assistant_id, thread_id = excluded.thread_id, \
             owner = excluded.owner, schedule = excluded.schedule, timezone = excluded.timezone, \
             payload = excluded.payload, metadata = excluded.metadata, on_run_completed = excluded.on_run_completed, \
             enabled = excluded.enabled, end_ms = excluded.end_ms, next_run_at = excluded.next_run_at, \
             declared_by = excluded.declared_by, created_at = excluded.created_at, updated_at = excluded.updated_at"
        );
        self.execute(SQL, cron_params(cron)?).map(|_| ())
    }

    fn insert_cron(&self, cron: &CronRow) -> Result<bool> {
        const SQL: &str = concat!(insert_cron!(), " ON CONFLICT (cron_id) DO NOTHING");
        Ok(self.execute(SQL, cron_params(cron)?)? == 1)
    }

    fn get_cron(&self, cron_id: &str) -> Result<Option<CronRow>> {
        let rows = self.query(
            format!("SELECT {CRON_COLS} FROM crons WHERE cron_id = $1"),
            vec![text(cron_id)],
        )?;
        rows.first().map(|r| cron_from_row(r)?.into_cron()).transpose()
    }

    fn list_crons(&self) -> Result<Vec<CronRow>> {
        let rows = self.query(format!("SELECT {CRON_COLS} FROM crons ORDER BY seq"), Vec::new())?;
        rows.iter().map(|r| cron_from_row(r)?.into_cron()).collect()
    }

    fn delete_cron(&self, cron_id: &str) -> Result<bool> {
        Ok(self.execute("DELETE FROM crons WHERE cron_id = $1", vec![text(cron_id)])? == 1)
    }

    fn due_crons(&self, now: i64) -> Result<Vec<CronRow>> {
        let rows = self.query(
            format!(
                "SELECT {CRON_COLS} FROM crons WHERE enabled = 1 AND next_run_at <= $1 \
                 AND (end_ms IS NULL OR $1 < end_ms) ORDER BY next_run_at, seq"
            ),
            vec![Param::Int(now)],
        )?;
        rows.iter().map(|r| cron_from_row(r)?.into_cron()).collect()
    }

    fn claim_tick(&self, cron_id: &str, at: i64, next: Option<i64>, updated_at: &str) -> Result<bool> {
        Ok(self.execute(
            "UPDATE crons SET next_run_at = $3, updated_at = $4 WHERE cron_id = $1 AND next_run_at = $2",
            vec![text(cron_id), Param::Int(at), Param::OptInt(next), text(updated_at)],
        )? == 1)
    }

    fn enqueue_delivery(&self, d: &Delivery) -> Result<()> {
        self.execute(
            "INSERT INTO webhook_deliveries (delivery_id, run_id, url, body, state, attempts, last_status, last_error, \
             next_attempt_at, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (delivery_id) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at \
             WHERE webhook_deliveries.attempts = 0 AND webhook_deliveries.state = 'pending'",
            vec![
                text(&d.delivery_id),
                text(&d.run_id),
                text(&d.url),
                text(&d.body),
                text(d.state.as_str()),
                Param::Int(i64::from(d.attempts)),
                Param::OptInt(d.last_status.map(i64::from)),
                Param::OptText(d.last_error.clone()),
                Param::Int(d.next_attempt_at),
                text(&d.created_at),
                text(&d.updated_at),
            ],
        )
        .map(|_| ())
    }

    fn claim_deliveries(&self, now: i64, owner: &str, hold_until: i64, limit: usize) -> Result<Vec<Delivery>> {
        let rows = self.query(
            format!(
                "UPDATE webhook_deliveries SET claimed_by = $2, claimed_until = $3 WHERE delivery_id IN ( \
                 SELECT delivery_id FROM webhook_deliveries w WHERE state = 'pending' AND next_attempt_at <= $1 \
                 AND (claimed_until IS NULL OR claimed_until < $1) \
                 AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = w.run_id AND r.status IN ('pending', 'running')) \
                 ORDER BY seq LIMIT $4 FOR UPDATE SKIP LOCKED) RETURNING {DELIVERY_COLS}, seq"
            ),
            vec![
                Param::Int(now),
                text(owner),
                Param::Int(hold_until),
                Param::Int(i64::try_from(limit).unwrap_or(i64::MAX)),
            ],
        )?;
        let mut taken: Vec<(i64, Delivery)> = rows
            .iter()
            .map(|r| Ok((r.try_get::<_, i64>(11)?, delivery_from_row(r)?)))
            .collect::<Result<_>>()?;
        taken.sort_by_key(|(seq, _)| *seq);
        Ok(taken.into_iter().map(|(_, d)| d).collect())
    }

    fn record_attempt(&self, delivery_id: &str, owner: &str, a: &Attempt) -> Result<bool> {
        Ok(self.execute(
            "UPDATE webhook_deliveries SET state = $3, attempts = attempts + 1, last_status = $4, last_error = $5, \
             next_attempt_at = $6, updated_at = $7, claimed_by = NULL, claimed_until = NULL \
             WHERE delivery_id = $1 AND claimed_by = $2",
            vec![
                text(delivery_id),
                text(owner),
                text(a.state.as_str()),
                Param::OptInt(a.status.map(i64::from)),
                Param::OptText(a.error.clone()),
                Param::Int(a.next_attempt_at),
                text(&a.at),
            ],
        )? == 1)
    }

    fn list_deliveries(&self, run_id: Option<&str>) -> Result<Vec<Delivery>> {
        let rows = match run_id {
            Some(r) => self.query(
                format!("SELECT {DELIVERY_COLS} FROM webhook_deliveries WHERE run_id = $1 ORDER BY seq"),
                vec![Param::Text(r.to_owned())],
            )?,
            None => self.query(
                format!("SELECT {DELIVERY_COLS} FROM webhook_deliveries ORDER BY seq"),
                vec![],
            )?,
        };
        rows.iter().map(delivery_from_row).collect()
    }
}
