//! Long-term memory: JSON values by namespace (a list of names, e.g. `[memory, alice, prefs]`)
//! and key, with a keyword index over each value's text for search. Values outlive threads:
//! they are what one run leaves for the next, unless they were put with a time to live (`ttl`,
//! minutes, as LangGraph's store): such an item expires that long after it was last written
//! (or read with a refresh), and every read first removes the items that have expired.
//!
//! A store may also be given a semantic index ([`MemoryIndex`], as LangGraph's store `index`
//! config): a value put is embedded at the index's fields (`$`, the whole value, by default;
//! a put may name its own fields or opt out), and a search with a query ranks the items by the
//! cosine similarity of their best field, items without vectors after them. Without an index a
//! query is keyword search.

use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value, json};

use super::embed::{dot_blob, normalize, to_blob};
use super::{DataError, DataStore, fts_query};
use crate::clock::{at_ms, now, now_ms};
use crate::providers::Embedder;

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
        c.execute(
            "DELETE FROM memory_vectors WHERE namespace = ?1 AND key = ?2",
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

/// The value under `key`, or null; with `refresh`, an item with a time to live starts it again.
pub fn get(c: &Connection, namespace: &[String], key: &str, refresh: bool) -> Result<Value, DataError> {
    sweep(c)?;
    if refresh {
        self::refresh(c, &ns_key(namespace), key)?;
    }
    let v: Option<String> = c
        .query_row(
            "SELECT value FROM memory WHERE namespace = ?1 AND key = ?2",
            params![ns_key(namespace), key],
            |r| r.get(0),
        )
        .optional()?;
    Ok(v.and_then(|v| serde_json::from_str(&v).ok()).unwrap_or(Value::Null))
}

/// Every value of the namespace, as an object by key (in key order); with `refresh`, those
/// with a time to live start it again.
pub fn get_all(c: &Connection, namespace: &[String], refresh: bool) -> Result<Value, DataError> {
    sweep(c)?;
    let ns = ns_key(namespace);
    let mut stmt = c.prepare_cached("SELECT key, value, ttl FROM memory WHERE namespace = ?1 ORDER BY key")?;
    let rows: Vec<(String, String, Option<f64>)> = stmt
        .query_map([&ns], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let mut out = Map::new();
    for (k, v, ttl) in rows {
        if refresh && ttl.is_some() {
            self::refresh(c, &ns, &k)?;
        }
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
    put_with(c, namespace, key, value, ttl, None)
}

/// An item's vectors: a unit vector per field path embedded.
pub type FieldVectors = [(String, Vec<f32>)];

/// [`put_for`] with the item's vectors (`(embedder id, [(field path, unit vector)])`), which
/// replace any it had; none: the item has none (its value is not indexed).
pub fn put_with(
    c: &mut Connection,
    namespace: &[String],
    key: &str,
    value: &Value,
    ttl: Option<f64>,
    vectors: Option<(&str, &FieldVectors)>,
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
    tx.execute(
        "DELETE FROM memory_vectors WHERE namespace = ?1 AND key = ?2",
        params![ns, key],
    )?;
    if let Some((embedder, vectors)) = vectors {
        let mut insert = tx.prepare_cached(
            "INSERT OR REPLACE INTO memory_vectors (namespace, key, path, embedder, vector) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for (path, v) in vectors {
            insert.execute(params![ns, key, path, embedder, to_blob(v)])?;
        }
    }
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
    tx.execute(
        "DELETE FROM memory_vectors WHERE namespace = ?1 AND key = ?2",
        params![ns, key],
    )?;
    tx.commit()?;
    Ok(n > 0)
}

/// Items of the namespace and those under it, best keyword match first (BM25); without a
/// query, the most recently updated first. Items are `{namespace, key, value, score}`; with
/// `refresh`, those with a time to live start it again.
pub fn search(
    c: &Connection,
    namespace: &[String],
    query: Option<&str>,
    limit: usize,
    refresh: bool,
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
    if refresh {
        for (ns, key, ..) in &rows {
            self::refresh(c, ns, key)?;
        }
    }
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
#[derive(Debug, Default, Clone)]
pub struct ItemQuery {
    /// Items in this namespace or under it (empty: every item).
    pub prefix: Vec<String>,
    /// Keywords: best match first; without, the most recently updated first.
    pub query: Option<String>,
    /// Fields the value must hold with exactly these values.
    pub filter: Option<Map<String, Value>>,
    pub limit: usize,
    pub offset: usize,
    /// Whether the items returned that have a time to live start it again.
    pub refresh: bool,
}

/// Items as LangGraph's store searches them: [`item`]s with a `score` (null without a query).
pub fn items(c: &Connection, q: &ItemQuery) -> Result<Vec<Value>, DataError> {
    sweep(c)?;
    let ns = ns_key(&q.prefix);
    type Row = (String, String, String, String, Option<String>, Option<f64>);
    let rows: Vec<Row> = match q.query.as_deref().and_then(fts_query) {
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
                // In the order they were put, as LangGraph's store lists what no query ranks:
                // oldest first, and the row's id (kept by an update) between items put in the
                // same millisecond.
                "SELECT namespace, key, value, updated_at, created_at FROM memory
                 WHERE substr(namespace, 1, length(?1)) = ?1 ORDER BY created_at, rowid",
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
        .filter(|(_, _, value, ..)| passes(q.filter.as_ref(), value))
        .skip(q.offset)
        .take(q.limit)
        .collect();
    shown(c, found, q.refresh)
}

/// Whether `value` holds every field of `filter` with exactly its value.
fn passes(filter: Option<&Map<String, Value>>, value: &Value) -> bool {
    filter.is_none_or(|f| f.iter().all(|(k, want)| value.get(k) == Some(want)))
}

/// An item found: namespace (as stored), key, value, updated, created, score.
type FoundRow = (String, String, Value, String, Option<String>, Option<f64>);

/// Found rows as items, their time to live started again with `refresh`.
fn shown(c: &Connection, found: Vec<FoundRow>, refresh: bool) -> Result<Vec<Value>, DataError> {
    let mut out = Vec::with_capacity(found.len());
    for (ns, key, value, updated, created, score) in found {
        if refresh {
            self::refresh(c, &ns, &key)?;
        }
        out.push(json!({
            "namespace": ns_parts(&ns), "key": key, "value": value,
            "created_at": created, "updated_at": updated, "score": score,
        }));
    }
    Ok(out)
}

/// Items as a semantic search finds them: those under the prefix that pass the filter, ranked
/// by the best cosine similarity of their vectors (made by `embedder`) to `query` (a unit
/// vector), best first, then paged; when a page has room left, items with no vector by that
/// embedder fill it, with a null score (as LangGraph's store does).
pub fn similar_items(c: &Connection, q: &ItemQuery, query: &[f32], embedder: &str) -> Result<Vec<Value>, DataError> {
    sweep(c)?;
    let ns = ns_key(&q.prefix);
    let mut best: HashMap<(String, String), f32> = HashMap::new();
    {
        let mut stmt = c.prepare_cached(
            "SELECT namespace, key, vector FROM memory_vectors
             WHERE embedder = ?1 AND substr(namespace, 1, length(?2)) = ?2",
        )?;
        let mut rows = stmt.query(params![embedder, ns])?;
        while let Some(r) = rows.next()? {
            let blob = r.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
            let score = dot_blob(query, blob);
            let slot = best.entry((r.get(0)?, r.get(1)?)).or_insert(f32::NEG_INFINITY);
            *slot = slot.max(score);
        }
    }
    // In the order they were put, as [`items`] lists them: LangGraph's store ranks its
    // candidates in that order with a stable sort, and fills a page's room from them in it.
    let mut stmt = c.prepare_cached(
        "SELECT namespace, key, value, updated_at, created_at FROM memory
         WHERE substr(namespace, 1, length(?1)) = ?1 ORDER BY created_at, rowid",
    )?;
    let rows: Vec<(String, String, String, String, Option<String>)> = stmt
        .query_map(params![ns], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut scored = Vec::new();
    let mut scoreless = Vec::new();
    for (ns, key, value, updated, created) in rows {
        let value = serde_json::from_str::<Value>(&value).unwrap_or(Value::String(value));
        if !passes(q.filter.as_ref(), &value) {
            continue;
        }
        match best.get(&(ns.clone(), key.clone())) {
            Some(score) => scored.push((ns, key, value, updated, created, Some(f64::from(*score)))),
            None => scoreless.push((ns, key, value, updated, created, None)),
        }
    }
    // Best first; equal scores in the order above (`sort_by` is stable).
    scored.sort_by(|a, b| b.5.partial_cmp(&a.5).unwrap_or(std::cmp::Ordering::Equal));
    let mut found: Vec<_> = scored.into_iter().skip(q.offset).take(q.limit).collect();
    let room = q.limit.saturating_sub(found.len());
    found.extend(scoreless.into_iter().take(room));
    shown(c, found, q.refresh)
}

/// A store's semantic index: the embedder, and the fields of a value embedded when it is put
/// (paths as LangGraph's store takes them: `$` the whole value, `a.b`, `list[0]`, `list[-1]`,
/// `list[*].text`, `*`, `{a,b}`).
#[derive(Clone)]
pub struct MemoryIndex {
    pub embedder: Arc<dyn Embedder>,
    pub fields: Vec<String>,
}

/// Which fields of a value put are embedded.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Indexing {
    /// The store's index fields.
    #[default]
    Default,
    /// None: the item is not found by semantic search (it may fill a page's room).
    Off,
    /// These fields, in place of the index's.
    Fields(Vec<String>),
}

/// Puts `value` under `namespace` and `key` (for `ttl` minutes if given) through the store's
/// semantic index, if it has one: the texts at the fields `indexing` names are embedded first,
/// so a failed embedding stores nothing.
pub async fn put_indexed(
    store: &DataStore,
    namespace: Vec<String>,
    key: String,
    value: Value,
    ttl: Option<f64>,
    indexing: &Indexing,
) -> Result<(), DataError> {
    let vectors = match (store.memory_index(), indexing) {
        (Some(index), Indexing::Default) => Some(embed_fields(index, &value, &index.fields).await?),
        (Some(index), Indexing::Fields(fields)) => Some(embed_fields(index, &value, fields).await?),
        (None, _) | (_, Indexing::Off) => None,
    };
    store
        .with(move |c| {
            let vectors = vectors.as_ref().map(|(id, v)| (id.as_str(), v.as_slice()));
            put_with(c, &namespace, &key, &value, ttl, vectors)
        })
        .await
}

/// The embedder's id and a unit vector for each text at `fields` of `value`.
async fn embed_fields(
    index: &MemoryIndex,
    value: &Value,
    fields: &[String],
) -> Result<(String, Vec<(String, Vec<f32>)>), DataError> {
    let mut paths = Vec::new();
    let mut texts = Vec::new();
    for field in fields {
        let found = texts_at(value, field);
        let many = found.len() > 1;
        for (i, text) in found.into_iter().enumerate() {
            paths.push(if many { format!("{field}.{i}") } else { field.clone() });
            texts.push(text);
        }
    }
    let id = index.embedder.id().to_string();
    if texts.is_empty() {
        return Ok((id, Vec::new()));
    }
    let embedded = index
        .embedder
        .embed(&texts)
        .await
        .map_err(|e| DataError::Embed(e.to_string()))?;
    if embedded.vectors.len() != texts.len() {
        return Err(DataError::Embed(format!(
            "`{id}` returned {} vectors for {} texts",
            embedded.vectors.len(),
            texts.len()
        )));
    }
    let vectors = paths
        .into_iter()
        .zip(embedded.vectors)
        .map(|(p, mut v)| {
            normalize(&mut v);
            (p, v)
        })
        .collect();
    Ok((id, vectors))
}

/// Searches long-term memory: by meaning when the store has a semantic index and `q` a query
/// (the query embedded through the query-embedding cache), else as [`items`] does.
pub async fn search_items(store: &DataStore, q: ItemQuery) -> Result<Vec<Value>, DataError> {
    let text = q.query.clone().filter(|t| !t.trim().is_empty());
    match (store.memory_index(), text) {
        (Some(index), Some(text)) => {
            let embedded = super::cache::embed(store, index.embedder.as_ref(), &[text])
                .await
                .map_err(|e| match e {
                    super::cache::EmbedError::Data(e) => e,
                    e => DataError::Embed(e.to_string()),
                })?;
            let vector = embedded.vectors.into_iter().next().unwrap_or_default();
            let id = index.embedder.id().to_string();
            store.with(move |c| similar_items(c, &q, &vector, &id)).await
        }
        _ => store.with(move |c| items(c, &q)).await,
    }
}

/// The texts of `value` at `path` (see [`MemoryIndex`]): a string as it is, a number or a
/// boolean as written, an object or a list as JSON; none when the path leads nowhere.
pub fn texts_at(value: &Value, path: &str) -> Vec<String> {
    let path = path.trim();
    if path.is_empty() || path == "$" {
        return vec![value.to_string()];
    }
    let tokens = tokenize(path);
    let mut out = Vec::new();
    walk_path(value, &tokens, &mut out);
    out
}

fn leaf(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Null => {}
        Value::String(s) => out.push(s.clone()),
        Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => out.push(v.to_string()),
    }
}

/// A path's steps: field names, `[…]` indexes and `{…}` field sets.
fn tokenize(path: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut chars = path.chars();
    while let Some(ch) = chars.next() {
        match ch {
            '[' | '{' => {
                if !current.is_empty() {
                    tokens.push(std::mem::take(&mut current));
                }
                let close = if ch == '[' { ']' } else { '}' };
                let mut group = String::from(ch);
                for c in chars.by_ref() {
                    group.push(c);
                    if c == close {
                        break;
                    }
                }
                tokens.push(group);
            }
            '.' => {
                if !current.is_empty() {
                    tokens.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        tokens.push(current);
    }
    tokens
}

fn walk_path(v: &Value, tokens: &[String], out: &mut Vec<String>) {
    let Some((token, rest)) = tokens.split_first() else {
        return leaf(v, out);
    };
    if let Some(index) = token.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        let Value::Array(items) = v else { return };
        if index.trim() == "*" {
            items.iter().for_each(|item| walk_path(item, rest, out));
        } else if let Ok(i) = index.trim().parse::<i64>() {
            let at = if i < 0 { items.len() as i64 + i } else { i };
            if let Some(item) = usize::try_from(at).ok().and_then(|at| items.get(at)) {
                walk_path(item, rest, out);
            }
        }
    } else if let Some(fields) = token.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        if !v.is_object() {
            return;
        }
        for field in fields.split(',') {
            let mut at = Some(v);
            for step in tokenize(field.trim()) {
                at = at.and_then(|a| a.get(&step));
            }
            if let Some(found) = at {
                leaf(found, out);
            }
        }
    } else if token == "*" {
        match v {
            Value::Object(m) => m.values().for_each(|x| walk_path(x, rest, out)),
            Value::Array(a) => a.iter().for_each(|x| walk_path(x, rest, out)),
            _ => {}
        }
    } else if let Some(next) = v.as_object().and_then(|m| m.get(token.as_str())) {
        walk_path(next, rest, out);
    }
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
            .with_blocking(|c| search(c, &ns(&["t"]), Some("tide"), 10, false))
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
                            prefix: ns(&["users"]),
                            filter: Some(even.clone()),
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

    #[test]
    fn texts_are_found_at_langgraph_style_paths() {
        let v = json!({
            "title": "Tides",
            "n": 3,
            "tags": ["sea", "moon"],
            "notes": [{"text": "high"}, {"text": "low"}],
            "meta": {"by": "ana", "gone": null},
        });
        let at = |p: &str| texts_at(&v, p);
        assert_eq!(at("$"), vec![v.to_string()]);
        assert_eq!(at("title"), ["Tides"]);
        assert_eq!(at("n"), ["3"]);
        assert_eq!(at("tags"), [r#"["sea","moon"]"#]);
        assert_eq!(at("tags[0]"), ["sea"]);
        assert_eq!(at("tags[-1]"), ["moon"]);
        assert_eq!(at("tags[5]"), Vec::<String>::new());
        assert_eq!(at("notes[*].text"), ["high", "low"]);
        assert_eq!(at("meta.by"), ["ana"]);
        assert_eq!(at("meta.gone"), Vec::<String>::new());
        assert_eq!(at("meta.missing"), Vec::<String>::new());
        assert_eq!(at("{title, meta.by}"), ["Tides", "ana"]);
        assert_eq!(at("meta.*"), ["ana"]);
        assert_eq!(
            at("title[0]"),
            Vec::<String>::new(),
            "an index into a string finds nothing"
        );
    }

    /// With a semantic index, a query ranks items by their best field's similarity; items put
    /// without vectors (or with another embedder's) only fill a page's room, scoreless; a
    /// value replaced or deleted takes its vectors with it.
    #[tokio::test]
    async fn a_semantic_index_ranks_by_similarity_and_scoreless_items_fill_the_page() {
        use crate::rag::embed::HashedEmbedder;
        let store = DataStore::default().with_memory_index(MemoryIndex {
            embedder: Arc::new(HashedEmbedder),
            fields: vec!["text".into()],
        });
        let put = |key: &'static str, value: Value, indexing: Indexing| {
            let store = store.clone();
            async move { put_indexed(&store, ns(&["m"]), key.into(), value, None, &indexing).await }
        };
        put(
            "tides",
            json!({"text": "the moon pulls the tides of the sea"}),
            Indexing::Default,
        )
        .await
        .unwrap();
        put(
            "bread",
            json!({"text": "baking sourdough bread at home"}),
            Indexing::Default,
        )
        .await
        .unwrap();
        put(
            "both",
            json!({"a": "garden soil", "b": "moon tides"}),
            Indexing::Fields(vec!["a".into(), "b".into()]),
        )
        .await
        .unwrap();
        put("plain", json!({"text": "moon tides moon tides"}), Indexing::Off)
            .await
            .unwrap();
        let search = |offset: usize, limit: usize| {
            let store = store.clone();
            async move {
                search_items(
                    &store,
                    ItemQuery {
                        prefix: ns(&["m"]),
                        query: Some("moon tides".into()),
                        limit,
                        offset,
                        ..Default::default()
                    },
                )
                .await
                .unwrap()
            }
        };
        let found = search(0, 10).await;
        let keys: Vec<&str> = found.iter().filter_map(|i| i["key"].as_str()).collect();
        assert_eq!(keys, ["both", "tides", "bread", "plain"], "{found:#?}");
        let scores: Vec<Option<f64>> = found.iter().map(|i| i["score"].as_f64()).collect();
        assert!(scores[0] > scores[1] && scores[1] > scores[2], "{scores:?}");
        assert!(scores[0].unwrap() <= 1.0 + 1e-6);
        assert_eq!(scores[3], None, "an item put with indexing off has no score");
        // Paging is over the ranked items; the scoreless one fills only a page with room.
        let second: Vec<Value> = search(1, 1).await;
        assert_eq!(second[0]["key"], "tides");
        let last = search(3, 2).await;
        assert_eq!(last.len(), 1);
        assert_eq!(last[0]["key"], "plain");
        // Without a query, the most recently updated first, no scores.
        let all = search_items(
            &store,
            ItemQuery {
                prefix: ns(&["m"]),
                limit: 10,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(all.len(), 4);
        assert!(all.iter().all(|i| i["score"].is_null()));
        // Replacing a value without indexing drops its vectors; deleting one drops them too.
        put("tides", json!({"text": "the moon pulls the tides"}), Indexing::Off)
            .await
            .unwrap();
        store.with_blocking(|c| delete(c, &ns(&["m"]), "both")).unwrap();
        let vectors: i64 = store
            .with_blocking(|c| Ok(c.query_row("SELECT count(*) FROM memory_vectors", [], |r| r.get(0))?))
            .unwrap();
        assert_eq!(vectors, 1, "only bread's vector is left");
        // Vectors another embedder made are not compared with this one's query.
        store
            .with_blocking(|c| {
                let v = vec![(
                    String::from("text"),
                    crate::rag::embed::HashedEmbedder::vector("moon tides"),
                )];
                put_with(
                    c,
                    &ns(&["m"]),
                    "other",
                    &json!({"text": "moon tides"}),
                    None,
                    Some(("someone-else", &v)),
                )
            })
            .unwrap();
        let ranked = search(0, 1).await;
        assert_eq!(ranked[0]["key"], "bread");
    }
}
