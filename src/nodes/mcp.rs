//! MCP servers' tools at run time, through the official SDK (`rmcp`) as a client: a server is
//! started as a child process speaking over stdio, or reached over streamable HTTP.
//!
//! One client per server (by the fingerprint of its configuration) for the services that run
//! the calls, shared by every node and call of a run: started on the first call of one of its
//! tools, under the server's `startup_timeout`, and closed when those services are dropped (a
//! child process is killed then): at the end of a CLI run, or with the server process. A call
//! that finds the connection closed drops the client, so the next call starts the server again.
//! `list` is the same connection made once, for `runner mcp lock`.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceError, ServiceExt};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::{NodeError, NodeOutput};
use crate::cassette::ExchangeError;
use crate::compile::mcp::{LockedTool, McpServerPlan};
use crate::engine::Env;
use crate::error_class::ErrorClass;
use crate::providers::Usage;
use crate::spec::McpServer;

/// How long starting a server and the handshake may take unless its `startup_timeout` says.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The kind of a cassette's MCP exchanges.
const MCP_EXCHANGE: &str = "mcp";

/// The most of a server's standard error kept to explain why it did not start.
const STDERR_KEPT: usize = 2048;

type Client = RunningService<RoleClient, ()>;

/// The clients of the servers called so far, by fingerprint.
#[derive(Default)]
pub(crate) struct McpClients {
    clients: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Arc<Client>>>>>,
}

impl McpClients {
    /// Calls the server's tool `tool` with `args` (an object, checked against the tool's
    /// schema by the caller). A result flagged `isError` is an error whose message is its text.
    pub(crate) async fn call(
        &self,
        env: &Env,
        server: &McpServerPlan,
        tool: &str,
        args: Value,
    ) -> Result<NodeOutput, NodeError> {
        let client = self.client(env, server).await?;
        let arguments = match args {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        match client.call_tool(params).await {
            Ok(result) => output(result),
            Err(e) => {
                if matches!(e, ServiceError::TransportClosed | ServiceError::TransportSend(_)) {
                    self.forget(server, &client);
                }
                Err(service_error(server, e))
            }
        }
    }

    /// The server's client, started now when there is none.
    async fn client(&self, env: &Env, server: &McpServerPlan) -> Result<Arc<Client>, NodeError> {
        let cell = {
            // A poisoned lock only means another call panicked while holding the map; the map
            // itself is still whole.
            let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            clients.entry(server.fingerprint.clone()).or_default().clone()
        };
        cell.get_or_try_init(|| async {
            let client = connect(&server.name, &server.spec, &server.dir, env).await?;
            // A server that no longer offers what the lock promised is refused before any
            // call reaches it: the model was offered the locked tools and argument schemas.
            let live = match client.list_all_tools().await {
                Ok(tools) => tools.into_iter().map(locked_tool).collect::<Vec<_>>(),
                Err(e) => {
                    let _ = client.cancel().await;
                    return Err(NodeError::new(
                        ErrorClass::Server,
                        format!("MCP server `{}`: listing its tools failed: {e}", server.name),
                    ));
                }
            };
            if let Some(why) = drift(&server.name, &server.tools, &live) {
                let _ = client.cancel().await;
                return Err(NodeError::new(ErrorClass::Invalid, why));
            }
            Ok(Arc::new(client))
        })
        .await
        .cloned()
    }

    /// [`McpClients::call`] with the run's `services`: the server started with the run's
    /// environment, the call recorded to or replayed from the run's cassette when it has one
    /// (an exchange of kind `mcp`: the server's entry and fingerprint, the tool and its
    /// arguments; the result or the failure). Replaying, no server is started.
    pub(crate) async fn call_with(
        &self,
        services: &crate::engine::Services,
        server: &McpServerPlan,
        tool: &str,
        args: Value,
    ) -> Result<NodeOutput, NodeError> {
        let env = &services.env;
        let Some(cassette) = services.cassette.as_deref() else {
            return self.call(env, server, tool, args).await;
        };
        let request = json!({"server": server.name, "fingerprint": server.fingerprint,
                             "tool": tool, "arguments": args});
        let live = async {
            Ok::<_, NodeError>(match self.call(env, server, tool, args.clone()).await {
                Ok(out) => json!({"output": out.output}),
                Err(e) => json!({"error": {"class": e.class, "message": e.message}}),
            })
        };
        let response = cassette
            .exchange(MCP_EXCHANGE, request, live)
            .await
            .map_err(|e| match e {
                ExchangeError::Live(e) => e,
                ExchangeError::Cassette(e) => NodeError::new(ErrorClass::BadRequest, e.to_string()),
            })?;
        match (response.get("output"), response.get("error")) {
            (Some(output), _) => Ok(NodeOutput {
                output: output.clone(),
                usage: Usage::default(),
            }),
            (None, Some(error)) => {
                let class = serde_json::from_value(error["class"].clone()).unwrap_or(ErrorClass::Server);
                let message = error["message"].as_str().unwrap_or_default();
                Err(NodeError::new(class, message))
            }
            (None, None) => Err(NodeError::new(
                ErrorClass::BadRequest,
                format!("the cassette's MCP response has neither `output` nor `error`: {response}"),
            )),
        }
    }

    /// Drops `client` (closed under us), unless another call has replaced it already.
    fn forget(&self, server: &McpServerPlan, client: &Arc<Client>) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if clients
            .get(&server.fingerprint)
            .and_then(|cell| cell.get())
            .is_some_and(|c| Arc::ptr_eq(c, client))
        {
            clients.remove(&server.fingerprint);
        }
    }
}

