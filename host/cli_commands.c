/* Commands that plugins add to the command line (ABI 1.3, ah_plugin_desc.commands).
 *
 * The module of each enabled plugin is opened with the same ABI check as a mount (plugins.c) and asked
 * for its commands; nothing is mounted: the command gets its plugin's config, the host's directories and
 * a way to call the running daemon over the admin socket. Modules are opened in config order and only
 * until one offers the command. They stay mapped until the process exits (it exits right after). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "cli_commands.h"
#include "internal.h"

static int env_call(const ah_command_env *env, const char *method, const json_t *params, uint32_t timeout_ms,
                    json_t **result, json_t **error) {
  if (result)
    *result = NULL;
  if (error)
    *error = NULL;
  if (!env || !method)
    return AH_EINVAL;
  json_t *p = params ? json_deep_copy(params) : NULL;
  json_t *r = NULL, *e = NULL;
  int rc = ah__admin_call(env->runtime_dir, method, p, timeout_ms, &r, &e);
  if (result)
    *result = r;
  else
    json_decref(r);
  if (error)
    *error = e;
  else
    json_decref(e);
  return rc;
}

/* The plugin's command `name`, or NULL. A descriptor built before ABI 1.3 has no `commands` (AH_HAS reads
 * its size); an element must be long enough to hold `run`. */
static const ah_command_def *find_command(const ah_plugin_desc *d, const char *name) {
  if (!AH_HAS(d, ah_plugin_desc, commands))
    return NULL;
  for (const ah_command_def *const *c = d->commands; *c; c++) {
    const ah_command_def *def = *c;
    if (AH_HAS(def, ah_command_def, run) && def->name && strcmp(def->name, name) == 0)
      return def;
  }
  return NULL;
}

int ah__cli_plugin_command(const ah_config *cfg, int argc, char **argv, bool *found) {
  *found = false;
  if (argc < 1 || !ah__valid_plugin_name(argv[0]))
    return 2;
  const char *pname = NULL;
  json_t *pc = NULL;
  json_object_foreach(cfg->plugins, pname, pc) {
    if (!json_is_true(json_object_get(pc, "enabled")))
      continue;
    char *path = ah__config_module_path(cfg, pname, pc);
    void *dl = NULL;
    const ah_plugin_desc *d = NULL;
    char *why = NULL;
    int rc = path ? ah__plugin_open(path, &dl, &d, &why) : AH_ENOMEM;
    free(why);
    free(path);
    if (rc)
      continue; /* a module that cannot be opened offers nothing; `serve` says why */
    const ah_command_def *def = find_command(d, argv[0]);
    if (!def)
      continue;
    *found = true;
    ah_command_env env = {
        .struct_size = sizeof env,
        .name = pname,
        .config = pc,
        .state_dir = cfg->state_dir,
        .runtime_dir = cfg->runtime_dir,
        .out = stdout,
        .err = stderr,
        .call = env_call,
    };
    int code = def->run(&env, argc, argv);
    fflush(stdout);
    return code;
  }
  return 2;
}
