//! Real clients the tests drive (LangGraph's Python and JS SDKs) installed from the package
//! registries once per build directory, whatever number of tests ask at the same time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The directory `CARGO_TARGET_TMPDIR/name`, made by `install` unless it was already made from
/// the same `pinned` text (a requirements or lock file). A lock directory beside it keeps
/// concurrent tests from installing twice; one left by a process that died is taken after the
/// longest install could take.
pub(crate) fn once(
    name: &str,
    pinned: &str,
    install: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = root.join(name);
    let marker = dir.join(".installed-from");
    let lock = root.join(format!("{name}.lock"));
    let longest = Duration::from_secs(900);
    let deadline = Instant::now() + longest;
    while std::fs::create_dir(&lock).is_err() {
        let stale = std::fs::metadata(&lock)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() > longest);
        if stale {
            let _ = std::fs::remove_dir(&lock);
        } else if Instant::now() > deadline {
            return Err(format!("{} stayed locked for 15 minutes", lock.display()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let result = (|| {
        if std::fs::read_to_string(&marker).is_ok_and(|m| m == pinned) {
            return Ok(dir.clone());
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        install(&dir)?;
        std::fs::write(&marker, pinned).map_err(|e| e.to_string())?;
        Ok(dir.clone())
    })();
    let _ = std::fs::remove_dir(&lock);
    result
}

/// Runs `cmd`; a failure says what it was and everything it printed.
pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// A venv under the target directory named `name`, with `requirements` (a path inside the
/// repository) installed from PyPI: its Python.
pub(crate) fn venv(name: &str, requirements: &Path) -> Result<PathBuf, String> {
    let wanted = std::fs::read_to_string(requirements).map_err(|e| format!("{}: {e}", requirements.display()))?;
    let venv = once(name, &wanted, |venv| {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(venv),
            "python3 -m venv",
        )?;
        run(
            Command::new(venv.join("bin/python"))
                .args(["-m", "pip", "install", "--disable-pip-version-check", "-q", "-r"])
                .arg(requirements),
            &format!("pip install -r {} (it needs PyPI)", requirements.display()),
        )
    })?;
    Ok(venv.join("bin/python"))
}

/// The npm packages `source`'s `package-lock.json` pins, installed with `npm ci` into a
/// directory under the target directory named `name` (the source tree stays clean): that
/// directory.
pub(crate) fn npm_ci(name: &str, source: &Path) -> Result<PathBuf, String> {
    let wanted = std::fs::read_to_string(source.join("package-lock.json")).map_err(|e| e.to_string())?;
    once(name, &wanted, |dir| {
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(source.join(file), dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        }
        run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
                .current_dir(dir),
            &format!("npm ci in {} (it needs node, npm and the npm registry)", dir.display()),
        )
    })
}
