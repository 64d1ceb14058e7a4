//! Long-term memory: JSON values by namespace (a list of names, e.g. `[memory, alice, prefs]`)
//! and key, with a keyword index over each value's text for search. Values outlive threads:
//! they are what one run leaves for the next, unless they were put with a time to live (`ttl`,
//! minutes, as LangGraph's store): such an item expires that long after it was last written
//! (or read with a refresh), and every read first removes the items that have expired.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value, json};

use super::{DataError, fts_query};
use crate::clock::{at_ms, now, now_ms};

/// Namespace parts are joined with a unit separator, which templates never produce by
/// accident; the trailing one makes prefixes match whole parts only.
fn ns_key(namespace: &[String]) -> String {
    namespace.iter().map(|p| format!("{p}\u{1f}")).collect()
}

fn ns_parts(key: &str) -> Vec<String> {
    key.split_terminator('\u{1f}').map(str::to_string).collect()
}

pub fn check_namespace(namespace: &[String]) -> Result<(), DataError> {
    if namespace.is_empty() || namespace.iter().any(|p| p.is_empty() || p.contains('\u{1f}')) {
        return Err(DataError::Invalid(format!(
            "namespace {namespace:?} has an empty part (is a context value missing?)"
        )));
    }
    Ok(())
}

/// When an item with a time to live of `ttl` minutes written (or refreshed) now expires, as
/// stored text (RFC 3339 texts compare as times do).
fn expiry(ttl: f64) -> String {
    // Saturating: a ttl of centuries is as good as none.
    at_ms(now_ms().saturating_add((ttl * 60_000.0) as i64))
}

