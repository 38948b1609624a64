// `agenthost acp` driven by the official ACP SDK (client side) as the editor. Each test spawns the real
// binary with its own temporary state directory and names the PROTOCOLS.md tag it pins. The model is the
// embedded echo provider: "hello" → "echo: hello"; directives such as `/sleep MS` and `/tool NAME JSON`
// (docs/sessions.md). Order assertions use the wire (the raw stdout lines in the order they were read),
// not the order in which the SDK happened to call our handlers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  acp,
  scope,
  sleep,
  waitFor,
  withTimeout,
  expectRpcError,
  fileExists,
  processExists,
  isJsonRpcMessage,
} from "./lib.mjs";

const M = acp.methods.agent;
const TEST = { timeout: 60000 };

/** A started agent: spawned, initialized (version 1), with a temporary cwd for sessions. */
async function start(t, options = {}) {
  const s = scope(t);
  const a = await s.spawnAgent(options);
  const init = await a.initialize(1);
  const cwd = options.cwd ?? (await s.tempDir("ah-acp-cwd-"));
  return { s, a, init, cwd };
}

const textOf = (blocks) => blocks.map((b) => b.text ?? "").join("");

/** The wire updates of a session between two wire indexes, reduced to [kind, text] runs. */
function messageRuns(updates) {
  const runs = [];
  for (const u of updates) {
    const kind = u.update?.sessionUpdate;
    if (kind !== "user_message_chunk" && kind !== "agent_message_chunk") continue;
    const text = u.update.content?.type === "text" ? u.update.content.text : `[${u.update.content?.type}]`;
    const short = kind === "user_message_chunk" ? "user" : "agent";
    const last = runs[runs.length - 1];
    const mid = u.update.messageId ?? null;
    if (last && last[0] === short && last[2] === mid) last[1] += text;
    else runs.push([short, text, mid]);
  }
  return runs.map(([k, txt]) => [k, txt]);
}

/** The tool-call updates of one tool call id, in wire order. */
function toolUpdates(a, sessionId, toolCallId) {
  return a
    .wireUpdates(sessionId)
    .filter(
      (u) =>
        (u.update?.sessionUpdate === "tool_call" || u.update?.sessionUpdate === "tool_call_update") &&
        u.update.toolCallId === toolCallId,
    );
}

/** The last status a tool call was given on the wire (undefined when none). */
function lastStatus(updates) {
  let status;
  for (const u of updates) if (u.update.status) status = u.update.status;
  return status;
}

const allowedOptions = [
  { optionId: "allow_once", kind: "allow_once" },
  { optionId: "allow_always", kind: "allow_always" },
  { optionId: "reject_once", kind: "reject_once" },
  { optionId: "reject_always", kind: "reject_always" },
];

function assertPermissionShape(perm, sessionId) {
  const p = perm.params;
  assert.equal(p.sessionId, sessionId, "permission request: sessionId");
  assert.equal(typeof p.toolCall?.toolCallId, "string", "permission request: toolCall.toolCallId");
  assert.deepEqual(
    p.options.map((o) => ({ optionId: o.optionId, kind: o.kind })),
    allowedOptions,
    "permission options (optionId, kind)",
  );
  for (const o of p.options) assert.ok(typeof o.name === "string" && o.name.length > 0, `option ${o.optionId} has a name`);
}

// ---------------------------------------------------------------------------------------------------------
// ACP-HANDSHAKE

test("ACP-HANDSHAKE: initialize answers protocolVersion 1 for a request of 1, 99 and 0", TEST, async (t) => {
  const s = scope(t);
  for (const asked of [1, 99, 0]) {
    const a = await s.spawnAgent();
    const r = await a.initialize(asked);
    assert.equal(r.protocolVersion, 1, `initialize(${asked}) → protocolVersion`);
    await a.kill();
  }
});

test("ACP-HANDSHAKE: capabilities only for what works, authMethods [], agentInfo, authenticate {}", TEST, async (t) => {
  const { a, init } = await start(t);
  const caps = init.agentCapabilities;
  assert.equal(typeof caps, "object", `agentCapabilities in ${JSON.stringify(init)}`);
  assert.equal(caps.loadSession, true, "loadSession");
  // Text and resource links are the baseline; richer blocks are refused, so they are not advertised.
  const pc = caps.promptCapabilities ?? {};
  for (const k of ["image", "audio", "embeddedContext"]) assert.notEqual(pc[k], true, `promptCapabilities.${k}`);
  // MCP servers over stdio and Streamable HTTP are accepted (acp/mcp.test.mjs); the old SSE transport is not.
  const mc = caps.mcpCapabilities ?? {};
  assert.equal(mc.http, true, "mcpCapabilities.http");
  assert.notEqual(mc.sse, true, "mcpCapabilities.sse");
  // Issue #5: session close/list/resume are implemented, so they are advertised ({} each).
  const sc = caps.sessionCapabilities ?? {};
  for (const k of ["list", "close", "resume"]) {
    assert.equal(typeof sc[k], "object", `sessionCapabilities.${k} advertised (got ${JSON.stringify(sc)})`);
    assert.notEqual(sc[k], null, `sessionCapabilities.${k}`);
  }
  assert.deepEqual(init.authMethods, [], "authMethods");
  const info = init.agentInfo;
  assert.equal(typeof info?.name, "string", `agentInfo ${JSON.stringify(info)}`);
  assert.ok(info.name.length > 0, "agentInfo.name");
  assert.equal(typeof info.version, "string", "agentInfo.version");
  assert.ok(info.version.length > 0, "agentInfo.version");
  assert.equal(typeof info.title, "string", "agentInfo.title");
  const auth = await a.request(M.authenticate, { methodId: "agenthost" });
  assert.deepEqual(auth, {}, "authenticate result");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-HANDSHAKE: session/new needs an absolute cwd (relative → -32602)", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  const other = await a.newSession(cwd);
  assert.notEqual(sid, other, "two sessions get different ids");
  await expectRpcError(
    a.request(M.session.new, { cwd: "relative/dir", mcpServers: [] }),
    -32602,
    undefined,
    "session/new with a relative cwd",
  );
  await expectRpcError(
    a.request(M.session.new, { cwd: "./", mcpServers: [] }),
    -32602,
    undefined,
    "session/new with cwd ./",
  );
  // The connection keeps working after the refusals.
  assert.equal(typeof (await a.newSession(cwd)), "string");
  a.assertStdoutPure();
});

