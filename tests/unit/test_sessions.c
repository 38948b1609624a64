/* Sessions, agents, turns, server requests (PROTOCOLS.md "Core": sessions, events, server requests):
 * real store files, the real echo provider, the real tools. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host_support.h"
#include "internal.h"
#include "sessions.h"
#include "store.h"
#include "support.h"
#include "tools.h"
#include "world.h"

/* json_equal with a freshly packed expected value, which it frees. */
static bool equal_packed(const json_t *got, json_t *want) {
  bool eq = json_equal(got, want);
  json_decref(want);
  return eq;
}
static bool seq_gapless(json_t *events) {
  for (size_t i = 0; i < json_array_size(events); i++)
    if (json_integer_value(json_object_get(json_array_get(events, i), "seq")) != (json_int_t)i + 1)
      return false;
  return true;
}

TestSuite(sessions, .timeout = 60);

static bool idle_published(void *arg) {
  world *w = arg;
  bool running = false;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(w->events, i, e) {
    if (strcmp(json_string_value(json_array_get(e, 0)), "session.status") != 0)
      continue;
    const char *st = json_string_value(json_object_get(json_array_get(e, 1), "status"));
    if (strcmp(st, "running") == 0)
      running = true;
    else if (running)
      return true;
  }
  return false;
}

static bool five_published(void *arg) {
  world *w = arg;
  int n = 0;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(w->events, i, e) {
    n += strcmp(json_string_value(json_array_get(e, 0)), "session.event") == 0;
  }
  return n >= 5;
}

Test(sessions, prompt_runs_a_turn_with_gapless_events_and_status) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *mid = prompt(&w, id, "hello");
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_assert(seq_gapless(ev));
  const char *kinds[] = {"inbox/received", "inbox/claimed", "turn/started", "message/committed",
                         "turn/ended"};
  cr_assert_eq(json_array_size(ev), 5);
  for (size_t i = 0; i < 5; i++)
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, i), "kind")), kinds[i]);
  json_t *commit = find_kind(ev, "message/committed", 0);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(commit, "data"), "text")),
                   "echo: hello");
  json_t *end = find_kind(ev, "turn/ended", 0);
  cr_assert_str_eq(json_string_value(json_object_get(end, "messageId")), mid);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(end, "data"), "reason")), "end");
  cr_assert_gt(json_integer_value(json_object_get(end, "cursor")), 0);
  cr_assert(ts_run_until_pred(&w.loop, five_published, &w, 5000), "the bus did not publish the five events");
  /* session.status is published once its own write committed, after the events it follows. */
  cr_assert(ts_run_until_pred(&w.loop, idle_published, &w, 5000), "the bus did not publish idle");
  /* The bus saw: created, running, the stored events in order (with cursors), a delta, idle. */
  bool running = false, idle_after = false, delta = false;
  int64_t last_seq = 0;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(w.events, i, e) {
    const char *name = json_string_value(json_array_get(e, 0));
    json_t *d = json_array_get(e, 1);
    if (strcmp(name, "session.status") == 0) {
      const char *st = json_string_value(json_object_get(d, "status"));
      if (strcmp(st, "running") == 0)
        running = true;
      else if (running)
        idle_after = true;
    } else if (strcmp(name, "session.event") == 0) {
      int64_t seq = json_integer_value(json_object_get(json_object_get(d, "event"), "seq"));
      cr_assert_eq(seq, last_seq + 1, "bus order");
      last_seq = seq;
    } else if (strcmp(name, "session.delta") == 0) {
      delta = true;
    }
  }
  cr_assert(running && idle_after && delta);
  cr_assert_eq(last_seq, 5);
  json_decref(ev);
  free(mid);
  free(id);
  world_down(&w);
}

static void receipt_checks_store(const ah_outcome *o, void *arg) {
  world *w = arg;
  cr_assert_eq(o->status, 0);
  const char *mid = json_string_value(json_object_get(o->result, "messageId"));
  const char *sid = json_string_value(json_object_get(o->result, "sessionId"));
  /* At the moment of the receipt the inbox row and its event are already durable (read back through the
   * store's own read connection). */
  json_t *ev = ah__store_events(ah__sessions_store(ah__host_sessions(w->h)), sid, 0, 100);
  json_t *first = json_array_get(ev, 0);
  cr_assert_not_null(first, "no stored event at receipt time");
  cr_assert_str_eq(json_string_value(json_object_get(first, "kind")), "inbox/received");
  cr_assert_str_eq(json_string_value(json_object_get(first, "messageId")), mid);
  json_decref(ev);
  json_array_append_new(w->events, json_pack("[ss]", "receipt", mid));
}

Test(sessions, receipt_only_after_the_inbox_row_is_committed) {
  world w;
  world_up(&w);
  char *id = create(&w);
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_LAN, .surface = "test"};
  cr_assert_eq(ah__host_dispatch(w.h, &c, "session.prompt",
                                 json_pack("{s:s, s:s}", "sessionId", id, "text", "x"), NULL,
                                 receipt_checks_store, &w),
               0);
  wait_for(&w, id, "turn/ended", 1);
  bool got = false;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(w.events, i, e) {
    got = got || strcmp(json_string_value(json_array_get(e, 0)), "receipt") == 0;
  }
  cr_assert(got);
  free(id);
  world_down(&w);
}

static void receipt_noted(const ah_outcome *o, void *arg) {
  world *w = arg;
  cr_assert_eq(o->status, 0, "%s", o->message ? o->message : "");
  json_array_append_new(
      w->events, json_pack("[ss]", "receipt", json_string_value(json_object_get(o->result, "messageId"))));
}

static size_t count_named(world *w, const char *name) {
  size_t n = 0, i = 0;
  json_t *e = NULL;
  json_array_foreach(w->events, i, e) n += strcmp(json_string_value(json_array_get(e, 0)), name) == 0;
  return n;
}

/* The write lock of the session store, held by another connection (as another process would). */
static sqlite3 *hold_write_lock(world *w) {
  char path[600];
  snprintf(path, sizeof path, "%s/agenthost.db", w->cfg.state_dir);
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000); /* the host's writer may be committing */
  cr_assert_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
  return db;
}

static void release_write_lock(sqlite3 *db) {
  cr_assert_eq(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
}

/* Issue 17, a faster prompt path: an idle agent starts the turn while the receipt is being stored, so its
 * first delta does not wait for a commit, and the receipt is still sent only once it is durable; a tool
 * has no effect before its tool/call event (written after the prompt) is stored. The store's writer is held
 * by another connection's write lock for a moment (within the busy timeout). */
Test(sessions, the_turn_starts_before_the_receipt_commits_but_a_tool_waits_for_its_stored_call) {
  world w;
  world_up(&w);
  char *id = create(&w);
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "run_command", "allow")));
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_ADMIN, .surface = "test"};
  /* A prompt: its delta is out while the write lock is held; its receipt only after. */
  sqlite3 *db = hold_write_lock(&w);
  cr_assert_eq(ah__host_dispatch(w.h, &c, "session.prompt",
                                 json_pack("{s:s, s:s}", "sessionId", id, "text", "hi"), NULL, receipt_noted,
                                 &w),
               0);
  bus_wait delta = {&w, "session.delta", "text"};
  cr_expect(ts_run_until_pred(&w.loop, bus_published, &delta, 3000),
            "no delta while the receipt was being stored");
  cr_expect_eq(count_named(&w, "receipt"), 0, "a receipt before the prompt was stored");
  release_write_lock(db);
  wait_for(&w, id, "turn/ended", 1);
  cr_expect_eq(count_named(&w, "receipt"), 1);
  /* A tool call: nothing runs while its call cannot be stored. */
  char mark[600];
  snprintf(mark, sizeof mark, "%s/mark", w.work);
  db = hold_write_lock(&w);
  char text[800];
  snprintf(text, sizeof text, "/tool run_command {\"command\":\"touch %s\"}", mark);
  cr_assert_eq(ah__host_dispatch(w.h, &c, "session.prompt",
                                 json_pack("{s:s, s:s}", "sessionId", id, "text", text), NULL, receipt_noted,
                                 &w),
               0);
  volatile bool never = false;
  ts_run_until(&w.loop, &never, 800);
  cr_expect_neq(access(mark, F_OK), 0, "the tool ran before its call was stored");
  release_write_lock(db);
  wait_for(&w, id, "turn/ended", 2);
  cr_expect_eq(access(mark, F_OK), 0, "the tool never ran");
  json_t *ev = history(&w, id);
  cr_expect(seq_gapless(ev));
  json_t *call = find_kind(ev, "tool/call", 0);
  json_t *result = find_kind(ev, "tool/result", 0);
  cr_assert(call && result);
  cr_expect_lt(json_integer_value(json_object_get(call, "seq")),
               json_integer_value(json_object_get(result, "seq")));
  cr_expect_eq(json_is_false(json_object_get(json_object_get(result, "data"), "isError")), true, "%s",
               json_dumps(result, JSON_COMPACT));
  json_decref(ev);
  free(id);
  world_down(&w);
}

