//! The `http` kind: one request built from the node's templates, its response parsed into
//! `output` = `{status, headers, body}`. `url`, `headers`, `query` and `form` may use
//! `${env:NAME}` in the workflow's own text: it is expanded there and only there (what a
//! template renders from data is never expanded). A header, query or form value read from the
//! environment is a secret: registered with [`crate::secrets`] so no event, state, error
//! or cassette holds it; a header holding one is never recorded, whatever its name.

use std::time::Duration;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data, render};
use crate::compile::TemplateId;
use crate::compile::kind::{Data, KindConfig, KindCx, KindDecl, Shape};
use crate::engine::kind::{Attempt, NodeKind};
use crate::error_class::ErrorClass;
use crate::net::{AllowList, FetchOptions, Oversize, Request};
use crate::secrets;
use crate::spec::interp;

/// An HTTP request.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct HttpNode {
    /// The method (default GET).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<HttpMethod>,
    /// The URL (template).
    pub url: String,
    /// Headers (templates). Secrets come only from the environment: `${env:NAME}`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<String, String>,
    /// Query parameters (templates).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub query: IndexMap<String, String>,
    /// A JSON body: an expression, or a map of expressions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// A form body (templates).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub form: IndexMap<String, String>,
    /// How the response body is parsed (default `auto`: JSON when the server says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ResponseFormat>,
    /// Largest response body accepted, in bytes (default 10 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Redirects followed (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redirects: Option<u32>,
}

/// An HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub(super) enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
    Head,
}

/// How a response body is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum ResponseFormat {
    Auto,
    Json,
    Text,
}

/// An `http` node, compiled: its fields, and the templates of its text fields.
struct Config {
    n: HttpNode,
    url: TemplateId,
    headers: Vec<(String, TemplateId)>,
    query: Vec<(String, TemplateId)>,
    form: Vec<(String, TemplateId)>,
    body: Option<Data>,
}

/// The `http` kind.
pub(super) struct Http;

impl KindDecl for Http {
    fn retries_by_default(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "http"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<HttpNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: HttpNode = cx.own()?;
        cx.check_interpolation(&["url"], &n.url);
        let url = cx.template(&["url"], &n.url);
        let mut groups: [Vec<(String, TemplateId)>; 3] = Default::default();
        let mut ok = true;
        for (i, (group, map)) in [("headers", &n.headers), ("query", &n.query), ("form", &n.form)]
            .into_iter()
            .enumerate()
        {
            for (k, text) in map {
                cx.check_interpolation(&[group, k], text);
                match cx.template(&[group, k], text) {
                    Some(id) => groups[i].push((k.clone(), id)),
                    None => ok = false,
                }
            }
        }
        let body = match &n.body {
            Some(body) => Some(cx.data(&["body"], body, None)?),
            None => None,
        };
        let [headers, query, form] = groups;
        let config = Config {
            url: url?,
            headers,
            query,
            form,
            body,
            n,
        };
        ok.then(|| (KindConfig::new(config), Shape::fields(&["status", "headers", "body"])))
    }
}

impl NodeKind for Http {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(async move { run(ctx, ctx.config::<Config>()?).await }))
    }
}

async fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let n = &config.n;
    let env = &ctx.services.env;
    let raw_url = render_env(ctx, &config.url, "/url", "url")?;
    // The variables the request's parts read, for a failure that may be their values' fault.
    let url_vars = raw_url.vars.clone();
    let mut credential_vars = Vec::new();
    let mut url = url::Url::parse(raw_url.text.trim())
        .map_err(|e| NodeError::new(ErrorClass::BadRequest, format!("url: {e}{}", read_from(env, &url_vars))))?;
    for (k, id) in &config.query {
        let v = render_env(ctx, id, &format!("/query/{k}"), &format!("query `{k}`"))?;
        credential_vars.extend(v.vars.iter().cloned());
        url.query_pairs_mut().append_pair(k, &v.secret_text());
    }
    let method = match n.method.unwrap_or(HttpMethod::Get) {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
        HttpMethod::Put => "PUT",
        HttpMethod::Patch => "PATCH",
        HttpMethod::Delete => "DELETE",
        HttpMethod::Head => "HEAD",
    };
    let mut headers = Vec::new();
    let mut secret_headers = Vec::new();
    for (k, id) in &config.headers {
        let name = k.to_ascii_lowercase();
        // A header's missing variable is a missing credential.
        let v = render_env(ctx, id, &format!("/headers/{k}"), &format!("header `{k}`")).map_err(|e| match e.class {
            ErrorClass::BadRequest => NodeError {
                class: ErrorClass::Auth,
                ..e
            },
            _ => e,
        })?;
        if !v.from_env.is_empty() {
            secret_headers.push(name.clone());
        }
        credential_vars.extend(v.vars.iter().cloned());
        headers.push((name, v.secret_text()));
    }
    let has = |headers: &[(String, String)], name: &str| headers.iter().any(|(k, _)| k == name);
    let mut body = None;
    if config.body.is_some() {
        let v = data(ctx, config.body.as_ref(), "/body", &ctx.scope)?.unwrap_or(Value::Null);
        body = Some(v.to_string().into_bytes());
        if !has(&headers, "content-type") {
            headers.push(("content-type".into(), "application/json".into()));
        }
    } else if !n.form.is_empty() {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        for (k, id) in &config.form {
            let v = render_env(ctx, id, &format!("/form/{k}"), &format!("form `{k}`"))?;
            credential_vars.extend(v.vars.iter().cloned());
            form.append_pair(k, &v.secret_text());
        }
        body = Some(form.finish().into_bytes());
        if !has(&headers, "content-type") {
            headers.push(("content-type".into(), "application/x-www-form-urlencoded".into()));
        }
    }
    let format = n.response.unwrap_or(ResponseFormat::Auto);
    if format == ResponseFormat::Json && !has(&headers, "accept") {
        headers.push(("accept".into(), "application/json".into()));
    }
    let opts = FetchOptions {
        allow: trusted_host(&n.url, env),
        timeout: ctx.timeout().unwrap_or(Duration::from_secs(60)),
        max_bytes: n.max_bytes.unwrap_or(10 * 1024 * 1024),
        oversize: Oversize::Fail,
        max_redirects: n.max_redirects.unwrap_or(5),
        accept: None,
    };
    let req = Request {
        method: method.into(),
        url: url.to_string(),
        headers,
        body,
        secret_headers,
    };
    // A refused credential names the variables it was read from; a request that could not be
    // sent, those of its URL and headers.
    let named = |e: crate::net::FetchError| {
        let mut e = NodeError::from(e);
        let vars: Vec<String> = match e.class {
            ErrorClass::Auth => credential_vars.clone(),
            ErrorClass::Network | ErrorClass::BadRequest => url_vars.iter().chain(&credential_vars).cloned().collect(),
            _ => Vec::new(),
        };
        e.message.push_str(&read_from(env, &vars));
        e
    };
    let shown_url = crate::net::redacted_url(&req.url);
    let started = std::time::Instant::now();
    let fetched = ctx.services.web.fetch(req, &opts).await;
    if ctx.events.is_on() {
        let (status, bytes, error) = match &fetched {
            Ok(r) => (Some(r.status), r.body.len() as u64, None),
            Err(e) => (None, 0, Some(crate::secrets::scrub_string(e.message.clone()))),
        };
        ctx.events.send(crate::engine::events::Event::Http {
            node: ctx.node.name.clone(),
            task_id: ctx.task_id.to_string(),
            method: method.to_string(),
            url: shown_url,
            status,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            bytes,
            error,
        });
    }
    let resp = fetched.map_err(named)?.error_for_status().map_err(named)?;
    let is_json = resp
        .content_type()
        .map(|ct| {
            let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            mime == "application/json" || mime.ends_with("+json")
        })
        .unwrap_or(false);
    let text = || String::from_utf8_lossy(&resp.body).into_owned();
    let body = match format {
        ResponseFormat::Text => Value::String(text()),
        ResponseFormat::Json => parse_json(&resp.body)?,
        ResponseFormat::Auto if is_json && !resp.body.is_empty() => parse_json(&resp.body)?,
        ResponseFormat::Auto => Value::String(text()),
    };
    let mut hmap = Map::new();
    for (k, v) in &resp.headers {
        match hmap.get_mut(k) {
            // Repeated headers are joined as HTTP allows (Set-Cookie aside, which is rare in APIs).
            Some(Value::String(old)) => {
                old.push_str(", ");
                old.push_str(v);
            }
            _ => {
                hmap.insert(k.clone(), Value::String(v.clone()));
            }
        }
    }
    Ok(NodeOutput {
        output: json!({"status": resp.status, "headers": hmap, "body": body}),
        usage: Default::default(),
    })
}

/// A field's text, and the values in it that came from the environment.
#[derive(Debug, Default)]
struct Expanded {
    text: String,
    from_env: Vec<String>,
    /// The names of the variables those values were read from.
    vars: Vec<String>,
}

/// " (it read A (from /project/.env), B)": the variables `names` with where each was set, for
/// an error their values may have caused; nothing when there are none.
fn read_from(env: &crate::engine::Env, names: &[String]) -> String {
    let mut described: Vec<String> = Vec::new();
    for name in names {
        let d = env.describe(name);
        if !described.contains(&d) {
            described.push(d);
        }
    }
    match described.is_empty() {
        true => String::new(),
        false => format!(" (it read {})", described.join(", ")),
    }
}

impl Expanded {
    /// The text, its values from the environment known as secrets from now on (a header,
    /// query or form value read from the environment is a credential whatever its name).
    fn secret_text(self) -> String {
        for value in &self.from_env {
            secrets::register(value);
        }
        self.text
    }
}