test("ACP-HANDSHAKE: mcpServers are accepted; one that cannot run is skipped by name, never the session", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const r = await a.request(M.session.new, {
    cwd,
    mcpServers: [
      { name: "gone", command: "/nonexistent/mcp-server", args: [], env: [] },
      { type: "sse", name: "legacy", url: "http://127.0.0.1:9/sse", headers: [] },
    ],
  });
  assert.equal(typeof r.sessionId, "string", JSON.stringify(r));
  await waitFor(() => /legacy/.test(a.stderr), 5000, "a log line naming the skipped SSE server");
  // The session works; the server that cannot start is left out of its turn with a notice, not an error.
  const p = await a.prompt(r.sessionId, "hello", 20000);
  assert.equal(p.stopReason, "end_turn");
  await expectRpcError(
    a.request(M.session.new, { cwd, mcpServers: [{ command: "/bin/true" }] }),
    -32602,
    /name/,
    "a server without a name",
  );
  a.assertStdoutPure();
});

test("ACP-HANDSHAKE: additionalDirectories is refused unless advertised", TEST, async (t) => {
  const { s, a, init, cwd } = await start(t);
  const extra = await s.tempDir("ah-acp-extra-");
  const advertised = init.agentCapabilities?.sessionCapabilities?.additionalDirectories;
  const req = a.request(M.session.new, { cwd, mcpServers: [], additionalDirectories: [extra] });
  if (advertised) {
    const r = await req;
    assert.equal(typeof r.sessionId, "string", "advertised additionalDirectories are accepted");
  } else {
    await expectRpcError(req, -32602, undefined, "session/new with additionalDirectories (not advertised)");
  }
  // An empty list activates no additional roots: it is the same as omitting the field.
  const r2 = await a.request(M.session.new, { cwd, mcpServers: [], additionalDirectories: [] });
  assert.equal(typeof r2.sessionId, "string", "additionalDirectories: [] is accepted");
});

// ---------------------------------------------------------------------------------------------------------
// ACP-OUTPUT-PERMISSION / ACP-PROMPT-CANCEL: prompts

test("ACP-OUTPUT-PERMISSION: prompt 'hello' → agent_message_chunk 'echo: hello' (with messageId) before {stopReason: end_turn}", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "hello");
  assert.equal(r.stopReason, "end_turn", `prompt result ${JSON.stringify(r)}`);
  const respIdx = a.responseIndex(M.session.prompt, (m) => m.params.sessionId === sid);
  assert.ok(respIdx >= 0, "the prompt response is on the wire");
  // One array of events in wire order: updates of the session and the prompt result.
  const events = [];
  for (const w of a.wire) {
    if (w.i === respIdx) events.push({ kind: "result", stopReason: w.msg.result?.stopReason });
    else if (w.msg?.method === "session/update" && w.msg.params?.sessionId === sid) {
      const u = w.msg.params.update;
      events.push({ kind: u.sessionUpdate, text: u.content?.text, messageId: u.messageId });
    }
  }
  const resultAt = events.findIndex((e) => e.kind === "result");
  const chunks = events.filter((e) => e.kind === "agent_message_chunk");
  assert.ok(chunks.length > 0, `no agent_message_chunk; events ${JSON.stringify(events)}`);
  const before = events.slice(0, resultAt).filter((e) => e.kind === "agent_message_chunk");
  assert.equal(before.map((e) => e.text).join(""), "echo: hello", `events ${JSON.stringify(events)}`);
  assert.equal(
    events.slice(resultAt + 1).filter((e) => e.kind === "agent_message_chunk").length,
    0,
    `no chunk after the result; events ${JSON.stringify(events)}`,
  );
  for (const c of before) assert.equal(typeof c.messageId, "string", `chunk messageId in ${JSON.stringify(c)}`);
  assert.equal(a.responsesTo(a.sentRequest(M.session.prompt).msg.id).length, 1, "one response to the prompt");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: by default committed text is one chunk; with [plugin.acp] stream_deltas = true, deltas instead", TEST, async (t) => {
  const s = scope(t);
  const cwd = await s.tempDir("ah-acp-cwd-");
  // Default: the committed message, not the five deltas the echo streams.
  const a = await s.spawnAgent();
  await a.initialize(1);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "/chunks 5\nhello there")).stopReason, "end_turn");
  const committed = a.wireUpdates(sid).filter((u) => u.update.sessionUpdate === "agent_message_chunk");
  assert.equal(committed.length, 1, `chunks ${JSON.stringify(committed.map((u) => u.update))}`);
  assert.equal(committed[0].update.content.text, "echo: hello there");
  await a.kill();

  const conf = join(await s.tempDir("ah-acp-conf-"), "agenthost.ini");
  await writeFile(conf, "[plugin.acp]\nstream_deltas = true\n");
  const b = await s.spawnAgent({ args: ["--config", conf] });
  await b.initialize(1);
  const sid2 = await b.newSession(cwd);
  assert.equal((await b.prompt(sid2, "/chunks 5\nhello there")).stopReason, "end_turn");
  const deltas = b.wireUpdates(sid2).filter((u) => u.update.sessionUpdate === "agent_message_chunk");
  assert.ok(deltas.length >= 2, `streamed deltas: ${JSON.stringify(deltas.map((u) => u.update))}`);
  assert.equal(
    deltas.map((u) => u.update.content.text).join(""),
    "echo: hello there",
    "the deltas make the text once (the committed message is not sent again)",
  );
  const mids = new Set(deltas.map((u) => u.update.messageId));
  assert.equal(mids.size, 1, `one messageId for the deltas of one message: ${[...mids]}`);
  await b.assertSdkAccepted();
  b.assertStdoutPure();
});

