/* Fixture "bad-method-name": registers the method "NoDots" (upper case, no namespace), ignores the
 * AH_EINVAL and returns 0. The host must fail the mount anyway. No state: withdraw() is never called. */
#include <agenthost/plugin.h>

static void bad_method_name_handler(ah_call *call, const json_t *params, void *data) {
  const ah_host_api *api = data;
  (void)params;
  api->call_error(call, AH_EINTERNAL, "must never be registered", NULL);
}

static int bad_method_name_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  (void)state;

  const ah_method_def def = {
      .struct_size = sizeof(ah_method_def),
      .name = "NoDots",
      .handler = bad_method_name_handler,
      .flags = AH_METHOD_PUBLIC,
      .data = (void *)api,
  };
  (void)api->register_method(m, &def);
  return 0;
}

static const ah_plugin_desc bad_method_name_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "bad-method-name",
    .version = "1.0.0",
    .description = "test fixture: registers an invalid method name and ignores the error",
    .mount = bad_method_name_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &bad_method_name_desc;
}
