// A run that fails at a node: the node is marked failed with its error; its input edited, the
// node runs again from the checkpoint before it and the run succeeds.
import { test, assert, fill, runEnds, openGraph } from "./lib.mjs";

test("rerun", async ({ page, shot }) => {
  await openGraph(page, "flaky");
  await fill(page, "input-form", "topic", "volcanoes");
  await page.getByTestId("run-submit").click();
  assert.equal(await runEnds(page), "error");
  await page.getByTestId("run-error").waitFor();
  const node = page.locator("[data-testid=graph-node][data-node=summarize]");
  assert.equal(await node.getAttribute("data-state"), "error");
  await page.locator("[data-testid=thread-status]", { hasText: "error" }).waitFor();
  await node.click();
  await page.locator("[data-testid=node-inspector] [data-testid=node-error]", { hasText: "refuses" }).waitFor();
  await shot("failed");
  await page.getByTestId("node-rerun").click();
  await page.getByTestId("fork-editor").waitFor();
  await page.locator("[data-testid=fork-form] [data-testid=field-topic]").fill("tides");
  await page.getByTestId("fork-run").click();
  assert.equal(await runEnds(page), "success");
  assert.equal(await node.getAttribute("data-state"), "done");
  await page.locator("[data-testid=thread-status]", { hasText: "idle" }).waitFor();
  await page.getByTestId("tab-state").click();
  await page.locator("[data-testid=checkpoint-detail] [data-testid=state-tree]", { hasText: "Tides rise and fall with the moon." }).waitFor();
  await shot();
});
