//! Run webhooks: a run whose request names a `webhook` URL (the LangGraph API's field, on a run
//! or a cron) has that URL called with a POST when it ends. Below HTTP: no axum type.
//!
//! - The call is recorded before the run's end is ([`enqueue`]): a delivery row keyed by the
//!   run, with the body LangGraph's server sends — the run as the API shows it, its final
//!   `status`, `run_started_at`, `run_ended_at`, the thread's `values` and, for a failed run, its
//!   `error` (`webhook_sent_at` is added when it is sent). A delivery is only taken once its run
//!   is no longer pending or running, so a process that dies between the two leaves a delivery
//!   whose run the next process ends (and whose body it then writes again).
//! - `deliver.rs` sends them: any process serving the database takes a due delivery, holds it
//!   while it sends (on PostgreSQL `FOR UPDATE SKIP LOCKED`, so one process does), retries a
//!   5xx, a 429 or a failed connection with backoff, and records each attempt.
//! - Each call is signed ([`sign`]) when the server has a secret (`--webhook-secret-env`):
//!   `runner-signature: t=UNIX_SECONDS,v1=HEX`, HEX the HMAC-SHA256 of `t`, `.` and the body,
//!   as Stripe and Svix sign theirs. [`verify`] checks such a signature, and a route's `verify`
//!   uses it for inbound webhooks.

pub(crate) mod deliver;

use hmac::{Hmac, Mac};
use serde_json::{Map, Value, json};
use sha2::Sha256;

use crate::checkpoint::{Checkpointer, Delivery, DeliveryState, RunRow, RunStatus};
use crate::compile::Plan;

/// How old a timestamped signature may be when it is verified.
const TOLERANCE_SECS: i64 = 300;

/// The signature header's value for `body` sent at `t` (Unix seconds).
pub(crate) fn sign(secret: &[u8], t: i64, body: &[u8]) -> String {
    format!("t={t},v1={}", hex(&mac(secret, t, body)))
}

fn mac(secret: &[u8], t: i64, body: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
    m.update(t.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Why a signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unsigned {
    #[error("the request has no `{0}` header")]
    Missing(String),
    #[error("the `{0}` header is not a signature of this scheme")]
    Malformed(String),
    #[error("the signature's timestamp is more than five minutes from now")]
    Stale,
    #[error("the signature does not match the body")]
    Mismatch,
}

/// Checks `header`'s value `given` against `body` under `scheme`, at `now` (Unix seconds).
pub(crate) fn verify(
    scheme: crate::spec::VerifyScheme,
    secret: &[u8],
    header: &str,
    given: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), Unsigned> {
    let given = given.ok_or_else(|| Unsigned::Missing(header.to_string()))?.trim();
    let malformed = || Unsigned::Malformed(header.to_string());
    match scheme {
        crate::spec::VerifyScheme::Hex => {
            let digest = unhex(given.strip_prefix("sha256=").unwrap_or(given)).ok_or_else(malformed)?;
            let mut m =
                <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
            m.update(body);
            m.verify_slice(&digest).map_err(|_| Unsigned::Mismatch)
        }
        crate::spec::VerifyScheme::Timestamped => {
            let mut t = None;
            let mut signatures = Vec::new();
            for part in given.split(',') {
                match part.trim().split_once('=') {
                    Some(("t", v)) => t = v.parse::<i64>().ok(),
                    Some(("v1", v)) => signatures.push(unhex(v).ok_or_else(malformed)?),
                    _ => {}
                }
            }
            let t = t.ok_or_else(malformed)?;
            if signatures.is_empty() {
                return Err(malformed());
            }
            if (now - t).abs() > TOLERANCE_SECS {
                return Err(Unsigned::Stale);
            }
            // Each compared in constant time; any one that matches will do (a secret being
            // rotated signs twice).
            let mut ok = false;
            for s in &signatures {
                let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret)
                    .unwrap_or_else(|_| unreachable!("HMAC takes any key"));
                m.update(t.to_string().as_bytes());
                m.update(b".");
                m.update(body);
                ok |= m.verify_slice(s).is_ok();
            }
            if ok { Ok(()) } else { Err(Unsigned::Mismatch) }
        }
    }
}

/// The webhook URL a run's request names, if any.
pub(crate) fn url_of(row: &RunRow) -> Option<&str> {
    row.kwargs
        .get("webhook")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
}

/// Records the webhook call of run `row`, which ended with `status` (and `error`), before its
/// end is recorded: the thread's values read now, while a thread of the run's own still exists.
/// Nothing for a run without a webhook. A failure leaves the run's end unharmed: it is logged.
pub(crate) fn enqueue(
    store: &std::sync::Arc<dyn Checkpointer>,
    plan: &std::sync::Arc<Plan>,
    row: &RunRow,
    status: RunStatus,
    error: Option<&Value>,
) {
    let Some(url) = url_of(row) else { return };
    let ended = crate::clock::now();
    let mut run = super::runs::run_json(row);
    run["status"] = json!(status.as_str());
    run["updated_at"] = json!(ended);
    let mut body = match run {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    body.insert("run_started_at".into(), json!(row.updated_at));
    body.insert("run_ended_at".into(), json!(ended));
    let values = thread_values(store, plan, &row.thread_id);
    body.insert("values".into(), values.map(Value::Object).unwrap_or(Value::Null));
    if let Some(e) = error {
        body.insert("error".into(), e.clone());
    }
    let delivery = Delivery {
        delivery_id: delivery_id(&row.run_id),
        run_id: row.run_id.clone(),
        url: url.to_string(),
        body: Value::Object(body).to_string(),
        state: DeliveryState::Pending,
        attempts: 0,
        last_status: None,
        last_error: None,
        next_attempt_at: 0,
        created_at: ended.clone(),
        updated_at: ended,
    };
    if let Err(e) = store.enqueue_delivery(&delivery) {
        tracing::warn!(run_id = %row.run_id, error = %e, "a run's webhook could not be recorded");
    }
}

/// A run's one delivery: the same id however often the run ends (a restart ends it again).
fn delivery_id(run_id: &str) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_URL,
        format!("runner:webhook:{run_id}").as_bytes(),
    )
    .to_string()
}

