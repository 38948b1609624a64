/* Fixture "abi-1-0": a plugin built against the frozen ABI 1.0 headers (tests/abi/1.0), not plugin-api/.
 * Today's host must mount it and run what it registers: a method and a remote descriptor whose params
 * array has the 1.0 element layout and whose ah_remote_def has no `data` or `param_size`. */
#include <agenthost/plugin.h>

#if AH_ABI_MAJOR != 1 || AH_ABI_MINOR != 0
#error "abi-1-0 must be built against the ABI 1.0 headers"
#endif

static void m_add(ah_call *call, const json_t *params, void *data) {
  const ah_host_api *api = data;
  json_t *a = json_object_get(params, "a"), *b = json_object_get(params, "b");
  if (!json_is_integer(a) || !json_is_integer(b)) {
    api->call_error(call, AH_EINVAL, "params: a and b must be integers", NULL);
    return;
  }
  /* What this module sees of the host: its ABI, and the table's size (never smaller than 1.0's). */
  api->call_reply(call, json_pack("{s:I, s:i, s:b}", "sum", json_integer_value(a) + json_integer_value(b),
                                  "hostMinor", (int)AH_ABI_MINOR_OF(api->abi), "tableAtLeast10",
                                  api->struct_size >= sizeof(ah_host_api)));
}

static int r_mul(ah_call *call, int64_t a, int64_t b, int64_t *out) {
  (void)call;
  *out = a * b;
  return 0;
}

static const ah_remote_param mul_params[] = {{"a", AH_TYPE_INT64, false}, {"b", AH_TYPE_INT64, false}};

static int abi10_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  (void)state;
  ah_method_def add = {.struct_size = sizeof add,
                       .name = "abi10.add",
                       .handler = m_add,
                       .flags = AH_METHOD_PUBLIC,
                       .data = (void *)api};
  int rc = api->register_method(m, &add);
  ah_remote_def mul = {.struct_size = sizeof mul,
                       .ns = "abi10",
                       .method = "mul",
                       .params = mul_params,
                       .nparams = 2,
                       .result = AH_TYPE_INT64,
                       .lookup = AH_LOOKUP_NONE,
                       .fn = AH_REMOTE_FN(r_mul)};
  return rc ? rc : api->register_remote(m, &mul);
}

static const ah_plugin_desc abi10_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "abi-1-0",
    .version = "1.0.0",
    .description = "test fixture: built against the ABI 1.0 headers",
    .mount = abi10_mount,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &abi10_desc;
}
