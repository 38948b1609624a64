// The driver the MCP conformance suite runs in client mode: `node conformance-driver.mjs URL`, with the
// scenario in MCP_CONFORMANCE_SCENARIO. It is agenthost's MCP client at work, not a client of its own: it
// starts `agenthost sdk` with one host-wide server, [mcp.conf] url = URL, and has the echo provider call the
// scenario's tool (`/tool mcp__conf__TOOL {…}`), approving the call; agenthost's mcp plugin does the
// protocol. Exits 0 when the turn ended, 1 otherwise.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { agenthostPath } from "../common.mjs";

const url = process.argv[2];
const scenario = process.env.MCP_CONFORMANCE_SCENARIO ?? "initialize";
const prompts = {
  initialize: "hello",
  tools_call: '/tool mcp__conf__add_numbers {"a": 2, "b": 3}',
  "sse-retry": "/tool mcp__conf__test_reconnection {}",
};
const dir = mkdtempSync(join(tmpdir(), "ah-conformance-"));
const work = join(dir, "work");
mkdirSync(work);
const conf = join(dir, "agenthost.ini");
writeFileSync(conf, `[mcp.conf]\nurl = ${url}\nstartup_timeout_ms = 15000\n`);
const child = spawn(agenthostPath(), ["--config", conf, "--state-dir", join(dir, "state"), "--log-level", "debug", "sdk"], {
  stdio: ["pipe", "pipe", "inherit"],
  env: { ...process.env, XDG_CONFIG_HOME: dir },
});
const send = (m) => child.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...m }) + "\n");
let buf = "";
let ended = false;
const timer = setTimeout(() => finish(1, "timed out"), 25000);
function finish(code, why) {
  clearTimeout(timer);
  if (why) console.error(`conformance-driver: ${why}`);
  child.stdin.end();
  child.on("exit", () => {
    rmSync(dir, { recursive: true, force: true });
    process.exit(code);
  });
}
child.stdout.on("data", (d) => {
  buf += d;
  let nl;
  while ((nl = buf.indexOf("\n")) >= 0) {
    const line = buf.slice(0, nl);
    buf = buf.slice(nl + 1);
    const m = JSON.parse(line);
    if (m.method === "request/approval") send({ id: m.id, result: { optionId: "allow_once" } });
    const ev = m.method === "session.event" ? m.params.event : null;
    if (ev?.kind === "tool/result") console.log(`tool result: ${JSON.stringify(ev.data.result)}`);
    if (ev?.kind === "turn/notice") console.log(`notice: ${JSON.stringify(ev.data)}`);
    if (ev?.kind === "turn/ended" && !ended) {
      ended = true;
      finish(0);
    }
  }
});
send({ id: 1, method: "initialize", params: { cwd: work, capabilities: { requests: true } } });
send({ id: 2, method: "session/prompt", params: { text: prompts[scenario] ?? "hello" } });
