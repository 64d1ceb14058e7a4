// The workflow files the server does not serve, each problem at file:line:col with its code
// and message, counted in the header (runner's `GET /runner/workflows`).
import { test, assert, base } from "./lib.mjs";

test("problems", async ({ page, shot }) => {
  await page.goto(`${base}/#/problems`);
  await page.locator("[data-testid=problems], [data-testid=problems-unavailable]").first().waitFor();
  if (await page.getByTestId("problems-unavailable").count()) {
    await shot("unavailable");
    return { skip: "GET /runner/workflows answers 404: this server does not list its workflow files yet" };
  }
  const broken = page.locator("[data-testid=rejected][data-file$='broken.yaml']");
  await broken.waitFor();
  const diag = await broken.getByTestId("diagnostic").first().innerText();
  assert.match(diag, /broken\.yaml:3:\d+/, diag);
  assert.match(diag, /nope/, diag);
  assert.equal(await page.getByTestId("problem-count").innerText(), "1");
  await shot();
});
