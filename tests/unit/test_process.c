/* Unit tests for host/process.c: the child environment policy (allowlist + explicit variables, SECURITY.md
 * G10), spawning through the host API with the core mount, process groups, exit codes and signals, and
 * refusals that leak nothing. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include <uv.h>

#include "host_support.h"
#include "internal.h"
#include "support.h"

static void loop_round_trip(void) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  cr_assert_eq(ts_loop_close(&loop), 0);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

static size_t env_len(char **env) {
  size_t n = 0;
  while (env && env[n])
    n++;
  return n;
}

/* The value of NAME in env, NULL when absent; counts occurrences in *count. */
static const char *env_get(char **env, const char *name, int *count) {
  size_t n = strlen(name);
  const char *found = NULL;
  int c = 0;
  for (char **p = env; p && *p; p++)
    if (strncmp(*p, name, n) == 0 && (*p)[n] == '=') {
      found = *p + n + 1;
      c++;
    }
  if (count)
    *count = c;
  return found;
}

static const char *const allowlist[] = {"HOME", "LOGNAME", "PATH",     "SHELL", "TERM",  "USER",
                                        "LANG", "LC_ALL",  "LC_CTYPE", "TZ",    "TMPDIR"};

Test(process, child_env_allowlist_only) {
  char *parent[] = {
      "HOME=/home/u",
      "LOGNAME=u",
      "PATH=/usr/bin:/bin",
      "SHELL=/bin/sh",
      "TERM=xterm",
      "USER=u",
      "LANG=C.UTF-8",
      "LC_ALL=C",
      "LC_CTYPE=C.UTF-8",
      "TZ=UTC",
      "TMPDIR=/tmp",
      "OPENAI_API_KEY=sk-CANARY",
      "DATABASE_URL=postgres://CANARY@db/x",
      "SSH_AUTH_SOCK=/tmp/CANARY.sock",
      "LD_PRELOAD=/tmp/CANARY.so",
      "LD_LIBRARY_PATH=/tmp/CANARY",
      "NODE_OPTIONS=--require=/tmp/CANARY.js",
      "BASH_FUNC_x%%=() { echo CANARY; }",
      "AWS_SECRET_ACCESS_KEY=CANARY",
      "HOMEX=CANARY",   /* a longer name with an allowlisted prefix */
      "PAT=CANARY",     /* a shorter one */
      "LC_=CANARY",     /* the LC_ prefix alone */
      "home=CANARY",    /* case matters */
      "=CANARY",        /* no name */
      "NOEQUALSCANARY", /* no '=' */
      NULL,
  };
  char **env = ah__child_env(parent, NULL);
  cr_assert_not_null(env);
  for (size_t i = 0; i < sizeof allowlist / sizeof allowlist[0]; i++) {
    int count = 0;
    const char *v = env_get(env, allowlist[i], &count);
    cr_expect_not_null(v, "%s dropped", allowlist[i]);
    cr_expect_eq(count, 1, "%s appears %d times", allowlist[i], count);
  }
  cr_expect_str_eq(env_get(env, "PATH", NULL), "/usr/bin:/bin");
  cr_expect_str_eq(env_get(env, "LC_CTYPE", NULL), "C.UTF-8");
  for (char **p = env; *p; p++)
    cr_expect_null(strstr(*p, "CANARY"), "leaked: %s", *p);
  cr_expect_eq(env_len(env), sizeof allowlist / sizeof allowlist[0]);
  ah__child_env_free(env);
  loop_round_trip();
}

