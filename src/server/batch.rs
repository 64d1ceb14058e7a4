//! `POST /runs/batch`: several stateless runs started in the background at once, each on a
//! thread of its own, answered with their records as `POST /runs` answers one.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Json;
use serde_json::{Value, json};

use super::Shared;
use super::control::stored;
use super::http::{ApiError, body};
use super::runs::{RunCreate, run_json, start};

/// Every request is read before any run starts, so a malformed one starts none; a run refused
/// once the others started (an unknown assistant, say) fails the request, and the runs already
/// started go on, as the reference's do.
pub(super) async fn batch(State(app): State<Shared>, bytes: Bytes) -> Result<Json<Value>, ApiError> {
    let requests: Vec<Value> = body(&bytes)?;
    for req in &requests {
        serde_json::from_value::<RunCreate>(req.clone())
            .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))?;
    }
    let mut runs = Vec::with_capacity(requests.len());
    for mut kwargs in requests {
        // Nobody is connected to go away: a background run always goes on.
        if let Value::Object(k) = &mut kwargs {
            k.insert("on_disconnect".into(), json!("continue"));
        }
        let started = start(&app, None, kwargs).await?;
        let (thread_id, run_id) = (started.thread_id.clone(), started.run_id.clone());
        // Nobody reads it now; a client may join it.
        super::hub::feed(&app, started);
        runs.push(run_json(&stored(&app, &thread_id, &run_id)?));
    }
    Ok(Json(Value::Array(runs)))
}
