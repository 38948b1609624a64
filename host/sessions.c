/* Sessions, agents and turns: the durable core every surface serves (sessions.h has the event
 * vocabulary, ARCHITECTURE.md "Flow of one prompt" the flow).
 *
 * Every durable fact goes through append(): the session's next seq is assigned on the loop thread, the
 * event is written by the store's group-commit writer, and only after the commit is it published on the bus
 * as session.event (with its cursor). Store callbacks run in submission order, so the bus sees each
 * session's events in seq order. A prompt's receipt {messageId} is answered from the commit callback of
 * its inbox row.
 */
#include "sessions.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "providers/echo.h"
#include "tools.h"

#define LOG "sessions"
#define HISTORY_MAX 200
#define HISTORY_WINDOW 2000 /* events read to build the history */

typedef struct ah_session session; /* the plugin API's ah_session */
typedef struct turn turn;
typedef struct request request;

typedef void (*lookup_fn)(int status, session *s, void *arg);

typedef struct waiter {
  lookup_fn cb;
  void *arg;
  ah__link link;
} waiter;

typedef struct queued {
  char *message_id;
  json_t *content;
  ah__link link;
} queued;

struct ah_sessions {
  ah_host *host;
  ah_mount *core;
  ah_store *store; /* the configuration is read through the host: SIGHUP replaces it */
  uint64_t lease_ttl;
  int max_depth;
  bool stopping;
  char owner[160];
  char hostname[64];
  ah__link sessions; /* live (loaded or loading) */
  size_t nlive;
  size_t loads;
  ah_provider *echo;
  ah_timer *lease_timer;
  ah__link requests; /* pending server requests */
  ah__link turns;    /* every turn not yet freed (also ended ones waiting for their posted free) */
  json_t *resolved;  /* request id → {state, by}: the recent resolutions, for late-answer receipts */
  json_t *resolved_order;
  void (*stop_cb)(void *arg);
  void *stop_arg;
  ah_timer *stop_deadline;
  bool stop_finishing;
  bool recover_on_start;
  char *store_path; /* the store is opened on first use when opts.lazy_store */
  ah_store_sync store_sync;
  bool store_failed;
  /* Sessions whose writes failed (disk full, I/O error): reloaded from the store once writes succeed,
   * which records their interrupted turn. {id: true} */
  json_t *retry;
  ah_timer *retry_timer;
};

struct ah_session {
  ah_sessions *m;
  char *id;
  json_t *row; /* the stored session row, kept current */
  int64_t seq;
  bool ready;   /* loaded, lease held */
  bool closing; /* close requested: no new prompts */
  bool running;
  ah__link queue;
  turn *turn;
  ah__link waiters;
  /* A subagent: the parent's turn waiting for the turn of `parent_message` to end. */
  turn *parent_turn;
  char *parent_message;
  ah__link close_waiters; /* ah_call * answered when the close completed */
  int pending_writes;     /* store writes in flight for this session (it is freed after the last) */
  int holds;              /* remote calls running with this session (ah__session_hold) */
  bool disposed;
  bool fenced; /* its lease is held: every write carries the fence (the store checks the owner) */
  bool lost;   /* a fenced write found the lease taken by another process: it runs here no more */
  bool broken; /* a write failed (disk full, I/O error): it runs no more until reloaded (m->retry) */
  /* A turn ended and its turn/ended is not stored yet: the next turn waits, so that whatever it reads of
   * the conversation (the provider's history) has every earlier turn's messages. */
  bool end_unwritten;
  ah__link link;
};

struct turn {
  session *s;
  ah_sessions *m; /* the turn may outlive its session's memory until its posted free */
  char id[37];
  char *message_id;
  json_t *content;
  ah_cancel *cancel;
  ah_provider *prov;
  ah_mount *prov_mount; /* the plugin providing `prov`; NULL for the embedded echo */
  ah_provider_turn *pt;
  ah__link all;       /* in the manager's `turns` until freed */
  bool provider_gone; /* its plugin is being withdrawn: the turn ends with that error */
  bool ended;
  bool cancelled;
  json_t *last_text; /* the last committed text (a JSON string), for a waiting parent */
  int tools_running;
  request *pending; /* an approval or question waiting for an answer */
  json_t *history;  /* read on the provider's first sink->history() call */
  /* The provider ended while tools still ran: the end is recorded once they stopped, so turn/ended is
   * always the turn's last event. */
  bool end_pending;
  char *end_reason;
  json_t *end_usage;
  char *end_error;
  session *child; /* a subagent running for this turn */
  char *child_message;
};

struct request {
  ah_sessions *m;
  char id[37];
  char *session_id;
  char *turn_id;
  char *kind; /* "approval" | "question" */
  json_t *params;
  json_t *options;
  turn *t;
  /* Approval: the tool to run once granted. */
  char *call_id;
  char *tool;
  json_t *args;
  ah__link link;
};

static void maybe_claim(session *s);
static void turn_end_now(turn *t, const char *reason, json_t *usage, const char *error);
static void session_release(session *s);
static void resolve_request(request *r, const char *state, const json_t *answer, const char *option_id,
                            const ah_caller *by);
static void check_stopped(ah_sessions *m);
static void on_turn_token(ah_cancel *token, void *arg);

/* ---- the store ----------------------------------------------------------------------------------- */

/* The store, opened now when the manager was made with a lazy store (a stdio child that may never touch
 * a session does not pay for opening the database before it answers its client). NULL when it cannot be
 * opened (logged once): every session method then fails with AH_EIO. */
static ah_store *store_of(ah_sessions *m) {
  if (m->store || m->store_failed || !m->store_path)
    return m->store;
  char *why = NULL;
  ah_store_opts so = {.path = m->store_path, .sync = m->store_sync, .read_only = false};
  if (ah__store_open(ah__host_loop(m->host), NULL, &so, &m->store, &why) != 0) {
    AH_LOG_E(LOG, "cannot open the store: %s", why ? why : "unknown error");
    m->store = NULL;
    m->store_failed = true;
  }
  free(why);
  return m->store;
}

/* ---- small helpers --------------------------------------------------------------------------------- */

static const char *str(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

static session *find_live(ah_sessions *m, const char *id) {
  AH__LIST_EACH(it, &m->sessions) {
    session *s = AH__CONTAINER(it, session, link);
    if (strcmp(s->id, id) == 0)
      return s;
  }
  return NULL;
}

static const char *status_of(const session *s) {
  return s->running ? "running" : "idle";
}

/* The row as clients see it: the stored row with the live status, without the lease internals. */
static json_t *public_row(const json_t *row, const char *status) {
  json_t *r = json_deep_copy(row);
  json_object_del(r, "leaseOwner");
  json_object_del(r, "leaseUntil");
  if (status)
    json_object_set_new(r, "status", json_string(status));
  return r;
}

static void emit(ah_sessions *m, const char *name, json_t *data) {
  ah__host_emit(m->host, name, data);
}

/* ---- writes --------------------------------------------------------------------------------------- */

typedef void (*written_fn)(session *s, int status, const json_t *event, void *arg);

typedef struct write_ctx {
  session *s;
  json_t *event; /* the appended event (NULL for a plain write) */
  written_fn cb;
  void *arg;
} write_ctx;

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
  free(s);
}

/* A disposed session's memory goes after its last write and hold, and after its turn ended. */
static void free_if_unused(session *s) {
  if (!s->disposed || s->pending_writes > 0 || s->holds > 0 || s->turn)
    return;
  ah_sessions *m = s->m;
  session_free(s);
  check_stopped(m);
}

static void lease_lost(session *s, const char *why);
static void session_broken(session *s, int status);

static void write_done(int status, const json_t *results, void *arg) {
  write_ctx *w = arg;
  session *s = w->s;
  if (status == AH_EAGENTBUSY && s->fenced)
    lease_lost(s, "a write was refused by the store's fence");
  else if ((status == AH_EIO || status == AH_EBUSY) && s->fenced)
    session_broken(s, status);
  if (w->event && status == 0) {
    json_object_set(w->event, "cursor", json_array_get(results, json_array_size(results) - 1));
    emit(s->m, "session.event", json_pack("{s:s, s:O}", "sessionId", s->id, "event", w->event));
  } else if (w->event && !s->lost && !s->broken) { /* a lost or broken session logged why, once */
    AH_LOG_E(LOG, "session %s: event seq %lld (%s) could not be stored: %s", s->id,
             (long long)json_integer_value(json_object_get(w->event, "seq")), str(w->event, "kind"),
             ah_strerror(status));
  }
  if (w->cb)
    w->cb(s, status, w->event, w->arg);
  json_decref(w->event);
  free(w);
  s->pending_writes--;
  free_if_unused(s);
}

/* Write `ops` (stolen; may be NULL) and, when `kind` is set, append one event after them in the same
 * opset. The event gets the session's next seq now. `cb` (may be NULL) runs after the commit. */
