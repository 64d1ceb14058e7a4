//! Every value of a run decided: [`RunOptions`] over the environment over the defaults, each
//! value with where it came from so that an error names the flag or the variable to fix.

use std::path::PathBuf;
use std::time::Duration;

use super::RunError;
use super::env::{self, Env, Origin};
use super::options::{CassetteOption, DbOption, MockOption, RunOptions};
use super::store::Checkpoints;
use crate::checkpoint::Durability;
use crate::engine::Kinds;
use crate::engine::{DEFAULT_LEASE_TTL, LeasePolicy, Persist};
use crate::net::AllowList;
use crate::nodes::ReadRoots;

/// Where a setting's value came from: flags over the environment over a project's `.env`
/// over its `runner.toml` over the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Said by the caller: the option, named as its flag (`--db`).
    Given(&'static str),
    /// Read from this environment variable, set where the [`Origin`] says (the process, a
    /// `.env` file, a key of `runner.toml`).
    Env(&'static str, Origin),
    /// Nobody said: the default.
    Default,
}

impl Source {
    /// The variable `name` of `env`, as a source.
    pub fn var(env: &Env, name: &'static str) -> Source {
        Source::Env(name, env.origin(name).cloned().unwrap_or(Origin::Process))
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Given(name) => f.write_str(name),
            Source::Env(name, origin) => f.write_str(&origin.describe(name)),
            Source::Default => f.write_str("the default"),
        }
    }
}

/// A decided value and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting<T> {
    pub value: T,
    pub source: Source,
}

/// What the engine is told per run besides the workflow's own settings: the same for every
/// request of the run (its start, its answers, its new turns).
#[derive(Debug, Clone)]
pub struct Overrides {
    pub lease: LeasePolicy,
    /// The most supersteps (`None`: the workflow's `limits`).
    pub recursion_limit: Option<u32>,
    pub persist: Persist,
    /// Continue a thread whose workflow changed incompatibly.
    pub force: bool,
    /// `path=value` overrides of the config of every run (`runner serve --set`), each for
    /// the workflows whose config has its path; a run's own overrides win over them.
    pub config: Vec<(String, serde_json::Value)>,
}

/// A run's settings, every one decided. Built by [`RunOptions::resolve`]; builds the run's
/// checkpointer and services ([`RunSettings::build`]).
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub checkpoints: Setting<Checkpoints>,
    pub durability: Durability,
    /// The data database (a SQLite file, `:memory:` keeping nothing, or PostgreSQL), opened
    /// on first use.
    pub data_db: Setting<crate::rag::Location>,
    /// Long-term memory's semantic index, if there is one.
    pub store_index: Option<Setting<StoreIndex>>,
    pub mock: Option<MockOption>,
    pub cassette: Option<CassetteOption>,
    /// `PROFILE=PROVIDER:MODEL[@URL]` overrides of the workflow's model profiles.
    pub models: Vec<String>,
    /// The project's overrides, for the profiles a workflow has (see [`RunOptions`]).
    pub project_models: Vec<String>,
    /// `PROFILE=IN,OUT` prices, applied after `models`.
    pub prices: Vec<String>,
    /// `PROFILE=TOKENS` context windows, applied after `models`.
    pub contexts: Vec<String>,
    /// Added to every web request's allow-list.
    pub allow_net: AllowList,
    pub read_roots: ReadRoots,
    pub lease_ttl: Setting<Duration>,
    pub overrides: Overrides,
    /// Where API keys, `${env:…}` in model profiles and nodes, and the secrets a cassette
    /// scrubs are read; the nodes of every run built from these settings share it.
    pub env: std::sync::Arc<Env>,
    /// The node kinds the run knows.
    pub kinds: Kinds,
}

/// Long-term memory's semantic index as decided: which embedder, and which fields of a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreIndex {
    /// `offline` (the hashed bag-of-words embedder) or `PROVIDER:MODEL[@URL]`.
    pub embedder: String,
    /// Field paths, `$` the whole value.
    pub fields: Vec<String>,
}

