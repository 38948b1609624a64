/* The echo provider's directives (host/providers/echo.c): any prompt text runs a turn that ends exactly
 * once — its tool calls, questions and subagents answered as they come, a turn still running after 20 ms
 * (a /sleep) cancelled — with nothing reaching the sink after the end or from inside a call into it. */
#include <uv.h>

#include "agenthost/errors.h"
#include "fuzz_support.h"
#include "providers/echo.h"

typedef struct fx {
  ah_provider *p;
  ah_provider_turn *turn;
  bool in_call;
  int ends, after_end, sync_calls;
  enum { NONE, TOOL, ASK, SUB } waiting;
  char call_id[128];
} fx;

static void seen(fx *f) {
  FUZZ_CHECK(!f->in_call);
  if (f->ends)
    f->after_end++;
  FUZZ_CHECK(f->after_end == 0);
}

static void on_delta(void *c, const char *text) {
  seen(c);
  FUZZ_CHECK(text != NULL);
}
static void on_commit(void *c, const char *text) {
  seen(c);
  FUZZ_CHECK(text != NULL);
}
static void on_tool_call(void *c, const char *call_id, const char *name, const json_t *args) {
  fx *f = c;
  seen(f);
  FUZZ_CHECK(call_id && name && json_is_object(args));
  snprintf(f->call_id, sizeof f->call_id, "%s", call_id);
  f->waiting = TOOL;
}
static void on_ask(void *c, const char *question, const json_t *options) {
  (void)options;
  seen(c);
  FUZZ_CHECK(question != NULL);
  ((fx *)c)->waiting = ASK;
}
static void on_subagent(void *c, const char *prompt) {
  seen(c);
  FUZZ_CHECK(prompt != NULL);
  ((fx *)c)->waiting = SUB;
}
static void on_end(void *c, const char *reason, const json_t *usage, const char *error) {
  (void)usage;
  (void)error;
  fx *f = c;
  seen(f);
  FUZZ_CHECK(reason != NULL);
  f->ends++;
}

/* A turn still running after 20 ms (a /sleep, a long /chunks) is cancelled: it must end all the same. */
static void cancel_cb(uv_timer_t *t) {
  fx *f = t->data;
  if (f->ends)
    return;
  f->in_call = true;
  f->p->turn_cancel(f->turn);
  f->in_call = false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uv_loop_t loop;
  static bool ready;
  if (!ready) {
    uv_loop_init(&loop);
    ready = true;
  }
  json_t *text = json_stringn((const char *)data, size);
  if (!text)
    return 0; /* not UTF-8: refused before any provider sees it */
  fx f = {.p = ah__echo_provider_new(&loop)};
  FUZZ_CHECK(f.p != NULL);
  ah_turn_sink sink = {.struct_size = sizeof sink,
                       .delta = on_delta,
                       .commit = on_commit,
                       .tool_call = on_tool_call,
                       .ask = on_ask,
                       .subagent = on_subagent,
                       .end = on_end};
  json_t *content = json_pack("[{s:s,s:o}]", "type", "text", "text", text);
  ah_turn_input in = {.struct_size = sizeof in, .session_id = "s1", .cwd = "/", .content = content};
  f.in_call = true;
  int rc = f.p->turn_start(f.p, &in, &sink, &f, &f.turn);
  f.in_call = false;
  json_decref(content);
  if (rc == 0) {
    uv_timer_t limit;
    uv_timer_init(&loop, &limit);
    limit.data = &f;
    uv_timer_start(&limit, cancel_cb, 20, 0);
    for (int i = 0; !f.ends; i++) {
      f.in_call = true;
      if (f.waiting == TOOL) {
        json_t *r = json_pack("{s:s}", "ok", "yes");
        f.waiting = NONE;
        f.p->turn_tool_result(f.turn, f.call_id, r, i % 2);
        json_decref(r);
      } else if (f.waiting == ASK) {
        json_t *a = json_string("an answer");
        f.waiting = NONE;
        f.p->turn_answer(f.turn, a, i % 3 == 0);
        json_decref(a);
      } else if (f.waiting == SUB) {
        f.waiting = NONE;
        f.p->turn_subagent_result(f.turn, "done", "end");
      }
      f.in_call = false;
      if (!f.ends)
        FUZZ_CHECK(uv_run(&loop, UV_RUN_ONCE) != 0 || f.ends || f.waiting != NONE);
    }
    uv_close((uv_handle_t *)&limit, NULL);
    FUZZ_CHECK(f.ends == 1);
    f.p->turn_free(f.turn);
  }
  uv_run(&loop, UV_RUN_NOWAIT);
  ah__echo_provider_free(f.p);
  uv_run(&loop, UV_RUN_NOWAIT);
  return 0;
}
