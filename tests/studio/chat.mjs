// The RAG seed's conversation in the chat view: two turns on one thread, each reply streamed
// in and then kept in the thread's messages.
import { test, assert, openGraph } from "./lib.mjs";

test("chat", async ({ page, shot }) => {
  await openGraph(page, "rag");
  await page.getByTestId("tab-chat").click();
  const answer = "Hello! How can I help with your documents today?";
  for (const [turn, question] of ["Hi there!", "Thanks, and what can you do?"].entries()) {
    await page.getByTestId("chat-input").fill(question);
    await page.getByTestId("chat-send").click();
    await page.waitForFunction((n) => document.querySelectorAll("[data-testid=chat-message]").length === n && !document.querySelector("[data-testid=chat-streaming]"), 2 * turn + 2, { timeout: 60_000 });
    const messages = await page.locator("[data-testid=chat-message]").evaluateAll((ms) => ms.map((m) => [m.dataset.type, m.querySelector(".content").textContent]));
    assert.deepEqual(
      messages,
      Array.from({ length: turn + 1 }, (_, i) => [
        ["human", ["Hi there!", "Thanks, and what can you do?"][i]],
        ["ai", answer],
      ]).flat(),
      JSON.stringify(messages),
    );
  }
  // Both turns went to one thread, whose answer streamed token by token.
  assert.match(page.url(), /#\/graph\/rag\/thread\/[0-9a-f-]+$/);
  await page.getByTestId("tab-run").click();
  assert.match(await page.locator("[data-testid=node-tokens][data-node=generator]").innerText(), /How can I help/);
  await page.getByTestId("tab-chat").click();
  await shot();
});