Test(sessions, failure_is_attributed_to_its_own_message) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *m1 = prompt(&w, id, "/sleep 50\nfirst");
  char *m2 = prompt(&w, id, "/fail boom");
  char *m3 = prompt(&w, id, "third");
  wait_for(&w, id, "turn/ended", 3);
  json_t *ev = history(&w, id);
  cr_assert(seq_gapless(ev));
  const char *mids[3] = {m1, m2, m3};
  const char *reasons[3] = {"end", "error", "end"};
  size_t from = 0;
  for (int k = 0; k < 3; k++) {
    json_t *end = find_kind(ev, "turn/ended", from);
    cr_assert_not_null(end);
    cr_assert_str_eq(json_string_value(json_object_get(end, "messageId")), mids[k], "turn %d", k);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(end, "data"), "reason")), reasons[k]);
    from = (size_t)json_integer_value(json_object_get(end, "seq"));
  }
  cr_assert_str_eq(json_string_value(json_object_get(
                       json_object_get(find_kind(ev, "turn/ended", 0 + 0), "data"), "reason")),
                   "end");
  json_decref(ev);
  free(m1);
  free(m2);
  free(m3);
  free(id);
  world_down(&w);
}

Test(sessions, history_never_wakes_an_agent_nor_changes_the_store) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *mid = prompt(&w, id, "hello");
  wait_for(&w, id, "turn/ended", 1);
  free(mid);
  /* Restart the host: the session is cold. */
  cr_assert_eq(th_host_stop_free(&w.loop, w.h), 0);
  cr_assert_eq(uv_loop_init(&w.loop), 0);
  w.h = host_on(&w);
  cr_assert_eq(ah__sessions_live(ah__host_sessions(w.h)), 0);
  char path[600];
  snprintf(path, sizeof path, "%s/agenthost.db", w.state);
  json_t *before = ah__store_get_session(ah__sessions_store(ah__host_sessions(w.h)), id);
  json_t *ev = history(&w, id);
  cr_assert_eq(json_array_size(ev), 5);
  json_decref(ev);
  json_t *g = ok_call(&w, "session.get", json_pack("{s:s}", "sessionId", id));
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(g, "session"), "status")), "idle");
  cr_assert(json_is_false(json_object_get(json_object_get(g, "session"), "live")));
  json_decref(g);
  json_t *after = ah__store_get_session(ah__sessions_store(ah__host_sessions(w.h)), id);
  cr_assert(json_equal(before, after), "the row changed (a lease was taken?)");
  cr_assert_eq(ah__sessions_live(ah__host_sessions(w.h)), 0);
  cr_assert_eq(ah__sessions_loads(ah__host_sessions(w.h)), 0);
  json_decref(before);
  json_decref(after);
  free(id);
  world_down(&w);
}

typedef struct two {
  ts_outcome a, b;
} two;

static bool both(void *arg) {
  two *t = arg;
  return t->a.done && t->b.done;
}

Test(sessions, concurrent_cold_resumes_load_once) {
  world w;
  world_up(&w);
  char *id = create(&w);
  cr_assert_eq(th_host_stop_free(&w.loop, w.h), 0);
  cr_assert_eq(uv_loop_init(&w.loop), 0);
  w.h = host_on(&w);
  two t;
  memset(&t, 0, sizeof t);
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_LAN, .surface = "test"};
  cr_assert_eq(ah__host_dispatch(w.h, &c, "session.prompt",
                                 json_pack("{s:s, s:s}", "sessionId", id, "text", "a"), NULL, th_reply, &t.a),
               0);
  cr_assert_eq(ah__host_dispatch(w.h, &c, "session.prompt",
                                 json_pack("{s:s, s:s}", "sessionId", id, "text", "b"), NULL, th_reply, &t.b),
               0);
  cr_assert(ts_run_until_pred(&w.loop, both, &t, 5000));
  cr_assert_eq(t.a.status, 0);
  cr_assert_eq(t.b.status, 0);
  cr_assert_eq(ah__sessions_loads(ah__host_sessions(w.h)), 1, "two concurrent cold resumes, one load");
  wait_for(&w, id, "turn/ended", 2);
  th_outcome_clear(&t.a);
  th_outcome_clear(&t.b);
  free(id);
  world_down(&w);
}

Test(sessions, a_second_owner_gets_agent_busy) {
  world w;
  world_up(&w);
  char *id = create(&w); /* live in host A, lease held */
  /* Host B on the same state directory (a second process, as far as leases go: another owner). */
  uv_loop_t loop_b;
  cr_assert_eq(uv_loop_init(&loop_b), 0);
  ah_host *b = NULL;
  ah_host_opts opts = {.loop = &loop_b, .config = &w.cfg, .mode = "serve", .drain_ms = 1000};
  cr_assert_eq(ah__host_new(&opts, &b), 0);
  ts_outcome o;
  cr_assert_eq(th_call(&loop_b, b, AH_AUTH_LAN, "session.prompt",
                       json_pack("{s:s, s:s}", "sessionId", id, "text", "x"), &o),
               0);
  cr_assert_eq(o.status, AH_EAGENTBUSY, "got %s", ah_err_name(o.status));
  cr_assert_str_eq(ah_err_category(o.status), "agent-busy");
  th_outcome_clear(&o);
  cr_assert_eq(th_host_stop_free(&loop_b, b), 0);
  free(id);
  world_down(&w);
}

Test(sessions, unknown_session_is_not_found_never_a_new_one) {
  world w;
  world_up(&w);
  cr_assert_eq(err_call(&w, "session.prompt", json_pack("{s:s, s:s}", "sessionId", "nope", "text", "x")),
               AH_ENOENT);
  cr_assert_eq(err_call(&w, "session.history", json_pack("{s:s}", "sessionId", "nope")), AH_ENOENT);
  cr_assert_eq(err_call(&w, "session.create", json_pack("{s:s}", "cwd", "relative/dir")), AH_EINVAL);
  cr_assert_eq(err_call(&w, "session.create", json_pack("{s:s, s:s}", "cwd", w.work, "provider", "nope")),
               AH_EUNAVAILABLE);
  json_t *l = ok_call(&w, "session.list", json_object());
  cr_assert_eq(json_array_size(json_object_get(l, "sessions")), 0);
  json_decref(l);
  world_down(&w);
}

Test(sessions, approval_first_answer_wins_with_receipts) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *mid = prompt(&w, id, "/tool write_file {\"path\":\"out.txt\",\"content\":\"hi\"}");
  json_t *req = wait_request(&w, id);
  const char *rid = json_string_value(json_object_get(req, "id"));
  cr_assert_str_eq(json_string_value(json_object_get(req, "kind")), "approval");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(req, "params"), "tool")), "write_file");
  /* A value that is not one of the options is refused and changes nothing. */
  ts_outcome bad;
  memset(&bad, 0, sizeof bad);
  ah_caller c = {.struct_size = sizeof c, .authority = AH_AUTH_LAN, .surface = "test", .connection_id = 7};
  cr_assert_eq(ah__host_dispatch(w.h, &c, "request.respond",
                                 json_pack("{s:s, s:{s:s}}", "id", rid, "value", "optionId", "sure"), NULL,
                                 th_reply, &bad),
               0);
  cr_assert(ts_run_until(&w.loop, &bad.done, 2000));
  cr_assert_eq(bad.status, AH_EINVAL);
  th_outcome_clear(&bad);
  json_t *r1 = respond_as(&w, 1, json_pack("{s:s, s:{s:s}}", "id", rid, "value", "optionId", "allow_once"));
  cr_assert(json_is_true(json_object_get(r1, "accepted")));
  json_t *r2 = respond_as(&w, 1, json_pack("{s:s, s:{s:s}}", "id", rid, "value", "optionId", "reject_once"));
  cr_assert(json_is_false(json_object_get(r2, "accepted")));
  cr_assert_str_eq(json_string_value(json_object_get(r2, "reason")), "duplicate");
  json_t *r3 = respond_as(&w, 2, json_pack("{s:s, s:{s:s}}", "id", rid, "value", "optionId", "reject_once"));
  cr_assert(json_is_false(json_object_get(r3, "accepted")));
  cr_assert_str_eq(json_string_value(json_object_get(r3, "reason")), "resolved");
  json_t *r4 =
      respond_as(&w, 2, json_pack("{s:s, s:{s:s}}", "id", "no-such-id", "value", "optionId", "allow_once"));
  cr_assert_str_eq(json_string_value(json_object_get(r4, "reason")), "unknown");
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *appr = find_kind(ev, "tool/approval", 0);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(appr, "data"), "outcome")), "granted");
  json_t *res = find_kind(ev, "tool/result", 0);
  cr_assert(json_is_false(json_object_get(json_object_get(res, "data"), "isError")));
  char path[600];
  snprintf(path, sizeof path, "%s/out.txt", w.work);
  char *text = ts_read_file(path, NULL);
  cr_assert_not_null(text, "the granted write ran");
  cr_assert_str_eq(text, "hi");
  free(text);
  json_decref(ev);
  json_decref(r1);
  json_decref(r2);
  json_decref(r3);
  json_decref(r4);
  json_decref(req);
  free(mid);
  free(id);
  world_down(&w);
}

Test(sessions, cancel_resolves_pending_approvals_as_cancelled_never_granted) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *mid = prompt(&w, id, "/tool write_file {\"path\":\"never.txt\",\"content\":\"x\"}");
  json_t *req = wait_request(&w, id);
  char *rid = strdup(json_string_value(json_object_get(req, "id")));
  json_t *c = ok_call(&w, "session.cancel", json_pack("{s:s}", "sessionId", id));
  cr_assert(json_is_true(json_object_get(c, "cancelled")));
  json_decref(c);
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *end = find_kind(ev, "turn/ended", 0);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(end, "data"), "reason")), "cancelled");
  json_t *appr = find_kind(ev, "tool/approval", 0);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(appr, "data"), "outcome")), "cancelled");
  json_t *late = respond_as(&w, 3, json_pack("{s:s, s:{s:s}}", "id", rid, "value", "optionId", "allow_once"));
  cr_assert(json_is_false(json_object_get(late, "accepted")), "a late grant after cancel is refused");
  char path[600];
  snprintf(path, sizeof path, "%s/never.txt", w.work);
  cr_assert_neq(access(path, F_OK), 0, "the tool never ran");
  json_t *pend = pending_requests(&w, id);
  cr_assert_eq(json_array_size(pend), 0);
  bool resolved_cancelled = false;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(w.events, i, e) {
    if (strcmp(json_string_value(json_array_get(e, 0)), "request.resolved") == 0)
      resolved_cancelled =
          strcmp(json_string_value(json_object_get(json_array_get(e, 1), "state")), "cancelled") == 0;
  }
  cr_assert(resolved_cancelled);
  json_decref(pend);
  json_decref(late);
  json_decref(ev);
  json_decref(req);
  free(rid);
  free(mid);
  free(id);
  world_down(&w);
}

