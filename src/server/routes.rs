//! The HTTP endpoints workflows declare of their own (`serve.routes`), for a frontend that
//! speaks its own API rather than LangGraph's: a request is matched against every served
//! graph's routes, its thread, input and answer read from it by the route's expressions, and
//! the run started as a LangGraph run is (the same lease, queue, workers and rows). A streamed
//! route answers with the server-sent events its rules make of the run's events; any other
//! answers with its `respond` value once the run ends.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Json, Response};
use serde_json::{Map, Value, json};

use super::Shared;
use super::graphs::Graph;
use super::http::ApiError;
use super::hub::{self, Framer};
use super::runs::{self, Started};
use super::sse::{Frame, FrameData};
use crate::compile::Plan;
use crate::compile::plan::{ExprId, RouteInput, Segment};
use crate::engine::events::{Envelope, Event, TaskOutcome};
use crate::engine::values::{EvalError, eval_bool, eval_value, to_jinja};
use crate::engine::{EngineError, RunOutcome, Status};
use crate::spec::{RouteMethod, StreamOn};

/// Answers a request no route of LangGraph's API took: a served graph's own route, or 404.
pub(super) async fn dispatch(
    State(app): State<Shared>,
    caller: Option<axum::Extension<super::auth::Caller>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((graph, index, params)) = find(&app, &method, uri.path()) else {
        return super::http::not_found().await.into_response();
    };
    // Every request but one to an open path has its caller: a workflow's route under an open
    // path is answered only on a server that asks for no credential.
    let Some(axum::Extension(caller)) = caller else {
        return super::auth::unauthorized("Missing credentials").into_response();
    };
    match answer(app, &caller, graph, index, params, uri, headers, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// A route that matches a request: its graph, its index among the graph's routes, and the
/// path's parameters.
type Found = (Arc<Graph>, usize, Map<String, Value>);

/// The graph and route that answer `method path`, with the path's parameters: of the routes
/// that match, the one with the most literal segments (`/doc/new` before `/doc/{id}`).
fn find(app: &Shared, method: &Method, path: &str) -> Option<Found> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut best: Option<(usize, Found)> = None;
    for graph in app.graphs.all() {
        for (index, route) in graph.plan.routes().iter().enumerate() {
            if !same_method(route.method, method) || route.segments.len() != parts.len() {
                continue;
            }
            let mut params = Map::new();
            let mut literals = 0;
            let matched = route.segments.iter().zip(&parts).all(|(segment, part)| match segment {
                Segment::Literal(text) => {
                    literals += 1;
                    text == part
                }
                Segment::Param(name) => {
                    let decoded = percent_decode(part);
                    params.insert(name.clone(), Value::String(decoded));
                    !part.is_empty()
                }
            });
            if matched && best.as_ref().is_none_or(|(n, _)| literals > *n) {
                best = Some((literals, (graph.clone(), index, params)));
            }
        }
    }
    best.map(|(_, found)| found)
}

fn same_method(route: RouteMethod, method: &Method) -> bool {
    match route {
        RouteMethod::Get => method == Method::GET || method == Method::HEAD,
        RouteMethod::Post => method == Method::POST,
        RouteMethod::Put => method == Method::PUT,
        RouteMethod::Patch => method == Method::PATCH,
        RouteMethod::Delete => method == Method::DELETE,
    }
}

/// `%XX` escapes decoded (a malformed one kept as written); `+` stays a plus in a path.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A query string as a map, its values decoded (`+` is a space there); a name given twice
/// keeps its last value.
fn query_map(query: Option<&str>) -> Map<String, Value> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .map(|(name, value)| (name.into_owned(), Value::String(value.into_owned())))
        .collect()
}

