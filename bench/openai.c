/* Benchmark: the host's overhead on a model stream (the openai provider on the core's HTTP client), against
 * a floor measured in the same invocation: a bare libcurl reader of the same stream from the same server.
 *
 * The server is the tests' fake model (tests/fakes/fake_model.py) with `stamp`: every event carries the
 * CLOCK_MONOTONIC time of its own write, so a reader on this machine knows each chunk's latency from the
 * server's write to its own read.
 *
 * 1. Chunk → client: STREAMS streams of CHUNKS events, INTERVAL ms apart. Floor: libcurl reads them and
 *    parses each `data:` line. Host: `agenthost acp` with `[plugin.acp] stream_deltas = true` forwards each
 *    delta as an agent_message_chunk on its stdout (the surface that forwards every chunk on a pipe); the
 *    latency is the server's write → the bench's read of that line. And `agenthost serve`: each delta as a
 *    session.delta frame on the browser surface's mux WebSocket. p50 / p99 of each, and the difference.
 * 2. Last chunk → SDK notification: `agenthost sdk` forwards no deltas, so its figure is the stream's last
 *    event (with finish_reason) → the session.event message/committed notification (the commit is a store
 *    write). p50 / p99.
 * 3. Overhead per model round trip: a one-event answer with no delay, ROUND_TRIPS times: the host's
 *    session/prompt → turn/ended notification against libcurl's request → end of body.
 * 4. CONCURRENT streaming turns at once (one session each) in one `agenthost sdk`: its CPU time (utime +
 *    stime) and peak RSS (VmHWM) over the run, against the floor's CPU for the same transfers through one
 *    libcurl multi handle.
 *
 * Usage: bench_openai AGENTHOST FAKE_MODEL_PY [STREAMS [CHUNKS [INTERVAL_MS [CONCURRENT]]]]. Prints figures;
 * exits non-zero only on errors. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "ws_client.h"

#define WAIT_NS (60ull * 1000000000ull)

static int fake_port, fake_control;
static char dir[512];

/* ---- the fake server -------------------------------------------------------------------------------- */

static int read_port(const char *path) {
  FILE *f = fopen(path, "r");
  int p = 0;
  if (f) {
    if (fscanf(f, "%d", &p) != 1)
      p = 0;
    fclose(f);
  }
  return p;
}

static int control_post(const char *body) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)fake_control),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  char head[256];
  int hl = snprintf(head, sizeof head,
                    "POST /_control/script HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %zu\r\n"
                    "Connection: close\r\n\r\n",
                    strlen(body));
  bool ok = write(fd, head, (size_t)hl) == hl && write(fd, body, strlen(body)) == (ssize_t)strlen(body);
  char buf[512];
  ssize_t n = ok ? read(fd, buf, sizeof buf - 1) : -1;
  close(fd);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  return strstr(buf, " 200 ") ? 0 : -1;
}

/* A script of `n` identical stamped streams of `chunks` events `interval` ms apart (the last one with
 * finish_reason stop), then [DONE]. */
static char *stream_script(int n, int chunks, int interval) {
  json_t *steps = json_array();
  for (int s = 0; s < n; s++) {
    json_t *events = json_array();
    for (int i = 0; i < chunks; i++) {
      json_t *ch = json_pack("{s:[{s:i, s:{s:s}}]}", "choices", "index", 0, "delta", "content", "t={{t}};");
      if (i == chunks - 1)
        json_object_set_new(json_array_get(json_object_get(ch, "choices"), 0), "finish_reason",
                            json_string("stop"));
      json_array_append_new(events, ch);
    }
    json_array_append_new(events, json_string("[DONE]"));
    json_array_append_new(steps,
                          json_pack("{s:o, s:i, s:b}", "sse", events, "delay_ms", interval, "stamp", 1));
  }
  char *text = json_dumps(steps, JSON_COMPACT);
  json_decref(steps);
  return text;
}

