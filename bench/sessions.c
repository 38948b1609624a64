/* Benchmark: the session manager under load, with baselines measured in the same invocation.
 *
 * 1. Prompt receipt latency (target p99 <= 2 ms): a host with a fresh state directory (synchronous =
 *    NORMAL), one session, then PROMPTS (default 5000) session.prompt calls issued one after another (the
 *    next when the previous receipt arrived), each timed from ah__host_dispatch() to the reply callback.
 *    The echo turns run meanwhile. Baseline: the same number of bare ah__store_write() calls of the opset a
 *    prompt writes (inbox.put + the inbox/received event) on a separate store file, timed the same way.
 * 2. Heap per idle live session (target <= 16 KB): mallinfo2().uordblks before and after creating
 *    SESSIONS (default 2000) sessions, all receipts received and the store drained; the RSS delta is
 *    printed for information. Baseline: the heap of the same rows held as jansson objects alone
 *    (json_deep_copy of the row session.create returned).
 * 3. Durable events per second end to end: one prompt to each of those sessions, sent in bursts without
 *    waiting for receipts, timed until every turn/ended was published on the bus (session.event); then the
 *    same number of prompts into one session (its turns run one after another). Informational: the store
 *    benchmark prints the raw group-commit throughput.
 *
 * Usage: bench_sessions [PROMPTS [SESSIONS]]. Prints figures only; exits non-zero only on errors (a
 * failed call, a timeout, a handle left open).
 */
#include <ftw.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agenthost/errors.h"
#include "bench_util.h"
#include "host.h"
#include "internal.h"
#include "sessions.h"
#include "store.h"

#define BURST 200
#define ROW_MAX 1024
#define PHASE_TIMEOUT_NS (30ull * 1000000000ull)

static uv_loop_t loop;
static ah_host *host;
static uv_timer_t tick; /* wakes the loop so that waits can check their deadline */
static int failures;

/* ---- small helpers ----------------------------------------------------------------------------------- */

static size_t heap_bytes(void) {
  return mallinfo2().uordblks;
}

typedef struct dist {
  double p50, p99, max, mean; /* milliseconds */
  size_t over_2ms;
} dist;

/* Nearest-rank percentiles of `n` samples in nanoseconds (sorted in place). */
static dist summarize(uint64_t *v, size_t n) {
  dist d = {0};
  if (n == 0)
    return d;
  qsort(v, n, sizeof *v, bench_cmp_u64);
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    sum += (double)v[i];
    d.over_2ms += v[i] > 2000000;
  }
  d.p50 = (double)v[bench_rank(n, 50)] / 1e6;
  d.p99 = (double)v[bench_rank(n, 99)] / 1e6;
  d.max = (double)v[n - 1] / 1e6;
  d.mean = sum / (double)n / 1e6;
  return d;
}

static void on_tick(uv_timer_t *t) {
  (void)t;
}

/* Run the loop until *flag becomes true; false (and an error message) on timeout. */
static bool run_until(const bool *flag, const char *what) {
  uint64_t deadline = uv_hrtime() + PHASE_TIMEOUT_NS;
  while (!*flag) {
    if (uv_hrtime() > deadline) {
      fprintf(stderr, "bench_sessions: timeout waiting for %s\n", what);
      failures++;
      return false;
    }
    uv_run(&loop, UV_RUN_ONCE);
  }
  return true;
}

/* ---- the bus: count stored events and ended turns ----------------------------------------------------- */

static uint64_t bus_events;
static uint64_t bus_turns_ended;
static uint64_t turns_target; /* when bus_turns_ended reaches it: turns_done, t_turns_done */
static bool turns_done;
static uint64_t t_turns_done;

static void on_event(const char *name, const json_t *data, void *arg) {
  (void)name;
  (void)arg;
  bus_events++;
  const char *kind = json_string_value(json_object_get(json_object_get(data, "event"), "kind"));
  if (kind && strcmp(kind, "turn/ended") == 0) {
    if (++bus_turns_ended == turns_target && !turns_done) {
      turns_done = true;
      t_turns_done = uv_hrtime();
    }
  }
}

static bool wait_turns(uint64_t target, const char *what) {
  turns_target = target;
  turns_done = bus_turns_ended >= target;
  return run_until(&turns_done, what);
}

/* Every write submitted before it has called back once this empty opset has (submission order); then let
 * the bus deliver what those callbacks emitted. */
static void barrier_written(int status, const json_t *results, void *arg) {
  (void)results;
  if (status != 0)
    failures++;
  *(bool *)arg = true;
}

