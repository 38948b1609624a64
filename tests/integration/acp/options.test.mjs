// Zed's selectors, with the official ACP SDK as the editor and the openai provider against the fake model
// server: the session's config options (model, mode, thought_level) in session/new and session/load,
// session/set_config_option answering the full list (and -32602 naming a bad value), the next turn's
// request using the chosen model and effort, the modes deciding whether a write asks, runs at once or is
// refused, changes from another surface (Remote, as the web UI calls it) reaching the editor as
// config_option_update / session_info_update, the commands (available_commands_update, handled as
// prompts), and authMethods. Responses are checked against the SDK's own zod schemas; updates by the SDK.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { scope, expectRpcError, waitFor } from "./lib.mjs";
import { freePort, postApi } from "../browser/lib.mjs";
import { startFakeModel, textChunk, finishChunk, usageChunk } from "../fake-model.mjs";
import * as schema from "../node_modules/@agentclientprotocol/sdk/dist/v1/schema/zod.gen.js";

const TEST = { timeout: 60000 };

async function start(t, fake, { extra = "", env = {} } = {}) {
  const s = scope(t);
  const conf = join(await s.tempDir("ah-acp-opt-conf-"), "agenthost.ini");
  await writeFile(conf, `[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\n` +
    `base_url = ${fake.baseUrl}\nmodel = m1\nmodels = m1, m2\nreasoning_efforts = low, high\n` +
    `context_window = 8192\n${extra}`);
  const a = await s.spawnAgent({ args: ["--config", conf], env });
  const init = await a.initialize(1);
  return { a, s, init, cwd: await s.tempDir("ah-acp-opt-cwd-") };
}

const done = (text = "ok") => ({ sse: [textChunk(text), finishChunk("stop"), usageChunk(10, 2), "[DONE]"] });
const toolCall = (id, name, args) => ({
  sse: [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id, type: "function",
    function: { name, arguments: JSON.stringify(args) } }] } }] }, finishChunk("tool_calls"), "[DONE]"],
});
const updates = (a, sid) => a.wireUpdates(sid).map((u) => u.update);
const option = (list, id) => list.find((o) => o.id === id);