Test(process, child_env_drops_shell_functions_in_allowlisted_names) {
  char *parent[] = {
      "PATH=/bin", "TERM=() { echo CANARY; }", "HOME=()", "LC_ALL=() { :; }", "TZ=(not a fn)", "LANG=x()",
      NULL};
  char **env = ah__child_env(parent, NULL);
  cr_assert_not_null(env);
  cr_expect_null(env_get(env, "TERM", NULL), "an exported function in TERM was kept");
  cr_expect_null(env_get(env, "HOME", NULL));
  cr_expect_null(env_get(env, "LC_ALL", NULL));
  cr_expect_str_eq(env_get(env, "TZ", NULL), "(not a fn)", "only a value starting with () is a function");
  cr_expect_str_eq(env_get(env, "LANG", NULL), "x()");
  cr_expect_str_eq(env_get(env, "PATH", NULL), "/bin");
  cr_expect_eq(env_len(env), 3u);
  ah__child_env_free(env);
  loop_round_trip();
}

Test(process, child_env_extras_added_and_override) {
  char *parent[] = {"PATH=/usr/bin", "HOME=/home/u", "OPENAI_API_KEY=sk-CANARY", NULL};
  const char *extra[] = {"PATH=/opt/tool/bin", "AH_TOOL_MODE=check", "EMPTY=", NULL};
  char **env = ah__child_env(parent, extra);
  cr_assert_not_null(env);
  int count = 0;
  cr_expect_str_eq(env_get(env, "PATH", &count), "/opt/tool/bin", "the explicit value must win");
  cr_expect_eq(count, 1, "PATH appears %d times", count);
  cr_expect_str_eq(env_get(env, "HOME", NULL), "/home/u");
  cr_expect_str_eq(env_get(env, "AH_TOOL_MODE", NULL), "check",
                   "an explicit variable is added whatever its name");
  cr_expect_str_eq(env_get(env, "EMPTY", NULL), "");
  cr_expect_null(env_get(env, "OPENAI_API_KEY", NULL));
  cr_expect_eq(env_len(env), 4u);
  ah__child_env_free(env);
  loop_round_trip();
}

Test(process, child_env_malformed_extras_dropped) {
  char *parent[] = {"PATH=/usr/bin", NULL};
  const char *extra[] = {"NOEQUALS", "=value", "FN=() { echo CANARY; }", "GOOD=1", NULL};
  char **env = ah__child_env(parent, extra);
  cr_assert_not_null(env);
  for (char **p = env; *p; p++) {
    cr_expect_null(strstr(*p, "CANARY"), "kept: %s", *p);
    cr_expect_str_neq(*p, "NOEQUALS");
    cr_expect_neq((*p)[0], '=', "kept a nameless entry: %s", *p);
  }
  cr_expect_str_eq(env_get(env, "GOOD", NULL), "1");
  cr_expect_str_eq(env_get(env, "PATH", NULL), "/usr/bin");
  cr_expect_eq(env_len(env), 2u);
  ah__child_env_free(env);

  /* No parent variables and no extras: an empty, NULL-terminated environment. */
  char *none[] = {NULL};
  env = ah__child_env(none, NULL);
  cr_assert_not_null(env);
  cr_expect_eq(env_len(env), 0u);
  ah__child_env_free(env);
  loop_round_trip();
}

/* ---- spawning through the API ------------------------------------------------------------------- */

typedef struct proc_run {
  bool exited;
  int64_t status;
  int signal;
  int calls;
  ah_process *proc;
  char *out; /* stdout collected */
  size_t len;
  bool eof;
  uint64_t exit_ms;
} proc_run;

static void on_exit_cb(ah_process *p, int64_t status, int sig, void *arg) {
  proc_run *r = arg;
  cr_expect_eq(p, r->proc, "on_exit got another process");
  r->exited = true;
  r->status = status;
  r->signal = sig;
  r->calls++;
  r->exit_ms = ts_now_ms();
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  buf->base = malloc(suggested);
  buf->len = buf->base ? suggested : 0;
}

static const ah_host_api *reader_api;

