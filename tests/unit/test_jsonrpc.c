/* Unit tests for host/jsonrpc.c: the JSON-RPC 2.0 peer over JSON Lines (DECISIONS.md "SDK wire").
 *
 * Each test drives a real peer over a socketpair: the peer reads and writes one end, the test writes raw
 * bytes to the other end and reads back raw lines, all on one loop.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jsonrpc.h"
#include "support.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#endif

/* Bytes currently allocated on the heap: the sanitizer's own count under ASan, glibc's otherwise. */
#ifdef TEST_ASAN
size_t __sanitizer_get_current_allocated_bytes(void);
static size_t heap_in_use(void) {
  return __sanitizer_get_current_allocated_bytes();
}
#else
static size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}
#endif

#define MAX_EVENTS 64

/* One inbound request as the peer delivered it. */
typedef struct got_request {
  ah_rpc_inbound *req;
  char *method;
  json_t *params; /* a copy: the peer's is borrowed */
} got_request;

/* The answer an outbound request received. */
typedef struct got_response {
  bool called;
  int status;
  json_t *result;
  json_t *error;
} got_response;

typedef struct wire {
  uv_loop_t loop;
  uv_pipe_t near; /* the peer's end */
  uv_pipe_t far;  /* the test's end */
  ah_rpc_peer *peer;

  char *rx; /* raw bytes the peer wrote, not yet taken as lines */
  size_t rx_len;
  size_t rx_cap;
  bool far_reading;

  bool echo; /* answer every request at once with its params */
  size_t n_echoed;
  bool close_in_handler; /* close the peer from inside on_request, then answer */
  size_t n_closing_requests;
  got_request reqs[MAX_EVENTS];
  size_t n_reqs;
  char *notes[MAX_EVENTS];
  json_t *note_params[MAX_EVENTS];
  size_t n_notes;
  bool eof;
  int eof_status;
  char *logs[MAX_EVENTS];
  size_t n_logs;
  bool closed;
  int writes_pending; /* test-side writes not yet completed */
} wire;

static void on_closed(ah_rpc_peer *peer, void *arg) {
  (void)peer;
  wire *w = arg;
  cr_assert_not(w->closed, "close callback called twice");
  w->closed = true;
}

/* ---- peer callbacks ------------------------------------------------------------------------------------ */

static void on_request(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *data) {
  wire *w = data;
  cr_assert_eq(ah_rpc_inbound_peer(req), peer);
  if (w->close_in_handler) {
    w->n_closing_requests++;
    cr_assert_eq(ah_rpc_close(peer, on_closed, w), 0);
    cr_assert_eq(ah_rpc_pending_inbound(peer), 1);
    cr_assert_eq(ah_rpc_respond(req, json_true()), AH_ECLOSED);
    return;
  }
  if (w->echo) {
    w->n_echoed++;
    cr_assert_eq(ah_rpc_respond(req, params ? json_deep_copy(params) : NULL), 0);
    return;
  }
  cr_assert_lt(w->n_reqs, MAX_EVENTS);
  got_request *g = &w->reqs[w->n_reqs++];
  g->req = req;
  g->method = strdup(method);
  g->params = params ? json_deep_copy(params) : NULL;
}

static void on_notification(ah_rpc_peer *peer, const char *method, const json_t *params, void *data) {
  (void)peer;
  wire *w = data;
  cr_assert_lt(w->n_notes, MAX_EVENTS);
  w->notes[w->n_notes] = strdup(method);
  w->note_params[w->n_notes] = params ? json_deep_copy(params) : NULL;
  w->n_notes++;
}

static void on_eof(ah_rpc_peer *peer, int status, void *data) {
  (void)peer;
  wire *w = data;
  cr_assert_not(w->eof, "on_eof called twice");
  w->eof = true;
  w->eof_status = status;
}

static void on_log(ah_rpc_peer *peer, const char *msg, void *data) {
  (void)peer;
  wire *w = data;
  if (w->n_logs < MAX_EVENTS)
    w->logs[w->n_logs++] = strdup(msg);
}

static void on_response(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error, void *arg) {
  (void)peer;
  got_response *r = arg;
  cr_assert_not(r->called, "response callback called twice");
  r->called = true;
  r->status = status;
  r->result = result ? json_deep_copy(result) : NULL;
  r->error = error ? json_deep_copy(error) : NULL;
}

/* ---- the test's end ------------------------------------------------------------------------------------ */

static void far_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  (void)handle;
  buf->base = malloc(suggested);
  buf->len = buf->base ? suggested : 0;
}

static void far_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  wire *w = stream->data;
  if (nread > 0) {
    if (w->rx_len + (size_t)nread + 1 > w->rx_cap) {
      w->rx_cap = (w->rx_len + (size_t)nread + 1) * 2;
      w->rx = realloc(w->rx, w->rx_cap);
      cr_assert_not_null(w->rx);
    }
    memcpy(w->rx + w->rx_len, buf->base, (size_t)nread);
    w->rx_len += (size_t)nread;
    w->rx[w->rx_len] = '\0';
  } else if (nread < 0) {
    uv_read_stop(stream);
    w->far_reading = false;
  }
  free(buf->base);
}

typedef struct far_write {
  uv_write_t req;
  wire *w;
  char bytes[];
} far_write;

static void far_written(uv_write_t *req, int status) {
  far_write *fw = (far_write *)req;
  cr_assert_eq(status, 0, "test write failed: %s", uv_strerror(status));
  fw->w->writes_pending--;
  free(fw);
}

/* Queue raw bytes on the test's end. */
static void send_raw(wire *w, const void *bytes, size_t len) {
  far_write *fw = malloc(sizeof *fw + len);
  cr_assert_not_null(fw);
  fw->w = w;
  memcpy(fw->bytes, bytes, len);
  uv_buf_t buf = uv_buf_init(fw->bytes, (unsigned int)len);
  cr_assert_eq(uv_write(&fw->req, (uv_stream_t *)&w->far, &buf, 1, far_written), 0);
  w->writes_pending++;
}

