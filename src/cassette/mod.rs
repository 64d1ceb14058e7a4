//! Record and replay of outbound exchanges: every model call and every web request (the web
//! client passes each through [`Cassette::exchange`]) is written to a JSONL file with its response, and a
//! later run can be served from that file with no network at all.
//!
//! The file is one header line (`{"cassette": "runner", "version": 1, ...}`), then one line per
//! exchange: `{"kind": "llm", "request": {...}, "response": {...}}`. Each line is written and
//! flushed as the exchange ends, so a crash loses nothing recorded before it.
//!
//! Secrets never reach the file: every value the process knows as a secret
//! ([`crate::secrets`]: the values of environment variables whose names end in `_KEY`,
//! `_TOKEN` or `_SECRET` or contain `PASSWORD`, API keys, every `${env:NAME}` expanded into a
//! request), and every header-like field named `authorization`, `proxy-authorization`,
//! `api-key`, `x-api-key`, `x-subscription-token` or `cookie` (and any header whose value came
//! from `${env:NAME}`, whatever its name), are replaced before a line is written. Requests
//! are compared on replay after the same scrubbing, so a recorded request still matches.
//!
//! Replay serves the first unused entry whose kind and request are equal to the one asked for,
//! so identical requests get their responses in recorded order. A request the cassette does
//! not hold fails, naming the closest recorded request and the first field that differs.
//!
//! It knows nothing of providers, the web client, the engine or the CLI: exchanges are JSON.
//! The recording and replaying providers are `providers::cassette`; the web client passes its
//! requests through [`Cassette::exchange`] itself.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::secrets::{self, REDACTED};

/// Header fields whose values are always scrubbed (compared case-insensitively).
const SECRET_FIELDS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "api-key",
    "x-api-key",
    "x-subscription-token",
    "cookie",
];

/// Why a cassette could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CassetteError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("{0}")]
    Missing(String),
}

/// The outcome of one [`Cassette::exchange`]: the live call's own error, or the cassette's.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError<E> {
    #[error(transparent)]
    Live(E),
    #[error(transparent)]
    Cassette(#[from] CassetteError),
}

/// One recorded exchange.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub kind: String,
    pub request: Value,
    pub response: Value,
}

enum Mode {
    Record(File),
    Replay { entries: Vec<Entry>, used: Vec<bool> },
}

/// A cassette being recorded or replayed. Shared by every task of a run (thread-safe).
pub struct Cassette {
    path: PathBuf,
    secrets: Vec<String>,
    mode: Mutex<Mode>,
    /// Requests replay could not serve, each with its explanation.
    misses: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Cassette {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cassette").field("path", &self.path).finish()
    }
}

impl Cassette {
    /// Starts recording to `path` (created or truncated), scrubbing the secrets of the
    /// environment.
    pub fn record(path: &Path) -> Result<Cassette, CassetteError> {
        Cassette::record_with(path, secrets::env_credentials())
    }

    /// Starts recording to `path`, scrubbing `secrets`.
    pub fn record_with(path: &Path, secrets: Vec<String>) -> Result<Cassette, CassetteError> {
        let err = |e: std::io::Error| file_error(path, e.to_string());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let mut file = File::create(path).map_err(err)?;
        let header = json!({"cassette": "runner", "version": 1, "created": crate::clock::now()});
        writeln!(file, "{header}").map_err(err)?;
        Ok(Cassette {
            path: path.to_path_buf(),
            secrets: secrets::sorted(secrets),
            mode: Mutex::new(Mode::Record(file)),
            misses: Mutex::default(),
        })
    }

    /// Opens `path` for replay, scrubbing requests with the secrets of the environment.
    pub fn replay(path: &Path) -> Result<Cassette, CassetteError> {
        Cassette::replay_with(path, secrets::env_credentials())
    }

