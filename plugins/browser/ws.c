/* agenthost browser plugin — the two downlink WebSockets (PROTOCOLS.md API-WS-HOST; DECISIONS.md "Browser
 * envelopes").
 *
 * Both are downlink only: a client data frame closes the socket with 1008. Every frame is a server-request
 * envelope. Each socket has a bounded queue (ws_queue_bytes): a consumer that lets it fill is closed with
 * 1013 instead of growing memory. libwebsockets pings idle sockets (the vhost's retry policy).
 *
 * /api/ws/mux?after=CURSOR carries every session's events. With `after`, the stored events after the cursor
 * are replayed first (core method session.events, page by page as the queue drains) while live frames are
 * held; when a page comes back short the held frames follow, minus those the replay already sent (by
 * cursor), so the stream is gap-free and has no duplicate. Live session.event frames carry the event's
 * cursor and seq; transient frames (deltas, status) carry the last cursor.
 *
 * /api/ws/host carries the pending server requests first on every connect (core request.list), then
 * approvals/questions as they come (replyRequired: true, rpcId = the core request id), request.resolved,
 * plugin and session lifecycle events, and the remote plugin's forwarded events as host/remote-event
 * {name, args}. A source that fails sends `stream/error` and the socket closes (1011).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "browser.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#define REPLAY_PAGE 500
/* A burst of this many bytes queued gives the heap back once it has drained (trim_fired). */
#define BURST_TRIM (1u << 20)
/* A batched message holds the envelopes queued for its socket up to this much text (at least one). */
#define BATCH_MAX (256u << 10)

/* ---- frames and queues -----------------------------------------------------------------------------------
 *
 * An event is serialized once into one frame, and every socket it goes to queues a reference to it. The
 * bytes of the distinct frames queued anywhere are st->ws_bytes, bounded by ws_budget_bytes. */

/* A new frame holding one reference (its maker's), or NULL. */
static bp_frame *frame_new(bp_state *st, const char *text, size_t len, int64_t cursor, const char *rid) {
  bp_frame *f = malloc(sizeof *f + LWS_PRE + len);
  if (!f)
    return NULL;
  f->refs = 1;
  f->cursor = cursor;
  snprintf(f->rid, sizeof f->rid, "%s", rid ? rid : "");
  f->len = len;
  memcpy(f->data + LWS_PRE, text, len);
  st->ws_bytes += len;
  if (st->ws_bytes > st->ws_peak)
    st->ws_peak = st->ws_bytes;
  return f;
}

static void schedule_trim(bp_state *st);

static void frame_unref(bp_state *st, bp_frame *f) {
  if (f && --f->refs == 0) {
    st->ws_bytes -= f->len;
    free(f);
    if (st->ws_bytes == 0 && st->ws_peak >= BURST_TRIM) {
      st->ws_peak = 0;
      schedule_trim(st);
    }
  }
}

/* Append a reference to `f`; false when out of memory. */
static bool fq_push(bp_fq *q, bp_frame *f) {
  if (q->n == q->cap) {
    size_t cap = q->cap ? q->cap * 2 : 16;
    bp_frame **v = malloc(cap * sizeof *v);
    if (!v)
      return false;
    for (size_t i = 0; i < q->n; i++)
      v[i] = q->v[(q->head + i) % q->cap];
    free(q->v);
    q->v = v;
    q->cap = cap;
    q->head = 0;
  }
  q->v[(q->head + q->n) % q->cap] = f;
  q->n++;
  q->bytes += f->len;
  f->refs++;
  return true;
}

/* The i-th frame from the oldest. */
static bp_frame *fq_at(const bp_fq *q, size_t i) {
  return q->v[(q->head + i) % q->cap];
}

/* Take the oldest frame off; the caller gets its reference. */
static bp_frame *fq_shift(bp_fq *q) {
  bp_frame *f = q->v[q->head];
  q->head = (q->head + 1) % q->cap;
  q->n--;
  q->bytes -= f->len;
  return f;
}

/* Drop every reference and the ring itself. */
static void fq_clear(bp_state *st, bp_fq *q) {
  while (q->n)
    frame_unref(st, fq_shift(q));
  free(q->v);
  memset(q, 0, sizeof *q);
}

