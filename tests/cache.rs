//! Node caching (`cache:` on a node, LangGraph's `CachePolicy`): a second thread running a
//! cached node on the same input takes the stored result without calling its model; another
//! input, an expired entry or an edited node runs it again; fan-out items are cached one by
//! one; failures are not cached; a hit is stored as the task's result, so a resume never runs
//! it again. Then `runner cache` and `DELETE /assistants/{id}/cache` through the real binary.
//! The engine runs on the scripted mock and a temporary SQLite file.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use reqwest::Method;
use runner::checkpoint::sqlite::SqliteCheckpointer;
use runner::checkpoint::{CacheEntry, Checkpointer, Durability};
use runner::compile::Plan;
use runner::engine::events::{Event, Events};
use runner::engine::{Engine, RunOutcome, RunRequest, Status};
use runner::providers::Providers;
use runner::providers::mock::MockProvider;
use serde_json::{Value, json};

use crate::support::Project;

/// Runs on one SQLite store and one mock, whose calls are counted across runs.
struct Bench {
    store: Arc<dyn Checkpointer>,
    mock: Arc<MockProvider>,
    events: Vec<Event>,
    _dir: tempfile::TempDir,
}

impl Bench {
    fn new(script: Value) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteCheckpointer::open(&dir.path().join("runner.db"), Durability::CrashSafe).unwrap();
        Bench {
            store: Arc::new(store),
            mock: Arc::new(MockProvider::from_value(&script).unwrap()),
            events: Vec::new(),
            _dir: dir,
        }
    }

    fn go(&mut self, plan: &Arc<Plan>, req: RunRequest) -> RunOutcome {
        let providers = Providers::for_models_in(plan.models(), Some(self.mock.clone()), true, &|_| None).unwrap();
        let (events, mut rx) = Events::channel();
        let engine = Engine::new(plan.clone(), self.store.clone(), providers, events);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let out = rt.block_on(engine.run(req)).unwrap();
        drop(engine);
        self.events.clear();
        while let Ok(e) = rx.try_recv() {
            self.events.push(e.event);
        }
        out
    }

    /// A new thread `thread` with `input`.
    fn start(&mut self, plan: &Arc<Plan>, thread: &str, input: Value) -> RunOutcome {
        self.go(
            plan,
            RunRequest {
                thread_id: Some(thread.into()),
                input: Some(input),
                workflow: "w.yaml".into(),
                ..RunRequest::default()
            },
        )
    }

    fn calls(&self, node: &str) -> usize {
        self.mock.calls().get(node).copied().unwrap_or(0)
    }

    /// The last run's `node_end` events of `node`: `(cached, cache_hit)`.
    fn ends(&self, node: &str) -> Vec<(bool, bool)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::NodeEnd {
                    node: n,
                    cached,
                    cache_hit,
                    ..
                } if n == node => Some((*cached, *cache_hit)),
                _ => None,
            })
            .collect()
    }
}

const MODELS: &str = "models: {default: {provider: mock, model: m}}\n";

/// One cached llm node that also writes the thread it ran on: a hit on another thread writes
/// the first thread's id, which only a reused result can.
fn expensive(cache: &str) -> String {
    format!(
        r#"name: t
{MODELS}input: {{type: object, properties: {{word: {{type: string}}}}}}
state:
  word: {{type: string, from_input: true}}
  said: {{type: string, default: ""}}
  by: {{type: string, default: ""}}
nodes:
  expensive:
    kind: llm
    prompt: {{text: "Say {{{{ state.word }}}}"}}
    cache: {cache}
    update: {{said: output, by: run.thread_id}}
edges: [START -> expensive -> END]
"#
    )
}

fn priced() -> Value {
    json!({"replies": {"expensive": [{"text": "computed", "usage": {"prompt_tokens": 10, "completion_tokens": 2}}]}})
}