test("ACP-PROMPT-CANCEL: a queued second prompt is answered after the first, in order, each with its own result", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  const order = [];
  const p1 = a.prompt(sid, "/sleep 300\nfirst").then((r) => (order.push("first"), r));
  const p2 = a.prompt(sid, "second").then((r) => (order.push("second"), r));
  const [r1, r2] = await Promise.all([p1, p2]);
  assert.equal(r1.stopReason, "end_turn", "first result");
  assert.equal(r2.stopReason, "end_turn", "second result");
  assert.deepEqual(order, ["first", "second"], "the SDK saw the results in order");
  const i1 = a.responseIndex(M.session.prompt, (m) => textOf(m.params.prompt).includes("first"));
  const i2 = a.responseIndex(M.session.prompt, (m) => textOf(m.params.prompt) === "second");
  assert.ok(i1 >= 0 && i2 >= 0, "both responses are on the wire");
  assert.ok(i1 < i2, `first answered before second (wire ${i1} < ${i2})`);
  assert.equal(a.agentText(sid, 0, i1), "echo: first", "the first's text arrives before its result");
  assert.equal(a.agentText(sid, i1, i2), "echo: second", "the second's text arrives after the first finished");
  assert.equal(a.agentText(sid, i2), "", "nothing after the second result");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-PROMPT-CANCEL: cancel with a prompt queued behind the running one: each answered once, in order, by its own outcome", TEST, async (t) => {
  // The spec leaves open whether session/cancel also cancels prompts queued behind the running turn (the
  // queue is agenthost's own): either is accepted, but each answer must match what happened to that
  // prompt (outcome by message id), and a prompt sent after the cancel must run normally.
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  const p1 = a.prompt(sid, "/sleep 5000\nfirst", 15000);
  const p2 = a.prompt(sid, "second", 15000);
  await sleep(300);
  await a.cancel(sid);
  const p3 = a.prompt(sid, "third", 15000);
  const [r1, r2, r3] = await Promise.all([p1, p2, p3]);
  console.log(`  queued prompt behind a cancelled turn → ${r2.stopReason}`);
  assert.equal(r1.stopReason, "cancelled", "the running prompt is cancelled");
  assert.ok(["cancelled", "end_turn"].includes(r2.stopReason), `queued prompt: ${JSON.stringify(r2)}`);
  assert.equal(r3.stopReason, "end_turn", "a prompt sent after the cancel runs");
  const idx = (txt) => a.responseIndex(M.session.prompt, (m) => textOf(m.params.prompt).endsWith(txt));
  const [i1, i2, i3] = [idx("first"), idx("second"), idx("third")];
  assert.ok(i1 >= 0 && i1 < i2 && i2 < i3, `answered in order (wire ${i1} < ${i2} < ${i3})`);
  for (const txt of ["first", "second", "third"]) {
    const id = a.sentRequest(M.session.prompt, (m) => textOf(m.params.prompt).endsWith(txt)).msg.id;
    assert.equal(a.responsesTo(id).length, 1, `prompt "${txt}" answered exactly once`);
  }
  assert.equal(a.agentText(sid, 0, i1), "", "the cancelled turn committed nothing");
  assert.equal(a.agentText(sid, i1, i2), r2.stopReason === "end_turn" ? "echo: second" : "", "the queued prompt's text matches its outcome");
  assert.equal(a.agentText(sid, i2, i3), "echo: third");
  a.assertStdoutPure();
});

test("ACP-PROMPT-CANCEL: sessions of one connection run independently (a sleeping turn does not hold another session)", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const slow = await a.newSession(cwd);
  const fast = await a.newSession(cwd);
  const p1 = a.prompt(slow, "/sleep 1500\nslow", 10000);
  await sleep(100);
  const t0 = performance.now();
  const r2 = await a.prompt(fast, "fast");
  const ms = Math.round(performance.now() - t0);
  assert.equal(r2.stopReason, "end_turn");
  assert.ok(ms < 1000, `the other session answered in ${ms} ms while the first slept 1500 ms`);
  assert.equal(a.agentText(fast), "echo: fast");
  assert.equal(a.agentText(slow), "", "updates are attributed to their own session");
  assert.equal((await p1).stopReason, "end_turn");
  assert.equal(a.agentText(slow), "echo: slow");
});

test("ACP-PROMPT-CANCEL: session/cancel during /sleep 5000 → stopReason cancelled exactly once, quickly", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  const p = a.prompt(sid, "/sleep 5000\nlate", 15000);
  await sleep(300); // the turn is claimed and sleeping
  const t0 = performance.now();
  await a.cancel(sid);
  const r = await p;
  const ms = Math.round(performance.now() - t0);
  console.log(`  session/cancel → prompt answered in ${ms} ms`);
  assert.equal(r.stopReason, "cancelled", `prompt result ${JSON.stringify(r)}`);
  assert.ok(ms < 2000, `cancelled in ${ms} ms (bound 2000 ms, the sleep was 5000 ms)`);
  await sleep(500);
  const id = a.sentRequest(M.session.prompt).msg.id;
  assert.equal(a.responsesTo(id).length, 1, "exactly one response to the cancelled prompt");
  assert.ok(!a.agentText(sid).includes("late"), "no echo from the cancelled turn");
  // The session keeps working after the cancel.
  const r2 = await a.prompt(sid, "after");
  assert.equal(r2.stopReason, "end_turn");
  assert.ok(a.agentText(sid).endsWith("echo: after"), `text ${JSON.stringify(a.agentText(sid))}`);
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-PROMPT-CANCEL: session/cancel for an unknown session id is ignored (no answer, connection keeps working)", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const before = a.wire.length;
  await a.cancel("no-such-session");
  await a.cancel("01900000-0000-7000-8000-000000000000");
  await sleep(200);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "still here");
  assert.equal(r.stopReason, "end_turn");
  assert.equal(a.agentText(sid), "echo: still here");
  const stray = a.wire.slice(before).filter((w) => w.msg && !("method" in w.msg) && (w.msg.id === null || "error" in w.msg));
  assert.deepEqual(stray.map((w) => w.raw), [], "a notification gets no response, not even an error");
  a.assertStdoutPure();
});

// ---------------------------------------------------------------------------------------------------------
// ACP-OUTPUT-PERMISSION: tool approvals through /tool run_command

async function toolTurn(t, { file, answer }) {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  a.onPermission = async () => answer;
  const r = await a.prompt(sid, `/tool run_command {"command":"echo ran > ${file}"}`);
  const perm = a.permissions[0];
  assert.ok(perm, "session/request_permission was called");
  assertPermissionShape(perm, sid);
  const updates = toolUpdates(a, sid, perm.params.toolCall.toolCallId);
  return { a, cwd, sid, r, perm, updates };
}

