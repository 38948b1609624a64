// relay.mjs LOG PROGRAM ARGS…: runs an MCP stdio server and passes its stdin and stdout through unchanged,
// appending every line the client sent to LOG. Exits with the server; stdin EOF is passed on.
import { spawn } from "node:child_process";
import { appendFileSync } from "node:fs";

const [log, program, ...args] = process.argv.slice(2);
const child = spawn(program, args, { stdio: ["pipe", "inherit", "inherit"] });
let partial = "";
process.stdin.on("data", (chunk) => {
  child.stdin.write(chunk);
  partial += chunk.toString("utf8");
  let nl;
  while ((nl = partial.indexOf("\n")) >= 0) {
    appendFileSync(log, partial.slice(0, nl + 1));
    partial = partial.slice(nl + 1);
  }
});
process.stdin.on("end", () => child.stdin.end());
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
process.on("SIGTERM", () => child.kill("SIGTERM"));