static void send_str(wire *w, const char *s) {
  send_raw(w, s, strlen(s));
}

static bool has_line(void *arg) {
  wire *w = arg;
  return w->rx_len > 0 && memchr(w->rx, '\n', w->rx_len) != NULL;
}

/* The next raw line the peer wrote, with its "\n" (malloc'ed). Fails the test after 3 s. */
static char *next_raw(wire *w) {
  cr_assert(ts_run_until_pred(&w->loop, has_line, w, 3000), "no line from the peer");
  char *nl = memchr(w->rx, '\n', w->rx_len);
  size_t len = (size_t)(nl - w->rx) + 1;
  char *line = strndup(w->rx, len);
  cr_assert_not_null(line);
  memmove(w->rx, w->rx + len, w->rx_len - len);
  w->rx_len -= len;
  w->rx[w->rx_len] = '\0';
  return line;
}

/* The next line parsed; every line the peer writes is one compact object with "jsonrpc":"2.0". */
static json_t *next_msg(wire *w) {
  char *line = next_raw(w);
  json_error_t err;
  json_t *msg = json_loads(line, JSON_REJECT_DUPLICATES, &err);
  cr_assert_not_null(msg, "peer wrote invalid JSON: %s", line);
  cr_assert(json_is_object(msg));
  cr_assert_str_eq(json_string_value(json_object_get(msg, "jsonrpc")), "2.0");
  free(line);
  return msg;
}

/* Take the next line and check it is an error with `code` and a null id. */
static void expect_null_error(wire *w, int code) {
  json_t *msg = next_msg(w);
  json_t *id = json_object_get(msg, "id");
  cr_assert(id && json_is_null(id), "error without id null");
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(msg, "error"), "code")), code, "got %s",
               json_dumps(msg, JSON_COMPACT));
  json_decref(msg);
}

static bool nothing_pending(void *arg) {
  wire *w = arg;
  return w->writes_pending == 0;
}

/* Let everything queued on the test side reach the peer and be processed. */
static void settle(wire *w) {
  cr_assert(ts_run_until_pred(&w->loop, nothing_pending, w, 3000));
  for (int i = 0; i < 5; i++)
    uv_run(&w->loop, UV_RUN_NOWAIT);
}

static ah_rpc_opts default_opts(wire *w) {
  ah_rpc_opts o = {.struct_size = sizeof o,
                   .on_request = on_request,
                   .on_notification = on_notification,
                   .on_eof = on_eof,
                   .on_log = on_log,
                   .data = w};
  return o;
}

/* Set up the loop, the socketpair and (unless `opts` is NULL) the peer. */
static wire *wire_new(const ah_rpc_opts *opts) {
  signal(SIGPIPE, SIG_IGN); /* a write to a closed socket must fail with EPIPE, not kill the test */
  wire *w = calloc(1, sizeof *w);
  cr_assert_not_null(w);
  cr_assert_eq(uv_loop_init(&w->loop), 0);
  uv_os_sock_t fds[2] = {-1, -1};
  cr_assert_eq(uv_socketpair(SOCK_STREAM, 0, fds, UV_NONBLOCK_PIPE, UV_NONBLOCK_PIPE), 0);
  cr_assert_eq(uv_pipe_init(&w->loop, &w->near, 0), 0);
  cr_assert_eq(uv_pipe_open(&w->near, fds[0]), 0);
  cr_assert_eq(uv_pipe_init(&w->loop, &w->far, 0), 0);
  cr_assert_eq(uv_pipe_open(&w->far, fds[1]), 0);
  w->far.data = w;
  cr_assert_eq(uv_read_start((uv_stream_t *)&w->far, far_alloc, far_read), 0);
  w->far_reading = true;
  if (opts) {
    ah_rpc_opts o = *opts;
    if (!o.data)
      o.data = w;
    cr_assert_eq(ah_rpc_open((uv_stream_t *)&w->near, (uv_stream_t *)&w->near, &o, &w->peer), 0);
  }
  return w;
}

/* A peer with every callback of this file. */
static wire *wire_open(void) {
  ah_rpc_opts o = default_opts(NULL);
  return wire_new(&o);
}

static void free_events(wire *w) {
  for (size_t i = 0; i < w->n_reqs; i++) {
    free(w->reqs[i].method);
    json_decref(w->reqs[i].params);
  }
  for (size_t i = 0; i < w->n_notes; i++) {
    free(w->notes[i]);
    json_decref(w->note_params[i]);
  }
  for (size_t i = 0; i < w->n_logs; i++)
    free(w->logs[i]);
}

/* Close the peer (unless already closed), both ends and the loop; the loop must close cleanly. */
static void wire_free(wire *w) {
  if (w->peer && !w->closed) {
    cr_assert_eq(ah_rpc_close(w->peer, on_closed, w), 0);
    cr_assert(ts_run_until(&w->loop, &w->closed, 3000), "close callback never ran");
  }
  uv_close((uv_handle_t *)&w->near, NULL);
  if (!uv_is_closing((uv_handle_t *)&w->far))
    uv_close((uv_handle_t *)&w->far, NULL);
  cr_assert_eq(ts_loop_close(&w->loop), 0);
  free_events(w);
  free(w->rx);
  free(w);
}

static bool log_contains(wire *w, const char *needle) {
  for (size_t i = 0; i < w->n_logs; i++)
    if (strstr(w->logs[i], needle))
      return true;
  return false;
}

/* ---- requests and responses ------------------------------------------------------------------------------
 */

Test(jsonrpc, inbound_request_answered_compactly_with_same_id) {
  wire *w = wire_open();
  send_str(w, "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"ping\", \"params\": {\"x\": [1, 2]}}\n");
  settle(w);
  cr_assert_eq(w->n_reqs, 1);
  cr_assert_str_eq(w->reqs[0].method, "ping");
  cr_assert_eq(json_integer_value(json_array_get(json_object_get(w->reqs[0].params, "x"), 1)), 2);
  cr_assert_eq(ah_rpc_pending_inbound(w->peer), 1);
  const json_t *id = ah_rpc_inbound_id(w->reqs[0].req);
  cr_assert(json_is_integer(id) && json_integer_value(id) == 1);
  cr_assert_eq(ah_rpc_respond(w->reqs[0].req, json_pack("{s:b}", "ok", 1)), 0);
  cr_assert_eq(ah_rpc_pending_inbound(w->peer), 0);
  char *line = next_raw(w);
  cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"ok\":true}}\n");
  free(line);
  wire_free(w);
}

