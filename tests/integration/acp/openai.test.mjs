// ACP prompts through the official SDK as the editor, answered by the openai provider against the fake
// model server: streamed text as agent_message_chunk, a tool call with the editor's permission, cancel
// closing the model connection at once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { scope, waitFor } from "./lib.mjs";
import { startFakeModel, textChunk, finishChunk, usageChunk } from "../fake-model.mjs";

const TEST = { timeout: 60000 };

async function start(t, fake, extra = "") {
  const s = scope(t);
  const conf = join(await s.tempDir("ah-acp-conf-"), "agenthost.ini");
  await writeFile(conf, `[host]\ndefault_provider = fake\n[plugin.acp]\nstream_deltas = true\n` +
    `[provider.fake]\ntype = openai\nbase_url = ${fake.baseUrl}\nmodel = m1\n${extra}`);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  await a.initialize(1);
  const cwd = await s.tempDir("ah-acp-cwd-");
  return { s, a, cwd };
}

const chunks = (a, sid) =>
  a.wireUpdates(sid).filter((u) => u.update.sessionUpdate === "agent_message_chunk").map((u) => u.update.content.text);

test("ACP-OUTPUT-PERMISSION: openai through ACP: streamed deltas are agent_message_chunks, the turn ends end_turn", TEST, async (t) => {
  const fake = await startFakeModel(t);
  await fake.script([{ sse: [textChunk("Hello "), textChunk("from "), textChunk("the model"), finishChunk("stop"),
    usageChunk(9, 3), "[DONE]"] }]);
  const { a, cwd } = await start(t, fake);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "hi", 30000);
  assert.equal(r.stopReason, "end_turn", JSON.stringify(r));
  const got = chunks(a, sid);
  assert.ok(got.length >= 3, `deltas: ${JSON.stringify(got)}`);
  assert.equal(got.join(""), "Hello from the model");
  const body = JSON.parse((await fake.requests())[0].body);
  assert.equal(body.messages.at(-1).content, "hi");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: openai through ACP: the model's write_file asks the editor's permission, then the result goes back", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  const target = join(cwd, "from-model.txt");
  const args = JSON.stringify({ path: target, content: "written by the model" });
  await fake.script([
    { sse: [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: "w1", type: "function",
      function: { name: "write_file", arguments: args } }] } }] }, finishChunk("tool_calls"), "[DONE]"] },
    { sse: [textChunk("done"), finishChunk("stop"), "[DONE]"] },
  ]);
  a.onPermission = async (record) => {
    const allow = record.params.options.find((o) => o.kind === "allow_once");
    return { outcome: { outcome: "selected", optionId: allow.optionId } };
  };
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "write it", 30000);
  assert.equal(r.stopReason, "end_turn", JSON.stringify(r));
  assert.equal(a.permissions.length, 1, "one permission request");
  const { readFile } = await import("node:fs/promises");
  assert.equal(await readFile(target, "utf8"), "written by the model");
  const second = JSON.parse((await fake.requests())[1].body);
  assert.equal(second.messages.at(-1).role, "tool");
  assert.equal(second.messages.at(-1).tool_call_id, "w1");
  assert.equal(chunks(a, sid).join(""), "done");
});

test("ACP-PROMPT-CANCEL: openai through ACP: session/cancel closes the model's stream at once and answers cancelled", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const slow = Array.from({ length: 300 }, () => textChunk("tick "));
  await fake.script([{ sse: slow, delay_ms: 50 }]);
  const { a, cwd } = await start(t, fake);
  const sid = await a.newSession(cwd);
  const pending = a.prompt(sid, "go", 30000);
  await waitFor(() => chunks(a, sid).length > 0, 10000, "the first delta");
  const cancelledAt = Date.now() / 1000;
  a.cancel(sid);
  const r = await pending;
  assert.equal(r.stopReason, "cancelled", JSON.stringify(r));
  let seen = 0;
  for (let i = 0; i < 100 && !seen; i++) {
    const ev = (await fake.events()).find((e) => e.event === "disconnect");
    if (ev) seen = ev.time;
    else await new Promise((res) => setTimeout(res, 20));
  }
  assert.ok(seen > 0, "the server saw the client go");
  assert.ok(seen - cancelledAt < 0.2, `the server saw the disconnect ${Math.round((seen - cancelledAt) * 1000)} ms after the cancel`);
});
