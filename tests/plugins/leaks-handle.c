/* Fixture "leaks-handle": a plugin with the bug the zombie check exists for.
 *
 * mount() takes the raw loop (as a plugin that hands it to a library would) and starts a libuv timer
 * that repeats every 50 ms with a callback inside this module. withdraw() calls done() without stopping
 * or closing that timer. The host must find the live handle whose callback points into the module and
 * keep the module mapped (a zombie) instead of dlclose()ing it under the running timer.
 *
 * The state holds the timer, so withdraw() must not free it either: the leak is deliberate.
 */
#include <agenthost/plugin.h>

#include <stdlib.h>

typedef struct leaks_handle_state {
  uv_timer_t timer; /* started in mount(), never stopped */
  uint64_t ticks;
} leaks_handle_state;

static void leaks_handle_tick(uv_timer_t *timer) {
  leaks_handle_state *st = timer->data;
  st->ticks++;
}

static void leaks_handle_free_cb(uv_handle_t *handle) {
  free(handle->data);
}

static int leaks_handle_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  uv_loop_t *loop = api->loop(m);
  leaks_handle_state *st = NULL;
  int rc = 0;
  (void)config;

  if (loop == NULL) {
    return AH_EINTERNAL;
  }
  st = calloc(1, sizeof(*st));
  if (st == NULL) {
    return AH_ENOMEM;
  }
  rc = uv_timer_init(loop, &st->timer);
  if (rc != 0) {
    free(st);
    return AH_EIO;
  }
  st->timer.data = st;
  rc = uv_timer_start(&st->timer, leaks_handle_tick, 50, 50);
  if (rc != 0) {
    /* An initialised handle is freed only after its close callback. */
    uv_close((uv_handle_t *)&st->timer, leaks_handle_free_cb);
    return AH_EIO;
  }
  *state = st;
  return 0;
}

static void leaks_handle_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  /* The simulated bug: the timer in `state` keeps running, so neither it nor `state` is released. */
  (void)state;
  done(m);
}

static const ah_plugin_desc leaks_handle_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "leaks-handle",
    .version = "1.0.0",
    .description = "test fixture: leaves a repeating libuv timer running after withdraw",
    .mount = leaks_handle_mount,
    .withdraw = leaks_handle_withdraw,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &leaks_handle_desc;
}
