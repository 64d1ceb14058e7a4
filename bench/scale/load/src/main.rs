//! The scale-out benchmark's load generator (bench/scale/run.sh builds and runs it): a native
//! HTTP client of the LangGraph Server API, so the client is not what runs out of CPU first on
//! a small machine (the Python SDK does, at a few hundred runs a second on 2 cores). tokio and
//! reqwest, runner's own dependencies: nothing else to install, and a stream's events are timed
//! as they arrive, which `oha` and `wrk` do not do (they time whole responses).
//!
//! ```text
//! runner-scale-load latency    URL GRAPH SAMPLES
//! runner-scale-load throughput URL GRAPH CLIENTS SECONDS
//! runner-scale-load failover   URL GRAPH RUNS
//! runner-scale-load relay      LISTEN_PORT TARGET_PORT ONE_WAY_US
//! ```
//!
//! Each prints one JSON object on stdout:
//! - `latency`: runs one after the other, each on a thread created beforehand (not timed):
//!   from `POST /threads/{id}/runs/stream` leaving the client to the stream's `metadata` event
//!   (the API server's own answer) and to its first `values` event (the run's first event,
//!   made by whichever process executes it), and to its end; percentiles in milliseconds.
//! - `throughput`: `CLIENTS` loops, each creating a thread and waiting for a run on it
//!   (`POST /threads/{id}/runs/wait`), for `SECONDS` after one second of warm-up: completed
//!   runs a second and the runs' latency.
//! - `failover`: starts `RUNS` streamed runs, waits for each one's first event, prints
//!   `{"ready": true}`, reads a process id on stdin and kills it (`SIGKILL`), then follows the
//!   streams to their ends: for each run, the time from the kill to its first event arriving
//!   more than a second after it (the dead process's last events, already logged, are
//!   delivered within milliseconds; a run cannot be claimed again before its lease expires),
//!   and whether it ended with the graph's whole output.
//! - `relay`: a TCP relay on 127.0.0.1:`LISTEN_PORT` to 127.0.0.1:`TARGET_PORT` that holds
//!   every chunk `ONE_WAY_US` microseconds each way before passing it on (a database a network
//!   away: the round trip grows by twice that); runs until killed, prints nothing. Blocking
//!   threads and `std::thread::sleep`, not tokio's timer, whose millisecond ticks would round
//!   the delay up.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if let [mode, listen, target, one_way] = args.iter().map(String::as_str).collect::<Vec<_>>().as_slice()
        && *mode == "relay"
    {
        let delay = Duration::from_micros(one_way.parse().expect("ONE_WAY_US"));
        relay(
            listen.parse().expect("LISTEN_PORT"),
            target.parse().expect("TARGET_PORT"),
            delay,
        );
        return;
    }
    // reqwest is built without a TLS provider of its own: the process's is installed (plain
    // HTTP on loopback uses none, but the client is built with one).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let out = runtime.block_on(async move {
        match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["latency", url, graph, samples] => latency(url, graph, samples.parse().expect("SAMPLES")).await,
            ["throughput", url, graph, clients, seconds] => {
                throughput(url, graph, clients.parse().expect("CLIENTS"), seconds.parse().expect("SECONDS")).await
            }
            ["failover", url, graph, runs] => failover(url, graph, runs.parse().expect("RUNS")).await,
            _ => Err(
                "usage: load latency URL GRAPH SAMPLES | throughput URL GRAPH CLIENTS SECONDS | failover URL GRAPH RUNS"
                    .into(),
            ),
        }
    });
    match out {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("load: {e}");
            std::process::exit(1);
        }
    }
}

type Result<T> = std::result::Result<T, String>;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(300))
        .build()
        .expect("an HTTP client")
}

async fn new_thread(http: &reqwest::Client, url: &str) -> Result<String> {
    let reply: Value = http
        .post(format!("{url}/threads"))
        .json(&json!({}))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .error_for_status()
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    reply["thread_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no thread_id in {reply}"))
}

/// One server-sent event: its name and data.
struct Event {
    name: String,
    data: String,
    at: Instant,
}

/// Starts a streamed run on `thread`; the events go to `on` as they arrive, each stamped with
/// its arrival. Returns when the stream ends.
async fn stream_run(
    http: &reqwest::Client,
    url: &str,
    thread: &str,
    graph: &str,
    mut on: impl FnMut(Event),
) -> Result<()> {
    let response = http
        .post(format!("{url}/threads/{thread}/runs/stream"))
        .json(&json!({"assistant_id": graph, "input": {}, "stream_mode": ["values"]}))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .error_for_status()
        .map_err(|e| e.to_string())?;
    let mut body = response.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let at = Instant::now();
        // Lines end in CRLF or LF (JSON data holds no raw CR).
        buf.extend(chunk.iter().filter(|b| **b != b'\r'));
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&block);
            let (mut name, mut data) = (String::new(), String::new());
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if !name.is_empty() {
                on(Event { name, data, at });
            }
        }
    }
    Ok(())
}

