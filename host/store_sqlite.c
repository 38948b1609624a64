/* The SQLite backend of the durable store.
 *
 * Two connections, each used by one thread only (so both are opened SQLITE_OPEN_NOMUTEX): `w`, the
 * writer, used on the loop thread while opening (checks, WAL, migrations) and then only by the store's
 * writer thread until close; `r`, read-only, used by the reads on the loop thread. WAL lets `r` read the
 * last committed state while `w` writes. Every statement is prepared once per connection and kept.
 *
 * The schema version lives in PRAGMA user_version; `migrations` holds one script per version and a
 * database is brought forward one step at a time in a single transaction. A newer version, a file that is
 * not a database, or one that fails PRAGMA quick_check is refused before anything is written to it: the
 * checks only read, and WAL mode and the migrations come after them.
 */
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "agenthost/errors.h"
#include "log.h"
#include "store.h"
#include "store_ops.h"

#define COMP "store"

/* Another process (two share one state dir) may hold the write lock for a while: wait this long. */
#define BUSY_TIMEOUT_MS 5000

/* ---- schema ---------------------------------------------------------------------------------------- */

/* migrations[i] brings a database from user_version i to i + 1. Append only; never edit a shipped one.
 * Columns without a declared type (times) keep what was written (an RFC 3339 string or an integer), and
 * JSON columns hold compact JSON text. UNIQUE(session_id, seq) is the index events(session_id, seq). */
static const char *const migrations[] = {
    /* v1 */
    "CREATE TABLE sessions ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  cwd TEXT,"
    "  title TEXT,"
    "  provider TEXT,"
    "  model TEXT,"
    "  parent TEXT,"
    "  local INTEGER NOT NULL DEFAULT 0,"
    "  depth INTEGER NOT NULL DEFAULT 0,"
    "  status TEXT,"
    "  closed INTEGER NOT NULL DEFAULT 0,"
    "  created,"
    "  updated,"
    "  policy TEXT NOT NULL DEFAULT '{}',"
    "  tags TEXT NOT NULL DEFAULT '[]',"
    "  last_seq INTEGER NOT NULL DEFAULT 0,"
    "  lease_owner TEXT,"
    "  lease_until INTEGER NOT NULL DEFAULT 0"
    ");"
    "CREATE TABLE events ("
    "  cursor INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  session_id TEXT NOT NULL,"
    "  seq INTEGER NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  time,"
    "  turn_id TEXT,"
    "  message_id TEXT,"
    "  data TEXT NOT NULL,"
    "  UNIQUE (session_id, seq)"
    ");"
    "CREATE TABLE inbox ("
    "  message_id TEXT PRIMARY KEY NOT NULL,"
    "  session_id TEXT NOT NULL,"
    "  content TEXT NOT NULL,"
    "  state TEXT NOT NULL,"
    "  turn_id TEXT,"
    "  created"
    ");"
    "CREATE INDEX inbox_session_state ON inbox (session_id, state);"
    "CREATE TABLE requests ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  session_id TEXT NOT NULL,"
    "  turn_id TEXT,"
    "  kind TEXT NOT NULL,"
    "  params TEXT,"
    "  options TEXT,"
    "  state TEXT NOT NULL,"
    "  answer TEXT,"
    "  created,"
    "  resolved"
    ");"
    "CREATE INDEX requests_state ON requests (state);"
    "CREATE INDEX requests_session ON requests (session_id);",
    /* v2: a prompt's content apart from its state. SQLite rewrites a whole row on UPDATE, so each state
     * change of a prompt of 150 MiB read and wrote those 150 MiB (and held them in memory twice). */
    "CREATE TABLE inbox_content ("
    "  message_id TEXT PRIMARY KEY NOT NULL,"
    "  content TEXT NOT NULL"
    ");"
    "INSERT INTO inbox_content (message_id, content) SELECT message_id, content FROM inbox ORDER BY rowid;"
    "ALTER TABLE inbox DROP COLUMN content;",
    /* v3: a session's settings beside its policy: {mode?, effort?} (its tool mode and reasoning effort). */
    "ALTER TABLE sessions ADD COLUMN settings TEXT NOT NULL DEFAULT '{}';",
    /* v4: a session's own usage totals (kept with each usage event, in its transaction), and its children
     * found by parent (a tree's usage). */
    "ALTER TABLE sessions ADD COLUMN usage TEXT NOT NULL DEFAULT '{}';"
    "CREATE INDEX sessions_parent ON sessions (parent);",
    /* v5: each process's lease heartbeat. A session's lease (lease_owner, lease_until) is held while its
     * lease_until or its owner's heartbeat is in the future: a process renews one row however many sessions
     * it runs, instead of every session's row. */
    "CREATE TABLE owners ("
    "  owner TEXT PRIMARY KEY NOT NULL,"
    "  until INTEGER NOT NULL"
    ");",
    /* v6: the lease's epoch, one more at each change of owner, and each event stamped with the epoch of the
     * lease it was written under (docs/scaling.md): which owner wrote what, in SQL. */
    "ALTER TABLE sessions ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE events ADD COLUMN epoch INTEGER;",
};

#define SCHEMA_VERSION ((int)(sizeof migrations / sizeof migrations[0]))

int ah__store_schema_version(void) {
  return SCHEMA_VERSION;
}

/* ---- statements -------------------------------------------------------------------------------------- */

#define SESSION_COLS                                                                                        \
  "id, cwd, title, provider, model, parent, local, depth, status, closed, created, updated, policy, tags, " \
  "last_seq, lease_owner, lease_until, settings, usage"
#define EVENT_COLS "cursor, session_id, seq, kind, time, turn_id, message_id, data"
#define INBOX_COLS "i.message_id, i.session_id, c.content, i.state, i.turn_id, i.created"
#define INBOX_FROM "inbox i JOIN inbox_content c ON c.message_id = i.message_id"
#define REQUEST_COLS "id, session_id, turn_id, kind, params, options, state, answer, created, resolved"
#define OPEN_INBOX "state NOT IN ('done', 'cancelled')"

typedef enum stmt_id {
  /* writer */
  W_BEGIN,
  W_COMMIT,
  W_ROLLBACK,
  W_SAVEPOINT,
  W_RELEASE,
  W_ROLLBACK_TO,
  W_SESSION_PUT,
  W_SESSION_DEL_EVENTS,
  W_SESSION_DEL_INBOX_CONTENT,
  W_SESSION_DEL_INBOX,
  W_SESSION_DEL_REQUESTS,
  W_SESSION_DEL,
  W_EVENT,
  W_EVENT_LAST_SEQ,
  W_INBOX_PUT,
  W_INBOX_CONTENT,
  W_INBOX_STATE,
  W_REQUEST_PUT,
  W_REQUEST_STATE,
  W_REQUEST_EXISTS,
  W_LEASE,
  W_LEASE_RELEASE,
  W_FENCE,
  W_OWNER_GET,
  W_OWNER_PUT,
  W_OWNER_PRUNE,
  W_OWNER_END,
  /* reader */
  R_SESSION,
  R_SESSIONS,
  R_SESSIONS_AFTER,
  R_EVENTS,
  R_EVENTS_AFTER,
  R_INBOX_OPEN,
  R_REQUESTS_PENDING,
  R_REQUESTS_PENDING_OF,
  R_REQUEST,
  R_RECOVER,
  R_TREE,
  STMT_COUNT,
} stmt_id;

