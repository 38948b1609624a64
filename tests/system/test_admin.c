/* Integration tests of the admin channel: the real agenthost binary ($AH_TEST_AGENTHOST) started as a
 * daemon in a private state and runtime directory, driven with its own CLI (`agenthost plugins ...`), with
 * ah__admin_call() and with a raw Unix socket. Every test starts the processes it needs and stops them. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "admin.h"
#include "daemon.h"
#include "support.h"

static bool str_is(json_t *v, const char *s) {
  const char *t = json_string_value(v);
  return t && strcmp(t, s) == 0;
}

/* The plugin `name` of host.describe's value, or NULL. Borrowed from `desc`. */
static json_t *described_plugin(json_t *desc, const char *name) {
  size_t i = 0;
  json_t *p = NULL;
  json_array_foreach(json_object_get(desc, "plugins"), i, p) {
    if (str_is(json_object_get(p, "name"), name))
      return p;
  }
  return NULL;
}

static json_t *plugin_method(json_t *plugin, const char *method) {
  size_t i = 0;
  json_t *m = NULL;
  json_array_foreach(json_object_get(plugin, "methods"), i, m) {
    if (str_is(json_object_get(m, "name"), method))
      return m;
  }
  return NULL;
}

static bool d_describes(test_daemon *d, const char *plugin) {
  json_t *desc = d_call_ok(d, "host.describe", NULL);
  bool has = described_plugin(desc, plugin) != NULL;
  json_decref(desc);
  return has;
}

/* Poll host.describe until it lists `plugin` (want) or no longer does (!want). */
static bool d_describes_wait(test_daemon *d, const char *plugin, bool want, uint64_t timeout_ms) {
  uint64_t deadline = ts_now_ms() + timeout_ms;
  while (d_describes(d, plugin) != want) {
    if (ts_now_ms() >= deadline)
      return false;
    usleep(20 * 1000);
  }
  return true;
}

/* ---- plugins list ---------------------------------------------------------------------------------- */

Test(admin, plugins_list_shows_the_core, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  d_start(d);
  char *out = NULL;
  char *err = NULL;
  int code = d_cli(d, &out, &err, "plugins", "list", NULL);
  cr_assert_eq(code, 0, "plugins list exited %d: %s", code, err);
  cr_assert(strncmp(out, "core ", 5) == 0, "the first line is not the core:\n%s", out);
  cr_assert(strstr(out, "active"), "the core is not active:\n%s", out);
  cr_assert(strstr(out, "(built in)"), "the core has no \"(built in)\" path:\n%s", out);
  free(out);
  free(err);

  code = d_cli(d, &out, &err, "plugins", "list", "--json", NULL);
  cr_assert_eq(code, 0, "plugins list --json exited %d: %s", code, err);
  json_error_t jerr;
  json_t *list = json_loads(out, 0, &jerr);
  cr_assert_not_null(list, "plugins list --json is not JSON (%s):\n%s", jerr.text, out);
  json_t *plugins = json_object_get(list, "plugins");
  cr_assert_eq(json_array_size(plugins), 1, "only the core was expected:\n%s", out);
  json_t *core = json_array_get(plugins, 0);
  cr_assert_str_eq(json_string_value(json_object_get(core, "name")), "core");
  cr_assert_str_eq(json_string_value(json_object_get(core, "state")), "active");
  json_decref(list);
  free(out);
  free(err);
  assert_clean_exit(d, d_stop(d));
}

/* ---- an out-of-tree plugin, built with pkg-config only ------------------------------------------------- */

/* Build tests/outoftree/hello.c into dir/hello.so exactly as a third party would. */
static char *build_hello(const char *dir) {
  const char *build_root = d_env_path("AH_TEST_BUILD_ROOT");
  const char *source_root = d_env_path("AH_TEST_SOURCE_ROOT");
  char *pc_path = d_join(build_root, "meson-uninstalled");
  cr_assert_eq(setenv("PKG_CONFIG_PATH", pc_path, 1), 0);
  unsetenv("PKG_CONFIG_DISABLE_UNINSTALLED");
  unsetenv("PKG_CONFIG_LIBDIR");

  /* meson writes only agenthost-plugin-uninstalled.pc there: pkg-config must pick that variant for the
   * plain name (its prefix is the build root; the installed file's is the install prefix). */
  char *argv_prefix[] = {"/bin/sh", "-c", "pkg-config --variable=prefix agenthost-plugin", NULL};
  char *out = NULL;
  char *err = NULL;
  int code = ts_run(argv_prefix, 30000, &out, &err);
  cr_assert_eq(code, 0, "pkg-config does not find agenthost-plugin in %s: %s", pc_path, err);
  out[strcspn(out, "\n")] = '\0';
  cr_assert_str_eq(out, build_root,
                   "pkg-config did not resolve agenthost-plugin to the -uninstalled variant");
  free(out);
  free(err);

  char *so = d_join(dir, "hello.so");
  char *cmd = NULL;
  cr_assert_geq(asprintf(&cmd,
                         "cc -shared -fPIC $(pkg-config --cflags agenthost-plugin) -o '%s' "
                         "'%s/tests/outoftree/hello.c'",
                         so, source_root),
                0);
  char *argv_cc[] = {"/bin/sh", "-c", cmd, NULL};
  char *argv_cflags[] = {"/bin/sh", "-c", "pkg-config --cflags agenthost-plugin", NULL};
  char *cflags = NULL;
  ts_run(argv_cflags, 30000, &cflags, NULL);
  code = ts_run(argv_cc, 60000, &out, &err);
  cr_assert_eq(code, 0,
               "the out-of-tree plugin does not build with pkg-config only (cflags \"%s\" from %s):\n%s\n%s",
               cflags ? cflags : "?", pc_path, cmd, err);
  cr_assert_eq(access(so, R_OK), 0);
  free(cflags);
  free(out);
  free(err);
  free(cmd);
  free(pc_path);
  return so;
}

