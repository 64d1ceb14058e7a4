//! PostgreSQL connections, shared by the stores that live on PostgreSQL (the checkpointer, the
//! data store): the URL they are given, TLS, the pool, how a client error reads, and the lock
//! their migrations take. A leaf: it knows neither store.
//!
//! The URL is libpq's (`postgres://user:password@host:port/db?sslmode=require`); runner reads
//! parameters of its own and passes the rest on: `schema` (the schema runner's tables live in,
//! default `runner`, set as the connections' search_path), `pool_size` (connections kept per
//! process and store, default 8), `pgvector` (`auto`, `on` or `off`: whether the data store
//! keeps its vectors with the pgvector extension; the checkpointer ignores it),
//! `statement_timeout` (PostgreSQL's own setting, set on every connection: a statement that
//! runs longer is cancelled by the server and its call fails, saying so; `30s`, `500ms`,
//! `2min`, a number of milliseconds; none by default), `retry_for` (how long a call keeps
//! trying a database it cannot reach — restarting, failing over, its connections terminated or
//! exhausted — before it fails; the same units, default 20 s), `connect_timeout` as libpq's
//! (default 10 s), and libpq's keepalive parameters and `tcp_user_timeout` (milliseconds, as
//! libpq reads it), whose defaults here find a silent server out within about a minute
//! ([`SILENCE`]) and which the server is asked to mirror; and
//! `idle_in_transaction_session_timeout` (PostgreSQL's own; default 60 s: a transaction whose
//! client is gone ends, and its locks with it). A setting the URL's `options` give is left as
//! it is. TLS is rustls with the platform's roots
//! (`sslmode=prefer`, libpq's default, tries it and falls back to plain text; `require`
//! insists). Messages name the host, port, database and schema, never the password.

mod tls;

use std::time::Duration;

use deadpool_postgres::Pool;

/// Connections a store keeps by default.
pub const DEFAULT_POOL_SIZE: usize = 8;
/// How long a call waits for a free connection before it fails (the pool is exhausted: every
/// connection is busy, or the server refuses new ones).
pub const POOL_WAIT: Duration = Duration::from_secs(30);
/// How long a call keeps trying a database it cannot reach unless the URL says (`retry_for`).
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(20);
/// How long a connection may go without an answer from the server's host (its probes or its
/// data unacknowledged) before it is taken for broken, unless the URL says (libpq's
/// `keepalives_idle`, `keepalives_interval`, `keepalives_retries`, `tcp_user_timeout`).
pub const SILENCE: Duration = Duration::from_secs(60);
/// How long a connection's transaction may sit idle before the server ends it, unless the URL
/// says (`idle_in_transaction_session_timeout`, PostgreSQL's own setting; `0`: never). runner
/// never leaves one idle: one that is has lost its client.
pub const IDLE_IN_TRANSACTION: &str = "60s";
/// The schema the tables live in unless the URL names another.
pub const DEFAULT_SCHEMA: &str = "runner";
/// The advisory lock every migration of runner's schema holds (an arbitrary constant: "runner"
/// in ASCII), whichever store migrates: two stores creating the same schema at once would
/// otherwise race on `CREATE SCHEMA IF NOT EXISTS`.
pub const MIGRATION_LOCK: i64 = 0x72_75_6e_6e_65_72;

/// Whether the data store keeps its vectors with pgvector (the URL's `pgvector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pgvector {
    /// When the server has the extension (created if it is not yet): vectors in `vector`
    /// columns, nearest chunks found by the server; else in `real[]`, scored in-process.
    #[default]
    Auto,
    /// Always: a server without the extension is an error.
    On,
    /// Never: vectors in `real[]`, scored in-process, the extension left alone.
    Off,
}

/// What a URL says.
pub struct Target {
    pub config: tokio_postgres::Config,
    pub schema: String,
    pub pool_size: usize,
    pub pgvector: Pgvector,
    /// How long a call keeps trying a database it cannot reach.
    pub retry_for: Duration,
    /// The host, port, database and schema, for messages (no password).
    pub display: String,
}