    /// Opens `path` for replay, scrubbing requests with `secrets`.
    pub fn replay_with(path: &Path, secrets: Vec<String>) -> Result<Cassette, CassetteError> {
        let text = std::fs::read_to_string(path).map_err(|e| file_error(path, e.to_string()))?;
        let entries = parse(&text).map_err(|m| file_error(path, m))?;
        Ok(Cassette {
            path: path.to_path_buf(),
            secrets: secrets::sorted(secrets),
            mode: Mutex::new(Mode::Replay {
                used: vec![false; entries.len()],
                entries,
            }),
            misses: Mutex::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_replay(&self) -> bool {
        matches!(self.lock().as_deref(), Ok(Mode::Replay { .. }))
    }

    /// The requests replay could not serve so far, each explained.
    pub fn misses(&self) -> Vec<String> {
        self.misses.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// One exchange of `kind`. Recording, `live` runs and its response is stored (a failed
    /// live call is returned and not stored: callers that want failures replayed encode them
    /// in the response). Replaying, `live` never runs: the recorded response is returned.
    pub async fn exchange<E, F>(&self, kind: &str, request: Value, live: F) -> Result<Value, ExchangeError<E>>
    where
        F: std::future::Future<Output = Result<Value, E>>,
    {
        if self.is_replay() {
            return Ok(self.serve(kind, &request)?);
        }
        let response = live.await.map_err(ExchangeError::Live)?;
        self.store(kind, &request, &response)?;
        Ok(response)
    }

    /// The recorded response to `request`, the first unused one in recorded order.
    pub fn serve(&self, kind: &str, request: &Value) -> Result<Value, CassetteError> {
        let request = self.scrub(request.clone());
        let mut mode = self.lock()?;
        let Mode::Replay { entries, used } = &mut *mode else {
            return Err(self.error("the cassette is recording, not replaying"));
        };
        if let Some(i) =
            (0..entries.len()).find(|&i| !used[i] && entries[i].kind == kind && entries[i].request == request)
        {
            used[i] = true;
            return Ok(entries[i].response.clone());
        }
        let message = miss_message(&self.path, kind, &request, entries);
        if let Ok(mut misses) = self.misses.lock() {
            misses.push(message.clone());
        }
        Err(CassetteError::Missing(message))
    }

    /// Writes one exchange, scrubbed, and flushes it.
    pub fn store(&self, kind: &str, request: &Value, response: &Value) -> Result<(), CassetteError> {
        let line = json!({
            "kind": kind,
            "request": self.scrub(request.clone()),
            "response": self.scrub(response.clone()),
        });
        let mut mode = self.lock()?;
        let Mode::Record(file) = &mut *mode else {
            return Err(self.error("the cassette is replaying, not recording"));
        };
        writeln!(file, "{line}")
            .and_then(|_| file.flush())
            .map_err(|e| self.error(&e.to_string()))
    }

    /// Calls `f` with the request of every recorded exchange of `kind`, in recorded order
    /// (none when recording).
    pub fn for_each_recorded(&self, kind: &str, mut f: impl FnMut(&Value)) {
        let Ok(mode) = self.lock() else { return };
        if let Mode::Replay { entries, .. } = &*mode {
            entries.iter().filter(|e| e.kind == kind).for_each(|e| f(&e.request));
        }
    }

    /// `value` with every secret replaced: this cassette's own and every one the process
    /// knows.
    pub fn scrub(&self, value: Value) -> Value {
        let mut all = secrets::snapshot();
        all.extend(self.secrets.iter().cloned());
        scrub(value, &secrets::sorted(all))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Mode>, CassetteError> {
        self.mode
            .lock()
            .map_err(|_| self.error("a call panicked while using the cassette"))
    }

    fn error(&self, message: &str) -> CassetteError {
        file_error(&self.path, message.to_string())
    }
}

fn file_error(path: &Path, message: String) -> CassetteError {
    CassetteError::File {
        path: path.display().to_string(),
        message,
    }
}

fn scrub(value: Value, secrets: &[String]) -> Value {
    match value {
        Value::String(s) => Value::String(scrub_str(s, secrets)),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| scrub(v, secrets)).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let v = if SECRET_FIELDS.iter().any(|f| k.eq_ignore_ascii_case(f)) {
                        Value::String(REDACTED.into())
                    } else {
                        scrub(v, secrets)
                    };
                    (scrub_str(k, secrets), v)
                })
                .collect(),
        ),
        other => other,
    }
}

fn scrub_str(s: String, list: &[String]) -> String {
    match secrets::scrub_with(&s, list) {
        std::borrow::Cow::Borrowed(_) => s,
        std::borrow::Cow::Owned(o) => o,
    }
}

fn parse(text: &str) -> Result<Vec<Entry>, String> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let header: Value = match lines.next() {
        Some((_, l)) => serde_json::from_str(l).map_err(|e| format!("line 1: not JSON: {e}"))?,
        None => return Err("empty file: a cassette starts with a header line".into()),
    };
    if header.get("cassette") != Some(&json!("runner")) {
        return Err("line 1: not a runner cassette (the header has no `\"cassette\": \"runner\"`)".into());
    }
    lines
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l).map_err(|e| format!("line {}: not JSON: {e}", i + 1))?;
            match (
                v.get("kind").and_then(Value::as_str),
                v.get("request"),
                v.get("response"),
            ) {
                (Some(kind), Some(request), Some(response)) => Ok(Entry {
                    kind: kind.to_string(),
                    request: request.clone(),
                    response: response.clone(),
                }),
                _ => Err(format!("line {}: an entry has `kind`, `request` and `response`", i + 1)),
            }
        })
        .collect()
}

// ── finding the closest recorded request ───────────────────────────────────────────────────

/// How much of a long string is compared when ranking near misses (enough to tell prompts
/// apart, short enough to stay fast).
const COMPARE_CHARS: usize = 2000;

