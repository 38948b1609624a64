/* The durable store's generic layer: a dedicated writer thread with group commit.
 *
 * The loop thread appends submitted opsets to `queue` under the mutex and signals the condition variable.
 * The writer thread takes the whole queue at once, hands it to the backend's write_group (one
 * transaction for everything that accumulated while the previous commit was running), moves the items to
 * `done` and wakes the loop with a uv_async_t. The async callback runs the write callbacks in submission
 * order: the writer processes groups one after another, each in queue order, and `done` is a FIFO.
 *
 * The writer is a plain pthread, not the libuv pool (DECISIONS.md, "Policies that bound the tests"): the
 * pool is shared with tool I/O and remote calls, and a commit waiting on the disk or on another process's
 * write lock must not hold one of its few threads, nor wait behind them.
 */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agenthost/errors.h"
#include "log.h"
#include "store.h"

#define COMP "store"

typedef struct store_item {
  json_t *opset;   /* owned */
  uint64_t gen;    /* its submission number */
  const char *sid; /* the session it writes for (its fence's, or its first event's), in opset; or NULL */
  bool poisoned;   /* not written: an earlier write of its session failed (see `poison`) */
  ah_store_write_fn cb;
  void *arg;
  json_t *results; /* set by the writer; owned */
  int status;
  struct store_item *next;
} store_item;

/* A FIFO of items linked through `next`. */
typedef struct store_fifo {
  store_item *head;
  store_item *tail;
} store_fifo;

struct ah_store {
  uv_loop_t *loop;
  const ah_store_backend *be;
  void *impl;
  bool read_only;

  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  store_fifo queue; /* submitted, not yet taken by the writer (mu) */
  store_fifo done;  /* written, callbacks not yet run (mu) */
  bool stop;        /* the writer exits once `queue` is empty (mu) */

  uv_async_t async;
  /* Group commit: the opsets submitted during one loop turn reach the writer together, at the end of the
   * turn (the prepare handle runs before the loop polls again), not one by one as they are submitted. */
  store_fifo pending; /* loop thread: submitted this turn, not yet handed to the writer */
  uv_prepare_t kick;
  int handles_open; /* async + kick, during the close */
  size_t in_flight; /* loop thread: submitted items whose callback has not run */
  bool closing;     /* loop thread: writes refused with AH_ECLOSED */
  bool finished;    /* loop thread: writer joined, backend closed, async handle closing */
  void (*close_cb)(void *arg);
  void *close_arg;

  /* The watch (ah__store_watch): the listening connection's descriptor polled on the loop, reopened by
   * `watch_timer` when it broke. */
  ah_store_signal_fn watch_fn;
  void *watch_arg;
  uv_poll_t *watch_poll; /* NULL while the connection is not open */
  bool watch_opening;    /* it is being opened on the reader thread */
  uv_timer_t watch_timer;
  bool watch_inited; /* the timer is initialized (closed at the end) */

  /* When a session's write fails in a way that stops the session (host/sessions/writes.c), nothing of that
   * session submitted before the loop learned of it may be written: a later event would leave a gap in
   * its seqs. `poison`: {sessionId: 0 while the loop does not know yet (every write of it fails), then the
   * submission number below which its writes fail}. (mu) */
  json_t *poison;
  uint64_t submitted; /* loop thread: the next submission number */

  /* The reader: one thread that runs the reads submitted with ah__store_read on the backend's read
   * connection, in submission order, and hands their results back to the loop (`rasync`). The blocking
   * reads (ah__store_get_session...) take `conn` as the reader does for each read, so the read connection is
   * used by one thread at a time. */
  pthread_t rthread;
  bool rthread_started;
  pthread_mutex_t rmu;
  pthread_cond_t rcv;
  struct read_job *rqueue, *rqueue_tail; /* submitted, not yet run (rmu) */
  struct read_job *rdone, *rdone_tail;   /* run, callbacks not yet called (rmu) */
  bool rstop;                            /* the reader exits once `rqueue` is empty (rmu) */
  /* Reads whose callback ran: the reader frees their results (allocated by its thread: freed on the loop,
   * they would wait for the allocator's lock while the reader allocates the next ones). (rmu) */
  struct read_job *rtrash;
  /* Reads submitted before a read failed (the connection broke, the server did not answer in time) fail at
   * once, without waiting for their own deadline each: `rsubmitted` numbers the jobs, those up to
   * `rfailed_upto` fail. (rmu) */
  uint64_t rsubmitted, rfailed_upto;
  uv_async_t rasync;
  pthread_mutex_t conn; /* held while a read runs on the backend's read connection */
  bool read_failed;     /* the last blocking read failed (conn) */