#[test]
fn a_second_thread_on_the_same_input_takes_the_cached_result_without_calling_the_model() {
    let p = Project::new(&[("w.yaml", &expensive("{ttl: 10m}"))]);
    let plan = p.plan("w.yaml");
    let mut b = Bench::new(priced());

    let first = b.start(&plan, "t1", json!({"word": "x"}));
    assert_eq!(first.status, Status::Done);
    assert_eq!(b.calls("expensive"), 1);
    assert_eq!(b.ends("expensive"), [(false, false)]);
    assert_eq!(
        (&first.state["said"], &first.state["by"]),
        (&json!("computed"), &json!("t1"))
    );
    assert_eq!(first.turn_usage.prompt_tokens, 10);

    // The same input on another thread: the model is not called, the writes are the first
    // run's (its thread id included), and nothing is spent.
    let second = b.start(&plan, "t2", json!({"word": "x"}));
    assert_eq!(second.status, Status::Done);
    assert_eq!(b.calls("expensive"), 1, "a hit calls no model");
    assert_eq!(b.ends("expensive"), [(false, true)]);
    assert_eq!(second.state, first.state);
    assert_eq!(second.turn_usage, Default::default(), "a hit spends no tokens");
    assert!(
        !b.events
            .iter()
            .any(|e| matches!(e, Event::NodeStart { .. } | Event::Usage { .. })),
        "a hit starts nothing: {:?}",
        b.events
    );
    // The hit is in the thread's history as the step's task, as any task is: its result is
    // stored under its task's id with the checkpoint that scheduled it.
    let history = b.store.history("t2").unwrap();
    assert_eq!(history[0].ran, ["expensive"]);
    let task = runner::engine::task_id("t2", "expensive", 1, 0, None);
    assert_eq!(history[1].next.iter().map(|t| &t.task_id).collect::<Vec<_>>(), [&task]);
    let writes = b.store.get_writes("t2", &history[1].checkpoint_id).unwrap();
    assert!(
        writes.iter().any(|w| w.task_id == task && w.channel == "__done__"),
        "{writes:?}"
    );

    // Another input misses.
    let third = b.start(&plan, "t3", json!({"word": "y"}));
    assert_eq!(b.calls("expensive"), 2);
    assert_eq!(third.state["by"], json!("t3"));
    assert_eq!(b.ends("expensive"), [(false, false)]);
}

