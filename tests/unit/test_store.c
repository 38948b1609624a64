/* Unit tests for host/store.c and host/store_sqlite.c: every operation and read against a real SQLite file
 * in a fresh directory, callbacks in submission order, group commit, an opset failing alone inside its
 * group, leases (also between two stores on one file, as two processes would hold them), durability across
 * close and open, refusal of newer schemas and of corrupt or foreign files (left byte-for-byte unchanged),
 * read-only opens, another process holding the write lock, and JSON round trips.
 *
 * The same suite runs against PostgreSQL when tests/support/with_pg.sh started a cluster for it (the
 * `store-pg` test): each test gets a database of its own; tests of what only SQLite has (its file, its
 * WAL, its migrations, simulated clocks) are skipped there and PostgreSQL's own come at the end.
 *
 * A "gated" backend wraps the SQLite one: it can park the writer thread after a commit until the test has
 * queued everything it wants, so that "these opsets form one group" is certain rather than likely. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "agenthost/errors.h"
#include "host_support.h"
#include "store.h"
#include "support.h"
#ifdef AH_HAVE_POSTGRESQL
#include <libpq-fe.h>

#include "pg_support.h"
#else
static bool tpg_enabled(void) {
  return false;
}
#endif

/* ---- helpers ------------------------------------------------------------------------------------------ */

/* JSON from text written with single quotes for readability ('a' → "a"); no apostrophes in values. */
static json_t *J(const char *text) {
  char *copy = strdup(text);
  cr_assert_not_null(copy);
  for (char *p = copy; *p; p++)
    if (*p == '\'')
      *p = '"';
  json_error_t e;
  json_t *v = json_loads(copy, JSON_DECODE_ANY, &e);
  cr_assert_not_null(v, "bad test JSON: %s: %s", e.text, copy);
  free(copy);
  return v;
}

typedef struct wres {
  int status;
  json_t *results;
  bool done;
  int order; /* completion index */
} wres;

static int completions;

static void on_write(int status, const json_t *results, void *arg) {
  wres *w = arg;
  cr_assert_not(w->done, "a write callback ran twice");
  w->status = status;
  w->results = json_incref((json_t *)results);
  w->done = true;
  w->order = completions++;
  if (status == 0)
    cr_assert(json_is_array(results), "a successful write without a results array");
  else
    cr_assert_null(results);
}

typedef struct fx {
  uv_loop_t loop;
  char *dir;
  char *path;
  ah_store *s;
  char *url; /* PostgreSQL: the test's own database; NULL on SQLite */
  char dbname[64];
} fx;

/* The backend under test. */
static const ah_store_backend *backend(void) {
#ifdef AH_HAVE_POSTGRESQL
  if (tpg_enabled())
    return &ah__store_pg;
#endif
  return &ah__store_sqlite;
}

/* What only SQLite has: skipped against PostgreSQL (which has its own tests of the same points). */
#define SQLITE_ONLY(why)                    \
  do {                                      \
    if (tpg_enabled()) {                    \
      cr_skip_test("SQLite only: %s", why); \
    }                                       \
  } while (0)

static void fx_init(fx *f) {
  memset(f, 0, sizeof *f);
  completions = 0;
  cr_assert_eq(uv_loop_init(&f->loop), 0);
  f->dir = ts_mkdtemp();
  cr_assert_not_null(f->dir);
  cr_assert(asprintf(&f->path, "%s/agenthost.db", f->dir) > 0);
#ifdef AH_HAVE_POSTGRESQL
  if (tpg_enabled())
    f->url = tpg_create_db(f->dbname);
#endif
}

static int store_open(fx *f, const ah_store_backend *be, ah_store_sync sync, bool read_only, ah_store **out,
                      char **why) {
  ah_store_opts o = {.path = f->path, .sync = sync, .read_only = read_only};
#ifdef AH_HAVE_POSTGRESQL
  o.url = f->url;
  o.password = tpg_password();
#endif
  return ah__store_open(&f->loop, be ? be : backend(), &o, out, why);
}

static ah_store *open_ok(fx *f, const ah_store_backend *be) {
  ah_store *s = NULL;
  char *why = NULL;
  int rc = store_open(f, be, AH_STORE_SYNC_NORMAL, false, &s, &why);
  cr_assert_eq(rc, 0, "open failed: %s (%s)", ah_err_name(rc), why ? why : "-");
  cr_assert_null(why);
  cr_assert_not_null(s);
  return s;
}

static void on_closed(void *arg) {
  *(bool *)arg = true;
}

static int completions_at_close = -1;

static void on_closed_count(void *arg) {
  completions_at_close = completions;
  *(bool *)arg = true;
}

static void close_store(fx *f, ah_store *s) {
  bool closed = false;
  ah__store_close(s, on_closed, &closed);
  cr_assert(ts_run_until(&f->loop, &closed, 10000), "the store did not close");
}

static void fx_fini(fx *f) {
  if (f->s)
    close_store(f, f->s);
  f->s = NULL;
  cr_assert_eq(ts_loop_close(&f->loop), 0, "a handle was left open on the loop");
  ts_rmtree(f->dir);
  free(f->dir);
  free(f->path);
#ifdef AH_HAVE_POSTGRESQL
  if (f->url)
    tpg_drop_db(f->dbname);
#endif
  free(f->url);
  cr_expect_eq(th_leak_check(), 0, "memory leaked (see the LeakSanitizer report)");
}

static bool all_done(void *arg) {
  wres **ws = arg;
  for (; *ws; ws++)
    if (!(*ws)->done)
      return false;
  return true;
}

/* Submit `opset` (stolen) and run the loop until its callback; returns the status, results in *w. */
static int write_wait(fx *f, ah_store *s, json_t *opset, wres *w) {
  memset(w, 0, sizeof *w);
  int rc = ah__store_write(s, opset, on_write, w);
  cr_assert_eq(rc, 0, "write refused: %s", ah_err_name(rc));
  cr_assert(ts_run_until(&f->loop, &w->done, 10000), "write callback never ran");
  return w->status;
}

/* The same for a write expected to succeed; the results are released. */
static void write_ok(fx *f, ah_store *s, const char *text) {
  wres w;
  int rc = write_wait(f, s, J(text), &w);
  cr_assert_eq(rc, 0, "write failed (%s): %s", ah_err_name(rc), text);
  json_decref(w.results);
}

static int write_status(fx *f, ah_store *s, const char *text) {
  wres w;
  int rc = write_wait(f, s, J(text), &w);
  json_decref(w.results);
  return rc;
}

static void expect_json(json_t *got, const char *want_text) {
  json_t *want = J(want_text);
  char *g = got ? json_dumps(got, JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY) : strdup("(NULL)");
  char *w = json_dumps(want, JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY);
  cr_expect(got && json_equal(got, want), "got %s\nwant %s", g, w);
  free(g);
  free(w);
  json_decref(want);
  json_decref(got);
}

static int64_t iget(const json_t *o, const char *key) {
  return json_integer_value(json_object_get(o, key));
}

static const char *sget(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

/* Raw SQL beside the store, on the database under test (the SQL must suit both, or the test one backend). */
static sqlite3_int64 raw_int(fx *f, const char *sql) {
#ifdef AH_HAVE_POSTGRESQL
  if (f->url)
    return tpg_int(f->url, sql);
#endif
  const char *path = f->path;
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  sqlite3_int64 v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

static char *raw_text(fx *f, const char *sql) {
#ifdef AH_HAVE_POSTGRESQL
  if (f->url)
    return tpg_text(f->url, sql);
#endif
  const char *path = f->path;
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  char *v = strdup((const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

static void raw_exec(fx *f, const char *sql) {
#ifdef AH_HAVE_POSTGRESQL
  if (f->url) {
    tpg_exec(f->url, sql);
    return;
  }
#endif
  const char *path = f->path;
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  char *err = NULL;
  cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, &err), SQLITE_OK, "%s", err ? err : "");
  cr_assert_eq(sqlite3_close(db), SQLITE_OK);
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---- the gated backend ------------------------------------------------------------------------------- */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool hold;        /* the writer waits inside write_group while set */
  bool holding;     /* the writer is waiting */
  size_t sizes[64]; /* group sizes in commit order */
  size_t ngroups;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false, {0}, 0};

/* Commits, then parks the writer thread while the gate is closed: whatever is submitted meanwhile is
 * taken as one group once it opens. */
static void gated_write_group(void *impl, json_t *const *opsets, size_t n, json_t **results, int *statuses) {
  backend()->write_group(impl, opsets, n, results, statuses);
  pthread_mutex_lock(&gate.mu);
  if (gate.ngroups < 64)
    gate.sizes[gate.ngroups++] = n;
  while (gate.hold) {
    gate.holding = true;
    pthread_cond_broadcast(&gate.cv);
    pthread_cond_wait(&gate.cv, &gate.mu);
  }
  gate.holding = false;
  pthread_mutex_unlock(&gate.mu);
}

static ah_store_backend gated_backend(void) {
  ah_store_backend b = *backend();
  b.name = "gated";
  b.write_group = gated_write_group;
  return b;
}

static void gate_close(void) {
  pthread_mutex_lock(&gate.mu);
  gate.hold = true;
  pthread_mutex_unlock(&gate.mu);
}

/* Wait until the writer thread is parked at the gate (it has committed a group and cannot take another). */
static void gate_wait_holding(uv_loop_t *loop) {
  uv_run(loop, UV_RUN_NOWAIT); /* the end of this loop turn hands the opset to the writer */
  pthread_mutex_lock(&gate.mu);
  while (!gate.holding)
    pthread_cond_wait(&gate.cv, &gate.mu);
  pthread_mutex_unlock(&gate.mu);
}

static void gate_open(void) {
  pthread_mutex_lock(&gate.mu);
  gate.hold = false;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
}

static size_t gate_groups(void) {
  pthread_mutex_lock(&gate.mu);
  size_t n = gate.ngroups;
  pthread_mutex_unlock(&gate.mu);
  return n;
}

#define SESSION1                                                                                \
  "{'op':'session.put','session':{'id':'s1','cwd':'/"                                           \
  "w','title':'T','provider':'echo','model':'m','parent':null,"                                 \
  "'local':true,'depth':0,'status':'idle','closed':false,'created':'2025-01-01T00:00:00.000Z'," \
  "'updated':'2025-01-01T00:00:00.000Z','policy':{'run_command':'ask'},'tags':['a','b'],"       \
  "'settings':{'mode':'read_only'}}}"

/* A session and everything below it, by parent link, with each one's usage (the tree's usage). */
Test(store, session_tree_lists_a_session_and_its_descendants_with_their_usage) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s,
           "[{'op':'session.put','session':{'id':'r','usage':{'inputTokens':1}}},"
           "{'op':'session.put','session':{'id':'c1','parent':'r','depth':1}},"
           "{'op':'session.put','session':{'id':'c2','parent':'r','depth':1}},"
           "{'op':'session.put','session':{'id':'g1','parent':'c1','depth':2}},"
           "{'op':'session.put','session':{'id':'other'}},"
           "{'op':'session.update','id':'g1','set':{'usage':{'inputTokens':100,'turns':2}}}]");
  json_t *t = ah__store_session_tree(f.s, "r");
  expect_json(t, "[{'id':'c1','parent':'r','usage':{}},{'id':'c2','parent':'r','usage':{}},"
                 "{'id':'g1','parent':'c1','usage':{'inputTokens':100,'turns':2}},"
                 "{'id':'r','parent':null,'usage':{'inputTokens':1}}]");
  t = ah__store_session_tree(f.s, "c1");
  cr_expect_eq(json_array_size(t), 2);
  json_decref(t);
  t = ah__store_session_tree(f.s, "nobody");
  cr_expect(json_is_array(t) && json_array_size(t) == 0);
  json_decref(t);
  fx_fini(&f);
}

/* ---- open, schema -------------------------------------------------------------------------------------- */

Test(store, open_creates_wal_database_at_current_schema) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  if (f.url) {
    cr_expect_eq(raw_int(&f, "SELECT max(version) FROM agenthost_schema"), 1);
    cr_expect_eq(raw_int(&f, "SELECT count(*) FROM pg_tables WHERE tablename IN ('sessions', 'events', "
                             "'inbox', 'inbox_content', 'requests', 'owners', 'commit_markers')"),
                 7);
  } else {
    cr_expect(exists(f.path));
    cr_expect_eq(raw_int(&f, "PRAGMA user_version"), 6);
    char *mode = raw_text(&f, "PRAGMA journal_mode");
    cr_expect_str_eq(mode, "wal");
    free(mode);
    cr_expect_eq(raw_int(&f, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                             "('sessions', 'events', 'inbox', 'inbox_content', 'requests', 'owners')"),
                 6);
  }
  cr_expect_eq(ah__store_commits(f.s), 0);
  cr_expect_eq(ah__store_opsets(f.s), 0);
  expect_json(ah__store_list_sessions(f.s, NULL, 0), "[]");
  cr_expect_null(ah__store_get_session(f.s, "nope"));
  fx_fini(&f);
}

Test(store, backend_open_failure_is_returned_with_its_reason) {
  SQLITE_ONLY("a database path (PostgreSQL: pg_an_unreachable_server_is_refused_with_its_reason)");
  fx f;
  fx_init(&f);
  free(f.path);
  cr_assert(asprintf(&f.path, "%s/no/such/dir/agenthost.db", f.dir) > 0);
  ah_store *s = NULL;
  char *why = NULL;
  int rc = store_open(&f, NULL, AH_STORE_SYNC_NORMAL, false, &s, &why);
  cr_expect_eq(rc, AH_EIO, "got %s", ah_err_name(rc));
  cr_expect_null(s);
  cr_assert_not_null(why);
  cr_expect(strstr(why, "no/such/dir") != NULL, "why: %s", why);
  free(why);
  rc = store_open(&f, NULL, (ah_store_sync)42, false, &s, &why);
  cr_expect_eq(rc, AH_EINVAL, "an unknown synchronous setting: %s", ah_err_name(rc));
  free(why);
  fx_fini(&f);
}

/* ---- operations and reads ------------------------------------------------------------------------------ */

