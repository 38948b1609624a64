// Helpers for the ACP integration tests: spawn the real `agenthost acp` binary with a temporary state
// directory, connect the official ACP SDK's client side to its stdio, and record everything that crosses
// the pipes so that tests can assert on the wire order of messages.
//
// Every wait is bounded and fails with a message that says what was awaited (and the end of the child's
// stderr). Every process and temporary directory a test creates is reclaimed by the test's own `after`
// hook, also when the test fails; an exit hook kills whatever is still running as a last resort.
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { existsSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import assert from "node:assert/strict";
import * as acp from "@agentclientprotocol/sdk";
import { agenthostPath, sleep } from "../common.mjs";

export { acp };

export { agenthostPath, sleep };

/** Races `promise` against a timer; the timeout error names `what`. */
export async function withTimeout(promise, ms, what, detail = () => "") {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const extra = detail();
      reject(new Error(`timed out after ${ms} ms waiting for ${what}${extra ? `\n${extra}` : ""}`));
    }, ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Polls `predicate` every 10 ms until it returns a truthy value (returned), or fails after `ms`. */
export async function waitFor(predicate, ms, what, detail = () => "") {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = predicate();
    if (v) return v;
    if (Date.now() >= deadline) {
      const extra = detail();
      throw new Error(`timed out after ${ms} ms waiting for ${what}${extra ? `\n${extra}` : ""}`);
    }
    await sleep(10);
  }
}

/** Asserts that `promise` rejects with a JSON-RPC error of `code` (and a message matching `messageRe`). */
export async function expectRpcError(promise, code, messageRe, what = "") {
  let error;
  try {
    const value = await promise;
    assert.fail(`${what || "request"}: expected JSON-RPC error ${code}, got result ${JSON.stringify(value)}`);
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e;
    error = e;
  }
  assert.equal(
    error?.code,
    code,
    `${what || "request"}: expected JSON-RPC error ${code}, got ${error?.code} ${JSON.stringify(error?.message)}`,
  );
  if (messageRe) {
    assert.match(String(error.message), messageRe, `${what || "request"}: error message`);
  }
  return error;
}

