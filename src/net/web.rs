//! The web client of the I/O kinds. Every outbound request of http, search and scrape goes
//! through [`Web::fetch`]: a request and its response are plain data (so an exchange can be
//! recorded and replayed), and the guard, timeouts, size cap, redirects and concurrency bounds
//! are enforced in this one place. A web client given a cassette records every exchange
//! (robots.txt included) or, replaying, serves it from the cassette and never connects.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{OnceCell, Semaphore};
use url::Url;

use super::guard::{self, AllowList};
use super::http_error;
use super::record;
use super::robots::Robots;
use crate::cassette::{Cassette, ExchangeError};
use crate::error_class::ErrorClass;

/// An outbound request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// Names (lowercase) of headers whose values are secrets whatever their names (they came
    /// from `${env:NAME}`): never recorded, never sent to another host after a redirect.
    pub secret_headers: Vec<String>,
}

impl Request {
    pub fn get(url: impl Into<String>) -> Request {
        Request {
            method: "GET".into(),
            url: url.into(),
            headers: Vec::new(),
            body: None,
            secret_headers: Vec::new(),
        }
    }

    /// Whether the header `name` carries a credential: by its name, or because its value is a
    /// secret.
    pub fn is_secret_header(&self, name: &str) -> bool {
        is_sensitive(name) || self.secret_headers.iter().any(|h| h.eq_ignore_ascii_case(name))
    }
}

/// A response, its body read (up to the size cap).
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub status: u16,
    /// The URL that answered, after redirects.
    pub url: String,
    /// Header names in lowercase, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// The body was longer than the cap and was cut there.
    pub truncated: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn content_type(&self) -> Option<&str> {
        self.header("content-type")
    }

    /// The response, or a typed error for a 4xx or 5xx status.
    pub fn error_for_status(self) -> Result<Response, FetchError> {
        if self.status < 400 {
            return Ok(self);
        }
        let class = http_error::class_of_status(self.status).unwrap_or(ErrorClass::BadRequest);
        let reason = reqwest::StatusCode::from_u16(self.status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        Err(FetchError {
            class,
            message: format!("{} answered HTTP {} {reason}", host_of(&self.url), self.status)
                .trim_end()
                .to_string(),
            retry_after: http_error::retry_after(self.header("retry-after"), None, std::time::SystemTime::now()),
            status: Some(self.status),
        })
    }
}

/// What to do with a body longer than `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversize {
    /// Keep the first `max_bytes` and mark the response truncated.
    Truncate,
    /// Fail the request.
    Fail,
}

/// How one request is made.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Hosts and ranges this request may reach besides public addresses (the run's allow-list
    /// is added).
    pub allow: AllowList,
    /// For the whole exchange, redirects and body included.
    pub timeout: Duration,
    pub max_bytes: u64,
    pub oversize: Oversize,
    pub max_redirects: u32,
    /// When set, a response whose content type is none of these MIME types is refused before
    /// its body is read.
    pub accept: Option<Vec<String>>,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            allow: AllowList::default(),
            timeout: Duration::from_secs(30),
            max_bytes: 10 * 1024 * 1024,
            oversize: Oversize::Fail,
            max_redirects: 5,
            accept: None,
        }
    }
}

/// A failed request, classed as node errors are.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchError {
    pub class: ErrorClass,
    pub message: String,
    pub retry_after: Option<f64>,
    pub status: Option<u16>,
}

impl FetchError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> FetchError {
        FetchError {
            class,
            message: message.into(),
            retry_after: None,
            status: None,
        }
    }
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Run-wide settings of the web client.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// Added to every request's allow-list (`--allow-net`, `RUNNER_ALLOW_NET`).
    pub allow: AllowList,
    /// Requests in flight at once, all hosts together.
    pub max_connections: usize,
    /// Requests in flight at once to one host.
    pub per_host: usize,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            allow: AllowList::default(),
            max_connections: 64,
            per_host: 8,
        }
    }
}

/// The web client of a run (shared by every task).
#[derive(Debug)]
pub struct Web {
    config: WebConfig,
    overall: Arc<Semaphore>,
    hosts: Mutex<HashMap<String, Arc<Semaphore>>>,
    robots: Mutex<HashMap<String, Arc<OnceCell<Robots>>>>,
    /// `--record` / `--replay`: every fetch is an exchange of this cassette.
    cassette: Option<Arc<Cassette>>,
}

impl Default for Web {
    fn default() -> Self {
        Web::new(WebConfig::default())
    }
}

impl Web {
    pub fn new(config: WebConfig) -> Web {
        Web {
            overall: Arc::new(Semaphore::new(config.max_connections.max(1))),
            config,
            hosts: Mutex::new(HashMap::new()),
            robots: Mutex::new(HashMap::new()),
            cassette: None,
        }
    }

