//! `runner run` and `runner resume`: run a workflow on a thread, stream progress to stderr,
//! print the result on stdout.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, bail};
use serde_json::Value;

use super::{exit, render, store};
use crate::checkpoint::CheckpointError;
use crate::compile::compile_file;
use crate::diag;
use crate::engine::events::Events;
use crate::engine::{Engine, EngineError, Persist, RunRequest, Status};
use crate::run::{CassetteOption, DbOption, MockOption, RunOptions, RunSettings, Start};

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Stream {
    /// A live view for people (the default on a terminal).
    Human,
    /// One JSON event per line (documented in README; stable).
    Jsonl,
    /// Nothing (the default when stderr is not a terminal).
    None,
}

/// How the result is printed on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(super) enum OutputFormat {
    #[default]
    Json,
    Yaml,
}

/// When checkpoints are committed, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PersistArg {
    /// Each step's checkpoint is committed before the next step starts.
    #[default]
    Sync,
    /// Checkpoints are committed in the background, in order; the run waits for them at its end.
    Async,
    /// Only the run's last checkpoint is written (when it ends, fails or is interrupted).
    Exit,
}

impl From<PersistArg> for Persist {
    fn from(arg: PersistArg) -> Self {
        match arg {
            PersistArg::Sync => Persist::Sync,
            PersistArg::Async => Persist::Async,
            PersistArg::Exit => Persist::Exit,
        }
    }
}

/// Options shared by `run` and `resume`.
#[derive(clap::Args, Debug, Clone)]
pub(super) struct Common {
    /// The checkpoint database (default: $RUNNER_DB, else .runner/runner.db; `:memory:` keeps
    /// nothing).
    // Not `env = …` (here or on any flag): the run builder reads the variables, so a bad value
    // is named as the variable (and the file) it came from, not as the flag.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// How progress is shown on stderr.
    #[arg(long, value_enum)]
    pub stream: Option<Stream>,
    /// How the result is printed on stdout.
    #[arg(long, value_enum, default_value_t)]
    pub output: OutputFormat,
    /// The most supersteps this run may take (overrides the workflow's `limits`).
    #[arg(long)]
    pub recursion_limit: Option<u32>,
    /// When checkpoints are committed.
    #[arg(long, value_enum, default_value_t)]
    pub persist: PersistArg,
    /// How hard SQLite works to keep a commit.
    #[arg(long, value_enum, default_value_t)]
    pub durability: store::DurabilityArg,
    /// Serve every model from this scripted mock (offline runs and tests).
    #[arg(long, value_name = "SCRIPT")]
    pub mock: Option<PathBuf>,
    /// Serve a model profile from another model for this run: `PROFILE=PROVIDER:MODEL[@URL]`,
    /// e.g. `default=ollama:llama3.2`, `default=anthropic:claude-3-5-haiku-latest`,
    /// `fast=llamacpp:any@http://127.0.0.1:8080/v1`.
    #[arg(long = "model", value_name = "PROFILE=SPEC")]
    pub model: Vec<String>,
    /// A model profile's price per million prompt and completion tokens, for usage and cost
    /// caps: `PROFILE=IN,OUT`, e.g. `default=0.15,0.6`. A `--model` whose price is not known
    /// (see docs/language.md) costs 0 unless given one here.
    #[arg(long = "price", value_name = "PROFILE=IN,OUT")]
    pub price: Vec<String>,
    /// A model profile's context window in tokens, prompt and reply together: `PROFILE=TOKENS`,
    /// e.g. `default=4096` for a `--model` served by `llama-server -c 4096`. A prompt that
    /// would not fit is trimmed by its node's `fit` policy before the call.
    #[arg(long = "model-context", value_name = "PROFILE=TOKENS")]
    pub model_context: Vec<String>,
    /// Record every model call and web request with its response to this JSONL cassette;
    /// secrets are scrubbed.
    #[arg(long, value_name = "FILE", conflicts_with = "replay")]
    pub record: Option<PathBuf>,
    /// Serve every model call and web request from this cassette, with no network; a request
    /// it does not hold fails the run, naming the closest recorded one.
    #[arg(long, value_name = "FILE", conflicts_with = "mock")]
    pub replay: Option<PathBuf>,
    /// The data database: search indexes and long-term memory, a SQLite file or
    /// `postgres://…` (default: $RUNNER_DATA_DB, else the `--db` database when it is PostgreSQL,
    /// else .runner/data.db; `:memory:` keeps nothing). Opened only by runs that use them.
    #[arg(long, value_name = "PATH|URL")]
    pub data_db: Option<PathBuf>,
    /// Index long-term memory for semantic search with this embedder: `offline` (lexical, no
    /// model) or `PROVIDER:MODEL[@URL]` (e.g. `ollama:nomic-embed-text`); `store` nodes then
    /// search by meaning (also `RUNNER_STORE_INDEX`).
    #[arg(long, value_name = "EMBEDDER")]
    pub store_index: Option<String>,
    /// A field of a stored value that index embeds, e.g. `text` or `notes[*].body`
    /// (repeatable; default `$`, the whole value; also `RUNNER_STORE_INDEX_FIELDS`).
    #[arg(long = "store-index-field", value_name = "PATH")]
    pub store_index_fields: Vec<String>,
    /// Let the http, search and scrape kinds reach this host, address or CIDR although it is
    /// private or loopback (repeatable; also `RUNNER_ALLOW_NET`, comma-separated).
    #[arg(long = "allow-net", value_name = "HOST|CIDR")]
    pub allow_net: Vec<String>,
    /// Let load and index read files under this directory besides the workflow's own
    /// directory tree (repeatable; also `RUNNER_ALLOW_READ`, separated as in PATH).
    #[arg(long = "allow-read", value_name = "DIR")]
    pub allow_read: Vec<PathBuf>,
    /// When another process runs the thread, wait until it ends (polling), then go on; without
    /// it the command exits 2 at once.
    #[arg(long)]
    pub wait: bool,
    /// How long the thread's lease lasts without a heartbeat, in seconds (default:
    /// $RUNNER_LEASE_TTL, else 10). A run killed outright frees its thread after this long (at
    /// once for a run on the same host whose process is gone).
    #[arg(long, value_name = "SECS")]
    pub lease_ttl: Option<f64>,
}