Test(jsonrpc, string_and_null_ids_echoed_exactly) {
  wire *w = wire_open();
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":\"1\",\"method\":\"a\"}\n"
              "{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"b\"}\n"
              "{\"jsonrpc\":\"2.0\",\"id\":-9007199254740993,\"method\":\"c\"}\n");
  settle(w);
  cr_assert_eq(w->n_reqs, 3);
  cr_assert_eq(ah_rpc_respond(w->reqs[0].req, NULL), 0);
  cr_assert_eq(ah_rpc_respond_error(w->reqs[1].req, -32000, "nope", json_string("why")), 0);
  cr_assert_eq(ah_rpc_respond(w->reqs[2].req, json_integer(3)), 0);
  char *l1 = next_raw(w);
  char *l2 = next_raw(w);
  char *l3 = next_raw(w);
  cr_assert_str_eq(l1, "{\"jsonrpc\":\"2.0\",\"id\":\"1\",\"result\":null}\n");
  cr_assert_str_eq(l2, "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32000,\"message\":\"nope\","
                       "\"data\":\"why\"}}\n");
  cr_assert_str_eq(l3, "{\"jsonrpc\":\"2.0\",\"id\":-9007199254740993,\"result\":3}\n");
  free(l1);
  free(l2);
  free(l3);
  wire_free(w);
}

Test(jsonrpc, outbound_request_result_and_error) {
  wire *w = wire_open();
  got_response r1 = {0};
  got_response r2 = {0};
  int64_t id1 = 0;
  int64_t id2 = 0;
  cr_assert_eq(ah_rpc_request(w->peer, "hello", json_pack("{s:i}", "n", 5), on_response, &r1, &id1), 0);
  cr_assert_eq(ah_rpc_request(w->peer, "fail", NULL, on_response, &r2, &id2), 0);
  cr_assert_eq(id1, 1);
  cr_assert_eq(id2, 2);
  cr_assert_eq(ah_rpc_pending_outbound(w->peer), 2);
  char *l1 = next_raw(w);
  char *l2 = next_raw(w);
  cr_assert_str_eq(l1, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\",\"params\":{\"n\":5}}\n");
  cr_assert_str_eq(l2, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"fail\"}\n");
  free(l1);
  free(l2);
  /* Answered out of order; "jsonrpc" left out on purpose (tolerated). */
  send_str(w, "{\"id\":2,\"error\":{\"code\":-32000,\"message\":\"bad\"}}\n"
              "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"v\":\"x\"}}\n");
  settle(w);
  cr_assert(r1.called && r2.called);
  cr_assert_eq(r1.status, 0);
  cr_assert_str_eq(json_string_value(json_object_get(r1.result, "v")), "x");
  cr_assert_null(r1.error);
  cr_assert_eq(r2.status, AH_EPROTO);
  cr_assert_null(r2.result);
  cr_assert_eq(json_integer_value(json_object_get(r2.error, "code")), -32000);
  cr_assert_eq(ah_rpc_pending_outbound(w->peer), 0);
  json_decref(r1.result);
  json_decref(r2.error);
  wire_free(w);
}

Test(jsonrpc, response_id_must_match_as_integer) {
  wire *w = wire_open();
  got_response r = {0};
  cr_assert_eq(ah_rpc_request(w->peer, "m", NULL, on_response, &r, NULL), 0);
  free(next_raw(w));
  /* The string "1" is not the number 1, 1.0 is not an integer, 7 was never sent. */
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":\"1\",\"result\":1}\n"
              "{\"jsonrpc\":\"2.0\",\"id\":1.0,\"result\":1}\n"
              "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":1}\n"
              "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"after\"}\n");
  settle(w);
  cr_assert_not(r.called);
  cr_assert(log_contains(w, "unknown response id"));
  cr_assert_eq(ah_rpc_pending_outbound(w->peer), 1);
  /* The stream went on: the request after the strays was delivered, and nothing was answered to them. */
  cr_assert_eq(w->n_reqs, 1);
  cr_assert_str_eq(w->reqs[0].method, "after");
  cr_assert_eq(ah_rpc_respond(w->reqs[0].req, json_true()), 0);
  char *line = next_raw(w);
  cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":true}\n");
  free(line);
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"ok\"}\n");
  settle(w);
  cr_assert(r.called);
  cr_assert_eq(r.status, 0);
  cr_assert_str_eq(json_string_value(r.result), "ok");
  json_decref(r.result);
  wire_free(w);
}

Test(jsonrpc, forget_drops_the_callback) {
  wire *w = wire_open();
  got_response r = {0};
  int64_t id = 0;
  cr_assert_eq(ah_rpc_request(w->peer, "slow", NULL, on_response, &r, &id), 0);
  cr_assert_eq(ah_rpc_forget(w->peer, id), 0);
  cr_assert_eq(ah_rpc_forget(w->peer, id), AH_ENOENT);
  cr_assert_eq(ah_rpc_pending_outbound(w->peer), 0);
  free(next_raw(w));
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":1}\n");
  settle(w);
  cr_assert_not(r.called);
  cr_assert(log_contains(w, "unknown response id"));
  wire_free(w);
}

