//! Splitting a document's text into chunks: at most `size` characters, neighbours sharing
//! about `overlap` characters, cut at paragraph, line, sentence or word boundaries (a word is
//! cut only when it alone is longer than a chunk). Markdown is split by section first, and each
//! chunk keeps its heading path (`Guide > Install > Linux`).

use super::extract::PAGE_BREAK;

/// Chunk sizes, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    pub size: usize,
    pub overlap: usize,
}

impl Default for Chunking {
    fn default() -> Chunking {
        Chunking {
            size: 1000,
            overlap: 150,
        }
    }
}

impl Chunking {
    /// Sizes as given, made workable: at least 50 characters, overlap under half a chunk.
    pub fn new(size: Option<u32>, overlap: Option<u32>) -> Chunking {
        let d = Chunking::default();
        let size = size.map_or(d.size, |s| s as usize).max(50);
        let overlap = overlap.map_or(d.overlap.min(size / 4), |o| o as usize).min(size / 2);
        Chunking { size, overlap }
    }
}

/// One piece of a document.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// 0, 1, 2... in document order.
    pub position: usize,
    /// The heading path of the section the chunk starts in (Markdown).
    pub heading: Option<String>,
    /// The page it starts on, where the format has pages.
    pub page: Option<u32>,
    /// Character offsets of the chunk in the document text, end exclusive.
    pub start: usize,
    pub end: usize,
    pub text: String,
}

/// Splits `text`; `markdown` splits by section first.
pub fn split(text: &str, markdown: bool, c: Chunking) -> Vec<Chunk> {
    let chars: Vec<char> = text.chars().collect();
    let sections = if markdown {
        sections(&chars)
    } else {
        vec![Section {
            start: 0,
            end: chars.len(),
            body: 0,
            heading: None,
        }]
    };
    // Text with form feeds (extracted PDF) has pages: a chunk is on the page it starts on.
    let breaks: Vec<usize> = chars
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == PAGE_BREAK)
        .map(|(i, _)| i)
        .collect();
    let page = |start: usize| {
        (!breaks.is_empty()).then(|| u32::try_from(breaks.partition_point(|b| *b < start) + 1).unwrap_or(u32::MAX))
    };
    let mut out = Vec::new();
    for s in sections {
        // A heading directly followed by a sub-heading: the sub-section carries its path.
        if chars[s.body..s.end].iter().all(|c| c.is_whitespace()) && s.body > s.start {
            continue;
        }
        window(&chars, s.start, s.end, c, |start, end| {
            out.push(Chunk {
                position: out.len(),
                heading: s.heading.clone(),
                page: page(start),
                start,
                end,
                text: chars[start..end].iter().collect(),
            })
        });
    }
    out
}

struct Section {
    start: usize,
    end: usize,
    /// Where the text after the heading line starts.
    body: usize,
    heading: Option<String>,
}

/// Markdown sections: each ATX heading (outside code fences) starts one.
fn sections(chars: &[char]) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut fence: Option<char> = None;
    let mut line_start = 0;
    let mut current = Section {
        start: 0,
        end: 0,
        body: 0,
        heading: None,
    };
    while line_start < chars.len() {
        let line_end = chars[line_start..]
            .iter()
            .position(|&c| c == '\n')
            .map_or(chars.len(), |p| line_start + p);
        let line: String = chars[line_start..line_end].iter().collect();
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            let mark = trimmed.chars().next().unwrap_or('`');
            fence = match fence {
                Some(m) if m == mark => None,
                Some(m) => Some(m),
                None => Some(mark),
            };
        } else if fence.is_none()
            && let Some((level, title)) = heading(&line)
        {
            current.end = line_start;
            if current.end > current.start {
                out.push(current);
            }
            path.retain(|(l, _)| *l < level);
            path.push((level, title));
            current = Section {
                start: line_start,
                end: 0,
                body: (line_end + 1).min(chars.len()),
                heading: Some(path.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>().join(" > ")),
            };
        }
        line_start = line_end + 1;
    }
    current.end = chars.len();
    if current.end > current.start {
        out.push(current);
    }
    out
}

/// `## Title` → (2, "Title").
fn heading(line: &str) -> Option<(usize, String)> {
    if line.starts_with("    ") {
        return None;
    }
    let t = line.trim_start();
    let level = t.chars().take_while(|&c| c == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &t[level..];
    if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    let title = rest.trim().trim_end_matches('#').trim().to_string();
    (!title.is_empty()).then_some((level, title))
}

/// Cuts `chars[start..end]` into windows, calling `emit(start, end)` for each (trimmed).
fn window(chars: &[char], start: usize, end: usize, c: Chunking, mut emit: impl FnMut(usize, usize)) {
    let skip_ws = |mut i: usize| {
        while i < end && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let mut s = skip_ws(start);
    while s < end {
        let mut e = (s + c.size).min(end);
        if e < end {
            e = cut(chars, s, e, c.size);
        }
        let mut t = e;
        while t > s && chars[t - 1].is_whitespace() {
            t -= 1;
        }
        if t > s {
            emit(s, t);
        }
        if e >= end {
            break;
        }
        // The next window starts `overlap` back, at the start of a word.
        let mut n = e.saturating_sub(c.overlap).max(s + 1);
        while n < e && !chars[n - 1].is_whitespace() {
            n += 1;
        }
        s = skip_ws(n);
    }
}

/// Where to end a window that would end at `e`: the last paragraph break in its second half,
/// else the last line break, sentence end or space; `e` itself only inside an overlong word.
fn cut(chars: &[char], s: usize, e: usize, size: usize) -> usize {
    let half = s + size / 2;
    let find = |pred: &dyn Fn(usize) -> bool, from: usize| (from.max(s + 1)..=e).rev().find(|&i| pred(i));
    let para = |i: usize| i >= 2 && chars[i - 1] == '\n' && chars[i - 2] == '\n';
    let line = |i: usize| chars[i - 1] == '\n';
    let sentence = |i: usize| i >= 2 && chars[i - 1].is_whitespace() && matches!(chars[i - 2], '.' | '!' | '?');
    let space = |i: usize| chars[i - 1].is_whitespace() || (i < chars.len() && chars[i].is_whitespace());
    find(&para, half)
        .or_else(|| find(&line, half))
        .or_else(|| find(&sentence, half))
        .or_else(|| find(&space, s + 1))
        .unwrap_or(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_never_cut() {
        let text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu ".repeat(30);
        let chunks = split(&text, false, Chunking { size: 100, overlap: 20 });
        let words: std::collections::HashSet<&str> = text.split_whitespace().collect();
        for c in &chunks {
            assert!(c.text.chars().count() <= 100, "{}", c.text);
            for w in c.text.split_whitespace() {
                assert!(words.contains(w), "cut word {w:?}");
            }
        }
    }
}