/// Reads a URL: libpq's form, plus runner's own parameters. Errors never repeat the URL (it may
/// hold a password).
pub fn parse_url(text: &str) -> Result<Target, String> {
    let bad = |why: String| format!("the PostgreSQL URL is not valid: {why}");
    let mut url = url::Url::parse(text).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(bad(format!("the scheme is `{}`, not `postgres`", url.scheme())));
    }
    let mut schema = DEFAULT_SCHEMA.to_owned();
    let mut pool_size = DEFAULT_POOL_SIZE;
    let mut pgvector = Pgvector::Auto;
    let mut statement_timeout = None;
    let mut idle_in_transaction = IDLE_IN_TRANSACTION.to_owned();
    let mut retry_for = DEFAULT_RETRY_FOR;
    // libpq's 0: the system's default.
    let mut tcp_user_timeout = None;
    let mut kept = Vec::new();
    for (key, value) in url.query_pairs() {
        match &*key {
            "schema" => schema = value.into_owned(),
            "pool_size" => {
                pool_size = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| bad(format!("`pool_size={value}` is not a number from 1 to 1000")))?;
            }
            "statement_timeout" => {
                statement_timeout = Some(duration(&value).ok_or_else(|| {
                    bad(format!(
                        "`statement_timeout={value}` is not a duration (a number with ms, s, min, h or d, or of milliseconds)"
                    ))
                })?);
            }
            "idle_in_transaction_session_timeout" => {
                idle_in_transaction = duration(&value).ok_or_else(|| {
                    bad(format!(
                        "`idle_in_transaction_session_timeout={value}` is not a duration (a number with ms, s, min, \
                         h or d, or of milliseconds)"
                    ))
                })?;
            }
            "retry_for" => {
                retry_for = duration(&value).and_then(|d| to_duration(&d)).ok_or_else(|| {
                    bad(format!(
                        "`retry_for={value}` is not a duration (a number with ms, s, min, h or d, or of milliseconds)"
                    ))
                })?;
            }
            // libpq's is in milliseconds (tokio-postgres would read seconds).
            "tcp_user_timeout" => {
                let ms = value
                    .parse::<u64>()
                    .map_err(|_| bad(format!("`tcp_user_timeout={value}` is not a number of milliseconds")))?;
                tcp_user_timeout = Some(Duration::from_millis(ms));
            }
            "pgvector" => {
                pgvector = match &*value {
                    "auto" => Pgvector::Auto,
                    "on" => Pgvector::On,
                    "off" => Pgvector::Off,
                    other => return Err(bad(format!("`pgvector={other}` is not `auto`, `on` or `off`"))),
                }
            }
            _ => kept.push((key.into_owned(), value.into_owned())),
        }
    }
    if schema.is_empty()
        || schema.len() > 63
        || !schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        || !schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(bad(format!(
            "`schema={schema}` must be a lowercase SQL name (letters, digits, `_`; 63 at most)"
        )));
    }
    let given = |name: &str| kept.iter().any(|(key, _)| key == name);
    let [idle, interval, retries] =
        ["keepalives_idle", "keepalives_interval", "keepalives_retries"].map(|name| !given(name));
    if kept.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(&kept);
        // Written as a form writes them, spaces became `+`, which libpq's reading (and
        // tokio-postgres's) keeps as a plus: `options=-c%20x%3Dy` would reach the server as
        // `-c+x=y`. A plus the URL held is written `%2B`, so each `+` here was a space.
        let query = url.query().unwrap_or_default().replace('+', "%20");
        url.set_query(Some(&query));
    }
    let mut config: tokio_postgres::Config = url.as_str().parse().map_err(|e| bad(format!("{e}")))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config.application_name("runner");
    // A server that goes silent (its host lost, the network cut: no reset ever comes) is found
    // out within about a minute, not the operating system's hours: probes after 30 s of
    // quiet, every 10 s, three missed; data sent and not acknowledged for a minute. The
    // connection then fails as a broken one, and its call is tried again.
    if idle {
        config.keepalives_idle(Duration::from_secs(30));
    }
    if interval {
        config.keepalives_interval(Duration::from_secs(10));
    }
    if retries {
        config.keepalives_retries(3);
    }
    match tcp_user_timeout {
        None => {
            config.tcp_user_timeout(SILENCE);
        }
        Some(Duration::ZERO) => {}
        Some(timeout) => {
            config.tcp_user_timeout(timeout);
        }
    }
    // Every connection reads and writes the schema's tables without qualifying them.
    let given = config.get_options().unwrap_or_default().to_owned();
    let mut options = format!("{given} -c search_path={schema}");
    if let Some(timeout) = statement_timeout {
        options.push_str(&format!(" -c statement_timeout={timeout}"));
    }
    // The server's side of a silent peer: a transaction left open by a client that is gone
    // (its locks held: a lease, a run's row) ends within a minute, and the server probes a
    // quiet client as the client probes it. What the URL's `options` set is left as it is.
    let mut set = |name: &str, value: String| {
        if !given.contains(name) {
            options.push_str(&format!(" -c {name}={value}"));
        }
    };
    set("idle_in_transaction_session_timeout", idle_in_transaction);
    if config.get_keepalives() {
        set(
            "tcp_keepalives_idle",
            config.get_keepalives_idle().as_secs().to_string(),
        );
        if let Some(interval) = config.get_keepalives_interval() {
            set("tcp_keepalives_interval", interval.as_secs().to_string());
        }
        if let Some(retries) = config.get_keepalives_retries() {
            set("tcp_keepalives_count", retries.to_string());
        }
    }
    config.options(options.trim());
    let host = url.host_str().unwrap_or("localhost");
    let port = url.port().unwrap_or(5432);
    let db = url.path().trim_start_matches('/');
    let display = format!("postgres://{host}:{port}/{db} (schema {schema})");
    Ok(Target {
        config,
        schema,
        pool_size,
        pgvector,
        retry_for,
        display,
    })
}

