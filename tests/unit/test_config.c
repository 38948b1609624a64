/* Unit tests for host/config.c: defaults, the file, the environment, the command line, refusals. Every
 * test passes its own environment array, never the process environment (except environ_is_default). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agenthost/errors.h"
#include "config.h"
#include "log.h"
#include "store.h"
#include "support.h"

#ifndef AH_INSTALL_PLUGIN_DIR
#define AH_INSTALL_PLUGIN_DIR "/usr/local/lib/agenthost/plugins"
#endif

/* ---- helpers --------------------------------------------------------------------------------------- */

/* A NULL-terminated environment built from printf-formatted entries, ended by NULL. */
static char **mkenv(const char *first, ...) {
  char **env = calloc(64, sizeof *env);
  cr_assert_not_null(env);
  size_t n = 0;
  va_list ap;
  va_start(ap, first);
  for (const char *e = first; e; e = va_arg(ap, const char *)) {
    cr_assert_lt(n, 63);
    env[n] = strdup(e);
    cr_assert_not_null(env[n]);
    n++;
  }
  va_end(ap);
  return env;
}

static void freeenv(char **env) {
  for (char **e = env; e && *e; e++)
    free(*e);
  free(env);
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  cr_assert_geq(vasprintf(&s, f, ap), 0);
  va_end(ap);
  return s;
}