/* The envelope text of a frame (malloc'ed). cursor < 0: none; seq < 0: none. */
static char *frame_text(bp_state *st, const char *method, const json_t *payload, bool reply,
                        const char *rpc_id, int64_t cursor, int64_t seq) {
  char id[32];
  if (!rpc_id) {
    snprintf(id, sizeof id, "p%llu", (unsigned long long)++st->next_frame);
    rpc_id = id;
  }
  json_t *env = json_pack("{s:s, s:s, s:s, s:O, s:b}", "kind", "server-request", "rpcId", rpc_id, "method",
                          method, "payload", payload ? payload : json_null(), "replyRequired", reply);
  if (!env)
    return NULL;
  if (cursor >= 0)
    json_object_set_new(env, "cursor", json_integer(cursor));
  if (seq >= 0)
    json_object_set_new(env, "seq", json_integer(seq));
  char *text = json_dumps(env, JSON_COMPACT);
  json_decref(env);
  return text;
}

/* When the last WebSocket has closed, or a burst of at least BURST_TRIM bytes queued has drained, hand the
 * freed heap back to the system: glibc keeps freed memory of a fan-out (frame queues of a hundred clients)
 * mapped otherwise, and a daemon's RSS would stay at its peak. A second later, on the loop thread, if
 * nothing is queued again by then. */
static void trim_fired(ah_timer *t, void *arg) {
  (void)t;
  bp_state *st = arg;
  st->trim_timer = NULL;
#ifdef __GLIBC__
  if ((st->nws == 0 || st->ws_bytes == 0) && !st->withdrawing)
    malloc_trim(0);
#endif
}

static void schedule_trim(bp_state *st) {
  if (!st->trim_timer && !st->withdrawing)
    st->api->timer_start(st->m, 1000, 0, trim_fired, st, &st->trim_timer);
}

static void ws_unlink(bp_ws *w) {
  bp_state *st = w->st;
  if (w->rec)
    st->api->record_close(w->rec, false);
  w->rec = NULL;
  if (!w->linked)
    return;
  if (w->prev)
    w->prev->next = w->next;
  else
    st->ws = w->next;
  if (w->next)
    w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->linked = false;
  st->nws--;
  if (w->kind == BP_WS_MUX && --st->nmux == 0)
    bp_follow_drop_all(st); /* no tab is open: nothing is shown */
  if (st->nws == 0)
    schedule_trim(st);
}

static void ws_free(bp_ws *w) {
  fq_clear(w->st, &w->q);
  fq_clear(w->st, &w->held);
  json_decref(w->listed);
  w->magic = 0;
  free(w);
}

void bp_ws_destroy(bp_ws *w) {
  ws_unlink(w);
  w->wsi = NULL;
  if (w->calls > 0) {
    w->destroyed = true; /* the reply of the call in flight frees it */
    return;
  }
  ws_free(w);
}

/* Drop a hold; true when `w` is still allocated (and not destroyed). */
static bool release_hold(bp_ws *w) {
  w->calls--;
  w->st->outstanding--;
  if (w->destroyed) {
    if (w->calls == 0)
      ws_free(w);
    return false;
  }
  return true;
}

/* Drop a call's hold on the socket; true when the socket is still usable. */
static bool call_done(bp_ws *w) {
  return release_hold(w) && w->wsi && !w->closing;
}

static void drop_queues(bp_ws *w) {
  fq_clear(w->st, &w->q);
  fq_clear(w->st, &w->held);
}

/* Close from outside libwebsockets' callbacks (a bus event, a call's reply, a posted task): the close frame
 * with `code` goes out, then the socket is killed synchronously (STACK-NOTES "Closing"). `w` may be freed on
 * return. */
static void ws_close(bp_ws *w, int code, const char *why) {
  if (!w->wsi || w->closing)
    return;
  w->closing = true;
  drop_queues(w);
  struct lws *wsi = w->wsi;
  lws_close_reason(wsi, (enum lws_close_status)code, (unsigned char *)why, strlen(why));
  lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC);
}

static void close_posted(void *arg);

static void close_deadline(ah_timer *t, void *arg) {
  (void)t;
  bp_ws *w = arg;
  w->close_timer = NULL;
  if (!release_hold(w) || !w->wsi || !w->close_code)
    return;
  /* The peer never read enough for the close frame to go out: drop the connection. */
  w->close_code = 0;
  lws_set_timeout(w->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC);
}

