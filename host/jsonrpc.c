/* agenthost — one JSON-RPC 2.0 peer over a libuv stream, framed as JSON Lines (see agenthost/jsonrpc.h).
 *
 * This file is also compiled by the C client library, so it depends on nothing of the host but the public
 * headers: diagnostics go to opts->on_log or, without one, escaped to stderr.
 */
#include "jsonrpc.h"

#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Size of the read buffer handed to libuv. The stream reads at most this much per callback, so the
 * memory a peer needs is this plus the current line (itself capped by max_line). */
#define READ_CHUNK ((size_t)64 * 1024)
/* A line buffer larger than this is released after the line, so that one big message does not pin its
 * memory for the rest of the connection. */
#define KEEP_LINE_BUFFER ((size_t)64 * 1024)
/* Diagnostics are short; a longer message is truncated. */
#define LOG_MAX 512
/* Backpressure: reading pauses while more than OUT_HIGH bytes wait in the output stream (the other side
 * reads slower than it sends) or more than IN_HIGH inbound requests are unanswered, and resumes below the
 * low marks. The memory a peer that is never read costs is so bounded by what it accepted. */
#define OUT_HIGH ((size_t)1024 * 1024)
#define OUT_LOW ((size_t)256 * 1024)
#define IN_HIGH ((size_t)1024)
#define IN_LOW ((size_t)512)
/* A close gives up flushing when no queued write completed for this long: the writes are left to the
 * stream's owner (closing the stream cancels them) and the close callback runs. */
#define FLUSH_STALL_MS 1000

/* An outbound request waiting for its answer. */
typedef struct pending {
  struct pending *prev;
  struct pending *next;
  int64_t id;
  ah_rpc_response_fn cb;
  void *arg;
} pending;

/* One queued write: the request and the bytes it points at live in one allocation. */
typedef struct write_req {
  uv_write_t req;
  ah_rpc_peer *peer; /* NULL once a close gave up waiting for it (the stream's owner cancels it) */
  struct write_req *prev;
  struct write_req *next;
  size_t len;
  char bytes[];
} write_req;

struct ah_rpc_inbound {
  ah_rpc_peer *peer;
  json_t *id;  /* a reference to the id exactly as received */
  json_t *msg; /* a reference to the whole message: keeps `params` alive until answered */
};

struct ah_rpc_peer {
  uv_stream_t *in;
  uv_stream_t *out;
  ah_rpc_opts opts;
  size_t max_line;

  /* Inbound framing. */
  char *rbuf;               /* READ_CHUNK bytes given to libuv; one read is processed before the next alloc */
  char *line;               /* the current partial line */
  size_t line_len;          /* bytes in `line` */
  size_t line_cap;          /* allocated size of `line` */
  bool discarding;          /* the current line is dropped up to the next "\n" */
  bool discard_no_memory;   /* ... because its buffer could not grow (else: over max_line) */
  bool reading;             /* reading was started and neither EOF, a read error nor close stopped it */
  bool paused;              /* reading is paused by backpressure (uv_read_stop) while `reading` holds */
  ah_rpc_peer *next_reader; /* in this thread's list of reading peers */
  ah_rpc_peer *live_prev;   /* in this thread's list of every peer not yet freed */
  ah_rpc_peer *live_next;
  bool live;

  /* Outbound. */
  int64_t next_id;
  pending *pending_head;
  pending *pending_tail;
  size_t n_outbound;
  size_t writes_in_flight;
  write_req *writes; /* the writes in flight, newest first */
  uint64_t writes_done;
  bool broken; /* a write failed: nothing more can be sent */

  /* Inbound requests not yet answered; each holds the peer's memory alive. */
  size_t n_inbound;

  /* Closing. */
  bool closing;           /* ah_rpc_close was called: sends are refused */
  bool pending_failed;    /* the close step that fails outbound requests ran */
  bool idle_closing;      /* uv_close was called on `idle` and `flush_timer` */
  int handles_open;       /* of `idle` and `flush_timer` during the close */
  bool closed;            /* the close callback returned: free once no inbound request is left */
  uv_idle_t idle;         /* gives the close sequence its own loop turns (initialised by ah_rpc_close) */
  uv_timer_t flush_timer; /* bounds the flush of a close (initialised by ah_rpc_close) */
  bool flush_timer_on;
  uint64_t flush_seen; /* writes_done at the last tick of flush_timer */
  ah_rpc_closed_fn close_cb;
  void *close_arg;

