//! MCP servers declared under `tools:` (stage 2), resolved offline: each server's tools — names,
//! descriptions, argument schemas — come from the workflow's lock file
//! (`<workflow>.mcp.lock.json`, beside it), never from the server, so validating a workflow
//! starts nothing and reaches nothing. `runner mcp lock` writes the lock; this module reads it
//! and says when it is missing, when a server's configuration changed since it was written, or
//! when an entry imports a tool the server does not list.
//!
//! The catalog made here maps every tool name a node may use to what declares it: an entry of
//! its own, or an MCP server's tool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::kind::KindCx;
use super::source::Source;
use crate::diag::{Code, Diagnostic};
use crate::spec::load::push_pointer;
use crate::spec::{McpImport, McpServer, ToolDef};

/// The lock's format; a lock of another version is stale.
pub const LOCK_VERSION: u32 = 1;

/// The lock file: every MCP server of a workflow, with the tools it listed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Lock {
    pub version: u32,
    /// By the name of the `tools:` entry that declares the server.
    pub servers: IndexMap<String, LockedServer>,
}

/// One server in the lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LockedServer {
    /// SHA-256 of the server's configuration as written ([`fingerprint`]): when it differs,
    /// the lock is stale.
    pub fingerprint: String,
    /// What starts or reaches the server, for a reader (the fingerprint is what is checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Every tool the server listed, in its order.
    pub tools: Vec<LockedTool>,
}

/// A tool as the server listed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockedTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of its arguments.
    pub input_schema: Value,
}

/// Where the lock of the workflow at `path` lives: `flow.yaml` → `flow.mcp.lock.json`, beside
/// it. A generated workflow (`flow.yaml#node`) shares its file's lock.
pub fn lock_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = name.split('#').next().unwrap_or_default();
    let stem = Path::new(name)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.mcp.lock.json"))
}

