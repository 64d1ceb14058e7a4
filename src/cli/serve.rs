//! `runner serve`: the workflows of a folder as LangGraph assistants over HTTP.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use super::exit;
use crate::run::{DbOption, MockOption, RunOptions};

/// Serve every workflow of a folder with the LangGraph Server API, for LangGraph's SDKs and
/// agent-chat-ui (`get_client(url="http://127.0.0.1:2024")`).
///
/// Each workflow file is a graph named by its file stem; a workflow in a subfolder is served
/// when it declares `serve:` (named by its path, `mindmap/expand.yaml` as `mindmap-expand`),
/// with the HTTP routes it declares of its own. A file that does not validate is reported and
/// not served. Without `--api-key-env` only loopback addresses are accepted.
///
/// Example: runner serve workflows --port 2024
#[derive(clap::Args, Debug)]
pub(super) struct Args {
    #[command(flatten)]
    runs: Runs,
    /// The address to listen on (a loopback address unless `--api-key-env` is given).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// The port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 2024)]
    port: u16,
    /// Require the API key held by this environment variable on every request but `GET /ok`,
    /// as `x-api-key` (what LangGraph's SDKs send from `LANGGRAPH_API_KEY`) or
    /// `Authorization: Bearer`.
    #[arg(long, value_name = "NAME")]
    api_key_env: Option<String>,
    /// Accept JWT bearer tokens signed by a key of this JWKS (fetched and cached; also
    /// `jwks_url` in `[serve.auth]`): the token's `sub` is the user, who sees only what they
    /// made.
    #[arg(long, value_name = "URL")]
    jwks_url: Option<String>,
    /// Accept JWT bearer tokens signed (HS256) with the secret this environment variable holds.
    #[arg(long, value_name = "NAME", conflicts_with = "jwks_url")]
    jwt_secret_env: Option<String>,
    /// The `iss` a token must carry.
    #[arg(long, value_name = "ISSUER")]
    jwt_issuer: Option<String>,
    /// An `aud` a token may carry (repeatable: one of them is required).
    #[arg(long, value_name = "AUDIENCE")]
    jwt_audience: Vec<String>,
    /// Accept the per-user API keys `runner users add` makes, as `x-api-key`.
    #[arg(long)]
    user_keys: bool,
    /// How many runs execute at once (LangGraph's N_JOBS_PER_WORKER); the others wait as
    /// `pending` and start in the order they were created. A served run is a task, not a
    /// thread: the default, 256, bounds the model calls and memory of a busy server rather
    /// than its cores. With a PostgreSQL database, `0` serves the API only: the runs execute on
    /// `runner worker` processes (or other servers) sharing the database.
    #[arg(long, value_name = "N", default_value_t = 256)]
    workers: u32,
    /// How long a request's head may take to arrive once its first byte has, in seconds; a
    /// slower client (a slowloris) is cut off.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = positive_secs)]
    header_read_timeout: Duration,
    /// How long a connection may stay open with no request in progress, in seconds. A request
    /// being handled or answered (a stream, however long) is never cut.
    #[arg(long, value_name = "SECS", default_value = "120", value_parser = positive_secs)]
    idle_timeout: Duration,
}

/// Execute the runs of servers that share a PostgreSQL database, serving no API (with `--port`,
/// only a probe and metrics): the runs of the workflows of a folder, claimed from the
/// database's queue as clients of any `runner serve` create them. Workers and servers scale
/// apart; a worker that dies loses its runs to another once its lease expires, and that one
/// resumes each from its last checkpoint.
///
/// Example: runner worker workflows --db postgres://runner@db/runner --workers 16
#[derive(clap::Args, Debug)]
pub(super) struct WorkerArgs {
    #[command(flatten)]
    runs: Runs,
    /// How many runs this worker executes at once.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,
    /// Serve `GET /ok` (`?check_db=1`: and whether the database answers) and `GET /metrics`
    /// (the runs this worker executes, and the queue's depth across every process) on this port,
    /// for a liveness probe and a metrics scraper (0: any free port, printed at start). Nothing
    /// else is served there: no run can be started or read through it. None by default.
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,
    /// The address the `--port` endpoints listen on.
    #[arg(long, default_value = "127.0.0.1", requires = "port")]
    host: IpAddr,
}

