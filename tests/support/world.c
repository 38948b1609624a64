/* The sessions' test world: see world.h. */
#include "world.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host_support.h"
#include "internal.h"
#include "sessions.h"
#include "store.h"
#include "support.h"

/* ---- a host with a state directory ------------------------------------------------------------------ */

void on_bus(const char *name, const json_t *data, void *arg) {
  world *w = arg;
  json_array_append_new(w->events, json_pack("[sO]", name, data));
}

ah_host *host_on(world *w) {
  ah_host *h = NULL;
  ah_host_opts opts = {.loop = &w->loop, .config = &w->cfg, .mode = "serve", .drain_ms = 1000};
  cr_assert_eq(ah__host_new(&opts, &h), 0);
  return h;
}

void world_up(world *w) {
  world_up_hooks(w, NULL);
}

void world_up_hooks(world *w, json_t *hooks) {
  memset(w, 0, sizeof *w);
  w->cfg.hooks = hooks;
  cr_assert_eq(uv_loop_init(&w->loop), 0);
  w->dir = ts_mkdtemp();
  cr_assert(asprintf(&w->state, "%s/state", w->dir) > 0);
  cr_assert(asprintf(&w->work, "%s/work", w->dir) > 0);
  cr_assert_eq(mkdir(w->work, 0700), 0);
  w->cfg.state_dir = w->state;
  w->cfg.default_provider = "echo";
  w->h = host_on(w);
  w->events = json_array();
  cr_assert_eq(ah__host_api(w->h)->subscribe(ah__host_core_mount(w->h), "*", on_bus, w, &w->sub), 0);
}

void world_down(world *w) {
  if (w->h)
    cr_assert_eq(th_host_stop_free(&w->loop, w->h), 0);
  else
    cr_assert_eq(ts_loop_close(&w->loop), 0);
  json_decref(w->events);
  json_decref(w->cfg.hooks);
  ts_rmtree(w->dir);
  free(w->dir);
  free(w->state);
  free(w->work);
}

/* Call and require success; returns the result (owned). */
json_t *ok_call(world *w, const char *method, json_t *params) {
  ts_outcome o;
  int rc = th_call(&w->loop, w->h, AH_AUTH_ADMIN, method, params, &o);
  cr_assert_eq(rc, 0, "%s: dispatch %s", method, ah_err_name(rc));
  cr_assert(o.done, "%s: no answer", method);
  cr_assert_eq(o.status, 0, "%s: %s %s", method, ah_err_name(o.status), o.message ? o.message : "");
  json_t *r = o.result;
  free(o.message);
  return r;
}

int err_call(world *w, const char *method, json_t *params) {
  ts_outcome o;
  int rc = th_call(&w->loop, w->h, AH_AUTH_ADMIN, method, params, &o);
  if (rc)
    return rc;
  cr_assert(o.done, "%s: no answer", method);
  int st = o.status;
  th_outcome_clear(&o);
  return st;
}

char *create(world *w) {
  json_t *r = ok_call(w, "session.create", json_pack("{s:s, s:s}", "cwd", w->work, "title", "t"));
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  return id;
}

char *prompt(world *w, const char *id, const char *text) {
  json_t *r = ok_call(w, "session.prompt", json_pack("{s:s, s:s}", "sessionId", id, "text", text));
  char *mid = strdup(json_string_value(json_object_get(r, "messageId")));
  json_decref(r);
  return mid;
}

/* The stored events of a session. */
json_t *history(world *w, const char *id) {
  json_t *r = ok_call(w, "session.history", json_pack("{s:s, s:i}", "sessionId", id, "limit", 1000));
  json_t *ev = json_incref(json_object_get(r, "events"));
  json_decref(r);
  return ev;
}

/* The first stored event of `kind` (after index `from`), or NULL. Borrowed from `events`. */
json_t *find_kind(json_t *events, const char *kind, size_t from) {
  for (size_t i = from; i < json_array_size(events); i++) {
    json_t *e = json_array_get(events, i);
    if (strcmp(json_string_value(json_object_get(e, "kind")), kind) == 0)
      return e;
  }
  return NULL;
}

typedef struct wait_kind {
  world *w;
  const char *id;
  const char *kind;
  int count;
} wait_kind;

bool bus_published(void *arg) {
  bus_wait *b = arg;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(b->w->events, i, e) {
    if (strcmp(json_string_value(json_array_get(e, 0)), b->name) == 0 &&
        (!b->key || json_object_get(json_array_get(e, 1), b->key)))
      return true;
  }
  return false;
}

bool has_kind(void *arg) {
  wait_kind *k = arg;
  json_t *ev = ah__store_events(ah__sessions_store(ah__host_sessions(k->w->h)), k->id, 0, 100000);
  int n = 0;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(ev, i, e) {
    n += strcmp(json_string_value(json_object_get(e, "kind")), k->kind) == 0;
  }
  json_decref(ev);
  return n >= k->count;
}

void wait_for(world *w, const char *id, const char *kind, int count) {
  wait_kind k = {w, id, kind, count};
  cr_assert(ts_run_until_pred(&w->loop, has_kind, &k, 10000), "no %d x %s in session %s", count, kind, id);
}

json_t *pending_requests(world *w, const char *id) {
  json_t *r = ok_call(w, "request.list", json_pack("{s:s}", "sessionId", id));
  json_t *l = json_incref(json_object_get(r, "requests"));
  json_decref(r);
  return l;
}

typedef struct wait_req {
  world *w;
  const char *id;
} wait_req;

bool has_request(void *arg) {
  wait_req *q = arg;
  json_t *l = pending_requests(q->w, q->id);
  bool has = json_array_size(l) > 0;
  json_decref(l);
  return has;
}

json_t *wait_request(world *w, const char *id) {
  wait_req q = {w, id};
  cr_assert(ts_run_until_pred(&w->loop, has_request, &q, 10000), "no pending request");
  json_t *l = pending_requests(w, id);
  json_t *r = json_incref(json_array_get(l, 0));
  json_decref(l);
  return r;
}

json_t *respond_as(world *w, uint64_t conn, json_t *params) {
  ts_outcome o;
  memset(&o, 0, sizeof o);
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_LAN, .surface = "test", .connection_id = conn};
  cr_assert_eq(ah__host_dispatch(w->h, &c, "request.respond", params, NULL, th_reply, &o), 0);
  cr_assert(ts_run_until(&w->loop, &o.done, 5000));
  cr_assert_eq(o.status, 0, "%s", o.message ? o.message : "");
  free(o.message);
  return o.result;
}

/* The data of the last stored event of `kind`, borrowed from `events`. */
json_t *last_data(json_t *events, const char *kind) {
  json_t *found = NULL;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(events, i, e) {
    if (strcmp(json_string_value(json_object_get(e, "kind")), kind) == 0)
      found = json_object_get(e, "data");
  }
  return found;
}
