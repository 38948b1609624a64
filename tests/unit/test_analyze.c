/* Recordings (host/record.c) and their offline analysis (host/analyze.c): the observation format, credential
 * redaction, rotation; usage per turn and session tree, cost, requests and who answered, coverage (gaps, a
 * missing prefix, opaque kinds and methods, unknown outcomes), duplicates dropped by identity, --as-of. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "analyze.h"
#include "record.h"
#include "support.h"
#include "usage.h"

/* ---- building input lines ---- */

static char *ev(const char *sid, int seq, const char *kind, const char *time, const char *turn,
                const char *data) {
  char *s = NULL;
  cr_assert(asprintf(&s,
                     "{\"cursor\":%d,\"sessionId\":\"%s\",\"seq\":%d,\"kind\":\"%s\",\"time\":\"%s\"%s%s%s,"
                     "\"data\":%s}",
                     seq, sid, seq, kind, time, turn ? ",\"turnId\":\"" : "", turn ? turn : "",
                     turn ? "\"" : "", data) > 0);
  return s;
}

static void feed(ah_analysis *a, char *line) {
  ah__analysis_line(a, line, strlen(line));
  free(line);
}

/* One turn of session `sid`: started, two round trips of model m1 (or m1 then m2), ended. */
static void one_turn(ah_analysis *a, const char *sid, int seq0, const char *turn, const char *day,
                     bool mixed) {
  char t[40], d[200];
  snprintf(t, sizeof t, "%sT10:00:00.000Z", day);
  feed(a, ev(sid, seq0, "turn/started", t, turn, "{\"provider\":\"p\",\"model\":\"asked\"}"));
  feed(a, ev(sid, seq0 + 1, "model/usage", t, turn,
             "{\"round\":1,\"usage\":{\"inputTokens\":1000,\"cachedInputTokens\":400,\"outputTokens\":100,"
             "\"requests\":1,\"model\":\"m1\"}}"));
  snprintf(d, sizeof d,
           "{\"round\":2,\"usage\":{\"inputTokens\":2000,\"outputTokens\":200,\"reasoningTokens\":50,"
           "\"requests\":1,\"model\":\"%s\"}}",
           mixed ? "m2" : "m1");
  feed(a, ev(sid, seq0 + 2, "model/usage", t, turn, d));
  snprintf(
      d, sizeof d,
      "{\"reason\":\"end\",\"usage\":{\"inputTokens\":3000,\"cachedInputTokens\":400,\"outputTokens\":300,"
      "\"reasoningTokens\":50,\"requests\":2,\"model\":\"%s\"%s}}",
      mixed ? "m2" : "m1", mixed ? ",\"models\":[\"m1\",\"m2\"]" : "");
  feed(a, ev(sid, seq0 + 3, "turn/ended", t, turn, d));
}

static ah_prices *prices(void) {
  const char *t =
      "{\"version\":1,\"name\":\"tp\",\"currency\":\"USD\",\"rates\":["
      "{\"model\":\"m1\",\"from\":\"2026-01-01\",\"input\":\"1\",\"cachedInput\":\"0.1\",\"output\":\"4\"},"
      "{\"model\":\"m1\",\"from\":\"2026-06-01\",\"input\":\"2\",\"cachedInput\":\"0.2\",\"output\":\"8\"}]}";
  char err[200];
  ah_prices *p = ah__prices_parse(t, strlen(t), err, sizeof err);
  cr_assert(p, "%s", err);
  return p;
}

static const json_t *session_in(const json_t *rep, const char *id) {
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(rep, "sessions"), i,
                     s) if (strcmp(json_string_value(json_object_get(s, "id")), id) == 0) return s;
  cr_assert_fail("no session %s in the report", id);
  return NULL;
}

static json_int_t iget(const json_t *o, const char *k) {
  return json_integer_value(json_object_get(o, k));
}

static const char *sget(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

static bool has_issue(const json_t *rep, const char *needle) {
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(json_object_get(rep, "coverage"), "issues"), i,
                     s) if (strstr(json_string_value(s), needle)) return true;
  return false;
}

