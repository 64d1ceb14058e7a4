//! A workflow's `serve.routes`: the HTTP endpoints of its own that `runner serve` answers,
//! each compiled into a [`Route`] the server matches and runs. Paths are checked here (shape,
//! parameters, LangGraph's own paths left alone); the expressions are compiled in the scopes
//! they are evaluated in: a request's before the run, a stream rule's with the run's event.

use super::exprs::Scope;
use super::nodes::Build;
use super::plan::{Route, RouteInput, Segment, StreamRule};
use crate::diag::Code;
use crate::spec::load::push_pointer;
use crate::spec::{RouteMethod, StreamOn};

/// The paths of LangGraph's API, runner's own additions to it (`/runner/…`) and the Studio
/// page's (`/studio/…`), which a route may not take.
pub const RESERVED: &[&str] = &[
    "threads",
    "runs",
    "assistants",
    "store",
    "ok",
    "info",
    "metrics",
    "runner",
    "studio",
];

/// Compiles the workflow's routes; a defect is reported and leaves the route out.
pub(super) fn routes(b: &mut Build) -> Vec<Route> {
    let Some(serve) = &b.wf.serve else {
        return Vec::new();
    };
    let sym = b.sym.clone();
    let request = Scope {
        request: true,
        request_only: true,
        predicates: false,
        ..Scope::base(&sym)
    };
    let mut out: Vec<Route> = Vec::new();
    for (i, spec) in serve.routes.iter().enumerate() {
        let at = format!("/serve/routes/{i}");
        let Some(segments) = segments(b, &push_pointer(&at, "path"), &spec.path) else {
            continue;
        };
        let method = spec.method.unwrap_or(RouteMethod::Post);
        if let Some(other) = out
            .iter()
            .find(|r| r.method == method && same_shape(&r.segments, &segments))
        {
            b.diags.push(
                b.src
                    .diag(
                        Code::BadRoute,
                        &push_pointer(&at, "path"),
                        format!("`{method:?} {}` is answered by an earlier route already", spec.path),
                    )
                    .help(format!("that route's path is `{}`", other.path)),
            );
            continue;
        }
        if spec.stream.is_some() && spec.respond.is_some() {
            b.diags.push(
                b.src
                    .diag(
                        Code::BadRoute,
                        &push_pointer(&at, "respond"),
                        "a route answers with `stream` or with `respond`, not both",
                    )
                    .help("`respond` is the JSON answered once the run ends; a streamed route's last events come from `on: end` rules"),
            );
            continue;
        }
        let thread = spec
            .thread
            .as_ref()
            .and_then(|t| b.expr(&push_pointer(&at, "thread"), t, request));
        let resume = spec
            .resume
            .as_ref()
            .and_then(|t| b.expr(&push_pointer(&at, "resume"), t, request));
        let input = match &spec.input {
            None => None,
            Some(crate::spec::RouteInput::Expr(text)) => {
                b.expr(&push_pointer(&at, "input"), text, request).map(RouteInput::Expr)
            }
            Some(crate::spec::RouteInput::Fields(fields)) => {
                let pointer = push_pointer(&at, "input");
                let mut compiled = Vec::new();
                for (name, text) in fields {
                    if let Some(id) = b.expr(&push_pointer(&pointer, name), text, request) {
                        compiled.push((name.clone(), id));
                    }
                }
                Some(RouteInput::Fields(compiled))
            }
        };
        let stream = spec.stream.as_ref().map(|rules| {
            let pointer = push_pointer(&at, "stream");
            rules
                .iter()
                .enumerate()
                .filter_map(|(j, rule)| stream_rule(b, &push_pointer(&pointer, &j.to_string()), rule))
                .collect()
        });
        let end = Scope {
            request: true,
            predicates: false,
            event: Some(StreamOn::End.fields()),
            ..Scope::base(&sym)
        };
        let respond = spec
            .respond
            .as_ref()
            .and_then(|t| b.expr(&push_pointer(&at, "respond"), t, end));
        let verify = match &spec.verify {
            None => None,
            Some(v) => {
                let header = v
                    .header
                    .as_deref()
                    .unwrap_or(crate::spec::SIGNATURE_HEADER)
                    .to_ascii_lowercase();
                let token = !header.is_empty()
                    && header
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c));
                if !token {
                    b.diags.push(
                        b.src
                            .diag(
                                Code::BadRoute,
                                &push_pointer(&push_pointer(&at, "verify"), "header"),
                                format!("`{header}` is not an HTTP header name"),
                            )
                            .help("e.g. `x-hub-signature-256`"),
                    );
                    continue;
                }
                if v.secret_env.trim().is_empty() {
                    b.diags.push(
                        b.src
                            .diag(
                                Code::BadRoute,
                                &push_pointer(&push_pointer(&at, "verify"), "secret_env"),
                                "`secret_env` names the environment variable that holds the secret",
                            )
                            .help("e.g. `secret_env: GITHUB_WEBHOOK_SECRET`"),
                    );
                    continue;
                }
                Some(super::plan::Verify {
                    secret_env: v.secret_env.clone(),
                    header,
                    scheme: v.scheme.unwrap_or(crate::spec::VerifyScheme::Timestamped),
                })
            }
        };
        out.push(Route {
            verify,
            path: spec.path.clone(),
            segments,
            method,
            thread,
            input,
            resume,
            stream,
            respond,
        });
    }
    out
}

