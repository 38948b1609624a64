/* Unit tests for host/bus.c: patterns, ordered per-subscriber delivery on later loop turns, emit
 * ownership, unsubscribing inside callbacks, and subscriptions that end with their mount. Runs a real host
 * with its core mount and, where a plugin is needed, the "ok" fixture (ok.emit emits ok.ping). */
#include <criterion/criterion.h>
#include <string.h>
#include <uv.h>

#include "host_support.h"
#include "internal.h"
#include "support.h"

/* What one subscriber saw: [[name, data], ...]. */
typedef struct rec {
  json_t *seen;
  int depth; /* > 1 means a callback ran inside another (synchronous delivery) */
  int max_depth;
  ah_sub *unsub; /* unsubscribed on the first event, when set */
} rec;

static void rec_init(rec *r) {
  memset(r, 0, sizeof *r);
  r->seen = json_array();
  cr_assert_not_null(r->seen);
}

static void rec_free(rec *r) {
  json_decref(r->seen);
}

static size_t rec_count(const rec *r) {
  return json_array_size(r->seen);
}

static const char *rec_name(const rec *r, size_t i) {
  return json_string_value(json_array_get(json_array_get(r->seen, i), 0));
}

static const json_t *rec_data(const rec *r, size_t i) {
  return json_array_get(json_array_get(r->seen, i), 1);
}

static void on_event(const char *name, const json_t *data, void *arg) {
  rec *r = arg;
  r->depth++;
  if (r->depth > r->max_depth)
    r->max_depth = r->depth;
  cr_assert_not_null(name);
  cr_assert_not_null(data);
  json_array_append_new(r->seen, json_pack("[sO]", name, (json_t *)data));
  if (r->unsub) {
    ah_sub *s = r->unsub;
    r->unsub = NULL;
    ah__bus_unsubscribe(s);
  }
  r->depth--;
}

typedef struct wait_count {
  const rec *r;
  size_t n;
} wait_count;

static bool count_reached(void *arg) {
  wait_count *w = arg;
  return rec_count(w->r) >= w->n;
}

static bool run_until_count(uv_loop_t *loop, const rec *r, size_t n) {
  wait_count w = {.r = r, .n = n};
  return ts_run_until_pred(loop, count_reached, &w, 5000);
}

/* Run a few loop turns so that anything queued would have been delivered. */
static void settle(uv_loop_t *loop) {
  for (int i = 0; i < 20; i++)
    uv_run(loop, UV_RUN_NOWAIT);
}