static char *write_bytes(const char *dir, const char *name, const char *data, size_t len) {
  char *path = fmt("%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(data, 1, len, f), len);
  fclose(f);
  return path;
}

/* A fresh temporary directory, used as HOME so that no real config file is found. */
static char *tmp;
static char *home_env;

static void setup(void) {
  tmp = ts_mkdtemp();
  cr_assert_not_null(tmp);
  home_env = fmt("HOME=%s", tmp);
}

static void teardown(void) {
  ts_rmtree(tmp);
  free(tmp);
  free(home_env);
}

TestSuite(config, .init = setup, .fini = teardown);

/* Load `text` as an explicit --config file; returns the result, *err as the loader left it. */
static int load_text(ah_config *cfg, const char *text, char **path_out, char **err) {
  char *path = ts_write_file(tmp, "agenthost.ini", text);
  cr_assert_not_null(path);
  ah_cli_overrides cli = {.config_file = path};
  char **env = mkenv(home_env, NULL);
  int rc = ah__config_load(cfg, &cli, env, err);
  freeenv(env);
  if (path_out)
    *path_out = path;
  else
    free(path);
  return rc;
}

/* Expect a configuration error whose message contains every given fragment. */
static void expect_error(int rc, char *err, ...) {
  cr_expect_eq(rc, AH_ECONFIG, "rc = %d (%s)", rc, err ? err : "no message");
  cr_assert_not_null(err);
  va_list ap;
  va_start(ap, err);
  for (const char *frag = va_arg(ap, const char *); frag; frag = va_arg(ap, const char *))
    cr_expect_not_null(strstr(err, frag), "\"%s\" not in \"%s\"", frag, err);
  va_end(ap);
  cr_expect_null(strchr(err, '\n'), "message has a newline: %s", err);
  free(err);
}

typedef struct capture {
  int rfd;
  int wfd;
} capture;

static capture capture_start(void) {
  int fds[2] = {-1, -1};
  cr_assert_eq(pipe2(fds, O_CLOEXEC), 0);
  ah__log_set_fd(fds[1]);
  return (capture){.rfd = fds[0], .wfd = fds[1]};
}

static char *capture_end(capture *c) {
  ah__log_set_fd(-1);
  close(c->wfd);
  char *buf = calloc(1, 65536);
  cr_assert_not_null(buf);
  size_t len = 0;
  ssize_t r = 0;
  while ((r = read(c->rfd, buf + len, 65535 - len)) > 0)
    len += (size_t)r;
  close(c->rfd);
  return buf;
}

static const char *plugin_str(const ah_config *cfg, const char *plugin, const char *key) {
  return json_string_value(json_object_get(json_object_get(cfg->plugins, plugin), key));
}

static json_t *plugin_val(const ah_config *cfg, const char *plugin, const char *key) {
  return json_object_get(json_object_get(cfg->plugins, plugin), key);
}

static void expect_json(json_t *got, const char *want_text) {
  json_error_t jerr;
  json_t *want = json_loads(want_text, 0, &jerr);
  cr_assert_not_null(want, "bad expected JSON: %s", jerr.text);
  char *g = got ? json_dumps(got, JSON_SORT_KEYS | JSON_COMPACT) : strdup("(null)");
  cr_expect(json_equal(got, want), "got %s, want %s", g, want_text);
  free(g);
  json_decref(want);
}

/* ---- defaults -------------------------------------------------------------------------------------- */

Test(config, defaults_from_home) {
  char **env = mkenv(home_env, NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect_null(err);
  char *state = fmt("%s/.local/state/agenthost", tmp);
  char *run = fmt("%s/.local/state/agenthost/run", tmp);
  cr_expect_str_eq(cfg.state_dir, state);
  cr_expect_str_eq(cfg.runtime_dir, run);
  cr_expect_str_eq(cfg.plugin_dir, AH_INSTALL_PLUGIN_DIR);
  cr_expect_eq(cfg.log_level, AH_LOG_INFO);
  cr_expect_str_eq(cfg.default_provider, "echo");
  cr_expect_null(cfg.file);
  char *want =
      fmt("{\"browser\": {\"enabled\": true, \"modes\": [\"serve\"], \"path\": \"%s/browser.so\"},"
          " \"remote\": {\"enabled\": true, \"modes\": [\"serve\"], \"path\": \"%s/remote.so\"},"
          " \"mcp\": {\"enabled\": true, \"modes\": [\"serve\", \"sdk\", \"acp\"], \"path\": \"%s/mcp.so\"}}",
          AH_INSTALL_PLUGIN_DIR, AH_INSTALL_PLUGIN_DIR, AH_INSTALL_PLUGIN_DIR);
  expect_json(cfg.plugins, want);
  expect_json(cfg.providers, "{\"echo\": {\"type\": \"echo\"}}");
  /* Defaults come first, in this order. */
  const char *first = json_object_iter_key(json_object_iter(cfg.plugins));
  cr_expect_str_eq(first, "browser");
  ah__config_free(&cfg);
  cr_expect_null(cfg.plugins);
  ah__config_free(&cfg); /* twice is harmless */
  free(want);
  free(state);
  free(run);
  freeenv(env);
}

Test(config, defaults_from_xdg) {
  char **env = mkenv(home_env, "XDG_STATE_HOME=/xdg/state/", "XDG_RUNTIME_DIR=/run/user/1000", NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.state_dir, "/xdg/state/agenthost");
  cr_expect_str_eq(cfg.runtime_dir, "/run/user/1000/agenthost");
  ah__config_free(&cfg);
  freeenv(env);
}

Test(config, relative_or_empty_xdg_is_ignored) {
  char **env = mkenv(home_env, "XDG_STATE_HOME=state", "XDG_RUNTIME_DIR=", "XDG_CONFIG_HOME=cfg", NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  char *state = fmt("%s/.local/state/agenthost", tmp);
  cr_expect_str_eq(cfg.state_dir, state);
  char *run = fmt("%s/run", state);
  cr_expect_str_eq(cfg.runtime_dir, run);
  ah__config_free(&cfg);
  free(state);
  free(run);
  freeenv(env);
}

Test(config, no_home_needs_state_dir) {
  char **env = mkenv("PATH=/usr/bin", NULL);
  ah_config cfg;
  char *err = NULL;
  int rc = ah__config_load(&cfg, NULL, env, &err);
  expect_error(rc, err, "state_dir", "HOME", NULL);
  cr_expect_null(cfg.plugins);

  ah_cli_overrides cli = {.state_dir = "/srv/ah"};
  err = NULL;
  cr_assert_eq(ah__config_load(&cfg, &cli, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.state_dir, "/srv/ah");
  cr_expect_str_eq(cfg.runtime_dir, "/srv/ah/run");
  ah__config_free(&cfg);
  freeenv(env);
}

Test(config, runtime_dir_follows_final_state_dir) {
  char **env = mkenv(home_env, "AGENTHOST_HOST_STATE_DIR=/from/env", NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.runtime_dir, "/from/env/run");
  ah__config_free(&cfg);
  freeenv(env);
}

Test(config, environ_is_default) {
  setenv("HOME", tmp, 1);
  unsetenv("XDG_STATE_HOME");
  unsetenv("XDG_CONFIG_HOME");
  setenv("AGENTHOST_HOST_LOG_LEVEL", "debug", 1);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, NULL, &err), 0, "%s", err);
  cr_expect_eq(cfg.log_level, AH_LOG_DEBUG);
  ah__config_free(&cfg);
}

/* ---- finding the file ------------------------------------------------------------------------------ */

Test(config, xdg_config_home_file) {
  char *dir = fmt("%s/cfg/agenthost", tmp);
  char *parent = fmt("%s/cfg", tmp);
  cr_assert_eq(mkdir(parent, 0700), 0);
  cr_assert_eq(mkdir(dir, 0700), 0);
  char *path = ts_write_file(dir, "agenthost.ini", "[host]\nlog_level = warn\n");
  char *xdg = fmt("XDG_CONFIG_HOME=%s", parent);
  char **env = mkenv(home_env, xdg, NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.file, path);
  cr_expect_eq(cfg.log_level, AH_LOG_WARN);
  ah__config_free(&cfg);
  freeenv(env);
  free(xdg);
  free(path);
  free(dir);
  free(parent);
}

Test(config, home_config_file) {
  char *c1 = fmt("%s/.config", tmp);
  char *dir = fmt("%s/.config/agenthost", tmp);
  cr_assert_eq(mkdir(c1, 0700), 0);
  cr_assert_eq(mkdir(dir, 0700), 0);
  char *path = ts_write_file(dir, "agenthost.ini", "[host]\nlog_level = error\n");
  char **env = mkenv(home_env, NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.file, path);
  cr_expect_eq(cfg.log_level, AH_LOG_ERROR);
  ah__config_free(&cfg);
  freeenv(env);
  free(path);
  free(dir);
  free(c1);
}

Test(config, agenthost_config_names_the_file) {
  char *path = ts_write_file(tmp, "other.ini", "[host]\ndefault_provider = echo\nlog_level = debug\n");
  char *var = fmt("AGENTHOST_CONFIG=%s", path);
  char **env = mkenv(home_env, var, NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.file, path);
  cr_expect_eq(cfg.log_level, AH_LOG_DEBUG);
  ah__config_free(&cfg);

  /* --config wins over AGENTHOST_CONFIG. */
  char *path2 = ts_write_file(tmp, "cli.ini", "[host]\nlog_level = error\n");
  ah_cli_overrides cli = {.config_file = path2};
  cr_assert_eq(ah__config_load(&cfg, &cli, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.file, path2);
  cr_expect_eq(cfg.log_level, AH_LOG_ERROR);
  ah__config_free(&cfg);
  freeenv(env);
  free(var);
  free(path);
  free(path2);
}

Test(config, missing_explicit_file_cli) {
  char *path = fmt("%s/nope.ini", tmp);
  ah_cli_overrides cli = {.config_file = path};
  char **env = mkenv(home_env, NULL);
  ah_config cfg;
  char *err = NULL;
  int rc = ah__config_load(&cfg, &cli, env, &err);
  expect_error(rc, err, "--config", path, "No such file", NULL);
  cli.config_file = "";
  err = NULL;
  rc = ah__config_load(&cfg, &cli, env, &err);
  expect_error(rc, err, "--config", NULL);
  freeenv(env);
  free(path);
}

Test(config, missing_explicit_file_env) {
  char *path = fmt("%s/nope.ini", tmp);
  char *var = fmt("AGENTHOST_CONFIG=%s", path);
  char **env = mkenv(home_env, var, NULL);
  ah_config cfg;
  char *err = NULL;
  int rc = ah__config_load(&cfg, NULL, env, &err);
  expect_error(rc, err, "AGENTHOST_CONFIG", path, "No such file", NULL);
  freeenv(env);
  free(var);
  free(path);
}

Test(config, explicit_file_that_is_a_directory) {
  ah_cli_overrides cli = {.config_file = tmp};
  char **env = mkenv(home_env, NULL);
  ah_config cfg;
  char *err = NULL;
  int rc = ah__config_load(&cfg, &cli, env, &err);
  expect_error(rc, err, "--config", tmp, "not a regular file", NULL);
  freeenv(env);
}

/* ---- the file -------------------------------------------------------------------------------------- */

Test(config, file_values) {
  const char *text = "; a comment\n"
                     "# another\n"
                     "[host]\n"
                     "state_dir = /var/lib/ah\n"
                     "runtime_dir = /run/ah\n"
                     "plugin_dir = /opt/ah/plugins\n"
                     "log_level = DEBUG\n"
                     "default_provider = claude\n"
                     "\n"
                     "[plugin.browser]\n"
                     "  listen = 0.0.0.0:8080 ; inline comment\n"
                     "  enabled = No\n"
                     "[plugin.my-tool]\n"
                     "enabled = YES\n"
                     "modes = serve , sdk,acp,sdk\n"
                     "path = /opt/x/tool.so\n"
                     "greeting = a;b=c\n"
                     "[provider.claude]\n"
                     "type = acp\n"
                     "command = /usr/bin/claude-agent --acp\n"
                     "[provider.acp]\n"
                     "command = other\n";
  ah_config cfg;
  char *err = NULL;
  char *path = NULL;
  cr_assert_eq(load_text(&cfg, text, &path, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.file, path);
  cr_expect_str_eq(cfg.state_dir, "/var/lib/ah");
  cr_expect_str_eq(cfg.runtime_dir, "/run/ah");
  cr_expect_str_eq(cfg.plugin_dir, "/opt/ah/plugins");
  cr_expect_eq(cfg.log_level, AH_LOG_DEBUG);
  cr_expect_str_eq(cfg.default_provider, "claude");
  expect_json(cfg.plugins,
              "{\"browser\": {\"enabled\": false, \"modes\": [\"serve\"], \"listen\": \"0.0.0.0:8080\","
              "  \"path\": \"/opt/ah/plugins/browser.so\"},"
              " \"remote\": {\"enabled\": true, \"modes\": [\"serve\"],"
              "  \"path\": \"/opt/ah/plugins/remote.so\"},"
              " \"mcp\": {\"enabled\": true, \"modes\": [\"serve\", \"sdk\", \"acp\"],"
              "  \"path\": \"/opt/ah/plugins/mcp.so\"},"
              " \"my-tool\": {\"enabled\": true, \"modes\": [\"serve\", \"sdk\", \"acp\"],"
              "  \"path\": \"/opt/x/tool.so\", \"greeting\": \"a;b=c\"}}");
  expect_json(cfg.providers, "{\"echo\": {\"type\": \"echo\"},"
                             " \"claude\": {\"type\": \"acp\", \"command\": \"/usr/bin/claude-agent --acp\"},"
                             " \"acp\": {\"type\": \"acp\", \"command\": \"other\"}}");
  ah__config_free(&cfg);
  free(path);
}

Test(config, indented_lines_are_not_continuations) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, "[host]\n  log_level = debug\n    default_provider = echo\n", NULL, &err), 0,
               "%s", err);
  cr_expect_eq(cfg.log_level, AH_LOG_DEBUG);
  cr_expect_str_eq(cfg.default_provider, "echo");
  ah__config_free(&cfg);
}

Test(config, bom_and_crlf) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(
      load_text(&cfg, "\xef\xbb\xbf[plugin.idle]\r\nnote = hi\r\n[host]\r\nlog_level = warn\r\n", NULL, &err),
      0, "%s", err);
  cr_expect_eq(cfg.log_level, AH_LOG_WARN);
  cr_expect_str_eq(plugin_str(&cfg, "idle", "note"), "hi");
  ah__config_free(&cfg);
}

