// The chat view of a workflow whose state keeps a message history (an `add_messages` key): the
// thread's conversation, the reply streaming in as its tokens arrive, and branches — a question
// edited or a reply regenerated runs again from the checkpoint before it (a fork), and a message
// where branches part shows `< 1/2 >` to switch between them (the checkpoints forked from the
// same parent, found through the history's `parent_checkpoint`); the chat goes on from the
// branch shown.
import { useState, useEffect, useRef, useMemo } from "preact/hooks";

const isMessage = (m) => m && typeof m === "object" && typeof m.type === "string" && "content" in m;

/** The state key that holds the conversation, if the workflow has one. */
export function messagesKey(schemas, values) {
  const props = (schemas && schemas.state_schema && schemas.state_schema.properties) || {};
  if (values && typeof values === "object") {
    for (const [k, v] of Object.entries(values)) if (Array.isArray(v) && v.length && v.every(isMessage)) return k;
  }
  if ("messages" in props) return "messages";
  for (const [k, s] of Object.entries(props)) if (s && (s.reducer === "add_messages" || /add_messages/.test(s.description || ""))) return k;
  return null;
}

function text(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((b) => (typeof b === "string" ? b : b && b.type === "text" ? b.text : b && b.type ? `[${b.type}]` : "")).join("");
  return JSON.stringify(content);
}

const idOf = (h) => h.checkpoint_id || (h.checkpoint && h.checkpoint.checkpoint_id);
const parentOf = (h) => h.parent_checkpoint_id || (h.parent_checkpoint && h.parent_checkpoint.checkpoint_id);

/**
 * The checkpoint just before message `id` entered the state: where a regenerated reply's
 * branch starts. With `turn`, the one before the run that brought it (its input): where an
 * edited question's branch starts.
 */
function before(history, key, id, turn = false) {
  const oldestFirst = [...history].reverse();
  let first = oldestFirst.find((h) => ((h.values && h.values[key]) || []).some((m) => m.id === id));
  if (!first) return null;
  if (turn) {
    const byId = new Map(history.map((h) => [idOf(h), h]));
    let h = first;
    while (h && !(h.metadata && h.metadata.source === "input")) h = byId.get(parentOf(h));
    if (h) first = h;
  }
  const parent = parentOf(first);
  return parent ? { checkpoint_id: parent, checkpoint_ns: "" } : null;
}

/**
 * The thread's checkpoints as a tree: each one's children (oldest first) and, under each, the
 * newest checkpoint (the end of the branch that goes through it).
 */
function treeOf(history) {
  const byId = new Map();
  const children = new Map();
  // `history` is newest first: its index orders checkpoints by age.
  const age = new Map();
  history.forEach((h, i) => {
    byId.set(idOf(h), h);
    age.set(idOf(h), i);
  });
  for (let i = history.length - 1; i >= 0; i--) {
    const p = parentOf(history[i]);
    if (!p) continue;
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(history[i]);
  }
  const newest = new Map();
  const tip = (h) => {
    const id = idOf(h);
    if (newest.has(id)) return newest.get(id);
    let best = h;
    for (const c of children.get(id) || []) {
      const t = tip(c);
      if (age.get(idOf(t)) < age.get(idOf(best))) best = t;
    }
    newest.set(id, best);
    return best;
  };
  return { byId, children, tip };
}

/**
 * Where the conversation at checkpoint `shown` has branches: each checkpoint on its path with
 * several children (forks from it), the switcher on the first message shown that the fork
 * point did not hold. Returns `Map(message id → {at, of, tips})`, `tips` the newest checkpoint
 * of each branch, oldest branch first.
 */
function branchesOf(tree, shown, key, messages) {
  const out = new Map();
  if (!shown) return out;
  // The path from the thread's first checkpoint to the one shown.
  const path = [];
  for (let h = shown; h && path.length <= tree.byId.size; h = tree.byId.get(parentOf(h))) path.unshift(h);
  for (let i = 0; i < path.length - 1; i++) {
    const kids = tree.children.get(idOf(path[i])) || [];
    if (kids.length < 2) continue;
    const held = new Set(((path[i].values && path[i].values[key]) || []).map((m) => m && m.id));
    const first = messages.find((m) => m.id && !held.has(m.id));
    if (!first || out.has(first.id)) continue;
    const at = kids.findIndex((k) => idOf(k) === idOf(path[i + 1]));
    out.set(first.id, { at, of: kids.length, tips: kids.map((k) => idOf(tree.tip(k))) });
  }
  return out;
}

function Switcher({ branch, onPick }) {
  return (
    <span class="branches" role="group" aria-label="Branches" data-testid="chat-branches">
      <button type="button" class="link" aria-label="Previous branch" disabled={branch.at === 0} onClick={() => onPick(branch.tips[branch.at - 1])} data-testid="chat-branch-prev">
        ‹
      </button>
      <span data-testid="chat-branch-at">
        {branch.at + 1}/{branch.of}
      </span>
      <button type="button" class="link" aria-label="Next branch" disabled={branch.at === branch.of - 1} onClick={() => onPick(branch.tips[branch.at + 1])} data-testid="chat-branch-next">
        ›
      </button>
    </span>
  );
}

