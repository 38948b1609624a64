/* Live sessions: a session loaded from the store (a cold resume, coalesced: callers of a session being
 * loaded wait for the one load), its lease (taken at load, renewed, fenced, lost), its prompt queue, its
 * creation, close and release, and what happens when it can no longer run here (lease lost, write failed).
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../hooks.h"
#include "session.h"

static void stop_here(session *s, int status);
static void follows_end(session *s);

/* The loop's monotonic clock (ms): idle times never jump with the wall clock. */
static uint64_t mono_ms(const ah_sessions *m) {
  return uv_now(ah__host_loop(m->host));
}
static void retry_tick(ah_timer *t, void *arg);
static void recover_after_load(session *s, const json_t *open, const json_t *reqs);

session *ah__live_find(ah_sessions *m, const char *id) {
  session *s = NULL;
  if (id)
    HASH_FIND_STR(m->by_id, id, s);
  return s;
}

/* Forget the prompts queued in memory (their inbox rows stay in the store). */
static void drop_queue(session *s) {
  while (!ah__list_empty(&s->queue)) {
    queued *q = AH__CONTAINER(s->queue.next, queued, link);
    ah__list_remove(&q->link);
    free(q->message_id);
    json_decref(q->content);
    free(q);
  }
}

static void session_free(session *s) {
  drop_queue(s);
  json_decref(s->row);
  free(s->parent_message);
  free(s->id);
  free(s->editor.read);
  free(s->editor.write);
  free(s->editor.run);
  free(s);
}

/* A disposed session's memory goes after its last write and hold, and after its turn ended. */
void ah__live_free_if_unused(session *s) {
  if (!s->disposed || s->pending_writes > 0 || s->holds > 0 || s->turn)
    return;
  ah_sessions *m = s->m;
  session_free(s);
  ah__sm_check_stopped(m);
}

/* ---- leases ------------------------------------------------------------------------------------------ */

/* A lease held by a process of this machine that no longer exists can be taken at once: owners are
 * "host:pid:nonce". */