Test(jsonrpc, notifications_both_ways) {
  wire *w = wire_open();
  cr_assert_eq(ah_rpc_notify(w->peer, "session.status", json_pack("{s:s}", "state", "idle")), 0);
  cr_assert_eq(ah_rpc_notify(w->peer, "bare", NULL), 0);
  char *l1 = next_raw(w);
  char *l2 = next_raw(w);
  cr_assert_str_eq(l1,
                   "{\"jsonrpc\":\"2.0\",\"method\":\"session.status\",\"params\":{\"state\":\"idle\"}}\n");
  cr_assert_str_eq(l2, "{\"jsonrpc\":\"2.0\",\"method\":\"bare\"}\n");
  free(l1);
  free(l2);
  send_str(w, "{\"jsonrpc\":\"2.0\",\"method\":\"n1\",\"params\":[1]}\n"
              "{\"jsonrpc\":\"2.0\",\"method\":\"n2\"}\n"
              "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"r\"}\n");
  settle(w);
  cr_assert_eq(w->n_notes, 2);
  cr_assert_str_eq(w->notes[0], "n1");
  cr_assert_eq(json_integer_value(json_array_get(w->note_params[0], 0)), 1);
  cr_assert_str_eq(w->notes[1], "n2");
  cr_assert_null(w->note_params[1]);
  /* Notifications are never answered: the first line out is the answer to the request. */
  cr_assert_eq(ah_rpc_respond(w->reqs[0].req, NULL), 0);
  json_t *msg = next_msg(w);
  cr_assert_eq(json_integer_value(json_object_get(msg, "id")), 3);
  json_decref(msg);
  wire_free(w);
}

Test(jsonrpc, no_handler_answers_method_not_found) {
  ah_rpc_opts o = {.struct_size = sizeof o, .on_log = on_log};
  wire *w = wire_new(&o);
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":\"abc\",\"method\":\"nothing\"}\n"
              "{\"jsonrpc\":\"2.0\",\"method\":\"dropped\"}\n"
              "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"nothing\"}\n");
  char *l1 = next_raw(w);
  char *l2 = next_raw(w);
  cr_assert_str_eq(l1,
                   "{\"jsonrpc\":\"2.0\",\"id\":\"abc\",\"error\":{\"code\":-32601,\"message\":\"method not "
                   "found\"}}\n");
  cr_assert_str_eq(l2, "{\"jsonrpc\":\"2.0\",\"id\":4,\"error\":{\"code\":-32601,\"message\":\"method not "
                       "found\"}}\n");
  free(l1);
  free(l2);
  cr_assert_eq(ah_rpc_pending_inbound(w->peer), 0);
  wire_free(w);
}

/* ---- refusals --------------------------------------------------------------------------------------------
 */

Test(jsonrpc, invalid_json_is_parse_error_with_null_id) {
  wire *w = wire_open();
  static const char *bad[] = {
      "garbage",
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":",                /* truncated */
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\",\"id\":2}", /* duplicate key */
      "{\"method\":\"a\x80\",\"id\":1}",                          /* invalid UTF-8 */
      "{\"method\":\"a\\u0000b\",\"id\":1}",                      /* NUL in a string */
      "{\"id\":123456789012345678901234567890,\"method\":\"a\"}", /* integer beyond int64 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    send_str(w, bad[i]);
    send_str(w, "\n");
    expect_null_error(w, AH_RPC_PARSE_ERROR);
  }
  cr_assert_eq(w->n_reqs, 0);
  cr_assert(log_contains(w, "parse error"));
  /* Nesting beyond jansson's depth limit (SECURITY.md J02). */
  char deep[2049 * 2 + 2] = {0};
  memset(deep, '[', 2049);
  memset(deep + 2049, ']', 2049);
  deep[2049 * 2] = '\n';
  send_raw(w, deep, 2049 * 2 + 1);
  expect_null_error(w, AH_RPC_PARSE_ERROR);
  /* And the stream goes on. */
  w->echo = true;
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ok\",\"params\":[true]}\n");
  char *line = next_raw(w);
  cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":[true]}\n");
  free(line);
  wire_free(w);
}

Test(jsonrpc, non_requests_are_invalid_request_with_null_id) {
  wire *w = wire_open();
  static const char *bad[] = {
      "[1,2]",
      "42",
      "\"text\"",
      "null",
      "{}",
      "{\"jsonrpc\":\"2.0\"}",
      "{\"jsonrpc\":\"2.0\",\"id\":1}",                          /* id alone */
      "{\"jsonrpc\":\"2.0\",\"result\":1}",                      /* result without id */
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":5}",             /* method not a string */
      "{\"jsonrpc\":\"2.0\",\"method\":null}",                   /* method not a string */
      "{\"jsonrpc\":\"2.0\",\"id\":{\"a\":1},\"method\":\"m\"}", /* object id */
      "{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"m\"}",       /* array id */
      "{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"m\"}",       /* fractional id */
      "{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"m\"}",      /* boolean id */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    send_str(w, bad[i]);
    send_str(w, "\n");
    expect_null_error(w, AH_RPC_INVALID_REQUEST);
  }
  cr_assert_eq(w->n_reqs, 0);
  cr_assert_eq(w->n_notes, 0);
  wire_free(w);
}

Test(jsonrpc, hostile_method_names_stay_data) {
  ah_rpc_opts o = {.struct_size = sizeof o, .on_log = on_log};
  wire *w = wire_new(&o);
  /* Escape sequences and line breaks inside the method name: answered -32601, one line, still escaped. */
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\\u001b[2J\\r\\n[INFO] auth ok\\u007f\"}\n");
  char *line = next_raw(w);
  cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32601,\"message\":\"method not "
                         "found\"}}\n");
  free(line);
  wire_free(w);

  w = wire_open();
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"\\u001b]0;pwn\\u0007\\n\"}\n");
  settle(w);
  cr_assert_eq(w->n_reqs, 1);
  cr_assert_str_eq(w->reqs[0].method, "\x1b]0;pwn\x07\n");
  /* A reply carrying the hostile name comes back escaped, on one line. */
  cr_assert_eq(ah_rpc_respond(w->reqs[0].req, json_string(w->reqs[0].method)), 0);
  line = next_raw(w);
  cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":\"\\u001B]0;pwn\\u0007\\n\"}\n");
  free(line);
  wire_free(w);
}

