/* Fixture "hooks": one plugin hook (ABI 1.7) named by its config.
 *
 * Config: `name` (default "fx-hook"), `event` (default before_tool), `match` (one pattern), `on_error`,
 * `timeout_ms`, `answer` (a JSON text answered as it is; default {}), `error` (answer with a call error of
 * that message), `wait` ("true": answer only when the call's token trips, then with {}), `bad` (register
 * one bad definition instead: "event", "name", "handler", "on_error"). hooksfx.stats → {calls, waiting,
 * last: the last document}. */
#include <agenthost/plugin.h>

#include <stdlib.h>
#include <string.h>

typedef struct fx {
  const ah_host_api *api;
  ah_mount *m;
  json_t *answer;
  const char *error;
  bool wait;
  int calls;
  int waiting;
  json_t *last;
  char name[48];
  char event[32];
  char match[64];
  char on_error[16];
} fx;

typedef struct waiter {
  fx *st;
  ah_call *call;
} waiter;

static void woke(ah_cancel *token, void *arg) {
  (void)token;
  waiter *w = arg;
  w->st->waiting--;
  w->st->api->call_reply(w->call, json_object()); /* AH_ECANCELED: the host answered already */
  free(w);
}

static void on_hook(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  st->calls++;
  json_decref(st->last);
  st->last = json_deep_copy(params);
  if (st->wait) {
    waiter *w = calloc(1, sizeof *w);
    w->st = st;
    w->call = call;
    st->waiting++;
    if (st->api->token_watch(st->api->call_cancel_token(call), woke, w, NULL) != 0) {
      st->waiting--;
      free(w);
      st->api->call_reply(call, json_object());
    }
    return;
  }
  if (st->error) {
    st->api->call_error(call, AH_EINTERNAL, st->error, NULL);
    return;
  }
  st->api->call_reply(call, json_deep_copy(st->answer));
}

static void on_stats(ah_call *call, const json_t *params, void *data) {
  (void)params;
  fx *st = data;
  st->api->call_reply(
      call, json_pack("{s:i, s:i, s:O?}", "calls", st->calls, "waiting", st->waiting, "last", st->last));
}

static const char *cfg(const json_t *config, const char *key, const char *dflt) {
  const char *v = json_string_value(json_object_get(config, key));
  return v ? v : dflt;
}

static int fx_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  fx *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  *state = st;
  st->api = api;
  st->m = m;
  snprintf(st->name, sizeof st->name, "%s", cfg(config, "name", "fx-hook"));
  snprintf(st->event, sizeof st->event, "%s", cfg(config, "event", "before_tool"));
  snprintf(st->match, sizeof st->match, "%s", cfg(config, "match", ""));
  snprintf(st->on_error, sizeof st->on_error, "%s", cfg(config, "on_error", ""));
  st->answer = json_loads(cfg(config, "answer", "{}"), JSON_DECODE_ANY, NULL);
  st->error = json_string_value(json_object_get(config, "error"));
  st->wait = strcmp(cfg(config, "wait", "false"), "true") == 0;
  const char *bad = cfg(config, "bad", "");
  const char *match[] = {st->match, NULL};
  ah_hook_def def = {
      .struct_size = sizeof def,
      .name = strcmp(bad, "name") == 0 ? "Bad Name" : st->name,
      .event = strcmp(bad, "event") == 0 ? "before_everything" : st->event,
      .match = st->match[0] ? match : NULL,
      .timeout_ms = (uint32_t)atoi(cfg(config, "timeout_ms", "0")),
      .on_error = strcmp(bad, "on_error") == 0 ? "maybe"
                  : st->on_error[0]            ? st->on_error
                                               : NULL,
      .handler = strcmp(bad, "handler") == 0 ? NULL : on_hook,
      .data = st,
  };
  int rc = api->register_hook(m, &def);
  if (rc)
    return rc;
  ah_method_def stats = {.struct_size = sizeof stats,
                         .name = "hooksfx.stats",
                         .flags = AH_METHOD_PUBLIC,
                         .handler = on_stats,
                         .data = st};
  return api->register_method(m, &stats);
}

static void fx_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  fx *st = state;
  json_decref(st->answer);
  json_decref(st->last);
  free(st);
  done(m);
}

static const ah_plugin_desc desc = {
    .struct_size = sizeof desc,
    .abi = AH_ABI_VERSION,
    .name = "hooks",
    .version = "1.0.0",
    .description = "test fixture: a plugin hook",
    .mount = fx_mount,
    .withdraw = fx_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  return AH_ABI_MAJOR_OF(host_abi) == 1 ? &desc : NULL;
}