impl Common {
    /// What these flags say about a run, for the run builder.
    fn options(&self, force: bool) -> RunOptions {
        RunOptions {
            db: self.db.clone().map(DbOption::At),
            durability: Some(self.durability.into()),
            data_db: self.data_db.clone(),
            store_index: self.store_index.clone(),
            store_index_fields: self.store_index_fields.clone(),
            mock: self.mock.clone().map(MockOption::File),
            cassette: match (&self.record, &self.replay) {
                (Some(path), _) => Some(CassetteOption::Record(path.clone())),
                (None, Some(path)) => Some(CassetteOption::Replay(path.clone())),
                (None, None) => None,
            },
            models: self.model.clone(),
            project_models: Vec::new(),
            prices: self.price.clone(),
            contexts: self.model_context.clone(),
            allow_net: self.allow_net.clone(),
            allow_read: self.allow_read.clone(),
            lease_ttl: self.lease_ttl,
            wait: Some(self.wait),
            recursion_limit: self.recursion_limit,
            persist: Some(self.persist.into()),
            force: Some(force),
            // `--set` is `run`'s, recorded with the thread it starts (see `RunArgs`).
            config: Vec::new(),
            kinds: None,
        }
    }
}

/// Run a workflow, or continue one of its threads.
///
/// Progress goes to stderr, the result (the workflow's `output` keys, or its whole state) to
/// stdout. Exit 0 done, 1 failed, 2 usage error, 3 interrupted (waiting for an answer), 130
/// cancelled (Ctrl-C stops at a step boundary; the thread is resumable).
///
/// Example: runner run workflows/research.yaml --input query="How do heat pumps work?"
#[derive(clap::Args, Debug)]
pub(super) struct RunArgs {
    /// The workflow file.
    file: PathBuf,
    /// An input field: `key=value` (JSON if it parses as JSON, else a string; `@path` reads a
    /// file, `@-` standard input; `@@text` is the text `@text`, e.g. `question=@@guide.md what
    /// changed?`).
    #[arg(long = "input", short = 'i', value_name = "KEY=VALUE")]
    input: Vec<String>,
    /// The whole input from a JSON or YAML file (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    input_file: Option<PathBuf>,
    /// A config override: `path.to.key=value`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    set: Vec<String>,
    /// A context field: `key=value` (e.g. `user_id=alice`).
    #[arg(long = "context", value_name = "KEY=VALUE")]
    context: Vec<String>,
    /// The thread: continue it if it exists, else start it under this id (default: a new id).
    #[arg(long)]
    thread: Option<String>,
    /// Continue a thread even though its workflow changed incompatibly.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    common: Common,
}

