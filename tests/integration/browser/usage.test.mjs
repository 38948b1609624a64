// The first review milestone (docs/usage.md): two tabs of Debian's Chromium on one session, both recording;
// the fake model asks for a tool approval; the second tab answers. Then, with no daemon running, `agenthost
// analyze` reads the two downloaded recordings and reports the turn, the approval and which tab answered it,
// usage equal to what the fake server reported, the cost under a price table, and full coverage; the same
// recording with lines removed reports the gaps. The usage panel shows the host's totals and a chart per turn.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { agenthostPath, chromiumPath, closeSessionPage, openSessionPage, tempDir, waitFor } from "./lib.mjs";
import { startFakeModel, finishChunk } from "../fake-model.mjs";

const run = promisify(execFile);
const TEST = { timeout: 120000 };
const CHROMIUM = chromiumPath();
const skip = CHROMIUM ? false : "no Chromium (apt-get install chromium, or set AH_TEST_CHROMIUM)";
const ctx = { dirs: [], errors: [] };
const MODEL = "fake-model-v2";
// What the fake server reports for the two round trips of the turn.
const ROUND1 = { prompt_tokens: 1200, completion_tokens: 40, prompt_tokens_details: { cached_tokens: 200 } };
const ROUND2 = { prompt_tokens: 1300, completion_tokens: 60, completion_tokens_details: { reasoning_tokens: 10 } };
// USD per million tokens: input 2.5, cached 1.25, output 10 — so the turn costs
// (1000 + 1300)×2.5 + 200×1.25 + (40 + 60)×10 = 5750 + 250 + 1000 = 7000 per million = 0.007
const PRICES = {
  version: 1,
  name: "milestone-prices",
  currency: "USD",
  rates: [{ model: MODEL, from: "2026-01-01", input: "2.50", cachedInput: "1.25", output: "10" }],
};

before(async () => {
  if (skip) return;
  ctx.fake = await startFakeModel();
  const pdir = await tempDir("ah-usage-prices-");
  ctx.dirs.push(pdir);
  ctx.prices = join(pdir, "prices.json");
  await writeFile(ctx.prices, JSON.stringify(PRICES));
  ctx.hostRec = join(pdir, "host-recordings");
  await openSessionPage(ctx, {
    prefix: "ah-browser-usage",
    conf: `[host]\ndefault_provider = fake\nprices = ${ctx.prices}\nrecord_dir = ${ctx.hostRec}\n` +
      `[provider.fake]\ntype = openai\n` +
      `base_url = ${ctx.fake.baseUrl}\nmodel = m1\n`,
  });
});

after(async () => {
  await closeSessionPage(ctx);
  if (ctx.fake) await ctx.fake.stop().catch(() => {});
});

const chunk = (delta, extra = {}) => ({ choices: [{ index: 0, delta }], model: MODEL, ...extra });

async function download(page, dir) {
  const files = [];
  const got = new Promise((resolve) => {
    page.on("download", async (d) => {
      const path = join(dir, d.suggestedFilename());
      await d.saveAs(path);
      files.push(path);
      if (files.length === 2) resolve();
    });
  });
  await page.click("#record-download");
  await got;
  return files.find((f) => f.endsWith(".jsonl"));
}

async function analyze(...args) {
  const { stdout } = await run(agenthostPath(), ["analyze", "--json", ...args], { maxBuffer: 64 << 20 });
  return JSON.parse(stdout);
}

