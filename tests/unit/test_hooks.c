/* Hooks (host/hooks.h): command hooks from the configuration run as real child processes (shell scripts
 * written by each test), plugin hooks from a fixture module; the real echo provider plays the model (its
 * committed text is what the model read), the real tools run. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hooks.h"
#include "host_support.h"
#include "internal.h"
#include "support.h"
#include "world.h"

TestSuite(hooks, .timeout = 60);

/* An executable shell script `name` in `dir` whose body is printf-formatted. */
static char *script(const char *dir, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static char *script(const char *dir, const char *name, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *body = NULL;
  cr_assert(vasprintf(&body, fmt, ap) > 0);
  va_end(ap);
  char *text = NULL;
  cr_assert(asprintf(&text, "#!/bin/sh\n%s\n", body) > 0);
  char *path = ts_write_file(dir, name, text);
  free(text);
  free(body);
  cr_assert_not_null(path);
  cr_assert_eq(chmod(path, 0755), 0);
  return path;
}

/* `dir`/`name` (owned). */
static char *path_in(const char *dir, const char *name) {
  char *p = NULL;
  cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
  return p;
}

/* The end of a test: the host stopped, the scripts' directory removed. */
static void finish(world *w, char *dir) {
  world_down(w);
  ts_rmtree(dir);
  free(dir);
}

/* A hook as the configuration holds it. */
static json_t *hook(const char *event, const char *command, const char *match, int timeout_ms,
                    const char *on_error) {
  json_t *h = json_pack("{s:s, s:s, s:[], s:[], s:[], s:i, s:s, s:b}", "event", event, "command", command,
                        "args", "env", "match", "timeout_ms", timeout_ms, "on_error", on_error, "enabled", 1);
  if (match)
    json_array_append_new(json_object_get(h, "match"), json_string(match));
  return h;
}

static void allow_tool(world *w, const char *id, const char *tool) {
  json_decref(ok_call(w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", tool, "allow")));
}

/* The data of every stored event of `kind`, in order (new array). */
static json_t *all_data(json_t *events, const char *kind) {
  json_t *out = json_array();
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) {
    if (strcmp(json_string_value(json_object_get(e, "kind")), kind) == 0)
      json_array_append(out, json_object_get(e, "data"));
  }
  return out;
}

static const char *committed(json_t *events) {
  return json_string_value(json_object_get(last_data(events, "message/committed"), "text"));
}

static const char *tool_error(json_t *events) {
  json_t *res = last_data(events, "tool/result");
  cr_assert(json_is_true(json_object_get(res, "isError")), "the tool's result is an error");
  return json_string_value(json_object_get(json_object_get(res, "result"), "error"));
}

/* ---- before_tool ---------------------------------------------------------------------------------- */

Test(hooks, a_before_tool_hook_denies_rm_rf_and_the_command_never_runs) {
  char *dir = ts_mkdtemp();
  char *guard = script(dir, "guard.sh",
                       "doc=$(cat)\n"
                       "case \"$doc\" in *'rm -rf /*'*) echo 'rm -rf outside the workspace is refused' >&2; "
                       "exit 2;; esac\nexit 0");
  world w;
  world_up_hooks(&w, json_pack("{s:o}", "guard", hook("before_tool", guard, "run_command", 5000, "deny")));
  char *id = create(&w);
  allow_tool(&w, id, "run_command");
  /* `true ||` keeps rm from running even if the hook let it through: the marker file says whether it ran. */
  free(prompt(&w, id, "/tool run_command {\"command\": \"true || rm -rf /*; touch ran\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  char marker[512];
  snprintf(marker, sizeof marker, "%s/ran", w.work);
  cr_expect_neq(access(marker, F_OK), 0, "the command never ran");
  cr_expect_str_eq(tool_error(ev), "denied by hook guard: rm -rf outside the workspace is refused");
  cr_expect(strstr(committed(ev), "rm -rf outside the workspace is refused") != NULL,
            "the model read the reason: %s", committed(ev));
  json_t *run = last_data(ev, "hook/ran");
  cr_assert_not_null(run);
  cr_expect_str_eq(json_string_value(json_object_get(run, "hook")), "guard");
  cr_expect_str_eq(json_string_value(json_object_get(run, "event")), "before_tool");
  cr_expect_str_eq(json_string_value(json_object_get(run, "outcome")), "deny");
  cr_expect_str_eq(json_string_value(json_object_get(run, "tool")), "run_command");
  cr_expect(json_integer_value(json_object_get(run, "durationMs")) >= 0);
  json_decref(ev);
  /* A command that does not match the pattern runs. */
  free(prompt(&w, id, "/tool run_command {\"command\": \"touch ran\"}"));
  wait_for(&w, id, "turn/ended", 2);
  cr_expect_eq(access(marker, F_OK), 0, "an allowed command runs");
  free(id);
  free(guard);
  finish(&w, dir);
}

Test(hooks, a_before_tool_hook_rewrites_the_arguments_and_the_next_hook_sees_them) {
  char *dir = ts_mkdtemp();
  char *rewrite =
      script(dir, "rewrite.sh", "cat >/dev/null\necho '{\"arguments\": {\"command\": \"echo rewritten\"}}'");
  char *seen = path_in(dir, "seen.json");
  char *record = script(dir, "record.sh", "cat > '%s'", seen);
  world w;
  world_up_hooks(&w, json_pack("{s:o, s:o}", "rewrite", hook("before_tool", rewrite, "run_*", 5000, "deny"),
                               "record", hook("before_tool", record, NULL, 5000, "deny")));
  char *id = create(&w);
  allow_tool(&w, id, "run_command");
  free(prompt(&w, id, "/tool run_command {\"command\": \"echo original\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *res = json_object_get(last_data(ev, "tool/result"), "result");
  cr_expect_str_eq(json_string_value(json_object_get(res, "stdout")), "rewritten\n");
  json_t *runs = all_data(ev, "hook/ran");
  cr_assert_eq(json_array_size(runs), 2, "both hooks ran, in configuration order");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(runs, 0), "hook")), "rewrite");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(runs, 0), "outcome")), "amend");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(runs, 1), "outcome")), "allow");
  /* The second hook got the document with the rewritten arguments, the session and the provider. */
  json_t *doc = json_load_file(seen, 0, NULL);
  cr_assert_not_null(doc);
  cr_expect_str_eq(json_string_value(json_object_get(doc, "event")), "before_tool");
  cr_expect_str_eq(json_string_value(json_object_get(doc, "hook")), "record");
  cr_expect_str_eq(json_string_value(json_object_get(doc, "sessionId")), id);
  cr_expect_str_eq(json_string_value(json_object_get(doc, "cwd")), w.work);
  cr_expect_str_eq(json_string_value(json_object_get(doc, "provider")), "echo");
  cr_expect_not_null(json_object_get(doc, "turnId"));
  json_t *tool = json_object_get(doc, "tool");
  cr_expect_str_eq(json_string_value(json_object_get(tool, "name")), "run_command");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(tool, "arguments"), "command")),
                   "echo rewritten");
  json_decref(doc);
  json_decref(runs);
  json_decref(ev);
  free(id);
  free(rewrite);
  free(record);
  free(seen);
  finish(&w, dir);
}

