/* Fixture "no-mount": a descriptor without the required mount(). The host must refuse it. */
#include <agenthost/plugin.h>

#include <stddef.h>

static const ah_plugin_desc no_mount_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "no-mount",
    .version = "1.0.0",
    .description = "test fixture: a descriptor whose mount is NULL",
    .mount = NULL,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &no_mount_desc;
}
