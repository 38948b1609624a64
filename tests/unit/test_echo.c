/* Unit tests for host/providers/echo.c: the embedded "echo" provider. A fake sink records every call in
 * order as one line of text ("delta echo: hi", "end end {...} -"), and the tests compare whole sequences.
 * Use-after-free (turn_free from inside end) is caught by ASan in the sanitizer build. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "agenthost/errors.h"
#include "providers/echo.h"
#include "support.h"

#define MAX_EVENTS 64

typedef struct fx {
  uv_loop_t loop;
  ah_provider *p;
  ah_provider_turn *turn;
  ah_turn_sink sink;
  char *ev[MAX_EVENTS];
  int n;
  volatile bool ended;
  volatile bool waiting; /* a tool_call, ask or subagent arrived */
  int ends;
  int after_end;        /* sink calls after end */
  bool in_call;         /* inside turn_start or another call into the provider */
  int sync_calls;       /* sink calls made while in_call */
  bool free_in_end;     /* the end callback frees the turn, as the agent does */
  bool cancel_in_delta; /* the first delta callback cancels the turn */
  bool ask_options_null;
  uint64_t end_ms;
  /* Long texts: deltas are collected (not recorded), commits kept whole. */
  bool collect;
  char *acc;
  size_t acc_n;
  size_t max_delta;
  int deltas;
  bool delta_not_utf8;    /* a delta was cut inside a character */
  char *committed;        /* what commit() got */
  json_t *committed_json; /* what commit_json() got */
} fx;