impl RunOptions {
    /// These options over `env` over the defaults. Lists (`allow_net`, `allow_read`) add to
    /// the environment's instead of replacing it.
    pub fn resolve(self, env: &Env) -> Result<RunSettings, RunError> {
        if matches!(self.cassette, Some(CassetteOption::Replay(_))) && self.mock.is_some() {
            return Err(RunError::Conflict(
                "a cassette replay serves every call: it cannot be combined with a mock",
            ));
        }
        let checkpoints = match self.db {
            Some(DbOption::Scratch) => Setting {
                value: Checkpoints::Scratch,
                source: Source::Given("--db"),
            },
            Some(DbOption::At(path)) => checkpoints(Some(path), env)?,
            None => checkpoints(None, env)?,
        };
        let lease_ttl = lease_ttl(self.lease_ttl, env)?;
        let data_db = data_location(self.data_db, &checkpoints, env)?;
        let store_index = store_index(self.store_index, self.store_index_fields, env)?;
        Ok(RunSettings {
            store_index,
            checkpoints,
            durability: self.durability.unwrap_or_default(),
            data_db,
            allow_net: allow_net(&self.allow_net, env)?,
            read_roots: read_roots(&self.allow_read, env)?,
            mock: self.mock,
            cassette: self.cassette,
            kinds: self.kinds.unwrap_or_else(crate::nodes::builtin),
            models: self.models,
            project_models: self.project_models,
            prices: self.prices,
            contexts: self.contexts,
            overrides: Overrides {
                lease: LeasePolicy::Take {
                    ttl: lease_ttl.value,
                    wait: self.wait.unwrap_or(false),
                },
                recursion_limit: self.recursion_limit,
                persist: self.persist.unwrap_or_default(),
                force: self.force.unwrap_or(false),
                config: self.config,
            },
            lease_ttl,
            env: std::sync::Arc::new(env.clone()),
        })
    }
}

/// The store index: the flag, else `RUNNER_STORE_INDEX`; its fields the flags', else
/// `RUNNER_STORE_INDEX_FIELDS`', else `$`. The embedder spec is checked here, so a bad one is
/// named before anything runs.
fn store_index(flag: Option<String>, fields: Vec<String>, env: &Env) -> Result<Option<Setting<StoreIndex>>, RunError> {
    let (spec, source) = match flag {
        Some(spec) => (spec, Source::Given("--store-index")),
        None => match env.get(env::STORE_INDEX).filter(|v| !v.trim().is_empty()) {
            Some(spec) => (spec, Source::var(env, env::STORE_INDEX)),
            None if fields.is_empty() => return Ok(None),
            None => {
                return Err(RunError::Invalid {
                    source_of: Source::Given("--store-index-field"),
                    message: format!(
                        "names the fields a store index embeds, but no index is set (--store-index, or {})",
                        env::STORE_INDEX
                    ),
                });
            }
        },
    };
    let spec = spec.trim().to_string();
    if spec != OFFLINE_EMBEDDER {
        let profile = crate::providers::override_profile(&crate::spec::ModelProfile::unset(), &spec).map_err(|m| {
            RunError::Invalid {
                source_of: source.clone(),
                message: format!("{m}; or `{OFFLINE_EMBEDDER}` for the offline embedder"),
            }
        })?;
        if profile.provider != crate::spec::Provider::Openai {
            return Err(RunError::Invalid {
                source_of: source.clone(),
                message: format!(
                    "`{spec}` serves no embeddings: name an OpenAI-compatible embedding model (openai, ollama, llamacpp, vllm, lmstudio) or `{OFFLINE_EMBEDDER}`"
                ),
            });
        }
    }
    let mut fields: Vec<String> = if fields.is_empty() {
        env.get(env::STORE_INDEX_FIELDS)
            .map(|v| v.split(',').map(|f| f.trim().to_string()).collect())
            .unwrap_or_default()
    } else {
        fields
    };
    fields.retain(|f| !f.is_empty());
    if fields.is_empty() {
        fields.push("$".to_string());
    }
    Ok(Some(Setting {
        value: StoreIndex { embedder: spec, fields },
        source,
    }))
}

