//! `runner new NAME`: a workflow to start from, with its prompt, a test case and a mock script,
//! which pass `runner validate` and `runner test` as written.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::exit;

/// Scaffold a workflow: NAME.yaml, its prompt, NAME.test.yaml and NAME.mock.yaml.
///
/// The prompt goes into the nearest `prompts/` folder at or above DIR (the one the workflow
/// will find), else into a new DIR/prompts/. Existing files are never overwritten.
///
/// Example: runner new support-triage --dir workflows
#[derive(clap::Args)]
pub(super) struct Args {
    /// The workflow's name: lower-case letters, digits, `-` and `_`, starting with a letter.
    name: String,
    /// The folder the workflow goes into (created if missing).
    #[arg(long, default_value = "workflows")]
    dir: PathBuf,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    let name = args.name.as_str();
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!("`{name}` is not a workflow name: use lower-case letters, digits, `-` and `_`, starting with a letter");
    }
    std::fs::create_dir_all(&args.dir).with_context(|| format!("cannot create {}", args.dir.display()))?;
    let prompts = prompts_dir(&args.dir);
    let files = [
        (args.dir.join(format!("{name}.yaml")), workflow(name, &args.dir)),
        (prompts.join(name).join("answer.j2"), PROMPT.to_string()),
        (args.dir.join(format!("{name}.test.yaml")), test(name)),
        (args.dir.join(format!("{name}.mock.yaml")), MOCK.to_string()),
    ];
    if let Some((taken, _)) = files.iter().find(|(path, _)| path.exists()) {
        bail!("{} exists already: nothing was written", taken.display());
    }
    let mut out = std::io::stdout().lock();
    for (path, text) in &files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(out, "created {}", path.display())?;
    }
    let workflow = args.dir.join(format!("{name}.yaml"));
    writeln!(
        out,
        "\nnext:\n  runner validate {dir}\n  runner test {dir}\n  runner run {wf} --mock {dir}/{name}.mock.yaml --input question=\"What is a heat pump?\"\n  runner run {wf} --input question=\"What is a heat pump?\"   # with OPENAI_API_KEY, or --model default=ollama:llama3.2",
        dir = args.dir.display(),
        wf = workflow.display(),
    )?;
    Ok(exit::OK)
}

/// The `prompts/` folder a workflow in `dir` finds: the nearest at or above it, else a new
/// one in `dir`.
fn prompts_dir(dir: &Path) -> PathBuf {
    let mut at = Some(dir);
    while let Some(d) = at {
        let candidate = d.join("prompts");
        if candidate.is_dir() {
            return candidate;
        }
        at = d.parent().filter(|p| !p.as_os_str().is_empty());
    }
    if Path::new("prompts").is_dir() && dir.is_relative() {
        return PathBuf::from("prompts");
    }
    dir.join("prompts")
}

fn workflow(name: &str, dir: &Path) -> String {
    format!(
        r#"# {name}: answers a question with one model call.
#
#   runner run {dir}/{name}.yaml --input question="What is a heat pump?"
#   runner test {dir}/{name}.test.yaml        # offline, on the scripted replies of its cases
name: {name}
description: Answers a question in a few sentences.

models:
  default:
    provider: openai
    model: "${{env:RUNNER_MODEL:-gpt-4o-mini}}"
    base_url: "${{env:RUNNER_BASE_URL:-https://api.openai.com/v1}}"
    api_key_env: OPENAI_API_KEY

input:
  type: object
  required: [question]
  properties:
    question: {{type: string, minLength: 1}}

state:
  answer: {{type: string, default: ""}}

nodes:
  answer:
    kind: llm
    prompt: {name}/answer.j2
    max_tokens: 400
    update: {{answer: output}}

edges: [START -> answer -> END]

output: [answer]
"#,
        dir = dir.display()
    )
}

const PROMPT: &str = "Answer the question below in at most three sentences. If you do not know, say so.\n\nQuestion: {{ input.question }}\n";

fn test(name: &str) -> String {
    format!(
        r#"# Cases of {name}.yaml for `runner test` (docs/testing.md in runner's repository).
workflow: {name}.yaml
cases:
  - name: answers the question
    input: {{question: What is a heat pump?}}
    mock_file: {name}.mock.yaml
    expect:
      status: done
      path: [answer]
      output: {{answer: {{$contains: heat}}}}

  - name: a question is required
    input: {{}}
    expect:
      status: failed
      error_contains: question
"#
    )
}

const MOCK: &str = "# Scripted model replies for offline runs and tests (`runner run --mock FILE`).\nreplies:\n  answer: A heat pump moves heat from the outside air into a building, using a compressor and a refrigerant.\n";