/* A close that must reach a peer whose socket is full (1013): stop queueing, drop what is queued, and send
 * the close frame once libwebsockets reports the socket writable again (its own partial frame flushed), from
 * a posted task; a peer that does not read for 10 s more is dropped without it. */
static void ws_close_when_drained(bp_ws *w, int code) {
  bp_state *st = w->st;
  if (!w->wsi || w->closing)
    return;
  w->closing = true;
  w->close_code = code;
  drop_queues(w);
  if (st->api->timer_start(st->m, 10000, 0, close_deadline, w, &w->close_timer) == 0) {
    w->calls++;
    st->outstanding++;
  }
  lws_callback_on_writable(w->wsi);
}

static void want_write(bp_ws *w) {
  if (!w->want_write) {
    w->want_write = true;
    lws_callback_on_writable(w->wsi);
  }
}

/* Queue a reference to frame `f` for sending (the caller keeps its own). Returns false when the socket was
 * closed instead (1013, slow consumer; 1011 out of memory). `bounded`: live frames are; replayed ones are
 * paced by the replay instead. */
static bool send_frame(bp_ws *w, bp_frame *f, bool bounded) {
  bp_state *st = w->st;
  if (w->closing || !w->wsi)
    return false;
  if (bounded && w->q.n > 0 && w->q.bytes + f->len > st->ws_queue_max) {
    st->api->log(st->m, AH_PLOG_WARN, "closing WebSocket %llu: slow consumer (%zu bytes queued)",
                 (unsigned long long)w->id, w->q.bytes);
    ws_close_when_drained(w, 1013);
    return false;
  }
  if (!fq_push(&w->q, f)) {
    ws_close_when_drained(w, 1011);
    return false;
  }
  if (f->cursor > w->sent_cursor)
    w->sent_cursor = f->cursor;
  want_write(w);
  return true;
}

/* Hold a reference to a live frame while the replay (mux) or the listing (host) runs. */
static void hold_frame(bp_ws *w, bp_frame *f) {
  if (w->held.bytes + f->len > w->st->ws_queue_max || !fq_push(&w->held, f)) {
    /* Every held session.event is in the store: drop them and read it again. */
    fq_clear(w->st, &w->held);
    w->replay_dropped = true;
  }
}

/* The downlink budget (ws_budget_bytes): while the frames queued on all sockets together take more, the
 * consumer furthest behind (most bytes queued) is closed 1013, then the next. A frame several sockets
 * share is freed when the last of them lets it go. */
static void enforce_budget(bp_state *st) {
  while (st->ws_budget_max && st->ws_bytes > st->ws_budget_max) {
    bp_ws *slow = NULL;
    for (bp_ws *w = st->ws; w; w = w->next)
      if (!w->closing && w->q.bytes + w->held.bytes > 0 &&
          (!slow || w->q.bytes + w->held.bytes > slow->q.bytes + slow->held.bytes))
        slow = w;
    if (!slow)
      return;
    st->api->log(st->m, AH_PLOG_WARN,
                 "closing WebSocket %llu: the downlink budget is spent (%zu bytes queued on all sockets; "
                 "this one the furthest behind, %zu bytes)",
                 (unsigned long long)slow->id, st->ws_bytes, slow->q.bytes + slow->held.bytes);
    ws_close_when_drained(slow, 1013);
    if (!slow->closing) /* it could not be closed (no socket): stop rather than pick it again */
      return;
  }
}

static void stream_error(bp_ws *w, const char *source, int status, const char *message) {
  bp_state *st = w->st;
  json_t *payload = json_pack("{s:s, s:s, s:s}", "source", source, "code", ah_err_category(status), "message",
                              message ? message : ah_strerror(status));
  char *text = frame_text(st, "stream/error", payload, false, NULL, -1, -1);
  json_decref(payload);
  st->api->log(st->m, AH_PLOG_WARN, "WebSocket %llu: %s failed: %s", (unsigned long long)w->id, source,
               message ? message : ah_strerror(status));
  bp_frame *f = text ? frame_new(st, text, strlen(text), 0, NULL) : NULL;
  free(text);
  bool queued = f && send_frame(w, f, false);
  frame_unref(st, f);
  if (queued) {
    w->close_after_flush = true;
    return;
  }
  if (!f)
    ws_close(w, 1011, "stream failed");
}