  /* An observer of every line sent and received (a recording): ah_rpc_observe. */
  ah_rpc_observe_fn observe;
  void *observe_arg;
};

/* ---- diagnostics ------------------------------------------------------------------------------------ */

/* Escape control bytes so that a diagnostic stays one line on a terminal and in a log file; other bytes
 * pass unchanged. `out` receives at most `cap - 1` bytes and is always terminated. */
static void escape_into(char *out, size_t cap, const char *in) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
    char tmp[7] = {0};
    size_t n = 0;
    if (*p == '\n') {
      memcpy(tmp, "\\n", 2);
      n = 2;
    } else if (*p == '\r') {
      memcpy(tmp, "\\r", 2);
      n = 2;
    } else if (*p == '\t') {
      memcpy(tmp, "\\t", 2);
      n = 2;
    } else if (*p < 0x20 || *p == 0x7f) {
      memcpy(tmp, "\\u00", 4);
      tmp[4] = hex[*p >> 4];
      tmp[5] = hex[*p & 0xf];
      n = 6;
    } else {
      tmp[0] = (char)*p;
      n = 1;
    }
    if (o + n >= cap)
      break;
    memcpy(out + o, tmp, n);
    o += n;
  }
  out[o] = '\0';
}

__attribute__((format(printf, 2, 3))) static void peer_log(ah_rpc_peer *peer, const char *fmt, ...) {
  char msg[LOG_MAX] = {0};
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (peer->opts.on_log) {
    peer->opts.on_log(peer, msg, peer->opts.data);
    return;
  }
  /* Six output bytes per input byte at worst, plus prefix and newline; one write() keeps it one record. */
  static const char prefix[] = "agenthost jsonrpc: ";
  char line[sizeof prefix + LOG_MAX * 6 + 2] = {0};
  memcpy(line, prefix, sizeof prefix - 1);
  escape_into(line + sizeof prefix - 1, sizeof line - sizeof prefix - 1, msg);
  size_t len = strlen(line);
  line[len++] = '\n';
  ssize_t rc = write(STDERR_FILENO, line, len);
  (void)rc; /* nothing sensible to do when stderr is gone */
}

/* ---- lifetime --------------------------------------------------------------------------------------- */

static __thread ah_rpc_peer *live_peers;

static void live_unlink(ah_rpc_peer *peer) {
  if (!peer->live)
    return;
  if (peer->live_prev)
    peer->live_prev->live_next = peer->live_next;
  else
    live_peers = peer->live_next;
  if (peer->live_next)
    peer->live_next->live_prev = peer->live_prev;
  peer->live = false;
}

size_t ah__rpc_peers_referencing(bool (*inside)(const void *addr, void *arg), void *arg) {
  size_t n = 0;
  for (ah_rpc_peer *p = live_peers; p; p = p->live_next) {
    const void *addrs[] = {(const void *)(uintptr_t)p->opts.on_request,
                           (const void *)(uintptr_t)p->opts.on_notification,
                           (const void *)(uintptr_t)p->opts.on_eof, (const void *)(uintptr_t)p->opts.on_log,
                           (const void *)(uintptr_t)p->close_cb};
    bool hit = false;
    for (size_t i = 0; i < sizeof addrs / sizeof addrs[0]; i++)
      hit = hit || inside(addrs[i], arg);
    for (pending *q = p->pending_head; q && !hit; q = q->next)
      hit = inside((const void *)(uintptr_t)q->cb, arg);
    n += hit;
  }
  return n;
}

static void peer_free(ah_rpc_peer *peer) {
  live_unlink(peer);
  free(peer->rbuf);
  free(peer->line);
  free(peer);
}

/* The memory goes once the close callback has returned and no inbound handle still points at the peer. */
static void maybe_free(ah_rpc_peer *peer) {
  if (peer->closed && peer->n_inbound == 0)
    peer_free(peer);
}

static void pending_unlink(ah_rpc_peer *peer, pending *p) {
  if (p->prev)
    p->prev->next = p->next;
  else
    peer->pending_head = p->next;
  if (p->next)
    p->next->prev = p->prev;
  else
    peer->pending_tail = p->prev;
  p->prev = p->next = NULL;
  peer->n_outbound--;
}

