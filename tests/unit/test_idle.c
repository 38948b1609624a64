/* Idle sessions leave memory ([host] idle_unload_s) and come back as cold sessions; session.follow keeps
 * one live (PROTOCOLS.md "Core": sessions, leases). Real store files, the real echo provider. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_support.h"
#include "internal.h"
#include "sessions.h"
#include "store.h"
#include "support.h"
#include "world.h"

TestSuite(idle, .timeout = 60);

/* The host again on the same state directory with `idle_ms` as [host] idle_unload_s. */
static void restart_with_idle(world *w, uint64_t idle_ms) {
  if (w->sub)
    ah__host_api(w->h)->unsubscribe(w->sub);
  w->sub = NULL;
  cr_assert_eq(th_host_stop_free(&w->loop, w->h), 0);
  cr_assert_eq(uv_loop_init(&w->loop), 0);
  w->cfg.idle_unload_ms = idle_ms;
  w->h = host_on(w);
  cr_assert_eq(ah__host_api(w->h)->subscribe(ah__host_core_mount(w->h), "*", on_bus, w, &w->sub), 0);
}

static ah_sessions *sm(world *w) {
  return ah__host_sessions(w->h);
}

/* The lease owner in the store's row, NULL when none (owned). */
static char *lease_owner(world *w, const char *id) {
  json_t *row = ah__store_get_session(ah__sessions_store(sm(w)), id);
  cr_assert_not_null(row, "no stored row for %s", id);
  const char *o = json_string_value(json_object_get(row, "leaseOwner"));
  char *r = o ? strdup(o) : NULL;
  json_decref(row);
  return r;
}

static bool live_in_list(world *w, const char *id) {
  json_t *l = ok_call(w, "session.list", json_object());
  bool live = false;
  size_t i = 0;
  json_t *s = NULL;
  json_array_foreach(json_object_get(l, "sessions"), i, s) {
    if (strcmp(json_string_value(json_object_get(s, "id")), id) == 0)
      live = json_is_true(json_object_get(s, "live"));
  }
  json_decref(l);
  return live;
}

static bool seqs_gapless(json_t *events) {
  for (size_t i = 0; i < json_array_size(events); i++)
    if (json_integer_value(json_object_get(json_array_get(events, i), "seq")) != (json_int_t)i + 1)
      return false;
  return true;
}

typedef struct count_wait {
  world *w;
  size_t n;
} count_wait;

static bool unloaded_n(void *arg) {
  count_wait *c = arg;
  return ah__sessions_unloads(sm(c->w)) >= c->n;
}

static bool lease_released(void *arg) {
  void **a = arg;
  char *o = lease_owner(a[0], a[1]);
  free(o);
  return o == NULL;
}

static const char *owner_of(world *w, const char *id, char *buf, size_t cap) {
  char *o = lease_owner(w, id);
  cr_assert_not_null(o, "the live session %s holds its lease", id);
  snprintf(buf, cap, "%s", o);
  free(o);
  return buf;
}

Test(idle, an_idle_session_leaves_memory_and_its_next_prompt_loads_it_with_seqs_continuing) {
  world w;
  world_up(&w);
  restart_with_idle(&w, 100);
  char *id = create(&w);
  free(prompt(&w, id, "first"));
  wait_for(&w, id, "turn/ended", 1);
  char owner[128];
  owner_of(&w, id, owner, sizeof owner);
  size_t loads = ah__sessions_loads(sm(&w));
  /* The timer's sweep (a quarter of 100 ms, at least 50 ms) finds it idle. */
  count_wait c = {&w, 1};
  uint64_t t0 = ts_now_ms();
  cr_assert(ts_run_until_pred(&w.loop, unloaded_n, &c, 3000), "the idle session was not unloaded");
  cr_expect_geq(ts_now_ms() - t0, 50, "unloaded before it was idle for long");
  cr_assert_eq(ah__sessions_live(sm(&w)), 0, "its memory is freed");
  void *a[2] = {&w, id};
  cr_assert(ts_run_until_pred(&w.loop, lease_released, a, 2000), "its lease is released in the store");
  cr_assert_not(live_in_list(&w, id));
  json_t *before = history(&w, id);
  size_t n_before = json_array_size(before);
  json_decref(before);
  /* The next prompt loads it as any cold session: one load, the lease taken again, seqs continue. */
  free(prompt(&w, id, "/history"));
  wait_for(&w, id, "turn/ended", 2);
  cr_assert_eq(ah__sessions_loads(sm(&w)), loads + 1, "one load for the prompt");
  char *again = lease_owner(&w, id);
  cr_assert_not_null(again, "the lease is taken again at the load");
  cr_assert_str_eq(again, owner, "by the same owner");
  free(again);
  json_t *ev = history(&w, id);
  cr_assert_gt(json_array_size(ev), n_before);
  cr_assert(seqs_gapless(ev), "seqs continue without a gap after the reload");
  cr_assert_not_null(find_kind(ev, "inbox/received", n_before), "the second prompt after the reload");
  /* The provider was given the first turn as history: the session's past came back from the store. */
  const char *said = NULL;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(ev, i, e) {
    if (strcmp(json_string_value(json_object_get(e, "kind")), "message/committed") == 0)
      said = json_string_value(json_object_get(json_object_get(e, "data"), "text"));
  }
  cr_assert_str_eq(said, "history: 2 (user, assistant)");
  json_decref(ev);
  free(id);
  world_down(&w);
}