static void record(fx *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void record(fx *f, const char *fmt, ...) {
  if (f->in_call)
    f->sync_calls++;
  if (f->ends > 0)
    f->after_end++;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  cr_assert_lt(f->n, MAX_EVENTS, "too many sink calls");
  f->ev[f->n++] = strdup(buf);
}

static char *compact(const json_t *v) {
  return v ? json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : strdup("NULL");
}

static void sink_delta(void *ctx, const char *text) {
  fx *f = ctx;
  if (f->collect) {
    size_t n = strlen(text);
    f->deltas++;
    f->max_delta = n > f->max_delta ? n : f->max_delta;
    json_t *valid = json_stringn(text, n); /* NULL for a cut inside a character */
    f->delta_not_utf8 = f->delta_not_utf8 || !valid;
    json_decref(valid);
    f->acc = realloc(f->acc, f->acc_n + n + 1);
    memcpy(f->acc + f->acc_n, text, n + 1);
    f->acc_n += n;
    return;
  }
  record(f, "delta %s", text);
  if (f->cancel_in_delta) {
    f->cancel_in_delta = false;
    f->p->turn_cancel(f->turn);
  }
}

static void sink_commit(void *ctx, const char *text) {
  fx *f = ctx;
  if (f->collect) {
    free(f->committed);
    f->committed = strdup(text);
    return;
  }
  record(ctx, "commit %s", text);
}

static void sink_commit_json(void *ctx, json_t *text) {
  fx *f = ctx;
  json_decref(f->committed_json);
  f->committed_json = text;
}

static void sink_tool_call(void *ctx, const char *call_id, const char *name, const json_t *args) {
  fx *f = ctx;
  char *a = compact(args);
  record(f, "tool_call %s %s %s", call_id, name, a);
  free(a);
  f->waiting = true;
}

static void sink_ask(void *ctx, const char *question, const json_t *options) {
  fx *f = ctx;
  f->ask_options_null = options == NULL;
  record(f, "ask %s", question);
  f->waiting = true;
}

static void sink_subagent(void *ctx, const char *prompt) {
  fx *f = ctx;
  record(f, "subagent %s", prompt);
  f->waiting = true;
}

static void sink_end(void *ctx, const char *reason, const json_t *usage, const char *error) {
  fx *f = ctx;
  char *u = compact(usage);
  record(f, "end %s %s %s", reason, u, error ? error : "-");
  free(u);
  f->ends++;
  f->ended = true;
  f->end_ms = ts_now_ms();
  if (f->free_in_end) {
    f->p->turn_free(f->turn);
    f->turn = NULL;
  }
}

static void fx_init(fx *f) {
  memset(f, 0, sizeof *f);
  cr_assert_eq(uv_loop_init(&f->loop), 0);
  f->p = ah__echo_provider_new(&f->loop);
  cr_assert_not_null(f->p);
  cr_assert_str_eq(f->p->name, "echo");
  f->sink = (ah_turn_sink){.struct_size = sizeof(ah_turn_sink),
                           .delta = sink_delta,
                           .commit = sink_commit,
                           .tool_call = sink_tool_call,
                           .ask = sink_ask,
                           .subagent = sink_subagent,
                           .end = sink_end};
}

/* Start a turn on `content` (stolen). Asserts nothing reached the sink from inside turn_start. */
static int fx_start_content(fx *f, json_t *content) {
  ah_turn_input in = {.struct_size = sizeof in,
                      .session_id = "s1",
                      .cwd = "/",
                      .model = NULL,
                      .content = content,
                      .tools = NULL,
                      .max_tokens = 0,
                      .depth = 0};
  f->in_call = true;
  int rc = f->p->turn_start(f->p, &in, &f->sink, f, &f->turn);
  f->in_call = false;
  json_decref(content);
  cr_expect_eq(f->n, 0, "turn_start called the sink");
  return rc;
}

static void fx_start(fx *f, const char *text) {
  cr_assert_eq(fx_start_content(f, json_pack("[{s:s,s:s}]", "type", "text", "text", text)), 0);
}

static void fx_run(fx *f) {
  cr_assert(ts_run_until(&f->loop, &f->ended, 5000), "the turn did not end");
}

static void fx_wait(fx *f) {
  cr_assert(ts_run_until(&f->loop, &f->waiting, 5000), "no tool_call/ask/subagent arrived");
  f->waiting = false;
}

/* Run the loop `ms` more, so that anything the provider still wrongly does shows up. */
static void fx_settle(fx *f, uint64_t ms) {
  volatile bool never = false;
  ts_run_until(&f->loop, &never, ms);
}

static void fx_finish(fx *f) {
  fx_settle(f, 20);
  if (f->turn)
    f->p->turn_free(f->turn);
  f->turn = NULL;
  ah__echo_provider_free(f->p);
  cr_expect_eq(f->after_end, 0, "sink called after end");
  cr_expect_eq(f->sync_calls, 0, "sink called synchronously from a call into the provider");
  cr_expect_leq(f->ends, 1, "end called more than once");
  for (int i = 0; i < f->n; i++)
    free(f->ev[i]);
  free(f->acc);
  free(f->committed);
  json_decref(f->committed_json);
  cr_assert_eq(ts_loop_close(&f->loop), 0);
}

/* The usage object for a prompt of `in` bytes and `out` committed bytes, as recorded. */
static const char *usage(size_t in, size_t out) {
  static char buf[4][96];
  static int next;
  char *b = buf[next++ % 4];
  snprintf(b, sizeof buf[0], "{\"inputTokens\":%zu,\"outputTokens\":%zu}", (in + 3) / 4, (out + 3) / 4);
  return b;
}

static void expect_events(fx *f, int n, ...) {
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n && i < f->n; i++) {
    const char *want = va_arg(ap, const char *);
    cr_expect_str_eq(f->ev[i], want, "event %d", i);
  }
  va_end(ap);
  cr_expect_eq(f->n, n, "number of sink calls");
  for (int i = 0; i < f->n; i++)
    cr_log_info("event %d: %s", i, f->ev[i]);
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  static char buf[8][512];
  static int next;
  char *b = buf[next++ % 8];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, sizeof buf[0], f, ap);
  va_end(ap);
  return b;
}

/* A tool result, answer or subagent result delivered from outside any sink call. */
#define DELIVER(f, call)  \
  do {                    \
    (f)->in_call = true;  \
    call;                 \
    (f)->in_call = false; \
  } while (0)

/* ---- plain text ---------------------------------------------------------------------------------------- */

Test(echo, plain_echo_streams_commits_and_ends) {
  fx f;
  fx_init(&f);
  fx_start(&f, "hello");
  fx_run(&f);
  expect_events(&f, 3, "delta echo: hello", "commit echo: hello",
                fmt("end end %s -", usage(strlen("hello"), strlen("echo: hello"))));
  cr_expect_str_eq(usage(5, 11), "{\"inputTokens\":2,\"outputTokens\":3}");
  fx_finish(&f);
}

