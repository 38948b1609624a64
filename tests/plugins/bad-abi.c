/* Fixture "bad-abi": a descriptor built for another ABI major. The host must refuse it before mount(). */
#include <agenthost/plugin.h>

static int bad_abi_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)m;
  (void)api;
  (void)config;
  (void)state;
  return 0;
}

static const ah_plugin_desc bad_abi_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_MAKE(AH_ABI_MAJOR + 1, 0),
    .name = "bad-abi",
    .version = "1.0.0",
    .description = "test fixture: built for another ABI major",
    .mount = bad_abi_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &bad_abi_desc;
}
