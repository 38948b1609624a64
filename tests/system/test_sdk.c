/* Integration tests of the SDK surface: the real `agenthost sdk` ($AH_TEST_AGENTHOST) driven over pipes with
 * raw JSON Lines (PROTOCOLS.md "SDK": SDK-JSONL-TRANSPORT, SDK-WIRE-METHODS, SDK-SERVER-EVENTS,
 * SDK-SERVER-INIT, SDK-SERVER-SESSIONS, SDK-SERVER-SHUTDOWN, SDK-WIRE-LIMITS).
 *
 * Every child is started with PR_SET_PDEATHSIG(SIGKILL) set before exec — the host replaces it with
 * SIGTERM (host/main.c), so a failed assertion that ends the test process still ends the host — and every
 * test kills and reaps its child.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../host/config.h"
#include "support.h"

typedef ts_stdio sdk_host;

static void host_start(sdk_host *h) {
  ts_stdio_start(h, "sdk", NULL);
}

static void host_kill(sdk_host *h) {
  ts_stdio_free(h);
}

/* `params` is stolen (NULL = none). */
static void send_request(sdk_host *h, int id, const char *method, json_t *params) {
  json_t *msg = json_pack("{s:s, s:i, s:s}", "jsonrpc", "2.0", "id", id, "method", method);
  if (params)
    json_object_set_new(msg, "params", params);
  ts_stdio_send_json(h, msg);
  json_decref(msg);
}

/* The next response (notifications and server requests skipped), NULL on timeout. */
static json_t *next_response(sdk_host *h, uint64_t timeout_ms) {
  return ts_stdio_next_response(h, timeout_ms, NULL, NULL);
}

/* Send a request and wait for its response. */
static json_t *call(sdk_host *h, int id, const char *method, json_t *params) {
  send_request(h, id, method, params);
  return ts_stdio_answer(h, id, method);
}

static void initialize(sdk_host *h, bool requests) {
  json_t *r =
      call(h, 1, "initialize",
           json_pack("{s:s, s:{s:s, s:s}, s:i, s:{s:b}}", "cwd", h->work, "clientInfo", "name", "test",
                     "version", "1", "protocolVersion", 1, "capabilities", "requests", requests));
  cr_assert(json_object_get(r, "result"), "initialize failed");
  json_decref(r);
}

static const char *event_kind(const json_t *m) {
  return json_string_value(json_object_get(json_object_get(json_object_get(m, "params"), "event"), "kind"));
}

/* SDK-SERVER-INIT, SDK-WIRE-LIMITS: serverInfo, the negotiated protocolVersion, the capabilities. */
Test(sdk, initialize_fields, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  json_t *r = call(
      &h, 1, "initialize",
      json_pack("{s:s, s:i, s:{s:b}}", "cwd", h.work, "protocolVersion", 7, "capabilities", "requests", 1));
  json_t *res = json_object_get(r, "result");
  cr_assert(res, "initialize failed");
  json_t *info = json_object_get(res, "serverInfo");
  cr_assert_str_eq(json_string_value(json_object_get(info, "name")), "agenthost");
  cr_assert(json_is_string(json_object_get(info, "version")));
  cr_assert(strlen(json_string_value(json_object_get(info, "version"))) > 0);
  cr_assert(json_is_integer(json_object_get(res, "protocolVersion")));
  cr_assert_eq(json_integer_value(json_object_get(res, "protocolVersion")), 1);
  json_t *caps = json_object_get(res, "capabilities");
  cr_assert(json_is_true(json_object_get(caps, "cancel")));
  cr_assert(json_is_true(json_object_get(caps, "close")));
  cr_assert(json_is_true(json_object_get(caps, "requests")));
  json_decref(r);
  host_kill(&h);
}

/* SDK-SERVER-INIT: a relative cwd or a non-integer protocolVersion is -32602 and leaves the server
 * uninitialized. */
