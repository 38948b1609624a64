// A node:test reporter: one line per test ("ok"/"FAIL", name, duration; tests inside a describe() are
// indented), the failure's message and stack, and a final "N passed, N failed" line (the summary line every
// agenthost test runner ends with). Suites are not counted, their tests are.
import { inspect } from "node:util";

export default async function* summaryReporter(source) {
  let passed = 0;
  let failed = 0;
  for await (const event of source) {
    const d = event.data;
    const pad = "  ".repeat(d?.nesting ?? 0);
    if (event.type === "test:pass" && d.details?.type !== "suite") {
      if (d.skip || d.todo) {
        yield `${pad}skip ${d.name}${typeof d.skip === "string" ? ` (${d.skip})` : ""}\n`;
        continue;
      }
      passed++;
      yield `${pad}ok   ${d.name} (${Math.round(d.details.duration_ms)} ms)\n`;
    } else if (event.type === "test:fail" && d.details?.type !== "suite") {
      failed++;
      const err = d.details?.error;
      const cause = err?.cause ?? err;
      yield `${pad}FAIL ${d.name} (${Math.round(d.details?.duration_ms ?? 0)} ms)\n`;
      yield `${pad}     ${inspect(cause, { depth: 4 }).split("\n").join(`\n${pad}     `)}\n`;
    } else if (event.type === "test:fail" && d.details?.type === "suite" && d.details?.error?.failureType !== "subtestsFailed") {
      // A suite that failed by itself (a hook threw), not only through its tests.
      failed++;
      yield `${pad}FAIL suite ${d.name}: ${inspect(d.details?.error?.cause ?? d.details?.error)}\n`;
    } else if (event.type === "test:stderr" || event.type === "test:stdout") {
      yield d.message;
    } else if (event.type === "test:diagnostic" && d.nesting === 0 && /^(pass|fail|tests) /.test(d.message)) {
      // node's own counters; ours below is the summary line
    }
  }
  yield `${passed} passed, ${failed} failed\n`;
}