Test(echo, multi_line_text_keeps_inner_lines_and_trims_blank_edges) {
  fx f;
  fx_init(&f);
  const char *prompt = "\n  \nline one\n\nline two\n\n";
  fx_start(&f, prompt);
  fx_run(&f);
  const char *echo = "echo: line one\n\nline two";
  expect_events(&f, 3, fmt("delta %s", echo), fmt("commit %s", echo),
                fmt("end end %s -", usage(strlen(prompt), strlen(echo))));
  fx_finish(&f);
}

Test(echo, empty_prompt_commits_bare_echo) {
  fx f;
  fx_init(&f);
  fx_start(&f, "");
  fx_run(&f);
  expect_events(&f, 3, "delta echo: ", "commit echo: ", fmt("end end %s -", usage(0, 6)));
  fx_finish(&f);
}

Test(echo, resource_link_is_rendered_as_markdown_link) {
  fx f;
  fx_init(&f);
  json_t *content = json_pack("[{s:s,s:s},{s:s,s:s,s:s},{s:s,s:s}]", "type", "text", "text", "see ", "type",
                              "resource_link", "uri", "file:///tmp/a.txt", "name", "a.txt", "type", "text",
                              "text", " please");
  cr_assert_eq(fx_start_content(&f, content), 0);
  fx_run(&f);
  const char *prompt = "see [a.txt](file:///tmp/a.txt) please";
  expect_events(&f, 3, fmt("delta echo: %s", prompt), fmt("commit echo: %s", prompt),
                fmt("end end %s -", usage(strlen(prompt), strlen(prompt) + 6)));
  fx_finish(&f);
}

Test(echo, invalid_content_is_refused_without_sink_calls) {
  fx f;
  fx_init(&f);
  cr_expect_eq(fx_start_content(&f, json_string("hello")), AH_EINVAL);
  cr_expect_eq(fx_start_content(&f, json_pack("[{s:s}]", "type", "text")), AH_EINVAL);
  cr_expect_eq(fx_start_content(&f, json_pack("[{s:s}]", "type", "resource_link")), AH_EINVAL);
  cr_expect_eq(fx_start_content(&f, json_pack("[i]", 3)), AH_EINVAL);
  f.turn = NULL;
  fx_settle(&f, 20);
  expect_events(&f, 0);
  fx_finish(&f);
}

/* ---- /chunks ------------------------------------------------------------------------------------------- */

Test(echo, chunks_splits_into_n_deltas_that_add_up) {
  fx f;
  fx_init(&f);
  const char *prompt = "/chunks 3\nabcdef";
  fx_start(&f, prompt);
  fx_run(&f);
  expect_events(&f, 5, "delta echo", "delta : ab", "delta cdef", "commit echo: abcdef",
                fmt("end end %s -", usage(strlen(prompt), 12)));
  fx_finish(&f);
}

Test(echo, chunks_never_split_a_utf8_character) {
  fx f;
  fx_init(&f);
  /* "echo: héllo wörld ✓" has 19 characters: cuts at characters 4, 9 and 14. */
  const char *prompt = "/chunks 4\nh\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93";
  fx_start(&f, prompt);
  fx_run(&f);
  const char *echo = "echo: h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93";
  expect_events(&f, 6, "delta echo", "delta : h\xc3\xa9l", "delta lo w\xc3\xb6", "delta rld \xe2\x9c\x93",
                fmt("commit %s", echo), fmt("end end %s -", usage(strlen(prompt), strlen(echo))));
  fx_finish(&f);
}