/* Answer every pending outbound request with AH_ECLOSED. Each entry is unlinked before its callback runs,
 * so a callback may forget other ids or close the peer. */
static void fail_all_pending(ah_rpc_peer *peer) {
  while (peer->pending_head) {
    pending *p = peer->pending_head;
    pending_unlink(peer, p);
    p->cb(peer, AH_ECLOSED, NULL, NULL, p->arg);
    free(p);
  }
}

static void on_idle_closed(uv_handle_t *handle) {
  ah_rpc_peer *peer = handle->data;
  if (--peer->handles_open > 0)
    return;
  if (peer->close_cb)
    peer->close_cb(peer, peer->close_arg);
  peer->closed = true;
  maybe_free(peer);
}

/* The last step of a close: once outbound requests were failed and every queued write has completed,
 * close the idle handle; its close callback is the user's. */
static void maybe_finish_close(ah_rpc_peer *peer) {
  if (!peer->closing || !peer->pending_failed || peer->writes_in_flight > 0 || peer->idle_closing)
    return;
  peer->idle_closing = true;
  uv_timer_stop(&peer->flush_timer);
  uv_close((uv_handle_t *)&peer->idle, on_idle_closed);
  uv_close((uv_handle_t *)&peer->flush_timer, on_idle_closed);
}

static void write_unlink(ah_rpc_peer *peer, write_req *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    peer->writes = w->next;
  if (w->next)
    w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->peer = NULL;
  peer->writes_in_flight--;
}

/* A tick of a close's flush: while writes keep completing the flush goes on; after FLUSH_STALL_MS without
 * one the writes still queued are handed to the stream (its owner's close cancels them) and the close ends.
 */
static void on_flush_tick(uv_timer_t *t) {
  ah_rpc_peer *peer = t->data;
  if (peer->writes_done != peer->flush_seen) {
    peer->flush_seen = peer->writes_done;
    return;
  }
  size_t n = peer->writes_in_flight, bytes = 0;
  for (write_req *w = peer->writes; w; w = w->next)
    bytes += w->len;
  peer_log(peer,
           "close: %zu queued write(s) (%zu bytes) not flushed after %d ms without progress: the other side "
           "is not reading",
           n, bytes, FLUSH_STALL_MS);
  while (peer->writes)
    write_unlink(peer, peer->writes);
  maybe_finish_close(peer);
}

static void on_close_idle(uv_idle_t *idle) {
  ah_rpc_peer *peer = idle->data;
  uv_idle_stop(idle);
  /* Failing requests here rather than inside ah_rpc_close keeps user callbacks from running nested in
   * the caller of close, which may be iterating its own state. */
  fail_all_pending(peer);
  peer->pending_failed = true;
  if (peer->writes_in_flight > 0 && !peer->flush_timer_on) {
    peer->flush_timer_on = true;
    peer->flush_seen = peer->writes_done;
    uv_timer_start(&peer->flush_timer, on_flush_tick, FLUSH_STALL_MS, FLUSH_STALL_MS);
  }
  maybe_finish_close(peer);
}

/* ---- outbound --------------------------------------------------------------------------------------- */

static void maybe_resume(ah_rpc_peer *peer);

static void mark_broken(ah_rpc_peer *peer, int uv_status) {
  if (peer->broken)
    return;
  peer->broken = true;
  peer_log(peer, "write failed: %s", uv_strerror(uv_status));
  /* Nothing can be sent any more, so no answer can be asked for: waiting callers learn it now. During a
   * close the idle step does this on its own turn. */
  if (!peer->closing)
    fail_all_pending(peer);
  maybe_resume(peer); /* a paused reader reads again, so the end of a vanished client is seen */
}

static void on_write(uv_write_t *req, int status) {
  write_req *w = (write_req *)req;
  ah_rpc_peer *peer = w->peer;
  if (!peer) { /* given up by a close: the peer may be gone */
    free(w);
    return;
  }
  write_unlink(peer, w);
  free(w);
  peer->writes_done++;
  if (status < 0)
    mark_broken(peer, status);
  maybe_resume(peer);
  maybe_finish_close(peer);
}

static void maybe_pause(ah_rpc_peer *peer);

/* Serialise `msg` (stolen) as one compact line and queue it. libuv keeps queued writes in order and
 * writes them as the stream accepts them. */