/// What a server and a worker both take: the workflows and how their runs are built.
#[derive(clap::Args, Debug)]
struct Runs {
    /// The folder of workflow files (`*.test.yaml` files are not workflows).
    #[arg(default_value = "workflows")]
    dir: PathBuf,
    /// The checkpoint database (default: $RUNNER_DB, else .runner/runner.db): a SQLite file,
    /// or `postgres://USER@HOST/DB` for a database many servers and workers share.
    // Not `env = …` (here or on any flag): the run builder reads the variables, so a bad value
    // is named as the variable (and the file) it came from, not as the flag.
    #[arg(long)]
    db: Option<PathBuf>,
    /// The data database: search indexes and long-term memory, a SQLite file or
    /// `postgres://…` (default: $RUNNER_DATA_DB, else the `--db` database when it is PostgreSQL,
    /// else .runner/data.db).
    #[arg(long, value_name = "PATH|URL")]
    data_db: Option<PathBuf>,
    /// Index the store for semantic search with this embedder, as LangGraph's store `index`:
    /// `offline` (lexical, no model) or `PROVIDER:MODEL[@URL]` (e.g. `ollama:nomic-embed-text`,
    /// `openai:text-embedding-3-small`). `POST /store/items/search` with a `query`, and `store`
    /// nodes, then rank by meaning (also `RUNNER_STORE_INDEX`).
    #[arg(long, value_name = "EMBEDDER")]
    store_index: Option<String>,
    /// A field of a stored value that index embeds, e.g. `text` or `notes[*].body`
    /// (repeatable; default `$`, the whole value; also `RUNNER_STORE_INDEX_FIELDS`).
    #[arg(long = "store-index-field", value_name = "PATH")]
    store_index_fields: Vec<String>,
    /// Serve every model from this scripted mock (offline use and tests); each run reads the
    /// script from its start.
    #[arg(long, value_name = "SCRIPT")]
    mock: Option<PathBuf>,
    /// Serve a model profile from another model: `PROFILE=PROVIDER:MODEL[@URL]`.
    #[arg(long = "model", value_name = "PROFILE=SPEC")]
    model: Vec<String>,
    /// How long a thread's lease lasts without a heartbeat, in seconds (default:
    /// $RUNNER_LEASE_TTL, else 10).
    #[arg(long, value_name = "SECS")]
    lease_ttl: Option<f64>,
    /// A config override for every run: `path.to.key=value`, for the served workflows whose
    /// `config` has the path; a run's `config.configurable` still overrides it for that run.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    set: Vec<String>,
    /// Let the http, search and scrape kinds reach this host, address or CIDR although it is
    /// private or loopback (repeatable; also `RUNNER_ALLOW_NET`, comma-separated).
    #[arg(long = "allow-net", value_name = "HOST|CIDR")]
    allow_net: Vec<String>,
    /// Let load and index read files under this directory besides the workflow's own
    /// directory tree (repeatable; also `RUNNER_ALLOW_READ`, separated as in PATH).
    #[arg(long = "allow-read", value_name = "DIR")]
    allow_read: Vec<PathBuf>,
    /// On SIGTERM or Ctrl-C, how long to wait for every run to reach its next step boundary
    /// (and every response to end) before exiting, in seconds. A run stopped there continues
    /// from that checkpoint on the next start; one still in a step past the timeout runs that
    /// step again. A second signal stops at once.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = secs)]
    shutdown_timeout: Duration,
    /// Give every thread created without a `ttl` of its own this time to live, in minutes
    /// (LangGraph's `checkpointer.ttl.default_ttl`): once idle that long, it is deleted.
    #[arg(long, value_name = "MINUTES", value_parser = positive_minutes)]
    thread_ttl: Option<f64>,
    /// How often expired threads are looked for and deleted, in seconds (LangGraph's
    /// `sweep_interval_minutes`; default 300).
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = positive_secs)]
    ttl_sweep_interval: Duration,
    /// Sign every run webhook with the secret held by this environment variable: a
    /// `runner-signature: t=UNIX_SECONDS,v1=HEX` header, HEX the HMAC-SHA256 of the timestamp,
    /// a `.` and the body.
    #[arg(long, value_name = "NAME")]
    webhook_secret_env: Option<String>,
    /// Read the scheduler's and the TTL sweeper's time, in milliseconds since the epoch, from
    /// this file instead of the system clock (for tests of schedules and of clock skew).
    #[arg(long, value_name = "PATH", hide = true)]
    clock_file: Option<PathBuf>,
}

