// A pending interrupt answered in place: its message and payload; the agent inbox's answers
// (accept / edit / respond / ignore, as the gate allows them), a tool-call review (approve /
// edit / reject each call), a form from the gate's response schema, or JSON. The answer is
// sent as `command: {resume: …}` (keyed by interrupt id when several wait).
import { useState } from "preact/hooks";
import { JsonTree } from "./json.jsx";
import { SchemaForm, initialValue } from "./form.jsx";

function InboxAnswer({ value, onAnswer }) {
  const cfg = value.config || {};
  const req = value.action_request || {};
  const [mode, setMode] = useState(null);
  const [edited, setEdited] = useState(() => JSON.stringify(req.args ?? {}, null, 2));
  const [text, setText] = useState("");
  const [bad, setBad] = useState(null);
  return (
    <div class="inbox">
      <div class="row wrap">
        {cfg.allow_accept && (
          <button type="button" class="primary" data-testid="gate-accept" onClick={() => onAnswer([{ type: "accept", args: null }])}>
            Accept
          </button>
        )}
        {cfg.allow_edit && (
          <button type="button" data-testid="gate-edit" aria-expanded={mode === "edit"} onClick={() => setMode(mode === "edit" ? null : "edit")}>
            Edit
          </button>
        )}
        {cfg.allow_respond && (
          <button type="button" data-testid="gate-respond" aria-expanded={mode === "respond"} onClick={() => setMode(mode === "respond" ? null : "respond")}>
            Respond
          </button>
        )}
        {cfg.allow_ignore && (
          <button type="button" data-testid="gate-ignore" onClick={() => onAnswer([{ type: "ignore", args: null }])}>
            Ignore
          </button>
        )}
      </div>
      {mode === "edit" && (
        <form
          onSubmit={(e) => {
            e.preventDefault();
            try {
              onAnswer([{ type: "edit", args: { action: req.action, args: JSON.parse(edited) } }]);
            } catch (err) {
              setBad(err.message);
            }
          }}
        >
          <label for="gate-edit-args">{req.action} arguments</label>
          <textarea id="gate-edit-args" class="code" rows={8} value={edited} onInput={(e) => setEdited(e.currentTarget.value)} data-testid="gate-edit-args" />
          {bad && <div class="error">{bad}</div>}
          <button type="submit" class="primary" data-testid="gate-edit-submit">
            Send edit
          </button>
        </form>
      )}
      {mode === "respond" && (
        <form
          onSubmit={(e) => {
            e.preventDefault();
            if (text.trim()) onAnswer([{ type: "response", args: text }]);
          }}
        >
          <label for="gate-response">Response</label>
          <textarea id="gate-response" rows={3} value={text} onInput={(e) => setText(e.currentTarget.value)} data-testid="gate-response" />
          <button type="submit" class="primary" data-testid="gate-respond-submit">
            Send response
          </button>
        </form>
      )}
    </div>
  );
}

/** LangChain's human-in-the-loop review: one decision per reviewed tool call. */
function ToolReview({ value, onAnswer }) {
  const requests = value.action_requests || [];
  const configs = value.review_configs || [];
  const [decisions, setDecisions] = useState(() => requests.map(() => ({ type: "approve" })));
  const [texts, setTexts] = useState(() => requests.map((r) => JSON.stringify(r.args ?? {}, null, 2)));
  const [bad, setBad] = useState(null);
  const allowed = (r) => (configs.find((c) => c.action_name === r.name) || {}).allowed_decisions || ["approve", "edit", "reject"];
  const set = (i, d) => setDecisions(decisions.map((x, j) => (j === i ? d : x)));
  const send = () => {
    try {
      const out = decisions.map((d, i) => (d.type === "edit" ? { type: "edit", edited_action: { name: requests[i].name, args: JSON.parse(texts[i]) } } : d));
      onAnswer({ decisions: out });
    } catch (err) {
      setBad(err.message);
    }
  };
  return (
    <div class="review" data-testid="tool-review">
      {requests.map((r, i) => (
        <div class="review-item" key={i}>
          <div>
            <strong>{r.name}</strong> {r.description && <span class="muted">{r.description}</span>}
          </div>
          <JsonTree value={r.args} />
          <div class="row" role="radiogroup" aria-label={`Decision for ${r.name}`}>
            {allowed(r).map((a) => (
              <label key={a}>
                <input type="radio" name={`decision-${i}`} checked={decisions[i].type === a} onChange={() => set(i, a === "reject" ? { type: "reject", message: "" } : { type: a })} data-testid={`review-${a}`} /> {a}
              </label>
            ))}
          </div>
          {decisions[i].type === "edit" && (
            <textarea class="code" rows={5} aria-label={`${r.name} arguments`} value={texts[i]} onInput={(e) => setTexts(texts.map((t, j) => (j === i ? e.currentTarget.value : t)))} />
          )}
          {decisions[i].type === "reject" && (
            <input type="text" aria-label="Why" placeholder="why (sent to the model)" value={decisions[i].message} onInput={(e) => set(i, { type: "reject", message: e.currentTarget.value })} />
          )}
        </div>
      ))}
      {bad && <div class="error">{bad}</div>}
      <button type="button" class="primary" onClick={send} data-testid="review-submit">
        Send decisions
      </button>
    </div>
  );
}

function SchemaAnswer({ schema, onAnswer }) {
  const [value, setValue] = useState(() => initialValue(schema));
  return (
    <form
      onSubmit={(e) => {
        e.preventDefault();
        onAnswer(value);
      }}
    >
      <SchemaForm schema={schema} value={value} onChange={setValue} idPrefix="gate" testid="gate-form" />
      <button type="submit" class="primary" data-testid="gate-submit">
        Answer
      </button>
    </form>
  );
}

function Interrupt({ interrupt, onAnswer }) {
  const v = interrupt.value;
  const obj = v && typeof v === "object" && !Array.isArray(v) ? v : null;
  const message = obj ? obj.description || obj.message : typeof v === "string" ? v : null;
  const inbox = obj && obj.action_request && obj.config;
  const review = obj && !inbox && Array.isArray(obj.action_requests);
  const schema = (obj && obj.response_schema) || interrupt.response_schema;
  return (
    <div class="interrupt" data-testid="interrupt" data-node={interrupt.node}>
      <div class="muted small">
        <code>{interrupt.node}</code> waits for an answer
      </div>
      {message && <p class="gate-message">{message}</p>}
      {obj && obj.payload !== undefined && (
        <details open>
          <summary>Payload</summary>
          <JsonTree value={obj.payload} testid="gate-payload" open={2} />
        </details>
      )}
      {inbox && <InboxAnswer value={obj} onAnswer={onAnswer} />}
      {review && <ToolReview value={obj} onAnswer={onAnswer} />}
      {!inbox && !review && schema && <SchemaAnswer schema={schema} onAnswer={onAnswer} />}
      {!inbox && !review && !schema && <SchemaAnswer schema={{}} onAnswer={onAnswer} />}
    </div>
  );
}

export function GatePanel({ interrupts, onAnswer }) {
  return (
    <section class="gate" aria-label="Waiting for an answer" data-testid="gate-panel">
      <h2>Waiting for you</h2>
      {interrupts.map((i) => (
        <Interrupt
          key={i.id || i.node}
          interrupt={i}
          onAnswer={(answer) => onAnswer(interrupts.length > 1 && i.id ? { [i.id]: answer } : answer)}
        />
      ))}
    </section>
  );
}