/// Continue an interrupted (or crashed) thread with the workflow recorded with it.
///
/// Example: runner resume --thread 0192f0c4-... --answer '{"action": "accept"}'
#[derive(clap::Args, Debug)]
pub(super) struct ResumeArgs {
    /// The thread.
    #[arg(long)]
    thread: String,
    /// The answer to the pending interrupt: JSON, or `@file` with JSON. When several
    /// interrupts wait, say which: `NODE_OR_ID=JSON` (e.g. `--answer review='"ok"'`).
    #[arg(long, value_name = "[NODE_OR_ID=]JSON")]
    answer: Option<String>,
    /// Continue even though the workflow file changed incompatibly.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    common: Common,
}

pub(super) fn run(args: RunArgs) -> anyhow::Result<u8> {
    let mut input = match &args.input_file {
        Some(f) => read_data_file(f)?,
        None => Value::Object(Default::default()),
    };
    for kv in &args.input {
        let (k, v) = parse_kv(kv)?;
        input
            .as_object_mut()
            .context("--input-file must hold an object")?
            .insert(k, v);
    }
    let mut context = serde_json::Map::new();
    for kv in &args.context {
        let (k, v) = parse_kv(kv)?;
        context.insert(k, v);
    }
    let config = args
        .set
        .iter()
        .map(|kv| parse_kv(kv))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.file == Path::new(crate::spec::load::STDIN) {
        bail!(
            "runner run needs a workflow file, not standard input: a thread records its workflow's path to be resumed"
        );
    }
    // Compile first: its transient memory is gone before the store's caches arrive.
    let Some(plan) = compile(&args.file)? else {
        return Ok(exit::INVALID);
    };
    let (env, project_models) = super::project_env()?;
    let settings = RunOptions {
        project_models,
        ..args.common.options(args.force)
    }
    .resolve(&env)?;
    let store = settings.open_store()?;
    let request = settings.overrides.start(Start {
        thread_id: args.thread.clone(),
        workflow: absolute(&args.file).display().to_string(),
        input,
        // On an existing thread, new input starts a new turn; without it the thread continues.
        input_given: !args.input.is_empty() || args.input_file.is_some(),
        context: Value::Object(context),
        config,
    });
    execute(plan, request, &args.common, &settings, store)
}

pub(super) fn resume(args: ResumeArgs) -> anyhow::Result<u8> {
    let (env, project_models) = super::project_env()?;
    let settings = RunOptions {
        project_models,
        ..args.common.options(args.force)
    }
    .resolve(&env)?;
    let store = settings.open_store()?;
    let Some(thread) = store.get_thread(&args.thread)? else {
        bail!(
            "thread `{}` does not exist in {}",
            args.thread,
            settings.checkpoints.value
        );
    };
    let (answer_to, answer) = match &args.answer {
        Some(a) => {
            let (to, value) = parse_answer(a)?;
            (to, Some(value))
        }
        None => (None, None),
    };
    let request = settings
        .overrides
        .answer(thread.thread_id.clone(), thread.workflow.clone(), answer, answer_to);
    let Some(plan) = compile(Path::new(&thread.workflow))? else {
        return Ok(exit::INVALID);
    };
    execute(plan, request, &args.common, &settings, store)
}

/// Compiles the workflow, or prints why it cannot run.
pub(super) fn compile(file: &Path) -> anyhow::Result<Option<Arc<crate::compile::Plan>>> {
    if !file.is_file() {
        bail!("workflow file {} does not exist", file.display());
    }
    let (plan, result) = compile_file(file, &crate::nodes::builtin().decls());
    if plan.is_none() {
        eprint!(
            "{}",
            diag::render(
                &result.diagnostics,
                &result.files,
                super::human_format(&std::io::stderr())
            )
        );
    }
    Ok(plan)
}

