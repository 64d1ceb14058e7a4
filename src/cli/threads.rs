//! `runner threads`, `history`, `state` and `fork`: looking at threads and travelling in time.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::Value;

use super::run::{OutputFormat, parse_kv};
use super::{exit, store};
use crate::checkpoint;
use crate::engine::events::Events;
use crate::engine::{Engine, Services};

/// Where the threads are.
#[derive(clap::Args, Debug)]
pub(super) struct Db {
    /// The checkpoint database (default: $RUNNER_DB, else .runner/runner.db).
    // Not `env = …`: the variable is read with the project's, so an error names where it was set.
    #[arg(long)]
    pub(super) db: Option<PathBuf>,
}

/// List threads, most recently updated first: id, status, last update, workflow. A thread
/// whose run was cut off (killed, or its machine lost) shows as `cut-off`: resume it.
///
/// Example: runner threads
#[derive(clap::Args, Debug)]
pub(super) struct ThreadsArgs {
    #[command(subcommand)]
    action: Option<ThreadsAction>,
    /// `text` (a line each) or `json` (an array of objects, for scripts).
    #[arg(long, value_enum, default_value_t)]
    format: ListFormat,
    #[command(flatten)]
    db: Db,
}

#[derive(clap::Subcommand, Debug)]
enum ThreadsAction {
    /// Delete threads (and their subgraphs' threads) with every checkpoint. A thread a run
    /// holds is refused.
    Delete {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Delete the threads last updated longer ago than `--older-than` (e.g. `30d`, `12h`),
    /// optionally only those of a status, with their runs; threads a run holds are kept. The
    /// same as `runner db prune`.
    Prune {
        #[arg(long, value_name = "DURATION")]
        older_than: String,
        /// Only threads of this status: done, failed, interrupted, running, cut-off, idle.
        #[arg(long)]
        status: Option<String>,
    },
}

/// How a listing is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(super) enum ListFormat {
    #[default]
    Text,
    Json,
}

/// Show a thread's checkpoints, newest first: id, step, nodes that ran, keys changed, time.
///
/// Example: runner history --thread 0192f0c4-...
#[derive(clap::Args, Debug)]
pub(super) struct HistoryArgs {
    #[arg(long)]
    thread: String,
    /// `text` (a line each) or `json` (an array of objects, for scripts).
    #[arg(long, value_enum, default_value_t)]
    format: ListFormat,
    #[command(flatten)]
    db: Db,
}

/// Print a thread's state (at its latest checkpoint, or at `--checkpoint`).
///
/// Example: runner state --thread 0192f0c4-... --key final_report
#[derive(clap::Args, Debug)]
pub(super) struct StateArgs {
    #[arg(long)]
    thread: String,
    /// A checkpoint id from `runner history` (default: the latest).
    #[arg(long)]
    checkpoint: Option<String>,
    /// Print only this key.
    #[arg(long)]
    key: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    output: OutputFormat,
    #[command(flatten)]
    db: Db,
}

/// Start a new thread from any checkpoint of another (time travel), optionally editing state.
///
/// The new thread continues from that checkpoint with `runner resume --thread NEW`; the
/// original is unchanged. With `--as-node NODE` the edits are NODE's write, through the
/// reducers (a message is appended), and the thread goes on from what NODE's edges say
/// (LangGraph's `update_state(values, as_node)`); without it they replace the values outright.
///
/// Example: runner fork --thread T --checkpoint C --set 'messages="try again"' --as-node review --new-thread T2
#[derive(clap::Args, Debug)]
pub(super) struct ForkArgs {
    #[arg(long)]
    thread: String,
    /// The checkpoint to branch from (see `runner history`).
    #[arg(long)]
    checkpoint: String,
    /// A state edit: `key=json`.
    #[arg(long = "set", value_name = "KEY=JSON")]
    set: Vec<String>,
    /// Apply the edits as a write of this node, through the reducers, and continue from its
    /// edges (default: replace the values, keep the pending tasks).
    #[arg(long, value_name = "NODE")]
    as_node: Option<String>,
    /// The workflow whose reducers and edges apply (default: the one recorded with the thread).
    #[arg(long, value_name = "FILE")]
    workflow: Option<PathBuf>,
    /// The new thread's id (default: a new id).
    #[arg(long)]
    new_thread: Option<String>,
    #[command(flatten)]
    db: Db,
}

