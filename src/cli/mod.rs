//! The command line: one file per verb. Exit codes are mapped here and nowhere else.
//!
//! Architecture Invariant: only cli/ prints; every other module returns values and
//! diagnostics.

mod cache;
mod completions;
mod cron;
mod db;
mod dev;
mod graph;
mod index;
mod man;
mod mcp;
mod new;
mod render;
mod run;
mod schema;
mod serve;
mod store;
mod test;
mod threads;
mod users;
mod validate;
mod verdicts;

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
    Serve(serve::Args),
    Dev(serve::DevArgs),
    Worker(serve::WorkerArgs),
    Mcp(mcp::Args),
    Cache(cache::Args),
    Cron(cron::Args),
    Db(db::Args),
    Users(users::Args),
    /// Print the shell completion script (e.g. `runner completions bash > /etc/bash_completion.d/runner`).
    Completions(completions::Args),
    /// Scaffold a workflow with its prompt, a test case and a mock script.
    New(new::Args),
    /// Print runner's manual page (`runner man > runner.1`), or every command's with `--dir`.
    Man(man::Args),
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
    // A server logs its requests unless told otherwise; the other verbs log only when asked.
    let default_log =
        matches!(cli.command, Command::Serve(_) | Command::Dev(_) | Command::Worker(_)).then_some("runner=info");
    // Logs, traces and the verdict cache read the environment the run reads, a project's
    // `.env` and `runner.toml` included; a project that cannot be read is reported by the
    // verbs that need it, and these fall back to the process's own.
    let env = project_env().map_or_else(|_| crate::run::Env::process(), |(env, _)| env);
    let (telemetry, warnings) = crate::telemetry::init(&|name| env.get(name), default_log);
    for w in warnings {
        eprintln!("warning: {w}");
    }
    crate::compile::verdicts::enable(
        crate::run::cache_dir(&env)
            .and_then(verdicts::Files::for_this_executable)
            .map(|f| Box::new(f) as Box<dyn crate::compile::verdicts::VerdictStore>),
    );
    drop(env);
    let code = dispatch(cli.command);
    // Spans still buffered are exported on every exit, an error's included.
    if let Err(e) = telemetry.shutdown() {
        eprintln!("warning: traces: {e}");
    }
    code
}

fn dispatch(command: Command) -> ExitCode {
    let result = match command {
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
        Command::Serve(args) => serve::run(args),
        Command::Dev(args) => serve::dev(args),
        Command::Worker(args) => serve::work(args),
        Command::Mcp(args) => mcp::run(args),
        Command::Cache(args) => cache::run(args),
        Command::Cron(args) => cron::run(args),
        Command::Db(args) => db::run(args),
        Command::Users(args) => users::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Man(args) => man::run(args),
        Command::New(args) => new::run(args),
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
        run::OutputFormat::Yaml => yaml(value),
    }
}

/// A result as YAML, by saphyr's emitter: block style, strings quoted where plain would read
/// as something else, multi-line strings as literal blocks (with an indentation indicator when
/// they start with a space, and chomping that keeps their trailing newlines).
fn yaml(value: &serde_json::Value) -> String {
    let mut out = String::new();
    let mut emitter = saphyr::YamlEmitter::new(&mut out);
    emitter.multiline(true);
    if emitter.dump(&to_yaml(value)).is_err() {
        // Writing into a String cannot fail; fall back to JSON, which is YAML too.
        return format!("{value}\n");
    }
    // The emitter starts a document with `---`; one result needs no marker.
    let mut out = match out.strip_prefix("---\n") {
        Some(rest) => rest.to_string(),
        None => out.strip_prefix("--- ").map_or(out.clone(), str::to_string),
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn to_yaml(v: &serde_json::Value) -> saphyr::Yaml<'_> {
    use saphyr::{Scalar, Yaml};
    use serde_json::Value;
    match v {
        Value::Null => Yaml::Value(Scalar::Null),
        Value::Bool(b) => Yaml::Value(Scalar::Boolean(*b)),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Yaml::Value(Scalar::Integer(i)),
            // JSON's own text for other numbers is a valid YAML number and loses nothing.
            None => Yaml::Representation(n.to_string().into(), saphyr::ScalarStyle::Plain, None),
        },
        Value::String(s) => Yaml::Value(Scalar::String(s.as_str().into())),
        Value::Array(items) => Yaml::Sequence(items.iter().map(to_yaml).collect()),
        Value::Object(map) => Yaml::Mapping(
            map.iter()
                .map(|(k, v)| (Yaml::Value(Scalar::String(k.as_str().into())), to_yaml(v)))
                .collect(),
        ),
    }
}

