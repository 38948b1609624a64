/* The openai plugin's pure parts: the event-stream parser (split anywhere, CRLF/LF/CR, multi-line data,
 * comments, bounds) and the Chat Completions mapping (tool calls assembled by index, history to messages,
 * fitting a context window). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "sse.h"

typedef struct seen {
  char events[16][256];
  char types[16][32];
  int n;
} seen;

static int collect(void *arg, const char *event, const char *data, size_t len) {
  seen *s = arg;
  cr_assert_lt(s->n, 16);
  cr_assert_eq(strlen(data), len);
  snprintf(s->events[s->n], sizeof s->events[0], "%s", data);
  snprintf(s->types[s->n], sizeof s->types[0], "%s", event);
  s->n++;
  return 0;
}

static const char stream[] = ": a comment\r\n"
                             "data: {\"a\":1}\r\n\r\n"
                             "event: ping\n"
                             "data: line one\n"
                             "data:line two\n"
                             "id: 7\n"
                             "retry: 100\n"
                             "\n"
                             "data: cr only\r\r"
                             "nodata\n\n"
                             "data\n\n"
                             "data: [DONE]\n\n";

static void check(const seen *s) {
  cr_assert_eq(s->n, 5);
  cr_expect_str_eq(s->events[0], "{\"a\":1}");
  cr_expect_str_eq(s->types[0], "message");
  cr_expect_str_eq(s->events[1], "line one\nline two");
  cr_expect_str_eq(s->types[1], "ping");
  cr_expect_str_eq(s->events[2], "cr only");
  cr_expect_str_eq(s->events[3], "", "a bare `data` line is an empty data event");
  cr_expect_str_eq(s->events[4], "[DONE]");
}

Test(openai_wire, events_split_at_every_byte_parse_the_same) {
  seen whole = {0};
  sse_parser p;
  sse_init(&p, 1024, 4096);
  cr_assert_eq(sse_feed(&p, stream, strlen(stream), collect, &whole), 0);
  check(&whole);
  cr_expect_not(sse_pending(&p));
  sse_free(&p);
  for (size_t cut = 1; cut < strlen(stream); cut++) {
    seen s = {0};
    sse_init(&p, 1024, 4096);
    cr_assert_eq(sse_feed(&p, stream, cut, collect, &s), 0);
    cr_assert_eq(sse_feed(&p, stream + cut, strlen(stream) - cut, collect, &s), 0);
    check(&s);
    sse_free(&p);
  }
  seen bytes = {0};
  sse_init(&p, 1024, 4096);
  for (size_t i = 0; i < strlen(stream); i++)
    cr_assert_eq(sse_feed(&p, stream + i, 1, collect, &bytes), 0);
  check(&bytes);
  sse_free(&p);
}

Test(openai_wire, lines_and_events_over_their_caps_are_errors) {
  sse_parser p;
  seen s = {0};
  sse_init(&p, 16, 32);
  cr_expect_eq(sse_feed(&p, "data: 0123456789abcdef", 22, collect, &s), -1, "a line over 16 bytes");
  sse_free(&p);
  sse_init(&p, 64, 32);
  const char *many = "data: 0123456789\ndata: 0123456789\ndata: 0123456789\n\n";
  cr_expect_eq(sse_feed(&p, many, strlen(many), collect, &s), -2, "an event over 32 bytes");
  sse_free(&p);
  sse_init(&p, 64, 64);
  cr_expect_eq(sse_feed(&p, "data: half", 10, collect, &s), 0);
  cr_expect(sse_pending(&p), "an unfinished event is pending");
  sse_free(&p);
  cr_expect_eq(s.n, 0);
}

static int stop_at_first(void *arg, const char *event, const char *data, size_t len) {
  (void)event, (void)data, (void)len;
  (*(int *)arg)++;
  return 9;
}

Test(openai_wire, a_callback_stops_the_feed) {
  sse_parser p;
  int calls = 0;
  sse_init(&p, 64, 64);
  cr_expect_eq(sse_feed(&p, "data: a\n\ndata: b\n\n", 18, stop_at_first, &calls), 9);
  cr_expect_eq(calls, 1);
  sse_free(&p);
}

/* id and retry are kept for a client that resumes the stream (MCP's Streamable HTTP); bad ones are ignored.
 */
Test(openai_wire, the_last_event_id_and_retry_are_kept) {
  sse_parser p;
  seen s = {0};
  sse_init(&p, 1024, 1024);
  cr_expect_str_eq(p.last_id, "");
  cr_expect_eq(p.retry_ms, -1);
  cr_assert_eq(sse_feed(&p, stream, strlen(stream), collect, &s), 0);
  cr_expect_str_eq(p.last_id, "7");
  cr_expect_eq(p.retry_ms, 100);
  static const char bad[] = "id: 8\nretry: 5x\nretry: -1\ndata: a\n\nid\n\n";
  cr_assert_eq(sse_feed(&p, bad, strlen(bad), collect, &s), 0);
  cr_expect_eq(p.retry_ms, 100, "retry with other than digits is ignored");
  cr_expect_str_eq(p.last_id, "", "a bare id line resets the last event id");
  sse_free(&p);
}