/// SHA-256 over what decides which server is reached and how it is started: command,
/// arguments, environment, working directory, URL and headers (not the startup timeout).
pub fn fingerprint(server: &McpServer) -> String {
    let server = McpServer {
        startup_timeout: None,
        ..server.clone()
    };
    let text = serde_json::to_string(&server).unwrap_or_default();
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A server as a compiled tool reaches it.
#[derive(Debug)]
pub struct McpServerPlan {
    /// The `tools:` entry that declares it.
    pub name: String,
    pub spec: McpServer,
    /// [`fingerprint`] of `spec`: servers with one fingerprint are one connection.
    pub fingerprint: String,
    /// The workflow's directory, which a relative `cwd` is taken from.
    pub dir: PathBuf,
    /// The tools the workflow imports from it, as the lock lists them: on connecting, the
    /// server's live list must still offer each with the same argument schema.
    pub tools: Vec<LockedTool>,
}

/// What declares a tool name.
#[derive(Debug, Clone)]
pub(super) enum Declared {
    /// A `tools:` entry of its own (`run` or `workflow`).
    Own,
    /// A tool an MCP server listed in the lock, imported by the entry `entry`.
    Mcp {
        entry: String,
        server: Arc<McpServerPlan>,
        tool: LockedTool,
    },
    /// A name an MCP entry imports whose server's tools are not known (its lock entry is
    /// missing or the entry is malformed, already reported): it does not compile, silently.
    Broken { entry: String },
}

/// Every tool name of a workflow and what declares it, in declaration order.
#[derive(Debug, Default)]
pub(super) struct Catalog {
    pub(super) names: IndexMap<String, Declared>,
    /// An MCP entry importing `all` whose tools are unknown: a name nobody declares may be
    /// one of them, so it is not reported as unknown.
    pub(super) unknown_imports: bool,
    /// The lock's text, for the plan hash (a refreshed lock changes what may run).
    pub(super) lock_text: Option<String>,
}

impl Catalog {
    /// The names of the tools the MCP server entry `entry` imports, in the lock's order; `None`
    /// when `entry` is not an MCP server's entry whose tools are known.
    pub(super) fn server_tools(&self, entry: &str) -> Option<Vec<String>> {
        let names: Vec<String> = self
            .names
            .iter()
            .filter(|(_, d)| matches!(d, Declared::Mcp { entry: e, .. } if e == entry))
            .map(|(name, _)| name.clone())
            .collect();
        (!names.is_empty()).then_some(names)
    }

    /// The `tools:` entry that declares `name`.
    pub(super) fn entry_of<'n>(&'n self, name: &'n str) -> Option<&'n str> {
        match self.names.get(name)? {
            Declared::Own => Some(name),
            Declared::Mcp { entry, .. } | Declared::Broken { entry } => Some(entry),
        }
    }
}

/// The catalog of `tools`, with the problems of its MCP entries reported: a malformed entry,
/// a missing lock (E220) or a stale one (E221), an imported name the server does not list
/// (E222), an imported name that another tool already has.
pub(super) fn catalog(src: &Source, tools: &IndexMap<String, ToolDef>, diags: &mut Vec<Diagnostic>) -> Catalog {
    let mut cat = Catalog::default();
    let mcp_entries = tools.values().any(|d| d.mcp.is_some());
    let lock_file = lock_path(src.path());
    let lock = match mcp_entries {
        true => read_lock(&lock_file),
        false => Ok(None),
    };
    let (lock, lock_error) = match lock {
        Ok(Some((lock, text))) => {
            cat.lock_text = Some(text);
            (Some(lock), None)
        }
        Ok(None) => (None, None),
        Err(e) => (None, Some(e)),
    };
    let lock_name = lock_file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let relock = format!("run `runner mcp lock {}` to write it", file_name(src.path()));
    for (key, def) in tools {
        let pointer = push_pointer("/tools", key);
        let Some(server) = &def.mcp else {
            if def.import.is_some() || def.prefix.is_some() {
                diags.push(src.diag_key(
                    Code::InvalidValue,
                    &pointer,
                    format!("the tool `{key}` has `import` or `prefix` but no `mcp` server to import from"),
                ));
            }
            if def.description.is_none() {
                diags.push(
                    src.diag_key(
                        Code::MissingField,
                        &pointer,
                        format!("the tool `{key}` has no `description`"),
                    )
                    .help("say what the tool does: the model reads it to decide when to call it"),
                );
            }
            claim(src, &mut cat, key, Declared::Own, &pointer, diags);
            continue;
        };
        let broken = |cat: &mut Catalog, diags: &mut Vec<Diagnostic>| match &def.import {
            Some(McpImport::Names(names)) => {
                for (i, name) in names.iter().enumerate() {
                    let at = push_pointer(&push_pointer(&pointer, "import"), &i.to_string());
                    let declared = Declared::Broken { entry: key.clone() };
                    claim(src, cat, &prefixed(def, name), declared, &at, diags);
                }
            }
            _ => cat.unknown_imports = true,
        };
        if !entry_is_sound(src, key, def, server, &pointer, diags) {
            broken(&mut cat, diags);
            continue;
        }
        let at_mcp = push_pointer(&pointer, "mcp");
        let locked = match (&lock, &lock_error) {
            (_, Some(e)) => {
                let d = src
                    .diag_key(
                        Code::McpLockMissing,
                        &at_mcp,
                        format!("the lock `{lock_name}` is unreadable: {e}"),
                    )
                    .help(relock.clone());
                diags.push(d);
                None
            }
            (None, None) => {
                let d = src
                    .diag_key(
                        Code::McpLockMissing,
                        &at_mcp,
                        format!("the MCP server `{key}` has no lock: `{lock_name}` does not exist"),
                    )
                    .help(relock.clone());
                diags.push(d);
                None
            }
            (Some(lock), None) => match lock.servers.get(key) {
                None => {
                    let d = src
                        .diag_key(
                            Code::McpLockMissing,
                            &at_mcp,
                            format!("the MCP server `{key}` is not in the lock `{lock_name}`"),
                        )
                        .help(relock.clone());
                    diags.push(d);
                    None
                }
                Some(s) if lock.version != LOCK_VERSION || s.fingerprint != fingerprint(server) => {
                    let d = src
                        .diag_key(
                            Code::McpLockStale,
                            &at_mcp,
                            format!("the MCP server `{key}` changed since `{lock_name}` was written"),
                        )
                        .help(format!("run `runner mcp lock {}` to refresh it", file_name(src.path())));
                    diags.push(d);
                    None
                }
                Some(s) => Some(s),
            },
        };
        let Some(locked) = locked else {
            broken(&mut cat, diags);
            continue;
        };
        let imported: Vec<(&LockedTool, String)> = match &def.import {
            None | Some(McpImport::All(_)) => locked.tools.iter().map(|t| (t, pointer.clone())).collect(),
            Some(McpImport::Names(names)) => {
                let mut found = Vec::new();
                for (i, name) in names.iter().enumerate() {
                    let at = push_pointer(&push_pointer(&pointer, "import"), &i.to_string());
                    match locked.tools.iter().find(|t| &t.name == name) {
                        Some(t) => found.push((t, at)),
                        None => {
                            let d = src
                                .diag(
                                    Code::UnknownMcpTool,
                                    &at,
                                    format!("the MCP server `{key}` lists no tool `{name}`"),
                                )
                                .suggest(name, locked.tools.iter().map(|t| t.name.as_str()))
                                .help_or(format!(
                                    "its tools are: {}",
                                    locked
                                        .tools
                                        .iter()
                                        .map(|t| t.name.as_str())
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                ));
                            diags.push(d);
                            let declared = Declared::Broken { entry: key.clone() };
                            claim(src, &mut cat, &prefixed(def, name), declared, &at, diags);
                        }
                    }
                }
                found
            }
        };
        let plan = Arc::new(McpServerPlan {
            name: key.clone(),
            spec: server.clone(),
            fingerprint: locked.fingerprint.clone(),
            dir: src.path().parent().map(Path::to_path_buf).unwrap_or_default(),
            tools: imported.iter().map(|(t, _)| (*t).clone()).collect(),
        });
        for (tool, at) in imported {
            let declared = Declared::Mcp {
                entry: key.clone(),
                server: plan.clone(),
                tool: tool.clone(),
            };
            claim(src, &mut cat, &prefixed(def, &tool.name), declared, &at, diags);
        }
    }
    cat
}

/// The name an imported tool goes by: the entry's prefix and the server's name for it.
fn prefixed(def: &ToolDef, name: &str) -> String {
    format!("{}{name}", def.prefix.as_deref().unwrap_or_default())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Records `name`, or reports that another entry already declares it.
fn claim(src: &Source, cat: &mut Catalog, name: &str, declared: Declared, at: &str, diags: &mut Vec<Diagnostic>) {
    if let Some(first) = cat.entry_of(name) {
        let d = src
            .diag(
                Code::InvalidValue,
                at,
                format!("the tool name `{name}` is declared twice: `{first}` declares it already"),
            )
            .help("give one server's tools a `prefix`, or import only one of them");
        diags.push(d);
        return;
    }
    cat.names.insert(name.to_string(), declared);
}

/// Checks the shape of an MCP entry that the schema cannot: one way to reach the server, and
/// no fields of a tool of its own.
fn entry_is_sound(
    src: &Source,
    key: &str,
    def: &ToolDef,
    server: &McpServer,
    pointer: &str,
    diags: &mut Vec<Diagnostic>,
) -> bool {
    let mut ok = true;
    if def.run.is_some() || def.workflow.is_some() || def.args.is_some() || def.description.is_some() {
        diags.push(
            src.diag_key(
                Code::InvalidValue,
                pointer,
                format!(
                    "`{key}` imports an MCP server's tools; it takes no `run`, `workflow`, `args` or `description`"
                ),
            )
            .help("the server's tools bring their own descriptions and argument schemas"),
        );
        ok = false;
    }
    let at = push_pointer(pointer, "mcp");
    let stdio = server.command.is_some();
    let http = server.url.is_some();
    if stdio == http {
        diags.push(src.diag_key(
            Code::InvalidValue,
            &at,
            "an MCP server needs exactly one of `command` (over stdio) and `url` (over streamable HTTP)",
        ));
        ok = false;
    } else if http && (!server.args.is_empty() || !server.env.is_empty() || server.cwd.is_some()) {
        diags.push(src.diag_key(
            Code::InvalidValue,
            &at,
            "`args`, `env` and `cwd` start a process: they go with `command`, not `url`",
        ));
        ok = false;
    } else if stdio && !server.headers.is_empty() {
        diags.push(src.diag_key(Code::InvalidValue, &at, "`headers` go with `url`, not `command`"));
        ok = false;
    }
    ok
}

/// The lock and its text; `None` when there is no lock file.
fn read_lock(path: &Path) -> Result<Option<(Lock, String)>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let lock = serde_json::from_str::<Lock>(&text).map_err(|e| format!("not a lock: {e}"))?;
    Ok(Some((lock, text)))
}

/// The lock as written to its file: pretty JSON and a final newline.
pub fn lock_text(lock: &Lock) -> String {
    let mut text = serde_json::to_string_pretty(lock).unwrap_or_default();
    text.push('\n');
    text
}

impl KindCx<'_, '_, '_> {
    /// A node's tool list with each MCP server named in it — the name of its `tools:` entry,
    /// when no tool has that name — replaced by every tool the entry imports, in the lock's
    /// order; a name given twice is kept once. Other names are kept as written, for
    /// [`KindCx::tool`] to resolve or report.
    pub fn expand_tools(&self, names: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for name in names {
            let expanded = match self.b.catalog.names.contains_key(name) {
                true => None,
                false => self.b.catalog.server_tools(name),
            };
            for n in expanded.unwrap_or_else(|| vec![name.clone()]) {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_lives_beside_its_workflow_and_a_generated_one_shares_it() {
        for (path, lock) in [
            ("dir/flow.yaml", "dir/flow.mcp.lock.json"),
            ("flow.yml", "flow.mcp.lock.json"),
            ("dir/flow.yaml#agent", "dir/flow.mcp.lock.json"),
        ] {
            assert_eq!(lock_path(Path::new(path)), PathBuf::from(lock), "{path}");
        }
    }

    #[test]
    fn the_fingerprint_follows_what_reaches_the_server_not_its_timeout() {
        let server = McpServer {
            command: Some(vec!["srv".into()]),
            ..McpServer::default()
        };
        let slower = McpServer {
            startup_timeout: Some(crate::spec::Duration::Text("90s".into())),
            ..server.clone()
        };
        let other = McpServer {
            args: vec!["--root".into()],
            ..server.clone()
        };
        assert_eq!(fingerprint(&server), fingerprint(&slower));
        assert_ne!(fingerprint(&server), fingerprint(&other));
    }
}