  _Atomic uint64_t commits;
  _Atomic uint64_t opsets;
  _Atomic uint64_t retries; /* groups tried again (retry_ms) */
  _Atomic uint64_t reads;   /* reads made (ah__store_reads) */
  size_t reads_pending;     /* loop thread: reads submitted whose callback has not run */
};

/* A read submitted with ah__store_read: its queries (their ids copied), then its results. */
typedef struct read_job {
  ah_store_query *q;
  size_t n;
  ah_store_read_fn cb;
  void *arg;
  bool shrink; /* not a read: the read connection's caches go back to the heap */
  bool watch;  /* not a read: the signals' listening connection is opened (`fd` or an AH_E* code, `why`) */
  bool again;  /* (watch) it was open before */
  int fd;
  char *why;
  uint64_t gen; /* its submission number */
  json_t *results;
  int status;
  struct read_job *next;
} read_job;

static void fifo_push(store_fifo *f, store_item *it) {
  it->next = NULL;
  if (f->tail)
    f->tail->next = it;
  else
    f->head = it;
  f->tail = it;
}

/* Detach the whole FIFO; returns its head. */
static store_item *fifo_take(store_fifo *f) {
  store_item *head = f->head;
  f->head = NULL;
  f->tail = NULL;
  return head;
}

static void item_free(store_item *it) {
  json_decref(it->opset);
  json_decref(it->results);
  free(it);
}

/* A group that failed as a whole for a reason that may pass (an I/O error, a full disk) is tried again, in
 * the same order, after each of these pauses; then its failure is reported. Only a group of which nothing
 * was written is tried again, so no later write can overtake an earlier one. A write lock held elsewhere
 * (AH_EBUSY) is not: the backend waited its busy timeout already. */
static const unsigned retry_ms[] = {10, 100, 1000};

/* A write's failure that stops the session it belongs to (host/sessions/writes.c): its later writes must not
 * be written (a gap in its seqs). */
static bool stops_session(int status) {
  return status == AH_EIO || status == AH_EBUSY || status == AH_ETIMEDOUT;
}

static bool transient(int status) {
  return status == AH_EIO;
}

/* Whether every opset of the group failed for a reason that may pass, and the store is not damaged. */
static bool worth_retrying(ah_store *s, const int *statuses, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!transient(statuses[i]))
      return false;
  char detail[8];
  return !s->be->health || s->be->health(s->impl, detail, sizeof detail) != AH_STORE_DAMAGED;
}

/* Commit one group: everything taken from the queue in one go. */
static void write_group(ah_store *s, store_item *head) {
  /* Writes of a session whose earlier write failed (see `poison`) are not written. */
  pthread_mutex_lock(&s->mu);
  for (store_item *it = head; it; it = it->next) {
    json_t *mark = it->sid ? json_object_get(s->poison, it->sid) : NULL;
    if (mark && (json_integer_value(mark) == 0 || it->gen < (uint64_t)json_integer_value(mark))) {
      it->status = AH_EIO;
      it->poisoned = true;
    }
  }
  pthread_mutex_unlock(&s->mu);
  size_t n = 0;
  for (store_item *it = head; it; it = it->next)
    n += !it->poisoned;
  if (n == 0)
    return;
  json_t **opsets = calloc(n, sizeof *opsets);
  json_t **results = calloc(n, sizeof *results);
  int *statuses = calloc(n, sizeof *statuses);
  if (!opsets || !results || !statuses) {
    /* Nothing was written: every opset of the group fails, none is lost silently. */
    AH_LOG_E(COMP, "out of memory for a group of %zu opsets", n);
    for (store_item *it = head; it; it = it->next)
      it->status = AH_ENOMEM;
  } else {
    size_t i = 0;
    for (store_item *it = head; it; it = it->next)
      if (!it->poisoned)
        opsets[i++] = it->opset;
    s->be->write_group(s->impl, opsets, n, results, statuses);
    for (size_t r = 0; r < sizeof retry_ms / sizeof retry_ms[0] && worth_retrying(s, statuses, n); r++) {
      for (i = 0; i < n; i++) {
        json_decref(results[i]);
        results[i] = NULL;
      }
      AH_LOG_W(COMP, "a group of %zu opset(s) was not written (%s): trying again in %u ms", n,
               ah_strerror(statuses[0]), retry_ms[r]);
      struct timespec pause = {.tv_sec = retry_ms[r] / 1000,
                               .tv_nsec = (long)(retry_ms[r] % 1000) * 1000000L};
      nanosleep(&pause, NULL);
      atomic_fetch_add(&s->retries, 1);
      s->be->write_group(s->impl, opsets, n, results, statuses);
    }
    i = 0;
    pthread_mutex_lock(&s->mu);
    for (store_item *it = head; it; it = it->next) {
      if (it->poisoned)
        continue;
      it->status = statuses[i] < 0 ? statuses[i] : 0;
      it->results = it->status == 0 ? results[i] : NULL;
      if (it->status == 0 && !it->results)
        it->results = json_array();
      else if (it->status < 0)
        json_decref(results[i]);
      /* A failure that stops its session: the session's writes queued behind it are not written (until the
       * loop knows, then those submitted before it knew). */
      if (stops_session(it->status) && it->sid)
        json_object_set_new(s->poison, it->sid, json_integer(0));
      i++;
    }
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->commits, 1);
    atomic_fetch_add(&s->opsets, n);
  }
  free(opsets);
  free(results);
  free(statuses);
}

