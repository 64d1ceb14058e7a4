// A thread forked at an older checkpoint with an edited value: the new branch runs from there
// on the edited state, and the old checkpoints stay as another branch.
import { test, assert, fill, runEnds, openGraph } from "./lib.mjs";

test("fork", async ({ page, shot }) => {
  await openGraph(page, "story");
  await fill(page, "input-form", "topic", "a lighthouse");
  await page.getByTestId("run-submit").click();
  assert.equal(await runEnds(page), "success");
  await page.getByTestId("tab-state").click();
  // The checkpoint before write_story ran: it is the one whose next is write_story.
  const before = page.locator("[data-testid=checkpoint]", { hasText: "→ write_story" });
  await before.click();
  await page.locator("[data-testid=checkpoint-detail] [data-testid=state-tree]", { hasText: "A lighthouse keeper finds a map." }).waitFor();
  await page.getByTestId("fork-here").click();
  await page.locator("[data-testid=fork-form] [data-testid=field-outline]").fill("A sea serpent guides lost ships.");
  await page.locator("[data-testid=fork-changes]", { hasText: "changed: outline" }).waitFor();
  await page.getByTestId("fork-run").click();
  assert.equal(await runEnds(page), "success");
  // Only write_story ran on the new branch, on the edited outline.
  assert.equal(await page.locator("[data-testid=graph-node][data-node=write_story]").getAttribute("data-state"), "done");
  assert.equal(await page.locator("[data-testid=graph-node][data-node=plan_story]").getAttribute("data-state"), "");
  await page.getByTestId("tab-state").click();
  const head = page.locator("[data-testid=checkpoint-detail]");
  await head.locator("[data-testid=state-tree]", { hasText: "The sea serpent sang the ships home." }).waitFor();
  assert.match(await head.getByTestId("state-diff").innerText(), /draft/);
  assert.ok((await page.locator("[data-testid=checkpoint]", { hasText: "other branch" }).count()) >= 1, "the first draft stays as another branch");
  await shot();
});
