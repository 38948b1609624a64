/* Benchmark: the PostgreSQL store beside SQLite, in one invocation (docs/scaling.md). Run beside the
 * cluster tests/support/with_pg.sh starts (AH_TEST_PG_URL: a database of its own on 127.0.0.1).
 *
 * 1. Durable events/s: N `event` opsets (default 20000) submitted in bursts of 1000 per loop turn through the
 *    store's group-commit writer, first to an SQLite file (synchronous = NORMAL), then to PostgreSQL
 *    (synchronous_commit on); from the first submit to the last callback. Ratio PostgreSQL / SQLite.
 * 2. Prompt receipt latency: a host in this process (the echo provider), one session, PROMPTS (default 2000)
 *    session.prompt calls one after another (the next when the previous receipt arrived), each timed from
 *    dispatch to the receipt (which comes once the prompt is stored); on SQLite, then on PostgreSQL. p50/p99
 *    and the ratio of the p99s.
 * 3. Failover time against the lease's TTL: two `agenthost serve` processes on the database; A creates a
 *    session and is stopped (SIGSTOP); B is prompted every 20 ms until it acknowledges (it took the session
 *    over). The time from the stop to B's receipt, for TTLs of 1, 2 and 4 s: expected between 2/3 of the TTL
 *    (the heartbeat is renewed every third of it) and the TTL, plus one prompt interval.
 *
 * Usage: bench_shared_store AGENTHOST [N [PROMPTS]]. Prints figures; exits non-zero only on errors.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "admin.h"
#include "agenthost/errors.h"
#include "bench_util.h"
#include "host.h"
#include "internal.h"
#include "store.h"

#define BURST 1000
#define SID "0190b7a0-0000-7000-8000-0000000000ee"

static uv_loop_t loop;
static int failures;

static void flag_written(int status, const json_t *results, void *arg) {
  (void)results;
  *(int *)arg = status == 0 ? 1 : -1;
}

static void flag_closed(void *arg) {
  *(bool *)arg = true;
}

/* ---- 1. durable events/s ------------------------------------------------------------------------------- */

typedef struct ev_run {
  ah_store *store;
  int64_t n, submitted, completed, failed;
  uint64_t t0, t1;
} ev_run;

static void ev_written(int status, const json_t *results, void *arg) {
  (void)results;
  ev_run *r = arg;
  r->failed += status != 0;
  if (++r->completed == r->n)
    r->t1 = bench_now_ns();
}

static double events_per_s(const ah_store_backend *be, const ah_store_opts *o, int64_t n) {
  ev_run r = {.n = n};
  char *why = NULL;
  if (ah__store_open(&loop, be, o, &r.store, &why) != 0) {
    fprintf(stderr, "bench_shared_store: %s: %s\n", be->name, why ? why : "cannot open");
    free(why);
    failures++;
    return 0;
  }
  int put = 0;
  ah__store_write(r.store,
                  json_pack("[{s:s, s:{s:s, s:s, s:s}}]", "op", "session.put", "session", "id", SID, "cwd",
                            "/tmp", "provider", "echo"),
                  flag_written, &put);
  while (!put)
    uv_run(&loop, UV_RUN_ONCE);
  r.t0 = bench_now_ns();
  while (r.completed < n) {
    for (int i = 0; i < BURST && r.submitted < n; i++, r.submitted++) {
      json_t *ops =
          json_pack("[{s:s, s:s, s:I, s:s, s:s, s:s, s:{s:s}}]", "op", "event", "sessionId", SID, "seq",
                    (json_int_t)r.submitted + 1, "kind", "message/committed", "time",
                    "2026-01-01T00:00:00.000Z", "turnId", "t", "data", "text", "a few tokens of output");
      if (ah__store_write(r.store, ops, ev_written, &r) != 0) {
        r.failed++;
        r.completed++;
      }
    }
    uv_run(&loop, UV_RUN_ONCE);
  }
  bool closed = false;
  ah__store_close(r.store, flag_closed, &closed);
  while (!closed)
    uv_run(&loop, UV_RUN_ONCE);
  if (r.failed || put < 0) {
    fprintf(stderr, "bench_shared_store: %s: %lld writes failed\n", be->name, (long long)r.failed);
    failures++;
    return 0;
  }
  return (double)n / ((double)(r.t1 - r.t0) / 1e9);
}