pub(super) fn threads(args: ThreadsArgs) -> anyhow::Result<u8> {
    match &args.action {
        None => {}
        Some(ThreadsAction::Delete { ids }) => return delete(&args, ids),
        Some(ThreadsAction::Prune { older_than, status }) => return prune(&args, older_than, status.as_deref()),
    }
    let store = store::open_read_only(args.db.db.as_deref())?;
    let mut out = std::io::stdout().lock();
    let now = crate::clock::now_ms();
    let mut listed = Vec::new();
    for t in store.list_thread_heads()? {
        let status = match t.status {
            // `running` is what the last run recorded; only a live lease says a run is on it.
            checkpoint::ThreadStatus::Running if !leased(&*store, &t.thread_id, now)? => "cut-off",
            other => other.as_str(),
        };
        match args.format {
            ListFormat::Text => writeln!(out, "{}  {:<11}  {}  {}", t.thread_id, status, t.updated_at, t.workflow)?,
            ListFormat::Json => listed.push(serde_json::json!({
                "thread_id": t.thread_id, "status": status, "updated_at": t.updated_at, "workflow": t.workflow,
            })),
        }
    }
    if args.format == ListFormat::Json {
        writeln!(out, "{}", Value::Array(listed))?;
    }
    Ok(exit::OK)
}

/// Deletes `ids`, each with the threads of its subgraphs (`<id>/…`), its runs and the API's
/// record of it, under its lease; one a run holds is refused before anything is deleted.
fn delete(args: &ThreadsArgs, ids: &[String]) -> anyhow::Result<u8> {
    let store = store::open(args.db.db.as_deref())?;
    let now = crate::clock::now_ms();
    let heads = store.list_thread_heads()?;
    for id in ids {
        if !heads.iter().any(|t| &t.thread_id == id) {
            bail!("thread `{id}` does not exist");
        }
        if leased(&*store, id, now)? {
            bail!("thread `{id}` is running: stop its run first");
        }
    }
    for id in ids {
        let claim = removal_claim(&*store, id)?;
        if let checkpoint::Removed::Busy(why) = store.remove_thread(id, &checkpoint::Removal::default(), &claim)? {
            bail!("thread `{id}` is running ({why}): stop its run first");
        }
    }
    Ok(exit::OK)
}

/// How long the lease a removal takes lasts: it is released when the removal is done.
const REMOVAL_LEASE: std::time::Duration = std::time::Duration::from_secs(30);

/// The claim a removal of thread `id` takes its lease with: one that replaces a holder known to
/// be gone (a run on this host whose process was killed), as a resume does, rather than wait
/// for its lease to expire.
fn removal_claim(store: &dyn checkpoint::Checkpointer, id: &str) -> anyhow::Result<checkpoint::LeaseClaim> {
    let mut claim = crate::engine::own_claim(REMOVAL_LEASE);
    claim.replace = store
        .lease(id)?
        .filter(crate::engine::holder_gone)
        .map(|held| held.owner);
    Ok(claim)
}

fn prune(args: &ThreadsArgs, older_than: &str, status: Option<&str>) -> anyhow::Result<u8> {
    prune_db(args.db.db.as_deref(), older_than, status)
}