static void *writer_main(void *arg) {
  ah_store *s = arg;
  pthread_setname_np(pthread_self(), "ah-store-writer");
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->queue.head && !s->stop)
      pthread_cond_wait(&s->cv, &s->mu);
    if (!s->queue.head)
      break; /* stop requested and nothing left */
    store_item *head = fifo_take(&s->queue);
    pthread_mutex_unlock(&s->mu);

    write_group(s, head);

    pthread_mutex_lock(&s->mu);
    while (head) {
      store_item *next = head->next;
      fifo_push(&s->done, head);
      head = next;
    }
    pthread_mutex_unlock(&s->mu);
    uv_async_send(&s->async);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static void watch_stop(ah_store *s);

/* The store's memory, its threads joined and its handles closed. */
static void store_free(ah_store *s) {
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->rcv);
  pthread_mutex_destroy(&s->rmu);
  pthread_mutex_destroy(&s->conn);
  json_decref(s->poison);
  free(s);
}

static void on_async_closed(uv_handle_t *h) {
  ah_store *s = h->data;
  if (--s->handles_open > 0)
    return;
  void (*cb)(void *) = s->close_cb;
  void *arg = s->close_arg;
  store_free(s);
  if (cb)
    cb(arg);
}

/* Once closing and every callback has run: stop the writer, close the backend and the async handle. */
static void maybe_finish(ah_store *s) {
  if (!s->closing || s->finished || s->in_flight > 0)
    return;
  s->finished = true;
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  /* The queue is empty (nothing in flight), so the writer is idle or about to notice `stop`; so is the
   * reader. */
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&s->rmu);
  s->rstop = true;
  pthread_cond_signal(&s->rcv);
  pthread_mutex_unlock(&s->rmu);
  pthread_join(s->rthread, NULL);
  if (s->watch_inited)
    watch_stop(s);
  s->be->close(s->impl);
  s->impl = NULL;
  s->handles_open = 3;
  uv_close((uv_handle_t *)&s->async, on_async_closed);
  uv_close((uv_handle_t *)&s->kick, on_async_closed);
  uv_close((uv_handle_t *)&s->rasync, on_async_closed);
  if (s->watch_inited) {
    s->handles_open++;
    uv_close((uv_handle_t *)&s->watch_timer, on_async_closed);
  }
}

