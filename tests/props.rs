//! No bytes from outside panic the parsers that read them: HTML extraction (documents and
//! scraped pages), robots.txt, server-sent events, Retry-After and other server-supplied
//! delays, cassette files and the replies they hold, mock scripts, and `--input` values.
//!
//! Each property runs a modest number of cases by default (seconds in CI); set
//! `PROPTEST_CASES` for a long run, e.g. `PROPTEST_CASES=20000 cargo test --release --test
//! integration props::`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use runner::cassette::Cassette;
use runner::net::http_error::{self, MAX_RETRY_AFTER};
use runner::net::robots::Robots;
use runner::providers::cassette::{Replaying, request_key};
use runner::providers::mock::MockProvider;
use runner::providers::sse::{Event, Parser};
use runner::providers::{ChatRequest, Message, Provider, ProviderError};
use serde_json::{Value, json};

/// `default` cases unless `PROPTEST_CASES` says otherwise.
pub(crate) fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Text made of the pieces a parser cares about, mixed with arbitrary characters.
fn tokens(pieces: &'static [&'static str], max: usize) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => proptest::sample::select(pieces).prop_map(str::to_string),
        1 => "\\PC{0,6}",
        1 => "[&;#<>/%*$:\\n\\r ]{1,3}",
        1 => "[\u{e9}\u{d7}\u{65e5}\u{672c}\u{1f600}\u{a0}\u{feff}]{1,6}",
    ];
    proptest::collection::vec(piece, 0..max).prop_map(|v| v.concat())
}

const HTML: &[&str] = &[
    "<p>",
    "</p>",
    "<h1>",
    "</h1>",
    "<h3 id=x>",
    "</h3>",
    "<pre>",
    "</pre>",
    "<code>",
    "</code>",
    "<ul><li>",
    "</li>",
    "<table><tr><td>",
    "</td>",
    "<a href='/x'>",
    "</a>",
    "<script>",
    "</script>",
    "<style>",
    "<!--",
    "-->",
    "<title>",
    "</title>",
    "<br/>",
    "<img src=x>",
    "&",
    "&amp;",
    "&nbsp;",
    "&#x1F600;",
    "&#99999999;",
    "&#;",
    "&lt",
    "<![CDATA[",
    "<svg>",
    "<nav>",
    "<body>",
    "<html>",
    "<!doctype html>",
    "<",
    ">",
    "\"",
    "'",
    "=",
    "```",
    "#",
    "\n",
];

const ROBOTS: &[&str] = &[
    "User-agent: ",
    "user-agent:",
    "Disallow: ",
    "Allow: ",
    "Crawl-delay: ",
    "runner",
    "Runner/1.0",
    "run",
    "*",
    "$",
    "/",
    "/a",
    "%",
    "%2F",
    "%7e",
    "%E2%83%85",
    "%zz",
    "#",
    "\n",
    "\r\n",
    "\r",
    "?",
    "inf",
    "1e300",
    "-1",
    "NaN",
];

const SSE: &[&str] = &[
    "data: ",
    "data:",
    "event: ",
    "id: ",
    "retry: ",
    ": keep-alive",
    "\n",
    "\r\n",
    "\r",
    "\n\n",
    "[DONE]",
    "{\"a\":1}",
    "\u{feff}",
];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn request() -> ChatRequest {
    ChatRequest {
        node: "n".into(),
        model: "m".into(),
        messages: vec![Message::new("user", "hi")],
        stream: true,
        ..ChatRequest::default()
    }
}

