/* Fixture "commands": a plugin that adds commands to the command line (ABI 1.3).
 *
 *   agenthost fixture-cmd ARGS…  prints "argv:" and its arguments, "greeting: <[plugin.commands] greeting>",
 *                                "state: <state_dir>" and "daemon: <host.describe name | none>"; exits 7
 *   agenthost version            a command the host has: the host's wins, this one is never run
 *   agenthost short-cmd          a definition too short to hold `run`: the host skips it
 */
#include <agenthost/plugin.h>

#include <stdio.h>

static int run_fixture(const ah_command_env *env, int argc, char **argv) {
  fprintf(env->out, "argv:");
  for (int i = 0; i < argc; i++)
    fprintf(env->out, " %s", argv[i]);
  fprintf(env->out, "\ngreeting: %s\nstate: %s\n",
          json_string_value(json_object_get(env->config, "greeting")), env->state_dir);
  json_t *result = NULL, *error = NULL;
  int rc = env->call(env, "host.describe", NULL, 10000, &result, &error);
  fprintf(env->out, "daemon: %s\n",
          rc == 0            ? json_string_value(json_object_get(result, "name"))
          : rc == AH_ECLOSED ? "none"
                             : "error");
  json_decref(result);
  json_decref(error);
  return 7;
}

static int run_version(const ah_command_env *env, int argc, char **argv) {
  (void)argc, (void)argv;
  fprintf(env->out, "the plugin's version command ran\n");
  return 9;
}

static const ah_command_def fixture_cmd = {.struct_size = sizeof(ah_command_def),
                                           .name = "fixture-cmd",
                                           .usage = "fixture-cmd ARGS",
                                           .run = run_fixture};
static const ah_command_def version_cmd = {
    .struct_size = sizeof(ah_command_def), .name = "version", .usage = "version", .run = run_version};
/* As a plugin of an imagined earlier layout would write it: too short to reach `run`. */
static const ah_command_def short_cmd = {.struct_size = 8, .name = "short-cmd", .run = run_version};
static const ah_command_def *const commands[] = {&fixture_cmd, &version_cmd, &short_cmd, NULL};

static int cmd_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)m, (void)api, (void)config, (void)state;
  return 0;
}

static const ah_plugin_desc desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "commands",
    .version = "1.0.0",
    .description = "test fixture: commands of the command line",
    .mount = cmd_mount,
    .commands = commands,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  return AH_ABI_MAJOR_OF(host_abi) == 1 ? &desc : NULL;
}
