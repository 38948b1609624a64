/* Raw-stdio tests of the ACP agent side: the real `agenthost acp` ($AH_TEST_AGENTHOST) driven over pipes
 * with hand-written JSON Lines (PROTOCOLS.md "ACP": ACP-SDK-*, ACP-HANDSHAKE, ACP-OUTPUT-PERMISSION,
 * ACP-PROMPT-CANCEL, ACP-CODEC, ACP-QUIESCE). The editor-side tests with the official SDK live in
 * tests/integration/acp; these pin what an SDK never sends: malformed lines, wrong types, huge input.
 *
 * Every line the host writes on stdout is parsed and must be a JSON-RPC 2.0 message (stdout carries ACP
 * only). Every child is started with PR_SET_PDEATHSIG(SIGKILL), and every test kills and reaps it.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"

typedef ts_stdio acp_host;

/* ACP-SDK-*: each line must be one JSON-RPC 2.0 message (a request, a notification or a response), and
 * stdout may not end in the middle of a line. */
static void check_jsonrpc(const acp_host *h, const json_t *msg) {
  if (!msg) {
    if (h->eof)
      cr_assert_eq(h->len, 0, "stdout ended in the middle of a line");
    return;
  }
  cr_assert(json_is_object(msg), "stdout carried a non-object");
  cr_assert_str_eq(json_string_value(json_object_get(msg, "jsonrpc")), "2.0", "a line without jsonrpc 2.0");
  bool has_method = json_is_string(json_object_get(msg, "method"));
  bool has_id = json_object_get(msg, "id") != NULL;
  bool response = json_object_get(msg, "result") || json_object_get(msg, "error");
  cr_assert(has_method || (has_id && response), "a line that is no JSON-RPC message");
}

static void host_spawn(acp_host *h, const char *env) {
  ts_stdio_spawn(h, "acp", env);
}

static void host_start_env(acp_host *h, const char *env) {
  ts_stdio_prepare(h);
  h->json_flags = JSON_REJECT_DUPLICATES;
  h->check = check_jsonrpc;
  host_spawn(h, env);
}

static void host_start(acp_host *h) {
  host_start_env(h, NULL);
}

/* End a test: stdin EOF must stop the agent with exit status 0 (ACP-QUIESCE; under ASan a leak would make
 * it non-zero), then the directory is removed. */