/* The pipe's data field belongs to the host: the reader finds its context through the process. */
static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  proc_run *run = reader_api->process_arg(reader_api->process_of_stream(s));
  if (n > 0) {
    char *grown = realloc(run->out, run->len + (size_t)n + 1);
    cr_assert_not_null(grown);
    run->out = grown;
    memcpy(run->out + run->len, buf->base, (size_t)n);
    run->len += (size_t)n;
    run->out[run->len] = '\0';
  } else if (n < 0) {
    run->eof = true;
    uv_read_stop(s);
  }
  free(buf->base);
}

typedef struct fixture {
  uv_loop_t loop;
  ah_host *h;
  const ah_host_api *api;
  ah_mount *core;
} fixture;

static void fx_up(fixture *f) {
  cr_assert_eq(uv_loop_init(&f->loop), 0);
  f->h = th_host_new(&f->loop, 0);
  cr_assert_not_null(f->h);
  f->api = ah__host_api(f->h);
  reader_api = f->api;
  f->core = ah__host_core_mount(f->h);
}

static void fx_down(fixture *f) {
  cr_assert_eq(th_host_stop_free(&f->loop, f->h), 0);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

static ah_process_opts opts_for(const char *const *args, proc_run *run) {
  ah_process_opts o = {
      .struct_size = sizeof o,
      .file = args[0],
      .args = args,
      .env = NULL,
      .cwd = NULL,
      .on_exit = on_exit_cb,
      .arg = run,
  };
  return o;
}

static bool exited(void *arg) {
  proc_run *r = arg;
  return r->exited;
}

Test(process, spawn_env_has_no_canaries) {
  cr_assert_eq(setenv("OPENAI_API_KEY", "sk-CANARY", 1), 0);
  cr_assert_eq(setenv("DATABASE_URL", "postgres://CANARY@db/x", 1), 0);
  cr_assert_eq(setenv("SSH_AUTH_SOCK", "/tmp/CANARY.sock", 1), 0);
  cr_assert_eq(setenv("LD_PRELOAD", "/nonexistent/CANARY.so", 1), 0);
  cr_assert_eq(setenv("NODE_OPTIONS", "--require=/tmp/CANARY.js", 1), 0);
  cr_assert_eq(setenv("BASH_FUNC_x%%", "() { echo CANARY; }", 1), 0);
  cr_assert_eq(setenv("TERM", "() { echo CANARY; }", 1), 0);
  cr_assert_eq(setenv("PATH", "/usr/bin:/bin", 1), 0);
  fixture f;
  fx_up(&f);
  proc_run run = {0};
  const char *args[] = {"/bin/sh", "-c", "env", NULL};
  const char *extra[] = {"AH_TEST_EXTRA=hello-extra", NULL};
  ah_process_opts o = opts_for(args, &run);
  o.env = extra;
  o.pipe_stdout = true;
  ah_process *p = NULL;
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  cr_assert_not_null(p);
  run.proc = p;
  cr_expect_gt(f.api->process_pid(p), 0);
  cr_expect_null(f.api->process_stdin(p), "stdin was not asked for");
  cr_expect_null(f.api->process_stderr(p));
  uv_stream_t *out = f.api->process_stdout(p);
  cr_assert_not_null(out);
  cr_assert_eq(uv_read_start(out, alloc_cb, read_cb), 0);
  cr_assert(ts_run_until_pred(&f.loop, exited, &run, 10000), "the child never exited");
  cr_expect_eq(run.calls, 1);
  cr_expect_eq(run.status, 0);
  cr_expect_eq(run.signal, 0);
  cr_assert_not_null(run.out, "no output read");
  cr_expect_null(strstr(run.out, "CANARY"), "a canary reached the child:\n%s", run.out);
  cr_expect_not_null(strstr(run.out, "AH_TEST_EXTRA=hello-extra\n"), "the explicit variable is missing:\n%s",
                     run.out);
  cr_expect_not_null(strstr(run.out, "PATH=/usr/bin:/bin\n"), "PATH is missing:\n%s", run.out);
  free(run.out);
  fx_down(&f);
}

Test(process, kill_reaches_the_whole_group) {
  cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  fixture f;
  fx_up(&f);
  proc_run run = {0};
  const char *args[] = {"/bin/sh", "-c", "sleep 30 & sleep 30; echo unreachable", NULL};
  ah_process_opts o = opts_for(args, &run);
  ah_process *p = NULL;
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  run.proc = p;
  pid_t pgid = f.api->process_pid(p);
  /* Wait until the background sleep exists, so the kill has two processes to reach. */
  uint64_t deadline = ts_now_ms() + 5000;
  int members = 0;
  while (ts_now_ms() < deadline && (members = ts_group_members(pgid)) < 3)
    usleep(10000);
  cr_assert_geq(members, 3, "the shell and its two sleeps should be in group %d", (int)pgid);
  cr_expect_eq(getpgid(pgid), pgid, "the child is not the leader of its own group");
  cr_expect_neq(getpgid(pgid), getpgrp(), "the child shares the host's group");

  uint64_t t0 = ts_now_ms();
  cr_assert_eq(f.api->process_kill(p, 100), 0);
  cr_assert(ts_run_until(&f.loop, &run.exited, 10000), "no exit after kill");
  cr_expect_eq(run.calls, 1);
  cr_expect_eq(run.signal, SIGTERM, "killed by signal %d", run.signal);
  cr_expect_lt(run.exit_ms - t0, 1000u, "SIGTERM should end sh at once");
  cr_expect(ts_run_until_pred(&f.loop, ts_group_gone, &pgid, 5000), "group %d still has members", (int)pgid);
  fx_down(&f);
}

Test(process, exit_code_reported) {
  fixture f;
  fx_up(&f);
  proc_run run = {0};
  const char *args[] = {"/bin/sh", "-c", "exit 7", NULL};
  ah_process_opts o = opts_for(args, &run);
  ah_process *p = NULL;
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  run.proc = p;
  cr_assert(ts_run_until(&f.loop, &run.exited, 10000));
  cr_expect_eq(run.status, 7);
  cr_expect_eq(run.signal, 0);
  for (int i = 0; i < 10; i++)
    uv_run(&f.loop, UV_RUN_NOWAIT);
  cr_expect_eq(run.calls, 1, "on_exit ran %d times", run.calls);
  fx_down(&f);
}

Test(process, kill_signals_reported) {
  fixture f;
  fx_up(&f);
  /* grace 0: SIGKILL at once. */
  proc_run a = {0};
  const char *sleep_args[] = {"/bin/sh", "-c", "sleep 30", NULL};
  ah_process_opts o = opts_for(sleep_args, &a);
  ah_process *p = NULL;
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  a.proc = p;
  cr_assert_eq(f.api->process_kill(p, 0), 0);
  cr_assert(ts_run_until(&f.loop, &a.exited, 10000));
  cr_expect_eq(a.signal, SIGKILL);

  /* grace 100 ms, TERM ignored: SIGKILL after the grace. */
  proc_run b = {0};
  const char *stubborn[] = {"/bin/sh", "-c", "trap '' TERM; sleep 30; echo unreachable", NULL};
  o = opts_for(stubborn, &b);
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  b.proc = p;
  usleep(200000); /* let the shell install its trap */
  uint64_t t0 = ts_now_ms();
  cr_assert_eq(f.api->process_kill(p, 100), 0);
  cr_assert(ts_run_until(&f.loop, &b.exited, 10000));
  cr_expect_eq(b.signal, SIGKILL, "got signal %d", b.signal);
  cr_expect_geq(b.exit_ms - t0, 90u, "SIGKILL came before the grace");
  cr_expect_lt(b.exit_ms - t0, 1000u);
  fx_down(&f);
}

Test(process, spawn_missing_program_refused) {
  fixture f;
  fx_up(&f);
  proc_run run = {0};
  const char *abs_args[] = {"/nonexistent/agenthost-no-such-program", NULL};
  ah_process_opts o = opts_for(abs_args, &run);
  o.pipe_stdin = o.pipe_stdout = o.pipe_stderr = true;
  ah_process *p = (ah_process *)(uintptr_t)0x1;
  /* The first spawn makes libuv open its SIGCHLD plumbing for good; count descriptors after it. */
  cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_ENOENT);
  cr_expect_eq(p, (ah_process *)(uintptr_t)0x1, "*out written on failure");
  for (int i = 0; i < 10; i++)
    uv_run(&f.loop, UV_RUN_NOWAIT);
  int fds = ts_count_fds();
  for (int i = 0; i < 20; i++)
    cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_ENOENT);
  const char *path_args[] = {"agenthost-no-such-program-in-path", NULL};
  o = opts_for(path_args, &run);
  o.pipe_stdout = true;
  cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_ENOENT, "a name looked up in PATH");
  for (int i = 0; i < 10; i++)
    uv_run(&f.loop, UV_RUN_NOWAIT);
  cr_expect_eq(run.calls, 0, "on_exit ran for a process that never started");
  cr_expect_eq(ts_count_fds(), fds, "file descriptors leaked: %d before, %d after", fds, ts_count_fds());
  fx_down(&f);
}