Test(config, empty_section_names_a_plugin) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, "[plugin.idle]\n", NULL, &err), 0, "%s", err);
  char *want =
      fmt("{\"enabled\": false, \"modes\": [\"serve\"], \"path\": \"%s/idle.so\"}", AH_INSTALL_PLUGIN_DIR);
  expect_json(json_object_get(cfg.plugins, "idle"), want);
  free(want);
  ah__config_free(&cfg);
}

Test(config, duplicate_keys_last_wins) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg,
                         "[host]\nlog_level = debug\nlog_level = error\n"
                         "[plugin.x]\na = 1\n[host]\n[plugin.x]\na = 2\nenabled = true\nenabled = false\n",
                         NULL, &err),
               0, "%s", err);
  cr_expect_eq(cfg.log_level, AH_LOG_ERROR);
  cr_expect_str_eq(plugin_str(&cfg, "x", "a"), "2");
  cr_expect(json_is_false(plugin_val(&cfg, "x", "enabled")));
  /* Order of first mention: defaults, then x. */
  void *it = json_object_iter(cfg.plugins);
  it = json_object_iter_next(cfg.plugins,
                             json_object_iter_next(cfg.plugins, json_object_iter_next(cfg.plugins, it)));
  cr_expect_str_eq(json_object_iter_key(it), "x");
  ah__config_free(&cfg);
}

Test(config, bool_spellings) {
  const char *yes[] = {"true", "TRUE", "yes", "On", "1"};
  const char *no[] = {"false", "No", "OFF", "0"};
  for (size_t i = 0; i < 5 + 4; i++) {
    const char *v = i < 5 ? yes[i] : no[i - 5];
    char *text = fmt("[plugin.x]\nenabled = %s\n", v);
    ah_config cfg;
    char *err = NULL;
    cr_assert_eq(load_text(&cfg, text, NULL, &err), 0, "%s", err);
    cr_expect_eq(json_is_true(plugin_val(&cfg, "x", "enabled")), i < 5, "value %s", v);
    ah__config_free(&cfg);
    free(text);
  }
}

/* ---- precedence ------------------------------------------------------------------------------------ */

static void precedence_case(bool with_env, bool with_cli, const char *want_state, ah_log_level want_level,
                            const char *want_listen, const char *want_token) {
  char *path = ts_write_file(tmp, "p.ini",
                             "[host]\nstate_dir = /file/state\nlog_level = error\n"
                             "[plugin.browser]\nlisten = file:1\ntoken_file = /file/token\n");
  char *cfgvar = fmt("AGENTHOST_CONFIG=%s", path);
  char **env = with_env ? mkenv(home_env, cfgvar, "AGENTHOST_HOST_STATE_DIR=/env/state",
                                "AGENTHOST_HOST_LOG_LEVEL=warn", "AGENTHOST_PLUGIN_BROWSER_LISTEN=env:2",
                                "AGENTHOST_PLUGIN_BROWSER_TOKEN_FILE=/env/token", NULL)
                        : mkenv(home_env, cfgvar, NULL);
  ah_cli_overrides cli = {0};
  if (with_cli)
    cli = (ah_cli_overrides){
        .state_dir = "/cli/state", .log_level = "debug", .listen = "cli:3", .token_file = "/cli/token"};
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, &cli, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.state_dir, want_state);
  cr_expect_eq(cfg.log_level, want_level);
  cr_expect_str_eq(plugin_str(&cfg, "browser", "listen"), want_listen);
  cr_expect_str_eq(plugin_str(&cfg, "browser", "token_file"), want_token);
  ah__config_free(&cfg);
  freeenv(env);
  free(cfgvar);
  free(path);
}

Test(config, precedence_file_over_defaults) {
  precedence_case(false, false, "/file/state", AH_LOG_ERROR, "file:1", "/file/token");
}

Test(config, precedence_env_over_file) {
  precedence_case(true, false, "/env/state", AH_LOG_WARN, "env:2", "/env/token");
}

Test(config, precedence_cli_over_env) {
  precedence_case(true, true, "/cli/state", AH_LOG_DEBUG, "cli:3", "/cli/token");
}

Test(config, precedence_cli_over_file) {
  precedence_case(false, true, "/cli/state", AH_LOG_DEBUG, "cli:3", "/cli/token");
}

Test(config, cli_dirs) {
  char **env = mkenv(home_env, "AGENTHOST_HOST_RUNTIME_DIR=/env/run", NULL);
  ah_cli_overrides cli = {.runtime_dir = "/cli/run", .plugin_dir = "/cli/plugins"};
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, &cli, env, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.runtime_dir, "/cli/run");
  cr_expect_str_eq(cfg.plugin_dir, "/cli/plugins");
  cr_expect_str_eq(plugin_str(&cfg, "remote", "path"), "/cli/plugins/remote.so");
  ah__config_free(&cfg);
  freeenv(env);
}