/// Removes the items whose time to live has run out, with their keyword rows. Every read calls
/// it first, so what a read returns has not expired.
pub fn sweep(c: &Connection) -> Result<usize, DataError> {
    let expired: Vec<(String, String)> = c
        .prepare_cached("SELECT namespace, key FROM memory WHERE expires_at IS NOT NULL AND expires_at <= ?1")?
        .query_map([now()], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (ns, key) in &expired {
        c.execute("DELETE FROM memory WHERE namespace = ?1 AND key = ?2", params![ns, key])?;
        c.execute(
            "DELETE FROM memory_fts WHERE namespace = ?1 AND key = ?2",
            params![ns, key],
        )?;
    }
    Ok(expired.len())
}

/// Restarts the time to live of the item under `namespace` (as stored) and `key`, if it has one.
fn refresh(c: &Connection, ns: &str, key: &str) -> Result<(), DataError> {
    let ttl: Option<Option<f64>> = c
        .query_row(
            "SELECT ttl FROM memory WHERE namespace = ?1 AND key = ?2",
            params![ns, key],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(Some(ttl)) = ttl {
        c.execute(
            "UPDATE memory SET expires_at = ?3 WHERE namespace = ?1 AND key = ?2",
            params![ns, key, expiry(ttl)],
        )?;
    }
    Ok(())
}

/// The value under `key`, or null.
pub fn get(c: &Connection, namespace: &[String], key: &str) -> Result<Value, DataError> {
    sweep(c)?;
    let v: Option<String> = c
        .query_row(
            "SELECT value FROM memory WHERE namespace = ?1 AND key = ?2",
            params![ns_key(namespace), key],
            |r| r.get(0),
        )
        .optional()?;
    Ok(v.and_then(|v| serde_json::from_str(&v).ok()).unwrap_or(Value::Null))
}

/// Every value of the namespace, as an object by key (in key order).
pub fn get_all(c: &Connection, namespace: &[String]) -> Result<Value, DataError> {
    sweep(c)?;
    let mut stmt = c.prepare_cached("SELECT key, value FROM memory WHERE namespace = ?1 ORDER BY key")?;
    let rows = stmt.query_map([ns_key(namespace)], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Map::new();
    for r in rows {
        let (k, v) = r?;
        out.insert(k, serde_json::from_str(&v).unwrap_or(Value::String(v)));
    }
    Ok(Value::Object(out))
}

/// Stores `value` under `key`, replacing what was there.
pub fn put(c: &mut Connection, namespace: &[String], key: &str, value: &Value) -> Result<(), DataError> {
    put_for(c, namespace, key, value, None)
}

/// [`put`] with a time to live: the item expires `ttl` minutes after it is written (or last
/// read with a refresh); none: it stays until it is deleted. The ttl must be a positive number.
pub fn put_for(
    c: &mut Connection,
    namespace: &[String],
    key: &str,
    value: &Value,
    ttl: Option<f64>,
) -> Result<(), DataError> {
    if let Some(t) = ttl.filter(|t| !(t.is_finite() && *t > 0.0)) {
        return Err(DataError::Invalid(format!(
            "ttl is a positive number of minutes, not {t}"
        )));
    }
    let ns = ns_key(namespace);
    let tx = c.transaction()?;
    tx.execute(
        "INSERT INTO memory (namespace, key, value, updated_at, created_at, ttl, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6)
         ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,
           updated_at = excluded.updated_at, ttl = excluded.ttl, expires_at = excluded.expires_at",
        params![ns, key, value.to_string(), now(), ttl, ttl.map(expiry)],
    )?;
    tx.execute(
        "DELETE FROM memory_fts WHERE namespace = ?1 AND key = ?2",
        params![ns, key],
    )?;
    tx.execute(
        "INSERT INTO memory_fts (namespace, key, text) VALUES (?1, ?2, ?3)",
        params![ns, key, format!("{key} {}", text_of(value))],
    )?;
    tx.commit()?;
    Ok(())
}

/// Deletes `key`; whether it existed.
pub fn delete(c: &mut Connection, namespace: &[String], key: &str) -> Result<bool, DataError> {
    let ns = ns_key(namespace);
    let tx = c.transaction()?;
    let n = tx.execute("DELETE FROM memory WHERE namespace = ?1 AND key = ?2", params![ns, key])?;
    tx.execute(
        "DELETE FROM memory_fts WHERE namespace = ?1 AND key = ?2",
        params![ns, key],
    )?;
    tx.commit()?;
    Ok(n > 0)
}

/// Items of the namespace and those under it, best keyword match first (BM25); without a
/// query, the most recently updated first. Items are `{namespace, key, value, score}`.
pub fn search(
    c: &Connection,
    namespace: &[String],
    query: Option<&str>,
    limit: usize,
) -> Result<Vec<Value>, DataError> {
    sweep(c)?;
    let ns = ns_key(namespace);
    let limit = limit as i64;
    let rows: Vec<(String, String, String, f64)> = match query.and_then(fts_query) {
        Some(q) => {
            let mut stmt = c.prepare_cached(
                "SELECT m.namespace, m.key, m.value, bm25(memory_fts) FROM memory_fts
                 JOIN memory m ON m.namespace = memory_fts.namespace AND m.key = memory_fts.key
                 WHERE memory_fts MATCH ?1 AND substr(memory_fts.namespace, 1, length(?2)) = ?2
                 ORDER BY bm25(memory_fts), m.key LIMIT ?3",
            )?;
            stmt.query_map(params![q, ns, limit], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, -r.get::<_, f64>(3)?))
            })?
            .collect::<Result<_, _>>()?
        }
        None => {
            let mut stmt = c.prepare_cached(
                "SELECT namespace, key, value, 0.0 FROM memory WHERE substr(namespace, 1, length(?1)) = ?1
                 ORDER BY updated_at DESC, key LIMIT ?2",
            )?;
            stmt.query_map(params![ns, limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<Result<_, _>>()?
        }
    };
    Ok(rows
        .into_iter()
        .map(|(ns, key, value, score)| {
            json!({
                "namespace": ns_parts(&ns),
                "key": key,
                "value": serde_json::from_str::<Value>(&value).unwrap_or(Value::String(value)),
                "score": score,
            })
        })
        .collect())
}

/// The words of a value: its strings and object keys.
fn text_of(v: &Value) -> String {
    let mut out = String::new();
    fn walk(v: &Value, out: &mut String) {
        match v {
            Value::String(s) => {
                out.push_str(s);
                out.push(' ');
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            Value::Object(m) => {
                for (k, v) in m {
                    out.push_str(k);
                    out.push(' ');
                    walk(v, out);
                }
            }
            Value::Number(n) => {
                out.push_str(&n.to_string());
                out.push(' ');
            }
            _ => {}
        }
    }
    walk(v, &mut out);
    out
}

/// A stored item as LangGraph's store reports it: `{namespace, key, value, created_at,
/// updated_at}` (`created_at` is null for items stored before the data store kept it). With
/// `refresh`, an item with a time to live starts it again.
pub fn item(c: &Connection, namespace: &[String], key: &str, refresh: bool) -> Result<Option<Value>, DataError> {
    sweep(c)?;
    if refresh {
        self::refresh(c, &ns_key(namespace), key)?;
    }
    let row: Option<(String, String, Option<String>)> = c
        .query_row(
            "SELECT value, updated_at, created_at FROM memory WHERE namespace = ?1 AND key = ?2",
            params![ns_key(namespace), key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    Ok(row.map(|(value, updated, created)| {
        json!({
            "namespace": namespace,
            "key": key,
            "value": serde_json::from_str::<Value>(&value).unwrap_or(Value::String(value)),
            "created_at": created,
            "updated_at": updated,
        })
    }))
}

/// What [`items`] looks for.
#[derive(Debug, Default)]
pub struct ItemQuery<'a> {
    /// Items in this namespace or under it (empty: every item).
    pub prefix: &'a [String],
    /// Keywords: best match first; without, the most recently updated first.
    pub query: Option<&'a str>,
    /// Fields the value must hold with exactly these values.
    pub filter: Option<&'a serde_json::Map<String, Value>>,
    pub limit: usize,
    pub offset: usize,
    /// Whether the items returned that have a time to live start it again.
    pub refresh: bool,
}

/// Items as LangGraph's store searches them: [`item`]s with a `score` (null without a query).
pub fn items(c: &Connection, q: &ItemQuery<'_>) -> Result<Vec<Value>, DataError> {
    sweep(c)?;
    let ns = ns_key(q.prefix);
    type Row = (String, String, String, String, Option<String>, Option<f64>);
    let rows: Vec<Row> = match q.query.and_then(fts_query) {
        Some(text) => {
            let mut stmt = c.prepare_cached(
                "SELECT m.namespace, m.key, m.value, m.updated_at, m.created_at, bm25(memory_fts) FROM memory_fts
                 JOIN memory m ON m.namespace = memory_fts.namespace AND m.key = memory_fts.key
                 WHERE memory_fts MATCH ?1 AND substr(memory_fts.namespace, 1, length(?2)) = ?2
                 ORDER BY bm25(memory_fts), m.key",
            )?;
            stmt.query_map(params![text, ns], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    Some(-r.get::<_, f64>(5)?),
                ))
            })?
            .collect::<Result<_, _>>()?
        }
        None => {
            let mut stmt = c.prepare_cached(
                "SELECT namespace, key, value, updated_at, created_at FROM memory
                 WHERE substr(namespace, 1, length(?1)) = ?1 ORDER BY updated_at DESC, namespace, key",
            )?;
            stmt.query_map(params![ns], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, None))
            })?
            .collect::<Result<_, _>>()?
        }
    };
    let found: Vec<_> = rows
        .into_iter()
        .map(|(ns, key, value, updated, created, score)| {
            let value = serde_json::from_str::<Value>(&value).unwrap_or(Value::String(value));
            (ns, key, value, updated, created, score)
        })
        .filter(|(_, _, value, ..)| {
            q.filter
                .is_none_or(|f| f.iter().all(|(k, want)| value.get(k) == Some(want)))
        })
        .skip(q.offset)
        .take(q.limit)
        .collect();
    let mut out = Vec::with_capacity(found.len());
    for (ns, key, value, updated, created, score) in found {
        if q.refresh {
            refresh(c, &ns, &key)?;
        }
        out.push(json!({
            "namespace": ns_parts(&ns), "key": key, "value": value,
            "created_at": created, "updated_at": updated, "score": score,
        }));
    }
    Ok(out)
}

