//! A file sent in a chat message, as a content block: the shapes LangChain's messages carry
//! and agent-chat-ui and the LangGraph SDKs send.
//!
//! - LangChain 0.3 (Python and JS), agent-chat-ui before its v1 blocks:
//!   `{type: file, source_type: base64, mime_type, data, metadata: {filename}}`
//!   (`source_type: url` with `url`; `source_type: text` with `text`).
//! - LangChain JS v1, agent-chat-ui today: `{type: file, mimeType, data, metadata: {filename}}`.
//! - LangChain Python v1: `{type: file, base64, mime_type, extras: {filename}}`, or `url`;
//!   `{type: text-plain, text, title}` for plain text.
//! - A `data:` URL, as a block's `url` or as the whole value.

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde_json::Value;

/// Clients pad base64 or not; both decode.
const LENIENT: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const STANDARD: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT);
const URL_SAFE: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT);

/// A document block, read.
#[derive(Debug, PartialEq)]
pub(super) struct Block {
    pub body: Body,
    /// Its MIME type, when the block says.
    pub mime_type: Option<String>,
    /// Its file name, when the block says.
    pub filename: Option<String>,
}

/// What a block holds.
#[derive(Debug, PartialEq)]
pub(super) enum Body {
    /// Base64 text, not yet decoded.
    Base64(String),
    /// Plain text.
    Text(String),
    /// An http(s) URL to fetch.
    Url(String),
}

impl Block {
    /// Reads a content block (or a `data:` URL).
    pub(super) fn read(value: &Value) -> Result<Block, String> {
        let obj = match value {
            Value::String(s) if s.starts_with("data:") => return data_url(s, None),
            Value::Object(obj) => obj,
            Value::Null => return Err("no document was given (the expression yielded null)".into()),
            other => {
                return Err(format!(
                    "expected a content block such as {{type: file, mime_type, data}}, got {}",
                    crate::engine::values::kind(other)
                ));
            }
        };
        let text = |key: &str| obj.get(key).and_then(Value::as_str).map(str::to_string);
        let mime_type = text("mime_type").or_else(|| text("mimeType"));
        let filename = ["metadata", "extras"]
            .iter()
            .filter_map(|k| obj.get(*k))
            .flat_map(|m| ["filename", "name", "title"].map(|f| m.get(f).and_then(Value::as_str)))
            .chain(["filename", "name", "title"].map(|f| obj.get(f).and_then(Value::as_str)))
            .flatten()
            .find(|n| !n.trim().is_empty())
            .map(str::to_string);
        let source_type = text("source_type");
        let body = if let Some(b64) = text("base64") {
            Body::Base64(b64)
        } else if let (Some(data), None | Some("base64")) = (text("data"), source_type.as_deref()) {
            Body::Base64(data)
        } else if let (Some(data), Some("text")) = (text("data"), source_type.as_deref()) {
            Body::Text(data)
        } else if let (Some(url), Some("url")) = (text("data"), source_type.as_deref()) {
            Body::Url(url)
        } else if let Some(t) = text("text") {
            Body::Text(t)
        } else if let Some(url) = text("url") {
            if url.starts_with("data:") {
                return data_url(&url, filename);
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "the block's url is neither http(s) nor a data: URL: {}",
                    cut(&url)
                ));
            }
            Body::Url(url)
        } else if obj.contains_key("file_id") {
            return Err("the block names a file stored by a provider (`file_id`); send its data instead".into());
        } else {
            let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            return Err(format!(
                "the content block holds no document: expected `data`, `base64`, `text` or `url`, found {}",
                keys.join(", ")
            ));
        };
        Ok(Block {
            body,
            mime_type,
            filename,
        })
    }

    /// The name it is known by in `output.source`: its file name, else `document`.
    pub(super) fn name(&self) -> String {
        self.filename.clone().unwrap_or_else(|| "document".to_string())
    }
}