/// A mock script's replies for a node the workflow does not have would never be used: most
/// often a misspelt node name, which would leave the real node unscripted.
fn check_mock(plan: &crate::compile::Plan, common: &Common) -> anyhow::Result<()> {
    let Some(path) = &common.mock else {
        return Ok(());
    };
    let mock = crate::providers::mock::MockProvider::from_file(path)
        .map_err(|e| anyhow::anyhow!("mock script {}: {e}", path.display()))?;
    let names = plan.all_node_names();
    let unknown = mock.replies_for_unknown_nodes(&names);
    if let Some(first) = unknown.first() {
        let hint = crate::diag::did_you_mean(first, names.iter().copied())
            .map(|n| format!("; did you mean `{n}`?"))
            .unwrap_or_default();
        anyhow::bail!(
            "mock script {}: replies for {}, which the workflow has no node of that name{hint}",
            path.display(),
            unknown.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}

fn execute(
    plan: Arc<crate::compile::Plan>,
    request: RunRequest,
    common: &Common,
    settings: &RunSettings,
    store: Arc<dyn crate::checkpoint::Checkpointer>,
) -> anyhow::Result<u8> {
    check_mock(&plan, common)?;
    let services = settings.services(&plan)?;
    let cassette = services.cassette.clone();
    let stream = common.stream.unwrap_or(if std::io::stderr().is_terminal() {
        Stream::Human
    } else {
        Stream::None
    });
    // On a JSON-lines stream every line of stderr is JSON: the CLI's own lines become events.
    let jsonl = stream == Stream::Jsonl;
    for note in settings.price_notes(&plan) {
        render::notice(
            jsonl,
            "note",
            serde_json::json!({"message": note}),
            &format!("note: {note}"),
        );
    }
    let renderer = Arc::new(std::sync::Mutex::new(render::Renderer::new(jsonl)));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let rendering = renderer.clone();
    let code = runtime.block_on(async move {
        let events = match stream {
            Stream::None => Events::none(),
            Stream::Human | Stream::Jsonl => Events::sink(Arc::new(move |e| {
                if let Ok(mut r) = rendering.lock() {
                    r.render(&e);
                }
            })),
        };
        let engine = Engine::new(plan, store, services, events);
        let cancel = engine.cancel_flag();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                cancel.store(true, Ordering::SeqCst);
                if !jsonl {
                    eprintln!("\nstopping at the end of this step (Ctrl-C again to quit at once)");
                }
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(exit::CANCELLED as i32);
                }
            }
        });
        let outcome = engine.run(request).await;
        drop(engine);
        let outcome = match outcome {
            Ok(o) => o,
            Err(
                e @ (EngineError::Input(_)
                | EngineError::NotInterrupted(_)
                | EngineError::BadAnswer(_)
                | EngineError::Incompatible(_)
                | EngineError::NoThread(_)
                | EngineError::Busy(_)
                | EngineError::AlreadyAnswered(_)
                | EngineError::WhichGate { .. }
                | EngineError::NoSuchGate { .. }
                | EngineError::StoredValue { .. }
                | EngineError::Store(CheckpointError::LeaseLost(_) | CheckpointError::Leased(_))),
            ) => {
                render::error(jsonl, &e.to_string());
                return Ok(exit::USAGE);
            }
            Err(e) if jsonl => {
                render::error(true, &format!("{:#}", anyhow::Error::new(e)));
                return Ok(exit::USAGE);
            }
            Err(e) => return Err(anyhow::Error::new(e)),
        };
        // On a JSON-lines stream `run_start` carries the thread id, and `run_end` stays last.
        if !jsonl {
            eprintln!("thread: {}", outcome.thread_id);
        }
        // A request the cassette lacks fails the run even when an `on_error` handler took it.
        let misses = cassette.as_ref().map(|c| c.misses()).unwrap_or_default();
        if !misses.is_empty() {
            if outcome.status != Status::Failed {
                for miss in &misses {
                    render::error(jsonl, &miss.to_string());
                }
            }
            render::error(
                jsonl,
                &format!(
                    "{} request(s) were not in the cassette; record it again with --record",
                    misses.len()
                ),
            );
            return Ok(exit::INVALID);
        }
        let mut out = std::io::stdout().lock();
        match outcome.status {
            Status::Done => {
                out.write_all(super::format_value(&outcome.output, common.output).as_bytes())?;
                Ok(exit::OK)
            }
            Status::Interrupted => {
                let result = if outcome.interrupts.len() > 1 {
                    serde_json::json!({"interrupts": outcome.interrupts})
                } else {
                    serde_json::json!({"interrupt": outcome.interrupt.clone().unwrap_or(Value::Null)})
                };
                out.write_all(super::format_value(&result, common.output).as_bytes())?;
                // On a JSON-lines stream the `interrupt` events already said so.
                if !jsonl {
                    eprintln!("{}", waiting_hint(&outcome.thread_id, &outcome.interrupts));
                }
                Ok(exit::INTERRUPTED)
            }
            // On a JSON-lines stream the run's `error` and `run_end` events already said so.
            Status::Failed => {
                if !jsonl {
                    eprintln!("error: {}", outcome.error.unwrap_or_default());
                    eprintln!(
                        "the last checkpoint is intact: fix the cause, then `runner resume --thread {}`",
                        outcome.thread_id
                    );
                }
                Ok(exit::INVALID)
            }
            Status::Cancelled => {
                if !jsonl {
                    eprintln!("cancelled; resume with `runner resume --thread {}`", outcome.thread_id);
                }
                Ok(exit::CANCELLED)
            }
        }
    });
    // The run's own `run_end` goes last, after what the CLI said about the run.
    if let Ok(mut r) = renderer.lock() {
        r.finish();
    }
    code
}

