//! The Studio page: the bundle built from `studio/` (committed in `studio/dist/`, so building
//! the crate needs no node) embedded in the binary and served at `GET /` and
//! `GET /studio/{*path}` on the API's own port. The page calls only the API.
//!
//! The bundle's file names are fixed (no content hashes), so every response is revalidated
//! (`Cache-Control: no-cache` with an `ETag` of its bytes: an unchanged file costs a 304), and
//! a client that takes gzip gets the file compressed once, at its first request.
//!
//! The page's one inline script (it starts the first view's requests before the bundle has
//! loaded) is allowed by its hash in the page's Content-Security-Policy, computed from the
//! embedded page, so no other inline script runs.
//!
//! A leaf of the server: it knows no other module of it. With `--api-key-env`, these paths are
//! served without the key ([`is_page`]); the page asks for it and sends it on every API call.

use std::sync::OnceLock;

use axum::body::Body;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// One file of the bundle.
struct Asset {
    /// Its path under `/studio/`.
    path: &'static str,
    body: &'static [u8],
    content_type: &'static str,
}

const INDEX: usize = 0;

/// The files of `studio/dist/`, as `vite build` names them (`studio/vite.config.js`).
static ASSETS: [Asset; 3] = [
    Asset {
        path: "index.html",
        body: include_bytes!("../../studio/dist/index.html"),
        content_type: "text/html; charset=utf-8",
    },
    Asset {
        path: "assets/studio.js",
        body: include_bytes!("../../studio/dist/assets/studio.js"),
        content_type: "text/javascript; charset=utf-8",
    },
    Asset {
        path: "assets/studio.css",
        body: include_bytes!("../../studio/dist/assets/studio.css"),
        content_type: "text/css; charset=utf-8",
    },
];

/// What the page may load and call: its own origin only (nothing from a network), and the
/// page's inline scripts by their hashes (`script-src` is filled in by [`csp`]).
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'self'; \
                   script-src 'self'";

/// The page's Content-Security-Policy: [`CSP`] with the hash of each inline script of `html`.
fn csp(html: &str) -> String {
    use base64::Engine as _;
    let mut policy = CSP.to_string();
    let mut rest = html;
    while let Some(at) = rest.find("<script") {
        rest = &rest[at..];
        let Some(open_end) = rest.find('>') else { break };
        let tag = &rest[..open_end];
        let body = &rest[open_end + 1..];
        let Some(close) = body.find("</script>") else { break };
        if !tag.contains(" src=") {
            let digest = Sha256::digest(&body.as_bytes()[..close]);
            policy.push_str(&format!(
                " 'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            ));
        }
        rest = &body[close..];
    }
    policy
}

/// Each asset's ETag and gzipped bytes, made at its first request.
struct Prepared {
    etag: HeaderValue,
    gzip: Vec<u8>,
    /// The page's Content-Security-Policy (the index's only).
    csp: Option<HeaderValue>,
}

static PREPARED: [OnceLock<Prepared>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];

fn prepared(i: usize) -> &'static Prepared {
    PREPARED[i].get_or_init(|| {
        let body = ASSETS[i].body;
        let digest = Sha256::digest(body);
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        let etag = HeaderValue::from_str(&format!("\"{hex}\"")).unwrap_or(HeaderValue::from_static("\"studio\""));
        let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 3), flate2::Compression::best());
        // Writing to a Vec cannot fail.
        let gzip = std::io::Write::write_all(&mut gz, body)
            .and_then(|()| gz.finish())
            .unwrap_or_default();
        let csp = (i == INDEX).then(|| {
            HeaderValue::from_str(&csp(&String::from_utf8_lossy(body))).unwrap_or(HeaderValue::from_static(CSP))
        });
        Prepared { etag, gzip, csp }
    })
}

/// Whether `path` is the page's (served without the API key).
pub(crate) fn is_page(path: &str) -> bool {
    path == "/" || path == "/studio" || path.starts_with("/studio/")
}

/// Whether the client takes gzip: `Accept-Encoding` names `gzip` (or `*`) with a weight above 0.
fn takes_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

fn respond(i: usize, headers: &HeaderMap) -> Response {
    let asset = &ASSETS[i];
    let prep = prepared(i);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim() == prep.etag.to_str().unwrap_or_default() || t.trim() == "*")
        });
    let mut out = HeaderMap::new();
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    out.insert(header::ETAG, prep.etag.clone());
    out.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    out.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if fresh {
        return (StatusCode::NOT_MODIFIED, out).into_response();
    }
    out.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    if let Some(csp) = &prep.csp {
        out.insert(header::CONTENT_SECURITY_POLICY, csp.clone());
        out.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    }
    let body = if takes_gzip(headers) && !prep.gzip.is_empty() {
        out.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        Body::from(prep.gzip.as_slice())
    } else {
        Body::from(asset.body)
    };
    (StatusCode::OK, out, body).into_response()
}

/// `GET /` and `GET /studio/`: the page.
pub(super) async fn index(headers: HeaderMap) -> Response {
    respond(INDEX, &headers)
}

/// `GET /studio/{*path}`: a file of the bundle; the page for `index.html`; 404 otherwise.
pub(super) async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    let path = path.trim_start_matches('/');
    if path.is_empty() {
        return respond(INDEX, &headers);
    }
    match ASSETS.iter().position(|a| a.path == path) {
        Some(i) => respond(i, &headers),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"detail": format!("No file {path} in the Studio page")})),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn gzip_is_sent_only_where_it_is_taken() {
        assert!(takes_gzip(&accept("gzip, deflate, br")));
        assert!(takes_gzip(&accept("br;q=1.0, gzip;q=0.5")));
        assert!(takes_gzip(&accept("*")));
        assert!(!takes_gzip(&accept("gzip;q=0")));
        assert!(!takes_gzip(&accept("br, deflate")));
        assert!(!takes_gzip(&HeaderMap::new()));
    }

    #[test]
    fn the_page_paths_are_the_pages() {
        assert!(is_page("/") && is_page("/studio") && is_page("/studio/assets/studio.js"));
        assert!(!is_page("/studios") && !is_page("/threads") && !is_page("/ok"));
    }

    /// The page's inline script is allowed by its hash, and only it: a script with a source
    /// needs none, and the hash is of the script's text as the browser hashes it.
    #[test]
    fn the_inline_script_is_allowed_by_its_hash() {
        let policy = csp("<head><script>let a = 1;</script><script type=\"module\" src=\"/x.js\"></script></head>");
        // printf 'let a = 1;' | openssl dgst -sha256 -binary | base64
        assert!(
            policy.ends_with("script-src 'self' 'sha256-xY6QKfH9PRsQnLz56nj6MBwiK5oHg+im1Jkpdp1x/Ck='"),
            "{policy}"
        );
        let page = csp(std::str::from_utf8(ASSETS[INDEX].body).unwrap());
        assert_eq!(page.matches("'sha256-").count(), 1, "{page}");
    }

    #[test]
    fn the_bundle_is_embedded_whole() {
        let html = std::str::from_utf8(ASSETS[INDEX].body).unwrap();
        // The page names the bundle's files as this module serves them.
        for a in &ASSETS[1..] {
            assert!(html.contains(&format!("/studio/{}", a.path)), "{html}");
        }
        for (i, asset) in ASSETS.iter().enumerate() {
            let p = prepared(i);
            let mut unzipped = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(p.gzip.as_slice()), &mut unzipped).unwrap();
            assert_eq!(unzipped, asset.body);
        }
    }
}
