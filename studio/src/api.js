// The page's one door to the server: LangGraph's Server API on the page's own origin, plus
// runner's additions (graph kinds, trace, usage, workflows), which may answer 404 on a server
// without them: those calls return `null` ("not available") and the page goes on.
//
// With `runner serve --api-key-env`, every request carries `x-api-key`; the key is asked for
// once per browser session (sessionStorage) and again whenever the server answers 401.

const KEY = "runner-studio-api-key";

let askForKey = null;

/** Sets the function that asks the person for the API key: `(reason) => Promise<string|null>`. */
export function onKeyNeeded(fn) {
  askForKey = fn;
}

export function apiKey() {
  try {
    return sessionStorage.getItem(KEY);
  } catch {
    return null;
  }
}

export function setApiKey(key) {
  try {
    if (key) sessionStorage.setItem(KEY, key);
    else sessionStorage.removeItem(KEY);
  } catch {
    // Storage refused (private mode): the key lives as long as the page.
  }
  memoryKey = key;
}

let memoryKey = null;

function headers(extra) {
  const h = { ...extra };
  const key = apiKey() || memoryKey;
  if (key) h["x-api-key"] = key;
  return h;
}

export class ApiError extends Error {
  constructor(status, detail, path) {
    super(detail || `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
    this.path = path;
  }
}

async function detailOf(res) {
  try {
    const body = await res.json();
    return typeof body?.detail === "string" ? body.detail : JSON.stringify(body);
  } catch {
    return res.statusText;
  }
}

// A 401 asks for the key (once for every request waiting on it) and tries again.
let asking = null;
async function unauthorized(detail) {
  if (!askForKey) return false;
  if (!asking) {
    asking = askForKey(detail).finally(() => {
      asking = null;
    });
  }
  const key = await asking;
  if (!key) return false;
  setApiKey(key);
  return true;
}

async function send(method, path, body, extraHeaders, signal) {
  for (;;) {
    const init = { method, headers: headers(extraHeaders), signal };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["content-type"] = "application/json";
    }
    const res = await fetch(path, init);
    if (res.status === 401 && (await unauthorized(await detailOf(res)))) continue;
    return res;
  }
}

/**
 * A JSON request. `optional`: a 404 (or 405) is `null`, for runner's additions that an older
 * server lacks.
 */
export async function api(method, path, body, { optional = false, signal } = {}) {
  const res = await send(method, path, body, {}, signal);
  if (optional && (res.status === 404 || res.status === 405)) return null;
  if (!res.ok) throw new ApiError(res.status, await detailOf(res), path);
  if (res.status === 204) return null;
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

export const get = (path, opts) => api("GET", path, undefined, opts);
export const post = (path, body, opts) => api("POST", path, body ?? {}, opts);

/**
 * A run streamed as server-sent events (`POST …/runs/stream`): `onEvent(name, data, id)` for
 * each event as it arrives. Resolves with the run id (from `metadata`) once the server closes
 * the stream; rejects on an HTTP error before the stream starts.
 */
export async function stream(path, body, onEvent, signal) {
  const res = await send("POST", path, body, { accept: "text/event-stream" }, signal);
  if (!res.ok) throw new ApiError(res.status, await detailOf(res), path);
  await readEvents(res.body, onEvent);
}

/** Splits an SSE body into events (CRLF or LF line ends; `data:` lines joined). */
export async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    // One pass over what arrived: a read may hold hundreds of events, and cutting the buffer
    // after each would copy it as many times.
    const blank = /\r?\n\r?\n/g;
    let start = 0;
    for (let m = blank.exec(buffer); m; m = blank.exec(buffer)) {
      dispatch(buffer.slice(start, m.index), onEvent);
      start = m.index + m[0].length;
    }
    buffer = buffer.slice(start);
  }
  if (buffer.trim()) dispatch(buffer, onEvent);
}

function dispatch(frame, onEvent) {
  let event = "message";
  let id = null;
  const data = [];
  for (const line of frame.split(/\r?\n/)) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
    else if (field === "id") id = value;
  }
  if (!data.length) return;
  const text = data.join("\n");
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = text;
  }
  onEvent(event, parsed, id);
}

export const enc = encodeURIComponent;
