/* The openai provider (plugins/openai) in a real host with a real store, against the scripted fake model
 * server (tests/fakes/fake_model.py): what it sends, what the session records, and every failure a user
 * meets — retries and their waits, key and model errors, broken and malformed streams, cancel, TLS, a
 * closed port — with a canary key that must appear nowhere but in the Authorization header. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_model.h"
#include "host_support.h"
#include "internal.h"
#include "log.h"
#include "support.h"

#define CANARY "sk-canary-7Qx93LmZ"

static uv_loop_t loop;
static char *dir, *state, *work, *log_path;
static ah_config cfg;
static ah_host *host;
static ts_fake fake;
static json_t *bus; /* [[name, data], ...] */
static ah_sub *sub;
static int log_fd = -1;

static void on_bus(const char *name, const json_t *data, void *arg) {
  (void)arg;
  json_array_append_new(bus, json_pack("[sO]", name, data));
}

static void setup(void) {
  cr_assert_eq(uv_loop_init(&loop), 0);
  dir = ts_mkdtemp();
  cr_assert(asprintf(&state, "%s/state", dir) > 0 && asprintf(&work, "%s/work", dir) > 0 &&
            asprintf(&log_path, "%s/host.log", dir) > 0);
  cr_assert_eq(mkdir(work, 0700), 0);
  log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ah__log_set_fd(log_fd);
  ah__log_set_level(AH_LOG_DEBUG);
  setenv("AH_TEST_OPENAI_KEY", CANARY, 1);
  memset(&cfg, 0, sizeof cfg);
  cfg.state_dir = state;
  cfg.default_provider = "echo";
  bus = json_array();
}

static void teardown(void) {
  ts_fake_stop(&fake);
  if (host)
    cr_assert_eq(th_host_stop_free(&loop, host), 0);
  else
    cr_assert_eq(ts_loop_close(&loop), 0);
  host = NULL;
  ah__log_set_fd(2);
  if (log_fd >= 0)
    close(log_fd);
  json_decref(cfg.providers);
  json_decref(bus);
  ts_rmtree(dir);
  free(dir);
  free(state);
  free(work);
  free(log_path);
}

TestSuite(openai, .init = setup, .fini = teardown, .timeout = 90);

/* A host whose [provider.fake] is type openai at `base` with the extra keys `extra` ({k: v} strings,
 * stolen; may be NULL), the openai plugin mounted. */
static void host_up(const char *base, json_t *extra) {
  json_t *p = json_pack("{s:s, s:s, s:s, s:s, s:s}", "type", "openai", "base_url", base, "model", "m1",
                        "api_key_env", "AH_TEST_OPENAI_KEY", "max_retries", "3");
  if (extra)
    json_object_update(p, extra);
  json_decref(extra);
  cfg.providers = json_pack("{s:o}", "fake", p);
  ah_host_opts opts = {.loop = &loop, .config = &cfg, .mode = "serve", .drain_ms = 1000};
  cr_assert_eq(ah__host_new(&opts, &host), 0);
  cr_assert_eq(ah__host_api(host)->subscribe(ah__host_core_mount(host), "*", on_bus, NULL, &sub), 0);
  char path[4096];
  snprintf(path, sizeof path, "%s/plugins/openai/openai.so", getenv("AH_TEST_BUILD_ROOT"));
  char *why = NULL;
  cr_assert_eq(ah__host_load(host, path, NULL, NULL, &why), 0, "%s", why ? why : "");
  free(why);
}

static json_t *call_ok(const char *method, json_t *params) {
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_ADMIN, method, params, &o), 0);
  cr_assert_eq(o.status, 0, "%s: %s", method, o.message ? o.message : "");
  json_t *r = json_incref(o.result);
  th_outcome_clear(&o);
  return r;
}

static char *session_new(void) {
  json_t *r = call_ok("session.create", json_pack("{s:s, s:s}", "cwd", work, "provider", "fake"));
  char *id = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  return id;
}

/* The stored events of `id` of one kind, in order (new array). */
static json_t *events_of(const char *id, const char *kind) {
  json_t *out = json_array();
  size_t i = 0;
  json_t *e = NULL;
  json_array_foreach(bus, i, e) {
    if (strcmp(json_string_value(json_array_get(e, 0)), "session.event") != 0)
      continue;
    json_t *d = json_array_get(e, 1);
    json_t *ev = json_object_get(d, "event");
    if (strcmp(json_string_value(json_object_get(d, "sessionId")), id) == 0 &&
        (!kind || strcmp(json_string_value(json_object_get(ev, "kind")), kind) == 0))
      json_array_append(out, ev);
  }
  return out;
}

static size_t count_bus(const char *name) {
  size_t n = 0, i = 0;
  json_t *e = NULL;
  json_array_foreach(bus, i, e) {
    n += strcmp(json_string_value(json_array_get(e, 0)), name) == 0;
  }
  return n;
}

typedef struct wait_ctx {
  const char *id;
  size_t turns;
} wait_ctx;

static bool turns_ended(void *arg) {
  wait_ctx *w = arg;
  json_t *e = events_of(w->id, "turn/ended");
  bool ok = json_array_size(e) >= w->turns;
  json_decref(e);
  return ok;
}

/* Prompt `text` and wait for the turn's end (the n-th of the session); returns its turn/ended data. */
static json_t *prompt(const char *id, const char *text, size_t nth) {
  json_decref(call_ok("session.prompt", json_pack("{s:s, s:[{s:s, s:s}]}", "sessionId", id, "content", "type",
                                                  "text", "text", text)));
  wait_ctx w = {id, nth};
  cr_assert(ts_run_until_pred(&loop, turns_ended, &w, 60000), "the turn did not end");
  json_t *e = events_of(id, "turn/ended");
  json_t *d = json_incref(json_object_get(json_array_get(e, nth - 1), "data"));
  json_decref(e);
  return d;
}

static const char *ended_reason(const json_t *d) {
  return json_string_value(json_object_get(d, "reason"));
}
static const char *ended_error(const json_t *d) {
  const char *e = json_string_value(json_object_get(d, "error"));
  return e ? e : "";
}

static json_t *requests(void) {
  return ts_fake_get(&fake, "requests");
}

static json_t *request_body(json_t *reqs, size_t i) {
  const char *b = json_string_value(json_object_get(json_array_get(reqs, i), "body"));
  json_t *j = b ? json_loads(b, 0, NULL) : NULL;
  cr_assert_not_null(j, "request %zu has a JSON body", i);
  return j;
}

