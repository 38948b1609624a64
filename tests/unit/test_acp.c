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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"

typedef struct acp_host {
  pid_t pid;
  int in;  /* the host's stdin (we write) */
  int out; /* the host's stdout (we read) */
  char *dir;
  char *work; /* an absolute cwd for sessions */
  char *log;
  char *buf;
  size_t len, cap;
  bool eof;
} acp_host;

static void host_prepare(acp_host *h) {
  memset(h, 0, sizeof *h);
  h->pid = -1;
  h->in = h->out = -1;
  h->dir = ts_mkdtemp();
  cr_assert(h->dir);
  cr_assert(asprintf(&h->work, "%s/work", h->dir) > 0 && asprintf(&h->log, "%s/host.log", h->dir) > 0);
  cr_assert_eq(mkdir(h->work, 0700), 0);
  free(ts_write_file(h->dir, "empty.ini", ""));
}

/* In the child: exec `agenthost … acp` on the given pipe ends, stderr to the log. `env` (may be NULL) is
 * one extra "NAME=value". */
static void exec_host(const acp_host *h, int in_fd, int out_fd, const char *env) {
  int err = open(h->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || err < 0 || dup2(err, 2) < 0)
    _exit(127);
  for (int fd = 3; fd < 1024; fd++)
    close(fd);
  char *run = NULL, *cfg = NULL;
  if (asprintf(&run, "%s/run", h->dir) < 0 || asprintf(&cfg, "%s/empty.ini", h->dir) < 0)
    _exit(127);
  if (env)
    putenv((char *)env);
  const char *exe = getenv("AH_TEST_AGENTHOST");
  char *argv[] = {(char *)exe, "--state-dir", h->dir, "--runtime-dir", run, "--config", cfg, "acp", NULL};
  execv(exe, argv);
  _exit(127);
}

static void host_spawn(acp_host *h, const char *env) {
  int in[2], out[2];
  const char *exe = getenv("AH_TEST_AGENTHOST");
  cr_assert(exe && *exe, "AH_TEST_AGENTHOST is not set (run the tests through meson test)");
  cr_assert_eq(pipe2(in, O_CLOEXEC), 0);
  cr_assert_eq(pipe2(out, O_CLOEXEC), 0);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    exec_host(h, in[0], out[1], env);
  }
  close(in[0]);
  close(out[1]);
  h->pid = pid;
  h->in = in[1];
  h->out = out[0];
  h->eof = false;
  h->len = 0;
  signal(SIGPIPE, SIG_IGN);
}

static void host_start_env(acp_host *h, const char *env) {
  host_prepare(h);
  host_spawn(h, env);
}

static void host_start(acp_host *h) {
  host_start_env(h, NULL);
}

static void close_stdin(acp_host *h) {
  if (h->in >= 0)
    close(h->in);
  h->in = -1;
}

/* Kill and reap the process, keep the directory (for a restart on the same state). */
static void host_end(acp_host *h) {
  close_stdin(h);
  if (h->out >= 0)
    close(h->out);
  h->out = -1;
  if (h->pid > 0) {
    kill(h->pid, SIGKILL);
    waitpid(h->pid, NULL, 0);
    h->pid = -1;
  }
}

/* The log must hold no sanitizer report (the suite also runs under ASan+UBSan). */
static void check_log(const acp_host *h) {
  char *log = ts_read_file(h->log, NULL);
  if (!log)
    return;
  bool bad = strstr(log, "AddressSanitizer") || strstr(log, "LeakSanitizer") || strstr(log, "runtime error:");
  char *at = bad ? strstr(log, "Sanitizer") : NULL;
  if (!at && bad)
    at = strstr(log, "runtime error:");
  cr_expect(!bad, "sanitizer report in the host's log: %.2000s", at ? at : "");
  free(log);
}

/* End a test: stdin EOF must stop the agent with exit status 0 (ACP-QUIESCE; under ASan a leak would make
 * it non-zero), then the directory is removed. */
