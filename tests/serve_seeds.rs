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
/// as `messages` events (AI message chunks sharing one id per turn) and as the legacy
/// `messages/partial` ones, under the id the answer then has in the thread's messages (a client
/// joins the streamed answer with the stored one by id); the thread keeps both turns of the
/// conversation.
#[tokio::test(flavor = "multi_thread")]
async fn the_rag_chat_answers_two_turns_with_streamed_tokens() {
    let s = serve_shipped("rag-chat.yaml");
    let mut ids = Vec::new();
    for (turn, question) in ["Hi there!", "Thanks, and what can you do?"].iter().enumerate() {
        let events = stream(
            &s,
            "/threads/chat-1/runs/stream",
            json!({"assistant_id": "rag", "input": {"question": question, "mode": "chat"},
                   "stream_mode": ["messages-tuple", "messages", "values", "custom"], "if_not_exists": "create"}),
        )
        .await;
        assert_eq!(events[0].0, "metadata");
        // The seed's `status` events, as `custom` events the UI shows as progress: the data the
        // workflow emitted, which names the event as the seed's client reads it.
        let stages: Vec<&str> = events
            .iter()
            .filter(|(e, d)| e == "custom" && d["event"] == "status")
            .filter_map(|(_, d)| d["stage"].as_str())
            .collect();
        assert_eq!(stages, ["analyzing", "generating"], "turn {turn}: {events:?}");
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
        let partial: Vec<&Value> = events
            .iter()
            .filter(|(e, _)| e == "messages/partial")
            .map(|(_, d)| &d[0]["id"])
            .collect();
        assert!(
            !partial.is_empty() && partial.iter().all(|p| *p == id.as_str()),
            "{events:?}"
        );
        let values = &events.iter().rev().find(|(e, _)| e == "values").unwrap().1;
        assert_eq!(values["intent"], "chat");
        let messages = values["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2 * (turn + 1), "{values}");
        // Served as LangChain's message dicts, as agent-chat-ui renders them by `type`.
        let types: Vec<&str> = messages.iter().filter_map(|m| m["type"].as_str()).collect();
        assert_eq!(types, ["human", "ai"].repeat(turn + 1), "{values}");
        assert!(messages.iter().all(|m| m.get("role").is_none()), "{values}");
        let answer = messages.iter().rev().find(|m| m["type"] == "ai").unwrap();
        assert_eq!(
            answer["id"],
            id.as_str(),
            "the streamed answer is the stored one: {values}"
        );
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "each answer is its own message");
    let (status, _, state) = super::serve::call(&s, reqwest::Method::GET, "/threads/chat-1/state", None).await;
    assert_eq!(status, 200);
    let stored = state["values"]["messages"].as_array().unwrap();
    assert_eq!([&stored[1]["id"], &stored[3]["id"]], [ids[0].as_str(), ids[1].as_str()]);
    let contents: Vec<&str> = stored.iter().map(|m| m["content"].as_str().unwrap()).collect();
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

/// The chat UI (002), unchanged: `POST /chat/stream` answers with the seed's own event
/// sequence — `event: status` at each stage, `event: token` for each piece of the answer,
/// then `event: end` with the turn's metadata —, the session id its thread, so a second
/// turn continues the conversation.
#[tokio::test(flavor = "multi_thread")]
async fn the_rag_chat_ui_streams_its_own_events() {
    let s = serve_shipped("rag-chat.yaml");
    for (turn, message) in ["Hi there!", "Thanks, and what can you do?"].iter().enumerate() {
        let resp = client()
            .post(format!("{}/chat/stream", s.base))
            .json(&json!({"session_id": "ui-1", "message": message, "mode": "chat"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.text().await.unwrap();
        let frames: Vec<(&str, &str)> = body
            .split("\r\n\r\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (event, data) = f.split_once("\r\n").unwrap_or((f, ""));
                (
                    event.strip_prefix("event: ").unwrap_or(event),
                    data.strip_prefix("data: ").unwrap_or(data),
                )
            })
            .collect();
        let names: Vec<&str> = frames.iter().map(|(e, _)| *e).collect();
        let tokens = names.iter().filter(|n| **n == "token").count();
        assert!(tokens >= 3, "turn {turn}: {body}");
        let mut expected = vec!["status", "status"];
        expected.extend(std::iter::repeat_n("token", tokens));
        expected.push("end");
        assert_eq!(names, expected, "turn {turn}: {body}");
        assert_eq!(frames[0].1, "Analyzing...");
        assert_eq!(frames[1].1, "Generating...");
        let text: String = frames.iter().filter(|(e, _)| *e == "token").map(|(_, d)| *d).collect();
        assert_eq!(text, "Hello! How can I help with your documents today?");
        let end: Value = serde_json::from_str(frames.last().unwrap().1).unwrap();
        assert_eq!(end["answer"], text.as_str());
        assert_eq!(end["intent"], "chat");
        assert_eq!(end["session_id"], "ui-1");
        assert_eq!(end["sources"], json!([]));
    }
    let (_, _, state) = super::serve::call(&s, reqwest::Method::GET, "/threads/ui-1/state", None).await;
    assert_eq!(state["values"]["messages"].as_array().unwrap().len(), 4, "{state}");
}

/// The RAG chat as agent-chat-ui drives it: its input is `{"messages": [...]}` (the JS
/// client's exact body), not `{"question"}`. The question is the text of the last human
/// message; the message keeps the id the UI gave it, so the UI's message and the stored one
/// are one.
#[tokio::test(flavor = "multi_thread")]
async fn the_rag_chat_takes_agent_chat_uis_messages_input() {
    let s = serve_shipped("rag-chat.yaml");
    for (turn, (id, text)) in [("ui-1", "Hi there!"), ("ui-2", "Thanks!")].iter().enumerate() {
        let events = stream(
            &s,
            "/threads/ui-chat/runs/stream",
            json!({"input": {"messages": [{"id": id, "type": "human", "content": [{"type": "text", "text": text}]}]},
                   "stream_mode": ["values", "messages-tuple", "custom"], "stream_subgraphs": true,
                   "assistant_id": "rag", "if_not_exists": "create", "on_disconnect": "continue"}),
        )
        .await;
        let values = &events.iter().rev().find(|(e, _)| e == "values").unwrap().1;
        assert_eq!(values["intent"], "chat", "turn {turn}: {events:?}");
        assert_eq!(values["question"], *text);
        let messages = values["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2 * (turn + 1), "{values}");
        let asked = &messages[2 * turn];
        assert_eq!(
            (&asked["type"], &asked["id"], &asked["content"]),
            (&json!("human"), &json!(id), &json!(text)),
            "{values}"
        );
        assert_eq!(
            messages[2 * turn + 1]["content"],
            "Hello! How can I help with your documents today?"
        );
    }
}

/// The slide maker as agent-chat-ui drives it: `{"messages": [...]}` in, the request the text
/// of the last human message, and the PPTX template a file block of that message (base64, in
/// the shape agent-chat-ui sends today), loaded into the design context.
#[tokio::test(flavor = "multi_thread")]
async fn the_slide_maker_takes_its_request_and_template_from_agent_chat_uis_message() {
    use base64::Engine as _;
    let s = serve_shipped("slides-storywriter.yaml");
    let pptx = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pptx/template.pptx")).unwrap();
    let file = json!({"type": "file",
                      "mimeType": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
                      "data": base64::engine::general_purpose::STANDARD.encode(pptx),
                      "metadata": {"filename": "template.pptx"}});
    let events = stream(
        &s,
        "/threads/deck-1/runs/stream",
        json!({"input": {"messages": [{"id": "ui-1", "type": "human",
                                       "content": [{"type": "text", "text": "A short deck about heat pumps"}, file]}]},
               "stream_mode": ["values", "messages-tuple", "custom"], "stream_subgraphs": true,
               "assistant_id": "slides", "if_not_exists": "create", "on_disconnect": "continue"}),
    )
    .await;
    let values = &events.iter().rev().find(|(e, _)| e == "values").unwrap().1;
    assert_eq!(values["request"], "A short deck about heat pumps", "{events:?}");
    assert_eq!(values["design_context"]["theme_name"], "Corporate", "{values}");
    assert_eq!(values["design_context"]["source"], "template.pptx");
    assert!(values["errors"].as_array().unwrap().is_empty(), "{values}");
    let messages = values["messages"].as_array().unwrap();
    assert_eq!(
        (&messages[0]["type"], &messages[0]["id"], &messages[0]["content"]),
        (&json!("human"), &json!("ui-1"), &json!("A short deck about heat pumps"))
    );
    let plan = values["plan"].as_array().unwrap();
    assert!(plan.iter().all(|s| s["status"] == "complete"), "{values}");
}

/// The mindmap agent (000) streams every node it adds as a `custom` event, as its canvas reads
/// them (the seed's `OutputEvent`: `{type: "node_added", node_id, node_data, ...}`), and ends
/// with the whole map in its values. Each expansion is a subgraph whose node_added events are
/// the expansion node's own (`custom_events: parent`), so a client that does not ask for
/// subgraphs' events gets every node, and one that does gets each once.
#[tokio::test(flavor = "multi_thread")]
async fn the_mindmap_streams_node_added_as_custom_events() {
    let s = serve_shipped("mindmap.yaml");
    for subgraphs in [false, true] {
        let events = stream(
            &s,
            "/runs/stream",
            json!({"assistant_id": "mindmap",
                   "input": {"document_title": "Heat pumps", "document_content": "Heat pumps move heat.", "max_depth": 2},
                   "stream_mode": ["custom", "values"], "stream_subgraphs": subgraphs}),
        )
        .await;
        assert!(
            !events.iter().any(|(e, _)| e.starts_with("custom|")),
            "the expansions' events are the parent's: {events:?}"
        );
        let added: Vec<&Value> = events
            .iter()
            .filter(|(e, d)| e == "custom" && d["type"] == "node_added")
            .map(|(_, d)| d)
            .collect();
        let ids: Vec<&str> = added.iter().filter_map(|d| d["node_id"].as_str()).collect();
        assert_eq!(ids.first(), Some(&"root"), "the root first: {added:?}");
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            ["root", "root.1", "root.1.1", "root.2", "root.2.1"],
            "subgraphs: {subgraphs}: {added:?}"
        );
        let values = &events.iter().rev().find(|(e, _)| e == "values").unwrap().1;
        assert_eq!(values["nodes"].as_object().unwrap().len(), 5, "{values}");
        for d in &added {
            let id = d["node_id"].as_str().unwrap();
            assert_eq!(d["node_data"], values["nodes"][id], "node_added carries {id}'s data");
        }
        let complete: Vec<&Value> = events
            .iter()
            .filter(|(e, d)| e == "custom" && d["type"] == "mindmap_complete")
            .map(|(_, d)| d)
            .collect();
        assert_eq!(complete.len(), 1, "{events:?}");
        assert_eq!(complete[0]["node_count"], 5);
    }
}

/// The SSE body of a route of the seed's own: each event's `data:` as JSON.
async fn route_events(s: &Server, path: &str, body: Value) -> Vec<Value> {
    let resp = client()
        .post(format!("{}{path}", s.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    let text = resp.text().await.unwrap();
    text.split("\r\n\r\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or_else(|_| panic!("{path}: not JSON: {data}")))
        .collect()
}

/// The mindmap's frontend, unchanged: its own endpoints stream the OutputEvents it read before
/// (one `data:` line each, no event names): generate a map, expand one of its nodes, explain
/// one; the expand and explain graphs (mindmap/expand.yaml, mindmap/explain.yaml) are served
/// as graphs of their own too.
#[tokio::test(flavor = "multi_thread")]
async fn the_mindmap_frontend_drives_its_own_endpoints() {
    let s = serve_shipped("mindmap.yaml");
    let events = route_events(
        &s,
        "/mindmap/generate",
        json!({"session_id": "map-1", "document_title": "Heat pumps",
               "document_content": "Heat pumps move heat.", "max_depth": 2}),
    )
    .await;
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        types,
        [
            "node_added",
            "node_added",
            "node_added",
            "node_added",
            "node_added",
            "mindmap_complete"
        ],
        "{events:?}"
    );
    assert_eq!(events[0]["node_id"], "root");
    // The map is the session's thread, as the LangGraph API shows it too.
    let (status, _, state) = super::serve::call(&s, reqwest::Method::GET, "/threads/map-1/state", None).await;
    assert_eq!(status, 200);
    let nodes = state["values"]["nodes"].clone();
    assert_eq!(nodes.as_object().unwrap().len(), 5, "{state}");

    let expanded = route_events(
        &s,
        "/mindmap/expand",
        json!({"nodes": nodes, "edges": state["values"]["edges"], "node_id": "root.1",
               "document_title": "Heat pumps"}),
    )
    .await;
    let last = expanded.last().unwrap();
    assert_eq!(last["type"], "expand_complete", "{expanded:?}");
    let children = last["children"].as_object().unwrap();
    assert!(!children.is_empty(), "{expanded:?}");
    let added: Vec<&str> = expanded
        .iter()
        .filter(|e| e["type"] == "node_added")
        .filter_map(|e| e["node_id"].as_str())
        .collect();
    let mut new: Vec<&str> = children.keys().map(String::as_str).collect();
    new.sort_unstable();
    let mut sorted = added.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, new, "a node_added for each new child: {expanded:?}");
    // Numbered after root.1's existing child.
    assert!(
        new.iter().all(|id| id.starts_with("root.1.") && *id != "root.1.1"),
        "{new:?}"
    );

    let explained = route_events(&s, "/mindmap/explain", json!({"nodes": nodes, "node_id": "root.2"})).await;
    let last = explained.last().unwrap();
    assert_eq!(last["type"], "explanation", "{explained:?}");
    let streamed: String = explained
        .iter()
        .filter(|e| e["type"] == "token")
        .filter_map(|e| e["content"].as_str())
        .collect();
    assert!(!streamed.is_empty(), "{explained:?}");
    assert_eq!(last["explanation"], streamed.as_str(), "{explained:?}");

    let (_, _, found) = super::serve::call(&s, reqwest::Method::POST, "/assistants/search", Some(json!({}))).await;
    let ids: Vec<&str> = found
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["graph_id"].as_str())
        .collect();
    assert!(
        ids.contains(&"mindmap-expand") && ids.contains(&"mindmap-explain"),
        "{ids:?}"
    );
}

/// What waits at the thread's gate, from `GET /threads/{id}/state`: the interrupt's value, with
/// the gate's node name added as `node`.
async fn waiting(s: &Server, thread: &str) -> Value {
    let (status, _, state) =
        super::serve::call(s, reqwest::Method::GET, &format!("/threads/{thread}/state"), None).await;
    assert_eq!(status, 200);
    let interrupts: Vec<(&Value, &Value)> = state["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["interrupts"].as_array().unwrap().iter().map(move |i| (&t["name"], i)))
        .collect();
    assert_eq!(interrupts.len(), 1, "{state}");
    let (node, interrupt) = interrupts[0];
    let mut value = interrupt["value"].clone();
    value["node"] = node.clone();
    value
}

async fn wait(s: &Server, thread: &str, body: Value) -> Value {
    let (status, _, values) = super::serve::call(
        s,
        reqwest::Method::POST,
        &format!("/threads/{thread}/runs/wait"),
        Some(body),
    )
    .await;
    assert_eq!(status, 200, "{values}");
    values
}

/// The deep-research assistant's user comes as its document says (Decision 8), in
/// `config.configurable.user_id`, which runner maps onto the workflow's context: the run starts
/// (it was refused with 422); configurable values that name the workflow's `config` keys
/// override them for the run.
#[tokio::test(flavor = "multi_thread")]
async fn deep_research_takes_its_user_from_configurable() {
    let s = serve_shipped("deep-research-served.yaml");
    let (status, _, out) = super::serve::call(
        &s,
        reqwest::Method::POST,
        "/threads/cfg/runs/wait",
        Some(json!({"assistant_id": "deep-research", "if_not_exists": "create",
                    "input": {"query": "How are heat pumps sized?"},
                    "config": {"configurable": {"user_id": "alice", "planner": {"max_tasks": 2, "max_sections": 3}}}})),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert!(out.get("__error__").is_none(), "{out}");
    assert_eq!(waiting(&s, "cfg").await["node"], "hitl_plan_gate");
    // Without a user the run is refused, as the context schema requires one.
    let (status, _, out) = super::serve::call(
        &s,
        reqwest::Method::POST,
        "/threads/nouser/runs/wait",
        Some(json!({"assistant_id": "deep-research", "if_not_exists": "create",
                    "input": {"query": "How are heat pumps sized?"}})),
    )
    .await;
    assert!(status == 422 || out.get("__error__").is_some(), "{status} {out}");
}

/// The deep-research assistant (001) through its three gates over HTTP, answered as the agent
/// inbox answers (a list of one HumanResponse: respond, ignore, accept) and as agent-chat-ui
/// does (`{decisions: [edit]}`), with the server killed outright (SIGKILL) between two gates
/// and the thread taken up by a new server on the same database. The greeting streams as
/// tokens and opens the first gate's message.
#[tokio::test(flavor = "multi_thread")]
async fn deep_research_goes_through_its_three_gates_across_a_killed_server() {
    let mut s = serve_shipped("deep-research-served.yaml");
    let greeting = "Welcome back, Alice. I will research heat pump sizing for a cold climate.";
    let events = stream(
        &s,
        "/threads/dr/runs/stream",
        json!({"assistant_id": "deep-research", "if_not_exists": "create",
               "input": {"query": "How are heat pumps sized?"}, "context": {"user_id": "alice"},
               "stream_mode": ["messages-tuple", "values"]}),
    )
    .await;
    let tokens: Vec<&Value> = events
        .iter()
        .filter(|(e, d)| e == "messages" && d[1]["langgraph_node"] == "greeting" && d[0]["type"] == "AIMessageChunk")
        .map(|(_, d)| d)
        .collect();
    assert!(tokens.len() >= 3, "the greeting streams token by token: {events:?}");
    // The question the node writes beside it is not streamed: it comes whole, once, as
    // LangGraph sends a message a node returns.
    let whole: Vec<&Value> = events
        .iter()
        .filter(|(e, d)| e == "messages" && d[0]["type"] != "AIMessageChunk")
        .map(|(_, d)| &d[0])
        .collect();
    assert_eq!(whole.len(), 1, "{whole:?}");
    assert_eq!(
        (whole[0]["type"].as_str(), whole[0]["content"].as_str()),
        (Some("human"), Some("How are heat pumps sized?"))
    );
    let text: String = tokens
        .iter()
        .map(|d| d[0]["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(text, greeting);
    let gate = waiting(&s, "dr").await;
    assert_eq!(gate["node"], "hitl_plan_gate", "{gate}");
    assert_eq!(gate["payload"]["plan"]["title"], "Heat pump sizing", "{gate}");
    // The interrupt value is the inbox's HumanInterrupt and agent-chat-ui's review request.
    assert_eq!(gate["action_request"]["action"], "review_plan", "{gate}");
    assert_eq!(
        gate["action_request"]["args"]["plan"]["title"], "Heat pump sizing",
        "{gate}"
    );
    assert_eq!(
        gate["config"],
        json!({"allow_accept": true, "allow_edit": true, "allow_respond": true, "allow_ignore": true})
    );
    let description = gate["description"].as_str().unwrap();
    assert!(
        description.starts_with(&format!("{greeting}\n\nResearch plan v1")),
        "{description}"
    );
    assert_eq!(gate["action_requests"][0]["name"], "review_plan", "{gate}");
    assert_eq!(
        gate["review_configs"],
        json!([{"action_name": "review_plan", "allowed_decisions": ["approve", "edit", "reject"]}])
    );

    // An edit must give back the arguments shown; this one does not and is refused.
    let resume = |answer: Value| json!({"assistant_id": "deep-research", "command": {"resume": answer}, "context": {"user_id": "alice"}});
    let (status, _, refused) = super::serve::call(
        &s,
        reqwest::Method::POST,
        "/threads/dr/runs/wait",
        Some(resume(
            json!([{"type": "edit", "args": {"action": "review_plan", "args": {"title": "x"}}}]),
        )),
    )
    .await;
    // (The run is created, then fails: `runs/wait` answers 200 with the error, as the reference.)
    assert_eq!(status, 200, "{refused}");
    let why = refused["__error__"]["message"].as_str().unwrap();
    assert!(why.contains("does not fit the gate's response schema"), "{why}");
    assert_eq!(waiting(&s, "dr").await["payload"]["version"], 1);

    // respond: the planner revises the plan and the same gate asks again, without the greeting.
    wait(
        &s,
        "dr",
        resume(json!([{"type": "response", "args": "Cover cold climates."}])),
    )
    .await;
    let gate = waiting(&s, "dr").await;
    assert_eq!(gate["node"], "hitl_plan_gate");
    assert_eq!(gate["payload"]["plan"]["title"], "Heat pump sizing, revised", "{gate}");
    assert_eq!(gate["payload"]["version"], 2, "{gate}");
    assert!(
        gate["description"].as_str().unwrap().starts_with("Research plan v2"),
        "{gate}"
    );

    // edit, as agent-chat-ui decides: the edited plan is the one researched; the run stops at
    // the discovery gate.
    let edited = json!({"title": "Sizing, as edited", "objective": "Size it.", "tasks": [], "report_outline": []});
    wait(
        &s,
        "dr",
        resume(json!({"decisions": [{"type": "edit", "edited_action": {"name": "review_plan", "args": {"plan": edited}}}]})),
    )
    .await;
    let gate = waiting(&s, "dr").await;
    assert_eq!(gate["node"], "hitl_discovery_gate", "{gate}");
    assert_eq!(gate["action_request"]["action"], "review_discovery", "{gate}");

    // The server dies between two gates; a new one on the same database takes the thread up.
    let dir = s.kill9();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (child, base, _) = spawn(
        dir.path(),
        &root.join("workflows"),
        &root.join("tests/fixtures/mock/deep-research-served.yaml"),
        &["--data-db", ":memory:"],
        &[],
    );
    s = Server {
        child,
        base,
        dir: Some(dir),
    };
    assert_eq!(waiting(&s, "dr").await["node"], "hitl_discovery_gate");

    // ignore: the review is skipped and the report written; accept: it is saved.
    wait(&s, "dr", resume(json!([{"type": "ignore", "args": null}]))).await;
    let gate = waiting(&s, "dr").await;
    assert_eq!(gate["node"], "hitl_final_gate", "{gate}");
    assert!(
        gate["payload"]["report"]
            .as_str()
            .unwrap()
            .starts_with("# Heat pumps in the cold"),
        "{gate}"
    );
    let values = wait(&s, "dr", resume(json!([{"type": "accept", "args": null}]))).await;
    assert_eq!(values["plan"]["title"], "Sizing, as edited", "{values}");
    let (_, _, state) = super::serve::call(&s, reqwest::Method::GET, "/threads/dr/state", None).await;
    assert_eq!(
        state["values"]["feedback_log"],
        json!([{"gate": "plan", "action": "respond", "feedback": "Cover cold climates."}])
    );
    let saved = s
        .dir
        .as_ref()
        .unwrap()
        .path()
        .join(values["report_path"].as_str().unwrap());
    assert!(
        std::fs::read_to_string(&saved)
            .unwrap()
            .starts_with("# Heat pumps in the cold")
    );
    let (_, _, thread) = super::serve::call(&s, reqwest::Method::GET, "/threads/dr", None).await;
    assert_eq!(thread["status"], "idle", "{thread}");
}