/* A chunk of a streamed answer. */
static json_t *text_chunk(const char *text) {
  return json_pack("{s:s, s:s, s:[{s:i, s:{s:s}}]}", "id", "c1", "model", "fake-model-v2", "choices", "index",
                   0, "delta", "content", text);
}
static json_t *finish_chunk(const char *reason) {
  return json_pack("{s:s, s:[{s:i, s:{}, s:s}]}", "model", "fake-model-v2", "choices", "index", 0, "delta",
                   "finish_reason", reason);
}
static json_t *usage_chunk(int in, int out) {
  return json_pack("{s:s, s:[], s:{s:i, s:i, s:i, s:{s:i}}}", "model", "fake-model-v2", "choices", "usage",
                   "prompt_tokens", in, "completion_tokens", out, "total_tokens", in + out,
                   "prompt_tokens_details", "cached_tokens", 4);
}

static void script(json_t *steps) {
  char *s = json_dumps(steps, 0);
  json_decref(steps);
  ts_fake_script(&fake, s);
  free(s);
}

static json_t *sse_step(json_t *events) {
  return json_pack("{s:o}", "sse", events);
}

static char *base_url(void) {
  char *b = NULL;
  cr_assert(asprintf(&b, "%s/v1", fake.base) > 0);
  return b;
}

Test(openai, a_streamed_answer_is_deltas_then_one_committed_message_with_usage) {
  ts_fake_start(&fake, NULL, NULL);
  script(json_pack("[o]", sse_step(json_pack("[o, o, o, o, s]", text_chunk("Hel"), text_chunk("lo"),
                                             finish_chunk("stop"), usage_chunk(10, 2), "[DONE]"))));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "hi there", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *u = json_object_get(end, "usage");
  cr_expect_eq(json_integer_value(json_object_get(u, "inputTokens")), 10);
  cr_expect_eq(json_integer_value(json_object_get(u, "outputTokens")), 2);
  cr_expect_eq(json_integer_value(json_object_get(u, "cachedInputTokens")), 4);
  cr_expect_eq(json_integer_value(json_object_get(u, "requests")), 1);
  cr_expect_str_eq(json_string_value(json_object_get(u, "model")), "fake-model-v2");
  json_t *c = events_of(id, "message/committed");
  cr_assert_eq(json_array_size(c), 1);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(c, 0), "data"), "text")),
                   "Hello");
  cr_expect_eq(count_bus("session.delta"), 2, "one delta per streamed piece");
  json_t *reqs = requests();
  cr_assert_eq(json_array_size(reqs), 1);
  json_t *r = json_array_get(reqs, 0);
  cr_expect_str_eq(json_string_value(json_object_get(r, "path")), "/v1/chat/completions");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r, "headers"), "authorization")),
                   "Bearer " CANARY);
  json_t *body = request_body(reqs, 0);
  cr_expect_str_eq(json_string_value(json_object_get(body, "model")), "m1");
  cr_expect(json_is_true(json_object_get(body, "stream")));
  cr_expect(json_is_true(json_object_get(json_object_get(body, "stream_options"), "include_usage")));
  json_t *msgs = json_object_get(body, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "user");
  cr_expect_str_eq(json_string_value(json_object_get(last, "content")), "hi there");
  cr_expect_gt(json_array_size(json_object_get(body, "tools")), 0, "the built-in tools are offered");
  /* the next turn sends the first one as history */
  script(json_pack("[o]",
                   sse_step(json_pack("[o, o, s]", text_chunk("again"), finish_chunk("stop"), "[DONE]"))));
  json_decref(end);
  end = prompt(id, "second", 2);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_decref(reqs);
  json_decref(body);
  reqs = requests();
  body = request_body(reqs, 1);
  msgs = json_object_get(body, "messages");
  cr_assert_eq(json_array_size(msgs), 3, "user, assistant, user");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(msgs, 0), "content")), "hi there");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(msgs, 1), "content")), "Hello");
  json_decref(reqs);
  json_decref(body);
  json_decref(c);
  json_decref(end);
  free(id);
  free(b);
}

/* A tool call delta: id and name first, then the arguments in pieces. */
static json_t *call_chunk(int index, const char *id, const char *name, const char *args) {
  json_t *fn = json_object();
  if (name)
    json_object_set_new(fn, "name", json_string(name));
  json_object_set_new(fn, "arguments", json_string(args));
  json_t *tc = json_pack("{s:i, s:o}", "index", index, "function", fn);
  if (id) {
    json_object_set_new(tc, "id", json_string(id));
    json_object_set_new(tc, "type", json_string("function"));
  }
  return json_pack("{s:[{s:i, s:{s:[o]}}]}", "choices", "index", 0, "delta", "tool_calls", tc);
}

