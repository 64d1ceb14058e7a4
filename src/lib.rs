//! runner: LLM agent graphs written as data.
//!
//! The pipeline, one module per stage: [`spec`] (YAML as written) → [`compile`] (a checked,
//! immutable plan) → engine → checkpoints. [`diag`] carries every stage's problems to the user.

pub mod diag;
pub mod spec;
