//! robots.txt (RFC 9309): the group for our product token (else `*`), its allow and disallow
//! rules with `*` and `$`, the longest match winning and allow winning a tie.

/// The rules of one robots.txt that apply to one user agent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Robots {
    /// `(allow, pattern)` pairs.
    rules: Vec<(bool, String)>,
    /// Seconds between requests the site asked for, if any.
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
    pub fn parse(text: &str, agent: &str) -> Robots {
        let agent = agent.to_ascii_lowercase();
        // Each group: its agents, rules and crawl delay.
        let mut groups: Vec<(Vec<String>, Robots)> = Vec::new();
        let mut in_agents = false;
        for line in text.lines() {
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
                        g.0.push(value.to_ascii_lowercase());
                    }
                }
                "allow" | "disallow" => {
                    in_agents = false;
                    if let Some(g) = groups.last_mut()
                        && !value.is_empty()
                    {
                        g.1.rules.push((key == "allow", value.to_string()));
                    }
                }
                "crawl-delay" => {
                    in_agents = false;
                    if let Some(g) = groups.last_mut() {
                        g.1.crawl_delay = value.parse().ok();
                    }
                }
                _ => {}
            }
        }
        let mut mine = Robots::default();
        let mut found = false;
        for (agents, rules) in &groups {
            if agents.iter().any(|a| a != "*" && agent.starts_with(a.as_str())) {
                mine.rules.extend(rules.rules.iter().cloned());
                mine.crawl_delay = mine.crawl_delay.or(rules.crawl_delay);
                found = true;
            }
        }
        if !found {
            for (agents, rules) in &groups {
                if agents.iter().any(|a| a == "*") {
                    mine.rules.extend(rules.rules.iter().cloned());
                    mine.crawl_delay = mine.crawl_delay.or(rules.crawl_delay);
                }
            }
        }
        mine
    }

    /// Whether the path (with its query) may be fetched.
    pub fn allows(&self, path: &str) -> bool {
        let mut best: Option<(usize, bool)> = None;
        for (allow, pattern) in &self.rules {
            if matches(pattern, path) {
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
    }
}
