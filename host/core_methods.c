/* The core's own mount: its methods (host.describe, plugin.*) and the eleven allowlisted events
 * (DECISIONS.md "Event allowlist"). */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "sessions.h"

/* The events clients may be forwarded (the event allowlist: exactly these eleven), and the core's other
 * events, declared without the flag (the surfaces that show them subscribe on their own). */
static const char *const core_events[] = {
    "session.created",  "session.closed",    "session.status",      "session.event",
    "subagent.started", "subagent.finished", "request.pending",     "request.resolved",
    "plugin.mounted",   "plugin.withdrawn",  "host.config-changed",
};
static const char *const core_events_unlisted[] = {"tools.changed", "session.updated", "session.options",
                                                   "session.deleted"};

static void m_describe(ah_call *call, const json_t *params, void *data) {
  (void)params;
  ah__call_reply(call, ah__host_describe(data));
}

/* host.stats → {sessions: {live, loads, unloads, idleUnloadS}, memory: {rssKiB, heapBytes, storeBytes}}:
 * what the daemon holds now — the sessions in memory, the cold loads and idle unloads since it started, the
 * idle time after which a session leaves memory (null: never), its resident memory, the bytes malloc has
 * handed out and, of them, the store's caches (null when its backend cannot tell). Not cached
 * (host.describe is). */
static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, resident = -1;
  if (f && fscanf(f, "%ld %ld", &size, &resident) != 2)
    resident = -1;
  if (f)
    fclose(f);
  return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void m_stats(ah_call *call, const json_t *params, void *data) {
  (void)params;
  ah_sessions *sm = ah__host_sessions(data);
  json_t *sessions = json_null();
  if (sm) {
    uint64_t idle = ah__sessions_idle_ms(sm);
    sessions = json_pack("{s:I, s:I, s:I, s:o}", "live", (json_int_t)ah__sessions_live(sm), "loads",
                         (json_int_t)ah__sessions_loads(sm), "unloads", (json_int_t)ah__sessions_unloads(sm),
                         "idleUnloadS", idle == UINT64_MAX ? json_null() : json_real((double)idle / 1000.0));
  }
  long rss = rss_kib();
  int64_t store = sm ? ah__store_memory_used(ah__sessions_store(sm)) : -1;
  ah__call_reply(call, json_pack("{s:o, s:{s:o, s:I, s:o}}", "sessions", sessions, "memory", "rssKiB",
                                 rss < 0 ? json_null() : json_integer(rss), "heapBytes",
                                 (json_int_t)mallinfo2().uordblks, "storeBytes",
                                 store < 0 ? json_null() : json_integer((json_int_t)store)));
}

/* session.events {after?, limit?} → {events, nextAfter?}: stored events of every session with a cursor
 * greater than `after` (default 0), in cursor order, at most `limit` (1..1000, default 200); nextAfter is
 * the last cursor of a full page. A pure store read, for surfaces that replay a gap-free stream after a
 * reconnection (the browser's mux). */
typedef struct events_ctx {
  ah_call *call;
  size_t limit;
} events_ctx;

static void session_events_read(int status, const json_t *results, void *arg) {
  events_ctx *c = arg;
  json_t *events = json_array_get(results, 0);
  if (status)
    ah__call_error(c->call, AH_EIO, "the store could not be read", NULL);
  else
    ah__call_reply(c->call, json_pack("{s:O, s:O?}", "events", events, "nextAfter",
                                      json_array_size(events) == c->limit
                                          ? json_object_get(json_array_get(events, c->limit - 1), "cursor")
                                          : NULL));
  free(c);
}

static void m_session_events(ah_call *call, const json_t *params, void *data) {
  ah_sessions *sm = ah__host_sessions(data);
  json_t *after = json_object_get(params, "after");
  json_t *limit = json_object_get(params, "limit");
  if ((after && (!json_is_integer(after) || json_integer_value(after) < 0)) ||
      (limit &&
       (!json_is_integer(limit) || json_integer_value(limit) < 1 || json_integer_value(limit) > 1000))) {
    ah__call_error(call, AH_EINVAL, "params: after (integer >= 0), limit (1..1000)", NULL);
    return;
  }
  ah_store *store = sm ? ah__sessions_store(sm) : NULL;
  if (!store) {
    ah__call_error(call, AH_EIO, "the store cannot be opened (see the host's log)", NULL);
    return;
  }
  size_t n = limit ? (size_t)json_integer_value(limit) : 200;
  ah_store_query q = {
      .kind = AH_STORE_Q_EVENTS_AFTER, .after = after ? json_integer_value(after) : 0, .limit = n};
  events_ctx *c = calloc(1, sizeof *c);
  if (c)
    *c = (events_ctx){call, n};
  int rc = c ? ah__store_read(store, &q, 1, session_events_read, c) : AH_ENOMEM;
  if (rc) {
    free(c);
    ah__call_error(call, rc, rc == AH_ECLOSED ? "the host is stopping" : ah_strerror(rc), NULL);
  }
}

