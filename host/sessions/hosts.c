/* Several hosts on one store (docs/scaling.md). Active when the store has signals (PostgreSQL); on SQLite
 * nothing here runs and every path is the single-host one.
 *
 * - The follower: this host reads the events table in cursor order (cursors are numbered in commit order
 *   across hosts) from where it stood at start, woken by the store's "events" signal (and every second in
 *   case one was missed), and publishes every session.event from those rows — its own sessions' and the
 *   sessions other hosts run alike — so that its surfaces see one order, gap-free by cursor. This host's
 *   other bus events (statuses, requests, deltas) wait behind the events it committed before them (they
 *   are keyed by the highest cursor it had committed when they were emitted). For a session run elsewhere
 *   the follower also publishes its status (turn/started, turn/ended) and, on the owner's "request:" signal,
 *   its requests (request.pending, request.resolved).
 * - Posting: a prompt, cancel or approval answer for a session another live host owns is written to the
 *   store — a "posted" inbox row (a cancel's content is {"cancel": true}), or the request's row — and
 *   acknowledged once committed; the owner is signalled ("inbox:ID", "answer:ID:REQUEST") and takes it in:
 *   a posted prompt becomes a queued one with its inbox/received event, in the owner's seq order.
 * - The sweep (each lease heartbeat, after a post, after signals were missed): a session with posted rows
 *   whose lease is free or expired is taken over here (its recovery takes the rows in); one live here takes
 *   them in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"

#define PAGE 256
#define POLL_MS 1000

typedef struct held {
  char *name;
  json_t *data;
  int64_t key; /* published once the follower has read every event up to this cursor */
  struct held *next;
} held;

struct ah_hosts {
  ah_sessions *m;
  int64_t cursor;      /* the follower: every event up to here was published */
  int64_t committed;   /* the highest cursor this host committed */
  held *head, *tail;   /* bus events waiting for the follower */
  ah_timer *soon;      /* a pull on the next loop turn */
  ah_timer *poll;      /* the periodic pull (a missed signal) */
  json_t *remote_reqs; /* {sessionId: {requestId: true}}: pending requests of sessions run elsewhere */
  bool ready;          /* the cursor to start from was read */
  bool pulling;        /* a read of the events table is in flight */
  bool again;          /* pull again once it is back (woken meanwhile) */
  bool final;          /* the host stops: once read, every held bus event is published */
  bool sweeping;       /* a read of the posted rows is in flight */
  bool sweep_again;    /* sweep again once it is back */
  bool stopped;
};

static void pull(ah_hosts *h);

bool ah__hosts_active(const ah_sessions *m) {
  return m->hosts && !m->hosts->stopped;
}

/* Whether this host runs session `sid`: loaded and holding its lease (a session being loaded here, maybe
 * only to find that another host holds it, does not count). */
bool ah__hosts_runs_here(ah_sessions *m, const char *sid) {
  session *s = ah__live_find(m, sid);
  return s && s->ready && !s->lost && !s->broken;
}

/* ---- the outbox: this host's bus events in cursor order -------------------------------------------------
 */

static void release(ah_hosts *h, int64_t upto) {
  while (h->head && h->head->key <= upto) {
    held *x = h->head;
    h->head = x->next;
    if (!h->head)
      h->tail = NULL;
    ah__host_emit(h->m->host, x->name, x->data);
    free(x->name);
    free(x);
  }
}

static void soon_tick(ah_timer *t, void *arg) {
  (void)t;
  ah_hosts *h = arg;
  h->soon = NULL;
  pull(h);
}

static void pull_soon(ah_hosts *h) {
  if (!h->soon && !h->stopped)
    ah__services_timer_start(h->m->core, 0, 0, soon_tick, h, &h->soon);
}

/* A local event was committed at `cursor`: the follower publishes it (not the writer). */
void ah__hosts_committed(ah_sessions *m, int64_t cursor) {
  ah_hosts *h = m->hosts;
  if (cursor > h->committed)
    h->committed = cursor;
  pull_soon(h);
}

/* Hold a bus event until the follower has published every event up to cursor `key`; false when out of
 * memory. */