/// JSON values of any shape, with the field names and values replies and scripts use.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![Just(1e300), Just(f64::MAX), Just(-1.0), Just(0.01), Just(300.0)].prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::from),
        proptest::sample::select(
            &[
                "rate_limit",
                "server",
                "timeout",
                "network",
                "stream",
                "bad_request",
                "auth",
                "malformed",
                "too_large",
                "nonsense",
                "",
            ][..]
        )
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = proptest::sample::select(
            &[
                "text",
                "chunks",
                "usage",
                "error",
                "retry_after",
                "delay",
                "status",
                "message",
                "class",
                "tool_calls",
                "finish_reason",
                "prompt_tokens",
                "completion_tokens",
                "replies",
                "match",
                "contains",
                "reply",
                "*",
                "n",
                "vectors",
            ][..],
        );
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((key, inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn html_documents_always_extract(html in tokens(HTML, 60), bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        use runner::rag::extract::{Format, extract};
        for input in [html.as_bytes(), &bytes[..]] {
            prop_assert!(extract(input, Format::Html).is_ok());
            let _ = extract(input, Format::sniff(input));
            let _ = extract(input, Format::Markdown);
        }
    }

    #[test]
    fn scraped_pages_always_extract(html in tokens(HTML, 60)) {
        use runner::net::extract::{DocType, extract};
        for doc in [DocType::Html, DocType::Text, DocType::Markdown] {
            let e = extract(&html, doc, "http://example.test/page");
            prop_assert!((0.0..=1.0).contains(&e.quality_score), "{}", e.quality_score);
        }
    }

    #[test]
    fn robots_txt_never_panics_and_reads_escapes_as_their_characters(
        text in tokens(ROBOTS, 40),
        path in "/[a-z/~._-]{0,12}",
        at in any::<prop::sample::Index>(),
        noise in tokens(ROBOTS, 6),
    ) {
        let r = Robots::parse(&text, "runner");
        let _ = r.allows(&noise);
        prop_assert!(r.allows("/robots.txt"));
        if let Some(d) = r.crawl_delay {
            prop_assert!((0.0..=MAX_RETRY_AFTER.as_secs_f64()).contains(&d));
        }
        // A path with one unreserved character percent-encoded is the same path.
        let i = at.index(path.len());
        let c = path.as_bytes()[i];
        if c != b'/' {
            let encoded = format!("{}%{c:02X}{}", &path[..i], &path[i + 1..]);
            prop_assert_eq!(r.allows(&path), r.allows(&encoded), "{} vs {}", path, encoded);
        }
    }

    #[test]
    fn sse_events_do_not_depend_on_how_the_bytes_are_cut(
        text in tokens(SSE, 40),
        raw in proptest::collection::vec(any::<u8>(), 0..64),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        for bytes in [text.as_bytes(), &raw[..]] {
            let whole = events(&[bytes]);
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            at.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for to in at {
                pieces.push(&bytes[from..to]);
                from = to;
            }
            pieces.push(&bytes[from..]);
            prop_assert_eq!(events(&pieces), whole);
        }
    }

    #[test]
    fn retry_after_is_a_bounded_wait_or_nothing(
        value in prop_oneof![
            "\\PC{0,30}",
            "[-+]?[0-9]{0,400}(\\.[0-9]{0,5})?(e[-+]?[0-9]{1,4})?",
            proptest::sample::select(&["inf", "-inf", "NaN", "infinity", "1e300", "Sun, 06 Nov 2094 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMT"][..]).prop_map(str::to_string),
        ],
        ms in proptest::option::of("[-0-9.einfa]{0,12}"),
        secs in any::<f64>(),
    ) {
        let max = MAX_RETRY_AFTER.as_secs_f64();
        if let Some(wait) = http_error::retry_after(Some(&value), ms.as_deref(), SystemTime::now()) {
            prop_assert!((0.0..=max).contains(&wait), "{value:?} gave {wait}");
        }
        prop_assert!(http_error::delay(secs, MAX_RETRY_AFTER) <= MAX_RETRY_AFTER);
        if let Some(ProviderError::RateLimited { retry_after: Some(wait) }) =
            ProviderError::named("rate_limit", String::new(), None, Some(secs))
        {
            prop_assert!((0.0..=max).contains(&wait), "{secs} gave {wait}");
        }
    }

    #[test]
    fn cassettes_of_any_lines_load_or_are_refused_and_replies_replay(
        lines in proptest::collection::vec(prop_oneof![
            json_value().prop_map(|v| v.to_string()),
            json_value().prop_map(|v| json!({"kind": "llm", "request": request_key(&request()), "response": v}).to_string()),
            "\\PC{0,40}",
        ], 0..6),
        asked in json_value(),
    ) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("c.jsonl");
        let text = std::iter::once(json!({"cassette": "runner", "version": 1}).to_string())
            .chain(lines)
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&path, text).expect("write the cassette");
        if let Ok(cassette) = Cassette::replay_with(&path, vec!["sk-secret".into()]) {
            let cassette = Arc::new(cassette);
            let _ = cassette.serve("http", &asked);
            let provider = Replaying::new(cassette.clone());
            let rt = runtime();
            for _ in 0..3 {
                let sink = |_: &str| {};
                let _ = rt.block_on(provider.chat(request(), Some(&sink)));
            }
            let _ = cassette.misses();
        }
    }

    #[test]
    fn mock_scripts_of_any_shape_load_or_are_refused_and_answer(script in json_value()) {
        let script = match script {
            Value::Object(m) if m.contains_key("replies") || m.contains_key("match") => Value::Object(m),
            other => json!({"replies": {"n": other}}),
        };
        if let Ok(mock) = MockProvider::from_value(&script) {
            let rt = runtime();
            for _ in 0..3 {
                let sink = |_: &str| {};
                // A scripted delay may be long: a moment of it is enough.
                let _ = rt.block_on(async {
                    tokio::time::timeout(Duration::from_millis(20), mock.chat(request(), Some(&sink))).await
                });
            }
        }
    }

    #[test]
    fn input_values_parse_as_json_or_text(key in "[a-z_]{0,6}", value in "([^@\\PC]|[ =]|\\PC){0,24}", file in "\\PC{0,40}") {
        use runner::cli::parse_kv;
        let value = value.trim_start_matches('@').to_string();
        match parse_kv(&format!("{key}={value}")) {
            Ok((k, v)) => {
                prop_assert_eq!(&k, &key);
                let expected = serde_json::from_str(&value).unwrap_or_else(|_| Value::String(value.clone()));
                prop_assert_eq!(v, expected);
            }
            Err(_) => prop_assert!(key.is_empty()),
        }
        prop_assert!(parse_kv(&value.replace('=', "")).is_err());
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("v.txt");
        std::fs::write(&path, &file).expect("write the value");
        let (_, v) = parse_kv(&format!("k=@{}", path.display())).expect("a file value");
        prop_assert_eq!(v, Value::String(file));
        let missing = format!("k=@{}", dir.path().join("missing").display());
        prop_assert!(parse_kv(&missing).is_err());
    }
}

fn events(pieces: &[&[u8]]) -> Vec<Event> {
    let mut p = Parser::new();
    let mut out: Vec<Event> = pieces.iter().flat_map(|c| p.push(c)).collect();
    out.extend(p.finish());
    out
}
