//! Long-term memory per user: a user's namespaces are stored under `["users", USER_ID]`, so a
//! namespace a workflow or a client names (`[memory, prefs]`) is that user's own, and another
//! user naming the same namespace reaches their own; namespaces under a prefix the workflows
//! declare shared (`serve.shared_store`) are everyone's, stored as named. A user never names
//! the stored form: a namespace under `users` is prefixed like any other, so no shared
//! declaration or user id can reach another user's items.

use std::sync::Arc;

/// The first label of every user's private namespaces.
pub(crate) const USERS: &str = "users";

/// One user's view of long-term memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceScope {
    owner: String,
    /// Namespace prefixes every user shares.
    shared: Arc<[Vec<String>]>,
}

impl NamespaceScope {
    pub fn new(owner: impl Into<String>, shared: Arc<[Vec<String>]>) -> NamespaceScope {
        NamespaceScope {
            owner: owner.into(),
            shared,
        }
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether `namespace` is under a shared prefix (a shared prefix is never under `users`).
    pub fn is_shared(&self, namespace: &[String]) -> bool {
        self.shared
            .iter()
            .any(|p| !p.is_empty() && p[0] != USERS && namespace.starts_with(p))
    }

    /// The namespace as stored: as named when shared, else under the owner's prefix.
    pub fn stored(&self, namespace: &[String]) -> Vec<String> {
        if self.is_shared(namespace) {
            return namespace.to_vec();
        }
        let mut stored = Vec::with_capacity(namespace.len() + 2);
        stored.push(USERS.to_string());
        stored.push(self.owner.clone());
        stored.extend_from_slice(namespace);
        stored
    }

    /// A stored namespace as the owner names it; none when it is neither theirs nor shared.
    pub fn shown(&self, stored: &[String]) -> Option<Vec<String>> {
        match stored {
            [users, owner, rest @ ..] if users == USERS && *owner == self.owner => Some(rest.to_vec()),
            _ if self.is_shared(stored) => Some(stored.to_vec()),
            _ => None,
        }
    }

    /// A search's or a listing's result item (`{namespace, …}`) as the owner sees it; none
    /// when its namespace is not theirs to see.
    pub fn shown_item(&self, mut item: serde_json::Value) -> Option<serde_json::Value> {
        let stored: Vec<String> = serde_json::from_value(item.get("namespace")?.clone()).ok()?;
        item["namespace"] = serde_json::json!(self.shown(&stored)?);
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(labels: &[&str]) -> Vec<String> {
        labels.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn a_users_namespaces_are_their_own_except_the_shared_ones() {
        let shared: Arc<[Vec<String>]> = vec![ns(&["docs"]), ns(&["users", "x"])].into();
        let alice = NamespaceScope::new("alice", shared.clone());
        let bob = NamespaceScope::new("bob", shared);
        assert_eq!(alice.stored(&ns(&["memory"])), ns(&["users", "alice", "memory"]));
        assert_eq!(alice.stored(&ns(&["docs", "faq"])), ns(&["docs", "faq"]));
        // A shared prefix under `users` shares nothing: it is prefixed like any namespace.
        assert_eq!(
            alice.stored(&ns(&["users", "x"])),
            ns(&["users", "alice", "users", "x"])
        );
        // Naming another user's stored namespace reaches one's own.
        assert_eq!(
            bob.stored(&ns(&["users", "alice", "memory"])),
            ns(&["users", "bob", "users", "alice", "memory"])
        );
        assert_eq!(alice.shown(&ns(&["users", "alice", "memory"])), Some(ns(&["memory"])));
        assert_eq!(bob.shown(&ns(&["users", "alice", "memory"])), None);
        assert_eq!(bob.shown(&ns(&["docs", "faq"])), Some(ns(&["docs", "faq"])));
        assert_eq!(bob.shown(&ns(&["other"])), None);
    }
}
