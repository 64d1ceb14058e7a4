// What every Studio browser test shares: Debian's Chromium, headless, driven by playwright-core
// (pinned in package-lock.json beside this file; it downloads no browser), on a fresh profile,
// with the flags this machine's closed network needs; a screenshot per test; the page's own
// errors (uncaught exceptions) failing the test.
//
// A script is run by tests/studio.rs as `node SCRIPT BASE_URL SHOT_DIR` from the `npm ci`
// install; it prints `studio: <name> passed` (or `studio: <name> skipped: why`) and exits 0,
// or prints what failed and exits 1.
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import assert from "node:assert/strict";

export { assert };

export const base = process.argv[2];
export const shots = process.argv[3] || "studio-shots";

const ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** A browser on a fresh profile and its one page. */
export async function open(name, { viewport = { width: 1440, height: 900 } } = {}) {
  const profile = mkdtempSync(path.join(tmpdir(), "studio-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    chromiumSandbox: false,
    args: ARGS,
    viewport,
    timeout: 60_000,
  });
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(30_000);
  const errors = [];
  page.on("pageerror", (e) => errors.push(`uncaught in the page: ${e.stack || e.message}`));
  page.on("console", (m) => {
    // A 404 of an optional endpoint is logged by Chromium as a failed load: not the page's fault.
    if (m.type() === "error" && !/Failed to load resource/.test(m.text())) errors.push(`console error: ${m.text()}`);
  });
  return {
    page,
    errors,
    /** Saves `<shots>/<name>[-label].png`. */
    async shot(label) {
      mkdirSync(shots, { recursive: true });
      await page.screenshot({ path: path.join(shots, `${name}${label ? "-" + label : ""}.png`) });
    },
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** Runs `body(browser)` as the test `name`: passed, skipped (`body` returns `{skip: why}`), or failed. */
export async function test(name, body) {
  let browser;
  try {
    browser = await open(name);
    const out = await body(browser);
    assert.deepEqual(browser.errors, [], "the page reported errors");
    if (out && out.skip) console.log(`studio: ${name} skipped: ${out.skip}`);
    else console.log(`studio: ${name} passed`);
    await browser.close();
    process.exit(0);
  } catch (e) {
    console.error(`studio: ${name} FAILED: ${e.stack || e}`);
    if (browser) {
      try {
        await browser.shot("failure");
        console.error("page text at failure:\n" + (await browser.page.locator("body").innerText()).slice(0, 4000));
      } catch {
        // The browser is gone: nothing more to show.
      }
      await browser.close().catch(() => {});
    }
    process.exit(1);
  }
}

/** Fills the input form's field `name` (a text field or a number). */
export async function fill(page, form, name, value) {
  await page.locator(`[data-testid=${form}] [data-testid=field-${name}]`).fill(String(value));
}

/** Waits for the live run to end; its status. */
export async function runEnds(page, timeout = 60_000) {
  const live = page.locator("[data-testid=live-run]");
  await live.waitFor();
  await page.waitForFunction(
    () => {
      const s = document.querySelector("[data-testid=live-run]")?.dataset.status;
      return s && s !== "running" && s !== "starting";
    },
    null,
    { timeout },
  );
  return live.getAttribute("data-status");
}

/** Opens a workflow's graph and waits for it to be drawn. */
export async function openGraph(page, graph) {
  await page.goto(`${base}/#/graph/${encodeURIComponent(graph)}`);
  await page.locator("[data-testid=graph-node]").first().waitFor();
  await page.locator("[data-testid=run-submit]:not([disabled])").waitFor();
}