Test(process, spawn_bad_options_refused) {
  fixture f;
  fx_up(&f);
  proc_run run = {0};
  const char *args[] = {"/bin/true", NULL};
  ah_process *p = NULL;
  ah_process_opts o = opts_for(args, &run);
  o.cwd = "tmp";
  cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_EINVAL, "a relative cwd");
  o.cwd = "./";
  cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_EINVAL);
  o.cwd = "";
  cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_EINVAL);
  o = opts_for(args, &run);
  o.on_exit = NULL;
  cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_EINVAL, "no on_exit");
  o = opts_for(args, &run);
  o.struct_size = 0;
  cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_EINVAL, "struct_size 0");
  o = opts_for(args, &run);
  o.args = NULL;
  cr_expect_eq(f.api->spawn(f.core, &o, &p), AH_EINVAL, "no args");
  o = opts_for(args, &run);
  cr_expect_eq(f.api->spawn(f.core, NULL, &p), AH_EINVAL);
  cr_expect_eq(f.api->spawn(f.core, &o, NULL), AH_EINVAL);
  cr_expect_eq(f.api->spawn(NULL, &o, &p), AH_EINVAL);
  cr_expect_null(p);
  /* An absolute cwd works and is where the child runs. */
  proc_run ok = {0};
  const char *pwd[] = {"/bin/sh", "-c", "test \"$(pwd -P)\" = /", NULL};
  o = opts_for(pwd, &ok);
  o.cwd = "/";
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  ok.proc = p;
  cr_assert(ts_run_until(&f.loop, &ok.exited, 10000));
  cr_expect_eq(ok.status, 0, "the child did not run in /");
  cr_expect_eq(run.calls, 0);
  fx_down(&f);
}