/* Stop the host, close the loop, and check that nothing leaked. */
static void stop_free(uv_loop_t *loop, ah_host *h) {
  cr_assert_eq(th_host_stop_free(loop, h), 0);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

static int subscribe(ah_host *h, const char *pattern, rec *r, ah_sub **out) {
  return ah__host_api(h)->subscribe(ah__host_core_mount(h), pattern, on_event, r, out);
}

Test(bus, pattern_match_cases) {
  cr_expect(ah__pattern_match("*", "session.created"));
  cr_expect(ah__pattern_match("*", "ok.ping"));
  cr_expect(ah__pattern_match("ok.ping", "ok.ping"));
  cr_expect_not(ah__pattern_match("ok.ping", "ok.pin"));
  cr_expect_not(ah__pattern_match("ok.ping", "ok.pings"));
  cr_expect_not(ah__pattern_match("ok.ping", "ok"));
  cr_expect(ah__pattern_match("ok.*", "ok.ping"));
  cr_expect(ah__pattern_match("ok.*", "ok.internal"));
  cr_expect(ah__pattern_match("session.*", "session.event"));
  cr_expect(ah__pattern_match("a.b.*", "a.b.c"));
  cr_expect(ah__pattern_match("a.*", "a.b.c"), "a prefix pattern covers deeper names");
  cr_expect_not(ah__pattern_match("a.b.*", "a.bc"));
  cr_expect_not(ah__pattern_match("ok.*", "ok"), "the prefix itself is not under it");
  cr_expect_not(ah__pattern_match("ok.*", "okay.ping"));
  cr_expect_not(ah__pattern_match("ok.*", "ko.ping"));
  cr_expect_not(ah__pattern_match("session.*", "sessions.event"));
  cr_expect_not(ah__pattern_match("ok.p*", "ok.ping"), "only a whole trailing segment is a wildcard");
  cr_expect_not(ah__pattern_match("ok.ping", "OK.PING"));
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  cr_assert_eq(ts_loop_close(&loop), 0);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

Test(bus, invalid_patterns_refused) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  rec r;
  rec_init(&r);
  char long_prefix[200];
  memset(long_prefix, 'a', sizeof long_prefix);
  memcpy(long_prefix + sizeof long_prefix - 5, ".b.*", 5);
  const char *bad[] = {
      "",      "ok",    "OK.ping", "ok.Ping",   "ok.*x",    "*.ping",    "ok.**",        ".*",
      "..*",   "ok..*", "ok.",     ".ok.*",     "ok .ping", "ok.ping\n", "ok.\x01.*",    "ok.\x7f",
      "1ok.*", "ok.1x", "*ok",     "ok.*.ping", "ok/ping",  "../x.*",    "ok.p\xc3\xa9", long_prefix,
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ah_sub *s = NULL;
    cr_expect_eq(subscribe(h, bad[i], &r, &s), AH_EINVAL, "pattern #%zu '%s' accepted", i, bad[i]);
    cr_expect_null(s);
  }
  ah_sub *s = NULL;
  cr_expect_eq(subscribe(h, NULL, &r, &s), AH_EINVAL);
  cr_expect_eq(ah__host_api(h)->subscribe(ah__host_core_mount(h), "ok.*", NULL, &r, &s), AH_EINVAL,
               "a NULL callback");
  cr_expect_eq(ah__host_api(h)->subscribe(NULL, "ok.*", on_event, &r, &s), AH_EINVAL, "a NULL mount");
  /* The good forms, for contrast. */
  const char *good[] = {"*", "ok.ping", "ok.*", "a.b.*", "session.*", "a-b_c.d-e"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    s = NULL;
    cr_expect_eq(subscribe(h, good[i], &r, &s), 0, "pattern '%s' refused", good[i]);
    cr_expect_not_null(s);
  }
  rec_free(&r);
  stop_free(&loop, h);
}

Test(bus, subscribe_patterns_exact_prefix_and_all) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  rec exact, prefix, all, other;
  rec_init(&exact);
  rec_init(&prefix);
  rec_init(&all);
  rec_init(&other);
  cr_assert_eq(subscribe(h, "session.created", &exact, NULL), 0);
  cr_assert_eq(subscribe(h, "session.*", &prefix, NULL), 0);
  cr_assert_eq(subscribe(h, "*", &all, NULL), 0);
  cr_assert_eq(subscribe(h, "request.*", &other, NULL), 0);

  cr_assert_eq(ah__host_emit(h, "session.created", json_pack("{s:i}", "n", 1)), 0);
  cr_assert_eq(ah__host_emit(h, "session.closed", json_pack("{s:i}", "n", 2)), 0);
  cr_assert_eq(ah__host_emit(h, "subagent.started", json_pack("{s:i}", "n", 3)), 0);
  cr_assert_eq(ah__host_emit(h, "session.status", NULL), 0); /* NULL data → {} */
  cr_assert(run_until_count(&loop, &all, 4));
  settle(&loop);

  cr_expect_eq(rec_count(&exact), 1);
  cr_expect_str_eq(rec_name(&exact, 0), "session.created");
  cr_expect_eq(json_integer_value(json_object_get(rec_data(&exact, 0), "n")), 1);

  cr_expect_eq(rec_count(&prefix), 3);
  cr_expect_str_eq(rec_name(&prefix, 0), "session.created");
  cr_expect_str_eq(rec_name(&prefix, 1), "session.closed");
  cr_expect_str_eq(rec_name(&prefix, 2), "session.status");
  cr_expect(json_is_object(rec_data(&prefix, 2)) && json_object_size(rec_data(&prefix, 2)) == 0,
            "NULL data must arrive as {}");

  cr_expect_eq(rec_count(&all), 4);
  cr_expect_str_eq(rec_name(&all, 2), "subagent.started");
  cr_expect_eq(rec_count(&other), 0);

  rec_free(&exact);
  rec_free(&prefix);
  rec_free(&all);
  rec_free(&other);
  stop_free(&loop, h);
}