static void host_kill(acp_host *h) {
  if (h->pid > 0) {
    ts_stdio_close_stdin(h);
    int status = 0;
    bool exited = ts_wait_exit(h->pid, 15000, &status);
    if (exited)
      h->pid = -1;
    cr_expect(exited, "the agent did not exit on stdin EOF");
    cr_expect(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %d", status);
  }
  if (h->log)
    ts_stdio_check_log(h);
  ts_stdio_free(h);
}

/* `params` is stolen (NULL = none). */
static void send_msg(acp_host *h, json_t *id, const char *method, json_t *params) {
  json_t *msg = json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", method);
  if (id)
    json_object_set_new(msg, "id", id);
  if (params)
    json_object_set_new(msg, "params", params);
  ts_stdio_send_json(h, msg);
  json_decref(msg);
}

static void send_request(acp_host *h, int id, const char *method, json_t *params) {
  send_msg(h, json_integer(id), method, params);
}

/* Collects the session/update notifications seen while waiting (may be NULL). */
typedef struct seen {
  json_t *updates; /* array of the `update` objects, but available_commands_update */
  int commands;    /* available_commands_update seen (one after each session/new, load and resume) */
} seen;

typedef struct other_msgs {
  seen *s;
  void (*on_request)(acp_host *h, json_t *req, void *arg);
  void *arg;
} other_msgs;

static void on_other(acp_host *h, json_t *m, void *arg) {
  other_msgs *o = arg;
  if (o->s && ts_rpc_method(m) && strcmp(ts_rpc_method(m), "session/update") == 0) {
    json_t *u = json_object_get(json_object_get(m, "params"), "update");
    const char *kind = json_string_value(json_object_get(u, "sessionUpdate"));
    if (kind && strcmp(kind, "available_commands_update") == 0)
      o->s->commands++;
    else
      json_array_append(o->s->updates, u);
  }
  if (o->on_request && json_object_get(m, "id"))
    o->on_request(h, m, o->arg);
}

/* The next response (notifications recorded in `s`, server requests answered by `on_request` or ignored),
 * NULL on timeout. */
static json_t *next_response_ex(acp_host *h, uint64_t timeout_ms, seen *s,
                                void (*on_request)(acp_host *h, json_t *req, void *arg), void *arg) {
  other_msgs o = {.s = s, .on_request = on_request, .arg = arg};
  return ts_stdio_next_response(h, timeout_ms, on_other, &o);
}

static json_t *next_response(acp_host *h, uint64_t timeout_ms) {
  return ts_stdio_next_response(h, timeout_ms, NULL, NULL);
}

/* Send a request and wait for its response. */
static json_t *call(acp_host *h, int id, const char *method, json_t *params) {
  send_request(h, id, method, params);
  return ts_stdio_answer(h, id, method);
}

static const char *error_message(const json_t *r) {
  return json_string_value(json_object_get(json_object_get(r, "error"), "message"));
}

static json_t *result_of(const json_t *r) {
  return json_object_get(r, "result");
}

static const char *stop_reason(const json_t *r) {
  return json_string_value(json_object_get(result_of(r), "stopReason"));
}

/* A request whose answer must be the JSON-RPC error `code`. */
static void expect_error(acp_host *h, int id, const char *method, json_t *params, int code) {
  json_t *r = call(h, id, method, params);
  cr_assert_eq(ts_rpc_error_code(r), code);
  json_decref(r);
}

/* After stdin EOF: the agent exits 0. */
static void expect_exit_zero(acp_host *h) {
  int status = 0;
  cr_assert(ts_wait_exit(h->pid, 10000, &status), "the agent did not exit on EOF");
  h->pid = -1;
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %d", status);
}

static void initialize(acp_host *h) {
  json_t *r = call(h, 1, "initialize",
                   json_pack("{s:i, s:{s:{s:b, s:b}, s:b}}", "protocolVersion", 1, "clientCapabilities", "fs",
                             "readTextFile", 0, "writeTextFile", 0, "terminal", 0));
  cr_assert(result_of(r), "initialize failed");
  json_decref(r);
}

/* session/new with the host's work dir; the session id is written to `sid`. */
static void new_session(acp_host *h, int id, char *sid, size_t n) {
  json_t *r = call(h, id, "session/new", json_pack("{s:s, s:[]}", "cwd", h->work, "mcpServers"));
  const char *v = json_string_value(json_object_get(result_of(r), "sessionId"));
  cr_assert(v, "session/new failed: %s", error_message(r) ? error_message(r) : "?");
  snprintf(sid, n, "%s", v);
  json_decref(r);
}

/* A fresh host, initialized, with one session (id written to `sid`). */
static void start_session(acp_host *h, char *sid, size_t n) {
  host_start(h);
  initialize(h);
  new_session(h, 2, sid, n);
}

/* Stop the host on stdin EOF and start it again on the same state, initialized. */
static void restart(acp_host *h) {
  ts_stdio_close_stdin(h);
  cr_assert(ts_wait_exit(h->pid, 10000, NULL));
  h->pid = -1;
  ts_stdio_end(h);
  host_spawn(h, NULL);
  initialize(h);
}

static json_t *text_prompt(const char *sid, const char *text) {
  return json_pack("{s:s, s:[{s:s, s:s}]}", "sessionId", sid, "prompt", "type", "text", "text", text);
}

/* A prompt whose turn must end with `reason`. */
static void expect_prompt_stop(acp_host *h, int id, const char *sid, const char *text, const char *reason) {
  json_t *r = call(h, id, "session/prompt", text_prompt(sid, text));
  cr_assert_str_eq(stop_reason(r), reason);
  json_decref(r);
}

/* The answers to the prompts `first`…`last`, in order, each ending with `reason`. */
static void expect_answers(acp_host *h, int first, int last, const char *reason) {
  for (int id = first; id <= last; id++) {
    json_t *r = next_response(h, 10000);
    cr_assert(r);
    cr_assert_eq(json_integer_value(json_object_get(r, "id")), id, "answers out of order");
    cr_assert_str_eq(stop_reason(r), reason);
    json_decref(r);
  }
}

/* The answer to the pending prompt (updates recorded in `s`, requests answered by `on_request`): `reason`. */
static void expect_turn_end(acp_host *h, seen *s, void (*on_request)(acp_host *h, json_t *req, void *arg),
                            void *arg, const char *reason) {
  json_t *r = next_response_ex(h, 10000, s, on_request, arg);
  cr_assert(r);
  cr_assert_str_eq(stop_reason(r), reason);
  json_decref(r);
}

/* ---- ACP-HANDSHAKE ------------------------------------------------------------------------------------ */

/* ACP-HANDSHAKE: protocolVersion 1 whatever was asked (1, 99, 0); capabilities only for what works;
 * authMethods empty; agentInfo with name, title and version. */
Test(acp_handshake, initialize_fields, .timeout = 60) {
  acp_host h;
  host_start(&h);
  const int asked[] = {1, 99, 0};
  for (int i = 0; i < 3; i++) {
    json_t *r = call(&h, 10 + i, "initialize", json_pack("{s:i}", "protocolVersion", asked[i]));
    json_t *res = result_of(r);
    cr_assert(res, "initialize failed for version %d", asked[i]);
    cr_assert(json_is_integer(json_object_get(res, "protocolVersion")));
    cr_assert_eq(json_integer_value(json_object_get(res, "protocolVersion")), 1);
    json_t *caps = json_object_get(res, "agentCapabilities");
    cr_assert(json_is_true(json_object_get(caps, "loadSession")));
    json_t *pc = json_object_get(caps, "promptCapabilities");
    cr_assert(json_is_false(json_object_get(pc, "image")));
    cr_assert(json_is_false(json_object_get(pc, "audio")));
    cr_assert(json_is_false(json_object_get(pc, "embeddedContext")));
    json_t *sc = json_object_get(caps, "sessionCapabilities");
    cr_assert(json_is_object(json_object_get(sc, "list")));
    cr_assert(json_is_object(json_object_get(sc, "resume")));
    cr_assert(json_is_object(json_object_get(sc, "close")));
    cr_assert_null(json_object_get(sc, "additionalDirectories"), "additionalDirectories is not implemented");
    json_t *am = json_object_get(res, "authMethods");
    cr_assert(json_is_array(am) && json_array_size(am) == 0);
    json_t *info = json_object_get(res, "agentInfo");
    cr_assert_str_eq(json_string_value(json_object_get(info, "name")), "agenthost");
    cr_assert(json_is_string(json_object_get(info, "title")));
    cr_assert(json_string_length(json_object_get(info, "version")) > 0);
    json_decref(r);
  }
  json_t *r = call(&h, 20, "authenticate", json_pack("{s:s}", "methodId", "none"));
  cr_assert(json_is_object(result_of(r)) && json_object_size(result_of(r)) == 0, "authenticate → {}");
  json_decref(r);
  host_kill(&h);
}

/* ACP-HANDSHAKE: session/new needs an absolute cwd (-32602 otherwise); additionalDirectories and MCP
 * servers are refused with -32602 naming the limitation; an absolute cwd gives a sessionId. */
Test(acp_handshake, session_new_checks, .timeout = 60) {
  acp_host h;
  host_start(&h);
  initialize(&h);
  json_t *r = call(&h, 2, "session/new", json_pack("{s:s, s:[]}", "cwd", "relative/dir", "mcpServers"));
  cr_assert_eq(ts_rpc_error_code(r), -32602);
  cr_assert(strstr(error_message(r), "cwd"), "the message names the field: %s", error_message(r));
  json_decref(r);
  expect_error(&h, 3, "session/new", json_pack("{s:[]}", "mcpServers"), -32602);
  expect_error(&h, 4, "session/new", json_pack("{s:i, s:[]}", "cwd", 7, "mcpServers"), -32602);
  r = call(&h, 5, "session/new",
           json_pack("{s:s, s:[], s:[s]}", "cwd", h.work, "mcpServers", "additionalDirectories", "/tmp"));
  cr_assert_eq(ts_rpc_error_code(r), -32602);
  cr_assert(strstr(error_message(r), "additionalDirectories"));
  json_decref(r);
  /* An MCP server is accepted (it starts at the first turn); one without a name is not a server. */
  r = call(&h, 6, "session/new",
           json_pack("{s:s, s:[{s:s, s:s, s:[], s:[]}]}", "cwd", h.work, "mcpServers", "name", "fs",
                     "command", "/bin/true", "args", "env"));
  cr_assert(json_is_string(json_object_get(json_object_get(r, "result"), "sessionId")), "accepted");
  json_decref(r);
  r = call(&h, 9, "session/new", json_pack("{s:s, s:[{s:s}]}", "cwd", h.work, "mcpServers", "command", "x"));
  cr_assert_eq(ts_rpc_error_code(r), -32602);
  cr_assert(strstr(error_message(r), "name"), "the message names the field: %s", error_message(r));
  json_decref(r);
  expect_error(&h, 7, "session/new", json_pack("{s:s, s:s}", "cwd", h.work, "mcpServers", "none"), -32602);
  char sid[64];
  new_session(&h, 8, sid, sizeof sid);
  cr_assert(strlen(sid) > 0);
  host_kill(&h);
}

/* ---- ACP-SDK-*: the transport -------------------------------------------------------------------------- */

/* ACP-SDK-*: malformed lines get JSON-RPC errors with id null (invalid JSON -32700, a non-object or an object
 * that is no request -32600, invalid UTF-8 -32700, a number too big for any integer -32700, deep nesting),
 * wrong param types -32602, and the agent keeps answering after each. */
Test(acp_sdk, malformed_lines, .timeout = 60) {
  acp_host h;
  host_start(&h);
  struct {
    const char *line;
    int code;
  } cases[] = {
      {"{not json", -32700},
      {"[1,2,3]", -32600},
      {"42", -32600},
      {"\"just a string\"", -32600},
      {"{\"jsonrpc\":\"2.0\"}", -32600},
      {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\",\"method\":\"y\"}", -32700},
      {"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
       "99999999999999999999999999999}}",
       -32700},
      {"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1e400}}",
       -32700},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ts_stdio_send_line(&h, cases[i].line);
    json_t *r = next_response(&h, 10000);
    cr_assert(r, "no answer to line %zu", i);
    cr_assert_eq(ts_rpc_error_code(r), cases[i].code, "line %zu: code %d, not %d", i, ts_rpc_error_code(r),
                 cases[i].code);
    cr_assert(json_is_null(json_object_get(r, "id")), "line %zu: the id is null", i);
    json_decref(r);
  }
  /* Invalid UTF-8 inside a string. */
  const char bad_utf8[] =
      "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"initialize\",\"params\":{\"x\":\"\xff\xfe\"}}\n";
  ts_stdio_send_raw(&h, bad_utf8, sizeof bad_utf8 - 1);
  json_t *r = next_response(&h, 10000);
  cr_assert(r);
  cr_assert_eq(ts_rpc_error_code(r), -32700);
  json_decref(r);
  /* A NUL byte inside the line. */
  const char nul_line[] = "{\"jsonrpc\":\"2.0\",\"id\":7,\0\"method\":\"x\"}\n";
  ts_stdio_send_raw(&h, nul_line, sizeof nul_line - 1);
  r = next_response(&h, 10000);
  cr_assert(r);
  cr_assert_eq(ts_rpc_error_code(r), -32700);
  json_decref(r);
  /* 100000 nested arrays: refused, not a crash. */
  size_t depth = 100000;
  char *deep = malloc(depth * 2 + 2);
  cr_assert(deep);
  memset(deep, '[', depth);
  memset(deep + depth, ']', depth);
  deep[depth * 2] = '\n';
  ts_stdio_send_raw(&h, deep, depth * 2 + 1);
  free(deep);
  r = next_response(&h, 10000);
  cr_assert(r, "no answer to a deeply nested line");
  cr_assert(ts_rpc_error_code(r) == -32700 || ts_rpc_error_code(r) == -32600, "deep nesting: %d",
            ts_rpc_error_code(r));
  json_decref(r);
  /* Wrong param types: -32602 naming the field. */
  r = call(&h, 8, "initialize", json_pack("{s:s}", "protocolVersion", "1"));
  cr_assert_eq(ts_rpc_error_code(r), -32602);
  cr_assert(strstr(error_message(r), "protocolVersion"));
  json_decref(r);
  expect_error(&h, 9, "initialize", json_pack("[i]", 1), -32602);
  r = call(&h, 10, "session/prompt", json_pack("{s:i, s:[]}", "sessionId", 5, "prompt"));
  cr_assert_eq(ts_rpc_error_code(r), -32602);
  cr_assert(strstr(error_message(r), "sessionId"));
  json_decref(r);
  r = call(&h, 11, "session/prompt", json_pack("{s:s, s:s}", "sessionId", "x", "prompt", "text"));
  cr_assert_eq(ts_rpc_error_code(r), -32602);
  cr_assert(strstr(error_message(r), "prompt"));
  json_decref(r);
  expect_error(&h, 12, "session/load",
               json_pack("{s:b, s:s, s:[]}", "sessionId", 1, "cwd", h.work, "mcpServers"), -32602);
  expect_error(&h, 13, "session/list", json_pack("{s:i}", "cursor", 3), -32602);
  /* Numbers: a fraction or a big integer where an integer version is expected. */
  expect_error(&h, 14, "initialize", json_pack("{s:f}", "protocolVersion", 1.5), -32602);
  r = call(&h, 15, "initialize", json_pack("{s:I}", "protocolVersion", (json_int_t)INT64_MAX));
  cr_assert_eq(json_integer_value(json_object_get(result_of(r), "protocolVersion")), 1);
  json_decref(r);
  /* A string id is echoed as it is, and the agent still answers. */
  send_msg(&h, json_string("str-id"), "initialize", json_pack("{s:i}", "protocolVersion", 1));
  r = next_response(&h, 10000);
  cr_assert(r);
  cr_assert_str_eq(json_string_value(json_object_get(r, "id")), "str-id");
  cr_assert(result_of(r));
  json_decref(r);
  host_kill(&h);
}

/* ACP-SDK-*: a line over the configured cap is discarded as it streams and answered -32600 "line too
 * long"; the next line is served. */
Test(acp_sdk, over_long_line, .timeout = 60) {
  acp_host h;
  host_start_env(&h, "AGENTHOST_PLUGIN_ACP_MAX_LINE=4096");
  size_t n = 1024 * 1024;
  char *big = malloc(n + 1);
  cr_assert(big);
  memset(big, ' ', n);
  memcpy(big, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"x\":\"", 62);
  big[n - 1] = '"';
  big[n] = '\n';
  ts_stdio_send_raw(&h, big, n + 1);
  free(big);
  json_t *r = next_response(&h, 10000);
  cr_assert(r, "no answer to an over-long line");
  cr_assert_eq(ts_rpc_error_code(r), -32600);
  cr_assert(json_is_null(json_object_get(r, "id")));
  json_decref(r);
  initialize(&h);
  host_kill(&h);
}

/* ACP-SDK-*: a last line without its newline is still served before the EOF; a truncated line at EOF is
 * answered -32700; then the agent exits 0. */
Test(acp_sdk, truncated_line_at_eof, .timeout = 60) {
  acp_host h;
  host_start(&h);
  const char *partial =
      "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}";
  ts_stdio_send_raw(&h, partial, strlen(partial));
  ts_stdio_close_stdin(&h);
  json_t *r = next_response(&h, 10000);
  cr_assert(r, "the last line without a newline was not served");
  cr_assert_eq(json_integer_value(json_object_get(r, "id")), 3);
  cr_assert(result_of(r));
  json_decref(r);
  expect_exit_zero(&h);
  host_kill(&h);

  host_start(&h);
  const char *cut = "{\"jsonrpc\":\"2.0\",\"id\":4,\"meth";
  ts_stdio_send_raw(&h, cut, strlen(cut));
  ts_stdio_close_stdin(&h);
  r = next_response(&h, 10000);
  cr_assert(r, "a truncated line at EOF was not answered");
  cr_assert_eq(ts_rpc_error_code(r), -32700);
  json_decref(r);
  expect_exit_zero(&h);
  host_kill(&h);
}

/* ACP-SDK-*: an unknown method is -32601 (also unadvertised ones such as session/set_mode); an unknown
 * notification and a response with an unknown id are ignored; the agent keeps answering. */
Test(acp_sdk, unknown_method, .timeout = 60) {
  acp_host h;
  host_start(&h);
  initialize(&h);
  json_t *r = call(&h, 2, "no/such", NULL);
  cr_assert_eq(ts_rpc_error_code(r), -32601);
  json_decref(r);
  expect_error(&h, 3, "logout", json_object(), -32601);
  send_msg(&h, NULL, "no/such/notification", json_object());
  ts_stdio_send_line(&h, "{\"jsonrpc\":\"2.0\",\"id\":777,\"result\":{}}");
  initialize(&h);
  host_kill(&h);
}

/* ---- sessions ------------------------------------------------------------------------------------------ */

/* -32002 for a session this connection does not know, in every method that names one; session/cancel of
 * an unknown id is ignored (ACP-PROMPT-CANCEL); session/delete of one succeeds silently (schema). */
Test(acp_sessions, unknown_session, .timeout = 60) {
  acp_host h;
  host_start(&h);
  initialize(&h);
  const char *ghost = "01234567-0000-7000-8000-000000000000";
  json_t *r = call(&h, 2, "session/prompt", text_prompt(ghost, "hi"));
  cr_assert_eq(ts_rpc_error_code(r), -32002);
  json_decref(r);
  expect_error(&h, 3, "session/load",
               json_pack("{s:s, s:s, s:[]}", "sessionId", ghost, "cwd", h.work, "mcpServers"), -32002);
  expect_error(&h, 4, "session/resume", json_pack("{s:s, s:s}", "sessionId", ghost, "cwd", h.work), -32002);
  expect_error(&h, 5, "session/close", json_pack("{s:s}", "sessionId", ghost), -32002);
  send_msg(&h, NULL, "session/cancel", json_pack("{s:s}", "sessionId", ghost));
  r = call(&h, 6, "session/delete", json_pack("{s:s}", "sessionId", ghost));
  cr_assert(result_of(r), "deleting an unknown session succeeds silently");
  json_decref(r);
  initialize(&h);
  host_kill(&h);
}

/* ACP-OUTPUT-PERMISSION, ACP-CODEC: the committed text arrives as agent_message_chunk (with a messageId)
 * before the prompt's answer end_turn; a resource_link is rendered [name](uri); richer blocks are -32602. */
Test(acp_prompt, chunks_before_result, .timeout = 60) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  send_request(&h, 3, "session/prompt",
               json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s, s:s}]}", "sessionId", sid, "prompt", "type", "text",
                         "text", "hello ", "type", "resource_link", "uri", "file:///a.txt", "name", "a.txt"));
  seen s = {.updates = json_array()};
  expect_turn_end(&h, &s, NULL, NULL, "end_turn");
  /* The first prompt named the session (its first line of text): the editor's history list is told. */
  cr_assert_eq(json_array_size(s.updates), 2);
  json_t *info = json_array_get(s.updates, 0);
  cr_assert_str_eq(json_string_value(json_object_get(info, "sessionUpdate")), "session_info_update");
  cr_expect_str_eq(json_string_value(json_object_get(info, "title")), "hello");
  cr_expect(json_is_string(json_object_get(info, "updatedAt")));
  json_t *u = json_array_get(s.updates, 1);
  cr_assert_str_eq(json_string_value(json_object_get(u, "sessionUpdate")), "agent_message_chunk");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(u, "content"), "text")),
                   "echo: hello [a.txt](file:///a.txt)");
  cr_assert(json_is_string(json_object_get(u, "messageId")));
  json_decref(s.updates);
  const char *types[] = {"image", "audio", "resource", "video"};
  for (int i = 0; i < 4; i++) {
    json_t *r = call(&h, 10 + i, "session/prompt",
                     json_pack("{s:s, s:[{s:s, s:s, s:s}]}", "sessionId", sid, "prompt", "type", types[i],
                               "data", "AAAA", "mimeType", "image/png"));
    cr_assert_eq(ts_rpc_error_code(r), -32602, "%s content is refused", types[i]);
    json_decref(r);
  }
  expect_error(&h, 20, "session/prompt", json_pack("{s:s, s:[]}", "sessionId", sid, "prompt"), -32602);
  host_kill(&h);
}

