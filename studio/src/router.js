// Where the page is, in its address's hash: `#/graph/<graph id>[/thread/<thread id>]`,
// `#/threads`, `#/problems`. A hash keeps every view one static page the server serves as is.
import { useState, useEffect } from "preact/hooks";

const enc = encodeURIComponent;

export function parseHash() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "graph" && parts[1]) return { view: "graph", graph: parts[1], thread: parts[2] === "thread" ? parts[3] : null };
  if (parts[0] === "threads") return { view: "threads" };
  if (parts[0] === "problems") return { view: "problems" };
  return { view: "graph", graph: null, thread: null };
}

export function go(route) {
  let h = "#/";
  if (route.view === "threads") h = "#/threads";
  else if (route.view === "problems") h = "#/problems";
  else if (route.graph) h = `#/graph/${enc(route.graph)}${route.thread ? `/thread/${enc(route.thread)}` : ""}`;
  if (location.hash !== h) location.hash = h;
}

export function useRoute() {
  const [route, setRoute] = useState(parseHash);
  useEffect(() => {
    const on = () => setRoute(parseHash());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return route;
}