static void host_kill(acp_host *h) {
  if (h->pid > 0) {
    close_stdin(h);
    int status = 0;
    bool exited = ts_wait_exit(h->pid, 15000, &status);
    if (exited)
      h->pid = -1;
    cr_expect(exited, "the agent did not exit on stdin EOF");
    cr_expect(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %d", status);
  }
  if (h->log)
    check_log(h);
  host_end(h);
  if (h->dir)
    ts_rmtree(h->dir);
  free(h->dir);
  free(h->work);
  free(h->log);
  free(h->buf);
  memset(h, 0, sizeof *h);
}

static void send_raw(acp_host *h, const char *bytes, size_t n) {
  while (n) {
    ssize_t w = write(h->in, bytes, n);
    if (w < 0 && errno == EINTR)
      continue;
    cr_assert(w > 0, "write to the host: %s", strerror(errno));
    bytes += w;
    n -= (size_t)w;
  }
}

static void send_line(acp_host *h, const char *line) {
  send_raw(h, line, strlen(line));
  send_raw(h, "\n", 1);
}

/* `params` is stolen (NULL = none). */
static void send_msg(acp_host *h, json_t *id, const char *method, json_t *params) {
  json_t *msg = json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", method);
  if (id)
    json_object_set_new(msg, "id", id);
  if (params)
    json_object_set_new(msg, "params", params);
  char *text = json_dumps(msg, JSON_COMPACT);
  send_line(h, text);
  free(text);
  json_decref(msg);
}

static void send_request(acp_host *h, int id, const char *method, json_t *params) {
  send_msg(h, json_integer(id), method, params);
}

/* The next line from the host, NULL on timeout or EOF. ACP-SDK-*: each line must be one JSON-RPC 2.0
 * message (a request, a notification or a response). */
static json_t *next_msg(acp_host *h, uint64_t timeout_ms) {
  uint64_t end = ts_now_ms() + timeout_ms;
  for (;;) {
    char *nl = h->buf ? memchr(h->buf, '\n', h->len) : NULL;
    if (nl) {
      size_t n = (size_t)(nl - h->buf);
      json_error_t e;
      json_t *msg = json_loadb(h->buf, n, JSON_REJECT_DUPLICATES, &e);
      cr_assert(msg, "stdout carried a line that is not JSON: %.*s", (int)(n > 300 ? 300 : n), h->buf);
      cr_assert(json_is_object(msg), "stdout carried a non-object");
      cr_assert_str_eq(json_string_value(json_object_get(msg, "jsonrpc")), "2.0",
                       "a line without jsonrpc 2.0");
      bool has_method = json_is_string(json_object_get(msg, "method"));
      bool has_id = json_object_get(msg, "id") != NULL;
      bool response = json_object_get(msg, "result") || json_object_get(msg, "error");
      cr_assert(has_method || (has_id && response), "a line that is no JSON-RPC message");
      memmove(h->buf, nl + 1, h->len - n - 1);
      h->len -= n + 1;
      return msg;
    }
    uint64_t now = ts_now_ms();
    if (now >= end || h->eof)
      return NULL;
    struct pollfd p = {.fd = h->out, .events = POLLIN};
    int r = poll(&p, 1, (int)(end - now));
    if (r <= 0)
      continue;
    if (h->cap - h->len < 65536) {
      h->cap = h->cap ? h->cap * 2 : 131072;
      h->buf = realloc(h->buf, h->cap);
      cr_assert(h->buf);
    }
    ssize_t got = read(h->out, h->buf + h->len, h->cap - h->len);
    if (got <= 0) {
      h->eof = true;
      cr_assert_eq(h->len, 0, "stdout ended in the middle of a line");
      return NULL;
    }
    h->len += (size_t)got;
  }
}

static bool is_response(const json_t *m) {
  return !json_object_get(m, "method") && (json_object_get(m, "result") || json_object_get(m, "error"));
}

static const char *method_of(const json_t *m) {
  return json_string_value(json_object_get(m, "method"));
}

/* Collects the session/update notifications seen while waiting (may be NULL). */
typedef struct seen {
  json_t *updates; /* array of the `update` objects */
} seen;

/* The next response (notifications recorded in `s`, server requests answered by `on_request` or ignored),
 * NULL on timeout. */
static json_t *next_response_ex(acp_host *h, uint64_t timeout_ms, seen *s,
                                void (*on_request)(acp_host *h, json_t *req, void *arg), void *arg) {
  uint64_t end = ts_now_ms() + timeout_ms;
  for (;;) {
    uint64_t now = ts_now_ms();
    json_t *m = next_msg(h, end > now ? end - now : 0);
    if (!m || is_response(m))
      return m;
    if (s && method_of(m) && strcmp(method_of(m), "session/update") == 0)
      json_array_append(s->updates, json_object_get(json_object_get(m, "params"), "update"));
    if (on_request && json_object_get(m, "id"))
      on_request(h, m, arg);
    json_decref(m);
  }
}

static json_t *next_response(acp_host *h, uint64_t timeout_ms) {
  return next_response_ex(h, timeout_ms, NULL, NULL, NULL);
}

/* Send a request and wait for its response. */
static json_t *call(acp_host *h, int id, const char *method, json_t *params) {
  send_request(h, id, method, params);
  json_t *r = next_response(h, 10000);
  cr_assert(r, "no answer to %s", method);
  cr_assert_eq(json_integer_value(json_object_get(r, "id")), id, "answer to another id");
  return r;
}

static int error_code(const json_t *r) {
  return (int)json_integer_value(json_object_get(json_object_get(r, "error"), "code"));
}

static const char *error_message(const json_t *r) {
  return json_string_value(json_object_get(json_object_get(r, "error"), "message"));
}

static json_t *result_of(const json_t *r) {
  return json_object_get(r, "result");
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

static json_t *text_prompt(const char *sid, const char *text) {
  return json_pack("{s:s, s:[{s:s, s:s}]}", "sessionId", sid, "prompt", "type", "text", "text", text);
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
  cr_assert_eq(error_code(r), -32602);
  cr_assert(strstr(error_message(r), "cwd"), "the message names the field: %s", error_message(r));
  json_decref(r);
  r = call(&h, 3, "session/new", json_pack("{s:[]}", "mcpServers"));
  cr_assert_eq(error_code(r), -32602);
  json_decref(r);
  r = call(&h, 4, "session/new", json_pack("{s:i, s:[]}", "cwd", 7, "mcpServers"));
  cr_assert_eq(error_code(r), -32602);
  json_decref(r);
  r = call(&h, 5, "session/new",
           json_pack("{s:s, s:[], s:[s]}", "cwd", h.work, "mcpServers", "additionalDirectories", "/tmp"));
  cr_assert_eq(error_code(r), -32602);
  cr_assert(strstr(error_message(r), "additionalDirectories"));
  json_decref(r);
  r = call(&h, 6, "session/new",
           json_pack("{s:s, s:[{s:s, s:s, s:[], s:[]}]}", "cwd", h.work, "mcpServers", "name", "fs",
                     "command", "/bin/true", "args", "env"));
  cr_assert_eq(error_code(r), -32602);
  cr_assert(strstr(error_message(r), "MCP"), "the message names the limitation: %s", error_message(r));
  json_decref(r);
  r = call(&h, 7, "session/new", json_pack("{s:s, s:s}", "cwd", h.work, "mcpServers", "none"));
  cr_assert_eq(error_code(r), -32602);
  json_decref(r);
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
    send_line(&h, cases[i].line);
    json_t *r = next_response(&h, 10000);
    cr_assert(r, "no answer to line %zu", i);
    cr_assert_eq(error_code(r), cases[i].code, "line %zu: code %d, not %d", i, error_code(r), cases[i].code);
    cr_assert(json_is_null(json_object_get(r, "id")), "line %zu: the id is null", i);
    json_decref(r);
  }
  /* Invalid UTF-8 inside a string. */
  const char bad_utf8[] =
      "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"initialize\",\"params\":{\"x\":\"\xff\xfe\"}}\n";
  send_raw(&h, bad_utf8, sizeof bad_utf8 - 1);
  json_t *r = next_response(&h, 10000);
  cr_assert(r);
  cr_assert_eq(error_code(r), -32700);
  json_decref(r);
  /* A NUL byte inside the line. */
  const char nul_line[] = "{\"jsonrpc\":\"2.0\",\"id\":7,\0\"method\":\"x\"}\n";
  send_raw(&h, nul_line, sizeof nul_line - 1);
  r = next_response(&h, 10000);
  cr_assert(r);
  cr_assert_eq(error_code(r), -32700);
  json_decref(r);
  /* 100000 nested arrays: refused, not a crash. */
  size_t depth = 100000;
  char *deep = malloc(depth * 2 + 2);
  cr_assert(deep);
  memset(deep, '[', depth);
  memset(deep + depth, ']', depth);
  deep[depth * 2] = '\n';
  send_raw(&h, deep, depth * 2 + 1);
  free(deep);
  r = next_response(&h, 10000);
  cr_assert(r, "no answer to a deeply nested line");
  cr_assert(error_code(r) == -32700 || error_code(r) == -32600, "deep nesting: %d", error_code(r));
  json_decref(r);
  /* Wrong param types: -32602 naming the field. */
  r = call(&h, 8, "initialize", json_pack("{s:s}", "protocolVersion", "1"));
  cr_assert_eq(error_code(r), -32602);
  cr_assert(strstr(error_message(r), "protocolVersion"));
  json_decref(r);
  r = call(&h, 9, "initialize", json_pack("[i]", 1));
  cr_assert_eq(error_code(r), -32602);
  json_decref(r);
  r = call(&h, 10, "session/prompt", json_pack("{s:i, s:[]}", "sessionId", 5, "prompt"));
  cr_assert_eq(error_code(r), -32602);
  cr_assert(strstr(error_message(r), "sessionId"));
  json_decref(r);
  r = call(&h, 11, "session/prompt", json_pack("{s:s, s:s}", "sessionId", "x", "prompt", "text"));
  cr_assert_eq(error_code(r), -32602);
  cr_assert(strstr(error_message(r), "prompt"));
  json_decref(r);
  r = call(&h, 12, "session/load",
           json_pack("{s:b, s:s, s:[]}", "sessionId", 1, "cwd", h.work, "mcpServers"));
  cr_assert_eq(error_code(r), -32602);
  json_decref(r);
  r = call(&h, 13, "session/list", json_pack("{s:i}", "cursor", 3));
  cr_assert_eq(error_code(r), -32602);
  json_decref(r);
  /* Numbers: a fraction or a big integer where an integer version is expected. */
  r = call(&h, 14, "initialize", json_pack("{s:f}", "protocolVersion", 1.5));
  cr_assert_eq(error_code(r), -32602);
  json_decref(r);
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
  send_raw(&h, big, n + 1);
  free(big);
  json_t *r = next_response(&h, 10000);
  cr_assert(r, "no answer to an over-long line");
  cr_assert_eq(error_code(r), -32600);
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
  send_raw(&h, partial, strlen(partial));
  close_stdin(&h);
  json_t *r = next_response(&h, 10000);
  cr_assert(r, "the last line without a newline was not served");
  cr_assert_eq(json_integer_value(json_object_get(r, "id")), 3);
  cr_assert(result_of(r));
  json_decref(r);
  int status = 0;
  cr_assert(ts_wait_exit(h.pid, 10000, &status), "the agent did not exit on EOF");
  h.pid = -1;
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  host_kill(&h);

  host_start(&h);
  const char *cut = "{\"jsonrpc\":\"2.0\",\"id\":4,\"meth";
  send_raw(&h, cut, strlen(cut));
  close_stdin(&h);
  r = next_response(&h, 10000);
  cr_assert(r, "a truncated line at EOF was not answered");
  cr_assert_eq(error_code(r), -32700);
  json_decref(r);
  cr_assert(ts_wait_exit(h.pid, 10000, &status), "the agent did not exit on EOF");
  h.pid = -1;
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  host_kill(&h);
}

/* ACP-SDK-*: an unknown method is -32601 (also unadvertised ones such as session/set_mode); an unknown
 * notification and a response with an unknown id are ignored; the agent keeps answering. */
Test(acp_sdk, unknown_method, .timeout = 60) {
  acp_host h;
  host_start(&h);
  initialize(&h);
  json_t *r = call(&h, 2, "no/such", NULL);
  cr_assert_eq(error_code(r), -32601);
  json_decref(r);
  r = call(&h, 3, "session/set_mode", json_pack("{s:s, s:s}", "sessionId", "x", "modeId", "y"));
  cr_assert_eq(error_code(r), -32601);
  json_decref(r);
  send_msg(&h, NULL, "no/such/notification", json_object());
  send_line(&h, "{\"jsonrpc\":\"2.0\",\"id\":777,\"result\":{}}");
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
  cr_assert_eq(error_code(r), -32002);
  json_decref(r);
  r = call(&h, 3, "session/load",
           json_pack("{s:s, s:s, s:[]}", "sessionId", ghost, "cwd", h.work, "mcpServers"));
  cr_assert_eq(error_code(r), -32002);
  json_decref(r);
  r = call(&h, 4, "session/resume", json_pack("{s:s, s:s}", "sessionId", ghost, "cwd", h.work));
  cr_assert_eq(error_code(r), -32002);
  json_decref(r);
  r = call(&h, 5, "session/close", json_pack("{s:s}", "sessionId", ghost));
  cr_assert_eq(error_code(r), -32002);
  json_decref(r);
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
  host_start(&h);
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  send_request(&h, 3, "session/prompt",
               json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s, s:s}]}", "sessionId", sid, "prompt", "type", "text",
                         "text", "hello ", "type", "resource_link", "uri", "file:///a.txt", "name", "a.txt"));
  seen s = {.updates = json_array()};
  json_t *r = next_response_ex(&h, 10000, &s, NULL, NULL);
  cr_assert(r);
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "end_turn");
  json_decref(r);
  cr_assert_eq(json_array_size(s.updates), 1);
  json_t *u = json_array_get(s.updates, 0);
  cr_assert_str_eq(json_string_value(json_object_get(u, "sessionUpdate")), "agent_message_chunk");
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(u, "content"), "text")),
                   "echo: hello [a.txt](file:///a.txt)");
  cr_assert(json_is_string(json_object_get(u, "messageId")));
  json_decref(s.updates);
  const char *types[] = {"image", "audio", "resource", "video"};
  for (int i = 0; i < 4; i++) {
    r = call(&h, 10 + i, "session/prompt",
             json_pack("{s:s, s:[{s:s, s:s, s:s}]}", "sessionId", sid, "prompt", "type", types[i], "data",
                       "AAAA", "mimeType", "image/png"));
    cr_assert_eq(error_code(r), -32602, "%s content is refused", types[i]);
    json_decref(r);
  }
  r = call(&h, 20, "session/prompt", json_pack("{s:s, s:[]}", "sessionId", sid, "prompt"));
  cr_assert_eq(error_code(r), -32602);
  json_decref(r);
  host_kill(&h);
}

