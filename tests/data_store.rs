//! The data store: one conformance suite, run against every backend — SQLite (a file, and
//! `:memory:`), PostgreSQL with vectors scored in-process (`pgvector=off`), and PostgreSQL with
//! pgvector when the test server has the extension — then what only PostgreSQL promises:
//! errors that name the database and never the password, and a store without pgvector moved to
//! it once the server has it.
//!
//! The cases go through the store's own API ([`DataStore`], the shared functions of
//! `runner::rag`), never a backend's SQL, so each asserts what a user of any backend sees.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use runner::clock::{at_ms, now_ms};
use runner::providers::{Embedder, Embeddings, ProviderError};
use runner::rag::backend::MemoryRows;
use runner::rag::chunk::Chunking;
use runner::rag::embed::{HashedEmbedder, dot};
use runner::rag::extract::Format;
use runner::rag::index::{Document, index_documents};
use runner::rag::memory::{
    Indexing, ItemQuery, MemoryIndex, delete, get, get_all, item, items, namespaces, put, put_for, put_indexed,
    put_with, search, search_items,
};
use runner::rag::search::{self, Request};
use runner::rag::{DataStore, Location, cache, calibrate};
use serde_json::{Value, json};

use crate::support;

// ---------------------------------------------------------------------------------------------
// Backends.

/// A store and what keeps it alive.
pub(crate) struct Store {
    pub(crate) store: DataStore,
    /// Another handle on the same database, as a second process would open it (none for
    /// `:memory:`, which no one else sees).
    pub(crate) reopen: Option<Box<dyn Fn() -> DataStore>>,
    _dir: Option<tempfile::TempDir>,
}

fn sqlite() -> Option<Store> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.db");
    let at = path.clone();
    Some(Store {
        store: DataStore::at(&path),
        reopen: Some(Box::new(move || DataStore::at(&at))),
        _dir: Some(dir),
    })
}

fn sqlite_memory() -> Option<Store> {
    Some(Store {
        store: DataStore::default(),
        reopen: None,
        _dir: None,
    })
}

/// A fresh schema on the test server, with `pgvector=` as given.
fn postgres_url(pgvector: &str) -> String {
    format!("{}&pgvector={pgvector}", support::postgres::fresh_url())
}

fn on_postgres(url: String) -> Store {
    let at = url.clone();
    Store {
        store: DataStore::new(Location::Postgres(url)),
        reopen: Some(Box::new(move || DataStore::new(Location::Postgres(at.clone())))),
        _dir: None,
    }
}

fn postgres() -> Option<Store> {
    Some(on_postgres(postgres_url("off")))
}

