use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::engine::{DEFAULT_LEASE_TTL, LeasePolicy, Persist};
use crate::net::AllowList;
use crate::nodes::ReadRoots;
use crate::rag::Location;
use crate::run::env::Origin;

fn resolve(options: RunOptions, env: &[(&str, &str)]) -> Result<RunSettings, String> {
    options
        .resolve(&Env::from_pairs(env.iter().copied()))
        .map_err(|e| e.to_string())
}

fn settings(options: RunOptions, env: &[(&str, &str)]) -> RunSettings {
    match resolve(options, env) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

fn lease_of(s: &RunSettings) -> (Duration, bool) {
    match s.overrides.lease {
        LeasePolicy::Take { ttl, wait } => (ttl, wait),
        LeasePolicy::Under(_) | LeasePolicy::Claimed { .. } => panic!("a run takes its own lease"),
    }
}

#[test]
fn nothing_said_means_the_defaults() {
    let s = settings(RunOptions::default(), &[]);
    assert_eq!(
        s.checkpoints,
        Setting {
            value: Checkpoints::Sqlite(".runner/runner.db".into()),
            source: Source::Default
        }
    );
    assert_eq!(
        s.data_db,
        Setting {
            value: Location::Sqlite(".runner/data.db".into()),
            source: Source::Default
        }
    );
    assert_eq!(s.lease_ttl.source, Source::Default);
    assert_eq!(lease_of(&s), (DEFAULT_LEASE_TTL, false));
    assert_eq!(s.overrides.persist, Persist::Sync);
    assert_eq!(s.overrides.recursion_limit, None);
    assert!(!s.overrides.force);
    assert_eq!(s.allow_net, AllowList::default());
    assert_eq!(s.read_roots, ReadRoots::default());
    assert_eq!(s.durability, crate::checkpoint::Durability::CrashSafe);
}

#[test]
fn the_environment_fills_what_the_options_leave_out() {
    let dir = tempfile::tempdir().unwrap();
    let read = dir.path().display().to_string();
    let env = [
        ("RUNNER_DB", ":memory:"),
        ("RUNNER_DATA_DB", "/tmp/data.db"),
        ("RUNNER_LEASE_TTL", " 2.5 "),
        ("RUNNER_ALLOW_NET", "10.0.0.0/8, ,127.0.0.1"),
        ("RUNNER_ALLOW_READ", read.as_str()),
    ];
    let s = settings(RunOptions::default(), &env);
    assert_eq!(
        s.checkpoints,
        Setting {
            value: Checkpoints::Memory,
            source: Source::Env("RUNNER_DB", Origin::Process)
        }
    );
    assert_eq!(s.data_db.value, Location::Sqlite("/tmp/data.db".into()));
    assert_eq!(s.data_db.source, Source::Env("RUNNER_DATA_DB", Origin::Process));
    assert_eq!(s.lease_ttl.source, Source::Env("RUNNER_LEASE_TTL", Origin::Process));
    assert_eq!(lease_of(&s).0, Duration::from_millis(2500));
    assert_eq!(s.allow_net, AllowList::parse(["10.0.0.0/8", "127.0.0.1"]).unwrap());
    assert_eq!(s.read_roots, ReadRoots::new([dir.path()]).unwrap());
}

/// A PostgreSQL checkpoint database holds the data store too unless another is named: the
/// processes that share one share both.
#[test]
fn the_data_store_follows_a_postgres_checkpoint_database() {
    let url = "postgres://runner:pw@db.example/app";
    let given = |db: &str| RunOptions {
        db: Some(DbOption::At(db.into())),
        ..RunOptions::default()
    };
    let s = settings(given(url), &[]);
    assert_eq!(
        s.data_db,
        Setting {
            value: Location::Postgres(url.into()),
            source: Source::Given("--db")
        }
    );
    let s = settings(RunOptions::default(), &[("RUNNER_DB", url)]);
    assert_eq!(s.data_db.value, Location::Postgres(url.into()));
    assert_eq!(s.data_db.source, Source::Env("RUNNER_DB", Origin::Process));
    // A data database named anywhere wins; a SQLite checkpoint database changes nothing.
    let s = settings(given(url), &[("RUNNER_DATA_DB", "data.db")]);
    assert_eq!(s.data_db.value, Location::Sqlite("data.db".into()));
    let s = settings(given("runs.db"), &[]);
    assert_eq!(s.data_db.value, Location::Sqlite(".runner/data.db".into()));
    let s = settings(given("runs.db"), &[("RUNNER_DATA_DB", "postgresql://h/kb")]);
    assert_eq!(s.data_db.value, Location::Postgres("postgresql://h/kb".into()));
    // Another scheme is refused, named by where it was set, its password never shown.
    let e = resolve(RunOptions::default(), &[("RUNNER_DATA_DB", "mysql://u:secret@h/db")]).unwrap_err();
    assert!(
        e.contains("RUNNER_DATA_DB") && e.contains("`mysql://` databases are not supported"),
        "{e}"
    );
    assert!(!e.contains("secret"), "{e}");
}

#[test]
fn options_win_over_the_environment_and_lists_add_up() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env_read = b.path().display().to_string();
    let env = [
        ("RUNNER_DB", "from-env.db"),
        ("RUNNER_DATA_DB", "from-env-data.db"),
        // Not read at all when the option is given.
        ("RUNNER_LEASE_TTL", "not a number"),
        ("RUNNER_ALLOW_NET", "10.0.0.0/8"),
        ("RUNNER_ALLOW_READ", env_read.as_str()),
    ];
    let options = RunOptions {
        db: Some(DbOption::At("sqlite://given.db".into())),
        data_db: Some("given-data.db".into()),
        lease_ttl: Some(30.0),
        wait: Some(true),
        allow_net: vec!["127.0.0.1".into()],
        allow_read: vec![a.path().to_path_buf()],
        recursion_limit: Some(7),
        persist: Some(Persist::Exit),
        force: Some(true),
        ..RunOptions::default()
    };
    let s = settings(options, &env);
    assert_eq!(
        s.checkpoints,
        Setting {
            value: Checkpoints::Sqlite("given.db".into()),
            source: Source::Given("--db")
        }
    );
    assert_eq!(
        s.data_db,
        Setting {
            value: Location::Sqlite("given-data.db".into()),
            source: Source::Given("--data-db")
        }
    );
    assert_eq!(lease_of(&s), (Duration::from_secs(30), true));
    assert_eq!(s.lease_ttl.source, Source::Given("--lease-ttl"));
    assert_eq!(s.allow_net, AllowList::parse(["127.0.0.1", "10.0.0.0/8"]).unwrap());
    assert_eq!(s.read_roots, ReadRoots::new([a.path(), b.path()]).unwrap());
    assert_eq!(s.overrides.recursion_limit, Some(7));
    assert_eq!(s.overrides.persist, Persist::Exit);
    assert!(s.overrides.force);
    let scratch = settings(
        RunOptions {
            db: Some(DbOption::Scratch),
            ..RunOptions::default()
        },
        &env[..2],
    );
    assert_eq!(scratch.checkpoints.value, Checkpoints::Scratch);
}