/// A duration as PostgreSQL's settings take it (`30s`, `500ms`, `2min`, `1h`, `1d`, or a
/// number of milliseconds), checked and written without spaces; `None` if it is not one.
fn duration(text: &str) -> Option<String> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let unit = unit.trim();
    (!number.is_empty() && ["", "ms", "s", "min", "h", "d"].contains(&unit)).then(|| format!("{number}{unit}"))
}

/// The length a [`duration`] says.
fn to_duration(text: &str) -> Option<Duration> {
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let ms = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(n.checked_mul(ms)?))
}

/// A client error with the server's own message, which `Display` leaves out.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        // 57014 query_canceled: by the connection's statement_timeout, when its message says so.
        Some(db) if db.code().code() == "57014" && db.message().contains("statement timeout") => format!(
            "postgres: {} ({}): a statement ran longer than the URL's statement_timeout",
            db.message(),
            db.code().code()
        ),
        Some(db) => format!("postgres: {} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("postgres: {e}: {source}"),
            None => format!("postgres: {e}"),
        },
    }
}

/// A pool error: the client's, or the pool's own (exhausted).
pub fn describe_pool(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => describe(e),
        deadpool_postgres::PoolError::Timeout(_) => format!(
            "postgres: no connection became free within {}s (every connection of the pool is busy, or the \
             server refuses new ones)",
            POOL_WAIT.as_secs()
        ),
        other => format!("postgres: {other}"),
    }
}

/// A store's own runtime, on which every query runs (the stores' traits are synchronous, and a
/// caller may be on any runtime, or none).
pub fn runtime(name: &str) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the PostgreSQL client: {e}"))
}

/// How connections are made secure (per the URL's `sslmode`).
pub fn tls() -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    tls::connector()
}