/// `runner db prune` (and `runner threads prune`, the same): removes the threads not updated
/// for longer than `older_than` (of `status`, when given) — each with its subgraphs' threads,
/// checkpoints, values, writes and long strings, the API's record of it, its runs and their
/// event logs, its crons — under each thread's lease; a thread a live lease or an active run holds is
/// kept, and said so. Without `status`, the finished runs as old of the threads that stay go
/// too, with their event logs. Names each thread it removed on stdout; counts on stderr.
pub(super) fn prune_db(db: Option<&std::path::Path>, older_than: &str, status: Option<&str>) -> anyhow::Result<u8> {
    let age = crate::spec::Duration::Text(older_than.to_string())
        .to_std()
        .with_context(|| format!("--older-than: `{older_than}` is not a duration (e.g. `30d`, `12h`, `90m`)"))?;
    let store = store::open(db)?;
    let now = crate::clock::now_ms();
    let cutoff = crate::clock::at_ms(now - i64::try_from(age.as_millis()).unwrap_or(i64::MAX));
    let heads = store.list_thread_heads()?;
    // Threads the API made that never ran have no checkpoints: they are `idle`.
    let mut candidates: Vec<(String, &str)> = heads
        .iter()
        // A subgraph's thread goes with its parent.
        .filter(|t| !t.thread_id.contains('/') && t.updated_at < cutoff)
        .map(|t| {
            let shown = match t.status {
                checkpoint::ThreadStatus::Running => "cut-off",
                other => other.as_str(),
            };
            (t.thread_id.clone(), shown)
        })
        .collect();
    for meta in store.list_thread_meta()? {
        if meta.updated_at < cutoff && !heads.iter().any(|t| t.thread_id == meta.thread_id) {
            candidates.push((meta.thread_id, "idle"));
        }
    }
    let removal = checkpoint::Removal {
        expired_by: None,
        idle_before: Some(cutoff.clone()),
    };
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    let (mut removed, mut kept) = (0usize, 0usize);
    for (id, shown) in candidates {
        if status.is_some_and(|s| s != shown) {
            continue;
        }
        match store.remove_thread(&id, &removal, &removal_claim(&*store, &id)?)? {
            checkpoint::Removed::Removed => {
                removed += 1;
                writeln!(out, "{id}")?;
            }
            checkpoint::Removed::Busy(why) => {
                kept += 1;
                writeln!(err, "kept {id}: in use ({why})")?;
            }
            checkpoint::Removed::Missing | checkpoint::Removed::Kept => {}
        }
    }
    let mut runs = 0usize;
    if status.is_none() {
        for run in store.list_runs(None, &[])? {
            if !run.status.is_active() && run.updated_at < cutoff && store.delete_run(&run.run_id)? {
                runs += 1;
            }
        }
    }
    writeln!(
        err,
        "pruned {removed} thread{} and {runs} finished run{} not updated since {cutoff}{}",
        if removed == 1 { "" } else { "s" },
        if runs == 1 { "" } else { "s" },
        if kept > 0 {
            format!("; kept {kept} in use")
        } else {
            String::new()
        }
    )?;
    Ok(exit::OK)
}

/// Whether a live lease whose process may still run covers the thread: its own, or (a subgraph's child thread,
/// `<parent>/<step>/<task>`) that of a thread it is nested in.
fn leased(store: &dyn checkpoint::Checkpointer, thread_id: &str, now: i64) -> anyhow::Result<bool> {
    let mut id = thread_id;
    loop {
        if store
            .lease(id)?
            .is_some_and(|l| l.is_live(now) && !crate::engine::holder_gone(&l))
        {
            return Ok(true);
        }
        match id.rsplit_once('/') {
            Some((parent, _)) => id = parent,
            None => return Ok(false),
        }
    }
}

