// Runs the conformance scenarios against one server through LangGraph's JS client
// (@langchain/langgraph-sdk's `Client`, the version agent-chat-ui pins, locked in
// package-lock.json beside this file), recording what every call returned: a stream's events,
// a thread's state, a run, or the error the server answered.
//
//     npm ci   # once, in this folder
//     node drive.mjs URL SCENARIOS.json OUT.json [SCENARIO ...]
//
// run.py --js runs it against both servers; SCENARIOS.json is what run.py writes.
//
// It reads the same scenarios as drive.py (scenarios.yaml as JSON) and writes records of the
// same shape, so compare.py reads both: per scenario a list of {step, op, result} or
// {step, op, error: {status, body}}, or {failed, trace} when the scenario broke.
//
// Scenarios name ops and arguments the Python SDK's way (`runs.stream` with `thread_id`,
// `stream_mode`, ...). Each op is mapped below to the JS method and its camelCase options,
// so the request is the one the JS SDK (and so agent-chat-ui) makes. An op or an argument
// the JS SDK cannot express is recorded as {step, op, unsupported: "why"} and not sent.

import { readFileSync, writeFileSync } from "node:fs";
import { Client } from "@langchain/langgraph-sdk";

/** A step that could not be carried out at all (not an error answer, which is recorded). */
class Failed extends Error {
  constructor(message) {
    super(message);
    this.name = "Failed";
  }
}

/** A step the JS SDK cannot express: recorded as such, nothing is sent. */
class Unsupported extends Error {
  constructor(message) {
    super(message);
    this.name = "Unsupported";
  }
}

/** `$name.path` strings are replaced by what the step named `name` returned. */
function resolve(value, saved) {
  if (typeof value === "string" && value.startsWith("$") && !value.startsWith("$$")) {
    const [name, ...path] = value.slice(1).split(".");
    if (!(name in saved)) throw new Failed(`${value}: no step saved \`${name}\``);
    let at = saved[name];
    for (const part of path) {
      if (Array.isArray(at)) {
        at = at[Number.parseInt(part, 10)];
      } else if (at !== null && typeof at === "object" && part in at) {
        at = at[part];
      } else {
        throw new Failed(`${value}: \`${part}\` is not in ${JSON.stringify(at)?.slice(0, 300)}`);
      }
    }
    return at;
  }
  if (typeof value === "string" && value.startsWith("$$")) return value.slice(1);
  if (Array.isArray(value)) return value.map((v) => resolve(v, saved));
  if (value !== null && typeof value === "object") {
    const out = {};
    for (const [k, v] of Object.entries(value)) out[resolve(k, saved)] = resolve(v, saved);
    return out;
  }
  return value;
}

/** An error the server answered (the SDK's HTTPError), as drive.py records it: the status
 * and the body, parsed as JSON when it is JSON. */
function isHttpError(e) {
  return e instanceof Error && typeof e.status === "number" && typeof e.text === "string";
}

function errorRecord(e) {
  let body = e.text === "" ? null : e.text;
  if (body !== null) {
    try {
      body = JSON.parse(body);
    } catch {
      // not JSON: the text, as the Python SDK keeps it
    }
  }
  return { status: e.status, body };
}

// --- the op mapping -------------------------------------------------------------------------
//
// Each op: `pos`, the Python SDK's positional parameters, passed to `call` in that order;
// `kw`, the keyword arguments the JS method takes as options: python name -> JS option name,
// or [JS name, convert]; `no`, Python arguments the JS method has no way to send, with why;
// `call(client, positional, options)`. Every call also gets the scenario's abort signal.

const HEADERS = { headers: "the JS client takes headers once, at construction", params: "the JS methods take no extra query parameters" };

const RUN_KW = {
  input: "input",
  command: "command",
  config: "config",
  context: "context",
  metadata: "metadata",
  interrupt_before: "interruptBefore",
  interrupt_after: "interruptAfter",
  checkpoint: "checkpoint",
  webhook: "webhook",
  multitask_strategy: "multitaskStrategy",
  after_seconds: "afterSeconds",
  if_not_exists: "ifNotExists",
  checkpoint_during: "checkpointDuring",
  durability: "durability",
};
const RUN_NO = {
  ...HEADERS,
  strict_resume: "the JS SDK has no strictResume option",
  langsmith_tracing: "the JS SDK has no langsmith_tracing option (only an internal _langsmithTracer on create and wait)",
  on_run_created: "a callback, not data",
};

