//! `runner serve`'s connections through a raw TCP client (the server of `serve.rs`): a request
//! refused before its body is read, and the timeouts that close connections which idle or send
//! a request's head too slowly, while long responses go on.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::serve::{Server, client, parse, serve_with};

/// A TCP connection to `s`, reads giving up after `wait`.
fn connect(s: &Server, wait: Duration) -> TcpStream {
    let tcp = TcpStream::connect(s.base.strip_prefix("http://").unwrap()).unwrap();
    tcp.set_read_timeout(Some(wait)).unwrap();
    tcp
}

/// A response read off `tcp`: its status, its headers (names lower-cased) and its body (read
/// by `content-length`).
fn response(tcp: &mut TcpStream) -> (u16, Vec<(String, String)>, String) {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        match tcp.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => panic!("the connection ended in a response's head ({other:?}): {head:?}"),
        }
    }
    let head = String::from_utf8(head).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0u8; length];
    tcp.read_exact(&mut body).unwrap();
    (status, headers, String::from_utf8(body).unwrap())
}

/// Whether the server closed `tcp`: a read ends (or is reset) before `wait` is up.
fn closed(tcp: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match tcp.read(&mut buf) {
        Ok(0) => true,
        Ok(n) => panic!(
            "the server sent {:?} instead of closing",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => false,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
        Err(e) => panic!("{e}"),
    }
}

/// A request refused before its body was read (a missing API key) says that the connection
/// closes: the server gives up on a body nobody reads, and a client that sent its next request
/// on the connection would see it fail. A refused request without a body keeps the connection.
#[test]
fn a_request_refused_before_its_body_is_read_closes_its_connection_and_says_so() {
    let s = serve_with(&["--api-key-env", "SERVE_CONN_KEY"], &[("SERVE_CONN_KEY", "sesame")]);
    let mut tcp = connect(&s, Duration::from_secs(10));
    let body = json!({"metadata": {"note": "x".repeat(64 * 1024)}}).to_string();
    // The head first, as clients that send a body on its own write it: answered at once.
    write!(
        tcp,
        "POST /threads HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    let (status, headers, detail) = response(&mut tcp);
    assert_eq!(status, 401, "{detail}");
    assert!(
        headers.contains(&("connection".into(), "close".into())),
        "a 401 to a request whose body was not read must say the connection closes: {headers:?}"
    );
    // The body, and a request after it: the server has closed the connection.
    let _ = tcp.write_all(body.as_bytes());
    let _ = tcp.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(closed(&mut tcp), "the connection was kept open");

    // Without a body: the connection is kept, the next request answered.
    let mut tcp = connect(&s, Duration::from_secs(10));
    // (`/info` is open: `/metrics` needs the key.)
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (status, headers, _) = response(&mut tcp);
    assert_eq!(status, 401);
    assert!(!headers.iter().any(|(k, _)| k == "connection"), "{headers:?}");
    tcp.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(response(&mut tcp).0, 200);
}

/// A client that sends a request's head a byte at a time (slowloris) is cut off once
/// `--header-read-timeout` has passed since its first byte; a kept-alive connection with no
/// request in progress is closed after `--idle-timeout`, not after the shorter header timeout.
#[test]
fn slow_heads_and_idle_connections_are_closed() {
    let s = serve_with(&["--header-read-timeout", "1", "--idle-timeout", "3"], &[]);

    let mut tcp = connect(&s, Duration::from_millis(200));
    let head = format!("GET /ok HTTP/1.1\r\nHost: x\r\nX-Slow: {}\r\n\r\n", "s".repeat(40));
    let first = Instant::now();
    let mut cut = None;
    for byte in head.bytes() {
        // A write to a closed connection may still succeed once: the read says.
        let _ = tcp.write_all(&[byte]);
        if closed(&mut tcp) {
            cut = Some(first.elapsed());
            break;
        }
    }
    // 200 ms a byte: the head would take 14 s; the timeout is 1 s.
    let cut = cut.expect("a head sent a byte at a time was read to its end");
    assert!(
        cut >= Duration::from_millis(900),
        "cut after {cut:?}, before the timeout"
    );

    let mut tcp = connect(&s, Duration::from_secs(10));
    tcp.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(response(&mut tcp).0, 200);
    // Idle past the header timeout: still open.
    std::thread::sleep(Duration::from_millis(1500));
    tcp.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(response(&mut tcp).0, 200);
    let answered = Instant::now();
    assert!(closed(&mut tcp), "an idle connection was kept open for 10 s");
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_millis(2500) && idle < Duration::from_secs(8),
        "closed after {idle:?} idle, with --idle-timeout 3"
    );
}

/// A request in progress is never timed out: a stream that sends for longer than both
/// timeouts (with silences longer than them between its events), and a wait whose handler
/// works as long, are answered to their end.
#[tokio::test(flavor = "multi_thread")]
async fn long_streams_and_waits_outlast_the_connection_timeouts() {
    let s = serve_with(&["--header-read-timeout", "0.3", "--idle-timeout", "0.3"], &[]);
    // The slow workflow: two model calls of a second each.
    let started = Instant::now();
    let stream = client()
        .post(format!("{}/threads/long/runs/stream", s.base))
        .json(&json!({"assistant_id": "slow", "if_not_exists": "create", "stream_mode": "values"}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let events = parse(&stream.text().await.unwrap());
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(events.last().unwrap().1, json!({"said": "done"}), "{events:?}");

    let waited = client()
        .post(format!("{}/runs/wait", s.base))
        .json(&json!({"assistant_id": "slow"}))
        .send()
        .await
        .unwrap();
    assert_eq!(waited.status(), 200);
    assert_eq!(waited.json::<Value>().await.unwrap(), json!({"said": "done"}));
}
