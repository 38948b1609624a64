#include "host_support.h"

#include <stdlib.h>
#include <string.h>

#include "support.h"

ah_host *th_host_new(uv_loop_t *loop, uint64_t drain_ms) {
  ah_host *h = NULL;
  ah_host_opts opts = {.loop = loop, .config = NULL, .mode = "serve", .drain_ms = drain_ms};
  if (ah__host_new(&opts, &h) != 0)
    return NULL;
  return h;
}

static void stopped(int status, void *arg) {
  (void)status;
  *(bool *)arg = true;
}

static void close_left(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

int th_host_stop_free(uv_loop_t *loop, ah_host *h) {
  bool done = false;
  if (ah__host_stop(h, stopped, &done) == 0)
    ts_run_until(loop, &done, 15000);
  if (ah__host_zombie_count(h) > 0)
    uv_walk(loop, close_left, NULL); /* zombies stay mapped: closing their handles is safe */
  ah__host_free(h);
  return ts_loop_close(loop);
}

void th_reply(const ah_outcome *o, void *arg) {
  ts_outcome *out = arg;
  out->done = true;
  out->status = o->status;
  out->result = o->result ? json_deep_copy(o->result) : NULL;
  out->message = o->message ? strdup(o->message) : NULL;
  out->at_ms = ts_now_ms();
}

void th_outcome_clear(ts_outcome *o) {
  json_decref(o->result);
  free(o->message);
  memset(o, 0, sizeof *o);
}

int th_call(uv_loop_t *loop, ah_host *h, ah_authority authority, const char *method, json_t *params,
            ts_outcome *out) {
  memset(out, 0, sizeof *out);
  ah_caller caller = {
      .struct_size = sizeof caller, .authority = authority, .surface = "test", .connection_id = 1};
  int rc = ah__host_dispatch(h, &caller, method, params, NULL, th_reply, out);
  if (rc == 0)
    ts_run_until(loop, &out->done, 5000);
  return rc;
}

int th_load(ah_host *h, const char *fixture, json_t *config) {
  char *why = NULL;
  int rc = ah__host_load(h, ts_plugin(fixture), config, NULL, &why);
  free(why);
  json_decref(config);
  return rc;
}

int th_unload(uv_loop_t *loop, ah_host *h, const char *name) {
  bool done = false;
  int rc = ah__host_unload(h, name, stopped, &done);
  if (rc == 0)
    ts_run_until(loop, &done, 10000);
  return rc;
}

bool th_described(ah_host *h, const char *kind, const char *name) {
  json_t *d = ah__host_describe(h);
  bool found = false;
  size_t i = 0;
  json_t *p = NULL;
  json_array_foreach(json_object_get(d, "plugins"), i, p) {
    size_t j = 0;
    json_t *e = NULL;
    json_array_foreach(json_object_get(p, kind), j, e) {
      const char *n = json_string_value(json_object_get(e, "name"));
      char full[256] = "";
      if (!n) {
        snprintf(full, sizeof full, "%s.%s", json_string_value(json_object_get(e, "namespace")),
                 json_string_value(json_object_get(e, "method")));
        n = full;
      }
      if (strcmp(n, name) == 0)
        found = true;
    }
  }
  json_decref(d);
  return found;
}

/* Provided by the LeakSanitizer runtime when the build has one; NULL otherwise. */
int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

int th_leak_check(void) {
  return __lsan_do_recoverable_leak_check ? __lsan_do_recoverable_leak_check() : 0;
}
