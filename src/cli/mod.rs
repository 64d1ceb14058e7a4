//! The command line: one file per verb. Exit codes are mapped here and nowhere else.
//!
//! Architecture Invariant: only cli/ prints; every other module returns values and
//! diagnostics.

mod graph;
mod schema;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit codes, documented in README.md.
pub mod exit {
    /// Success: the workflow is valid / the run finished.
    pub const OK: u8 = 0;
    /// The input is invalid (validation errors) or the run failed.
    pub const INVALID: u8 = 1;
    /// Usage or I/O error: bad arguments, unreadable files.
    pub const USAGE: u8 = 2;
}

#[derive(Parser)]
#[command(name = "runner", version, about = "Run LLM agent graphs written as data.", long_about = None)]
#[command(propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Validate(validate::Args),
    Graph(graph::Args),
    Schema(schema::Args),
}

/// Runs the CLI and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { exit::OK };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Validate(args) => validate::run(args),
        Command::Graph(args) => graph::run(args),
        Command::Schema(args) => schema::run(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit::USAGE)
        }
    }
}