/* ---- mux: replay, then live ------------------------------------------------------------------------------
 */

static void fetch_page(bp_ws *w);

static void flush_held(bp_ws *w) {
  bp_state *st = w->st;
  bp_fq held = w->held;
  memset(&w->held, 0, sizeof w->held);
  bool open = true;
  while (held.n) {
    bp_frame *f = fq_shift(&held);
    bool dup = (w->kind == BP_WS_MUX && f->cursor > 0 && f->cursor <= w->sent_cursor) ||
               (w->kind == BP_WS_HOST && f->rid[0] && json_object_get(w->listed, f->rid));
    if (open && !dup)
      open = send_frame(w, f, true);
    frame_unref(st, f);
  }
  fq_clear(st, &held);
  enforce_budget(st);
}

static void on_page(const ah_outcome *o, void *arg) {
  bp_ws *w = arg;
  if (!call_done(w))
    return;
  bp_state *st = w->st;
  if (o->status != 0) {
    stream_error(w, "session.events", o->status, o->message);
    return;
  }
  json_t *events = json_object_get(o->result, "events");
  st->api->log(st->m, AH_PLOG_DEBUG, "mux %llu: replay page after %lld: %zu event(s)",
               (unsigned long long)w->id, (long long)w->sent_cursor, json_array_size(events));
  size_t i = 0;
  json_t *ev = NULL;
  bool cut = false; /* the queue is full: the rest of the page comes again, after sent_cursor */
  json_array_foreach(events, i, ev) {
    int64_t cursor = json_integer_value(json_object_get(ev, "cursor"));
    if (cursor <= w->sent_cursor)
      continue;
    /* Bounded like live frames (finding 7: a page is 500 events of any size): at most ws_queue_bytes are
     * queued for the socket; the next page is read when it has drained (SERVER_WRITEABLE). */
    if (w->q.bytes > 0 && w->q.bytes >= st->ws_queue_max / 2) {
      cut = true;
      w->replay_limit = i < 1 ? 1 : (int)i; /* what fits: the next pages are read no larger */
      break;
    }
    json_t *payload = json_pack("{s:O?, s:O}", "sessionId", json_object_get(ev, "sessionId"), "event", ev);
    char *text = frame_text(st, "session.event", payload, false, NULL, cursor,
                            json_integer_value(json_object_get(ev, "seq")));
    json_decref(payload);
    bp_frame *f = text ? frame_new(st, text, strlen(text), cursor, NULL) : NULL;
    free(text);
    if (f)
      send_frame(w, f, false);
    frame_unref(st, f);
  }
  if (cut || json_array_size(events) >= (size_t)w->replay_limit || w->replay_dropped) {
    w->replay_dropped = false;
    /* Paced: the next page when the queue has drained (SERVER_WRITEABLE), at once when it is short. */
    if (w->q.bytes < st->ws_queue_max / 2)
      fetch_page(w);
    enforce_budget(st);
    return;
  }
  w->replaying = false;
  st->api->log(st->m, AH_PLOG_DEBUG, "mux %llu: replay done at cursor %lld; %zu byte(s) held",
               (unsigned long long)w->id, (long long)w->sent_cursor, w->held.bytes);
  flush_held(w);
}

static void fetch_page(bp_ws *w) {
  bp_state *st = w->st;
  if (w->calls > 0 || !w->replaying || w->closing)
    return;
  ah_caller c;
  json_t *params = json_pack("{s:I, s:i}", "after", (json_int_t)w->sent_cursor, "limit", w->replay_limit);
  int rc = st->api->dispatch(st->m, bp_caller(&c, false, w->id), "session.events", params, NULL, on_page, w);
  if (rc) {
    stream_error(w, "session.events", rc, NULL);
    return;
  }
  w->calls++;
  st->outstanding++;
}

/* ---- host: pending requests first ------------------------------------------------------------------------
 */

static bp_frame *request_frame(bp_state *st, const json_t *request) {
  const char *kind = json_string_value(json_object_get(request, "kind"));
  const char *id = json_string_value(json_object_get(request, "id"));
  const char *method = !kind || !id                    ? NULL
                       : strcmp(kind, "approval") == 0 ? "request.approval"
                       : strcmp(kind, "question") == 0 ? "request.question"
                                                       : NULL;
  if (!method)
    return NULL;
  char *text = frame_text(st, method, request, true, id, -1, -1);
  bp_frame *f = text ? frame_new(st, text, strlen(text), 0, id) : NULL;
  free(text);
  return f;
}

