//! The HTTP error vocabulary every client of the product shares (model providers and the web
//! client): a status's error class, the wait a server asks for (`Retry-After`), bounded delays
//! from numbers that came from outside, and excerpts of server bodies made safe to show.
//!
//! It depends on nothing but the error classes (`error_class::ErrorClass`, a leaf), so both
//! providers/ and net/ build on it without depending on each other.

use std::time::{Duration, SystemTime};

use crate::error_class::ErrorClass;

/// The longest wait a server may ask for. A `Retry-After` beyond it (a day, `1e300`, `inf`) is
/// read as this: a run waits five minutes at most per retry on a server's word, and its retry
/// policy decides whether to try again.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// How many characters of a server's message an error quotes.
pub const EXCERPT_CHARS: usize = 300;

/// The error class of a non-success HTTP status (`None` below 400).
pub fn class_of_status(status: u16) -> Option<ErrorClass> {
    Some(match status {
        0..=399 => return None,
        429 => ErrorClass::RateLimit,
        408 => ErrorClass::Timeout,
        401 | 403 | 407 => ErrorClass::Auth,
        500.. => ErrorClass::Server,
        _ => ErrorClass::BadRequest,
    })
}

/// The wait a response asks for, in seconds, within `[0, MAX_RETRY_AFTER]`: `retry_after_ms`
/// (the `retry-after-ms` header some model APIs send) when it is a number, else `Retry-After`
/// as seconds (an integer or a decimal) or as an HTTP date (a date in the past is no wait).
/// `None` when neither says anything readable (negative numbers and NaN included).
pub fn retry_after(retry_after: Option<&str>, retry_after_ms: Option<&str>, now: SystemTime) -> Option<f64> {
    if let Some(ms) = retry_after_ms.and_then(number) {
        return Some(cap_secs(ms / 1000.0));
    }
    let value = retry_after?.trim();
    if let Some(secs) = number(value) {
        return Some(cap_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(cap_secs(when.duration_since(now).map_or(0.0, |d| d.as_secs_f64())))
}

/// A non-negative number (`inf` included, which is capped later); NaN and negatives are not.
fn number(text: &str) -> Option<f64> {
    let n: f64 = text.trim().parse().ok()?;
    (n >= 0.0).then_some(n)
}

fn cap_secs(secs: f64) -> f64 {
    secs.min(MAX_RETRY_AFTER.as_secs_f64())
}

/// A wait of `secs` seconds from a number that came from outside (a server, a script, a
/// cassette), never panicking: NaN and negatives are no wait, and anything longer than `max`
/// (infinity included) is `max`.
pub fn delay(secs: f64, max: Duration) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max))
}

/// An excerpt of `text` that is safe to show: `scrub` removes the secrets first, then the
/// result is cut to `max_chars` characters (with `…`). Cutting first could leave most of a
/// secret that straddled the cut, which the scrubber no longer recognises.
pub fn excerpt(text: &str, scrub: impl Fn(&str) -> String, max_chars: usize) -> String {
    cut(&scrub(text), max_chars)
}

/// `text` cut to `max_chars` characters, with `…` when something was cut.
pub fn cut(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_classes() {
        assert_eq!(class_of_status(200), None);
        assert_eq!(class_of_status(304), None);
        assert_eq!(class_of_status(429), Some(ErrorClass::RateLimit));
        assert_eq!(class_of_status(408), Some(ErrorClass::Timeout));
        for s in [401, 403, 407] {
            assert_eq!(class_of_status(s), Some(ErrorClass::Auth));
        }
        assert_eq!(class_of_status(404), Some(ErrorClass::BadRequest));
        assert_eq!(class_of_status(503), Some(ErrorClass::Server));
        assert_eq!(class_of_status(999), Some(ErrorClass::Server));
    }

    #[test]
    fn retry_after_reads_seconds_dates_and_milliseconds() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let ra = |v: &str| retry_after(Some(v), None, now);
        assert_eq!(ra("7"), Some(7.0));
        assert_eq!(ra(" 1.5 "), Some(1.5));
        assert_eq!(retry_after(Some("9"), Some("250"), now), Some(0.25));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(ra(&later), Some(30.0));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(ra(&earlier), Some(0.0));
        assert_eq!(ra("Sun, 06 Nov 1994 08:49:37 GMT"), Some(0.0));
        assert_eq!(ra("soon"), None);
        assert_eq!(retry_after(None, None, now), None);
    }

    #[test]
    fn retry_after_is_capped_and_refuses_what_is_not_a_wait() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let max = MAX_RETRY_AFTER.as_secs_f64();
        let ra = |v: &str| retry_after(Some(v), None, now);
        for v in ["inf", "infinity", "1e300", "99999999999999999999999", "86400"] {
            assert_eq!(ra(v), Some(max), "{v}");
        }
        for v in ["-1", "-inf", "NaN", "nan", ""] {
            assert_eq!(ra(v), None, "{v}");
        }
        assert_eq!(retry_after(None, Some("inf"), now), Some(max));
        assert_eq!(retry_after(Some("3"), Some("-5"), now), Some(3.0));
        let far = httpdate::fmt_http_date(now + Duration::from_secs(10 * 365 * 86_400));
        assert_eq!(ra(&far), Some(max));
    }

    #[test]
    fn delays_from_outside_never_panic() {
        let max = Duration::from_secs(60);
        assert_eq!(delay(1.5, max), Duration::from_millis(1500));
        assert_eq!(delay(f64::INFINITY, max), max);
        assert_eq!(delay(1e300, max), max);
        assert_eq!(delay(f64::NAN, max), Duration::ZERO);
        assert_eq!(delay(-3.0, max), Duration::ZERO);
        assert_eq!(delay(f64::NEG_INFINITY, max), Duration::ZERO);
    }

    #[test]
    fn excerpts_scrub_before_they_cut() {
        let key = "sk-0123456789abcdefghijklmnopqrstuvwxyzABCDEF";
        let scrub = |t: &str| t.replace(key, "***");
        // The key straddles the cut: cutting first would keep all but its last character.
        let body = format!("{}{key} was refused", "x".repeat(EXCERPT_CHARS + 1 - key.len()));
        assert!(cut(&body, EXCERPT_CHARS).contains(&key[..key.len() - 1]));
        let shown = excerpt(&body, scrub, EXCERPT_CHARS);
        assert!(!shown.contains("sk-"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
        let secrets = crate::secrets::sorted(vec![key.to_string(), "sk-0123".to_string()]);
        let shown = excerpt(
            &body,
            |t| crate::secrets::scrub_with(t, &secrets).into_owned(),
            EXCERPT_CHARS,
        );
        assert!(!shown.contains("sk-") && shown.contains("[redacted]"), "{shown}");
        assert_eq!(cut("héllo", 2), "hé…");
        assert_eq!(cut("hi", 2), "hi");
    }
}