Test(hooks, the_first_deny_wins_and_later_hooks_do_not_run) {
  char *dir = ts_mkdtemp();
  char *deny =
      script(dir, "deny.sh", "cat >/dev/null\necho '{\"decision\": \"deny\", \"reason\": \"not today\"}'");
  char *never = path_in(dir, "never");
  char *later = script(dir, "later.sh", "touch '%s'", never);
  world w;
  world_up_hooks(&w, json_pack("{s:o, s:o}", "first", hook("before_tool", deny, NULL, 5000, "deny"), "second",
                               hook("before_tool", later, NULL, 5000, "deny")));
  char *id = create(&w);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect_str_eq(tool_error(ev), "denied by hook first: not today");
  cr_expect_neq(access(never, F_OK), 0, "the second hook did not run");
  json_t *runs = all_data(ev, "hook/ran");
  cr_expect_eq(json_array_size(runs), 1);
  json_decref(runs);
  json_decref(ev);
  free(id);
  free(deny);
  free(later);
  free(never);
  finish(&w, dir);
}

/* ---- after_tool ----------------------------------------------------------------------------------- */

Test(hooks, an_after_tool_hook_formats_the_written_file_and_adds_a_note_for_the_model) {
  char *dir = ts_mkdtemp();
  /* A formatter: trailing blanks go, the file ends with one newline. */
  char *fmt =
      script(dir, "format.sh",
             "exec python3 -c '\n"
             "import json, os, sys\n"
             "d = json.load(sys.stdin)\n"
             "p = os.path.join(d[\"cwd\"], d[\"tool\"][\"arguments\"][\"path\"])\n"
             "lines = [l.rstrip() for l in open(p).read().splitlines()]\n"
             "open(p, \"w\").write(\"\\n\".join(lines) + \"\\n\")\n"
             "print(json.dumps({\"context\": \"formatted \" + d[\"tool\"][\"arguments\"][\"path\"]}))\n"
             "'");
  world w;
  world_up_hooks(&w, json_pack("{s:o}", "format", hook("after_tool", fmt, "write_file", 10000, "allow")));
  char *id = create(&w);
  allow_tool(&w, id, "write_file");
  free(prompt(&w, id, "/tool write_file {\"path\": \"a.txt\", \"content\": \"x = 1   \\ny = 2\\t\"}"));
  wait_for(&w, id, "turn/ended", 1);
  char path[512];
  snprintf(path, sizeof path, "%s/a.txt", w.work);
  char *text = ts_read_file(path, NULL);
  cr_assert_not_null(text);
  cr_expect_str_eq(text, "x = 1\ny = 2\n");
  free(text);
  json_t *ev = history(&w, id);
  json_t *res = last_data(ev, "tool/result");
  cr_expect_not(json_is_true(json_object_get(res, "isError")));
  json_t *notes = json_object_get(json_object_get(res, "result"), "hookNotes");
  cr_expect_str_eq(json_string_value(json_array_get(notes, 0)), "formatted a.txt");
  cr_expect(strstr(committed(ev), "formatted a.txt") != NULL, "the model read the note: %s", committed(ev));
  cr_expect_str_eq(json_string_value(json_object_get(last_data(ev, "hook/ran"), "outcome")), "amend");
  json_decref(ev);
  free(id);
  free(fmt);
  finish(&w, dir);
}

