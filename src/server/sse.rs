//! The event stream of a run as the LangGraph API frames it: `event: NAME`, `data: JSON` and a
//! blank line, every line ended by CRLF; and the stream modes a client may ask for (what each
//! sends is `translate/`'s).

use axum::body::Bytes;
use serde_json::Value;

/// One event of a stream, before it is framed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Frame {
    /// Its `event:` line; none for an event without a name.
    pub event: Option<String>,
    pub data: FrameData,
}

/// What an event's `data:` lines hold.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FrameData {
    /// Compact JSON, on one line.
    Json(Value),
    /// Text as it is, one `data:` line per line of it.
    Text(String),
}

impl From<(String, Value)> for Frame {
    fn from((event, data): (String, Value)) -> Frame {
        Frame {
            event: Some(event),
            data: FrameData::Json(data),
        }
    }
}

impl Frame {
    /// The event framed, with its `id` when it has one.
    pub(crate) fn bytes(&self, id: Option<usize>) -> Bytes {
        match (&self.event, &self.data) {
            (Some(event), FrameData::Json(data)) => frame(event, data, id),
            (event, data) => {
                let mut out = Vec::with_capacity(64);
                if let Some(event) = event {
                    out.extend_from_slice(format!("event: {event}\r\n").as_bytes());
                }
                let text = match data {
                    FrameData::Json(v) => serde_json::to_string(v).unwrap_or_default(),
                    FrameData::Text(t) => t.clone(),
                };
                // A line break inside the data is a new `data:` line; a reader joins them
                // with `\n` again.
                for line in text.split('\n') {
                    out.extend_from_slice(b"data: ");
                    out.extend_from_slice(line.strip_suffix('\r').unwrap_or(line).as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
                if let Some(id) = id {
                    out.extend_from_slice(format!("id: {id}\r\n").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                Bytes::from(out)
            }
        }
    }
}

/// One event, framed; `id` (for runs a client may rejoin) comes after the data, as the
/// reference server frames it.
pub(crate) fn frame(event: &str, data: &Value, id: Option<usize>) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\r\ndata: ");
    // A `Value` always serialises; compact JSON has no line breaks, so one `data:` line holds it.
    out.extend_from_slice(serde_json::to_string(data).unwrap_or_default().as_bytes());
    if let Some(id) = id {
        out.extend_from_slice(format!("\r\nid: {id}").as_bytes());
    }
    out.extend_from_slice(b"\r\n\r\n");
    Bytes::from(out)
}

/// The stream modes the reference server takes; `tools` and `lifecycle`, which newer
/// LangGraph libraries name, are refused as the reference server refuses them.
const KNOWN: &[&str] = &[
    "values",
    "updates",
    "custom",
    "messages",
    "messages-tuple",
    "tasks",
    "checkpoints",
    "debug",
    "events",
];

/// Which events a client asked for.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Modes {
    pub values: bool,
    pub updates: bool,
    pub custom: bool,
    /// `messages-tuple`: streamed model tokens as `messages` events.
    pub messages: bool,
    /// The legacy `messages`: `messages/metadata` once per message, then `messages/partial`
    /// with the message so far.
    pub partial: bool,
    /// Each task's start and result.
    pub tasks: bool,
    /// Each checkpoint as `{config, parent_config, values, metadata, next, tasks}`.
    pub checkpoints: bool,
    /// Checkpoints, task starts and task results wrapped as `{step, timestamp, type, payload}`.
    pub debug: bool,
    /// LangChain's callback events (`astream_events` v2): chains, model calls, tool calls.
    pub events: bool,
    /// Events from inside subgraphs too, namespaced.
    pub subgraphs: bool,
}

impl Modes {
    /// `stream_mode` as sent: a name or a list of names; absent means `values`.
    pub(super) fn parse(stream_mode: Option<&Value>, subgraphs: bool) -> Result<Modes, String> {
        let names: Vec<&str> = match stream_mode {
            None | Some(Value::Null) => vec!["values"],
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().ok_or_else(|| format!("stream_mode holds {i}, not a name")))
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(format!("stream_mode must be a name or a list of names, not {other}")),
        };
        let mut modes = Modes {
            subgraphs,
            ..Modes::default()
        };
        for name in names {
            match name {
                "values" => modes.values = true,
                "updates" => modes.updates = true,
                "custom" => modes.custom = true,
                "messages-tuple" => modes.messages = true,
                "messages" => modes.partial = true,
                "tasks" => modes.tasks = true,
                "checkpoints" => modes.checkpoints = true,
                "debug" => modes.debug = true,
                "events" => modes.events = true,
                n if KNOWN.contains(&n) => {}
                n => return Err(format!("unknown stream_mode `{n}`; known: {}", KNOWN.join(", "))),
            }
        }
        Ok(modes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_frames_keep_their_text_and_split_lines() {
        let f = Frame {
            event: None,
            data: FrameData::Text("Hel\nlo".into()),
        };
        assert_eq!(&f.bytes(None)[..], b"data: Hel\r\ndata: lo\r\n\r\n");
        let f = Frame {
            event: Some("token".into()),
            data: FrameData::Text(" world".into()),
        };
        assert_eq!(&f.bytes(Some(3))[..], b"event: token\r\ndata:  world\r\nid: 3\r\n\r\n");
        let f = Frame {
            event: None,
            data: FrameData::Json(json!({"a": 1})),
        };
        assert_eq!(&f.bytes(None)[..], b"data: {\"a\":1}\r\n\r\n");
    }

    #[test]
    fn frames_end_every_line_with_crlf() {
        let f = frame("values", &json!({"a": "x\ny"}), None);
        assert_eq!(&f[..], b"event: values\r\ndata: {\"a\":\"x\\ny\"}\r\n\r\n");
        let f = frame("values", &json!(1), Some(7));
        assert_eq!(&f[..], b"event: values\r\ndata: 1\r\nid: 7\r\n\r\n");
    }

    #[test]
    fn stream_modes_are_checked() {
        assert!(Modes::parse(Some(&json!(["values", "messages-tuple", "custom"])), false).is_ok());
        assert!(Modes::parse(Some(&json!("updates")), false).unwrap().updates);
        assert!(Modes::parse(None, false).unwrap().values);
        let e = Modes::parse(Some(&json!(["valuez"])), false).unwrap_err();
        assert!(e.starts_with("unknown stream_mode `valuez`"), "{e}");
    }
}
