/* agenthost — the pump: what the host delivers on later loop turns (internal).
 *
 * The pump knows nothing of what it delivers: the host gives it drains (call outcomes, posted tasks, bus
 * events), and the files that queue such work kick it. A drain's `run` makes one pass over what was queued
 * before it (later work waits for the next pass: no starvation); `pending` says whether work is queued.
 */
#ifndef AGENTHOST_HOST_PUMP_H
#define AGENTHOST_HOST_PUMP_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

typedef struct ah__drain {
  void (*run)(void *arg);
  bool (*pending)(void *arg);
} ah__drain;

#define AH__PUMP_DRAINS 4

typedef struct ah__pump {
  uv_idle_t idle;
  bool active;
  bool closing;
  ah__drain drains[AH__PUMP_DRAINS]; /* in order; the first one gets extra passes (chains of outcomes) */
  size_t ndrains;
  void *arg;
  void (*closed)(void *arg);
  void *closed_arg;
} ah__pump;

void ah__pump_init(ah__pump *p, uv_loop_t *loop, const ah__drain *drains, size_t n, void *arg);
/* Make sure the pump runs on the next loop turn. */
void ah__pump_kick(ah__pump *p);
/* Stop and close the pump; `closed` (may be NULL) runs once its handle is closed. */
void ah__pump_close(ah__pump *p, void (*closed)(void *arg), void *arg);

#endif
