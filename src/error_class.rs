//! The error classes: how a failure is classified wherever it happens (a model provider, the
//! web client, a node, the engine's timeout and budget checks), and the names a workflow uses
//! for them in `retry_policy.retry_on` and reads as `error.class` in an `on_error` handler.
//!
//! A leaf: it depends on nothing in the crate. It is runtime vocabulary, so it does not live in
//! spec/ (the runtime layers would otherwise depend on the language as written to classify their
//! failures); and it is not only HTTP's, so it does not live in `net::http_error` (spec/, which
//! parses `retry_on`, would then depend on the network layer). `net::http_error` maps HTTP
//! statuses onto it; spec/ refers to it only to parse and document `retry_on`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A class of node failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The attempt ran past its timeout.
    Timeout,
    /// The remote side asked us to slow down (HTTP 429).
    RateLimit,
    /// The remote side failed (HTTP 5xx).
    Server,
    /// The connection failed.
    Network,
    /// A streamed response was cut off.
    Stream,
    /// The remote side rejected the request (HTTP 4xx other than 429).
    BadRequest,
    /// Credentials were missing or refused.
    Auth,
    /// The prompt did not fit the model's context window (a server's overflow reply). An llm
    /// node answers it by trimming its prompt once more, harder, by its `fit` policy; it is
    /// not retried blindly by default.
    ContextLength,
    /// A reply could not be parsed or did not match its schema.
    Invalid,
    /// A usage budget (`limits` or the node's `budget`) was spent. Never retried.
    Budget,
    /// Any failure.
    All,
}

impl ErrorClass {
    /// The name a workflow uses for the class (`retry_on`, `error.class`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Timeout => "timeout",
            ErrorClass::RateLimit => "rate_limit",
            ErrorClass::Server => "server",
            ErrorClass::Network => "network",
            ErrorClass::Stream => "stream",
            ErrorClass::BadRequest => "bad_request",
            ErrorClass::Auth => "auth",
            ErrorClass::ContextLength => "context_length",
            ErrorClass::Invalid => "invalid",
            ErrorClass::Budget => "budget",
            ErrorClass::All => "all",
        }
    }
}
