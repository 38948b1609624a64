/* The benchmarks' bare libwebsockets floors: their common setup (lws_floor.h). */
#include "lws_floor.h"

#include <stdio.h>
#include <string.h>

static void on_signal(uv_signal_t *h, int signum) {
  (void)signum;
  lws_floor *f = h->data;
  uv_signal_stop(&f->sigint_h);
  uv_signal_stop(&f->sigterm_h);
  uv_close((uv_handle_t *)&f->sigint_h, NULL);
  uv_close((uv_handle_t *)&f->sigterm_h, NULL);
  if (f->on_stop)
    f->on_stop(f);
  lws_context_destroy(f->ctx);
}

int lws_floor_open(lws_floor *f, const char *name, const struct lws_protocols *protocols, int port) {
  uv_loop_init(&f->loop);
  lws_set_log_level(LLL_ERR, NULL);
  void *loops[1] = {&f->loop};
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
  f->ctx = lws_create_context(&info);
  if (!f->ctx) {
    fprintf(stderr, "%s: cannot create the libwebsockets context (libwebsockets-evlib-uv?)\n", name);
    return -1;
  }
  struct lws_context_creation_info vi;
  memset(&vi, 0, sizeof vi);
  vi.vhost_name = name;
  vi.port = port;
  vi.iface = "127.0.0.1";
  vi.protocols = protocols;
  vi.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_DISABLE_IPV6;
  vi.keepalive_timeout = 60;
  struct lws_vhost *vh = lws_create_vhost(f->ctx, &vi);
  int bound = vh ? lws_get_vhost_listen_port(vh) : -1;
  if (bound <= 0) {
    fprintf(stderr, "%s: cannot listen on 127.0.0.1:%d\n", name, port);
    lws_context_destroy(f->ctx);
    return -1;
  }
  uv_signal_init(&f->loop, &f->sigint_h);
  uv_signal_init(&f->loop, &f->sigterm_h);
  f->sigint_h.data = f->sigterm_h.data = f;
  uv_signal_start(&f->sigint_h, on_signal, SIGINT);
  uv_signal_start(&f->sigterm_h, on_signal, SIGTERM);
  return bound;
}

void lws_floor_run(lws_floor *f) {
  uv_run(&f->loop, UV_RUN_DEFAULT);
  /* A foreign loop: the context's handles close on the loop after lws_context_destroy(). */
  uv_run(&f->loop, UV_RUN_DEFAULT);
  uv_loop_close(&f->loop);
}