Test(openai, tool_calls_split_over_chunks_run_in_parallel_and_go_back_in_one_request) {
  ts_fake_start(&fake, NULL, NULL);
  char *f = ts_write_file(work, "notes.txt", "the notes");
  free(f);
  json_t *round1 =
      json_pack("[o, o, o, o, o, o, s]", call_chunk(0, "call_a", "read_file", "{\"pa"),
                call_chunk(1, "call_b", "list_dir", ""), call_chunk(0, NULL, NULL, "th\": \"notes"),
                call_chunk(0, NULL, NULL, ".txt\"}"), call_chunk(1, NULL, NULL, "{\"path\": \".\"}"),
                finish_chunk("tool_calls"), "[DONE]");
  script(json_pack("[o, o]", sse_step(round1),
                   sse_step(json_pack("[o, o, o, s]", text_chunk("read it"), finish_chunk("stop"),
                                      usage_chunk(30, 3), "[DONE]"))));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "read my notes", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *calls = events_of(id, "tool/call");
  cr_assert_eq(json_array_size(calls), 2);
  json_t *c0 = json_object_get(json_array_get(calls, 0), "data");
  cr_expect_str_eq(json_string_value(json_object_get(c0, "name")), "read_file");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(c0, "args"), "path")), "notes.txt");
  json_t *results = events_of(id, "tool/result");
  cr_expect_eq(json_array_size(results), 2);
  json_t *reqs = requests();
  cr_assert_eq(json_array_size(reqs), 2, "the two results went back in one request");
  json_t *body = request_body(reqs, 1);
  json_t *msgs = json_object_get(body, "messages");
  size_t n = json_array_size(msgs);
  json_t *asst = json_array_get(msgs, n - 3);
  cr_expect_str_eq(json_string_value(json_object_get(asst, "role")), "assistant");
  json_t *tcs = json_object_get(asst, "tool_calls");
  cr_assert_eq(json_array_size(tcs), 2);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(json_array_get(tcs, 0), "function"), "arguments")),
      "{\"path\": \"notes.txt\"}");
  json_t *t1 = json_array_get(msgs, n - 2), *t2 = json_array_get(msgs, n - 1);
  cr_expect_str_eq(json_string_value(json_object_get(t1, "tool_call_id")), "call_a");
  cr_expect_str_eq(json_string_value(json_object_get(t2, "tool_call_id")), "call_b");
  cr_expect(strstr(json_string_value(json_object_get(t1, "content")), "the notes"), "%s",
            json_string_value(json_object_get(t1, "content")));
  json_t *u = json_object_get(end, "usage");
  cr_expect_eq(json_integer_value(json_object_get(u, "requests")), 2);
  cr_expect_eq(json_integer_value(json_object_get(u, "inputTokens")), 30);
  /* the next turn's history carries the calls and their results */
  script(
      json_pack("[o]", sse_step(json_pack("[o, o, s]", text_chunk("ok"), finish_chunk("stop"), "[DONE]"))));
  json_decref(end);
  end = prompt(id, "thanks", 2);
  json_decref(reqs);
  json_decref(body);
  reqs = requests();
  body = request_body(reqs, 2);
  msgs = json_object_get(body, "messages");
  bool saw_call = false, saw_result = false;
  size_t i = 0;
  json_t *m = NULL;
  json_array_foreach(msgs, i, m) {
    saw_call |= json_array_size(json_object_get(m, "tool_calls")) == 2;
    saw_result |= json_string_value(json_object_get(m, "tool_call_id")) != NULL;
  }
  cr_expect(saw_call && saw_result, "the history has the tool calls and their results");
  json_decref(reqs);
  json_decref(body);
  json_decref(calls);
  json_decref(results);
  json_decref(end);
  free(id);
  free(b);
}

Test(openai, reasoning_streams_transiently_and_goes_back_within_the_turn) {
  ts_fake_start(&fake, NULL, NULL);
  json_t *r1 = json_pack(
      "[{s:[{s:i, s:{s:s}}]}, o, o, s]", "choices", "index", 0, "delta", "reasoning_content", "let me look",
      call_chunk(0, "call_r", "list_dir", "{\"path\": \".\"}"), finish_chunk("tool_calls"), "[DONE]");
  script(json_pack(
      "[o, o]", sse_step(r1),
      sse_step(json_pack("[o, o, s]", text_chunk("nothing here"), finish_chunk("stop"), "[DONE]"))));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "what is there?", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  cr_expect_eq(count_bus("session.reasoning"), 1);
  json_t *c = events_of(id, "message/committed");
  cr_assert_eq(json_array_size(c), 1, "the reasoning is not committed as an answer");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(c, 0), "data"), "text")),
                   "nothing here");
  json_t *reqs = requests();
  json_t *body = request_body(reqs, 1);
  json_t *msgs = json_object_get(body, "messages");
  json_t *asst = json_array_get(msgs, json_array_size(msgs) - 2);
  cr_expect_str_eq(json_string_value(json_object_get(asst, "reasoning_content")), "let me look");
  json_decref(reqs);
  json_decref(body);
  json_decref(c);
  json_decref(end);
  free(id);
  free(b);
}

static json_t *error_step(int status, const char *message, const char *code) {
  json_t *e = json_pack("{s:s}", "message", message);
  if (code)
    json_object_set_new(e, "code", json_string(code));
  return json_pack("{s:i, s:{s:o}}", "status", status, "json", "error", e);
}

static json_t *ok_step(const char *text) {
  return sse_step(json_pack("[o, o, s]", text_chunk(text), finish_chunk("stop"), "[DONE]"));
}

Test(openai, a_429_waits_its_retry_after_then_succeeds) {
  ts_fake_start(&fake, NULL, NULL);
  json_t *limited = error_step(429, "Rate limit reached", "rate_limit_exceeded");
  json_object_set_new(limited, "headers", json_pack("{s:s}", "Retry-After", "1"));
  script(json_pack("[o, o]", limited, ok_step("fine")));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *reqs = requests();
  cr_assert_eq(json_array_size(reqs), 2);
  double gap = json_real_value(json_object_get(json_array_get(reqs, 1), "time")) -
               json_real_value(json_object_get(json_array_get(reqs, 0), "time"));
  cr_expect_geq(gap, 0.95, "the retry waited Retry-After (1 s): %.3f s", gap);
  cr_expect_lt(gap, 3.0, "%.3f s", gap);
  json_t *notes = events_of(id, "turn/notice");
  cr_assert_eq(json_array_size(notes), 1);
  json_t *nd = json_object_get(json_array_get(notes, 0), "data");
  cr_expect_str_eq(json_string_value(json_object_get(nd, "kind")), "retry");
  cr_expect_eq(json_integer_value(json_object_get(nd, "waitMs")), 1000);
  cr_expect(
      strstr(json_string_value(json_object_get(nd, "message")), "rate limited, retrying in 1.0 s (1 of 3)"),
      "%s", json_string_value(json_object_get(nd, "message")));
  json_decref(notes);
  json_decref(reqs);
  json_decref(end);
  free(id);
  free(b);
}

Test(openai, server_errors_are_retried_with_backoff) {
  ts_fake_start(&fake, NULL, NULL);
  script(json_pack("[o, o, o]", error_step(500, "boom", NULL), error_step(500, "boom again", NULL),
                   ok_step("up")));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *reqs = requests();
  cr_expect_eq(json_array_size(reqs), 3);
  json_t *notes = events_of(id, "turn/notice");
  cr_expect_eq(json_array_size(notes), 2);
  json_decref(notes);
  json_decref(reqs);
  json_decref(end);
  free(id);
  free(b);
}

static void expect_error_turn(json_t *steps, const char *want, const char *also) {
  ts_fake_start(&fake, NULL, NULL);
  script(steps);
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "error");
  cr_expect(strstr(ended_error(end), want), "error: %s (want %s)", ended_error(end), want);
  if (also)
    cr_expect(strstr(ended_error(end), also), "error: %s (want %s)", ended_error(end), also);
  cr_expect_null(strstr(ended_error(end), CANARY), "the key is never in an error");
  json_decref(end);
  free(id);
  free(b);
}