/// The thread's values as a run's `wait` answers them; none when the thread has no state.
fn thread_values(
    store: &std::sync::Arc<dyn Checkpointer>,
    plan: &std::sync::Arc<Plan>,
    thread_id: &str,
) -> Option<Map<String, Value>> {
    let cp = store.get_checkpoint(thread_id, None).ok()??;
    let (values, _) = crate::engine::Engine::pending_state(plan.clone(), store.clone(), &cp).ok()?;
    Some(super::messages::written_state(values, &cp, plan))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::VerifyScheme;

    #[test]
    fn a_signature_verifies_against_its_body_only() {
        let body = br#"{"run_id":"r"}"#;
        let header = sign(b"s3cret", 1_900_000_000, body);
        assert!(header.starts_with("t=1900000000,v1="), "{header}");
        let check = |secret: &[u8], given: Option<&str>, body: &[u8], now: i64| {
            verify(VerifyScheme::Timestamped, secret, "runner-signature", given, body, now)
        };
        assert_eq!(check(b"s3cret", Some(&header), body, 1_900_000_100), Ok(()));
        assert_eq!(
            check(b"s3cret", Some(&header), br#"{"run_id":"x"}"#, 1_900_000_100),
            Err(Unsigned::Mismatch)
        );
        assert_eq!(
            check(b"other", Some(&header), body, 1_900_000_100),
            Err(Unsigned::Mismatch)
        );
        assert_eq!(
            check(b"s3cret", Some(&header), body, 1_900_000_400),
            Err(Unsigned::Stale)
        );
        assert_eq!(
            check(b"s3cret", None, body, 1_900_000_000),
            Err(Unsigned::Missing("runner-signature".into()))
        );
        assert!(matches!(
            check(b"s3cret", Some("v1=zz"), body, 1_900_000_000),
            Err(Unsigned::Malformed(_))
        ));
        // A rotated secret's second signature is accepted too.
        let two = format!("{header},v1={}", "00".repeat(32));
        assert_eq!(check(b"s3cret", Some(&two), body, 1_900_000_000), Ok(()));
    }

    #[test]
    fn a_hex_signature_is_githubs() {
        // GitHub's documented example: secret "It's a Secret to Everybody", payload
        // "Hello, World!".
        let given = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let ok = verify(
            VerifyScheme::Hex,
            b"It's a Secret to Everybody",
            "x-hub-signature-256",
            Some(given),
            b"Hello, World!",
            0,
        );
        assert_eq!(ok, Ok(()));
        let bad = verify(
            VerifyScheme::Hex,
            b"It's a Secret to Everybody",
            "x-hub-signature-256",
            Some(given),
            b"Hello, World?",
            0,
        );
        assert_eq!(bad, Err(Unsigned::Mismatch));
    }
}