/// Options, the environment, and the start of the error they must give.
type ErrorCase<'a> = (RunOptions, &'a [(&'a str, &'a str)], &'a str);

#[test]
fn an_error_names_the_flag_or_the_variable_it_came_from() {
    let missing = "/no/such/dir/anywhere";
    let cases: &[ErrorCase] = &[
        (
            RunOptions::default(),
            &[("RUNNER_LEASE_TTL", "soon")],
            "RUNNER_LEASE_TTL: `soon` is not a number of seconds",
        ),
        (
            RunOptions::default(),
            &[("RUNNER_LEASE_TTL", "0")],
            "RUNNER_LEASE_TTL: the lease time to live must be more than 0",
        ),
        (
            RunOptions {
                lease_ttl: Some(90_000.0),
                ..RunOptions::default()
            },
            &[],
            "--lease-ttl: the lease time to live must be more than 0 and at most 86400 seconds, not 90000",
        ),
        (
            RunOptions::default(),
            &[("RUNNER_DB", "mysql://u:pw@h/db")],
            "RUNNER_DB: `mysql://` databases are not supported",
        ),
        (
            RunOptions {
                db: Some(DbOption::At("sqlite://".into())),
                ..RunOptions::default()
            },
            &[],
            "--db: `sqlite://` names no file",
        ),
        (
            RunOptions::default(),
            &[("RUNNER_ALLOW_NET", "127.0.0.1,not a host/99")],
            "RUNNER_ALLOW_NET: ",
        ),
        (
            RunOptions {
                allow_net: vec!["10.0.0.0/99".into()],
                ..RunOptions::default()
            },
            &[],
            "--allow-net: ",
        ),
        (
            RunOptions::default(),
            &[("RUNNER_ALLOW_READ", missing)],
            "RUNNER_ALLOW_READ: /no/such/dir/anywhere",
        ),
        (
            RunOptions {
                allow_read: vec![missing.into()],
                ..RunOptions::default()
            },
            &[],
            "--allow-read: /no/such/dir/anywhere",
        ),
        (
            RunOptions {
                mock: Some(MockOption::Empty),
                cassette: Some(CassetteOption::Replay("c.jsonl".into())),
                ..RunOptions::default()
            },
            &[],
            "a cassette replay serves every call: it cannot be combined with a mock",
        ),
    ];
    for (options, env, expected) in cases {
        match resolve(options.clone(), env) {
            Ok(_) => panic!("{options:?} over {env:?} resolved"),
            Err(e) => assert!(e.starts_with(expected), "{e} (expected {expected})"),
        }
    }
}

