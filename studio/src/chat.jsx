// The chat view of a workflow whose state keeps a message history (an `add_messages` key): the
// thread's conversation, the reply streaming in as its tokens arrive, and branches — a question
// edited or a reply regenerated runs again from the checkpoint before it (a fork).
import { useState, useEffect, useRef } from "preact/hooks";

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

/** The checkpoint just before message `id` entered the state: where a branch at it starts. */
function before(history, key, id) {
  const oldestFirst = [...history].reverse();
  const first = oldestFirst.find((h) => ((h.values && h.values[key]) || []).some((m) => m.id === id));
  if (!first) return null;
  const parent = parentOf(first);
  return parent ? { checkpoint_id: parent, checkpoint_ns: "" } : null;
}

let counter = 0;
const newId = () => `studio-${Date.now().toString(36)}-${(counter++).toString(36)}`;

export function ChatPanel({ messagesKey: key, values, history, live, running, onSend, onRegenerate }) {
  const [draft, setDraft] = useState("");
  const [editing, setEditing] = useState(null);
  const [editText, setEditText] = useState("");
  const [showTools, setShowTools] = useState(false);
  const end = useRef(null);
  const messages = ((values && values[key]) || []).filter(isMessage);
  const streaming = running && live ? Object.values(live.nodes).filter((n) => n.tokens && n.status === "running").map((n) => n.tokens).pop() : null;
  useEffect(() => {
    if (end.current && end.current.scrollIntoView) end.current.scrollIntoView({ block: "nearest" });
  }, [messages.length, streaming && streaming.length]);
  const send = (e) => {
    e.preventDefault();
    if (!draft.trim() || running) return;
    onSend({ id: newId(), type: "human", content: draft.trim() });
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
              <div class="who">{m.type === "human" ? "you" : m.type === "ai" ? "assistant" : m.type}</div>
              {editing === m.id ? (
                <form
                  onSubmit={(e) => {
                    e.preventDefault();
                    const at = before(history, key, m.id);
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
