//! `runner index`: builds or updates a search index in the data database from files.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};

use super::{exit, store};
use crate::compile::compile_file;
use crate::providers::{Embedder, Providers};
use crate::rag::chunk::Chunking;
use crate::rag::embed::HashedEmbedder;
use crate::rag::{DataStore, index};

/// Index documents (txt, md, html) for `retrieve` nodes.
///
/// Directories are walked (hidden entries skipped). A file indexed before is skipped when its
/// content is unchanged and replaced when it changed. Without `--embeddings` the offline
/// hashed bag-of-words embedder is used (lexical, not semantic); an index answers only to the
/// embedder that built it.
///
/// Example: runner index docs/ --index docs
#[derive(clap::Args, Debug)]
pub(super) struct Args {
    /// Files and directories to index.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The index name (as `index:` in retrieve nodes).
    #[arg(long)]
    index: String,
    /// The data database (default: .runner/data.db).
    #[arg(long, env = "RUNNER_DATA_DB", value_name = "PATH")]
    data_db: Option<PathBuf>,
    /// Target chunk size in characters.
    #[arg(long, default_value_t = 1000)]
    chunk_size: u32,
    /// Characters shared by neighbouring chunks.
    #[arg(long, default_value_t = 150)]
    overlap: u32,
    /// The workflow whose model profiles `--embeddings` names.
    #[arg(long, value_name = "FILE", requires = "embeddings")]
    workflow: Option<PathBuf>,
    /// The model profile that embeds (needs `--workflow`); default: the offline embedder.
    #[arg(long, value_name = "PROFILE", requires = "workflow")]
    embeddings: Option<String>,
    /// Drop the index first (e.g. to rebuild it with another embedder).
    #[arg(long)]
    reset: bool,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    let embedder: Arc<dyn Embedder> = match (&args.workflow, &args.embeddings) {
        (Some(file), Some(profile)) => {
            let (plan, _) = compile_file(file, &crate::nodes::builtin().decls());
            let Some(plan) = plan else {
                bail!(
                    "{} does not compile (see `runner validate {}`)",
                    file.display(),
                    file.display()
                );
            };
            if !plan.models().contains_key(profile) {
                bail!("{} declares no model profile `{profile}`", file.display());
            }
            let providers = Providers::for_models(plan.models(), None, false)?;
            match providers.embedder(profile) {
                Some(e) => e,
                None => {
                    eprintln!("note: profile `{profile}` serves no embeddings; using the offline lexical embedder");
                    Arc::new(HashedEmbedder)
                }
            }
        }
        _ => Arc::new(HashedEmbedder),
    };
    let files = index::collect_files(&args.paths).map_err(anyhow::Error::msg)?;
    if files.is_empty() {
        bail!("no documents (.txt, .md, .html) under {}", show(&args.paths));
    }
    let db = store::data_db_path(args.data_db.as_deref())?;
    let data = DataStore::at(&db);
    if args.reset {
        let name = args.index.clone();
        data.with_blocking(|c| index::drop_index(c, &name))
            .with_context(|| format!("cannot reset index `{}`", args.index))?;
    }
    let docs = files
        .iter()
        .map(|(path, name)| index::read_file(path, name).map_err(|e| (name.clone(), e)))
        .collect();
    let chunking = Chunking::new(Some(args.chunk_size), Some(args.overlap));
    let bar = std::io::stderr().is_terminal();
    let progress = move |done: usize, total: usize, name: &str| {
        if bar {
            let width = 30;
            let filled = done * width / total.max(1);
            let shown: String = name.chars().take(40).collect();
            eprint!(
                "\r\x1b[2K[{}{}] {done}/{total} {shown}",
                "#".repeat(filled),
                "-".repeat(width - filled)
            );
            let _ = std::io::stderr().flush();
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let summary = runtime
        .block_on(index::index_documents(
            &data,
            &args.index,
            embedder,
            docs,
            chunking,
            &progress,
        ))
        .with_context(|| format!("cannot index into {}", db.display()))?;
    if bar {
        eprintln!();
    }
    for (name, e) in &summary.failed {
        eprintln!("error: {name}: {e}");
    }
    println!(
        "index `{}`: {} files indexed ({} chunks), {} unchanged, {} failed — {}",
        args.index,
        summary.indexed.len(),
        summary.chunks,
        summary.skipped.len(),
        summary.failed.len(),
        db.display()
    );
    Ok(if summary.failed.is_empty() {
        exit::OK
    } else {
        exit::INVALID
    })
}

fn show(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
