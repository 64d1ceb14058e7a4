//! Tools declared in a workflow's `tools:` section, compiled for the nodes that use them: the
//! arguments' JSON Schema resolved and checked, and what runs a call — a node of any
//! registered kind, its fields compiled through that kind with `args` in scope (so they are
//! checked at validate time, at their lines), a child workflow whose input is the arguments,
//! or a tool of an MCP server, as the workflow's lock lists it (`mcp.rs`).
//!
//! A tool is compiled once per workflow, the first time a node names it, and shared by every
//! node that names it.

use std::sync::Arc;

use serde_json::{Value, json};

use super::exprs::Scope;
use super::kind::KindCx;
use super::mcp::{Declared, LockedTool, McpServerPlan};
use super::plan::{Plan, PlanNode};
use crate::diag::Code;
use crate::spec::NodeSpec;
use crate::spec::load::push_pointer;

/// A tool, compiled.
pub struct Tool {
    pub name: String,
    pub description: String,
    /// The arguments' JSON Schema, resolved (self-contained).
    pub args: Value,
    /// The limit of one call.
    pub timeout: Option<std::time::Duration>,
    pub run: ToolRun,
}

/// What runs a tool's call.
pub enum ToolRun {
    /// A node, run with `args` in scope: its kind's compiled fields and nothing else (no
    /// state writes, no routing).
    Node(Box<PlanNode>),
    /// A workflow, run as a child thread with the arguments as its input.
    Workflow(Arc<Plan>),
    /// A tool of an MCP server, called by the server's name for it.
    Mcp { server: Arc<McpServerPlan>, tool: String },
}

/// How long one call of an MCP server's tool may take unless its entry says otherwise.
const MCP_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl Tool {
    /// The tool as a model is offered it (OpenAI's function shape, which every provider maps).
    pub fn function(&self) -> Value {
        json!({
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.args},
        })
    }
}