Test(bus, plugin_event_reaches_subscribers) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  cr_assert_eq(th_load(h, "ok", NULL), 0);
  rec r;
  rec_init(&r);
  cr_assert_eq(subscribe(h, "ok.*", &r, NULL), 0);
  ts_outcome o;
  cr_assert_eq(th_call(&loop, h, AH_AUTH_LAN, "ok.emit", json_pack("{s:s}", "hello", "world"), &o), 0);
  cr_assert(o.done);
  cr_expect_eq(o.status, 0, "ok.emit: %s", o.message ? o.message : "");
  th_outcome_clear(&o);
  cr_assert(run_until_count(&loop, &r, 1));
  cr_expect_str_eq(rec_name(&r, 0), "ok.ping");
  cr_expect_str_eq(json_string_value(json_object_get(rec_data(&r, 0), "hello")), "world");
  rec_free(&r);
  stop_free(&loop, h);
}

Test(bus, ordered_delivery_of_1000_events) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  enum { N = 1000 };
  rec a, b, c;
  rec_init(&a);
  rec_init(&b);
  rec_init(&c);
  cr_assert_eq(subscribe(h, "*", &a, NULL), 0);
  cr_assert_eq(subscribe(h, "session.event", &b, NULL), 0);
  cr_assert_eq(subscribe(h, "session.*", &c, NULL), 0);
  /* Interleave two event names; b only sees one of them. */
  for (int i = 0; i < N; i++) {
    const char *name = i % 3 == 0 ? "session.status" : "session.event";
    cr_assert_eq(ah__host_emit(h, name, json_pack("{s:i}", "seq", i)), 0);
  }
  cr_assert(run_until_count(&loop, &a, N), "only %zu of %d delivered", rec_count(&a), N);
  cr_assert(run_until_count(&loop, &c, N));
  settle(&loop);
  cr_expect_eq(rec_count(&a), (size_t)N);
  cr_expect_eq(rec_count(&c), (size_t)N);
  size_t want_b = 0;
  for (int i = 0; i < N; i++)
    want_b += i % 3 != 0;
  cr_expect_eq(rec_count(&b), want_b);
  const rec *subs[] = {&a, &b, &c};
  for (size_t k = 0; k < 3; k++) {
    json_int_t last = -1;
    for (size_t i = 0; i < rec_count(subs[k]); i++) {
      json_int_t seq = json_integer_value(json_object_get(rec_data(subs[k], i), "seq"));
      cr_assert_gt(seq, last, "subscriber %zu: event %zu has seq %lld after %lld", k, i, (long long)seq,
                   (long long)last);
      last = seq;
    }
  }
  rec_free(&a);
  rec_free(&b);
  rec_free(&c);
  stop_free(&loop, h);
}

/* A burst reaches its subscribers in a few loop turns, not one turn per event (the fan-out of a stream to
 * many WebSockets writes each socket once for all the events of a turn), still in order and round-robin. */
Test(bus, a_burst_is_delivered_in_a_few_loop_turns) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  enum { N = 2000 };
  rec a, b;
  rec_init(&a);
  rec_init(&b);
  cr_assert_eq(subscribe(h, "*", &a, NULL), 0);
  cr_assert_eq(subscribe(h, "session.event", &b, NULL), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(ah__host_emit(h, "session.event", json_pack("{s:i}", "seq", i)), 0);
  int turns = 0;
  while ((rec_count(&a) < N || rec_count(&b) < N) && turns < 10 * N) {
    uv_run(&loop, UV_RUN_NOWAIT);
    turns++;
  }
  cr_expect_eq(rec_count(&a), (size_t)N);
  cr_expect_eq(rec_count(&b), (size_t)N);
  cr_expect_leq(turns, 20, "%d events took %d loop turns", N, turns);
  for (size_t i = 0; i < rec_count(&b); i++)
    cr_expect_eq(json_integer_value(json_object_get(rec_data(&b, i), "seq")), (json_int_t)i);
  rec_free(&a);
  rec_free(&b);
  stop_free(&loop, h);
}

/* Emits another event from inside the callback: it must be queued, not delivered re-entrantly. */
typedef struct reemit {
  rec r;
  ah_host *h;
  int left;
} reemit;

static void on_event_reemit(const char *name, const json_t *data, void *arg) {
  reemit *x = arg;
  on_event(name, data, &x->r);
  x->r.depth++;
  if (x->left-- > 0) {
    size_t before = rec_count(&x->r);
    cr_assert_eq(ah__host_emit(x->h, "session.event", json_pack("{s:i}", "left", x->left)), 0);
    cr_expect_eq(rec_count(&x->r), before, "delivered inside emit");
  }
  x->r.depth--;
}

