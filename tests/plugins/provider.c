/* Fixture "provider": registers the provider type "fixture" (ah_host_api.register_provider), for the
 * provider-registration tests.
 *
 * A turn answers on a later loop turn (a host timer): a delta, then one committed message
 * "fixture <provider_name> <config.greeting>: <text of the first content block>", then end("end").
 * A message whose text is "hang" never ends by itself: only turn_cancel ends it ("cancelled").
 *
 * Usage: built for ABI 1.8 or later it reports two round trips (sink->usage) — {inputTokens 3,
 * outputTokens 1} and {inputTokens 5, cachedInputTokens 2, outputTokens 2, reasoningTokens 1}, both of
 * model "fx-a" (the second of "fx-b" when the text is "mixed") — and ends with their sum; built for an
 * earlier ABI (tests/abi/1.7: abi-1-7.so) it reports none and ends with {inputTokens 1, outputTokens 1}.
 *
 * Methods: fixture.stats (public) → {started, freed, cancelled, live, lastInput: {providerName, config,
 * cwd, sessionId}} — live is the number of provider turns not yet freed.
 *
 * Config "bad" (optional) makes the registration wrong, for the refusal tests: "name" (an invalid type
 * name), "echo" (the core's own provider), "missing" (no turn_cancel), "twice" (the same type twice).
 */
#include <agenthost/plugin.h>
#include <agenthost/provider.h>

#include <stdlib.h>
#include <string.h>

typedef struct fx_state fx_state;

struct ah_provider_turn {
  fx_state *st;
  const ah_turn_sink *sink;
  void *ctx;
  char *text;
  ah_timer *timer; /* pending answer; NULL once fired or stopped */
  bool ended;
  bool hang;
  bool mixed;
};

struct fx_state {
  ah_mount *m;
  const ah_host_api *api;
  ah_provider prov;
  ah_provider second; /* "twice" */
  int started;
  int freed;
  int cancelled;
  int live;
  json_t *last_input;
};

static void fx_end(ah_provider_turn *t, const char *reason) {
  if (t->ended)
    return;
  t->ended = true;
#if AH_ABI_MINOR >= 8
  if (AH_HAS(t->sink, ah_turn_sink, usage)) {
    const char *second = t->mixed ? "fx-b" : "fx-a";
    json_t *r1 = json_pack("{s:i, s:i, s:i, s:s}", "inputTokens", 3, "outputTokens", 1, "requests", 1,
                           "model", "fx-a");
    json_t *r2 = json_pack("{s:i, s:i, s:i, s:i, s:i, s:s}", "inputTokens", 5, "cachedInputTokens", 2,
                           "outputTokens", 2, "reasoningTokens", 1, "requests", 1, "model", second);
    t->sink->usage(t->ctx, r1);
    t->sink->usage(t->ctx, r2);
    json_decref(r1);
    json_decref(r2);
    json_t *sum = json_pack("{s:i, s:i, s:i, s:i, s:i, s:s}", "inputTokens", 8, "cachedInputTokens", 2,
                            "outputTokens", 3, "reasoningTokens", 1, "requests", 2, "model", second);
    if (t->mixed)
      json_object_set_new(sum, "models", json_pack("[s, s]", "fx-a", "fx-b"));
    t->sink->end(t->ctx, reason, sum, NULL);
    json_decref(sum);
    return;
  }
#endif
  json_t *usage = json_pack("{s:i, s:i}", "inputTokens", 1, "outputTokens", 1);
  t->sink->end(t->ctx, reason, usage, NULL);
  json_decref(usage);
}

static void fx_answer(ah_timer *timer, void *arg) {
  (void)timer;
  ah_provider_turn *t = arg;
  t->timer = NULL;
  t->sink->delta(t->ctx, "fixture");
  t->sink->commit(t->ctx, t->text);
  fx_end(t, "end");
}

