/* Fixture "no-entry": a plugin-shaped module that exports no ah_plugin_entry_v1 — its entry has another
 * name. The host must refuse it when the symbol lookup fails. */
#include <agenthost/plugin.h>

AH_EXPORT const ah_plugin_desc *not_the_entry(uint32_t host_abi);

static int no_entry_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)m;
  (void)api;
  (void)config;
  (void)state;
  return 0;
}

static const ah_plugin_desc no_entry_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "no-entry",
    .version = "1.0.0",
    .description = "test fixture: exports not_the_entry instead of ah_plugin_entry_v1",
    .mount = no_entry_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *not_the_entry(uint32_t host_abi) {
  (void)host_abi;
  return &no_entry_desc;
}
