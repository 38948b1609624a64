/* The PostgreSQL backend of the durable store (docs/scaling.md).
 *
 * Two connections, each used by one thread only: `w`, the writer (the loop thread while opening, then only
 * the store's writer thread), and `r`, used by the reads on the loop thread. Both are opened from the same
 * connection string (a libpq URI or key=value string) with the password, when one is configured, passed
 * apart from it: neither the string nor the password is ever logged (a log line names the server by host,
 * port and database only).
 *
 * The logical schema is SQLite's (host/store_sqlite.c): the same tables and columns, JSON kept as compact
 * text (so exports are byte-identical), times kept as the JSON text of the value written (a string or a
 * number comes back as it went in). The schema version lives in agenthost_schema; migrations run in one
 * transaction under an advisory lock, so hosts starting together migrate once.
 *
 * What PostgreSQL changes:
 *  - The store's clock decides leases: a lease or heartbeat operation takes its TTL from the caller
 *    (until - now) and its times from the server's clock, so hosts whose clocks disagree still agree on
 *    when a lease expires.
 *  - The fence locks the session's row (SELECT ... FOR UPDATE) inside the writing transaction, so a
 *    takeover waits for a write already fenced and a write waits for a takeover already made: no event of
 *    an owner commits after its session was taken over.
 *  - Events are numbered (cursor) under a transaction-level advisory lock, so their commit order is their
 *    cursor order across every host: a reader that saw cursor N never later sees a smaller one commit.
 *  - Every group writes a marker row with its own token. When the connection drops during COMMIT, the
 *    writer reconnects and looks the marker up: the group committed or it did not, never guessed.
 *  - lock_timeout and idle_in_transaction_session_timeout bound what a paused process can hold.
 */
#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agenthost/errors.h"
#include "internal.h"
#include "log.h"
#include "store.h"
#include "store_ops.h"

#define COMP "store"

/* A lock held by another host past this fails the group as busy (SQLite's busy timeout is the same). */
#define LOCK_TIMEOUT "5s"
/* A transaction left open by a paused or hung process is ended by the server after this (shorter than
 * LOCK_TIMEOUT, so that a takeover waiting for the paused owner's row lock gets it rather than timing out).
 */
#define IDLE_TX_TIMEOUT "2s"
/* A read that takes longer than this fails (the loop waits for reads); the server's limit, and the client's
 * a little later (a server that does not answer at all). */
#define READ_TIMEOUT "5s"
#define READ_TIMEOUT_MS 6000
/* A write statement not answered in this time: the connection is given up and opened again (a group commit
 * is a few statements; the server's lock_timeout is 5 s). */
#define WRITE_TIMEOUT_MS 15000
/* How long the writer keeps trying to learn the outcome of a commit whose answer was lost. */
#define UNKNOWN_COMMIT_WAIT_MS 30000
/* Advisory lock keys ("agnt" and "agnt"+1). */
#define LOCK_MIGRATE "1634168436"
#define LOCK_EVENTS "1634168437"
/* Markers older than this are removed (every MARKER_PRUNE_EVERY groups). */
#define MARKER_PRUNE_EVERY 1000

#define PG_SCHEMA_VERSION 1

static const char *const pg_migrations[PG_SCHEMA_VERSION] = {
    /* v1: SQLite's schema at its version 5, in one step. */
    "CREATE TABLE sessions ("
    "  id text COLLATE \"C\" PRIMARY KEY NOT NULL, cwd text, title text, provider text, model text, parent "
    "text,"
    "  \"local\" boolean NOT NULL DEFAULT false, depth bigint NOT NULL DEFAULT 0, status text,"
    "  closed boolean NOT NULL DEFAULT false, created text, updated text,"
    "  policy text NOT NULL DEFAULT '{}', tags text NOT NULL DEFAULT '[]', last_seq bigint NOT NULL DEFAULT "
    "0,"
    "  lease_owner text, lease_until bigint NOT NULL DEFAULT 0, lease_epoch bigint NOT NULL DEFAULT 0,"
    "  settings text NOT NULL DEFAULT '{}',"
    "  \"usage\" text NOT NULL DEFAULT '{}');"
    "CREATE INDEX sessions_parent ON sessions (parent);"
    "CREATE TABLE events ("
    "  \"cursor\" bigserial PRIMARY KEY, session_id text NOT NULL, seq bigint NOT NULL, kind text NOT NULL,"
    "  \"time\" text, turn_id text, message_id text, data text NOT NULL, epoch bigint,"
    "  UNIQUE (session_id, seq));"
    "CREATE TABLE inbox ("
    "  n bigserial, message_id text PRIMARY KEY NOT NULL, session_id text NOT NULL, state text NOT NULL,"
    "  turn_id text, created text);"
    "CREATE INDEX inbox_session_state ON inbox (session_id, state);"
    "CREATE TABLE inbox_content (message_id text PRIMARY KEY NOT NULL, content text NOT NULL);"
    "CREATE TABLE requests ("
    "  n bigserial, id text PRIMARY KEY NOT NULL, session_id text NOT NULL, turn_id text, kind text NOT NULL,"
    "  params text, options text, state text NOT NULL, answer text, created text, resolved text);"
    "CREATE INDEX requests_state ON requests (state);"
    "CREATE INDEX requests_session ON requests (session_id);"
    "CREATE TABLE owners (owner text PRIMARY KEY NOT NULL, until bigint NOT NULL);"
    "CREATE TABLE commit_markers (token text PRIMARY KEY NOT NULL, at timestamptz NOT NULL DEFAULT now());"
    /* Conditions that fail an opset are raised by the server (so that a group can be pipelined): AH001 not
     * found, AH002 already resolved, AH003 the fence. */
    "CREATE FUNCTION agenthost_need(n bigint, code text, msg text) RETURNS void LANGUAGE plpgsql AS $f$ "
    "BEGIN "
    "IF n = 0 THEN RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg; END IF; END $f$;"
    "CREATE FUNCTION agenthost_fence(sid text, who text) RETURNS void LANGUAGE plpgsql AS $f$ DECLARE holder "
    "text; BEGIN SELECT lease_owner INTO holder FROM sessions WHERE id = sid FOR UPDATE; IF NOT FOUND THEN "
    "RAISE EXCEPTION USING ERRCODE = 'AH001', MESSAGE = format('fence: session %s: no such session', sid); "
    "END IF; IF holder IS DISTINCT FROM who THEN RAISE EXCEPTION USING ERRCODE = 'AH003', MESSAGE = "
    "format('fence: session %s is owned by %s, not by this process', sid, coalesce(holder, 'no process')); "
    "END IF; END $f$;",
};

/* The server's clock in Unix milliseconds. */
#define DB_NOW "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

#define SESSION_COLS                                                                                      \
  "id, cwd, title, provider, model, parent, \"local\", depth, status, closed, created, updated, policy, " \
  "tags, last_seq, lease_owner, lease_until, settings, \"usage\""
#define EVENT_COLS "\"cursor\", session_id, seq, kind, \"time\", turn_id, message_id, data"
#define INBOX_COLS "i.message_id, i.session_id, c.content, i.state, i.turn_id, i.created"
#define INBOX_FROM "inbox i JOIN inbox_content c ON c.message_id = i.message_id"
#define REQUEST_COLS "id, session_id, turn_id, kind, params, options, state, answer, created, resolved"
#define OPEN_INBOX "state NOT IN ('done', 'cancelled')"

typedef struct pg_store {
  char *conninfo;
  char *password;  /* NULL: none configured (libpq may still find one: PGPASSFILE, ~/.pgpass) */
  char label[256]; /* "postgresql HOST:PORT/DB" for messages */
  ah_store_sync sync;
  bool read_only;
  PGconn *w; /* NULL when read-only */
  PGconn *r;
  PGconn *l;     /* the listening connection (the watch), loop thread */
  bool prepared; /* the writer's connection has prepared_sql prepared ("ah0", "ah1", ...) */
  char err[512]; /* the writer thread's description of the last failed operation */
  uint64_t groups;
  pthread_mutex_t health_mu;
  int health;
  char health_detail[300];
  bool read_failed;
} pg_store;

