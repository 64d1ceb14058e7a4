//! Documents to text: plain text and Markdown as they are, HTML without its markup (scripts,
//! styles and other non-content elements dropped, block elements as line breaks, entities
//! decoded), JSON parsed. PDF is not supported by this build: it is refused with a clear error.

use std::path::Path;

/// A document format, as detected or asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Markdown,
    Html,
    Json,
    Pdf,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Markdown => "markdown",
            Format::Html => "html",
            Format::Json => "json",
            Format::Pdf => "pdf",
        }
    }

    /// From a file extension; `None` for files that are not documents.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "txt" | "text" | "rst" | "log" | "csv" => Format::Text,
            "md" | "markdown" | "mdx" => Format::Markdown,
            "html" | "htm" | "xhtml" => Format::Html,
            "json" => Format::Json,
            "pdf" => Format::Pdf,
            _ => return None,
        })
    }

    /// From an HTTP content type.
    pub fn from_content_type(ct: &str) -> Option<Format> {
        let ct = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        Some(match ct.as_str() {
            "text/html" | "application/xhtml+xml" => Format::Html,
            "text/markdown" | "text/x-markdown" => Format::Markdown,
            "application/json" => Format::Json,
            "application/pdf" => Format::Pdf,
            c if c.starts_with("text/") => Format::Text,
            c if c.ends_with("+json") => Format::Json,
            _ => return None,
        })
    }

    /// From the bytes, when nothing else said: HTML if it looks like it, else text.
    pub fn sniff(bytes: &[u8]) -> Format {
        let head = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).to_ascii_lowercase();
        let head = head.trim_start();
        if head.starts_with("%pdf") {
            Format::Pdf
        } else if head.starts_with("<!doctype html") || head.starts_with("<html") {
            Format::Html
        } else if head.starts_with('{') || head.starts_with('[') {
            Format::Json
        } else {
            Format::Text
        }
    }
}

/// A document's text.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    pub text: String,
    pub title: Option<String>,
}

/// Extracts the text of a document (JSON is returned as its text; callers parse it).
pub fn extract(bytes: &[u8], format: Format) -> Result<Extracted, String> {
    match format {
        Format::Pdf => {
            Err("PDF documents are not supported by this build; convert them to text or Markdown first".into())
        }
        Format::Html => {
            let html = String::from_utf8_lossy(bytes);
            Ok(html_to_text(&html))
        }
        Format::Text | Format::Json | Format::Markdown => {
            let text = String::from_utf8(bytes.to_vec()).map_err(|_| "the document is not UTF-8 text".to_string())?;
            let text = text.replace("\r\n", "\n");
            let title = (format == Format::Markdown)
                .then(|| {
                    text.lines()
                        .find_map(|l| l.strip_prefix("# ").map(|t| t.trim().to_string()))
                })
                .flatten();
            Ok(Extracted { text, title })
        }
    }
}

const SKIPPED: &[&str] = &[
    "script", "style", "noscript", "template", "svg", "head", "nav", "footer",
];
const BLOCKS: &[&str] = &[
    "p",
    "div",
    "br",
    "li",
    "ul",
    "ol",
    "tr",
    "table",
    "section",
    "article",
    "header",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "blockquote",
    "hr",
    "dt",
    "dd",
    "main",
    "aside",
    "figure",
    "figcaption",
];

const PARAGRAPHS: &[&str] = &[
    "p",
    "div",
    "section",
    "article",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "blockquote",
    "table",
    "ul",
    "ol",
    "main",
];

/// HTML to readable text: a small tag scanner, not a full parser (good for pages and exports,
/// not for rendering).
pub fn html_to_text(html: &str) -> Extracted {
    let lower = html.to_ascii_lowercase();
    let title = lower.find("<title").and_then(|i| {
        let open_end = i + lower[i..].find('>')? + 1;
        let close = open_end + lower[open_end..].find("</title")?;
        Some(decode_entities(html[open_end..close].trim()))
    });
    let mut out = String::new();
    let mut i = 0;
    let bytes = html.as_bytes();
    while i < html.len() {
        if bytes[i] == b'<' {
            let Some(rel) = html[i..].find('>') else { break };
            let tag = &lower[i + 1..i + rel];
            let end = i + rel + 1;
            if tag.starts_with("!--") {
                i = lower[i..].find("-->").map_or(html.len(), |p| i + p + 3);
                continue;
            }
            let name: String = tag
                .trim_start_matches('/')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if !tag.starts_with('/') && SKIPPED.contains(&name.as_str()) && !tag.ends_with('/') {
                let close = format!("</{name}");
                i = lower[end..].find(&close).map_or(html.len(), |p| {
                    let at = end + p;
                    lower[at..].find('>').map_or(html.len(), |q| at + q + 1)
                });
                continue;
            }
            if BLOCKS.contains(&name.as_str()) {
                // Paragraph-like blocks end with a blank line, so chunking can cut there.
                let para = PARAGRAPHS.contains(&name.as_str());
                let want = if para { "\n\n" } else { "\n" };
                if !out.is_empty() && !out.ends_with(want) {
                    out.push_str(if out.ends_with('\n') && para { "\n" } else { want });
                }
            } else if name == "td" || name == "th" {
                out.push(' ');
            }
            i = end;
        } else {
            let next = html[i..].find('<').map_or(html.len(), |p| i + p);
            out.push_str(&decode_entities(&html[i..next]));
            i = next;
        }
    }
    // Collapse runs of spaces; keep at most one blank line.
    let mut text = String::new();
    let mut blank = 0;
    for line in out.lines() {
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.is_empty() {
            blank += 1;
            continue;
        }
        if !text.is_empty() {
            text.push_str(if blank > 0 { "\n\n" } else { "\n" });
        }
        blank = 0;
        text.push_str(&line);
    }
    Extracted { text, title }
}

fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = rest.find('&') {
        out.push_str(&rest[..p]);
        rest = &rest[p..];
        let Some(semi) = rest[..rest.len().min(12)].find(';') else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let entity = &rest[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" | "#39" => Some('\''),
            "nbsp" => Some(' '),
            e if e.starts_with("#x") || e.starts_with("#X") => {
                u32::from_str_radix(&e[2..], 16).ok().and_then(char::from_u32)
            }
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_loses_markup_scripts_and_keeps_blocks() {
        let e = html_to_text(
            "<html><head><title>T &amp; C</title><script>x()</script></head>\
             <body><h1>Terms</h1><p>One&nbsp;two</p><script>bad()</script><p>Three &lt;4&gt;</p></body></html>",
        );
        assert_eq!(e.title.as_deref(), Some("T & C"));
        assert_eq!(e.text, "Terms\n\nOne two\n\nThree <4>");
    }
}