static int send_msg(ah_rpc_peer *peer, json_t *msg) {
  if (!msg)
    return AH_ENOMEM;
  if (peer->closing || peer->broken) {
    json_decref(msg);
    return AH_ECLOSED;
  }
  const size_t flags = JSON_COMPACT;
  size_t len = json_dumpb(msg, NULL, 0, flags);
  if (len == 0 || len >= UINT_MAX) { /* uv_buf_t lengths are unsigned int */
    json_decref(msg);
    return len == 0 ? AH_ENOMEM : AH_E2BIG;
  }
  write_req *w = malloc(sizeof *w + len + 1);
  if (!w) {
    json_decref(msg);
    return AH_ENOMEM;
  }
  size_t got = json_dumpb(msg, w->bytes, len, flags);
  json_decref(msg);
  if (got != len) {
    free(w);
    return AH_EINTERNAL;
  }
  if (peer->observe)
    peer->observe(peer->observe_arg, true, w->bytes, len);
  w->bytes[len] = '\n';
  w->len = len + 1;
  w->peer = peer;
  uv_buf_t buf = uv_buf_init(w->bytes, (unsigned int)w->len);
  int rc = uv_write(&w->req, peer->out, &buf, 1, on_write);
  if (rc < 0) {
    free(w);
    mark_broken(peer, rc);
    return AH_ECLOSED;
  }
  w->prev = NULL;
  w->next = peer->writes;
  if (peer->writes)
    peer->writes->prev = w;
  peer->writes = w;
  peer->writes_in_flight++;
  maybe_pause(peer);
  return 0;
}

/* A new {"jsonrpc":"2.0"} object; the version comes first because jansson keeps insertion order. */
static json_t *envelope(void) {
  json_t *msg = json_object();
  if (msg && json_object_set_new(msg, "jsonrpc", json_string("2.0")) < 0) {
    json_decref(msg);
    return NULL;
  }
  return msg;
}

/* {"jsonrpc":"2.0","id":id,"error":{"code","message","data"?}}; `id` is borrowed (NULL sends null),
 * `data` is stolen. json_object_set_new() consumes its value even when it fails (also when the object is
 * NULL), so the results are or-ed without short-circuit and nothing leaks on any failure. */
static json_t *error_msg(const json_t *id, int code, const char *message, json_t *data) {
  json_t *text = json_string(message);
  if (!text) /* invalid UTF-8 from the caller: the code is what matters */
    text = json_string("error");
  json_t *err = json_object();
  int bad = json_object_set_new(err, "code", json_integer(code));
  bad |= json_object_set_new(err, "message", text);
  if (data)
    bad |= json_object_set_new(err, "data", data);
  json_t *msg = envelope();
  bad |= json_object_set_new(msg, "id", id ? json_incref((json_t *)id) : json_null());
  bad |= json_object_set_new(msg, "error", err);
  if (bad) {
    json_decref(msg);
    return NULL;
  }
  return msg;
}

/* Answer an inbound problem with id null; dropped silently when nothing can be sent. */
static void send_null_error(ah_rpc_peer *peer, int code, const char *message) {
  if (peer->closing || peer->broken)
    return;
  int rc = send_msg(peer, error_msg(NULL, code, message, NULL));
  if (rc < 0 && rc != AH_ECLOSED)
    peer_log(peer, "cannot send error %d: %s", code, ah_strerror(rc));
}

int ah_rpc_request(ah_rpc_peer *peer, const char *method, json_t *params, ah_rpc_response_fn cb, void *arg,
                   int64_t *id_out) {
  if (!peer || !method || !cb) {
    json_decref(params);
    return AH_EINVAL;
  }
  if (peer->closing || peer->broken) {
    json_decref(params);
    return AH_ECLOSED;
  }
  json_t *name = json_string(method);
  if (!name) {
    json_decref(params);
    return AH_EINVAL; /* not UTF-8 */
  }
  int64_t id = peer->next_id;
  json_t *msg = envelope();
  int bad = json_object_set_new(msg, "id", json_integer(id));
  bad |= json_object_set_new(msg, "method", name);
  if (params)
    bad |= json_object_set_new(msg, "params", params);
  if (bad) {
    json_decref(msg);
    return AH_ENOMEM;
  }
  pending *p = calloc(1, sizeof *p);
  if (!p) {
    json_decref(msg);
    return AH_ENOMEM;
  }
  int rc = send_msg(peer, msg);
  if (rc < 0) {
    free(p);
    return rc;
  }
  peer->next_id++;
  p->id = id;
  p->cb = cb;
  p->arg = arg;
  p->prev = peer->pending_tail;
  if (peer->pending_tail)
    peer->pending_tail->next = p;
  else
    peer->pending_head = p;
  peer->pending_tail = p;
  peer->n_outbound++;
  if (id_out)
    *id_out = id;
  return 0;
}

