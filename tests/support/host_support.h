/* Helpers for tests that run a real host on a private loop. */
#ifndef AGENTHOST_TEST_HOST_SUPPORT_H
#define AGENTHOST_TEST_HOST_SUPPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <uv.h>

#include "host.h"

/* A finished call as the caller saw it. */
typedef struct ts_outcome {
  bool done;
  int status;
  json_t *result; /* owned */
  char *message;  /* owned */
  uint64_t at_ms; /* when it was delivered (ts_now_ms) */
} ts_outcome;

/* A host on `loop` with the given drain deadline (0 = default) and no configuration. */
ah_host *th_host_new(uv_loop_t *loop, uint64_t drain_ms);

/* Stop the host, run the loop until it stopped, close what zombie modules left on the loop, free the
 * host and return uv_loop_close()'s result. */
int th_host_stop_free(uv_loop_t *loop, ah_host *h);

/* The reply callback for ah__host_dispatch filling a ts_outcome (arg). */
void th_reply(const ah_outcome *o, void *arg);

/* Dispatch `method` with `params` (stolen) for a caller of `authority` and run the loop until the
 * answer (at most 5 s). Returns the dispatch return code; *out is filled when it is 0. */
int th_call(uv_loop_t *loop, ah_host *h, ah_authority authority, const char *method, json_t *params,
            ts_outcome *out);
void th_outcome_clear(ts_outcome *o);

/* Load a fixture plugin by name (tests/plugins/NAME.so); returns ah__host_load's result. */
int th_load(ah_host *h, const char *fixture, json_t *config);

/* Unload and run the loop until the withdraw completed (at most 10 s). Returns the unload result. */
int th_unload(uv_loop_t *loop, ah_host *h, const char *name);

/* True when host.describe lists a method / event / descriptor ("ns.method") of that name. */
bool th_described(ah_host *h, const char *kind, const char *name);

/* Under LeakSanitizer, check for leaks now: non-zero when unreachable memory was found (the report goes to
 * stderr). 0 in a build without it. Call it at the end of a test, after the host is freed and the loop
 * closed: LeakSanitizer's own check at process exit does not fail a Criterion test. */
int th_leak_check(void);

#endif
