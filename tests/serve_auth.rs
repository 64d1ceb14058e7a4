//! `runner serve` with users: JWTs signed by a key the test makes and serves as a JWKS on
//! loopback, per-user API keys made by `runner users`, and the ownership rules on every route
//! of the API (the route list is the server's own, so a route added without a rule fails
//! here), the store's namespaces per user, a run's `user_id`, quotas, the same rules on
//! PostgreSQL with an API server and a worker, and LangGraph's Python client passing a bearer
//! token.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};

use super::serve::{Server, client, spawn};
use super::support::{self, postgres};

/// A signing key and its public half as a JWK.
struct Key {
    kid: String,
    pkcs8: Vec<u8>,
    jwk: Value,
}

fn ec_key(kid: &str) -> Key {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    // An uncompressed point: 0x04, then x and y.
    let point = pair.public_key().as_ref();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    Key {
        kid: kid.into(),
        pkcs8: pkcs8.as_ref().to_vec(),
        jwk: json!({"kty": "EC", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..65]),
                    "kid": kid, "alg": "ES256", "use": "sig"}),
    }
}

/// The identity provider: its keys, served as a JWKS on loopback.
struct Issuer {
    key: Key,
    jwks: Arc<Mutex<Vec<Value>>>,
    served: support::Served,
}

const ISSUER: &str = "https://id.test/";
const AUDIENCE: &str = "runner";

impl Issuer {
    fn start() -> Issuer {
        let key = ec_key("k1");
        let jwks = Arc::new(Mutex::new(vec![key.jwk.clone()]));
        let shown = jwks.clone();
        let served = support::serve("127.0.0.1", move |_| {
            axum::Router::new().route(
                "/jwks.json",
                axum::routing::get(move || {
                    let keys = shown.lock().unwrap().clone();
                    async move { axum::Json(json!({"keys": keys})) }
                }),
            )
        });
        Issuer { key, jwks, served }
    }

    fn url(&self) -> String {
        format!("http://{}/jwks.json", self.served.addr)
    }

    /// A token for `sub`, expiring `ttl` seconds from now (negative: expired), with `extra`
    /// claims, signed by `key`.
    fn sign(key: &Key, sub: &str, ttl: i64, extra: Value) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let mut claims = json!({"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + ttl});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(key.kid.clone());
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ec_der(&key.pkcs8)).unwrap()
    }

    fn token(&self, sub: &str) -> String {
        Issuer::sign(&self.key, sub, 3600, json!({}))
    }

    fn admin(&self, sub: &str) -> String {
        Issuer::sign(&self.key, sub, 3600, json!({"role": "admin"}))
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth")
}

/// A project folder: the notes workflow and a `runner.toml` holding `toml`.
fn project(toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("workflows")).unwrap();
    std::fs::copy(fixtures().join("notes.yaml"), dir.path().join("workflows/notes.yaml")).unwrap();
    std::fs::write(dir.path().join("runner.toml"), toml).unwrap();
    dir
}

fn start(dir: tempfile::TempDir, args: &[&str]) -> Server {
    let (child, base, _) = spawn(
        dir.path(),
        &dir.path().join("workflows"),
        &fixtures().join("mock.yaml"),
        args,
        &[],
    );
    Server {
        child,
        base,
        dir: Some(dir),
    }
}

