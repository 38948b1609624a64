// The web UI with a command hook: `agenthost serve` with [hook.guard] (a before_tool hook, a real shell
// script) in Debian's Chromium driven by playwright-core. A denied run_command shows the hook's run inline
// in the conversation, marked as a denial with the hook's reason, and the tool's failed result after it;
// the command never ran.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { access, chmod, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { chromiumPath, openSessionPage, closeSessionPage, tempDir } from "./lib.mjs";

const TEST = { timeout: 90000 };
const CHROMIUM = chromiumPath();
const skip = CHROMIUM ? false : "no Chromium (apt-get install chromium, or set AH_TEST_CHROMIUM)";
const ctx = { dirs: [], errors: [] };

before(async () => {
  if (skip) return;
  const dir = await tempDir("ah-browser-hooks-");
  ctx.dirs.push(dir);
  const guard = join(dir, "guard.sh");
  await writeFile(guard, "#!/bin/sh\ndoc=$(cat)\ncase \"$doc\" in *'rm -rf /*'*) " +
    "echo 'refusing rm -rf outside the workspace' >&2; exit 2;; esac\n");
  await chmod(guard, 0o755);
  await openSessionPage(ctx, { prefix: "ah-browser-hooks",
    conf: `[hook.guard]\nevent = before_tool\nmatch = run_command\ncommand = ${guard}\n` });
});

after(() => closeSessionPage(ctx));

test("API-CONNECTION-LOOP: hooks in the web UI: a denied run_command shows the hook's denial inline, and the command never ran", { ...TEST, skip }, async () => {
  await ctx.page.fill("#prompt", '/tool run_command {"command": "true || rm -rf /*; touch ran"}');
  await ctx.page.press("#prompt", "Enter");
  const hook = '#conversation li[data-kind="hook/ran"]';
  await ctx.page.waitForSelector(hook);
  const text = await ctx.page.$eval(hook, (e) => e.textContent);
  assert.match(text, /Hook guard \(before_tool · run_command\): denied: refusing rm -rf outside the workspace/);
  assert.ok(await ctx.page.$eval(hook, (e) => e.classList.contains("is-error")), "shown as a denial");
  await ctx.page.waitForSelector('#conversation li[data-kind="tool/result"].is-error');
  assert.match(await ctx.page.$eval('#conversation li[data-kind="tool/result"] pre', (e) => e.textContent),
    /denied by hook guard/);
  // No approval card: the hook denied before the session's policy would have asked.
  assert.equal(await ctx.page.$(".request-card[data-kind='approval']"), null);
  await assert.rejects(access(join(ctx.cwd, "ran")), "the command never ran");
  assert.deepEqual(ctx.errors, []);
});