Test(store, session_put_get_replace_list) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  expect_json(ah__store_get_session(f.s, "s1"),
              "{'id':'s1','cwd':'/w','title':'T','provider':'echo','model':'m','parent':null,'local':true,"
              "'depth':0,'status':'idle','closed':false,'created':'2025-01-01T00:00:00.000Z',"
              "'updated':'2025-01-01T00:00:00.000Z','policy':{'run_command':'ask'},'tags':['a','b'],"
              "'lastSeq':0,'leaseOwner':null,'leaseUntil':0,'settings':{'mode':'read_only'},'usage':{}}");
  /* Minimal sessions get defaults; a put of an existing id replaces its description. */
  write_ok(&f, f.s,
           "[{'op':'session.put','session':{'id':'s3','parent':'s1','depth':1}},"
           "{'op':'session.put','session':{'id':'s2'}},"
           "{'op':'event','sessionId':'s1','seq':7,'kind':'k','time':'t','data':{}},"
           "{'op':'session.put','session':{'id':'s1','title':'T2','status':'running','closed':true}}]");
  json_t *s1 = ah__store_get_session(f.s, "s1");
  cr_assert_not_null(s1);
  cr_expect_str_eq(sget(s1, "title"), "T2");
  cr_expect_str_eq(sget(s1, "status"), "running");
  cr_expect(json_is_true(json_object_get(s1, "closed")));
  cr_expect(json_is_null(json_object_get(s1, "cwd")), "a replace sets what it is given");
  cr_expect_eq(iget(s1, "lastSeq"), 7, "a replace keeps lastSeq");
  json_decref(s1);
  expect_json(ah__store_get_session(f.s, "s3"),
              "{'id':'s3','cwd':null,'title':null,'provider':null,'model':null,'parent':'s1','local':false,"
              "'depth':1,'status':null,'closed':false,'created':null,'updated':null,'policy':{},'tags':[],"
              "'lastSeq':0,'leaseOwner':null,'leaseUntil':0,'settings':{},'usage':{}}");
  /* Listing: ordered by id, paged with after_id and limit (0 = no limit). */
  json_t *all = ah__store_list_sessions(f.s, NULL, 0);
  cr_assert_eq(json_array_size(all), 3);
  cr_expect_str_eq(sget(json_array_get(all, 0), "id"), "s1");
  cr_expect_str_eq(sget(json_array_get(all, 1), "id"), "s2");
  cr_expect_str_eq(sget(json_array_get(all, 2), "id"), "s3");
  json_decref(all);
  json_t *page = ah__store_list_sessions(f.s, NULL, 2);
  cr_expect_eq(json_array_size(page), 2);
  json_decref(page);
  page = ah__store_list_sessions(f.s, "s1", 1);
  cr_assert_eq(json_array_size(page), 1);
  cr_expect_str_eq(sget(json_array_get(page, 0), "id"), "s2");
  json_decref(page);
  page = ah__store_list_sessions(f.s, "s3", 10);
  cr_expect_eq(json_array_size(page), 0);
  json_decref(page);
  /* A put without an id is refused. */
  cr_expect_eq(write_status(&f, f.s, "[{'op':'session.put','session':{'title':'x'}}]"), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'session.put'}]"), AH_EINVAL);
  fx_fini(&f);
}

Test(store, session_update_sets_fields_and_refuses_unknown_ones) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  write_ok(&f, f.s,
           "[{'op':'session.update','id':'s1','set':{'title':'New','status':'running','closed':true,"
           "'policy':{'write_file':'deny'},'tags':['x'],'depth':3,'parent':'p','updated':'2025-02-02T00:00:"
           "00.000Z'}}]");
  json_t *s = ah__store_get_session(f.s, "s1");
  cr_assert_not_null(s);
  cr_expect_str_eq(sget(s, "title"), "New");
  cr_expect_str_eq(sget(s, "status"), "running");
  cr_expect_str_eq(sget(s, "parent"), "p");
  cr_expect_str_eq(sget(s, "updated"), "2025-02-02T00:00:00.000Z");
  cr_expect_str_eq(sget(s, "cwd"), "/w", "fields not set are kept");
  cr_expect(json_is_true(json_object_get(s, "closed")));
  cr_expect_eq(iget(s, "depth"), 3);
  json_t *policy = J("{'write_file':'deny'}");
  cr_expect(json_equal(json_object_get(s, "policy"), policy));
  json_decref(policy);
  json_decref(s);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'session.update','id':'s1','set':{'lastSeq':9}}]"), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'session.update','id':'s1','set':{'id':'s9'}}]"), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'session.update','id':'s1','set':{'title; DROP TABLE x':1}}]"),
               AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'session.update','id':'s1','set':{'depth':'deep'}}]"),
               AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'session.update','id':'nope','set':{'title':'x'}}]"), AH_ENOENT);
  s = ah__store_get_session(f.s, "s1");
  cr_expect_str_eq(sget(s, "title"), "New", "refused updates changed nothing");
  json_decref(s);
  fx_fini(&f);
}

Test(store, session_delete_removes_its_events_inbox_and_requests) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s,
           "[" SESSION1 ",{'op':'session.put','session':{'id':'s2'}},"
           "{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}},"
           "{'op':'event','sessionId':'s2','seq':1,'kind':'k','time':'t','data':{}},"
           "{'op':'inbox.put','messageId':'m1','sessionId':'s1','content':[],'time':'t'},"
           "{'op':'request.put','request':{'id':'r1','sessionId':'s1','kind':'approval','created':'t'}}]");
  write_ok(&f, f.s, "[{'op':'session.delete','id':'s1'}]");
  cr_expect_null(ah__store_get_session(f.s, "s1"));
  expect_json(ah__store_events(f.s, "s1", 0, 0), "[]");
  expect_json(ah__store_inbox_open(f.s, "s1"), "[]");
  cr_expect_null(ah__store_get_request(f.s, "r1"));
  json_t *s2 = ah__store_events(f.s, "s2", 0, 0);
  cr_expect_eq(json_array_size(s2), 1, "another session's events are kept");
  json_decref(s2);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'session.delete','id':'s1'}]"), 0, "deleting twice is harmless");
  fx_fini(&f);
}

Test(store, events_cursor_paging_and_last_seq) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 ",{'op':'session.put','session':{'id':'s2'}}]");
  /* Interleave two sessions; every event is its own opset (so cursors come from separate statements). */
  wres w[20];
  for (int i = 0; i < 20; i++) {
    char text[256];
    snprintf(
        text, sizeof text,
        "[{'op':'event','sessionId':'%s','seq':%d,'kind':'message','time':'2025-01-01T00:00:%02d.000Z'%s,"
        "'data':{'i':%d}}]",
        i % 2 ? "s2" : "s1", i / 2 + 1, i, i % 4 == 0 ? ",'turnId':'t1','messageId':'m1'" : "", i);
    memset(&w[i], 0, sizeof w[i]);
    cr_assert_eq(ah__store_write(f.s, J(text), on_write, &w[i]), 0);
  }
  wres *ws[21];
  for (int i = 0; i < 20; i++)
    ws[i] = &w[i];
  ws[20] = NULL;
  cr_assert(ts_run_until_pred(&f.loop, all_done, ws, 10000));
  int64_t last = 0;
  for (int i = 0; i < 20; i++) {
    cr_assert_eq(w[i].status, 0);
    cr_assert_eq(json_array_size(w[i].results), 1);
    int64_t cursor = json_integer_value(json_array_get(w[i].results, 0));
    cr_expect_gt(cursor, last, "cursor %lld after %lld", (long long)cursor, (long long)last);
    last = cursor;
    json_decref(w[i].results);
  }
  /* A session's events in seq order, paged. */
  json_t *p = ah__store_events(f.s, "s1", 0, 3);
  cr_assert_eq(json_array_size(p), 3);
  for (int i = 0; i < 3; i++)
    cr_expect_eq(iget(json_array_get(p, (size_t)i), "seq"), i + 1);
  json_decref(p);
  p = ah__store_events(f.s, "s1", 3, 3);
  cr_assert_eq(json_array_size(p), 3);
  cr_expect_eq(iget(json_array_get(p, 0), "seq"), 4);
  json_decref(p);
  p = ah__store_events(f.s, "s1", 9, 5);
  cr_assert_eq(json_array_size(p), 1);
  cr_expect_eq(iget(json_array_get(p, 0), "seq"), 10);
  json_decref(p);
  p = ah__store_events(f.s, "s1", 0, 0);
  cr_expect_eq(json_array_size(p), 10);
  /* The row's shape: turnId/messageId present only when given. */
  json_t *e1 = json_array_get(p, 0);
  expect_json(json_incref(e1),
              "{'cursor':1,'sessionId':'s1','seq':1,'kind':'message',"
              "'time':'2025-01-01T00:00:00.000Z','turnId':'t1','messageId':'m1','data':{'i':0}}");
  json_t *e2 = json_array_get(p, 1);
  cr_expect_null(json_object_get(e2, "turnId"));
  cr_expect_null(json_object_get(e2, "messageId"));
  cr_expect_eq(json_object_size(e2), 6);
  json_decref(p);
  /* Every session, in cursor order. */
  json_t *all = ah__store_events_after(f.s, 0, 0);
  cr_assert_eq(json_array_size(all), 20);
  for (size_t i = 1; i < 20; i++)
    cr_expect_gt(iget(json_array_get(all, i), "cursor"), iget(json_array_get(all, i - 1), "cursor"));
  int64_t mid = iget(json_array_get(all, 9), "cursor");
  json_decref(all);
  p = ah__store_events_after(f.s, mid, 4);
  cr_assert_eq(json_array_size(p), 4);
  cr_expect_eq(iget(json_array_get(p, 0), "cursor"), mid + 1);
  json_decref(p);
  p = ah__store_events_after(f.s, last, 0);
  cr_expect_eq(json_array_size(p), 0);
  json_decref(p);
  /* lastSeq follows the highest seq, never goes back. */
  json_t *s1 = ah__store_get_session(f.s, "s1");
  cr_expect_eq(iget(s1, "lastSeq"), 10);
  json_decref(s1);
  write_ok(&f, f.s, "[{'op':'event','sessionId':'s1','seq':15,'kind':'k','time':'t','data':{}}]");
  write_ok(&f, f.s, "[{'op':'event','sessionId':'s1','seq':12,'kind':'k','time':'t','data':{}}]");
  s1 = ah__store_get_session(f.s, "s1");
  cr_expect_eq(iget(s1, "lastSeq"), 15);
  json_decref(s1);
  /* Malformed events are refused. */
  cr_expect_eq(write_status(&f, f.s, "[{'op':'event','sessionId':'s1','seq':'x','kind':'k','data':{}}]"),
               AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'event','sessionId':'s1','seq':30,'data':{}}]"), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'event','seq':30,'kind':'k','data':{}}]"), AH_EINVAL);
  fx_fini(&f);
}

Test(store, inbox_put_state_and_open_rows) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(
      &f, f.s,
      "[{'op':'inbox.put','messageId':'m1','sessionId':'s1','content':[{'type':'text','text':'one'}],"
      "'time':'2025-01-01T00:00:01.000Z'},"
      "{'op':'inbox.put','messageId':'m2','sessionId':'s1','content':[],'time':'2025-01-01T00:00:02.000Z'},"
      "{'op':'inbox.put','messageId':'m3','sessionId':'s1','content':[],'time':'2025-01-01T00:00:03.000Z'},"
      "{'op':'inbox.put','messageId':'m4','sessionId':'s2','content':[],'time':'2025-01-01T00:00:04.000Z'}]");
  json_t *open = ah__store_inbox_open(f.s, "s1");
  cr_assert_eq(json_array_size(open), 3);
  expect_json(json_incref(json_array_get(open, 0)),
              "{'messageId':'m1','sessionId':'s1','content':[{'type':'text','text':'one'}],'state':'queued',"
              "'turnId':null,'time':'2025-01-01T00:00:01.000Z'}");
  cr_expect_str_eq(sget(json_array_get(open, 1), "messageId"), "m2");
  cr_expect_str_eq(sget(json_array_get(open, 2), "messageId"), "m3");
  json_decref(open);
  write_ok(&f, f.s,
           "[{'op':'inbox.state','messageId':'m1','state':'claimed','turnId':'t1'},"
           "{'op':'inbox.state','messageId':'m2','state':'done'},"
           "{'op':'inbox.state','messageId':'m3','state':'cancelled'}]");
  open = ah__store_inbox_open(f.s, "s1");
  cr_assert_eq(json_array_size(open), 1);
  cr_expect_str_eq(sget(json_array_get(open, 0), "state"), "claimed");
  cr_expect_str_eq(sget(json_array_get(open, 0), "turnId"), "t1");
  json_decref(open);
  write_ok(&f, f.s, "[{'op':'inbox.state','messageId':'m1','state':'done'}]");
  expect_json(ah__store_inbox_open(f.s, "s1"), "[]");
  cr_expect_eq(write_status(&f, f.s, "[{'op':'inbox.state','messageId':'nope','state':'done'}]"), AH_ENOENT);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'inbox.state','messageId':'m4','state':'posted'}]"), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'inbox.state','messageId':'m4','state':'bogus'}]"), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'inbox.put','messageId':'m4','sessionId':'s2','content':[]}]"),
               AH_EEXIST, "a message id is stored once");
  open = ah__store_inbox_open(f.s, "s2");
  cr_expect_eq(json_array_size(open), 1);
  cr_expect_str_eq(sget(json_array_get(open, 0), "state"), "queued");
  json_decref(open);
  fx_fini(&f);
}

Test(store, requests_put_pending_resolve_once) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s,
           "[{'op':'request.put','request':{'id':'r1','sessionId':'s1','turnId':'t1','kind':'approval',"
           "'params':{'tool':'run_command','input':{'command':'ls'}},'options':['allow_once','reject_once'],"
           "'created':'2025-01-01T00:00:01.000Z'}},"
           "{'op':'request.put','request':{'id':'r2','sessionId':'s2','kind':'question','params':{'q':'?'},"
           "'created':'2025-01-01T00:00:02.000Z'}},"
           "{'op':'request.put','request':{'id':'r3','sessionId':'s1','kind':'question',"
           "'created':'2025-01-01T00:00:03.000Z'}}]");
  expect_json(
      ah__store_get_request(f.s, "r1"),
      "{'id':'r1','sessionId':'s1','turnId':'t1','kind':'approval',"
      "'params':{'tool':'run_command','input':{'command':'ls'}},'options':['allow_once','reject_once'],"
      "'state':'pending','answer':null,'created':'2025-01-01T00:00:01.000Z','resolved':null}");
  json_t *p = ah__store_requests_pending(f.s, NULL);
  cr_assert_eq(json_array_size(p), 3);
  cr_expect_str_eq(sget(json_array_get(p, 0), "id"), "r1");
  cr_expect_str_eq(sget(json_array_get(p, 1), "id"), "r2");
  cr_expect_str_eq(sget(json_array_get(p, 2), "id"), "r3");
  json_decref(p);
  p = ah__store_requests_pending(f.s, "s1");
  cr_assert_eq(json_array_size(p), 2);
  cr_expect_str_eq(sget(json_array_get(p, 1), "id"), "r3");
  json_decref(p);
  write_ok(&f, f.s,
           "[{'op':'request.state','id':'r1','state':'granted','answer':{'option':'allow_once'},"
           "'resolved':'2025-01-01T00:00:09.000Z'}]");
  expect_json(
      ah__store_get_request(f.s, "r1"),
      "{'id':'r1','sessionId':'s1','turnId':'t1','kind':'approval',"
      "'params':{'tool':'run_command','input':{'command':'ls'}},'options':['allow_once','reject_once'],"
      "'state':'granted','answer':{'option':'allow_once'},'created':'2025-01-01T00:00:01.000Z',"
      "'resolved':'2025-01-01T00:00:09.000Z'}");
  p = ah__store_requests_pending(f.s, "s1");
  cr_assert_eq(json_array_size(p), 1);
  cr_expect_str_eq(sget(json_array_get(p, 0), "id"), "r3");
  json_decref(p);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'request.state','id':'r1','state':'denied','resolved':'t'}]"),
               AH_ESTATE, "the first resolution wins");
  cr_expect_eq(write_status(&f, f.s, "[{'op':'request.state','id':'rx','state':'denied','resolved':'t'}]"),
               AH_ENOENT);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'request.state','id':'r2','state':'maybe','resolved':'t'}]"),
               AH_EINVAL);
  cr_expect_eq(
      write_status(&f, f.s, "[{'op':'request.put','request':{'id':'r2','sessionId':'s2','kind':'q'}}]"),
      AH_EEXIST);
  cr_expect_null(ah__store_get_request(f.s, "rx"));
  json_t *r1 = ah__store_get_request(f.s, "r1");
  cr_expect_str_eq(sget(r1, "state"), "granted");
  json_decref(r1);
  fx_fini(&f);
}

