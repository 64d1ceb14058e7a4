// The deep-research seed stops at its plan gate; the page shows the gate's message and payload
// with the answers the gate allows, and Accept resumes the run to its next gate.
import { test, assert, fill, runEnds, openGraph } from "./lib.mjs";

test("gate", async ({ page, shot }) => {
  await openGraph(page, "deep-research");
  assert.ok(await page.locator("[data-testid=graph-node][data-node=hitl_plan_gate]").count(), "the gate is drawn");
  await fill(page, "input-form", "query", "How are heat pumps sized?");
  await fill(page, "context-form", "user_id", "alice");
  await page.getByTestId("run-submit").click();
  assert.equal(await runEnds(page), "interrupted");
  const gate = page.locator("[data-testid=interrupt][data-node=hitl_plan_gate]");
  await gate.waitFor();
  assert.match(await gate.innerText(), /Research plan v1/);
  assert.match(await page.getByTestId("gate-payload").innerText(), /Heat pump sizing/);
  // The gate allows all four answers.
  for (const a of ["accept", "edit", "respond", "ignore"]) assert.equal(await page.getByTestId(`gate-${a}`).count(), 1, a);
  assert.equal(await page.locator("[data-testid=graph-node][data-node=hitl_plan_gate]").getAttribute("data-state"), "interrupted");
  await shot("plan-gate");
  await page.getByTestId("gate-accept").click();
  assert.equal(await runEnds(page), "interrupted");
  await page.locator("[data-testid=interrupt][data-node=hitl_discovery_gate]").waitFor();
  assert.equal(await page.locator("[data-testid=interrupt][data-node=hitl_plan_gate]").count(), 0);
  await page.locator("[data-testid=thread-status]", { hasText: "interrupted" }).waitFor();
  await shot();
});
