// The web UI shipped with the host, end to end: playwright-core drives Debian's Chromium (headless)
// against the real `agenthost serve` (browser plugin, echo provider). The tests run in order and share
// one host, one browser and one session:
//   1. the launch URL opens the UI (token from the fragment, dropped from the address bar); a session is
//      created from the UI; a prompt is sent with Enter and its reply streams in, then is committed;
//   2. `/tool run_command` raises an approval that shows in two tabs; approving in one removes the card
//      from the other, and the command runs exactly once;
//   3. the host is killed (SIGKILL) and restarted on the same state dir and port: both tabs reconnect by
//      themselves (API-CONNECTION-LOOP), and the conversation — including a prompt sent while the tabs
//      were away — shows every stored message once, with no gap and no duplicate;
//   4. export downloads the session's JSONL; a narrow window (400 px) is usable; a reload keeps the token
//      (sessionStorage); without a token the UI says so and a pasted launch URL connects;
//   5. frames the UI cannot parse (injected through a WebSocket route) are dropped without ending the
//      generation; a question answered in one tab and late in another shows the late tab's receipt;
//   6. cancel ends a running turn.
// Then the connection loop alone, in Node with a fake WebSocket (readiness, the 3 s guard, whole-generation
// rebuild, backoff and its reset, the frame pump). Screenshots go to BUILD_ROOT/test-artifacts/browser/*.png.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { readFile } from "node:fs/promises";
import { pathToFileURL } from "node:url";
import { chromium } from "playwright-core";
import {
  Host,
  artifactDir,
  chromiumPath,
  freePort,
  readText,
  removeDir,
  sleep,
  tempDir,
  waitFor,
  withTimeout,
} from "./lib.mjs";

const TEST = { timeout: 90000 };
const UI_TIMEOUT = 20000;
const CHROMIUM = chromiumPath();
const skip = CHROMIUM ? false : "no Chromium (apt-get install chromium, or set AH_TEST_CHROMIUM)";

const ctx = {
  host: null,
  browser: null,
  context: null,
  pageA: null,
  pageB: null,
  dirs: [],
  shots: null,
  cwd: null,
  sessionId: null,
  consoleErrors: [],
};

// Message elements (user prompts and committed assistant replies) as the page shows them.
async function messages(page) {
  return page.$$eval("#conversation .msg[data-seq]", (els) =>
    els.map((e) => ({ seq: Number(e.dataset.seq), kind: e.dataset.kind, text: e.querySelector(".msg-body")?.textContent ?? "" })),
  );
}

async function waitReady(page, ms = UI_TIMEOUT) {
  await page.waitForSelector('#conn[data-state="ready"]', { timeout: ms });
}

async function shot(page, name) {
  await page.screenshot({ path: join(ctx.shots, `${name}.png`), fullPage: false });
}

async function openPage(url, viewport = { width: 1280, height: 800 }) {
  const page = await ctx.context.newPage();
  await page.setViewportSize(viewport);
  page.setDefaultTimeout(UI_TIMEOUT);
  page.on("console", (m) => {
    if (m.type() === "error") ctx.consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => ctx.consoleErrors.push(`pageerror: ${e.message}`));
  await page.goto(url);
  return page;
}

// Sends TEXT from the page's prompt box with Enter and waits for the committed reply "echo: …".
async function promptAndWait(page, text, expectedReply) {
  await page.fill("#prompt", text);
  await page.press("#prompt", "Enter");
  await page.waitForFunction(
    (want) => [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) => e.textContent === want),
    expectedReply,
    { timeout: UI_TIMEOUT },
  );
}

// Starting the host or the browser can fail; that failure is reported by each browser test (the
// connection-loop tests below need neither).
before(async () => {
  if (skip) return;
  try {
    await setUp();
  } catch (err) {
    ctx.startError = err;
  }
});

function started() {
  if (ctx.startError) throw ctx.startError;
}

async function setUp() {
  ctx.shots = await artifactDir();
  const stateDir = await tempDir("ah-browser-state-");
  const runtimeDir = await tempDir("ah-browser-run-");
  ctx.cwd = await tempDir("ah-browser-cwd-");
  ctx.dirs.push(stateDir, runtimeDir, ctx.cwd);
  ctx.host = new Host({ stateDir, runtimeDir, port: await freePort() });
  await ctx.host.start();
  ctx.browser = await withTimeout(
    chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"],
      timeout: 30000,
    }),
    40000,
    "Chromium to start",
  );
  ctx.context = await ctx.browser.newContext({ acceptDownloads: true });
}