/* ACP-CODEC: turn-end reasons map to stop reasons (max_tokens kept for the prompt's own turn, refusal);
 * a failed turn is a JSON-RPC error, never a fake stop reason. */
Test(acp_prompt, stop_reasons, .timeout = 60) {
  acp_host h;
  host_start(&h);
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  json_t *r = call(&h, 3, "session/prompt", text_prompt(sid, "/max-tokens\nlong"));
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "max_tokens");
  json_decref(r);
  r = call(&h, 4, "session/prompt", text_prompt(sid, "/refuse"));
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "refusal");
  json_decref(r);
  r = call(&h, 5, "session/prompt", text_prompt(sid, "/fail boom"));
  cr_assert_null(result_of(r));
  cr_assert_str_eq(error_message(r), "boom");
  json_decref(r);
  host_kill(&h);
}

/* ACP-PROMPT-CANCEL: a second prompt is queued behind the first and the answers come in order; cancel
 * during /sleep answers every pending prompt `cancelled` exactly once, in order. */
Test(acp_prompt, queue_and_cancel, .timeout = 60) {
  acp_host h;
  host_start(&h);
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  send_request(&h, 3, "session/prompt", text_prompt(sid, "/sleep 200\nfirst"));
  send_request(&h, 4, "session/prompt", text_prompt(sid, "second"));
  for (int id = 3; id <= 4; id++) {
    json_t *r = next_response(&h, 10000);
    cr_assert(r);
    cr_assert_eq(json_integer_value(json_object_get(r, "id")), id, "answers out of order");
    cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "end_turn");
    json_decref(r);
  }
  send_request(&h, 5, "session/prompt", text_prompt(sid, "/sleep 5000\nslow"));
  send_request(&h, 6, "session/prompt", text_prompt(sid, "queued"));
  usleep(300 * 1000);
  uint64_t t0 = ts_now_ms();
  send_msg(&h, NULL, "session/cancel", json_pack("{s:s}", "sessionId", sid));
  for (int id = 5; id <= 6; id++) {
    json_t *r = next_response(&h, 10000);
    cr_assert(r);
    cr_assert_eq(json_integer_value(json_object_get(r, "id")), id, "answers out of order");
    cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "cancelled");
    json_decref(r);
  }
  cr_assert(ts_now_ms() - t0 < 2000, "the cancel took %llu ms", (unsigned long long)(ts_now_ms() - t0));
  /* Exactly once: nothing else answers 5 or 6; the session takes the next prompt. */
  json_t *r = call(&h, 7, "session/prompt", text_prompt(sid, "after"));
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "end_turn");
  json_decref(r);
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
  cr_assert_str_eq(method_of(req), "session/request_permission");
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
  char *text = json_dumps(msg, JSON_COMPACT);
  send_line(h, text);
  free(text);
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
  host_start(&h);
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
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
    cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), cases[i].stop, "case %d",
                     i);
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
  host_start(&h);
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  send_request(&h, 3, "session/prompt",
               text_prompt(sid, "/subagent /tool run_command {\"command\":\"touch sub\"}"));
  perm_answer pa = {.option = "allow_once", .sid = sid};
  seen s = {.updates = json_array()};
  json_t *r = next_response_ex(&h, 10000, &s, answer_permission, &pa);
  cr_assert(r);
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "end_turn");
  json_decref(r);
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
  r = next_response_ex(&h, 10000, &s, NULL, NULL);
  cr_assert(r);
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "cancelled");
  json_decref(r);
  cr_assert_eq(json_array_size(s.updates), 1);
  cr_assert(strstr(
      json_string_value(json_object_get(json_object_get(json_array_get(s.updates, 0), "content"), "text")),
      "what now?"));
  json_decref(s.updates);
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
  json_t *r = next_response_ex(&h, 10000, &s, NULL, NULL);
  cr_assert(r);
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "end_turn");
  json_decref(r);
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
  host_start(&h);
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  json_t *r = call(&h, 3, "session/prompt", text_prompt(sid, "remember me"));
  cr_assert(result_of(r));
  json_decref(r);
  close_stdin(&h);
  int status = 0;
  cr_assert(ts_wait_exit(h.pid, 10000, &status));
  h.pid = -1;
  host_end(&h);
  host_spawn(&h, NULL);
  initialize(&h);
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
  r = call(&h, 4, "session/prompt", text_prompt(sid, "again"));
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "end_turn");
  json_decref(r);
  r = call(&h, 5, "session/close", json_pack("{s:s}", "sessionId", sid));
  cr_assert(result_of(r), "session/close failed");
  json_decref(r);
  r = call(&h, 6, "session/prompt", text_prompt(sid, "closed"));
  cr_assert_eq(error_code(r), -32002);
  json_decref(r);
  /* A closed session is gone for ACP: load and resume refuse it like an unknown one. */
  r = call(&h, 7, "session/load",
           json_pack("{s:s, s:s, s:[]}", "sessionId", sid, "cwd", h.work, "mcpServers"));
  cr_assert_eq(error_code(r), -32002);
  json_decref(r);
  r = call(&h, 8, "session/resume", json_pack("{s:s, s:s}", "sessionId", sid, "cwd", h.work));
  cr_assert_eq(error_code(r), -32002);
  json_decref(r);
  host_kill(&h);
}