const OPS = {
  // assistants
  "assistants.get": { pos: ["assistant_id"], no: HEADERS, call: (c, [id], o) => c.assistants.get(id, o) },
  "assistants.get_graph": { pos: ["assistant_id"], kw: { xray: "xray" }, no: HEADERS, call: (c, [id], o) => c.assistants.getGraph(id, o) },
  "assistants.get_schemas": { pos: ["assistant_id"], no: HEADERS, call: (c, [id], o) => c.assistants.getSchemas(id, o) },
  "assistants.get_subgraphs": {
    pos: ["assistant_id"],
    kw: { namespace: "namespace", recurse: "recurse" },
    no: HEADERS,
    call: (c, [id], o) => c.assistants.getSubgraphs(id, o),
  },
  "assistants.create": {
    pos: [],
    kw: {
      graph_id: "graphId",
      config: "config",
      context: "context",
      metadata: "metadata",
      assistant_id: "assistantId",
      if_exists: "ifExists",
      name: "name",
      description: "description",
    },
    no: HEADERS,
    call: (c, _, o) => c.assistants.create(o),
  },
  "assistants.update": {
    pos: ["assistant_id"],
    kw: { graph_id: "graphId", config: "config", context: "context", metadata: "metadata", name: "name", description: "description" },
    no: HEADERS,
    call: (c, [id], o) => c.assistants.update(id, o),
  },
  "assistants.delete": {
    pos: ["assistant_id"],
    kw: { delete_threads: "deleteThreads" },
    no: HEADERS,
    call: (c, [id], o) => c.assistants.delete(id, o),
  },
  "assistants.search": {
    pos: [],
    kw: {
      metadata: "metadata",
      graph_id: "graphId",
      name: "name",
      limit: "limit",
      offset: "offset",
      sort_by: "sortBy",
      sort_order: "sortOrder",
      select: "select",
      // Python's "object" answer ({assistants, next}) is the JS includePagination answer.
      response_format: ["includePagination", (v) => v === "object"],
    },
    no: HEADERS,
    call: (c, _, o) => c.assistants.search(o),
  },
  "assistants.count": {
    pos: [],
    kw: { metadata: "metadata", graph_id: "graphId", name: "name" },
    no: HEADERS,
    call: (c, _, o) => c.assistants.count(o),
  },
  "assistants.get_versions": {
    pos: ["assistant_id"],
    kw: { metadata: "metadata", limit: "limit", offset: "offset" },
    no: HEADERS,
    call: (c, [id], o) => c.assistants.getVersions(id, o),
  },
  "assistants.set_latest": { pos: ["assistant_id", "version"], no: HEADERS, call: (c, [id, v], o) => c.assistants.setLatest(id, v, o) },

  // threads
  "threads.get": { pos: ["thread_id"], kw: { include: "include" }, no: HEADERS, call: (c, [id], o) => c.threads.get(id, o) },
  "threads.create": {
    pos: [],
    kw: {
      metadata: "metadata",
      thread_id: "threadId",
      if_exists: "ifExists",
      graph_id: "graphId",
      ttl: "ttl",
      // The JS SDK takes each update's `as_node` as `asNode`.
      supersteps: [
        "supersteps",
        (steps) => steps?.map((s) => ({ updates: s.updates.map(({ as_node, ...u }) => ({ ...u, asNode: as_node })) })),
      ],
    },
    no: HEADERS,
    call: (c, _, o) => c.threads.create(o),
  },
  "threads.update": {
    pos: ["thread_id"],
    kw: { metadata: "metadata", ttl: "ttl" },
    no: { ...HEADERS, return_minimal: "the JS SDK's threads.update has no returnMinimal option" },
    call: (c, [id], o) => c.threads.update(id, o),
  },
  "threads.delete": { pos: ["thread_id"], no: HEADERS, call: (c, [id], o) => c.threads.delete(id, o) },
  "threads.search": {
    pos: [],
    kw: {
      metadata: "metadata",
      values: "values",
      ids: "ids",
      status: "status",
      limit: "limit",
      offset: "offset",
      sort_by: "sortBy",
      sort_order: "sortOrder",
      select: "select",
      extract: "extract",
    },
    no: HEADERS,
    call: (c, _, o) => c.threads.search(o),
  },
  "threads.count": {
    pos: [],
    kw: { metadata: "metadata", values: "values", status: "status" },
    no: HEADERS,
    call: (c, _, o) => c.threads.count(o),
  },
  "threads.copy": { pos: ["thread_id"], no: HEADERS, call: (c, [id], o) => c.threads.copy(id, o) },
  "threads.prune": { pos: ["thread_ids"], kw: { strategy: "strategy" }, no: HEADERS, call: (c, [ids], o) => c.threads.prune(ids, o) },
  // The JS getState takes the checkpoint (an object) or its id (a string) in one parameter:
  // an object posts to /state/checkpoint, an id gets /state/{id}, as Python's does.
  "threads.get_state": {
    pos: ["thread_id"],
    kw: { checkpoint: "checkpoint", checkpoint_id: "checkpointId", subgraphs: "subgraphs" },
    no: { ...HEADERS, select: "the JS SDK's threads.getState has no select option" },
    call: (c, [id], { checkpoint, checkpointId, ...o }) => c.threads.getState(id, checkpoint ?? checkpointId, o),
  },
  "threads.update_state": {
    pos: ["thread_id", "values"],
    kw: { as_node: "asNode", checkpoint: "checkpoint", checkpoint_id: "checkpointId" },
    no: HEADERS,
    call: (c, [id, values], o) => c.threads.updateState(id, { values, ...o }),
  },
  "threads.get_history": {
    pos: ["thread_id"],
    kw: { limit: "limit", before: "before", metadata: "metadata", checkpoint: "checkpoint" },
    no: { ...HEADERS, select: "the JS SDK's threads.getHistory has no select option" },
    call: (c, [id], o) => c.threads.getHistory(id, o),
  },

  // runs
  "runs.stream": {
    stream: true,
    pos: ["thread_id", "assistant_id"],
    kw: {
      ...RUN_KW,
      stream_mode: "streamMode",
      stream_subgraphs: "streamSubgraphs",
      stream_resumable: "streamResumable",
      feedback_keys: "feedbackKeys",
      on_disconnect: "onDisconnect",
      on_completion: "onCompletion",
    },
    no: {
      ...RUN_NO,
      checkpoint_id: "the JS SDK's runs.stream has no checkpointId option (it sends only `checkpoint`)",
      version: "the JS SDK streams one shape of part; Python's version=v2 reshapes parts client-side",
    },
    call: (c, [tid, aid], o) => c.runs.stream(tid, aid, o),
  },
  "runs.create": {
    pos: ["thread_id", "assistant_id"],
    kw: {
      ...RUN_KW,
      checkpoint_id: "checkpointId",
      stream_mode: "streamMode",
      stream_subgraphs: "streamSubgraphs",
      stream_resumable: "streamResumable",
      feedback_keys: "feedbackKeys",
      on_completion: "onCompletion",
    },
    no: RUN_NO,
    call: (c, [tid, aid], o) => c.runs.create(tid, aid, o),
  },
  "runs.wait": {
    pos: ["thread_id", "assistant_id"],
    kw: {
      ...RUN_KW,
      checkpoint_id: "checkpointId",
      on_disconnect: "onDisconnect",
      on_completion: "onCompletion",
      raise_error: "raiseError",
    },
    no: RUN_NO,
    call: (c, [tid, aid], o) => c.runs.wait(tid, aid, o),
  },
  "runs.create_batch": {
    pos: ["payloads"],
    no: HEADERS,
    // The JS SDK reads each payload's assistant as `assistantId` and passes the rest as is.
    call: (c, [payloads], o) => c.runs.createBatch(payloads.map(({ assistant_id, ...p }) => ({ ...p, assistantId: assistant_id })), o),
  },
  "runs.list": {
    pos: ["thread_id"],
    kw: { limit: "limit", offset: "offset", status: "status", select: "select" },
    no: HEADERS,
    call: (c, [tid], o) => c.runs.list(tid, o),
  },
  "runs.get": { pos: ["thread_id", "run_id"], no: HEADERS, call: (c, [tid, rid], o) => c.runs.get(tid, rid, o) },
  "runs.cancel": {
    pos: ["thread_id", "run_id"],
    kw: { wait: "wait", action: "action" },
    no: HEADERS,
    call: (c, [tid, rid], { wait, action, ...o }) => c.runs.cancel(tid, rid, wait ?? false, action ?? "interrupt", o),
  },
  "runs.cancel_many": {
    pos: [],
    kw: { thread_id: "threadId", run_ids: "runIds", status: "status", action: "action" },
    no: HEADERS,
    call: (c, _, o) => c.runs.cancelMany(o),
  },
  "runs.join": { pos: ["thread_id", "run_id"], no: HEADERS, call: (c, [tid, rid], o) => c.runs.join(tid, rid, o) },
  "runs.join_stream": {
    stream: true,
    pos: ["thread_id", "run_id"],
    kw: { cancel_on_disconnect: "cancelOnDisconnect", stream_mode: "streamMode", last_event_id: "lastEventId" },
    no: HEADERS,
    call: (c, [tid, rid], o) => c.runs.joinStream(tid, rid, o),
  },
  "runs.delete": { pos: ["thread_id", "run_id"], no: HEADERS, call: (c, [tid, rid], o) => c.runs.delete(tid, rid, o) },

  // store
  "store.put_item": {
    pos: ["namespace", "key", "value"],
    kw: { index: "index", ttl: "ttl" },
    no: HEADERS,
    call: (c, [ns, key, value], o) => c.store.putItem(ns, key, value, o),
  },
  "store.get_item": {
    pos: ["namespace", "key"],
    kw: { refresh_ttl: "refreshTtl" },
    no: HEADERS,
    call: (c, [ns, key], o) => c.store.getItem(ns, key, o),
  },
  "store.delete_item": { pos: ["namespace", "key"], no: HEADERS, call: (c, [ns, key], o) => c.store.deleteItem(ns, key, o) },
  "store.search_items": {
    pos: ["namespace_prefix"],
    kw: { filter: "filter", limit: "limit", offset: "offset", query: "query", refresh_ttl: "refreshTtl" },
    no: HEADERS,
    call: (c, [prefix], o) => c.store.searchItems(prefix, o),
  },
  "store.list_namespaces": {
    pos: [],
    kw: { prefix: "prefix", suffix: "suffix", max_depth: "maxDepth", limit: "limit", offset: "offset" },
    no: HEADERS,
    call: (c, _, o) => c.store.listNamespaces(o),
  },

  // crons
  "crons.create": {
    pos: ["assistant_id"],
    kw: {
      schedule: "schedule",
      input: "input",
      metadata: "metadata",
      config: "config",
      context: "context",
      checkpoint_during: "checkpointDuring",
      interrupt_before: "interruptBefore",
      interrupt_after: "interruptAfter",
      webhook: "webhook",
      on_run_completed: "onRunCompleted",
      multitask_strategy: "multitaskStrategy",
      end_time: "endTime",
      enabled: "enabled",
      timezone: "timezone",
      stream_mode: "streamMode",
      stream_subgraphs: "streamSubgraphs",
      stream_resumable: "streamResumable",
      durability: "durability",
    },
    no: HEADERS,
    call: (c, [aid], o) => c.crons.create(aid, o),
  },
  "crons.create_for_thread": {
    pos: ["thread_id", "assistant_id"],
    kw: {
      schedule: "schedule",
      input: "input",
      metadata: "metadata",
      config: "config",
      context: "context",
      checkpoint_during: "checkpointDuring",
      interrupt_before: "interruptBefore",
      interrupt_after: "interruptAfter",
      webhook: "webhook",
      multitask_strategy: "multitaskStrategy",
      end_time: "endTime",
      enabled: "enabled",
      timezone: "timezone",
      stream_mode: "streamMode",
      stream_subgraphs: "streamSubgraphs",
      stream_resumable: "streamResumable",
      durability: "durability",
    },
    no: HEADERS,
    call: (c, [tid, aid], o) => c.crons.createForThread(tid, aid, o),
  },
  "crons.delete": { pos: ["cron_id"], no: HEADERS, call: (c, [id], o) => c.crons.delete(id, o) },
  "crons.search": {
    pos: [],
    kw: {
      assistant_id: "assistantId",
      thread_id: "threadId",
      enabled: "enabled",
      limit: "limit",
      offset: "offset",
      sort_by: "sortBy",
      sort_order: "sortOrder",
      select: "select",
    },
    no: { ...HEADERS, metadata: "the JS SDK's crons.search has no metadata filter" },
    call: (c, _, o) => c.crons.search(o),
  },
  "crons.count": {
    pos: [],
    kw: { assistant_id: "assistantId", thread_id: "threadId" },
    no: { ...HEADERS, metadata: "the JS SDK's crons.count has no metadata filter" },
    call: (c, _, o) => c.crons.count(o),
  },
};

