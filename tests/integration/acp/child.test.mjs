// The `acp` provider (the ACP child backend): agenthost runs an external ACP v1 agent as a child for every
// turn. The child is tests/integration/acp/child-agent.mjs, written with the official SDK's agent side; the
// host is driven through `agenthost sdk` (docs/protocols/sdk.md) with a configuration whose default provider
// is `[provider.child] type = acp`. Tags: PROTOCOLS.md ACP-CHILD-CAPABILITIES, ACP-CHILD-START,
// ACP-CHILD-ENV-POLICY / MERGE, ACP-CHILD-CANCEL; SECURITY.md T7 (C01).
//
// Every wait is bounded; every host process and temporary directory is reclaimed by the test that made it.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync, readFileSync, existsSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const AGENTHOST = process.env.AH_TEST_AGENTHOST ?? join(process.env.AH_TEST_BUILD_ROOT ?? "build", "host", "agenthost");
const SOURCE_ROOT = resolve(process.env.AH_TEST_SOURCE_ROOT ?? join(import.meta.dirname, "..", "..", ".."));
const CHILD_AGENT = join(SOURCE_ROOT, "tests", "integration", "acp", "child-agent.mjs");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const hosts = new Set();
after(async () => {
  for (const h of hosts) await h.stop();
});

function alive(pid) {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  // A zombie no longer runs; it only waits for its parent (which reaps it soon).
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

async function waitGone(pid, ms, what) {
  const deadline = Date.now() + ms;
  while (alive(pid)) {
    if (Date.now() > deadline) assert.fail(`${what}: process ${pid} still runs after ${ms} ms`);
    await sleep(20);
  }
}

async function waitFor(pred, ms, what, detail = () => "") {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = pred();
    if (v) return v;
    if (Date.now() > deadline) assert.fail(`timed out after ${ms} ms waiting for ${what}\n${detail()}`);
    await sleep(10);
  }
}

/** One `agenthost sdk` process with an acp provider named `child`, spoken to over JSON Lines. */
class Host {
  /**
   * provider: extra `key = value` lines of [provider.child]; args: extra args of the child (after the script);
   * env: extra variables of the host's environment.
   */
  static async start({ provider = [], args = [], env = {}, ini = "", initProvider } = {}) {
    const h = new Host();
    h.dir = mkdtempSync(join(tmpdir(), "ah-acp-child-"));
    h.pidFile = join(h.dir, "pids");
    h.cwd = join(h.dir, "work");
    mkdirSync(h.cwd);
    const childArgs = [CHILD_AGENT, `--pid-file=${h.pidFile}`, ...args].join(", ");
    const config = [
      "[host]",
      "default_provider = child",
      "[provider.child]",
      "type = acp",
      "command = node",
      `args = ${childArgs}`,
      ...provider,
      ini,
      "",
    ].join("\n");
    writeFileSync(join(h.dir, "config.ini"), config);
    h.proc = spawn(
      AGENTHOST,
      ["--state-dir", join(h.dir, "state"), "--runtime-dir", join(h.dir, "state", "run"), "--config", join(h.dir, "config.ini"), "sdk"],
      { env: { ...process.env, ...env }, stdio: ["pipe", "pipe", "pipe"] },
    );
    hosts.add(h);
    h.stderr = "";
    h.proc.stderr.on("data", (d) => (h.stderr += d));
    h.exited = new Promise((r) => h.proc.on("close", (code, sig) => r({ code, sig })));
    h.nextId = 1;
    h.pending = new Map();
    h.events = []; // stored events, in arrival order
    h.questions = []; // request/question server requests
    h.stdoutLines = [];
    createInterface({ input: h.proc.stdout }).on("line", (line) => h.onLine(line));
    const init = await h.call("initialize", { cwd: h.cwd, capabilities: { requests: true }, ...(initProvider ? { provider: initProvider } : {}) });
    assert.equal(init.protocolVersion, 1);
    return h;
  }

  onLine(line) {
    this.stdoutLines.push(line);
    const msg = JSON.parse(line); // stdout carries protocol only: any other line fails the test here
    if (msg.method === "session.event") this.events.push(msg.params.event);
    else if (msg.method === "request/question") this.questions.push(msg);
    else if (msg.id !== undefined && !msg.method) {
      const p = this.pending.get(msg.id);
      this.pending.delete(msg.id);
      if (p) msg.error ? p.reject(Object.assign(new Error(msg.error.message), msg.error)) : p.resolve(msg.result);
    }
  }

