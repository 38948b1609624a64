/* SDK-JSONL-TRANSPORT: the JSON-RPC peer (host/jsonrpc.c) that every stdio surface, the admin socket and the
 * C client read with: the input arrives on a socket (cut in two writes where its first byte says) to a peer
 * that has three requests of its own pending; each inbound request is answered, every line the peer writes
 * back is one JSON object, and the peer ends, answers its pending requests and frees everything. */
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "fuzz_support.h"
#include "jsonrpc.h"

typedef struct harness {
  uv_loop_t loop;
  uv_pipe_t ours, theirs;
  ah_rpc_peer *peer;
  size_t requests, answered_out, eof;
  bool closed;
  char out[1 << 16];
  size_t out_len;
} harness;

static void on_request(ah_rpc_peer *p, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *d) {
  (void)p;
  harness *h = d;
  FUZZ_CHECK(method != NULL);
  FUZZ_CHECK(ah_rpc_inbound_id(req) != NULL);
  if (h->requests++ % 2)
    ah_rpc_respond(req, params ? json_deep_copy(params) : json_null());
  else
    ah_rpc_respond_error(req, -32000, method, NULL);
}

static void on_notification(ah_rpc_peer *p, const char *method, const json_t *params, void *d) {
  (void)p;
  (void)params;
  (void)d;
  FUZZ_CHECK(method != NULL);
}

static void on_response(ah_rpc_peer *p, int status, const json_t *result, const json_t *error, void *arg) {
  (void)p;
  harness *h = arg;
  FUZZ_CHECK((status == 0 && result) || (status == AH_EPROTO && error) || status == AH_ECLOSED);
  h->answered_out++;
}

static void on_eof(ah_rpc_peer *p, int status, void *d) {
  (void)p;
  (void)status;
  ((harness *)d)->eof++;
}

static void on_log(ah_rpc_peer *p, const char *msg, void *d) {
  (void)p;
  (void)msg;
  (void)d;
}

static void write_done(uv_write_t *w, int status) {
  (void)status;
  free(w);
}

static void shutdown_done(uv_shutdown_t *sd, int status) {
  (void)status;
  free(sd);
}

static void on_closed(ah_rpc_peer *p, void *arg) {
  (void)p;
  ((harness *)arg)->closed = true;
}

static void alloc_cb(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  harness *h = hd->data;
  buf->base = h->out + h->out_len;
  buf->len = sizeof h->out - h->out_len;
}

/* What the peer wrote: each complete line a JSON object (the buffer wraps when full). */
static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  harness *h = s->data;
  if (n <= 0) {
    uv_read_stop(s);
    return;
  }
  h->out_len += (size_t)n;
  char *start = h->out, *nl = NULL;
  while ((nl = memchr(start, '\n', (size_t)(h->out + h->out_len - start)))) {
    json_error_t e;
    json_t *v = json_loadb(start, (size_t)(nl - start), 0, &e);
    FUZZ_CHECK(json_is_object(v));
    json_decref(v);
    start = nl + 1;
  }
  size_t rest = (size_t)(h->out + h->out_len - start);
  memmove(h->out, start, rest);
  h->out_len = rest;
  FUZZ_CHECK(h->out_len < sizeof h->out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 20)
    return 0;
  size_t cut = data[0] * (size - 1) / 255;
  data++;
  size--;
  int sv[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  harness *h = calloc(1, sizeof *h);
  FUZZ_CHECK(h != NULL);
  uv_loop_init(&h->loop);
  uv_pipe_init(&h->loop, &h->ours, 0);
  uv_pipe_init(&h->loop, &h->theirs, 0);
  FUZZ_CHECK(uv_pipe_open(&h->ours, sv[0]) == 0 && uv_pipe_open(&h->theirs, sv[1]) == 0);
  h->theirs.data = h;
  ah_rpc_opts opts = {.struct_size = sizeof opts,
                      .max_line = 4096,
                      .on_request = on_request,
                      .on_notification = on_notification,
                      .on_eof = on_eof,
                      .on_log = on_log,
                      .data = h};
  FUZZ_CHECK(ah_rpc_open((uv_stream_t *)&h->ours, (uv_stream_t *)&h->ours, &opts, &h->peer) == 0);
  for (int i = 0; i < 3; i++)
    FUZZ_CHECK(ah_rpc_request(h->peer, "ping", json_pack("{s:i}", "n", i), on_response, h, NULL) == 0);
  uv_read_start((uv_stream_t *)&h->theirs, alloc_cb, read_cb);
  /* The input in two writes, then the write side shut: the peer sees EOF. */
  uv_buf_t parts[2] = {uv_buf_init((char *)data, (unsigned)cut),
                       uv_buf_init((char *)data + cut, (unsigned)(size - cut))};
  for (int i = 0; i < 2; i++) {
    if (parts[i].len == 0)
      continue;
    uv_write_t *w = calloc(1, sizeof *w);
    FUZZ_CHECK(w && uv_write(w, (uv_stream_t *)&h->theirs, &parts[i], 1, write_done) == 0);
    uv_run(&h->loop, UV_RUN_NOWAIT);
  }
  uv_shutdown_t *sd = calloc(1, sizeof *sd);
  FUZZ_CHECK(sd && uv_shutdown(sd, (uv_stream_t *)&h->theirs, shutdown_done) == 0);
  for (int i = 0; i < 10000 && !h->eof; i++)
    uv_run(&h->loop, UV_RUN_ONCE);
  FUZZ_CHECK(h->eof == 1);
  FUZZ_CHECK(ah_rpc_close(h->peer, on_closed, h) == 0);
  for (int i = 0; i < 10000 && !h->closed; i++)
    uv_run(&h->loop, UV_RUN_ONCE);
  FUZZ_CHECK(h->closed && h->answered_out == 3);
  uv_close((uv_handle_t *)&h->ours, NULL);
  uv_close((uv_handle_t *)&h->theirs, NULL);
  uv_run(&h->loop, UV_RUN_DEFAULT);
  FUZZ_CHECK(uv_loop_close(&h->loop) == 0);
  free(h);
  return 0;
}
