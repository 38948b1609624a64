/* agenthost openai plugin — an incremental parser of server-sent events (the WHATWG "event stream"
 * format): bytes in pieces split anywhere, lines ending in CRLF, LF or CR, `data:` lines joined with
 * "\n", comments and unknown fields ignored, an event dispatched at a blank line. Bounded: a line or an
 * event's data longer than its cap is an error, never a growing buffer. Pure: no host, no loop. */
#ifndef AGENTHOST_OPENAI_SSE_H
#define AGENTHOST_OPENAI_SSE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct oa_sse {
  size_t max_line;  /* bytes of one line */
  size_t max_event; /* bytes of one event's data */
  char *line;
  size_t line_len, line_cap;
  char *data;
  size_t data_len, data_cap;
  bool has_data;
  bool after_cr; /* the last byte was a CR: an LF right after it ends no second line */
  char event[64];
} oa_sse;

/* One event: its type ("message" when the stream named none) and data (NUL-terminated, without the
 * last "\n"). Return non-zero to stop: oa_sse_feed returns it. */
typedef int (*oa_sse_fn)(void *arg, const char *event, const char *data, size_t len);

void oa_sse_init(oa_sse *p, size_t max_line, size_t max_event);
void oa_sse_free(oa_sse *p);
/* Feed bytes; events are dispatched as their blank line arrives. 0, the callback's non-zero, -1 for a
 * line over max_line, -2 for an event over max_event, -3 when out of memory. */
int oa_sse_feed(oa_sse *p, const char *buf, size_t n, oa_sse_fn fn, void *arg);
/* True when bytes of an unfinished event or line are pending (the stream ended inside an event). */
bool oa_sse_pending(const oa_sse *p);

#endif