Test(bus, delivery_never_synchronous) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  rec r;
  rec_init(&r);
  cr_assert_eq(subscribe(h, "*", &r, NULL), 0);
  cr_assert_eq(ah__host_emit(h, "session.created", NULL), 0);
  cr_expect_eq(rec_count(&r), 0, "the callback ran inside emit");
  cr_assert(run_until_count(&loop, &r, 1));

  /* From inside a callback, emitting queues the event for a later pass. */
  reemit x = {.h = h, .left = 9};
  rec_init(&x.r);
  cr_assert_eq(ah__host_api(h)->subscribe(ah__host_core_mount(h), "session.event", on_event_reemit, &x, NULL),
               0);
  cr_assert_eq(ah__host_emit(h, "session.event", NULL), 0);
  cr_expect_eq(rec_count(&x.r), 0);
  cr_assert(run_until_count(&loop, &x.r, 10));
  settle(&loop);
  cr_expect_eq(rec_count(&x.r), 10);
  cr_expect_eq(x.r.max_depth, 1, "a callback was re-entered");
  rec_free(&x.r);
  rec_free(&r);
  stop_free(&loop, h);
}

Test(bus, emit_unregistered_or_foreign_event_refused) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  cr_assert_eq(th_load(h, "ok", NULL), 0);
  const ah_host_api *api = ah__host_api(h);
  ah_mount *core = ah__host_core_mount(h);
  ah_mount *ok = ah__host_find_mount(h, "ok");
  cr_assert_not_null(ok);
  rec r;
  rec_init(&r);
  cr_assert_eq(subscribe(h, "*", &r, NULL), 0);

  /* The data is stolen also on failure (LeakSanitizer checks). */
  cr_expect_eq(api->emit(core, "nope.event", json_pack("{s:s}", "k", "v")), AH_ENOENT);
  cr_expect_eq(api->emit(core, "ok.ping", json_pack("{s:s}", "k", "v")), AH_ENOENT, "another mount's event");
  cr_expect_eq(api->emit(ok, "session.created", json_object()), AH_ENOENT, "the core's event from a plugin");
  cr_expect_eq(api->emit(ok, "ok", json_object()), AH_ENOENT);
  cr_expect_eq(api->emit(ok, "ok.echo", json_object()), AH_ENOENT, "a method name is not an event");
  cr_expect_eq(api->emit(ok, NULL, json_object()), AH_EINVAL);
  cr_expect_eq(api->emit(NULL, "ok.ping", json_object()), AH_EINVAL);
  settle(&loop);
  cr_expect_eq(rec_count(&r), 0, "a refused emit was delivered");

  cr_expect_eq(api->emit(ok, "ok.ping", NULL), 0);
  cr_expect_eq(api->emit(ok, "ok.internal", json_object()), 0);
  cr_assert(run_until_count(&loop, &r, 2));
  cr_expect_str_eq(rec_name(&r, 0), "ok.ping");
  cr_expect_str_eq(rec_name(&r, 1), "ok.internal");
  rec_free(&r);
  stop_free(&loop, h);
}

Test(bus, subscriber_unsubscribes_itself_in_callback) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  rec self, before, after;
  rec_init(&self);
  rec_init(&before);
  rec_init(&after);
  ah_sub *s = NULL;
  cr_assert_eq(subscribe(h, "*", &before, NULL), 0);
  cr_assert_eq(subscribe(h, "*", &self, &s), 0);
  cr_assert_eq(subscribe(h, "*", &after, NULL), 0);
  self.unsub = s;
  for (int i = 0; i < 5; i++)
    cr_assert_eq(ah__host_emit(h, "session.event", json_pack("{s:i}", "seq", i)), 0);
  cr_assert(run_until_count(&loop, &after, 5));
  settle(&loop);
  cr_expect_eq(rec_count(&self), 1);
  cr_expect_eq(rec_count(&before), 5);
  cr_expect_eq(rec_count(&after), 5);
  for (int i = 0; i < 5; i++)
    cr_expect_eq(json_integer_value(json_object_get(rec_data(&after, (size_t)i), "seq")), i);
  rec_free(&self);
  rec_free(&before);
  rec_free(&after);
  stop_free(&loop, h);
}