static bool owner_dead_here(ah_sessions *m, const char *owner) {
  if (!owner)
    return false;
  char host[64] = "";
  long pid = 0;
  const char *c1 = strchr(owner, ':');
  if (!c1 || (size_t)(c1 - owner) >= sizeof host)
    return false;
  memcpy(host, owner, (size_t)(c1 - owner));
  host[c1 - owner] = '\0';
  pid = strtol(c1 + 1, NULL, 10);
  if (strcmp(host, m->hostname) != 0 || pid <= 0 || pid == (long)getpid())
    return false;
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

static json_t *lease_op(ah_sessions *m, const char *id, const json_t *row) {
  uint64_t now = ah__time_ms();
  json_t *op = json_pack("{s:s, s:s, s:s, s:I, s:I}", "op", "lease", "id", id, "owner", m->owner, "until",
                         (json_int_t)(now + m->lease_ttl), "now", (json_int_t)now);
  const char *holder = row ? str(row, "leaseOwner") : NULL;
  if (holder && strcmp(holder, m->owner) != 0 && owner_dead_here(m, holder))
    json_object_set_new(op, "steal", json_string(holder));
  return op;
}

/* The heartbeat ran out before it was renewed (the process was stopped past the TTL): another process may
 * have taken some of its sessions. Each live one is checked; one held by another owner is lost here. */
static void leases_read(int status, const json_t *results, void *arg) {
  ah_sessions *m = arg;
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(status == 0 ? results : NULL, i, row) {
    session *s = ah__live_find(m, str(row, "id"));
    const char *holder = str(row, "leaseOwner");
    if (s && s->ready && !s->disposed && !s->lost && (!holder || strcmp(holder, m->owner) != 0))
      ah__live_lease_lost(s, "its lease ran out while this process was not running", holder);
  }
}

static void check_leases(ah_sessions *m) {
  ah_store_query *q = calloc(m->nlive + 1, sizeof *q);
  size_t n = 0;
  AH__LIST_EACH(it, &m->sessions) {
    session *s = AH__CONTAINER(it, session, link);
    if (q && s->ready && !s->disposed && !s->lost && n < m->nlive)
      q[n++] = (ah_store_query){.kind = AH_STORE_Q_SESSION, .id = s->id};
  }
  if (n)
    ah__store_read(m->store, q, n, leases_read, m);
  free(q);
}

static void renewed(int status, const json_t *results, void *arg) {
  ah_sessions *m = arg;
  m->renewing = false;
  if (status) {
    AH_LOG_W(LOG, "the lease heartbeat could not be written (%s); retried at the next renewal",
             ah_strerror(status));
    return;
  }
  if (json_is_true(json_object_get(json_array_get(results, 0), "lapsed")) && m->nlive > 0 && !m->stopping)
    check_leases(m);
}

/* One heartbeat for every session this process runs (the owners row): the cost of a renewal does not grow
 * with the number of live sessions. */
void ah__live_renew_leases(ah_timer *t, void *arg) {
  (void)t;
  ah_sessions *m = arg;
  ah__hosts_sweep(m); /* a shared store: prompts posted for sessions no host runs */
  if (!m->store || m->renewing)
    return; /* never opened: nothing is leased; or the last renewal is still being written */
  uint64_t now = ah__time_ms();
  json_t *ops = json_pack("[{s:s, s:s, s:I, s:I}]", "op", "lease.renew", "owner", m->owner, "until",
                          (json_int_t)(now + m->lease_ttl), "now", (json_int_t)now);
  m->renewing = ah__store_write(m->store, ops, renewed, m) == 0;
}

/* ---- live sessions: load (cold resume) with coalescing ------------------------------------------------- */

static session *session_new(ah_sessions *m, const char *id, json_t *row) {
  session *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->m = m;
  s->id = strdup(id);
  s->row = row;
  if (!s->id) {
    free(s);
    return NULL;
  }
  s->seq = row ? json_integer_value(json_object_get(row, "lastSeq")) : 0;
  s->active_ms = mono_ms(m);
  ah__list_init(&s->queue);
  ah__list_init(&s->waiters);
  ah__list_init(&s->close_waiters);
  ah__list_init(&s->follows);
  ah__list_push(&m->sessions, &s->link);
  HASH_ADD_KEYPTR(hh, m->by_id, s->id, strlen(s->id), s);
  m->nlive++;
  return s;
}

void ah__live_wake(session *s, int status) {
  while (!ah__list_empty(&s->waiters)) {
    waiter *w = AH__CONTAINER(s->waiters.next, waiter, link);
    ah__list_remove(&w->link);
    /* A waiter woken after an earlier one closed the session (a cold close and calls that came with it)
     * finds it closed, as a call after the close would: its writes would be refused by the fence. */
    int st = status == 0 && (s->closing || !s->ready) ? AH_ECLOSED : status;
    w->cb(st, st == 0 ? s : NULL, w->arg);
    free(w);
  }
}

/* ---- follows (session.follow) -------------------------------------------------------------------------- */

typedef struct follow {
  session *s;
  ah_call *call;
  ah_cancel_watch *watch;
  ah__link link;
} follow;

static void follow_end(follow *f, int status, const char *why) {
  ah__list_remove(&f->link);
  f->s->active_ms = mono_ms(f->s->m); /* the idle time counts from the end of the last follow */
  if (f->watch)
    ah__cancel_unwatch(f->watch);
  if (status)
    ah__call_error(f->call, status, why, NULL);
  else
    ah__call_reply(f->call, json_pack("{s:s, s:b}", "sessionId", f->s->id, "closed", 1));
  free(f);
}

static void follow_tripped(ah_cancel *t, void *arg) {
  (void)t;
  follow *f = arg;
  f->watch = NULL; /* a fired watch is gone; the host answered the caller `cancelled` */
  follow_end(f, AH_ECANCELED, "cancelled");
}

/* The session leaves memory (closed, lost, broken, the host stops): its follows end, answered. */
static void follows_end(session *s) {
  while (!ah__list_empty(&s->follows)) {
    follow *f = AH__CONTAINER(s->follows.next, follow, link);
    if (s->closing)
      follow_end(f, 0, NULL);
    else
      follow_end(f, s->m->stopping ? AH_ESTATE : AH_ECLOSED,
                 s->m->stopping ? "the host is stopping" : "the session no longer runs here");
  }
}

int ah__live_follow(session *s, ah_call *call) {
  ah_cancel *token = ah__call_cancel_token(call);
  follow *f = calloc(1, sizeof *f);
  if (!f || !token)
    return (free(f), AH_ENOMEM);
  f->s = s;
  f->call = call;
  ah__list_init(&f->link);
  ah__list_push(&s->follows, &f->link);
  int rc = ah__cancel_watch(token, follow_tripped, f, &f->watch);
  if (rc == AH_ECANCELED) { /* already tripped: the follow ends at once */
    f->watch = NULL;
    follow_end(f, AH_ECANCELED, "cancelled");
    return 0;
  }
  if (rc) {
    ah__list_remove(&f->link);
    free(f);
    return rc;
  }
  return 0;
}

/* Drop a live session from the manager (after its lease is released or was never taken). */
static void session_dispose(session *s) {
  if (s->disposed)
    return;
  ah__live_wake(s, AH_ECLOSED); /* nobody waits on a session that is going away */
  s->disposed = true;
  follows_end(s);
  ah__list_remove(&s->link);
  HASH_DEL(s->m->by_id, s);
  s->m->nlive--;
  ah__live_free_if_unused(s);
}

/* Another process holds the session's lease now (this one was stopped past the lease's TTL and the session
 * was taken over): it stops here at once — its turn is cancelled (nothing of it is written: every write is
 * fenced), prompts waiting in memory are dropped (they are in the store's inbox for the owner), and the
 * next call for the session loads it afresh, which is refused while the other process holds it. */
typedef struct lost_ctx {
  char id[40];
  char why[200];
} lost_ctx;

static void log_lost(const char *id, const char *why, const char *holder) {
  AH_LOG_W(LOG, "session %s: this process lost its lease (%s; held by %s now): it no longer runs here", id,
           why, holder ? holder : "no process");
}

static void holder_read(int status, const json_t *results, void *arg) {
  lost_ctx *c = arg;
  const json_t *row = status == 0 ? json_array_get(results, 0) : NULL;
  log_lost(c->id, c->why,
           status ? "an unknown process (the store could not be read)" : str(row, "leaseOwner"));
  free(c);
}

void ah__live_lease_lost(session *s, const char *why, const char *holder) {
  if (s->lost || s->broken)
    return;
  s->lost = true;
  lost_ctx *c = holder ? NULL : calloc(1, sizeof *c);
  if (c) { /* who holds it now is read for the log */
    snprintf(c->id, sizeof c->id, "%s", s->id);
    snprintf(c->why, sizeof c->why, "%s", why);
    ah_store_query q = {.kind = AH_STORE_Q_SESSION, .id = c->id};
    if (ah__store_read(ah__sm_store(s->m), &q, 1, holder_read, c) != 0) {
      free(c);
      c = NULL;
    }
  }
  if (!c)
    log_lost(s->id, why, holder);
  stop_here(s, AH_EAGENTBUSY);
}

/* A write of a live session failed (disk full, I/O error): what it did since can no longer be recorded in
 * order, so it stops here — its turn is cancelled, nothing more of it is written — and it is reloaded from
 * the store once writes succeed again: the load records the interrupted turn (turn/ended "error", its
 * prompt done) and runs the prompts still queued. Meanwhile prompts for it are refused (not acknowledged). */
/* Reload session `id` every second until it loads (or cannot any more: retry_loaded). */
static void retry_later(ah_sessions *m, const char *id) {
  if (!m->retry)
    m->retry = json_object();
  json_object_set_new(m->retry, id, json_true());
  if (!m->retry_timer && !m->stopping)
    ah__services_timer_start(m->core, 1000, 1000, retry_tick, m, &m->retry_timer);
}

void ah__live_broken(session *s, int status) {
  if (s->lost || s->broken)
    return;
  s->broken = true;
  ah_sessions *m = s->m;
  char detail[300] = "";
  ah__store_health(ah__sm_store(m), detail, sizeof detail);
  AH_LOG_E(LOG,
           "session %s: a write failed (%s%s%s): its turn is cancelled and the session is reloaded once the "
           "store takes writes again",
           s->id, ah_strerror(status), detail[0] ? ": " : "", detail);
  retry_later(m, s->id);
  stop_here(s, AH_EIO);
}

/* The session runs here no more: prompts waiting in memory are dropped (they are in the store's inbox),
 * its turn is cancelled, and it leaves the live sessions (its memory goes once nothing uses it). */
static void stop_here(session *s, int status) {
  drop_queue(s);
  if (s->turn && s->turn->cancel)
    ah__cancel_trip(s->turn->cancel);
  if (!s->disposed) {
    ah__live_wake(s, status);
    session_dispose(s);
  }
}

typedef struct retry_ctx {
  ah_sessions *m;
  char id[40];
} retry_ctx;

static void retry_loaded(int status, session *s, void *arg) {
  (void)s;
  retry_ctx *r = arg;
  /* A load that succeeded took the id out of m->retry (recover_after_load). One that cannot succeed any
   * more stops the retries: the session was closed or deleted, or another process holds it now. */
  if (status == AH_ENOENT || status == AH_ECLOSED || status == AH_EAGENTBUSY) {
    AH_LOG_I(LOG, "session %s: no longer reloaded here (%s)", r->id, ah_strerror(status));
    json_object_del(r->m->retry, r->id);
  }
  free(r);
}

/* Reload the sessions whose writes failed: a load is one write (the lease), so it succeeds once the store
 * takes writes again. */
static void retry_tick(ah_timer *t, void *arg) {
  (void)t;
  ah_sessions *m = arg;
  if (json_object_size(m->retry) == 0 || m->stopping) {
    if (m->retry_timer)
      ah__services_timer_stop(m->retry_timer);
    m->retry_timer = NULL;
    return;
  }
  const char *id = NULL;
  json_t *v = NULL;
  void *tmp = NULL;
  json_object_foreach_safe(m->retry, tmp, id, v) {
    if (ah__live_find(m, id))
      continue; /* a load is in progress */
    retry_ctx *r = calloc(1, sizeof *r);
    if (!r)
      continue;
    r->m = m;
    snprintf(r->id, sizeof r->id, "%s", id);
    ah__live_lookup(m, r->id, retry_loaded, r);
  }
}

/* `open`: the session's open inbox rows, `reqs`: its pending requests (read after its lease was taken). */
static void recover_after_load(session *s, const json_t *open, const json_t *reqs) {
  ah_sessions *m = s->m;
  bool retried = json_object_get(m->retry, s->id) != NULL;
  const char *why = retried ? "interrupted: the store could not record this turn (disk full or I/O error)"
                            : "interrupted: the host stopped during this turn";
  if (retried) {
    json_object_del(m->retry, s->id);
    AH_LOG_I(LOG, "session %s: reloaded after a failed write; its interrupted turn is recorded", s->id);
  }
  /* Prompts acknowledged before a restart: a claimed one was interrupted (its turn is recorded as ended
   * with an error, attributed to its own message), queued ones are run in order. */
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(open, i, row) {
    const char *mid = str(row, "messageId");
    if (strcmp(str(row, "state"), "posted") == 0) {
      json_t *one = json_pack("[O]", row);
      ah__hosts_adopt(s, one); /* posted by another host: taken in here, in order */
      json_decref(one);
    } else if (strcmp(str(row, "state"), "claimed") == 0) {
      const char *tid = str(row, "turnId");
      json_t *ops = json_pack("[{s:s, s:s, s:s}]", "op", "inbox.state", "messageId", mid, "state", "done");
      ah__write_ops(s, ops, "turn/ended", tid, mid,
                    json_pack("{s:s, s:{s:i, s:i}, s:s}", "reason", "error", "usage", "inputTokens", 0,
                              "outputTokens", 0, "error", why),
                    NULL, NULL);
    } else {
      queued *q = calloc(1, sizeof *q);
      if (!q)
        continue;
      q->message_id = strdup(mid);
      q->content = json_incref(json_object_get(row, "content"));
      ah__list_push(&s->queue, &q->link);
    }
  }
  json_array_foreach(reqs, i, row) {
    ah__write_ops(s, ah__request_state_ops(m, str(row, "id"), s->id, "cancelled", NULL), NULL, NULL, NULL,
                  NULL, NULL, NULL);
    ah__sm_emit(m, "request.resolved",
                json_pack("{s:s, s:s, s:s}", "id", str(row, "id"), "sessionId", s->id, "state", "cancelled"));
  }
  if (strcmp(str(s->row, "status") ? str(s->row, "status") : "idle", "idle") != 0) {
    char t[32];
    ah__time_rfc3339(t);
    ah__write_fields(s, json_pack("{s:s, s:s}", "status", "idle", "updated", t));
  }
}

static void load_read(int status, const json_t *results, void *arg) {
  session *s = arg;
  s->pending_writes--;
  if (status || s->m->stopping || s->disposed) {
    /* Its lease is held here: it is loaded again once the store answers (as after a failed write), so
     * that no prompt waits for a host that does not run it. */
    if (status && !s->m->stopping) {
      AH_LOG_W(LOG, "session %s: its inbox could not be read (%s): it is loaded again in a second", s->id,
               ah_strerror(status));
      retry_later(s->m, s->id);
    }
    ah__live_wake(s, status ? status : AH_ESTATE);
    session_dispose(s);
    return;
  }
  recover_after_load(s, json_array_get(results, 0), json_array_get(results, 1));
  s->ready = true;
  s->m->loads++;
  ah__live_wake(s, 0);
  ah__turn_claim(s);
}

static void load_written(int status, const json_t *results, void *arg) {
  session *s = arg;
  s->pending_writes--;
  bool got = status == 0 && json_is_true(json_array_get(results, 0));
  if (!got || s->m->stopping) {
    int rc = status ? status : s->m->stopping ? AH_ESTATE : AH_EAGENTBUSY;
    if (!got && status == 0)
      AH_LOG_I(LOG, "session %s is owned by another process (%s)", s->id,
               str(s->row, "leaseOwner") ? str(s->row, "leaseOwner") : "?");
    ah__live_wake(s, rc);
    session_dispose(s);
    return;
  }
  json_object_set_new(s->row, "leaseOwner", json_string(s->m->owner));
  s->fenced = true;
  /* What it left: its open inbox rows and pending requests, read now that it holds the lease. */
  s->pending_writes++;
  ah_store_query q[2] = {{.kind = AH_STORE_Q_INBOX_OPEN, .id = s->id},
                         {.kind = AH_STORE_Q_REQUESTS_PENDING, .id = s->id}};
  int rc = ah__store_read(ah__sm_store(s->m), q, 2, load_read, s);
  if (rc)
    load_read(rc, NULL, s);
}

/* A session's working directory exists on one machine (docs/scaling.md): a host that lacks it does not take
 * the session (its tools would run in the wrong place). A close is allowed anyway (it runs nothing). */
static bool cwd_here(ah_sessions *m, const json_t *row) {
  const char *cwd = str(row, "cwd");
  struct stat st;
  if (!cwd || !*cwd || (stat(cwd, &st) == 0 && S_ISDIR(st.st_mode)))
    return true;
  AH_LOG_W(LOG,
           "session %s works in %s, which does not exist on this host (%s): it is not taken here (the "
           "workspace must be on the host that runs the session)",
           str(row, "id"), cwd, m->hostname);
  return false;
}

static void lookup(ah_sessions *m, const char *id, bool to_close, lookup_fn cb, void *arg);

/* The row of a session being loaded was read: then its lease is taken. */
static void row_read(int status, const json_t *results, void *arg) {
  session *s = arg;
  ah_sessions *m = s->m;
  s->pending_writes--;
  const json_t *row = status == 0 ? json_array_get(results, 0) : NULL;
  int rc = status                                         ? status
           : m->stopping || s->disposed                   ? AH_ESTATE
           : !json_is_object(row)                         ? AH_ENOENT
           : json_is_true(json_object_get(row, "closed")) ? AH_ECLOSED
           : !s->to_close && !cwd_here(m, row)            ? AH_EUNAVAILABLE
                                                          : 0;
  if (rc) {
    ah__live_wake(s, rc);
    session_dispose(s);
    return;
  }
  s->row = json_deep_copy(row);
  s->seq = json_integer_value(json_object_get(row, "lastSeq"));
  s->pending_writes++;
  rc = s->row ? ah__store_write(m->store, json_pack("[o]", lease_op(m, s->id, s->row)), load_written, s)
              : AH_ENOMEM;
  if (rc)
    load_written(rc, NULL, s);
}

void ah__live_lookup(ah_sessions *m, const char *id, lookup_fn cb, void *arg) {
  lookup(m, id, false, cb, arg);
}

void ah__live_lookup_to_close(ah_sessions *m, const char *id, lookup_fn cb, void *arg) {
  lookup(m, id, true, cb, arg);
}

static void lookup(ah_sessions *m, const char *id, bool to_close, lookup_fn cb, void *arg) {
  if (m->stopping) {
    cb(AH_ESTATE, NULL, arg);
    return;
  }
  session *s = ah__live_find(m, id);
  if (s && (s->ready || s->closing)) {
    s->active_ms = mono_ms(m);
    cb(s->closing ? AH_ECLOSED : 0, s->closing ? NULL : s, arg);
    return;
  }
  waiter *w = calloc(1, sizeof *w);
  if (!w) {
    cb(AH_ENOMEM, NULL, arg);
    return;
  }
  w->cb = cb;
  w->arg = arg;
  if (s) { /* a load (or an idle unload, after which it is loaded again) is in progress: coalesce */
    ah__list_push(&s->waiters, &w->link);
    return;
  }
  /* A new load: the session (not ready, without its row yet) takes the callers that come meanwhile. */
  s = session_new(m, id, NULL);
  if (!s) {
    free(w);
    cb(AH_ENOMEM, NULL, arg);
    return;
  }
  ah__list_push(&s->waiters, &w->link);
  s->to_close = to_close;
  s->pending_writes++;
  ah_store_query q = {.kind = AH_STORE_Q_SESSION, .id = s->id};
  int rc = ah__store_read(ah__sm_store(m), &q, 1, row_read, s);
  if (rc)
    row_read(rc, NULL, s);
}

/* ---- sessions: create ------------------------------------------------------------------------------------
 */

static void created_written(int status, const json_t *results, void *arg) {
  session *s = arg;
  s->pending_writes--;
  bool got = status == 0 && json_is_true(json_array_get(results, 1));
  if (!got) {
    ah__live_wake(s, status ? status : AH_EAGENTBUSY);
    session_dispose(s);
    return;
  }
  s->ready = true;
  s->fenced = true;
  ah__sm_emit(s->m, "session.created", json_pack("{s:o}", "session", ah__sm_public_row(s->row, "idle")));
  ah__live_wake(s, 0);
  if (ah__hooks_any(s->m->host, "session_start", NULL)) {
    json_t *doc = ah__hook_doc(s, NULL);
    json_object_set_new(doc, "session",
                        json_pack("{s:s?, s:s?, s:O?}", "title", str(s->row, "title"), "parent",
                                  str(s->row, "parent"), "depth", json_object_get(s->row, "depth")));
    if (ah__session_hooks(s, "session_start", doc, NULL, NULL) < 0)
      AH_LOG_W(LOG, "session %s: the session_start hooks could not run: out of memory", s->id);
  }
}

/* Create a session row and its live agent (lease taken in the same commit). `cb` runs after the commit. */
int ah__live_create(ah_sessions *m, const char *cwd, const char *provider, const char *model,
                    const char *title, const char *parent, bool local, int depth, lookup_fn cb, void *arg) {
  char id[37];
  char now[32];
  ah__uuid7(id);
  ah__time_rfc3339(now);
  json_t *row = json_pack("{s:s, s:s, s:s, s:s, s:s?, s:s?, s:b, s:i, s:s, s:b, s:s, s:s, s:{}, s:[], s:i}",
                          "id", id, "cwd", cwd, "title", title ? title : "", "provider", provider, "model",
                          model, "parent", parent, "local", local, "depth", depth, "status", "idle", "closed",
                          0, "created", now, "updated", now, "policy", "tags", "lastSeq", 0);
  if (!row)
    return AH_ENOMEM;
  session *s = session_new(m, id, row);
  if (!s) {
    json_decref(row);
    return AH_ENOMEM;
  }
  waiter *w = calloc(1, sizeof *w);
  if (w) {
    w->cb = cb;
    w->arg = arg;
    ah__list_push(&s->waiters, &w->link);
  }
  json_t *put = json_pack("{s:s, s:O}", "op", "session.put", "session", row);
  json_t *ops = json_pack("[o, o]", put, lease_op(m, id, NULL));
  s->pending_writes++;
  int rc = ah__store_write(ah__sm_store(m), ops, created_written, s);
  if (rc)
    created_written(rc, NULL, s);
  return 0;
}

/* ---- prompts ----------------------------------------------------------------------------------------------
 */

/* A title from the first prompt of a session that has none: its first line of text, blanks collapsed, at
 * most TITLE_AUTO bytes (cut at a character, with "…"). NULL when the prompt has no text. */
#define TITLE_AUTO 80
static char *title_from(const json_t *content) {
  const char *text = NULL;
  size_t i;
  json_t *b;
  json_array_foreach(content, i, b) {
    if (!text && str(b, "type") && strcmp(str(b, "type"), "text") == 0)
      text = str(b, "text");
  }
  if (!text)
    return NULL;
  char *out = malloc(TITLE_AUTO + 4);
  if (!out)
    return NULL;
  size_t n = 0;
  bool blank = false;
  const char *p = text;
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
    p++;
  while (*p && *p != '\n' && *p != '\r') {
    if (*p == ' ' || *p == '\t') {
      blank = true;
      p++;
      continue;
    }
    unsigned char c = (unsigned char)*p; /* the text is valid UTF-8: whole characters are copied */
    size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    size_t sep = blank && n > 0 ? 1 : 0;
    if (n + sep + len > TITLE_AUTO) {
      memcpy(out + n, "\xE2\x80\xA6", 3); /* … */
      n += 3;
      break;
    }
    if (sep)
      out[n++] = ' ';
    blank = false;
    memcpy(out + n, p, len);
    n += len;
    p += len;
  }
  out[n] = '\0';
  if (n == 0) {
    free(out);
    return NULL;
  }
  return out;
}

/* Queue `content` under `mid` (in memory now, in submission order) with `ops` and its inbox/received. */
static void enqueue(session *s, const char *mid, json_t *content, json_t *ops, bool claim, written_fn cb,
                    void *arg) {
  const char *title = str(s->row, "title");
  if (s->seq == 0 && (!title || !*title)) { /* the first prompt names a session that has no name */
    char *t = title_from(content);
    if (t) {
      char now[32];
      ah__time_rfc3339(now);
      ah__write_fields(s, json_pack("{s:s, s:s}", "title", t, "updated", now));
      ah__session_changed(s, json_pack("{s:s, s:s}", "sessionId", s->id, "updated", now));
    }
    free(t);
  }
  queued *q = calloc(1, sizeof *q);
  if (q) {
    q->message_id = strdup(mid);
    q->content = json_incref(content);
    ah__list_push(&s->queue, &q->link);
  }
  ah__write_ops(s, ops, "inbox/received", NULL, mid, json_pack("{s:o}", "content", content), cb, arg);
  /* An idle agent claims it at once, its writes in the same group commit as the inbox row: the provider
   * starts while the receipt is being stored (the receipt itself is sent only once it is durable, from the
   * write callback), and its first delta does not wait for a commit. Nothing of the turn with an effect
   * outside can overtake the receipt: a tool runs only once its tool/call event, written after the inbox
   * row, is stored, and the turn's events commit in seq order after it. A prompt_submit hook (a command
   * the user configured) runs only for a stored prompt, so with one the claim waits for the receipt. */
  if (claim && !ah__hooks_any(s->m->host, "prompt_submit", NULL))
    ah__turn_claim(s);
}

void ah__live_enqueue(session *s, json_t *content, written_fn cb, void *arg, char out_id[37]) {
  char mid[37];
  ah__uuid7(mid);
  if (out_id)
    memcpy(out_id, mid, 37);
  char now[32];
  ah__time_rfc3339(now);
  json_t *ops = json_pack("[{s:s, s:s, s:s, s:O, s:s}]", "op", "inbox.put", "messageId", mid, "sessionId",
                          s->id, "content", content, "time", now);
  enqueue(s, mid, content, ops, true, cb, arg);
}

void ah__live_enqueue_as(session *s, const char *mid, json_t *content, json_t *ops, bool claim, written_fn cb,
                         void *arg) {
  enqueue(s, mid, content, ops, claim, cb, arg);
}

/* ---- close
 * --------------------------------------------------------------------------------------------------- */

static void close_written(session *s, int status, const json_t *event, void *arg) {
  (void)event;
  (void)arg;
  while (!ah__list_empty(&s->close_waiters)) {
    ah__link *l = s->close_waiters.next;
    ah__list_remove(l);
    ah_call *call = *(ah_call **)((char *)l + sizeof(ah__link));
    free(l);
    if (status)
      ah__call_error(call, status, "the session could not be closed", NULL);
    else
      ah__call_reply(call, json_object());
  }
  if (status) {
    /* Not closed in the store: the session stays live (its queued prompts were already cancelled). */
    AH_LOG_E(LOG, "session %s could not be closed: %s", s->id, ah_strerror(status));
    s->closing = false;
    s->ready = true;
    return;
  }
  ah__sm_emit(s->m, "session.closed", json_pack("{s:s}", "sessionId", s->id));
  session_dispose(s);
}

/* After the session_close hooks: the close goes on, unless the host released the session meanwhile. */
static void close_hooked(session *s, void *arg) {
  (void)arg;
  if (!s->disposed) {
    ah__live_finish_close(s);
    return;
  }
  while (!ah__list_empty(&s->close_waiters)) {
    ah__link *l = s->close_waiters.next;
    ah__list_remove(l);
    ah__call_error(*(ah_call **)((char *)l + sizeof(ah__link)), AH_ESTATE,
                   "the host stopped before the session was closed", NULL);
    free(l);
  }
}

void ah__live_finish_close(session *s) {
  if (!s->close_hooked && !s->m->stopping && !s->lost && !s->broken &&
      ah__hooks_any(s->m->host, "session_close", NULL)) {
    s->close_hooked = true; /* the hooks see it once; the close goes on after them */
    json_t *doc = ah__hook_doc(s, NULL);
    json_object_set_new(doc, "session", json_pack("{s:s?}", "title", str(s->row, "title")));
    if (ah__session_hooks(s, "session_close", doc, close_hooked, NULL) == 1)
      return;
  }
  /* Queued prompts will never run: each is recorded cancelled, its row and an inbox/cancelled event in one
   * opset, committed before the close's own (the store commits in order). */
  while (!ah__list_empty(&s->queue)) {
    queued *q = AH__CONTAINER(s->queue.next, queued, link);
    ah__list_remove(&q->link);
    ah__write_ops(
        s,
        json_pack("[{s:s, s:s, s:s}]", "op", "inbox.state", "messageId", q->message_id, "state", "cancelled"),
        "inbox/cancelled", NULL, q->message_id, json_pack("{s:s}", "reason", "closed"), NULL, NULL);
    free(q->message_id);
    json_decref(q->content);
    free(q);
  }
  json_t *ops = json_array();
  char now[32];
  ah__time_rfc3339(now);
  s->running = false;
  json_array_append_new(ops, json_pack("{s:s, s:s, s:{s:b, s:s, s:s}}", "op", "session.update", "id", s->id,
                                       "set", "closed", 1, "status", "idle", "updated", now));
  json_array_append_new(
      ops, json_pack("{s:s, s:s, s:s}", "op", "lease.release", "id", s->id, "owner", s->m->owner));
  s->ready = false;
  ah__write_ops(s, ops, NULL, NULL, NULL, NULL, close_written, NULL);
}

void ah__live_close(session *s, ah_call *call) {
  if (call) {
    ah__link *l = calloc(1, sizeof(ah__link) + sizeof(ah_call *));
    if (l) {
      *(ah_call **)((char *)l + sizeof(ah__link)) = call;
      ah__list_init(l);
      ah__list_push(&s->close_waiters, l);
    } else {
      ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    }
  }
  if (s->closing)
    return;
  s->closing = true;
  if (s->turn)
    ah__cancel_trip(s->turn->cancel); /* ah__live_finish_close runs when the turn has ended */
  else
    ah__live_finish_close(s);
}

/* Release a live session without closing it (host stop): the lease goes, the row stays open. */
static void release_written(session *s, int status, const json_t *event, void *arg) {
  (void)status;
  (void)event;
  (void)arg;
  session_dispose(s);
}

/* The lease goes (the row stays open); `done` runs once it is written. */
static void release_then(session *s, void (*done)(session *s, int status, const json_t *event, void *arg)) {
  s->ready = false;
  ah__write_ops(s, json_pack("[{s:s, s:s, s:s}]", "op", "lease.release", "id", s->id, "owner", s->m->owner),
                NULL, NULL, NULL, NULL, done, NULL);
}

void ah__live_release(session *s) {
  release_then(s, release_written);
}

/* ---- idle unload ([host] idle_unload_s) -----------------------------------------------------------------
 *
 * A session with nothing going on — no turn, no queued prompt, no write in flight, no hold (a remote call,
 * an observing hook chain), no follow, no editor routes, nobody waiting on it — for idle_unload_s leaves
 * memory: its lease is released and the next call loads it again as any cold session (coalesced, fenced). The
 * sweep looks at every live session once a period (a quarter of the idle time, from 50 ms to 5 s); a busy
 * session's idle time starts again at the sweep that finds it busy. */

#define IDLE_DEFAULT_MS (15u * 60u * 1000u)

static uint64_t idle_ms(ah_sessions *m) {
  const ah_config *cfg = ah__host_config(m->host);
  uint64_t v = cfg ? cfg->idle_unload_ms : 0;
  return v == 0 ? IDLE_DEFAULT_MS : v; /* UINT64_MAX: never */
}

static bool busy(const session *s) {
  return !s->ready || s->closing || s->disposed || s->lost || s->broken || s->running || s->turn ||
         s->end_unwritten || s->parent_turn || s->pending_writes > 0 || s->holds > 0 ||
         !ah__list_empty(&s->follows) || !ah__list_empty(&s->queue) || !ah__list_empty(&s->waiters) ||
         !ah__list_empty(&s->close_waiters) ||
         /* routed through an editor (live only): a reload would read and write the disk instead */
         s->editor.read || s->editor.write || s->editor.run;
}

static void unload_written(session *s, int status, const json_t *event, void *arg) {
  (void)event;
  (void)arg;
  ah_sessions *m = s->m;
  if (status)
    AH_LOG_W(LOG, "session %s: its lease could not be released (%s); it expires", s->id, ah_strerror(status));
  /* Callers that came while the lease was released wait for a fresh load, not for this session. */
  ah__link again;
  ah__list_take_all(&again, &s->waiters);
  char *id = strdup(s->id);
  session_dispose(s);
  m->unloads++;
  while (!ah__list_empty(&again)) {
    waiter *w = AH__CONTAINER(again.next, waiter, link);
    ah__list_remove(&w->link);
    if (id)
      ah__live_lookup(m, id, w->cb, w->arg); /* the first loads it, the others coalesce */
    else
      w->cb(AH_ENOMEM, NULL, w->arg);
    free(w);
  }
  free(id);
}

static void unload(session *s) {
  AH_LOG_D(LOG, "session %s: idle, leaves memory", s->id);
  release_then(s, unload_written);
}

static void idle_tick(ah_timer *t, void *arg);

static void idle_arm(ah_sessions *m) {
  uint64_t idle = idle_ms(m);
  uint64_t period = idle == UINT64_MAX ? 5000 : idle / 4 < 50 ? 50 : idle / 4 > 5000 ? 5000 : idle / 4;
  if (m->idle_timer && period == m->idle_period)
    return;
  if (m->idle_timer)
    ah__services_timer_stop(m->idle_timer);
  m->idle_timer = NULL;
  m->idle_period = period;
  ah__services_timer_start(m->core, period, period, idle_tick, m, &m->idle_timer);
}

size_t ah__sessions_idle_sweep(ah_sessions *m, uint64_t idle) {
  size_t n = 0;
  uint64_t now = mono_ms(m);
  if (m->stopping)
    return 0;
  for (ah__link *it = m->sessions.next; it != &m->sessions;) {
    session *s = AH__CONTAINER(it, session, link);
    it = it->next; /* unload() may dispose `s` before it returns (a failed write) */
    if (busy(s)) {
      s->active_ms = now;
    } else if (idle != UINT64_MAX && now - s->active_ms >= idle) {
      unload(s);
      n++;
    }
  }
  return n;
}

uint64_t ah__sessions_idle_ms(ah_sessions *m) {
  return idle_ms(m);
}

/* Memory freed by many unloads goes back to the system (malloc keeps freed pages otherwise): after a
 * batch of unloads; and once nothing is live and nothing was read from the store for a whole tick, the
 * store's page caches go too (they fill again as sessions come back) — also when reads (a client paging
 * through the events) filled them again after the sessions left. */
#define TRIM_AFTER_UNLOADS 256

static void shrunk(int status, const json_t *results, void *arg) {
  (void)status;
  (void)results;
  (void)arg;
  malloc_trim(0);
}

static void idle_tick(ah_timer *t, void *arg) {
  (void)t;
  ah_sessions *m = arg;
  uint64_t reads = ah__store_reads(m->store);
  bool quiet = reads == m->reads_seen && !ah__store_reading(m->store); /* none made, none in flight */
  m->reads_seen = reads;
  if (m->nlive == 0 && quiet && (m->unloads > m->trimmed_at || reads != m->reads_at_shrink)) {
    m->trimmed_at = m->unloads;
    m->reads_at_shrink = reads;
    if (!m->store || ah__store_shrink(m->store, shrunk, NULL) != 0)
      malloc_trim(0);
  } else if (m->unloads - m->trimmed_at >= TRIM_AFTER_UNLOADS) {
    m->trimmed_at = m->unloads;
    malloc_trim(0);
  }
  ah__sessions_idle_sweep(m, idle_ms(m));
  if (!m->stopping)
    idle_arm(m); /* the configured time may have changed (SIGHUP) */
}

void ah__live_idle_start(ah_sessions *m) {
  idle_arm(m);
}

void ah__live_idle_stop(ah_sessions *m) {
  if (m->idle_timer)
    ah__services_timer_stop(m->idle_timer);
  m->idle_timer = NULL;
}
