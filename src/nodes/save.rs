//! `save`: writes an artifact under an output directory (`dir`, default `out`, relative to the
//! current directory). The path may not leave that directory: absolute paths and `..` are
//! refused, and every existing component is resolved so a symlink cannot lead outside.
//! `output` is `{path, bytes}`.

use std::path::{Component, Path, PathBuf};

use serde_json::{Value, json};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data, render};
use crate::spec::NodeSpec;

pub async fn run(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    let NodeSpec::Save(_) = &ctx.node.spec else {
        unreachable!("dispatched on kind")
    };
    let dir = render(ctx, "/dir")?.unwrap_or_else(|| "out".to_string());
    let rel = render(ctx, "/path")?.unwrap_or_default();
    let content = match data(ctx, "/content", &ctx.scope)?.unwrap_or(Value::Null) {
        Value::String(s) => s,
        other => serde_json::to_string_pretty(&other).unwrap_or_default(),
    };
    let target = confined(Path::new(&dir), &rel).map_err(NodeError::invalid)?;
    std::fs::write(&target, content.as_bytes())
        .map_err(|e| NodeError::invalid(format!("cannot write {}: {e}", target.display())))?;
    let shown = Path::new(&dir).join(rel.trim_start_matches("./"));
    Ok(NodeOutput {
        output: json!({"path": shown.display().to_string(), "bytes": content.len()}),
        ..Default::default()
    })
}

/// `rel` under `root`, with missing directories created: an error if `rel` is absolute, has a
/// `..`, or passes through a symlink that leads outside `root`.
pub fn confined(root: &Path, rel: &str) -> Result<PathBuf, String> {
    let mut parts = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_owned()),
            Component::CurDir => {}
            Component::ParentDir => return Err(format!("`{rel}` may not contain `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("`{rel}` must be relative to the output directory"));
            }
        }
    }
    if parts.is_empty() {
        return Err("the path is empty".into());
    }
    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let root = std::fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let escape = || format!("`{rel}` leads outside {}", root.display());
    let mut cur = root.clone();
    let last = parts.len() - 1;
    for (i, part) in parts.iter().enumerate() {
        cur = cur.join(part);
        match std::fs::symlink_metadata(&cur) {
            Ok(_) => {
                let real = std::fs::canonicalize(&cur).map_err(|_| escape())?;
                if !real.starts_with(&root) {
                    return Err(escape());
                }
                if i < last && !real.is_dir() {
                    return Err(format!("{} is not a directory", real.display()));
                }
                if i == last && real.is_dir() {
                    return Err(format!("{} is a directory", real.display()));
                }
                cur = real;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if i < last {
                    std::fs::create_dir(&cur).map_err(|e| format!("cannot create {}: {e}", cur.display()))?;
                }
            }
            Err(e) => return Err(format!("{}: {e}", cur.display())),
        }
    }
    Ok(cur)
}