static bool drain(void) {
  bool done = false;
  ah_store *st = ah__sessions_store(ah__host_sessions(host));
  if (ah__store_write(st, json_array(), barrier_written, &done) != 0) {
    failures++;
    return false;
  }
  if (!run_until(&done, "the store barrier"))
    return false;
  for (int i = 0; i < 100 && (ah__bus_pending(host) || ah__host_inflight(host) > 0); i++)
    uv_run(&loop, UV_RUN_NOWAIT);
  return true;
}

/* ---- calls ------------------------------------------------------------------------------------------- */

static const ah_caller caller = {
    .struct_size = sizeof caller, .authority = AH_AUTH_ADMIN, .surface = "bench"};

static void call_failed(const char *method, const ah_outcome *o) {
  fprintf(stderr, "bench_sessions: %s: %s %s\n", method, ah_err_name(o->status),
          o->message ? o->message : "");
  failures++;
}

typedef struct one_call {
  bool done;
  json_t *result;
} one_call;

static void one_reply(const ah_outcome *o, void *arg) {
  one_call *c = arg;
  c->done = true;
  if (o->status != 0)
    call_failed("call", o);
  else
    c->result = json_deep_copy(o->result);
}

static json_t *call_sync(const char *method, json_t *params) {
  one_call c = {0};
  int rc = ah__host_dispatch(host, &caller, method, params, NULL, one_reply, &c);
  if (rc != 0) {
    fprintf(stderr, "bench_sessions: %s: dispatch %s\n", method, ah_err_name(rc));
    failures++;
    return NULL;
  }
  run_until(&c.done, method);
  return c.result;
}

/* ---- 1. receipt latency ------------------------------------------------------------------------------ */

typedef struct latency_run {
  const char *session_id;
  uint64_t *samples;
  size_t n;
  size_t sent;
  size_t received;
  uint64_t t_sent;
  bool done;
} latency_run;

static void send_prompt(latency_run *r);

static void prompt_receipt(const ah_outcome *o, void *arg) {
  latency_run *r = arg;
  r->samples[r->received++] = uv_hrtime() - r->t_sent;
  if (o->status != 0)
    call_failed("session.prompt", o);
  if (r->received == r->n || o->status != 0)
    r->done = true;
  else
    send_prompt(r);
}

static void send_prompt(latency_run *r) {
  json_t *p = json_pack("{s:s, s:s}", "sessionId", r->session_id, "text", "hello from the benchmark");
  r->sent++;
  r->t_sent = uv_hrtime();
  int rc = ah__host_dispatch(host, &caller, "session.prompt", p, NULL, prompt_receipt, r);
  if (rc != 0) {
    fprintf(stderr, "bench_sessions: session.prompt: dispatch %s\n", ah_err_name(rc));
    failures++;
    r->done = true;
  }
}

typedef struct store_run {
  ah_store *store;
  uint64_t *samples;
  size_t n;
  size_t done_n;
  uint64_t t_sent;
  bool done;
} store_run;

#define BASE_SESSION "0190b7a0-0000-7000-8000-0000000000aa"

static void store_send(store_run *r);

static void store_written(int status, const json_t *results, void *arg) {
  store_run *r = arg;
  (void)results;
  r->samples[r->done_n++] = uv_hrtime() - r->t_sent;
  if (status != 0) {
    fprintf(stderr, "bench_sessions: baseline write: %s\n", ah_err_name(status));
    failures++;
  }
  if (r->done_n == r->n || status != 0)
    r->done = true;
  else
    store_send(r);
}

/* The opset a prompt writes: the inbox row and its inbox/received event (see host/sessions/live.c). */
static void store_send(store_run *r) {
  char mid[37], now[32];
  ah__uuid7(mid);
  ah__time_rfc3339(now);
  json_t *content = json_pack("[{s:s, s:s}]", "type", "text", "text", "hello from the benchmark");
  json_t *ops =
      json_pack("[{s:s, s:s, s:s, s:O, s:s}, {s:s, s:s, s:I, s:s, s:s, s:s, s:{s:o}}]", "op", "inbox.put",
                "messageId", mid, "sessionId", BASE_SESSION, "content", content, "time", now, "op", "event",
                "sessionId", BASE_SESSION, "seq", (json_int_t)r->done_n + 1, "kind", "inbox/received", "time",
                now, "messageId", mid, "data", "content", content);
  r->t_sent = uv_hrtime();
  int rc = ops ? ah__store_write(r->store, ops, store_written, r) : AH_ENOMEM;
  if (rc != 0) {
    fprintf(stderr, "bench_sessions: baseline write: %s\n", ah_err_name(rc));
    failures++;
    r->done = true;
  }
}