after(async () => {
  try {
    if (ctx.browser) await withTimeout(ctx.browser.close(), 10000, "Chromium to close").catch(() => {});
  } finally {
    if (ctx.host) await ctx.host.stop().catch(() => {});
    for (const d of ctx.dirs) await removeDir(d).catch(() => {});
  }
});

test("the launch URL opens the UI; a session is created and a prompt's reply streams in (API-CONNECTION-LOOP, UI)", { ...TEST, skip }, async () => {
  started();
  assert.equal(ctx.host.launchSource, "stdout", "agenthost serve prints the launch URL on stdout");
  assert.match(ctx.host.launchUrl, /^http:\/\/127\.0\.0\.1:\d+\/#k=[A-Za-z0-9_-]{43}$/);
  const page = (ctx.pageA = await openPage(ctx.host.launchUrl));
  await waitReady(page);
  // The token left the address bar (SECURITY.md §2.2) and lives in this tab's sessionStorage.
  assert.ok(!page.url().includes("k="), `the token is still in the URL: ${page.url()}`);
  assert.equal(await page.evaluate(() => sessionStorage.getItem("agenthost.token")), ctx.host.token);
  assert.equal(await page.evaluate(() => document.cookie), "");

  await page.fill("#new-cwd", ctx.cwd);
  await page.fill("#new-title", "browser e2e");
  await page.click("#create");
  await page.waitForSelector(".session-item[aria-current='true']");
  ctx.sessionId = await page.$eval(".session-item[aria-current='true']", (e) => e.dataset.sessionId);
  assert.match(ctx.sessionId, /^[0-9a-f-]{36}$/);
  assert.equal(await page.evaluate(() => document.activeElement?.id), "prompt", "the prompt box has the focus");

  // Shift+Enter adds a line and does not send.
  await page.type("#prompt", "line one");
  await page.keyboard.press("Shift+Enter");
  assert.equal(await page.inputValue("#prompt"), "line one\n");
  await page.fill("#prompt", "");

  // Record every text the streaming element shows, to prove the reply arrives in parts before the commit.
  await page.evaluate(() => {
    window.__streamed = [];
    new MutationObserver(() => {
      for (const e of document.querySelectorAll("#conversation .msg-streaming .msg-body")) {
        const t = e.textContent;
        if (t && window.__streamed.at(-1) !== t) window.__streamed.push(t);
      }
    }).observe(document.getElementById("conversation"), { childList: true, subtree: true, characterData: true });
  });
  const words = Array.from({ length: 60 }, (_, i) => `word${i}`).join(" ");
  const reply = `echo: ${words}`;
  await promptAndWait(page, `/chunks 300\n${words}`, reply);
  const streamed = await page.evaluate(() => window.__streamed);
  assert.ok(streamed.length >= 2, `the reply streamed in parts (saw ${streamed.length})`);
  for (const s of streamed) assert.ok(reply.startsWith(s), `a streamed text is a prefix of the reply: ${JSON.stringify(s)}`);
  assert.ok(streamed.some((s) => s.length < reply.length), "a partial text was shown before the commit");
  await page.waitForSelector("#conversation .msg-streaming", { state: "detached" });

  const ms = await messages(page);
  assert.deepEqual(ms.map((m) => m.kind), ["inbox/received", "message/committed"]);
  assert.equal(ms[0].text, `/chunks 300\n${words}`);
  assert.equal(ms[1].text, reply);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 0, `no horizontal overflow at 1280 px (${overflow} px)`);
  await shot(page, "1-conversation-1280x800");
});

