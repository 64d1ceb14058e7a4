//! The differential conformance suite (tests/conformance/): every scenario driven through
//! LangGraph's own Python and JS clients against the reference server (`langgraph dev`,
//! pinned in tests/conformance/requirements.txt) and against `runner serve`, the answers
//! compared after ids and times are normalised; then agent-chat-ui's flows through the JS
//! SDK's React hook against both. A difference fails unless tests/conformance/differences.yaml
//! lists it as deliberate, and a listed one that no longer occurs fails too.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::support::install;

fn suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

/// The venv with the reference server and the Python client, made once per build directory.
fn reference_venv() -> PathBuf {
    let requirements = suite().join("requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).unwrap();
    let venv = install::once("conformance-venv", &wanted, |venv| {
        install::run(
            Command::new("python3").args(["-m", "venv"]).arg(venv),
            "python3 -m venv",
        )?;
        install::run(
            Command::new(venv.join("bin/python"))
                .args(["-m", "pip", "install", "--disable-pip-version-check", "-q", "-r"])
                .arg(&requirements),
            "pip install -r tests/conformance/requirements.txt (it needs PyPI)",
        )
    });
    match venv {
        Ok(v) => v.join("bin/python"),
        Err(e) => panic!("the reference server could not be installed: {e}"),
    }
}

/// The JS client and React (for the flows), installed from the lock file, with the suite's
/// scripts beside them so that their imports resolve there.
fn js_client() -> PathBuf {
    let source = suite().join("js");
    let wanted = std::fs::read_to_string(source.join("package-lock.json")).unwrap();
    let dir = install::once("conformance-js", &wanted, |dir| {
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(source.join(file), dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        }
        install::run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
                .current_dir(dir),
            &format!("npm ci in {} (it needs node, npm and the npm registry)", dir.display()),
        )
    });
    let dir = match dir {
        Ok(d) => d,
        Err(e) => panic!("the JS client could not be installed: {e}"),
    };
    for script in ["drive.mjs", "flows.mjs"] {
        std::fs::copy(source.join(script), dir.join(script)).unwrap();
    }
    dir
}

/// Both clients, every scenario, both servers: no difference but the deliberate ones, and
/// agent-chat-ui's flows work on runner.
#[test]
fn langgraph_clients_see_what_the_reference_server_shows() {
    let python = reference_venv();
    let js = js_client();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance");
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
}