static const char *const stmt_sql[STMT_COUNT] = {
    [W_BEGIN] = "BEGIN IMMEDIATE",
    [W_COMMIT] = "COMMIT",
    [W_ROLLBACK] = "ROLLBACK",
    [W_SAVEPOINT] = "SAVEPOINT opset",
    [W_RELEASE] = "RELEASE opset",
    [W_ROLLBACK_TO] = "ROLLBACK TO opset",
    /* A put replaces the session's description; its lease is changed only by the lease operations, and
     * last_seq never goes back (events may already be stored). */
    [W_SESSION_PUT] =
        "INSERT INTO sessions (" SESSION_COLS ") "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19) "
        "ON CONFLICT (id) DO UPDATE SET cwd = excluded.cwd, title = excluded.title, "
        "provider = excluded.provider, model = excluded.model, parent = excluded.parent, "
        "local = excluded.local, depth = excluded.depth, status = excluded.status, "
        "closed = excluded.closed, created = excluded.created, updated = excluded.updated, "
        "policy = excluded.policy, tags = excluded.tags, settings = excluded.settings, usage = "
        "excluded.usage, "
        "last_seq = max(last_seq, excluded.last_seq)",
    [W_SESSION_DEL_EVENTS] = "DELETE FROM events WHERE session_id = ?1",
    [W_SESSION_DEL_INBOX_CONTENT] =
        "DELETE FROM inbox_content WHERE message_id IN (SELECT message_id FROM inbox WHERE session_id = ?1)",
    [W_SESSION_DEL_INBOX] = "DELETE FROM inbox WHERE session_id = ?1",
    [W_SESSION_DEL_REQUESTS] = "DELETE FROM requests WHERE session_id = ?1",
    [W_SESSION_DEL] = "DELETE FROM sessions WHERE id = ?1",
    [W_EVENT] = "INSERT INTO events (session_id, seq, kind, time, turn_id, message_id, data, epoch) "
                "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, (SELECT lease_epoch FROM sessions WHERE id = ?1))",
    [W_EVENT_LAST_SEQ] = "UPDATE sessions SET last_seq = ?2 WHERE id = ?1 AND last_seq < ?2",
    [W_INBOX_PUT] = "INSERT INTO inbox (message_id, session_id, state, turn_id, created) "
                    "VALUES (?1, ?2, ?4, NULL, ?3)",
    [W_INBOX_CONTENT] = "INSERT INTO inbox_content (message_id, content) VALUES (?1, ?2)",
    [W_INBOX_STATE] = "UPDATE inbox SET state = ?2, turn_id = coalesce(?3, turn_id) WHERE message_id = ?1",
    [W_REQUEST_PUT] =
        "INSERT INTO requests (" REQUEST_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    [W_REQUEST_STATE] = "UPDATE requests SET state = ?2, answer = ?3, resolved = ?4 "
                        "WHERE id = ?1 AND state = 'pending'",
    [W_REQUEST_EXISTS] = "SELECT state FROM requests WHERE id = ?1",
    [W_LEASE] = "UPDATE sessions SET lease_epoch = lease_epoch + (lease_owner IS NOT ?2), lease_owner = ?2, "
                "lease_until = ?3 WHERE id = ?1 AND (lease_owner IS NULL "
                "OR lease_owner = ?2 OR lease_owner = ?5 OR (lease_until < ?4 AND NOT EXISTS (SELECT 1 FROM "
                "owners WHERE owner = sessions.lease_owner AND until >= ?4)))",
    [W_LEASE_RELEASE] =
        "UPDATE sessions SET lease_owner = NULL, lease_until = 0 WHERE id = ?1 AND lease_owner = ?2",
    [W_FENCE] = "SELECT lease_owner FROM sessions WHERE id = ?1",
    [W_OWNER_GET] = "SELECT until FROM owners WHERE owner = ?1",
    [W_OWNER_PUT] = "INSERT INTO owners (owner, until) VALUES (?1, ?2) "
                    "ON CONFLICT (owner) DO UPDATE SET until = max(until, excluded.until)",
    [W_OWNER_PRUNE] = "DELETE FROM owners WHERE until < ?1",
    [W_OWNER_END] = "DELETE FROM owners WHERE owner = ?1",
    [R_SESSION] = "SELECT " SESSION_COLS " FROM sessions WHERE id = ?1",
    [R_SESSIONS] = "SELECT " SESSION_COLS " FROM sessions ORDER BY id LIMIT ?1",
    [R_SESSIONS_AFTER] = "SELECT " SESSION_COLS " FROM sessions WHERE id > ?2 ORDER BY id LIMIT ?1",
    [R_EVENTS] = "SELECT " EVENT_COLS " FROM events WHERE session_id = ?2 AND seq > ?3 ORDER BY seq LIMIT ?1",
    [R_EVENTS_AFTER] = "SELECT " EVENT_COLS " FROM events WHERE cursor > ?2 ORDER BY cursor LIMIT ?1",
    [R_INBOX_OPEN] = "SELECT " INBOX_COLS " FROM " INBOX_FROM " WHERE i.session_id = ?1 AND i." OPEN_INBOX
                     " ORDER BY i.rowid",
    [R_REQUESTS_PENDING] = "SELECT " REQUEST_COLS " FROM requests WHERE state = 'pending' ORDER BY rowid",
    [R_REQUESTS_PENDING_OF] =
        "SELECT " REQUEST_COLS " FROM requests WHERE state = 'pending' AND session_id = ?1 "
        "ORDER BY rowid",
    [R_REQUEST] = "SELECT " REQUEST_COLS " FROM requests WHERE id = ?1",
    /* A session and every session below it (depth-limited against a damaged parent cycle). */
    [R_TREE] = "WITH RECURSIVE tree(id, d) AS (SELECT id, 0 FROM sessions WHERE id = ?1 UNION "
               "SELECT s.id, t.d + 1 FROM sessions s JOIN tree t ON s.parent = t.id WHERE t.d < 64) "
               "SELECT s.id, s.parent, s.usage FROM sessions s WHERE s.id IN (SELECT id FROM tree) "
               "ORDER BY s.id",
    [R_RECOVER] =
        "SELECT " SESSION_COLS " FROM sessions WHERE closed = 0 AND (status = 'running' OR EXISTS "
        "(SELECT 1 FROM inbox WHERE inbox.session_id = sessions.id AND inbox." OPEN_INBOX ")) ORDER BY id",
};

typedef struct conn {
  sqlite3 *db;
  sqlite3_stmt *st[STMT_COUNT]; /* prepared on first use, kept until close */
} conn;

typedef struct sq_store {
  char *path;
  conn w; /* NULL db when read-only */
  conn r;
  char err[512]; /* the writer thread's description of the last failed operation */
  /* Checkpoints run on their own thread and connection (PASSIVE: they never block the writer), so the
   * writer's commits never pay for copying the WAL back into the database (automatic checkpoints are off
   * on the writer). */
  conn c;
  pthread_t ckpt_thread;
  bool ckpt_running;
  pthread_mutex_t ckpt_mu;
  pthread_cond_t ckpt_cv;
  bool ckpt_stop;
  int wal_restart_frames;
  int wal_frames; /* writer thread: frames in the WAL after the last commit */
  /* Health (both threads): FULL while writes fail for lack of space (cleared by the next commit), DAMAGED
   * for good once SQLite reported corruption or an I/O error; the first such error is kept as the detail. */
  pthread_mutex_t health_mu;
  int health;
  char health_detail[300];
  bool read_failed; /* loop thread: the last read failed */
} sq_store;

/* Note what an SQLite error says about the store's health. */
static void note_health(sq_store *q, sqlite3 *db, int rc) {
  int prim = rc & 0xff;
  int h =
      prim == SQLITE_FULL ? AH_STORE_FULL
      : (prim == SQLITE_CORRUPT || prim == SQLITE_NOTADB || prim == SQLITE_IOERR || prim == SQLITE_CANTOPEN)
          ? AH_STORE_DAMAGED
          : AH_STORE_OK;
  if (h == AH_STORE_OK)
    return;
  pthread_mutex_lock(&q->health_mu);
  if (q->health != AH_STORE_DAMAGED && h > q->health) {
    q->health = h;
    snprintf(q->health_detail, sizeof q->health_detail, "%s (%s)",
             db ? sqlite3_errmsg(db) : sqlite3_errstr(rc), sqlite3_errstr(rc));
    AH_LOG_E(COMP, "%s: the store is %s: %s", q->path, h == AH_STORE_FULL ? "full" : "damaged",
             q->health_detail);
  }
  pthread_mutex_unlock(&q->health_mu);
}

static int query_one(sqlite3 *db, const char *sql, sqlite3_int64 *num, char **text);

/* A read failed. The reads are fixed statements that worked before, so a plain SQLITE_ERROR (or SCHEMA)
 * means the file changed under them — a damaged header says "attached databases must use the same text
 * encoding", not CORRUPT: an integrity check on the reader decides whether the store is damaged. */
static void note_read_failure(sq_store *q) {
  int rc = sqlite3_extended_errcode(q->r.db);
  int prim = rc & 0xff;
  if (prim != SQLITE_ERROR && prim != SQLITE_SCHEMA) {
    note_health(q, q->r.db, rc);
    return;
  }
  char msg[200];
  snprintf(msg, sizeof msg, "%s", sqlite3_errmsg(q->r.db));
  char *verdict = NULL;
  int crc = query_one(q->r.db, "PRAGMA quick_check(1)", NULL, &verdict);
  if (crc != SQLITE_OK || !verdict || strcmp(verdict, "ok") != 0) {
    pthread_mutex_lock(&q->health_mu);
    if (q->health != AH_STORE_DAMAGED) {
      q->health = AH_STORE_DAMAGED;
      snprintf(q->health_detail, sizeof q->health_detail, "%s (the integrity check: %s)", msg,
               crc != SQLITE_OK ? sqlite3_errmsg(q->r.db)
               : verdict        ? verdict
                                : "no answer");
      AH_LOG_E(COMP, "%s: the store is damaged: %s", q->path, q->health_detail);
    }
    pthread_mutex_unlock(&q->health_mu);
  }
  free(verdict);
}

/* Writer thread: the WAL's size after each commit (sqlite3_wal_hook). */
static int wal_grew(void *arg, sqlite3 *db, const char *name, int frames) {
  (void)db;
  (void)name;
  ((sq_store *)arg)->wal_frames = frames;
  return SQLITE_OK;
}

/* Writer thread, after a commit. Under a steady stream of commits the checkpoint thread's PASSIVE
 * checkpoints never find the moment when everything was copied and a new commit may start the WAL over
 * (and a checkpoint from another thread that waits for the writer's lock is starved by the writer), so
 * past wal_restart_frames the writer itself, between two groups, runs a RESTART: it copies what PASSIVE
 * left, waits (the busy timeout) for the readers, and the next commit writes from the WAL's beginning (a
 * grown file cut back to journal_size_limit). */