test("ACP-OUTPUT-PERMISSION: allow_once → the command runs, tool_call then tool_call_update completed", TEST, async (t) => {
  const { a, cwd, sid, r, updates } = await toolTurn(t, {
    file: "allowed.txt",
    answer: { outcome: { outcome: "selected", optionId: "allow_once" } },
  });
  assert.equal(r.stopReason, "end_turn", `prompt result ${JSON.stringify(r)}`);
  assert.equal(a.permissions.length, 1, "one permission request");
  assert.ok(updates.length >= 2, `tool updates ${JSON.stringify(updates.map((u) => u.update))}`);
  assert.equal(updates[0].update.sessionUpdate, "tool_call", "the tool call is announced with tool_call first");
  assert.equal(typeof updates[0].update.title, "string", "tool_call has a title");
  assert.equal(updates.at(-1).update.sessionUpdate, "tool_call_update");
  assert.equal(lastStatus(updates), "completed", `tool updates ${JSON.stringify(updates.map((u) => u.update))}`);
  const respIdx = a.responseIndex(M.session.prompt);
  assert.ok(updates.at(-1).i < respIdx, "the terminal tool update comes before the prompt result");
  assert.ok(fileExists(cwd, "allowed.txt"), "the command ran in the session cwd");
  assert.equal(await readFile(join(cwd, "allowed.txt"), "utf8"), "ran\n");
  assert.match(a.agentText(sid), /tool run_command/, "the tool result is committed as text");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: reject_once → tool_call_update failed, the command never ran", TEST, async (t) => {
  const { a, cwd, r, updates } = await toolTurn(t, {
    file: "rejected.txt",
    answer: { outcome: { outcome: "selected", optionId: "reject_once" } },
  });
  assert.equal(r.stopReason, "end_turn", `prompt result ${JSON.stringify(r)}`);
  assert.equal(lastStatus(updates), "failed", `tool updates ${JSON.stringify(updates.map((u) => u.update))}`);
  await sleep(300);
  assert.ok(!fileExists(cwd, "rejected.txt"), "a rejected command does not run");
  await a.assertSdkAccepted();
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: a `cancelled` outcome denies (failed, nothing ran)", TEST, async (t) => {
  const { a, cwd, r, updates } = await toolTurn(t, {
    file: "cancelled.txt",
    answer: { outcome: { outcome: "cancelled" } },
  });
  assert.equal(r.stopReason, "end_turn", `prompt result ${JSON.stringify(r)}`);
  assert.equal(lastStatus(updates), "failed", `tool updates ${JSON.stringify(updates.map((u) => u.update))}`);
  await sleep(300);
  assert.ok(!fileExists(cwd, "cancelled.txt"), "a cancelled permission never grants");
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: an unknown option id denies (failed, nothing ran)", TEST, async (t) => {
  const { a, cwd, updates } = await toolTurn(t, {
    file: "unknown-option.txt",
    answer: { outcome: { outcome: "selected", optionId: "allow_forever" } },
  });
  assert.equal(lastStatus(updates), "failed", `tool updates ${JSON.stringify(updates.map((u) => u.update))}`);
  await sleep(300);
  assert.ok(!fileExists(cwd, "unknown-option.txt"), "an unknown option never grants");
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: allow_always is remembered for the session (the next run_command is not asked)", TEST, async (t) => {
  const { a, cwd, sid, r } = await toolTurn(t, {
    file: "first.txt",
    answer: { outcome: { outcome: "selected", optionId: "allow_always" } },
  });
  assert.equal(r.stopReason, "end_turn");
  assert.ok(fileExists(cwd, "first.txt"), "allow_always runs the command");
  a.onPermission = async () => ({ outcome: { outcome: "selected", optionId: "reject_once" } });
  const r2 = await a.prompt(sid, `/tool run_command {"command":"echo ran > second.txt"}`);
  assert.equal(r2.stopReason, "end_turn");
  assert.equal(a.permissions.length, 1, "no second permission request");
  assert.ok(fileExists(cwd, "second.txt"), "the second command ran without asking");
});

test("ACP-PROMPT-CANCEL: cancel while a permission is pending → cancelled, the permission is cancelled, nothing ran", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  let release;
  const released = new Promise((r) => (release = r));
  // The editor never answers by itself: it waits until the agent withdraws the request
  // ($/cancel_request aborts the handler's signal; the SDK then answers -32800) or until the test
  // releases it with a late allow_once.
  a.onPermission = (record) =>
    new Promise((resolveAnswer, rejectAnswer) => {
      record.signal.addEventListener("abort", () => rejectAnswer(record.signal.reason));
      released.then(resolveAnswer);
    });
  const p = a.prompt(sid, `/tool run_command {"command":"echo ran > pending.txt"}`, 15000);
  const perm = await a.waitPermission(1);
  assertPermissionShape(perm, sid);
  const t0 = performance.now();
  await a.cancel(sid);
  const r = await p;
  const ms = Math.round(performance.now() - t0);
  assert.equal(r.stopReason, "cancelled", `prompt result ${JSON.stringify(r)}`);
  assert.ok(ms < 2000, `cancelled in ${ms} ms`);
  console.log(
    `  cancel with a pending permission → cancelled in ${ms} ms; agent withdrew the request ($/cancel_request): ${perm.aborted}`,
  );
  const updates = toolUpdates(a, sid, perm.params.toolCall.toolCallId);
  const respIdx = a.responseIndex(M.session.prompt);
  assert.equal(
    lastStatus(updates.filter((u) => u.i < respIdx)),
    "failed",
    `the tool call ends failed before the prompt result; updates ${JSON.stringify(updates.map((u) => u.update))}`,
  );
  // A late grant after the cancel must not run anything.
  release({ outcome: { outcome: "selected", optionId: "allow_once" } });
  await sleep(700);
  assert.ok(!fileExists(cwd, "pending.txt"), "the command never ran");
  assert.equal(a.responsesTo(a.sentRequest(M.session.prompt).msg.id).length, 1, "the prompt is answered once");
  // The session is not stuck.
  a.onPermission = async () => ({ outcome: { outcome: "selected", optionId: "reject_once" } });
  const r2 = await a.prompt(sid, "next");
  assert.equal(r2.stopReason, "end_turn");
  assert.ok(!fileExists(cwd, "pending.txt"), "the command still never ran");
  a.assertStdoutPure();
});

test("ACP-PROMPT-CANCEL: a subagent's turn runs inside the prompt and is cancelled with it; its session stays out of this connection's updates", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, "/subagent hi");
  assert.equal(r.stopReason, "end_turn");
  assert.match(a.agentText(sid), /subagent: echo: hi/, `text ${JSON.stringify(a.agentText(sid))}`);
  const p = a.prompt(sid, "/subagent /sleep 5000", 15000);
  await sleep(300);
  const t0 = performance.now();
  await a.cancel(sid);
  const r2 = await p;
  const ms = Math.round(performance.now() - t0);
  assert.equal(r2.stopReason, "cancelled");
  assert.ok(ms < 2000, `cancelled with its subagent in ${ms} ms`);
  const foreign = a.wire.filter((w) => w.msg?.method === "session/update" && w.msg.params?.sessionId !== sid);
  assert.deepEqual(
    foreign.map((w) => w.raw.slice(0, 200)),
    [],
    "session/update only for sessions this client created or loaded",
  );
  a.assertStdoutPure();
});

