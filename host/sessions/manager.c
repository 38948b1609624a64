/* The session manager: the store it opens (lazily for a stdio child), the methods it registers at
 * start, the lease timer, the orderly stop (turns end, leases are released, the store is closed) and the
 * session gateway of sessions.h for the remote surface.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../usage.h"
#include "session.h"

static void recover(ah_sessions *m);
static void stop_deadline(ah_timer *t, void *arg);

/* ---- the store ----------------------------------------------------------------------------------- */

/* The store, opened now when the manager was made with a lazy store (a stdio child that may never touch
 * a session does not pay for opening the database before it answers its client). NULL when it cannot be
 * opened (logged once): every session method then fails with AH_EIO. */
ah_store *ah__sm_store(ah_sessions *m) {
  if (m->store || m->store_failed || (!m->store_path && !m->store_url))
    return m->store;
  char *why = NULL;
  ah_store_opts so = {.path = m->store_path,
                      .url = m->store_url,
                      .password = m->store_password,
                      .sync = m->store_sync,
                      .read_only = false};
  if (ah__store_open(ah__host_loop(m->host), m->store_backend, &so, &m->store, &why) != 0) {
    AH_LOG_E(LOG, "cannot open the store: %s", why ? why : "unknown error");
    m->store = NULL;
    m->store_failed = true;
  } else {
    ah__hosts_start(m);
  }
  free(why);
  return m->store;
}

/* The row as clients see it: the stored row with the live status, without the lease internals. */
json_t *ah__sm_public_row(const json_t *row, const char *status) {
  json_t *r = json_deep_copy(row);
  json_object_del(r, "leaseOwner");
  json_object_del(r, "leaseUntil");
  if (status)
    json_object_set_new(r, "status", json_string(status));
  return r;
}

void ah__sm_emit(ah_sessions *m, const char *name, json_t *data) {
  if (!ah__hosts_hold(m, name, data)) /* a shared store: behind the events committed before it */
    ah__host_emit(m->host, name, data);
}

int ah__sessions_new(const ah_sessions_opts *opts, ah_sessions **out, char **why) {
  if (!opts || !opts->host || !opts->config || !opts->config->state_dir)
    return AH_EINVAL;
  ah_sessions *m = calloc(1, sizeof *m);
  if (!m)
    return AH_ENOMEM;
  m->host = opts->host;
  m->lease_ttl = opts->lease_ttl_ms ? opts->lease_ttl_ms : 30000;
  m->max_depth = opts->max_depth ? opts->max_depth : 3;
  ah__list_init(&m->sessions);
  ah__list_init(&m->requests);
  ah__list_init(&m->turns);
  m->resolved = json_object();
  m->resolved_order = json_array();
  if (gethostname(m->hostname, sizeof m->hostname) != 0)
    snprintf(m->hostname, sizeof m->hostname, "localhost");
  m->hostname[sizeof m->hostname - 1] = '\0';
  char nonce[37];
  ah__uuid7(nonce);
  snprintf(m->owner, sizeof m->owner, "%s:%ld:%s", m->hostname, (long)getpid(), nonce);
  char path[4096];
  ah_store_opts so = {0};
  char *password = NULL;
  int sc = ah__config_store(opts->config, &so, &m->store_backend, path, sizeof path, &password, why);
  if (sc) {
    json_decref(m->resolved);
    json_decref(m->resolved_order);
    free(m);
    return sc;
  }
  const char *failed = NULL;
  int e = ah__mkdirs(opts->config->state_dir, &failed);
  if (e) {
    if (why && asprintf(why, "cannot create %s: %s", failed, strerror(-e)) < 0)
      *why = NULL;
    ah__wipe_free(password);
    json_decref(m->resolved);
    json_decref(m->resolved_order);
    free(m);
    return AH_EIO;
  }
  ah_store_sync sync = opts->sync;
  const char *cs = opts->config->synchronous;
  if (!sync && cs)
    sync = strcmp(cs, "full") == 0  ? AH_STORE_SYNC_FULL
           : strcmp(cs, "off") == 0 ? AH_STORE_SYNC_OFF
                                    : AH_STORE_SYNC_NORMAL;
  m->store_sync = sync ? sync : AH_STORE_SYNC_NORMAL;
  m->store_path = so.path ? strdup(so.path) : NULL;
  m->store_url = so.url ? strdup(so.url) : NULL;
  m->store_password = password;
  so.sync = m->store_sync;
  so.read_only = false;
  int rc = (!m->store_path && !m->store_url) ? AH_ENOMEM
           : opts->lazy_store                ? 0
                              : ah__store_open(ah__host_loop(m->host), m->store_backend, &so, &m->store, why);
  if (rc) {
    free(m->store_path);
    free(m->store_url);
    ah__wipe_free(m->store_password);
    json_decref(m->resolved);
    json_decref(m->resolved_order);
    free(m);
    return rc;
  }
  m->echo = ah__echo_provider_new(ah__host_loop(m->host));
  m->recover_on_start = opts->recover;
  *out = m;
  return 0;
}

