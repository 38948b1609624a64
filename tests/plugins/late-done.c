/* Fixture "late-done": a plugin that reports withdraw done only after the host's deadline has passed, and
 * frees its host objects itself on the way — what the stdio surfaces did when their output was never read
 * (reliability finding 1: the host freed the token at the deadline, the plugin freed it again).
 *
 * mount() makes a token and starts a host timer that never fires in time (an hour). withdraw() does not
 * call done(): it starts a raw libuv timer of config "late_ms" (default 600 ms, past a test host's drain
 * deadline); when it fires, the plugin frees its token, stops its host timer, closes the raw timer and
 * only then calls done(). The host must not have freed either object in between.
 */
#include <agenthost/plugin.h>

#include <stdlib.h>
#include <string.h>

typedef struct late_state {
  ah_mount *m;
  const ah_host_api *api;
  ah_cancel *token;
  ah_timer *timer;
  uv_timer_t late;
  uint64_t late_ms;
  ah_withdraw_done_fn done;
} late_state;

static void never(ah_timer *t, void *arg) {
  (void)t;
  (void)arg;
}

static void late_closed(uv_handle_t *h) {
  late_state *st = h->data;
  ah_mount *m = st->m;
  ah_withdraw_done_fn done = st->done;
  free(st);
  done(m);
}

static void late_fired(uv_timer_t *t) {
  late_state *st = t->data;
  st->api->token_free(st->token);
  st->api->timer_stop(st->timer);
  uv_close((uv_handle_t *)&st->late, late_closed);
}

static int late_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  late_state *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  st->m = m;
  st->api = api;
  const json_t *ms = json_object_get(config, "late_ms");
  st->late_ms = json_is_integer(ms) ? (uint64_t)json_integer_value(ms) : 600;
  int rc = api->token_new(m, NULL, &st->token);
  if (rc == 0)
    rc = api->timer_start(m, 3600 * 1000, 0, never, st, &st->timer);
  if (rc) {
    if (st->token)
      api->token_free(st->token);
    free(st);
    return rc;
  }
  *state = st;
  return 0;
}

static void late_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  late_state *st = state;
  st->done = done;
  uv_loop_t *loop = st->api->loop(m);
  uv_timer_init(loop, &st->late);
  st->late.data = st;
  uv_timer_start(&st->late, late_fired, st->late_ms, 0);
}

static const ah_plugin_desc late_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "late-done",
    .version = "1.0.0",
    .description = "test fixture: reports withdraw done after the deadline, freeing its own objects first",
    .mount = late_mount,
    .withdraw = late_withdraw,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &late_desc;
}
