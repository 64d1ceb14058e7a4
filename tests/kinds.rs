//! A node kind added from outside the crate: one module (its fields, its compile step, its
//! run) and one line registering it. Nothing in runner names it, yet the validator checks its
//! fields at their lines, the compiler checks what `update` reads of its output, and the
//! engine runs it, retries it and scrubs it like a built-in kind.

use std::sync::Arc;

use runner::checkpoint::memory::MemoryCheckpointer;
use runner::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use runner::compile::{Compilation, Compiler, Plan, TemplateId};
use runner::engine::events::Events;
use runner::engine::kind::{Attempt, NodeCtx, NodeKind, NodeOutput, render};
use runner::engine::{Engine, Kinds, RunRequest, Services, Status};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::support::Project;

/// `shout`: renders `text` and repeats it in capitals `times` times. `output` is `{text}`.
#[derive(Deserialize, JsonSchema)]
struct ShoutNode {
    /// The text (template).
    text: String,
    /// How often (default 1).
    #[serde(default)]
    times: Option<u32>,
}

struct ShoutConfig {
    text: TemplateId,
    times: usize,
}

struct Shout;

impl KindDecl for Shout {
    fn name(&self) -> &'static str {
        "shout"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        runner::spec::schema::kind_def::<ShoutNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: ShoutNode = cx.own()?;
        let text = cx.template(&["text"], &n.text)?;
        let config = ShoutConfig {
            text,
            times: n.times.unwrap_or(1) as usize,
        };
        Some((KindConfig::new(config), Shape::fields(&["text"])))
    }
}

impl NodeKind for Shout {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Ready((|| {
            let config = ctx.config::<ShoutConfig>()?;
            let text = render(ctx, &config.text, "/text")?.to_uppercase();
            Ok(NodeOutput {
                output: json!({"text": vec![text; config.times].join(" ")}),
                ..Default::default()
            })
        })())
    }
}

/// The built-in kinds and `shout`: the one registration line.
fn kinds() -> Kinds {
    runner::nodes::builtin().with(Arc::new(Shout))
}

const WORKFLOW: &str = r#"
name: shouting
input: {type: object, properties: {who: {type: string}}}
state:
  said: {type: string}
nodes:
  greet:
    kind: shout
    text: "hello {{ input.who }}"
    times: 2
    update:
      said: output.text
edges:
  - START -> greet
  - greet -> END
"#;

fn compile(p: &Project, kinds: &Kinds) -> (Option<Arc<Plan>>, Compilation) {
    let mut c = Compiler::new(kinds.decls());
    let plan = c.compile(&p.path("w.yaml"));
    (plan, c.finish())
}

#[test]
fn a_kind_added_outside_the_crate_compiles_and_runs() {
    let p = Project::new(&[("w.yaml", WORKFLOW)]);
    let kinds = kinds();
    let (plan, result) = compile(&p, &kinds);
    assert_eq!(result.errors(), 0, "{:#?}", result.diagnostics);
    let engine = Engine::new(
        plan.unwrap(),
        Arc::new(MemoryCheckpointer::new()),
        Services::with_kinds(kinds),
        Events::none(),
    );
    let out = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(engine.run(RunRequest {
            input: Some(json!({"who": "world"})),
            ..RunRequest::default()
        }))
        .unwrap();
    assert_eq!(out.status, Status::Done, "{:?}", out.error);
    assert_eq!(out.state["said"], json!("HELLO WORLD HELLO WORLD"));
}

#[test]
fn the_added_kind_s_fields_are_checked_against_its_own_schema() {
    let bad = WORKFLOW.replace("    times: 2\n", "    times: 2\n    loud: true\n");
    let p = Project::new(&[("w.yaml", &bad)]);
    let (plan, result) = compile(&p, &kinds());
    assert!(plan.is_none());
    let d = result.diagnostics.iter().find(|d| d.is_error()).expect("an error");
    assert_eq!(d.code.as_str(), "E100", "{d:?}");
    assert!(d.message.contains("loud"), "{d:?}");
    // The fields a `shout` node takes are suggested, not the workflow's.
    let help = d.help.as_deref().unwrap_or_default();
    assert!(
        help.contains("text") && help.contains("times") && !help.contains("imports"),
        "{d:?}"
    );
    // At the field's own line.
    assert_eq!(d.span.map(|s| s.start.line), Some(11), "{d:?}");
}

#[test]
fn what_update_reads_of_the_added_kind_s_output_is_checked() {
    let bad = WORKFLOW.replace("said: output.text", "said: output.txet");
    let p = Project::new(&[("w.yaml", &bad)]);
    let (plan, result) = compile(&p, &kinds());
    assert!(plan.is_none());
    assert!(
        result
            .diagnostics
            .iter()
            .any(|d| d.is_error() && d.message.contains("txet")),
        "{:#?}",
        result.diagnostics
    );
}

#[test]
fn a_kind_not_registered_is_unknown() {
    let p = Project::new(&[("w.yaml", WORKFLOW)]);
    let (plan, result) = compile(&p, &runner::nodes::builtin());
    assert!(plan.is_none());
    assert!(
        result
            .diagnostics
            .iter()
            .any(|d| d.message.contains("unknown kind `shout`")),
        "{:#?}",
        result.diagnostics
    );
}
