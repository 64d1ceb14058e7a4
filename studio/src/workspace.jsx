// One workflow at work: its graph, its threads, a run started from the input form and watched
// live, the thread's checkpoints and state, gates answered, forks and re-runs, the trace, and
// the chat view for a workflow with a message history.
import { useState, useEffect, useLayoutEffect, useCallback, useMemo } from "preact/hooks";
import { get, post, stream, enc } from "./api.js";
import { GraphView } from "./graph.jsx";
import { LiveRun } from "./live.js";
import { go } from "./router.js";
import { RunPanel, NodeInspector } from "./run.jsx";
import { StatePanel, ForkEditor } from "./state.jsx";
import { GatePanel } from "./gate.jsx";
import { TracePanel } from "./trace.jsx";
import { ChatPanel, messagesKey } from "./chat.jsx";
import { ThreadSidebar } from "./threads.jsx";
import { graphNow, earlyGraph, graphDrawn, afterGraph } from "./boot.js";

/** The stream modes a live run asks for: the page shows all of them. */
export const MODES = ["values", "updates", "messages-tuple", "custom", "events", "debug"];

/** The node a graph node id runs as at the top level (a subgraph's child runs in its parent). */
const topNode = (id) => id.split(":")[0];

export function Workspace({ assistant, assistants, threadId }) {
  const aid = assistant.assistant_id;
  const gid = assistant.graph_id;
  // The graph the page's first requests brought, when it is here already: the first render
  // draws it.
  const [graph, setGraph] = useState(() => graphNow(gid, aid));
  const [schemas, setSchemas] = useState(null);
  const [thread, setThread] = useState(null);
  const [head, setHead] = useState(null);
  const [history, setHistory] = useState([]);
  const [runs, setRuns] = useState([]);
  const [live, setLive] = useState(null);
  const [, setTick] = useState(0);
  const [selected, setSelected] = useState(null);
  const [checkpointId, setCheckpointId] = useState(null);
  const [tab, setTab] = useState("run");
  const [sidebarVersion, setSidebarVersion] = useState(0);
  const [notice, setNotice] = useState(null);
  const [fork, setFork] = useState(null);
  // The thread list and the run panel are drawn once the graph is: the first frame is the
  // graph's alone.
  const [panels, setPanels] = useState(false);
  useEffect(() => {
    let gone = false;
    afterGraph().then(() => !gone && setPanels(true));
    return () => {
      gone = true;
    };
  }, []);

  // A layout effect: the graph is asked for in the commit that shows the workspace, not a frame
  // later. The schemas (the input form's) are asked for beside it, and shown once the graph is
  // drawn.
  useLayoutEffect(() => {
    let gone = false;
    const schemasAsked = get(`/assistants/${enc(aid)}/schemas`);
    schemasAsked.catch(() => {});
    (async () => {
      if (!graph) {
        try {
          const g = (await earlyGraph(gid, aid)) || (await get(`/assistants/${enc(aid)}/graph?xray=true`));
          if (!g.__arrived) g.__arrived = performance.now();
          if (!gone) setGraph(g);
        } catch (e) {
          if (!gone) setNotice(`The graph could not be read: ${e.message}`);
        }
      }
      // After the frame the graph is painted in.
      requestAnimationFrame(() => setTimeout(graphDrawn, 0));
      await afterGraph();
      try {
        const s = await schemasAsked;
        if (!gone) setSchemas(s);
      } catch (e) {
        if (!gone) setNotice(`The schemas could not be read: ${e.message}`);
      }
    })();
    return () => {
      gone = true;
    };
  }, [aid]);

  const refresh = useCallback(
    async (tid = threadId) => {
      if (!tid) return;
      try {
        const [t, h, st, r] = await Promise.all([
          get(`/threads/${enc(tid)}`),
          post(`/threads/${enc(tid)}/history`, { limit: 200 }),
          get(`/threads/${enc(tid)}/state`),
          get(`/threads/${enc(tid)}/runs?limit=50`),
        ]);
        setThread(t);
        setHistory(h || []);
        setHead(st);
        setRuns(r || []);
      } catch (e) {
        setNotice(`The thread could not be read: ${e.message}`);
      }
    },
    [threadId],
  );

  useEffect(() => {
    setThread(null);
    setHead(null);
    setHistory([]);
    setRuns([]);
    setCheckpointId(null);
    setFork(null);
    setLive((l) => (l && l.threadId === threadId ? l : null));
    if (threadId) refresh(threadId);
  }, [threadId]);

  useEffect(() => {
    if (!live) return;
    return live.subscribe(() => setTick((t) => t + 1));
  }, [live]);

  /** Starts a run on the thread (a new thread first when none is open) and streams it. */
  const execute = useCallback(
    async (body, { label = "run" } = {}) => {
      setNotice(null);
      let tid = threadId;
      try {
        if (!tid) {
          const t = await post("/threads", { metadata: { graph_id: gid } });
          tid = t.thread_id;
        }
      } catch (e) {
        setNotice(`The thread could not be created: ${e.message}`);
        return;
      }
      const run = new LiveRun({ threadId: tid, kind: label });
      setLive(run);
      setSelected(null);
      if (tid !== threadId) go({ view: "graph", graph: gid, thread: tid });
      const abort = new AbortController();
      run.abort = abort;
      try {
        await stream(
          `/threads/${enc(tid)}/runs/stream`,
          {
            assistant_id: aid,
            stream_mode: MODES,
            stream_subgraphs: true,
            on_disconnect: "continue",
            ...body,
          },
          (name, data) => run.apply(name, data),
          abort.signal,
        );
      } catch (e) {
        if (e.name !== "AbortError") run.apply("error", { error: e.status ? `HTTP ${e.status}` : "Error", message: e.message });
      }
      let status = null;
      if (run.runId) {
        try {
          status = (await get(`/threads/${enc(tid)}/runs/${enc(run.runId)}`)).status;
        } catch {
          // The run's row is gone (a stateless run); the stream told what happened.
        }
      }
      // The thread as stored first, then the run's end: what the page shows never goes back
      // to the state before the run.
      await refresh(tid);
      run.finish(status);
      setSidebarVersion((v) => v + 1);
    },
    [threadId, aid, gid, refresh],
  );

  const cancel = async () => {
    if (!live || !live.runId) return;
    try {
      await post(`/threads/${enc(live.threadId)}/runs/${enc(live.runId)}/cancel?action=interrupt`, {});
    } catch (e) {
      setNotice(`The run could not be cancelled: ${e.message}`);
    }
  };

  const running = live && (live.status === "running" || live.status === "starting");

  // What the graph shows: the live run's node states; otherwise the selected (or latest)
  // checkpoint's: what runs next, what failed, what waits.
  const shownCheckpoint = useMemo(() => {
    if (checkpointId) return history.find((h) => h.checkpoint_id === checkpointId || h.checkpoint?.checkpoint_id === checkpointId) || head;
    return head;
  }, [checkpointId, history, head]);
  const states = useMemo(() => {
    if (live && (running || !checkpointId)) return live.states();
    const s = {};
    for (const t of (shownCheckpoint && shownCheckpoint.tasks) || []) {
      s[t.name] = t.error ? "error" : t.interrupts && t.interrupts.length ? "interrupted" : "next";
    }
    return s;
  }, [live, live && live.version, running, shownCheckpoint, checkpointId]);

  const chatKey = messagesKey(schemas, head && head.values);
  const interrupts = useMemo(() => {
    const out = [];
    for (const t of (head && head.tasks) || []) for (const i of t.interrupts || []) out.push({ ...i, node: t.name });
    return out;
  }, [head]);

  /**
   * A run from `checkpoint` with the state's edited keys: the edit is stored as a new checkpoint
   * of the thread (`POST /threads/{id}/state`, a fork when `checkpoint` is not the latest), then
   * a run goes on from it.
   */
  const forkAndRun = async ({ checkpoint, values, asNode, run = true }) => {
    setNotice(null);
    let from = { checkpoint_id: checkpoint.checkpoint_id, checkpoint_ns: "" };
    try {
      if (values && Object.keys(values).length) {
        const body = { values, checkpoint: from };
        if (asNode) body.as_node = asNode;
        const updated = await post(`/threads/${enc(threadId)}/state`, body);
        from = updated.checkpoint || { checkpoint_id: updated.checkpoint_id, checkpoint_ns: "" };
      }
    } catch (e) {
      setNotice(`The state could not be edited: ${e.message}`);
      return;
    }
    setFork(null);
    setCheckpointId(null);
    if (run) {
      setTab("run");
      await execute({ input: null, checkpoint: from }, { label: "fork" });
    }
    else await refresh();
  };

  /** The checkpoint a node ran from: the latest of the current branch whose next holds it. */
  const checkpointBefore = (nodeIdValue) => {
    const name = topNode(nodeIdValue);
    return history.find((h) => (h.next || []).includes(name));
  };

  const nodeInfo = selected && live ? live.nodes[selected] : null;

  const tabs = [
    ["run", "Run"],
    ["state", "State"],
    ["trace", "Trace"],
  ];
  if (chatKey) tabs.push(["chat", "Chat"]);

  return (
    <div class="workspace">
      {panels ? (
        <ThreadSidebar
          assistants={assistants}
          graphId={gid}
          threadId={threadId}
          version={sidebarVersion}
          onNew={() => {
            setLive(null);
            go({ view: "graph", graph: gid });
          }}
        />
      ) : (
        <aside class="sidebar" aria-label="Workflows and threads" />
      )}
      <section class="center" aria-label="Graph">
        <div class="center-head">
          <h1>{gid}</h1>
          {assistant.description && <p class="muted desc">{assistant.description}</p>}
          {thread && (
            <div class="thread-line" data-testid="thread-line">
              thread <code data-testid="thread-id">{thread.thread_id}</code>{" "}
              <span class={`badge st-${thread.status}`} data-testid="thread-status">
                {thread.status}
              </span>
            </div>
          )}
        </div>
        {notice && (
          <div class="banner err" role="alert" data-testid="notice">
            {notice}
          </div>
        )}
        <GraphView graph={graph} states={states} selected={selected} onSelect={(id) => setSelected(id === selected ? null : id)} />
        {selected && (
          <NodeInspector
            id={selected}
            graph={graph}
            info={nodeInfo}
            checkpoint={shownCheckpoint}
            live={live}
            canRerun={!!threadId && !running && !!checkpointBefore(selected)}
            onRerun={() => {
              const cp = checkpointBefore(selected);
              if (cp) {
                setCheckpointId(cp.checkpoint_id);
                setFork({ checkpoint: cp, node: topNode(selected) });
                setTab("state");
              }
            }}
            onClose={() => setSelected(null)}
          />
        )}
      </section>
      <section class="panel" aria-label="Run and thread">
        {panels && (
          <>
            {interrupts.length > 0 && !running && (
              <GatePanel interrupts={interrupts} onAnswer={(resume) => execute({ command: { resume } }, { label: "resume" })} />
            )}
            <div class="tabs" role="tablist">
              {tabs.map(([k, t]) => (
                <button
                  type="button"
                  role="tab"
                  key={k}
                  aria-selected={tab === k}
                  data-testid={`tab-${k}`}
                  onClick={() => setTab(k)}
                >
                  {t}
                </button>
              ))}
            </div>
            <div class="tab-body" role="tabpanel">
              {tab === "run" && (
                <RunPanel
                  schemas={schemas}
                  graph={graph}
                  threadId={threadId}
                  thread={thread}
                  live={live}
                  running={running}
                  onRun={(body) => execute(body)}
                  onCancel={cancel}
                  onSelectNode={setSelected}
                />
              )}
              {tab === "state" &&
                (fork ? (
                  <ForkEditor
                    fork={fork}
                    schemas={schemas}
                    graph={graph}
                    onCancel={() => setFork(null)}
                    onSubmit={(values, asNode, run) => forkAndRun({ checkpoint: fork.checkpoint, values, asNode, run })}
                  />
                ) : (
                  <StatePanel
                    history={history}
                    head={head}
                    selectedId={checkpointId}
                    onSelect={setCheckpointId}
                    onFork={(cp) => setFork({ checkpoint: cp })}
                    onRerun={(cp, node) => setFork({ checkpoint: cp, node })}
                    disabled={running || !threadId}
                  />
                ))}
              {tab === "trace" && <TracePanel threadId={threadId} runs={runs} live={live} />}
              {tab === "chat" && chatKey && (
                <ChatPanel
                  messagesKey={chatKey}
                  values={live && live.values && running ? live.values : head && head.values}
                  history={history}
                  head={head}
                  live={live}
                  running={running}
                  onSend={(message, checkpoint) =>
                    execute({ input: { [chatKey]: [message] }, ...(checkpoint ? { checkpoint } : {}) }, { label: "chat" })
                  }
                  onRegenerate={(checkpoint) => execute({ input: null, checkpoint }, { label: "regenerate" })}
                />
              )}
            </div>
          </>
        )}
      </section>
    </div>
  );
}