Test(echo, chunks_multibyte_only_text_and_more_chunks_than_characters) {
  fx f;
  fx_init(&f);
  /* Seven 3-byte characters after "echo: " (13 characters): 1000 chunks give 13 one-character deltas. */
  const char *text = "\xe2\x9c\x93\xe2\x9c\x93\xe2\x9c\x93\xe2\x9c\x93\xe2\x9c\x93\xe2\x9c\x93\xe2\x9c\x93";
  char *prompt = strdup(fmt("/chunks 1000\n%s", text));
  fx_start(&f, prompt);
  fx_run(&f);
  cr_assert_eq(f.n, 15);
  char joined[256] = "";
  for (int i = 0; i < 13; i++) {
    cr_assert_eq(strncmp(f.ev[i], "delta ", 6), 0, "event %d: %s", i, f.ev[i]);
    const char *d = f.ev[i] + 6;
    size_t expect_len = i < 6 ? 1 : 3;
    cr_expect_eq(strlen(d), expect_len, "delta %d is one whole character", i);
    cr_expect_neq((unsigned char)d[0] & 0xC0, 0x80, "delta %d starts inside a character", i);
    strcat(joined, d);
  }
  cr_expect_str_eq(joined, fmt("echo: %s", text));
  cr_expect_str_eq(f.ev[13], fmt("commit echo: %s", text));
  cr_expect_str_eq(f.ev[14], fmt("end end %s -", usage(strlen(prompt), 6 + strlen(text))));
  free(prompt);
  fx_finish(&f);
}

/* ---- /sleep, /fail, /max-tokens, /refuse --------------------------------------------------------------- */

Test(echo, sleep_waits_before_the_echo) {
  fx f;
  fx_init(&f);
  uint64_t t0 = ts_now_ms();
  const char *prompt = "/sleep 100\nawake";
  fx_start(&f, prompt);
  fx_run(&f);
  cr_expect_geq(f.end_ms - t0, 100, "ended after %llu ms", (unsigned long long)(f.end_ms - t0));
  expect_events(&f, 3, "delta echo: awake", "commit echo: awake",
                fmt("end end %s -", usage(strlen(prompt), strlen("echo: awake"))));
  fx_finish(&f);
}

Test(echo, fail_ends_with_error_and_message) {
  fx f;
  fx_init(&f);
  const char *prompt = "hello\n/fail disk on fire";
  fx_start(&f, prompt);
  fx_run(&f);
  expect_events(&f, 1, fmt("end error %s disk on fire", usage(strlen(prompt), 0)));
  fx_finish(&f);
}

Test(echo, max_tokens_ends_after_the_echo) {
  fx f;
  fx_init(&f);
  const char *prompt = "/max-tokens\nlong story";
  fx_start(&f, prompt);
  fx_run(&f);
  expect_events(&f, 3, "delta echo: long story", "commit echo: long story",
                fmt("end max-tokens %s -", usage(strlen(prompt), strlen("echo: long story"))));
  fx_finish(&f);
}

Test(echo, refuse_ends_at_once_with_nothing_committed) {
  fx f;
  fx_init(&f);
  const char *prompt = "/tool never {}\nhello\n/refuse";
  fx_start(&f, prompt);
  fx_run(&f);
  expect_events(&f, 1, fmt("end refusal %s -", usage(strlen(prompt), 0)));
  fx_finish(&f);
}

/* ---- /tool, /ask, /subagent ---------------------------------------------------------------------------- */

Test(echo, tool_result_is_committed_then_text_echoed) {
  fx f;
  fx_init(&f);
  const char *prompt = "/tool weather {\"city\": \"Oslo\"}\nhello";
  fx_start(&f, prompt);
  fx_wait(&f);
  expect_events(&f, 1, "tool_call call_1 weather {\"city\":\"Oslo\"}");
  json_t *result = json_pack("{s:i,s:s}", "temp", 3, "sky", "grey");
  DELIVER(&f, f.p->turn_tool_result(f.turn, "call_1", result, false));
  json_decref(result);
  fx_run(&f);
  const char *c = "tool weather: {\"temp\":3,\"sky\":\"grey\"}";
  expect_events(&f, 5, "tool_call call_1 weather {\"city\":\"Oslo\"}", fmt("commit %s", c),
                "delta echo: hello", "commit echo: hello",
                fmt("end end %s -", usage(strlen(prompt), strlen(c) + strlen("echo: hello"))));
  fx_finish(&f);
}

