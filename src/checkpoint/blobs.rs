//! Long strings stored once by content. A run often holds one large text in several places
//! (the input, a state key a node copied it into, a task's write): a backend replaces every
//! string of at least [`MIN_LEN`] bytes by a reference to its SHA-256 and stores the string
//! once per store.
//!
//! Architecture Invariant of [`super`]: this knows JSON only.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{CheckpointError, Result};

/// The key of a reference: `{"$runner_blob": "<sha256 hex>"}`.
pub const BLOB: &str = "$runner_blob";

/// Strings shorter than this are stored in place.
pub const MIN_LEN: usize = 64 * 1024;

/// `value` with every long string replaced by a reference, and those strings as
/// `(hash, text)`; `None` when it holds no long string (then it is stored as it is).
pub fn externalize(value: &Value) -> Option<(Value, Vec<(String, String)>)> {
    if !has_long(value) {
        return None;
    }
    let mut blobs = Vec::new();
    let out = replace(value, &mut blobs);
    Some((out, blobs))
}

fn has_long(v: &Value) -> bool {
    match v {
        Value::String(s) => s.len() >= MIN_LEN,
        Value::Array(a) => a.iter().any(has_long),
        Value::Object(m) => m.values().any(has_long),
        _ => false,
    }
}

fn replace(v: &Value, blobs: &mut Vec<(String, String)>) -> Value {
    match v {
        Value::String(s) if s.len() >= MIN_LEN => {
            let hash = format!("{:x}", Sha256::digest(s.as_bytes()));
            blobs.push((hash.clone(), s.clone()));
            let mut m = Map::new();
            m.insert(BLOB.into(), Value::String(hash));
            Value::Object(m)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| replace(x, blobs)).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), replace(x, blobs))).collect()),
        other => other.clone(),
    }
}

/// The hash a value refers to, if it is a reference.
fn reference(v: &Value) -> Option<&str> {
    let m = v.as_object()?;
    if m.len() != 1 {
        return None;
    }
    let hash = m.get(BLOB)?.as_str()?;
    (hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hash)
}

/// Puts back every referenced string; `fetch` reads one by hash.
pub fn internalize(value: &mut Value, fetch: &mut impl FnMut(&str) -> Result<String>) -> Result<()> {
    if let Some(hash) = reference(value) {
        let text = fetch(hash)?;
        if format!("{:x}", Sha256::digest(text.as_bytes())) != hash {
            return Err(CheckpointError::Corrupt(format!(
                "stored text {hash} does not match its hash"
            )));
        }
        *value = Value::String(text);
        return Ok(());
    }
    match value {
        Value::Array(a) => a.iter_mut().try_for_each(|x| internalize(x, fetch)),
        Value::Object(m) => m.values_mut().try_for_each(|x| internalize(x, fetch)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn long_strings_go_out_once_and_come_back() {
        let long = "x".repeat(MIN_LEN);
        assert_eq!(externalize(&json!({"a": "short", "b": [1, "y"]})), None);
        let value = json!({"text": long, "copies": [long, {"again": long}], "n": 1});
        let (out, blobs) = externalize(&value).unwrap();
        assert!(out.to_string().len() < 1_000);
        let store: HashMap<String, String> = blobs.into_iter().collect();
        assert_eq!(store.len(), 1);
        let mut back = out;
        internalize(&mut back, &mut |h: &str| {
            store.get(h).cloned().ok_or_else(|| CheckpointError::Corrupt(h.into()))
        })
        .unwrap();
        assert_eq!(back, value);
        // A reference to text that does not hash to it is corrupt.
        let mut forged = json!({BLOB: format!("{:x}", Sha256::digest(b"a"))});
        assert!(internalize(&mut forged, &mut |_: &str| Ok("b".to_string())).is_err());
    }
}
