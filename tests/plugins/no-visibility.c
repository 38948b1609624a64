/* Fixture "no-visibility": registers novis.method with flags 0 — neither PUBLIC nor PRIVILEGED, which the
 * host refuses (deny by default) — ignores the AH_EINVAL and returns 0. The host must fail the mount
 * anyway. No state: withdraw() is never called. */
#include <agenthost/plugin.h>

static void no_visibility_handler(ah_call *call, const json_t *params, void *data) {
  const ah_host_api *api = data;
  (void)params;
  api->call_error(call, AH_EINTERNAL, "must never be registered", NULL);
}

static int no_visibility_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  (void)state;

  const ah_method_def def = {
      .struct_size = sizeof(ah_method_def),
      .name = "novis.method",
      .handler = no_visibility_handler,
      .flags = 0,
      .data = (void *)api,
  };
  (void)api->register_method(m, &def);
  return 0;
}

static const ah_plugin_desc no_visibility_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "no-visibility",
    .version = "1.0.0",
    .description = "test fixture: registers a method that is neither public nor privileged",
    .mount = no_visibility_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &no_visibility_desc;
}