impl KindCx<'_, '_, '_> {
    /// The names of the tools the workflow declares, in order (an MCP server's tools by the
    /// names they are imported as).
    pub fn tool_names(&self) -> Vec<String> {
        self.b.catalog.names.keys().cloned().collect()
    }

    /// The `tools:` entry that declares the tool `name` (an MCP server's entry for its tools)
    /// and, for an MCP server's tool, the server's name for it.
    pub fn tool_entry(&self, name: &str) -> Option<(String, Option<String>)> {
        let entry = self.b.catalog.entry_of(name)?.to_string();
        match self.b.catalog.names.get(name)? {
            Declared::Mcp { tool, .. } => Some((entry, Some(tool.name.clone()))),
            _ => Some((entry, None)),
        }
    }

    /// The tool `name`, named at `path` of the node, compiled; `None` (reported: E217 for a
    /// name the workflow does not declare) when it does not compile.
    pub fn tool(&mut self, path: &[&str], name: &str) -> Option<Arc<Tool>> {
        let declared = match self.b.catalog.names.get(name) {
            Some(d) => d.clone(),
            // An MCP server whose tools are unknown (its lock is missing, reported) may have it.
            None if self.b.catalog.unknown_imports => return None,
            None => {
                let at = self.at(path);
                let d = self
                    .b
                    .src
                    .diag(Code::UnknownTool, &at, format!("no tool `{name}` is declared"))
                    .suggest(name, self.b.catalog.names.keys().map(String::as_str))
                    .help_or("declare it under the workflow's top-level `tools:`");
                self.b.diags.push(d);
                return None;
            }
        };
        let def = match declared {
            Declared::Broken { .. } => return None,
            Declared::Mcp { entry, server, tool } => return Some(self.mcp_tool(name, &entry, server, &tool)),
            Declared::Own => self.b.wf.tools.get(name).cloned()?,
        };
        if let Some(done) = self.b.tools.get(name) {
            return done.clone();
        }
        if self.b.tools_open.iter().any(|t| t == name) {
            let at = self.at(path);
            let chain = [self.b.tools_open.as_slice(), &[name.to_string()]]
                .concat()
                .join(" -> ");
            let d = self
                .b
                .src
                .diag(
                    Code::InvalidValue,
                    &at,
                    format!("the tool `{name}` offers itself: {chain}"),
                )
                .help("a tool's `run` may offer other tools, never one that leads back to it");
            self.b.diags.push(d);
            return None;
        }
        self.b.tools_open.push(name.to_string());
        let tool = self.compile_tool(name, &def);
        self.b.tools_open.pop();
        self.b.tools.insert(name.to_string(), tool.clone());
        tool
    }

    /// The tool `name`, the MCP server's tool `tool`, imported by the entry `entry`.
    fn mcp_tool(&mut self, name: &str, entry: &str, server: Arc<McpServerPlan>, tool: &LockedTool) -> Arc<Tool> {
        if let Some(Some(done)) = self.b.tools.get(name) {
            return done.clone();
        }
        let timeout = self
            .b
            .wf
            .tools
            .get(entry)
            .and_then(|d| d.timeout.as_ref())
            .and_then(|d| d.to_std());
        let compiled = Arc::new(Tool {
            name: name.to_string(),
            description: tool.description.clone(),
            args: tool.input_schema.clone(),
            timeout: Some(timeout.unwrap_or(MCP_CALL_TIMEOUT)),
            run: ToolRun::Mcp {
                server,
                tool: tool.name.clone(),
            },
        });
        self.b.tools.insert(name.to_string(), Some(compiled.clone()));
        compiled
    }

    fn compile_tool(&mut self, name: &str, def: &crate::spec::ToolDef) -> Option<Arc<Tool>> {
        let pointer = push_pointer("/tools", name);
        let src = self.b.src.clone();
        // A tool of its own without a description was reported with the catalog.
        let description = def.description.clone()?;
        let (run, default_args) = match (&def.run, &def.workflow) {
            (Some(_), Some(_)) | (None, None) => {
                self.b.diags.push(src.diag_key(
                    Code::InvalidValue,
                    &pointer,
                    format!("the tool `{name}` needs exactly one of `run` (a node) and `workflow` (a file)"),
                ));
                return None;
            }
            (None, Some(file)) => {
                let at = push_pointer(&pointer, "workflow");
                let path = super::relative_to(src.path(), file);
                if !path.is_file() {
                    let d = super::defs::missing_file(&src, &at, &path, "tool workflow");
                    self.b.diags.push(d);
                    return None;
                }
                let child = self.b.c.subgraph(&src, &at, &path, self.b.diags)?;
                self.b.hash_file(format!("tool:{file}"), child.hash.clone());
                if !child.handoffs.is_empty() {
                    self.b.diags.push(src.diag(
                        Code::InvalidValue,
                        &at,
                        "a workflow run as a tool cannot hand off: it answers the model, not the graph",
                    ));
                }
                let args = child.input_schema.clone();
                (ToolRun::Workflow(child), args)
            }
            (Some(run), None) => {
                let at = push_pointer(&pointer, "run");
                let node = self.tool_node(name, &at, run)?;
                (ToolRun::Node(Box::new(node)), None)
            }
        };
        let args = match &def.args {
            Some(schema) => {
                let at = push_pointer(&pointer, "args");
                let root = self.b.resolver.resolve(&src, &at, &schema.0, self.b.diags);
                super::schemas::check(&src, &at, &root, self.b.diags);
                root
            }
            None => default_args.unwrap_or_else(|| json!({"type": "object"})),
        };
        Some(Arc::new(Tool {
            name: name.to_string(),
            description,
            args,
            timeout: def.timeout.as_ref().and_then(|d| d.to_std()),
            run,
        }))
    }

    /// A tool's `run` node (written at `at`) compiled by its kind, with `args` in scope.
    fn tool_node(&mut self, name: &str, at: &str, run: &Value) -> Option<PlanNode> {
        let src = self.b.src.clone();
        let fields = run.as_object()?.clone();
        let kind = fields.get("kind").and_then(Value::as_str)?.to_string();
        let Some(decl) = self.b.c.kinds.get(&kind).cloned() else {
            let d = src
                .diag(
                    Code::UnknownKind,
                    &push_pointer(at, "kind"),
                    format!("a tool runs a node of a registered kind; `{kind}` is not one"),
                )
                .suggest(&kind, self.b.c.kinds.names());
            self.b.diags.push(d);
            return None;
        };
        if decl.is_gate() {
            self.b.diags.push(
                src.diag(
                    Code::InvalidValue,
                    &push_pointer(at, "kind"),
                    format!("a tool cannot run a `{kind}` node"),
                )
                .help("a tool answers the model at once; a gate waits for a person"),
            );
            return None;
        }
        let spec = serde_json::from_value::<NodeSpec>(run.clone()).ok()?;
        if spec.common.cache.as_ref().is_some_and(|c| c.spec().is_some()) {
            // A tool's call runs inside its caller's task, whose result is what a step stores.
            self.b.diags.push(
                src.diag(
                    Code::BadCache,
                    &push_pointer(at, "cache"),
                    "a tool's `run` node is not cached on its own",
                )
                .help("cache the node that calls the tool"),
            );
        }
        let sym = self.b.sym.clone();
        let mut cx = KindCx {
            b: &mut *self.b,
            ix: self.ix,
            pointer: at.to_string(),
            fields: &fields,
            scope: Scope {
                item: Some("args"),
                ..Scope::base(&sym)
            },
            label: Some(format!("tool:{name}")),
        };
        let (config, _) = decl.compile(&mut cx)?;
        let node = PlanNode {
            name: name.to_string(),
            user_kind: None,
            retry: super::plan::Retry::resolve(spec.common().retry.as_ref(), decl.retries_by_default()),
            timeout: spec.common().timeout.as_ref().and_then(|t| t.to_std()),
            spec,
            update: Vec::new(),
            config,
            gate: false,
            branches: Vec::new(),
            goto: Vec::new(),
            on_error: None,
            item: Some("args".into()),
            cache: None,
        };
        Some(node)
    }
}