static void feed(oa_round *r, const char *json) {
  json_t *j = json_loads(json, 0, NULL);
  cr_assert_not_null(j, "%s", json);
  const char *t = NULL, *rs = NULL;
  char err[256];
  cr_assert_eq(oa_round_chunk(r, j, &t, &rs, err, sizeof err), 0, "%s", err);
  json_decref(j);
}

Test(openai_wire, tool_calls_are_assembled_by_index) {
  oa_round r = {0};
  feed(&r, "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"b\",\"function\":{\"name\":"
           "\"list_dir\","
           "\"arguments\":\"\"}}]}}]}");
  feed(&r, "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":"
           "\"read_file\","
           "\"arguments\":\"{\\\"pa\"}}]}}]}");
  feed(&r,
       "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"th\\\":1}\"}},"
       "{\"index\":1,\"function\":{\"arguments\":\"{}\"}}]}}]}");
  feed(&r, "{\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"model\":\"m-2\"}");
  cr_assert_eq(r.ncalls, 2);
  cr_expect_str_eq(r.calls[0].id.p, "a");
  cr_expect_str_eq(r.calls[0].name.p, "read_file");
  cr_expect_str_eq(r.calls[0].args.p, "{\"path\":1}");
  cr_expect_str_eq(r.calls[1].name.p, "list_dir");
  cr_expect_str_eq(r.calls[1].args.p, "{}");
  cr_expect_str_eq(r.finish, "tool_calls");
  cr_expect_str_eq(r.model, "m-2");
  json_t *m = oa_assistant_message(&r);
  cr_expect(json_is_null(json_object_get(m, "content")));
  cr_expect_eq(json_array_size(json_object_get(m, "tool_calls")), 2);
  json_decref(m);
  oa_round_reset(&r);
}

Test(openai_wire, hostile_chunks_are_refused_not_followed) {
  const char *bad[] = {"[1,2]", "{\"error\":{\"message\":\"overloaded\"}}",
                       "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":64}]}}]}",
                       "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1}]}}]}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    oa_round r = {0};
    json_t *j = json_loads(bad[i], 0, NULL);
    const char *t = NULL, *rs = NULL;
    char err[256] = "";
    cr_expect_eq(oa_round_chunk(&r, j, &t, &rs, err, sizeof err), -1, "%s", bad[i]);
    cr_expect_neq(err[0], '\0');
    json_decref(j);
    oa_round_reset(&r);
  }
}

Test(openai_wire, history_becomes_messages_and_an_unanswered_call_is_left_out) {
  json_t *hist = json_loads(
      "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"q1\"}]},"
      "{\"role\":\"assistant\",\"text\":\"looking\"},"
      "{\"role\":\"tool_call\",\"callId\":\"c1\",\"name\":\"read_file\",\"args\":{\"path\":\"x\"}},"
      "{\"role\":\"tool_call\",\"callId\":\"c2\",\"name\":\"list_dir\",\"args\":{\"path\":\".\"}},"
      "{\"role\":\"tool_result\",\"callId\":\"c1\",\"name\":\"read_file\",\"result\":{\"content\":\"hi\"}},"
      "{\"role\":\"assistant\",\"text\":\"done\"},"
      "{\"role\":\"tool_result\",\"callId\":\"orphan\",\"name\":\"x\",\"result\":1}]",
      0, NULL);
  json_t *content =
      json_loads("[{\"type\":\"text\",\"text\":\"q2\"},{\"type\":\"resource_link\",\"name\":\"a.c\","
                 "\"uri\":\"file:///w/a.c\"}]",
                 0, NULL);
  json_t *m = oa_messages("be brief", hist, content);
  char *s = json_dumps(m, JSON_COMPACT);
  cr_expect_str_eq(
      s, "[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"q1\"},"
         "{\"role\":\"assistant\",\"content\":\"looking\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
         "\"function\",\"function\":{\"name\":\"read_file\",\"arguments\":\"{\\\"path\\\":\\\"x\\\"}\"}}]},"
         "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"{\\\"content\\\":\\\"hi\\\"}\"},"
         "{\"role\":\"assistant\",\"content\":\"done\"},"
         "{\"role\":\"user\",\"content\":\"q2\\n\\n[a.c](file:///w/a.c)\"}]");
  free(s);
  /* fitting: the oldest exchange goes, the system prompt and the last user message stay */
  int dropped = oa_fit(m, NULL, oa_estimate_tokens(m) - 1);
  cr_expect_eq(dropped, 4, "q1 and what followed it");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(m, 0), "role")), "system");
  cr_expect_str_eq(json_string_value(json_object_get(json_array_get(m, 1), "role")), "user");
  cr_expect_eq(oa_fit(m, NULL, 1), 0, "nothing more can go");
  cr_expect_eq(json_array_size(m), 2);
  json_decref(m);
  json_decref(hist);
  json_decref(content);
}