test("ACP-OUTPUT-PERMISSION: a subagent's tool approval is asked in the name of the client's session", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  a.onPermission = async () => ({ outcome: { outcome: "selected", optionId: "allow_once" } });
  const r = await a.prompt(sid, `/subagent /tool run_command {"command":"echo sub > sub.txt"}`);
  assert.equal(r.stopReason, "end_turn");
  assert.equal(a.permissions.length, 1, "one permission request");
  assertPermissionShape(a.permissions[0], sid);
  assert.ok(fileExists(cwd, "sub.txt"), "the subagent's command ran after the approval");
  assert.match(a.agentText(sid), /subagent: /);
  a.assertStdoutPure();
});

// ---------------------------------------------------------------------------------------------------------
// ACP-CODEC

test("ACP-CODEC: text concatenated unchanged, resource_link as [name](uri); richer blocks → -32602", TEST, async (t) => {
  const { a, init, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  const r = await a.prompt(sid, [
    { type: "text", text: "see " },
    { type: "resource_link", name: "notes", uri: "file:///project/notes.md" },
    { type: "text", text: " please" },
  ]);
  assert.equal(r.stopReason, "end_turn");
  assert.equal(a.agentText(sid), "echo: see [notes](file:///project/notes.md) please");
  if (!init.agentCapabilities?.promptCapabilities?.image) {
    await expectRpcError(
      a.prompt(sid, [{ type: "image", data: "iVBORw0KGgo=", mimeType: "image/png" }]),
      -32602,
      undefined,
      "an image block (not advertised)",
    );
  }
  if (!init.agentCapabilities?.promptCapabilities?.embeddedContext) {
    await expectRpcError(
      a.prompt(sid, [{ type: "resource", resource: { uri: "file:///x", text: "x" } }]),
      -32602,
      undefined,
      "an embedded resource block (not advertised)",
    );
  }
  // The session still works after the refusals.
  assert.equal((await a.prompt(sid, "ok")).stopReason, "end_turn");
  a.assertStdoutPure();
});

test("ACP-CODEC: turn ends map to max_tokens and refusal; a failed turn is a JSON-RPC error, not a stop reason", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "long\n/max-tokens")).stopReason, "max_tokens");
  assert.equal((await a.prompt(sid, "/refuse")).stopReason, "refusal");
  let error;
  try {
    const r = await a.prompt(sid, "/fail the model broke");
    assert.fail(`a failed turn must be an error, got result ${JSON.stringify(r)}`);
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e;
    error = e;
  }
  assert.equal(typeof error.code, "number", `error ${error}`);
  console.log(`  /fail → JSON-RPC error ${error.code} ${JSON.stringify(error.message)}`);
  assert.equal((await a.prompt(sid, "after")).stopReason, "end_turn", "the session works after a failed turn");
  a.assertStdoutPure();
});

// ---------------------------------------------------------------------------------------------------------
// ACP-SDK-*: JSON-RPC errors, session lifecycle

test("ACP-SDK-ERRORS: an unknown method → -32601 (also an `_` extension method)", TEST, async (t) => {
  const { a } = await start(t);
  await expectRpcError(a.request("agenthost/no-such-method", {}), -32601, undefined, "agenthost/no-such-method");
  await expectRpcError(a.request("_agenthost/no-such-extension", {}), -32601, undefined, "_agenthost/no-such-extension");
  await expectRpcError(a.request("logout", {}), -32601, undefined, "logout");
  await expectRpcError(a.request("session/set_mode", { sessionId: "x", modeId: "y" }), -32002, undefined, "session/set_mode of an unknown session");
  await expectRpcError(a.request(M.session.prompt, { prompt: [{ type: "text", text: "x" }] }), -32602, undefined, "session/prompt without sessionId");
  await expectRpcError(a.request(M.session.new, { mcpServers: [] }), -32602, undefined, "session/new without cwd");
  a.assertStdoutPure();
});

test("ACP-SDK-ERRORS: an unknown session → -32002 for session/prompt and session/load (and resume)", TEST, async (t) => {
  const { a, init, cwd } = await start(t);
  const unknown = "01900000-0000-7000-8000-000000000000";
  await expectRpcError(a.prompt(unknown, "hello"), -32002, undefined, "session/prompt of an unknown session");
  await expectRpcError(a.prompt("not-a-session-id", "hello"), -32002, undefined, "session/prompt of a malformed id");
  await expectRpcError(
    a.request(M.session.load, { sessionId: unknown, cwd, mcpServers: [] }),
    -32002,
    undefined,
    "session/load of an unknown session",
  );
  if (init.agentCapabilities?.sessionCapabilities?.resume) {
    await expectRpcError(
      a.request(M.session.resume, { sessionId: unknown, cwd, mcpServers: [] }),
      -32002,
      undefined,
      "session/resume of an unknown session",
    );
  }
  a.assertStdoutPure();
});

test("ACP-SDK-LOAD: session/load after restarting the host replays the conversation, then answers; prompts continue", TEST, async (t) => {
  const s = scope(t);
  const stateDir = await s.tempDir("ah-acp-state-");
  const cwd = await s.tempDir("ah-acp-cwd-");
  const a = await s.spawnAgent({ stateDir });
  await a.initialize(1);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "hello")).stopReason, "end_turn");
  assert.equal((await a.prompt(sid, "again")).stopReason, "end_turn");
  a.closeStdin();
  const exit = await a.waitExit(5000);
  assert.deepEqual({ code: exit.code, signal: exit.signal }, { code: 0, signal: null }, "the first host exits 0 on EOF");

  const b = await s.spawnAgent({ stateDir });
  const init = await b.initialize(1);
  assert.equal(init.agentCapabilities?.loadSession, true);
  // Not active on this connection until it is loaded.
  await expectRpcError(b.prompt(sid, "too early"), -32002, undefined, "session/prompt before session/load");
  const before = b.wire.length;
  const r = await b.request(M.session.load, { sessionId: sid, cwd, mcpServers: [] });
  assert.equal(typeof r, "object", `load result ${JSON.stringify(r)}`);
  const respIdx = b.responseIndex(M.session.load);
  const replay = b.wireUpdates(sid).filter((u) => u.i >= before && u.i < respIdx);
  assert.deepEqual(
    messageRuns(replay),
    [
      ["user", "hello"],
      ["agent", "echo: hello"],
      ["user", "again"],
      ["agent", "echo: again"],
    ],
    `replayed before the load result: ${JSON.stringify(replay.map((u) => u.update))}`,
  );
  const r2 = await b.prompt(sid, "after restart");
  assert.equal(r2.stopReason, "end_turn");
  assert.equal(b.agentText(sid, respIdx), "echo: after restart", "a new prompt works in the loaded session");
  await b.assertSdkAccepted();
  b.assertStdoutPure();
});