static void set_why(char **why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_why(char **why, const char *fmt, ...) {
  if (!why)
    return;
  free(*why);
  va_list ap;
  va_start(ap, fmt);
  if (vasprintf(why, fmt, ap) < 0)
    *why = NULL;
  va_end(ap);
}

static void set_err(pg_store *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(pg_store *q, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(q->err, sizeof q->err, fmt, ap);
  va_end(ap);
}

/* A server message on one line, without libpq's trailing newline and "ERROR:  " prefix. */
static void one_line(char *out, size_t cap, const char *msg) {
  snprintf(out, cap, "%s", msg ? msg : "no message");
  size_t n = strlen(out);
  while (n && (out[n - 1] == '\n' || out[n - 1] == ' '))
    out[--n] = '\0';
  for (char *p = out; *p; p++)
    if (*p == '\n')
      *p = ' ';
}

/* ---- health ------------------------------------------------------------------------------------------ */

/* DAMAGED while the server cannot be reached (cleared by the next commit, unlike SQLite's damage: the
 * database itself is not known to be harmed); FULL on disk_full. */
static void note_health(pg_store *q, int h, const char *detail) {
  pthread_mutex_lock(&q->health_mu);
  if (h > q->health) {
    q->health = h;
    snprintf(q->health_detail, sizeof q->health_detail, "%s", detail);
    AH_LOG_E(COMP, "%s: the store is %s: %s", q->label, h == AH_STORE_FULL ? "full" : "unavailable", detail);
  }
  pthread_mutex_unlock(&q->health_mu);
}

static void note_commit(pg_store *q) {
  pthread_mutex_lock(&q->health_mu);
  if (q->health != AH_STORE_OK) {
    q->health = AH_STORE_OK;
    q->health_detail[0] = '\0';
    AH_LOG_I(COMP, "%s: writes succeed again", q->label);
  }
  pthread_mutex_unlock(&q->health_mu);
}

static int pg_health(void *impl, char *detail, size_t cap) {
  pg_store *q = impl;
  pthread_mutex_lock(&q->health_mu);
  int h = q->health;
  if (detail && cap)
    snprintf(detail, cap, "%s", q->health_detail);
  pthread_mutex_unlock(&q->health_mu);
  return h;
}

static bool pg_read_failed(void *impl) {
  return ((pg_store *)impl)->read_failed;
}

static void pg_release_memory(void *impl) {
  (void)impl; /* the server keeps the caches */
}

static int64_t pg_memory_used(void *impl) {
  (void)impl;
  return -1;
}

/* ---- connections ------------------------------------------------------------------------------------- */

static const char *sync_setting(ah_store_sync sync) {
  /* OFF: commits return before the server flushed its WAL (a server crash may lose the last ones); NORMAL
   * and FULL: flushed (PostgreSQL's own durability; replicas are the server's configuration). */
  return sync == AH_STORE_SYNC_OFF ? "off" : "on";
}

typedef enum conn_kind { CONN_WRITER, CONN_READER, CONN_LISTENER } conn_kind;

static PGconn *connect_one(pg_store *q, conn_kind kind, char **why) {
  bool reader = kind == CONN_READER;
  char options[256];
  snprintf(options, sizeof options,
           "-c lock_timeout=%s -c idle_in_transaction_session_timeout=%s -c synchronous_commit=%s%s",
           LOCK_TIMEOUT, IDLE_TX_TIMEOUT, sync_setting(q->sync),
           reader ? " -c statement_timeout=" READ_TIMEOUT " -c default_transaction_read_only=on" : "");
  const char *keys[12];
  const char *vals[12];
  int n = 0;
  keys[n] = "dbname";
  vals[n++] = q->conninfo;
  /* Named for operators (pg_stat_activity): which process and which of its connections. */
  char app[64];
  snprintf(app, sizeof app, "agenthost-%s-%ld",
           kind == CONN_READER   ? "reader"
           : kind == CONN_WRITER ? "writer"
                                 : "listener",
           (long)getpid());
  keys[n] = "application_name";
  vals[n++] = app;
  keys[n] = "options";
  vals[n++] = options;
  keys[n] = "connect_timeout";
  vals[n++] = "5";
  keys[n] = "tcp_user_timeout";
  vals[n++] = "10000";
  /* An idle connection (the listener) whose peer went away is found within ~11 s. */
  keys[n] = "keepalives_idle";
  vals[n++] = "5";
  keys[n] = "keepalives_interval";
  vals[n++] = "2";
  keys[n] = "keepalives_count";
  vals[n++] = "3";
  if (q->password) {
    keys[n] = "password";
    vals[n++] = q->password;
  }
  keys[n] = NULL;
  vals[n] = NULL;
  /* expand_dbname: "dbname" holds the whole connection string; the keys after it override its values. */
  PGconn *c = PQconnectdbParams(keys, vals, 1);
  if (!c || PQstatus(c) != CONNECTION_OK) {
    char msg[300];
    one_line(msg, sizeof msg, c ? PQerrorMessage(c) : "out of memory");
    set_why(why, "store: cannot connect to %s: %s", q->label, msg);
    PQfinish(c);
    return NULL;
  }
  if (!q->label[0] || strstr(q->label, "(unknown)"))
    snprintf(q->label, sizeof q->label, "postgresql %s:%s/%s", PQhost(c), PQport(c), PQdb(c));
  return c;
}

static void prepare_all(pg_store *q);

/* The writer's connection is good, or reconnected now; false when the server cannot be reached. */
static bool writer_ready(pg_store *q) {
  if (q->w && PQstatus(q->w) == CONNECTION_OK)
    return true;
  char *why = NULL;
  PGconn *c = connect_one(q, CONN_WRITER, &why);
  if (!c) {
    set_err(q, "%s", why ? why : "cannot connect");
    note_health(q, AH_STORE_DAMAGED, q->err);
    free(why);
    return false;
  }
  PQfinish(q->w);
  q->w = c;
  prepare_all(q);
  if (!q->w) { /* no answer while preparing: closed again */
    set_err(q, "no answer from the server while preparing the statements");
    return false;
  }
  AH_LOG_I(COMP, "%s: the writer reconnected", q->label);
  return true;
}

static bool reader_ready(pg_store *q) {
  if (q->r && PQstatus(q->r) == CONNECTION_OK)
    return true;
  char *why = NULL;
  PGconn *c = connect_one(q, CONN_READER, &why);
  if (!c) {
    AH_LOG_E(COMP, "%s", why ? why : "store: cannot connect");
    free(why);
    return false;
  }
  PQfinish(q->r);
  q->r = c;
  return true;
}

/* ---- statements ---------------------------------------------------------------------------------------- */

/* Parameters as text (NULL = SQL NULL); owned copies are freed after the call. */
typedef struct params {
  int n;
  bool oom; /* an owned copy could not be made */
  const char *v[24];
  char *own[24];
} params;

static void p_text(params *p, const char *s) {
  p->own[p->n] = NULL;
  p->v[p->n++] = s;
}

static void p_own(params *p, char *s) {
  if (!s)
    p->oom = true;
  p->own[p->n] = s;
  p->v[p->n++] = s;
}

static void p_int(params *p, long long v) {
  char *s = NULL;
  if (asprintf(&s, "%lld", v) < 0)
    s = NULL;
  p_own(p, s);
}

static void p_bool(params *p, bool v) {
  p_text(p, v ? "true" : "false");
}

#define DUMP_FLAGS (JSON_COMPACT | JSON_ENCODE_ANY)

/* v as compact JSON text; NULL or json null → `dflt` (which may be NULL: SQL NULL). */
static void p_json(params *p, const json_t *v, const char *dflt) {
  if (!v || json_is_null(v))
    p_text(p, dflt);
  else
    p_own(p, json_dumps(v, DUMP_FLAGS));
}

/* A string column: a string as itself, anything else as SQL NULL. */
static void p_str(params *p, const json_t *v) {
  p_text(p, json_string_value(v));
}

/* A time column (a scalar kept as written): its JSON text, SQL NULL for none or null. */
static void p_scalar(params *p, const json_t *v) {
  p_json(p, v, NULL);
}

static void p_free(params *p) {
  for (int i = 0; i < p->n; i++)
    free(p->own[i]);
  p->n = 0;
  p->oom = false;
}

/* A SQLSTATE as an AH_E* code: agenthost's own (the conditions its statements raise) first. */
static int map_state(const char *st) {
  if (!st || !*st)
    return AH_EIO;
  if (strcmp(st, "AH001") == 0)
    return AH_ENOENT;
  if (strcmp(st, "AH002") == 0)
    return AH_ESTATE;
  if (strcmp(st, "AH003") == 0)
    return AH_EAGENTBUSY;
  if (strcmp(st, "23505") == 0)
    return AH_EEXIST;
  if (strncmp(st, "23", 2) == 0 || strncmp(st, "22", 2) == 0)
    return AH_EINVAL;
  if (strcmp(st, "55P03") == 0 || strcmp(st, "40P01") == 0 || strcmp(st, "40001") == 0 ||
      strcmp(st, "57014") == 0)
    return AH_EBUSY;
  if (strcmp(st, "54000") == 0)
    return AH_E2BIG;
  if (strcmp(st, "53200") == 0)
    return AH_ENOMEM;
  return AH_EIO;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* One statement with a deadline on the client's side: a server that does not answer (a network that drops
 * packets, a paused server) would otherwise hold the caller for ever — libpq waits for an answer as long as
 * the connection stands. Past the deadline the connection is closed (*c = NULL) and NULL is returned with
 * `why` set; the caller opens it again. Otherwise the statement's last result (an error result too). */
static PGresult *await_deadline(PGconn **c, int ms, char *why, size_t cap);

static PGresult *exec_deadline(PGconn **c, const char *sql, int n, const char *const *vals, int ms, char *why,
                               size_t cap) {
  why[0] = '\0';
  if (!PQsendQueryParams(*c, sql, n, NULL, vals, NULL, NULL, 0)) {
    one_line(why, cap, PQerrorMessage(*c));
    return NULL;
  }
  return await_deadline(c, ms, why, cap);
}

/* The answer to what was sent on *c, as exec_deadline. */
static PGresult *await_deadline(PGconn **c, int ms, char *why, size_t cap) {
  why[0] = '\0';
  uint64_t end = now_ms() + (uint64_t)ms;
  PGresult *last = NULL;
  for (;;) {
    while (!PQisBusy(*c)) {
      PGresult *r = PQgetResult(*c);
      if (!r)
        return last;
      PQclear(last);
      last = r;
    }
    uint64_t now = now_ms();
    struct pollfd pfd = {.fd = PQsocket(*c), .events = POLLIN};
    int rc = now >= end ? 0 : poll(&pfd, 1, (int)(end - now));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc == 0) {
      snprintf(why, cap, "no answer from the server in %d ms: the connection is closed and opened again", ms);
      PQclear(last);
      PQfinish(*c);
      *c = NULL;
      return NULL;
    }
    if (rc < 0 || !PQconsumeInput(*c)) {
      one_line(why, cap, PQerrorMessage(*c));
      PQclear(last);
      return NULL;
    }
  }
}

/* ---- rows ------------------------------------------------------------------------------------------------
 */

static json_t *col_text(const PGresult *r, int row, int col) {
  if (PQgetisnull(r, row, col))
    return json_null();
  json_t *s = json_stringn(PQgetvalue(r, row, col), (size_t)PQgetlength(r, row, col));
  return s ? s : json_null();
}

static json_t *col_json(const PGresult *r, int row, int col, json_t *dflt) {
  if (PQgetisnull(r, row, col))
    return dflt ? dflt : json_null();
  json_error_t e;
  json_t *v = json_loadb(PQgetvalue(r, row, col), (size_t)PQgetlength(r, row, col),
                         JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
  if (!v) {
    AH_LOG_E(COMP, "column %s holds invalid JSON: %s", PQfname(r, col), e.text);
    v = json_null();
  }
  json_decref(dflt);
  return v;
}

static long long col_int(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static bool col_bool(const PGresult *r, int row, int col) {
  return !PQgetisnull(r, row, col) && PQgetvalue(r, row, col)[0] == 't';
}

static json_t *row_session(const PGresult *r, int i) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "id", col_text(r, i, 0));
  json_object_set_new(o, "cwd", col_text(r, i, 1));
  json_object_set_new(o, "title", col_text(r, i, 2));
  json_object_set_new(o, "provider", col_text(r, i, 3));
  json_object_set_new(o, "model", col_text(r, i, 4));
  json_object_set_new(o, "parent", col_text(r, i, 5));
  json_object_set_new(o, "local", json_boolean(col_bool(r, i, 6)));
  json_object_set_new(o, "depth", json_integer(col_int(r, i, 7)));
  json_object_set_new(o, "status", col_text(r, i, 8));
  json_object_set_new(o, "closed", json_boolean(col_bool(r, i, 9)));
  json_object_set_new(o, "created", col_json(r, i, 10, NULL));
  json_object_set_new(o, "updated", col_json(r, i, 11, NULL));
  json_object_set_new(o, "policy", col_json(r, i, 12, json_object()));
  json_object_set_new(o, "tags", col_json(r, i, 13, json_array()));
  json_object_set_new(o, "lastSeq", json_integer(col_int(r, i, 14)));
  json_object_set_new(o, "leaseOwner", col_text(r, i, 15));
  json_object_set_new(o, "leaseUntil", json_integer(col_int(r, i, 16)));
  json_object_set_new(o, "settings", col_json(r, i, 17, json_object()));
  json_object_set_new(o, "usage", col_json(r, i, 18, json_object()));
  return o;
}

static json_t *row_event(const PGresult *r, int i) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "cursor", json_integer(col_int(r, i, 0)));
  json_object_set_new(o, "sessionId", col_text(r, i, 1));
  json_object_set_new(o, "seq", json_integer(col_int(r, i, 2)));
  json_object_set_new(o, "kind", col_text(r, i, 3));
  json_object_set_new(o, "time", col_json(r, i, 4, NULL));
  if (!PQgetisnull(r, i, 5))
    json_object_set_new(o, "turnId", col_text(r, i, 5));
  if (!PQgetisnull(r, i, 6))
    json_object_set_new(o, "messageId", col_text(r, i, 6));
  json_object_set_new(o, "data", col_json(r, i, 7, json_object()));
  return o;
}

