//! Documents to text: plain text and Markdown as they are, HTML as Markdown (through an HTML5
//! parser: headings, code blocks, lists and tables kept; scripts, styles, navigation and
//! footers dropped), JSON parsed, PDF through `pdf-extract` page by page (pages separated by
//! a form feed, which chunking turns into page numbers), PowerPoint (`.pptx`, through
//! [`super::pptx`]) as each slide's text, slides separated by a form feed.

use std::path::Path;

/// A document format, as detected or asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Markdown,
    Html,
    Json,
    Pdf,
    Pptx,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Markdown => "markdown",
            Format::Html => "html",
            Format::Json => "json",
            Format::Pdf => "pdf",
            Format::Pptx => "pptx",
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
            "pptx" => Format::Pptx,
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
            "application/vnd.openxmlformats-officedocument.presentationml.presentation" => Format::Pptx,
            c if c.starts_with("text/") => Format::Text,
            c if c.ends_with("+json") => Format::Json,
            _ => return None,
        })
    }

    /// From the bytes, when nothing else said: PDF, PPTX (a zip naming `ppt/` parts), HTML or
    /// JSON if it looks like it, else text.
    pub fn sniff(bytes: &[u8]) -> Format {
        if bytes.starts_with(b"PK\x03\x04") && bytes.windows(4).any(|w| w == b"ppt/") {
            return Format::Pptx;
        }
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
        Format::Pdf => pdf_to_text(bytes),
        Format::Pptx => {
            let t = super::pptx::read(bytes).map_err(|e| e.to_string())?;
            Ok(Extracted {
                text: t.slide_text.join(&format!("\n{PAGE_BREAK}\n")),
                title: t.title,
            })
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

/// The page separator in extracted PDF text (as `pdftotext` writes it).
pub const PAGE_BREAK: char = '\u{c}';

/// A PDF's text, its pages separated by [`PAGE_BREAK`]; the title from its first non-empty line.
/// The parser can panic on malformed files: a document is untrusted input, so a panic is
/// caught and reported as this document's failure rather than ending the run.
fn pdf_to_text(bytes: &[u8]) -> Result<Extracted, String> {
    let pages = std::panic::catch_unwind(|| pdf_extract::extract_text_from_mem_by_pages(bytes))
        .map_err(|_| "the PDF could not be parsed".to_string())?
        .map_err(|e| format!("the PDF could not be read: {e}"))?;
    let pages: Vec<String> = pages.iter().map(|p| tidy(&p.replace('\r', "\n"))).collect();
    let text = pages.join(&format!("\n{PAGE_BREAK}\n"));
    if text
        .trim_matches(|c: char| c.is_whitespace() || c == PAGE_BREAK)
        .is_empty()
    {
        return Err("the PDF has no text layer (a scan?); run OCR on it first".into());
    }
    let title = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with(PAGE_BREAK))
        .map(str::to_string);
    Ok(Extracted { text, title })
}

/// Elements that are not the document's content.
const SKIPPED: &[&str] = &[
    "script", "style", "noscript", "template", "svg", "head", "nav", "footer", "meta", "iframe",
];

/// HTML to Markdown through an HTML5 parser (`dom_query`): headings become `#` headings (so
/// chunks get heading paths), `<pre>` a fenced code block, lists and tables their Markdown
/// forms, entities decoded; scripts, styles, navigation and footers are dropped.
pub fn html_to_text(html: &str) -> Extracted {
    let doc = dom_query::Document::from(html);
    let title = doc.select("head title").text().trim().to_string();
    let title = (!title.is_empty()).then_some(title);
    let text = tidy(&doc.md(Some(SKIPPED)));
    Extracted { text, title }
}

/// Markdown with no-break spaces as spaces, trailing spaces gone and at most one blank line
/// in a row outside code fences (which keep their lines as they are).
fn tidy(md: &str) -> String {
    let mut text = String::with_capacity(md.len());
    let mut blank = false;
    let mut fence = false;
    for line in md.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fence = !fence;
        }
        let plain;
        let line = if fence {
            line
        } else {
            plain = line.replace('\u{a0}', " ");
            plain.trim_end()
        };
        if line.trim().is_empty() && !fence {
            blank = !text.is_empty();
            continue;
        }
        if blank {
            text.push('\n');
            blank = false;
        }
        text.push_str(line);
        text.push('\n');
    }
    text.truncate(text.trim_end().len());
    text
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
        // Markdown: a `<` that is text is escaped.
        assert_eq!(e.text, "# Terms\n\nOne two\n\nThree \\<4>");
    }

    #[test]
    fn an_ampersand_before_a_multibyte_character_is_text() {
        for html in [
            "<p>Fish &\u{e9}t\u{e9}</p>",
            "<p>R&\u{d7}D &\u{1f600}; &#x1F600; &;</p>",
            "&\u{e9}",
            "<p>&amp\u{e9}</p>",
        ] {
            let e = html_to_text(html);
            assert!(
                e.text.contains('&') || e.text.contains('\u{1f600}'),
                "{html}: {:?}",
                e.text
            );
        }
        assert_eq!(html_to_text("<p>Fish &\u{e9}t\u{e9}</p>").text, "Fish &\u{e9}t\u{e9}");
        // Twelve bytes after the `&` end inside a character.
        let cjk = "Tea &\u{65e5}\u{672c}\u{8336}\u{306e}\u{5e97} and more";
        assert_eq!(html_to_text(&format!("<p>{cjk}</p>")).text, cjk);
    }

    #[test]
    fn headings_and_code_blocks_are_kept() {
        let e = html_to_text(
            "<body><nav>Home | About</nav><h1>Guide</h1><p>Intro.</p><h2>Install</h2>\
             <pre><code>cargo install runner\n  --locked</code></pre><h3>Linux</h3><ul><li>apt</li><li>dnf</li></ul>\
             <footer>(c) 2025</footer></body>",
        );
        assert!(e.text.starts_with("# Guide\n\nIntro.\n\n## Install\n"), "{}", e.text);
        assert!(
            e.text.contains("```\ncargo install runner\n  --locked\n```"),
            "{}",
            e.text
        );
        assert!(e.text.contains("### Linux"), "{}", e.text);
        assert!(!e.text.contains("Home") && !e.text.contains("(c) 2025"), "{}", e.text);
        let chunks = super::super::chunk::split(&e.text, true, super::super::chunk::Chunking::default());
        let headings: Vec<_> = chunks.iter().filter_map(|c| c.heading.as_deref()).collect();
        assert!(headings.contains(&"Guide > Install > Linux"), "{headings:?}");
    }
}
