//! The network: one way to build HTTP clients, so every outbound request of the product
//! (model providers, web kinds) shares the TLS setup and the user agent; and the web client of
//! the I/O kinds (`web.rs`) with its SSRF guard (`guard.rs`), robots.txt (`robots.rs`),
//! main-content extraction (`extract.rs`) and its exchanges as cassette data (`record.rs`).
//! Secrets are scrubbed with the leaf `crate::secrets`; exchanges pass through `crate::cassette`,
//! which knows nothing of the network.

pub mod extract;
pub mod guard;
pub mod http_error;
mod record;
pub mod robots;
mod trace;
mod web;

pub use guard::AllowList;
pub(crate) use trace::redacted_url;
pub use web::{FetchError, FetchOptions, Oversize, Request, Response, Web, WebConfig, host_of};

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

/// A URL in the form used to tell duplicates apart: scheme and host lowercased, no fragment,
/// no `utm_*` parameters, no default port, no trailing slash. Text that is not a URL is
/// returned trimmed.
pub fn normalize_url(raw: &str) -> String {
    let Ok(mut u) = url::Url::parse(raw.trim()) else {
        return raw.trim().to_string();
    };
    u.set_fragment(None);
    let kept: Vec<(String, String)> = u
        .query_pairs()
        .filter(|(k, _)| !k.to_ascii_lowercase().starts_with("utm_"))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if kept.is_empty() {
        u.set_query(None);
    } else {
        u.query_pairs_mut().clear().extend_pairs(kept);
    }
    let mut s = u.to_string();
    if u.query().is_none() && s.ends_with('/') {
        s.pop();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::normalize_url;

    #[test]
    fn urls_normalize_for_deduplication() {
        for (raw, want) in [
            ("HTTPS://Example.COM/Path/", "https://example.com/Path"),
            ("https://example.com/a#section", "https://example.com/a"),
            (
                "https://example.com/a?utm_source=x&id=3&UTM_medium=y",
                "https://example.com/a?id=3",
            ),
            ("https://example.com/?utm_campaign=z", "https://example.com"),
            ("http://example.com:80/a/", "http://example.com/a"),
            ("  https://example.com/a?b=1  ", "https://example.com/a?b=1"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(normalize_url(raw), want, "{raw}");
        }
    }

    #[test]
    fn builds_a_client() {
        super::client_builder().build().unwrap();
    }
}
