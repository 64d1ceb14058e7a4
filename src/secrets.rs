//! The process's known secret values, and the one scrubber every message, event payload,
//! stored value and cassette line passes through before it leaves the process.
//!
//! Known are: the values of environment variables whose names say they hold a credential
//! (`*_KEY`, `*_TOKEN`, `*_SECRET`, `*PASSWORD*`, read once, on first use), and every value
//! registered while running (a model profile's or a search engine's `api_key_env` variable,
//! every `${env:NAME}` expanded into a header). A value shorter than [`MIN_KNOWN_LEN`] is not
//! known: it is scrubbed from every node output, and replacing every `true` or `1234` there
//! would mangle data and protect nothing (a cassette still scrubs values from
//! [`MIN_SECRET_LEN`] on, and redacts credential headers whatever their length).
//!
//! Text is scrubbed whole and only then cut ([`excerpt`]): a secret placed across the cut
//! cannot leave a prefix behind.

use std::borrow::Cow;
use std::sync::{OnceLock, RwLock};

use serde_json::Value;

/// What replaces a secret.
pub(crate) const REDACTED: &str = "[redacted]";

/// Secrets shorter than this are not scrubbed.
pub(crate) const MIN_SECRET_LEN: usize = 4;

/// Values shorter than this are not known as secrets process-wide.
pub(crate) const MIN_KNOWN_LEN: usize = 8;

fn known() -> &'static RwLock<Vec<String>> {
    static KNOWN: OnceLock<RwLock<Vec<String>>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        let mut list = env_credentials();
        list.retain(|v| v.len() >= MIN_KNOWN_LEN);
        RwLock::new(sorted(list))
    })
}

/// Whether an environment variable's name says it holds a secret.
pub(crate) fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.ends_with("_KEY") || upper.ends_with("_TOKEN") || upper.ends_with("_SECRET") || upper.contains("PASSWORD")
}

/// The values of environment variables that hold secrets, by their names' convention.
pub(crate) fn env_credentials() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| is_secret_name(name))
        .map(|(_, value)| value)
        .collect()
}

/// Longest first (so a secret containing another is replaced whole), without short values or
/// duplicates.
pub(crate) fn sorted(mut secrets: Vec<String>) -> Vec<String> {
    secrets.retain(|s| s.len() >= MIN_SECRET_LEN);
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    secrets
}

/// Makes `value` a known secret from now on.
pub(crate) fn register(value: &str) {
    if value.len() < MIN_KNOWN_LEN {
        return;
    }
    let mut list = known().write().unwrap_or_else(|e| e.into_inner());
    if !list.iter().any(|s| s == value) {
        list.push(value.to_string());
        let taken = std::mem::take(&mut *list);
        *list = sorted(taken);
    }
}

/// Every known secret, longest first.
pub(crate) fn snapshot() -> Vec<String> {
    known().read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// `text` with every known secret replaced by [`REDACTED`].
pub(crate) fn scrub(text: &str) -> Cow<'_, str> {
    let list = known().read().unwrap_or_else(|e| e.into_inner());
    scrub_with(text, &list)
}

/// `text` with every one of `secrets` (longest first) replaced by [`REDACTED`].
pub(crate) fn scrub_with<'a>(text: &'a str, secrets: &[String]) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for secret in secrets {
        if secret.len() >= MIN_SECRET_LEN && out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    out
}

/// [`scrub`] over an owned string, allocating only when something is replaced.
pub(crate) fn scrub_string(text: String) -> String {
    match scrub(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(s) => s,
    }
}

/// `value` with every known secret replaced in every string, keys included (rebuilt only when
/// it holds one).
pub(crate) fn scrub_value(value: Value) -> Value {
    let list = known().read().unwrap_or_else(|e| e.into_inner());
    if list.is_empty() || !holds_any(&value, &list) {
        return value;
    }
    scrub_value_with(value, &list)
}

fn holds_any(value: &Value, secrets: &[String]) -> bool {
    let in_text = |s: &str| secrets.iter().any(|secret| s.contains(secret.as_str()));
    match value {
        Value::String(s) => in_text(s),
        Value::Array(items) => items.iter().any(|v| holds_any(v, secrets)),
        Value::Object(map) => map.iter().any(|(k, v)| in_text(k) || holds_any(v, secrets)),
        _ => false,
    }
}

/// `value` with every one of `secrets` replaced in every string, keys included.
pub(crate) fn scrub_value_with(value: Value, secrets: &[String]) -> Value {
    match value {
        Value::String(s) => Value::String(match scrub_with(&s, secrets) {
            Cow::Borrowed(_) => s,
            Cow::Owned(o) => o,
        }),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| scrub_value_with(v, secrets)).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (scrub_with(&k, secrets).into_owned(), scrub_value_with(v, secrets)))
                .collect(),
        ),
        other => other,
    }
}

