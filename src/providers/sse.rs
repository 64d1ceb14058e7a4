//! Server-sent events, read tolerantly: bytes arrive in network chunks that may split a line, a
//! UTF-8 character or an event anywhere; lines end in LF, CRLF or CR; `:` lines are keep-alive
//! comments; an event's `data:` lines are joined with newlines. What the servers of
//! OpenAI-compatible and Anthropic APIs send, and what the WHATWG spec allows.

/// One event: its `event:` name (if any) and its data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    pub event: Option<String>,
    pub data: String,
}

/// Turns chunks of bytes into events.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes of a line not yet ended.
    line: Vec<u8>,
    /// The last byte consumed was a CR: an LF right after it ends nothing.
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
    /// The first line has ended: a byte order mark at its start (the stream's start) was
    /// dropped. Done per line, not per chunk, since a chunk may end inside the mark.
    started: bool,
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Consumes a chunk and returns the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        for &b in chunk {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(e) = self.line_done(&line) {
                        out.push(e);
                    }
                }
                _ => {
                    self.after_cr = false;
                    self.line.push(b);
                }
            }
        }
        out
    }

    /// Ends the stream: an event whose blank line never came is still returned, as browsers
    /// drop it but a server that closes right after its last `data:` line meant it.
    pub fn finish(&mut self) -> Option<Event> {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line);
        }
        self.dispatch()
    }

    fn line_done(&mut self, line: &[u8]) -> Option<Event> {
        let line = if self.started {
            line
        } else {
            self.started = true;
            line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
        };
        if line.is_empty() {
            return self.dispatch();
        }
        if line[0] == b':' {
            return None;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            "event" => self.event = Some(value.to_string()),
            // `id` and `retry` matter to reconnecting browsers only.
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<Event> {
        let event = self.event.take();
        let data = self.data.take()?;
        Some(Event { event, data })
    }
}

#[cfg(test)]
mod tests {
    use super::{Event, Parser};

    fn data(d: &str) -> Event {
        Event {
            event: None,
            data: d.into(),
        }
    }

    fn all(chunks: &[&[u8]]) -> Vec<Event> {
        let mut p = Parser::new();
        let mut out: Vec<Event> = chunks.iter().flat_map(|c| p.push(c)).collect();
        out.extend(p.finish());
        out
    }

    #[test]
    fn events_split_anywhere_across_chunks_come_out_whole() {
        let text = "data: {\"a\": \"é\"}\n\ndata: [DONE]\n\n".as_bytes();
        let whole = all(&[text]);
        assert_eq!(whole, vec![data("{\"a\": \"é\"}"), data("[DONE]")]);
        // Every split point, including inside the two-byte `é`.
        for i in 0..text.len() {
            assert_eq!(all(&[&text[..i], &text[i..]]), whole, "split at {i}");
        }
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(all(&bytes), whole);
    }

    #[test]
    fn crlf_cr_and_lf_all_end_lines() {
        assert_eq!(
            all(&[b"data: a\r\n\r\ndata: b\r\rdata: c\n\n"]),
            vec![data("a"), data("b"), data("c")]
        );
        // A CRLF split between chunks is one line end, not two.
        assert_eq!(all(&[b"data: a\r", b"\ndata: b\r\n\r\n"]), vec![data("a\nb")]);
    }

    #[test]
    fn comments_are_skipped_and_data_lines_join() {
        assert_eq!(
            all(&[b": keep-alive\n\n: ping\ndata: one\ndata:two\ndata\n\n"]),
            vec![data("one\ntwo\n")]
        );
    }

    #[test]
    fn named_events_keep_their_name() {
        assert_eq!(
            all(&[b"event: ping\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"]),
            vec![
                Event {
                    event: Some("ping".into()),
                    data: "{}".into()
                },
                Event {
                    event: Some("message_stop".into()),
                    data: "{\"type\":\"message_stop\"}".into()
                },
            ]
        );
        // An event name without data dispatches nothing.
        assert_eq!(all(&[b"event: lonely\n\n"]), vec![]);
    }

    #[test]
    fn an_unterminated_last_event_is_kept_and_a_bom_dropped() {
        assert_eq!(
            all(&[b"\xEF\xBB\xBFdata: x\n\ndata: last"]),
            vec![data("x"), data("last")]
        );
        // A byte order mark split across chunks is still the stream's mark.
        for at in 0..=3 {
            let bytes = b"\xEF\xBB\xBFdata: x\n\n";
            assert_eq!(all(&[&bytes[..at], &bytes[at..]]), vec![data("x")], "cut at {at}");
        }
        // Only at the very start.
        assert_eq!(all(&[b"\n\xEF\xBB\xBFdata: x\n\n"]), vec![]);
    }
}
