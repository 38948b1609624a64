// The editor's MCP servers through ACP, with the official ACP SDK as the editor and the official MCP reference
// servers from npm (server-everything on stdio and on Streamable HTTP, server-filesystem): session/new with a
// stdio and an HTTP server, their tools called through echo (`/tool NAME JSON`) and through the fake OpenAI
// model, each approved through session/request_permission; session/load with the same servers; an isError
// result; a long call cancelled (the server receives notifications/cancelled); list_changed honoured; a
// server killed mid-call answered with an error while the host keeps serving; session/close leaving no MCP
// process behind.
import { test } from "node:test";
import assert from "node:assert/strict";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { scope, waitFor, acp } from "./lib.mjs";
import { startFakeModel, finishChunk, textChunk } from "../fake-model.mjs";
import {
  everythingStdio,
  startEverythingHttp,
  markedPids,
  sentToServer,
  filesystemBin,
  everythingBin,
  relayPath,
} from "../mcp/servers.mjs";

const M = acp.methods.agent;
const TEST = { timeout: 90000 };

async function start(t, ini = "") {
  const s = scope(t);
  const conf = join(await s.tempDir("ah-acp-conf-"), "agenthost.ini");
  await writeFile(conf, ini);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  const init = await a.initialize(1);
  const cwd = await s.tempDir("ah-acp-cwd-");
  const logs = await s.tempDir("ah-acp-mcp-log-");
  return { s, a, init, cwd, logs };
}

const allowOnce = async (record) => {
  const allow = record.params.options.find((o) => o.kind === "allow_once");
  return { outcome: { outcome: "selected", optionId: allow.optionId } };
};

/** The last tool_call_update with a final status, of the session. */
function lastResult(a, sid) {
  const done = a
    .wireUpdates(sid)
    .filter((u) => u.update.sessionUpdate === "tool_call_update" && ["completed", "failed"].includes(u.update.status));
  return done.at(-1)?.update;
}

test("ACP-HANDSHAKE: mcpCapabilities advertises HTTP (Streamable HTTP), not the old SSE transport", TEST, async (t) => {
  const { init } = await start(t);
  assert.equal(init.agentCapabilities.mcpCapabilities?.http, true, JSON.stringify(init.agentCapabilities));
  assert.notEqual(init.agentCapabilities.mcpCapabilities?.sse, true);
});

test("ACP-OUTPUT-PERMISSION: session/new with a stdio and an HTTP server: their tools run through echo after the editor's permission", TEST, async (t) => {
  const { a, cwd, logs } = await start(t);
  const http = await startEverythingHttp(t);
  const ev = everythingStdio("ev", join(logs, "ev.log"));
  const r = await a.request(M.session.new, {
    cwd,
    mcpServers: [ev.server, { type: "http", name: "web", url: http.url, headers: [] }],
  });
  const sid = r.sessionId;
  a.onPermission = allowOnce;
  let p = await a.prompt(sid, '/tool mcp__ev__echo {"message": "over stdio"}', 60000);
  assert.equal(p.stopReason, "end_turn");
  assert.equal(a.permissions.length, 1, "the editor was asked");
  assert.equal(a.permissions[0].params.toolCall?.title?.includes("mcp__ev__echo") ?? true, true);
  let res = lastResult(a, sid);
  assert.equal(res.status, "completed", JSON.stringify(res));
  assert.match(JSON.stringify(res.rawOutput), /Echo: over stdio/);
  p = await a.prompt(sid, '/tool mcp__web__get-sum {"a": 20, "b": 22}', 60000);
  assert.equal(p.stopReason, "end_turn");
  res = lastResult(a, sid);
  assert.equal(res.status, "completed", JSON.stringify(res));
  assert.match(JSON.stringify(res.rawOutput), /42/);
  assert.equal(a.permissions.length, 2);
  // The stdio server got initialize, initialized and tools/list from us, in that order.
  const sent = sentToServer(join(logs, "ev.log")).map((m) => m.method).filter(Boolean);
  assert.deepEqual(sent.slice(0, 3), ["initialize", "notifications/initialized", "tools/list"], sent.join(","));
  // server-everything says list_changed right after start: the list is asked again.
  await waitFor(() => sentToServer(join(logs, "ev.log")).filter((m) => m.method === "tools/list").length >= 2, 10000,
    "tools/list again after notifications/tools/list_changed");
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: the fake OpenAI model sees the MCP tools with their schemas and calls one", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd, logs } = await start(t,
    `[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\nbase_url = ${fake.baseUrl}\nmodel = m1\n`);
  const ev = everythingStdio("ev", join(logs, "ev.log"));
  await fake.script([
    { sse: [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: "c1", type: "function",
      function: { name: "mcp__ev__get-sum", arguments: JSON.stringify({ a: 2, b: 3 }) } }] } }] },
      finishChunk("tool_calls"), "[DONE]"] },
    { sse: [textChunk("five"), finishChunk("stop"), "[DONE]"] },
  ]);
  const { sessionId: sid } = await a.request(M.session.new, { cwd, mcpServers: [ev.server] });
  a.onPermission = allowOnce;
  const p = await a.prompt(sid, "add them", 60000);
  assert.equal(p.stopReason, "end_turn", JSON.stringify(p));
  const reqs = await fake.requests();
  const first = JSON.parse(reqs[0].body);
  const sum = first.tools.find((x) => x.function.name === "mcp__ev__get-sum");
  assert.ok(sum, `offered tools: ${first.tools.map((x) => x.function.name).join(", ")}`);
  assert.equal(sum.function.parameters.properties.a.type, "number", JSON.stringify(sum.function.parameters));
  const second = JSON.parse(reqs[1].body);
  const toolMsg = second.messages.at(-1);
  assert.equal(toolMsg.role, "tool");
  assert.equal(toolMsg.tool_call_id, "c1");
  assert.match(toolMsg.content, /5/);
  assert.equal(a.permissions.length, 1);
});