test("ACP-CODEC: Zed: session/new lists the model, mode and thought_level options; set_config_option answers the full list and the next turn uses the model and effort", TEST, async (t) => {
  const fake = await startFakeModel(t);
  await fake.script([done(), done()]);
  const { a, init, cwd } = await start(t, fake);
  schema.zInitializeResponse.parse(init);
  assert.deepEqual(init.authMethods, [], "a provider without a key offers no authentication");
  const created = await a.request("session/new", { cwd, mcpServers: [] });
  schema.zNewSessionResponse.parse(created);
  const sid = created.sessionId;
  assert.deepEqual(created.configOptions.map((o) => [o.id, o.category, o.type]),
    [["model", "model", "select"], ["mode", "mode", "select"], ["thought_level", "thought_level", "select"]]);
  assert.deepEqual(option(created.configOptions, "model").options.map((o) => o.value), ["m1", "m2"]);
  assert.equal(option(created.configOptions, "model").currentValue, "m1");
  assert.equal(option(created.configOptions, "mode").currentValue, "ask");
  assert.deepEqual(option(created.configOptions, "thought_level").options.map((o) => o.value),
    ["default", "low", "high"]);
  assert.equal(created.modes.currentModeId, "ask");
  assert.deepEqual(created.modes.availableModes.map((m) => m.id), ["ask", "accept_edits", "read_only"]);

  // The first turn: the configured model, no effort sent.
  assert.equal((await a.prompt(sid, "one", 30000)).stopReason, "end_turn");
  let body = JSON.parse((await fake.requests())[0].body);
  assert.equal(body.model, "m1");
  assert.equal(body.reasoning_effort, undefined);

  const set = await a.request("session/set_config_option", { sessionId: sid, configId: "model", value: "m2" });
  schema.zSetSessionConfigOptionResponse.parse(set);
  assert.equal(set.configOptions.length, 3, "the full list");
  assert.equal(option(set.configOptions, "model").currentValue, "m2");
  const effort = await a.request("session/set_config_option",
    { sessionId: sid, configId: "thought_level", value: "high" });
  assert.equal(option(effort.configOptions, "thought_level").currentValue, "high");
  assert.equal(option(effort.configOptions, "model").currentValue, "m2", "the earlier change holds");

  assert.equal((await a.prompt(sid, "two", 30000)).stopReason, "end_turn");
  body = JSON.parse((await fake.requests())[1].body);
  assert.equal(body.model, "m2", "the next turn's request uses the chosen model");
  assert.equal(body.reasoning_effort, "high");

  await expectRpcError(a.request("session/set_config_option", { sessionId: sid, configId: "model", value: "m9" }),
    -32602, /m9/, "a model the provider does not offer");
  await expectRpcError(a.request("session/set_config_option", { sessionId: sid, configId: "colour", value: "x" }),
    -32602, /colour/, "an option the session does not have");
  await expectRpcError(a.request("session/set_config_option",
    { sessionId: sid, configId: "mode", type: "boolean", value: true }), -32602, /value/, "a boolean value");

  // Every change reached the editor as config_option_update too (with the state after it).
  const opt = updates(a, sid).filter((u) => u.sessionUpdate === "config_option_update");
  assert.equal(opt.length, 2, JSON.stringify(opt));
  assert.equal(option(opt[1].configOptions, "thought_level").currentValue, "high");

  // Stored: a new connection loading the session sees the same options.
  const load = await a.request("session/load", { sessionId: sid, cwd, mcpServers: [] });
  schema.zLoadSessionResponse.parse(load);
  assert.equal(option(load.configOptions, "model").currentValue, "m2");
  assert.equal(option(load.configOptions, "thought_level").currentValue, "high");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: Zed: the mode decides whether a write asks (ask), runs at once (accept_edits) or is refused (read_only); current_mode_update follows", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake);
  const target = join(cwd, "f.txt");
  await writeFile(target, "0\n");
  await fake.script([toolCall("w1", "write_file", { path: "f.txt", content: "1\n" }), done(),
    toolCall("w2", "write_file", { path: "f.txt", content: "2\n" }), done(),
    toolCall("w3", "write_file", { path: "f.txt", content: "3\n" }), done(),
    toolCall("r1", "read_file", { path: "f.txt" }), done()]);
  a.onPermission = async (record) => ({ outcome: { outcome: "selected",
    optionId: record.params.options.find((o) => o.kind === "allow_once").optionId } });
  const sid = await a.newSession(cwd);

  assert.equal((await a.prompt(sid, "write 1", 30000)).stopReason, "end_turn");
  assert.equal(a.permissions.length, 1, "ask: the write asked");
  assert.equal(await readFile(target, "utf8"), "1\n");

  await a.request("session/set_mode", { sessionId: sid, modeId: "accept_edits" });
  assert.equal((await a.prompt(sid, "write 2", 30000)).stopReason, "end_turn");
  assert.equal(a.permissions.length, 1, "accept_edits: no question");
  assert.equal(await readFile(target, "utf8"), "2\n");

  await a.request("session/set_config_option", { sessionId: sid, configId: "mode", value: "read_only" });
  assert.equal((await a.prompt(sid, "write 3", 30000)).stopReason, "end_turn");
  assert.equal(a.permissions.length, 1);
  assert.equal(await readFile(target, "utf8"), "2\n", "read_only: the write was refused");
  const failed = updates(a, sid).filter((u) => u.sessionUpdate === "tool_call_update" && u.status === "failed");
  assert.equal(failed.length, 1, JSON.stringify(updates(a, sid)));
  const refusal = JSON.parse((await fake.requests())[5].body).messages.at(-1).content;
  assert.match(refusal, /read-only mode/, "the model reads why");
  // A read still runs in read_only.
  assert.equal((await a.prompt(sid, "read", 30000)).stopReason, "end_turn");
  const read = JSON.parse((await fake.requests())[7].body).messages.at(-1).content;
  assert.equal(JSON.parse(read).content, "2\n");

  const modes = updates(a, sid).filter((u) => u.sessionUpdate === "current_mode_update").map((u) => u.currentModeId);
  assert.deepEqual(modes, ["accept_edits", "read_only"]);
  await expectRpcError(a.request("session/set_mode", { sessionId: sid, modeId: "yolo" }), -32602, /yolo/);
  await a.assertSdkAccepted();
});