static void write_ops(session *s, json_t *ops, const char *kind, const char *turn_id, const char *message_id,
                      json_t *data, written_fn cb, void *arg) {
  write_ctx *w = s->lost || s->broken ? NULL : calloc(1, sizeof *w);
  if (!ops)
    ops = json_array();
  if (!w) {
    json_decref(ops);
    json_decref(data);
    if (cb)
      cb(s, s->lost ? AH_EAGENTBUSY : s->broken ? AH_EIO : AH_ENOMEM, NULL, arg);
    return;
  }
  if (s->fenced) /* first: nothing of the opset is written unless this process still holds the lease */
    json_array_insert_new(ops, 0,
                          json_pack("{s:s, s:s, s:s}", "op", "fence", "id", s->id, "owner", s->m->owner));
  w->s = s;
  w->cb = cb;
  w->arg = arg;
  if (kind) {
    char now[32];
    ah__time_rfc3339(now);
    json_t *ev = json_pack("{s:s, s:I, s:s, s:s, s:o}", "sessionId", s->id, "seq", (json_int_t)++s->seq,
                           "kind", kind, "time", now, "data", data ? data : json_object());
    if (turn_id)
      json_object_set_new(ev, "turnId", json_string(turn_id));
    if (message_id)
      json_object_set_new(ev, "messageId", json_string(message_id));
    /* A shallow copy: the writer serializes the op while the loop keeps `ev` (and sets its cursor); the
     * values below the top level are shared, never changed after this, and jansson's reference counts are
     * atomic. A deep copy doubled the memory (and loop time) of every large event, a big prompt's first. */
    json_t *op = json_copy(ev);
    json_object_set_new(op, "op", json_string("event"));
    json_array_append_new(ops, op);
    w->event = ev;
  } else {
    json_decref(data);
  }
  s->pending_writes++;
  int rc = ah__store_write(store_of(s->m), ops, write_done, w);
  if (rc)
    write_done(rc, NULL, w);
}

static void append(session *s, const char *kind, const char *turn_id, const char *message_id, json_t *data) {
  write_ops(s, NULL, kind, turn_id, message_id, data, NULL, NULL);
}

static void update_row(session *s, json_t *set) {
  json_t *ops = json_pack("[{s:s, s:s, s:O}]", "op", "session.update", "id", s->id, "set", set);
  const char *k = NULL;
  json_t *v = NULL;
  json_object_foreach(set, k, v) {
    json_object_set(s->row, k, v);
  }
  json_decref(set);
  write_ops(s, ops, NULL, NULL, NULL, NULL, NULL, NULL);
}

/* session.status is emitted once the row update is committed: the store commits in order, so the status
 * reaches subscribers after every session.event written before it (idle after the turn/ended). */
static void status_written(session *s, int status, const json_t *event, void *arg) {
  (void)status;
  (void)event;
  emit(s->m, "session.status", arg);
}

