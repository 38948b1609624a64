/* Benchmark: the SDK surface (`agenthost sdk`, JSON-RPC 2.0 JSON Lines on stdin/stdout) against a floor
 * measured in the same invocation: bench/bare_responder, a minimal libuv + jansson program that answers
 * every request (issue 4, acceptance "bench/").
 *
 * 1. Spawn → initialize answered: SPAWN_RUNS (default 20) fresh processes of each kind, run in turn; the
 *    clock starts before posix_spawn() and stops when the answer to `initialize` (written right after the
 *    spawn) has been read and parsed. agenthost runs as `agenthost --state-dir D --runtime-dir D/run
 *    --config EMPTY sdk`, once with a fresh state directory per run (the store is created and migrated) and
 *    once with a state directory reused across runs. Targets: median ≤ 10 ms and ≤ 2× the floor.
 *    Peak RSS: in the same processes, after initialize, 1,000 no-op requests are answered, then VmHWM is
 *    read from /proc/<pid>/status just before `shutdown`. Target ≤ 8 MB.
 * 2. No-op round trips over the pipe: one process of each kind, initialized, then a warm-up of 5,000
 *    requests and REQUESTS (default 200,000) requests pipelined with WINDOW (256) in flight, each timed from
 *    the write() that carried it to the parse of its answer; then 20,000 requests one at a time (window 1)
 *    for the unqueued latency. agenthost's no-op is the unknown method `bench/noop`, answered -32601 by the
 *    sdk plugin's dispatch without touching sessions (the plugin documents no cheaper no-op); the floor
 *    answers the same request {}. Target ≥ 150k round trips/s.
 *
 * Every child is shut down (`shutdown`, then stdin EOF), must exit 0, and is killed and reaped whatever
 * happens. Usage: bench_sdk AGENTHOST BARE_RESPONDER [SPAWN_RUNS [REQUESTS]]. Prints figures only; exits
 * non-zero only on errors (a child that fails or exits non-zero, a bad or missing answer), never on a
 * missed target.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define WINDOW 256
#define WARMUP 5000
#define RSS_REQUESTS 1000
#define SERIAL_REQUESTS 20000
#define WAIT_NS (10ull * 1000000000ull) /* any single wait for the child */
#define AH_NOT_FOUND (-32601)

/* ---- children ---------------------------------------------------------------------------------------- */

typedef struct child {
  bench_proc proc; /* label, pid, pipes (stdin, stdout), stderr log */
  bool agenthost;  /* the no-op is answered -32601 (agenthost) or {} (floor) */
  char *rbuf;
  size_t rlen, rcap;
  char *wbuf;
  size_t wlen, woff, wcap;
  /* the batch of requests in progress (ids first_id .. first_id + n - 1) */
  int64_t first_id;
  size_t n, sent, answered;
  uint64_t *sent_at; /* per request */
  uint64_t *lat;     /* per request, may be NULL */
  uint8_t *done;
  /* single requests (initialize, shutdown) */
  int64_t single_id;
  json_t *single_reply;
} child;

static void child_reap(child *c, bool kill_it) {
  bench_reap(&c->proc, kill_it);
  free(c->rbuf);
  free(c->wbuf);
  c->rbuf = c->wbuf = NULL;
  c->rlen = c->rcap = c->wlen = c->woff = c->wcap = 0;
  json_decref(c->single_reply);
  c->single_reply = NULL;
}

static int child_spawn(child *c, char *const argv[]) {
  if (bench_spawn(&c->proc, argv) != 0)
    return -1;
  fcntl(c->proc.to_fd, F_SETFL, fcntl(c->proc.to_fd, F_GETFL) | O_NONBLOCK);
  fcntl(c->proc.from_fd, F_SETFL, fcntl(c->proc.from_fd, F_GETFL) | O_NONBLOCK);
  return 0;
}

static void queue(child *c, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(c->wbuf ? c->wbuf + c->wlen : NULL, c->wcap - c->wlen, fmt, ap);
    va_end(ap);
    if (n >= 0 && c->wlen + (size_t)n < c->wcap) {
      c->wlen += (size_t)n;
      return;
    }
    c->wcap = c->wcap * 2 + (size_t)n + 256;
    c->wbuf = realloc(c->wbuf, c->wcap);
    if (!c->wbuf) {
      fprintf(stderr, "bench_sdk: out of memory\n");
      exit(1);
    }
  }
}

