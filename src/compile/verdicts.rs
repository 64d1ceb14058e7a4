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
//! Off unless the binary turns it on ([`enable`]); the CLI does, in `$RUNNER_CACHE_DIR` or the
//! user's cache directory. Any failure to read or write the cache only means checking again.
//!
//! Part of compile/; depends on nothing else in the crate.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Where verdicts live (`None`: not remembered), and the key prefix of this executable, set
/// once per process.
static CACHE: OnceLock<Option<Cache>> = OnceLock::new();

struct Cache {
    dir: PathBuf,
    /// SHA-256 state over the executable's identity, cloned per key.
    prefix: Sha256,
}

/// What a verdict is about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Check {
    /// A workflow document against the embedded workflow schema.
    Workflow,
    /// A value (a state key's default) against a user schema.
    Value,
}

/// Remembers clean verdicts under `dir` for the rest of the process (`None`: never). Only the
/// first call counts. Without an executable to identify, nothing is remembered.
pub fn enable(dir: Option<PathBuf>) {
    CACHE.get_or_init(|| Cache::for_this_executable(dir?));
}

/// Whether `check` is known to pass on `values`.
pub(crate) fn passed(check: Check, values: &[&Value]) -> bool {
    CACHE
        .get()
        .and_then(Option::as_ref)
        .is_some_and(|c| c.passed(check, values))
}

/// Remembers that `check` passed on `values`.
pub(crate) fn remember(check: Check, values: &[&Value]) {
    if let Some(cache) = CACHE.get().and_then(Option::as_ref) {
        cache.remember(check, values);
    }
}

impl Cache {
    fn for_this_executable(dir: PathBuf) -> Option<Cache> {
        let exe = std::env::current_exe().ok()?;
        let meta = std::fs::metadata(&exe).ok()?;
        let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
        let mut prefix = Sha256::new();
        prefix.update(env!("CARGO_PKG_VERSION"));
        prefix.update(exe.as_os_str().as_encoded_bytes());
        prefix.update(meta.len().to_le_bytes());
        prefix.update(modified.as_nanos().to_le_bytes());
        Some(Cache {
            dir: dir.join("verdicts"),
            prefix,
        })
    }

    /// The file that stands for `check` having passed on `values`.
    fn entry(&self, check: Check, values: &[&Value]) -> Option<PathBuf> {
        let mut h = self.prefix.clone();
        h.update([check as u8]);
        for v in values {
            // serde_json writes a map in its order, which the loader fixed: the same text, the
            // same key. Each value is framed by its length, so two values never read as another two.
            let bytes = serde_json::to_vec(v).ok()?;
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(&bytes);
        }
        let hex = format!("{:x}", h.finalize());
        Some(self.dir.join(&hex[..2]).join(&hex[2..]))
    }

    fn passed(&self, check: Check, values: &[&Value]) -> bool {
        self.entry(check, values).is_some_and(|p| p.is_file())
    }

    fn remember(&self, check: Check, values: &[&Value]) {
        if let Some(path) = self.entry(check, values) {
            let _ = write_empty(&path);
        }
    }
}

/// Creates the empty file `path` (and its folder): its existence is the whole record, so a
/// concurrent writer or a crash leaves either nothing or a complete entry.
fn write_empty(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_is_the_checks_and_the_values_alone() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::for_this_executable(dir.path().to_path_buf()).unwrap();
        let (passed, remember) = (
            |c, v: &[&Value]| cache.passed(c, v),
            |c, v: &[&Value]| cache.remember(c, v),
        );
        let doc = serde_json::json!({"name": "a", "nodes": {"x": {"kind": "set"}}});
        let other = serde_json::json!({"name": "a", "nodes": {"x": {"kind": "emit"}}});
        assert!(!passed(Check::Workflow, &[&doc]));
        remember(Check::Workflow, &[&doc]);
        assert!(passed(Check::Workflow, &[&doc]));
        assert!(
            !passed(Check::Workflow, &[&other]),
            "another document is not known to pass"
        );
        assert!(!passed(Check::Value, &[&doc]), "nor the same value in another check");
        remember(Check::Workflow, &[&doc]);
        assert!(passed(Check::Workflow, &[&doc]), "remembering twice keeps the entry");
        let (a, b) = (serde_json::json!("ab"), serde_json::json!("c"));
        let (c, d) = (serde_json::json!("a"), serde_json::json!("bc"));
        remember(Check::Value, &[&a, &b]);
        assert!(passed(Check::Value, &[&a, &b]));
        assert!(!passed(Check::Value, &[&c, &d]), "values are framed, not concatenated");
    }
}