static void restart_wal(sq_store *q) {
  if (q->wal_frames <= q->wal_restart_frames)
    return;
  q->wal_frames = 0;
  sqlite3_wal_checkpoint_v2(q->w.db, NULL, SQLITE_CHECKPOINT_RESTART, NULL, NULL);
}

static void note_commit(sq_store *q) {
  pthread_mutex_lock(&q->health_mu);
  if (q->health == AH_STORE_FULL) {
    q->health = AH_STORE_OK;
    q->health_detail[0] = '\0';
    AH_LOG_I(COMP, "%s: writes succeed again", q->path);
  }
  pthread_mutex_unlock(&q->health_mu);
}

static int sq_health(void *impl, char *detail, size_t cap) {
  sq_store *q = impl;
  pthread_mutex_lock(&q->health_mu);
  int h = q->health;
  if (detail && cap)
    snprintf(detail, cap, "%s", q->health_detail);
  pthread_mutex_unlock(&q->health_mu);
  return h;
}

static bool sq_read_failed(void *impl) {
  return ((sq_store *)impl)->read_failed;
}

static void sq_release_memory(void *impl) {
  sq_store *q = impl;
  if (q->r.db)
    sqlite3_db_release_memory(q->r.db);
}

/* SQLite's own count: every connection of the process (the store is its only user). */
static int64_t sq_memory_used(void *impl) {
  (void)impl;
  return (int64_t)sqlite3_memory_used();
}

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

static void set_err(sq_store *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(sq_store *q, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(q->err, sizeof q->err, fmt, ap);
  va_end(ap);
}

static sqlite3_stmt *stmt(conn *c, stmt_id id) {
  if (!c->st[id]) {
    int rc = sqlite3_prepare_v3(c->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT, &c->st[id], NULL);
    if (rc != SQLITE_OK) {
      AH_LOG_E(COMP, "cannot prepare statement %d: %s", (int)id, sqlite3_errmsg(c->db));
      c->st[id] = NULL;
    }
  }
  return c->st[id];
}

/* Reset a statement after use: a statement left stepping would keep its read transaction (and an old
 * snapshot) open; cleared bindings mean no borrowed pointer outlives the call. */
static void done(sqlite3_stmt *st) {
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
}

static int map_rc(int rc) {
  switch (rc) {
  case SQLITE_CONSTRAINT_UNIQUE:
  case SQLITE_CONSTRAINT_PRIMARYKEY:
    return AH_EEXIST;
  default:
    break;
  }
  switch (rc & 0xff) {
  case SQLITE_CONSTRAINT:
  case SQLITE_MISMATCH:
    return AH_EINVAL;
  case SQLITE_NOMEM:
    return AH_ENOMEM;
  case SQLITE_TOOBIG:
    return AH_E2BIG;
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    return AH_EBUSY;
  default:
    return AH_EIO;
  }
}

/* Step a statement that returns no row of interest; returns the SQLite code (SQLITE_OK on success) and
 * records the message on failure. */
static int run(sq_store *q, conn *c, stmt_id id) {
  sqlite3_stmt *st = stmt(c, id);
  if (!st) {
    set_err(q, "cannot prepare: %s", sqlite3_errmsg(c->db));
    return SQLITE_ERROR;
  }
  int rc = sqlite3_step(st);
  if (rc == SQLITE_DONE || rc == SQLITE_ROW)
    rc = SQLITE_OK;
  else
    set_err(q, "%s", sqlite3_errmsg(c->db));
  done(st);
  return rc;
}

/* ---- JSON <-> columns --------------------------------------------------------------------------------- */

/* The bytes of the strings in `v`, up to `limit`: a cheap bound that tells a value far below STREAM_MIN
 * (almost every one) without dumping it. */
static size_t string_bytes(const json_t *v, size_t limit) {
  size_t n = 0;
  if (json_is_string(v))
    return json_string_length(v);
  const char *k = NULL;
  const json_t *x = NULL;
  size_t i = 0;
  if (json_is_object(v)) {
    json_object_foreach((json_t *)v, k, x) {
      n += strlen(k) + string_bytes(x, limit);
      if (n >= limit)
        return n;
    }
  } else if (json_is_array(v)) {
    json_array_foreach(v, i, x) {
      n += string_bytes(x, limit);
      if (n >= limit)
        return n;
    }
  }
  return n;
}

#define DUMP_FLAGS (JSON_COMPACT | JSON_ENCODE_ANY)

/* v's compact JSON text of `n` bytes (json_dumpb's measure), written once at its exact size: json_dumps()
 * grows its buffer by doubling, which for a long prompt holds up to twice its size and copies it several
 * times. */
static char *dump_sized(const json_t *v, size_t n) {
  char *text = n ? malloc(n + 1) : NULL;
  if (!text || json_dumpb(v, text, n, DUMP_FLAGS) != n) {
    free(text);
    return NULL;
  }
  text[n] = '\0';
  return text;
}

/* Bind `v` as compact JSON text (NULL → `dflt`, which may be NULL for SQL NULL). `n` is its measured size,
 * or 0: then a small value (almost every one) is dumped in one pass, a large one measured first. */
static int bind_json_n(sqlite3_stmt *st, int i, const json_t *v, const char *dflt, size_t n) {
  if (!v || json_is_null(v))
    return dflt ? sqlite3_bind_text(st, i, dflt, -1, SQLITE_STATIC) : sqlite3_bind_null(st, i);
  char *text = NULL;
  if (!n && string_bytes(v, 65536) < 65536) {
    text = json_dumps(v, DUMP_FLAGS);
    n = text ? strlen(text) : 0;
  } else {
    n = n ? n : json_dumpb(v, NULL, 0, DUMP_FLAGS);
    text = dump_sized(v, n);
  }
  if (!text)
    return SQLITE_NOMEM;
  return sqlite3_bind_text64(st, i, text, n, free, SQLITE_UTF8);
}

static int bind_json(sqlite3_stmt *st, int i, const json_t *v, const char *dflt) {
  return bind_json_n(st, i, v, dflt, 0);
}

/* JSON texts at least this long are written in pieces: bound as a zero-filled value of their length, then
 * filled through SQLite's incremental I/O once the row exists. Bound whole, a value is in memory three
 * times during its insert (the JSON, its dumped text and the record SQLite builds); in pieces, once. Such
 * a value reads back as a BLOB of the same UTF-8 bytes (sqlite3_column_text and CAST(x AS TEXT) give the
 * text). */
#define STREAM_MIN ((size_t)1 << 20)

/* bind_json for a column of a row being inserted: *big is set to the length when `v` is to be streamed
 * with fill_big() after the step, else 0. */
static int bind_json_big(sqlite3_stmt *st, int i, const json_t *v, const char *dflt, size_t *big) {
  *big = 0;
  size_t n = 0;
  /* Escapes make a string's text at most six times its bytes: a value with fewer string bytes than
   * STREAM_MIN / 6 is bound whole without being measured (a large value made of numbers is too). */
  if (v && !json_is_null(v) && string_bytes(v, STREAM_MIN / 6) >= STREAM_MIN / 6) {
    n = json_dumpb(v, NULL, 0, DUMP_FLAGS);
    if (n >= STREAM_MIN) {
      *big = n;
      return sqlite3_bind_zeroblob64(st, i, n);
    }
  }
  return bind_json_n(st, i, v, dflt, n);
}

typedef struct filler {
  sqlite3_blob *blob;
  size_t off, len, cap;
  char buf[256 * 1024];
  int rc;
} filler;

static int fill_flush(filler *f) {
  if (f->rc == SQLITE_OK && f->len) {
    if (f->off + f->len > f->cap)
      f->rc = SQLITE_CORRUPT; /* the text grew after it was measured: it is not written short or long */
    else
      f->rc = sqlite3_blob_write(f->blob, f->buf, (int)f->len, (int)f->off);
    f->off += f->len;
    f->len = 0;
  }
  return f->rc == SQLITE_OK ? 0 : -1;
}

static int fill_piece(const char *buffer, size_t size, void *data) {
  filler *f = data;
  while (size) {
    size_t k = sizeof f->buf - f->len < size ? sizeof f->buf - f->len : size;
    memcpy(f->buf + f->len, buffer, k);
    f->len += k;
    buffer += k;
    size -= k;
    if (f->len == sizeof f->buf && fill_flush(f) != 0)
      return -1;
  }
  return 0;
}

/* Write the `n` bytes of v's JSON text into column `col` of row `rowid` of `table` (bound by
 * bind_json_big), in the writer's transaction. */
static int fill_big(sq_store *q, const char *table, const char *col, sqlite3_int64 rowid, const json_t *v,
                    size_t n) {
  if (n > (size_t)INT32_MAX) {
    set_err(q, "a JSON value of %zu bytes is larger than the store's limit", n);
    return AH_EINVAL;
  }
  filler *f = calloc(1, sizeof *f);
  if (!f)
    return AH_ENOMEM;
  f->cap = n;
  int rc = sqlite3_blob_open(q->w.db, "main", table, col, rowid, 1, &f->blob);
  if (rc == SQLITE_OK) {
    if (json_dump_callback(v, fill_piece, f, DUMP_FLAGS) == 0)
      fill_flush(f);
    rc = f->rc != SQLITE_OK ? f->rc : f->off != n ? SQLITE_CORRUPT : SQLITE_OK;
  }
  if (rc != SQLITE_OK)
    set_err(q, "%s.%s: writing a value of %zu bytes: %s", table, col, n,
            rc == SQLITE_CORRUPT ? "its text changed while written" : sqlite3_errmsg(q->w.db));
  sqlite3_blob_close(f->blob);
  free(f);
  return rc == SQLITE_OK ? 0 : map_rc(rc);
}

/* Bind a scalar as itself (string, integer, real, boolean as 0/1, null); a container as JSON text. The
 * string is borrowed: the statement is reset and its bindings cleared before the JSON can go away. */
static int bind_value(sqlite3_stmt *st, int i, const json_t *v) {
  switch (v ? json_typeof(v) : JSON_NULL) {
  case JSON_STRING:
    return sqlite3_bind_text(st, i, json_string_value(v), (int)json_string_length(v), SQLITE_STATIC);
  case JSON_INTEGER:
    return sqlite3_bind_int64(st, i, json_integer_value(v));
  case JSON_REAL:
    return sqlite3_bind_double(st, i, json_real_value(v));
  case JSON_TRUE:
    return sqlite3_bind_int(st, i, 1);
  case JSON_FALSE:
    return sqlite3_bind_int(st, i, 0);
  case JSON_OBJECT:
  case JSON_ARRAY:
    return bind_json(st, i, v, NULL);
  case JSON_NULL:
  default:
    return sqlite3_bind_null(st, i);
  }
}

static json_t *col_value(sqlite3_stmt *st, int i) {
  switch (sqlite3_column_type(st, i)) {
  case SQLITE_INTEGER:
    return json_integer(sqlite3_column_int64(st, i));
  case SQLITE_FLOAT:
    return json_real(sqlite3_column_double(st, i));
  case SQLITE_TEXT:
  case SQLITE_BLOB: {
    const char *text = (const char *)sqlite3_column_text(st, i);
    json_t *s = text ? json_stringn(text, (size_t)sqlite3_column_bytes(st, i)) : NULL;
    return s ? s : json_null();
  }
  default:
    return json_null();
  }
}

/* A JSON text column parsed back (SQL NULL → `dflt`, stolen; json null when NULL). */
static json_t *col_json(sqlite3_stmt *st, int i, json_t *dflt) {
  const char *text = (const char *)sqlite3_column_text(st, i);
  if (!text)
    return dflt ? dflt : json_null();
  json_error_t e;
  json_t *v = json_loadb(text, (size_t)sqlite3_column_bytes(st, i), JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
  if (!v) {
    AH_LOG_E(COMP, "column %s holds invalid JSON: %s", sqlite3_column_name(st, i), e.text);
    v = json_null();
  }
  json_decref(dflt);
  return v;
}

static json_t *row_session(sqlite3_stmt *st) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "id", col_value(st, 0));
  json_object_set_new(o, "cwd", col_value(st, 1));
  json_object_set_new(o, "title", col_value(st, 2));
  json_object_set_new(o, "provider", col_value(st, 3));
  json_object_set_new(o, "model", col_value(st, 4));
  json_object_set_new(o, "parent", col_value(st, 5));
  json_object_set_new(o, "local", json_boolean(sqlite3_column_int(st, 6)));
  json_object_set_new(o, "depth", json_integer(sqlite3_column_int64(st, 7)));
  json_object_set_new(o, "status", col_value(st, 8));
  json_object_set_new(o, "closed", json_boolean(sqlite3_column_int(st, 9)));
  json_object_set_new(o, "created", col_value(st, 10));
  json_object_set_new(o, "updated", col_value(st, 11));
  json_object_set_new(o, "policy", col_json(st, 12, json_object()));
  json_object_set_new(o, "tags", col_json(st, 13, json_array()));
  json_object_set_new(o, "lastSeq", json_integer(sqlite3_column_int64(st, 14)));
  json_object_set_new(o, "leaseOwner", col_value(st, 15));
  json_object_set_new(o, "leaseUntil", json_integer(sqlite3_column_int64(st, 16)));
  json_object_set_new(o, "settings", col_json(st, 17, json_object()));
  json_object_set_new(o, "usage", col_json(st, 18, json_object()));
  return o;
}

