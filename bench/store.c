/* Benchmark: durable events per second through the store's writer thread with group commit.
 *
 * N `event` operations (default 200000), one per opset, are submitted in bursts of 1000 per loop turn as
 * fast as the loop allows, with synchronous = NORMAL in a temporary directory; the figure is measured from
 * the first submit to the last callback (target ≥ 50000 events/s). The baseline, run in the same
 * invocation, writes the same events through the same backend with one transaction per event (no group
 * commit) for a smaller count (default 2000); the ratio shows what group commit buys.
 *
 * Usage: bench_store [N [BASELINE_N]]. Prints figures only; exits non-zero only on errors.
 */
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
  bool closed;
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

/* Group commit through the store; returns 0 and the figures, or -1. */
static int run_group(const char *path, int64_t n, double *rate, uint64_t *commits, uint64_t *opsets) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  run_state r = {.n = n};
  char *why = NULL;
  ah_store_opts opts = {.path = path, .sync = AH_STORE_SYNC_NORMAL};
  if (ah__store_open(&loop, NULL, &opts, &r.store, &why) < 0) {
    fprintf(stderr, "bench_store: %s\n", why ? why : "cannot open the store");
    free(why);
    return -1;
  }
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
  ah__store_close(r.store, on_closed, &r.closed);
  while (!r.closed)
    uv_run(&loop, UV_RUN_ONCE);
  uv_run(&loop, UV_RUN_NOWAIT);
  if (uv_loop_close(&loop) != 0) {
    fprintf(stderr, "bench_store: a handle was left open\n");
    return -1;
  }
  if (session < 0 || r.failed > 0) {
    fprintf(stderr, "bench_store: %lld writes failed\n", (long long)r.failed + (session < 0));
    return -1;
  }
  *rate = (double)n / ((double)(r.t_last - r.t_first) / 1e9);
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
  if (n <= 0 || base_n <= 0) {
    fprintf(stderr, "usage: bench_store [N [BASELINE_N]]\n");
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
  if (rc == 0) {
    printf("store: %lld events, 1 per opset, synchronous=NORMAL\n", (long long)n);
    printf("store: group commit:        %.0f events/s (target >= 50000)\n", rate);
    printf("store: commits:             %llu for %llu opsets (%.1f opsets per commit)\n",
           (unsigned long long)commits, (unsigned long long)opsets,
           commits ? (double)opsets / (double)commits : 0.0);
    printf("store: baseline (1 tx/event, %lld events): %.0f events/s\n", (long long)base_n, base_rate);
    printf("store: ratio group/baseline: %.1fx\n", base_rate > 0 ? rate / base_rate : 0.0);
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