test("an approval shows in two tabs; approving in one removes it from the other; the command runs once", { ...TEST, skip }, async () => {
  started();
  assert.ok(ctx.sessionId, "needs the session of the first test");
  const a = ctx.pageA;
  const b = (ctx.pageB = await openPage(ctx.host.launchUrl));
  await waitReady(b);
  await b.click(`.session-item[data-session-id='${ctx.sessionId}']`);
  await b.waitForFunction(() => document.querySelectorAll("#conversation .msg[data-seq]").length === 2);

  const command = "echo ran >> ran.txt";
  await a.fill("#prompt", `/tool run_command ${JSON.stringify({ command })}`);
  await a.press("#prompt", "Enter");

  const card = ".request-card[data-kind='approval']";
  await a.waitForSelector(card);
  await b.waitForSelector(card);
  const idA = await a.$eval(card, (e) => e.dataset.requestId);
  const idB = await b.$eval(card, (e) => e.dataset.requestId);
  assert.equal(idA, idB, "both tabs show the same request");
  assert.equal(await a.$eval(`${card} .request-command`, (e) => e.textContent), command);
  assert.equal(await a.$eval("#cancel", (e) => e.disabled), false, "a running turn can be cancelled");
  await shot(a, "2-approval-tab-a-1280x800");
  await shot(b, "2-approval-tab-b-1280x800");
  assert.equal(await readText(join(ctx.cwd, "ran.txt")), null, "nothing ran before the approval");

  // Keyboard: the card's buttons are reachable and labelled.
  const labels = await b.$$eval(`${card} button.answer`, (els) => els.map((e) => e.textContent));
  assert.deepEqual(labels, ["Allow once", "Allow always", "Reject"]);

  // Answered from the keyboard: focus the button, press Enter.
  await b.focus(`${card} button[data-option='allow_once']`);
  await b.keyboard.press("Enter");
  await b.waitForSelector(card, { state: "detached" });
  await a.waitForSelector(card, { state: "detached" }); // removed by request.resolved, without a click here

  await a.waitForFunction(
    () =>
      [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) =>
        e.textContent.startsWith("tool run_command:"),
      ),
    null,
    { timeout: UI_TIMEOUT },
  );
  assert.ok(await a.$("#conversation [data-kind='tool/approval'].outcome-granted"), "the approval is shown granted");
  assert.ok(await a.$("#conversation [data-kind='tool/result']"), "the tool result is shown");
  assert.equal(await readText(join(ctx.cwd, "ran.txt")), "ran\n");
  await sleep(500);
  assert.equal(await readText(join(ctx.cwd, "ran.txt")), "ran\n", "the command ran exactly once");
  await shot(a, "3-approved-1280x800");
});

test("kill -9 and restart: both tabs reconnect by themselves and show the conversation with no gap and no duplicate", { ...TEST, skip }, async () => {
  started();
  assert.ok(ctx.pageB, "needs the two tabs of the previous test");
  const a = ctx.pageA;
  const b = ctx.pageB;
  const before = await messages(a);
  assert.equal(before.length, 4);

  const sockets = [];
  a.on("websocket", (ws) => sockets.push(ws.url()));
  const lastCursor = Math.max(...(await a.$$eval("#conversation [data-cursor]", (els) => els.map((e) => Number(e.dataset.cursor)))));

  await ctx.host.kill9();
  await a.waitForSelector('#conn:not([data-state="ready"])', { timeout: 10000 });
  await b.waitForSelector('#conn:not([data-state="ready"])', { timeout: 10000 });
  await shot(a, "4-host-down-1280x800");

  await ctx.host.start();
  // A prompt from another client right after the restart, most likely while the tabs are still
  // waiting for their next attempt: the replay (mux after=CURSOR) must bring it in.
  await ctx.host.call("session.prompt", { sessionId: ctx.sessionId, text: "while you were away" });

  await waitReady(a, 30000);
  await waitReady(b, 30000);
  for (const p of [a, b]) {
    await p.waitForFunction(
      () => [...document.querySelectorAll("#conversation .msg-body")].some((e) => e.textContent === "echo: while you were away"),
      null,
      { timeout: UI_TIMEOUT },
    );
  }
  // Tab A's new generation resumed the mux after the last cursor it had seen.
  const resumed = sockets.filter((u) => u.includes("/api/ws/mux"));
  assert.ok(resumed.length >= 1, "tab A opened the mux again");
  assert.ok(
    resumed.every((u) => new URL(u).searchParams.get("after") === String(lastCursor)),
    `the mux was reopened with after=${lastCursor}: ${resumed.join(", ")}`,
  );
  await promptAndWait(a, "after the restart", "echo: after the restart");
  await b.waitForFunction(
    () => [...document.querySelectorAll("#conversation .msg-body")].some((e) => e.textContent === "echo: after the restart"),
    null,
    { timeout: UI_TIMEOUT },
  );

  // The store's messages and the page's message elements are the same set, each once.
  const stored = (await ctx.host.history(ctx.sessionId)).filter((e) => e.kind === "inbox/received" || e.kind === "message/committed");
  const seqsAll = (await ctx.host.history(ctx.sessionId)).map((e) => e.seq);
  assert.deepEqual(seqsAll, Array.from({ length: seqsAll.length }, (_, i) => i + 1), "the store's seqs are 1..N");
  for (const [name, p] of [["tab A", a], ["tab B", b]]) {
    const shown = await messages(p);
    assert.equal(shown.length, 8, `${name}: 4 prompts and 4 replies`);
    assert.deepEqual(
      shown.map((m) => m.seq),
      stored.map((e) => e.seq),
      `${name}: every stored message shown once, in order`,
    );
    const all = await p.$$eval("#conversation [data-seq]", (els) => els.map((e) => Number(e.dataset.seq)));
    assert.equal(new Set(all).size, all.length, `${name}: no seq shown twice`);
  }
  assert.equal(await readText(join(ctx.cwd, "ran.txt")), "ran\n", "the restart did not run the command again");
  await shot(a, "5-reconnected-1280x800");
});

