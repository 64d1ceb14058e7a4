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
//!
//! These rules are the same on every backend; a backend only stores and finds rows
//! ([`Backend`]'s memory calls).

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::backend::{Backend, MemoryPut, MemoryRow, MemoryRows};
use super::embed::normalize;
use super::{DataError, DataStore, keywords};
use crate::clock::{at_ms, now, now_ms};
use crate::providers::Embedder;

/// Namespace parts are joined with a unit separator, which templates never produce by
/// accident; the trailing one makes prefixes match whole parts only.
pub(crate) fn ns_key(namespace: &[String]) -> String {
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
pub fn sweep(c: &dyn Backend) -> Result<usize, DataError> {
    c.sweep(&now())
}

/// Restarts the time to live of a row read, if it has one.
fn refresh(c: &dyn Backend, row: &MemoryRow) -> Result<(), DataError> {
    if let Some(ttl) = row.ttl {
        c.set_expiry(&row.namespace, &row.key, &expiry(ttl))?;
    }
    Ok(())
}

/// A stored value (JSON text) as a value; text that is not JSON as a string.
fn value_of(text: String) -> Value {
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// The value under `key`, or null; with `refresh`, an item with a time to live starts it again.
pub fn get(c: &dyn Backend, namespace: &[String], key: &str, refresh: bool) -> Result<Value, DataError> {
    sweep(c)?;
    let Some(row) = c.memory_item(&ns_key(namespace), key)? else {
        return Ok(Value::Null);
    };
    if refresh {
        self::refresh(c, &row)?;
    }
    Ok(serde_json::from_str(&row.value).unwrap_or(Value::Null))
}

/// Every value of the namespace, as an object by key (in key order); with `refresh`, those
/// with a time to live start it again.
pub fn get_all(c: &dyn Backend, namespace: &[String], refresh: bool) -> Result<Value, DataError> {
    sweep(c)?;
    let ns = ns_key(namespace);
    let mut out = Map::new();
    for row in c.memory_rows(MemoryRows::Namespace(&ns))? {
        if refresh {
            self::refresh(c, &row)?;
        }
        out.insert(row.key, value_of(row.value));
    }
    Ok(Value::Object(out))
}

/// Stores `value` under `key`, replacing what was there.
pub fn put(c: &dyn Backend, namespace: &[String], key: &str, value: &Value) -> Result<(), DataError> {
    put_for(c, namespace, key, value, None)
}

/// [`put`] with a time to live: the item expires `ttl` minutes after it is written (or last
/// read with a refresh); none: it stays until it is deleted. The ttl must be a positive number.
pub fn put_for(
    c: &dyn Backend,
    namespace: &[String],
    key: &str,
    value: &Value,
    ttl: Option<f64>,
) -> Result<(), DataError> {
    put_with(c, namespace, key, value, ttl, None)
}

pub use super::backend::FieldVectors;

/// [`put_for`] with the item's vectors (`(embedder id, [(field path, unit vector)])`), which
/// replace any it had; none: the item has none (its value is not indexed).
pub fn put_with(
    c: &dyn Backend,
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
    let expires_at = ttl.map(expiry);
    c.memory_put(&MemoryPut {
        namespace: &ns_key(namespace),
        key,
        value: &value.to_string(),
        text: &format!("{key} {}", text_of(value)),
        at: &now(),
        ttl,
        expires_at: expires_at.as_deref(),
        vectors,
    })
}

/// Deletes `key`; whether it existed.
pub fn delete(c: &dyn Backend, namespace: &[String], key: &str) -> Result<bool, DataError> {
    c.memory_delete(&ns_key(namespace), key)
}

/// Items of the namespace and those under it, best keyword match first (the backend's
/// ranking: BM25 on SQLite, `ts_rank` on PostgreSQL); without a query, the most recently
/// updated first. Items are `{namespace, key, value, score}`; with `refresh`, those with a
/// time to live start it again.
pub fn search(
    c: &dyn Backend,
    namespace: &[String],
    query: Option<&str>,
    limit: usize,
    refresh: bool,
) -> Result<Vec<Value>, DataError> {
    sweep(c)?;
    let ns = ns_key(namespace);
    let words = query.map(keywords).unwrap_or_default();
    let rows = if words.is_empty() {
        c.memory_rows(MemoryRows::Recent { prefix: &ns, limit })?
    } else {
        c.memory_rows(MemoryRows::Matching {
            prefix: &ns,
            words: &words,
            limit: Some(limit),
        })?
    };
    if refresh {
        for row in &rows {
            self::refresh(c, row)?;
        }
    }
    Ok(rows
        .into_iter()
        .map(|row| {
            json!({
                "namespace": ns_parts(&row.namespace),
                "key": row.key,
                "value": value_of(row.value),
                "score": row.score.unwrap_or(0.0),
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
pub fn item(c: &dyn Backend, namespace: &[String], key: &str, refresh: bool) -> Result<Option<Value>, DataError> {
    sweep(c)?;
    let Some(row) = c.memory_item(&ns_key(namespace), key)? else {
        return Ok(None);
    };
    if refresh {
        self::refresh(c, &row)?;
    }
    Ok(Some(json!({
        "namespace": namespace,
        "key": key,
        "value": value_of(row.value),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    })))
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
pub fn items(c: &dyn Backend, q: &ItemQuery) -> Result<Vec<Value>, DataError> {
    sweep(c)?;
    let ns = ns_key(&q.prefix);
    let words = q.query.as_deref().map(keywords).unwrap_or_default();
    let rows = if words.is_empty() {
        // In the order they were put, as LangGraph's store lists what no query ranks.
        c.memory_rows(MemoryRows::InOrder { prefix: &ns })?
    } else {
        c.memory_rows(MemoryRows::Matching {
            prefix: &ns,
            words: &words,
            limit: None,
        })?
    };
    let found: Vec<_> = rows
        .into_iter()
        .map(|row| {
            let score = row.score;
            (row, score)
        })
        .filter_map(|(row, score)| passing(q.filter.as_ref(), row, score))
        .skip(q.offset)
        .take(q.limit)
        .collect();
    shown(c, found, q.refresh)
}

/// Whether `value` holds every field of `filter` with exactly its value.
fn passes(filter: Option<&Map<String, Value>>, value: &Value) -> bool {
    filter.is_none_or(|f| f.iter().all(|(k, want)| value.get(k) == Some(want)))
}

/// An item found: its row, its value, its score.
type Found = (MemoryRow, Value, Option<f64>);

/// A row with its value parsed, if the value passes `filter`.
fn passing(filter: Option<&Map<String, Value>>, mut row: MemoryRow, score: Option<f64>) -> Option<Found> {
    let value = value_of(std::mem::take(&mut row.value));
    passes(filter, &value).then_some((row, value, score))
}

/// Found rows as items, their time to live started again with `refresh`.
fn shown(c: &dyn Backend, found: Vec<Found>, refresh: bool) -> Result<Vec<Value>, DataError> {
    let mut out = Vec::with_capacity(found.len());
    for (row, value, score) in found {
        if refresh {
            self::refresh(c, &row)?;
        }
        out.push(json!({
            "namespace": ns_parts(&row.namespace), "key": row.key, "value": value,
            "created_at": row.created_at, "updated_at": row.updated_at, "score": score,
        }));
    }
    Ok(out)
}

/// Items as a semantic search finds them: those under the prefix that pass the filter, ranked
/// by the best cosine similarity of their vectors (made by `embedder`) to `query` (a unit
/// vector), best first, then paged; when a page has room left, items with no vector by that
/// embedder fill it, with a null score (as LangGraph's store does).
pub fn similar_items(c: &dyn Backend, q: &ItemQuery, query: &[f32], embedder: &str) -> Result<Vec<Value>, DataError> {
    sweep(c)?;
    let ns = ns_key(&q.prefix);
    let best = c.memory_scores(&ns, embedder, query)?;
    // In the order they were put, as [`items`] lists them: LangGraph's store ranks its
    // candidates in that order with a stable sort, and fills a page's room from them in it.
    let mut scored = Vec::new();
    let mut scoreless = Vec::new();
    for row in c.memory_rows(MemoryRows::InOrder { prefix: &ns })? {
        let score = best.get(&(row.namespace.clone(), row.key.clone())).copied();
        let Some(found) = passing(q.filter.as_ref(), row, score.map(f64::from)) else {
            continue;
        };
        match score {
            Some(_) => scored.push(found),
            None => scoreless.push(found),
        }
    }
    // Best first; equal scores in the order above (`sort_by` is stable).
    scored.sort_by(|a, b| b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal));
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
    c: &dyn Backend,
    prefix: &[String],
    suffix: &[String],
    max_depth: Option<usize>,
    limit: usize,
    offset: usize,
) -> Result<Vec<Vec<String>>, DataError> {
    sweep(c)?;
    let mut out: Vec<Vec<String>> = Vec::new();
    for ns in c.memory_namespaces(&ns_key(prefix))? {
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
    //! What only SQLite has (an upgrade from its older schemas) and what touches no database;
    //! the rules every backend keeps are tested against each in `tests/data_store.rs`.

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
            let c = rusqlite::Connection::open(&path).unwrap();
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
        let version: i64 = rusqlite::Connection::open(&path)
            .unwrap()
            .pragma_query_value(None, "user_version", |r| r.get(0))
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
}
