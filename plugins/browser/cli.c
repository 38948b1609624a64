/* agenthost browser plugin — its commands of the command line (ABI 1.3, ah_plugin_desc.commands).
 *
 *   agenthost url            the launch URL of the running daemon (browser.launch-url)
 *   agenthost token rotate   a new token: the daemon's (browser.rotate-token, every live WebSocket is
 *                            closed with 1008) and the launch URL with it; without a daemon, or with one
 *                            that serves no browser surface, the token file is replaced here
 *
 * They run in the command's process with the module loaded but not mounted: no host API, no loop, no
 * statics touched. The URL holds the token: it goes to stdout, never to stderr or a log. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "browser.h"

static const char *message_of(const json_t *error, int rc) {
  const char *m = json_string_value(json_object_get(error, "message"));
  return m ? m : ah_strerror(rc);
}

/* 0 with the URL printed; else 1 with why on stderr. */
static int print_url(const ah_command_env *env, const char *what) {
  json_t *result = NULL, *error = NULL;
  int rc = env->call(env, "browser.launch-url", NULL, 30000, &result, &error);
  const char *url = rc == 0 ? json_string_value(json_object_get(result, "url")) : NULL;
  int code = 0;
  if (url) {
    fprintf(env->out, "%s\n", url);
  } else if (rc == AH_ECLOSED && !error) {
    fprintf(env->err,
            "agenthost: %s: no running daemon answers on the admin socket %s/admin.sock (is `agenthost "
            "serve` running with this runtime directory?)\n",
            what, env->runtime_dir);
    code = 1;
  } else {
    fprintf(env->err, "agenthost: %s: %s\n", what,
            rc == AH_ENOMETHOD ? "the running daemon serves no browser surface (is [plugin.browser] enabled?)"
                               : message_of(error, rc));
    code = 1;
  }
  json_decref(result);
  json_decref(error);
  return code;
}

static int run_url(const ah_command_env *env, int argc, char **argv) {
  (void)argv;
  if (argc != 1) {
    fprintf(env->err, "usage: agenthost url\n");
    return 2;
  }
  return print_url(env, "url");
}

/* The directories above `path`, created 0700 where missing. */
static void make_parent(const char *path) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir)
    return;
  *slash = '\0';
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    mkdir(dir, 0700);
    *p = '/';
  }
  mkdir(dir, 0700);
}

static int run_token(const ah_command_env *env, int argc, char **argv) {
  if (argc != 2 || strcmp(argv[1], "rotate") != 0) {
    fprintf(env->err, "usage: agenthost token rotate\n");
    return 2;
  }
  json_t *result = NULL, *error = NULL;
  int rc = env->call(env, "browser.rotate-token", NULL, 30000, &result, &error);
  int code = 0;
  if (rc == 0) {
    code = print_url(env, "token rotate") == 0 ? 0 : 1;
  } else if ((rc == AH_ECLOSED && !error) || rc == AH_ENOMETHOD) {
    /* Nobody holds the token in memory: the next mount reads the new file. */
    char path[4096];
    int e = bp_token_file_path(env->config, env->state_dir, path, sizeof path);
    if (!e)
      make_parent(path); /* before the first `serve`, the state directory may not exist yet */
    if (!e)
      e = bp_token_file_replace(path, NULL);
    if (e) {
      fprintf(env->err, "agenthost: token rotate: cannot replace %s: %s\n", path, ah_strerror(e));
      code = 1;
    } else {
      fprintf(env->out, "rotated the token in %s (%s)\n", path,
              rc == AH_ENOMETHOD ? "the running daemon serves no browser surface" : "no daemon is running");
    }
  } else {
    fprintf(env->err, "agenthost: token rotate: %s\n", message_of(error, rc));
    code = 1;
  }
  json_decref(result);
  json_decref(error);
  return code;
}

static const ah_command_def url_command = {
    .struct_size = sizeof(ah_command_def), .name = "url", .usage = "url", .run = run_url};
static const ah_command_def token_command = {
    .struct_size = sizeof(ah_command_def), .name = "token", .usage = "token rotate", .run = run_token};

const ah_command_def *const bp_commands[] = {&url_command, &token_command, NULL};
