/* The floor of the WebSocket fan-out benchmark (bench/browser_fanout.c --floor): a bare libwebsockets
 * broadcast on a libuv loop, set up as the browser plugin sets up its own (a foreign libuv loop, one vhost
 * on 127.0.0.1), that streams the same envelopes the host streams, fanned out the same way.
 *
 *   browser_broadcast_bare [QUEUE_BYTES]
 *
 * It prints "http://127.0.0.1:PORT/#k=bare" on stdout once it listens, and answers just what the benchmark
 * uses of the browser surface:
 *   POST /api/session.create  → a server-response with {sessionId}
 *   POST /api/session.prompt  → {messageId}; a text "stream RATE SECONDS" then emits RATE session.delta
 *                               envelopes per second for SECONDS (a 1 ms timer emits those due by then, as
 *                               the bench-stream fixture does; each text "t=<CLOCK_MONOTONIC ns> n=<index>"),
 *                               then a session.event envelope of kind turn/ended
 *   GET  /api/ws/mux[?batch=1] → a downlink WebSocket (subprotocol agenthost.v1)
 * Each envelope is formatted once and shared by every socket's queue; a socket with ?batch=1 gets all it has
 * queued as one JSON array per message, another one envelope per message; a socket whose queue passes
 * QUEUE_BYTES (default 8 MiB) is closed 1013. No fence, no token, no bus, no JSON library, no store: what
 * remains is libwebsockets, libuv, the socket and the fan-out itself. Runs until SIGINT or SIGTERM.
 */
#include <libwebsockets.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "lws_floor.h"

#define BATCH_MAX (256u << 10)
#define SID "0193f1b2-7c1e-7d4a-9b2e-5a1c0d9e8f70"
#define TID "0193f1b2-7c1f-7000-8000-1a2b3c4d5e6f"
#define MID "0193f1b2-7c1f-7001-8000-6f5e4d3c2b1a"

typedef struct frame {
  unsigned refs;
  size_t len;
  unsigned char data[]; /* LWS_PRE, then len bytes */
} frame;

typedef struct sock {
  struct lws *wsi;
  bool batch;
  bool closing;
  frame **v; /* a ring of references */
  size_t cap, head, n, bytes;
  struct sock *prev, *next;
} sock;

typedef struct http {
  char body[4096];
  size_t len;
  int status;
  char *answer;
} http;

static uv_timer_t tick;
static sock *socks;
static size_t queue_max = 8u << 20;
static unsigned char *wbuf;
static size_t wbuf_cap;
static unsigned long long next_rpc, cursor;
/* the stream running */
static double rate;
static unsigned long long total, emitted;
static unsigned long long start_ns;

static unsigned long long mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void unref(frame *f) {
  if (--f->refs == 0)
    free(f);
}

static void drop_queue(sock *s) {
  while (s->n) {
    unref(s->v[s->head]);
    s->head = (s->head + 1) % s->cap;
    s->n--;
  }
  free(s->v);
  s->v = NULL;
  s->cap = s->head = s->bytes = 0;
}

static void push(sock *s, frame *f) {
  if (s->closing)
    return;
  if (s->n > 0 && s->bytes + f->len > queue_max) { /* slow consumer */
    drop_queue(s);
    s->closing = true;
    lws_callback_on_writable(s->wsi);
    return;
  }
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    frame **v = malloc(cap * sizeof *v);
    if (!v)
      abort();
    for (size_t i = 0; i < s->n; i++)
      v[i] = s->v[(s->head + i) % s->cap];
    free(s->v);
    s->v = v;
    s->cap = cap;
    s->head = 0;
  }
  s->v[(s->head + s->n) % s->cap] = f;
  s->n++;
  s->bytes += f->len;
  f->refs++;
  if (s->n == 1)
    lws_callback_on_writable(s->wsi);
}

