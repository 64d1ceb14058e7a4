//! `runner schema`: print the workflow JSON Schema.

use std::io::Write;

use super::exit;

/// Print the JSON Schema (draft 2020-12) of workflow files.
///
/// Example: runner schema > workflow.schema.json
#[derive(clap::Args)]
pub(super) struct Args {
    /// Generate the schema from this build's types instead of printing the embedded copy
    /// (for refreshing schemas/workflow.schema.json after changing the language).
    #[arg(long, hide = true)]
    generate: bool,
}

pub(super) fn run(args: Args) -> anyhow::Result<u8> {
    let text = if args.generate {
        crate::spec::schema::generate_text(|g| crate::nodes::builtin().decls().schemas(g))
    } else {
        crate::spec::schema::WORKFLOW_SCHEMA.to_string()
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(exit::OK)
}