test("export downloads the session's JSONL; a narrow window (400 px) is usable", { ...TEST, skip }, async () => {
  started();
  assert.ok(ctx.sessionId);
  const a = ctx.pageA;
  const [download] = await Promise.all([a.waitForEvent("download", { timeout: UI_TIMEOUT }), a.click("#export")]);
  const text = await readFile(await download.path(), "utf8");
  const lines = text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
  assert.ok(lines.length > 0);
  assert.deepEqual(
    lines.map((e) => e.seq),
    Array.from({ length: lines.length }, (_, i) => i + 1),
  );
  assert.ok(lines.every((e) => e.sessionId === ctx.sessionId));

  // A narrow window: the session list is a panel behind the "Sessions" button; the conversation fits.
  const n = await openPage(ctx.host.launchUrl, { width: 400, height: 800 });
  await waitReady(n);
  await shot(n, "6-narrow-sessions-400x800");
  await n.click(`.session-item[data-session-id='${ctx.sessionId}']`);
  await n.waitForFunction(() => document.querySelectorAll("#conversation .msg[data-seq]").length === 8);
  const overflow = await n.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 0, `no horizontal overflow at 400 px (${overflow} px)`);
  assert.ok(await n.isVisible("#prompt"), "the prompt box is visible");
  await shot(n, "7-narrow-conversation-400x800");
  await n.click("#toggle-sidebar");
  assert.ok(await n.isVisible("#session-list"));
  // A reload keeps working: the token comes from this tab's sessionStorage, the session from #s=ID.
  await n.reload();
  await waitReady(n);
  await n.waitForFunction(() => document.querySelectorAll("#conversation .msg[data-seq]").length === 8);
  assert.ok(!n.url().includes("k="));
  await n.close();

  // Without the token (the bare origin in a new tab) the UI says so and connects to nothing.
  const t = await openPage(ctx.host.origin + "/");
  await t.waitForSelector('#conn[data-state="no-token"]');
  assert.ok(await t.isVisible("#token-banner"));
  await shot(t, "9-no-token-1280x800");
  // Pasting the launch URL connects.
  await t.fill("#token-input", ctx.host.launchUrl);
  await t.press("#token-input", "Enter");
  await waitReady(t);
  await t.close();

  // Every frame the real server sent passed the UI's envelope and payload checks.
  for (const p of [a, ctx.pageB]) {
    const dropped = (await p.evaluate(() => window.agenthostLog())).filter((e) => e.text.includes("dropped a frame"));
    assert.deepEqual(dropped, [], "the UI dropped none of the server's frames");
  }
  assert.deepEqual(
    ctx.consoleErrors.filter((e) => !/WebSocket|ERR_CONNECTION_REFUSED|Failed to load resource/.test(e)),
    [],
    "no script errors in the pages",
  );
});