Test(analyze, usage_per_turn_and_tree_with_costs_at_the_rate_of_each_day) {
  ah_prices *p = prices();
  ah_analysis_opts o = {.prices = p};
  ah_analysis *a = ah__analysis_new(&o);
  ah__analysis_input(a, "export", NULL);
  feed(a, ev("root", 1, "inbox/received", "2026-05-31T09:00:00.000Z", NULL, "{}"));
  one_turn(a, "root", 2, "t1", "2026-05-31", false);
  feed(a, ev("root", 6, "subagent/started", "2026-05-31T10:00:01.000Z", "t1", "{\"sessionId\":\"child\"}"));
  one_turn(a, "child", 1, "c1", "2026-06-01", false); /* the new rate */
  one_turn(a, "child", 5, "c2", "2026-06-01", true);  /* m2 has no rate: its round trip is unpriced */
  json_t *rep = ah__analysis_report(a);
  const json_t *root = session_in(rep, "root"), *child = session_in(rep, "child");
  /* own usage: round trips, not also the end's sum */
  cr_assert_eq(iget(json_object_get(root, "usage"), "inputTokens"), 3000);
  cr_assert_eq(iget(json_object_get(root, "usage"), "requests"), 2);
  cr_assert_eq(iget(json_object_get(child, "usage"), "inputTokens"), 6000);
  cr_assert_str_eq(sget(child, "parent"), "root");
  /* the tree: the child once, under the parent */
  cr_assert_eq(iget(json_object_get(root, "treeUsage"), "inputTokens"), 9000);
  cr_assert_eq(iget(json_object_get(root, "treeUsage"), "sessions"), 2);
  /* root t1 at the old rate: (1000−400)×1 + 400×0.1 + 100×4 + 2000×1 + 200×4 = 600+40+400+2000+800 = 3840 per
   * million = 0.00384 */
  cr_assert_str_eq(sget(json_object_get(root, "cost"), "amount"), "0.00384");
  /* child c1 at the new rate: doubled = 0.00768; c2: round 1 (m1) 600×2+400×0.2+100×8 = 2080 → 0.00208,
   * round 2 (m2) unpriced */
  const json_t *cc = json_object_get(child, "cost");
  cr_assert_str_eq(sget(cc, "amount"), "0.00976");
  cr_assert_eq(iget(cc, "unpricedItems"), 1);
  cr_assert_eq(iget(json_object_get(cc, "unpriced"), "inputTokens"), 2000);
  cr_assert_str_eq(sget(json_object_get(root, "treeCost"), "amount"), "0.0136");
  cr_assert(json_is_true(json_object_get(json_object_get(rep, "coverage"), "complete")),
            "root starts at seq 1");
  json_decref(rep);
  ah__analysis_free(a);
  ah__prices_free(p);
}

Test(analyze, a_turn_without_its_round_trips_counts_its_end_and_mixed_models_stay_unpriced) {
  ah_prices *p = prices();
  ah_analysis_opts o = {.prices = p};
  ah_analysis *a = ah__analysis_new(&o);
  feed(a, ev("s", 1, "turn/started", "2026-02-01T00:00:00.000Z", "t", "{\"provider\":\"p\"}"));
  feed(a, ev("s", 2, "turn/ended", "2026-02-01T00:00:01.000Z", "t",
             "{\"reason\":\"end\",\"usage\":{\"inputTokens\":10,\"outputTokens\":5,\"requests\":2,\"model\":"
             "\"m1\","
             "\"models\":[\"m0\",\"m1\"]}}"));
  json_t *rep = ah__analysis_report(a);
  const json_t *s = session_in(rep, "s");
  cr_assert_eq(iget(json_object_get(s, "usage"), "inputTokens"), 10);
  cr_assert_str_eq(sget(json_object_get(s, "cost"), "amount"), "0");
  cr_assert_eq(iget(json_object_get(s, "cost"), "unpricedItems"), 1);
  cr_assert(strstr(sget(json_object_get(s, "cost"), "unpricedWhy"), "not attributed"));
  json_decref(rep);
  ah__analysis_free(a);
  ah__prices_free(p);
}

