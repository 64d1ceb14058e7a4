//! The Studio page: served from the binary (content types, revalidation, gzip, no key needed
//! for the page itself), and driven in a real browser — Debian's headless Chromium (installed
//! by this file's set-up when missing and running as root) through playwright-core (pinned in
//! `tests/studio/package-lock.json`, installed by `npm ci` into the target directory; it
//! downloads no browser) — by the node scripts of `tests/studio/`, against `runner serve` on
//! loopback with the mock provider. Each script saves a screenshot under the target
//! directory's `studio-shots/`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::serve::{Server, client, spawn};
use super::support::install;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where the browser tests' screenshots go: `<target>/studio-shots/`.
fn shots() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap_or(Path::new(env!("CARGO_TARGET_TMPDIR")))
        .join("studio-shots")
}

/// Debian's `chromium`: installed when missing, as root (as in CI); otherwise what to install.
fn chromium() -> &'static Path {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match FOUND.get_or_init(find_chromium) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn find_chromium() -> Result<PathBuf, String> {
    let path = PathBuf::from("/usr/bin/chromium");
    if path.exists() {
        return Ok(path);
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "Chromium is not installed at /usr/bin/chromium. Install it (on Debian: \
                    `sudo apt-get install chromium`) and run the tests again."
                .into(),
        );
    }
    let apt = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        // Wait for another apt (another test run installing the same) rather than fail.
        cmd.args(["-o", "DPkg::Lock::Timeout=600"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    let get = ["install", "-y", "-q", "--no-install-recommends", "chromium"];
    if install::run(&mut apt(&get), "apt-get install chromium").is_err() {
        // A clean machine has no package lists yet.
        install::run(
            &mut apt(&["update", "-q"]),
            "apt-get update (it needs Debian's mirrors)",
        )?;
        install::run(&mut apt(&get), "apt-get install chromium")?;
    }
    if path.exists() {
        Ok(path)
    } else {
        Err("`apt-get install chromium` left no /usr/bin/chromium".into())
    }
}

/// `tests/studio/` installed by `npm ci` under the target directory, its scripts beside the
/// installed driver so that their imports resolve to it.
fn driver() -> &'static Path {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let made = DIR.get_or_init(|| {
        let source = root().join("tests/studio");
        let dir = install::npm_ci("studio-driver", &source)?;
        for entry in std::fs::read_dir(&source).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.extension().is_some_and(|e| e == "mjs") {
                std::fs::copy(&path, dir.join(path.file_name().unwrap())).map_err(|e| e.to_string())?;
            }
        }
        Ok(dir)
    });
    match made {
        Ok(p) => p,
        Err(e) => panic!("the browser test driver (playwright-core) could not be installed: {e}"),
    }
}

/// Runs `tests/studio/<script>` against `s`; what it printed. A skipped test says why on the
/// test's output.
fn drive(script: &str, s: &Server) -> String {
    let browser = chromium();
    let dir = driver();
    let out = Command::new("node")
        .arg(dir.join(script))
        .arg(&s.base)
        .arg(shots())
        .env("CHROMIUM", browser)
        .current_dir(dir)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} failed:\n{said}");
    let name = script.trim_end_matches(".mjs");
    if let Some(line) = said
        .lines()
        .find(|l| l.starts_with(&format!("studio: {name} skipped:")))
    {
        eprintln!("SKIPPED {line}");
    } else {
        assert!(said.contains(&format!("studio: {name} passed")), "{said}");
    }
    said
}

/// `runner serve` over the shipped `workflows/` on the seed mock script `mock`.
fn serve_seeds(mock: &str) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let (child, base, _) = spawn(
        dir.path(),
        &root().join("workflows"),
        &root().join("tests/fixtures/mock").join(mock),
        &["--data-db", ":memory:"],
        &[],
    );
    Server {
        child,
        base,
        dir: Some(dir),
    }
}