/// The namespaces that hold items, in order: those under `prefix` and ending with `suffix`,
/// cut to their first `max_depth` parts (duplicates made by the cut counted once).
pub fn namespaces(
    c: &Connection,
    prefix: &[String],
    suffix: &[String],
    max_depth: Option<usize>,
    limit: usize,
    offset: usize,
) -> Result<Vec<Vec<String>>, DataError> {
    sweep(c)?;
    let mut stmt = c.prepare_cached(
        "SELECT DISTINCT namespace FROM memory WHERE substr(namespace, 1, length(?1)) = ?1 ORDER BY namespace",
    )?;
    let all: Vec<String> = stmt
        .query_map([ns_key(prefix)], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut out: Vec<Vec<String>> = Vec::new();
    for ns in all {
        let mut parts = ns_parts(&ns);
        if !parts.ends_with(suffix) {
            continue;
        }
        if let Some(depth) = max_depth {
            parts.truncate(depth);
        }
        if out.last() != Some(&parts) && !out.contains(&parts) {
            out.push(parts);
        }
    }
    Ok(out.into_iter().skip(offset).take(limit).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rag::DataStore;

    fn ns(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_data_store_from_before_created_at_is_upgraded_and_keeps_its_items() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.db");
        {
            // Version 1's memory table, with an item in it.
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE memory (namespace TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
                   updated_at TEXT NOT NULL, PRIMARY KEY (namespace, key)) STRICT;
                 INSERT INTO memory VALUES ('u\u{1f}', 'old', '{\"a\":1}', '2026-01-01T00:00:00Z');
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        }
        let store = DataStore::at(&path);
        let old = store
            .with_blocking(|c| item(c, &ns(&["u"]), "old", true))
            .unwrap()
            .unwrap();
        assert_eq!(old["value"], json!({"a": 1}));
        assert_eq!(old["created_at"], Value::Null, "unknown for an item stored before");
        store
            .with_blocking(|c| put(c, &ns(&["u"]), "new", &json!({"b": 2})))
            .unwrap();
        let new = store
            .with_blocking(|c| item(c, &ns(&["u"]), "new", true))
            .unwrap()
            .unwrap();
        assert!(new["created_at"].is_string(), "{new}");
        // Replacing a value keeps when it was first stored.
        std::thread::sleep(std::time::Duration::from_millis(5));
        store
            .with_blocking(|c| put(c, &ns(&["u"]), "new", &json!({"b": 3})))
            .unwrap();
        let again = store
            .with_blocking(|c| item(c, &ns(&["u"]), "new", true))
            .unwrap()
            .unwrap();
        assert_eq!(again["created_at"], new["created_at"]);
        assert_eq!(again["value"], json!({"b": 3}));
        // Upgraded through version 3 too: items may have a time to live.
        let version: i64 = store
            .with_blocking(|c| Ok(c.pragma_query_value(None, "user_version", |r| r.get(0))?))
            .unwrap();
        assert_eq!(version, crate::rag::SCHEMA_VERSION);
        store
            .with_blocking(|c| put_for(c, &ns(&["u"]), "brief", &json!({}), Some(5.0)))
            .unwrap();
        assert!(
            store
                .with_blocking(|c| item(c, &ns(&["u"]), "brief", false))
                .unwrap()
                .is_some()
        );
    }

    /// An item whose time has come is gone from every read, keyword rows included, and a
    /// refreshing read moves its expiry on by its ttl; one put without a ttl never expires.
    #[test]
    fn expired_items_are_swept_before_every_read() {
        let store = DataStore::default();
        let expires = |key: &'static str| {
            store
                .with_blocking(move |c| {
                    Ok(c.query_row("SELECT expires_at FROM memory WHERE key = ?1", [key], |r| {
                        r.get::<_, Option<String>>(0)
                    })?)
                })
                .unwrap()
        };
        store
            .with_blocking(|c| {
                put_for(c, &ns(&["t"]), "old", &json!({"w": "tide"}), Some(1.0))?;
                put_for(c, &ns(&["t"]), "fresh", &json!({"w": "tide"}), Some(60.0))?;
                put(c, &ns(&["t"]), "kept", &json!({"w": "tide"}))
            })
            .unwrap();
        assert_eq!(expires("kept"), None);
        let before = expires("fresh").unwrap();
        // A minute's ttl moves by about a minute; an hour's by an hour, from now.
        assert!(before > expiry(59.0) && before <= expiry(60.0), "{before}");
        store
            .with_blocking(|c| {
                c.execute(
                    "UPDATE memory SET expires_at = ?1 WHERE key = 'old'",
                    [at_ms(now_ms() - 1)],
                )?;
                c.execute(
                    "UPDATE memory SET expires_at = ?1 WHERE key = 'fresh'",
                    [at_ms(now_ms() + 1000)],
                )?;
                Ok(())
            })
            .unwrap();
        let found = store
            .with_blocking(|c| search(c, &ns(&["t"]), Some("tide"), 10))
            .unwrap();
        let keys: Vec<&str> = found.iter().filter_map(|i| i["key"].as_str()).collect();
        assert_eq!(keys.len(), 2, "{found:?}");
        assert!(!keys.contains(&"old"));
        let fts: i64 = store
            .with_blocking(|c| Ok(c.query_row("SELECT count(*) FROM memory_fts WHERE key = 'old'", [], |r| r.get(0))?))
            .unwrap();
        assert_eq!(fts, 0, "the keyword rows go with the item");
        // Without a refresh the expiry stays; with one it is an hour away again.
        store.with_blocking(|c| item(c, &ns(&["t"]), "fresh", false)).unwrap();
        assert!(expires("fresh").unwrap() < expiry(1.0));
        store.with_blocking(|c| item(c, &ns(&["t"]), "fresh", true)).unwrap();
        assert!(expires("fresh").unwrap() > expiry(59.0));
        let bad = store.with_blocking(|c| put_for(c, &ns(&["t"]), "x", &json!({}), Some(-1.0)));
        assert!(bad.is_err());
    }

    #[test]
    fn items_filter_before_paging_and_namespaces_cut_to_a_depth() {
        let store = DataStore::default();
        store
            .with_blocking(|c| {
                for (i, who) in ["a", "b", "c"].iter().enumerate() {
                    put(c, &ns(&["users", who]), "k", &json!({"even": i % 2 == 0}))?;
                    put(c, &ns(&["users", who, "notes"]), "n", &json!({"even": false}))?;
                }
                Ok(())
            })
            .unwrap();
        let even = serde_json::Map::from_iter([("even".to_string(), json!(true))]);
        let page = |offset| {
            store
                .with_blocking(|c| {
                    items(
                        c,
                        &ItemQuery {
                            prefix: &ns(&["users"]),
                            filter: Some(&even),
                            limit: 1,
                            offset,
                            ..Default::default()
                        },
                    )
                })
                .unwrap()
        };
        // Two items match (a and c): the filter is applied before the page is cut.
        assert_eq!(page(0).len(), 1);
        assert_eq!(page(1).len(), 1);
        assert!(page(2).is_empty());
        let listed = store
            .with_blocking(|c| namespaces(c, &ns(&["users"]), &[], Some(2), 100, 0))
            .unwrap();
        assert_eq!(listed, [ns(&["users", "a"]), ns(&["users", "b"]), ns(&["users", "c"])]);
        let notes = store
            .with_blocking(|c| namespaces(c, &[], &ns(&["notes"]), None, 1, 1))
            .unwrap();
        assert_eq!(notes, [ns(&["users", "b", "notes"])]);
    }
}