test("frames the UI cannot parse are dropped without ending the generation; a late answer shows its receipt (API-WS-CLIENT)", { ...TEST, skip }, async () => {
  started();
  assert.ok(ctx.sessionId);
  const a = ctx.pageA;
  // Tab C sits behind a WebSocket route: the mux gets extra frames injected, and the host stream loses
  // its request.resolved frames, so C's question card stays up after tab A answered.
  const c = await ctx.context.newPage();
  await c.setViewportSize({ width: 1280, height: 800 });
  c.setDefaultTimeout(UI_TIMEOUT);
  let mux = null;
  const hostMethods = [];
  const receipts = [];
  c.on("response", async (r) => {
    if (r.url().endsWith("/api/respond")) receipts.push(`${r.status()} ${await r.text().catch(() => "?")}`);
  });
  await c.routeWebSocket(/\/api\/ws\/mux/, (ws) => {
    ws.connectToServer();
    mux = ws;
  });
  await c.routeWebSocket(/\/api\/ws\/host/, (ws) => {
    const server = ws.connectToServer();
    server.onMessage((m) => {
      let method = null;
      try {
        method = JSON.parse(m).method;
      } catch {
        // not ours to judge: forwarded as it is
      }
      hostMethods.push(method);
      if (method !== "request.resolved") ws.send(m);
    });
  });
  await c.goto(ctx.host.launchUrl);
  await waitReady(c);
  await c.click(`.session-item[data-session-id='${ctx.sessionId}']`);
  await c.waitForFunction(() => document.querySelectorAll("#conversation .msg[data-seq]").length === 8);
  const generation = await c.$eval("#conn", (e) => e.dataset.generation);

  const env = (method, payload) => JSON.stringify({ kind: "server-request", rpcId: "x", method, payload, replyRequired: false });
  const garbage = [
    Buffer.from([1, 2, 3]), // binary
    "not json",
    "[1,2,3]",
    JSON.stringify({ kind: "server-response", rpcId: "x", value: 1 }),
    JSON.stringify({ kind: "server-request", method: "session.event", payload: {} }), // no rpcId
    env("session.event", { sessionId: ctx.sessionId, event: { kind: "message/committed" } }), // no seq
    env("session.delta", { sessionId: ctx.sessionId }), // no text
    env("request.resolved", {}), // no id
  ];
  for (const g of garbage) mux.send(g);
  await waitFor(
    async () => (await c.evaluate(() => window.agenthostLog())).filter((e) => e.text.includes("dropped a frame")).length >= garbage.length,
    5000,
    "the UI to log the dropped frames",
  );
  await sleep(300);
  assert.equal(await c.$eval("#conn", (e) => e.dataset.state), "ready", "the generation goes on");
  assert.equal(await c.$eval("#conn", (e) => e.dataset.generation), generation, "no new generation was built");
  assert.equal((await messages(c)).length, 8, "nothing was added by the bad frames");

  // A question shows in both tabs; A answers first; C answers late and gets the receipt.
  await a.fill("#prompt", "/ask What is your name?");
  await a.press("#prompt", "Enter");
  const card = ".request-card[data-kind='question']";
  await a.waitForSelector(card);
  await c.waitForSelector(card);
  assert.equal(await c.$eval(`${card} .request-question`, (e) => e.textContent), "What is your name?");
  assert.doesNotMatch(await c.$eval(card, (e) => e.textContent), /null|undefined/);
  await a.fill(`${card} input`, "Ada");
  await a.press(`${card} input`, "Enter");
  await a.waitForSelector(card, { state: "detached" });
  await a.waitForFunction(
    () => [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) => e.textContent === "answer: Ada"),
  );
  await c.fill(`${card} input`, "Bob");
  await c.click(`${card} button[type='submit']`);
  await c.waitForSelector(`${card}[data-receipt='resolved']`).catch(async (err) => {
    const state = await c.evaluate(() => ({
      cards: [...document.querySelectorAll(".request-card")].map((e) => e.outerHTML),
      conn: document.getElementById("conn").dataset,
      log: window.agenthostLog().slice(-20),
    }));
    state.hostMethods = hostMethods;
    state.receipts = receipts;
    throw new Error(`${err.message}\npage C: ${JSON.stringify(state, null, 1)}`);
  });
  assert.match(await c.$eval(`${card} .receipt`, (e) => e.textContent), /Already answered elsewhere/);
  // The wire says "resolved" (another caller) or "duplicate" (the host tells callers apart by HTTP
  // connection, and the tabs of one browser share pooled connections); either way it was not accepted.
  assert.ok(["resolved", "duplicate"].includes(await c.$eval(card, (e) => e.dataset.receiptReason)));
  await shot(c, "8-late-answer-receipt-1280x800");
  // The stream still works in C after the bad frames: the committed answer arrives, once.
  await c.waitForFunction(
    () => [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) => e.textContent === "answer: Ada"),
  );
  assert.equal(await c.$eval("#conn", (e) => e.dataset.generation), generation);
  const shown = await messages(c);
  assert.equal(shown.length, 10);
  assert.equal(new Set(shown.map((m) => m.seq)).size, 10);
  await c.close();
});

