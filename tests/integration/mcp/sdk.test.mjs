// The SDK's initialize may pass mcpServers (ACP's shape) for the sessions the connection creates: `agenthost
// sdk` over raw JSON lines, the default session created by the first prompt, an MCP tool of server-everything
// called through echo and approved over request/approval.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, rm, mkdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { agenthostPath } from "../common.mjs";
import { everythingStdio, sentToServer, markedPids } from "./servers.mjs";

test("SDK-TS-RUN: initialize's mcpServers are attached to the default session; a tool runs after approval", { timeout: 60000 }, async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "ah-sdk-mcp-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const work = join(dir, "work");
  await mkdir(work);
  const log = join(dir, "ev.log");
  const ev = everythingStdio("ev", log);
  const child = spawn(agenthostPath(), ["--state-dir", join(dir, "state"), "sdk"], {
    stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, XDG_CONFIG_HOME: dir } });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((r) => child.on("exit", r));
  t.after(async () => {
    child.kill("SIGKILL");
    await exited;
  });
  const send = (m) => child.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...m }) + "\n");
  const seen = [];
  let buf = "";
  let wake = () => {};
  child.stdout.on("data", (d) => {
    buf += d;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const m = JSON.parse(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      seen.push(m);
      if (m.method === "request/approval") send({ id: m.id, result: { optionId: "allow_once" } });
      wake();
    }
  });
  const until = (pred, what) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}\n${stderr.slice(-2000)}`)), 40000);
    const check = () => {
      const hit = seen.find(pred);
      if (hit) {
        clearTimeout(timer);
        resolve(hit);
      }
    };
    wake = check;
    check();
  });
  send({ id: 1, method: "initialize", params: { cwd: work, capabilities: { requests: true }, mcpServers: [ev.server] } });
  await until((m) => m.id === 1 && m.result, "initialize");
  send({ id: 2, method: "session/prompt", params: { text: '/tool mcp__ev__get-sum {"a": 40, "b": 2}' } });
  const result = await until((m) => m.method === "session.event" && m.params.event.kind === "tool/result", "the tool's result");
  assert.equal(result.params.event.data.isError, false, JSON.stringify(result.params.event.data));
  assert.match(JSON.stringify(result.params.event.data.result), /42/);
  assert.ok(seen.some((m) => m.method === "request/approval"), "approved over request/approval");
  assert.ok(sentToServer(log).some((m) => m.method === "tools/call"), "the server was called");
  await assert.rejects(new Promise((resolve, reject) => {
    send({ id: 3, method: "initialize", params: { cwd: work, mcpServers: [{ command: "x" }] } });
    until((m) => m.id === 3, "the second initialize").then((m) => (m.error ? reject(new Error(m.error.message)) : resolve(m)));
  }), /already initialized|mcpServers/);
  child.stdin.end();
  await exited;
  assert.deepEqual(markedPids(ev.mark), [], "nothing of the server is left after the SDK process ended");
});
