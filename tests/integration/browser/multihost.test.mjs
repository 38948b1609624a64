// Two hosts on one PostgreSQL store (docs/scaling.md), the browser on the one that does not run the
// session: Chromium on host A's UI follows a session host B runs — its events arrive live, in order and
// without a gap — prompts it (A posts the prompt, B runs it), and answers its approval (A posts the answer,
// B runs the command). Runs beside the cluster tests/support/with_pg.sh starts (AH_TEST_PG).
// PROTOCOLS.md: UI (approval cards any open tab can answer — here a tab on another host), API-WS-HOST
// (the session's events and requests reach host A's streams).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { writeFile } from "node:fs/promises";
import { chromium } from "playwright-core";
import { Host, chromiumPath, freePort, readText, removeDir, tempDir, waitFor, withTimeout } from "./lib.mjs";

const UI_TIMEOUT = 20000;
const CHROMIUM = chromiumPath();
const ctx = { dirs: [], hosts: [], errors: [] };

function psql(dbname, sql) {
  const bin = process.env.AH_TEST_PG_BIN ? join(process.env.AH_TEST_PG_BIN, "psql") : "psql";
  return execFileSync(bin, ["-At", "-c", sql, `${process.env.AH_TEST_PG} dbname=${dbname}`], {
    env: { ...process.env, PGPASSWORD: process.env.AH_TEST_PG_PASSWORD },
    encoding: "utf8",
  }).trim();
}

async function startHost(name, confPath) {
  const stateDir = await tempDir(`ah-mh-${name}-state-`);
  const runtimeDir = await tempDir(`ah-mh-${name}-run-`);
  ctx.dirs.push(stateDir, runtimeDir);
  const host = new Host({ stateDir, runtimeDir, port: await freePort(), args: ["--config", confPath] });
  ctx.hosts.push(host);
  await host.start();
  return host;
}

before(async () => {
  assert.ok(process.env.AH_TEST_PG, "AH_TEST_PG is not set: run through tests/support/with_pg.sh (meson test)");
  assert.ok(CHROMIUM, "no Chromium (apt-get install chromium, or set AH_TEST_CHROMIUM)");
  ctx.db = `mh_${process.pid}`;
  psql("postgres", `CREATE DATABASE ${ctx.db}`);
  const confDir = await tempDir("ah-mh-conf-");
  ctx.cwd = await tempDir("ah-mh-cwd-");
  ctx.dirs.push(confDir, ctx.cwd);
  const pw = join(confDir, "pw");
  await writeFile(pw, `${process.env.AH_TEST_PG_PASSWORD}\n`, { mode: 0o600 });
  const conf = join(confDir, "agenthost.ini");
  await writeFile(
    conf,
    `[host]\nlease_ttl_ms = 3000\nstore_url = ${process.env.AH_TEST_PG} dbname=${ctx.db}\nstore_password_file = ${pw}\n`,
  );
  ctx.a = await startHost("a", conf);
  ctx.b = await startHost("b", conf);
  ctx.browser = await withTimeout(
    chromium.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"], timeout: 30000 }),
    40000,
    "Chromium to start",
  );
});

after(async () => {
  if (ctx.browser) await withTimeout(ctx.browser.close(), 10000, "Chromium to close").catch(() => {});
  for (const h of ctx.hosts) await h.stop().catch(() => {});
  if (ctx.db) {
    try {
      psql("postgres", `DROP DATABASE IF EXISTS ${ctx.db} WITH (FORCE)`);
    } catch {}
  }
  for (const d of ctx.dirs) await removeDir(d).catch(() => {});
});

test("Chromium on host A follows, prompts and answers a session host B runs", { timeout: 120000 }, async () => {
  // B creates the session and runs a first turn: it owns it.
  const { sessionId } = await ctx.b.call("session.create", { cwd: ctx.cwd });
  await ctx.b.call("session.prompt", { sessionId, text: "run by B" });
  await waitFor(async () => (await ctx.b.history(sessionId)).some((e) => e.kind === "turn/ended"), 10000, "B's first turn");

  const page = await ctx.browser.newPage();
  page.setDefaultTimeout(UI_TIMEOUT);
  page.on("pageerror", (e) => ctx.errors.push(e.message));
  await page.goto(ctx.a.launchUrl);
  await page.waitForSelector('#conn[data-state="ready"]');
  // A lists the session (from the shared store) and shows its stored conversation.
  await page.click(`.session-item[data-session-id='${sessionId}']`);
  await page.waitForFunction(
    () => [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) => e.textContent === "echo: run by B"),
  );
  const got = await ctx.a.call("session.get", { sessionId });
  assert.equal(got.session.owner.split(":")[1], String(ctx.b.child.pid), "A shows B as the owner");

  // A prompt from A's page: posted by A, run by B, its reply shown live on A.
  await page.fill("#prompt", "hello from A's tab");
  await page.press("#prompt", "Enter");
  await page.waitForFunction(
    () => [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) => e.textContent === "echo: hello from A's tab"),
  );

  // An approval raised by B's turn shows on A; answered there, B runs the command once.
  const command = "echo ran >> ran.txt";
  await page.fill("#prompt", `/tool run_command ${JSON.stringify({ command })}`);
  await page.press("#prompt", "Enter");
  const card = `.request-card[data-kind='approval'][data-session-id='${sessionId}']`;
  await page.waitForSelector(card);
  assert.equal(await readText(join(ctx.cwd, "ran.txt")), null, "nothing ran before the approval");
  await page.click(`${card} button[data-option='allow_once']`);
  await page.waitForSelector(card, { state: "detached" });
  await page.waitForFunction(
    () => [...document.querySelectorAll('#conversation .msg[data-kind="message/committed"] .msg-body')].some((e) => e.textContent.startsWith("tool run_command:")),
  );
  assert.ok(await page.$("#conversation [data-kind='tool/approval'].outcome-granted"), "the approval is shown granted");
  assert.equal(await readText(join(ctx.cwd, "ran.txt")), "ran\n", "B ran the command once");

  // What A's page shows is the stored log: every message in seq order, none missing.
  const shown = await page.$$eval("#conversation .msg[data-seq]", (els) => els.map((e) => Number(e.dataset.seq)));
  const stored = (await ctx.b.history(sessionId)).filter((e) => ["inbox/received", "message/committed"].includes(e.kind)).map((e) => e.seq);
  assert.deepEqual(shown, stored, "A's page shows the conversation B stored, in order");
  const owner = psql(ctx.db, "SELECT lease_owner FROM sessions");
  assert.ok(owner.includes(`:${ctx.b.child.pid}:`), `the session stayed B's (owner ${owner})`);
  assert.deepEqual(ctx.errors, [], "the page raised no error");
});
