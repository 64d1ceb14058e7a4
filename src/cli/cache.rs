//! `runner cache`: the node cache (results of nodes with `cache:`) kept in the checkpoint
//! database, listed and cleared.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde_json::json;

use super::threads::{Db, ListFormat};
use super::{exit, store};

/// List or clear the cached results of nodes with `cache:`.
///
/// Results are kept in the checkpoint database by workflow name and node, and reused by any
/// thread of the workflow until their `ttl` runs out or they are cleared.
///
/// Example: runner cache clear workflows/research.yaml --node summarize
#[derive(clap::Args, Debug)]
pub(super) struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Delete cached results: every workflow's, or WORKFLOW's (a workflow file, or the name
    /// its `name:` gives), of every node or of `--node`.
    Clear {
        /// A workflow file or a workflow's name (default: every workflow).
        workflow: Option<String>,
        /// Only this node's results.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        #[command(flatten)]
        db: Db,
    },
    /// Show the cached results: per workflow and node, how many, their size, and when the
    /// first of them expires.
    List {
        /// A workflow file or a workflow's name (default: every workflow).
        workflow: Option<String>,
        /// `text` (a line per node) or `json` (an array of objects, for scripts).
        #[arg(long, value_enum, default_value_t)]
        format: ListFormat,
        #[command(flatten)]
        db: Db,
    },
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    let now = crate::clock::now_ms();
    match args.action {
        Action::Clear { workflow, node, db } => {
            let workflow = workflow.as_deref().map(workflow_name).transpose()?;
            let store = store::open(db.db.as_deref())?;
            let n = store.cache_clear(workflow.as_deref(), node.as_deref(), now)?;
            let what = match (&workflow, &node) {
                (Some(w), Some(n)) => format!(" of `{w}`'s node `{n}`"),
                (Some(w), None) => format!(" of `{w}`"),
                (None, Some(n)) => format!(" of nodes named `{n}`"),
                (None, None) => String::new(),
            };
            eprintln!("cleared {n} cached result{}{what}", if n == 1 { "" } else { "s" });
        }
        Action::List { workflow, format, db } => {
            let workflow = workflow.as_deref().map(workflow_name).transpose()?;
            let store = store::open_read_only(db.db.as_deref())?;
            let mut rows: Vec<(String, String, u64, u64, Option<i64>)> = Vec::new();
            for e in store.cache_list(now)? {
                if workflow.as_ref().is_some_and(|w| *w != e.workflow) {
                    continue;
                }
                match rows.last_mut() {
                    Some(last) if last.0 == e.workflow && last.1 == e.node => {
                        last.2 += 1;
                        last.3 += e.bytes;
                        last.4 = earliest(last.4, e.expires_at_ms);
                    }
                    _ => rows.push((e.workflow, e.node, 1, e.bytes, e.expires_at_ms)),
                }
            }
            let mut out = std::io::stdout().lock();
            match format {
                ListFormat::Json => {
                    let rows: Vec<_> = rows
                        .iter()
                        .map(|(w, n, entries, bytes, expires)| {
                            json!({"workflow": w, "node": n, "entries": entries, "bytes": bytes,
                                   "first_expiry": expires.map(crate::clock::at_ms)})
                        })
                        .collect();
                    writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
                }
                ListFormat::Text => {
                    for (w, n, entries, bytes, expires) in &rows {
                        let expiry = expires.map_or_else(
                            || "never expires".to_string(),
                            |at| format!("first expires {}", crate::clock::at_ms(at)),
                        );
                        writeln!(out, "{w}\t{n}\t{entries} result(s)\t{bytes} bytes\t{expiry}")?;
                    }
                }
            }
        }
    }
    Ok(exit::OK)
}

/// The soonest of two expiries (`None`: never).
fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (one, other) => one.or(other),
    }
}

/// The workflow name an argument stands for: a workflow file's `name:`, or the argument itself.
fn workflow_name(arg: &str) -> anyhow::Result<String> {
    let path = Path::new(arg);
    if !path.is_file() {
        return Ok(arg.to_string());
    }
    let file = crate::spec::load::read(path).map_err(|d| anyhow::anyhow!("{}: {}", path.display(), d.message))?;
    let doc = crate::spec::load::parse(file).map_err(|d| {
        let why = d.first().map(|d| d.message.clone()).unwrap_or_default();
        anyhow::anyhow!("{}: {why}", path.display())
    })?;
    doc.value
        .get("name")
        .and_then(|n| n.as_str())
        .map(str::to_string)
        .with_context(|| format!("{} has no `name:`", path.display()))
}
