//! `runner db backup`: a consistent copy of a store in use.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::{BUSY_TIMEOUT, keep_wal_on_close};
use crate::checkpoint::{CheckpointError, Result};

/// Writes a consistent copy of the store at `path` to `dest`, a new file, while other
/// processes may be reading and writing it: SQLite's `VACUUM INTO`, in one read transaction
/// (a snapshot that never waits for or holds up a writer), the WAL's commits included,
/// compacted and without a WAL of its own. The copy is written beside `dest`, synced and then
/// renamed, so `dest` is either absent or whole; an existing `dest` is refused.
pub fn backup(path: &Path, dest: &Path) -> Result<()> {
    if !path.is_file() {
        return Err(CheckpointError::Backend(format!("`{}` does not exist", path.display())));
    }
    if dest.exists() {
        return Err(CheckpointError::Backend(format!(
            "`{}` exists: a backup never replaces a file",
            dest.display()
        )));
    }
    // Not read-only: `VACUUM INTO` opens its output with the connection's flags. Nothing is
    // written to `path` (a read transaction, and no checkpoint at close).
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    keep_wal_on_close(&conn)?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version == 0 {
        return Err(CheckpointError::Backend(format!(
            "`{}` is not a checkpoint database",
            path.display()
        )));
    }
    let mut partial = dest.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = PathBuf::from(partial);
    let io = |what: &str, p: &Path, e: std::io::Error| {
        CheckpointError::Backend(format!("cannot {what} `{}`: {e}", p.display()))
    };
    let text = partial
        .to_str()
        .ok_or_else(|| CheckpointError::Backend(format!("`{}` is not a UTF-8 path", dest.display())))?;
    let written = conn
        .execute("VACUUM INTO ?1", [text])
        .map_err(CheckpointError::from)
        .and_then(|_| {
            std::fs::File::open(&partial)
                .and_then(|f| f.sync_all())
                .map_err(|e| io("sync", &partial, e))
        })
        .and_then(|()| {
            // A link, unlike a rename, never replaces a file made meanwhile; a file system
            // without links gets the rename.
            match std::fs::hard_link(&partial, dest) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(CheckpointError::Backend(format!(
                    "`{}` exists: a backup never replaces a file",
                    dest.display()
                ))),
                Err(_) => std::fs::rename(&partial, dest).map_err(|e| io("write", dest, e)),
            }
        });
    let _ = std::fs::remove_file(&partial);
    written?;
    // The rename is durable once the folder is synced (where the platform can sync one).
    if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}
