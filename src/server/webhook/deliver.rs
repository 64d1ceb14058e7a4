//! Sending the webhook deliveries of ended runs: every process serving the database looks for
//! due deliveries, holds the ones it takes while it sends them, and records each attempt.
//!
//! A call goes through the web client of the http kinds ([`crate::net::Web::fetch`]), so its
//! SSRF guard applies: an address it refuses (loopback, private ranges, cloud metadata) is
//! never called unless `--allow-net` allows it, and the delivery is recorded `refused`. A 2xx
//! answer delivers it; a 5xx, a 429, a timeout or a failed connection is tried again after
//! 1 s, 2 s, 4 s … (±25%), up to [`ATTEMPTS`] attempts in all; any other answer fails it at
//! once (the receiver said the request itself is wrong). A delivery is held for [`HOLD`]
//! while it is sent: a process that dies meanwhile leaves it to another once the hold ends.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::checkpoint::{Attempt, Checkpointer, Delivery, DeliveryState};
use crate::error_class::ErrorClass;
use crate::net::{FetchOptions, Oversize, Request, Web};

/// How often the database is looked at for due deliveries.
const POLL: Duration = Duration::from_millis(500);
/// How long a taken delivery is this process's: longer than a call may take.
const HOLD: Duration = Duration::from_secs(90);
/// How long one call may take, redirects included.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts in all before a delivery is given up (about two minutes of retries).
pub(crate) const ATTEMPTS: u32 = 8;
/// How many deliveries one look takes.
const BATCH: usize = 16;

/// What sends this process's share of the deliveries.
pub(crate) struct Deliverer {
    store: Arc<dyn Checkpointer>,
    web: Web,
    /// Signs every call when set.
    secret: Option<Vec<u8>>,
    /// Who holds what this process takes.
    owner: String,
}

impl Deliverer {
    /// A deliverer on `store` whose calls may reach what `allow` allows besides public
    /// addresses, signing with `secret`.
    pub(crate) fn new(store: Arc<dyn Checkpointer>, allow: crate::net::AllowList, secret: Option<Vec<u8>>) -> Self {
        Deliverer {
            store,
            web: Web::new(crate::net::WebConfig {
                allow,
                ..crate::net::WebConfig::default()
            }),
            secret,
            owner: crate::checkpoint::new_id(),
        }
    }

