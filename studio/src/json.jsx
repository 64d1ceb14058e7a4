// JSON shown as a collapsible tree that stays fast on big states: a level's children are
// rendered only once opened, long lists a page at a time, long strings cut until asked; and
// the difference between two states, path by path.
import { useState } from "preact/hooks";

const PAGE = 100;
const CUT = 300;

function preview(v) {
  if (Array.isArray(v)) return `[${v.length}]`;
  if (v && typeof v === "object") {
    const keys = Object.keys(v);
    return `{${keys.slice(0, 4).join(", ")}${keys.length > 4 ? ", …" : ""}}`;
  }
  return JSON.stringify(v);
}

function Scalar({ value }) {
  const [whole, setWhole] = useState(false);
  if (typeof value === "string") {
    const long = value.length > CUT;
    return (
      <span class="j-str">
        "{long && !whole ? value.slice(0, CUT) : value}"
        {long && (
          <button type="button" class="link" onClick={() => setWhole(!whole)}>
            {whole ? "less" : `… ${value.length - CUT} more chars`}
          </button>
        )}
      </span>
    );
  }
  if (value === null) return <span class="j-null">null</span>;
  return <span class={`j-${typeof value}`}>{String(value)}</span>;
}

function Entry({ name, value, depth, open: initiallyOpen, path, openDepth = 1 }) {
  const composite = value !== null && typeof value === "object";
  const [open, setOpen] = useState(initiallyOpen);
  const [shown, setShown] = useState(PAGE);
  if (!composite) {
    return (
      <div class="j-row" data-path={path}>
        {name !== undefined && <span class="j-key">{name}: </span>}
        <Scalar value={value} />
      </div>
    );
  }
  const entries = Array.isArray(value) ? value.map((v, i) => [i, v]) : Object.entries(value);
  return (
    <div class="j-node" data-path={path}>
      <button
        type="button"
        class="j-toggle"
        aria-expanded={open}
        onClick={() => setOpen(!open)}
      >
        <span class="caret">{open ? "▾" : "▸"}</span>
        {name !== undefined && <span class="j-key">{name}: </span>}
        {!open && <span class="muted">{preview(value)}</span>}
        {open && <span class="muted">{Array.isArray(value) ? `[${value.length}]` : ""}</span>}
      </button>
      {open && (
        <div class="j-children">
          {entries.slice(0, shown).map(([k, v]) => (
            <Entry key={k} name={k} value={v} depth={depth + 1} open={depth + 1 < openDepth} openDepth={openDepth} path={`${path}/${k}`} />
          ))}
          {entries.length > shown && (
            <button type="button" class="link" onClick={() => setShown(shown + PAGE)}>
              show {Math.min(PAGE, entries.length - shown)} more of {entries.length - shown}
            </button>
          )}
        </div>
      )}
    </div>
  );
}

/** A value as a tree, its first `open` levels open. */
export function JsonTree({ value, testid, open = 1 }) {
  if (value === undefined) return <div class="muted">—</div>;
  return (
    <div class="json" data-testid={testid}>
      <Entry value={value} depth={0} open={true} openDepth={open} path="" />
    </div>
  );
}

/** The paths where `b` differs from `a`: `[{path, op: "add"|"remove"|"change", from, to}]`. */
export function diff(a, b, path = "", out = [], limit = 500) {
  if (out.length >= limit) return out;
  if (a === b) return out;
  const oa = a !== null && typeof a === "object";
  const ob = b !== null && typeof b === "object";
  if (oa && ob && Array.isArray(a) === Array.isArray(b)) {
    if (Array.isArray(a)) {
      // An append-only list shows its new items, not every index moved.
      const n = Math.min(a.length, b.length);
      for (let i = 0; i < n; i++) diff(a[i], b[i], `${path}/${i}`, out, limit);
      for (let i = n; i < b.length; i++) out.push({ path: `${path}/${i}`, op: "add", to: b[i] });
      for (let i = n; i < a.length; i++) out.push({ path: `${path}/${i}`, op: "remove", from: a[i] });
      return out;
    }
    for (const k of Object.keys(b)) {
      if (!(k in a)) out.push({ path: `${path}/${k}`, op: "add", to: b[k] });
      else diff(a[k], b[k], `${path}/${k}`, out, limit);
    }
    for (const k of Object.keys(a)) if (!(k in b)) out.push({ path: `${path}/${k}`, op: "remove", from: a[k] });
    return out;
  }
  if (a === undefined) out.push({ path: path || "/", op: "add", to: b });
  else if (b === undefined) out.push({ path: path || "/", op: "remove", from: a });
  else out.push({ path: path || "/", op: "change", from: a, to: b });
  return out;
}

function short(v) {
  const t = JSON.stringify(v);
  if (t === undefined) return "undefined";
  return t.length > 160 ? t.slice(0, 159) + "…" : t;
}

export function Diff({ from, to, testid = "state-diff", none = "No change from the previous checkpoint." }) {
  const changes = diff(from ?? {}, to ?? {});
  if (!changes.length) return <div class="muted" data-testid={testid}>{none}</div>;
  return (
    <ul class="diff" data-testid={testid}>
      {changes.map((c) => (
        <li key={c.path + c.op} class={`diff-${c.op}`}>
          <code>{c.path}</code>{" "}
          {c.op === "add" && <span>+ {short(c.to)}</span>}
          {c.op === "remove" && <span>− {short(c.from)}</span>}
          {c.op === "change" && (
            <span>
              {short(c.from)} → {short(c.to)}
            </span>
          )}
        </li>
      ))}
      {changes.length >= 500 && <li class="muted">(first 500 changes)</li>}
    </ul>
  );
}
