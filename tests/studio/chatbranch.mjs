// Branches in the chat view: a question edited starts a second branch from the checkpoint
// before it; the message where they part shows `< 2/2 >`, switching shows the other branch's
// conversation, and a message sent there goes on from that branch.
import { test, assert, openGraph } from "./lib.mjs";

const answer = "Hello! How can I help with your documents today?";

/** The conversation shown: `[type, text]` per message. */
const shown = (page) => page.locator("[data-testid=chat-message]").evaluateAll((ms) => ms.map((m) => [m.dataset.type, m.querySelector(".content").textContent]));

/** Waits for `n` messages and no reply streaming. */
const settled = (page, n) =>
  page.waitForFunction((n) => document.querySelectorAll("[data-testid=chat-message]").length === n && !document.querySelector("[data-testid=chat-streaming]"), n, { timeout: 60_000 });

async function send(page, text, n) {
  await page.getByTestId("chat-input").fill(text);
  await page.getByTestId("chat-send").click();
  await settled(page, n);
  await page.locator("[data-testid=chat-send]").waitFor();
  await page.locator("[data-testid=chat-edit]").first().waitFor();
}

test("chatbranch", async ({ page, shot }) => {
  await openGraph(page, "rag");
  await page.getByTestId("tab-chat").click();
  await send(page, "Hi there!", 2);
  await send(page, "Thanks, and what can you do?", 4);
  assert.equal(await page.getByTestId("chat-branches").count(), 0, "one branch: no switcher");

  // The second question edited: a new branch from the checkpoint before it.
  await page.locator("[data-testid=chat-message][data-type=human]").nth(1).getByTestId("chat-edit").click();
  await page.getByTestId("chat-edit-text").fill("Thanks, and who are you?");
  await page.getByTestId("chat-edit-send").click();
  await page.locator("[data-testid=chat-message]", { hasText: "Thanks, and who are you?" }).waitFor();
  await settled(page, 4);
  const second = page.locator("[data-testid=chat-message]").nth(2);
  await second.getByTestId("chat-branches").waitFor();
  assert.equal(await page.getByTestId("chat-branches").count(), 1, "the switcher is on the message where the branches part");
  assert.equal(await second.getByTestId("chat-branch-at").innerText(), "2/2");
  assert.deepEqual(await shown(page), [["human", "Hi there!"], ["ai", answer], ["human", "Thanks, and who are you?"], ["ai", answer]]);

  // Back to the first branch: its conversation.
  await second.getByTestId("chat-branch-prev").click();
  await page.locator("[data-testid=chat-message]", { hasText: "Thanks, and what can you do?" }).waitFor();
  assert.equal(await second.getByTestId("chat-branch-at").innerText(), "1/2");
  assert.deepEqual(await shown(page), [["human", "Hi there!"], ["ai", answer], ["human", "Thanks, and what can you do?"], ["ai", answer]]);
  await shot();

  // The chat goes on from the branch shown.
  await send(page, "Hello again!", 6);
  assert.deepEqual(await shown(page), [
    ["human", "Hi there!"],
    ["ai", answer],
    ["human", "Thanks, and what can you do?"],
    ["ai", answer],
    ["human", "Hello again!"],
    ["ai", answer],
  ]);
  assert.equal(await page.locator("[data-testid=chat-message]").nth(2).getByTestId("chat-branch-at").innerText(), "1/2");
  // And forward again to the edited branch, which kept its two turns.
  await page.locator("[data-testid=chat-message]").nth(2).getByTestId("chat-branch-next").click();
  await page.locator("[data-testid=chat-message]", { hasText: "Thanks, and who are you?" }).waitFor();
  assert.equal((await shown(page)).length, 4);
});
