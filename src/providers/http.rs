//! What every HTTP provider shares: the API key (kept out of every message), HTTP statuses and
//! transport failures mapped to typed errors, Retry-After, the per-call deadline, and reading
//! a response body as server-sent events.

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use reqwest::header::HeaderMap;

use super::ProviderError;
use super::sse;

/// How much of a server's error body a message quotes.
const EXCERPT: usize = 300;

/// An API key. Its value is only ever written into request headers: `Debug` hides it and
/// [`Key::scrub`] removes it from any text that might have picked it up (servers echo keys in
/// error bodies).
#[derive(Clone, Default)]
pub struct Key(Option<String>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Key(***)" } else { "Key(none)" })
    }
}

impl Key {
    pub fn new(value: Option<String>) -> Key {
        Key(value.filter(|v| !v.is_empty()))
    }

    pub fn value(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// `text` with every occurrence of the key replaced by `***`.
    pub fn scrub(&self, text: &str) -> String {
        match self.value() {
            // A very short "key" would blank unrelated text; such keys are not secrets anyway.
            Some(k) if k.len() >= 4 => text.replace(k, "***"),
            _ => text.to_string(),
        }
    }

    /// `e` with the key scrubbed from its message.
    pub fn scrub_error(&self, e: ProviderError) -> ProviderError {
        use ProviderError::*;
        match e {
            Server { status, message } => Server {
                status,
                message: self.scrub(&message),
            },
            Network(m) => Network(self.scrub(&m)),
            StreamCut(m) => StreamCut(self.scrub(&m)),
            BadRequest(m) => BadRequest(self.scrub(&m)),
            Auth(m) => Auth(self.scrub(&m)),
            Malformed(m) => Malformed(self.scrub(&m)),
            e @ (RateLimited { .. } | Timeout) => e,
        }
    }
}

/// Runs `call` under the profile's per-call deadline.
pub async fn deadline<T>(
    limit: Option<Duration>,
    call: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, call)
            .await
            .unwrap_or(Err(ProviderError::Timeout)),
        None => call.await,
    }
}

/// A request that got no answer.
pub fn send_error(e: &reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::Timeout
    } else {
        ProviderError::Network(chain(e))
    }
}

/// An error with its causes, which is where reqwest says what actually failed.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The error for a non-success status, quoting the server's message.
pub fn status_error(status: u16, headers: &HeaderMap, body: &str) -> ProviderError {
    let message = excerpt(body);
    match status {
        429 => ProviderError::RateLimited {
            retry_after: retry_after(headers, SystemTime::now()),
        },
        401 | 403 => ProviderError::Auth(format!("{status}: {message}")),
        500..=599 => ProviderError::Server { status, message },
        _ => ProviderError::BadRequest(format!("{status}: {message}")),
    }
}

/// The server's error message: `error.message` (or `message`, or `error` as text) from a JSON
/// body, else the body itself, shortened.
pub fn excerpt(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let found = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error").filter(|e| e.is_string()))
            .or_else(|| v.get("detail").filter(|e| e.is_string()))
            .and_then(|m| m.as_str())
    });
    let text = found.unwrap_or(body).trim();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        return "(no message)".into();
    }
    match text.char_indices().nth(EXCERPT) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

/// The wait a 429 asks for: `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<f64> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(ms / 1000.0);
    }
    let value = get("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then_some(secs);
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).map_or(0.0, |d| d.as_secs_f64()))
}

/// Reads a response body as server-sent events, handing each to `on_event` until it returns
/// `Ok(true)` (the stream's own end marker) or the body ends. Returns whether the end marker
/// came; a body that breaks off is [`ProviderError::StreamCut`].
pub async fn read_events(
    response: reqwest::Response,
    mut on_event: impl FnMut(sse::Event) -> Result<bool, ProviderError>,
) -> Result<bool, ProviderError> {
    let mut parser = sse::Parser::new();
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            if e.is_timeout() {
                ProviderError::Timeout
            } else {
                ProviderError::StreamCut(chain(&e))
            }
        })?;
        for event in parser.push(&chunk) {
            if on_event(event)? {
                return Ok(true);
            }
        }
    }
    match parser.finish() {
        Some(event) => on_event(event),
        None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use reqwest::header::{HeaderMap, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after(&headers(&[("retry-after", "7")]), now), Some(7.0));
        assert_eq!(retry_after(&headers(&[("retry-after", "1.5")]), now), Some(1.5));
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "250"), ("retry-after", "9")]), now),
            Some(0.25)
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(retry_after(&headers(&[("retry-after", &later)]), now), Some(30.0));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(retry_after(&headers(&[("retry-after", &earlier)]), now), Some(0.0));
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&headers(&[]), now), None);
    }

    #[test]
    fn statuses_map_to_classes() {
        let h = headers(&[("retry-after", "2")]);
        assert_eq!(
            status_error(429, &h, ""),
            ProviderError::RateLimited { retry_after: Some(2.0) }
        );
        assert!(matches!(status_error(401, &h, ""), ProviderError::Auth(_)));
        assert!(matches!(status_error(403, &h, ""), ProviderError::Auth(_)));
        assert!(matches!(
            status_error(503, &h, ""),
            ProviderError::Server { status: 503, .. }
        ));
        assert!(matches!(status_error(404, &h, ""), ProviderError::BadRequest(_)));
    }

    #[test]
    fn excerpts_prefer_the_json_message_and_stay_short() {
        assert_eq!(
            excerpt(r#"{"error": {"message": "bad model", "type": "x"}}"#),
            "bad model"
        );
        assert_eq!(excerpt(r#"{"error": "overloaded"}"#), "overloaded");
        assert_eq!(excerpt("  plain\n text "), "plain text");
        assert_eq!(excerpt(""), "(no message)");
        let long = "x".repeat(1000);
        assert_eq!(excerpt(&long).chars().count(), EXCERPT + 1);
    }

    #[test]
    fn keys_are_scrubbed_and_never_debug_printed() {
        let key = Key::new(Some("sk-secret-123".into()));
        assert_eq!(key.scrub("bad key sk-secret-123!"), "bad key ***!");
        assert_eq!(format!("{key:?}"), "Key(***)");
        let e = key.scrub_error(ProviderError::Auth("401: sk-secret-123 is wrong".into()));
        assert_eq!(e, ProviderError::Auth("401: *** is wrong".into()));
        assert_eq!(Key::new(Some(String::new())).value(), None);
    }
}