/* Format one envelope into a new frame and queue it on every socket. */
static void broadcast(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void broadcast(const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (n <= 0 || (size_t)n >= sizeof text)
    return;
  frame *f = malloc(sizeof *f + LWS_PRE + (size_t)n);
  if (!f)
    abort();
  f->refs = 1;
  f->len = (size_t)n;
  memcpy(f->data + LWS_PRE, text, (size_t)n);
  for (sock *s = socks; s; s = s->next)
    push(s, f);
  unref(f);
}

static void on_tick(uv_timer_t *t) {
  (void)t;
  unsigned long long now = mono_ns();
  unsigned long long due = (unsigned long long)((double)(now - start_ns) / 1e9 * rate);
  if (due > total)
    due = total;
  for (; emitted < due; emitted++)
    broadcast("{\"kind\":\"server-request\",\"rpcId\":\"p%llu\",\"method\":\"session.delta\",\"payload\":{"
              "\"sessionId\":\"" SID "\",\"turnId\":\"" TID "\",\"messageId\":\"" MID "\",\"text\":\"t=%llu "
              "n=%llu\"},\"replyRequired\":false,\"cursor\":%llu}",
              ++next_rpc, mono_ns(), emitted, cursor);
  if (emitted < total)
    return;
  uv_timer_stop(&tick);
  ++cursor;
  broadcast("{\"kind\":\"server-request\",\"rpcId\":\"p%llu\",\"method\":\"session.event\",\"payload\":{"
            "\"sessionId\":\"" SID "\",\"event\":{\"cursor\":%llu,\"sessionId\":\"" SID "\",\"seq\":%llu,"
            "\"kind\":\"turn/ended\",\"turnId\":\"" TID "\",\"data\":{\"reason\":\"end\"}}},"
            "\"replyRequired\":false,\"cursor\":%llu,\"seq\":%llu}",
            ++next_rpc, cursor, cursor, cursor, cursor);
}

/* SERVER_WRITEABLE: all that is queued (up to BATCH_MAX) as one array, or the oldest envelope alone. */
static int write_queued(sock *s) {
  frame *first = s->v[s->head];
  size_t k = 1, total_len = first->len;
  unsigned char *msg = first->data + LWS_PRE;
  if (s->batch) {
    total_len += 2;
    while (k < s->n && total_len + 1 + s->v[(s->head + k) % s->cap]->len <= BATCH_MAX)
      total_len += 1 + s->v[(s->head + k++) % s->cap]->len;
    if (wbuf_cap < LWS_PRE + total_len) {
      free(wbuf);
      wbuf_cap = LWS_PRE + (total_len > BATCH_MAX ? total_len : BATCH_MAX);
      wbuf = malloc(wbuf_cap);
      if (!wbuf)
        abort();
    }
    msg = wbuf + LWS_PRE;
    unsigned char *p = msg;
    *p++ = '[';
    for (size_t i = 0; i < k; i++) {
      const frame *f = s->v[(s->head + i) % s->cap];
      if (i)
        *p++ = ',';
      memcpy(p, f->data + LWS_PRE, f->len);
      p += f->len;
    }
    *p++ = ']';
  }
  int n = lws_write(s->wsi, msg, total_len, LWS_WRITE_TEXT);
  for (size_t i = 0; i < k; i++) {
    frame *f = s->v[s->head];
    s->head = (s->head + 1) % s->cap;
    s->n--;
    s->bytes -= f->len;
    unref(f);
  }
  if (s->n == 0 && s->cap > 64) {
    free(s->v);
    s->v = NULL;
    s->cap = s->head = 0;
  }
  return n < 0 ? -1 : 0;
}

static int ws_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
  sock *s = user;
  (void)in;
  (void)len;
  switch (reason) {
  case LWS_CALLBACK_ESTABLISHED: {
    memset(s, 0, sizeof *s);
    s->wsi = wsi;
    char buf[16];
    const char *b = lws_get_urlarg_by_name(wsi, "batch=", buf, sizeof buf);
    s->batch = b && strcmp(b, "1") == 0;
    s->next = socks;
    if (socks)
      socks->prev = s;
    socks = s;
    return 0;
  }
  case LWS_CALLBACK_SERVER_WRITEABLE:
    if (s->closing) {
      lws_close_reason(wsi, (enum lws_close_status)1013, (unsigned char *)"slow consumer", 13);
      return -1;
    }
    if (!s->n)
      return 0;
    if (write_queued(s) < 0)
      return -1;
    if (s->n)
      lws_callback_on_writable(wsi);
    return 0;
  case LWS_CALLBACK_RECEIVE:
    return -1;
  case LWS_CALLBACK_CLOSED:
    if (!s->wsi)
      return 0;
    if (s->prev)
      s->prev->next = s->next;
    else if (socks == s)
      socks = s->next;
    if (s->next)
      s->next->prev = s->prev;
    s->prev = s->next = NULL;
    drop_queue(s);
    return 0;
  default:
    return 0;
  }
}

