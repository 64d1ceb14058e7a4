//! The module layering, checked: every `crate::…` path in `src/` is an arrow from the top-level
//! module whose file holds it to the top-level module it names, and each arrow must be one the
//! table below allows. A lower layer importing a higher one fails this test, naming the file.
//!
//! Only `crate::` paths are read: they are how this code base names another top-level module
//! (`super::` stays inside one). Comment lines are skipped, so a doc link is not an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Which top-level modules each top-level module may import. A module not listed here fails
/// the test until it is given its place.
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves: they depend on nothing in the crate, so anything may use them.
    ("clock", &[]),
    ("secrets", &[]),
    ("error_class", &[]),
    ("diag", &[]),
    // Waiting without stalling the async runtime: for the stores' synchronous calls.
    ("blocking", &[]),
    // PostgreSQL connections (URL, TLS, pool), shared by the stores that live there.
    ("pg", &[]),
    // The language as written: its diagnostics and the error classes `retry_on` names.
    ("spec", &["diag", "error_class"]),
    // Stores know nothing of plans, the engine or the network.
    ("checkpoint", &["clock", "pg", "blocking"]),
    ("cassette", &["spec", "clock", "secrets"]),
    // The compiler reads the language and reports diagnostics; it never reaches the engine,
    // node kinds, the network, providers, the data store, cassettes or the CLI.
    ("compile", &["spec", "diag", "error_class"]),
    // The network knows nothing of providers (which build on it) or the engine.
    ("net", &["cassette", "error_class", "secrets", "clock"]),
    (
        "providers",
        &["spec", "error_class", "net", "cassette", "secrets", "clock"],
    ),
    // The data store reaches embeddings only through the `Embedder` trait.
    ("rag", &["providers", "clock", "pg", "blocking"]),
    // The engine never imports the CLI or a node kind: kinds implement its `NodeKind` and
    // reach it through the run's `Services`. It names the clients and stores of `Services`
    // (providers, cassette, data store, web client) only to hand them to the kinds; `net`
    // otherwise only for `net::http_error`'s bounded delays.
    (
        "engine",
        &[
            "spec",
            "diag",
            "compile",
            "checkpoint",
            "clock",
            "error_class",
            "net",
            "providers",
            "cassette",
            "rag",
            "secrets",
        ],
    ),
    // Node kinds run inside the engine: they implement what it asks of a kind.
    (
        "nodes",
        &[
            "spec",
            "diag",
            "compile",
            "engine",
            "checkpoint",
            "clock",
            "error_class",
            "net",
            "providers",
            "cassette",
            "rag",
            "secrets",
        ],
    ),
    // The run builder assembles a run's settings and services from every layer below the CLI.
    (
        "run",
        &[
            "spec",
            "diag",
            "compile",
            "engine",
            "nodes",
            "checkpoint",
            "clock",
            "error_class",
            "net",
            "providers",
            "cassette",
            "rag",
            "secrets",
        ],
    ),
    // The server drives runs through the run builder, as the CLI does; it never imports the CLI.
    // Its store endpoints read and write the data store as `store` nodes do; run webhooks are
    // sent through the network's guarded web client, and its JWT verifier fetches a JWKS with
    // the network's client builder.
    (
        "server",
        &[
            "run",
            "spec",
            "diag",
            "compile",
            "engine",
            "nodes",
            "checkpoint",
            "clock",
            "rag",
            "net",
            "error_class",
            "blocking",
        ],
    ),
    // The process's logs and traces: set up by the CLI; it switches the providers' content
    // capture and builds its exporter's client with the network's builder.
    ("telemetry", &["net", "providers"]),
    // The CLI is the top: it may import everything, and nothing imports it.
    (
        "cli",
        &[
            "telemetry",
            "server",
            "run",
            "spec",
            "diag",
            "compile",
            "engine",
            "nodes",
            "checkpoint",
            "clock",
            "error_class",
            "net",
            "providers",
            "cassette",
            "rag",
            "secrets",
        ],
    ),
];

/// Modules whose files are not scanned: this test names modules in its own strings.
const UNSCANNED: &[&str] = &["layers"];