    /// This client, recording every exchange to `cassette` or replaying it from there.
    pub fn with_cassette(mut self, cassette: Option<Arc<Cassette>>) -> Web {
        self.cassette = cassette;
        self
    }

    /// The run's allow-list.
    pub fn allow(&self) -> &AllowList {
        &self.config.allow
    }

    /// Sends `req`, following redirects itself so that every hop is checked by the guard. With
    /// a cassette, the exchange (its failure included) is recorded, or served from it.
    pub async fn fetch(&self, req: Request, opts: &FetchOptions) -> Result<Response, FetchError> {
        let span = super::trace::request(&req);
        let result = tracing::Instrument::instrument(self.fetch_through(req, opts), span.clone()).await;
        super::trace::response(&span, &result);
        result
    }

    async fn fetch_through(&self, req: Request, opts: &FetchOptions) -> Result<Response, FetchError> {
        let Some(cassette) = &self.cassette else {
            return self.fetch_live(req, opts).await;
        };
        let key = record::request_value(&req);
        let live =
            async { Ok::<_, std::convert::Infallible>(record::outcome_value(&self.fetch_live(req, opts).await)) };
        match cassette.exchange(record::HTTP, key, live).await {
            Ok(recorded) => record::outcome_from(&recorded),
            // A miss is a bad request: not retried, and reported by the CLI after the run even
            // when an `on_error` handler absorbed it.
            Err(ExchangeError::Cassette(e)) => Err(FetchError::new(ErrorClass::BadRequest, e.to_string())),
            Err(ExchangeError::Live(never)) => match never {},
        }
    }

    async fn fetch_live(&self, req: Request, opts: &FetchOptions) -> Result<Response, FetchError> {
        let mut allow = opts.allow.clone();
        allow.extend(&self.config.allow);
        match tokio::time::timeout(opts.timeout, self.exchange(req, opts, &allow)).await {
            Ok(r) => r,
            Err(_) => Err(FetchError::new(
                ErrorClass::Timeout,
                format!("no complete response within {:?}", opts.timeout),
            )),
        }
    }

    async fn exchange(&self, mut req: Request, opts: &FetchOptions, allow: &AllowList) -> Result<Response, FetchError> {
        let mut url = parse_url(&req.url)?;
        let mut redirects = 0;
        loop {
            // A server trusted on its own port is not trusted on another one a redirect leads
            // to: each hop gets the allow-list of its port, and a client whose resolver
            // enforces that list.
            let allow = allow.for_port(url.port_or_known_default().unwrap_or(0));
            let client = self.client(&allow)?;
            check_target(&url, &allow)?;
            let host = host_of(url.as_str());
            let _overall = self.overall.clone().acquire_owned().await.map_err(closed)?;
            let _host = self.host_permit(&host).acquire_owned().await.map_err(closed)?;
            let method = reqwest::Method::from_bytes(req.method.as_bytes())
                .map_err(|_| FetchError::new(ErrorClass::BadRequest, format!("bad method `{}`", req.method)))?;
            let mut builder = client.request(method, url.clone());
            for (k, v) in &req.headers {
                builder = builder.header(k, v);
            }
            if let Some(body) = &req.body {
                builder = builder.body(body.clone());
            }
            let resp = builder.send().await.map_err(|e| classify(&e))?;
            let status = resp.status().as_u16();
            if matches!(status, 301 | 302 | 303 | 307 | 308)
                && let Some(loc) = resp.headers().get(reqwest::header::LOCATION)
            {
                if redirects >= opts.max_redirects {
                    return Err(FetchError::new(
                        ErrorClass::BadRequest,
                        format!("more than {} redirects from {host}", opts.max_redirects),
                    ));
                }
                redirects += 1;
                let loc = loc
                    .to_str()
                    .map_err(|_| FetchError::new(ErrorClass::BadRequest, "a redirect with a bad Location"))?;
                let next = url
                    .join(loc)
                    .map_err(|_| FetchError::new(ErrorClass::BadRequest, "a redirect with a bad Location"))?;
                if status == 303 || ((status == 301 || status == 302) && req.method != "GET" && req.method != "HEAD") {
                    req.method = "GET".into();
                    req.body = None;
                    req.headers.retain(|(k, _)| {
                        !k.eq_ignore_ascii_case("content-type") && !k.eq_ignore_ascii_case("content-length")
                    });
                }
                if next.host_str() != url.host_str() || next.port_or_known_default() != url.port_or_known_default() {
                    // Credentials meant for one host are not handed to another.
                    let headers = std::mem::take(&mut req.headers);
                    req.headers = headers.into_iter().filter(|(k, _)| !req.is_secret_header(k)).collect();
                }
                url = next;
                continue;
            }
            let headers: Vec<(String, String)> = resp
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            if let Some(accept) = &opts.accept
                && status < 300
            {
                let ct = resp
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
                if !ct.is_empty() && !accept.contains(&mime) {
                    return Err(FetchError::new(
                        ErrorClass::BadRequest,
                        format!("unsupported content type `{mime}` from {host}"),
                    ));
                }
            }
            let (body, truncated) = read_body(resp, opts.max_bytes, opts.oversize, &host).await?;
            return Ok(Response {
                status,
                url: url.to_string(),
                headers,
                body,
                truncated,
            });
        }
    }