typedef struct two {
  ts_outcome a, b;
} two;

static bool both_done(void *arg) {
  two *t = arg;
  return t->a.done && t->b.done;
}

static void dispatch_as_lan(world *w, const char *method, json_t *params, ts_outcome *o) {
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_LAN, .surface = "test", .connection_id = 7};
  cr_assert_eq(ah__host_dispatch(w->h, &c, method, params, NULL, th_reply, o), 0);
}

/* A host whose timer never unloads (1 h): the tests unload at a moment of their choosing. */
static char *settled_session(world *w) {
  restart_with_idle(w, 3600u * 1000u);
  char *id = create(w);
  free(prompt(w, id, "first"));
  wait_for(w, id, "turn/ended", 1);
  return id;
}

Test(idle, an_unload_racing_two_prompts_loads_once_and_both_get_receipts) {
  world w;
  world_up(&w);
  char *id = settled_session(&w);
  size_t loads = ah__sessions_loads(sm(&w));
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 1, "the settled session is unloaded");
  /* Its lease release is being written: the prompts come in that window. */
  two t;
  memset(&t, 0, sizeof t);
  dispatch_as_lan(&w, "session.prompt", json_pack("{s:s, s:s}", "sessionId", id, "text", "a"), &t.a);
  dispatch_as_lan(&w, "session.prompt", json_pack("{s:s, s:s}", "sessionId", id, "text", "b"), &t.b);
  cr_assert(ts_run_until_pred(&w.loop, both_done, &t, 5000));
  cr_assert_eq(t.a.status, 0, "%s", t.a.message ? t.a.message : "");
  cr_assert_eq(t.b.status, 0, "%s", t.b.message ? t.b.message : "");
  cr_assert_not_null(json_object_get(t.a.result, "messageId"));
  cr_assert_not_null(json_object_get(t.b.result, "messageId"));
  wait_for(&w, id, "turn/ended", 3);
  cr_assert_eq(ah__sessions_unloads(sm(&w)), 1);
  cr_assert_eq(ah__sessions_loads(sm(&w)), loads + 1, "the unload and the load again, never two loads");
  cr_assert_eq(ah__sessions_live(sm(&w)), 1);
  json_t *ev = history(&w, id);
  cr_assert(seqs_gapless(ev));
  json_decref(ev);
  char *o = lease_owner(&w, id);
  cr_assert_not_null(o, "the reloaded session holds its lease");
  free(o);
  th_outcome_clear(&t.a);
  th_outcome_clear(&t.b);
  free(id);
  world_down(&w);
}

Test(idle, an_unload_racing_a_close_closes_the_session) {
  world w;
  world_up(&w);
  char *id = settled_session(&w);
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 1);
  ts_outcome o;
  memset(&o, 0, sizeof o);
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_ADMIN, .surface = "test"};
  cr_assert_eq(
      ah__host_dispatch(w.h, &c, "session.close", json_pack("{s:s}", "sessionId", id), NULL, th_reply, &o),
      0);
  cr_assert(ts_run_until(&w.loop, &o.done, 5000));
  cr_assert_eq(o.status, 0, "%s", o.message ? o.message : "");
  json_t *row = ah__store_get_session(ah__sessions_store(sm(&w)), id);
  cr_assert(json_is_true(json_object_get(row, "closed")), "closed in the store");
  json_decref(row);
  cr_assert_eq(ah__sessions_live(sm(&w)), 0);
  cr_assert_eq(err_call(&w, "session.prompt", json_pack("{s:s, s:s}", "sessionId", id, "text", "x")),
               AH_ECLOSED);
  th_outcome_clear(&o);
  free(id);
  world_down(&w);
}