/// The store index's embedder spec for the offline hashed bag-of-words embedder.
pub const OFFLINE_EMBEDDER: &str = "offline";

impl RunSettings {
    /// The data store these settings name, with long-term memory's semantic index when one is
    /// set (its embedder built here: an API key it needs is read from the environment).
    pub fn data_store(&self) -> Result<crate::rag::DataStore, RunError> {
        let store = crate::rag::DataStore::new(self.data_db.value.clone());
        let Some(index) = &self.store_index else {
            return Ok(store);
        };
        let embedder: std::sync::Arc<dyn crate::providers::Embedder> = if index.value.embedder == OFFLINE_EMBEDDER {
            std::sync::Arc::new(crate::rag::embed::HashedEmbedder)
        } else {
            let invalid = |message: String| RunError::Invalid {
                source_of: index.source.clone(),
                message,
            };
            let profile =
                crate::providers::override_profile(&crate::spec::ModelProfile::unset(), &index.value.embedder)
                    .map_err(invalid)?;
            let models = indexmap::IndexMap::from([(STORE_PROFILE.to_string(), profile)]);
            let providers =
                crate::providers::Providers::for_models_in(&models, None, false, &|name| self.env.get(name))?;
            providers
                .embedder(STORE_PROFILE)
                .ok_or_else(|| invalid(format!("`{}` serves no embeddings", index.value.embedder)))?
        };
        Ok(store.with_memory_index(crate::rag::memory::MemoryIndex {
            embedder,
            fields: index.value.fields.clone(),
        }))
    }
}

/// The name the store index's embedder is set up under (in errors about its key).
const STORE_PROFILE: &str = "store-index";

/// The checkpoint database when nobody says.
pub const DEFAULT_DB: &str = ".runner/runner.db";
/// The data database when nobody says.
pub const DEFAULT_DATA_DB: &str = ".runner/data.db";

/// The checkpoint database's path as given: `flag`, else `RUNNER_DB`, else the default.
pub fn db_path(flag: Option<PathBuf>, env: &Env) -> Setting<PathBuf> {
    path_setting(flag, env, "--db", env::DB, DEFAULT_DB)
}

/// The data database: `flag`, else `RUNNER_DATA_DB`, else the checkpoint database `db` when
/// it is PostgreSQL (one database for everything many processes share), else the default file.
pub fn data_location(
    flag: Option<PathBuf>,
    db: &Setting<Checkpoints>,
    env: &Env,
) -> Result<Setting<crate::rag::Location>, RunError> {
    let at = path_setting(flag, env, "--data-db", env::DATA_DB, DEFAULT_DATA_DB);
    if at.source == Source::Default
        && let Checkpoints::Postgres(url) = &db.value
    {
        return Ok(Setting {
            value: crate::rag::Location::Postgres(url.clone()),
            source: db.source.clone(),
        });
    }
    Ok(Setting {
        value: super::store::data_location(&at.value).map_err(|message| invalid(at.source.clone(), message))?,
        source: at.source,
    })
}

/// [`data_location`] where no checkpoint database is given but `RUNNER_DB`'s (`runner index`):
/// an index is built where the runs that retrieve from it will look.
pub fn data_location_from_env(flag: Option<PathBuf>, env: &Env) -> Result<Setting<crate::rag::Location>, RunError> {
    data_location(flag, &checkpoints(None, env)?, env)
}