Test(echo, tool_error_result_is_committed_as_failure_without_echo) {
  fx f;
  fx_init(&f);
  const char *prompt = "/tool fetch";
  fx_start(&f, prompt);
  fx_wait(&f);
  json_t *err = json_string("no network");
  DELIVER(&f, f.p->turn_tool_result(f.turn, "call_1", err, true));
  json_decref(err);
  fx_run(&f);
  const char *c = "tool fetch failed: no network";
  expect_events(&f, 3, "tool_call call_1 fetch {}", fmt("commit %s", c),
                fmt("end end %s -", usage(strlen(prompt), strlen(c))));
  fx_finish(&f);
}

Test(echo, tool_result_with_wrong_call_id_is_ignored) {
  fx f;
  fx_init(&f);
  fx_start(&f, "/tool a {}");
  fx_wait(&f);
  json_t *r = json_true();
  DELIVER(&f, f.p->turn_tool_result(f.turn, "call_9", r, false));
  fx_settle(&f, 30);
  expect_events(&f, 1, "tool_call call_1 a {}");
  DELIVER(&f, f.p->turn_tool_result(f.turn, "call_1", r, false));
  fx_run(&f);
  expect_events(&f, 3, "tool_call call_1 a {}", "commit tool a: true",
                fmt("end end %s -", usage(10, strlen("tool a: true"))));
  fx_finish(&f);
}

Test(echo, ask_answered_commits_the_answer) {
  fx f;
  fx_init(&f);
  const char *prompt = "/ask Shall I go on?";
  fx_start(&f, prompt);
  fx_wait(&f);
  cr_expect(f.ask_options_null, "ask options must be NULL");
  json_t *a = json_string("yes");
  DELIVER(&f, f.p->turn_answer(f.turn, a, false));
  json_decref(a);
  fx_run(&f);
  expect_events(&f, 3, "ask Shall I go on?", "commit answer: yes",
                fmt("end end %s -", usage(strlen(prompt), strlen("answer: yes"))));
  fx_finish(&f);
}

Test(echo, ask_cancelled_ends_the_turn_cancelled) {
  fx f;
  fx_init(&f);
  const char *prompt = "/ask Shall I go on?\nhello";
  fx_start(&f, prompt);
  fx_wait(&f);
  DELIVER(&f, f.p->turn_answer(f.turn, NULL, true));
  fx_run(&f);
  expect_events(&f, 2, "ask Shall I go on?", fmt("end cancelled %s -", usage(strlen(prompt), 0)));
  fx_finish(&f);
}

Test(echo, subagent_result_is_committed) {
  fx f;
  fx_init(&f);
  const char *prompt = "/subagent summarise the README";
  fx_start(&f, prompt);
  fx_wait(&f);
  DELIVER(&f, f.p->turn_subagent_result(f.turn, "a short summary", "end"));
  fx_run(&f);
  const char *c = "subagent: a short summary";
  expect_events(&f, 3, "subagent summarise the README", fmt("commit %s", c),
                fmt("end end %s -", usage(strlen(prompt), strlen(c))));
  fx_finish(&f);
}

Test(echo, two_directives_run_in_order) {
  fx f;
  fx_init(&f);
  const char *prompt = "/tool a {\"x\":1}\nfirst\n/tool b\n/ask Q?\nsecond";
  fx_start(&f, prompt);
  fx_wait(&f);
  json_t *one = json_integer(1);
  DELIVER(&f, f.p->turn_tool_result(f.turn, "call_1", one, false));
  json_decref(one);
  fx_wait(&f);
  json_t *two = json_string("two");
  DELIVER(&f, f.p->turn_tool_result(f.turn, "call_2", two, false));
  json_decref(two);
  fx_wait(&f);
  json_t *ans = json_pack("{s:b}", "ok", 1);
  DELIVER(&f, f.p->turn_answer(f.turn, ans, false));
  json_decref(ans);
  fx_run(&f);
  const char *echo = "echo: first\nsecond";
  size_t out =
      strlen("tool a: 1") + strlen("tool b: \"two\"") + strlen("answer: {\"ok\":true}") + strlen(echo);
  expect_events(&f, 9, "tool_call call_1 a {\"x\":1}", "commit tool a: 1", "tool_call call_2 b {}",
                "commit tool b: \"two\"", "ask Q?", "commit answer: {\"ok\":true}", fmt("delta %s", echo),
                fmt("commit %s", echo), fmt("end end %s -", usage(strlen(prompt), out)));
  fx_finish(&f);
}