static void m_plugin_list(ah_call *call, const json_t *params, void *data) {
  (void)params;
  ah__call_reply(call, json_pack("{s:o}", "plugins", ah__host_plugin_list(data)));
}

static void m_plugin_load(ah_call *call, const json_t *params, void *data) {
  ah_host *h = data;
  const char *path = json_string_value(json_object_get(params, "path"));
  json_t *config = json_object_get(params, "config");
  if (!path || path[0] != '/') {
    ah__call_error(call, AH_EINVAL, "params.path: an absolute path to a plugin module is required", NULL);
    return;
  }
  if (config && !json_is_object(config)) {
    ah__call_error(call, AH_EINVAL, "params.config: must be an object", NULL);
    return;
  }
  char *name = NULL;
  char *why = NULL;
  int rc = ah__host_load(h, path, config, &name, &why);
  if (rc)
    ah__call_error(call, rc, why ? why : ah_strerror(rc), json_pack("{s:s}", "name", ah_err_name(rc)));
  else
    ah__call_reply(call, json_pack("{s:s}", "name", name));
  free(name);
  free(why);
}

typedef struct unload_ctx {
  ah_call *call;
  ah_host *host;
  size_t zombies_before;
} unload_ctx;

static void unload_done(int status, void *arg) {
  unload_ctx *u = arg;
  if (status)
    ah__call_error(u->call, status, ah_strerror(status), NULL);
  else
    ah__call_reply(u->call, json_pack("{s:b}", "zombie", ah__host_zombie_count(u->host) > u->zombies_before));
  free(u);
}

static unload_ctx *unload_ctx_new(ah_call *call, ah_host *h) {
  unload_ctx *u = calloc(1, sizeof *u);
  if (u) {
    u->call = call;
    u->host = h;
    u->zombies_before = ah__host_zombie_count(h);
  }
  return u;
}

static void m_plugin_unload(ah_call *call, const json_t *params, void *data) {
  ah_host *h = data;
  const char *name = json_string_value(json_object_get(params, "name"));
  if (!name) {
    ah__call_error(call, AH_EINVAL, "params.name: a plugin name is required", NULL);
    return;
  }
  unload_ctx *u = unload_ctx_new(call, h);
  int rc = u ? ah__host_unload(h, name, unload_done, u) : AH_ENOMEM;
  if (rc)
    free(u);
  if (rc)
    ah__call_error(call, rc,
                   rc == AH_ENOENT  ? "no such plugin is mounted"
                   : rc == AH_EPERM ? "the core cannot be unloaded"
                                    : ah_strerror(rc),
                   NULL);
}

static void m_plugin_reload(ah_call *call, const json_t *params, void *data) {
  ah_host *h = data;
  const char *name = json_string_value(json_object_get(params, "name"));
  if (!name) {
    ah__call_error(call, AH_EINVAL, "params.name: a plugin name is required", NULL);
    return;
  }
  if (strcmp(name, "core") == 0) {
    ah__call_error(call, AH_EPERM, "the core cannot be reloaded", NULL);
    return;
  }
  unload_ctx *u = unload_ctx_new(call, h);
  int rc = u ? ah__host_reload(h, name, unload_done, u) : AH_ENOMEM;
  if (rc)
    free(u);
  if (rc)
    ah__call_error(call, rc, rc == AH_ENOENT ? "no such plugin is mounted" : ah_strerror(rc), NULL);
}

int ah__core_register(ah_host *h, ah_mount *m) {
  const struct {
    const char *name;
    ah_method_fn fn;
    uint32_t flags;
  } methods[] = {
      {"host.describe", m_describe, AH_METHOD_PUBLIC},
      {"host.stats", m_stats, AH_METHOD_PRIVILEGED},
      {"session.events", m_session_events, AH_METHOD_PUBLIC},
      {"plugin.list", m_plugin_list, AH_METHOD_PUBLIC},
      {"plugin.load", m_plugin_load, AH_METHOD_PRIVILEGED},
      {"plugin.unload", m_plugin_unload, AH_METHOD_PRIVILEGED},
      {"plugin.reload", m_plugin_reload, AH_METHOD_PRIVILEGED},
  };
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    ah_method_def def = {.struct_size = sizeof def,
                         .name = methods[i].name,
                         .handler = methods[i].fn,
                         .flags = methods[i].flags,
                         .data = h};
    int rc = ah__services_register_method(m, &def);
    if (rc)
      return rc;
  }
  for (size_t i = 0; i < sizeof core_events / sizeof core_events[0]; i++) {
    int rc = ah__services_register_event(m, core_events[i], AH_EVENT_ALLOWLISTED);
    if (rc)
      return rc;
  }
  for (size_t i = 0; i < sizeof core_events_unlisted / sizeof core_events_unlisted[0]; i++) {
    int rc = ah__services_register_event(m, core_events_unlisted[i], 0);
    if (rc)
      return rc;
  }
  return ah__host_sessions(h) ? ah__sessions_register(ah__host_sessions(h), m) : 0;
}
