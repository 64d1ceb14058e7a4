// Drives `runner serve` with LangGraph's own JS client (@langchain/langgraph-sdk, pinned in
// package-lock.json beside this file), as an application would. Run by tests/serve_api.rs from
// the `npm ci` install: `node drive.mjs URL`. Exits non-zero with the failed check on any
// difference from what the SDK expects.

import assert from "node:assert/strict";
import { Client } from "@langchain/langgraph-sdk";

const client = new Client({ apiUrl: process.argv[2] });

async function collect(stream) {
  const parts = [];
  for await (const part of stream) parts.push(part);
  return parts;
}

// Assistants: the graph name and LangGraph's system assistant id both name the graph.
const [gate] = await client.assistants.search({ graphId: "gate" });
assert.equal(gate.graph_id, "gate");
assert.match(gate.assistant_id, /^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$/);
assert.equal((await client.assistants.get(gate.assistant_id)).graph_id, "gate");

// A thread, and a run streamed in two modes that stops at the gate.
const thread = await client.threads.create({ metadata: { who: "js" } });
const tid = thread.thread_id;
const created = [];
const parts = await collect(
  client.runs.stream(tid, gate.assistant_id, {
    input: { topic: "tides" },
    streamMode: ["values", "updates"],
    onRunCreated: (meta) => created.push(meta),
  }),
);
assert.equal(parts[0].event, "metadata");
assert.equal(created[0].run_id, parts[0].data.run_id, JSON.stringify(created));
assert.equal(created[0].thread_id, tid);
const updates = parts.filter((p) => p.event === "updates").map((p) => p.data);
assert.ok(updates.some((u) => u.write?.draft === "first draft"), JSON.stringify(updates));
assert.ok(updates.some((u) => Array.isArray(u.__interrupt__)), JSON.stringify(updates));
const lastValues = parts.filter((p) => p.event === "values").at(-1).data;
assert.ok(lastValues.__interrupt__[0].id, JSON.stringify(lastValues));

// The state waits at the gate.
let state = await client.threads.getState(tid);
assert.deepEqual(state.next, ["review"]);
assert.equal((await client.threads.get(tid)).status, "interrupted");

// Resume the interrupt with a command.
const resumed = await collect(
  client.runs.stream(tid, "gate", { command: { resume: { action: "accept" } }, streamMode: "updates" }),
);
assert.ok(resumed.some((p) => p.event === "updates" && "review" in p.data), JSON.stringify(resumed));
state = await client.threads.getState(tid);
assert.deepEqual(state.values.log, ["write", "accept"]);
assert.equal((await client.threads.get(tid)).status, "idle");

// History: newest first, each checkpoint's parent the next one.
const history = await client.threads.getHistory(tid, { limit: 10 });
const steps = history.map((h) => h.metadata.step);
assert.deepEqual(steps, [...steps].sort((a, b) => b - a));
assert.equal(steps.at(-1), -1);
for (let i = 0; i + 1 < history.length; i++) {
  assert.equal(history[i].parent_checkpoint.checkpoint_id, history[i + 1].checkpoint.checkpoint_id);
}

// Search by the metadata a run stamps.
const found = await client.threads.search({ metadata: { graph_id: "gate" }, limit: 100 });
assert.ok(found.some((t) => t.thread_id === tid));

// Tokens as `messages` (messages-tuple) sharing one id, and an `emit` node's custom event: its
// data as the workflow emitted it, as `get_stream_writer()(data)` sends it on the reference.
const shout = await collect(
  client.runs.stream(null, "shout", { input: { word: "hello" }, streamMode: ["messages-tuple", "custom"] }),
);
const tokens = shout.filter((p) => p.event === "messages");
assert.deepEqual(
  tokens.map((p) => p.data[0].content),
  ["hello", " there", ""],
  JSON.stringify(tokens),
);
assert.equal(new Set(tokens.map((p) => p.data[0].id)).size, 1);
assert.equal(tokens[0].data[1].langgraph_node, "say");
const custom = shout.filter((p) => p.event === "custom").map((p) => p.data);
assert.deepEqual(custom, [{ text: "hello there" }]);

// Wait: stateless, and on a thread whose messages go through add_messages.
assert.equal((await client.runs.wait(null, "shout", { input: { word: "hello" } })).said, "hello there");
const chat = await client.threads.create();
const waited = await client.runs.wait(chat.thread_id, "chat", {
  input: { messages: [{ type: "human", content: "hi" }] },
});
assert.equal(waited.messages.at(-1).content, "echo: hi", JSON.stringify(waited));

// Cancel a background run: it stops at once (before it starts, if it is still in line).
const slow = await client.threads.create();
const run = await client.runs.create(slow.thread_id, "slow");
await client.runs.cancel(slow.thread_id, run.run_id, true);
assert.equal((await client.runs.get(slow.thread_id, run.run_id)).status, "interrupted");

// A resumable background run rejoined: from the start, then after the second event.
const later = await client.threads.create();
const bg = await client.runs.create(later.thread_id, "shout", {
  input: { word: "hello" },
  streamMode: ["values", "custom"],
  streamResumable: true,
});
await client.runs.join(later.thread_id, bg.run_id);
const all = await collect(client.runs.joinStream(later.thread_id, bg.run_id, { lastEventId: "-1" }));
assert.equal(all[0].event, "metadata");
assert.ok(all.some((p) => p.event === "custom"), JSON.stringify(all));
const rest = await collect(client.runs.joinStream(later.thread_id, bg.run_id, { lastEventId: "2" }));
assert.deepEqual(
  rest.map((p) => [p.event, p.data]),
  all.slice(2).map((p) => [p.event, p.data]),
);

// The store: what a client puts, a run's store node reads; what the run stores, the client reads.
await client.store.putItem(["users", "jsuser"], "prefs", { theme: "light" });
const memo = await client.runs.wait(null, "memo", { input: { user: "jsuser" } });
assert.deepEqual(memo.prefs, { theme: "light" });
const note = await client.store.getItem(["users", "jsuser", "notes"], "visit");
assert.deepEqual(note.value, { seen: true, theme: "light" });
assert.deepEqual(note.namespace, ["users", "jsuser", "notes"]);
assert.ok(note.createdAt && note.updatedAt, JSON.stringify(note));
const searched = await client.store.searchItems(["users", "jsuser"], { filter: { seen: true } });
assert.deepEqual(searched.items.map((i) => i.key), ["visit"]);
const namespaces = await client.store.listNamespaces({ prefix: ["users"], maxDepth: 2 });
assert.deepEqual(namespaces.namespaces, [["users", "jsuser"]]);
await client.store.deleteItem(["users", "jsuser"], "prefs");
assert.equal(await client.store.getItem(["users", "jsuser"], "prefs"), null);

console.log("js sdk: every check passed");