Test(store, sessions_to_recover) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s,
           "[{'op':'session.put','session':{'id':'a-running','status':'running'}},"
           "{'op':'session.put','session':{'id':'b-inbox','status':'idle'}},"
           "{'op':'session.put','session':{'id':'c-idle','status':'idle'}},"
           "{'op':'session.put','session':{'id':'d-closed','status':'running','closed':true}},"
           "{'op':'session.put','session':{'id':'e-done','status':'idle'}},"
           "{'op':'inbox.put','messageId':'m1','sessionId':'b-inbox','content':[],'time':'t'},"
           "{'op':'inbox.put','messageId':'m2','sessionId':'e-done','content':[],'time':'t'},"
           "{'op':'inbox.put','messageId':'m3','sessionId':'d-closed','content':[],'time':'t'},"
           "{'op':'inbox.state','messageId':'m2','state':'done'}]");
  json_t *r = ah__store_sessions_to_recover(f.s);
  cr_assert_eq(json_array_size(r), 2);
  cr_expect_str_eq(sget(json_array_get(r, 0), "id"), "a-running");
  cr_expect_str_eq(sget(json_array_get(r, 1), "id"), "b-inbox");
  json_decref(r);
  fx_fini(&f);
}

/* lease.renew: one heartbeat row per owner keeps every session it leased, whatever their own lease_until;
 * lapsed says whether it had run out before; a lapsed owner's sessions can be taken; lease.end removes it. */
Test(store, one_heartbeat_per_owner_keeps_all_its_leases) {
  SQLITE_ONLY("leases on a simulated clock (PostgreSQL leases go by the server clock: "
              "pg_leases_go_by_the_servers_clock)");
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s,
           "[{'op':'session.put','session':{'id':'s1'}},{'op':'session.put','session':{'id':'s2'}},"
           "{'op':'session.put','session':{'id':'s3'}}]");
  wres w;
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease.renew','owner':'A','until':500,'now':0},"
                            "{'op':'lease','id':'s1','owner':'A','until':1000,'now':0},"
                            "{'op':'lease','id':'s2','owner':'A','until':1000,'now':0},"
                            "{'op':'lease.renew','owner':'A','until':5000,'now':900}]"),
                          &w),
               0);
  expect_json(w.results, "[{'lapsed':true},true,true,{'lapsed':false}]");
  /* Past the sessions' own lease_until, the heartbeat still holds them: B is refused. */
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease','id':'s1','owner':'B','until':9000,'now':4000},"
                            "{'op':'lease','id':'s2','owner':'B','until':9000,'now':4999},"
                            "{'op':'lease','id':'s3','owner':'B','until':9000,'now':4000}]"),
                          &w),
               0);
  expect_json(w.results, "[false,false,true]");
  /* The heartbeat ran out: B takes s1; A's late renewal says it lapsed (A then checks its sessions). */
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease','id':'s1','owner':'B','until':9000,'now':5001},"
                            "{'op':'lease.renew','owner':'A','until':9000,'now':6000}]"),
                          &w),
               0);
  expect_json(w.results, "[true,{'lapsed':true}]");
  json_t *s = ah__store_get_session(f.s, "s1");
  cr_expect_str_eq(sget(s, "leaseOwner"), "B");
  json_decref(s);
  s = ah__store_get_session(f.s, "s2");
  cr_expect_str_eq(sget(s, "leaseOwner"), "A", "renewed again in time for s2: still A's");
  json_decref(s);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM owners"), 2);
  write_ok(&f, f.s, "[{'op':'lease.end','owner':'A'}]");
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM owners WHERE owner = 'A'"), 0);
  /* A heartbeat dead for a day is removed at the next renewal of anyone. */
  write_ok(&f, f.s, "[{'op':'lease.renew','owner':'C','until':90000000,'now':86410000}]");
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM owners WHERE owner = 'B'"), 0);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM owners"), 1);
  /* Malformed operations fail their opset. */
  cr_expect_neq(write_wait(&f, f.s, J("[{'op':'lease.renew','owner':'A','until':'x','now':0}]"), &w), 0);
  cr_expect_neq(write_wait(&f, f.s, J("[{'op':'lease.end'}]"), &w), 0);
  fx_fini(&f);
}

Test(store, leases) {
  SQLITE_ONLY("leases on a simulated clock (PostgreSQL: pg_leases_go_by_the_servers_clock)");
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  wres w;
  /* Free → taken; another owner refused; the owner renews; expired → taken; steal; release rules. */
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease','id':'s1','owner':'A','until':1000,'now':0},"
                            "{'op':'lease','id':'s1','owner':'B','until':2000,'now':500},"
                            "{'op':'lease','id':'s1','owner':'A','until':1500,'now':600}]"),
                          &w),
               0);
  expect_json(w.results, "[true,false,true]");
  json_t *s = ah__store_get_session(f.s, "s1");
  cr_expect_str_eq(sget(s, "leaseOwner"), "A");
  cr_expect_eq(iget(s, "leaseUntil"), 1500);
  json_decref(s);
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease','id':'s1','owner':'B','until':3000,'now':1500},"
                            "{'op':'lease','id':'s1','owner':'B','until':3000,'now':1501}]"),
                          &w),
               0);
  expect_json(w.results, "[false,true]");
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease','id':'s1','owner':'C','until':4000,'now':1600,'steal':'A'},"
                            "{'op':'lease','id':'s1','owner':'C','until':4000,'now':1600,'steal':'B'},"
                            "{'op':'lease','id':'nope','owner':'C','until':4000,'now':1600}]"),
                          &w),
               0);
  expect_json(w.results, "[false,true,false]");
  write_ok(&f, f.s, "[{'op':'lease.release','id':'s1','owner':'B'}]");
  s = ah__store_get_session(f.s, "s1");
  cr_expect_str_eq(sget(s, "leaseOwner"), "C", "a release by a non-owner is ignored");
  json_decref(s);
  write_ok(&f, f.s, "[{'op':'lease.release','id':'s1','owner':'C'}]");
  s = ah__store_get_session(f.s, "s1");
  cr_expect(json_is_null(json_object_get(s, "leaseOwner")));
  json_decref(s);
  cr_assert_eq(write_wait(&f, f.s, J("[{'op':'lease','id':'s1','owner':'B','until':10,'now':0}]"), &w), 0);
  expect_json(w.results, "[true]");
  cr_expect_eq(write_status(&f, f.s, "[{'op':'lease','id':'s1','owner':'B'}]"), AH_EINVAL);
  fx_fini(&f);
}

/* A lease's epoch: one more at each change of owner (taken from none, stolen, taken after a release), the
 * same while one owner renews; every event is stamped with the epoch it was written under. */
Test(store, lease_epochs_count_changes_of_owner_and_stamp_events) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  cr_expect_eq(raw_int(&f, "SELECT lease_epoch FROM sessions WHERE id = 's1'"), 0);
  write_ok(&f, f.s,
           "[{'op':'lease','id':'s1','owner':'A','until':60000,'now':0},"
           "{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}},"
           "{'op':'lease','id':'s1','owner':'A','until':60000,'now':0}]");
  cr_expect_eq(raw_int(&f, "SELECT lease_epoch FROM sessions WHERE id = 's1'"), 1,
               "taken: 1, renewed: still 1");
  write_ok(&f, f.s,
           "[{'op':'lease','id':'s1','owner':'B','until':60000,'now':0,'steal':'A'},"
           "{'op':'event','sessionId':'s1','seq':2,'kind':'k','time':'t','data':{}},"
           "{'op':'lease.release','id':'s1','owner':'B'},"
           "{'op':'lease','id':'s1','owner':'A','until':60000,'now':0},"
           "{'op':'event','sessionId':'s1','seq':3,'kind':'k','time':'t','data':{}}]");
  cr_expect_eq(raw_int(&f, "SELECT lease_epoch FROM sessions WHERE id = 's1'"), 3);
  cr_expect_eq(raw_int(&f, "SELECT epoch FROM events WHERE seq = 1"), 1);
  cr_expect_eq(raw_int(&f, "SELECT epoch FROM events WHERE seq = 2"), 2);
  cr_expect_eq(raw_int(&f, "SELECT epoch FROM events WHERE seq = 3"), 3);
  json_t *ev = ah__store_events(f.s, "s1", 0, 0);
  cr_expect_null(json_object_get(json_array_get(ev, 0), "epoch"), "the epoch is not part of an event");
  json_decref(ev);
  fx_fini(&f);
}

Test(store, two_stores_on_one_file_share_leases_and_rows) {
  SQLITE_ONLY("a simulated clock (PostgreSQL: pg_two_stores_share_leases_and_rows)");
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  ah_store *other = open_ok(&f, NULL); /* what a second process sharing the state dir sees */
  write_ok(&f, f.s, "[" SESSION1 "]");
  wres w;
  cr_assert_eq(
      write_wait(&f, f.s, J("[{'op':'lease','id':'s1','owner':'host-1','until':60000,'now':1000}]"), &w), 0);
  expect_json(w.results, "[true]");
  cr_assert_eq(
      write_wait(&f, other, J("[{'op':'lease','id':'s1','owner':'host-2','until':61000,'now':2000}]"), &w),
      0);
  expect_json(w.results, "[false]");
  json_t *s = ah__store_get_session(other, "s1");
  cr_assert_not_null(s, "the second store reads the first one's rows");
  cr_expect_str_eq(sget(s, "leaseOwner"), "host-1");
  json_decref(s);
  write_ok(&f, other, "[{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{'from':2}}]");
  json_t *ev = ah__store_events(f.s, "s1", 0, 0);
  cr_expect_eq(json_array_size(ev), 1, "and the first reads the second one's");
  json_decref(ev);
  cr_assert_eq(
      write_wait(&f, other, J("[{'op':'lease','id':'s1','owner':'host-2','until':70000,'now':60001}]"), &w),
      0);
  expect_json(w.results, "[true]");
  close_store(&f, other);
  fx_fini(&f);
}

/* ---- the writer: order, grouping, failures --------------------------------------------------------------
 */

Test(store, callbacks_run_in_submission_order) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  enum { N = 300 };
  static wres w[N];
  static wres *ws[N + 1];
  /* Submitted over several loop turns and with a few failing opsets mixed in. */
  for (int i = 0; i < N; i++) {
    char text[200];
    if (i % 50 == 7)
      snprintf(text, sizeof text, "[{'op':'inbox.state','messageId':'none','state':'done'}]");
    else
      snprintf(text, sizeof text, "[{'op':'event','sessionId':'s','seq':%d,'kind':'k','time':'t','data':{}}]",
               i);
    memset(&w[i], 0, sizeof w[i]);
    cr_assert_eq(ah__store_write(f.s, J(text), on_write, &w[i]), 0);
    ws[i] = &w[i];
    if (i % 64 == 63)
      uv_run(&f.loop, UV_RUN_NOWAIT);
  }
  ws[N] = NULL;
  cr_assert(ts_run_until_pred(&f.loop, all_done, ws, 10000));
  for (int i = 0; i < N; i++) {
    cr_expect_eq(w[i].order, i, "opset %d completed as #%d", i, w[i].order);
    cr_expect_eq(w[i].status, i % 50 == 7 ? AH_ENOENT : 0, "opset %d: %s", i, ah_err_name(w[i].status));
    json_decref(w[i].results);
  }
  cr_expect_eq(ah__store_opsets(f.s), N);
  fx_fini(&f);
}

Test(store, group_commit_groups_one_loop_turn) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  enum { N = 1000 };
  static wres w[N];
  static wres *ws[N + 1];
  for (int i = 0; i < N; i++) {
    json_t *op = json_pack("[{s:s, s:s, s:i, s:s, s:s, s:{s:i}}]", "op", "event", "sessionId", "s", "seq",
                           i + 1, "kind", "k", "time", "t", "data", "i", i);
    memset(&w[i], 0, sizeof w[i]);
    cr_assert_eq(ah__store_write(f.s, op, on_write, &w[i]), 0);
    ws[i] = &w[i];
  }
  ws[N] = NULL;
  cr_assert(ts_run_until_pred(&f.loop, all_done, ws, 20000));
  for (int i = 0; i < N; i++) {
    cr_expect_eq(w[i].status, 0);
    json_decref(w[i].results);
  }
  uint64_t commits = ah__store_commits(f.s);
  cr_expect_eq(ah__store_opsets(f.s), N);
  cr_expect_geq(commits, 1);
  cr_expect_leq(commits, 10, "1000 opsets of one loop turn took %llu commits", (unsigned long long)commits);
  json_t *ev = ah__store_events(f.s, "s", 0, 0);
  cr_expect_eq(json_array_size(ev), N);
  json_decref(ev);
  fx_fini(&f);
}

/* A backend whose next `flaky_failures` groups fail as a whole with `flaky_status`, as a full disk or an
 * I/O error makes SQLite roll the whole transaction back: nothing of them is written. */
static _Atomic int flaky_failures;
static int flaky_status = AH_EIO;
static _Atomic int flaky_calls;

/* A group failed as a whole: nothing of it written. */
static void fail_whole_group(size_t n, json_t **results, int *statuses, int status) {
  for (size_t i = 0; i < n; i++) {
    results[i] = NULL;
    statuses[i] = status;
  }
}

static void flaky_write_group(void *impl, json_t *const *opsets, size_t n, json_t **results, int *statuses) {
  atomic_fetch_add(&flaky_calls, 1);
  if (atomic_load(&flaky_failures) > 0) {
    atomic_fetch_sub(&flaky_failures, 1);
    fail_whole_group(n, results, statuses, flaky_status);
    return;
  }
  backend()->write_group(impl, opsets, n, results, statuses);
}

/* A group that failed as a whole for a reason that may pass is written again, in order, after a pause
 * (10, 100, 1000 ms); past the third retry its failure is reported; an opset refused for its content (or
 * a fence) is never tried again. Issue 17: a failed event write is retried before the session stops. */
