/* A child of a benchmark that speaks JSON lines on its stdin and stdout (agenthost sdk / acp, an MCP server):
 * write one message, read the next one with a deadline. Shared by bench/acp.c and bench/mcp.c. */
#ifndef AGENTHOST_BENCH_LINES_H
#define AGENTHOST_BENCH_LINES_H

#include <jansson.h>
#include <stdint.h>

#include "bench_util.h"

typedef struct bench_chan {
  bench_proc proc; /* label, pid, pipes, stderr log */
  char *rbuf;
  size_t rlen, rcap;
} bench_chan;

/* Kill and reap the child, free the buffer. */
void bench_chan_reap(bench_chan *c);
/* One line (printf format, at most 2 KiB, "\n" added). 0 or -1 (reported). */
int bench_chan_send(bench_chan *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The next message from the child (parsed, an object), or NULL (reported) on EOF, error or the deadline
 * (bench_now_ns() time). */
json_t *bench_chan_next(bench_chan *c, uint64_t deadline);

/* The longest bench_chan_answer() waits. */
#define BENCH_CHAN_WAIT_NS (30ull * 1000000000ull)
/* Wait for the answer to request `id` (returned; the caller frees it; NULL, reported, on an error answer or
 * none). Notifications go to `on_note` (may be NULL); requests from the child are answered -32601. */
json_t *bench_chan_answer(bench_chan *c, int64_t id, void (*on_note)(const json_t *msg, void *arg),
                          void *arg);

/* One SDK `session/prompt` with `text` (already escaped for a JSON string) that runs one tool: the times to
 * the tool's stored result and to the turn's end (ns). Answers an approval with allow_always; a failed tool
 * is an error (reported). 0 or -1. */
int bench_chan_tool_prompt(bench_chan *c, int64_t id, const char *text, uint64_t *to_result,
                           uint64_t *to_end);

#endif