/* The text of a "stream RATE SECONDS" prompt in a session.prompt body starts the stream. */
static void start_stream(const char *body) {
  const char *p = strstr(body, "stream ");
  double r = 0, secs = 0;
  if (!p || sscanf(p, "stream %lf %lf", &r, &secs) != 2 || r < 1 || secs <= 0)
    return;
  rate = r;
  total = (unsigned long long)(r * secs + 0.5);
  emitted = 0;
  start_ns = mono_ns();
  uv_timer_start(&tick, on_tick, 1, 1);
}

static int http_answer(struct lws *wsi, http *h) {
  const char *body = h->answer ? h->answer : "";
  size_t blen = strlen(body);
  size_t cap = LWS_PRE + 512 + blen;
  unsigned char *buf = malloc(cap);
  if (!buf)
    return -1;
  unsigned char *start = buf + LWS_PRE, *p = start, *end = buf + cap;
  if (lws_add_http_common_headers(wsi, (unsigned int)h->status, "application/json", blen, &p, end) ||
      lws_finalize_http_header(wsi, &p, end)) {
    free(buf);
    return -1;
  }
  memcpy(p, body, blen);
  p += blen;
  int n = lws_write(wsi, start, (size_t)(p - start), LWS_WRITE_HTTP_FINAL);
  free(buf);
  free(h->answer);
  h->answer = NULL;
  if (n < 0)
    return -1;
  return lws_http_transaction_completed(wsi) ? -1 : 0;
}

static int http_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                         size_t len) {
  http *h = user;
  switch (reason) {
  case LWS_CALLBACK_HTTP:
    memset(h, 0, sizeof *h);
    if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0)
      return 0; /* the body follows */
    h->status = 404;
    h->answer = strdup("{}");
    lws_callback_on_writable(wsi);
    return 0;
  case LWS_CALLBACK_HTTP_BODY:
    if (h->len + len < sizeof h->body) {
      memcpy(h->body + h->len, in, len);
      h->len += len;
    }
    return 0;
  case LWS_CALLBACK_HTTP_BODY_COMPLETION: {
    h->body[h->len] = '\0';
    char uri[128];
    lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_POST_URI);
    h->status = 200;
    if (strcmp(uri, "/api/session.create") == 0) {
      h->answer =
          strdup("{\"kind\":\"server-response\",\"rpcId\":\"c\",\"value\":{\"sessionId\":\"" SID "\"}}");
    } else if (strcmp(uri, "/api/session.prompt") == 0) {
      start_stream(h->body);
      h->answer =
          strdup("{\"kind\":\"server-response\",\"rpcId\":\"p\",\"value\":{\"messageId\":\"" MID "\"}}");
    } else {
      h->status = 404;
      h->answer = strdup("{}");
    }
    lws_callback_on_writable(wsi);
    return 0;
  }
  case LWS_CALLBACK_HTTP_WRITEABLE:
    return h->answer ? http_answer(wsi, h) : 0;
  case LWS_CALLBACK_CLOSED_HTTP:
    free(h->answer);
    h->answer = NULL;
    return 0;
  default:
    return 0;
  }
}

static const struct lws_protocols protocols[] = {
    {.name = "http", .callback = http_callback, .per_session_data_size = sizeof(http)},
    {.name = "agenthost.v1", .callback = ws_callback, .per_session_data_size = sizeof(sock)},
    {0},
};

static void on_stop(lws_floor *f) {
  (void)f;
  uv_timer_stop(&tick);
  uv_close((uv_handle_t *)&tick, NULL);
}

int main(int argc, char **argv) {
  if (argc > 2 || (argc == 2 && atoll(argv[1]) <= 0)) {
    fprintf(stderr, "usage: browser_broadcast_bare [QUEUE_BYTES]\n");
    return 2;
  }
  if (argc == 2)
    queue_max = (size_t)atoll(argv[1]);
  signal(SIGPIPE, SIG_IGN);
  lws_floor f = {.on_stop = on_stop};
  int port = lws_floor_open(&f, "browser_broadcast_bare", protocols, 0);
  if (port < 0)
    return 1;
  uv_timer_init(&f.loop, &tick);
  printf("http://127.0.0.1:%d/#k=bare\n", port);
  fflush(stdout);
  lws_floor_run(&f);
  free(wbuf);
  return 0;
}
