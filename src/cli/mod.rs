//! The command line: one file per verb. Exit codes are mapped here and nowhere else.
//!
//! Architecture Invariant: only cli/ prints; every other module returns values and
//! diagnostics.

mod graph;
mod index;
mod render;
mod run;
mod schema;
mod store;
mod test;
mod threads;
mod validate;

pub use run::parse_kv;
pub use validate::workflow_files;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit codes, documented in README.md.
pub mod exit {
    /// Success: the workflow is valid / the run finished.
    pub const OK: u8 = 0;
    /// The input is invalid (validation errors) or the run failed.
    pub const INVALID: u8 = 1;
    /// Usage or I/O error: bad arguments, unreadable files, input that does not fit.
    pub const USAGE: u8 = 2;
    /// The run stopped at an interrupt and waits for an answer (`runner resume`).
    pub const INTERRUPTED: u8 = 3;
    /// Ctrl-C: the run stopped at a step boundary; the thread is resumable.
    pub const CANCELLED: u8 = 130;
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
    Run(run::RunArgs),
    Resume(run::ResumeArgs),
    Validate(validate::Args),
    Graph(graph::Args),
    Threads(threads::ThreadsArgs),
    History(threads::HistoryArgs),
    State(threads::StateArgs),
    Fork(threads::ForkArgs),
    Schema(schema::Args),
    Test(test::Args),
    Index(index::Args),
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
        Command::Run(args) => run::run(args),
        Command::Resume(args) => run::resume(args),
        Command::Threads(args) => threads::threads(args),
        Command::History(args) => threads::history(args),
        Command::State(args) => threads::state(args),
        Command::Fork(args) => threads::fork(args),
        Command::Validate(args) => validate::run(args),
        Command::Graph(args) => graph::run(args),
        Command::Schema(args) => schema::run(args),
        Command::Test(args) => test::run(args),
        Command::Index(args) => index::run(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        // A reader that stopped reading (`runner history | head`) is not an error.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::from(exit::OK)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit::USAGE)
        }
    }
}

/// A result as JSON (pretty) or YAML, with a trailing newline.
fn format_value(value: &serde_json::Value, format: run::OutputFormat) -> String {
    match format {
        run::OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
            s.push('\n');
            s
        }
        run::OutputFormat::Yaml => {
            let mut s = String::new();
            yaml(value, 0, &mut s);
            if !s.ends_with('\n') {
                s.push('\n');
            }
            s
        }
    }
}

/// A small YAML emitter for results: block style, strings quoted when plain would mislead.
fn yaml(v: &serde_json::Value, indent: usize, out: &mut String) {
    use serde_json::Value;
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                out.push_str(&format!("{pad}{}:", yaml_scalar(k)));
                yaml_child(v, indent, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for v in a {
                out.push_str(&format!("{pad}-"));
                yaml_child(v, indent, out);
            }
        }
        Value::Object(_) => out.push_str(&format!("{pad}{{}}\n")),
        Value::Array(_) => out.push_str(&format!("{pad}[]\n")),
        Value::String(s) => out.push_str(&format!("{pad}{}\n", yaml_scalar(s))),
        other => out.push_str(&format!("{pad}{other}\n")),
    }
}

fn yaml_child(v: &serde_json::Value, indent: usize, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            yaml(v, indent + 2, out);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            yaml(v, indent + 2, out);
        }
        Value::String(s) if s.contains('\n') => {
            out.push_str(" |-\n");
            for line in s.lines() {
                out.push_str(&format!("{}{line}\n", " ".repeat(indent + 2)));
            }
        }
        Value::Object(_) => out.push_str(" {}\n"),
        Value::Array(_) => out.push_str(" []\n"),
        Value::String(s) => out.push_str(&format!(" {}\n", yaml_scalar(s))),
        other => out.push_str(&format!(" {other}\n")),
    }
}

fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars().all(|c| c.is_alphanumeric() || " _-./".contains(c))
        && !s.starts_with(|c: char| c == '-' || c == ' ' || c.is_ascii_digit() || c == '.')
        && !s.ends_with(' ')
        && !["true", "false", "null", "yes", "no", "on", "off", "~"].contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_string()
    } else {
        serde_json::Value::String(s.to_string()).to_string()
    }
}