/* Read what was written to fd 2 while it pointed at `path`. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  char *buf = calloc(1, 65536);
  cr_assert_not_null(buf);
  size_t n = fread(buf, 1, 65535, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

Test(jsonrpc, stderr_diagnostics_are_escaped) {
  char *dir = ts_mkdtemp();
  cr_assert_not_null(dir);
  char *path = ts_write_file(dir, "stderr", "");
  int fd = open(path, O_WRONLY | O_TRUNC);
  cr_assert_geq(fd, 0);
  int saved = dup(STDERR_FILENO);
  cr_assert_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
  close(fd);

  ah_rpc_opts o = {.struct_size = sizeof o}; /* no on_log: diagnostics go to stderr */
  wire *w = wire_new(&o);
  got_response r = {0};
  cr_assert_eq(ah_rpc_request(w->peer, "m", NULL, on_response, &r, NULL), 0);
  free(next_raw(w));
  /* jansson quotes the offending raw bytes in its error text; a raw ESC and CR must not reach the log. */
  send_str(w, "\x1b[2J\rfake\tline\x7f\n");
  expect_null_error(w, AH_RPC_PARSE_ERROR);
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":\"\\u001b]0;pwn\\u0007\\r\\n\",\"result\":1}\n");
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"m\"}\n");
  free(next_raw(w)); /* -32601: the stray response was passed over */
  cr_assert_eq(ah_rpc_forget(w->peer, 1), 0);
  wire_free(w);

  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  char *text = slurp(path);
  cr_assert(strstr(text, "parse error"), "stderr: %s", text);
  cr_assert(strstr(text, "\\u001b"), "stderr: %s", text);
  cr_assert(strstr(text, "unknown response id"), "stderr: %s", text);
  for (const char *p = text; *p; p++) {
    unsigned char c = (unsigned char)*p;
    cr_assert(c == '\n' || (c >= 0x20 && c != 0x7f), "raw control byte 0x%02x on stderr", c);
  }
  /* One record per diagnostic: every line starts with the prefix. */
  for (const char *p = text; *p;) {
    cr_assert_eq(strncmp(p, "agenthost jsonrpc: ", 19), 0, "stderr: %s", text);
    const char *nl = strchr(p, '\n');
    cr_assert_not_null(nl);
    p = nl + 1;
  }
  free(text);
  ts_rmtree(dir);
  free(path);
  free(dir);
}

/* ---- framing ---------------------------------------------------------------------------------------------
 */

Test(jsonrpc, crlf_and_empty_lines) {
  wire *w = wire_open();
  w->echo = true;
  send_str(w, "\n\r\n\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\",\"params\":1}\r\n\r\n"
              "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"b\",\"params\":2}\n");
  char *l1 = next_raw(w);
  char *l2 = next_raw(w);
  cr_assert_str_eq(l1, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":1}\n");
  cr_assert_str_eq(l2, "{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":2}\n");
  free(l1);
  free(l2);
  settle(w);
  cr_assert_eq(w->rx_len, 0, "empty lines were answered: %s", w->rx);
  wire_free(w);
}

Test(jsonrpc, many_messages_in_one_read) {
  wire *w = wire_open();
  w->echo = true;
  enum { N = 200 };
  char *all = calloc(N, 64);
  cr_assert_not_null(all);
  size_t len = 0;
  for (int i = 0; i < N; i++)
    len +=
        (size_t)sprintf(all + len, "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"m\",\"params\":%d}\n", i, i);
  send_raw(w, all, len);
  free(all);
  for (int i = 0; i < N; i++) {
    json_t *msg = next_msg(w);
    cr_assert_eq(json_integer_value(json_object_get(msg, "id")), i, "answers out of order");
    cr_assert_eq(json_integer_value(json_object_get(msg, "result")), i);
    json_decref(msg);
  }
  wire_free(w);
}

Test(jsonrpc, one_message_split_over_many_reads) {
  wire *w = wire_open();
  const char *msg = "{\"jsonrpc\":\"2.0\",\"id\":77,\"method\":\"split\",\"params\":{\"k\":\"v\"}}\r\n";
  for (const char *p = msg; *p; p++) {
    send_raw(w, p, 1);
    settle(w); /* each byte is its own read */
    if (p[1])
      cr_assert_eq(w->n_reqs, 0, "dispatched before the newline");
  }
  cr_assert_eq(w->n_reqs, 1);
  cr_assert_str_eq(w->reqs[0].method, "split");
  cr_assert_str_eq(json_string_value(json_object_get(w->reqs[0].params, "k")), "v");
  cr_assert_eq(ah_rpc_respond(w->reqs[0].req, NULL), 0);
  char *line = next_raw(w);
  cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"id\":77,\"result\":null}\n");
  free(line);
  wire_free(w);
}

Test(jsonrpc, line_cap_boundary) {
  wire *w = wire_new(&(ah_rpc_opts){
      .struct_size = sizeof(ah_rpc_opts), .max_line = 64, .on_request = on_request, .on_log = on_log});
  w->echo = true;
  /* Exactly 64 bytes before "\n" is accepted; 65 is not. */
  char line[80] = {0};
  const char *req = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\"}";
  memset(line, ' ', sizeof line);
  memcpy(line, req, strlen(req));
  line[64] = '\n';
  send_raw(w, line, 65);
  json_t *msg = next_msg(w);
  cr_assert_eq(json_integer_value(json_object_get(msg, "id")), 1);
  json_decref(msg);
  line[64] = ' ';
  line[65] = '\n';
  send_raw(w, line, 66);
  json_t *err = next_msg(w);
  cr_assert(json_is_null(json_object_get(err, "id")));
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(err, "error"), "code")), -32600);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(err, "error"), "message")),
                   "line too long");
  json_decref(err);
  cr_assert(log_contains(w, "line longer than 64 bytes"));
  wire_free(w);
}

/* State of the long-line writer: one chunk in flight at a time, memory sampled at every completion. */
typedef struct streamer {
  wire *w;
  uv_write_t req;
  char *chunk;
  size_t chunk_len;
  size_t left;
  size_t base;
  size_t peak;
  bool done;
} streamer;

