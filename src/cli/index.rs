//! `runner index`: builds or updates a search index in the data database from files.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use indexmap::IndexMap;

use super::exit;
use crate::compile::compile_file;
use crate::providers::{Embedder, Providers};
use crate::rag::chunk::Chunking;
use crate::rag::embed::HashedEmbedder;
use crate::rag::{DataStore, index};
use crate::spec::ModelProfile;

/// Index documents (txt, md, html, pdf) for `retrieve` nodes.
///
/// Directories are walked (hidden entries skipped). A file indexed before is skipped when its
/// content is unchanged and replaced when it changed. Without `--embeddings` the offline
/// hashed bag-of-words embedder is used (lexical, not semantic); an index answers only to the
/// embedder that built it. `--model` serves a profile from another model, as for `runner run`
/// (without `--workflow` it defines the profile `--embeddings` names).
///
/// Example: runner index docs/ --index docs --workflow rag.yaml --embeddings embed --model embed=ollama:nomic-embed-text
#[derive(clap::Args, Debug)]
pub(super) struct Args {
    /// Files and directories to index.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The index name (as `index:` in retrieve nodes).
    #[arg(long)]
    index: String,
    /// The data database: a SQLite file, or `postgres://…` (default: $RUNNER_DATA_DB, else
    /// $RUNNER_DB when it is a PostgreSQL database, else .runner/data.db).
    // Not `env = …`: the settings read the variable, so an error names where it was set.
    #[arg(long, value_name = "PATH|URL")]
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
    /// The model profile that embeds (from `--workflow` or `--model`); default: the offline
    /// embedder.
    #[arg(long, value_name = "PROFILE")]
    embeddings: Option<String>,
    /// Serve a model profile from another model: `PROFILE=PROVIDER:MODEL[@URL]`, as for
    /// `runner run` (e.g. `embed=ollama:nomic-embed-text`). The index then records that model,
    /// so `runner run` must serve the profile the same way.
    #[arg(long = "model", value_name = "PROFILE=SPEC", requires = "embeddings")]
    model: Vec<String>,
    /// Drop the index first (e.g. to rebuild it with another embedder).
    #[arg(long)]
    reset: bool,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    let (env, _) = super::project_env()?;
    let (embedder, key) = embedder(&args, &env)?;
    let files = index::collect_files(&args.paths).map_err(anyhow::Error::msg)?;
    if files.is_empty() {
        bail!("no documents (.txt, .md, .html, .pdf) under {}", show(&args.paths));
    }
    let db = crate::run::data_location_from_env(args.data_db.clone(), &env)?;
    let db_source = match db.source {
        crate::run::Source::Default => String::new(),
        ref source => format!(" (from {source})"),
    };
    let db = db.value;
    let data = DataStore::new(db.clone());
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
        .with_context(|| {
            // A refused key says which variable held it, and where that was set.
            let key = key
                .as_ref()
                .map(|k| format!(" with the embedder's key from {k}"))
                .unwrap_or_default();
            format!("cannot index into {db}{db_source}{key}")
        })?;
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
        db
    );
    Ok(if summary.failed.is_empty() {
        exit::OK
    } else {
        exit::INVALID
    })
}

/// The embedder `--embeddings` names: a profile of `--workflow`, with `--model` overrides
/// applied, or one `--model` defines, its key read from `env`; the offline embedder when none
/// is named. With it, the variable its key was read from, as an error names it.
fn embedder(args: &Args, env: &crate::run::Env) -> anyhow::Result<(Arc<dyn Embedder>, Option<String>)> {
    let Some(profile) = &args.embeddings else {
        return Ok((Arc::new(HashedEmbedder), None));
    };
    let mut models: IndexMap<String, ModelProfile> = match &args.workflow {
        Some(file) => {
            let (plan, _) = compile_file(file, &crate::nodes::builtin().decls());
            let Some(plan) = plan else {
                bail!(
                    "{} does not compile (see `runner validate {}`)",
                    file.display(),
                    file.display()
                );
            };
            plan.models().clone()
        }
        None => IndexMap::new(),
    };
    for arg in &args.model {
        let Some((name, spec)) = arg.split_once('=') else {
            bail!("`{arg}` is not PROFILE=PROVIDER:MODEL[@URL]");
        };
        let base = match models.get(name) {
            Some(p) => p.clone(),
            None if args.workflow.is_none() => ModelProfile::unset(),
            None => bail!(
                "{} declares no model profile `{name}`",
                args.workflow
                    .as_deref()
                    .map_or_else(String::new, |f| f.display().to_string())
            ),
        };
        let overridden = crate::providers::override_profile(&base, spec).map_err(anyhow::Error::msg)?;
        models.insert(name.to_string(), overridden);
    }
    if !models.contains_key(profile) {
        match &args.workflow {
            Some(file) => bail!("{} declares no model profile `{profile}`", file.display()),
            None => bail!(
                "no model profile `{profile}`: name a `--workflow` that declares it, or define it with `--model {profile}=PROVIDER:MODEL`"
            ),
        }
    }
    let providers = Providers::for_models_in(&models, None, false, &|name| env.get(name))?;
    let key = models[profile.as_str()]
        .api_key_env
        .as_deref()
        .filter(|name| env.get(name).is_some())
        .map(|name| env.describe(name));
    Ok(match providers.embedder(profile) {
        Some(e) => (e, key),
        None => {
            eprintln!("note: profile `{profile}` serves no embeddings; using the offline lexical embedder");
            (Arc::new(HashedEmbedder), None)
        }
    })
}

fn show(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