/* Requests before `initialize` are served as usual (a decision: ACP has no "not initialized" code). */
Test(acp_sessions, before_initialize, .timeout = 60) {
  acp_host h;
  host_start(&h);
  char sid[64];
  new_session(&h, 1, sid, sizeof sid);
  json_t *r = call(&h, 2, "session/prompt", text_prompt(sid, "early"));
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "end_turn");
  json_decref(r);
  initialize(&h);
  host_kill(&h);
}

/* session/resume after a restart: no replay, `{}`, and the session takes prompts again. */
Test(acp_sessions, resume_without_replay, .timeout = 60) {
  acp_host h;
  host_start(&h);
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  json_t *r = call(&h, 3, "session/prompt", text_prompt(sid, "one"));
  json_decref(r);
  close_stdin(&h);
  cr_assert(ts_wait_exit(h.pid, 10000, NULL));
  h.pid = -1;
  host_end(&h);
  host_spawn(&h, NULL);
  initialize(&h);
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
  cr_assert_str_eq(json_string_value(json_object_get(result_of(r), "stopReason")), "end_turn");
  cr_assert_eq(json_array_size(s.updates), 1, "only the new turn's updates");
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
  host_start(&h);
  initialize(&h);
  char sid[64];
  new_session(&h, 2, sid, sizeof sid);
  char *pidfile = NULL;
  cr_assert(asprintf(&pidfile, "%s/cmd.pid", h.work) > 0);
  char text[512];
  snprintf(text, sizeof text, "/tool run_command {\"command\":\"echo $$ > cmd.pid; exec sleep 30\"}");
  send_request(&h, 3, "session/prompt", text_prompt(sid, text));
  send_request(&h, 4, "session/prompt", text_prompt(sid, "queued"));
  /* Approve, then wait until the command runs. */
  json_t *m = NULL;
  while ((m = next_msg(&h, 10000)) &&
         !(method_of(m) && strcmp(method_of(m), "session/request_permission") == 0))
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
  close_stdin(&h);
  int answered = 0;
  while ((m = next_msg(&h, 10000))) {
    if (is_response(m)) {
      cr_assert_eq(json_integer_value(json_object_get(m, "id")), 3 + answered, "answers out of order");
      cr_assert_str_eq(json_string_value(json_object_get(result_of(m), "stopReason")), "cancelled");
      answered++;
    }
    json_decref(m);
  }
  cr_assert_eq(answered, 2, "every prompt is answered before stdout closes");
  int status = 0;
  cr_assert(ts_wait_exit(h.pid, 10000, &status), "the agent did not exit on EOF");
  h.pid = -1;
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit status %d", status);
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
  close_stdin(&h);
  int status = 0;
  cr_assert(ts_wait_exit(h.pid, 10000, &status), "the agent did not exit on EOF");
  h.pid = -1;
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  cr_assert(ts_now_ms() - t0 < 2000, "exit took %llu ms", (unsigned long long)(ts_now_ms() - t0));
  host_kill(&h);
}
