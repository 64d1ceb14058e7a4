//! What nodes reach beyond the state: model providers and, per kind, the clients and stores
//! the run was given. The engine carries a `Services` without looking inside it.

use std::sync::Arc;

use crate::cassette::Cassette;
use crate::providers::Providers;

/// The outside world of a run, shared by every task (cheap to clone: handles only).
#[derive(Clone, Default, Debug)]
pub struct Services {
    /// Model providers by profile name.
    pub providers: Providers,
    /// The cassette of `--record` / `--replay`: kinds that make requests of their own pass
    /// them through [`Cassette::exchange`] when it is set.
    pub cassette: Option<Arc<Cassette>>,
}

impl From<Providers> for Services {
    fn from(providers: Providers) -> Services {
        Services {
            providers,
            cassette: None,
        }
    }
}
