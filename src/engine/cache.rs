//! Node caching (LangGraph's `CachePolicy`): before a task of a node with `cache:` runs, its
//! key is looked up in the checkpointer's cache; a hit is the task's result without running
//! the node (stored as the task's result, as any finished task's is, so a crash after it runs
//! nothing), and a miss runs the node and keeps a successful result under the key.
//!
//! The key is a SHA-256 over the node's fingerprint (its definition and what it depends on in
//! the workflow, hashed by the compiler), the model profiles as this run reaches them (a
//! `--model` override changes what a node would answer), and either the value of the node's
//! `key:` expression or, by default, everything the node reads: the state at the start of the
//! step, `input`, `config`, `context` and its fan-out item. `run` (thread, step) is left out,
//! or no other thread could ever hit.
//!
//! What is kept is the task's writes and chosen successors, never its usage (a hit spends
//! nothing), and only for a task that succeeded: not a failure, not an `on_error` handler's
//! result, not an interrupt, and nothing of a task that resumed with a person's answer.
//!
//! The cache is best effort: a store that cannot be read or written is logged and the node
//! runs, as it would without a cache.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::apply::{decode, encode};
use super::events::Event;
use super::kind::NodeError;
use super::step::StepResult;
use super::task::task_scope;
use super::values::{self, Scope};
use super::{DONE, Engine, EngineError, IDX_DONE, Run};
use crate::checkpoint::{CacheEntry, PendingWrite, TaskSpec};
use crate::compile::NodeIx;

/// Where a missed task's result is to be kept.
pub(super) struct Key {
    node: String,
    key: String,
    ttl: Option<std::time::Duration>,
}

/// What every cached task of a step hashes alike, made when the first one needs it.
#[derive(Default)]
pub(super) struct StepDigests {
    /// The model profiles as the run reaches them.
    models: Option<Vec<u8>>,
    /// The state, input, config and context the step's tasks read.
    reads: Option<Vec<u8>>,
}

impl Engine {
    /// Looks task `t` (of node `ix`, in step `step` over `base`) up in its node's cache. A hit
    /// is stored as the task's result, reported, and returned; a miss leaves in `key` where
    /// the result is to be kept (see [`Engine::cache_keep`]). A task that resumes with an
    /// answer is not looked up. A key expression that fails fails the task.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn cache_lookup(
        &self,
        run: &Run,
        base: &Arc<Scope>,
        step: i64,
        t: &TaskSpec,
        ix: NodeIx,
        resumes: bool,
        digests: &mut StepDigests,
        key: &mut Option<Key>,
    ) -> Result<Option<StepResult>, EngineError> {
        let node = &self.plan.nodes()[&ix];
        let Some(policy) = node.cache.as_ref().filter(|_| !resumes) else {
            return Ok(None);
        };
        let started = Instant::now();
        let mut h = Sha256::new();
        h.update(b"runner-cache-key-v1\0");
        h.update(policy.fingerprint.as_bytes());
        h.update(digests.models.get_or_insert_with(|| self.models_digest()));
        match policy.key {
            Some(id) => {
                let scope = task_scope(&run.shared, node, t.item.as_ref(), base, step);
                match values::eval(&self.plan, id, &scope.value()) {
                    Ok(value) => {
                        h.update(b"\0key\0");
                        hash_value(&mut h, &value);
                    }
                    Err(e) => {
                        let e = NodeError::invalid(format!("the cache key of `{}`: {e}", node.name));
                        return Ok(Some(StepResult::Failed(e)));
                    }
                }
            }
            None => {
                h.update(b"\0reads\0");
                h.update(digests.reads.get_or_insert_with(|| reads_digest(self, run)));
                hash_value(&mut h, t.item.as_ref().unwrap_or(&Value::Null));
            }
        }
        let found = Key {
            node: node.name.clone(),
            key: h.finalize().iter().map(|b| format!("{b:02x}")).collect(),
            ttl: policy.ttl,
        };
        let now = crate::clock::now_ms();
        let stored = match self.store.cache_get(self.plan.name(), &found.node, &found.key, now) {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(node = %found.node, error = %e, "the node cache could not be read; the node runs");
                None
            }
        };
        let Some(value) = stored else {
            *key = Some(found);
            return Ok(None);
        };
        let record = PendingWrite {
            task_id: t.task_id.clone(),
            idx: IDX_DONE,
            channel: DONE.into(),
            value,
        };
        // An entry holds no usage (see `cache_keep`): the hit's is zero.
        let done = match decode(&record, &self.plan, false) {
            Ok(done) => done,
            Err(e) => {
                // The node's fingerprint names every successor it can choose; a record that
                // does not fit is not this node's to reuse.
                tracing::warn!(node = %found.node, error = %e, "a cached result does not fit the node; the node runs");
                *key = Some(found);
                return Ok(None);
            }
        };
        let event = Event::NodeEnd {
            step,
            node: t.node.clone(),
            task_id: t.task_id.clone(),
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            keys: done.writes.iter().map(|(k, _)| k.clone()).collect(),
            writes: done.writes.iter().cloned().collect(),
            cached: false,
            outcome: super::events::TaskOutcome::Done,
            cache_hit: true,
        };
        let writes = encode(&t.task_id, &done, &self.plan);
        run.persister
            .put_writes(&run.shared.thread_id, &run.cp.checkpoint_id, writes, vec![event])?;
        Ok(Some(StepResult::Done(done)))
    }

    /// Keeps a missed task's result under its key: only a result the node produced itself
    /// (not a failure, an interrupt, or what its `on_error` handler made of a failure).
    pub(super) fn cache_keep(&self, key: Option<Key>, t: &TaskSpec, result: &StepResult) {
        let (Some(key), StepResult::Done(done)) = (key, result) else {
            return;
        };
        // `handled`: its `on_error` handler's result, or a subgraph's handoff, whose child
        // thread holds what led to it.
        if done.handled {
            return;
        }
        let Some(mut value) = encode(&t.task_id, done, &self.plan).pop().map(|w| w.value) else {
            return;
        };
        // A hit spends nothing: what the run that made the result spent stays with it.
        if let Value::Object(m) = &mut value {
            m.remove("usage");
        }
        let now = crate::clock::now_ms();
        let entry = CacheEntry {
            workflow: self.plan.name().to_string(),
            node: key.node,
            key: key.key,
            value,
            created_at: crate::clock::at_ms(now),
            expires_at_ms: key.ttl.map(|ttl| crate::checkpoint::expiry_ms(now, ttl)),
        };
        if let Err(e) = tokio::task::block_in_place(|| self.store.cache_put(&entry, now)) {
            tracing::warn!(node = %entry.node, error = %e, "a result could not be cached");
        }
    }

    /// The run's model profiles as its providers reach them, hashed.
    fn models_digest(&self) -> Vec<u8> {
        let mut h = Sha256::new();
        for name in self.plan.models().keys() {
            h.update(format!("\0{name}\0").as_bytes());
            if let Some((_, profile)) = self.services.providers.get(name) {
                hash_value(&mut h, &serde_json::to_value(profile).unwrap_or_default());
            }
        }
        h.finalize().to_vec()
    }
}

