/* Fixture "bench-stream": registers the provider type "bench-stream", the event source of the WebSocket
 * fan-out benchmark (bench/browser_fanout.c).
 *
 * A turn whose text is "stream RATE SECONDS" emits RATE deltas per second for SECONDS: a host timer fires
 * every millisecond and emits the number of deltas due by then (computed from CLOCK_MONOTONIC, so a late
 * tick catches up). Each delta's text is "t=<CLOCK_MONOTONIC nanoseconds at the emit> n=<index>": the emit
 * is sink->delta, which hands the delta to the host's bus. When every delta is out the turn commits a short
 * summary ("streamed N deltas in S s; ticks M, max tick gap G ms, max deltas per tick D") and ends ("end").
 * Any other text commits "bench-stream: expected 'stream RATE SECONDS'" and ends. RATE is 1..1000000 and
 * SECONDS 0.001..3600.
 *
 * Config (optional) `type`: register the provider under another type name (default "bench-stream").
 */
#include <agenthost/plugin.h>
#include <agenthost/provider.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bs_state {
  ah_mount *m;
  const ah_host_api *api;
  ah_provider prov;
  char type[48];
} bs_state;

struct ah_provider_turn {
  bs_state *st;
  const ah_turn_sink *sink;
  void *ctx;
  ah_timer *timer; /* the 1 ms tick or the one-shot answer; NULL once stopped */
  bool ended;
  bool streaming;
  double rate;
  uint64_t total;   /* deltas to emit */
  uint64_t emitted; /* deltas emitted so far */
  uint64_t start_ns;
  uint64_t last_tick_ns;
  uint64_t ticks;
  uint64_t max_gap_ns;
  uint64_t max_burst;
};

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void bs_end(ah_provider_turn *t, const char *reason) {
  if (t->ended)
    return;
  t->ended = true;
  json_t *usage = json_pack("{s:i, s:I}", "inputTokens", 1, "outputTokens", (json_int_t)t->emitted);
  t->sink->end(t->ctx, reason, usage, NULL);
  json_decref(usage);
}

static void bs_stop_timer(ah_provider_turn *t) {
  if (t->timer) {
    t->st->api->timer_stop(t->timer);
    t->timer = NULL;
  }
}

static void bs_tick(ah_timer *timer, void *arg) {
  (void)timer;
  ah_provider_turn *t = arg;
  uint64_t now = mono_ns();
  t->ticks++;
  if (now - t->last_tick_ns > t->max_gap_ns)
    t->max_gap_ns = now - t->last_tick_ns;
  t->last_tick_ns = now;
  double due_f = t->rate * (double)(now - t->start_ns) / 1e9;
  uint64_t due = due_f >= (double)t->total ? t->total : (uint64_t)due_f;
  if (due > t->emitted && due - t->emitted > t->max_burst)
    t->max_burst = due - t->emitted;
  char text[64];
  while (t->emitted < due && !t->ended) {
    snprintf(text, sizeof text, "t=%llu n=%llu", (unsigned long long)mono_ns(),
             (unsigned long long)t->emitted);
    t->emitted++;
    t->sink->delta(t->ctx, text);
  }
  if (t->emitted < t->total || t->ended)
    return;
  bs_stop_timer(t); /* frees the timer: not touched again */
  char summary[200];
  snprintf(summary, sizeof summary,
           "streamed %llu deltas in %.3f s; ticks %llu, max tick gap %.3f ms, max deltas per tick %llu",
           (unsigned long long)t->emitted, (double)(now - t->start_ns) / 1e9, (unsigned long long)t->ticks,
           (double)t->max_gap_ns / 1e6, (unsigned long long)t->max_burst);
  t->sink->commit(t->ctx, summary);
  bs_end(t, "end");
}

static void bs_refuse(ah_timer *timer, void *arg) {
  (void)timer;
  ah_provider_turn *t = arg;
  t->timer = NULL; /* a one-shot timer is freed by the host after its callback */
  t->sink->commit(t->ctx, "bench-stream: expected 'stream RATE SECONDS'");
  bs_end(t, "end");
}

static int bs_turn_start(ah_provider *p, const ah_turn_input *in, const ah_turn_sink *sink, void *ctx,
                         ah_provider_turn **out) {
  bs_state *st = p->data;
  ah_provider_turn *t = calloc(1, sizeof *t);
  if (!t)
    return AH_ENOMEM;
  t->st = st;
  t->sink = sink;
  t->ctx = ctx;
  const char *text = json_string_value(json_object_get(json_array_get(in->content, 0), "text"));
  double rate = 0, secs = 0;
  char tail = 0;
  t->streaming = text && sscanf(text, "stream %lf %lf %c", &rate, &secs, &tail) == 2 && rate >= 1 &&
                 rate <= 1e6 && secs >= 0.001 && secs <= 3600;
  int rc;
  if (t->streaming) {
    t->rate = rate;
    t->total = (uint64_t)(rate * secs + 0.5);
    t->start_ns = t->last_tick_ns = mono_ns();
    rc = st->api->timer_start(st->m, 1, 1, bs_tick, t, &t->timer);
  } else {
    rc = st->api->timer_start(st->m, 1, 0, bs_refuse, t, &t->timer);
  }
  if (rc != 0) {
    free(t);
    return rc;
  }
  *out = t;
  return 0;
}

static void bs_tool_result(ah_provider_turn *t, const char *call_id, const json_t *result, bool is_error) {
  (void)t;
  (void)call_id;
  (void)result;
  (void)is_error;
}

static void bs_answer(ah_provider_turn *t, const json_t *answer, bool cancelled) {
  (void)t;
  (void)answer;
  (void)cancelled;
}

static void bs_subagent_result(ah_provider_turn *t, const char *final_text, const char *reason) {
  (void)t;
  (void)final_text;
  (void)reason;
}

static void bs_cancel(ah_provider_turn *t) {
  bs_stop_timer(t);
  bs_end(t, "cancelled");
}

static void bs_free(ah_provider_turn *t) {
  bs_stop_timer(t);
  free(t);
}

static int bs_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  if (!AH_HAS_FIELD(api, ah_host_api, register_provider))
    return AH_EINVAL;
  bs_state *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  st->m = m;
  st->api = api;
  const char *type = json_string_value(json_object_get(config, "type"));
  snprintf(st->type, sizeof st->type, "%s", type && *type ? type : "bench-stream");
  st->prov = (ah_provider){
      .struct_size = sizeof(ah_provider),
      .name = st->type,
      .turn_start = bs_turn_start,
      .turn_tool_result = bs_tool_result,
      .turn_answer = bs_answer,
      .turn_subagent_result = bs_subagent_result,
      .turn_cancel = bs_cancel,
      .turn_free = bs_free,
      .data = st,
  };
  *state = st;
  api->register_provider(m, &st->prov); /* a failed registration fails the mount; withdraw frees st */
  return 0;
}

static void bs_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  free(state);
  done(m);
}

static const ah_plugin_desc bs_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "bench-stream",
    .version = "1.0.0",
    .description = "benchmark fixture: the provider type 'bench-stream' (timed, timestamped deltas)",
    .mount = bs_mount,
    .withdraw = bs_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &bs_desc;
}
