// Takes the web UI's screenshot for docs/web-ui.md (not a test): a session with a Markdown answer and a
// tool call waiting for approval, in Debian's Chromium at 1280×800.
//
//   AH_TEST_AGENTHOST=build/host/agenthost node tests/integration/browser/screenshot.mjs docs/images/web-ui.png
import { closeSessionPage, openSessionPage } from "./lib.mjs";

const out = process.argv[2];
if (!out) {
  console.error("usage: screenshot.mjs OUT.png");
  process.exit(2);
}
const ctx = { dirs: [], errors: [] };
try {
  await openSessionPage(ctx, { prefix: "ah-screenshot", conf: "" });
  const page = ctx.page;
  await page.setViewportSize({ width: 1280, height: 800 });
  await page.fill("#new-title", "");
  await page.fill("#prompt", "Plan for today:\n\n- **review** the open pull requests\n- write `notes.md`");
  await page.press("#prompt", "Enter");
  await page.waitForSelector('#conversation .msg[data-kind="message/committed"]');
  await page.fill("#prompt", '/tool write_file {"path": "notes.md", "content": "# Notes\\n"}');
  await page.press("#prompt", "Enter");
  await page.waitForSelector("#requests button");
  await page.waitForTimeout(300);
  await page.screenshot({ path: out });
  console.log(`wrote ${out}`);
} finally {
  await closeSessionPage(ctx);
}
