//! `runner mcp lock`: start each MCP server a workflow declares, list its tools and pin them in
//! the workflow's lock file, so validating and compiling it never starts a server.

use std::path::PathBuf;

use anyhow::{Context, bail};

use super::exit;
use crate::compile::mcp::{LOCK_VERSION, Lock, LockedServer, fingerprint, lock_path, lock_text};

/// MCP servers declared under `tools:`.
#[derive(clap::Args)]
pub(super) struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    Lock(LockArgs),
}

/// Write or refresh a workflow's MCP lock file.
///
/// Starts (or reaches) every MCP server the workflow declares under `tools:`, lists its tools
/// (names, descriptions, argument schemas) and writes them to `<workflow>.mcp.lock.json` beside
/// it. `runner validate` and `runner run` read the lock and never list a server's tools
/// themselves. Run it again when a server or its configuration changes (E221 says when).
///
/// Example: runner mcp lock workflows/files.yaml
#[derive(clap::Args)]
struct LockArgs {
    /// Workflow files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    match args.command {
        Command::Lock(args) => lock(args),
    }
}

fn lock(args: LockArgs) -> anyhow::Result<u8> {
    // A server's `${env:…}` read as a run reads them: the process's, then the project's.
    let (env, _) = super::project_env()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut failed = false;
    for file in &args.files {
        let mut diags = Vec::new();
        let workflow = crate::compile::source::load_source(file, &mut diags).and_then(|s| s.workflow);
        let Some(workflow) = workflow else {
            bail!("{} does not load; `runner validate` says why", file.display());
        };
        let dir = file.parent().map(PathBuf::from).unwrap_or_default();
        let mut lock = Lock {
            version: LOCK_VERSION,
            ..Lock::default()
        };
        for (name, def) in &workflow.tools {
            let Some(server) = &def.mcp else { continue };
            match runtime.block_on(crate::nodes::mcp::list_tools(name, server, &dir, &env)) {
                Ok(tools) => {
                    lock.servers.insert(
                        name.clone(),
                        LockedServer {
                            fingerprint: fingerprint(server),
                            command: server.command.clone(),
                            url: server.url.clone(),
                            tools,
                        },
                    );
                }
                Err(e) => {
                    eprintln!("error: {}: {}", file.display(), e.message);
                    failed = true;
                }
            }
        }
        if failed {
            continue;
        }
        let path = lock_path(file);
        if lock.servers.is_empty() {
            println!("{}: no MCP servers, no lock written", file.display());
            continue;
        }
        std::fs::write(&path, lock_text(&lock)).with_context(|| format!("cannot write {}", path.display()))?;
        let summary: Vec<String> = lock
            .servers
            .iter()
            .map(|(name, s)| format!("{name} ({} tools)", s.tools.len()))
            .collect();
        println!("wrote {}: {}", path.display(), summary.join(", "));
    }
    Ok(if failed { exit::INVALID } else { exit::OK })
}
