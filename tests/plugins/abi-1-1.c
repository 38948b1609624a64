/* Fixture "abi-1-1": a plugin built against the frozen ABI 1.1 headers (tests/abi/1.1), the minor before
 * today's. Today's host must run what it registers: a provider type "abi11" whose turn commits through
 * commit() (its sink has no commit_json) and a remote descriptor with `data` but no `param_size`.
 *
 * A turn answers on a host timer: one committed message "abi11: <text of the first content block>", then
 * end("end"). */
#include <agenthost/plugin.h>
#include <agenthost/provider.h>

#include <stdlib.h>
#include <string.h>

#if AH_ABI_MAJOR != 1 || AH_ABI_MINOR != 1
#error "abi-1-1 must be built against the ABI 1.1 headers"
#endif

typedef struct abi11 {
  const ah_host_api *api;
  ah_mount *m;
  ah_provider prov;
  int64_t factor;
} abi11;

struct ah_provider_turn {
  abi11 *st;
  const ah_turn_sink *sink;
  void *ctx;
  char *text;
  ah_timer *timer;
};

static void answer(ah_timer *timer, void *arg) {
  (void)timer;
  ah_provider_turn *t = arg;
  t->timer = NULL;
  t->sink->commit(t->ctx, t->text);
  t->sink->end(t->ctx, "end", NULL, NULL);
}

static int turn_start(ah_provider *p, const ah_turn_input *in, const ah_turn_sink *sink, void *ctx,
                      ah_provider_turn **out) {
  abi11 *st = p->data;
  const char *text = json_string_value(json_object_get(json_array_get(in->content, 0), "text"));
  ah_provider_turn *t = calloc(1, sizeof *t);
  if (!t)
    return AH_ENOMEM;
  t->st = st;
  t->sink = sink;
  t->ctx = ctx;
  size_t n = strlen(text ? text : "") + 8;
  t->text = malloc(n);
  if (!t->text || st->api->timer_start(st->m, 0, 0, answer, t, &t->timer) != 0) {
    free(t->text);
    free(t);
    return AH_ENOMEM;
  }
  strcpy(t->text, "abi11: ");
  strcat(t->text, text ? text : "");
  *out = t;
  return 0;
}

static void turn_cancel(ah_provider_turn *t) {
  if (t->timer) {
    t->st->api->timer_stop(t->timer);
    t->timer = NULL;
    t->sink->end(t->ctx, "cancelled", NULL, NULL);
  }
}

static void turn_free(ah_provider_turn *t) {
  if (t->timer)
    t->st->api->timer_stop(t->timer);
  free(t->text);
  free(t);
}

static void tool_result(ah_provider_turn *t, const char *id, const json_t *r, bool e) {
  (void)t, (void)id, (void)r, (void)e;
}
static void answered(ah_provider_turn *t, const json_t *a, bool c) {
  (void)t, (void)a, (void)c;
}
static void subagent_result(ah_provider_turn *t, const char *f, const char *r) {
  (void)t, (void)f, (void)r;
}

/* abi11.scale(n) = n * factor, where factor comes from the descriptor's data (ABI 1.1). */
static int r_scale(ah_call *call, int64_t n, int64_t *out) {
  const abi11 *st = AH_CALL_DATA(call);
  *out = n * st->factor;
  return 0;
}

static const ah_remote_param scale_params[] = {{"n", AH_TYPE_INT64, false}};

static int abi11_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  if (!AH_HAS_FIELD(api, ah_host_api, register_provider) || !api->register_provider)
    return AH_EABI;
  abi11 *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  st->api = api;
  st->m = m;
  st->factor = 7;
  st->prov = (ah_provider){.struct_size = sizeof st->prov,
                           .name = "abi11",
                           .turn_start = turn_start,
                           .turn_tool_result = tool_result,
                           .turn_answer = answered,
                           .turn_subagent_result = subagent_result,
                           .turn_cancel = turn_cancel,
                           .turn_free = turn_free,
                           .data = st};
  *state = st;
  ah_remote_def scale = {.struct_size = sizeof scale,
                         .ns = "abi11",
                         .method = "scale",
                         .params = scale_params,
                         .nparams = 1,
                         .result = AH_TYPE_INT64,
                         .lookup = AH_LOOKUP_NONE,
                         .fn = AH_REMOTE_FN(r_scale),
                         .data = st};
  int rc = api->register_provider(m, &st->prov);
  return rc ? rc : api->register_remote(m, &scale);
}

static void abi11_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  free(state);
  done(m);
}

static const ah_plugin_desc abi11_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "abi-1-1",
    .version = "1.1.0",
    .description = "test fixture: built against the ABI 1.1 headers",
    .mount = abi11_mount,
    .withdraw = abi11_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &abi11_desc;
}