Test(config, env_overrides_file_plugin) {
  char *path = ts_write_file(tmp, "p.ini", "[plugin.browser]\nenabled = false\nmodes = serve\n");
  char *cfgvar = fmt("AGENTHOST_CONFIG=%s", path);
  char **env = mkenv(home_env, cfgvar, "AGENTHOST_PLUGIN_BROWSER_ENABLED=on",
                     "AGENTHOST_PLUGIN_BROWSER_MODES=sdk, serve", NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect(json_is_true(plugin_val(&cfg, "browser", "enabled")));
  expect_json(plugin_val(&cfg, "browser", "modes"), "[\"sdk\", \"serve\"]");
  ah__config_free(&cfg);
  freeenv(env);
  free(cfgvar);
  free(path);
}

/* ---- the environment ------------------------------------------------------------------------------- */

Test(config, env_creates_plugin_and_provider) {
  char **env = mkenv(home_env, "AGENTHOST_PLUGIN_FOO_ENABLED=1", "AGENTHOST_PLUGIN_FOO_MODES=acp",
                     "AGENTHOST_PLUGIN_FOO_API_URL=http://x", "AGENTHOST_PROVIDER_GPT_TYPE=openai",
                     "AGENTHOST_PROVIDER_GPT_API_KEY=sk-123", "AGENTHOST_HOST_DEFAULT_PROVIDER=gpt", NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  char *want =
      fmt("{\"enabled\": true, \"modes\": [\"acp\"], \"api_url\": \"http://x\", \"path\": \"%s/foo.so\"}",
          AH_INSTALL_PLUGIN_DIR);
  expect_json(json_object_get(cfg.plugins, "foo"), want);
  expect_json(json_object_get(cfg.providers, "gpt"), "{\"type\": \"openai\", \"api_key\": \"sk-123\"}");
  cr_expect_str_eq(cfg.default_provider, "gpt");
  ah__config_free(&cfg);
  free(want);
  freeenv(env);
}

Test(config, env_hyphenated_name_known_from_file) {
  char *path = ts_write_file(tmp, "p.ini", "[plugin.my-ui]\n");
  char *cfgvar = fmt("AGENTHOST_CONFIG=%s", path);
  char **env = mkenv(home_env, cfgvar, "AGENTHOST_PLUGIN_MY_UI_TOKEN_FILE=/t",
                     "AGENTHOST_PLUGIN_MY_UI_ENABLED=yes", NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect_str_eq(plugin_str(&cfg, "my-ui", "token_file"), "/t");
  cr_expect(json_is_true(plugin_val(&cfg, "my-ui", "enabled")));
  cr_expect_null(json_object_get(cfg.plugins, "my"));
  ah__config_free(&cfg);
  freeenv(env);
  free(cfgvar);
  free(path);
}

Test(config, env_unknown_hyphenated_name_splits_at_first_underscore) {
  char **env = mkenv(home_env, "AGENTHOST_PLUGIN_MY_UI_ENABLED=yes", NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  cr_expect_str_eq(plugin_str(&cfg, "my", "ui_enabled"), "yes");
  cr_expect(json_is_false(plugin_val(&cfg, "my", "enabled")));
  ah__config_free(&cfg);
  freeenv(env);
}

Test(config, env_ambiguous_name_refused) {
  char *path = ts_write_file(tmp, "p.ini", "[plugin.my]\n[plugin.my-ui]\n");
  char *cfgvar = fmt("AGENTHOST_CONFIG=%s", path);
  char **env = mkenv(home_env, cfgvar, "AGENTHOST_PLUGIN_MY_UI_X=1", NULL);
  ah_config cfg;
  char *err = NULL;
  int rc = ah__config_load(&cfg, NULL, env, &err);
  expect_error(rc, err, "AGENTHOST_PLUGIN_MY_UI_X", "ambiguous", "\"my\"", "\"my-ui\"", NULL);
  freeenv(env);
  free(cfgvar);
  free(path);
}

Test(config, env_malformed_refused) {
  const char *bad[] = {"AGENTHOST_PLUGIN_FOO=1", "AGENTHOST_PLUGIN_=1", "AGENTHOST_PLUGIN_FOO_=1",
                       "AGENTHOST_PROVIDER_X=1", "AGENTHOST_PLUGIN_9X_A=1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char **env = mkenv(home_env, bad[i], NULL);
    char var[64];
    snprintf(var, sizeof var, "%.*s:", (int)(strchr(bad[i], '=') - bad[i]), bad[i]);
    ah_config cfg;
    char *err = NULL;
    int rc = ah__config_load(&cfg, NULL, env, &err);
    expect_error(rc, err, var, NULL);
    freeenv(env);
  }
}

Test(config, env_bad_values) {
  struct {
    const char *entry;
    const char *frag;
  } cases[] = {
      {"AGENTHOST_HOST_LOG_LEVEL=loud", "AGENTHOST_HOST_LOG_LEVEL: unknown log level \"loud\""},
      {"AGENTHOST_PLUGIN_BROWSER_ENABLED=maybe", "AGENTHOST_PLUGIN_BROWSER_ENABLED: not a boolean \"maybe\""},
      {"AGENTHOST_HOST_STATE_DIR=rel/dir", "AGENTHOST_HOST_STATE_DIR: must be an absolute path"},
      {"AGENTHOST_HOST_PLUGIN_DIR=", "AGENTHOST_HOST_PLUGIN_DIR: must be an absolute path"},
      {"AGENTHOST_PLUGIN_BROWSER_MODES=serve,web", "AGENTHOST_PLUGIN_BROWSER_MODES: unknown mode \"web\""},
      {"AGENTHOST_PLUGIN_BROWSER_LISTEN=a\x1b[2Jb",
       "AGENTHOST_PLUGIN_BROWSER_LISTEN: value contains a control"},
      {"AGENTHOST_PLUGIN_BROWSER_LISTEN=\xff",
       "AGENTHOST_PLUGIN_BROWSER_LISTEN: value contains invalid UTF-8"},
      {"AGENTHOST_PROVIDER_X_TYPE=Magic!", "AGENTHOST_PROVIDER_X_TYPE: bad provider type \"Magic!\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char **env = mkenv(home_env, cases[i].entry, NULL);
    ah_config cfg;
    char *err = NULL;
    int rc = ah__config_load(&cfg, NULL, env, &err);
    expect_error(rc, err, cases[i].frag, NULL);
    freeenv(env);
  }
}

Test(config, env_unknown_variables_warned) {
  char **env = mkenv(home_env, "AGENTHOST_HOST_COLOUR=crimson", "AGENTHOST_FROB=1", "AGENTHOST_host_x=1",
                     "AGENTHOST_HOST_SECRET_KEY=hunter2", NULL);
  capture c = capture_start();
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  char *log = capture_end(&c);
  cr_expect_not_null(strstr(log, "WARN config: AGENTHOST_HOST_COLOUR: unknown key ignored"), "%s", log);
  cr_expect_not_null(strstr(log, "AGENTHOST_FROB: not a configuration variable"), "%s", log);
  cr_expect_not_null(strstr(log, "AGENTHOST_host_x: not a configuration variable"), "%s", log);
  cr_expect_not_null(strstr(log, "AGENTHOST_HOST_SECRET_KEY: unknown key ignored"), "%s", log);
  cr_expect_null(strstr(log, "crimson"), "%s", log);
  cr_expect_null(strstr(log, "hunter2"), "%s", log);
  ah__config_free(&cfg);
  free(log);
  freeenv(env);
}

/* AGENTHOST_BIN belongs to the client libraries (the program they spawn): the host does not warn of it. */
Test(config, env_the_clients_variable_is_not_warned) {
  char **env = mkenv(home_env, "AGENTHOST_BIN=/opt/agenthost/bin/agenthost", "AGENTHOST_FROB=1", NULL);
  capture c = capture_start();
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  char *log = capture_end(&c);
  cr_expect_null(strstr(log, "AGENTHOST_BIN"), "%s", log);
  cr_expect_not_null(strstr(log, "AGENTHOST_FROB: not a configuration variable"), "the check still runs: %s",
                     log);
  ah__config_free(&cfg);
  free(log);
  freeenv(env);
}

/* ---- the command line ------------------------------------------------------------------------------ */

Test(config, cli_bad_values) {
  struct {
    ah_cli_overrides cli;
    const char *frag;
  } cases[] = {
      {{.state_dir = "relative"}, "--state-dir: must be an absolute path, got \"relative\""},
      {{.runtime_dir = "~/run"}, "--runtime-dir: must be an absolute path"},
      {{.plugin_dir = ""}, "--plugin-dir: must be an absolute path, got an empty value"},
      {{.log_level = "verbose"}, "--log-level: unknown log level \"verbose\""},
      {{.listen = "x\ny"}, "--listen: value contains a control character"},
  };
  char **env = mkenv(home_env, NULL);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ah_config cfg;
    char *err = NULL;
    int rc = ah__config_load(&cfg, &cases[i].cli, env, &err);
    expect_error(rc, err, cases[i].frag, NULL);
  }
  freeenv(env);
}

/* ---- bad values in the file: each names FILE:LINE, the section and the key ------------------------- */

static void file_error_case(const char *text, const char *line_and_key, const char *reason) {
  ah_config cfg;
  char *err = NULL;
  char *path = NULL;
  int rc = load_text(&cfg, text, &path, &err);
  char *where = fmt("%s:%s", path, line_and_key);
  expect_error(rc, err, where, reason, NULL);
  cr_expect_null(cfg.plugins);
  free(where);
  free(path);
}

Test(config, bad_bool) {
  file_error_case("[host]\n\n[plugin.browser]\nenabled = maybe\n",
                  "4: [plugin.browser] enabled: ", "not a boolean \"maybe\"");
  file_error_case("[plugin.browser]\nenabled =\n", "2: [plugin.browser] enabled: ", "not a boolean");
}

Test(config, bad_log_level) {
  file_error_case("[host]\nlog_level = verbose\n", "2: [host] log_level: ", "unknown log level \"verbose\"");
}

Test(config, relative_paths) {
  file_error_case("[host]\nstate_dir = ~/state\n", "2: [host] state_dir: ", "must be an absolute path");
  file_error_case("[host]\nruntime_dir = run\n", "2: [host] runtime_dir: ", "must be an absolute path");
  file_error_case("[host]\nplugin_dir = ./p\n", "2: [host] plugin_dir: ", "must be an absolute path");
  file_error_case("[plugin.x]\nenabled = 1\npath = x.so\n",
                  "3: [plugin.x] path: ", "must be an absolute path");
}

Test(config, unknown_mode) {
  file_error_case("[plugin.x]\nmodes = serve, web\n", "2: [plugin.x] modes: ", "unknown mode \"web\"");
  file_error_case("[plugin.x]\nmodes = serve,,sdk\n", "2: [plugin.x] modes: ", "unknown mode \"\"");
  file_error_case("[plugin.x]\nmodes =\n", "2: [plugin.x] modes: ", "unknown mode");
  file_error_case("[plugin.x]\nmodes = SERVE\n", "2: [plugin.x] modes: ", "unknown mode \"SERVE\"");
}

Test(config, bad_provider) {
  file_error_case("[provider.p]\ntype = Magic!\n", "2: [provider.p] type: ", "bad provider type \"Magic!\"");
  file_error_case("\n[provider.p]\ncommand = x\n", "2: [provider.p]: ", "provider \"p\" needs type");
  file_error_case("[host]\ndefault_provider = nobody\n",
                  "2: [host] default_provider: ", "no provider named \"nobody\"");
  file_error_case("[host]\ndefault_provider = No Body\n",
                  "2: [host] default_provider: ", "bad provider name");
}

Test(config, provider_named_after_type) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(
      load_text(&cfg, "[provider.openai]\nmodel = m\n[host]\ndefault_provider = openai\n", NULL, &err), 0,
      "%s", err);
  expect_json(json_object_get(cfg.providers, "openai"), "{\"type\": \"openai\", \"model\": \"m\"}");
  ah__config_free(&cfg);
}

Test(config, bad_key_names) {
  file_error_case("[plugin.x]\nBad Key = 1\n", "2: [plugin.x] Bad Key: ", "bad key name");
  file_error_case("[provider.acp]\nmy-key = 1\n", "2: [provider.acp] my-key: ", "bad key name");
}

/* Plugin and provider names that could reach a path or a terminal are refused at their line. */
Test(config, hostile_plugin_names) {
  const char *sections[] = {"plugin.my plugin",
                            "plugin.a/b",
                            "plugin...",
                            "plugin../../etc",
                            "plugin.Browser",
                            "plugin.",
                            "plugin",
                            "plugin.-x",
                            "plugin.x_y",
                            "provider.a b",
                            "provider.../x",
                            "provider.",
                            "plugin.\xc3\xa9t\xc3\xa9",
                            "plugin.aaaaaaaaaabbbbbbbbbbccccccccccddddddddddeeee"};
  for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
    char *text = fmt("[host]\n[%s]\nenabled = true\n", sections[i]);
    ah_config cfg;
    char *err = NULL;
    char *path = NULL;
    int rc = load_text(&cfg, text, &path, &err);
    char *where = fmt("%s:2: [", path);
    bool long_name = strlen(sections[i]) > 49;
    expect_error(rc, err, where, long_name ? "too long" : "name (expected [a-z][a-z0-9-]*", NULL);
    free(where);
    free(path);
    free(text);
  }
}

Test(config, control_characters_in_a_section_refused) {
  ah_config cfg;
  char *err = NULL;
  int rc = load_text(&cfg, "[plugin.\x1b]0;pwn\x07]\n", NULL, &err);
  /* The control characters are refused before the section is even looked at. */
  expect_error(rc, err, ":1: control character", NULL);
}

Test(config, unknown_section_warned) {
  capture c = capture_start();
  ah_config cfg;
  char *err = NULL;
  char *path = NULL;
  cr_assert_eq(load_text(&cfg,
                         "[host]\nlog_level = warn\n\n[server]\nport = 1\n[plugins]\n[Host]\nlog_level = x\n",
                         &path, &err),
               0, "%s", err);
  char *log = capture_end(&c);
  char *w1 = fmt("WARN config: %s:4: [server]: unknown section ignored", path);
  char *w2 = fmt("%s:6: [plugins]: unknown section ignored", path);
  char *w3 = fmt("%s:7: [Host]: unknown section ignored", path);
  cr_expect_not_null(strstr(log, w1), "%s", log);
  cr_expect_not_null(strstr(log, w2), "%s", log);
  cr_expect_not_null(strstr(log, w3), "%s", log);
  cr_expect_eq(cfg.log_level, AH_LOG_WARN);
  ah__config_free(&cfg);
  free(w1);
  free(w2);
  free(w3);
  free(log);
  free(path);
}

Test(config, unknown_host_key_warned_without_value) {
  capture c = capture_start();
  ah_config cfg;
  char *err = NULL;
  char *path = NULL;
  cr_assert_eq(load_text(&cfg, "[host]\ncolour = crimson\napi_token = s3cr3t-value\n", &path, &err), 0, "%s",
               err);
  char *log = capture_end(&c);
  char *w1 = fmt("WARN config: %s:2: [host] colour: unknown key ignored\n", path);
  char *w2 = fmt("WARN config: %s:3: [host] api_token: unknown key ignored\n", path);
  cr_expect_not_null(strstr(log, w1), "%s", log);
  cr_expect_not_null(strstr(log, w2), "%s", log);
  cr_expect_null(strstr(log, "s3cr3t"), "%s", log);
  cr_expect_null(strstr(log, "crimson"), "%s", log);
  ah__config_free(&cfg);
  free(w1);
  free(w2);
  free(log);
  free(path);
}

Test(config, key_outside_section_warned) {
  capture c = capture_start();
  ah_config cfg;
  char *err = NULL;
  char *path = NULL;
  cr_assert_eq(load_text(&cfg, "stray = 1\n[host]\n", &path, &err), 0, "%s", err);
  char *log = capture_end(&c);
  char *w = fmt("%s:1: key stray outside any section ignored", path);
  cr_expect_not_null(strstr(log, w), "%s", log);
  ah__config_free(&cfg);
  free(w);
  free(log);
  free(path);
}

/* ---- syntax and hostile files ---------------------------------------------------------------------- */

Test(config, ini_syntax_error) {
  file_error_case("[host]\nlog_level = info\nthis is not a pair\n", "3: ", "syntax error");
  /* inih stays in [host] after the broken header; the warning that would give is not logged. */
  capture c = capture_start();
  file_error_case("[host]\n[plugin.x\nenabled = 1\n", "2: ", "syntax error");
  char *log = capture_end(&c);
  cr_expect_str_eq(log, "");
  free(log);
}

Test(config, first_error_in_file_order) {
  /* A syntax error on line 2 is reported, not the bad value on line 4. */
  file_error_case("[host]\nnot a pair\n[plugin.x]\nenabled = perhaps\n", "2: ", "syntax error");
  /* And a bad value before a syntax error is the one reported. */
  file_error_case("[plugin.x]\nenabled = perhaps\nnot a pair\n", "2: [plugin.x] enabled: ", "not a boolean");
}

/* A value longer than libinih's 197-byte line buffer is read whole (#17): 64 KiB with an inline comment
 * and trailing blanks, after a longer comment line, with ':' as the delimiter; the pairs around it and the
 * line numbers of later errors are right. */
Test(config, values_of_64_kib_are_read_whole) {
  size_t n = 64 * 1024;
  char *value = malloc(n + 1);
  cr_assert_not_null(value);
  for (size_t i = 0; i < n; i++)
    value[i] = "abc def;x"[i % 9]; /* ';' after a letter is not a comment */
  value[n] = '\0';
  char *comment = malloc(n + 1);
  memset(comment, 'c', n);
  comment[n] = '\0';
  char *text =
      fmt("[plugin.x]\n; %s\nblob = %s   ; the comment\t \nshort = s\nother : %s\n", comment, value, value);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, text, NULL, &err), 0, "%s", err);
  cr_expect_eq(strlen(plugin_str(&cfg, "x", "blob")), n);
  cr_expect_str_eq(plugin_str(&cfg, "x", "blob"), value);
  cr_expect_str_eq(plugin_str(&cfg, "x", "other"), value);
  cr_expect_str_eq(plugin_str(&cfg, "x", "short"), "s");
  ah__config_free(&cfg);
  free(text);
  /* A bad value after the long lines is reported at its own line. */
  text = fmt("[plugin.x]\nblob = %s\nenabled = perhaps\n", value);
  file_error_case(text, "3: [plugin.x] enabled: ", "not a boolean");
  free(text);
  /* A host key's long value reaches its check: a relative state_dir is refused with its line. */
  text = fmt("[host]\nstate_dir = relative/%s\n", value);
  file_error_case(text, "2: [host] state_dir: ", "absolute");
  free(text);
  free(value);
  free(comment);
}