static void stream_next(uv_write_t *req, int status);

static void stream_chunk(streamer *s) {
  size_t n = s->left < s->chunk_len ? s->left : s->chunk_len;
  s->left -= n;
  uv_buf_t buf = uv_buf_init(s->chunk, (unsigned int)n);
  s->req.data = s;
  cr_assert_eq(uv_write(&s->req, (uv_stream_t *)&s->w->far, &buf, 1, stream_next), 0);
}

static void stream_next(uv_write_t *req, int status) {
  streamer *s = req->data;
  cr_assert_eq(status, 0);
  size_t now = heap_in_use();
  if (now > s->peak)
    s->peak = now;
  if (s->left > 0)
    stream_chunk(s);
  else
    s->done = true;
}

Test(jsonrpc, long_line_discarded_while_streaming) {
  wire *w = wire_new(&(ah_rpc_opts){
      .struct_size = sizeof(ah_rpc_opts), .max_line = 1024, .on_request = on_request, .on_log = on_log});
  w->echo = true;
  streamer s = {.w = w, .chunk_len = 64 * 1024, .left = 10 * 1024 * 1024};
  s.chunk = malloc(s.chunk_len);
  cr_assert_not_null(s.chunk);
  memset(s.chunk, 'a', s.chunk_len);
  const char *head = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"big\",\"params\":\"";
  memcpy(s.chunk, head, strlen(head));
  s.base = heap_in_use();
  s.peak = s.base;
  stream_chunk(&s);
  cr_assert(ts_run_until(&w->loop, &s.done, 30000), "the long line was not consumed");
  send_str(w, "\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"after\",\"params\":\"ok\"}\n");
  expect_null_error(w, AH_RPC_INVALID_REQUEST);
  char *line = next_raw(w);
  cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":\"ok\"}\n");
  free(line);
  /* 10 MiB went through; the peer never held more than a small fraction of it. */
  cr_assert_lt(s.peak - s.base, (size_t)1024 * 1024, "heap grew by %zu bytes while streaming",
               s.peak - s.base);
  free(s.chunk);
  wire_free(w);
}

/* ---- end of input, close, failures -----------------------------------------------------------------------
 */

static void shutdown_done(uv_shutdown_t *req, int status) {
  cr_assert_eq(status, 0);
  free(req);
}

static void far_shutdown(wire *w) {
  uv_shutdown_t *req = calloc(1, sizeof *req);
  cr_assert_not_null(req);
  cr_assert_eq(uv_shutdown(req, (uv_stream_t *)&w->far, shutdown_done), 0);
}

Test(jsonrpc, eof_reported_and_peer_stays_writable) {
  wire *w = wire_open();
  /* The last line has no "\n": it still counts. */
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"last\"}");
  far_shutdown(w);
  cr_assert(ts_run_until(&w->loop, &w->eof, 3000), "no EOF");
  cr_assert_eq(w->eof_status, 0);
  cr_assert_eq(w->n_reqs, 1);
  cr_assert_eq(ah_rpc_respond(w->reqs[0].req, json_string("bye")), 0);
  cr_assert_eq(ah_rpc_notify(w->peer, "still", NULL), 0);
  char *l1 = next_raw(w);
  char *l2 = next_raw(w);
  cr_assert_str_eq(l1, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"bye\"}\n");
  cr_assert_str_eq(l2, "{\"jsonrpc\":\"2.0\",\"method\":\"still\"}\n");
  free(l1);
  free(l2);
  wire_free(w);
}

Test(jsonrpc, eof_in_an_overlong_line_answers_line_too_long) {
  wire *w = wire_new(
      &(ah_rpc_opts){.struct_size = sizeof(ah_rpc_opts), .max_line = 16, .on_eof = on_eof, .on_log = on_log});
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}");
  far_shutdown(w);
  expect_null_error(w, AH_RPC_INVALID_REQUEST);
  cr_assert(ts_run_until(&w->loop, &w->eof, 3000));
  cr_assert_eq(w->eof_status, 0);
  wire_free(w);
}

Test(jsonrpc, read_error_reported_as_negative_status) {
  wire *w = wire_open();
  /* Closing a unix socket with unread data in its receive queue resets the connection (Linux). */
  uv_read_stop((uv_stream_t *)&w->far);
  w->far_reading = false;
  cr_assert_eq(ah_rpc_notify(w->peer, "unread", NULL), 0);
  for (int i = 0; i < 10; i++)
    uv_run(&w->loop, UV_RUN_NOWAIT);
  uv_close((uv_handle_t *)&w->far, NULL);
  cr_assert(ts_run_until(&w->loop, &w->eof, 3000), "no read error");
  cr_assert_lt(w->eof_status, 0);
  cr_assert(log_contains(w, "read failed"));
  wire_free(w);
}

Test(jsonrpc, close_fails_pending_requests_later) {
  wire *w = wire_open();
  got_response r = {0};
  cr_assert_eq(ah_rpc_request(w->peer, "never", NULL, on_response, &r, NULL), 0);
  cr_assert_eq(ah_rpc_close(w->peer, on_closed, w), 0);
  /* Nothing runs inside ah_rpc_close. */
  cr_assert_not(r.called);
  cr_assert_not(w->closed);
  cr_assert_eq(ah_rpc_close(w->peer, on_closed, w), AH_ECLOSED);
  got_response late = {0};
  cr_assert_eq(ah_rpc_request(w->peer, "late", NULL, on_response, &late, NULL), AH_ECLOSED);
  cr_assert_eq(ah_rpc_notify(w->peer, "late", json_object()), AH_ECLOSED);
  cr_assert(ts_run_until(&w->loop, &w->closed, 3000));
  cr_assert(r.called);
  cr_assert_eq(r.status, AH_ECLOSED);
  cr_assert_null(r.result);
  cr_assert_null(r.error);
  cr_assert_not(late.called);
  /* The request itself had been written before the close. */
  char *line = next_raw(w);
  cr_assert_str_eq(line, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"never\"}\n");
  free(line);
  wire_free(w);
}

