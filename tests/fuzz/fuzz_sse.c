/* The event-stream parser (plugins/common/sse.c) that the openai and mcp plugins read model and MCP
 * servers with: the input fed in pieces cut where its first bytes say, and again whole; both feeds must
 * see the same events, every event's data within the cap. */
#include "../../plugins/common/sse.h"
#include "fuzz_support.h"

typedef struct seen {
  size_t events;
  size_t bytes;
  uint64_t hash;
} seen;

static int on_event(void *arg, const char *event, const char *data, size_t len) {
  seen *s = arg;
  FUZZ_CHECK(event && data && data[len] == '\0' && len <= 4096);
  s->events++;
  s->bytes += len;
  for (size_t i = 0; i < len; i++)
    s->hash = s->hash * 1099511628211u ^ (uint8_t)data[i];
  for (const char *e = event; *e; e++)
    s->hash = s->hash * 1099511628211u ^ (uint8_t)*e;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  size_t step = (size_t)data[0] % 17 + 1;
  data++;
  size--;
  sse_parser a, b;
  sse_init(&a, 1024, 4096);
  sse_init(&b, 1024, 4096);
  seen sa = {0}, sb = {0};
  int ra = 0;
  for (size_t off = 0; off < size && ra == 0; off += step)
    ra = sse_feed(&a, (const char *)data + off, size - off < step ? size - off : step, on_event, &sa);
  int rb = sse_feed(&b, (const char *)data, size, on_event, &sb);
  FUZZ_CHECK(ra == rb);
  if (ra == 0) {
    FUZZ_CHECK(sa.events == sb.events && sa.bytes == sb.bytes && sa.hash == sb.hash);
    FUZZ_CHECK(sse_pending(&a) == sse_pending(&b));
    FUZZ_CHECK(strcmp(a.last_id, b.last_id) == 0 && a.retry_ms == b.retry_ms);
  }
  sse_free(&a);
  sse_free(&b);
  return 0;
}
