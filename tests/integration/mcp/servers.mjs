// The official MCP reference servers for the tests, from npm (pinned in package-lock.json):
// @modelcontextprotocol/server-everything (stdio and streamableHttp) and server-filesystem.
//
// A stdio server can be started through relay.mjs, which passes every byte through unchanged and records
// the lines the client sent, so that a test sees what the server received (notifications/cancelled,
// tools/list after list_changed). Each process carries a marker in its environment: a test finds every
// process of one server (also its children) by it, and checks that none is left.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync, existsSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { randomUUID } from "node:crypto";
import { sleep, freePort } from "../common.mjs";

export { freePort };

const here = dirname(fileURLToPath(import.meta.url));
const bin = (name) => join(here, "..", "node_modules", ".bin", name);
export const everythingBin = bin("mcp-server-everything");
export const filesystemBin = bin("mcp-server-filesystem");
export const relayPath = join(here, "relay.mjs");

/** An ACP stdio server entry for server-everything through the relay; `log` gets what the client sent. */
export function everythingStdio(name, log, mark = randomUUID()) {
  return {
    mark,
    server: {
      name,
      command: process.execPath,
      args: [relayPath, log, everythingBin, "stdio"],
      env: [{ name: "AH_TEST_MARK", value: mark }],
    },
  };
}

/** server-everything in streamableHttp mode on a free port, stopped after the test. */
export async function startEverythingHttp(t) {
  const port = await freePort();
  const child = spawn(everythingBin, ["streamableHttp"], {
    env: { ...process.env, PORT: String(port) },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((r) => child.on("exit", r));
  t.after(async () => {
    child.kill("SIGTERM");
    await exited;
  });
  const deadline = Date.now() + 15000;
  for (;;) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/mcp`, { method: "GET" });
      await r.arrayBuffer();
      break; // any answer: it listens
    } catch {
      if (Date.now() > deadline) throw new Error(`server-everything (http) did not start: ${stderr}`);
      await sleep(50);
    }
  }
  return { url: `http://127.0.0.1:${port}/mcp`, port };
}

/** Pids of the live processes whose environment carries AH_TEST_MARK=mark. */
export function markedPids(mark) {
  const out = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const env = readFileSync(`/proc/${e}/environ`, "latin1");
      if (!env.split("\0").includes(`AH_TEST_MARK=${mark}`)) continue;
      const stat = readFileSync(`/proc/${e}/stat`, "latin1");
      if (stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) === "Z") continue;
      out.push(Number(e));
    } catch {
      /* gone meanwhile, or not ours to read */
    }
  }
  return out;
}

/** The JSON lines the client sent to a relayed server. */
export function sentToServer(log) {
  if (!existsSync(log)) return [];
  return readFileSync(log, "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => {
      try {
        return JSON.parse(l);
      } catch {
        return { unparsed: l };
      }
    });
}
