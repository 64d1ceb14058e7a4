//! MCP servers as tools, against a real MCP server: `examples/mcp_fixture.rs`, written with
//! the official SDK's server side, started over stdio by the workflow itself or over streamable
//! HTTP on 127.0.0.1 by the test. `runner mcp lock` pins its tools in the workflow's lock;
//! `runner validate` works from the lock alone; a ReAct loop on the mock provider calls the
//! server's tools, with arguments checked before they are sent and `isError` results fed back
//! as error messages.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};

use runner::compile::Plan;
use runner::engine::{RunOutcome, Status};
use serde_json::{Value, json};

use crate::support::Project;

/// The fixture server's binary, built once when `cargo test` did not build it already (a run
/// of one test target builds no examples).
fn fixture() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        // target/debug/deps/integration-… → target/debug/examples/mcp_fixture
        let path = exe.parent().unwrap().parent().unwrap().join("examples/mcp_fixture");
        if !path.is_file() {
            let status = Command::new(env!("CARGO"))
                .args(["build", "--example", "mcp_fixture", "--quiet"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .unwrap();
            assert!(status.success(), "the fixture server builds");
        }
        path
    })
}

fn runner() -> Command {
    Command::new(env!("CARGO_BIN_EXE_runner"))
}

/// A ReAct loop whose tools are the MCP server `server` (an `mcp:` mapping), `import`ed.
fn workflow(server: &str, import: &str) -> String {
    format!(
        r#"name: mcp-agent
models: {{default: {{provider: mock, model: m}}}}
input: {{type: object, properties: {{q: {{type: string}}}}}}
state:
  messages: {{type: array, reducer: add_messages, default: []}}
tools:
  fixture:
    mcp: {server}
    import: {import}
nodes:
  start: {{kind: set, update: {{messages: "[{{'role': 'user', 'content': input.q}}]"}}}}
  agent:
    kind: llm
    prompt: {{text: "Go on."}}
    history: {{from: state.messages}}
    tools: [echo, add, fail, count]
    update:
      messages: "[{{'role': 'assistant', 'content': output.content, 'tool_calls': output.tool_calls}}]"
    goto:
      - {{when: "output.tool_calls", to: act}}
      - {{to: END}}
  act: {{kind: tools, concurrency: 1, update: {{messages: output}}}}
edges: [START -> start -> agent, act -> agent]
"#
    )
}

fn stdio_server() -> String {
    format!("{{command: [{:?}]}}", fixture().display().to_string())
}

fn lock(p: &Project, file: &str) -> Value {
    let out = runner()
        .arg("mcp")
        .arg("lock")
        .arg(file)
        .current_dir(p.dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lock = file.replace(".yaml", ".mcp.lock.json");
    serde_json::from_str(&std::fs::read_to_string(p.path(&lock)).unwrap()).unwrap()
}

/// `runner validate FILE --format json`: its exit code and the codes it reported.
fn validate(p: &Project, file: &str) -> (i32, Vec<String>) {
    let out = runner()
        .args(["validate", file, "--format", "json"])
        .current_dir(p.dir.path())
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let codes = report["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap().to_string())
        .collect();
    (out.status.code().unwrap(), codes)
}

fn run(plan: &Arc<Plan>, script: Value) -> RunOutcome {
    super::tools::run(plan, script, json!({"q": "use the tools"})).0
}

/// The tool messages of a finished run: (name, status, content).
fn tool_messages(out: &RunOutcome) -> Vec<(String, String, String)> {
    out.state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("status"), s("content"))
        })
        .collect()
}

#[test]
fn the_lock_command_pins_the_servers_tools_and_validate_reads_only_the_lock() {
    // The server is started through a script that is deleted once the lock is written:
    // validating afterwards can only have used the lock.
    let p = Project::new(&[]);
    let copy = p.path("server");
    std::fs::write(&copy, format!("#!/bin/sh\nexec '{}' \"$@\"\n", fixture().display())).unwrap();
    let mut perms = std::fs::metadata(&copy).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&copy, perms).unwrap();
    let server = format!("{{command: [{:?}]}}", copy.display().to_string());
    p.write("w.yaml", &workflow(&server, "[echo, add, fail, count]"));
    let lock = lock(&p, "w.yaml");
    let tools = lock["servers"]["fixture"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["echo", "add", "fail", "env", "count"],
        "every tool the server lists"
    );
    assert_eq!(tools[0]["description"], "Says the text back.");
    assert_eq!(tools[1]["input_schema"]["required"], json!(["a", "b"]));
    std::fs::remove_file(&copy).unwrap();
    assert_eq!(validate(&p, "w.yaml"), (0, vec![]), "valid from the lock, server gone");

    // An imported name the server does not list.
    p.write("w.yaml", &workflow(&server, "[echo, add, fail, count, ecko]"));
    assert_eq!(validate(&p, "w.yaml"), (1, vec!["E222".to_string()]));
    // The server's configuration changed since the lock was written.
    let changed = format!("{{command: [{:?}], args: [--verbose]}}", copy.display().to_string());
    p.write("w.yaml", &workflow(&changed, "all"));
    assert_eq!(validate(&p, "w.yaml"), (1, vec!["E221".to_string()]));
    // No lock at all: one problem, not one more per tool the nodes name.
    p.write("w.yaml", &workflow(&server, "all"));
    std::fs::remove_file(p.path("w.mcp.lock.json")).unwrap();
    assert_eq!(validate(&p, "w.yaml"), (1, vec!["E220".to_string()]));
}

