//! robots.txt (RFC 9309): the groups whose product token is ours (else `*`), their allow and
//! disallow rules with `*` and `$`, paths compared in one percent-encoded form, the longest
//! match winning and allow winning a tie.

use super::http_error;

/// The rules of one robots.txt that apply to one user agent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Robots {
    /// `(allow, pattern)` pairs, patterns normalised as paths are (see [`normalise`]).
    rules: Vec<(bool, String)>,
    /// Seconds between requests the site asked for, if any (at most
    /// [`http_error::MAX_RETRY_AFTER`]).
    pub crawl_delay: Option<f64>,
}

impl Robots {
    /// Everything allowed (no robots.txt, or one that could not be read as a client error).
    pub fn allow_all() -> Robots {
        Robots::default()
    }

    /// Everything disallowed (the server failed to answer for its robots.txt).
    pub fn disallow_all() -> Robots {
        Robots {
            rules: vec![(false, "/".into())],
            crawl_delay: None,
        }
    }

    /// The rules of `text` for the agent whose product token is `agent` (e.g. `runner`).
    /// A group applies when one of its `user-agent` lines names that product token, compared
    /// case-insensitively and whole (`run` is not `runner`; `Runner/1.0` is); every group
    /// that applies is combined, and the `*` groups apply only when none does.
    pub fn parse(text: &str, agent: &str) -> Robots {
        // Each group: its product tokens, rules and crawl delay.
        let mut groups: Vec<(Vec<String>, Robots)> = Vec::new();
        let mut in_agents = false;
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for line in text.split(['\n', '\r']) {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let key = key.trim().to_ascii_lowercase();
            let value = value.trim();
            match key.as_str() {
                "user-agent" => {
                    if !in_agents || groups.is_empty() {
                        groups.push((Vec::new(), Robots::default()));
                    }
                    in_agents = true;
                    if let Some(g) = groups.last_mut() {
                        g.0.push(product_token(value));
                    }
                }
                "allow" | "disallow" => {
                    in_agents = false;
                    if let Some(g) = groups.last_mut()
                        && !value.is_empty()
                    {
                        g.1.rules.push((key == "allow", normalise(value)));
                    }
                }
                "crawl-delay" => {
                    in_agents = false;
                    if let Some(g) = groups.last_mut() {
                        g.1.crawl_delay = value
                            .parse::<f64>()
                            .ok()
                            .filter(|d| *d >= 0.0)
                            .map(|d| d.min(http_error::MAX_RETRY_AFTER.as_secs_f64()));
                    }
                }
                _ => {}
            }
        }
        let ours = |token: &String| !token.is_empty() && token != "*" && token.eq_ignore_ascii_case(agent);
        let mut mine = Robots::default();
        let mut found = false;
        for (tokens, rules) in &groups {
            if tokens.iter().any(ours) {
                mine.rules.extend(rules.rules.iter().cloned());
                mine.crawl_delay = mine.crawl_delay.or(rules.crawl_delay);
                found = true;
            }
        }
        if !found {
            for (tokens, rules) in &groups {
                if tokens.iter().any(|t| t == "*") {
                    mine.rules.extend(rules.rules.iter().cloned());
                    mine.crawl_delay = mine.crawl_delay.or(rules.crawl_delay);
                }
            }
        }
        mine
    }

    /// Whether the path (with its query) may be fetched. `/robots.txt` always may.
    pub fn allows(&self, path: &str) -> bool {
        let path = normalise(path);
        if path == "/robots.txt" {
            return true;
        }
        let mut best: Option<(usize, bool)> = None;
        for (allow, pattern) in &self.rules {
            if matches(pattern, &path) {
                let len = pattern.len();
                best = match best {
                    Some((l, a)) if l > len || (l == len && a) => Some((l, a)),
                    _ => Some((len, *allow)),
                };
            }
        }
        best.is_none_or(|(_, allow)| allow)
    }
}

/// The product token of a `user-agent` value: its leading letters, `-` and `_` (RFC 9309's
/// `identifier`), or `*`. What follows (a version, a comment) is not part of it.
fn product_token(value: &str) -> String {
    if value.starts_with('*') {
        return "*".into();
    }
    value
        .chars()
        .take_while(|c| c.is_ascii_alphabetic() || *c == '-' || *c == '_')
        .collect()
}

/// A path or pattern in the one form they are compared in: an escape of an unreserved
/// character (`%41`) decoded, other escapes in uppercase hex, and every octet that may not
/// appear in a URI as written (non-ASCII, controls, space) escaped. `/a%2fb` stays distinct
/// from `/a/b`, as RFC 3986 says it is.
fn normalise(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let hex = |at: usize| bytes.get(at).and_then(|c| (*c as char).to_digit(16));
        if b == b'%'
            && let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2))
        {
            let decoded = (hi * 16 + lo) as u8;
            if decoded.is_ascii_alphanumeric() || b"-._~".contains(&decoded) {
                out.push(decoded as char);
            } else {
                out.push('%');
                out.push(HEX[hi as usize] as char);
                out.push(HEX[lo as usize] as char);
            }
            i += 3;
            continue;
        }
        if b.is_ascii_graphic() {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        }
        i += 1;
    }
    out
}