Test(sessions, cancel_kills_a_sleeping_grandchild) {
  cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  world w;
  world_up(&w);
  char *id = create(&w);
  json_t *p = ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "run_command", "allow"));
  json_decref(p);
  char pidfile[600];
  snprintf(pidfile, sizeof pidfile, "%s/pgid", w.dir);
  char text[1200];
  snprintf(text, sizeof text, "/tool run_command {\"command\":\"echo $$ > %s; sleep 1000 & sleep 1000\"}",
           pidfile);
  char *mid = prompt(&w, id, text);
  uint64_t deadline = ts_now_ms() + 5000;
  char *pg = NULL;
  /* The file exists before the shell wrote its pid into it: wait for the whole line. */
  while (ts_now_ms() < deadline) {
    pg = ts_read_file(pidfile, NULL);
    if (pg && strchr(pg, '\n'))
      break;
    free(pg);
    pg = NULL;
    uv_run(&w.loop, UV_RUN_NOWAIT);
  }
  cr_assert_not_null(pg);
  cr_assert_gt(atoi(pg), 1);
  pid_t pgid = (pid_t)atoi(pg);
  free(pg);
  usleep(100000);
  cr_assert_eq(kill(-pgid, 0), 0, "the command's group is running");
  json_decref(ok_call(&w, "session.cancel", json_pack("{s:s}", "sessionId", id)));
  wait_for(&w, id, "turn/ended", 1);
  cr_assert(ts_run_until_pred(&w.loop, ts_group_gone, &pgid, 5000), "the sleep grandchild survived");
  json_t *ev = history(&w, id);
  json_t *res = find_kind(ev, "tool/result", 0);
  cr_assert(
      json_is_true(json_object_get(json_object_get(json_object_get(res, "data"), "result"), "cancelled")));
  json_decref(ev);
  free(mid);
  free(id);
  world_down(&w);
}

Test(sessions, allow_always_sets_the_policy_stored_with_the_session) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *m1 = prompt(&w, id, "/tool write_file {\"path\":\"a.txt\",\"content\":\"1\"}");
  json_t *req = wait_request(&w, id);
  json_decref(respond_as(
      &w, 1,
      json_pack("{s:O, s:{s:s}}", "id", json_object_get(req, "id"), "value", "optionId", "allow_always")));
  wait_for(&w, id, "turn/ended", 1);
  char *m2 = prompt(&w, id, "/tool write_file {\"path\":\"b.txt\",\"content\":\"2\"}");
  wait_for(&w, id, "turn/ended", 2);
  json_t *pend = pending_requests(&w, id);
  cr_assert_eq(json_array_size(pend), 0, "no second approval was asked");
  json_t *row = ah__store_get_session(ah__sessions_store(ah__host_sessions(w.h)), id);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(row, "policy"), "write_file")), "allow");
  json_decref(row);
  json_decref(pend);
  json_decref(req);
  free(m1);
  free(m2);
  free(id);
  world_down(&w);
}

Test(sessions, question_answered_and_subagent_events_on_the_parent) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *m1 = prompt(&w, id, "/ask colour?");
  json_t *req = wait_request(&w, id);
  cr_assert_str_eq(json_string_value(json_object_get(req, "kind")), "question");
  json_decref(respond_as(
      &w, 1, json_pack("{s:O, s:{s:s}}", "id", json_object_get(req, "id"), "value", "answer", "blue")));
  wait_for(&w, id, "turn/ended", 1);
  char *m2 = prompt(&w, id, "/subagent say hi");
  wait_for(&w, id, "turn/ended", 2);
  bus_wait child_done = {&w, "subagent.finished", NULL};
  cr_assert(ts_run_until_pred(&w.loop, bus_published, &child_done, 5000));
  json_t *ev = history(&w, id);
  cr_assert(seq_gapless(ev));
  json_t *c1 = find_kind(ev, "message/committed", 0);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c1, "data"), "text")), "answer: blue");
  json_t *st = find_kind(ev, "subagent/started", 0);
  json_t *fin = find_kind(ev, "subagent/finished", 0);
  cr_assert_not_null(st);
  cr_assert_not_null(fin);
  const char *child = json_string_value(json_object_get(json_object_get(st, "data"), "sessionId"));
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(fin, "data"), "text")), "echo: say hi");
  json_t *c2 =
      find_kind(ev, "message/committed", (size_t)json_integer_value(json_object_get(fin, "seq")) - 1);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c2, "data"), "text")),
                   "subagent: echo: say hi");
  json_t *g = ok_call(&w, "session.get", json_pack("{s:s}", "sessionId", child));
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(g, "session"), "parent")), id);
  cr_assert(json_is_true(json_object_get(json_object_get(g, "session"), "local")));
  json_decref(g);
  bool started = false, finished = false;
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(w.events, i, e) {
    started = started || strcmp(json_string_value(json_array_get(e, 0)), "subagent.started") == 0;
    finished = finished || strcmp(json_string_value(json_array_get(e, 0)), "subagent.finished") == 0;
  }
  cr_assert(started && finished);
  json_decref(ev);
  json_decref(req);
  free(m1);
  free(m2);
  free(id);
  world_down(&w);
}

Test(sessions, close_export_delete_and_list_pages) {
  world w;
  world_up(&w);
  char *ids[3];
  for (int i = 0; i < 3; i++)
    ids[i] = create(&w);
  char *mid = prompt(&w, ids[0], "hello");
  wait_for(&w, ids[0], "turn/ended", 1);
  json_t *p1 = ok_call(&w, "session.list", json_pack("{s:i}", "limit", 2));
  cr_assert_eq(json_array_size(json_object_get(p1, "sessions")), 2);
  const char *cur = json_string_value(json_object_get(p1, "nextCursor"));
  cr_assert_not_null(cur);
  json_t *p2 = ok_call(&w, "session.list", json_pack("{s:s, s:i}", "cursor", cur, "limit", 2));
  cr_assert_eq(json_array_size(json_object_get(p2, "sessions")), 1);
  cr_assert(json_is_null(json_object_get(p2, "nextCursor")) || !json_object_get(p2, "nextCursor"));
  json_decref(p1);
  json_decref(p2);
  json_t *x = ok_call(&w, "session.export", json_pack("{s:s}", "sessionId", ids[0]));
  const char *jsonl = json_string_value(json_object_get(x, "jsonl"));
  int lines = 0;
  for (const char *q = jsonl; *q; q++)
    lines += *q == '\n';
  cr_assert_eq(lines, 5);
  json_decref(x);
  cr_assert_eq(err_call(&w, "session.delete", json_pack("{s:s}", "sessionId", ids[0])), AH_EBUSY);
  json_decref(ok_call(&w, "session.close", json_pack("{s:s}", "sessionId", ids[0])));
  cr_assert_eq(err_call(&w, "session.prompt", json_pack("{s:s, s:s}", "sessionId", ids[0], "text", "x")),
               AH_ECLOSED);
  json_decref(ok_call(&w, "session.delete", json_pack("{s:s}", "sessionId", ids[0])));
  cr_assert_eq(err_call(&w, "session.get", json_pack("{s:s}", "sessionId", ids[0])), AH_ENOENT);
  for (int i = 0; i < 3; i++)
    free(ids[i]);
  free(mid);
  world_down(&w);
}

Test(sessions, the_provider_gets_the_earlier_turns_as_history) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *m1 = prompt(&w, id, "hello");
  char *m2 = prompt(&w, id, "/history");
  char *m3 = prompt(&w, id, "/history");
  wait_for(&w, id, "turn/ended", 3);
  json_t *ev = history(&w, id);
  json_t *c2 = find_kind(ev, "message/committed", 0);
  c2 = find_kind(ev, "message/committed", (size_t)json_integer_value(json_object_get(c2, "seq")));
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c2, "data"), "text")),
                   "history: 2 (user, assistant)");
  json_t *c3 = find_kind(ev, "message/committed", (size_t)json_integer_value(json_object_get(c2, "seq")));
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c3, "data"), "text")),
                   "history: 4 (user, assistant, user, assistant)");
  json_decref(ev);
  free(m1);
  free(m2);
  free(m3);
  free(id);
  world_down(&w);
}

