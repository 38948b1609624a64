/* Several hosts on one PostgreSQL store (docs/scaling.md): real `agenthost serve` processes stand for
 * machines, each with its own state and runtime directory, all with [host] store_url on the cluster that
 * tests/support/with_pg.sh started (each test its own database). Failures are made as they happen to
 * machines: a paused owner (SIGSTOP past the lease, also in the middle of a transaction), a killed one, its
 * database connections terminated by the server. The checks are made in SQL on the shared database: no
 * event of an owner committed after its session was taken over, seqs gap-free, every acknowledged prompt
 * settled (its inbox row done, its turn ended).
 *
 * PROTOCOLS.md "Core": sessions (a prompt's receipt is durable), every test; SDK-SERVER-EVENTS (the server
 * reports every session of the host, here also those another host runs) and SDK-WIRE-LIMITS (approvals as
 * server requests) in a_session_is_prompted_followed_and_answered_from_other_hosts. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "admin.h"
#include "daemon.h"
#include "pg_support.h"
#include "support.h"

#define TTL_MS 2000

typedef struct cluster {
  char db[64];
  char *url;
  char *pwfile;
  char *dir;
  char *work; /* the sessions' working directory (under dir) */
} cluster;

static void cluster_init(cluster *c) {
  cr_assert(tpg_enabled(), "AH_TEST_PG is not set: run through tests/support/with_pg.sh (meson test)");
  c->url = tpg_create_db(c->db);
  c->dir = ts_mkdtemp();
  char *pw = NULL;
  cr_assert(asprintf(&pw, "%s\n", tpg_password()) > 0);
  c->pwfile = ts_write_file(c->dir, "pw", pw);
  free(pw);
  c->work = d_join(c->dir, "work");
  cr_assert_eq(mkdir(c->work, 0700), 0);
}

static void cluster_fini(cluster *c) {
  tpg_drop_db(c->db);
  ts_rmtree(c->dir);
  free(c->dir);
  free(c->work);
  free(c->url);
  free(c->pwfile);
}

/* A host on the cluster's database (through `url` when not NULL). */
static test_daemon *host_via(cluster *c, const char *url) {
  char *cfg = NULL;
  cr_assert(asprintf(&cfg,
                     NO_DEFAULT_PLUGINS
                     "[host]\nlease_ttl_ms = %d\nstore_url = %s\nstore_password_file = %s\n",
                     TTL_MS, url ? url : c->url, c->pwfile) > 0);
  test_daemon *d = d_new(cfg);
  free(cfg);
  d_start(d);
  return d;
}

static int64_t sql_int(cluster *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int64_t sql_int(cluster *c, const char *fmt, ...) {
  char sql[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sql, sizeof sql, fmt, ap);
  va_end(ap);
  return tpg_int(c->url, sql);
}

/* session.prompt at `d`; the messageId of the receipt into `mid`, or false when it was refused. */
static bool prompt_at(test_daemon *d, const char *sid, const char *text, char *mid, size_t cap) {
  json_t *result = NULL, *error = NULL;
  int rc = ah__admin_call(d->run, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", text),
                          15000, &result, &error);
  const char *m = json_string_value(json_object_get(result, "messageId"));
  bool ok = rc == 0 && m;
  if (ok)
    snprintf(mid, cap, "%s", m);
  json_decref(result);
  json_decref(error);
  return ok;
}

/* Poll SQL until `sql` counts at least `want` (or the time is up). */
static bool sql_wait(cluster *c, int64_t want, uint64_t timeout_ms, const char *sql) {
  uint64_t end = ts_now_ms() + timeout_ms;
  for (;;) {
    if (tpg_int(c->url, sql) >= want)
      return true;
    if (ts_now_ms() > end)
      return false;
    usleep(50 * 1000);
  }
}

static bool turn_ended(cluster *c, const char *mid, uint64_t timeout_ms) {
  char sql[256];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM events WHERE kind = 'turn/ended' AND message_id = '%s'",
           mid);
  return sql_wait(c, 1, timeout_ms, sql);
}