// Python SDK methods with no JS counterpart at all.
const NO_OP = {
  "threads.stream": "the JS SDK has no threads.stream (Python's thread-level stream session)",
  "threads.join_stream": "drive.py does not stream threads.join_stream either (its records would not compare)",
};

/** The op's positional values and JS options from the step's Python-named arguments. */
function translate(op, spec, args) {
  const positional = [];
  for (const name of spec.pos) {
    if (!(name in args)) throw new Failed(`${op}: the argument \`${name}\` is required`);
    positional.push(args[name]);
  }
  const options = {};
  for (const [name, value] of Object.entries(args)) {
    if (spec.pos.includes(name)) continue;
    const to = spec.kw?.[name];
    if (to === undefined) {
      const why = spec.no?.[name];
      if (why) throw new Unsupported(`${op}(${name}): ${why}`);
      throw new Failed(`${op}: no argument \`${name}\` in the Python SDK's signature as the JS driver knows it`);
    }
    if (Array.isArray(to)) options[to[0]] = to[1](value);
    else options[to] = value;
  }
  return [positional, options];
}

// --- scenarios ------------------------------------------------------------------------------

const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });

class Scenario {
  constructor(client, spec, signal) {
    this.client = client;
    this.spec = spec;
    this.signal = signal;
    this.saved = {};
    this.background = new Map();
    this.records = [];
  }

