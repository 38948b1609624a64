/* Fixture "duplicate-method": registrations that collide.
 *
 * Config "mode" = "self": registers dup.one twice in the same mount, ignores the second return code
 * (AH_EEXIST) and returns 0 — the host must still fail the mount. Otherwise: registers ok.echo, the name
 * the "ok" fixture registers, and returns the host's answer (AH_EEXIST while "ok" is mounted).
 *
 * The mount keeps no state: when the host fails a mount that returned 0, withdraw() is not called, so
 * nothing may be allocated. The handler reaches the API table through the method's data pointer.
 */
#include <agenthost/plugin.h>

#include <string.h>

static void duplicate_method_echo(ah_call *call, const json_t *params, void *data) {
  const ah_host_api *api = data;
  json_t *copy = json_deep_copy(params);

  if (copy == NULL) {
    api->call_error(call, AH_ENOMEM, "cannot copy the params", NULL);
    return;
  }
  api->call_reply(call, copy);
}

static int duplicate_method_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  const char *mode = json_string_value(json_object_get(config, "mode"));
  (void)state;

  if (mode != NULL && strcmp(mode, "self") == 0) {
    const ah_method_def one = {
        .struct_size = sizeof(ah_method_def),
        .name = "dup.one",
        .handler = duplicate_method_echo,
        .flags = AH_METHOD_PUBLIC,
        .data = (void *)api,
    };
    int rc = api->register_method(m, &one);
    if (rc != 0) {
      return rc;
    }
    /* The bug this fixture simulates: the second registration fails and the plugin does not look. */
    (void)api->register_method(m, &one);
    return 0;
  }

  const ah_method_def echo = {
      .struct_size = sizeof(ah_method_def),
      .name = "ok.echo",
      .handler = duplicate_method_echo,
      .flags = AH_METHOD_PUBLIC,
      .data = (void *)api,
  };
  return api->register_method(m, &echo);
}

static const ah_plugin_desc duplicate_method_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "duplicate-method",
    .version = "1.0.0",
    .description = "test fixture: registers a method name that already exists",
    .mount = duplicate_method_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &duplicate_method_desc;
}