/// `key=value`: the value as JSON if it parses, else a string; `@path` reads a file as text;
/// `@@text` is the text `@text` as it is (a value that starts with `@`, such as a question
/// mentioning `@file.md`).
pub fn parse_kv(kv: &str) -> anyhow::Result<(String, Value)> {
    let (k, v) = kv.split_once('=').with_context(|| format!("`{kv}` is not KEY=VALUE"))?;
    if k.is_empty() {
        bail!("`{kv}` has no key");
    }
    let value = if let Some(text) = v.strip_prefix("@@") {
        Value::String(format!("@{text}"))
    } else if let Some(path) = v.strip_prefix('@') {
        Value::String(read_text_arg(path).with_context(|| {
            format!("`{k}=@{path}` reads a file; to pass text that starts with `@`, write `{k}=@@{path}`")
        })?)
    } else {
        serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()))
    };
    Ok((k.to_string(), value))
}

/// What an interrupted run tells the person who has to continue it.
fn waiting_hint(thread: &str, interrupts: &[Value]) -> String {
    let needs_answer: Vec<&Value> = interrupts.iter().filter(|i| i["kind"] == "node").collect();
    match needs_answer.as_slice() {
        // A pause before or after a node needs no answer.
        [] => format!("paused; continue with `runner resume --thread {thread}`"),
        [_] => format!("waiting for an answer: runner resume --thread {thread} --answer '<json>'"),
        many => {
            let ids: Vec<String> = many
                .iter()
                .map(|i| i["task_id"].as_str().unwrap_or_default().to_string())
                .collect();
            format!(
                "waiting for {} answers, one per gate: runner resume --thread {thread} --answer '<gate>=<json>' (gates: {})",
                many.len(),
                ids.join(", ")
            )
        }
    }
}

/// `--answer`: JSON (or `@file`) for the only pending gate, or `NODE_OR_ID=JSON` for one of
/// several. Text that parses as JSON as a whole is always a bare answer.
fn parse_answer(a: &str) -> anyhow::Result<(Option<String>, Value)> {
    if a.starts_with('@') || serde_json::from_str::<Value>(a).is_ok() {
        return Ok((None, parse_json_arg(a)?));
    }
    match a.split_once('=') {
        Some((to, json)) if !to.is_empty() && !to.contains(['{', '[', '"', ' ']) => Ok((
            Some(to.to_string()),
            parse_json_arg(json).with_context(|| format!("--answer `{a}`: the answer to `{to}`"))?,
        )),
        _ => Ok((None, parse_json_arg(a)?)),
    }
}

fn parse_json_arg(a: &str) -> anyhow::Result<Value> {
    let text = match a.strip_prefix('@') {
        Some(path) => read_text_arg(path)?,
        None => a.to_string(),
    };
    serde_json::from_str(&text).with_context(|| format!("`{a}` is not JSON"))
}

/// The text of the file an `@PATH` argument names; `@-` is standard input.
fn read_text_arg(path: &str) -> anyhow::Result<String> {
    if path == crate::spec::load::STDIN {
        let bytes = crate::spec::load::stdin_bytes().map_err(|e| anyhow::anyhow!("cannot read standard input: {e}"))?;
        return String::from_utf8(bytes.to_vec()).context("standard input is not UTF-8 text");
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))
}

fn read_data_file(path: &Path) -> anyhow::Result<Value> {
    let file = crate::spec::load::read(path).map_err(|d| anyhow::anyhow!("{}: {}", path.display(), d.message))?;
    let doc = crate::spec::load::parse(file).map_err(|d| {
        anyhow::anyhow!(
            "{}: {}",
            path.display(),
            d.first().map(|d| d.message.clone()).unwrap_or_default()
        )
    })?;
    if !doc.value.is_object() {
        bail!("{} must hold a mapping of input fields", path.display());
    }
    Ok(doc.value)
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
