//! What nodes reach beyond the state: model providers and, per kind, the clients and stores
//! the run was given. The engine carries a `Services` without looking inside it.

use std::sync::Arc;

use crate::net::Web;
use crate::providers::Providers;

/// The outside world of a run, shared by every task (cheap to clone: handles only).
#[derive(Clone, Default, Debug)]
pub struct Services {
    /// Model providers by profile name.
    pub providers: Providers,
    /// The web client of the http, search and scrape kinds (a default one allows only public
    /// addresses).
    pub web: Arc<Web>,
}

impl From<Providers> for Services {
    fn from(providers: Providers) -> Services {
        Services {
            providers,
            web: Arc::default(),
        }
    }
}
