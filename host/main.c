/* agenthost — the command line: serve | sdk | acp | sessions | analyze | plugins | hooks | remote | status |
 * call | stop | version | --help, and the commands of enabled plugins. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admin.h"
#include "analyze.h"
#include "cli_commands.h"
#include "cli_sessions.h"
#include "config.h"
#include "hooks.h"
#include "host.h"
#include "log.h"
#include "readall.h"
#include "store.h"

static const char usage[] =
    "usage: agenthost [options] <command> [args]\n"
    "\n"
    "commands:\n"
    "  serve                     run the daemon with the plugins the config enables\n"
    "  sdk                       serve the SDK surface (JSON-RPC) on stdin/stdout\n"
    "  acp                       serve the Agent Client Protocol on stdin/stdout\n"
    "  sessions list [--json]    list the stored sessions (no daemon needed)\n"
    "  sessions show ID [--json] a session and its events\n"
    "  sessions export ID        a session's events as JSON Lines\n"
    "  sessions delete ID        remove a closed session (through the daemon when one runs)\n"
    "  analyze [--json] [--prices FILE] [--as-of TIME] FILE...\n"
    "                            usage, cost, requests and coverage of recordings and exports (offline)\n"
    "  plugins list [--json]     list the plugins of the running daemon\n"
    "  plugins load PATH         mount a plugin module into the running daemon\n"
    "  plugins unload NAME       withdraw a plugin from the running daemon\n"
    "  plugins reload NAME       withdraw a plugin and mount it again\n"
    "  hooks list [--json]       the hooks of the running daemon (else of the configuration)\n"
    "  remote stubs              print TypeScript declarations of the daemon's remote services\n"
    "  url                       print the browser launch URL of the running daemon (browser plugin)\n"
    "  token rotate              a new browser token; open tabs must reload (browser plugin)\n"
    "  status [--json]           the running daemon: mode, plugins, the store's health (exit 3: unhealthy)\n"
    "  stop [--timeout SECONDS]  stop the running daemon in order (SIGTERM) and wait until it has exited\n"
    "  call [--json] [--timeout SECONDS] METHOD [PARAMS|-]\n"
    "                            one request to the running daemon over the admin socket (privileged);\n"
    "                            PARAMS a JSON object or array, - reads it from stdin\n"
    "  version                   print the version\n"
    "  help                      print this text\n"
    "\n"
    "options:\n"
    "  --config FILE             configuration file (INI)\n"
    "  --state-dir DIR           state directory\n"
    "  --runtime-dir DIR         runtime directory (admin socket)\n"
    "  --plugin-dir DIR          where plugin modules are found\n"
    "  --listen ADDR[,ADDR]      browser listen addresses\n"
    "  --token-file FILE         browser token file\n"
    "  --log-level LEVEL         error | warn | info | debug\n"
    "  -h, --help                this text\n";

typedef struct serve_ctx {
  uv_loop_t loop;
  ah_host *host;
  ah_admin *admin;
  ah_config *config;
  ah_config *pending_config;
  ah_cli_overrides cli;
  uv_signal_t sigint;
  uv_signal_t sigterm;
  uv_signal_t sighup;
  /* A stdio surface is a child of its client (an SDK, an editor): when that parent dies, stop (orderly, as
   * on SIGTERM) instead of living on as an orphan. Polled, not PR_SET_PDEATHSIG: that signal follows the
   * parent's *thread*, and a client that spawned us from a short-lived thread would stop us while alive. */
  uv_timer_t parent_watch;
  bool watching_parent;
  pid_t parent;
  bool stopping;
  int exit_code;
} serve_ctx;

/* The configuration for a command: file, environment and command line; on error the message is printed and
 * the command exits 2. */
static int load_config(ah_config *cfg, const ah_cli_overrides *cli) {
  memset(cfg, 0, sizeof *cfg);
  char *err = NULL;
  if (ah__config_load(cfg, cli, NULL, &err) != 0) {
    fprintf(stderr, "agenthost: %s\n", err ? err : "out of memory");
    free(err);
    return -1;
  }
  return 0;
}

static void close_leftover(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) {
    ah__log(AH_LOG_WARN, "host", "closing a %s handle left by a zombie plugin", uv_handle_type_name(h->type));
    uv_close(h, NULL);
  }
}

static void host_stopped(int status, void *arg) {
  (void)status;
  serve_ctx *s = arg;
  /* Every handle of the host is closed now; what is left belongs to zombie modules, which stay mapped,
   * so closing their handles without a callback is safe. */
  uv_walk(&s->loop, close_leftover, NULL);
}

