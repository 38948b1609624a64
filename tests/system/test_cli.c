/* Integration tests of the command line: the real agenthost binary ($AH_TEST_AGENTHOST), its exit codes,
 * stdout and stderr. Every test runs in a private directory and stops what it starts. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "admin.h"
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

/* A config enabling the fixture plugins `commands` (today's ABI) and `abi-1-2` (built against the 1.2
 * headers, before commands existed). */
static char *commands_config_of(const char *module) {
  const char *pd = getenv("AH_TEST_PLUGIN_DIR");
  cr_assert(pd && *pd);
  char *text = NULL;
  cr_assert_geq(asprintf(&text,
                         "[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n"
                         "[plugin.abi-1-2]\nenabled = true\npath = %s/abi-1-2.so\n"
                         "[plugin.commands]\nenabled = true\npath = %s/%s.so\ngreeting = hi there\n",
                         pd, pd, module),
                0);
  char *f = ts_write_file(test_dir(), "agenthost.ini", text);
  free(text);
  cr_assert_not_null(f);
  return f;
}

static char *commands_config(void) {
  return commands_config_of("commands");
}

/* ABI 1.3 ah_plugin_desc.commands: `agenthost NAME` runs an enabled plugin's command with its config, the
 * host's directories and its arguments; its exit status is the process's; without a daemon its calls get
 * AH_ECLOSED. */
/* The module built against today's headers, and the same source built against the frozen 1.3 and 1.4 ones. */
Test(cli, a_plugin_command_runs_with_its_config_and_arguments, .timeout = 60, .fini = cleanup) {
  const char *modules[] = {"commands", "abi-1-3", "abi-1-4"};
  for (size_t i = 0; i < 3; i++) {
    char *config = commands_config_of(modules[i]);
    char *state = path_in("state");
    char *runtime = path_in("run");
    char *out = NULL;
    char *err = NULL;
    int code = run(&out, &err, "--config", config, "--state-dir", state, "--runtime-dir", runtime,
                   "fixture-cmd", "one", "--two", NULL);
    cr_assert_eq(code, 7, "exit %d, stderr: %s", code, err);
    char *want = NULL;
    cr_assert_geq(
        asprintf(&want, "argv: fixture-cmd one --two\ngreeting: hi there\nstate: %s\ndaemon: none\n", state),
        0);
    cr_expect_str_eq(out, want);
    free(want);
    free(out);
    free(err);
    free(state);
    free(runtime);
    free(config);
  }
}

/* The host's own commands win over a plugin's of the same name; a definition too short to hold `run` is
 * skipped; a module built for ABI 1.2 (no `commands`, and a non-NULL word where 1.3 has it) offers none —
 * each is the usage error of an unknown command, not a crash. */
Test(cli, plugin_commands_never_shadow_the_host_nor_read_past_a_descriptor, .timeout = 60, .fini = cleanup) {
  char *config = commands_config();
  char *out = NULL;
  char *err = NULL;
  cr_assert_eq(run(&out, &err, "--config", config, "version", NULL), 0, "%s", err);
  cr_expect(strncmp(out, "agenthost ", 10) == 0 && !strstr(out, "plugin's version"), "%s", out);
  free(out);
  free(err);
  const char *unknown[] = {"short-cmd", "abi12", "abi-1-2"};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    int code = run(&out, &err, "--config", config, unknown[i], NULL);
    cr_expect_eq(code, 2, "%s: exit %d (%s)", unknown[i], code, err);
    cr_expect(strstr(err, "unknown command"), "%s: %s", unknown[i], err);
    cr_expect_str_empty(out, "%s", unknown[i]);
    free(out);
    free(err);
  }
  free(config);
}

/* The browser's `token rotate` before the first `serve`: the state directory does not exist yet and is
 * created (0700), the token file with it (0600, one 43-character token). */
