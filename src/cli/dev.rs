//! `runner dev`'s watcher: the served folder reloaded when one of its files changes.
//!
//! A poll, not file-system notifications: every [`POLL`] it compares each watched file's
//! modification time and size with the last look's. A few hundred files cost a few hundred
//! `stat` calls a poll; it needs no crate, and it works the same on every file system, those
//! inotify does not see into (network mounts, a container's bind mounts from another OS)
//! included. Watched: every file under the folder, under the `prompts/` and `schemas/`
//! folders beside it, and every file the workflows' compilations read (imports, subgraphs and
//! prompts elsewhere).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How often the files are looked at.
const POLL: Duration = Duration::from_millis(300);

/// What a file looked like: its modification time and size.
type Seen = BTreeMap<PathBuf, (Option<SystemTime>, u64)>;

/// Starts the thread that reloads `dir` through `reloader` when a watched file changes, is
/// added or is removed.
pub(super) fn watch(reloader: crate::server::Reloader, dir: PathBuf) {
    let shown = dir.display().to_string();
    let spawned = std::thread::Builder::new()
        .name("runner-dev-watch".into())
        .spawn(move || {
            let mut seen = look(&reloader, &dir);
            loop {
                std::thread::sleep(POLL);
                let now = look(&reloader, &dir);
                if now != seen {
                    super::serve::reload(&reloader, &dir);
                    // What the reload compiled may read other files: looked at again.
                    seen = look(&reloader, &dir);
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("warning: cannot watch {shown}: {e}; reload with SIGHUP");
    }
}

/// Every watched file as it is now.
fn look(reloader: &crate::server::Reloader, dir: &Path) -> Seen {
    let mut seen = Seen::new();
    let mut folders = vec![dir.to_path_buf()];
    if let Some(parent) = dir.parent() {
        folders.extend(
            ["prompts", "schemas"]
                .map(|f| parent.join(f))
                .into_iter()
                .filter(|f| f.is_dir()),
        );
    }
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            match entry.file_type() {
                Ok(t) if t.is_dir() && !hidden => folders.push(path),
                Ok(t) if t.is_file() && !hidden => {
                    seen.insert(path.clone(), stat(&path));
                }
                _ => {}
            }
        }
    }
    for path in reloader.files() {
        let stat = stat(&path);
        seen.entry(path).or_insert(stat);
    }
    seen
}

fn stat(path: &Path) -> (Option<SystemTime>, u64) {
    match std::fs::metadata(path) {
        Ok(m) => (m.modified().ok(), m.len()),
        Err(_) => (None, 0),
    }
}