static void admin_stopped(void *arg) {
  serve_ctx *s = arg;
  if (ah__host_stop(s->host, host_stopped, s) != 0)
    host_stopped(0, s);
}

static void begin_stop(serve_ctx *s, const char *why) {
  if (s->stopping)
    return;
  s->stopping = true;
  ah__log(AH_LOG_INFO, "host", "%s: stopping", why);
  uv_close((uv_handle_t *)&s->sigint, NULL);
  uv_close((uv_handle_t *)&s->sigterm, NULL);
  uv_close((uv_handle_t *)&s->sighup, NULL);
  if (s->watching_parent)
    uv_close((uv_handle_t *)&s->parent_watch, NULL);
  ah__admin_stop(s->admin, admin_stopped, s);
}

/* A stdio surface whose client closed stdin: stop like on SIGTERM, exiting with its code. */
static void on_stop_request(int exit_code, void *arg) {
  serve_ctx *s = arg;
  if (!s->stopping)
    s->exit_code = exit_code;
  begin_stop(s, "the stdio surface ended");
}

#define PARENT_POLL_MS 100

static void parent_tick(uv_timer_t *t) {
  serve_ctx *s = t->data;
  if (getppid() != s->parent)
    begin_stop(s, "the parent process ended");
}

static void on_stop_signal(uv_signal_t *h, int signum) {
  begin_stop(h->data, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

static void config_applied(int status, void *arg) {
  serve_ctx *s = arg;
  if (status)
    ah__log(AH_LOG_WARN, "host", "the new configuration was applied with errors: %s", ah_strerror(status));
  ah__config_free(s->config);
  free(s->config);
  s->config = s->pending_config;
  s->pending_config = NULL;
}

static void on_sighup(uv_signal_t *h, int signum) {
  (void)signum;
  serve_ctx *s = h->data;
  if (s->pending_config) {
    ah__log(AH_LOG_WARN, "host", "SIGHUP ignored: the previous configuration is still being applied");
    return;
  }
  ah_config *cfg = calloc(1, sizeof *cfg);
  char *err = NULL;
  if (!cfg || ah__config_load(cfg, &s->cli, NULL, &err) != 0) {
    ah__log(AH_LOG_ERROR, "host", "SIGHUP: configuration not reloaded: %s", err ? err : "out of memory");
    free(err);
    free(cfg);
    return;
  }
  ah__log(AH_LOG_INFO, "host", "SIGHUP: applying the configuration again");
  ah__log_set_level(cfg->log_level);
  s->pending_config = cfg;
  if (ah__host_apply_config(s->host, cfg, config_applied, s) != 0) {
    s->pending_config = NULL;
    ah__config_free(cfg);
    free(cfg);
  }
}

/* Once, on stdout, when the mounts are done (DECISIONS.md): the browser's launch URL, which the browser
 * plugin composes (browser.launch-url); nothing when no browser surface serves. The URL holds the token,
 * so it goes to stdout only, never to the log. */
static void on_launch_url(const ah_outcome *o, void *arg) {
  (void)arg;
  const char *url = o->status == 0 ? json_string_value(json_object_get(o->result, "url")) : NULL;
  if (url) {
    printf("%s\n", url);
    fflush(stdout);
  }
}

static void print_launch_url(serve_ctx *s) {
  ah_caller core = {.struct_size = sizeof core, .authority = AH_AUTH_ADMIN, .surface = "core"};
  int rc = ah__host_dispatch(s->host, &core, "browser.launch-url", NULL, NULL, on_launch_url, NULL);
  if (rc && rc != AH_ENOMETHOD)
    ah__log(AH_LOG_WARN, "host", "the launch URL is unavailable: %s", ah_strerror(rc));
}

static int run_host(const ah_cli_overrides *cli, const char *mode) {
  serve_ctx *s = calloc(1, sizeof *s);
  if (!s)
    return 1;
  s->cli = *cli;
  s->config = calloc(1, sizeof *s->config);
  char *err = NULL;
  if (!s->config || ah__config_load(s->config, cli, NULL, &err) != 0) {
    fprintf(stderr, "agenthost: %s\n", err ? err : "out of memory");
    free(err);
    free(s->config);
    free(s);
    return 2;
  }
  ah__log_set_level(s->config->log_level);
  /* Secrets (tokens, keys) live in this process: no core dumps, and other processes of the same user
   * cannot ptrace it or read its /proc files (SECURITY.md G10). */
  struct rlimit no_core = {0, 0};
  if (setrlimit(RLIMIT_CORE, &no_core) != 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
    ah__log(AH_LOG_WARN, "host", "cannot disable core dumps");
  int lock_fd = -1;
  if (strcmp(mode, "serve") == 0) {
    char *why = NULL;
    if (ah__runtime_dir_prepare(s->config->runtime_dir, &why) != 0 ||
        (lock_fd = ah__runtime_lock(s->config->runtime_dir, &why)) < 0) {
      fprintf(stderr, "agenthost: %s\n", why ? why : "cannot prepare the runtime directory");
      free(why);
      ah__config_free(s->config);
      free(s->config);
      free(s);
      return 1;
    }
  }
  uv_loop_init(&s->loop);
  ah_host_opts opts = {.loop = &s->loop,
                       .config = s->config,
                       .mode = mode,
                       .drain_ms = 0,
                       /* Only the daemon takes over sessions a crashed host left behind: a stdio child
                        * serves its own client. */
                       .recover_sessions = strcmp(mode, "serve") == 0,
                       .on_stop_request = on_stop_request,
                       .stop_request_arg = s};
  int rc = ah__host_new(&opts, &s->host);
  /* Signals first: once the admin socket exists, a client may consider the daemon ready. */
  uv_signal_init(&s->loop, &s->sigint);
  uv_signal_init(&s->loop, &s->sigterm);
  uv_signal_init(&s->loop, &s->sighup);
  s->sigint.data = s->sigterm.data = s->sighup.data = s;
  if (rc == 0 && (strcmp(mode, "sdk") == 0 || strcmp(mode, "acp") == 0)) {
    s->parent = getppid();
    uv_timer_init(&s->loop, &s->parent_watch);
    s->parent_watch.data = s;
    s->watching_parent = true;
    uv_timer_start(&s->parent_watch, parent_tick, PARENT_POLL_MS, PARENT_POLL_MS);
    uv_unref((uv_handle_t *)&s->parent_watch);
  }
  if (rc == 0) {
    uv_signal_start(&s->sigint, on_stop_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_stop_signal, SIGTERM);
    uv_signal_start(&s->sighup, on_sighup, SIGHUP);
  }
  if (rc == 0 && strcmp(mode, "serve") == 0) {
    char *why = NULL;
    rc = ah__admin_start(s->host, s->config->runtime_dir, &s->admin, &why);
    if (rc) {
      ah__log(AH_LOG_ERROR, "host", "%s", why ? why : "cannot start the admin channel");
      free(why);
    }
  }
  if (rc == 0)
    rc = ah__host_mount_configured(s->host);
  if (rc == 0) {
    ah__log(AH_LOG_INFO, "host", "agenthost %s running in %s mode (pid %ld)", AH_VERSION, mode,
            (long)getpid());
    if (strcmp(mode, "serve") == 0)
      print_launch_url(s);
  } else {
    s->exit_code = 1;
    begin_stop(s, "start-up failed");
  }
  uv_run(&s->loop, UV_RUN_DEFAULT);
  ah__host_free(s->host);
  int close_rc = uv_loop_close(&s->loop);
  if (close_rc != 0) {
    ah__log(AH_LOG_ERROR, "host", "the loop did not close cleanly: %s", uv_strerror(close_rc));
    s->exit_code = 1;
  } else {
    ah__log(AH_LOG_INFO, "host", "stopped");
  }
  int code = s->exit_code;
  if (lock_fd >= 0)
    close(lock_fd);
  ah__config_free(s->config);
  free(s->config);
  if (s->pending_config) {
    ah__config_free(s->pending_config);
    free(s->pending_config);
  }
  free(s);
  return code;
}

static void print_error(const char *what, int rc, json_t *error, const char *runtime_dir) {
  const char *msg = error ? json_string_value(json_object_get(error, "message")) : NULL;
  if (rc == AH_ECLOSED && !error)
    fprintf(stderr,
            "agenthost: %s: no running daemon answers on the admin socket %s/admin.sock (is `agenthost "
            "serve` running with this runtime directory?)\n",
            what, runtime_dir);
  else
    fprintf(stderr, "agenthost: %s: %s\n", what, msg ? msg : ah_strerror(rc));
}

/* One request to the running daemon over the admin socket (`params` stolen): its result, or NULL after the
 * error was printed, with *code the exit status (2: the configuration, 1: no daemon or the call failed). */
static json_t *daemon_call(const ah_cli_overrides *cli, const char *what, const char *method, json_t *params,
                           int *code) {
  ah_config cfg;
  if (load_config(&cfg, cli) != 0) {
    json_decref(params);
    *code = 2;
    return NULL;
  }
  json_t *result = NULL;
  json_t *error = NULL;
  int rc = ah__admin_call(cfg.runtime_dir, method, params, 30000, &result, &error);
  if (rc) {
    print_error(what, rc, error, cfg.runtime_dir);
    json_decref(error);
    *code = 1;
  }
  ah__config_free(&cfg);
  return rc ? NULL : result;
}

static int cmd_plugins(const ah_cli_overrides *cli, int argc, char **argv) {
  if (argc < 1) {
    fputs(usage, stderr);
    return 2;
  }
  const char *sub = argv[0];
  const char *method = NULL;
  json_t *params = NULL;
  bool as_json = false;
  if (strcmp(sub, "list") == 0 && argc <= 2) {
    method = "plugin.list";
    as_json = argc == 2 && strcmp(argv[1], "--json") == 0;
    if (argc == 2 && !as_json)
      method = NULL;
  } else if (strcmp(sub, "load") == 0 && argc == 2) {
    char *abs = realpath(argv[1], NULL);
    if (!abs) {
      fprintf(stderr, "agenthost: plugins load: %s: no such file\n", argv[1]);
      return 1;
    }
    method = "plugin.load";
    params = json_pack("{s:s}", "path", abs);
    free(abs);
  } else if ((strcmp(sub, "unload") == 0 || strcmp(sub, "reload") == 0) && argc == 2) {
    method = strcmp(sub, "unload") == 0 ? "plugin.unload" : "plugin.reload";
    params = json_pack("{s:s}", "name", argv[1]);
  }
  if (!method) {
    fputs(usage, stderr);
    return 2;
  }
  char what[64];
  snprintf(what, sizeof what, "plugins %s", sub);
  int code = 0;
  json_t *result = daemon_call(cli, what, method, params, &code);
  if (!result)
    return code;
  if (strcmp(sub, "list") == 0) {
    if (as_json) {
      char *text = json_dumps(result, JSON_INDENT(2));
      puts(text ? text : "null");
      free(text);
    } else {
      size_t i = 0;
      json_t *p = NULL;
      json_array_foreach(json_object_get(result, "plugins"), i, p) {
        const char *path = json_string_value(json_object_get(p, "path"));
        printf("%-16s %-10s %-11s %s\n", json_string_value(json_object_get(p, "name")),
               json_string_value(json_object_get(p, "version")),
               json_string_value(json_object_get(p, "state")), path ? path : "(built in)");
      }
    }
  } else if (strcmp(sub, "load") == 0) {
    printf("mounted %s\n", json_string_value(json_object_get(result, "name")));
  } else {
    printf("%s %s%s\n", strcmp(sub, "unload") == 0 ? "withdrew" : "reloaded", argv[1],
           json_is_true(json_object_get(result, "zombie"))
               ? " (the old module is kept mapped as a zombie: see the daemon's log)"
               : "");
  }
  json_decref(result);
  return 0;
}

/* ---- call: one request of any method to the running daemon ------------------------------------------- */

#define CALL_PARAMS_MAX ((size_t)16 * 1024 * 1024) /* the admin socket's line cap */

/* The params of `agenthost call` from its argument, or from stdin for "-": an object or an array (the
 * JSON-RPC shapes); NULL with the reason printed. */
static json_t *call_params(const char *arg) {
  char *text = NULL;
  if (strcmp(arg, "-") == 0) {
    size_t len = 0;
    int rc = ah__read_all(stdin, CALL_PARAMS_MAX, &text, &len);
    if (rc == AH_E2BIG)
      fprintf(stderr, "agenthost: call: the params on stdin are longer than %zu bytes\n", CALL_PARAMS_MAX);
    else if (rc)
      fprintf(stderr, "agenthost: call: cannot read the params from stdin: %s\n", ah_strerror(rc));
    if (rc)
      return NULL;
  } else {
    text = strdup(arg);
  }
  if (!text)
    return NULL;
  json_error_t jerr;
  json_t *params = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  if (!params) {
    fprintf(stderr, "agenthost: call: the params are not JSON: %s (line %d, column %d)\n", jerr.text,
            jerr.line, jerr.column);
    return NULL;
  }
  if (!json_is_object(params) && !json_is_array(params)) {
    fprintf(stderr, "agenthost: call: the params must be a JSON object or array\n");
    json_decref(params);
    return NULL;
  }
  return params;
}

static void print_json(json_t *v, size_t flags) {
  char *text = json_dumps(v, flags | JSON_ENCODE_ANY);
  puts(text ? text : "null");
  free(text);
}

/* `agenthost call [--json] [--timeout S] METHOD [PARAMS|-]`: the method's result as indented JSON (exit 0),
 * or its error on stderr (exit 1); with --json one line on stdout either way, {"result": …} or
 * {"error": {code, message, data?}}. No daemon, a timeout: stderr, exit 1; bad arguments: exit 2. */
static int cmd_call(const ah_cli_overrides *cli, int argc, char **argv) {
  bool as_json = false;
  const char *method = NULL, *params_arg = NULL;
  double timeout_s = 30;
  bool ok = true;
  for (int i = 0; ok && i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--json") == 0) {
      as_json = true;
    } else if (strcmp(a, "--timeout") == 0 || strncmp(a, "--timeout=", 10) == 0) {
      const char *v = a[9] == '=' ? a + 10 : i + 1 < argc ? argv[++i] : NULL;
      char *end = NULL;
      timeout_s = v ? strtod(v, &end) : -1;
      ok = v && end != v && *end == '\0' && timeout_s >= 0 && timeout_s <= 1e9;
    } else if (a[0] == '-' && a[1] != '\0') {
      ok = false;
    } else if (!method) {
      method = a;
    } else if (!params_arg) {
      params_arg = a;
    } else {
      ok = false;
    }
  }
  if (!ok || !method || !method[0]) {
    fputs("usage: agenthost call [--json] [--timeout SECONDS] METHOD [PARAMS|-]\n", stderr);
    return 2;
  }
  json_t *params = NULL;
  if (params_arg && !(params = call_params(params_arg)))
    return 2;
  ah_config cfg;
  if (load_config(&cfg, cli) != 0) {
    json_decref(params);
    return 2;
  }
  uint64_t timeout_ms = timeout_s == 0 ? UINT64_MAX : (uint64_t)(timeout_s * 1000.0 + 0.5);
  json_t *result = NULL, *error = NULL;
  int rc = ah__admin_call(cfg.runtime_dir, method, params, timeout_ms, &result, &error);
  int code = 0;
  char what[128];
  snprintf(what, sizeof what, "call %s", method);
  if (rc == 0) {
    if (as_json) {
      json_t *out = json_pack("{s:O}", "result", result);
      print_json(out, JSON_COMPACT);
      json_decref(out);
    } else {
      print_json(result, JSON_INDENT(2));
    }
  } else if (error && as_json) {
    json_t *out = json_pack("{s:O}", "error", error);
    print_json(out, JSON_COMPACT);
    json_decref(out);
    code = 1;
  } else if (error) {
    char *msg = ah__cli_esc(json_string_value(json_object_get(error, "message")), 400);
    fprintf(stderr, "agenthost: %s: %s (code %lld)\n", what, msg[0] ? msg : "error",
            (long long)json_integer_value(json_object_get(error, "code")));
    free(msg);
    json_t *data = json_object_get(error, "data");
    if (data) {
      char *d = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);
      fprintf(stderr, "data: %s\n", d ? d : "");
      free(d);
    }
    code = 1;
  } else if (rc == AH_ETIMEDOUT) {
    fprintf(
        stderr,
        "agenthost: %s: no answer within %g s (the call may still run in the daemon; --timeout 0 waits)\n",
        what, timeout_s);
    code = 1;
  } else {
    print_error(what, rc, NULL, cfg.runtime_dir);
    code = 1;
  }
  json_decref(result);
  json_decref(error);
  ah__config_free(&cfg);
  return code;
}

/* `agenthost stop [--timeout SECONDS]`: the running daemon stopped in order (SIGTERM), waited for until it
 * has exited. Exit 0 once stopped, 1 without a daemon or when it is still stopping, 2 for bad arguments. */
static int cmd_stop(const ah_cli_overrides *cli, int argc, char **argv) {
  double timeout_s = 30;
  bool ok = argc == 0;
  if (argc == 2 && strcmp(argv[0], "--timeout") == 0) {
    char *end = NULL;
    timeout_s = strtod(argv[1], &end);
    ok = end != argv[1] && *end == '\0' && timeout_s >= 0 && timeout_s <= 1e9;
  }
  if (!ok) {
    fputs("usage: agenthost stop [--timeout SECONDS]\n", stderr);
    return 2;
  }
  ah_config cfg;
  if (load_config(&cfg, cli) != 0)
    return 2;
  long pid = 0;
  char *why = NULL;
  int rc = ah__runtime_stop(cfg.runtime_dir, (uint64_t)(timeout_s * 1000.0 + 0.5), &pid, &why);
  if (rc == 0)
    printf("stopped agenthost serve (pid %ld)\n", pid);
  else
    fprintf(stderr, "agenthost: stop: %s\n", why ? why : ah_strerror(rc));
  free(why);
  ah__config_free(&cfg);
  return rc ? 1 : 0;
}

/* ---- remote stubs: TypeScript declarations of the running daemon's descriptors ------------------------ */

static int cmd_remote(const ah_cli_overrides *cli, int argc, char **argv) {
  if (argc != 1 || strcmp(argv[0], "stubs") != 0) {
    fputs(usage, stderr);
    return 2;
  }
  int code = 0;
  json_t *result = daemon_call(cli, "remote stubs", "remote.describe", NULL, &code);
  if (!result)
    return code;
  char *ts = ah__remote_stubs_ts(json_object_get(result, "descriptors"));
  json_decref(result);
  if (!ts) {
    fputs("agenthost: remote stubs: out of memory\n", stderr);
    return 1;
  }
  fputs(ts, stdout);
  free(ts);
  return 0;
}

/* `agenthost status [--json]`: the running daemon as host.describe reports it. Exit 0 when the store is
 * healthy, 3 when it is full or damaged (for monitoring), 1 without a daemon, 2 for bad arguments. */
static int cmd_status(const ah_cli_overrides *cli, int argc, char **argv) {
  bool as_json = argc == 1 && strcmp(argv[0], "--json") == 0;
  if (argc > 1 || (argc == 1 && !as_json)) {
    fputs(usage, stderr);
    return 2;
  }
  int code = 0;
  json_t *result = daemon_call(cli, "status", "host.describe", NULL, &code);
  if (!result)
    return code;
  json_t *store = json_object_get(result, "store");
  const char *health = ah__cli_jstr(store, "health");
  /* What it holds now (host.stats): with --json under "stats". */
  int stats_code = 0;
  json_t *stats = daemon_call(cli, "status", "host.stats", NULL, &stats_code);
  if (as_json) {
    if (stats)
      json_object_set(result, "stats", stats);
    char *text = json_dumps(result, JSON_INDENT(2));
    puts(text ? text : "null");
    free(text);
  } else {
    json_t *abi = json_object_get(result, "abi");
    printf("agenthost %s running in %s mode (protocol %lld, plugin ABI %lld.%lld)\n",
           ah__cli_jstr(result, "version"), ah__cli_jstr(result, "mode"),
           (long long)json_integer_value(json_object_get(result, "protocol")),
           (long long)json_integer_value(json_object_get(abi, "major")),
           (long long)json_integer_value(json_object_get(abi, "minor")));
    char *detail = ah__cli_esc(ah__cli_jstr(store, "detail"), 200);
    printf("store: %s%s%s%s\n", health ? health : "unknown", detail[0] ? " (" : "", detail,
           detail[0] ? ")" : "");
    free(detail);
    json_t *ss = json_object_get(stats, "sessions");
    if (json_is_object(ss)) {
      json_t *idle = json_object_get(ss, "idleUnloadS");
      char after[64];
      if (json_is_number(idle))
        snprintf(after, sizeof after, "after %g s idle", json_number_value(idle));
      else
        snprintf(after, sizeof after, "never (idle_unload_s = 0)");
      printf("sessions: %lld in memory (%lld loaded, %lld unloaded since start; idle ones leave %s)\n",
             (long long)json_integer_value(json_object_get(ss, "live")),
             (long long)json_integer_value(json_object_get(ss, "loads")),
             (long long)json_integer_value(json_object_get(ss, "unloads")), after);
    }
    json_t *rss = json_object_get(json_object_get(stats, "memory"), "rssKiB");
    json_t *store = json_object_get(json_object_get(stats, "memory"), "storeBytes");
    if (json_is_integer(rss) && json_is_integer(store))
      printf("memory: %lld KiB resident (%lld KiB of it the store's caches)\n",
             (long long)json_integer_value(rss), (long long)json_integer_value(store) / 1024);
    else if (json_is_integer(rss))
      printf("memory: %lld KiB resident\n", (long long)json_integer_value(rss));
    size_t i = 0;
    json_t *p = NULL;
    printf("plugins:");
    json_array_foreach(json_object_get(result, "plugins"), i, p) {
      char *name = ah__cli_esc(ah__cli_jstr(p, "name"), 64);
      char *version = ah__cli_esc(ah__cli_jstr(p, "version"), 32);
      printf("%s %s %s", i ? "," : "", name, version);
      free(name);
      free(version);
    }
    printf("\n");
  }
  code = health && strcmp(health, "ok") == 0 ? 0 : 3;
  json_decref(stats);
  json_decref(result);
  return code;
}

/* ---- hooks: what runs at each point, from the daemon (with the plugins' hooks) or the configuration ---- */

static int cmd_hooks(const ah_cli_overrides *cli, int argc, char **argv) {
  bool as_json = argc == 2 && strcmp(argv[1], "--json") == 0;
  if (argc < 1 || strcmp(argv[0], "list") != 0 || argc > 2 || (argc == 2 && !as_json)) {
    fputs(usage, stderr);
    return 2;
  }
  ah_config cfg;
  if (load_config(&cfg, cli) != 0)
    return 2;
  json_t *result = NULL;
  json_t *error = NULL;
  int rc = ah__admin_call(cfg.runtime_dir, "host.describe", NULL, 30000, &result, &error);
  json_t *hooks = NULL;
  bool from_daemon = rc == 0;
  if (rc == 0) {
    hooks = json_incref(json_object_get(result, "hooks"));
  } else if (rc == AH_ECLOSED && !error) { /* no daemon: the configuration's own */
    hooks = ah__hooks_describe_config(cfg.hooks);
  } else {
    print_error("hooks list", rc, error, cfg.runtime_dir);
    json_decref(error);
    ah__config_free(&cfg);
    return 1;
  }
  json_decref(result);
  ah__config_free(&cfg);
  if (as_json) {
    json_t *out = json_pack("{s:o, s:s}", "hooks", hooks ? hooks : json_array(), "from",
                            from_daemon ? "daemon" : "configuration");
    char *text = json_dumps(out, JSON_INDENT(2));
    puts(text ? text : "null");
    free(text);
    json_decref(out);
    return 0;
  }
  if (!from_daemon)
    printf("(no daemon is running: the hooks of the configuration)\n");
  size_t i = 0;
  json_t *hk = NULL;
  json_array_foreach(hooks, i, hk) {
    char *name = ah__cli_esc(ah__cli_jstr(hk, "name"), 40);
    const char *src = ah__cli_jstr(hk, "source");
    char *by = ah__cli_esc(
        src && strcmp(src, "plugin") == 0 ? ah__cli_jstr(hk, "plugin") : ah__cli_jstr(hk, "command"), 80);
    json_t *match = json_object_get(hk, "match");
    char *patterns = json_array_size(match) ? json_dumps(match, JSON_COMPACT) : strdup("*");
    char *shown = ah__cli_esc(patterns, 80);
    printf("%-20s %-14s %-7s %-28s on_error=%s timeout=%lldms%s  %s\n", name, ah__cli_jstr(hk, "event"),
           src ? src : "?", shown, ah__cli_jstr(hk, "onError"),
           (long long)json_integer_value(json_object_get(hk, "timeoutMs")),
           json_is_false(json_object_get(hk, "enabled")) ? " (disabled)" : "", by);
    free(name);
    free(by);
    free(patterns);
    free(shown);
  }
  if (json_array_size(hooks) == 0)
    printf("no hooks\n");
  json_decref(hooks);
  return 0;
}

static int cmd_sessions(const ah_cli_overrides *cli, int argc, char **argv) {
  const char *sub = argc >= 1 ? argv[0] : "";
  const char *id = NULL;
  bool as_json = false;
  bool del = strcmp(sub, "delete") == 0;
  bool ok = strcmp(sub, "list") == 0 || strcmp(sub, "show") == 0 || strcmp(sub, "export") == 0 || del;
  for (int i = 1; ok && i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0 && strcmp(sub, "export") != 0 && !del && !as_json)
      as_json = true;
    else if (argv[i][0] != '-' && strcmp(sub, "list") != 0 && !id && argv[i][0])
      id = argv[i];
    else
      ok = false;
  }
  if (ok && strcmp(sub, "list") != 0 && !id)
    ok = false;
  if (!ok) {
    fputs(usage, stderr);
    return 2;
  }
  ah_config cfg;
  if (load_config(&cfg, cli) != 0)
    return 2;
  ah__log_set_level(cfg.log_level);
  int code = del ? ah__cli_sessions_delete(&cfg, id) : ah__cli_sessions(&cfg, sub, id, as_json);
  ah__config_free(&cfg);
  return code;
}