Test(sdk, initialize_bad_params, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  json_t *r = call(&h, 1, "initialize", json_pack("{s:s}", "cwd", "relative/dir"));
  cr_assert_eq(ts_rpc_error_code(r), -32602);
  json_decref(r);
  r = call(&h, 2, "initialize", json_pack("{s:s, s:s}", "cwd", h.work, "protocolVersion", "1"));
  cr_assert_eq(ts_rpc_error_code(r), -32602);
  json_decref(r);
  r = call(&h, 3, "session/prompt", json_pack("{s:s}", "text", "hi"));
  cr_assert_eq(ts_rpc_error_code(r), -32002);
  json_decref(r);
  host_kill(&h);
}

/* SDK-SERVER-INIT: requests before initialize → -32002 "not initialized". */
Test(sdk, request_before_initialize, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  json_t *r = call(&h, 5, "session/prompt", json_pack("{s:s}", "text", "hello"));
  cr_assert_eq(ts_rpc_error_code(r), -32002);
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r, "error"), "message")),
                   "not initialized");
  json_decref(r);
  r = call(&h, 6, "shutdown", NULL);
  cr_assert_eq(ts_rpc_error_code(r), -32002);
  json_decref(r);
  initialize(&h, false);
  host_kill(&h);
}

/* SDK-SERVER-INIT: a second initialize → -32600; an unknown method → -32601. */
Test(sdk, second_initialize, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  json_t *r = call(&h, 2, "initialize", json_pack("{s:s}", "cwd", h.work));
  cr_assert_eq(ts_rpc_error_code(r), -32600);
  json_decref(r);
  r = call(&h, 3, "no/such", NULL);
  cr_assert_eq(ts_rpc_error_code(r), -32601);
  json_decref(r);
  host_kill(&h);
}

/* SDK-WIRE-METHODS, SDK-SERVER-SESSIONS: the receipt, then the session's events in seq order starting with
 * inbox/received, then session.status idle. */
Test(sdk, prompt_receipt_events_idle, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  send_request(&h, 2, "session/prompt", json_pack("{s:s}", "text", "hello"));
  json_t *receipt = NULL;
  json_int_t last_seq = 0;
  bool saw_received = false, saw_end = false, saw_idle = false;
  char sid[64] = "";
  uint64_t end = ts_now_ms() + 10000;
  while (!saw_idle && ts_now_ms() < end) {
    json_t *m = ts_stdio_next_msg(&h, 10000);
    cr_assert(m, "the host stopped talking");
    if (ts_rpc_is_response(m)) {
      cr_assert_eq(json_integer_value(json_object_get(m, "id")), 2);
      cr_assert_null(receipt, "two answers");
      receipt = json_incref(json_object_get(m, "result"));
      cr_assert(receipt, "session/prompt failed");
      cr_assert(json_is_string(json_object_get(receipt, "sessionId")));
      cr_assert(json_is_string(json_object_get(receipt, "messageId")));
      snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(receipt, "sessionId")));
    } else if (strcmp(ts_rpc_method(m), "session.event") == 0) {
      json_t *p = json_object_get(m, "params");
      json_t *ev = json_object_get(p, "event");
      json_int_t seq = json_integer_value(json_object_get(ev, "seq"));
      cr_assert_eq(seq, last_seq + 1, "events out of order: %lld after %lld", (long long)seq,
                   (long long)last_seq);
      last_seq = seq;
      if (seq == 1) {
        cr_assert_str_eq(event_kind(m), "inbox/received");
        saw_received = true;
        if (receipt)
          cr_assert_str_eq(json_string_value(json_object_get(ev, "messageId")),
                           json_string_value(json_object_get(receipt, "messageId")));
      }
      cr_assert_str_eq(json_string_value(json_object_get(p, "sessionId")),
                       json_string_value(json_object_get(ev, "sessionId")));
      if (strcmp(event_kind(m), "turn/ended") == 0)
        saw_end = true;
    } else if (strcmp(ts_rpc_method(m), "session.status") == 0) {
      const char *st = json_string_value(json_object_get(json_object_get(m, "params"), "status"));
      if (saw_end && st && strcmp(st, "idle") == 0)
        saw_idle = true;
    }
    json_decref(m);
  }
  cr_assert(receipt && saw_received && saw_end && saw_idle, "receipt %d received %d end %d idle %d",
            receipt != NULL, saw_received, saw_end, saw_idle);
  /* The same (default) session takes the next prompt; an unknown session is -32002 (DECISIONS.md). */
  json_t *r = call(&h, 3, "session/prompt", json_pack("{s:s}", "text", "again"));
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r, "result"), "sessionId")), sid);
  json_decref(r);
  r = call(&h, 4, "session/prompt",
           json_pack("{s:s, s:s}", "sessionId", "01234567-0000-7000-8000-000000000000", "text", "x"));
  cr_assert_eq(ts_rpc_error_code(r), -32002);
  json_decref(r);
  json_decref(receipt);
  host_kill(&h);
}