static bool hold_until(ah_hosts *h, const char *name, json_t *data, int64_t key) {
  held *x = calloc(1, sizeof *x);
  if (!x || !(x->name = strdup(name))) {
    free(x);
    return false;
  }
  x->data = data;
  x->key = key;
  if (h->tail)
    h->tail->next = x;
  else
    h->head = x;
  h->tail = x;
  pull_soon(h);
  return true;
}

/* A bus event of this host: published now when nothing it follows is still unread, else held. Returns
 * false when the caller publishes it itself. */
bool ah__hosts_hold(ah_sessions *m, const char *name, json_t *data) {
  ah_hosts *h = m->hosts;
  if (!h || h->stopped || (!h->head && h->committed <= h->cursor))
    return false;
  return hold_until(h, name, data, h->committed);
}

/* ---- the follower
 * ------------------------------------------------------------------------------------------ */

/* What the bus of this host says of an event of a session run elsewhere, besides session.event. */
static void remote_extras(ah_hosts *h, const json_t *e) {
  const char *sid = str(e, "sessionId");
  const char *kind = str(e, "kind");
  if (!sid || !kind || ah__hosts_runs_here(h->m, sid))
    return;
  const char *status = strcmp(kind, "turn/started") == 0 ? "running"
                       : strcmp(kind, "turn/ended") == 0 ? "idle"
                                                         : NULL;
  if (status)
    ah__host_emit(h->m->host, "session.status", json_pack("{s:s, s:s}", "sessionId", sid, "status", status));
}

static void pull_read(ah_hosts *h);

/* A page of the events table was read: each event is published in cursor order, with the bus events held
 * behind it; a full page (or a wake-up meanwhile) is followed by the next read. */
static void pulled(int status, const json_t *results, void *arg) {
  ah_hosts *h = arg;
  h->pulling = false;
  const json_t *page = status == 0 ? json_array_get(results, 0) : NULL;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(page, i, e) {
    int64_t c = json_integer_value(json_object_get(e, "cursor"));
    release(h, c - 1);
    ah__host_emit(h->m->host, "session.event",
                  json_pack("{s:s, s:O}", "sessionId", str(e, "sessionId"), "event", e));
    remote_extras(h, e);
    h->cursor = c;
  }
  release(h, h->cursor);
  /* A failed read waits for the next signal or poll. */
  if (status == 0 && (json_array_size(page) == PAGE || h->again))
    pull_read(h);
  else if (h->final)
    release(h, INT64_MAX);
}

static void pull_read(ah_hosts *h) {
  h->again = false;
  ah_store *store = ah__sm_store(h->m);
  ah_store_query q = {.kind = AH_STORE_Q_EVENTS_AFTER, .after = h->cursor, .limit = PAGE};
  h->pulling = store && ah__store_read(store, &q, 1, pulled, h) == 0;
  if (!h->pulling && h->final)
    release(h, INT64_MAX);
}

static void pull(ah_hosts *h) {
  if (h->stopped || !h->ready)
    return;
  if (h->pulling)
    h->again = true;
  else
    pull_read(h);
}

static void start_cursor(ah_hosts *h);

static void poll_tick(ah_timer *t, void *arg) {
  (void)t;
  ah_hosts *h = arg;
  if (!h->ready)
    start_cursor(h);
  pull(h);
}

/* ---- requests of sessions run elsewhere
 * --------------------------------------------------------------------- */

typedef struct reqs_ctx {
  ah_hosts *h;
  char sid[64];
} reqs_ctx;

/* The rows of the requests that are no longer pending: request.resolved with their state. */
static void resolved_read(int status, const json_t *results, void *arg) {
  reqs_ctx *c = arg;
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(status == 0 ? results : NULL, i, row) {
    if (!json_is_object(row))
      continue;
    json_t *ev = json_pack("{s:s, s:s, s:s}", "id", str(row, "id"), "sessionId", c->sid, "state",
                           str(row, "state") ? str(row, "state") : "cancelled");
    if (json_is_object(json_object_get(row, "answer")))
      json_object_set(ev, "answer", json_object_get(row, "answer"));
    ah__host_emit(c->h->m->host, "request.resolved", ev);
  }
  free(c);
}