Test(jsonrpc, close_flushes_queued_writes) {
  wire *w = wire_open();
  /* Larger than the socket buffer, so the writes are still queued when close is called. */
  enum { N = 64 };
  char *big = malloc(32 * 1024);
  cr_assert_not_null(big);
  memset(big, 'x', 32 * 1024 - 1);
  big[32 * 1024 - 1] = '\0';
  for (int i = 0; i < N; i++)
    cr_assert_eq(ah_rpc_notify(w->peer, "bulk", json_pack("{s:i,s:s}", "i", i, "pad", big)), 0);
  free(big);
  cr_assert_eq(ah_rpc_close(w->peer, on_closed, w), 0);
  cr_assert(ts_run_until(&w->loop, &w->closed, 5000));
  for (int i = 0; i < N; i++) {
    json_t *msg = next_msg(w);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(msg, "params"), "i")), i);
    json_decref(msg);
  }
  wire_free(w);
}

Test(jsonrpc, stuck_flush_ends_when_the_stream_is_closed) {
  wire *w = wire_open();
  uv_read_stop((uv_stream_t *)&w->far); /* the other side never reads */
  w->far_reading = false;
  char *big = malloc(256 * 1024);
  cr_assert_not_null(big);
  memset(big, 'x', 256 * 1024 - 1);
  big[256 * 1024 - 1] = '\0';
  for (int i = 0; i < 16; i++)
    cr_assert_eq(ah_rpc_notify(w->peer, "bulk", json_string(big)), 0);
  free(big);
  cr_assert_eq(ah_rpc_close(w->peer, on_closed, w), 0);
  for (int i = 0; i < 20; i++)
    uv_run(&w->loop, UV_RUN_NOWAIT);
  cr_assert_not(w->closed, "closed before the queued writes were done");
  uv_close((uv_handle_t *)&w->near, NULL);
  cr_assert(ts_run_until(&w->loop, &w->closed, 3000));
  uv_close((uv_handle_t *)&w->far, NULL);
  cr_assert_eq(ts_loop_close(&w->loop), 0);
  free_events(w);
  free(w->rx);
  free(w);
}

Test(jsonrpc, answers_after_close_free_the_handle) {
  wire *w = wire_open();
  send_str(
      w,
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"b\"}\n");
  settle(w);
  cr_assert_eq(w->n_reqs, 2);
  cr_assert_eq(ah_rpc_pending_inbound(w->peer), 2);
  cr_assert_eq(ah_rpc_close(w->peer, on_closed, w), 0);
  cr_assert_eq(ah_rpc_respond(w->reqs[0].req, json_true()), AH_ECLOSED);
  cr_assert(ts_run_until(&w->loop, &w->closed, 3000));
  /* The peer outlives its close callback until the last handle is answered (ASan checks the rest). */
  cr_assert_eq(ah_rpc_pending_inbound(w->peer), 1);
  cr_assert_eq(ah_rpc_respond_error(w->reqs[1].req, -32000, "late", json_true()), AH_ECLOSED);
  settle(w);
  cr_assert_eq(w->rx_len, 0, "an answer after close was sent: %s", w->rx);
  wire_free(w);
}