/* ---- prompt_submit -------------------------------------------------------------------------------- */

Test(hooks, a_prompt_hook_adds_context_the_model_receives_or_refuses_the_prompt) {
  char *dir = ts_mkdtemp();
  char *ctx = script(dir, "ctx.sh",
                     "doc=$(cat)\n"
                     "case \"$doc\" in *forbidden*) echo 'this prompt is not allowed' >&2; exit 2;; esac\n"
                     "printf '%%s\\n' '{\"context\": \"team rule: answer in English\"}'");
  world w;
  world_up_hooks(&w, json_pack("{s:o}", "rules", hook("prompt_submit", ctx, NULL, 5000, "deny")));
  char *id = create(&w);
  free(prompt(&w, id, "hello"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect_str_eq(committed(ev), "echo: hello\nteam rule: answer in English");
  cr_expect_str_eq(json_string_value(json_object_get(last_data(ev, "hook/ran"), "outcome")), "amend");
  json_decref(ev);
  free(prompt(&w, id, "something forbidden"));
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  json_t *end = last_data(ev, "turn/ended");
  cr_expect_str_eq(json_string_value(json_object_get(end, "reason")), "refusal");
  cr_expect_str_eq(json_string_value(json_object_get(end, "error")),
                   "denied by hook rules: this prompt is not allowed");
  json_decref(ev);
  free(id);
  free(ctx);
  finish(&w, dir);
}

/* ---- failures: on_error --------------------------------------------------------------------------- */

static void expect_failure(const char *body, int timeout_ms, const char *error) {
  char *dir = ts_mkdtemp();
  char *bad = script(dir, "bad.sh", "%s", body);
  world w;
  world_up_hooks(&w,
                 json_pack("{s:o, s:o}", "strict", hook("before_tool", bad, "list_dir", timeout_ms, "deny"),
                           "lenient", hook("before_tool", bad, "read_file", timeout_ms, "allow")));
  char *id = create(&w);
  free(ts_write_file(w.work, "f.txt", "content"));
  uint64_t t0 = ts_now_ms();
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  char want[256];
  snprintf(want, sizeof want, "hook strict failed: %s", error);
  cr_expect_str_eq(tool_error(ev), want, "on_error = deny");
  json_t *run = last_data(ev, "hook/ran");
  cr_expect_str_eq(json_string_value(json_object_get(run, "outcome")), "error");
  cr_expect_str_eq(json_string_value(json_object_get(run, "error")), error);
  cr_expect_str_eq(json_string_value(json_object_get(run, "onError")), "deny");
  json_decref(ev);
  free(prompt(&w, id, "/tool read_file {\"path\": \"f.txt\"}"));
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  json_t *res = last_data(ev, "tool/result");
  cr_expect_not(json_is_true(json_object_get(res, "isError")), "on_error = allow: the tool ran");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(res, "result"), "content")), "content");
  json_decref(ev);
  if (timeout_ms < 1000)
    cr_expect_lt(ts_now_ms() - t0, 8000, "the hanging hooks were killed at their timeout");
  free(id);
  free(bad);
  finish(&w, dir);
}