test("ACP-QUIESCE: session/load with the same servers keeps them running; session/close leaves no MCP process", TEST, async (t) => {
  const { a, cwd, logs } = await start(t);
  const ev = everythingStdio("ev", join(logs, "ev.log"));
  const { sessionId: sid } = await a.request(M.session.new, { cwd, mcpServers: [ev.server] });
  a.onPermission = allowOnce;
  await a.prompt(sid, '/tool mcp__ev__echo {"message": "one"}', 60000);
  const before = markedPids(ev.mark);
  assert.ok(before.length >= 1, "the server runs");
  await a.request(M.session.load, { sessionId: sid, cwd, mcpServers: [ev.server] });
  await a.prompt(sid, '/tool mcp__ev__echo {"message": "two"}', 60000);
  assert.match(JSON.stringify(lastResult(a, sid).rawOutput), /Echo: two/);
  assert.deepEqual(markedPids(ev.mark).sort(), before.sort(), "the same processes: not restarted by the load");
  await a.request(M.session.close, { sessionId: sid });
  await waitFor(() => markedPids(ev.mark).length === 0, 10000, "no process of the server left after close",
    () => `left: ${markedPids(ev.mark).join(", ")}\n${a.stderrTail()}`);
});

test("ACP-OUTPUT-PERMISSION: an isError result of server-filesystem is a failed tool call; an unsupported server is skipped", TEST, async (t) => {
  const { s, a, cwd } = await start(t);
  const allowed = await s.tempDir("ah-acp-fs-");
  await writeFile(join(allowed, "hello.txt"), "hello from the filesystem server\n");
  const { sessionId: sid } = await a.request(M.session.new, {
    cwd,
    mcpServers: [
      { name: "fs", command: filesystemBin, args: [allowed], env: [] },
      { type: "sse", name: "legacy", url: "http://127.0.0.1:9/sse", headers: [] },
    ],
  });
  a.onPermission = allowOnce;
  await a.prompt(sid, `/tool mcp__fs__read_text_file {"path": "${join(allowed, "hello.txt")}"}`, 60000);
  let res = lastResult(a, sid);
  assert.equal(res.status, "completed", JSON.stringify(res));
  assert.match(JSON.stringify(res.rawOutput), /hello from the filesystem server/);
  await a.prompt(sid, '/tool mcp__fs__read_text_file {"path": "/etc/hostname"}', 60000);
  res = lastResult(a, sid);
  assert.equal(res.status, "failed", JSON.stringify(res));
  assert.match(JSON.stringify(res.rawOutput), /denied|outside|not allowed/i);
  assert.match(a.stderr, /legacy.*(not supported|skipped)|skipped.*legacy/i, "the SSE server is skipped, by name");
});

