//! `store`: long-term memory in the data store. `get` reads a key's value (null when absent)
//! or, without `key`, the whole namespace as an object; `put` stores `value`, `delete` removes
//! the key (both output null); `search` outputs the best keyword matches in the namespace and
//! those under it, `{items: [{namespace, key, value, score}]}`.

use serde_json::{Value, json};

use super::retrieve::data_error;
use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data, render};
use crate::engine::kind::{Attempt, NodeKind};
use crate::rag::memory;
use crate::spec::{NodeSpec, StoreOp};

pub async fn run(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    let NodeSpec::Store(n) = &ctx.node.spec else {
        unreachable!("dispatched on kind")
    };
    let spec = &n.kind;
    let mut namespace = Vec::new();
    for i in 0..spec.namespace.len() {
        namespace.push(
            render(ctx, &format!("/namespace/{i}"))?
                .unwrap_or_default()
                .trim()
                .to_string(),
        );
    }
    memory::check_namespace(&namespace).map_err(data_error)?;
    let key = render(ctx, "/key")?.map(|k| k.trim().to_string());
    let need_key = || {
        key.clone()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| NodeError::invalid(format!("`{}` needs a non-empty `key`", op_name(spec.op))))
    };
    let store = &ctx.services.data;
    let ns = namespace.clone();
    let output = match spec.op {
        StoreOp::Get => match key {
            Some(k) => store.with(move |c| memory::get(c, &ns, &k)).await,
            None => store.with(move |c| memory::get_all(c, &ns)).await,
        }
        .map_err(data_error)?,
        StoreOp::Put => {
            let k = need_key()?;
            let value = data(ctx, "/value", &ctx.scope)?.unwrap_or(Value::Null);
            store
                .with(move |c| memory::put(c, &ns, &k, &value))
                .await
                .map_err(data_error)?;
            Value::Null
        }
        StoreOp::Delete => {
            let k = need_key()?;
            store
                .with(move |c| memory::delete(c, &ns, &k))
                .await
                .map_err(data_error)?;
            Value::Null
        }
        StoreOp::Search => {
            let query = render(ctx, "/query")?;
            let limit = spec.limit.unwrap_or(10) as usize;
            let items = store
                .with(move |c| memory::search(c, &ns, query.as_deref(), limit))
                .await
                .map_err(data_error)?;
            json!({"items": items})
        }
    };
    Ok(NodeOutput {
        output,
        ..Default::default()
    })
}

fn op_name(op: StoreOp) -> &'static str {
    match op {
        StoreOp::Get => "get",
        StoreOp::Put => "put",
        StoreOp::Delete => "delete",
        StoreOp::Search => "search",
    }
}

/// The `store` kind.
pub struct Store;

impl NodeKind for Store {
    fn name(&self) -> &'static str {
        "store"
    }

    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(run(ctx)))
    }

    fn retries_by_default(&self) -> bool {
        true
    }
}
