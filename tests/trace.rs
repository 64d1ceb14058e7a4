//! Traces through the real binary: `runner run` with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at
//! an OTLP receiver on loopback — over HTTP/protobuf, or over gRPC served by tonic with the
//! collector's generated service — that decodes the real protobuf, and the span tree and the
//! GenAI attributes it receives.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;

use crate::support;

const PARENT: &str = r#"
name: parent
models: {default: {provider: mock, model: m-large, max_tokens: 300}}
input: {type: object, required: [topic], properties: {topic: {type: string}}}
output: [draft, polished]
state:
  draft: {type: string, default: ""}
  polished: {type: string, default: ""}
nodes:
  draft:
    kind: llm
    prompt: {text: "Write about {{ input.topic }}."}
    update: {draft: output}
  inner:
    kind: subgraph
    workflow: child.yaml
    input: {text: state.draft}
    update: {polished: output.polished}
edges: [START -> draft -> inner -> END]
"#;

const CHILD: &str = r#"
name: child
models: {default: {provider: mock, model: m-small}}
input: {type: object, required: [text], properties: {text: {type: string}}}
output: [polished]
state:
  polished: {type: string, default: ""}
nodes:
  polish:
    kind: llm
    prompt: {text: "Polish: {{ input.text }}"}
    update: {polished: output}
edges: [START -> polish -> END]
"#;

const MOCK: &str = r#"
replies:
  draft: [{text: "Tides rise twice a day.", usage: {prompt_tokens: 120, completion_tokens: 8}}]
  "*": [{text: "Tides rise, twice daily.", usage: {prompt_tokens: 30, completion_tokens: 6}}]
"#;

/// One received span, flattened.
#[derive(Debug, Clone)]
pub(crate) struct Span {
    pub(crate) trace: Vec<u8>,
    pub(crate) id: Vec<u8>,
    pub(crate) parent: Vec<u8>,
    pub(crate) name: String,
    pub(crate) attrs: HashMap<String, String>,
}

/// The spans of one export request, flattened, added to `sink`.
fn collect(request: ExportTraceServiceRequest, sink: &Mutex<Vec<Span>>) {
    let mut out = sink.lock().unwrap();
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            for s in scope.spans {
                out.push(Span {
                    trace: s.trace_id,
                    id: s.span_id,
                    parent: s.parent_span_id,
                    name: s.name,
                    attrs: s
                        .attributes
                        .into_iter()
                        .map(|kv| (kv.key, kv.value.and_then(|v| v.value).map(text).unwrap_or_default()))
                        .collect(),
                });
            }
        }
    }
}

/// An OTLP/HTTP trace receiver on loopback: every span of every export request it is sent.
pub(crate) fn receiver() -> (support::Served, Arc<Mutex<Vec<Span>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let sink = spans.clone();
    let served = support::serve("127.0.0.1", move |_| {
        Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let sink = sink.clone();
                async move {
                    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export request");
                    collect(request, &sink);
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        )
    });
    (served, spans)
}