Test(store, a_group_that_failed_as_a_whole_is_tried_again_in_order, .timeout = 30) {
  fx f;
  fx_init(&f);
  ah_store_backend be = *backend();
  be.name = "flaky";
  be.write_group = flaky_write_group;
  f.s = open_ok(&f, &be);
  write_ok(&f, f.s, "[" SESSION1 "]");
  /* Two failures: the third attempt writes it, the callbacks see success in submission order. */
  atomic_store(&flaky_failures, 2);
  atomic_store(&flaky_calls, 0);
  wres w[3];
  for (int i = 0; i < 3; i++) {
    memset(&w[i], 0, sizeof w[i]);
    json_t *op = json_pack("[{s:s, s:s, s:i, s:s, s:s, s:{}}]", "op", "event", "sessionId", "s1", "seq",
                           i + 1, "kind", "k", "time", "t", "data");
    cr_assert_eq(ah__store_write(f.s, op, on_write, &w[i]), 0);
  }
  wres *ws[] = {&w[0], &w[1], &w[2], NULL};
  cr_assert(ts_run_until_pred(&f.loop, all_done, ws, 10000));
  for (int i = 0; i < 3; i++) {
    cr_expect_eq(w[i].status, 0, "opset %d: %s", i, ah_err_name(w[i].status));
    cr_expect_eq(w[i].order, w[0].order + i, "callbacks out of order");
    json_decref(w[i].results);
  }
  cr_expect_eq(atomic_load(&flaky_calls), 3, "two failed attempts and the one that wrote");
  cr_expect_eq(ah__store_retries(f.s), 2);
  json_t *ev = ah__store_events(f.s, "s1", 0, 0);
  cr_expect_eq(json_array_size(ev), 3, "every event written once");
  json_decref(ev);
  /* Four failures: three retries are spent and the failure is reported, nothing written. */
  atomic_store(&flaky_failures, 4);
  atomic_store(&flaky_calls, 0);
  wres lost;
  uint64_t t0 = ts_now_ms();
  cr_expect_eq(write_wait(&f, f.s,
                          J("[{'op':'event','sessionId':'s1','seq':4,'kind':'k','time':'t','data':{}}]"),
                          &lost),
               AH_EIO);
  cr_expect_geq(ts_now_ms() - t0, 1100, "the pauses were not made");
  cr_expect_eq(atomic_load(&flaky_calls), 4);
  atomic_store(&flaky_failures, 0);
  /* An opset refused for its content is not tried again. */
  atomic_store(&flaky_calls, 0);
  wres dup;
  cr_expect_eq(write_wait(&f, f.s,
                          J("[{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]"),
                          &dup),
               AH_EEXIST);
  cr_expect_eq(atomic_load(&flaky_calls), 1);
  ev = ah__store_events(f.s, "s1", 0, 0);
  cr_expect_eq(json_array_size(ev), 3);
  json_decref(ev);
  fx_fini(&f);
}

/* A backend that fails (nothing written, an I/O error) every group holding an event of kind "fail-me". */
static void fail_me_write_group(void *impl, json_t *const *opsets, size_t n, json_t **results,
                                int *statuses) {
  for (size_t i = 0; i < n; i++) {
    size_t k = 0;
    json_t *op = NULL;
    json_array_foreach(opsets[i], k, op) {
      if (json_is_string(json_object_get(op, "kind")) &&
          strcmp(json_string_value(json_object_get(op, "kind")), "fail-me") == 0) {
        fail_whole_group(n, results, statuses, AH_EIO);
        return;
      }
    }
  }
  backend()->write_group(impl, opsets, n, results, statuses);
}

/* A write that fails in a way that stops its session (reported after its retries): that session's writes
 * submitted before the failure reached the loop are not written (a later event would leave a gap in its
 * seqs); another session's are, and so are the session's writes submitted after the failure was known. */
Test(store, a_sessions_writes_behind_its_failed_one_are_not_written, .timeout = 30) {
  fx f;
  fx_init(&f);
  ah_store_backend be = *backend();
  be.name = "fail-me";
  be.write_group = fail_me_write_group;
  f.s = open_ok(&f, &be);
  write_ok(&f, f.s, "[" SESSION1 ",{'op':'session.put','session':{'id':'s2'}}]");
  wres w1, w2, w3, w4;
  memset(&w1, 0, sizeof w1);
  memset(&w2, 0, sizeof w2);
  memset(&w3, 0, sizeof w3);
  cr_assert_eq(ah__store_write(f.s, J("[{'op':'event','sessionId':'s1','seq':1,'kind':'fail-me','data':{}}]"),
                               on_write, &w1),
               0);
  volatile bool never = false;
  ts_run_until(&f.loop, &never, 50); /* the writer took it and is trying again (1.1 s) */
  cr_assert_not(w1.done);
  cr_assert_eq(ah__store_write(f.s, J("[{'op':'event','sessionId':'s1','seq':2,'kind':'k','data':{}}]"),
                               on_write, &w2),
               0);
  cr_assert_eq(ah__store_write(f.s, J("[{'op':'event','sessionId':'s2','seq':1,'kind':'k','data':{}}]"),
                               on_write, &w3),
               0);
  wres *ws[] = {&w1, &w2, &w3, NULL};
  cr_assert(ts_run_until_pred(&f.loop, all_done, ws, 10000));
  cr_expect_eq(w1.status, AH_EIO);
  cr_expect_eq(w2.status, AH_EIO, "a write behind the session's failed one was written");
  cr_expect_eq(w3.status, 0, "another session's write failed: %s", ah_err_name(w3.status));
  json_decref(w3.results);
  cr_expect_eq(write_wait(&f, f.s, J("[{'op':'event','sessionId':'s1','seq':1,'kind':'k','data':{}}]"), &w4),
               0, "the session's write after the failure was known");
  json_decref(w4.results);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events WHERE session_id = 's1'"), 1);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events WHERE session_id = 's2'"), 1);
  fx_fini(&f);
}

Test(store, failing_opset_fails_alone_in_its_group) {
  fx f;
  fx_init(&f);
  ah_store_backend be = gated_backend();
  f.s = open_ok(&f, &be);
  write_ok(&f, f.s, "[" SESSION1 ",{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]");
  /* Park the writer after a first opset, queue the group behind it, then let it go. */
  gate_close();
  wres first, w[5];
  memset(&first, 0, sizeof first);
  cr_assert_eq(ah__store_write(f.s, J("[{'op':'session.put','session':{'id':'s2'}}]"), on_write, &first), 0);
  gate_wait_holding(&f.loop);
  const char *group[5] = {
      "[{'op':'event','sessionId':'s1','seq':2,'kind':'k','time':'t','data':{}}]",
      /* its first op is valid, its second repeats seq 1: the whole opset rolls back */
      "[{'op':'event','sessionId':'s1','seq':3,'kind':'k','time':'t','data':{}},"
      "{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]",
      "[{'op':'inbox.state','messageId':'unknown','state':'done'}]",
      "[{'op':'no.such.op'}]",
      "[{'op':'event','sessionId':'s1','seq':4,'kind':'k','time':'t','data':{}},"
      "{'op':'session.update','id':'s1','set':{'status':'running'}}]",
  };
  for (int i = 0; i < 5; i++) {
    memset(&w[i], 0, sizeof w[i]);
    cr_assert_eq(ah__store_write(f.s, J(group[i]), on_write, &w[i]), 0);
  }
  gate_open();
  wres *ws[] = {&first, &w[0], &w[1], &w[2], &w[3], &w[4], NULL};
  cr_assert(ts_run_until_pred(&f.loop, all_done, ws, 10000));
  cr_assert_eq(gate_groups(), 3);
  cr_expect_eq(gate.sizes[2], 5, "the five opsets were one group (sizes %zu, %zu, %zu)", gate.sizes[0],
               gate.sizes[1], gate.sizes[2]);
  cr_expect_eq(first.status, 0);
  cr_expect_eq(w[0].status, 0);
  cr_expect_eq(w[1].status, AH_EEXIST, "a duplicate seq: %s", ah_err_name(w[1].status));
  cr_expect_eq(w[2].status, AH_ENOENT, "an unknown message: %s", ah_err_name(w[2].status));
  cr_expect_eq(w[3].status, AH_EINVAL, "an unknown operation: %s", ah_err_name(w[3].status));
  cr_expect_eq(w[4].status, 0);
  cr_expect_eq(json_array_size(w[4].results), 2);
  cr_expect(json_is_integer(json_array_get(w[4].results, 0)));
  cr_expect(json_is_null(json_array_get(w[4].results, 1)));
  for (int i = 0; i < 5; i++)
    json_decref(w[i].results);
  json_decref(first.results);
  json_t *ev = ah__store_events(f.s, "s1", 0, 0);
  cr_assert_eq(json_array_size(ev), 3, "seq 3 of the failed opset was rolled back");
  cr_expect_eq(iget(json_array_get(ev, 0), "seq"), 1);
  cr_expect_eq(iget(json_array_get(ev, 1), "seq"), 2);
  cr_expect_eq(iget(json_array_get(ev, 2), "seq"), 4);
  json_decref(ev);
  json_t *s = ah__store_get_session(f.s, "s1");
  cr_expect_eq(iget(s, "lastSeq"), 4);
  cr_expect_str_eq(sget(s, "status"), "running");
  json_decref(s);
  cr_expect_eq(ah__store_commits(f.s), 3);
  cr_expect_eq(ah__store_opsets(f.s), 7);
  fx_fini(&f);
}

static void resubmit_cb(int status, const json_t *results, void *arg) {
  fx *f = arg;
  (void)results;
  cr_assert_eq(status, 0);
  static int round;
  if (++round < 5) {
    char text[128];
    snprintf(text, sizeof text, "[{'op':'event','sessionId':'s','seq':%d,'kind':'k','time':'t','data':{}}]",
             round + 1);
    cr_assert_eq(ah__store_write(f->s, J(text), resubmit_cb, f), 0, "a callback may write");
  } else {
    bool *closed = f->loop.data;
    ah__store_close(f->s, on_closed, closed); /* a callback may close */
    f->s = NULL;
  }
}

Test(store, callbacks_may_write_and_close) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  bool closed = false;
  f.loop.data = &closed;
  cr_assert_eq(ah__store_write(f.s,
                               J("[{'op':'event','sessionId':'s','seq':1,'kind':'k','time':'t','data':{}}]"),
                               resubmit_cb, &f),
               0);
  cr_assert(ts_run_until(&f.loop, &closed, 10000));
  cr_assert_null(f.s);
  f.s = open_ok(&f, NULL);
  json_t *ev = ah__store_events(f.s, "s", 0, 0);
  cr_expect_eq(json_array_size(ev), 5);
  json_decref(ev);
  fx_fini(&f);
}

Test(store, close_drains_queued_writes_then_refuses) {
  fx f;
  fx_init(&f);
  ah_store_backend be = gated_backend();
  ah_store *s = open_ok(&f, &be);
  gate_close();
  enum { N = 50 };
  wres w[N];
  for (int i = 0; i < N; i++) {
    char text[128];
    snprintf(text, sizeof text, "[{'op':'event','sessionId':'s','seq':%d,'kind':'k','time':'t','data':{}}]",
             i);
    memset(&w[i], 0, sizeof w[i]);
    cr_assert_eq(ah__store_write(s, J(text), on_write, &w[i]), 0);
  }
  gate_wait_holding(&f.loop);
  bool closed = false;
  ah__store_close(s, on_closed_count, &closed);
  cr_expect_eq(ah__store_write(s, J("[]"), on_write, &w[0]), AH_ECLOSED, "a write after close is refused");
  cr_expect_not(closed, "close never calls back synchronously");
  gate_open();
  cr_assert(ts_run_until(&f.loop, &closed, 10000));
  cr_expect_eq(completions_at_close, N, "every write callback ran before the close callback");
  for (int i = 0; i < N; i++) {
    cr_expect(w[i].done, "queued write %d lost its callback", i);
    cr_expect_eq(w[i].status, 0);
    json_decref(w[i].results);
  }
  f.s = open_ok(&f, NULL);
  json_t *ev = ah__store_events(f.s, "s", -1, 0);
  cr_expect_eq(json_array_size(ev), N, "the queued writes were committed");
  json_decref(ev);
  fx_fini(&f);
}

/* ---- reads on the reader thread (ah__store_read) ------------------------------------------------------ */

typedef struct rres {
  int status;
  json_t *results;
  bool done;
  int order;
} rres;

static void on_read(int status, const json_t *results, void *arg) {
  rres *r = arg;
  cr_assert_not(r->done, "a read callback ran twice");
  r->status = status;
  r->results = json_incref((json_t *)results);
  r->done = true;
  r->order = completions++;
  if (status == 0)
    cr_assert(json_is_array(results), "a successful read without a results array");
  else
    cr_assert_null(results);
}

/* Every kind of query in one read, beside a second read: the callbacks run on the loop, never during the
 * call, in submission order, with one result per query (null: not found). */
Test(store, reads_run_on_the_reader_and_call_back_in_order) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  write_ok(&f, f.s,
           "[{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}},"
           "{'op':'event','sessionId':'s1','seq':2,'kind':'k','time':'t','data':{}},"
           "{'op':'event','sessionId':'s1','seq':3,'kind':'k','time':'t','data':{'x':1}}]");
  uint64_t reads = ah__store_reads(f.s);
  ah_store_query q[] = {
      {.kind = AH_STORE_Q_SESSION, .id = "s1"},
      {.kind = AH_STORE_Q_SESSION, .id = "nope"},
      {.kind = AH_STORE_Q_EVENTS, .id = "s1", .after = 1, .limit = 1},
      {.kind = AH_STORE_Q_SESSIONS, .limit = 10},
      {.kind = AH_STORE_Q_REQUEST, .id = "nope"},
      {.kind = AH_STORE_Q_LAST_CURSOR},
      {.kind = AH_STORE_Q_TO_RECOVER},
      {.kind = AH_STORE_Q_TREE, .id = "s1"},
      {.kind = AH_STORE_Q_INBOX_OPEN, .id = "s1"},
      {.kind = AH_STORE_Q_REQUESTS_PENDING},
      {.kind = AH_STORE_Q_EVENTS_AFTER, .after = 0, .limit = 10},
      {.kind = AH_STORE_Q_POSTED},
  };
  size_t n = sizeof q / sizeof q[0];
  rres a = {0}, b = {0};
  char id[] = "s1";
  cr_assert_eq(ah__store_read(f.s, q, n, on_read, &a), 0);
  cr_assert_eq(ah__store_read(f.s, &(ah_store_query){.kind = AH_STORE_Q_SESSION, .id = id}, 1, on_read, &b),
               0);
  id[0] = 'x'; /* the ids were copied */
  cr_expect_not(a.done || b.done, "a read never calls back during the call");
  cr_assert(ts_run_until(&f.loop, &b.done, 10000));
  cr_assert(a.done);
  cr_expect_lt(a.order, b.order, "read callbacks run in submission order");
  cr_assert_eq(a.status, 0);
  cr_assert_eq(json_array_size(a.results), n);
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(a.results, 0), "id")), "s1");
  cr_expect(json_is_null(json_array_get(a.results, 1)), "a missing row is null");
  json_t *evs = json_array_get(a.results, 2);
  cr_expect_eq(json_array_size(evs), 1);
  cr_expect_eq(json_integer_value(json_object_get(json_array_get(evs, 0), "seq")), 2);
  cr_expect_eq(json_array_size(json_array_get(a.results, 3)), 1);
  cr_expect(json_is_null(json_array_get(a.results, 4)));
  json_t *all = json_array_get(a.results, 10);
  cr_expect_eq(json_array_size(all), 3);
  cr_expect_eq(json_integer_value(json_array_get(a.results, 5)),
               json_integer_value(json_object_get(json_array_get(all, 2), "cursor")), "the last cursor");
  cr_expect(json_is_array(json_array_get(a.results, 6)));
  cr_expect_eq(json_array_size(json_array_get(a.results, 7)), 1, "the tree of a session without children");
  cr_expect_eq(json_array_size(json_array_get(a.results, 8)), 0);
  cr_expect_eq(json_array_size(json_array_get(a.results, 9)), 0);
  cr_expect(tpg_enabled() ? json_is_array(json_array_get(a.results, 11))
                          : json_is_null(json_array_get(a.results, 11)),
            "posted rows exist with signals only");
  cr_expect_eq(b.status, 0);
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(b.results, 0), "id")), "s1");
  cr_expect_eq(ah__store_reads(f.s), reads + n + 1, "every query counts as a read");
  json_decref(a.results);
  json_decref(b.results);
  /* Argument errors are returned, never called back. */
  rres c = {0};
  cr_expect_eq(ah__store_read(NULL, q, 1, on_read, &c), AH_EINVAL);
  cr_expect_eq(ah__store_read(f.s, NULL, 1, on_read, &c), AH_EINVAL);
  uv_run(&f.loop, UV_RUN_NOWAIT);
  cr_expect_not(c.done);
  fx_fini(&f);
}