test("cancel ends a running turn from the UI", { ...TEST, skip }, async () => {
  started();
  assert.ok(ctx.sessionId);
  const a = ctx.pageA;
  await a.fill("#prompt", "/sleep 60000\nslow");
  await a.press("#prompt", "Enter");
  await a.waitForSelector("#cancel:not([disabled])");
  assert.equal(await a.$eval("#session-status", (e) => e.textContent), "running");
  await a.click("#cancel");
  await a.waitForSelector("#conversation .ev-turn-end.reason-cancelled");
  await a.waitForSelector("#cancel[disabled]");
  assert.equal(await a.$eval("#session-status", (e) => e.textContent), "idle");
  const last = (await messages(a)).at(-1);
  assert.equal(last.kind, "inbox/received", "nothing was committed for the cancelled turn");
  assert.equal(last.text, "/sleep 60000\nslow");
});

// ---- the connection loop itself, in Node with a fake WebSocket and a fake API (no browser, no host):
// the timing rules of API-CONNECTION-LOOP that an end-to-end run cannot pin down.

const SOURCE = process.env.AH_TEST_SOURCE_ROOT ?? join(import.meta.dirname, "..", "..", "..");
const loadConnection = () => import(pathToFileURL(join(SOURCE, "plugins", "browser", "ui", "connection.js")).href);

class FakeSocket {
  static all = [];
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.closed = false;
    FakeSocket.all.push(this);
  }
  open() {
    this.onopen?.({});
  }
  message(data) {
    this.onmessage?.({ data });
  }
  end(code = 1006) {
    this.onclose?.({ code, reason: "" });
  }
  close() {
    this.closed = true;
  }
}

function fakeApi({ fail = false, hang = false } = {}) {
  return {
    token: "T0K",
    calls: 0,
    call(method, payload, { signal } = {}) {
      this.calls++;
      if (hang) return new Promise(() => {});
      return fail ? Promise.reject(Object.assign(new Error("down"), { code: "network" })) : Promise.resolve({ protocol: 1 });
    },
  };
}

const quiet = { info() {}, warn() {}, error() {} };
const tick = () => new Promise((r) => setTimeout(r, 5));

test("connection loop: a generation is ready only when both streams are open and describe succeeded (API-CONNECTION-LOOP)", { timeout: 10000 }, async () => {
  const { Connection } = await loadConnection();
  FakeSocket.all = [];
  const states = [];
  const c = new Connection({ api: fakeApi(), wsBase: "ws://h", getAfter: () => 41, WebSocketImpl: FakeSocket, logger: quiet, sink: { onState: (s) => states.push(s.state) } });
  c.start();
  await tick();
  const [mux, host] = FakeSocket.all;
  assert.equal(mux.url, "ws://h/api/ws/mux?after=41");
  assert.equal(host.url, "ws://h/api/ws/host");
  assert.deepEqual(mux.protocols, ["agenthost.v1", "agenthost.bearer.T0K"]);
  assert.equal(c.state.state, "connecting");
  mux.open();
  await tick();
  assert.equal(c.state.state, "connecting", "one stream open is not enough");
  host.open();
  await tick();
  assert.equal(c.state.state, "ready");
  c.stop();
});

