// A JSON Schema as a form: typed fields for a simple object schema (text, numbers, switches,
// choices, lists of text), JSON for anything else, and a JSON editor for the whole value.
import { useState, useEffect } from "preact/hooks";

/** `schema` with a local `$ref` (`#/…`) followed, against `root`. */
export function resolve(schema, root, depth = 0) {
  if (!schema || typeof schema !== "object" || depth > 8) return schema || {};
  if (typeof schema.$ref === "string" && schema.$ref.startsWith("#/")) {
    let target = root;
    for (const part of schema.$ref.slice(2).split("/")) target = target && target[part.replace(/~1/g, "/").replace(/~0/g, "~")];
    if (target) return resolve({ ...target, ...omit(schema, "$ref") }, root, depth + 1);
  }
  return schema;
}

function omit(o, k) {
  const c = { ...o };
  delete c[k];
  return c;
}

/** The type a field is edited as, from its (resolved) schema. */
export function fieldType(s) {
  if (Array.isArray(s.enum)) return "enum";
  if ("const" in s) return "const";
  let t = s.type;
  const alts = s.anyOf || s.oneOf;
  if (!t && Array.isArray(alts)) {
    const types = alts.map((a) => a.type).filter((x) => x && x !== "null");
    if (types.length === 1) t = types[0];
  }
  if (Array.isArray(t)) {
    const real = t.filter((x) => x !== "null");
    t = real.length === 1 ? real[0] : null;
  }
  if (t === "array") {
    const items = s.items || {};
    if (items.type === "string" && !items.enum) return "lines";
    return "json";
  }
  if (["string", "number", "integer", "boolean"].includes(t)) return t;
  return "json";
}

/** Whether a schema is simple enough to be shown as typed fields (an object of properties). */
export function simple(schema, root) {
  const s = resolve(schema, root);
  return s && (s.type === "object" || s.properties) && s.properties && Object.keys(s.properties).length > 0;
}

/** The value a schema starts with: each property's default. */
export function initialValue(schema, root = schema) {
  const s = resolve(schema, root);
  if (!s || !s.properties) return s && "default" in s ? s.default : {};
  const v = {};
  for (const [k, p] of Object.entries(s.properties)) {
    const r = resolve(p, root);
    if ("default" in r) v[k] = r.default;
  }
  return v;
}

function Field({ name, schema, root, required, value, onChange, idPrefix }) {
  const s = resolve(schema, root);
  const t = fieldType(s);
  const id = `${idPrefix}-${name}`;
  const [text, setText] = useState(() => (t === "json" && value !== undefined ? JSON.stringify(value, null, 2) : ""));
  const [bad, setBad] = useState(null);
  const common = { id, name, "data-testid": `field-${name}`, "aria-describedby": s.description ? id + "-d" : undefined };
  let input;
  switch (t) {
    case "boolean":
      input = <input type="checkbox" {...common} checked={!!value} onChange={(e) => onChange(e.currentTarget.checked)} />;
      break;
    case "integer":
    case "number":
      input = (
        <input
          type="number"
          {...common}
          step={t === "integer" ? 1 : "any"}
          min={s.minimum}
          max={s.maximum}
          value={value ?? ""}
          onInput={(e) => {
            const raw = e.currentTarget.value;
            onChange(raw === "" ? undefined : t === "integer" ? parseInt(raw, 10) : parseFloat(raw));
          }}
        />
      );
      break;
    case "enum":
      input = (
        <select {...common} value={value === undefined ? "" : JSON.stringify(value)} onChange={(e) => onChange(e.currentTarget.value === "" ? undefined : JSON.parse(e.currentTarget.value))}>
          <option value="">—</option>
          {s.enum.map((o) => (
            <option key={JSON.stringify(o)} value={JSON.stringify(o)}>
              {String(o)}
            </option>
          ))}
        </select>
      );
      break;
    case "const":
      input = <code>{JSON.stringify(s.const)}</code>;
      break;
    case "lines":
      input = (
        <textarea
          {...common}
          rows={3}
          placeholder="one item a line"
          value={(value || []).join("\n")}
          onInput={(e) => onChange(e.currentTarget.value.split("\n").filter((l) => l.length))}
        />
      );
      break;
    case "string": {
      const long = !s.maxLength || s.maxLength > 120;
      input = long ? (
        <textarea {...common} rows={name.match(/content|document|text|body|prompt|message/i) ? 4 : 1} value={value ?? ""} onInput={(e) => onChange(e.currentTarget.value)} />
      ) : (
        <input type="text" {...common} value={value ?? ""} onInput={(e) => onChange(e.currentTarget.value)} />
      );
      break;
    }
    default:
      input = (
        <textarea
          {...common}
          class={bad ? "invalid" : ""}
          rows={3}
          placeholder="JSON"
          value={text}
          onInput={(e) => {
            const raw = e.currentTarget.value;
            setText(raw);
            if (!raw.trim()) {
              setBad(null);
              onChange(undefined);
              return;
            }
            try {
              onChange(JSON.parse(raw));
              setBad(null);
            } catch (err) {
              setBad(err.message);
            }
          }}
        />
      );
  }
  return (
    <div class={`field field-${t}`}>
      <label for={id}>
        {name}
        {required && <span class="req" title="required">*</span>}
        <span class="muted"> {t === "json" ? "JSON" : t}</span>
      </label>
      {input}
      {s.description && (
        <div class="help" id={id + "-d"}>
          {s.description}
        </div>
      )}
      {bad && <div class="error">{bad}</div>}
    </div>
  );
}

/**
 * A form for `schema` over `value` (controlled): typed fields when the schema is an object of
 * properties, with a switch to edit the whole value as JSON; JSON only otherwise.
 */
export function SchemaForm({ schema, value, onChange, idPrefix = "f", testid }) {
  const root = schema || {};
  const s = resolve(root, root);
  const typed = simple(root, root);
  const [json, setJson] = useState(!typed);
  const [text, setText] = useState(() => JSON.stringify(value ?? {}, null, 2));
  const [bad, setBad] = useState(null);
  useEffect(() => {
    if (!json) setText(JSON.stringify(value ?? {}, null, 2));
  }, [value, json]);
  const required = new Set(s.required || []);
  return (
    <div class="schema-form" data-testid={testid}>
      {typed && (
        <div class="form-mode">
          <label>
            <input type="checkbox" checked={json} onChange={(e) => setJson(e.currentTarget.checked)} data-testid="json-mode" /> edit as JSON
          </label>
        </div>
      )}
      {!json &&
        Object.entries(s.properties).map(([k, p]) => (
          <Field
            key={k}
            name={k}
            schema={p}
            root={root}
            required={required.has(k)}
            value={value?.[k]}
            idPrefix={idPrefix}
            onChange={(v) => {
              const next = { ...(value || {}) };
              if (v === undefined) delete next[k];
              else next[k] = v;
              onChange(next);
            }}
          />
        ))}
      {json && (
        <div class="field">
          <textarea
            class={`code ${bad ? "invalid" : ""}`}
            rows={8}
            data-testid="json-editor"
            aria-label="Value as JSON"
            value={text}
            onInput={(e) => {
              const raw = e.currentTarget.value;
              setText(raw);
              try {
                onChange(raw.trim() ? JSON.parse(raw) : null);
                setBad(null);
              } catch (err) {
                setBad(err.message);
              }
            }}
          />
          {bad && <div class="error">{bad}</div>}
        </div>
      )}
    </div>
  );
}
