//! A fake model server on 127.0.0.1 (a random port) for provider tests: OpenAI-compatible
//! `/v1/chat/completions` and `/v1/embeddings`, and Anthropic's `/v1/messages`. Chat replies
//! come from a script (in order; a default once it runs out): server-sent events with delays
//! between chunks, cut mid-stream, or any status, headers and body. Every request is recorded
//! so tests can check what was sent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};

use super::{Served, serve};

/// One scripted answer.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Wait this long before answering.
    pub latency: Duration,
    pub payload: Payload,
}

/// What a reply's body is.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// The whole body at once.
    Whole(String),
    /// Parts sent one by one, `gap` apart; `cut` breaks the connection after the last.
    Parts {
        parts: Vec<String>,
        gap: Duration,
        cut: bool,
    },
}

impl Reply {
    /// A JSON body with a status.
    pub(crate) fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            latency: Duration::ZERO,
            payload: Payload::Whole(body.to_string()),
        }
    }

    /// Any text body with a status.
    pub(crate) fn raw(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "text/plain".into())],
            latency: Duration::ZERO,
            payload: Payload::Whole(body.into()),
        }
    }

    /// A non-streamed chat completion.
    pub(crate) fn completion(text: &str) -> Reply {
        Reply::json(
            200,
            json!({
                "id": "chatcmpl-1", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
            }),
        )
    }

    /// An event stream of these raw SSE parts, as written.
    pub(crate) fn sse(parts: &[&str]) -> Reply {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            latency: Duration::ZERO,
            payload: Payload::Parts {
                parts: parts.iter().map(|p| p.to_string()).collect(),
                gap: Duration::ZERO,
                cut: false,
            },
        }
    }

    /// A streamed chat completion of these pieces: a role chunk, one chunk per piece, a
    /// finish chunk, a usage chunk and `[DONE]`.
    pub(crate) fn stream(pieces: &[&str]) -> Reply {
        let mut parts = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
        parts.extend(pieces.iter().map(|p| chunk(json!({"content": p}), None)));
        parts.push(chunk(json!({}), Some("stop")));
        parts.push(format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": pieces.len(), "total_tokens": 5 + pieces.len()}})
        ));
        parts.push("data: [DONE]\n\n".into());
        Reply::sse(&parts.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// A streamed Anthropic message of these pieces.
    pub(crate) fn anthropic_stream(pieces: &[&str]) -> Reply {
        let mut parts = vec![
            event(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [], "usage": {"input_tokens": 12, "output_tokens": 1}}}),
            ),
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            event("ping", json!({"type": "ping"})),
        ];
        for p in pieces {
            parts.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}),
            ));
        }
        parts.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
        parts.push(event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}),
        ));
        parts.push(event("message_stop", json!({"type": "message_stop"})));
        Reply::sse(&parts.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// This reply's parts `gap` apart.
    pub(crate) fn gap(mut self, gap: Duration) -> Reply {
        if let Payload::Parts { gap: g, .. } = &mut self.payload {
            *g = gap;
        }
        self
    }

    /// This reply after `latency`.
    pub(crate) fn after(mut self, latency: Duration) -> Reply {
        self.latency = latency;
        self
    }

    /// Only this reply's first `n` parts, then the connection breaks.
    pub(crate) fn cut_after(mut self, n: usize) -> Reply {
        if let Payload::Parts { parts, cut, .. } = &mut self.payload {
            parts.truncate(n);
            *cut = true;
        }
        self
    }

    /// Only this reply's first `n` parts, then the body ends cleanly.
    pub(crate) fn end_after(mut self, n: usize) -> Reply {
        if let Payload::Parts { parts, .. } = &mut self.payload {
            parts.truncate(n);
        }
        self
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// One OpenAI stream chunk with a delta.
pub(crate) fn chunk(delta: Value, finish: Option<&str>) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

/// One named SSE event.
pub(crate) fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// A request the server got.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
}

#[derive(Default)]
struct State {
    script: Mutex<VecDeque<Reply>>,
    default: Mutex<Option<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    /// TCP connections accepted (by a server started with [`FakeLlm::start`]).
    connections: std::sync::atomic::AtomicUsize,
    /// Streamed bodies the client stopped reading before their end: it closed the request.
    abandoned: std::sync::atomic::AtomicUsize,
}

/// Counts a streamed body as abandoned when it is dropped before its last part was sent.
struct Sending {
    state: Arc<State>,
    done: bool,
}

impl Drop for Sending {
    fn drop(&mut self) {
        if !self.done {
            self.state.abandoned.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// The running server.
pub(crate) struct FakeLlm {
    /// `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    state: Arc<State>,
    /// The server's own thread, for one started in the background.
    _served: Option<Served>,
}

impl FakeLlm {
    /// The server's routes: every path is answered by [`answer`].
    fn app(state: Arc<State>) -> axum::Router {
        axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let s = state.clone();
            async move { answer(&s, uri, headers, body).await }
        })
    }

    /// Starts a server on the current tokio runtime.
    pub(crate) async fn start() -> FakeLlm {
        let state = Arc::new(State::default());
        let app = FakeLlm::app(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counted = state.clone();
        let listener = axum::serve::ListenerExt::tap_io(listener, move |_: &mut tokio::net::TcpStream| {
            counted.connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeLlm {
            base_url: format!("http://{addr}/v1"),
            state,
            _served: None,
        }
    }

    /// Starts a server on a runtime of its own (for tests that run the engine or the binary
    /// on theirs); it stops when dropped.
    pub(crate) fn start_in_background() -> FakeLlm {
        let state = Arc::new(State::default());
        let served = serve("127.0.0.1", |_| FakeLlm::app(state.clone()));
        FakeLlm {
            base_url: format!("http://{}/v1", served.addr),
            state,
            _served: Some(served),
        }
    }

    /// Queues replies, answered in order.
    pub(crate) fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.script.lock().unwrap().extend(replies);
    }

    /// The reply once the script has run out.
    pub(crate) fn default_reply(&self, reply: Reply) {
        *self.state.default.lock().unwrap() = Some(reply);
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// The TCP connections clients opened to a server started with [`FakeLlm::start`].
    pub(crate) fn connections(&self) -> usize {
        self.state.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The streamed replies whose client closed the request before their end.
    pub(crate) fn abandoned(&self) -> usize {
        self.state.abandoned.load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn answer(state: &Arc<State>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let recorded = Recorded {
        path: uri.to_string(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
            .collect(),
        body: body.clone(),
    };
    state.requests.lock().unwrap().push(recorded);
    if uri.path().ends_with("/embeddings") {
        return respond(embeddings(&body), state);
    }
    let reply = {
        let next = state.script.lock().unwrap().pop_front();
        next.or_else(|| state.default.lock().unwrap().clone())
    };
    let Some(reply) = reply else {
        return respond(
            Reply::json(
                500,
                json!({"error": {"message": "the fake server has no reply scripted"}}),
            ),
            state,
        );
    };
    if !reply.latency.is_zero() {
        tokio::time::sleep(reply.latency).await;
    }
    respond(reply, state)
}

fn respond(reply: Reply, state: &Arc<State>) -> Response {
    let body = match reply.payload {
        Payload::Whole(text) => Body::from(text),
        Payload::Parts { parts, gap, cut } => {
            let items: VecDeque<Option<String>> = parts.into_iter().map(Some).chain(cut.then_some(None)).collect();
            let sending = Sending {
                state: state.clone(),
                done: items.is_empty(),
            };
            let stream = futures::stream::unfold((items, sending), move |(mut items, mut sending)| async move {
                let part = items.pop_front()?;
                // Before a cut, time for what was sent to reach the client: a cut stream
                // breaks off mid-way, after its headers and first parts.
                let wait = if part.is_none() {
                    gap.max(Duration::from_millis(50))
                } else {
                    gap
                };
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                // Everything scripted is out once the last part (or the cut) is.
                sending.done = items.is_empty();
                let item = match part {
                    Some(p) => Ok::<Bytes, std::io::Error>(Bytes::from(p)),
                    None => Err(std::io::Error::other("connection cut")),
                };
                Some((item, (items, sending)))
            });
            Body::from_stream(stream)
        }
    };
    let mut response = Response::builder().status(StatusCode::from_u16(reply.status).unwrap());
    for (k, v) in &reply.headers {
        response = response.header(k, v);
    }
    response.body(body).unwrap()
}

/// Embeddings: input `i` gets `[len, i, 1]`, listed in reverse order so clients must sort by
/// `index`.
fn embeddings(body: &Value) -> Reply {
    let inputs: Vec<String> = match &body["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(xs) => xs.iter().map(|x| x.as_str().unwrap_or_default().to_string()).collect(),
        _ => vec![],
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": [t.len() as f64, i as f64, 1.0]}))
        .collect();
    Reply::json(
        200,
        json!({"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": inputs.len(), "total_tokens": inputs.len()}}),
    )
}