Test(analyze, coverage_reports_gaps_a_missing_prefix_and_opaque_kinds_and_drops_duplicates_by_identity) {
  ah_analysis *a = ah__analysis_new(NULL);
  feed(a, ev("s", 3, "turn/started", "2026-02-01T00:00:00.000Z", "t", "{}"));
  feed(a, ev("s", 4, "message/committed", "2026-02-01T00:00:00.000Z", "t",
             "{\"role\":\"assistant\",\"text\":\"x\"}"));
  feed(a, ev("s", 4, "message/committed", "2026-02-01T00:00:00.000Z", "t",
             "{\"role\":\"assistant\",\"text\":\"x\"}"));
  feed(a, ev("s", 5, "message/committed", "2026-02-01T00:00:00.000Z", "t",
             "{\"role\":\"assistant\",\"text\":\"x\"}"));
  feed(a, ev("s", 8, "future/kind", "2026-02-01T00:00:00.000Z", "t", "{}"));
  ah__analysis_line(a, "{not json", 9);
  json_t *rep = ah__analysis_report(a);
  const json_t *cov = json_object_get(session_in(rep, "s"), "coverage");
  cr_assert_eq(iget(cov, "events"), 4, "the repeated seq 4 is one event; equal text at seq 5 is another");
  cr_assert_eq(iget(json_array_get(json_object_get(rep, "inputs"), 0), "duplicates"), 1);
  cr_assert_eq(iget(json_array_get(json_object_get(rep, "inputs"), 0), "malformed"), 1);
  cr_assert_eq(json_integer_value(json_array_get(json_object_get(cov, "missingPrefix"), 1)), 2);
  json_t *gap = json_array_get(json_object_get(cov, "gaps"), 0);
  cr_assert_eq(json_integer_value(json_array_get(gap, 0)), 6);
  cr_assert_eq(json_integer_value(json_array_get(gap, 1)), 7);
  cr_assert_eq(iget(json_object_get(cov, "unknownKinds"), "future/kind"), 1);
  cr_assert(has_issue(rep, "events 1..2 were not observed (missing prefix)"));
  cr_assert(has_issue(rep, "events 6..7 were not observed"));
  cr_assert(has_issue(rep, "unknown kind future/kind kept opaque"));
  cr_assert(has_issue(rep, "1 line(s) could not be read"));
  cr_assert(json_is_false(json_object_get(json_object_get(rep, "coverage"), "complete")));
  json_decref(rep);
  ah__analysis_free(a);
}

/* A browser tab's own recording (side client): an approval pushed on the host socket, the tab's answer and
 * its receipt correlated by `corr`, a call never answered, an unknown push, a lost record. */
static char *obs(const char *conn, int seq, const char *dir, const char *corr, const char *payload) {
  char *s = NULL;
  cr_assert(
      asprintf(&s,
               "{\"v\":1,\"side\":\"client\",\"source\":\"ui\",\"conn\":\"%s\",\"seq\":%d,\"dir\":\"%s\","
               "\"wall\":\"2026-03-01T10:00:%02d.000Z\",\"mono\":%d%s%s%s,\"payload\":%s}",
               conn, seq, dir, seq, seq * 1000, corr ? ",\"corr\":\"" : "", corr ? corr : "",
               corr ? "\"" : "", payload) > 0);
  return s;
}