/* SDK-SERVER-EVENTS: with capabilities.deltas the streamed text arrives as session.delta notifications
 * (their text adds up to the committed message); without it none is sent; a non-boolean is -32602. */
static void deltas_run(bool want, const char *text, char *streamed, size_t cap, char *committed,
                       size_t ccap) {
  sdk_host h;
  host_start(&h);
  json_t *r =
      call(&h, 1, "initialize", json_pack("{s:s, s:{s:b}}", "cwd", h.work, "capabilities", "deltas", want));
  cr_assert(
      json_is_true(json_object_get(json_object_get(json_object_get(r, "result"), "capabilities"), "deltas")));
  json_decref(r);
  send_request(&h, 2, "session/prompt", json_pack("{s:s}", "text", text));
  streamed[0] = committed[0] = '\0';
  bool ended = false;
  uint64_t end = ts_now_ms() + 10000;
  while (!ended && ts_now_ms() < end) {
    json_t *m = ts_stdio_next_msg(&h, 10000);
    cr_assert(m, "the host stopped talking");
    const char *method = ts_rpc_is_response(m) ? "" : ts_rpc_method(m);
    json_t *p = json_object_get(m, "params");
    if (strcmp(method, "session.delta") == 0) {
      cr_expect(json_is_string(json_object_get(p, "turnId")) &&
                json_is_string(json_object_get(p, "messageId")));
      strncat(streamed, json_string_value(json_object_get(p, "text")), cap - strlen(streamed) - 1);
    } else if (strcmp(method, "session.event") == 0) {
      if (strcmp(event_kind(m), "message/committed") == 0)
        snprintf(
            committed, ccap, "%s",
            json_string_value(json_object_get(json_object_get(json_object_get(p, "event"), "data"), "text")));
      ended = strcmp(event_kind(m), "turn/ended") == 0;
    }
    json_decref(m);
  }
  cr_assert(ended, "the turn did not end");
  host_kill(&h);
}

Test(sdk, deltas_only_when_asked, .timeout = 60) {
  char streamed[256], committed[256];
  deltas_run(true, "/chunks 4\nstreamed in pieces", streamed, sizeof streamed, committed, sizeof committed);
  cr_expect_str_eq(committed, "echo: streamed in pieces");
  cr_expect_str_eq(streamed, committed, "the deltas do not add up to the committed text");
  deltas_run(false, "/chunks 4\nstreamed in pieces", streamed, sizeof streamed, committed, sizeof committed);
  cr_expect_str_eq(streamed, "", "deltas without the capability");
  cr_expect_str_eq(committed, "echo: streamed in pieces");
  sdk_host h;
  host_start(&h);
  json_t *r =
      call(&h, 1, "initialize", json_pack("{s:s, s:{s:s}}", "cwd", h.work, "capabilities", "deltas", "yes"));
  cr_expect_eq(ts_rpc_error_code(r), -32602);
  json_decref(r);
  host_kill(&h);
}

