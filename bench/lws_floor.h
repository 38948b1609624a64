/* What the benchmarks' bare libwebsockets floors share (browser_bare.c, browser_broadcast_bare.c): the setup
 * the browser plugin makes for itself — a context on a foreign libuv loop (LWS_SERVER_OPTION_LIBUV) and one
 * vhost on 127.0.0.1 — and a run that SIGINT or SIGTERM ends. */
#ifndef AGENTHOST_BENCH_LWS_FLOOR_H
#define AGENTHOST_BENCH_LWS_FLOOR_H

#include <libwebsockets.h>
#include <uv.h>

typedef struct lws_floor {
  uv_loop_t loop;
  struct lws_context *ctx;
  uv_signal_t sigint_h, sigterm_h;
  void (*on_stop)(struct lws_floor *f); /* at SIGINT/SIGTERM, before the context goes: close own handles */
} lws_floor;

/* Init the loop (f->loop, for the caller's own handles too), create the context with `protocols` and the
 * vhost `name` on 127.0.0.1:`port` (0: a free port). Returns the port listened on, or -1 (said on stderr). */
int lws_floor_open(lws_floor *f, const char *name, const struct lws_protocols *protocols, int port);
/* Run until SIGINT or SIGTERM, then destroy the context and close the loop. */
void lws_floor_run(lws_floor *f);

#endif
