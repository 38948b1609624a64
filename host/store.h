/* agenthost — the durable store (internal): the ah_store interface and its group-commit writer.
 *
 * Writes are lists of operations ("opsets") that commit atomically. They are handed to one dedicated
 * writer thread (not the libuv pool, DECISIONS.md), which takes every opset queued since its last commit
 * and commits them in ONE transaction (group commit), then reports each opset's result on the loop
 * thread, in submission order. So the loop never waits for the disk, and many small writes of one loop
 * turn cost one commit.
 *
 * Reads run on a second dedicated thread, the reader, through a separate read connection (WAL lets readers
 * run beside the writer): ah__store_read submits a list of queries and its callback gets their results on
 * the loop thread, so a slow read (a remote database, a lost connection: up to its deadline) never stops
 * the loop. Reads run one at a time in submission order and see everything whose write callback had run
 * when they were submitted. The blocking reads (ah__store_get_session...) are for programs without a
 * loop to keep running (the CLI) and for tests.
 *
 * A backend implements ah_store_backend; store_sqlite.c is the SQLite one (WAL, schema version in
 * PRAGMA user_version, forward migrations; a corrupt file or a newer schema is refused, never rewritten).
 *
 * Operations (JSON objects in an opset array):
 *   {"op":"session.put", "session":{...}}               insert or replace a session row (fields below)
 *   {"op":"session.update", "id":S, "set":{...}}        update some fields of a session
 *   {"op":"session.delete", "id":S}                     delete a session with its events, inbox, requests
 *   {"op":"event", "sessionId":S, "seq":N, "kind":K, "time":T, "turnId"?:U, "messageId"?:M, "data":{...}}
 *                                                       append an event; result: its cursor (integer)
 *   {"op":"inbox.put", "messageId":M, "sessionId":S, "content":[...], "time":T, "state"?:"queued"|"posted"}
 *                                                       state "queued" (the owner's), or "posted": written by
 *                                                       a host that does not own the session, not yet taken
 *                                                       in by the owner (docs/scaling.md)
 *   {"op":"inbox.state", "messageId":M, "state":"queued"|"claimed"|"done"|"cancelled", "turnId"?:U}
 *   {"op":"request.put", "request":{...}}               insert a server request (fields below)
 *   {"op":"request.state", "id":R, "state":"granted"|"denied"|"answered"|"cancelled", "answer"?:{...},
 *    "resolved":T}
 *   {"op":"lease", "id":S, "owner":O, "until":MS, "now":MS, "steal"?:O2}
 *                                                       take or renew the ownership lease of session S:
 *                                                       succeeds when it is free, already O's, expired
 *                                                       (until < now) or held by O2; result: true/false
 *   {"op":"lease.release", "id":S, "owner":O}           release it if O holds it
 *   {"op":"notify", "payload":P}                         signal P to every host watching the store, once the
 *                                                       transaction commits (a shared store; else nothing)
 * An opset whose operation fails (a constraint, a missing row for inbox.state) fails as a whole and is
 * rolled back alone; the other opsets of the same group still commit.
 *
 * Rows as JSON:
 *   session {id, cwd, title, provider, model, parent|null, local, depth, status, closed, created, updated,
 *            policy{tool: allow|ask|deny}, tags[], lastSeq, leaseOwner|null, leaseUntil, settings{},
 *            usage{}}
 *   event   {cursor, sessionId, seq, kind, time, turnId?, messageId?, data}   (DECISIONS.md)
 *   inbox   {messageId, sessionId, content, state, turnId|null, time}
 *   request {id, sessionId, turnId|null, kind, params, options, state, answer|null, created, resolved|null}
 */
#ifndef AGENTHOST_HOST_STORE_H
#define AGENTHOST_HOST_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct ah_store ah_store;

typedef enum ah_store_sync {
  AH_STORE_SYNC_INVALID = 0,
  AH_STORE_SYNC_OFF,
  AH_STORE_SYNC_NORMAL, /* default: survives a killed process, not a power loss */
  AH_STORE_SYNC_FULL,   /* survives a power loss */
} ah_store_sync;

typedef struct ah_store_opts {
  const char *path; /* SQLite: the database file (state_dir/agenthost.db) */
  /* PostgreSQL: the connection string (a libpq URI or key=value list) and the password (NULL: none, or
   * libpq's own sources). Neither is ever logged. */
  const char *url;
  const char *password;
  ah_store_sync sync;
  bool read_only; /* CLI readers: never create, never migrate, never write */
  /* SQLite: past this many frames in the WAL a checkpoint waits for the writer and the readers so that the
   * WAL starts again from its beginning (0: 4096, 16 MiB of 4 KiB pages). */
  unsigned wal_restart_frames;
} ah_store_opts;

/* A backend. write_group runs on the writer thread, with no other call of the backend in between on that
 * connection. The reads, read_failed, release_memory, last_cursor and posted run on one thread at a time
 * (the reader, or a blocking read's caller) on the read connection. The rest run on the loop thread. */
