//! The environment a run's settings are resolved against: the process's variables in the
//! CLI, a map in tests and in a server that runs many requests with their own settings.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};

/// The checkpoint database (`--db`).
pub const DB: &str = "RUNNER_DB";
/// The data database: search indexes and long-term memory (`--data-db`).
pub const DATA_DB: &str = "RUNNER_DATA_DB";
/// Hosts, addresses and CIDRs the web kinds may reach although private (`--allow-net`),
/// comma-separated.
pub const ALLOW_NET: &str = "RUNNER_ALLOW_NET";
/// Directories load and index may read besides the workflow's tree (`--allow-read`),
/// separated as in `PATH`.
pub const ALLOW_READ: &str = "RUNNER_ALLOW_READ";
/// The lease's time to live in seconds (`--lease-ttl`).
pub const LEASE_TTL: &str = "RUNNER_LEASE_TTL";
/// Long-term memory's semantic index: `offline` or `PROVIDER:MODEL[@URL]`, the embedder
/// (`--store-index`).
pub const STORE_INDEX: &str = "RUNNER_STORE_INDEX";
/// The fields of a stored value that index embeds, comma-separated (`--store-index-field`).
pub const STORE_INDEX_FIELDS: &str = "RUNNER_STORE_INDEX_FIELDS";
/// Where clean schema verdicts are remembered (default: the user's cache directory).
pub const CACHE_DIR: &str = "RUNNER_CACHE_DIR";
/// Set (to anything but `0` or `false`): nothing is remembered between processes.
pub const NO_CACHE: &str = "RUNNER_NO_CACHE";

/// Environment variables by name. Model profiles read their API keys and `${env:…}` fields
/// from it too, and a cassette scrubs the values of the ones named like secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    vars: BTreeMap<String, OsString>,
}

impl Env {
    /// The variables of this process (those whose names are text).
    pub fn process() -> Env {
        Env {
            vars: std::env::vars_os()
                .filter_map(|(name, value)| Some((name.into_string().ok()?, value)))
                .collect(),
        }
    }

    /// These variables and no others.
    pub fn from_pairs<K: Into<String>, V: Into<OsString>>(pairs: impl IntoIterator<Item = (K, V)>) -> Env {
        Env {
            vars: pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        }
    }

    /// The value of `name` as it is (a path need not be text).
    pub fn get_os(&self, name: &str) -> Option<&OsStr> {
        self.vars.get(name).map(OsString::as_os_str)
    }

    /// The value of `name` when it is set and is text.
    pub fn get(&self, name: &str) -> Option<String> {
        self.get_os(name)?.to_str().map(str::to_string)
    }

    /// Sets `name` to `value` unless it is set already.
    pub fn set_default(&mut self, name: &str, value: OsString) {
        self.vars.entry(name.to_string()).or_insert(value);
    }

    /// This environment without `name`.
    pub fn without(mut self, name: &str) -> Env {
        self.vars.remove(name);
        self
    }

    /// The values of the variables whose names say they hold secrets.
    pub fn credentials(&self) -> Vec<String> {
        self.vars
            .iter()
            .filter(|(name, _)| crate::secrets::is_secret_name(name))
            .filter_map(|(_, value)| value.to_str().map(str::to_string))
            .collect()
    }
}
