//! `runner serve`'s connections through a raw TCP client (the server of `serve.rs`): a request
//! refused before its body is read.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use super::serve::{Server, serve_with};

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
    tcp.write_all(b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (status, headers, _) = response(&mut tcp);
    assert_eq!(status, 401);
    assert!(!headers.iter().any(|(k, _)| k == "connection"), "{headers:?}");
    tcp.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(response(&mut tcp).0, 200);
}