/* The pending requests of a session run elsewhere, and the highest cursor read after them: each new one is
 * published once the follower has published the events before it (a tool/call before its approval); those
 * no longer pending are read to be published as resolved. */
static void pending_read(int status, const json_t *results, void *arg) {
  reqs_ctx *c = arg;
  ah_hosts *h = c->h;
  ah_sessions *m = h->m;
  if (status || h->stopped || ah__hosts_runs_here(m, c->sid)) {
    free(c);
    return;
  }
  const json_t *pending = json_array_get(results, 0);
  int64_t upto = json_integer_value(json_array_get(results, 1));
  json_t *known = json_object_get(h->remote_reqs, c->sid);
  if (!known) {
    known = json_object();
    json_object_set_new(h->remote_reqs, c->sid, known);
  }
  json_t *now = json_object();
  size_t i = 0;
  json_t *r = NULL;
  json_array_foreach(pending, i, r) {
    const char *id = str(r, "id");
    json_object_set_new(now, id, json_true());
    if (!json_object_get(known, id)) {
      json_t *req = json_pack("{s:s, s:s, s:O, s:s, s:O, s:O, s:s}", "id", id, "sessionId", c->sid, "turnId",
                              json_object_get(r, "turnId"), "kind", str(r, "kind"), "params",
                              json_object_get(r, "params"), "options", json_object_get(r, "options"), "state",
                              "pending");
      json_t *data = json_pack("{s:o}", "request", req);
      if (upto <= h->cursor || !hold_until(h, "request.pending", data, upto))
        ah__host_emit(m->host, "request.pending", data);
    }
  }
  size_t n = 0;
  ah_store_query *q = calloc(json_object_size(known) + 1, sizeof *q);
  const char *id = NULL;
  json_t *v = NULL;
  json_object_foreach(known, id, v) {
    if (q && !json_object_get(now, id))
      q[n++] = (ah_store_query){.kind = AH_STORE_Q_REQUEST, .id = id};
  }
  reqs_ctx *c2 = n ? malloc(sizeof *c2) : NULL;
  if (c2) {
    *c2 = *c;
    if (ah__store_read(ah__sm_store(m), q, n, resolved_read, c2) != 0)
      free(c2);
  }
  free(q);
  if (json_object_size(now))
    json_object_set_new(h->remote_reqs, c->sid, now);
  else {
    json_decref(now);
    json_object_del(h->remote_reqs, c->sid);
  }
  free(c);
}

static void remote_requests(ah_hosts *h, const char *sid) {
  ah_sessions *m = h->m;
  if (ah__hosts_runs_here(m, sid))
    return; /* this host's own requests are published where they are made */
  reqs_ctx *c = calloc(1, sizeof *c);
  if (!c)
    return;
  c->h = h;
  snprintf(c->sid, sizeof c->sid, "%s", sid);
  /* The requests first, then the last cursor: every event committed before them is at or below it. */
  ah_store_query q[2] = {{.kind = AH_STORE_Q_REQUESTS_PENDING, .id = c->sid},
                         {.kind = AH_STORE_Q_LAST_CURSOR}};
  if (ah__store_read(ah__sm_store(m), q, 2, pending_read, c) != 0)
    free(c);
  pull(h);
}

/* Of the pending requests `rows` (the store's), those of sessions run elsewhere (request.list). New
 * reference. */
json_t *ah__hosts_requests(ah_sessions *m, const json_t *rows) {
  json_t *out = json_array();
  size_t i = 0;
  json_t *r = NULL;
  json_array_foreach(rows, i, r) {
    if (ah__hosts_runs_here(m, str(r, "sessionId")))
      continue;
    json_array_append_new(
        out, json_pack("{s:O, s:O, s:O, s:O, s:O, s:O, s:s}", "id", json_object_get(r, "id"), "sessionId",
                       json_object_get(r, "sessionId"), "turnId", json_object_get(r, "turnId"), "kind",
                       json_object_get(r, "kind"), "params", json_object_get(r, "params"), "options",
                       json_object_get(r, "options"), "state", "pending"));
  }
  return out;
}