static json_t *row_inbox(const PGresult *r, int i) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "messageId", col_text(r, i, 0));
  json_object_set_new(o, "sessionId", col_text(r, i, 1));
  json_object_set_new(o, "content", col_json(r, i, 2, NULL));
  json_object_set_new(o, "state", col_text(r, i, 3));
  json_object_set_new(o, "turnId", col_text(r, i, 4));
  json_object_set_new(o, "time", col_json(r, i, 5, NULL));
  return o;
}

static json_t *row_request(const PGresult *r, int i) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "id", col_text(r, i, 0));
  json_object_set_new(o, "sessionId", col_text(r, i, 1));
  json_object_set_new(o, "turnId", col_text(r, i, 2));
  json_object_set_new(o, "kind", col_text(r, i, 3));
  json_object_set_new(o, "params", col_json(r, i, 4, NULL));
  json_object_set_new(o, "options", col_json(r, i, 5, NULL));
  json_object_set_new(o, "state", col_text(r, i, 6));
  json_object_set_new(o, "answer", col_json(r, i, 7, NULL));
  json_object_set_new(o, "created", col_json(r, i, 8, NULL));
  json_object_set_new(o, "resolved", col_json(r, i, 9, NULL));
  return o;
}

static json_t *row_tree(const PGresult *r, int i) {
  return json_pack("{s:o, s:o, s:o}", "id", col_text(r, i, 0), "parent", col_text(r, i, 1), "usage",
                   col_json(r, i, 2, json_object()));
}

/* ---- operations (writer thread) -------------------------------------------------------------------------
 */

/* The statements of the operations: prepared once on each writer connection (prepare_all). */
static const char SQL_SESSION_PUT[] =
    "INSERT INTO sessions (" SESSION_COLS ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, "
    "$13, $14, $15, $16, $17, $18, $19) ON CONFLICT (id) DO UPDATE SET cwd = excluded.cwd, title = "
    "excluded.title, provider = excluded.provider, model = excluded.model, parent = excluded.parent, "
    "\"local\" = excluded.\"local\", depth = excluded.depth, status = excluded.status, closed = "
    "excluded.closed, created = excluded.created, updated = excluded.updated, policy = excluded.policy, "
    "tags = excluded.tags, settings = excluded.settings, \"usage\" = excluded.\"usage\", last_seq = "
    "greatest(sessions.last_seq, excluded.last_seq)";
static const char SQL_EVENT[] =
    "WITH e AS (INSERT INTO events (session_id, seq, kind, \"time\", turn_id, message_id, data, epoch) "
    "VALUES ($1, $2, $3, $4, $5, $6, $7, (SELECT lease_epoch FROM sessions WHERE id = $1)) RETURNING "
    "\"cursor\"), s AS (UPDATE sessions SET last_seq = $2 WHERE id = $1 AND last_seq < $2) SELECT \"cursor\" "
    "FROM e";
static const char SQL_INBOX_PUT[] =
    "WITH i AS (INSERT INTO inbox (message_id, session_id, state, turn_id, created) VALUES ($1, $2, $5, "
    "NULL, $3)) INSERT INTO inbox_content (message_id, content) VALUES ($1, $4)";
static const char SQL_INBOX_STATE[] =
    "WITH u AS (UPDATE inbox SET state = $2, turn_id = coalesce($3, turn_id) WHERE message_id = $1 "
    "RETURNING 1) SELECT agenthost_need((SELECT count(*) FROM u), 'AH001', 'inbox.state: no message ' || "
    "$1)";
static const char SQL_REQUEST_PUT[] =
    "INSERT INTO requests (" REQUEST_COLS ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
static const char SQL_REQUEST_STATE[] =
    "WITH u AS (UPDATE requests SET state = $2, answer = $3, resolved = $4 WHERE id = $1 AND state = "
    "'pending' RETURNING 1), x AS (SELECT EXISTS (SELECT 1 FROM requests WHERE id = $1) AS known) SELECT "
    "agenthost_need((SELECT count(*) FROM u), CASE WHEN x.known THEN 'AH002' ELSE 'AH001' END, "
    "'request.state: request ' || $1 || CASE WHEN x.known THEN ' is already resolved' ELSE ' does not "
    "exist' END) FROM x";
static const char SQL_LEASE[] =
    "WITH u AS (UPDATE sessions SET lease_epoch = lease_epoch + (lease_owner IS DISTINCT FROM $2)::int, "
    "lease_owner = $2, lease_until = " DB_NOW " + $3 WHERE id = $1 AND ("
    "lease_owner IS NULL OR lease_owner = $2 OR lease_owner = $4 OR (lease_until < " DB_NOW
    " AND NOT EXISTS (SELECT 1 FROM owners WHERE owner = sessions.lease_owner AND until >= " DB_NOW
    "))) RETURNING 1), o AS (INSERT INTO owners (owner, until) SELECT $2, " DB_NOW
    " + $3 WHERE EXISTS (SELECT 1 FROM u) ON CONFLICT (owner) DO UPDATE SET until = "
    "greatest(owners.until, excluded.until)) SELECT count(*) FROM u";
static const char SQL_LEASE_RENEW[] =
    "WITH prev AS (SELECT until FROM owners WHERE owner = $1), up AS (INSERT INTO owners (owner, until) "
    "VALUES ($1, " DB_NOW " + $2) ON CONFLICT (owner) DO UPDATE SET until = greatest(owners.until, "
    "excluded.until)), pr AS (DELETE FROM owners WHERE until < " DB_NOW " - $3 AND owner <> $1) SELECT NOT "
    "EXISTS (SELECT 1 FROM prev WHERE until >= " DB_NOW ")";
static const char SQL_LEASE_END[] = "DELETE FROM owners WHERE owner = $1";
static const char SQL_LEASE_RELEASE[] =
    "UPDATE sessions SET lease_owner = NULL, lease_until = 0 WHERE id = $1 AND lease_owner = $2";
static const char SQL_FENCE[] = "SELECT agenthost_fence($1, $2)";
static const char SQL_NOTIFY[] = "SELECT pg_notify('agenthost', $1)";
static const char SQL_NOTIFY_EVENTS[] = "SELECT pg_notify('agenthost', 'events')";
static const char SQL_MARKER[] = "INSERT INTO commit_markers (token) VALUES ($1)";
static const char SQL_MARKER_PRUNE[] = "DELETE FROM commit_markers WHERE at < now() - interval '1 hour'";
static const char SQL_DEL_EVENTS[] = "DELETE FROM events WHERE session_id = $1";
static const char SQL_DEL_INBOX_CONTENT[] =
    "DELETE FROM inbox_content WHERE message_id IN (SELECT message_id FROM inbox WHERE session_id = $1)";