Test(cli, token_rotate_before_the_first_serve_creates_the_state_directory, .timeout = 60, .fini = cleanup) {
  char *config = ts_write_file(test_dir(), "empty.ini", "");
  char *state = path_in("not/yet/state");
  char *runtime = path_in("run");
  char *out = NULL;
  char *err = NULL;
  int code = run(&out, &err, "--config", config, "--state-dir", state, "--runtime-dir", runtime, "token",
                 "rotate", NULL);
  cr_assert_eq(code, 0, "exit %d: %s", code, err);
  cr_expect(strstr(out, "no daemon is running"), "%s", out);
  struct stat sb;
  cr_expect(stat(state, &sb) == 0 && S_ISDIR(sb.st_mode) && (sb.st_mode & 0777) == 0700);
  char *tp = NULL;
  cr_assert(asprintf(&tp, "%s/token", state) > 0);
  cr_expect(stat(tp, &sb) == 0 && (sb.st_mode & 0777) == 0600);
  char *tok = ts_read_file(tp, NULL);
  cr_expect(tok && strcspn(tok, "\n") == 43, "%s", tok ? tok : "(none)");
  free(tok);
  free(tp);
  free(out);
  free(err);
  free(state);
  free(runtime);
  free(config);
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

Test(cli, global_options_may_follow_the_command, .timeout = 60, .fini = cleanup) {
  /* Every option after the command, in both spellings: they are applied (the store named in the refusal is
   * in our state dir) and not taken for the command's own arguments. */
  char *config = quiet_config();
  char *state = path_in("state");
  char *runtime = path_in("run");
  char *state_eq = NULL;
  cr_assert_geq(asprintf(&state_eq, "--state-dir=%s", state), 0);
  char *out = NULL;
  char *err = NULL;
  int code =
      run(&out, &err, "sessions", "list", "--config", config, state_eq, "--runtime-dir", runtime, NULL);
  cr_assert_eq(code, 1, "exited %d: %s", code, err);
  cr_assert(strstr(err, state) && strstr(err, "agenthost.db"),
            "the state dir after the command was not used: %s", err);
  free(out);
  free(err);
  /* The command's own options stay its own; a missing value is a usage error; "--" ends the options. */
  code = run(&out, &err, "version", "--log-level", NULL);
  cr_assert_eq(code, 2, "%s", err);
  cr_assert(strstr(err, "--log-level needs a value"), "%s", err);
  free(out);
  free(err);
  code = run(&out, &err, "version", "--", "--log-level", "debug", NULL);
  cr_assert_eq(code, 2, "arguments after -- belong to the command, which takes none: %s", err);
  free(out);
  free(err);
  free(state_eq);
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

/* ---- sessions list | show | export: the store read directly, read-only ------------------------------ */

typedef struct sess_env {
  char *config;
  char *state;
  char *runtime;
  char *log;
  char *sock;
  char *db;
  pid_t pid;
} sess_env;

static sess_env sess_env_new(void) {
  sess_env e = {.config = quiet_config(),
                .state = path_in("state"),
                .runtime = path_in("run"),
                .log = path_in("daemon.log"),
                .sock = path_in("run/admin.sock"),
                .db = path_in("state/agenthost.db")};
  return e;
}

static void sess_env_free(sess_env *e) {
  free(e->config);
  free(e->state);
  free(e->runtime);
  free(e->log);
  free(e->sock);
  free(e->db);
}

static char *daemon_log(const sess_env *e) {
  char *text = ts_read_file(e->log, NULL);
  return text ? text : strdup("");
}

/* `agenthost --config C --state-dir S --runtime-dir R ARGS...` (NULL-terminated). */
static int sess_cli(const sess_env *e, char **out, char **err, ...) {
  char *argv[16] = {(char *)agenthost(), "--config", e->config, "--state-dir", e->state,
                    "--runtime-dir",     e->runtime};
  size_t n = 7;
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

/* Start `serve` and wait until it answers on the admin socket. */
static void sess_start(sess_env *e) {
  char *argv[] = {(char *)agenthost(), "--config", e->config, "--state-dir", e->state,
                  "--runtime-dir",     e->runtime, "serve",   NULL};
  e->pid = ts_spawn(argv, NULL, e->log);
  cr_assert_gt(e->pid, 0);
  cr_assert(ts_wait_path(e->sock, 10000), "no admin socket after 10 s: %s", daemon_log(e));
  uint64_t deadline = ts_now_ms() + 10000;
  for (;;) {
    json_t *result = NULL;
    json_t *error = NULL;
    int rc = ah__admin_call(e->runtime, "session.list", json_object(), 2000, &result, &error);
    json_decref(result);
    json_decref(error);
    if (rc == 0)
      break;
    cr_assert_lt(ts_now_ms(), deadline, "the daemon does not answer: %s; log:\n%s", ah_strerror(rc),
                 daemon_log(e));
    usleep(20 * 1000);
  }
}

/* SIGTERM; the daemon must exit 0 and log "stopped". */
static void sess_stop(sess_env *e) {
  int st = ts_stop(e->pid, SIGTERM, 10000);
  e->pid = 0;
  char *text = daemon_log(e);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the daemon did not exit 0 (status %#x); log:\n%s", st,
            text);
  cr_assert(strstr(text, "stopped"), "%s", text);
  free(text);
}

/* Call `method` (params stolen) on the admin socket and assert success; returns the result. */
static json_t *sess_call(const sess_env *e, const char *method, json_t *params) {
  json_t *result = NULL;
  json_t *error = NULL;
  int rc = ah__admin_call(e->runtime, method, params, 10000, &result, &error);
  char *text = error ? json_dumps(error, JSON_COMPACT) : NULL;
  cr_assert_eq(rc, 0, "%s failed: %s %s", method, ah_strerror(rc), text ? text : "");
  free(text);
  json_decref(error);
  cr_assert_not_null(result);
  return result;
}

static size_t turns_ended(const sess_env *e, const char *id) {
  json_t *h = sess_call(e, "session.history", json_pack("{s:s, s:i}", "sessionId", id, "limit", 1000));
  size_t n = 0;
  size_t i = 0;
  json_t *ev = NULL;
  json_array_foreach(json_object_get(h, "events"), i, ev) {
    const char *kind = json_string_value(json_object_get(ev, "kind"));
    n += kind && strcmp(kind, "turn/ended") == 0;
  }
  json_decref(h);
  return n;
}

/* Send `text` as a prompt and wait until the session has `turns` ended turns. */
static void sess_prompt(const sess_env *e, const char *id, const char *text, size_t turns) {
  json_t *r = sess_call(e, "session.prompt", json_pack("{s:s, s:s}", "sessionId", id, "text", text));
  cr_assert(json_is_string(json_object_get(r, "messageId")));
  json_decref(r);
  uint64_t deadline = ts_now_ms() + 10000;
  while (turns_ended(e, id) < turns) {
    cr_assert_lt(ts_now_ms(), deadline, "turn %zu did not end; log:\n%s", turns, daemon_log(e));
    usleep(20 * 1000);
  }
}

/* A session (its title and prompts carry control characters) with two ended turns; the caller frees the
 * id. */
static char *sess_make(const sess_env *e) {
  json_t *r = sess_call(e, "session.create",
                        json_pack("{s:s, s:s}", "cwd", test_dir(), "title", "t\x1b[31mred\x07 title"));
  const char *sid = json_string_value(json_object_get(r, "sessionId"));
  cr_assert_not_null(sid);
  char *id = strdup(sid);
  json_decref(r);
  sess_prompt(e, id, "first\x1b[2J prompt\r\n", 1);
  sess_prompt(e, id, "second prompt \x01\x7f", 2);
  return id;
}

/* What the commands must leave alone: the database's bytes and whether -wal / -shm exist (and -wal's
 * size). */
typedef struct db_snapshot {
  char *bytes;
  size_t len;
  bool wal;
  off_t wal_size;
  bool shm;
} db_snapshot;

static db_snapshot db_snap(const sess_env *e) {
  db_snapshot s = {0};
  s.bytes = ts_read_file(e->db, &s.len);
  cr_assert_not_null(s.bytes, "cannot read %s", e->db);
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s-wal", e->db);
  s.wal = stat(path, &st) == 0;
  s.wal_size = s.wal ? st.st_size : 0;
  snprintf(path, sizeof path, "%s-shm", e->db);
  s.shm = stat(path, &st) == 0;
  return s;
}

static void db_assert_same(const db_snapshot *a, const db_snapshot *b, const char *after) {
  cr_assert(a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0, "%s changed the database's bytes",
            after);
  cr_assert_eq(a->wal, b->wal, "%s %s the -wal file", after, b->wal ? "created" : "removed");
  cr_assert_eq(a->wal_size, b->wal_size, "%s changed the size of the -wal file", after);
  cr_assert_eq(a->shm, b->shm, "%s %s the -shm file", after, b->shm ? "created" : "removed");
}

/* No byte of `text` is a control character but a newline. */
static void assert_no_controls(const char *text, const char *what) {
  for (const char *p = text; *p; p++)
    cr_assert(*p == '\n' || ((unsigned char)*p >= 0x20 && *p != 0x7f),
              "%s printed a raw control byte %#x: %s", what, (unsigned char)*p, text);
}

Test(cli, sessions_read_a_stopped_daemons_store_without_touching_it, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  sess_start(&e);
  char *id = sess_make(&e);
  sess_stop(&e);
  db_snapshot before = db_snap(&e);
  cr_assert_not(before.wal, "a cleanly stopped daemon left its -wal file");

  /* list: the table, then the JSON array. */
  char *out = NULL;
  char *err = NULL;
  int code = sess_cli(&e, &out, &err, "sessions", "list", NULL);
  cr_assert_eq(code, 0, "sessions list exited %d: %s", code, err);
  cr_assert(strncmp(out, "ID ", 3) == 0, "no header: %s", out);
  char *line = strstr(out, id);
  cr_assert_not_null(line, "the session is not listed: %s", out);
  cr_assert(strstr(line, "  idle  "), "no status: %s", out);
  cr_assert(strstr(line, test_dir()), "no cwd: %s", out);
  cr_assert(strstr(line, "t\\u001b[31mred\\u0007 title"), "the title is not escaped: %s", out);
  assert_no_controls(out, "sessions list");
  cr_assert_str_empty(err);
  free(out);
  free(err);
  db_snapshot now = db_snap(&e);
  db_assert_same(&before, &now, "sessions list");
  free(now.bytes);

  code = sess_cli(&e, &out, &err, "sessions", "list", "--json", NULL);
  cr_assert_eq(code, 0, "sessions list --json exited %d: %s", code, err);
  json_error_t jerr;
  json_t *list = json_loads(out, 0, &jerr);
  cr_assert(json_is_array(list), "not a JSON array (%s): %s", jerr.text, out);
  cr_assert_eq(json_array_size(list), 1);
  json_t *row = json_array_get(list, 0);
  cr_assert_str_eq(json_string_value(json_object_get(row, "id")), id);
  cr_assert_str_eq(json_string_value(json_object_get(row, "status")), "idle");
  cr_assert_str_eq(json_string_value(json_object_get(row, "title")), "t\x1b[31mred\x07 title");
  cr_assert_null(json_object_get(row, "leaseOwner"), "lease internals are shown");
  json_decref(list);
  free(out);
  free(err);

  /* show: the row, then one line per event in seq order. */
  code = sess_cli(&e, &out, &err, "sessions", "show", id, NULL);
  cr_assert_eq(code, 0, "sessions show exited %d: %s", code, err);
  assert_no_controls(out, "sessions show");
  cr_assert(strstr(out, id), "%s", out);
  cr_assert(strstr(out, "first\\u001b[2J prompt\\r\\n"), "the prompt is not shown escaped: %s", out);
  char *events = strstr(out, "\n   SEQ ");
  cr_assert_not_null(events, "no event table: %s", out);
  const char *kinds[] = {"inbox/received", "inbox/claimed", "turn/started", "message/committed",
                         "turn/ended"};
  long seq = 0;
  size_t turn_ends = 0;
  for (char *l = strchr(events + 1, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
    char *end = NULL;
    long n = strtol(l + 1, &end, 10);
    cr_assert(end != l + 1, "not an event line: %.80s", l + 1);
    cr_assert_eq(n, seq + 1, "events out of order at %ld: %s", n, out);
    seq = n;
    bool known = false;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
      known =
          known || strncmp(strstr(end, "Z  ") ? strstr(end, "Z  ") + 3 : "", kinds[k], strlen(kinds[k])) == 0;
    cr_assert(known, "no known kind: %.120s", l + 1);
    turn_ends += strstr(end, "turn/ended") && strstr(end, "turn/ended") < strchr(end, '\n');
  }
  cr_assert_eq(seq, 10, "expected the 10 events of two echo turns: %s", out);
  cr_assert_eq(turn_ends, 2, "%s", out);
  free(out);
  free(err);

  code = sess_cli(&e, &out, &err, "sessions", "show", id, "--json", NULL);
  cr_assert_eq(code, 0, "sessions show --json exited %d: %s", code, err);
  json_t *shown = json_loads(out, 0, &jerr);
  cr_assert_not_null(shown, "not JSON (%s): %s", jerr.text, out);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(shown, "session"), "id")), id);
  cr_assert_eq(json_array_size(json_object_get(shown, "events")), 10);
  free(out);
  free(err);

  /* export: JSON Lines, the stored events, seq 1..N — the same lines as the events of show --json. */
  code = sess_cli(&e, &out, &err, "sessions", "export", id, NULL);
  cr_assert_eq(code, 0, "sessions export exited %d: %s", code, err);
  cr_assert_str_empty(err);
  size_t n = 0;
  for (char *l = out; *l; n++) {
    char *nl = strchr(l, '\n');
    cr_assert_not_null(nl, "the last line is not terminated: %s", l);
    json_t *ev = json_loadb(l, (size_t)(nl - l), 0, &jerr);
    cr_assert(json_is_object(ev), "line %zu does not parse (%s): %.*s", n + 1, jerr.text, (int)(nl - l), l);
    cr_assert_eq(json_integer_value(json_object_get(ev, "seq")), (json_int_t)n + 1);
    cr_assert_str_eq(json_string_value(json_object_get(ev, "sessionId")), id);
    cr_assert(json_is_integer(json_object_get(ev, "cursor")));
    cr_assert(json_is_string(json_object_get(ev, "time")));
    cr_assert(json_is_object(json_object_get(ev, "data")));
    cr_assert(json_equal(ev, json_array_get(json_object_get(shown, "events"), n)), "line %zu differs", n + 1);
    cr_assert_null(memchr(l, '\x1b', (size_t)(nl - l)), "a raw control byte in JSON");
    json_decref(ev);
    l = nl + 1;
  }
  cr_assert_eq(n, 10, "%s", out);
  json_decref(shown);
  free(out);
  free(err);

  now = db_snap(&e);
  db_assert_same(&before, &now, "sessions list/show/export");
  free(now.bytes);
  free(before.bytes);
  free(id);
  sess_env_free(&e);
}

Test(cli, sessions_unknown_id_and_usage_errors, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  sess_start(&e);
  char *id = sess_make(&e);
  sess_stop(&e);
  db_snapshot before = db_snap(&e);
  const char *verbs[] = {"show", "export"};
  for (size_t i = 0; i < 2; i++) {
    char *out = NULL;
    char *err = NULL;
    int code = sess_cli(&e, &out, &err, "sessions", verbs[i], "01a00000-0000-7000-8000-000000000000", NULL);
    cr_assert_eq(code, 1, "sessions %s of an unknown id exited %d: %s", verbs[i], code, err);
    cr_assert(strstr(err, "no such session"), "unclear message: %s", err);
    cr_assert_str_empty(out);
    free(out);
    free(err);
  }
  const char *bad[][4] = {{"sessions", NULL},           {"sessions", "frob", NULL},
                          {"sessions", "show", NULL},   {"sessions", "list", "extra", NULL},
                          {"sessions", "export", NULL}, {"sessions", "export", id, "--json"},
                          {"sessions", "show", id, "x"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *out = NULL;
    char *err = NULL;
    int code = sess_cli(&e, &out, &err, bad[i][0], bad[i][1], bad[i][2], bad[i][3], NULL);
    cr_assert_eq(code, 2, "%s %s exited %d: %s", bad[i][0], bad[i][1] ? bad[i][1] : "", code, err);
    cr_assert(strstr(err, "usage: agenthost"), "%s", err);
    cr_assert_str_empty(out);
    free(out);
    free(err);
  }
  db_snapshot now = db_snap(&e);
  db_assert_same(&before, &now, "the refused commands");
  free(now.bytes);
  free(before.bytes);
  free(id);
  sess_env_free(&e);
}

static size_t dir_entries(const char *path) {
  DIR *d = opendir(path);
  cr_assert_not_null(d, "cannot open %s", path);
  size_t n = 0;
  for (struct dirent *de = readdir(d); de; de = readdir(d))
    n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
  closedir(d);
  return n;
}

Test(cli, sessions_without_a_database_create_nothing, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  /* A state directory that does not exist, then one that exists but is empty. */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1)
      cr_assert_eq(mkdir(e.state, 0700), 0);
    const char *verbs[][3] = {{"list", NULL}, {"show", "x"}, {"export", "x"}};
    for (size_t i = 0; i < 3; i++) {
      char *out = NULL;
      char *err = NULL;
      int code = sess_cli(&e, &out, &err, "sessions", verbs[i][0], verbs[i][1], NULL);
      cr_assert_eq(code, 1, "sessions %s without a database exited %d: %s", verbs[i][0], code, err);
      cr_assert(strstr(err, e.db), "the message does not name the database: %s", err);
      cr_assert(strstr(err, "never creates"), "unclear message: %s", err);
      cr_assert_str_empty(out);
      free(out);
      free(err);
    }
    if (pass == 0)
      cr_assert_neq(access(e.state, F_OK), 0, "the state directory was created");
    else
      cr_assert_eq(dir_entries(e.state), 0, "something was created in the state directory");
    cr_assert_neq(access(e.runtime, F_OK), 0, "the runtime directory was created");
  }
  sess_env_free(&e);
}

