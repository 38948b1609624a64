/* Benchmark: cost that does not grow with the number of sessions. A real `agenthost serve` (echo provider,
 * no surfaces), driven over one admin-socket connection with WINDOW requests in flight, as a user with many
 * sessions would drive it.
 *
 * 1. Throughput by live sessions ([host] idle_unload_s = 3600: nothing leaves memory): for each tier
 *    (default 1,000, 10,000 and 100,000 sessions) the sessions are created until the tier's count is live,
 *    then each session created for the tier is prompted once — in rounds until MIN_PROMPTS were answered
 *    for a small tier; prompts/s is prompts answered per second, from the first prompt sent to the stored
 *    time of the last turn's end, with every session of the tier in memory. Every turn is then awaited (the
 *    stored turn/ended events counted through session.events). Target: the last tier's rate at least 90 %
 *    of the first's. Heap and RSS per live session (host.stats) are printed after each tier, and again
 *    after the first tier's sessions ran TURNS more turns each (memory per session after N turns).
 * 2. Restart with the last tier's sessions in the store: the time from the daemon's start to its first
 *    answer, and the first session.list page.
 * 3. Memory with idle unload set short (idle_unload_s = 0.5), a fresh state: the first tier is created and
 *    prompted, its sessions leave memory (host.stats live = 0), the RSS is read; then up to the last tier
 *    the same, and the RSS again. Target: within 20 % of the first figure.
 *
 * Usage: bench_scale AGENTHOST [TIER...]. Prints figures and verdicts; exits non-zero only on errors (a
 * failed call, a lost turn, a daemon that dies), never on a missed target.
 */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define WINDOW 64
#define TURNS 10
#define MIN_PROMPTS 20000
#define MAX_TIERS 8
#define WAIT_S 600

static int errors;

/* ---- a daemon ---------------------------------------------------------------------------------------- */

typedef struct daemon {
  char dir[512], state[600], run[600], cfg[600], sock[640], log[600];
  pid_t pid;
} daemon_t;

static void write_config(daemon_t *d, const char *idle) {
  FILE *f = fopen(d->cfg, "w");
  if (!f) {
    perror("bench_scale: config");
    exit(1);
  }
  fprintf(
      f,
      "[plugin.browser]\nenabled = false\n[plugin.remote]\nenabled = false\n[plugin.mcp]\nenabled = false\n"
      "[host]\nlog_level = warn\nidle_unload_s = %s\n",
      idle);
  fclose(f);
}

static void spawn_daemon(daemon_t *d, const char *agenthost) {
  fflush(NULL); /* the child must not write what is buffered here */
  pid_t pid = fork();
  if (pid < 0) {
    perror("bench_scale: fork");
    exit(1);
  }
  if (pid == 0) {
    FILE *e = freopen(d->log, "a", stderr);
    (void)e;
    FILE *o = freopen("/dev/null", "w", stdout);
    (void)o;
    execl(agenthost, agenthost, "--config", d->cfg, "--state-dir", d->state, "--runtime-dir", d->run, "serve",
          (char *)NULL);
    _exit(127);
  }
  d->pid = pid;
  bench_live_pid = pid;
}

static void daemon_init(daemon_t *d, const char *name, const char *idle) {
  memset(d, 0, sizeof *d);
  if (bench_mkdtemp(d->dir, sizeof d->dir, "/tmp", name) != 0)
    exit(1);
  snprintf(d->state, sizeof d->state, "%s/state", d->dir);
  snprintf(d->run, sizeof d->run, "%s/run", d->dir);
  snprintf(d->cfg, sizeof d->cfg, "%s/agenthost.ini", d->dir);
  snprintf(d->sock, sizeof d->sock, "%s/admin.sock", d->run);
  snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
  write_config(d, idle);
}

static void daemon_stop(daemon_t *d) {
  if (d->pid <= 0)
    return;
  kill(d->pid, SIGTERM);
  int st = 0;
  waitpid(d->pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "bench_scale: the daemon exited with status %#x (log: %s)\n", st, d->log);
    errors++;
  }
  d->pid = 0;
  bench_live_pid = 0;
}

/* ---- one admin connection, pipelined ------------------------------------------------------------------- */