/* Every "t=NS;" in `text`: its latency to `now` appended to lat. */
static void stamps(const char *text, uint64_t now, uint64_t *lat, size_t *n, size_t cap) {
  for (const char *p = strstr(text, "t="); p && *n < cap; p = strstr(p + 2, "t=")) {
    uint64_t t = strtoull(p + 2, NULL, 10);
    if (t && t <= now)
      lat[(*n)++] = now - t;
  }
}

static void report(const char *what, uint64_t *lat, size_t n, uint64_t *p50, uint64_t *p99) {
  qsort(lat, n, sizeof *lat, bench_cmp_u64);
  *p50 = n ? lat[bench_rank(n, 50)] : 0;
  *p99 = n ? lat[bench_rank(n, 99)] : 0;
  printf("   %-40s p50 %7.3f ms  p99 %7.3f ms  (%zu samples)\n", what, *p50 / 1e6, *p99 / 1e6, n);
}

/* ---- the floor: libcurl -------------------------------------------------------------------------------- */

typedef struct floor_rd {
  char line[8192];
  size_t len;
  uint64_t *lat;
  size_t n, cap;
} floor_rd;

static size_t floor_write(char *data, size_t size, size_t nm, void *arg) {
  floor_rd *r = arg;
  size_t len = size * nm;
  uint64_t now = bench_now_ns();
  for (size_t i = 0; i < len; i++) {
    if (data[i] == '\n') {
      r->line[r->len] = '\0';
      if (strncmp(r->line, "data:", 5) == 0)
        stamps(r->line, now, r->lat, &r->n, r->cap);
      r->len = 0;
    } else if (r->len + 1 < sizeof r->line) {
      r->line[r->len++] = data[i];
    }
  }
  return len;
}

static CURL *floor_easy(floor_rd *r) {
  CURL *e = curl_easy_init();
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", fake_port);
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, "{\"model\":\"m1\",\"stream\":true,\"messages\":[]}");
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, floor_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  return e;
}

static double cpu_self_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* ---- agenthost on pipes -------------------------------------------------------------------------------- */

typedef struct peer {
  bench_proc proc;
  char *buf;
  size_t len, cap;
} peer;

static int send_line(peer *p, const char *fmt, ...) {
  char *s = NULL;
  va_list ap;
  va_start(ap, fmt);
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0)
    return -1;
  size_t off = 0;
  while (off < (size_t)n) {
    ssize_t w = write(p->proc.to_fd, s + off, (size_t)n - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      free(s);
      return -1;
    }
    off += (size_t)w;
  }
  free(s);
  return write(p->proc.to_fd, "\n", 1) == 1 ? 0 : -1;
}

/* The next line (parsed) and the time it was read, or NULL at the deadline / EOF. */
static json_t *next_msg(peer *p, uint64_t deadline, uint64_t *at) {
  for (;;) {
    char *nl = p->len ? memchr(p->buf, '\n', p->len) : NULL;
    if (nl) {
      *nl = '\0';
      json_t *j = json_loads(p->buf, 0, NULL);
      size_t used = (size_t)(nl - p->buf) + 1;
      memmove(p->buf, p->buf + used, p->len - used);
      p->len -= used;
      if (j)
        return j;
      continue;
    }
    uint64_t now = bench_now_ns();
    if (now >= deadline || bench_stop_signal)
      return NULL;
    struct pollfd pf = {.fd = p->proc.from_fd, .events = POLLIN};
    int r = poll(&pf, 1, (int)((deadline - now) / 1000000 + 1));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return NULL;
    if (p->len + 65536 > p->cap) {
      p->cap = (p->len + 65536) * 2;
      p->buf = realloc(p->buf, p->cap);
    }
    ssize_t n = read(p->proc.from_fd, p->buf + p->len, p->cap - p->len);
    if (n <= 0)
      return NULL;
    *at = bench_now_ns();
    p->len += (size_t)n;
  }
}

/* Waits for the response to `id`; other messages go to `on_other` (may be NULL). */
static json_t *wait_response(peer *p, int id, void (*on_other)(json_t *m, uint64_t at, void *arg),
                             void *arg) {
  uint64_t deadline = bench_now_ns() + WAIT_NS;
  uint64_t at = 0;
  json_t *m = NULL;
  while ((m = next_msg(p, deadline, &at))) {
    json_t *mid = json_object_get(m, "id");
    if (mid && json_integer_value(mid) == id && !json_object_get(m, "method"))
      return m;
    if (on_other)
      on_other(m, at, arg);
    json_decref(m);
  }
  return NULL;
}