#[test]
fn a_key_that_cannot_be_evaluated_fails_the_task_before_it_runs() {
    let p = Project::new(&[("w.yaml", &expensive(r#"{key: "input.word | upper"}"#))]);
    let mut b = Bench::new(priced());
    let out = b.start(&p.plan("w.yaml"), "t1", json!({}));
    assert_eq!(out.status, Status::Failed);
    let error = out.error.unwrap();
    assert!(error.contains("the cache key of `expensive`"), "{error}");
    assert_eq!(b.calls("expensive"), 0);
}

#[test]
fn an_expired_entry_is_not_used() {
    let p = Project::new(&[("w.yaml", &expensive("{ttl: 10m}"))]);
    let plan = p.plan("w.yaml");
    let mut b = Bench::new(priced());
    let before = runner::clock::now_ms();
    b.start(&plan, "t1", json!({"word": "x"}));
    let after = runner::clock::now_ms();
    // The entry expires its ttl after it was made.
    let listed = b.store.cache_list(after).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let expires = listed[0].expires_at_ms.unwrap();
    assert!(
        (before + 600_000..=after + 600_000).contains(&expires),
        "{expires} not 10 minutes after {before}..{after}"
    );
    assert_eq!(
        (listed[0].workflow.as_str(), listed[0].node.as_str()),
        ("t", "expensive")
    );

    // The same entry, as if its ten minutes were over: not used, and the node runs again.
    let value = b
        .store
        .cache_get("t", "expensive", &listed[0].key, after)
        .unwrap()
        .unwrap();
    let now = runner::clock::now_ms();
    let past = CacheEntry {
        workflow: "t".into(),
        node: "expensive".into(),
        key: listed[0].key.clone(),
        value,
        created_at: listed[0].created_at.clone(),
        expires_at_ms: Some(now - 1),
    };
    b.store.cache_put(&past, now - 2).unwrap();
    let second = b.start(&plan, "t2", json!({"word": "x"}));
    assert_eq!(b.calls("expensive"), 2, "an expired entry is a miss");
    assert_eq!(second.state["by"], json!("t2"));
    // Its result replaced the expired entry.
    let listed = b.store.cache_list(runner::clock::now_ms()).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].expires_at_ms.unwrap() > now + 500_000);
}

#[test]
fn editing_the_node_misses_and_editing_another_node_does_not() {
    let wf = |update: &str| {
        format!(
            r#"name: t
{MODELS}input: {{type: object, properties: {{word: {{type: string}}}}}}
state:
  word: {{type: string, from_input: true}}
  said: {{type: string, default: ""}}
  more: {{type: string, default: ""}}
nodes:
  expensive: {{kind: llm, prompt: say.j2, cache: true, update: {{said: "{update}"}}}}
  other: {{kind: llm, prompt: other.j2, update: {{more: output}}}}
edges: [START -> expensive -> other -> END]
"#
        )
    };
    let p = Project::new(&[
        ("w.yaml", &wf("output")),
        ("prompts/say.j2", "Say {{ state.word }}"),
        ("prompts/other.j2", "And more"),
    ]);
    let mut b = Bench::new(json!({"replies": {"expensive": ["computed"], "other": ["more"]}}));
    b.start(&p.plan("w.yaml"), "t1", json!({"word": "x"}));
    assert_eq!(b.calls("expensive"), 1);
    // `cache: true` keeps its entries until they are cleared.
    let listed = b.store.cache_list(i64::MAX - 1).unwrap();
    assert_eq!(listed[0].expires_at_ms, None);

    // Another node's prompt file and fields: the cached node's result still holds.
    p.write("prompts/other.j2", "And then some more");
    b.start(&p.plan("w.yaml"), "t2", json!({"word": "x"}));
    assert_eq!((b.calls("expensive"), b.calls("other")), (1, 2));
    assert_eq!(b.ends("expensive"), [(false, true)]);

    // Its own prompt file: it runs again.
    p.write("prompts/say.j2", "Please say {{ state.word }}");
    b.start(&p.plan("w.yaml"), "t3", json!({"word": "x"}));
    assert_eq!(b.calls("expensive"), 2, "an edited prompt misses");

    // Its own `update`: it runs again, and its writes are the new definition's.
    p.write("w.yaml", &wf("output | upper"));
    let out = b.start(&p.plan("w.yaml"), "t4", json!({"word": "x"}));
    assert_eq!(b.calls("expensive"), 3, "an edited update misses");
    assert_eq!(out.state["said"], json!("COMPUTED"));
}

#[test]
fn fan_out_tasks_are_cached_item_by_item() {
    let p = Project::new(&[(
        "w.yaml",
        &format!(
            r#"name: t
{MODELS}input: {{type: object, properties: {{items: {{type: array}}}}}}
state:
  out: {{type: array, reducer: append, default: []}}
nodes:
  split: {{kind: set}}
  each:
    kind: llm
    prompt: {{text: "Say {{{{ item }}}}"}}
    cache: {{key: item}}
    update: {{out: "[output]"}}
edges:
  - START -> split
  - {{from: split, send: {{to: each, foreach: input.items}}}}
  - each -> END
"#
        ),
    )]);
    let plan = p.plan("w.yaml");
    let script = json!({"match": [
        {"contains": "Say a", "reply": "A"},
        {"contains": "Say b", "reply": "B"},
        {"contains": "Say c", "reply": "C"},
    ]});
    let mut b = Bench::new(script);
    let first = b.start(&plan, "t1", json!({"items": ["a", "b"]}));
    assert_eq!(first.state["out"], json!(["A", "B"]));
    assert_eq!(b.calls("each"), 2, "each item is its own entry");

    // `b` is cached (under its own key, whatever else the input holds); `c` is not.
    let second = b.start(&plan, "t2", json!({"items": ["b", "c"]}));
    assert_eq!(second.state["out"], json!(["B", "C"]), "each item gets its own result");
    assert_eq!(b.calls("each"), 3);
    assert_eq!(b.ends("each"), [(false, true), (false, false)]);

    // The default key holds the item too: the same input again hits each item's own entry.
    p.write(
        "w.yaml",
        &std::fs::read_to_string(p.path("w.yaml"))
            .unwrap()
            .replace("{key: item}", "true"),
    );
    let plan = p.plan("w.yaml");
    assert_eq!(
        b.start(&plan, "t3", json!({"items": ["a", "b"]})).state["out"],
        json!(["A", "B"])
    );
    assert_eq!(b.calls("each"), 5);
    let again = b.start(&plan, "t4", json!({"items": ["a", "b"]}));
    assert_eq!(again.state["out"], json!(["A", "B"]), "each item gets its own result");
    assert_eq!(b.calls("each"), 5);
    assert_eq!(b.ends("each"), [(false, true), (false, true)]);
}

#[test]
fn failures_are_not_cached() {
    let p = Project::new(&[(
        "w.yaml",
        &format!(
            r#"name: t
{MODELS}state:
  said: {{type: string, default: ""}}
  errors: {{type: array, reducer: append, default: []}}
nodes:
  expensive:
    kind: llm
    prompt: {{text: "Say it"}}
    cache: true
    update: {{said: output}}
    on_error: {{to: END, update: {{errors: "[error.class]"}}}}
edges: [START -> expensive -> END]
"#
        ),
    )]);
    let plan = p.plan("w.yaml");
    let mut b = Bench::new(json!({"replies": {"expensive": [{"error": "bad_request"}, "computed"]}}));
    let failed = b.start(&plan, "t1", json!({}));
    assert_eq!(failed.state["errors"], json!(["bad_request"]));
    // What the handler made of the failure was not kept: the node runs again, and its
    // success is kept.
    let ok = b.start(&plan, "t2", json!({}));
    assert_eq!((b.calls("expensive"), &ok.state["said"]), (2, &json!("computed")));
    b.start(&plan, "t3", json!({}));
    assert_eq!(b.calls("expensive"), 2);
    assert_eq!(b.ends("expensive"), [(false, true)]);
}

/// A cached subgraph node whose child asks a person: the answered result is that thread's,
/// and another thread on the same input is asked again.
#[test]
fn a_result_made_with_a_persons_answer_is_not_cached() {
    let child = r#"
name: child
output: [answer]
state: {answer: {type: string, default: ""}}
nodes:
  ask: {kind: interrupt, message: "ok?", response: {type: string}, update: {answer: output}}
edges: [START -> ask -> END]
"#;
    let parent = format!(
        r#"name: t
{MODELS}state: {{answer: {{type: string, default: ""}}}}
nodes:
  sub: {{kind: subgraph, workflow: child.yaml, cache: true, update: {{answer: output.answer}}}}
edges: [START -> sub -> END]
"#
    );
    let p = Project::new(&[("child.yaml", child), ("w.yaml", &parent)]);
    let plan = p.plan("w.yaml");
    let mut b = Bench::new(json!({}));
    let answer = |thread: &str, value: &str| RunRequest {
        thread_id: Some(thread.into()),
        answer: Some(json!(value)),
        workflow: "w.yaml".into(),
        ..RunRequest::default()
    };
    assert_eq!(b.start(&plan, "t1", json!({})).status, Status::Interrupted);
    let out = b.go(&plan, answer("t1", "yes"));
    assert_eq!((out.status, &out.state["answer"]), (Status::Done, &json!("yes")));
    assert_eq!(b.store.cache_list(0).unwrap(), vec![]);
    // The second thread is asked, and its own answer is its result.
    assert_eq!(b.start(&plan, "t2", json!({})).status, Status::Interrupted);
    let out = b.go(&plan, answer("t2", "no"));
    assert_eq!(out.state["answer"], json!("no"));
}

#[test]
fn a_hit_is_the_tasks_stored_result_and_a_resume_does_not_look_again() {
    let p = Project::new(&[(
        "w.yaml",
        &format!(
            r#"name: t
{MODELS}state:
  said: {{type: string, default: ""}}
  other: {{type: string, default: ""}}
nodes:
  split: {{kind: set}}
  expensive: {{kind: llm, prompt: {{text: "Say it"}}, cache: true, update: {{said: output}}}}
  flaky: {{kind: llm, prompt: {{text: "Maybe"}}, update: {{other: output}}}}
edges:
  - START -> split
  - {{from: split, to: [expensive, flaky]}}
  - expensive -> END
  - flaky -> END
"#
        ),
    )]);
    let plan = p.plan("w.yaml");
    let script = json!({"replies": {
        "expensive": ["computed"],
        "flaky": ["fine", {"error": "bad_request", "message": "not now"}, "fine again"],
    }});
    let mut b = Bench::new(script);
    b.start(&plan, "t1", json!({}));
    assert_eq!(b.calls("expensive"), 1);

    // A hit beside a task that fails: the step stops, the hit's result is kept with it.
    let failed = b.start(&plan, "t2", json!({}));
    assert_eq!(failed.status, Status::Failed);
    assert_eq!(b.ends("expensive"), [(false, true)]);
    // With the cache emptied, a second look would miss and call the model: the resume takes
    // the stored result instead.
    assert_eq!(b.store.cache_clear(None, None, runner::clock::now_ms()).unwrap(), 1);
    let resumed = b.go(
        &plan,
        RunRequest {
            thread_id: Some("t2".into()),
            workflow: "w.yaml".into(),
            ..RunRequest::default()
        },
    );
    assert_eq!(resumed.status, Status::Done, "{:?}", resumed.error);
    assert_eq!(b.calls("expensive"), 1, "the hit never runs");
    assert_eq!(b.ends("expensive"), [(true, false)]);
    assert_eq!(
        (&resumed.state["said"], &resumed.state["other"]),
        (&json!("computed"), &json!("fine again"))
    );
}

// ---------------------------------------------------------------------------------------------
// Through the binary.

const MOCK: &str = "replies:\n  expensive: [computed]\n";

fn runner(dir: &Path, args: &[&str]) -> Output {
    Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir)
        .env("RUNNER_DB", dir.join("runner.db"))
        .args(args)
        .output()
        .unwrap()
}

/// `run w.yaml` on thread `thread`: who wrote `by` (the thread whose run made the result), and
/// whether its `node_end` says it was a hit.
fn run_on(dir: &Path, thread: &str, extra: &[&str]) -> (String, bool) {
    let mut args = vec![
        "run",
        "w.yaml",
        "--mock",
        "mock.yaml",
        "--thread",
        thread,
        "--input",
        "word=x",
        "--stream",
        "jsonl",
    ];
    args.extend_from_slice(extra);
    let out = runner(dir, &args);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    let end = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "node_end" && e["node"] == "expensive")
        .unwrap();
    (state["by"].as_str().unwrap().to_string(), end["cache_hit"] == true)
}