Test(echo, unknown_slash_word_is_echoed_as_text) {
  fx f;
  fx_init(&f);
  const char *prompt = "/usr/bin is a path\n/sleepy cat\n/";
  fx_start(&f, prompt);
  fx_run(&f);
  const char *echo = "echo: /usr/bin is a path\n/sleepy cat\n/";
  expect_events(&f, 3, fmt("delta %s", echo), fmt("commit %s", echo),
                fmt("end end %s -", usage(strlen(prompt), strlen(echo))));
  fx_finish(&f);
}

/* ---- malformed directives ------------------------------------------------------------------------------ */

static void expect_malformed(const char *prompt, const char *message) {
  fx f;
  fx_init(&f);
  fx_start(&f, prompt);
  fx_run(&f);
  expect_events(&f, 1, fmt("end error %s %s", usage(strlen(prompt), 0), message));
  fx_finish(&f);
}

Test(echo, malformed_sleep_ends_with_error) {
  expect_malformed("hello\n/sleep abc", "line 2: /sleep needs milliseconds 0..3600000, got \"abc\"");
}

Test(echo, malformed_tool_json_ends_with_error) {
  expect_malformed("/tool weather {bad json",
                   "line 1: /tool weather: the arguments must be a JSON object (string or '}' expected near "
                   "'bad')");
}

Test(echo, tool_without_name_ends_with_error) {
  expect_malformed("/tool", "line 1: /tool needs a tool name and optional JSON arguments");
}

Test(echo, tool_with_non_object_arguments_ends_with_error) {
  expect_malformed("/tool t [1]",
                   "line 1: /tool t: the arguments must be a JSON object (got another JSON value)");
}

Test(echo, invalid_chunks_end_with_error) {
  expect_malformed("/chunks 0\nhi", "line 1: /chunks needs a count 1..1000, got \"0\"");
}

Test(echo, too_many_chunks_end_with_error) {
  expect_malformed("/chunks 1001", "line 1: /chunks needs a count 1..1000, got \"1001\"");
}

Test(echo, ask_without_question_ends_with_error) {
  expect_malformed("/ask", "line 1: /ask needs a question");
}

Test(echo, malformed_directive_runs_nothing_before_it) {
  expect_malformed("/tool a {}\n/sleep -5", "line 2: /sleep needs milliseconds 0..3600000, got \"-5\"");
}

/* ---- cancellation and lifecycle ------------------------------------------------------------------------ */

Test(echo, cancel_during_sleep_ends_cancelled_once) {
  fx f;
  fx_init(&f);
  const char *prompt = "/sleep 5000\nhello";
  uint64_t t0 = ts_now_ms();
  fx_start(&f, prompt);
  fx_settle(&f, 30);
  expect_events(&f, 0);
  DELIVER(&f, f.p->turn_cancel(f.turn));
  DELIVER(&f, f.p->turn_cancel(f.turn));
  fx_run(&f);
  fx_settle(&f, 50);
  cr_expect_lt(f.end_ms - t0, 1000, "cancel did not stop the sleep");
  expect_events(&f, 1, fmt("end cancelled %s -", usage(strlen(prompt), 0)));
  cr_expect_eq(f.ends, 1);
  fx_finish(&f);
}

Test(echo, cancel_while_waiting_for_tool_ignores_late_result) {
  fx f;
  fx_init(&f);
  const char *prompt = "/tool slow {}\nhello";
  fx_start(&f, prompt);
  fx_wait(&f);
  DELIVER(&f, f.p->turn_cancel(f.turn));
  fx_run(&f);
  json_t *late = json_string("too late");
  DELIVER(&f, f.p->turn_tool_result(f.turn, "call_1", late, false));
  json_decref(late);
  fx_settle(&f, 50);
  expect_events(&f, 2, "tool_call call_1 slow {}", fmt("end cancelled %s -", usage(strlen(prompt), 0)));
  cr_expect_eq(f.ends, 1);
  fx_finish(&f);
}