static int spawn_host(peer *p, const char *agenthost, const char *mode, const char *conf, const char *state) {
  memset(p, 0, sizeof *p);
  p->proc.label = mode;
  snprintf(p->proc.log_path, sizeof p->proc.log_path, "%s/%s.log", dir, mode);
  char run[700];
  snprintf(run, sizeof run, "%s/run", state);
  char *argv[] = {(char *)agenthost, "--state-dir", (char *)state, "--runtime-dir", run, "--config",
                  (char *)conf,      "--log-level", "warn",        (char *)mode,    NULL};
  return bench_spawn(&p->proc, argv);
}

static void end_host(peer *p) {
  bench_reap(&p->proc, true);
  free(p->buf);
}

/* ---- 1. chunk → client --------------------------------------------------------------------------------- */

typedef struct acp_ctx {
  uint64_t *lat;
  size_t n, cap;
} acp_ctx;

static void acp_update(json_t *m, uint64_t at, void *arg) {
  acp_ctx *c = arg;
  const char *method = json_string_value(json_object_get(m, "method"));
  if (!method || strcmp(method, "session/update") != 0)
    return;
  json_t *u = json_object_get(json_object_get(m, "params"), "update");
  const char *kind = json_string_value(json_object_get(u, "sessionUpdate"));
  const char *text = json_string_value(json_object_get(json_object_get(u, "content"), "text"));
  if (kind && strcmp(kind, "agent_message_chunk") == 0 && text)
    stamps(text, at, c->lat, &c->n, c->cap);
}

static int run_acp(const char *agenthost, const char *conf, const char *state, const char *cwd, int streams,
                   acp_ctx *c) {
  peer p;
  if (spawn_host(&p, agenthost, "acp", conf, state) != 0)
    return -1;
  int rc = -1;
  json_t *r = NULL;
  if (send_line(
          &p,
          "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}") ||
      !(r = wait_response(&p, 1, NULL, NULL)))
    goto out;
  json_decref(r);
  if (send_line(&p,
                "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"session/new\",\"params\":{\"cwd\":\"%s\","
                "\"mcpServers\":[]}}",
                cwd) ||
      !(r = wait_response(&p, 2, NULL, NULL)))
    goto out;
  const char *sid = json_string_value(json_object_get(json_object_get(r, "result"), "sessionId"));
  char session[128];
  snprintf(session, sizeof session, "%s", sid ? sid : "");
  json_decref(r);
  if (!sid) {
    bench_fail(&p.proc, "session/new failed");
    goto out;
  }
  for (int s = 0; s < streams; s++) {
    if (send_line(
            &p,
            "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"%s\","
            "\"prompt\":[{\"type\":\"text\",\"text\":\"go\"}]}}",
            10 + s, session) ||
        !(r = wait_response(&p, 10 + s, acp_update, c))) {
      bench_fail(&p.proc, "session/prompt %d got no answer", s);
      goto out;
    }
    const char *stop = json_string_value(json_object_get(json_object_get(r, "result"), "stopReason"));
    bool ok = stop && strcmp(stop, "end_turn") == 0;
    json_decref(r);
    if (!ok) {
      bench_fail(&p.proc, "prompt %d did not end end_turn", s);
      goto out;
    }
  }
  rc = 0;
out:
  end_host(&p);
  return rc;
}

/* ---- 1b. chunk → WebSocket frame (the browser surface's mux) --------------------------------------------
 */

typedef struct web {
  pid_t pid;
  int out_fd;
  int port;
  char token[128];
} web;

