/* Fixture "newer-minor": a descriptor built for a newer minor of the host's ABI major. The host must
 * refuse it before mount(). */
#include <agenthost/plugin.h>

static int newer_minor_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)m;
  (void)api;
  (void)config;
  (void)state;
  return 0;
}

static const ah_plugin_desc newer_minor_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_MAKE(AH_ABI_MAJOR, AH_ABI_MINOR + 1),
    .name = "newer-minor",
    .version = "1.0.0",
    .description = "test fixture: built for a newer ABI minor",
    .mount = newer_minor_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &newer_minor_desc;
}