static void on_list(const ah_outcome *o, void *arg) {
  bp_ws *w = arg;
  if (!call_done(w))
    return;
  if (o->status != 0) {
    stream_error(w, "request.list", o->status, o->message);
    return;
  }
  w->listed = json_object();
  size_t i = 0;
  json_t *req = NULL;
  json_array_foreach(json_object_get(o->result, "requests"), i, req) {
    bp_frame *f = request_frame(w->st, req);
    if (!f)
      continue;
    json_object_set_new(w->listed, f->rid, json_true());
    send_frame(w, f, false);
    frame_unref(w->st, f);
  }
  w->listing = false;
  flush_held(w);
}

/* ---- libwebsockets callbacks -----------------------------------------------------------------------------
 */

static void close_posted(void *arg) {
  bp_ws *w = arg;
  if (!release_hold(w) || !w->wsi)
    return;
  int code = w->close_code ? w->close_code : 1011;
  w->close_code = 0;
  if (w->close_timer) {
    w->st->api->timer_stop(w->close_timer);
    w->close_timer = NULL;
    w->calls--;
    w->st->outstanding--;
  }
  w->closing = false;
  ws_close(w, code, code == 1013 ? "slow consumer" : "stream failed"); /* may free `w` */
}

/* SERVER_WRITEABLE: one message. A batched socket (?batch=1) gets every envelope queued, up to BATCH_MAX of
 * text, as one JSON array — a thousand events cost one write instead of a thousand; another gets the oldest
 * envelope alone. Each envelope is recorded as a frame of its own. -1 when the write failed. */
static int write_queued(bp_state *st, bp_ws *w, struct lws *wsi) {
  size_t k = 1, total = fq_at(&w->q, 0)->len;
  unsigned char *msg = fq_at(&w->q, 0)->data + LWS_PRE;
  if (w->batch) {
    total += 2;
    while (k < w->q.n && total + 1 + fq_at(&w->q, k)->len <= BATCH_MAX)
      total += 1 + fq_at(&w->q, k++)->len;
    if (st->wbuf_cap < LWS_PRE + total) {
      size_t cap = LWS_PRE + (total > BATCH_MAX ? total : BATCH_MAX);
      unsigned char *nb = malloc(cap);
      if (!nb)
        return -1;
      free(st->wbuf);
      st->wbuf = nb;
      st->wbuf_cap = cap;
    }
    msg = st->wbuf + LWS_PRE;
    unsigned char *p = msg;
    *p++ = '[';
    for (size_t i = 0; i < k; i++) {
      const bp_frame *f = fq_at(&w->q, i);
      if (i)
        *p++ = ',';
      memcpy(p, f->data + LWS_PRE, f->len);
      p += f->len;
    }
    *p++ = ']';
  }
  int n = lws_write(wsi, msg, total, LWS_WRITE_TEXT);
  for (size_t i = 0; i < k; i++) {
    bp_frame *f = fq_shift(&w->q);
    if (n >= 0 && w->rec)
      st->api->record(w->rec, true, (const char *)f->data + LWS_PRE, f->len, NULL);
    frame_unref(st, f);
  }
  if (w->q.n == 0 && w->q.cap > 64) {
    free(w->q.v); /* a burst's ring goes back */
    memset(&w->q, 0, sizeof w->q);
  }
  if (n < 0)
    return -1;
  w->frames_sent += k;
  return 0;
}