/* The stored log of `sid` is whole: seqs 1..N without a gap or a duplicate. */
static void expect_gap_free(cluster *c, const char *sid) {
  int64_t n = sql_int(c, "SELECT count(*) FROM events WHERE session_id = '%s'", sid);
  int64_t distinct = sql_int(c, "SELECT count(DISTINCT seq) FROM events WHERE session_id = '%s'", sid);
  int64_t max = sql_int(c, "SELECT coalesce(max(seq), 0) FROM events WHERE session_id = '%s'", sid);
  int64_t last = sql_int(c, "SELECT last_seq FROM sessions WHERE id = '%s'", sid);
  cr_expect(n > 0 && n == distinct && n == max && max == last,
            "session %s: %lld events, %lld seqs, max %lld, last_seq %lld", sid, (long long)n,
            (long long)distinct, (long long)max, (long long)last);
}

/* Every acknowledged prompt is settled: its inbox row done and one turn/ended with its messageId. */
static void expect_settled(cluster *c, const char *mid) {
  cr_expect_eq(sql_int(c, "SELECT count(*) FROM inbox WHERE message_id = '%s' AND state = 'done'", mid), 1,
               "prompt %s is not done", mid);
  cr_expect_eq(sql_int(c, "SELECT count(*) FROM events WHERE kind = 'turn/ended' AND message_id = '%s'", mid),
               1, "prompt %s has no turn end (or several)", mid);
}

static char *writer_state(cluster *c, pid_t pid) {
  char sql[256];
  snprintf(
      sql, sizeof sql,
      "SELECT coalesce((SELECT state FROM pg_stat_activity WHERE application_name = 'agenthost-writer-%ld' "
      "LIMIT 1), 'none')",
      (long)pid);
  return tpg_text(c->url, sql);
}

/* The owner A is stopped past the TTL in the middle of a turn; B is prompted for the session and takes it
 * over; A resumes. A writes nothing more (its turn's remaining events are refused by the fence), B's turn is
 * whole, the session's seqs are gap-free and every prompt either host acknowledged is settled. */
Test(multihost, a_paused_owner_is_taken_over_and_writes_nothing_after, .timeout = 120, .fini = d_cleanup) {
  cluster c;
  cluster_init(&c);
  test_daemon *a = host_via(&c, NULL);
  test_daemon *b = host_via(&c, NULL);
  const char *work = c.work;
  char sid[64], a_mid[64], a_mid2[64], b_mid[64];
  d_new_session(a, work, sid, sizeof sid);
  cr_assert(prompt_at(a, sid, "before the pause", a_mid, sizeof a_mid));
  cr_assert(turn_ended(&c, a_mid, 10000));
  /* A's second turn sleeps; A is stopped while it runs. */
  cr_assert(prompt_at(a, sid, "/sleep 1500\nstill A's", a_mid2, sizeof a_mid2));
  cr_assert(sql_wait(&c, 1, 10000, "SELECT count(*) FROM events WHERE kind = 'turn/started'"));
  usleep(300 * 1000);
  cr_assert_eq(kill(a->pid, SIGSTOP), 0);
  usleep((TTL_MS + 1500) * 1000);
  /* B: the lease has run out: B takes the session over and acknowledges the prompt. */
  cr_assert(prompt_at(b, sid, "from B", b_mid, sizeof b_mid), "B refused the prompt:\n%s", d_log(b));
  cr_assert(turn_ended(&c, b_mid, 15000), "B's turn did not end:\n%s", d_log(b));
  char owner[128];
  char *o = tpg_text(c.url, "SELECT lease_owner FROM sessions");
  snprintf(owner, sizeof owner, "%s", o);
  free(o);
  int64_t rows = sql_int(&c, "SELECT count(*) FROM events");
  int64_t top = sql_int(&c, "SELECT max(\"cursor\") FROM events");
  cr_assert_eq(kill(a->pid, SIGCONT), 0);
  /* A notices (its heartbeat had lapsed, or its next write is fenced) and stops the session. */
  cr_expect(d_log_wait(a, "lost its lease", 15000), "A did not notice it lost the lease:\n%s", d_log(a));
  usleep(1500 * 1000); /* A's sleeping turn would have ended by now */
  cr_expect_eq(sql_int(&c, "SELECT count(*) FROM events"), rows, "A wrote events after the takeover");
  /* In SQL: the takeover made a new epoch, and no event of an older one committed after its first event. */
  int64_t epoch = sql_int(&c, "SELECT lease_epoch FROM sessions WHERE id = '%s'", sid);
  cr_expect_geq(epoch, 2, "the takeover did not change the epoch");
  cr_expect_eq(
      sql_int(&c,
              "SELECT count(*) FROM events WHERE session_id = '%s' AND epoch < %lld AND \"cursor\" > "
              "(SELECT min(\"cursor\") FROM events WHERE session_id = '%s' AND epoch = %lld)",
              sid, (long long)epoch, sid, (long long)epoch),
      0, "an event of the old epoch committed after the takeover");
  cr_expect_eq(sql_int(&c, "SELECT max(\"cursor\") FROM events"), top);
  char *o2 = tpg_text(c.url, "SELECT lease_owner FROM sessions");
  cr_expect_str_eq(o2, owner, "the lease changed hands again");
  free(o2);
  /* A prompt that reaches A now is posted for B, the owner, which runs it. */
  char x_mid[64];
  cr_assert(prompt_at(a, sid, "late at A", x_mid, sizeof x_mid), "A refused a prompt it can post:\n%s",
            d_log(a));
  cr_assert(turn_ended(&c, x_mid, 10000), "the prompt posted at A never ran:\n%s", d_log(b));
  char *by = tpg_text(c.url, "SELECT lease_owner FROM sessions");
  cr_expect_str_eq(by, owner, "the posted prompt moved the session");
  free(by);
  expect_settled(&c, x_mid);
  expect_gap_free(&c, sid);
  expect_settled(&c, a_mid);
  expect_settled(&c, a_mid2); /* ended by B's recovery as interrupted */
  expect_settled(&c, b_mid);
  assert_clean_exit(b, d_stop(b));
  assert_clean_exit(a, d_stop(a));
  cluster_fini(&c);
}