test("ACP-SDK-LOAD: session/load of a session of this process replays it too; prompts continue", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "one")).stopReason, "end_turn");
  const before = a.wire.length;
  await a.request(M.session.load, { sessionId: sid, cwd, mcpServers: [] });
  const respIdx = a.responseIndex(M.session.load);
  const replay = a.wireUpdates(sid).filter((u) => u.i >= before && u.i < respIdx);
  assert.deepEqual(messageRuns(replay), [
    ["user", "one"],
    ["agent", "echo: one"],
  ]);
  assert.equal((await a.prompt(sid, "two")).stopReason, "end_turn");
  assert.equal(a.agentText(sid, respIdx), "echo: two");
  a.assertStdoutPure();
});

test("ACP-SDK-LOAD: the replay after a restart includes the tool calls with their final status", TEST, async (t) => {
  const s = scope(t);
  const stateDir = await s.tempDir("ah-acp-state-");
  const cwd = await s.tempDir("ah-acp-cwd-");
  const a = await s.spawnAgent({ stateDir });
  await a.initialize(1);
  const sid = await a.newSession(cwd);
  a.onPermission = async () => ({ outcome: { outcome: "selected", optionId: "allow_once" } });
  assert.equal((await a.prompt(sid, `/tool run_command {"command":"echo ran > replay.txt"}`)).stopReason, "end_turn");
  const liveId = a.permissions[0].params.toolCall.toolCallId;
  a.closeStdin();
  assert.equal((await a.waitExit(5000)).code, 0);

  const b = await s.spawnAgent({ stateDir });
  await b.initialize(1);
  const before = b.wire.length;
  await b.request(M.session.load, { sessionId: sid, cwd, mcpServers: [] });
  const respIdx = b.responseIndex(M.session.load);
  const replay = b.wireUpdates(sid).filter((u) => u.i >= before && u.i < respIdx);
  const calls = replay.filter((u) => u.update.sessionUpdate === "tool_call");
  assert.equal(calls.length, 1, `replayed tool calls: ${JSON.stringify(replay.map((u) => u.update))}`);
  const id = calls[0].update.toolCallId;
  assert.equal(id, liveId, "the replayed tool call keeps its id");
  const updates = replay.filter((u) => u.update.toolCallId === id);
  assert.equal(lastStatus(updates), "completed", `replayed tool updates ${JSON.stringify(updates.map((u) => u.update))}`);
  assert.equal(b.permissions.length, 0, "a replay asks for no permission");
  const runs = messageRuns(replay);
  assert.equal(runs[0]?.[0], "user", `replay starts with the user's prompt: ${JSON.stringify(runs)}`);
  assert.match(runs[0][1], /^\/tool run_command/);
  await b.assertSdkAccepted();
  b.assertStdoutPure();
});

test("ACP-SDK-RESUME: session/resume after a restart answers without replaying; prompts continue", TEST, async (t) => {
  const s = scope(t);
  const stateDir = await s.tempDir("ah-acp-state-");
  const cwd = await s.tempDir("ah-acp-cwd-");
  const a = await s.spawnAgent({ stateDir });
  await a.initialize(1);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "hello")).stopReason, "end_turn");
  a.closeStdin();
  assert.equal((await a.waitExit(5000)).code, 0);

  const b = await s.spawnAgent({ stateDir });
  const init = await b.initialize(1);
  if (!init.agentCapabilities?.sessionCapabilities?.resume) {
    t.skip("sessionCapabilities.resume is not advertised");
    return;
  }
  const before = b.wire.length;
  const r = await b.request(M.session.resume, { sessionId: sid, cwd, mcpServers: [] });
  assert.equal(typeof r, "object", `resume result ${JSON.stringify(r)}`);
  const respIdx = b.responseIndex(M.session.resume);
  const replayed = b.wireUpdates(sid).filter((u) => u.i >= before && u.i < respIdx);
  assert.deepEqual(replayed.map((u) => u.update), [], "session/resume replays nothing");
  assert.equal((await b.prompt(sid, "resumed")).stopReason, "end_turn");
  assert.equal(b.agentText(sid), "echo: resumed");
  b.assertStdoutPure();
});

test("ACP-SDK-LIST: session/list returns the created sessions (cwd filter, cursor paging without duplicates)", TEST, async (t) => {
  const { s, a, init } = await start(t);
  if (!init.agentCapabilities?.sessionCapabilities?.list) assert.fail("sessionCapabilities.list is not advertised");
  const dirA = await s.tempDir("ah-acp-a-");
  const dirB = await s.tempDir("ah-acp-b-");
  const idsA = [];
  for (let i = 0; i < 3; i++) idsA.push(await a.newSession(dirA));
  // Enough sessions that a reasonable page size has to page (ACP: agents SHOULD enforce page sizes).
  const idsB = [];
  for (let i = 0; i < 13; i++) idsB.push(...(await Promise.all(Array.from({ length: 10 }, () => a.newSession(dirB)))));
  const all = new Set([...idsA, ...idsB]);
  const listAll = async (params) => {
    const out = [];
    let cur;
    let n = 0;
    do {
      const r = await a.request(M.session.list, cur ? { ...params, cursor: cur } : params);
      n++;
      assert.ok(Array.isArray(r.sessions), `list result ${JSON.stringify(r).slice(0, 300)}`);
      out.push(...r.sessions);
      cur = r.nextCursor ?? undefined;
      assert.ok(n < 100, "paging ends");
    } while (cur);
    return { sessions: out, pages: n };
  };

  const { sessions: seen, pages } = await listAll({});
  for (const info of seen) {
    assert.equal(typeof info.sessionId, "string", `SessionInfo ${JSON.stringify(info)}`);
    assert.equal(typeof info.cwd, "string", `SessionInfo ${JSON.stringify(info)}`);
    assert.ok(info.cwd.startsWith("/"), `cwd is absolute: ${info.cwd}`);
    if (info.updatedAt != null) assert.ok(!Number.isNaN(Date.parse(info.updatedAt)), `updatedAt ${info.updatedAt}`);
  }
  console.log(`  session/list: ${seen.length} sessions in ${pages} page(s)`);
  if (pages < 2) console.log("  note: one page only, so the cursor was not exercised");
  const ids = seen.map((i) => i.sessionId);
  assert.equal(new Set(ids).size, ids.length, "no session is listed twice across pages");
  for (const id of all) assert.ok(ids.includes(id), `session ${id} is listed`);
  for (const info of seen) {
    if (idsA.includes(info.sessionId)) assert.equal(info.cwd, dirA);
    if (idsB.includes(info.sessionId)) assert.equal(info.cwd, dirB);
  }
  const filtered = await listAll({ cwd: dirA });
  assert.deepEqual(
    filtered.sessions.map((i) => i.sessionId).sort(),
    [...idsA].sort(),
    "session/list {cwd} returns only that directory's sessions",
  );
  a.assertStdoutPure();
});

