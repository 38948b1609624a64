// The scripted OpenAI-compatible fake model server (tests/fakes/fake_model.py) for the Node suites:
// started by a test, scripted and read over its plain-HTTP control port, stopped by the test's `after`.
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sleep } from "./common.mjs";

/** Starts the server; `t` (a test context) stops it after the test, else call the returned stop(). */
export async function startFakeModel(t) {
  const dir = await mkdtemp(join(tmpdir(), "ah-fake-model-"));
  const root = process.env.AH_TEST_SOURCE_ROOT;
  if (!root) throw new Error("AH_TEST_SOURCE_ROOT is not set");
  const portFile = join(dir, "port");
  const controlFile = join(dir, "control-port");
  const child = spawn("python3", [join(root, "tests", "fakes", "fake_model.py"), "--port-file", portFile,
    "--control-port-file", controlFile], { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((r) => child.on("exit", r));
  const stop = async () => {
    child.kill("SIGTERM");
    await exited;
    await rm(dir, { recursive: true, force: true });
  };
  if (t) t.after(stop); // else the caller calls stop()
  const deadline = Date.now() + 10000;
  while (!existsSync(portFile)) {
    if (Date.now() > deadline) throw new Error(`the fake model server did not start: ${stderr}`);
    await sleep(20);
  }
  const port = Number(await readFile(portFile, "utf8"));
  const control = Number(await readFile(controlFile, "utf8"));
  const ctl = (path, init) =>
    fetch(`http://127.0.0.1:${control}/_control/${path}`, init).then(async (r) => {
      if (!r.ok) throw new Error(`control ${path}: ${r.status}`);
      return r.json();
    });
  return {
    port,
    baseUrl: `http://127.0.0.1:${port}/v1`,
    script: (steps) => ctl("script", { method: "POST", body: JSON.stringify(steps) }),
    requests: () => ctl("requests"),
    events: () => ctl("events"),
    stop,
  };
}

/** Chunks of a streamed Chat Completions answer. */
export const textChunk = (text) => ({ choices: [{ index: 0, delta: { content: text } }], model: "fake-model-v2" });
export const finishChunk = (reason) => ({ choices: [{ index: 0, delta: {}, finish_reason: reason }] });
export const usageChunk = (i, o) => ({ choices: [], usage: { prompt_tokens: i, completion_tokens: o } });
