//! The network: one way to build HTTP clients, so every outbound request of the product
//! (model providers, web kinds) shares the TLS setup and the user agent.

use std::sync::Once;

/// The User-Agent every request carries.
pub const USER_AGENT: &str = concat!("runner/", env!("CARGO_PKG_VERSION"));

/// A client builder with the product's TLS (rustls with ring, the platform's roots) and
/// user agent. Callers add their timeouts, redirect policy and the like.
pub fn client_builder() -> reqwest::ClientBuilder {
    static TLS: Once = Once::new();
    TLS.call_once(|| {
        // Fails only when another provider was installed first, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder().user_agent(USER_AGENT)
}

#[cfg(test)]
mod tests {
    #[test]
    fn builds_a_client() {
        super::client_builder().build().unwrap();
    }
}