impl Runs {
    /// The servers' thread TTL settings.
    fn ttls(&self) -> crate::server::ThreadTtls {
        crate::server::ThreadTtls {
            default_minutes: self.thread_ttl,
            sweep_every: self.ttl_sweep_interval,
        }
    }

    /// How the server's schedules and webhooks run: the clock, and the webhooks' secret read
    /// from `env`.
    fn triggers(&self, env: &crate::run::Env) -> anyhow::Result<crate::server::TriggerOptions> {
        let webhook_secret = match &self.webhook_secret_env {
            Some(name) => match env.get(name) {
                Some(secret) if !secret.is_empty() => Some(secret),
                _ => bail!("--webhook-secret-env {name}: the variable {name} is not set or is empty"),
            },
            None => None,
        };
        Ok(crate::server::TriggerOptions {
            clock: self
                .clock_file
                .clone()
                .map_or(crate::server::Clock::System, crate::server::Clock::File),
            webhook_secret,
        })
    }
}

/// A number of minutes, more than `0`.
fn positive_minutes(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|m| m.is_finite() && *m > 0.0)
        .ok_or_else(|| format!("`{text}` is not a number of minutes more than 0"))
}

/// A duration in seconds, `0` or more (fractions allowed).
fn secs(text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("`{text}` is not a number of seconds, 0 or more"))
}

/// A duration in seconds, more than `0`.
fn positive_secs(text: &str) -> Result<Duration, String> {
    secs(text)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("`{text}` is not a number of seconds more than 0"))
}

/// The run settings and the folder's graphs, what was not served reported; `doing` names what
/// is done with them.
fn load(
    runs: &Runs,
    env: &crate::run::Env,
    project_models: Vec<String>,
    doing: &str,
) -> anyhow::Result<(crate::server::Graphs, crate::run::RunSettings)> {
    load_with(runs, env, project_models, doing, Dev::No)
}

/// Whether a server is `runner dev`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dev {
    No,
    Yes,
}

fn load_with(
    runs: &Runs,
    env: &crate::run::Env,
    project_models: Vec<String>,
    doing: &str,
    dev: Dev,
) -> anyhow::Result<(crate::server::Graphs, crate::run::RunSettings)> {
    let config = runs
        .set
        .iter()
        .map(|kv| super::run::parse_kv(kv))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let db = match (&runs.db, dev) {
        (Some(db), _) => Some(DbOption::At(db.clone())),
        // As `langgraph dev`'s: in memory, every checkpoint kept for time travel, unless a
        // database is named (by the flag or $RUNNER_DB).
        (None, Dev::Yes) if env.get(crate::run::env::DB).is_none() => Some(DbOption::Scratch),
        (None, _) => None,
    };
    let settings = RunOptions {
        db,
        data_db: runs.data_db.clone(),
        store_index: runs.store_index.clone(),
        store_index_fields: runs.store_index_fields.clone(),
        mock: runs.mock.clone().map(MockOption::File),
        models: runs.model.clone(),
        project_models,
        lease_ttl: runs.lease_ttl,
        allow_net: runs.allow_net.clone(),
        allow_read: runs.allow_read.clone(),
        config,
        // A busy thread is answered at once (409), never waited for.
        wait: Some(false),
        ..RunOptions::default()
    }
    .resolve(env)?;
    let (graphs, rejected) =
        crate::server::load(&runs.dir).with_context(|| format!("cannot read the folder {}", runs.dir.display()))?;
    let mut err = std::io::stderr().lock();
    for r in &rejected {
        writeln!(err, "not served: {} {}", r.path.display(), r.reason)?;
        err.write_all(r.why.as_bytes())?;
    }
    // A dev server waits for the folder's workflows to be fixed.
    if graphs.ids().is_empty() && dev == Dev::No {
        bail!("no workflow in {} validates: nothing to serve", runs.dir.display());
    }
    check_set(&graphs, &settings.overrides.config)?;
    writeln!(err, "{doing} {}", graphs.ids().join(", "))?;
    Ok((graphs, settings))
}