static int web_start(web *w, const char *agenthost, const char *conf, const char *state) {
  memset(w, 0, sizeof *w);
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  char run[800], log[800];
  snprintf(run, sizeof run, "%s/run-web", state);
  snprintf(log, sizeof log, "%s/serve.log", dir);
  w->pid = fork();
  if (w->pid == 0) {
    dup2(fds[1], 1);
    int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (lf >= 0)
      dup2(lf, 2);
    close(fds[0]);
    execl(agenthost, "agenthost", "--state-dir", state, "--runtime-dir", run, "--config", conf, "--listen",
          "127.0.0.1:0", "--log-level", "warn", "serve", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  w->out_fd = fds[0];
  char buf[1024] = "";
  size_t n = 0;
  uint64_t deadline = bench_now_ns() + WAIT_NS;
  while (n < sizeof buf - 1 && bench_now_ns() < deadline) {
    struct pollfd pf = {.fd = w->out_fd, .events = POLLIN};
    if (poll(&pf, 1, 200) <= 0)
      continue;
    ssize_t r = read(w->out_fd, buf + n, sizeof buf - 1 - n);
    if (r <= 0)
      break;
    n += (size_t)r;
    buf[n] = '\0';
    const char *k = strstr(buf, "#k=");
    const char *c = strstr(buf, "127.0.0.1:");
    if (k && c && strchr(k, '\n')) {
      w->port = atoi(c + 10);
      snprintf(w->token, sizeof w->token, "%.*s", (int)strcspn(k + 3, "\r\n"), k + 3);
      return 0;
    }
  }
  fprintf(stderr, "bench_openai: agenthost serve printed no launch URL (see %s)\n", log);
  return -1;
}

static void web_stop(web *w) {
  if (w->pid > 0) {
    kill(w->pid, SIGTERM);
    waitpid(w->pid, NULL, 0);
  }
  if (w->out_fd > 0)
    close(w->out_fd);
}

static json_t *web_call(web *w, const char *method, json_t *payload) {
  json_t *env = json_pack("{s:s, s:s, s:s, s:o}", "kind", "client-request", "rpcId", "b1", "method", method,
                          "payload", payload);
  char *body = json_dumps(env, JSON_COMPACT);
  json_decref(env);
  char head[1024];
  snprintf(head, sizeof head,
           "POST /api/%s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\n"
           "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
           method, w->port, w->token, strlen(body));
  int fd = tc_connect(w->port, 0);
  tc_resp r = {0};
  int status =
      fd >= 0 && tc_send_str(fd, head) && tc_send_str(fd, body) ? tc_read_response(fd, &r, 30000) : -1;
  free(body);
  if (fd >= 0)
    close(fd);
  json_t *res = status == 200 ? json_loadb(r.body, r.body_len, 0, NULL) : NULL;
  json_t *value = json_incref(json_object_get(res, "value"));
  json_decref(res);
  tc_resp_free(&r);
  return value;
}

/* STREAMS prompts in one session of `agenthost serve`; each session.delta frame's stamps measured at its
 * read on the mux WebSocket. */
static int run_web(const char *agenthost, const char *conf, const char *state, const char *cwd, int streams,
                   acp_ctx *c) {
  web w;
  if (web_start(&w, agenthost, conf, state) != 0) {
    web_stop(&w);
    return -1;
  }
  int rc = -1;
  char extra[512];
  snprintf(extra, sizeof extra, "Sec-WebSocket-Protocol: agenthost.v1, agenthost.bearer.%s\r\n", w.token);
  tc_resp hs = {0};
  int ws = tc_ws_open(w.port, "/api/ws/mux", extra, &hs, 0);
  tc_resp_free(&hs);
  json_t *s = ws >= 0
                  ? web_call(&w, "session.create", json_pack("{s:s, s:s}", "cwd", cwd, "provider", "fake"))
                  : NULL;
  const char *sid = json_string_value(json_object_get(s, "sessionId"));
  for (int i = 0; sid && i < streams; i++) {
    json_decref(web_call(
        &w, "session.prompt",
        json_pack("{s:s, s:[{s:s, s:s}]}", "sessionId", sid, "content", "type", "text", "text", "go")));
    bool ended = false;
    while (!ended) {
      int op = 0;
      char *payload = NULL;
      size_t len = 0;
      if (tc_ws_recv(ws, &op, &payload, &len, 30000) != 0)
        goto out;
      uint64_t at = bench_now_ns();
      json_t *f = json_loadb(payload, len, 0, NULL);
      free(payload);
      const char *m = json_string_value(json_object_get(f, "method"));
      json_t *p = json_object_get(f, "payload");
      const char *kind = json_string_value(json_object_get(json_object_get(p, "event"), "kind"));
      if (m && strcmp(m, "session.delta") == 0) {
        const char *text = json_string_value(json_object_get(p, "text"));
        stamps(text ? text : "", at, c->lat, &c->n, c->cap);
      } else if (m && strcmp(m, "session.event") == 0 && kind && strcmp(kind, "turn/ended") == 0) {
        ended = true;
      }
      json_decref(f);
    }
  }
  rc = sid ? 0 : -1;
out:
  json_decref(s);
  if (ws >= 0)
    close(ws);
  web_stop(&w);
  return rc;
}

/* ---- 2 and 3: the SDK ---------------------------------------------------------------------------------- */

typedef struct sdk_ctx {
  uint64_t *lat; /* last chunk → message/committed */
  size_t n, cap;
  int ended; /* turn/ended notifications seen */
  uint64_t ended_at;
  char session[64]; /* the session prompts go to ("" = a new one each) */
} sdk_ctx;

static void sdk_note(json_t *m, uint64_t at, void *arg) {
  sdk_ctx *c = arg;
  const char *method = json_string_value(json_object_get(m, "method"));
  if (!method || strcmp(method, "session.event") != 0)
    return;
  json_t *ev = json_object_get(json_object_get(m, "params"), "event");
  const char *kind = json_string_value(json_object_get(ev, "kind"));
  if (kind && strcmp(kind, "message/committed") == 0) {
    const char *text = json_string_value(json_object_get(json_object_get(ev, "data"), "text"));
    const char *last = text ? strrchr(text, 't') : NULL; /* the last stamp: the event with finish_reason */
    while (last && last > text && last[1] != '=')
      last--;
    if (last && c->n < c->cap) {
      uint64_t t = strtoull(last + 2, NULL, 10);
      if (t && t <= at)
        c->lat[c->n++] = at - t;
    }
  } else if (kind && strcmp(kind, "turn/ended") == 0) {
    c->ended++;
    c->ended_at = at;
  }
}

static int sdk_init(peer *p, const char *cwd) {
  if (send_line(p,
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"cwd\":\"%s\","
                "\"provider\":\"fake\"}}",
                cwd))
    return -1;
  json_t *r = wait_response(p, 1, NULL, NULL);
  bool ok = r && json_object_get(r, "result");
  json_decref(r);
  return ok ? 0 : -1;
}

/* One prompt in a new session (session_id NULL) or `sid`; waits for its turn/ended notification. */
static int sdk_prompt_wait(peer *p, int id, sdk_ctx *c) {
  int before = c->ended;
  int rc =
      c->session[0]
          ? send_line(p,
                      "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"session/prompt\",\"params\":{"
                      "\"sessionId\":\"%s\",\"text\":\"go\"}}",
                      id, c->session)
          : send_line(
                p,
                "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"session/prompt\",\"params\":{\"text\":\"go\"}}",
                id);
  if (rc)
    return -1;
  json_t *r = wait_response(p, id, sdk_note, c);
  if (!r || !json_object_get(r, "result")) {
    json_decref(r);
    return -1;
  }
  const char *sid = json_string_value(json_object_get(json_object_get(r, "result"), "sessionId"));
  if (sid && !c->session[0])
    snprintf(c->session, sizeof c->session, "%s", sid);
  json_decref(r);
  uint64_t deadline = bench_now_ns() + WAIT_NS;
  uint64_t at = 0;
  json_t *m = NULL;
  while (c->ended == before && (m = next_msg(p, deadline, &at))) {
    sdk_note(m, at, c);
    json_decref(m);
  }
  return c->ended > before ? 0 : -1;
}

static long proc_cpu_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')');
  long ut = 0, st = 0;
  if (!rp || sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) != 2)
    return -1;
  return ut + st;
}