/* A backend whose reads of a session take 400 ms (a remote database, a slow disk), and whose reads of
 * events fail. */
static atomic_int slow_reads;

static json_t *slow_get_session(void *impl, const char *id) {
  atomic_fetch_add(&slow_reads, 1);
  usleep(400 * 1000);
  return backend()->get_session(impl, id);
}

static json_t *failing_events(void *impl, const char *id, int64_t after, size_t limit) {
  (void)impl, (void)id, (void)after, (void)limit;
  return NULL;
}

static ah_store_backend slow_backend(void) {
  ah_store_backend b = *backend();
  b.name = "slow";
  b.get_session = slow_get_session;
  b.events = failing_events;
  return b;
}

static void count_tick(uv_timer_t *t) {
  (*(int *)t->data)++;
}

/* A slow read leaves the loop running: timers fire while it is read; writes commit beside it. */
Test(store, a_slow_read_does_not_stop_the_loop, .timeout = 30) {
  fx f;
  fx_init(&f);
  ah_store_backend be = slow_backend();
  f.s = open_ok(&f, &be);
  write_ok(&f, f.s, "[" SESSION1 "]");
  int ticks = 0;
  uv_timer_t t;
  uv_timer_init(&f.loop, &t);
  t.data = &ticks;
  uv_timer_start(&t, count_tick, 20, 20);
  rres r = {0};
  uint64_t t0 = uv_hrtime();
  cr_assert_eq(ah__store_read(f.s, &(ah_store_query){.kind = AH_STORE_Q_SESSION, .id = "s1"}, 1, on_read, &r),
               0);
  wres w = {0};
  cr_assert_eq(ah__store_write(f.s,
                               J("[{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]"),
                               on_write, &w),
               0);
  cr_assert(ts_run_until(&f.loop, &r.done, 10000));
  double ms = (double)(uv_hrtime() - t0) / 1e6;
  cr_expect_geq(ms, 380, "the read took its time (%.0f ms)", ms);
  cr_expect_geq(ticks, 5, "the loop ran timers while the read took %.0f ms (%d ticks)", ms, ticks);
  cr_expect(w.done && w.status == 0, "a write committed while the read was running");
  cr_expect_eq(r.status, 0);
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(r.results, 0), "id")), "s1");
  json_decref(r.results);
  json_decref(w.results);
  uv_close((uv_handle_t *)&t, NULL);
  fx_fini(&f);
}

/* A read with a failing query reports AH_EIO and no results, and the reads submitted before its failure
 * was known fail at once (they do not wait for the database each in turn); later ones are read. The close
 * waits for the reads in flight (their callbacks run before its own) and refuses new ones. */
Test(store, a_failed_read_fails_those_behind_it_and_close_waits_for_reads, .timeout = 30) {
  fx f;
  fx_init(&f);
  ah_store_backend be = slow_backend();
  ah_store *s = open_ok(&f, &be);
  write_ok(&f, s, "[" SESSION1 "]");
  rres bad = {0}, behind = {0}, after = {0}, late = {0};
  ah_store_query q[] = {{.kind = AH_STORE_Q_SESSION, .id = "s1"}, {.kind = AH_STORE_Q_EVENTS, .id = "s1"}};
  atomic_store(&slow_reads, 0);
  cr_assert_eq(ah__store_read(s, q, 2, on_read, &bad), 0);
  cr_assert_eq(ah__store_read(s, q, 1, on_read, &behind), 0);
  cr_assert(ts_run_until(&f.loop, &behind.done, 10000));
  cr_expect_eq(bad.status, AH_EIO, "a failed query fails the read: %s", ah_err_name(bad.status));
  cr_expect_null(bad.results);
  cr_expect_eq(behind.status, AH_EIO, "a read queued behind a failed one: %s", ah_err_name(behind.status));
  cr_expect_eq(atomic_load(&slow_reads), 1, "the read behind the failed one went to the database");
  completions = 0;
  cr_assert_eq(ah__store_read(s, q, 1, on_read, &after), 0);
  bool closed = false;
  ah__store_close(s, on_closed_count, &closed);
  cr_expect_eq(ah__store_read(s, q, 1, on_read, &late), AH_ECLOSED, "a read after close is refused");
  cr_assert(ts_run_until(&f.loop, &closed, 10000));
  cr_expect(after.done, "the read in flight was called back");
  cr_expect_eq(completions_at_close, 1, "before the close callback");
  cr_expect_eq(after.status, 0, "a read after the failure was known: %s", ah_err_name(after.status));
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(after.results, 0), "id")), "s1");
  cr_expect_not(late.done);
  json_decref(after.results);
  fx_fini(&f);
}

Test(store, write_argument_errors_never_call_back) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  wres w;
  memset(&w, 0, sizeof w);
  cr_expect_eq(ah__store_write(f.s, J("{'op':'event'}"), on_write, &w), AH_EINVAL, "an opset is an array");
  cr_expect_eq(ah__store_write(f.s, NULL, on_write, &w), AH_EINVAL);
  cr_expect_eq(ah__store_write(NULL, J("[]"), on_write, &w), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[]"), 0, "an empty opset commits nothing, successfully");
  cr_expect_eq(write_status(&f, f.s, "[1]"), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'event'}]"), AH_EINVAL);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'nope'}]"), AH_EINVAL);
  /* A NULL callback is allowed; the write still happens. */
  cr_assert_eq(ah__store_write(f.s,
                               J("[{'op':'event','sessionId':'s','seq':1,'kind':'k','time':'t','data':{}}]"),
                               NULL, NULL),
               0);
  cr_assert_eq(write_status(&f, f.s, "[]"), 0);
  json_t *ev = ah__store_events(f.s, "s", 0, 0);
  cr_expect_eq(json_array_size(ev), 1);
  json_decref(ev);
  cr_expect_not(w.done);
  fx_fini(&f);
}

/* Holds the write lock from another connection, as another agenthost process would. */
typedef struct locker {
  sqlite3 *db;
  uv_timer_t timer;
  int ticks;
} locker;

static void tick(uv_timer_t *t) {
  locker *l = t->data;
  l->ticks++;
}

static void lock_db(locker *l, const char *path) {
  cr_assert_eq(sqlite3_open(path, &l->db), SQLITE_OK);
  cr_assert_eq(
      sqlite3_exec(l->db, "BEGIN IMMEDIATE; INSERT INTO sessions (id) VALUES ('other')", NULL, NULL, NULL),
      SQLITE_OK);
}