impl Body {
    /// The bytes of an inline body, refused over `max` before they are decoded.
    pub(super) fn bytes(&self, max: u64) -> Result<Vec<u8>, String> {
        let bytes = match self {
            Body::Text(t) => t.as_bytes().to_vec(),
            Body::Base64(b64) => {
                let b64: String = b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
                if (b64.len() as u64 / 4) * 3 > max {
                    return Err(format!("the document is over `max_bytes` ({max})"));
                }
                STANDARD
                    .decode(&b64)
                    .or_else(|_| URL_SAFE.decode(&b64))
                    .map_err(|e| format!("its data is not base64: {e}"))?
            }
            Body::Url(url) => return Err(format!("{url} is fetched, not decoded")),
        };
        if bytes.len() as u64 > max {
            return Err(format!("the document is over `max_bytes` ({max})"));
        }
        Ok(bytes)
    }
}

/// A `data:[<mime>][;base64],<data>` URL.
fn data_url(url: &str, filename: Option<String>) -> Result<Block, String> {
    let rest = &url["data:".len()..];
    let (head, data) = rest
        .split_once(',')
        .ok_or_else(|| format!("a data: URL without a comma: {}", cut(url)))?;
    let base64 = head.ends_with(";base64");
    let mime = head.trim_end_matches(";base64").split(';').next().unwrap_or("");
    Ok(Block {
        body: if base64 {
            Body::Base64(data.to_string())
        } else {
            Body::Text(data.to_string())
        },
        mime_type: (!mime.is_empty()).then(|| mime.to_string()),
        filename,
    })
}

fn cut(s: &str) -> String {
    s.chars().take(60).collect()
}

#[cfg(test)]
mod tests {
    use super::{Block, Body};
    use serde_json::json;

    #[test]
    fn every_shape_a_chat_client_sends_is_read() {
        let legacy = json!({"type": "file", "source_type": "base64", "mime_type": "application/pdf",
                            "data": "aGk=", "metadata": {"filename": "a.pdf"}});
        let js_v1 =
            json!({"type": "file", "mimeType": "application/pdf", "data": "aGk=", "metadata": {"filename": "a.pdf"}});
        let py_v1 =
            json!({"type": "file", "base64": "aGk=", "mime_type": "application/pdf", "extras": {"filename": "a.pdf"}});
        for block in [legacy, js_v1, py_v1] {
            let b = Block::read(&block).unwrap();
            assert_eq!(b.body.bytes(100).unwrap(), b"hi", "{block}");
            assert_eq!(
                (b.mime_type.as_deref(), b.name().as_str()),
                (Some("application/pdf"), "a.pdf")
            );
        }
        let plain = Block::read(&json!({"type": "text-plain", "text": "notes", "title": "n.txt"})).unwrap();
        assert_eq!(
            (plain.name().as_str(), plain.body),
            ("n.txt", Body::Text("notes".into()))
        );
        let url = Block::read(&json!("data:text/plain;base64,aGk=")).unwrap();
        assert_eq!(
            (url.body.bytes(100).unwrap(), url.mime_type),
            (b"hi".to_vec(), Some("text/plain".into()))
        );
    }

    #[test]
    fn what_is_not_a_document_is_refused_saying_why() {
        assert!(Block::read(&json!(null)).unwrap_err().contains("null"));
        assert!(
            Block::read(&json!({"type": "text", "texts": "x"}))
                .unwrap_err()
                .contains("holds no document")
        );
        assert!(Block::read(&json!({"type": "file", "url": "file:///etc/passwd"})).is_err());
        let big = Block::read(&json!({"type": "file", "data": "aGVsbG8gd29ybGQ="})).unwrap();
        assert!(big.body.bytes(4).unwrap_err().contains("max_bytes"));
        assert!(
            Block::read(&json!({"type": "file", "data": "!!"}))
                .unwrap()
                .body
                .bytes(10)
                .is_err()
        );
    }
}
