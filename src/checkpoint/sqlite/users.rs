//! The SQLite [`UserStore`]: the `api_keys` and `quota_windows` tables (schema version 3) and
//! their SQL.

use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::SqliteCheckpointer;
use crate::checkpoint::users::{ApiKey, QuotaLimits, QuotaUse, UserStore, caps, read_count, stored_count};
use crate::checkpoint::{CheckpointError, Result};

/// Created by the migration to version 3.
pub(super) const TABLES: &str = "
CREATE TABLE api_keys (
    key_id TEXT PRIMARY KEY NOT NULL,
    -- The SHA-256 of the key, hex: the key itself is never stored.
    hash TEXT NOT NULL UNIQUE,
    username TEXT NOT NULL,
    admin INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    revoked_at TEXT
) STRICT;
CREATE INDEX api_keys_by_user ON api_keys (username);
CREATE TABLE quota_windows (
    owner TEXT NOT NULL,
    -- Milliseconds since the Unix epoch.
    window_start INTEGER NOT NULL,
    runs INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    cost REAL NOT NULL,
    PRIMARY KEY (owner, window_start)
) STRICT;
";

const KEY_COLS: &str = "key_id, username, admin, created_at, revoked_at";

fn key_from_row(r: &Row<'_>) -> rusqlite::Result<ApiKey> {
    Ok(ApiKey {
        key_id: r.get(0)?,
        user: r.get(1)?,
        admin: r.get::<_, i64>(2)? != 0,
        created_at: r.get(3)?,
        revoked_at: r.get(4)?,
    })
}

/// What a statement run on the writer thread hands back.
fn told<T: Send + 'static>(init: T) -> (Arc<Mutex<T>>, Arc<Mutex<T>>) {
    let cell = Arc::new(Mutex::new(init));
    (cell.clone(), cell)
}

fn take<T: Default>(cell: &Mutex<T>) -> Result<T> {
    cell.lock()
        .map(|mut v| std::mem::take(&mut *v))
        .map_err(|_| CheckpointError::Backend("a writer's answer was lost".into()))
}

impl UserStore for SqliteCheckpointer {
    fn add_api_key(&self, key: &ApiKey, hash: &str) -> Result<()> {
        let (k, hash) = (key.clone(), hash.to_string());
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached(&format!(
                "INSERT INTO api_keys ({KEY_COLS}, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
            ))?
            .execute(params![
                k.key_id,
                k.user,
                i64::from(k.admin),
                k.created_at,
                k.revoked_at,
                hash
            ])?;
            Ok(())
        }))
    }

    fn find_api_key(&self, hash: &str) -> Result<Option<ApiKey>> {
        self.read(|tx| {
            Ok(tx
                .prepare_cached(&format!("SELECT {KEY_COLS} FROM api_keys WHERE hash = ?1"))?
                .query_row([hash], key_from_row)
                .optional()?)
        })
    }

    fn list_api_keys(&self) -> Result<Vec<ApiKey>> {
        self.read(|tx| {
            let mut stmt =
                tx.prepare_cached(&format!("SELECT {KEY_COLS} FROM api_keys ORDER BY created_at, key_id"))?;
            let rows = stmt.query_map([], key_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn revoke_api_keys(&self, name_or_id: &str, at: &str) -> Result<usize> {
        let (which, at) = (name_or_id.to_string(), at.to_string());
        let (cell, answer) = told(0usize);
        self.exec(Box::new(move |conn: &Connection| {
            let n = conn
                .prepare_cached(
                    "UPDATE api_keys SET revoked_at = ?2 WHERE (key_id = ?1 OR username = ?1) AND revoked_at IS NULL",
                )?
                .execute(params![which, at])?;
            if let Ok(mut c) = cell.lock() {
                *c = n;
            }
            Ok(())
        }))?;
        take(&answer)
    }

    fn charge_run(&self, owner: &str, window: i64, limits: &QuotaLimits) -> Result<bool> {
        if limits.runs == Some(0) || limits.tokens == Some(0) || limits.cost.is_some_and(|c| c <= 0.0) {
            return Ok(false);
        }
        let owner = owner.to_string();
        let (runs, tokens, cost) = caps(limits);
        let (cell, answer) = told(false);
        self.exec(Box::new(move |conn: &Connection| {
            // One statement: a new window starts with this run; an existing one counts it only
            // while it has room.
            let n = conn
                .prepare_cached(
                    "INSERT INTO quota_windows (owner, window_start, runs, tokens, cost) VALUES (?1, ?2, 1, 0, 0)
                     ON CONFLICT (owner, window_start) DO UPDATE SET runs = runs + 1
                     WHERE runs < ?3 AND tokens < ?4 AND cost < ?5",
                )?
                .execute(params![owner, window, runs, tokens, cost])?;
            if let Ok(mut c) = cell.lock() {
                *c = n == 1;
            }
            Ok(())
        }))?;
        take(&answer)
    }

    fn add_usage(&self, owner: &str, window: i64, tokens: u64, cost: f64) -> Result<()> {
        let owner = owner.to_string();
        let tokens = stored_count(tokens);
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached(
                "INSERT INTO quota_windows (owner, window_start, runs, tokens, cost) VALUES (?1, ?2, 0, ?3, ?4)
                 ON CONFLICT (owner, window_start) DO UPDATE SET tokens = tokens + ?3, cost = cost + ?4",
            )?
            .execute(params![owner, window, tokens, cost])?;
            Ok(())
        }))
    }

    fn quota_use(&self, owner: &str, window: i64) -> Result<QuotaUse> {
        let found = self.read(|tx| {
            Ok(tx
                .prepare_cached("SELECT runs, tokens, cost FROM quota_windows WHERE owner = ?1 AND window_start = ?2")?
                .query_row(params![owner, window], |r| {
                    Ok(QuotaUse {
                        runs: read_count(r.get(0)?),
                        tokens: read_count(r.get(1)?),
                        cost: r.get(2)?,
                    })
                })
                .optional()?)
        })?;
        Ok(found.unwrap_or_default())
    }
}