/// The pool of connections to `target`; nothing is asked of the server yet.
pub fn pool(target: &Target, tls: tokio_postgres_rustls::MakeRustlsConnect) -> Result<Pool, String> {
    let manager = deadpool_postgres::Manager::from_config(
        target.config.clone(),
        tls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(target.pool_size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(target.config.get_connect_timeout().copied())
        .build()
        .map_err(|e| format!("cannot build the PostgreSQL pool: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings every connection asks of the server by default.
    const SERVER_SIDE: &str = " -c idle_in_transaction_session_timeout=60s -c tcp_keepalives_idle=30 \
                               -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3";

    #[test]
    fn a_transaction_left_idle_and_a_quiet_client_are_ended_by_the_server_unless_the_url_says() {
        let options = |url: &str| parse_url(url).unwrap().config.get_options().unwrap().to_owned();
        assert_eq!(
            options("postgres://h/db"),
            format!("-c search_path=runner{SERVER_SIDE}")
        );
        // The server probes as the client does.
        assert!(
            options("postgres://h/db?keepalives_idle=300&keepalives_interval=20&keepalives_retries=9")
                .ends_with("-c tcp_keepalives_idle=300 -c tcp_keepalives_interval=20 -c tcp_keepalives_count=9")
        );
        assert!(!options("postgres://h/db?keepalives=0").contains("tcp_keepalives"));
        for (given, set) in [("5s", "5s"), ("0", "0"), ("90000", "90000")] {
            assert!(
                options(&format!("postgres://h/db?idle_in_transaction_session_timeout={given}"))
                    .contains(&format!("-c idle_in_transaction_session_timeout={set} ")),
                "{given}"
            );
        }
        // What the URL's own `options` set is left as it is.
        let own = options("postgres://h/db?options=-c%20idle_in_transaction_session_timeout%3D5min");
        assert_eq!(own.matches("idle_in_transaction_session_timeout").count(), 1, "{own}");
        assert!(own.starts_with("-c idle_in_transaction_session_timeout=5min"), "{own}");
        let e = parse_url("postgres://me:secret@h/db?idle_in_transaction_session_timeout=later")
            .err()
            .unwrap();
        assert!(
            e.contains("idle_in_transaction_session_timeout") && !e.contains("secret"),
            "{e}"
        );
    }

    #[test]
    fn a_url_is_read_without_repeating_its_password() {
        let t = parse_url("postgres://me:secret@db.example:6543/app?schema=s1&pool_size=3&sslmode=require").unwrap();
        assert_eq!((t.schema.as_str(), t.pool_size), ("s1", 3));
        assert_eq!(t.display, "postgres://db.example:6543/app (schema s1)");
        assert_eq!(
            t.config.get_options(),
            Some(format!("-c search_path=s1{SERVER_SIDE}").as_str())
        );
        assert_eq!(t.config.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        assert_eq!(t.pgvector, Pgvector::Auto);
        for bad in [
            "postgres://me:secret@h/db?pool_size=0",
            "postgres://me:secret@h/db?schema=Bad-Name",
            "mysql://me:secret@h/db",
            "postgres://me:secret@h/db?nonsense=1",
            "postgres://me:secret@h/db?pgvector=maybe",
            "postgres://me:secret@h:99999/db",
        ] {
            let e = parse_url(bad).err().unwrap();
            assert!(!e.contains("secret"), "{e}");
            assert!(e.contains("not valid"), "{e}");
        }
        let t = parse_url("postgresql://h/db?pgvector=off").unwrap();
        assert_eq!((t.schema.as_str(), t.pool_size), ("runner", DEFAULT_POOL_SIZE));
        assert_eq!(t.pgvector, Pgvector::Off);
        assert_eq!(parse_url("postgres://h/db?pgvector=on").unwrap().pgvector, Pgvector::On);
    }

    #[test]
    fn a_statement_timeout_is_set_on_every_connection() {
        for (given, set) in [("30s", "30s"), ("500ms", "500ms"), ("2min", "2min"), ("250", "250")] {
            let t = parse_url(&format!("postgres://h/db?statement_timeout={given}")).unwrap();
            assert_eq!(
                t.config.get_options(),
                Some(format!("-c search_path=runner -c statement_timeout={set}{SERVER_SIDE}").as_str())
            );
        }
        for bad in ["soon", "30 parsecs", "-1s", "s"] {
            let e = parse_url(&format!("postgres://me:secret@h/db?statement_timeout={bad}"))
                .err()
                .unwrap();
            assert!(e.contains("statement_timeout") && !e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn a_silent_server_is_found_out_within_a_minute_unless_the_url_says() {
        let t = parse_url("postgres://h/db").unwrap();
        assert_eq!(t.config.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(t.config.get_keepalives_interval(), Some(Duration::from_secs(10)));
        assert_eq!(t.config.get_keepalives_retries(), Some(3));
        assert_eq!(t.config.get_tcp_user_timeout(), Some(&SILENCE));
        let t = parse_url(
            "postgres://h/db?keepalives_idle=300&keepalives_interval=20&keepalives_retries=9&tcp_user_timeout=5000",
        )
        .unwrap();
        assert_eq!(t.config.get_keepalives_idle(), Duration::from_secs(300));
        assert_eq!(t.config.get_keepalives_interval(), Some(Duration::from_secs(20)));
        assert_eq!(t.config.get_keepalives_retries(), Some(9));
        assert_eq!(
            t.config.get_tcp_user_timeout(),
            Some(&Duration::from_millis(5000)),
            "libpq's milliseconds"
        );
        // libpq's 0: the system's own.
        let t = parse_url("postgres://h/db?tcp_user_timeout=0").unwrap();
        assert_eq!(t.config.get_tcp_user_timeout(), None);
        let e = parse_url("postgres://me:secret@h/db?tcp_user_timeout=soon")
            .err()
            .unwrap();
        assert!(e.contains("tcp_user_timeout") && !e.contains("secret"), "{e}");
    }

    #[test]
    fn how_long_a_call_keeps_trying_is_the_urls_retry_for() {
        assert_eq!(parse_url("postgres://h/db").unwrap().retry_for, DEFAULT_RETRY_FOR);
        for (given, ms) in [
            ("2min", 120_000),
            ("1500ms", 1_500),
            ("3s", 3_000),
            ("0", 0),
            ("750", 750),
        ] {
            let t = parse_url(&format!("postgres://h/db?retry_for={given}")).unwrap();
            assert_eq!(t.retry_for, Duration::from_millis(ms), "{given}");
            assert_eq!(
                t.config.get_options(),
                Some(format!("-c search_path=runner{SERVER_SIDE}").as_str()),
                "not the server's"
            );
        }
        for bad in ["never", "-5s", "5 fortnights"] {
            let e = parse_url(&format!("postgres://me:secret@h/db?retry_for={bad}"))
                .err()
                .unwrap();
            assert!(e.contains("retry_for") && !e.contains("secret"), "{e}");
        }
    }
}
