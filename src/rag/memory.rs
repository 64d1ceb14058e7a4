//! Long-term memory: JSON values by namespace (a list of names, e.g. `[memory, alice, prefs]`)
//! and key, with a keyword index over each value's text for search. Values outlive threads:
//! they are what one run leaves for the next.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value, json};

use super::{DataError, fts_query};
use crate::clock::now;

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

/// The value under `key`, or null.
pub fn get(c: &Connection, namespace: &[String], key: &str) -> Result<Value, DataError> {
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
    let ns = ns_key(namespace);
    let tx = c.transaction()?;
    tx.execute(
        "INSERT INTO memory (namespace, key, value, updated_at, created_at) VALUES (?1, ?2, ?3, ?4, ?4)
         ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
        params![ns, key, value.to_string(), now()],
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
/// updated_at}` (`created_at` is null for items stored before the data store kept it).
pub fn item(c: &Connection, namespace: &[String], key: &str) -> Result<Option<Value>, DataError> {
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
}

/// Items as LangGraph's store searches them: [`item`]s with a `score` (null without a query).
pub fn items(c: &Connection, q: &ItemQuery<'_>) -> Result<Vec<Value>, DataError> {
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
    Ok(rows
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
        .map(|(ns, key, value, updated, created, score)| {
            json!({
                "namespace": ns_parts(&ns), "key": key, "value": value,
                "created_at": created, "updated_at": updated, "score": score,
            })
        })
        .collect())
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
        let old = store.with_blocking(|c| item(c, &ns(&["u"]), "old")).unwrap().unwrap();
        assert_eq!(old["value"], json!({"a": 1}));
        assert_eq!(old["created_at"], Value::Null, "unknown for an item stored before");
        store
            .with_blocking(|c| put(c, &ns(&["u"]), "new", &json!({"b": 2})))
            .unwrap();
        let new = store.with_blocking(|c| item(c, &ns(&["u"]), "new")).unwrap().unwrap();
        assert!(new["created_at"].is_string(), "{new}");
        // Replacing a value keeps when it was first stored.
        std::thread::sleep(std::time::Duration::from_millis(5));
        store
            .with_blocking(|c| put(c, &ns(&["u"]), "new", &json!({"b": 3})))
            .unwrap();
        let again = store.with_blocking(|c| item(c, &ns(&["u"]), "new")).unwrap().unwrap();
        assert_eq!(again["created_at"], new["created_at"]);
        assert_eq!(again["value"], json!({"b": 3}));
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
