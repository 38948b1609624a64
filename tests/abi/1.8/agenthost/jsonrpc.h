/* agenthost — one JSON-RPC 2.0 peer over a libuv byte stream, framed as JSON Lines.
 *
 * One implementation (host/jsonrpc.c, the library target agenthost-jsonrpc) serves the host's admin channel,
 * the sdk and acp plugins (through the host API table, `ah_host_api.rpc`, below) and the C client library,
 * which links the same library. Its C functions are not part of the plugin API.
 *
 * Wire rules (DECISIONS.md "SDK wire", PROTOCOLS.md SDK-JSONL-TRANSPORT):
 * - outbound: one compact object per line with "jsonrpc":"2.0";
 * - inbound is classified leniently: an object with "method" and "id" is a request, with "method" and no
 *   "id" a notification, with "id" and "result" or "error" and no "method" a response;
 * - invalid JSON (including a duplicate key: parsed with JSON_REJECT_DUPLICATES) → -32700 with id null;
 *   a non-object or an object that is none of the above → -32600 with id null; a response whose id is not
 *   pending → ignored and logged; in every case the stream goes on;
 * - ids are kept exactly as given: the string "1" and the number 1 are different ids;
 * - the line cap is checked while reading, before any parse: an over-long line is discarded as it streams
 *   (never buffered whole) and answered -32600 "line too long" with id null.
 *
 * Threading: every function must be called on the thread of the loop that owns the streams, and every
 * callback runs there.
 */
#ifndef AGENTHOST_JSONRPC_H
#define AGENTHOST_JSONRPC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "agenthost/errors.h"

#define AH_RPC_PARSE_ERROR (-32700)
#define AH_RPC_INVALID_REQUEST (-32600)
#define AH_RPC_METHOD_NOT_FOUND (-32601)
#define AH_RPC_INVALID_PARAMS (-32602)
#define AH_RPC_INTERNAL_ERROR (-32603)
#define AH_RPC_DEFAULT_MAX_LINE ((size_t)64 * 1024 * 1024)

typedef struct ah_rpc_peer ah_rpc_peer;
/* One inbound request waiting for its answer. Owned by the peer; valid until answered. */
typedef struct ah_rpc_inbound ah_rpc_inbound;

/* An inbound request. `params` is borrowed until the request is answered (may be NULL when absent).
 * The receiver must answer every request exactly once with respond() or respond_error(),
 * also after the peer was closed (the answer is then dropped, but the handle is freed). */
typedef void (*ah_rpc_request_fn)(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method,
                                  const json_t *params, void *data);
/* An inbound notification; `params` is borrowed for the duration of the call (may be NULL). */
typedef void (*ah_rpc_notify_fn)(ah_rpc_peer *peer, const char *method, const json_t *params, void *data);
/* The inbound side ended: `status` is 0 on EOF, a negative AH_E* code on a read error. Called at most
 * once, and not after close(); the peer stays usable for writes until close(). A last line
 * without its "\n" is still delivered before EOF. */
typedef void (*ah_rpc_eof_fn)(ah_rpc_peer *peer, int status, void *data);
/* A diagnostic line (unknown response id, parse error, …). `msg` is not escaped: log it through an
 * escaping logger. When NULL, the peer writes escaped diagnostics to stderr. */
typedef void (*ah_rpc_log_fn)(ah_rpc_peer *peer, const char *msg, void *data);

/* The answer to an outbound request. Exactly one of: status == 0 and `result` set (borrowed for the call);
 * status == AH_EPROTO and `error` set (the peer's error object {code, message, data?}, borrowed);
 * status == AH_ECLOSED when the peer was closed or the stream failed before an answer arrived. */
typedef void (*ah_rpc_response_fn)(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                                   void *arg);