/* ACP-CODEC: turn-end reasons map to stop reasons (max_tokens kept for the prompt's own turn, refusal);
 * a failed turn is a JSON-RPC error, never a fake stop reason. */
Test(acp_prompt, stop_reasons, .timeout = 60) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  expect_prompt_stop(&h, 3, sid, "/max-tokens\nlong", "max_tokens");
  expect_prompt_stop(&h, 4, sid, "/refuse", "refusal");
  json_t *r = call(&h, 5, "session/prompt", text_prompt(sid, "/fail boom"));
  cr_assert_null(result_of(r));
  cr_assert_str_eq(error_message(r), "boom");
  json_decref(r);
  host_kill(&h);
}

/* ACP-PROMPT-CANCEL: a second prompt is queued behind the first and the answers come in order; cancel
 * during /sleep answers every pending prompt `cancelled` exactly once, in order. */
Test(acp_prompt, queue_and_cancel, .timeout = 60) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  send_request(&h, 3, "session/prompt", text_prompt(sid, "/sleep 200\nfirst"));
  send_request(&h, 4, "session/prompt", text_prompt(sid, "second"));
  expect_answers(&h, 3, 4, "end_turn");
  send_request(&h, 5, "session/prompt", text_prompt(sid, "/sleep 5000\nslow"));
  send_request(&h, 6, "session/prompt", text_prompt(sid, "queued"));
  usleep(300 * 1000);
  uint64_t t0 = ts_now_ms();
  send_msg(&h, NULL, "session/cancel", json_pack("{s:s}", "sessionId", sid));
  expect_answers(&h, 5, 6, "cancelled");
  cr_assert(ts_now_ms() - t0 < 2000, "the cancel took %llu ms", (unsigned long long)(ts_now_ms() - t0));
  /* Exactly once: nothing else answers 5 or 6; the session takes the next prompt. */
  expect_prompt_stop(&h, 7, sid, "after", "end_turn");
  host_kill(&h);
}

