// A task span of a run's trace shows the state its task read — asked for from the thread's
// checkpoint (`GET /threads/{id}/state/{checkpoint_id}`) only when the span is opened, and
// once — and what its writes changed.
import { test, assert, fill, runEnds, openGraph } from "./lib.mjs";

test("taskinput", async ({ page, shot }) => {
  await openGraph(page, "story");
  await fill(page, "input-form", "topic", "a lighthouse");
  await page.getByTestId("run-submit").click();
  assert.equal(await runEnds(page), "success");
  const asked = [];
  page.on("request", (r) => {
    if (/\/threads\/[^/]+\/state\/[^/]+$/.test(new URL(r.url()).pathname)) asked.push(r.url());
  });
  await page.getByTestId("tab-trace").click();
  await page.locator("[data-testid=trace-unavailable], [data-testid=waterfall]").first().waitFor();
  if (await page.getByTestId("trace-unavailable").count()) {
    return { skip: "GET /threads/{id}/runs/{id}/trace answers 404: this server keeps no traces yet" };
  }
  const task = page.locator("[data-testid=span][data-kind=task][data-node=write_story]");
  await task.waitFor();
  assert.deepEqual(asked, [], "no state is read before a span is opened");
  await task.click();
  const input = page.getByTestId("span-input");
  // write_story read the outline plan_story wrote, and an empty draft.
  await input.locator("[data-testid=span-input-state]", { hasText: "A lighthouse keeper finds a map." }).waitFor();
  const diff = await input.getByTestId("span-diff").innerText();
  assert.match(diff, /\/draft/, diff);
  assert.match(diff, /Once, a lighthouse keeper found a map and followed it\./, diff);
  assert.doesNotMatch(diff, /outline/, "only the keys it wrote");
  const first = asked.length;
  assert.ok(first >= 1 && first <= 2, `the input and its step's checkpoint: ${asked}`);
  await shot();
  // Closed and opened again: the states are not asked for again.
  await task.click();
  await task.click();
  await input.locator("[data-testid=span-input-state]", { hasText: "A lighthouse keeper finds a map." }).waitFor();
  assert.equal(asked.length, first, "read once");
  // plan_story read the state after the input: no outline yet.
  await page.locator("[data-testid=span][data-kind=task][data-node=plan_story]").click();
  const planInput = page.locator("[data-testid=span-input]").first();
  await planInput.locator("[data-testid=span-input-state]").waitFor();
  assert.doesNotMatch(await planInput.getByTestId("span-input-state").innerText(), /lighthouse keeper/);
  assert.match(await planInput.getByTestId("span-diff").innerText(), /\/outline/);
});
