//! The PostgreSQL [`UserStore`]: the `api_keys` and `quota_windows` tables (schema version 2)
//! and their SQL.

use tokio_postgres::Row;

use super::PostgresCheckpointer;
use super::runs::{Param, text};
use crate::checkpoint::Result;
use crate::checkpoint::users::{ApiKey, QuotaLimits, QuotaUse, UserStore, caps, read_count, stored_count};

const KEY_COLS: &str = "key_id, username, admin, created_at, revoked_at";

fn key_from_row(r: &Row) -> Result<ApiKey> {
    Ok(ApiKey {
        key_id: r.try_get(0)?,
        user: r.try_get(1)?,
        admin: r.try_get(2)?,
        created_at: r.try_get(3)?,
        revoked_at: r.try_get(4)?,
    })
}

impl UserStore for PostgresCheckpointer {
    fn add_api_key(&self, key: &ApiKey, hash: &str) -> Result<()> {
        self.execute(
            "INSERT INTO api_keys (key_id, username, admin, created_at, revoked_at, hash) VALUES ($1, $2, $3, $4, $5, $6)",
            vec![
                text(&key.key_id),
                text(&key.user),
                Param::Bool(key.admin),
                text(&key.created_at),
                Param::OptText(key.revoked_at.clone()),
                text(hash),
            ],
        )
        .map(|_| ())
    }

    fn find_api_key(&self, hash: &str) -> Result<Option<ApiKey>> {
        let rows = self.query(
            format!("SELECT {KEY_COLS} FROM api_keys WHERE hash = $1"),
            vec![text(hash)],
        )?;
        rows.first().map(key_from_row).transpose()
    }

    fn list_api_keys(&self) -> Result<Vec<ApiKey>> {
        let rows = self.query(
            format!("SELECT {KEY_COLS} FROM api_keys ORDER BY created_at, key_id"),
            vec![],
        )?;
        rows.iter().map(key_from_row).collect()
    }

    fn revoke_api_keys(&self, name_or_id: &str, at: &str) -> Result<usize> {
        let n = self.execute(
            "UPDATE api_keys SET revoked_at = $2 WHERE (key_id = $1 OR username = $1) AND revoked_at IS NULL",
            vec![text(name_or_id), text(at)],
        )?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn charge_run(&self, owner: &str, window: i64, limits: &QuotaLimits) -> Result<bool> {
        if limits.runs == Some(0) || limits.tokens == Some(0) || limits.cost.is_some_and(|c| c <= 0.0) {
            return Ok(false);
        }
        let (runs, tokens, cost) = caps(limits);
        // One statement, so processes sharing the database never admit more than the cap: the
        // row's lock orders concurrent charges.
        let n = self.execute(
            "INSERT INTO quota_windows (owner, window_start, runs, tokens, cost) VALUES ($1, $2, 1, 0, 0) \
             ON CONFLICT (owner, window_start) DO UPDATE SET runs = quota_windows.runs + 1 \
             WHERE quota_windows.runs < $3 AND quota_windows.tokens < $4 AND quota_windows.cost < $5",
            vec![
                text(owner),
                Param::Int(window),
                Param::Int(runs),
                Param::Int(tokens),
                Param::Float(cost),
            ],
        )?;
        Ok(n == 1)
    }

    fn add_usage(&self, owner: &str, window: i64, tokens: u64, cost: f64) -> Result<()> {
        self.execute(
            "INSERT INTO quota_windows (owner, window_start, runs, tokens, cost) VALUES ($1, $2, 0, $3, $4) \
             ON CONFLICT (owner, window_start) DO UPDATE SET tokens = quota_windows.tokens + $3, \
             cost = quota_windows.cost + $4",
            vec![
                text(owner),
                Param::Int(window),
                Param::Int(stored_count(tokens)),
                Param::Float(cost),
            ],
        )
        .map(|_| ())
    }

    fn quota_use(&self, owner: &str, window: i64) -> Result<QuotaUse> {
        let rows = self.query(
            "SELECT runs, tokens, cost FROM quota_windows WHERE owner = $1 AND window_start = $2".into(),
            vec![text(owner), Param::Int(window)],
        )?;
        match rows.first() {
            Some(r) => Ok(QuotaUse {
                runs: read_count(r.try_get(0)?),
                tokens: read_count(r.try_get(1)?),
                cost: r.try_get(2)?,
            }),
            None => Ok(QuotaUse::default()),
        }
    }
}
