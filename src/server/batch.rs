//! `POST /runs/batch`: several stateless runs started in the background at once, each on a
//! thread of its own, answered with their records as `POST /runs` answers one.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Json;
use serde_json::Value;

use super::Shared;
use super::http::{ApiError, body};
use super::runs::{RunCreate, start};
use super::threads::lock;

/// Every request is read before any run starts, so a malformed one starts none; a run refused
/// once the others started (an unknown assistant, say) fails the request, and the runs already
/// started go on, as the reference's do.
pub(super) async fn batch(State(app): State<Shared>, bytes: Bytes) -> Result<Json<Value>, ApiError> {
    let requests: Vec<RunCreate> = body(&bytes)?;
    let mut runs = Vec::with_capacity(requests.len());
    for mut req in requests {
        // Nobody is connected to go away: a background run always goes on.
        req.on_disconnect = Some("continue".into());
        let started = start(&app, None, req).await?;
        let run_id = started.run_id.clone();
        // Nobody reads it now; a client may join it.
        super::hub::feed(&app, started);
        if let Some(r) = lock(&app.runs).get(&run_id) {
            runs.push(r.json());
        }
    }
    Ok(Json(Value::Array(runs)))
}
