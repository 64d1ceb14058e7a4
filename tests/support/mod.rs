//! Support code shared by the integration tests, compiled once: fake servers on loopback.

pub mod fake_llm;
pub mod fake_rerank;
pub mod fake_web;