/* ---- 2. prompt receipt latency ----------------------------------------------------------------------------
 */

static const ah_caller caller = {
    .struct_size = sizeof caller, .authority = AH_AUTH_ADMIN, .surface = "bench"};

typedef struct lat_run {
  ah_host *host;
  const char *sid;
  uint64_t *v;
  size_t n, got;
  uint64_t t;
  bool done;
  bool failed;
} lat_run;

static void lat_send(lat_run *r);

static void lat_receipt(const ah_outcome *o, void *arg) {
  lat_run *r = arg;
  r->v[r->got++] = bench_now_ns() - r->t;
  if (o->status != 0) {
    fprintf(stderr, "bench_shared_store: session.prompt: %s %s\n", ah_err_name(o->status),
            o->message ? o->message : "");
    r->failed = true;
  }
  if (r->got == r->n || r->failed)
    r->done = true;
  else
    lat_send(r);
}

static void lat_send(lat_run *r) {
  r->t = bench_now_ns();
  if (ah__host_dispatch(r->host, &caller, "session.prompt",
                        json_pack("{s:s, s:s}", "sessionId", r->sid, "text", "hello from the benchmark"),
                        NULL, lat_receipt, r) != 0) {
    r->failed = true;
    r->done = true;
  }
}

typedef struct created_ctx {
  char id[64];
  bool done;
} created_ctx;

static void on_created(const ah_outcome *o, void *arg) {
  created_ctx *c = arg;
  const char *id = o->status == 0 ? json_string_value(json_object_get(o->result, "sessionId")) : NULL;
  snprintf(c->id, sizeof c->id, "%s", id ? id : "");
  c->done = true;
}

static void on_stopped(int status, void *arg) {
  (void)status;
  *(bool *)arg = true;
}

/* p50 and p99 (µs) of PROMPTS receipts on a host whose store `cfg` names. */
static int receipts(ah_config *cfg, const char *work, size_t n, double *p50, double *p99) {
  ah_host *host = NULL;
  ah_host_opts opts = {.loop = &loop, .config = cfg, .mode = "serve", .drain_ms = 2000};
  int rc = ah__host_new(&opts, &host);
  if (rc != 0) {
    fprintf(stderr, "bench_shared_store: cannot start a host: %s\n", ah_err_name(rc));
    return -1;
  }
  created_ctx c = {0};
  ah__host_dispatch(host, &caller, "session.create", json_pack("{s:s}", "cwd", work), NULL, on_created, &c);
  while (!c.done)
    uv_run(&loop, UV_RUN_ONCE);
  lat_run r = {.host = host, .sid = c.id, .n = n, .v = calloc(n, sizeof(uint64_t))};
  if (c.id[0] && r.v) {
    lat_send(&r);
    while (!r.done)
      uv_run(&loop, UV_RUN_ONCE);
  }
  bool stopped = false;
  if (ah__host_stop(host, on_stopped, &stopped) == 0)
    while (!stopped)
      uv_run(&loop, UV_RUN_ONCE);
  ah__host_free(host);
  if (!c.id[0] || !r.v || r.failed || r.got != n) {
    free(r.v);
    return -1;
  }
  qsort(r.v, n, sizeof r.v[0], bench_cmp_u64);
  *p50 = (double)r.v[bench_rank(n, 50)] / 1e3;
  *p99 = (double)r.v[bench_rank(n, 99)] / 1e3;
  free(r.v);
  return 0;
}

/* ---- 3. failover ----------------------------------------------------------------------------------------
 */