/// `runner worker`: the runs of a shared database's queue, executed until SIGTERM or Ctrl-C;
/// then its runs stop at their next step boundary and go back to the queue.
pub(super) fn work(args: WorkerArgs) -> anyhow::Result<u8> {
    share_malloc_arenas();
    let (env, project_models) = super::project_env()?;
    let (graphs, settings) = load(&args.runs, &env, project_models, "working on")?;
    // A worker has no callers; the runs it executes spend their users' quotas.
    let (serve, file) = super::project_serve()?;
    let auth = crate::server::auth::AuthConfig {
        quotas: quotas(&serve, file.as_deref())?,
        ..Default::default()
    };
    if !settings.checkpoints.value.is_shared() {
        bail!(
            "{}: a worker takes its runs from a database that servers share; use PostgreSQL (--db postgres://…)",
            settings.checkpoints.source
        );
    }
    let triggers = args.runs.triggers(&env)?;
    let server = crate::server::Server::new(
        graphs,
        settings,
        auth,
        usize::try_from(args.workers).unwrap_or(usize::MAX),
        args.runs.ttls(),
    )?
    .with_triggers(triggers);
    let reloader = server.reloader();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        reload_on_hangup(reloader, args.runs.dir.clone());
        let signals = stop_signals();
        let timeout = args.runs.shutdown_timeout;
        let stopping = first_signal(
            &signals,
            format!(
                "stopping: waiting up to {} s for runs to reach a step boundary and go back to the queue (again to stop now)",
                timeout.as_secs_f64()
            ),
        );
        let ops = match args.port {
            Some(port) => {
                let addr = SocketAddr::new(args.host, port);
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr}"))?;
                let _ = writeln!(std::io::stderr(), "health and metrics on http://{}", listener.local_addr()?);
                Some(listener)
            }
            None => None,
        };
        let _ = writeln!(std::io::stderr(), "working: {} runs at once", args.workers);
        let mut second = signals;
        tokio::select! {
            () = server.work(timeout, ops, stopping) => {}
            Ok(_) = second.wait_for(|n| *n >= 2) => {}
        }
        Ok(exit::OK)
    })
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    serve(args, Dev::No)
}

/// `runner dev`: `runner serve` with the page's URL printed, its folder watched and reloaded as
/// its files change, and an in-memory database unless one is named.
pub(super) fn dev(args: DevArgs) -> anyhow::Result<u8> {
    serve(args.serve, Dev::Yes)
}

/// Serve the workflows of a folder for development, as `langgraph dev` does: `runner serve`
/// (every flag of it) whose folder is watched — a workflow, prompt or schema file changed,
/// added or removed reloads it, and `GET /runner/workflows` says what is served and why a file
/// is not, with each diagnostic's file, line and column —, whose checkpoints are kept in
/// memory unless `--db` (or $RUNNER_DB) names a database, and whose Studio page's URL is
/// printed.
///
/// Example: runner dev workflows --mock tests/fixtures/mock/mindmap.yaml
#[derive(clap::Args, Debug)]
pub(super) struct DevArgs {
    #[command(flatten)]
    serve: Args,
}