Test(sessions, subagents_stop_at_the_depth_limit) {
  world w;
  world_up(&w);
  char *id = create(&w);
  /* Each level starts the next: depths 1, 2 and 3 are allowed, the fourth is refused. */
  char *mid = prompt(&w, id, "/subagent /subagent /subagent /subagent hi");
  wait_for(&w, id, "turn/ended", 1);
  json_t *l = ok_call(&w, "session.list", json_pack("{s:i}", "limit", 100));
  json_t *sessions = json_object_get(l, "sessions");
  cr_assert_eq(json_array_size(sessions), 4, "the root and three levels of subagents");
  int max_depth = 0;
  const char *deepest = NULL;
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(sessions, i, row) {
    int d = (int)json_integer_value(json_object_get(row, "depth"));
    if (d > max_depth) {
      max_depth = d;
      deepest = json_string_value(json_object_get(row, "id"));
    }
  }
  cr_assert_eq(max_depth, 3);
  json_t *ev = history(&w, deepest);
  json_t *err = find_kind(ev, "agent/error", 0);
  cr_assert_not_null(err, "the deepest subagent recorded the refusal");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(err, "data"), "message")),
                   "subagent depth limit reached");
  json_decref(ev);
  json_t *root = history(&w, id);
  json_t *fin = find_kind(root, "subagent/finished", 0);
  cr_assert_not_null(fin);
  json_decref(root);
  json_decref(l);
  free(mid);
  free(id);
  world_down(&w);
}

/* ---- providers registered by plugins (ah_host_api.register_provider) -------------------------------- */

static json_t *fixture_stats(world *w) {
  return ok_call(w, "fixture.stats", json_object());
}

static bool no_live_fixture_turn(void *arg) {
  json_t *st = fixture_stats(arg);
  bool none = json_integer_value(json_object_get(st, "live")) == 0;
  json_decref(st);
  return none;
}

static bool one_live_fixture_turn(void *arg) {
  json_t *st = fixture_stats(arg);
  bool one = json_integer_value(json_object_get(st, "live")) == 1;
  json_decref(st);
  return one;
}

static const char *event_text(json_t *ev, const char *kind, const char *field) {
  return json_string_value(json_object_get(json_object_get(find_kind(ev, kind, 0), "data"), field));
}

Test(sessions, a_plugin_provider_runs_turns_with_its_configured_section) {
  world w;
  world_up(&w);
  w.cfg.providers = json_pack("{s:{s:s, s:s}}", "fx", "type", "fixture", "greeting", "hola");
  cr_assert_eq(th_load(w.h, "provider", NULL), 0);
  json_t *d = ok_call(&w, "host.describe", NULL);
  bool listed = false;
  size_t i = 0;
  json_t *p = NULL;
  json_array_foreach(json_object_get(d, "plugins"), i, p) {
    listed |= strcmp(json_string_value(json_object_get(p, "name")), "provider") == 0 &&
              equal_packed(json_object_get(p, "providers"), json_pack("[s]", "fixture"));
  }
  json_decref(d);
  cr_assert(listed, "host.describe lists the provider type under its plugin");
  json_t *r = ok_call(&w, "session.create", json_pack("{s:s, s:s}", "cwd", w.work, "provider", "fx"));
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  free(prompt(&w, id, "hi"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_assert_str_eq(event_text(ev, "message/committed", "text"), "fixture fx hola: hi");
  cr_assert_str_eq(event_text(ev, "turn/started", "provider"), "fx");
  cr_assert_str_eq(event_text(ev, "turn/ended", "reason"), "end");
  json_t *st = fixture_stats(&w);
  json_t *in = json_object_get(st, "lastInput");
  cr_assert_str_eq(json_string_value(json_object_get(in, "providerName")), "fx");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(in, "config"), "type")), "fixture");
  cr_assert_str_eq(json_string_value(json_object_get(in, "cwd")), w.work);
  cr_assert_eq(json_integer_value(json_object_get(st, "started")), 1);
  json_decref(st);
  cr_assert(ts_run_until_pred(&w.loop, no_live_fixture_turn, &w, 5000), "the core freed the provider turn");
  json_decref(ev);
  free(id);
  world_down(&w);
  json_decref(w.cfg.providers);
}

Test(sessions, unloading_a_provider_plugin_mid_turn_ends_the_turn_and_refuses_new_ones) {
  world w;
  world_up(&w);
  w.cfg.providers = json_pack("{s:{s:s}}", "fx", "type", "fixture");
  cr_assert_eq(th_load(w.h, "provider", NULL), 0);
  json_t *r = ok_call(&w, "session.create", json_pack("{s:s, s:s}", "cwd", w.work, "provider", "fx"));
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  free(prompt(&w, id, "hang"));
  wait_for(&w, id, "turn/started", 1);
  /* The provider's turn starts once the conversation so far was read (after turn/started is stored). */
  cr_assert(ts_run_until_pred(&w.loop, one_live_fixture_turn, &w, 5000), "the provider's turn never started");
  /* The fixture frees its state in withdraw(): a provider turn freed after it would be a use after free
   * (the ASan run catches it), one never freed a leak. */
  cr_assert_eq(th_unload(&w.loop, w.h, "provider"), 0);
  cr_assert_null(ah__host_find_mount(w.h, "provider"), "unloaded, not kept as a zombie");
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_assert_str_eq(event_text(ev, "turn/ended", "reason"), "error");
  cr_assert_str_eq(event_text(ev, "turn/ended", "error"),
                   "the provider's plugin was withdrawn during the turn");
  json_decref(ev);
  /* Without the plugin: new sessions are refused, a new prompt of the old one ends in an error. */
  cr_assert_eq(err_call(&w, "session.create", json_pack("{s:s, s:s}", "cwd", w.work, "provider", "fx")),
               AH_EUNAVAILABLE);
  free(prompt(&w, id, "again"));
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  json_t *last = json_array_get(ev, json_array_size(ev) - 1);
  cr_assert_str_eq(json_string_value(json_object_get(last, "kind")), "turn/ended");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(last, "data"), "error")),
                   "the session's provider is not available");
  json_decref(ev);
  /* Loaded again, the type serves the same session. */
  cr_assert_eq(th_load(w.h, "provider", NULL), 0);
  free(prompt(&w, id, "back"));
  wait_for(&w, id, "turn/ended", 3);
  ev = history(&w, id);
  last = json_array_get(ev, json_array_size(ev) - 1);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(last, "data"), "reason")), "end");
  json_decref(ev);
  free(id);
  world_down(&w);
  json_decref(w.cfg.providers);
}

Test(sessions, provider_registrations_are_checked) {
  world w;
  world_up(&w);
  const char *bad[] = {"name", "echo", "missing", "twice"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = th_load(w.h, "provider", json_pack("{s:s}", "bad", bad[i]));
    cr_assert_neq(rc, 0, "bad=%s must fail the mount", bad[i]);
    cr_assert_null(ah__host_find_mount(w.h, "provider"), "bad=%s left a mount", bad[i]);
    cr_assert(!th_described(w.h, "method", "fixture.stats"), "bad=%s left a method", bad[i]);
  }
  cr_assert_eq(th_load(w.h, "provider", NULL), 0, "a correct registration mounts after the refusals");
  world_down(&w);
}

/* Core "plugin load" and the ABI growth rule, for the minor before today's: a module built against the
 * frozen 1.1 headers (tests/abi/1.1) runs turns — its sink, shorter than today's, has no commit_json, so it
 * commits a C string — and its remote descriptor, with `data` but without `param_size`, is called with
 * the 1.0 parameter layout.
 */
Test(sessions, a_module_built_for_abi_1_1_runs_turns_and_descriptors) {
  world w;
  world_up(&w);
  w.cfg.providers = json_pack("{s:{s:s}}", "old", "type", "abi11");
  cr_assert_eq(th_load(w.h, "abi-1-1", NULL), 0);
  json_t *r = ok_call(&w, "session.create", json_pack("{s:s, s:s}", "cwd", w.work, "provider", "old"));
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  free(prompt(&w, id, "hi"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect_str_eq(event_text(ev, "message/committed", "text"), "abi11: hi");
  cr_expect_str_eq(event_text(ev, "turn/ended", "reason"), "end");
  json_decref(ev);
  const ah_caller lan = {.struct_size = sizeof(ah_caller), .authority = AH_AUTH_LAN, .surface = "test"};
  ts_outcome o;
  memset(&o, 0, sizeof o);
  json_t *args = json_pack("{s:i}", "n", 6);
  cr_assert_eq(ah__remote_invoke(w.h, &lan, "abi11", "scale", args, NULL, th_reply, &o), 0);
  json_decref(args);
  cr_assert(ts_run_until(&w.loop, &o.done, 10000), "no outcome");
  cr_expect_eq(o.status, 0, "%s", o.message ? o.message : "");
  cr_expect_eq(json_integer_value(o.result), 42);
  th_outcome_clear(&o);
  free(id);
  world_down(&w);
}

/* ---- tools registered by plugins (ah_host_api.register_tool, ABI 1.5) ------------------------------- */

Test(sessions, a_plugin_tool_is_offered_to_providers_and_runs_under_the_session_policy) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "tools", NULL), 0);
  /* Offered with its schema after the built-ins. */
  json_t *tools = ah__tools_list(w.h);
  json_t *add = NULL;
  size_t i = 0;
  json_t *t = NULL;
  json_array_foreach(tools, i, t) {
    if (strcmp(json_string_value(json_object_get(t, "name")), "fx_add") == 0)
      add = t;
  }
  cr_assert_not_null(add, "fx_add is listed");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(add, "schema"), "type")), "object");
  cr_expect_str_eq(json_string_value(json_object_get(add, "description")), "Add two numbers.");
  cr_expect_str_eq(ah__tool_policy(w.h, "fx_add"), "ask", "a plugin's tool asks by default");
  json_decref(tools);
  char *id = create(&w);
  /* Policy ask: an approval request; granted, it runs and its result is stored. */
  free(prompt(&w, id, "/tool fx_add {\"a\": 2, \"b\": 3}"));
  json_t *req = wait_request(&w, id);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(req, "params"), "tool")), "fx_add");
  json_decref(respond_as(
      &w, 1,
      json_pack("{s:O, s:{s:s}}", "id", json_object_get(req, "id"), "value", "optionId", "allow_always")));
  json_decref(req);
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *res = last_data(ev, "tool/result");
  cr_assert_not_null(res);
  cr_expect_not(json_is_true(json_object_get(res, "isError")));
  cr_expect_eq(json_number_value(json_object_get(json_object_get(res, "result"), "sum")), 5.0);
  json_decref(ev);
  /* allow_always stored the policy: the next call runs at once; its error reaches the model as an error. */
  free(prompt(&w, id, "/tool fx_add {\"a\": \"x\"}"));
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  res = last_data(ev, "tool/result");
  cr_expect(json_is_true(json_object_get(res, "isError")));
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(res, "result"), "error")),
                   "arguments: a and b must be numbers");
  json_decref(ev);
  /* The tool gets the session's cwd and id. */
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "fx_where", "allow")));
  free(prompt(&w, id, "/tool fx_where {}"));
  wait_for(&w, id, "turn/ended", 3);
  ev = history(&w, id);
  res = json_object_get(last_data(ev, "tool/result"), "result");
  cr_expect_str_eq(json_string_value(json_object_get(res, "cwd")), w.work);
  cr_expect_str_eq(json_string_value(json_object_get(res, "sessionId")), id);
  json_decref(ev);
  free(id);
  world_down(&w);
}

