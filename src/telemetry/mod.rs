//! The process's logs and traces, set up once at start by the CLI (`runner serve` included).
//!
//! Logs: `RUNNER_LOG` (or `RUST_LOG`) is a filter in `RUST_LOG` syntax; `RUNNER_LOG_FORMAT`
//! is `text` (the default) or `json`; they go to stderr, never to stdout. Traces: when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, the spans of
//! the crate are exported over OTLP (`otlp.rs`). With neither, no subscriber is installed at
//! all: every span and event of the code base is a disabled callsite.
//!
//! It builds on the providers' content switch (prompts and completions in spans) and the
//! network's client builder; nothing below the CLI imports it.

mod otlp;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Environment variables read here, besides the standard `OTEL_*` ones the exporter reads.
pub const RUNNER_LOG: &str = "RUNNER_LOG";
pub const RUNNER_LOG_FORMAT: &str = "RUNNER_LOG_FORMAT";
pub const RUNNER_TRACE_CONTENT: &str = "RUNNER_TRACE_CONTENT";

/// What the process installed; dropping it flushes and shuts down the trace exporter.
#[derive(Default)]
#[must_use = "dropping it at once would shut the trace exporter down"]
pub struct Telemetry {
    traces: Option<otlp::Exporter>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.traces.is_some()
    }

    /// Exports the spans still buffered and stops the exporter.
    pub fn shutdown(mut self) -> Result<(), String> {
        self.traces.take().map_or(Ok(()), otlp::Exporter::shutdown)
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(traces) = self.traces.take() {
            let _ = traces.shutdown();
        }
    }
}

/// Installs the process's subscriber from the environment `env` reads. `default_log` is the
/// log filter used when neither `RUNNER_LOG` nor `RUST_LOG` is set (`None`: no logs). Returns
/// what it installed, and warnings for the caller to show (a bad filter, an exporter that could
/// not be built): neither stops the program.
pub fn init(env: &dyn Fn(&str) -> Option<String>, default_log: Option<&str>) -> (Telemetry, Vec<String>) {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let mut warnings = Vec::new();
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::new();

    let filter = set(RUNNER_LOG)
        .map(|f| (RUNNER_LOG, f))
        .or_else(|| set("RUST_LOG").map(|f| ("RUST_LOG", f)))
        .or_else(|| default_log.map(|f| ("the default filter", f.to_string())));
    if let Some((source, filter)) = filter {
        match EnvFilter::builder().parse(&filter) {
            Ok(filter) => layers.push(log_layer(set(RUNNER_LOG_FORMAT).as_deref(), filter, &mut warnings)),
            Err(e) => warnings.push(format!(
                "{source}: `{filter}` is not a log filter ({e}); logging nothing"
            )),
        }
    }

    let content = set(RUNNER_TRACE_CONTENT).is_some_and(|v| truthy(&v))
        || set("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT").is_some_and(|v| truthy(&v));
    crate::providers::trace::set_capture_content(content);

    let mut traces = None;
    if otlp::wanted(&set) {
        match otlp::Exporter::start(&set) {
            Ok((exporter, layer)) => {
                layers.push(layer);
                traces = Some(exporter);
            }
            Err(e) => warnings.push(format!("traces are not exported: {e}")),
        }
    }

    if layers.is_empty() {
        return (Telemetry::default(), warnings);
    }
    if let Err(e) = tracing_subscriber::registry().with(layers).try_init() {
        warnings.push(format!("logs and traces are not set up: {e}"));
    }
    (Telemetry { traces }, warnings)
}

/// Log lines to stderr, as text (coloured on a terminal unless `NO_COLOR` is set) or JSON.
fn log_layer(
    format: Option<&str>,
    filter: EnvFilter,
    warnings: &mut Vec<String>,
) -> Box<dyn Layer<Registry> + Send + Sync> {
    use std::io::IsTerminal;
    let json = match format.map(str::to_ascii_lowercase).as_deref() {
        None | Some("text") => false,
        Some("json") => true,
        Some(other) => {
            warnings.push(format!(
                "{RUNNER_LOG_FORMAT}: `{other}` is neither `text` nor `json`; using text"
            ));
            false
        }
    };
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if json {
        layer
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed()
    } else {
        let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        layer.with_ansi(colour).with_filter(filter).boxed()
    }
}

fn truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}
