#!/usr/bin/env node
// A small ACP v1 agent on the official SDK's agent side, run as a child by agenthost's `acp` provider in
// the acp-child tests (tests/integration/acp/child.test.mjs) and by bench/acp.c.
//
// Command line (all optional):
//   --pid-file=PATH   append this process's pid and a newline to PATH at start
//   --stderr=TEXT     write TEXT and a newline to stderr at start
//   --stubborn        ignore SIGTERM and the end of stdin (only SIGKILL ends it)
//   --fail=MODE       make the handshake fail: initialize-error (answers -32603), initialize-exit (exits 3
//                     before answering), initialize-hang (never answers), version (answers protocolVersion
//                     2), session-error (session/new answers -32603), session-exit (exits 4 in session/new)
//
// The prompt's text blocks, joined, select what a turn does (one directive, then its argument):
//   echo TEXT          stream TEXT back in chunks of at most 4 characters, then end_turn
//   info NAME,NAME     one chunk: JSON {pid, cwd, argv, env: {NAME: value or null}, prompt} (the blocks
//                      received); `info *` reports the whole environment
//   garbage            writes invalid JSON, an over-long line and ill-typed updates, then echoes "ok"
//   slow N MS          N chunks "chunk I " every MS ms; on session/cancel answers `cancelled` at once
//   stop REASON        one chunk "stopping", then the stop reason REASON (end_turn, max_tokens, refusal, ...)
//   error MESSAGE      the prompt answers a JSON-RPC error -32603 with MESSAGE
//   exit CODE          one chunk "bye", then the process exits with CODE in the middle of the prompt
//   permission TITLE   session/request_permission (allow / reject options), then one chunk naming the outcome
//   fs                 calls fs/read_text_file (not advertised by the client) and reports the error code
//   hang               never answers the prompt (until session/cancel)
// Anything else is echoed like `echo`. The process exits when its stdin ends.
import { appendFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const opts = Object.fromEntries(
  process.argv
    .slice(2)
    .filter((a) => a.startsWith("--"))
    .map((a) => {
      const eq = a.indexOf("=");
      return eq < 0 ? [a.slice(2), "1"] : [a.slice(2, eq), a.slice(eq + 1)];
    }),
);
if (opts.stderr) process.stderr.write(`${opts.stderr}\n`);
if (opts.stubborn) process.on("SIGTERM", () => {});
if (opts["pid-file"]) appendFileSync(opts["pid-file"], `${process.pid}\n`);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const never = () => new Promise(() => {});
const cancelled = new Map(); // sessionId -> resolve() of the running prompt's cancellation
let sessions = 0;

async function chunk(client, sessionId, text) {
  await client.notify("session/update", {
    sessionId,
    update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
  });
}

const app = acp
  .agent({ name: "agenthost-test-child" })
  .onRequest("initialize", async () => {
    switch (opts.fail) {
      case "initialize-error":
        throw new acp.RequestError(-32603, "the test agent refuses to initialize");
      case "initialize-exit":
        process.exit(3);
        break;
      case "initialize-hang":
        await never();
        break;
      case "version":
        return { protocolVersion: 2, agentCapabilities: {}, authMethods: [] };
    }
    return {
      protocolVersion: acp.PROTOCOL_VERSION,
      agentCapabilities: { loadSession: false },
      authMethods: [],
      agentInfo: { name: "agenthost-test-child", version: "1.0.0" },
    };
  })
  .onRequest("session/new", async ({ params }) => {
    if (opts.fail === "session-error") throw new acp.RequestError(-32603, "the test agent refuses session/new");
    if (opts.fail === "session-exit") process.exit(4);
    sessions += 1;
    return { sessionId: `child-session-${process.pid}-${sessions}-${params.cwd}` };
  })
  .onNotification("session/cancel", ({ params }) => {
    cancelled.get(params.sessionId)?.();
  })
  .onRequest("session/prompt", async ({ params, client }) => {
    const { sessionId } = params;
    let onCancel;
    const cancel = new Promise((r) => (onCancel = r));
    let isCancelled = false;
    cancelled.set(sessionId, () => {
      isCancelled = true;
      onCancel();
    });
    const text = params.prompt
      .filter((b) => b.type === "text")
      .map((b) => b.text)
      .join("");
    const sp = text.indexOf(" ");
    const verb = sp < 0 ? text.trim() : text.slice(0, sp);
    const arg = sp < 0 ? "" : text.slice(sp + 1);
    try {
      switch (verb) {
        case "info": {
          const env = {};
          if (arg.trim() === "*") Object.assign(env, process.env);
          else for (const name of arg.split(",").map((s) => s.trim()).filter(Boolean)) env[name] = process.env[name] ?? null;
          const info = { pid: process.pid, cwd: process.cwd(), argv: process.argv.slice(2), env, prompt: params.prompt };
          await chunk(client, sessionId, JSON.stringify(info));
          return { stopReason: "end_turn" };
        }
        case "slow": {
          const [n, ms] = arg.split(" ").map(Number);
          for (let i = 1; i <= n; i++) {
            if (isCancelled) return { stopReason: "cancelled" };
            await chunk(client, sessionId, `chunk ${i} `);
            await Promise.race([sleep(ms), cancel]);
          }
          return { stopReason: isCancelled ? "cancelled" : "end_turn" };
        }
        case "stop":
          await chunk(client, sessionId, "stopping");
          return { stopReason: arg.trim() };
        case "error":
          throw new acp.RequestError(-32603, arg);
        case "exit":
          await chunk(client, sessionId, "bye");
          setTimeout(() => process.exit(Number(arg)), 50);
          await never();
          break;
        case "permission": {
          const answer = await client.request("session/request_permission", {
            sessionId,
            toolCall: { toolCallId: "call-1", title: arg || "run a test tool", kind: "execute", status: "pending" },
            options: [
              { optionId: "allow", name: "Allow once", kind: "allow_once" },
              { optionId: "reject", name: "Reject", kind: "reject_once" },
            ],
          });
          const o = answer.outcome;
          await chunk(client, sessionId, o.outcome === "selected" ? `permission: ${o.optionId}` : "permission: cancelled");
          return { stopReason: isCancelled ? "cancelled" : "end_turn" };
        }
        case "fs": {
          let code = "none";
          try {
            await client.request("fs/read_text_file", { sessionId, path: "/etc/hostname" });
          } catch (e) {
            code = String(e.code);
          }
          await chunk(client, sessionId, `fs: ${code}`);
          return { stopReason: "end_turn" };
        }
        case "garbage": {
          process.stdout.write("this is not JSON\n");
          process.stdout.write(`{"jsonrpc":"2.0","method":"session/update","params":${"[".repeat(5000)}\n`);
          process.stdout.write(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"${"x".repeat(17 * 1024 * 1024)}"}}\n`);
          const bad = [
            { sessionId, update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: 42 } } },
            { sessionId, update: { sessionUpdate: "agent_message_chunk", content: "text" } },
            { sessionId, update: { sessionUpdate: 7 } },
            { sessionId: 9, update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "x" } } },
            { sessionId: "another-session", update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "x" } } },
            { sessionId, update: { sessionUpdate: "agent_thought_chunk", content: { type: "text", text: "thinking" } } },
          ];
          for (const params of bad) process.stdout.write(JSON.stringify({ jsonrpc: "2.0", method: "session/update", params }) + "\n");
          process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id: "bogus", result: {} }) + "\n");
          process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id: 99, method: "terminal/create", params: { sessionId, command: "true" } }) + "\n");
          // Written the same raw way, so that it is ordered after the lines above.
          const ok = { sessionId, update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "ok" } } };
          await new Promise((r) => process.stdout.write(JSON.stringify({ jsonrpc: "2.0", method: "session/update", params: ok }) + "\n", r));
          return { stopReason: "end_turn" };
        }
        case "hang":
          await cancel;
          return { stopReason: "cancelled" };
        default: {
          const body = verb === "echo" ? arg : text;
          for (let i = 0; i < body.length; i += 4) await chunk(client, sessionId, body.slice(i, i + 4));
          return { stopReason: "end_turn" };
        }
      }
    } finally {
      cancelled.delete(sessionId);
    }
  });

const stream = acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
const conn = app.connect(stream);
if (opts.stubborn) {
  setInterval(() => {}, 1000); // stays alive without stdin
} else {
  process.stdin.on("end", () => process.exit(0));
  conn.closed.then(() => process.exit(0));
}
