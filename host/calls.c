/* Dispatch by method name and in-flight call tracking.
 *
 * A call has two sides. The caller side is answered exactly once: with the plugin's answer, or with
 * `cancelled` as soon as the call's token trips (withdraw, or the caller's own token). The plugin side is
 * finished when the plugin answers; until then the call counts as in flight for withdraw's drain, and the
 * plugin's late answer is dropped (call_reply returns AH_ECANCELED). The object is freed when both sides
 * are done. Outcomes reach callers on a later loop turn, never from inside dispatch().
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void ah__complete(ah_host *h, ah_reply_fn cb, void *arg, int status, json_t *result, const char *message,
                  json_t *data) {
  ah__completion *c = calloc(1, sizeof *c);
  if (!c) {
    /* Out of memory while answering: deliver synchronously rather than lose the answer. */
    ah_outcome o = {.status = AH_ENOMEM, .result = NULL, .message = "out of memory", .data = NULL};
    json_decref(result);
    json_decref(data);
    cb(&o, arg);
    return;
  }
  c->cb = cb;
  c->arg = arg;
  c->status = status;
  c->result = status == 0 ? (result ? result : json_null()) : NULL;
  if (status != 0)
    json_decref(result);
  c->message = status != 0 ? strdup(message ? message : ah_strerror(status)) : NULL;
  c->data = status != 0 ? data : NULL;
  if (status == 0)
    json_decref(data);
  ah__list_push(&h->completions, &c->link);
  ah__pump_kick(&h->pump);
}

/* The pump's pass over the outcomes queued before it. */
void ah__calls_drain(void *host) {
  ah_host *h = host;
  ah__link batch;
  ah__list_take_all(&batch, &h->completions);
  while (!ah__list_empty(&batch)) {
    ah__completion *c = AH__CONTAINER(batch.next, ah__completion, link);
    ah__list_remove(&c->link);
    ah_outcome o = {.status = c->status, .result = c->result, .message = c->message, .data = c->data};
    c->cb(&o, c->arg);
    json_decref(c->result);
    json_decref(c->data);
    free(c->message);
    free(c);
  }
}

bool ah__calls_pending(void *host) {
  return !ah__list_empty(&((ah_host *)host)->completions);
}

static void call_free_if_done(ah_call *c) {
  if (!c->answered || !c->finished)
    return;
  ah__cancel_unwatch(c->parent_watch);
  c->parent_watch = NULL;
  ah__cancel_free(c->token);
  json_decref(c->params);
  free(c->surface);
  free(c->method);
  free(c->fail_message);
  free(c);
}

static void answer_caller(ah_call *c, int status, json_t *result, const char *message, json_t *data) {
  if (c->answered) {
    json_decref(result);
    json_decref(data);
    return;
  }
  c->answered = true;
  c->host->inflight--;
  if (c->audited)
    ah__audit(c->host, c->method, &c->caller, status);
  ah__complete(c->host, c->cb, c->arg, status, result, message, data);
}

static void finish_plugin_side(ah_call *c) {
  c->finished = true;
  ah__list_remove(&c->link);
  ah_mount *m = c->mount;
  call_free_if_done(c);
  ah__mount_release(m, AH__HOLD_CALL);
}

int ah__call_reply(ah_call *c, json_t *result) {
  if (!c) {
    json_decref(result);
    return AH_EINVAL;
  }
  if (c->finished) {
    json_decref(result);
    return AH_ESTATE;
  }
  bool late = c->answered;
  answer_caller(c, 0, result, NULL, NULL);
  finish_plugin_side(c);
  return late ? AH_ECANCELED : 0;
}

int ah__call_error(ah_call *c, int status, const char *message, json_t *data) {
  if (!c) {
    json_decref(data);
    return AH_EINVAL;
  }
  if (c->finished) {
    json_decref(data);
    return AH_ESTATE;
  }
  if (status >= 0)
    status = AH_EINTERNAL;
  bool late = c->answered;
  answer_caller(c, status, NULL, message, data);
  finish_plugin_side(c);
  return late ? AH_ECANCELED : 0;
}

static void on_call_token(ah_cancel *t, void *arg) {
  (void)t;
  ah_call *c = arg;
  answer_caller(c, AH_ECANCELED, NULL, "cancelled", NULL);
}

static void on_parent_token(ah_cancel *t, void *arg) {
  (void)t;
  ah_call *c = arg;
  c->parent_watch = NULL; /* a fired watch is gone */
  ah__cancel_trip(c->token);
}

void ah__calls_cancel_mount(ah_mount *m) {
  /* Answer the callers; the plugin side stays in flight until the plugin answers (drain). */
  AH__LIST_EACH(it, &m->calls) {
    ah_call *c = AH__CONTAINER(it, ah_call, link);
    answer_caller(c, AH_ECANCELED, NULL, "cancelled", NULL);
  }
}

