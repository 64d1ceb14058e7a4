// What the page's inline script (index.html) asked for before the bundle loaded, each taken
// once by the first view that needs it: at once when it has arrived (so the first render
// draws it), or when it does. `null` when it was not asked for or failed: the caller asks
// itself (and handles the API key).

const boot = () => (typeof window !== "undefined" && window.__studioBoot) || {};

/** Takes the answer under `name` if it has arrived: `{value}`, else null. */
function arrived(name, ok = () => true) {
  const b = boot();
  const a = b[name];
  if (!a || !("value" in a) || !ok(a)) return null;
  delete b[name];
  return a.value ? { value: a.value, at: a.at } : null;
}

/** Takes the answer under `name` when it arrives. */
async function later(name, ok = () => true) {
  const b = boot();
  const a = b[name];
  if (!a || !ok(a)) return null;
  delete b[name];
  return await a.data;
}

const named = (id, alias) => (a) => a.id === id || a.id === alias;

/** The answer to `POST /assistants/search` if it has arrived. */
export const assistantsNow = () => arrived("assistants")?.value ?? null;

/** The answer to `POST /assistants/search`, when it arrives. */
export const earlyAssistants = () => later("assistants");

/**
 * The drawing of graph `id` (or of the assistant `alias`) if it has arrived, its `__arrived`
 * the time it did.
 */
export function graphNow(id, alias) {
  const a = arrived("graph", named(id, alias));
  if (!a) return null;
  a.value.__arrived = a.at;
  return a.value;
}

/** The drawing of graph `id` (or of the assistant `alias`), when it arrives. */
export const earlyGraph = (id, alias) => later("graph", named(id, alias));

// The first graph drawn: what only the other panels need waits for it, so that the graph's
// requests and its drawing have the server and the page to themselves.
let drawn;
const firstGraph = new Promise((resolve) => {
  drawn = resolve;
});

/** Says the first graph is drawn (or will not be: it failed, or the view shows none). */
export function graphDrawn() {
  drawn();
}

/** Resolves once the first graph is drawn, at once when the page did not open on a graph. */
export function afterGraph() {
  return /^#\/graph\/[^/]/.test(location.hash) ? firstGraph : Promise.resolve();
}