Test(cli, sessions_list_beside_a_running_daemon, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  sess_start(&e);
  char *id = sess_make(&e);
  for (int round = 0; round < 3; round++) {
    char *out = NULL;
    char *err = NULL;
    int code = sess_cli(&e, &out, &err, "sessions", "list", NULL);
    cr_assert_eq(code, 0, "sessions list beside the daemon exited %d: %s", code, err);
    cr_assert(strstr(out, id), "the session is not listed: %s", out);
    free(out);
    free(err);
    code = sess_cli(&e, &out, &err, "sessions", "export", id, NULL);
    cr_assert_eq(code, 0, "sessions export beside the daemon exited %d: %s", code, err);
    free(out);
    free(err);
  }
  /* The daemon goes on undisturbed: another turn runs and is stored. */
  sess_prompt(&e, id, "third", 3);
  char *out = NULL;
  char *err = NULL;
  int code = sess_cli(&e, &out, &err, "sessions", "show", id, "--json", NULL);
  cr_assert_eq(code, 0, "%s", err);
  json_t *shown = json_loads(out, 0, NULL);
  cr_assert_eq(json_array_size(json_object_get(shown, "events")), 15, "%s", out);
  json_decref(shown);
  free(out);
  free(err);
  sess_stop(&e);
  char *text = daemon_log(&e);
  cr_assert_null(strstr(text, " ERROR "), "the daemon logged an error:\n%s", text);
  free(text);
  /* The daemon, the last connection, removed its WAL as always: the readers kept nothing open. */
  char wal[4200];
  snprintf(wal, sizeof wal, "%s-wal", e.db);
  cr_assert_neq(access(wal, F_OK), 0, "the -wal file is left after the daemon stopped");
  free(id);
  sess_env_free(&e);
}