/* ---- posted rows: taken in by the owner -------------------------------------------------------------------
 */

static bool known_here(session *s, const char *mid) {
  if (s->turn && s->turn->message_id && strcmp(s->turn->message_id, mid) == 0)
    return true;
  AH__LIST_EACH(it, &s->queue) {
    queued *q = AH__CONTAINER(it, queued, link);
    if (strcmp(q->message_id, mid) == 0)
      return true;
  }
  return false;
}

static void adopt(session *s, const json_t *open);

static void inbox_read(int status, const json_t *results, void *arg) {
  session *s = arg;
  s->holds--;
  if (status == 0 && !s->disposed && ah__hosts_runs_here(s->m, s->id))
    adopt(s, json_array_get(results, 0));
  ah__live_free_if_unused(s);
}

/* Take in the posted rows of live session `s` (its owner): a prompt becomes a queued one (inbox/received in
 * this host's seq order, the row "queued"), a cancel cancels the running turn (the row "done"). `rows`:
 * its open inbox rows (NULL: they are read first). */
void ah__hosts_adopt(session *s, const json_t *rows) {
  if (rows) {
    adopt(s, rows);
    return;
  }
  s->holds++;
  ah_store_query q = {.kind = AH_STORE_Q_INBOX_OPEN, .id = s->id};
  if (ah__store_read(ah__sm_store(s->m), &q, 1, inbox_read, s) != 0)
    s->holds--;
}

static void adopt(session *s, const json_t *open) {
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(open, i, row) {
    const char *mid = str(row, "messageId");
    const char *state = str(row, "state");
    if (!mid || !state || strcmp(state, "posted") != 0 || known_here(s, mid))
      continue;
    json_t *content = json_object_get(row, "content");
    if (json_is_object(content) && json_is_true(json_object_get(content, "cancel"))) {
      if (s->turn && s->turn->cancel && !s->turn->ended)
        ah__cancel_trip(s->turn->cancel);
      ah__write_ops(s, json_pack("[{s:s, s:s, s:s}]", "op", "inbox.state", "messageId", mid, "state", "done"),
                    NULL, NULL, NULL, NULL, NULL, NULL);
      continue;
    }
    AH_LOG_D(LOG, "session %s: takes in prompt %s posted by another host", s->id, mid);
    ah__live_enqueue_as(
        s, mid, json_incref(content),
        json_pack("[{s:s, s:s, s:s}]", "op", "inbox.state", "messageId", mid, "state", "queued"), s->ready,
        NULL, NULL);
  }
}

static void swept(int status, session *s, void *arg) {
  (void)s;
  char *id = arg;
  if (status == 0)
    AH_LOG_I(LOG, "session %s: taken over here for a prompt posted while no host ran it", id);
  else if (status != AH_EAGENTBUSY)
    AH_LOG_W(LOG, "session %s has posted prompts but cannot be taken here: %s", id, ah_strerror(status));
  free(id);
}

/* Sessions with posted rows: taken in where they run here, taken over where no host holds them. */
static void posted_read(int status, const json_t *results, void *arg) {
  ah_sessions *m = arg;
  m->hosts->sweeping = false;
  if (m->hosts->sweep_again) {
    m->hosts->sweep_again = false;
    ah__hosts_sweep(m);
  }
  if (status || !ah__hosts_active(m) || m->stopping)
    return;
  const json_t *rows = json_array_get(results, 0);
  size_t i = 0;
  json_t *r = NULL;
  json_array_foreach(rows, i, r) {
    const char *id = str(r, "id");
    if (ah__hosts_runs_here(m, id))
      ah__hosts_adopt(ah__live_find(m, id), NULL);
    else if (!ah__live_find(m, id) && m->recover_on_start && json_is_true(json_object_get(r, "free")))
      ah__live_lookup(m, id, swept, strdup(id)); /* a daemon, not a stdio child serving its own client */
  }
}

