//! What a user owns: the one place handlers ask whether a caller may see a thread (and so its
//! state, history and runs), stamp what a caller creates, and scope the store to a caller. A
//! resource another user owns answers 404, as if it did not exist (LangGraph's servers answer
//! so for what their auth filters leave out); an admin sees everything.
//!
//! Ownership is `metadata.owner`, as LangGraph's auth handlers stamp it, so clients of the SDKs
//! see it; the databases index it for searches. A resource a future endpoint adds (a cron, say)
//! takes ownership with [`Caller::stamp`] when it is made and [`Caller::sees`] when it is read.

use serde_json::{Map, Value, json};

use super::Caller;
use crate::server::Shared;
use crate::server::http::ApiError;

impl Caller {
    /// Whether the caller may see a resource whose metadata is `metadata`.
    pub(crate) fn sees(&self, metadata: &Value) -> bool {
        self.admin
            || self
                .user
                .as_deref()
                .is_some_and(|u| crate::checkpoint::runs::owner_of(metadata) == Some(u))
    }

    /// Stamps what the caller creates as theirs; a caller with no identity stamps nothing.
    pub(crate) fn stamp(&self, metadata: &mut Map<String, Value>) {
        if let Some(user) = &self.user {
            metadata.insert("owner".into(), json!(user));
        }
    }

    /// Whether only what is theirs is shown to the caller.
    pub(crate) fn restricted(&self) -> bool {
        !self.admin
    }

    /// The caller's view of long-term memory (none: an admin's, every namespace as stored).
    pub(crate) fn store_scope(&self, app: &Shared) -> Option<crate::rag::NamespaceScope> {
        let user = self.user.as_ref().filter(|_| self.restricted())?;
        let shared: Vec<Vec<String>> = app
            .graphs
            .all()
            .iter()
            .flat_map(|g| g.plan.shared_store().iter().cloned())
            .collect();
        Some(crate::rag::NamespaceScope::new(user.clone(), shared.into()))
    }
}

fn no_thread(id: &str) -> ApiError {
    ApiError::not_found(format!("Thread with ID {id} not found"))
}

/// Thread `id` exists and the caller may see it; otherwise 404, whether it is missing or
/// another user's. An admin's request goes on to the handler, which says whether it exists.
pub(crate) fn thread(app: &Shared, caller: &Caller, id: &str) -> Result<(), ApiError> {
    if !caller.restricted() {
        return Ok(());
    }
    match app.store.get_thread_meta(id)? {
        Some(meta) if caller.sees(&meta.metadata) => Ok(()),
        _ => Err(no_thread(id)),
    }
}

/// Thread `id`, if it exists, is one the caller may see (a run may create a thread that does
/// not exist yet); another user's is a 404.
pub(crate) fn thread_if_exists(app: &Shared, caller: &Caller, id: &str) -> Result<(), ApiError> {
    if !caller.restricted() {
        return Ok(());
    }
    match app.store.get_thread_meta(id)? {
        Some(meta) if caller.sees(&meta.metadata) => Ok(()),
        Some(_) => Err(no_thread(id)),
        // A thread with no API record (made by `runner run`) is nobody's: only admins see it.
        None if app.store.get_thread(id)?.is_some() => Err(no_thread(id)),
        None => Ok(()),
    }
}

/// A run the caller asks for, made theirs: its owner and its context's `user_id`, and counted
/// against their quota (429 when it is spent).
pub(crate) fn run(
    app: &Shared,
    caller: &Caller,
    create: &mut crate::server::manager::CreateRun,
) -> Result<(), ApiError> {
    if let Some(thread) = &create.thread {
        thread_if_exists(app, caller, thread)?;
    }
    let Some(user) = &caller.user else {
        return Ok(());
    };
    if let Some(quotas) = app.auth.quotas() {
        quotas.admit(app.store.as_ref(), caller)?;
    }
    create.owned_by(user);
    Ok(())
}
