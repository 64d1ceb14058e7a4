//! `POST /runs/batch`: several stateless runs started in the background at once, each on a
//! thread of its own, answered with their records as `POST /runs` answers one.

use axum::Extension;
use axum::extract::State;
use axum::response::Json;
use serde_json::Value;

use super::Shared;
use super::control::background;
use super::http::{ApiError, JsonBody};
use super::manager::RunCreate;
use super::runs::run_json;

/// Every request is read before any run starts, so a malformed one starts none; a run refused
/// once the others started (an unknown assistant, say) fails the request, and the runs already
/// started go on, as the reference's do.
pub(super) async fn batch(
    State(app): State<Shared>,
    Extension(caller): Extension<super::auth::Caller>,
    JsonBody(requests): JsonBody<Vec<Value>>,
) -> Result<Json<Value>, ApiError> {
    for req in &requests {
        RunCreate::parse(req)?;
    }
    let mut runs = Vec::with_capacity(requests.len());
    for kwargs in requests {
        runs.push(run_json(&background(&app, &caller, None, kwargs).await?));
    }
    Ok(Json(Value::Array(runs)))
}