void ah__hosts_sweep(ah_sessions *m) {
  if (!ah__hosts_active(m) || m->stopping)
    return;
  ah_hosts *h = m->hosts;
  if (h->sweeping) { /* one read at a time: a store that does not answer does not pile them up */
    h->sweep_again = true;
    return;
  }
  ah_store_query q = {.kind = AH_STORE_Q_POSTED};
  h->sweeping = ah__store_read(ah__sm_store(m), &q, 1, posted_read, m) == 0;
}

/* ---- signals
 * ------------------------------------------------------------------------------------------------- */

static void on_signal(const char *payload, void *arg) {
  ah_hosts *h = arg;
  ah_sessions *m = h->m;
  if (h->stopped || m->stopping)
    return;
  if (strcmp(payload, "events") == 0) {
    pull(h);
  } else if (strncmp(payload, "inbox:", 6) == 0) {
    if (ah__hosts_runs_here(m, payload + 6))
      ah__hosts_adopt(ah__live_find(m, payload + 6), NULL);
  } else if (strncmp(payload, "answer:", 7) == 0) {
    const char *rid = strchr(payload + 7, ':');
    request *r = rid ? ah__request_find(m, rid + 1) : NULL;
    if (r)
      ah__request_adopt(r);
  } else if (strncmp(payload, "request:", 8) == 0) {
    remote_requests(h, payload + 8);
  } else if (strcmp(payload, "*") == 0) { /* signals may have been missed */
    pull(h);
    ah__hosts_sweep(m);
    json_t *ids = json_array();
    AH__LIST_EACH(it, &m->requests) {
      json_array_append_new(ids, json_string(AH__CONTAINER(it, request, link)->id));
    }
    size_t i = 0;
    json_t *id = NULL;
    json_array_foreach(ids, i, id) {
      request *r = ah__request_find(m, json_string_value(id));
      if (r)
        ah__request_adopt(r);
    }
    json_decref(ids);
  }
}

/* ---- posting (a host that does not own the session)
 * ----------------------------------------------------------- */

typedef struct post_ctx {
  ah_sessions *m;
  ah_call *call;
  char sid[64];
  char mid[37];
  bool cancel;
  bool running;
} post_ctx;

static void posted(int status, const json_t *results, void *arg) {
  (void)results;
  post_ctx *p = arg;
  if (status)
    ah__call_error(p->call, status,
                   p->cancel ? "the cancel could not be stored" : "the prompt could not be stored", NULL);
  else if (p->cancel)
    ah__call_reply(p->call, json_pack("{s:b}", "cancelled", p->running));
  else
    ah__call_reply(p->call, json_pack("{s:s, s:s}", "sessionId", p->sid, "messageId", p->mid));
  /* The owner may have gone meanwhile: a session no host holds is taken over here. */
  if (status == 0)
    ah__hosts_sweep(p->m);
  free(p);
}

