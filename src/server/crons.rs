//! The cron endpoints of the LangGraph API: `POST /runs/crons`, `POST /threads/{id}/runs/crons`,
//! `POST /runs/crons/search`, `POST /runs/crons/count` and `GET`/`PATCH`/`DELETE
//! /runs/crons/{cron_id}`. Thin: they read the request, call the cron service
//! ([`super::cron`]) with the server's clock, and answer.

use axum::Extension;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use serde_json::{Map, Value, json};

use super::Shared;
use super::auth::{Caller, owner};
use super::cron::{self, CronError};
use super::http::{ApiError, JsonBody};

impl From<CronError> for ApiError {
    fn from(e: CronError) -> Self {
        match e {
            CronError::Invalid(m) => ApiError::invalid(m),
            CronError::NotFound(m) => ApiError::not_found(m),
            CronError::Empty(m) => ApiError::new(StatusCode::BAD_REQUEST, m),
            CronError::Store(e) => e.into(),
        }
    }
}

/// The scheduler's now: what a new cron's first tick follows.
fn now(app: &Shared) -> Result<i64, ApiError> {
    app.triggers
        .clock
        .now_ms()
        .ok_or_else(|| ApiError::internal("the server's clock cannot be read"))
}

fn object(body: &Value) -> Map<String, Value> {
    body.as_object().cloned().unwrap_or_default()
}

/// `POST /runs/crons`: a cron whose every run has a thread of its own.
pub(super) async fn create_stateless(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Value>, ApiError> {
    let row = cron::create(&app.graphs, &*app.store, now(&app)?, None, body, caller.user.clone())?;
    Ok(Json(cron::cron_json(&row)))
}

/// `POST /threads/{id}/runs/crons`: a cron whose runs continue the thread.
pub(super) async fn create_on_thread(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(thread_id): UrlPath<String>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Value>, ApiError> {
    owner::thread_if_exists(&app, &caller, &thread_id)?;
    let row = cron::create(
        &app.graphs,
        &*app.store,
        now(&app)?,
        Some(&thread_id),
        body,
        caller.user.clone(),
    )?;
    Ok(Json(cron::cron_json(&row)))
}

/// Cron `cron_id`, if the caller sees it: another user's answers as a missing one does.
fn visible(app: &Shared, caller: &Caller, cron_id: &str) -> Result<crate::checkpoint::CronRow, ApiError> {
    let row = cron::get(&*app.store, cron_id)?;
    if caller.admin || (row.owner.is_some() && row.owner == caller.user) {
        Ok(row)
    } else {
        Err(ApiError::not_found(format!("Cron '{cron_id}' not found")))
    }
}

/// The user whose crons alone the caller sees (none: an admin sees every cron).
fn only_of(caller: &Caller) -> Option<&str> {
    caller.restricted().then(|| caller.user.as_deref().unwrap_or_default())
}

pub(super) async fn get(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(cron_id): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(cron::cron_json(&visible(&app, &caller, &cron_id)?)))
}

pub(super) async fn patch(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(cron_id): UrlPath<String>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Value>, ApiError> {
    visible(&app, &caller, &cron_id)?;
    let row = cron::update(&app.graphs, &*app.store, now(&app)?, &cron_id, body)?;
    Ok(Json(cron::cron_json(&row)))
}

pub(super) async fn delete(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    UrlPath(cron_id): UrlPath<String>,
) -> Result<StatusCode, ApiError> {
    visible(&app, &caller, &cron_id)?;
    cron::delete(&*app.store, &cron_id)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /runs/crons/search`: a page of crons, with the reference's pagination headers.
pub(super) async fn search(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let body = object(&body);
    let offset = body.get("offset").and_then(Value::as_u64).unwrap_or(0);
    let page = cron::search(&*app.store, &body, only_of(&caller))?;
    let shown = page.crons.len() as u64;
    let mut response = Json(Value::Array(page.crons)).into_response();
    let headers = response.headers_mut();
    match page.next {
        Some(next) => {
            for (name, value) in [("x-pagination-total", next + 1), ("x-pagination-next", next)] {
                if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
                    headers.insert(name, v);
                }
            }
        }
        None => {
            if let Ok(v) = HeaderValue::from_str(&(shown + offset).to_string()) {
                headers.insert("x-pagination-total", v);
            }
        }
    }
    Ok(response)
}

/// `POST /runs/crons/count`.
pub(super) async fn count(
    State(app): State<Shared>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(cron::count(&*app.store, &object(&body), only_of(&caller))?)))
}