int ah_rpc_forget(ah_rpc_peer *peer, int64_t id) {
  if (!peer)
    return AH_EINVAL;
  for (pending *p = peer->pending_head; p; p = p->next) {
    if (p->id == id) {
      pending_unlink(peer, p);
      free(p);
      return 0;
    }
  }
  return AH_ENOENT;
}

int ah_rpc_notify(ah_rpc_peer *peer, const char *method, json_t *params) {
  if (!peer || !method) {
    json_decref(params);
    return AH_EINVAL;
  }
  if (peer->closing || peer->broken) {
    json_decref(params);
    return AH_ECLOSED;
  }
  json_t *name = json_string(method);
  if (!name) {
    json_decref(params);
    return AH_EINVAL;
  }
  json_t *msg = envelope();
  int bad = json_object_set_new(msg, "method", name);
  if (params)
    bad |= json_object_set_new(msg, "params", params);
  if (bad) {
    json_decref(msg);
    return AH_ENOMEM;
  }
  return send_msg(peer, msg);
}

/* ---- inbound requests ------------------------------------------------------------------------------- */

static void inbound_free(ah_rpc_inbound *req) {
  ah_rpc_peer *peer = req->peer;
  json_decref(req->id);
  json_decref(req->msg);
  free(req);
  peer->n_inbound--;
  if (!peer->closed)
    maybe_resume(peer);
  maybe_free(peer);
}

int ah_rpc_respond(ah_rpc_inbound *req, json_t *result) {
  if (!req) {
    json_decref(result);
    return AH_EINVAL;
  }
  ah_rpc_peer *peer = req->peer;
  int rc = 0;
  if (peer->closing || peer->broken) {
    json_decref(result);
    rc = AH_ECLOSED;
  } else {
    json_t *msg = envelope();
    int bad = json_object_set_new(msg, "id", json_incref(req->id));
    bad |= json_object_set_new(msg, "result", result ? result : json_null());
    if (bad) {
      json_decref(msg);
      rc = AH_ENOMEM;
    } else {
      rc = send_msg(peer, msg);
    }
  }
  inbound_free(req);
  return rc;
}

int ah_rpc_respond_error(ah_rpc_inbound *req, int code, const char *message, json_t *data) {
  if (!req) {
    json_decref(data);
    return AH_EINVAL;
  }
  ah_rpc_peer *peer = req->peer;
  int rc = 0;
  if (peer->closing || peer->broken) {
    json_decref(data);
    rc = AH_ECLOSED;
  } else {
    json_t *msg = error_msg(req->id, code, message ? message : "error", data);
    rc = msg ? send_msg(peer, msg) : AH_ENOMEM;
  }
  inbound_free(req);
  return rc;
}

const json_t *ah_rpc_inbound_id(const ah_rpc_inbound *req) {
  return req ? req->id : NULL;
}

ah_rpc_peer *ah_rpc_inbound_peer(const ah_rpc_inbound *req) {
  return req ? req->peer : NULL;
}

size_t ah_rpc_pending_inbound(const ah_rpc_peer *peer) {
  return peer ? peer->n_inbound : 0;
}

size_t ah_rpc_pending_outbound(const ah_rpc_peer *peer) {
  return peer ? peer->n_outbound : 0;
}

/* ---- inbound dispatch ------------------------------------------------------------------------------- */

static void handle_request(ah_rpc_peer *peer, json_t *msg, json_t *id, const char *method) {
  ah_rpc_inbound *req = calloc(1, sizeof *req);
  if (!req) {
    (void)send_msg(peer, error_msg(id, AH_RPC_INTERNAL_ERROR, "out of memory", NULL));
    return;
  }
  req->peer = peer;
  req->id = json_incref(id);
  req->msg = json_incref(msg);
  peer->n_inbound++;
  peer->opts.on_request(peer, req, method, json_object_get(msg, "params"), peer->opts.data);
}

