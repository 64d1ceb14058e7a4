//! `runner completions SHELL`: the shell completion script for the CLI, generated from its
//! own definition (so it never falls behind a new verb or flag).

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

use super::{Cli, exit};

#[derive(clap::Args)]
pub(super) struct Args {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "runner", &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(exit::OK)
}