  send(obj) {
    this.proc.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...obj }) + "\n");
  }

  call(method, params, ms = 15000) {
    const id = this.nextId++;
    const p = new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
    this.send({ id, method, params });
    let timer;
    const t = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer to ${method} within ${ms} ms\n${this.tail()}`)), ms);
    });
    return Promise.race([p, t]).finally(() => clearTimeout(timer));
  }

  tail() {
    return `host stderr (end):\n${this.stderr.split("\n").slice(-(Number(process.env.AH_TEST_TAIL) || 25)).join("\n")}`;
  }

  /** Queue a prompt; returns {sessionId, messageId}. */
  prompt(textOrContent, sessionId) {
    const params = typeof textOrContent === "string" ? { text: textOrContent } : { content: textOrContent };
    if (sessionId) params.sessionId = sessionId;
    return this.call("session/prompt", params);
  }

  /** Wait for the turn of `messageId` to end: {reason, error, texts: committed texts, ended: count}. */
  async turn(messageId, ms = 20000) {
    const started = await waitFor(
      () => this.events.find((e) => e.kind === "turn/started" && e.messageId === messageId),
      ms,
      `turn/started of ${messageId}`,
      () => this.tail(),
    );
    const ended = await waitFor(
      () => this.events.find((e) => e.kind === "turn/ended" && e.messageId === messageId),
      ms,
      `turn/ended of ${messageId}`,
      () => this.tail(),
    );
    const texts = this.events.filter((e) => e.kind === "message/committed" && e.turnId === started.turnId).map((e) => e.data.text);
    const endedCount = this.events.filter((e) => e.kind === "turn/ended" && e.messageId === messageId).length;
    return { reason: ended.data.reason, error: ended.data.error, texts, endedCount, turnId: started.turnId };
  }

  /** Prompt and wait for the end of its turn. */
  async run(text, sessionId) {
    const r = await this.prompt(text, sessionId);
    return { ...(await this.turn(r.messageId)), sessionId: r.sessionId, messageId: r.messageId };
  }

  pids() {
    if (!existsSync(this.pidFile)) return [];
    return readFileSync(this.pidFile, "utf8").split("\n").filter(Boolean).map(Number);
  }

  async stop() {
    if (!hosts.has(this)) return;
    hosts.delete(this);
    let killed = false;
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.stdin.end(); // the sdk surface stops the host on stdin EOF
      const t = setTimeout(() => {
        killed = true;
        this.proc.kill("SIGKILL");
      }, 10000);
      await this.exited;
      clearTimeout(t);
    }
    const { code, sig } = await this.exited;
    rmSync(this.dir, { recursive: true, force: true });
    // A clean stop (also under ASan: a leak makes the exit status non-zero).
    assert.ok(!killed, `the host did not stop within 10 s of stdin EOF\n${this.tail()}`);
    assert.equal(code, 0, `the host exited with ${code ?? sig}\n${this.tail()}`);
  }
}

function info(text) {
  return JSON.parse(text);
}

describe("acp-child", () => {
  test("ACP-CHILD-START / ACP-CHILD-CANCEL through `agenthost acp`: an editor on the SDK's client side drives a child agent", async () => {
    // The whole chain: editor (official SDK, client side) → agenthost acp → acp provider → child agent.
    const dir = mkdtempSync(join(tmpdir(), "ah-acp-child-editor-"));
    const pidFile = join(dir, "pids");
    const cfg = join(dir, "config.ini");
    writeFileSync(
      cfg,
      ["[host]", "default_provider = child", "[provider.child]", "type = acp", "command = node", `args = ${CHILD_AGENT}, --pid-file=${pidFile}`, ""].join("\n"),
    );
    const proc = spawn(AGENTHOST, ["--state-dir", join(dir, "state"), "--runtime-dir", join(dir, "state", "run"), "--config", cfg, "acp"], {
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stderr = "";
    proc.stderr.on("data", (d) => (stderr += d));
    const exited = new Promise((r) => proc.on("close", (code, sig) => r({ code, sig })));
    const updates = [];
    const permissions = [];
    const conn = acp
      .client({ name: "acp-child-test" })
      .onNotification("session/update", ({ params }) => {
        updates.push(params);
      })
      .onRequest(acp.methods.client.session.requestPermission, async ({ params }) => {
        // The child's own permission request reaches the editor with the child's option names as answers.
        permissions.push(params);
        const opt = params.options.find((o) => o.name === (permissions.length === 1 ? "Allow once" : "Reject"));
        return { outcome: { outcome: "selected", optionId: opt.optionId } };
      })
      .connect(acp.ndJsonStream(Writable.toWeb(proc.stdin), Readable.toWeb(proc.stdout)));
    const texts = (sid) =>
      updates
        .filter((u) => u.sessionId === sid && u.update.sessionUpdate === "agent_message_chunk")
        .map((u) => u.update.content.text)
        .join("");
    const bounded = (p, what) => {
      let timer;
      const t = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer to ${what} within 20 s\n${stderr.slice(-3000)}`)), 20000);
      });
      return Promise.race([p, t]).finally(() => clearTimeout(timer));
    };
    try {
      const init = await bounded(conn.agent.request("initialize", { protocolVersion: 1, clientCapabilities: {} }), "initialize");
      assert.equal(init.protocolVersion, 1);
      const { sessionId } = await bounded(conn.agent.request("session/new", { cwd: dir, mcpServers: [] }), "session/new");
      const r1 = await bounded(
        conn.agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "echo hello through two ACP hops" }] }),
        "session/prompt",
      );
      assert.equal(r1.stopReason, "end_turn");
      assert.equal(texts(sessionId), "hello through two ACP hops");

      const before = updates.length;
      const pending = conn.agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "slow 100 50" }] });
      await waitFor(() => readFileSync(pidFile, "utf8").split("\n").filter(Boolean).length === 2, 10000, "the second child");
      await waitFor(() => /run 2 [^\n]*ready/.test(stderr), 10000, "the second child's handshake");
      await sleep(400);
      await conn.agent.notify("session/cancel", { sessionId });
      const r2 = await bounded(pending, "the cancelled prompt");
      assert.equal(r2.stopReason, "cancelled", "cancelled exactly as ACP says, never an error");
      const partial = updates
        .slice(before)
        .filter((u) => u.update.sessionUpdate === "agent_message_chunk")
        .map((u) => u.update.content.text)
        .join("");
      assert.match(partial, /^chunk 1 chunk 2 /, "the text so far reaches the editor");
      assert.doesNotMatch(partial, /chunk 100 /);
      // A child's permission request is asked of the editor (ACP-OUTPUT-PERMISSION over the question the
      // provider makes of it): the first answered "Allow once", the second "Reject".
      for (const [n, want] of [[1, "permission: allow"], [2, "permission: reject"]]) {
        const at = updates.length;
        const r = await bounded(
          conn.agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "permission touch a file" }] }),
          `the permission prompt #${n}`,
        );
        assert.equal(r.stopReason, "end_turn");
        assert.equal(permissions.length, n, "one request_permission per child request");
        const p = permissions[n - 1];
        assert.equal(p.sessionId, sessionId);
        assert.match(p.toolCall.title, /touch a file/);
        assert.deepEqual(
          p.options.map((o) => [o.name, o.kind]),
          [["Allow once", "allow_once"], ["Reject", "reject_once"]],
          "the child's options, with kinds read from their names",
        );
        const text = updates
          .slice(at)
          .filter((u) => u.update.sessionUpdate === "agent_message_chunk")
          .map((u) => u.update.content.text)
          .join("");
        assert.equal(text, want, "the child got the editor's choice");
      }
      const pids = readFileSync(pidFile, "utf8").split("\n").filter(Boolean).map(Number);
      assert.equal(new Set(pids).size, 4, "a fresh child per prompt");
      for (const pid of pids) await waitGone(pid, 10000, "a child of agenthost acp");
    } finally {
      proc.stdin.end();
      const t = setTimeout(() => proc.kill("SIGKILL"), 10000);
      const { code } = await exited;
      clearTimeout(t);
      rmSync(dir, { recursive: true, force: true });
      assert.equal(code, 0, `agenthost acp exited with ${code}\n${stderr.slice(-3000)}`);
    }
  });

  test("ACP-CHILD-START: every run is a fresh child with its own lifecycle id; each child is gone after its turn", async () => {
    const h = await Host.start();
    try {
      const a = await h.run("info");
      assert.equal(a.reason, "end", h.tail());
      const b = await h.run("info", a.sessionId);
      assert.equal(b.reason, "end", h.tail());
      const pa = info(a.texts.join("")).pid;
      const pb = info(b.texts.join("")).pid;
      assert.notEqual(pa, pb, "two runs, two processes");
      assert.deepEqual(h.pids(), [pa, pb], "one spawn per run");
      await waitGone(pa, 10000, "the first child");
      await waitGone(pb, 10000, "the second child");
      // The lifecycle ids are logged: spawn, ready, end and exit of each run.
      for (const id of [1, 2]) {
        assert.match(h.stderr, new RegExp(`run ${id} \\(provider child, session ${a.sessionId}\\): spawned node`));
        assert.match(h.stderr, new RegExp(`run ${id} \\(provider child, session [^)]*\\): ready`));
        await waitFor(() => new RegExp(`run ${id} \\([^)]*\\): child \\d+ exited \\(status 0\\)`).test(h.stderr), 10000, `the exit of run ${id} in the log`);
      }
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-START: the assistant text is streamed and committed once; stop reasons map onto turn ends", async () => {
    const h = await Host.start();
    try {
      const e = await h.run("echo hello from the child");
      assert.equal(e.reason, "end");
      assert.deepEqual(e.texts, ["hello from the child"], "one commit of the whole text");
      const cases = [
        ["stop max_tokens", "max-tokens"],
        ["stop max_turn_requests", "max-tokens"],
        ["stop refusal", "refusal"],
      ];
      for (const [prompt, reason] of cases) {
        const r = await h.run(prompt, e.sessionId);
        assert.equal(r.reason, reason, prompt);
        assert.deepEqual(r.texts, ["stopping"], prompt);
      }
      const bogus = await h.run("stop sideways", e.sessionId);
      assert.equal(bogus.reason, "error");
      assert.match(bogus.error, /unknown stopReason "sideways"/);
      const err = await h.run("error the model is on fire", e.sessionId);
      assert.equal(err.reason, "error", "a JSON-RPC error of session/prompt is an error, never a fake success");
      assert.match(err.error, /the ACP agent failed the prompt: the model is on fire \(code -32603\)/);
      assert.deepEqual(err.texts, []);
      // fs/* and terminal/* are not advertised and answered -32601.
      const fs = await h.run("fs", e.sessionId);
      assert.deepEqual(fs.texts, ["fs: -32601"]);
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-START: a child that dies mid-turn ends the turn `error` with its status, keeping the text so far", async () => {
    const h = await Host.start();
    try {
      const r = await h.run("exit 7");
      assert.equal(r.reason, "error");
      assert.match(r.error, /the ACP agent exited \(status 7\) during the prompt/);
      assert.deepEqual(r.texts, ["bye"]);
      await waitGone(h.pids()[0], 10000, "the child");
      // The host goes on: the next turn gets a new child.
      const next = await h.run("echo again", r.sessionId);
      assert.equal(next.reason, "end");
      assert.deepEqual(next.texts, ["again"]);
    } finally {
      await h.stop();
    }
  });

  for (const [mode, re] of [
    ["initialize-error", /the ACP agent failed initialize: the test agent refuses to initialize \(code -32603\)/],
    ["initialize-exit", /the ACP agent exited \(status 3\) during initialize/],
    ["version", /the ACP agent failed initialize: it speaks ACP protocol version 2, agenthost speaks 1/],
    ["session-error", /the ACP agent failed session\/new: the test agent refuses session\/new \(code -32603\)/],
    ["session-exit", /the ACP agent exited \(status 4\) during session\/new/],
  ]) {
    test(`ACP-CHILD-START: a failed handshake (${mode}) fails the prompt and reclaims the child`, async () => {
      const h = await Host.start({ args: [`--fail=${mode}`] });
      try {
        const r = await h.run("echo never");
        assert.equal(r.reason, "error", "never a fake success");
        assert.match(r.error, re);
        assert.deepEqual(r.texts, [], "nothing was committed");
        assert.equal(h.pids().length, 1);
        await waitGone(h.pids()[0], 10000, "the child of a failed handshake");
      } finally {
        await h.stop();
      }
    });
  }

  test("ACP-CHILD-START: a handshake that never completes times out and the child is killed (group, SIGTERM→SIGKILL)", async () => {
    const h = await Host.start({ args: ["--fail=initialize-hang", "--stubborn"], provider: ["handshake_timeout_ms = 300"] });
    try {
      const t0 = Date.now();
      const r = await h.run("echo never");
      assert.equal(r.reason, "error");
      assert.match(r.error, /did not answer initialize within 300 ms/);
      // stdin EOF is ignored, and so is SIGTERM: only the SIGKILL after the grace ends it (1 s + 2 s).
      await waitGone(h.pids()[0], 15000, "a child that ignores EOF and SIGTERM");
      assert.ok(Date.now() - t0 < 15000);
      await waitFor(() => /still running 1000 ms after stdin EOF: SIGTERM/.test(h.stderr), 5000, "the escalation in the log");
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-START: a cancel during the handshake ends the turn `cancelled` and reclaims the child", async () => {
    const h = await Host.start({ args: ["--fail=initialize-hang"] });
    try {
      const p = await h.prompt("echo never");
      await waitFor(() => h.pids().length === 1, 10000, "the child's start");
      const c = await h.call("session/cancel", { sessionId: p.sessionId });
      assert.equal(c.cancelled, true);
      const r = await h.turn(p.messageId);
      assert.equal(r.reason, "cancelled");
      assert.deepEqual(r.texts, []);
      await waitGone(h.pids()[0], 10000, "the child cancelled in its handshake");
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-CANCEL: an abort mid-run commits the partial text, ends `cancelled` once, and leaves no process", async () => {
    const h = await Host.start();
    try {
      const p = await h.prompt("slow 100 50");
      await waitFor(() => h.pids().length === 1, 10000, "the child's start");
      await waitFor(() => /ready: pid/.test(h.stderr), 10000, "the handshake");
      await sleep(400); // a few chunks streamed
      const c = await h.call("session/cancel", { sessionId: p.sessionId });
      assert.equal(c.cancelled, true);
      const r = await h.turn(p.messageId);
      assert.equal(r.reason, "cancelled");
      assert.equal(r.endedCount, 1, "the turn ends exactly once");
      assert.equal(r.texts.length, 1, "the text so far is committed");
      assert.match(r.texts[0], /^chunk 1 chunk 2 /);
      assert.doesNotMatch(r.texts[0], /chunk 100 /, "only part of the answer");
      await waitGone(h.pids()[0], 10000, "the cancelled child");
      await sleep(300);
      assert.equal(h.events.filter((e) => e.kind === "turn/ended" && e.messageId === p.messageId).length, 1);
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-CANCEL: a child that ignores stdin EOF and SIGTERM is killed with its process group", async () => {
    const h = await Host.start({ args: ["--stubborn"] });
    try {
      const p = await h.prompt("hang");
      await waitFor(() => /ready: pid/.test(h.stderr), 10000, "the handshake");
      await h.call("session/cancel", { sessionId: p.sessionId });
      const r = await h.turn(p.messageId);
      assert.equal(r.reason, "cancelled");
      await waitGone(h.pids()[0], 15000, "the stubborn child");
    } finally {
      await h.stop();
    }
  });

  for (const stubborn of [false, true]) {
    test(`ACP-CHILD-CANCEL: stopping the host reclaims a running child${stubborn ? " that ignores EOF and SIGTERM" : ""}`, async () => {
      const h = await Host.start({ args: stubborn ? ["--stubborn"] : [] });
      const p = await h.prompt(stubborn ? "hang" : "slow 1000 50");
      await waitFor(() => /ready: pid/.test(h.stderr), 10000, "the handshake");
      const pid = h.pids()[0];
      assert.ok(alive(pid));
      const t0 = Date.now();
      await h.stop(); // asserts a clean exit (status 0; under ASan: nothing leaked)
      // The withdraw escalates faster (300 ms, then 700 ms) so that it ends within the host's deadline.
      assert.doesNotMatch(h.stderr, /did not report done|left child process|kept mapped as a zombie/, h.tail());
      assert.ok(Date.now() - t0 < 5000, "the stop is bounded");
      await waitGone(pid, 10000, "the child of a stopped host");
      assert.ok(p.messageId);
    });
  }

  test("ACP-CHILD-ENV-POLICY / MERGE (SECURITY T7 C01): canaries stay out; explicit env and pass_env get in", async () => {
    const canaries = {
      OPENAI_API_KEY: "sk-CANARY",
      DATABASE_URL: "postgres://u:CANARY@h/d",
      SSH_AUTH_SOCK: "/tmp/CANARY.sock",
      "BASH_FUNC_x%%": "() { echo CANARY; }",
      LD_PRELOAD: "/tmp/CANARY-does-not-exist.so",
      NODE_OPTIONS: "--require=/tmp/CANARY-does-not-exist.js", // would stop node itself if it leaked
      PASSED_VAR: "passed-on-purpose",
      FUNC_PASSED: "() { echo CANARY; }",
    };
    const h = await Host.start({
      env: canaries,
      provider: ["env = CHILD_EXPLICIT=hello, WITH_COMMA=a\\,b, SHELL_FN=() { echo CANARY; }", "pass_env = PASSED_VAR, FUNC_PASSED, NOT_SET_ANYWHERE"],
    });
    try {
      const r = await h.run("info *");
      assert.equal(r.reason, "end", h.tail());
      const env = info(r.texts.join("")).env;
      for (const [k, v] of Object.entries(env)) {
        assert.doesNotMatch(`${k}=${v}`, /CANARY/, `${k} leaked into the child`);
        assert.doesNotMatch(k, /^(BASH_FUNC_|LD_|NODE_OPTIONS$|OPENAI_|DATABASE_URL$|SSH_AUTH_SOCK$)/, `${k} leaked`);
      }
      assert.equal(env.CHILD_EXPLICIT, "hello", "the explicit env of the config");
      assert.equal(env.WITH_COMMA, "a,b", "\\, is a comma inside a list item");
      assert.equal(env.PASSED_VAR, "passed-on-purpose", "pass_env copies a named variable of the host");
      assert.equal(env.SHELL_FN, undefined, "a value starting with () is dropped");
      assert.equal(env.FUNC_PASSED, undefined, "also through pass_env");
      assert.equal(env.NOT_SET_ANYWHERE, undefined);
      assert.equal(env.PATH, process.env.PATH, "the allowlist keeps PATH");
      if (process.env.HOME) assert.equal(env.HOME, process.env.HOME);
      assert.match(h.stderr, /env: SHELL_FN dropped/);
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-CAPABILITIES: cwd is the session's, or the configured one; never the host's", async () => {
    const h = await Host.start();
    try {
      const r = await h.run("info");
      assert.equal(info(r.texts.join("")).cwd, h.cwd, "the session's cwd");
      assert.notEqual(h.cwd, process.cwd());
    } finally {
      await h.stop();
    }
    const other = mkdtempSync(join(tmpdir(), "ah-acp-child-cwd-"));
    const h2 = await Host.start({ provider: [`cwd = ${other}`] });
    try {
      const r = await h2.run("info");
      assert.equal(info(r.texts.join("")).cwd, other, "[provider] cwd wins");
    } finally {
      await h2.stop();
      rmSync(other, { recursive: true, force: true });
    }
  });

  test("ACP-CHILD-CAPABILITIES: a missing cwd fails the turn loudly, naming it, and spawns nothing", async () => {
    const missing = join(tmpdir(), `ah-acp-child-missing-${process.pid}`, "nowhere");
    const h = await Host.start({ provider: [`cwd = ${missing}`] });
    try {
      const r = await h.run("echo never");
      assert.equal(r.reason, "error");
      assert.ok(r.error.includes(`"${missing}" does not exist`), r.error);
      assert.deepEqual(h.pids(), [], "nothing was spawned");
      const notDir = join(h.dir, "config.ini");
      const h2 = await Host.start({ provider: [`cwd = ${notDir}`] });
      try {
        const r2 = await h2.run("echo never");
        assert.equal(r2.reason, "error");
        assert.ok(r2.error.includes(`"${notDir}" is not a directory`), r2.error);
      } finally {
        await h2.stop();
      }
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-CAPABILITIES: a bad configuration fails the turn loudly without a spawn", async () => {
    const h = await Host.start({ provider: ["env = 1BAD=x"] });
    try {
      const r = await h.run("echo never");
      assert.equal(r.reason, "error");
      assert.match(r.error, /\[provider\.child\] env: "1BAD=x" is not NAME=value/);
      assert.deepEqual(h.pids(), []);
    } finally {
      await h.stop();
    }
    const h2 = await Host.start({ ini: "[provider.nocmd]\ntype = acp\n", initProvider: "nocmd" });
    try {
      const r = await h2.run("echo never");
      assert.equal(r.reason, "error");
      assert.match(r.error, /\[provider\.nocmd\] command is required/);
      assert.deepEqual(h2.pids(), []);
    } finally {
      await h2.stop();
    }
    const h3 = await Host.start({ ini: "[provider.gone]\ntype = acp\ncommand = /nonexistent/acp-agent\n", initProvider: "gone" });
    try {
      const r = await h3.run("echo never");
      assert.equal(r.reason, "error");
      assert.match(r.error, /cannot start the ACP agent "\/nonexistent\/acp-agent": no such program/);
    } finally {
      await h3.stop();
    }
  });

  test("ACP-CHILD-CAPABILITIES: only the new user message is sent (text and resource_link), no history", async () => {
    const h = await Host.start();
    try {
      const a = await h.run("echo first");
      const b = await h.run(
        [
          { type: "text", text: "info " },
          { type: "resource_link", uri: "file:///tmp/a.txt", name: "a.txt" },
        ],
        a.sessionId,
      );
      assert.equal(b.reason, "end", h.tail());
      const got = info(b.texts.join(""));
      assert.deepEqual(got.prompt, [
        { type: "text", text: "info " },
        { type: "resource_link", uri: "file:///tmp/a.txt", name: "a.txt" },
      ]);
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-START: session/request_permission maps onto a question with the child's option names", async () => {
    const h = await Host.start();
    try {
      const p = await h.prompt("permission delete the test file");
      const q = await waitFor(() => h.questions[0], 15000, "request/question", () => h.tail());
      assert.equal(q.params.params.question, "The ACP agent asks permission: delete the test file");
      assert.deepEqual(q.params.options, ["Allow once", "Reject"]);
      h.send({ id: q.id, result: { answer: "Allow once" } });
      const r = await h.turn(p.messageId);
      assert.equal(r.reason, "end");
      assert.deepEqual(r.texts, ["permission: allow"]);

      // An answer that is no option never grants; an error answer is a cancellation.
      const p2 = await h.prompt("permission again", r.sessionId ?? p.sessionId);
      const q2 = await waitFor(() => h.questions[1], 15000, "the second request/question");
      h.send({ id: q2.id, result: { answer: "yes please" } });
      const r2 = await h.turn(p2.messageId);
      assert.deepEqual(r2.texts, ["permission: cancelled"]);
      const p3 = await h.prompt("permission and again", p.sessionId);
      const q3 = await waitFor(() => h.questions[2], 15000, "the third request/question");
      h.send({ id: q3.id, error: { code: -32000, message: "no" } });
      const r3 = await h.turn(p3.messageId);
      assert.deepEqual(r3.texts, ["permission: cancelled"]);
    } finally {
      await h.stop();
    }
  });

  test("ACP-CHILD-CANCEL: a cancel while a permission is pending answers it `cancelled` and ends the turn once", async () => {
    const h = await Host.start();
    try {
      const p = await h.prompt("permission wait");
      await waitFor(() => h.questions[0], 15000, "request/question");
      await h.call("session/cancel", { sessionId: p.sessionId });
      const r = await h.turn(p.messageId);
      assert.equal(r.reason, "cancelled");
      assert.equal(r.endedCount, 1);
      await waitGone(h.pids()[0], 10000, "the child");
    } finally {
      await h.stop();
    }
  });

  test("hostile child output (invalid JSON, nesting, an over-long line, ill-typed updates) does not hurt the host", async () => {
    const h = await Host.start();
    try {
      const r = await h.run("garbage");
      assert.equal(r.reason, "end", h.tail());
      assert.deepEqual(r.texts, ["ok"], "only the well-formed chunk of our session counts");
      const next = await h.run("echo still here", r.sessionId);
      assert.deepEqual(next.texts, ["still here"]);
      assert.match(h.stderr, /ACP agent's output: /, "the peer's diagnostics are logged");
    } finally {
      await h.stop();
    }
  });

  test("the child's stderr goes to the host's log and into the error of a failed start, never to stdout", async () => {
    const h = await Host.start({ args: ["--stderr=cannot find the model weights", "--fail=initialize-exit"] });
    try {
      const r = await h.run("echo never");
      assert.equal(r.reason, "error");
      assert.match(r.error, /exited \(status 3\) during initialize; its last stderr line: cannot find the model weights/);
      assert.match(h.stderr, /run 1 \(provider child, session [^)]*\): stderr: cannot find the model weights/);
      assert.ok(h.stdoutLines.length > 0);
      // Every stdout line was parsed as JSON-RPC (onLine); the child's stderr line is none of them.
      for (const line of h.stdoutLines) assert.notEqual(line.trim(), "cannot find the model weights");
    } finally {
      await h.stop();
    }
  });
});