static bool fixture_waiting(void *arg) {
  world *w = arg;
  json_t *r = ok_call(w, "tools.stats", json_object());
  bool yes = json_integer_value(json_object_get(r, "waiting")) == 1;
  json_decref(r);
  return yes;
}

Test(sessions, unloading_a_tool_plugin_mid_call_cancels_the_call_and_frees_the_name) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "tools", NULL), 0);
  char *id = create(&w);
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "fx_wait", "allow")));
  free(prompt(&w, id, "/tool fx_wait {}"));
  wait_for(&w, id, "tool/call", 1);
  cr_assert(ts_run_until_pred(&w.loop, fixture_waiting, &w, 5000), "the tool is running");
  cr_assert_eq(th_unload(&w.loop, w.h, "tools"), 0);
  cr_assert_null(ah__host_find_mount(w.h, "tools"), "unloaded, not kept as a zombie");
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *res = last_data(ev, "tool/result");
  cr_expect(json_is_true(json_object_get(res, "isError")));
  cr_expect(json_is_true(json_object_get(json_object_get(res, "result"), "cancelled")),
            "the call ended cancelled");
  json_decref(ev);
  cr_expect_not(ah__tool_exists(w.h, "fx_wait"), "the tool is gone");
  free(prompt(&w, id, "/tool fx_wait {}"));
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(last_data(ev, "tool/result"), "result"), "error")),
      "unknown tool");
  json_decref(ev);
  /* The name is free again: the plugin mounts once more and the tool runs. */
  cr_assert_eq(th_load(w.h, "tools", NULL), 0);
  cr_expect(ah__tool_exists(w.h, "fx_wait"));
  free(id);
  world_down(&w);
}

Test(sessions, cancelling_a_turn_stops_a_plugin_tool) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "tools", NULL), 0);
  char *id = create(&w);
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "fx_wait", "allow")));
  free(prompt(&w, id, "/tool fx_wait {}"));
  cr_assert(ts_run_until_pred(&w.loop, fixture_waiting, &w, 5000));
  json_decref(ok_call(&w, "session.cancel", json_pack("{s:s}", "sessionId", id)));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect_str_eq(json_string_value(json_object_get(last_data(ev, "turn/ended"), "reason")), "cancelled");
  json_decref(ev);
  json_t *st = ok_call(&w, "tools.stats", json_object());
  cr_expect_eq(json_integer_value(json_object_get(st, "stopped")), 1, "the plugin saw its call's token trip");
  cr_expect_eq(json_integer_value(json_object_get(st, "waiting")), 0);
  json_decref(st);
  free(id);
  world_down(&w);
}

Test(sessions, tool_registrations_are_checked) {
  world w;
  world_up(&w);
  const char *bad[] = {"name", "builtin", "schema", "description", "handler", "duplicate"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = th_load(w.h, "tools", json_pack("{s:s}", "bad", bad[i]));
    cr_expect_neq(rc, 0, "bad %s refused", bad[i]);
    cr_expect_not(ah__tool_exists(w.h, "fx_add"), "bad %s: nothing registered", bad[i]);
  }
  /* Two plugins cannot register one name. */
  cr_assert_eq(th_load(w.h, "tools", NULL), 0);
  char path[4096];
  snprintf(path, sizeof path, "%s/tools.so", getenv("AH_TEST_PLUGIN_DIR"));
  world_down(&w);
}

/* ---- tool sources (ah_host_api.register_tool_source, ABI 1.6) ------------------------------------- */

static bool has_tool(const json_t *tools, const char *name) {
  size_t i = 0;
  json_t *t = NULL;
  json_array_foreach(tools, i, t) {
    if (strcmp(json_string_value(json_object_get(t, "name")), name) == 0)
      return true;
  }
  return false;
}

static size_t count_bus(world *w, const char *name) {
  size_t n = 0, i = 0;
  json_t *e = NULL;
  json_array_foreach(w->events, i, e) {
    if (strcmp(json_string_value(json_array_get(e, 0)), name) == 0)
      n++;
  }
  return n;
}

static bool three_progress_seen(void *arg) {
  return count_bus(arg, "session.progress") >= 3;
}

Test(sessions, a_tool_source_is_asked_at_each_turn_and_its_tools_run_under_policy) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "toolsrc", NULL), 0);
  char *id = create(&w);
  /* A policy may name a source's tool before anything was listed. */
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s, s:s}}", "sessionId", id, "policy", "fx__echo", "allow",
                                "fx__steps", "allow")));
  cr_expect_eq(err_call(&w, "session.set-policy",
                        json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "zz__echo", "allow")),
               AH_EINVAL, "a prefix no source has is not a tool");
  free(prompt(&w, id, "/tool fx__echo {\"text\": \"hi\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *res = last_data(ev, "tool/result");
  cr_expect_not(json_is_true(json_object_get(res, "isError")));
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(res, "result"), "text")), "hi");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(res, "result"), "tool")), "fx__echo");
  json_decref(ev);
  json_t *st = ok_call(&w, "toolsrc.stats", json_object());
  cr_expect_eq(json_integer_value(json_object_get(st, "lists")), 1, "asked once for the turn");
  cr_expect_str_eq(json_string_value(json_object_get(st, "lastSession")), id, "for this session");
  json_decref(st);
  /* Progress reaches the bus (transient), with the call's id; a bad progress object is refused. */
  free(prompt(&w, id, "/tool fx__steps {\"n\": 3}"));
  wait_for(&w, id, "turn/ended", 2);
  cr_expect(ts_run_until_pred(&w.loop, three_progress_seen, &w, 5000));
  cr_expect_eq(count_bus(&w, "session.progress"), 3);
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(w.events, i, e) {
    if (strcmp(json_string_value(json_array_get(e, 0)), "session.progress") == 0) {
      json_t *d = json_array_get(e, 1);
      cr_expect_str_eq(json_string_value(json_object_get(d, "name")), "fx__steps");
      cr_expect_str_eq(json_string_value(json_object_get(d, "sessionId")), id);
      cr_expect_eq(json_integer_value(json_object_get(d, "total")), 3);
      cr_expect_not_null(json_object_get(d, "callId"));
    }
  }
  ev = history(&w, id);
  res = json_object_get(last_data(ev, "tool/result"), "result");
  cr_expect_eq(json_integer_value(json_object_get(res, "done")), 3);
  cr_expect(json_is_true(json_object_get(res, "badProgressRefused")));
  json_decref(ev);
  /* A name outside the prefix is dropped from the list; a tool the source did not list is unknown. */
  json_t *r = ok_call(&w, "session.tools", json_pack("{s:s}", "sessionId", id));
  json_t *tools = json_object_get(r, "tools");
  cr_expect(has_tool(tools, "read_file") && has_tool(tools, "fx__echo") && has_tool(tools, "fx__wait"));
  cr_expect_not(has_tool(tools, "outside_prefix"));
  json_array_foreach(tools, i, e) {
    const char *name = json_string_value(json_object_get(e, "name"));
    if (strcmp(name, "fx__echo") == 0) {
      cr_expect_str_eq(json_string_value(json_object_get(e, "group")), "alpha");
      cr_expect_str_eq(json_string_value(json_object_get(e, "policy")), "allow", "the session's own");
    } else if (strcmp(name, "fx__wait") == 0) {
      cr_expect_str_eq(json_string_value(json_object_get(e, "policy")), "ask", "a source's default");
    }
  }
  json_decref(r);
  free(prompt(&w, id, "/tool fx__nothing {}"));
  wait_for(&w, id, "turn/ended", 3);
  ev = history(&w, id);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(last_data(ev, "tool/result"), "result"), "error")),
      "unknown tool");
  json_decref(ev);
  free(id);
  world_down(&w);
}

static bool tools_changed_seen(void *arg) {
  return count_bus(arg, "tools.changed") > 0;
}