static int flush(child *c) {
  while (c->woff < c->wlen) {
    ssize_t n = write(c->proc.to_fd, c->wbuf + c->woff, c->wlen - c->woff);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR)
        return 0;
      bench_fail(&c->proc, "write to the child: %s", strerror(errno));
      return -1;
    }
    c->woff += (size_t)n;
  }
  c->woff = c->wlen = 0;
  return 0;
}

/* One answer: either to the single request in progress or to one of the batch. */
static int on_line(child *c, const char *text, size_t len) {
  json_error_t err;
  json_t *msg = json_loadb(text, len, 0, &err);
  json_t *id = msg ? json_object_get(msg, "id") : NULL;
  if (!msg || !json_is_integer(id) ||
      strcmp(json_string_value(json_object_get(msg, "jsonrpc")) ?: "", "2.0") != 0) {
    bench_fail(&c->proc, "bad line from the child: %.*s", (int)(len > 300 ? 300 : len), text);
    json_decref(msg);
    return -1;
  }
  int64_t i = json_integer_value(id);
  if (i == c->single_id && !c->single_reply) {
    c->single_reply = msg;
    return 0;
  }
  int64_t k = i - c->first_id;
  if (k < 0 || (size_t)k >= c->sent || c->done[k]) {
    bench_fail(&c->proc, "answer with an unexpected id: %.*s", (int)(len > 300 ? 300 : len), text);
    json_decref(msg);
    return -1;
  }
  bool ok = c->agenthost
                ? json_integer_value(json_object_get(json_object_get(msg, "error"), "code")) == AH_NOT_FOUND
                : json_is_object(json_object_get(msg, "result"));
  json_decref(msg);
  if (!ok) {
    bench_fail(&c->proc, "unexpected answer to the no-op: %.*s", (int)(len > 300 ? 300 : len), text);
    return -1;
  }
  c->done[k] = 1;
  if (c->lat)
    c->lat[k] = bench_now_ns() - c->sent_at[k];
  c->answered++;
  return 0;
}

/* Wait (until `deadline`) for the child to be readable or writable, then read and write what can be.
 * Returns 0, or -1 on an error, EOF or the deadline. */