/// What the step's tasks read besides their items, hashed.
fn reads_digest(engine: &Engine, run: &Run) -> Vec<u8> {
    let input = run.meta.input.as_ref().unwrap_or(&run.thread.input);
    let config = super::thread::effective_config(engine.plan.config(), &run.thread.config);
    let mut h = Sha256::new();
    h.update(b"\0state\0");
    hash_object(&mut h, &run.state);
    for (name, value) in [("input", input), ("config", &config), ("context", &run.thread.context)] {
        h.update(format!("\0{name}\0").as_bytes());
        hash_value(&mut h, value);
    }
    h.finalize().to_vec()
}

/// Hashes `v` so that equal values hash alike whatever order their objects' keys are in
/// (state is kept in insertion order, which differs between threads).
fn hash_value(h: &mut Sha256, v: &Value) {
    match v {
        Value::Null => h.update(b"n"),
        Value::Bool(b) => h.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            let text = n.to_string();
            h.update(b"#");
            len(h, text.len());
            h.update(text.as_bytes());
        }
        Value::String(s) => {
            h.update(b"s");
            len(h, s.len());
            h.update(s.as_bytes());
        }
        Value::Array(items) => {
            h.update(b"[");
            len(h, items.len());
            items.iter().for_each(|i| hash_value(h, i));
        }
        Value::Object(m) => hash_object(h, m),
    }
}

fn hash_object(h: &mut Sha256, m: &serde_json::Map<String, Value>) {
    h.update(b"{");
    len(h, m.len());
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    for k in keys {
        len(h, k.len());
        h.update(k.as_bytes());
        hash_value(h, &m[k]);
    }
}

/// A length, so that adjacent strings and lists cannot run into each other.
fn len(h: &mut Sha256, n: usize) {
    h.update((n as u64).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn digest(v: &Value) -> Vec<u8> {
        let mut h = Sha256::new();
        hash_value(&mut h, v);
        h.finalize().to_vec()
    }

    #[test]
    fn values_hash_alike_whatever_the_order_of_their_keys_and_apart_otherwise() {
        let a = json!({"x": 1, "y": {"b": [1, "2"], "a": null}});
        let b: Value = serde_json::from_str(r#"{"y": {"a": null, "b": [1, "2"]}, "x": 1}"#).unwrap();
        assert_eq!(digest(&a), digest(&b));
        // Shapes that would collide if strings and lengths were not delimited.
        for (one, other) in [
            (json!(["ab", "c"]), json!(["a", "bc"])),
            (json!({"a": "b"}), json!({"ab": ""})),
            (json!("1"), json!(1)),
            (json!([]), json!({})),
            (json!(null), json!("n")),
        ] {
            assert_ne!(digest(&one), digest(&other), "{one} and {other}");
        }
    }
}
