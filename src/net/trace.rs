//! The span of a web request, following OpenTelemetry's HTTP client conventions. The URL is
//! recorded without credentials: user info, query values whose names say they are secrets, and
//! every known secret are replaced by `REDACTED`.

use tracing::{Span, field};
use url::Url;

use super::web::{FetchError, Request, Response};

/// The span of one request (its redirects included).
pub(super) fn request(req: &Request) -> Span {
    let span = tracing::info_span!(
        "http.request",
        otel.name = field::Empty,
        otel.kind = "client",
        otel.status_code = field::Empty,
        http.request.method = %req.method,
        url.full = field::Empty,
        server.address = field::Empty,
        http.response.status_code = field::Empty,
        "error.type" = field::Empty,
    );
    if !span.is_disabled() {
        span.record("otel.name", req.method.as_str());
        span.record("url.full", redacted_url(&req.url).as_str());
        if let Some(host) = Url::parse(&req.url).ok().and_then(|u| u.host_str().map(str::to_string)) {
            span.record("server.address", host.as_str());
        }
    }
    span
}

/// Records the outcome of a request on its span.
pub(super) fn response(span: &Span, result: &Result<Response, FetchError>) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(r) => {
            span.record("http.response.status_code", r.status);
            if r.status >= 400 {
                span.record("error.type", r.status.to_string().as_str());
                span.record("otel.status_code", "ERROR");
            }
        }
        Err(e) => {
            span.record("error.type", e.class.name());
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// `raw` with its credentials replaced by `REDACTED`.
pub(crate) fn redacted_url(raw: &str) -> String {
    const REDACTED: &str = "REDACTED";
    let Ok(mut url) = Url::parse(raw) else {
        return crate::secrets::scrub(raw).into_owned();
    };
    if !url.username().is_empty() {
        let _ = url.set_username(REDACTED);
    }
    if url.password().is_some() {
        let _ = url.set_password(Some(REDACTED));
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let secret = is_secret_param(&k);
                (
                    k.into_owned(),
                    if secret { REDACTED.to_string() } else { v.into_owned() },
                )
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    crate::secrets::scrub(url.as_str()).into_owned()
}

/// Whether a query parameter's name says its value is a credential.
fn is_secret_param(name: &str) -> bool {
    let lower = name.to_ascii_lowercase().replace('-', "_");
    crate::secrets::is_secret_name(&lower)
        || [
            "key",
            "apikey",
            "token",
            "access_token",
            "secret",
            "password",
            "signature",
            "sig",
            "x_goog_signature",
            "awsaccesskeyid",
            "x_amz_signature",
            "x_amz_credential",
        ]
        .contains(&lower.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        let cases = [
            ("https://a.test/p?q=rust&page=2", "https://a.test/p?q=rust&page=2"),
            ("https://u:pw@a.test/", "https://REDACTED:REDACTED@a.test/"),
            (
                "https://a.test/s?q=x&api_key=abc&token=t&X-Amz-Signature=s",
                "https://a.test/s?q=x&api_key=REDACTED&token=REDACTED&X-Amz-Signature=REDACTED",
            ),
            (
                "https://a.test/s?Brave_Token=zzz",
                "https://a.test/s?Brave_Token=REDACTED",
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(redacted_url(raw), want, "{raw}");
        }
    }
}
