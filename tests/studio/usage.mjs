// Tokens and cost per node and per model, input and output apart, summed per run and per
// thread, from the server's trace of a run whose scripted model reports usage.
import { test, assert, fill, runEnds, openGraph } from "./lib.mjs";

test("usage", async ({ page, shot }) => {
  await openGraph(page, "priced");
  await fill(page, "input-form", "question", "What is six times seven?");
  await page.getByTestId("run-submit").click();
  assert.equal(await runEnds(page), "success");
  await page.getByTestId("tab-trace").click();
  const panel = page.getByTestId("trace-panel");
  await panel.waitFor();
  await page.locator("[data-testid=trace-unavailable], [data-testid=usage-by-node]").first().waitFor();
  if (await page.getByTestId("trace-unavailable").count()) {
    await shot("unavailable");
    return { skip: "GET /threads/{id}/runs/{id}/trace answers 404: this server keeps no traces yet" };
  }
  const row = async (table, key) =>
    page.locator(`[data-testid=${table}] tr[data-key="${key}"]`).evaluate((tr) => Object.fromEntries([...tr.querySelectorAll("td")].map((td) => [td.dataset.col, td.textContent])));
  // 1200 in, 300 out at $2 and $8 a million tokens; 400 in, 100 out.
  assert.deepEqual(await row("usage-by-node", "priced_answer"), { input: "1200", output: "300", cost: "$0.004800" });
  assert.deepEqual(await row("usage-by-node", "priced_check"), { input: "400", output: "100", cost: "$0.001600" });
  assert.deepEqual(await row("usage-by-model", "priced-model"), { input: "1600", output: "400", cost: "$0.006400" });
  assert.match(await page.getByTestId("run-total").innerText(), /1600.*in.*400.*out.*\$0\.006400/s);
  assert.match(await page.getByTestId("thread-total").innerText(), /1600.*in.*400.*out.*\$0\.006400/s);
  assert.ok((await page.locator("[data-testid=span][data-kind=model]").count()) >= 2, "the model calls are in the waterfall");
  await shot();
});