Test(idle, an_unload_racing_a_respond_gets_a_receipt_and_loads_nothing) {
  world w;
  world_up(&w);
  restart_with_idle(&w, 3600u * 1000u);
  char *id = create(&w);
  free(prompt(&w, id, "/tool write_file {\"path\":\"out.txt\",\"content\":\"hi\"}"));
  json_t *req = wait_request(&w, id);
  char *rid = strdup(json_string_value(json_object_get(req, "id")));
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 0, "a session waiting on a request is not idle");
  json_t *r1 = respond_as(&w, 7, json_pack("{s:s, s:{s:s}}", "id", rid, "value", "optionId", "allow_once"));
  cr_assert(json_is_true(json_object_get(r1, "accepted")));
  json_decref(r1);
  wait_for(&w, id, "turn/ended", 1);
  size_t loads = ah__sessions_loads(sm(&w));
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 1);
  /* A late answer while the lease is being released: a receipt, never a second resolution, no load. */
  ts_outcome o;
  memset(&o, 0, sizeof o);
  dispatch_as_lan(&w, "request.respond",
                  json_pack("{s:s, s:{s:s}}", "id", rid, "value", "optionId", "allow_once"), &o);
  cr_assert(ts_run_until(&w.loop, &o.done, 5000));
  cr_assert_eq(o.status, 0);
  cr_assert(json_is_false(json_object_get(o.result, "accepted")));
  cr_assert_str_eq(json_string_value(json_object_get(o.result, "reason")), "duplicate");
  count_wait c = {&w, 1};
  cr_assert(ts_run_until_pred(&w.loop, unloaded_n, &c, 2000));
  cr_assert_eq(ah__sessions_loads(sm(&w)), loads, "the respond loaded nothing");
  cr_assert_eq(ah__sessions_live(sm(&w)), 0);
  th_outcome_clear(&o);
  json_decref(req);
  free(rid);
  free(id);
  world_down(&w);
}

Test(idle, a_busy_session_is_never_unloaded) {
  world w;
  world_up(&w);
  restart_with_idle(&w, 3600u * 1000u);
  char *id = create(&w);
  free(prompt(&w, id, "/sleep 400\nslow"));
  free(prompt(&w, id, "queued"));
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 0, "a running turn and a queued prompt keep it");
  wait_for(&w, id, "turn/ended", 2);
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 1, "idle once both turns ended");
  free(id);
  world_down(&w);
}

/* A session whose files and commands go through an editor (session.set-editor, live only) stays: a reload
 * would read and write the disk instead. Cleared, it is idle again. */
Test(idle, a_session_routed_through_an_editor_is_not_unloaded) {
  world w;
  world_up(&w);
  restart_with_idle(&w, 3600u * 1000u);
  char *id = create(&w);
  json_decref(
      ok_call(&w, "session.set-editor", json_pack("{s:s, s:s}", "sessionId", id, "write", "acp.fs-write")));
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 0, "its editor routes keep it");
  json_decref(ok_call(&w, "session.set-editor", json_pack("{s:s}", "sessionId", id)));
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 1, "idle once the routes are cleared");
  free(id);
  world_down(&w);
}

/* Dispatch session.follow for `id` as a caller of `authority` (with `token`, may be NULL); *f is filled
 * when it ends. */
static void follow_as(world *w, ah_authority authority, const char *id, ah_cancel *token, ts_outcome *f) {
  memset(f, 0, sizeof *f);
  ah_caller c = {.struct_size = sizeof c, .authority = authority, .surface = "test"};
  cr_assert_eq(
      ah__host_dispatch(w->h, &c, "session.follow", json_pack("{s:s}", "sessionId", id), token, th_reply, f),
      0);
}

