/* The event bus: ordered fan-out with a queue per subscriber.
 *
 * emit() copies nothing but a reference to the data and appends it to the queue of every matching active
 * subscriber; the host's pump delivers on later loop turns, in rounds of one event per subscriber, so one
 * subscriber's callback can unsubscribe (itself or others) or emit without disturbing another's order. A
 * drain runs up to BUS_ROUNDS rounds: a burst reaches a subscriber in a few loop turns, not one turn per
 * event (a stream of 10k deltas a second to a hundred WebSockets needs them together in one turn, so that
 * each socket is written once for many), and I/O still runs between drains.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define BUS_ROUNDS 256

bool ah__pattern_match(const char *pattern, const char *name) {
  if (strcmp(pattern, "*") == 0)
    return true;
  size_t n = strlen(pattern);
  if (n >= 2 && pattern[n - 1] == '*' && pattern[n - 2] == '.')
    return strncmp(pattern, name, n - 1) == 0;
  return strcmp(pattern, name) == 0;
}

/* "*", an event name, or "prefix.*" where prefix is one or more dot-separated segments of
 * [a-z][a-z0-9_-]* (so "ok..*", ".*" and "ok.*.x" are refused). */
static bool valid_pattern(const char *p) {
  if (!p || !*p)
    return false;
  if (strcmp(p, "*") == 0)
    return true;
  size_t n = strlen(p);
  if (n > 2 && p[n - 1] == '*' && p[n - 2] == '.') {
    char buf[160];
    if (n - 2 + sizeof ".x" > sizeof buf)
      return false;
    /* prefix + ".x" is a valid event name exactly when the prefix is a valid sequence of segments. */
    memcpy(buf, p, n - 2);
    memcpy(buf + n - 2, ".x", sizeof ".x");
    return ah__valid_event_name(buf);
  }
  return ah__valid_event_name(p);
}

int ah__bus_emit(ah_host *h, ah_mount *m, const char *name, json_t *data) {
  if (!name) {
    json_decref(data);
    return AH_EINVAL;
  }
  ah__entry *e = ah__registry_find(&h->reg, AH__ENTRY_EVENT, name);
  if (!e || e->mount != m || e->state != AH__ST_ACTIVE) {
    json_decref(data);
    return e && e->mount == m ? AH_EUNAVAILABLE : AH_ENOENT;
  }
  if (!data)
    data = json_object();
  AH__LIST_EACH(it, &h->subs) {
    ah_sub *s = AH__CONTAINER(it, ah_sub, host_link);
    if (!s->active || !ah__pattern_match(s->pattern, name))
      continue;
    json_t *item = json_pack("[sO]", name, data);
    if (item)
      json_array_append_new(s->queue, item);
  }
  json_decref(data);
  ah__pump_kick(&h->pump);
  return 0;
}

int ah__bus_subscribe(ah_host *h, ah_mount *m, const char *pattern, ah_event_fn fn, void *arg, ah_sub **out) {
  if (!fn || !valid_pattern(pattern))
    return AH_EINVAL;
  if (m->state != AH__MOUNT_ACTIVE && m->state != AH__MOUNT_MOUNTING)
    return AH_ESTATE;
  ah_sub *s = calloc(1, sizeof *s);
  if (!s)
    return AH_ENOMEM;
  s->host = h;
  s->mount = m;
  s->pattern = strdup(pattern);
  s->queue = json_array();
  if (!s->pattern || !s->queue) {
    free(s->pattern);
    json_decref(s->queue);
    free(s);
    return AH_ENOMEM;
  }
  s->fn = fn;
  s->arg = arg;
  s->active = true;
  ah__list_push(&h->subs, &s->host_link);
  ah__list_push(&m->subs, &s->mount_link);
  if (out)
    *out = s;
  return 0;
}

void ah__bus_unsubscribe(ah_sub *s) {
  if (!s)
    return;
  ah__list_remove(&s->host_link);
  ah__list_remove(&s->mount_link);
  json_decref(s->queue);
  free(s->pattern);
  free(s);
}

bool ah__bus_pending(void *host) {
  ah_host *h = host;
  AH__LIST_EACH(it, &h->subs) {
    ah_sub *s = AH__CONTAINER(it, ah_sub, host_link);
    if (s->active && json_array_size(s->queue) > s->qhead)
      return true;
  }
  return false;
}

/* Take the next event off a subscriber's queue (a reference for the caller). Delivered entries are let go
 * at once when the queue empties, else in one copy once they are at least half of it (never one shift per
 * event: a backlog of n would cost n^2). */
static json_t *queue_take(ah_sub *s) {
  json_t *item = json_incref(json_array_get(s->queue, s->qhead++));
  size_t n = json_array_size(s->queue);
  if (s->qhead == n) {
    json_array_clear(s->queue);
    s->qhead = 0;
  } else if (s->qhead >= 64 && s->qhead >= n / 2) {
    json_t *rest = json_array();
    for (size_t i = s->qhead; rest && i < n; i++)
      json_array_append(rest, json_array_get(s->queue, i));
    if (rest) {
      json_decref(s->queue);
      s->queue = rest;
      s->qhead = 0;
    }
  }
  return item;
}

void ah__bus_deliver(void *host) {
  ah_host *h = host;
  /* Rounds of one event per subscriber. A callback may unsubscribe any subscriber (freeing it), so no
   * list pointer is held across a callback: each step scans from the head for the next subscriber that
   * has not been served in this round. */
  for (int round = 0; round < BUS_ROUNDS; round++) {
    uint64_t pass = ++h->bus_pass;
    bool served = false;
    for (;;) {
      ah_sub *s = NULL;
      AH__LIST_EACH(it, &h->subs) {
        ah_sub *c = AH__CONTAINER(it, ah_sub, host_link);
        if (c->active && c->pass != pass && json_array_size(c->queue) > c->qhead) {
          s = c;
          break;
        }
      }
      if (!s)
        break;
      served = true;
      s->pass = pass;
      json_t *item = queue_take(s);
      s->fn(json_string_value(json_array_get(item, 0)), json_array_get(item, 1), s->arg);
      json_decref(item);
    }
    if (!served)
      return;
  }
}
