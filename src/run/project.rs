//! A project's defaults: `runner.toml`, found by walking up from the current directory, and
//! a `.env` file (beside `runner.toml`, else in the current directory). Both only fill in
//! what the process's environment leaves unset, and flags override all three:
//!
//! flag > environment variable > `.env` > `runner.toml` > built-in default.
//!
//! ```toml
//! db = ".runner/runner.db"          # RUNNER_DB
//! data_db = ".runner/data.db"       # RUNNER_DATA_DB
//! allow_net = ["127.0.0.1", "10.0.0.0/8"]   # RUNNER_ALLOW_NET
//! allow_read = ["../corpus"]        # RUNNER_ALLOW_READ
//! lease_ttl = 10                    # RUNNER_LEASE_TTL
//! store_index = "ollama:nomic-embed-text"   # RUNNER_STORE_INDEX (or "offline")
//! store_index_fields = ["text"]     # RUNNER_STORE_INDEX_FIELDS
//! env_file = ".env"                 # the default
//!
//! [models]                          # --model PROFILE=SPEC, for workflows with that profile
//! default = "ollama:llama3.2"
//!
//! [serve.auth]                      # who may call `runner serve` (see `ServeFile`)
//! jwks_url = "https://id.example.com/.well-known/jwks.json"
//! issuer = "https://id.example.com/"
//! audience = "runner"
//! user_keys = true                  # per-user keys from `runner users add`
//!
//! [serve.quotas]                    # what each user may spend per window
//! window = "1d"
//! runs = 200
//! tokens = 2000000
//! cost = 5.0
//! ```
//!
//! Relative paths are relative to the file's directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;

use super::env::{ALLOW_NET, ALLOW_READ, DATA_DB, DB, LEASE_TTL, STORE_INDEX, STORE_INDEX_FIELDS};
use super::env::{Env, Origin};

/// The project file's name.
pub(super) const FILE_NAME: &str = "runner.toml";

/// What `runner.toml` may say.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectFile {
    db: Option<PathBuf>,
    data_db: Option<PathBuf>,
    #[serde(default)]
    allow_net: Vec<String>,
    #[serde(default)]
    allow_read: Vec<PathBuf>,
    lease_ttl: Option<f64>,
    store_index: Option<String>,
    #[serde(default)]
    store_index_fields: Vec<String>,
    env_file: Option<PathBuf>,
    #[serde(default)]
    models: IndexMap<String, String>,
    #[serde(default)]
    serve: ServeFile,
}

/// `[serve]`: how `runner serve` knows its callers and what each may spend. `runner serve`'s
/// flags override it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeFile {
    #[serde(default)]
    pub auth: AuthFile,
    pub quotas: Option<QuotaFile>,
}

/// `[serve.auth]`: every part optional; none is an open server (loopback only).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthFile {
    /// The variable holding the one shared key (`--api-key-env`).
    pub api_key_env: Option<String>,
    /// Bearer tokens verified against this JWKS (`--jwks-url`).
    pub jwks_url: Option<String>,
    /// … or against this HS256 secret's variable (`--jwt-secret-env`).
    pub jwt_secret_env: Option<String>,
    /// The `iss` a token must carry.
    pub issuer: Option<String>,
    /// The `aud` a token must carry (one of them).
    #[serde(default)]
    pub audience: OneOrMany,
    /// Clock skew allowed on a token's times, in seconds (default 30).
    pub leeway: Option<u64>,
    /// The claim holding the user's id (default `sub`).
    pub user_claim: Option<String>,
    /// The claim (a dotted path) that marks an admin (default `role`) and its value (default
    /// `admin`; a list claim marks an admin when it holds the value).
    pub admin_claim: Option<String>,
    pub admin_value: Option<String>,
    /// How long a fetched JWKS is used, in seconds (default 300).
    pub jwks_cache: Option<f64>,
    /// The least time between two fetches for an unknown key id, in seconds (default 10).
    pub jwks_min_refresh: Option<f64>,
    /// Accept per-user API keys (`runner users add`) as `x-api-key`.
    pub user_keys: Option<bool>,
}

/// A string or a list of them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "OneOrManyRaw")]
pub struct OneOrMany(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrManyRaw {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrManyRaw> for OneOrMany {
    fn from(raw: OneOrManyRaw) -> Self {
        match raw {
            OneOrManyRaw::One(s) => OneOrMany(vec![s]),
            OneOrManyRaw::Many(v) => OneOrMany(v),
        }
    }
}

/// `[serve.quotas]`: each user's caps per window; a cap left out is no cap.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaFile {
    /// The window: seconds, or `"1d"`, `"12h"`, `"30m"` (default a day).
    pub window: Option<WindowText>,
    /// Runs a user may start per window.
    pub runs: Option<u64>,
    /// Model tokens (prompt and completion) a user's runs may use per window.
    pub tokens: Option<u64>,
    /// What a user's runs may spend on models per window (the profiles' `pricing` currency).
    pub cost: Option<f64>,
}

/// A window as written: a number of seconds or a string with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum WindowText {
    Secs(f64),
    Text(String),
}

