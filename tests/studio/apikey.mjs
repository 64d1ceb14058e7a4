// With `runner serve --api-key-env`, the page asks for the key; a wrong key is asked again
// (the server answers 401); the right one is sent as `x-api-key` on every request and kept for
// the browser session, so a reload does not ask again (and the page's first requests, made
// before its bundle runs, carry it).
import { test, assert, base } from "./lib.mjs";

test("apikey", async ({ page, shot }) => {
  const keys = [];
  page.on("request", (r) => {
    if (new URL(r.url()).pathname.startsWith("/assistants")) keys.push(r.headers()["x-api-key"] || null);
  });
  await page.goto(`${base}/#/graph/story`);
  await page.getByTestId("key-dialog").waitFor();
  await shot("asked");
  await page.getByTestId("key-input").fill("wrong");
  await page.getByTestId("key-submit").click();
  // 401 again: asked again.
  await page.getByTestId("key-dialog").waitFor();
  await page.waitForFunction(() => !document.querySelector("[data-testid=key-input]").value);
  await page.getByTestId("key-input").fill("sekrit");
  await page.getByTestId("key-submit").click();
  await page.locator("[data-testid=graph-node][data-node=plan_story]").waitFor();
  assert.equal(await page.getByTestId("key-dialog").count(), 0);
  // Keyless (the page's first requests, made before the bundle runs, and the page's own), then
  // the wrong key once, then the right one on everything.
  const keyless = keys.indexOf("wrong");
  assert.ok(keyless >= 1 && keys.slice(0, keyless).every((k) => k === null), JSON.stringify(keys));
  assert.equal(keys[keyless + 1], "sekrit", JSON.stringify(keys));
  assert.ok(keys.slice(keyless + 1).every((k) => k === "sekrit"), JSON.stringify(keys));
  // Kept for the session: a reload asks nothing, and its first requests carry the key.
  keys.length = 0;
  await page.reload();
  await page.locator("[data-testid=graph-node][data-node=plan_story]").waitFor();
  assert.equal(await page.getByTestId("key-dialog").count(), 0);
  assert.ok(keys.length >= 2 && keys.every((k) => k === "sekrit"), JSON.stringify(keys));
  await shot();
});