typedef struct conn {
  int fd;
  char *buf;
  size_t len, cap;
  long next_id;
} conn;

static bool conn_open(conn *c, const daemon_t *d, int timeout_ms) {
  memset(c, 0, sizeof *c);
  c->fd = -1;
  c->cap = 1 << 20;
  c->buf = malloc(c->cap);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (!c->buf || strlen(d->sock) >= sizeof sa.sun_path)
    return false;
  memcpy(sa.sun_path, d->sock, strlen(d->sock) + 1);
  uint64_t deadline = bench_now_ns() + (uint64_t)timeout_ms * 1000000u;
  while (bench_now_ns() < deadline) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
      c->fd = fd;
      return true;
    }
    if (fd >= 0)
      close(fd);
    usleep(2000);
  }
  return false;
}

static void conn_close(conn *c) {
  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
  free(c->buf);
  c->buf = NULL;
}

static void send_all(conn *c, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(c->fd, s, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      fprintf(stderr, "bench_scale: the admin socket closed while writing\n");
      exit(1);
    }
    s += w;
    n -= (size_t)w;
  }
}

/* Send `method` with `params` (JSON text); its id. */
static long send_call(conn *c, const char *method, const char *params) {
  char line[1024];
  long id = ++c->next_id;
  int n = snprintf(line, sizeof line, "{\"jsonrpc\":\"2.0\",\"id\":%ld,\"method\":\"%s\",\"params\":%s}\n",
                   id, method, params ? params : "{}");
  if (n <= 0 || (size_t)n >= sizeof line) {
    fprintf(stderr, "bench_scale: request too long\n");
    exit(1);
  }
  send_all(c, line, (size_t)n);
  return id;
}

/* The next answer (owned); exits on EOF or an error answer. Answers come in request order on one
 * connection only when they are sent that way — callers match by id where it matters. */
static json_t *read_answer(conn *c) {
  for (;;) {
    char *nl = memchr(c->buf, '\n', c->len);
    if (nl) {
      size_t used = (size_t)(nl - c->buf) + 1;
      json_error_t e;
      json_t *m = json_loadb(c->buf, used - 1, 0, &e);
      memmove(c->buf, c->buf + used, c->len - used);
      c->len -= used;
      if (!m || !json_object_get(m, "id"))
        continue; /* a notification, or noise: not an answer */
      json_t *err = json_object_get(m, "error");
      if (err) {
        char *t = json_dumps(err, JSON_COMPACT);
        fprintf(stderr, "bench_scale: a call failed: %s\n", t ? t : "?");
        free(t);
        exit(1);
      }
      return m;
    }
    if (c->len == c->cap) {
      c->cap *= 2;
      c->buf = realloc(c->buf, c->cap);
      if (!c->buf)
        exit(1);
    }
    ssize_t r = read(c->fd, c->buf + c->len, c->cap - c->len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      fprintf(stderr, "bench_scale: the daemon closed the admin socket\n");
      exit(1);
    }
    c->len += (size_t)r;
  }
}

static json_t *call(conn *c, const char *method, const char *params) {
  send_call(c, method, params);
  json_t *m = read_answer(c);
  json_t *r = json_incref(json_object_get(m, "result"));
  json_decref(m);
  return r;
}

/* ---- the work ------------------------------------------------------------------------------------------ */

typedef struct ids {
  char (*v)[40];
  size_t n, cap;
} ids;

/* Create sessions into slots [from, to) of `s` (capacity there), WINDOW in flight. */
static void create_into(conn *c, ids *s, size_t from, size_t to, const char *cwd) {
  char params[700];
  snprintf(params, sizeof params, "{\"cwd\":\"%s\"}", cwd);
  for (size_t sent = from, got = from; got < to;) {
    while (sent < to && sent - got < WINDOW) {
      send_call(c, "session.create", params);
      sent++;
    }
    json_t *m = read_answer(c);
    const char *id = json_string_value(json_object_get(json_object_get(m, "result"), "sessionId"));
    if (!id || strlen(id) >= sizeof s->v[0]) {
      fprintf(stderr, "bench_scale: session.create answered no sessionId\n");
      exit(1);
    }
    snprintf(s->v[got++], sizeof s->v[0], "%s", id);
    json_decref(m);
  }
}