/// Refuses a request to a route with `verify` whose body is not signed with the route's
/// secret (401), before anything is read from it or run.
fn signed(
    app: &Shared,
    path: &str,
    v: &crate::compile::plan::Verify,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), ApiError> {
    let Some(secret) = app.settings.env.get(&v.secret_env).filter(|s| !s.is_empty()) else {
        return Err(ApiError::internal(format!(
            "route `{path}` verifies signatures with the secret in ${}, which is not set",
            v.secret_env
        )));
    };
    let given = headers.get(v.header.as_str()).and_then(|h| h.to_str().ok());
    let now = crate::clock::now_ms().div_euclid(1000);
    super::webhook::verify(v.scheme, secret.as_bytes(), &v.header, given, body, now)
        .map_err(|e| ApiError::new(StatusCode::UNAUTHORIZED, format!("route `{path}`: {e}")))
}

/// Runs what `graph`'s route `index` says of the request, and answers as it says.
#[allow(clippy::too_many_arguments)]
async fn answer(
    app: Shared,
    caller: &super::auth::Caller,
    graph: Arc<Graph>,
    index: usize,
    params: Map<String, Value>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let route = &graph.plan.routes()[index];
    if let Some(v) = &route.verify {
        signed(&app, &route.path, v, &headers, &body)?;
    }
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("the request body is not JSON: {e}")))?
    };
    let headers: Map<String, Value> = headers
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), Value::String(v.to_str().ok()?.to_string()))))
        .collect();
    let request = json!({"body": body, "query": query_map(uri.query()), "headers": headers, "path": params});
    let plan = &graph.plan;
    let scope = to_jinja(&json!({"request": request, "config": plan.config()}));
    let thread = match eval(plan, route.thread, &scope, "thread")? {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "route `{}`: its `thread` is a string, not {other}",
                route.path
            )));
        }
    };
    let input = match &route.input {
        None => None,
        Some(RouteInput::Expr(id)) => match eval(plan, Some(*id), &scope, "input")? {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v),
            Some(other) => {
                return Err(ApiError::invalid(format!(
                    "route `{}`: its `input` is an object, not {other}",
                    route.path
                )));
            }
        },
        Some(RouteInput::Fields(fields)) => {
            let mut input = Map::new();
            for (name, id) in fields {
                // A field the request does not have is left out: the input schema's default
                // (or its refusal, if required) decides.
                if let Some(v) = eval(plan, Some(*id), &scope, name)? {
                    input.insert(name.clone(), v);
                }
            }
            Some(Value::Object(input))
        }
    };
    let resume = eval(plan, route.resume, &scope, "resume")?.filter(|v| !v.is_null());
    let mut kwargs = json!({
        "assistant_id": graph.graph_id,
        "if_not_exists": "create",
        "on_disconnect": "cancel",
    });
    if let Some(resume) = resume {
        kwargs["command"] = json!({"resume": resume});
    } else if let Some(input) = &input {
        kwargs["input"] = input.clone();
    }
    let started = runs::start(&app, caller, thread, kwargs).await?;
    let framer = RouteFramer::new(
        &app,
        graph.clone(),
        index,
        request,
        input.unwrap_or(Value::Null),
        &started,
    );
    if route.stream.is_some() {
        let guard = started.cancel_guard();
        let locations = started.locations();
        let hub = hub::feed_with(&app, started, framer);
        return Ok(hub::response(hub, 0, Some(guard), locations));
    }
    respond(framer, started).await
}

/// Evaluates a route's expression `id` (none: `None`); an expression that reads what the
/// request does not have is `None` too.
fn eval(plan: &Plan, id: Option<ExprId>, scope: &minijinja::Value, what: &str) -> Result<Option<Value>, ApiError> {
    let Some(id) = id else { return Ok(None) };
    match eval_value(plan, id, scope) {
        Ok(v) => Ok(Some(v)),
        Err(EvalError::Undefined) => Ok(None),
        Err(e) => Err(ApiError::invalid(format!(
            "`{what}` could not be read from the request: {e}"
        ))),
    }
}