Test(store, write_lock_held_elsewhere_waits_then_fails_whole_group, .timeout = 60) {
  SQLITE_ONLY("SQLite's write lock (PostgreSQL: pg_a_lock_held_elsewhere_fails_the_group_as_busy)");
  fx f;
  fx_init(&f);
  ah_store_backend be = gated_backend();
  f.s = open_ok(&f, &be);
  locker l = {0};
  cr_assert_eq(uv_timer_init(&f.loop, &l.timer), 0);
  l.timer.data = &l;
  cr_assert_eq(uv_timer_start(&l.timer, tick, 10, 10), 0);

  /* Released after 300 ms: the write waits (busy timeout), the loop keeps running, then it commits. */
  lock_db(&l, f.path);
  wres w;
  memset(&w, 0, sizeof w);
  uint64_t t0 = ts_now_ms();
  cr_assert_eq(ah__store_write(f.s,
                               J("[{'op':'event','sessionId':'s','seq':1,'kind':'k','time':'t','data':{}}]"),
                               on_write, &w),
               0);
  cr_expect_lt(ts_now_ms() - t0, 100, "ah__store_write blocked the loop");
  volatile bool never = false;
  ts_run_until(&f.loop, &never, 300);
  cr_expect_not(w.done, "committed while another connection held the write lock");
  cr_expect_gt(l.ticks, 10, "the loop was blocked while the writer waited (%d ticks)", l.ticks);
  cr_assert_eq(sqlite3_exec(l.db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  cr_assert(ts_run_until(&f.loop, &w.done, 10000));
  cr_expect_eq(w.status, 0);
  json_decref(w.results);

  /* Held past the busy timeout (5 s): every opset of the group fails with AH_EBUSY (not tried again: the
   * timeout was waited for), nothing is written. The
   * writer is parked after a first commit so that the two opsets are queued as one group. */
  gate_close();
  wres x, a, b;
  memset(&x, 0, sizeof x);
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  cr_assert_eq(ah__store_write(f.s, J("[]"), on_write, &x), 0);
  gate_wait_holding(&f.loop);
  cr_assert_eq(sqlite3_exec(l.db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
  cr_assert_eq(ah__store_write(f.s,
                               J("[{'op':'event','sessionId':'s','seq':2,'kind':'k','time':'t','data':{}}]"),
                               on_write, &a),
               0);
  cr_assert_eq(ah__store_write(f.s,
                               J("[{'op':'event','sessionId':'s','seq':3,'kind':'k','time':'t','data':{}}]"),
                               on_write, &b),
               0);
  gate_open();
  wres *ws[] = {&x, &a, &b, NULL};
  cr_assert(ts_run_until_pred(&f.loop, all_done, ws, 20000));
  cr_expect_eq(x.status, 0);
  json_decref(x.results);
  cr_expect_eq(gate.sizes[gate_groups() - 1], 2, "the two opsets were one group");
  cr_expect_eq(a.status, AH_EBUSY, "%s", ah_err_name(a.status));
  cr_expect_eq(b.status, AH_EBUSY, "%s", ah_err_name(b.status));
  cr_assert_eq(sqlite3_exec(l.db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  cr_assert_eq(sqlite3_close(l.db), SQLITE_OK);
  json_t *ev = ah__store_events(f.s, "s", 0, 0);
  cr_expect_eq(json_array_size(ev), 1);
  json_decref(ev);
  /* And the store works again once the lock is gone. */
  write_ok(&f, f.s, "[{'op':'event','sessionId':'s','seq':2,'kind':'k','time':'t','data':{}}]");
  uv_close((uv_handle_t *)&l.timer, NULL);
  fx_fini(&f);
}

/* ---- durability, refusals, read-only ------------------------------------------------------------------- */

Test(store, reopen_keeps_everything) {
  fx f;
  fx_init(&f);
  ah_store *s = open_ok(&f, NULL);
  write_ok(&f, s,
           "[" SESSION1
           ",{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','turnId':'t1','data':{'x':1}},"
           "{'op':'inbox.put','messageId':'m1','sessionId':'s1','content':['hi'],'time':'t'},"
           "{'op':'request.put','request':{'id':'r1','sessionId':'s1','kind':'approval','created':'t'}},"
           "{'op':'lease','id':'s1','owner':'A','until':99,'now':0}]");
  json_t *sess = ah__store_get_session(s, "s1");
  json_t *ev = ah__store_events_after(s, 0, 0);
  json_t *inbox = ah__store_inbox_open(s, "s1");
  json_t *req = ah__store_requests_pending(s, NULL);
  close_store(&f, s);
  if (!f.url) {
    char *wal = NULL;
    cr_assert(asprintf(&wal, "%s-wal", f.path) > 0);
    cr_expect_not(exists(wal), "a clean close checkpoints the WAL into the database and removes it");
    free(wal);
  }
  f.s = open_ok(&f, NULL);
  json_t *sess2 = ah__store_get_session(f.s, "s1");
  json_t *ev2 = ah__store_events_after(f.s, 0, 0);
  json_t *inbox2 = ah__store_inbox_open(f.s, "s1");
  json_t *req2 = ah__store_requests_pending(f.s, NULL);
  cr_expect(json_equal(sess, sess2));
  cr_expect(json_equal(ev, ev2));
  cr_expect_eq(json_array_size(ev2), 1);
  cr_expect(json_equal(inbox, inbox2));
  cr_expect_eq(json_array_size(inbox2), 1);
  cr_expect(json_equal(req, req2));
  cr_expect_eq(json_array_size(req2), 1);
  cr_expect_str_eq(sget(sess2, "leaseOwner"), "A");
  json_decref(sess);
  json_decref(ev);
  json_decref(inbox);
  json_decref(req);
  json_decref(sess2);
  json_decref(ev2);
  json_decref(inbox2);
  json_decref(req2);
  /* Cursors continue after the reopen. */
  wres w;
  cr_assert_eq(
      write_wait(&f, f.s, J("[{'op':'event','sessionId':'s1','seq':2,'kind':'k','time':'t','data':{}}]"), &w),
      0);
  cr_expect_eq(json_integer_value(json_array_get(w.results, 0)), 2);
  json_decref(w.results);
  fx_fini(&f);
}

/* Open must fail, leave the file as it was and explain why. */
static void expect_refused(fx *f, int want_rc, const char *const *needles) {
  size_t before_len = 0;
  char *before = ts_read_file(f->path, &before_len);
  cr_assert_not_null(before);
  ah_store *s = NULL;
  char *why = NULL;
  int rc = store_open(f, NULL, AH_STORE_SYNC_NORMAL, false, &s, &why);
  cr_expect_eq(rc, want_rc, "open returned %s", ah_err_name(rc));
  cr_expect_null(s);
  cr_assert_not_null(why);
  for (; *needles; needles++)
    cr_expect(strstr(why, *needles) != NULL, "'%s' not in: %s", *needles, why);
  free(why);
  /* A read-only open refuses it as well. */
  rc = store_open(f, NULL, AH_STORE_SYNC_NORMAL, true, &s, &why);
  cr_expect_eq(rc, want_rc, "read-only open returned %s", ah_err_name(rc));
  cr_expect_null(s);
  free(why);
  size_t after_len = 0;
  char *after = ts_read_file(f->path, &after_len);
  cr_assert_not_null(after);
  cr_expect_eq(after_len, before_len, "the file changed size");
  cr_expect(after_len == before_len && memcmp(before, after, before_len) == 0, "the file was modified");
  free(before);
  free(after);
}

Test(store, newer_schema_is_refused_and_left_unchanged) {
  SQLITE_ONLY("a database file (PostgreSQL: pg_a_newer_or_foreign_database_is_refused)");
  fx f;
  fx_init(&f);
  ah_store *s = open_ok(&f, NULL);
  write_ok(&f, s, "[" SESSION1 "]");
  close_store(&f, s);
  raw_exec(&f, "PRAGMA user_version = 99");
  const char *needles[] = {"version 99", "version 6 ", f.path, NULL};
  expect_refused(&f, AH_ECONFIG, needles);
  cr_expect_eq(raw_int(&f, "PRAGMA user_version"), 99);
  fx_fini(&f);
}

Test(store, random_bytes_are_refused_and_left_unchanged) {
  SQLITE_ONLY("a database file (PostgreSQL: pg_a_newer_or_foreign_database_is_refused)");
  fx f;
  fx_init(&f);
  unsigned char buf[16384];
  unsigned x = 12345;
  for (size_t i = 0; i < sizeof buf; i++) {
    x = x * 1103515245u + 12345u;
    buf[i] = (unsigned char)(x >> 16);
  }
  FILE *fp = fopen(f.path, "wb");
  cr_assert_not_null(fp);
  cr_assert_eq(fwrite(buf, 1, sizeof buf, fp), sizeof buf);
  fclose(fp);
  const char *needles[] = {"not an SQLite database", NULL};
  expect_refused(&f, AH_ECONFIG, needles);
  fx_fini(&f);
}

Test(store, text_file_is_refused_and_left_unchanged) {
  SQLITE_ONLY("a database file (PostgreSQL: pg_a_newer_or_foreign_database_is_refused)");
  fx f;
  fx_init(&f);
  char *p = ts_write_file(f.dir, "agenthost.db", "[store]\npath = not a database\nthis is a text file\n");
  cr_assert_not_null(p);
  free(p);
  const char *needles[] = {"not an SQLite database", NULL};
  expect_refused(&f, AH_ECONFIG, needles);
  fx_fini(&f);
}

Test(store, truncated_database_is_refused_and_left_unchanged) {
  SQLITE_ONLY("a database file (PostgreSQL: pg_a_newer_or_foreign_database_is_refused)");
  fx f;
  fx_init(&f);
  ah_store *s = open_ok(&f, NULL);
  /* Enough rows for many pages, so that truncation cuts referenced ones. */
  json_t *opset = json_array();
  char big[2000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  for (int i = 0; i < 400; i++)
    json_array_append_new(opset, json_pack("{s:s, s:s, s:i, s:s, s:s, s:{s:s}}", "op", "event", "sessionId",
                                           "s", "seq", i, "kind", "k", "time", "t", "data", "big", big));
  wres w;
  cr_assert_eq(write_wait(&f, s, opset, &w), 0);
  json_decref(w.results);
  close_store(&f, s);
  struct stat st;
  cr_assert_eq(stat(f.path, &st), 0);
  cr_assert_gt(st.st_size, 100000);
  cr_assert_eq(truncate(f.path, st.st_size / 2), 0);
  const char *needles[] = {"corrupt", NULL};
  expect_refused(&f, AH_EIO, needles);
  fx_fini(&f);
}

Test(store, corrupt_page_is_refused_and_left_unchanged) {
  SQLITE_ONLY("a database file (PostgreSQL: pg_a_newer_or_foreign_database_is_refused)");
  fx f;
  fx_init(&f);
  ah_store *s = open_ok(&f, NULL);
  json_t *opset = json_array();
  char pad[300];
  memset(pad, 'p', sizeof pad - 1);
  pad[sizeof pad - 1] = 0;
  for (int i = 0; i < 300; i++)
    json_array_append_new(opset,
                          json_pack("{s:s, s:s, s:i, s:s, s:s, s:{s:i, s:s}}", "op", "event", "sessionId",
                                    "s", "seq", i, "kind", "k", "time", "t", "data", "i", i, "pad", pad));
  wres w;
  cr_assert_eq(write_wait(&f, s, opset, &w), 0);
  json_decref(w.results);
  close_store(&f, s);
  /* Scribble over a whole page in the middle of the file (a b-tree page of the events), keeping the size. */
  struct stat st;
  cr_assert_eq(stat(f.path, &st), 0);
  long pages = (long)st.st_size / 4096;
  cr_assert_gt(pages, 4);
  FILE *fp = fopen(f.path, "r+b");
  cr_assert_not_null(fp);
  cr_assert_eq(fseek(fp, 4096 * (pages / 2), SEEK_SET), 0);
  char junk[4096];
  memset(junk, 0xA5, sizeof junk);
  cr_assert_eq(fwrite(junk, 1, sizeof junk, fp), sizeof junk);
  fclose(fp);
  const char *needles[] = {"corrupt", NULL};
  expect_refused(&f, AH_EIO, needles);
  fx_fini(&f);
}

Test(store, read_only_open_of_a_missing_file_fails_and_creates_nothing) {
  SQLITE_ONLY("a database file (PostgreSQL: pg_a_read_only_open_of_an_empty_database_creates_nothing)");
  fx f;
  fx_init(&f);
  ah_store *s = NULL;
  char *why = NULL;
  int rc = store_open(&f, NULL, AH_STORE_SYNC_NORMAL, true, &s, &why);
  cr_expect_eq(rc, AH_ENOENT, "%s", ah_err_name(rc));
  cr_expect_null(s);
  cr_assert_not_null(why);
  cr_expect(strstr(why, f.path) != NULL, "why: %s", why);
  free(why);
  cr_expect_not(exists(f.path), "a read-only open created the database");
  fx_fini(&f);
}

Test(store, read_only_open_reads_but_never_writes) {
  fx f;
  fx_init(&f);
  ah_store *s = open_ok(&f, NULL);
  write_ok(&f, s, "[" SESSION1 ",{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]");
  close_store(&f, s);
  ah_store *ro = NULL;
  char *why = NULL;
  int rc = store_open(&f, NULL, AH_STORE_SYNC_NORMAL, true, &ro, &why);
  cr_assert_eq(rc, 0, "%s: %s", ah_err_name(rc), why ? why : "-");
  json_t *sess = ah__store_get_session(ro, "s1");
  cr_expect_str_eq(sget(sess, "title"), "T");
  json_decref(sess);
  json_t *ev = ah__store_events(ro, "s1", 0, 0);
  cr_expect_eq(json_array_size(ev), 1);
  json_decref(ev);
  wres w;
  memset(&w, 0, sizeof w);
  cr_expect_eq(ah__store_write(ro, J("[{'op':'session.delete','id':'s1'}]"), on_write, &w), AH_EPERM);
  uv_run(&f.loop, UV_RUN_NOWAIT);
  cr_expect_not(w.done);
  /* A read-only reader sees what a writer commits meanwhile. */
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[{'op':'event','sessionId':'s1','seq':2,'kind':'k','time':'t','data':{}}]");
  ev = ah__store_events(ro, "s1", 0, 0);
  cr_expect_eq(json_array_size(ev), 2);
  json_decref(ev);
  close_store(&f, ro);
  sess = ah__store_get_session(f.s, "s1");
  cr_expect_not_null(sess, "the read-only store deleted nothing");
  json_decref(sess);
  fx_fini(&f);
}

Test(store, read_only_open_of_an_unmigrated_file_is_refused) {
  SQLITE_ONLY("a database file (PostgreSQL: pg_a_read_only_open_of_an_empty_database_creates_nothing)");
  fx f;
  fx_init(&f);
  raw_exec(&f, "CREATE TABLE t (x)");
  ah_store *s = NULL;
  char *why = NULL;
  int rc = store_open(&f, NULL, AH_STORE_SYNC_NORMAL, true, &s, &why);
  cr_expect_eq(rc, AH_ECONFIG, "%s", ah_err_name(rc));
  cr_assert_not_null(why);
  cr_expect(strstr(why, "version 0") != NULL, "why: %s", why);
  free(why);
  fx_fini(&f);
}

Test(store, write_after_close_is_refused) {
  fx f;
  fx_init(&f);
  ah_store *s = open_ok(&f, NULL);
  bool closed = false;
  ah__store_close(s, on_closed, &closed);
  wres w;
  memset(&w, 0, sizeof w);
  cr_expect_eq(ah__store_write(s, J("[{'op':'session.put','session':{'id':'x'}}]"), on_write, &w),
               AH_ECLOSED);
  cr_assert(ts_run_until(&f.loop, &closed, 5000));
  cr_expect_not(w.done);
  fx_fini(&f);
}

Test(store, sync_settings_open) {
  fx f;
  fx_init(&f);
  const ah_store_sync modes[] = {AH_STORE_SYNC_OFF, AH_STORE_SYNC_NORMAL, AH_STORE_SYNC_FULL,
                                 AH_STORE_SYNC_INVALID};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    ah_store *s = NULL;
    char *why = NULL;
    cr_assert_eq(store_open(&f, NULL, modes[i], false, &s, &why), 0, "mode %d: %s", (int)modes[i], why);
    char text[128];
    snprintf(text, sizeof text, "[{'op':'event','sessionId':'s','seq':%zu,'kind':'k','time':'t','data':{}}]",
             i);
    write_ok(&f, s, text);
    close_store(&f, s);
  }
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events"), 4);
  fx_fini(&f);
}

/* ---- JSON ---------------------------------------------------------------------------------------------- */

Test(store, json_unicode_and_big_data_round_trip) {
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  size_t big_len = 3u << 20;
  char *big = malloc(big_len + 1);
  cr_assert_not_null(big);
  for (size_t i = 0; i < big_len; i++)
    big[i] = (char)('a' + i % 26);
  big[big_len] = 0;
  json_t *data = json_object();
  json_object_set_new(data, "text",
                      json_string("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x8e\x89 \"q\" \\ \n\t"));
  json_object_set_new(data, "nul", json_stringn("a\0b", 3));
  json_object_set_new(data, "big", json_string(big));
  json_object_set_new(
      data, "nested",
      json_pack("{s:[i,f,b,n,{s:s}]}", "k", -9007199254740991LL, 0.5, 1, "z", "\xe2\x82\xac"));
  json_object_set_new(data, "num", json_integer(INT64_MAX));
  free(big);
  json_t *content =
      json_pack("[{s:s,s:s}]", "type", "text", "text", "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82");
  json_t *opset = json_pack("[{s:s,s:s,s:i,s:s,s:s,s:O},{s:s,s:s,s:s,s:O,s:s},"
                            "{s:s,s:{s:s,s:s,s:o,s:[s]}}]",
                            "op", "event", "sessionId", "s\xc3\xa9", "seq", 1, "kind", "message", "time", "t",
                            "data", data, "op", "inbox.put", "messageId", "m\xf0\x9f\x8e\x89", "sessionId",
                            "s\xc3\xa9", "content", content, "time", "t", "op", "session.put", "session",
                            "id", "s\xc3\xa9", "title", "\xe6\xa0\x87\xe9\xa2\x98", "policy",
                            json_pack("{s:s}", "run_command", "allow"), "tags", "\xf0\x9f\x8f\xb7");
  cr_assert_not_null(opset);
  wres w;
  cr_assert_eq(write_wait(&f, f.s, opset, &w), 0);
  json_decref(w.results);
  json_t *ev = ah__store_events(f.s, "s\xc3\xa9", 0, 0);
  cr_assert_eq(json_array_size(ev), 1);
  json_t *got = json_object_get(json_array_get(ev, 0), "data");
  cr_expect(json_equal(got, data), "event data did not round-trip");
  cr_expect_eq(json_string_length(json_object_get(got, "nul")), 3);
  cr_expect_eq(json_integer_value(json_object_get(got, "num")), INT64_MAX);
  json_decref(ev);
  json_t *inbox = ah__store_inbox_open(f.s, "s\xc3\xa9");
  cr_assert_eq(json_array_size(inbox), 1);
  cr_expect(json_equal(json_object_get(json_array_get(inbox, 0), "content"), content));
  cr_expect_str_eq(sget(json_array_get(inbox, 0), "messageId"), "m\xf0\x9f\x8e\x89");
  json_decref(inbox);
  json_t *s = ah__store_get_session(f.s, "s\xc3\xa9");
  cr_expect_str_eq(sget(s, "title"), "\xe6\xa0\x87\xe9\xa2\x98");
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(s, "tags"), 0)), "\xf0\x9f\x8f\xb7");
  json_decref(s);
  json_decref(data);
  json_decref(content);
  fx_fini(&f);
}

/* Reliability finding 12: a JSON value of 1 MiB or more is written in pieces (never whole in memory three
 * times), in the same transaction as the rest of its opset, and reads back equal. */
Test(store, large_values_are_written_in_pieces_and_read_back_whole) {
  SQLITE_ONLY("SQLite's incremental blob I/O and WAL");
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  /* 3 MiB with characters JSON escapes (quote, backslash, newline, a control) and multi-byte UTF-8. */
  size_t n = 3u << 20;
  char *text = malloc(n + 1);
  static const char piece[] = "ab\"c\\d\n\x01\xc3\xa9\xe2\x82\xac z";
  for (size_t i = 0; i < n; i++)
    text[i] = piece[i % (sizeof piece - 1)];
  text[n - (n % (sizeof piece - 1))] = '\0'; /* end on a whole piece: valid UTF-8 */
  json_t *content = json_pack("[{s:s, s:s}]", "type", "text", "text", text);
  cr_assert_not_null(content);
  json_t *ops = json_pack("[{s:s, s:s, s:s, s:O}, {s:s, s:s, s:i, s:s, s:{s:O}}]", "op", "inbox.put",
                          "messageId", "m1", "sessionId", "s1", "content", content, "op", "event",
                          "sessionId", "s1", "seq", 1, "kind", "inbox/received", "data", "content", content);
  wres w;
  cr_assert_eq(write_wait(&f, f.s, ops, &w), 0);
  json_decref(w.results);
  json_t *open = ah__store_inbox_open(f.s, "s1");
  cr_assert_eq(json_array_size(open), 1);
  cr_expect(json_equal(json_object_get(json_array_get(open, 0), "content"), content),
            "the inbox content read back differs");
  json_decref(open);
  json_t *evs = ah__store_events(f.s, "s1", 0, 10);
  cr_assert_eq(json_array_size(evs), 1);
  cr_expect(json_equal(json_object_get(json_object_get(json_array_get(evs, 0), "data"), "content"), content),
            "the event data read back differs");
  json_decref(evs);
  /* Stored as the value's JSON text, byte for byte (a BLOB of those bytes). */
  size_t want = json_dumpb(content, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
  cr_expect_eq(raw_int(&f, "SELECT length(CAST(content AS BLOB)) FROM inbox_content"), (sqlite3_int64)want);
  cr_expect_eq(raw_int(&f, "SELECT typeof(content) = 'blob' FROM inbox_content"), 1);
  /* A state change does not rewrite the content (SQLite rewrites a whole row on UPDATE): what it adds to
   * the write-ahead log, emptied first, is a few pages, not the 3 MiB. (Checkpoints are passive: they never
   * shrink the log file.) */
  raw_exec(&f, "PRAGMA wal_checkpoint(TRUNCATE)");
  char *wal = NULL;
  cr_assert(asprintf(&wal, "%s-wal", f.path) > 0);
  struct stat sb;
  cr_assert_eq(stat(wal, &sb), 0);
  cr_expect_lt(sb.st_size, 65536, "the log was not emptied (%lld bytes)", (long long)sb.st_size);
  write_ok(&f, f.s, "[{'op':'inbox.state','messageId':'m1','state':'claimed','turnId':'t1'}]");
  cr_assert_eq(stat(wal, &sb), 0);
  cr_expect_lt(sb.st_size, 256 * 1024, "a state change wrote %lld bytes of log", (long long)sb.st_size);
  free(wal);
  /* All or nothing: an opset whose last op fails leaves no large row behind. */
  json_t *bad = json_pack("[{s:s, s:s, s:s, s:O}, {s:s, s:s, s:i, s:s, s:{s:O}}]", "op", "inbox.put",
                          "messageId", "m2", "sessionId", "s1", "content", content, "op", "event",
                          "sessionId", "s1", "seq", 1, "kind", "dup", "data", "content", content);
  cr_expect_eq(write_wait(&f, f.s, bad, &w), AH_EEXIST);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM inbox"), 1);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM inbox_content"), 1);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events"), 1);
  json_decref(content);
  free(text);
  fx_fini(&f);
}

/* Schema v2 moved a prompt's content out of the inbox row: a version 1 store keeps its prompts, in order. */
Test(store, a_version_1_inbox_keeps_its_prompts_when_migrated) {
  SQLITE_ONLY("SQLite's schema history (PostgreSQL starts at its version 1)");
  fx f;
  fx_init(&f);
  raw_exec(
      &f,
      "CREATE TABLE sessions (id TEXT PRIMARY KEY NOT NULL, cwd TEXT, title TEXT, provider TEXT, model TEXT,"
      " parent TEXT, local INTEGER NOT NULL DEFAULT 0, depth INTEGER NOT NULL DEFAULT 0, status TEXT,"
      " closed INTEGER NOT NULL DEFAULT 0, created, updated, policy TEXT NOT NULL DEFAULT '{}',"
      " tags TEXT NOT NULL DEFAULT '[]', last_seq INTEGER NOT NULL DEFAULT 0, lease_owner TEXT,"
      " lease_until INTEGER NOT NULL DEFAULT 0);"
      "INSERT INTO sessions (id, cwd, title, policy) VALUES ('s1', '/w', 'old', "
      "'{\"write_file\":\"allow\"}');"
      "CREATE TABLE inbox (message_id TEXT PRIMARY KEY NOT NULL, session_id TEXT NOT NULL,"
      " content TEXT NOT NULL, state TEXT NOT NULL, turn_id TEXT, created);"
      "CREATE INDEX inbox_session_state ON inbox (session_id, state);"
      "INSERT INTO inbox VALUES ('m2', 's1', '[{\"type\":\"text\",\"text\":\"two\"}]', 'queued', NULL, 2);"
      "INSERT INTO inbox VALUES ('m1', 's1', '[]', 'claimed', 't1', 1);"
      "INSERT INTO inbox VALUES ('m3', 's1', '[]', 'done', 't0', 3);"
      "CREATE TABLE events (cursor INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, seq INTEGER "
      "NOT NULL, kind TEXT NOT NULL, time, turn_id TEXT, message_id TEXT, data TEXT NOT NULL, UNIQUE "
      "(session_id, seq));"
      "PRAGMA user_version = 1;");
  f.s = open_ok(&f, NULL);
  cr_expect_eq(raw_int(&f, "PRAGMA user_version"), 6);
  /* v3 gave every session its settings, v4 its usage, both empty; the rest of the row is as it was. */
  json_t *row = ah__store_get_session(f.s, "s1");
  cr_assert(row);
  expect_json(json_incref(json_object_get(row, "settings")), "{}");
  expect_json(json_incref(json_object_get(row, "usage")), "{}");
  expect_json(json_incref(json_object_get(row, "policy")), "{'write_file':'allow'}");
  cr_expect_str_eq(json_string_value(json_object_get(row, "title")), "old");
  json_decref(row);
  expect_json(ah__store_inbox_open(f.s, "s1"),
              "[{'messageId':'m2','sessionId':'s1','content':[{'type':'text','text':'two'}],'state':'queued',"
              "'turnId':null,'time':2},"
              "{'messageId':'m1','sessionId':'s1','content':[],'state':'claimed','turnId':'t1','time':1}]");
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM inbox_content"), 3);
  fx_fini(&f);
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

/* 64 events of 4 KB each (~256 KB) for session s1, seqs from *seq + 1. */
static json_t *blob_batch(int *seq) {
  static char blob[4097];
  memset(blob, 'x', 4096);
  json_t *ops = json_array();
  for (int i = 0; i < 64; i++)
    json_array_append_new(ops, json_pack("{s:s, s:s, s:i, s:s, s:{s:s}}", "op", "event", "sessionId", "s1",
                                         "seq", ++*seq, "kind", "k", "data", "blob", blob));
  return ops;
}

#define BATCH_BYTES ((off_t)64 * 4096)

/* The WAL is checkpointed into the database while the store is open, so it does not grow with everything
 * ever written: batches of ~256 KB with a pause between them leave the database holding the data and the
 * WAL smaller than half of them (it starts over once copied; a loaded machine may miss a few moments). */
Test(store, the_wal_is_checkpointed_while_open_and_stays_bounded, .timeout = 60) {
  SQLITE_ONLY("the WAL");
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  char *wal = NULL;
  cr_assert(asprintf(&wal, "%s-wal", f.path) > 0);
  int seq = 0;
  off_t wal_max = 0;
  const int batches = 16;
  for (int b = 0; b < batches; b++) {
    wres w;
    cr_assert_eq(write_wait(&f, f.s, blob_batch(&seq), &w), 0);
    json_decref(w.results);
    /* The checkpoint thread runs every 200 ms: give it some turns (a loaded machine is slow). */
    off_t db = 0;
    for (int tries = 0; tries < 250; tries++) {
      usleep(20000);
      db = file_size(f.path);
      if (db >= (off_t)(b + 1) * BATCH_BYTES)
        break;
    }
    cr_expect_geq(db, (off_t)(b + 1) * BATCH_BYTES,
                  "after batch %d the database holds %lld bytes: the WAL was not checkpointed into it", b + 1,
                  (long long)db);
    off_t ws = file_size(wal);
    if (ws > wal_max)
      wal_max = ws;
  }
  cr_expect_lt(wal_max, batches / 2 * BATCH_BYTES,
               "the WAL grew to %lld bytes over %d batches of ~%lld KB: it never starts over",
               (long long)wal_max, batches, (long long)BATCH_BYTES / 1024);
  json_t *evs = ah__store_events(f.s, "s1", 0, 1000);
  json_t *rest = ah__store_events(f.s, "s1", 1000, 1000);
  cr_expect_eq(json_array_size(evs) + json_array_size(rest), (size_t)seq, "every event reads back");
  json_decref(evs);
  json_decref(rest);
  free(wal);
  fx_fini(&f);
}

/* Under commits that never pause (the writer always has the next group queued) a passive checkpoint never
 * finds the moment the WAL may start over: past wal_restart_frames the checkpoint waits for one, so the WAL
 * stays a small part of what was written. */
typedef struct stream {
  ah_store *s;
  int seq;
  int in_flight;
  uint64_t until;
  off_t written, wal_max;
  const char *wal;
  uint32_t ckpt_seq; /* the WAL header's checkpoint sequence number: it changes when the WAL starts over */
  int restarts;
  int failed;
  bool done;
} stream;

static void stream_next(stream *st);

static void stream_written(int status, const json_t *results, void *arg) {
  (void)results;
  stream *st = arg;
  st->in_flight--;
  if (status != 0)
    st->failed++;
  st->written += BATCH_BYTES;
  off_t ws = file_size(st->wal);
  if (ws > st->wal_max)
    st->wal_max = ws;
  FILE *w = fopen(st->wal, "rb");
  unsigned char h[16];
  if (w && fread(h, 1, sizeof h, w) == sizeof h) {
    uint32_t seq = (uint32_t)h[12] << 24 | (uint32_t)h[13] << 16 | (uint32_t)h[14] << 8 | h[15];
    if (seq != st->ckpt_seq)
      st->restarts++;
    st->ckpt_seq = seq;
  }
  if (w)
    fclose(w);
  if (uv_hrtime() < st->until)
    stream_next(st);
  else if (st->in_flight == 0)
    st->done = true;
}

static void stream_next(stream *st) {
  st->in_flight++;
  cr_assert_eq(ah__store_write(st->s, blob_batch(&st->seq), stream_written, st), 0);
}

Test(store, the_wal_starts_over_under_writes_that_never_pause, .timeout = 120) {
  SQLITE_ONLY("the WAL");
  fx f;
  fx_init(&f);
  ah_store_opts o = {.path = f.path, .sync = AH_STORE_SYNC_NORMAL, .wal_restart_frames = 256};
  char *why = NULL;
  cr_assert_eq(ah__store_open(&f.loop, NULL, &o, &f.s, &why), 0, "open: %s", why ? why : "-");
  write_ok(&f, f.s, "[" SESSION1 "]");
  char *wal = NULL;
  cr_assert(asprintf(&wal, "%s-wal", f.path) > 0);
  stream st = {.s = f.s, .wal = wal, .until = uv_hrtime() + 3000000000ull};
  for (int i = 0; i < 4; i++)
    stream_next(&st);
  cr_assert(ts_run_until(&f.loop, &st.done, 60000), "the writes did not end");
  cr_expect_eq(st.failed, 0);
  cr_assert_gt(st.written, 40 * BATCH_BYTES, "only %lld bytes written in 3 s", (long long)st.written);
  cr_expect_geq(st.restarts, 3, "the WAL started over %d times while %lld bytes were written", st.restarts,
                (long long)st.written);
  cr_expect_lt(st.wal_max, st.written / 2, "the WAL grew to %lld bytes of the %lld written",
               (long long)st.wal_max, (long long)st.written);
  json_t *last = ah__store_events(f.s, "s1", st.seq - 1, 10);
  cr_expect_eq(json_array_size(last), 1, "the last event reads back");
  json_decref(last);
  free(wal);
  fx_fini(&f);
}

/* ---- PostgreSQL's own ------------------------------------------------------------------------------------
 */

#ifdef AH_HAVE_POSTGRESQL

static void ts_sleep_ms(unsigned ms) {
  usleep(ms * 1000u);
}

#define PG_ONLY()                                          \
  do {                                                     \
    if (!tpg_enabled())                                    \
      cr_skip_test("PostgreSQL only (the store-pg test)"); \
  } while (0)

/* A lease's expiry is the server's: the TTL is until - now of the caller, placed on the server's clock, so
 * a host whose clock is far ahead (or behind) neither expires others' leases early nor holds its own longer.
 * The heartbeat (lease.renew) likewise; a lapsed heartbeat is reported. */
Test(store, pg_leases_go_by_the_servers_clock, .timeout = 30) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 ",{'op':'session.put','session':{'id':'s2'}}]");
  wres w;
  /* A's clock says 0; B's is a year ahead: B's now does not expire A's lease of 600 ms. */
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease','id':'s1','owner':'A','until':600,'now':0},"
                            "{'op':'lease','id':'s1','owner':'B','until':31536000600,'now':31536000000}]"),
                          &w),
               0);
  expect_json(w.results, "[true,false]");
  json_t *s = ah__store_get_session(f.s, "s1");
  int64_t server_now = raw_int(&f, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint");
  cr_expect(iget(s, "leaseUntil") > server_now - 5000 && iget(s, "leaseUntil") <= server_now + 600,
            "leaseUntil %lld is not on the server's clock (%lld)", (long long)iget(s, "leaseUntil"),
            (long long)server_now);
  json_decref(s);
  /* The heartbeat holds A's lease past its own lease_until; once it lapses, B takes it. */
  cr_assert_eq(write_wait(&f, f.s, J("[{'op':'lease.renew','owner':'A','until':1200,'now':0}]"), &w), 0);
  json_decref(w.results);
  ts_sleep_ms(800);
  cr_assert_eq(write_wait(&f, f.s, J("[{'op':'lease','id':'s1','owner':'B','until':700,'now':0}]"), &w), 0);
  expect_json(w.results, "[false]");
  ts_sleep_ms(600);
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease','id':'s1','owner':'B','until':700,'now':0},"
                            "{'op':'lease.renew','owner':'A','until':1000,'now':0}]"),
                          &w),
               0);
  expect_json(w.results, "[true,{'lapsed':true}]");
  s = ah__store_get_session(f.s, "s1");
  cr_expect_str_eq(sget(s, "leaseOwner"), "B");
  json_decref(s);
  /* Steal and release as on SQLite; a free lease is taken at once. */
  cr_assert_eq(write_wait(&f, f.s,
                          J("[{'op':'lease','id':'s1','owner':'C','until':60000,'now':0,'steal':'B'},"
                            "{'op':'lease','id':'s2','owner':'C','until':60000,'now':0},"
                            "{'op':'lease','id':'nope','owner':'C','until':60000,'now':0}]"),
                          &w),
               0);
  expect_json(w.results, "[true,true,false]");
  write_ok(&f, f.s,
           "[{'op':'lease.release','id':'s1','owner':'B'},{'op':'lease.release','id':'s2','owner':'C'}]");
  s = ah__store_get_session(f.s, "s1");
  cr_expect_str_eq(sget(s, "leaseOwner"), "C", "a release by a non-owner is ignored");
  json_decref(s);
  s = ah__store_get_session(f.s, "s2");
  cr_expect(json_is_null(json_object_get(s, "leaseOwner")));
  json_decref(s);
  write_ok(&f, f.s, "[{'op':'lease.end','owner':'A'}]");
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM owners WHERE owner = 'A'"), 0);
  cr_expect_eq(write_status(&f, f.s, "[{'op':'lease','id':'s1','owner':'B'}]"), AH_EINVAL);
  fx_fini(&f);
}