typedef struct perm_answer {
  const char *option; /* NULL: answer `cancelled` */
  int asked;
  bool cancel_first;
  const char *sid;
} perm_answer;

static void answer_permission(acp_host *h, json_t *req, void *arg) {
  perm_answer *pa = arg;
  cr_assert_str_eq(ts_rpc_method(req), "session/request_permission");
  json_t *p = json_object_get(req, "params");
  cr_assert_str_eq(json_string_value(json_object_get(p, "sessionId")), pa->sid);
  json_t *tc = json_object_get(p, "toolCall");
  cr_assert(json_is_string(json_object_get(tc, "toolCallId")));
  cr_assert_str_eq(json_string_value(json_object_get(tc, "kind")), "execute");
  json_t *opts = json_object_get(p, "options");
  cr_assert_eq(json_array_size(opts), 4);
  const char *kinds[] = {"allow_once", "allow_always", "reject_once", "reject_always"};
  for (size_t i = 0; i < 4; i++)
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(opts, i), "kind")), kinds[i]);
  pa->asked++;
  if (pa->cancel_first)
    send_msg(h, NULL, "session/cancel", json_pack("{s:s}", "sessionId", pa->sid));
  json_t *outcome = pa->option ? json_pack("{s:s, s:s}", "outcome", "selected", "optionId", pa->option)
                               : json_pack("{s:s}", "outcome", "cancelled");
  json_t *msg = json_pack("{s:s, s:O, s:{s:o}}", "jsonrpc", "2.0", "id", json_object_get(req, "id"), "result",
                          "outcome", outcome);
  ts_stdio_send_json(h, msg);
  json_decref(msg);
}