/* The agent may cancel from inside a sink call; the stream stops and end follows on a later tick. */
Test(echo, cancel_during_deltas_stops_the_stream) {
  fx f;
  fx_init(&f);
  f.cancel_in_delta = true;
  const char *prompt = "/chunks 5\nabcdefghij";
  fx_start(&f, prompt);
  fx_run(&f);
  expect_events(&f, 2, "delta ech", fmt("end cancelled %s -", usage(strlen(prompt), 0)));
  fx_finish(&f);
}

Test(echo, nothing_is_called_synchronously) {
  fx f;
  fx_init(&f);
  fx_start(&f, "/tool t\n/subagent go");
  cr_expect_eq(f.n, 0);
  fx_wait(&f);
  json_t *r = json_null();
  DELIVER(&f, f.p->turn_tool_result(f.turn, "call_1", r, false));
  cr_expect_eq(f.n, 1, "turn_tool_result called the sink");
  fx_wait(&f);
  DELIVER(&f, f.p->turn_subagent_result(f.turn, "partial", "error"));
  cr_expect_eq(f.n, 3, "turn_subagent_result called the sink");
  DELIVER(&f, f.p->turn_cancel(f.turn));
  cr_expect_eq(f.n, 3, "turn_cancel called the sink");
  fx_run(&f);
  expect_events(&f, 4, "tool_call call_1 t {}", "commit tool t: null", "subagent go",
                fmt("end cancelled %s -", usage(20, strlen("tool t: null"))));
  cr_expect_eq(f.sync_calls, 0);
  fx_finish(&f);
}

Test(echo, subagent_failure_names_its_reason) {
  fx f;
  fx_init(&f);
  fx_start(&f, "/subagent go");
  fx_wait(&f);
  DELIVER(&f, f.p->turn_subagent_result(f.turn, "partial", "error"));
  fx_run(&f);
  const char *c = "subagent (error): partial";
  expect_events(&f, 3, "subagent go", fmt("commit %s", c), fmt("end end %s -", usage(12, strlen(c))));
  fx_finish(&f);
}

Test(echo, turn_free_inside_end_is_safe) {
  fx f;
  fx_init(&f);
  f.free_in_end = true;
  fx_start(&f, "/max-tokens\nbye");
  fx_run(&f);
  cr_expect_null(f.turn);
  expect_events(&f, 3, "delta echo: bye", "commit echo: bye",
                fmt("end max-tokens %s -", usage(strlen("/max-tokens\nbye"), strlen("echo: bye"))));
  fx_finish(&f);
}

Test(echo, turn_free_inside_cancelled_end_is_safe) {
  fx f;
  fx_init(&f);
  f.free_in_end = true;
  fx_start(&f, "/sleep 5000");
  fx_settle(&f, 10);
  DELIVER(&f, f.p->turn_cancel(f.turn));
  fx_run(&f);
  cr_expect_null(f.turn);
  expect_events(&f, 1, fmt("end cancelled %s -", usage(strlen("/sleep 5000"), 0)));
  fx_finish(&f);
}

Test(echo, turn_free_before_end_stops_silently) {
  fx f;
  fx_init(&f);
  fx_start(&f, "/sleep 20\nhello");
  f.p->turn_free(f.turn);
  f.turn = NULL;
  fx_settle(&f, 60);
  expect_events(&f, 0);
  fx_finish(&f);
}

/* A text of `n` bytes mixing one-, two- and three-byte characters, so that a cut by bytes would split some.
 */
static char *mixed_text(size_t n) {
  static const char *const pieces[] = {"abc ", "\xc3\xa9", "\xe2\x82\xac", "xyz\n"};
  char *t = malloc(n + 8);
  size_t len = 0;
  for (size_t i = 0; len < n; i++) {
    const char *p = pieces[i % 4];
    memcpy(t + len, p, strlen(p));
    len += strlen(p);
  }
  if (t[len - 1] == '\n') /* a trailing blank line is not part of the echo's text */
    t[len - 1] = 'z';
  t[len] = '\0';
  return t;
}

/* Reliability finding 12: a long echo is streamed in bounded deltas (no sink call copies more than 64 KiB
 * on the loop), each cut between characters, and they add up to the committed text. */
