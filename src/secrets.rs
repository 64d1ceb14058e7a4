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
pub const REDACTED: &str = "[redacted]";

/// Secrets shorter than this are not scrubbed.
pub const MIN_SECRET_LEN: usize = 4;

/// Values shorter than this are not known as secrets process-wide.
pub const MIN_KNOWN_LEN: usize = 8;

fn known() -> &'static RwLock<Vec<String>> {
    static KNOWN: OnceLock<RwLock<Vec<String>>> = OnceLock::new();
    KNOWN.get_or_init(|| {
        let mut list = env_credentials();
        list.retain(|v| v.len() >= MIN_KNOWN_LEN);
        RwLock::new(sorted(list))
    })
}

/// Whether an environment variable's name says it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.ends_with("_KEY") || upper.ends_with("_TOKEN") || upper.ends_with("_SECRET") || upper.contains("PASSWORD")
}

/// The values of environment variables that hold secrets, by their names' convention.
pub fn env_credentials() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| is_secret_name(name))
        .map(|(_, value)| value)
        .collect()
}

/// Longest first (so a secret containing another is replaced whole), without short values or
/// duplicates.
pub fn sorted(mut secrets: Vec<String>) -> Vec<String> {
    secrets.retain(|s| s.len() >= MIN_SECRET_LEN);
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    secrets
}

/// Makes `value` a known secret from now on.
pub fn register(value: &str) {
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
pub fn snapshot() -> Vec<String> {
    known().read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// `text` with every known secret replaced by [`REDACTED`].
pub fn scrub(text: &str) -> Cow<'_, str> {
    let list = known().read().unwrap_or_else(|e| e.into_inner());
    scrub_with(text, &list)
}

/// `text` with every one of `secrets` (longest first) replaced by [`REDACTED`].
pub fn scrub_with<'a>(text: &'a str, secrets: &[String]) -> Cow<'a, str> {
    let mut out = Cow::Borrowed(text);
    for secret in secrets {
        if secret.len() >= MIN_SECRET_LEN && out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    out
}

/// [`scrub`] over an owned string, allocating only when something is replaced.
pub fn scrub_string(text: String) -> String {
    match scrub(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(s) => s,
    }
}

/// `value` with every known secret replaced in every string, keys included (rebuilt only when
/// it holds one).
pub fn scrub_value(value: Value) -> Value {
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
pub fn scrub_value_with(value: Value, secrets: &[String]) -> Value {
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
pub fn excerpt(text: &str, max_chars: usize) -> String {
    scrub(text).chars().take(max_chars).collect()
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
}
