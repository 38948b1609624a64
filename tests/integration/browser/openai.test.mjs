// The web UI with a real model path: `agenthost serve` whose default provider is of type openai, on the
// scripted fake model server (tests/fakes), driven in Debian's Chromium by playwright-core. The assistant's
// Markdown is rendered (and sanitized: a hostile tag does nothing), reasoning streams collapsed, a tool call
// is approved from the UI, a retry is shown, and cancel closes the model's stream at once. The page waits
// for API-CONNECTION-LOOP's ready state before it acts.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { chromiumPath, closeSessionPage, openSessionPage, readText } from "./lib.mjs";
import { startFakeModel, textChunk, finishChunk } from "../fake-model.mjs";

const TEST = { timeout: 90000 };
const UI_TIMEOUT = 20000;
const CHROMIUM = chromiumPath();
const skip = CHROMIUM ? false : "no Chromium (apt-get install chromium, or set AH_TEST_CHROMIUM)";
const ctx = { dirs: [], errors: [] };

before(async () => {
  if (skip) return;
  ctx.fake = await startFakeModel(); // for the whole file: stopped by the file's `after`
  await openSessionPage(ctx, { prefix: "ah-browser-openai", timeout: UI_TIMEOUT,
    conf: `[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\n` +
      `base_url = ${ctx.fake.baseUrl}\nmodel = m1\nmax_retries = 2\n` });
});

after(async () => {
  await closeSessionPage(ctx);
  if (ctx.fake) await ctx.fake.stop().catch(() => {});
});

async function send(text) {
  await ctx.page.fill("#prompt", text);
  await ctx.page.press("#prompt", "Enter");
}

const committed = () =>
  ctx.page.$$eval('#conversation .msg[data-kind="message/committed"] .msg-body', (els) => els.map((e) => e.innerHTML));

test("Markdown from the model is rendered and sanitized; reasoning streams collapsed", { ...TEST, skip }, async () => {
  const md = "Here is **bold** and `code`:\n\n```js\nconsole.log(1)\n```\n\n" +
    "<img src=\"x\" onerror=\"window.__pwned = 1\"> <script>window.__pwned = 2</script>[a link](https://example.org)";
  await ctx.fake.script([{ delay_ms: 150, sse: [
    { choices: [{ index: 0, delta: { reasoning_content: "thinking about it" } }] },
    { choices: [{ index: 0, delta: { reasoning_content: " some more" } }] },
    textChunk(md), finishChunk("stop"), "[DONE]"] }]);
  await send("show me markdown");
  await ctx.page.waitForSelector("#conversation .msg-streaming details.reasoning:not([hidden])");
  assert.equal(await ctx.page.$eval("#conversation .msg-streaming details.reasoning", (e) => e.open), false, "collapsed");
  await ctx.page.waitForSelector('#conversation .msg[data-kind="message/committed"] .msg-body.markdown strong');
  const body = '#conversation .msg[data-kind="message/committed"] .msg-body.markdown';
  assert.equal(await ctx.page.$eval(`${body} strong`, (e) => e.textContent), "bold");
  assert.equal(await ctx.page.$eval(`${body} pre code`, (e) => e.textContent.trim()), "console.log(1)");
  assert.equal(await ctx.page.$$eval(`${body} script`, (e) => e.length), 0, "no script element");
  assert.equal(await ctx.page.$$eval(`${body} [onerror]`, (e) => e.length), 0, "no event handler attribute");
  assert.equal(await ctx.page.$eval(`${body} a`, (e) => e.getAttribute("rel")), "noopener noreferrer");
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(await ctx.page.evaluate(() => window.__pwned), undefined, "nothing the model sent ran");
  await ctx.page.waitForSelector("#conversation .msg-streaming", { state: "detached" });
  assert.equal((await committed()).length, 1, "the reasoning was not committed as a message");
});