/* The last tool_call_update status among `updates`. */
static const char *last_tool_status(const json_t *updates) {
  const char *st = NULL;
  size_t i = 0;
  json_t *u = NULL;
  json_array_foreach(updates, i, u) {
    const char *k = json_string_value(json_object_get(u, "sessionUpdate"));
    if (k && (strcmp(k, "tool_call") == 0 || strcmp(k, "tool_call_update") == 0) &&
        json_object_get(u, "status"))
      st = json_string_value(json_object_get(u, "status"));
  }
  return st;
}

/* ACP-OUTPUT-PERMISSION: allow_once runs the tool (tool_call … completed); an unknown option id and a
 * `cancelled` outcome deny (failed, nothing ran); cancel while the permission is pending → the prompt
 * answers `cancelled` and nothing ran. */
Test(acp_prompt, permissions, .timeout = 60) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  struct {
    const char *option;
    bool cancel_first;
    const char *file;
    const char *status;
    const char *stop;
  } cases[] = {
      {"allow_once", false, "a", "completed", "end_turn"},
      {"no-such-option", false, "b", "failed", "end_turn"},
      {NULL, false, "c", "failed", "end_turn"},
      {NULL, true, "d", "failed", "cancelled"},
  };
  for (int i = 0; i < 4; i++) {
    char text[256];
    snprintf(text, sizeof text, "/tool run_command {\"command\":\"touch %s\"}", cases[i].file);
    send_request(&h, 10 + i, "session/prompt", text_prompt(sid, text));
    perm_answer pa = {.option = cases[i].option, .cancel_first = cases[i].cancel_first, .sid = sid};
    seen s = {.updates = json_array()};
    json_t *r = next_response_ex(&h, 10000, &s, answer_permission, &pa);
    cr_assert(r);
    cr_assert_eq(pa.asked, 1, "case %d: one permission request", i);
    cr_assert_str_eq(stop_reason(r), cases[i].stop, "case %d", i);
    json_decref(r);
    /* The tool's final status may follow the answer only if the turn ended before it: wait briefly. */
    json_t *more = NULL;
    while (!last_tool_status(s.updates) && (more = next_response_ex(&h, 300, &s, NULL, NULL)))
      json_decref(more);
    cr_assert_str_eq(last_tool_status(s.updates), cases[i].status, "case %d", i);
    json_decref(s.updates);
    char *path = NULL;
    cr_assert(asprintf(&path, "%s/%s", h.work, cases[i].file) > 0);
    bool ran = access(path, F_OK) == 0;
    free(path);
    cr_assert_eq(ran, strcmp(cases[i].status, "completed") == 0, "case %d: the command ran: %d", i, ran);
  }
  host_kill(&h);
}