static json_t *row_event(sqlite3_stmt *st) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "cursor", json_integer(sqlite3_column_int64(st, 0)));
  json_object_set_new(o, "sessionId", col_value(st, 1));
  json_object_set_new(o, "seq", json_integer(sqlite3_column_int64(st, 2)));
  json_object_set_new(o, "kind", col_value(st, 3));
  json_object_set_new(o, "time", col_value(st, 4));
  if (sqlite3_column_type(st, 5) != SQLITE_NULL)
    json_object_set_new(o, "turnId", col_value(st, 5));
  if (sqlite3_column_type(st, 6) != SQLITE_NULL)
    json_object_set_new(o, "messageId", col_value(st, 6));
  json_object_set_new(o, "data", col_json(st, 7, json_object()));
  return o;
}

static json_t *row_inbox(sqlite3_stmt *st) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "messageId", col_value(st, 0));
  json_object_set_new(o, "sessionId", col_value(st, 1));
  json_object_set_new(o, "content", col_json(st, 2, NULL));
  json_object_set_new(o, "state", col_value(st, 3));
  json_object_set_new(o, "turnId", col_value(st, 4));
  json_object_set_new(o, "time", col_value(st, 5));
  return o;
}

static json_t *row_request(sqlite3_stmt *st) {
  json_t *o = json_object();
  if (!o)
    return NULL;
  json_object_set_new(o, "id", col_value(st, 0));
  json_object_set_new(o, "sessionId", col_value(st, 1));
  json_object_set_new(o, "turnId", col_value(st, 2));
  json_object_set_new(o, "kind", col_value(st, 3));
  json_object_set_new(o, "params", col_json(st, 4, NULL));
  json_object_set_new(o, "options", col_json(st, 5, NULL));
  json_object_set_new(o, "state", col_value(st, 6));
  json_object_set_new(o, "answer", col_json(st, 7, NULL));
  json_object_set_new(o, "created", col_value(st, 8));
  json_object_set_new(o, "resolved", col_value(st, 9));
  return o;
}

/* ---- operations (writer thread) ---------------------------------------------------------------------- */

static const char *get_str(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

/* Bind-and-step for the write operations; returns 0 or an AH_E* code with q->err set. */
static int step_write(sq_store *q, sqlite3_stmt *st, int bind_rc) {
  int rc = bind_rc;
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    if (rc == SQLITE_DONE || rc == SQLITE_ROW)
      rc = SQLITE_OK;
  }
  if (rc != SQLITE_OK)
    set_err(q, "%s", sqlite3_errmsg(q->w.db));
  done(st);
  return rc == SQLITE_OK ? 0 : map_rc(rc);
}

#define PREPARE(q, st, id)                                                 \
  sqlite3_stmt *st = stmt(&(q)->w, id);                                    \
  if (!st) {                                                               \
    set_err(q, "cannot prepare statement: %s", sqlite3_errmsg((q)->w.db)); \
    return AH_EIO;                                                         \
  }

static int op_session_put(sq_store *q, const json_t *op, json_t *res) {
  const json_t *s = json_object_get(op, "session");
  const char *id = get_str(s, "id");
  const json_t *last_seq = json_object_get(s, "lastSeq");
  const json_t *lease_until = json_object_get(s, "leaseUntil");
  PREPARE(q, st, W_SESSION_PUT);
  int rc = sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  static const char *const text_keys[] = {"cwd", "title", "provider", "model", "parent"};
  for (int i = 0; i < 5 && rc == SQLITE_OK; i++)
    rc = bind_value(st, 2 + i, json_object_get(s, text_keys[i]));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int(st, 7, json_is_true(json_object_get(s, "local")));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 8, json_integer_value(json_object_get(s, "depth")));
  if (rc == SQLITE_OK)
    rc = bind_value(st, 9, json_object_get(s, "status"));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int(st, 10, json_is_true(json_object_get(s, "closed")));
  if (rc == SQLITE_OK)
    rc = bind_value(st, 11, json_object_get(s, "created"));
  if (rc == SQLITE_OK)
    rc = bind_value(st, 12, json_object_get(s, "updated"));
  if (rc == SQLITE_OK)
    rc = bind_json(st, 13, json_object_get(s, "policy"), "{}");
  if (rc == SQLITE_OK)
    rc = bind_json(st, 14, json_object_get(s, "tags"), "[]");
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 15, json_integer_value(last_seq));
  if (rc == SQLITE_OK)
    rc = bind_value(st, 16, json_object_get(s, "leaseOwner"));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 17, json_integer_value(lease_until));
  if (rc == SQLITE_OK)
    rc = bind_json(st, 18, json_object_get(s, "settings"), "{}");
  if (rc == SQLITE_OK)
    rc = bind_json(st, 19, json_object_get(s, "usage"), "{}");
  rc = step_write(q, st, rc);
  if (rc == 0)
    json_array_append_new(res, json_null());
  return rc;
}

