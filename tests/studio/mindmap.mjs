// The page loads, draws the mindmap seed's graph, starts a run from the input form, and shows
// the run's `node_added` custom events as they arrive, the nodes lit as they ran.
import { test, assert, fill, runEnds, openGraph } from "./lib.mjs";

test("mindmap", async ({ page, shot }) => {
  await openGraph(page, "mindmap");
  // Drawn by kind: the model calls, the emits, the expansion subgraph.
  const kinds = await page.locator("[data-testid=graph-node]").evaluateAll((ns) => Object.fromEntries(ns.map((n) => [n.dataset.node, n.dataset.kind])));
  assert.equal(kinds.analyze_document, "llm", JSON.stringify(kinds));
  assert.equal(kinds.announce_root, "emit", JSON.stringify(kinds));
  assert.ok(await page.locator("[data-testid=graph-edge][data-kind=route]").count() > 0, "routes are drawn dashed");
  await fill(page, "input-form", "document_title", "Heat pumps");
  await fill(page, "input-form", "document_content", "Heat pumps move heat from outside to inside.");
  await fill(page, "input-form", "max_depth", 2);
  await page.getByTestId("run-submit").click();
  // The first node_added arrives while the run still goes on or just after: the list grows.
  await page.locator("[data-testid=log-custom] [data-event=node_added]").first().waitFor();
  const status = await runEnds(page);
  assert.equal(status, "success");
  const added = await page.locator("[data-testid=log-custom] [data-event=node_added]").allInnerTexts();
  const ids = added.map((t) => (t.match(/"node_id":"([^"]+)"/) || [])[1]).sort();
  assert.deepEqual(ids, ["root", "root.1", "root.1.1", "root.2", "root.2.1"], added.join("\n"));
  assert.equal(await page.locator("[data-testid=log-custom] [data-event=mindmap_complete]").count(), 1);
  // The nodes that ran are marked done on the graph.
  for (const n of ["analyze_document", "generate_root", "announce_root"]) {
    assert.equal(await page.locator(`[data-testid=graph-node][data-node=${n}]`).getAttribute("data-state"), "done", n);
  }
  // The thread exists and is idle; its id is in the address.
  assert.match(page.url(), /#\/graph\/mindmap\/thread\/[0-9a-f-]+$/);
  await page.locator("[data-testid=thread-status]", { hasText: "idle" }).waitFor();
  await shot();
});