/* The owner is stopped while its writer is inside a transaction (found in pg_stat_activity: "idle in
 * transaction"), holding the session's row: the server ends that transaction (idle_in_transaction_session
 * _timeout), B takes over, and A's transaction never commits. */
Test(multihost, a_pause_in_the_middle_of_a_transaction_cannot_hold_the_session, .timeout = 180,
     .fini = d_cleanup) {
  cluster c;
  cluster_init(&c);
  /* A's writer sends one statement at a time and reads its answer before the next (its pipelines are
   * batches of one), so that its transactions wait on A between statements, where a stop can catch them;
   * B writes as usual. */
  setenv("AGENTHOST_PG_PIPELINE_BATCH", "1", 1);
  test_daemon *a = host_via(&c, NULL);
  unsetenv("AGENTHOST_PG_PIPELINE_BATCH");
  test_daemon *b = host_via(&c, NULL);
  const char *work = c.work;
  enum { SESSIONS = 4 };
  char sid[SESSIONS][64];
  for (int i = 0; i < SESSIONS; i++)
    d_new_session(a, work, sid[i], sizeof sid[i]);
  /* Keep A's writer busy (a child process prompts every session in turn, writing each receipt's messageId
   * to a file), and stop A at random moments until it is caught in a transaction. */
  char *acks = d_join(c.dir, "acks");
  pid_t prompter = fork();
  cr_assert_geq(prompter, 0);
  if (prompter == 0) {
    FILE *fa = fopen(acks, "w");
    for (int n = 0; fa && n < 100000; n++) {
      char mid[64];
      if (prompt_at(a, sid[n % SESSIONS], "busy busy busy busy", mid, sizeof mid)) {
        fprintf(fa, "%s\n", mid);
        fflush(fa);
      }
    }
    _exit(0);
  }
  bool caught = false;
  srand((unsigned)getpid());
  for (int attempt = 0; attempt < 400 && !caught; attempt++) {
    usleep((useconds_t)(2000 + rand() % 5000));
    cr_assert_eq(kill(a->pid, SIGSTOP), 0);
    usleep(20 * 1000);
    char *st = writer_state(&c, a->pid);
    caught = strcmp(st, "idle in transaction") == 0;
    free(st);
    if (!caught)
      cr_assert_eq(kill(a->pid, SIGCONT), 0);
  }
  kill(prompter, SIGKILL); /* a prompt it was waiting for was never acknowledged to it */
  waitpid(prompter, NULL, 0);
  char mids[4000][64];
  int nmids = 0;
  FILE *fa = fopen(acks, "r");
  while (fa && nmids < 4000 && fgets(mids[nmids], sizeof mids[0], fa))
    if (mids[nmids][0] && mids[nmids][0] != '\n') {
      mids[nmids][strcspn(mids[nmids], "\n")] = '\0';
      nmids++;
    }
  if (fa)
    fclose(fa);
  free(acks);
  cr_assert(caught, "A was never stopped inside a transaction");
  cr_log_info("A stopped inside a transaction after %d acknowledged prompts", nmids);
  int64_t rows = sql_int(&c, "SELECT count(*) FROM events");
  usleep((TTL_MS + 1000) * 1000);
  /* B prompts every session: each is taken over (the paused transaction was ended by the server). */
  char b_mid[SESSIONS][64];
  for (int i = 0; i < SESSIONS; i++) {
    cr_assert(prompt_at(b, sid[i], "from B", b_mid[i], sizeof b_mid[i]), "B refused session %d:\n%s", i,
              d_log(b));
    cr_assert(turn_ended(&c, b_mid[i], 15000));
  }
  int64_t after_b = sql_int(&c, "SELECT count(*) FROM events");
  cr_expect_gt(after_b, rows);
  cr_assert_eq(kill(a->pid, SIGCONT), 0);
  cr_expect(d_log_wait(a, "lost its lease", 15000), "A did not notice:\n%s", d_log(a));
  usleep(1000 * 1000);
  cr_expect_eq(sql_int(&c, "SELECT count(*) FROM events"), after_b, "A committed after the takeover");
  for (int i = 0; i < SESSIONS; i++) {
    expect_gap_free(&c, sid[i]);
    expect_settled(&c, b_mid[i]);
  }
  for (int i = 0; i < nmids; i++) {
    cr_assert(turn_ended(&c, mids[i], 20000), "A's acknowledged prompt %s never ended", mids[i]);
    expect_settled(&c, mids[i]);
  }
  assert_clean_exit(b, d_stop(b));
  assert_clean_exit(a, d_stop(a));
  cluster_fini(&c);
}