static void post(ah_sessions *m, const char *sid, json_t *content, bool cancel, bool running, ah_call *call) {
  post_ctx *p = calloc(1, sizeof *p);
  if (!p) {
    json_decref(content);
    ah__call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  p->m = m;
  p->call = call;
  p->cancel = cancel;
  p->running = running;
  snprintf(p->sid, sizeof p->sid, "%s", sid);
  ah__uuid7(p->mid);
  char now[32], signal[96];
  ah__time_rfc3339(now);
  snprintf(signal, sizeof signal, "inbox:%s", sid);
  json_t *ops = json_pack("[{s:s, s:s, s:s, s:o, s:s, s:s}, {s:s, s:s}]", "op", "inbox.put", "messageId",
                          p->mid, "sessionId", sid, "content", content, "time", now, "state", "posted", "op",
                          "notify", "payload", signal);
  int rc = ah__store_write(ah__sm_store(m), ops, posted, p);
  if (rc)
    posted(rc, NULL, p);
}

void ah__hosts_post_prompt(ah_sessions *m, const char *sid, json_t *content, ah_call *call) {
  post(m, sid, content, false, false, call);
}

void ah__hosts_post_cancel(ah_sessions *m, const json_t *row, ah_call *call) {
  post(m, str(row, "id"), json_pack("{s:b}", "cancel", 1), true,
       str(row, "status") && strcmp(str(row, "status"), "running") == 0, call);
}

static void answered(int status, const json_t *results, void *arg) {
  (void)results;
  ah_call *call = arg;
  if (status == AH_ESTATE)
    ah__call_reply(call, json_pack("{s:b, s:s}", "accepted", 0, "reason", "resolved"));
  else if (status)
    ah__call_error(call, status, "the answer could not be stored", NULL);
  else
    ah__call_reply(call, json_pack("{s:b}", "accepted", 1));
}

/* An answer to a pending request of a session run elsewhere: the request's row takes it (the first answer
 * wins in the store), and the owner is signalled to act on it. */
void ah__hosts_answer(ah_sessions *m, const json_t *row, const char *state, json_t *answer, ah_call *call) {
  const char *sid = str(row, "sessionId");
  char signal[160];
  snprintf(signal, sizeof signal, "answer:%s:%s", sid, str(row, "id"));
  json_t *ops = ah__request_state_ops(m, str(row, "id"), sid, state, answer);
  json_decref(answer);
  json_array_append_new(ops, json_pack("{s:s, s:s}", "op", "notify", "payload", signal));
  int rc = ah__store_write(ah__sm_store(m), ops, answered, call);
  if (rc)
    answered(rc, NULL, call);
}

/* ---- start / stop
 * ------------------------------------------------------------------------------------------------ */

/* Where the follower starts: the highest cursor stored now (read again until it is read). */
static void cursor_read(int status, const json_t *results, void *arg) {
  ah_hosts *h = arg;
  if (h->ready || h->stopped)
    return;
  if (status) {
    AH_LOG_W(LOG, "a shared store: the last event cursor could not be read; trying again");
    return; /* the poll tries again */
  }
  int64_t last = json_integer_value(json_array_get(results, 0));
  h->cursor = last > 0 ? last : 0;
  h->ready = true;
  AH_LOG_I(LOG, "a shared store: following the events of every host from cursor %lld", (long long)h->cursor);
  pull(h); /* this host's own commits meanwhile */
}

static void start_cursor(ah_hosts *h) {
  ah_store_query q = {.kind = AH_STORE_Q_LAST_CURSOR};
  ah__store_read(ah__sm_store(h->m), &q, 1, cursor_read, h);
}

void ah__hosts_start(ah_sessions *m) {
  ah_store *store = m->store;
  if (m->hosts || !store || !m->core || !ah__store_signals(store))
    return;
  ah_hosts *h = calloc(1, sizeof *h);
  if (!h)
    return;
  h->m = m;
  h->remote_reqs = json_object();
  m->hosts = h;
  int rc = ah__store_watch(store, on_signal, h);
  if (rc)
    AH_LOG_W(LOG, "the store's signals cannot be watched (%s): other hosts are followed every second",
             ah_strerror(rc));
  ah__services_timer_start(m->core, POLL_MS, POLL_MS, poll_tick, h, &h->poll);
  start_cursor(h);
}

/* Before the store closes: what was committed is published, then every held bus event. */
void ah__hosts_stop(ah_sessions *m) {
  ah_hosts *h = m->hosts;
  if (!h || h->stopped)
    return;
  /* A last read (behind one in flight) publishes what was committed; then every held bus event goes. */
  h->final = true;
  if (h->pulling)
    h->again = true;
  else if (h->ready)
    pull_read(h);
  else
    release(h, INT64_MAX);
  h->stopped = true;
  if (h->soon)
    ah__services_timer_stop(h->soon);
  if (h->poll)
    ah__services_timer_stop(h->poll);
  h->soon = h->poll = NULL;
}

void ah__hosts_free(ah_sessions *m) {
  ah_hosts *h = m->hosts;
  if (!h)
    return;
  while (h->head) {
    held *x = h->head;
    h->head = x->next;
    json_decref(x->data);
    free(x->name);
    free(x);
  }
  json_decref(h->remote_reqs);
  free(h);
  m->hosts = NULL;
}