/* Create sessions until `to` exist; their ids appended. Returns creates/s. */
static double create_until(conn *c, ids *s, size_t to, const char *cwd) {
  if (to > s->cap) {
    s->cap = to;
    s->v = realloc(s->v, s->cap * sizeof *s->v);
    if (!s->v)
      exit(1);
  }
  size_t from = s->n;
  uint64_t t0 = bench_now_ns();
  create_into(c, s, from, to, cwd);
  s->n = to;
  return (double)(to - from) * 1e9 / (double)(bench_now_ns() - t0);
}

/* Prompt sessions [from, to) once each, WINDOW in flight. Returns receipts/s. */
static double prompt_range(conn *c, const ids *s, size_t from, size_t to, const char *text) {
  char params[256];
  size_t sent = from, got = from;
  uint64_t t0 = bench_now_ns();
  while (got < to) {
    while (sent < to && sent - got < WINDOW) {
      snprintf(params, sizeof params, "{\"sessionId\":\"%s\",\"text\":\"%s\"}", s->v[sent], text);
      send_call(c, "session.prompt", params);
      sent++;
    }
    json_t *m = read_answer(c);
    if (!json_string_value(json_object_get(json_object_get(m, "result"), "messageId"))) {
      fprintf(stderr, "bench_scale: a prompt got no messageId\n");
      exit(1);
    }
    json_decref(m);
    got++;
  }
  return (double)(to - from) * 1e9 / (double)(bench_now_ns() - t0);
}

/* Wall-clock milliseconds (the clock of the events' `time`). */
static double wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* An event's time ("2026-01-05T10:22:40.102Z") in wall-clock milliseconds, 0 when unreadable. */
static double event_ms(const char *t) {
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  int ms = 0;
  if (!t || sscanf(t, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                   &tm.tm_sec, &ms) != 7)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return (double)timegm(&tm) * 1e3 + ms;
}

/* Read the stored events after *cursor until `want` more turn/ended are seen (at most WAIT_S); the time
 * of the last of them (wall-clock ms). */
static double await_turns(conn *c, int64_t *cursor, size_t want) {
  size_t seen = 0;
  double last = 0;
  uint64_t deadline = bench_now_ns() + (uint64_t)WAIT_S * 1000000000u;
  while (seen < want) {
    char params[96];
    snprintf(params, sizeof params, "{\"after\":%lld,\"limit\":1000}", (long long)*cursor);
    json_t *r = call(c, "session.events", params);
    json_t *events = json_object_get(r, "events");
    size_t i = 0;
    json_t *e = NULL;
    json_array_foreach(events, i, e) {
      const char *kind = json_string_value(json_object_get(e, "kind"));
      if (kind && strcmp(kind, "turn/ended") == 0) {
        seen++;
        double at = event_ms(json_string_value(json_object_get(e, "time")));
        if (at > last)
          last = at;
        const char *reason = json_string_value(json_object_get(json_object_get(e, "data"), "reason"));
        if (!reason || strcmp(reason, "error") == 0 || strcmp(reason, "cancelled") == 0) {
          fprintf(stderr, "bench_scale: a turn ended %s\n", reason ? reason : "without a reason");
          exit(1);
        }
      }
      *cursor = json_integer_value(json_object_get(e, "cursor"));
    }
    bool empty = json_array_size(events) == 0;
    json_decref(r);
    if (empty) {
      if (bench_now_ns() > deadline) {
        fprintf(stderr, "bench_scale: %zu of %zu turns ended after %d s\n", seen, want, WAIT_S);
        exit(1);
      }
      usleep(20000);
    }
  }
  return last;
}

/* Close sessions [from, to) and put new ones in their places (the live count stays), WINDOW in flight. */
static void replace_range(conn *c, ids *s, size_t from, size_t to, const char *cwd) {
  char params[700];
  for (size_t sent = from, got = from; got < to;) {
    while (sent < to && sent - got < WINDOW) {
      snprintf(params, sizeof params, "{\"sessionId\":\"%s\"}", s->v[sent++]);
      send_call(c, "session.close", params);
    }
    json_decref(read_answer(c));
    got++;
  }
  create_into(c, s, from, to, cwd);
}

