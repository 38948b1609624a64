/* Unit tests for host/cancel.c: the cancellation token tree (host → mount → call), its watches and the
 * deferred frees that let a watch callback free tokens while a trip is running. Misuse of freed memory is
 * caught by ASan in the sanitizer build. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <uv.h>

#include "host_support.h"
#include "internal.h"
#include "support.h"

/* Every test closes a loop, as STYLE.md asks; tokens themselves need none. */
static void loop_round_trip(void) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  cr_assert_eq(ts_loop_close(&loop), 0);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

typedef struct counter {
  int fired;
  ah_cancel *seen; /* the token the last call got */
} counter;

static void count_cb(ah_cancel *t, void *arg) {
  counter *c = arg;
  c->fired++;
  c->seen = t;
}

Test(cancel, trip_propagates_to_descendants_only) {
  ah_cancel *top = ah__cancel_new(NULL);
  ah_cancel *root = ah__cancel_new(top);
  ah_cancel *a = ah__cancel_new(root);
  ah_cancel *a1 = ah__cancel_new(a);
  ah_cancel *a2 = ah__cancel_new(a);
  ah_cancel *b = ah__cancel_new(root);
  ah_cancel *other = ah__cancel_new(top); /* root's sibling */
  cr_assert(top && root && a && a1 && a2 && b && other);

  cr_expect_not(ah__cancel_tripped(root));
  ah__cancel_trip(root);
  cr_expect(ah__cancel_tripped(root));
  cr_expect(ah__cancel_tripped(a), "child");
  cr_expect(ah__cancel_tripped(a1), "grandchild");
  cr_expect(ah__cancel_tripped(a2), "grandchild");
  cr_expect(ah__cancel_tripped(b), "second child");
  cr_expect_not(ah__cancel_tripped(top), "a trip must not reach the parent");
  cr_expect_not(ah__cancel_tripped(other), "a trip must not reach a sibling");

  ah__cancel_free(a1);
  ah__cancel_free(a2);
  ah__cancel_free(a);
  ah__cancel_free(b);
  ah__cancel_free(root);
  ah__cancel_free(other);
  ah__cancel_free(top);
  loop_round_trip();
}

Test(cancel, trip_of_subtree_spares_siblings_and_parent) {
  ah_cancel *root = ah__cancel_new(NULL);
  ah_cancel *a = ah__cancel_new(root);
  ah_cancel *a1 = ah__cancel_new(a);
  ah_cancel *b = ah__cancel_new(root);
  ah_cancel *b1 = ah__cancel_new(b);
  counter ca = {0}, cb = {0}, cb1 = {0}, croot = {0};
  cr_assert_eq(ah__cancel_watch(a1, count_cb, &ca, NULL), 0);
  cr_assert_eq(ah__cancel_watch(b, count_cb, &cb, NULL), 0);
  cr_assert_eq(ah__cancel_watch(b1, count_cb, &cb1, NULL), 0);
  cr_assert_eq(ah__cancel_watch(root, count_cb, &croot, NULL), 0);

  ah__cancel_trip(a);
  cr_expect(ah__cancel_tripped(a));
  cr_expect(ah__cancel_tripped(a1));
  cr_expect_eq(ca.fired, 1);
  cr_expect_eq(ca.seen, a1, "a watch gets its own token");
  cr_expect_not(ah__cancel_tripped(root));
  cr_expect_not(ah__cancel_tripped(b));
  cr_expect_not(ah__cancel_tripped(b1));
  cr_expect_eq(cb.fired + cb1.fired + croot.fired, 0);

  /* Tripping the root later reaches the rest, and never re-runs what already fired. */
  ah__cancel_trip(root);
  cr_expect_eq(croot.fired, 1);
  cr_expect_eq(cb.fired, 1);
  cr_expect_eq(cb1.fired, 1);
  cr_expect_eq(ca.fired, 1);

  ah__cancel_free(a1);
  ah__cancel_free(a);
  ah__cancel_free(b1);
  ah__cancel_free(b);
  ah__cancel_free(root);
  loop_round_trip();
}

Test(cancel, watch_fires_exactly_once) {
  ah_cancel *parent = ah__cancel_new(NULL);
  ah_cancel *t = ah__cancel_new(parent);
  counter c1 = {0}, c2 = {0};
  ah_cancel_watch *w = NULL;
  cr_assert_eq(ah__cancel_watch(t, count_cb, &c1, &w), 0);
  cr_expect_not_null(w);
  cr_assert_eq(ah__cancel_watch(t, count_cb, &c2, NULL), 0);
  ah__cancel_trip(t);
  ah__cancel_trip(t);
  ah__cancel_trip(parent); /* reaches t again through the tree */
  ah__cancel_trip(t);
  cr_expect_eq(c1.fired, 1);
  cr_expect_eq(c2.fired, 1);
  cr_expect_eq(c1.seen, t);
  ah__cancel_free(t);
  ah__cancel_free(parent);
  loop_round_trip();
}