Test(idle, a_followed_session_stays_in_memory_until_the_follow_ends) {
  world w;
  world_up(&w);
  restart_with_idle(&w, 100);
  char *id = create(&w);
  char *other = create(&w);
  ah_cancel *token = ah__cancel_new(NULL);
  ts_outcome f;
  follow_as(&w, AH_AUTH_STDIO_OWNER, id, token, &f);
  /* The other session, not followed, leaves; the followed one stays for many idle times. */
  count_wait one = {&w, 1};
  cr_assert(ts_run_until_pred(&w.loop, unloaded_n, &one, 3000));
  cr_assert_not(ts_run_until(&w.loop, &f.done, 800), "the follow runs while the session does");
  cr_assert_eq(ah__sessions_unloads(sm(&w)), 1);
  cr_assert(live_in_list(&w, id));
  cr_assert_not(live_in_list(&w, other));
  cr_assert_eq(ah__sessions_idle_sweep(sm(&w), 0), 0, "followed: not idle");
  /* The follower lets go: answered `cancelled`, and the session is idle from then on. */
  ah__cancel_trip(token);
  cr_assert(ts_run_until(&w.loop, &f.done, 2000));
  cr_assert_eq(f.status, AH_ECANCELED, "got %s", ah_err_name(f.status));
  count_wait two_ = {&w, 2};
  cr_assert(ts_run_until_pred(&w.loop, unloaded_n, &two_, 3000), "unloaded once the follow ended");
  cr_assert_not(live_in_list(&w, id));
  ah__cancel_free(token);
  th_outcome_clear(&f);
  free(id);
  free(other);
  world_down(&w);
}

Test(idle, a_follow_is_answered_at_close_and_refused_when_unknown_or_unprivileged) {
  world w;
  world_up(&w);
  char *id = create(&w);
  ts_outcome f;
  follow_as(&w, AH_AUTH_LOOPBACK, id, NULL, &f);
  json_decref(ok_call(&w, "session.close", json_pack("{s:s}", "sessionId", id)));
  cr_assert(ts_run_until(&w.loop, &f.done, 2000), "the follow ends with the session");
  cr_assert_eq(f.status, 0);
  cr_assert_str_eq(json_string_value(json_object_get(f.result, "sessionId")), id);
  cr_assert(json_is_true(json_object_get(f.result, "closed")));
  th_outcome_clear(&f);
  cr_assert_eq(err_call(&w, "session.follow", json_pack("{s:s}", "sessionId", "nope")), AH_ENOENT);
  cr_assert_eq(err_call(&w, "session.follow", json_pack("{s:i}", "sessionId", 3)), AH_EINVAL);
  cr_assert_eq(err_call(&w, "session.follow", json_pack("{s:s}", "sessionId", id)), AH_ECLOSED);
  ts_outcome lan;
  char *other = create(&w);
  int rc = th_call(&w.loop, w.h, AH_AUTH_LAN, "session.follow", json_pack("{s:s}", "sessionId", other), &lan);
  cr_assert(rc == AH_EPERM || (rc == 0 && lan.status == AH_EPERM), "a LAN caller may not pin sessions");
  if (rc == 0)
    th_outcome_clear(&lan);
  free(other);
  free(id);
  world_down(&w);
}

Test(idle, a_follow_running_when_the_host_stops_is_answered_and_the_stop_is_clean) {
  world w;
  world_up(&w);
  char *id = create(&w);
  ts_outcome f;
  follow_as(&w, AH_AUTH_ADMIN, id, NULL, &f);
  cr_assert_not(ts_run_until(&w.loop, &f.done, 100));
  cr_assert_eq(th_host_stop_free(&w.loop, w.h), 0);
  w.h = NULL;
  w.sub = NULL;
  cr_assert(f.done, "answered when the host stopped");
  cr_assert_neq(f.status, 0);
  th_outcome_clear(&f);
  cr_assert_eq(uv_loop_init(&w.loop), 0);
  free(id);
  world_down(&w);
  cr_assert_eq(th_leak_check(), 0);
}

/* Calls that come while a close is being committed (after the running turn ended, before the commit) are
 * answered: the close's callers once it committed, the others `closed` at once. */
typedef struct three {
  ts_outcome close, prompt, policy;
} three;

static bool three_done(void *arg) {
  three *t = arg;
  return t->close.done && t->prompt.done && t->policy.done;
}

/* Close `id` with a prompt and a policy change right behind it: all three answered, the two others `closed`.
 */