static const char SQL_DEL_INBOX[] = "DELETE FROM inbox WHERE session_id = $1";
static const char SQL_DEL_REQUESTS[] = "DELETE FROM requests WHERE session_id = $1";
static const char SQL_DEL_SESSION[] = "DELETE FROM sessions WHERE id = $1";

static const char *const prepared_sql[] = {
    SQL_SESSION_PUT,       SQL_EVENT,         SQL_INBOX_PUT,    SQL_INBOX_STATE,
    SQL_REQUEST_PUT,       SQL_REQUEST_STATE, SQL_LEASE,        SQL_LEASE_RENEW,
    SQL_LEASE_END,         SQL_LEASE_RELEASE, SQL_FENCE,        SQL_NOTIFY,
    SQL_NOTIFY_EVENTS,     SQL_MARKER,        SQL_MARKER_PRUNE, SQL_DEL_EVENTS,
    SQL_DEL_INBOX_CONTENT, SQL_DEL_INBOX,     SQL_DEL_REQUESTS, SQL_DEL_SESSION,
};
#define PREPARED (sizeof prepared_sql / sizeof prepared_sql[0])

/* Prepare every statement on the writer's connection (after the migration: they name its tables); parsed
 * and planned once per connection instead of once per use. Without them statements are sent as text. */
static void prepare_all(pg_store *q) {
  q->prepared = false;
  for (size_t i = 0; i < PREPARED; i++) {
    char name[16];
    snprintf(name, sizeof name, "ah%zu", i);
    char msg[300] = "";
    PGresult *r = PQsendPrepare(q->w, name, prepared_sql[i], 0, NULL)
                      ? await_deadline(&q->w, WRITE_TIMEOUT_MS, msg, sizeof msg)
                      : NULL;
    bool ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok) {
      if (!msg[0])
        one_line(msg, sizeof msg, q->w ? PQerrorMessage(q->w) : "the connection was closed");
      AH_LOG_W(COMP, "%s: statements cannot be prepared (%s); they are sent as text", q->label, msg);
      return;
    }
  }
  q->prepared = true;
}

/* The prepared name of `sql` ("ahN"), or NULL. */
static const char *prepared_name(const pg_store *q, const char *sql, char *buf, size_t cap) {
  if (!q->prepared)
    return NULL;
  for (size_t i = 0; i < PREPARED; i++)
    if (prepared_sql[i] == sql) {
      snprintf(buf, cap, "ah%zu", i);
      return buf;
    }
  return NULL;
}

/* Every operation is planned as statements whose outcome the server decides (a condition that fails an
 * opset raises an error there: AH001 not found, AH002 already resolved, AH003 the fence), so that a whole
 * group can be sent as one pipeline and its results read afterwards. */

typedef enum res_kind {
  RES_NONE = 0, /* nothing in the opset's results */
  RES_NULL,     /* null */
  RES_CURSOR,   /* the first column, an integer (an event's cursor) */
  RES_TAKEN,    /* true when the first column (a count) is not 0 (a lease) */
  RES_LAPSED,   /* {"lapsed": the first column} (a heartbeat) */
} res_kind;

typedef struct stmt {
  const char *sql; /* NULL: no statement, only a result (store.shrink) */
  char *own_sql;   /* `sql` when built for this operation (session.update) */
  params p;
  res_kind kind;
} stmt;

typedef struct plan {
  stmt *v;
  size_t n, cap;
  bool events; /* an event is written */
  bool oom;
} plan;

static void plan_add(plan *pl, const char *sql, params *p, res_kind kind) {
  if (pl->n == pl->cap) {
    size_t cap = pl->cap ? pl->cap * 2 : 16;
    stmt *v = realloc(pl->v, cap * sizeof *v);
    if (!v) {
      pl->oom = true;
      if (p)
        p_free(p);
      return;
    }
    pl->v = v;
    pl->cap = cap;
  }
  stmt *s = &pl->v[pl->n++];
  memset(s, 0, sizeof *s);
  s->sql = sql;
  if (p) {
    s->p = *p;
    if (p->oom)
      pl->oom = true;
  }
  s->kind = kind;
}

static void plan_free(plan *pl) {
  for (size_t i = 0; i < pl->n; i++) {
    p_free(&pl->v[i].p);
    free(pl->v[i].own_sql);
  }
  free(pl->v);
  memset(pl, 0, sizeof *pl);
}

