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

use crate::support::{Project, install};

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

// ── the lock against the live server, a whole server as a node's tools, cassettes ─────────

/// The fixture's `server` entry behind a wrapper script the test can delete, and a workflow
/// whose agent names the whole server (`tools: [fixture]`).
fn whole_server_project() -> (Project, PathBuf) {
    let p = Project::new(&[]);
    let copy = p.path("server");
    std::fs::write(&copy, format!("#!/bin/sh\nexec '{}' \"$@\"\n", fixture().display())).unwrap();
    let mut perms = std::fs::metadata(&copy).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&copy, perms).unwrap();
    let yaml = format!(
        r#"name: whole-server
models: {{default: {{provider: mock, model: m}}}}
input: {{type: object, properties: {{q: {{type: string}}}}}}
state:
  messages: {{type: array, reducer: add_messages, default: [], from_input: q}}
tools:
  fixture:
    mcp: {{command: [{:?}]}}
nodes:
  helper:
    kind: agent
    tools: [fixture]
    update: {{messages: output.messages}}
edges: [START -> helper -> END]
"#,
        copy.display().to_string()
    );
    p.write("w.yaml", &yaml);
    (p, copy)
}

#[test]
fn a_node_naming_an_mcp_server_is_offered_every_tool_it_imports() {
    let (p, _) = whole_server_project();
    lock(&p, "w.yaml");
    let plan = p.plan("w.yaml");
    let script = json!({"replies": {"helper": [
        {"tool_calls": [
            {"name": "echo", "args": {"text": "all"}},
            {"name": "add", "args": {"a": 1, "b": 1}},
            {"name": "fail", "args": {"reason": "as asked"}},
            {"name": "env", "args": {"name": "RUNNER_TEST_UNSET"}},
            {"name": "count", "args": {}}
        ]},
        "Done."
    ]}});
    let out = run(&plan, script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    // Every tool of the server ran (a tool the agent does not run answers "there is no tool").
    let tools = tool_messages(&out);
    let names: Vec<&str> = tools.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(names, ["echo", "add", "fail", "env", "count"]);
    assert!(tools.iter().all(|t| !t.2.contains("no tool")), "{tools:?}");
    assert_eq!(tools[0].2, "echo: all");
    assert_eq!(tools[2].2, "Error: as asked");
}

/// An `llm` node may name the server too: it is offered every tool the entry imports (a name
/// that is neither a tool nor an MCP entry is still refused).
#[test]
fn an_llm_node_naming_an_mcp_server_is_offered_every_tool_it_imports() {
    let (p, _) = whole_server_project();
    let yaml = std::fs::read_to_string(p.path("w.yaml")).unwrap().replace(
        "    kind: agent\n    tools: [fixture]\n    update: {messages: output.messages}",
        "    kind: llm\n    history: {from: state.messages}\n    tools: [fixture]\n    update: {calls: output.tool_calls}",
    ).replace(
        "  messages:",
        "  calls: {type: array, default: []}\n  messages:",
    );
    p.write("llm.yaml", &yaml);
    lock(&p, "llm.yaml");
    let plan = p.plan("llm.yaml");
    let script = json!({"replies": {"helper": [{"tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}]}});
    let out = run(&plan, script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["calls"][0]["function"]["name"], "add", "{:?}", out.state);
    p.write("bad.yaml", &yaml.replace("tools: [fixture]", "tools: [fixtures]"));
    let (_, result) = runner::compile::compile_file(&p.path("bad.yaml"), &runner::nodes::builtin().decls());
    assert!(
        result.diagnostics.iter().any(|d| d.is_error()),
        "an unknown name is refused"
    );
}

#[test]
fn a_server_whose_live_tools_differ_from_the_lock_is_refused_naming_each_tool() {
    let (p, _) = whole_server_project();
    let mut locked = lock(&p, "w.yaml");
    // The lock says `echo` takes one more (optional) argument than the server now declares,
    // lists a tool the server no longer has, and lacks `env`, which the server added since.
    let tools = locked["servers"]["fixture"]["tools"].as_array_mut().unwrap();
    tools[0]["input_schema"]["properties"]["loud"] = json!({"type": "boolean"});
    tools.retain(|t| t["name"] != "env");
    tools.push(json!({"name": "vanished", "description": "Gone.", "input_schema": {"type": "object"}}));
    std::fs::write(p.path("w.mcp.lock.json"), locked.to_string()).unwrap();
    let plan = p.plan("w.yaml");
    let script = json!({"replies": {"helper": [
        {"tool_calls": [{"name": "echo", "args": {"text": "hi"}}]},
        "Done."
    ]}});
    let out = run(&plan, script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let tools = tool_messages(&out);
    let (name, status, content) = &tools[0];
    assert_eq!((name.as_str(), status.as_str()), ("echo", "error"));
    assert!(content.contains("does not match the lock"), "{content}");
    assert!(
        content.contains("the input schema of the tool `echo` changed"),
        "{content}"
    );
    assert!(content.contains("no longer lists the tool `vanished`"), "{content}");
    assert!(!content.contains("`env`"), "a tool the server added is fine: {content}");
    assert!(content.contains("runner mcp lock"), "{content}");
}

#[test]
fn mcp_calls_are_recorded_in_a_cassette_and_replayed_with_no_server() {
    let (p, copy) = whole_server_project();
    lock(&p, "w.yaml");
    let script = json!({"replies": {"helper": [
        {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}, {"name": "fail", "args": {"reason": "nope"}}]},
        "Done."
    ]}});
    p.write("mock.json", &script.to_string());
    // Recorded with the model scripted; replayed from the cassette alone (model and tools).
    let run_with = |flag: &str| {
        let mut cmd = runner();
        cmd.args(["run", "w.yaml", "--db", ":memory:", "--input", "q=go", flag, "c.jsonl"]);
        if flag == "--record" {
            cmd.args(["--mock", "mock.json"]);
        }
        let out = cmd.current_dir(p.dir.path()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{flag}: {stderr}");
        let state: Value = serde_json::from_slice(&out.stdout).unwrap();
        state["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| (m["status"].clone(), m["content"].clone()))
            .collect::<Vec<_>>()
    };
    let recorded = run_with("--record");
    assert!(recorded[0].1.as_str().unwrap().contains("\"sum\":5"), "{recorded:?}");
    assert_eq!(recorded[1], (json!("error"), json!("Error: nope")));
    let cassette = std::fs::read_to_string(p.path("c.jsonl")).unwrap();
    let mcp: Vec<Value> = cassette
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == "mcp")
        .collect();
    assert_eq!(mcp.len(), 2, "{cassette}");
    // The two calls run in parallel: the cassette holds them in the order they finished.
    let add = mcp
        .iter()
        .find(|e| e["request"]["tool"] == "add")
        .expect("the add call is recorded");
    assert_eq!(add["request"]["arguments"], json!({"a": 2, "b": 3}));
    assert!(mcp.iter().any(|e| e["request"]["tool"] == "fail"), "{cassette}");
    // The server is gone: the replay can only have read the cassette.
    std::fs::remove_file(&copy).unwrap();
    assert_eq!(run_with("--replay"), recorded);
}

// ── third-party servers from npm ───────────────────────────────────────────────────────────

/// `tests/mcp/` — the reference filesystem and everything servers, pinned by its lock file —
/// installed by `npm ci` once per target directory (copied there, so the source tree stays
/// clean). `None`, saying why, when `node` or `npm` is not installed; a failed install fails.
fn reference_servers() -> Option<&'static Path> {
    static DIR: OnceLock<Option<Result<PathBuf, String>>> = OnceLock::new();
    let found = DIR.get_or_init(|| {
        for tool in ["node", "npm"] {
            if Command::new(tool).arg("--version").output().is_err() {
                eprintln!("skipped: `{tool}` is not installed, so the reference MCP servers cannot be");
                return None;
            }
        }
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
        Some(install::npm_ci("mcp-servers", &source))
    });
    match found {
        None => None,
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => panic!("the reference MCP servers could not be installed: {e}"),
    }
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The reference "everything" server over streamable HTTP on a free port of 127.0.0.1, once it
/// accepts connections.
fn everything_over_http(dir: &Path) -> (Killed, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let child = Killed(
        Command::new("node")
            .arg(script)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the everything server did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (child, format!("http://127.0.0.1:{port}/mcp"))
}

#[test]
fn reference_mcp_servers_from_npm_round_trip_over_stdio_and_streamable_http() {
    let Some(dir) = reference_servers() else {
        return;
    };
    let (_everything, url) = everything_over_http(dir);
    let files = dir.join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    let p = Project::new(&[("notes/heat.txt", "COP is three to four.")]);
    let root = p.path("notes").canonicalize().unwrap();
    let yaml = format!(
        r#"name: reference-servers
models: {{default: {{provider: mock, model: m}}}}
input: {{type: object, properties: {{q: {{type: string}}}}}}
state:
  messages: {{type: array, reducer: add_messages, default: [], from_input: q}}
tools:
  files:
    mcp: {{command: [node, {files:?}, {root:?}]}}
    import: [list_directory, read_text_file]
  everything:
    mcp: {{url: "{url}"}}
    import: [echo]
    prefix: everything_
nodes:
  helper:
    kind: agent
    tools: [files, everything_echo]
    concurrency: 1
    update: {{messages: output.messages}}
edges: [START -> helper -> END]
"#,
        files = files.display().to_string(),
        root = root.display().to_string(),
    );
    p.write("w.yaml", &yaml);
    let locked = lock(&p, "w.yaml");
    let listed = |server: &str| -> Vec<String> {
        locked["servers"][server]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(listed("files").contains(&"read_text_file".to_string()), "{locked}");
    assert!(listed("everything").contains(&"echo".to_string()), "{locked}");
    let plan = p.plan("w.yaml");
    let heat = root.join("heat.txt").display().to_string();
    let script = json!({"replies": {"helper": [
        {"tool_calls": [
            {"name": "list_directory", "args": {"path": root.display().to_string()}},
            {"name": "read_text_file", "args": {"path": heat}},
            {"name": "read_text_file", "args": {"path": "/etc/hostname"}},
            {"name": "everything_echo", "args": {"message": "over http"}}
        ]},
        "Done."
    ]}});
    let out = run(&plan, script);
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    let tools = tool_messages(&out);
    assert_eq!(tools.len(), 4, "{tools:?}");
    assert_eq!(tools[0].1, "success", "{tools:?}");
    assert!(tools[0].2.contains("[FILE] heat.txt"), "{tools:?}");
    assert_eq!(
        (tools[1].1.as_str(), tools[1].2.as_str()),
        ("success", "COP is three to four.")
    );
    // Outside the directory the server was given: its own refusal, fed back as an error.
    assert_eq!(tools[2].1, "error", "{tools:?}");
    assert_eq!(
        (tools[3].1.as_str(), tools[3].2.as_str()),
        ("success", "Echo: over http")
    );
}

/// An MCP server's `env` reads the run's environment, a project's `.env` included, both when
/// `runner mcp lock` starts it and when a run does; the process's variable wins over `.env`'s.
#[test]
fn a_servers_env_reads_the_projects_dot_env() {
    let yaml = format!(
        r#"name: env-agent
models: {{default: {{provider: mock, model: m}}}}
input: {{type: object, properties: {{q: {{type: string}}}}}}
state:
  messages: {{type: array, reducer: add_messages, default: [], from_input: q}}
tools:
  fixture:
    mcp: {{command: [{:?}], env: {{FIXTURE_GREETING: "${{env:MCP_GREETING}}"}}}}
    import: [env]
nodes:
  helper:
    kind: agent
    tools: [env]
    update: {{messages: output.messages}}
edges: [START -> helper -> END]
"#,
        fixture().display().to_string()
    );
    let p = Project::new(&[
        ("w.yaml", &yaml),
        (".env", "MCP_GREETING=hello-from-dot-env\n"),
        (
            "mock.yaml",
            "replies:\n  helper:\n    - {tool_calls: [{name: env, args: {name: FIXTURE_GREETING}}]}\n    - Done.\n",
        ),
    ]);
    // Without `.env`'s variable the server could not be started to be locked.
    lock(&p, "w.yaml");
    let said = |env: &[(&str, &str)]| -> String {
        let mut cmd = runner();
        cmd.args([
            "run",
            "w.yaml",
            "--mock",
            "mock.yaml",
            "--db",
            ":memory:",
            "-i",
            "q=greet",
        ])
        .current_dir(p.dir.path())
        .env_remove("MCP_GREETING");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let state: Value = serde_json::from_slice(&out.stdout).unwrap();
        let tool = state["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool")
            .cloned()
            .unwrap_or_else(|| panic!("no tool message: {state}"));
        tool["content"].as_str().unwrap().to_string()
    };
    assert_eq!(said(&[]), "hello-from-dot-env");
    assert_eq!(
        said(&[("MCP_GREETING", "hello-from-the-process")]),
        "hello-from-the-process"
    );
}