let counter = 0;
const newId = () => `studio-${Date.now().toString(36)}-${(counter++).toString(36)}`;

export function ChatPanel({ messagesKey: key, values, history, head, live, running, onSend, onRegenerate }) {
  const [draft, setDraft] = useState("");
  const [editing, setEditing] = useState(null);
  const [editText, setEditText] = useState("");
  const [showTools, setShowTools] = useState(false);
  // The branch shown: the newest checkpoint of it, or null for the thread's latest.
  const [viewId, setViewId] = useState(null);
  const end = useRef(null);
  useEffect(() => {
    if (running) setViewId(null);
  }, [running]);
  const tree = useMemo(() => treeOf(history), [history]);
  const viewed = !running && viewId ? tree.byId.get(viewId) : null;
  const shownValues = viewed ? viewed.values : values;
  const messages = ((shownValues && shownValues[key]) || []).filter(isMessage);
  const shown = viewed || (!running && head && tree.byId.get(idOf(head))) || null;
  const branches = useMemo(() => branchesOf(tree, shown, key, messages), [tree, shown, key]);
  // A message sent goes on from the branch shown; the latest checkpoint's needs no checkpoint.
  const from = viewed && viewId !== idOf(head || {}) ? { checkpoint_id: viewId, checkpoint_ns: "" } : undefined;
  const streaming = running && live ? Object.values(live.nodes).filter((n) => n.tokens && n.status === "running").map((n) => n.tokens).pop() : null;
  useEffect(() => {
    if (end.current && end.current.scrollIntoView) end.current.scrollIntoView({ block: "nearest" });
  }, [messages.length, streaming && streaming.length]);
  const send = (e) => {
    e.preventDefault();
    if (!draft.trim() || running) return;
    onSend({ id: newId(), type: "human", content: draft.trim() }, from);
    setDraft("");
  };
  return (
    <div class="chat" data-testid="chat">
      <div class="row spread">
        <h2>Conversation</h2>
        <label class="small">
          <input type="checkbox" checked={showTools} onChange={(e) => setShowTools(e.currentTarget.checked)} /> tool calls
        </label>
      </div>
      <ol class="messages" aria-live="polite">
        {messages
          .filter((m) => showTools || (m.type !== "tool" && !(m.type === "ai" && !text(m.content) && m.tool_calls && m.tool_calls.length)))
          .map((m, i) => (
            <li key={m.id || i} class={`msg msg-${m.type}`} data-testid="chat-message" data-type={m.type}>
              <div class="who">
                {m.type === "human" ? "you" : m.type === "ai" ? "assistant" : m.type}
                {!running && branches.has(m.id) && <Switcher branch={branches.get(m.id)} onPick={setViewId} />}
              </div>
              {editing === m.id ? (
                <form
                  onSubmit={(e) => {
                    e.preventDefault();
                    const at = before(history, key, m.id, true);
                    setEditing(null);
                    onSend({ id: newId(), type: "human", content: editText }, at);
                  }}
                >
                  <textarea rows={2} value={editText} aria-label="Edited message" onInput={(e) => setEditText(e.currentTarget.value)} data-testid="chat-edit-text" />
                  <div class="row">
                    <button type="submit" class="primary" data-testid="chat-edit-send">
                      Send as a new branch
                    </button>
                    <button type="button" onClick={() => setEditing(null)}>
                      Cancel
                    </button>
                  </div>
                </form>
              ) : (
                <div class="content">{text(m.content)}</div>
              )}
              {showTools && m.tool_calls && m.tool_calls.length > 0 && (
                <ul class="calls">
                  {m.tool_calls.map((c) => (
                    <li key={c.id}>
                      <code>
                        {c.name}({JSON.stringify(c.args)})
                      </code>
                    </li>
                  ))}
                </ul>
              )}
              {!running && m.id && m.type === "human" && editing !== m.id && (
                <button
                  type="button"
                  class="link"
                  onClick={() => {
                    setEditing(m.id);
                    setEditText(text(m.content));
                  }}
                  data-testid="chat-edit"
                >
                  edit
                </button>
              )}
              {!running && m.id && m.type === "ai" && (
                <button
                  type="button"
                  class="link"
                  onClick={() => {
                    const at = before(history, key, m.id);
                    if (at) onRegenerate(at);
                  }}
                  data-testid="chat-regenerate"
                >
                  regenerate
                </button>
              )}
            </li>
          ))}
        {streaming && (
          <li class="msg msg-ai streaming" data-testid="chat-streaming">
            <div class="who">assistant</div>
            <div class="content">{streaming}</div>
          </li>
        )}
        <li ref={end} class="end" aria-hidden="true" />
      </ol>
      <form class="chat-input" onSubmit={send}>
        <label for="chat-draft" class="sr-only">
          Message
        </label>
        <textarea
          id="chat-draft"
          rows={2}
          value={draft}
          placeholder="Message"
          data-testid="chat-input"
          onInput={(e) => setDraft(e.currentTarget.value)}
          onKeyDown={(e) => {
            if (e.key === "Enter" && !e.shiftKey) send(e);
          }}
        />
        <button type="submit" class="primary" disabled={running || !draft.trim()} data-testid="chat-send">
          Send
        </button>
      </form>
    </div>
  );
}