Test(openai, a_rejected_key_names_the_server_not_the_key) {
  expect_error_turn(
      json_pack("[o]", error_step(401, "Incorrect API key provided: " CANARY, "invalid_api_key")),
      "the provider rejected the API key for http://127.0.0.1:", "/v1 (401)");
}

Test(openai, an_unknown_model_names_the_model) {
  expect_error_turn(json_pack("[o]", error_step(404, "The model `m1` does not exist", "model_not_found")),
                    "no model m1", NULL);
}

Test(openai, a_400_says_what_the_server_said) {
  expect_error_turn(json_pack("[o]", error_step(400, "messages: bad role", NULL)),
                    "answered 400: messages: bad role", NULL);
}

Test(openai, a_context_overflow_is_its_own_error) {
  expect_error_turn(json_pack("[o]", error_step(400, "This model's maximum context length is 8192 tokens",
                                                "context_length_exceeded")),
                    "does not fit the model's context window", NULL);
}

Test(openai, a_malformed_stream_line_ends_the_turn_with_the_line_cut) {
  char long_junk[400];
  memset(long_junk, 'z', sizeof long_junk - 1);
  long_junk[sizeof long_junk - 1] = '\0';
  char *raw = NULL;
  cr_assert(asprintf(&raw, "data: {not json %s\n\n", long_junk) > 0);
  json_t *steps = json_pack("[{s:[o, s]}]", "sse", text_chunk("partial "), raw);
  free(raw);
  ts_fake_start(&fake, NULL, NULL);
  script(steps);
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "error");
  const char *e = ended_error(end);
  cr_expect(strstr(e, "malformed stream event: {not json zzz"), "%s", e);
  cr_expect_lt(strlen(e), 320, "the line is cut to 200 bytes: %zu", strlen(e));
  json_t *c = events_of(id, "message/committed");
  cr_expect_eq(json_array_size(c), 1, "the text so far is kept");
  json_decref(c);
  json_decref(end);
  free(id);
  free(b);
}

Test(openai, an_oversized_stream_line_is_refused) {
  size_t n = (4u << 20) + 100;
  char *big = malloc(n + 1);
  memset(big, 'a', n);
  big[n] = '\0';
  json_t *steps = json_pack("[{s:[s]}]", "raw", big);
  free(big);
  expect_error_turn(steps, "longer than 4 MiB", NULL);
}

Test(openai, a_stream_that_breaks_before_output_is_retried_after_output_it_ends_early) {
  ts_fake_start(&fake, NULL, NULL);
  json_t *dropped = sse_step(json_pack("[o, o]", text_chunk("never"), finish_chunk("stop")));
  json_object_set_new(dropped, "drop_after", json_integer(0));
  json_t *broken = sse_step(json_pack("[o, o, o, s]", text_chunk("half an "), text_chunk("answer"),
                                      finish_chunk("stop"), "[DONE]"));
  json_object_set_new(broken, "drop_after", json_integer(1));
  script(json_pack("[o, o, o]", dropped, ok_step("whole"), broken));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "one", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_decref(end);
  end = prompt(id, "two", 2);
  cr_expect_str_eq(ended_reason(end), "error");
  cr_expect(strstr(ended_error(end), "the provider's stream ended early"), "%s", ended_error(end));
  json_t *c = events_of(id, "message/committed");
  cr_assert_eq(json_array_size(c), 2);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(c, 1), "data"), "text")),
                   "half an ");
  json_decref(c);
  json_decref(end);
  free(id);
  free(b);
}

Test(openai, length_and_content_filter_finish_reasons) {
  ts_fake_start(&fake, NULL, NULL);
  script(json_pack("[o, o]",
                   sse_step(json_pack("[o, o, s]", text_chunk("cut"), finish_chunk("length"), "[DONE]")),
                   sse_step(json_pack("[o, s]", finish_chunk("content_filter"), "[DONE]"))));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "one", 1);
  cr_expect_str_eq(ended_reason(end), "max-tokens");
  json_decref(end);
  end = prompt(id, "two", 2);
  cr_expect_str_eq(ended_reason(end), "refusal");
  json_decref(end);
  free(id);
  free(b);
}

