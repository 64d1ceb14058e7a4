//! What every HTTP provider shares: the API key (kept out of every message), HTTP statuses and
//! transport failures mapped to typed errors (through `net::http_error`, the vocabulary the web
//! client shares), Retry-After, the limits of a call (total deadline, idle stream, reply size),
//! and reading a response body as server-sent events.

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use reqwest::header::HeaderMap;

use super::ProviderError;
use super::sse;
use crate::error_class::ErrorClass;
use crate::net::http_error::{self, EXCERPT_CHARS};
use crate::spec::ModelProfile;

/// How much of a server's message is kept until the key has been scrubbed from it; the final
/// cut (after scrubbing, in [`Key::scrub_error`]) is far shorter, so a key straddling this
/// first cut never survives.
const RAW_EXCERPT_CHARS: usize = 16 * 1024;

/// How much of an error response's body is read.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The total deadline of a model call when its profile sets no `timeout`.
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);
/// The longest a response that has started may go without a byte when its profile sets no
/// `idle_timeout`.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest reply (text and tool calls) when its profile sets no `max_reply_bytes`.
pub(crate) const DEFAULT_MAX_REPLY_BYTES: u64 = 1024 * 1024;
/// How much larger than the reply the body on the wire may be: a stream frames every few
/// tokens in an event of JSON.
const WIRE_FACTOR: usize = 16;

/// The bounds of one model call, from its profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// The whole call, the reply read included.
    pub deadline: Duration,
    /// Between two pieces of a response's body, once the response has started.
    pub idle: Duration,
    /// The reply's text and tool calls, in bytes.
    pub max_reply: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: DEFAULT_DEADLINE,
            idle: DEFAULT_IDLE_TIMEOUT,
            max_reply: DEFAULT_MAX_REPLY_BYTES as usize,
        }
    }
}