static const char *get_str(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

static int op_session_put(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const json_t *s = json_object_get(op, "session");
  const char *id = get_str(s, "id");
  const json_t *last_seq = json_object_get(s, "lastSeq");
  const json_t *lease_until = json_object_get(s, "leaseUntil");
  params p = {0};
  p_text(&p, id);
  static const char *const text_keys[] = {"cwd", "title", "provider", "model", "parent"};
  for (int i = 0; i < 5; i++)
    p_str(&p, json_object_get(s, text_keys[i]));
  p_bool(&p, json_is_true(json_object_get(s, "local")));
  p_int(&p, json_integer_value(json_object_get(s, "depth")));
  p_str(&p, json_object_get(s, "status"));
  p_bool(&p, json_is_true(json_object_get(s, "closed")));
  p_scalar(&p, json_object_get(s, "created"));
  p_scalar(&p, json_object_get(s, "updated"));
  p_json(&p, json_object_get(s, "policy"), "{}");
  p_json(&p, json_object_get(s, "tags"), "[]");
  p_int(&p, json_integer_value(last_seq));
  p_str(&p, json_object_get(s, "leaseOwner"));
  p_int(&p, json_integer_value(lease_until));
  p_json(&p, json_object_get(s, "settings"), "{}");
  p_json(&p, json_object_get(s, "usage"), "{}");
  plan_add(pl, SQL_SESSION_PUT, &p, RES_NULL);
  return 0;
}

/* session.update's statement is built from the keys of "set" (each one of ah__store_update_col's, so no
 * caller text reaches the SQL): the text is kept with the statement. */
static int op_session_update(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const char *id = get_str(op, "id");
  const json_t *set = json_object_get(op, "set");
  params p = {0};
  char sql[1024] = "WITH u AS (UPDATE sessions SET id = id";
  size_t len = strlen(sql);
  const char *key = NULL;
  json_t *v = NULL;
  json_object_foreach((json_t *)set, key, v) {
    const ah_store_update_col *c = ah__store_update_col(key);
    if (p.n >= 22)
      break; /* there are fewer fields than that */
    switch (c->kind) {
    case AH_COL_TEXT:
      p_str(&p, v);
      break;
    case AH_COL_BOOL:
      p_bool(&p, json_is_true(v));
      break;
    case AH_COL_INT:
      p_int(&p, json_integer_value(v));
      break;
    default:
      p_json(&p, v, NULL);
      break;
    }
    len += (size_t)snprintf(sql + len, sizeof sql - len, ", %s = $%d", c->column, p.n);
  }
  p_text(&p, id);
  snprintf(sql + len, sizeof sql - len,
           " WHERE id = $%d RETURNING 1) SELECT agenthost_need((SELECT count(*) FROM u), 'AH001', "
           "'session.update: no session ' || $%d)",
           p.n, p.n);
  char *text = strdup(sql);
  if (!text) {
    p_free(&p);
    return AH_ENOMEM;
  }
  plan_add(pl, text, &p, RES_NULL);
  if (pl->oom)
    free(text);
  else
    pl->v[pl->n - 1].own_sql = text;
  return 0;
}

static int op_session_delete(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const char *id = get_str(op, "id");
  static const char *const dels[] = {SQL_DEL_EVENTS, SQL_DEL_INBOX_CONTENT, SQL_DEL_INBOX, SQL_DEL_REQUESTS,
                                     SQL_DEL_SESSION};
  size_t nd = sizeof dels / sizeof dels[0];
  for (size_t i = 0; i < nd; i++) {
    params p = {0};
    p_text(&p, id);
    plan_add(pl, dels[i], &p, i + 1 == nd ? RES_NULL : RES_NONE);
  }
  return 0;
}

static int op_event(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const char *sid = get_str(op, "sessionId");
  const char *kind = get_str(op, "kind");
  const json_t *seq = json_object_get(op, "seq");
  const json_t *turn = json_object_get(op, "turnId");
  const json_t *msg = json_object_get(op, "messageId");
  const json_t *time = json_object_get(op, "time");
  params p = {0};
  p_text(&p, sid);
  p_int(&p, json_integer_value(seq));
  p_text(&p, kind);
  p_scalar(&p, time);
  p_str(&p, turn);
  p_str(&p, msg);
  p_json(&p, json_object_get(op, "data"), "{}");
  plan_add(pl, SQL_EVENT, &p, RES_CURSOR);
  pl->events = true;
  return 0;
}

static int op_inbox_put(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const char *mid = get_str(op, "messageId");
  const char *sid = get_str(op, "sessionId");
  const json_t *content = json_object_get(op, "content");
  const json_t *state = json_object_get(op, "state");
  params p = {0};
  p_text(&p, mid);
  p_text(&p, sid);
  p_scalar(&p, json_object_get(op, "time"));
  p_json(&p, content, NULL);
  p_text(&p, state ? json_string_value(state) : "queued");
  plan_add(pl, SQL_INBOX_PUT, &p, RES_NULL);
  return 0;
}

static int op_inbox_state(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const char *mid = get_str(op, "messageId");
  const char *state = get_str(op, "state");
  const json_t *turn = json_object_get(op, "turnId");
  params p = {0};
  p_text(&p, mid);
  p_text(&p, state);
  p_str(&p, turn);
  plan_add(pl, SQL_INBOX_STATE, &p, RES_NULL);
  return 0;
}

static int op_request_put(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const json_t *r = json_object_get(op, "request");
  const char *id = get_str(r, "id");
  const char *sid = get_str(r, "sessionId");
  const char *kind = get_str(r, "kind");
  const json_t *turn = json_object_get(r, "turnId");
  const json_t *state = json_object_get(r, "state");
  params p = {0};
  p_text(&p, id);
  p_text(&p, sid);
  p_str(&p, turn);
  p_text(&p, kind);
  p_json(&p, json_object_get(r, "params"), NULL);
  p_json(&p, json_object_get(r, "options"), NULL);
  p_text(&p, state ? json_string_value(state) : "pending");
  p_json(&p, json_object_get(r, "answer"), NULL);
  p_scalar(&p, json_object_get(r, "created"));
  p_scalar(&p, json_object_get(r, "resolved"));
  plan_add(pl, SQL_REQUEST_PUT, &p, RES_NULL);
  return 0;
}

/* A request is resolved once: the first answer wins (AH002 for a later one, AH001 for no such request). */
static int op_request_state(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const char *id = get_str(op, "id");
  const char *state = get_str(op, "state");
  params p = {0};
  p_text(&p, id);
  p_text(&p, state);
  p_json(&p, json_object_get(op, "answer"), NULL);
  p_scalar(&p, json_object_get(op, "resolved"));
  plan_add(pl, SQL_REQUEST_STATE, &p, RES_NULL);
  return 0;
}

/* The caller's TTL: until - now (its clock only measures the length; the server's clock places it). */
static long long ttl_of(const json_t *op) {
  return (long long)(json_integer_value(json_object_get(op, "until")) -
                     json_integer_value(json_object_get(op, "now")));
}

static int op_lease(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const char *id = get_str(op, "id");
  const char *owner = get_str(op, "owner");
  const json_t *steal = json_object_get(op, "steal");
  params p = {0};
  p_text(&p, id);
  p_text(&p, owner);
  p_int(&p, ttl_of(op));
  p_str(&p, steal);
  /* Taken: the owner's heartbeat keeps it from now on (lease.renew). */
  plan_add(pl, SQL_LEASE, &p, RES_TAKEN);
  return 0;
}

#define OWNER_PRUNE_MS (24ll * 3600 * 1000)

/* lease.renew: the process's heartbeat; lapsed when it had run out before (by the server's clock). */
static int op_lease_renew(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  const char *owner = get_str(op, "owner");
  params p = {0};
  p_text(&p, owner);
  p_int(&p, ttl_of(op));
  p_int(&p, OWNER_PRUNE_MS);
  plan_add(pl, SQL_LEASE_RENEW, &p, RES_LAPSED);
  return 0;
}

static int op_store_shrink(pg_store *q, const json_t *op, plan *pl) {
  (void)q;
  (void)q;
  (void)op;
  plan_add(pl, NULL, NULL, RES_NULL); /* the server keeps the caches */
  return 0;
}

/* The operations whose statement takes string fields of the operation as they are: lease.end, lease.release,
 * notify (delivered to every listening host once, and only if, the transaction commits) and the fence
 * (agenthost_fence locks the session's row until the transaction ends, so that a takeover cannot commit
 * between this check and this transaction's commit; AH003 when another owner, or none, holds it). */
static const struct {
  const char *sql;
  const char *fields[2];
} simple_ops[] = {
    [AH_OP_LEASE_END] = {SQL_LEASE_END, {"owner", NULL}},
    [AH_OP_LEASE_RELEASE] = {SQL_LEASE_RELEASE, {"id", "owner"}},
    [AH_OP_NOTIFY] = {SQL_NOTIFY, {"payload", NULL}},
    [AH_OP_FENCE] = {SQL_FENCE, {"id", "owner"}},
};

static int op_simple(pg_store *q, ah_store_op kind, const json_t *op, plan *pl) {
  (void)q;
  params p = {0};
  for (int i = 0; i < 2 && simple_ops[kind].fields[i]; i++)
    p_text(&p, get_str(op, simple_ops[kind].fields[i]));
  plan_add(pl, simple_ops[kind].sql, &p, RES_NULL);
  return 0;
}

/* The operations by kind (store_ops.h): each may rely on the checks ah__store_op_check made. */
static int (*const ops[AH_OP_STORE_SHRINK + 1])(pg_store *q, const json_t *op, plan *pl) = {
    [AH_OP_EVENT] = op_event,
    [AH_OP_SESSION_PUT] = op_session_put,
    [AH_OP_SESSION_UPDATE] = op_session_update,
    [AH_OP_SESSION_DELETE] = op_session_delete,
    [AH_OP_INBOX_PUT] = op_inbox_put,
    [AH_OP_INBOX_STATE] = op_inbox_state,
    [AH_OP_REQUEST_PUT] = op_request_put,
    [AH_OP_REQUEST_STATE] = op_request_state,
    [AH_OP_LEASE] = op_lease,
    [AH_OP_LEASE_RENEW] = op_lease_renew,
    [AH_OP_STORE_SHRINK] = op_store_shrink,
};

/* Plan one opset into `pl` (its statements appended); an invalid operation fails the opset before anything
 * is sent. */
static int plan_opset(pg_store *q, const json_t *opset, plan *pl, size_t *failed_at) {
  size_t i = 0;
  const json_t *op = NULL;
  json_array_foreach(opset, i, op) {
    *failed_at = i;
    ah_store_op kind = ah__store_op_check(op, q->err, sizeof q->err);
    if (kind == AH_OP_INVALID)
      return AH_EINVAL;
    int rc = simple_ops[kind < sizeof simple_ops / sizeof simple_ops[0] ? kind : 0].sql
                 ? op_simple(q, kind, op, pl)
                 : ops[kind](q, op, pl);
    if (rc < 0)
      return rc;
    if (pl->oom)
      return AH_ENOMEM;
  }
  return 0;
}

/* What a statement's result adds to its opset's results. */
static void take_result(const stmt *s, const PGresult *r, json_t *res) {
  switch (s->kind) {
  case RES_NULL:
    json_array_append_new(res, json_null());
    break;
  case RES_CURSOR:
    json_array_append_new(res, json_integer(r && PQntuples(r) ? col_int(r, 0, 0) : 0));
    break;
  case RES_TAKEN:
    json_array_append_new(res, json_boolean(r && PQntuples(r) && col_int(r, 0, 0) > 0));
    break;
  case RES_LAPSED:
    json_array_append_new(res, json_pack("{s:b}", "lapsed", r && PQntuples(r) && col_bool(r, 0, 0)));
    break;
  default:
    break;
  }
}

/* The error of a failed statement: its code, with q->err set. */
static int result_error(pg_store *q, const PGresult *r) {
  const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
  const char *primary = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
  char msg[400];
  one_line(msg, sizeof msg, primary ? primary : r ? PQresultErrorMessage(r) : PQerrorMessage(q->w));
  set_err(q, "%s", msg);
  if (st && strcmp(st, "53100") == 0)
    note_health(q, AH_STORE_FULL, q->err);
  if (!q->w || PQstatus(q->w) != CONNECTION_OK)
    return AH_EIO;
  return map_state(st);
}

/* Run `sql` with `p` on the writer; returns 0 with *out (may be NULL: cleared) or an AH_E* code with q->err
 * set. The parameters are freed unless `keep`. */
static int wexec_p(pg_store *q, const char *sql, params *p, bool keep, PGresult **out) {
  if (out)
    *out = NULL;
  if (p && p->oom) {
    if (!keep)
      p_free(p);
    set_err(q, "out of memory");
    return AH_ENOMEM;
  }
  if (!q->w) {
    if (p && !keep)
      p_free(p);
    set_err(q, "no connection to the server");
    return AH_EIO;
  }
  char late[200];
  PGresult *res =
      exec_deadline(&q->w, sql, p ? p->n : 0, p ? p->v : NULL, WRITE_TIMEOUT_MS, late, sizeof late);
  if (p && !keep)
    p_free(p);
  if (!q->w) {
    set_err(q, "%s", late);
    return AH_EIO;
  }
  ExecStatusType s = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
    if (out)
      *out = res;
    else
      PQclear(res);
    return 0;
  }
  int rc = result_error(q, res);
  PQclear(res);
  return rc;
}

static int wexec(pg_store *q, const char *sql, params *p, PGresult **out) {
  return wexec_p(q, sql, p, false, out);
}

static int wexec_sql(pg_store *q, const char *sql) {
  return wexec(q, sql, NULL, NULL);
}