typedef struct ah_store_backend {
  const char *name;
  int (*open)(const ah_store_opts *opts, void **impl, char **why);
  void (*close)(void *impl);
  /* Commit `n` opsets in one transaction; results[i] gets a new array (one entry per op: the cursor for
   * an event, true/false for a lease, null otherwise) or NULL with statuses[i] < 0 when opset i failed. */
  void (*write_group)(void *impl, json_t *const *opsets, size_t n, json_t **results, int *statuses);
  json_t *(*get_session)(void *impl, const char *id);
  /* Sessions ordered by id (UUIDv7 ids sort by creation time), after `after_id` (NULL = from the start). */
  json_t *(*list_sessions)(void *impl, const char *after_id, size_t limit);
  /* Events of a session with seq > after_seq, in seq order. */
  json_t *(*events)(void *impl, const char *session_id, int64_t after_seq, size_t limit);
  /* Events of every session with cursor > after_cursor, in cursor order. */
  json_t *(*events_after)(void *impl, int64_t after_cursor, size_t limit);
  /* Inbox rows of a session not done or cancelled, oldest first. */
  json_t *(*inbox_open)(void *impl, const char *session_id);
  /* Requests in state "pending" (of one session, or all with NULL), oldest first. */
  json_t *(*requests_pending)(void *impl, const char *session_id);
  json_t *(*get_request)(void *impl, const char *id);
  /* Sessions not closed that have open inbox rows or status "running" (to recover after a restart). */
  json_t *(*sessions_to_recover)(void *impl);
  /* A session and every session below it by parent link: [{id, parent, usage}] (empty: unknown id). */
  json_t *(*session_tree)(void *impl, const char *id);
  /* Any thread: AH_STORE_OK, AH_STORE_FULL or AH_STORE_DAMAGED, with a description in `detail`. */
  int (*health)(void *impl, char *detail, size_t cap);
  /* Read connection: whether the last read failed (a NULL from a read is then an error, not "not found"). */
  bool (*read_failed)(void *impl);
  /* Read connection: its cache goes back to the heap (the writer's: the store.shrink op). */
  void (*release_memory)(void *impl);
  /* Any thread: the bytes the backend holds in memory (its caches), -1 when it cannot tell. */
  int64_t (*memory_used)(void *impl);
  /* Read connection: the highest event cursor stored (0: none), -1 on error. */
  int64_t (*last_cursor)(void *impl);
  /* Signals between the hosts of a shared store (NULL when the backend has none: SQLite). watch_open runs
   * on the reader thread (a connection to the server), watch_read and watch_close on the loop thread, never
   * at the same time. watch_open opens the listening connection and returns its descriptor (to poll for
   * reading) or an AH_E* code with *why; watch_read takes what arrived and calls `fn` with each signal's
   * payload (0, or AH_EIO when the connection broke: open it again); watch_close closes it. Every group that
   * stores events also signals "events". */
  int (*watch_open)(void *impl, char **why);
  int (*watch_read)(void *impl, void (*fn)(const char *payload, void *arg), void *arg);
  void (*watch_close)(void *impl);
  /* Read connection: the sessions not closed with posted inbox rows, [{id, leaseOwner|null, free: bool}]
   * (free: no lease, or one that expired by the store's clock). NULL: not supported (no signals). */
  json_t *(*posted)(void *impl);
} ah_store_backend;

enum {
  AH_STORE_OK = 0,
  AH_STORE_FULL = 1,    /* writes fail for lack of space; cleared by the next commit */
  AH_STORE_DAMAGED = 2, /* corruption or an I/O error was reported: it stays so until a restart */
};

extern const ah_store_backend ah__store_sqlite;
extern const ah_store_backend ah__store_pg; /* store_pg.c (docs/scaling.md) */
/* The schema version this build writes (recordings' metadata). */
int ah__store_schema_version(void);

/* Open the store with `backend` (NULL = SQLite) and start its writer thread; `loop` receives the write
 * callbacks. Returns 0, or AH_EIO / AH_ECONFIG (corrupt file, newer schema, not a database) with *why. */
int ah__store_open(uv_loop_t *loop, const ah_store_backend *backend, const ah_store_opts *opts,
                   ah_store **out, char **why);

/* Commit `opset` (an array of operations, stolen). `cb` runs on the loop thread, in submission order,
 * with 0 and the results array (borrowed for the call), or a negative AH_E* code and NULL. */
typedef void (*ah_store_write_fn)(int status, const json_t *results, void *arg);
int ah__store_write(ah_store *s, json_t *opset, ah_store_write_fn cb, void *arg);
/* Give the store's caches back to the heap (the sessions left memory): the reader's after the reads
 * submitted before, then the writer's in submission order; `cb` (may be NULL) runs once both are done. */
int ah__store_shrink(ah_store *s, ah_store_write_fn cb, void *arg);
/* How many reads (queries) were made, so that a caller can tell a quiet store from a busy one. */
uint64_t ah__store_reads(const ah_store *s);
/* Whether reads submitted with ah__store_read are still in flight (loop thread). */
bool ah__store_reading(const ah_store *s);
/* The bytes the store holds in memory (its caches), -1 when its backend cannot tell. */
int64_t ah__store_memory_used(const ah_store *s);