/// Waits for the run and answers with the route's `respond` value (the run's output by
/// default); a run that failed is a 500 with its error.
async fn respond(mut framer: RouteFramer, started: Started) -> Result<Response, ApiError> {
    let Started {
        mut events,
        done,
        release,
        ..
    } = started;
    // Only the end counts here: the state is read once the run is over.
    while events.recv().await.is_some() {}
    let outcome = done
        .await
        .unwrap_or_else(|_| Err(EngineError::Input("the run's task ended without an outcome".into())));
    framer.load_end_state();
    drop(release);
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return Err(super::http::refused(e)),
    };
    if outcome.status == Status::Failed {
        let error = super::translate::failure(&outcome);
        return Ok((StatusCode::INTERNAL_SERVER_ERROR, Json(error)).into_response());
    }
    let route = &framer.graph.plan.routes()[framer.route];
    let value = match route.respond {
        Some(id) => {
            let scope = framer.scope(end_event(&outcome));
            eval_value(&framer.graph.plan, id, &scope)
                .map_err(|e| ApiError::internal(format!("route `{}`: its `respond` failed: {e}", route.path)))?
        }
        None => outcome.output.clone(),
    };
    Ok(Json(value).into_response())
}

/// What a stream rule at `on: end` reads as `event`.
fn end_event(o: &RunOutcome) -> Value {
    let status = match o.status {
        Status::Done => "success",
        Status::Interrupted => "interrupted",
        _ => "error",
    };
    let interrupts: Vec<Value> = o
        .interrupts
        .iter()
        .flat_map(|i| {
            let task = i.get("task_id").and_then(Value::as_str).unwrap_or_default();
            super::translate::flatten(task, i.get("payload").unwrap_or(&Value::Null))
        })
        .map(|(id, value)| json!({"id": id, "value": value}))
        .collect();
    let error = (o.status == Status::Failed).then(|| super::translate::failure(o));
    json!({"status": status, "output": o.output, "interrupts": interrupts, "error": error})
}

/// Turns a run's events into a route's SSE events, by its rules.
struct RouteFramer {
    app: Shared,
    graph: Arc<Graph>,
    route: usize,
    request: Value,
    input: Value,
    run: Value,
    thread_id: String,
    /// The state after the run's last step, as the run's own graph keeps it.
    state: Map<String, Value>,
}

impl RouteFramer {
    fn new(app: &Shared, graph: Arc<Graph>, route: usize, request: Value, input: Value, s: &Started) -> RouteFramer {
        RouteFramer {
            app: app.clone(),
            graph,
            route,
            request,
            input,
            run: json!({"run_id": s.run_id, "thread_id": s.thread_id}),
            thread_id: s.thread_id.clone(),
            state: Map::new(),
        }
    }