static void fail_all(json_t **results, int *statuses, size_t n, int code) {
  for (size_t i = 0; i < n; i++) {
    json_decref(results[i]);
    results[i] = NULL;
    statuses[i] = code;
  }
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* The answer to COMMIT was lost with the connection: reconnect and look for the group's marker. 1: it
 * committed, 0: it did not, -1: still unknown after UNKNOWN_COMMIT_WAIT_MS. */
static int commit_outcome(pg_store *q, const char *token) {
  long waited = 0;
  for (long delay = 10;; delay = delay < 1000 ? delay * 10 : 1000) {
    if (writer_ready(q)) {
      params p = {0};
      p_text(&p, token);
      PGresult *r = NULL;
      if (wexec(q, "SELECT 1 FROM commit_markers WHERE token = $1", &p, &r) == 0) {
        int found = PQntuples(r) > 0;
        PQclear(r);
        return found;
      }
    }
    if (waited >= UNKNOWN_COMMIT_WAIT_MS)
      return -1;
    sleep_ms(delay);
    waited += delay;
  }
}

/* A group: the opsets' plans (planned[i] != 0: opset i failed, with that code, and is left out). */
typedef struct group {
  size_t n;
  plan *plans;
  int *planned;
  bool events;
  char token[40];
} group;

/* The statements every group ends with, before COMMIT: the events' signal, the marker, now and then the
 * markers' pruning. */
static void tail_statements(pg_store *q, group *g, plan *tail) {
  bool events = false;
  for (size_t i = 0; i < g->n; i++)
    events = events || (!g->planned[i] && g->plans[i].events);
  if (events)
    plan_add(tail, SQL_NOTIFY_EVENTS, NULL, RES_NONE);
  params p = {0};
  p_text(&p, g->token);
  plan_add(tail, SQL_MARKER, &p, RES_NONE);
  if ((q->groups + 1) % MARKER_PRUNE_EVERY == 0)
    plan_add(tail, SQL_MARKER_PRUNE, NULL, RES_NONE);
}

typedef struct pl_stmt {
  const char *sql;
  const params *p;
  size_t opset; /* SIZE_MAX: a statement of the group, not of an opset */
  const stmt *s;
  bool commit;
} pl_stmt;

/* A result the answers did not bring (lost with the connection after a commit its marker confirmed), read
 * again from what the transaction wrote. */
static json_t *result_again(pg_store *q, const stmt *s) {
  PGresult *r = NULL;
  json_t *v = json_null();
  params p = {0};
  if (s->kind == RES_CURSOR) { /* the event's cursor, by its session and seq */
    p_text(&p, s->p.v[0]);
    p_text(&p, s->p.v[1]);
    if (wexec(q, "SELECT \"cursor\" FROM events WHERE session_id = $1 AND seq = $2::bigint", &p, &r) == 0 &&
        PQntuples(r))
      v = json_integer(col_int(r, 0, 0));
  } else if (s->kind == RES_TAKEN) { /* the lease: whether its owner holds it */
    p_text(&p, s->p.v[0]);
    p_text(&p, s->p.v[1]);
    v = json_false();
    if (wexec(q, "SELECT 1 FROM sessions WHERE id = $1 AND lease_owner = $2", &p, &r) == 0 && PQntuples(r))
      v = json_true();
  } else if (s->kind == RES_LAPSED) {
    v = json_pack("{s:b}", "lapsed", 1); /* unknown: the caller checks its sessions, as after a lapse */
  }
  PQclear(r);
  return v;
}

/* The opsets' results from what the pipeline returned: results[i] holds one entry per statement of opset
 * i that has a result, in order (short when the answers were lost: read again). */
static void pipelined_results(pg_store *q, group *g, json_t **results, int *statuses) {
  for (size_t i = 0; i < g->n; i++) {
    if (g->planned[i])
      continue;
    json_t *res = json_array();
    json_t *got = results[i];
    size_t ri = 0;
    for (size_t k = 0; k < g->plans[i].n; k++) {
      const stmt *s = &g->plans[i].v[k];
      if (!s->sql) {
        take_result(s, NULL, res);
      } else if (s->kind != RES_NONE) {
        json_t *v = json_array_get(got, ri++);
        json_array_append_new(res, v ? json_incref(v) : result_again(q, s));
      }
    }
    json_decref(got);
    results[i] = res;
    statuses[i] = 0;
  }
}

/* Statements sent between two syncs (AGENTHOST_PG_PIPELINE_BATCH: 1 to 4096, default 256). */
static size_t pipeline_batch(void) {
  const char *v = getenv("AGENTHOST_PG_PIPELINE_BATCH");
  long n = v ? strtol(v, NULL, 10) : 0;
  return n >= 1 && n <= 4096 ? (size_t)n : 256;
}

/* Write the group as one pipeline: every statement sent before its answer is read, so a group costs one
 * round trip and one flush of the server's log. Returns 1 when its outcome is known (written, or failed as a
 * whole: statuses set); 0 when opset *bad failed (its code in *code) and the rest must be sent again
 * without it (nothing was written: the transaction was rolled back). */
static int write_pipelined(pg_store *q, group *g, json_t **results, int *statuses, size_t *bad, int *code) {
  *bad = SIZE_MAX;
  *code = AH_EIO;
  plan tail = {0};
  tail_statements(q, g, &tail);
  size_t total = 3 + tail.n;
  bool events = false;
  for (size_t i = 0; i < g->n; i++) {
    total += g->planned[i] ? 0 : g->plans[i].n;
    events = events || (!g->planned[i] && g->plans[i].events);
  }
  pl_stmt *list = calloc(total, sizeof *list);
  if (!list || tail.oom) {
    free(list);
    plan_free(&tail);
    fail_all(results, statuses, g->n, AH_ENOMEM);
    return 1;
  }
  size_t n = 0;
  list[n++] = (pl_stmt){"BEGIN", NULL, SIZE_MAX, NULL, false};
  /* Cursors in commit order across hosts: the events are numbered under a lock held to the commit. */
  if (events)
    list[n++] = (pl_stmt){"SELECT pg_advisory_xact_lock(" LOCK_EVENTS ")", NULL, SIZE_MAX, NULL, false};
  for (size_t i = 0; i < g->n; i++) {
    if (g->planned[i])
      continue;
    /* No savepoint per opset: a statement that fails aborts the whole transaction, and the group is sent
     * again without that opset (write_group). */
    for (size_t k = 0; k < g->plans[i].n; k++) {
      const stmt *s = &g->plans[i].v[k];
      if (s->sql)
        list[n++] = (pl_stmt){s->sql, &s->p, i, s, false};
    }
  }
  for (size_t k = 0; k < tail.n; k++)
    list[n++] = (pl_stmt){tail.v[k].sql, &tail.v[k].p, SIZE_MAX, NULL, false};
  list[n++] = (pl_stmt){"COMMIT", NULL, SIZE_MAX, NULL, true};
  for (size_t i = 0; i < g->n; i++)
    results[i] = g->planned[i] ? NULL : json_array();

  PGconn *c = q->w;
  bool failed = false, sent_commit = false;
  size_t failed_at = SIZE_MAX;
  int result = 1;
  if (PQsetnonblocking(c, 1) != 0 || !PQenterPipelineMode(c)) {
    set_err(q, "cannot enter pipeline mode: %s", PQerrorMessage(c));
    goto broken;
  }
  size_t sent = 0, read = 0, per = pipeline_batch();
  size_t syncs_sent = 0, syncs_seen = 0;
  bool have = false;
  uint64_t end = now_ms() + WRITE_TIMEOUT_MS;
  for (;;) {
    /* A batch, then a sync: between two batches the server is idle in the transaction, so that a writer
     * stopped there (a paused process) is cut off by idle_in_transaction_session_timeout; inside a batch
     * it would be "active" and hold its locks for as long as it stays stopped. After a failure nothing
     * more is sent. */
    if (!failed && sent < n) {
      size_t batch = 0;
      while (sent < n && batch < per) {
        const pl_stmt *e = &list[sent];
        char name[16];
        const char *prep = prepared_name(q, e->sql, name, sizeof name);
        int np = e->p ? e->p->n : 0;
        const char *const *pv = e->p ? e->p->v : NULL;
        if (!(prep ? PQsendQueryPrepared(c, prep, np, pv, NULL, NULL, 0)
                   : PQsendQueryParams(c, e->sql, np, NULL, pv, NULL, NULL, 0)))
          goto broken;
        sent_commit = sent_commit || e->commit;
        sent++;
        batch++;
      }
      if (!PQpipelineSync(c))
        goto broken;
      syncs_sent++;
    }
    int f = PQflush(c);
    if (f < 0 || !PQconsumeInput(c))
      goto broken;
    bool progressed = false;
    while (!PQisBusy(c)) {
      PGresult *r = PQgetResult(c);
      if (!r) {
        if (!have)
          break;
        have = false;
        read++;
        progressed = true;
        continue;
      }
      ExecStatusType st = PQresultStatus(r);
      if (st == PGRES_PIPELINE_SYNC) {
        syncs_seen++;
        have = false;
        PQclear(r);
        progressed = true;
        if (syncs_seen == syncs_sent)
          break;
        continue;
      }
      const pl_stmt *e = read < n ? &list[read] : NULL;
      if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        if (e && e->s && !failed)
          take_result(e->s, r, results[e->opset]);
      } else if (!failed) { /* the first failure: the server skips the rest of its batch */
        failed = true;
        failed_at = read;
        *code = result_error(q, r);
      }
      have = true;
      PQclear(r);
      progressed = true;
    }
    if (syncs_seen == syncs_sent && (sent == n || failed))
      break;
    /* More to send: sent at once, unless the output buffer is full; else wait for answers. */
    bool more = !failed && sent < n;
    if ((more && f == 1) || (!more && !progressed)) {
      uint64_t now = now_ms();
      if (now >= end) {
        set_err(q, "no answer from the server in %d ms: the connection is closed and opened again",
                WRITE_TIMEOUT_MS);
        goto lost;
      }
      struct pollfd pfd = {.fd = PQsocket(c), .events = POLLIN | (f == 1 ? POLLOUT : 0)};
      if (poll(&pfd, 1, (int)(end - now)) < 0 && errno != EINTR)
        goto broken;
    }
  }
  PQexitPipelineMode(c);
  PQsetnonblocking(c, 0);
  if (!failed) {
    pipelined_results(q, g, results, statuses);
    q->groups++;
    note_commit(q);
    goto done;
  }
  /* A statement failed: nothing was written. One of an opset leaves that opset out; one of the group's own
   * (a lock not given in time, the commit) fails the whole group. */
  if (PQtransactionStatus(c) != PQTRANS_IDLE)
    wexec_sql(q, "ROLLBACK");
  if (failed_at < n && list[failed_at].opset != SIZE_MAX) {
    *bad = list[failed_at].opset;
    result = 0;
    goto clear;
  }
  AH_LOG_E(COMP, "%s: transaction failed, %zu opsets not written: %s", q->label, g->n, q->err);
  fail_all(results, statuses, g->n, *code == AH_EBUSY ? AH_EBUSY : AH_EIO);
  goto done;

broken:
  one_line(q->err, sizeof q->err, PQerrorMessage(c));
lost:
  PQfinish(q->w);
  q->w = NULL;
  if (!sent_commit) { /* nothing was committed: the group fails as a whole (and is tried again) */
    AH_LOG_W(COMP, "%s: the connection was lost, %zu opsets not written: %s", q->label, g->n, q->err);
    fail_all(results, statuses, g->n, AH_EIO);
    goto done;
  }
  {
    char why[512];
    snprintf(why, sizeof why, "%s", q->err);
    int outcome = commit_outcome(q, g->token);
    if (outcome == 1) {
      AH_LOG_W(COMP, "%s: the answer to a commit was lost (%s); its marker shows it committed", q->label,
               why);
      pipelined_results(q, g, results, statuses);
      q->groups++;
      note_commit(q);
      goto done;
    }
    if (outcome < 0) {
      AH_LOG_E(COMP, "%s: the outcome of a commit of %zu opsets is unknown (%s)", q->label, g->n, why);
      note_health(q, AH_STORE_DAMAGED, why);
    } else {
      AH_LOG_W(COMP, "%s: a commit's answer was lost (%s); its marker shows it did not commit", q->label,
               why);
    }
    fail_all(results, statuses, g->n, outcome < 0 ? AH_ETIMEDOUT : AH_EIO);
    goto done;
  }
clear:
  for (size_t i = 0; i < g->n; i++) {
    json_decref(results[i]);
    results[i] = NULL;
  }
done:
  free(list);
  plan_free(&tail);
  return result;
}