/* SDK-SERVER-SESSIONS: prompts sent together before the first creation finished share one session. */
Test(sdk, concurrent_prompts_coalesced, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  for (int i = 0; i < 5; i++)
    send_request(&h, 10 + i, "session/prompt", json_pack("{s:s}", "text", "hi"));
  char first[64] = "";
  for (int n = 0; n < 5; n++) {
    json_t *r = next_response(&h, 10000);
    cr_assert(r);
    const char *sid = json_string_value(json_object_get(json_object_get(r, "result"), "sessionId"));
    cr_assert(sid, "a prompt failed");
    if (!first[0])
      snprintf(first, sizeof first, "%s", sid);
    cr_assert_str_eq(sid, first, "two sessions were created");
    json_decref(r);
  }
  host_kill(&h);
}

/* Waits for a session.event of `kind`; returns ms waited, or -1. */
static long wait_event(sdk_host *h, const char *kind, const char *reason, uint64_t timeout_ms) {
  uint64_t start = ts_now_ms(), end = start + timeout_ms;
  while (ts_now_ms() < end) {
    json_t *m = ts_stdio_next_msg(h, end - ts_now_ms());
    if (!m)
      break;
    bool hit = ts_rpc_method(m) && strcmp(ts_rpc_method(m), "session.event") == 0 &&
               strcmp(event_kind(m), kind) == 0;
    if (hit && reason) {
      const char *r = json_string_value(json_object_get(
          json_object_get(json_object_get(json_object_get(m, "params"), "event"), "data"), "reason"));
      cr_assert(r && strcmp(r, reason) == 0, "%s with reason %s, not %s", kind, r ? r : "(none)", reason);
    }
    json_decref(m);
    if (hit)
      return (long)(ts_now_ms() - start);
  }
  return -1;
}

/* SDK-WIRE-LIMITS: session/cancel during "/sleep 5000" ends the turn `cancelled`, quickly (issue target:
 * 200 ms; asserted: 1 s). */
Test(sdk, cancel_sleep, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  json_t *r = call(&h, 2, "session/prompt", json_pack("{s:s}", "text", "/sleep 5000"));
  char sid[64];
  snprintf(sid, sizeof sid, "%s",
           json_string_value(json_object_get(json_object_get(r, "result"), "sessionId")));
  json_decref(r);
  cr_assert(wait_event(&h, "turn/started", NULL, 10000) >= 0, "the turn never started");
  uint64_t t0 = ts_now_ms();
  send_request(&h, 3, "session/cancel", json_pack("{s:s}", "sessionId", sid));
  long waited = wait_event(&h, "turn/ended", "cancelled", 5000);
  cr_assert(waited >= 0, "no turn/ended");
  uint64_t latency = ts_now_ms() - t0;
  printf("sdk cancel latency: %llu ms (target 200 ms)\n", (unsigned long long)latency);
  fflush(stdout);
  cr_assert(latency < 1000, "cancel took %llu ms", (unsigned long long)latency);
  host_kill(&h);
}

/* SDK-WIRE-LIMITS: session/close closes the session; a prompt to it then fails. */
Test(sdk, close_session, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  json_t *r = call(&h, 2, "session/prompt", json_pack("{s:s}", "text", "hi"));
  char sid[64];
  snprintf(sid, sizeof sid, "%s",
           json_string_value(json_object_get(json_object_get(r, "result"), "sessionId")));
  json_decref(r);
  r = call(&h, 3, "session/close", json_pack("{s:s}", "sessionId", sid));
  cr_assert(json_object_get(r, "result"), "close failed");
  json_decref(r);
  r = call(&h, 4, "session/prompt", json_pack("{s:s, s:s}", "sessionId", sid, "text", "x"));
  cr_assert(json_object_get(r, "error"), "a prompt to a closed session was accepted");
  json_decref(r);
  /* Without a sessionId a fresh default session is made. */
  r = call(&h, 5, "session/prompt", json_pack("{s:s}", "text", "hi"));
  const char *sid2 = json_string_value(json_object_get(json_object_get(r, "result"), "sessionId"));
  cr_assert(sid2 && strcmp(sid2, sid) != 0);
  json_decref(r);
  host_kill(&h);
}

