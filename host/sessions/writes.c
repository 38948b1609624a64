/* Writes of a live session: every durable fact goes through ah__write_ops(), which gives an event the
 * session's next seq on the loop thread, hands the opset to the store's group-commit writer, and publishes
 * the event on the bus (session.event, with its cursor) only after the commit. Store callbacks run in
 * submission order, so the bus sees each session's events in seq order.
 */
#include <stdlib.h>
#include <string.h>

#include "session.h"

typedef struct write_ctx {
  session *s;
  json_t *event; /* the appended event (NULL for a plain write) */
  written_fn cb;
  void *arg;
} write_ctx;

static void write_done(int status, const json_t *results, void *arg) {
  write_ctx *w = arg;
  session *s = w->s;
  if (status == AH_EAGENTBUSY && s->fenced)
    ah__live_lease_lost(s, "a write was refused by the store's fence", NULL);
  else if ((status == AH_EIO || status == AH_EBUSY) && s->fenced)
    ah__live_broken(s, status);
  if (w->event && status == 0) {
    json_t *cursor = json_array_get(results, json_array_size(results) - 1);
    json_object_set(w->event, "cursor", cursor);
    /* With a shared store the follower publishes every event in cursor order, this host's too. */
    if (ah__hosts_active(s->m))
      ah__hosts_committed(s->m, json_integer_value(cursor));
    else
      ah__sm_emit(s->m, "session.event", json_pack("{s:s, s:O}", "sessionId", s->id, "event", w->event));
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
  ah__live_free_if_unused(s);
}

/* Write `ops` (stolen; may be NULL) and, when `kind` is set, ah__write_event one event after them in the same
 * opset. The event gets the session's next seq now. `cb` (may be NULL) runs after the commit. */
void ah__write_ops(session *s, json_t *ops, const char *kind, const char *turn_id, const char *message_id,
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
  int rc = ah__store_write(ah__sm_store(s->m), ops, write_done, w);
  if (rc)
    write_done(rc, NULL, w);
}

void ah__write_event(session *s, const char *kind, const char *turn_id, const char *message_id,
                     json_t *data) {
  ah__write_ops(s, NULL, kind, turn_id, message_id, data, NULL, NULL);
}

void ah__write_fields(session *s, json_t *set) {
  json_t *ops = json_pack("[{s:s, s:s, s:O}]", "op", "session.update", "id", s->id, "set", set);
  const char *k = NULL;
  json_t *v = NULL;
  json_object_foreach(set, k, v) {
    json_object_set(s->row, k, v);
  }
  json_decref(set);
  ah__write_ops(s, ops, NULL, NULL, NULL, NULL, NULL, NULL);
}

/* session.status is emitted once the row update is committed: the store commits in order, so the status
 * reaches subscribers after every session.event written before it (idle after the turn/ended). */
static void status_written(session *s, int status, const json_t *event, void *arg) {
  (void)status;
  (void)event;
  ah__sm_emit(s->m, "session.status", arg);
}

void ah__write_running(session *s, bool running) {
  if (s->running == running)
    return;
  s->running = running;
  char now[32];
  ah__time_rfc3339(now);
  json_t *set = json_pack("{s:s, s:s}", "status", status_of(s), "updated", now);
  json_t *ops = json_pack("[{s:s, s:s, s:O}]", "op", "session.update", "id", s->id, "set", set);
  json_object_update(s->row, set);
  json_decref(set);
  ah__write_ops(s, ops, NULL, NULL, NULL, NULL, status_written,
                json_pack("{s:s, s:s}", "sessionId", s->id, "status", status_of(s)));
}