Test(cancel, watch_on_tripped_token_refused) {
  ah_cancel *t = ah__cancel_new(NULL);
  counter c = {0};
  ah_cancel_watch *w = (ah_cancel_watch *)&c; /* must stay untouched */
  ah__cancel_trip(t);
  cr_expect_eq(ah__cancel_watch(t, count_cb, &c, &w), AH_ECANCELED);
  cr_expect_eq(w, (ah_cancel_watch *)&c, "*out must not be set on refusal");
  cr_expect_eq(c.fired, 0, "a refused watch never calls back");
  cr_expect_eq(ah__cancel_watch(NULL, count_cb, &c, NULL), AH_EINVAL);
  ah_cancel *u = ah__cancel_new(NULL);
  cr_expect_eq(ah__cancel_watch(u, NULL, &c, NULL), AH_EINVAL);
  cr_expect_not(ah__cancel_tripped(NULL));
  ah__cancel_free(u);
  ah__cancel_free(t);
  loop_round_trip();
}

Test(cancel, unwatch_prevents_firing) {
  ah_cancel *t = ah__cancel_new(NULL);
  counter gone = {0}, kept = {0};
  ah_cancel_watch *w = NULL;
  cr_assert_eq(ah__cancel_watch(t, count_cb, &gone, &w), 0);
  cr_assert_eq(ah__cancel_watch(t, count_cb, &kept, NULL), 0);
  ah__cancel_unwatch(w);
  ah__cancel_unwatch(NULL);
  ah__cancel_trip(t);
  cr_expect_eq(gone.fired, 0);
  cr_expect_eq(kept.fired, 1);
  ah__cancel_free(t);
  loop_round_trip();
}

Test(cancel, free_with_pending_watches_releases_them) {
  /* Freeing a token ends its watches (LeakSanitizer would report a watch left behind). */
  ah_cancel *t = ah__cancel_new(NULL);
  counter c = {0};
  for (int i = 0; i < 8; i++)
    cr_assert_eq(ah__cancel_watch(t, count_cb, &c, NULL), 0);
  ah__cancel_free(t);
  cr_expect_eq(c.fired, 0);
  loop_round_trip();
}

/* ---- callbacks that free tokens during the trip --------------------------------------------------- */

typedef struct freer {
  ah_cancel *victim;
  int fired;
} freer;

static void free_victim_cb(ah_cancel *t, void *arg) {
  (void)t;
  freer *f = arg;
  f->fired++;
  ah__cancel_free(f->victim);
  f->victim = NULL;
}

Test(cancel, watch_frees_its_own_token) {
  ah_cancel *root = ah__cancel_new(NULL);
  ah_cancel *t = ah__cancel_new(root);
  ah_cancel *child = ah__cancel_new(t);
  freer f = {.victim = t, .fired = 0};
  counter after = {0}, kid = {0};
  cr_assert_eq(ah__cancel_watch(t, free_victim_cb, &f, NULL), 0);
  cr_assert_eq(ah__cancel_watch(t, count_cb, &after, NULL), 0); /* ends with its token */
  cr_assert_eq(ah__cancel_watch(child, count_cb, &kid, NULL), 0);
  ah__cancel_trip(root);
  cr_expect_eq(f.fired, 1);
  cr_expect_eq(after.fired, 0, "a watch of a token freed during the trip must not run");
  /* The child was detached when t was freed: it is an orphan now and owned by us. */
  cr_expect_null(child->parent);
  cr_expect_not(ah__cancel_tripped(child));
  cr_expect_eq(kid.fired, 0);
  ah__cancel_trip(child);
  cr_expect_eq(kid.fired, 1);
  ah__cancel_free(child);
  ah__cancel_free(root);
  loop_round_trip();
}

Test(cancel, watch_frees_a_sibling_not_yet_tripped) {
  ah_cancel *root = ah__cancel_new(NULL);
  ah_cancel *first = ah__cancel_new(root);
  ah_cancel *second = ah__cancel_new(root);
  ah_cancel *nephew = ah__cancel_new(second);
  freer f = {.victim = second, .fired = 0};
  counter sib = {0}, nep = {0};
  cr_assert_eq(ah__cancel_watch(first, free_victim_cb, &f, NULL), 0);
  cr_assert_eq(ah__cancel_watch(second, count_cb, &sib, NULL), 0);
  cr_assert_eq(ah__cancel_watch(nephew, count_cb, &nep, NULL), 0);
  ah__cancel_trip(root);
  cr_expect_eq(f.fired, 1);
  cr_expect_eq(sib.fired, 0, "the freed sibling's watch must not run");
  cr_expect_eq(nep.fired, 0, "the freed sibling's child was detached before the trip reached it");
  cr_expect_null(nephew->parent);
  ah__cancel_free(nephew);
  ah__cancel_free(first);
  ah__cancel_free(root);
  loop_round_trip();
}

