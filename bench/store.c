/* Benchmark: durable events per second through the store's writer thread with group commit.
 *
 * N `event` operations (default 200000), one per opset, are submitted in bursts of 1000 per loop turn as
 * fast as the loop allows, with synchronous = NORMAL in a temporary directory; the figure is measured from
 * the first submit to the last callback (target ≥ 50000 events/s). The baseline, run in the same
 * invocation, writes the same events through the same backend with one transaction per event (no group
 * commit) for a smaller count (default 2000); the ratio shows what group commit buys.
 *
 * Reads: READS (default 2000) pages of 200 events of that session, at spread offsets, first as blocking
 * reads on the loop thread (the baseline: how reads were made before the reader thread), then through
 * ah__store_read (at most 8 in flight) while a 1 ms timer runs on the loop. Figures: reads per second each
 * way, and how long the loop is held: each blocking read (nothing else runs meanwhile) against the time
 * the loop takes to answer a ping from another thread (every 0.5 ms) while the reader thread reads (and on
 * the idle loop, its floor): p99 and max.
 *
 * Usage: bench_store [N [BASELINE_N [READS]]] (N at least 200000). Prints figures only; exits non-zero only
 * on errors.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agenthost/errors.h"
#include "log.h"
#include "store.h"

#define BURST 1000
#define SESSION_ID "0190b7a0-0000-7000-8000-000000000001"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static json_t *event_op(int64_t seq) {
  return json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:{s:s, s:I}}", "op", "event", "sessionId", SESSION_ID,
                   "seq", (json_int_t)seq, "kind", "message.delta", "time", "2025-01-01T00:00:00.000Z",
                   "turnId", "turn-1", "data", "text", "a few tokens of model output", "index",
                   (json_int_t)seq);
}

static json_t *session_opset(void) {
  return json_pack("[{s:s, s:{s:s, s:s, s:s, s:s, s:s}}]", "op", "session.put", "session", "id", SESSION_ID,
                   "cwd", "/tmp", "title", "bench", "provider", "echo", "status", "running");
}

typedef struct run_state {
  ah_store *store;
  uv_idle_t idle;
  int64_t n;
  int64_t submitted;
  int64_t completed;
  int64_t failed;
  uint64_t t_first;
  uint64_t t_last;
} run_state;

static void on_written(int status, const json_t *results, void *arg) {
  run_state *r = arg;
  (void)results;
  if (status < 0)
    r->failed++;
  if (++r->completed == r->n)
    r->t_last = now_ns();
}

static void submit_burst(uv_idle_t *idle) {
  run_state *r = idle->data;
  if (r->submitted == 0)
    r->t_first = now_ns();
  for (int i = 0; i < BURST && r->submitted < r->n; i++) {
    json_t *opset = json_array();
    json_array_append_new(opset, event_op(r->submitted + 1));
    if (ah__store_write(r->store, opset, on_written, r) < 0) {
      r->failed++;
      r->completed++;
    }
    r->submitted++;
  }
  if (r->submitted == r->n)
    uv_idle_stop(idle);
}

static void on_session(int status, const json_t *results, void *arg) {
  (void)results;
  *(int *)arg = status == 0 ? 1 : -1;
}

static void on_closed(void *arg) {
  *(bool *)arg = true;
}

static int store_open(uv_loop_t *loop, const char *path, ah_store **out) {
  char *why = NULL;
  ah_store_opts opts = {.path = path, .sync = AH_STORE_SYNC_NORMAL};
  if (ah__store_open(loop, NULL, &opts, out, &why) < 0) {
    fprintf(stderr, "bench_store: %s\n", why ? why : "cannot open the store");
    free(why);
    return -1;
  }
  return 0;
}

/* Close the store and the loop (every handle on it closed before). */
static int store_close(uv_loop_t *loop, ah_store *store) {
  bool closed = false;
  ah__store_close(store, on_closed, &closed);
  while (!closed)
    uv_run(loop, UV_RUN_ONCE);
  uv_run(loop, UV_RUN_NOWAIT);
  if (uv_loop_close(loop) != 0) {
    fprintf(stderr, "bench_store: a handle was left open\n");
    return -1;
  }
  return 0;
}

/* Group commit through the store; returns 0 and the figures, or -1. */
static int run_group(const char *path, int64_t n, double *rate, uint64_t *commits, uint64_t *opsets) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  run_state r = {.n = n};
  if (store_open(&loop, path, &r.store) < 0)
    return -1;
  int session = 0;
  if (ah__store_write(r.store, session_opset(), on_session, &session) < 0)
    return -1;
  while (session == 0)
    uv_run(&loop, UV_RUN_ONCE);
  uint64_t base_commits = ah__store_commits(r.store);
  uint64_t base_opsets = ah__store_opsets(r.store);

  uv_idle_init(&loop, &r.idle);
  r.idle.data = &r;
  uv_idle_start(&r.idle, submit_burst);
  while (r.completed < r.n)
    uv_run(&loop, UV_RUN_ONCE);
  *commits = ah__store_commits(r.store) - base_commits;
  *opsets = ah__store_opsets(r.store) - base_opsets;
  uv_close((uv_handle_t *)&r.idle, NULL);
  if (store_close(&loop, r.store) < 0)
    return -1;
  if (session < 0 || r.failed > 0) {
    fprintf(stderr, "bench_store: %lld writes failed\n", (long long)r.failed + (session < 0));
    return -1;
  }
  *rate = (double)n / ((double)(r.t_last - r.t_first) / 1e9);
  return 0;
}