/// The human diagnostic format for `stream`: coloured when it is a terminal and colour is not
/// turned off (`NO_COLOR`, `CLICOLOR=0`; `CLICOLOR_FORCE` turns it on).
fn human_format<S: anstream::stream::RawStream>(stream: &S) -> crate::diag::Format {
    match anstream::AutoStream::choice(stream) {
        anstream::ColorChoice::Never => crate::diag::Format::Human,
        _ => crate::diag::Format::HumanColor,
    }
}

/// The process's environment filled in by the project's `runner.toml` and `.env` (found from
/// the current directory), and the project's model overrides: the one environment every verb
/// reads its settings from, read once per process.
fn project_env() -> anyhow::Result<(crate::run::Env, Vec<String>)> {
    static PROJECT: std::sync::OnceLock<Result<(crate::run::Env, Vec<String>), String>> = std::sync::OnceLock::new();
    let read = || -> anyhow::Result<(crate::run::Env, Vec<String>)> {
        let cwd = std::env::current_dir()?;
        let project = crate::run::Project::discover(&cwd)?;
        Ok((project.fill(crate::run::Env::process()), project.models))
    };
    PROJECT
        .get_or_init(|| read().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The project's `[serve]` table (from the `runner.toml` found from the current directory):
/// how `runner serve` knows its callers and what they may spend.
fn project_serve() -> anyhow::Result<(crate::run::ServeFile, Option<std::path::PathBuf>)> {
    let project = crate::run::Project::discover(&std::env::current_dir()?)?;
    Ok((project.serve, project.file))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;

    /// Reads YAML back the way runner reads workflows.
    fn parse_back(text: &str) -> Value {
        let file = crate::spec::load::SourceFile {
            path: Arc::from(Path::new("out.yaml")),
            text: Arc::from(text),
        };
        match crate::spec::load::parse(file) {
            Ok(doc) => doc.value,
            Err(d) => panic!("the YAML output does not parse: {d:?}\n{text}"),
        }
    }

    #[test]
    fn yaml_output_round_trips_tricky_strings() {
        let strings = [
            "  indented first line\nsecond",
            "\tstarts with a tab\nsecond",
            "trailing newline\n",
            "two trailing newlines\n\n",
            "\n\nleading newlines",
            "   ",
            "",
            "---",
            "...",
            "--- a\n--- b\n",
            "...\nafter the end marker",
            "- dash",
            "key: value",
            "# not a comment",
            "yes",
            "null",
            "~",
            "0x1F",
            "1e3",
            "012",
            "'single' and \"double\"",
            "emoji 🎉 and ünïcode",
            "carriage\r\nreturn",
            "trailing space \nline",
            "line\u{2028}separator",
            "{{ not a mapping }}",
            "[1, 2]",
            "a: |\n  nested block\n",
        ];
        let value = json!({
            "strings": strings,
            "keyed": strings.iter().map(|s| (s.to_string(), json!(s))).collect::<serde_json::Map<_, _>>(),
            "numbers": [0, -1, 9007199254740993_i64, 0.1, -2.5e-8, 1e300],
            "nested": {"list": [[], {}, [{"a": "x\n"}], null, true]},
        });
        let text = yaml(&value);
        assert_eq!(parse_back(&text), value, "{text}");
        // Every string alone, as the whole output, too.
        for s in strings {
            let text = yaml(&json!(s));
            assert_eq!(parse_back(&text), json!(s), "{s:?} as {text:?}");
        }
    }

    /// No flag is filled from an environment variable by clap: the settings read every
    /// variable (with a project's files), so a bad value is named as the variable and the
    /// file that set it, never as the flag.
    #[test]
    fn no_flag_is_filled_from_the_environment_by_clap() {
        fn walk(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_arguments() {
                assert!(
                    arg.get_env().is_none(),
                    "`{path} --{}` reads {:?} through clap",
                    arg.get_id(),
                    arg.get_env()
                );
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        walk(&<Cli as clap::CommandFactory>::command(), "runner");
    }

    #[test]
    fn yaml_output_keeps_the_familiar_block_shape() {
        let value = json!({"draft": "second draft", "log": ["write", "accept"], "text": "a\nb\n"});
        assert_eq!(
            yaml(&value),
            "draft: second draft\nlog:\n  - write\n  - accept\ntext: |\n  a\n  b\n"
        );
    }
}