Test(cancel, watch_frees_a_sibling_already_tripped) {
  ah_cancel *root = ah__cancel_new(NULL);
  ah_cancel *first = ah__cancel_new(root);
  ah_cancel *second = ah__cancel_new(root);
  counter c = {0};
  freer f = {.victim = first, .fired = 0};
  cr_assert_eq(ah__cancel_watch(first, count_cb, &c, NULL), 0);
  cr_assert_eq(ah__cancel_watch(second, free_victim_cb, &f, NULL), 0);
  ah__cancel_trip(root);
  cr_expect_eq(c.fired, 1);
  cr_expect_eq(f.fired, 1);
  ah__cancel_free(second);
  ah__cancel_free(root);
  loop_round_trip();
}

Test(cancel, watch_frees_a_child_during_trip) {
  ah_cancel *t = ah__cancel_new(NULL);
  ah_cancel *child = ah__cancel_new(t);
  ah_cancel *grandchild = ah__cancel_new(child);
  freer f = {.victim = child, .fired = 0};
  counter c = {0}, g = {0};
  cr_assert_eq(ah__cancel_watch(t, free_victim_cb, &f, NULL), 0);
  cr_assert_eq(ah__cancel_watch(child, count_cb, &c, NULL), 0);
  cr_assert_eq(ah__cancel_watch(grandchild, count_cb, &g, NULL), 0);
  ah__cancel_trip(t);
  cr_expect_eq(f.fired, 1);
  cr_expect_eq(c.fired, 0);
  cr_expect_eq(g.fired, 0);
  cr_expect_null(grandchild->parent);
  ah__cancel_free(grandchild);
  ah__cancel_free(t);
  loop_round_trip();
}

Test(cancel, watch_frees_the_parent_being_tripped) {
  /* A call's watch that frees the mount's token while the mount's trip walks its children. */
  ah_cancel *parent = ah__cancel_new(NULL);
  ah_cancel *c1 = ah__cancel_new(parent);
  ah_cancel *c2 = ah__cancel_new(parent);
  freer f = {.victim = parent, .fired = 0};
  counter k2 = {0};
  cr_assert_eq(ah__cancel_watch(c1, free_victim_cb, &f, NULL), 0);
  cr_assert_eq(ah__cancel_watch(c2, count_cb, &k2, NULL), 0);
  ah__cancel_trip(parent);
  cr_expect_eq(f.fired, 1);
  /* c2 was detached before the walk reached it. */
  cr_expect_eq(k2.fired, 0);
  cr_expect_null(c2->parent);
  ah__cancel_free(c1);
  ah__cancel_free(c2);
  loop_round_trip();
}

typedef struct nest {
  ah_cancel *other;
  ah_cancel *free_me;
  int fired;
} nest;

static void nested_trip_cb(ah_cancel *t, void *arg) {
  (void)t;
  nest *n = arg;
  n->fired++;
  ah__cancel_trip(n->other); /* a trip inside a trip */
  ah__cancel_free(n->free_me);
}

Test(cancel, nested_trip_and_free_in_callbacks) {
  ah_cancel *a = ah__cancel_new(NULL);
  ah_cancel *b = ah__cancel_new(NULL);
  ah_cancel *b1 = ah__cancel_new(b);
  nest inner = {.other = NULL, .free_me = b1, .fired = 0}; /* b1's own watch frees b1 in the inner trip */
  nest outer = {.other = b, .free_me = a, .fired = 0};
  cr_assert_eq(ah__cancel_watch(b1, nested_trip_cb, &inner, NULL), 0);
  cr_assert_eq(ah__cancel_watch(a, nested_trip_cb, &outer, NULL), 0);
  ah__cancel_trip(a);
  cr_expect_eq(outer.fired, 1);
  cr_expect_eq(inner.fired, 1);
  cr_expect(ah__cancel_tripped(b));
  ah__cancel_free(b);
  loop_round_trip();
}

static void make_child_cb(ah_cancel *t, void *arg) {
  ah_cancel **out = arg;
  *out = ah__cancel_new(t);
}

Test(cancel, child_created_during_trip_is_tripped) {
  ah_cancel *t = ah__cancel_new(NULL);
  ah_cancel *made = NULL;
  cr_assert_eq(ah__cancel_watch(t, make_child_cb, &made, NULL), 0);
  ah__cancel_trip(t);
  cr_assert_not_null(made);
  cr_expect(ah__cancel_tripped(made));
  counter c = {0};
  cr_expect_eq(ah__cancel_watch(made, count_cb, &c, NULL), AH_ECANCELED);
  ah__cancel_free(made);
  ah__cancel_free(t);
  loop_round_trip();
}