/* session.update builds its statement from the keys of "set" (each checked against update_cols, so no
 * caller text reaches the SQL); it is rare enough not to be cached. */
/* session.update builds its statement from the keys of "set" (each one of ah__store_update_col's, so no
 * caller text reaches the SQL); it is rare enough not to be cached. */
static int op_session_update(sq_store *q, const json_t *op, json_t *res) {
  const char *id = get_str(op, "id");
  const json_t *set = json_object_get(op, "set");
  const ah_store_update_col *cols[32];
  const json_t *vals[32];
  size_t n = 0;
  char sql[1024] = "UPDATE sessions SET id = id";
  size_t len = strlen(sql);
  const char *key = NULL;
  json_t *v = NULL;
  json_object_foreach((json_t *)set, key, v) {
    if (n == 32)
      break; /* there are fewer fields than that: a key twice is not JSON jansson keeps */
    cols[n] = ah__store_update_col(key);
    vals[n] = v;
    n++;
    len += (size_t)snprintf(sql + len, sizeof sql - len, ", %s = ?%zu", cols[n - 1]->column, n);
  }
  snprintf(sql + len, sizeof sql - len, " WHERE id = ?%zu", n + 1);
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(q->w.db, sql, -1, &st, NULL) != SQLITE_OK) {
    set_err(q, "session.update: %s", sqlite3_errmsg(q->w.db));
    return AH_EIO;
  }
  int rc = SQLITE_OK;
  for (size_t i = 0; i < n && rc == SQLITE_OK; i++)
    rc = cols[i]->kind == AH_COL_JSON ? bind_json(st, (int)i + 1, vals[i], NULL)
                                      : bind_value(st, (int)i + 1, vals[i]);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, (int)n + 1, id, -1, SQLITE_STATIC);
  int status = step_write(q, st, rc);
  if (status == 0 && sqlite3_changes(q->w.db) == 0) {
    set_err(q, "session.update: no session %s", id);
    status = AH_ENOENT;
  }
  sqlite3_finalize(st);
  if (status == 0)
    json_array_append_new(res, json_null());
  return status;
}

static int op_session_delete(sq_store *q, const json_t *op, json_t *res) {
  const char *id = get_str(op, "id");
  static const stmt_id dels[] = {W_SESSION_DEL_EVENTS, W_SESSION_DEL_INBOX_CONTENT, W_SESSION_DEL_INBOX,
                                 W_SESSION_DEL_REQUESTS, W_SESSION_DEL};
  for (size_t i = 0; i < sizeof dels / sizeof dels[0]; i++) {
    PREPARE(q, st, dels[i]);
    int rc = step_write(q, st, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC));
    if (rc < 0)
      return rc;
  }
  json_array_append_new(res, json_null());
  return 0;
}

static int op_event(sq_store *q, const json_t *op, json_t *res) {
  const char *sid = get_str(op, "sessionId");
  const char *kind = get_str(op, "kind");
  const json_t *seq = json_object_get(op, "seq");
  const json_t *turn = json_object_get(op, "turnId");
  const json_t *msg = json_object_get(op, "messageId");
  const json_t *time = json_object_get(op, "time");
  const json_t *data = json_object_get(op, "data");
  PREPARE(q, st, W_EVENT);
  int rc = sqlite3_bind_text(st, 1, sid, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 2, json_integer_value(seq));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = bind_value(st, 4, time);
  if (rc == SQLITE_OK)
    rc = bind_value(st, 5, turn);
  if (rc == SQLITE_OK)
    rc = bind_value(st, 6, msg);
  size_t big = 0;
  if (rc == SQLITE_OK)
    rc = bind_json_big(st, 7, data, "{}", &big);
  int status = step_write(q, st, rc);
  if (status < 0)
    return status;
  sqlite3_int64 cursor = sqlite3_last_insert_rowid(q->w.db);
  if (big && (status = fill_big(q, "events", "data", cursor, data, big)) < 0)
    return status;
  PREPARE(q, up, W_EVENT_LAST_SEQ);
  rc = sqlite3_bind_text(up, 1, sid, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(up, 2, json_integer_value(seq));
  status = step_write(q, up, rc);
  if (status == 0)
    json_array_append_new(res, json_integer(cursor));
  return status;
}

static int op_inbox_put(sq_store *q, const json_t *op, json_t *res) {
  const char *mid = get_str(op, "messageId");
  const char *sid = get_str(op, "sessionId");
  const json_t *content = json_object_get(op, "content");
  const json_t *state = json_object_get(op, "state");
  PREPARE(q, st, W_INBOX_PUT);
  int rc = sqlite3_bind_text(st, 1, mid, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 2, sid, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = bind_value(st, 3, json_object_get(op, "time"));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 4, state ? json_string_value(state) : "queued", -1, SQLITE_STATIC);
  rc = step_write(q, st, rc);
  if (rc < 0)
    return rc;
  PREPARE(q, ct, W_INBOX_CONTENT);
  size_t big = 0;
  rc = sqlite3_bind_text(ct, 1, mid, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = bind_json_big(ct, 2, content, NULL, &big);
  rc = step_write(q, ct, rc);
  if (rc == 0 && big)
    rc = fill_big(q, "inbox_content", "content", sqlite3_last_insert_rowid(q->w.db), content, big);
  if (rc == 0)
    json_array_append_new(res, json_null());
  return rc;
}

static int op_inbox_state(sq_store *q, const json_t *op, json_t *res) {
  const char *mid = get_str(op, "messageId");
  const char *state = get_str(op, "state");
  const json_t *turn = json_object_get(op, "turnId");
  PREPARE(q, st, W_INBOX_STATE);
  int rc = sqlite3_bind_text(st, 1, mid, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = bind_value(st, 3, turn);
  rc = step_write(q, st, rc);
  if (rc == 0 && sqlite3_changes(q->w.db) == 0) {
    set_err(q, "inbox.state: no message %s", mid);
    rc = AH_ENOENT;
  }
  if (rc == 0)
    json_array_append_new(res, json_null());
  return rc;
}

static int op_request_put(sq_store *q, const json_t *op, json_t *res) {
  const json_t *r = json_object_get(op, "request");
  const char *id = get_str(r, "id");
  const char *sid = get_str(r, "sessionId");
  const char *kind = get_str(r, "kind");
  const json_t *turn = json_object_get(r, "turnId");
  const json_t *state = json_object_get(r, "state");
  PREPARE(q, st, W_REQUEST_PUT);
  int rc = sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 2, sid, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = bind_value(st, 3, turn);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 4, kind, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = bind_json(st, 5, json_object_get(r, "params"), NULL);
  if (rc == SQLITE_OK)
    rc = bind_json(st, 6, json_object_get(r, "options"), NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 7, state ? json_string_value(state) : "pending", -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = bind_json(st, 8, json_object_get(r, "answer"), NULL);
  if (rc == SQLITE_OK)
    rc = bind_value(st, 9, json_object_get(r, "created"));
  if (rc == SQLITE_OK)
    rc = bind_value(st, 10, json_object_get(r, "resolved"));
  rc = step_write(q, st, rc);
  if (rc == 0)
    json_array_append_new(res, json_null());
  return rc;
}

/* A request is resolved once: the first answer wins and a later one fails with AH_ESTATE (two clients
 * may answer the same approval). */
static int op_request_state(sq_store *q, const json_t *op, json_t *res) {
  const char *id = get_str(op, "id");
  const char *state = get_str(op, "state");
  PREPARE(q, st, W_REQUEST_STATE);
  int rc = sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = bind_json(st, 3, json_object_get(op, "answer"), NULL);
  if (rc == SQLITE_OK)
    rc = bind_value(st, 4, json_object_get(op, "resolved"));
  rc = step_write(q, st, rc);
  if (rc == 0 && sqlite3_changes(q->w.db) == 0) {
    PREPARE(q, ex, W_REQUEST_EXISTS);
    bool exists =
        sqlite3_bind_text(ex, 1, id, -1, SQLITE_STATIC) == SQLITE_OK && sqlite3_step(ex) == SQLITE_ROW;
    done(ex);
    set_err(q, "request.state: request %s %s", id, exists ? "is already resolved" : "does not exist");
    rc = exists ? AH_ESTATE : AH_ENOENT;
  }
  if (rc == 0)
    json_array_append_new(res, json_null());
  return rc;
}

static int owner_put(sq_store *q, const char *owner, json_int_t until) {
  PREPARE(q, st, W_OWNER_PUT);
  int rc = sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 2, until);
  return step_write(q, st, rc);
}

static int op_lease(sq_store *q, const json_t *op, json_t *res) {
  const char *id = get_str(op, "id");
  const char *owner = get_str(op, "owner");
  const json_t *until = json_object_get(op, "until");
  const json_t *now = json_object_get(op, "now");
  const json_t *steal = json_object_get(op, "steal");
  PREPARE(q, st, W_LEASE);
  int rc = sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 3, json_integer_value(until));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 4, json_integer_value(now));
  if (rc == SQLITE_OK)
    rc = bind_value(st, 5, steal);
  rc = step_write(q, st, rc);
  bool taken = rc == 0 && sqlite3_changes(q->w.db) > 0;
  if (taken) /* the owner's heartbeat keeps it from now on (lease.renew) */
    rc = owner_put(q, owner, json_integer_value(until));
  if (rc == 0)
    json_array_append_new(res, json_boolean(taken));
  return rc;
}

/* lease.renew {owner, until, now} → {lapsed}: the process's heartbeat, one row for all its sessions. lapsed
 * is true when the heartbeat had run out (or never existed) before this renewal: another process may have
 * taken some of its sessions meanwhile, which the caller then checks. Heartbeats dead for a day are
 * removed. */
#define OWNER_PRUNE_MS (24ll * 3600 * 1000)

static int op_lease_renew(sq_store *q, const json_t *op, json_t *res) {
  const char *owner = get_str(op, "owner");
  const json_t *until = json_object_get(op, "until");
  const json_t *now = json_object_get(op, "now");
  PREPARE(q, get, W_OWNER_GET);
  int rc = sqlite3_bind_text(get, 1, owner, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_step(get);
  bool lapsed = rc != SQLITE_ROW || sqlite3_column_int64(get, 0) < json_integer_value(now);
  if (rc == SQLITE_ROW || rc == SQLITE_DONE)
    rc = SQLITE_OK;
  else
    set_err(q, "%s", sqlite3_errmsg(q->w.db));
  done(get);
  if (rc != SQLITE_OK)
    return map_rc(rc);
  int out = owner_put(q, owner, json_integer_value(until));
  if (out == 0) {
    PREPARE(q, prune, W_OWNER_PRUNE);
    out = step_write(q, prune, sqlite3_bind_int64(prune, 1, json_integer_value(now) - OWNER_PRUNE_MS));
  }
  if (out == 0)
    json_array_append_new(res, json_pack("{s:b}", "lapsed", lapsed));
  return out;
}

/* store.shrink {}: the writer connection's page cache goes back to the heap (its own thread: connections
 * are opened without a mutex). Asked when the sessions left memory (idle unload). */
static int op_store_shrink(sq_store *q, const json_t *op, json_t *res) {
  (void)op;
  sqlite3_db_release_memory(q->w.db);
  json_array_append_new(res, json_null());
  return 0;
}

/* lease.end {owner}: the process stops; its heartbeat goes (its leases were released before). */
static int op_lease_end(sq_store *q, const json_t *op, json_t *res) {
  const char *owner = get_str(op, "owner");
  PREPARE(q, st, W_OWNER_END);
  int rc = step_write(q, st, sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC));
  if (rc == 0)
    json_array_append_new(res, json_null());
  return rc;
}

static int op_lease_release(sq_store *q, const json_t *op, json_t *res) {
  const char *id = get_str(op, "id");
  const char *owner = get_str(op, "owner");
  PREPARE(q, st, W_LEASE_RELEASE);
  int rc = sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
  rc = step_write(q, st, rc);
  if (rc == 0)
    json_array_append_new(res, json_null());
  return rc;
}

/* The fence of every write a live session makes: inside the transaction, the session's lease must still
 * be held by `owner` (a process's owner id, unique per process: "host:pid:nonce", so it is the fencing
 * token of the lease it took). Another owner, or none, fails the opset with AH_EAGENTBUSY — whether or not
 * the lease has expired — so a process that lost its lease (stopped past the TTL, its session taken over)
 * can never write over the events of the process that took it. */
static int op_fence(sq_store *q, const json_t *op, json_t *res) {
  const char *id = get_str(op, "id");
  const char *owner = get_str(op, "owner");
  PREPARE(q, st, W_FENCE);
  int rc = sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    int out = rc == SQLITE_DONE ? AH_ENOENT : map_rc(rc);
    set_err(q, "fence: session %s: %s", id, rc == SQLITE_DONE ? "no such session" : sqlite3_errmsg(q->w.db));
    done(st);
    return out;
  }
  const char *holder = (const char *)sqlite3_column_text(st, 0);
  bool mine = holder && strcmp(holder, owner) == 0;
  if (!mine)
    set_err(q, "fence: session %s is owned by %s, not by this process", id, holder ? holder : "no process");
  done(st);
  if (!mine)
    return AH_EAGENTBUSY;
  json_array_append_new(res, json_null());
  return 0;
}