/// A workflow with one live model profile, compiled from a temporary file.
fn plan(dir: &Path) -> std::sync::Arc<crate::compile::Plan> {
    let file = dir.join("w.yaml");
    std::fs::write(
        &file,
        r#"
name: chat
models: {default: {provider: openai, model: m, base_url: "${env:BUILDER_BASE}", api_key_env: BUILDER_KEY}}
output: [answer]
state: {answer: {type: string, default: ""}}
nodes:
  write: {kind: llm, prompt: {text: "hi"}, update: {answer: output}}
edges: [START -> write -> END]
"#,
    )
    .unwrap();
    let (plan, result) = crate::compile::compile_file(&file, &crate::nodes::builtin().decls());
    match plan {
        Some(p) => p,
        None => panic!("{:?}", result.diagnostics),
    }
}

#[test]
fn model_profiles_read_keys_and_urls_from_the_given_environment() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan(dir.path());
    let keyless = resolve(RunOptions::default(), &[("BUILDER_BASE", "http://127.0.0.1:9/v1")])
        .map_err(|e| e.to_string())
        .and_then(|s| s.services(&plan).map(|_| ()).map_err(|e| e.to_string()));
    assert!(keyless.unwrap_err().contains("`BUILDER_KEY`"));
    let s = settings(
        RunOptions::default(),
        &[
            ("BUILDER_BASE", "http://127.0.0.1:9/v1"),
            ("BUILDER_KEY", "sk-builder-test-key"),
        ],
    );
    let services = s.services(&plan).unwrap();
    let (_, profile) = services.providers.get("default").unwrap();
    assert_eq!(profile.base_url.as_deref(), Some("http://127.0.0.1:9/v1"));
    assert!(services.cassette.is_none());
    assert_eq!(
        services.data.location(),
        &crate::rag::Location::Sqlite(".runner/data.db".into())
    );
    // A mock serves every profile: no key is needed.
    let mocked = settings(
        RunOptions {
            mock: Some(MockOption::Script(json!({"replies": {"write": ["hello"]}}))),
            models: vec!["default=ollama:llama3.2".into()],
            ..RunOptions::default()
        },
        &[],
    );
    let services = mocked.services(&plan).unwrap();
    assert_eq!(services.providers.get("default").unwrap().1.model, "llama3.2");
    let unknown = settings(
        RunOptions {
            mock: Some(MockOption::Empty),
            models: vec!["fast=ollama:llama3.2".into()],
            ..RunOptions::default()
        },
        &[],
    );
    let e = unknown.services(&plan).unwrap_err().to_string();
    assert!(
        e.starts_with("--model: the workflow has no model profile `fast` (its profiles: default)"),
        "{e}"
    );
}