Test(analyze, requests_say_who_answered_and_calls_without_an_answer_have_an_unknown_outcome) {
  ah_analysis *a = ah__analysis_new(NULL);
  const char *ask =
      "{\"kind\":\"server-request\",\"rpcId\":\"R1\",\"method\":\"request.approval\",\"replyRequired\":"
      "true,\"payload\":{\"id\":\"R1\",\"sessionId\":\"s\",\"turnId\":\"t\",\"kind\":\"approval\","
      "\"params\":{\"tool\":\"write_file\"},\"state\":\"pending\"}}";
  for (int tab = 0; tab < 2; tab++) {
    char *conn = tab ? "tab-b" : "tab-a";
    feed(a, obs(conn, 1, "received", NULL, ask));
  }
  /* tab b answers and wins; tab a's later answer gets "resolved" */
  feed(a, obs("tab-b", 2, "sent", "h1",
              "{\"kind\":\"client-response\",\"rpcId\":\"R1\",\"value\":{\"optionId\":\"allow_once\"}}"));
  feed(a, obs("tab-b", 3, "received", "h1", "{\"accepted\":true}"));
  feed(a, obs("tab-a", 2, "sent", "h7",
              "{\"kind\":\"client-response\",\"rpcId\":\"R1\",\"value\":{\"optionId\":\"allow_once\"}}"));
  feed(a, obs("tab-a", 3, "received", "h7", "{\"accepted\":false,\"reason\":\"resolved\"}"));
  /* a call with no answer, an unknown push, and seq 5 of tab-a missing */
  feed(a, obs("tab-a", 4, "sent", "h8",
              "{\"kind\":\"client-request\",\"rpcId\":\"r9\",\"method\":\"session.prompt\",\"payload\":{}}"));
  feed(a, obs("tab-a", 6, "received", NULL,
              "{\"kind\":\"server-request\",\"rpcId\":\"p1\",\"method\":\"brand.new\",\"payload\":{}}"));
  feed(a, obs("tab-b", 3, "received", "h1", "{\"accepted\":true}")); /* the same record again */
  json_t *rep = ah__analysis_report(a);
  const json_t *req = json_array_get(json_object_get(session_in(rep, "s"), "requests"), 0);
  cr_assert_str_eq(sget(req, "id"), "R1");
  cr_assert_str_eq(sget(req, "tool"), "write_file");
  cr_assert_str_eq(sget(req, "state"), "answered");
  cr_assert_str_eq(sget(json_object_get(req, "answeredBy"), "conn"), "tab-b");
  cr_assert(has_issue(rep, "connection ui tab-a: records 5..5 are missing"));
  cr_assert(
      has_issue(rep, "connection ui tab-a: 1 request(s) sent with no answer observed (outcome unknown)"));
  cr_assert(has_issue(rep, "unknown method brand.new kept opaque"));
  cr_assert_not(has_issue(rep, "tab-b: 1 request"), "tab b's answer got its receipt");
  cr_assert_eq(iget(json_array_get(json_object_get(rep, "inputs"), 0), "duplicates"), 1);
  json_decref(rep);
  ah__analysis_free(a);
}

Test(analyze, as_of_judges_what_was_pending_then) {
  ah_analysis_opts o = {.as_of = "2026-02-01T00:00:05.000Z"};
  ah_analysis *a = ah__analysis_new(&o);
  feed(a, ev("s", 1, "question/asked", "2026-02-01T00:00:01.000Z", "t",
             "{\"requestId\":\"Q\",\"question\":\"?\"}"));
  feed(a, ev("s", 2, "question/answered", "2026-02-01T00:00:09.000Z", "t",
             "{\"requestId\":\"Q\",\"outcome\":\"answered\"}"));
  json_t *rep = ah__analysis_report(a);
  cr_assert_str_eq(sget(json_array_get(json_object_get(session_in(rep, "s"), "requests"), 0), "state"),
                   "pending");
  cr_assert(has_issue(rep, "request Q (question) is pending"));
  cr_assert_eq(iget(json_array_get(json_object_get(rep, "inputs"), 0), "afterAsOf"), 1);
  json_decref(rep);
  ah__analysis_free(a);
  /* and without --as-of it was answered */
  a = ah__analysis_new(NULL);
  feed(a, ev("s", 1, "question/asked", "2026-02-01T00:00:01.000Z", "t",
             "{\"requestId\":\"Q\",\"question\":\"?\"}"));
  feed(a, ev("s", 2, "question/answered", "2026-02-01T00:00:09.000Z", "t",
             "{\"requestId\":\"Q\",\"outcome\":\"answered\"}"));
  rep = ah__analysis_report(a);
  cr_assert_str_eq(sget(json_array_get(json_object_get(session_in(rep, "s"), "requests"), 0), "state"),
                   "answered");
  json_decref(rep);
  ah__analysis_free(a);
}

