// Node side of the Remote client tests (remote.test.mjs): the real `agenthost serve` — on 127.0.0.1 and,
// when the machine has one, on a non-loopback IPv4 address too (a LAN peer, for `forbidden`) — the CLI
// against its admin socket, and Chromium pages at the host's origin that load plugins/browser/ui/remote.js
// from the host's static route. The page itself and the browser-side harness (remote-page.mjs) are handed to
// the page by playwright's routing under /__remote-test__/, which never reaches the host; everything else —
// remote.js, POST /api/*, the WebSockets — is the real host.
import { spawn, execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { networkInterfaces } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { agenthostPath, freePort, tempDir, removeDir, withTimeout, postApi, LAUNCH_RE } from "./lib.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));

// A non-loopback IPv4 address of this machine, or null.
export function lanAddress() {
  for (const list of Object.values(networkInterfaces()))
    for (const a of list ?? []) if (a.family === "IPv4" && !a.internal) return a.address;
  return null;
}

export function buildRoot() {
  const b = process.env.AH_TEST_BUILD_ROOT;
  if (!b) throw new Error("AH_TEST_BUILD_ROOT is not set (the meson build directory)");
  return b;
}

export class RemoteHost {
  constructor() {
    this.child = null;
    this.stdout = "";
    this.stderr = "";
    this.dirs = [];
  }

  get origin() {
    return `http://127.0.0.1:${this.port}`;
  }
  get lanOrigin() {
    return this.lan ? `http://${this.lan}:${this.port}` : null;
  }

  // Starts `agenthost serve`; with LAN, also listens on a non-loopback address and allows it as Host and
  // Origin (the browser plugin's allowed_hosts / allowed_origins, through the environment).
  async start({ lan = true } = {}) {
    this.stateDir = await tempDir("ah-remote-state-");
    this.runtimeDir = await tempDir("ah-remote-run-");
    this.cwd = await tempDir("ah-remote-cwd-");
    this.dirs.push(this.stateDir, this.runtimeDir, this.cwd);
    this.port = await freePort();
    this.lan = lan ? lanAddress() : null;
    const env = { ...process.env };
    delete env.XDG_RUNTIME_DIR;
    let listen = `127.0.0.1:${this.port}`;
    if (this.lan) {
      listen += `,${this.lan}:${this.port}`;
      env.AGENTHOST_PLUGIN_BROWSER_ALLOWED_HOSTS = this.lan;
      env.AGENTHOST_PLUGIN_BROWSER_ALLOWED_ORIGINS = this.lanOrigin;
    }
    const argv = ["--state-dir", this.stateDir, "--runtime-dir", this.runtimeDir, "--listen", listen, "serve"];
    const child = spawn(agenthostPath(), argv, { stdio: ["ignore", "pipe", "pipe"], env });
    this.child = child;
    this.exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
    child.stdout.setEncoding("utf8");
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d) => {
      this.stderr = (this.stderr + d).slice(-200000);
    });
    const url = new Promise((resolve, reject) => {
      child.stdout.on("data", (d) => {
        this.stdout += d;
        const m = LAUNCH_RE.exec(this.stdout);
        if (m) resolve(m[1]);
      });
      child.on("exit", (code, signal) => reject(new Error(`agenthost serve exited (${code ?? signal}):\n${this.tail()}`)));
      child.on("error", reject);
    });
    this.launchUrl = await withTimeout(url, 15000, `the launch URL of agenthost serve:\n${this.tail()}`);
    this.token = new URL(this.launchUrl).hash.replace(/^#k=/, "");
    return this;
  }

  tail(lines = 40) {
    return this.stderr.split("\n").slice(-lines).join("\n");
  }

  // `agenthost --state-dir … --runtime-dir … ARGS…` against the running daemon; resolves with stdout.
  cli(...args) {
    const argv = ["--state-dir", this.stateDir, "--runtime-dir", this.runtimeDir, ...args];
    return new Promise((resolve, reject) => {
      execFile(agenthostPath(), argv, { timeout: 30000 }, (err, stdout, stderr) => {
        if (err) reject(new Error(`agenthost ${args.join(" ")}: ${err.message}\n${stderr}`));
        else resolve(stdout);
      });
    });
  }

  loadPlugin(name) {
    return this.cli("plugins", "load", join(buildRoot(), "tests", "plugins", `${name}.so`));
  }

  unloadPlugin(name) {
    return this.cli("plugins", "unload", name);
  }

  // POST /api/METHOD from Node (loopback, with the bearer); resolves with the value, throws on an error.
  async call(method, payload = {}) {
    return postApi(this.origin, this.token, method, payload);
  }

  async stop(graceMs = 5000) {
    const c = this.child;
    if (c && c.exitCode === null && c.signalCode === null) {
      c.kill("SIGTERM");
      try {
        await withTimeout(this.exited, graceMs, "agenthost to stop");
      } catch {
        c.kill("SIGKILL");
        await withTimeout(this.exited, 5000, "agenthost to die after SIGKILL");
      }
    }
    for (const d of this.dirs.splice(0)) await removeDir(d);
  }
}

// A page at ORIGIN (the host's) with the harness set up: window.remoteTest (remote-page.mjs) with its host
// stream open. The document is remote.js itself as the host serves it (a real response, so Chromium's
// local-network checks see the host's own address, and the UI's CSP applies: 'self' scripts and
// connections only); remote-page.mjs is handed over by routing. Console messages go to page.consoleLines.
export async function openHarness(context, origin, token) {
  const page = await context.newPage();
  page.consoleLines = [];
  page.on("console", (m) => page.consoleLines.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => page.consoleLines.push(`pageerror: ${e.message}`));
  const harness = await readFile(join(HERE, "remote-page.mjs"), "utf8");
  await page.route(`${origin}/__remote-test__/**`, (route) => {
    const path = new URL(route.request().url()).pathname;
    if (path === "/__remote-test__/remote-page.mjs")
      return route.fulfill({ status: 200, contentType: "text/javascript; charset=utf-8", body: harness });
    return route.fulfill({ status: 404, body: "" });
  });
  const res = await page.goto(`${origin}/remote.js`);
  if (res?.status() !== 200) throw new Error(`GET ${origin}/remote.js: HTTP ${res?.status()}`);
  await page.evaluate(`import("/__remote-test__/remote-page.mjs").then((m) => m.setup(${JSON.stringify(token)}))`);
  return page;
}

// Runs FN (source text: no closures) in PAGE as FN(window.remoteTest, ARG); resolves with its result. A
// string expression, so the page's CSP (no eval) does not apply.
export function inPage(page, fn, arg) {
  return page.evaluate(`(${fn.toString()})(window.remoteTest, ${JSON.stringify(arg ?? null)})`);
}
