//! TLS for PostgreSQL connections: rustls with ring and the platform's roots, the same stack
//! as the product's HTTP client. Whether a connection uses it is the URL's `sslmode`.

use std::sync::Arc;

use rustls_platform_verifier::BuilderVerifierExt;
use tokio_postgres_rustls::MakeRustlsConnect;

pub(super) fn connector() -> Result<MakeRustlsConnect, String> {
    let failed = |e: rustls::Error| format!("cannot set up TLS for PostgreSQL: {e}");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(failed)?
        .with_platform_verifier()
        .map_err(failed)?
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}