/* notify {payload}: a signal to the other hosts of a shared store; SQLite has none (one machine, and a
 * process sharing the file learns of changes when it reads). */
static int op_notify(sq_store *q, const json_t *op, json_t *res) {
  (void)q;
  (void)op;
  json_array_append_new(res, json_null());
  return 0;
}

static int64_t sq_last_cursor(void *impl) {
  sq_store *q = impl;
  sqlite3_int64 v = 0;
  return q->r.db && query_one(q->r.db, "SELECT coalesce(max(cursor), 0) FROM events", &v, NULL) == SQLITE_OK
             ? v
             : -1;
}

/* The operations by kind (store_ops.h): each may rely on the checks ah__store_op_check made. */
static int (*const ops[])(sq_store *q, const json_t *op, json_t *res) = {
    [AH_OP_NOTIFY] = op_notify,
    [AH_OP_FENCE] = op_fence,
    [AH_OP_EVENT] = op_event,
    [AH_OP_SESSION_PUT] = op_session_put,
    [AH_OP_SESSION_UPDATE] = op_session_update,
    [AH_OP_SESSION_DELETE] = op_session_delete,
    [AH_OP_INBOX_PUT] = op_inbox_put,
    [AH_OP_INBOX_STATE] = op_inbox_state,
    [AH_OP_REQUEST_PUT] = op_request_put,
    [AH_OP_REQUEST_STATE] = op_request_state,
    [AH_OP_LEASE] = op_lease,
    [AH_OP_LEASE_RELEASE] = op_lease_release,
    [AH_OP_LEASE_RENEW] = op_lease_renew,
    [AH_OP_LEASE_END] = op_lease_end,
    [AH_OP_STORE_SHRINK] = op_store_shrink,
};

/* Apply every operation of one opset; stops at the first failure (the caller rolls the opset back). */
static int apply_opset(sq_store *q, const json_t *opset, json_t *res, size_t *failed_at) {
  size_t i = 0;
  const json_t *op = NULL;
  json_array_foreach(opset, i, op) {
    *failed_at = i;
    ah_store_op kind = ah__store_op_check(op, q->err, sizeof q->err);
    if (kind == AH_OP_INVALID)
      return AH_EINVAL;
    int rc = ops[kind](q, op, res);
    if (rc < 0)
      return rc;
  }
  return 0;
}

static void fail_all(json_t **results, int *statuses, size_t n, int code) {
  for (size_t i = 0; i < n; i++) {
    json_decref(results[i]);
    results[i] = NULL;
    statuses[i] = code;
  }
}

static void sq_write_group(void *impl, json_t *const *opsets, size_t n, json_t **results, int *statuses) {
  sq_store *q = impl;
  for (size_t i = 0; i < n; i++) {
    results[i] = NULL;
    statuses[i] = AH_EIO;
  }
  if (!q->w.db) {
    fail_all(results, statuses, n, AH_EPERM);
    return;
  }
  int begin = run(q, &q->w, W_BEGIN);
  if (begin != SQLITE_OK) {
    note_health(q, q->w.db, sqlite3_extended_errcode(q->w.db));
    AH_LOG_E(COMP, "%s: cannot begin a transaction (%zu opsets fail): %s", q->path, n, q->err);
    /* Busy: another connection held the write lock past the busy timeout (waited for already). */
    fail_all(results, statuses, n, (begin & 0xff) == SQLITE_BUSY ? AH_EBUSY : AH_EIO);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (run(q, &q->w, W_SAVEPOINT) != SQLITE_OK)
      goto abort;
    json_t *res = json_array();
    size_t at = 0;
    int rc = res ? apply_opset(q, opsets[i], res, &at) : AH_ENOMEM;
    if (rc == 0) {
      if (run(q, &q->w, W_RELEASE) != SQLITE_OK) {
        json_decref(res);
        goto abort;
      }
      results[i] = res;
      statuses[i] = 0;
      continue;
    }
    json_decref(res);
    statuses[i] = rc;
    if (rc == AH_EIO)
      note_health(q, q->w.db, sqlite3_extended_errcode(q->w.db));
    AH_LOG_W(COMP, "opset failed at operation %zu (%s): %s", at, ah_err_name(rc), q->err);
    /* Some errors (I/O, disk full, out of memory) make SQLite roll the whole transaction back: then
     * nothing of this group was written. */
    if (sqlite3_get_autocommit(q->w.db))
      goto abort;
    if (run(q, &q->w, W_ROLLBACK_TO) != SQLITE_OK || run(q, &q->w, W_RELEASE) != SQLITE_OK)
      goto abort;
  }
  if (run(q, &q->w, W_COMMIT) == SQLITE_OK) {
    note_commit(q);
    restart_wal(q);
    return;
  }
abort:
  note_health(q, q->w.db, sqlite3_extended_errcode(q->w.db));
  AH_LOG_E(COMP, "%s: transaction failed, %zu opsets not written: %s", q->path, n, q->err);
  if (!sqlite3_get_autocommit(q->w.db))
    run(q, &q->w, W_ROLLBACK);
  fail_all(results, statuses, n, AH_EIO);
}

