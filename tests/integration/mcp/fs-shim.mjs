// node:fs with globSync(pattern, {cwd}) for Node 20: "**/NAME" finds NAME at any depth below cwd; other
// patterns are taken as one relative path. Results are relative to cwd, as Node 22's globSync gives them.
import * as fs from "node:fs";
import { join, relative } from "node:path";
export * from "node:fs";
export default fs.default ?? fs;

export function globSync(pattern, options = {}) {
  const cwd = options.cwd ?? process.cwd();
  if (!pattern.startsWith("**/")) return fs.existsSync(join(cwd, pattern)) ? [pattern] : [];
  const name = pattern.slice(3);
  const out = [];
  const walk = (dir) => {
    let entries = [];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name === name) out.push(relative(cwd, p));
    }
  };
  walk(cwd);
  return out;
}