static void store_closed(void *arg) {
  *(bool *)arg = true;
}

static int baseline_store(const char *path, uint64_t *samples, size_t n) {
  store_run r = {.samples = samples, .n = n};
  char *why = NULL;
  ah_store_opts opts = {.path = path, .sync = AH_STORE_SYNC_NORMAL};
  if (ah__store_open(&loop, NULL, &opts, &r.store, &why) != 0) {
    fprintf(stderr, "bench_sessions: baseline store: %s\n", why ? why : "cannot open");
    free(why);
    failures++;
    return -1;
  }
  bool put = false;
  json_t *ops =
      json_pack("[{s:s, s:{s:s, s:s, s:s, s:s, s:s}}]", "op", "session.put", "session", "id", BASE_SESSION,
                "cwd", "/tmp", "title", "bench", "provider", "echo", "status", "idle");
  if (ah__store_write(r.store, ops, barrier_written, &put) == 0 && run_until(&put, "the baseline session")) {
    store_send(&r);
    run_until(&r.done, "the baseline writes");
  } else {
    failures++;
  }
  bool closed = false;
  ah__store_close(r.store, store_closed, &closed);
  run_until(&closed, "the baseline store to close");
  return r.done_n == n ? 0 : -1;
}

/* ---- 2. memory per session --------------------------------------------------------------------------- */

typedef struct create_run {
  size_t n;
  size_t received;
  char (*ids)[37];
  char *rows; /* n slots of ROW_MAX bytes: the returned rows as JSON text */
  size_t *row_len;
  bool done;
} create_run;

typedef struct create_slot {
  create_run *r;
  size_t i;
} create_slot;

static void created(const ah_outcome *o, void *arg) {
  create_slot *slot = arg;
  create_run *r = slot->r;
  if (o->status != 0) {
    call_failed("session.create", o);
  } else {
    /* Only into preallocated memory: nothing here may stay on the heap being measured. */
    const char *id = json_string_value(json_object_get(o->result, "sessionId"));
    snprintf(r->ids[slot->i], 37, "%s", id ? id : "");
    size_t len =
        json_dumpb(json_object_get(o->result, "session"), r->rows + slot->i * ROW_MAX, ROW_MAX, JSON_COMPACT);
    if (len == 0 || len > ROW_MAX) {
      fprintf(stderr, "bench_sessions: session row too large (%zu bytes)\n", len);
      failures++;
      len = 0;
    }
    r->row_len[slot->i] = len;
  }
  if (++r->received == r->n)
    r->done = true;
}

/* ---- 3. throughput ----------------------------------------------------------------------------------- */

typedef struct burst_run {
  size_t n;
  size_t receipts;
  bool receipts_done;
} burst_run;

static void burst_receipt(const ah_outcome *o, void *arg) {
  burst_run *r = arg;
  if (o->status != 0)
    call_failed("session.prompt", o);
  if (++r->receipts == r->n)
    r->receipts_done = true;
}

/* Send n prompts (to ids[i % nids]) in bursts of BURST per loop turn; wait for every turn/ended. Returns
 * the elapsed seconds from the first dispatch to the last turn/ended and the events published meanwhile. */
static double burst_prompts(char (*ids)[37], size_t nids, size_t n, uint64_t *events) {
  burst_run r = {.n = n};
  uint64_t ended0 = bus_turns_ended, events0 = bus_events;
  uint64_t t0 = uv_hrtime();
  for (size_t i = 0; i < n; i++) {
    json_t *p = json_pack("{s:s, s:s}", "sessionId", ids[i % nids], "text", "hello from the benchmark");
    int rc = ah__host_dispatch(host, &caller, "session.prompt", p, NULL, burst_receipt, &r);
    if (rc != 0) {
      fprintf(stderr, "bench_sessions: session.prompt: dispatch %s\n", ah_err_name(rc));
      failures++;
      return 0;
    }
    if ((i + 1) % BURST == 0)
      uv_run(&loop, UV_RUN_NOWAIT);
  }
  if (!wait_turns(ended0 + n, "the burst turns to end") || !run_until(&r.receipts_done, "the burst receipts"))
    return 0;
  *events = bus_events - events0;
  return (double)(t_turns_done - t0) / 1e9;
}

/* ---- main -------------------------------------------------------------------------------------------- */

static void stopped(int status, void *arg) {
  (void)status;
  *(bool *)arg = true;
}