/* ACP-OUTPUT-PERMISSION: a subagent's tool approval is asked in the name of the session the client knows
 * (nothing else could answer it and the parent's turn waits); the subagent appears as a `think` tool call.
 * A question (echo /ask) is shown and answered cancelled at once: the prompt answers `cancelled`. */
Test(acp_prompt, subagent_approval_and_question, .timeout = 60) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  send_request(&h, 3, "session/prompt",
               text_prompt(sid, "/subagent /tool run_command {\"command\":\"touch sub\"}"));
  perm_answer pa = {.option = "allow_once", .sid = sid};
  seen s = {.updates = json_array()};
  expect_turn_end(&h, &s, answer_permission, &pa, "end_turn");
  cr_assert_eq(pa.asked, 1);
  bool think = false;
  size_t i = 0;
  json_t *u = NULL;
  json_array_foreach(s.updates, i, u) {
    if (json_string_value(json_object_get(u, "kind")) &&
        strcmp(json_string_value(json_object_get(u, "kind")), "think") == 0)
      think = true;
  }
  cr_assert(think, "the subagent is shown as a think tool call");
  json_decref(s.updates);
  char *path = NULL;
  cr_assert(asprintf(&path, "%s/sub", h.work) > 0);
  cr_assert_eq(access(path, F_OK), 0, "the subagent's approved command ran");
  free(path);
  send_request(&h, 4, "session/prompt", text_prompt(sid, "/ask what now?"));
  s.updates = json_array();
  expect_turn_end(&h, &s, NULL, NULL, "cancelled");
  cr_assert_eq(json_array_size(s.updates), 1);
  cr_assert(strstr(
      json_string_value(json_object_get(json_object_get(json_array_get(s.updates, 0), "content"), "text")),
      "what now?"));
  json_decref(s.updates);
  host_kill(&h);
}

/* The lease of a session in the store (state_dir/agenthost.db, read-only): its owner, "" when released.
 * `parent` selects the session by its parent instead (a subagent). */
static void stored_lease(const acp_host *h, const char *id, bool by_parent, char *owner, size_t n) {
  char *db = NULL;
  cr_assert(asprintf(&db, "%s/agenthost.db", h->dir) > 0);
  sqlite3 *c = NULL;
  cr_assert_eq(sqlite3_open_v2(db, &c, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_busy_timeout(c, 2000);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(c,
                                  by_parent ? "SELECT lease_owner FROM sessions WHERE parent = ?1"
                                            : "SELECT lease_owner FROM sessions WHERE id = ?1",
                                  -1, &st, NULL),
               SQLITE_OK);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "no stored session %s %s", by_parent ? "under" : "", id);
  const unsigned char *o = sqlite3_column_text(st, 0);
  snprintf(owner, n, "%s", o ? (const char *)o : "");
  sqlite3_finalize(st);
  sqlite3_close(c);
  free(db);
}

/* An ACP connection follows its sessions (session.follow): with [host] idle_unload_s = 0.2 the session it
 * created keeps its lease (it stays in the host's memory), while a subagent session its turn started —
 * which the connection does not own — is unloaded once idle, its lease released. */
