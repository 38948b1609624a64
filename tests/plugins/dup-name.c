/* Fixture "dup-name": a working plugin whose descriptor is named "ok", like the "ok" fixture. Mounting
 * it while "ok" is mounted must be refused for the duplicate name; alone it mounts and registers nothing.
 */
#include <agenthost/plugin.h>

static int dup_name_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)m;
  (void)api;
  (void)config;
  (void)state;
  return 0;
}

static const ah_plugin_desc dup_name_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "ok",
    .version = "1.0.0",
    .description = "test fixture: a second plugin named \"ok\"",
    .mount = dup_name_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &dup_name_desc;
}