Test(openai, a_server_that_rejects_stream_options_is_asked_again_without_and_remembered) {
  ts_fake_start(&fake, NULL, NULL);
  script(json_pack("[o, o, o]",
                   error_step(400, "Unrecognized request argument supplied: stream_options", NULL),
                   ok_step("first"), ok_step("second")));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_t *end = prompt(id, "one", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_decref(end);
  end = prompt(id, "two", 2);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *reqs = requests();
  cr_assert_eq(json_array_size(reqs), 3);
  for (size_t i = 0; i < 3; i++) {
    json_t *body = request_body(reqs, i);
    cr_expect_eq(json_object_get(body, "stream_options") != NULL, i == 0, "request %zu", i);
    json_decref(body);
  }
  json_decref(reqs);
  json_decref(end);
  free(id);
  free(b);
}

static bool has_delta(void *arg) {
  (void)arg;
  return count_bus("session.delta") > 0;
}

Test(openai, cancel_closes_the_connection_at_once_and_ends_the_turn_cancelled) {
  ts_fake_start(&fake, NULL, NULL);
  json_t *events = json_array();
  for (int i = 0; i < 300; i++)
    json_array_append_new(events, text_chunk("tick "));
  json_t *slow = sse_step(events);
  json_object_set_new(slow, "delay_ms", json_integer(50));
  script(json_pack("[o]", slow));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_decref(call_ok("session.prompt", json_pack("{s:s, s:[{s:s, s:s}]}", "sessionId", id, "content", "type",
                                                  "text", "text", "go")));
  cr_assert(ts_run_until_pred(&loop, has_delta, NULL, 10000));
  double cancelled = ts_wall_now();
  json_decref(call_ok("session.cancel", json_pack("{s:s}", "sessionId", id)));
  wait_ctx w = {id, 1};
  cr_assert(ts_run_until_pred(&loop, turns_ended, &w, 10000));
  json_t *e = events_of(id, "turn/ended");
  cr_expect_str_eq(ended_reason(json_object_get(json_array_get(e, 0), "data")), "cancelled");
  cr_expect_eq(json_array_size(e), 1, "ended once");
  json_decref(e);
  double seen = ts_fake_disconnect_time(&fake);
  cr_assert_gt(seen, 0, "the server saw the client go");
  cr_expect_lt(seen - cancelled, 0.2, "the server saw the disconnect %.0f ms after the cancel",
               (seen - cancelled) * 1000);
  free(id);
  free(b);
}

Test(openai, a_wrong_certificate_is_refused_and_a_closed_port_named) {
  char *certs = ts_mkdtemp();
  ts_make_certs(certs);
  char cert[4200], key[4200], ca[4200];
  snprintf(cert, sizeof cert, "%s/cert.pem", certs);
  snprintf(key, sizeof key, "%s/key.pem", certs);
  snprintf(ca, sizeof ca, "%s/ca.pem", certs);
  ts_fake_start(&fake, cert, key);
  script(json_pack("[o]", ok_step("over tls")));
  char *b = base_url();
  /* [provider.fake] trusts the system store: the test CA is not in it. [provider.good] trusts the CA. */
  host_up(b, NULL);
  json_t *good =
      json_pack("{s:s, s:s, s:s, s:s}", "type", "openai", "base_url", b, "model", "m1", "ca_file", ca);
  json_object_set_new(cfg.providers, "good", good);
  int port = ts_free_port();
  char closed[128];
  snprintf(closed, sizeof closed, "http://127.0.0.1:%d/v1", port);
  json_object_set_new(cfg.providers, "closed",
                      json_pack("{s:s, s:s, s:s, s:s}", "type", "openai", "base_url", closed, "model", "m1",
                                "max_retries", "0"));
  json_object_set_new(json_object_get(cfg.providers, "fake"), "max_retries", json_string("0"));
  char *id = session_new();
  json_t *end = prompt(id, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "error");
  cr_expect(strstr(ended_error(end), "TLS"), "%s", ended_error(end));
  json_decref(end);
  json_t *r = call_ok("session.create", json_pack("{s:s, s:s}", "cwd", work, "provider", "good"));
  char *gid = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  end = prompt(gid, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_decref(end);
  r = call_ok("session.create", json_pack("{s:s, s:s}", "cwd", work, "provider", "closed"));
  char *cid = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  end = prompt(cid, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "error");
  char want[64];
  snprintf(want, sizeof want, "cannot connect to http://127.0.0.1:%d", port);
  cr_expect(strstr(ended_error(end), want), "%s", ended_error(end));
  cr_expect(strstr(ended_error(end), closed), "the message names base_url: %s", ended_error(end));
  json_decref(end);
  free(id);
  free(gid);
  free(cid);
  free(b);
  ts_rmtree(certs);
  free(certs);
}

static bool file_has(const char *path, const char *needle) {
  size_t len = 0;
  char *text = ts_read_file(path, &len);
  bool found = text && memmem(text, len, needle, strlen(needle)) != NULL;
  free(text);
  return found;
}

Test(openai, the_key_reaches_no_log_store_export_describe_or_tool_environment) {
  ts_fake_start(&fake, NULL, NULL);
  json_t *r1 = json_pack("[o, o, s]", call_chunk(0, "call_env", "run_command", "{\"command\": \"env\"}"),
                         finish_chunk("tool_calls"), "[DONE]");
  script(json_pack("[o, o]", sse_step(r1), ok_step("done")));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_decref(call_ok("session.set-policy",
                      json_pack("{s:s, s:{s:s}}", "sessionId", id, "policy", "run_command", "allow")));
  json_t *end = prompt(id, "show the environment", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *res = events_of(id, "tool/result");
  cr_assert_eq(json_array_size(res), 1);
  char *rtext = json_dumps(res, 0);
  cr_expect(strstr(rtext, "PATH="), "the tool ran env: %.300s", rtext);
  cr_expect_null(strstr(rtext, CANARY), "not in the tool's environment");
  cr_expect_null(strstr(rtext, "AH_TEST_OPENAI_KEY"), "nor the variable's name");
  free(rtext);
  json_t *exp = call_ok("session.export", json_pack("{s:s}", "sessionId", id));
  char *etext = json_dumps(exp, JSON_ENCODE_ANY);
  cr_expect_null(strstr(etext, CANARY), "not in the export");
  free(etext);
  json_t *desc = ah__host_describe(host);
  char *dtext = json_dumps(desc, 0);
  cr_expect_null(strstr(dtext, CANARY), "not in host.describe");
  free(dtext);
  char *btext = json_dumps(bus, 0);
  cr_expect_null(strstr(btext, CANARY), "not in any event");
  free(btext);
  cr_assert_eq(th_host_stop_free(&loop, host), 0);
  host = NULL;
  char db[4200];
  snprintf(db, sizeof db, "%s/agenthost.db", state);
  cr_expect_not(file_has(db, CANARY), "not in the store");
  char wal[4300];
  snprintf(wal, sizeof wal, "%s-wal", db);
  cr_expect_not(file_has(wal, CANARY), "not in the store's log");
  cr_expect(file_has(log_path, "[provider.fake]") || file_has(log_path, "openai"), "the log was captured");
  cr_expect_not(file_has(log_path, CANARY), "not in the log");
  cr_assert_eq(uv_loop_init(&loop), 0);
  json_decref(desc);
  json_decref(exp);
  json_decref(res);
  json_decref(end);
  free(id);
  free(b);
}

Test(openai, configuration_errors_end_the_turn_saying_what_to_fix) {
  ts_fake_start(&fake, NULL, NULL);
  char *b = base_url();
  host_up(b, NULL);
  char *keyfile = ts_write_file(dir, "key", CANARY "\n");
  chmod(keyfile, 0644);
  json_object_set_new(cfg.providers, "open-key",
                      json_pack("{s:s, s:s, s:s, s:s}", "type", "openai", "base_url", b, "model", "m1",
                                "api_key_file", keyfile));
  json_object_set_new(cfg.providers, "no-env",
                      json_pack("{s:s, s:s, s:s, s:s}", "type", "openai", "base_url", b, "model", "m1",
                                "api_key_env", "AH_TEST_NO_SUCH_VARIABLE"));
  json_object_set_new(cfg.providers, "no-url", json_pack("{s:s, s:s}", "type", "openai", "model", "m1"));
  const char *names[] = {"open-key", "no-env", "no-url"};
  const char *want[] = {"must belong to this user and be readable by no one else",
                        "AH_TEST_NO_SUCH_VARIABLE is not set", "base_url: required"};
  for (size_t i = 0; i < 3; i++) {
    json_t *r = call_ok("session.create", json_pack("{s:s, s:s}", "cwd", work, "provider", names[i]));
    char *sid = strdup(json_string_value(json_object_get(r, "sessionId")));
    json_decref(r);
    json_t *end = prompt(sid, "hello", 1);
    cr_expect_str_eq(ended_reason(end), "error", "%s", names[i]);
    cr_expect(strstr(ended_error(end), want[i]), "%s: %s", names[i], ended_error(end));
    cr_expect_null(strstr(ended_error(end), CANARY));
    json_decref(end);
    free(sid);
  }
  json_t *reqs = requests();
  cr_expect_eq(json_array_size(reqs), 0, "nothing was sent");
  json_decref(reqs);
  free(keyfile);
  free(b);
}

/* ---- an independent server: @dwmkerr/mock-llm (npm, pinned in tests/integration) ------------------------
 */

static const char mock_llm_rules[] =
    "streaming:\n"
    "  chunkSize: 4\n"
    "  chunkIntervalMs: 5\n"
    "rules:\n"
    "  - path: \"/v1/chat/completions\"\n"
    "    method: \"POST\"\n"
    "    match: \"@\"\n"
    "    response:\n"
    "      status: 200\n"
    "      content: |\n"
    "        {\"id\": \"chatcmpl-1\", \"object\": \"chat.completion\", \"model\": \"{{jmes request "
    "body.model}}\",\n"
    "         \"choices\": [{\"index\": 0, \"message\": {\"role\": \"assistant\",\n"
    "         \"content\": \"echo: {{jmes request body.messages[-1].content}}\"}, \"finish_reason\": "
    "\"stop\"}]}\n"
    "  - path: \"/v1/chat/completions\"\n"
    "    method: \"POST\"\n"
    "    match: \"contains(body.messages[-1].content, 'use a tool')\"\n"
    "    response:\n"
    "      status: 200\n"
    "      content: |\n"
    "        {\"id\": \"chatcmpl-2\", \"object\": \"chat.completion\", \"model\": \"mock\",\n"
    "         \"choices\": [{\"index\": 0, \"message\": {\"role\": \"assistant\", \"content\": null,\n"
    "         \"tool_calls\": [{\"id\": \"call_m1\", \"type\": \"function\", \"function\": {\"name\": "
    "\"list_dir\",\n"
    "         \"arguments\": \"{\\\"path\\\": \\\".\\\"}\"}}]}, \"finish_reason\": \"tool_calls\"}],\n"
    "         \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 5, \"total_tokens\": 12}}\n"
    "  - path: \"/v1/chat/completions\"\n"
    "    method: \"POST\"\n"
    "    match: \"body.messages[-1].role == 'tool'\"\n"
    "    response:\n"
    "      status: 200\n"
    "      content: |\n"
    "        {\"id\": \"chatcmpl-3\", \"object\": \"chat.completion\", \"model\": \"mock\",\n"
    "         \"choices\": [{\"index\": 0, \"message\": {\"role\": \"assistant\", \"content\": \"listed\"},\n"
    "         \"finish_reason\": \"stop\"}]}\n";

static pid_t mock_pid;

static int mock_llm_start(void) {
  const char *src = getenv("AH_TEST_SOURCE_ROOT");
  char main_js[4096], rules[4096], err[4096];
  snprintf(main_js, sizeof main_js, "%s/tests/integration/node_modules/@dwmkerr/mock-llm/dist/main.js", src);
  cr_assert_eq(access(main_js, R_OK), 0, "mock-llm is installed by the test set-up (npm ci): %s", main_js);
  char *f = ts_write_file(dir, "mock-llm.yaml", mock_llm_rules);
  snprintf(rules, sizeof rules, "%s", f);
  free(f);
  snprintf(err, sizeof err, "%s/mock-llm.log", dir);
  int port = ts_free_port();
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  setenv("PORT", ps, 1);
  setenv("HOST", "127.0.0.1", 1);
  char *argv[] = {"/usr/bin/node", main_js, "--config", rules, NULL};
  mock_pid = ts_spawn(argv, err, err);
  cr_assert_gt(mock_pid, 0);
  for (int i = 0; i < 300; i++) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in to = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = connect(c, (struct sockaddr *)&to, sizeof to);
    close(c);
    if (ok == 0)
      return port;
    usleep(50 * 1000);
  }
  cr_assert_fail("mock-llm did not listen on %d", port);
  return 0;
}

Test(openai, mock_llm_streams_a_plain_answer_and_answers_a_whole_tool_call) {
  int port = mock_llm_start();
  char b[128];
  snprintf(b, sizeof b, "http://127.0.0.1:%d/v1", port);
  host_up(b, NULL);
  json_object_set_new(cfg.providers, "whole",
                      json_pack("{s:s, s:s, s:s, s:s}", "type", "openai", "base_url", b, "model",
                                "mock-model", "stream", "false"));
  char *id = session_new();
  json_t *end = prompt(id, "plain words here", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *c = events_of(id, "message/committed");
  cr_assert_eq(json_array_size(c), 1);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(c, 0), "data"), "text")),
                   "echo: plain words here");
  cr_expect_gt(count_bus("session.delta"), 3, "mock-llm streamed it in 4-character chunks");
  json_decref(c);
  json_decref(end);
  json_t *r = call_ok("session.create", json_pack("{s:s, s:s}", "cwd", work, "provider", "whole"));
  char *wid = strdup(json_string_value(json_object_get(r, "sessionId")));
  json_decref(r);
  end = prompt(wid, "please use a tool", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *calls = events_of(wid, "tool/call");
  cr_assert_eq(json_array_size(calls), 1);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(json_array_get(calls, 0), "data"), "name")),
      "list_dir");
  json_t *res = events_of(wid, "tool/result");
  cr_expect_eq(json_array_size(res), 1);
  c = events_of(wid, "message/committed");
  cr_assert_eq(json_array_size(c), 1);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(c, 0), "data"), "text")),
                   "listed");
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(end, "usage"), "requests")), 2);
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(end, "usage"), "inputTokens")), 7);
  json_decref(c);
  json_decref(res);
  json_decref(calls);
  json_decref(end);
  free(id);
  free(wid);
  ts_stop(mock_pid, SIGTERM, 5000);
}