  async run() {
    const steps = this.spec.steps;
    for (let i = 0; i < steps.length; i++) {
      const step = steps[i];
      if ("background" in step) {
        const task = this.call(step);
        task.catch(() => {}); // handled where it is awaited
        this.background.set(step.background, [i, task]);
        continue;
      }
      if (step.op === "await") {
        if (!this.background.has(step.name)) throw new Failed(`await: no background step \`${step.name}\``);
        const [index, task] = this.background.get(step.name);
        this.background.delete(step.name);
        this.keep(index, steps[index], await task);
        continue;
      }
      this.keep(i, step, await this.call(step));
    }
    for (const [index, task] of this.background.values()) this.keep(index, steps[index], await task);
    return this.records;
  }

  keep(index, step, [result, record]) {
    if ("save" in step) this.saved[step.save] = result;
    if ((step.record ?? true) && record !== null) this.records.push({ step: index, op: step.op, ...record });
  }

  /** The step's result (what `save` keeps) and what is recorded of it. */
  async call(step) {
    const op = step.op;
    const args = resolve(step.args ?? {}, this.saved);
    try {
      if (op === "sleep") {
        await sleep(step.seconds * 1000, this.signal);
        return [null, null];
      }
      if (op === "wait_status") return await this.waitStatus(args, step);
      if (op in NO_OP) throw new Unsupported(`${op}: ${NO_OP[op]}`);
      const spec = OPS[op];
      if (!spec) throw new Failed(`${op}: not an op of the Python SDK the JS driver knows`);
      const [positional, options] = translate(op, spec, args);
      if (spec.stream) return await this.stream(op, spec, positional, options, step);
      const result = (await spec.call(this.client, positional, { ...options, signal: this.signal })) ?? null;
      return [result, { result }];
    } catch (e) {
      if (e instanceof Unsupported) return [null, { unsupported: e.message }];
      if (isHttpError(e)) return [null, { error: errorRecord(e) }];
      throw e;
    }
  }