/* ---- reads (loop thread) ----------------------------------------------------------------------------- */

static sqlite3_int64 sql_limit(size_t limit) {
  return limit == 0 || limit > (size_t)INT64_MAX ? -1 : (sqlite3_int64)limit;
}

/* Step a bound read statement: an array of rows, or the first row alone when `single` (json NULL when no
 * row). NULL on error (logged). */
static json_t *collect(sq_store *q, sqlite3_stmt *st, int bind_rc, json_t *(*row)(sqlite3_stmt *),
                       bool single) {
  json_t *out = single ? NULL : json_array();
  int rc = bind_rc;
  q->read_failed = false;
  if (rc == SQLITE_OK && (single || out)) {
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      json_t *o = row(st);
      if (single) {
        out = o;
        break;
      }
      json_array_append_new(out, o);
    }
    if (rc == SQLITE_ROW || rc == SQLITE_DONE)
      rc = SQLITE_OK;
  }
  if (rc != SQLITE_OK) {
    AH_LOG_E(COMP, "%s: read failed: %s", q->path, sqlite3_errmsg(q->r.db));
    note_read_failure(q);
    q->read_failed = true;
    json_decref(out);
    out = NULL;
  }
  done(st);
  return out;
}

#define READ_STMT(q, st, id)          \
  sqlite3_stmt *st = stmt(&q->r, id); \
  if (!st) {                          \
    q->read_failed = true;            \
    return NULL;                      \
  }

static json_t *sq_get_session(void *impl, const char *id) {
  sq_store *q = impl;
  READ_STMT(q, st, R_SESSION);
  return collect(q, st, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), row_session, true);
}

static json_t *sq_list_sessions(void *impl, const char *after_id, size_t limit) {
  sq_store *q = impl;
  READ_STMT(q, st, after_id ? R_SESSIONS_AFTER : R_SESSIONS);
  int rc = sqlite3_bind_int64(st, 1, sql_limit(limit));
  if (rc == SQLITE_OK && after_id)
    rc = sqlite3_bind_text(st, 2, after_id, -1, SQLITE_STATIC);
  return collect(q, st, rc, row_session, false);
}

static json_t *sq_events(void *impl, const char *session_id, int64_t after_seq, size_t limit) {
  sq_store *q = impl;
  READ_STMT(q, st, R_EVENTS);
  int rc = sqlite3_bind_int64(st, 1, sql_limit(limit));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_text(st, 2, session_id, -1, SQLITE_STATIC);
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 3, after_seq);
  return collect(q, st, rc, row_event, false);
}

static json_t *sq_events_after(void *impl, int64_t after_cursor, size_t limit) {
  sq_store *q = impl;
  READ_STMT(q, st, R_EVENTS_AFTER);
  int rc = sqlite3_bind_int64(st, 1, sql_limit(limit));
  if (rc == SQLITE_OK)
    rc = sqlite3_bind_int64(st, 2, after_cursor);
  return collect(q, st, rc, row_event, false);
}

static json_t *sq_inbox_open(void *impl, const char *session_id) {
  sq_store *q = impl;
  READ_STMT(q, st, R_INBOX_OPEN);
  return collect(q, st, sqlite3_bind_text(st, 1, session_id, -1, SQLITE_STATIC), row_inbox, false);
}

static json_t *sq_requests_pending(void *impl, const char *session_id) {
  sq_store *q = impl;
  READ_STMT(q, st, session_id ? R_REQUESTS_PENDING_OF : R_REQUESTS_PENDING);
  int rc = session_id ? sqlite3_bind_text(st, 1, session_id, -1, SQLITE_STATIC) : SQLITE_OK;
  return collect(q, st, rc, row_request, false);
}

static json_t *sq_get_request(void *impl, const char *id) {
  sq_store *q = impl;
  READ_STMT(q, st, R_REQUEST);
  return collect(q, st, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), row_request, true);
}

static json_t *sq_sessions_to_recover(void *impl) {
  sq_store *q = impl;
  READ_STMT(q, st, R_RECOVER);
  return collect(q, st, SQLITE_OK, row_session, false);
}

static json_t *row_tree(sqlite3_stmt *st) {
  return json_pack("{s:o, s:o, s:o}", "id", col_value(st, 0), "parent", col_value(st, 1), "usage",
                   col_json(st, 2, json_object()));
}

static json_t *sq_session_tree(void *impl, const char *id) {
  sq_store *q = impl;
  READ_STMT(q, st, R_TREE);
  return collect(q, st, sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC), row_tree, false);
}

/* ---- open / close ------------------------------------------------------------------------------------ */

static void conn_close(conn *c) {
  for (int i = 0; i < STMT_COUNT; i++) {
    sqlite3_finalize(c->st[i]);
    c->st[i] = NULL;
  }
  if (c->db)
    sqlite3_close_v2(c->db);
  c->db = NULL;
}

#define CKPT_INTERVAL_MS 200
#define WAL_RESTART_FRAMES 4096

static int conn_open(conn *c, const char *path, int flags, char **why);

static void *ckpt_main(void *arg) {
  sq_store *q = arg;
  /* Opened here, not in open(): a host that starts to answer one request (an sdk child) does not wait for
   * a third connection it may never need. Without it, checkpoints are skipped and the last connection to
   * close still checkpoints the WAL. */
  if (conn_open(&q->c, q->path, SQLITE_OPEN_READWRITE, NULL) != 0) {
    AH_LOG_W(COMP, "%s: no checkpoint connection; the WAL is checkpointed only at close", q->path);
    return NULL;
  }
  /* A connection learns that the database is in WAL mode from its first read: until then a checkpoint on
   * it is a no-op that reports success (log and done -1), and the WAL would grow with every write. */
  sqlite3_int64 tables = 0;
  if (query_one(q->c.db, "SELECT count(*) FROM sqlite_master", &tables, NULL) != SQLITE_OK) {
    AH_LOG_W(COMP,
             "%s: the checkpoint connection cannot read the database (%s); the WAL is checkpointed only "
             "at close",
             q->path, sqlite3_errmsg(q->c.db));
    return NULL;
  }
  bool warned = false;
  pthread_mutex_lock(&q->ckpt_mu);
  while (!q->ckpt_stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += CKPT_INTERVAL_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&q->ckpt_cv, &q->ckpt_mu, &until);
    if (q->ckpt_stop)
      break;
    pthread_mutex_unlock(&q->ckpt_mu);
    /* PASSIVE copies what no reader still needs and returns; SQLITE_BUSY just means "try next time". (The
     * WAL is started over by the writer: restart_wal.) */
    int log = 0;
    int done = 0;
    int rc = sqlite3_wal_checkpoint_v2(q->c.db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
    if (rc == SQLITE_OK && log < 0 && !warned) {
      warned = true;
      AH_LOG_W(COMP,
               "%s: the checkpoint connection does not see a WAL; the WAL is checkpointed only at close",
               q->path);
    }
    sqlite3_db_release_memory(q->c.db); /* the pages it read are not read again: they need no cache */
    pthread_mutex_lock(&q->ckpt_mu);
  }
  pthread_mutex_unlock(&q->ckpt_mu);
  return NULL;
}

static void ckpt_stop(sq_store *q) {
  if (!q->ckpt_running)
    return;
  pthread_mutex_lock(&q->ckpt_mu);
  q->ckpt_stop = true;
  pthread_cond_signal(&q->ckpt_cv);
  pthread_mutex_unlock(&q->ckpt_mu);
  pthread_join(q->ckpt_thread, NULL);
  q->ckpt_running = false;
  pthread_mutex_destroy(&q->ckpt_mu);
  pthread_cond_destroy(&q->ckpt_cv);
}

static void sq_close(void *impl) {
  sq_store *q = impl;
  if (!q)
    return;
  ckpt_stop(q);
  conn_close(&q->c);
  /* The reader goes first: the last connection to close checkpoints the WAL into the database and removes
   * it, which a read-only connection cannot do. */
  conn_close(&q->r);
  conn_close(&q->w);
  pthread_mutex_destroy(&q->health_mu);
  free(q->path);
  free(q);
}

/* Open `c` and set the busy timeout. Returns 0 or an AH_E* code with *why. */
static int conn_open(conn *c, const char *path, int flags, char **why) {
  int rc = sqlite3_open_v2(path, &c->db, flags | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    set_why(why, "store: cannot open %s: %s", path, c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
    return AH_EIO;
  }
  sqlite3_extended_result_codes(c->db, 1);
  sqlite3_busy_timeout(c->db, BUSY_TIMEOUT_MS);
  return 0;
}

/* The first column of the first row of `sql` as an integer (*text, may be NULL, receives it as a copy). */
static int query_one(sqlite3 *db, const char *sql, sqlite3_int64 *num, char **text) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
  if (rc == SQLITE_OK) {
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
      if (num)
        *num = sqlite3_column_int64(st, 0);
      if (text) {
        const char *t = (const char *)sqlite3_column_text(st, 0);
        *text = strdup(t ? t : "");
      }
      rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
      rc = SQLITE_OK;
    }
  }
  sqlite3_finalize(st);
  return rc;
}

