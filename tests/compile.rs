//! The compiler's judgement on small workflows: what it accepts (no false alarms from the graph
//! analysis) and what it refuses, as a table of `check(files, expected)` cases.

use std::path::Path;

use runner::compile::{Compiler, compile_file};

/// Writes `files` into a temp project (with a prompts/ dir) and validates `main.yaml`.
/// Returns `CODE@line` for every diagnostic.
fn diagnostics(files: &[(&str, &str)]) -> Vec<String> {
    compiled(files)
        .iter()
        .map(|d| format!("{}@{}", d.code, d.span.map_or(0, |s| s.start.line)))
        .collect()
}

/// Every diagnostic's message, one a line.
fn diagnostics_full(files: &[(&str, &str)]) -> String {
    compiled(files).iter().map(|d| format!("{}\n", d.message)).collect()
}

fn compiled(files: &[(&str, &str)]) -> Vec<runner::diag::Diagnostic> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let mut c = Compiler::new(runner::nodes::builtin().decls());
    c.check(&dir.path().join("main.yaml"));
    c.finish().diagnostics
}

#[track_caller]
fn check(files: &[(&str, &str)], expected: &[&str]) {
    assert_eq!(diagnostics(files), expected, "diagnostics differ");
}

const HEAD: &str = "name: t\nmodels: {default: {provider: mock, model: m}}\n";

fn wf(body: &str) -> String {
    format!("{HEAD}{body}")
}

