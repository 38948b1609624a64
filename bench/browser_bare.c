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

#include "lws_floor.h"

typedef struct conn {
  int post;    /* this transaction is a POST */
  int pending; /* an answer waits for HTTP_WRITEABLE */
  int status;
} conn;

static char *body;
static size_t body_len;

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

  lws_floor srv = {0};
  if (lws_floor_open(&srv, "browser_bare", protocols, atoi(argv[1])) < 0)
    return 1;
  fprintf(stderr, "browser_bare: listening on 127.0.0.1:%s\n", argv[1]);
  lws_floor_run(&srv);
  free(body);
  return 0;
}