Test(hooks, a_hook_that_hangs_times_out_and_on_error_decides) {
  expect_failure("exec sleep 30", 300, "timed out after 300 ms");
}

Test(hooks, a_hook_that_crashes_follows_on_error) {
  expect_failure("cat >/dev/null\nkill -SEGV $$", 5000, "killed by SIGSEGV");
}

Test(hooks, a_hook_that_prints_invalid_json_follows_on_error) {
  expect_failure("cat >/dev/null\necho '{not json'", 5000, "its output is not JSON");
}

Test(hooks, a_hook_that_exits_with_another_status_follows_on_error) {
  expect_failure("cat >/dev/null\nexit 7", 5000, "exited with status 7");
}

Test(hooks, a_hook_whose_output_is_oversized_follows_on_error) {
  expect_failure("cat >/dev/null\nhead -c 2000000 /dev/zero | tr '\\0' a", 10000,
                 "its output is longer than 1 MiB");
}

Test(hooks, hostile_answers_are_errors_that_name_what_is_wrong) {
  expect_failure("cat >/dev/null\necho '[1, 2]'", 5000, "the answer is not a JSON object");
  expect_failure("cat >/dev/null\necho '{\"decision\": \"maybe\"}'", 5000,
                 "decision must be \"allow\" or \"deny\"");
  expect_failure("cat >/dev/null\necho '{\"arguments\": [1]}'", 5000, "arguments must be a JSON object");
  expect_failure("cat >/dev/null\necho '{\"context\": 7}'", 5000, "context must be a string");
  expect_failure("cat >/dev/null\nprintf '{\"reason\": \"\\377\"}'", 5000, "its output is not JSON");
}

Test(hooks, a_hook_whose_program_is_missing_follows_on_error) {
  char *dir = ts_mkdtemp();
  world w;
  world_up_hooks(&w,
                 json_pack("{s:o}", "gone", hook("before_tool", "/nonexistent/hook", NULL, 5000, "deny")));
  char *id = create(&w);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect(strncmp(tool_error(ev), "hook gone failed: cannot run: ", 30) == 0, "%s", tool_error(ev));
  json_decref(ev);
  free(id);
  finish(&w, dir);
}

/* ---- cancel --------------------------------------------------------------------------------------- */

static bool file_has_pid(void *arg) {
  char *text = ts_read_file(arg, NULL);
  bool yes = text && atoi(text) > 0;
  free(text);
  return yes;
}

static bool pid_gone(void *arg) {
  return kill((pid_t)(intptr_t)arg, 0) != 0;
}