    /// Keeps the state up to date with the run's own graph's events.
    fn track(&mut self, envelope: &Envelope) {
        if envelope.ns.is_some() {
            return;
        }
        match &envelope.event {
            Event::RunStart { checkpoint_id, .. } => {
                if let Ok(Some(cp)) = self.app.store.get_checkpoint(&self.thread_id, Some(checkpoint_id))
                    && let Ok(state) = self.app.store.state(&self.thread_id, &cp.versions)
                {
                    self.state = state;
                }
            }
            Event::StateUpdate { values, .. } => {
                self.state.extend(values.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            _ => {}
        }
    }

    /// The state at the thread's head, once the run has ended.
    fn load_end_state(&mut self) {
        if let Ok(Some(cp)) = self.app.store.get_checkpoint(&self.thread_id, None)
            && let Ok(state) = self.app.store.state(&self.thread_id, &cp.versions)
        {
            self.state = state;
        }
    }

    fn scope(&self, event: Value) -> minijinja::Value {
        to_jinja(&json!({
            "request": self.request,
            "config": self.graph.plan.config(),
            "input": self.input,
            "context": {},
            "run": self.run,
            "state": self.state,
            "event": event,
        }))
    }

    /// The frames the route's rules for `on` make of `event` (from namespace `ns`).
    fn frames(&self, on: StreamOn, ns: Option<&str>, event: Value) -> Vec<Frame> {
        let route = &self.graph.plan.routes()[self.route];
        let rules = route.stream.as_deref().unwrap_or_default();
        let mut event = event;
        if let (Some(ns), Value::Object(m)) = (ns, &mut event) {
            m.insert("namespace".into(), Value::String(ns.to_string()));
        }
        let mut scope = None;
        let mut out = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            if rule.on != on || (ns.is_some() && !rule.subgraphs) {
                continue;
            }
            let scope = scope.get_or_insert_with(|| self.scope(event.clone()));
            let plan = &self.graph.plan;
            if let Some(when) = rule.when {
                match eval_bool(plan, when, scope) {
                    Ok(true) => {}
                    // An event without what the rule reads is not the rule's.
                    Ok(false) | Err(EvalError::UndefinedCondition) => continue,
                    Err(e) => {
                        tracing::warn!(route = %route.path, rule = i, error = %e, "a stream rule's `when` failed; the event is not sent");
                        continue;
                    }
                }
            }
            match eval_value(plan, rule.data, scope) {
                Ok(data) => out.push(Frame {
                    event: rule.event.clone(),
                    data: match data {
                        Value::String(text) => FrameData::Text(text),
                        other => FrameData::Json(other),
                    },
                }),
                Err(e) => {
                    tracing::warn!(route = %route.path, rule = i, error = %e, "a stream rule's `data` failed; the event is not sent");
                }
            }
        }
        out
    }

    fn has_rule(&self, on: StreamOn) -> bool {
        self.graph.plan.routes()[self.route]
            .stream
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|r| r.on == on)
    }
}

impl Framer for RouteFramer {
    fn start(&mut self, _run_id: &str, first: Envelope) -> Vec<Frame> {
        Framer::on(self, first)
    }

    fn on(&mut self, envelope: Envelope) -> Vec<Frame> {
        self.track(&envelope);
        let ns = envelope.ns.as_deref();
        match envelope.event {
            Event::Custom { node, event, data } => {
                self.frames(StreamOn::Custom, ns, json!({"node": node, "name": event, "data": data}))
            }
            Event::Token {
                node, message_id, text, ..
            } => self.frames(
                StreamOn::Token,
                ns,
                json!({"node": node, "text": text, "message_id": message_id}),
            ),
            Event::NodeStart { node, task_id, .. } => {
                self.frames(StreamOn::NodeStart, ns, json!({"node": node, "task_id": task_id}))
            }
            Event::NodeEnd {
                node,
                task_id,
                writes,
                outcome: TaskOutcome::Done,
                ..
            } => self.frames(
                StreamOn::NodeEnd,
                ns,
                json!({"node": node, "task_id": task_id, "writes": writes}),
            ),
            Event::Interrupt {
                node, task_id, payload, ..
            } => super::translate::flatten(&task_id, &payload)
                .into_iter()
                .flat_map(|(id, value)| {
                    self.frames(StreamOn::Interrupt, ns, json!({"node": node, "id": id, "value": value}))
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    fn finish(&mut self, outcome: &Result<RunOutcome, EngineError>) -> Vec<Frame> {
        self.load_end_state();
        let end = match outcome {
            Ok(o) => end_event(o),
            Err(e) => json!({"status": "error", "output": null, "interrupts": [],
                             "error": {"error": "EngineError", "message": e.to_string()}}),
        };
        let mut out = Vec::new();
        if let Some(error) = end.get("error").filter(|e| !e.is_null()).cloned() {
            if self.has_rule(StreamOn::Error) {
                out.extend(self.frames(StreamOn::Error, None, error));
            } else {
                // A frontend that declared nothing for a failure still learns of it.
                out.push(Frame {
                    event: Some("error".into()),
                    data: FrameData::Json(error),
                });
            }
        }
        out.extend(self.frames(StreamOn::End, None, end));
        out
    }
}
