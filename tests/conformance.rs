//! The differential conformance suite (tests/conformance/): every scenario driven through
//! LangGraph's own Python and JS clients against the reference server (`langgraph dev`,
//! pinned in tests/conformance/requirements.txt) and against `runner serve`, the answers
//! compared after ids and times are normalised; then agent-chat-ui's flows through the JS
//! SDK's React hook against both. A difference fails unless tests/conformance/differences.yaml
//! lists it as deliberate, and a listed one that no longer occurs fails too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::support::install;

fn suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

/// The venv with the reference server and the Python client, made once per build directory.
fn reference_venv() -> PathBuf {
    install::venv("conformance-venv", &suite().join("requirements.txt"))
        .unwrap_or_else(|e| panic!("the reference server could not be installed: {e}"))
}

/// The JS client and React (for the flows), installed from the lock file, with the suite's
/// scripts beside them so that their imports resolve there; once per test process, which both
/// tests share.
fn js_client() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let source = suite().join("js");
        let dir = install::npm_ci("conformance-js", &source)
            .unwrap_or_else(|e| panic!("the JS client could not be installed: {e}"));
        // Another test process may be reading them: each lands whole, by a rename.
        for script in ["drive.mjs", "flows.mjs"] {
            let part = dir.join(format!("{script}.{}", std::process::id()));
            std::fs::copy(source.join(script), &part).unwrap();
            std::fs::rename(&part, dir.join(script)).unwrap();
        }
        dir
    })
    .clone()
}

/// Where a run of the suite keeps its servers' logs and each side's answers: a directory of
/// this test process's own (two `cargo test` processes may share a build directory), removed
/// once the suite has passed.
fn out_dir(name: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    out
}

/// Both clients, every scenario, both servers: no difference but the deliberate ones, and
/// agent-chat-ui's flows work on runner.
#[test]
fn langgraph_clients_see_what_the_reference_server_shows() {
    let python = reference_venv();
    let js = js_client();
    let out = out_dir("conformance");
    let run = Command::new(python)
        .arg(suite().join("run.py"))
        .arg("--runner")
        .arg(env!("CARGO_BIN_EXE_runner"))
        .arg("--js")
        .arg(&js)
        .arg("--flows")
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        run.status.success(),
        "the conformance suite failed (its servers' logs and each side's answers are in {}):\n{said}",
        out.display()
    );
    assert!(said.contains("conformance: passed"), "{said}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The same scenarios through LangGraph's Python and JS clients, and agent-chat-ui's flows,
/// with runner on PostgreSQL and its runs executed apart from the API: a server of the API only
/// (`--workers 0`) and two `runner worker` processes (a schema of the database per client).
/// Every run a client makes executes on another process than the one it talks to, the clients
/// see what the reference server shows, and the flows work.
#[test]
fn langgraph_clients_see_the_same_when_runs_execute_on_workers_apart() {
    let python = reference_venv();
    let js = js_client();
    let out = out_dir("conformance-postgres");
    let run = Command::new(python)
        .arg(suite().join("run.py"))
        .arg("--runner")
        .arg(env!("CARGO_BIN_EXE_runner"))
        .arg("--js")
        .arg(&js)
        .arg("--flows")
        .arg("--postgres")
        .arg(super::support::postgres::fresh_url())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        run.status.success(),
        "the conformance suite on PostgreSQL failed (its servers' and workers' logs and each side's answers are in {}):\n{said}",
        out.display()
    );
    assert!(said.contains("conformance: passed"), "{said}");
    let _ = std::fs::remove_dir_all(&out);
}