/// The collector's gRPC trace service, keeping what it is sent.
struct GrpcTraces(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for GrpcTraces {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        collect(request.into_inner(), &self.0);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC trace receiver on loopback (tonic serving the collector's generated service).
struct GrpcReceiver {
    addr: std::net::SocketAddr,
    /// Every span of every export call.
    spans: Arc<Mutex<Vec<Span>>>,
    /// Dropped, it stops the server.
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

fn grpc_receiver() -> GrpcReceiver {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind a loopback port");
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = TraceServiceServer::new(GrpcTraces(spans.clone()));
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let incoming = futures::stream::unfold(listener, |l| async move {
                let accepted = l.accept().await.map(|(stream, _)| stream);
                Some((accepted, l))
            });
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
    });
    GrpcReceiver {
        addr,
        spans,
        stop,
        thread,
    }
}

fn text(v: Any) -> String {
    match v {
        Any::StringValue(s) => s,
        Any::IntValue(i) => i.to_string(),
        Any::BoolValue(b) => b.to_string(),
        Any::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn run(dir: &Path, env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("runner"));
    cmd.current_dir(dir);
    for var in [
        "RUNNER_LOG",
        "RUST_LOG",
        "RUNNER_TRACE_CONTENT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_SDK_DISABLED",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args([
        "run",
        "parent.yaml",
        "--mock",
        "mock.yaml",
        "--db",
        ":memory:",
        "--input",
        "topic=tides",
    ])
    .output()
    .unwrap()
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [("parent.yaml", PARENT), ("child.yaml", CHILD), ("mock.yaml", MOCK)] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

/// The one span named `name` whose parent is named `parent`.
fn child_named<'a>(spans: &'a [Span], name: &str, parent: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == name && parent_of(spans, s).is_some_and(|p| p.name == parent))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one span `{name}` under `{parent}` in {:#?}",
        names(spans)
    );
    found[0]
}

/// The one span named `name`.
fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one span named `{name}` in {:#?}", names(spans));
    found[0]
}

fn parent_of<'a>(spans: &'a [Span], s: &Span) -> Option<&'a Span> {
    spans.iter().find(|p| p.id == s.parent)
}

fn names(spans: &[Span]) -> Vec<(String, Option<String>)> {
    spans
        .iter()
        .map(|s| (s.name.clone(), parent_of(spans, s).map(|p| p.name.clone())))
        .collect()
}

#[test]
fn a_run_is_one_trace_of_steps_tasks_model_calls_and_its_subgraph() {
    let dir = project();
    let (served, spans) = receiver();
    let out = run(
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{}", served.addr)),
            ("RUNNER_TRACE_CONTENT", "1".into()),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The result alone on stdout: tracing writes nothing there.
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON result");
    assert_eq!(result["polished"], "Tides rise, twice daily.");

    // The process exported everything before it exited.
    check_tree(&spans.lock().unwrap());
}

#[test]
fn a_run_traced_over_grpc_is_the_same_tree() {
    let dir = project();
    let GrpcReceiver {
        addr,
        spans,
        stop,
        thread,
    } = grpc_receiver();
    let out = run(
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into()),
            ("RUNNER_TRACE_CONTENT", "1".into()),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON result");
    assert_eq!(result["polished"], "Tides rise, twice daily.");
    // The process exported everything over gRPC before it exited.
    check_tree(&spans.lock().unwrap());
    drop(stop);
    thread.join().unwrap();
}

/// The span tree of one run of `parent.yaml` with content traced: one trace, run → step →
/// task → model call, the subgraph's run nested under its task, the GenAI attributes.
fn check_tree(spans: &[Span]) {
    let spans = spans.to_vec();
    let root = named(&spans, "run parent");
    assert!(root.parent.is_empty(), "the run is the trace's root");
    assert!(
        spans.iter().all(|s| s.trace == root.trace),
        "one trace: {:#?}",
        names(&spans)
    );
    assert_eq!(root.attrs["runner.workflow"], "parent");
    assert_eq!(root.attrs["runner.status"], "done");
    assert!(!root.attrs["runner.thread_id"].is_empty());

    // run → step → task → chat, for the parent's own model call.
    let draft_call = child_named(&spans, "chat m-large", "task draft");
    let task = parent_of(&spans, draft_call).unwrap();
    assert_eq!(task.attrs["runner.node"], "draft");
    assert_eq!(task.attrs["runner.attempt"], "1");
    let step = parent_of(&spans, task).unwrap();
    assert_eq!(
        (step.name.as_str(), step.attrs["runner.step"].as_str()),
        ("step 1", "1")
    );
    assert_eq!(parent_of(&spans, step).unwrap().id, root.id);

    let a = &draft_call.attrs;
    assert_eq!(a["gen_ai.operation.name"], "chat");
    assert_eq!(a["gen_ai.provider.name"], "mock");
    assert_eq!(a["gen_ai.request.model"], "m-large");
    assert_eq!(a["gen_ai.request.max_tokens"], "300");
    assert_eq!(a["gen_ai.response.model"], "m-large");
    assert_eq!(a["gen_ai.usage.input_tokens"], "120");
    assert_eq!(a["gen_ai.usage.output_tokens"], "8");
    assert!(a["gen_ai.input.messages"].contains("Write about tides."), "{a:?}");
    assert!(a["gen_ai.output.messages"].contains("Tides rise twice a day."), "{a:?}");

    // The subgraph's run nests under the task that runs it, its model call under its task.
    let child = named(&spans, "run child");
    assert_eq!(parent_of(&spans, child).unwrap().name, "task inner");
    // (A child's profiles are its parent's where their names agree: `default` is `m-large`.)
    let polish_call = child_named(&spans, "chat m-large", "task polish");
    let polish = parent_of(&spans, polish_call).unwrap();
    let child_step = parent_of(&spans, polish).unwrap();
    assert_eq!(parent_of(&spans, child_step).unwrap().id, child.id);
    assert_eq!(polish_call.attrs["gen_ai.usage.input_tokens"], "30");

    // Checkpoint commits belong to the runs that made them.
    let commits: Vec<&Span> = spans.iter().filter(|s| s.name == "checkpoint.commit").collect();
    assert!(!commits.is_empty(), "{:#?}", names(&spans));
    for c in commits {
        let mut up = parent_of(&spans, c);
        while let Some(p) = up.filter(|p| !p.name.starts_with("run ")) {
            up = parent_of(&spans, p);
        }
        assert!(up.is_some(), "a commit outside any run: {:#?}", names(&spans));
    }
}

#[test]
fn content_is_left_out_unless_asked_for() {
    let dir = project();
    let (served, spans) = receiver();
    let out = run(
        dir.path(),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{}", served.addr))],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let spans = spans.lock().unwrap().clone();
    let call = child_named(&spans, "chat m-large", "task draft");
    assert_eq!(call.attrs["gen_ai.usage.output_tokens"], "8");
    assert!(!call.attrs.contains_key("gen_ai.input.messages"), "{:?}", call.attrs);
    assert!(!call.attrs.contains_key("gen_ai.output.messages"), "{:?}", call.attrs);
}

#[test]
fn logs_go_to_stderr_as_json_lines_and_nothing_is_logged_unless_asked() {
    let dir = project();
    let quiet = run(dir.path(), &[]);
    assert!(quiet.status.success());
    let quiet_err = String::from_utf8_lossy(&quiet.stderr).into_owned();
    // Only the progress view: the thread's id.
    assert!(quiet_err.lines().all(|l| l.starts_with("thread: ")), "{quiet_err}");

    let out = run(
        dir.path(),
        &[
            ("RUNNER_LOG", "runner=debug".into()),
            ("RUNNER_LOG_FORMAT", "json".into()),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, quiet.stdout, "logging changes nothing on stdout");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (progress, logs): (Vec<&str>, Vec<&str>) = stderr.lines().partition(|l| l.starts_with("thread: "));
    assert_eq!(
        progress.len(),
        quiet_err.lines().count(),
        "the progress view is unchanged"
    );
    let logs: Vec<serde_json::Value> = logs
        .into_iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not a JSON log line: {l}")))
        .collect();
    let ended: Vec<&serde_json::Value> = logs.iter().filter(|l| l["fields"]["message"] == "run ended").collect();
    assert_eq!(ended.len(), 2, "the run and its subgraph's: {logs:#?}");
    assert!(
        ended
            .iter()
            .all(|l| l["fields"]["status"] == "done" && l["level"] == "INFO"),
        "{ended:#?}"
    );
    assert!(
        logs.iter()
            .any(|l| l["fields"]["message"] == "model call" && l["fields"]["output_tokens"] == 8),
        "{logs:#?}"
    );
}
