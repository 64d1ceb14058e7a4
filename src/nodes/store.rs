//! `store`: long-term memory in the data store. `get` reads a key's value (null when absent)
//! or, without `key`, the whole namespace as an object; `put` stores `value`, `delete` removes
//! the key (both output null); `search` outputs the best matches in the namespace and those
//! under it, `{items: [{namespace, key, value, score}]}`: by meaning when the data store has a
//! semantic index (`--store-index`), else by keywords. A `put` may give the item a time to
//! live (`ttl`, minutes) and choose the fields its index embeds (`index`); reads start an
//! item's time to live again unless `refresh_ttl` is false, as LangGraph's store does.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::retrieve::data_error;
use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data, render, render_opt};
use crate::compile::TemplateId;
use crate::compile::kind::{Data, KindConfig, KindCx, KindDecl, Shape};
use crate::engine::kind::{Attempt, NodeKind};
use crate::rag::memory;

/// Long-term memory: JSON values by namespace and key.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct StoreNode {
    /// What to do.
    pub op: StoreOp,
    /// The namespace: a list of templates, e.g. `[memory, "{{ context.user_id }}", prefs]`.
    pub namespace: Vec<String>,
    /// The key (template); `get` without a key reads the whole namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `put`: the value (expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// `search`: the query (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// `search`: the most items returned (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// `put`: minutes the item lives after it is written, or read with a refresh (default:
    /// until it is deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub ttl: Option<f64>,
    /// `put`, with a semantic index: `false` keeps the item out of it; a list of field paths
    /// (`text`, `notes[*].body`) is embedded in place of the index's fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<StoreIndexing>,
    /// `get` and `search`: whether reading an item starts its time to live again (default
    /// true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_ttl: Option<bool>,
}

/// What a `put` embeds: `false`, or the fields to embed.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum StoreIndexing {
    /// `false`: not embedded (`true`: the index's fields).
    Enabled(bool),
    /// These field paths.
    Fields(Vec<String>),
}

impl StoreIndexing {
    fn indexing(&self) -> memory::Indexing {
        match self {
            StoreIndexing::Enabled(true) => memory::Indexing::Default,
            StoreIndexing::Enabled(false) => memory::Indexing::Off,
            StoreIndexing::Fields(f) => memory::Indexing::Fields(f.clone()),
        }
    }
}

/// A store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum StoreOp {
    Get,
    Put,
    Delete,
    Search,
}

/// A `store` node, compiled.
struct Config {
    n: StoreNode,
    namespace: Vec<TemplateId>,
    key: Option<TemplateId>,
    query: Option<TemplateId>,
    value: Option<Data>,
}

/// The `store` kind.
pub(super) struct Store;

impl KindDecl for Store {
    fn retries_by_default(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "store"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<StoreNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: StoreNode = cx.own()?;
        let mut namespace = Vec::with_capacity(n.namespace.len());
        let mut ok = true;
        for (i, part) in n.namespace.iter().enumerate() {
            match cx.template(&["namespace", &i.to_string()], part) {
                Some(id) => namespace.push(id),
                None => ok = false,
            }
        }
        let mut optional = |cx: &mut KindCx<'_, '_, '_>, field: &str, text: &Option<String>| match text {
            Some(text) => {
                let id = cx.template(&[field], text);
                ok &= id.is_some();
                id
            }
            None => None,
        };
        let key = optional(cx, "key", &n.key);
        let query = optional(cx, "query", &n.query);
        let value = match &n.value {
            Some(v) => Some(cx.data(&["value"], v, None)?),
            None => None,
        };
        let config = Config {
            n,
            namespace,
            key,
            query,
            value,
        };
        ok.then(|| (KindConfig::new(config), Shape::Any))
    }
}

impl NodeKind for Store {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let spec = &config.n;
    let mut namespace = Vec::new();
    for (i, id) in config.namespace.iter().enumerate() {
        namespace.push(render(ctx, id, &format!("/namespace/{i}"))?.trim().to_string());
    }
    memory::check_namespace(&namespace).map_err(data_error)?;
    let key = render_opt(ctx, config.key.as_ref(), "/key")?.map(|k| k.trim().to_string());
    let need_key = || {
        key.clone()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| NodeError::invalid(format!("`{}` needs a non-empty `key`", op_name(spec.op))))
    };
    let store = &ctx.services.data;
    // A served run of a user reads and writes that user's namespaces (and the shared ones).
    let ns = match store.scope() {
        Some(scope) => scope.stored(&namespace),
        None => namespace.clone(),
    };
    let refresh = spec.refresh_ttl.unwrap_or(true);
    let output = match spec.op {
        StoreOp::Get => match key {
            Some(k) => store.with(move |c| memory::get(c, &ns, &k, refresh)).await,
            None => store.with(move |c| memory::get_all(c, &ns, refresh)).await,
        }
        .map_err(data_error)?,
        StoreOp::Put => {
            let k = need_key()?;
            let value = data(ctx, config.value.as_ref(), "/value", &ctx.scope)?.unwrap_or(Value::Null);
            let indexing = spec.index.as_ref().map(StoreIndexing::indexing).unwrap_or_default();
            memory::put_indexed(store, ns, k, value, spec.ttl, &indexing)
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
            let query = render_opt(ctx, config.query.as_ref(), "/query")?;
            let limit = spec.limit.unwrap_or(10) as usize;
            let items = match (store.memory_index(), query) {
                (Some(_), Some(q)) if !q.trim().is_empty() => {
                    let q = memory::ItemQuery {
                        prefix: ns,
                        query: Some(q),
                        limit,
                        refresh,
                        ..Default::default()
                    };
                    let mut items = memory::search_items(store, q).await.map_err(data_error)?;
                    // The node's items have the same fields whichever way they were found.
                    for item in &mut items {
                        if let Some(m) = item.as_object_mut() {
                            m.remove("created_at");
                            m.remove("updated_at");
                        }
                    }
                    items
                }
                (_, query) => store
                    .with(move |c| memory::search(c, &ns, query.as_deref(), limit, refresh))
                    .await
                    .map_err(data_error)?,
            };
            let items: Vec<Value> = match store.scope() {
                Some(scope) => items.into_iter().filter_map(|i| scope.shown_item(i)).collect(),
                None => items,
            };
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