int bp_ws_confirm(bp_state *st, struct lws *wsi, const bf_decision *d) {
  bp_ws *w = calloc(1, sizeof *w);
  if (!w)
    return 1;
  w->magic = BP_WS_MAGIC;
  w->st = st;
  w->kind = d->route == BF_ROUTE_WS_MUX ? BP_WS_MUX : BP_WS_HOST;
  w->id = ++st->next_conn;
  char arg[64];
  const char *b = lws_get_urlarg_by_name(wsi, "batch=", arg, sizeof arg);
  if (!b)
    b = lws_get_urlarg_by_name(wsi, "batch", arg, sizeof arg);
  if (b) {
    if (strcmp(b, "0") != 0 && strcmp(b, "1") != 0) {
      free(w);
      bp_refuse_now(st, wsi, 400, "batch: 0 or 1 is required", NULL, false, true);
      return 1;
    }
    w->batch = b[0] == '1';
  }
  if (w->kind == BP_WS_MUX) {
    char buf[64];
    const char *v = lws_get_urlarg_by_name(wsi, "after=", buf, sizeof buf);
    if (!v)
      v = lws_get_urlarg_by_name(wsi, "after", buf, sizeof buf);
    if (v) {
      int64_t after = 0;
      if (!bf_mux_cursor(v, &after)) {
        free(w);
        bp_refuse_now(st, wsi, 400, "after: a cursor (integer >= 0) is required", NULL, false, true);
        return 1;
      }
      w->has_after = true;
      w->after = after;
    }
  }
  bp_conn *c = lws_get_opaque_user_data(wsi);
  if (c && c->magic == BP_CONN_MAGIC)
    free(c); /* the upgraded connection is identified by the socket from now on */
  lws_set_opaque_user_data(wsi, w);
  return 0;
}

static int on_established(bp_state *st, struct lws *wsi) {
  bp_ws *w = lws_get_opaque_user_data(wsi);
  if (!w || w->magic != BP_WS_MAGIC)
    return -1;
  w->wsi = wsi;
  w->established = true;
  w->linked = true;
  if (AH_HAS(st->api, ah_host_api, record_open)) {
    char label[48];
    snprintf(label, sizeof label, "ws-%llu-%s", (unsigned long long)w->id,
             w->kind == BP_WS_MUX ? "mux" : "host");
    w->rec = st->api->record_open(st->m, label);
  }
  w->next = st->ws;
  if (st->ws)
    st->ws->prev = w;
  st->ws = w;
  st->nws++;
  if (w->kind == BP_WS_MUX)
    st->nmux++;
  ah_caller c;
  if (w->kind == BP_WS_MUX) {
    if (w->has_after) {
      w->replaying = true;
      w->replay_limit = REPLAY_PAGE;
      w->sent_cursor = w->after;
      fetch_page(w);
    }
    return 0;
  }
  w->listing = true;
  int rc = st->api->dispatch(st->m, bp_caller(&c, false, w->id), "request.list", NULL, NULL, on_list, w);
  if (rc) {
    w->listing = false;
    stream_error(w, "request.list", rc, NULL);
  } else {
    w->calls++;
    st->outstanding++;
  }
  return 0;
}

int bp_ws_callback(bp_state *st, struct lws *wsi, enum lws_callback_reasons reason, void *in, size_t len) {
  (void)in;
  (void)len;
  bp_ws *w = lws_get_opaque_user_data(wsi);
  if (w && w->magic != BP_WS_MAGIC)
    w = NULL;
  switch (reason) {
  case LWS_CALLBACK_ESTABLISHED:
    return on_established(st, wsi);
  case LWS_CALLBACK_SERVER_WRITEABLE: {
    if (w)
      w->want_write = false;
    if (w && w->close_code && !w->close_posted) {
      /* The socket drained: the close frame can go out now (not from inside this callback). */
      w->close_posted = true;
      if (st->api->post(st->m, close_posted, w) == 0) {
        w->calls++;
        st->outstanding++;
      }
      return 0;
    }
    if (!w || w->closing || !w->q.n)
      return 0;
    if (write_queued(st, w, wsi) < 0)
      return -1;
    if (w->q.n) {
      want_write(w);
    } else if (w->close_after_flush) {
      /* Not from inside this callback (STACK-NOTES): from a posted task. */
      w->close_after_flush = false;
      if (st->api->post(st->m, close_posted, w) == 0) {
        w->calls++;
        st->outstanding++;
      }
    } else if (w->replaying && w->calls == 0) {
      fetch_page(w);
    }
    return 0;
  }
  case LWS_CALLBACK_RECEIVE:
    /* API-WS-HOST: downlink only. */
    st->api->log(st->m, AH_PLOG_WARN, "WebSocket %llu: the client sent a data frame; closing (1008)",
                 (unsigned long long)(w ? w->id : 0));
    lws_close_reason(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, (unsigned char *)"downlink only", 13);
    return -1;
  case LWS_CALLBACK_CLOSED:
    if (w) {
      w->closing = true;
      ws_unlink(w);
    }
    return 0;
  default:
    return 0;
  }
}

