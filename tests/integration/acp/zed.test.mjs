// What Zed shows of an agent, with the official ACP SDK as the editor and the openai provider against the
// fake model server: the session's title from its first prompt (session_info_update and session/list), the
// token meter (usage_update against the configured context window), a write as a diff with the text before
// and after, file locations, and the model's plan as a checklist (plan). Every frame is checked by the SDK
// against the ACP schema.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { scope } from "./lib.mjs";
import { startFakeModel, textChunk, finishChunk, usageChunk } from "../fake-model.mjs";

const TEST = { timeout: 60000 };

async function start(t, fake) {
  const s = scope(t);
  const conf = join(await s.tempDir("ah-acp-zed-conf-"), "agenthost.ini");
  await writeFile(conf, `[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\n` +
    `base_url = ${fake.baseUrl}\nmodel = m1\ncontext_window = 8192\n`);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  await a.initialize(1);
  return { a, cwd: await s.tempDir("ah-acp-zed-cwd-") };
}

const toolCall = (id, name, args) => ({
  sse: [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id, type: "function",
    function: { name, arguments: JSON.stringify(args) } }] } }] }, finishChunk("tool_calls"), "[DONE]"],
});
const updates = (a, sid) => a.wireUpdates(sid).map((u) => u.update);

test("ACP-OUTPUT-PERMISSION: Zed: the first prompt titles the session (session_info_update, session/list); usage_update is the model's usage against the context window", TEST, async (t) => {
  const fake = await startFakeModel(t);
  await fake.script([{ sse: [textChunk("Sure."), finishChunk("stop"), usageChunk(120, 30), "[DONE]"] }]);
  const { a, cwd } = await start(t, fake);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "Fix the   flaky test in\nthe parser module", 30000);
  assert.equal(r.stopReason, "end_turn", JSON.stringify(r));
  const info = updates(a, sid).find((u) => u.sessionUpdate === "session_info_update");
  assert.ok(info, `a session_info_update: ${JSON.stringify(updates(a, sid))}`);
  assert.equal(info.title, "Fix the flaky test in", "the first line, blanks collapsed");
  assert.match(info.updatedAt, /^\d{4}-\d\d-\d\dT/);
  const usage = updates(a, sid).filter((u) => u.sessionUpdate === "usage_update");
  assert.equal(usage.length, 1, "one meter update per turn");
  assert.deepEqual({ used: usage[0].used, size: usage[0].size }, { used: 150, size: 8192 });
  const list = await a.request("session/list", { cwd });
  const row = list.sessions.find((x) => x.sessionId === sid);
  assert.equal(row.title, "Fix the flaky test in");
  assert.ok(row.updatedAt);
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: Zed: with a price table the meter carries the session's cost", TEST, async (t) => {
  const fake = await startFakeModel(t);
  await fake.script([{ sse: [textChunk("Priced."), finishChunk("stop"), usageChunk(120, 30), "[DONE]"] },
    { sse: [textChunk("Again."), finishChunk("stop"), usageChunk(1000, 500), "[DONE]"] }]);
  const s = scope(t);
  const dir = await s.tempDir("ah-acp-zed-prices-");
  const prices = join(dir, "prices.json");
  await writeFile(prices, JSON.stringify({ version: 1, currency: "EUR", rates: [
    { model: "fake-model-v2", from: "2026-01-01", input: "1", output: "2" }] }));
  const conf = join(dir, "agenthost.ini");
  await writeFile(conf, `[host]\ndefault_provider = fake\nprices = ${prices}\n[provider.fake]\ntype = openai\n` +
    `base_url = ${fake.baseUrl}\nmodel = m1\ncontext_window = 8192\n`);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  await a.initialize(1);
  const sid = await a.newSession(await s.tempDir("ah-acp-zed-cwd-"));
  assert.equal((await a.prompt(sid, "one", 30000)).stopReason, "end_turn");
  let usage = updates(a, sid).filter((u) => u.sessionUpdate === "usage_update");
  assert.equal(usage.length, 1, "sent before the prompt's answer");
  // 120 × 1 + 30 × 2 = 180 per million tokens
  assert.deepEqual(usage[0].cost, { amount: 0.00018, currency: "EUR" });
  assert.equal((await a.prompt(sid, "two", 30000)).stopReason, "end_turn");
  usage = updates(a, sid).filter((u) => u.sessionUpdate === "usage_update");
  // cumulative: + 1000 × 1 + 500 × 2 = 2180 per million
  assert.deepEqual(usage[1].cost, { amount: 0.00218, currency: "EUR" });
  assert.deepEqual({ used: usage[1].used, size: usage[1].size }, { used: 1500, size: 8192 });
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: Zed: a write is a diff of the text before and after, with its location", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  const target = join(cwd, "notes.txt");
  await writeFile(target, "old line\n");
  await fake.script([toolCall("w1", "write_file", { path: "notes.txt", content: "new line\n" }),
    { sse: [textChunk("done"), finishChunk("stop"), "[DONE]"] }]);
  a.onPermission = async (record) => ({ outcome: { outcome: "selected",
    optionId: record.params.options.find((o) => o.kind === "allow_once").optionId } });
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "rewrite the notes", 30000);
  assert.equal(r.stopReason, "end_turn", JSON.stringify(r));
  assert.equal(await readFile(target, "utf8"), "new line\n");
  const call = updates(a, sid).find((u) => u.sessionUpdate === "tool_call");
  assert.equal(call.kind, "edit");
  assert.deepEqual(call.locations, [{ path: target }]);
  const done = updates(a, sid).find((u) => u.sessionUpdate === "tool_call_update" && u.status === "completed");
  assert.ok(done, `the write completed: ${JSON.stringify(updates(a, sid))}`);
  assert.deepEqual(done.content, [{ type: "diff", path: target, oldText: "old line\n", newText: "new line\n" }]);
  // The model never sees the text before: its result is {path, bytes}.
  const second = JSON.parse((await fake.requests())[1].body);
  assert.deepEqual(JSON.parse(second.messages.at(-1).content), { path: target, bytes: 9 });
  await a.assertSdkAccepted();
});

