//! `runner schema`: print the workflow JSON Schema.

use std::io::Write;

use super::exit;

/// Print the JSON Schema (draft 2020-12) of workflow files.
///
/// Example: runner schema > workflow.schema.json
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_: Args) -> anyhow::Result<u8> {
    std::io::stdout().lock().write_all(crate::spec::schema::WORKFLOW_SCHEMA.as_bytes())?;
    Ok(exit::OK)
}