/* A megabyte value is read too (the file's 4 MiB is the limit); a long line that is not a key = value is
 * refused at its line. */
Test(config, megabyte_line) {
  size_t n = 1024 * 1024;
  char *text = malloc(n + 64);
  cr_assert_not_null(text);
  strcpy(text, "[plugin.x]\nblob = ");
  size_t off = strlen(text);
  memset(text + off, 'v', n);
  strcpy(text + off + n, "\nenabled = 1\n");
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, text, NULL, &err), 0, "%s", err);
  cr_expect_eq(strlen(plugin_str(&cfg, "x", "blob")), n);
  ah__config_free(&cfg);
  memset(text + strlen("[plugin.x]\n"), 'w', 1000); /* "wwww…" with no '=' before the value's v's */
  memcpy(text + strlen("[plugin.x]\n") + 1000, "vvv", 3);
  file_error_case(text, "2: ", "line too long");
  free(text);
}

Test(config, long_but_acceptable_line) {
  char value[150];
  memset(value, 'a', sizeof value - 1);
  value[sizeof value - 1] = '\0';
  char *text = fmt("[plugin.x]\nblob = /%s\n", value);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, text, NULL, &err), 0, "%s", err);
  cr_expect_eq(strlen(plugin_str(&cfg, "x", "blob")), sizeof value);
  ah__config_free(&cfg);
  free(text);
}

