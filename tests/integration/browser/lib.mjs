// Helpers for the browser end-to-end tests: start and stop the real `agenthost serve` on a free loopback
// port with a temporary state directory, read its launch URL, call the browser API from Node, and launch
// Debian's Chromium through playwright-core.
import { spawn } from "node:child_process";
import { mkdtemp, mkdir, rm, readFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { agenthostPath, sleep, freePort } from "../common.mjs";

export { agenthostPath, sleep, freePort };

/** Rejects with `what` when PROMISE has not settled after MS milliseconds. */
export function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]);
}

/** Polls FN until it returns a truthy value (returned) or MS pass (throws naming WHAT). */
export async function waitFor(fn, ms, what, every = 50) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (err) {
      last = err;
    }
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what} (last: ${last?.message ?? last})`);
    await sleep(every);
  }
}

/** Where screenshots go: BUILD_ROOT/test-artifacts/browser (created). */
export async function artifactDir() {
  const build = process.env.AH_TEST_BUILD_ROOT ?? tmpdir();
  const dir = join(build, "test-artifacts", "browser");
  await mkdir(dir, { recursive: true });
  return dir;
}

/** The Chromium to drive: AH_TEST_CHROMIUM, else Debian's. Null when none is installed. */
export function chromiumPath() {
  const p = process.env.AH_TEST_CHROMIUM ?? "/usr/bin/chromium";
  return existsSync(p) ? p : null;
}

export async function tempDir(prefix) {
  return mkdtemp(join(tmpdir(), prefix));
}

export const LAUNCH_RE = /(https?:\/\/[^\s#]+\/#k=[A-Za-z0-9_\-]+)/;

/**
 * One `agenthost serve` process. start() resolves once the launch URL was printed on stdout; stdout and
 * stderr are kept (stderr's tail goes into failure messages).
 */
/** POST /api/METHOD with the bearer, as a non-browser client; resolves with the server-response value,
 * throws on an HTTP status other than 200 or an error envelope. */
export async function postApi(origin, token, method, payload = {}) {
  const rpcId = randomUUID();
  const res = await fetch(`${origin}/api/${method}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
    body: JSON.stringify({ kind: "client-request", rpcId, method, payload }),
  });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`${method}: HTTP ${res.status}: ${text}`);
  const body = JSON.parse(text);
  if (body.error) throw new Error(`${method}: ${body.error.code}: ${body.error.message}`);
  return body.value;
}

export class Host {
  constructor({ stateDir, runtimeDir, port, logLevel = "info", args = [] }) {
    this.args = args; // more options before `serve` (e.g. --config FILE)
    this.stateDir = stateDir;
    this.runtimeDir = runtimeDir;
    this.port = port;
    this.logLevel = logLevel;
    this.child = null;
    this.stdout = "";
    this.stderr = "";
    this.launchUrl = null;
    this.exited = null;
  }

  get origin() {
    return `http://127.0.0.1:${this.port}`;
  }