static void close_with_calls(world *w, const char *id, const char *what) {
  three t;
  memset(&t, 0, sizeof t);
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_ADMIN, .surface = "test"};
  cr_assert_eq(ah__host_dispatch(w->h, &c, "session.close", json_pack("{s:s}", "sessionId", id), NULL,
                                 th_reply, &t.close),
               0);
  cr_assert_eq(ah__host_dispatch(w->h, &c, "session.prompt",
                                 json_pack("{s:s, s:s}", "sessionId", id, "text", "x"), NULL, th_reply,
                                 &t.prompt),
               0);
  cr_assert_eq(ah__host_dispatch(w->h, &c, "session.set-policy",
                                 json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "read_file", "deny"),
                                 NULL, th_reply, &t.policy),
               0);
  cr_assert(ts_run_until_pred(&w->loop, three_done, &t, 5000),
            "%s: a call during the close was never answered", what);
  cr_assert_eq(t.close.status, 0, "%s: %s", what, t.close.message ? t.close.message : "");
  cr_assert_eq(t.prompt.status, AH_ECLOSED, "%s: got %s", what, ah_err_name(t.prompt.status));
  cr_assert_eq(t.policy.status, AH_ECLOSED, "%s: got %s", what, ah_err_name(t.policy.status));
  th_outcome_clear(&t.close);
  th_outcome_clear(&t.prompt);
  th_outcome_clear(&t.policy);
}

Test(idle, calls_during_a_close_commit_are_answered) {
  world w;
  world_up(&w);
  /* A live session with a running turn: the close cancels it and commits once it ended. */
  char *id = create(&w);
  free(prompt(&w, id, "/sleep 200\nslow"));
  close_with_calls(&w, id, "live");
  /* A cold session: the close loads it; the calls that came with it wait for that load. */
  char *cold = create(&w);
  restart_with_idle(&w, 3600u * 1000u);
  close_with_calls(&w, cold, "cold");
  free(cold);
  free(id);
  world_down(&w);
}

typedef struct mem_wait {
  world *w;
  int64_t below;
} mem_wait;

static int64_t store_memory(world *w) {
  int64_t m = ah__store_memory_used(ah__sessions_store(sm(w)));
  cr_assert_geq(m, 0, "the SQLite store tells its memory");
  return m;
}

static bool store_memory_below(void *arg) {
  mem_wait *m = arg;
  return store_memory(m->w) < m->below;
}

/* With nothing live the store's page caches go back once nothing was read for a sweep — also when reads
 * (a client paging through the events) filled them again after the sessions had left. */
Test(idle, the_store_caches_go_back_once_nothing_is_live_and_nothing_is_read) {
  world w;
  world_up(&w);
  restart_with_idle(&w, 100);
  size_t n = 256 * 1024;
  char *big = malloc(n + 1);
  for (size_t i = 0; i < n; i++)
    big[i] = (char)('a' + i % 26);
  big[n] = '\0';
  char *id = create(&w);
  for (int i = 0; i < 6; i++) { /* each turn stores the prompt and its echo: ~3 MB in all */
    free(prompt(&w, id, big));
    wait_for(&w, id, "turn/ended", (size_t)i + 1);
  }
  int64_t written = store_memory(&w);
  count_wait c = {&w, 1};
  cr_assert(ts_run_until_pred(&w.loop, unloaded_n, &c, 3000), "the idle session was not unloaded");
  /* Both connections' caches (the reader's at once, the writer's in its queue): a fraction is left. */
  mem_wait low = {&w, written / 4};
  cr_assert(ts_run_until_pred(&w.loop, store_memory_below, &low, 3000),
            "the store still holds %lld bytes (%lld after the writes) with nothing live",
            (long long)store_memory(&w), (long long)written);
  int64_t shrunk = store_memory(&w);
  json_t *ev = history(&w, id); /* a reader, nothing live: the reader's cache fills */
  cr_assert_geq(json_array_size(ev), 12);
  json_decref(ev);
  int64_t read = store_memory(&w);
  cr_assert_gt(read, shrunk + 1024 * 1024, "the reads did not fill the cache (%lld → %lld bytes)",
               (long long)shrunk, (long long)read);
  cr_assert_eq(ah__sessions_live(sm(&w)), 0, "reading a session's events does not load it");
  mem_wait back = {&w, shrunk + 256 * 1024};
  cr_expect(ts_run_until_pred(&w.loop, store_memory_below, &back, 3000),
            "the store's caches stayed at %lld bytes (%lld before the reads) with nothing live or read",
            (long long)store_memory(&w), (long long)shrunk);
  free(big);
  free(id);
  world_down(&w);
}
