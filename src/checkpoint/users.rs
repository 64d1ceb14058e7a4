//! Who may call a server, and what each caller has spent, beside the checkpoints: per-user API
//! keys (stored by the SHA-256 of the key, never the key) and quota windows (runs, tokens and
//! cost a user spent in a window), in the same database as the runs, so every process serving
//! it knows the same keys and counts against the same quotas.
//!
//! A [`UserStore`] is part of every [`super::Checkpointer`]. This module is the format: the
//! trait and its types. The backends' SQL is theirs (`sqlite/users.rs`, `postgres/users.rs`,
//! `memory/users.rs`).

use super::Result;

/// A per-user API key, as listed (its hash is the store's alone).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    /// A short id that names the key without being it (listed, and accepted by `revoke`).
    pub key_id: String,
    /// The user the key authenticates: the owner of what its holder creates.
    pub user: String,
    /// Its holder sees and may change everything.
    pub admin: bool,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// Set once the key is revoked: it authenticates nobody from then on.
    pub revoked_at: Option<String>,
}

/// What a user spent in one quota window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuotaUse {
    pub runs: u64,
    pub tokens: u64,
    pub cost: f64,
}

/// A user's caps over one window; `None`: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuotaLimits {
    pub runs: Option<u64>,
    pub tokens: Option<u64>,
    pub cost: Option<f64>,
}

impl QuotaLimits {
    /// Whether `used` leaves room for one more run: fewer runs than the cap, and tokens and
    /// cost below theirs (a run that would pass them is held back by its budget as it goes).
    pub fn admits(&self, used: &QuotaUse) -> bool {
        self.runs.is_none_or(|max| used.runs < max)
            && self.tokens.is_none_or(|max| used.tokens < max)
            && self.cost.is_none_or(|max| used.cost < max)
    }
}

/// Per-user API keys and quota windows. Every method is durable when it returns.
pub trait UserStore: Send + Sync {
    /// Stores a new key by the SHA-256 of its secret (hex).
    fn add_api_key(&self, key: &ApiKey, hash: &str) -> Result<()>;

    /// The key whose secret hashes to `hash`, revoked or not.
    fn find_api_key(&self, hash: &str) -> Result<Option<ApiKey>>;

    /// Every key, oldest first.
    fn list_api_keys(&self) -> Result<Vec<ApiKey>>;

    /// Revokes the key `key_id`, or every key of user `key_id` names: how many were revoked
    /// (keys revoked before are not counted again).
    fn revoke_api_keys(&self, name_or_id: &str, at: &str) -> Result<usize>;

    /// Counts one run of `owner` in the window starting at `window` (milliseconds since the
    /// epoch) when what the window has spent leaves room for it under `limits`, in one atomic
    /// step, so processes sharing the database never admit more runs than the cap: whether it
    /// was counted.
    fn charge_run(&self, owner: &str, window: i64, limits: &QuotaLimits) -> Result<bool>;

    /// Adds a finished run's tokens and cost to `owner`'s window starting at `window`.
    fn add_usage(&self, owner: &str, window: i64, tokens: u64, cost: f64) -> Result<()>;

    /// What `owner` spent in the window starting at `window`.
    fn quota_use(&self, owner: &str, window: i64) -> Result<QuotaUse>;
}

/// A count as stored (a signed 64-bit column), saturating.
pub(crate) fn stored_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stored count read back (never negative).
pub(crate) fn read_count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The limits as the backends' statements take them: no cap is the largest value.
pub(crate) fn caps(limits: &QuotaLimits) -> (i64, i64, f64) {
    (
        limits.runs.map_or(i64::MAX, stored_count),
        limits.tokens.map_or(i64::MAX, stored_count),
        limits.cost.unwrap_or(f64::INFINITY),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Durability;
    use crate::checkpoint::memory::MemoryCheckpointer;
    use crate::checkpoint::sqlite::SqliteCheckpointer;

    fn key(id: &str, user: &str) -> ApiKey {
        ApiKey {
            key_id: id.into(),
            user: user.into(),
            admin: user == "root",
            created_at: format!("2026-01-01T00:00:0{}Z", id.len()),
            revoked_at: None,
        }
    }

    fn check(store: &dyn UserStore) {
        store.add_api_key(&key("k1", "alice"), "h1").unwrap();
        store.add_api_key(&key("k22", "alice"), "h2").unwrap();
        store.add_api_key(&key("k333", "root"), "h3").unwrap();
        assert_eq!(store.find_api_key("h3").unwrap(), Some(key("k333", "root")));
        assert_eq!(store.find_api_key("nope").unwrap(), None);
        let ids: Vec<String> = store.list_api_keys().unwrap().into_iter().map(|k| k.key_id).collect();
        assert_eq!(ids, ["k1", "k22", "k333"]);
        // By user: both of alice's; by id: one; again: none left to revoke.
        assert_eq!(store.revoke_api_keys("alice", "later").unwrap(), 2);
        assert_eq!(store.revoke_api_keys("k333", "later").unwrap(), 1);
        assert_eq!(store.revoke_api_keys("alice", "later").unwrap(), 0);
        assert_eq!(
            store.find_api_key("h1").unwrap().unwrap().revoked_at.as_deref(),
            Some("later")
        );

        let limits = QuotaLimits {
            runs: Some(2),
            tokens: Some(100),
            cost: None,
        };
        assert!(store.charge_run("alice", 1000, &limits).unwrap());
        assert!(store.charge_run("alice", 1000, &limits).unwrap());
        assert!(
            !store.charge_run("alice", 1000, &limits).unwrap(),
            "a third run is over the cap"
        );
        assert!(store.charge_run("bob", 1000, &limits).unwrap(), "bob has his own count");
        assert!(
            store.charge_run("alice", 2000, &limits).unwrap(),
            "a new window starts at 0"
        );
        store.add_usage("bob", 1000, 100, 0.5).unwrap();
        assert_eq!(
            store.quota_use("bob", 1000).unwrap(),
            QuotaUse {
                runs: 1,
                tokens: 100,
                cost: 0.5
            }
        );
        assert!(
            !store.charge_run("bob", 1000, &limits).unwrap(),
            "bob's tokens are spent"
        );
        assert_eq!(store.quota_use("carol", 1000).unwrap(), QuotaUse::default());
        let none = QuotaLimits {
            runs: Some(0),
            ..QuotaLimits::default()
        };
        assert!(
            !store.charge_run("dave", 1000, &none).unwrap(),
            "a cap of 0 runs admits none"
        );
    }

    #[test]
    fn keys_and_quota_windows_are_stored_by_every_embedded_backend() {
        check(&MemoryCheckpointer::new());
        let dir = tempfile::tempdir().unwrap();
        check(&SqliteCheckpointer::open(&dir.path().join("u.db"), Durability::CrashSafe).unwrap());
    }
}