int main(int argc, char **argv) {
  bench_prog = "bench_openai";
  if (argc < 3) {
    fprintf(stderr,
            "usage: bench_openai AGENTHOST FAKE_MODEL_PY [STREAMS [CHUNKS [INTERVAL_MS [CONCURRENT]]]]\n");
    return 2;
  }
  const char *agenthost = argv[1];
  const char *fake_py = argv[2];
  int streams = argc > 3 ? atoi(argv[3]) : 20;
  int chunks = argc > 4 ? atoi(argv[4]) : 50;
  int interval = argc > 5 ? atoi(argv[5]) : 10;
  int concurrent = argc > 6 ? atoi(argv[6]) : 100;
  const int round_trips = 100;
  bench_catch_stop_signals();
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (bench_mkdtemp(dir, sizeof dir, "/tmp", "bench-openai") != 0)
    return 1;
  int errors = 0;
  char port_file[700], control_file[700], state[700], cwd[700], conf[700];
  snprintf(port_file, sizeof port_file, "%s/port", dir);
  snprintf(control_file, sizeof control_file, "%s/control", dir);
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(cwd, sizeof cwd, "%s/work", dir);
  snprintf(conf, sizeof conf, "%s/agenthost.ini", dir);
  mkdir(cwd, 0700);
  bench_proc fake = {.label = "fake model"};
  snprintf(fake.log_path, sizeof fake.log_path, "%s/fake.log", dir);
  char *fargv[] = {"/usr/bin/python3",    (char *)fake_py, "--port-file", port_file,
                   "--control-port-file", control_file,    NULL};
  if (bench_spawn(&fake, fargv) != 0)
    return 1;
  for (int i = 0; i < 500 && (access(port_file, R_OK) != 0 || access(control_file, R_OK) != 0); i++)
    usleep(20000);
  fake_port = read_port(port_file);
  fake_control = read_port(control_file);
  if (!fake_port || !fake_control) {
    bench_fail(&fake, "the fake model server did not start");
    bench_reap(&fake, true);
    return 1;
  }
  FILE *cf = fopen(conf, "w");
  fprintf(
      cf,
      "[plugin.remote]\nenabled = false\n[plugin.acp]\nstream_deltas = "
      "true\n"
      "[host]\ndefault_provider = fake\n[provider.fake]\ntype = openai\nbase_url = http://127.0.0.1:%d/v1\n"
      "model = m1\n",
      fake_port);
  fclose(cf);

  printf("bench_openai: %d streams of %d chunks %d ms apart; %d round trips; %d concurrent turns\n", streams,
         chunks, interval, round_trips, concurrent);
  size_t cap = (size_t)streams * (size_t)chunks + 16;
  uint64_t p50f = 0, p99f = 0, p50h = 0, p99h = 0;
  printf("1. chunk written by the server → read by the client:\n");
  floor_rd fr = {.lat = calloc(cap, sizeof(uint64_t)), .cap = cap};
  char *script = stream_script(streams, chunks, interval);
  if (control_post(script) != 0) {
    bench_fail(&fake, "cannot script the fake server");
    errors++;
  }
  for (int s = 0; s < streams && !errors; s++) {
    CURL *e = floor_easy(&fr);
    if (curl_easy_perform(e) != CURLE_OK)
      errors++;
    curl_easy_cleanup(e);
  }
  report("floor (libcurl, parse data: lines)", fr.lat, fr.n, &p50f, &p99f);
  acp_ctx ac = {.lat = calloc(cap, sizeof(uint64_t)), .cap = cap};
  if (!errors && (control_post(script) != 0 || run_acp(agenthost, conf, state, cwd, streams, &ac) != 0))
    errors++;
  report("agenthost acp (agent_message_chunk)", ac.lat, ac.n, &p50h, &p99h);
  printf("   host overhead per chunk:                p50 %+7.3f ms  p99 %+7.3f ms\n",
         ((double)p50h - p50f) / 1e6, ((double)p99h - p99f) / 1e6);
  acp_ctx wc = {.lat = calloc(cap, sizeof(uint64_t)), .cap = cap};
  if (!errors && (control_post(script) != 0 || run_web(agenthost, conf, state, cwd, streams, &wc) != 0)) {
    fprintf(stderr, "bench_openai: the browser surface's run failed\n");
    errors++;
  }
  report("agenthost serve (mux WebSocket frame)", wc.lat, wc.n, &p50h, &p99h);
  printf("   host overhead per chunk:                p50 %+7.3f ms  p99 %+7.3f ms\n",
         ((double)p50h - p50f) / 1e6, ((double)p99h - p99f) / 1e6);
  free(wc.lat);
  free(script);

  printf("2. last chunk → SDK notification (message/committed) and 3. overhead per round trip:\n");
  sdk_ctx sc = {.lat = calloc(cap, sizeof(uint64_t)), .cap = cap};
  peer sdk;
  uint64_t *rt_host = calloc((size_t)round_trips, sizeof(uint64_t));
  uint64_t *rt_floor = calloc((size_t)round_trips, sizeof(uint64_t));
  if (!errors && spawn_host(&sdk, agenthost, "sdk", conf, state) == 0) {
    script = stream_script(streams, chunks, interval);
    if (control_post(script) != 0 || sdk_init(&sdk, cwd) != 0)
      errors++;
    free(script);
    for (int s = 0; s < streams && !errors; s++)
      if (sdk_prompt_wait(&sdk, 100 + s, &sc) != 0) {
        bench_fail(&sdk.proc, "prompt %d did not end", s);
        errors++;
      }
    report("agenthost sdk (message/committed)", sc.lat, sc.n, &p50h, &p99h);
    script = stream_script(round_trips, 1, 0);
    if (!errors && control_post(script) != 0)
      errors++;
    free(script);
    for (int i = 0; i < round_trips && !errors; i++) {
      uint64_t t0 = bench_now_ns();
      if (sdk_prompt_wait(&sdk, 1000 + i, &sc) != 0) {
        errors++;
        break;
      }
      rt_host[i] = sc.ended_at - t0;
    }
    end_host(&sdk);
  } else if (!errors) {
    errors++;
  }
  script = stream_script(round_trips, 1, 0);
  if (!errors && control_post(script) != 0)
    errors++;
  free(script);
  floor_rd rr = {.lat = calloc(16, sizeof(uint64_t)), .cap = 0};
  for (int i = 0; i < round_trips && !errors; i++) {
    uint64_t t0 = bench_now_ns();
    CURL *e = floor_easy(&rr);
    curl_easy_perform(e);
    curl_easy_cleanup(e);
    rt_floor[i] = bench_now_ns() - t0;
  }
  if (!errors) {
    uint64_t h50 = 0, h99 = 0, f50 = 0, f99 = 0;
    report("round trip, agenthost sdk (prompt → turn/ended)", rt_host, (size_t)round_trips, &h50, &h99);
    report("round trip, floor (libcurl request → body)", rt_floor, (size_t)round_trips, &f50, &f99);
    printf("   host overhead per round trip:           p50 %+7.3f ms  (the host's includes the prompt's "
           "receipt, "
           "the turn's store writes and the tool list)\n",
           ((double)h50 - f50) / 1e6);
  }

  printf("4. %d streaming turns at once (%d chunks %d ms apart each), one session each, in one `agenthost "
         "acp`:\n",
         concurrent, chunks, interval);
  if (!errors) {
    script = stream_script(concurrent, chunks, interval);
    peer c;
    json_t *r = NULL;
    char(*sids)[64] = calloc((size_t)concurrent, sizeof *sids);
    if (control_post(script) != 0 || spawn_host(&c, agenthost, "acp", conf, state) != 0 ||
        send_line(
            &c,
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}") ||
        !(r = wait_response(&c, 1, NULL, NULL))) {
      errors++;
    } else {
      json_decref(r);
      for (int i = 0; i < concurrent && !errors; i++) {
        if (send_line(&c,
                      "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"session/new\",\"params\":{\"cwd\":\"%s\","
                      "\"mcpServers\":[]}}",
                      100 + i, cwd) ||
            !(r = wait_response(&c, 100 + i, NULL, NULL))) {
          errors++;
          break;
        }
        snprintf(sids[i], sizeof sids[i], "%s",
                 json_string_value(json_object_get(json_object_get(r, "result"), "sessionId")) ?: "");
        json_decref(r);
      }
      bench_peak_reset(c.proc.pid);
      long rss0 = bench_status_kib(c.proc.pid, "VmRSS:");
      long t0 = proc_cpu_ticks(c.proc.pid);
      uint64_t w0 = bench_now_ns();
      for (int i = 0; i < concurrent && !errors; i++)
        send_line(
            &c,
            "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"%s\","
            "\"prompt\":[{\"type\":\"text\",\"text\":\"go\"}]}}",
            5000 + i, sids[i]);
      acp_ctx cc = {.lat = calloc((size_t)concurrent * (size_t)chunks + 16, sizeof(uint64_t)),
                    .cap = (size_t)concurrent * (size_t)chunks + 16};
      int answered = 0;
      uint64_t deadline = bench_now_ns() + WAIT_NS;
      uint64_t at = 0;
      json_t *m = NULL;
      while (!errors && answered < concurrent && (m = next_msg(&c, deadline, &at))) {
        json_t *id = json_object_get(m, "id");
        if (id && !json_object_get(m, "method") && json_integer_value(id) >= 5000)
          answered++;
        else
          acp_update(m, at, &cc);
        json_decref(m);
      }
      double wall = (bench_now_ns() - w0) / 1e9;
      long t1 = proc_cpu_ticks(c.proc.pid);
      long hwm = bench_status_kib(c.proc.pid, "VmHWM:");
      double cpu = (double)(t1 - t0) / (double)sysconf(_SC_CLK_TCK);
      if (answered < concurrent) {
        bench_fail(&c.proc, "%d of %d prompts answered", answered, concurrent);
        errors++;
      }
      printf(
          "   agenthost acp: %d turns (%zu chunks) in %.2f s, CPU %.3f s (%.1f%% of one core), RSS %ld KiB → "
          "peak %ld KiB (+%ld KiB)\n",
          answered, cc.n, wall, cpu, 100 * cpu / wall, rss0, hwm, hwm - rss0);
      uint64_t p50 = 0, p99 = 0;
      report("chunk latency under this load", cc.lat, cc.n, &p50, &p99);
      free(cc.lat);
      end_host(&c);
    }
    free(sids);
    free(script);
    script = stream_script(concurrent, chunks, interval);
    if (!errors && control_post(script) == 0) {
      CURLM *multi = curl_multi_init();
      floor_rd *rds = calloc((size_t)concurrent, sizeof *rds);
      CURL **es = calloc((size_t)concurrent, sizeof *es);
      for (int i = 0; i < concurrent; i++) {
        rds[i].lat = calloc((size_t)chunks + 4, sizeof(uint64_t));
        rds[i].cap = (size_t)chunks + 4;
        es[i] = floor_easy(&rds[i]);
        curl_multi_add_handle(multi, es[i]);
      }
      double c0 = cpu_self_s();
      uint64_t w0 = bench_now_ns();
      int running = 1;
      while (running) {
        curl_multi_perform(multi, &running);
        if (running)
          curl_multi_poll(multi, NULL, 0, 1000, NULL);
      }
      double wall = (bench_now_ns() - w0) / 1e9, cpu = cpu_self_s() - c0;
      size_t got = 0;
      for (int i = 0; i < concurrent; i++) {
        got += rds[i].n;
        curl_multi_remove_handle(multi, es[i]);
        curl_easy_cleanup(es[i]);
        free(rds[i].lat);
      }
      curl_multi_cleanup(multi);
      free(rds);
      free(es);
      printf("   floor (one libcurl multi handle): %d transfers (%zu chunks) in %.2f s, CPU %.3f s\n",
             concurrent, got, wall, cpu);
    }
    free(script);
  }
  free(fr.lat);
  free(ac.lat);
  free(sc.lat);
  free(rr.lat);
  free(rt_host);
  free(rt_floor);
  bench_reap(&fake, true);
  bench_rm_tree(dir);
  curl_global_cleanup();
  return bench_stopped(errors) ? 1 : 0;
}