fn serve(args: Args, dev: Dev) -> anyhow::Result<u8> {
    share_malloc_arenas();
    let (env, project_models) = super::project_env()?;
    let auth = auth_config(&args, &env)?;
    if !args.host.is_loopback() && !auth.required() {
        bail!(
            "--host {}: without credentials (--api-key-env, --jwks-url, --jwt-secret-env, --user-keys or [serve.auth]) anyone who can reach the address could run the workflows, so runner serve listens only on a loopback address (127.0.0.1 or ::1)",
            args.host
        );
    }
    let (graphs, settings) = load_with(&args.runs, &env, project_models, "serving", dev)?;
    let mut err = std::io::stderr().lock();
    if dev == Dev::Yes && settings.checkpoints.value == crate::run::Checkpoints::Scratch {
        writeln!(
            err,
            "checkpoints: in memory, every one kept until exit (--db PATH keeps them)"
        )?;
    }
    for (method, path, graph) in graphs.routes() {
        writeln!(err, "route {method} {path} -> {graph}")?;
    }
    let triggers = args.runs.triggers(&env)?;
    let mut server = crate::server::Server::new(
        graphs,
        settings,
        auth,
        usize::try_from(args.workers).unwrap_or(usize::MAX),
        args.runs.ttls(),
    )?
    .with_triggers(triggers);
    if dev == Dev::Yes {
        server = server.dev();
    }
    let reloader = server.reloader();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        reload_on_hangup(reloader.clone(), args.runs.dir.clone());
        if dev == Dev::Yes {
            super::dev::watch(reloader, args.runs.dir.clone());
        }
        let addr = SocketAddr::new(args.host, args.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let bound = listener.local_addr()?;
        writeln!(err, "listening on http://{bound}")?;
        if dev == Dev::Yes {
            writeln!(err, "Studio: http://{bound}/")?;
            writeln!(err, "watching {} for changes", args.runs.dir.display())?;
        }
        drop(err);
        let timeouts = crate::server::Timeouts {
            header_read: args.header_read_timeout,
            idle: args.idle_timeout,
            shutdown: args.runs.shutdown_timeout,
        };
        let signals = stop_signals();
        let stopping = first_signal(
            &signals,
            format!(
                "stopping: waiting up to {} s for runs to reach a step boundary (again to stop now)",
                timeouts.shutdown.as_secs_f64()
            ),
        );
        let mut second = signals;
        tokio::select! {
            () = server.serve(listener, timeouts, stopping) => {}
            Ok(_) = second.wait_for(|n| *n >= 2) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "stopped: runs in the middle of a step run it again on the next start"
                );
            }
        }
        Ok(exit::OK)
    })
}