static json_t *call_greet(test_daemon *d, int *rc, json_t **error) {
  json_t *result = NULL;
  *rc = ah__admin_call(d->run, "hello.greet", json_object(), 10000, &result, error);
  return result;
}

static void assert_greets(test_daemon *d) {
  int rc = 0;
  json_t *error = NULL;
  json_t *result = call_greet(d, &rc, &error);
  cr_assert_eq(rc, 0, "hello.greet failed: %s", ah_strerror(rc));
  json_t *want = json_pack("{s:s}", "greeting", "hello");
  char *got = json_dumps(result, JSON_COMPACT);
  cr_assert(json_equal(result, want), "hello.greet answered %s", got);
  free(got);
  json_decref(want);
  json_decref(result);
  json_decref(error);
}

static void assert_describes_hello(test_daemon *d) {
  json_t *desc = d_call_ok(d, "host.describe", NULL);
  json_t *hello = described_plugin(desc, "hello");
  char *text = json_dumps(desc, JSON_COMPACT);
  cr_assert_not_null(hello, "host.describe does not list hello: %s", text);
  cr_assert_not_null(plugin_method(hello, "hello.greet"), "hello has no hello.greet: %s", text);
  free(text);
  json_decref(desc);
}

Test(admin, out_of_tree_plugin_load_unload_reload, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  char *so = build_hello(d->dir);
  d_start(d);
  char *out = NULL;
  char *err = NULL;

  int code = d_cli(d, &out, &err, "plugins", "load", so, NULL);
  cr_assert_eq(code, 0, "plugins load exited %d: %s", code, err);
  cr_assert(strstr(out, "mounted hello"), "unexpected output: %s", out);
  free(out);
  free(err);
  assert_describes_hello(d);
  assert_greets(d);

  code = d_cli(d, &out, &err, "plugins", "unload", "hello", NULL);
  cr_assert_eq(code, 0, "plugins unload exited %d: %s", code, err);
  free(out);
  free(err);
  cr_assert_not(d_describes(d, "hello"), "hello is still described after the unload");

  /* Fail closed: the withdrawn method is `unavailable`, not "no such method" and not answered. */
  int rc = 0;
  json_t *error = NULL;
  json_t *result = call_greet(d, &rc, &error);
  cr_assert_null(result);
  cr_assert_eq(rc, AH_EUNAVAILABLE, "hello.greet after the unload: %s", ah_strerror(rc));
  cr_assert_not_null(error);
  char *etext = json_dumps(error, JSON_COMPACT);
  const char *category = json_string_value(json_object_get(json_object_get(error, "data"), "category"));
  cr_assert(category && strcmp(category, "unavailable") == 0, "error without category unavailable: %s",
            etext);
  free(etext);
  json_decref(error);

  /* The same path mounts again. */
  code = d_cli(d, &out, &err, "plugins", "load", so, NULL);
  cr_assert_eq(code, 0, "the second plugins load exited %d: %s", code, err);
  cr_assert(strstr(out, "mounted hello"), "unexpected output: %s", out);
  free(out);
  free(err);
  assert_describes_hello(d);
  assert_greets(d);

  code = d_cli(d, &out, &err, "plugins", "reload", "hello", NULL);
  cr_assert_eq(code, 0, "plugins reload exited %d: %s", code, err);
  cr_assert(strstr(out, "reloaded hello"), "unexpected output: %s", out);
  free(out);
  free(err);
  assert_describes_hello(d);
  assert_greets(d);

  assert_clean_exit(d, d_stop(d));
  free(so);
}

/* ---- refusals -------------------------------------------------------------------------------------------
 */

Test(admin, cli_refusals, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  d_start(d);
  char *out = NULL;
  char *err = NULL;

  int code = d_cli(d, &out, &err, "plugins", "load", ts_plugin("bad-abi"), NULL);
  cr_assert_eq(code, 1, "loading bad-abi exited %d: %s", code, err);
  cr_assert(strstr(err, "field abi"), "the refusal does not name the field abi: %s", err);
  cr_assert_str_empty(out);
  free(out);
  free(err);

  code = d_cli(d, &out, &err, "plugins", "load", ts_plugin("ok"), NULL);
  cr_assert_eq(code, 0, "loading ok exited %d: %s", code, err);
  free(out);
  free(err);
  code = d_cli(d, &out, &err, "plugins", "load", ts_plugin("ok"), NULL);
  cr_assert_eq(code, 1, "loading ok twice exited %d: %s", code, err);
  cr_assert(strstr(err, "already mounted"), "the refusal does not say \"already mounted\": %s", err);
  free(out);
  free(err);

  code = d_cli(d, &out, &err, "plugins", "unload", "no-such-plugin", NULL);
  cr_assert_eq(code, 1, "unloading an unknown plugin exited %d: %s", code, err);
  cr_assert(strstr(err, "no such plugin"), "unexpected message: %s", err);
  free(out);
  free(err);

  code = d_cli(d, &out, &err, "plugins", "unload", "core", NULL);
  cr_assert_eq(code, 1, "unloading the core exited %d: %s", code, err);
  cr_assert(strstr(err, "core cannot be unloaded"), "unexpected message: %s", err);
  free(out);
  free(err);

  code = d_cli(d, &out, &err, "plugins", "reload", "core", NULL);
  cr_assert_eq(code, 1, "reloading the core exited %d: %s", code, err);
  free(out);
  free(err);

  /* Nothing of that disturbed the daemon: the core and ok are still there. */
  cr_assert(d_describes(d, "core"));
  cr_assert(d_describes(d, "ok"));
  assert_clean_exit(d, d_stop(d));
}

/* ---- one daemon per runtime directory --------------------------------------------------------------------
 */