static void pg_write_group(void *impl, json_t *const *opsets, size_t n, json_t **results, int *statuses) {
  pg_store *q = impl;
  for (size_t i = 0; i < n; i++) {
    results[i] = NULL;
    statuses[i] = AH_EIO;
  }
  if (q->read_only) {
    fail_all(results, statuses, n, AH_EPERM);
    return;
  }
  if (!writer_ready(q)) {
    AH_LOG_E(COMP, "%s: %zu opsets not written: %s", q->label, n, q->err);
    fail_all(results, statuses, n, AH_EIO);
    return;
  }
  group g = {.n = n, .plans = calloc(n, sizeof(plan)), .planned = calloc(n, sizeof(int))};
  if (!g.plans || !g.planned) {
    free(g.plans);
    free(g.planned);
    fail_all(results, statuses, n, AH_ENOMEM);
    return;
  }
  ah__uuid7(g.token);
  size_t left = 0;
  for (size_t i = 0; i < n; i++) {
    size_t at = 0;
    int rc = plan_opset(q, opsets[i], &g.plans[i], &at);
    if (rc < 0) {
      g.planned[i] = rc;
      AH_LOG_W(COMP, "opset failed at operation %zu (%s): %s", at, ah_err_name(rc), q->err);
    } else {
      left++;
    }
  }
  /* The group in one pipeline; an opset that fails is left out and the rest sent again (nothing of the
   * failed attempt was written), so that it fails alone, as on SQLite. */
  while (left > 0) {
    size_t bad = SIZE_MAX;
    int code = AH_EIO;
    if (write_pipelined(q, &g, results, statuses, &bad, &code))
      break;
    AH_LOG_W(COMP, "opset failed (%s): %s", ah_err_name(code), q->err);
    g.planned[bad] = code;
    left--;
  }
  for (size_t i = 0; i < n; i++) {
    if (g.planned[i]) {
      json_decref(results[i]);
      results[i] = NULL;
      statuses[i] = g.planned[i];
    }
    plan_free(&g.plans[i]);
  }
  free(g.plans);
  free(g.planned);
}

/* ---- reads (loop thread) ------------------------------------------------------------------------------- */

/* Run a read; an array of rows, or the first row alone when `single` (json NULL when none). NULL on error
 * (logged; read_failed set). A connection found broken is opened again once. */
static json_t *collect(pg_store *q, const char *sql, params *p, json_t *(*row)(const PGresult *, int),
                       bool single) {
  q->read_failed = false;
  PGresult *r = NULL;
  if (p->oom) {
    p_free(p);
    q->read_failed = true;
    return NULL;
  }
  for (int attempt = 0; attempt < 2; attempt++) {
    if (!reader_ready(q))
      break;
    char late[200];
    r = exec_deadline(&q->r, sql, p->n, p->v, READ_TIMEOUT_MS, late, sizeof late);
    if (r && PQresultStatus(r) == PGRES_TUPLES_OK)
      break;
    bool broken = !q->r || PQstatus(q->r) != CONNECTION_OK;
    char msg[300];
    if (late[0])
      snprintf(msg, sizeof msg, "%s", late);
    else
      one_line(msg, sizeof msg, r ? PQresultErrorMessage(r) : PQerrorMessage(q->r));
    AH_LOG_E(COMP, "%s: read failed: %s", q->label, msg);
    PQclear(r);
    r = NULL;
    if (!broken)
      break;
  }
  p_free(p);
  if (!r) {
    q->read_failed = true;
    return NULL;
  }
  json_t *out = single ? NULL : json_array();
  int rows = PQntuples(r);
  for (int i = 0; i < rows; i++) {
    json_t *o = row(r, i);
    if (single) {
      out = o;
      break;
    }
    json_array_append_new(out, o);
  }
  PQclear(r);
  return out;
}

static void p_limit(params *p, size_t limit) {
  if (limit == 0 || limit > (size_t)INT64_MAX)
    p_text(p, NULL); /* LIMIT NULL: no limit */
  else
    p_int(p, (long long)limit);
}

static json_t *pg_get_session(void *impl, const char *id) {
  params p = {0};
  p_text(&p, id);
  return collect(impl, "SELECT " SESSION_COLS " FROM sessions WHERE id = $1", &p, row_session, true);
}

static json_t *pg_list_sessions(void *impl, const char *after_id, size_t limit) {
  params p = {0};
  p_limit(&p, limit);
  if (!after_id)
    return collect(impl, "SELECT " SESSION_COLS " FROM sessions ORDER BY id LIMIT $1", &p, row_session,
                   false);
  p_text(&p, after_id);
  return collect(impl,
                 "SELECT " SESSION_COLS " FROM sessions WHERE id > $2 ORDER BY id "
                 "LIMIT $1",
                 &p, row_session, false);
}

static json_t *pg_events(void *impl, const char *session_id, int64_t after_seq, size_t limit) {
  params p = {0};
  p_limit(&p, limit);
  p_text(&p, session_id);
  p_int(&p, after_seq);
  return collect(impl,
                 "SELECT " EVENT_COLS " FROM events WHERE session_id = $2 AND seq > $3 ORDER BY seq LIMIT $1",
                 &p, row_event, false);
}

static json_t *pg_events_after(void *impl, int64_t after_cursor, size_t limit) {
  params p = {0};
  p_limit(&p, limit);
  p_int(&p, after_cursor);
  return collect(impl, "SELECT " EVENT_COLS " FROM events WHERE \"cursor\" > $2 ORDER BY \"cursor\" LIMIT $1",
                 &p, row_event, false);
}

static json_t *pg_inbox_open(void *impl, const char *session_id) {
  params p = {0};
  p_text(&p, session_id);
  return collect(impl,
                 "SELECT " INBOX_COLS " FROM " INBOX_FROM " WHERE i.session_id = $1 AND i." OPEN_INBOX
                 " ORDER BY i.n",
                 &p, row_inbox, false);
}

static json_t *pg_requests_pending(void *impl, const char *session_id) {
  params p = {0};
  if (!session_id)
    return collect(impl, "SELECT " REQUEST_COLS " FROM requests WHERE state = 'pending' ORDER BY n", &p,
                   row_request, false);
  p_text(&p, session_id);
  return collect(
      impl, "SELECT " REQUEST_COLS " FROM requests WHERE state = 'pending' AND session_id = $1 ORDER BY n",
      &p, row_request, false);
}

static json_t *pg_get_request(void *impl, const char *id) {
  params p = {0};
  p_text(&p, id);
  return collect(impl, "SELECT " REQUEST_COLS " FROM requests WHERE id = $1", &p, row_request, true);
}

static json_t *pg_sessions_to_recover(void *impl) {
  params p = {0};
  return collect(impl,
                 "SELECT " SESSION_COLS " FROM sessions WHERE NOT closed AND (status = 'running' OR EXISTS "
                 "(SELECT 1 FROM inbox WHERE inbox.session_id = sessions.id AND inbox." OPEN_INBOX
                 ")) ORDER BY id",
                 &p, row_session, false);
}

static json_t *pg_session_tree(void *impl, const char *id) {
  params p = {0};
  p_text(&p, id);
  return collect(
      impl,
      "WITH RECURSIVE tree(id, d) AS (SELECT id, 0 FROM sessions WHERE id = $1 UNION SELECT s.id, "
      "t.d + 1 FROM sessions s JOIN tree t ON s.parent = t.id WHERE t.d < 64) SELECT s.id, s.parent, "
      "s.\"usage\" FROM sessions s WHERE s.id IN (SELECT id FROM tree) ORDER BY s.id",
      &p, row_tree, false);
}

static json_t *row_cursor(const PGresult *r, int i) {
  return json_integer(col_int(r, i, 0));
}

static int64_t pg_last_cursor(void *impl) {
  params p = {0};
  json_t *v = collect(impl, "SELECT coalesce(max(\"cursor\"), 0) FROM events", &p, row_cursor, true);
  int64_t c = v ? json_integer_value(v) : -1;
  json_decref(v);
  return c;
}

static json_t *row_posted(const PGresult *r, int i) {
  return json_pack("{s:o, s:o, s:b}", "id", col_text(r, i, 0), "leaseOwner", col_text(r, i, 1), "free",
                   col_bool(r, i, 2));
}

