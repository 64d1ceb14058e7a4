//! A real PostgreSQL server for the tests, on loopback: Debian's `postgresql` (installed by this
//! set-up when it is missing and the tests run as root), `initdb` into a directory under the
//! target directory, `postgres` started directly as a child of the test process on a free port.
//!
//! One server is shared by every test of the process ([`fresh_url`], [`admin_url`]): started on
//! first use, each test gets a schema of its own in one database, so that nothing a test
//! stores is seen by another. A test that stops or restarts a server starts one of its own
//! ([`Server::start`]): the shared one is never restarted, as every test running at the time is
//! using it.
//!
//! A server dies with the test process, however it ends: the parent-death signal (set after
//! dropping root, as a credential change clears it) stops it at once when the process is
//! killed or aborts; a normal exit stops the shared server and removes its directory, and a
//! private one is stopped and removed when dropped (a panicking test too).
//! Directories that processes killed earlier left behind are removed by the next start.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use super::install;

/// The user the tests' URLs name (a superuser) and their database.
const USER: &str = "runner";
const DATABASE: &str = "runner_test";
/// The superuser initdb makes, and the OS user the server runs as when the tests run as root.
const SUPERUSER: &str = "postgres";
/// How long a start may take before it is a failure (a cold CI machine, a busy one).
const READY_WITHIN: Duration = Duration::from_secs(30);

/// The URL of an empty namespace on the shared server, new at every call:
/// `postgres://runner@127.0.0.1:PORT/runner_test?schema=s_N`. The checkpointer creates the
/// schema and works in it; a schema costs far less than a database.
pub(crate) fn fresh_url() -> String {
    shared().fresh_url()
}

/// The shared server's superuser on its `postgres` database: for SQL a test runs around the
/// code under test (`pg_terminate_backend`, looking at `pg_stat_activity`).
pub(crate) fn admin_url() -> String {
    shared().admin_url()
}

/// A PostgreSQL server of the test process: its data directory, the port it listens on at
/// 127.0.0.1 and its postmaster.
pub(crate) struct Server {
    port: u16,
    /// `data/`, the Unix socket and `postgres.log`.
    dir: PathBuf,
    setup: &'static Setup,
    postmaster: Mutex<Option<Child>>,
}

impl Server {
    /// A server of the caller's own, stopped and removed when dropped. Panics, saying why, if
    /// PostgreSQL cannot be installed or started.
    pub(crate) fn start() -> Server {
        Server::try_start().unwrap_or_else(|e| panic!("PostgreSQL for the tests: {e}"))
    }

    /// See [`fresh_url`].
    pub(crate) fn fresh_url(&self) -> String {
        static SCHEMAS: AtomicU64 = AtomicU64::new(0);
        let n = SCHEMAS.fetch_add(1, Ordering::Relaxed);
        format!("postgres://{USER}@127.0.0.1:{}/{DATABASE}?schema=s_{n}", self.port)
    }