/* Two stores on one database (two hosts): each reads the other's rows, and the fence of one refuses its
 * writes once the other took the session over. */
Test(store, pg_two_stores_share_leases_and_rows) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  ah_store *other = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  wres w;
  cr_assert_eq(write_wait(&f, f.s, J("[{'op':'lease','id':'s1','owner':'host-1','until':400,'now':0}]"), &w),
               0);
  expect_json(w.results, "[true]");
  cr_assert_eq(
      write_wait(&f, other, J("[{'op':'lease','id':'s1','owner':'host-2','until':400,'now':0}]"), &w), 0);
  expect_json(w.results, "[false]");
  json_t *s = ah__store_get_session(other, "s1");
  cr_assert_not_null(s, "the second store reads the first one's rows");
  cr_expect_str_eq(sget(s, "leaseOwner"), "host-1");
  json_decref(s);
  write_ok(&f, f.s,
           "[{'op':'fence','id':'s1','owner':'host-1'},"
           "{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{'from':1}}]");
  json_t *ev = ah__store_events(other, "s1", 0, 0);
  cr_expect_eq(json_array_size(ev), 1, "the second reads the first one's events");
  json_decref(ev);
  /* host-1's lease and heartbeat run out (it never renewed): host-2 takes the session; host-1's fenced
   * write is refused and nothing of it is stored. */
  ts_sleep_ms(600);
  cr_assert_eq(
      write_wait(&f, other, J("[{'op':'lease','id':'s1','owner':'host-2','until':60000,'now':0}]"), &w), 0);
  expect_json(w.results, "[true]");
  cr_expect_eq(write_status(&f, f.s,
                            "[{'op':'fence','id':'s1','owner':'host-1'},"
                            "{'op':'event','sessionId':'s1','seq':2,'kind':'k','time':'t','data':{}}]"),
               AH_EAGENTBUSY);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events"), 1);
  close_store(&f, other);
  fx_fini(&f);
}

/* A lock held by another connection: the write waits (the loop keeps running) and commits once it goes;
 * held past lock_timeout (5 s) every opset of the group fails with AH_EBUSY and nothing is written. */
Test(store, pg_a_lock_held_elsewhere_fails_the_group_as_busy, .timeout = 60) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  const char *keys[] = {"dbname", "password", NULL};
  const char *vals[] = {f.url, tpg_password(), NULL};
  PGconn *c = PQconnectdbParams(keys, vals, 1);
  cr_assert_eq(PQstatus(c), CONNECTION_OK);
  PQclear(PQexec(c, "BEGIN; SELECT 1 FROM sessions WHERE id = 's1' FOR UPDATE"));
  wres w;
  memset(&w, 0, sizeof w);
  uint64_t t0 = ts_now_ms();
  cr_assert_eq(ah__store_write(f.s,
                               J("[{'op':'fence','id':'s1','owner':'A'},{'op':'session.update','id':'s1',"
                                 "'set':{'title':'x'}}]"),
                               on_write, &w),
               0);
  cr_expect_lt(ts_now_ms() - t0, 100, "ah__store_write blocked the loop");
  volatile bool never = false;
  ts_run_until(&f.loop, &never, 300);
  cr_expect_not(w.done, "went past a row lock held by another connection");
  PQclear(PQexec(c, "ROLLBACK"));
  cr_assert(ts_run_until(&f.loop, &w.done, 10000));
  cr_expect_eq(w.status, AH_EAGENTBUSY, "the fence ran once the lock went: %s", ah_err_name(w.status));
  /* Held past lock_timeout. */
  PQclear(PQexec(c, "BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE"));
  t0 = ts_now_ms();
  cr_expect_eq(
      write_status(&f, f.s, "[{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]"),
      AH_EBUSY);
  cr_expect_geq(ts_now_ms() - t0, 4500, "gave up before the lock timeout");
  PQclear(PQexec(c, "ROLLBACK"));
  PQfinish(c);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events"), 0);
  write_ok(&f, f.s, "[{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]");
  fx_fini(&f);
}