Test(sessions, a_tool_source_lists_per_session_and_says_when_its_list_changed) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "toolsrc", NULL), 0);
  char *a = create(&w), *b = create(&w);
  json_t *r = ok_call(&w, "toolsrc.add", json_pack("{s:s, s:s}", "sessionId", a, "name", "only_a"));
  cr_expect_eq(json_integer_value(json_object_get(r, "rc")), 0);
  json_decref(r);
  cr_expect(ts_run_until_pred(&w.loop, tools_changed_seen, &w, 5000), "tools.changed emitted");
  cr_expect_eq(count_bus(&w, "tools.changed"), 1);
  r = ok_call(&w, "session.tools", json_pack("{s:s}", "sessionId", a));
  cr_expect(has_tool(json_object_get(r, "tools"), "fx__only_a"));
  json_decref(r);
  r = ok_call(&w, "session.tools", json_pack("{s:s}", "sessionId", b));
  cr_expect_not(has_tool(json_object_get(r, "tools"), "fx__only_a"), "another session does not see it");
  json_decref(r);
  free(a);
  free(b);
  world_down(&w);
}

Test(sessions, a_failing_tool_source_is_left_out_with_a_notice_and_the_turn_goes_on) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "toolsrc", json_pack("{s:b}", "list_fail", 1)), 0);
  char *id = create(&w);
  free(prompt(&w, id, "/tool fx__echo {}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *notice = last_data(ev, "turn/notice");
  cr_assert_not_null(notice);
  cr_expect_str_eq(json_string_value(json_object_get(notice, "kind")), "tools");
  cr_expect(strstr(json_string_value(json_object_get(notice, "message")), "server alpha did not start") !=
            NULL);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(last_data(ev, "tool/result"), "result"), "error")),
      "unknown tool");
  cr_expect_str_eq(json_string_value(json_object_get(last_data(ev, "turn/ended"), "reason")), "end");
  json_decref(ev);
  free(id);
  world_down(&w);
}

static bool source_waiting(void *arg) {
  world *w = arg;
  json_t *r = ok_call(w, "toolsrc.stats", json_object());
  bool yes = json_integer_value(json_object_get(r, "waiting")) == 1;
  json_decref(r);
  return yes;
}

Test(sessions, cancelling_a_turn_stops_a_slow_list_and_a_running_source_tool) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "toolsrc", json_pack("{s:i}", "list_delay_ms", 60000)), 0);
  char *id = create(&w);
  free(prompt(&w, id, "/tool fx__echo {}"));
  wait_for(&w, id, "turn/started", 1);
  uint64_t t0 = uv_hrtime();
  json_decref(ok_call(&w, "session.cancel", json_pack("{s:s}", "sessionId", id)));
  wait_for(&w, id, "turn/ended", 1);
  cr_expect_lt((uv_hrtime() - t0) / 1000000, 5000, "the turn did not wait for the list");
  json_t *ev = history(&w, id);
  cr_expect_str_eq(json_string_value(json_object_get(last_data(ev, "turn/ended"), "reason")), "cancelled");
  cr_expect_null(last_data(ev, "tool/call"), "the provider never started");
  json_decref(ev);
  json_t *st = ok_call(&w, "toolsrc.stats", json_object());
  cr_expect_eq(json_integer_value(json_object_get(st, "cancelledLists")), 1, "the list call's token tripped");
  json_decref(st);
  /* A running source tool: its call's token trips on cancel. */
  cr_assert_eq(th_unload(&w.loop, w.h, "toolsrc"), 0);
  cr_assert_eq(th_load(w.h, "toolsrc", NULL), 0);
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "fx__wait", "allow")));
  free(prompt(&w, id, "/tool fx__wait {}"));
  cr_assert(ts_run_until_pred(&w.loop, source_waiting, &w, 5000));
  json_decref(ok_call(&w, "session.cancel", json_pack("{s:s}", "sessionId", id)));
  wait_for(&w, id, "turn/ended", 2);
  st = ok_call(&w, "toolsrc.stats", json_object());
  cr_expect_eq(json_integer_value(json_object_get(st, "stopped")), 1);
  json_decref(st);
  free(id);
  world_down(&w);
}

Test(sessions, unloading_a_tool_source_mid_call_cancels_the_call_and_its_tools_go) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "toolsrc", NULL), 0);
  char *id = create(&w);
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "fx__wait", "allow")));
  free(prompt(&w, id, "/tool fx__wait {}"));
  cr_assert(ts_run_until_pred(&w.loop, source_waiting, &w, 5000));
  cr_assert_eq(th_unload(&w.loop, w.h, "toolsrc"), 0);
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect(
      json_is_true(json_object_get(json_object_get(last_data(ev, "tool/result"), "result"), "cancelled")));
  json_decref(ev);
  cr_expect_not(ah__tool_exists(w.h, "fx__wait"), "the prefix is free");
  free(id);
  world_down(&w);
}

Test(sessions, tool_source_registrations_are_checked) {
  world w;
  world_up(&w);
  const char *bad[] = {"prefix", "handler", "tool-under-prefix"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = th_load(w.h, "toolsrc", json_pack("{s:s}", "bad", bad[i]));
    cr_expect_neq(rc, 0, "bad %s refused", bad[i]);
    cr_expect_not(ah__tool_exists(w.h, "fx__echo"), "bad %s: nothing registered", bad[i]);
  }
  world_down(&w);
}

/* A module built for ABI 1.5 (the tools fixture against the frozen 1.5 headers) runs its tool in today's
 * host. */
Test(sessions, a_tool_plugin_built_for_abi_1_5_still_runs) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "abi-1-5", NULL), 0);
  char *id = create(&w);
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "fx_add", "allow")));
  free(prompt(&w, id, "/tool fx_add {\"a\": 4, \"b\": 5}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect_eq(
      json_number_value(json_object_get(json_object_get(last_data(ev, "tool/result"), "result"), "sum")),
      9.0);
  json_decref(ev);
  free(id);
  world_down(&w);
}

static const char *option_value(const json_t *options, const char *id) {
  size_t i;
  json_t *o;
  json_array_foreach(options, i, o) {
    if (strcmp(json_string_value(json_object_get(o, "id")), id) == 0)
      return json_string_value(json_object_get(o, "currentValue"));
  }
  return NULL;
}

/* docs/sessions.md "Options", "Modes": a value is checked against the option's values; a change is stored
 * and published; read_only refuses an edit (the model reads why) and lets a read run; accept_edits runs an
 * edit without asking; the kind is recorded with the call. */
Test(sessions, options_are_checked_stored_and_the_mode_decides_the_tools) {
  world w;
  world_up(&w);
  char *id = create(&w);
  json_t *r = ok_call(&w, "session.options", json_pack("{s:s}", "sessionId", id));
  json_t *options = json_object_get(r, "options");
  cr_assert_str_eq(option_value(options, "mode"), "ask");
  cr_expect_null(option_value(options, "thought_level"), "echo offers no reasoning effort");
  json_decref(r);
  cr_expect_eq(err_call(&w, "session.set-option",
                        json_pack("{s:s, s:s, s:s}", "sessionId", id, "configId", "mode", "value", "yolo")),
               AH_EINVAL);
  cr_expect_eq(err_call(&w, "session.set-option",
                        json_pack("{s:s, s:s, s:s}", "sessionId", id, "configId", "colour", "value", "red")),
               AH_EINVAL);
  cr_expect_eq(err_call(&w, "session.set-option",
                        json_pack("{s:s, s:s, s:i}", "sessionId", id, "configId", "mode", "value", 1)),
               AH_EINVAL);
  r = ok_call(&w, "session.set-option",
              json_pack("{s:s, s:s, s:s}", "sessionId", id, "configId", "mode", "value", "read_only"));
  cr_assert_str_eq(option_value(json_object_get(r, "options"), "mode"), "read_only");
  json_decref(r);
  bus_wait published = {&w, "session.options", NULL};
  cr_assert(ts_run_until_pred(&w.loop, bus_published, &published, 5000), "session.options was published");

  char path[4200];
  snprintf(path, sizeof path, "%s/kept.txt", w.work);
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fputs("kept\n", f);
  fclose(f);
  free(prompt(&w, id, "/tool write_file {\"path\":\"kept.txt\",\"content\":\"lost\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_expect_str_eq(json_string_value(json_object_get(last_data(ev, "tool/call"), "kind")), "edit");
  json_t *res = last_data(ev, "tool/result");
  cr_expect(json_is_true(json_object_get(res, "isError")));
  char *why = json_dumps(json_object_get(res, "result"), JSON_COMPACT);
  cr_expect(why && strstr(why, "read-only mode") != NULL, "the model reads why: %s", why ? why : "?");
  free(why);
  json_decref(ev);
  free(prompt(&w, id, "/tool read_file {\"path\":\"kept.txt\"}"));
  wait_for(&w, id, "turn/ended", 2);
  ev = history(&w, id);
  res = last_data(ev, "tool/result");
  cr_expect(json_is_false(json_object_get(res, "isError")), "a read runs in read_only");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(res, "result"), "content")), "kept\n");
  json_decref(ev);

  json_decref(
      ok_call(&w, "session.set-option",
              json_pack("{s:s, s:s, s:s}", "sessionId", id, "configId", "mode", "value", "accept_edits")));
  free(prompt(&w, id, "/tool write_file {\"path\":\"kept.txt\",\"content\":\"new\\n\"}"));
  wait_for(&w, id, "turn/ended", 3);
  json_t *pend = pending_requests(&w, id);
  cr_expect_eq(json_array_size(pend), 0, "accept_edits: no approval");
  json_decref(pend);
  f = fopen(path, "r");
  char buf[16] = "";
  cr_assert(f && fgets(buf, sizeof buf, f));
  fclose(f);
  cr_expect_str_eq(buf, "new\n");
  json_t *row = ah__store_get_session(ah__sessions_store(ah__host_sessions(w.h)), id);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(row, "settings"), "mode")),
                   "accept_edits");
  json_decref(row);
  r = ok_call(&w, "session.get", json_pack("{s:s}", "sessionId", id));
  cr_expect_str_eq(option_value(json_object_get(r, "options"), "mode"), "accept_edits");
  json_decref(r);
  free(id);
  world_down(&w);
}