Test(admin, second_serve_is_refused_with_the_running_pid, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  d_start(d);
  char *log2 = d_join(d->dir, "second.log");
  pid_t second = d_spawn_serve(d, log2);
  int st = 0;
  cr_assert(ts_wait_exit(second, 10000, &st), "the second serve is still running");
  char *text = ts_read_file(log2, NULL);
  cr_assert_not_null(text);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "the second serve exited with status %#x: %s", st, text);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld", (long)d->pid);
  cr_assert(strstr(text, pid), "the refusal does not name the running %s: %s", pid, text);
  free(text);
  free(log2);
  /* The first one is untouched. */
  cr_assert(ts_wait_path(d->sock, 0));
  cr_assert(d_describes(d, "core"));
  assert_clean_exit(d, d_stop(d));
}

/* ---- file modes ---------------------------------------------------------------------------------------- */

Test(admin, socket_0600_in_a_0700_runtime_dir, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  /* An existing runtime dir open to others is made private. */
  cr_assert_eq(mkdir(d->run, 0700), 0);
  cr_assert_eq(chmod(d->run, 0755), 0);
  d_start(d);
  struct stat st;
  cr_assert_eq(lstat(d->run, &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0700, "runtime dir mode %o", (unsigned)(st.st_mode & 07777));
  cr_assert_eq(lstat(d->sock, &st), 0);
  cr_assert(S_ISSOCK(st.st_mode));
  cr_assert_eq(st.st_mode & 07777, 0600, "admin.sock mode %o", (unsigned)(st.st_mode & 07777));
  assert_clean_exit(d, d_stop(d));
}

/* ---- SIGHUP ----------------------------------------------------------------------------------------------
 */

Test(admin, sighup_applies_the_config_again, .timeout = 60, .fini = d_cleanup) {
  /* The default plugins stay enabled here: they are not built, the daemon warns and goes on. */
  test_daemon *d = d_new("[host]\nlog_level = debug\n");
  d_start(d);
  cr_assert_not(d_describes(d, "ok"));

  char *enabled = NULL;
  cr_assert_geq(asprintf(&enabled, "[host]\nlog_level = debug\n[plugin.ok]\nenabled = true\npath = %s\n",
                         ts_plugin("ok")),
                0);
  d_write_config(d, enabled);
  cr_assert_eq(kill(d->pid, SIGHUP), 0);
  cr_assert(d_describes_wait(d, "ok", true, 10000), "ok is not mounted after SIGHUP; log:\n%s", d_log(d));
  cr_assert(d_log_has(d, "SIGHUP"));

  char *disabled = NULL;
  cr_assert_geq(asprintf(&disabled, "[host]\nlog_level = debug\n[plugin.ok]\nenabled = false\npath = %s\n",
                         ts_plugin("ok")),
                0);
  d_write_config(d, disabled);
  cr_assert_eq(kill(d->pid, SIGHUP), 0);
  cr_assert(d_describes_wait(d, "ok", false, 10000), "ok is still mounted after SIGHUP; log:\n%s", d_log(d));

  /* It is gone, not a zombie. */
  char *out = NULL;
  char *err = NULL;
  int code = d_cli(d, &out, &err, "plugins", "list", NULL);
  cr_assert_eq(code, 0, "%s", err);
  cr_assert_null(strstr(out, "\nok "), "ok is still listed:\n%s", out);
  free(out);
  free(err);
  free(enabled);
  free(disabled);
  assert_clean_exit(d, d_stop(d));
}

/* ---- SIGTERM ---------------------------------------------------------------------------------------------
 */

Test(admin, sigterm_stops_cleanly, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  d_start(d);
  char *out = NULL;
  char *err = NULL;
  int code = d_cli(d, &out, &err, "plugins", "load", ts_plugin("ok"), NULL);
  cr_assert_eq(code, 0, "%s", err);
  free(out);
  free(err);

  pid_t pid = d->pid;
  cr_assert_eq(kill(pid, SIGTERM), 0);
  int st = 0;
  uint64_t t0 = ts_now_ms();
  bool exited = ts_wait_exit(pid, 5000, &st);
  if (!exited)
    st = ts_stop(pid, SIGKILL, 0);
  d->pid = 0;
  cr_assert(exited, "the daemon did not exit within 5 s of SIGTERM; log:\n%s", d_log(d));
  cr_assert_lt(ts_now_ms() - t0, 5000);
  assert_clean_exit(d, st);
  cr_assert(d_log_has(d, "SIGTERM"));
  cr_assert_neq(access(d->sock, F_OK), 0, "the admin socket was left behind");
  cr_assert_eq(errno, ENOENT);
}

/* ---- a zombie plugin over the admin channel --------------------------------------------------------------
 */

Test(admin, leaks_handle_becomes_a_zombie, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  d_start(d);
  char *out = NULL;
  char *err = NULL;
  int code = d_cli(d, &out, &err, "plugins", "load", ts_plugin("leaks-handle"), NULL);
  cr_assert_eq(code, 0, "%s", err);
  cr_assert(strstr(out, "mounted leaks-handle"), "%s", out);
  free(out);
  free(err);

  code = d_cli(d, &out, &err, "plugins", "unload", "leaks-handle", NULL);
  cr_assert_eq(code, 0, "the unload of leaks-handle exited %d: %s", code, err);
  cr_assert(strstr(out, "withdrew leaks-handle (the old module is kept mapped as a zombie"),
            "the CLI says the unload left a zombie: %s", out);
  free(out);
  free(err);
  cr_assert(d_log_wait(d, "zombie", 5000), "no \"zombie\" in the log:\n%s", d_log(d));

  code = d_cli(d, &out, &err, "plugins", "list", NULL);
  cr_assert_eq(code, 0, "plugins list after the zombie exited %d: %s", code, err);
  const char *line = strstr(out, "leaks-handle");
  cr_assert_not_null(line, "leaks-handle is not listed:\n%s", out);
  const char *eol = strchr(line, '\n');
  char *row = strndup(line, eol ? (size_t)(eol - line) : strlen(line));
  cr_assert(strstr(row, " zombie "), "leaks-handle is not listed as a zombie: %s", row);
  free(row);
  free(out);
  free(err);
  cr_assert_not(d_describes(d, "leaks-handle"));

  assert_clean_exit(d, d_stop(d));
}

/* ---- authority ------------------------------------------------------------------------------------------
 */

Test(admin, admin_caller_may_call_privileged_methods, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  d_start(d);
  json_t *desc = d_call_ok(d, "host.describe", NULL);
  json_t *load = plugin_method(described_plugin(desc, "core"), "plugin.load");
  cr_assert_not_null(load);
  cr_assert(json_is_true(json_object_get(load, "privileged")), "plugin.load is not privileged");
  json_decref(desc);

  json_t *result = d_call_ok(d, "plugin.load", json_pack("{s:s}", "path", ts_plugin("ok")));
  cr_assert_str_eq(json_string_value(json_object_get(result, "name")), "ok");
  json_decref(result);

  /* A plugin's privileged method too. */
  result = d_call_ok(d, "ok.admin", json_object());
  cr_assert(json_is_true(json_object_get(result, "ok")));
  json_decref(result);
  cr_assert_not(d_log_has(d, "refused privileged"), "a privileged call was refused:\n%s", d_log(d));
  assert_clean_exit(d, d_stop(d));
}

/* ---- hostile input on the admin socket -------------------------------------------------------------------
 */

typedef struct raw {
  int fd;
  char buf[65536];
  size_t len;
} raw;

static void raw_connect(raw *r, const char *path) {
  r->len = 0;
  r->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(r->fd, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  cr_assert_lt(strlen(path), sizeof sa.sun_path);
  strcpy(sa.sun_path, path);
  cr_assert_eq(connect(r->fd, (struct sockaddr *)&sa, sizeof sa), 0, "connect: %s", strerror(errno));
}

static void raw_send(raw *r, const char *data, size_t len) {
  while (len > 0) {
    ssize_t w = send(r->fd, data, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    cr_assert_gt(w, 0, "send: %s", strerror(errno));
    data += w;
    len -= (size_t)w;
  }
}

/* The next line the daemon sends, parsed (at most 10 s). */
static json_t *raw_recv(raw *r) {
  uint64_t deadline = ts_now_ms() + 10000;
  for (;;) {
    char *nl = memchr(r->buf, '\n', r->len);
    if (nl) {
      size_t n = (size_t)(nl - r->buf);
      json_error_t err;
      json_t *msg = json_loadb(r->buf, n, 0, &err);
      cr_assert_not_null(msg, "the daemon sent a line that is not JSON: %.*s", (int)n, r->buf);
      memmove(r->buf, nl + 1, r->len - n - 1);
      r->len -= n + 1;
      return msg;
    }
    cr_assert_lt(r->len, sizeof r->buf, "an answer longer than %zu bytes", sizeof r->buf);
    uint64_t now = ts_now_ms();
    cr_assert_lt(now, deadline, "no answer within 10 s");
    struct pollfd p = {.fd = r->fd, .events = POLLIN};
    int pr = poll(&p, 1, (int)(deadline - now));
    if (pr < 0 && errno == EINTR)
      continue;
    cr_assert_geq(pr, 0);
    if (pr == 0)
      continue;
    ssize_t n = recv(r->fd, r->buf + r->len, sizeof r->buf - r->len, 0);
    if (n < 0 && errno == EINTR)
      continue;
    cr_assert_gt(n, 0, "the daemon closed the connection");
    r->len += (size_t)n;
  }
}

/* Send `line` and expect a JSON-RPC error with `code` (and `id`, NULL = null). */
static void expect_error(raw *r, const char *line, size_t len, int code, json_t *id) {
  raw_send(r, line, len);
  json_t *msg = raw_recv(r);
  char *text = json_dumps(msg, JSON_COMPACT);
  json_t *error = json_object_get(msg, "error");
  cr_assert(json_is_object(error), "not an error: %s", text);
  cr_assert_eq(json_integer_value(json_object_get(error, "code")), code, "expected %d: %s", code, text);
  cr_assert_str_eq(json_string_value(json_object_get(msg, "jsonrpc")), "2.0", "%s", text);
  if (id)
    cr_assert(json_equal(json_object_get(msg, "id"), id), "wrong id: %s", text);
  else
    cr_assert(json_is_null(json_object_get(msg, "id")), "the id is not null: %s", text);
  free(text);
  json_decref(msg);
  json_decref(id);
}

#define LINE(s) s, sizeof(s) - 1

Test(admin, hostile_input_on_the_admin_socket, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  d_start(d);
  raw r;
  raw_connect(&r, d->sock);

  expect_error(&r, LINE("this is not json\n"), -32700, NULL);
  expect_error(&r, LINE("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\n"), -32700, NULL);
  expect_error(&r, LINE("\x01\x02\xff\xfe garbage \x7f\n"), -32700, NULL);
  expect_error(&r, LINE("[1,2,3]\n"), -32600, NULL);
  expect_error(&r, LINE("42\n"), -32600, NULL);
  expect_error(&r, LINE("{\"jsonrpc\":\"2.0\",\"id\":2}\n"), -32600, NULL);
  expect_error(&r, LINE("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":7}\n"), -32600, NULL);

  /* 20 MiB in one line: over the admin channel's 16 MiB cap. */
  size_t big = (size_t)20 * 1024 * 1024;
  char *line = malloc(big + 1);
  cr_assert_not_null(line);
  memset(line, 'a', big);
  line[big] = '\n';
  expect_error(&r, line, big + 1, -32600, NULL);
  free(line);

  /* A method name that would clear a terminal and forge a log line. As a JSON escape it reaches the
   * dispatcher: no such method (and it is not logged). As raw bytes outside a string it is invalid JSON
   * and the parse error quotes the first byte, ESC, which the logger must escape. */
  expect_error(&r, LINE("{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"\\u001b[2J\\r\\nFAKE INFO x\"}\n"),
               -32601, json_integer(4));
  expect_error(&r, LINE("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"\x1b[2J\rFAKE INFO y\"}\n"), -32700,
               NULL);
  expect_error(&r, LINE("{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\x1b[2J\rFAKE INFO z}\n"), -32700, NULL);

  /* The connection still works, and so does a new one. */
  raw_send(&r, LINE("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"plugin.list\"}\n"));
  json_t *msg = raw_recv(&r);
  cr_assert(json_is_object(json_object_get(msg, "result")), "plugin.list on the same connection failed");
  cr_assert_eq(json_integer_value(json_object_get(msg, "id")), 7);
  json_decref(msg);
  close(r.fd);

  char *out = NULL;
  char *err = NULL;
  int code = d_cli(d, &out, &err, "plugins", "list", NULL);
  cr_assert_eq(code, 0, "plugins list after the hostile input exited %d: %s", code, err);
  cr_assert(strstr(out, "core"));
  free(out);
  free(err);

  int st = d_stop(d);
  assert_clean_exit(d, st);
  size_t len = 0;
  char *log = ts_read_file(d->log, &len);
  cr_assert_not_null(log);
  cr_assert_null(memchr(log, '\x1b', len), "a raw ESC byte reached the log");
  cr_assert_null(memchr(log, '\r', len), "a raw CR reached the log");
  cr_assert_null(strstr(log, "\nFAKE INFO"), "a forged log line:\n%s", log);
  cr_assert(strstr(log, "near '\\u001b'"), "the parse error does not quote the ESC escaped:\n%s", log);
  cr_assert(strstr(log, "near '\\u0001'"), "the parse error does not quote the byte 0x01 escaped:\n%s", log);
  cr_assert(strstr(log, "line longer than"), "the over-long line was not logged:\n%s", log);
  free(log);
}

/* ---- remote stubs ---------------------------------------------------------------------------------------
 */

Test(admin, remote_stubs_print_typescript_for_the_mounted_descriptors, .timeout = 60, .fini = d_cleanup) {
  /* The remote plugin mounted by the config (its built-in services), the fixture loaded at run time. */
  test_daemon *d = d_new("[plugin.browser]\nenabled = false\n");
  d_start(d);
  char *fixture = d_join(d_env_path("AH_TEST_PLUGIN_DIR"), "remote-types.so");
  char *out = NULL;
  char *err = NULL;
  int code = d_cli(d, &out, &err, "plugins", "load", fixture, NULL);
  cr_assert_eq(code, 0, "plugins load: %s", err);
  free(out);
  free(err);
  code = d_cli(d, &out, &err, "remote", "stubs", NULL);
  cr_assert_eq(code, 0, "remote stubs exited %d: %s", code, err);
  const char *want[] = {
      "export interface RemoteServices {",
      "  \"sessions\": {",
      "    rename(session: SessionId, title: string, options?: CallOptions): Promise<RemoteResult<null>>;",
      "    tool_policy(session: SessionId, tool: string, policy: string, options?: CallOptions): "
      "Promise<RemoteResult<Json>>;",
      "  \"types\": {",
      "    echo_int(i: number, options?: CallOptions): Promise<RemoteResult<number>>;",
      "    maybe_string(give: boolean, options?: CallOptions): Promise<RemoteResult<string | null>>;",
      "    optionals(b?: boolean | null | undefined, i?: number | null | undefined, d?: number | null | "
      "undefined, s?: string | null | undefined, j?: Json | null | undefined, options?: CallOptions): "
      "Promise<RemoteResult<Json>>;",
      "    /** types.slow (plugin remote-types); cancellable */",
      "    /** sessions.tool_policy (plugin remote); looks up a session; privileged */",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    cr_assert(strstr(out, want[i]), "missing:\n%s\nin:\n%s", want[i], out);
  cr_assert(strstr(out, "\"sessions\"") < strstr(out, "\"types\""), "namespaces are sorted");
  free(out);
  free(err);
  /* Unloaded: its namespace is gone from the stubs. */
  code = d_cli(d, &out, &err, "plugins", "unload", "remote-types", NULL);
  cr_assert_eq(code, 0, "%s", err);
  free(out);
  free(err);
  code = d_cli(d, &out, &err, "remote", "stubs", NULL);
  cr_assert_eq(code, 0);
  cr_assert(!strstr(out, "\"types\""), "a withdrawn namespace is still declared:\n%s", out);
  free(out);
  free(err);
  /* Without the remote plugin there is nothing to describe: a clear error. */
  code = d_cli(d, &out, &err, "plugins", "unload", "remote", NULL);
  cr_assert_eq(code, 0, "%s", err);
  free(out);
  free(err);
  code = d_cli(d, &out, &err, "remote", "stubs", NULL);
  cr_assert_eq(code, 1);
  cr_assert(strstr(err, "remote stubs"), "%s", err);
  free(out);
  free(err);
  free(fixture);
  assert_clean_exit(d, d_stop(d));
}

/* ---- fenced ownership (reliability finding 3) ---------------------------------------------------------- */
/* PROTOCOLS.md "Core": sessions (a prompt's receipt is durable). */

/* `serve` (A) creates S and is stopped past the lease's TTL; an `sdk` process (B) prompts S and gets a
 * receipt; A resumes and is prompted for S. A must detect that it lost the lease and write nothing more
 * of S (every write is fenced), its prompt refused as agent-busy (not acknowledged); B's turn completes
 * and is stored whole; the event log of S stays gap-free and free of duplicates. */
Test(admin, a_process_that_lost_its_lease_writes_nothing_more, .timeout = 120, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS "[host]\nlease_ttl_ms = 2000\n");
  d_start(d);
  char *work = ts_mkdtemp();
  char sid[64];
  d_new_session(d, work, sid, sizeof sid);

  cr_assert_eq(kill(d->pid, SIGSTOP), 0);
  usleep(3000 * 1000); /* past A's 2 s lease ([host] lease_ttl_ms) */

  ts_stdio b;
  ts_stdio_prepare(&b);
  ts_rmtree(b.dir);
  free(b.dir);
  b.dir = strdup(d->state);
  free(b.log);
  b.log = d_join(d->dir, "b.log");
  free(ts_write_file(b.dir, "empty.ini", "")); /* B's --config; its --runtime-dir is state/run, not A's */
  ts_stdio_spawn(&b, "sdk", NULL);
  json_t *msg =
      json_pack("{s:s, s:i, s:s, s:{s:s, s:{s:s}, s:i}}", "jsonrpc", "2.0", "id", 1, "method", "initialize",
                "params", "cwd", work, "clientInfo", "name", "b", "protocolVersion", 1);
  ts_stdio_send_json(&b, msg);
  json_decref(msg);
  json_decref(ts_stdio_answer(&b, 1, "initialize"));
  msg = json_pack("{s:s, s:i, s:s, s:{s:s, s:s}}", "jsonrpc", "2.0", "id", 2, "method", "session/prompt",
                  "params", "sessionId", sid, "text", "/sleep 3000");
  ts_stdio_send_json(&b, msg);
  json_decref(msg);
  json_t *receipt = ts_stdio_answer(&b, 2, "session/prompt");
  const char *b_mid = json_string_value(json_object_get(json_object_get(receipt, "result"), "messageId"));
  cr_assert(b_mid, "B's prompt was not acknowledged");
  char b_message[64];
  snprintf(b_message, sizeof b_message, "%s", b_mid);
  json_decref(receipt);

  cr_assert_eq(kill(d->pid, SIGCONT), 0);
  json_t *result = NULL, *error = NULL;
  int rc =
      ah__admin_call(d->run, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", "from A"),
                     10000, &result, &error);
  char *etext = error ? json_dumps(error, JSON_COMPACT) : NULL;
  cr_expect_neq(rc, 0, "A acknowledged a prompt for a session it no longer owns");
  cr_expect(etext && strstr(etext, "agent-busy"), "A's refusal: %s", etext ? etext : "(none)");
  free(etext);
  json_decref(result);
  json_decref(error);

  /* B's turn ends normally. */
  bool ended = false;
  uint64_t end = ts_now_ms() + 15000;
  while (!ended && ts_now_ms() < end) {
    json_t *m = ts_stdio_next_msg(&b, 1000);
    if (!m)
      continue;
    const char *k = event_kind_of(m);
    if (k && strcmp(k, "turn/ended") == 0) {
      json_t *ev = json_object_get(json_object_get(m, "params"), "event");
      ended = json_is_string(json_object_get(ev, "messageId")) &&
              strcmp(json_string_value(json_object_get(ev, "messageId")), b_message) == 0;
      cr_expect_str_eq(json_string_value(json_object_get(json_object_get(ev, "data"), "reason")), "end");
    }
    json_decref(m);
  }
  cr_expect(ended, "B's turn/ended was not seen");
  cr_expect(d_log_wait(d, "lost its lease", 5000), "A did not notice it lost the lease:\n%s", d_log(d));

  /* The stored log of S: contiguous seqs, no duplicate, B's turn whole, nothing from A after the stop. */
  json_t *hist = d_call_ok(d, "session.history", json_pack("{s:s, s:i}", "sessionId", sid, "limit", 1000));
  json_t *events = json_object_get(hist, "events");
  size_t i = 0;
  json_t *ev = NULL;
  bool committed = false, b_ended = false;
  json_array_foreach(events, i, ev) {
    cr_expect_eq(json_integer_value(json_object_get(ev, "seq")), (json_int_t)i + 1,
                 "seq gap or duplicate at %zu", i);
    const char *k = json_string_value(json_object_get(ev, "kind"));
    committed = committed || (k && strcmp(k, "message/committed") == 0);
    const char *mid = json_string_value(json_object_get(ev, "messageId"));
    b_ended = b_ended || (k && strcmp(k, "turn/ended") == 0 && mid && strcmp(mid, b_message) == 0);
    if (k && strcmp(k, "inbox/received") == 0) { /* the stored prompts: B's only */
      char *text = json_dumps(json_object_get(ev, "data"), JSON_COMPACT);
      cr_expect(text && !strstr(text, "from A"), "A's prompt was stored: %s", text ? text : "?");
      free(text);
    }
  }
  cr_expect(committed && b_ended, "B's turn is not stored whole");
  json_decref(hist);

  ts_stdio_close_stdin(&b);
  int st = 0;
  cr_expect(ts_wait_exit(b.pid, 15000, &st) && WIFEXITED(st) && WEXITSTATUS(st) == 0, "B: status %d", st);
  b.pid = -1;
  free(b.dir);
  b.dir = NULL;
  ts_stdio_free(&b);
  assert_clean_exit(d, d_stop(d));
  ts_rmtree(work);
  free(work);
}

/* ---- a damaged store (reliability finding 8) ----------------------------------------------------------- */
/* PROTOCOLS.md "Core": sessions (a prompt's receipt is durable). */

static void damage_file(const char *path) {
  int fd = open(path, O_WRONLY);
  cr_assert_geq(fd, 0, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  char junk[4096];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (char)(0xA5 ^ (i * 31));
  for (off_t off = 32; off < st.st_size; off += (off_t)sizeof junk)
    cr_assert_gt(pwrite(fd, junk, sizeof junk, off), 0);
  close(fd);
}

/* A failed read is an error, never `null` or an empty export; a store found damaged refuses prompts (they
 * are not acknowledged) and says so in host.describe. */
Test(admin, a_damaged_store_fails_reads_and_refuses_prompts, .timeout = 60, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  d_start(d);
  char *work = ts_mkdtemp();
  char sid[64];
  d_new_session(d, work, sid, sizeof sid);
  for (int i = 0; i < 3; i++)
    json_decref(d_call_ok(d, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", "hello")));
  usleep(500 * 1000);
  json_t *desc = d_call_ok(d, "host.describe", NULL);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(desc, "store"), "health")), "ok");
  json_decref(desc);
  char *out = NULL, *err = NULL;
  int code = d_cli(d, &out, &err, "status", NULL);
  cr_expect_eq(code, 0, "status of a healthy daemon exited %d: %s", code, err);
  cr_expect(strstr(out, "running in serve mode") && strstr(out, "store: ok"), "%s", out);
  free(out);
  free(err);

  char *wal = d_join(d->state, "agenthost.db-wal");
  char *db = d_join(d->state, "agenthost.db");
  damage_file(wal);
  damage_file(db);

  json_t *result = NULL, *error = NULL;
  int rc =
      ah__admin_call(d->run, "session.history", json_pack("{s:s}", "sessionId", sid), 10000, &result, &error);
  char *text = json_dumps(result ? result : error, JSON_COMPACT | JSON_ENCODE_ANY);
  cr_expect_neq(rc, 0, "history of a damaged store answered %s", text);
  free(text);
  json_decref(result);
  json_decref(error);
  rc = ah__admin_call(d->run, "session.export", json_pack("{s:s}", "sessionId", sid), 10000, &result, &error);
  text = json_dumps(result ? result : error, JSON_COMPACT | JSON_ENCODE_ANY);
  cr_expect_neq(rc, 0, "export of a damaged store answered %s", text);
  free(text);
  json_decref(result);
  json_decref(error);

  desc = d_call_ok(d, "host.describe", NULL);
  json_t *store = json_object_get(desc, "store");
  cr_expect_str_eq(json_string_value(json_object_get(store, "health")), "damaged");
  cr_expect(json_is_string(json_object_get(store, "detail")));
  json_decref(desc);
  code = d_cli(d, &out, &err, "status", NULL);
  cr_expect_eq(code, 3, "status of a damaged store exited %d", code);
  cr_expect(strstr(out, "store: damaged ("), "%s", out);
  free(out);
  free(err);
  rc = ah__admin_call(d->run, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", "lost?"),
                      10000, &result, &error);
  text = json_dumps(result ? result : error, JSON_COMPACT | JSON_ENCODE_ANY);
  cr_expect_neq(rc, 0, "a damaged store acknowledged a prompt: %s", text);
  cr_expect(error && strstr(text, "damaged"), "the refusal does not say why: %s", text);
  free(text);
  json_decref(result);
  json_decref(error);
  kill(d->pid, SIGKILL);
  ts_wait_exit(d->pid, 5000, NULL);
  d->pid = 0;
  free(wal);
  free(db);
  ts_rmtree(work);
  free(work);
}

/* ---- a full disk (reliability finding 9) --------------------------------------------------------------- */
/* PROTOCOLS.md "Core": sessions (a prompt's receipt is durable). */

static bool stored_turn_end(test_daemon *d, const char *sid, const char *mid, char *reason, size_t cap) {
  json_t *hist = d_call_ok(d, "session.history", json_pack("{s:s, s:i}", "sessionId", sid, "limit", 1000));
  bool found = false;
  size_t i = 0;
  json_t *ev = NULL;
  json_array_foreach(json_object_get(hist, "events"), i, ev) {
    const char *k = json_string_value(json_object_get(ev, "kind"));
    const char *m = json_string_value(json_object_get(ev, "messageId"));
    if (k && m && strcmp(k, "turn/ended") == 0 && strcmp(m, mid) == 0) {
      found = true;
      snprintf(reason, cap, "%s", json_string_value(json_object_get(json_object_get(ev, "data"), "reason")));
    }
  }
  json_decref(hist);
  return found;
}

static const char *store_health(test_daemon *d) {
  static char h[32];
  json_t *desc = d_call_ok(d, "host.describe", NULL);
  snprintf(h, sizeof h, "%s", json_string_value(json_object_get(json_object_get(desc, "store"), "health")));
  json_decref(desc);
  return h;
}

/* An acknowledged prompt whose turn cannot be written (the disk filled up) is not stranded: the store says
 * it is full, and once space returns the turn's outcome is recorded and the session runs prompts again.
 * Needs root (a small tmpfs as the state directory). */
Test(admin, a_full_disk_does_not_strand_an_acknowledged_prompt, .timeout = 90, .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS);
  cr_assert_eq(mkdir(d->state, 0700), 0);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=3m,mode=0700 agenthost-test %s 2>/dev/null", d->state);
  if (geteuid() != 0 || system(cmd) != 0)
    cr_skip_test("needs root to mount a small tmpfs as the state directory");
  d_start(d);
  char *work = ts_mkdtemp();
  char sid[64];
  d_new_session(d, work, sid, sizeof sid);
  /* A reader holding its snapshot (a backup, `agenthost sessions show`) keeps the WAL from being copied
   * into the database and started over, so the turn's writes need new space instead of reusing the WAL's. */
  char *dbpath = d_join(d->state, "agenthost.db");
  sqlite3 *reader = NULL;
  cr_assert_eq(sqlite3_open_v2(dbpath, &reader, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_exec(reader, "BEGIN; SELECT count(*) FROM sessions", NULL, NULL, NULL), SQLITE_OK,
               "%s", sqlite3_errmsg(reader));
  free(dbpath);
  /* 400 KB of text: the echo of it cannot fit once the disk is full. */
  size_t n = 400 * 1024;
  char *text = malloc(n + 32);
  strcpy(text, "/sleep 1500\n");
  memset(text + strlen(text), 'z', n);
  text[12 + n] = '\0';
  json_t *r = d_call_ok(d, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", text));
  char mid[64];
  snprintf(mid, sizeof mid, "%s", json_string_value(json_object_get(r, "messageId")));
  json_decref(r);
  free(text);
  usleep(300 * 1000);
  char *filler = d_join(d->state, "filler");
  snprintf(cmd, sizeof cmd, "dd if=/dev/zero of=%s bs=64k 2>/dev/null", filler);
  cr_expect_neq(system(cmd), 0, "dd should end with a full disk");
  uint64_t end = ts_now_ms() + 10000;
  while (strcmp(store_health(d), "full") != 0 && ts_now_ms() < end)
    usleep(100 * 1000);
  cr_assert_str_eq(store_health(d), "full", "the turn's writes did not fail: the test did not fill the disk");
  char reason[32] = "";
  cr_expect_not(stored_turn_end(d, sid, mid, reason, sizeof reason), "a turn end was stored on a full disk?");
  /* A prompt now is refused, not acknowledged. */
  json_t *result = NULL, *error = NULL;
  int rc = ah__admin_call(d->run, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", "more"),
                          10000, &result, &error);
  cr_expect_neq(rc, 0, "a prompt was acknowledged on a full disk");
  json_decref(result);
  json_decref(error);

  cr_assert_eq(unlink(filler), 0);
  sqlite3_exec(reader, "COMMIT", NULL, NULL, NULL);
  sqlite3_close(reader);
  end = ts_now_ms() + 15000;
  bool recorded = false;
  while (!(recorded = stored_turn_end(d, sid, mid, reason, sizeof reason)) && ts_now_ms() < end)
    usleep(200 * 1000);
  cr_expect(recorded, "the interrupted turn was never recorded once space returned:\n%s", d_log(d));
  cr_expect_str_eq(reason, "error");
  cr_expect_str_eq(store_health(d), "ok");
  /* The session takes and runs prompts again. */
  r = d_call_ok(d, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", "after"));
  snprintf(mid, sizeof mid, "%s", json_string_value(json_object_get(r, "messageId")));
  json_decref(r);
  end = ts_now_ms() + 10000;
  while (!(recorded = stored_turn_end(d, sid, mid, reason, sizeof reason)) && ts_now_ms() < end)
    usleep(100 * 1000);
  cr_expect(recorded && strcmp(reason, "end") == 0, "the next prompt did not run (%s)", reason);
  assert_clean_exit(d, d_stop(d));
  snprintf(cmd, sizeof cmd, "umount %s", d->state);
  cr_expect_eq(system(cmd), 0);
  free(filler);
  ts_rmtree(work);
  free(work);
}

static json_int_t stat_of(test_daemon *d, const char *key) {
  json_t *s = d_call_ok(d, "host.stats", NULL);
  json_int_t v = json_integer_value(json_object_get(json_object_get(s, "sessions"), key));
  json_decref(s);
  return v;
}

/* host.stats and `agenthost status` say how many sessions are in memory; a SIGHUP that shortens
 * [host] idle_unload_s applies to the running daemon: its idle sessions leave memory (their leases
 * released), and the next prompt loads one again. */
Test(admin, idle_sessions_leave_memory_after_a_reload_shortens_idle_unload_s, .timeout = 60,
     .fini = d_cleanup) {
  test_daemon *d = d_new(NO_DEFAULT_PLUGINS "[host]\nidle_unload_s = 3600\n");
  d_start(d);
  char *work = ts_mkdtemp();
  char sid[3][64];
  for (int i = 0; i < 3; i++)
    d_new_session(d, work, sid[i], sizeof sid[i]);
  json_t *s = d_call_ok(d, "host.stats", NULL);
  json_t *ss = json_object_get(s, "sessions");
  cr_expect_eq(json_integer_value(json_object_get(ss, "live")), 3);
  cr_expect_eq(json_integer_value(json_object_get(ss, "unloads")), 0);
  cr_expect_eq(json_number_value(json_object_get(ss, "idleUnloadS")), 3600.0);
  cr_expect_gt(json_integer_value(json_object_get(json_object_get(s, "memory"), "rssKiB")), 1000);
  json_decref(s);
  char *out = NULL, *err = NULL;
  cr_assert_eq(d_cli(d, &out, &err, "status", NULL), 0, "%s", err);
  cr_expect(
      strstr(out,
             "sessions: 3 in memory (0 loaded, 0 unloaded since start; idle ones leave after 3600 s idle)"),
      "%s", out);
  cr_expect(strstr(out, "memory: ") && strstr(out, " KiB resident"), "%s", out);
  free(out);
  free(err);
  d_write_config(d, NO_DEFAULT_PLUGINS "[host]\nidle_unload_s = 0.2\n");
  cr_assert_eq(kill(d->pid, SIGHUP), 0);
  uint64_t deadline = ts_now_ms() + 15000;
  while (stat_of(d, "unloads") < 3) {
    cr_assert_lt(ts_now_ms(), deadline, "the idle sessions did not leave after the reload");
    usleep(50 * 1000);
  }
  cr_expect_eq(stat_of(d, "live"), 0);
  cr_assert_eq(d_cli(d, &out, &err, "status", "--json", NULL), 0, "%s", err);
  json_t *j = json_loads(out, 0, NULL);
  cr_assert_not_null(j, "%s", out);
  cr_expect_eq(json_number_value(
                   json_object_get(json_object_get(json_object_get(j, "stats"), "sessions"), "idleUnloadS")),
               0.2);
  json_decref(j);
  free(out);
  free(err);
  /* The next prompt loads it again, as a cold session. */
  json_decref(d_call_ok(d, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid[1], "text", "back")));
  cr_expect_eq(stat_of(d, "loads"), 1);
  assert_clean_exit(d, d_stop(d));
  ts_rmtree(work);
  free(work);
}