pub(super) fn history(args: HistoryArgs) -> anyhow::Result<u8> {
    let store = store::open_read_only(args.db.db.as_deref())?;
    if store.get_thread(&args.thread)?.is_none() {
        bail!("thread `{}` does not exist", args.thread);
    }
    let mut out = std::io::stdout().lock();
    if args.format == ListFormat::Json {
        let listed: Vec<Value> = store
            .history(&args.thread)?
            .into_iter()
            .map(|cp| {
                serde_json::json!({
                    "checkpoint_id": cp.checkpoint_id,
                    "parent_id": cp.parent_id,
                    "step": cp.step,
                    "ran": cp.ran,
                    "changed": cp.changed,
                    "next": cp.next.iter().map(|t| crate::engine::task_label(&cp.next, t)).collect::<Vec<_>>(),
                    "tasks": cp.next.iter().map(|t| &t.task_id).collect::<Vec<_>>(),
                    "created_at": cp.created_at,
                })
            })
            .collect();
        writeln!(out, "{}", Value::Array(listed))?;
        return Ok(exit::OK);
    }
    for cp in store.history(&args.thread)? {
        writeln!(
            out,
            "{}  step {:>4}  ran [{}]  changed [{}]  next [{}]  {}",
            cp.checkpoint_id,
            cp.step,
            cp.ran.join(", "),
            cp.changed.join(", "),
            cp.next
                .iter()
                .map(|t| crate::engine::task_label(&cp.next, t))
                .collect::<Vec<_>>()
                .join(", "),
            cp.created_at
        )?;
    }
    Ok(exit::OK)
}

pub(super) fn state(args: StateArgs) -> anyhow::Result<u8> {
    let store = store::open_read_only(args.db.db.as_deref())?;
    let cp = store
        .get_checkpoint(&args.thread, args.checkpoint.as_deref())?
        .with_context(|| format!("thread `{}` has no such checkpoint", args.thread))?;
    // One key is read alone: a large value elsewhere in the state is never loaded.
    let value = match &args.key {
        Some(k) => {
            let version = cp
                .versions
                .get(k)
                .with_context(|| format!("the state has no key `{k}`"))?;
            store.value(&args.thread, k, *version)?
        }
        None => Value::Object(store.state(&args.thread, &cp.versions)?),
    };
    std::io::stdout()
        .lock()
        .write_all(super::format_value(&value, args.output).as_bytes())?;
    Ok(exit::OK)
}

pub(super) fn fork(args: ForkArgs) -> anyhow::Result<u8> {
    let store = store::open(args.db.db.as_deref())?;
    let new = args.new_thread.clone().unwrap_or_else(checkpoint::new_id);
    store.fork(&args.thread, &args.checkpoint, &new)?;
    if !args.set.is_empty() || args.as_node.is_some() {
        // Edits become a checkpoint of their own on the new thread, on top of the copy, so the
        // history shows them; a fork whose edit fails is removed.
        if let Err(e) = edit(&args, &store, &new) {
            store.delete_thread(&new)?;
            return Err(e);
        }
    }
    eprintln!(
        "forked {} at {} into {new}; continue it with `runner resume --thread {new}`",
        args.thread, args.checkpoint
    );
    writeln!(std::io::stdout().lock(), "{new}")?;
    Ok(exit::OK)
}

/// Applies a fork's edits through the engine, with the workflow's reducers and edges.
fn edit(args: &ForkArgs, store: &Arc<dyn checkpoint::Checkpointer>, thread_id: &str) -> anyhow::Result<()> {
    let values = args
        .set
        .iter()
        .map(|kv| parse_kv(kv))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let recorded = store
        .get_thread(thread_id)?
        .map(|t| PathBuf::from(t.workflow))
        .unwrap_or_default();
    let workflow = args.workflow.clone().unwrap_or(recorded);
    let Some(plan) = super::run::compile(&workflow)? else {
        bail!("the workflow {} is not valid", workflow.display());
    };
    // An edit runs no node: it needs the kinds (to know the nodes' edges), not the run's
    // providers, keys or stores, so no run is assembled for it.
    let engine = Engine::new(plan, store.clone(), Services::default(), Events::none());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(engine.update_state(thread_id, values, args.as_node.as_deref()))?;
    Ok(())
}