/// A workflow of fifty nodes: a chain with a branch and a join every few nodes, routes
/// between, for measuring how fast the page draws a big graph.
fn fifty() -> String {
    let mut nodes = String::new();
    let mut edges = String::from("  - START -> n00\n");
    for i in 0..50 {
        nodes.push_str(&format!("  n{i:02}: {{kind: set, update: {{n: \"state.n + 1\"}}}}\n"));
    }
    let mut i = 0;
    while i < 49 {
        if i % 6 == 0 && i + 3 < 50 {
            edges.push_str(&format!(
                "  - from: n{i:02}\n    route:\n      - {{when: \"state.n > {i}\", to: n{:02}}}\n      - {{to: n{:02}}}\n",
                i + 1,
                i + 2
            ));
            edges.push_str(&format!(
                "  - n{:02} -> n{:02}\n  - n{:02} -> n{:02}\n",
                i + 1,
                i + 3,
                i + 2,
                i + 3
            ));
            i += 3;
        } else {
            edges.push_str(&format!("  - n{i:02} -> n{:02}\n", i + 1));
            i += 1;
        }
    }
    edges.push_str("  - n49 -> END\n");
    format!(
        "# Generated by tests/studio.rs: fifty nodes for the page's first-paint measurement.\nname: fifty\n\
         limits: {{recursion_limit: 200}}\nstate: {{n: {{type: integer, default: 0}}}}\nnodes:\n{nodes}edges:\n{edges}"
    )
}

/// `runner serve` over `tests/fixtures/studio/` (and the generated fifty-node workflow) on its
/// mock script, with `args` and `env`.
fn serve_fixtures(args: &[&str], env: &[(&str, &str)]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir(&workflows).unwrap();
    let fixtures = root().join("tests/fixtures/studio");
    for name in ["story.yaml", "flaky.yaml", "priced.yaml", "burst.yaml", "paced.yaml"] {
        std::fs::copy(fixtures.join(name), workflows.join(name)).unwrap();
    }
    std::fs::write(workflows.join("fifty.yaml"), fifty()).unwrap();
    std::fs::write(
        workflows.join("broken.yaml"),
        "name: broken\nnodes:\n  a: {kind: nope}\nedges: [START -> a -> END]\n",
    )
    .unwrap();
    let mut all = vec!["--data-db", ":memory:"];
    all.extend_from_slice(args);
    let (child, base, said) = spawn(dir.path(), &workflows, &fixtures.join("mock.yaml"), &all, env);
    assert!(said.contains("not served: ") && said.contains("broken.yaml"), "{said}");
    Server {
        child,
        base,
        dir: Some(dir),
    }
}

async fn get(s: &Server, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client().get(format!("{}{path}", s.base));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// The page and its files: the page at `/` and `/studio/`, each file with its content type,
/// revalidated by its ETag (a 304 when unchanged), gzipped for a client that takes it (the
/// bytes the unzipped file is), a file the bundle lacks a 404; with `--api-key-env` the page
/// needs no key and the API still does. The JS and CSS together stay under 300 KB gzipped.
#[tokio::test(flavor = "multi_thread")]
async fn the_page_is_served_from_the_binary() {
    let s = serve_fixtures(&["--api-key-env", "STUDIO_TEST_KEY"], &[("STUDIO_TEST_KEY", "sekrit")]);
    let page = get(&s, "/", &[]).await;
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(page.headers()["cache-control"], "no-cache");
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'self'")
    );
    // The page's inline script (its first requests) runs by its hash, and no other does.
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert_eq!(csp.matches("script-src 'self' 'sha256-").count(), 1, "{csp}");
    let etag = page.headers()["etag"].to_str().unwrap().to_string();
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"src="/studio/assets/studio.js""#), "{html}");
    assert_eq!(get(&s, "/studio/", &[]).await.text().await.unwrap(), html);
    assert_eq!(get(&s, "/", &[("if-none-match", &etag)]).await.status(), 304);

    let mut gzipped = 0;
    for (path, kind) in [
        ("/studio/assets/studio.js", "text/javascript; charset=utf-8"),
        ("/studio/assets/studio.css", "text/css; charset=utf-8"),
    ] {
        let plain = get(&s, path, &[]).await;
        assert_eq!(plain.status(), 200, "{path}");
        assert_eq!(plain.headers()["content-type"], kind);
        assert!(plain.headers().get("content-encoding").is_none());
        let plain = plain.bytes().await.unwrap();
        let on_disk = std::fs::read(root().join("studio/dist").join(path.trim_start_matches("/studio/"))).unwrap();
        assert_eq!(plain.as_ref(), on_disk.as_slice(), "{path} is the committed bundle's");
        // reqwest would unzip on its own: the raw bytes are read through a client without it.
        let zipped = reqwest::Client::builder()
            .no_gzip()
            .build()
            .unwrap()
            .get(format!("{}{path}", s.base))
            .header("accept-encoding", "gzip, deflate, br")
            .send()
            .await
            .unwrap();
        assert_eq!(zipped.headers()["content-encoding"], "gzip", "{path}");
        assert_eq!(zipped.headers()["vary"], "accept-encoding");
        let zipped = zipped.bytes().await.unwrap();
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(zipped.as_ref())
            .read_to_end(&mut unzipped)
            .unwrap();
        assert_eq!(unzipped, on_disk, "{path}");
        gzipped += zipped.len();
    }
    eprintln!("studio bundle: {gzipped} bytes of JS and CSS gzipped");
    assert!(
        gzipped < 300 * 1024,
        "the page's JS and CSS weigh {gzipped} bytes gzipped"
    );
    assert_eq!(get(&s, "/studio/assets/nope.js", &[]).await.status(), 404);
    // The page needs no key; the API does.
    assert_eq!(get(&s, "/assistants/story", &[]).await.status(), 401);
    assert_eq!(
        get(&s, "/assistants/story", &[("x-api-key", "sekrit")]).await.status(),
        200
    );
}

