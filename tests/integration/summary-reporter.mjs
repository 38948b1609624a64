// A node:test reporter: one line per top-level test ("ok"/"FAIL", name, duration), the failure's message
// and stack, and a final "N passed, N failed" line (the summary line every agenthost test runner ends with).
import { inspect } from "node:util";

export default async function* summaryReporter(source) {
  let passed = 0;
  let failed = 0;
  for await (const event of source) {
    const d = event.data;
    if (event.type === "test:pass" && d.nesting === 0 && !d.details?.type) {
      if (d.skip || d.todo) {
        yield `skip ${d.name}${typeof d.skip === "string" ? ` (${d.skip})` : ""}\n`;
        continue;
      }
      passed++;
      yield `ok   ${d.name} (${Math.round(d.details.duration_ms)} ms)\n`;
    } else if (event.type === "test:fail" && d.nesting === 0 && !d.details?.type) {
      failed++;
      const err = d.details?.error;
      const cause = err?.cause ?? err;
      yield `FAIL ${d.name} (${Math.round(d.details?.duration_ms ?? 0)} ms)\n`;
      yield `     ${inspect(cause, { depth: 4 }).split("\n").join("\n     ")}\n`;
    } else if (event.type === "test:fail" && d.details?.type === "suite") {
      failed++;
      yield `FAIL suite ${d.name}: ${inspect(d.details?.error?.cause ?? d.details?.error)}\n`;
    } else if (event.type === "test:stderr" || event.type === "test:stdout") {
      yield d.message;
    } else if (event.type === "test:diagnostic" && d.nesting === 0 && /^(pass|fail|tests) /.test(d.message)) {
      // node's own counters; ours below is the summary line
    }
  }
  yield `${passed} passed, ${failed} failed\n`;
}