typedef struct read_state {
  ah_store *store;
  int64_t n, submitted, completed, failed, events;
  int in_flight;
  /* The loop's answer time: a thread pings it (uv_async_send) every 0.5 ms, the loop answers in the
   * callback; `lat` are the times from the ping to the answer. */
  uv_async_t ping;
  pthread_t pinger;
  _Atomic uint64_t sent_at; /* 0 once answered */
  _Atomic bool pinging;
  uint64_t *lat;
  size_t nlat, caplat;
} read_state;

/* p99 and max of `n` samples (sorted in place). */
typedef struct spread {
  double p99_ms, max_ms;
} spread;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static spread spread_of(uint64_t *v, size_t n) {
  if (n == 0)
    return (spread){0, 0};
  qsort(v, n, sizeof *v, cmp_u64);
  return (spread){(double)v[(n * 99) / 100] / 1e6, (double)v[n - 1] / 1e6};
}

static void read_submit(read_state *r);

static void on_page(int status, const json_t *results, void *arg) {
  read_state *r = arg;
  r->completed++;
  r->in_flight--;
  if (status)
    r->failed++;
  else
    r->events += (int64_t)json_array_size(json_array_get(results, 0));
  read_submit(r);
}

static void read_submit(read_state *r) {
  while (r->in_flight < 8 && r->submitted < r->n) {
    int64_t after = (r->submitted * 7919) % 199000;
    ah_store_query q = {.kind = AH_STORE_Q_EVENTS, .id = SESSION_ID, .after = after, .limit = 200};
    if (ah__store_read(r->store, &q, 1, on_page, r) != 0) {
      r->failed++;
      r->completed++;
    } else {
      r->in_flight++;
    }
    r->submitted++;
  }
}

static void on_ping(uv_async_t *a) {
  read_state *r = a->data;
  uint64_t sent = atomic_exchange(&r->sent_at, 0);
  if (!sent)
    return;
  uint64_t took = now_ns() - sent;
  if (r->nlat == r->caplat) {
    size_t cap = r->caplat ? r->caplat * 2 : 4096;
    uint64_t *grown = realloc(r->lat, cap * sizeof *grown);
    if (!grown)
      return;
    r->lat = grown;
    r->caplat = cap;
  }
  r->lat[r->nlat++] = took;
}

static void *pinger_main(void *arg) {
  read_state *r = arg;
  while (atomic_load(&r->pinging)) {
    uint64_t idle = 0;
    if (atomic_compare_exchange_strong(&r->sent_at, &idle, now_ns()))
      uv_async_send(&r->ping);
    usleep(500);
  }
  return NULL;
}

/* Run the loop with the pinger for `ns` (idle), or until every read completed (`reads`); the answer
 * times. */
static spread pinged(uv_loop_t *loop, read_state *r, uint64_t ns, bool reads) {
  r->nlat = 0;
  atomic_store(&r->sent_at, 0);
  atomic_store(&r->pinging, true);
  if (pthread_create(&r->pinger, NULL, pinger_main, r) != 0)
    return (spread){0, 0};
  if (reads) {
    read_submit(r);
    while (r->completed < r->n)
      uv_run(loop, UV_RUN_ONCE);
  } else {
    for (uint64_t end = now_ns() + ns; now_ns() < end;)
      uv_run(loop, UV_RUN_ONCE);
  }
  atomic_store(&r->pinging, false);
  pthread_join(r->pinger, NULL);
  return spread_of(r->lat, r->nlat);
}

/* Pages of events read blocking on the loop thread, then through the reader thread. */
static int run_reads(const char *path, int64_t n, double *sync_rate, double *async_rate, spread *sync_read,
                     spread *async_gap, spread *idle_gap) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  read_state r = {.n = n};
  uint64_t *took = calloc((size_t)n, sizeof *took);
  if (!took || store_open(&loop, path, &r.store) < 0)
    return free(took), -1;
  int64_t failed = 0;
  uint64_t t0 = now_ns();
  for (int64_t i = 0; i < n; i++) {
    uint64_t a = now_ns();
    json_t *page = ah__store_events(r.store, SESSION_ID, (i * 7919) % 199000, 200);
    took[i] = now_ns() - a;
    failed += json_array_size(page) != 200;
    json_decref(page);
  }
  *sync_rate = (double)n / ((double)(now_ns() - t0) / 1e9);
  uv_async_init(&loop, &r.ping, on_ping);
  r.ping.data = &r;
  /* The idle loop first: the floor of the figure. */
  *idle_gap = pinged(&loop, &r, 500000000ull, false);
  t0 = now_ns();
  *async_gap = pinged(&loop, &r, 0, true);
  *async_rate = (double)n / ((double)(now_ns() - t0) / 1e9);
  *sync_read = spread_of(took, (size_t)n);
  free(took);
  free(r.lat);
  uv_close((uv_handle_t *)&r.ping, NULL);
  if (store_close(&loop, r.store) < 0)
    return -1;
  if (failed || r.failed || r.events != n * 200) {
    fprintf(stderr, "bench_store: %lld reads failed or came back short\n", (long long)(failed + r.failed));
    return -1;
  }
  return 0;
}