/// `${env:...}` expanded in text written in the workflow, from the run's environment.
fn expand_literal(text: &str, what: &str, env: &crate::engine::Env) -> Result<Expanded, NodeError> {
    let bad = |e: String| NodeError::new(ErrorClass::BadRequest, format!("{what}: {e}"));
    let mut out = Expanded::default();
    let mut at = 0;
    for r in interp::env_refs(text).map_err(bad)? {
        out.text.push_str(&text[at..r.range.start]);
        let (value, secret) = interp::resolve(&r, |name| env.get(name)).map_err(bad)?;
        out.text.push_str(&value);
        if secret {
            out.from_env.push(value);
            out.vars.push(r.name.to_string());
        }
        at = r.range.end;
    }
    out.text.push_str(&text[at..]);
    Ok(out)
}

/// Renders template `id` (of field `rel`) with every `${env:...}` of its source expanded, and
/// nothing it renders from data. Each reference in the source is replaced by a placeholder
/// no data can hold (it carries a fresh random nonce), the template is rendered, and then
/// the placeholders are replaced by the values.
fn render_env(ctx: &NodeCtx<'_>, id: &TemplateId, rel: &str, what: &str) -> Result<Expanded, NodeError> {
    let env = ctx.plan.exprs().env();
    let template = env
        .get_template(&id.0)
        .map_err(|e| NodeError::invalid(crate::engine::values::describe(&e)))?;
    let source = template.source();
    let bad = |e: String| NodeError::new(ErrorClass::BadRequest, format!("{what}: {e}"));
    let refs = interp::env_refs(source).map_err(bad)?;
    if refs.is_empty() {
        return Ok(Expanded {
            text: render(ctx, id, rel)?,
            ..Expanded::default()
        });
    }
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let placeholder = |i: usize| format!("\u{1}env-{nonce}-{i}\u{1}");
    let mut marked = String::with_capacity(source.len());
    let mut values = Vec::with_capacity(refs.len());
    let mut at = 0;
    for (i, r) in refs.iter().enumerate() {
        marked.push_str(&source[at..r.range.start]);
        marked.push_str(&placeholder(i));
        values.push(interp::resolve(r, |name| ctx.services.env.get(name)).map_err(bad)?);
        at = r.range.end;
    }
    marked.push_str(&source[at..]);
    let mut text = env
        .render_str(&marked, ctx.scope.clone())
        .map_err(|e| NodeError::invalid(format!("{rel}: {}", crate::engine::values::describe(&e))))?;
    let mut from_env = Vec::new();
    let mut vars = Vec::new();
    for (i, (value, secret)) in values.into_iter().enumerate() {
        text = text.replace(&placeholder(i), &value);
        if secret {
            from_env.push(value);
            vars.push(refs[i].name.to_string());
        }
    }
    Ok(Expanded { text, from_env, vars })
}

fn parse_json(body: &[u8]) -> Result<Value, NodeError> {
    serde_json::from_slice(body).map_err(|e| NodeError::invalid(format!("the response is not JSON: {e}")))
}

/// The host and port written in the workflow's URL template (its `${env:...}` expanded), when
/// no template part decides them: the author chose that server, so the guard lets it through
/// even on a private address, on that port only (a redirect to another port of the same host
/// is not trusted). A host that comes from data (`{{ state.url }}`) is not trusted.
fn trusted_host(template: &str, env: &crate::engine::Env) -> AllowList {
    let mut allow = AllowList::default();
    let Ok(expanded) = expand_literal(template.trim(), "url", env) else {
        return allow;
    };
    let Some((scheme, rest)) = expanded.text.split_once("://") else {
        return allow;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let templated = |s: &str| s.contains("{{") || s.contains("{%");
    if templated(scheme) || templated(authority) || authority.is_empty() {
        return allow;
    }
    if let Ok(u) = url::Url::parse(&format!("{scheme}://{authority}/"))
        && let Some(host) = u.host_str()
        && let Some(port) = u.port_or_known_default()
    {
        let _ = allow.add_origin(host, port);
    }
    allow
}

#[cfg(test)]
mod tests {
    use super::trusted_host as trusted;
    use crate::engine::Env;

    fn trusted_host(template: &str) -> AllowList {
        trusted(template, &Env::default())
    }
    use crate::net::AllowList;

    #[test]
    fn only_a_host_written_in_the_workflow_is_trusted_on_its_port() {
        let ip = |s: &str| s.parse().unwrap();
        let local = trusted_host("http://127.0.0.1:9000/render");
        assert!(local.for_port(9000).allows_ip(ip("127.0.0.1")));
        assert!(!local.for_port(9001).allows_ip(ip("127.0.0.1")));
        let lan = trusted_host("http://Images.Lan/v1?x={{ state.x }}");
        assert!(lan.for_port(80).allows_host("images.lan"));
        assert!(!lan.for_port(8080).allows_host("images.lan"));
        assert!(
            trusted_host("https://images.lan/v1")
                .for_port(443)
                .allows_host("images.lan")
        );
        assert_eq!(trusted_host("{{ state.url }}"), AllowList::default());
        assert_eq!(trusted_host("http://{{ state.host }}/x"), AllowList::default());
        assert!(
            trusted_host("${env:RUNNER_TEST_UNSET_HOST:-http://127.0.0.1:7860}/render")
                .for_port(7860)
                .allows_ip(ip("127.0.0.1"))
        );
    }
}
