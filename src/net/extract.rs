//! Main-content extraction for scraped pages: HTML through a readability port (navigation,
//! ads, footers and sidebars dropped) into Markdown; text and Markdown as they are. Each page
//! gets a quality score in [0, 1] from its length, how much of the page the content is, and how
//! much of the content is links.

use dom_smoothie::{Config, Readability, TextMode};

/// What was extracted from one page.
#[derive(Debug, Clone, PartialEq)]
pub struct Extracted {
    pub title: String,
    /// The main content as Markdown (or the text as served).
    pub content: String,
    pub quality_score: f64,
    pub word_count: usize,
}

/// The kinds of documents the extractor reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocType {
    Html,
    Text,
    Markdown,
}

impl DocType {
    /// The document type of a `Content-Type` value (`None`: not one the extractor reads).
    /// A missing content type is read as HTML.
    pub fn of(content_type: Option<&str>) -> Option<DocType> {
        let Some(ct) = content_type else {
            return Some(DocType::Html);
        };
        let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match mime.as_str() {
            "text/html" | "application/xhtml+xml" | "" => Some(DocType::Html),
            "text/plain" => Some(DocType::Text),
            "text/markdown" | "text/x-markdown" => Some(DocType::Markdown),
            _ => None,
        }
    }
}

/// Extracts the main content of a document fetched from `url`.
pub fn extract(body: &str, doc: DocType, url: &str) -> Extracted {
    match doc {
        DocType::Html => html(body, url),
        DocType::Text | DocType::Markdown => {
            let content = body.trim().to_string();
            let title = content
                .lines()
                .map(|l| l.trim().trim_start_matches('#').trim())
                .find(|l| !l.is_empty())
                .unwrap_or("")
                .chars()
                .take(200)
                .collect();
            let words = word_count(&content);
            let links = link_text_ratio(&content);
            Extracted {
                title,
                quality_score: score(words, 1.0, links),
                word_count: words,
                content,
            }
        }
    }
}

fn html(body: &str, url: &str) -> Extracted {
    let page_chars = visible_text_len(body);
    let cfg = Config {
        text_mode: TextMode::Markdown,
        max_elements_to_parse: 200_000,
        ..Config::default()
    };
    let doc_url = url::Url::parse(url).ok().map(|_| url);
    let article = Readability::new(body, doc_url, Some(cfg)).and_then(|mut r| r.parse());
    match article {
        Ok(a) => {
            let content = tidy(&a.text_content);
            let words = word_count(&content);
            let content_chars = plain_len(&content);
            let density = if page_chars == 0 {
                0.0
            } else {
                (content_chars as f64 / page_chars as f64).min(1.0)
            };
            Extracted {
                title: a.title.trim().to_string(),
                quality_score: score(words, density, html_link_ratio(&a.content)),
                word_count: words,
                content,
            }
        }
        // No article found: the page's visible text is all there is, and it is scored as
        // boilerplate.
        Err(_) => {
            let doc = dom_query::Document::from(body);
            doc.select("script, style, noscript, template, svg").remove();
            let title = doc.select("title").text().trim().to_string();
            let content = tidy(&doc.select("body").text());
            let words = word_count(&content);
            Extracted {
                title,
                quality_score: score(words, 0.2, html_link_ratio(body)),
                word_count: words,
                content,
            }
        }
    }
}

/// Characters of visible text in a whole HTML page (scripts and styles aside).
fn visible_text_len(body: &str) -> usize {
    let doc = dom_query::Document::from(body);
    doc.select("script, style, noscript, template, svg, head").remove();
    doc.select("body").text().chars().filter(|c| !c.is_whitespace()).count()
}

/// The share of an HTML fragment's text that is inside links, in [0, 1].
fn html_link_ratio(html: &str) -> f64 {
    let doc = dom_query::Document::from(html);
    let count = |t: &str| t.chars().filter(|c| !c.is_whitespace()).count();
    let total = count(&doc.select("body").text());
    if total == 0 {
        return 0.0;
    }
    (count(&doc.select("a").text()) as f64 / total as f64).min(1.0)
}

/// Characters of the text of Markdown, without link targets and markup.
fn plain_len(md: &str) -> usize {
    let (text, _) = split_links(md);
    text.chars()
        .filter(|c| c.is_alphanumeric() || c.is_ascii_punctuation() && *c != '#' && *c != '*')
        .count()
}

/// The share of the text's characters that are link text, in [0, 1].
fn link_text_ratio(md: &str) -> f64 {
    let (text, link_chars) = split_links(md);
    let total = text.chars().filter(|c| !c.is_whitespace()).count();
    if total == 0 {
        return 0.0;
    }
    (link_chars as f64 / total as f64).min(1.0)
}