test("connection loop: the 3 s guard allows degraded readiness; a stream's end aborts the whole generation (API-CONNECTION-LOOP)", { timeout: 10000 }, async () => {
  const { Connection } = await loadConnection();
  FakeSocket.all = [];
  const readies = [];
  const c = new Connection({ api: fakeApi(), wsBase: "ws://h", WebSocketImpl: FakeSocket, logger: quiet, guardMs: 60, baseMs: 20, capMs: 40, sink: { onReady: (r) => readies.push(r) } });
  c.start();
  await tick();
  FakeSocket.all[0].open(); // the host stream never opens (a proxy that swallows it)
  await sleep(100);
  assert.equal(c.state.state, "degraded");
  assert.equal(readies.length, 1);
  assert.equal(readies[0].degraded, true);
  assert.equal(c.attempt, 0);
  const gen = c.generation;
  FakeSocket.all[0].end(1006); // the mux ends: both sockets of the generation go
  assert.equal(FakeSocket.all[1].closed, true, "the other stream is closed with it");
  await Promise.resolve();
  assert.equal(c.state.state, "waiting");
  await sleep(60);
  assert.equal(c.generation, gen + 1, "a whole new generation is built");
  assert.equal(FakeSocket.all.length, 4, "with both streams");
  c.stop();
});

test("connection loop: backoff 500 ms doubling to a 10 s cap, jittered in [step/2, step]; a ready generation resets it (API-CONNECTION-LOOP)", { timeout: 10000 }, async () => {
  const { Connection, backoffDelay } = await loadConnection();
  const steps = [500, 1000, 2000, 4000, 8000, 10000, 10000];
  for (const [i, step] of steps.entries()) {
    assert.equal(backoffDelay(i, { random: () => 0 }), step / 2);
    assert.equal(backoffDelay(i, { random: () => 0.999999 }) <= step, true);
    assert.ok(backoffDelay(i, { random: () => 0.999999 }) > step * 0.99);
  }
  // Failing describes grow the attempt count; a ready generation sets it back to 0.
  FakeSocket.all = [];
  const api = fakeApi({ fail: true });
  const c = new Connection({ api, wsBase: "ws://h", WebSocketImpl: FakeSocket, logger: quiet, baseMs: 5, capMs: 10 });
  c.start();
  await waitFor(() => c.attempt >= 3, 2000, "three failed generations");
  api.call = () => Promise.resolve({});
  await waitFor(() => c.state.state === "connecting" && FakeSocket.all.length >= 2, 2000, "a new generation");
  const [mux, host] = FakeSocket.all.slice(-2);
  mux.open();
  host.open();
  await tick();
  assert.equal(c.state.state, "ready");
  assert.equal(c.attempt, 0);
  c.stop();
});

test("connection loop: bad frames are dropped and a sink exception is logged; the pump goes on (API-WS-CLIENT)", { timeout: 10000 }, async () => {
  const { Connection, parseFrame } = await loadConnection();
  FakeSocket.all = [];
  const got = [];
  const errors = [];
  const logger = { info() {}, warn: (m) => errors.push(m), error: (m) => errors.push(m) };
  const c = new Connection({
    api: fakeApi(),
    wsBase: "ws://h",
    WebSocketImpl: FakeSocket,
    logger,
    sink: {
      onFrame: (f) => {
        got.push(f.method);
        if (f.method === "boom") throw new Error("sink failure");
      },
    },
  });
  c.start();
  await tick();
  const [mux, host] = FakeSocket.all;
  mux.open();
  host.open();
  await tick();
  const ok = (method, payload) => JSON.stringify({ kind: "server-request", rpcId: "r", method, payload, replyRequired: false });
  mux.message(new ArrayBuffer(3));
  mux.message("{");
  mux.message(JSON.stringify({ kind: "server-request", rpcId: "r", method: "x" })); // no payload, no replyRequired
  mux.message(ok("session.event", { sessionId: "s", event: { seq: 0, kind: "k" } }));
  mux.message(ok("boom", {}));
  mux.message(ok("session.event", { sessionId: "s", event: { cursor: 7, sessionId: "s", seq: 1, kind: "k", data: {} } }));
  assert.deepEqual(got, ["boom", "session.event"]);
  assert.equal(c.dropped, 4);
  assert.equal(c.state.state, "ready", "bad frames never end the generation");
  assert.ok(errors.some((e) => String(e).includes("onFrame handler failed")));
  assert.equal(parseFrame(ok("session.event", { sessionId: "s", event: { cursor: 7, seq: 1, kind: "k" } })).cursor, 7);
  c.stop();
});