static pid_t serve(const char *exe, const char *dir, const char *name, const char *config) {
  char state[4300], run[4300], log[4300];
  snprintf(state, sizeof state, "%s/%s-state", dir, name);
  snprintf(run, sizeof run, "%s/%s-run", dir, name);
  snprintf(log, sizeof log, "%s/%s.log", dir, name);
  fflush(stdout); /* the child must not print what this process has buffered */
  pid_t pid = fork();
  if (pid == 0) {
    FILE *f = freopen(log, "w", stderr);
    (void)f;
    if (!freopen("/dev/null", "w", stdout))
      _exit(127);
    execl(exe, exe, "--config", config, "--state-dir", state, "--runtime-dir", run, "serve", (char *)NULL);
    _exit(127);
  }
  /* Ready once it answers on its admin socket. */
  for (int i = 0; i < 500; i++) {
    json_t *res = NULL, *err = NULL;
    int rc = ah__admin_call(run, "plugin.list", NULL, 1000, &res, &err);
    json_decref(res);
    json_decref(err);
    if (rc == 0)
      return pid;
    usleep(20 * 1000);
  }
  fprintf(stderr, "bench_shared_store: %s does not answer (see %s)\n", name, log);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static void stop(pid_t pid) {
  if (pid <= 0)
    return;
  kill(pid, SIGCONT);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
}

/* Milliseconds from the owner's stop to another host's receipt, or -1. */
static double failover(const char *exe, const char *dir, const char *url, const char *pwfile, int ttl) {
  char config[4300];
  snprintf(config, sizeof config, "%s/ttl-%d.ini", dir, ttl);
  FILE *f = fopen(config, "w");
  if (!f)
    return -1;
  fprintf(
      f,
      "[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n[plugin.mcp]\nenabled = false\n"
      "[host]\nlease_ttl_ms = %d\nstore_url = %s\nstore_password_file = %s\n",
      ttl, url, pwfile);
  fclose(f);
  char a_name[32], b_name[32], a_run[4300], b_run[4300];
  snprintf(a_name, sizeof a_name, "a%d", ttl);
  snprintf(b_name, sizeof b_name, "b%d", ttl);
  snprintf(a_run, sizeof a_run, "%s/%s-run", dir, a_name);
  snprintf(b_run, sizeof b_run, "%s/%s-run", dir, b_name);
  pid_t a = serve(exe, dir, a_name, config);
  pid_t b = a > 0 ? serve(exe, dir, b_name, config) : -1;
  double ms = -1;
  json_t *res = NULL, *err = NULL;
  if (b > 0 &&
      ah__admin_call(a_run, "session.create", json_pack("{s:s}", "cwd", dir), 10000, &res, &err) == 0) {
    char sid[64];
    snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(res, "sessionId")));
    json_decref(res);
    res = NULL;
    usleep((useconds_t)(ttl / 3 + 50) * 1000u); /* a heartbeat or two, as in a running host */
    uint64_t t0 = bench_now_ns();
    kill(a, SIGSTOP);
    for (uint64_t end = t0 + (uint64_t)(ttl * 5 + 10000) * 1000000u; bench_now_ns() < end;) {
      int rc = ah__admin_call(b_run, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", "x"),
                              10000, &res, &err);
      bool acked = rc == 0 && json_object_get(res, "messageId");
      /* With A stopped (its lease still held), B posts the prompt for A: acknowledged, but A runs it. A
       * takeover shows as B holding the session. */
      json_decref(res);
      json_decref(err);
      res = err = NULL;
      if (acked) {
        json_t *got = NULL;
        if (ah__admin_call(b_run, "session.get", json_pack("{s:s}", "sessionId", sid), 10000, &got, &err) ==
            0) {
          const char *owner = json_string_value(json_object_get(json_object_get(got, "session"), "owner"));
          char mine[32];
          snprintf(mine, sizeof mine, ":%ld", (long)b);
          if (owner && strstr(owner, mine)) {
            ms = (double)(bench_now_ns() - t0) / 1e6;
            json_decref(got);
            break;
          }
        }
        json_decref(got);
        json_decref(err);
        err = NULL;
      }
      usleep(20 * 1000);
    }
  }
  json_decref(res);
  json_decref(err);
  stop(a);
  stop(b);
  return ms;
}