#[test]
fn runner_cache_lists_and_clears_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("w.yaml"), expensive("{ttl: 1h}")).unwrap();
    std::fs::write(d.join("mock.yaml"), MOCK).unwrap();
    assert_eq!(run_on(d, "a", &[]), ("a".to_string(), false));
    assert_eq!(run_on(d, "b", &[]), ("a".to_string(), true));
    // Another model behind the profile is another answer.
    let other_model = ["--model", "default=mock:other"];
    assert_eq!(run_on(d, "m", &other_model), ("m".to_string(), false));
    assert_eq!(run_on(d, "n", &other_model), ("m".to_string(), true));

    let list = runner(d, &["cache", "list"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.starts_with("t\texpensive\t2 result(s)\t"), "{text}");
    let json_list = runner(d, &["cache", "list", "--format", "json"]);
    let rows: Value = serde_json::from_slice(&json_list.stdout).unwrap();
    assert_eq!((&rows[0]["workflow"], &rows[0]["entries"]), (&json!("t"), &json!(2)));

    // A node the workflow file does not cache has nothing to clear; the cached one has.
    let none = runner(d, &["cache", "clear", "w.yaml", "--node", "other"]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("cleared 0 cached results"));
    let cleared = runner(d, &["cache", "clear", "w.yaml", "--node", "expensive"]);
    assert_eq!(cleared.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&cleared.stderr).contains("cleared 2 cached results of `t`'s node `expensive`"),
        "{}",
        String::from_utf8_lossy(&cleared.stderr)
    );
    assert_eq!(run_on(d, "c", &[]), ("c".to_string(), false), "a cleared cache misses");
    // By the workflow's name, every node.
    let cleared = runner(d, &["cache", "clear", "t"]);
    assert!(String::from_utf8_lossy(&cleared.stderr).contains("cleared 1 cached result of `t`"));
    assert_eq!(run_on(d, "e", &[]), ("e".to_string(), false));
    assert!(
        runner(d, &["cache", "list"])
            .stdout
            .starts_with(b"t\texpensive\t1 result(s)")
    );
}

