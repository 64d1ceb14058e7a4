//! The `http` kind: one request built from the node's templates, its response parsed into
//! `output` = `{status, headers, body}`. Header values may carry `${env:NAME}` secrets: they are
//! expanded after the template is rendered and never reach events, state or error messages.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data, render};
use crate::net::{AllowList, FetchOptions, Oversize, Request};
use crate::spec::{ErrorClass, HttpMethod, HttpNode, ResponseFormat};

pub async fn run(ctx: &NodeCtx<'_>, n: &HttpNode) -> Result<NodeOutput, NodeFailure> {
    let raw_url = render(ctx, "/url")?.unwrap_or_else(|| n.url.clone());
    let mut url =
        url::Url::parse(raw_url.trim()).map_err(|e| NodeError::new(ErrorClass::BadRequest, format!("url: {e}")))?;
    for k in n.query.keys() {
        let v = render(ctx, &format!("/query/{k}"))?.unwrap_or_default();
        url.query_pairs_mut().append_pair(k, &v);
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
    for k in n.headers.keys() {
        let v = render(ctx, &format!("/headers/{k}"))?.unwrap_or_default();
        let v = crate::spec::interp::expand_process_env(&v)
            .map_err(|e| NodeError::new(ErrorClass::Auth, format!("header `{k}`: {e}")))?;
        headers.push((k.to_ascii_lowercase(), v));
    }
    let has = |headers: &[(String, String)], name: &str| headers.iter().any(|(k, _)| k == name);
    let mut body = None;
    if n.body.is_some() {
        let v = data(ctx, "/body", &ctx.scope)?.unwrap_or(Value::Null);
        body = Some(v.to_string().into_bytes());
        if !has(&headers, "content-type") {
            headers.push(("content-type".into(), "application/json".into()));
        }
    } else if !n.form.is_empty() {
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        for k in n.form.keys() {
            let v = render(ctx, &format!("/form/{k}"))?.unwrap_or_default();
            form.append_pair(k, &v);
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
        allow: trusted_host(&n.url),
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
    };
    let resp = ctx
        .services
        .web
        .fetch(req, &opts)
        .await
        .map_err(NodeError::from)?
        .error_for_status()
        .map_err(NodeError::from)?;
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

fn parse_json(body: &[u8]) -> Result<Value, NodeError> {
    serde_json::from_slice(body).map_err(|e| NodeError::invalid(format!("the response is not JSON: {e}")))
}

/// The host written in the workflow's URL template, when no template part decides it: the
/// author chose that server, so the guard lets it through even on a private address.
/// A host that comes from data (`{{ state.url }}`) is not trusted.
fn trusted_host(template: &str) -> AllowList {
    let mut allow = AllowList::default();
    let Some((_, rest)) = template.trim().split_once("://") else {
        return allow;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains("{{") || authority.contains("{%") || authority.is_empty() {
        return allow;
    }
    let Ok(authority) = crate::spec::interp::expand_process_env(authority) else {
        return allow;
    };
    if let Ok(u) = url::Url::parse(&format!("http://{authority}/"))
        && let Some(host) = u.host_str()
    {
        let _ = allow.add(host);
    }
    allow
}

#[cfg(test)]
mod tests {
    use super::trusted_host;
    use crate::net::AllowList;

    #[test]
    fn only_a_host_written_in_the_workflow_is_trusted() {
        let ip = |s: &str| s.parse().unwrap();
        assert!(trusted_host("http://127.0.0.1:9000/render").allows_ip(ip("127.0.0.1")));
        assert!(trusted_host("http://Images.Lan/v1?x={{ state.x }}").allows_host("images.lan"));
        assert_eq!(trusted_host("{{ state.url }}"), AllowList::default());
        assert_eq!(trusted_host("http://{{ state.host }}/x"), AllowList::default());
    }
}
