/* agenthost — recordings: observation JSONL and its metadata document (docs/usage.md "Recordings").
 *
 * One writer, used by the host (per surface connection) and by the C client (its own connection); the
 * Python client and the web UI write the same format. A recording is a file of records, one per line:
 *   {"v":1, "side":"host"|"client", "source", "conn", "seq", "dir":"sent"|"received", "wall", "mono",
 *    "payload" | "raw", "corr"?}
 *   {"v":1, "side", "source", "conn", "seq", "event":"open"|"close"|"loss", "wall", "mono", "detail"?}
 * `seq` counts the records of one connection from 1 without gaps (a missing number is a lost record);
 * `wall` is RFC 3339 UTC with milliseconds; `mono` nanoseconds of the clock named in the metadata (its
 * domain: comparable only within it); `payload` the message as sent or received, parsed, with credentials
 * redacted by name; `raw` a message that was not JSON, as text. Beside it, FILE.meta.json (written when the
 * file is opened): {format: "agenthost.recording", version: 1, source, side, recordingRunId, hostRunId?,
 * hostVersion?, schemaVersion?, provider?, model?, clock: {mono, domain, unit}, started, part}.
 *
 * Size caps and rotation: a file larger than max_bytes is closed and part N+1 opened (FILE.N.jsonl with its
 * own metadata); at most max_files parts are kept, the oldest removed. Files are 0600. A write error stops
 * the recording (logged once by the caller through ah_recorder_failed), never the traffic.
 */
#ifndef AGENTHOST_HOST_RECORD_H
#define AGENTHOST_HOST_RECORD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ah_recorder ah_recorder;

typedef struct ah_recorder_opts {
  const char *dir;    /* existing or created (0700) */
  const char *source; /* e.g. "host:sdk", "client:c" */
  const char *side;   /* "host" | "client" */
  uint64_t max_bytes; /* per part; 0 = 64 MiB */
  int max_files;      /* parts kept; 0 = 8 */
  const json_t *meta; /* more metadata keys (hostRunId, hostVersion, schemaVersion, provider, model, …) */
} ah_recorder_opts;

int ah_recorder_open(const ah_recorder_opts *o, ah_recorder **out, char *err, size_t cap);
/* A message as sent or received on `conn` (its bytes, without a line terminator). */
void ah_recorder_message(ah_recorder *r, const char *conn, bool sent, const char *data, size_t len,
                         const char *corr);
/* A connection event: "open", "close" or "loss" (with an optional detail). */
void ah_recorder_mark(ah_recorder *r, const char *conn, const char *event, const char *detail);
/* The path of the current part (for status lines: never a body). */
const char *ah_recorder_path(const ah_recorder *r);
/* True once a write failed (nothing more is written). */
bool ah_recorder_failed(const ah_recorder *r);
void ah_recorder_close(ah_recorder *r);

/* Replace credentials in `v` (in place): values of keys named like a credential (authorization, cookie,
 * token, api_key, secret, password, …, and keys ending in _token, _key, _secret, _password), bearer
 * WebSocket subprotocols ("agenthost.bearer.…"), "Bearer …" values, and token= in URLs. */
void ah_recorder_redact(json_t *v);

#endif
