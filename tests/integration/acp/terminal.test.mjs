// The editor's terminal: a client that advertises `terminal` (as Zed does) runs the session's run_command
// itself — terminal/create → wait_for_exit → output → release, the terminal shown in the tool call — and a
// cancelled turn kills it (terminal/kill, then release). The test client's terminals are real processes
// (`/bin/sh -c …` in the given cwd). The official ACP SDK is the editor, the openai provider runs against
// the fake model server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { scope, waitFor } from "./lib.mjs";
import { startFakeModel, textChunk, finishChunk, usageChunk } from "../fake-model.mjs";

const TEST = { timeout: 60000 };

// A terminal host as an editor would be one: each terminal a process; output kept; kill is SIGKILL.
function terminals(t) {
  const live = new Map();
  let n = 0;
  t.after(() => {
    for (const term of live.values()) term.child.kill("SIGKILL");
  });
  return {
    live,
    create: async (params) => {
      const id = `term-${++n}`;
      const child = spawn(params.command, params.args ?? [], { cwd: params.cwd, stdio: ["ignore", "pipe", "pipe"] });
      const term = { child, output: "", exit: null, params };
      term.exited = new Promise((res) => child.on("exit", (code, signal) => {
        term.exit = { exitCode: code, signal };
        res(term.exit);
      }));
      child.stdout.on("data", (d) => (term.output += d));
      child.stderr.on("data", (d) => (term.output += d));
      live.set(id, term);
      return { terminalId: id };
    },
    waitForExit: async ({ terminalId }) => live.get(terminalId).exited,
    output: async ({ terminalId }) => {
      const term = live.get(terminalId);
      return { output: term.output, truncated: false, exitStatus: term.exit };
    },
    kill: async ({ terminalId }) => {
      live.get(terminalId).child.kill("SIGKILL");
      return {};
    },
    release: async ({ terminalId }) => {
      const term = live.get(terminalId);
      if (term.exit === null) term.child.kill("SIGKILL");
      live.delete(terminalId);
      return {};
    },
  };
}

async function start(t, fake) {
  const s = scope(t);
  const conf = join(await s.tempDir("ah-acp-term-conf-"), "agenthost.ini");
  await writeFile(conf, `[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\n` +
    `base_url = ${fake.baseUrl}\nmodel = m1\n`);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  await a.initialize(1, { readTextFile: false, writeTextFile: false }, true);
  a.terminal = terminals(t);
  a.onPermission = async (record) => ({ outcome: { outcome: "selected",
    optionId: record.params.options.find((o) => o.kind === "allow_once").optionId } });
  return { a, cwd: await s.tempDir("ah-acp-term-cwd-") };
}

const done = () => ({ sse: [textChunk("ok"), finishChunk("stop"), usageChunk(10, 2), "[DONE]"] });
const toolCall = (id, name, args) => ({
  sse: [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id, type: "function",
    function: { name, arguments: JSON.stringify(args) } }] } }] }, finishChunk("tool_calls"), "[DONE]"],
});
const updates = (a, sid) => a.wireUpdates(sid).map((u) => u.update);

test("ACP-OUTPUT-PERMISSION: Zed: run_command runs in the editor's terminal (create → wait_for_exit → output → release), shown in the tool call", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  await fake.script([toolCall("c1", "run_command", { command: "echo out-$((6*7)); pwd; exit 3" }), done()]);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "run it", 30000)).stopReason, "end_turn");
  assert.deepEqual(a.terminalCalls.map((c) => c.method),
    ["terminal/create", "terminal/wait_for_exit", "terminal/output", "terminal/release"]);
  const create = a.terminalCalls[0].params;
  assert.deepEqual({ command: create.command, args: create.args, cwd: create.cwd, sessionId: create.sessionId },
    { command: "/bin/sh", args: ["-c", "echo out-$((6*7)); pwd; exit 3"], cwd, sessionId: sid });
  const seen = JSON.parse(JSON.parse((await fake.requests())[1].body).messages.at(-1).content);
  assert.equal(seen.stdout, `out-42\n${cwd}\n`, "the model reads the terminal's output");
  assert.equal(seen.exitCode, 3);
  const call = updates(a, sid).find((u) => u.sessionUpdate === "tool_call");
  assert.equal(call.kind, "execute");
  const live = updates(a, sid).find((u) => u.sessionUpdate === "tool_call_update" && u.status === "in_progress" &&
    u.content?.[0]?.type === "terminal");
  assert.ok(live, `the terminal was shown while it ran: ${JSON.stringify(updates(a, sid))}`);
  assert.equal(live.content[0].terminalId, "term-1");
  const end = updates(a, sid).find((u) => u.sessionUpdate === "tool_call_update" && u.status === "completed");
  assert.deepEqual(end.content[0], { type: "terminal", terminalId: "term-1" });
  assert.equal(a.terminal.live.size, 0, "released");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-PROMPT-CANCEL: Zed: a cancelled turn kills the editor's terminal (terminal/kill, then release) and the prompt ends cancelled", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  await fake.script([toolCall("c1", "run_command", { command: "sleep 30" }), done()]);
  const sid = await a.newSession(cwd);
  const answer = a.prompt(sid, "sleep", 30000);
  await waitFor(() => a.terminalCalls.some((c) => c.method === "terminal/wait_for_exit"), 10000, "the command to run");
  const t0 = Date.now();
  await a.cancel(sid);
  assert.equal((await answer).stopReason, "cancelled");
  await waitFor(() => a.terminalCalls.some((c) => c.method === "terminal/release"), 10000, "the release");
  const methods = a.terminalCalls.map((c) => c.method);
  assert.ok(methods.indexOf("terminal/kill") > methods.indexOf("terminal/wait_for_exit"), methods.join(" "));
  assert.ok(methods.indexOf("terminal/release") > methods.indexOf("terminal/kill"), methods.join(" "));
  assert.ok(Date.now() - t0 < 10000, "killed, not waited for");
  assert.equal(a.terminal.live.size, 0);
  await a.assertSdkAccepted();
});

test("ACP-OUTPUT-PERMISSION: Zed: without a terminal, run_command's output streams into the tool call while it runs", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const s = scope(t);
  const conf = join(await s.tempDir("ah-acp-term-conf-"), "agenthost.ini");
  await writeFile(conf, `[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\n` +
    `base_url = ${fake.baseUrl}\nmodel = m1\n`);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  await a.initialize(1);
  a.onPermission = async (record) => ({ outcome: { outcome: "selected",
    optionId: record.params.options.find((o) => o.kind === "allow_once").optionId } });
  const cwd = await s.tempDir("ah-acp-term-cwd-");
  await fake.script([toolCall("c1", "run_command", { command: "echo first; sleep 1; echo second" }), done()]);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "run", 30000)).stopReason, "end_turn");
  assert.equal(a.terminalCalls.length, 0, "no terminal/* without the capability");
  const all = updates(a, sid);
  const endAt = all.findIndex((u) => u.sessionUpdate === "tool_call_update" && u.status === "completed");
  const live = all.slice(0, endAt).filter((u) => u.sessionUpdate === "tool_call_update" &&
    u.status === "in_progress" && u.content?.[0]?.content?.text !== undefined);
  assert.ok(live.length >= 1, `output while it ran: ${JSON.stringify(all)}`);
  assert.equal(live[0].content[0].content.text, "first\n", "the first line, before the second was written");
  assert.match(all[endAt].content[0].content.text, /first\nsecond/);
  await a.assertSdkAccepted();
});