static const char *write_prompt = "/tool write_file {\"path\":\"a.txt\",\"content\":\"x\"}";

/* SDK-WIRE-LIMITS: an approval arrives as a request/approval server request; the client's answer resolves
 * it. */
Test(sdk, approval_via_server_request, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, true);
  send_request(&h, 2, "session/prompt", json_pack("{s:s}", "text", write_prompt));
  bool answered = false, ended = false;
  uint64_t end = ts_now_ms() + 15000;
  while (!ended && ts_now_ms() < end) {
    json_t *m = ts_stdio_next_msg(&h, 15000);
    cr_assert(m, "the host stopped talking");
    const char *method = ts_rpc_method(m);
    if (method && json_object_get(m, "id")) {
      cr_assert_str_eq(method, "request/approval");
      json_t *p = json_object_get(m, "params");
      cr_assert_str_eq(json_string_value(json_object_get(p, "kind")), "approval");
      cr_assert(json_is_string(json_object_get(p, "id")));
      json_t *ans = json_pack("{s:s, s:O, s:{s:s}}", "jsonrpc", "2.0", "id", json_object_get(m, "id"),
                              "result", "optionId", "allow_once");
      ts_stdio_send_json(&h, ans);
      json_decref(ans);
      answered = true;
    } else if (method && strcmp(method, "session.event") == 0 && strcmp(event_kind(m), "turn/ended") == 0) {
      ended = true;
    }
    json_decref(m);
  }
  cr_assert(answered, "no request/approval");
  cr_assert(ended, "the turn did not end");
  char *path = NULL;
  cr_assert(asprintf(&path, "%s/a.txt", h.work) > 0);
  size_t len = 0;
  char *content = ts_read_file(path, &len);
  cr_assert(content, "the approved write did not happen");
  cr_assert_str_eq(content, "x");
  free(content);
  free(path);
  host_kill(&h);
}

/* SDK-WIRE-LIMITS: without capabilities.requests, nothing is sent; the request stays pending. */
Test(sdk, no_server_request_without_capability, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  send_request(&h, 2, "session/prompt", json_pack("{s:s}", "text", write_prompt));
  bool saw_call = false;
  uint64_t end = ts_now_ms() + 1500;
  while (ts_now_ms() < end) {
    json_t *m = ts_stdio_next_msg(&h, end - ts_now_ms());
    if (!m)
      break;
    const char *method = ts_rpc_method(m);
    cr_assert(!(method && json_object_get(m, "id")), "a server request was sent: %s", method);
    if (method && strcmp(method, "session.event") == 0) {
      cr_assert_str_neq(event_kind(m), "turn/ended", "the turn ended without an answer");
      if (strcmp(event_kind(m), "tool/call") == 0)
        saw_call = true;
    }
    json_decref(m);
  }
  cr_assert(saw_call, "the tool call never happened");
  char *path = NULL;
  cr_assert(asprintf(&path, "%s/a.txt", h.work) > 0);
  cr_assert_neq(access(path, F_OK), 0);
  free(path);
  host_kill(&h);
}

static void expect_error_then_alive(sdk_host *h, const char *what) {
  json_t *r = next_response(h, 30000);
  cr_assert(r, "%s: no answer", what);
  cr_assert(json_object_get(r, "error"), "%s: not an error", what);
  printf("sdk malformed %s → %d\n", what, ts_rpc_error_code(r));
  json_decref(r);
}

