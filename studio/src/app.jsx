// The page's shell: the header, where the page is (`#/graph/<id>[/thread/<id>]`,
// `#/threads`, `#/problems`), the API key asked for once per browser session, and the workflow
// files the server could not serve.
import { useState, useEffect, useCallback, useRef } from "preact/hooks";
import { get, post, onKeyNeeded, apiKey, setApiKey, enc } from "./api.js";
import { Workspace } from "./workspace.jsx";
import { ThreadList } from "./threads.jsx";
import { Problems } from "./problems.jsx";
import { useRoute } from "./router.js";
import { assistantsNow, earlyAssistants, afterGraph, graphDrawn } from "./boot.js";

/** The dialog that asks for the API key; `ask(reason)` resolves with what was typed. */
function KeyDialog({ request, onDone }) {
  const input = useRef(null);
  useEffect(() => {
    if (request && input.current) input.current.focus();
  }, [request]);
  if (!request) return null;
  const submit = (e) => {
    e.preventDefault();
    onDone(input.current.value.trim() || null);
  };
  return (
    <div class="modal-back">
      <form class="modal" role="dialog" aria-modal="true" aria-labelledby="key-title" onSubmit={submit} data-testid="key-dialog">
        <h2 id="key-title">API key</h2>
        <p>This server asks for an API key ({request.reason}). It is kept for this browser session only.</p>
        <label for="api-key">Key</label>
        <input id="api-key" ref={input} type="password" autocomplete="off" data-testid="key-input" />
        <div class="row">
          <button type="submit" class="primary" data-testid="key-submit">
            Use key
          </button>
          <button type="button" onClick={() => onDone(null)}>
            Cancel
          </button>
        </div>
      </form>
    </div>
  );
}

export function App() {
  const route = useRoute();
  // The assistants the page's first request brought, when here already: the first render
  // shows the workspace.
  const [assistants, setAssistants] = useState(assistantsNow);
  const [error, setError] = useState(null);
  const [workflows, setWorkflows] = useState(undefined);
  const [keyRequest, setKeyRequest] = useState(null);

  useEffect(() => {
    onKeyNeeded(
      (reason) =>
        new Promise((resolve) => {
          setKeyRequest({ reason: reason || "401", resolve });
        }),
    );
  }, []);

  const loadAssistants = useCallback(async () => {
    try {
      const found = (await earlyAssistants()) || (await post("/assistants/search", { limit: 1000, offset: 0 }));
      setAssistants(found);
      setError(null);
    } catch (e) {
      setError(e.message);
    }
  }, []);

  // What is served and what is not (runner's `GET /runner/workflows`): polled while the page is
  // seen under `runner dev`, which reloads files as they change; read again on focus otherwise.
  const loadWorkflows = useCallback(async () => {
    try {
      const w = await get("/runner/workflows", { optional: true });
      setWorkflows((old) => {
        if (w && old && old.reloaded_at !== w.reloaded_at) loadAssistants();
        return w;
      });
    } catch {
      setWorkflows(null);
    }
  }, [loadAssistants]);

  useEffect(() => {
    if (!assistants) loadAssistants();
    afterGraph().then(loadWorkflows);
    const focus = () => {
      afterGraph().then(loadWorkflows);
    };
    addEventListener("focus", focus);
    return () => removeEventListener("focus", focus);
  }, []);

  useEffect(() => {
    if (!workflows || !workflows.dev) return;
    const t = setInterval(() => {
      if (document.visibilityState === "visible") loadWorkflows();
    }, 1500);
    return () => clearInterval(t);
  }, [workflows && workflows.dev]);

  const rejected = (workflows && workflows.rejected) || [];
  const graph = route.view === "graph" ? route.graph || (assistants && assistants[0] && assistants[0].graph_id) : null;
  const assistant = assistants && graph ? assistants.find((a) => a.graph_id === graph || a.assistant_id === graph) : null;
  // No graph to draw: what waits for the first one need not.
  useEffect(() => {
    if ((assistants && !assistant) || error) graphDrawn();
  }, [assistants, assistant, error]);

  return (
    <div class="app">
      <header class="top">
        <a class="brand" href="#/">
          runner <span>studio</span>
        </a>
        <nav aria-label="Views">
          <a href={graph ? `#/graph/${enc(graph)}` : "#/"} aria-current={route.view === "graph" ? "page" : undefined} data-testid="nav-graphs">
            Graphs
          </a>
          <a href="#/threads" aria-current={route.view === "threads" ? "page" : undefined} data-testid="nav-threads">
            Threads
          </a>
          <a href="#/problems" aria-current={route.view === "problems" ? "page" : undefined} data-testid="nav-problems">
            Problems
            {rejected.length > 0 && (
              <span class="badge err" data-testid="problem-count">
                {rejected.length}
              </span>
            )}
          </a>
        </nav>
        <div class="top-right">
          {workflows && workflows.dev && <span class="badge">dev · reloads on change</span>}
          {apiKey() && (
            <button type="button" class="link" onClick={() => { setApiKey(null); location.reload(); }}>
              forget key
            </button>
          )}
        </div>
      </header>
      {error && (
        <div class="banner err" role="alert">
          {error}{" "}
          <button type="button" onClick={loadAssistants}>
            Retry
          </button>
        </div>
      )}
      <main>
        {route.view === "threads" && <ThreadList assistants={assistants || []} />}
        {route.view === "problems" && <Problems workflows={workflows} reload={loadWorkflows} />}
        {route.view === "graph" && assistants && !assistants.length && <div class="empty">No workflow is served.</div>}
        {route.view === "graph" && assistants && assistants.length > 0 && !assistant && <div class="empty">No workflow named {graph}.</div>}
        {route.view === "graph" && assistant && (
          <Workspace key={assistant.assistant_id} assistant={assistant} assistants={assistants} threadId={route.thread} />
        )}
      </main>
      <KeyDialog
        request={keyRequest}
        onDone={(key) => {
          keyRequest.resolve(key);
          setKeyRequest(null);
        }}
      />
    </div>
  );
}