/* ---- discovery -------------------------------------------------------------------------------------- */

Test(openai, providers_and_their_models_are_listed_without_secrets) {
  ts_fake_start(&fake, NULL, NULL);
  script(json_pack("[{s:{s:[{s:s, s:s}, {s:s}]}}, {s:i, s:{s:{s:s}}}]", "json", "data", "id", "m1",
                   "owned_by", "me", "id", "m2", "status", 401, "json", "error", "message", "bad key"));
  char *b = base_url();
  host_up(b, json_pack("{s:s}", "models", "m1, m2 ,m3"));
  ts_outcome o;
  cr_assert_eq(th_call(&loop, host, AH_AUTH_LAN, "provider.list", json_object(), &o), 0);
  cr_assert_eq(o.status, 0, "public: %s", o.message ? o.message : "");
  char *text = json_dumps(o.result, JSON_COMPACT | JSON_SORT_KEYS);
  cr_expect_str_eq(
      text, "{\"providers\":[{\"available\":true,\"default\":true,\"models\":[],\"name\":\"echo\",\"type\":"
            "\"echo\"},{\"available\":true,\"default\":false,\"key\":\"env\",\"keyEnv\":"
            "\"AH_TEST_OPENAI_KEY\",\"keyReady\":true,\"model\":\"m1\",\"models\":[\"m1\",\"m2\","
            "\"m3\"],\"name\":\"fake\",\"type\":\"openai\"}]}");
  free(text);
  th_outcome_clear(&o);
  memset(&o, 0, sizeof o);
  int rc = th_call(&loop, host, AH_AUTH_LAN, "provider.models", json_pack("{s:s}", "provider", "fake"), &o);
  cr_expect(rc == AH_EPERM || (rc == 0 && o.status == AH_EPERM), "privileged: %d %d", rc, o.status);
  if (rc == 0)
    th_outcome_clear(&o);
  json_t *r = call_ok("provider.models", json_pack("{s:s}", "provider", "fake"));
  text = json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS);
  cr_expect_str_eq(text, "{\"models\":[{\"id\":\"m1\",\"ownedBy\":\"me\"},{\"id\":\"m2\"}]}");
  free(text);
  json_decref(r);
  json_t *reqs = requests();
  json_t *q = json_array_get(reqs, 0);
  cr_expect_str_eq(json_string_value(json_object_get(q, "method")), "GET");
  cr_expect_str_eq(json_string_value(json_object_get(q, "path")), "/v1/models");
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(q, "headers"), "authorization")),
                   "Bearer " CANARY);
  json_decref(reqs);
  cr_assert_eq(
      th_call(&loop, host, AH_AUTH_ADMIN, "provider.models", json_pack("{s:s}", "provider", "fake"), &o), 0);
  cr_expect_eq(o.status, AH_EPERM, "a rejected key");
  cr_expect(o.message && strstr(o.message, "rejected the API key"), "%s", o.message ? o.message : "");
  th_outcome_clear(&o);
  cr_assert_eq(
      th_call(&loop, host, AH_AUTH_ADMIN, "provider.models", json_pack("{s:s}", "provider", "echo"), &o), 0);
  cr_expect_eq(o.status, AH_EUNAVAILABLE, "echo lists no models");
  th_outcome_clear(&o);
  cr_assert_eq(
      th_call(&loop, host, AH_AUTH_ADMIN, "provider.models", json_pack("{s:s}", "provider", "nope"), &o), 0);
  cr_expect_eq(o.status, AH_ENOENT);
  th_outcome_clear(&o);
  free(b);
}

