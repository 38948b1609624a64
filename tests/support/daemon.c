/* See daemon.h. */
#include "daemon.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "admin.h"
#include "support.h"

/* Every daemon of the running test, so that the .fini can clean up after a failed assertion. */
test_daemon *d_live[4];

void d_cleanup(void) {
  ts_kill_all();
  for (size_t i = 0; i < sizeof d_live / sizeof d_live[0]; i++) {
    test_daemon *d = d_live[i];
    if (!d)
      continue;
    umount2(d->state, MNT_DETACH); /* the full-disk test's tmpfs, if a failed assertion left it mounted */
    ts_rmtree(d->dir);
    free(d->dir);
    free(d->state);
    free(d->run);
    free(d->config);
    free(d->log);
    free(d->out);
    free(d->sock);
    free(d);
    d_live[i] = NULL;
  }
}

const char *d_env_path(const char *name) {
  const char *v = getenv(name);
  cr_assert(v && *v, "%s is not set (run the tests through meson test)", name);
  return v;
}

char *d_join(const char *a, const char *b) {
  char *s = NULL;
  cr_assert_geq(asprintf(&s, "%s/%s", a, b), 0);
  return s;
}

test_daemon *d_new(const char *config_text) {
  test_daemon *d = calloc(1, sizeof *d);
  cr_assert_not_null(d);
  size_t i = 0;
  while (i < sizeof d_live / sizeof d_live[0] && d_live[i])
    i++;
  cr_assert_lt(i, sizeof d_live / sizeof d_live[0]);
  d_live[i] = d;
  d->dir = ts_mkdtemp();
  cr_assert_not_null(d->dir);
  d->state = d_join(d->dir, "state");
  d->run = d_join(d->dir, "run");
  d->log = d_join(d->dir, "daemon.log");
  d->out = d_join(d->dir, "daemon.out");
  d->sock = d_join(d->run, "admin.sock");
  d->config = ts_write_file(d->dir, "agenthost.ini", config_text);
  cr_assert_not_null(d->config);
  return d;
}

void d_write_config(test_daemon *d, const char *config_text) {
  char *tmp = ts_write_file(d->dir, "agenthost.ini.new", config_text);
  cr_assert_not_null(tmp);
  cr_assert_eq(rename(tmp, d->config), 0);
  free(tmp);
}

/* `agenthost --config C --state-dir S --runtime-dir R --log-level debug serve`, stderr to `log`. */
pid_t d_spawn_serve(test_daemon *d, const char *log) {
  char *argv[] = {(char *)d_env_path("AH_TEST_AGENTHOST"),
                  "--config",
                  d->config,
                  "--state-dir",
                  d->state,
                  "--runtime-dir",
                  d->run,
                  "--log-level",
                  "debug",
                  "serve",
                  NULL};
  pid_t pid = ts_spawn(argv, d->out, log);
  cr_assert_gt(pid, 0, "cannot start %s", argv[0]);
  return pid;
}

char *d_log(test_daemon *d) {
  char *text = ts_read_file(d->log, NULL);
  return text ? text : strdup("");
}

bool d_log_has(test_daemon *d, const char *needle) {
  char *text = d_log(d);
  bool has = strstr(text, needle) != NULL;
  free(text);
  return has;
}

/* Poll the log for `needle` (it is written by another process). */
bool d_log_wait(test_daemon *d, const char *needle, uint64_t timeout_ms) {
  uint64_t deadline = ts_now_ms() + timeout_ms;
  while (!d_log_has(d, needle)) {
    if (ts_now_ms() >= deadline)
      return false;
    usleep(20 * 1000);
  }
  return true;
}

/* Start the daemon and wait until it answers on the admin socket. An answer means the loop runs, so the
 * signal handlers are installed too (they are started before the loop, after the socket is bound). */
void d_start(test_daemon *d) {
  d->pid = d_spawn_serve(d, d->log);
  cr_assert(ts_wait_path(d->sock, 10000), "no admin socket after 10 s; log:\n%s", d_log(d));
  uint64_t deadline = ts_now_ms() + 10000;
  for (;;) {
    json_t *result = NULL;
    json_t *error = NULL;
    int rc = ah__admin_call(d->run, "plugin.list", NULL, 2000, &result, &error);
    json_decref(result);
    json_decref(error);
    if (rc == 0)
      break;
    cr_assert_lt(ts_now_ms(), deadline, "the daemon does not answer: %s; log:\n%s", ah_strerror(rc),
                 d_log(d));
    usleep(20 * 1000);
  }
}

/* SIGTERM and wait (bounded); returns the waitpid status. */
int d_stop(test_daemon *d) {
  cr_assert_gt(d->pid, 0);
  int st = ts_stop(d->pid, SIGTERM, 10000);
  d->pid = 0;
  return st;
}

void assert_clean_exit(test_daemon *d, int st) {
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the daemon did not exit 0 (status %#x); log:\n%s", st,
            d_log(d));
  cr_assert(d_log_has(d, "stopped"), "no \"stopped\" in the log:\n%s", d_log(d));
  cr_assert(!d_log_has(d, "did not close cleanly"), "the loop did not close cleanly:\n%s", d_log(d));
}

/* Run `agenthost --config C --state-dir S --runtime-dir R ARGS...` (NULL-terminated); returns the exit
 * code, *out and *err its output (freed by the caller). */
int d_cli(test_daemon *d, char **out, char **err, ...) {
  char *argv[16] = {(char *)d_env_path("AH_TEST_AGENTHOST"),
                    "--config",
                    d->config,
                    "--state-dir",
                    d->state,
                    "--runtime-dir",
                    d->run};
  size_t n = 7;
  va_list ap;
  va_start(ap, err);
  for (char *a = va_arg(ap, char *); a; a = va_arg(ap, char *)) {
    cr_assert_lt(n, sizeof argv / sizeof argv[0] - 1);
    argv[n++] = a;
  }
  va_end(ap);
  argv[n] = NULL;
  char *o = NULL;
  char *e = NULL;
  int code = ts_run(argv, 30000, &o, &e);
  cr_assert_not_null(o);
  cr_assert_not_null(e);
  *out = o;
  *err = e;
  return code;
}

/* Call `method` through the admin socket and assert success; returns the result. `params` is stolen. */
json_t *d_call_ok(test_daemon *d, const char *method, json_t *params) {
  json_t *result = NULL;
  json_t *error = NULL;
  int rc = ah__admin_call(d->run, method, params, 10000, &result, &error);
  char *text = error ? json_dumps(error, JSON_COMPACT) : NULL;
  cr_assert_eq(rc, 0, "%s failed: %s %s", method, ah_strerror(rc), text ? text : "");
  free(text);
  cr_assert_not_null(result);
  return result;
}

/* session.create in `cwd` through the admin socket; the new id is written to `sid`. */
void d_new_session(test_daemon *d, const char *cwd, char *sid, size_t cap) {
  json_t *created = d_call_ok(d, "session.create", json_pack("{s:s}", "cwd", cwd));
  const char *v = json_string_value(json_object_get(created, "sessionId"));
  cr_assert(v, "session.create answered no sessionId");
  snprintf(sid, cap, "%s", v);
  json_decref(created);
}

const char *event_kind_of(const json_t *m) {
  return json_string_value(json_object_get(json_object_get(json_object_get(m, "params"), "event"), "kind"));
}
