/* Fixture "slow-call": a cancellable method that takes 10 s, for the withdraw and cancellation tests.
 *
 * Methods: slow.wait (public, cancellable; {"done": true} after 10 s unless its token trips, then
 * `cancelled`), slow.pending (public; {"pending": N}, the number of slow.wait calls not yet answered),
 * slow.stuck (public, not cancellable; never answered before withdraw(), which answers it late — a call
 * the drain cannot finish).
 *
 * Config: "report" (optional) — a file path. withdraw() writes {"withdraw_ns": uv_hrtime() when withdraw
 * ran, "pending_at_withdraw": N} there (atomically: a temporary file, then rename), so that a test can
 * check that the host drained every call before it withdrew the plugin.
 */
#include <agenthost/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOW_CALL_WAIT_MS 10000

typedef struct slow_call_state slow_call_state;

/* One slow.wait call that has not been answered yet. */
typedef struct slow_call_pending {
  slow_call_state *st;
  ah_call *call;
  ah_timer *timer;        /* one-shot; NULL once fired or stopped */
  ah_cancel_watch *watch; /* NULL once fired or unwatched */
  struct slow_call_pending *prev;
  struct slow_call_pending *next;
} slow_call_pending;

struct slow_call_state {
  ah_mount *m;
  const ah_host_api *api;
  char *report; /* copy of config "report", or NULL */
  size_t pending;
  slow_call_pending *calls; /* the unanswered calls, most recent first */
  ah_call *stuck[64];       /* slow.stuck calls, answered only in withdraw() */
  size_t nstuck;
};

static void slow_call_link(slow_call_pending *pc) {
  slow_call_state *st = pc->st;
  pc->prev = NULL;
  pc->next = st->calls;
  if (st->calls != NULL) {
    st->calls->prev = pc;
  }
  st->calls = pc;
  st->pending++;
}

/* The call has been answered and its timer and watch are gone: forget it. */
static void slow_call_finish(slow_call_pending *pc) {
  slow_call_state *st = pc->st;
  if (pc->prev != NULL) {
    pc->prev->next = pc->next;
  } else {
    st->calls = pc->next;
  }
  if (pc->next != NULL) {
    pc->next->prev = pc->prev;
  }
  st->pending--;
  free(pc);
}

static void slow_call_timer_cb(ah_timer *timer, void *arg) {
  slow_call_pending *pc = arg;
  const ah_host_api *api = pc->st->api;
  json_t *result = NULL;
  (void)timer;

  /* A one-shot timer is freed by the host after this callback. The watch is ended before the answer,
   * since the call (and its token) may be freed by the answer. */
  pc->timer = NULL;
  api->token_unwatch(pc->watch);
  pc->watch = NULL;

  result = json_pack("{s:b}", "done", 1);
  if (result == NULL) {
    api->call_error(pc->call, AH_ENOMEM, "cannot build the reply", NULL);
  } else {
    api->call_reply(pc->call, result);
  }
  slow_call_finish(pc);
}

static void slow_call_cancel_cb(ah_cancel *token, void *arg) {
  slow_call_pending *pc = arg;
  const ah_host_api *api = pc->st->api;
  (void)token;

  /* The watch has fired and so has ended. */
  pc->watch = NULL;
  api->timer_stop(pc->timer);
  pc->timer = NULL;
  /* 0, or AH_ECANCELED when the host has already answered the caller `cancelled`: either way the call
   * is finished. */
  (void)api->call_error(pc->call, AH_ECANCELED, "cancelled", NULL);
  slow_call_finish(pc);
}