    /// Whether robots.txt of the URL's site lets [`super::USER_AGENT`] fetch it. Read once per
    /// site and run; a missing robots.txt allows everything, a failing server nothing.
    pub async fn robots_allow(&self, url: &str, opts: &FetchOptions) -> Result<bool, FetchError> {
        let u = parse_url(url)?;
        let origin = u.origin().ascii_serialization();
        let cell = {
            let mut map = self.robots.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(origin.clone()).or_default().clone()
        };
        let robots = cell
            .get_or_try_init(|| async {
                let ropts = FetchOptions {
                    allow: opts.allow.clone(),
                    timeout: opts.timeout.min(Duration::from_secs(10)),
                    max_bytes: 512 * 1024,
                    oversize: Oversize::Truncate,
                    max_redirects: 5,
                    accept: None,
                };
                match self.fetch(Request::get(format!("{origin}/robots.txt")), &ropts).await {
                    Ok(r) if r.status < 300 => Ok(Robots::parse(&String::from_utf8_lossy(&r.body), "runner")),
                    Ok(r) if r.status < 500 => Ok(Robots::allow_all()),
                    Ok(_) => Ok(Robots::disallow_all()),
                    Err(e) => Err(e),
                }
            })
            .await?;
        let mut path = u.path().to_string();
        if let Some(q) = u.query() {
            path.push('?');
            path.push_str(q);
        }
        Ok(robots.allows(&path))
    }

    /// The client for `allow` (the guard lives in its resolver). Clients are kept for the
    /// process, not the run: a server's runs, a test file's cases and a run's tasks reuse their
    /// connections (and the TLS roots loaded once) instead of opening them again. The keys are
    /// the allow-lists workflows and settings declare (a host that comes from data adds none),
    /// with the idle connections kept per host.
    fn client(&self, allow: &AllowList) -> Result<reqwest::Client, FetchError> {
        static CLIENTS: std::sync::OnceLock<Mutex<HashMap<(String, usize), reqwest::Client>>> =
            std::sync::OnceLock::new();
        let key = (allow.key(), self.config.per_host);
        let mut map = CLIENTS
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let client = super::client_builder()
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would connect on our behalf to addresses the guard never saw.
            .no_proxy()
            .dns_resolver(guard::resolver(allow.clone()))
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(self.config.per_host)
            .build()
            .map_err(|e| FetchError::new(ErrorClass::Network, format!("cannot build the HTTP client: {e}")))?;
        map.insert(key, client.clone());
        Ok(client)
    }

    fn host_permit(&self, host: &str) -> Arc<Semaphore> {
        let mut map = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(host.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.config.per_host.max(1))))
            .clone()
    }
}

fn closed(_: tokio::sync::AcquireError) -> FetchError {
    FetchError::new(ErrorClass::Network, "the web client is shutting down")
}

fn parse_url(url: &str) -> Result<Url, FetchError> {
    let u = Url::parse(url).map_err(|e| FetchError::new(ErrorClass::BadRequest, format!("bad URL: {e}")))?;
    if u.scheme() != "http" && u.scheme() != "https" {
        return Err(FetchError::new(
            ErrorClass::BadRequest,
            format!("refused the `{}` scheme: only http and https are fetched", u.scheme()),
        ));
    }
    Ok(u)
}

/// The scheme and, for an address literal, the address (names are checked when resolved).
fn check_target(url: &Url, allow: &AllowList) -> Result<(), FetchError> {
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(FetchError::new(
            ErrorClass::BadRequest,
            format!("refused the `{}` scheme: only http and https are fetched", url.scheme()),
        ));
    }
    let ip = match url.host() {
        Some(url::Host::Ipv4(ip)) => std::net::IpAddr::V4(ip),
        Some(url::Host::Ipv6(ip)) => std::net::IpAddr::V6(ip),
        Some(url::Host::Domain(_)) => return Ok(()),
        None => return Err(FetchError::new(ErrorClass::BadRequest, "a URL without a host")),
    };
    allow
        .check(url.host_str().unwrap_or_default(), ip)
        .map_err(|m| FetchError::new(ErrorClass::BadRequest, m))
}

