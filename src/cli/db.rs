//! `runner db`: the checkpoint database backed up while it is in use, migrated, pruned.

use std::path::PathBuf;

use anyhow::bail;

use super::threads::Db;
use super::{exit, store};
use crate::run::Checkpoints;

/// Look after the checkpoint database.
///
/// Example: runner db backup backups/runner-$(date +%F).db
/// Example: runner db migrate --db postgres://runner@db/runner
#[derive(clap::Args, Debug)]
pub(super) struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Write a consistent copy of the checkpoint database to PATH, a new file, while runs and
    /// servers may be using it: every commit (those still in its `-wal` included), compacted,
    /// one file. Restore by pointing `--db` at the copy (or copying it back while nothing
    /// has the database open).
    Backup {
        /// The new file (refused if it exists).
        path: PathBuf,
        #[command(flatten)]
        db: Db,
    },
    /// Create the checkpoint database's tables, or bring them to this runner's version (every
    /// open does it too; run it first in a deployment that gives servers no right to change
    /// the schema). A PostgreSQL database gets a schema of runner's own (`runner`, or the URL's
    /// `schema` parameter); many processes migrating at once migrate once. The data store's
    /// tables too, when it is on PostgreSQL (`RUNNER_DATA_DB`, or the same database), with the
    /// pgvector extension where the server has it.
    Migrate {
        #[command(flatten)]
        db: Db,
    },
    /// Delete the threads not updated for longer than `--older-than` (e.g. `30d`, `12h`, `90m`)
    /// — each with its subgraphs' threads, checkpoints, writes, long strings, runs and their
    /// event logs, and the API's record of it — and, without `--status`, the finished runs as
    /// old with their event logs. Each thread is removed under its lease, in one transaction on
    /// PostgreSQL: one a live lease or an active run holds is kept, and named on stderr. Prints
    /// each removed thread's id on stdout. `runner threads prune` is the same command.
    Prune {
        #[arg(long, value_name = "DURATION")]
        older_than: String,
        /// Only threads of this status: done, failed, interrupted, running, cut-off, idle (made
        /// through the API, never run).
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        db: Db,
    },
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    match args.action {
        Action::Prune { older_than, status, db } => {
            super::threads::prune_db(db.db.as_deref(), &older_than, status.as_deref())
        }
        Action::Backup { path, db } => {
            let at = store::checkpoints(db.db.as_deref())?;
            let file = match &at.value {
                Checkpoints::Sqlite(file) => file,
                Checkpoints::Postgres(url) => {
                    let schema = crate::checkpoint::postgres::PostgresCheckpointer::schema_of(url)
                        .map_err(|e| anyhow::anyhow!(e))?;
                    bail!(
                        "{}: `{}` is a PostgreSQL database, which PostgreSQL's own tools back up: \
                         `pg_dump --schema={schema} --format=custom --file=PATH` with the same URL (its runs \
                         may go on meanwhile), or the server's backups; `runner db backup` copies a SQLite file",
                        at.source,
                        at.value
                    );
                }
                Checkpoints::Memory | Checkpoints::Scratch => {
                    bail!("{}: `{}` keeps nothing to back up", at.source, at.value)
                }
            };
            crate::checkpoint::sqlite::backup(file, &path)
                .map_err(|e| anyhow::anyhow!("cannot back up {}{}: {e}", file.display(), from(&at.source)))?;
            eprintln!("backed up {} to {}", file.display(), path.display());
            Ok(exit::OK)
        }
        Action::Migrate { db } => {
            let at = store::checkpoints(db.db.as_deref())?;
            match &at.value {
                Checkpoints::Postgres(url) => {
                    let store = crate::checkpoint::postgres::PostgresCheckpointer::open(url, Default::default())
                        .map_err(|e| anyhow::anyhow!("cannot migrate {}{}: {e}", at.value, from(&at.source)))?;
                    let (was, now) = store.migrated();
                    let schema = store.display();
                    if was == now {
                        eprintln!("{schema} is at schema version {now}: nothing to do");
                    } else {
                        eprintln!("{schema} migrated from schema version {was} to {now}");
                    }
                    migrate_data(&at)?;
                }
                Checkpoints::Sqlite(_) => {
                    at.open(Default::default())?;
                    eprintln!(
                        "{} is at schema version {}",
                        at.value,
                        crate::checkpoint::sqlite::SCHEMA_VERSION
                    );
                }
                Checkpoints::Memory | Checkpoints::Scratch => {
                    bail!("{}: `{}` keeps nothing to migrate", at.source, at.value)
                }
            }
            Ok(exit::OK)
        }
    }
}

/// Migrates the data store when it is on PostgreSQL: `RUNNER_DATA_DB`, else the checkpoint
/// database `db` (a data store in a file is made by its first use).
fn migrate_data(db: &crate::run::Setting<Checkpoints>) -> anyhow::Result<()> {
    let (env, _) = super::project_env()?;
    let at = crate::run::data_location(None, db, &env)?;
    if !matches!(at.value, crate::rag::Location::Postgres(_)) {
        return Ok(());
    }
    let store = crate::rag::DataStore::new(at.value.clone());
    let described = store
        .open_now()
        .map_err(|e| anyhow::anyhow!("cannot migrate the data store{}: {e}", from(&at.source)))?;
    let (was, now) = described.migrated;
    let vectors = described.vectors;
    if was == now {
        eprintln!(
            "data store {} is at schema version {now} (vectors: {vectors}): nothing to do",
            described.at
        );
    } else {
        eprintln!(
            "data store {} migrated from schema version {was} to {now} (vectors: {vectors})",
            described.at
        );
    }
    Ok(())
}

/// " (from RUNNER_DB …)": where the database was named, unless it is the default.
fn from(source: &crate::run::Source) -> String {
    match source {
        crate::run::Source::Default => String::new(),
        source => format!(" (from {source})"),
    }
}