/* Called once the core is mounted (services need the core mount). */
void ah__sessions_start(ah_sessions *m, ah_mount *core) {
  m->core = core;
  ah__services_timer_start(core, m->lease_ttl / 3, m->lease_ttl / 3, ah__live_renew_leases, m,
                           &m->lease_timer);
  ah__hosts_start(m);
  ah__live_idle_start(m);
  if (m->recover_on_start)
    recover(m);
}

static void recovered(int status, session *s, void *arg) {
  (void)arg;
  if (status == 0)
    AH_LOG_I(LOG, "session %s resumed after a restart", s->id);
}

static void to_recover_read(int status, const json_t *results, void *arg) {
  ah_sessions *m = arg;
  if (status) {
    AH_LOG_E(LOG, "the sessions to resume after a restart could not be read: %s", ah_strerror(status));
    return;
  }
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(json_array_get(results, 0), i, row) {
    ah__live_lookup(m, str(row, "id"), recovered, NULL);
  }
}

static void recover(ah_sessions *m) {
  ah_store_query q = {.kind = AH_STORE_Q_TO_RECOVER};
  if (ah__sm_store(m))
    ah__store_read(ah__sm_store(m), &q, 1, to_recover_read, m);
}

static void store_closed(void *arg) {
  ah_sessions *m = arg;
  m->store = NULL;
  void (*cb)(void *) = m->stop_cb;
  m->stop_cb = NULL;
  if (cb)
    cb(m->stop_arg);
}

void ah__sm_check_stopped(ah_sessions *m) {
  if (!m->stopping || m->stop_finishing)
    return;
  /* Wait for running turns to end, their tools to stop and their memory to go, then release every lease. */
  if (!ah__list_empty(&m->turns))
    return;
  AH__LIST_EACH(it, &m->sessions) {
    session *s = AH__CONTAINER(it, session, link);
    if (s->turn || !s->ready)
      return;
  }
  bool releasing = false;
  for (ah__link *it = m->sessions.next; it != &m->sessions;) {
    session *s = AH__CONTAINER(it, session, link);
    it = it->next;
    if (s->ready) {
      releasing = true;
      ah__live_release(s);
    }
  }
  if (releasing || !ah__list_empty(&m->sessions))
    return;
  m->stop_finishing = true;
  ah__live_idle_stop(m);
  if (m->lease_timer) {
    ah__services_timer_stop(m->lease_timer);
    m->lease_timer = NULL;
  }
  if (m->retry_timer) { /* what is left is recovered at the next start (an interrupted turn) */
    ah__services_timer_stop(m->retry_timer);
    m->retry_timer = NULL;
  }
  if (m->stop_deadline) {
    ah__services_timer_stop(m->stop_deadline);
    m->stop_deadline = NULL;
  }
  if (!m->store) {
    store_closed(m); /* never opened (lazy) */
    return;
  }
  ah__hosts_stop(m); /* what was committed is published before the store closes */
  /* Every lease was released: the heartbeat goes too (committed before the store closes). */
  ah__store_write(m->store, json_pack("[{s:s, s:s}]", "op", "lease.end", "owner", m->owner), NULL, NULL);
  ah__store_close(m->store, store_closed, m);
}