fn miss_message(path: &Path, kind: &str, request: &Value, entries: &[Entry]) -> String {
    let asked = leaves(request);
    let node = request.get("node").and_then(Value::as_str);
    let mut head = match node {
        Some(n) => format!(
            "the cassette {} holds no {kind} request like this one from node `{n}`",
            path.display()
        ),
        None => format!("the cassette {} holds no {kind} request like this one", path.display()),
    };
    let best = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == kind)
        .map(|(i, e)| (i, similarity(&asked, &leaves(&e.request))))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let Some((i, _)) = best else {
        head.push_str(&format!(" (it records no {kind} request at all)"));
        return head;
    };
    let entry = &entries[i];
    let recorded = leaves(&entry.request);
    let what = match entry.request.get("node").and_then(Value::as_str) {
        Some(n) => format!("entry {} (node `{n}`)", i + 1),
        None => format!("entry {}", i + 1),
    };
    if entry.request == *request {
        head.push_str(&format!(
            "; {what} is equal but already served: the run asks more often than it was recorded"
        ));
        return head;
    }
    let diff = recorded
        .keys()
        .chain(asked.keys())
        .find(|k| recorded.get(*k) != asked.get(*k))
        .cloned()
        .unwrap_or_default();
    let show = |v: Option<&String>| match v {
        None => "nothing".to_string(),
        Some(s) => excerpt(s, first_difference(s, other(&recorded, &asked, &diff, s))),
    };
    format!(
        "{head}; the closest recorded is {what}, which differs first at `{}`:\n  recorded: {}\n  asked:    {}",
        if diff.is_empty() { "/" } else { &diff },
        show(recorded.get(&diff)),
        show(asked.get(&diff)),
    )
}

/// The value at `key` in whichever of the two maps does not hold `this`.
fn other<'a>(a: &'a BTreeMap<String, String>, b: &'a BTreeMap<String, String>, key: &str, this: &str) -> &'a str {
    match (a.get(key), b.get(key)) {
        (Some(x), Some(y)) if x == this => y,
        (Some(x), _) => x,
        (None, Some(y)) => y,
        (None, None) => "",
    }
}

fn first_difference(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()))
}

/// Up to 60 characters either side of byte offset `at`, as a JSON string.
fn excerpt(s: &str, at: usize) -> String {
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let pos = chars.iter().position(|(i, _)| *i >= at).unwrap_or(chars.len());
    let from = pos.saturating_sub(60);
    let to = (pos + 60).min(chars.len());
    let text: String = chars[from..to].iter().map(|(_, c)| c).collect();
    format!(
        "{}{}{}",
        if from > 0 { "…" } else { "" },
        Value::String(text),
        if to < chars.len() { "…" } else { "" }
    )
}

/// Every scalar of a value by JSON pointer, as text.
fn leaves(v: &Value) -> BTreeMap<String, String> {
    fn walk(v: &Value, at: String, out: &mut BTreeMap<String, String>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, v) in m {
                    walk(v, crate::spec::load::push_pointer(&at, k), out);
                }
            }
            Value::Array(a) if !a.is_empty() => {
                for (i, v) in a.iter().enumerate() {
                    walk(v, format!("{at}/{i}"), out);
                }
            }
            Value::String(s) => {
                out.insert(at, s.clone());
            }
            other => {
                out.insert(at, other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(v, String::new(), &mut out);
    out
}

/// Equal leaves count 1, differing strings by their (prefix) similarity, missing ones 0.
fn similarity(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> f64 {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .map(|k| match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) if x == y => 1.0,
            (Some(x), Some(y)) => {
                let x: String = x.chars().take(COMPARE_CHARS).collect();
                let y: String = y.chars().take(COMPARE_CHARS).collect();
                strsim::normalized_levenshtein(&x, &y)
            }
            _ => 0.0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_credential_headers_are_scrubbed() {
        let v = json!({"Authorization": "Bearer abc", "body": "key=sk-12345 ok", "x": ["sk-12345"],
            "headers": {"x-subscription-token": "brv", "cookie": "sid=1", "accept": "text/html"}});
        let out = scrub(v, &secrets::sorted(vec!["sk-12345".into(), "no".into()]));
        assert_eq!(
            out,
            json!({"Authorization": REDACTED, "body": "key=[redacted] ok", "x": [REDACTED],
                "headers": {"x-subscription-token": REDACTED, "cookie": REDACTED, "accept": "text/html"}})
        );
        assert!(secrets::is_secret_name("OPENAI_API_KEY") && secrets::is_secret_name("db_password_file"));
        assert!(!secrets::is_secret_name("KEYBOARD") && !secrets::is_secret_name("HOME"));
    }

    #[test]
    fn a_file_that_is_not_a_cassette_is_refused() {
        assert!(parse("").is_err());
        assert!(parse("{\"x\": 1}\n").unwrap_err().contains("not a runner cassette"));
        let bad = "{\"cassette\": \"runner\"}\n{\"kind\": \"llm\"}\n";
        assert!(parse(bad).unwrap_err().contains("line 2"));
    }
}