/* End of a loop turn: hand what was submitted during it to the writer as one group. */
static void on_kick(uv_prepare_t *p) {
  ah_store *s = p->data;
  uv_prepare_stop(p);
  store_item *head = fifo_take(&s->pending);
  if (!head)
    return;
  pthread_mutex_lock(&s->mu);
  while (head) {
    store_item *next = head->next;
    fifo_push(&s->queue, head);
    head = next;
  }
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void on_async(uv_async_t *a) {
  ah_store *s = a->data;
  pthread_mutex_lock(&s->mu);
  store_item *head = fifo_take(&s->done);
  /* The loop learns of these failures now: each such session's writes submitted until now are not written. */
  for (store_item *it = head; it; it = it->next)
    if (stops_session(it->status) && it->sid && json_integer_value(json_object_get(s->poison, it->sid)) == 0)
      json_object_set_new(s->poison, it->sid, json_integer((json_int_t)s->submitted));
  pthread_mutex_unlock(&s->mu);
  while (head) {
    store_item *it = head;
    head = it->next;
    s->in_flight--;
    if (it->cb)
      it->cb(it->status, it->status == 0 ? it->results : NULL, it->arg);
    item_free(it);
  }
  maybe_finish(s);
}

static void *reader_main(void *arg);
static void on_read_async(uv_async_t *a);

static void set_why(char **why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_why(char **why, const char *fmt, ...) {
  if (!why)
    return;
  va_list ap;
  va_start(ap, fmt);
  if (vasprintf(why, fmt, ap) < 0)
    *why = NULL;
  va_end(ap);
}

int ah__store_open(uv_loop_t *loop, const ah_store_backend *backend, const ah_store_opts *opts,
                   ah_store **out, char **why) {
  if (why)
    *why = NULL;
  if (!loop || !opts || (!opts->path && !opts->url) || !out) {
    set_why(why, "store: missing loop, options, path (or connection string) or output");
    return AH_EINVAL;
  }
  *out = NULL;
  if (!backend)
    backend = &ah__store_sqlite;
  ah_store *s = calloc(1, sizeof *s);
  if (!s) {
    set_why(why, "store: out of memory");
    return AH_ENOMEM;
  }
  s->loop = loop;
  s->be = backend;
  s->read_only = opts->read_only;
  s->poison = json_object();
  atomic_init(&s->commits, 0);
  atomic_init(&s->opsets, 0);
  atomic_init(&s->retries, 0);

  int rc = backend->open(opts, &s->impl, why);
  if (rc < 0) {
    json_decref(s->poison);
    free(s);
    return rc;
  }
  if (pthread_mutex_init(&s->mu, NULL) != 0 || pthread_cond_init(&s->cv, NULL) != 0 ||
      pthread_mutex_init(&s->rmu, NULL) != 0 || pthread_cond_init(&s->rcv, NULL) != 0 ||
      pthread_mutex_init(&s->conn, NULL) != 0) {
    /* Never fails on Linux with default attributes (glibc allocates nothing). */
    backend->close(s->impl);
    json_decref(s->poison);
    free(s);
    set_why(why, "store: cannot create a mutex or condition variable");
    return AH_EINTERNAL;
  }
  rc = uv_async_init(loop, &s->async, on_async);
  int rrc = rc == 0 ? uv_async_init(loop, &s->rasync, on_read_async) : rc;
  if (rc < 0 || rrc < 0) {
    backend->close(s->impl);
    s->impl = NULL;
    set_why(why, "store: uv_async_init: %s", uv_strerror(rc < 0 ? rc : rrc));
    if (rc < 0) {
      store_free(s);
    } else { /* the open handle must close before the memory goes */
      s->closing = s->finished = true;
      s->async.data = s;
      s->handles_open = 1;
      uv_close((uv_handle_t *)&s->async, on_async_closed);
    }
    return AH_EINTERNAL;
  }
  s->async.data = s;
  s->rasync.data = s;
  uv_prepare_init(loop, &s->kick);
  s->kick.data = s;
  /* The threads inherit a full signal mask: signals are the loop thread's business (libuv's handlers),
   * and a commit or a read is never interrupted by one. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int trc = pthread_create(&s->thread, NULL, writer_main, s);
  int rtrc = trc == 0 ? pthread_create(&s->rthread, NULL, reader_main, s) : -1;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (trc != 0 || rtrc != 0) {
    /* The async handles must be closed before the memory goes: finish through the normal close path
     * without a thread to join. */
    if (trc == 0) {
      pthread_mutex_lock(&s->mu);
      s->stop = true;
      pthread_cond_signal(&s->cv);
      pthread_mutex_unlock(&s->mu);
      pthread_join(s->thread, NULL);
    }
    backend->close(s->impl);
    s->impl = NULL;
    s->closing = true;
    s->finished = true;
    s->handles_open = 3;
    uv_close((uv_handle_t *)&s->async, on_async_closed);
    uv_close((uv_handle_t *)&s->kick, on_async_closed);
    uv_close((uv_handle_t *)&s->rasync, on_async_closed);
    set_why(why, "store: cannot start the writer or the reader thread");
    return AH_EINTERNAL;
  }
  AH_LOG_D(COMP, "opened %s (%s%s)", opts->path ? opts->path : "the database", backend->name,
           opts->read_only ? ", read-only" : "");
  *out = s;
  return 0;
}

/* The session an opset writes for: its fence's, else its first event's (borrowed from the opset). */
static const char *opset_session(const json_t *opset) {
  size_t i = 0;
  const json_t *op = NULL;
  json_array_foreach(opset, i, op) {
    const char *name = json_string_value(json_object_get(op, "op"));
    if (name && strcmp(name, "fence") == 0)
      return json_string_value(json_object_get(op, "id"));
    if (name && strcmp(name, "event") == 0)
      return json_string_value(json_object_get(op, "sessionId"));
  }
  return NULL;
}

int ah__store_write(ah_store *s, json_t *opset, ah_store_write_fn cb, void *arg) {
  if (!s || !json_is_array(opset)) {
    json_decref(opset);
    return AH_EINVAL;
  }
  if (s->closing) {
    json_decref(opset);
    return AH_ECLOSED;
  }
  if (s->read_only) {
    json_decref(opset);
    return AH_EPERM;
  }
  store_item *it = calloc(1, sizeof *it);
  if (!it) {
    json_decref(opset);
    return AH_ENOMEM;
  }
  it->opset = opset;
  it->cb = cb;
  it->arg = arg;
  it->gen = s->submitted++;
  it->sid = opset_session(opset);
  s->in_flight++;
  if (!s->pending.head)
    uv_prepare_start(&s->kick, on_kick);
  fifo_push(&s->pending, it);
  return 0;
}

/* ---- reads ------------------------------------------------------------------------------------------ */

/* Kinds whose read returns a row or nothing (not found), rather than a list. */
static bool one_row(ah_store_query_kind k) {
  return k == AH_STORE_Q_SESSION || k == AH_STORE_Q_REQUEST;
}

/* One query on the backend's read connection (`conn` held): its result (json null: not found), or NULL when
 * the read failed. */
static json_t *run_query(ah_store *s, const ah_store_query *q) {
  const ah_store_backend *be = s->be;
  void *impl = s->impl;
  bool needs_id = one_row(q->kind) || q->kind == AH_STORE_Q_EVENTS || q->kind == AH_STORE_Q_INBOX_OPEN ||
                  q->kind == AH_STORE_Q_TREE; /* of one session or request */
  if (needs_id && !q->id)
    return one_row(q->kind) ? json_null() : json_array();
  json_t *r = NULL;
  switch (q->kind) {
  case AH_STORE_Q_SESSION:
    r = be->get_session(impl, q->id);
    break;
  case AH_STORE_Q_SESSIONS:
    r = be->list_sessions(impl, q->id, q->limit);
    break;
  case AH_STORE_Q_EVENTS:
    r = be->events(impl, q->id, q->after, q->limit);
    break;
  case AH_STORE_Q_EVENTS_AFTER:
    r = be->events_after(impl, q->after, q->limit);
    break;
  case AH_STORE_Q_INBOX_OPEN:
    r = be->inbox_open(impl, q->id);
    break;
  case AH_STORE_Q_REQUESTS_PENDING:
    r = be->requests_pending(impl, q->id);
    break;
  case AH_STORE_Q_REQUEST:
    r = be->get_request(impl, q->id);
    break;
  case AH_STORE_Q_TO_RECOVER:
    r = be->sessions_to_recover(impl);
    break;
  case AH_STORE_Q_TREE:
    r = be->session_tree(impl, q->id);
    break;
  case AH_STORE_Q_LAST_CURSOR: {
    int64_t c = be->last_cursor ? be->last_cursor(impl) : -1;
    return c < 0 ? NULL : json_integer((json_int_t)c);
  }
  case AH_STORE_Q_POSTED:
    if (!be->posted)
      return json_null(); /* no signals: nothing is ever posted */
    r = be->posted(impl);
    break;
  }
  if (r)
    return r;
  bool failed = !one_row(q->kind) || (be->read_failed && be->read_failed(impl));
  return failed ? NULL : json_null();
}

/* Append `j` to the FIFO `*head`..`*tail`. */
static void job_push(read_job **head, read_job **tail, read_job *j) {
  j->next = NULL;
  if (*tail)
    (*tail)->next = j;
  else
    *head = j;
  *tail = j;
}

static void job_free(read_job *j) {
  free(j->why);
  for (size_t i = 0; i < j->n; i++)
    free((char *)j->q[i].id);
  free(j->q);
  json_decref(j->results);
  free(j);
}

/* Run a job on the read connection (the reader thread). */
static void run_job(ah_store *s, read_job *j) {
  pthread_mutex_lock(&s->conn);
  if (j->shrink) {
    if (s->be->release_memory)
      s->be->release_memory(s->impl);
  } else if (j->watch) { /* a connection to the server: never on the loop */
    j->fd = s->be->watch_open(s->impl, &j->why);
  } else {
    j->results = json_array();
    for (size_t i = 0; i < j->n && j->results; i++) {
      json_t *r = run_query(s, &j->q[i]);
      if (!r || json_array_append_new(j->results, r) != 0) {
        j->status = r ? AH_ENOMEM : AH_EIO;
        json_decref(j->results);
        j->results = NULL;
      }
    }
    if (!j->results && !j->status)
      j->status = AH_ENOMEM;
  }
  pthread_mutex_unlock(&s->conn);
}

static void *reader_main(void *arg) {
  ah_store *s = arg;
  pthread_setname_np(pthread_self(), "ah-store-reader");
  pthread_mutex_lock(&s->rmu);
  for (;;) {
    while (!s->rqueue && !s->rtrash && !s->rstop)
      pthread_cond_wait(&s->rcv, &s->rmu);
    read_job *trash = s->rtrash;
    s->rtrash = NULL;
    read_job *j = s->rqueue;
    if (!j && !trash)
      break; /* stop requested and nothing left */
    if (j) {
      s->rqueue = j->next;
      if (!s->rqueue)
        s->rqueue_tail = NULL;
    }
    bool doomed = j && j->gen <= s->rfailed_upto && !j->shrink && !j->watch;
    pthread_mutex_unlock(&s->rmu);
    while (trash) {
      read_job *next = trash->next;
      job_free(trash);
      trash = next;
    }
    if (!j) {
      pthread_mutex_lock(&s->rmu);
      continue;
    }
    if (doomed)
      j->status = AH_EIO;
    else
      run_job(s, j);

    pthread_mutex_lock(&s->rmu);
    if (j->status == AH_EIO && !doomed)
      s->rfailed_upto = s->rsubmitted;
    job_push(&s->rdone, &s->rdone_tail, j);
    pthread_mutex_unlock(&s->rmu);
    uv_async_send(&s->rasync);
    pthread_mutex_lock(&s->rmu);
  }
  pthread_mutex_unlock(&s->rmu);
  return NULL;
}

static void watch_opened(ah_store *s, int fd, const char *why, bool again);

/* The callbacks of the reads done, a few per loop turn: what they release (pages of events) is freed on the
 * loop, so timers and other handles run between them. */
#define READ_CALLBACKS_PER_TURN 4

static void on_read_async(uv_async_t *a) {
  ah_store *s = a->data;
  pthread_mutex_lock(&s->rmu);
  read_job *head = s->rdone, *last = head;
  for (int i = 1; last && last->next && i < READ_CALLBACKS_PER_TURN; i++)
    last = last->next;
  s->rdone = last ? last->next : NULL;
  if (!s->rdone)
    s->rdone_tail = NULL;
  if (last)
    last->next = NULL;
  bool more = s->rdone != NULL;
  pthread_mutex_unlock(&s->rmu);
  if (more)
    uv_async_send(&s->rasync);
  read_job *done = NULL;
  while (head) {
    read_job *j = head;
    head = j->next;
    s->in_flight--;
    if (!j->watch && !j->shrink)
      s->reads_pending--;
    if (j->watch)
      watch_opened(s, j->fd, j->why, j->again);
    else if (j->cb)
      j->cb(j->status, j->status == 0 ? j->results : NULL, j->arg);
    j->next = done;
    done = j;
  }
  if (done) { /* freed by the reader (it is joined after the last of them) */
    pthread_mutex_lock(&s->rmu);
    for (read_job *last = done;; last = last->next)
      if (!last->next) {
        last->next = s->rtrash;
        break;
      }
    s->rtrash = done;
    pthread_cond_signal(&s->rcv);
    pthread_mutex_unlock(&s->rmu);
  }
  maybe_finish(s);
}

static int submit_job(ah_store *s, read_job *j) {
  s->in_flight++;
  pthread_mutex_lock(&s->rmu);
  j->gen = ++s->rsubmitted;
  job_push(&s->rqueue, &s->rqueue_tail, j);
  pthread_cond_signal(&s->rcv);
  pthread_mutex_unlock(&s->rmu);
  return 0;
}

int ah__store_read(ah_store *s, const ah_store_query *q, size_t n, ah_store_read_fn cb, void *arg) {
  if (!s || !s->impl || (n > 0 && !q))
    return AH_EINVAL;
  if (s->closing)
    return AH_ECLOSED;
  read_job *j = calloc(1, sizeof *j);
  if (!j)
    return AH_ENOMEM;
  j->q = calloc(n ? n : 1, sizeof *j->q);
  if (!j->q)
    return (free(j), AH_ENOMEM);
  for (size_t i = 0; i < n; i++) {
    j->q[i] = q[i];
    j->q[i].id = q[i].id ? strdup(q[i].id) : NULL;
    j->n = i + 1;
    if (q[i].id && !j->q[i].id) {
      job_free(j);
      return AH_ENOMEM;
    }
  }
  j->cb = cb;
  j->arg = arg;
  atomic_fetch_add(&s->reads, n);
  s->reads_pending++;
  return submit_job(s, j);
}

/* A blocking read: one query on the caller's thread, after the reader's current read. NULL: not found, or
 * the read failed (ah__store_read_status tells which). */
static json_t *read_now(ah_store *s, ah_store_query q) {
  if (!s || !s->impl)
    return NULL;
  atomic_fetch_add(&s->reads, 1);
  pthread_mutex_lock(&s->conn);
  json_t *r = run_query(s, &q);
  s->read_failed = r == NULL;
  pthread_mutex_unlock(&s->conn);
  if (json_is_null(r)) {
    json_decref(r);
    r = NULL;
  }
  return r;
}

json_t *ah__store_session_tree(ah_store *s, const char *id) {
  return read_now(s, (ah_store_query){.kind = AH_STORE_Q_TREE, .id = id});
}

json_t *ah__store_get_session(ah_store *s, const char *id) {
  return read_now(s, (ah_store_query){.kind = AH_STORE_Q_SESSION, .id = id});
}

json_t *ah__store_list_sessions(ah_store *s, const char *after_id, size_t limit) {
  return read_now(s, (ah_store_query){.kind = AH_STORE_Q_SESSIONS, .id = after_id, .limit = limit});
}

json_t *ah__store_events(ah_store *s, const char *session_id, int64_t after_seq, size_t limit) {
  return read_now(
      s, (ah_store_query){.kind = AH_STORE_Q_EVENTS, .id = session_id, .after = after_seq, .limit = limit});
}

json_t *ah__store_events_after(ah_store *s, int64_t after_cursor, size_t limit) {
  return read_now(s,
                  (ah_store_query){.kind = AH_STORE_Q_EVENTS_AFTER, .after = after_cursor, .limit = limit});
}

json_t *ah__store_inbox_open(ah_store *s, const char *session_id) {
  return read_now(s, (ah_store_query){.kind = AH_STORE_Q_INBOX_OPEN, .id = session_id});
}

json_t *ah__store_requests_pending(ah_store *s, const char *session_id) {
  return read_now(s, (ah_store_query){.kind = AH_STORE_Q_REQUESTS_PENDING, .id = session_id});
}

json_t *ah__store_get_request(ah_store *s, const char *id) {
  return read_now(s, (ah_store_query){.kind = AH_STORE_Q_REQUEST, .id = id});
}

json_t *ah__store_sessions_to_recover(ah_store *s) {
  return read_now(s, (ah_store_query){.kind = AH_STORE_Q_TO_RECOVER});
}

int ah__store_health(ah_store *s, char *detail, size_t cap) {
  if (!s || !s->impl) {
    if (detail && cap)
      snprintf(detail, cap, "the store cannot be opened");
    return AH_STORE_DAMAGED;
  }
  if (!s->be->health) {
    if (detail && cap)
      detail[0] = '\0';
    return AH_STORE_OK;
  }
  return s->be->health(s->impl, detail, cap);
}

typedef struct shrink_ctx {
  ah_store *s;
  ah_store_write_fn cb;
  void *arg;
} shrink_ctx;

/* The reader's caches are released (on its thread, between two reads): now the writer's, in order. */
static void shrink_released(int status, const json_t *results, void *arg) {
  (void)status;
  (void)results;
  shrink_ctx *c = arg;
  int rc = ah__store_write(c->s, json_pack("[{s:s}]", "op", "store.shrink"), c->cb, c->arg);
  if (rc && c->cb)
    c->cb(rc, NULL, c->arg);
  free(c);
}

int ah__store_shrink(ah_store *s, ah_store_write_fn cb, void *arg) {
  if (!s || !s->impl)
    return AH_EINVAL;
  if (s->closing)
    return AH_ECLOSED;
  if (s->read_only)
    return AH_EPERM;
  shrink_ctx *c = calloc(1, sizeof *c);
  read_job *j = calloc(1, sizeof *j);
  if (!c || !j)
    return (free(c), free(j), AH_ENOMEM);
  *c = (shrink_ctx){s, cb, arg};
  j->shrink = true;
  j->cb = shrink_released;
  j->arg = c;
  return submit_job(s, j);
}

bool ah__store_reading(const ah_store *s) {
  return s && s->reads_pending > 0;
}

uint64_t ah__store_reads(const ah_store *s) {
  return s ? atomic_load(&((ah_store *)s)->reads) : 0;
}

int64_t ah__store_memory_used(const ah_store *s) {
  return s && s->impl && s->be->memory_used ? s->be->memory_used(s->impl) : -1;
}

int ah__store_read_status(ah_store *s) {
  if (!s || !s->impl)
    return AH_EIO;
  return s->read_failed ? AH_EIO : 0;
}

const char *ah__store_health_name(int health) {
  return health == AH_STORE_OK ? "ok" : health == AH_STORE_FULL ? "full" : "damaged";
}

int64_t ah__store_last_cursor(ah_store *s) {
  json_t *c = read_now(s, (ah_store_query){.kind = AH_STORE_Q_LAST_CURSOR});
  int64_t v = c ? json_integer_value(c) : -1;
  json_decref(c);
  return v;
}

json_t *ah__store_posted(ah_store *s) {
  return read_now(s, (ah_store_query){.kind = AH_STORE_Q_POSTED});
}

bool ah__store_watching(const ah_store *s) {
  return s && s->watch_poll;
}

bool ah__store_signals(const ah_store *s) {
  return s && s->be->watch_open && !s->read_only;
}

static void watch_signal(const char *payload, void *arg) {
  ah_store *s = arg;
  if (s->watch_fn && !s->closing)
    s->watch_fn(payload, s->watch_arg);
}

static void poll_free(uv_handle_t *h) {
  free(h);
}

/* Stop polling the listening connection and close it (the poll handle first: it is bound to the
 * descriptor the backend closes). */
static void watch_stop(ah_store *s) {
  if (!s->watch_poll)
    return;
  uv_poll_stop(s->watch_poll);
  uv_close((uv_handle_t *)s->watch_poll, poll_free);
  s->watch_poll = NULL;
  s->be->watch_close(s->impl);
}

static void watch_retry(uv_timer_t *t);

static void watch_readable(uv_poll_t *p, int status, int events) {
  (void)events;
  ah_store *s = p->data;
  int rc = status < 0 ? AH_EIO : s->be->watch_read(s->impl, watch_signal, s);
  if (rc == 0 || s->watch_poll != p)
    return;
  AH_LOG_W(COMP, "the store's signal connection broke; opening it again");
  watch_stop(s);
  if (!s->closing)
    uv_timer_start(&s->watch_timer, watch_retry, 1000, 0);
}

/* The listening connection was opened on the reader thread (`fd`, or an AH_E* code with `why`): it is
 * polled, and the watcher told "*" (signals sent before may have been missed); when it did not open, it is
 * tried again in 5 s. `again`: it was open before. */
static void watch_opened(ah_store *s, int fd, const char *why, bool again) {
  s->watch_opening = false;
  if (fd >= 0 && s->closing) {
    s->be->watch_close(s->impl);
    return;
  }
  if (fd < 0) {
    if (!s->closing) {
      AH_LOG_W(COMP, "the store's signal connection cannot be opened (%s); trying again in 5 s",
               why ? why : "unknown error");
      uv_timer_start(&s->watch_timer, watch_retry, 5000, 0);
    }
    return;
  }
  uv_poll_t *p = calloc(1, sizeof *p);
  int rc = p ? uv_poll_init(s->loop, p, fd) : UV_ENOMEM;
  if (rc < 0) {
    free(p);
    s->be->watch_close(s->impl);
    AH_LOG_W(COMP, "cannot poll the store's signal connection (%s); trying again in 5 s", uv_strerror(rc));
    uv_timer_start(&s->watch_timer, watch_retry, 5000, 0);
    return;
  }
  p->data = s;
  s->watch_poll = p;
  uv_poll_start(p, UV_READABLE, watch_readable);
  if (again)
    AH_LOG_I(COMP, "the store's signal connection is open again");
  watch_signal("*", s); /* signals sent before it was open (or while it was broken) were missed */
}

/* Open the listening connection, on the reader thread (a connection to the server may take its time). */
static void watch_open(ah_store *s, bool again) {
  if (s->closing || s->watch_poll || s->watch_opening)
    return;
  read_job *j = calloc(1, sizeof *j);
  if (!j) {
    uv_timer_start(&s->watch_timer, watch_retry, 5000, 0);
    return;
  }
  j->watch = true;
  j->again = again;
  s->watch_opening = true;
  submit_job(s, j);
}

static void watch_retry(uv_timer_t *t) {
  watch_open(t->data, true);
}

int ah__store_watch(ah_store *s, ah_store_signal_fn fn, void *arg) {
  if (!ah__store_signals(s) || !s->impl)
    return AH_EUNAVAILABLE;
  if (s->watch_fn || s->closing)
    return AH_ESTATE;
  s->watch_fn = fn;
  s->watch_arg = arg;
  uv_timer_init(s->loop, &s->watch_timer);
  s->watch_timer.data = s;
  s->watch_inited = true;
  watch_open(s, false);
  return 0;
}

uint64_t ah__store_commits(const ah_store *s) {
  return s ? atomic_load(&((ah_store *)s)->commits) : 0;
}

uint64_t ah__store_opsets(const ah_store *s) {
  return s ? atomic_load(&((ah_store *)s)->opsets) : 0;
}

uint64_t ah__store_retries(const ah_store *s) {
  return s ? atomic_load(&((ah_store *)s)->retries) : 0;
}

void ah__store_close(ah_store *s, void (*cb)(void *arg), void *arg) {
  if (!s)
    return;
  if (s->closing) {
    /* A second close would run a second callback after the memory is gone; refuse it loudly. */
    AH_LOG_E(COMP, "ah__store_close called twice; the second call is ignored");
    return;
  }
  s->closing = true;
  s->close_cb = cb;
  s->close_arg = arg;
  maybe_finish(s);
}