/// What `runner run` asks of the engine: the input only when given (an existing thread then
/// starts a new turn; a new one starts from an empty input), and always the context (the
/// engine uses it only for a thread it creates). Whether the thread exists is the engine's to
/// tell, under the lease; `cli_run` and `engine` test what it does with each.
#[test]
fn a_start_request_leaves_the_thread_s_newness_to_the_engine() {
    let overrides = settings(
        RunOptions {
            recursion_limit: Some(3),
            ..RunOptions::default()
        },
        &[],
    )
    .overrides;
    let start = |given: bool| Start {
        thread_id: Some("t".into()),
        workflow: "w.yaml".into(),
        input: json!({"q": 1}),
        input_given: given,
        context: json!({"user": "a"}),
        config: vec![("k".into(), Value::from(1))],
    };
    let go_on = overrides.start(start(false));
    assert_eq!((go_on.input, go_on.context), (None, Some(json!({"user": "a"}))));
    let turn = overrides.start(start(true));
    assert_eq!(
        (turn.input, turn.context),
        (Some(json!({"q": 1})), Some(json!({"user": "a"})))
    );
    assert_eq!(turn.config, vec![("k".to_string(), Value::from(1))]);
    assert_eq!(turn.recursion_limit, Some(3));
    let answer = overrides.answer("old".into(), "w.yaml".into(), Some(json!("ok")), None);
    assert_eq!(answer.thread_id.as_deref(), Some("old"));
    assert_eq!(
        (answer.answer, answer.input, answer.recursion_limit),
        (Some(json!("ok")), None, Some(3))
    );
}

#[test]
fn a_model_override_keeps_states_or_takes_a_price() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan(dir.path());
    let with = |models: &[&str], prices: &[&str]| {
        settings(
            RunOptions {
                mock: Some(MockOption::Empty),
                models: models.iter().map(|s| s.to_string()).collect(),
                prices: prices.iter().map(|s| s.to_string()).collect(),
                ..RunOptions::default()
            },
            &[],
        )
    };
    let price_of = |s: &RunSettings| {
        let services = s.services(&plan).unwrap();
        services
            .providers
            .get("default")
            .unwrap()
            .1
            .pricing
            .clone()
            .map(|p| (p.input, p.output))
    };
    // A known model is priced; nothing needs saying.
    let known = with(&["default=openai:gpt-4o-mini"], &[]);
    assert_eq!(price_of(&known), Some((0.15, 0.60)));
    assert!(known.price_notes(&plan).is_empty());
    // An unknown one is said to cost nothing, naming the flag that prices it.
    let unknown = with(&["default=openai:mystery@http://127.0.0.1:9/v1"], &[]);
    assert_eq!(price_of(&unknown), None);
    let notes = unknown.price_notes(&plan);
    assert_eq!(notes.len(), 1);
    assert!(notes[0].contains("`--price default=IN,OUT`"), "{notes:?}");
    // `--price` gives it one.
    let priced = with(&["default=openai:mystery@http://127.0.0.1:9/v1"], &["default=0.5,1.5"]);
    assert_eq!(price_of(&priced), Some((0.5, 1.5)));
    assert!(priced.price_notes(&plan).is_empty());
    let bad = with(&[], &["default=cheap"]).services(&plan).unwrap_err().to_string();
    assert!(bad.contains("is not IN,OUT"), "{bad}");
}