/// Where this process remembers what it may skip next time (clean schema verdicts):
/// `RUNNER_CACHE_DIR`, else `$XDG_CACHE_HOME/runner`, else `~/.cache/runner`; none with
/// `RUNNER_NO_CACHE`, or when no such directory can be named.
pub fn cache_dir(env: &Env) -> Option<PathBuf> {
    if env
        .get(env::NO_CACHE)
        .is_some_and(|v| !matches!(v.trim(), "" | "0" | "false"))
    {
        return None;
    }
    let absolute = |name: &str| env.get_os(name).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = env.get_os(env::CACHE_DIR).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    absolute("XDG_CACHE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".cache")))
        .map(|cache| cache.join("runner"))
}

fn checkpoints(flag: Option<PathBuf>, env: &Env) -> Result<Setting<Checkpoints>, RunError> {
    let at = db_path(flag, env);
    Ok(Setting {
        value: Checkpoints::parse(&at.value).map_err(|message| invalid(at.source.clone(), message))?,
        source: at.source,
    })
}

fn path_setting(
    given: Option<PathBuf>,
    env: &Env,
    flag: &'static str,
    var: &'static str,
    default: &str,
) -> Setting<PathBuf> {
    match (given, env.get_os(var)) {
        (Some(value), _) => Setting {
            value,
            source: Source::Given(flag),
        },
        (None, Some(value)) => Setting {
            value: PathBuf::from(value),
            source: Source::var(env, var),
        },
        (None, None) => Setting {
            value: PathBuf::from(default),
            source: Source::Default,
        },
    }
}

fn invalid(source: Source, message: impl Into<String>) -> RunError {
    RunError::Invalid {
        source_of: source,
        message: message.into(),
    }
}

/// `--lease-ttl`, else `RUNNER_LEASE_TTL`, else the engine's default; more than 0 and at most
/// a day.
fn lease_ttl(given: Option<f64>, env: &Env) -> Result<Setting<Duration>, RunError> {
    let (secs, source) = match (given, env.get_os(env::LEASE_TTL)) {
        (Some(secs), _) => (secs, Source::Given("--lease-ttl")),
        (None, Some(text)) => {
            let source = Source::var(env, env::LEASE_TTL);
            let text = text.to_string_lossy();
            let secs = text
                .trim()
                .parse()
                .map_err(|_| invalid(source.clone(), format!("`{text}` is not a number of seconds")))?;
            (secs, source)
        }
        (None, None) => {
            return Ok(Setting {
                value: DEFAULT_LEASE_TTL,
                source: Source::Default,
            });
        }
    };
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(invalid(
            source.clone(),
            format!("the lease time to live must be more than 0 and at most 86400 seconds, not {secs}"),
        ));
    }
    Ok(Setting {
        value: Duration::from_secs_f64(secs),
        source,
    })
}

/// The given entries and `RUNNER_ALLOW_NET`'s (comma-separated), each checked where it came
/// from.
fn allow_net(given: &[String], env: &Env) -> Result<AllowList, RunError> {
    let from_env = env.get(env::ALLOW_NET).unwrap_or_default();
    let env_entries: Vec<&str> = from_env.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
    let mut list = AllowList::default();
    for e in given {
        list.add(e).map_err(|m| invalid(Source::Given("--allow-net"), m))?;
    }
    for e in env_entries {
        list.add(e).map_err(|m| invalid(Source::var(env, env::ALLOW_NET), m))?;
    }
    Ok(list)
}

/// The given directories and `RUNNER_ALLOW_READ`'s (separated as in `PATH`), each resolved.
fn read_roots(given: &[PathBuf], env: &Env) -> Result<ReadRoots, RunError> {
    let env_dirs: Vec<PathBuf> = env
        .get_os(env::ALLOW_READ)
        .map(|v| std::env::split_paths(v).filter(|p| !p.as_os_str().is_empty()).collect())
        .unwrap_or_default();
    ReadRoots::new(given).map_err(|m| invalid(Source::Given("--allow-read"), m))?;
    ReadRoots::new(&env_dirs).map_err(|m| invalid(Source::var(env, env::ALLOW_READ), m))?;
    ReadRoots::new(given.iter().chain(&env_dirs)).map_err(|m| invalid(Source::Given("--allow-read"), m))
}