/* SDK-JSONL-TRANSPORT, DECISIONS.md "SDK wire": malformed lines each get an error and the stream goes on. */
Test(sdk, malformed_lines, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  ts_stdio_send_line(&h, "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ini");
  expect_error_then_alive(&h, "truncated JSON");
  size_t depth = 2049;
  char *nested = malloc(2 * depth + 1);
  cr_assert(nested);
  memset(nested, '[', depth);
  memset(nested + depth, ']', depth);
  nested[2 * depth] = 0;
  ts_stdio_send_line(&h, nested);
  free(nested);
  expect_error_then_alive(&h, "2049 nested arrays");
  ts_stdio_send_line(&h, "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"\xff\xfe\"}");
  expect_error_then_alive(&h, "invalid UTF-8");
  static const char nul_line[] = "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"a\0b\"}\n";
  ts_stdio_send_raw(&h, nul_line, sizeof nul_line - 1);
  expect_error_then_alive(&h, "a NUL byte");
  /* 70 MiB: over the default 64 MiB cap; discarded as it streams and answered -32600 "line too long". */
  size_t chunk = 1 << 20;
  char *big = malloc(chunk);
  cr_assert(big);
  memset(big, 'a', chunk);
  big[0] = '"';
  ts_stdio_send_raw(&h, big, chunk);
  big[0] = 'a';
  for (int i = 1; i < 70; i++)
    ts_stdio_send_raw(&h, big, chunk);
  free(big);
  ts_stdio_send_raw(&h, "\"\n", 2);
  json_t *r = next_response(&h, 30000);
  cr_assert(r, "70 MiB line: no answer");
  cr_assert_eq(ts_rpc_error_code(r), -32600);
  cr_assert(json_is_null(json_object_get(r, "id")));
  json_decref(r);
  /* The host keeps answering. */
  initialize(&h, false);
  r = call(&h, 2, "session/prompt", json_pack("{s:s}", "text", "still here"));
  cr_assert(json_object_get(r, "result"));
  json_decref(r);
  host_kill(&h);
}

/* SDK-SERVER-SHUTDOWN: `{}`, then after shutdown everything is -32600 or the stream is closed, and the
 * process exits 0. */
Test(sdk, shutdown_exits_zero, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  json_t *r = call(&h, 2, "shutdown", NULL);
  json_t *res = json_object_get(r, "result");
  cr_assert(json_is_object(res) && json_object_size(res) == 0, "shutdown did not answer {}");
  json_decref(r);
  int status = 0;
  cr_assert(ts_wait_exit(h.pid, 10000, &status), "the host did not exit");
  h.pid = -1;
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
  host_kill(&h);
}

/* DECISIONS.md "SDK wire": stdin EOF is an orderly shutdown: exit 0. */
Test(sdk, stdin_eof_exits_zero, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  json_t *r = call(&h, 2, "session/prompt", json_pack("{s:s}", "text", "/sleep 5000"));
  json_decref(r);
  ts_stdio_close_stdin(&h);
  int status = 0;
  cr_assert(ts_wait_exit(h.pid, 10000, &status), "the host did not exit on EOF");
  h.pid = -1;
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
  /* stdout is closed: nothing is left holding it (no child of the host survived). */
  json_t *m;
  while ((m = ts_stdio_next_msg(&h, 2000)) != NULL)
    json_decref(m);
  struct pollfd p = {.fd = h.out, .events = POLLIN};
  cr_assert_eq(poll(&p, 1, 2000), 1);
  char c;
  cr_assert_eq(read(h.out, &c, 1), 0, "stdout still open after the exit");
  host_kill(&h);
}

/* kill -9 of the client leaves no orphan: the host sets PR_SET_PDEATHSIG (host/main.c). The test is a
 * subreaper so that the orphaned host is reparented to it and can be reaped; it keeps the host's stdin open
 * itself, so the host ends because its parent died, not because of an EOF. */