static void stop_deadline(ah_timer *t, void *arg) {
  (void)t;
  ah_sessions *m = arg;
  m->stop_deadline = NULL;
  /* A provider that never ends its cancelled turn: record the end ourselves. */
  AH__LIST_EACH(it, &m->sessions) {
    session *s = AH__CONTAINER(it, session, link);
    if (s->turn) {
      AH_LOG_W(LOG, "session %s: the turn did not end after cancellation; recording it as cancelled", s->id);
      ah__turn_end(s->turn, "cancelled", NULL, "the host stopped");
    }
  }
  ah__sm_check_stopped(m);
}

void ah__sessions_stop(ah_sessions *m, void (*cb)(void *arg), void *arg) {
  m->stopping = true;
  m->stop_cb = cb;
  m->stop_arg = arg;
  AH__LIST_EACH(it, &m->sessions) {
    session *s = AH__CONTAINER(it, session, link);
    ah__live_wake(s, AH_ESTATE);
    if (s->turn)
      ah__cancel_trip(s->turn->cancel);
  }
  ah__services_timer_start(m->core, 2000, 0, stop_deadline, m, &m->stop_deadline);
  ah__sm_check_stopped(m);
}

void ah__sessions_free(ah_sessions *m) {
  if (!m)
    return;
  while (!ah__list_empty(&m->requests))
    ah__request_free(AH__CONTAINER(m->requests.next, request, link));
  json_decref(m->resolved);
  json_decref(m->resolved_order);
  json_decref(m->retry);
  ah__echo_provider_free(m->echo);
  ah__prices_free(m->prices);
  free(m->prices_path);
  ah__hosts_free(m);
  free(m->store_url);
  ah__wipe_free(m->store_password);
  free(m->store_path);
  free(m);
}

ah_store *ah__sessions_store(ah_sessions *m) {
  return ah__sm_store(m);
}
size_t ah__sessions_live(ah_sessions *m) {
  return m->nlive;
}
size_t ah__sessions_loads(ah_sessions *m) {
  return m->loads;
}
size_t ah__sessions_unloads(ah_sessions *m) {
  return m->unloads;
}
int ah__sessions_store_state(ah_sessions *m) {
  if (!m->store && !m->store_failed)
    return -1;
  return ah__store_health(m->store, NULL, 0);
}

json_t *ah__sessions_store_health(ah_sessions *m) {
  if (!m->store && !m->store_failed)
    return NULL; /* a stdio child's store is opened at its first session call, not to describe it */
  char detail[300] = "";
  int h = ah__store_health(m->store, detail, sizeof detail);
  return json_pack("{s:s, s:s?}", "health", ah__store_health_name(h), "detail",
                   h != AH_STORE_OK ? detail : NULL);
}

const char *ah__sessions_owner(ah_sessions *m) {
  return m->owner;
}

/* ---- sessions for the remote gateway (sessions.h) --------------------------------------------------------
 */

void ah__sessions_lookup(ah_sessions *m, const char *id, ah__session_fn cb, void *arg) {
  if (!m || !id) {
    cb(m ? AH_ENOENT : AH_EUNAVAILABLE, NULL, arg);
    return;
  }
  ah__live_lookup(m, id, cb, arg);
}

void ah__session_hold(ah_session *s) {
  s->holds++;
}

void ah__session_release(ah_session *s) {
  s->holds--;
  ah__live_free_if_unused(s);
}

const char *ah__session_id(const ah_session *s) {
  return s ? s->id : NULL;
}

json_t *ah__session_info(ah_session *s) {
  if (!s)
    return NULL;
  json_t *r = ah__sm_public_row(s->row, status_of(s));
  json_t *pending = json_array();
  const request *q = s->turn ? s->turn->pending : NULL; /* a turn waits on one request at a time */
  if (q)
    json_array_append_new(pending,
                          json_pack("{s:s, s:s, s:s?}", "id", q->id, "kind", q->kind, "tool", q->tool));
  json_object_set_new(r, "pending", pending);
  json_object_set_new(r, "options", ah__session_options(s));
  return r;
}

