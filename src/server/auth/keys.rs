//! Per-user API keys: made here (`runner users add`), stored by the SHA-256 of the key.
//!
//! A fast hash is enough: a key is 32 bytes from the operating system's generator, so guessing
//! one (or a key whose hash a stolen database holds) is a 2^256 search whatever the hash
//! costs. A slow hash (bcrypt, Argon2) buys time only against guessable secrets such as
//! passwords, and would cost every request its delay; SHA-256 also lets the key be found by
//! its hash in one indexed look-up.

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::checkpoint::{ApiKey, CheckpointError, Checkpointer};

/// What every key starts with: a key is told from a JWT by it, and scanners can find leaked
/// ones.
const PREFIX: &str = "rk_";

/// Whether a bearer token is a per-user key rather than a JWT.
pub(crate) fn looks_like_key(token: &str) -> bool {
    token.starts_with(PREFIX) && !token.contains('.')
}

/// The SHA-256 of a key, hex: what the store keeps and looks keys up by.
pub(crate) fn hash(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new key for `user` (an admin's with `admin`), stored by its hash: the key, which is
/// never shown again, and its record.
pub fn add(store: &dyn Checkpointer, user: &str, admin: bool) -> Result<(String, ApiKey), CheckpointError> {
    if user.trim().is_empty() {
        return Err(CheckpointError::Backend("a user's name may not be empty".into()));
    }
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret)
        .map_err(|e| CheckpointError::Backend(format!("the system's random generator failed: {e}")))?;
    let key = format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    );
    let record = ApiKey {
        // Names the key in listings and `revoke` without being any part of it.
        key_id: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
        user: user.to_string(),
        admin,
        created_at: crate::clock::now(),
        revoked_at: None,
    };
    store.add_api_key(&record, &hash(&key))?;
    Ok((key, record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::UserStore;

    #[test]
    fn a_key_is_stored_by_its_hash_and_found_again() {
        let store = crate::checkpoint::memory::MemoryCheckpointer::new();
        let (key, record) = add(&store, "alice", false).unwrap();
        assert!(looks_like_key(&key), "{key}");
        assert_eq!(key.len(), PREFIX.len() + 43);
        assert_eq!(store.find_api_key(&hash(&key)).unwrap(), Some(record));
        assert_eq!(store.find_api_key(&key).unwrap(), None, "the key itself is not stored");
        let (other, _) = add(&store, "alice", false).unwrap();
        assert_ne!(key, other);
        assert!(add(&store, " ", false).is_err());
    }
}
