/* Fixture "null-desc": the entry refuses every host ABI by returning NULL. The host must refuse the
 * module. */
#include <agenthost/plugin.h>

#include <stddef.h>

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return NULL;
}
