//! `runner db`: the checkpoint database as a file, backed up while it is in use.

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
    /// `schema` parameter); many processes migrating at once migrate once.
    Migrate {
        #[command(flatten)]
        db: Db,
    },
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    match args.action {
        Action::Backup { path, db } => {
            let at = store::checkpoints(db.db.as_deref())?;
            let Checkpoints::Sqlite(file) = &at.value else {
                bail!("{}: `{}` keeps nothing to back up", at.source, at.value);
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

/// " (from RUNNER_DB …)": where the database was named, unless it is the default.
fn from(source: &crate::run::Source) -> String {
    match source {
        crate::run::Source::Default => String::new(),
        source => format!(" (from {source})"),
    }
}