test("ACP-OUTPUT-PERMISSION: Zed: a new file's diff has no text before; a read has its location", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  await writeFile(join(cwd, "a.txt"), "A\n");
  await fake.script([toolCall("r1", "read_file", { path: "a.txt" }), toolCall("w1", "write_file", { path: "b.txt", content: "B\n" }),
    { sse: [textChunk("ok"), finishChunk("stop"), "[DONE]"] }]);
  a.onPermission = async (record) => ({ outcome: { outcome: "selected",
    optionId: record.params.options.find((o) => o.kind === "allow_once").optionId } });
  const sid = await a.newSession(cwd);
  await a.prompt(sid, "copy", 30000);
  const calls = updates(a, sid).filter((u) => u.sessionUpdate === "tool_call");
  assert.equal(calls[0].kind, "read");
  assert.deepEqual(calls[0].locations, [{ path: join(cwd, "a.txt") }]);
  const diff = updates(a, sid).filter((u) => u.sessionUpdate === "tool_call_update" && u.content?.[0]?.type === "diff");
  assert.equal(diff.length, 1);
  assert.equal(diff[0].content[0].oldText, null);
  assert.equal(diff[0].content[0].newText, "B\n");
  await a.assertSdkAccepted();
});

test("ACP-OUTPUT-PERMISSION: Zed: the model's update_plan is a plan checklist", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  const entries = [{ content: "Read the parser", status: "completed" },
    { content: "Fix the off-by-one", status: "in_progress", priority: "high" },
    { content: "Run the tests", status: "pending" }];
  await fake.script([toolCall("p1", "update_plan", { entries }),
    { sse: [textChunk("working on it"), finishChunk("stop"), "[DONE]"] }]);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "fix the parser", 30000);
  assert.equal(r.stopReason, "end_turn", JSON.stringify(r));
  assert.equal(a.permissions.length, 0, "a plan needs no permission");
  const plan = updates(a, sid).find((u) => u.sessionUpdate === "plan");
  assert.ok(plan, `a plan update: ${JSON.stringify(updates(a, sid))}`);
  assert.deepEqual(plan.entries, [
    { content: "Read the parser", status: "completed", priority: "medium" },
    { content: "Fix the off-by-one", status: "in_progress", priority: "high" },
    { content: "Run the tests", status: "pending", priority: "medium" },
  ]);
  const call = updates(a, sid).find((u) => u.sessionUpdate === "tool_call");
  assert.equal(call.kind, "think");
  // The model was offered the tool with its JSON Schema.
  const first = JSON.parse((await fake.requests())[0].body);
  const offered = first.tools.find((x) => x.function.name === "update_plan");
  assert.equal(offered.function.parameters.properties.entries.type, "array");
  await a.assertSdkAccepted();
});