static void handle_response(ah_rpc_peer *peer, json_t *msg, json_t *id) {
  pending *p = NULL;
  /* Outbound ids are integers, so only an integer id can match: the string "1" is not the number 1. */
  if (json_is_integer(id)) {
    for (pending *it = peer->pending_head; it; it = it->next) {
      if (it->id == json_integer_value(id)) {
        p = it;
        break;
      }
    }
  }
  if (!p) {
    char *text = json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY);
    peer_log(peer, "unknown response id %.64s", text ? text : "?");
    free(text);
    return;
  }
  pending_unlink(peer, p);
  json_t *error = json_object_get(msg, "error");
  if (error && !json_is_null(error)) {
    p->cb(peer, AH_EPROTO, NULL, error, p->arg);
  } else {
    json_t *result = json_object_get(msg, "result");
    p->cb(peer, 0, result ? result : json_null(), NULL, p->arg);
  }
  free(p);
}

static bool valid_request_id(const json_t *id) {
  return json_is_string(id) || json_is_integer(id) || json_is_null(id);
}

/* Parse and dispatch one complete line (without its terminator). */
static void handle_line(ah_rpc_peer *peer, const char *line, size_t len) {
  if (peer->observe)
    peer->observe(peer->observe_arg, false, line, len);
  json_error_t err;
  memset(&err, 0, sizeof err);
  /* JSON_DECODE_ANY so that a scalar line is valid JSON that is not an object (-32600), not a parse error. */
  json_t *msg = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
  if (!msg) {
    /* err.text quotes raw input bytes: on_log gets it unescaped by contract, stderr escapes it. */
    peer_log(peer, "parse error at byte %d: %s", err.position, err.text);
    send_null_error(peer, AH_RPC_PARSE_ERROR, "parse error");
    return;
  }
  if (!json_is_object(msg)) {
    peer_log(peer, "invalid request: not an object");
    send_null_error(peer, AH_RPC_INVALID_REQUEST, "invalid request");
    json_decref(msg);
    return;
  }
  json_t *method = json_object_get(msg, "method");
  json_t *id = json_object_get(msg, "id");
  if (method) {
    if (!json_is_string(method) || (id && !valid_request_id(id))) {
      peer_log(peer, "invalid request: bad method or id");
      send_null_error(peer, AH_RPC_INVALID_REQUEST, "invalid request");
    } else if (id) {
      if (peer->opts.on_request)
        handle_request(peer, msg, id, json_string_value(method));
      else if (!peer->closing && !peer->broken)
        (void)send_msg(peer, error_msg(id, AH_RPC_METHOD_NOT_FOUND, "method not found", NULL));
    } else if (peer->opts.on_notification) {
      peer->opts.on_notification(peer, json_string_value(method), json_object_get(msg, "params"),
                                 peer->opts.data);
    }
  } else if (id && (json_object_get(msg, "result") || json_object_get(msg, "error"))) {
    handle_response(peer, msg, id);
  } else {
    peer_log(peer, "invalid request: neither request, notification nor response");
    send_null_error(peer, AH_RPC_INVALID_REQUEST, "invalid request");
  }
  json_decref(msg);
}

/* A complete line arrived: strip one trailing "\r", skip empty lines. */
static void finish_line(ah_rpc_peer *peer) {
  size_t len = peer->line_len;
  peer->line_len = 0;
  if (len > 0 && peer->line[len - 1] == '\r')
    len--;
  if (len > 0)
    handle_line(peer, peer->line, len);
  /* handle_line may have run callbacks, but none of them can free the peer (that needs a loop turn). */
  if (peer->line_cap > KEEP_LINE_BUFFER) {
    free(peer->line);
    peer->line = NULL;
    peer->line_cap = 0;
  }
}

static void drop_line(ah_rpc_peer *peer) {
  free(peer->line);
  peer->line = NULL;
  peer->line_len = 0;
  peer->line_cap = 0;
}

/* Append `n` bytes to the current line; the caller has checked the cap. */
static bool append_line(ah_rpc_peer *peer, const char *p, size_t n) {
  if (n == 0)
    return true;
  size_t need = peer->line_len + n;
  if (need > peer->line_cap) {
    size_t cap = peer->line_cap ? peer->line_cap : 256;
    while (cap < need)
      cap *= 2;
    if (cap > peer->max_line)
      cap = peer->max_line;
    char *grown = realloc(peer->line, cap);
    if (!grown)
      return false;
    peer->line = grown;
    peer->line_cap = cap;
  }
  memcpy(peer->line + peer->line_len, p, n);
  peer->line_len = need;
  return true;
}

