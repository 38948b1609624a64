/* Fixture "late-register": registers late.trigger (public) in mount(). A call of late.trigger tries to
 * register late.other outside mount() and replies {"status": <the code register_method returned>},
 * which must be AH_ESTATE. */
#include <agenthost/plugin.h>

#include <stdlib.h>

typedef struct late_register_state {
  ah_mount *m;
  const ah_host_api *api;
} late_register_state;

static void late_register_other(ah_call *call, const json_t *params, void *data) {
  late_register_state *st = data;
  (void)params;
  st->api->call_error(call, AH_EINTERNAL, "late.other must never be registered", NULL);
}

static void late_register_trigger(ah_call *call, const json_t *params, void *data) {
  late_register_state *st = data;
  json_t *result = NULL;
  int rc = 0;
  (void)params;

  const ah_method_def other = {
      .struct_size = sizeof(ah_method_def),
      .name = "late.other",
      .handler = late_register_other,
      .flags = AH_METHOD_PUBLIC,
      .data = st,
  };
  rc = st->api->register_method(st->m, &other);
  result = json_pack("{s:i}", "status", rc);
  if (result == NULL) {
    st->api->call_error(call, AH_ENOMEM, "cannot build the reply", NULL);
    return;
  }
  st->api->call_reply(call, result);
}

static int late_register_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  late_register_state *st = NULL;
  int rc = 0;
  (void)config;

  st = calloc(1, sizeof(*st));
  if (st == NULL) {
    return AH_ENOMEM;
  }
  st->m = m;
  st->api = api;

  const ah_method_def trigger = {
      .struct_size = sizeof(ah_method_def),
      .name = "late.trigger",
      .handler = late_register_trigger,
      .flags = AH_METHOD_PUBLIC,
      .data = st,
  };
  rc = api->register_method(m, &trigger);
  if (rc != 0) {
    free(st); /* withdraw() is not called after a failed mount */
    return rc;
  }
  *state = st;
  return 0;
}

static void late_register_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  free(state);
  done(m);
}

static const ah_plugin_desc late_register_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "late-register",
    .version = "1.0.0",
    .description = "test fixture: tries to register a method outside mount()",
    .mount = late_register_mount,
    .withdraw = late_register_withdraw,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &late_register_desc;
}