/* docs/sessions.md "session.set-editor": read_file and write_file of the session go through the editor's
 * methods after the disk's confinement; a method's error is the tool's; a write's diff has the editor's
 * text before it; cleared, the disk again. */
Test(sessions, the_editor_reads_and_writes_for_the_session_after_the_same_confinement) {
  world w;
  world_up(&w);
  cr_assert_eq(th_load(w.h, "tools", NULL), 0);
  char *id = create(&w);
  json_decref(ok_call(&w, "session.set-editor",
                      json_pack("{s:s, s:s, s:s, s:s}", "sessionId", id, "read", "tools.editor-read", "write",
                                "tools.editor-write", "run", "tools.editor-run")));
  json_decref(
      ok_call(&w, "session.set-option",
              json_pack("{s:s, s:s, s:s}", "sessionId", id, "configId", "mode", "value", "accept_edits")));
  char path[4200];
  snprintf(path, sizeof path, "%s/a.txt", w.work);
  free(prompt(&w, id, "/tool read_file {\"path\":\"a.txt\"}"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *res = json_object_get(last_data(ev, "tool/result"), "result");
  char want[4300];
  snprintf(want, sizeof want, "buffer of %s", path);
  char *shown = json_dumps(res, JSON_COMPACT);
  cr_assert(json_is_string(json_object_get(res, "content")), "the editor's buffer: %s", shown);
  free(shown);
  cr_expect_str_eq(json_string_value(json_object_get(res, "content")), want, "the editor's buffer");
  json_decref(ev);
  free(prompt(&w, id, "/tool read_file {\"path\":\"../escape\"}"));
  wait_for(&w, id, "turn/ended", 2);
  free(prompt(&w, id, "/tool read_file {\"path\":\"missing\"}"));
  wait_for(&w, id, "turn/ended", 3);
  ev = history(&w, id);
  res = last_data(ev, "tool/result");
  cr_expect(json_is_true(json_object_get(res, "isError")));
  cr_expect(strstr(json_string_value(json_object_get(json_object_get(res, "result"), "error")),
                   "the editor could not read missing: no such buffer") != NULL);
  json_decref(ev);
  free(prompt(&w, id, "/tool write_file {\"path\":\"a.txt\",\"content\":\"new\"}"));
  wait_for(&w, id, "turn/ended", 4);
  ev = history(&w, id);
  res = last_data(ev, "tool/result");
  cr_expect(json_is_false(json_object_get(res, "isError")));
  cr_expect_str_eq(json_string_value(json_object_get(res, "oldText")), want, "the editor's text before");
  json_decref(ev);
  struct stat st;
  cr_expect_neq(stat(path, &st), 0, "the disk was not written");
  json_t *stats = ok_call(&w, "tools.stats", json_object());
  json_t *written = json_object_get(stats, "written");
  cr_assert_eq(json_array_size(written), 1, "one write, the confined one (not ../escape)");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(written, 0), "path")), path);
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(written, 0), "content")), "new");
  json_decref(stats);
  /* run_command in the editor's terminal: its output is stdout, its terminal id kept for the client. */
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "run_command", "allow")));
  free(prompt(&w, id, "/tool run_command {\"command\":\"make check\"}"));
  wait_for(&w, id, "turn/ended", 5);
  ev = history(&w, id);
  res = json_object_get(last_data(ev, "tool/result"), "result");
  cr_expect_str_eq(json_string_value(json_object_get(res, "stdout")), "ran: make check");
  cr_expect_eq(json_integer_value(json_object_get(res, "exitCode")), 0);
  cr_expect_str_eq(json_string_value(json_object_get(res, "terminalId")), "t-1");
  cr_expect(json_is_false(json_object_get(res, "cancelled")));
  json_decref(ev);
  /* Cleared: the disk again. */
  json_decref(ok_call(&w, "session.set-editor", json_pack("{s:s}", "sessionId", id)));
  free(prompt(&w, id, "/tool write_file {\"path\":\"a.txt\",\"content\":\"disk\"}"));
  wait_for(&w, id, "turn/ended", 6);
  cr_expect_eq(stat(path, &st), 0, "written to the disk");
  free(id);
  world_down(&w);
}

/* docs/sessions.md "Tools": run_command's output is published (session.progress {output}) while it runs. */
Test(sessions, run_command_output_is_published_while_it_runs) {
  world w;
  world_up(&w);
  char *id = create(&w);
  json_decref(ok_call(&w, "session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "run_command", "allow")));
  free(prompt(&w, id, "/tool run_command {\"command\":\"echo live; sleep 1; echo end\"}"));
  bus_wait live = {&w, "session.progress", "output"};
  cr_assert(ts_run_until_pred(&w.loop, bus_published, &live, 5000), "a live report of the output");
  json_t *ev = history(&w, id);
  cr_expect_null(find_kind(ev, "tool/result", 0), "reported before the command ended");
  json_decref(ev);
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(w.events, i, e) {
    json_t *d = json_array_get(e, 1);
    if (strcmp(json_string_value(json_array_get(e, 0)), "session.progress") == 0 &&
        json_object_get(d, "output")) {
      cr_expect_str_eq(json_string_value(json_object_get(d, "output")), "live\n");
      cr_expect_str_eq(json_string_value(json_object_get(d, "name")), "run_command");
      break;
    }
  }
  wait_for(&w, id, "turn/ended", 1);
  free(id);
  world_down(&w);
}

/* ---- usage as durable facts (docs/usage.md) ------------------------------------------------------------ */

static json_t *session_of(world *w, const char *id) {
  json_t *r = ok_call(w, "session.get", json_pack("{s:s}", "sessionId", id));
  json_t *s = json_incref(json_object_get(r, "session"));
  json_decref(r);
  return s;
}

static json_int_t uget(const json_t *o, const char *k) {
  return json_integer_value(json_object_get(o, k));
}

static char *fixture_session(world *w, const char *parent) {
  json_t *params = json_pack("{s:s, s:s}", "cwd", w->work, "provider", "fx");
  if (parent)
    json_object_set_new(params, "parent", json_string(parent));
  json_t *r = ok_call(w, "session.create", params);
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  return id;
}

Test(sessions, usage_of_each_round_trip_is_stored_as_it_comes_and_counted_once) {
  world w;
  world_up(&w);
  w.cfg.providers = json_pack("{s:{s:s, s:s}}", "fx", "type", "fixture", "model", "fx-requested");
  cr_assert_eq(th_load(w.h, "provider", NULL), 0);
  char *id = fixture_session(&w, NULL);
  free(prompt(&w, id, "hi"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  json_t *r1 = find_kind(ev, "model/usage", 0);
  cr_assert(r1, "the first round trip is an event");
  json_t *r2 = find_kind(ev, "model/usage", (size_t)uget(r1, "seq"));
  cr_assert(r2, "and the second");
  cr_assert_eq(uget(json_object_get(r1, "data"), "round"), 1);
  cr_assert_eq(uget(json_object_get(r2, "data"), "round"), 2);
  cr_assert_eq(uget(json_object_get(json_object_get(r2, "data"), "usage"), "cachedInputTokens"), 2);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r1, "data"), "requestedModel")),
                   "fx-requested");
  cr_assert_str_eq(event_text(ev, "turn/ended", "requestedModel"), "fx-requested");
  cr_assert_lt(uget(r2, "seq"), uget(find_kind(ev, "turn/ended", 0), "seq"),
               "round trips come before the end");
  json_decref(ev);
  /* The session's totals: the round trips, not also the end's sum. */
  json_t *s = session_of(&w, id);
  json_t *u = json_object_get(s, "usage");
  cr_assert_eq(uget(u, "inputTokens"), 8);
  cr_assert_eq(uget(u, "cachedInputTokens"), 2);
  cr_assert_eq(uget(u, "outputTokens"), 3);
  cr_assert_eq(uget(u, "reasoningTokens"), 1);
  cr_assert_eq(uget(u, "requests"), 2);
  cr_assert_eq(uget(u, "turns"), 1);
  json_t *by = json_object_get(u, "byModel");
  cr_assert_eq(json_array_size(by), 1);
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(by, 0), "model")), "fx-a");
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(by, 0), "provider")), "fx");
  cr_assert_null(json_object_get(s, "cost"), "no price table: no cost");
  json_decref(s);
  /* A second turn adds up; the store holds the same after a restart (the row was written with the events). */
  free(prompt(&w, id, "mixed"));
  wait_for(&w, id, "turn/ended", 2);
  cr_assert_eq(th_host_stop_free(&w.loop, w.h), 0);
  cr_assert_eq(uv_loop_init(&w.loop), 0);
  w.h = host_on(&w);
  s = session_of(&w, id);
  u = json_object_get(s, "usage");
  cr_assert_eq(uget(u, "inputTokens"), 16);
  cr_assert_eq(uget(u, "turns"), 2);
  by = json_object_get(u, "byModel");
  cr_assert_eq(json_array_size(by), 2, "the mixed turn's round trips are each attributed to their model");
  json_int_t a = 0, b = 0;
  size_t i;
  json_t *e;
  json_array_foreach(by, i, e) {
    const char *m = json_string_value(json_object_get(e, "model"));
    if (m && strcmp(m, "fx-a") == 0)
      a = uget(e, "inputTokens");
    if (m && strcmp(m, "fx-b") == 0)
      b = uget(e, "inputTokens");
  }
  cr_assert_eq(a, 3 + 5 + 3);
  cr_assert_eq(b, 5);
  json_decref(s);
  free(id);
  world_down(&w);
  json_decref(w.cfg.providers);
}