/* One transaction per event: the backend's write_group with a single opset, called directly. */
static int run_baseline(const char *path, int64_t n, double *rate) {
  const ah_store_backend *be = &ah__store_sqlite;
  void *impl = NULL;
  char *why = NULL;
  ah_store_opts opts = {.path = path, .sync = AH_STORE_SYNC_NORMAL};
  if (be->open(&opts, &impl, &why) < 0) {
    fprintf(stderr, "bench_store: %s\n", why ? why : "cannot open the store");
    free(why);
    return -1;
  }
  int failed = 0;
  json_t *session = session_opset();
  json_t *res = NULL;
  int status = 0;
  be->write_group(impl, &session, 1, &res, &status);
  json_decref(session);
  json_decref(res);
  failed += status < 0;
  uint64_t t0 = now_ns();
  for (int64_t i = 0; i < n; i++) {
    json_t *opset = json_array();
    json_array_append_new(opset, event_op(i + 1));
    be->write_group(impl, &opset, 1, &res, &status);
    failed += status < 0;
    json_decref(res);
    json_decref(opset);
  }
  uint64_t t1 = now_ns();
  be->close(impl);
  if (failed) {
    fprintf(stderr, "bench_store: %d baseline writes failed\n", failed);
    return -1;
  }
  *rate = (double)n / ((double)(t1 - t0) / 1e9);
  return 0;
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? strtoll(argv[1], NULL, 10) : 200000;
  int64_t base_n = argc > 2 ? strtoll(argv[2], NULL, 10) : 2000;
  int64_t reads = argc > 3 ? strtoll(argv[3], NULL, 10) : 2000;
  if (n < 200000 || base_n <= 0 || reads <= 0) {
    fprintf(stderr, "usage: bench_store [N (>= 200000) [BASELINE_N [READS]]]\n");
    return 2;
  }
  ah__log_set_level(AH_LOG_WARN);
  const char *tmp = getenv("TMPDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/agenthost-bench-store-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror("bench_store: mkdtemp");
    return 1;
  }
  char group_db[4200], base_db[4200];
  snprintf(group_db, sizeof group_db, "%s/group.db", dir);
  snprintf(base_db, sizeof base_db, "%s/baseline.db", dir);

  double rate = 0, base_rate = 0;
  uint64_t commits = 0, opsets = 0;
  int rc = run_group(group_db, n, &rate, &commits, &opsets);
  if (rc == 0)
    rc = run_baseline(base_db, base_n, &base_rate);
  double sync_rate = 0, async_rate = 0;
  spread sync_read = {0}, async_gap = {0}, idle_gap = {0};
  if (rc == 0)
    rc = run_reads(group_db, reads, &sync_rate, &async_rate, &sync_read, &async_gap, &idle_gap);
  if (rc == 0) {
    printf("store: %lld events, 1 per opset, synchronous=NORMAL\n", (long long)n);
    printf("store: group commit:        %.0f events/s (target >= 50000)\n", rate);
    printf("store: commits:             %llu for %llu opsets (%.1f opsets per commit)\n",
           (unsigned long long)commits, (unsigned long long)opsets,
           commits ? (double)opsets / (double)commits : 0.0);
    printf("store: baseline (1 tx/event, %lld events): %.0f events/s\n", (long long)base_n, base_rate);
    printf("store: ratio group/baseline: %.1fx\n", base_rate > 0 ? rate / base_rate : 0.0);
    printf("store: reads (%lld pages of 200 events): blocking on the loop %.0f/s, reader thread %.0f/s "
           "(%.2fx)\n",
           (long long)reads, sync_rate, async_rate, sync_rate > 0 ? async_rate / sync_rate : 0.0);
    printf("store: the loop held by a blocking read: p99 %.2f ms, max %.2f ms (each read holds it whole)\n",
           sync_read.p99_ms, sync_read.max_ms);
    printf("store: the loop's answer to a ping while the reader thread reads: p99 %.3f ms, max %.2f ms (idle "
           "loop: p99 %.3f ms, max %.2f ms)\n",
           async_gap.p99_ms, async_gap.max_ms, idle_gap.p99_ms, idle_gap.max_ms);
  }
  const char *suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char p[4300];
    snprintf(p, sizeof p, "%s%s", group_db, suffixes[i]);
    unlink(p);
    snprintf(p, sizeof p, "%s%s", base_db, suffixes[i]);
    unlink(p);
  }
  rmdir(dir);
  return rc == 0 ? 0 : 1;
}
