//! A node's `cache:` policy (LangGraph's `CachePolicy`): refused where a result cannot be
//! reused (E411), its `ttl` read as a duration (E309), its `key` compiled in the node's scope,
//! and the node's fingerprint — what its behaviour depends on in the workflow — hashed, so a
//! run never reuses a result an earlier definition of the node produced.

use sha2::{Digest, Sha256};

use super::exprs::Scope;
use super::nodes::Build;
use super::plan::{NodeCache, NodeIx};
use crate::diag::Code;
use crate::spec::load::push_pointer;
use crate::spec::{CacheSpec, Duration, NodeCommon};

/// A node's policy while the plan is built: its fingerprint is made once every file the
/// workflow reads is known.
pub(super) struct DraftCache {
    pub ttl: Option<std::time::Duration>,
    pub key: Option<super::plan::ExprId>,
    /// The node's fields after its kind's defaults, as JSON text.
    pub fields: String,
}

impl Build<'_, '_> {
    /// Checks and compiles the node's `cache:` (`fields`: its fields after its kind's
    /// defaults; `scope`: what its kind's own fields read).
    pub(super) fn cache(
        &mut self,
        ix: NodeIx,
        pointer: &str,
        common: &NodeCommon,
        fields: &serde_json::Map<String, serde_json::Value>,
        scope: Scope,
    ) {
        let Some(spec) = common.cache.as_ref().and_then(|c| c.spec()) else {
            return;
        };
        let at = push_pointer(pointer, "cache");
        if self.drafts[&ix].gate {
            self.diags.push(
                self.src
                    .diag(
                        Code::BadCache,
                        &at,
                        "an interrupt node waits for a person's answer: its result cannot be cached",
                    )
                    .help("cache the nodes before or after the gate instead"),
            );
            return;
        }
        let CacheSpec { ttl, key } = spec;
        let ttl = match ttl {
            None => None,
            Some(d) => match (d.to_std(), &d) {
                (Some(t), _) => Some(t),
                // Text that is no duration was reported by the schema; a number it allows may
                // still be too large for one.
                (None, Duration::Seconds(_)) => {
                    self.diags.push(
                        self.src
                            .diag(
                                Code::BadDuration,
                                &push_pointer(&at, "ttl"),
                                "`ttl` is too long to be a duration",
                            )
                            .help("write a number of seconds, or `30s`, `10m`, `1h`, `7d`"),
                    );
                    return;
                }
                (None, Duration::Text(_)) => return,
            },
        };
        let key = match key {
            None => None,
            Some(text) => match self.expr(&push_pointer(&at, "key"), &text, scope) {
                Some(id) => Some(id),
                None => return,
            },
        };
        let fields = serde_json::Value::Object(fields.clone()).to_string();
        self.drafts[&ix].cache = Some(DraftCache { ttl, key, fields });
    }

    /// The compiled policy of a node that has one: its fingerprint hashes the workflow's
    /// shared definitions (everything but `nodes` and `edges`, the imported definitions, the
    /// state keys' schemas), the files read by this node or by nothing in particular (a
    /// tool's, the MCP lock), and the node itself: its name, its fields and its fan-out
    /// item's name. Another node's edit, or an edge's, leaves it as it was.
    pub(super) fn node_cache(&self, ix: NodeIx, draft: &DraftCache, item: Option<&str>) -> NodeCache {
        let mut h = Sha256::new();
        h.update(b"runner-node-cache-v1\0");
        if let serde_json::Value::Object(doc) = &self.src.doc.value {
            for (k, v) in doc.iter().filter(|(k, _)| *k != "nodes" && *k != "edges") {
                h.update(format!("\0{k}\0{v}").as_bytes());
            }
        }
        self.hash_defs(&mut h);
        for ((name, text), owner) in self.hashed_files.iter().zip(&self.file_owners) {
            if owner.is_none_or(|o| o == ix) {
                h.update(format!("\0{name}\0{text}").as_bytes());
            }
        }
        for schema in self.state_schemas.values() {
            h.update(schema.to_string().as_bytes());
        }
        let name = &self.drafts[&ix].name;
        h.update(format!("\0node\0{name}\0{}\0{}", draft.fields, item.unwrap_or_default()).as_bytes());
        NodeCache {
            ttl: draft.ttl,
            key: draft.key,
            fingerprint: h.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}