Test(echo, a_long_echo_streams_in_deltas_of_at_most_64_KiB_between_characters) {
  fx f;
  fx_init(&f);
  f.collect = true;
  char *text = mixed_text(1u << 20);
  fx_start(&f, text);
  fx_run(&f);
  char *want = malloc(strlen(text) + 7);
  sprintf(want, "echo: %s", text);
  cr_expect_leq(f.max_delta, 65536u, "a delta of %zu bytes", f.max_delta);
  cr_expect_geq(f.deltas, (int)(strlen(want) / 65536), "%d deltas", f.deltas);
  cr_expect_not(f.delta_not_utf8, "a delta was cut inside a character");
  cr_expect(f.acc && strcmp(f.acc, want) == 0, "the deltas do not add up to the echo");
  cr_expect(f.committed && strcmp(f.committed, want) == 0, "the commit is not the echo");
  expect_events(&f, 1, fmt("end end %s -", usage(strlen(text), strlen(want))));
  free(want);
  free(text);
  fx_finish(&f);
}

/* /chunks still counts: each of its pieces is itself bounded. */
Test(echo, chunks_pieces_longer_than_64_KiB_are_split_further) {
  fx f;
  fx_init(&f);
  f.collect = true;
  char *text = mixed_text(300000);
  char *prompt = malloc(strlen(text) + 16);
  sprintf(prompt, "/chunks 2\n%s", text);
  fx_start(&f, prompt);
  fx_run(&f);
  cr_expect_leq(f.max_delta, 65536u);
  cr_expect_geq(f.deltas, 5);
  cr_expect_not(f.delta_not_utf8);
  cr_expect(f.acc && strncmp(f.acc, "echo: ", 6) == 0 && strcmp(f.acc + 6, text) == 0);
  free(prompt);
  free(text);
  fx_finish(&f);
}

/* ABI 1.2: a sink that takes commit_json gets the echo as the JSON string the provider built (no copy); a
 * sink of an ABI 1.1 host (shorter: struct_size ends before commit_json) gets commit(), whatever lies in
 * memory beyond its size. */
Test(echo, the_echo_is_committed_as_a_json_string_when_the_sink_takes_one) {
  fx f;
  fx_init(&f);
  f.collect = true;
  f.sink.commit_json = sink_commit_json;
  fx_start(&f, "hello json");
  fx_run(&f);
  cr_expect_null(f.committed, "commit() was called beside commit_json()");
  cr_assert(json_is_string(f.committed_json));
  cr_expect_str_eq(json_string_value(f.committed_json), "echo: hello json");
  fx_finish(&f);

  fx_init(&f);
  f.collect = true;
  f.sink.commit_json = sink_commit_json;
  f.sink.struct_size = (uint32_t)offsetof(ah_turn_sink, commit_json);
  fx_start(&f, "hello old host");
  fx_run(&f);
  cr_expect_null(f.committed_json, "commit_json() called on a sink too short to have it");
  cr_expect_str_eq(f.committed ? f.committed : "(none)", "echo: hello old host");
  fx_finish(&f);
}

/* The turn is compiled off the loop: freeing or cancelling it meanwhile is safe (ASan in the sanitizer
 * build), and a cancelled one ends "cancelled" without streaming. */
Test(echo, free_and_cancel_while_a_long_prompt_is_compiled) {
  char *text = mixed_text(8u << 20);
  fx f;
  fx_init(&f);
  f.collect = true;
  fx_start(&f, text);
  f.p->turn_free(f.turn);
  f.turn = NULL;
  fx_settle(&f, 300);
  cr_expect_eq(f.n, 0, "a freed turn called the sink");
  cr_expect_eq(f.deltas, 0);
  fx_finish(&f);

  fx_init(&f);
  f.collect = true;
  fx_start(&f, text);
  f.p->turn_cancel(f.turn);
  fx_run(&f);
  cr_expect_eq(f.deltas, 0, "a turn cancelled while compiling streamed");
  expect_events(&f, 1, fmt("end cancelled %s -", usage(strlen(text), 0)));
  free(text);
  fx_finish(&f);
}