#define AH_TITLE_MAX 200
#define AH_TAGS_MAX 32
#define AH_TAG_MAX 64

int ah__session_update(ah_session *s, const json_t *fields) {
  if (!s || !json_is_object(fields) || json_object_size(fields) == 0)
    return AH_EINVAL;
  if (s->closing || s->disposed)
    return AH_ECLOSED;
  const char *k = NULL;
  json_t *v = NULL;
  json_object_foreach((json_t *)fields, k, v) {
    if (strcmp(k, "title") == 0) {
      if (!json_is_string(v) || json_string_length(v) > AH_TITLE_MAX)
        return AH_EINVAL;
    } else if (strcmp(k, "tags") == 0) {
      if (!json_is_array(v) || json_array_size(v) > AH_TAGS_MAX)
        return AH_EINVAL;
      size_t i = 0;
      json_t *t = NULL;
      json_array_foreach(v, i, t) {
        if (!json_is_string(t) || json_string_length(t) == 0 || json_string_length(t) > AH_TAG_MAX)
          return AH_EINVAL;
      }
    } else if (strcmp(k, "policy") == 0) {
      const char *tool = NULL;
      json_t *pv = NULL;
      if (!json_is_object(v))
        return AH_EINVAL;
      json_object_foreach(v, tool, pv) {
        const char *val = json_string_value(pv);
        if (!ah__tool_exists(s->m->host, tool) || !val ||
            (strcmp(val, "allow") != 0 && strcmp(val, "ask") != 0 && strcmp(val, "deny") != 0))
          return AH_EINVAL;
      }
    } else if (strcmp(k, "options") == 0) {
      /* {ID: value}: the session's options (options.c), each checked before any is set. */
      const char *id = NULL;
      json_t *ov = NULL;
      char why[200];
      if (!json_is_object(v) || json_object_size(fields) != 1)
        return AH_EINVAL;
      json_object_foreach(v, id, ov) {
        if (ah__session_set_option(s, id, ov, true, why, sizeof why))
          return AH_EINVAL;
      }
    } else {
      return AH_EINVAL;
    }
  }
  json_t *opts = json_object_get(fields, "options");
  if (opts) {
    const char *id = NULL;
    json_t *ov = NULL;
    char why[200];
    json_object_foreach(opts, id, ov) {
      ah__session_set_option(s, id, ov, false, why, sizeof why);
    }
    return 0;
  }
  json_t *set = json_deep_copy(fields);
  json_t *pol = json_object_get(set, "policy");
  if (pol) {
    /* A policy is merged into the session's, tool by tool (as session.set-policy does). */
    json_t *merged = json_deep_copy(json_object_get(s->row, "policy"));
    if (!json_is_object(merged)) {
      json_decref(merged);
      merged = json_object();
    }
    json_object_update(merged, pol);
    json_object_set_new(set, "policy", merged);
  }
  char now[32];
  ah__time_rfc3339(now);
  if (!set || json_object_set_new(set, "updated", json_string(now)) != 0) {
    json_decref(set);
    return AH_ENOMEM;
  }
  json_t *changed = json_pack("{s:s, s:O}", "sessionId", s->id, "updated", json_object_get(set, "updated"));
  ah__write_fields(s, set);
  ah__session_changed(s, changed);
  return 0;
}

void ah__session_changed(session *s, json_t *changed) {
  /* What a client shows of the session (its title, its tags), as the live row has it now. */
  static const char *const shown[] = {"title", "tags"};
  for (size_t i = 0; changed && i < sizeof shown / sizeof shown[0]; i++)
    if (json_object_get(s->row, shown[i]))
      json_object_set(changed, shown[i], json_object_get(s->row, shown[i]));
  ah__sm_emit(s->m, "session.updated", changed);
}