Test(config, nul_byte) {
  static const char data[] = "[host]\nlog_level = in\0fo\n";
  char *path = write_bytes(tmp, "nul.ini", data, sizeof data - 1);
  ah_cli_overrides cli = {.config_file = path};
  char **env = mkenv(home_env, NULL);
  ah_config cfg;
  char *err = NULL;
  char *where = fmt("%s:2: NUL byte", path);
  int rc = ah__config_load(&cfg, &cli, env, &err);
  expect_error(rc, err, where, NULL);
  free(where);
  freeenv(env);
  free(path);
}

Test(config, invalid_utf8) {
  file_error_case("[plugin.x]\nname = caf\xc3\n", "2: ", "invalid UTF-8");
  file_error_case("[plugin.x]\n\nname = \xed\xa0\x80\n", "3: ", "invalid UTF-8");
  file_error_case("[plugin.x]\nname = a\rb\n", "2: ", "control character");
  /* Valid UTF-8 values are kept as they are. */
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, "[plugin.x]\nname = caf\xc3\xa9 \xf0\x9f\x98\x80\n", NULL, &err), 0, "%s",
               err);
  cr_expect_str_eq(plugin_str(&cfg, "x", "name"), "caf\xc3\xa9 \xf0\x9f\x98\x80");
  ah__config_free(&cfg);
}

Test(config, empty_file) {
  ah_config cfg;
  char *err = NULL;
  char *path = NULL;
  cr_assert_eq(load_text(&cfg, "", &path, &err), 0, "%s", err);
  cr_expect_str_eq(cfg.file, path);
  cr_expect_eq(json_object_size(cfg.plugins), 3, "browser, remote and mcp");
  ah__config_free(&cfg);
  free(path);
}

/* ---- plugins_for_mode ------------------------------------------------------------------------------ */

Test(config, plugins_for_mode) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg,
                         "[plugin.acp]\nenabled = true\nmodes = acp\n"
                         "[plugin.sdk]\nenabled = true\nmodes = sdk, serve\n"
                         "[plugin.off]\nmodes = serve\n"
                         "[plugin.browser]\nmodes = serve,sdk\n"
                         "[plugin.remote]\nenabled = off\n",
                         NULL, &err),
               0, "%s", err);
  json_t *serve = ah__config_plugins_for_mode(&cfg, "serve");
  json_t *sdk = ah__config_plugins_for_mode(&cfg, "sdk");
  json_t *acp = ah__config_plugins_for_mode(&cfg, "acp");
  json_t *web = ah__config_plugins_for_mode(&cfg, "web");
  expect_json(serve, "[\"browser\", \"mcp\", \"sdk\"]");
  expect_json(sdk, "[\"browser\", \"mcp\", \"sdk\"]");
  expect_json(acp, "[\"mcp\", \"acp\"]");
  expect_json(web, "[]");
  json_decref(serve);
  json_decref(sdk);
  json_decref(acp);
  json_decref(web);
  ah__config_free(&cfg);
}