#[test]
fn routes_to_alternatives_that_write_the_same_key_do_not_conflict() {
    let w = wf(r#"
state: {answer: {type: string}}
nodes:
  pick: {kind: set}
  a: {kind: set, update: {answer: "'a'"}}
  b: {kind: set, update: {answer: "'b'"}}
edges:
  - START -> pick
  - from: pick
    route:
      - {when: "state.answer == ''", to: a}
      - {to: b}
  - a -> END
  - b -> END
"#);
    check(&[("main.yaml", &w)], &[]);
}

#[test]
fn parallel_branches_conflict_without_a_reducer_and_not_with_one() {
    let body = |reducer: &str| {
        wf(&format!(
            r#"
state: {{notes: {{type: array, default: [] {reducer}}}}}
nodes:
  split: {{kind: set}}
  a: {{kind: set, update: {{notes: "['a']"}}}}
  b: {{kind: set, update: {{notes: "['b']"}}}}
  join: {{kind: set}}
edges:
  - START -> split
  - {{from: split, to: [a, b]}}
  - {{from: [a, b], to: join}}
  - join -> END
"#
        ))
    };
    check(&[("main.yaml", &body(""))], &["E404@8"]);
    check(&[("main.yaml", &body(", reducer: append"))], &[]);
}

#[test]
fn branches_of_unequal_length_that_meet_in_one_step_conflict() {
    // a runs in step 2 and c in step 3 on one side; b1 -> b2 puts b2 in step 3 as well.
    let w = wf(r#"
state: {x: {type: integer}}
nodes:
  s: {kind: set}
  a: {kind: set}
  c: {kind: set, update: {x: "1"}}
  b1: {kind: set}
  b2: {kind: set, update: {x: "2"}}
edges:
  - START -> s
  - {from: s, to: [a, b1]}
  - a -> c -> END
  - b1 -> b2 -> END
"#);
    check(&[("main.yaml", &w)], &["E404@10"]);
}

#[test]
fn fan_out_targets_need_reducers_on_the_keys_they_write() {
    let body = |reducer: &str| {
        wf(&format!(
            r#"
state:
  tasks: {{type: array, default: []}}
  results: {{type: array, default: [] {reducer}}}
nodes:
  plan: {{kind: set}}
  work: {{kind: set, update: {{results: "[task.name]"}}}}
edges:
  - START -> plan
  - {{from: plan, send: {{to: work, foreach: state.tasks, as: task}}}}
  - work -> END
"#
        ))
    };
    check(&[("main.yaml", &body(", reducer: append"))], &[]);
    check(&[("main.yaml", &body(""))], &["E404@9"]);
}

#[test]
fn the_fan_out_item_exists_only_in_the_target() {
    let w = wf(r#"
state: {tasks: {type: array, default: []}, out: {type: array, reducer: append, default: []}}
nodes:
  plan: {kind: set, update: {out: "[task]"}}
  work: {kind: set, update: {out: "[task]"}}
edges:
  - START -> plan
  - {from: plan, send: {to: work, foreach: state.tasks, as: task}}
  - work -> END
"#);
    check(&[("main.yaml", &w)], &["E302@6"]);
}

#[test]
fn foreach_over_a_scalar_is_refused() {
    let w = wf(r#"
state: {count: {type: integer, default: 0}, out: {type: array, reducer: append, default: []}}
nodes:
  plan: {kind: set}
  work: {kind: set}
edges:
  - START -> plan
  - {from: plan, send: {to: work, foreach: state.count}}
  - work -> END
"#);
    check(&[("main.yaml", &w)], &["E304@10"]);
}

#[test]
fn names_are_checked_in_every_namespace() {
    let w = wf(r#"
input: {type: object, properties: {query: {type: string}}}
config: {costs: {max: 1.0}}
state: {total: {type: number, default: 0}, text: {type: string, default: ""}}
predicates: {over: "state.total >= config.costs.max"}
nodes:
  ask:
    kind: llm
    prompt: {text: "{{ input.query }} {{ input.qurey }} {{ config.costs.mx }}"}
    output: {format: json, schema: {type: object, properties: {answer: {type: string}}, additionalProperties: false}}
    update: {text: output.answer, total: "usage.cost + output.anwser | length"}
edges:
  - START -> ask
  - from: ask
    route:
      - {when: over, to: END}
      - {when: "not ovr", to: END}
      - {to: END}
"#);
    check(&[("main.yaml", &w)], &["E302@11", "E302@11", "E302@13", "E302@19"]);
}

#[test]
fn user_kinds_merge_defaults_and_check_params() {
    let lib = r#"
name: lib
kinds:
  summarizer:
    extends: llm
    params: {style: {type: string, enum: [brief, detailed], default: brief}, audience: {type: string}}
    with: {prompt: {text: "Summarize for {{ params.audience }} in a {{ params.style }} style."}}
predicates: {always: "true"}
"#;
    let ok = wf(r#"
imports: [lib.yaml]
state: {s: {type: string, default: ""}}
nodes:
  sum: {kind: summarizer, params: {audience: experts}, update: {s: output}}
edges:
  - START -> sum
  - {from: sum, route: [{when: always, to: END}, {to: END}]}
"#);
    check(&[("main.yaml", &ok), ("lib.yaml", lib)], &[]);
    let missing = wf(r#"
imports: [lib.yaml]
nodes:
  sum: {kind: summarizer, params: {style: poetic, colour: red}}
edges: [START -> sum, sum -> END]
"#);
    check(
        &[("main.yaml", &missing), ("lib.yaml", lib)],
        &["E214@6", "E214@6", "E214@6"],
    );
}

#[test]
fn imports_that_cycle_or_define_nodes_are_refused() {
    let a = "name: a\nimports: [b.yaml]\n";
    let b = "name: b\nimports: [a.yaml]\n";
    let main = wf("imports: [a.yaml]\nnodes: {n: {kind: set}}\nedges: [START -> n, n -> END]\n");
    let d = diagnostics(&[("main.yaml", &main), ("a.yaml", a), ("b.yaml", b)]);
    assert!(d.contains(&"E208@2".to_string()), "{d:?}");
    let with_nodes = wf("nodes: {n: {kind: set}}\nedges: [START -> n, n -> END]\n");
    let main = wf("imports: [lib.yaml]\nnodes: {n: {kind: set}}\nedges: [START -> n, n -> END]\n");
    check(&[("main.yaml", &main), ("lib.yaml", &with_nodes)], &["E213@3"]);
}

#[test]
fn goto_reads_the_output_of_its_gate() {
    let w = wf(r##"
types:
  Answer: {type: object, required: [action], properties: {action: {enum: [accept, edit]}, feedback: {type: string}}}
state: {feedback: {type: string, default: ""}}
nodes:
  gate:
    kind: interrupt
    message: "Approve?"
    response: {$ref: "#/types/Answer"}
    update: {feedback: "output.feedback or ''"}
    goto:
      - {when: "output.action == 'accept'", to: done}
      - {when: "output.verdict == 'x'", to: gate}
      - {to: END}
  done: {kind: set}
edges: [START -> gate, done -> END]
"##);
    check(&[("main.yaml", &w)], &["E302@15"]);
}

#[test]
fn loops_need_an_exit_but_a_conditional_exit_is_enough() {
    let w = wf(r#"
state: {n: {type: integer, default: 0}}
nodes:
  a: {kind: set, update: {n: "state.n + 1"}}
  b: {kind: set}
edges:
  - START -> a
  - a -> b
  - from: b
    route:
      - {when: "state.n >= 3", to: END}
      - {to: a}
"#);
    check(&[("main.yaml", &w)], &[]);
}

#[test]
fn subgraph_inputs_and_outputs_are_checked_against_the_child() {
    let child = r#"
name: child
models: {default: {provider: mock, model: m}}
input: {type: object, properties: {topic: {type: string}}, additionalProperties: false}
output: [summary]
state: {summary: {type: string, default: ""}}
nodes: {s: {kind: set, update: {summary: "input.topic"}}}
edges: [START -> s, s -> END]
"#;
    let w = wf(r#"
state: {result: {type: string, default: ""}}
nodes:
  sub:
    kind: subgraph
    workflow: child.yaml
    input: {topic: "'x'", topik: "'y'"}
    update: {result: "output.summary ~ output.sumary"}
edges: [START -> sub, sub -> END]
"#);
    check(&[("main.yaml", &w), ("child.yaml", child)], &["E100@9", "E302@10"]);
}

#[test]
fn a_subgraph_that_contains_itself_is_a_cycle() {
    let w = wf("nodes: {me: {kind: subgraph, workflow: main.yaml}}\nedges: [START -> me, me -> END]\n");
    check(&[("main.yaml", &w)], &["E208@3"]);
}

#[test]
fn reducers_read_only_current_and_update() {
    let w = wf(r#"
reducers: {best: "current if current > update else state.x"}
state: {top: {type: number, reducer: best, default: 0}}
nodes: {n: {kind: set, update: {top: "1"}}}
edges: [START -> n, n -> END]
"#);
    check(&[("main.yaml", &w)], &["E302@4"]);
}

fn write_project(dir: &Path, workflow: &str, prompt: &str) {
    std::fs::create_dir_all(dir.join("prompts")).unwrap();
    std::fs::write(dir.join("prompts/p.j2"), prompt).unwrap();
    std::fs::write(dir.join("main.yaml"), workflow).unwrap();
}

#[test]
fn the_plan_hash_follows_meaning_not_formatting() {
    let dir = tempfile::tempdir().unwrap();
    let base = wf(
        "state: {s: {type: string, default: ''}}\nnodes: {a: {kind: llm, prompt: p.j2, update: {s: output}}}\nedges: [START -> a, a -> END]\n",
    );
    let hash = |w: &str, p: &str| {
        write_project(dir.path(), w, p);
        let (plan, result) = compile_file(&dir.path().join("main.yaml"), &runner::nodes::builtin().decls());
        assert!(result.diagnostics.is_empty(), "{:?}", result.diagnostics);
        plan.unwrap().hash().to_string()
    };
    let h0 = hash(&base, "Hello");
    let reformatted = format!("# a comment\n{}", base.replace("nodes: {a:", "nodes:   {a:"));
    assert_eq!(hash(&reformatted, "Hello"), h0);
    assert_ne!(hash(&base, "Hello!"), h0, "a prompt edit changes the plan");
    assert_ne!(hash(&base.replace("START -> a", "START->a"), "Hello").len(), 0);
    assert_ne!(hash(&base.replace("default: ''", "default: 'x'"), "Hello"), h0);
}

#[test]
fn the_plan_holds_indices_and_compiled_expressions() {
    let dir = tempfile::tempdir().unwrap();
    write_project(
        dir.path(),
        &wf(
            "state: {n: {type: integer, default: 0}}\nnodes: {a: {kind: set, update: {n: 'state.n + 1'}}, b: {kind: set}}\nedges: [START -> a -> b -> END]\n",
        ),
        "",
    );
    let (plan, _) = compile_file(&dir.path().join("main.yaml"), &runner::nodes::builtin().decls());
    let plan = plan.unwrap();
    let a = plan.node_by_name("a").unwrap();
    assert_eq!(plan.name_of(a), "a");
    let runner::compile::Writer::Expr(id) = plan.nodes()[&a].update()[0].1 else {
        panic!("an expression")
    };
    let v = plan
        .exprs()
        .expr(id)
        .eval(minijinja::context! { state => minijinja::context! { n => 41 } })
        .unwrap();
    assert_eq!(v.as_i64(), Some(42));
    assert!(matches!(plan.entry(), [runner::compile::Branch::Always(t)] if t == &[runner::compile::Target::Node(a)]));
}

/// A node's retry policy is resolved when it compiles: without `retry:`, its kind's default
/// (three attempts for a kind that reaches the network, one for the others); with it, the
/// fields it leaves out take their defaults. The engine runs what the plan says.
#[test]
fn retry_defaults_are_resolved_in_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    write_project(
        dir.path(),
        &wf(r#"
state: {out: {type: object, default: {}}}
nodes:
  call: {kind: http, url: "http://127.0.0.1:9/x", timeout: 2s, update: {out: output}}
  once: {kind: http, url: "http://127.0.0.1:9/y", retry: {max_attempts: 1}}
  local: {kind: set}
  told: {kind: set, retry: {initial_interval: 1s, retry_on: [invalid]}}
edges: [START -> call -> once -> local -> told -> END]
"#),
        "",
    );
    let (plan, result) = compile_file(&dir.path().join("main.yaml"), &runner::nodes::builtin().decls());
    assert!(result.diagnostics.is_empty(), "{:?}", result.diagnostics);
    let plan = plan.unwrap();
    let node = |name: &str| &plan.nodes()[&plan.node_by_name(name).unwrap()];
    let call = node("call").retry();
    assert_eq!(
        call.max_attempts, 3,
        "a kind that reaches the network retries by default"
    );
    assert_eq!(call.initial, std::time::Duration::from_millis(500));
    assert!(call.retry_on.contains(&runner::error_class::ErrorClass::RateLimit));
    assert_eq!(node("call").timeout(), Some(std::time::Duration::from_secs(2)));
    assert_eq!(node("once").retry().max_attempts, 1);
    assert_eq!(node("local").retry().max_attempts, 1, "a local kind does not retry");
    assert_eq!(node("local").timeout(), None);
    let told = node("told").retry();
    assert_eq!(told.max_attempts, 3, "a written policy retries whatever the kind");
    assert_eq!(told.initial, std::time::Duration::from_secs(1));
    assert_eq!(told.retry_on, [runner::error_class::ErrorClass::Invalid]);
}

/// `width` nodes fanned out from START, each writing `key` (declared with `reducer`, a suffix
/// of its declaration), joined into `done`.
fn wide(width: usize, reducer: &str) -> String {
    let names: Vec<String> = (0..width).map(|i| format!("n{i}")).collect();
    let mut w = format!("state: {{key: {{type: array, default: []{reducer}}}}}\nnodes:\n");
    for n in &names {
        w.push_str(&format!("  {n}: {{kind: set, update: {{key: \"['{n}']\"}}}}\n"));
    }
    w.push_str("  done: {kind: set}\nedges:\n");
    w.push_str(&format!("  - {{from: START, to: [{}]}}\n", names.join(", ")));
    w.push_str(&format!("  - {{from: [{}], to: done}}\n", names.join(", ")));
    w.push_str("  - done -> END\n");
    wf(&w)
}

/// Thousands of nodes in one superstep are checked by the keys they write, not pair by pair:
/// a wide fan-out validates, and when every branch writes a key without a reducer each
/// writer is reported once (against the first), not once per pair (12.5 million for 5,000).
#[test]
fn a_five_thousand_wide_fan_out_is_checked_by_key_not_by_pair() {
    const WIDTH: usize = 5_000;
    check(&[("main.yaml", &wide(WIDTH, ", reducer: append"))], &[]);
    let found = diagnostics(&[("main.yaml", &wide(WIDTH, ""))]);
    assert_eq!(found.len(), WIDTH - 1);
    assert!(found.iter().all(|d| d.starts_with("E404@")), "{:?}", &found[..3]);
    // The second node's write (line 6) is the first reported; the first node's never is.
    assert_eq!(found[0], "E404@6");
    assert!(!found.contains(&"E404@5".to_string()));
}

#[test]
fn filters_tests_functions_and_subscripts_are_checked_everywhere() {
    let w = wf(r#"
state:
  items: {type: array, default: []}
  n: {type: integer, default: 0}
  messages: {type: array, reducer: add_messages, default: []}
predicates:
  ok: "state.items | lenght > 0"
nodes:
  a:
    kind: llm
    prompt: p.j2
    history: {from: "state['mesages']"}
  b: {kind: set, update: {n: "state.items is emty"}}
  c: {kind: set, update: {n: "len(state.items)"}}
edges:
  - START -> a -> b -> c
  - {from: c, route: [{when: "ok", to: END}, {to: END}]}
"#);
    let prompt = "Hi {{ state.items | nosuch }}\n{{ state['itmes'] }}\n";
    check(
        &[("main.yaml", &w), ("prompts/p.j2", prompt)],
        // Sorted by file: the workflow, then the prompt file (its defects at its own lines).
        &["E310@9", "E302@14", "E310@15", "E310@16", "E310@1", "E302@2"],
    );
}

#[test]
fn legitimate_template_machinery_is_not_reported() {
    let w = wf(r#"
state:
  items: {type: array, default: []}
  text: {type: string, default: ""}
nodes:
  a: {kind: llm, prompt: p.j2, update: {text: "output | trim | upper ~ (range(3) | join(',')) ~ (state.items | length | string)"}}
  b: {kind: set, update: {text: "state.text if state.items is defined and state.text is not none else dict(a=1) | tojson"}}
edges:
  - START -> a -> b -> END
"#);
    let prompt = r#"{% macro item(x) %}- {{ x | default('?') }}{% endmacro %}
{% for it in state.items %}{{ item(it) }} {{ it['name'] }} {{ loop.index }}{% endfor %}
{% set ns = namespace(n=0) %}{% filter upper %}{{ state.text | replace('a', 'b') }}{% endfilter %}
{% if (state.items | length) > 1 %}{{ state['text'] }}{% endif %}
"#;
    check(&[("main.yaml", &w), ("prompts/p.j2", prompt)], &[]);
}

/// `run.remaining_steps` is readable wherever `run` is; a misspelt `run` field is E302.
#[test]
fn run_remaining_steps_is_known_and_its_misspelling_is_not() {
    let w = wf(r#"
state: {n: {type: integer, default: 0}}
nodes: {inc: {kind: set, update: {n: "state.n + 1"}}}
edges:
  - {from: START, route: [{when: "run.remaining_steps > 0", to: inc}, {to: END}]}
  - {from: inc, route: [{when: "run.remaining_step > 1", to: inc}, {to: END}]}
"#);
    check(&[("main.yaml", &w)], &["E302@8"]);
}

/// `${env:}` is expanded in an http field's literal text only: inside `{{ }}` it would go out
/// as written, so it is refused; in the literal text of the url, a header or the query (between
/// `{% %}` blocks included) it is fine.
#[test]
fn env_inside_template_braces_is_refused() {
    let w = wf(r#"
state: {out: {type: object, default: {}}}
nodes:
  call:
    kind: http
    url: "${env:API_URL:-http://127.0.0.1:9}/x"
    headers: {X-Key: "{{ '${env:API_KEY}' | trim }}", X-Other: "Bearer ${env:API_KEY}"}
    query: {q: "{{ '${env:Q}' }}", k: "{% if true %}${env:Q}{% endif %}"}
    update: {out: output}
edges: [START -> call, call -> END]
"#);
    check(&[("main.yaml", &w)], &["E308@9", "E308@10"]);
}

#[test]
fn a_reducer_bypass_that_cannot_work_is_refused() {
    let w = wf(r#"
state:
  log: {type: array, reducer: append, default: []}
  messages: {type: array, reducer: add_messages, default: []}
  items: {type: array, default: [1, 2]}
nodes:
  trim: {kind: set, update: {messages: "[remove_all_messages()]", log: "[remove_all_messages()]"}}
  worker: {kind: set, update: {log: "overwrite([item])"}}
  reset: {kind: set, update: {log: "overwrite([])"}}
edges:
  - START -> trim
  - {from: trim, send: {to: worker, foreach: state.items}}
  - worker -> reset -> END
"#);
    check(&[("main.yaml", &w)], &["E311@9", "E311@10"]);
}

#[test]
fn a_key_fed_from_an_input_field_the_input_cannot_hold_is_refused() {
    let body = |input: &str| {
        wf(&format!(
            r#"{input}
state:
  messages: {{type: array, reducer: add_messages, default: [], from_input: qestion}}
  q: {{type: string, from_input: true}}
nodes: {{a: {{kind: set}}}}
edges: [START -> a -> END]
"#
        ))
    };
    let closed = body("input: {type: object, properties: {question: {type: string}, q: {type: string}}}");
    check(&[("main.yaml", &closed)], &["E216@5"]);
    let open = body("input: {type: object}");
    check(&[("main.yaml", &open)], &[]);
    let none = body("");
    check(&[("main.yaml", &none)], &["E216@5", "E216@6"]);
}

#[test]
fn cache_is_refused_on_a_gate_and_needs_a_ttl_that_is_a_duration() {
    let gate = |cache: &str| {
        wf(&format!(
            r#"
state: {{ok: {{type: boolean, default: false}}}}
nodes:
  ask: {{kind: interrupt, message: "ok?", response: {{type: boolean}}, cache: {cache}, update: {{ok: output}}}}
edges: [START -> ask -> END]
"#
        ))
    };
    check(&[("main.yaml", &gate("true"))], &["E411@6"]);
    // Turned off, it asks nothing of the node.
    check(&[("main.yaml", &gate("false"))], &[]);
    let llm = |node: &str| {
        wf(&format!(
            r#"
kinds:
  cached_llm: {{extends: llm, with: {{cache: {{ttl: 1h}}}}}}
  cached_gate: {{extends: interrupt, with: {{cache: true}}}}
state: {{said: {{type: string, default: ""}}}}
nodes:
  say: {node}
edges: [START -> say -> END]
"#
        ))
    };
    // A number the schema allows that is too large for a duration.
    check(
        &[(
            "main.yaml",
            &llm(r#"{kind: llm, prompt: {text: hi}, cache: {ttl: 1e300}, update: {said: output}}"#),
        )],
        &["E309@9"],
    );
    // A user kind's default is the node's own.
    check(
        &[(
            "main.yaml",
            &llm(r#"{kind: cached_llm, prompt: {text: hi}, update: {said: output}}"#),
        )],
        &[],
    );
    check(
        &[(
            "main.yaml",
            &llm(r#"{kind: cached_gate, message: "ok?", response: {type: string}, update: {said: output}}"#),
        )],
        &["E411@9"],
    );
}

/// A name read through a slice is checked like any other, in every field that holds an
/// expression: `history.from`, a `tools` node's `from`, an agent's `messages`, a fan-out's
/// `foreach`, conditions, writes, an `emit`'s data and a tool's `run`.
#[test]
fn names_read_through_slices_are_checked_in_every_expression_field() {
    let w = wf(r#"
state:
  messages: {type: array, reducer: add_messages, default: []}
  items: {type: array, reducer: append, default: []}
tools:
  look:
    description: Look things up.
    run: {kind: search, queries: "state.itme[:2]"}
nodes:
  chat: {kind: llm, history: {from: "state.message[:-1]"}, tools: [look], update: {messages: "[output]"}}
  act: {kind: tools, from: "state.mesages[-1:]", update: {messages: output}}
  agent: {kind: agent, messages: "state.messges[-4:]", tools: [look], update: {messages: output.messages}}
  each: {kind: emit, event: item, data: "item[:1]"}
  tell: {kind: emit, event: done, data: {first: "state.itmes[:1]"}}
edges:
  - START -> chat -> act -> agent
  - {from: agent, send: {to: each, foreach: "state.tems[:3]", as: item}}
  - {from: agent, route: [{when: "state.mesages[:1] | length > 0", to: tell}, {to: END}]}
  - each -> END
  - tell -> END
"#);
    check(
        &[("main.yaml", &w)],
        &[
            "E302@10", "E302@12", "E302@13", "E302@14", "E302@16", "E302@19", "E302@20",
        ],
    );
}

/// Every duration is checked where it is written, as E309: in a tool's `run` node (whose kind
/// no node of the workflow has), on the tool, in a model profile, in a kind's defaults whether
/// or not a node uses the kind (in an imported file too), and never twice.
#[test]
fn durations_are_checked_wherever_they_are_written() {
    let lib = r#"
name: lib
kinds:
  patient: {extends: llm, with: {timeout: forever}}
"#;
    let w = r#"name: t
imports: [lib.yaml]
models:
  default: {provider: mock, model: m}
  slow: {provider: mock, model: m, idle_timeout: two minutes}
state: {messages: {type: array, reducer: add_messages, default: []}}
tools:
  fetch_page:
    description: Fetch a page.
    run:
      kind: http
      url: "{{ args.url }}"
      retry: {max_attempts: 3, initial_interval: one second}
    timeout: ten s
kinds:
  slow_llm: {extends: llm, with: {retry: {max_interval: 2 minutes}}}
  unused: {extends: http, with: {timeout: 3 weeks}}
nodes:
  ask: {kind: slow_llm, prompt: {text: hi}, tools: [fetch_page], update: {messages: "[output]"}}
  again: {kind: slow_llm, prompt: {text: hi}, update: {messages: "[output]"}}
  wait: {kind: patient, prompt: {text: hi}, update: {messages: "[output]"}}
  act: {kind: tools, update: {messages: output}}
edges:
  - START -> ask -> act -> again -> wait -> END
"#;
    check(
        &[("main.yaml", w), ("lib.yaml", lib)],
        // The library's kind (line 4 of lib.yaml), then main.yaml's lines.
        &["E309@4", "E309@5", "E309@13", "E309@14", "E309@16", "E309@17"],
    );
}

/// A loop's exit flag written only outside the loop, by a node that runs once before it or
/// only after it, cannot end the loop (E403); written by a node that may run while the loop
/// does (a parallel branch) or inside the loop, it can.
#[test]
fn a_loop_exit_written_only_outside_the_loop_is_no_exit() {
    let body = |extra_nodes: &str, extra_edges: &str| {
        wf(&format!(
            r#"state:
  draft: {{type: string, default: ""}}
  approved: {{type: boolean, default: false}}
nodes:
  init: {{kind: set, update: {{approved: "false"}}}}
  write: {{kind: set, update: {{draft: "state.draft ~ 'x'"}}}}
  review: {{kind: set}}
  done: {{kind: set, update: {{approved: "true"}}}}
{extra_nodes}edges:
  - START -> init -> write -> review
  - done -> END
  - from: review
    route: [{{when: "state.approved", to: done}}, {{to: write}}]
{extra_edges}"#
        ))
    };
    // `init` before the loop and `done` after it: the route on line 15 never changes.
    check(&[("main.yaml", &body("", ""))], &["E403@15"]);
    let msg = diagnostics_full(&[("main.yaml", &body("", ""))]);
    assert!(
        msg.contains("(only `init` before it is entered, and `done` after it has ended)"),
        "{msg}"
    );
    // A parallel branch may write it while the loop runs.
    let side = body(
        "  side: {kind: set, update: {approved: \"true\"}}\n",
        "  - START -> side\n  - side -> END\n",
    )
    .replace("init: {kind: set, update: {approved: \"false\"}}", "init: {kind: set}");
    check(&[("main.yaml", &side)], &[]);
    // A node of the loop may write it.
    let inside = body("", "").replace(
        "review: {kind: set}",
        "review: {kind: set, update: {approved: \"true\"}}",
    );
    check(&[("main.yaml", &inside)], &[]);
    // A writer that runs before the loop but not on every way into it may run again.
    let cyclic = body("", "").replace("START -> init -> write", "START -> init -> write\n  - init -> init");
    assert!(!diagnostics(&[("main.yaml", &cyclic)]).contains(&"E403@15".to_string()));
}

/// A node in a loop writing a list written out (`[output]`) to an array key without a reducer
/// is W412, where it writes it; not with an appending reducer, not when the list reads the
/// key itself, not outside a loop.
#[test]
fn a_list_written_in_a_loop_to_a_key_that_replaces_is_a_warning() {
    let body = |notes: &str, write: &str, back: &str| {
        wf(&format!(
            r#"state:
  notes: {{type: array{notes}, default: []}}
  n: {{type: integer, default: 0}}
nodes:
  take: {{kind: set, update: {{n: "state.n + 1", notes: "{write}"}}}}
edges:
  - START -> take
  - from: take
    route: [{{when: "state.n >= 3", to: END}}, {{to: {back}}}]
"#
        ))
    };
    check(&[("main.yaml", &body("", "[state.n]", "take"))], &["W412@7"]);
    let msg = diagnostics_full(&[("main.yaml", &body("", "[state.n]", "take"))]);
    assert!(msg.contains("writes the list `[state.n]` to `notes`"), "{msg}");
    check(&[("main.yaml", &body(", reducer: append", "[state.n]", "take"))], &[]);
    check(&[("main.yaml", &body("", "state.notes + [state.n]", "take"))], &[]);
    check(&[("main.yaml", &body("", "[state.n]", "END"))], &[]);
}

/// W223: an output schema whose largest reply (strings at their `maxLength`, arrays at their
/// `maxItems`, 4 bytes a token) passes the node's `max_tokens`, or its profile's; at the
/// schema, once for an `agent` node (not again in the loop it generates); not when a string
/// or array is unbounded, nor when the reply fits.
#[test]
fn an_output_schema_that_cannot_fit_max_tokens_is_a_warning() {
    let node = |kind: &str, cap: &str, schema: &str| {
        wf(&format!(
            r#"state: {{r: {{type: object, default: {{}}}}, messages: {{type: array, reducer: add_messages, default: []}}}}
nodes:
  n:
    kind: {kind}
    prompt: {{text: hi}}{cap}
    output: {{format: json, schema: {schema}}}
    update: {{r: output}}
edges: [START -> n, n -> END]
"#
        ))
    };
    // 2 + ("summary": 1002 + 4 + 7) = 1015 bytes, 254 tokens.
    let big = "{type: object, properties: {summary: {type: string, maxLength: 1000}}}";
    check(
        &[("main.yaml", &node("llm", "\n    max_tokens: 200", big))],
        &["W223@9"],
    );
    let msg = diagnostics_full(&[("main.yaml", &node("llm", "\n    max_tokens: 200", big))]);
    assert!(
        msg.contains("about 254 tokens, more than its `max_tokens` of 200"),
        "{msg}"
    );
    check(&[("main.yaml", &node("llm", "\n    max_tokens: 300", big))], &[]);
    // Unbounded: no estimate, no warning.
    let open = "{type: object, properties: {summary: {type: string}}}";
    check(&[("main.yaml", &node("llm", "\n    max_tokens: 10", open))], &[]);
    // No cap on the node: its profile's.
    let profiled = node("llm", "", big).replace("model: m}", "model: m, max_tokens: 100}");
    check(&[("main.yaml", &profiled)], &["W223@8"]);
    let msg = diagnostics_full(&[("main.yaml", &profiled)]);
    assert!(msg.contains("model profile `default`'s `max_tokens` of 100"), "{msg}");
    // An agent's answer schema, reported once at the node.
    let agent = node("agent", "\n    max_tokens: 200", big)
        .replace("output: {format: json, schema:", "output: {schema:")
        .replace("kind: agent", "kind: agent\n    tools: [look]")
        .replace(
            "state:",
            "tools: {look: {description: Look., run: {kind: set}}}\nstate:",
        );
    check(&[("main.yaml", &agent)], &["W223@11"]);
}

/// A predicate written as `{expr, description}` has its defects shown inside its `expr`, at
/// their line and column in a folded block, as a predicate written as a plain string does.
#[test]
fn a_predicate_with_a_description_is_narrowed_to_its_defect() {
    let w = wf(
        r#"state: {depth: {type: integer, default: 0}, todo: {type: array, default: []}}
predicates:
  deeper:
    expr: >-
      state.depth < 3
      and state.tood | length > 0
    description: Expand while there is work.
nodes:
  n: {kind: set, update: {depth: "state.depth + 1"}}
edges:
  - START -> n
  - from: n
    route: [{when: deeper, to: n}, {to: END}]
"#,
    );
    let ds = compiled(&[("main.yaml", &w)]);
    let at: Vec<(String, u32, u32)> = ds
        .iter()
        .map(|d| {
            (
                d.code.to_string(),
                d.span.map_or(0, |s| s.start.line),
                d.span.map_or(0, |s| s.start.col),
            )
        })
        .collect();
    assert_eq!(at, [("E302".to_string(), 8, 11)], "{ds:?}");
}

/// A loop left only by a node's `goto` whose condition reads a flag nothing writes is E403 at
/// that condition, as a route's is; a `goto` reading the node's output may end it.
#[test]
fn a_goto_exit_on_a_flag_nothing_writes_is_no_exit() {
    let body = |when: &str| {
        wf(&format!(
            r#"state: {{draft: {{type: string, default: ""}}, approved: {{type: boolean, default: false}}}}
nodes:
  write: {{kind: set, update: {{draft: "state.draft ~ 'x'"}}}}
  review:
    kind: set
    goto: [{{when: "{when}", to: END}}, {{to: write}}]
edges:
  - START -> write -> review
"#
        ))
    };
    check(&[("main.yaml", &body("state.approved"))], &["E403@8"]);
    check(&[("main.yaml", &body("output is none"))], &[]);
    check(&[("main.yaml", &body("state.draft | length > 3"))], &[]);
}
