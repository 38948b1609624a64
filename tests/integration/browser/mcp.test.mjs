// The web UI with an MCP server: `agenthost serve` with [mcp.ev] = the official server-everything (stdio),
// in Debian's Chromium driven by playwright-core. The Tools panel lists the session's tools by server with
// their policies; a long MCP tool, approved from the UI, shows the server's progress on its call until the
// result arrives. The page waits for API-CONNECTION-LOOP's ready state before it acts.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { chromiumPath, openSessionPage, closeSessionPage } from "./lib.mjs";
import { everythingBin } from "../mcp/servers.mjs";

const TEST = { timeout: 90000 };
const CHROMIUM = chromiumPath();
const skip = CHROMIUM ? false : "no Chromium (apt-get install chromium, or set AH_TEST_CHROMIUM)";
const ctx = { dirs: [], errors: [] };

before(async () => {
  if (skip) return;
  await openSessionPage(ctx, { prefix: "ah-browser-mcp", timeout: 30000,
    conf: `[mcp.ev]\ncommand = ${process.execPath}\nargs = ${everythingBin} stdio\n` });
});

after(() => closeSessionPage(ctx));

test("API-CONNECTION-LOOP: the Tools panel shows the session's tools by server, with their policies", { ...TEST, skip }, async () => {
  await ctx.page.click("#tools-summary");
  const group = ".tools-group[data-group='MCP server ev']";
  await ctx.page.waitForSelector(`${group} li[data-tool='mcp__ev__echo']`);
  assert.match(await ctx.page.$eval(`${group} h4`, (e) => e.textContent), /MCP server ev · \d+/);
  assert.equal(await ctx.page.$eval(`${group} li[data-tool='mcp__ev__echo'] .badge`, (e) => e.textContent), "ask",
    "an MCP tool asks by default");
  assert.equal(await ctx.page.$eval(".tools-group[data-group='Built-in'] li[data-tool='read_file'] .badge",
    (e) => e.textContent), "allow");
  assert.match(await ctx.page.$eval("#tools-summary", (e) => e.textContent), /Tools \(\d+\)/);
  assert.deepEqual(ctx.errors, []);
});

test("API-CONNECTION-LOOP: an MCP tool approved in the UI shows the server's progress on its call, then its result", { ...TEST, skip }, async () => {
  await ctx.page.fill("#prompt", '/tool mcp__ev__trigger-long-running-operation {"duration": 4, "steps": 4}');
  await ctx.page.press("#prompt", "Enter");
  const card = ".request-card[data-kind='approval']";
  await ctx.page.waitForSelector(card);
  await ctx.page.click(`${card} button[data-option='allow_once']`);
  await ctx.page.waitForFunction(() =>
    /^\d+\/4/.test(document.querySelector("#conversation li.ev-tool .ev-progress")?.textContent ?? ""));
  const shown = await ctx.page.$eval("#conversation li.ev-tool .ev-progress", (e) => e.textContent);
  console.log(`  progress shown: ${shown}`);
  await ctx.page.waitForSelector('#conversation li[data-kind="tool/result"]');
  assert.equal(await ctx.page.$eval("#conversation li.ev-tool .ev-progress", (e) => e.textContent), "",
    "the progress goes once the result is there");
  assert.match(await ctx.page.$eval('#conversation li[data-kind="tool/result"] pre', (e) => e.textContent),
    /Long running operation completed/i);
  assert.deepEqual(ctx.errors, []);
});