Test(sdk, parent_killed_no_orphan, .timeout = 60) {
  sdk_host h;
  ts_stdio_prepare(&h);
  (void)ts_agenthost();
  cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int in[2], out[2], report[2];
  cr_assert_eq(pipe(in), 0);
  cr_assert_eq(pipe(out), 0);
  cr_assert_eq(pipe(report), 0);
  pid_t parent = fork();
  cr_assert(parent >= 0);
  if (parent == 0) {
    pid_t host = fork();
    if (host == 0)
      ts_stdio_exec(&h, in[0], out[1], "sdk", NULL);
    if (write(report[1], &host, sizeof host) != sizeof host)
      _exit(1);
    for (;;)
      pause();
  }
  close(in[0]);
  close(out[1]);
  close(report[1]);
  pid_t host = -1;
  cr_assert_eq(read(report[0], &host, sizeof host), (ssize_t)sizeof host);
  close(report[0]);
  h.pid = host;
  h.in = in[1];
  h.out = out[0];
  initialize(&h, false); /* the host is up and serving */
  cr_assert_eq(kill(parent, SIGKILL), 0);
  waitpid(parent, NULL, 0);
  int status = 0;
  uint64_t t0 = ts_now_ms();
  bool gone = ts_wait_exit(host, 2000, &status);
  if (!gone) {
    /* Not reparented to us (no subreaper support): probe the pid instead. */
    while (ts_now_ms() - t0 < 2000 && kill(host, 0) == 0)
      usleep(10000);
    gone = kill(host, 0) != 0;
  }
  printf("sdk orphan host gone after %llu ms\n", (unsigned long long)(ts_now_ms() - t0));
  fflush(stdout);
  cr_assert(gone, "the host outlived its parent");
  h.pid = -1;
  host_kill(&h);
}

/* DECISIONS.md "Process, files, command line": `serve` does not mount the sdk surface by default. */
Test(sdk, serve_does_not_mount_sdk, .timeout = 60) {
  char *dir = ts_mkdtemp();
  char *cfg_path = ts_write_file(dir, "empty.ini", "");
  ah_cli_overrides cli = {.config_file = cfg_path, .state_dir = dir};
  ah_config cfg;
  memset(&cfg, 0, sizeof cfg);
  char *err = NULL;
  char *const env[] = {NULL};
  cr_assert_eq(ah__config_load(&cfg, &cli, env, &err), 0, "%s", err ? err : "");
  json_t *names = ah__config_plugins_for_mode(&cfg, "serve");
  size_t i;
  json_t *n;
  json_array_foreach(names, i, n) cr_assert_str_neq(json_string_value(n), "sdk");
  json_decref(names);
  ah__config_free(&cfg);
  free(cfg_path);
  ts_rmtree(dir);
  free(dir);
}

/* A stdio child opens the store at its first session call (it answers initialize without it): a store
 * that cannot be opened then fails that call with a clear error, leaves the file alone, and the host keeps
 * answering. */
Test(sdk, a_broken_store_fails_session_calls_not_the_handshake, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  char *db = NULL;
  cr_assert(asprintf(&db, "%s/agenthost.db", h.dir) > 0);
  const char garbage[] = "this is not a database\n";
  FILE *f = fopen(db, "w");
  cr_assert_not_null(f);
  fputs(garbage, f);
  fclose(f);
  json_t *r = call(&h, 2, "session/prompt", json_pack("{s:s}", "text", "x"));
  json_t *err = json_object_get(r, "error");
  cr_assert_not_null(err, "the prompt must fail");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(err, "data"), "name")), "EIO");
  cr_assert(strstr(json_string_value(json_object_get(err, "message")), "store"));
  json_decref(r);
  size_t len = 0;
  char *after = ts_read_file(db, &len);
  cr_assert_not_null(after);
  cr_assert_eq(len, sizeof garbage - 1);
  cr_assert_eq(memcmp(after, garbage, len), 0, "the file was rewritten");
  free(after);
  r = call(&h, 3, "no/such-method", json_object());
  cr_assert_eq(ts_rpc_error_code(r), -32601, "the host keeps answering");
  json_decref(r);
  free(db);
  host_kill(&h);
}

/* SDK-SERVER-SESSIONS, SDK-SERVER-SHUTDOWN: a shutdown that arrives while requests are in flight stops
 * admission at once, lets the accepted requests be answered (the prompt gets its durable receipt), then
 * answers `{}` and exits 0. */
