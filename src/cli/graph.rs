//! `runner graph`: draw a workflow's compiled plan.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::exit;
use crate::compile::compile_file;
use crate::compile::picture::{self, PictureFormat};
use crate::diag;

/// A picture format, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PictureArg {
    /// Mermaid flowchart text (renders on GitHub and in many editors).
    #[default]
    Mermaid,
    /// Graphviz dot.
    Dot,
    /// The plan's nodes and edges as JSON.
    Json,
}

impl From<PictureArg> for PictureFormat {
    fn from(arg: PictureArg) -> Self {
        match arg {
            PictureArg::Mermaid => PictureFormat::Mermaid,
            PictureArg::Dot => PictureFormat::Dot,
            PictureArg::Json => PictureFormat::Json,
        }
    }
}

/// Draw a workflow as Mermaid, Graphviz dot or JSON.
///
/// Conditional edges are dashed and labelled with their condition, joins and fan-outs are
/// marked, interrupt gates are hexagons and subgraphs are clusters.
///
/// Example: runner graph workflows/research.yaml --format dot | dot -Tsvg > research.svg
#[derive(clap::Args)]
pub(super) struct Args {
    /// The workflow file (`-`: standard input).
    file: PathBuf,
    /// The picture format.
    #[arg(long, value_enum, default_value_t)]
    format: PictureArg,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    if args.file != Path::new(crate::spec::load::STDIN) && !args.file.is_file() {
        anyhow::bail!("{} is not a file", args.file.display());
    }
    let (plan, result) = compile_file(&args.file, &crate::nodes::builtin().decls());
    let Some(plan) = plan else {
        eprint!(
            "{}",
            diag::render(
                &result.diagnostics,
                &result.files,
                super::human_format(&std::io::stderr())
            )
        );
        return Ok(exit::INVALID);
    };
    std::io::stdout()
        .lock()
        .write_all(picture::render(&plan, args.format.into()).as_bytes())?;
    Ok(exit::OK)
}
