// Measurements, not timed checks (README reports them): the first paint of a 50-node graph,
// and how the page keeps up with a run streaming about 200 events a second (`paced`) and with
// one streaming as fast as the engine steps (`burst`) — events a second, long tasks (over
// 50 ms, the browser's own count), frames and the longest gap between two. Prints one
// `measure: {json}` line.
import { test, assert, fill, runEnds, openGraph, base } from "./lib.mjs";

test("measure", async ({ page, shot }) => {
  const paints = [];
  for (let i = 0; i < 9; i++) {
    await page.goto("about:blank");
    await page.goto(`${base}/#/graph/fifty`);
    await page.waitForFunction(() => window.__studio && window.__studio.graphPaint, null, { timeout: 30_000 });
    paints.push(
      await page.evaluate(() => {
        // Where the time to the first paint went: when each request the first view needs was
        // sent and answered, and when the bundle started, all from the navigation's start.
        const at = {};
        const nav = performance.getEntriesByType("navigation")[0];
        if (nav) at.html = [nav.requestStart, nav.responseEnd];
        for (const e of performance.getEntriesByType("resource")) {
          const u = new URL(e.name);
          const name = u.pathname.endsWith("studio.js") ? "js" : u.pathname.endsWith("studio.css") ? "css" : u.pathname === "/assistants/search" ? "assistants" : /\/graph$/.test(u.pathname) ? "graph" : null;
          if (name && !at[name]) at[name] = [e.startTime, e.responseEnd];
        }
        at.bundle_started = window.__studio.started;
        return { ...window.__studio.graphPaint, at };
      }),
    );
  }
  assert.equal(paints[0].nodes, 52, "fifty nodes and START and END");
  assert.equal(await page.locator("[data-testid=graph-node]").count(), 52);
  await shot("fifty");
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

  const paced = await watch(page, "paced", 150);
  await shot("paced");
  const burst = await watch(page, "burst", 600);
  await shot("burst");
  console.log(
    "measure: " +
      JSON.stringify({
        graph50: {
          layout_ms_median: +median(paints.map((p) => p.layoutMs)).toFixed(1),
          arrival_to_paint_ms_median: +median(paints.map((p) => p.sinceArrivalMs)).toFixed(1),
          navigation_to_paint_ms_median: +median(paints.map((p) => p.sinceNavigationMs)).toFixed(1),
          navigation_to_paint_ms: paints.map((p) => Math.round(p.sinceNavigationMs)),
          runs: paints.length,
          // The median run's requests: [sent, answered] ms after the navigation started.
          requests: paints.map((p) => p).sort((a, b) => a.sinceNavigationMs - b.sinceNavigationMs)[Math.floor(paints.length / 2)].at,
        },
        paced,
        burst,
      }),
  );
});

/**
 * Runs `graph` for `ticks` loops from the page, watching the page while it streams: events a
 * second, long tasks (the browser's own count of tasks over 50 ms), the longest gap between
 * two frames, and how long a click on the event filter takes to be answered.
 */
async function watch(page, graph, ticks) {
  await openGraph(page, graph);
  await fill(page, "input-form", "ticks", ticks);
  await page.evaluate(() => {
    const m = (window.__measure = { longTasks: 0, longTaskMs: 0, maxFrameGap: 0, frames: 0 });
    m.observer = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        m.longTasks++;
        m.longTaskMs += e.duration;
      }
    });
    m.observer.observe({ type: "longtask", buffered: false });
    let last = performance.now();
    const frame = (t) => {
      m.maxFrameGap = Math.max(m.maxFrameGap, t - last);
      last = t;
      m.frames++;
      if (!m.stop) requestAnimationFrame(frame);
    };
    requestAnimationFrame(frame);
  });
  const started = Date.now();
  await page.getByTestId("run-submit").click();
  // While it streams, the page still answers: a click on a filter shows only custom events.
  await page.locator("[data-testid=live-run][data-status=running]").waitFor();
  const clickedAt = Date.now();
  await page.getByRole("radio", { name: "custom" }).click();
  const clickMs = Date.now() - clickedAt;
  assert.equal(await runEnds(page, 120_000), "success");
  const wall = (Date.now() - started) / 1000;
  const m = await page.evaluate(() => {
    window.__measure.stop = true;
    window.__measure.observer.disconnect();
    const { observer, ...numbers } = window.__measure;
    return numbers;
  });
  const text = await page.getByTestId("live-run").innerText();
  const events = Number((text.match(/(\d+) events/) || [])[1]);
  const custom = Number((text.match(/(\d+) custom/) || [])[1]);
  assert.equal(custom, ticks, text.slice(0, 300));
  return {
    events,
    seconds: +wall.toFixed(2),
    events_per_s: Math.round(events / wall),
    long_tasks: m.longTasks,
    long_task_ms: Math.round(m.longTaskMs),
    max_frame_gap_ms: Math.round(m.maxFrameGap),
    fps: Math.round(m.frames / wall),
    click_during_stream_ms: clickMs,
  };
}
