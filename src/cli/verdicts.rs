//! The verdict store of the CLI: a clean schema verdict of compile/ kept as an empty file,
//! named by the SHA-256 of this executable's identity (path, size, modification time: a
//! rebuilt or upgraded binary, whose embedded schema or validators may differ, starts afresh)
//! and the verdict's key. Its existence is the whole record, so a concurrent writer or a crash
//! leaves either nothing or a complete entry.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::compile::verdicts::VerdictStore;

pub(super) struct Files {
    dir: PathBuf,
    /// SHA-256 state over the executable's identity, cloned per key.
    prefix: Sha256,
}

impl Files {
    /// Verdicts under `dir/verdicts`; `None` without an executable to identify.
    pub(super) fn for_this_executable(dir: PathBuf) -> Option<Files> {
        let exe = std::env::current_exe().ok()?;
        let meta = std::fs::metadata(&exe).ok()?;
        let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
        let mut prefix = Sha256::new();
        prefix.update(exe.as_os_str().as_encoded_bytes());
        prefix.update(meta.len().to_le_bytes());
        prefix.update(modified.as_nanos().to_le_bytes());
        Some(Files {
            dir: dir.join("verdicts"),
            prefix,
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        let mut h = self.prefix.clone();
        h.update(key.as_bytes());
        let hex = format!("{:x}", h.finalize());
        self.dir.join(&hex[..2]).join(&hex[2..])
    }
}

impl VerdictStore for Files {
    fn contains(&self, key: &str) -> bool {
        self.path(key).is_file()
    }

    fn insert(&self, key: &str) {
        let _ = write_empty(&self.path(key));
    }
}

/// Creates the empty file `path` (and its folder).
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
    fn a_kept_key_is_found_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::for_this_executable(dir.path().to_path_buf()).unwrap();
        assert!(!files.contains("a"));
        files.insert("a");
        assert!(files.contains("a"));
        assert!(!files.contains("b"));
        files.insert("a");
        assert!(files.contains("a"), "keeping twice keeps the entry");
    }
}
