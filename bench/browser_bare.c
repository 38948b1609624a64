/* The floor for bench/browser.sh: a bare libwebsockets HTTP responder on a libuv loop, set up as the
 * browser plugin sets up its own (a foreign libuv loop, one vhost on 127.0.0.1, keep-alive).
 *
 *   browser_bare PORT BODY_FILE
 *
 * Every POST is answered 200 with Content-Type application/json and the bytes of BODY_FILE (the bench
 * passes the host's own answer to host.describe, so both servers send the same bytes) once its request body
 * was read; anything else gets 404. No fence, no token, no envelope parse, no dispatch: what remains is
 * libwebsockets, libuv and the socket. Runs until SIGINT or SIGTERM.
 */
#include <libwebsockets.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct conn {
  int post;    /* this transaction is a POST */
  int pending; /* an answer waits for HTTP_WRITEABLE */
  int status;
} conn;

static char *body;
static size_t body_len;
static struct lws_context *ctx;
static uv_loop_t loop;
static uv_signal_t sigint_h, sigterm_h;

static int answer(struct lws *wsi, conn *c) {
  size_t cap = LWS_PRE + 512 + body_len;
  unsigned char *buf = malloc(cap);
  if (!buf)
    return -1;
  unsigned char *start = buf + LWS_PRE, *p = start, *end = buf + cap;
  int ok = c->status == 200;
  if (lws_add_http_common_headers(wsi, (unsigned int)c->status, ok ? "application/json" : "text/plain",
                                  ok ? body_len : 0, &p, end) ||
      lws_finalize_http_header(wsi, &p, end)) {
    free(buf);
    return -1;
  }
  if (ok) {
    memcpy(p, body, body_len);
    p += body_len;
  }
  int n = lws_write(wsi, start, (size_t)(p - start), LWS_WRITE_HTTP_FINAL);
  free(buf);
  if (n < 0)
    return -1;
  return lws_http_transaction_completed(wsi) ? -1 : 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
  conn *c = user;
  (void)in;
  (void)len;
  switch (reason) {
  case LWS_CALLBACK_HTTP:
    memset(c, 0, sizeof *c);
    if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0) {
      c->post = 1; /* wait for the body */
      return 0;
    }
    c->status = 404;
    c->pending = 1;
    lws_callback_on_writable(wsi);
    return 0;
  case LWS_CALLBACK_HTTP_BODY:
    return 0;
  case LWS_CALLBACK_HTTP_BODY_COMPLETION:
    c->status = 200;
    c->pending = 1;
    lws_callback_on_writable(wsi);
    return 0;
  case LWS_CALLBACK_HTTP_WRITEABLE:
    if (!c->pending)
      return 0;
    c->pending = 0;
    return answer(wsi, c);
  default:
    return 0;
  }
}

static const struct lws_protocols protocols[] = {
    {.name = "http", .callback = callback, .per_session_data_size = sizeof(conn)},
    {0},
};

static void on_signal(uv_signal_t *h, int signum) {
  (void)h;
  (void)signum;
  uv_signal_stop(&sigint_h);
  uv_signal_stop(&sigterm_h);
  uv_close((uv_handle_t *)&sigint_h, NULL);
  uv_close((uv_handle_t *)&sigterm_h, NULL);
  lws_context_destroy(ctx);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: browser_bare PORT BODY_FILE\n");
    return 2;
  }
  FILE *f = fopen(argv[2], "rb");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  body = malloc(n > 0 ? (size_t)n : 1);
  body_len = n > 0 ? fread(body, 1, (size_t)n, f) : 0;
  fclose(f);

  uv_loop_init(&loop);
  lws_set_log_level(LLL_ERR, NULL);
  void *loops[1] = {&loop};
  struct lws_context_creation_info info;
  memset(&info, 0, sizeof info);
  info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_EXPLICIT_VHOSTS;
  info.foreign_loops = loops;
  info.fd_limit_per_thread = 1024;
  info.port = CONTEXT_PORT_NO_LISTEN;
  info.protocols = protocols;
  info.count_threads = 1;
  info.keepalive_timeout = 60;
  info.max_http_header_data = 16384;
  info.max_http_header_pool = 64;
  ctx = lws_create_context(&info);
  if (!ctx) {
    fprintf(stderr, "browser_bare: cannot create the libwebsockets context (libwebsockets-evlib-uv?)\n");
    return 1;
  }
  struct lws_context_creation_info vi;
  memset(&vi, 0, sizeof vi);
  vi.vhost_name = "bare";
  vi.port = atoi(argv[1]);
  vi.iface = "127.0.0.1";
  vi.protocols = protocols;
  vi.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_DISABLE_IPV6;
  vi.keepalive_timeout = 60;
  if (!lws_create_vhost(ctx, &vi)) {
    fprintf(stderr, "browser_bare: cannot listen on 127.0.0.1:%s\n", argv[1]);
    lws_context_destroy(ctx);
    return 1;
  }
  uv_signal_init(&loop, &sigint_h);
  uv_signal_init(&loop, &sigterm_h);
  uv_signal_start(&sigint_h, on_signal, SIGINT);
  uv_signal_start(&sigterm_h, on_signal, SIGTERM);
  fprintf(stderr, "browser_bare: listening on 127.0.0.1:%s\n", argv[1]);
  uv_run(&loop, UV_RUN_DEFAULT);
  /* A foreign loop: the context's handles close on the loop after lws_context_destroy(). */
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(body);
  return 0;
}
