/* Fixture "fails-midway": registers a method, an event and a remote descriptor, then fails the mount
 * with AH_EIO. The host must undo all three registrations; nothing may become visible.
 *
 * Registrations: method midway.method (public), event midway.event, remote midway.thing() → int64.
 * No state is allocated, so there is nothing to free on the failure path.
 */
#include <agenthost/plugin.h>

static void fails_midway_method(ah_call *call, const json_t *params, void *data) {
  const ah_host_api *api = data;
  json_t *result = json_object();
  (void)params;

  if (result == NULL) {
    api->call_error(call, AH_ENOMEM, "cannot build the reply", NULL);
    return;
  }
  api->call_reply(call, result);
}

/* Remote function midway.thing() → int64. */
static int fails_midway_thing(ah_call *call, int64_t *out) {
  (void)call;
  if (out == NULL) {
    return AH_EINVAL;
  }
  *out = 42;
  return 0;
}

static int fails_midway_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  int rc = 0;
  (void)config;
  (void)state;

  const ah_method_def method = {
      .struct_size = sizeof(ah_method_def),
      .name = "midway.method",
      .handler = fails_midway_method,
      .flags = AH_METHOD_PUBLIC,
      .data = (void *)api,
  };
  rc = api->register_method(m, &method);
  if (rc != 0) {
    return rc;
  }

  rc = api->register_event(m, "midway.event", 0);
  if (rc != 0) {
    return rc;
  }

  const ah_remote_def thing = {
      .struct_size = sizeof(ah_remote_def),
      .param_size = sizeof(ah_remote_param),
      .ns = "midway",
      .method = "thing",
      .params = NULL,
      .nparams = 0,
      .result = AH_TYPE_INT64,
      .result_optional = false,
      .flags = 0,
      .lookup = AH_LOOKUP_NONE,
      /* Through void (*)(void), the one function type GCC's -Wcast-function-type accepts for any cast. */
      .fn = AH_REMOTE_FN(fails_midway_thing),
  };
  rc = api->register_remote(m, &thing);
  if (rc != 0) {
    return rc;
  }

  /* Every registration succeeded: now fail, so that the host has three entries to roll back. */
  return AH_EIO;
}

static const ah_plugin_desc fails_midway_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "fails-midway",
    .version = "1.0.0",
    .description = "test fixture: registers three entries, then fails its mount with AH_EIO",
    .mount = fails_midway_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &fails_midway_desc;
}