/// The page loads, starts a mindmap run from the input form and shows the `node_added`
/// custom events as they arrive.
#[test]
fn studio_runs_the_mindmap_from_its_form() {
    drive("mindmap.mjs", &serve_seeds("mindmap.yaml"));
}

/// deep-research stops at its plan gate; Accept on the page answers it and the run goes on to
/// the next gate.
#[test]
fn studio_answers_deep_researchs_first_gate() {
    drive("gate.mjs", &serve_seeds("deep-research-served.yaml"));
}

/// A thread forked at an older checkpoint with an edited value runs a new branch from there.
#[test]
fn studio_forks_a_thread_with_an_edited_value() {
    drive("fork.mjs", &serve_fixtures(&[], &[]));
}

/// A failed node runs again after its input is edited, and the run succeeds.
#[test]
fn studio_reruns_a_failed_node_after_editing_its_input() {
    drive("rerun.mjs", &serve_fixtures(&[], &[]));
}

/// Two turns of the RAG chat in the chat view, the replies streamed.
#[test]
fn studio_holds_a_two_turn_rag_chat() {
    drive("chat.mjs", &serve_seeds("rag-chat.yaml"));
}

/// A task span of the trace shows the state the task read, asked for from its checkpoint when
/// the span is opened and only then, and what its writes changed.
#[test]
fn studio_shows_the_state_a_task_read() {
    drive("taskinput.mjs", &serve_fixtures(&[], &[]));
}

/// A question edited in the chat makes a second branch: the message where they part switches
/// between them (`< 1/2 >`), and the chat goes on from the branch shown.
#[test]
fn studio_switches_between_chat_branches() {
    drive("chatbranch.mjs", &serve_seeds("rag-chat.yaml"));
}

/// Tokens and cost per node and per model from a run's trace (skipped, saying so, on a server
/// whose trace endpoint answers 404).
#[test]
fn studio_shows_tokens_and_cost_per_node() {
    drive("usage.mjs", &serve_fixtures(&[], &[]));
}

/// With `--api-key-env`, the page asks for the key (again after a wrong one), then works, and
/// keeps it for the browser session.
#[test]
fn studio_asks_for_the_api_key_once_per_session() {
    drive(
        "apikey.mjs",
        &serve_fixtures(&["--api-key-env", "STUDIO_TEST_KEY"], &[("STUDIO_TEST_KEY", "sekrit")]),
    );
}

/// The workflow files the server does not serve, with each problem at file:line:col
/// (skipped, saying so, on a server without `GET /runner/workflows`).
#[test]
fn studio_lists_the_files_not_served() {
    drive("problems.mjs", &serve_fixtures(&[], &[]));
}

/// A graph's first view asks for the graph before the page's bundle has run, and leaves what
/// the other panels need until the graph has arrived.
#[test]
fn studio_asks_for_the_graph_before_its_bundle_runs() {
    drive("firstpaint.mjs", &serve_fixtures(&[], &[]));
}

/// Measurements for README (printed, not asserted on time): the first paint of a 50-node
/// graph (and when each request it needed was sent and answered), and the page under a run streaming about 200 events a second and under one
/// streaming as fast as the engine steps.
#[test]
fn studio_measures_a_big_graph_and_a_fast_stream() {
    let said = drive("measure.mjs", &serve_fixtures(&[], &[]));
    let line = said
        .lines()
        .find(|l| l.starts_with("measure: "))
        .expect("the measurements");
    eprintln!("{line}");
}
