// Helpers every integration suite shares (the ACP and the browser suites each add their own on top).
import { join } from "node:path";
import { createServer } from "node:net";

/** The binary under test: AH_TEST_AGENTHOST (set by meson), else BUILD_ROOT/host/agenthost. */
export function agenthostPath() {
  const p = process.env.AH_TEST_AGENTHOST;
  if (p) return p;
  const build = process.env.AH_TEST_BUILD_ROOT;
  if (build) return join(build, "host", "agenthost");
  throw new Error("AH_TEST_AGENTHOST is not set (path of the built agenthost binary)");
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A TCP port free on 127.0.0.1 right now. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}