/* A database of a newer agenthost, or one whose tables are not agenthost's, is refused and left as it was;
 * a read-only open of either too. */
Test(store, pg_a_newer_or_foreign_database_is_refused) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  ah_store *s = open_ok(&f, NULL);
  close_store(&f, s);
  raw_exec(&f, "UPDATE agenthost_schema SET version = 99");
  for (int ro = 0; ro < 2; ro++) {
    char *why = NULL;
    int rc = store_open(&f, NULL, AH_STORE_SYNC_NORMAL, ro, &s, &why);
    cr_expect_eq(rc, AH_ECONFIG, "%s", ah_err_name(rc));
    cr_expect(why && strstr(why, "version 99") && strstr(why, "newer"), "why: %s", why ? why : "-");
    cr_expect(why && !strstr(why, tpg_password()), "the password is in the reason");
    free(why);
  }
  cr_expect_eq(raw_int(&f, "SELECT max(version) FROM agenthost_schema"), 99);
  raw_exec(&f, "DROP TABLE agenthost_schema");
  char *why = NULL;
  cr_expect_eq(store_open(&f, NULL, AH_STORE_SYNC_NORMAL, false, &s, &why), AH_ECONFIG);
  cr_expect(why && strstr(why, "not an agenthost database"), "why: %s", why ? why : "-");
  free(why);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM pg_tables WHERE tablename = 'agenthost_schema'"), 0);
  fx_fini(&f);
}

Test(store, pg_a_read_only_open_of_an_empty_database_creates_nothing) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  ah_store *s = NULL;
  char *why = NULL;
  int rc = store_open(&f, NULL, AH_STORE_SYNC_NORMAL, true, &s, &why);
  cr_expect_eq(rc, AH_ENOENT, "%s", ah_err_name(rc));
  cr_expect_null(s);
  cr_expect(why && strstr(why, "version 0"), "why: %s", why ? why : "-");
  free(why);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"), 0);
  fx_fini(&f);
}

/* An unreachable server, or a wrong password, fails the open with a reason that names the server and never
 * the password. */
Test(store, pg_an_unreachable_server_is_refused_with_its_reason) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  ah_store_opts o = {.url = "host=127.0.0.1 port=1 dbname=x user=agenthost connect_timeout=2",
                     .password = "sekrit-CANARY",
                     .sync = AH_STORE_SYNC_NORMAL};
  ah_store *s = NULL;
  char *why = NULL;
  cr_expect_eq(ah__store_open(&f.loop, &ah__store_pg, &o, &s, &why), AH_EIO);
  cr_expect(why && strstr(why, "cannot connect"), "why: %s", why ? why : "-");
  cr_expect(why && !strstr(why, "CANARY"), "why: %s", why ? why : "-");
  free(why);
  why = NULL;
  o.url = f.url;
  cr_expect_eq(ah__store_open(&f.loop, &ah__store_pg, &o, &s, &why), AH_EIO);
  cr_expect(why && strstr(why, "password"), "why: %s", why ? why : "-");
  cr_expect(why && !strstr(why, "CANARY"), "why: %s", why ? why : "-");
  free(why);
  fx_fini(&f);
}

/* The connection is cut under the store (the server ends its backends): the next write reconnects and
 * commits; the next read too. */
Test(store, pg_a_dropped_connection_is_opened_again) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  write_ok(&f, f.s, "[" SESSION1 "]");
  char sql[256];
  snprintf(sql, sizeof sql,
           "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '%s' AND "
           "application_name LIKE 'agenthost-%%'",
           f.dbname);
  cr_expect_eq(raw_int(&f, sql), 2, "the writer and the reader");
  write_ok(&f, f.s, "[{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]");
  json_t *ev = ah__store_events(f.s, "s1", 0, 0);
  cr_expect_eq(json_array_size(ev), 1);
  json_decref(ev);
  cr_expect_eq(ah__store_read_status(f.s), 0);
  fx_fini(&f);
}

/* Events are numbered in commit order across stores (hosts): with two stores writing at once, every cursor
 * a reader has seen is below every cursor committed after it. */
Test(store, pg_cursors_follow_commit_order_across_stores, .timeout = 60) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  ah_store *other = open_ok(&f, NULL);
  write_ok(&f, f.s, "[{'op':'session.put','session':{'id':'a'}},{'op':'session.put','session':{'id':'b'}}]");
  enum { N = 400 };
  static wres w[2 * N];
  static wres *ws[2 * N + 1];
  int64_t seen = 0;
  size_t followed = 0;
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < 2; k++) {
      json_t *op = json_pack("[{s:s, s:s, s:i, s:s, s:s, s:{}}]", "op", "event", "sessionId", k ? "b" : "a",
                             "seq", i + 1, "kind", "k", "time", "t", "data");
      memset(&w[2 * i + k], 0, sizeof w[0]);
      cr_assert_eq(ah__store_write(k ? other : f.s, op, on_write, &w[2 * i + k]), 0);
      ws[2 * i + k] = &w[2 * i + k];
    }
    uv_run(&f.loop, UV_RUN_NOWAIT);
    /* A reader following by cursor: what it reads after `seen` must never contain a cursor it skipped. */
    json_t *ev = ah__store_events_after(f.s, seen, 0);
    size_t j;
    json_t *e;
    json_array_foreach(ev, j, e) {
      seen = iget(e, "cursor");
      followed++;
    }
    json_decref(ev);
  }
  ws[2 * N] = NULL;
  cr_assert(ts_run_until_pred(&f.loop, all_done, ws, 30000));
  for (int i = 0; i < 2 * N; i++) {
    cr_expect_eq(w[i].status, 0);
    json_decref(w[i].results);
  }
  json_t *ev = ah__store_events_after(f.s, seen, 0);
  size_t j;
  json_t *e;
  json_array_foreach(ev, j, e) {
    seen = iget(e, "cursor");
    followed++;
  }
  json_decref(ev);
  /* Every event reached the follower: one that committed after a higher cursor was read would have been
   * skipped (the follower never reads below what it has seen). */
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events"), 2 * N);
  cr_expect_eq(followed, 2 * N, "the follower missed %zu events", 2 * N - followed);
  cr_expect_eq(raw_int(&f, "SELECT max(\"cursor\") FROM events"), seen);
  close_store(&f, other);
  fx_fini(&f);
}

typedef struct signals {
  char got[32][64];
  int n;
} signals;

static void on_signal(const char *payload, void *arg) {
  signals *g = arg;
  if (g->n < 32)
    snprintf(g->got[g->n++], sizeof g->got[0], "%s", payload);
}

static bool got_signal(signals *g, const char *want) {
  for (int i = 0; i < g->n; i++)
    if (strcmp(g->got[i], want) == 0)
      return true;
  return false;
}

static bool watching(void *arg) {
  return ah__store_watching(arg);
}

typedef struct wait_signal {
  signals *g;
  const char *want;
} wait_signal;

static bool has_signal(void *arg) {
  wait_signal *w = arg;
  return got_signal(w->g, w->want);
}

/* Signals between hosts: a store watching gets "events" when another stores events, the payload of a
 * notify operation once its transaction commits (never for one rolled back), and "*" once its listening
 * connection is back after the server ended it. Posted prompts: listed with whether their session is free. */
Test(store, pg_signals_reach_the_other_hosts_after_the_commit, .timeout = 60) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  ah_store *other = open_ok(&f, NULL);
  cr_assert(ah__store_signals(f.s));
  signals g = {0};
  cr_assert_eq(ah__store_watch(f.s, on_signal, &g), 0);
  cr_expect_eq(ah__store_watch(f.s, on_signal, &g), AH_ESTATE, "a second watch");
  cr_assert(ts_run_until_pred(&f.loop, watching, f.s, 10000), "the listening connection never opened");
  cr_expect(got_signal(&g, "*"), "an open connection tells that earlier signals may have been missed");
  g.n = 0;
  write_ok(&f, other,
           "[" SESSION1 ",{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]");
  wait_signal w = {&g, "events"};
  cr_expect(ts_run_until_pred(&f.loop, has_signal, &w, 5000), "no 'events' signal");
  write_ok(&f, other, "[{'op':'notify','payload':'inbox:s1'}]");
  w.want = "inbox:s1";
  cr_expect(ts_run_until_pred(&f.loop, has_signal, &w, 5000), "no 'inbox:s1' signal");
  /* An opset that fails is rolled back with its notify. */
  cr_expect_eq(write_status(&f, other,
                            "[{'op':'notify','payload':'never'},"
                            "{'op':'event','sessionId':'s1','seq':1,'kind':'dup','time':'t','data':{}}]"),
               AH_EEXIST);
  write_ok(&f, other, "[{'op':'notify','payload':'after'}]");
  w.want = "after";
  cr_expect(ts_run_until_pred(&f.loop, has_signal, &w, 5000));
  cr_expect_not(got_signal(&g, "never"), "a rolled-back notify was delivered");
  cr_expect_eq(ah__store_last_cursor(f.s), 1);
  /* The server ends the listening connection: it is opened again, "*" says signals may have been missed. */
  char sql[256];
  snprintf(sql, sizeof sql,
           "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '%s' AND "
           "application_name LIKE 'agenthost-listener-%%'",
           f.dbname);
  cr_expect_eq(raw_int(&f, sql), 1);
  w.want = "*";
  cr_expect(ts_run_until_pred(&f.loop, has_signal, &w, 10000), "the signal connection was not opened again");
  g.n = 0;
  write_ok(&f, other, "[{'op':'notify','payload':'again'}]");
  w.want = "again";
  cr_expect(ts_run_until_pred(&f.loop, has_signal, &w, 5000));
  /* Posted prompts, and whether their session's lease is free. */
  write_ok(&f, other,
           "[{'op':'session.put','session':{'id':'s2'}},"
           "{'op':'lease','id':'s2','owner':'B','until':60000,'now':0},"
           "{'op':'inbox.put','messageId':'p1','sessionId':'s1','content':['x'],'time':'t','state':'posted'},"
           "{'op':'inbox.put','messageId':'p2','sessionId':'s2','content':['y'],'time':'t','state':'posted'},"
           "{'op':'inbox.put','messageId':'q1','sessionId':'s2','content':['z'],'time':'t'}]");
  expect_json(ah__store_posted(f.s),
              "[{'id':'s1','leaseOwner':null,'free':true},{'id':'s2','leaseOwner':'B','free':false}]");
  json_t *open = ah__store_inbox_open(f.s, "s2");
  cr_expect_eq(json_array_size(open), 2);
  cr_expect_str_eq(sget(json_array_get(open, 0), "state"), "posted");
  json_decref(open);
  write_ok(&f, other, "[{'op':'inbox.state','messageId':'p2','state':'queued'}]");
  expect_json(ah__store_posted(f.s), "[{'id':'s1','leaseOwner':null,'free':true}]");
  cr_expect_eq(
      write_status(&f, other,
                   "[{'op':'inbox.put','messageId':'x','sessionId':'s1','content':[],'state':'weird'}]"),
      AH_EINVAL);
  close_store(&f, other);
  fx_fini(&f);
}

/* SQLite has no signals: no watch, nothing posted to list; a notify is accepted and does nothing. */
Test(store, sqlite_has_no_signals) {
  SQLITE_ONLY("SQLite's lack of signals");
  fx f;
  fx_init(&f);
  f.s = open_ok(&f, NULL);
  cr_expect_not(ah__store_signals(f.s));
  signals g = {0};
  cr_expect_eq(ah__store_watch(f.s, on_signal, &g), AH_EUNAVAILABLE);
  cr_expect_null(ah__store_posted(f.s));
  write_ok(&f, f.s, "[{'op':'notify','payload':'x'}]");
  write_ok(&f, f.s,
           "[" SESSION1
           ",{'op':'inbox.put','messageId':'p1','sessionId':'s1','content':['x'],'time':'t','state':"
           "'posted'},{'op':'inbox.state','messageId':'p1','state':'queued'}]");
  cr_expect_eq(ah__store_last_cursor(f.s), 0);
  fx_fini(&f);
}

/* The answer to a COMMIT is lost (the network drops everything just after the server received it: a
 * deferred trigger makes the commit take a second, a proxy starts dropping meanwhile): the writer gives
 * the silent connection up, reconnects once the network is back, finds the group's marker and reports the
 * group written — once, not written again. */
Test(store, pg_a_commit_whose_answer_was_lost_is_resolved_by_its_marker, .timeout = 120) {
  PG_ONLY();
  fx f;
  fx_init(&f);
  char *via = NULL;
  pid_t proxy = tpg_proxy_start(f.dir, f.dbname, &via);
  ah_store_opts o = {.url = via, .password = tpg_password(), .sync = AH_STORE_SYNC_NORMAL};
  char *why = NULL;
  cr_assert_eq(ah__store_open(&f.loop, &ah__store_pg, &o, &f.s, &why), 0, "%s", why ? why : "-");
  write_ok(&f, f.s, "[" SESSION1 "]");
  raw_exec(&f, "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1.5); "
               "RETURN NULL; END $$;"
               "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED "
               "FOR EACH ROW EXECUTE FUNCTION slow()");
  wres w;
  memset(&w, 0, sizeof w);
  cr_assert_eq(ah__store_write(f.s,
                               J("[{'op':'event','sessionId':'s1','seq':1,'kind':'k','time':'t','data':{}}]"),
                               on_write, &w),
               0);
  volatile bool never = false;
  ts_run_until(&f.loop, &never, 700); /* the COMMIT is at the server, sleeping in the trigger */
  cr_assert_eq(kill(proxy, SIGUSR1), 0);
  ts_run_until(&f.loop, &never, 3000); /* it committed; its answer was dropped */
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events"), 1, "the commit did not happen at the server");
  cr_expect_not(w.done, "the writer had an answer it cannot have had");
  cr_assert_eq(kill(proxy, SIGUSR2), 0);
  cr_assert(ts_run_until(&f.loop, &w.done, 60000), "the write never completed");
  cr_expect_eq(w.status, 0, "%s", ah_err_name(w.status));
  cr_expect_eq(json_integer_value(json_array_get(w.results, 0)),
               raw_int(&f, "SELECT max(\"cursor\") FROM events"),
               "the event's cursor, as the transaction had it");
  json_decref(w.results);
  cr_expect_eq(raw_int(&f, "SELECT count(*) FROM events"), 1, "written twice");
  cr_expect_eq(ah__store_retries(f.s), 0, "the group was tried again");
  tpg_proxy_stop(proxy);
  free(via);
  fx_fini(&f);
}
#endif