Test(process, output_tail_survives_the_exit) {
  /* 1 MiB written just before exit: the pipe stays open while it is read, so nothing is lost. */
  fixture f;
  fx_up(&f);
  proc_run run = {0};
  const char *args[] = {"/bin/sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' x; echo END", NULL};
  ah_process_opts o = opts_for(args, &run);
  o.pipe_stdout = true;
  ah_process *p = NULL;
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  run.proc = p;
  cr_assert_eq(f.api->process_arg(p), &run);
  cr_assert_eq(f.api->process_of_stream(f.api->process_stdout(p)), p);
  cr_assert_eq(uv_read_start(f.api->process_stdout(p), alloc_cb, read_cb), 0);
  cr_assert(ts_run_until_pred(&f.loop, exited, &run, 10000));
  cr_assert(run.eof, "on_exit runs after the reader saw EOF");
  cr_assert_eq(run.len, 1048576u + 4u, "got %zu bytes", run.len);
  cr_assert_eq(memcmp(run.out + run.len - 4, "END\n", 4), 0);
  free(run.out);
  fx_down(&f);
}

Test(process, sigkill_reaches_members_that_ignore_sigterm_after_the_leader_exits) {
  cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  fixture f;
  fx_up(&f);
  proc_run run = {0};
  /* The leader dies of SIGTERM at once; its background child ignores SIGTERM. */
  const char *args[] = {"/bin/sh", "-c", "(trap '' TERM; sleep 30) & sleep 30", NULL};
  ah_process_opts o = opts_for(args, &run);
  ah_process *p = NULL;
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  run.proc = p;
  pid_t pgid = f.api->process_pid(p);
  uint64_t deadline = ts_now_ms() + 5000;
  while (ts_now_ms() < deadline && ts_group_members(pgid) < 3)
    usleep(10000);
  cr_assert_geq(ts_group_members(pgid), 3);
  cr_assert_eq(f.api->process_kill(p, 200), 0);
  cr_assert(ts_run_until(&f.loop, &run.exited, 5000));
  cr_assert_eq(run.signal, SIGTERM);
  /* The survivor is still there until the grace period ends, then SIGKILL reaches it. */
  cr_assert(ts_run_until_pred(&f.loop, ts_group_gone, &pgid, 5000), "group %d still has members", (int)pgid);
  fx_down(&f);
}

