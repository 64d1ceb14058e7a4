//! Fitting an llm node's prompt into its model's context window: the cheap token estimate,
//! the `fit` policy (variables cut to a size, oldest history dropped; the system prompt and
//! the prompt itself always kept), and what a server's overflow reply says about the window.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::providers::Message;

/// How a prompt that would not fit its model's context window is trimmed.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(in crate::nodes) struct Fit {
    /// Variables the templates read, cut to at most this many tokens each when the prompt
    /// would not fit, e.g. `{state.drafts: 800}`. A string is cut at its end; a list or an
    /// object shares the tokens evenly among its items. The policy is applied once more after
    /// a context-overflow reply, at half these sizes.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub truncate: IndexMap<String, u32>,
    /// Drop the oldest history messages until the prompt fits (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_history: Option<bool>,
}

/// The marker a cut string ends with, so the model (and whoever reads the log) knows.
pub(super) const CUT_MARK: &str = " …[cut]";

/// Tokens `text` is estimated to take: its UTF-8 bytes divided by four, rounded up. Cheap and
/// deliberately rough (English runs near four bytes a token; code and other scripts run
/// denser), which is why a server's overflow reply is also acted on.
pub(crate) fn estimate_text(text: &str) -> u64 {
    crate::compile::estimate_tokens(text.len() as u64)
}

/// Tokens `messages` are estimated to take: each message's text and tool-call arguments, and
/// four for its framing (role and separators).
pub(crate) fn estimate(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let calls: u64 = m.tool_calls.iter().map(|c| estimate_text(&c.to_string())).sum();
            4 + estimate_text(&m.content) + calls
        })
        .sum()
}

/// The room a prompt leaves for the reply when it is trimmed to a known `window`: the
/// completion cap, but at most half the window, so a cap near (or over) the window still
/// leaves the prompt the other half.
pub(crate) fn reply_room(cap: u64, window: u64) -> u64 {
    cap.min(window / 2)
}

/// The completion cap sent with a prompt estimated at `prompt` tokens in a `window`: the
/// node's `cap`, lowered so that prompt and reply fit (the prompt's estimate with a tenth of
/// it to spare), but never below an eighth of the window (nor above `cap`).
pub(crate) fn reply_cap(cap: u64, window: u64, prompt: u64) -> u64 {
    let left = window.saturating_sub(prompt + prompt / 10);
    cap.min(left.max(window / 8))
}

/// `text` cut to about `tokens` tokens (at a character boundary), with [`CUT_MARK`] when cut.
pub(crate) fn cut_text(text: &str, tokens: u64) -> String {
    let max = usize::try_from(tokens.saturating_mul(crate::compile::BYTES_PER_TOKEN)).unwrap_or(usize::MAX);
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT_MARK}", &text[..end])
}

/// `value` cut to about `tokens` tokens: strings cut at their end, a list's or an object's
/// tokens shared evenly among its items, other values kept.
pub(super) fn cut_value(value: &Value, tokens: u64) -> Value {
    match value {
        Value::String(s) => Value::String(cut_text(s, tokens)),
        Value::Array(items) if !items.is_empty() => {
            let each = tokens / items.len() as u64;
            Value::Array(items.iter().map(|v| cut_value(v, each)).collect())
        }
        Value::Object(m) if !m.is_empty() => {
            let each = tokens / m.len() as u64;
            Value::Object(m.iter().map(|(k, v)| (k.clone(), cut_value(v, each))).collect())
        }
        other => other.clone(),
    }
}