test("ACP-SDK-CLOSE: session/close cancels the running prompt (cancelled), answers {}, later prompts → -32002", TEST, async (t) => {
  const { a, init, cwd } = await start(t);
  if (!init.agentCapabilities?.sessionCapabilities?.close) assert.fail("sessionCapabilities.close is not advertised");
  const sid = await a.newSession(cwd);
  const keep = await a.newSession(cwd);
  const p = a.prompt(sid, "/sleep 5000\nlate", 15000);
  await sleep(300);
  const t0 = performance.now();
  const closed = await a.request(M.session.close, { sessionId: sid });
  assert.deepEqual(closed, {}, "session/close result");
  const r = await withTimeout(p, 3000, "the prompt of the closed session");
  const ms = Math.round(performance.now() - t0);
  assert.equal(r.stopReason, "cancelled", `prompt result ${JSON.stringify(r)}`);
  assert.ok(ms < 2000, `close + cancel in ${ms} ms`);
  // The close answer comes after the cancelled prompt's answer (cancel, then release).
  const iPrompt = a.responseIndex(M.session.prompt);
  const iClose = a.responseIndex(M.session.close);
  assert.ok(iPrompt < iClose, `the prompt is settled before close answers (wire ${iPrompt} < ${iClose})`);
  await expectRpcError(a.prompt(sid, "hello again"), -32002, undefined, "session/prompt of a closed session");
  // The other session of the connection is untouched.
  assert.equal((await a.prompt(keep, "other")).stopReason, "end_turn");
  assert.equal(a.agentText(keep), "echo: other");
  a.assertStdoutPure();
});

test("ACP-SDK-CLOSE: after session/close, session/load and session/resume either refuse (-32002) or make the session usable again", TEST, async (t) => {
  // The spec leaves open whether a closed session can be loaded again; either is fine, but an agent
  // that answers session/load or session/resume with success must then take prompts for the session.
  const { a, init, cwd } = await start(t);
  const problems = [];
  for (const method of [M.session.load, M.session.resume]) {
    if (method === M.session.resume && !init.agentCapabilities?.sessionCapabilities?.resume) continue;
    const sid = await a.newSession(cwd);
    assert.equal((await a.prompt(sid, "before close")).stopReason, "end_turn");
    assert.deepEqual(await a.request(M.session.close, { sessionId: sid }), {});
    let reopened;
    try {
      await a.request(method, { sessionId: sid, cwd, mcpServers: [] });
      reopened = true;
    } catch (e) {
      if (e.code !== -32002) problems.push(`${method} of a closed session refused with ${e.code} ${JSON.stringify(e.message)}, not -32002`);
      reopened = false;
    }
    console.log(`  ${method} of a closed session → ${reopened ? "accepted" : "refused"}`);
    try {
      const r = await a.prompt(sid, "after reopen");
      if (!reopened) problems.push(`${method} refused the closed session, but a prompt then ran (${r.stopReason})`);
      else if (r.stopReason !== "end_turn") problems.push(`prompt after ${method}: ${r.stopReason}`);
    } catch (e) {
      if (reopened) problems.push(`${method} of a closed session answered success, but a prompt then fails: ${e.code} ${JSON.stringify(e.message)}`);
      else if (e.code !== -32002) problems.push(`prompt of the closed session: ${e.code}, not -32002`);
    }
  }
  assert.deepEqual(problems, []);
  a.assertStdoutPure();
});

test("ACP-SDK-DELETE: session/delete (if advertised) removes the session from session/list; later prompts → -32002", TEST, async (t) => {
  const { a, init, cwd } = await start(t);
  if (!init.agentCapabilities?.sessionCapabilities?.delete) {
    t.skip("sessionCapabilities.delete is not advertised");
    return;
  }
  const gone = await a.newSession(cwd);
  const kept = await a.newSession(cwd);
  assert.equal((await a.prompt(gone, "hello")).stopReason, "end_turn");
  const r = await a.request(M.session.delete, { sessionId: gone });
  assert.deepEqual(r, {}, "session/delete result");
  const deleteResp = a.responsesTo(a.sentRequest(M.session.delete).msg.id)[0]?.msg;
  assert.ok(deleteResp && "result" in deleteResp, `session/delete of a live session answered ${JSON.stringify(deleteResp)}`);
  const listed = (await a.request(M.session.list, { cwd })).sessions.map((i) => i.sessionId);
  assert.ok(!listed.includes(gone), "a deleted session is no longer listed");
  assert.ok(listed.includes(kept), "the other session is still listed");
  // Deleting it again, or a session that never existed, SHOULD succeed silently.
  assert.deepEqual(await a.request(M.session.delete, { sessionId: gone }), {});
  assert.equal((await a.prompt(kept, "still")).stopReason, "end_turn");
  // session.delete is privileged: its method and outcome go to the audit log of the state dir.
  let audit = "";
  await waitFor(
    () => {
      try {
        audit = readFileSync(join(a.stateDir, "audit.log"), "utf8");
      } catch {
        audit = "";
      }
      return /session\.delete/.test(audit);
    },
    2000,
    "session.delete in the audit log",
    () => `audit.log: ${JSON.stringify(audit.slice(-400))}`,
  );
  assert.ok(!audit.includes(gone), "the audit log records no values (not even the session id)");
  await expectRpcError(a.prompt(gone, "again"), -32002, undefined, "session/prompt of a deleted session");
  a.assertStdoutPure();
});

// ---------------------------------------------------------------------------------------------------------
// ACP-QUIESCE / ACP-SDK-*: process lifetime and stdout

test("ACP-QUIESCE: stdin EOF on an idle connection → exit 0 within a few seconds", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  assert.equal((await a.prompt(sid, "hello")).stopReason, "end_turn");
  const t0 = performance.now();
  a.closeStdin();
  const exit = await a.waitExit(5000);
  const ms = Math.round(performance.now() - t0);
  console.log(`  idle EOF → exit ${exit.code} in ${ms} ms`);
  assert.deepEqual({ code: exit.code, signal: exit.signal }, { code: 0, signal: null });
  await waitFor(() => a.stdoutEnded, 2000, "stdout to close");
  a.assertStdoutPure();
});