int main(int argc, char **argv) {
  ah_cli_overrides cli;
  memset(&cli, 0, sizeof cli);
  enum { O_CONFIG = 1, O_STATE, O_RUNTIME, O_PLUGIN, O_LISTEN, O_TOKEN, O_LOG };
  static const struct option longopts[] = {
      {"config", required_argument, NULL, O_CONFIG},
      {"state-dir", required_argument, NULL, O_STATE},
      {"runtime-dir", required_argument, NULL, O_RUNTIME},
      {"plugin-dir", required_argument, NULL, O_PLUGIN},
      {"listen", required_argument, NULL, O_LISTEN},
      {"token-file", required_argument, NULL, O_TOKEN},
      {"log-level", required_argument, NULL, O_LOG},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int c = 0;
  /* "+": stop at the first non-option, the command; its own arguments follow. */
  while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
    switch (c) {
    case O_CONFIG:
      cli.config_file = optarg;
      break;
    case O_STATE:
      cli.state_dir = optarg;
      break;
    case O_RUNTIME:
      cli.runtime_dir = optarg;
      break;
    case O_PLUGIN:
      cli.plugin_dir = optarg;
      break;
    case O_LISTEN:
      cli.listen = optarg;
      break;
    case O_TOKEN:
      cli.token_file = optarg;
      break;
    case O_LOG:
      cli.log_level = optarg;
      break;
    case 'h':
      fputs(usage, stdout);
      return 0;
    default:
      fputs(usage, stderr);
      return 2;
    }
  }
  if (optind >= argc) {
    fputs(usage, stderr);
    return 2;
  }
  const char *cmd = argv[optind];
  /* The global options may also follow the command (`agenthost acp --state-dir DIR`, as editors' agent
   * settings are often written): they are taken out of the command's own arguments, up to a "--". */
  char **rest_argv = argv + optind + 1;
  int rest = 0;
  for (int i = optind + 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      while (++i < argc)
        rest_argv[rest++] = argv[i];
      break;
    }
    const struct option *o = NULL;
    const char *val = NULL;
    for (const struct option *k = longopts; k->name && !o; k++) {
      size_t n = strlen(k->name);
      if (k->has_arg != required_argument || strncmp(a, "--", 2) != 0 || strncmp(a + 2, k->name, n) != 0)
        continue;
      if (a[2 + n] == '=') {
        o = k;
        val = a + 3 + n;
      } else if (a[2 + n] == '\0') {
        if (i + 1 >= argc) {
          fprintf(stderr, "agenthost: option --%s needs a value\n", k->name);
          return 2;
        }
        o = k;
        val = argv[++i];
      }
    }
    if (!o) {
      rest_argv[rest++] = argv[i];
      continue;
    }
    const char **field = o->val == O_CONFIG    ? &cli.config_file
                         : o->val == O_STATE   ? &cli.state_dir
                         : o->val == O_RUNTIME ? &cli.runtime_dir
                         : o->val == O_PLUGIN  ? &cli.plugin_dir
                         : o->val == O_LISTEN  ? &cli.listen
                         : o->val == O_TOKEN   ? &cli.token_file
                                               : &cli.log_level;
    *field = val;
  }
  signal(SIGPIPE, SIG_IGN);
  if (strcmp(cmd, "version") == 0 && rest == 0) {
    printf("agenthost %s (protocol %d, plugin ABI %d.%d)\n", AH_VERSION, AH_PROTOCOL_VERSION, AH_ABI_MAJOR,
           AH_ABI_MINOR);
    return 0;
  }
  if (strcmp(cmd, "help") == 0) {
    fputs(usage, stdout);
    return 0;
  }
  if ((strcmp(cmd, "serve") == 0 || strcmp(cmd, "sdk") == 0 || strcmp(cmd, "acp") == 0) && rest == 0)
    return run_host(&cli, cmd);
  if (strcmp(cmd, "sessions") == 0)
    return cmd_sessions(&cli, rest, rest_argv);
  if (strcmp(cmd, "analyze") == 0)
    return ah__cmd_analyze(rest, rest_argv);
  if (strcmp(cmd, "plugins") == 0)
    return cmd_plugins(&cli, rest, rest_argv);
  if (strcmp(cmd, "remote") == 0)
    return cmd_remote(&cli, rest, rest_argv);
  if (strcmp(cmd, "hooks") == 0)
    return cmd_hooks(&cli, rest, rest_argv);
  if (strcmp(cmd, "status") == 0)
    return cmd_status(&cli, rest, rest_argv);
  if (strcmp(cmd, "call") == 0)
    return cmd_call(&cli, rest, rest_argv);
  if (strcmp(cmd, "stop") == 0)
    return cmd_stop(&cli, rest, rest_argv);
  /* A command of an enabled plugin (the browser's `url` and `token`). */
  ah_config cfg;
  if (load_config(&cfg, &cli) != 0)
    return 2;
  ah__log_set_level(cfg.log_level);
  bool found = false;
  int code = ah__cli_plugin_command(&cfg, rest + 1, rest_argv - 1, &found); /* argv[0]: the command */
  ah__config_free(&cfg);
  if (found)
    return code;
  fprintf(stderr, "agenthost: unknown command or arguments: %s\n\n%s", cmd, usage);
  return 2;
}
