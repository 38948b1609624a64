/* The openai provider's reading of a model server's stream (plugins/openai/chat.c over the event-stream
 * parser): the input as an SSE body, each event's data a chunk folded into the round — text, reasoning,
 * tool calls by index, finish, usage — and the round's assistant message built at the end. */
#include "../../plugins/common/sse.h"
#include "../../plugins/openai/chat.h"
#include "fuzz_support.h"

static int on_event(void *arg, const char *event, const char *data, size_t len) {
  (void)event;
  oa_round *r = arg;
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    r->done = true;
    return 0;
  }
  json_error_t e;
  json_t *chunk = json_loadb(data, len, JSON_DECODE_ANY, &e);
  if (!chunk)
    return 0;
  const char *text = NULL, *reasoning = NULL;
  char err[256];
  int rc = oa_round_chunk(r, chunk, &text, &reasoning, err, sizeof err);
  FUZZ_CHECK(rc == 0 || (rc == -1 && memchr(err, '\0', sizeof err)));
  FUZZ_CHECK(r->ncalls >= 0 && r->ncalls <= OA_MAX_CALLS);
  json_decref(chunk);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  sse_parser p;
  sse_init(&p, 1 << 16, 1 << 20);
  oa_round r;
  memset(&r, 0, sizeof r);
  oa_round_reset(&r);
  sse_feed(&p, (const char *)data, size, on_event, &r);
  json_t *msg = oa_assistant_message(&r);
  FUZZ_CHECK(msg == NULL || json_is_object(msg));
  if (msg) {
    char *text = json_dumps(msg, JSON_COMPACT);
    FUZZ_CHECK(text != NULL);
    free(text);
  }
  json_decref(msg);
  oa_round_reset(&r);
  sse_free(&p);
  return 0;
}