const live = new Set(); // every child still running, killed on exit as a last resort
process.on("exit", () => {
  for (const child of live) {
    try {
      process.kill(child.pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
});

/** True when the JSON value is a JSON-RPC 2.0 request, notification or response. */
export function isJsonRpcMessage(m) {
  if (typeof m !== "object" || m === null || Array.isArray(m) || m.jsonrpc !== "2.0") return false;
  const idOk = (id) => id === null || typeof id === "string" || (typeof id === "number" && Number.isFinite(id));
  if (typeof m.method === "string") return !("id" in m) || idOk(m.id);
  if (!("id" in m) || !idOk(m.id) || "method" in m) return false;
  const hasResult = Object.hasOwn(m, "result");
  const hasError = Object.hasOwn(m, "error");
  if (hasResult === hasError) return false;
  if (hasError) {
    const e = m.error;
    return typeof e === "object" && e !== null && Number.isInteger(e.code) && typeof e.message === "string";
  }
  return true;
}

/**
 * A per-test context: temporary directories and agent processes, all reclaimed by one `after` hook of the
 * test `t` (processes first, then the directories).
 */
export function scope(t) {
  const dirs = [];
  const agents = [];
  t.after(async () => {
    for (const a of agents) await a.kill();
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });
  return {
    /** A new empty directory (absolute path), removed after the test. */
    async tempDir(prefix = "ah-acp-") {
      const d = await mkdtemp(join(tmpdir(), prefix));
      dirs.push(d);
      return d;
    },
    /** Spawns `agenthost --state-dir DIR acp` (options go before the command) and connects the SDK to it. */
    async spawnAgent(options = {}) {
      const stateDir = options.stateDir ?? (await this.tempDir("ah-acp-state-"));
      const a = new AgentProcess({ ...options, stateDir, home: options.home ?? (await this.tempDir("ah-acp-home-")) });
      agents.push(a);
      return a;
    },
  };
}

/**
 * One `agenthost acp` child with an SDK client connection.
 *
 * - `wire`: every message read from stdout, in order: {i, msg, at} (at = ms since spawn)
 * - `sent`: every message written to stdin, in order: {msg, at}
 * - `lines`: every raw stdout line (for the stdout-purity check)
 * - `updates`: the `session/update` params the SDK delivered to the client handler
 * - `permissions`: the `session/request_permission` calls ({params, signal, answered, aborted})
 * - `onPermission`: the handler of the next permission requests (default: answer `cancelled`)
 */
export class AgentProcess {
  constructor({ stateDir, home, args = [], env = {}, logLevel = "info" }) {
    this.stateDir = stateDir;
    this.t0 = performance.now();
    this.wire = [];
    this.sent = [];
    this.lines = [];
    this.updates = [];
    this.permissions = [];
    this.stderr = "";
    this.stdoutEnded = false;
    this.onPermission = async () => ({ outcome: { outcome: "cancelled" } });
    // The editor's files (used only when initialize advertised fs): {params} → the answer, or a throw.
    this.fsCalls = [];
    this.onReadTextFile = async () => {
      throw new Error("fs/read_text_file: not advertised");
    };
    this.onWriteTextFile = async () => {
      throw new Error("fs/write_text_file: not advertised");
    };
    // The editor's terminal (used only when initialize advertised it): method name → handler(params).
    this.terminalCalls = [];
    this.terminal = {};
    this.exit = null;

    const childEnv = {};
    for (const [k, v] of Object.entries(process.env)) {
      if (!k.startsWith("AGENTHOST_") && k !== "XDG_RUNTIME_DIR") childEnv[k] = v;
    }
    // No configuration file of the machine's user: the XDG config home is an empty temporary directory.
    childEnv.XDG_CONFIG_HOME = home;
    Object.assign(childEnv, env);

    const argv = ["--state-dir", stateDir, "--log-level", logLevel, ...args, "acp"];
    this.child = spawn(agenthostPath(), argv, { stdio: ["pipe", "pipe", "pipe"], env: childEnv });
    live.add(this.child);
    this.exited = new Promise((resolveExit) => {
      this.child.on("exit", (code, signal) => {
        this.exit = { code, signal, at: this.now() };
        live.delete(this.child);
        resolveExit(this.exit);
      });
      this.child.on("error", (err) => {
        this.exit = { code: null, signal: null, error: err, at: this.now() };
        live.delete(this.child);
        resolveExit(this.exit);
      });
    });
    this.child.stderr.setEncoding("utf8");
    this.child.stderr.on("data", (s) => {
      this.stderr += s;
      if (this.stderr.length > 256 * 1024) this.stderr = this.stderr.slice(-128 * 1024);
    });
    this.child.stdin.on("error", () => {}); // EPIPE after the child exited: the test sees the exit instead

    // stdout: tap every line, then hand the bytes to the SDK's ndjson reader.
    let partial = "";
    const decoder = new TextDecoder();
    const tapLine = (line) => {
      this.lines.push(line);
      if (line.trim() === "") return;
      let msg;
      try {
        msg = JSON.parse(line);
      } catch {
        msg = undefined;
      }
      this.wire.push({ i: this.wire.length, msg, raw: line, at: this.now() });
    };
    // The SDK may cancel its reader (connection closed) before stdout ends: the tap goes on recording.
    let readerGone = false;
    const input = new ReadableStream({
      start: (controller) => {
        this.child.stdout.on("data", (chunk) => {
          partial += decoder.decode(chunk, { stream: true });
          let nl;
          while ((nl = partial.indexOf("\n")) >= 0) {
            tapLine(partial.slice(0, nl));
            partial = partial.slice(nl + 1);
          }
          if (!readerGone) controller.enqueue(new Uint8Array(chunk));
        });
        this.child.stdout.on("end", () => {
          if (partial !== "") tapLine(partial);
          partial = "";
          this.stdoutEnded = true;
          if (!readerGone) {
            readerGone = true;
            controller.close();
          }
        });
        this.child.stdout.on("error", (e) => {
          if (!readerGone) {
            readerGone = true;
            controller.error(e);
          }
        });
      },
      cancel: () => {
        readerGone = true;
      },
    });
    const sentDecoder = new TextDecoder();
    const output = new WritableStream({
      write: (chunk) => {
        for (const line of sentDecoder.decode(chunk).split("\n")) {
          if (line.trim() === "") continue;
          try {
            this.sent.push({ msg: JSON.parse(line), at: this.now() });
          } catch {
            this.sent.push({ msg: undefined, raw: line, at: this.now() });
          }
        }
        if (this.child.stdin.destroyed || this.child.stdin.writableEnded) {
          return Promise.reject(new Error("agenthost's stdin is closed"));
        }
        return new Promise((res, rej) => this.child.stdin.write(chunk, (e) => (e ? rej(e) : res())));
      },
    });

    const app = acp
      .client({ name: "agenthost-tests" })
      .onNotification(acp.methods.client.session.update, ({ params }) => {
        this.updates.push({ ...params, at: this.now() });
      })
      .onRequest(acp.methods.client.session.requestPermission, async ({ params, signal }) => {
        const record = { params, signal, aborted: false, answered: undefined, at: this.now() };
        signal.addEventListener("abort", () => {
          record.aborted = true;
        });
        this.permissions.push(record);
        const answer = await this.onPermission(record);
        record.answered = answer;
        return answer;
      })
      .onRequest(acp.methods.client.fs.readTextFile, async ({ params }) => {
        this.fsCalls.push({ method: "read", params, at: this.now() });
        return this.onReadTextFile(params);
      })
      .onRequest(acp.methods.client.fs.writeTextFile, async ({ params }) => {
        this.fsCalls.push({ method: "write", params, at: this.now() });
        return this.onWriteTextFile(params);
      });
    for (const [key, method] of Object.entries(acp.methods.client.terminal)) {
      app.onRequest(method, async ({ params }) => {
        this.terminalCalls.push({ method, params, at: this.now() });
        if (!this.terminal[key]) throw new Error(`${method}: not advertised`);
        return this.terminal[key](params);
      });
    }
    this.connection = app.connect(acp.ndJsonStream(output, input));
    this.agent = this.connection.agent;
  }

  now() {
    return Math.round((performance.now() - this.t0) * 10) / 10;
  }

  /** The last `n` characters of stderr, for error messages. */
  stderrTail(n = 2000) {
    const s = this.stderr.length > n ? `…${this.stderr.slice(-n)}` : this.stderr;
    return `agenthost stderr (tail):\n${s}`;
  }

  /** Sends a request through the SDK; fails after `ms` with a message naming the method. */
  request(method, params, ms = 10000) {
    return withTimeout(this.agent.request(method, params), ms, `the response to ${method}`, () =>
      this.stderrTail(),
    );
  }

  notify(method, params) {
    return this.agent.notify(method, params);
  }

  /** `initialize` with the given protocol version and a client that offers no fs/terminal capability
   * (or the `fs` given, as Zed offers it: {readTextFile: true, writeTextFile: true}). */
  initialize(protocolVersion = 1, fs = { readTextFile: false, writeTextFile: false }, terminal = false) {
    return this.request(acp.methods.agent.initialize, {
      protocolVersion,
      clientCapabilities: { fs, terminal },
      clientInfo: { name: "agenthost-tests", title: "agenthost integration tests", version: "0" },
    });
  }

  /** `session/new` with an absolute cwd and no MCP servers; returns the session id. */
  async newSession(cwd) {
    const r = await this.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    assert.equal(typeof r?.sessionId, "string", `session/new result ${JSON.stringify(r)}`);
    assert.ok(r.sessionId.length > 0, "session/new: empty sessionId");
    return r.sessionId;
  }

  /** `session/prompt` with a text (or content blocks). */
  prompt(sessionId, text, ms = 10000) {
    const prompt = typeof text === "string" ? [{ type: "text", text }] : text;
    return this.request(acp.methods.agent.session.prompt, { sessionId, prompt }, ms);
  }

  cancel(sessionId) {
    return this.notify(acp.methods.agent.session.cancel, { sessionId });
  }

  /** The outgoing request (as written to stdin) that matches `pred`: {msg, at}. */
  sentRequest(method, pred = () => true) {
    return this.sent.find((s) => s.msg?.method === method && "id" in s.msg && pred(s.msg));
  }

  /** Wire entries that answer the request with JSON-RPC id `id`. */
  responsesTo(id) {
    return this.wire.filter((w) => w.msg && !("method" in w.msg) && w.msg.id === id);
  }

  /** Wire index of the (first) response to the sent request matching method/pred; -1 when absent. */
  responseIndex(method, pred = () => true) {
    const req = this.sentRequest(method, pred);
    if (!req) return -1;
    const r = this.responsesTo(req.msg.id);
    return r.length ? r[0].i : -1;
  }

  /** `session/update` notifications on the wire (in order): [{i, at, sessionId, update}]. */
  wireUpdates(sessionId) {
    return this.wire
      .filter((w) => w.msg?.method === "session/update" && (!sessionId || w.msg.params?.sessionId === sessionId))
      .map((w) => ({ i: w.i, at: w.at, sessionId: w.msg.params?.sessionId, update: w.msg.params?.update }));
  }

  /** Concatenated agent_message_chunk text of updates on the wire between indexes [from, to). */
  agentText(sessionId, from = 0, to = Infinity) {
    return this.wireUpdates(sessionId)
      .filter((u) => u.i >= from && u.i < to && u.update?.sessionUpdate === "agent_message_chunk")
      .map((u) => (u.update.content?.type === "text" ? u.update.content.text : ""))
      .join("");
  }

  /** Waits until the SDK has delivered `n` permission requests; returns the n-th. */
  waitPermission(n = 1, ms = 5000) {
    return waitFor(() => this.permissions[n - 1], ms, `session/request_permission #${n}`, () => this.stderrTail());
  }

  /** Every non-empty stdout line must be one JSON-RPC 2.0 message. */
  assertStdoutPure() {
    for (const line of this.lines) {
      if (line.trim() === "") continue;
      let m;
      try {
        m = JSON.parse(line);
      } catch {
        assert.fail(`stdout carried a line that is not JSON: ${JSON.stringify(line.slice(0, 300))}`);
      }
      assert.ok(isJsonRpcMessage(m), `stdout carried JSON that is not a JSON-RPC 2.0 message: ${line.slice(0, 300)}`);
    }
  }

  /**
   * Every `session/update` and `session/request_permission` on the wire was accepted by the SDK (its
   * schema check passed): the SDK drops an update whose params do not parse and answers -32602 to a
   * permission request that does not parse, so the handlers' counts must match the wire's.
   */
  async assertSdkAccepted(ms = 2000) {
    const wireUpdates = () => this.wire.filter((w) => w.msg?.method === "session/update").length;
    const wirePerms = () => this.wire.filter((w) => w.msg?.method === "session/request_permission").length;
    try {
      await waitFor(
        () => this.updates.length === wireUpdates() && this.permissions.length === wirePerms(),
        ms,
        "the SDK to accept every session/update and session/request_permission",
      );
    } catch {
      const seen = new Set(this.updates.map((u) => JSON.stringify(u.update)));
      const rejected = this.wire
        .filter((w) => w.msg?.method === "session/update" && !seen.has(JSON.stringify(w.msg.params?.update)))
        .map((w) => w.raw.slice(0, 400));
      assert.fail(
        `the SDK rejected messages as not matching the ACP v1 schema: updates ${this.updates.length}/${wireUpdates()}, ` +
          `permission requests ${this.permissions.length}/${wirePerms()}; first rejected: ${rejected[0] ?? "(a permission request)"}`,
      );
    }
  }

  /** Closes stdin (EOF) without killing. */
  closeStdin() {
    if (!this.child.stdin.writableEnded) this.child.stdin.end();
  }

  /** Waits for the process to exit by itself; returns {code, signal, at}. */
  waitExit(ms = 5000) {
    return withTimeout(this.exited, ms, `agenthost (pid ${this.child.pid}) to exit`, () => this.stderrTail());
  }

  /** Reclaims the process: EOF, then SIGTERM, then SIGKILL; always waits for the exit (bounded). */
  async kill() {
    this.connection.close();
    if (this.exit) return this.exit;
    this.closeStdin();
    const gone = (ms) => Promise.race([this.exited, sleep(ms).then(() => null)]);
    if (await gone(500)) return this.exit;
    try {
      this.child.kill("SIGTERM");
    } catch {
      // gone
    }
    if (await gone(2000)) return this.exit;
    try {
      this.child.kill("SIGKILL");
    } catch {
      // gone
    }
    await gone(5000);
    return this.exit;
  }
}

/** The process whose pid is `pid` still exists (a zombie waiting to be reaped counts as gone). */
export function processExists(pid) {
  try {
    process.kill(pid, 0);
  } catch (e) {
    return e.code === "EPERM";
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return true;
  }
}

export function fileExists(dir, name) {
  return existsSync(resolve(dir, name));
}