/* ---- a host without the HTTP client, and a context window -----------------------------------------------
 */

static char nohttp_log[512];
static void nohttp_logf(ah_mount *m, int level, const char *fmt, ...) {
  (void)m;
  (void)level;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(nohttp_log, sizeof nohttp_log, fmt, ap);
  va_end(ap);
}

/* A host built without the `http` feature leaves http_start NULL (so does a 1.3 host, whose table ends
 * before it): the plugin refuses to mount, saying why, and calls nothing absent. */
Test(openai, without_the_http_client_the_plugin_refuses_to_mount_saying_why) {
  char path[4096];
  snprintf(path, sizeof path, "%s/plugins/openai/openai.so", getenv("AH_TEST_BUILD_ROOT"));
  void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(so, "%s", dlerror());
  ah_plugin_entry_fn entry = (ah_plugin_entry_fn)dlsym(so, AH_PLUGIN_ENTRY_SYMBOL);
  cr_assert_not_null(entry);
  const ah_plugin_desc *d = entry(AH_ABI_VERSION);
  cr_assert_not_null(d);
  ah_host_api table = ah__api_table;
  table.log = nohttp_logf;
  table.http_start = NULL;
  table.http_abort = NULL;
  json_t *cfg = json_object();
  void *state = NULL;
  cr_expect_eq(d->mount(NULL, &table, cfg, &state), AH_EUNAVAILABLE);
  cr_expect_null(state);
  cr_expect(strstr(nohttp_log, "no HTTP client"), "%s", nohttp_log);
  ah_host_api v13 = ah__api_table;
  v13.log = nohttp_logf;
  v13.struct_size = (uint32_t)offsetof(ah_host_api, http_start); /* a 1.3 table */
  nohttp_log[0] = '\0';
  cr_expect_eq(d->mount(NULL, &v13, cfg, &state), AH_EUNAVAILABLE);
  cr_expect(strstr(nohttp_log, "no HTTP client"), "%s", nohttp_log);
  json_decref(cfg);
  dlclose(so);
}

Test(openai, a_context_window_leaves_out_the_oldest_exchanges_and_says_so) {
  ts_fake_start(&fake, NULL, NULL);
  script(json_pack("[o]", ok_step("short answer")));
  char *b = base_url();
  host_up(b, json_pack("{s:s}", "context_window", "1200"));
  char *id = session_new();
  char big[1200];
  memset(big, 'q', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  json_t *end = prompt(id, big, 1); /* about 300 tokens; the tools offered take about 850 */
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_decref(end);
  end = prompt(id, big, 2);
  json_decref(end);
  end = prompt(id, "the third", 3);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *notes = events_of(id, "turn/notice");
  cr_assert_geq(json_array_size(notes), 1, "the cut is recorded");
  json_t *nd = json_object_get(json_array_get(notes, json_array_size(notes) - 1), "data");
  cr_expect_str_eq(json_string_value(json_object_get(nd, "kind")), "history-cut");
  cr_expect_gt(json_integer_value(json_object_get(nd, "dropped")), 0);
  json_t *reqs = requests();
  json_t *body = request_body(reqs, json_array_size(reqs) - 1);
  json_t *msgs = json_object_get(body, "messages");
  cr_expect_str_eq(
      json_string_value(json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "content")),
      "the third", "the current prompt stays");
  char *text = json_dumps(body, JSON_COMPACT);
  cr_expect_leq(strlen(text) / 4, 1200, "what was sent fits: %zu bytes", strlen(text));
  free(text);
  json_decref(body);
  json_decref(reqs);
  json_decref(notes);
  json_decref(end);
  free(id);
  free(b);
}