static int fx_turn_start(ah_provider *p, const ah_turn_input *in, const ah_turn_sink *sink, void *ctx,
                         ah_provider_turn **out) {
  fx_state *st = p->data;
  if (!AH_HAS_FIELD(in, ah_turn_input, provider_config))
    return AH_EINVAL;
  ah_provider_turn *t = calloc(1, sizeof *t);
  if (!t)
    return AH_ENOMEM;
  t->st = st;
  t->sink = sink;
  t->ctx = ctx;
  const char *text = json_string_value(json_object_get(json_array_get(in->content, 0), "text"));
  t->hang = text && strcmp(text, "hang") == 0;
  t->mixed = text && strcmp(text, "mixed") == 0;
  const char *greeting = json_string_value(json_object_get(in->provider_config, "greeting"));
  size_t n = strlen(in->provider_name) + (greeting ? strlen(greeting) : 0) + (text ? strlen(text) : 0) + 32;
  t->text = malloc(n);
  if (!t->text) {
    free(t);
    return AH_ENOMEM;
  }
  strcpy(t->text, "fixture ");
  strcat(t->text, in->provider_name);
  strcat(t->text, " ");
  strcat(t->text, greeting ? greeting : "-");
  strcat(t->text, ": ");
  strcat(t->text, text ? text : "");
  json_decref(st->last_input);
  st->last_input = json_pack("{s:s, s:O, s:s?, s:s}", "providerName", in->provider_name, "config",
                             in->provider_config, "cwd", in->cwd, "sessionId", in->session_id);
  if (!t->hang && st->api->timer_start(st->m, 1, 0, fx_answer, t, &t->timer) != 0) {
    free(t->text);
    free(t);
    return AH_ENOMEM;
  }
  st->started++;
  st->live++;
  *out = t;
  return 0;
}

static void fx_tool_result(ah_provider_turn *t, const char *call_id, const json_t *result, bool is_error) {
  (void)t;
  (void)call_id;
  (void)result;
  (void)is_error;
}

static void fx_answer_q(ah_provider_turn *t, const json_t *answer, bool cancelled) {
  (void)t;
  (void)answer;
  (void)cancelled;
}

static void fx_subagent_result(ah_provider_turn *t, const char *final_text, const char *reason) {
  (void)t;
  (void)final_text;
  (void)reason;
}

static void fx_cancel(ah_provider_turn *t) {
  t->st->cancelled++;
  if (t->timer) {
    t->st->api->timer_stop(t->timer);
    t->timer = NULL;
  }
  fx_end(t, "cancelled");
}

static void fx_free(ah_provider_turn *t) {
  if (t->timer)
    t->st->api->timer_stop(t->timer);
  t->st->freed++;
  t->st->live--;
  free(t->text);
  free(t);
}

static void fx_stats(ah_call *call, const json_t *params, void *data) {
  (void)params;
  fx_state *st = data;
  st->api->call_reply(call,
                      json_pack("{s:i, s:i, s:i, s:i, s:O?}", "started", st->started, "freed", st->freed,
                                "cancelled", st->cancelled, "live", st->live, "lastInput", st->last_input));
}

static int fx_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  if (!AH_HAS_FIELD(api, ah_host_api, register_provider))
    return AH_EINVAL;
  fx_state *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  st->m = m;
  st->api = api;
  st->prov = (ah_provider){
      .struct_size = sizeof(ah_provider),
      .name = "fixture",
      .turn_start = fx_turn_start,
      .turn_tool_result = fx_tool_result,
      .turn_answer = fx_answer_q,
      .turn_subagent_result = fx_subagent_result,
      .turn_cancel = fx_cancel,
      .turn_free = fx_free,
      .data = st,
  };
  st->second = st->prov;
  *state = st;
  const char *bad = json_string_value(json_object_get(config, "bad"));
  if (bad && strcmp(bad, "name") == 0)
    st->prov.name = "Fixture!";
  else if (bad && strcmp(bad, "echo") == 0)
    st->prov.name = "echo";
  else if (bad && strcmp(bad, "missing") == 0)
    st->prov.turn_cancel = NULL;
  api->register_provider(m, &st->prov);
  if (bad && strcmp(bad, "twice") == 0)
    api->register_provider(m, &st->second);
  ah_method_def def = {.struct_size = sizeof def,
                       .name = "fixture.stats",
                       .handler = fx_stats,
                       .flags = AH_METHOD_PUBLIC,
                       .data = st};
  api->register_method(m, &def);
  return 0;
}

static void fx_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  fx_state *st = state;
  json_decref(st->last_input);
  free(st);
  done(m);
}

static const ah_plugin_desc fx_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "provider",
    .version = "1.0.0",
    .description = "test fixture: the provider type 'fixture'",
    .mount = fx_mount,
    .withdraw = fx_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &fx_desc;
}