#[test]
fn a_served_model_takes_its_context_window() {
    let dir = tempfile::tempdir().unwrap();
    let plan = plan(dir.path());
    let with = |contexts: &[&str]| {
        settings(
            RunOptions {
                mock: Some(MockOption::Empty),
                models: vec!["default=llamacpp:any@http://127.0.0.1:9/v1".to_string()],
                contexts: contexts.iter().map(|s| s.to_string()).collect(),
                ..RunOptions::default()
            },
            &[],
        )
        .services(&plan)
        .map(|services| services.providers.get("default").unwrap().1.context)
        .map_err(|e| e.to_string())
    };
    assert_eq!(with(&[]), Ok(None));
    // The window the fit policy trims prompts to is the one given for the served model.
    assert_eq!(with(&["default=4096"]), Ok(Some(4096)));
    for bad in ["default=0", "default=big", "default"] {
        let e = with(&[bad]).unwrap_err();
        assert!(e.contains("is not PROFILE=TOKENS"), "{bad}: {e}");
    }
    let e = with(&["fast=4096"]).unwrap_err();
    assert!(e.contains("no model profile `fast`"), "{e}");
}

#[test]
fn the_cache_directory_is_the_variables_or_the_users_and_can_be_turned_off() {
    let dir = |pairs: &[(&str, &str)]| super::cache_dir(&Env::from_pairs(pairs.iter().copied()));
    assert_eq!(
        dir(&[("HOME", "/home/a")]),
        Some(PathBuf::from("/home/a/.cache/runner"))
    );
    assert_eq!(
        dir(&[("HOME", "/home/a"), ("XDG_CACHE_HOME", "/c")]),
        Some(PathBuf::from("/c/runner"))
    );
    assert_eq!(
        dir(&[("HOME", "/home/a"), ("XDG_CACHE_HOME", "relative")]),
        Some(PathBuf::from("/home/a/.cache/runner")),
        "a relative XDG_CACHE_HOME is ignored, as the spec says"
    );
    assert_eq!(
        dir(&[("HOME", "/home/a"), ("RUNNER_CACHE_DIR", "here")]),
        Some(PathBuf::from("here"))
    );
    assert_eq!(dir(&[("HOME", "/home/a"), ("RUNNER_NO_CACHE", "1")]), None);
    assert_eq!(
        dir(&[("HOME", "/home/a"), ("RUNNER_NO_CACHE", "0")]),
        Some(PathBuf::from("/home/a/.cache/runner"))
    );
    assert_eq!(dir(&[]), None, "no home, nowhere to remember");
}

/// The store index comes from the flag, else `RUNNER_STORE_INDEX`, its fields from the flags,
/// else `RUNNER_STORE_INDEX_FIELDS`, else `$`; a bad embedder is named with where it came from,
/// and the data store built from the settings carries the index.
#[test]
fn the_store_index_is_read_from_its_flag_or_its_variables() {
    assert_eq!(settings(RunOptions::default(), &[]).store_index, None);
    let s = settings(
        RunOptions::default(),
        &[
            ("RUNNER_STORE_INDEX", "offline"),
            ("RUNNER_STORE_INDEX_FIELDS", "text, notes[*].body"),
        ],
    );
    let index = s.store_index.clone().unwrap();
    assert_eq!(index.source, Source::Env("RUNNER_STORE_INDEX", Origin::Process));
    assert_eq!(index.value.fields, ["text", "notes[*].body"]);
    let store = s.data_store().unwrap();
    let built = store.memory_index().unwrap();
    assert_eq!(built.embedder.id(), crate::rag::embed::ID);
    assert_eq!(built.fields, ["text", "notes[*].body"]);
    let s = settings(
        RunOptions {
            store_index: Some("ollama:nomic-embed-text".into()),
            ..RunOptions::default()
        },
        &[("RUNNER_STORE_INDEX", "offline")],
    );
    let index = s.store_index.clone().unwrap();
    assert_eq!(
        (index.source, index.value.fields.as_slice()),
        (Source::Given("--store-index"), &["$".to_string()][..])
    );
    assert_eq!(
        s.data_store().unwrap().memory_index().unwrap().embedder.id(),
        "openai:nomic-embed-text@http://127.0.0.1:11434/v1",
        "a local server's embedder, reached over the OpenAI API"
    );
    let e = resolve(RunOptions::default(), &[("RUNNER_STORE_INDEX", "mock:x")]).unwrap_err();
    assert!(
        e.starts_with("RUNNER_STORE_INDEX: ") && e.contains("serves no embeddings"),
        "{e}"
    );
}