test("ACP-OUTPUT-PERMISSION: Zed: changes from the web UI's Remote services reach the editor: a rename (session_info_update) and an option (config_option_update)", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const port = await freePort();
  const { a, s, cwd } = await start(t, fake, {
    extra: `[plugin.browser]\nmodes = acp\nlisten = 127.0.0.1:${port}\n[plugin.remote]\nmodes = acp\n`,
  });
  const sid = await a.newSession(cwd);
  const token = (await readFile(join(a.stateDir, "token"), "utf8")).trim();
  const origin = `http://127.0.0.1:${port}`;
  await postApi(origin, token, "remote.invoke",
    { namespace: "sessions", method: "rename", args: { session: sid, title: "Renamed in the browser" } });
  await waitFor(() => updates(a, sid).some((u) => u.sessionUpdate === "session_info_update"), 10000,
    "the rename to reach the editor");
  const info = updates(a, sid).find((u) => u.sessionUpdate === "session_info_update");
  assert.equal(info.title, "Renamed in the browser");
  const list = await a.request("session/list", { cwd });
  assert.equal(list.sessions.find((x) => x.sessionId === sid).title, "Renamed in the browser");

  const after = await postApi(origin, token, "remote.invoke",
    { namespace: "sessions", method: "set_option", args: { session: sid, option: "model", value: "m2" } });
  assert.equal(option(after, "model").currentValue, "m2", "Remote answers the full list too");
  await waitFor(() => updates(a, sid).some((u) => u.sessionUpdate === "config_option_update"), 10000,
    "the option change to reach the editor");
  const upd = updates(a, sid).find((u) => u.sessionUpdate === "config_option_update");
  assert.equal(option(upd.configOptions, "model").currentValue, "m2");
  await assert.rejects(postApi(origin, token, "remote.invoke",
    { namespace: "sessions", method: "set_option", args: { session: sid, option: "mode", value: "nope" } }),
  /bad-request/);
  await a.assertSdkAccepted();
  a.assertStdoutPure();
  void s;
});

test("ACP-OUTPUT-PERMISSION: Zed: available_commands_update after session/new; /mode and /model run as commands, never reach the model; /help lists them", TEST, async (t) => {
  const fake = await startFakeModel(t);
  await fake.script([done("from the model")]);
  const { a, cwd } = await start(t, fake);
  const sid = await a.newSession(cwd);
  await waitFor(() => updates(a, sid).some((u) => u.sessionUpdate === "available_commands_update"), 5000,
    "the commands");
  const cmds = updates(a, sid).find((u) => u.sessionUpdate === "available_commands_update").availableCommands;
  assert.deepEqual(cmds.map((c) => c.name), ["mode", "model", "thinking", "help"]);
  assert.equal(cmds[0].input.hint, "ask | accept_edits | read_only");

  let r = await a.prompt(sid, "/mode read_only", 10000);
  assert.equal(r.stopReason, "end_turn");
  assert.match(a.agentText(sid), /The mode is now Read only\./);
  r = await a.prompt(sid, "/model m2", 10000);
  assert.match(a.agentText(sid), /The model is now m2\./);
  r = await a.prompt(sid, "/model nope", 10000);
  assert.equal(r.stopReason, "end_turn");
  assert.match(a.agentText(sid), /Not changed: .*nope/);
  await a.prompt(sid, "/help", 10000);
  assert.match(a.agentText(sid), /\/thinking a reasoning effort/);
  assert.equal((await fake.requests()).length, 0, "no command reached the model");
  // Text that only looks like a command is a prompt.
  assert.equal((await a.prompt(sid, "/etc/passwd is what file?", 30000)).stopReason, "end_turn");
  const body = JSON.parse((await fake.requests())[0].body);
  assert.equal(body.model, "m2");
  assert.match(JSON.stringify(body.messages.at(-1)), /etc\/passwd is what file/);
  await a.assertSdkAccepted();
});

test("ACP-HANDSHAKE: Zed: authMethods names the provider's API key; without the key authenticate and session/new answer auth_required (-32000), with it both succeed", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const missing = await start(t, fake, { extra: "api_key_env = AH_TEST_FAKE_KEY\n" });
  schema.zInitializeResponse.parse(missing.init);
  assert.equal(missing.init.authMethods.length, 1);
  assert.equal(missing.init.authMethods[0].id, "agenthost-api-key");
  assert.match(missing.init.authMethods[0].description, /AH_TEST_FAKE_KEY/);
  await expectRpcError(missing.a.request("authenticate", { methodId: "agenthost-api-key" }), -32000, /API key/);
  await expectRpcError(missing.a.request("session/new", { cwd: missing.cwd, mcpServers: [] }), -32000, /API key/);

  const ready = await start(t, fake, { extra: "api_key_env = AH_TEST_FAKE_KEY\n",
    env: { AH_TEST_FAKE_KEY: "sk-test-not-secret" } });
  assert.equal(ready.init.authMethods.length, 1);
  assert.doesNotMatch(JSON.stringify(ready.init), /sk-test-not-secret/, "never the key itself");
  assert.deepEqual(await ready.a.request("authenticate", { methodId: "agenthost-api-key" }), {});
  await ready.a.newSession(ready.cwd);
});