Test(acp_prompt, sessions_the_connection_has_are_never_unloaded_while_idle, .timeout = 60) {
  acp_host h;
  host_start_env(&h, "AGENTHOST_HOST_IDLE_UNLOAD_S=0.2");
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  send_request(&h, 3, "session/prompt", text_prompt(sid, "/subagent hello"));
  seen s = {.updates = json_array()};
  expect_turn_end(&h, &s, NULL, NULL, "end_turn");
  json_decref(s.updates);
  char owner[128], child[128];
  bool released = false;
  for (int i = 0; i < 300 && !released; i++) {
    stored_lease(&h, sid, true, child, sizeof child);
    released = child[0] == '\0';
    if (!released)
      usleep(10000);
  }
  cr_assert(released, "the idle subagent session was not unloaded (lease %s)", child);
  usleep(1000000); /* five idle times more */
  stored_lease(&h, sid, false, owner, sizeof owner);
  cr_assert_neq(owner[0], '\0', "the connection's session lost its lease: it was unloaded");
  /* Still the same live session: a prompt runs at once on it. */
  send_request(&h, 4, "session/prompt", text_prompt(sid, "again"));
  s.updates = json_array();
  expect_turn_end(&h, &s, NULL, NULL, "end_turn");
  json_decref(s.updates);
  char after[128];
  stored_lease(&h, sid, false, after, sizeof after);
  cr_assert_str_eq(after, owner);
  host_kill(&h);
}

/* ACP-OUTPUT-PERMISSION (beyond): with [plugin.acp] stream_deltas = true the deltas are sent as chunks and
 * the committed message is not repeated; a message committed without deltas (a tool's result) is sent
 * whole. The text the client assembles is each message exactly once. */
Test(acp_prompt, stream_deltas, .timeout = 60) {
  acp_host h;
  host_start_env(&h, "AGENTHOST_PLUGIN_ACP_STREAM_DELTAS=true");
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  send_request(&h, 3, "session/prompt",
               text_prompt(sid, "/chunks 4\n/tool list_dir {\"path\":\".\"}\nabcdefgh"));
  seen s = {.updates = json_array()};
  expect_turn_end(&h, &s, NULL, NULL, "end_turn");
  size_t chunks = 0, i = 0;
  json_t *u = NULL;
  char text[1024] = "";
  json_array_foreach(s.updates, i, u) {
    if (strcmp(json_string_value(json_object_get(u, "sessionUpdate")), "agent_message_chunk") != 0)
      continue;
    chunks++;
    strncat(text, json_string_value(json_object_get(json_object_get(u, "content"), "text")),
            sizeof text - strlen(text) - 1);
    strncat(text, "|", sizeof text - strlen(text) - 1);
  }
  cr_assert(chunks >= 5, "4 deltas and the tool's message, got %zu: %s", chunks, text);
  cr_assert_eq(strstr(text, "echo: abcdefgh") == NULL, true, "the streamed echo was repeated whole: %s",
               text);
  cr_assert(strstr(text, "tool list_dir: {\"entries\":[]}|"), "the tool's message: %s", text);
  /* The deltas, in order, make the echo. */
  char echo[256] = "";
  json_array_foreach(s.updates, i, u) {
    const char *t = json_string_value(json_object_get(json_object_get(u, "content"), "text"));
    if (t && strncmp(t, "tool ", 5) != 0)
      strncat(echo, t, sizeof echo - strlen(echo) - 1);
  }
  cr_assert_str_eq(echo, "echo: abcdefgh");
  json_decref(s.updates);
  host_kill(&h);
}

/* session/load replays the conversation (user_message_chunk, agent_message_chunk, tool_call, …) after a
 * restart of the host, then answers {}; the loaded session takes prompts; session/list finds it;
 * session/close then makes it unknown to prompts. */
Test(acp_sessions, load_after_restart_list_close, .timeout = 60) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  json_t *r = call(&h, 3, "session/prompt", text_prompt(sid, "remember me"));
  cr_assert(result_of(r));
  json_decref(r);
  restart(&h);
  r = call(&h, 2, "session/list", json_object());
  json_t *list = json_object_get(result_of(r), "sessions");
  cr_assert_eq(json_array_size(list), 1);
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(list, 0), "sessionId")), sid);
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(list, 0), "cwd")), h.work);
  json_decref(r);
  send_request(&h, 3, "session/load",
               json_pack("{s:s, s:s, s:[]}", "sessionId", sid, "cwd", h.work, "mcpServers"));
  seen s = {.updates = json_array()};
  r = next_response_ex(&h, 10000, &s, NULL, NULL);
  cr_assert(json_is_object(result_of(r)), "session/load failed");
  json_decref(r);
  cr_assert_eq(json_array_size(s.updates), 2);
  json_t *u0 = json_array_get(s.updates, 0), *u1 = json_array_get(s.updates, 1);
  cr_assert_str_eq(json_string_value(json_object_get(u0, "sessionUpdate")), "user_message_chunk");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(u0, "content"), "text")), "remember me");
  cr_assert_str_eq(json_string_value(json_object_get(u1, "sessionUpdate")), "agent_message_chunk");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(u1, "content"), "text")),
                   "echo: remember me");
  json_decref(s.updates);
  expect_prompt_stop(&h, 4, sid, "again", "end_turn");
  r = call(&h, 5, "session/close", json_pack("{s:s}", "sessionId", sid));
  cr_assert(result_of(r), "session/close failed");
  json_decref(r);
  expect_error(&h, 6, "session/prompt", text_prompt(sid, "closed"), -32002);
  /* A closed session is gone for ACP: load and resume refuse it like an unknown one. */
  expect_error(&h, 7, "session/load",
               json_pack("{s:s, s:s, s:[]}", "sessionId", sid, "cwd", h.work, "mcpServers"), -32002);
  expect_error(&h, 8, "session/resume", json_pack("{s:s, s:s}", "sessionId", sid, "cwd", h.work), -32002);
  host_kill(&h);
}

/* Requests before `initialize` are served as usual (a decision: ACP has no "not initialized" code). */
Test(acp_sessions, before_initialize, .timeout = 60) {
  acp_host h;
  host_start(&h);
  char sid[64];
  new_session(&h, 1, sid, sizeof sid);
  expect_prompt_stop(&h, 2, sid, "early", "end_turn");
  initialize(&h);
  host_kill(&h);
}

