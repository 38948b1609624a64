/* agenthost — offline analysis of recordings and exports (`agenthost analyze`, docs/usage.md).
 *
 * Reads observation JSONL (docs/usage.md "Recordings": one record per message as sent or received, with
 * source, connection, per-connection sequence, direction, times and the original payload) and session
 * exports (one stored event per line), in any mix, and reports per session and turn: usage increments and
 * totals, cost under a given price table, questions and approvals (pending or answered, and by which
 * connection), tool failures, repeated identical calls, subagent links, and coverage (event seq gaps, a
 * missing prefix, unknown kinds and methods kept as opaque counts, connection sequence gaps, losses and
 * requests whose outcome is unknown). No server, network or credentials: lines are data.
 *
 * Streaming: a line is parsed, folded into per-session, per-turn and per-connection state, and dropped;
 * memory grows with the number of sessions, turns, requests and connections, never with payload bytes.
 * Duplicates (the same record read twice, two recordings of one connection) are dropped by source,
 * connection and sequence, and stored events by session and seq — never by text.
 */
#ifndef AGENTHOST_HOST_ANALYZE_H
#define AGENTHOST_HOST_ANALYZE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "usage.h"

typedef struct ah_analysis ah_analysis;

typedef struct ah_analysis_opts {
  const ah_prices *prices; /* NULL: costs are not computed */
  const char *as_of;       /* RFC 3339 UTC time (or a date: the end of that day); NULL: everything */
  int repeat_threshold;    /* identical calls reported from this many on (0: 3) */
} ah_analysis_opts;

ah_analysis *ah__analysis_new(const ah_analysis_opts *opts);
void ah__analysis_free(ah_analysis *a);
/* Start a new input (a file): its name and, when found beside it, its metadata document (borrowed). */
void ah__analysis_input(ah_analysis *a, const char *name, const json_t *meta);
/* One line of the current input (without its newline). */
void ah__analysis_line(ah_analysis *a, const char *line, size_t len);
/* The report (docs/usage.md "agenthost analyze"). */
json_t *ah__analysis_report(ah_analysis *a);
/* The report as a text table. */
void ah__analysis_print(const json_t *report, FILE *out);

/* `agenthost analyze [--json] [--prices FILE] [--as-of TIME] [--repeat N] FILE…`; returns the exit code
 * (0, also when coverage is incomplete — the report says so; 2 for a usage error or an unreadable file). */
int ah__cmd_analyze(int argc, char **argv);

#endif