/* kill -9 of the owner in the middle of a turn: B takes the session over (at once: the dead owner is a
 * stale local process) and every prompt A acknowledged is settled. */
Test(multihost, a_killed_owner_loses_no_acknowledged_prompt, .timeout = 120, .fini = d_cleanup) {
  cluster c;
  cluster_init(&c);
  test_daemon *a = host_via(&c, NULL);
  test_daemon *b = host_via(&c, NULL);
  const char *work = c.work;
  char sid[64], m1[64], m2[64], m3[64], bm[64];
  d_new_session(a, work, sid, sizeof sid);
  cr_assert(prompt_at(a, sid, "/sleep 3000\nlong", m1, sizeof m1));
  cr_assert(prompt_at(a, sid, "queued one", m2, sizeof m2));
  cr_assert(prompt_at(a, sid, "queued two", m3, sizeof m3));
  cr_assert(sql_wait(&c, 1, 10000, "SELECT count(*) FROM events WHERE kind = 'turn/started'"));
  cr_assert_eq(kill(a->pid, SIGKILL), 0);
  int st = 0;
  cr_assert(ts_wait_exit(a->pid, 5000, &st));
  a->pid = 0;
  cr_assert(prompt_at(b, sid, "from B", bm, sizeof bm), "B refused:\n%s", d_log(b));
  cr_assert(turn_ended(&c, bm, 15000), "B's turn did not end:\n%s", d_log(b));
  cr_assert(turn_ended(&c, m3, 15000));
  expect_gap_free(&c, sid);
  expect_settled(&c, m1);
  expect_settled(&c, m2);
  expect_settled(&c, m3);
  expect_settled(&c, bm);
  assert_clean_exit(b, d_stop(b));
  cluster_fini(&c);
}

/* 1000 prompts while the server terminates the host's connections again and again: the host reconnects,
 * and every prompt it acknowledged is settled (the others were refused, never acknowledged). */