int main(int argc, char **argv) {
  bench_prog = "bench_shared_store";
  const char *exe = argc > 1 ? argv[1] : NULL;
  int64_t n = argc > 2 ? strtoll(argv[2], NULL, 10) : 20000;
  size_t prompts = argc > 3 ? strtoul(argv[3], NULL, 10) : 2000;
  const char *url = getenv("AH_TEST_PG_URL");
  const char *password = getenv("AH_TEST_PG_PASSWORD");
  if (!exe || n <= 0 || prompts == 0) {
    fprintf(stderr, "usage: bench_shared_store AGENTHOST [N [PROMPTS]]\n");
    return 2;
  }
  if (!url || !password) {
    fprintf(stderr,
            "bench_shared_store: AH_TEST_PG_URL is not set: run it through tests/support/with_pg.sh\n");
    return 1;
  }
  ah__log_set_level(AH_LOG_WARN);
  char dir[4096];
  const char *tmp = getenv("TMPDIR");
  if (bench_mkdtemp(dir, sizeof dir, tmp && *tmp ? tmp : "/tmp", "agenthost-bench-shared") != 0)
    return 1;
  uv_loop_init(&loop);

  /* 1 */
  char db[4200];
  snprintf(db, sizeof db, "%s/events.db", dir);
  ah_store_opts so = {.path = db, .sync = AH_STORE_SYNC_NORMAL};
  double sq = events_per_s(&ah__store_sqlite, &so, n);
  ah_store_opts po = {.url = url, .password = password, .sync = AH_STORE_SYNC_NORMAL};
  double pg = events_per_s(&ah__store_pg, &po, n);
  printf("shared-store: durable events/s, %lld events, 1 per opset, group commit\n", (long long)n);
  printf("shared-store:   SQLite (synchronous NORMAL):        %10.0f events/s\n", sq);
  printf("shared-store:   PostgreSQL (synchronous_commit on): %10.0f events/s  (%.2fx SQLite)\n", pg,
         sq > 0 ? pg / sq : 0);

  /* 2 */
  char state1[4200], state2[4200], work[4200], pwfile[4200];
  snprintf(state1, sizeof state1, "%s/s1", dir);
  snprintf(state2, sizeof state2, "%s/s2", dir);
  snprintf(work, sizeof work, "%s/work", dir);
  snprintf(pwfile, sizeof pwfile, "%s/pw", dir);
  mkdir(work, 0700);
  FILE *pf = fopen(pwfile, "w");
  if (pf) {
    fprintf(pf, "%s\n", password);
    fclose(pf);
  }
  double s50 = 0, s99 = 0, p50 = 0, p99 = 0;
  ah_config c1 = {.state_dir = state1, .default_provider = "echo"};
  ah_config c2 = {.state_dir = state2,
                  .default_provider = "echo",
                  .store_url = (char *)url,
                  .store_password = (char *)password};
  if (receipts(&c1, work, prompts, &s50, &s99) != 0 || receipts(&c2, work, prompts, &p50, &p99) != 0)
    failures++;
  printf("shared-store: prompt receipt (stored before it is sent), %zu prompts one after another\n", prompts);
  printf("shared-store:   SQLite:     p50 %7.1f us  p99 %7.1f us\n", s50, s99);
  printf("shared-store:   PostgreSQL: p50 %7.1f us  p99 %7.1f us  (p99 %.2fx SQLite)\n", p50, p99,
         s99 > 0 ? p99 / s99 : 0);

  /* 3 */
  printf("shared-store: failover (owner stopped -> another host acknowledges as the new owner)\n");
  static const int ttls[] = {1000, 2000, 4000};
  for (size_t i = 0; i < sizeof ttls / sizeof ttls[0]; i++) {
    double ms = failover(exe, dir, url, pwfile, ttls[i]);
    if (ms < 0) {
      failures++;
      printf("shared-store:   TTL %5d ms: no takeover\n", ttls[i]);
      continue;
    }
    bool within = ms >= ttls[i] * 2.0 / 3.0 - 50 && ms <= ttls[i] + 500;
    printf("shared-store:   TTL %5d ms: %7.0f ms (%.2fx the TTL; expected 0.67-1.0x plus a prompt interval: "
           "%s)\n",
           ttls[i], ms, ms / ttls[i], bench_verdict(within));
  }
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  if (!failures)
    bench_rm_tree(dir);
  else
    fprintf(stderr, "bench_shared_store: the hosts' logs are in %s\n", dir);
  return failures ? 1 : 0;
}