test("two tabs record one session, the second answers the approval, analyze reads it offline", { ...TEST, skip }, async () => {
  const a = ctx.page;
  const sessionId = await a.evaluate(() => new URLSearchParams(location.hash.slice(1)).get("s"));
  assert.ok(sessionId, "the session is selected");
  await a.check("#record");
  // The second tab, on the same session.
  const b = await ctx.browser.newPage();
  b.on("pageerror", (e) => ctx.errors.push(e.message));
  await b.goto(ctx.host.launchUrl + "&s=" + encodeURIComponent(sessionId));
  await b.waitForSelector('#conn[data-state="ready"]');
  await b.check("#record");
  const target = join(ctx.cwd, "answered-by-b.txt");
  await ctx.fake.script([
    { sse: [chunk({ tool_calls: [{ index: 0, id: "w1", type: "function", function: { name: "write_file",
      arguments: JSON.stringify({ path: target, content: "tab b said yes" }) } }] }),
    { ...finishChunk("tool_calls"), model: MODEL }, { choices: [], model: MODEL, usage: ROUND1 }, "[DONE]"] },
    { sse: [chunk({ content: "Written, as tab b allowed." }), { ...finishChunk("stop"), model: MODEL },
      { choices: [], model: MODEL, usage: ROUND2 }, "[DONE]"] },
  ]);
  await a.fill("#prompt", "write the file");
  await a.press("#prompt", "Enter");
  const card = ".request-card[data-kind='approval']";
  await a.waitForSelector(card);
  await b.waitForSelector(card);
  await b.click(`${card} button[data-option='allow_once']`);
  for (const p of [a, b]) {
    await p.waitForSelector(card, { state: "detached" });
    await p.waitForFunction(() => [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')]
      .some((e) => e.textContent.includes("as tab b allowed")));
  }
  assert.equal(await readFile(target, "utf8"), "tab b said yes");

  // The usage panel: the host's totals and cost, a chart bar per turn.
  await a.click("#usage-summary");
  await a.waitForFunction(() => /2,500 in · 100 out · 0\.007 USD/.test(document.getElementById("usage-summary").textContent));
  const cells = await a.$$eval("#usage-table tr:nth-child(2) td", (tds) => tds.map((t) => t.textContent));
  assert.deepEqual(cells.slice(0, 7), ["this session", "2,500", "200", "100", "10", "2", "1"]);
  assert.equal(cells[7], "0.007 USD");
  await a.waitForFunction(() => document.getElementById("usage-chart").dataset.turns === "1");
  assert.deepEqual(JSON.parse(await a.$eval("#usage-chart", (c) => c.dataset.tokens)), [[2500, 200, 100]]);
  assert.ok(await a.evaluate(() => typeof window.Chart === "function"), "Chart.js from the system's package");

  // Both recordings, downloaded; then no daemon.
  await new Promise((r) => setTimeout(r, 500)); // calls the end of the turn set off are answered
  const dl = await tempDir("ah-usage-dl-");
  ctx.dirs.push(dl);
  const recA = await download(a, dl);
  const recB = await download(b, dl);
  const token = ctx.host.token;
  await ctx.host.stop();
  for (const f of [recA, recB]) {
    const text = await readFile(f, "utf8");
    assert.ok(!text.includes(token), `${f}: the token is never recorded`);
    const meta = JSON.parse(await readFile(f.replace(/\.jsonl$/, ".meta.json"), "utf8"));
    assert.equal(meta.format, "agenthost.recording");
    assert.ok(meta.hostRunId && meta.recordingRunId && meta.hostRunId !== meta.recordingRunId, "two run ids, distinct");
  }
  const connB = JSON.parse((await readFile(recB, "utf8")).split("\n")[0]).conn;
  const connA = JSON.parse((await readFile(recA, "utf8")).split("\n")[0]).conn;
  assert.notEqual(connA, connB);

  const rep = await analyze("--prices", ctx.prices, "--as-of", new Date(Date.now() + 60000).toISOString(), recA, recB);
  assert.deepEqual(rep.coverage, { complete: true, issues: [] });
  assert.equal(rep.sessions.length, 1);
  const s = rep.sessions[0];
  assert.equal(s.id, sessionId);
  assert.equal(s.turns.length, 1);
  const turn = s.turns[0];
  assert.equal(turn.reason, "end");
  assert.equal(turn.model, MODEL);
  assert.equal(turn.requestedModel, "m1");
  assert.equal(turn.roundTrips, 2);
  assert.deepEqual(s.usage, { inputTokens: 2500, cachedInputTokens: 200, outputTokens: 100, reasoningTokens: 10, requests: 2 });
  assert.equal(s.cost.amount, "0.007");
  assert.equal(s.cost.currency, "USD");
  assert.equal(rep.prices, "milestone-prices");
  assert.equal(s.requests.length, 1);
  assert.equal(s.requests[0].kind, "approval");
  assert.equal(s.requests[0].tool, "write_file");
  assert.equal(s.requests[0].state, "granted");
  assert.deepEqual(s.requests[0].answeredBy, { source: "browser-ui", conn: connB });
  assert.ok(rep.inputs.every((i) => i.malformed === 0 && i.records > 0));
  // The two tabs saw the same events: each counted once.
  assert.ok(rep.inputs.reduce((n, i) => n + i.duplicates, 0) > 0, "the second recording's copies were dropped");

  // The host's own recording of the browser surface ([host] record_dir): the same facts from the other side,
  // the answer on one of tab b's HTTP connections.
  const { readdir } = await import("node:fs/promises");
  const hostFiles = (await readdir(ctx.hostRec)).filter((f) => f.endsWith(".jsonl")).map((f) => join(ctx.hostRec, f));
  assert.equal(hostFiles.length, 1, hostFiles.join(" "));
  assert.match(hostFiles[0], /host-browser-/);
  const hostText = await readFile(hostFiles[0], "utf8");
  assert.ok(!hostText.includes(token), "the host's recording holds no token");
  const hrep = await analyze("--prices", ctx.prices, hostFiles[0]);
  assert.deepEqual(hrep.coverage, { complete: true, issues: [] });
  const hs = hrep.sessions.find((x) => x.id === sessionId);
  assert.deepEqual(hs.usage, s.usage);
  assert.equal(hs.cost.amount, "0.007");
  assert.equal(hs.requests[0].state, "granted");
  assert.equal(hs.requests[0].answeredBy.source, "host:browser");
  assert.match(hs.requests[0].answeredBy.conn, /^http-\d+$/);
  assert.ok(hrep.connections.some((c) => /^ws-\d+-mux$/.test(c.conn)) && hrep.connections.some((c) => /^ws-\d+-host$/.test(c.conn)));
  const hmeta = JSON.parse(await readFile(hostFiles[0].replace(/\.jsonl$/, ".meta.json"), "utf8"));
  assert.equal(hmeta.hostRunId, JSON.parse(await readFile(recA.replace(/\.jsonl$/, ".meta.json"), "utf8")).hostRunId,
    "the tab's recording names the host run it talked to");

  // The same recording with lines removed: the gaps are reported.
  const lines = (await readFile(recA, "utf8")).split("\n").filter(Boolean);
  const cut = join(dl, "cut.jsonl");
  await writeFile(cut, [...lines.slice(0, 4), ...lines.slice(7)].join("\n") + "\n");
  const gapped = await analyze(cut);
  assert.equal(gapped.coverage.complete, false);
  assert.ok(gapped.coverage.issues.some((i) => i.includes(`connection browser-ui ${connA}: records 5..7 are missing`)),
    gapped.coverage.issues.join("\n"));
  const conn = gapped.connections.find((c) => c.conn === connA);
  assert.deepEqual(conn.gaps, [[5, 7]]);
  // and a recording cut before the end of the turn: no end observed, outcome unknown for what was in flight
  const head = join(dl, "head.jsonl");
  const half = lines.findIndex((l) => l.includes('"turn/ended"'));
  assert.ok(half > 0);
  await writeFile(head, lines.slice(0, half).join("\n") + "\n");
  const early = await analyze(head);
  assert.equal(early.coverage.complete, false);
  assert.ok(early.sessions[0].turns[0].incomplete.includes("no end observed"));
  assert.deepEqual(ctx.errors, []);
});
