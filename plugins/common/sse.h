/* agenthost plugins — an incremental parser of server-sent events (the WHATWG "event stream" format),
 * compiled into the plugins that read event streams (openai, mcp): bytes in pieces split anywhere, lines
 * ending in CRLF, LF or CR, `data:` lines joined with "\n", comments and unknown fields ignored, an event
 * dispatched at a blank line; `id:` sets the last event id and `retry:` the reconnection time, kept in the
 * parser for a client that resumes a stream. Bounded: a line or an event's data longer than its cap is an
 * error, never a growing buffer. Pure: no host, no loop. */
#ifndef AGENTHOST_PLUGINS_SSE_H
#define AGENTHOST_PLUGINS_SSE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct sse_parser {
  size_t max_line;  /* bytes of one line */
  size_t max_event; /* bytes of one event's data */
  char *line;
  size_t line_len, line_cap;
  char *data;
  size_t data_len, data_cap;
  bool has_data;
  bool after_cr; /* the last byte was a CR: an LF right after it ends no second line */
  char event[64];
  char last_id[256]; /* the last `id:` seen ("" until one); an id with a NUL, or longer, is ignored */
  long retry_ms;     /* the last valid `retry:` (digits only); -1 until one */
} sse_parser;

/* One event: its type ("message" when the stream named none) and data (NUL-terminated, without the
 * last "\n"). Return non-zero to stop: sse_feed returns it. */
typedef int (*sse_fn)(void *arg, const char *event, const char *data, size_t len);

void sse_init(sse_parser *p, size_t max_line, size_t max_event);
void sse_free(sse_parser *p);
/* Feed bytes; events are dispatched as their blank line arrives. 0, the callback's non-zero, -1 for a
 * line over max_line, -2 for an event over max_event, -3 when out of memory. */
int sse_feed(sse_parser *p, const char *buf, size_t n, sse_fn fn, void *arg);
/* True when bytes of an unfinished event or line are pending (the stream ended inside an event). */
bool sse_pending(const sse_parser *p);

#endif
