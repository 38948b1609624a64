/* Fixture "veto": may_withdraw() refuses with AH_EBUSY unless the config has "allow" = "true" (the
 * string, as an INI value arrives, or the JSON boolean). Registers nothing. */
#include <agenthost/plugin.h>

#include <stdlib.h>
#include <string.h>

typedef struct veto_state {
  bool allow;
} veto_state;

static int veto_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  const json_t *allow = json_object_get(config, "allow");
  veto_state *st = NULL;
  (void)m;
  (void)api;

  st = calloc(1, sizeof(*st));
  if (st == NULL) {
    return AH_ENOMEM;
  }
  st->allow = json_is_true(allow) || (json_is_string(allow) && strcmp(json_string_value(allow), "true") == 0);
  *state = st;
  return 0;
}

static int veto_may_withdraw(void *state) {
  const veto_state *st = state;
  return st->allow ? 0 : AH_EBUSY;
}

static void veto_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  free(state);
  done(m);
}

static const ah_plugin_desc veto_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "veto",
    .version = "1.0.0",
    .description = "test fixture: vetoes its unload unless allow = true",
    .mount = veto_mount,
    .withdraw = veto_withdraw,
    .may_withdraw = veto_may_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &veto_desc;
}
