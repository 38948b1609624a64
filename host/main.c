/* agenthost — the command line: serve | sdk | acp | plugins | version | --help. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "admin.h"
#include "config.h"
#include "host.h"
#include "log.h"

static const char usage[] = "usage: agenthost [options] <command> [args]\n"
                            "\n"
                            "commands:\n"
                            "  serve                     run the daemon with the plugins the config enables\n"
                            "  sdk                       serve the SDK surface (JSON-RPC) on stdin/stdout\n"
                            "  acp                       serve the Agent Client Protocol on stdin/stdout\n"
                            "  plugins list [--json]     list the plugins of the running daemon\n"
                            "  plugins load PATH         mount a plugin module into the running daemon\n"
                            "  plugins unload NAME       withdraw a plugin from the running daemon\n"
                            "  plugins reload NAME       withdraw a plugin and mount it again\n"
                            "  version                   print the version\n"
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
  bool stopping;
  int exit_code;
} serve_ctx;

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
  ah__admin_stop(s->admin, admin_stopped, s);
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
  ah_host_opts opts = {
      .loop = &s->loop, .config = s->config, .mode = mode, .drain_ms = 0, .recover_sessions = true};
  int rc = ah__host_new(&opts, &s->host);
  /* Signals first: once the admin socket exists, a client may consider the daemon ready. */
  uv_signal_init(&s->loop, &s->sigint);
  uv_signal_init(&s->loop, &s->sigterm);
  uv_signal_init(&s->loop, &s->sighup);
  s->sigint.data = s->sigterm.data = s->sighup.data = s;
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

static void print_error(const char *what, int rc, json_t *error) {
  const char *msg = error ? json_string_value(json_object_get(error, "message")) : NULL;
  if (rc == AH_ECLOSED)
    fprintf(stderr, "agenthost: %s: no running daemon answers on the admin socket\n", what);
  else
    fprintf(stderr, "agenthost: %s: %s\n", what, msg ? msg : ah_strerror(rc));
}

static int cmd_plugins(const ah_cli_overrides *cli, int argc, char **argv) {
  if (argc < 1) {
    fputs(usage, stderr);
    return 2;
  }
  ah_config cfg;
  memset(&cfg, 0, sizeof cfg);
  char *err = NULL;
  if (ah__config_load(&cfg, cli, NULL, &err) != 0) {
    fprintf(stderr, "agenthost: %s\n", err ? err : "out of memory");
    free(err);
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
      ah__config_free(&cfg);
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
    ah__config_free(&cfg);
    return 2;
  }
  json_t *result = NULL;
  json_t *error = NULL;
  int rc = ah__admin_call(cfg.runtime_dir, method, params, 30000, &result, &error);
  ah__config_free(&cfg);
  if (rc) {
    char what[64];
    snprintf(what, sizeof what, "plugins %s", sub);
    print_error(what, rc, error);
    json_decref(error);
    return 1;
  }
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
  int rest = argc - optind - 1;
  char **rest_argv = argv + optind + 1;
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
  if (strcmp(cmd, "plugins") == 0)
    return cmd_plugins(&cli, rest, rest_argv);
  fprintf(stderr, "agenthost: unknown command or arguments: %s\n\n%s", cmd, usage);
  return 2;
}