Test(hooks, cancelling_the_turn_during_a_hook_kills_it) {
  char *dir = ts_mkdtemp();
  char *pidfile = path_in(dir, "pid");
  char *slow = script(dir, "slow.sh", "echo $$ > '%s'\nexec sleep 30", pidfile);
  world w;
  world_up_hooks(&w, json_pack("{s:o}", "slow", hook("before_tool", slow, NULL, 60000, "allow")));
  char *id = create(&w);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  cr_assert(ts_run_until_pred(&w.loop, file_has_pid, pidfile, 10000), "the hook started");
  char *text = ts_read_file(pidfile, NULL);
  pid_t pid = (pid_t)atoi(text);
  free(text);
  json_decref(ok_call(&w, "session.cancel", json_pack("{s:s}", "sessionId", id)));
  wait_for(&w, id, "turn/ended", 1);
  cr_expect(ts_run_until_pred(&w.loop, pid_gone, (void *)(intptr_t)pid, 5000), "the hook's process is gone");
  json_t *ev = history(&w, id);
  cr_expect_str_eq(json_string_value(json_object_get(last_data(ev, "turn/ended"), "reason")), "cancelled");
  cr_expect_str_eq(json_string_value(json_object_get(last_data(ev, "hook/ran"), "outcome")), "cancelled");
  cr_expect_str_eq(tool_error(ev), "cancelled", "the tool did not run");
  json_decref(ev);
  free(id);
  free(slow);
  free(pidfile);
  finish(&w, dir);
}

/* ---- observing points ----------------------------------------------------------------------------- */

static bool lines_at_least(const char *path, int n) {
  char *text = ts_read_file(path, NULL);
  int lines = 0;
  for (const char *p = text; p && *p; p++)
    lines += *p == '\n';
  free(text);
  return lines >= n;
}

typedef struct lines_wait {
  const char *path;
  int n;
} lines_wait;

static bool enough_lines(void *arg) {
  lines_wait *l = arg;
  return lines_at_least(l->path, l->n);
}

Test(hooks, observing_hooks_audit_session_start_turn_end_and_close_to_a_file) {
  char *dir = ts_mkdtemp();
  char *audit = path_in(dir, "audit.jsonl");
  char *log = script(dir, "audit.sh", "cat >> '%s'", audit);
  world w;
  world_up_hooks(&w,
                 json_pack("{s:o, s:o, s:o}", "audit-start", hook("session_start", log, NULL, 5000, "allow"),
                           "audit-end", hook("turn_end", log, NULL, 5000, "allow"), "audit-close",
                           hook("session_close", log, NULL, 5000, "allow")));
  char *id = create(&w);
  free(prompt(&w, id, "hi"));
  wait_for(&w, id, "turn/ended", 1);
  lines_wait two = {audit, 2};
  cr_assert(ts_run_until_pred(&w.loop, enough_lines, &two, 10000));
  json_decref(ok_call(&w, "session.close", json_pack("{s:s}", "sessionId", id)));
  lines_wait three = {audit, 3};
  cr_assert(lines_at_least(audit, 3) || ts_run_until_pred(&w.loop, enough_lines, &three, 10000));
  /* Each line is the document the hook got. */
  char *text = ts_read_file(audit, NULL);
  char *save = NULL;
  const char *want[] = {"session_start", "turn_end", "session_close"};
  int i = 0;
  for (char *line = strtok_r(text, "\n", &save); line && i < 3; line = strtok_r(NULL, "\n", &save), i++) {
    json_t *doc = json_loads(line, 0, NULL);
    cr_assert_not_null(doc, "line %d is JSON", i + 1);
    cr_expect_str_eq(json_string_value(json_object_get(doc, "event")), want[i]);
    cr_expect_str_eq(json_string_value(json_object_get(doc, "sessionId")), id);
    if (i == 1)
      cr_expect_str_eq(json_string_value(json_object_get(json_object_get(doc, "turn"), "reason")), "end");
    json_decref(doc);
  }
  cr_expect_eq(i, 3);
  free(text);
  /* The runs are in the session's log (the close's before the session closed). */
  json_t *ev = history(&w, id);
  json_t *runs = all_data(ev, "hook/ran");
  cr_expect_eq(json_array_size(runs), 3, "three runs stored");
  json_decref(runs);
  json_decref(ev);
  free(id);
  free(log);
  free(audit);
  finish(&w, dir);
}

/* ---- plugin hooks --------------------------------------------------------------------------------- */

static bool plugin_waiting(void *arg) {
  world *w = arg;
  json_t *r = ok_call(w, "hooksfx.stats", json_object());
  bool yes = json_integer_value(json_object_get(r, "waiting")) == 1;
  json_decref(r);
  return yes;
}