async fn read_body(
    mut resp: reqwest::Response,
    max: u64,
    oversize: Oversize,
    host: &str,
) -> Result<(Bytes, bool), FetchError> {
    let too_big = || {
        FetchError::new(
            ErrorClass::BadRequest,
            format!("the response from {host} is larger than {max} bytes"),
        )
    };
    if oversize == Oversize::Fail && resp.content_length().is_some_and(|n| n > max) {
        return Err(too_big());
    }
    let mut buf = BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| classify(&e))? {
        let room = max.saturating_sub(buf.len() as u64) as usize;
        if chunk.len() > room {
            if oversize == Oversize::Fail {
                return Err(too_big());
            }
            buf.extend_from_slice(&chunk[..room]);
            return Ok((buf.freeze(), true));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok((buf.freeze(), false))
}

fn is_sensitive(header: &str) -> bool {
    let h = header.to_ascii_lowercase();
    h == "authorization"
        || h == "cookie"
        || h == "proxy-authorization"
        || h.contains("token")
        || h.contains("api-key")
        || h.contains("apikey")
        || h.contains("secret")
}

/// A reqwest error as a fetch error; the message never carries the URL (it may hold a key).
fn classify(e: &reqwest::Error) -> FetchError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<guard::Refused>() {
            return FetchError::new(ErrorClass::BadRequest, r.0.clone());
        }
        source = s.source();
    }
    let class = if e.is_timeout() {
        ErrorClass::Timeout
    } else if e.is_body() || e.is_decode() {
        ErrorClass::Stream
    } else {
        ErrorClass::Network
    };
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    let host = e.url().map(|u| host_of(u.as_str())).unwrap_or_default();
    let msg = match e.url() {
        Some(u) => msg.replace(u.as_str(), &host),
        None => msg,
    };
    FetchError::new(class, msg)
}

/// `host[:port]` of a URL, for messages.
pub fn host_of(url: &str) -> String {
    Url::parse(url)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(|h| u.port().map_or_else(|| h.to_string(), |p| format!("{h}:{p}")))
        })
        .unwrap_or_else(|| "the server".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_error_classes() {
        let resp = |status: u16, headers: Vec<(&str, &str)>| Response {
            status,
            url: "http://api.example:8080/x?key=secret".into(),
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: Bytes::new(),
            truncated: false,
        };
        let e = resp(429, vec![("retry-after", "7")]).error_for_status().unwrap_err();
        assert_eq!((e.class, e.retry_after), (ErrorClass::RateLimit, Some(7.0)));
        assert!(!e.message.contains("secret"), "{}", e.message);
        assert!(e.message.contains("api.example:8080"), "{}", e.message);
        assert_eq!(
            resp(401, vec![]).error_for_status().unwrap_err().class,
            ErrorClass::Auth
        );
        assert_eq!(
            resp(503, vec![]).error_for_status().unwrap_err().class,
            ErrorClass::Server
        );
        assert_eq!(
            resp(404, vec![]).error_for_status().unwrap_err().class,
            ErrorClass::BadRequest
        );
        assert!(resp(204, vec![]).error_for_status().is_ok());
    }

    #[test]
    fn retry_after_is_read_by_the_shared_parser_and_capped() {
        let wait = |v: &str| {
            let resp = Response {
                status: 503,
                url: "http://api.example/".into(),
                headers: vec![("retry-after".into(), v.into())],
                body: Bytes::new(),
                truncated: false,
            };
            resp.error_for_status().unwrap_err().retry_after
        };
        assert_eq!(wait("3"), Some(3.0));
        assert_eq!(wait("Sun, 06 Nov 1994 08:49:37 GMT"), Some(0.0));
        assert_eq!(wait("soon"), None);
        let max = Some(http_error::MAX_RETRY_AFTER.as_secs_f64());
        assert_eq!((wait("inf"), wait("1e300")), (max, max));
        assert_eq!((wait("-1"), wait("NaN")), (None, None));
    }

    #[tokio::test]
    async fn other_schemes_are_refused() {
        let web = Web::default();
        let opts = FetchOptions::default();
        for url in ["file:///etc/passwd", "ftp://example.com/x", "gopher://x/"] {
            let e = web.fetch(Request::get(url), &opts).await.unwrap_err();
            assert_eq!(e.class, ErrorClass::BadRequest);
            assert!(e.message.contains("scheme"), "{}", e.message);
        }
    }
}