fn stream_rule(b: &mut Build, at: &str, rule: &crate::spec::StreamRule) -> Option<StreamRule> {
    let sym = b.sym.clone();
    let scope = Scope {
        request: true,
        predicates: false,
        event: Some(rule.on.fields()),
        ..Scope::base(&sym)
    };
    if let Some(name) = &rule.event
        && (name.is_empty() || name.contains(['\r', '\n']))
    {
        b.diags.push(b.src.diag(
            Code::BadRoute,
            &push_pointer(at, "event"),
            "an SSE event's name is one line of text, not empty",
        ));
        return None;
    }
    let when = match &rule.when {
        Some(text) => Some(b.expr(&push_pointer(at, "when"), text, scope)?),
        None => None,
    };
    let data = b.expr(&push_pointer(at, "data"), &rule.data, scope)?;
    Some(StreamRule {
        on: rule.on,
        when,
        event: rule.event.clone(),
        data,
        subgraphs: rule.subgraphs,
    })
}

/// A path's segments: literal text, and `{name}` parameters. A malformed path is reported.
fn segments(b: &mut Build, at: &str, path: &str) -> Option<Vec<Segment>> {
    let bad = |b: &mut Build, message: String, help: &str| {
        b.diags
            .push(b.src.diag(Code::BadRoute, at, message).help(help.to_string()));
        None
    };
    let Some(rest) = path.strip_prefix('/') else {
        return bad(
            b,
            format!("a route's path starts with `/`: `{path}`"),
            "e.g. `/chat/stream`",
        );
    };
    if rest.is_empty() {
        return bad(b, "a route cannot take the root path `/`".into(), "e.g. `/chat/stream`");
    }
    let mut out = Vec::new();
    for (i, part) in rest.split('/').enumerate() {
        if part.is_empty() {
            return bad(
                b,
                format!("`{path}` has an empty segment"),
                "write each segment between two `/`",
            );
        }
        if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            let ok = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !ok {
                return bad(
                    b,
                    format!("`{{{name}}}` in `{path}` is not a parameter name"),
                    "a parameter is `{name}`: letters, digits and `_`, not starting with a digit",
                );
            }
            if out.iter().any(|s| matches!(s, Segment::Param(p) if p == name)) {
                return bad(
                    b,
                    format!("`{path}` names the parameter `{name}` twice"),
                    "give each parameter its own name",
                );
            }
            out.push(Segment::Param(name.to_string()));
            continue;
        }
        if part.contains(['{', '}', '?', '#', '%', ' ']) {
            return bad(
                b,
                format!("`{part}` in `{path}` is not a path segment"),
                "a segment is plain text (letters, digits, `-`, `_`, `.`, `~`) or a `{name}` parameter",
            );
        }
        if i == 0 && RESERVED.contains(&part) {
            return bad(
                b,
                match part {
                    "studio" => format!("`{path}` is under `/studio`, where runner serve serves the Studio page"),
                    "runner" => format!("`{path}` is under `/runner`, which runner serve answers itself"),
                    _ => format!("`{path}` is under `/{part}`, a path of LangGraph's API that runner serve answers"),
                },
                "choose a path of the application's own, e.g. `/chat/stream`",
            );
        }
        out.push(Segment::Literal(part.to_string()));
    }
    Some(out)
}

/// Two paths match the same requests: the same literals at the same places, parameters
/// anywhere else.
pub fn same_shape(a: &[Segment], b: &[Segment]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Segment::Literal(x), Segment::Literal(y)) => x == y,
            (Segment::Param(_), Segment::Param(_)) => true,
            _ => false,
        })
}
