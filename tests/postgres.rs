//! The PostgreSQL server the tests start (`support/postgres.rs`): it answers on loopback, hands
//! out empty schemas of one database with the settings durability tests rely on, restarts on
//! its port and data, and dies with the test process however that ends.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::postgres::{self, Server};

fn one(url: &str, sql: &str) -> String {
    let rows = postgres::query(url, sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
    rows[0]
        .iter()
        .map(|v| v.clone().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("|")
}

/// Whether `pid` is still a process (a zombie is not: its parent is gone, nobody reaped it yet).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[tokio::test]
async fn the_shared_server_hands_out_empty_schemas_of_one_database() {
    let a = postgres::fresh_url();
    let b = postgres::fresh_url();
    assert_ne!(a, b);
    let (plain, schema_a) = a.split_once("?schema=").unwrap();
    let (plain_b, schema_b) = b.split_once("?schema=").unwrap();
    assert!(
        plain.starts_with("postgres://runner@127.0.0.1:") && plain.ends_with("/runner_test"),
        "{a}"
    );
    assert_eq!(plain, plain_b, "one server, one database");
    assert!(
        schema_a.starts_with("s_") && schema_a != schema_b,
        "{schema_a} {schema_b}"
    );

    // A plain client reaches it, as the URL's user, a superuser, on the URL's database.
    let (client, connection) = tokio_postgres::connect(plain, tokio_postgres::NoTls).await.unwrap();
    let connection = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT 1, current_user::text, current_database()::text, \
             (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), \
             (SELECT count(*) FROM pg_namespace WHERE nspname IN ($1, $2))",
            &[&schema_a, &schema_b],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    assert_eq!(row.get::<_, String>(1), "runner");
    assert_eq!(row.get::<_, String>(2), "runner_test");
    assert!(row.get::<_, bool>(3), "a superuser");
    assert_eq!(
        row.get::<_, i64>(4),
        0,
        "a fresh schema does not exist yet: a test starts empty"
    );

    // What tests of durability and of many connections rely on.
    let settings = client
        .query_one(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'), \
             current_setting('listen_addresses'), current_setting('max_connections')",
            &[],
        )
        .await
        .unwrap();
    let settings: Vec<String> = (0..4).map(|i| settings.get(i)).collect();
    assert_eq!(settings, ["on", "on", "127.0.0.1", "200"]);
    drop(client);
    connection.await.unwrap().unwrap();

    // The helper honours `schema` as the search path, as the checkpointer does.
    assert_eq!(
        one(
            &a,
            &format!("CREATE SCHEMA {schema_a}; CREATE TABLE t (x int); SELECT current_schema()::text")
        ),
        schema_a
    );
    let err = postgres::query(&b, &format!("CREATE SCHEMA {schema_b}; SELECT count(*) FROM t")).unwrap_err();
    assert!(
        err.contains("\"t\" does not exist"),
        "another schema's table is not seen: {err}"
    );
}

#[test]
fn a_server_of_its_own_restarts_on_its_port_and_data() {
    // Started from a thread that then ends, as every test's thread does: the server lives on.
    // A parent-death signal would be sent a moment after the join returns (the kernel wakes
    // the joiner before it signals the children): that moment is waited for, as there is no
    // event to wait on when nothing goes wrong.
    let server = std::thread::spawn(Server::start).join().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let pid = server.pid();
    assert!(alive(pid));
    let admin = server.admin_url();
    assert_eq!(one(&admin, "SELECT current_user::text"), "postgres");
    assert_ne!(admin, postgres::admin_url(), "not the shared server");
    postgres::query(&admin, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)").unwrap();
    let started = one(&admin, "SELECT pg_postmaster_start_time()::text");
    let url = server.fresh_url();

    server.restart();
    assert_eq!(server.admin_url(), admin, "the same port");
    assert_ne!(server.pid(), pid);
    assert!(!alive(pid), "the old postmaster is gone");
    assert_ne!(one(&admin, "SELECT pg_postmaster_start_time()::text"), started);
    assert_eq!(one(&admin, "SELECT x FROM kept"), "7", "the same data");
    assert_eq!(one(&url, "SELECT current_database()::text"), "runner_test");

    let pid = server.pid();
    drop(server);
    assert!(!alive(pid), "dropped, stopped");
    assert!(postgres::query(&admin, "SELECT 1").is_err());
}

/// Run by `a_server_dies_with_its_test_process` as a process of its own, killed by it.
#[test]
#[ignore = "started and killed by postgres::a_server_dies_with_its_test_process"]
fn serve_until_killed() {
    let server = Server::start();
    println!("postmaster {} {}", server.pid(), server.admin_url());
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_server_dies_with_its_test_process() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "postgres::serve_until_killed", "--ignored", "--nocapture"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (pid, admin) = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("no server started; the child said:\n{said}"));
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("postmaster ") {
            let (pid, url) = rest.split_once(' ').unwrap();
            break (pid.parse::<u32>().unwrap(), url.to_owned());
        }
        said.push_str(&line);
        said.push('\n');
    };
    assert_eq!(one(&admin, "SELECT 1"), "1");

    child.kill().unwrap(); // SIGKILL: no unwinding, no exit handler.
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        if Instant::now() > deadline {
            // SAFETY: a signal to a process this test made; not left running for whoever comes next.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGQUIT) };
            panic!("the postmaster outlived its test process");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(postgres::query(&admin, "SELECT 1").is_err());
}