/* Two daemons on one state directory (two runtime directories): a session live in the first is refused
 * to the second with agent-busy, and the second may take it once the first stopped (lease released). */
Test(cli, a_second_process_gets_agent_busy, .timeout = 60, .fini = cleanup) {
  sess_env a = sess_env_new();
  sess_env b = sess_env_new();
  free(b.runtime);
  free(b.sock);
  free(b.log);
  b.runtime = path_in("run-b");
  b.sock = path_in("run-b/admin.sock");
  b.log = path_in("daemon-b.log");
  sess_start(&a);
  sess_start(&b);
  json_t *r = sess_call(&a, "session.create", json_pack("{s:s}", "cwd", test_dir()));
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  json_t *result = NULL;
  json_t *error = NULL;
  int rc = ah__admin_call(b.runtime, "session.prompt", json_pack("{s:s, s:s}", "sessionId", id, "text", "x"),
                          10000, &result, &error);
  cr_assert_eq(rc, AH_EAGENTBUSY, "the second process must refuse: %s", ah_strerror(rc));
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(error, "data"), "category")),
                   "agent-busy");
  json_decref(error);
  json_decref(result);
  /* The first process still runs it. */
  sess_prompt(&a, id, "still mine", 1);
  sess_stop(&a);
  /* Released at a clean stop: the second process takes the session over. */
  sess_prompt(&b, id, "now yours", 2);
  sess_stop(&b);
  free(id);
  sess_env_free(&a);
  sess_env_free(&b);
}