#[test]
fn a_react_loop_calls_mcp_tools_over_stdio_with_arguments_checked_and_errors_fed_back() {
    let p = Project::new(&[("w.yaml", &workflow(&stdio_server(), "all"))]);
    lock(&p, "w.yaml");
    let plan = p.plan("w.yaml");
    let script = json!({"replies": {"agent": [
        {"tool_calls": [
            {"name": "echo", "args": {"text": "hi"}},
            {"name": "add", "args": {"a": 1, "b": 2}},
            {"name": "echo", "args": {"words": "hi"}},
            {"name": "fail", "args": {"reason": "no such file"}},
            {"name": "count", "args": {}}
        ]},
        {"tool_calls": [{"name": "count", "args": {}}]},
        "Done."
    ]}});
    let out = run(&plan, script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let tools = tool_messages(&out);
    let status: Vec<&str> = tools.iter().map(|t| t.1.as_str()).collect();
    assert_eq!(status, ["success", "success", "error", "error", "success", "success"]);
    assert_eq!(tools[0].2, "echo: hi", "the server's text is the message");
    assert!(tools[1].2.contains("\"sum\":3"), "{}", tools[1].2);
    // Arguments that do not fit the server's schema are refused before the call.
    assert!(
        tools[2].2.contains("do not fit") && tools[2].2.contains("text"),
        "{}",
        tools[2].2
    );
    // `isError`: the server's text, as an error for the model to read.
    assert_eq!(tools[3].2, "Error: no such file");
    // One server process for the run, started once: the refused call never reached it, and the
    // next turn's call is its fifth.
    assert_eq!(tools[4].2, "4");
    assert_eq!(tools[5].2, "5");
    let last = out.state["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["content"], "Done.");
}

#[test]
fn an_agent_node_calls_a_prefixed_mcp_tool_over_streamable_http() {
    let mut server = HttpFixture::start();
    let yaml = format!(
        r#"name: http-agent
models: {{default: {{provider: mock, model: m}}}}
input: {{type: object, properties: {{q: {{type: string}}}}}}
state:
  messages: {{type: array, reducer: add_messages, default: [], from_input: q}}
tools:
  fixture:
    mcp: {{url: "{}", headers: {{X-Trace: runner}}}}
    import: [echo]
    prefix: fx_
nodes:
  helper:
    kind: agent
    tools: [fx_echo]
    update: {{messages: output.messages}}
edges: [START -> helper -> END]
"#,
        server.url
    );
    let p = Project::new(&[("w.yaml", &yaml)]);
    let lock = lock(&p, "w.yaml");
    assert_eq!(lock["servers"]["fixture"]["url"], json!(server.url));
    let plan = p.plan("w.yaml");
    let script = json!({"replies": {"helper": [
        {"tool_calls": [{"name": "fx_echo", "args": {"text": "over http"}}]},
        "It said it back."
    ]}});
    let out = run(&plan, script);
    server.stop();
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let tools = tool_messages(&out);
    assert_eq!(
        tools,
        [(
            "fx_echo".to_string(),
            "success".to_string(),
            "echo: over http".to_string()
        )]
    );
}

#[test]
fn a_server_that_cannot_start_answers_with_an_error_message() {
    let missing = "/nonexistent/mcp-server";
    let server = runner::spec::McpServer {
        command: Some(vec![missing.into()]),
        ..Default::default()
    };
    let lock = json!({"version": 1, "servers": {"fixture": {
        "fingerprint": runner::compile::mcp::fingerprint(&server),
        "tools": [{"name": "echo", "description": "Says the text back.", "input_schema": {"type": "object"}}],
    }}});
    let p = Project::new(&[
        (
            "w.yaml",
            &workflow(&format!("{{command: [{missing}]}}"), "all").replace("[echo, add, fail, count]", "[echo]"),
        ),
        ("w.mcp.lock.json", &lock.to_string()),
    ]);
    let plan = p.plan("w.yaml");
    let script = json!({"replies": {"agent": [
        {"tool_calls": [{"name": "echo", "args": {"text": "hi"}}]},
        "The tool is down."
    ]}});
    let out = run(&plan, script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let tools = tool_messages(&out);
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].1, "error");
    assert!(
        tools[0].2.contains("MCP server `fixture` could not start") && tools[0].2.contains(missing),
        "{}",
        tools[0].2
    );
}

/// The fixture serving streamable HTTP on 127.0.0.1, killed when the test is done with it.
struct HttpFixture {
    child: Child,
    url: String,
}

impl HttpFixture {
    fn start() -> HttpFixture {
        let mut child = Command::new(fixture())
            .arg("http")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        HttpFixture { child, url }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The README's MCP example is a valid workflow once its server is locked (here by hand: the
/// test starts no npx).
#[test]
fn the_readme_mcp_example_compiles_from_its_lock() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let yaml = readme
        .split("```yaml\n")
        .map(|block| block.split("```").next().unwrap())
        .find(|block| block.contains("mcp:"))
        .expect("the README shows an MCP server");
    let p = Project::new(&[("w.yaml", yaml)]);
    let mut diags = Vec::new();
    let source = runner::compile::source::load_source(&p.path("w.yaml"), &mut diags).unwrap();
    let server = source.workflow.unwrap().tools["files"].mcp.clone().unwrap();
    let tool = |name: &str| json!({"name": name, "description": "A file tool.", "input_schema": {"type": "object"}});
    let lock = json!({"version": 1, "servers": {"files": {
        "fingerprint": runner::compile::mcp::fingerprint(&server),
        "tools": [tool("read_text_file"), tool("list_directory"), tool("write_file")],
    }}});
    p.write("w.mcp.lock.json", &lock.to_string());
    let plan = p.plan("w.yaml");
    assert!(plan.node_by_name("reader").is_some());
}

/// A server that exits at once is named with what it wrote on its standard error; one that
/// never answers the handshake is given up on after its `startup_timeout`. Both are error
/// messages for the model, and the run goes on.
#[test]
fn a_server_that_exits_or_never_answers_is_an_error_message_with_the_reason() {
    let broken = runner::spec::McpServer {
        command: Some(vec![
            "sh".into(),
            "-c".into(),
            "echo missing API key >&2; exit 3".into(),
        ]),
        ..Default::default()
    };
    let silent = runner::spec::McpServer {
        command: Some(vec!["sleep".into(), "30".into()]),
        ..Default::default()
    };
    let tool = |name: &str| json!({"name": name, "description": "A tool.", "input_schema": {"type": "object"}});
    let lock = json!({"version": 1, "servers": {
        "broken": {"fingerprint": runner::compile::mcp::fingerprint(&broken), "tools": [tool("lookup")]},
        "silent": {"fingerprint": runner::compile::mcp::fingerprint(&silent), "tools": [tool("wait")]},
    }});
    let yaml = r#"name: down
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {q: {type: string}}}
state:
  messages: {type: array, reducer: add_messages, default: [], from_input: q}
tools:
  broken:
    mcp: {command: [sh, -c, "echo missing API key >&2; exit 3"]}
  silent:
    mcp: {command: [sleep, "30"], startup_timeout: 500ms}
nodes:
  helper:
    kind: agent
    tools: [lookup, wait]
    update: {messages: output.messages}
edges: [START -> helper -> END]
"#;
    let p = Project::new(&[("w.yaml", yaml), ("w.mcp.lock.json", &lock.to_string())]);
    let plan = p.plan("w.yaml");
    let script = json!({"replies": {"helper": [
        {"tool_calls": [{"name": "lookup", "args": {}}, {"name": "wait", "args": {}}]},
        "Both are down."
    ]}});
    let out = run(&plan, script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let tools = tool_messages(&out);
    assert_eq!(tools.len(), 2);
    assert!(tools.iter().all(|t| t.1 == "error"), "{tools:?}");
    assert!(
        tools[0].2.contains("MCP server `broken` could not start") && tools[0].2.contains("missing API key"),
        "{}",
        tools[0].2
    );
    assert!(
        tools[1].2.contains("MCP server `silent` could not start") && tools[1].2.contains("no handshake within 500ms"),
        "{}",
        tools[1].2
    );
}