test("ACP-PROMPT-CANCEL: a long MCP tool call shows its progress and is cancelled: the server gets notifications/cancelled", TEST, async (t) => {
  const { a, cwd, logs } = await start(t);
  const log = join(logs, "ev.log");
  const ev = everythingStdio("ev", log);
  const { sessionId: sid } = await a.request(M.session.new, { cwd, mcpServers: [ev.server] });
  a.onPermission = allowOnce;
  const pending = a.prompt(sid, '/tool mcp__ev__trigger-long-running-operation {"duration": 30, "steps": 30}', 60000);
  await waitFor(() => sentToServer(log).some((m) => m.method === "tools/call"), 20000, "the call reached the server");
  // The server's progress notifications are the tool call's progress in the editor.
  const progress = await waitFor(() => a.wireUpdates(sid).find((u) => u.update.sessionUpdate === "tool_call_update" &&
    u.update.status === "in_progress" && /^\d+\/30/.test(u.update.content?.[0]?.content?.text ?? "")), 10000,
  "a progress update of the running tool call");
  console.log(`  progress shown: ${progress.update.content[0].content.text}`);
  const t0 = Date.now();
  a.cancel(sid);
  const r = await pending;
  assert.equal(r.stopReason, "cancelled");
  assert.ok(Date.now() - t0 < 5000, "cancelled at once, not after the 30 s operation");
  const call = sentToServer(log).find((m) => m.method === "tools/call");
  await waitFor(() => sentToServer(log).some((m) => m.method === "notifications/cancelled"), 5000,
    "notifications/cancelled sent to the server");
  const cancel = sentToServer(log).find((m) => m.method === "notifications/cancelled");
  assert.equal(cancel.params.requestId, call.id, "for the call's request id");
});

test("ACP-OUTPUT-PERMISSION: a server killed mid-call fails the call with a clear error; the host keeps serving and restarts it", TEST, async (t) => {
  const { a, cwd, logs } = await start(t);
  const log = join(logs, "ev.log");
  const ev = everythingStdio("ev", log);
  const { sessionId: sid } = await a.request(M.session.new, { cwd, mcpServers: [ev.server] });
  a.onPermission = allowOnce;
  const pending = a.prompt(sid, '/tool mcp__ev__trigger-long-running-operation {"duration": 30, "steps": 30}', 60000);
  await waitFor(() => sentToServer(log).some((m) => m.method === "tools/call"), 20000, "the call reached the server");
  for (const pid of markedPids(ev.mark)) process.kill(pid, "SIGKILL");
  const r = await pending;
  assert.equal(r.stopReason, "end_turn");
  const res = lastResult(a, sid);
  assert.equal(res.status, "failed", JSON.stringify(res));
  assert.match(JSON.stringify(res.rawOutput), /MCP server ev/);
  // The host keeps serving: a plain prompt, then the server is started again at its next use (after the
  // backoff of its first failure, 1 s).
  const plain = await a.prompt(sid, "still there?", 20000);
  assert.equal(plain.stopReason, "end_turn");
  await new Promise((res2) => setTimeout(res2, 1200));
  await a.prompt(sid, '/tool mcp__ev__echo {"message": "again"}', 60000);
  assert.match(JSON.stringify(lastResult(a, sid).rawOutput), /Echo: again/);
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: hostile servers: one that never answers initialize times out without holding the turn; garbage and an oversized line are refused", TEST, async (t) => {
  const { s, a, cwd } = await start(t,
    "[mcp.stuck]\ncommand = /bin/sleep\nargs = 60\nstartup_timeout_ms = 500\n");
  const bin = await s.tempDir("ah-acp-hostile-");
  const noisy = join(bin, "noisy.sh");
  // Not JSON, a 17 MiB line (over the 16 MiB bound), then a valid answer to initialize with a bad version.
  await writeFile(noisy, `#!/bin/sh\nread line\necho 'this is not json'\nhead -c 17825792 /dev/zero | tr '\\\\0' x\necho\n` +
    `echo '{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"1999-01-01","capabilities":{}}}'\nsleep 60\n`, { mode: 0o755 });
  const { sessionId: sid } = await a.request(M.session.new, {
    cwd,
    mcpServers: [{ name: "noisy", command: noisy, args: [], env: [] }],
  });
  const t0 = Date.now();
  const p = await a.prompt(sid, "hello", 30000);
  assert.equal(p.stopReason, "end_turn");
  assert.ok(Date.now() - t0 < 10000, `the turn was not held (${Date.now() - t0} ms)`);
  await waitFor(() => /\[mcp\.stuck\] did not finish starting/.test(a.stderr), 5000, "the start-up timeout logged");
  await waitFor(() => /\[mcp\.noisy\].*(1999-01-01|too long)/.test(a.stderr), 10000, "the noisy server refused",
    () => a.stderrTail());
  // The host still serves: another prompt, and a tool of the refused server is unknown, not a crash.
  const again = await a.prompt(sid, '/tool mcp__noisy__anything {}', 30000);
  assert.equal(again.stopReason, "end_turn");
  a.assertStdoutPure();
});

