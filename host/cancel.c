/* Cancellation tokens in a tree: host → mount → call (and tokens plugins make).
 *
 * Tripping a token trips its whole subtree and runs each watch once, on the loop thread. Watch callbacks
 * may free tokens (a call that completes frees its token from inside the trip), so frees requested while
 * a trip runs are deferred until the outermost trip returns, and the walk over children restarts from the
 * head after every callback instead of holding a pointer that a callback may have invalidated.
 */
#include <stdlib.h>

#include "internal.h"

static int trip_depth = 0;
static ah__link deferred = {&deferred, &deferred};

ah_cancel *ah__cancel_new(ah_cancel *parent) {
  ah_cancel *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  ah__list_init(&t->children);
  ah__list_init(&t->sibling);
  ah__list_init(&t->watches);
  ah__list_init(&t->owner_link);
  atomic_init(&t->tripped, false);
  if (parent) {
    t->parent = parent;
    ah__list_push(&parent->children, &t->sibling);
    if (atomic_load(&parent->tripped)) {
      atomic_store(&t->tripped, true);
      t->fired = true;
    }
  }
  return t;
}

bool ah__cancel_tripped(const ah_cancel *t) {
  return t && atomic_load(&((ah_cancel *)t)->tripped);
}

static void trip_rec(ah_cancel *t) {
  atomic_store(&t->tripped, true);
  while (!ah__list_empty(&t->watches)) {
    ah__link *l = t->watches.next;
    ah_cancel_watch *w = AH__CONTAINER(l, ah_cancel_watch, link);
    ah__list_remove(l);
    ah_cancel_fn fn = w->fn;
    void *arg = w->arg;
    free(w);
    fn(t, arg);
  }
  for (;;) {
    ah_cancel *next = NULL;
    AH__LIST_EACH(it, &t->children) {
      ah_cancel *c = AH__CONTAINER(it, ah_cancel, sibling);
      if (!c->fired) {
        next = c;
        break;
      }
    }
    if (!next)
      break;
    next->fired = true;
    trip_rec(next);
  }
}

static void flush_deferred(void) {
  while (!ah__list_empty(&deferred)) {
    ah__link *l = deferred.next;
    ah_cancel *t = AH__CONTAINER(l, ah_cancel, sibling);
    ah__list_remove(l);
    free(t);
  }
}

void ah__cancel_trip(ah_cancel *t) {
  if (!t || t->fired)
    return;
  t->fired = true;
  trip_depth++;
  trip_rec(t);
  trip_depth--;
  if (trip_depth == 0)
    flush_deferred();
}

void ah__cancel_free(ah_cancel *t) {
  if (!t)
    return;
  /* A link watch (a call under a caller's token) holds a pointer to its watch: an owner that frees its
   * token without tripping it still cancels what hangs below, and the link learns that its watch is gone. */
  trip_depth++;
  while (!ah__list_empty(&t->watches)) {
    ah__link *l = t->watches.next;
    ah_cancel_watch *w = AH__CONTAINER(l, ah_cancel_watch, link);
    ah__list_remove(l);
    ah_cancel_fn fn = w->fire_on_free ? w->fn : NULL;
    void *arg = w->arg;
    free(w);
    if (fn)
      fn(t, arg);
  }
  trip_depth--;
  while (!ah__list_empty(&t->children)) {
    ah__link *l = t->children.next;
    ah_cancel *c = AH__CONTAINER(l, ah_cancel, sibling);
    ah__list_remove(l);
    c->parent = NULL;
  }
  ah__list_remove(&t->sibling);
  ah__list_remove(&t->owner_link);
  t->fired = true; /* a trip walking the old parent's children must skip it */
  if (trip_depth > 0) {
    ah__list_push(&deferred, &t->sibling);
  } else {
    free(t);
    flush_deferred();
  }
}

int ah__cancel_watch(ah_cancel *t, ah_cancel_fn fn, void *arg, ah_cancel_watch **out) {
  if (!t || !fn)
    return AH_EINVAL;
  if (atomic_load(&t->tripped))
    return AH_ECANCELED;
  ah_cancel_watch *w = calloc(1, sizeof *w);
  if (!w)
    return AH_ENOMEM;
  w->token = t;
  w->fn = fn;
  w->arg = arg;
  ah__list_push(&t->watches, &w->link);
  if (out)
    *out = w;
  return 0;
}

void ah__cancel_unwatch(ah_cancel_watch *w) {
  if (!w)
    return;
  ah__list_remove(&w->link);
  free(w);
}