/* A provider built for ABI 1.7 reports no round trips: its end's usage is counted, not attributed. */
Test(sessions, usage_of_a_provider_built_for_abi_1_7_is_counted_from_its_end) {
  world w;
  world_up(&w);
  w.cfg.providers = json_pack("{s:{s:s}}", "fx", "type", "fixture");
  cr_assert_eq(th_load(w.h, "abi-1-7", NULL), 0);
  char *id = fixture_session(&w, NULL);
  free(prompt(&w, id, "hi"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_assert_null(find_kind(ev, "model/usage", 0));
  cr_assert_str_eq(event_text(ev, "message/committed", "text"), "fixture fx -: hi");
  json_decref(ev);
  json_t *s = session_of(&w, id);
  json_t *u = json_object_get(s, "usage");
  cr_assert_eq(uget(u, "inputTokens"), 1);
  cr_assert_eq(uget(u, "outputTokens"), 1);
  cr_assert_eq(uget(u, "turns"), 1);
  json_t *b = json_array_get(json_object_get(u, "byModel"), 0);
  cr_assert(json_is_null(json_object_get(b, "model")), "no model reported: not attributed");
  json_decref(s);
  free(id);
  world_down(&w);
  json_decref(w.cfg.providers);
}

Test(sessions, a_tree_shows_each_child_once_under_its_parent_and_costs_come_from_the_price_table) {
  world w;
  world_up(&w);
  char *prices = NULL;
  cr_assert(asprintf(&prices, "%s/prices.json", w.dir) > 0);
  FILE *f = fopen(prices, "w");
  cr_assert(f);
  fputs(
      "{\"version\":1,\"name\":\"fx-prices\",\"currency\":\"EUR\",\"rates\":[{\"provider\":\"fx\",\"model\":"
      "\"fx-a\",\"from\":\"2020-01-01\",\"input\":\"1\",\"cachedInput\":\"0.5\",\"output\":\"2\"}]}",
      f);
  fclose(f);
  w.cfg.prices = prices;
  w.cfg.providers = json_pack("{s:{s:s}}", "fx", "type", "fixture");
  cr_assert_eq(th_load(w.h, "provider", NULL), 0);
  char *root = fixture_session(&w, NULL);
  char *child = fixture_session(&w, root);
  char *grandchild = fixture_session(&w, child);
  const char *all[] = {root, child, grandchild};
  for (int i = 0; i < 3; i++) {
    free(prompt(&w, all[i], "hi"));
    wait_for(&w, all[i], "turn/ended", 1);
  }
  free(prompt(&w, grandchild, "mixed")); /* fx-b has no rate: its round trip stays unpriced */
  wait_for(&w, grandchild, "turn/ended", 2);
  json_t *s = session_of(&w, root);
  cr_assert_eq(uget(json_object_get(s, "usage"), "inputTokens"), 8, "the parent's own: its own turn only");
  json_t *tu = json_object_get(s, "treeUsage");
  cr_assert_eq(uget(tu, "sessions"), 3);
  cr_assert_eq(uget(tu, "inputTokens"), 8 * 4);
  cr_assert_eq(uget(tu, "turns"), 4);
  /* per turn at fx-a: 3×1 + 1×2 + (5−2)×1 + 2×0.5 + 2×2 = 13 per million tokens */
  json_t *c = json_object_get(s, "cost");
  cr_assert_str_eq(json_string_value(json_object_get(c, "amount")), "0.000013");
  cr_assert_str_eq(json_string_value(json_object_get(c, "currency")), "EUR");
  cr_assert_str_eq(json_string_value(json_object_get(c, "prices")), "fx-prices");
  json_t *tc = json_object_get(s, "treeCost");
  /* four turns; the mixed turn's second round trip (fx-b: 3 + 1 + 4 = 8) has no rate */
  cr_assert_str_eq(json_string_value(json_object_get(tc, "amount")), "0.000044");
  cr_assert_eq(uget(json_object_get(tc, "unpriced"), "inputTokens"), 5);
  cr_assert_eq(uget(tc, "unpricedItems"), 1);
  json_decref(s);
  s = session_of(&w, child);
  cr_assert_eq(uget(json_object_get(s, "treeUsage"), "sessions"), 2);
  json_decref(s);
  /* session.list shows the same per session */
  json_t *l = ok_call(&w, "session.list", json_object());
  size_t i;
  json_t *e;
  bool seen = false;
  json_array_foreach(json_object_get(l, "sessions"), i, e) {
    if (strcmp(json_string_value(json_object_get(e, "id")), root) == 0) {
      seen = true;
      cr_assert_eq(uget(json_object_get(e, "treeUsage"), "inputTokens"), 32);
      cr_assert_str_eq(json_string_value(json_object_get(json_object_get(e, "cost"), "amount")), "0.000013");
    }
  }
  cr_assert(seen);
  json_decref(l);
  free(root);
  free(child);
  free(grandchild);
  world_down(&w);
  json_decref(w.cfg.providers);
  free(prices);
}

/* A provider built for ABI 1.8 (before the recordings API) reports its round trips on today's host. */
Test(sessions, usage_of_a_provider_built_for_abi_1_8_is_counted_from_its_round_trips) {
  world w;
  world_up(&w);
  w.cfg.providers = json_pack("{s:{s:s}}", "fx", "type", "fixture");
  cr_assert_eq(th_load(w.h, "abi-1-8", NULL), 0);
  char *id = fixture_session(&w, NULL);
  free(prompt(&w, id, "hi"));
  wait_for(&w, id, "turn/ended", 1);
  json_t *ev = history(&w, id);
  cr_assert(find_kind(ev, "model/usage", 0), "round trips reported");
  json_decref(ev);
  json_t *s = session_of(&w, id);
  cr_assert_eq(uget(json_object_get(s, "usage"), "inputTokens"), 8);
  cr_assert_eq(uget(json_object_get(s, "usage"), "requests"), 2);
  json_decref(s);
  free(id);
  world_down(&w);
  json_decref(w.cfg.providers);
}

/* A close cancels what is still queued: each queued prompt gets its inbox/cancelled event (its messageId,
 * reason "closed"), stored and published, in seq order before the close; the running turn ends cancelled.
 * Then session.delete publishes session.deleted once its rows are gone. */
Test(sessions, a_close_records_the_queued_prompts_it_cancels_and_a_delete_is_published) {
  world w;
  world_up(&w);
  char *id = create(&w);
  char *m1 = prompt(&w, id, "/sleep 5000\nfirst");
  wait_for(&w, id, "turn/started", 1);
  char *m2 = prompt(&w, id, "second");
  char *m3 = prompt(&w, id, "third");
  json_decref(ok_call(&w, "session.close", json_pack("{s:s}", "sessionId", id)));
  json_t *ev = history(&w, id);
  json_t *c2 = find_kind(ev, "inbox/cancelled", 0);
  cr_assert_not_null(c2, "the first queued prompt has its event");
  json_t *c3 = find_kind(ev, "inbox/cancelled", (size_t)json_integer_value(json_object_get(c2, "seq")));
  cr_assert_not_null(c3, "the second queued prompt has its event");
  cr_expect_str_eq(json_string_value(json_object_get(c2, "messageId")), m2);
  cr_expect_str_eq(json_string_value(json_object_get(c3, "messageId")), m3);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(c2, "data"), "reason")), "closed");
  json_t *ended = find_kind(ev, "turn/ended", 0);
  cr_assert_not_null(ended);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(ended, "data"), "reason")), "cancelled");
  cr_expect_null(find_kind(ev, "inbox/claimed", (size_t)json_integer_value(json_object_get(ended, "seq"))),
                 "nothing queued ran after the close");
  cr_expect(seq_gapless(ev));
  json_decref(ev);
  /* Published as session.event too, before session.closed. */
  bus_wait closed = {&w, "session.closed", NULL};
  cr_assert(ts_run_until_pred(&w.loop, bus_published, &closed, 5000));
  size_t cancelled_at = 0, closed_at = 0, i = 0;
  json_t *e = NULL;
  json_array_foreach(w.events, i, e) {
    const char *name = json_string_value(json_array_get(e, 0));
    const json_t *d = json_array_get(e, 1);
    const char *kind = json_string_value(json_object_get(json_object_get(d, "event"), "kind"));
    if (strcmp(name, "session.event") == 0 && kind && strcmp(kind, "inbox/cancelled") == 0)
      cancelled_at = i + 1;
    if (strcmp(name, "session.closed") == 0)
      closed_at = i + 1;
  }
  cr_expect(cancelled_at && closed_at && cancelled_at < closed_at, "inbox/cancelled at %zu, closed at %zu",
            cancelled_at, closed_at);

  cr_expect_eq(count_bus(&w, "session.deleted"), 0);
  json_decref(ok_call(&w, "session.delete", json_pack("{s:s}", "sessionId", id)));
  bus_wait deleted = {&w, "session.deleted", NULL};
  cr_assert(ts_run_until_pred(&w.loop, bus_published, &deleted, 5000), "session.deleted was not published");
  json_array_foreach(w.events, i, e) {
    if (strcmp(json_string_value(json_array_get(e, 0)), "session.deleted") == 0)
      cr_expect_str_eq(json_string_value(json_object_get(json_array_get(e, 1), "sessionId")), id);
  }
  cr_expect_eq(count_bus(&w, "session.deleted"), 1);
  free(m1);
  free(m2);
  free(m3);
  free(id);
  world_down(&w);
}