Test(multihost, terminated_connections_lose_no_acknowledged_prompt, .timeout = 300, .fini = d_cleanup) {
  cluster c;
  cluster_init(&c);
  test_daemon *a = host_via(&c, NULL);
  const char *work = c.work;
  enum { SESSIONS = 10, PROMPTS = 1000 };
  char sid[SESSIONS][64];
  for (int i = 0; i < SESSIONS; i++)
    d_new_session(a, work, sid[i], sizeof sid[i]);
  static char mids[PROMPTS][64];
  int acked = 0, refused = 0, terminations = 0;
  char kill_sql[256];
  snprintf(kill_sql, sizeof kill_sql,
           "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE "
           "'agenthost-%%-%ld'",
           (long)a->pid);
  for (int i = 0; i < PROMPTS; i++) {
    char text[64];
    snprintf(text, sizeof text, "prompt %d", i);
    if (prompt_at(a, sid[i % SESSIONS], text, mids[acked], sizeof mids[0]))
      acked++;
    else
      refused++;
    if (i % 50 == 25)
      terminations += (int)tpg_int(c.url, kill_sql);
  }
  cr_expect_geq(terminations, 20, "the server ended only %d connections", terminations);
  cr_expect(d_log_has(a, "the writer reconnected"), "the host never reconnected:\n%s", d_log(a));
  cr_expect_gt(acked, PROMPTS / 2, "only %d of %d prompts were acknowledged", acked, PROMPTS);
  for (int i = 0; i < acked; i++)
    cr_assert(turn_ended(&c, mids[i], 30000), "acknowledged prompt %s never ended:\n%s", mids[i], d_log(a));
  for (int i = 0; i < acked; i++)
    expect_settled(&c, mids[i]);
  for (int i = 0; i < SESSIONS; i++)
    expect_gap_free(&c, sid[i]);
  cr_log_info("%d prompts acknowledged, %d refused, %d connections terminated", acked, refused, terminations);
  assert_clean_exit(a, d_stop(a));
  cluster_fini(&c);
}

/* A session's working directory is on the machine that runs it: a host where it does not exist refuses
 * to take the session over (a clear error, nothing stored, the lease left alone) rather than run its
 * tools elsewhere; once the directory is there, the host takes it. */
Test(multihost, a_host_without_the_sessions_directory_does_not_take_it, .timeout = 60, .fini = d_cleanup) {
  cluster c;
  cluster_init(&c);
  test_daemon *a = host_via(&c, NULL);
  test_daemon *b = host_via(&c, NULL);
  const char *work = c.work;
  char *cwd = d_join(work, "project");
  cr_assert_eq(mkdir(cwd, 0700), 0);
  char sid[64], mid[64];
  d_new_session(a, cwd, sid, sizeof sid);
  cr_assert(prompt_at(a, sid, "at A", mid, sizeof mid));
  cr_assert(turn_ended(&c, mid, 10000));
  assert_clean_exit(a, d_stop(a)); /* the lease is released */
  cr_assert_eq(rmdir(cwd), 0);     /* "B's machine" has no such directory */
  int64_t rows = sql_int(&c, "SELECT count(*) FROM events");
  json_t *result = NULL, *error = NULL;
  int rc = ah__admin_call(b->run, "session.prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", "at B"),
                          10000, &result, &error);
  char *etext = error ? json_dumps(error, JSON_COMPACT) : NULL;
  cr_expect_neq(rc, 0, "B acknowledged a prompt for a session whose directory it lacks");
  cr_expect(etext && strstr(etext, "working directory does not exist on this host"), "B's refusal: %s",
            etext ? etext : "(none)");
  free(etext);
  json_decref(result);
  json_decref(error);
  cr_expect(d_log_has(b, "which does not exist on this host"), "B's log does not say why:\n%s", d_log(b));
  cr_expect_eq(sql_int(&c, "SELECT count(*) FROM events"), rows);
  cr_expect_eq(sql_int(&c, "SELECT count(*) FROM sessions WHERE lease_owner IS NOT NULL"), 0);
  /* The directory is there: B takes the session and runs the prompt. */
  cr_assert_eq(mkdir(cwd, 0700), 0);
  cr_assert(prompt_at(b, sid, "at B", mid, sizeof mid), "B refused:\n%s", d_log(b));
  cr_assert(turn_ended(&c, mid, 10000));
  expect_gap_free(&c, sid);
  assert_clean_exit(b, d_stop(b));
  free(cwd);
  cluster_fini(&c);
}

/* A session one host runs, driven from other hosts: an `agenthost sdk` client (C) prompts it (the prompt
 * is posted and A, the owner, runs it), sees its events in order and gap-free (C's follower), gets its
 * approval as a server request and answers it (the answer is posted; A runs the tool); a third host (B)
 * lists the session with its status and owner, and the request while it waits. */