/* ---- reading ---------------------------------------------------------------------------------------- */

/* libuv hands the read callbacks only the stream, and the stream's `data` belongs to its owner (the peer
 * does not own the streams), so the peers reading on this thread are found through this list instead.
 * Every function runs on the loop thread, hence one list per thread; it holds a handful of entries. */
static __thread ah_rpc_peer *reading_peers;

static ah_rpc_peer *find_reader(const uv_stream_t *in) {
  for (ah_rpc_peer *p = reading_peers; p; p = p->next_reader)
    if (p->in == in)
      return p;
  return NULL;
}

static void stop_reading(ah_rpc_peer *peer) {
  if (!peer->reading)
    return;
  if (!peer->paused)
    uv_read_stop(peer->in);
  peer->paused = false;
  peer->reading = false;
  for (ah_rpc_peer **pp = &reading_peers; *pp; pp = &(*pp)->next_reader) {
    if (*pp == peer) {
      *pp = peer->next_reader;
      break;
    }
  }
  peer->next_reader = NULL;
}

static size_t out_queued(const ah_rpc_peer *peer) {
  return peer->out->write_queue_size;
}

/* Backpressure (see OUT_HIGH): pause reading while the other side does not keep up. A broken output never
 * pauses, so that the EOF of a vanished client is still seen. */