impl Limits {
    pub fn of(profile: &ModelProfile) -> Limits {
        let d = Limits::default();
        Limits {
            deadline: profile.timeout.as_ref().and_then(|t| t.to_std()).unwrap_or(d.deadline),
            idle: profile.idle_timeout.as_ref().and_then(|t| t.to_std()).unwrap_or(d.idle),
            max_reply: profile
                .max_reply_bytes
                .map_or(d.max_reply, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }

    /// The most bytes a response body may have on the wire.
    fn max_body(&self) -> usize {
        self.max_reply.saturating_mul(WIRE_FACTOR)
    }

    /// The error for a reply past [`Limits::max_reply`].
    pub fn too_large(&self) -> ProviderError {
        ProviderError::TooLarge(format!(
            "the reply is larger than {} bytes (the profile's `max_reply_bytes`)",
            self.max_reply
        ))
    }

    /// Fails when `len` bytes of reply are more than allowed.
    pub fn check_reply(&self, len: usize) -> Result<(), ProviderError> {
        if len > self.max_reply {
            Err(self.too_large())
        } else {
            Ok(())
        }
    }
}

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

    /// `text` with every occurrence of the key replaced by `***`, and every other secret the
    /// process knows ([`crate::secrets`]) redacted.
    pub fn scrub(&self, text: &str) -> String {
        let text = match self.value() {
            // A very short "key" would blank unrelated text; such keys are not secrets anyway.
            Some(k) if k.len() >= 4 => text.replace(k, "***"),
            _ => text.to_string(),
        };
        crate::secrets::scrub_string(text)
    }

    /// `e` with the key scrubbed from its message, which is then shortened: every error
    /// leaving a provider passes here, so no excerpt is cut before it is scrubbed.
    pub fn scrub_error(&self, e: ProviderError) -> ProviderError {
        use ProviderError::*;
        let clean = |m: &str| http_error::excerpt(m, |t| self.scrub(t), 2 * EXCERPT_CHARS);
        match e {
            Server { status, message } => Server {
                status,
                message: clean(&message),
            },
            Network(m) => Network(clean(&m)),
            StreamCut(m) => StreamCut(clean(&m)),
            BadRequest(m) => BadRequest(clean(&m)),
            Auth(m) => Auth(clean(&m)),
            ContextLength(m) => ContextLength(clean(&m)),
            Malformed(m) => Malformed(clean(&m)),
            TooLarge(m) => TooLarge(clean(&m)),
            e @ (RateLimited { .. } | Timeout) => e,
        }
    }
}

/// Runs `call` under the call's total deadline.
pub(crate) async fn deadline<T>(
    limits: &Limits,
    call: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    tokio::time::timeout(limits.deadline, call)
        .await
        .unwrap_or(Err(ProviderError::Timeout))
}

/// Sends a request. Waiting for the response to start is bounded by the call's deadline
/// only: a model that thinks for minutes before a non-streamed reply is not idle.
pub(crate) async fn send(request: reqwest::RequestBuilder) -> Result<reqwest::Response, ProviderError> {
    request.send().await.map_err(|e| send_error(&e))
}

/// The next piece of a body, waiting at most the idle timeout for it.
async fn next_chunk(
    body: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    limits: &Limits,
) -> Result<Option<bytes::Bytes>, ProviderError> {
    match tokio::time::timeout(limits.idle, body.next()).await {
        Err(_) => Err(ProviderError::Timeout),
        Ok(None) => Ok(None),
        Ok(Some(Ok(chunk))) => Ok(Some(chunk)),
        Ok(Some(Err(e))) if e.is_timeout() => Err(ProviderError::Timeout),
        Ok(Some(Err(e))) => Err(ProviderError::StreamCut(chain(&e))),
    }
}

/// A whole (not streamed) reply body as text, read under the idle timeout, refused past
/// the size the call allows.
pub(crate) async fn read_body(response: reqwest::Response, limits: &Limits) -> Result<String, ProviderError> {
    let (bytes, complete) = read_up_to(response, limits.max_body(), limits).await?;
    if !complete {
        return Err(limits.too_large());
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Up to `max` bytes of a body, and whether that was all of it.
async fn read_up_to(
    response: reqwest::Response,
    max: usize,
    limits: &Limits,
) -> Result<(Vec<u8>, bool), ProviderError> {
    let mut body = response.bytes_stream();
    let mut out = Vec::new();
    while let Some(chunk) = next_chunk(&mut body, limits).await? {
        if out.len() + chunk.len() > max {
            out.extend_from_slice(&chunk[..max - out.len()]);
            return Ok((out, false));
        }
        out.extend_from_slice(&chunk);
    }
    Ok((out, true))
}

/// The size of a reply as its profile's `max_reply_bytes` counts it: its text and the
/// arguments of its tool calls (OpenAI's shape).
pub(crate) fn reply_len(text: &str, tool_calls: &[serde_json::Value]) -> usize {
    let args = tool_calls
        .iter()
        .map(|c| {
            c.pointer("/function/arguments")
                .and_then(serde_json::Value::as_str)
                .map_or(0, str::len)
        })
        .sum::<usize>();
    text.len().saturating_add(args)
}

/// The typed error of a response with a non-success status, its body (the first part of it)
/// quoted.
pub(crate) async fn error_response(response: reqwest::Response, limits: &Limits) -> ProviderError {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = match read_up_to(response, MAX_ERROR_BODY, limits).await {
        Ok((bytes, _)) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => String::new(),
    };
    status_error(status, &headers, &text)
}

/// A request that got no answer.
pub(crate) fn send_error(e: &reqwest::Error) -> ProviderError {
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
pub(crate) fn status_error(status: u16, headers: &HeaderMap, body: &str) -> ProviderError {
    let message = excerpt(body);
    if is_context_overflow(status, body) {
        return ProviderError::ContextLength(format!("{status}: {message}"));
    }
    match http_error::class_of_status(status) {
        Some(ErrorClass::RateLimit) => ProviderError::RateLimited {
            retry_after: retry_after(headers, SystemTime::now()),
        },
        Some(ErrorClass::Timeout) => ProviderError::Timeout,
        Some(ErrorClass::Auth) => ProviderError::Auth(format!("{status}: {message}")),
        Some(ErrorClass::Server) => ProviderError::Server { status, message },
        _ => ProviderError::BadRequest(format!("{status}: {message}")),
    }
}

/// Whether a failed response says the prompt overflowed the model's context window: OpenAI's
/// `context_length_exceeded` (400), llama.cpp's `exceed_context_size_error` ("request (N
/// tokens) exceeds the available context size (M tokens)", 400) and its older "Context size
/// has been exceeded" (500), vLLM's and OpenAI's "maximum context length is N tokens",
/// Anthropic's "prompt is too long". Read from the body as the server sent it, before it is
/// shortened.
pub(crate) fn is_context_overflow(status: u16, body: &str) -> bool {
    if !matches!(status, 400 | 413 | 500) {
        return false;
    }
    let text = body.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "exceed_context_size",
        "exceeds the available context size",
        "context size has been exceeded",
        "maximum context length",
        "prompt is too long",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// The server's error message: `error.message` (or `message`, or `error` as text) from a JSON
/// body, else the body itself, its whitespace collapsed. It is only cut to a generous length
/// here: the short cut comes after the key is scrubbed ([`Key::scrub_error`]).
pub(crate) fn excerpt(body: &str) -> String {
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
    http_error::cut(&text, RAW_EXCERPT_CHARS)
}

/// The wait a 429 asks for: `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date,
/// capped at [`http_error::MAX_RETRY_AFTER`].
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<f64> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    http_error::retry_after(get("retry-after"), get("retry-after-ms"), now)
}

/// Reads a response body as server-sent events, handing each to `on_event` until it returns
/// `Ok(true)` (the stream's own end marker) or the body ends. Returns whether the end marker
/// came; a body that breaks off is [`ProviderError::StreamCut`], one silent for longer than the
/// idle timeout is [`ProviderError::Timeout`], one longer than the call allows on the wire is
/// [`ProviderError::TooLarge`].
pub(crate) async fn read_events(
    response: reqwest::Response,
    limits: &Limits,
    mut on_event: impl FnMut(sse::Event) -> Result<bool, ProviderError>,
) -> Result<bool, ProviderError> {
    let mut parser = sse::Parser::new();
    let mut body = response.bytes_stream();
    let mut read = 0usize;
    while let Some(chunk) = next_chunk(&mut body, limits).await? {
        read = read.saturating_add(chunk.len());
        if read > limits.max_body() {
            return Err(limits.too_large());
        }
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
        let max = http_error::MAX_RETRY_AFTER.as_secs_f64();
        assert_eq!(retry_after(&headers(&[("retry-after", "inf")]), now), Some(max));
        assert_eq!(retry_after(&headers(&[("retry-after", "1e300")]), now), Some(max));
    }

    #[test]
    fn every_call_is_bounded_by_default_and_profiles_override() {
        let profile = |v: serde_json::Value| -> ModelProfile { serde_json::from_value(v).unwrap() };
        let none = Limits::of(&profile(serde_json::json!({"provider": "openai", "model": "m"})));
        assert_eq!(none.deadline, Duration::from_secs(600));
        assert_eq!(none.idle, Duration::from_secs(120));
        assert_eq!(none.max_reply, 1024 * 1024);
        let set = Limits::of(&profile(serde_json::json!({"provider": "openai", "model": "m",
            "timeout": "2m", "idle_timeout": 5, "max_reply_bytes": 4096})));
        assert_eq!(
            (set.deadline, set.idle, set.max_reply),
            (Duration::from_secs(120), Duration::from_secs(5), 4096)
        );
        assert!(set.check_reply(4096).is_ok());
        assert!(matches!(set.check_reply(4097), Err(ProviderError::TooLarge(_))));
    }

    #[test]
    fn a_key_across_the_cut_is_scrubbed_whole() {
        let secret = format!("sk-{}", "k".repeat(39));
        let key = Key::new(Some(secret.clone()));
        for at in 0..3 * EXCERPT_CHARS {
            let body = format!(
                "{{\"error\": {{\"message\": \"{}{secret} is not valid\"}}}}",
                "x".repeat(at)
            );
            let e = key.scrub_error(status_error(401, &HeaderMap::new(), &body));
            let ProviderError::Auth(m) = e else { panic!("{e:?}") };
            assert!(!m.contains("sk-kkkk"), "at {at}: {m}");
        }
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
        let e = Key::default().scrub_error(ProviderError::Malformed(excerpt(&long)));
        assert_eq!(
            e,
            ProviderError::Malformed(format!("{}…", "x".repeat(2 * EXCERPT_CHARS)))
        );
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
