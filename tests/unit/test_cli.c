/* Integration tests of the command line: the real agenthost binary ($AH_TEST_AGENTHOST), its exit codes,
 * stdout and stderr. Every test runs in a private directory and stops what it starts. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"

static char *tmp_dir;

static void cleanup(void) {
  ts_kill_all();
  if (tmp_dir) {
    ts_rmtree(tmp_dir);
    free(tmp_dir);
    tmp_dir = NULL;
  }
}

static const char *agenthost(void) {
  const char *v = getenv("AH_TEST_AGENTHOST");
  cr_assert(v && *v, "AH_TEST_AGENTHOST is not set (run the tests through meson test)");
  return v;
}

/* The test's private directory, made on first use and removed by cleanup(). */
static const char *test_dir(void) {
  if (!tmp_dir)
    tmp_dir = ts_mkdtemp();
  cr_assert_not_null(tmp_dir);
  return tmp_dir;
}

static char *path_in(const char *name) {
  test_dir();
  char *s = NULL;
  cr_assert_geq(asprintf(&s, "%s/%s", tmp_dir, name), 0);
  return s;
}

/* Run agenthost with ARGS... (NULL-terminated); returns the exit code, *out / *err its output. */
static int run(char **out, char **err, ...) {
  char *argv[24] = {(char *)agenthost()};
  size_t n = 1;
  va_list ap;
  va_start(ap, err);
  for (char *a = va_arg(ap, char *); a; a = va_arg(ap, char *)) {
    cr_assert_lt(n, sizeof argv / sizeof argv[0] - 1);
    argv[n++] = a;
  }
  va_end(ap);
  argv[n] = NULL;
  int code = ts_run(argv, 30000, out, err);
  cr_assert_not_null(*out);
  cr_assert_not_null(*err);
  return code;
}

/* A config that enables nothing (the default plugins browser and remote switched off). */
static char *quiet_config(void) {
  char *f = ts_write_file(test_dir(), "agenthost.ini",
                          "[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n");
  cr_assert_not_null(f);
  return f;
}

Test(cli, version, .timeout = 60, .fini = cleanup) {
  char *out = NULL;
  char *err = NULL;
  int code = run(&out, &err, "version", NULL);
  cr_assert_eq(code, 0, "%s", err);
  char want[64];
  snprintf(want, sizeof want, "agenthost %s ", AH_VERSION);
  cr_assert(strncmp(out, want, strlen(want)) == 0, "unexpected version line: %s", out);
  cr_assert(strstr(out, "plugin ABI"), "%s", out);
  cr_assert_str_empty(err);
  free(out);
  free(err);
}

Test(cli, help, .timeout = 60, .fini = cleanup) {
  const char *forms[] = {"--help", "-h", "help"};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    char *out = NULL;
    char *err = NULL;
    int code = run(&out, &err, forms[i], NULL);
    cr_assert_eq(code, 0, "%s exited %d", forms[i], code);
    cr_assert(strncmp(out, "usage: agenthost", 16) == 0, "%s printed: %s", forms[i], out);
    cr_assert(strstr(out, "plugins load PATH"), "%s", out);
    cr_assert_str_empty(err);
    free(out);
    free(err);
  }
}

Test(cli, no_command_is_a_usage_error, .timeout = 60, .fini = cleanup) {
  char *out = NULL;
  char *err = NULL;
  int code = run(&out, &err, NULL);
  cr_assert_eq(code, 2);
  cr_assert(strstr(err, "usage: agenthost"), "%s", err);
  cr_assert_str_empty(out);
  free(out);
  free(err);
}

Test(cli, unknown_command_is_a_usage_error, .timeout = 60, .fini = cleanup) {
  const char *cmds[][3] = {{"frobnicate", NULL, NULL},
                           {"version", "extra", NULL},
                           {"plugins", "frob", NULL},
                           {"--no-such-flag", "serve", NULL}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    char *out = NULL;
    char *err = NULL;
    int code = run(&out, &err, cmds[i][0], cmds[i][1], cmds[i][2]);
    cr_assert_eq(code, 2, "%s %s exited %d: %s", cmds[i][0], cmds[i][1] ? cmds[i][1] : "", code, err);
    cr_assert(strstr(err, "usage: agenthost"), "%s", err);
    cr_assert_str_empty(out);
    free(out);
    free(err);
  }
  char *out = NULL;
  char *err = NULL;
  cr_assert_eq(run(&out, &err, "frobnicate", NULL), 2);
  cr_assert(strstr(err, "frobnicate"), "the message does not name the command: %s", err);
  free(out);
  free(err);
}