  async start(timeoutMs = 15000) {
    this.stdout = "";
    this.stderr = "";
    this.launchUrl = null;
    const argv = [
      "--state-dir",
      this.stateDir,
      "--runtime-dir",
      this.runtimeDir,
      "--listen",
      `127.0.0.1:${this.port}`,
      "--log-level",
      this.logLevel,
      ...this.args,
      "serve",
    ];
    const env = { ...process.env };
    delete env.XDG_RUNTIME_DIR;
    const child = spawn(agenthostPath(), argv, { stdio: ["ignore", "pipe", "pipe"], env });
    this.child = child;
    this.exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
    child.stdout.setEncoding("utf8");
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d) => {
      this.stderr += d;
      if (this.stderr.length > 200000) this.stderr = this.stderr.slice(-100000);
    });
    const url = new Promise((resolve, reject) => {
      child.stdout.on("data", (d) => {
        this.stdout += d;
        const m = LAUNCH_RE.exec(this.stdout);
        if (m && !this.launchUrl) {
          this.launchUrl = m[1];
          resolve(m[1]);
        }
      });
      child.on("exit", (code, signal) =>
        reject(new Error(`agenthost serve exited (${code ?? signal}) before printing a launch URL:\n${this.tail()}`)),
      );
      child.on("error", reject);
    });
    // The launch URL is printed on stdout; serve.json (runtime dir) + state_dir/token describe the same
    // URL and are the fallback when no line came within 2 s of serve.json appearing.
    const discovered = (async () => {
      let seenAt = 0;
      for (;;) {
        await sleep(100);
        if (this.launchUrl || child.exitCode !== null || child.signalCode !== null) return this.launchUrl;
        const fromFiles = await this.discover(child.pid);
        if (!fromFiles) continue;
        seenAt ||= Date.now();
        if (Date.now() - seenAt >= 2000) {
          this.launchSource = "serve.json";
          this.launchUrl = fromFiles;
          return fromFiles;
        }
      }
    })();
    this.launchSource = "stdout";
    await withTimeout(
      Promise.race([url, discovered.then((u) => u ?? url)]),
      timeoutMs,
      `the launch URL of agenthost serve:\n${this.tail()}`,
    );
    return this.launchUrl;
  }

  /** The launch URL from runtime_dir/serve.json (when written by PID) and state_dir/token, or null. */
  async discover(pid) {
    const serve = await readText(join(this.runtimeDir, "serve.json"));
    const token = (await readText(join(this.stateDir, "token")))?.trim();
    if (!serve || !token) return null;
    try {
      const j = JSON.parse(serve);
      if (j.pid !== pid || typeof j.url !== "string") return null;
      return new URL("#k=" + token, j.url).href;
    } catch {
      return null;
    }
  }

  /** The token: from the launch URL's fragment. */
  get token() {
    return this.launchUrl ? new URL(this.launchUrl).hash.replace(/^#k=/, "") : null;
  }

  tail(lines = 40) {
    return this.stderr.split("\n").slice(-lines).join("\n");
  }

  /** kill -9, and wait until the process is gone. */
  async kill9() {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.kill("SIGKILL");
    await withTimeout(this.exited, 5000, "agenthost to die after SIGKILL");
  }

  /** SIGTERM, then SIGKILL after GRACE ms. */
  async stop(graceMs = 5000) {
    const c = this.child;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    c.kill("SIGTERM");
    try {
      await withTimeout(this.exited, graceMs, "agenthost to stop");
    } catch {
      c.kill("SIGKILL");
      await withTimeout(this.exited, 5000, "agenthost to die after SIGKILL");
    }
  }

  /** POST /api/METHOD with the bearer, as a non-browser client; resolves with the server-response value. */
  async call(method, payload = {}) {
    return postApi(this.origin, this.token, method, payload);
  }

  /** Every stored event of a session, through session.history pages. */
  async history(sessionId) {
    const events = [];
    let afterSeq = 0;
    for (;;) {
      const r = await this.call("session.history", { sessionId, afterSeq, limit: 1000 });
      events.push(...r.events);
      if (r.nextAfterSeq === null || r.nextAfterSeq === undefined || r.events.length === 0) return events;
      afterSeq = r.nextAfterSeq;
    }
  }
}

export async function removeDir(dir) {
  if (dir) await rm(dir, { recursive: true, force: true });
}

export async function readText(path) {
  try {
    return await readFile(path, "utf8");
  } catch (err) {
    if (err.code === "ENOENT") return null;
    throw err;
  }
}

/**
 * `agenthost serve` with the configuration text `conf`, Debian's Chromium on its launch URL, and one session
 * created in a fresh cwd from the page, for a test file's `before`. Fills ctx: host, browser, page, cwd,
 * dirs (removed by closeSessionPage), errors (the page's uncaught errors).
 */
export async function openSessionPage(ctx, { conf, prefix, timeout = 20000 }) {
  const { chromium } = await import("playwright-core");
  const stateDir = await tempDir(`${prefix}-state-`);
  const runtimeDir = await tempDir(`${prefix}-run-`);
  ctx.cwd = await tempDir(`${prefix}-cwd-`);
  const confDir = await tempDir(`${prefix}-conf-`);
  ctx.dirs.push(stateDir, runtimeDir, ctx.cwd, confDir);
  const confPath = join(confDir, "agenthost.ini");
  const { writeFile } = await import("node:fs/promises");
  await writeFile(confPath, conf);
  ctx.host = new Host({ stateDir, runtimeDir, port: await freePort(), args: ["--config", confPath] });
  await ctx.host.start();
  ctx.browser = await withTimeout(chromium.launch({ executablePath: chromiumPath(), headless: true,
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"], timeout: 30000 }),
  40000, "Chromium to start");
  ctx.page = await ctx.browser.newPage();
  ctx.page.setDefaultTimeout(timeout);
  ctx.page.on("pageerror", (e) => ctx.errors.push(e.message));
  await ctx.page.goto(ctx.host.launchUrl);
  await ctx.page.waitForSelector('#conn[data-state="ready"]');
  await ctx.page.fill("#new-cwd", ctx.cwd);
  await ctx.page.click("#create");
  await ctx.page.waitForSelector(".session-item[aria-current='true']");
}

/** The counterpart of openSessionPage for a test file's `after`. */
export async function closeSessionPage(ctx) {
  if (ctx.browser) await withTimeout(ctx.browser.close(), 10000, "Chromium to close").catch(() => {});
  if (ctx.host) await ctx.host.stop().catch(() => {});
  for (const d of ctx.dirs) await removeDir(d).catch(() => {});
}