Test(analyze, tool_failures_and_repeated_identical_calls_are_reported_with_a_threshold) {
  ah_analysis_opts o = {.repeat_threshold = 2};
  ah_analysis *a = ah__analysis_new(&o);
  feed(a, ev("s", 1, "tool/call", "2026-02-01T00:00:01.000Z", "t",
             "{\"callId\":\"c1\",\"name\":\"read_file\",\"args\":{\"path\":\"a\",\"n\":1}}"));
  feed(a, ev("s", 2, "tool/call", "2026-02-01T00:00:01.000Z", "t",
             "{\"callId\":\"c2\",\"name\":\"read_file\",\"args\":{\"n\":1,\"path\":\"a\"}}")); /* same args */
  feed(a, ev("s", 3, "tool/call", "2026-02-01T00:00:01.000Z", "t",
             "{\"callId\":\"c3\",\"name\":\"read_file\",\"args\":{\"path\":\"b\"}}"));
  feed(a, ev("s", 4, "tool/result", "2026-02-01T00:00:01.000Z", "t",
             "{\"callId\":\"c3\",\"name\":\"read_file\",\"isError\":true,\"result\":{\"error\":\"no such "
             "file\"}}"));
  json_t *rep = ah__analysis_report(a);
  const json_t *s = session_in(rep, "s");
  const json_t *rc = json_object_get(s, "repeatedCalls");
  cr_assert_eq(json_array_size(rc), 1);
  cr_assert_eq(iget(json_array_get(rc, 0), "count"), 2);
  const json_t *f = json_array_get(json_object_get(s, "toolFailures"), 0);
  cr_assert_str_eq(sget(f, "error"), "no such file");
  json_decref(rep);
  ah__analysis_free(a);
}

/* #19's hook runs: every stored `hook/ran` is in the report, with who ran, what it decided and why; the text
 * output sums each hook and names each denial and failure. */
Test(analyze, hook_runs_are_reported_with_their_outcome_reason_and_duration) {
  ah_analysis *a = ah__analysis_new(NULL);
  feed(a, ev("s", 1, "hook/ran", "2026-02-01T00:00:01.000Z", NULL,
             "{\"hook\":\"audit\",\"event\":\"session_start\",\"source\":\"config\",\"outcome\":"
             "\"allow\",\"durationMs\":4}"));
  feed(a, ev("s", 2, "hook/ran", "2026-02-01T00:00:02.000Z", "t",
             "{\"hook\":\"no-rm\",\"event\":\"before_tool\",\"source\":\"config\",\"outcome\":"
             "\"deny\",\"durationMs\":12,\"reason\":\"rm -rf outside the workspace\",\"tool\":"
             "\"run_command\",\"callId\":\"c1\"}"));
  /* a plugin hook that timed out, its message with escapes */
  feed(a, ev("s", 3, "hook/ran", "2026-02-01T00:00:03.000Z", "t",
             "{\"hook\":\"fmt\",\"event\":\"after_tool\",\"source\":\"plugin\",\"plugin\":\"toolsrc\","
             "\"outcome\":\"error\",\"durationMs\":30001,\"error\":\"timed out \\\"30000 ms\\\"\","
             "\"onError\":\"allow\",\"tool\":\"write_file\",\"callId\":\"c2\"}"));
  feed(a, ev("s", 4, "hook/ran", "2026-02-01T00:00:04.000Z", "t", "{\"event\":\"turn_end\"}")); /* no hook */
  json_t *rep = ah__analysis_report(a);
  const json_t *runs = json_object_get(session_in(rep, "s"), "hookRuns");
  cr_assert_eq(json_array_size(runs), 3);
  const json_t *deny = json_array_get(runs, 1);
  cr_assert_str_eq(sget(deny, "outcome"), "deny");
  cr_assert_str_eq(sget(deny, "reason"), "rm -rf outside the workspace");
  cr_assert_str_eq(sget(deny, "tool"), "run_command");
  cr_assert_str_eq(sget(deny, "turnId"), "t");
  cr_assert_eq(iget(deny, "durationMs"), 12);
  cr_assert_eq(iget(deny, "seq"), 2);
  const json_t *err = json_array_get(runs, 2);
  cr_assert_str_eq(sget(err, "error"), "timed out \"30000 ms\"");
  cr_assert_str_eq(sget(err, "plugin"), "toolsrc");
  cr_assert_str_eq(sget(err, "onError"), "allow");
  cr_assert_null(json_object_get(json_array_get(runs, 0), "turnId"));
  cr_assert_eq(iget(json_array_get(json_object_get(rep, "inputs"), 0), "malformed"), 1);
  char *text = NULL;
  size_t tn = 0;
  FILE *out = open_memstream(&text, &tn);
  ah__analysis_print(rep, out);
  fclose(out);
  cr_assert(strstr(text, "hook no-rm (before_tool): 1 run(s), deny 1, longest 12 ms"), "%s", text);
  cr_assert(strstr(text, "hook audit (session_start): 1 run(s), allow 1, longest 4 ms"), "%s", text);
  cr_assert(strstr(text, "hook no-rm deny on run_command: rm -rf outside the workspace"), "%s", text);
  cr_assert(strstr(text, "hook fmt error on write_file: timed out \"30000 ms\" (on_error = allow)"), "%s",
            text);
  cr_assert_null(strstr(text, "hook audit allow"), "%s", text);
  free(text);
  json_decref(rep);
  ah__analysis_free(a);
}