/// Who may call the server: its flags over the project's `[serve.auth]`; secrets read from the
/// variables they name.
fn auth_config(args: &Args, env: &crate::run::Env) -> anyhow::Result<crate::server::auth::AuthConfig> {
    use crate::server::auth::{AuthConfig, JwtConfig, JwtKeys};
    let (serve, file) = super::project_serve()?;
    let toml = |key: &str| match &file {
        Some(f) => format!("{} [serve.auth] {key}", f.display()),
        None => key.to_string(),
    };
    let a = &serve.auth;
    let secret = |name: &str, said: String| -> anyhow::Result<String> {
        match env.get(name) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => bail!("{said}: the variable {name} is not set or is empty"),
        }
    };
    let api_key = match (&args.api_key_env, &a.api_key_env) {
        (Some(name), _) => Some(secret(name, format!("--api-key-env {name}"))?),
        (None, Some(name)) => Some(secret(name, toml("api_key_env"))?),
        (None, None) => None,
    };
    let keys = match (&args.jwks_url, &args.jwt_secret_env) {
        (Some(url), _) => Some(JwtKeys::Jwks(url.clone())),
        (None, Some(name)) => Some(JwtKeys::Secret(secret(name, format!("--jwt-secret-env {name}"))?)),
        (None, None) => match (&a.jwks_url, &a.jwt_secret_env) {
            (Some(_), Some(_)) => bail!("{}: name jwks_url or jwt_secret_env, not both", toml("jwks_url")),
            (Some(url), None) => Some(JwtKeys::Jwks(url.clone())),
            (None, Some(name)) => Some(JwtKeys::Secret(secret(name, toml("jwt_secret_env"))?)),
            (None, None) => None,
        },
    };
    let secs = |v: Option<f64>, key: &str, default: std::time::Duration| -> anyhow::Result<std::time::Duration> {
        match v {
            None => Ok(default),
            Some(s) => std::time::Duration::try_from_secs_f64(s)
                .map_err(|_| anyhow::anyhow!("{}: `{s}` is not a number of seconds, 0 or more", toml(key))),
        }
    };
    let jwt = match keys {
        Some(keys) => {
            let mut c = JwtConfig::new(keys);
            c.issuer = args.jwt_issuer.clone().or_else(|| a.issuer.clone());
            c.audience = if args.jwt_audience.is_empty() {
                a.audience.0.clone()
            } else {
                args.jwt_audience.clone()
            };
            if let Some(l) = a.leeway {
                c.leeway = std::time::Duration::from_secs(l);
            }
            if let Some(claim) = &a.user_claim {
                c.user_claim = claim.clone();
            }
            if let Some(claim) = &a.admin_claim {
                c.admin_claim = claim.clone();
            }
            if let Some(value) = &a.admin_value {
                c.admin_value = value.clone();
            }
            c.jwks_cache = secs(a.jwks_cache, "jwks_cache", c.jwks_cache)?;
            c.jwks_min_refresh = secs(a.jwks_min_refresh, "jwks_min_refresh", c.jwks_min_refresh)?;
            Some(c)
        }
        None => {
            if args.jwt_issuer.is_some() || !args.jwt_audience.is_empty() {
                bail!(
                    "--jwt-issuer and --jwt-audience check bearer tokens: name their keys with --jwks-url or --jwt-secret-env"
                );
            }
            None
        }
    };
    Ok(AuthConfig {
        api_key,
        jwt,
        user_keys: args.user_keys || a.user_keys.unwrap_or(false),
        quotas: quotas(&serve, file.as_deref())?,
    })
}

/// `[serve.quotas]`, read: none when the table is absent.
fn quotas(
    serve: &crate::run::ServeFile,
    file: Option<&std::path::Path>,
) -> anyhow::Result<Option<crate::server::auth::Quotas>> {
    let Some(q) = &serve.quotas else {
        return Ok(None);
    };
    let where_ = file.map_or_else(String::new, |f| format!("{}: ", f.display()));
    let window = match &q.window {
        None => Duration::from_secs(86_400),
        Some(crate::run::WindowText::Secs(s)) => Duration::try_from_secs_f64(*s)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                anyhow::anyhow!("{where_}[serve.quotas] window: `{s}` is not a number of seconds more than 0")
            })?,
        Some(crate::run::WindowText::Text(t)) => crate::server::auth::quota::parse_window(t)
            .map_err(|e| anyhow::anyhow!("{where_}[serve.quotas] window: {e}"))?,
    };
    Ok(Some(crate::server::auth::Quotas {
        window,
        limits: crate::checkpoint::QuotaLimits {
            runs: q.runs,
            tokens: q.tokens,
            cost: q.cost,
        },
    }))
}

/// A `--set` path that no served workflow's config has would change nothing: most often a
/// misspelt key.
fn check_set(graphs: &crate::server::Graphs, config: &[(String, serde_json::Value)]) -> anyhow::Result<()> {
    let plans: Vec<_> = graphs.ids().iter().filter_map(|id| graphs.find(id)).collect();
    for (path, _) in config {
        if plans.iter().any(|g| crate::run::config_has(g.plan.config(), path)) {
            continue;
        }
        let keys = plans
            .iter()
            .filter_map(|g| g.plan.config().as_object())
            .flat_map(|c| c.keys().map(String::as_str))
            .filter(|k| *k != path.split('.').next().unwrap_or(path));
        let first = path.split('.').next().unwrap_or(path);
        let hint = crate::diag::did_you_mean(first, keys)
            .map(|k| format!(" (did you mean `{k}`?)"))
            .unwrap_or_default();
        bail!("--set {path}: no served workflow has `{path}` in its config{hint}");
    }
    Ok(())
}

