// Time travel: a thread's checkpoints as a timeline (branches marked), the state at any of
// them as a tree with the change from its parent, and forks — the state edited at a
// checkpoint, then a run from there; a node run again from the checkpoint before it.
import { useState, useMemo } from "preact/hooks";
import { JsonTree, Diff } from "./json.jsx";
import { SchemaForm, simple } from "./form.jsx";

const idOf = (h) => (h && (h.checkpoint_id || (h.checkpoint && h.checkpoint.checkpoint_id))) || null;
const parentOf = (h) => (h && (h.parent_checkpoint_id || (h.parent_checkpoint && h.parent_checkpoint.checkpoint_id))) || null;

function stripped(values) {
  if (!values || typeof values !== "object") return values;
  const v = { ...values };
  delete v.__interrupt__;
  return v;
}

function when(t) {
  if (!t) return "";
  const d = new Date(t);
  return isNaN(d) ? t : d.toLocaleTimeString();
}

export function StatePanel({ history, head, selectedId, onSelect, onFork, onRerun, disabled }) {
  const byId = useMemo(() => new Map(history.map((h) => [idOf(h), h])), [history]);
  // The head's ancestors are the current branch; other checkpoints belong to other branches.
  const branch = useMemo(() => {
    const s = new Set();
    let h = head ? byId.get(idOf(head)) || head : history[0];
    while (h) {
      s.add(idOf(h));
      h = byId.get(parentOf(h));
    }
    return s;
  }, [byId, head, history]);
  if (!history.length) return <div class="empty">No checkpoints yet: start a run.</div>;
  const ordered = [...history].reverse();
  const selected = (selectedId && byId.get(selectedId)) || history[0];
  const parent = byId.get(parentOf(selected));
  return (
    <div class="state-panel">
      <h2>Checkpoints</h2>
      <ol class="timeline" data-testid="timeline">
        {ordered.map((h) => {
          const id = idOf(h);
          const m = h.metadata || {};
          const writes = m.writes && typeof m.writes === "object" ? Object.keys(m.writes) : [];
          return (
            <li key={id} class={`${id === idOf(selected) ? "on" : ""} ${branch.has(id) ? "" : "other-branch"}`}>
              <button
                type="button"
                data-testid="checkpoint"
                data-checkpoint={id}
                data-step={m.step}
                data-source={m.source}
                aria-current={id === idOf(selected) ? "true" : undefined}
                onClick={() => onSelect(id)}
              >
                <span class="step">{m.step}</span>
                <span class="src">{m.source}</span>
                {writes.length > 0 && <span class="writes">{writes.join(", ")}</span>}
                {(h.next || []).length > 0 && <span class="next">→ {h.next.join(", ")}</span>}
                {(h.tasks || []).some((t) => t.error) && <span class="badge err">failed</span>}
                {(h.interrupts || []).length > 0 && <span class="badge st-interrupted">gate</span>}
                {!branch.has(id) && <span class="badge">other branch</span>}
                <span class="muted when">{when(h.created_at)}</span>
              </button>
            </li>
          );
        })}
      </ol>
      <section class="checkpoint" aria-label="Checkpoint" data-testid="checkpoint-detail" data-checkpoint={idOf(selected)}>
        <div class="row spread">
          <h3>
            step {selected.metadata && selected.metadata.step} · {selected.metadata && selected.metadata.source}
          </h3>
          <div class="row">
            <button type="button" disabled={disabled} onClick={() => onFork(selected)} data-testid="fork-here">
              Edit &amp; fork from here
            </button>
          </div>
        </div>
        {(selected.next || []).length > 0 && (
          <div class="row wrap">
            <span class="muted">next:</span>
            {selected.next.map((n) => (
              <button type="button" key={n} disabled={disabled} onClick={() => onRerun(selected, n)} data-testid="rerun-node" data-node={n}>
                re-run {n} from here
              </button>
            ))}
          </div>
        )}
        {(selected.tasks || []).filter((t) => t.error).map((t) => (
          <div class="banner err" key={t.id} data-testid="task-error">
            {t.name}: {String(t.error)}
          </div>
        ))}
        <h4>Change from the previous checkpoint</h4>
        <Diff from={parent ? stripped(parent.values) : {}} to={stripped(selected.values)} />
        <h4>State</h4>
        <JsonTree value={stripped(selected.values)} testid="state-tree" />
      </section>
    </div>
  );
}

/**
 * The state at a checkpoint, edited: only the keys that changed are sent. Without `as node`,
 * runner replaces those keys and keeps the checkpoint's next nodes (so a failed or chosen node
 * runs again on the edited state); as a node, the values are that node's write.
 */
export function ForkEditor({ fork, schemas, graph, onCancel, onSubmit }) {
  const cp = fork.checkpoint;
  const original = useMemo(() => stripped(cp.values) || {}, [cp]);
  const [values, setValues] = useState(original);
  const [asNode, setAsNode] = useState("");
  const stateSchema = schemas && schemas.state_schema;
  const changed = {};
  for (const [k, v] of Object.entries(values || {})) {
    if (JSON.stringify(v) !== JSON.stringify(original[k])) changed[k] = v;
  }
  const nodes = graph ? graph.nodes.filter((n) => n.type !== "schema" && !n.id.includes(":")).map((n) => n.id) : [];
  const m = cp.metadata || {};
  return (
    <div class="fork-editor" data-testid="fork-editor">
      <h2>{fork.node ? `Re-run ${fork.node}` : "Fork"} from step {m.step}</h2>
      <p class="muted">
        {fork.node
          ? `Edit what ${fork.node} reads, then run it again from this checkpoint; the thread's later checkpoints stay as another branch.`
          : "Edit the state at this checkpoint, then run on from it; the thread's later checkpoints stay as another branch."}
      </p>
      <SchemaForm
        schema={stateSchema && simple(stateSchema, stateSchema) ? stateSchema : {}}
        value={values}
        onChange={setValues}
        idPrefix="fork"
        testid="fork-form"
      />
      <details>
        <summary>Write as a node</summary>
        <label for="as-node">as node</label>{" "}
        <select id="as-node" value={asNode} onChange={(e) => setAsNode(e.currentTarget.value)} data-testid="fork-as-node">
          <option value="">— (replace the values, keep what runs next)</option>
          {nodes.map((n) => (
            <option key={n} value={n}>
              {n}
            </option>
          ))}
        </select>
      </details>
      <div class="muted small" data-testid="fork-changes">
        {Object.keys(changed).length ? `changed: ${Object.keys(changed).join(", ")}` : "nothing changed yet"}
      </div>
      <div class="row">
        <button type="button" class="primary" onClick={() => onSubmit(changed, asNode || null, true)} data-testid="fork-run">
          {Object.keys(changed).length ? "Fork and run" : "Run from here"}
        </button>
        <button type="button" onClick={() => onSubmit(changed, asNode || null, false)} disabled={!Object.keys(changed).length} data-testid="fork-only">
          Fork only
        </button>
        <button type="button" onClick={onCancel}>
          Cancel
        </button>
      </div>
    </div>
  );
}