/// How a request says who sends it.
#[derive(Clone, Copy)]
enum As<'a> {
    Nobody,
    Bearer(&'a str),
    Key(&'a str),
}

async fn call(base: &str, who: As<'_>, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = client().request(method, format!("{base}{path}"));
    match who {
        As::Nobody => {}
        As::Bearer(t) => req = req.bearer_auth(t),
        As::Key(k) => req = req.header("x-api-key", k),
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    // A stream's frames are text; everything else JSON.
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

/// Runs `runner users …` on the project's database.
fn users(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir)
        .env("RUNNER_DB", dir.join("runner.db"))
        .arg("users")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// What another user meets on a route of the API, by `(method, path)` as the server lists
/// them. A route missing here fails the test: each route's rule is decided, never forgotten.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    /// Anyone, with no credential.
    Open,
    /// Any user: the served workflows are everyone's.
    Everyone,
    /// Names a thread (and its runs, state, history): another user's is a 404.
    Thread,
    /// Creates a thread: another user's id is taken (409), never handed over.
    CreateThread,
    /// Lists threads: another user's are not among them.
    SearchThreads,
    /// Starts a stateless run: the caller's own.
    Stateless,
    /// The store: a user reaches their own namespaces.
    Store,
    /// Only an admin.
    Admin,
    /// Lists or counts crons: another user's are not among them.
    SearchCrons,
    /// Names a cron: another user's is a 404.
    Cron,
}

fn rule(method: &str, path: &str) -> Rule {
    match (method, path) {
        ("GET", "/ok" | "/info") => Rule::Open,
        (_, "/metrics") => Rule::Everyone,
        ("DELETE", "/assistants/{id}/cache") => Rule::Admin,
        (_, p) if p.starts_with("/assistants") => Rule::Everyone,
        ("GET", "/runner/workflows") => Rule::Everyone,
        ("POST", "/runs/crons") => Rule::Stateless,
        ("POST", "/runs/crons/search" | "/runs/crons/count") => Rule::SearchCrons,
        (_, "/runs/crons/{cron_id}") => Rule::Cron,
        ("POST", "/threads") => Rule::CreateThread,
        ("POST", "/threads/search") => Rule::SearchThreads,
        (_, p) if p.starts_with("/threads/{id}") => Rule::Thread,
        ("POST", "/runs" | "/runs/stream" | "/runs/wait" | "/runs/batch") => Rule::Stateless,
        (_, p) if p.starts_with("/store/") => Rule::Store,
        (m, p) => panic!("the route {m} {p} has no ownership rule: decide what another user meets there"),
    }
}

/// A request's body for a route, where it takes one.
fn body_for(method: &str, path: &str, cp: &str) -> Option<Value> {
    let run = json!({"assistant_id": "notes", "input": {"text": "intruder"}});
    Some(match (method, path) {
        ("POST", "/threads/{id}/state") => json!({"values": {"reply": "overwritten"}}),
        ("POST", "/threads/{id}/state/checkpoint") => json!({"checkpoint": {"checkpoint_id": cp}}),
        ("POST", "/threads/{id}/history") => json!({}),
        ("PATCH", "/threads/{id}") => json!({"metadata": {"owner": "alice", "hacked": true}}),
        ("POST", "/threads/{id}/runs" | "/threads/{id}/runs/stream" | "/threads/{id}/runs/wait") => run,
        ("POST", "/runs" | "/runs/stream" | "/runs/wait") => run,
        ("POST", "/runs/batch") => json!([run]),
        ("POST", "/assistants/search") => json!({}),
        ("POST", "/runs/crons" | "/threads/{id}/runs/crons") => {
            json!({"assistant_id": "notes", "schedule": "0 0 * * *"})
        }
        ("PATCH", "/runs/crons/{cron_id}") => json!({"schedule": "0 1 * * *"}),
        ("POST", "/runs/crons/search" | "/runs/crons/count") => json!({}),
        _ => return None,
    })
}

/// Two users on one server: neither reaches the other's threads, runs, state, history or
/// memory on any route of the API or a workflow's own route (404, as if they did not exist);
/// an admin reaches both; what a user makes is stamped with their id and their runs read it as
/// `context.user_id`, whatever the client sent.
#[tokio::test(flavor = "multi_thread")]
async fn users_reach_only_their_own_threads_runs_and_memory_on_every_route() {
    let issuer = Issuer::start();
    let dir = project("[serve.auth]\nuser_keys = true\njwks_min_refresh = 0.2\n");
    let root = dir.path().to_path_buf();
    let url = issuer.url();
    let s = start(
        dir,
        &["--jwks-url", &url, "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE],
    );
    let (alice, bob, admin) = (issuer.token("alice"), issuer.token("bob"), issuer.admin("root"));
    let (a, b, r) = (As::Bearer(&alice), As::Bearer(&bob), As::Bearer(&admin));

    // Bob's thread, his run waiting at its gate, his memory. His client says he is alice: the
    // run is his all the same.
    let (status, thread) = call(
        &s.base,
        b,
        "POST",
        "/threads",
        Some(json!({"metadata": {"topic": "b"}})),
    )
    .await;
    assert_eq!(status, 200, "{thread}");
    assert_eq!(thread["metadata"]["owner"], "bob", "{thread}");
    let tb = thread["thread_id"].as_str().unwrap().to_string();
    let (status, values) = call(
        &s.base,
        b,
        "POST",
        &format!("/threads/{tb}/runs/wait"),
        Some(
            json!({"assistant_id": "notes", "input": {"text": "bob's"}, "context": {"user_id": "alice"},
                    "metadata": {"owner": "alice"}}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["who"], "bob", "the run's user_id is its caller's: {values}");
    let (_, runs) = call(&s.base, b, "GET", &format!("/threads/{tb}/runs"), None).await;
    let run = runs[0]["run_id"].as_str().unwrap().to_string();
    assert_eq!(runs[0]["metadata"]["owner"], "bob", "{runs}");
    assert_eq!(
        runs[0]["kwargs"]["config"]["configurable"]["langgraph_auth_user_id"], "bob",
        "{runs}"
    );
    assert_eq!(runs[0]["kwargs"]["context"], json!({"user_id": "bob"}), "{runs}");
    let (_, state) = call(&s.base, b, "GET", &format!("/threads/{tb}/state"), None).await;
    let cp = state["checkpoint_id"].as_str().unwrap().to_string();
    assert_eq!(state["metadata"]["user_id"], "bob", "{state}");
    let (status, _) = call(
        &s.base,
        b,
        "PUT",
        "/store/items",
        Some(json!({"namespace": ["prefs"], "key": "k", "value": {"v": "bob"}})),
    )
    .await;
    assert_eq!(status, 204);
    // The run's note, in the namespace bob names `[notes]`.
    let (_, note) = call(&s.base, b, "GET", "/store/items?namespace=notes&key=last", None).await;
    assert_eq!(note["value"], json!({"text": "bob's", "who": "bob"}), "{note}");
    assert_eq!(note["namespace"], json!(["notes"]), "{note}");
    let (status, cron) = call(
        &s.base,
        b,
        "POST",
        &format!("/threads/{tb}/runs/crons"),
        Some(json!({"assistant_id": "notes", "schedule": "0 0 * * *"})),
    )
    .await;
    assert_eq!(status, 200, "{cron}");
    let bc = cron["cron_id"].as_str().unwrap().to_string();

    // Alice, on every route of the API.
    let routes = runner::server::api_routes();
    assert!(routes.len() >= 30, "{routes:?}");
    let fill = |p: &str| {
        p.replace("{id}", &tb)
            .replace("{run_id}", &run)
            .replace("{checkpoint_id}", &cp)
            .replace("{cron_id}", &bc)
            .replace("{id}", "notes")
    };
    for (method, path) in routes {
        let rule = rule(method, path);
        let body = body_for(method, path, &cp);
        let at = match rule {
            Rule::Everyone | Rule::Admin => path.replace("{id}", "notes"),
            Rule::Store if method == "GET" => "/store/items?namespace=prefs&key=k".to_string(),
            _ => fill(path),
        };
        let body = match (rule, method) {
            (Rule::CreateThread, _) => Some(json!({"thread_id": tb, "if_exists": "do_nothing"})),
            (Rule::Store, "PUT") => Some(json!({"namespace": ["prefs"], "key": "k", "value": {"v": "alice"}})),
            (Rule::Store, "DELETE") => Some(json!({"namespace": ["prefs"], "key": "k"})),
            (Rule::Store, "POST") if path.ends_with("search") => Some(json!({"namespace_prefix": []})),
            (Rule::Store, "POST") => Some(json!({})),
            _ => body,
        };
        let who = if rule == Rule::Open { As::Nobody } else { a };
        let (status, answer) = call(&s.base, who, method, &at, body).await;
        let said = format!("{method} {at}: {status} {answer}");
        match rule {
            Rule::Open | Rule::Everyone | Rule::Stateless => assert!(status < 300, "{said}"),
            Rule::Admin => assert_eq!(status, 403, "{said}"),
            Rule::Thread => {
                assert_eq!(status, 404, "{said}");
                assert_eq!(answer["detail"], format!("Thread with ID {tb} not found"), "{said}");
            }
            Rule::CreateThread => assert_eq!(status, 409, "{said}"),
            Rule::SearchThreads => {
                assert_eq!(status, 200, "{said}");
                assert!(
                    answer.as_array().unwrap().iter().all(|t| t["thread_id"] != tb.as_str()),
                    "{said}"
                );
            }
            Rule::SearchCrons => {
                assert_eq!(status, 200, "{said}");
                assert!(!answer.to_string().contains(&bc), "alice found bob's cron: {said}");
                if path.ends_with("count") {
                    assert_eq!(answer, json!(1), "only the cron alice made: {said}");
                }
            }
            Rule::Cron => {
                assert_eq!(status, 404, "{said}");
                assert_eq!(answer["detail"], format!("Cron '{bc}' not found"), "{said}");
            }
            Rule::Store => {
                assert!(status < 300, "{said}");
                assert!(
                    !answer.to_string().contains("\"bob\""),
                    "alice read bob's memory: {said}"
                );
            }
        }
    }
    // A workflow's own route on bob's thread is refused alike.
    let (status, answer) = call(&s.base, a, "POST", &format!("/notes/{tb}"), Some(json!({"text": "x"}))).await;
    assert_eq!(
        (status, answer["detail"].clone()),
        (404, json!(format!("Thread with ID {tb} not found")))
    );

    // Bob's thread is as he left it: not deleted, patched, written, resumed or cancelled.
    let (status, thread) = call(&s.base, b, "GET", &format!("/threads/{tb}"), None).await;
    assert_eq!(status, 200, "{thread}");
    assert_eq!(
        thread["metadata"],
        json!({"topic": "b", "owner": "bob", "graph_id": "notes",
        "assistant_id": thread["metadata"]["assistant_id"]}),
        "{thread}"
    );
    assert_eq!(thread["status"], "interrupted", "{thread}");
    let (_, runs) = call(&s.base, b, "GET", &format!("/threads/{tb}/runs"), None).await;
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
    let (_, mine) = call(&s.base, b, "GET", "/store/items?namespace=prefs&key=k", None).await;
    assert_eq!(mine["value"], json!({"v": "bob"}), "{mine}");

    // The owner resumes it.
    let (status, values) = call(
        &s.base,
        b,
        "POST",
        &format!("/threads/{tb}/runs/wait"),
        Some(json!({"assistant_id": "notes", "command": {"resume": {}}})),
    )
    .await;
    assert_eq!(status, 200, "{values}");

    // Alice's own thread, made by a run on an id that did not exist.
    let (status, _) = call(
        &s.base,
        a,
        "POST",
        "/threads/alices/runs/wait",
        Some(json!({"assistant_id": "notes", "input": {"text": "hers"}, "if_not_exists": "create"})),
    )
    .await;
    assert_eq!(status, 200);
    let (_, found) = call(&s.base, a, "POST", "/threads/search", Some(json!({"limit": 100}))).await;
    let ids: Vec<&str> = found
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alices"], "{found}");

    // The admin sees both, and every user's memory as stored.
    let (_, found) = call(&s.base, r, "POST", "/threads/search", Some(json!({"limit": 100}))).await;
    let ids: Vec<&str> = found
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["thread_id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"alices") && ids.contains(&tb.as_str()), "{found}");
    let (status, _) = call(&s.base, r, "GET", &format!("/threads/{tb}/history"), None).await;
    assert_eq!(status, 200);
    let (_, stored) = call(
        &s.base,
        r,
        "GET",
        "/store/items?namespace=users.bob.notes&key=last",
        None,
    )
    .await;
    assert_eq!(stored["value"]["who"], "bob", "{stored}");
    // A shared namespace is everyone's: the admin writes it, a run of alice's reads it.
    let (status, _) = call(
        &s.base,
        r,
        "PUT",
        "/store/items",
        Some(json!({"namespace": ["docs"], "key": "readme", "value": {"hello": "all"}})),
    )
    .await;
    assert_eq!(status, 204);
    let (_, values) = call(
        &s.base,
        a,
        "POST",
        "/runs/wait",
        Some(json!({"assistant_id": "notes", "input": {"text": "x"}})),
    )
    .await;
    assert_eq!(values["shared"], json!({"hello": "all"}), "{values}");
    let (_, item) = call(&s.base, b, "GET", "/store/items?namespace=docs&key=readme", None).await;
    assert_eq!(item["namespace"], json!(["docs"]), "{item}");

    // Tokens: expired, signed by another key, for another audience or issuer, none at all.
    let stranger = ec_key("k1");
    let refused = [
        (Issuer::sign(&issuer.key, "alice", -3600, json!({})), "Token expired"),
        (Issuer::sign(&stranger, "alice", 3600, json!({})), "Invalid token"),
        (
            Issuer::sign(&issuer.key, "alice", 3600, json!({"aud": "other"})),
            "Invalid token",
        ),
        (
            Issuer::sign(&issuer.key, "alice", 3600, json!({"iss": "https://evil.test/"})),
            "Invalid token",
        ),
        ("not.a.jwt".to_string(), "Invalid token"),
    ];
    for (token, why) in refused {
        let (status, answer) = call(&s.base, As::Bearer(&token), "POST", "/threads/search", Some(json!({}))).await;
        assert_eq!((status, answer["detail"].as_str().unwrap()), (401, why), "{token}");
    }
    let (status, answer) = call(&s.base, As::Nobody, "POST", "/threads/search", Some(json!({}))).await;
    assert_eq!(status, 401, "{answer}");

    // A key rotated in at the identity provider is fetched when a token names it.
    let rotated = ec_key("k2");
    issuer.jwks.lock().unwrap().push(rotated.jwk.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let token = Issuer::sign(&rotated, "alice", 3600, json!({}));
    let (status, answer) = call(&s.base, As::Bearer(&token), "POST", "/threads/search", Some(json!({}))).await;
    assert_eq!(status, 200, "{answer}");

    // Per-user keys: made by `runner users`, stored hashed, revoked.
    let (ok, carol_key, said) = users(&root, &["add", "carol"]);
    assert!(ok, "{said}");
    assert!(said.contains("for carol"), "{said}");
    let c = As::Key(&carol_key);
    let (status, thread) = call(&s.base, c, "POST", "/threads", Some(json!({}))).await;
    assert_eq!(
        (status, thread["metadata"]["owner"].clone()),
        (200, json!("carol")),
        "{thread}"
    );
    let (status, _) = call(&s.base, c, "GET", &format!("/threads/{tb}"), None).await;
    assert_eq!(status, 404);
    let (ok, listed, _) = users(&root, &["list"]);
    assert!(
        ok && listed.contains("\tcarol\tuser\t") && listed.contains("active"),
        "{listed}"
    );
    assert!(!listed.contains(&carol_key), "a key is never stored: {listed}");
    let (ok, dan_key, _) = users(&root, &["add", "dan", "--admin"]);
    assert!(ok);
    let (status, _) = call(&s.base, As::Key(&dan_key), "GET", &format!("/threads/{tb}"), None).await;
    assert_eq!(status, 200, "an admin's key sees every thread");
    let (ok, _, said) = users(&root, &["revoke", "carol"]);
    assert!(ok, "{said}");
    let (status, answer) = call(&s.base, c, "POST", "/threads/search", Some(json!({}))).await;
    assert_eq!((status, answer["detail"].clone()), (401, json!("Invalid API key")));
    let (ok, _, said) = users(&root, &["revoke", "carol"]);
    assert!(!ok && said.contains("no active key"), "{said}");
}

/// A quota of runs per window refuses the run past it with 429, saying when the window
/// resets (`Retry-After`), and admits runs again once it has; a quota of tokens counts what
/// the user's runs spent.
#[tokio::test(flavor = "multi_thread")]
async fn a_quota_refuses_with_429_until_its_window_resets() {
    let dir =
        project("[serve.auth]\njwt_secret_env = \"AUTH_TEST_SECRET\"\n\n[serve.quotas]\nwindow = \"3s\"\nruns = 1\n");
    let (child, base, _) = spawn(
        dir.path(),
        &dir.path().join("workflows"),
        &fixtures().join("mock.yaml"),
        &[],
        &[("AUTH_TEST_SECRET", "a secret of the test")],
    );
    let s = Server {
        child,
        base,
        dir: Some(dir),
    };
    let hs = |sub: &str| {
        let exp = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 3600;
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &json!({"sub": sub, "exp": exp}),
            &EncodingKey::from_secret(b"a secret of the test").unwrap(),
        )
        .unwrap()
    };
    let (alice, bob) = (hs("alice"), hs("bob"));
    let run = json!({"assistant_id": "notes", "input": {"text": "q"}});
    // Start just after a window begins, so the two runs fall in one window.
    loop {
        let ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() % 3000;
        if ms < 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = call(&s.base, As::Bearer(&alice), "POST", "/runs/wait", Some(run.clone())).await;
    assert_eq!(status, 200);
    let resp = client()
        .post(format!("{}/runs/wait", s.base))
        .bearer_auth(&alice)
        .json(&run)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let retry: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=3).contains(&retry), "{retry}");
    let detail = resp.json::<Value>().await.unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        detail.contains("1 of 1 runs started") && detail.contains("resets at"),
        "{detail}"
    );
    // Another user's quota is their own.
    let (status, _) = call(&s.base, As::Bearer(&bob), "POST", "/runs/wait", Some(run.clone())).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(retry)).await;
    let (status, answer) = call(&s.base, As::Bearer(&alice), "POST", "/runs/wait", Some(run.clone())).await;
    assert_eq!(status, 200, "the next window admits runs again: {answer}");

    // Tokens: each model call spends 30. With a cap of 25, a run's second call is held back by
    // what the window leaves (as a workflow's `limits` hold a call back), and the next run is
    // refused: the window counted what the first spent.
    let dir = project("[serve.auth]\njwt_secret_env = \"AUTH_TEST_SECRET\"\n\n[serve.quotas]\ntokens = 25\n");
    std::fs::copy(fixtures().join("twice.yaml"), dir.path().join("workflows/twice.yaml")).unwrap();
    let (child, base, _) = spawn(
        dir.path(),
        &dir.path().join("workflows"),
        &fixtures().join("mock.yaml"),
        &[],
        &[("AUTH_TEST_SECRET", "a secret of the test")],
    );
    let s = Server {
        child,
        base,
        dir: Some(dir),
    };
    let (status, values) = call(
        &s.base,
        As::Bearer(&alice),
        "POST",
        "/runs/wait",
        Some(json!({"assistant_id": "twice"})),
    )
    .await;
    assert_eq!(status, 200, "{values}");
    let error = values["__error__"].to_string();
    assert!(
        error.contains("the user's quota: max_tokens of 25 is spent (30 used)"),
        "{values}"
    );
    let (status, answer) = call(&s.base, As::Bearer(&alice), "POST", "/runs/wait", Some(run.clone())).await;
    assert_eq!(status, 429, "{answer}");
    assert!(
        answer["detail"]
            .as_str()
            .unwrap()
            .contains("30 of 25 model tokens used"),
        "{answer}"
    );
}

/// The same rules with the runs on a `runner worker` and the API on another process, both on
/// PostgreSQL: the worker runs a user's run as theirs (its `user_id`, its memory), and another
/// user reaches none of it through the API.
#[tokio::test(flavor = "multi_thread")]
async fn ownership_holds_with_an_api_server_and_a_worker_on_postgres() {
    let issuer = Issuer::start();
    let db = postgres::fresh_url();
    let dir = project("");
    let url = issuer.url();
    let (child, base, _) = spawn(
        dir.path(),
        &dir.path().join("workflows"),
        &fixtures().join("mock.yaml"),
        &[
            "--db",
            &db,
            "--workers",
            "0",
            "--jwks-url",
            &url,
            "--jwt-issuer",
            ISSUER,
        ],
        &[],
    );
    let mut worker = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(dir.path())
        .args(["worker", "workflows", "--db", &db, "--workers", "4", "--mock"])
        .arg(fixtures().join("mock.yaml"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let s = Server {
        child,
        base,
        dir: Some(dir),
    };
    let (alice, bob, admin) = (issuer.token("alice"), issuer.token("bob"), issuer.admin("root"));
    let (a, b, r) = (As::Bearer(&alice), As::Bearer(&bob), As::Bearer(&admin));

    let (status, run) = call(
        &s.base,
        a,
        "POST",
        "/threads/pg-alice/runs",
        Some(json!({"assistant_id": "notes", "input": {"text": "on a worker"}, "if_not_exists": "create"})),
    )
    .await;
    assert_eq!(status, 200, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let (status, values) = call(
        &s.base,
        a,
        "GET",
        &format!("/threads/pg-alice/runs/{run_id}/join"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(values["who"], "alice", "the worker ran it as alice's: {values}");
    let (_, stored) = call(
        &s.base,
        r,
        "GET",
        "/store/items?namespace=users.alice.notes&key=last",
        None,
    )
    .await;
    assert_eq!(stored["value"]["who"], "alice", "{stored}");

    for (method, path) in [
        ("GET", "/threads/pg-alice".to_string()),
        ("GET", format!("/threads/pg-alice/runs/{run_id}")),
        ("GET", format!("/threads/pg-alice/runs/{run_id}/join")),
        ("GET", format!("/threads/pg-alice/runs/{run_id}/stream")),
        ("POST", format!("/threads/pg-alice/runs/{run_id}/cancel")),
        ("GET", "/threads/pg-alice/state".to_string()),
        ("DELETE", "/threads/pg-alice".to_string()),
    ] {
        let (status, answer) = call(&s.base, b, method, &path, None).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
    }
    let (status, _) = call(
        &s.base,
        b,
        "POST",
        "/threads/pg-alice/runs/wait",
        Some(json!({"assistant_id": "notes", "command": {"resume": {}}})),
    )
    .await;
    assert_eq!(status, 404, "bob cannot resume alice's thread");
    let (_, found) = call(&s.base, b, "POST", "/threads/search", Some(json!({}))).await;
    assert_eq!(found, json!([]));
    let (status, thread) = call(&s.base, r, "GET", "/threads/pg-alice", None).await;
    assert_eq!((status, thread["metadata"]["owner"].clone()), (200, json!("alice")));
    let _ = worker.kill();
    let _ = worker.wait();
}

/// LangGraph's Python client, given `headers={"Authorization": "Bearer …"}`, works unchanged,
/// and meets another user's thread as the SDK's not-found error.
#[test]
fn the_python_sdk_passes_a_bearer_token_unchanged() {
    let python = super::serve::sdk_python();
    let issuer = Issuer::start();
    let url = issuer.url();
    let s = start(project(""), &["--jwks-url", &url]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/auth.py");
    super::serve::script_passes(
        Command::new(python)
            .arg(script)
            .arg(&s.base)
            .arg(issuer.token("alice"))
            .arg(issuer.token("bob")),
        "sdk auth: every check passed",
    );
}

/// A user's cron is theirs: another user neither finds nor reaches it, and each run it starts
/// runs as its owner — their thread, their `context.user_id` — as if they had started it.
#[tokio::test(flavor = "multi_thread")]
async fn a_users_cron_is_theirs_and_runs_as_them() {
    const Y2030: i64 = 1_893_456_000_000;
    let dir = project("[serve.auth]\nuser_keys = true\n");
    let root = dir.path().to_path_buf();
    let (ok, bob, said) = users(&root, &["add", "bob"]);
    assert!(ok, "{said}");
    let (ok, alice, said) = users(&root, &["add", "alice"]);
    assert!(ok, "{said}");
    let clock = root.join("clock");
    let set_clock = |ms: i64| {
        std::fs::write(root.join("clock.next"), ms.to_string()).unwrap();
        std::fs::rename(root.join("clock.next"), &clock).unwrap();
    };
    set_clock(Y2030 + 30_000);
    let s = start(dir, &["--clock-file", clock.to_str().unwrap()]);
    let request = json!({"assistant_id": "notes", "schedule": "* * * * *", "input": {"text": "from cron"},
                         "on_run_completed": "keep"});
    let (status, cron) = call(&s.base, As::Key(&bob), "POST", "/runs/crons", Some(request)).await;
    assert_eq!(status, 200, "{cron}");
    let id = cron["cron_id"].as_str().unwrap().to_string();
    let (status, _) = call(&s.base, As::Key(&alice), "GET", &format!("/runs/crons/{id}"), None).await;
    assert_eq!(status, 404);
    let (_, found) = call(&s.base, As::Key(&alice), "POST", "/runs/crons/search", Some(json!({}))).await;
    assert_eq!(found, json!([]));
    let (_, found) = call(&s.base, As::Key(&bob), "POST", "/runs/crons/search", Some(json!({}))).await;
    assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");

    // The first tick: its run is bob's.
    set_clock(Y2030 + 70_000);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let thread = loop {
        let (_, threads) = call(&s.base, As::Key(&bob), "POST", "/threads/search", Some(json!({}))).await;
        if let Some(t) = threads
            .as_array()
            .and_then(|t| t.iter().find(|t| t["values"]["who"] == "bob"))
        {
            break t.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no run of bob's cron: {threads}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(thread["metadata"]["owner"], "bob", "{thread}");
    let (_, theirs) = call(&s.base, As::Key(&alice), "POST", "/threads/search", Some(json!({}))).await;
    assert_eq!(theirs, json!([]), "alice sees no thread of bob's cron");
}
