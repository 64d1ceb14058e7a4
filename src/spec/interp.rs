//! `${env:NAME}` and `${env:NAME:-default}` in profile fields, URLs and headers: expanded at
//! run time, after any template, so a secret never passes through a template's scope.

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

/// [`expand_env`] over the process environment.
pub fn expand_process_env(text: &str) -> Result<String, String> {
    expand_env(text, |name| std::env::var(name).ok())
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
    fn an_unset_variable_is_named() {
        let e = expand_env("Bearer ${env:KEY}", env).unwrap_err();
        assert!(e.contains("`KEY`"), "{e}");
        assert!(expand_env("${oops", env).is_err());
        assert!(expand_env("${other:X}", env).is_err());
    }
}