/* Prompt sessions [from, to) once each, in rounds until MIN_PROMPTS were answered — a fraction of a second
 * is too short a sample on a shared machine. Before each round after the first, the sessions are replaced
 * by new ones (not timed), so every prompt measured is a new session's first, with the same count live.
 * Prompts answered per second, from each round's first prompt to the stored time of its last turn's end;
 * *receipts_per_s: the receipts' own rate. */
static double prompt_rounds(conn *c, ids *s, size_t from, size_t to, const char *cwd, int64_t *cursor,
                            double *receipts_per_s) {
  size_t n = to - from, done = 0;
  double spent_ms = 0, receipts = 0;
  for (int round = 0; round == 0 || done < MIN_PROMPTS; round++) {
    if (round > 0)
      replace_range(c, s, from, to, cwd);
    double t0 = wall_ms();
    receipts += prompt_range(c, s, from, to, "hello") * (double)n;
    double end = await_turns(c, cursor, n);
    spent_ms += end > t0 ? end - t0 : 0;
    done += n;
  }
  if (receipts_per_s)
    *receipts_per_s = receipts / (double)done;
  return spent_ms > 0 ? (double)done * 1e3 / spent_ms : 0;
}

/* The cursor of the newest stored event. */
static int64_t newest_cursor(conn *c) {
  int64_t cursor = 0;
  for (;;) {
    char params[96];
    snprintf(params, sizeof params, "{\"after\":%lld,\"limit\":1000}", (long long)cursor);
    json_t *r = call(c, "session.events", params);
    json_t *ev = json_object_get(r, "events");
    size_t k = json_array_size(ev);
    if (k)
      cursor = json_integer_value(json_object_get(json_array_get(ev, k - 1), "cursor"));
    json_decref(r);
    if (k < 1000)
      return cursor;
  }
}

typedef struct stats {
  long live, loads, unloads, rss_kib;
  double heap;
} stats;

static stats get_stats(conn *c) {
  json_t *r = call(c, "host.stats", NULL);
  json_t *s = json_object_get(r, "sessions"), *m = json_object_get(r, "memory");
  stats out = {.live = (long)json_integer_value(json_object_get(s, "live")),
               .loads = (long)json_integer_value(json_object_get(s, "loads")),
               .unloads = (long)json_integer_value(json_object_get(s, "unloads")),
               .rss_kib = (long)json_integer_value(json_object_get(m, "rssKiB")),
               .heap = (double)json_integer_value(json_object_get(m, "heapBytes"))};
  json_decref(r);
  return out;
}

/* Wait until no session is live (idle unload), then a little more for the heap trim that follows. */
static stats await_unloaded(conn *c) {
  uint64_t deadline = bench_now_ns() + (uint64_t)WAIT_S * 1000000000u;
  stats s = get_stats(c);
  while (s.live > 0) {
    if (bench_now_ns() > deadline) {
      fprintf(stderr, "bench_scale: %ld sessions still live after %d s\n", s.live, WAIT_S);
      exit(1);
    }
    usleep(50000);
    s = get_stats(c);
  }
  usleep(1200000); /* two sweeps: the trim runs at the one after the last unload */
  return get_stats(c);
}

static size_t parse_tier(const char *s) {
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 10 || v > 10000000) {
    fprintf(stderr, "bench_scale: a tier is a number of sessions (10..10000000): %s\n", s);
    exit(2);
  }
  return (size_t)v;
}