/// Markdown with every `[text](target)` replaced by its text, and the count of non-space
/// characters inside link texts.
fn split_links(md: &str) -> (String, usize) {
    let mut out = String::with_capacity(md.len());
    let mut link_chars = 0;
    let mut rest = md;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](") {
            Some(close) if !after[..close].contains('\n') => {
                let text = &after[..close];
                let target_start = &after[close + 2..];
                match target_start.find(')') {
                    Some(end) => {
                        out.push_str(text);
                        link_chars += text.chars().filter(|c| !c.is_whitespace()).count();
                        rest = &target_start[end + 1..];
                    }
                    None => {
                        out.push('[');
                        rest = after;
                    }
                }
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    (out, link_chars)
}

/// The quality score: enough words (saturating at 600) and the content's share of the page,
/// scaled down by the share of link text. A page of a few dozen words scores low whatever else.
fn score(words: usize, density: f64, link_ratio: f64) -> f64 {
    let length = ((words as f64 + 1.0).ln() / (601.0f64).ln()).min(1.0);
    let s = (0.6 * length + 0.4 * density.clamp(0.0, 1.0)) * (1.0 - link_ratio.clamp(0.0, 1.0));
    let s = if words < 50 { s.min(0.25) } else { s };
    (s * 1000.0).round() / 1000.0
}

pub fn word_count(text: &str) -> usize {
    text.split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .count()
}

/// Trims trailing spaces and collapses runs of blank lines.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.trim().is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn article_page() -> String {
        let para = "Heat pumps move heat from a cold reservoir to a warm one by compressing a \
                    refrigerant; the coefficient of performance compares the heat delivered \
                    with the electricity used, and typical air-source units reach three to four. ";
        format!(
            r#"<html><head><title>How heat pumps work | Example News</title></head><body>
<nav class="menu"><a href="/">Home</a> <a href="/news">News</a> <a href="/sport">Sport</a>
<a href="/weather">Weather</a> <a href="/about">About us</a> <a href="/contact">Contact</a></nav>
<div class="ad banner">Buy now! Best deals on everything, limited offer, click here today.</div>
<aside class="sidebar"><h3>Most read</h3><ul><li><a href="/a">Celebrity gossip roundup</a></li>
<li><a href="/b">Ten recipes for summer</a></li><li><a href="/c">Stock market today</a></li></ul></aside>
<article><h1>How heat pumps work</h1><p>{p}</p><p>{p}</p><p>{p}</p><p>{p}</p><p>{p}</p></article>
<footer class="site-footer">Copyright 2024 Example News. <a href="/privacy">Privacy</a>
<a href="/terms">Terms</a> <a href="/cookies">Cookies</a></footer></body></html>"#,
            p = para
        )
    }

    #[test]
    fn the_article_is_kept_and_boilerplate_dropped() {
        let e = extract(&article_page(), DocType::Html, "http://news.example/heat");
        assert!(e.title.contains("How heat pumps work"), "{}", e.title);
        assert!(e.content.contains("coefficient of performance"), "{}", e.content);
        for boilerplate in ["Buy now", "Celebrity gossip", "Privacy", "Weather"] {
            assert!(!e.content.contains(boilerplate), "`{boilerplate}` kept:\n{}", e.content);
        }
        assert!(e.word_count > 150, "{}", e.word_count);
        assert!(e.quality_score > 0.6, "score {}", e.quality_score);
    }

    #[test]
    fn a_page_of_links_scores_low() {
        let links: String = (0..60)
            .map(|i| format!("<li><a href=\"/p{i}\">Link number {i}</a></li>"))
            .collect();
        let page = format!("<html><head><title>Index</title></head><body><nav><ul>{links}</ul></nav></body></html>");
        let e = extract(&page, DocType::Html, "http://news.example/");
        assert!(e.quality_score < 0.3, "score {}", e.quality_score);
    }

    #[test]
    fn text_and_markdown_are_read_as_they_are() {
        let e = extract("# Notes\n\nShort text.", DocType::Markdown, "http://x.example/a.md");
        assert_eq!(e.title, "Notes");
        assert_eq!(e.content, "# Notes\n\nShort text.");
        assert_eq!(e.word_count, 3);
        assert!(e.quality_score <= 0.25);
    }

    #[test]
    fn content_types() {
        assert_eq!(DocType::of(Some("text/html; charset=utf-8")), Some(DocType::Html));
        assert_eq!(DocType::of(Some("text/plain")), Some(DocType::Text));
        assert_eq!(DocType::of(Some("text/markdown")), Some(DocType::Markdown));
        assert_eq!(DocType::of(Some("application/pdf")), None);
        assert_eq!(DocType::of(Some("image/png")), None);
        assert_eq!(DocType::of(None), Some(DocType::Html));
    }

    #[test]
    fn link_text_is_measured() {
        assert!((link_text_ratio("[abcd](http://x) efgh") - 0.5).abs() < 1e-9);
        assert_eq!(link_text_ratio("no links [here]"), 0.0);
    }
}