static void set_running(session *s, bool running) {
  if (s->running == running)
    return;
  s->running = running;
  char now[32];
  ah__time_rfc3339(now);
  json_t *set = json_pack("{s:s, s:s}", "status", status_of(s), "updated", now);
  json_t *ops = json_pack("[{s:s, s:s, s:O}]", "op", "session.update", "id", s->id, "set", set);
  json_object_update(s->row, set);
  json_decref(set);
  write_ops(s, ops, NULL, NULL, NULL, NULL, status_written,
            json_pack("{s:s, s:s}", "sessionId", s->id, "status", status_of(s)));
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

static void renew_leases(ah_timer *t, void *arg) {
  (void)t;
  ah_sessions *m = arg;
  AH__LIST_EACH(it, &m->sessions) {
    session *s = AH__CONTAINER(it, session, link);
    if (!s->ready || s->disposed)
      continue;
    write_ops(s, json_pack("[o]", lease_op(m, s->id, NULL)), NULL, NULL, NULL, NULL, NULL, NULL);
  }
}

/* ---- live sessions: load (cold resume) with coalescing ------------------------------------------------- */

static session *session_new(ah_sessions *m, const char *id, json_t *row) {
  session *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->m = m;
  s->id = strdup(id);
  s->row = row;
  s->seq = json_integer_value(json_object_get(row, "lastSeq"));
  ah__list_init(&s->queue);
  ah__list_init(&s->waiters);
  ah__list_init(&s->close_waiters);
  ah__list_push(&m->sessions, &s->link);
  m->nlive++;
  return s;
}

static void wake_waiters(session *s, int status) {
  while (!ah__list_empty(&s->waiters)) {
    waiter *w = AH__CONTAINER(s->waiters.next, waiter, link);
    ah__list_remove(&w->link);
    w->cb(status, status == 0 ? s : NULL, w->arg);
    free(w);
  }
}

/* Drop a live session from the manager (after its lease is released or was never taken). */
static void session_dispose(session *s) {
  if (s->disposed)
    return;
  wake_waiters(s, AH_ECLOSED); /* nobody waits on a session that is going away */
  s->disposed = true;
  ah__list_remove(&s->link);
  s->m->nlive--;
  free_if_unused(s);
}

static void stop_here(session *s, int status);
static void retry_tick(ah_timer *t, void *arg);
static void lookup(ah_sessions *m, const char *id, lookup_fn cb, void *arg);

/* Another process holds the session's lease now (this one was stopped past the lease's TTL and the session
 * was taken over): it stops here at once — its turn is cancelled (nothing of it is written: every write is
 * fenced), prompts waiting in memory are dropped (they are in the store's inbox for the owner), and the
 * next call for the session loads it afresh, which is refused while the other process holds it. */
static void lease_lost(session *s, const char *why) {
  if (s->lost || s->broken)
    return;
  s->lost = true;
  json_t *row = ah__store_get_session(store_of(s->m), s->id);
  AH_LOG_W(LOG, "session %s: this process lost its lease (%s; held by %s now): it no longer runs here", s->id,
           why, row && str(row, "leaseOwner") ? str(row, "leaseOwner") : "no process");
  json_decref(row);
  stop_here(s, AH_EAGENTBUSY);
}

/* A write of a live session failed (disk full, I/O error): what it did since can no longer be recorded in
 * order, so it stops here — its turn is cancelled, nothing more of it is written — and it is reloaded from
 * the store once writes succeed again: the load records the interrupted turn (turn/ended "error", its
 * prompt done) and runs the prompts still queued. Meanwhile prompts for it are refused (not acknowledged). */
static void session_broken(session *s, int status) {
  if (s->lost || s->broken)
    return;
  s->broken = true;
  ah_sessions *m = s->m;
  char detail[300] = "";
  ah__store_health(store_of(m), detail, sizeof detail);
  AH_LOG_E(LOG,
           "session %s: a write failed (%s%s%s): its turn is cancelled and the session is reloaded once the "
           "store takes writes again",
           s->id, ah_strerror(status), detail[0] ? ": " : "", detail);
  if (!m->retry)
    m->retry = json_object();
  json_object_set_new(m->retry, s->id, json_true());
  if (!m->retry_timer && !m->stopping)
    ah__services_timer_start(m->core, 1000, 1000, retry_tick, m, &m->retry_timer);
  stop_here(s, AH_EIO);
}

/* The session runs here no more: prompts waiting in memory are dropped (they are in the store's inbox),
 * its turn is cancelled, and it leaves the live sessions (its memory goes once nothing uses it). */
static void stop_here(session *s, int status) {
  drop_queue(s);
  if (s->turn && s->turn->cancel)
    ah__cancel_trip(s->turn->cancel);
  if (!s->disposed) {
    wake_waiters(s, status);
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
    if (find_live(m, id))
      continue; /* a load is in progress */
    retry_ctx *r = calloc(1, sizeof *r);
    if (!r)
      continue;
    r->m = m;
    snprintf(r->id, sizeof r->id, "%s", id);
    lookup(m, r->id, retry_loaded, r);
  }
}

static void recover_after_load(session *s) {
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
  json_t *open = ah__store_inbox_open(store_of(m), s->id);
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(open, i, row) {
    const char *mid = str(row, "messageId");
    if (strcmp(str(row, "state"), "claimed") == 0) {
      const char *tid = str(row, "turnId");
      json_t *ops = json_pack("[{s:s, s:s, s:s}]", "op", "inbox.state", "messageId", mid, "state", "done");
      write_ops(s, ops, "turn/ended", tid, mid,
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
  json_decref(open);
  json_t *reqs = ah__store_requests_pending(store_of(m), s->id);
  char now[32];
  ah__time_rfc3339(now);
  json_array_foreach(reqs, i, row) {
    write_ops(s,
              json_pack("[{s:s, s:s, s:s, s:s}]", "op", "request.state", "id", str(row, "id"), "state",
                        "cancelled", "resolved", now),
              NULL, NULL, NULL, NULL, NULL, NULL);
    emit(m, "request.resolved",
         json_pack("{s:s, s:s, s:s}", "id", str(row, "id"), "sessionId", s->id, "state", "cancelled"));
  }
  json_decref(reqs);
  if (strcmp(str(s->row, "status") ? str(s->row, "status") : "idle", "idle") != 0) {
    char t[32];
    ah__time_rfc3339(t);
    update_row(s, json_pack("{s:s, s:s}", "status", "idle", "updated", t));
  }
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
    wake_waiters(s, rc);
    session_dispose(s);
    return;
  }
  json_object_set_new(s->row, "leaseOwner", json_string(s->m->owner));
  s->fenced = true;
  recover_after_load(s);
  s->ready = true;
  s->m->loads++;
  wake_waiters(s, 0);
  maybe_claim(s);
}

static void lookup(ah_sessions *m, const char *id, lookup_fn cb, void *arg) {
  if (m->stopping) {
    cb(AH_ESTATE, NULL, arg);
    return;
  }
  session *s = find_live(m, id);
  if (s && (s->ready || s->closing)) {
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
  if (s) { /* a load is in progress: coalesce */
    ah__list_push(&s->waiters, &w->link);
    return;
  }
  json_t *row = ah__store_get_session(store_of(m), id);
  if (!row || json_is_true(json_object_get(row, "closed"))) {
    free(w);
    cb(row ? AH_ECLOSED : AH_ENOENT, NULL, arg);
    json_decref(row);
    return;
  }
  json_t *op = lease_op(m, id, row);
  s = session_new(m, id, row);
  if (!s) {
    json_decref(op);
    json_decref(row);
    free(w);
    cb(AH_ENOMEM, NULL, arg);
    return;
  }
  ah__list_push(&s->waiters, &w->link);
  s->pending_writes++;
  int rc = ah__store_write(store_of(m), json_pack("[o]", op), load_written, s);
  if (rc)
    load_written(rc, NULL, s);
}

/* ---- server requests ------------------------------------------------------------------------------------
 */

static json_t *request_json(const request *r) {
  return json_pack("{s:s, s:s, s:s?, s:s, s:O, s:O, s:s}", "id", r->id, "sessionId", r->session_id, "turnId",
                   r->turn_id, "kind", r->kind, "params", r->params, "options", r->options, "state",
                   "pending");
}

static request *request_new(turn *t, const char *kind, json_t *params, json_t *options) {
  ah_sessions *m = t->s->m;
  request *r = calloc(1, sizeof *r);
  if (!r) {
    json_decref(params);
    json_decref(options);
    return NULL;
  }
  r->m = m;
  ah__uuid7(r->id);
  r->session_id = strdup(t->s->id);
  r->turn_id = strdup(t->id);
  r->kind = strdup(kind);
  r->params = params;
  r->options = options;
  r->t = t;
  t->pending = r;
  ah__list_push(&m->requests, &r->link);
  char now[32];
  ah__time_rfc3339(now);
  json_t *row = request_json(r);
  json_object_set_new(row, "created", json_string(now));
  write_ops(t->s, json_pack("[{s:s, s:o}]", "op", "request.put", "request", row), NULL, NULL, NULL, NULL,
            NULL, NULL);
  emit(m, "request.pending", json_pack("{s:o}", "request", request_json(r)));
  return r;
}

static void request_free(request *r) {
  ah__list_remove(&r->link);
  free(r->session_id);
  free(r->turn_id);
  free(r->kind);
  json_decref(r->params);
  json_decref(r->options);
  free(r->call_id);
  free(r->tool);
  json_decref(r->args);
  free(r);
}

static request *find_request(ah_sessions *m, const char *id) {
  AH__LIST_EACH(it, &m->requests) {
    request *r = AH__CONTAINER(it, request, link);
    if (strcmp(r->id, id) == 0)
      return r;
  }
  return NULL;
}

static void remember_resolution(ah_sessions *m, const char *id, const char *state, const ah_caller *by) {
  char who[96] = "";
  if (by)
    snprintf(who, sizeof who, "%s:%llu", by->surface ? by->surface : "",
             (unsigned long long)by->connection_id);
  json_object_set_new(m->resolved, id, json_pack("{s:s, s:s}", "state", state, "by", who));
  json_array_append_new(m->resolved_order, json_string(id));
  if (json_array_size(m->resolved_order) > 4096) {
    json_object_del(m->resolved, json_string_value(json_array_get(m->resolved_order, 0)));
    json_array_remove(m->resolved_order, 0);
  }
}

/* ---- turns ------------------------------------------------------------------------------------------------
 */

/* The provider of the configured [provider.NAME]: the embedded echo for type echo (and the built-in
 * "echo"), else the provider type a mounted plugin registered (acp, openai, …), with its mount in *mount.
 * NULL when the name is not configured or no active mount provides its type. */
static ah_provider *provider_for(ah_sessions *m, const char *name, ah_mount **mount, const json_t **config) {
  if (mount)
    *mount = NULL;
  const ah_config *cfg = ah__host_config(m->host);
  const json_t *p = cfg && name ? json_object_get(cfg->providers, name) : NULL;
  if (config)
    *config = p;
  if (!name || strcmp(name, "echo") == 0)
    return m->echo;
  const char *type = p ? str(p, "type") : NULL;
  if (!type)
    return NULL;
  if (strcmp(type, "echo") == 0)
    return m->echo;
  return ah__registry_provider(&m->host->reg, type, mount);
}

/* The end of a turn whose provider's plugin is withdrawn: a host that stops cancels its turns (as
 * ah__sessions_stop does); an unload is a failure of the turn. */
static void turn_end_provider_gone(turn *t, json_t *usage) {
  if (t->s->m->host->stopping)
    turn_end_now(t, "cancelled", usage, NULL);
  else
    turn_end_now(t, "error", usage, "the provider's plugin was withdrawn during the turn");
}

void ah__sessions_provider_withdrawn(ah_sessions *m, ah_mount *mount) {
  /* Before the plugin's withdraw() runs: every turn on one of its providers is cancelled and its provider
   * turn freed now (the plugin may finish reclaiming children before its withdraw completes). The provider
   * may still commit what it has while cancelling; the turn's end is recorded by the core. Ended turns
   * waiting for their posted free lose only their provider turn. */
  if (!m)
    return;
  ah__link *it = m->turns.next;
  while (it != &m->turns) {
    turn *t = AH__CONTAINER(it, turn, all);
    it = it->next;
    if (t->prov_mount != mount || !t->pt)
      continue;
    if (!t->ended && !t->end_pending) {
      t->provider_gone = true;
      t->cancelled = true;
      if (t->pending)
        resolve_request(t->pending, "cancelled", NULL, NULL, NULL);
      t->prov->turn_cancel(t->pt);
    }
    ah_provider_turn *pt = t->pt;
    t->pt = NULL;
    t->prov->turn_free(pt);
    if (!t->ended && !t->end_pending)
      turn_end_provider_gone(t, NULL);
  }
}

static json_t *history_for(session *s, const char *current_message) {
  /* The conversation so far as the provider sees it: each earlier turn's user message (in the order the
   * turns started) and the committed assistant messages, the last HISTORY_MAX of them. Read from the
   * store, so a resumed session has its past; only a recent window of events is read, so a long session
   * does not make every turn slower. Prompts still queued are not part of it. */
  json_t *hist = json_array();
  json_t *prompts = json_object(); /* messageId -> content, from inbox/received */
  int64_t after = s->seq > HISTORY_WINDOW ? s->seq - HISTORY_WINDOW : 0;
  json_t *page = ah__store_events(store_of(s->m), s->id, after, HISTORY_WINDOW);
  size_t i = 0;
  json_t *ev = NULL;
  json_array_foreach(page, i, ev) {
    const char *kind = str(ev, "kind");
    const char *mid = str(ev, "messageId");
    json_t *data = json_object_get(ev, "data");
    if (strcmp(kind, "inbox/received") == 0 && mid) {
      json_object_set(prompts, mid, json_object_get(data, "content"));
    } else if (strcmp(kind, "turn/started") == 0 && mid && strcmp(mid, current_message) != 0 &&
               json_object_get(prompts, mid)) {
      json_array_append_new(
          hist, json_pack("{s:s, s:O}", "role", "user", "content", json_object_get(prompts, mid)));
    } else if (strcmp(kind, "message/committed") == 0) {
      json_array_append_new(
          hist, json_pack("{s:s, s:O}", "role", "assistant", "text", json_object_get(data, "text")));
    }
  }
  json_decref(page);
  json_decref(prompts);
  while (json_array_size(hist) > HISTORY_MAX)
    json_array_remove(hist, 0);
  return hist;
}

static const json_t *sink_history(void *ctx) {
  turn *t = ctx;
  if (!t->history)
    t->history = history_for(t->s, t->message_id);
  return t->history;
}

static void turn_free(turn *t) {
  ah__list_remove(&t->all);
  if (t->pt && t->prov)
    t->prov->turn_free(t->pt);
  ah__cancel_free(t->cancel);
  free(t->message_id);
  json_decref(t->content);
  json_decref(t->last_text);
  free(t->child_message);
  free(t->end_reason);
  free(t->end_error);
  json_decref(t->end_usage);
  json_decref(t->history);
  free(t);
}

/* A stopping manager waits for every turn's free (the provider's turn with it: echo's handles must be
 * closed before the core goes). */
static void turn_free_task(void *arg) {
  ah_sessions *m = ((turn *)arg)->m;
  turn_free(arg);
  check_stopped(m);
}

static void finish_close(session *s);

static void notify_parent(session *child, const char *message_id, const char *reason, const char *text);

static void ended_written(session *s, int status, const json_t *event, void *arg) {
  (void)status;
  (void)event;
  (void)arg;
  s->end_unwritten = false;
  if (!s->lost && !s->broken) /* a lost or broken session runs nothing more here */
    maybe_claim(s);
}

static void turn_end_now(turn *t, const char *reason, json_t *usage, const char *error) {
  if (t->ended || t->end_pending) {
    json_decref(usage);
    return;
  }
  if (t->tools_running > 0) {
    t->end_pending = true;
    t->end_reason = strdup(reason);
    t->end_usage = usage;
    t->end_error = ah__strdup(error);
    return;
  }
  t->ended = true;
  session *s = t->s;
  if (t->pending)
    resolve_request(t->pending, "cancelled", NULL, NULL, NULL);
  if (t->child && t->child->turn)
    ah__cancel_trip(t->child->turn->cancel);
  json_t *data = json_pack("{s:s, s:o}", "reason", reason, "usage",
                           usage ? usage : json_pack("{s:i, s:i}", "inputTokens", 0, "outputTokens", 0));
  if (error)
    json_object_set_new(data, "error", json_string(error));
  json_t *ops = json_pack("[{s:s, s:s, s:s, s:s}]", "op", "inbox.state", "messageId", t->message_id, "state",
                          "done", "turnId", t->id);
  s->end_unwritten = true;
  write_ops(s, ops, "turn/ended", t->id, t->message_id, data, ended_written, NULL);
  s->turn = NULL;
  /* A subagent's parent learns the end of the turn it waits for. */
  if (s->parent_turn && s->parent_message && strcmp(s->parent_message, t->message_id) == 0)
    notify_parent(s, t->message_id, reason, json_string_value(t->last_text));
  /* The provider's turn is freed on a later pass: it may be calling us from its own callback. */
  ah__services_post(s->m->core, turn_free_task, t);
  if (s->lost || s->broken) { /* nothing more runs here; the memory goes once nothing uses it */
    free_if_unused(s);
    return;
  }
  if (s->closing) {
    finish_close(s);
    return;
  }
  if (ah__list_empty(&s->queue) || s->m->stopping)
    set_running(s, false);
  if (s->m->stopping)
    check_stopped(s->m);
  else
    maybe_claim(s);
}

/* Sink: what the provider reports. ctx is the turn. */

static void sink_delta(void *ctx, const char *text) {
  turn *t = ctx;
  if (t->ended)
    return;
  emit(t->s->m, "session.delta",
       json_pack("{s:s, s:s, s:s, s:s}", "sessionId", t->s->id, "turnId", t->id, "messageId", t->message_id,
                 "text", text ? text : ""));
}

/* `text` (a JSON string, stolen) is stored, emitted and kept for a waiting parent as this one value: a long
 * message is never copied on the loop. */
static void sink_commit_json(void *ctx, json_t *text) {
  turn *t = ctx;
  if (t->ended || !json_is_string(text)) {
    json_decref(text);
    return;
  }
  json_decref(t->last_text);
  t->last_text = json_incref(text);
  append(t->s, "message/committed", t->id, NULL, json_pack("{s:s, s:o}", "role", "assistant", "text", text));
}

static void sink_commit(void *ctx, const char *text) {
  turn *t = ctx;
  if (t->ended)
    return;
  json_t *v = json_string(text ? text : "");
  if (!v) /* not UTF-8: what is stored says so (jansson holds only UTF-8 strings) */
    v = json_string("(the provider committed text that is not UTF-8)");
  sink_commit_json(ctx, v);
}

static void sink_end(void *ctx, const char *reason, const json_t *usage, const char *error) {
  turn *t = ctx;
  static const char *const reasons[] = {"end", "max-tokens", "cancelled", "error", "refusal"};
  bool known = false;
  for (size_t i = 0; reason && i < sizeof reasons / sizeof reasons[0]; i++)
    known = known || strcmp(reason, reasons[i]) == 0;
  if (!known) {
    turn_end_now(t, "error", usage ? json_deep_copy(usage) : NULL,
                 "the provider ended the turn with an unknown reason");
    return;
  }
  if (t->provider_gone) {
    turn_end_provider_gone(t, usage ? json_deep_copy(usage) : NULL);
    return;
  }
  /* A turn the user cancelled ends `cancelled` whatever the provider says afterwards. */
  turn_end_now(t, t->cancelled ? "cancelled" : reason, usage ? json_deep_copy(usage) : NULL, error);
}

typedef struct tool_run {
  turn *t;
  char *call_id;
  char *name;
} tool_run;

static void tool_done(const json_t *result, bool is_error, void *arg) {
  tool_run *r = arg;
  turn *t = r->t;
  t->tools_running--;
  append(t->s, "tool/result", t->id, NULL,
         json_pack("{s:s, s:s, s:O, s:b}", "callId", r->call_id, "name", r->name, "result", result, "isError",
                   is_error));
  bool deliver = !t->ended && !t->cancelled && !t->end_pending;
  if (deliver)
    t->prov->turn_tool_result(t->pt, r->call_id, result, is_error);
  free(r->call_id);
  free(r->name);
  free(r);
  if (t->end_pending && t->tools_running == 0) {
    t->end_pending = false;
    char *reason = t->end_reason;
    char *error = t->end_error;
    json_t *usage = t->end_usage;
    t->end_reason = t->end_error = NULL;
    t->end_usage = NULL;
    turn_end_now(t, reason, usage, error);
    free(reason);
    free(error);
  }
}

static void tool_refused(turn *t, const char *call_id, const char *name, const char *why) {
  json_t *res = json_pack("{s:s}", "error", why);
  append(t->s, "tool/result", t->id, NULL,
         json_pack("{s:s, s:s, s:O, s:b}", "callId", call_id, "name", name, "result", res, "isError", 1));
  if (!t->ended && t->pt)
    t->prov->turn_tool_result(t->pt, call_id, res, true);
  json_decref(res);
}

static void run_tool(turn *t, const char *call_id, const char *name, const json_t *args) {
  tool_run *r = calloc(1, sizeof *r);
  if (!r) {
    tool_refused(t, call_id, name, "out of memory");
    return;
  }
  r->t = t;
  r->call_id = strdup(call_id);
  r->name = strdup(name);
  int rc = ah__tool_run(t->s->m->host, str(t->s->row, "cwd"), name, args, t->cancel, tool_done, r);
  if (rc) {
    free(r->call_id);
    free(r->name);
    free(r);
    tool_refused(t, call_id, name, rc == AH_EINVAL ? "invalid arguments for this tool" : ah_strerror(rc));
    return;
  }
  t->tools_running++;
}

static const char *policy_of(session *s, const char *tool) {
  const char *p = str(json_object_get(s->row, "policy"), tool);
  return p ? p : ah__tool_default_policy(tool);
}

static void sink_tool_call(void *ctx, const char *call_id, const char *name, const json_t *args) {
  turn *t = ctx;
  if (t->ended)
    return;
  append(t->s, "tool/call", t->id, NULL,
         json_pack("{s:s, s:s, s:O}", "callId", call_id, "name", name, "args", args ? args : json_null()));
  if (!ah__tool_known(name)) {
    tool_refused(t, call_id, name, "unknown tool");
    return;
  }
  const char *policy = policy_of(t->s, name);
  if (strcmp(policy, "deny") == 0) {
    tool_refused(t, call_id, name, "denied by the session's policy");
  } else if (strcmp(policy, "allow") == 0) {
    run_tool(t, call_id, name, args);
  } else {
    if (t->pending) {
      tool_refused(t, call_id, name, "another request is already waiting for an answer");
      return;
    }
    request *r =
        request_new(t, "approval",
                    json_pack("{s:s, s:s, s:O, s:s}", "tool", name, "callId", call_id, "args",
                              args ? args : json_null(), "cwd", str(t->s->row, "cwd")),
                    json_pack("[s,s,s,s]", "allow_once", "allow_always", "reject_once", "reject_always"));
    if (!r) {
      tool_refused(t, call_id, name, "out of memory");
      return;
    }
    r->call_id = strdup(call_id);
    r->tool = strdup(name);
    r->args = args ? json_deep_copy(args) : json_null();
  }
}

static void sink_ask(void *ctx, const char *question, const json_t *options) {
  turn *t = ctx;
  if (t->ended)
    return;
  if (t->pending) {
    t->prov->turn_answer(t->pt, NULL, true);
    return;
  }
  request *r = request_new(t, "question", json_pack("{s:s}", "question", question ? question : ""),
                           options ? json_deep_copy(options) : json_array());
  if (!r) {
    t->prov->turn_answer(t->pt, NULL, true);
    return;
  }
  append(t->s, "question/asked", t->id, NULL,
         json_pack("{s:s, s:s, s:O}", "requestId", r->id, "question", question ? question : "", "options",
                   r->options));
}

static session *create_child(session *parent, turn *t, const char *prompt, int *rc);

static void sink_subagent(void *ctx, const char *prompt) {
  turn *t = ctx;
  if (t->ended)
    return;
  int rc = 0;
  if (t->child) {
    t->prov->turn_subagent_result(t->pt, NULL, "error");
    return;
  }
  session *child = create_child(t->s, t, prompt ? prompt : "", &rc);
  if (!child) {
    AH_LOG_W(LOG, "session %s: subagent refused: %s", t->s->id, ah_strerror(rc));
    append(t->s, "agent/error", t->id, NULL,
           json_pack("{s:s}", "message",
                     rc == AH_E2BIG ? "subagent depth limit reached" : "cannot start a subagent"));
    t->prov->turn_subagent_result(t->pt, NULL, "error");
  }
}

static void maybe_claim(session *s) {
  ah_sessions *m = s->m;
  if (!s->ready || s->closing || s->disposed || s->turn || s->end_unwritten || ah__list_empty(&s->queue) ||
      m->stopping)
    return;
  queued *q = AH__CONTAINER(s->queue.next, queued, link);
  ah__list_remove(&q->link);
  turn *t = calloc(1, sizeof *t);
  if (!t) {
    ah__list_push(&s->queue, &q->link);
    return;
  }
  ah__list_push(&m->turns, &t->all);
  t->s = s;
  t->m = m;
  ah__uuid7(t->id);
  t->message_id = q->message_id;
  t->content = q->content;
  free(q);
  /* A subagent's turn hangs below its parent's turn: cancelling the parent cancels it too. */
  t->cancel = ah__cancel_new(s->parent_turn ? s->parent_turn->cancel : NULL);
  if (!t->cancel || ah__cancel_watch(t->cancel, on_turn_token, t, NULL) != 0) {
    /* Out of memory (or a parent already cancelled): the turn ends at once, attributed to its message. */
    s->turn = t;
    set_running(s, true);
    turn_end_now(t, t->cancel ? "cancelled" : "error", NULL, t->cancel ? NULL : "out of memory");
    return;
  }
  s->turn = t;
  set_running(s, true);
  json_t *ops = json_pack("[{s:s, s:s, s:s, s:s}]", "op", "inbox.state", "messageId", t->message_id, "state",
                          "claimed", "turnId", t->id);
  write_ops(s, ops, "inbox/claimed", t->id, t->message_id, json_object(), NULL, NULL);
  const char *prov_name = str(s->row, "provider");
  const char *model = str(s->row, "model");
  append(s, "turn/started", t->id, t->message_id,
         json_pack("{s:s, s:s?}", "provider", prov_name ? prov_name : "echo", "model", model));
  const json_t *prov_config = NULL;
  t->prov = provider_for(m, prov_name, &t->prov_mount, &prov_config);
  if (!t->prov) {
    turn_end_now(t, "error", NULL, "the session's provider is not available");
    return;
  }
  static const ah_turn_sink sink = {
      .struct_size = sizeof(ah_turn_sink),
      .delta = sink_delta,
      .commit = sink_commit,
      .tool_call = sink_tool_call,
      .ask = sink_ask,
      .subagent = sink_subagent,
      .end = sink_end,
      .history = sink_history,
      .commit_json = sink_commit_json,
  };
  json_t *tools = ah__tools_describe();
  json_t *empty_config = json_object();
  ah_turn_input in = {
      .struct_size = sizeof in,
      .session_id = s->id,
      .cwd = str(s->row, "cwd"),
      .model = model,
      .content = t->content,
      .tools = tools,
      .max_tokens = 0,
      .depth = (int)json_integer_value(json_object_get(s->row, "depth")),
      .provider_name = prov_name ? prov_name : "echo",
      .provider_config = prov_config ? prov_config : empty_config,
  };
  int rc = t->prov->turn_start(t->prov, &in, &sink, t, &t->pt);
  json_decref(tools);
  json_decref(empty_config);
  /* The content was borrowed for the call: a provider that needs it later took its own reference, and a
   * large prompt goes as soon as nothing uses it any more, not at the end of the turn. */
  json_decref(t->content);
  t->content = NULL;
  if (rc) {
    t->pt = NULL;
    turn_end_now(t, "error", NULL, ah_strerror(rc));
  }
}

static void on_turn_token(ah_cancel *token, void *arg) {
  (void)token;
  turn *t = arg;
  if (t->ended || t->cancelled)
    return;
  t->cancelled = true;
  if (t->pending)
    resolve_request(t->pending, "cancelled", NULL, NULL, NULL);
  if (t->pt)
    t->prov->turn_cancel(t->pt);
  else
    turn_end_now(t, "cancelled", NULL, NULL);
}

/* ---- sessions: create ------------------------------------------------------------------------------------
 */

static void created_written(int status, const json_t *results, void *arg) {
  session *s = arg;
  s->pending_writes--;
  bool got = status == 0 && json_is_true(json_array_get(results, 1));
  if (!got) {
    wake_waiters(s, status ? status : AH_EAGENTBUSY);
    session_dispose(s);
    return;
  }
  s->ready = true;
  s->fenced = true;
  emit(s->m, "session.created", json_pack("{s:o}", "session", public_row(s->row, "idle")));
  wake_waiters(s, 0);
}

/* Create a session row and its live agent (lease taken in the same commit). `cb` runs after the commit. */
static int session_create(ah_sessions *m, const char *cwd, const char *provider, const char *model,
                          const char *title, const char *parent, bool local, int depth, lookup_fn cb,
                          void *arg) {
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
  int rc = ah__store_write(store_of(m), ops, created_written, s);
  if (rc)
    created_written(rc, NULL, s);
  return 0;
}

/* ---- subagents -------------------------------------------------------------------------------------------
 */

typedef struct child_start {
  turn *t;
  char *prompt;
} child_start;

static void enqueue_prompt(session *s, json_t *content, written_fn cb, void *arg, char out_id[37]);

static void child_prompt_written(session *child, int status, const json_t *event, void *arg) {
  (void)event;
  (void)arg;
  if (status == 0)
    maybe_claim(child);
}

static void child_created(int status, session *child, void *arg) {
  child_start *c = arg;
  turn *t = c->t;
  if (status || t->ended || t->cancelled) {
    if (!t->ended && t->pt)
      t->prov->turn_subagent_result(t->pt, NULL, t->cancelled ? "cancelled" : "error");
    if (t->child == child)
      t->child = NULL;
    free(c->prompt);
    free(c);
    return;
  }
  append(t->s, "subagent/started", t->id, NULL,
         json_pack("{s:s, s:s, s:b}", "sessionId", child->id, "prompt", c->prompt, "local", 1));
  emit(t->s->m, "subagent.started",
       json_pack("{s:s, s:s, s:b}", "parentSessionId", t->s->id, "sessionId", child->id, "local", 1));
  char mid[37];
  enqueue_prompt(child, json_pack("[{s:s, s:s}]", "type", "text", "text", c->prompt), child_prompt_written,
                 NULL, mid);
  child->parent_message = strdup(mid);
  free(c->prompt);
  free(c);
}

static session *create_child(session *parent, turn *t, const char *prompt, int *rc) {
  ah_sessions *m = parent->m;
  int depth = (int)json_integer_value(json_object_get(parent->row, "depth")) + 1;
  if (depth > m->max_depth) {
    *rc = AH_E2BIG;
    return NULL;
  }
  child_start *c = calloc(1, sizeof *c);
  if (!c) {
    *rc = AH_ENOMEM;
    return NULL;
  }
  c->t = t;
  c->prompt = strdup(prompt);
  const char *title = "subagent";
  *rc = session_create(m, str(parent->row, "cwd"), str(parent->row, "provider"), str(parent->row, "model"),
                       title, parent->id, true, depth, child_created, c);
  if (*rc) {
    free(c->prompt);
    free(c);
    return NULL;
  }
  session *child = AH__CONTAINER(m->sessions.prev, session, link); /* session_create appends it */
  child->parent_turn = t;
  t->child = child;
  return child;
}

static void notify_parent(session *child, const char *message_id, const char *reason, const char *text) {
  (void)message_id;
  turn *t = child->parent_turn;
  child->parent_turn = NULL;
  if (!t || t->child != child)
    return;
  t->child = NULL;
  append(t->s, "subagent/finished", t->id, NULL,
         json_pack("{s:s, s:s, s:s}", "sessionId", child->id, "reason", reason, "text", text ? text : ""));
  emit(t->s->m, "subagent.finished",
       json_pack("{s:s, s:s, s:b, s:s}", "parentSessionId", t->s->id, "sessionId", child->id, "local", 1,
                 "reason", reason));
  if (!t->ended && t->pt)
    t->prov->turn_subagent_result(t->pt, text, reason);
}

/* ---- prompts ----------------------------------------------------------------------------------------------
 */

static void enqueue_prompt(session *s, json_t *content, written_fn cb, void *arg, char out_id[37]) {
  queued *q = calloc(1, sizeof *q);
  char mid[37];
  ah__uuid7(mid);
  if (out_id)
    memcpy(out_id, mid, 37);
  char now[32];
  ah__time_rfc3339(now);
  json_t *ops = json_pack("[{s:s, s:s, s:s, s:O, s:s}]", "op", "inbox.put", "messageId", mid, "sessionId",
                          s->id, "content", content, "time", now);
  if (q) {
    q->message_id = strdup(mid);
    q->content = json_incref(content);
  }
  /* Queued in memory now (order = submission order); claimed only after the receipt is durable, since
   * maybe_claim runs from the write callback. */
  if (q)
    ah__list_push(&s->queue, &q->link);
  write_ops(s, ops, "inbox/received", NULL, mid, json_pack("{s:o}", "content", content), cb, arg);
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
  emit(s->m, "session.closed", json_pack("{s:s}", "sessionId", s->id));
  session_dispose(s);
}

static void finish_close(session *s) {
  /* Queued prompts will never run: record them as cancelled. */
  json_t *ops = json_array();
  while (!ah__list_empty(&s->queue)) {
    queued *q = AH__CONTAINER(s->queue.next, queued, link);
    ah__list_remove(&q->link);
    json_array_append_new(ops, json_pack("{s:s, s:s, s:s}", "op", "inbox.state", "messageId", q->message_id,
                                         "state", "cancelled"));
    free(q->message_id);
    json_decref(q->content);
    free(q);
  }
  char now[32];
  ah__time_rfc3339(now);
  s->running = false;
  json_array_append_new(ops, json_pack("{s:s, s:s, s:{s:b, s:s, s:s}}", "op", "session.update", "id", s->id,
                                       "set", "closed", 1, "status", "idle", "updated", now));
  json_array_append_new(
      ops, json_pack("{s:s, s:s, s:s}", "op", "lease.release", "id", s->id, "owner", s->m->owner));
  s->ready = false;
  write_ops(s, ops, NULL, NULL, NULL, NULL, close_written, NULL);
}

static void session_close(session *s, ah_call *call) {
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
    ah__cancel_trip(s->turn->cancel); /* finish_close runs when the turn has ended */
  else
    finish_close(s);
}

/* Release a live session without closing it (host stop): the lease goes, the row stays open. */
static void release_written(session *s, int status, const json_t *event, void *arg) {
  (void)status;
  (void)event;
  (void)arg;
  session_dispose(s);
}

static void session_release(session *s) {
  s->ready = false;
  write_ops(s, json_pack("[{s:s, s:s, s:s}]", "op", "lease.release", "id", s->id, "owner", s->m->owner), NULL,
            NULL, NULL, NULL, release_written, NULL);
}

/* ---- requests: answers
 * ------------------------------------------------------------------------------------- */

static void resolve_request(request *r, const char *state, const json_t *answer, const char *option_id,
                            const ah_caller *by) {
  ah_sessions *m = r->m;
  turn *t = r->t;
  if (t && t->pending == r)
    t->pending = NULL;
  char now[32];
  ah__time_rfc3339(now);
  remember_resolution(m, r->id, state, by);
  json_t *op =
      json_pack("{s:s, s:s, s:s, s:s}", "op", "request.state", "id", r->id, "state", state, "resolved", now);
  if (answer)
    json_object_set(op, "answer", (json_t *)answer);
  if (t)
    write_ops(t->s, json_pack("[o]", op), NULL, NULL, NULL, NULL, NULL, NULL);
  else
    json_decref(op);
  json_t *ev = json_pack("{s:s, s:s, s:s}", "id", r->id, "sessionId", r->session_id, "state", state);
  if (answer)
    json_object_set(ev, "answer", (json_t *)answer);
  emit(m, "request.resolved", ev);
  if (t && strcmp(r->kind, "approval") == 0) {
    const char *outcome = strcmp(state, "granted") == 0  ? "granted"
                          : strcmp(state, "denied") == 0 ? "denied"
                                                         : "cancelled";
    json_t *data = json_pack("{s:s, s:s, s:s, s:s}", "callId", r->call_id, "name", r->tool, "requestId",
                             r->id, "outcome", outcome);
    if (option_id)
      json_object_set_new(data, "optionId", json_string(option_id));
    append(t->s, "tool/approval", t->id, NULL, data);
    /* allow_always / reject_always set the session's policy for that tool, stored with the session. */
    if (option_id && (strcmp(option_id, "allow_always") == 0 || strcmp(option_id, "reject_always") == 0)) {
      json_t *policy = json_deep_copy(json_object_get(t->s->row, "policy"));
      if (!json_is_object(policy)) {
        json_decref(policy);
        policy = json_object();
      }
      json_object_set_new(policy, r->tool, json_string(option_id[0] == 'a' ? "allow" : "deny"));
      update_row(t->s, json_pack("{s:o}", "policy", policy));
    }
    if (strcmp(outcome, "granted") == 0 && !t->ended && !t->cancelled)
      run_tool(t, r->call_id, r->tool, r->args);
    else
      tool_refused(t, r->call_id, r->tool,
                   strcmp(outcome, "denied") == 0 ? "denied by the user" : "cancelled");
  } else if (t) {
    json_t *data = json_pack("{s:s, s:s}", "requestId", r->id, "outcome", state);
    if (answer)
      json_object_set(data, "answer", json_object_get(answer, "answer"));
    append(t->s, "question/answered", t->id, NULL, data);
    if (!t->ended && t->pt && !t->cancelled)
      t->prov->turn_answer(t->pt, answer ? json_object_get(answer, "answer") : NULL,
                           strcmp(state, "answered") != 0);
  }
  request_free(r);
}

static bool is_option(const json_t *options, const char *id) {
  size_t i = 0;
  json_t *o = NULL;
  json_array_foreach(options, i, o) {
    if (json_is_string(o) && strcmp(json_string_value(o), id) == 0)
      return true;
  }
  return false;
}

/* ---- methods
 * ------------------------------------------------------------------------------------------------- */

#define SM(data) ((ah_sessions *)(data))

/* Every session method needs the store; a store that cannot be opened fails them all the same way. */
static bool store_ready(ah_call *call, void *data) {
  if (store_of(SM(data)))
    return true;
  ah__call_error(call, AH_EIO, "the store cannot be opened (see the host's log)", NULL);
  return false;
}

/* A failed read is answered as an error (AH_EIO with the store's health), never as an empty or null
 * success. */
static void answer_read_error(ah_call *call, ah_sessions *m) {
  char detail[300];
  int h = ah__store_health(store_of(m), detail, sizeof detail);
  char msg[400];
  snprintf(msg, sizeof msg, "the store could not be read%s%s", h != AH_STORE_OK ? ": " : "",
           h != AH_STORE_OK ? detail : "");
  ah__call_error(call, AH_EIO, msg, NULL);
}

/* After a read that returned NULL: true (and the call answered) when the read failed, false when the NULL
 * only means "not found". */
static bool read_failed(ah_call *call, ah_sessions *m) {
  if (ah__store_read_status(store_of(m)) == 0)
    return false;
  answer_read_error(call, m);
  return true;
}

static bool absolute_dir(const char *p) {
  struct stat st;
  return p && p[0] == '/' && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void reply_created(int status, session *s, void *arg) {
  ah_call *call = arg;
  if (status)
    ah__call_error(call, status,
                   status == AH_EAGENTBUSY ? "the session is owned by another process"
                                           : "cannot create the session",
                   NULL);
  else
    ah__call_reply(call, json_pack("{s:s, s:o}", "sessionId", s->id, "session", public_row(s->row, "idle")));
}

static void m_create(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *cwd = str(p, "cwd");
  const char *provider = str(p, "provider");
  const char *model = str(p, "model");
  const char *title = str(p, "title");
  const char *parent = str(p, "parent");
  if (!absolute_dir(cwd)) {
    ah__call_error(call, AH_EINVAL, "params.cwd: an absolute path to an existing directory is required",
                   NULL);
    return;
  }
  if ((json_object_get(p, "provider") && !provider) || (json_object_get(p, "model") && !model) ||
      (json_object_get(p, "title") && !title) || (json_object_get(p, "parent") && !parent)) {
    ah__call_error(call, AH_EINVAL, "params: provider, model, title and parent must be strings", NULL);
    return;
  }
  if (!provider)
    provider = ah__host_config(m->host) && ah__host_config(m->host)->default_provider
                   ? ah__host_config(m->host)->default_provider
                   : "echo";
  if (!provider_for(m, provider, NULL, NULL)) {
    ah__call_error(call, AH_EUNAVAILABLE, "params.provider: no such provider is available", NULL);
    return;
  }
  int depth = 0;
  if (parent) {
    json_t *prow = ah__store_get_session(store_of(m), parent);
    if (!prow) {
      ah__call_error(call, AH_ENOENT, "params.parent: no such session", NULL);
      return;
    }
    depth = (int)json_integer_value(json_object_get(prow, "depth")) + 1;
    json_decref(prow);
    if (depth > m->max_depth) {
      ah__call_error(call, AH_EINVAL, "params.parent: the subagent depth limit is reached", NULL);
      return;
    }
  }
  int rc = session_create(m, cwd, provider, model, title, parent, false, depth, reply_created, call);
  if (rc)
    ah__call_error(call, rc, ah_strerror(rc), NULL);
}

static int parse_limit(const json_t *p, size_t def, size_t max, size_t *out) {
  json_t *l = json_object_get(p, "limit");
  if (!l) {
    *out = def;
    return 0;
  }
  if (!json_is_integer(l) || json_integer_value(l) < 1 || (size_t)json_integer_value(l) > max)
    return AH_EINVAL;
  *out = (size_t)json_integer_value(l);
  return 0;
}

static json_t *live_status_row(ah_sessions *m, json_t *row) {
  session *s = find_live(m, str(row, "id"));
  const char *status = s && s->ready                                  ? status_of(s)
                       : json_is_true(json_object_get(row, "closed")) ? "closed"
                                                                      : "idle";
  json_t *r = public_row(row, status);
  json_object_set_new(r, "live", json_boolean(s && s->ready));
  /* A live session's own fields may be ahead of the store (ah__session_update is written behind). */
  static const char *const own[] = {"title", "tags", "policy"};
  for (size_t i = 0; s && s->ready && i < sizeof own / sizeof own[0]; i++)
    if (json_object_get(s->row, own[i]))
      json_object_set(r, own[i], json_object_get(s->row, own[i]));
  return r;
}

static void m_list(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  size_t limit = 0;
  json_t *cursor = json_object_get(p, "cursor");
  if (parse_limit(p, 50, 500, &limit) || (cursor && !json_is_string(cursor))) {
    ah__call_error(call, AH_EINVAL, "params: cursor must be a string and limit an integer in 1..500", NULL);
    return;
  }
  json_t *rows = ah__store_list_sessions(store_of(m), json_string_value(cursor), limit + 1);
  if (!rows && read_failed(call, m))
    return;
  json_t *out = json_array();
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(rows, i, row) {
    if (i < limit)
      json_array_append_new(out, live_status_row(m, row));
  }
  json_t *next = json_array_size(rows) > limit ? json_object_get(json_array_get(out, limit - 1), "id") : NULL;
  ah__call_reply(call, json_pack("{s:o, s:O?}", "sessions", out, "nextCursor", next));
  json_decref(rows);
}

/* The stored row of params.sessionId, or NULL after answering the call (missing id or no such session). */
static json_t *stored_row(ah_call *call, ah_sessions *m, const char *id) {
  json_t *row = id ? ah__store_get_session(store_of(m), id) : NULL;
  if (!row && id && read_failed(call, m))
    return NULL;
  if (!row)
    ah__call_error(call, id ? AH_ENOENT : AH_EINVAL, id ? "no such session" : "params.sessionId is required",
                   NULL);
  return row;
}

static void m_get(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *id = str(p, "sessionId");
  json_t *row = stored_row(call, m, id);
  if (!row)
    return;
  ah__call_reply(call, json_pack("{s:o}", "session", live_status_row(m, row)));
  json_decref(row);
}

static void m_history(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  /* A pure store read: never wakes an agent, never changes state. */
  ah_sessions *m = SM(data);
  const char *id = str(p, "sessionId");
  json_t *after = json_object_get(p, "afterSeq");
  size_t limit = 0;
  if (!id || (after && (!json_is_integer(after) || json_integer_value(after) < 0)) ||
      parse_limit(p, 200, 1000, &limit)) {
    ah__call_error(call, AH_EINVAL, "params: sessionId (string), afterSeq (integer ≥ 0), limit (1..1000)",
                   NULL);
    return;
  }
  json_t *row = stored_row(call, m, id);
  if (!row)
    return;
  json_decref(row);
  json_t *events = ah__store_events(store_of(m), id, after ? json_integer_value(after) : 0, limit + 1);
  if (!events) { /* an array, empty or not, unless the read failed */
    answer_read_error(call, m);
    return;
  }
  json_t *next = NULL;
  if (json_array_size(events) > limit) {
    json_array_remove(events, limit);
    next = json_object_get(json_array_get(events, limit - 1), "seq");
  }
  ah__call_reply(call, json_pack("{s:o, s:O?}", "events", events, "nextAfterSeq", next));
}

static void m_export(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *id = str(p, "sessionId");
  json_t *row = stored_row(call, m, id);
  if (!row)
    return;
  json_decref(row);
  size_t cap = 4096;
  size_t len = 0;
  char *buf = malloc(cap);
  int64_t after = 0;
  for (bool more = true; more && buf;) {
    json_t *page = ah__store_events(store_of(m), id, after, 1000);
    if (!page) {
      free(buf);
      answer_read_error(call, m);
      return;
    }
    more = json_array_size(page) == 1000;
    size_t i = 0;
    json_t *ev = NULL;
    json_array_foreach(page, i, ev) {
      char *line = json_dumps(ev, JSON_COMPACT);
      size_t n = line ? strlen(line) : 0;
      if (len + n + 2 > cap) {
        while (len + n + 2 > cap)
          cap *= 2;
        char *grown = realloc(buf, cap);
        if (!grown) {
          free(line);
          free(buf);
          buf = NULL;
          break;
        }
        buf = grown;
      }
      memcpy(buf + len, line, n);
      len += n;
      buf[len++] = '\n';
      free(line);
      after = json_integer_value(json_object_get(ev, "seq"));
    }
    json_decref(page);
  }
  if (!buf) {
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  ah__call_reply(call, json_pack("{s:s%}", "jsonl", buf, len));
  free(buf);
}

typedef struct prompt_ctx {
  ah_call *call;
  json_t *content;
} prompt_ctx;

static void prompt_written(session *s, int status, const json_t *event, void *arg) {
  ah_call *call = arg;
  if (status) {
    /* No receipt, no run: take the prompt out of the queue unless a turn already claimed it. */
    const char *mid = event ? str(event, "messageId") : NULL;
    AH__LIST_EACH(it, &s->queue) {
      queued *q = AH__CONTAINER(it, queued, link);
      if (mid && strcmp(q->message_id, mid) == 0) {
        ah__list_remove(&q->link);
        free(q->message_id);
        json_decref(q->content);
        free(q);
        break;
      }
    }
    ah__call_error(call, status, "the prompt could not be stored", NULL);
    return;
  }
  ah__call_reply(call, json_pack("{s:s, s:s}", "sessionId", s->id, "messageId", str(event, "messageId")));
  maybe_claim(s);
}

static void prompt_found(int status, session *s, void *arg) {
  prompt_ctx *c = arg;
  if (status) {
    ah__call_error(c->call, status,
                   status == AH_ENOENT       ? "no such session"
                   : status == AH_ECLOSED    ? "the session is closed"
                   : status == AH_EAGENTBUSY ? "the session is owned by another process"
                                             : ah_strerror(status),
                   NULL);
  } else {
    enqueue_prompt(s, json_incref(c->content), prompt_written, c->call, NULL);
  }
  json_decref(c->content);
  free(c);
}

static json_t *prompt_content(const json_t *p, const char **why) {
  json_t *text = json_object_get(p, "text");
  json_t *content = json_object_get(p, "content");
  if ((text != NULL) == (content != NULL)) {
    *why = "params: exactly one of text (string) or content (array of blocks) is required";
    return NULL;
  }
  if (text) {
    if (!json_is_string(text)) {
      *why = "params.text: must be a string";
      return NULL;
    }
    return json_pack("[{s:s, s:O}]", "type", "text", "text", text);
  }
  if (!json_is_array(content) || json_array_size(content) == 0 || json_array_size(content) > 1000) {
    *why = "params.content: a non-empty array of content blocks is required";
    return NULL;
  }
  size_t i = 0;
  json_t *b = NULL;
  json_array_foreach(content, i, b) {
    const char *type = str(b, "type");
    bool ok = type && ((strcmp(type, "text") == 0 && json_is_string(json_object_get(b, "text"))) ||
                       (strcmp(type, "resource_link") == 0 && json_is_string(json_object_get(b, "uri")) &&
                        json_is_string(json_object_get(b, "name"))));
    if (!ok) {
      *why = "params.content: blocks must be {type:\"text\", text} or {type:\"resource_link\", uri, name}";
      return NULL;
    }
  }
  return json_deep_copy(content);
}

static void m_prompt(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  /* A store found damaged takes no more work it may not keep: the prompt is refused, not acknowledged. */
  char detail[300];
  if (ah__store_health(store_of(m), detail, sizeof detail) == AH_STORE_DAMAGED) {
    char msg[400];
    snprintf(msg, sizeof msg, "the store is damaged (%s): prompts are refused until it is repaired", detail);
    ah__call_error(call, AH_EUNAVAILABLE, msg, NULL);
    return;
  }
  const char *id = str(p, "sessionId");
  const char *why = NULL;
  json_t *content = id ? prompt_content(p, &why) : NULL;
  if (!content) {
    ah__call_error(call, AH_EINVAL, id ? why : "params.sessionId is required", NULL);
    return;
  }
  prompt_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    json_decref(content);
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  c->call = call;
  c->content = content;
  lookup(m, id, prompt_found, c);
}

static void m_cancel(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *id = str(p, "sessionId");
  if (!id) {
    ah__call_error(call, AH_EINVAL, "params.sessionId is required", NULL);
    return;
  }
  session *s = find_live(m, id);
  bool cancelled = s && s->ready && s->turn && !s->turn->ended && !s->turn->cancelled;
  if (cancelled)
    ah__cancel_trip(s->turn->cancel);
  else if (!s) {
    json_t *row = ah__store_get_session(store_of(m), id);
    if (!row) {
      ah__call_error(call, AH_ENOENT, "no such session", NULL);
      return;
    }
    json_decref(row);
  }
  ah__call_reply(call, json_pack("{s:b}", "cancelled", cancelled));
}

static void close_found(int status, session *s, void *arg) {
  ah_call *call = arg;
  if (status == AH_ECLOSED) {
    ah__call_reply(call, json_object()); /* closing a closed session is a no-op */
    return;
  }
  if (status) {
    ah__call_error(call, status, status == AH_ENOENT ? "no such session" : ah_strerror(status), NULL);
    return;
  }
  session_close(s, call);
}

static void m_close(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  const char *id = str(p, "sessionId");
  if (!id) {
    ah__call_error(call, AH_EINVAL, "params.sessionId is required", NULL);
    return;
  }
  /* A cold session is resumed (lease) to be closed, so two processes never close and run it at once. */
  lookup(SM(data), id, close_found, call);
}

static void delete_written(int status, const json_t *results, void *arg) {
  (void)results;
  ah_call *call = arg;
  if (status)
    ah__call_error(call, status, "the session could not be deleted", NULL);
  else
    ah__call_reply(call, json_object());
}

static void m_delete(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *id = str(p, "sessionId");
  json_t *row = stored_row(call, m, id);
  if (!row)
    return;
  bool closed = json_is_true(json_object_get(row, "closed"));
  json_decref(row);
  if (!closed || find_live(m, id)) {
    ah__call_error(call, AH_EBUSY, "close the session before deleting it", NULL);
    return;
  }
  int rc = ah__store_write(store_of(m), json_pack("[{s:s, s:s}]", "op", "session.delete", "id", id),
                           delete_written, call);
  if (rc)
    ah__call_error(call, rc, ah_strerror(rc), NULL);
}

typedef struct policy_ctx {
  ah_call *call;
  json_t *policy;
} policy_ctx;

static void policy_found(int status, session *s, void *arg) {
  policy_ctx *c = arg;
  ah_call *call = c->call;
  json_t *p = c->policy;
  free(c);
  if (status) {
    ah__call_error(call, status, status == AH_ENOENT ? "no such session" : ah_strerror(status), NULL);
    json_decref(p);
    return;
  }
  json_t *policy = json_deep_copy(json_object_get(s->row, "policy"));
  if (!json_is_object(policy)) {
    json_decref(policy);
    policy = json_object();
  }
  json_object_update(policy, p);
  json_decref(p);
  update_row(s, json_pack("{s:O}", "policy", policy));
  ah__call_reply(call, json_pack("{s:o}", "policy", policy));
}

static void m_set_policy(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  const char *id = str(p, "sessionId");
  json_t *policy = json_object_get(p, "policy");
  const char *k = NULL;
  json_t *v = NULL;
  bool ok = id && json_is_object(policy);
  json_object_foreach(policy, k, v) {
    const char *val = json_string_value(v);
    ok = ok && ah__tool_known(k) && val &&
         (strcmp(val, "allow") == 0 || strcmp(val, "ask") == 0 || strcmp(val, "deny") == 0);
  }
  if (!ok) {
    ah__call_error(call, AH_EINVAL, "params: sessionId and policy {TOOL: allow|ask|deny} for known tools",
                   NULL);
    return;
  }
  policy_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  c->call = call;
  c->policy = json_deep_copy(policy);
  lookup(SM(data), id, policy_found, c);
}

static void m_request_list(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *sid = str(p, "sessionId");
  json_t *out = json_array();
  AH__LIST_EACH(it, &m->requests) {
    request *r = AH__CONTAINER(it, request, link);
    if (!sid || strcmp(sid, r->session_id) == 0)
      json_array_append_new(out, request_json(r));
  }
  ah__call_reply(call, json_pack("{s:o}", "requests", out));
}

static void m_request_respond(ah_call *call, const json_t *p, void *data) {
  if (!store_ready(call, data))
    return;
  ah_sessions *m = SM(data);
  const char *id = str(p, "id");
  json_t *value = json_object_get(p, "value");
  json_t *error = json_object_get(p, "error");
  if (!id || (value != NULL) == (error != NULL)) {
    ah__call_error(call, AH_EINVAL, "params: id and exactly one of value or error are required", NULL);
    return;
  }
  const ah_caller *by = ah__call_caller(call);
  request *r = find_request(m, id);
  if (!r) {
    /* Late or duplicate: a receipt, never a second resolution. */
    json_t *seen = json_object_get(m->resolved, id);
    const char *reason = "unknown";
    if (seen) {
      char who[96];
      snprintf(who, sizeof who, "%s:%llu", by->surface ? by->surface : "",
               (unsigned long long)by->connection_id);
      reason = strcmp(str(seen, "by"), who) == 0 ? "duplicate" : "resolved";
    } else {
      json_t *row = ah__store_get_request(store_of(m), id);
      if (row)
        reason = "resolved";
      json_decref(row);
    }
    ah__call_reply(call, json_pack("{s:b, s:s}", "accepted", 0, "reason", reason));
    return;
  }
  if (strcmp(r->kind, "approval") == 0) {
    const char *opt = value ? str(value, "optionId") : NULL;
    if (value && (!opt || !is_option(r->options, opt))) {
      ah__call_error(call, AH_EINVAL, "value.optionId: must be one of the request's options", NULL);
      return;
    }
    const char *state = opt && strncmp(opt, "allow", 5) == 0 ? "granted" : "denied";
    json_t *answer = opt ? json_pack("{s:s}", "optionId", opt) : NULL;
    resolve_request(r, state, answer, opt, by);
    json_decref(answer);
  } else {
    json_t *ans = value ? json_object_get(value, "answer") : NULL;
    if (value && !json_is_string(ans)) {
      ah__call_error(call, AH_EINVAL, "value.answer: a string is required", NULL);
      return;
    }
    json_t *answer = ans ? json_pack("{s:O}", "answer", ans) : NULL;
    resolve_request(r, ans ? "answered" : "cancelled", answer, NULL, by);
    json_decref(answer);
  }
  ah__call_reply(call, json_pack("{s:b}", "accepted", 1));
}

/* ---- registration, start, stop
 * --------------------------------------------------------------------------------- */

int ah__sessions_register(ah_sessions *m, ah_mount *core) {
  const struct {
    const char *name;
    ah_method_fn fn;
    uint32_t flags;
  } methods[] = {
      {"session.create", m_create, AH_METHOD_PUBLIC},
      {"session.list", m_list, AH_METHOD_PUBLIC},
      {"session.get", m_get, AH_METHOD_PUBLIC},
      {"session.history", m_history, AH_METHOD_PUBLIC},
      {"session.prompt", m_prompt, AH_METHOD_PUBLIC},
      {"session.cancel", m_cancel, AH_METHOD_PUBLIC},
      {"session.close", m_close, AH_METHOD_PUBLIC},
      {"session.export", m_export, AH_METHOD_PUBLIC},
      {"session.delete", m_delete, AH_METHOD_PRIVILEGED},
      {"session.set-policy", m_set_policy, AH_METHOD_PRIVILEGED},
      {"request.list", m_request_list, AH_METHOD_PUBLIC},
      {"request.respond", m_request_respond, AH_METHOD_PUBLIC},
  };
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    ah_method_def def = {.struct_size = sizeof def,
                         .name = methods[i].name,
                         .handler = methods[i].fn,
                         .flags = methods[i].flags,
                         .data = m};
    int rc = ah__services_register_method(core, &def);
    if (rc)
      return rc;
  }
  /* Transient deltas are for clients that stream text; not on the remote allowlist (DECISIONS.md). */
  return ah__services_register_event(core, "session.delta", 0);
}

static void recover(ah_sessions *m);

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
  snprintf(path, sizeof path, "%s/agenthost.db", opts->config->state_dir);
  const char *failed = NULL;
  int e = ah__mkdirs(opts->config->state_dir, &failed);
  if (e) {
    if (why && asprintf(why, "cannot create %s: %s", failed, strerror(-e)) < 0)
      *why = NULL;
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
  m->store_path = strdup(path);
  ah_store_opts so = {.path = path, .sync = m->store_sync, .read_only = false};
  int rc = !m->store_path     ? AH_ENOMEM
           : opts->lazy_store ? 0
                              : ah__store_open(ah__host_loop(m->host), NULL, &so, &m->store, why);
  if (rc) {
    free(m->store_path);
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
  ah__services_timer_start(core, m->lease_ttl / 3, m->lease_ttl / 3, renew_leases, m, &m->lease_timer);
  if (m->recover_on_start)
    recover(m);
}

static void recovered(int status, session *s, void *arg) {
  (void)arg;
  if (status == 0)
    AH_LOG_I(LOG, "session %s resumed after a restart", s->id);
}

static void recover(ah_sessions *m) {
  json_t *ids = ah__store_sessions_to_recover(store_of(m));
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(ids, i, row) {
    lookup(m, str(row, "id"), recovered, NULL);
  }
  json_decref(ids);
}

static void store_closed(void *arg) {
  ah_sessions *m = arg;
  m->store = NULL;
  void (*cb)(void *) = m->stop_cb;
  m->stop_cb = NULL;
  if (cb)
    cb(m->stop_arg);
}

static void check_stopped(ah_sessions *m) {
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
      session_release(s);
    }
  }
  if (releasing || !ah__list_empty(&m->sessions))
    return;
  m->stop_finishing = true;
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
      turn_end_now(s->turn, "cancelled", NULL, "the host stopped");
    }
  }
  check_stopped(m);
}

void ah__sessions_stop(ah_sessions *m, void (*cb)(void *arg), void *arg) {
  m->stopping = true;
  m->stop_cb = cb;
  m->stop_arg = arg;
  AH__LIST_EACH(it, &m->sessions) {
    session *s = AH__CONTAINER(it, session, link);
    wake_waiters(s, AH_ESTATE);
    if (s->turn)
      ah__cancel_trip(s->turn->cancel);
  }
  ah__services_timer_start(m->core, 2000, 0, stop_deadline, m, &m->stop_deadline);
  check_stopped(m);
}

void ah__sessions_free(ah_sessions *m) {
  if (!m)
    return;
  while (!ah__list_empty(&m->requests))
    request_free(AH__CONTAINER(m->requests.next, request, link));
  json_decref(m->resolved);
  json_decref(m->resolved_order);
  json_decref(m->retry);
  ah__echo_provider_free(m->echo);
  free(m->store_path);
  free(m);
}

ah_store *ah__sessions_store(ah_sessions *m) {
  return store_of(m);
}
size_t ah__sessions_live(ah_sessions *m) {
  return m->nlive;
}
size_t ah__sessions_loads(ah_sessions *m) {
  return m->loads;
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
  lookup(m, id, cb, arg);
}

void ah__session_hold(ah_session *s) {
  s->holds++;
}

void ah__session_release(ah_session *s) {
  s->holds--;
  free_if_unused(s);
}

const char *ah__session_id(const ah_session *s) {
  return s ? s->id : NULL;
}

json_t *ah__session_info(ah_session *s) {
  if (!s)
    return NULL;
  json_t *r = public_row(s->row, status_of(s));
  json_t *pending = json_array();
  AH__LIST_EACH(it, &s->m->requests) {
    request *q = AH__CONTAINER(it, request, link);
    if (strcmp(q->session_id, s->id) == 0)
      json_array_append_new(pending,
                            json_pack("{s:s, s:s, s:s?}", "id", q->id, "kind", q->kind, "tool", q->tool));
  }
  json_object_set_new(r, "pending", pending);
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
        if (!ah__tool_known(tool) || !val ||
            (strcmp(val, "allow") != 0 && strcmp(val, "ask") != 0 && strcmp(val, "deny") != 0))
          return AH_EINVAL;
      }
    } else {
      return AH_EINVAL;
    }
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
  update_row(s, set);
  return 0;
}