Test(bus, subscriber_unsubscribes_another_in_callback) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  /* first removes third (not yet served) on its first event; fourth removes second (already served). */
  rec first, second, third, fourth;
  rec_init(&first);
  rec_init(&second);
  rec_init(&third);
  rec_init(&fourth);
  ah_sub *s2 = NULL, *s3 = NULL;
  cr_assert_eq(subscribe(h, "*", &first, NULL), 0);
  cr_assert_eq(subscribe(h, "*", &second, &s2), 0);
  cr_assert_eq(subscribe(h, "*", &third, &s3), 0);
  cr_assert_eq(subscribe(h, "*", &fourth, NULL), 0);
  first.unsub = s3;
  fourth.unsub = s2;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(ah__host_emit(h, "session.event", json_pack("{s:i}", "seq", i)), 0);
  cr_assert(run_until_count(&loop, &fourth, 4));
  settle(&loop);
  cr_expect_eq(rec_count(&first), 4);
  cr_expect_eq(rec_count(&second), 1, "served once before it was removed");
  cr_expect_eq(rec_count(&third), 0, "removed before its first delivery");
  cr_expect_eq(rec_count(&fourth), 4);
  rec_free(&first);
  rec_free(&second);
  rec_free(&third);
  rec_free(&fourth);
  stop_free(&loop, h);
}

static size_t sub_count(ah_host *h) {
  size_t n = 0;
  AH__LIST_EACH(it, &h->subs) {
    n++;
  }
  return n;
}

static void stopped_cb(int status, void *arg) {
  (void)status;
  *(bool *)arg = true;
}

Test(bus, core_subscriptions_removed_at_withdraw) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  rec r;
  rec_init(&r);
  cr_assert_eq(subscribe(h, "*", &r, NULL), 0);
  cr_assert_eq(subscribe(h, "session.*", &r, NULL), 0);
  cr_assert_eq(sub_count(h), 2);
  /* Queued but undelivered: released with the subscriptions (LeakSanitizer), never delivered. */
  cr_assert_eq(ah__host_emit(h, "session.created", json_pack("{s:s}", "big", "payload")), 0);
  bool stopped = false;
  cr_assert_eq(ah__host_stop(h, stopped_cb, &stopped), 0);
  cr_assert(ts_run_until(&loop, &stopped, 10000));
  cr_expect_eq(sub_count(h), 0, "the core's subscriptions outlived its withdraw");
  cr_expect_eq(rec_count(&r), 0, "an event was delivered to a withdrawn mount's subscription");
  ah__host_free(h);
  rec_free(&r);
  cr_assert_eq(ts_loop_close(&loop), 0);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

Test(bus, plugin_subscriptions_removed_at_unload) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  ah_host *h = th_host_new(&loop, 0);
  cr_assert_not_null(h);
  cr_assert_eq(th_load(h, "ok", NULL), 0);
  ah_mount *ok = ah__host_find_mount(h, "ok");
  cr_assert_not_null(ok);
  rec mine, watcher;
  rec_init(&mine);
  rec_init(&watcher);
  /* A subscription owned by the plugin's mount (its callback lives in the test). */
  cr_assert_eq(ah__host_api(h)->subscribe(ok, "*", on_event, &mine, NULL), 0);
  cr_assert_eq(ah__host_api(h)->subscribe(ok, "session.*", on_event, &mine, NULL), 0);
  cr_assert_eq(subscribe(h, "session.*", &watcher, NULL), 0); /* the core's, stays */
  cr_assert_eq(sub_count(h), 3);
  cr_assert_eq(ah__host_emit(h, "session.created", NULL), 0);
  cr_assert(run_until_count(&loop, &mine, 2));
  cr_assert(run_until_count(&loop, &watcher, 1));
  settle(&loop);
  size_t had = rec_count(&mine);

  bool done = false;
  cr_assert_eq(ah__host_unload(h, "ok", stopped_cb, &done), 0);
  /* Emitted after the withdraw began: the plugin's subscriptions are already inactive. */
  cr_assert_eq(ah__host_emit(h, "session.closed", NULL), 0);
  cr_assert(ts_run_until(&loop, &done, 10000));
  cr_assert(run_until_count(&loop, &watcher, 2));
  cr_expect_eq(sub_count(h), 1, "the plugin's subscriptions outlived its withdraw");
  cr_assert_eq(ah__host_emit(h, "session.status", NULL), 0);
  cr_assert(run_until_count(&loop, &watcher, 3));
  settle(&loop);
  cr_expect_eq(rec_count(&mine), had, "a withdrawn mount's subscription got an event");
  rec_free(&mine);
  rec_free(&watcher);
  stop_free(&loop, h);
}