Test(cancel, token_under_tripped_parent_is_tripped) {
  ah_cancel *parent = ah__cancel_new(NULL);
  ah__cancel_trip(parent);
  ah_cancel *child = ah__cancel_new(parent);
  ah_cancel *grandchild = ah__cancel_new(child);
  cr_assert(child && grandchild);
  cr_expect(ah__cancel_tripped(child));
  cr_expect(ah__cancel_tripped(grandchild));
  counter c = {0};
  cr_expect_eq(ah__cancel_watch(child, count_cb, &c, NULL), AH_ECANCELED);
  cr_expect_eq(ah__cancel_watch(grandchild, count_cb, &c, NULL), AH_ECANCELED);
  ah__cancel_trip(child); /* no-op, no callback */
  cr_expect_eq(c.fired, 0);
  ah__cancel_free(grandchild);
  ah__cancel_free(child);
  ah__cancel_free(parent);
  loop_round_trip();
}

Test(cancel, freeing_parent_detaches_children) {
  ah_cancel *parent = ah__cancel_new(NULL);
  ah_cancel *c1 = ah__cancel_new(parent);
  ah_cancel *c2 = ah__cancel_new(parent);
  ah_cancel *g = ah__cancel_new(c1);
  counter k1 = {0}, k2 = {0}, kg = {0};
  cr_assert_eq(ah__cancel_watch(c1, count_cb, &k1, NULL), 0);
  cr_assert_eq(ah__cancel_watch(c2, count_cb, &k2, NULL), 0);
  cr_assert_eq(ah__cancel_watch(g, count_cb, &kg, NULL), 0);
  ah__cancel_free(parent);
  cr_expect_null(c1->parent);
  cr_expect_null(c2->parent);
  cr_expect_eq(g->parent, c1, "only direct children are detached");
  cr_expect_not(ah__cancel_tripped(c1));
  cr_expect_not(ah__cancel_tripped(c2));
  /* The orphans still work as roots of their own trees. */
  ah__cancel_trip(c1);
  cr_expect_eq(k1.fired, 1);
  cr_expect_eq(kg.fired, 1);
  cr_expect_eq(k2.fired, 0);
  /* Freeing a child after its parent is gone touches no freed memory (ASan). */
  ah__cancel_free(g);
  ah__cancel_free(c1);
  ah__cancel_free(c2);
  loop_round_trip();
}

Test(cancel, freeing_child_unlinks_it_from_parent) {
  ah_cancel *parent = ah__cancel_new(NULL);
  ah_cancel *c = ah__cancel_new(parent);
  ah_cancel *d = ah__cancel_new(parent);
  ah__cancel_free(c);
  counter k = {0};
  cr_assert_eq(ah__cancel_watch(d, count_cb, &k, NULL), 0);
  ah__cancel_trip(parent); /* must not walk into the freed child (ASan) */
  cr_expect_eq(k.fired, 1);
  ah__cancel_free(d);
  ah__cancel_free(parent);
  loop_round_trip();
}

/* ---- threads -------------------------------------------------------------------------------------- */

typedef struct watcher_thread {
  ah_cancel *token;
  atomic_bool started;
  atomic_bool saw_untripped;
  atomic_bool saw_tripped;
} watcher_thread;

static void *watch_thread(void *arg) {
  watcher_thread *w = arg;
  atomic_store(&w->saw_untripped, !ah__cancel_tripped(w->token));
  atomic_store(&w->started, true);
  uint64_t deadline = ts_now_ms() + 5000;
  while (ts_now_ms() < deadline) {
    if (ah__cancel_tripped(w->token)) {
      atomic_store(&w->saw_tripped, true);
      break;
    }
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

Test(cancel, tripped_seen_from_another_thread) {
  ah_cancel *parent = ah__cancel_new(NULL);
  ah_cancel *t = ah__cancel_new(parent);
  watcher_thread w = {.token = t};
  atomic_init(&w.started, false);
  atomic_init(&w.saw_untripped, false);
  atomic_init(&w.saw_tripped, false);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, watch_thread, &w), 0);
  while (!atomic_load(&w.started))
    sched_yield();
  ah__cancel_trip(parent); /* the thread watches the child */
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_expect(atomic_load(&w.saw_untripped), "the thread saw the token tripped before the trip");
  cr_expect(atomic_load(&w.saw_tripped), "the thread never saw the trip");
  ah__cancel_free(t);
  ah__cancel_free(parent);
  loop_round_trip();
}