  async stream(op, spec, positional, options, step) {
    // Its own abort signal, so that closing the stream early closes the connection too, as
    // an application that stops reading does (breaking out of the loop alone would leave the
    // response open).
    const own = new AbortController();
    const signal = AbortSignal.any([this.signal, own.signal]);
    const created = [];
    if (op === "runs.stream") options.onRunCreated = (meta) => created.push(meta);
    const parts = spec.call(this.client, positional, { ...options, signal });
    const events = [];
    const stopAfter = step.stop_after;
    try {
      for await (const part of parts) {
        const event = { event: part.event, data: part.data };
        if (part.id !== undefined && part.id !== null) event.id = part.id;
        events.push(event);
        if (stopAfter !== undefined && stopAfter !== null && events.length >= stopAfter) break;
      }
    } finally {
      own.abort();
    }
    return [{ events, run: created[0] ?? null }, { result: events }];
  }

  /** Polls a run until its status is one of `statuses`. */
  async waitStatus(args, step) {
    // The run named, or (without run_id) the thread's newest.
    const deadline = Date.now() + (step.timeout ?? 30) * 1000;
    for (;;) {
      // Without run_id: the thread's newest run.
      let run;
      if (args.run_id !== undefined) {
        run = await this.client.runs.get(args.thread_id, args.run_id, { signal: this.signal });
      } else {
        const runs = await this.client.runs.list(args.thread_id, { signal: this.signal });
        run = runs[0] ?? { status: "none", run_id: null };
      }
      if (step.statuses.includes(run.status)) return [run, { result: run.status }];
      if (Date.now() > deadline) throw new Failed(`run ${run.run_id} stayed ${run.status}, not ${JSON.stringify(step.statuses)}`);
      await sleep(50, this.signal);
    }
  }
}