int main(int argc, char **argv) {
  bench_prog = "bench_scale";
  if (argc < 2) {
    fprintf(stderr, "usage: bench_scale AGENTHOST [TIER...]\n");
    return 2;
  }
  bench_catch_stop_signals();
  const char *agenthost = argv[1];
  size_t tiers[MAX_TIERS] = {1000, 10000, 100000};
  size_t ntiers = 3;
  if (argc > 2) {
    ntiers = 0;
    for (int i = 2; i < argc && ntiers < MAX_TIERS; i++)
      tiers[ntiers++] = parse_tier(argv[i]);
    for (size_t i = 1; i < ntiers; i++)
      if (tiers[i] <= tiers[i - 1]) {
        fprintf(stderr, "bench_scale: tiers must grow\n");
        return 2;
      }
  }
  size_t last = tiers[ntiers - 1];

  /* 1. Throughput by live sessions. */
  daemon_t d;
  daemon_init(&d, "ah-bench-scale", "3600");
  char cwd[600];
  snprintf(cwd, sizeof cwd, "%s/work", d.dir);
  if (mkdir(cwd, 0700) != 0) {
    perror("bench_scale: mkdir");
    return 1;
  }
  spawn_daemon(&d, agenthost);
  conn c;
  if (!conn_open(&c, &d, 10000)) {
    fprintf(stderr, "bench_scale: the daemon's admin socket did not answer (log: %s)\n", d.log);
    return 1;
  }
  stats base = get_stats(&c);
  printf(
      "bench_scale: one `agenthost serve` (echo provider, no surfaces), one admin connection, %d requests in "
      "flight\n",
      WINDOW);
  printf("  empty daemon: RSS %.1f MB, heap %.1f MB\n", (double)base.rss_kib / 1024.0, base.heap / 1048576.0);
  printf("\n1. prompt throughput by live sessions (idle_unload_s = 3600: all stay in memory)\n");
  printf("  prompts/s: prompts answered per second, from the first prompt sent to the last turn's end as "
         "stored\n"
         "  (receipts/s: the receipts alone, the turns still running behind them)\n");
  printf("  %10s  %10s  %11s  %10s  %9s  %13s  %12s\n", "live", "creates/s", "receipts/s", "prompts/s",
         "RSS MB", "heap/session", "RSS/session");
  ids s = {0};
  int64_t cursor = 0;
  /* A warm-up, not measured: the daemon's first turns fill its caches and grow its heap. */
  {
    ids warm = {0};
    create_until(&c, &warm, tiers[0], cwd);
    prompt_range(&c, &warm, 0, tiers[0], "warm-up");
    await_turns(&c, &cursor, tiers[0]);
    replace_range(&c, &warm, 0, tiers[0], cwd);
    for (size_t i = 0; i < warm.n; i++) { /* closed: none of them stays live */
      char params[128];
      snprintf(params, sizeof params, "{\"sessionId\":\"%s\"}", warm.v[i]);
      json_decref(call(&c, "session.close", params));
    }
    free(warm.v);
  }
  double rate[MAX_TIERS] = {0};
  stats after[MAX_TIERS];
  for (size_t t = 0; t < ntiers; t++) {
    size_t from = s.n;
    double creates = create_until(&c, &s, tiers[t], cwd);
    double receipts = 0;
    rate[t] = prompt_rounds(&c, &s, from, tiers[t], cwd, &cursor, &receipts);
    after[t] = get_stats(&c);
    if ((size_t)after[t].live != tiers[t]) {
      fprintf(stderr, "bench_scale: %ld live, %zu expected\n", after[t].live, tiers[t]);
      errors++;
    }
    printf("  %10zu  %10.0f  %11.0f  %10.0f  %9.1f  %10.1f KB  %9.1f KB\n", tiers[t], creates, receipts,
           rate[t], (double)after[t].rss_kib / 1024.0,
           (after[t].heap - base.heap) / (double)tiers[t] / 1024.0,
           (double)(after[t].rss_kib - base.rss_kib) / (double)tiers[t]);
  }
  double ratio = rate[ntiers - 1] / rate[0];
  printf("  %zu-session rate / %zu-session rate: %.2f (target >= 0.90: %s)\n", last, tiers[0], ratio,
         bench_verdict(ratio >= 0.90));
  /* Memory per live session after more turns: the first tier's sessions run TURNS - 1 more each. */
  size_t few = tiers[0];
  stats before_turns = get_stats(&c);
  for (int k = 1; k < TURNS; k++) {
    prompt_range(&c, &s, 0, few, "again");
    await_turns(&c, &cursor, few);
  }
  stats after_turns = get_stats(&c);
  printf("  after %d more turns in each of %zu sessions: heap %+.2f KB per session (history is read from the "
         "store, not kept)\n",
         TURNS, few, (after_turns.heap - before_turns.heap) / (double)few / 1024.0);

  /* 2. Restart with every session in the store. */
  conn_close(&c);
  daemon_stop(&d);
  uint64_t t0 = bench_now_ns();
  spawn_daemon(&d, agenthost);
  if (!conn_open(&c, &d, 60000)) {
    fprintf(stderr, "bench_scale: the restarted daemon did not answer (log: %s)\n", d.log);
    return 1;
  }
  json_decref(call(&c, "host.describe", NULL));
  double ready_ms = (double)(bench_now_ns() - t0) / 1e6;
  uint64_t t1 = bench_now_ns();
  json_t *page = call(&c, "session.list", "{}");
  double list_ms = (double)(bench_now_ns() - t1) / 1e6;
  size_t listed = json_array_size(json_object_get(page, "sessions"));
  json_decref(page);
  stats cold = get_stats(&c);
  printf(
      "\n2. restart with %zu sessions in the store: ready (first answer) in %.0f ms, first session.list page "
      "(%zu) in %.1f ms, RSS %.1f MB, %ld live\n",
      s.n, ready_ms, listed, list_ms, (double)cold.rss_kib / 1024.0, cold.live);
  /* The same store with the first tier's count live (new sessions): what the store's size costs, apart
   * from the live set. */
  cursor = newest_cursor(&c);
  size_t first = tiers[0];
  ids fresh = {0};
  create_until(&c, &fresh, first, cwd);
  double same_store = prompt_rounds(&c, &fresh, 0, first, cwd, &cursor, NULL);
  free(fresh.v);
  printf("  %zu new sessions live on this store of %zu: %.0f prompts/s; phase 1's %zu-live rate / this: %.2f "
         "(the "
         "live set's own cost)\n",
         first, s.n, same_store, last, rate[ntiers - 1] / same_store);
  conn_close(&c);
  daemon_stop(&d);
  bench_rm_tree(d.dir);

  /* 3. Memory with idle unload set short. */
  daemon_init(&d, "ah-bench-scale-idle", "0.5");
  snprintf(cwd, sizeof cwd, "%s/work", d.dir);
  if (mkdir(cwd, 0700) != 0) {
    perror("bench_scale: mkdir");
    return 1;
  }
  spawn_daemon(&d, agenthost);
  if (!conn_open(&c, &d, 10000)) {
    fprintf(stderr, "bench_scale: the daemon's admin socket did not answer (log: %s)\n", d.log);
    return 1;
  }
  printf("\n3. memory with idle_unload_s = 0.5: created, prompted once, then left idle\n");
  s.n = 0;
  cursor = 0;
  double rss_first = 0, rss_last = 0;
  long peak_kib = 0;
  for (size_t t = 0; t < ntiers; t++) {
    if (t != 0 && t != ntiers - 1)
      continue; /* the first and the last tier */
    size_t from = s.n;
    bench_peak_reset(d.pid);
    create_until(&c, &s, tiers[t], cwd);
    prompt_range(&c, &s, from, tiers[t], "hello");
    await_turns(&c, &cursor, tiers[t] - from);
    long peak = bench_status_kib(d.pid, "VmHWM:");
    if (peak > peak_kib)
      peak_kib = peak;
    stats idle = await_unloaded(&c);
    double mb = (double)idle.rss_kib / 1024.0;
    printf(
        "  %10zu sessions: RSS %.1f MB, heap %.1f MB once idle (%ld unloaded, 0 live; peak RSS %.1f MB while "
        "they ran)\n",
        tiers[t], mb, idle.heap / 1048576.0, idle.unloads, (double)peak / 1024.0);
    printf("  %10s  of it anonymous %.1f MB, file %.1f MB, shared memory %.1f MB\n", "",
           (double)bench_status_kib(d.pid, "RssAnon:") / 1024.0,
           (double)bench_status_kib(d.pid, "RssFile:") / 1024.0,
           (double)bench_status_kib(d.pid, "RssShmem:") / 1024.0);
    if (t == 0)
      rss_first = mb;
    rss_last = mb;
  }
  double mratio = rss_last / rss_first;
  printf("  RSS after %zu / after %zu: %.2f (target <= 1.20: %s)\n", last, tiers[0], mratio,
         bench_verdict(mratio <= 1.20));
  conn_close(&c);
  daemon_stop(&d);
  bench_rm_tree(d.dir);
  free(s.v);
  return bench_stopped(errors) ? 1 : 0;
}