/* ---- the recorder ---- */

static json_t *read_lines(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert(f, "%s", path);
  json_t *out = json_array();
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0)
    json_array_append_new(out, json_loads(line, 0, NULL));
  free(line);
  fclose(f);
  return out;
}

static size_t count_files(const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  cr_assert(d);
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strlen(e->d_name) > strlen(suffix) &&
        strcmp(e->d_name + strlen(e->d_name) - strlen(suffix), suffix) == 0)
      n++;
  closedir(d);
  return n;
}

Test(analyze, the_recorder_writes_records_and_metadata_and_redacts_credentials_by_name) {
  char *dir = ts_mkdtemp();
  char rd[600];
  snprintf(rd, sizeof rd, "%s/rec", dir);
  json_t *meta = json_pack("{s:s, s:s}", "hostRunId", "H1", "api_key", "sk-live-123");
  ah_recorder_opts o = {.dir = rd, .source = "client:c", .side = "client", .meta = meta};
  ah_recorder *r = NULL;
  char err[300] = "";
  cr_assert_eq(ah_recorder_open(&o, &r, err, sizeof err), 0, "%s", err);
  ah_recorder_mark(r, "c1", "open", NULL);
  const char *msg =
      "{\"method\":\"x\",\"params\":{\"headers\":{\"Authorization\":\"Bearer abc.def\"},\"apiKey\":"
      "\"sk-1\",\"token\":\"t0k\",\"inputTokens\":7,\"note\":\"use Bearer zzz now\","
      "\"url\":\"http://h/#token=SECRET&x=1\",\"protocols\":[\"agenthost.v1\","
      "\"agenthost.bearer.TOKEN123\"]}}";
  ah_recorder_message(r, "c1", true, msg, strlen(msg), NULL);
  ah_recorder_message(r, "c1", false, "not json at all", 15, "h3");
  ah_recorder_mark(r, "c1", "close", NULL);
  char path[4300];
  snprintf(path, sizeof path, "%s", ah_recorder_path(r));
  ah_recorder_close(r);
  json_t *lines = read_lines(path);
  cr_assert_eq(json_array_size(lines), 4);
  for (size_t i = 0; i < 4; i++) {
    json_t *l = json_array_get(lines, i);
    cr_assert_eq(iget(l, "seq"), (json_int_t)i + 1);
    cr_assert_str_eq(sget(l, "source"), "client:c");
    cr_assert_str_eq(sget(l, "side"), "client");
    cr_assert(json_is_integer(json_object_get(l, "mono")));
    cr_assert_eq(strlen(sget(l, "wall")), 24);
  }
  char *text = json_dumps(lines, JSON_COMPACT);
  cr_assert_null(strstr(text, "abc.def"), "%s", text);
  cr_assert_null(strstr(text, "sk-1"));
  cr_assert_null(strstr(text, "t0k"));
  cr_assert_null(strstr(text, "zzz"));
  cr_assert_null(strstr(text, "SECRET"));
  cr_assert_null(strstr(text, "TOKEN123"));
  cr_assert(strstr(text, "\"inputTokens\":7"), "counts are not credentials");
  cr_assert(strstr(text, "&x=1"), "the rest of a URL is kept");
  free(text);
  json_t *m2 = json_array_get(lines, 2);
  cr_assert_str_eq(sget(m2, "raw"), "not json at all");
  cr_assert_str_eq(sget(m2, "corr"), "h3");
  cr_assert_str_eq(sget(m2, "dir"), "received");
  json_decref(lines);
  /* the metadata beside it */
  char mp[4300];
  snprintf(mp, sizeof mp, "%.*s.meta.json", (int)(strlen(path) - 6), path);
  json_t *md = json_load_file(mp, 0, NULL);
  cr_assert(md, "%s", mp);
  cr_assert_str_eq(sget(md, "format"), "agenthost.recording");
  cr_assert_str_eq(sget(md, "hostRunId"), "H1");
  cr_assert_str_eq(sget(md, "api_key"), "[redacted]");
  cr_assert(sget(md, "recordingRunId") && strcmp(sget(md, "recordingRunId"), "H1") != 0,
            "two run ids, distinct");
  cr_assert_str_eq(sget(json_object_get(md, "clock"), "mono"), "CLOCK_MONOTONIC");
  json_decref(md);
  json_decref(meta);
  ts_rmtree(dir);
  free(dir);
}