/// SIGHUP reloads the folder: new workflows are served, changed ones recompiled, removed ones
/// dropped; one that stops validating is reported and keeps serving its previous version.
fn reload_on_hangup(reloader: crate::server::Reloader, dir: PathBuf) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangup) = signal(SignalKind::hangup()) else {
            return;
        };
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                reload(&reloader, &dir);
            }
        });
    }
    #[cfg(not(unix))]
    {
        let _ = (reloader, dir);
    }
}

/// Reloads the folder and says what changed, and what is not served and why.
pub(super) fn reload(reloader: &crate::server::Reloader, dir: &std::path::Path) {
    let report = reloader.reload(dir);
    let mut err = std::io::stderr().lock();
    // The report is for an operator: a closed stderr loses it and nothing else.
    let _ = match report {
        Ok(r) => {
            for rejected in &r.rejected {
                let kept = if r.kept.contains(&rejected.path) {
                    " (its previous version is still served)"
                } else {
                    ""
                };
                let _ = writeln!(err, "not served: {} {}{kept}", rejected.path.display(), rejected.reason);
                let _ = err.write_all(rejected.why.as_bytes());
            }
            writeln!(
                err,
                "reloaded {}: added [{}], changed [{}], removed [{}]",
                dir.display(),
                r.added.join(", "),
                r.changed.join(", "),
                r.removed.join(", ")
            )
        }
        Err(e) => writeln!(err, "cannot reload {}: {e}; serving what was served", dir.display()),
    };
}

/// Resolves at the first stop signal, saying `message` on stderr.
fn first_signal(
    signals: &tokio::sync::watch::Receiver<u32>,
    message: String,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut first = signals.clone();
    async move {
        // A closed channel means no signal can come: the process runs until it is killed.
        if first.wait_for(|n| *n >= 1).await.is_err() {
            std::future::pending::<()>().await;
        }
        // For an operator watching the terminal; a closed stderr loses it and nothing else.
        let _ = writeln!(std::io::stderr(), "{message}");
    }
}

/// Counts Ctrl-C and SIGTERM as they come: at the first the server stops accepting, lets its
/// runs reach a step boundary, and ends; at the second it ends at once.
fn stop_signals() -> tokio::sync::watch::Receiver<u32> {
    let (count, counted) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        loop {
            #[cfg(unix)]
            let signalled = match &mut term {
                Some(term) => tokio::select! {
                    r = tokio::signal::ctrl_c() => r.is_ok(),
                    r = term.recv() => r.is_some(),
                },
                None => tokio::signal::ctrl_c().await.is_ok(),
            };
            #[cfg(not(unix))]
            let signalled = tokio::signal::ctrl_c().await.is_ok();
            // No signal can be listened for: the count stays, and the server runs on.
            if !signalled {
                std::future::pending::<()>().await;
            }
            count.send_modify(|n| *n += 1);
        }
    });
    counted
}

/// The server's threads share two malloc arenas, unless `MALLOC_ARENA_MAX` says otherwise.
///
/// glibc gives threads up to eight arenas a core, and what a thread frees stays in its arena
/// for the threads that use it. A server's tokio workers and blocking-pool threads each took
/// one, so memory freed on one thread was not reused on another: with 200 streams open after
/// about 2,700 runs, 30.8-30.9 MiB resident with the default and 27.2-27.3 MiB with two arenas,
/// at the same runs a second. `runner run` keeps glibc's default: its engine and its
/// checkpoint writer allocate at the same time, and on one arena a checkpointed step took 25%
/// longer.
fn share_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt sets one of malloc's parameters and touches nothing else; it is
        // called before the server starts its threads.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}
