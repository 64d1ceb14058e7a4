//! The seed systems served: `runner serve workflows/` on each seed's scripted replies, driven
//! over HTTP as their UIs drive them.

use std::path::Path;

use serde_json::{Value, json};

use super::serve::{Server, client, parse, spawn};

/// `runner serve` over the shipped `workflows/` folder, replying from `mock`
/// (`tests/fixtures/mock/…`), its database in a temporary folder.
fn serve_shipped(mock: &str) -> Server {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let (child, base, said) = spawn(
        dir.path(),
        &root.join("workflows"),
        &root.join("tests/fixtures/mock").join(mock),
        &["--data-db", ":memory:"],
        &[],
    );
    for seed in ["deep-research", "mindmap", "rag", "research", "slides"] {
        assert!(said.contains(seed), "{seed} is not served:\n{said}");
    }
    assert!(!said.contains("not served"), "{said}");
    Server {
        child,
        base,
        dir: Some(dir),
    }
}

async fn stream(s: &Server, path: &str, body: Value) -> Vec<(String, Value)> {
    let resp = client()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    parse(&resp.text().await.unwrap())
}

/// The RAG chat (002) over `runs.stream`, two turns on one thread: the answer's tokens arrive
/// as `messages` events (AI message chunks sharing one id per turn), the thread keeps both turns
/// of the conversation.
#[tokio::test(flavor = "multi_thread")]
async fn the_rag_chat_answers_two_turns_with_streamed_tokens() {
    let s = serve_shipped("rag-chat.yaml");
    let mut ids = Vec::new();
    for (turn, question) in ["Hi there!", "Thanks, and what can you do?"].iter().enumerate() {
        let events = stream(
            &s,
            "/threads/chat-1/runs/stream",
            json!({"assistant_id": "rag", "input": {"question": question, "mode": "chat"},
                   "stream_mode": ["messages-tuple", "values"], "if_not_exists": "create"}),
        )
        .await;
        assert_eq!(events[0].0, "metadata");
        let chunks: Vec<&Value> = events.iter().filter(|(e, _)| e == "messages").map(|(_, d)| d).collect();
        let text: String = chunks
            .iter()
            .map(|d| d[0]["content"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(
            text, "Hello! How can I help with your documents today?",
            "turn {turn}: {events:?}"
        );
        assert!(chunks.len() >= 3, "turn {turn}: streamed token by token: {chunks:?}");
        for d in &chunks {
            assert_eq!(d[0]["type"], "AIMessageChunk", "{d}");
            assert_eq!(d[1]["langgraph_node"], "generator", "{d}");
        }
        let id = chunks[0][0]["id"].as_str().unwrap().to_string();
        assert!(chunks.iter().all(|d| d[0]["id"] == id.as_str()), "one id per answer");
        ids.push(id);
        let values = &events.iter().rev().find(|(e, _)| e == "values").unwrap().1;
        assert_eq!(values["intent"], "chat");
        assert_eq!(values["messages"].as_array().unwrap().len(), 2 * (turn + 1), "{values}");
    }
    assert_ne!(ids[0], ids[1], "each answer is its own message");
    let (status, _, state) = super::serve::call(&s, reqwest::Method::GET, "/threads/chat-1/state", None).await;
    assert_eq!(status, 200);
    let contents: Vec<&str> = state["values"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        contents,
        [
            "Hi there!",
            "Hello! How can I help with your documents today?",
            "Thanks, and what can you do?",
            "Hello! How can I help with your documents today?"
        ]
    );
}

/// The mindmap agent (000) streams every node it adds as a `custom` event, as its canvas reads
/// them, and ends with the whole map in its values.
#[tokio::test(flavor = "multi_thread")]
async fn the_mindmap_streams_node_added_as_custom_events() {
    let s = serve_shipped("mindmap.yaml");
    let events = stream(
        &s,
        "/runs/stream",
        json!({"assistant_id": "mindmap",
               "input": {"document_title": "Heat pumps", "document_content": "Heat pumps move heat.", "max_depth": 2},
               "stream_mode": ["custom", "values"]}),
    )
    .await;
    let added: Vec<&Value> = events
        .iter()
        .filter(|(e, d)| e == "custom" && d["event"] == "node_added")
        .map(|(_, d)| d)
        .collect();
    let ids: Vec<&str> = added.iter().filter_map(|d| d["data"]["node_id"].as_str()).collect();
    assert_eq!(ids.first(), Some(&"root"), "the root first: {added:?}");
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        ["root", "root.1", "root.1.1", "root.2", "root.2.1"],
        "{added:?}"
    );
    let values = &events.iter().rev().find(|(e, _)| e == "values").unwrap().1;
    assert_eq!(values["nodes"].as_object().unwrap().len(), 5, "{values}");
}