void bp_ws_close_all(bp_state *st, int code, const char *why) {
  bp_ws *w = st->ws;
  while (w) {
    bp_ws *next = w->next;
    if (w->closing && w->close_code && w->wsi && !w->close_posted) {
      /* A 1013 close waiting for a peer that does not read (up to 10 s): the connection goes now, or a
       * withdraw would wait for it past the host's deadline. */
      if (w->close_timer) {
        st->api->timer_stop(w->close_timer);
        w->close_timer = NULL;
        w->calls--;
        st->outstanding--;
      }
      w->close_code = 0;
      lws_set_timeout(w->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC); /* may free `w` */
    } else {
      ws_close(w, code, why);
    }
    w = next;
  }
}

/* ---- bus events → frames --------------------------------------------------------------------------------
 */

static bool is_mux_event(const char *name) {
  return strcmp(name, "session.event") == 0 || strcmp(name, "session.delta") == 0 ||
         strcmp(name, "session.reasoning") == 0 || strcmp(name, "session.status") == 0 ||
         strcmp(name, "session.progress") == 0 || strcmp(name, "subagent.started") == 0 ||
         strcmp(name, "subagent.finished") == 0;
}

static bool is_host_event(const char *name) {
  return strcmp(name, "request.pending") == 0 || strcmp(name, "request.resolved") == 0 ||
         strcmp(name, "plugin.mounted") == 0 || strcmp(name, "plugin.withdrawn") == 0 ||
         strcmp(name, "session.created") == 0 || strcmp(name, "session.closed") == 0 ||
         strcmp(name, "session.updated") == 0 || strcmp(name, "session.deleted") == 0 ||
         strcmp(name, "host.config-changed") == 0 || strcmp(name, "tools.changed") == 0;
}

/* Queue frame `f` (the caller keeps its reference) on every open socket of `kind`. */
static void fan_out(bp_state *st, bp_ws_kind kind, bp_frame *f) {
  bp_ws *w = st->ws;
  while (w) {
    bp_ws *next = w->next;
    if (w->kind == kind && w->established && !w->closing) {
      if (w->replaying || w->listing)
        hold_frame(w, f);
      else if (!(kind == BP_WS_MUX && f->cursor > 0 && f->cursor <= w->sent_cursor))
        send_frame(w, f, true);
    }
    w = next;
  }
  enforce_budget(st);
}

/* One envelope's text, serialized once, to every socket of `kind`. */
static void fan_out_text(bp_state *st, bp_ws_kind kind, char *text, int64_t cursor) {
  bp_frame *f = text ? frame_new(st, text, strlen(text), cursor, NULL) : NULL;
  free(text);
  if (f)
    fan_out(st, kind, f);
  frame_unref(st, f);
}

void bp_ws_on_event(bp_state *st, const char *name, const json_t *data) {
  if (is_mux_event(name)) {
    int64_t cursor = 0, seq = -1;
    if (strcmp(name, "session.event") == 0) {
      const json_t *ev = json_object_get(data, "event");
      cursor = json_integer_value(json_object_get(ev, "cursor"));
      seq = json_integer_value(json_object_get(ev, "seq"));
      if (cursor > st->last_cursor)
        st->last_cursor = cursor;
    }
    if (!st->ws)
      return;
    fan_out_text(st, BP_WS_MUX,
                 frame_text(st, name, data, false, NULL, cursor ? cursor : st->last_cursor, seq), cursor);
    return;
  }
  if (strcmp(name, "remote.event") == 0) {
    /* REMOTE-EVENT-FORWARD: the remote plugin's forwarded events, as host/remote-event {name, args}. */
    if (!st->ws)
      return;
    fan_out_text(st, BP_WS_HOST, frame_text(st, "host/remote-event", data, false, NULL, -1, -1), 0);
    return;
  }
  if (!is_host_event(name) || !st->ws)
    return;
  if (strcmp(name, "request.pending") == 0) {
    bp_frame *f = request_frame(st, json_object_get(data, "request"));
    if (f)
      fan_out(st, BP_WS_HOST, f);
    frame_unref(st, f);
    return;
  }
  fan_out_text(st, BP_WS_HOST, frame_text(st, name, data, false, NULL, -1, -1), 0);
}
