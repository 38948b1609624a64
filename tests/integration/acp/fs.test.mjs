// The editor's files: a client that advertises fs.readTextFile / writeTextFile (as Zed does) gets the
// session's read_file and write_file as fs/read_text_file and fs/write_text_file — the model reads the
// editor's buffer, not the disk, and a write lands in the editor — with the paths still confined to the
// session's cwd; a client error is the tool's error; without the capability nothing changes. The official
// ACP SDK is the editor, the openai provider runs against the fake model server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile, symlink } from "node:fs/promises";
import { join } from "node:path";
import { scope, acp } from "./lib.mjs";
import { startFakeModel, textChunk, finishChunk, usageChunk } from "../fake-model.mjs";

const TEST = { timeout: 60000 };
const FS = { readTextFile: true, writeTextFile: true };

async function start(t, fake, fs = FS) {
  const s = scope(t);
  const conf = join(await s.tempDir("ah-acp-fs-conf-"), "agenthost.ini");
  await writeFile(conf, `[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\n` +
    `base_url = ${fake.baseUrl}\nmodel = m1\n`);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  await a.initialize(1, fs);
  return { a, s, cwd: await s.tempDir("ah-acp-fs-cwd-") };
}

const done = () => ({ sse: [textChunk("ok"), finishChunk("stop"), usageChunk(10, 2), "[DONE]"] });
const toolCall = (id, name, args) => ({
  sse: [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id, type: "function",
    function: { name, arguments: JSON.stringify(args) } }] } }] }, finishChunk("tool_calls"), "[DONE]"],
});
const updates = (a, sid) => a.wireUpdates(sid).map((u) => u.update);
const toolResult = async (fake, i) => JSON.parse((await fake.requests())[i].body).messages.at(-1).content;
const allow = async (record) => ({ outcome: { outcome: "selected",
  optionId: record.params.options.find((o) => o.kind === "allow_once").optionId } });

test("ACP-CODEC: Zed: read_file reads the editor's buffer (fs/read_text_file), not the disk", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  await writeFile(join(cwd, "main.c"), "on disk\n");
  a.onReadTextFile = async (params) => ({ content: `unsaved buffer of ${params.path}\n` });
  await fake.script([toolCall("r1", "read_file", { path: "main.c" }), done()]);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "read it", 30000)).stopReason, "end_turn");
  assert.deepEqual(a.fsCalls.map((c) => [c.method, c.params.sessionId, c.params.path]),
    [["read", sid, join(cwd, "main.c")]], "one read, of the absolute path");
  const seen = JSON.parse(await toolResult(fake, 1));
  assert.equal(seen.content, `unsaved buffer of ${join(cwd, "main.c")}\n`, "the model sees the buffer");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-CODEC: Zed: write_file lands in the editor (fs/write_text_file) with the buffer's old text in the diff", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  await writeFile(join(cwd, "notes.md"), "disk\n");
  a.onReadTextFile = async () => ({ content: "buffer before\n" });
  a.onWriteTextFile = async () => null;
  a.onPermission = allow;
  await fake.script([toolCall("w1", "write_file", { path: "notes.md", content: "after\n" }), done()]);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "write it", 30000)).stopReason, "end_turn");
  const writes = a.fsCalls.filter((c) => c.method === "write");
  assert.equal(writes.length, 1);
  assert.deepEqual(writes[0].params, { sessionId: sid, path: join(cwd, "notes.md"), content: "after\n" });
  assert.equal(await readFile(join(cwd, "notes.md"), "utf8"), "disk\n", "the editor writes, not the host");
  const completed = updates(a, sid).find((u) => u.sessionUpdate === "tool_call_update" && u.status === "completed");
  assert.deepEqual(completed.content,
    [{ type: "diff", path: join(cwd, "notes.md"), oldText: "buffer before\n", newText: "after\n" }]);
  assert.deepEqual(JSON.parse(await toolResult(fake, 1)), { path: join(cwd, "notes.md"), bytes: 6 });
  await a.assertSdkAccepted();
});

test("ACP-CODEC: Zed: the editor's files stay confined to the cwd; a client error is the tool's error; without the capability the disk is used", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  const outside = await (scope(t)).tempDir("ah-acp-fs-outside-");
  await writeFile(join(outside, "secret"), "secret\n");
  await symlink(outside, join(cwd, "out"));
  a.onReadTextFile = async (params) => {
    throw acp.RequestError.resourceNotFound(params.path);
  };
  await fake.script([toolCall("r1", "read_file", { path: "../x" }), done(),
    toolCall("r2", "read_file", { path: "out/secret" }), done(),
    toolCall("r3", "read_file", { path: "missing.txt" }), done()]);
  const sid = await a.newSession(cwd);
  for (let i = 0; i < 3; i++) assert.equal((await a.prompt(sid, `read ${i}`, 30000)).stopReason, "end_turn");
  assert.match(await toolResult(fake, 1), /escapes|outside/, "a path out of the cwd is refused");
  assert.match(await toolResult(fake, 3), /symbolic link|escapes/, "so is one through a link");
  assert.deepEqual(a.fsCalls.map((c) => c.params.path), [join(cwd, "missing.txt")],
    "only the confined path reached the editor");
  assert.match(await toolResult(fake, 5), /the editor could not read missing\.txt: Resource not found/,
    "the client's error, as the model reads it");

  // A client without the capability: the disk, never an fs/* request.
  const plain = await start(t, fake, { readTextFile: false, writeTextFile: false });
  await writeFile(join(plain.cwd, "f.txt"), "from disk\n");
  await fake.script([toolCall("r4", "read_file", { path: "f.txt" }), done()]);
  const psid = await plain.a.newSession(plain.cwd);
  assert.equal((await plain.a.prompt(psid, "read", 30000)).stopReason, "end_turn");
  assert.equal(plain.a.fsCalls.length, 0);
  assert.equal(plain.a.wire.filter((w) => w.msg?.method?.startsWith("fs/")).length, 0);
  const reqs = await fake.requests();
  assert.equal(JSON.parse(JSON.parse(reqs.at(-1).body).messages.at(-1).content).content, "from disk\n");
  await a.assertSdkAccepted();
});