test("ACP-QUIESCE: stdin EOF with a prompt in flight → the prompt is answered cancelled, then exit 0", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  const p = a.prompt(sid, "/sleep 5000\nlate", 15000);
  await sleep(300);
  const t0 = performance.now();
  a.closeStdin();
  let r;
  try {
    r = await p;
  } catch (e) {
    assert.fail(
      `the in-flight prompt was not answered before the connection closed (ACP-QUIESCE: settle every prompt): ${e.code ?? ""} ${e.message}`,
    );
  }
  assert.equal(r.stopReason, "cancelled", `in-flight prompt settled as ${JSON.stringify(r)}`);
  const exit = await a.waitExit(5000);
  const ms = Math.round(performance.now() - t0);
  console.log(`  EOF with a prompt in flight → answered cancelled, exit ${exit.code} in ${ms} ms`);
  assert.deepEqual({ code: exit.code, signal: exit.signal }, { code: 0, signal: null });
  assert.ok(ms < 4000, `exit within ${ms} ms (the sleep was 5000 ms)`);
  await waitFor(() => a.stdoutEnded, 2000, "stdout to close");
  const id = a.sentRequest(M.session.prompt).msg.id;
  assert.equal(a.responsesTo(id).length, 1, "the in-flight prompt is answered exactly once");
  assert.ok(!a.agentText(sid).includes("late"), "the cancelled turn did not finish");
  a.assertStdoutPure();
});

test("ACP-QUIESCE: stdin EOF with a permission pending and a prompt queued → both settled once, nothing ran, exit 0", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  a.onPermission = (record) =>
    new Promise((_, reject) => record.signal.addEventListener("abort", () => reject(record.signal.reason)));
  const p1 = a.prompt(sid, `/tool run_command {"command":"echo ran > eof.txt"}`, 15000);
  const p2 = a.prompt(sid, "queued", 15000);
  await a.waitPermission(1);
  a.closeStdin();
  const settled = await Promise.allSettled([p1, p2]);
  for (const [k, st] of settled.entries()) {
    assert.equal(st.status, "fulfilled", `prompt ${k + 1} settled with an answer, not ${st.reason?.message}`);
  }
  const [r1, r2] = settled.map((x) => x.value);
  console.log(`  EOF with a pending permission → ${r1.stopReason}; queued prompt → ${r2.stopReason}`);
  assert.equal(r1.stopReason, "cancelled", "the turn waiting for a permission is cancelled");
  assert.ok(["cancelled", "end_turn"].includes(r2.stopReason), `queued prompt ${JSON.stringify(r2)}`);
  const exit = await a.waitExit(5000);
  assert.deepEqual({ code: exit.code, signal: exit.signal }, { code: 0, signal: null });
  await sleep(300);
  assert.ok(!fileExists(cwd, "eof.txt"), "the command never ran");
  for (const req of a.sent.filter((x) => x.msg?.method === M.session.prompt)) {
    assert.equal(a.responsesTo(req.msg.id).length, 1, `prompt id ${req.msg.id} answered exactly once`);
  }
  a.assertStdoutPure();
});

test("ACP-QUIESCE: stdin EOF while run_command runs → the command's process is reaped, exit 0", TEST, async (t) => {
  const { a, cwd } = await start(t);
  const sid = await a.newSession(cwd);
  a.onPermission = async () => ({ outcome: { outcome: "selected", optionId: "allow_once" } });
  const p = a.prompt(sid, `/tool run_command {"command":"echo $$ > pid.txt; exec sleep 30"}`, 20000);
  p.catch(() => {});
  await waitFor(() => fileExists(cwd, "pid.txt"), 5000, "the command to start (pid.txt)", () => a.stderrTail());
  let pid;
  await waitFor(
    () => {
      let txt = "";
      try {
        txt = readFileSync(join(cwd, "pid.txt"), "utf8");
      } catch {
        // not written yet
      }
      pid = Number.parseInt(txt, 10);
      return Number.isInteger(pid) && pid > 0;
    },
    2000,
    "pid.txt to hold a pid",
  );
  t.after(() => {
    if (processExists(pid)) process.kill(pid, "SIGKILL");
  });
  assert.ok(processExists(pid), "the command runs");
  const t0 = performance.now();
  a.closeStdin();
  const exit = await a.waitExit(8000);
  const ms = Math.round(performance.now() - t0);
  console.log(`  EOF with run_command running → exit ${exit.code} in ${ms} ms`);
  assert.deepEqual({ code: exit.code, signal: exit.signal }, { code: 0, signal: null });
  const settled = await Promise.allSettled([p]);
  assert.equal(settled[0].status, "fulfilled", `the prompt was answered before exit, not ${settled[0].reason?.message}`);
  assert.equal(settled[0].value.stopReason, "cancelled");
  await waitFor(() => !processExists(pid), 3000, `the command's process ${pid} to be gone`);
  a.assertStdoutPure();
});

test("ACP-SDK-STDOUT: stdout carries only JSON-RPC 2.0 messages (debug logging, tools, errors, cancel)", TEST, async (t) => {
  const { a, cwd } = await start(t, { logLevel: "debug" });
  const sid = await a.newSession(cwd);
  a.onPermission = async () => ({ outcome: { outcome: "selected", optionId: "allow_once" } });
  await a.prompt(sid, "/chunks 5\nhello there");
  await a.prompt(sid, `/tool run_command {"command":"echo to-stdout; echo to-stderr >&2"}`);
  await a.prompt(sid, `/tool list_dir {"path":"."}`);
  const p = a.prompt(sid, "/sleep 3000");
  await sleep(200);
  await a.cancel(sid);
  await p;
  await expectRpcError(a.request("no/such", {}), -32601);
  await a.prompt(sid, "/fail boom").catch(() => {});
  a.closeStdin();
  const exit = await a.waitExit(5000);
  assert.equal(exit.code, 0);
  await waitFor(() => a.stdoutEnded, 2000, "stdout to close");
  assert.ok(a.lines.length > 5, `stdout lines: ${a.lines.length}`);
  for (const line of a.lines) {
    if (line === "") continue;
    let m;
    assert.doesNotThrow(() => (m = JSON.parse(line)), `not JSON on stdout: ${JSON.stringify(line.slice(0, 200))}`);
    assert.ok(isJsonRpcMessage(m), `not a JSON-RPC 2.0 message on stdout: ${line.slice(0, 200)}`);
  }
  assert.ok(!a.lines.some((l) => l.includes("to-stdout") && !l.startsWith("{")), "command output never leaks to stdout");
  assert.ok(a.stderr.length > 0, "logs go to stderr");
  await a.assertSdkAccepted();
});