typedef struct ah_rpc_opts {
  uint32_t struct_size;             /* sizeof(ah_rpc_opts) */
  size_t max_line;                  /* inbound line cap in bytes before "\n"; 0 = AH_RPC_DEFAULT_MAX_LINE */
  ah_rpc_request_fn on_request;     /* NULL: every request is answered -32601 */
  ah_rpc_notify_fn on_notification; /* NULL: notifications are dropped */
  ah_rpc_eof_fn on_eof;             /* may be NULL */
  ah_rpc_log_fn on_log;             /* may be NULL */
  void *data;                       /* passed to every callback above */
  void *reserved[4];
} ah_rpc_opts;

/* The peer, reached by a plugin through the host API (`api->rpc`, ah_host_api), so that a plugin has no
 * link-time dependency on the host. */
typedef void (*ah_rpc_closed_fn)(ah_rpc_peer *peer, void *arg);

typedef struct ah_rpc_api {
  uint32_t struct_size;
  /* Start a peer reading `in` and writing `out` (they may be the same stream, e.g. a socket). The peer
   * does not own the streams and leaves their `data` alone: after the close callback of close() the
   * caller closes them. Returns 0, AH_EINVAL (NULL argument, bad struct_size, streams on different loops,
   * `in` already read by another peer), AH_ENOMEM, or AH_EIO when reading cannot start. */
  int (*open)(uv_stream_t *in, uv_stream_t *out, const ah_rpc_opts *opts, ah_rpc_peer **out_peer);
  /* Send a request with a fresh integer id (1, 2, …). `params` is stolen, also when an error is returned
   * (NULL sends no params). `cb` must not be NULL; it is called exactly once when 0 is returned. `id_out`
   * (may be NULL) receives the id. Returns 0, AH_EINVAL (NULL peer, method or cb; method not UTF-8),
   * AH_ECLOSED (after close or a write failure), AH_ENOMEM, AH_E2BIG (a message of 4 GiB or more). */
  int (*request)(ah_rpc_peer *peer, const char *method, json_t *params, ah_rpc_response_fn cb, void *arg,
                 int64_t *id_out);
  /* Stop waiting for the answer to request `id`: the callback is never called and a later answer is
   * treated as one with an unknown id. Returns 0 or AH_ENOENT. Used by clients whose local wait timed out. */
  int (*forget)(ah_rpc_peer *peer, int64_t id);
  /* Send a notification; `params` is stolen, also on error (may be NULL). Returns 0, AH_EINVAL,
   * AH_ECLOSED, AH_ENOMEM, AH_E2BIG. */
  int (*notify)(ah_rpc_peer *peer, const char *method, json_t *params);
  /* Answer an inbound request with `result` (stolen, also on error; NULL answers null) and free the
   * handle. Returns 0, AH_ECLOSED when the peer is closed or broken (the handle is freed all the same),
   * AH_ENOMEM, AH_E2BIG, or AH_EINVAL for a NULL handle. */
  int (*respond)(ah_rpc_inbound *req, json_t *result);
  /* Answer an inbound request with a JSON-RPC error; `data` is stolen, also on error (may be NULL); frees
   * the handle. Returns the same codes as respond(). */
  int (*respond_error)(ah_rpc_inbound *req, int code, const char *message, json_t *data);
  /* The id of an inbound request, exactly as received (borrowed, valid until answered). */
  const json_t *(*inbound_id)(const ah_rpc_inbound *req);
  /* The peer an inbound request arrived on. */
  ah_rpc_peer *(*inbound_peer)(const ah_rpc_inbound *req);
  /* Close the peer: stop reading, answer every pending outbound request with AH_ECLOSED (on the next loop
   * turn, never inside this call), flush what was already written, then call `cb` (may be NULL) once on a
   * later loop turn. The peer's memory is released after `cb` and after every inbound request was
   * answered; the streams are the caller's to close after `cb`. A flush that cannot end (the other side
   * never reads) ends when the caller closes the output stream early: libuv cancels the queued writes,
   * then `cb` runs. Calling it twice is harmless (the second call returns AH_ECLOSED and never calls its
   * callback). */
  int (*close)(ah_rpc_peer *peer, ah_rpc_closed_fn cb, void *arg);
  void *reserved[8];
} ah_rpc_api;

#endif