/// Starts or reaches the server `name` (its `${env:…}` read from `env`) and lists its tools,
/// then closes the connection.
pub(crate) async fn list_tools(
    name: &str,
    spec: &McpServer,
    dir: &std::path::Path,
    env: &Env,
) -> Result<Vec<LockedTool>, NodeError> {
    let client = connect(name, spec, dir, env).await?;
    let tools = client.list_all_tools().await.map_err(|e| NodeError {
        message: format!("MCP server `{name}`: listing its tools failed: {e}"),
        ..NodeError::new(ErrorClass::Server, String::new())
    })?;
    let _ = client.cancel().await;
    Ok(tools.into_iter().map(locked_tool).collect())
}

/// A tool of a server's live list, as the lock writes it.
fn locked_tool(t: rmcp::model::Tool) -> LockedTool {
    LockedTool {
        name: t.name.to_string(),
        description: t.description.map(|d| d.to_string()).unwrap_or_default(),
        input_schema: Value::Object((*t.input_schema).clone()),
    }
}

/// What differs between the tools the lock promised (`locked`) and the server's live list:
/// a tool gone or an argument schema changed, each named (a tool the server added is fine:
/// nothing imports it). `None` when every locked tool is offered as locked.
fn drift(server: &str, locked: &[LockedTool], live: &[LockedTool]) -> Option<String> {
    let mut problems = Vec::new();
    for tool in locked {
        match live.iter().find(|t| t.name == tool.name) {
            None => problems.push(format!("it no longer lists the tool `{}`", tool.name)),
            Some(t) if t.input_schema != tool.input_schema => problems.push(format!(
                "the input schema of the tool `{}` changed: the lock has {}, the server now has {}",
                tool.name, tool.input_schema, t.input_schema
            )),
            Some(_) => {}
        }
    }
    match problems.is_empty() {
        true => None,
        false => Some(format!(
            "MCP server `{server}` does not match the lock: {}; run `runner mcp lock` to refresh the lock, and check the workflow still fits",
            problems.join("; ")
        )),
    }
}