/* ---- the rest of [provider.NAME] ------------------------------------------------------------------------
 */

Test(openai, temperature_max_tokens_system_prompt_and_headers_are_sent_and_unknown_keys_warned) {
  ts_fake_start(&fake, NULL, NULL);
  script(json_pack("[o]", ok_step("configured")));
  char *sp = ts_write_file(dir, "system.txt", "You are terse.");
  char *b = base_url();
  host_up(b, json_pack("{s:s, s:s, s:s, s:s, s:s}", "temperature", "0.25", "max_tokens", "321",
                       "system_prompt_file", sp, "headers", "X-Team: core, HTTP-Referer: https://example.org",
                       "frobnicate", "1"));
  char *id = session_new();
  json_t *end = prompt(id, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *reqs = requests();
  json_t *h = json_object_get(json_array_get(reqs, 0), "headers");
  cr_expect_str_eq(json_string_value(json_object_get(h, "x-team")), "core");
  cr_expect_str_eq(json_string_value(json_object_get(h, "http-referer")), "https://example.org");
  json_t *body = request_body(reqs, 0);
  cr_expect(json_real_value(json_object_get(body, "temperature")) > 0.24 &&
            json_real_value(json_object_get(body, "temperature")) < 0.26);
  cr_expect_eq(json_integer_value(json_object_get(body, "max_tokens")), 321);
  json_t *first = json_array_get(json_object_get(body, "messages"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(first, "role")), "system");
  cr_expect_str_eq(json_string_value(json_object_get(first, "content")), "You are terse.");
  fsync(log_fd);
  cr_expect(file_has(log_path, "[provider.fake]: unknown key frobnicate"), "the unknown key is logged");
  json_decref(body);
  json_decref(reqs);
  json_decref(end);
  free(id);
  free(sp);
  free(b);
}

Test(openai, max_steps_bounds_the_round_trips_of_a_turn) {
  ts_fake_start(&fake, NULL, NULL);
  json_t *loop_step = sse_step(json_pack("[o, o, s]", call_chunk(0, "again", "list_dir", "{\"path\": \".\"}"),
                                         finish_chunk("tool_calls"), "[DONE]"));
  script(json_pack("[o]", loop_step)); /* the last step repeats: the model never stops calling */
  char *b = base_url();
  host_up(b, json_pack("{s:s}", "max_steps", "3"));
  char *id = session_new();
  json_t *end = prompt(id, "loop", 1);
  cr_expect_str_eq(ended_reason(end), "error");
  cr_expect(strstr(ended_error(end), "3 round trips without finishing (max_steps)"), "%s", ended_error(end));
  json_t *reqs = requests();
  cr_expect_eq(json_array_size(reqs), 3);
  json_decref(reqs);
  json_decref(end);
  free(id);
  free(b);
}

static bool notice_seen(void *arg) {
  json_t *n = events_of(arg, "turn/notice");
  bool ok = json_array_size(n) > 0;
  json_decref(n);
  return ok;
}

Test(openai, cancel_interrupts_a_retry_wait_and_an_http_date_is_honoured) {
  ts_fake_start(&fake, NULL, NULL);
  json_t *limited = error_step(429, "wait a long time", NULL);
  json_object_set_new(limited, "headers", json_pack("{s:s}", "Retry-After", "30"));
  script(json_pack("[o]", limited));
  char *b = base_url();
  host_up(b, NULL);
  char *id = session_new();
  json_decref(call_ok("session.prompt", json_pack("{s:s, s:[{s:s, s:s}]}", "sessionId", id, "content", "type",
                                                  "text", "text", "go")));
  cr_assert(ts_run_until_pred(&loop, notice_seen, id, 10000), "the retry wait began");
  uint64_t t0 = ts_now_ms();
  json_decref(call_ok("session.cancel", json_pack("{s:s}", "sessionId", id)));
  wait_ctx w = {id, 1};
  cr_assert(ts_run_until_pred(&loop, turns_ended, &w, 10000));
  cr_expect_lt(ts_now_ms() - t0, 2000, "not after the 30 s wait");
  json_t *e = events_of(id, "turn/ended");
  cr_expect_str_eq(ended_reason(json_object_get(json_array_get(e, 0), "data")), "cancelled");
  json_decref(e);
  /* Retry-After as an HTTP date two seconds ahead */
  char date[64];
  time_t when = time(NULL) + 2;
  struct tm tm;
  gmtime_r(&when, &tm);
  strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  json_t *dated = error_step(503, "later", NULL);
  json_object_set_new(dated, "headers", json_pack("{s:s}", "Retry-After", date));
  script(json_pack("[o, o]", dated, ok_step("after the date")));
  json_t *end = prompt(id, "again", 2);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *notes = events_of(id, "turn/notice");
  json_int_t wait =
      json_integer_value(json_object_get(json_object_get(json_array_get(notes, 1), "data"), "waitMs"));
  cr_expect(wait >= 1000 && wait <= 2000, "the wait runs to the date: %lld ms", (long long)wait);
  json_decref(notes);
  json_decref(end);
  free(id);
  free(b);
}

Test(openai, a_plugin_tool_is_offered_with_its_json_schema) {
  ts_fake_start(&fake, NULL, NULL);
  script(json_pack("[o]", ok_step("seen")));
  char *b = base_url();
  host_up(b, NULL);
  cr_assert_eq(th_load(host, "tools", NULL), 0);
  char *id = session_new();
  json_t *end = prompt(id, "hello", 1);
  cr_expect_str_eq(ended_reason(end), "end", "%s", ended_error(end));
  json_t *reqs = requests();
  json_t *body = request_body(reqs, 0);
  json_t *fn = NULL;
  size_t i = 0;
  json_t *tl = NULL;
  json_array_foreach(json_object_get(body, "tools"), i, tl) {
    json_t *f = json_object_get(tl, "function");
    if (strcmp(json_string_value(json_object_get(f, "name")), "fx_add") == 0)
      fn = f;
  }
  cr_assert_not_null(fn, "the plugin's tool is offered");
  cr_expect_str_eq(json_string_value(json_object_get(fn, "description")), "Add two numbers.");
  json_t *want = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}, s:[s, s]}", "type", "object", "properties", "a",
                           "type", "number", "b", "type", "number", "required", "a", "b");
  cr_expect(json_equal(json_object_get(fn, "parameters"), want), "its schema is the plugin's");
  json_decref(want);
  json_decref(body);
  json_decref(reqs);
  json_decref(end);
  free(id);
  free(b);
}