static void maybe_pause(ah_rpc_peer *peer) {
  if (!peer->reading || peer->paused || peer->broken || peer->closing)
    return;
  if (out_queued(peer) <= OUT_HIGH && peer->n_inbound <= IN_HIGH)
    return;
  uv_read_stop(peer->in);
  peer->paused = true;
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

static void maybe_resume(ah_rpc_peer *peer) {
  if (!peer->reading || !peer->paused || peer->closing)
    return;
  if (!peer->broken && (out_queued(peer) > OUT_LOW || peer->n_inbound > IN_LOW))
    return;
  peer->paused = false;
  if (uv_read_start(peer->in, on_alloc, on_read) < 0) {
    peer_log(peer, "cannot resume reading");
    stop_reading(peer);
    if (peer->opts.on_eof)
      peer->opts.on_eof(peer, AH_EIO, peer->opts.data);
  }
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  ah_rpc_peer *peer = find_reader((uv_stream_t *)handle);
  /* libuv reads into this buffer and calls on_read before asking again, so one buffer per peer is enough. */
  *buf = peer ? uv_buf_init(peer->rbuf, (unsigned int)READ_CHUNK) : uv_buf_init(NULL, 0);
}

/* Start dropping the current line: its buffered part is released now, the rest is skipped as it arrives,
 * so an over-long line never costs more than max_line bytes of memory. */
static void start_discard(ah_rpc_peer *peer, bool no_memory) {
  drop_line(peer);
  peer->discarding = true;
  peer->discard_no_memory = no_memory;
  if (no_memory)
    peer_log(peer, "out of memory: line discarded");
  else
    peer_log(peer, "line longer than %zu bytes discarded", peer->max_line);
}

static void end_discard(ah_rpc_peer *peer) {
  peer->discarding = false;
  if (peer->discard_no_memory)
    send_null_error(peer, AH_RPC_INTERNAL_ERROR, "out of memory");
  else
    send_null_error(peer, AH_RPC_INVALID_REQUEST, "line too long");
}

/* Split `n` freshly read bytes into lines. The cap is enforced before a byte is buffered. Processing stops
 * as soon as a callback closes the peer: nothing read after that is delivered. */
static void consume(ah_rpc_peer *peer, const char *p, size_t n) {
  while (n > 0 && !peer->closing) {
    const char *nl = memchr(p, '\n', n);
    size_t seg = nl ? (size_t)(nl - p) : n;
    if (!peer->discarding) {
      if (seg > peer->max_line - peer->line_len)
        start_discard(peer, false);
      else if (!append_line(peer, p, seg))
        start_discard(peer, true);
    }
    if (!nl)
      return;
    if (peer->discarding)
      end_discard(peer);
    else
      finish_line(peer);
    p = nl + 1;
    n -= seg + 1;
  }
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  ah_rpc_peer *peer = find_reader(stream);
  if (!peer || nread == 0)
    return;
  if (nread > 0) {
    consume(peer, buf->base, (size_t)nread);
    maybe_pause(peer);
    return;
  }
  stop_reading(peer);
  int status = 0;
  if (nread == UV_EOF) {
    /* A last line without its "\n" is still a line. */
    if (peer->discarding)
      end_discard(peer);
    else if (peer->line_len > 0)
      finish_line(peer);
  } else {
    status = nread == UV_ENOMEM ? AH_ENOMEM : AH_EIO;
    peer_log(peer, "read failed: %s", uv_strerror((int)nread));
  }
  peer->discarding = false;
  peer->line_len = 0;
  /* After ah_rpc_close the owner is no longer interested in the inbound side. */
  if (peer->opts.on_eof && !peer->closing)
    peer->opts.on_eof(peer, status, peer->opts.data);
}

/* ---- open and close --------------------------------------------------------------------------------- */

/* Every field up to `data` must be present; `reserved` is not read. */
#define MIN_OPTS_SIZE (offsetof(ah_rpc_opts, data) + sizeof(void *))

int ah_rpc_open(uv_stream_t *in, uv_stream_t *out, const ah_rpc_opts *opts, ah_rpc_peer **out_peer) {
  if (!in || !out || !opts || !out_peer || opts->struct_size < MIN_OPTS_SIZE || in->loop != out->loop)
    return AH_EINVAL;
  if (find_reader(in))
    return AH_EINVAL; /* another peer reads this stream */
  ah_rpc_peer *peer = calloc(1, sizeof *peer);
  if (!peer)
    return AH_ENOMEM;
  peer->rbuf = malloc(READ_CHUNK);
  if (!peer->rbuf) {
    free(peer);
    return AH_ENOMEM;
  }
  memcpy(&peer->opts, opts, opts->struct_size < sizeof peer->opts ? opts->struct_size : sizeof peer->opts);
  peer->opts.struct_size = sizeof peer->opts;
  peer->max_line = opts->max_line ? opts->max_line : AH_RPC_DEFAULT_MAX_LINE;
  peer->in = in;
  peer->out = out;
  peer->next_id = 1;

  int rc = uv_read_start(in, on_alloc, on_read);
  if (rc < 0) {
    peer_free(peer);
    return AH_EIO;
  }
  peer->reading = true;
  peer->next_reader = reading_peers;
  reading_peers = peer;
  peer->live = true;
  peer->live_next = live_peers;
  if (live_peers)
    live_peers->live_prev = peer;
  live_peers = peer;
  *out_peer = peer;
  return 0;
}

void ah_rpc_observe(ah_rpc_peer *peer, ah_rpc_observe_fn fn, void *arg) {
  if (!peer)
    return;
  peer->observe = fn;
  peer->observe_arg = arg;
}

int ah_rpc_close(ah_rpc_peer *peer, ah_rpc_closed_fn cb, void *arg) {
  if (!peer)
    return AH_EINVAL;
  if (peer->closing)
    return AH_ECLOSED;
  peer->closing = true;
  peer->close_cb = cb;
  peer->close_arg = arg;
  stop_reading(peer);
  /* The rest happens on later loop turns: outbound requests are failed on the next one, and the close
   * callback runs once the queued writes are done. A flush stuck on a peer that never reads ends when the
   * owner closes the output stream (libuv then cancels the writes). */
  uv_idle_init(peer->in->loop, &peer->idle);
  peer->idle.data = peer;
  uv_timer_init(peer->in->loop, &peer->flush_timer);
  peer->flush_timer.data = peer;
  peer->handles_open = 2;
  uv_idle_start(&peer->idle, on_close_idle);
  return 0;
}

/* ---- table ------------------------------------------------------------------------------------------ */

static const ah_rpc_api rpc_api = {
    .struct_size = sizeof(ah_rpc_api),
    .open = ah_rpc_open,
    .request = ah_rpc_request,
    .forget = ah_rpc_forget,
    .notify = ah_rpc_notify,
    .respond = ah_rpc_respond,
    .respond_error = ah_rpc_respond_error,
    .inbound_id = ah_rpc_inbound_id,
    .inbound_peer = ah_rpc_inbound_peer,
    .close = ah_rpc_close,
};

const ah_rpc_api *ah_rpc_api_get(void) {
  return &rpc_api;
}
