/* The pump (pump.h): an idle handle that runs the host's drains while any of them has work queued. */
#include "pump.h"

/* A chain of outcomes (a call answered from another call's callback, as the remote gateway does) runs in a
 * few passes of one loop turn instead of one turn per link; the bound keeps I/O from waiting behind work
 * that keeps queueing more. */
#define PUMP_PASSES 4

static void pump_cb(uv_idle_t *idle) {
  ah__pump *p = idle->data;
  /* At least one pass: every drain runs even when the first has nothing queued. */
  for (int pass = 0; pass < PUMP_PASSES && (pass == 0 || p->drains[0].pending(p->arg)); pass++)
    for (size_t i = 0; i < p->ndrains; i++)
      p->drains[i].run(p->arg);
  bool any = false;
  for (size_t i = 0; i < p->ndrains; i++)
    any = any || p->drains[i].pending(p->arg);
  if (!any) {
    uv_idle_stop(&p->idle);
    p->active = false;
  }
}

void ah__pump_init(ah__pump *p, uv_loop_t *loop, const ah__drain *drains, size_t n, void *arg) {
  *p = (ah__pump){.ndrains = n < AH__PUMP_DRAINS ? n : AH__PUMP_DRAINS, .arg = arg};
  for (size_t i = 0; i < p->ndrains; i++)
    p->drains[i] = drains[i];
  uv_idle_init(loop, &p->idle);
  p->idle.data = p;
}

void ah__pump_kick(ah__pump *p) {
  if (p->active || p->closing)
    return;
  p->active = true;
  uv_idle_start(&p->idle, pump_cb);
}

static void pump_closed(uv_handle_t *h) {
  ah__pump *p = h->data;
  if (p->closed)
    p->closed(p->closed_arg);
}

void ah__pump_close(ah__pump *p, void (*closed)(void *arg), void *arg) {
  uv_idle_stop(&p->idle);
  p->active = false;
  p->closing = true;
  p->closed = closed;
  p->closed_arg = arg;
  uv_close((uv_handle_t *)&p->idle, pump_closed);
}