/// The first `max_chars` characters of `text` after every known secret is scrubbed from the
/// whole of it (scrubbing first: a secret across the cut leaves no prefix).
pub(crate) fn excerpt(text: &str, max_chars: usize) -> String {
    scrub(text).chars().take(max_chars).collect()
}

/// Scrubs text that arrives in pieces (streamed tokens): a secret split across two pieces is
/// caught too. Each piece is released at once except a tail that could be the start of a
/// secret, which waits for the next piece (or [`StreamScrubber::finish`]); with no secret
/// known, nothing waits.
pub(crate) struct StreamScrubber {
    secrets: Vec<String>,
    held: std::sync::Mutex<String>,
}

impl StreamScrubber {
    /// A scrubber for the secrets known now.
    pub(crate) fn new() -> StreamScrubber {
        StreamScrubber::with(snapshot())
    }

    pub(crate) fn with(secrets: Vec<String>) -> StreamScrubber {
        StreamScrubber {
            secrets: sorted(secrets),
            held: std::sync::Mutex::new(String::new()),
        }
    }

    /// What of `piece` (after what was held) can be shown now, scrubbed.
    pub(crate) fn push(&self, piece: &str) -> String {
        if self.secrets.is_empty() {
            return piece.to_string();
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.push_str(piece);
        let text = scrub_with(&held, &self.secrets).into_owned();
        let keep = self.open_tail(&text);
        let (shown, tail) = text.split_at(text.len() - keep);
        *held = tail.to_string();
        shown.to_string()
    }

    /// Whatever is still held, scrubbed: the stream ended.
    pub(crate) fn finish(&self) -> String {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        scrub_with(&std::mem::take(&mut *held), &self.secrets).into_owned()
    }

    /// The length of the longest tail of `text` that a secret starts with (and is not whole).
    fn open_tail(&self, text: &str) -> usize {
        let longest = self.secrets.first().map_or(0, String::len);
        let from = text.len().saturating_sub(longest.saturating_sub(1));
        (from..text.len())
            .filter(|&i| text.is_char_boundary(i))
            .map(|i| &text[i..])
            .find(|tail| self.secrets.iter().any(|s| s.len() > tail.len() && s.starts_with(tail)))
            .map_or(0, str::len)
    }
}

impl Default for StreamScrubber {
    fn default() -> Self {
        StreamScrubber::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_across_the_cut_leaves_no_prefix() {
        let key = "sk-excerpt-0123456789abcdefghijklmnopqrstuvwxyz";
        register(key);
        let body = format!("{}{key} and more", "x".repeat(190));
        let shown = excerpt(&body, 200);
        for n in 8..=key.len() {
            assert!(!shown.contains(&key[..n]), "a {n}-byte prefix leaked: {shown}");
        }
        assert!(shown.ends_with("x[redacted]"), "{shown}");
    }

    #[test]
    fn values_are_scrubbed_everywhere_and_short_ones_never() {
        register("reg-secret-value");
        register("true");
        let v = serde_json::json!({"a": ["x reg-secret-value y"], "reg-secret-value": 1, "b": "true"});
        assert_eq!(
            scrub_value(v),
            serde_json::json!({"a": ["x [redacted] y"], "[redacted]": 1, "b": "true"})
        );
        assert_eq!(
            scrub_with(
                "sk-12345 and sk-123456",
                &sorted(vec!["sk-12345".into(), "sk-123456".into()])
            ),
            "[redacted] and [redacted]"
        );
    }

    #[test]
    fn a_secret_split_across_streamed_pieces_never_shows() {
        let key = "sk-stream-0123456789";
        let s = StreamScrubber::with(vec![key.to_string()]);
        let pieces = ["The key is sk-str", "eam-0123", "456789, and ", "sk-", "not one."];
        let shown: String = pieces.iter().map(|p| s.push(p)).collect::<String>() + &s.finish();
        assert_eq!(shown, "The key is [redacted], and sk-not one.");
        // Nothing is held back when no secret could start in a piece's tail.
        assert_eq!(s.push("plain text"), "plain text");
        assert_eq!(StreamScrubber::with(vec![]).push("sk-str"), "sk-str");
        // A tail that is not the start of any secret goes out at once, multibyte text included.
        let s = StreamScrubber::with(vec!["geheimnis-0001".into()]);
        assert_eq!(s.push("grüße, gehe"), "grüße, ");
        assert_eq!(s.push("n wir"), "gehen wir");
    }
}
