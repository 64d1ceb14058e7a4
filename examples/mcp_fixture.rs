//! A small MCP server, written with the official SDK's server side, that the tests start: over
//! stdio by default, or over streamable HTTP on 127.0.0.1 with `http` (it prints its URL on
//! the first line of its output). Its tools:
//!
//! - `echo {text}`: the text back, prefixed with `echo: `;
//! - `add {a, b}`: their sum, as structured content (`{"sum": …}`);
//! - `fail {reason}`: a result flagged `isError`, whose text is the reason;
//! - `env {name}`: the server's environment variable `name` (empty when unset);
//! - `count {}`: how many calls this process has served, this one included.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

#[derive(Clone)]
struct Fixture {
    calls: Arc<AtomicUsize>,
}

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

fn tools() -> Vec<Tool> {
    let text = |name: &str| json!({"type": "object", "properties": {name: {"type": "string"}}, "required": [name]});
    vec![
        Tool::new("echo", "Says the text back.", schema(text("text"))),
        Tool::new(
            "add",
            "Adds two numbers.",
            schema(json!({
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            })),
        ),
        Tool::new("fail", "Always fails, with the reason given.", schema(text("reason"))),
        Tool::new(
            "env",
            "Reads one of the server's environment variables.",
            schema(text("name")),
        ),
        Tool::new(
            "count",
            "How many calls the server has served.",
            schema(json!({"type": "object"})),
        ),
    ]
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let served = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let args = request.arguments.unwrap_or_default();
        let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
        let number = |key: &str| args.get(key).and_then(Value::as_f64).unwrap_or_default();
        let result = match request.name.as_ref() {
            "echo" => CallToolResult::success(vec![ContentBlock::text(format!("echo: {}", text("text")))]),
            "add" => CallToolResult::structured(json!({"sum": number("a") + number("b")})),
            "fail" => CallToolResult::error(vec![ContentBlock::text(text("reason"))]),
            "env" => CallToolResult::success(vec![ContentBlock::text(
                std::env::var(text("name")).unwrap_or_default(),
            )]),
            "count" => CallToolResult::success(vec![ContentBlock::text(served.to_string())]),
            other => return Err(ErrorData::invalid_params(format!("no tool `{other}`"), None)),
        };
        Ok(CallToolResponse::Complete(result))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fixture = Fixture {
        calls: Arc::new(AtomicUsize::new(0)),
    };
    match std::env::args().nth(1).as_deref() {
        Some("http") => {
            use rmcp::transport::streamable_http_server::{StreamableHttpService, session::local::LocalSessionManager};
            let service: StreamableHttpService<Fixture, LocalSessionManager> =
                StreamableHttpService::new(move || Ok(fixture.clone()), Default::default(), Default::default());
            let router = axum::Router::new().nest_service("/mcp", service);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            println!("http://{}/mcp", listener.local_addr()?);
            axum::serve(listener, router).await?;
        }
        _ => {
            let running = fixture.serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
        }
    }
    Ok(())
}