/// Top-level module → imported top-level module → the files that import it.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The top-level modules named by `crate::…` paths in `source` (comment lines skipped).
fn imports(source: &str) -> BTreeSet<String> {
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    for (at, found) in code.match_indices("crate::") {
        // `mycrate::` is another path; `$crate::` (in macros) is this crate.
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let after = &code[at + found.len()..];
        if let Some(group) = after.strip_prefix('{') {
            out.extend(group_heads(group));
        } else if !ident(after).is_empty() {
            out.insert(ident(after).to_string());
        }
    }
    out
}

/// The first path segment of each item of a `{…}` group, `group` starting after its `{`.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = vec![];
    let mut depth = 0usize;
    let mut item_start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if item_start && !c.is_whitespace() => {
                item_start = false;
                let name = ident(&group[i..]);
                if !name.is_empty() && name != "self" {
                    heads.push(name.to_string());
                }
            }
            _ => {}
        }
    }
    heads
}

fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The top-level module a file under `src/` belongs to (`None` for the crate roots).
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "main.rs" => None,
        f => Some(f.strip_suffix(".rs").unwrap_or(f).to_string()),
    }
}

fn scan(dir: &Path, root: &Path, graph: &mut Graph) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            scan(&path, root, graph);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(root).unwrap();
        let Some(module) = module_of(relative) else { continue };
        if UNSCANNED.contains(&module.as_str()) {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        let file = format!("src/{}", relative.display());
        let arrows = graph.entry(module.clone()).or_default();
        for to in imports(&source).into_iter().filter(|to| *to != module) {
            arrows.entry(to).or_default().insert(file.clone());
        }
    }
}

/// Every arrow of `graph` the table does not allow.
fn violations(graph: &Graph) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut out = vec![];
    for (from, arrows) in graph {
        let Some(may) = allowed.get(from.as_str()) else {
            out.push(format!("module `{from}` has no place in the layer table"));
            continue;
        };
        for (to, files) in arrows {
            if !may.contains(&to.as_str()) {
                let files: Vec<&str> = files.iter().map(String::as_str).collect();
                out.push(format!("`{from}` imports `{to}` ({})", files.join(", ")));
            }
        }
    }
    out
}

#[test]
fn every_import_follows_the_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = Graph::new();
    scan(&root, &root, &mut graph);
    assert!(graph.contains_key("engine") && graph.contains_key("spec"), "{graph:?}");
    let wrong = violations(&graph);
    assert!(wrong.is_empty(), "arrows against the layering:\n{}", wrong.join("\n"));
}

#[test]
fn a_wrong_arrow_fails() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = Graph::new();
    scan(&root, &root, &mut graph);
    for (from, to) in [
        ("spec", "compile"),
        ("diag", "spec"),
        ("checkpoint", "engine"),
        ("clock", "checkpoint"),
        ("compile", "engine"),
        ("compile", "nodes"),
        ("compile", "net"),
        ("engine", "cli"),
        ("engine", "nodes"),
        ("nodes", "cli"),
        ("net", "providers"),
        ("cassette", "providers"),
        ("run", "cli"),
        ("engine", "run"),
        ("nodes", "run"),
        ("server", "cli"),
        ("engine", "server"),
        ("run", "server"),
    ] {
        let mut wrong = graph.clone();
        let arrows = wrong.entry(from.to_string()).or_default();
        arrows.entry(to.to_string()).or_default().insert("src/x.rs".into());
        let found = violations(&wrong);
        assert_eq!(found, [format!("`{from}` imports `{to}` (src/x.rs)")], "{from} → {to}");
    }
    let mut unknown = graph;
    unknown.insert("plugins".into(), BTreeMap::new());
    assert_eq!(
        violations(&unknown),
        ["module `plugins` has no place in the layer table"]
    );
}

#[test]
fn imports_are_read_from_paths_and_groups() {
    let source = r#"
//! Links in docs are not imports: [`crate::cli`].
use crate::spec::{self, NodeSpec};
use crate::{
    clock::now,
    net::{http_error, Web},
};
pub(crate) fn f() -> crate::diag::Severity { mycrate::x(); $crate::checkpoint::now() }
    /// [`crate::engine::Engine`]
"#;
    let got: Vec<String> = imports(source).into_iter().collect();
    assert_eq!(got, ["checkpoint", "clock", "diag", "net", "spec"]);
    assert_eq!(module_of(Path::new("engine/task.rs")).as_deref(), Some("engine"));
    assert_eq!(module_of(Path::new("clock.rs")).as_deref(), Some("clock"));
    assert_eq!(module_of(Path::new("lib.rs")), None);
}
