/* An out-of-tree plugin, built only against the installed headers:
 *
 *   cc -shared -fPIC $(pkg-config --cflags agenthost-plugin) -o hello.so hello.c
 *
 * Method hello.greet (public) replies {"greeting": "hello"}. Everything but the entry is static, so the
 * entry is the only exported symbol even without -fvisibility=hidden.
 */
#include <agenthost/plugin.h>

static void hello_greet(ah_call *call, const json_t *params, void *data) {
  const ah_host_api *api = data;
  json_t *result = json_pack("{s:s}", "greeting", "hello");
  (void)params;

  if (result == NULL) {
    api->call_error(call, AH_ENOMEM, "cannot build the reply", NULL);
    return;
  }
  api->call_reply(call, result);
}

static int hello_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  (void)state;

  const ah_method_def greet = {
      .struct_size = sizeof(ah_method_def),
      .name = "hello.greet",
      .handler = hello_greet,
      .flags = AH_METHOD_PUBLIC,
      .data = (void *)api,
  };
  return api->register_method(m, &greet);
}

static const ah_plugin_desc hello_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "hello",
    .version = "1.0.0",
    .description = "an out-of-tree example plugin",
    .mount = hello_mount,
    .withdraw = NULL,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &hello_desc;
}