/* session/resume after a restart: no replay, `{}`, and the session takes prompts again. */
Test(acp_sessions, resume_without_replay, .timeout = 60) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  json_t *r = call(&h, 3, "session/prompt", text_prompt(sid, "one"));
  json_decref(r);
  restart(&h);
  send_request(&h, 2, "session/resume",
               json_pack("{s:s, s:s, s:[]}", "sessionId", sid, "cwd", h.work, "mcpServers"));
  seen s = {.updates = json_array()};
  r = next_response_ex(&h, 10000, &s, NULL, NULL);
  cr_assert(json_is_object(result_of(r)), "session/resume failed");
  cr_assert_eq(json_array_size(s.updates), 0, "session/resume replayed");
  json_decref(r);
  r = next_response_ex(&h, 0, &s, NULL, NULL);
  cr_assert_null(r);
  send_request(&h, 3, "session/prompt", text_prompt(sid, "two"));
  r = next_response_ex(&h, 10000, &s, NULL, NULL);
  cr_assert_str_eq(stop_reason(r), "end_turn");
  cr_assert_eq(json_array_size(s.updates), 1, "only the new turn's updates");
  cr_expect_eq(s.commands, 1, "the commands, once, after session/resume");
  json_decref(r);
  json_decref(s.updates);
  host_kill(&h);
}

/* ---- ACP-QUIESCE --------------------------------------------------------------------------------------- */

/* ACP-QUIESCE: stdin EOF while a turn runs a command (approved) and another prompt waits: both prompts are
 * answered `cancelled` before stdout closes, the process exits 0 promptly and the command's process group
 * is gone. */
Test(acp_quiesce, eof_settles_and_exits, .timeout = 60) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  char *pidfile = NULL;
  cr_assert(asprintf(&pidfile, "%s/cmd.pid", h.work) > 0);
  char text[512];
  snprintf(text, sizeof text, "/tool run_command {\"command\":\"echo $$ > cmd.pid; exec sleep 30\"}");
  send_request(&h, 3, "session/prompt", text_prompt(sid, text));
  send_request(&h, 4, "session/prompt", text_prompt(sid, "queued"));
  /* Approve, then wait until the command runs. */
  json_t *m = NULL;
  while ((m = ts_stdio_next_msg(&h, 10000)) &&
         !(ts_rpc_method(m) && strcmp(ts_rpc_method(m), "session/request_permission") == 0))
    json_decref(m);
  cr_assert(m, "no permission request");
  perm_answer pa = {.option = "allow_once", .sid = sid};
  answer_permission(&h, m, &pa);
  json_decref(m);
  cr_assert(ts_wait_path(pidfile, 10000), "the command did not start");
  usleep(100 * 1000);
  size_t len = 0;
  char *pidtext = ts_read_file(pidfile, &len);
  cr_assert(pidtext);
  pid_t cmd = (pid_t)atoi(pidtext);
  free(pidtext);
  free(pidfile);
  cr_assert(cmd > 0);
  uint64_t t0 = ts_now_ms();
  ts_stdio_close_stdin(&h);
  int answered = 0;
  while ((m = ts_stdio_next_msg(&h, 10000))) {
    if (ts_rpc_is_response(m)) {
      cr_assert_eq(json_integer_value(json_object_get(m, "id")), 3 + answered, "answers out of order");
      cr_assert_str_eq(stop_reason(m), "cancelled");
      answered++;
    }
    json_decref(m);
  }
  cr_assert_eq(answered, 2, "every prompt is answered before stdout closes");
  expect_exit_zero(&h);
  uint64_t took = ts_now_ms() - t0;
  cr_assert(took < 5000, "the quiesce took %llu ms", (unsigned long long)took);
  cr_assert_eq(ts_group_members(cmd), 0, "the command's process group outlived the agent");
  host_kill(&h);
}

/* ACP-QUIESCE: an idle agent exits 0 at once on stdin EOF. */
Test(acp_quiesce, eof_idle_exits_zero, .timeout = 60) {
  acp_host h;
  host_start(&h);
  initialize(&h);
  uint64_t t0 = ts_now_ms();
  ts_stdio_close_stdin(&h);
  expect_exit_zero(&h);
  cr_assert(ts_now_ms() - t0 < 2000, "exit took %llu ms", (unsigned long long)(ts_now_ms() - t0));
  host_kill(&h);
}

/* ---- stopping while stdout is not read (reliability: heap corruption on an ordinary shutdown path) ---- */
/* ACP-QUIESCE: a connection close settles every prompt and the agent exits 0, whatever its stdout. */

static void expect_clean_stop(const char *how) {
  acp_host h;
  char sid[64];
  start_session(&h, sid, sizeof sid);
  for (int i = 0; i < 200; i++)
    send_request(
        &h, 100 + i, "session/prompt",
        json_pack("{s:s, s:[{s:s, s:s}]}", "sessionId", sid, "prompt", "type", "text", "text", "hello"));
  usleep(2000 * 1000);
  int status = ts_stdio_stop_unread(&h, how, 20000);
  cr_assert_neq(status, -1, "%s: the agent did not exit within 20 s", how);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: exit status %d (signal %d)", how,
            WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  ts_stdio_check_log(&h);
  ts_stdio_free(&h);
}

Test(acp, stdin_eof_with_stdout_unread_exits_zero, .timeout = 60) {
  expect_clean_stop("eof");
}

Test(acp, sigterm_with_stdout_unread_exits_zero, .timeout = 60) {
  expect_clean_stop("SIGTERM");
}

Test(acp, sigint_with_stdout_unread_exits_zero, .timeout = 60) {
  expect_clean_stop("SIGINT");
}