    /// Sends due deliveries until `stop` turns true.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            let now = crate::clock::now_ms();
            let hold = now + i64::try_from(HOLD.as_millis()).unwrap_or(i64::MAX);
            let store = self.store.clone();
            let owner = self.owner.clone();
            let taken = tokio::task::spawn_blocking(move || store.claim_deliveries(now, &owner, hold, BATCH)).await;
            match taken {
                Ok(Ok(deliveries)) => {
                    let busy = deliveries.len() == BATCH;
                    for d in deliveries {
                        self.attempt(d).await;
                    }
                    if busy {
                        continue;
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "webhook deliveries could not be read"),
                Err(e) => tracing::warn!(error = %e, "webhook deliveries could not be read"),
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// One attempt of `d`, recorded.
    async fn attempt(&self, d: Delivery) {
        let sent_at = crate::clock::now();
        let body = match serde_json::from_str::<Value>(&d.body) {
            Ok(Value::Object(mut m)) => {
                m.insert("webhook_sent_at".into(), json!(sent_at));
                Value::Object(m).to_string()
            }
            _ => d.body.clone(),
        };
        let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
        if let Some(secret) = &self.secret {
            let t = crate::clock::now_ms().div_euclid(1000);
            headers.push((
                crate::spec::SIGNATURE_HEADER.to_string(),
                super::sign(secret, t, body.as_bytes()),
            ));
        }
        let request = Request {
            method: "POST".into(),
            url: d.url.clone(),
            headers,
            body: Some(body.into_bytes()),
            secret_headers: vec![crate::spec::SIGNATURE_HEADER.to_string()],
        };
        let options = FetchOptions {
            timeout: TIMEOUT,
            max_bytes: 64 * 1024,
            oversize: Oversize::Truncate,
            ..FetchOptions::default()
        };
        let result = self.web.fetch(request, &options).await;
        let attempts = d.attempts + 1;
        let now = crate::clock::now_ms();
        let retry = |status: Option<u16>, error: String| {
            if attempts < ATTEMPTS {
                Attempt {
                    state: DeliveryState::Pending,
                    status,
                    error: Some(error),
                    next_attempt_at: now + backoff(attempts),
                    at: crate::clock::now(),
                }
            } else {
                Attempt {
                    state: DeliveryState::Failed,
                    status,
                    error: Some(format!("{error} (gave up after {attempts} attempts)")),
                    next_attempt_at: now,
                    at: crate::clock::now(),
                }
            }
        };
        let outcome = match result {
            Ok(r) if (200..300).contains(&r.status) => Attempt {
                state: DeliveryState::Delivered,
                status: Some(r.status),
                error: None,
                next_attempt_at: now,
                at: crate::clock::now(),
            },
            Ok(r) if r.status >= 500 || r.status == 429 => retry(Some(r.status), format!("answered {}", r.status)),
            Ok(r) => Attempt {
                state: DeliveryState::Failed,
                status: Some(r.status),
                error: Some(format!("answered {}", r.status)),
                next_attempt_at: now,
                at: crate::clock::now(),
            },
            Err(e) if e.class == ErrorClass::BadRequest && e.message.starts_with("refused") => Attempt {
                state: DeliveryState::Refused,
                status: None,
                error: Some(e.message),
                next_attempt_at: now,
                at: crate::clock::now(),
            },
            Err(e) if e.class == ErrorClass::BadRequest => Attempt {
                state: DeliveryState::Failed,
                status: e.status,
                error: Some(e.message),
                next_attempt_at: now,
                at: crate::clock::now(),
            },
            Err(e) => retry(e.status, e.message),
        };
        match outcome.state {
            DeliveryState::Delivered => {
                tracing::info!(run_id = %d.run_id, attempts, "webhook delivered")
            }
            DeliveryState::Pending => tracing::warn!(
                run_id = %d.run_id, attempts, error = outcome.error.as_deref().unwrap_or_default(),
                "webhook not delivered; it will be tried again"
            ),
            DeliveryState::Refused | DeliveryState::Failed => tracing::warn!(
                run_id = %d.run_id, attempts, state = outcome.state.as_str(),
                error = outcome.error.as_deref().unwrap_or_default(), "webhook not delivered"
            ),
        }
        let store = self.store.clone();
        let (id, owner) = (d.delivery_id.clone(), self.owner.clone());
        let recorded = tokio::task::spawn_blocking(move || store.record_attempt(&id, &owner, &outcome)).await;
        match recorded {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => tracing::warn!(run_id = %d.run_id, "a webhook delivery was taken over while it was sent"),
            Ok(Err(e)) => tracing::warn!(run_id = %d.run_id, error = %e, "a webhook attempt could not be recorded"),
            Err(e) => tracing::warn!(run_id = %d.run_id, error = %e, "a webhook attempt could not be recorded"),
        }
    }
}

/// The pause before attempt `attempts + 1`: 1 s doubled each time, ±25%.
fn backoff(attempts: u32) -> i64 {
    let base = 1000i64 << attempts.saturating_sub(1).min(10);
    // Jitter from the clock's low bits: enough to spread many receivers' retries apart.
    let spread = (crate::clock::now_ms().rem_euclid(501) - 250) as f64 / 1000.0;
    base + (base as f64 * spread) as i64
}

#[cfg(test)]
mod tests {
    #[test]
    fn backoff_doubles_within_a_quarter() {
        for (attempts, base) in [(1, 1000), (2, 2000), (3, 4000), (7, 64_000)] {
            let pause = super::backoff(attempts);
            assert!(pause >= base * 3 / 4 && pause <= base * 5 / 4, "{attempts}: {pause}");
        }
    }
}