Test(hooks, a_plugin_hook_amends_and_denies_and_sees_the_document) {
  world w;
  world_up(&w);
  cr_assert_eq(
      th_load(w.h, "hooks",
              json_pack("{s:s, s:s}", "answer", "{\"arguments\": {\"path\": \"sub\"}}", "match", "list_dir")),
      0);
  char sub[512];
  snprintf(sub, sizeof sub, "%s/sub", w.work);
  cr_assert_eq(mkdir(sub, 0700), 0);
  free(ts_write_file(sub, "inside.txt", "x"));
  char *id = create(&w);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *entries = json_object_get(json_object_get(last_data(ev, "tool/result"), "result"), "entries");
  cr_expect_eq(json_array_size(entries), 1);
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(entries, 0), "name")), "inside.txt");
  json_t *run = last_data(ev, "hook/ran");
  cr_expect_str_eq(json_string_value(json_object_get(run, "source")), "plugin");
  cr_expect_str_eq(json_string_value(json_object_get(run, "plugin")), "hooks");
  cr_expect_str_eq(json_string_value(json_object_get(run, "outcome")), "amend");
  json_decref(ev);
  json_t *st = ok_call(&w, "hooksfx.stats", json_object());
  json_t *last = json_object_get(st, "last");
  cr_expect_str_eq(json_string_value(json_object_get(last, "hook")), "fx-hook");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(last, "tool"), "name")), "list_dir");
  json_decref(st);
  /* Described with the host, with its plugin and no command. */
  json_t *d = ah__host_describe(w.h);
  json_t *hk = json_array_get(json_object_get(d, "hooks"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(hk, "name")), "fx-hook");
  cr_expect_str_eq(json_string_value(json_object_get(hk, "plugin")), "hooks");
  cr_expect_str_eq(json_string_value(json_object_get(hk, "onError")), "deny");
  json_decref(d);
  /* Unloaded: its hook is gone, the tool runs as asked. */
  cr_assert_eq(th_unload(&w.loop, w.h, "hooks"), 0);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  entries = json_object_get(json_object_get(last_data(ev, "tool/result"), "result"), "entries");
  cr_expect_eq(json_array_size(entries), 1);
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(entries, 0), "name")), "sub");
  json_decref(ev);
  /* A denying one. */
  cr_assert_eq(
      th_load(w.h, "hooks", json_pack("{s:s}", "answer", "{\"decision\": \"deny\", \"reason\": \"no\"}")), 0);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  wait_for(&w, id, "turn/ended", 3);
  ev = history(&w, id);
  cr_expect_str_eq(tool_error(ev), "denied by hook fx-hook: no");
  json_decref(ev);
  free(id);
  world_down(&w);
}

Test(hooks, a_plugin_hook_withdrawn_mid_call_answers_per_on_error) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "hooks", json_pack("{s:s}", "wait", "true")), 0);
  char *id = create(&w);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  cr_assert(ts_run_until_pred(&w.loop, plugin_waiting, &w, 10000), "the hook is called");
  cr_assert_eq(th_unload(&w.loop, w.h, "hooks"), 0);
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect_str_eq(tool_error(ev), "hook fx-hook failed: its plugin was withdrawn during the call");
  json_t *run = last_data(ev, "hook/ran");
  cr_expect_str_eq(json_string_value(json_object_get(run, "outcome")), "error");
  cr_expect_str_eq(json_string_value(json_object_get(run, "onError")), "deny");
  json_decref(ev);
  /* With on_error = allow, the same withdraw lets the tool run. */
  cr_assert_eq(th_load(w.h, "hooks", json_pack("{s:s, s:s}", "wait", "true", "on_error", "allow")), 0);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  cr_assert(ts_run_until_pred(&w.loop, plugin_waiting, &w, 10000));
  cr_assert_eq(th_unload(&w.loop, w.h, "hooks"), 0);
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  cr_expect_not(json_is_true(json_object_get(last_data(ev, "tool/result"), "isError")));
  json_decref(ev);
  free(id);
  world_down(&w);
}