/** JSON with sorted keys, as drive.py writes it. */
function sorted(value) {
  if (Array.isArray(value)) return value.map(sorted);
  if (value !== null && typeof value === "object") {
    const out = {};
    for (const k of Object.keys(value).sort()) out[k] = sorted(value[k]);
    return out;
  }
  return value;
}

async function runScenario(client, spec) {
  const controller = new AbortController();
  const seconds = spec.timeout ?? 60;
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const e = new Error(`the scenario took longer than ${seconds} s`);
      e.name = "TimeoutError";
      reject(e);
    }, seconds * 1000);
  });
  try {
    return await Promise.race([new Scenario(client, spec, controller.signal).run(), timeout]);
  } catch (e) {
    return { failed: `${e?.name ?? "Error"}: ${e?.message ?? e}`, trace: e?.stack ?? String(e) };
  } finally {
    clearTimeout(timer);
    controller.abort(); // whatever is still running (a failed scenario's background steps)
  }
}

async function main() {
  const [url, scenariosFile, outFile, ...only] = process.argv.slice(2);
  if (!outFile) {
    console.error("usage: node drive.mjs URL SCENARIOS.json OUT.json [SCENARIO ...]");
    process.exit(2);
  }
  const scenarios = JSON.parse(readFileSync(scenariosFile, "utf8"));
  // As agent-chat-ui makes it: the URL and no key (null: not even one from the environment).
  const client = new Client({ apiUrl: url, apiKey: null });
  const out = {};
  for (const spec of scenarios) {
    if (only.length && !only.includes(spec.name)) continue;
    if (!(spec.sdks ?? ["python", "js"]).includes("js")) continue;
    out[spec.name] = await runScenario(client, spec);
  }
  writeFileSync(outFile, JSON.stringify(sorted(out), null, 1));
}

await main();