/* After a SIGHUP the daemon works on the new configuration: sessions read it through the host (the old
 * one is freed), so creating and running a session afterwards must work (and stay clean under ASan). */
Test(cli, sessions_work_after_a_config_reload, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  sess_start(&e);
  cr_assert_eq(kill(e.pid, SIGHUP), 0);
  uint64_t deadline = ts_now_ms() + 10000;
  for (;;) {
    char *log = daemon_log(&e);
    bool applied = strstr(log, "applying the configuration again") != NULL;
    free(log);
    if (applied)
      break;
    cr_assert_lt(ts_now_ms(), deadline, "SIGHUP was not applied");
    usleep(20 * 1000);
  }
  usleep(100 * 1000);
  json_t *r = sess_call(&e, "session.create", json_pack("{s:s}", "cwd", test_dir()));
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  sess_prompt(&e, id, "after reload", 1);
  sess_stop(&e);
  free(id);
  sess_env_free(&e);
}

/* ---- SECURITY.md T7 (C01): the daemon's environment is out of a same-uid sibling's reach -----------------
 */

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>

/* As root (CI), the daemon and the reader both run as `nobody`, so the reader is a same-uid sibling: the
 * daemon made itself non-dumpable (PR_SET_DUMPABLE 0), so its /proc/PID/environ belongs to root and the
 * sibling gets EACCES — the canary it holds cannot be read. Not root: skipped (said so). */
Test(cli, a_same_uid_sibling_cannot_read_the_daemons_environment, .timeout = 60, .fini = cleanup) {
  if (geteuid() != 0) {
    cr_skip_test("needs root to run the daemon and the reader as another user (nobody)");
  }
  struct passwd *pw = getpwnam("nobody");
  cr_assert_not_null(pw, "no user nobody");
  uid_t uid = pw->pw_uid;
  gid_t gid = pw->pw_gid;
  const char *dir = test_dir();
  cr_assert_eq(chmod(dir, 0755), 0);
  char *state = path_in("state");
  char *runtime = path_in("run");
  char *config = ts_write_file(dir, "agenthost.ini",
                               "[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n");
  cr_assert_not_null(config);
  cr_assert_eq(mkdir(state, 0700), 0);
  cr_assert_eq(chown(state, uid, gid), 0);
  cr_assert_eq(mkdir(runtime, 0700), 0);
  cr_assert_eq(chown(runtime, uid, gid), 0);
  cr_assert_eq(chmod(config, 0644), 0);
  char *log = path_in("daemon.log");
  pid_t daemon = fork();
  cr_assert_geq(daemon, 0);
  if (daemon == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
    }
    if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
      _exit(126);
    setenv("OPENAI_API_KEY", "sk-CANARY", 1);
    execl(agenthost(), agenthost(), "--config", config, "--state-dir", state, "--runtime-dir", runtime,
          "serve", (char *)NULL);
    _exit(127);
  }
  char sock[4200];
  snprintf(sock, sizeof sock, "%s/admin.sock", runtime);
  bool up = ts_wait_path(sock, 10000);
  char *text = ts_read_file(log, NULL);
  cr_assert(up, "the daemon did not start as nobody:\n%s", text ? text : "");
  free(text);
  char environ_path[64];
  snprintf(environ_path, sizeof environ_path, "/proc/%d/environ", (int)daemon);
  struct stat st;
  cr_assert_eq(stat(environ_path, &st), 0);
  cr_assert_eq(st.st_uid, 0, "/proc/PID/environ of a non-dumpable process belongs to root (uid %d)",
               (int)st.st_uid);
  pid_t reader = fork();
  cr_assert_geq(reader, 0);
  if (reader == 0) {
    if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
      _exit(126);
    int fd = open(environ_path, O_RDONLY);
    if (fd >= 0) {
      char buf[65536];
      ssize_t n = read(fd, buf, sizeof buf - 1);
      _exit(n > 0 && memmem(buf, (size_t)n, "CANARY", 6) ? 3 : 2);
    }
    _exit(errno == EACCES ? 0 : 4);
  }
  int rst = 0;
  cr_assert_eq(waitpid(reader, &rst, 0), reader);
  cr_assert(WIFEXITED(rst), "the reader did not exit");
  cr_assert_eq(WEXITSTATUS(rst), 0,
               "a same-uid sibling %s /proc/PID/environ (exit %d: 2 = readable, 3 = the canary leaked, 4 = "
               "another error, 126 = could not drop to nobody)",
               WEXITSTATUS(rst) == 3 ? "read the canary from" : "was not refused", WEXITSTATUS(rst));
  /* The owner (root here) can, so the refusal above is the daemon's doing, not a missing file. */
  int fd = open(environ_path, O_RDONLY);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_assert_eq(kill(daemon, SIGTERM), 0);
  int dst = 0;
  cr_assert_eq(waitpid(daemon, &dst, 0), daemon);
  cr_assert(WIFEXITED(dst) && WEXITSTATUS(dst) == 0, "the daemon did not exit 0 (status %#x)", dst);
  free(log);
  free(config);
  free(state);
  free(runtime);
}

