// The first view of a graph asks for what it draws without waiting for the bundle: the
// assistants and the graph named in the address are asked for by the page's inline script,
// before the bundle has run, each once; what only the other panels need is asked for after
// the graph has arrived. (How long it takes is measured by measure.mjs, not checked here.)
import { test, assert, base } from "./lib.mjs";

test("firstpaint", async ({ page, shot }) => {
  await page.goto(`${base}/#/graph/fifty`);
  await page.waitForFunction(() => window.__studio && window.__studio.graphPaint, null, { timeout: 30_000 });
  // The panels' own requests, made after the graph is drawn.
  await page.waitForFunction(() => {
    const paths = performance.getEntriesByType("resource").map((e) => new URL(e.name).pathname);
    return ["/threads/search", "/runner/workflows"].every((p) => paths.includes(p)) && paths.some((p) => /^\/assistants\/[^/]+\/schemas$/.test(p));
  });
  const seen = await page.evaluate(() =>
    performance.getEntriesByType("resource").map((e) => ({ path: new URL(e.name).pathname, start: e.startTime, end: e.responseEnd, kind: e.initiatorType })),
  );
  const started = await page.evaluate(() => window.__studio.started);
  const of = (path) => seen.filter((e) => e.path === path);
  for (const path of ["/assistants/search", "/assistants/fifty/graph"]) {
    assert.equal(of(path).length, 1, `${path} asked for once: ${JSON.stringify(seen)}`);
    assert.ok(of(path)[0].start < started, `${path} was asked for before the bundle ran (${of(path)[0].start} ms, the bundle at ${started} ms)`);
  }
  const graphAt = of("/assistants/fifty/graph")[0].end;
  for (const path of ["/threads/search", "/runner/workflows"]) {
    // (The schemas are asked for beside the graph and only shown after it.)
    assert.ok(of(path).length >= 1, `${path} asked for: ${JSON.stringify(seen)}`);
    assert.ok(of(path)[0].start >= graphAt, `${path} waited for the graph (${of(path)[0].start} ms, the graph at ${graphAt} ms)`);
  }
  assert.equal(await page.locator("[data-testid=graph-node]").count(), 52);
  await shot();
});