Test(multihost, a_session_is_prompted_followed_and_answered_from_other_hosts, .timeout = 120,
     .fini = d_cleanup) {
  cluster c;
  cluster_init(&c);
  test_daemon *a = host_via(&c, NULL);
  test_daemon *b = host_via(&c, NULL);
  const char *work = c.work;
  char sid[64];
  d_new_session(a, work, sid, sizeof sid);

  ts_stdio h;
  ts_stdio_prepare(&h);
  char *cfg = NULL;
  cr_assert(asprintf(&cfg, "[host]\nlease_ttl_ms = %d\nstore_url = %s\nstore_password_file = %s\n", TTL_MS,
                     c.url, c.pwfile) > 0);
  free(ts_write_file(h.dir, "empty.ini", cfg));
  free(cfg);
  ts_stdio_spawn(&h, "sdk", NULL);
  json_t *msg = json_pack("{s:s, s:i, s:s, s:{s:s, s:{s:s}, s:i, s:{s:b}}}", "jsonrpc", "2.0", "id", 1,
                          "method", "initialize", "params", "cwd", work, "clientInfo", "name", "c",
                          "protocolVersion", 1, "capabilities", "requests", 1);
  ts_stdio_send_json(&h, msg);
  json_decref(msg);
  json_decref(ts_stdio_answer(&h, 1, "initialize"));
  msg = json_pack("{s:s, s:i, s:s, s:{s:s, s:s}}", "jsonrpc", "2.0", "id", 2, "method", "session/prompt",
                  "params", "sessionId", sid, "text",
                  "/tool write_file {\"path\":\"from-c.txt\",\"content\":\"c\"}");
  ts_stdio_send_json(&h, msg);
  json_decref(msg);

  int64_t last_seq = 0, last_cursor = 0;
  bool receipt = false, asked = false, ended = false, in_order = true, listed = false;
  char kinds[1024] = "";
  json_t *approval = NULL;
  uint64_t end = ts_now_ms() + 30000;
  while (!ended && ts_now_ms() < end) {
    json_t *m = ts_stdio_next_msg(&h, 1000);
    if (!m)
      continue;
    const char *method = ts_rpc_method(m);
    if (!method && json_integer_value(json_object_get(m, "id")) == 2) {
      receipt = json_is_string(json_object_get(json_object_get(m, "result"), "messageId"));
    } else if (method && strcmp(method, "request/approval") == 0) {
      asked = true;
      approval = json_incref(m);
    } else if (method && strcmp(method, "session.event") == 0) {
      json_t *ev = json_object_get(json_object_get(m, "params"), "event");
      if (strcmp(json_string_value(json_object_get(ev, "sessionId")), sid) == 0) {
        int64_t seq = json_integer_value(json_object_get(ev, "seq"));
        int64_t cur = json_integer_value(json_object_get(ev, "cursor"));
        if ((last_seq && seq != last_seq + 1) || cur <= last_cursor)
          in_order = false;
        last_seq = seq;
        last_cursor = cur;
        const char *k = json_string_value(json_object_get(ev, "kind"));
        strncat(kinds, k, sizeof kinds - strlen(kinds) - 2);
        strcat(kinds, " ");
        ended = strcmp(k, "turn/ended") == 0;
      }
    }
    json_decref(m);
    if (approval && !listed) {
      /* B sees the session as A runs it, and the request waiting. */
      json_t *got = d_call_ok(b, "session.get", json_pack("{s:s}", "sessionId", sid));
      json_t *row = json_object_get(got, "session");
      cr_expect_str_eq(json_string_value(json_object_get(row, "status")), "running");
      const char *owner = json_string_value(json_object_get(row, "owner"));
      char want[64];
      snprintf(want, sizeof want, ":%ld", (long)a->pid);
      cr_expect(owner && strstr(owner, want), "B shows the owner as %s", owner ? owner : "null");
      json_decref(got);
      json_t *reqs = d_call_ok(b, "request.list", json_pack("{s:s}", "sessionId", sid));
      cr_expect_eq(json_array_size(json_object_get(reqs, "requests")), 1, "B does not list the request");
      json_decref(reqs);
      listed = true;
      json_t *ans = json_pack("{s:s, s:O, s:{s:s}}", "jsonrpc", "2.0", "id", json_object_get(approval, "id"),
                              "result", "optionId", "allow_once");
      ts_stdio_send_json(&h, ans);
      json_decref(ans);
      json_decref(approval);
      approval = NULL;
    }
  }
  cr_expect(receipt, "C's prompt was not acknowledged");
  cr_expect(asked, "C never got the approval");
  cr_expect(ended, "C never saw the turn end; it saw: %s", kinds);
  cr_expect(in_order, "C saw the events out of order or with a gap: %s", kinds);
  cr_expect(strstr(kinds, "inbox/received") && strstr(kinds, "tool/call") && strstr(kinds, "tool/approval") &&
                strstr(kinds, "tool/result"),
            "C saw: %s", kinds);
  char *path = d_join(work, "from-c.txt");
  char *content = ts_read_file(path, NULL);
  cr_expect(content && strcmp(content, "c") == 0, "the approved write did not happen (A runs the session)");
  free(content);
  free(path);
  cr_expect_eq(sql_int(&c, "SELECT count(*) FROM requests WHERE state = 'granted'"), 1);
  char *owner = tpg_text(c.url, "SELECT lease_owner FROM sessions");
  char want[64];
  snprintf(want, sizeof want, ":%ld:", (long)a->pid);
  cr_expect(strstr(owner, want), "the session moved: %s", owner);
  free(owner);
  expect_gap_free(&c, sid);
  ts_stdio_close_stdin(&h);
  int st = 0;
  cr_expect(ts_wait_exit(h.pid, 15000, &st) && WIFEXITED(st) && WEXITSTATUS(st) == 0, "C: status %d", st);
  h.pid = -1;
  ts_stdio_free(&h);
  assert_clean_exit(b, d_stop(b));
  assert_clean_exit(a, d_stop(a));
  cluster_fini(&c);
}