/* Reliability finding 12: a title with a bidirectional control (U+202E RIGHT-TO-LEFT OVERRIDE, "Trojan
 * Source") is shown escaped by `sessions list`, never raw. */
Test(cli, sessions_list_escapes_bidi_controls, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  sess_start(&e);
  json_t *r =
      sess_call(&e, "session.create",
                json_pack("{s:s, s:s}", "cwd", test_dir(), "title", "safe\xe2\x80\xaetxt.exe\xe2\x81\xa6x"));
  cr_assert_not_null(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  sess_stop(&e);
  char *out = NULL;
  char *err = NULL;
  int code = sess_cli(&e, &out, &err, "sessions", "list", NULL);
  cr_assert_eq(code, 0, "sessions list exited %d: %s", code, err);
  cr_expect_null(strstr(out, "\xe2\x80\xae"), "U+202E printed raw: %s", out);
  cr_expect_null(strstr(out, "\xe2\x81\xa6"), "U+2066 printed raw: %s", out);
  cr_expect(strstr(out, "safe\\u202etxt.exe\\u2066x"), "not escaped as \\u202e: %s", out);
  free(out);
  free(err);
}

/* ---- hooks list: the daemon's hooks (configuration and plugins), else the configuration's ----------------
 */

static void write_hooks_config(const sess_env *e, const char *hooks) {
  char *text = NULL;
  cr_assert(
      asprintf(&text, "[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n%s", hooks) > 0);
  FILE *f = fopen(e->config, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
  free(text);
}

Test(cli, hooks_list_shows_the_configurations_then_the_daemons_hooks_without_secrets, .timeout = 60,
     .fini = cleanup) {
  sess_env e = sess_env_new();
  write_hooks_config(
      &e, "[hook.guard]\nevent = before_tool\nmatch = run_command\ncommand = /usr/local/bin/guard\n"
          "args = --token=s3cret\nenv = API_KEY=s3cret\ntimeout_ms = 2000\n");
  char *out = NULL;
  char *err = NULL;
  cr_assert_eq(sess_cli(&e, &out, &err, "hooks", "list", NULL), 0, "%s", err);
  cr_expect(strstr(out, "no daemon is running"), "%s", out);
  cr_expect(strstr(out, "guard") && strstr(out, "before_tool") && strstr(out, "[\"run_command\"]") &&
                strstr(out, "timeout=2000ms") && strstr(out, "on_error=deny") &&
                strstr(out, "/usr/local/bin/guard"),
            "%s", out);
  cr_expect_null(strstr(out, "s3cret"), "%s", out);
  free(out);
  free(err);
  /* From the daemon; a configuration reload (SIGHUP) shows the new hooks. */
  sess_start(&e);
  cr_assert_eq(sess_cli(&e, &out, &err, "hooks", "list", "--json", NULL), 0, "%s", err);
  json_t *j = json_loads(out, 0, NULL);
  cr_assert_not_null(j, "%s", out);
  cr_expect_str_eq(json_string_value(json_object_get(j, "from")), "daemon");
  cr_expect_eq(json_array_size(json_object_get(j, "hooks")), 1);
  cr_expect_null(strstr(out, "s3cret"), "%s", out);
  json_decref(j);
  free(out);
  free(err);
  /* A run is in the session's log: the missing program is the hook's error, which denies the call. */
  json_t *r = sess_call(&e, "session.create", json_pack("{s:s}", "cwd", test_dir()));
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  sess_prompt(&e, id, "/tool run_command {\"command\": \"true\"}", 1);
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "show", id, NULL), 0, "%s", err);
  cr_expect(strstr(out, "hook/ran") && strstr(out, "guard (before_tool run_command): error: cannot run"),
            "%s", out);
  free(out);
  free(err);
  /* and in the offline report of its export: the hook, its error and what on_error made of it */
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "export", id, NULL), 0, "%s", err);
  char exp[4200];
  snprintf(exp, sizeof exp, "%s/export.jsonl", test_dir());
  FILE *ef = fopen(exp, "w");
  cr_assert_not_null(ef);
  fputs(out, ef);
  fclose(ef);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "analyze", exp, NULL), 0, "%s", err);
  cr_expect(strstr(out, "hook guard (before_tool): 1 run(s), error 1") &&
                strstr(out, "hook guard error on run_command: cannot run") &&
                strstr(out, "(on_error = deny)"),
            "%s", out);
  cr_expect_null(strstr(out, "s3cret"), "%s", out);
  free(out);
  free(err);
  free(id);
  write_hooks_config(&e, "[hook.guard]\nevent = before_tool\ncommand = /usr/local/bin/guard\n"
                         "[hook.audit]\nevent = turn_end\ncommand = /usr/local/bin/audit\n");
  cr_assert_eq(kill(e.pid, SIGHUP), 0);
  uint64_t deadline = ts_now_ms() + 10000;
  for (;;) {
    cr_assert_eq(sess_cli(&e, &out, &err, "hooks", "list", NULL), 0, "%s", err);
    bool both = strstr(out, "audit") != NULL;
    if (both)
      break;
    free(out);
    free(err);
    cr_assert_lt(ts_now_ms(), deadline, "the reload did not show the new hook");
    usleep(50 * 1000);
  }
  cr_expect_null(strstr(out, "no daemon"), "%s", out);
  cr_expect(strstr(out, "turn_end") && strstr(out, "on_error=allow"), "%s", out);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "hooks", NULL), 2, "a usage error");
  free(out);
  free(err);
  sess_stop(&e);
  sess_env_free(&e);
}