fn percentiles(mut ms: Vec<f64>) -> Value {
    if ms.is_empty() {
        return Value::Null;
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    json!({"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "min": ms[0], "max": ms[ms.len() - 1], "n": ms.len()})
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn latency(url: &str, graph: &str, samples: usize) -> Result<Value> {
    let http = client();
    let (mut metadata, mut first, mut end) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..samples + 3 {
        let thread = new_thread(&http, url).await?;
        let (mut m, mut f) = (None, None);
        let sent = Instant::now();
        stream_run(&http, url, &thread, graph, |e| match e.name.as_str() {
            "metadata" if m.is_none() => m = Some(e.at - sent),
            "values" if f.is_none() => f = Some(e.at - sent),
            _ => {}
        })
        .await?;
        let done = sent.elapsed();
        // The first three warm the connections up.
        if i >= 3 {
            metadata.push(ms(m.ok_or("no metadata event")?));
            first.push(ms(f.ok_or("no values event")?));
            end.push(ms(done));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(json!({"metadata_ms": percentiles(metadata), "first_event_ms": percentiles(first), "end_ms": percentiles(end)}))
}

async fn throughput(url: &str, graph: &str, clients: usize, seconds: f64) -> Result<Value> {
    let http = client();
    let start = Instant::now();
    let warm = start + Duration::from_secs(1);
    let stop = warm + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (http, url, graph) = (http.clone(), url.to_owned(), graph.to_owned());
            tokio::spawn(async move {
                let (mut done, mut failed, mut lat) = (0u64, 0u64, Vec::new());
                loop {
                    let began = Instant::now();
                    if began >= stop {
                        break;
                    }
                    let ok = async {
                        let thread = new_thread(&http, &url).await?;
                        let reply = http
                            .post(format!("{url}/threads/{thread}/runs/wait"))
                            .json(&json!({"assistant_id": graph, "input": {}}))
                            .send()
                            .await
                            .map_err(|e| e.to_string())?
                            .error_for_status()
                            .map_err(|e| e.to_string())?;
                        reply.bytes().await.map_err(|e| e.to_string())?;
                        Ok::<_, String>(())
                    }
                    .await;
                    let ended = Instant::now();
                    if began >= warm && ended <= stop {
                        match ok {
                            Ok(()) => {
                                done += 1;
                                lat.push(ms(ended - began));
                            }
                            Err(e) => {
                                failed += 1;
                                if failed == 1 {
                                    eprintln!("load: a run failed: {e}");
                                }
                            }
                        }
                    }
                }
                (done, failed, lat)
            })
        })
        .collect();
    let (mut done, mut failed, mut lat) = (0, 0, Vec::new());
    for t in tasks {
        let (d, f, l) = t.await.map_err(|e| e.to_string())?;
        done += d;
        failed += f;
        lat.extend(l);
    }
    Ok(json!({
        "clients": clients, "seconds": seconds, "runs": done, "failed": failed,
        "runs_per_s": done as f64 / seconds, "run_ms": percentiles(lat),
    }))
}

/// What a followed run sent: the arrival of each `values` event, the last one's data, and the
/// error it ended with, if any.
type Followed = (Vec<Instant>, String, Option<String>);

async fn failover(url: &str, graph: &str, runs: usize) -> Result<Value> {
    use std::sync::{Arc, Mutex};
    let http = client();
    // Per run: the arrival of every event, and the last event's data.
    let log: Arc<Mutex<Vec<Followed>>> = Arc::new(Mutex::new(vec![(Vec::new(), String::new(), None); runs]));
    let mut tasks = Vec::new();
    for i in 0..runs {
        let thread = new_thread(&http, url).await?;
        let (http, url, graph, log) = (http.clone(), url.to_owned(), graph.to_owned(), log.clone());
        tasks.push(tokio::spawn(async move {
            let outcome = stream_run(&http, &url, &thread, &graph, |e| {
                let mut log = log.lock().unwrap();
                let entry = &mut log[i];
                if e.name == "values" {
                    entry.0.push(e.at);
                    entry.1 = e.data;
                } else if e.name == "error" {
                    entry.2 = Some(e.data);
                }
            })
            .await;
            if let Err(e) = outcome {
                log.lock().unwrap()[i].2 = Some(e);
            }
        }));
    }
    // Every run has started (an event arrived) before the kill.
    let deadline = Instant::now() + Duration::from_secs(60);
    while log.lock().unwrap().iter().any(|r| r.0.is_empty()) {
        if Instant::now() > deadline {
            return Err("the runs did not start within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("{}", json!({"ready": true}));
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line).map(|_| line))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
        .and_then(|line| {
            let pid: i32 = line.trim().parse().map_err(|_| format!("not a process id: {line:?}"))?;
            kill9(pid)
        })?;
    let killed = Instant::now();
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    let log = log.lock().unwrap();
    let mut resumed = Vec::new();
    let (mut whole, mut errors) = (0, Vec::new());
    for (times, last, error) in log.iter() {
        if let Some(at) = times.iter().find(|t| **t > killed + Duration::from_secs(1)) {
            resumed.push(ms(*at - killed));
        }
        match error {
            Some(e) => errors.push(e.clone()),
            None if !last.is_empty() => whole += 1,
            None => {}
        }
    }
    Ok(json!({
        "runs": runs, "resumed": resumed.len(), "ended": whole, "errors": errors,
        "kill_to_resume_ms": percentiles(resumed),
        "last_values": log.iter().map(|r| r.1.clone()).collect::<Vec<_>>(),
    }))
}

fn kill9(pid: i32) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -9 {pid} failed"))
    }
}

/// Relays each connection to `127.0.0.1:listen` to `127.0.0.1:target`, every chunk held
/// `delay` before it is passed on, in order, each way.
fn relay(listen: u16, target: u16, delay: Duration) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", listen)).expect("the relay's port");
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
            continue;
        };
        delayed_pipe(client, server, delay);
        delayed_pipe(server2, client2, delay);
    }
}

/// Reads `from` on one thread and writes to `to` on another, each chunk `delay` after it was read.
fn delayed_pipe(mut from: std::net::TcpStream, mut to: std::net::TcpStream, delay: Duration) {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}
