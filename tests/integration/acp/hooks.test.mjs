// Hooks seen from an editor: the official ACP SDK as the client, the openai provider against the fake model
// server, command hooks from the configuration as real child processes. A before_tool hook's denial is a
// tool_call_update the editor shows (and the model reads the reason); a prompt_submit hook's context reaches
// the model's request. Every frame is checked by the SDK against the ACP schema.
import { test } from "node:test";
import assert from "node:assert/strict";
import { access, chmod, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { scope } from "./lib.mjs";
import { startFakeModel, textChunk, finishChunk } from "../fake-model.mjs";

const TEST = { timeout: 60000 };

async function hookScript(dir, name, body) {
  const path = join(dir, name);
  await writeFile(path, `#!/bin/sh\n${body}\n`);
  await chmod(path, 0o755);
  return path;
}

async function start(t, fake, hooks) {
  const s = scope(t);
  const dir = await s.tempDir("ah-acp-hooks-");
  let ini = `[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\nbase_url = ${fake.baseUrl}\nmodel = m1\n`;
  for (const [name, h] of Object.entries(hooks)) {
    const path = await hookScript(dir, `${name}.sh`, h.body);
    ini += `[hook.${name}]\nevent = ${h.event}\ncommand = ${path}\n${h.extra ?? ""}`;
  }
  const conf = join(dir, "agenthost.ini");
  await writeFile(conf, ini);
  const a = await s.spawnAgent({ args: ["--config", conf] });
  await a.initialize(1);
  const cwd = await s.tempDir("ah-acp-cwd-");
  return { a, cwd };
}

const toolCall = (id, name, args) => ({
  sse: [{ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id, type: "function",
    function: { name, arguments: JSON.stringify(args) } }] } }] }, finishChunk("tool_calls"), "[DONE]"],
});

test("ACP-OUTPUT-PERMISSION: hooks through ACP: a before_tool hook denies rm -rf, the editor sees the denial, the model reads the reason", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake, {
    guard: {
      event: "before_tool",
      extra: "match = run_command\n",
      body: "doc=$(cat)\ncase \"$doc\" in *'rm -rf /*'*) echo 'refusing rm -rf outside the workspace' >&2; exit 2;; esac",
    },
  });
  // `true ||` keeps rm from ever running; the marker says whether the command ran at all.
  await fake.script([toolCall("c1", "run_command", { command: "true || rm -rf /*; touch ran" }),
    { sse: [textChunk("understood"), finishChunk("stop"), "[DONE]"] }]);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "clean up", 30000);
  assert.equal(r.stopReason, "end_turn", JSON.stringify(r));
  assert.equal(a.permissions.length, 0, "the denied call never asked the editor");
  await assert.rejects(access(join(cwd, "ran")), "the command never ran");
  const updates = a.wireUpdates(sid).map((u) => u.update);
  const texts = (u) => (u.content ?? []).map((c) => c.content?.text ?? "").join("\n");
  const hookUpdate = updates.find((u) => u.sessionUpdate === "tool_call_update" && /Hook guard: denied/.test(texts(u)));
  assert.ok(hookUpdate, `a tool_call_update shows the hook's denial: ${JSON.stringify(updates)}`);
  assert.match(texts(hookUpdate), /refusing rm -rf outside the workspace/);
  const failed = updates.find((u) => u.sessionUpdate === "tool_call_update" && u.status === "failed");
  assert.ok(failed && failed.toolCallId === hookUpdate.toolCallId, "the same tool call failed");
  const second = JSON.parse((await fake.requests())[1].body);
  const toolMsg = second.messages.at(-1);
  assert.equal(toolMsg.role, "tool");
  assert.match(JSON.stringify(toolMsg.content), /denied by hook guard: refusing rm -rf outside the workspace/);
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: hooks through ACP: a prompt_submit hook adds context that the model receives", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake, {
    rules: {
      event: "prompt_submit",
      body: "cat >/dev/null\nprintf '%s\\n' '{\"context\": \"Team rule: never push to main.\"}'",
    },
  });
  await fake.script([{ sse: [textChunk("ok"), finishChunk("stop"), "[DONE]"] }]);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "hello", 30000);
  assert.equal(r.stopReason, "end_turn", JSON.stringify(r));
  const body = JSON.parse((await fake.requests())[0].body);
  const user = JSON.stringify(body.messages.at(-1));
  assert.match(user, /hello/);
  assert.match(user, /Team rule: never push to main\./, `the model's request: ${user}`);
  const card = a.wireUpdates(sid).map((u) => u.update).find((u) => u.sessionUpdate === "tool_call" && /Hook rules/.test(u.title));
  assert.ok(card, "the editor sees the hook's run");
  assert.equal(card.status, "completed");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: hooks through ACP: a prompt_submit hook that refuses ends the prompt with refusal", TEST, async (t) => {
  const fake = await startFakeModel(t);
  const { a, cwd } = await start(t, fake, {
    gate: { event: "prompt_submit", body: "cat >/dev/null\necho 'prompts are closed today' >&2\nexit 2" },
  });
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "hello", 30000);
  assert.equal(r.stopReason, "refusal", JSON.stringify(r));
  assert.equal((await fake.requests()).length, 0, "the model was never asked");
  const card = a.wireUpdates(sid).map((u) => u.update).find((u) => u.sessionUpdate === "tool_call" && /Hook gate/.test(u.title));
  assert.ok(card && card.status === "failed", "the denial is shown");
  assert.match(JSON.stringify(card.content), /prompts are closed today/);
  await a.assertSdkAccepted();
});
