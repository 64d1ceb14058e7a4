//! `runner man`: manual pages in roff, generated from the CLI's own definition (so they never
//! fall behind a new verb or flag).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::CommandFactory;

use super::{Cli, exit};

/// Print runner's manual page, or write one page per command into a directory.
///
/// Example: runner man --dir /usr/local/share/man/man1
#[derive(clap::Args)]
pub(super) struct Args {
    /// Write runner.1 and a runner-COMMAND.1 page for every command into this directory
    /// (created if missing) instead of printing runner.1.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    let command = Cli::command();
    let Some(dir) = args.dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(command).render(&mut out)?;
        std::io::stdout().lock().write_all(&out)?;
        return Ok(exit::OK);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    write_pages(command, "runner", &dir, &mut written)?;
    let mut out = std::io::stdout().lock();
    for path in written {
        writeln!(out, "{}", path.display())?;
    }
    Ok(exit::OK)
}

/// Writes `name.1` for `command` and, below it, `name-SUB.1` for each subcommand.
fn write_pages(
    command: clap::Command,
    name: &str,
    dir: &std::path::Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let command = command.name(name.to_string()).bin_name(name.replace('-', " "));
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    written.push(path);
    for sub in command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        write_pages(sub.clone(), &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}