/// A robots pattern against a path: `*` matches any run of characters, a final `$` anchors.
fn matches(pattern: &str, path: &str) -> bool {
    let (pattern, anchored) = match pattern.strip_suffix('$') {
        Some(p) => (p, true),
        None => (pattern, false),
    };
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut pos = 0;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            if !path.starts_with(part) {
                return false;
            }
            pos = part.len();
        } else if i == parts.len() - 1 && anchored {
            return path.len() >= pos + part.len() && path.ends_with(part);
        } else {
            match path[pos..].find(part) {
                Some(at) => pos += at + part.len(),
                None => return false,
            }
        }
    }
    !anchored || pos == path.len() || (parts.len() > 1 && parts.last() == Some(&""))
}

#[cfg(test)]
mod tests {
    use super::Robots;

    const TXT: &str = "\
# comments are ignored
User-agent: *
Disallow: /private/
Allow: /private/open.html
Disallow: /*.pdf$
Crawl-delay: 1.5

User-agent: otherbot
User-agent: runner
Disallow: /no-runner
";

    #[test]
    fn our_group_wins_over_the_star_group() {
        let r = Robots::parse(TXT, "runner");
        assert!(!r.allows("/no-runner/x"));
        assert!(r.allows("/private/page"), "the * group does not apply once ours exists");
    }

    #[test]
    fn the_longest_rule_wins_and_wildcards_match() {
        let r = Robots::parse(TXT, "somebot");
        assert!(!r.allows("/private/page.html"));
        assert!(r.allows("/private/open.html"));
        assert!(!r.allows("/files/report.pdf"));
        assert!(r.allows("/files/report.pdf?x=1"));
        assert!(r.allows("/public"));
        assert_eq!(r.crawl_delay, Some(1.5));
    }

    #[test]
    fn empty_disallow_and_failures() {
        assert!(Robots::parse("User-agent: *\nDisallow:\n", "runner").allows("/a"));
        assert!(Robots::allow_all().allows("/a"));
        assert!(!Robots::disallow_all().allows("/a"));
        let tie = Robots::parse("User-agent: *\nDisallow: /a\nAllow: /a\n", "runner");
        assert!(tie.allows("/a"));
        assert!(Robots::disallow_all().allows("/robots.txt"));
    }

    #[test]
    fn the_product_token_matches_whole_and_without_case() {
        let txt = "User-agent: run\nDisallow: /\n\nUser-agent: *\nDisallow: /star\n";
        let r = Robots::parse(txt, "runner");
        assert!(r.allows("/page"), "a group for `run` is not one for `runner`");
        assert!(!r.allows("/star"));
        for agent in ["RUNNER", "Runner/1.0", "runner (+https://x)"] {
            let r = Robots::parse(&format!("User-agent: {agent}\nDisallow: /\n"), "runner");
            assert!(!r.allows("/page"), "{agent}");
        }
        let r = Robots::parse("User-agent: runnerbot\nDisallow: /\n", "runner");
        assert!(r.allows("/page"), "a longer token is another crawler");
        let r = Robots::parse("User-Agent: *\r\nDisallow: /x\rAllow: /x/y\r", "runner");
        assert!(!r.allows("/x/z") && r.allows("/x/y"), "CR and CRLF end lines too");
    }

    #[test]
    fn paths_and_patterns_compare_percent_encoded() {
        let txt = "User-agent: *\nDisallow: /caf\u{e9}\nDisallow: /%7Euser/\nDisallow: /a%2fb\nDisallow: /%E2%83%85$\n";
        let r = Robots::parse(txt, "runner");
        // A rule written in UTF-8 and a path sent encoded (either case of hex) are one path.
        assert!(!r.allows("/caf%C3%A9"));
        assert!(!r.allows("/caf%c3%a9/menu"));
        // An escaped unreserved character is that character.
        assert!(!r.allows("/~user/x"));
        assert!(!r.allows("/%7euser/x"));
        // A reserved character escaped is not the character.
        assert!(!r.allows("/a%2Fb"));
        assert!(r.allows("/a/b"));
        assert!(!r.allows("/\u{20c5}"));
        assert!(r.allows("/%E2%83%85/more"));
        let r = Robots::parse("User-agent: *\nDisallow: /a/b\n", "runner");
        assert!(r.allows("/a%2Fb"));
    }
}