/* What a read asks for (ah__store_read); `id` is copied. */
typedef enum ah_store_query_kind {
  AH_STORE_Q_SESSION,          /* the session `id`: its row, or null */
  AH_STORE_Q_SESSIONS,         /* sessions after the id `id` (NULL: from the start), at most `limit` */
  AH_STORE_Q_EVENTS,           /* events of session `id` with seq > `after`, at most `limit` */
  AH_STORE_Q_EVENTS_AFTER,     /* events of every session with cursor > `after`, at most `limit` */
  AH_STORE_Q_INBOX_OPEN,       /* inbox rows of session `id` not done or cancelled */
  AH_STORE_Q_REQUESTS_PENDING, /* pending requests of session `id` (NULL: of all) */
  AH_STORE_Q_REQUEST,          /* the request `id`: its row, or null */
  AH_STORE_Q_TO_RECOVER,       /* sessions to recover after a restart */
  AH_STORE_Q_TREE,             /* session `id` and those below it: [{id, parent, usage}] */
  AH_STORE_Q_LAST_CURSOR,      /* the highest event cursor stored (0: none) */
  AH_STORE_Q_POSTED,           /* see the backend's posted; null without signals */
} ah_store_query_kind;

typedef struct ah_store_query {
  ah_store_query_kind kind;
  const char *id;
  int64_t after;
  size_t limit;
} ah_store_query;

/* Run the `n` queries, in order, on the reader thread; `cb` runs on the loop thread with 0 and an array of
 * their `n` results (borrowed for the call), or AH_EIO (a query failed: none is given) or AH_ENOMEM and
 * NULL. When a read fails, the reads submitted before its failure was known fail at once (AH_EIO) rather
 * than each waiting for the database in turn. Returns 0, or AH_ECLOSED (the store is closing), AH_EINVAL or
 * AH_ENOMEM without calling `cb`. The store's close waits for the reads in flight and their callbacks. */
typedef void (*ah_store_read_fn)(int status, const json_t *results, void *arg);
int ah__store_read(ah_store *s, const ah_store_query *q, size_t n, ah_store_read_fn cb, void *arg);

/* Blocking reads, on the caller's thread (after the reader's current read). New references; NULL when not
 * found (get_*) or on error. */
json_t *ah__store_get_session(ah_store *s, const char *id);
json_t *ah__store_list_sessions(ah_store *s, const char *after_id, size_t limit);
json_t *ah__store_events(ah_store *s, const char *session_id, int64_t after_seq, size_t limit);
json_t *ah__store_events_after(ah_store *s, int64_t after_cursor, size_t limit);
json_t *ah__store_inbox_open(ah_store *s, const char *session_id);
json_t *ah__store_requests_pending(ah_store *s, const char *session_id);
json_t *ah__store_get_request(ah_store *s, const char *id);
json_t *ah__store_sessions_to_recover(ah_store *s);
json_t *ah__store_session_tree(ah_store *s, const char *id);

/* Health (see the backend's health): AH_STORE_OK, AH_STORE_FULL or AH_STORE_DAMAGED; `detail` (may be
 * NULL) receives a description. A NULL store is AH_STORE_DAMAGED ("the store cannot be opened"). */
int ah__store_health(ah_store *s, char *detail, size_t cap);
/* 0, or AH_EIO when the last blocking read failed (its NULL was an error, not "not found"). */
int ah__store_read_status(ah_store *s);
const char *ah__store_health_name(int health);

/* The highest event cursor stored (0: none; -1 on error). */
int64_t ah__store_last_cursor(ah_store *s);
/* See the backend's posted (NULL without signals). */
json_t *ah__store_posted(ah_store *s);

/* Signals between the hosts of a shared store: whether the store has them, and a watch that calls `fn` on
 * the loop thread with each signal's payload. The listening connection is opened on the reader thread;
 * `fn` gets "*" once it is open, and again each time it is back after it broke (it is opened again after
 * 1 s, then every 5 s): signals may have been missed meanwhile. One watch per
 * store; it ends with the store. Returns AH_EUNAVAILABLE without signals. */
typedef void (*ah_store_signal_fn)(const char *payload, void *arg);
bool ah__store_signals(const ah_store *s);
int ah__store_watch(ah_store *s, ah_store_signal_fn fn, void *arg);
/* Whether the watch's listening connection is open now (it is opened on the reader thread: signals sent
 * before it is open are not seen). */
bool ah__store_watching(const ah_store *s);

/* Counters: commits (transactions) and opsets written since open. */
uint64_t ah__store_commits(const ah_store *s);
uint64_t ah__store_opsets(const ah_store *s);
/* Groups tried again after failing as a whole for a reason that may pass (an I/O error, a full disk): up
 * to three times, after 10, 100 and 1000 ms, before their failure is reported. */
uint64_t ah__store_retries(const ah_store *s);

/* Refuse new writes (AH_ECLOSED), let the queued ones commit and their callbacks run, stop the writer
 * thread and close the backend; `cb` runs on the loop thread once all of that is done and the store's
 * async handle is closed (the store is freed then). */
void ah__store_close(ah_store *s, void (*cb)(void *arg), void *arg);

#endif
