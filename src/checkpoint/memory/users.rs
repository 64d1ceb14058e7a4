//! The in-memory [`UserStore`]: keys and quota windows in maps, under the runs' lock.

use super::MemoryCheckpointer;
use crate::checkpoint::Result;
use crate::checkpoint::users::{ApiKey, QuotaLimits, QuotaUse, UserStore};

#[derive(Debug, Default)]
pub(super) struct Users {
    /// In the order they were added, with their hashes.
    keys: Vec<(ApiKey, String)>,
    windows: std::collections::HashMap<(String, i64), QuotaUse>,
}

impl UserStore for MemoryCheckpointer {
    fn add_api_key(&self, key: &ApiKey, hash: &str) -> Result<()> {
        self.lock_runs()?.users.keys.push((key.clone(), hash.to_string()));
        Ok(())
    }

    fn find_api_key(&self, hash: &str) -> Result<Option<ApiKey>> {
        Ok(self
            .lock_runs()?
            .users
            .keys
            .iter()
            .find(|(_, h)| h == hash)
            .map(|(k, _)| k.clone()))
    }

    fn list_api_keys(&self) -> Result<Vec<ApiKey>> {
        Ok(self.lock_runs()?.users.keys.iter().map(|(k, _)| k.clone()).collect())
    }

    fn revoke_api_keys(&self, name_or_id: &str, at: &str) -> Result<usize> {
        let mut runs = self.lock_runs()?;
        let mut n = 0;
        for (k, _) in &mut runs.users.keys {
            if (k.key_id == name_or_id || k.user == name_or_id) && k.revoked_at.is_none() {
                k.revoked_at = Some(at.to_string());
                n += 1;
            }
        }
        Ok(n)
    }

    fn charge_run(&self, owner: &str, window: i64, limits: &QuotaLimits) -> Result<bool> {
        let mut runs = self.lock_runs()?;
        let used = runs.users.windows.entry((owner.to_string(), window)).or_default();
        if !limits.admits(used) {
            return Ok(false);
        }
        used.runs += 1;
        Ok(true)
    }

    fn add_usage(&self, owner: &str, window: i64, tokens: u64, cost: f64) -> Result<()> {
        let mut runs = self.lock_runs()?;
        let used = runs.users.windows.entry((owner.to_string(), window)).or_default();
        used.tokens = used.tokens.saturating_add(tokens);
        used.cost += cost;
        Ok(())
    }

    fn quota_use(&self, owner: &str, window: i64) -> Result<QuotaUse> {
        Ok(self
            .lock_runs()?
            .users
            .windows
            .get(&(owner.to_string(), window))
            .copied()
            .unwrap_or_default())
    }
}
