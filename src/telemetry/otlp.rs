//! The OTLP trace exporter: HTTP/protobuf by default, gRPC when `OTEL_EXPORTER_OTLP_PROTOCOL`
//! (or `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`) is `grpc`. Endpoint, headers, timeout and the
//! resource's attributes come from the standard `OTEL_*` variables, read by the exporter and
//! the SDK themselves.
//!
//! Spans are batched and sent from a runtime of the exporter's own (one worker thread), so the
//! exporter does not depend on which runtime, if any, a command runs; the batch still buffered
//! is sent when the process ends ([`Exporter::shutdown`]).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::{Layer, Registry};

/// Whether the environment asks for traces.
pub(super) fn wanted(env: &dyn Fn(&str) -> Option<String>) -> bool {
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    !disabled && (env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some())
}

/// The running exporter.
pub(super) struct Exporter {
    provider: SdkTracerProvider,
    runtime: tokio::runtime::Runtime,
}

impl Exporter {
    /// Starts the exporter, and the layer that turns the crate's spans into OpenTelemetry spans.
    pub(super) fn start(
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Exporter, Box<dyn Layer<Registry> + Send + Sync>), String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-export")
            .enable_all()
            .build()
            .map_err(|e| format!("no runtime for the exporter: {e}"))?;
        // The gRPC channel and the batch task are spawned on the exporter's runtime.
        let entered = runtime.enter();
        let protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"));
        let exporter = match protocol.as_deref().map(str::trim) {
            Some("grpc") => SpanExporter::builder().with_tonic().build(),
            None | Some("http/protobuf") => http_exporter(),
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL `{other}` is not supported (`http/protobuf` or `grpc`)"
                ));
            }
        }
        .map_err(|e| e.to_string())?;
        let mut resource = Resource::builder();
        if env("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("runner");
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build())
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("runner");
        // Only the crate's own spans: the exporter's HTTP and gRPC libraries are not traced
        // into the traces they send.
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(Targets::new().with_target("runner", Level::INFO))
            .boxed();
        drop(entered);
        Ok((Exporter { provider, runtime }, layer))
    }

    /// Sends what is buffered, then stops.
    pub(super) fn shutdown(self) -> Result<(), String> {
        let result = self.provider.shutdown().map_err(|e| e.to_string());
        self.runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        result
    }
}

fn http_exporter() -> Result<SpanExporter, opentelemetry_otlp::ExporterBuildError> {
    let client = crate::net::client_builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| opentelemetry_otlp::ExporterBuildError::InternalFailure(e.to_string()))?;
    SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(Client(client))
        .build()
}

/// The exporter's HTTP client: the product's own reqwest client.
#[derive(Debug)]
struct Client(reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let resp = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.bytes().await?;
        let mut out = http::Response::builder().status(status);
        if let Some(h) = out.headers_mut() {
            *h = headers;
        }
        Ok(out.body(body)?)
    }
}