static json_t *pg_posted(void *impl) {
  params p = {0};
  return collect(
      impl,
      "SELECT s.id, s.lease_owner, (s.lease_owner IS NULL OR (s.lease_until < " DB_NOW
      " AND NOT EXISTS (SELECT 1 FROM owners o WHERE o.owner = s.lease_owner AND o.until >= " DB_NOW
      "))) FROM sessions s WHERE NOT s.closed AND EXISTS (SELECT 1 FROM inbox i WHERE i.session_id = "
      "s.id AND i.state = 'posted') ORDER BY s.id",
      &p, row_posted, false);
}

/* ---- signals (loop thread) ------------------------------------------------------------------------- */

static int pg_watch_open(void *impl, char **why) {
  pg_store *q = impl;
  if (q->l)
    return AH_ESTATE;
  q->l = connect_one(q, CONN_LISTENER, why);
  if (!q->l)
    return AH_EIO;
  /* With a deadline: a network that drops packets would hold the reader thread for ever. */
  char msg[300] = "";
  PGresult *r = exec_deadline(&q->l, "LISTEN agenthost", 0, NULL, READ_TIMEOUT_MS, msg, sizeof msg);
  bool ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
  PQclear(r);
  if (!ok || PQsetnonblocking(q->l, 1) != 0) {
    if (!msg[0])
      one_line(msg, sizeof msg, q->l ? PQerrorMessage(q->l) : "the connection was closed");
    set_why(why, "store: %s: LISTEN: %s", q->label, msg);
    PQfinish(q->l);
    q->l = NULL;
    return AH_EIO;
  }
  return PQsocket(q->l);
}

static int pg_watch_read(void *impl, void (*fn)(const char *payload, void *arg), void *arg) {
  pg_store *q = impl;
  if (!q->l || !PQconsumeInput(q->l))
    return AH_EIO;
  PGnotify *n = NULL;
  while ((n = PQnotifies(q->l)) != NULL) {
    fn(n->extra ? n->extra : "", arg);
    PQfreemem(n);
  }
  return PQstatus(q->l) == CONNECTION_OK ? 0 : AH_EIO;
}

static void pg_watch_close(void *impl) {
  pg_store *q = impl;
  PQfinish(q->l);
  q->l = NULL;
}

/* ---- open / close ---------------------------------------------------------------------------------- */

static void pg_close(void *impl) {
  pg_store *q = impl;
  if (!q)
    return;
  PQfinish(q->w);
  PQfinish(q->r);
  PQfinish(q->l);
  pthread_mutex_destroy(&q->health_mu);
  free(q->conninfo);
  if (q->password) {
    explicit_bzero(q->password, strlen(q->password));
    free(q->password);
  }
  free(q);
}

/* One statement on a connection during open; 0 or AH_EIO with *why. */
static int open_exec(pg_store *q, PGconn *c, const char *sql, PGresult **out, char **why) {
  PGresult *r = PQexec(c, sql);
  ExecStatusType s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
    if (out)
      *out = r;
    else
      PQclear(r);
    return 0;
  }
  char msg[300];
  one_line(msg, sizeof msg, r ? PQresultErrorMessage(r) : PQerrorMessage(c));
  set_why(why, "store: %s: %s", q->label, msg);
  PQclear(r);
  return AH_EIO;
}

/* The database's schema version: 0 for a database without agenthost's tables, -1 for one that has tables
 * of agenthost's names but no version (not agenthost's: refused). */
static int read_version(pg_store *q, PGconn *c, int *version, char **why) {
  PGresult *r = NULL;
  int rc = open_exec(
      q, c, "SELECT to_regclass('agenthost_schema') IS NOT NULL, to_regclass('sessions') IS NOT NULL", &r,
      why);
  if (rc < 0)
    return rc;
  bool has_version = col_bool(r, 0, 0), has_sessions = col_bool(r, 0, 1);
  PQclear(r);
  if (!has_version) {
    *version = has_sessions ? -1 : 0;
    return 0;
  }
  if ((rc = open_exec(q, c, "SELECT max(version) FROM agenthost_schema", &r, why)) < 0)
    return rc;
  *version = (int)col_int(r, 0, 0);
  PQclear(r);
  return 0;
}

static int check_version(pg_store *q, int version, char **why) {
  if (version < 0) {
    set_why(why,
            "store: %s has a sessions table but no agenthost_schema: not an agenthost database; refusing to "
            "use it",
            q->label);
    return AH_ECONFIG;
  }
  if (version > PG_SCHEMA_VERSION) {
    set_why(why,
            "store: %s has schema version %d, newer than version %d that this agenthost knows; refusing to "
            "open it (upgrade agenthost)",
            q->label, version, PG_SCHEMA_VERSION);
    return AH_ECONFIG;
  }
  return 0;
}

static int migrate(pg_store *q, char **why) {
  int rc = open_exec(q, q->w, "BEGIN", NULL, why);
  if (rc == 0)
    rc = open_exec(q, q->w, "SELECT pg_advisory_xact_lock(" LOCK_MIGRATE ")", NULL, why);
  int version = 0;
  if (rc == 0)
    rc = read_version(q, q->w, &version, why);
  if (rc == 0)
    rc = check_version(q, version, why);
  if (rc == 0 && version == 0)
    rc = open_exec(q, q->w, "CREATE TABLE agenthost_schema (version integer NOT NULL)", NULL, why);
  for (int i = version; rc == 0 && i < PG_SCHEMA_VERSION; i++) {
    char sql[96];
    snprintf(sql, sizeof sql, "DELETE FROM agenthost_schema; INSERT INTO agenthost_schema VALUES (%d)",
             i + 1);
    rc = open_exec(q, q->w, pg_migrations[i], NULL, why);
    if (rc == 0)
      rc = open_exec(q, q->w, sql, NULL, why);
    if (rc == 0)
      AH_LOG_I(COMP, "%s: schema migrated to version %d", q->label, i + 1);
  }
  if (rc == 0)
    rc = open_exec(q, q->w, "COMMIT", NULL, why);
  if (rc < 0)
    PQclear(PQexec(q->w, "ROLLBACK"));
  return rc;
}

static int pg_open(const ah_store_opts *opts, void **impl, char **why) {
  *impl = NULL;
  if (why)
    *why = NULL;
  if (!opts->url || !*opts->url) {
    set_why(why, "store: no PostgreSQL connection string");
    return AH_EINVAL;
  }
  /* A password inside the connection string would travel wherever the string does: refused. */
  char *perr = NULL;
  PQconninfoOption *parsed = PQconninfoParse(opts->url, &perr);
  bool has_password = false;
  for (PQconninfoOption *o = parsed; o && o->keyword; o++)
    if (strcmp(o->keyword, "password") == 0 && o->val && *o->val)
      has_password = true;
  PQconninfoFree(parsed);
  if (!parsed || has_password) {
    char msg[200];
    one_line(msg, sizeof msg, perr);
    PQfreemem(perr);
    set_why(why,
            has_password ? "store: the PostgreSQL connection string holds a password; give it apart "
                           "(store_password_file, or AGENTHOST_HOST_STORE_PASSWORD)"
                         : "store: the PostgreSQL connection string is not valid: %s",
            msg);
    return AH_ECONFIG;
  }
  pg_store *q = calloc(1, sizeof *q);
  if (!q || !(q->conninfo = strdup(opts->url)) ||
      (opts->password && !(q->password = strdup(opts->password)))) {
    if (q)
      free(q->conninfo);
    free(q);
    set_why(why, "store: out of memory");
    return AH_ENOMEM;
  }
  pthread_mutex_init(&q->health_mu, NULL);
  q->sync = opts->sync;
  q->read_only = opts->read_only;
  /* A label without the connection string (it may hold a password): filled from the connection. */
  snprintf(q->label, sizeof q->label, "postgresql (unknown)");
  int rc = 0;
  if (!q->read_only && !(q->w = connect_one(q, CONN_WRITER, why)))
    rc = AH_EIO;
  if (rc == 0 && !q->read_only)
    rc = migrate(q, why);
  if (rc == 0 && !q->read_only)
    prepare_all(q);
  if (rc == 0 && !(q->r = connect_one(q, CONN_READER, why)))
    rc = AH_EIO;
  if (rc == 0 && q->read_only) {
    int version = 0;
    rc = read_version(q, q->r, &version, why);
    if (rc == 0)
      rc = check_version(q, version, why);
    if (rc == 0 && version < PG_SCHEMA_VERSION) {
      set_why(why,
              "store: %s has schema version %d, older than version %d; open it once read-write to migrate it",
              q->label, version, PG_SCHEMA_VERSION);
      rc = version == 0 ? AH_ENOENT : AH_ECONFIG;
    }
  }
  if (rc < 0) {
    AH_LOG_E(COMP, "%s", why && *why ? *why : "cannot open the store");
    pg_close(q);
    return rc;
  }
  *impl = q;
  return 0;
}

const ah_store_backend ah__store_pg = {
    .name = "postgresql",
    .open = pg_open,
    .close = pg_close,
    .write_group = pg_write_group,
    .get_session = pg_get_session,
    .list_sessions = pg_list_sessions,
    .events = pg_events,
    .events_after = pg_events_after,
    .inbox_open = pg_inbox_open,
    .requests_pending = pg_requests_pending,
    .get_request = pg_get_request,
    .sessions_to_recover = pg_sessions_to_recover,
    .session_tree = pg_session_tree,
    .health = pg_health,
    .read_failed = pg_read_failed,
    .release_memory = pg_release_memory,
    .memory_used = pg_memory_used,
    .last_cursor = pg_last_cursor,
    .watch_open = pg_watch_open,
    .watch_read = pg_watch_read,
    .watch_close = pg_watch_close,
    .posted = pg_posted,
};
