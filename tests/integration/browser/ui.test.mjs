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
//   6. cancel ends a running turn;
//   7. the session settings go through Remote (remote.js mounted per generation): rename (a second tab
//      sees it after a reload), tags, the run_command policy (allow → no approval card), the pending badge
//      from sessions.pending, a too-long title's bad-request shown inline; also at 400 px.
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

// SETUP(page), when given, runs before the page loads (to watch its first requests).
async function openPage(url, viewport = { width: 1280, height: 800 }, setup = null) {
  const page = await ctx.context.newPage();
  setup?.(page);
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
      // The UI asks for batches (?batch=1): a message is an array of envelopes.
      let list = null;
      try {
        list = JSON.parse(m);
      } catch {
        // not ours to judge: forwarded as it is
      }
      if (!Array.isArray(list)) {
        ws.send(m);
        return;
      }
      hostMethods.push(...list.map((e) => e?.method));
      const kept = list.filter((e) => e?.method !== "request.resolved");
      if (kept.length) ws.send(JSON.stringify(kept));
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

test("session settings go through Remote: rename, tags, run_command policy, the pending badge; errors inline (issue 7, REMOTE-CLIENT-*)", { ...TEST, skip }, async () => {
  started();
  // What the tab posts: the settings must use remote.invoke, never the plain session.* methods.
  const posted = [];
  const invoked = [];
  const watch = (r) => {
    if (r.method() !== "POST" || !r.url().includes("/api/")) return;
    const method = decodeURIComponent(new URL(r.url()).pathname.slice("/api/".length));
    posted.push(method);
    if (method === "remote.invoke") {
      try {
        const p = JSON.parse(r.postData()).payload;
        invoked.push(`${p.namespace}.${p.method}`);
      } catch {
        invoked.push("?");
      }
    }
  };
  const a = await openPage(ctx.host.launchUrl, undefined, (p) => p.on("request", watch));
  await waitReady(a);
  await a.waitForFunction(() => window.agenthostRemote().state === "mounted");
  const link = await a.evaluate(() => window.agenthostRemote());
  assert.ok(link.namespaces.includes("sessions"), `the sessions services are mounted: ${JSON.stringify(link)}`);
  assert.equal(String(link.generation), await a.$eval("#conn", (e) => e.dataset.generation), "mounted for the ready generation");
  // Tab A went through the host's kill -9 and restart: it mounted again for its new generation.
  if (ctx.pageA && !ctx.pageA.isClosed()) {
    const la = await ctx.pageA.evaluate(() => window.agenthostRemote());
    assert.equal(la.state, "mounted");
    assert.ok(la.generation > 1, `a later generation (${la.generation})`);
    assert.equal(String(la.generation), await ctx.pageA.$eval("#conn", (e) => e.dataset.generation));
  }

  // A session of its own, in a directory of its own.
  const cwd = await tempDir("ah-browser-remote-cwd-");
  ctx.dirs.push(cwd);
  await a.fill("#new-cwd", cwd);
  await a.fill("#new-title", "remote settings");
  await a.click("#create");
  await a.waitForFunction(() => document.getElementById("session-title").textContent === "remote settings");
  const sid = await a.$eval(".session-item[aria-current='true']", (e) => e.dataset.sessionId);
  const hostSession = async () => (await ctx.host.call("session.get", { sessionId: sid })).session;
  const title = () => a.$eval("#session-title", (e) => e.textContent);
  const focused = () => a.evaluate(() => document.activeElement?.id ?? null);

  // ---- rename: reached from the keyboard, labelled; Escape cancels, Enter saves.
  assert.equal(await a.$eval("label[for='rename-input']", (e) => e.textContent), "Session title");
  await a.focus("#rename");
  await a.keyboard.press("Enter");
  await a.waitForSelector("#rename-form", { state: "visible" });
  assert.equal(await focused(), "rename-input", "the title field has the focus");
  assert.equal(await a.inputValue("#rename-input"), "remote settings", "prefilled with the current title");
  await a.keyboard.type(" — not saved");
  await a.keyboard.press("Escape");
  await a.waitForSelector("#rename-form", { state: "hidden" });
  assert.equal(await focused(), "rename", "Escape gives the focus back to Rename");
  assert.equal(await title(), "remote settings");
  assert.equal((await hostSession()).title, "remote settings", "Escape saved nothing");

  await a.keyboard.press("Enter");
  await a.fill("#rename-input", "Renamed through Remote");
  await a.keyboard.press("Enter");
  await a.waitForSelector("#rename-form", { state: "hidden" });
  assert.equal(await title(), "Renamed through Remote");
  assert.equal((await hostSession()).title, "Renamed through Remote", "session.get shows the new title");
  assert.equal(
    await a.$eval(`.session-item[data-session-id='${sid}'] .session-title`, (e) => e.textContent),
    "Renamed through Remote",
  );

  // A title over 200 bytes: the host's bad-request is shown inline, the form stays open.
  await a.click("#rename");
  await a.fill("#rename-input", "x".repeat(201));
  await a.press("#rename-input", "Enter");
  await a.waitForSelector("#rename-error:not([hidden])");
  const renameError = await a.$eval("#rename-error", (e) => e.textContent);
  assert.match(renameError, /^bad-request: \S/, `the error is shown with its category: ${renameError}`);
  assert.ok(await a.isVisible("#rename-form"), "the form stays open for a correction");
  assert.equal(await focused(), "rename-input");
  await shot(a, "10-remote-rename-error-1280x800");
  assert.equal((await hostSession()).title, "Renamed through Remote", "the too-long title was not stored");
  await a.press("#rename-input", "Escape");
  await a.waitForSelector("#rename-form", { state: "hidden" });
  assert.equal(await a.$eval("#rename-error", (e) => e.hidden), true, "cancelling clears the error");

  // A second tab shows the new title after a reload.
  const b = ctx.pageB ?? (await openPage(ctx.host.launchUrl));
  await b.reload();
  await waitReady(b);
  await b.waitForFunction(
    (id) => document.querySelector(`.session-item[data-session-id='${id}'] .session-title`)?.textContent === "Renamed through Remote",
    sid,
  );

  // ---- tags: comma-separated, trimmed, empty and repeated ones dropped; stored with the session.
  assert.equal(await a.$eval("label[for='tags-input']", (e) => e.textContent), "Tags");
  await a.fill("#tags-input", " alpha, beta ,, gamma, alpha");
  await a.press("#tags-input", "Enter");
  await a.waitForFunction(() => document.getElementById("settings-status").textContent === "Tags saved.");
  assert.deepEqual((await hostSession()).tags, ["alpha", "beta", "gamma"]);
  assert.equal(await a.inputValue("#tags-input"), "alpha, beta, gamma");
  assert.deepEqual(
    await a.$$eval(`.session-item[data-session-id='${sid}'] .badge-tag`, (els) => els.map((e) => e.textContent)),
    ["alpha", "beta", "gamma"],
  );
  // A tag over 64 bytes: refused by the host, shown inline; Escape puts the stored tags back.
  await a.fill("#tags-input", "y".repeat(65));
  await a.press("#tags-input", "Enter");
  await a.waitForSelector("#settings-error:not([hidden])");
  assert.match(await a.$eval("#settings-error", (e) => e.textContent), /^Tags not saved — bad-request: \S/);
  assert.deepEqual((await hostSession()).tags, ["alpha", "beta", "gamma"]);
  await a.press("#tags-input", "Escape");
  assert.equal(await a.inputValue("#tags-input"), "alpha, beta, gamma");
  assert.equal(await a.$eval("#settings-error", (e) => e.hidden), true);

  // ---- the pending badge (sessions.pending, refreshed on request.pending / request.resolved).
  assert.equal(await a.$eval("label[for='policy-run_command']", (e) => e.textContent), "Policy for run_command");
  assert.equal(await a.inputValue("#policy-run_command"), "ask", "run_command asks by default");
  await a.waitForSelector("#session-pending[data-pending='0']");
  await a.fill("#prompt", `/tool run_command ${JSON.stringify({ command: "echo ask >> p.txt" })}`);
  await a.press("#prompt", "Enter");
  const card = `.request-card[data-kind='approval'][data-session-id='${sid}']`;
  await a.waitForSelector(card);
  await a.waitForSelector("#session-pending[data-pending='1']");
  assert.equal(await a.$eval("#session-pending", (e) => e.textContent), "1 pending");
  assert.equal(await a.$eval("#session-pending", (e) => e.title), "1 approval, 0 questions");
  await a.waitForSelector(`.session-item[data-session-id='${sid}'] .badge-pending[data-pending='1'][data-source='remote']`);
  await b.waitForSelector(`.session-item[data-session-id='${sid}'] .badge-pending[data-pending='1']`);
  await shot(a, "11-remote-pending-1280x800");
  await a.click(`${card} button[data-option='allow_once']`);
  await a.waitForSelector("#session-pending[data-pending='0']");
  assert.equal(await a.$eval("#session-pending", (e) => e.textContent), "0 pending");
  await a.waitForSelector(`.session-item[data-session-id='${sid}'] .badge-pending`, { state: "detached" });
  const replies = () =>
    a.$$eval('#conversation .msg[data-kind="message/committed"] .msg-body', (els) =>
      els.map((e) => e.textContent).filter((t) => t.startsWith("tool run_command:")),
    );
  await waitFor(async () => (await replies()).length === 1, UI_TIMEOUT, "the approved command's reply");
  assert.equal(await readText(join(cwd, "p.txt")), "ask\n");

  // ---- run_command policy `allow`: the next call runs with no approval card.
  await a.selectOption("#policy-run_command", "allow");
  await a.waitForFunction(() => document.getElementById("settings-status").textContent === "run_command: allow");
  assert.equal((await hostSession()).policy?.run_command, "allow", "the policy is stored with the session");
  assert.equal(await focused(), "policy-run_command", "the focus stays on the control");
  await a.evaluate(() => {
    window.__cardsSeen = 0;
    new MutationObserver((records) => {
      for (const r of records) for (const n of r.addedNodes) if (n.classList?.contains("request-card")) window.__cardsSeen++;
    }).observe(document.getElementById("requests"), { childList: true });
  });
  await a.fill("#prompt", `/tool run_command ${JSON.stringify({ command: "echo ok >> p.txt" })}`);
  await a.press("#prompt", "Enter");
  await waitFor(async () => (await replies()).length === 2, UI_TIMEOUT, "the allowed command's reply");
  assert.equal(await readText(join(cwd, "p.txt")), "ask\nok\n");
  assert.equal(await a.evaluate(() => window.__cardsSeen), 0, "no approval card appeared");
  const approvals = (await ctx.host.history(sid)).filter((e) => e.kind === "tool/approval");
  assert.equal(approvals.length, 1, "only the first call asked");
  assert.equal(await a.$eval("#session-pending", (e) => e.dataset.pending), "0");
  await shot(a, "12-remote-settings-1280x800");

  // Everything went through Remote.
  assert.ok(posted.includes("remote.describe"), "the tab described the remote services");
  for (const m of ["sessions.rename", "sessions.set_tags", "sessions.tool_policy", "sessions.pending"])
    assert.ok(invoked.includes(m), `${m} was invoked (${[...new Set(invoked)].join(", ")})`);
  const plain = posted.filter((m) => /^session\.(update|set-policy|set-tags|rename)$/.test(m));
  assert.deepEqual(plain, [], "no plain session.* method changed the settings");

  // A narrow window: the controls fit without horizontal overflow.
  const n = await openPage(`${ctx.host.launchUrl}&s=${sid}`, { width: 400, height: 800 });
  await waitReady(n);
  await n.waitForFunction(() => document.getElementById("session-title").textContent === "Renamed through Remote");
  await n.waitForFunction(() => window.agenthostRemote().state === "mounted");
  for (const sel of ["#rename", "#tags-input", "#tags-save", "#policy-run_command", "#prompt"])
    assert.ok(await n.isVisible(sel), `${sel} is visible at 400 px`);
  assert.equal(await n.inputValue("#policy-run_command"), "allow");
  assert.equal(await n.inputValue("#tags-input"), "alpha, beta, gamma");
  await n.click("#rename");
  const overflow = await n.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 0, `no horizontal overflow at 400 px (${overflow} px)`);
  const box = await n.$eval("#rename-input", (e) => e.getBoundingClientRect().right);
  assert.ok(box <= 400, `the title field fits (${box})`);
  await shot(n, "13-remote-settings-400x800");
  await n.close();
  await a.close();
  assert.deepEqual(
    ctx.consoleErrors.filter((e) => !/WebSocket|ERR_CONNECTION_REFUSED|Failed to load resource/.test(e)),
    [],
    "no script errors in the pages",
  );
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

test("a rename and tags in one tab reach the other live; a session deleted elsewhere leaves every tab (API-WS-HOST)", { ...TEST, skip }, async () => {
  started();
  const a = await openPage(ctx.host.launchUrl);
  const b = await openPage(ctx.host.launchUrl);
  await waitReady(a);
  await waitReady(b);
  await a.waitForFunction(() => window.agenthostRemote().state === "mounted");
  const cwd = await tempDir("ah-browser-live-cwd-");
  ctx.dirs.push(cwd);
  await a.fill("#new-cwd", cwd);
  await a.fill("#new-title", "before");
  await a.click("#create");
  await a.waitForFunction(() => document.getElementById("session-title").textContent === "before");
  const sid = await a.$eval(".session-item[aria-current='true']", (e) => e.dataset.sessionId);
  const itemTitle = (page) =>
    page.waitForFunction(
      ([id, want]) => document.querySelector(`.session-item[data-session-id='${id}'] .session-title`)?.textContent === want,
      [sid, "after"],
      { timeout: UI_TIMEOUT },
    );
  await b.waitForSelector(`.session-item[data-session-id='${sid}']`); // session.created
  await b.click(`.session-item[data-session-id='${sid}']`);

  // Renamed in tab A: tab B's list and header change without a reload (session.updated on the host stream).
  await a.click("#rename");
  await a.fill("#rename-input", "after");
  await a.press("#rename-input", "Enter");
  await itemTitle(a);
  await itemTitle(b);
  await b.waitForFunction(() => document.getElementById("session-title").textContent === "after");
  await a.fill("#tags-input", "one, two");
  await a.press("#tags-input", "Enter");
  await b.waitForFunction(
    (id) => [...document.querySelectorAll(`.session-item[data-session-id='${id}'] .badge-tag`)].map((e) => e.textContent).join() === "one,two",
    sid,
    { timeout: UI_TIMEOUT },
  );

  // Closed and deleted through the API by someone else: both tabs drop it; B, which showed it, says so.
  await ctx.host.call("session.close", { sessionId: sid });
  await ctx.host.call("session.delete", { sessionId: sid });
  for (const page of [a, b])
    await page.waitForSelector(`.session-item[data-session-id='${sid}']`, { state: "detached", timeout: UI_TIMEOUT });
  await b.waitForFunction(() => document.getElementById("session-view").hidden === true);
  assert.match(await b.$eval("#notice", (e) => e.textContent), /deleted/);
  await a.close();
  await b.close();
});

test("connection loop: a generation is ready only when both streams are open and describe succeeded (API-CONNECTION-LOOP)", { timeout: 10000 }, async () => {
  const { Connection } = await loadConnection();
  FakeSocket.all = [];
  const states = [];
  const c = new Connection({ api: fakeApi(), wsBase: "ws://h", getAfter: () => 41, WebSocketImpl: FakeSocket, logger: quiet, sink: { onState: (s) => states.push(s.state) } });
  c.start();
  await tick();
  const [mux, host] = FakeSocket.all;
  assert.equal(mux.url, "ws://h/api/ws/mux?batch=1&after=41");
  assert.equal(host.url, "ws://h/api/ws/host?batch=1");
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
  // A batched message (?batch=1): its envelopes in order, a bad one dropped alone.
  got.length = 0;
  const env = (method, payload) => ({ kind: "server-request", rpcId: "r", method, payload, replyRequired: false });
  mux.message(
    JSON.stringify([
      env("session.delta", { sessionId: "s", text: "a" }),
      { kind: "server-response", rpcId: "r" },
      env("session.status", { sessionId: "s", status: "running" }),
      env("session.event", { sessionId: "s", event: { cursor: 8, sessionId: "s", seq: 2, kind: "k", data: {} } }),
    ]),
  );
  assert.deepEqual(got, ["session.delta", "session.status", "session.event"]);
  assert.equal(c.dropped, 5);
  assert.throws(() => parseFrame(JSON.stringify([env("x", {}), env("y", {})])), /a batch of 2 envelopes/);
  c.stop();
});

// ---- the UI's Remote link (remote-transport.js), in Node with a fake API: one mount per ready generation,
// withdrawn when the generation ends (REMOTE-CLIENT-MOUNT), NoConnectionError while none is ready
// (REMOTE-CLIENT-INVOKE), host/remote-event frames routed to the client.

const loadRemoteLink = () => import(pathToFileURL(join(SOURCE, "plugins", "browser", "ui", "remote-transport.js")).href);

const SESSIONS_SET = {
  descriptors: [
    {
      namespace: "sessions",
      method: "rename",
      plugin: "remote",
      params: [
        { name: "session", type: "session", optional: false },
        { name: "title", type: "string", optional: false },
      ],
      result: "void",
      resultOptional: false,
      cancellable: false,
      lookup: "session",
      privileged: false,
    },
  ],
};

// An Api whose remote.invoke hangs until its signal aborts (then rejects like Api.call does).
function fakeRemoteApi(set = SESSIONS_SET) {
  return {
    calls: [],
    set,
    call(method, payload, { signal } = {}) {
      this.calls.push(method);
      if (method === "remote.describe") return Promise.resolve(structuredClone(this.set));
      return new Promise((_, reject) => {
        signal?.addEventListener("abort", () => reject(Object.assign(new Error("the call was aborted"), { code: "cancelled" })), { once: true });
      });
    },
  };
}

test("remote link: a mount per ready generation; the generation's end withdraws it and aborts its calls; no generation → NoConnectionError", { timeout: 10000 }, async () => {
  const { RemoteLink, isNoConnection } = await loadRemoteLink();
  const api = fakeRemoteApi();
  const mounts = [];
  const link = new RemoteLink({ api, logger: quiet, onMount: (m) => mounts.push(m) });
  assert.equal(link.state, "offline");
  assert.throws(() => link.transport.post("remote.describe", {}), (e) => isNoConnection(e), "no generation: nothing is sent");
  assert.equal(api.calls.length, 0);

  await link.ready(1);
  assert.equal(link.state, "mounted");
  assert.equal(mounts.length, 1);
  const rename = link.service("sessions", "rename");
  assert.equal(typeof rename, "function");
  const inflight = rename("s-1", "a title");
  await tick();
  assert.equal(mounts[0].pending, 1);

  // A describe in the same generation with the same set keeps the mount (and the call in flight).
  await link.refresh();
  assert.equal(mounts.length, 1);
  assert.equal(mounts[0].active, true);
  link.connectionState({ state: "degraded", generation: 1 });
  link.connectionState({ state: "ready", generation: 1 });
  assert.equal(mounts[0].active, true, "degraded → ready is the same generation");

  // The generation ends: the mount is withdrawn, its call resolves cancelled at once, the services go.
  link.connectionState({ state: "waiting", generation: 1 });
  assert.equal(mounts[0].active, false);
  assert.deepEqual(await withTimeout(inflight, 1000, "the in-flight call to settle"), {
    ok: false,
    error: { category: "cancelled", message: "sessions.rename: the mount was withdrawn" },
  });
  assert.equal(link.service("sessions", "rename"), null);
  assert.equal(link.services.sessions, undefined);
  assert.equal(link.state, "offline");
  assert.deepEqual(await rename("s-1", "late"), { ok: false, error: { category: "unavailable", message: "sessions.rename: the mount was withdrawn" } });

  // The next generation mounts again; a function of the old mount stays withdrawn.
  await link.ready(2);
  assert.equal(mounts.length, 2);
  assert.equal(link.transport.generation, 2);
  const old = link.service("sessions", "rename");
  await link.ready(3); // a newer generation without an end seen in between: the old mount goes first
  assert.equal(mounts.length, 3);
  assert.equal(mounts[1].active, false);
  assert.equal((await old("s-1", "x")).error.category, "unavailable");
  // A call while no generation is ready (the transport has none) throws the NoConnectionError.
  const fresh = link.service("sessions", "rename");
  link.transport.generation = null;
  await assert.rejects(fresh("s-1", "x"), (e) => isNoConnection(e), "no connection → the call throws");
  assert.equal((await fresh("s-1")).error.category, "bad-request", "arguments are checked before the connection");
  link.transport.generation = 3;

  // A changed set (a plugin mounted) is remounted in the same generation.
  api.set = structuredClone(SESSIONS_SET);
  api.set.descriptors.push({ ...SESSIONS_SET.descriptors[0], method: "pending", params: [SESSIONS_SET.descriptors[0].params[0]], result: "json" });
  await link.refresh();
  assert.equal(mounts.length, 4);
  assert.equal(typeof link.service("sessions", "pending"), "function");

  // host/remote-event frames reach the mount's subscriptions; other frames are not taken.
  const got = [];
  mounts[3].onRemoteEvent("request.pending", (args, name) => got.push([name, args.request.sessionId]));
  assert.equal(link.transport.deliver({ method: "host/remote-event", payload: { name: "request.pending", args: { request: { sessionId: "s-9" } } } }), true);
  assert.equal(link.transport.deliver({ method: "session.created", payload: {} }), false);
  assert.deepEqual(got, [["request.pending", "s-9"]]);
  link.end("done");
  assert.equal(link.transport.deliver({ method: "host/remote-event", payload: { name: "request.pending", args: {} } }), false, "subscriptions end with the mount");
});
