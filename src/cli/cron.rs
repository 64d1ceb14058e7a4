//! `runner cron`: the schedules (LangGraph's crons) kept in the checkpoint database, added,
//! listed and deleted without a server, through the same cron service the API uses. A server
//! on the database fires them.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use super::threads::{Db, ListFormat};
use super::{exit, store};

/// Add, list or delete schedules: runs that `runner serve` (or `runner worker`) starts by
/// itself on a cron schedule.
///
/// Example: runner cron add research --schedule "0 9 * * 1" --timezone Europe/Paris --input query="weekly digest"
#[derive(clap::Args, Debug)]
pub(super) struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Schedule runs of a served graph: each tick of SCHEDULE starts one run, on `--thread`
    /// or on a thread of its own. Prints the cron's id.
    Add(Box<AddArgs>),
    /// Show the schedules: id, schedule, graph, thread, next run.
    List {
        /// `text` (a line per cron) or `json` (the API's cron objects, for scripts).
        #[arg(long, value_enum, default_value_t)]
        format: ListFormat,
        #[command(flatten)]
        db: Db,
    },
    /// Delete a schedule by its id.
    Delete {
        cron_id: String,
        #[command(flatten)]
        db: Db,
    },
}

/// What `runner cron add` takes.
#[derive(clap::Args, Debug)]
struct AddArgs {
    /// The graph (a workflow's file stem under the served folder) or its assistant id.
    graph: String,
    /// The cron expression: minute hour day-of-month month day-of-week (`0 9 * * 1`:
    /// Mondays at 09:00).
    #[arg(long)]
    schedule: String,
    /// The IANA time zone the schedule is read in (default UTC).
    #[arg(long, value_name = "ZONE")]
    timezone: Option<String>,
    /// An input field, KEY=VALUE (repeatable; VALUE is JSON when it parses as JSON).
    #[arg(long = "input", value_name = "KEY=VALUE")]
    input: Vec<String>,
    /// A config value of the workflow for these runs, KEY=VALUE (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// A metadata field of the cron and its runs, KEY=VALUE (repeatable).
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    metadata: Vec<String>,
    /// Continue this thread with every run (created by the first run if missing);
    /// without it each run has a thread of its own.
    #[arg(long, value_name = "ID")]
    thread: Option<String>,
    /// Keep each run's own thread (without `--thread`): by default it is deleted when the
    /// run ends.
    #[arg(long, conflicts_with = "thread")]
    keep: bool,
    /// When the schedule stops: an RFC 3339 time (`2031-01-01T00:00:00Z`).
    #[arg(long, value_name = "TIME")]
    end_time: Option<String>,
    /// A URL called with each run when it ends.
    #[arg(long, value_name = "URL")]
    webhook: Option<String>,
    /// The folder of served workflows the graph is found in.
    #[arg(long, value_name = "DIR", default_value = "workflows")]
    workflows: PathBuf,
    #[command(flatten)]
    db: Db,
}

fn pairs(items: &[String]) -> anyhow::Result<Map<String, Value>> {
    items.iter().map(|kv| super::run::parse_kv(kv)).collect()
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    match args.action {
        Action::Add(add) => {
            let AddArgs {
                graph,
                schedule,
                timezone,
                input,
                set,
                metadata,
                thread,
                keep,
                end_time,
                webhook,
                workflows,
                db,
            } = *add;
            let (graphs, _) = crate::server::load(&workflows)
                .with_context(|| format!("cannot read the folder {}", workflows.display()))?;
            let mut body = Map::from_iter([
                ("assistant_id".to_string(), json!(graph)),
                ("schedule".into(), json!(schedule)),
            ]);
            if let Some(tz) = timezone {
                body.insert("timezone".into(), json!(tz));
            }
            if !input.is_empty() {
                body.insert("input".into(), Value::Object(pairs(&input)?));
            }
            if !set.is_empty() {
                body.insert("config".into(), json!({"configurable": pairs(&set)?}));
            }
            if !metadata.is_empty() {
                body.insert("metadata".into(), Value::Object(pairs(&metadata)?));
            }
            if thread.is_some() {
                body.insert("if_not_exists".into(), json!("create"));
            } else {
                body.insert("on_run_completed".into(), json!(if keep { "keep" } else { "delete" }));
            }
            if let Some(t) = end_time {
                body.insert("end_time".into(), json!(t));
            }
            if let Some(url) = webhook {
                body.insert("webhook".into(), json!(url));
            }
            let store = store::open(db.db.as_deref())?;
            if let Some(t) = &thread
                && store.get_thread_meta(t)?.is_none()
                && store.get_thread(t)?.is_none()
            {
                // The API's record of the thread, so that the cron (and its first run) finds it.
                let now = crate::clock::now();
                store.create_thread_meta(&crate::checkpoint::ThreadMeta {
                    thread_id: t.clone(),
                    created_at: now.clone(),
                    updated_at: now,
                    metadata: json!({}),
                    ttl: None,
                })?;
            }
            let now = crate::clock::now_ms();
            let cron = match crate::server::cron_create(&graphs, &*store, now, thread.as_deref(), Value::Object(body)) {
                Ok(c) => c,
                Err(e) => bail!("{e}"),
            };
            let next = cron.next_run_at.map_or_else(|| "never".into(), crate::clock::at_ms);
            println!("{}", cron.cron_id);
            eprintln!("scheduled `{}` ({}): next run {next}", cron.schedule, graph);
        }
        Action::List { format, db } => {
            let store = store::open(db.db.as_deref())?;
            let crons = store.list_crons()?;
            let mut out = std::io::stdout().lock();
            match format {
                ListFormat::Json => {
                    let all: Vec<Value> = crons.iter().map(crate::server::cron_json).collect();
                    writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
                }
                ListFormat::Text => {
                    for c in &crons {
                        let zone = c.timezone.as_deref().unwrap_or("UTC");
                        let next = match (c.enabled, c.next_run_at) {
                            (false, _) => "disabled".to_string(),
                            (true, None) => "no tick left".into(),
                            (true, Some(at)) if c.end_ms.is_some_and(|e| at >= e) => "ended".into(),
                            (true, Some(at)) => format!("next {}", crate::clock::at_ms(at)),
                        };
                        let on = c
                            .thread_id
                            .as_ref()
                            .map_or_else(|| "a thread of its own".to_string(), |t| format!("thread {t}"));
                        let graph = c
                            .payload
                            .get("assistant_id")
                            .and_then(Value::as_str)
                            .unwrap_or(&c.assistant_id);
                        writeln!(out, "{}\t{}\t{zone}\t{graph}\t{on}\t{next}", c.cron_id, c.schedule)?;
                    }
                }
            }
        }
        Action::Delete { cron_id, db } => {
            let store = store::open(db.db.as_deref())?;
            if !store.delete_cron(&cron_id)? {
                eprintln!("no cron {cron_id}");
                return Ok(exit::INVALID);
            }
            eprintln!("deleted cron {cron_id}");
        }
    }
    Ok(exit::OK)
}