/* ---- call: any method over the admin socket --------------------------------------------------------- */

/* `agenthost call` prints the result as JSON (exit 0), the daemon's error on stderr with its code (exit 1),
 * with --json one line {"result"} / {"error"} on stdout; params from the argument or stdin (-); bad params
 * are a usage error and send nothing; a privileged method runs (the admin socket's authority). */
Test(cli, call_sends_one_request_and_prints_its_result_or_error, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  char *out = NULL;
  char *err = NULL;
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "host.describe", NULL), 1, "no daemon: %s", err);
  cr_expect(strstr(err, "no running daemon answers on the admin socket") && strstr(err, e.sock),
            "the message names the socket it tried: %s", err);
  free(out);
  free(err);
  sess_start(&e);

  cr_assert_eq(sess_cli(&e, &out, &err, "call", "host.describe", NULL), 0, "%s", err);
  json_error_t jerr;
  json_t *v = json_loads(out, 0, &jerr);
  cr_assert_not_null(v, "not JSON: %s", out);
  cr_expect_str_eq(json_string_value(json_object_get(v, "mode")), "serve");
  cr_expect(strchr(out, '\n') < out + strlen(out) - 1, "indented over several lines: %s", out);
  json_decref(v);
  free(out);
  free(err);

  char *params = NULL;
  cr_assert_geq(asprintf(&params, "{\"cwd\": \"%s\", \"title\": \"from call\"}", test_dir()), 0);
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "session.create", params, NULL), 0, "%s", err);
  v = json_loads(out, 0, &jerr);
  cr_assert_not_null(v, "not JSON: %s", out);
  char *id = strdup(json_string_value(json_object_get(v, "sessionId")));
  json_decref(v);
  free(out);
  free(err);
  free(params);

  /* From stdin; the global options after the command. */
  char *cmd = NULL;
  cr_assert_geq(
      asprintf(&cmd,
               "printf '{\"sessionId\": \"%s\"}' | '%s' call session.get - --config '%s' --state-dir '%s' "
               "--runtime-dir '%s'",
               id, agenthost(), e.config, e.state, e.runtime),
      0);
  char *sh[] = {"/bin/sh", "-c", cmd, NULL};
  cr_assert_eq(ts_run(sh, 30000, &out, &err), 0, "%s", err);
  v = json_loads(out, 0, &jerr);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(v, "session"), "title")), "from call",
                   "%s", out);
  json_decref(v);
  free(out);
  free(err);
  free(cmd);

  /* The daemon's error: human on stderr, or --json on stdout. */
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "session.get", "{\"sessionId\": \"nope\"}", NULL), 1);
  cr_expect(strstr(err, "call session.get: no such session (code -32005)") && strstr(err, "\"ENOENT\""), "%s",
            err);
  cr_expect_str_empty(out);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "--json", "session.get", "{\"sessionId\": \"nope\"}", NULL),
               1);
  cr_expect_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
  v = json_loads(out, 0, &jerr);
  json_t *data = json_object_get(json_object_get(v, "error"), "data");
  cr_expect_str_eq(json_string_value(json_object_get(data, "name")), "ENOENT", "%s", out);
  cr_expect_null(json_object_get(v, "result"));
  json_decref(v);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "--json", "session.get", "{\"sessionId\": \"", NULL), 2);
  cr_expect(strstr(err, "not JSON"), "%s", err);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "session.get", "\"a string\"", NULL), 2);
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "--bogus", "host.describe", NULL), 2);
  cr_expect(strstr(err, "usage: agenthost call"), "%s", err);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "call", NULL), 2);
  free(out);
  free(err);

  /* Privileged: a plugin mounted from the command line, then a call that outlasts --timeout. */
  char *load = NULL;
  cr_assert_geq(asprintf(&load, "{\"path\": \"%s/slow-call.so\"}", getenv("AH_TEST_PLUGIN_DIR")), 0);
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "plugin.load", load, NULL), 0, "%s", err);
  cr_expect(strstr(out, "\"slow-call\""), "%s", out);
  free(out);
  free(err);
  free(load);
  uint64_t t0 = ts_now_ms();
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "--timeout", "0.3", "slow.wait", "{}", NULL), 1);
  cr_expect(strstr(err, "no answer within 0.3 s"), "%s", err);
  cr_expect_lt(ts_now_ms() - t0, 10000);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "--timeout=x", "slow.wait", NULL), 2);
  free(out);
  free(err);
  /* The daemon still answers. */
  cr_assert_eq(sess_cli(&e, &out, &err, "call", "--json", "session.get", "{\"sessionId\": \"x\"}", NULL), 1);
  cr_expect(strstr(out, "ENOENT"), "%s", out);
  free(out);
  free(err);
  free(id);
  sess_stop(&e);
  sess_env_free(&e);
}