/* The network between a host and the database starts dropping everything (a TCP proxy that reads and
 * throws away what either side sends, connections left open): the host's statements get no answer, it
 * gives its connection up (no answer in 15 s), cannot open another while the drops last, and once the
 * network is back it reconnects, learns whether the commit it was waiting for happened (its marker) and
 * goes on. Every prompt it acknowledged, before, during or after, is settled; the seqs are gap-free. */
Test(multihost, a_network_that_drops_packets_loses_no_acknowledged_prompt, .timeout = 300,
     .fini = d_cleanup) {
  cluster c;
  cluster_init(&c);
  char *via = NULL;
  pid_t proxy = tpg_proxy_start(c.dir, c.db, &via);
  test_daemon *a = host_via(&c, via);
  const char *work = c.work;
  enum { SESSIONS = 4, MAX = 400 };
  char sid[SESSIONS][64];
  for (int i = 0; i < SESSIONS; i++)
    d_new_session(a, work, sid[i], sizeof sid[i]);
  static char mids[MAX][64];
  int acked = 0, n = 0;
  for (; n < 40; n++)
    if (prompt_at(a, sid[n % SESSIONS], "/chunks 4\nbefore the drops", mids[acked], sizeof mids[0]))
      acked++;
  int before = acked;
  cr_assert_eq(kill(proxy, SIGUSR1), 0); /* drop */
  uint64_t drop_end = ts_now_ms() + 25000;
  int during = 0;
  while (ts_now_ms() < drop_end && acked < MAX) {
    json_t *result = NULL, *error = NULL;
    int rc =
        ah__admin_call(a->run, "session.prompt",
                       json_pack("{s:s, s:s}", "sessionId", sid[n++ % SESSIONS], "text", "while dropping"),
                       3000, &result, &error);
    const char *m = json_string_value(json_object_get(result, "messageId"));
    if (rc == 0 && m) {
      snprintf(mids[acked++], sizeof mids[0], "%s", m);
      during++;
    }
    json_decref(result);
    json_decref(error);
  }
  cr_assert_eq(kill(proxy, SIGUSR2), 0); /* forward again */
  /* The host takes prompts again once it has reconnected (its sessions reloaded). */
  bool back = false;
  for (uint64_t end = ts_now_ms() + 90000; !back && ts_now_ms() < end;) {
    back = prompt_at(a, sid[0], "after the drops", mids[acked], sizeof mids[0]);
    if (back)
      acked++;
    else
      usleep(500 * 1000);
  }
  cr_assert(back, "the host never took a prompt again:\n%s", d_log(a));
  for (int i = 0; i < 40 && acked < MAX; i++)
    if (prompt_at(a, sid[i % SESSIONS], "after the drops", mids[acked], sizeof mids[0]))
      acked++;
  cr_expect(d_log_has(a, "no answer from the server"), "the host never gave a silent connection up:\n%s",
            d_log(a));
  for (int i = 0; i < acked; i++)
    cr_assert(turn_ended(&c, mids[i], 60000), "acknowledged prompt %s never ended:\n%s", mids[i], d_log(a));
  for (int i = 0; i < acked; i++)
    expect_settled(&c, mids[i]);
  for (int i = 0; i < SESSIONS; i++)
    expect_gap_free(&c, sid[i]);
  cr_log_info("acknowledged: %d before the drops, %d while dropping, %d after; commits resolved by their "
              "marker: %s",
              before, during, acked - before - during, d_log_has(a, "its marker shows") ? "yes" : "none");
  assert_clean_exit(a, d_stop(a));
  tpg_proxy_stop(proxy);
  free(via);
  cluster_fini(&c);
}