/// PostgreSQL with pgvector, when the server has it: `None` (the cases are skipped, saying
/// so) on a server without the extension.
fn pgvector() -> Option<Store> {
    let store = on_postgres(postgres_url("on"));
    match store.store.with_blocking(|c| c.index_embedder("none")) {
        Ok(_) => Some(store),
        Err(e) if e.to_string().contains("pgvector") => {
            eprintln!("skipped: the test server has no pgvector ({e})");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

macro_rules! conformance {
    ($name:ident, $backend:expr) => {
        mod $name {
            conformance!(
                @cases $backend,
                reindexing_skips_unchanged_documents_and_replaces_changed_ones,
                an_index_refuses_another_embedders_vectors,
                hybrid_search_fuses_keywords_and_vectors,
                documents_restrict_a_search_and_windows_bring_neighbours,
                dropping_an_index_takes_its_documents_and_calibration,
                calibration_is_kept_until_the_index_changes,
                query_embeddings_are_cached_per_embedder,
                memory_puts_gets_deletes_and_lists,
                keyword_search_matches_any_word_under_a_prefix,
                expired_items_are_swept_before_every_read,
                items_filter_before_paging_and_namespaces_cut_to_a_depth,
                a_semantic_index_ranks_by_similarity_and_scoreless_items_fill_the_page,
                another_handle_sees_what_one_stored
            );
        }
    };
    (@cases $backend:expr, $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                if let Some(backend) = $backend {
                    super::$case(&backend);
                }
            }
        )*
    };
}

conformance!(sqlite, super::sqlite());
conformance!(sqlite_memory, super::sqlite_memory());
conformance!(postgres, super::postgres());
conformance!(pgvector, super::pgvector());

// ---------------------------------------------------------------------------------------------
// Fixtures.

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn ns(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

fn documents(text: &[(&str, &str)]) -> Vec<Result<Document, (String, String)>> {
    text.iter()
        .map(|(name, text)| {
            Ok(Document {
                key: name.to_string(),
                name: name.to_string(),
                title: None,
                format: Format::Markdown,
                text: text.to_string(),
                metadata: json!({}),
            })
        })
        .collect()
}

fn index(store: &DataStore, name: &str, docs: &[(&str, &str)]) -> runner::rag::index::Summary {
    block_on(index_documents(
        store,
        name,
        Arc::new(HashedEmbedder),
        documents(docs),
        Chunking::new(Some(200), Some(0)),
        &|_, _, _| {},
    ))
    .unwrap()
}

/// A search of `index` for `queries` with the offline embedder.
fn request(index: &str, queries: &[&str], documents: &[&str], candidates: usize) -> Request {
    Request {
        index: index.into(),
        embedder: runner::rag::embed::ID.into(),
        queries: queries
            .iter()
            .map(|q| (q.to_string(), HashedEmbedder::vector(q)))
            .collect(),
        documents: documents.iter().map(|d| d.to_string()).collect(),
        candidates,
    }
}

/// Every chunk of `index`: (document name, position, text), in document and position order.
fn chunks_of(store: &DataStore, index: &str) -> Vec<(String, i64, String)> {
    let index = index.to_string();
    store
        .with_blocking(move |c| {
            let mut out = Vec::new();
            for (id, _, _) in c.documents(&index)? {
                for row in c.window(id, 0, i64::MAX)? {
                    out.push((row.document, row.position, row.text));
                }
            }
            out.sort();
            Ok(out)
        })
        .unwrap()
}

const KB: &[(&str, &str)] = &[
    (
        "tides.md",
        "# Tides\n\nThe moon pulls the oceans: high tide and low tide follow it twice a day.\n\n\
         ## Spring tides\n\nWhen sun and moon align the tides are strongest.",
    ),
    (
        "bread.md",
        "# Bread\n\nSourdough needs a starter, flour, water and salt, and a long slow rise.\n\n\
         ## Baking\n\nBake the loaf in a hot oven with steam for a crisp crust.",
    ),
    (
        "garden.md",
        "# Garden\n\nCompost feeds the soil; worms turn it. Water the beds at dawn.",
    ),
];

// ---------------------------------------------------------------------------------------------
// Indexes and search.

fn reindexing_skips_unchanged_documents_and_replaces_changed_ones(b: &Store) {
    let store = &b.store;
    let first = index(store, "kb", &[("a.md", "# A\n\nalpha"), ("b.md", "# B\n\nbeta")]);
    assert_eq!((first.indexed.len(), first.skipped.len(), first.chunks), (2, 0, 2));
    let second = index(
        store,
        "kb",
        &[
            ("a.md", "# A\n\nalpha"),
            ("b.md", "# B\n\nbeta, now longer\n\n## More\n\ngamma"),
        ],
    );
    assert_eq!(second.indexed, ["b.md"]);
    assert_eq!(second.skipped, ["a.md"]);
    let texts: Vec<String> = chunks_of(store, "kb").into_iter().map(|c| c.2).collect();
    assert_eq!(texts, ["# A\n\nalpha", "# B\n\nbeta, now longer", "## More\n\ngamma"]);
    // The old chunk's keyword entry went with it: a keyword only it had finds nothing, one the
    // new chunk has finds that chunk once.
    let found = store
        .with_blocking(|c| {
            let words = |w: &str| vec![w.to_string()];
            Ok((
                c.keyword("kb", &[], &words("beta"), 10)?,
                c.keyword("kb", &[], &words("gamma"), 10)?,
            ))
        })
        .unwrap();
    assert_eq!(found.0.len(), 1, "{found:?}");
    assert_eq!(found.1.len(), 1, "{found:?}");
}

struct OtherEmbedder;

impl Embedder for OtherEmbedder {
    fn id(&self) -> &str {
        "test:other"
    }
    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        Box::pin(async move {
            Ok(Embeddings {
                vectors: texts.iter().map(|_| vec![1.0, 0.0]).collect(),
                usage: Default::default(),
            })
        })
    }
}

fn an_index_refuses_another_embedders_vectors(b: &Store) {
    let store = &b.store;
    index(store, "kb", &[("a.md", "alpha")]);
    let err = block_on(index_documents(
        store,
        "kb",
        Arc::new(OtherEmbedder),
        documents(&[("b.md", "beta")]),
        Chunking::default(),
        &|_, _, _| {},
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("index `kb` was built with embedder `runner:hashed-bow-512`") && err.contains("test:other"),
        "{err}"
    );
    let mut req = request("kb", &["alpha"], &[], 5);
    req.embedder = "test:other".into();
    let err = store.with_blocking(|c| search::search(c, &req)).unwrap_err();
    assert!(err.to_string().contains("cannot be searched"), "{err}");
    let err = store
        .with_blocking(|c| search::search(c, &request("nowhere", &["alpha"], &[], 5)))
        .unwrap_err();
    assert!(err.to_string().contains("runner index DIR --index nowhere"), "{err}");
}

fn hybrid_search_fuses_keywords_and_vectors(b: &Store) {
    let store = &b.store;
    index(store, "kb", KB);
    let found = store
        .with_blocking(|c| search::search(c, &request("kb", &["when are the tides strongest"], &[], 3)))
        .unwrap();
    let top = &found.hits[0];
    assert_eq!(top.chunk.document, "tides.md", "{found:#?}");
    assert!(top.chunk.text.contains("strongest"), "{found:#?}");
    assert!(found.hits.len() <= 3);
    // Fused by rank: the first hit leads both rankings, 2/61 at most.
    assert!(top.rrf > 0.0 && top.rrf <= 2.0 / 61.0 + 1e-12, "{}", top.rrf);
    // Every cosine reported is the stored vector's with the query, computed the same way on
    // every backend; the best distance is the nearest chunk's.
    let q = HashedEmbedder::vector("when are the tides strongest");
    // A chunk is embedded with its heading path before its text.
    let v = HashedEmbedder::vector(&match &top.chunk.heading {
        Some(h) => format!("{h}\n{}", top.chunk.text),
        None => top.chunk.text.clone(),
    });
    assert!((top.cosine - f64::from(dot(&q, &v))).abs() < 1e-6, "{}", top.cosine);
    let best = found.hits.iter().map(|h| h.cosine).fold(f64::MIN, f64::max);
    assert!((found.best_distance.unwrap() - (1.0 - best)).abs() < 1e-9);
    // Several queries: each's best chunk is found, fused into one list.
    let both = store
        .with_blocking(|c| {
            search::search(
                c,
                &request("kb", &["sourdough starter flour", "compost worms soil"], &[], 4),
            )
        })
        .unwrap();
    let docs: Vec<&str> = both.hits.iter().map(|h| h.chunk.document.as_str()).collect();
    assert!(
        docs[..2].contains(&"bread.md") && docs[..2].contains(&"garden.md"),
        "{docs:?}"
    );
    // No query: nothing searched.
    let none = store
        .with_blocking(|c| search::search(c, &request("kb", &[], &[], 3)))
        .unwrap();
    assert!(none.hits.is_empty() && none.best_distance.is_none());
}

fn documents_restrict_a_search_and_windows_bring_neighbours(b: &Store) {
    let store = &b.store;
    index(store, "kb", KB);
    let found = store
        .with_blocking(|c| search::search(c, &request("kb", &["moon tides"], &["@Bread"], 10)))
        .unwrap();
    assert!(!found.hits.is_empty());
    assert!(found.hits.iter().all(|h| h.chunk.document == "bread.md"), "{found:#?}");
    assert_eq!(found.documents.len(), 1);
    // Several searches fused: the documents searched are the union.
    let all = store
        .with_blocking(|c| {
            search::search_all(
                c,
                &[
                    request("kb", &["moon"], &["tides"], 5),
                    request("kb", &["compost"], &["garden.md"], 5),
                ],
            )
        })
        .unwrap();
    assert_eq!(all.documents.len(), 2);
    let first = found.hits.iter().find(|h| h.chunk.position == 0).unwrap();
    let window = store
        .with_blocking(|c| search::window(c, first.chunk.doc_id, 0, 5))
        .unwrap();
    let positions: Vec<i64> = window.iter().map(|r| r.position).collect();
    assert_eq!(positions, [0, 1], "{window:#?}");
    assert_eq!(window[1].heading.as_deref(), Some("Bread > Baking"));
}

fn dropping_an_index_takes_its_documents_and_calibration(b: &Store) {
    let store = &b.store;
    index(store, "kb", KB);
    index(store, "other", &[("x.md", "# X\n\nkept")]);
    calibrate_now(store, "kb");
    assert!(store.with_blocking(|c| c.calibration("kb")).unwrap().is_some());
    store
        .with_blocking(|c| runner::rag::index::drop_index(c, "kb"))
        .unwrap();
    assert!(chunks_of(store, "kb").is_empty());
    assert_eq!(chunks_of(store, "other").len(), 1, "another index is untouched");
    let calibration = store.with_blocking(|c| c.calibration("kb")).unwrap();
    assert_eq!(calibration, None);
    // Built again, with another embedder this time.
    block_on(index_documents(
        store,
        "kb",
        Arc::new(OtherEmbedder),
        documents(&[("b.md", "beta")]),
        Chunking::default(),
        &|_, _, _| {},
    ))
    .unwrap();
}

/// Computes the calibration of `index` with the offline embedder, as a search would.
fn calibrate_now(store: &DataStore, index: &str) -> Option<calibrate::Calibration> {
    let samples = match store.with_blocking(|c| calibrate::stored(c, index)).unwrap() {
        calibrate::Stored::Stale(samples) => samples,
        other => panic!("{other:?}"),
    };
    assert!(!samples.is_empty());
    let vectors: Vec<Vec<f32>> = samples.iter().map(|s| HashedEmbedder::vector(&s.query)).collect();
    store
        .with_blocking(|c| calibrate::compute(c, index, &samples, &vectors))
        .unwrap()
}

fn calibration_is_kept_until_the_index_changes(b: &Store) {
    let store = &b.store;
    index(store, "kb", KB);
    let computed = calibrate_now(store, "kb").expect("three documents calibrate");
    assert!(computed.matching > computed.unrelated, "{computed:?}");
    match store.with_blocking(|c| calibrate::stored(c, "kb")).unwrap() {
        calibrate::Stored::Current(Some(k)) => assert_eq!(k, computed),
        other => panic!("{other:?}"),
    }
    index(store, "kb", &[("new.md", "# New\n\nSomething else entirely.")]);
    assert!(matches!(
        store.with_blocking(|c| calibrate::stored(c, "kb")).unwrap(),
        calibrate::Stored::Stale(_)
    ));
}

/// An embedder that counts the texts it is asked for.
struct Counting(AtomicUsize);

impl Embedder for Counting {
    fn id(&self) -> &str {
        "test:counting"
    }
    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Embeddings, ProviderError>> {
        self.0.fetch_add(texts.len(), Ordering::SeqCst);
        Box::pin(async move {
            Ok(Embeddings {
                vectors: texts.iter().map(|t| HashedEmbedder::vector(t)).collect(),
                usage: Default::default(),
            })
        })
    }
}

fn query_embeddings_are_cached_per_embedder(b: &Store) {
    let store = &b.store;
    let counting = Counting(AtomicUsize::new(0));
    let texts = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let first = block_on(cache::embed(store, &counting, &texts(&["moon tides", "bread"]))).unwrap();
    assert_eq!((first.hits, counting.0.load(Ordering::SeqCst)), (0, 2));
    let again = block_on(cache::embed(store, &counting, &texts(&["bread", "soil", "moon tides"]))).unwrap();
    assert_eq!((again.hits, counting.0.load(Ordering::SeqCst)), (2, 3));
    // In order, unit length, equal to what the embedder gave.
    assert_eq!(again.vectors[0], first.vectors[1]);
    assert_eq!(again.vectors[2], first.vectors[0]);
    let norm: f32 = again.vectors[1].iter().map(|x| x * x).sum();
    assert!((norm - 1.0).abs() < 1e-5);
    // Kept per embedder: another asks its own.
    let cached = store
        .with_blocking(|c| c.cached_vectors("test:other", &[cache::key("bread")]))
        .unwrap();
    assert_eq!(cached, [None]);
    if let Some(reopen) = &b.reopen {
        let other = Counting(AtomicUsize::new(0));
        block_on(cache::embed(&reopen(), &other, &texts(&["soil"]))).unwrap();
        assert_eq!(
            other.0.load(Ordering::SeqCst),
            0,
            "another process's cache is this one's"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Long-term memory.

fn memory_puts_gets_deletes_and_lists(b: &Store) {
    let store = &b.store;
    // A millisecond apart at least: times are stored to the millisecond.
    for (namespace, key, value) in [
        (&["u", "alice"][..], "prefs", json!({"tone": "brief"})),
        (&["u", "alice"], "name", json!("Alice")),
        (&["u", "alice", "notes"], "n1", json!({"text": "moon"})),
        (&["u", "bob"], "prefs", json!({"tone": "long"})),
    ] {
        put_on(store, namespace, key, value);
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
    let got = store
        .with_blocking(|c| get(c, &ns(&["u", "alice"]), "prefs", true))
        .unwrap();
    assert_eq!(got, json!({"tone": "brief"}));
    let all = store.with_blocking(|c| get_all(c, &ns(&["u", "alice"]), true)).unwrap();
    assert_eq!(
        all,
        json!({"name": "Alice", "prefs": {"tone": "brief"}}),
        "one namespace, by key"
    );
    let shown = store
        .with_blocking(|c| item(c, &ns(&["u", "alice"]), "prefs", false))
        .unwrap()
        .unwrap();
    assert_eq!(shown["namespace"], json!(["u", "alice"]));
    let created = shown["created_at"].clone();
    assert!(created.is_string() && shown["updated_at"].is_string(), "{shown}");
    // Replacing keeps when it was first stored.
    std::thread::sleep(std::time::Duration::from_millis(5));
    store
        .with_blocking(|c| put(c, &ns(&["u", "alice"]), "prefs", &json!({"tone": "warm"})))
        .unwrap();
    let again = store
        .with_blocking(|c| item(c, &ns(&["u", "alice"]), "prefs", false))
        .unwrap()
        .unwrap();
    assert_eq!(
        (again["created_at"].clone(), again["value"].clone()),
        (created, json!({"tone": "warm"}))
    );
    assert_ne!(again["updated_at"], shown["updated_at"]);
    // Without a query, the most recently updated first; the prefix takes whole labels only.
    let recent = store
        .with_blocking(|c| search(c, &ns(&["u"]), None, 10, false))
        .unwrap();
    let keys: Vec<&str> = recent.iter().map(|i| i["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["prefs", "prefs", "n1", "name"], "{recent:#?}");
    assert_eq!(recent[0]["namespace"], json!(["u", "alice"]));
    put_on(store, &["u", "alice2"], "x", json!(1));
    let under_alice = store
        .with_blocking(|c| search(c, &ns(&["u", "alice"]), None, 10, false))
        .unwrap();
    assert_eq!(under_alice.len(), 3, "`alice2` is not under `alice`: {under_alice:#?}");
    assert!(store.with_blocking(|c| delete(c, &ns(&["u", "bob"]), "prefs")).unwrap());
    assert!(!store.with_blocking(|c| delete(c, &ns(&["u", "bob"]), "prefs")).unwrap());
    assert_eq!(
        store
            .with_blocking(|c| get(c, &ns(&["u", "bob"]), "prefs", true))
            .unwrap(),
        Value::Null
    );
}

fn put_on(store: &DataStore, namespace: &[&str], key: &str, value: Value) {
    let (namespace, key) = (ns(namespace), key.to_string());
    store.with_blocking(move |c| put(c, &namespace, &key, &value)).unwrap();
}

fn keyword_search_matches_any_word_under_a_prefix(b: &Store) {
    let store = &b.store;
    put_on(
        store,
        &["kb", "50%_off"],
        "tides",
        json!({"text": "the moon pulls the tides"}),
    );
    put_on(
        store,
        &["kb", "50%_off"],
        "bread",
        json!({"text": "sourdough bread rises slowly"}),
    );
    put_on(
        store,
        &["kb", "50%_off"],
        "both",
        json!({"text": "moon bread", "tags": ["tides"]}),
    );
    put_on(store, &["kb", "500"], "lighthouse", json!({"text": "moon tides"}));
    let found = store
        .with_blocking(|c| search(c, &ns(&["kb", "50%_off"]), Some("Moon, tides!"), 10, false))
        .unwrap();
    let keys: Vec<&str> = found.iter().map(|i| i["key"].as_str().unwrap()).collect();
    // Any word matches, case ignored; `bread` has neither word; a label with `%` and `_` is
    // matched as it is written, and `500` is not under `50%_off`.
    assert_eq!(keys.len(), 2, "{found:#?}");
    assert!(keys.contains(&"tides") && keys.contains(&"both"), "{keys:?}");
    assert!(found.iter().all(|i| i["score"].as_f64().unwrap() > 0.0), "{found:#?}");
    let keyed = store
        .with_blocking(|c| search(c, &ns(&["kb"]), Some("sourdough"), 10, false))
        .unwrap();
    assert_eq!(keyed.len(), 1);
    assert_eq!(keyed[0]["key"], "bread");
    // The key itself is searchable, and the limit holds.
    let by_key = store
        .with_blocking(|c| search(c, &ns(&["kb"]), Some("lighthouse"), 10, false))
        .unwrap();
    assert_eq!(by_key[0]["key"], "lighthouse");
    let limited = store
        .with_blocking(|c| search(c, &ns(&["kb"]), Some("moon"), 1, false))
        .unwrap();
    assert_eq!(limited.len(), 1);
    // The same through `items`: scores, every match, paging after.
    let listed = store
        .with_blocking(|c| {
            items(
                c,
                &ItemQuery {
                    prefix: ns(&["kb"]),
                    query: Some("moon".into()),
                    limit: 10,
                    ..Default::default()
                },
            )
        })
        .unwrap();
    assert_eq!(listed.len(), 3, "{listed:#?}");
    assert!(listed.iter().all(|i| i["score"].is_f64()));
    let words = store
        .with_blocking(|c| {
            c.memory_rows(MemoryRows::Matching {
                prefix: "",
                words: &[],
                limit: None,
            })
        })
        .unwrap();
    assert!(words.is_empty(), "no words match nothing");
}

/// An item whose time has come is gone from every read, keyword entry included, and a
/// refreshing read moves its expiry on by its ttl; one put without a ttl never expires.
fn expired_items_are_swept_before_every_read(b: &Store) {
    let store = &b.store;
    // As the store keeps the namespace `[t]`.
    let t = "t\u{1f}";
    let expires = |key: &'static str| {
        store
            .with_blocking(move |c| Ok(c.memory_item(t, key)?.and_then(|r| r.expires_at)))
            .unwrap()
    };
    let minutes = |m: i64| at_ms(now_ms() + m * 60_000);
    store
        .with_blocking(|c| {
            put_for(c, &ns(&["t"]), "old", &json!({"w": "tide"}), Some(1.0))?;
            put_for(c, &ns(&["t"]), "fresh", &json!({"w": "tide"}), Some(60.0))?;
            put(c, &ns(&["t"]), "kept", &json!({"w": "tide"}))
        })
        .unwrap();
    assert_eq!(expires("kept"), None);
    let before = expires("fresh").unwrap();
    assert!(before > minutes(59) && before <= minutes(60), "{before}");
    store
        .with_blocking(|c| {
            c.set_expiry(t, "old", &at_ms(now_ms() - 1))?;
            c.set_expiry(t, "fresh", &at_ms(now_ms() + 30_000))
        })
        .unwrap();
    let found = store
        .with_blocking(|c| search(c, &ns(&["t"]), Some("tide"), 10, false))
        .unwrap();
    let keys: Vec<&str> = found.iter().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!(keys.len(), 2, "{found:?}");
    assert!(!keys.contains(&"old"));
    // Its keyword entry went with it: an item put again under its key is found once.
    put_on(store, &["t"], "old", json!({"w": "tide"}));
    let found = store
        .with_blocking(|c| search(c, &ns(&["t"]), Some("tide"), 10, false))
        .unwrap();
    assert_eq!(found.len(), 3, "{found:?}");
    // Without a refresh the expiry stays; with one it is an hour away again.
    store.with_blocking(|c| item(c, &ns(&["t"]), "fresh", false)).unwrap();
    assert!(expires("fresh").unwrap() < minutes(1));
    store.with_blocking(|c| item(c, &ns(&["t"]), "fresh", true)).unwrap();
    assert!(expires("fresh").unwrap() > minutes(59));
    let bad = store.with_blocking(|c| put_for(c, &ns(&["t"]), "x", &json!({}), Some(-1.0)));
    assert!(bad.is_err());
}

fn items_filter_before_paging_and_namespaces_cut_to_a_depth(b: &Store) {
    let store = &b.store;
    store
        .with_blocking(|c| {
            for (i, who) in ["a", "b", "c"].iter().enumerate() {
                put(c, &ns(&["users", who]), "k", &json!({"even": i % 2 == 0}))?;
                put(c, &ns(&["users", who, "notes"]), "n", &json!({"even": false}))?;
            }
            Ok(())
        })
        .unwrap();
    let even = serde_json::Map::from_iter([("even".to_string(), json!(true))]);
    let page = |offset| {
        store
            .with_blocking(|c| {
                items(
                    c,
                    &ItemQuery {
                        prefix: ns(&["users"]),
                        filter: Some(even.clone()),
                        limit: 1,
                        offset,
                        ..Default::default()
                    },
                )
            })
            .unwrap()
    };
    // Two items match (a and c): the filter is applied before the page is cut; without a
    // query, in the order they were put.
    assert_eq!(page(0)[0]["namespace"], json!(["users", "a"]));
    assert_eq!(page(1)[0]["namespace"], json!(["users", "c"]));
    assert!(page(2).is_empty());
    let listed = store
        .with_blocking(|c| namespaces(c, &ns(&["users"]), &[], Some(2), 100, 0))
        .unwrap();
    assert_eq!(listed, [ns(&["users", "a"]), ns(&["users", "b"]), ns(&["users", "c"])]);
    let notes = store
        .with_blocking(|c| namespaces(c, &[], &ns(&["notes"]), None, 1, 1))
        .unwrap();
    assert_eq!(notes, [ns(&["users", "b", "notes"])]);
    // Byte order, as SQLite sorts: upper case before lower, `_` between them.
    put_on(store, &["Zed"], "k", json!(1));
    put_on(store, &["_x"], "k", json!(1));
    let every = store
        .with_blocking(|c| namespaces(c, &[], &[], Some(1), 100, 0))
        .unwrap();
    assert_eq!(every, [ns(&["Zed"]), ns(&["_x"]), ns(&["users"])]);
}

/// With a semantic index, a query ranks items by their best field's similarity; items put
/// without vectors (or with another embedder's) only fill a page's room, scoreless; a value
/// replaced or deleted takes its vectors with it.
fn a_semantic_index_ranks_by_similarity_and_scoreless_items_fill_the_page(b: &Store) {
    let store = b.store.clone().with_memory_index(MemoryIndex {
        embedder: Arc::new(HashedEmbedder),
        fields: vec!["text".into()],
    });
    let put = |key: &'static str, value: Value, indexing: Indexing| {
        block_on(put_indexed(&store, ns(&["m"]), key.into(), value, None, &indexing)).unwrap()
    };
    put(
        "tides",
        json!({"text": "the moon pulls the tides of the sea"}),
        Indexing::Default,
    );
    put(
        "bread",
        json!({"text": "baking sourdough bread at home"}),
        Indexing::Default,
    );
    put(
        "both",
        json!({"a": "garden soil", "b": "moon tides"}),
        Indexing::Fields(vec!["a".into(), "b".into()]),
    );
    put("plain", json!({"text": "moon tides moon tides"}), Indexing::Off);
    let search = |offset: usize, limit: usize| {
        block_on(search_items(
            &store,
            ItemQuery {
                prefix: ns(&["m"]),
                query: Some("moon tides".into()),
                limit,
                offset,
                ..Default::default()
            },
        ))
        .unwrap()
    };
    let found = search(0, 10);
    let keys: Vec<&str> = found.iter().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!(keys, ["both", "tides", "bread", "plain"], "{found:#?}");
    let scores: Vec<Option<f64>> = found.iter().map(|i| i["score"].as_f64()).collect();
    assert!(scores[0] > scores[1] && scores[1] > scores[2], "{scores:?}");
    assert!(scores[0].unwrap() <= 1.0 + 1e-6);
    let expected = dot(
        &HashedEmbedder::vector("moon tides"),
        &HashedEmbedder::vector("the moon pulls the tides of the sea"),
    );
    assert!((scores[1].unwrap() - f64::from(expected)).abs() < 1e-5, "{scores:?}");
    assert_eq!(scores[3], None, "an item put with indexing off has no score");
    // Paging is over the ranked items; the scoreless one fills only a page with room.
    assert_eq!(search(1, 1)[0]["key"], "tides");
    let last = search(3, 2);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0]["key"], "plain");
    // Without a query, in the order they were put, no scores.
    let all = block_on(search_items(
        &store,
        ItemQuery {
            prefix: ns(&["m"]),
            limit: 10,
            ..Default::default()
        },
    ))
    .unwrap();
    let keys: Vec<&str> = all.iter().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!(keys, ["tides", "bread", "both", "plain"]);
    assert!(all.iter().all(|i| i["score"].is_null()));
    // Replacing a value without indexing drops its vectors; deleting one drops them too.
    put("tides", json!({"text": "the moon pulls the tides"}), Indexing::Off);
    store.with_blocking(|c| delete(c, &ns(&["m"]), "both")).unwrap();
    let query = HashedEmbedder::vector("moon tides");
    let scored = store
        .with_blocking(|c| c.memory_scores("", runner::rag::embed::ID, &query))
        .unwrap();
    let mut keys: Vec<&str> = scored.keys().map(|(_, k)| k.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["bread"], "only bread's vector is left");
    // Vectors another embedder made are not compared with this one's query.
    store
        .with_blocking(|c| {
            let v = vec![(String::from("text"), HashedEmbedder::vector("moon tides"))];
            put_with(
                c,
                &ns(&["m"]),
                "other",
                &json!({"text": "moon tides"}),
                None,
                Some(("someone-else", &v)),
            )
        })
        .unwrap();
    assert_eq!(search(0, 1)[0]["key"], "bread");
}

/// What one handle stores, another on the same database reads: two processes share a store.
fn another_handle_sees_what_one_stored(b: &Store) {
    let Some(reopen) = &b.reopen else { return };
    put_on(&b.store, &["shared"], "k", json!({"by": "one"}));
    index(&b.store, "kb", KB);
    let other = reopen();
    assert_eq!(
        other.with_blocking(|c| get(c, &ns(&["shared"]), "k", true)).unwrap(),
        json!({"by": "one"})
    );
    let found = other
        .with_blocking(|c| search::search(c, &request("kb", &["sourdough"], &[], 3)))
        .unwrap();
    assert_eq!(found.hits[0].chunk.document, "bread.md");
    put_on(&other, &["shared"], "k", json!({"by": "two"}));
    assert_eq!(
        b.store.with_blocking(|c| get(c, &ns(&["shared"]), "k", true)).unwrap(),
        json!({"by": "two"})
    );
    // An index built once serves the other: nothing to do again.
    let again = index(&other, "kb", KB);
    assert_eq!((again.indexed.len(), again.skipped.len()), (0, 3));
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL only.

/// A URL that does not parse, and a server that does not answer: each said in words naming
/// the database, never the password.
#[test]
fn postgres_errors_name_the_database_and_never_the_password() {
    let fails = |url: &str| {
        DataStore::new(Location::Postgres(url.into()))
            .with_blocking(|c| c.index_embedder("kb"))
            .unwrap_err()
            .to_string()
    };
    let e = fails("postgres://me:hunter2@127.0.0.1:5432/db?pgvector=sometimes");
    assert!(e.contains("not valid") && e.contains("pgvector=sometimes"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    // A closed port on loopback: refused at once.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = fails(&format!("postgres://me:hunter2@127.0.0.1:{port}/kb?connect_timeout=2"));
    assert!(
        e.contains(&format!("postgres://127.0.0.1:{port}/kb (schema runner)")),
        "{e}"
    );
    assert!(e.contains("error connecting") || e.contains("refused"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    // The store is asked again on its next use, not left broken.
    let store = DataStore::new(Location::Postgres(format!("postgres://127.0.0.1:{port}/kb")));
    assert!(store.with_blocking(|c| c.index_embedder("kb")).is_err());
    assert!(!store.is_open());
}

/// A store made without pgvector keeps working, and moves its vectors to pgvector when opened
/// where the server has it (`pgvector=auto`, the default); `pgvector=on` insists.
#[test]
fn a_store_without_pgvector_moves_to_it_when_the_server_has_it() {
    let url = support::postgres::fresh_url();
    let arrays = DataStore::new(Location::Postgres(format!("{url}&pgvector=off")));
    index(&arrays, "kb", KB);
    put_on(&arrays, &["m"], "k", json!({"text": "moon"}));
    let before = arrays
        .with_blocking(|c| search::search(c, &request("kb", &["tides moon"], &[], 5)))
        .unwrap();
    let on = DataStore::new(Location::Postgres(format!("{url}&pgvector=on")));
    match on.with_blocking(|c| c.index_embedder("kb")) {
        Err(e) => {
            // A server without the extension: `on` says why, `auto` goes on without it.
            let e = e.to_string();
            assert!(e.contains("`pgvector=on`, but") && e.contains("pgvector"), "{e}");
            let auto = DataStore::new(Location::Postgres(url));
            assert_eq!(
                auto.with_blocking(|c| c.index_embedder("kb")).unwrap().as_deref(),
                Some(runner::rag::embed::ID)
            );
        }
        Ok(_) => {
            let after = on
                .with_blocking(|c| search::search(c, &request("kb", &["tides moon"], &[], 5)))
                .unwrap();
            let ids = |f: &search::Found| f.hits.iter().map(|h| h.chunk.id).collect::<Vec<_>>();
            assert_eq!(ids(&after), ids(&before));
            for (a, b) in after.hits.iter().zip(&before.hits) {
                assert!((a.cosine - b.cosine).abs() < 1e-6);
            }
            assert_eq!(
                on.with_blocking(|c| get(c, &ns(&["m"]), "k", false)).unwrap(),
                json!({"text": "moon"})
            );
        }
    }
}