static void slow_call_wait(ah_call *call, const json_t *params, void *data) {
  slow_call_state *st = data;
  const ah_host_api *api = st->api;
  ah_cancel *token = api->call_cancel_token(call);
  slow_call_pending *pc = NULL;
  int rc = 0;
  (void)params;

  if (token == NULL) {
    api->call_error(call, AH_EINTERNAL, "slow.wait has no cancellation token", NULL);
    return;
  }
  pc = calloc(1, sizeof(*pc));
  if (pc == NULL) {
    api->call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  pc->st = st;
  pc->call = call;

  rc = api->timer_start(st->m, SLOW_CALL_WAIT_MS, 0, slow_call_timer_cb, pc, &pc->timer);
  if (rc != 0) {
    free(pc);
    api->call_error(call, rc, "cannot start the timer", NULL);
    return;
  }
  rc = api->token_watch(token, slow_call_cancel_cb, pc, &pc->watch);
  if (rc != 0) {
    /* AH_ECANCELED: the token tripped before the watch; the callback will never run. */
    api->timer_stop(pc->timer);
    free(pc);
    api->call_error(call, rc, rc == AH_ECANCELED ? "cancelled" : "cannot watch the token", NULL);
    return;
  }
  slow_call_link(pc);
}

static void slow_call_stuck(ah_call *call, const json_t *params, void *data) {
  slow_call_state *st = data;
  (void)params;
  if (st->nstuck == sizeof st->stuck / sizeof st->stuck[0]) {
    st->api->call_error(call, AH_EBUSY, "too many stuck calls", NULL);
    return;
  }
  st->stuck[st->nstuck++] = call;
}

static void slow_call_pending_method(ah_call *call, const json_t *params, void *data) {
  slow_call_state *st = data;
  json_t *result = json_pack("{s:I}", "pending", (json_int_t)st->pending);
  (void)params;

  if (result == NULL) {
    st->api->call_error(call, AH_ENOMEM, "cannot build the reply", NULL);
    return;
  }
  st->api->call_reply(call, result);
}

/* Write {"withdraw_ns", "pending_at_withdraw"} to st->report: a temporary file renamed into place, so a
 * reader never sees half a file. */
static void slow_call_write_report(slow_call_state *st, uint64_t withdraw_ns, size_t pending) {
  json_t *report = NULL;
  char *tmp = NULL;

  report = json_pack("{s:I,s:I}", "withdraw_ns", (json_int_t)withdraw_ns, "pending_at_withdraw",
                     (json_int_t)pending);
  if (report == NULL || asprintf(&tmp, "%s.tmp", st->report) < 0) {
    st->api->log(st->m, AH_PLOG_ERROR, "cannot build the withdraw report");
    json_decref(report);
    return;
  }
  if (json_dump_file(report, tmp, JSON_COMPACT) != 0 || rename(tmp, st->report) != 0) {
    st->api->log(st->m, AH_PLOG_ERROR, "cannot write the withdraw report to %s", st->report);
    remove(tmp);
  }
  free(tmp);
  json_decref(report);
}

static int slow_call_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  slow_call_state *st = NULL;
  const char *report = json_string_value(json_object_get(config, "report"));
  int rc = 0;

  st = calloc(1, sizeof(*st));
  if (st == NULL) {
    return AH_ENOMEM;
  }
  st->m = m;
  st->api = api;
  if (report != NULL) {
    st->report = strdup(report); /* config is borrowed for the call only */
    if (st->report == NULL) {
      free(st);
      return AH_ENOMEM;
    }
  }

  const ah_method_def wait = {
      .struct_size = sizeof(ah_method_def),
      .name = "slow.wait",
      .handler = slow_call_wait,
      .flags = AH_METHOD_PUBLIC | AH_METHOD_CANCELLABLE,
      .data = st,
  };
  const ah_method_def pending = {
      .struct_size = sizeof(ah_method_def),
      .name = "slow.pending",
      .handler = slow_call_pending_method,
      .flags = AH_METHOD_PUBLIC,
      .data = st,
  };
  const ah_method_def stuck = {
      .struct_size = sizeof(ah_method_def),
      .name = "slow.stuck",
      .handler = slow_call_stuck,
      .flags = AH_METHOD_PUBLIC,
      .data = st,
  };
  rc = api->register_method(m, &wait);
  if (rc == 0) {
    rc = api->register_method(m, &pending);
  }
  if (rc == 0) {
    rc = api->register_method(m, &stuck);
  }
  if (rc != 0) {
    /* withdraw() is not called after a failed mount. */
    free(st->report);
    free(st);
    return rc;
  }
  *state = st;
  return 0;
}

static void slow_call_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  slow_call_state *st = state;
  const ah_host_api *api = st->api;
  uint64_t withdraw_ns = uv_hrtime();
  size_t pending = st->pending;

  if (pending != 0) {
    api->log(m, AH_PLOG_WARN, "withdraw with %zu call(s) still pending", pending);
  }
  if (st->report != NULL) {
    slow_call_write_report(st, withdraw_ns, pending);
  }
  /* The host should have drained every call before withdraw(). If it did not, finish them here so that
   * nothing of ours is left behind: a call lives until the plugin's own answer. */
  while (st->calls != NULL) {
    slow_call_pending *pc = st->calls;
    if (pc->watch != NULL) {
      api->token_unwatch(pc->watch);
    }
    if (pc->timer != NULL) {
      api->timer_stop(pc->timer);
    }
    (void)api->call_error(pc->call, AH_ECANCELED, "cancelled", NULL);
    slow_call_finish(pc);
  }
  for (size_t i = 0; i < st->nstuck; i++) {
    (void)api->call_reply(st->stuck[i], json_pack("{s:b}", "late", 1));
  }
  free(st->report);
  free(st);
  done(m);
}

static const ah_plugin_desc slow_call_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "slow-call",
    .version = "1.0.0",
    .description = "test fixture: a cancellable method that answers after 10 s",
    .mount = slow_call_mount,
    .withdraw = slow_call_withdraw,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &slow_call_desc;
}