Test(process, malformed_extra_does_not_remove_an_inherited_variable) {
  char *const parent[] = {"PATH=/usr/bin", "HOME=/root", NULL};
  const char *const extra[] = {"PATH", "=x", NULL};
  char **env = ah__child_env(parent, extra);
  cr_assert_not_null(env);
  int count = 0;
  cr_assert_str_eq(env_get(env, "PATH", &count), "/usr/bin");
  cr_assert_eq(count, 1);
  cr_assert_eq(env_len(env), 2);
  ah__child_env_free(env);
}

/* stderr_to_log (ABI 1.6): the host reads the child's stderr into lines on its log, escaped, tagged with the
 * plugin, the tag and the pid; a line over 512 bytes is cut and said so; process_stderr() is then NULL; a
 * last line without its newline is not lost. */
Test(process, stderr_lines_go_to_the_host_log) {
  fixture f;
  fx_up(&f);
  char path[] = "/tmp/ah-test-stderr-log-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  ah__log_set_fd(fd);
  proc_run run = {0};
  const char *args[] = {
      "/bin/sh", "-c",
      "echo first >&2; printf 'esc\\033[31m\\n' >&2; head -c 600 /dev/zero | tr '\\0' y >&2; "
      "echo >&2; printf 'no newline' >&2",
      NULL};
  ah_process_opts o = opts_for(args, &run);
  o.stderr_to_log = true;
  o.log_tag = "srv";
  ah_process *p = NULL;
  cr_assert_eq(f.api->spawn(f.core, &o, &p), 0);
  run.proc = p;
  cr_expect_null(f.api->process_stderr(p), "the host reads it");
  int pid = f.api->process_pid(p);
  cr_assert(ts_run_until(&f.loop, &run.exited, 10000));
  ah__log_set_fd(-1);
  char *text = ts_read_file(path, NULL);
  cr_assert_not_null(text);
  char want[64];
  snprintf(want, sizeof want, "srv[%d]: first", pid);
  cr_expect(strstr(text, want), "a tagged line: %s", text);
  cr_expect(strstr(text, "srv[") && strstr(text, "esc\\u001b[31m"), "escaped: %s", text);
  cr_expect(strstr(text, " (cut)"), "the long line is cut: %s", text);
  char ys[514];
  memset(ys, 'y', 513);
  ys[513] = '\0';
  cr_expect_null(strstr(text, ys), "no more than 512 bytes of it");
  cr_expect(strstr(text, "no newline"), "the last line without a newline: %s", text);
  free(text);
  unlink(path);
  close(fd);
  fx_down(&f);
}
