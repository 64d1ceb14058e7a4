//! runner: LLM agent graphs written as data.
//!
//! The pipeline, one module per stage: [`spec`] (YAML as written) → [`compile`] (a checked,
//! immutable [`compile::Plan`]) → engine → checkpoints. [`diag`] carries every stage's problems
//! to the user; [`run`] assembles a run's settings and services; [`cli`] is the only place that
//! prints.

pub mod blocking;
pub mod cassette;
pub mod checkpoint;
pub mod cli;
pub mod clock;
pub mod compile;
pub mod diag;
pub mod engine;
pub mod error_class;
#[cfg(test)]
mod layers;
pub mod net;
pub mod nodes;
pub mod pg;
pub mod providers;
pub mod rag;
pub mod run;
mod secrets;
pub mod server;
pub mod spec;
pub mod telemetry;