/* A store read made by a call on its own thread (ah__admin_call blocks): its outcome and how long it took. */
typedef struct slow_call {
  test_daemon *d;
  const char *method;
  json_t *params;
  int rc;
  json_t *result, *error;
  uint64_t ms;
  _Atomic bool done;
} slow_call;

static void *slow_call_run(void *arg) {
  slow_call *c = arg;
  uint64_t t0 = ts_now_ms();
  c->rc = ah__admin_call(c->d->run, c->method, c->params, 30000, &c->result, &c->error);
  c->ms = ts_now_ms() - t0;
  c->done = true;
  return NULL;
}

/* A host whose database stops answering (a proxy that drops every packet) keeps serving: calls that need no
 * store answer at once while reads wait for the database, and those reads end with an error at their
 * deadline rather than hanging; once the database answers again, so does the host. Before reads left the
 * loop, one read held every call of the host for its whole deadline. */
Test(multihost, a_database_that_stops_answering_never_stops_the_host, .timeout = 180, .fini = d_cleanup) {
  cluster c;
  cluster_init(&c);
  char *via = NULL;
  pid_t proxy = tpg_proxy_start(c.dir, c.db, &via);
  test_daemon *a = host_via(&c, via);
  const char *work = c.work;
  char sid[64];
  d_new_session(a, work, sid, sizeof sid);
  cr_assert_eq(kill(proxy, SIGUSR1), 0); /* drop */
  slow_call reads[2] = {{.d = a, .method = "session.list", .params = json_object()},
                        {.d = a, .method = "session.get", .params = json_pack("{s:s}", "sessionId", sid)}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, slow_call_run, &reads[i]), 0);
  usleep(300 * 1000);
  /* While the reads wait: other calls answer at once, each of them. */
  uint64_t worst = 0;
  int answered = 0;
  for (int i = 0; i < 20 && !(reads[0].done && reads[1].done); i++) {
    json_t *result = NULL, *error = NULL;
    uint64_t t0 = ts_now_ms();
    int rc = ah__admin_call(a->run, "plugin.list", json_object(), 5000, &result, &error);
    uint64_t ms = ts_now_ms() - t0;
    cr_expect_eq(rc, 0, "plugin.list failed while the database was silent");
    worst = ms > worst ? ms : worst;
    answered += rc == 0;
    json_decref(result);
    json_decref(error);
    usleep(100 * 1000);
  }
  bool reads_pending = !reads[0].done && !reads[1].done;
  cr_expect(reads_pending, "the reads ended before the other calls were made: nothing was shown");
  cr_expect_geq(answered, 10, "other calls answered while the reads waited: %d", answered);
  cr_expect_lt(worst, 1000, "a call that needs no store waited %llu ms", (unsigned long long)worst);
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(reads[i].rc, AH_EIO, "%s while the database was silent: %s", reads[i].method,
                 ah_err_name(reads[i].rc));
    cr_expect_lt(reads[i].ms, 20000, "%s waited %llu ms", reads[i].method, (unsigned long long)reads[i].ms);
    cr_log_info("%s answered an error after %llu ms", reads[i].method, (unsigned long long)reads[i].ms);
    json_decref(reads[i].result);
    json_decref(reads[i].error);
  }
  cr_log_info("while they waited: %d calls answered, the slowest in %llu ms", answered,
              (unsigned long long)worst);
  cr_assert_eq(kill(proxy, SIGUSR2), 0); /* forward again */
  bool back = false;
  for (uint64_t end = ts_now_ms() + 60000; !back && ts_now_ms() < end;) {
    json_t *result = NULL, *error = NULL;
    back = ah__admin_call(a->run, "session.get", json_pack("{s:s}", "sessionId", sid), 10000, &result,
                          &error) == 0 &&
           json_object_get(result, "session");
    json_decref(result);
    json_decref(error);
    if (!back)
      usleep(500 * 1000);
  }
  cr_expect(back, "the host never read its store again:\n%s", d_log(a));
  assert_clean_exit(a, d_stop(a));
  tpg_proxy_stop(proxy);
  free(via);
  cluster_fini(&c);
}