/* Refuse what must not be touched: not a database, corrupt, or written by a newer agenthost. Reads only.
 * On success *version is the file's schema version. */
static int check_file(sqlite3 *db, const char *path, int *version, char **why) {
  sqlite3_int64 v = 0;
  int rc = query_one(db, "PRAGMA user_version", &v, NULL);
  if (rc == SQLITE_NOTADB) {
    set_why(why, "store: %s is not an SQLite database; refusing to use or overwrite it", path);
    return AH_ECONFIG;
  }
  if ((rc & 0xff) == SQLITE_CORRUPT) {
    set_why(why, "store: %s is corrupt (%s); refusing to use or overwrite it", path, sqlite3_errmsg(db));
    return AH_EIO;
  }
  if (rc != SQLITE_OK) {
    set_why(why, "store: cannot read %s: %s", path, sqlite3_errmsg(db));
    return AH_EIO;
  }
  char *verdict = NULL;
  rc = query_one(db, "PRAGMA quick_check(1)", NULL, &verdict);
  if (rc == SQLITE_NOTADB) {
    free(verdict);
    set_why(why, "store: %s is not an SQLite database; refusing to use or overwrite it", path);
    return AH_ECONFIG;
  }
  if (rc != SQLITE_OK || !verdict || strcmp(verdict, "ok") != 0) {
    set_why(why, "store: %s is corrupt (%s); refusing to use or overwrite it", path,
            rc != SQLITE_OK ? sqlite3_errmsg(db)
            : verdict       ? verdict
                            : "out of memory");
    free(verdict);
    return AH_EIO;
  }
  free(verdict);
  if (v > SCHEMA_VERSION || v < 0) {
    set_why(why,
            "store: %s has schema version %lld, newer than version %d that this agenthost knows; refusing "
            "to open it (upgrade agenthost)",
            path, (long long)v, SCHEMA_VERSION);
    return AH_ECONFIG;
  }
  *version = (int)v;
  return 0;
}

/* Bring the database to SCHEMA_VERSION in one transaction. Another process may be doing the same: the
 * version is read again under the write lock. */
static int migrate(sqlite3 *db, const char *path, char **why) {
  char *err = NULL;
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, &err) != SQLITE_OK) {
    set_why(why, "store: cannot lock %s to migrate it: %s", path, err ? err : sqlite3_errmsg(db));
    sqlite3_free(err);
    return AH_EIO;
  }
  sqlite3_int64 v = 0;
  int rc = query_one(db, "PRAGMA user_version", &v, NULL);
  if (rc != SQLITE_OK || v > SCHEMA_VERSION) {
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
      set_why(why, "store: cannot read %s: %s", path, sqlite3_errmsg(db));
      return AH_EIO;
    }
    set_why(why, "store: %s has schema version %lld, newer than version %d that this agenthost knows", path,
            (long long)v, SCHEMA_VERSION);
    return AH_ECONFIG;
  }
  for (int i = (int)v; i < SCHEMA_VERSION; i++) {
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", i + 1);
    if (sqlite3_exec(db, migrations[i], NULL, NULL, &err) != SQLITE_OK ||
        sqlite3_exec(db, pragma, NULL, NULL, &err) != SQLITE_OK) {
      set_why(why, "store: migration of %s to version %d failed: %s", path, i + 1,
              err ? err : sqlite3_errmsg(db));
      sqlite3_free(err);
      sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
      return AH_EIO;
    }
    AH_LOG_I(COMP, "%s: schema migrated to version %d", path, i + 1);
  }
  if (sqlite3_exec(db, "COMMIT", NULL, NULL, &err) != SQLITE_OK) {
    set_why(why, "store: cannot commit the migration of %s: %s", path, err ? err : sqlite3_errmsg(db));
    sqlite3_free(err);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return AH_EIO;
  }
  return 0;
}

static int open_writer(sq_store *q, const ah_store_opts *opts, char **why) {
  int rc = conn_open(&q->w, q->path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, why);
  int version = 0;
  if (rc == 0)
    rc = check_file(q->w.db, q->path, &version, why);
  if (rc < 0)
    return rc;
  char *mode = NULL;
  if (query_one(q->w.db, "PRAGMA journal_mode = WAL", NULL, &mode) != SQLITE_OK || !mode ||
      strcmp(mode, "wal") != 0) {
    set_why(why, "store: cannot switch %s to WAL (%s)", q->path, mode ? mode : sqlite3_errmsg(q->w.db));
    free(mode);
    return AH_EIO;
  }
  free(mode);
  const char *sync = opts->sync == AH_STORE_SYNC_OFF    ? "PRAGMA synchronous = OFF"
                     : opts->sync == AH_STORE_SYNC_FULL ? "PRAGMA synchronous = FULL"
                                                        : "PRAGMA synchronous = NORMAL";
  if (sqlite3_exec(q->w.db, sync, NULL, NULL, NULL) != SQLITE_OK) {
    set_why(why, "store: %s: %s", q->path, sqlite3_errmsg(q->w.db));
    return AH_EIO;
  }
  return version < SCHEMA_VERSION ? migrate(q->w.db, q->path, why) : 0;
}

static int sq_open(const ah_store_opts *opts, void **impl, char **why) {
  *impl = NULL;
  if (why)
    *why = NULL;
  if (opts->sync != AH_STORE_SYNC_INVALID && opts->sync != AH_STORE_SYNC_OFF &&
      opts->sync != AH_STORE_SYNC_NORMAL && opts->sync != AH_STORE_SYNC_FULL) {
    set_why(why, "store: unknown synchronous setting %d", (int)opts->sync);
    return AH_EINVAL;
  }
  sq_store *q = calloc(1, sizeof *q);
  if (!q || !(q->path = strdup(opts->path))) {
    free(q);
    set_why(why, "store: out of memory");
    return AH_ENOMEM;
  }
  q->wal_restart_frames = opts->wal_restart_frames > 0 && opts->wal_restart_frames < (1u << 30)
                              ? (int)opts->wal_restart_frames
                              : WAL_RESTART_FRAMES;
  pthread_mutex_init(&q->health_mu, NULL);
  int rc = 0;
  if (opts->read_only) {
    struct stat st;
    if (stat(opts->path, &st) != 0) {
      int e = errno;
      set_why(why, "store: %s: %s (a read-only open never creates the database)", opts->path, strerror(e));
      sq_close(q);
      return e == ENOENT ? AH_ENOENT : AH_EIO;
    }
    rc = conn_open(&q->r, q->path, SQLITE_OPEN_READONLY, why);
    int version = 0;
    if (rc == 0)
      rc = check_file(q->r.db, q->path, &version, why);
    if (rc == 0 && version < SCHEMA_VERSION) {
      set_why(why,
              "store: %s has schema version %d, older than version %d; open it once read-write to migrate it",
              q->path, version, SCHEMA_VERSION);
      rc = AH_ECONFIG;
    }
  } else {
    rc = open_writer(q, opts, why);
    /* Opened after the migration, so it never sees a half-made schema. */
    if (rc == 0)
      rc = conn_open(&q->r, q->path, SQLITE_OPEN_READONLY, why);
    /* Checkpoints are the checkpoint thread's; a WAL that a burst of writes made large is cut back to 16 MiB
     * when the writer starts it over. */
    if (rc == 0 &&
        sqlite3_exec(q->w.db, "PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = 16777216", NULL,
                     NULL, NULL) != SQLITE_OK) {
      set_why(why, "store: %s: %s", q->path, sqlite3_errmsg(q->w.db));
      rc = AH_EIO;
    }
    if (rc == 0) /* after wal_autocheckpoint, which sets the hook too: restart_wal starts the WAL over */
      sqlite3_wal_hook(q->w.db, wal_grew, q);
    if (rc == 0) {
      pthread_mutex_init(&q->ckpt_mu, NULL);
      pthread_cond_init(&q->ckpt_cv, NULL);
      if (pthread_create(&q->ckpt_thread, NULL, ckpt_main, q) != 0) {
        pthread_mutex_destroy(&q->ckpt_mu);
        pthread_cond_destroy(&q->ckpt_cv);
        set_why(why, "store: cannot start the checkpoint thread");
        rc = AH_EIO;
      } else {
        q->ckpt_running = true;
      }
    }
  }
  if (rc < 0) {
    AH_LOG_E(COMP, "%s", why && *why ? *why : "cannot open the store");
    sq_close(q);
    return rc;
  }
  *impl = q;
  return 0;
}

const ah_store_backend ah__store_sqlite = {
    .name = "sqlite",
    .open = sq_open,
    .close = sq_close,
    .write_group = sq_write_group,
    .get_session = sq_get_session,
    .list_sessions = sq_list_sessions,
    .events = sq_events,
    .events_after = sq_events_after,
    .inbox_open = sq_inbox_open,
    .requests_pending = sq_requests_pending,
    .get_request = sq_get_request,
    .sessions_to_recover = sq_sessions_to_recover,
    .session_tree = sq_session_tree,
    .health = sq_health,
    .read_failed = sq_read_failed,
    .release_memory = sq_release_memory,
    .memory_used = sq_memory_used,
    .last_cursor = sq_last_cursor,
};
