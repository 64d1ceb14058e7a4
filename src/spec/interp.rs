//! `${env:NAME}` and `${env:NAME:-default}` in profile fields, URLs and headers: expanded at
//! run time in the workflow's own text only. A template's literal text is expanded, never what
//! it renders from data: an input holding `${env:OPENAI_API_KEY}` is just text.

/// Expands every `${env:NAME}` in `text` through `lookup`. An unset variable without a
/// default is an error naming the variable (never its value).
pub fn expand_env(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let close = after.find('}').ok_or("`${` is not closed")?;
        let inner = &after[..close];
        let body = inner
            .strip_prefix("env:")
            .ok_or_else(|| format!("`${{{inner}}}` is not an interpolation runner knows"))?;
        let (name, default) = match body.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (body, None),
        };
        match lookup(name).filter(|v| !v.is_empty()) {
            Some(v) => out.push_str(&v),
            None => match default {
                Some(d) => out.push_str(d),
                None => return Err(format!("the environment variable `{name}` is not set")),
            },
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// One `${env:...}` of a text: where it is, and the variable it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvRef<'a> {
    /// Byte range of the whole `${env:...}` in the text.
    pub range: std::ops::Range<usize>,
    pub name: &'a str,
    pub default: Option<&'a str>,
}

/// Every `${env:...}` in `text`, in order. Other `${...}` are left alone (they are text); a
/// `${env:` that is not closed is an error.
pub fn env_refs(text: &str) -> Result<Vec<EnvRef<'_>>, String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("${env:").map(|i| i + from) {
        let body_start = i + "${env:".len();
        let close = text[body_start..]
            .find('}')
            .map(|c| c + body_start)
            .ok_or("`${env:` is not closed")?;
        let body = &text[body_start..close];
        let (name, default) = match body.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (body, None),
        };
        out.push(EnvRef {
            range: i..close + 1,
            name,
            default,
        });
        from = close + 1;
    }
    Ok(out)
}

/// The value of one reference through `lookup`, and whether it came from the environment (a
/// secret) rather than from the default written in the workflow.
pub fn resolve(r: &EnvRef<'_>, lookup: impl Fn(&str) -> Option<String>) -> Result<(String, bool), String> {
    match lookup(r.name).filter(|v| !v.is_empty()) {
        Some(v) => Ok((v, true)),
        None => match r.default {
            Some(d) => Ok((d.to_string(), false)),
            None => Err(format!("the environment variable `{}` is not set", r.name)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::expand_env;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("example.test".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands_values_and_defaults() {
        assert_eq!(
            expand_env("http://${env:HOST}/v1", env).unwrap(),
            "http://example.test/v1"
        );
        assert_eq!(
            expand_env("${env:NOPE:-http://127.0.0.1:8888}", env).unwrap(),
            "http://127.0.0.1:8888"
        );
        assert_eq!(expand_env("${env:EMPTY:-d}", env).unwrap(), "d");
        assert_eq!(expand_env("plain", env).unwrap(), "plain");
    }

    #[test]
    fn references_are_found_with_their_ranges() {
        let text = "a ${env:HOST} b ${x} ${env:NOPE:-d}";
        let refs = super::env_refs(text).unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(&text[refs[0].range.clone()], "${env:HOST}");
        assert_eq!((refs[1].name, refs[1].default), ("NOPE", Some("d")));
        assert_eq!(super::resolve(&refs[0], env).unwrap(), ("example.test".into(), true));
        assert_eq!(super::resolve(&refs[1], env).unwrap(), ("d".into(), false));
        assert!(super::env_refs("${env:OPEN").is_err());
    }

    #[test]
    fn an_unset_variable_is_named() {
        let e = expand_env("Bearer ${env:KEY}", env).unwrap_err();
        assert!(e.contains("`KEY`"), "{e}");
        assert!(expand_env("${oops", env).is_err());
        assert!(expand_env("${other:X}", env).is_err());
    }
}