/* A daemon that does not mount the browser (its section enabled for another mode): `url` says so, and
 * `token rotate` replaces the token file (the daemon's "no such method" was taken for an error). */
Test(cli, url_and_token_rotate_beside_a_daemon_without_the_browser, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  free(e.config);
  e.config =
      ts_write_file(test_dir(), "agenthost.ini",
                    "[plugin.browser]\nenabled = true\nmodes = sdk\n[plugin.remote]\nenabled = false\n");
  cr_assert_not_null(e.config);
  char *out = NULL;
  char *err = NULL;
  cr_assert_eq(sess_cli(&e, &out, &err, "url", NULL), 1);
  cr_expect(strstr(err, "no running daemon answers on the admin socket") && strstr(err, e.sock), "%s", err);
  free(out);
  free(err);
  sess_start(&e);
  cr_assert_eq(sess_cli(&e, &out, &err, "url", NULL), 1);
  cr_expect(strstr(err, "url: the running daemon serves no browser surface"), "%s", err);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "token", "rotate", NULL), 0, "%s", err);
  cr_expect(strstr(out, "rotated the token in") &&
                strstr(out, "the running daemon serves no browser surface"),
            "%s", out);
  free(out);
  free(err);
  sess_stop(&e);
  sess_env_free(&e);
}

/* ---- stop and sessions delete ------------------------------------------------------------------------- */

/* `agenthost stop` stops the daemon in order and returns once it has exited (its lock free, exit 0, log
 * "stopped"); without a daemon it says so with the directory (exit 1). */
Test(cli, stop_stops_the_daemon_in_order_and_waits_for_it, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  char *out = NULL;
  char *err = NULL;
  cr_assert_eq(sess_cli(&e, &out, &err, "stop", NULL), 1);
  cr_expect(strstr(err, "no agenthost serve runs for") && strstr(err, e.runtime), "%s", err);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "stop", "--timeout", "x", NULL), 2);
  free(out);
  free(err);
  sess_start(&e);
  char pid[32];
  snprintf(pid, sizeof pid, "(pid %ld)", (long)e.pid);
  cr_assert_eq(sess_cli(&e, &out, &err, "stop", NULL), 0, "%s", err);
  cr_expect(strstr(out, "stopped agenthost serve") && strstr(out, pid), "%s", out);
  /* Returned only once the daemon is gone: it has exited (0) and said so. */
  int st = 0;
  cr_assert_eq(waitpid(e.pid, &st, WNOHANG), e.pid, "the daemon still runs after `stop` returned");
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
  e.pid = 0;
  char *log = daemon_log(&e);
  cr_expect(strstr(log, "stopped"), "%s", log);
  free(log);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "stop", NULL), 1, "stopped already");
  free(out);
  free(err);
  sess_env_free(&e);
}

/* `agenthost sessions delete ID`: an open session is refused (with how to close it); a closed one is
 * deleted through the daemon, or from the store when no daemon runs; an unknown id is an error. */
Test(cli, sessions_delete_through_the_daemon_or_the_store, .timeout = 60, .fini = cleanup) {
  sess_env e = sess_env_new();
  sess_start(&e);
  char *ids[3];
  for (int i = 0; i < 3; i++) {
    json_t *r = sess_call(&e, "session.create", json_pack("{s:s}", "cwd", test_dir()));
    ids[i] = strdup(json_string_value(json_object_get(r, "sessionId")));
    json_decref(r);
  }
  char *out = NULL;
  char *err = NULL;
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "delete", ids[0], NULL), 1);
  cr_expect(strstr(err, "close the session before deleting it") && strstr(err, "session.close"), "%s", err);
  free(out);
  free(err);
  for (int i = 0; i < 2; i++)
    json_decref(sess_call(&e, "session.close", json_pack("{s:s}", "sessionId", ids[i])));
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "delete", ids[0], NULL), 0, "%s", err);
  cr_expect(strstr(out, "deleted") && strstr(out, ids[0]) && !strstr(out, "no daemon"), "%s", out);
  free(out);
  free(err);
  json_t *result = NULL, *error = NULL;
  cr_expect_eq(ah__admin_call(e.runtime, "session.get", json_pack("{s:s}", "sessionId", ids[0]), 10000,
                              &result, &error),
               AH_ENOENT);
  json_decref(result);
  json_decref(error);
  sess_stop(&e);
  /* Without a daemon: from the store. */
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "delete", ids[1], NULL), 0, "%s", err);
  cr_expect(strstr(out, "no daemon is running"), "%s", out);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "show", ids[1], NULL), 1, "gone from the store");
  cr_expect(strstr(err, "no such session"), "%s", err);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "delete", ids[1], NULL), 1);
  cr_expect(strstr(err, "no such session"), "%s", err);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "delete", ids[2], NULL), 1, "open, and no daemon");
  cr_expect(strstr(err, "the session is open: close it first"), "%s", err);
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "show", ids[2], NULL), 0, "still there");
  free(out);
  free(err);
  cr_assert_eq(sess_cli(&e, &out, &err, "sessions", "delete", NULL), 2);
  free(out);
  free(err);
  for (int i = 0; i < 3; i++)
    free(ids[i]);
  sess_env_free(&e);
}
