//! Per-user quotas: runs, model tokens and cost a user may spend in a window (a day unless
//! configured), counted in the checkpoint database so every process serving it shares them.
//!
//! Windows are fixed (they start at multiples of their length since the Unix epoch), so a
//! refusal can say when the window resets. A run is counted when it is created, refused with
//! 429 when the window has no room left; its tokens and cost are added when it ends, by the
//! process that ran it, and while it runs what is left of the window's tokens and cost is the
//! run's budget, checked before each model call as a workflow's `limits` are. Every user has
//! a quota, admins too; the shared key's holder, who is nobody in particular, has none.

use std::time::Duration;

use axum::http::StatusCode;

use super::Caller;
use crate::checkpoint::{Checkpointer, QuotaLimits, QuotaUse};
use crate::server::http::ApiError;

/// What each user may spend per window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quotas {
    pub window: Duration,
    pub limits: QuotaLimits,
}

impl Quotas {
    fn window_ms(&self) -> i64 {
        i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX).max(1)
    }

    /// The start of the window `now_ms` falls in.
    pub(crate) fn window_at(&self, now_ms: i64) -> i64 {
        now_ms - now_ms.rem_euclid(self.window_ms())
    }

    /// Counts a run of `caller` in the current window, or refuses it (429, with when the
    /// window resets).
    pub(crate) fn admit(&self, store: &dyn Checkpointer, caller: &Caller) -> Result<(), ApiError> {
        let Some(user) = caller.user.as_deref() else {
            return Ok(());
        };
        let now = crate::clock::now_ms();
        let window = self.window_at(now);
        if store.charge_run(user, window, &self.limits)? {
            return Ok(());
        }
        let used = store.quota_use(user, window)?;
        let reset_ms = window.saturating_add(self.window_ms());
        let secs = u64::try_from((reset_ms - now + 999) / 1000).unwrap_or(1).max(1);
        let reset = crate::clock::at_ms(reset_ms);
        Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            detail: format!(
                "Quota exceeded: {} in this window of {}s; it resets at {reset} (in {secs}s)",
                self.spent(&used),
                self.window.as_secs()
            ),
            retry_after: Some(secs),
        })
    }

    /// Which cap `used` reached, said as the user would read it.
    fn spent(&self, used: &QuotaUse) -> String {
        let l = &self.limits;
        if let Some(max) = l.runs.filter(|max| used.runs >= *max) {
            return format!("{} of {max} runs started", used.runs);
        }
        if let Some(max) = l.tokens.filter(|max| used.tokens >= *max) {
            return format!("{} of {max} model tokens used", used.tokens);
        }
        if let Some(max) = l.cost.filter(|max| used.cost >= *max) {
            return format!("{:.4} of {max} spent on models", used.cost);
        }
        "the quota is spent".into()
    }

    /// What the current window leaves `owner` of tokens and cost: the budget of a run that
    /// starts now.
    pub(crate) fn remaining(
        &self,
        store: &dyn Checkpointer,
        owner: &str,
    ) -> Result<crate::spec::Budget, crate::checkpoint::CheckpointError> {
        let used = store.quota_use(owner, self.window_at(crate::clock::now_ms()))?;
        Ok(crate::spec::Budget {
            max_tokens: self.limits.tokens.map(|max| max.saturating_sub(used.tokens)),
            max_cost: self.limits.cost.map(|max| (max - used.cost).max(0.0)),
            max_llm_calls: None,
        })
    }

    /// Adds what a run of `owner` spent to the current window.
    pub(crate) fn spend(&self, store: &dyn Checkpointer, owner: &str, tokens: u64, cost: f64) {
        let window = self.window_at(crate::clock::now_ms());
        if let Err(e) = store.add_usage(owner, window, tokens, cost) {
            tracing::warn!(target: "runner", owner, error = %e, "a run's usage was not counted in its user's quota");
        }
    }
}

/// A window's length as `runner.toml` writes it: seconds, or a number with `s`, `m`, `h` or
/// `d` (`"1d"`, `"30m"`).
pub fn parse_window(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a window: write seconds, or e.g. `1d`, `12h`, `30m`"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86_400.0,
        other => return Err(format!("`{other}` is not a unit of a window: s, m, h or d")),
    };
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("`{text}` is not a window longer than 0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_fixed_and_parsed_with_units() {
        let q = Quotas {
            window: Duration::from_secs(10),
            limits: QuotaLimits::default(),
        };
        assert_eq!(q.window_at(25_000), 20_000);
        assert_eq!(q.window_at(20_000), 20_000);
        assert_eq!(parse_window("1d").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_window("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_window("0.5h").unwrap(), Duration::from_secs(1800));
        assert!(parse_window("0").is_err());
        assert!(parse_window("3w").is_err());
    }

    #[test]
    fn a_spent_quota_is_a_429_that_says_when_it_resets() {
        let store = crate::checkpoint::memory::MemoryCheckpointer::new();
        let q = Quotas {
            window: Duration::from_secs(3600),
            limits: QuotaLimits {
                runs: Some(1),
                ..QuotaLimits::default()
            },
        };
        let alice = Caller {
            user: Some("alice".into()),
            admin: false,
        };
        q.admit(&store, &alice).unwrap();
        let refused = q.admit(&store, &alice).unwrap_err();
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.detail.contains("1 of 1 runs started"), "{}", refused.detail);
        assert!(refused.retry_after.is_some_and(|s| (1..=3600).contains(&s)));
        // The shared key's holder has no quota.
        let anyone = Caller::anonymous_admin();
        q.admit(&store, &anyone).unwrap();
        q.admit(&store, &anyone).unwrap();
    }
}
