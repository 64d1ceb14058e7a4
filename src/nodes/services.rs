//! What nodes reach beyond the state: model providers and, per kind, the clients and stores
//! the run was given. The engine carries a `Services` without looking inside it.

use std::sync::Arc;

use crate::cassette::Cassette;
use crate::net::Web;
use crate::providers::Providers;
use crate::rag::DataStore;

/// The outside world of a run, shared by every task (cheap to clone: handles only).
#[derive(Clone, Default, Debug)]
pub struct Services {
    /// Model providers by profile name.
    pub providers: Providers,
    /// The cassette of `--record` / `--replay` (the providers and `web` were built with it: a
    /// web request is recorded by `web` itself).
    pub cassette: Option<Arc<Cassette>>,
    /// Search indexes and long-term memory (index, retrieve, store). Opened on first use; an
    /// in-memory store unless the run was given a file.
    pub data: DataStore,
    /// The web client of every request a node makes besides model calls: http, search,
    /// scrape, load from a URL, the HTTP reranker (a default one allows only public addresses
    /// and has no cassette).
    pub web: Arc<Web>,
}

impl Services {
    /// Services whose index, retrieve and store nodes use `data`.
    pub fn new(providers: Providers, data: DataStore) -> Services {
        Services {
            providers,
            data,
            ..Services::default()
        }
    }
}

impl From<Providers> for Services {
    fn from(providers: Providers) -> Services {
        Services {
            providers,
            cassette: None,
            data: DataStore::default(),
            web: Arc::default(),
        }
    }
}
