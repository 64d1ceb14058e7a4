//! `runner validate`: check workflow files and report every problem.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::exit;
use crate::compile::Compiler;
use crate::diag::{self, Format};

/// How problems are printed, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FormatArg {
    /// Source excerpts with carets and help, for people.
    #[default]
    Human,
    /// One JSON document: `{"diagnostics": [...], "errors": N, "warnings": N}`.
    Json,
    /// `::error file=...,line=...,col=...::message` lines for GitHub Actions.
    Github,
}

impl From<FormatArg> for Format {
    fn from(arg: FormatArg) -> Self {
        match arg {
            FormatArg::Human => Format::Human,
            FormatArg::Json => Format::Json,
            FormatArg::Github => Format::Github,
        }
    }
}

/// Check workflows: YAML, schema, names, expressions, templates and the graph.
///
/// Every problem is reported at once, sorted by position, each with a stable code,
/// file:line:col and help. Exit 0 when valid, 1 when not, 2 on a usage or I/O error.
///
/// Example: runner validate workflows/ --format github
#[derive(clap::Args)]
pub(super) struct Args {
    /// Workflow files, or directories searched for *.yaml / *.yml (default: workflows/); `-`
    /// reads one workflow from standard input.
    paths: Vec<PathBuf>,
    /// How to print problems.
    #[arg(long, value_enum, default_value_t)]
    format: FormatArg,
    /// Fail on warnings too.
    #[arg(long)]
    deny_warnings: bool,
    /// The path of the workflow read from standard input (`-`, implied when no path is
    /// given): relative prompts, schemas, imports and subgraphs resolve from its directory,
    /// and problems are reported in it. Its file need not exist; when it does, standard input
    /// is read in its stead.
    #[arg(long, value_name = "PATH")]
    stdin_filename: Option<PathBuf>,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    let stdin = Path::new(crate::spec::load::STDIN);
    let mut paths = if args.paths.is_empty() {
        let default = if args.stdin_filename.is_some() {
            stdin
        } else {
            Path::new("workflows")
        };
        vec![default.to_path_buf()]
    } else {
        args.paths
    };
    let mut compiler = Compiler::new(crate::nodes::builtin().decls());
    if let Some(name) = &args.stdin_filename {
        if !paths.iter().any(|p| p == stdin) {
            bail!("--stdin-filename names the workflow read from standard input: give `-` among the paths");
        }
        if name.as_os_str().is_empty() || name == stdin {
            bail!("--stdin-filename needs the path of a file, not `{}`", name.display());
        }
        let bytes = crate::spec::load::stdin_bytes().map_err(|e| anyhow::anyhow!("cannot read standard input: {e}"))?;
        compiler.read_as(name, bytes.to_vec());
        for p in paths.iter_mut().filter(|p| p.as_path() == stdin) {
            *p = name.clone();
        }
    }
    let files = workflow_files_or(&paths, args.stdin_filename.as_deref())?;
    for file in &files {
        compiler.check(file);
    }
    let result = compiler.finish();
    let mut out = std::io::stdout().lock();
    let format = match args.format {
        FormatArg::Human => super::human_format(&std::io::stdout()),
        other => other.into(),
    };
    let rendered = diag::render(&result.diagnostics, &result.files, format);
    out.write_all(rendered.as_bytes())?;
    let (errors, warnings) = (result.errors(), result.warnings());
    if args.format == FormatArg::Human {
        let summary = summary(files.len(), errors, warnings);
        writeln!(out, "{summary}")?;
    }
    let failed = errors > 0 || (args.deny_warnings && warnings > 0);
    Ok(if failed { exit::INVALID } else { exit::OK })
}

fn summary(files: usize, errors: usize, warnings: usize) -> String {
    let plural = |n: usize, w: &str| if n == 1 { format!("1 {w}") } else { format!("{n} {w}s") };
    if errors == 0 && warnings == 0 {
        format!("{} valid", plural(files, "file"))
    } else {
        format!(
            "{}, {} in {}",
            plural(errors, "error"),
            plural(warnings, "warning"),
            plural(files, "file")
        )
    }
}

/// Expands directories into the workflow files below them, sorted; test files and mock
/// scripts (`*.test.yaml`, `*.mock.yaml`) are skipped.
pub fn workflow_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    workflow_files_or(paths, None)
}

/// [`workflow_files`], the path `stdin_as` (standing for standard input) taken as it is,
/// whether or not a file is there.
fn workflow_files_or(paths: &[PathBuf], stdin_as: Option<&Path>) -> anyhow::Result<Vec<PathBuf>> {
    let (named, rest): (Vec<PathBuf>, Vec<PathBuf>) =
        paths.iter().cloned().partition(|p| Some(p.as_path()) == stdin_as);
    let mut files = if rest.is_empty() {
        Vec::new()
    } else {
        files_under(
            &rest,
            "workflow files (*.yaml, *.yml)",
            crate::spec::load::is_workflow_file_name,
        )?
    };
    files.extend(named.into_iter().take(1));
    files.sort();
    files.dedup();
    Ok(files)
}

/// The files named in `paths`, and those below its directories whose names `keep` accepts
/// (hidden files and directories skipped), sorted; none at all is an error naming `what`.
pub(super) fn files_under(
    paths: &[PathBuf],
    what: &str,
    keep: impl Fn(&str) -> bool + Copy,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for path in paths {
        if path == Path::new(crate::spec::load::STDIN) {
            out.push(path.clone());
            continue;
        }
        let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            collect(path, keep, &mut out).with_context(|| format!("cannot list {}", path.display()))?;
        } else {
            out.push(path.clone());
        }
    }
    if out.is_empty() {
        bail!(
            "no {what} under {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn collect(dir: &Path, keep: impl Fn(&str) -> bool + Copy, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            collect(&path, keep, out)?;
        } else if keep(&name) {
            out.push(path);
        }
    }
    Ok(())
}
