//! The integration tests, one module per file of `tests/`, linked into one test binary: each
//! test binary links the whole crate, so one binary instead of one per file is most of the
//! time a cold build of the suite saves. Select a file's tests by its module,
//! e.g. `cargo test --test integration engine::`.
//!
//! The tests of every file run in parallel threads of one process: none may change
//! process-wide state (environment variables, the current directory); child processes get
//! their environment and directory through `Command`.

mod support;

mod accounting;
mod agent;
mod build;
mod cache;
mod cassette;
mod checkpoint;
mod cli;
mod cli_run;
mod compile;
mod conformance;
mod context;
mod crash;
mod data_store;
mod engine;
mod handoff;
mod invalid;
mod kinds;
mod loader_props;
mod mcp;
mod pg_ops;
mod postgres;
mod pptx;
mod props;
mod providers;
mod rag;
mod runner_test;
mod serve;
mod serve_api;
mod serve_auth;
mod serve_conn;
mod serve_crons;
mod serve_routes;
mod serve_seeds;
mod serve_shared;
mod serve_stop;
mod serve_studio_api;
mod studio;
mod thread_removal;
mod tools;
mod trace;
mod web;
mod workflows;

/// With `autotests = false` a file added to `tests/` is compiled only once it is declared
/// here: a forgotten declaration would drop its tests silently.
#[test]
fn every_test_file_is_a_module_of_this_binary() {
    let declared = include_str!("integration.rs");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
            continue;
        };
        let is_rust = path.extension().is_some_and(|e| e == "rs");
        if is_rust && stem != "integration" && !declared.contains(&format!("\nmod {stem};\n")) {
            missing.push(stem);
        }
    }
    assert!(missing.is_empty(), "not declared in tests/integration.rs: {missing:?}");
}
