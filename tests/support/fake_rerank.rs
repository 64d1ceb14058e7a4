//! A fake `/rerank` endpoint (Cohere/Jina style) on 127.0.0.1: a document scores 1 for each
//! time it contains the favoured word, 0 otherwise. It records every request body.

use std::sync::{Arc, Mutex};

use axum::{Json, Router, extract::State, routing::post};
use serde_json::{Value, json};

use super::{Served, serve};

pub(crate) struct FakeRerank {
    pub url: String,
    pub requests: Arc<Mutex<Vec<Value>>>,
    _served: Served,
}

#[derive(Clone)]
struct Shared {
    favour: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

async fn rerank(State(s): State<Shared>, Json(body): Json<Value>) -> Json<Value> {
    s.requests.lock().unwrap().push(body.clone());
    let docs = body["documents"].as_array().cloned().unwrap_or_default();
    let results: Vec<Value> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let text = d.as_str().unwrap_or("").to_lowercase();
            json!({"index": i, "relevance_score": text.matches(&s.favour).count() as f64})
        })
        .collect();
    Json(json!({"results": results}))
}

/// Starts the server on its own thread; it stops when dropped.
pub(crate) fn start(favour: &str) -> FakeRerank {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let shared = Shared {
        favour: favour.to_lowercase(),
        requests: requests.clone(),
    };
    let served = serve("127.0.0.1", |_| {
        Router::new().route("/rerank", post(rerank)).with_state(shared)
    });
    FakeRerank {
        url: format!("http://{}/rerank", served.addr),
        requests,
        _served: served,
    }
}
