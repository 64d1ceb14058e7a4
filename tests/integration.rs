//! The integration tests, one module per file of `tests/`, linked into one test binary: each
//! test binary links the whole crate, so one binary instead of one per file is most of the
//! time a cold build of the suite saves. Select a file's tests by its module,
//! e.g. `cargo test --test integration engine::`.
//!
//! The tests of every file run in parallel threads of one process: none may change
//! process-wide state (environment variables, the current directory); child processes get
//! their environment and directory through `Command`.

mod support;

mod build;
mod cassette;
mod checkpoint;
mod cli;
mod cli_run;
mod compile;
mod crash;
mod engine;
mod invalid;
mod loader_props;
mod props;
mod providers;
mod rag;
mod runner_test;
mod web;
mod workflows;