int main(int argc, char **argv) {
  bench_prog = "bench_sessions";
  size_t nprompts = argc > 1 ? strtoul(argv[1], NULL, 10) : 5000;
  size_t nsessions = argc > 2 ? strtoul(argv[2], NULL, 10) : 2000;
  if (nprompts == 0 || nsessions == 0) {
    fprintf(stderr, "usage: bench_sessions [PROMPTS [SESSIONS]]\n");
    return 2;
  }
  ah__log_set_level(AH_LOG_WARN);
  const char *tmp = getenv("TMPDIR");
  char dir[4096];
  if (bench_mkdtemp(dir, sizeof dir, tmp && *tmp ? tmp : "/tmp", "agenthost-bench-sessions") != 0)
    return 1;
  char state[4200], work[4200], base_db[4200];
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(work, sizeof work, "%s/work", dir);
  snprintf(base_db, sizeof base_db, "%s/baseline.db", dir);
  if (mkdir(work, 0700) != 0) {
    perror("bench_sessions: mkdir");
    return 1;
  }
  uv_loop_init(&loop);
  uv_timer_init(&loop, &tick);
  uv_timer_start(&tick, on_tick, 100, 100);

  uint64_t *host_lat = calloc(nprompts, sizeof *host_lat);
  uint64_t *base_lat = calloc(nprompts, sizeof *base_lat);
  create_run cr = {.n = nsessions};
  cr.ids = calloc(nsessions, sizeof *cr.ids);
  cr.rows = calloc(nsessions, ROW_MAX);
  cr.row_len = calloc(nsessions, sizeof *cr.row_len);
  create_slot *slots = calloc(nsessions, sizeof *slots);
  json_t **copies = calloc(nsessions, sizeof *copies);
  if (!host_lat || !base_lat || !cr.ids || !cr.rows || !cr.row_len || !slots || !copies) {
    fprintf(stderr, "bench_sessions: out of memory\n");
    return 1;
  }

  /* Baseline 1 first, alone on the loop. */
  baseline_store(base_db, base_lat, nprompts);

  ah_config cfg = {.state_dir = state, .default_provider = "echo"};
  ah_host_opts opts = {.loop = &loop, .config = &cfg, .mode = "serve", .drain_ms = 2000};
  int rc = failures ? -1 : ah__host_new(&opts, &host);
  if (rc != 0) {
    fprintf(stderr, "bench_sessions: cannot start the host: %s\n", rc < 0 ? ah_err_name(rc) : "?");
    return 1;
  }
  ah_sub *sub = NULL;
  if (ah__host_api(host)->subscribe(ah__host_core_mount(host), "session.event", on_event, NULL, &sub) != 0) {
    fprintf(stderr, "bench_sessions: cannot subscribe\n");
    failures++;
  }

  /* 1. Receipt latency with turns running. */
  latency_run lr = {.samples = host_lat, .n = nprompts};
  char first_id[37] = "";
  double turns1_s = 0;
  json_t *res =
      failures ? NULL : call_sync("session.create", json_pack("{s:s, s:s}", "cwd", work, "title", "b"));
  if (res) {
    snprintf(first_id, sizeof first_id, "%s", json_string_value(json_object_get(res, "sessionId")));
    json_decref(res);
    lr.session_id = first_id;
    uint64_t t0 = uv_hrtime();
    send_prompt(&lr);
    if (run_until(&lr.done, "the prompt receipts") && wait_turns(nprompts, "the prompt turns to end"))
      turns1_s = (double)(t_turns_done - t0) / 1e9;
  }

  /* 2. Memory per idle live session. */
  size_t heap0 = 0, heap1 = 0, base0 = 0, base1 = 0;
  long rss0 = 0, rss1 = 0;
  size_t live = 0;
  if (!failures && drain()) {
    heap0 = heap_bytes();
    rss0 = bench_status_kib(0, "VmRSS:");
    for (size_t i = 0; i < nsessions && !failures; i++) {
      slots[i] = (create_slot){&cr, i};
      json_t *p = json_pack("{s:s, s:s}", "cwd", work, "title", "bench");
      int drc = ah__host_dispatch(host, &caller, "session.create", p, NULL, created, &slots[i]);
      if (drc != 0) {
        fprintf(stderr, "bench_sessions: session.create: dispatch %s\n", ah_err_name(drc));
        failures++;
      }
    }
    if (!failures && run_until(&cr.done, "the session.create receipts") && drain()) {
      heap1 = heap_bytes();
      rss1 = bench_status_kib(0, "VmRSS:");
      live = ah__sessions_live(ah__host_sessions(host));
      /* Baseline: the same rows as jansson objects alone. */
      base0 = heap_bytes();
      for (size_t i = 0; i < nsessions; i++) {
        json_t *row = json_loadb(cr.rows + i * ROW_MAX, cr.row_len[i], 0, NULL);
        copies[i] = json_deep_copy(row);
        json_decref(row);
        if (!copies[i])
          failures++;
      }
      base1 = heap_bytes();
    }
  }

  /* 3. Durable events per second. */
  double spread_s = 0, one_s = 0;
  uint64_t spread_events = 0, one_events = 0;
  if (!failures)
    spread_s = burst_prompts(cr.ids, nsessions, nsessions, &spread_events);
  if (!failures)
    one_s = burst_prompts(&first_id, 1, nsessions, &one_events);

  /* Stop and close everything. */
  bool done = false;
  if (ah__host_stop(host, stopped, &done) == 0)
    run_until(&done, "the host to stop");
  else
    failures++;
  ah__host_free(host);
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  int close_rc = uv_loop_close(&loop);
  for (size_t i = 0; i < nsessions; i++)
    json_decref(copies[i]);

  dist h = summarize(host_lat, lr.received);
  dist b = summarize(base_lat, nprompts);
  printf("sessions: state dir in %s, synchronous=NORMAL, echo provider\n", tmp && *tmp ? tmp : "/tmp");
  printf("1. prompt receipt latency, %zu prompts one after another into one session (turns running):\n",
         lr.received);
  printf("   session.prompt receipt:   p50 %.3f ms  p99 %.3f ms  max %.3f ms  mean %.3f ms (target p99 <= 2 "
         "ms)\n",
         h.p50, h.p99, h.max, h.mean);
  printf("   baseline bare store write: p50 %.3f ms  p99 %.3f ms  max %.3f ms  mean %.3f ms (inbox.put + "
         "event)\n",
         b.p50, b.p99, b.max, b.mean);
  printf("   samples over 2 ms: %zu of %zu receipts, %zu of %zu baseline writes\n", h.over_2ms, lr.received,
         b.over_2ms, nprompts);
  printf("   ratio p99 receipt/baseline: %.2fx (p50 %.2fx)\n", b.p99 > 0 ? h.p99 / b.p99 : 0.0,
         b.p50 > 0 ? h.p50 / b.p50 : 0.0);
  printf("   turns of those prompts ended after %.2f s (%.0f turns/s)\n", turns1_s,
         turns1_s > 0 ? (double)nprompts / turns1_s : 0.0);
  double per_session = ((double)heap1 - (double)heap0) / (double)nsessions;
  double per_row = ((double)base1 - (double)base0) / (double)nsessions;
  printf("2. memory, %zu idle live sessions (%zu live in the manager):\n", nsessions, live);
  if (heap0 == 0 && heap1 == 0)
    printf(
        "   (mallinfo2 reports nothing: malloc is replaced, e.g. under valgrind; heap figures are void)\n");
  printf("   heap per session:         %.0f bytes (target <= 16384)\n", per_session);
  printf("   RSS per session:          %.0f bytes (%ld KiB -> %ld KiB; informational)\n",
         ((double)rss1 - (double)rss0) * 1024.0 / (double)nsessions, rss0, rss1);
  printf("   baseline row as jansson:  %.0f bytes per row\n", per_row);
  printf("   ratio session/row:        %.1fx\n", per_row > 0 ? per_session / per_row : 0.0);
  printf("3. durable events end to end (receipt through turn/ended on the bus):\n");
  printf("   %zu prompts over %zu sessions: %llu events in %.3f s = %.0f events/s (%.0f turns/s)\n",
         nsessions, nsessions, (unsigned long long)spread_events, spread_s,
         spread_s > 0 ? (double)spread_events / spread_s : 0.0,
         spread_s > 0 ? (double)nsessions / spread_s : 0.0);
  printf("   %zu prompts into one session: %llu events in %.3f s = %.0f events/s (%.0f turns/s)\n", nsessions,
         (unsigned long long)one_events, one_s, one_s > 0 ? (double)one_events / one_s : 0.0,
         one_s > 0 ? (double)nsessions / one_s : 0.0);
  printf("uv_loop_close:               %d\n", close_rc);

  free(host_lat);
  free(base_lat);
  free(cr.ids);
  free(cr.rows);
  free(cr.row_len);
  free(slots);
  free(copies);
  if (bench_rm_tree(dir) != 0) {
    perror("bench_sessions: removing the temporary directory");
    failures++;
  }
  int bad = failures != 0 || close_rc != 0;
  printf("%s\n", bad ? "RESULT: FAIL" : "RESULT: OK");
  return bad;
}