Test(sdk, shutdown_answers_the_requests_in_flight_first, .timeout = 60) {
  sdk_host h;
  host_start(&h);
  initialize(&h, false);
  /* One write: the prompt (lazy session creation, then the durable receipt) is in flight when shutdown is
   * read. */
  const char both[] =
      "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"session/prompt\",\"params\":{\"text\":\"last\"}}\n"
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"shutdown\"}\n";
  ts_stdio_send_raw(&h, both, sizeof both - 1);
  json_t *a = next_response(&h, 10000);
  json_t *b = next_response(&h, 10000);
  cr_assert(a && b, "both requests must be answered");
  cr_assert_eq(json_integer_value(json_object_get(a, "id")), 2, "the prompt is answered first");
  cr_assert(json_is_string(json_object_get(json_object_get(a, "result"), "messageId")),
            "the prompt got its receipt");
  cr_assert_eq(json_integer_value(json_object_get(b, "id")), 3);
  cr_assert(json_is_object(json_object_get(b, "result")));
  json_decref(a);
  json_decref(b);
  int status = 0;
  cr_assert(ts_wait_exit(h.pid, 10000, &status), "the host did not exit");
  h.pid = -1;
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
  host_kill(&h);
}

/* ---- stopping while stdout is not read (reliability: heap corruption on an ordinary shutdown path) ---- */
/* SDK-SERVER-SHUTDOWN (teardown always closes the transport, exit 0) and SDK-JSONL-TRANSPORT. */

/* initialize (read), then `n` prompts whose receipts and events are never read, then 2 s for the output to
 * back up behind the full pipe. */
static void flood_unread(sdk_host *h, int n) {
  host_start(h);
  initialize(h, false);
  for (int i = 0; i < n; i++)
    send_request(h, 100 + i, "session/prompt", json_pack("{s:s}", "text", "hello"));
  usleep(2000 * 1000);
}

static void expect_clean_stop(const char *how) {
  sdk_host h;
  flood_unread(&h, 200);
  int status = ts_stdio_stop_unread(&h, how, 20000);
  cr_assert_neq(status, -1, "%s: the host did not exit within 20 s", how);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: exit status %d (signal %d)", how,
            WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  ts_stdio_check_log(&h);
  host_kill(&h);
}

Test(sdk, stdin_eof_with_stdout_unread_exits_zero, .timeout = 60) {
  expect_clean_stop("eof");
}

Test(sdk, sigterm_with_stdout_unread_exits_zero, .timeout = 60) {
  expect_clean_stop("SIGTERM");
}

Test(sdk, sigint_with_stdout_unread_exits_zero, .timeout = 60) {
  expect_clean_stop("SIGINT");
}

/* `shutdown` sent behind unread output is answered once the client reads, and the host exits 0. */
Test(sdk, shutdown_behind_unread_stdout_is_answered, .timeout = 60) {
  sdk_host h;
  flood_unread(&h, 200);
  send_request(&h, 9999, "shutdown", NULL);
  bool answered = false;
  uint64_t end = ts_now_ms() + 20000;
  json_t *m;
  while (!answered && ts_now_ms() < end && (m = ts_stdio_next_msg(&h, 2000)) != NULL) {
    answered =
        json_integer_value(json_object_get(m, "id")) == 9999 && json_is_object(json_object_get(m, "result"));
    json_decref(m);
  }
  cr_expect(answered, "shutdown was not answered within 20 s");
  int status = 0;
  cr_assert(ts_wait_exit(h.pid, 20000, &status), "the host did not exit after shutdown");
  h.pid = -1;
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
  ts_stdio_check_log(&h);
  host_kill(&h);
}

/* `shutdown` whose answer is never read still ends the process, in a bounded time, with status 0. */
Test(sdk, shutdown_never_read_exits_zero, .timeout = 60) {
  sdk_host h;
  flood_unread(&h, 200);
  send_request(&h, 9999, "shutdown", NULL);
  int status = 0;
  bool exited = ts_wait_exit(h.pid, 20000, &status);
  if (!exited)
    kill(h.pid, SIGKILL);
  else
    h.pid = -1;
  cr_assert(exited, "the host did not exit within 20 s of shutdown");
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
  ts_stdio_check_log(&h);
  host_kill(&h);
}