Test(analyze, the_recorder_rotates_parts_and_keeps_at_most_max_files) {
  char *dir = ts_mkdtemp();
  ah_recorder_opts o = {.dir = dir, .source = "host:sdk", .side = "host", .max_bytes = 4096, .max_files = 3};
  ah_recorder *r = NULL;
  char err[300] = "";
  cr_assert_eq(ah_recorder_open(&o, &r, err, sizeof err), 0, "%s", err);
  char body[600];
  memset(body, 'a', sizeof body);
  memcpy(body, "\"", 1);
  body[sizeof body - 1] = '"';
  for (int i = 0; i < 100; i++)
    ah_recorder_message(r, "stdio", i % 2, body, sizeof body, NULL);
  cr_assert_not(ah_recorder_failed(r));
  ah_recorder_close(r);
  cr_assert_eq(count_files(dir, ".jsonl"), 3, "older parts were removed");
  cr_assert_eq(count_files(dir, ".meta.json"), 3);
  ts_rmtree(dir);
  free(dir);
}

/* Hostile and broken lines: counted as malformed (or read as what they are), never a crash, never a wrong
 * number; the shallow scanner and the full parser agree (escaped keys take the full parser). */
Test(analyze, hostile_lines_are_reported_and_the_scanner_agrees_with_the_parser) {
  ah_analysis *a = ah__analysis_new(NULL);
  ah__analysis_input(a, "hostile", NULL);
  size_t depth = 5000;
  char *deep = malloc(depth * 2 + 200);
  size_t n = (size_t)sprintf(
      deep, "{\"v\":1,\"source\":\"s\",\"conn\":\"c\",\"seq\":1,\"dir\":\"received\",\"payload\":");
  for (size_t i = 0; i < depth; i++)
    deep[n++] = '[';
  for (size_t i = 0; i < depth; i++)
    deep[n++] = ']';
  deep[n++] = '}';
  ah__analysis_line(a, deep, n); /* nesting deeper than any parser takes */
  free(deep);
  const char *bad[] = {
      "{\"sessionId\":\"s\",\"seq\":1,\"kind\":\"turn/started\",\"data\":{}",          /* truncated */
      "{\"sessionId\":\"s\",\"seq\":\"1\",\"kind\":\"turn/started\",\"data\":{}}",     /* seq not a number */
      "{\"sessionId\":\"s\",\"seq\":99999999999999999999,\"kind\":\"k\",\"data\":{}}", /* overflows */
      "{\"source\":\"s\",\"conn\":\"c\",\"seq\":1.5,\"dir\":\"received\",\"payload\":{}}",
      "{\"source\":\"s\",\"source\":\"t\",\"conn\":\"c\",\"seq\":2,\"dir\":\"received\",\"payload\":{}}",
      "[1,2,3]",
      "\"just a string\"",
      "{\"source\":\"s\",\"conn\":\"c\",\"seq\":3,\"dir\":\"received\",\"payload\":{\"method\":\"session."
      "event\","
      "\"params\":{\"event\":{\"sessionId\":\"s\",\"seq\":1,\"kind\":\"turn/started\",\"data\":[]}}}}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ah__analysis_line(a, bad[i], strlen(bad[i]));
  ah__analysis_line(a, "{\"a\":\"\xff\xfe\"}", 10); /* not UTF-8 */
  const char nul[] = "{\"sessionId\":\"s\0x\",\"seq\":5,\"kind\":\"k\"}";
  ah__analysis_line(a, nul, sizeof nul - 1);
  /* an escaped key and value: the full parser reads it, as the same event */
  const char *esc =
      "{\"sessionId\":\"s\",\"seq\":7,\"kind\":\"turn/sta\\u0072ted\",\"time\":\"2026-01-01T00:00:00.000Z\","
      "\"turnId\":\"t\\u0031\",\"data\":{\"provider\":\"p\"}}";
  ah__analysis_line(a, esc, strlen(esc));
  json_t *rep = ah__analysis_report(a);
  const json_t *in = json_array_get(json_object_get(rep, "inputs"), 0);
  cr_assert_eq(iget(in, "malformed"), 11, "%lld", (long long)iget(in, "malformed"));
  const json_t *s = session_in(rep, "s");
  const json_t *t = json_array_get(json_object_get(s, "turns"), 0);
  cr_assert_str_eq(sget(t, "turnId"), "t1");
  cr_assert_str_eq(sget(t, "provider"), "p");
  json_decref(rep);
  ah__analysis_free(a);
}

/* A line longer than 64 MiB is one malformed line; the lines after it are read. */
Test(analyze, an_oversized_line_is_skipped_and_reading_goes_on, .timeout = 60) {
  char *dir = ts_mkdtemp();
  char path[600];
  snprintf(path, sizeof path, "%s/big.jsonl", dir);
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fputs("{\"sessionId\":\"s\",\"seq\":1,\"kind\":\"k\",\"data\":{\"x\":\"", f);
  static char chunk[1 << 20];
  memset(chunk, 'a', sizeof chunk);
  for (int i = 0; i < 65; i++)
    fwrite(chunk, 1, sizeof chunk, f);
  fputs("\"}}\n{\"sessionId\":\"s\",\"seq\":2,\"kind\":\"turn/started\",\"turnId\":\"t\",\"data\":{}}\n", f);
  fclose(f);
  char out[600];
  snprintf(out, sizeof out, "%s/out.json", dir);
  fflush(stdout);
  int saved = dup(1);
  FILE *o = fopen(out, "w");
  dup2(fileno(o), 1);
  char *argv[] = {"--json", path};
  int rc = ah__cmd_analyze(2, argv);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  fclose(o);
  cr_assert_eq(rc, 0);
  json_t *rep = json_load_file(out, 0, NULL);
  cr_assert(rep);
  const json_t *in = json_array_get(json_object_get(rep, "inputs"), 0);
  cr_assert_eq(iget(in, "lines"), 2);
  cr_assert_eq(iget(in, "malformed"), 1);
  cr_assert_eq(iget(in, "events"), 1);
  json_decref(rep);
  ts_rmtree(dir);
  free(dir);
}

/* agenthost has no fork; the prefix a client sees again — a reconnect replaying the mux from an earlier
 * cursor, a second tab, the same export read twice — is the same events by session and seq: never charged
 * again, while the new work after it is. */
Test(analyze, a_prefix_seen_again_is_not_charged_again) {
  ah_prices *p = prices();
  ah_analysis_opts o = {.prices = p};
  ah_analysis *a = ah__analysis_new(&o);
  ah__analysis_input(a, "first connection", NULL);
  one_turn(a, "s", 1, "t1", "2026-02-01", false);
  ah__analysis_input(a, "after a reconnect from cursor 0", NULL);
  one_turn(a, "s", 1, "t1", "2026-02-01", false); /* the replayed prefix */
  one_turn(a, "s", 5, "t2", "2026-02-01", false); /* new work */
  ah__analysis_input(a, "the export", NULL);
  one_turn(a, "s", 1, "t1", "2026-02-01", false);
  one_turn(a, "s", 5, "t2", "2026-02-01", false);
  json_t *rep = ah__analysis_report(a);
  const json_t *s = session_in(rep, "s");
  cr_assert_eq(json_array_size(json_object_get(s, "turns")), 2);
  cr_assert_eq(iget(json_object_get(s, "usage"), "inputTokens"), 6000, "two turns, each once");
  cr_assert_str_eq(sget(json_object_get(s, "cost"), "amount"), "0.00768"); /* 2 × 0.00384 */
  cr_assert_eq(iget(json_array_get(json_object_get(rep, "inputs"), 1), "duplicates"), 4);
  cr_assert_eq(iget(json_array_get(json_object_get(rep, "inputs"), 2), "duplicates"), 8);
  json_decref(rep);
  ah__analysis_free(a);
  ah__prices_free(p);
}