/// A hit is committed as its task's result before its `node_end` is sent: a run killed after
/// it resumes without looking the node up again (the cache was cleared meanwhile, so a second
/// look would run it).
#[test]
fn a_run_killed_after_a_hit_resumes_without_running_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wf = format!(
        r#"name: t
{MODELS}input: {{type: object, properties: {{word: {{type: string}}}}}}
state:
  word: {{type: string, from_input: true}}
  said: {{type: string, default: ""}}
  by: {{type: string, default: ""}}
  other: {{type: string, default: ""}}
nodes:
  split: {{kind: set}}
  expensive: {{kind: llm, prompt: {{text: "Say {{{{ state.word }}}}"}}, cache: true, update: {{said: output, by: run.thread_id}}}}
  slow: {{kind: llm, prompt: {{text: "Take your time"}}, update: {{other: output}}}}
edges:
  - START -> split
  - {{from: split, to: [expensive, slow]}}
  - expensive -> END
  - slow -> END
"#
    );
    std::fs::write(d.join("w.yaml"), wf).unwrap();
    let mock = "match:\n  - {contains: Say, reply: computed}\n  - {contains: Take your time, reply: {text: done, delay: 1.5}}\n";
    std::fs::write(d.join("mock.yaml"), mock).unwrap();
    let args = |thread: &str| {
        [
            "run",
            "w.yaml",
            "--mock",
            "mock.yaml",
            "--input",
            "word=x",
            "--stream",
            "jsonl",
            "--thread",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([thread.to_string()])
        .collect::<Vec<_>>()
    };
    let first = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(d)
        .env("RUNNER_DB", d.join("runner.db"))
        .args(args("a"))
        .output()
        .unwrap();
    assert_eq!(
        first.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );

    // Thread b hits; it is killed while `slow` still waits for its reply.
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(d)
        .env("RUNNER_DB", d.join("runner.db"))
        .args(args("b"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let reader = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut hit = false;
    for line in std::io::BufRead::lines(reader) {
        let e: Value = serde_json::from_str(&line.unwrap()).unwrap_or_default();
        if e["type"] == "node_end" && e["node"] == "expensive" {
            hit = e["cache_hit"] == true;
            break;
        }
    }
    child.kill().unwrap();
    assert!(!child.wait().unwrap().success(), "the run was killed, not finished");
    assert!(hit, "the second thread hit the cache");

    assert_eq!(runner(d, &["cache", "clear"]).status.code(), Some(0));
    let resumed = runner(
        d,
        &["resume", "--thread", "b", "--mock", "mock.yaml", "--stream", "jsonl"],
    );
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(0), "{stderr}");
    let events: Vec<Value> = stderr.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let of = |kind: &str| {
        events
            .iter()
            .filter(|e| e["type"] == kind && e["node"] == "expensive")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(of("node_start").is_empty(), "the hit ran again: {stderr}");
    assert_eq!(of("node_end").len(), 1, "{stderr}");
    assert_eq!(
        of("node_end")[0]["cached"],
        true,
        "taken from its stored result: {stderr}"
    );
    let state: Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!((&state["by"], &state["other"]), (&json!("a"), &json!("done")));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_served_runs_use_the_cache_and_delete_clears_it() {
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir(&workflows).unwrap();
    std::fs::write(workflows.join("cached.yaml"), expensive("{ttl: 1h}")).unwrap();
    let mock = dir.path().join("mock.yaml");
    std::fs::write(&mock, MOCK).unwrap();
    let (child, base, said) = super::serve::spawn(dir.path(), &workflows, &mock, &[], &[]);
    assert!(said.contains("serving cached\n"), "{said}");
    let s = super::serve::Server {
        child,
        base,
        dir: Some(dir),
    };
    let wait = || async {
        let input = json!({"assistant_id": "cached", "input": {"word": "x"}});
        let (status, _, values) = super::serve::call(&s, Method::POST, "/runs/wait", Some(input)).await;
        assert_eq!(status, 200, "{values}");
        values["by"].as_str().unwrap().to_string()
    };
    let first = wait().await;
    assert_eq!(wait().await, first, "a second served run reuses the first's result");

    let (status, _, e) = super::serve::call(&s, Method::DELETE, "/assistants/cached/cache?node=nope", None).await;
    assert_eq!(status, 404, "{e}");
    let (status, _, _) = super::serve::call(&s, Method::DELETE, "/assistants/nope/cache", None).await;
    assert_eq!(status, 404);
    let (status, _, body) =
        super::serve::call(&s, Method::DELETE, "/assistants/cached/cache?node=expensive", None).await;
    assert_eq!((status, body), (204, Value::Null));
    let third = wait().await;
    assert_ne!(third, first, "a cleared cache misses");
    // By the assistant's uuid, every node.
    let id = runner::server::assistant_id("cached");
    let (status, _, _) = super::serve::call(&s, Method::DELETE, &format!("/assistants/{id}/cache"), None).await;
    assert_eq!(status, 204);
    assert_ne!(wait().await, third);
}