Test(config, a_provider_type_names_the_plugin_that_provides_it) {
  /* Any plugin may provide a type: a valid name is accepted, and its plugin is wanted in every mode. */
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, "[provider.fast]\ntype = bench-stream\n", NULL, &err), 0, "%s", err);
  json_t *acp = ah__config_plugins_for_mode(&cfg, "acp");
  expect_json(acp, "[\"mcp\", \"bench-stream\"]");
  json_decref(acp);
  ah__config_free(&cfg);
}

Test(config, plugins_for_mode_adds_the_plugin_of_each_provider_type) {
  /* A provider of type acp is served by the acp plugin: it is wanted in every mode, once, after the
   * enabled plugins; echo needs no plugin. */
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg,
                         "[plugin.sdk]\nenabled = true\nmodes = sdk\n"
                         "[provider.one]\ntype = acp\ncommand = a\n"
                         "[provider.two]\ntype = acp\ncommand = b\n"
                         "[provider.quiet]\ntype = echo\n",
                         NULL, &err),
               0, "%s", err);
  json_t *sdk = ah__config_plugins_for_mode(&cfg, "sdk");
  json_t *serve = ah__config_plugins_for_mode(&cfg, "serve");
  json_t *acp = ah__config_plugins_for_mode(&cfg, "acp");
  expect_json(sdk, "[\"mcp\", \"sdk\", \"acp\"]");
  expect_json(serve, "[\"browser\", \"remote\", \"mcp\", \"acp\"]");
  expect_json(acp, "[\"mcp\", \"acp\"]");
  json_decref(sdk);
  json_decref(serve);
  json_decref(acp);
  ah__config_free(&cfg);
}

Test(config, plugins_for_mode_defaults) {
  char **env = mkenv(home_env, NULL);
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(ah__config_load(&cfg, NULL, env, &err), 0, "%s", err);
  json_t *serve = ah__config_plugins_for_mode(&cfg, "serve");
  json_t *sdk = ah__config_plugins_for_mode(&cfg, "sdk");
  expect_json(serve, "[\"browser\", \"remote\", \"mcp\"]");
  expect_json(sdk, "[\"mcp\"]"); /* the MCP client is wanted in every mode */
  json_decref(serve);
  json_decref(sdk);
  ah__config_free(&cfg);
  json_t *none = ah__config_plugins_for_mode(&cfg, "serve");
  expect_json(none, "[]");
  json_decref(none);
  freeenv(env);
}

/* Each of `values` of [host] `key` loads and is what `field` of the configuration holds; `dflt` when the
 * key is absent. */
static void host_values(const char *key, const char *const *values, size_t n, const char *dflt,
                        char *(*field)(ah_config *)) {
  for (size_t i = 0; i < n; i++) {
    ah_config cfg;
    char *path = NULL;
    char *err = NULL;
    char text[128];
    snprintf(text, sizeof text, "[host]\n%s = %s\n", key, values[i]);
    cr_assert_eq(load_text(&cfg, text, &path, &err), 0, "%s", err ? err : "");
    cr_assert_str_eq(field(&cfg), values[i]);
    ah__config_free(&cfg);
    free(path);
  }
  ah_config cfg;
  char *path = NULL;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, "[host]\n", &path, &err), 0);
  cr_assert_str_eq(field(&cfg), dflt, "the default");
  ah__config_free(&cfg);
  free(path);
}

static char *synchronous_of(ah_config *c) {
  return c->synchronous;
}

static char *default_mode_of(ah_config *c) {
  return c->default_mode;
}

Test(config, synchronous_modes) {
  const char *modes[] = {"off", "normal", "full"};
  host_values("synchronous", modes, 3, "normal", synchronous_of);
  file_error_case("[host]\nsynchronous = sometimes\n", "2: [host] synchronous: ", "unknown synchronous mode");
}

/* [host] default_mode: a new session's mode (docs/sessions.md "Modes"); ask by default; others refused. */
Test(config, default_mode) {
  const char *modes[] = {"ask", "accept_edits", "read_only"};
  host_values("default_mode", modes, 3, "ask", default_mode_of);
  file_error_case("[host]\ndefault_mode = yolo\n", "2: [host] default_mode: ", "unknown mode");
}

/* [host] idle_unload_s: seconds (a fraction allowed) after which an idle session leaves memory; 0 = never;
 * unset = the default (0 in the configuration: the sessions apply 15 minutes). */
Test(config, idle_unload_s) {
  const struct {
    const char *text;
    uint64_t ms;
  } ok[] = {{"0.2", 200}, {"900", 900000}, {"0.001", 1}, {"31536000", 31536000000ull}, {"0", UINT64_MAX}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    ah_config cfg;
    char *err = NULL;
    char text[96];
    snprintf(text, sizeof text, "[host]\nidle_unload_s = %s\n", ok[i].text);
    cr_assert_eq(load_text(&cfg, text, NULL, &err), 0, "%s: %s", ok[i].text, err ? err : "");
    cr_expect_eq(cfg.idle_unload_ms, ok[i].ms, "%s → %llu", ok[i].text,
                 (unsigned long long)cfg.idle_unload_ms);
    ah__config_free(&cfg);
  }
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, "[host]\n", NULL, &err), 0);
  cr_expect_eq(cfg.idle_unload_ms, 0, "unset: the sessions' default");
  ah__config_free(&cfg);
  const char *bad[] = {"-1", "soon", "", "1e9", "0.0001", "nan", "inf", "12s", "0x10"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[96];
    snprintf(text, sizeof text, "[host]\nidle_unload_s = %s\n", bad[i]);
    file_error_case(text, "2: [host] idle_unload_s: ", "must be a number of seconds from 0.001 to 31536000");
  }
}

/* [host] lease_ttl_ms: whole milliseconds from 300 to 3600000; unset = 0 (the sessions apply 30000). */
Test(config, lease_ttl_ms) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, "[host]\nlease_ttl_ms = 2000\n", NULL, &err), 0, "%s", err ? err : "");
  cr_expect_eq(cfg.lease_ttl_ms, 2000);
  ah__config_free(&cfg);
  cr_assert_eq(load_text(&cfg, "[host]\n", NULL, &err), 0);
  cr_expect_eq(cfg.lease_ttl_ms, 0, "unset: the sessions' default");
  ah__config_free(&cfg);
  const char *bad[] = {"299", "3600001", "-1", "2s", "", "1.5", "0x100"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[96];
    snprintf(text, sizeof text, "[host]\nlease_ttl_ms = %s\n", bad[i]);
    file_error_case(text,
                    "2: [host] lease_ttl_ms: ", "must be a whole number of milliseconds from 300 to 3600000");
  }
}

/* [host] store_url, store_password_file, store_password: a connection string never holds a password (the
 * refusal never quotes it), the file is read when the store is opened, the password from the environment
 * wins; without store_url the store is SQLite in the state directory. */