/// The MCP handshake with the server, over the transport its configuration names; the
/// `${env:…}` of its `env` and `headers` read from `env`.
async fn connect(name: &str, spec: &McpServer, dir: &std::path::Path, env: &Env) -> Result<Client, NodeError> {
    let limit = spec
        .startup_timeout
        .as_ref()
        .and_then(|d| d.to_std())
        .unwrap_or(STARTUP_TIMEOUT);
    // A server that fails may have been given a wrong value: name the variables it was given
    // and where each was set.
    let vars: Vec<String> = spec
        .env
        .values()
        .chain(spec.headers.values())
        .map(|v| env.describe_refs(v))
        .filter(|d| !d.is_empty())
        .collect();
    let given = match vars.is_empty() {
        true => String::new(),
        false => format!(" (it was given {})", vars.join(", ")),
    };
    let failed = |class: ErrorClass, why: String| {
        NodeError::new(class, format!("MCP server `{name}` could not start: {why}{given}"))
    };
    match (&spec.command, &spec.url) {
        (Some(command), _) => {
            let (program, rest) = command
                .split_first()
                .ok_or_else(|| failed(ErrorClass::Invalid, "`command` is empty".into()))?;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(rest).args(&spec.args);
            for (key, value) in &spec.env {
                let value = env
                    .expand(value)
                    .map_err(|e| failed(ErrorClass::Invalid, format!("env `{key}`: {e}")))?;
                cmd.env(key, value);
            }
            if let Some(cwd) = &spec.cwd {
                cmd.current_dir(dir.join(cwd));
            }
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| failed(ErrorClass::Invalid, format!("`{program}`: {e}")))?;
            let said = Arc::new(Mutex::new(String::new()));
            if let Some(mut stderr) = stderr {
                let said = said.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = stderr.read(&mut buf).await {
                        let mut kept = said.lock().unwrap_or_else(|p| p.into_inner());
                        kept.push_str(&String::from_utf8_lossy(&buf[..n]));
                        if kept.len() > STDERR_KEPT {
                            let cut = kept.len() - STDERR_KEPT;
                            let cut = (cut..kept.len())
                                .find(|i| kept.is_char_boundary(*i))
                                .unwrap_or(kept.len());
                            kept.drain(..cut);
                        }
                    }
                });
            }
            let started = tokio::time::timeout(limit, ().serve(transport)).await;
            let (class, why) = match started {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(e)) => (ErrorClass::Server, e.to_string()),
                Err(_) => (ErrorClass::Timeout, format!("no handshake within {limit:?}")),
            };
            // What the server wrote before it failed is usually the reason; give its last
            // words a moment to arrive.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let said = said.lock().unwrap_or_else(|p| p.into_inner()).trim().to_string();
            let why = match said.is_empty() {
                true => why,
                false => format!("{why}; it wrote: {said}"),
            };
            Err(failed(class, why))
        }
        (None, Some(url)) => {
            let mut headers = HashMap::new();
            for (key, value) in &spec.headers {
                let value = env
                    .expand(value)
                    .map_err(|e| failed(ErrorClass::Invalid, format!("header `{key}`: {e}")))?;
                let name = reqwest::header::HeaderName::from_bytes(key.as_bytes())
                    .map_err(|e| failed(ErrorClass::Invalid, format!("header `{key}`: {e}")))?;
                let value = reqwest::header::HeaderValue::from_str(&value)
                    .map_err(|e| failed(ErrorClass::Invalid, format!("header `{key}`: {e}")))?;
                headers.insert(name, value);
            }
            let http = crate::net::client_builder()
                .build()
                .map_err(|e| failed(ErrorClass::Invalid, format!("the HTTP client: {e}")))?;
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(headers);
            let transport = StreamableHttpClientTransport::with_client(http, config);
            match tokio::time::timeout(limit, ().serve(transport)).await {
                Ok(Ok(client)) => Ok(client),
                Ok(Err(e)) => Err(failed(ErrorClass::Network, e.to_string())),
                Err(_) => Err(failed(ErrorClass::Timeout, format!("no handshake within {limit:?}"))),
            }
        }
        (None, None) => Err(failed(ErrorClass::Invalid, "it has neither `command` nor `url`".into())),
    }
}

fn service_error(server: &McpServerPlan, e: ServiceError) -> NodeError {
    let class = match &e {
        ServiceError::Timeout { .. } => ErrorClass::Timeout,
        ServiceError::McpError(_) => ErrorClass::BadRequest,
        _ => ErrorClass::Network,
    };
    NodeError::new(class, format!("MCP server `{}`: {e}", server.name))
}

/// A tool's result as the tool message's content: its text blocks, joined; its structured
/// content when it has no text; other blocks (images, resources) as their JSON.
fn output(result: CallToolResult) -> Result<NodeOutput, NodeError> {
    let mut texts = Vec::new();
    for block in &result.content {
        match block {
            ContentBlock::Text(t) => texts.push(t.text.clone()),
            other => texts.push(serde_json::to_string(other).unwrap_or_default()),
        }
    }
    let output = match (&result.structured_content, texts.len()) {
        (Some(structured), 0) => structured.clone(),
        _ => Value::String(texts.join("\n")),
    };
    if result.is_error == Some(true) {
        let message = match output {
            Value::String(s) => s,
            other => other.to_string(),
        };
        return Err(NodeError::new(ErrorClass::BadRequest, message));
    }
    Ok(NodeOutput {
        output,
        usage: Usage::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_is_its_text_or_its_structured_content_and_is_error_fails() {
        let text = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        assert_eq!(output(text).map(|o| o.output).ok(), Some(json!("a\nb")));
        let structured = CallToolResult::structured(json!({"sum": 3}));
        // The SDK also puts the structured value in a text block; either way the model reads it.
        let out = output(structured).map(|o| o.output).ok();
        assert!(
            out == Some(json!({"sum": 3})) || out == Some(json!("{\"sum\":3}")),
            "{out:?}"
        );
        let failed = CallToolResult::error(vec![ContentBlock::text("no such file")]);
        assert_eq!(
            output(failed).err().map(|e| e.message),
            Some("no such file".to_string())
        );
    }
}