Test(cli, plugins_list_without_a_daemon, .timeout = 60, .fini = cleanup) {
  char *config = quiet_config();
  char *state = path_in("state");
  char *runtime = path_in("run");
  char *out = NULL;
  char *err = NULL;
  int code = run(&out, &err, "--config", config, "--state-dir", state, "--runtime-dir", runtime, "plugins",
                 "list", NULL);
  cr_assert_eq(code, 1, "exited %d: %s", code, err);
  cr_assert(strstr(err, "no running daemon answers"), "unclear message: %s", err);
  cr_assert_str_empty(out);
  free(out);
  free(err);
  free(config);
  free(state);
  free(runtime);
}

Test(cli, bad_config_value_names_file_line_and_key, .timeout = 60, .fini = cleanup) {
  char *config = ts_write_file(test_dir(), "bad.ini", "; a comment\n[host]\nlog_level = loud\n");
  cr_assert_not_null(config);
  char *state = path_in("state");
  char *runtime = path_in("run");
  char *out = NULL;
  char *err = NULL;
  int code =
      run(&out, &err, "--config", config, "--state-dir", state, "--runtime-dir", runtime, "serve", NULL);
  cr_assert_eq(code, 2, "exited %d: %s", code, err);
  char where[4200];
  snprintf(where, sizeof where, "%s:3", config);
  cr_assert(strstr(err, where), "the message does not name %s: %s", where, err);
  cr_assert(strstr(err, "log_level"), "the message does not name the key: %s", err);
  cr_assert_str_empty(out);
  /* Nothing was started: no runtime directory, no socket. */
  cr_assert_neq(access(runtime, F_OK), 0);
  free(out);
  free(err);
  free(config);
  free(state);
  free(runtime);
}

Test(cli, sdk_without_the_sdk_plugin, .timeout = 60, .fini = cleanup) {
  char *config = quiet_config();
  char *state = path_in("state");
  char *runtime = path_in("run");
  char *plugins = path_in("no-plugins");
  char *out = NULL;
  char *err = NULL;
  int code = run(&out, &err, "--config", config, "--state-dir", state, "--runtime-dir", runtime,
                 "--plugin-dir", plugins, "sdk", NULL);
  cr_assert_neq(code, 0, "sdk without its plugin exited 0: %s", err);
  cr_assert_neq(code, -1, "sdk without its plugin crashed or hung: %s", err);
  /* stdout carries the protocol only: not one byte of diagnostics. */
  cr_assert_str_empty(out, "sdk wrote on stdout: %s", out);
  cr_assert(strstr(err, "sdk"), "the message does not name sdk: %s", err);
  cr_assert(strstr(err, "cannot serve sdk") || strstr(err, "does not exist"), "unclear message: %s", err);
  free(out);
  free(err);
  free(config);
  free(state);
  free(runtime);
  free(plugins);
}

Test(cli, serve_with_a_missing_plugin_dir_runs_without_plugins, .timeout = 60, .fini = cleanup) {
  char *config = quiet_config();
  char *state = path_in("state");
  char *runtime = path_in("run");
  char *log = path_in("daemon.log");
  char *sock = path_in("run/admin.sock");
  char *argv[] = {
      (char *)agenthost(), "--config",     config,  "--state-dir", state, "--runtime-dir", runtime,
      "--plugin-dir",      "/nonexistent", "serve", NULL};
  pid_t pid = ts_spawn(argv, NULL, log);
  cr_assert_gt(pid, 0);
  cr_assert(ts_wait_path(sock, 10000), "no admin socket after 10 s: %s", ts_read_file(log, NULL));

  /* It answers, with the core alone. */
  char *out = NULL;
  char *err = NULL;
  int code = -1;
  uint64_t deadline = ts_now_ms() + 10000;
  do {
    free(out);
    free(err);
    code = run(&out, &err, "--config", config, "--state-dir", state, "--runtime-dir", runtime, "plugins",
               "list", NULL);
  } while (code != 0 && ts_now_ms() < deadline && usleep(20 * 1000) == 0);
  cr_assert_eq(code, 0, "plugins list exited %d: %s", code, err);
  cr_assert(strncmp(out, "core ", 5) == 0, "%s", out);
  cr_assert_null(strchr(out, '\n') ? strchr(strchr(out, '\n') + 1, '\n') : NULL, "more than the core: %s",
                 out);
  free(out);
  free(err);

  int st = ts_stop(pid, SIGTERM, 10000);
  char *text = ts_read_file(log, NULL);
  cr_assert_not_null(text);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x; log:\n%s", st, text);
  cr_assert(strstr(text, "stopped"), "%s", text);
  cr_assert_null(strstr(text, "did not close cleanly"), "%s", text);
  free(text);
  free(config);
  free(state);
  free(runtime);
  free(log);
  free(sock);
}