static int pump(child *c, uint64_t deadline) {
  struct pollfd p[2] = {{.fd = c->proc.from_fd, .events = POLLIN}, {.fd = c->proc.to_fd, .events = POLLOUT}};
  uint64_t now = bench_now_ns();
  if (now >= deadline) {
    bench_fail(&c->proc, "no answer within %llu s", (unsigned long long)(WAIT_NS / 1000000000ull));
    return -1;
  }
  int ms = (int)((deadline - now) / 1000000u) + 1;
  int n = poll(p, c->woff < c->wlen ? 2 : 1, ms);
  if (n < 0 && errno != EINTR) {
    bench_fail(&c->proc, "poll: %s", strerror(errno));
    return -1;
  }
  if (n > 0 && (p[1].revents & (POLLOUT | POLLERR)) && flush(c) != 0)
    return -1;
  if (n <= 0 || !(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
    return 0;
  for (;;) {
    if (c->rcap - c->rlen < 65536) {
      c->rcap = c->rcap * 2 + 65536;
      c->rbuf = realloc(c->rbuf, c->rcap);
      if (!c->rbuf) {
        fprintf(stderr, "bench_sdk: out of memory\n");
        exit(1);
      }
    }
    ssize_t got = read(c->proc.from_fd, c->rbuf + c->rlen, c->rcap - c->rlen);
    if (got == 0) {
      bench_fail(&c->proc, "the child closed its stdout");
      return -1;
    }
    if (got < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN)
        break;
      bench_fail(&c->proc, "read from the child: %s", strerror(errno));
      return -1;
    }
    c->rlen += (size_t)got;
    if ((size_t)got < 65536)
      break;
  }
  size_t start = 0;
  for (;;) {
    char *nl = memchr(c->rbuf + start, '\n', c->rlen - start);
    if (!nl)
      break;
    size_t end = (size_t)(nl - c->rbuf);
    if (end > start && on_line(c, c->rbuf + start, end - start) != 0)
      return -1;
    start = end + 1;
  }
  memmove(c->rbuf, c->rbuf + start, c->rlen - start);
  c->rlen -= start;
  return 0;
}

/* Send one request and wait for its answer (left in c->single_reply). */
static int call(child *c, int64_t id, const char *method, const char *params_json) {
  json_decref(c->single_reply);
  c->single_reply = NULL;
  c->single_id = id;
  if (params_json)
    queue(c, "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"%s\",\"params\":%s}\n", (long long)id, method,
          params_json);
  else
    queue(c, "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"%s\"}\n", (long long)id, method);
  if (flush(c) != 0)
    return -1;
  uint64_t deadline = bench_now_ns() + WAIT_NS;
  while (!c->single_reply)
    if (pump(c, deadline) != 0)
      return -1;
  return 0;
}

/* `n` no-op requests with at most `window` in flight; `lat` (may be NULL) receives each latency. Returns the
 * wall time from the first write to the last answer, or 0 on an error. */
static uint64_t noops(child *c, int64_t first_id, size_t n, size_t window, uint64_t *lat) {
  c->first_id = first_id;
  c->n = n;
  c->sent = c->answered = 0;
  c->lat = lat;
  c->sent_at = malloc(n * sizeof *c->sent_at);
  c->done = calloc(n, 1);
  if (!c->sent_at || !c->done) {
    fprintf(stderr, "bench_sdk: out of memory\n");
    exit(1);
  }
  uint64_t t0 = bench_now_ns(), deadline = t0 + WAIT_NS;
  int rc = 0;
  while (rc == 0 && c->answered < n) {
    size_t batch0 = c->sent;
    while (c->sent < n && c->sent - c->answered < window) {
      queue(c, "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"bench/noop\"}\n",
            (long long)(first_id + (int64_t)c->sent));
      c->sent++;
    }
    if (c->sent > batch0) {
      uint64_t t = bench_now_ns();
      for (size_t i = batch0; i < c->sent; i++)
        c->sent_at[i] = t;
      rc = flush(c);
      deadline = t + WAIT_NS;
    }
    if (rc == 0)
      rc = pump(c, deadline);
  }
  uint64_t elapsed = bench_now_ns() - t0;
  free(c->sent_at);
  free(c->done);
  c->sent_at = NULL;
  c->done = NULL;
  c->lat = NULL;
  c->n = c->sent = c->answered = 0;
  return rc == 0 ? elapsed : 0;
}

/* `initialize`, checked. */
static int initialize(child *c, const char *cwd) {
  char params[600];
  snprintf(params, sizeof params, "{\"cwd\":\"%s\",\"clientInfo\":{\"name\":\"bench_sdk\"}}", cwd);
  if (call(c, 0, "initialize", params) != 0)
    return -1;
  json_t *info = json_object_get(json_object_get(c->single_reply, "result"), "serverInfo");
  if (!json_is_string(json_object_get(info, "name"))) {
    char *text = json_dumps(c->single_reply, JSON_COMPACT);
    bench_fail(&c->proc, "initialize answered without serverInfo.name: %s", text ? text : "?");
    free(text);
    return -1;
  }
  return 0;
}

/* `shutdown` answered {}, stdin EOF, stdout EOF, exit status 0; the child is reaped in every case. */
static int finish(child *c) {
  int rc = call(c, 999999999, "shutdown", NULL);
  if (rc == 0 && !json_is_object(json_object_get(c->single_reply, "result"))) {
    bench_fail(&c->proc, "shutdown was not answered with a result");
    rc = -1;
  }
  close(c->proc.to_fd);
  c->proc.to_fd = -1;
  uint64_t deadline = bench_now_ns() + WAIT_NS;
  int status = 0;
  pid_t got = 0;
  while (rc == 0 && (got = waitpid(c->proc.pid, &status, WNOHANG)) == 0) {
    if (bench_now_ns() > deadline) {
      bench_fail(&c->proc, "did not exit within %llu s of shutdown",
                 (unsigned long long)(WAIT_NS / 1000000000ull));
      rc = -1;
      break;
    }
    struct pollfd p = {.fd = c->proc.from_fd, .events = POLLIN};
    if (poll(&p, 1, 1) > 0) {
      char sink[4096];
      if (read(c->proc.from_fd, sink, sizeof sink) > 0) {
        bench_fail(&c->proc, "wrote after the answer to shutdown");
        rc = -1;
      }
    }
  }
  if (rc == 0 && got == c->proc.pid) {
    c->proc.pid = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      bench_fail(&c->proc, "exited with %s %d", WIFEXITED(status) ? "status" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      rc = -1;
    }
  }
  child_reap(c, true); /* no-op when already reaped */
  return rc;
}

/* ---- the runs ---------------------------------------------------------------------------------------- */

typedef struct target {
  const char *label;
  bool agenthost;
  bool fresh_state; /* a new state directory per process */
  char *argv[10];
  char state_dir[400];
  char run_dir[420];
  uint64_t *init_ns; /* per spawn run */
  long *hwm_kib;     /* per spawn run */
} target;

static char top_dir[256];
static char empty_config[300];

static int spawn_run(target *t, int run) {
  child c = {.proc = {.label = t->label, .to_fd = -1, .from_fd = -1}, .agenthost = t->agenthost};
  snprintf(c.proc.log_path, sizeof c.proc.log_path, "%s/%s.stderr", top_dir,
           t->agenthost ? "agenthost" : "floor");
  if (t->agenthost && (t->fresh_state || run == 0)) {
    snprintf(t->state_dir, sizeof t->state_dir, "%s/state-%s-%d", top_dir,
             t->fresh_state ? "fresh" : "reused", run);
    snprintf(t->run_dir, sizeof t->run_dir, "%s/run", t->state_dir);
  }
  uint64_t t0 = bench_now_ns();
  if (child_spawn(&c, t->argv) != 0)
    return -1;
  if (initialize(&c, top_dir) != 0) {
    child_reap(&c, true);
    return -1;
  }
  t->init_ns[run] = bench_now_ns() - t0;
  if (noops(&c, 1, RSS_REQUESTS, WINDOW, NULL) == 0) {
    child_reap(&c, true);
    return -1;
  }
  t->hwm_kib[run] = bench_status_kib(c.proc.pid, "VmHWM:");
  return finish(&c);
}

/* Nearest rank on sorted samples. */
static uint64_t pct(const uint64_t *v, size_t n, unsigned p) {
  return v[bench_rank(n, p)];
}

typedef struct rt_result {
  double per_s;
  double p50_us, p99_us, max_us;
  double serial_per_s;
  double serial_p50_us, serial_p99_us;
  long hwm_kib;
} rt_result;

static int rt_run(target *t, size_t n, rt_result *r) {
  child c = {.proc = {.label = t->label, .to_fd = -1, .from_fd = -1}, .agenthost = t->agenthost};
  snprintf(c.proc.log_path, sizeof c.proc.log_path, "%s/%s.stderr", top_dir,
           t->agenthost ? "agenthost" : "floor");
  if (t->agenthost) {
    snprintf(t->state_dir, sizeof t->state_dir, "%s/state-rt", top_dir);
    snprintf(t->run_dir, sizeof t->run_dir, "%s/run", t->state_dir);
  }
  uint64_t *lat = malloc((n > SERIAL_REQUESTS ? n : SERIAL_REQUESTS) * sizeof *lat);
  if (!lat || child_spawn(&c, t->argv) != 0) {
    free(lat);
    return -1;
  }
  uint64_t elapsed = 0, serial = 0;
  int rc = initialize(&c, top_dir);
  if (rc == 0)
    rc = noops(&c, 1, WARMUP, WINDOW, NULL) ? 0 : -1;
  if (rc == 0)
    rc = (elapsed = noops(&c, 1 + WARMUP, n, WINDOW, lat)) ? 0 : -1;
  if (rc == 0) {
    qsort(lat, n, sizeof *lat, bench_cmp_u64);
    r->per_s = (double)n / ((double)elapsed / 1e9);
    r->p50_us = (double)pct(lat, n, 50) / 1e3;
    r->p99_us = (double)pct(lat, n, 99) / 1e3;
    r->max_us = (double)lat[n - 1] / 1e3;
    rc = (serial = noops(&c, 1 + WARMUP + (int64_t)n, SERIAL_REQUESTS, 1, lat)) ? 0 : -1;
  }
  if (rc == 0) {
    qsort(lat, SERIAL_REQUESTS, sizeof *lat, bench_cmp_u64);
    r->serial_per_s = (double)SERIAL_REQUESTS / ((double)serial / 1e9);
    r->serial_p50_us = (double)pct(lat, SERIAL_REQUESTS, 50) / 1e3;
    r->serial_p99_us = (double)pct(lat, SERIAL_REQUESTS, 99) / 1e3;
    r->hwm_kib = bench_status_kib(c.proc.pid, "VmHWM:");
  }
  free(lat);
  if (rc != 0) {
    child_reap(&c, true);
    return -1;
  }
  return finish(&c);
}

int main(int argc, char **argv) {
  bench_prog = "bench_sdk";
  if (argc < 3) {
    fprintf(stderr, "usage: %s AGENTHOST BARE_RESPONDER [SPAWN_RUNS [REQUESTS]]\n", argv[0]);
    return 2;
  }
  int runs = argc > 3 ? atoi(argv[3]) : 20;
  size_t requests = argc > 4 ? (size_t)strtoull(argv[4], NULL, 10) : 200000;
  if (runs < 1 || requests < 100) {
    fprintf(stderr, "bench_sdk: SPAWN_RUNS must be >= 1 and REQUESTS >= 100\n");
    return 2;
  }
  bench_catch_stop_signals();

  if (bench_mkdtemp(top_dir, sizeof top_dir, getenv("TMPDIR") ?: "/tmp", "bench-sdk") != 0)
    return 1;
  snprintf(empty_config, sizeof empty_config, "%s/empty.ini", top_dir);
  FILE *f = fopen(empty_config, "w");
  if (f)
    fclose(f);

  target fresh = {.label = "agenthost sdk (fresh state dir)", .agenthost = true, .fresh_state = true};
  target reused = {.label = "agenthost sdk (state dir reused)", .agenthost = true};
  target floor_ = {.label = "bare responder (floor)"};
  target *all[3] = {&fresh, &reused, &floor_};
  for (int i = 0; i < 2; i++) {
    target *t = all[i];
    char **a = t->argv;
    a[0] = argv[1];
    a[1] = "--state-dir";
    a[2] = t->state_dir;
    a[3] = "--runtime-dir";
    a[4] = t->run_dir;
    a[5] = "--config";
    a[6] = empty_config;
    a[7] = "sdk";
  }
  floor_.argv[0] = argv[2];
  for (int i = 0; i < 3; i++) {
    all[i]->init_ns = calloc((size_t)runs, sizeof(uint64_t));
    all[i]->hwm_kib = calloc((size_t)runs, sizeof(long));
    if (!all[i]->init_ns || !all[i]->hwm_kib)
      return 1;
  }

  int errors = 0;
  /* 1. Spawn → initialize, the three kinds interleaved so that drift on the machine hits them alike. */
  for (int r = 0; r < runs && !errors; r++)
    for (int i = 0; i < 3 && !errors; i++)
      errors += spawn_run(all[i], r) != 0;

  /* 2. Round trips. */
  rt_result rt_ah = {0}, rt_floor = {0};
  if (!errors)
    errors += rt_run(&reused, requests, &rt_ah) != 0;
  if (!errors)
    errors += rt_run(&floor_, requests, &rt_floor) != 0;

  bench_rm_tree(top_dir);
  if (bench_stopped(errors))
    return 1;

  double med[3], max[3];
  long hwm_med[3], hwm_max[3];
  for (int i = 0; i < 3; i++) {
    qsort(all[i]->init_ns, (size_t)runs, sizeof(uint64_t), bench_cmp_u64);
    qsort(all[i]->hwm_kib, (size_t)runs, sizeof(long), bench_cmp_long);
    med[i] = (double)all[i]->init_ns[(runs - 1) / 2] / 1e6;
    max[i] = (double)all[i]->init_ns[runs - 1] / 1e6;
    hwm_med[i] = all[i]->hwm_kib[(runs - 1) / 2];
    hwm_max[i] = all[i]->hwm_kib[runs - 1];
  }

  printf("SDK surface: `agenthost sdk` against a bare libuv + jansson responder (the floor), same run\n");
  printf("agenthost: %s --state-dir D --runtime-dir D/run --config EMPTY sdk\n", argv[1]);
  printf("floor:     %s\n\n", argv[2]);

  printf("1. spawn -> initialize answered (%d fresh processes of each kind, interleaved)\n", runs);
  printf("   %-34s %10s %10s %16s\n", "", "median", "max", "median / floor");
  for (int i = 0; i < 3; i++)
    printf("   %-34s %7.2f ms %7.2f ms %15.2fx\n", all[i]->label, med[i], max[i], med[i] / med[2]);
  const char *short_label[2] = {"fresh state dir", "state dir reused"};
  for (int i = 0; i < 2; i++)
    printf("   targets, %-17s median <= 10 ms: %s; max <= 10 ms: %s; median <= 2x floor (%.2f ms): %s\n",
           short_label[i], bench_verdict(med[i] <= 10.0), bench_verdict(max[i] <= 10.0), 2.0 * med[2],
           bench_verdict(med[i] <= 2.0 * med[2]));
  printf("\n   peak RSS of the child (VmHWM after initialize + %d no-op requests, read before shutdown)\n",
         RSS_REQUESTS);
  printf("   %-34s %10s %10s %16s\n", "", "median", "max", "median / floor");
  for (int i = 0; i < 3; i++)
    printf("   %-34s %6ld KiB %6ld KiB %15.2fx\n", all[i]->label, hwm_med[i], hwm_max[i],
           (double)hwm_med[i] / (double)hwm_med[2]);
  for (int i = 0; i < 2; i++)
    printf("   target, %-18s max <= 8 MB (8192 KiB): %s\n", short_label[i],
           bench_verdict(hwm_max[i] <= 8192));

  printf(
      "\n2. no-op round trips over the pipe (one process each, after initialize and %d warm-up requests)\n",
      WARMUP);
  printf(
      "   no-op: agenthost answers `bench/noop` -32601 \"method not found\" from the sdk plugin's dispatch\n"
      "   (no session touched; the plugin has no cheaper no-op); the floor answers the same request {}\n");
  printf("   %zu requests, %d in flight, each timed from its write() to the parse of its answer:\n", requests,
         WINDOW);
  printf("   %-34s %12s %10s %10s %10s\n", "", "round trips/s", "p50", "p99", "max");
  printf("   %-34s %12.0f %7.1f us %7.1f us %7.1f us\n", "agenthost sdk", rt_ah.per_s, rt_ah.p50_us,
         rt_ah.p99_us, rt_ah.max_us);
  printf("   %-34s %12.0f %7.1f us %7.1f us %7.1f us\n", floor_.label, rt_floor.per_s, rt_floor.p50_us,
         rt_floor.p99_us, rt_floor.max_us);
  printf("   %-34s %11.2fx %9.2fx %9.2fx\n", "ratio agenthost / floor", rt_ah.per_s / rt_floor.per_s,
         rt_ah.p50_us / rt_floor.p50_us, rt_ah.p99_us / rt_floor.p99_us);
  printf("   target >= 150k round trips/s: %s\n", bench_verdict(rt_ah.per_s >= 150000.0));
  printf("   %d requests one at a time (window 1, unqueued latency):\n", SERIAL_REQUESTS);
  printf("   %-34s %12.0f %7.1f us %7.1f us\n", "agenthost sdk", rt_ah.serial_per_s, rt_ah.serial_p50_us,
         rt_ah.serial_p99_us);
  printf("   %-34s %12.0f %7.1f us %7.1f us\n", floor_.label, rt_floor.serial_per_s, rt_floor.serial_p50_us,
         rt_floor.serial_p99_us);
  printf("   %-34s %11.2fx %9.2fx %9.2fx\n", "ratio agenthost / floor",
         rt_ah.serial_per_s / rt_floor.serial_per_s, rt_ah.serial_p50_us / rt_floor.serial_p50_us,
         rt_ah.serial_p99_us / rt_floor.serial_p99_us);
  printf("   VmHWM after the round trips: agenthost %ld KiB, floor %ld KiB\n", rt_ah.hwm_kib,
         rt_floor.hwm_kib);
  for (int i = 0; i < 3; i++) {
    free(all[i]->init_ns);
    free(all[i]->hwm_kib);
  }
  return 0;
}