test("a tool call of the model is approved in the UI, its arguments shown collapsed; the answer follows", { ...TEST, skip }, async () => {
  const target = join(ctx.cwd, "from-ui.txt");
  const args = JSON.stringify({ path: target, content: "approved in the browser" });
  await ctx.fake.script([
    { sse: [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: "u1", type: "function",
      function: { name: "write_file", arguments: args } }] } }] }, finishChunk("tool_calls"), "[DONE]"] },
    { sse: [textChunk("The file is *written*."), finishChunk("stop"), "[DONE]"] },
  ]);
  await send("write a file");
  const card = ".request-card[data-kind='approval']";
  await ctx.page.waitForSelector(card);
  assert.equal(await readText(target), null, "nothing was written before the approval");
  await ctx.page.click(`${card} button[data-option='allow_once']`);
  await ctx.page.waitForSelector(card, { state: "detached" });
  await ctx.page.waitForFunction(() =>
    [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body em')].some((e) => e.textContent === "written"));
  assert.equal(await readText(target), "approved in the browser");
  const details = "#conversation [data-kind='tool/call'] details";
  assert.equal(await ctx.page.$eval(details, (e) => e.open), false, "the call's arguments are collapsed");
  assert.match(await ctx.page.$eval(`${details} pre`, (e) => e.textContent), /approved in the browser/);
  assert.ok(await ctx.page.$("#conversation [data-kind='tool/result']"), "the result is shown");
});

test("a retry is shown while the turn waits; an error says why", { ...TEST, skip }, async () => {
  await ctx.fake.script([
    { status: 429, headers: { "Retry-After": "1" }, json: { error: { message: "slow down" } } },
    { sse: [textChunk("after the wait"), finishChunk("stop"), "[DONE]"] },
    { status: 401, json: { error: { message: "bad key" } } },
  ]);
  await send("rate limited");
  await ctx.page.waitForSelector("#conversation .ev-notice.notice-retry");
  assert.match(await ctx.page.$eval("#conversation .ev-notice.notice-retry", (e) => e.textContent),
    /Retrying: rate limited, retrying in 1\.0 s \(1 of 2\)/);
  await ctx.page.waitForFunction(() =>
    [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) => e.textContent === "after the wait"));
  await send("and now an error");
  await ctx.page.waitForSelector("#conversation .ev-turn-end.reason-error");
  assert.match(await ctx.page.$eval("#conversation .ev-turn-end.reason-error", (e) => e.textContent),
    /the provider rejected the API key for http:\/\/127\.0\.0\.1:\d+\/v1 \(401\)/);
});

test("cancel in the UI closes the model's stream at once", { ...TEST, skip }, async () => {
  const slow = Array.from({ length: 300 }, () => textChunk("tick "));
  await ctx.fake.script([{ sse: slow, delay_ms: 50 }]);
  const before = (await ctx.fake.events()).length;
  await send("a long answer");
  await ctx.page.waitForSelector("#conversation .msg-streaming .msg-body:not(:empty)");
  await ctx.page.waitForSelector("#cancel:not([disabled])");
  const cancelledAt = Date.now() / 1000;
  await ctx.page.click("#cancel");
  await ctx.page.waitForSelector("#conversation .ev-turn-end.reason-cancelled");
  let seen = 0;
  for (let i = 0; i < 100 && !seen; i++) {
    const ev = (await ctx.fake.events()).slice(before).find((e) => e.event === "disconnect");
    if (ev) seen = ev.time;
    else await new Promise((r) => setTimeout(r, 20));
  }
  assert.ok(seen > 0, "the server saw the client go");
  assert.ok(seen - cancelledAt < 0.2, `disconnect ${Math.round((seen - cancelledAt) * 1000)} ms after the click`);
  assert.deepEqual(ctx.errors, [], "no page error");
});

test("the new-session form offers the configured providers and their models; the choice is the session's", { ...TEST, skip }, async () => {
  const options = await ctx.page.$$eval("#new-provider option", (os) => os.map((o) => ({ v: o.value, t: o.textContent, s: o.selected })));
  assert.deepEqual(options.map((o) => o.v), ["echo", "fake"], JSON.stringify(options));
  assert.equal(options.find((o) => o.s)?.v, "fake", "the default provider is preselected");
  assert.equal(options[1].t, "fake (openai)");
  assert.equal(await ctx.page.$eval("#new-model", (e) => e.placeholder), "m1");
  await ctx.page.selectOption("#new-provider", "echo");
  await ctx.page.fill("#new-cwd", ctx.cwd);
  await ctx.page.fill("#new-title", "on echo");
  const before = await ctx.page.$eval(".session-item[aria-current='true']", (e) => e.dataset.sessionId);
  await ctx.page.click("#create");
  await ctx.page.waitForFunction((old) => document.querySelector(".session-item[aria-current='true']")?.dataset.sessionId !== old, before);
  await send("which provider?");
  await ctx.page.waitForFunction(() =>
    [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) => e.textContent === "echo: which provider?"));
});
