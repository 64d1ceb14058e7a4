//! `save`: writes an artifact under an output directory (`dir`, default `out`, relative to the
//! current directory). The file may not leave the node's static root: the part of `dir` the
//! workflow writes before any template (`out` for `out/{{ input.user }}`). Whatever the
//! templates render, the rendered rest of `dir` and `path` together stay under that root:
//! absolute paths and `..` are refused, and every existing component is resolved so a
//! symlink cannot lead outside. `output` is `{path, bytes}`.

use std::path::{Component, Path, PathBuf};

use serde_json::{Value, json};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, render, render_opt, value};
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use crate::compile::{ExprId, TemplateId};
use crate::engine::kind::{Attempt, NodeKind};

/// Writes an artifact under an output directory. `output` is `{path, bytes}`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct SaveNode {
    /// The file path (template), relative to `dir`; it may not escape it.
    pub path: String,
    /// The content: an expression. Strings are written as they are, other values as JSON.
    pub content: String,
    /// The output directory (default `out`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}

/// A `save` node, compiled.
struct Config {
    n: SaveNode,
    path: TemplateId,
    content: Option<ExprId>,
    dir: Option<TemplateId>,
}

/// The `save` kind.
pub(super) struct Save;

impl KindDecl for Save {
    fn retries_by_default(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "save"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<SaveNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: SaveNode = cx.own()?;
        let path = cx.template(&["path"], &n.path);
        let content = cx.expr("content");
        let dir = match &n.dir {
            Some(dir) => Some(cx.template(&["dir"], dir)?),
            None => None,
        };
        let config = Config {
            path: path?,
            content,
            dir,
            n,
        };
        Some((KindConfig::new(config), Shape::fields(&["path", "bytes"])))
    }
}

impl NodeKind for Save {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let n = &config.n;
    let dir = render_opt(ctx, config.dir.as_ref(), "/dir")?.unwrap_or_else(|| "out".to_string());
    let rel = render(ctx, &config.path, "/path")?;
    let (root, below) = split_root(n.dir.as_deref().unwrap_or("out"), &dir).map_err(NodeError::invalid)?;
    let content = match value(ctx, config.content, "/content")?.unwrap_or(Value::Null) {
        Value::String(s) => s,
        other => serde_json::to_string_pretty(&other).unwrap_or_default(),
    };
    let inside = if below.is_empty() {
        rel.clone()
    } else {
        format!("{below}/{rel}")
    };
    let target = confined(Path::new(root), &inside).map_err(NodeError::invalid)?;
    std::fs::write(&target, content.as_bytes())
        .map_err(|e| NodeError::invalid(format!("cannot write {}: {e}", target.display())))?;
    let shown = Path::new(&dir).join(rel.trim_start_matches("./"));
    Ok(NodeOutput {
        output: json!({"path": shown.display().to_string(), "bytes": content.len()}),
        ..Default::default()
    })
}

/// The static root of a `dir` template (its text up to the last `/` before the first
/// template tag; all of it when it has none; `.` when it starts with a tag) and the rest of
/// the rendered `dir` below that root.
fn split_root<'a>(template: &'a str, rendered: &'a str) -> Result<(&'a str, &'a str), String> {
    let Some(tag) = template
        .find("{{")
        .into_iter()
        .chain(template.find("{%"))
        .chain(template.find("{#"))
        .min()
    else {
        return Ok((rendered, ""));
    };
    let Some(slash) = template[..tag].rfind('/') else {
        return Ok((".", rendered));
    };
    let prefix = &template[..=slash];
    let below = rendered
        .strip_prefix(prefix)
        .ok_or_else(|| format!("`dir` rendered as `{rendered}`, outside `{prefix}`"))?;
    let root = if slash == 0 { "/" } else { &template[..slash] };
    Ok((root, below.trim_end_matches('/')))
}

/// `rel` under `root`, with missing directories created: an error if `rel` is absolute, has a
/// `..`, or passes through a symlink that leads outside `root`.
pub(super) fn confined(root: &Path, rel: &str) -> Result<PathBuf, String> {
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

#[cfg(test)]
mod tests {
    use super::split_root;

    #[test]
    fn the_static_root_is_the_text_before_the_first_template_part() {
        for (template, rendered, want) in [
            ("out", "out", ("out", "")),
            ("out/{{ u }}", "out/alice", ("out", "alice")),
            (
                "out/reports/{{ u }}/{{ t }}",
                "out/reports/a/b/",
                ("out/reports", "a/b"),
            ),
            ("out/run-{{ t }}", "out/run-7", ("out", "run-7")),
            ("out/{{ d }}", "out/../../x", ("out", "../../x")),
            ("{{ d }}", "/etc", (".", "/etc")),
            ("/srv/{{ d }}", "/srv/a", ("/srv", "a")),
            ("/{{ d }}", "/a", ("/", "a")),
        ] {
            assert_eq!(split_root(template, rendered).ok(), Some(want), "{template}");
        }
        assert!(split_root("out/ {{- d }}", "outx").is_err());
    }
}