/// Whether `path` is a variable path `fit.truncate` can cut: identifiers joined by dots,
/// e.g. `state.drafts`.
pub(super) fn is_path(path: &str) -> bool {
    !path.is_empty()
        && path.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// `root` with the value at `path` (object keys, below the root) replaced by `cut` of it;
/// `false` when the path leads nowhere.
pub(super) fn cut_at(root: &mut Value, path: &[&str], cut: impl FnOnce(&Value) -> Value) -> bool {
    let mut at = root;
    for key in path {
        match at.get_mut(*key) {
            Some(v) => at = v,
            None => return false,
        }
    }
    *at = cut(at);
    true
}

/// Drops the oldest messages of `history` until `fits` says the rest fits (or none is left).
/// A history never starts with tool results whose call was dropped.
pub(super) fn drop_oldest(history: &mut Vec<Message>, fits: impl Fn(&[Message]) -> bool) {
    while !history.is_empty() && !fits(history) {
        history.remove(0);
        while history.first().is_some_and(|m| m.role == "tool") {
            history.remove(0);
        }
    }
}

/// What an overflow message says: the tokens the request took and the context window, where
/// it names them (llama.cpp: "request (4148 tokens) exceeds the available context size (4096
/// tokens)"; OpenAI and vLLM: "maximum context length is 8192 tokens. However, your messages
/// resulted in 8500 tokens").
pub(super) fn overflow_numbers(message: &str) -> (Option<u64>, Option<u64>) {
    let text = message.to_ascii_lowercase();
    let number_after = |needle: &str| -> Option<u64> {
        let rest = &text[text.find(needle)? + needle.len()..];
        let digits: String = rest
            .trim_start_matches([' ', '('])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    let prompt = number_after("request").or_else(|| number_after("resulted in"));
    let window = number_after("context size").or_else(|| number_after("context length is"));
    (prompt, window)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_reply_keeps_at_most_half_a_known_window_and_its_cap_is_lowered_to_fit() {
        assert_eq!(reply_room(1000, 4096), 1000);
        assert_eq!(reply_room(8000, 4096), 2048);
        // A prompt of 1,000 (1,100 with the spare tenth) leaves 2,996 of 4,096.
        assert_eq!(reply_cap(8000, 4096, 1000), 2996);
        assert_eq!(reply_cap(500, 4096, 1000), 500);
        // A prompt that fills the window still lets the reply have an eighth of it.
        assert_eq!(reply_cap(8000, 4096, 4000), 512);
        assert_eq!(reply_cap(100, 4096, 4000), 100);
    }

    #[test]
    fn estimates_are_bytes_over_four_rounded_up() {
        assert_eq!(estimate_text(""), 0);
        assert_eq!(estimate_text("abcde"), 2);
        assert_eq!(estimate(&[Message::new("user", "abcd")]), 5);
    }

    #[test]
    fn values_are_cut_to_their_share() {
        assert_eq!(cut_text("héllo wörld", 1), format!("hél{CUT_MARK}"));
        assert_eq!(cut_text("short", 10), "short");
        let v = cut_value(&json!(["aaaaaaaaaa", "bbbbbbbbbb", 3]), 3);
        assert_eq!(v, json!([format!("aaaa{CUT_MARK}"), format!("bbbb{CUT_MARK}"), 3]));
        let mut root = json!({"drafts": {"a": "xxxxxxxxxxxx"}});
        assert!(cut_at(&mut root, &["drafts", "a"], |v| cut_value(v, 1)));
        assert_eq!(root, json!({"drafts": {"a": format!("xxxx{CUT_MARK}")}}));
        assert!(!cut_at(&mut root, &["nope"], |v| v.clone()));
    }

    #[test]
    fn paths_are_dotted_identifiers() {
        assert!(is_path("state.drafts"));
        assert!(is_path("input"));
        assert!(!is_path("state.drafts[0]"));
        assert!(!is_path("state..x"));
        assert!(!is_path(""));
    }

    #[test]
    fn dropping_history_never_leaves_orphan_tool_results() {
        let mut h = vec![
            Message::new("user", "q"),
            Message::new("assistant", "calls"),
            Message::new("tool", "result"),
            Message::new("user", "later"),
        ];
        drop_oldest(&mut h, |rest| rest.len() <= 2);
        assert_eq!(h, vec![Message::new("user", "later")]);
    }

    #[test]
    fn overflow_messages_name_their_numbers() {
        assert_eq!(
            overflow_numbers(
                "400: request (4148 tokens) exceeds the available context size (4096 tokens), try increasing it"
            ),
            (Some(4148), Some(4096))
        );
        assert_eq!(
            overflow_numbers(
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 8500 tokens."
            ),
            (Some(8500), Some(8192))
        );
        assert_eq!(overflow_numbers("500: Context size has been exceeded."), (None, None));
    }
}
