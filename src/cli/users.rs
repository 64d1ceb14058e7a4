//! `runner users`: the per-user API keys `runner serve` accepts (with `user_keys = true` in
//! `[serve.auth]`, or `--user-keys`), stored hashed in the checkpoint database.

use anyhow::bail;

use super::threads::Db;
use super::{exit, store};

/// Manage the API keys of a served deployment's users: each key authenticates one user, whose
/// threads, runs and long-term memory are theirs alone (an admin's key sees everything).
///
/// Example: runner users add alice
/// Example: runner users revoke alice
#[derive(clap::Args, Debug)]
pub(super) struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Make a new key for user NAME and print it, once: it is stored only as its SHA-256.
    /// A user may have several keys; clients send one as `x-api-key` (LangGraph's SDKs send
    /// `LANGGRAPH_API_KEY` so).
    Add {
        name: String,
        /// The key's holder sees and may change every user's threads, runs and memory.
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        db: Db,
    },
    /// List the keys: id, user, whether an admin's, when made, when revoked.
    List {
        #[command(flatten)]
        db: Db,
    },
    /// Revoke every key of user NAME, or the one key KEY-ID names: a request with it is refused
    /// (401) from then on, by every server of the database.
    Revoke {
        #[arg(value_name = "NAME|KEY-ID")]
        which: String,
        #[command(flatten)]
        db: Db,
    },
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    match args.action {
        Action::Add { name, admin, db } => {
            let store = store::open(db.db.as_deref())?;
            let (key, record) = crate::server::auth::keys::add(store.as_ref(), &name, admin)?;
            // The key on stdout alone, for scripts; what it is on stderr.
            eprintln!(
                "key {} for {}{}: keep it now, it is not shown again",
                record.key_id,
                record.user,
                if admin { " (admin)" } else { "" }
            );
            println!("{key}");
            Ok(exit::OK)
        }
        Action::List { db } => {
            let store = store::open(db.db.as_deref())?;
            for k in store.list_api_keys()? {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    k.key_id,
                    k.user,
                    if k.admin { "admin" } else { "user" },
                    k.created_at,
                    k.revoked_at
                        .map_or_else(|| "active".to_string(), |at| format!("revoked {at}")),
                );
            }
            Ok(exit::OK)
        }
        Action::Revoke { which, db } => {
            let store = store::open(db.db.as_deref())?;
            let n = store.revoke_api_keys(&which, &crate::clock::now())?;
            if n == 0 {
                bail!("no active key is `{which}` or belongs to a user of that name");
            }
            eprintln!("revoked {n} key{}", if n == 1 { "" } else { "s" });
            Ok(exit::OK)
        }
    }
}