int ah__call_new(ah_host *h, ah__entry *e, const ah_caller *caller, const char *name, json_t *params,
                 bool cancellable, bool audited, ah_cancel *parent, ah_reply_fn cb, void *arg,
                 ah_call **out) {
  *out = NULL;
  ah_call *c = calloc(1, sizeof *c);
  if (!c) {
    json_decref(params);
    return AH_ENOMEM;
  }
  ah_mount *m = e->mount;
  c->head.api = &ah__api_table;
  c->head.data = e->kind == AH__ENTRY_REMOTE ? e->remote->data : e->data;
  c->host = h;
  c->mount = m;
  c->entry = e;
  c->caller = *caller;
  c->surface = ah__strdup(caller->surface ? caller->surface : "");
  c->caller.surface = c->surface;
  c->caller.struct_size = sizeof c->caller;
  c->method = strdup(name);
  c->params = params ? params : json_object();
  c->cancellable = cancellable;
  c->audited = audited;
  c->cb = cb;
  c->arg = arg;
  c->token = ah__cancel_new(m->token);
  ah__list_init(&c->link);
  if (!c->surface || !c->method || !c->params || !c->token ||
      ah__cancel_watch(c->token, on_call_token, c, NULL) != 0 ||
      (parent && ah__cancel_watch(parent, on_parent_token, c, &c->parent_watch) == AH_ENOMEM)) {
    ah__cancel_free(c->token);
    json_decref(c->params);
    free(c->surface);
    free(c->method);
    free(c);
    return AH_ENOMEM;
  }
  if (c->parent_watch)
    c->parent_watch->fire_on_free = true;
  ah__list_push(&m->calls, &c->link);
  ah__mount_hold(m, AH__HOLD_CALL);
  h->inflight++;
  if (parent && ah__cancel_tripped(parent)) {
    /* The caller's token tripped before the call started: answer cancelled, never run the handler. */
    answer_caller(c, AH_ECANCELED, NULL, "cancelled", NULL);
    c->finished = true;
    ah__list_remove(&c->link);
    call_free_if_done(c);
    ah__mount_release(m, AH__HOLD_CALL);
    return 0;
  }
  *out = c;
  return 0;
}

bool ah__privileged(ah_authority a) {
  return a == AH_AUTH_LOOPBACK || a == AH_AUTH_STDIO_OWNER || a == AH_AUTH_ADMIN;
}

int ah__host_dispatch(ah_host *h, const ah_caller *caller, const char *method, json_t *params,
                      ah_cancel *parent, ah_reply_fn cb, void *arg) {
  int rc = 0;
  if (!h || !caller || !method || !cb || caller->struct_size < offsetof(ah_caller, reserved) ||
      caller->authority < AH_AUTH_LAN || caller->authority > AH_AUTH_ADMIN) {
    rc = AH_EINVAL;
    goto out;
  }
  if (params && !json_is_object(params) && !json_is_array(params)) {
    rc = AH_EINVAL;
    goto out;
  }
  if (h->stopping) {
    rc = AH_ESTATE;
    goto out;
  }
  ah__entry *e = ah__registry_find(&h->reg, AH__ENTRY_METHOD, method);
  if (!e || e->state == AH__ST_STAGED) {
    rc = ah__registry_tombstoned(&h->reg, AH__ENTRY_METHOD, method) ? AH_EUNAVAILABLE : AH_ENOMETHOD;
    goto out;
  }
  if (e->state != AH__ST_ACTIVE || e->mount->state != AH__MOUNT_ACTIVE) {
    rc = AH_EUNAVAILABLE;
    goto out;
  }
  if ((e->flags & AH_METHOD_PRIVILEGED) && !ah__privileged(caller->authority)) {
    AH_LOG_W("calls", "refused privileged method %s to a %s caller on %s", method,
             caller->authority == AH_AUTH_LAN ? "LAN" : "non-privileged",
             caller->surface ? caller->surface : "?");
    ah__audit(h, method, caller, AH_EPERM);
    rc = AH_EPERM;
    goto out;
  }
  ah_call *c = NULL;
  rc = ah__call_new(h, e, caller, method, params, (e->flags & AH_METHOD_CANCELLABLE) != 0,
                    (e->flags & AH_METHOD_PRIVILEGED) != 0, parent, cb, arg, &c);
  params = NULL;
  if (rc || !c)
    return rc;
  e->handler(c, c->params, e->data);
  return 0;
out:
  json_decref(params);
  return rc;
}

/* ---- the API's call accessors -------------------------------------------------------------------- */

void ah__call_set_message(ah_call *c, const char *message) {
  if (!c || !message)
    return;
  char *copy = strdup(message);
  if (!copy)
    return;
  free(c->fail_message);
  c->fail_message = copy;
}

ah_cancel *ah__call_cancel_token(ah_call *c) {
  return c && c->cancellable ? c->token : NULL;
}
const ah_caller *ah__call_caller(ah_call *c) {
  return c ? &c->caller : NULL;
}
