// The MCP conformance suite imports fs.globSync, which Node gained in 22; the machine's Node is 20. On a Node
// without it, `node --import ./node20-fs.mjs …` resolves the suite's "fs" to fs-shim.mjs: node:fs plus a
// globSync for the patterns the suite uses ("**/NAME" and plain relative paths).
import { register } from "node:module";
import * as fs from "node:fs";

if (typeof fs.globSync !== "function") register("./node20-fs-hooks.mjs", import.meta.url);