Test(jsonrpc, close_from_a_callback_stops_delivery) {
  wire *w = wire_open();
  w->close_in_handler = true;
  /* Both lines arrive in one read; the handler closes the peer on the first. */
  send_str(w, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n");
  cr_assert(ts_run_until(&w->loop, &w->closed, 3000));
  cr_assert_eq(w->n_closing_requests, 1);
  cr_assert_eq(w->n_notes, 0, "a message was delivered after close");
  cr_assert_not(w->eof, "on_eof after close");
  settle(w);
  cr_assert_eq(w->rx_len, 0, "an answer after close was sent: %s", w->rx);
  wire_free(w);
}

Test(jsonrpc, write_failure_marks_peer_broken) {
  wire *w = wire_open();
  got_response r1 = {0};
  got_response r2 = {0};
  cr_assert_eq(ah_rpc_request(w->peer, "first", NULL, on_response, &r1, NULL), 0);
  free(next_raw(w));
  uv_close((uv_handle_t *)&w->far, NULL);
  for (int i = 0; i < 5; i++)
    uv_run(&w->loop, UV_RUN_NOWAIT);
  /* Accepted (the failure is only known when the write runs), then the write fails with EPIPE. */
  int rc = ah_rpc_request(w->peer, "second", NULL, on_response, &r2, NULL);
  if (rc == 0)
    cr_assert(ts_run_until(&w->loop, &r2.called, 3000));
  cr_assert(ts_run_until(&w->loop, &r1.called, 3000));
  cr_assert_eq(r1.status, AH_ECLOSED);
  if (rc == 0)
    cr_assert_eq(r2.status, AH_ECLOSED);
  else
    cr_assert_eq(rc, AH_ECLOSED);
  cr_assert_eq(ah_rpc_notify(w->peer, "after", NULL), AH_ECLOSED);
  cr_assert_eq(ah_rpc_pending_outbound(w->peer), 0);
  cr_assert(log_contains(w, "write failed"));
  wire_free(w);
}

/* ---- arguments and the table -----------------------------------------------------------------------------
 */

Test(jsonrpc, open_and_send_refuse_bad_arguments) {
  wire *w = wire_new(NULL);
  ah_rpc_peer *peer = NULL;
  ah_rpc_opts o = {.struct_size = sizeof o};
  uv_stream_t *s = (uv_stream_t *)&w->near;
  cr_assert_eq(ah_rpc_open(NULL, s, &o, &peer), AH_EINVAL);
  cr_assert_eq(ah_rpc_open(s, NULL, &o, &peer), AH_EINVAL);
  cr_assert_eq(ah_rpc_open(s, s, NULL, &peer), AH_EINVAL);
  cr_assert_eq(ah_rpc_open(s, s, &o, NULL), AH_EINVAL);
  ah_rpc_opts small = {.struct_size = 8};
  cr_assert_eq(ah_rpc_open(s, s, &small, &peer), AH_EINVAL);
  cr_assert_null(peer);
  cr_assert_eq(ah_rpc_open(s, s, &o, &peer), 0);
  ah_rpc_peer *second = NULL;
  cr_assert_eq(ah_rpc_open(s, s, &o, &second), AH_EINVAL, "two peers reading one stream");
  got_response r = {0};
  cr_assert_eq(ah_rpc_request(peer, NULL, json_object(), on_response, &r, NULL), AH_EINVAL);
  cr_assert_eq(ah_rpc_request(peer, "m", json_object(), NULL, NULL, NULL), AH_EINVAL);
  cr_assert_eq(ah_rpc_request(peer, "bad\xff", json_object(), on_response, &r, NULL), AH_EINVAL);
  cr_assert_eq(ah_rpc_notify(peer, NULL, json_object()), AH_EINVAL);
  cr_assert_eq(ah_rpc_respond(NULL, json_object()), AH_EINVAL);
  cr_assert_eq(ah_rpc_respond_error(NULL, 1, "x", json_object()), AH_EINVAL);
  cr_assert_eq(ah_rpc_forget(peer, 42), AH_ENOENT);
  cr_assert_not(r.called);
  w->peer = peer;
  wire_free(w);
}

Test(jsonrpc, api_table) {
  const ah_rpc_api *api = ah_rpc_api_get();
  cr_assert_not_null(api);
  cr_assert_eq(api, ah_rpc_api_get());
  cr_assert_eq(api->struct_size, sizeof(ah_rpc_api));
  cr_assert_eq(api->open, ah_rpc_open);
  cr_assert_eq(api->request, ah_rpc_request);
  cr_assert_eq(api->forget, ah_rpc_forget);
  cr_assert_eq(api->notify, ah_rpc_notify);
  cr_assert_eq(api->respond, ah_rpc_respond);
  cr_assert_eq(api->respond_error, ah_rpc_respond_error);
  cr_assert_eq(api->inbound_id, ah_rpc_inbound_id);
  cr_assert_eq(api->inbound_peer, ah_rpc_inbound_peer);
  cr_assert_eq(api->close, ah_rpc_close);
}

/* ---- backpressure and bounded close ------------------------------------------------------------------ */

static bool all_echoed(void *arg) {
  wire *w = arg;
  return w->n_echoed == 20000 && w->writes_pending == 0;
}

/* SDK-JSONL-TRANSPORT, reliability finding 2: a client that pipelines requests and never reads the answers
 * does not make the peer read (and answer into memory) without bound: reading pauses while the output is
 * backed up and resumes as it drains; nothing is lost. */
Test(jsonrpc, reading_pauses_while_the_output_is_not_read) {
  wire *w = wire_open();
  w->echo = true;
  uv_read_stop((uv_stream_t *)&w->far); /* the client never reads */
  w->far_reading = false;
  char pad[1001];
  memset(pad, 'x', 1000);
  pad[1000] = '\0';
  enum { N = 20000 };
  for (int i = 0; i < N; i++) {
    char line[1100];
    snprintf(line, sizeof line, "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"m\",\"params\":[\"%s\"]}\n", i,
             pad);
    send_raw(w, line, strlen(line));
  }
  uint64_t end = ts_now_ms() + 1500;
  while (ts_now_ms() < end)
    uv_run(&w->loop, UV_RUN_NOWAIT);
  size_t echoed = w->n_echoed;
  size_t queued = w->near.write_queue_size;
  cr_expect_lt(echoed, (size_t)N / 2, "%zu of %d requests were read and answered into memory", echoed, N);
  cr_expect_gt(echoed, 0);
  cr_expect_leq(queued, (size_t)2 * 1024 * 1024, "%zu bytes queued for a client that does not read", queued);
  cr_expect_gt(w->writes_pending, 0, "the client's writes should be blocked");
  /* The client reads again: every request is answered. */
  cr_assert_eq(uv_read_start((uv_stream_t *)&w->far, far_alloc, far_read), 0);
  w->far_reading = true;
  cr_assert(ts_run_until_pred(&w->loop, all_echoed, w, 20000), "%zu of %d answered", w->n_echoed, N);
  size_t lines = 0;
  for (size_t i = 0; i < w->rx_len; i++)
    lines += w->rx[i] == '\n';
  while (lines < N && ts_run_until_pred(&w->loop, has_line, w, 100)) {
    lines = 0;
    for (size_t i = 0; i < w->rx_len; i++)
      lines += w->rx[i] == '\n';
    if (lines >= N)
      break;
    uv_run(&w->loop, UV_RUN_NOWAIT);
  }
  cr_expect_eq(lines, (size_t)N, "every answer arrived");
  wire_free(w);
}

/* Reliability finding 1: closing a peer whose other side never reads ends in a bounded time (the flush
 * gives up after a stall); the queued writes are cancelled by the owner's close of the stream. */
Test(jsonrpc, close_gives_up_a_stalled_flush) {
  wire *w = wire_open();
  uv_read_stop((uv_stream_t *)&w->far);
  w->far_reading = false;
  char *big = malloc(64 * 1024 + 1);
  memset(big, 'y', 64 * 1024);
  big[64 * 1024] = '\0';
  for (int i = 0; i < 128; i++) /* 8 MiB: far more than the socket buffers */
    cr_assert_eq(ah_rpc_notify(w->peer, "n", json_pack("[s]", big)), 0);
  free(big);
  uint64_t t0 = ts_now_ms();
  cr_assert_eq(ah_rpc_close(w->peer, on_closed, w), 0);
  cr_assert(ts_run_until(&w->loop, &w->closed, 10000), "the close never ended");
  uint64_t took = ts_now_ms() - t0;
  cr_expect_geq(took, 900, "gave up before a stall (%llu ms)", (unsigned long long)took);
  cr_expect(log_contains(w, "not flushed"), "the given-up flush was not logged");
  wire_free(w); /* closes the stream: libuv cancels the writes left behind */
}