/** The tool name agenthost gives TOOL of SERVER (docs/tools.md "Naming"): FNV-1a of the whole name. */
function toolName(server, tool) {
  const clean = (s) => s.replace(/[^A-Za-z0-9-]/g, "_");
  const whole = `mcp__${clean(server)}__${clean(tool)}`;
  if (whole.length <= 64) return whole;
  let h = 2166136261;
  for (const c of Buffer.from(whole)) h = Math.imul(h ^ c, 16777619) >>> 0;
  return `${whole.slice(0, 55)}_${h.toString(16).padStart(8, "0")}`;
}

test("ACP-OUTPUT-PERMISSION: tool names are sanitized and cut with a hash; a name two servers give is kept once, with a warning", TEST, async (t) => {
  const s = scope(t);
  const logs = await s.tempDir("ah-acp-mcp-log-");
  const hostLog = join(logs, "host.log");
  const conf = join(await s.tempDir("ah-acp-conf-"), "agenthost.ini");
  await writeFile(conf, `[mcp.ev]\ncommand = ${process.execPath}\nargs = ${relayPath} ${hostLog} ${everythingBin} stdio\n`);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  await a.initialize(1);
  const cwd = await s.tempDir("ah-acp-cwd-");
  const long = "a server.with spaces/and-a-name-far-longer-than-what-fits";
  const one = everythingStdio(long, join(logs, "long.log"));
  const twin = everythingStdio("ev", join(logs, "twin.log"));
  const third = everythingStdio("other", join(logs, "third.log"));
  const { sessionId: sid } = await a.request(M.session.new, {
    cwd, mcpServers: [one.server, twin.server, { ...third.server, name: long }] });
  a.onPermission = allowOnce;
  const name = toolName(long, "get-sum");
  assert.equal(name.length, 64, name);
  await a.prompt(sid, `/tool ${name} {"a": 1, "b": 2}`, 60000);
  const res = lastResult(a, sid);
  assert.equal(res.status, "completed", `${name}: ${JSON.stringify(res)}\n${a.stderrTail()}`);
  assert.match(JSON.stringify(res.rawOutput), /3/);
  assert.match(a.stderr, /a second server named a server\.with spaces/, "one list naming a server twice");
  // The host-wide ev and the session's ev give the same names: the host-wide one wins, the other is named.
  await a.prompt(sid, '/tool mcp__ev__echo {"message": "twin"}', 60000);
  assert.match(JSON.stringify(lastResult(a, sid).rawOutput), /Echo: twin/);
  assert.match(a.stderr, /tool name mcp__ev__echo: given by servers ev and ev; the one of ev is left out/);
  assert.ok(sentToServer(hostLog).some((m) => m.method === "tools/call"), "the host-wide server ran it");
  assert.ok(!sentToServer(join(logs, "twin.log")).some((m) => m.method === "tools/call"), "not the session's twin");
});

test("ACP-OUTPUT-PERMISSION: a paged tools/list is read to its end; every content type is mapped for the model", TEST, async (t) => {
  const { a, cwd, logs } = await start(t);
  const log = join(logs, "fake.log");
  const fake = join(process.env.AH_TEST_SOURCE_ROOT, "tests", "fakes", "fake_mcp.py");
  const { sessionId: sid } = await a.request(M.session.new, {
    cwd, mcpServers: [{ name: "fake", command: "python3", args: [fake, log], env: [] }] });
  a.onPermission = allowOnce;
  await a.prompt(sid, "/tool mcp__fake__mixed {}", 30000);
  let res = lastResult(a, sid);
  assert.equal(res.status, "completed", JSON.stringify(res));
  const out = res.rawOutput;
  assert.equal(out.content, ["plain text", "[image: image/png, 300 bytes, not shown]",
    "[audio: audio/wav, 3 bytes, not shown]", "[resource link: file:///srv/a.txt a.txt]",
    "[resource file:///srv/b.txt]\nembedded body", "[resource file:///srv/c.bin: 6 bytes of binary data, not shown]"].join("\n"));
  assert.deepEqual(out.structuredContent, { answer: 42 });
  const lists = sentToServer(log).filter((m) => m.method === "tools/list");
  assert.deepEqual(lists.map((m) => m.params?.cursor ?? null), [null, "1"], "both pages asked for");
  await a.prompt(sid, "/tool mcp__fake__page_one {}", 30000);
  assert.equal(lastResult(a, sid).status, "completed", "a tool of the first page");
  await a.prompt(sid, "/tool mcp__fake__fails {}", 30000);
  res = lastResult(a, sid);
  assert.equal(res.status, "failed");
  assert.match(JSON.stringify(res.rawOutput), /it broke/);
});
