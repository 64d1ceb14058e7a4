//! Requests and responses of [`super::Web::fetch`] as cassette data, so that `--record` keeps
//! every web exchange and `--replay` serves it with no network.
//!
//! A request is `{method, url, headers, body}`; a response `{status, url, headers, body,
//! truncated}`, or `{error: {class, message, status, retry_after}}` for a failed fetch (a
//! refusal, a timeout, a connection failure), so a replayed run fails where the recorded one
//! did. Headers are an object by lowercase name (a list of values when a name repeats), which
//! lets the cassette scrub credential headers by name. A body is a string when it is UTF-8,
//! else base64 with `"base64": true` beside it.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::web::{FetchError, Request, Response};
use crate::error_class::ErrorClass;
use crate::secrets::REDACTED;

/// The kind of web exchanges in a cassette.
pub(super) const HTTP: &str = "http";

/// The cassette key of a request. A header whose value is a secret (it came from
/// `${env:NAME}`) is recorded as `[redacted]` whatever its name.
pub(super) fn request_value(req: &Request) -> Value {
    let headers: Vec<(String, String)> = req
        .headers
        .iter()
        .map(|(k, v)| {
            let secret = req.secret_headers.iter().any(|h| h.eq_ignore_ascii_case(k));
            (k.clone(), if secret { REDACTED.to_string() } else { v.clone() })
        })
        .collect();
    let mut v = json!({
        "method": req.method,
        "url": req.url,
        "headers": headers_value(&headers),
    });
    put_body(&mut v, req.body.as_deref());
    v
}

/// The cassette value of a fetch's outcome.
pub(super) fn outcome_value(outcome: &Result<Response, FetchError>) -> Value {
    match outcome {
        Ok(r) => {
            let mut v = json!({
                "status": r.status,
                "url": r.url,
                "headers": headers_value(&r.headers),
                "truncated": r.truncated,
            });
            put_body(&mut v, Some(&r.body));
            v
        }
        Err(e) => json!({"error": {
            "class": e.class,
            "message": e.message,
            "status": e.status,
            "retry_after": e.retry_after,
        }}),
    }
}

/// A recorded outcome back as the fetch's result; a malformed entry is a typed error.
pub(super) fn outcome_from(v: &Value) -> Result<Response, FetchError> {
    let bad = |what: &str| FetchError::new(ErrorClass::Invalid, format!("a recorded web exchange has {what}"));
    if let Some(e) = v.get("error") {
        let class: ErrorClass = e
            .get("class")
            .and_then(|c| serde_json::from_value(c.clone()).ok())
            .ok_or_else(|| bad("an error without a known `class`"))?;
        return Err(FetchError {
            class,
            message: e.get("message").and_then(Value::as_str).unwrap_or_default().to_string(),
            retry_after: e.get("retry_after").and_then(Value::as_f64),
            status: e
                .get("status")
                .and_then(Value::as_u64)
                .and_then(|s| u16::try_from(s).ok()),
        });
    }
    let status = v
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| bad("no `status`"))?;
    let url = v.get("url").and_then(Value::as_str).ok_or_else(|| bad("no `url`"))?;
    let mut headers = Vec::new();
    for (name, value) in v.get("headers").and_then(Value::as_object).into_iter().flatten() {
        match value {
            Value::Array(values) => {
                headers.extend(
                    values
                        .iter()
                        .map(|x| (name.clone(), x.as_str().unwrap_or_default().to_string())),
                );
            }
            other => headers.push((name.clone(), other.as_str().unwrap_or_default().to_string())),
        }
    }
    let body = body_from(v).ok_or_else(|| bad("a body that is not a string (or not base64)"))?;
    Ok(Response {
        status,
        url: url.to_string(),
        headers,
        body: Bytes::from(body.unwrap_or_default()),
        truncated: v.get("truncated").and_then(Value::as_bool).unwrap_or(false),
    })
}

fn headers_value(headers: &[(String, String)]) -> Value {
    let mut map = Map::new();
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        match map.get_mut(&name) {
            None => {
                map.insert(name, Value::String(value.clone()));
            }
            Some(Value::Array(values)) => values.push(Value::String(value.clone())),
            Some(first) => *first = json!([first.take(), value]),
        }
    }
    Value::Object(map)
}

fn put_body(v: &mut Value, body: Option<&[u8]>) {
    let (body, encoded) = match body.map(std::str::from_utf8) {
        None => (Value::Null, false),
        Some(Ok(text)) => (Value::String(text.to_string()), false),
        Some(Err(_)) => {
            let raw = body.unwrap_or_default();
            (
                Value::String(base64::engine::general_purpose::STANDARD.encode(raw)),
                true,
            )
        }
    };
    v["body"] = body;
    if encoded {
        v["base64"] = Value::Bool(true);
    }
}

/// The body of a recorded value: `Some(None)` when it has none, `None` when it is malformed.
fn body_from(v: &Value) -> Option<Option<Vec<u8>>> {
    match v.get("body") {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) if v.get("base64").and_then(Value::as_bool) == Some(true) => {
            base64::engine::general_purpose::STANDARD.decode(s).ok().map(Some)
        }
        Some(Value::String(s)) => Some(Some(s.as_bytes().to_vec())),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_survives_the_round_trip() {
        let response = Response {
            status: 200,
            url: "http://example.com/a".into(),
            headers: vec![
                ("content-type".into(), "text/html".into()),
                ("set-cookie".into(), "a=1".into()),
                ("set-cookie".into(), "b=2".into()),
            ],
            body: Bytes::from_static(b"<p>hi</p>"),
            truncated: true,
        };
        let v = outcome_value(&Ok(response.clone()));
        assert_eq!(v["body"], json!("<p>hi</p>"));
        assert_eq!(v["headers"]["set-cookie"], json!(["a=1", "b=2"]));
        assert_eq!(outcome_from(&v).unwrap(), response);

        let binary = Response {
            body: Bytes::from_static(&[0xff, 0x00, 0x80]),
            headers: vec![],
            ..response
        };
        let v = outcome_value(&Ok(binary.clone()));
        assert_eq!(v["base64"], json!(true));
        assert_eq!(outcome_from(&v).unwrap(), binary);
    }

    #[test]
    fn a_failure_survives_the_round_trip() {
        let e = FetchError {
            class: ErrorClass::RateLimit,
            message: "slow down".into(),
            retry_after: Some(2.0),
            status: Some(429),
        };
        assert_eq!(outcome_from(&outcome_value(&Err(e.clone()))).unwrap_err(), e);
    }

    #[test]
    fn a_request_key_has_headers_by_lowercase_name() {
        let mut req = Request::get("http://example.com/");
        req.headers.push(("Authorization".into(), "Bearer x".into()));
        req.body = Some(b"q=1".to_vec());
        let v = request_value(&req);
        assert_eq!(
            v,
            json!({"method": "GET", "url": "http://example.com/", "headers": {"authorization": "Bearer x"}, "body": "q=1"})
        );
        req.headers.push(("X-Auth".into(), "tiny".into()));
        req.secret_headers.push("x-auth".into());
        assert_eq!(request_value(&req)["headers"]["x-auth"], json!(REDACTED));
    }
}
