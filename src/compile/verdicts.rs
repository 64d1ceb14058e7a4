//! Clean schema verdicts remembered across processes.
//!
//! Whether a value passes a JSON Schema is a pure function of the schema, the validator's code
//! and the value, and building validators is most of what a short run spends before its first
//! step: the workflow schema alone is ~100 KB of JSON to parse and compile for every file, and
//! each state key's schema is compiled to check its default. So a check that passed is
//! remembered, as ruff remembers a file it linted: an empty file named by the SHA-256 of this
//! executable's identity (path, size, modification time: a rebuilt or upgraded binary, whose
//! embedded schema or validators may differ, starts afresh), what was checked and the values it
//! was checked on. The next process asked the same question skips the validator. A check that
//! found a problem is never remembered, so its diagnostics are always computed; nothing but
//! these verdicts is cached, and every other check runs every time.
//!
//! Off unless the binary turns it on ([`enable`]) with a [`VerdictStore`]: the CLI gives one
//! that keeps a verdict as an empty file in `$RUNNER_CACHE_DIR` or the user's cache directory.
//! Any failure to read or write the store only means checking again.
//!
//! Part of compile/; depends on nothing else in the crate. It computes the keys and never
//! touches a file: where verdicts are kept is the store's, given by the caller.

use std::sync::OnceLock;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Where verdicts are kept, by key: the SHA-256 (hex) of this crate's version, the check and
/// the values. A store adds what identifies the validator's code it runs under (the CLI's, the
/// executable's identity), so a rebuilt binary starts afresh.
pub trait VerdictStore: Send + Sync {
    /// Whether the verdict `key` was kept.
    fn contains(&self, key: &str) -> bool;
    /// Keeps the verdict `key`; a failure is ignored (the check runs again next time).
    fn insert(&self, key: &str);
}

/// The store of this process (`None`: nothing remembered), set once.
static STORE: OnceLock<Option<Box<dyn VerdictStore>>> = OnceLock::new();

/// What a verdict is about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Check {
    /// A workflow document against the embedded workflow schema.
    Workflow,
    /// A value (a state key's default) against a user schema.
    Value,
}

/// Remembers clean verdicts in `store` for the rest of the process (`None`: never). Only the
/// first call counts.
pub fn enable(store: Option<Box<dyn VerdictStore>>) {
    STORE.get_or_init(|| store);
}

/// Whether `check` is known to pass on `values`.
pub(crate) fn passed(check: Check, values: &[&Value]) -> bool {
    store().is_some_and(|s| key(check, values).is_some_and(|k| s.contains(&k)))
}

/// Remembers that `check` passed on `values`.
pub(crate) fn remember(check: Check, values: &[&Value]) {
    if let Some((store, key)) = store().and_then(|s| Some((s, key(check, values)?))) {
        store.insert(&key);
    }
}

fn store() -> Option<&'static dyn VerdictStore> {
    STORE.get().and_then(Option::as_deref)
}

/// The key of `check` having passed on `values`.
fn key(check: Check, values: &[&Value]) -> Option<String> {
    let mut h = Sha256::new();
    h.update(env!("CARGO_PKG_VERSION"));
    h.update([check as u8]);
    for v in values {
        // serde_json writes a map in its order, which the loader fixed: the same text, the
        // same key. Each value is framed by its length, so two values never read as another two.
        let bytes = serde_json::to_vec(v).ok()?;
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Some(format!("{:x}", h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_is_the_checks_and_the_values_alone() {
        let doc = serde_json::json!({"name": "a", "nodes": {"x": {"kind": "set"}}});
        let other = serde_json::json!({"name": "a", "nodes": {"x": {"kind": "emit"}}});
        assert_eq!(key(Check::Workflow, &[&doc]), key(Check::Workflow, &[&doc.clone()]));
        assert_ne!(key(Check::Workflow, &[&doc]), key(Check::Workflow, &[&other]));
        assert_ne!(
            key(Check::Workflow, &[&doc]),
            key(Check::Value, &[&doc]),
            "nor the same value in another check"
        );
        let (a, b) = (serde_json::json!("ab"), serde_json::json!("c"));
        let (c, d) = (serde_json::json!("a"), serde_json::json!("bc"));
        assert_ne!(
            key(Check::Value, &[&a, &b]),
            key(Check::Value, &[&c, &d]),
            "values are framed, not concatenated"
        );
    }
}
