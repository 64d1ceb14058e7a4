import { render } from "preact";
import { App } from "./app.jsx";
import "./style.css";

// When the bundle ran, for the page's own measurements (tests/studio/measure.mjs).
(window.__studio = window.__studio || {}).started = performance.now();
render(<App />, document.getElementById("app"));