Test(config, the_shared_store_keys) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg, "[host]\n", NULL, &err), 0);
  ah_store_opts o = {0};
  const ah_store_backend *be = NULL;
  char path[4096], *password = NULL, *why = NULL;
  cr_assert_eq(ah__config_store(&cfg, &o, &be, path, sizeof path, &password, &why), 0);
  cr_expect_eq(be, &ah__store_sqlite);
  cr_expect(o.path && strstr(o.path, "/agenthost.db"), "%s", o.path ? o.path : "(null)");
  cr_expect_null(password);
  ah__config_free(&cfg);
  const char *refused[] = {"host=db password=SECRET-CANARY", "postgresql://u:SECRET-CANARY@db/x",
                           "host=db PassWord=SECRET-CANARY"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    char text[200];
    snprintf(text, sizeof text, "[host]\nstore_url = %s\n", refused[i]);
    cr_expect_neq(load_text(&cfg, text, NULL, &err), 0, "accepted: %s", refused[i]);
    cr_expect(err && strstr(err, "must not hold a password") && !strstr(err, "CANARY"), "%s", err ? err : "");
    free(err);
    err = NULL;
  }
  file_error_case("[host]\nstore_password_file = relative/pw\n",
                  "2: [host] store_password_file: ", "absolute");
  char *pw = ts_write_file(tmp, "pw", "from-the-file\nsecond line\n");
  char *text = fmt("[host]\nstore_url = host=127.0.0.1 dbname=x\nstore_password_file = %s\n", pw);
  cr_assert_eq(load_text(&cfg, text, NULL, &err), 0, "%s", err ? err : "");
#ifdef AH_HAVE_POSTGRESQL
  cr_assert_eq(ah__config_store(&cfg, &o, &be, path, sizeof path, &password, &why), 0, "%s", why ? why : "");
  cr_expect_eq(be, &ah__store_pg);
  cr_expect_str_eq(o.url, "host=127.0.0.1 dbname=x");
  cr_expect_null(o.path);
  cr_expect_str_eq(password, "from-the-file");
  free(password);
  password = NULL;
  free(cfg.store_password_file);
  cfg.store_password_file = strdup("/nonexistent/pw");
  cr_expect_eq(ah__config_store(&cfg, &o, &be, path, sizeof path, &password, &why), AH_ECONFIG);
  cr_expect(why && strstr(why, "/nonexistent/pw") && strstr(why, "cannot be read"), "%s", why ? why : "");
  free(why);
  why = NULL;
  cfg.store_password = strdup("from-the-environment");
  cr_assert_eq(ah__config_store(&cfg, &o, &be, path, sizeof path, &password, &why), 0);
  cr_expect_str_eq(password, "from-the-environment");
  free(password);
#else
  cr_expect_eq(ah__config_store(&cfg, &o, &be, path, sizeof path, &password, &why), AH_ECONFIG);
  cr_expect(why && strstr(why, "without the PostgreSQL backend"), "%s", why ? why : "");
  free(why);
#endif
  ah__config_free(&cfg);
  free(text);
  free(pw);
}

/* [mcp.NAME] sections become the mcp plugin's `servers`, their values as written (the plugin checks them);
 * an unknown key is ignored with a warning that names only the key; a bad server name is an error. */
Test(config, mcp_sections_become_the_mcp_plugins_servers) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg,
                         "[mcp.files]\ncommand = npx\nargs = [\"-y\", \"server\"]\nenv = A=1, B=2\n"
                         "tool_timeout_ms = 5000\nsecret_thing = x\n"
                         "[mcp.web]\nurl = https://mcp.example/mcp\nheaders = X-A: 1\nenabled = false\n",
                         NULL, &err),
               0, "%s", err);
  expect_json(json_object_get(plugin_val(&cfg, "mcp", "servers"), "files"),
              "{\"command\": \"npx\", \"args\": \"[\\\"-y\\\", \\\"server\\\"]\", \"env\": \"A=1, B=2\","
              " \"tool_timeout_ms\": \"5000\"}");
  expect_json(json_object_get(plugin_val(&cfg, "mcp", "servers"), "web"),
              "{\"url\": \"https://mcp.example/mcp\", \"headers\": \"X-A: 1\", \"enabled\": \"false\"}");
  ah__config_free(&cfg);
  cr_expect_neq(load_text(&cfg, "[mcp.Bad_Name]\ncommand = x\n", NULL, &err), 0);
  cr_expect(err && strstr(err, "bad MCP server name"), "%s", err ? err : "");
  free(err);
}

/* [hook.NAME] sections are checked and typed at load (lists split, defaults filled, file order kept). */
Test(config, hook_sections_are_typed_with_their_defaults_in_file_order) {
  ah_config cfg;
  char *err = NULL;
  cr_assert_eq(load_text(&cfg,
                         "[hook.zz-guard]\nevent = before_tool\nmatch = run_command, mcp__github__*\n"
                         "command = /usr/local/bin/guard\nargs = [\"--mode\", \"a, b\"]\nenv = A=1, TOKEN=x\n"
                         "[hook.audit]\nevent = turn_end\ncommand = logger\ntimeout_ms = 500\n"
                         "cwd = /var/log\non_error = deny\nenabled = no\nsecret_thing = x\n",
                         NULL, &err),
               0, "%s", err);
  expect_json(cfg.hooks,
              "{\"zz-guard\": {\"event\": \"before_tool\", \"match\": [\"run_command\","
              " \"mcp__github__*\"], \"command\": \"/usr/local/bin/guard\", \"args\": [\"--mode\","
              " \"a, b\"], \"env\": [\"A=1\", \"TOKEN=x\"], \"timeout_ms\": 30000, \"on_error\": \"deny\","
              " \"enabled\": true},"
              " \"audit\": {\"event\": \"turn_end\", \"command\": \"logger\", \"timeout_ms\": 500,"
              " \"cwd\": \"/var/log\", \"on_error\": \"deny\", \"enabled\": false}}");
  const char *first = NULL;
  json_t *v = NULL;
  json_object_foreach(cfg.hooks, first, v) {
    break;
  }
  cr_expect_str_eq(first, "zz-guard", "file order, not name order");
  ah__config_free(&cfg);
  /* An observing point defaults to on_error = allow. */
  cr_assert_eq(load_text(&cfg, "[hook.a]\nevent = session_start\ncommand = x\n", NULL, &err), 0, "%s", err);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(cfg.hooks, "a"), "on_error")), "allow");
  ah__config_free(&cfg);
}

Test(config, bad_hook_sections) {
  file_error_case("[hook.x]\nevent = before_everything\ncommand = x\n",
                  "2: [hook.x] event: ", "unknown hook event \"before_everything\"");
  file_error_case("[hook.x]\nevent = before_tool\ntimeout_ms = 0\n",
                  "3: [hook.x] timeout_ms: ", "from 1 to 600000");
  file_error_case("[hook.x]\ntimeout_ms = 12abc\n", "2: [hook.x] timeout_ms: ", "not a number");
  file_error_case("[hook.x]\non_error = maybe\n", "2: [hook.x] on_error: ", "expected deny or allow");
  file_error_case("[hook.x]\nenv = SECRET\n", "2: [hook.x] env: ", "item 1 is not NAME=value");
  file_error_case("[hook.x]\nargs = [1, 2]\n", "2: [hook.x] args: ", "array of strings");
  file_error_case("[hook.x]\ncwd = rel\n", "2: [hook.x] cwd: ", "must be an absolute path");
  file_error_case("[hook.x]\nevent = turn_end\n", "1: [hook.x]", "a hook needs command");
  file_error_case("[hook.x]\ncommand = y\n", "1: [hook.x]", "a hook needs event");
  file_error_case("[hook.Bad]\ncommand = y\n", "1: [hook.Bad]", "bad hook name");
}