/// A project's defaults, read once at start.
#[derive(Debug, Default)]
pub struct Project {
    /// The `runner.toml` read, if one was found.
    pub file: Option<PathBuf>,
    /// The `.env` file read, if there was one.
    pub env_file: Option<PathBuf>,
    /// `PROFILE=SPEC` model overrides, applied to the workflows that have the profile.
    pub models: Vec<String>,
    /// `[serve]`: how `runner serve` knows its callers and what they may spend.
    pub serve: ServeFile,
    /// Variables to add where the process leaves them unset, `.env`'s before the file's, each
    /// with the file (and key) it came from.
    vars: Vec<(String, OsString, Origin)>,
}

/// Why the project's defaults could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct ProjectError {
    pub path: PathBuf,
    pub message: String,
}

impl Project {
    /// Finds `runner.toml` in `dir` or the nearest directory above it, and the `.env` file,
    /// and reads them. No file at all is an empty project.
    pub fn discover(dir: &Path) -> Result<Project, ProjectError> {
        let file = dir.ancestors().map(|d| d.join(FILE_NAME)).find(|p| p.is_file());
        let Some(file) = file else {
            let mut project = Project::default();
            project.read_env_file(&dir.join(".env"), false)?;
            return Ok(project);
        };
        let base = file.parent().unwrap_or(dir).to_path_buf();
        let text = std::fs::read_to_string(&file).map_err(|e| ProjectError {
            path: file.clone(),
            message: format!("cannot read: {e}"),
        })?;
        let parsed: ProjectFile = toml::from_str(&text).map_err(|e| ProjectError {
            path: file.clone(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let mut project = Project {
            file: Some(file.clone()),
            serve: parsed.serve.clone(),
            ..Project::default()
        };
        let named_env = parsed.env_file.is_some();
        let env_file = base.join(parsed.env_file.as_deref().unwrap_or(Path::new(".env")));
        project.read_env_file(&env_file, named_env)?;
        let path = |p: &Path| OsString::from(base.join(p));
        let toml: Arc<Path> = Arc::from(file.as_path());
        let from = |key: &'static str| Origin::Project {
            file: toml.clone(),
            key,
        };
        if let Some(db) = &parsed.db {
            // `:memory:` and URLs (`sqlite://…`, or one the run builder refuses) are not paths
            // to resolve: joined to the file's directory, `pg://h/db` would become a file.
            let spelled = db.to_string_lossy();
            let value = if spelled == ":memory:" || spelled.contains("://") {
                db.clone().into_os_string()
            } else {
                path(db)
            };
            project.vars.push((DB.to_string(), value, from("db")));
        }
        if let Some(db) = &parsed.data_db {
            let value = if db.to_string_lossy() == ":memory:" {
                db.clone().into_os_string()
            } else {
                path(db)
            };
            project.vars.push((DATA_DB.to_string(), value, from("data_db")));
        }
        if let Some(spec) = &parsed.store_index {
            project
                .vars
                .push((STORE_INDEX.to_string(), spec.into(), from("store_index")));
        }
        if !parsed.store_index_fields.is_empty() {
            project.vars.push((
                STORE_INDEX_FIELDS.to_string(),
                parsed.store_index_fields.join(",").into(),
                from("store_index_fields"),
            ));
        }
        if !parsed.allow_net.is_empty() {
            project.vars.push((
                ALLOW_NET.to_string(),
                parsed.allow_net.join(",").into(),
                from("allow_net"),
            ));
        }
        if !parsed.allow_read.is_empty() {
            let dirs =
                std::env::join_paths(parsed.allow_read.iter().map(|d| base.join(d))).map_err(|e| ProjectError {
                    path: file.clone(),
                    message: format!("allow_read: {e}"),
                })?;
            project.vars.push((ALLOW_READ.to_string(), dirs, from("allow_read")));
        }
        if let Some(ttl) = parsed.lease_ttl {
            project
                .vars
                .push((LEASE_TTL.to_string(), ttl.to_string().into(), from("lease_ttl")));
        }
        project.models = parsed
            .models
            .into_iter()
            .map(|(p, spec)| format!("{p}={spec}"))
            .collect();
        Ok(project)
    }

    /// Reads `KEY=VALUE` lines of a `.env` file (`export`, quotes and comments as dotenv
    /// writes them). A missing file is an error only when it was named.
    fn read_env_file(&mut self, path: &Path, required: bool) -> Result<(), ProjectError> {
        if !path.is_file() {
            return if required {
                Err(ProjectError {
                    path: path.to_path_buf(),
                    message: "env_file names a file that does not exist".to_string(),
                })
            } else {
                Ok(())
            };
        }
        let error = |e: dotenvy::Error| ProjectError {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let file: Arc<Path> = Arc::from(path);
        for item in dotenvy::from_path_iter(path).map_err(error)? {
            let (key, value) = item.map_err(error)?;
            self.vars.push((key, value.into(), Origin::EnvFile(file.clone())));
        }
        self.env_file = Some(path.to_path_buf());
        Ok(())
    }

    /// `env` with this project's variables added where it leaves them unset.
    pub fn fill(&self, mut env: Env) -> Env {
        for (name, value, origin) in &self.vars {
            env.set_default(name, value.clone(), origin.clone());
        }
        env
    }
}
