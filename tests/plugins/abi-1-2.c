/* Fixture "abi-1-2": a plugin built against the frozen ABI 1.2 headers (tests/abi/1.2), the minor before
 * today's. Its descriptor ends before `commands` (ABI 1.3); the word right after it in memory is a pointer
 * that is not NULL and points nowhere, so a host that read `commands` without checking the descriptor's
 * size would follow it. Today's host must mount it, run its method, and find no command in it.
 *
 * abi12.ping() = {"minor": <the minor this module was built for>, "hostMinor": <the host's, from the
 * table>} — the host's ABI is read from the table size only through AH_HAS. */
#include <agenthost/plugin.h>

#include <stdint.h>

#if AH_ABI_MAJOR != 1 || AH_ABI_MINOR != 2
#error "abi-1-2 must be built against the ABI 1.2 headers"
#endif

static void m_ping(ah_call *call, const json_t *params, void *data) {
  (void)params;
  const ah_host_api *api = data;
  api->call_reply(call, json_pack("{s:i, s:b}", "minor", AH_ABI_MINOR, "hasStdioRpc",
                                  AH_HAS(api, ah_host_api, stdio_rpc)));
}

static int abi12_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  (void)state;
  ah_method_def def = {.struct_size = sizeof def,
                       .name = "abi12.ping",
                       .handler = m_ping,
                       .flags = AH_METHOD_PUBLIC,
                       .data = (void *)api};
  return api->register_method(m, &def);
}

static void abi12_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  (void)state;
  done(m);
}

static const struct {
  ah_plugin_desc desc;
  const void *after; /* where a 1.3 descriptor has `commands` */
} module = {
    .desc =
        {
            .struct_size = sizeof(ah_plugin_desc),
            .abi = AH_ABI_VERSION,
            .name = "abi-1-2",
            .version = "1.2.0",
            .description = "test fixture: built against the ABI 1.2 headers",
            .mount = abi12_mount,
            .withdraw = abi12_withdraw,
        },
    .after = (const void *)(uintptr_t)0x10,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  return AH_ABI_MAJOR_OF(host_abi) == 1 ? &module.desc : NULL;
}