Test(hooks, a_plugin_hook_that_times_out_or_fails_follows_on_error) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "hooks", json_pack("{s:s, s:s}", "wait", "true", "timeout_ms", "200")), 0);
  char *id = create(&w);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect_str_eq(tool_error(ev), "hook fx-hook failed: timed out after 200 ms");
  json_decref(ev);
  cr_assert_eq(th_unload(&w.loop, w.h, "hooks"), 0);
  cr_assert_eq(th_load(w.h, "hooks", json_pack("{s:s}", "error", "the audit store is down")), 0);
  free(prompt(&w, id, "/tool list_dir {\"path\": \".\"}"));
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  cr_expect_str_eq(tool_error(ev), "hook fx-hook failed: the audit store is down");
  json_decref(ev);
  free(id);
  world_down(&w);
}

Test(hooks, plugin_hook_registrations_are_checked) {
  world w;
  world_up(&w);
  const char *bad[] = {"event", "name", "handler", "on_error"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_expect_eq(th_load(w.h, "hooks", json_pack("{s:s}", "bad", bad[i])), AH_EINVAL, "bad %s refused",
                 bad[i]);
  cr_expect_eq(th_load(w.h, "hooks", json_pack("{s:s}", "timeout_ms", "600001")), AH_EINVAL);
  json_t *d = ah__host_describe(w.h);
  cr_expect_eq(json_array_size(json_object_get(d, "hooks")), 0, "nothing of the refused mounts stays");
  json_decref(d);
  world_down(&w);
}

Test(hooks, hooks_are_described_in_order_without_their_arguments_or_environment) {
  json_t *a = hook("before_tool", "/usr/bin/guard", "mcp__github__*", 1000, "deny");
  json_array_append_new(json_object_get(a, "args"), json_string("--token=s3cret"));
  json_array_append_new(json_object_get(a, "env"), json_string("API_KEY=s3cret"));
  world w;
  world_up_hooks(
      &w, json_pack("{s:o, s:o}", "zeta", a, "alpha", hook("turn_end", "/usr/bin/log", NULL, 2000, "allow")));
  json_t *d = ah__host_describe(w.h);
  json_t *hooks = json_object_get(d, "hooks");
  cr_assert_eq(json_array_size(hooks), 2);
  json_t *z = json_array_get(hooks, 0);
  cr_expect_str_eq(json_string_value(json_object_get(z, "name")), "zeta", "configuration order, not names");
  cr_expect_str_eq(json_string_value(json_object_get(z, "event")), "before_tool");
  cr_expect_str_eq(json_string_value(json_object_get(z, "command")), "/usr/bin/guard");
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(z, "match"), 0)), "mcp__github__*");
  cr_expect_eq(json_integer_value(json_object_get(z, "timeoutMs")), 1000);
  char *text = json_dumps(d, 0);
  cr_expect_null(strstr(text, "s3cret"), "no argument or environment value is shown");
  free(text);
  json_decref(d);
  cr_expect(ah__hooks_any(w.h, "before_tool", "mcp__github__create_issue"));
  cr_expect_not(ah__hooks_any(w.h, "before_tool", "mcp__gitlab__x"));
  cr_expect_not(ah__hooks_any(w.h, "after_tool", "read_file"));
  world_down(&w);
}

/* The growth rule: a module built for ABI 1.6 (a tool source, before hooks) runs in today's host, and a
 * hook applies to its tools like to any other. */
Test(hooks, a_tool_source_built_for_abi_1_6_runs_and_its_tools_pass_the_hooks) {
  char *dir = ts_mkdtemp();
  char *amend = script(dir, "amend.sh", "cat >/dev/null\necho '{\"arguments\": {\"text\": \"hooked\"}}'");
  world w;
  world_up_hooks(&w, json_pack("{s:o}", "amend", hook("before_tool", amend, "fx__*", 5000, "deny")));
  cr_assert_eq(th_load(w.h, "abi-1-6", NULL), 0);
  char *id = create(&w);
  allow_tool(&w, id, "fx__echo");
  free(prompt(&w, id, "/tool fx__echo {\"text\": \"plain\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *res = json_object_get(last_data(ev, "tool/result"), "result");
  cr_expect_str_eq(json_string_value(json_object_get(res, "text")), "hooked");
  json_decref(ev);
  free(id);
  free(amend);
  finish(&w, dir);
}