    /// See [`admin_url`].
    pub(crate) fn admin_url(&self) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", self.port)
    }

    /// The postmaster's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.lock().as_ref().map(Child::id).expect("the server is running")
    }

    /// Stops the server with a fast shutdown (open transactions are rolled back, connections
    /// closed, what was committed is kept) and starts it again on the same port and data.
    pub(crate) fn restart(&self) {
        self.stop(Shutdown::Fast);
        self.launch()
            .unwrap_or_else(|e| panic!("PostgreSQL for the tests, restarting: {e}"));
    }

    /// Stops the server (a fast shutdown): the database cannot be reached until [`Server::resume`].
    pub(crate) fn halt(&self) {
        self.stop(Shutdown::Fast);
    }

    /// Starts a server [`Server::halt`] stopped again, on the same port and data.
    pub(crate) fn resume(&self) {
        self.launch()
            .unwrap_or_else(|e| panic!("PostgreSQL for the tests, starting again: {e}"));
    }

    fn try_start() -> Result<Server, String> {
        static SERVERS: AtomicU64 = AtomicU64::new(0);
        let setup = setup()?;
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let dir = setup.base.join(format!("{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut server = Server {
            port: 0,
            dir,
            setup,
            postmaster: Mutex::new(None),
        };
        if let Some(owner) = &setup.owner {
            std::os::unix::fs::chown(&server.dir, Some(owner.uid), Some(owner.gid))
                .map_err(|e| format!("chown {}: {e}", server.dir.display()))?;
        }
        // No sync of the new cluster's files: a machine that crashes now loses a directory the
        // next start removes anyway. The server itself keeps fsync on.
        let mut initdb = Command::new(setup.bin.join("initdb"));
        initdb
            .arg("--pgdata")
            .arg(server.dir.join("data"))
            .args(["--username", SUPERUSER, "--auth=trust", "--encoding=UTF8", "--locale=C"])
            .arg("--no-sync")
            .env("LC_ALL", "C")
            .current_dir(&server.dir);
        setup.as_owner(&mut initdb);
        install::run(&mut initdb, "initdb")?;
        // Another process may take the free port before the server binds it: try another.
        for attempt in 1.. {
            server.port = free_port()?;
            match server.launch() {
                Ok(()) => break,
                Err(e) if attempt < 5 && e.contains("could not bind") => continue,
                Err(e) => return Err(e),
            }
        }
        let admin = server.admin_url();
        query(&admin, &format!("CREATE ROLE {USER} SUPERUSER LOGIN"))?;
        query(&admin, &format!("CREATE DATABASE {DATABASE} OWNER {USER}"))?;
        Ok(server)
    }

    /// Starts the postmaster on `self.port` and waits until it answers a query.
    fn launch(&self) -> Result<(), String> {
        let log_path = self.dir.join("postgres.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let log_from = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut postgres = Command::new(self.setup.bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string()])
            // The socket beside the data, not in /var/run/postgresql (not ours to write, and
            // where a system cluster's lock files are); none if its path is too long for one.
            .arg("-k")
            .arg(if self.dir.as_os_str().len() < 80 {
                self.dir.as_os_str()
            } else {
                std::ffi::OsStr::new("")
            })
            .args(["-c", "listen_addresses=127.0.0.1"])
            // Room for many pools at once (every test opens one, a chaos test several), in
            // little memory. fsync and synchronous_commit keep their defaults (on): tests of
            // durability depend on them.
            .args(["-c", "max_connections=200", "-c", "shared_buffers=32MB"])
            .env("LC_ALL", "C")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        self.setup.as_owner(&mut postgres);
        dies_with_this_process(&mut postgres);
        let child = on_spawner(move || postgres.spawn()).map_err(|e| format!("starting postgres: {e}"))?;
        *self.lock() = Some(child);
        let log_since_start = || {
            let mut text = String::new();
            if let Ok(mut f) = std::fs::File::open(&log_path) {
                let _ = f.seek(SeekFrom::Start(log_from));
                let _ = f.read_to_string(&mut text);
            }
            text
        };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let exited = self.lock().as_mut().map_or(Ok(None), Child::try_wait);
            if let Ok(Some(status)) = exited {
                self.lock().take();
                return Err(format!(
                    "postgres exited ({status}) before accepting connections:\n{}",
                    log_since_start()
                ));
            }
            match query_within(&self.admin_url(), "SELECT 1", Duration::from_secs(2)) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    self.stop(Shutdown::Immediate);
                    return Err(format!(
                        "postgres did not accept connections within {READY_WITHIN:?} ({e}):\n{}",
                        log_since_start()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Stops the server and waits until it has; an immediate shutdown if a fast one takes too
    /// long.
    fn stop(&self, how: Shutdown) {
        let Some(mut child) = self.lock().take() else {
            return;
        };
        let pid = child.id() as libc::pid_t;
        let signal = match how {
            Shutdown::Fast => libc::SIGINT,
            Shutdown::Immediate => libc::SIGQUIT,
        };
        // SAFETY: the postmaster is our child, not yet reaped: the pid is still its.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(None) = child.try_wait() {
            if Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGQUIT) };
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.postmaster.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How a server is stopped: a fast shutdown writes a checkpoint (a second or so on a busy
/// machine, fsync being on) and is what a restart does; a server whose data is removed next
/// is stopped at once.
enum Shutdown {
    Fast,
    Immediate,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop(Shutdown::Immediate);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `sql` (statements separated by `;`, as one implicit transaction unless it is one
/// statement) on a new connection to `url`, and returns the rows of its last result as text.
/// A `schema` parameter (as in [`fresh_url`]) becomes the session's `search_path`. Usable from
/// a tokio runtime too: the client runs on a thread of its own.
pub(crate) fn query(url: &str, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
    query_within(url, sql, Duration::from_secs(60))
}

/// [`query`], given up after `limit`: what listens on the port may never answer (a process
/// that took the port before the server could).
fn query_within(url: &str, sql: &str, limit: Duration) -> Result<Vec<Vec<Option<String>>>, String> {
    let mut parsed = url::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
    let (schema, rest): (Vec<_>, Vec<_>) = parsed
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .partition(|(k, _)| k == "schema");
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    let mut config: tokio_postgres::Config = parsed.as_str().parse().map_err(|e| format!("{url}: {e}"))?;
    if let Some((_, schema)) = schema.last() {
        config.options(format!("-c search_path={schema}"));
    }
    let sql = sql.to_owned();
    let client = std::thread::spawn(move || -> Result<_, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let work = async move {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await.map_err(describe)?;
            let connection = tokio::spawn(connection);
            let messages = client.simple_query(&sql).await.map_err(describe)?;
            drop(client);
            let _ = connection.await;
            let mut rows = Vec::new();
            for message in messages {
                match message {
                    tokio_postgres::SimpleQueryMessage::RowDescription(_) => rows.clear(),
                    tokio_postgres::SimpleQueryMessage::Row(row) => {
                        rows.push((0..row.len()).map(|i| row.get(i).map(str::to_owned)).collect())
                    }
                    _ => {}
                }
            }
            Ok(rows)
        };
        rt.block_on(async move {
            tokio::time::timeout(limit, work)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
        })
    });
    client.join().map_err(|_| "the client thread panicked".to_string())?
}

/// The error and its causes (tokio-postgres's own text is only its kind: "db error").
fn describe(e: tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

// ---------------------------------------------------------------------------------------------
// Set-up, once per process.

/// What every server of the process shares: the binaries, the OS user they run as, and the
/// directory their directories are made in.
struct Setup {
    /// The directory holding `initdb` and `postgres`.
    bin: PathBuf,
    /// When the tests run as root (initdb refuses to): the `postgres` user.
    owner: Option<Owner>,
    base: PathBuf,
}

struct Owner {
    uid: u32,
    gid: u32,
}

impl Setup {
    fn as_owner(&self, cmd: &mut Command) {
        if let Some(owner) = &self.owner {
            // std drops root's supplementary groups, then sets the group and the user, before
            // any `pre_exec` closure runs.
            cmd.uid(owner.uid).gid(owner.gid);
        }
    }
}

fn setup() -> Result<&'static Setup, String> {
    static SETUP: OnceLock<Result<Setup, String>> = OnceLock::new();
    SETUP
        .get_or_init(|| {
            let bin = binaries()?;
            let owner = owner()?;
            let base = base_dir(owner.is_some())?;
            remove_stale(&base);
            Ok(Setup { bin, owner, base })
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn shared() -> &'static Server {
    static SHARED: OnceLock<Result<Server, String>> = OnceLock::new();
    /// At the process's exit (statics are never dropped): the server stopped, its directory
    /// removed.
    extern "C" fn stop_shared() {
        let _ = std::panic::catch_unwind(|| {
            if let Some(Ok(server)) = SHARED.get() {
                server.stop(Shutdown::Immediate);
                let _ = std::fs::remove_dir_all(&server.dir);
            }
        });
    }
    let server = SHARED.get_or_init(|| {
        let started = Instant::now();
        let server = Server::try_start()?;
        // SAFETY: registers a function that touches nothing but statics.
        unsafe { libc::atexit(stop_shared) };
        eprintln!(
            "PostgreSQL for the tests: {} on 127.0.0.1:{}, ready in {:.2?}",
            server.dir.display(),
            server.port,
            started.elapsed()
        );
        Ok(server)
    });
    match server {
        Ok(server) => server,
        Err(e) => panic!("PostgreSQL for the tests: {e}"),
    }
}

/// `initdb` and `postgres` of one installation: on PATH, else Debian's newest under
/// /usr/lib/postgresql/*/bin, else installed from Debian's packages.
fn binaries() -> Result<PathBuf, String> {
    let on_path = || {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).find(|dir| has_binaries(dir))
    };
    let debian = || {
        let versions = std::fs::read_dir("/usr/lib/postgresql").ok()?;
        versions
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let version: Vec<u32> = entry
                    .file_name()
                    .to_str()?
                    .split('.')
                    .map(|part| part.parse().ok())
                    .collect::<Option<_>>()?;
                let bin = entry.path().join("bin");
                has_binaries(&bin).then_some((version, bin))
            })
            .max()
            .map(|(_, bin)| bin)
    };
    if let Some(bin) = on_path().or_else(debian) {
        return Ok(bin);
    }
    install_postgresql()?;
    debian()
        .or_else(on_path)
        .ok_or_else(|| "`apt-get install postgresql` left no initdb under /usr/lib/postgresql/*/bin".into())
}

fn has_binaries(dir: &Path) -> bool {
    let executable =
        |name| std::fs::metadata(dir.join(name)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    executable("initdb") && executable("postgres")
}

/// Debian's `postgresql` package, when the tests run as root (as in CI); otherwise what to
/// install.
fn install_postgresql() -> Result<(), String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "PostgreSQL is not installed: no `initdb` and `postgres` on PATH or under \
                    /usr/lib/postgresql/*/bin. Install it (on Debian or Ubuntu: \
                    `sudo apt-get install postgresql`) and run the tests again."
                .into(),
        );
    }
    let apt = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        // Wait for another apt (another test run installing the same) rather than fail.
        cmd.args(["-o", "DPkg::Lock::Timeout=600"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    let install = ["install", "-y", "-q", "--no-install-recommends", "postgresql"];
    if install::run(&mut apt(&install), "apt-get install postgresql").is_ok() {
        return Ok(());
    }
    // A clean machine has no package lists yet.
    install::run(
        &mut apt(&["update", "-q"]),
        "apt-get update (it needs Debian's mirrors)",
    )?;
    install::run(&mut apt(&install), "apt-get install postgresql")
}

/// Root's processes run the server as `postgres` (initdb refuses root), made if missing.
fn owner() -> Result<Option<Owner>, String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, SUPERUSER]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    if id("-u").is_none() {
        install::run(
            Command::new("useradd").args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                SUPERUSER,
            ]),
            "useradd postgres (initdb does not run as root)",
        )?;
    }
    match (id("-u"), id("-g")) {
        (Some(uid), Some(gid)) => Ok(Some(Owner { uid, gid })),
        _ => Err(format!("no user `{SUPERUSER}` to run PostgreSQL as")),
    }
}

/// `CARGO_TARGET_TMPDIR/postgres`, unless the server's user cannot reach it (a checkout in
/// root's home): then under the system's temporary directory.
fn base_dir(other_user: bool) -> Result<PathBuf, String> {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let reachable = |dir: &Path| {
        dir.ancestors()
            .all(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
    };
    let base = if !other_user || reachable(target) {
        target.join("postgres")
    } else {
        std::env::temp_dir().join("runner-test-postgres")
    };
    std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    if other_user {
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", base.display()))?;
    }
    Ok(base)
}

/// Removes the directories of servers whose test process is gone (a process killed, whose
/// server its death stopped).
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next()?.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let alive =
            unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("a free port: {e}"))?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

// ---------------------------------------------------------------------------------------------
// The server's life bound to the process's.

/// Stops the child with SIGQUIT (PostgreSQL's immediate shutdown) when the process dies. Set
/// after the switch to the server's user: a change of credentials clears it.
#[cfg(target_os = "linux")]
fn dies_with_this_process(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only makes system calls that are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the signal was set: nobody would send it.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no parent-death signal: a server outlives a test process killed.
#[cfg(not(target_os = "linux"))]
fn dies_with_this_process(_: &mut Command) {}

/// Runs `job` on one thread kept for the life of the process. The parent-death signal is sent
/// when the *thread* that forked the child ends, and each test runs on a thread of its own,
/// ended with the test: a server started from a test would die with the test that happened to
/// start it.
fn on_spawner<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> T {
    type Job = Box<dyn FnOnce() + Send>;
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("postgres-spawner".into())
            .spawn(move || queue.into_iter().for_each(|job| job()))
            .expect("a thread to start PostgreSQL from");
        jobs
    });
    let (done, result) = mpsc::sync_channel(1);
    spawner
        .send(Box::new(move || {
            let _ = done.send(job());
        }))
        .expect("the spawner thread lives as long as the process");
    result.recv().expect("the spawner thread runs every job")
}
