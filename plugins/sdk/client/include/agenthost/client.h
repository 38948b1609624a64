/* agenthost — C client library for the SDK surface (`agenthost sdk`, JSON-RPC 2.0 over stdio, JSON Lines).
 *
 * PROTOCOLS.md SDK-TS-CLIENT, SDK-TS-RUN, SDK-TS-DISPOSE; wire: DECISIONS.md "SDK wire",
 * docs/protocols/sdk.md.
 *
 * Model. An ah_client owns one child process (`agenthost sdk`, spawned lazily by the first call that needs
 * it, in its own session and process group), one private libuv loop and one background thread (the
 * "client thread") that runs that loop. The JSON-RPC peer is the core's own (host/jsonrpc.c, compiled into
 * this library).
 *
 * Threading rules.
 * - Every function may be called from any thread, concurrently, EXCEPT ah_client_free() which must be
 *   called once, when no other call on the client is running.
 * - Every callback (stderr lines, notifications, server requests, async request completions) runs on the
 *   client thread, one at a time, in wire order.
 * - A blocking function (ah_client_initialize, _request, _prompt, _cancel, _close_session, _run, _close)
 *   called from a callback would wait for the thread it blocks: it returns AH_ESTATE at once instead. From
 *   a callback use ah_client_request_async() (e.g. to cancel a session when turn/started is seen).
 * - Subscriptions may be added and removed from any thread, also from inside a callback; once
 *   ah_client_unsubscribe() returns, its callback is not running and will not run again.
 *
 * Errors. Functions return 0 or a negative AH_E* code (agenthost/errors.h). Functions that talk to the
 * server also fill an ah_client_error (when the caller passes one) that says what failed: see below.
 *
 * Outcomes (client principles, PROTOCOLS.md): a request that may have reached the server and then timed
 * out or lost its connection has outcome UNKNOWN — the server may still act — never a guessed success or
 * failure. There are no automatic retries, no respawn and no replay: after a transport failure every call
 * returns a TRANSPORT error until ah_client_close().
 */
#ifndef AGENTHOST_CLIENT_H
#define AGENTHOST_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agenthost/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define AH_CLIENT_API __attribute__((visibility("default")))
#else
#define AH_CLIENT_API
#endif

/* The protocol version this library speaks (the integer `protocolVersion` of `initialize`). */
#define AH_CLIENT_PROTOCOL_VERSION 1
/* Number of stderr lines of the child kept for diagnostics. */
#define AH_CLIENT_STDERR_LINES 400
/* Defaults for ah_client_opts fields left 0. */
#define AH_CLIENT_DEFAULT_TIMEOUT_MS 30000
#define AH_CLIENT_DEFAULT_CLOSE_STEP_MS 2000

typedef struct ah_client ah_client;

/* How opts.env builds the child's environment. */
typedef enum ah_client_env_mode {
  AH_CLIENT_ENV_INVALID = 0,
  /* The parent's environment (environ at spawn time), with each "NAME=VALUE" of opts.env replacing or adding
   * that variable and each bare "NAME" removing it. This is the mode used when env_mode is 0. */
  AH_CLIENT_ENV_MERGE = 1,
  /* Exactly the "NAME=VALUE" entries of opts.env (entries without "=" are ignored); nothing inherited. */
  AH_CLIENT_ENV_REPLACE = 2,
} ah_client_env_mode;

/* One complete line the child wrote to stderr, without its "\n" (borrowed for the call). Runs on the
 * client thread. */
typedef void (*ah_client_stderr_fn)(ah_client *client, const char *line, void *data);

/* Options of ah_client_new(). Zero-initialise, set struct_size = sizeof(ah_client_opts), fill what you need.
 * Every string and array is copied by ah_client_new(). */
typedef struct ah_client_opts {
  uint32_t struct_size;
  /* Program to run: a path, or a name searched in PATH. NULL: $AGENTHOST_BIN when set and non-empty, else
   * "agenthost". */
  const char *binary;
  /* Extra arguments, placed between the program and the "sdk" subcommand (agenthost's global options, e.g.
   * "--state-dir", DIR, "--config", FILE); NULL-terminated, may be NULL. */
  const char *const *args;
  /* Working directory of the child; NULL: the caller's. */
  const char *cwd;
  /* Environment entries interpreted per env_mode; NULL-terminated, may be NULL. */
  ah_client_env_mode env_mode;
  const char *const *env;
  /* Per-request local wait in milliseconds; 0: AH_CLIENT_DEFAULT_TIMEOUT_MS. */
  uint64_t request_timeout_ms;
  /* Bound of each step of ah_client_close() (shutdown answer, exit after EOF, exit after SIGTERM);
   * 0: AH_CLIENT_DEFAULT_CLOSE_STEP_MS. */
  uint64_t close_step_ms;
  /* Optional stderr line observer; the last AH_CLIENT_STDERR_LINES lines are kept either way. */
  ah_client_stderr_fn on_stderr;
  /* Optional observer of the JSON-RPC peer's diagnostics (unescaped), e.g. "unknown response id 7" for a
   * late answer to a request whose wait timed out (client principles: late replies stay observable).
   * NULL: the peer writes them escaped to this process's stderr. Runs on the client thread. */
  ah_client_stderr_fn on_diagnostic;
  /* Passed to on_stderr, on_diagnostic and returned by ah_client_data(). */
  void *data;
  void *reserved[8];
  /* Since 0.2 (after the reserved slots; the library reads it only when struct_size covers it): record this
   * connection — every line sent and received, with its sequence and times — as observation JSONL with its
   * metadata document in this directory (created 0700; `agenthost analyze` reads it). NULL: no recording.
   * The child's environment and arguments are never recorded; credential values are redacted by name. */
  const char *record_dir;
} ah_client_opts;

typedef enum ah_client_error_kind {
  AH_CLIENT_ERR_NONE = 0,
  AH_CLIENT_ERR_RPC = 1,       /* the server answered with a JSON-RPC error: code, message, data */
  AH_CLIENT_ERR_TRANSPORT = 2, /* the child could not start, or its pipes closed / it exited */
  AH_CLIENT_ERR_TIMEOUT = 3,   /* the local wait ended: outcome UNKNOWN */
  AH_CLIENT_ERR_PROTOCOL = 4,  /* the server answered something this library cannot accept */
} ah_client_error_kind;

typedef enum ah_client_outcome {
  AH_CLIENT_OUTCOME_NONE = 0,
  AH_CLIENT_OUTCOME_FAILED = 1,  /* the request certainly failed (or was never sent) */
  AH_CLIENT_OUTCOME_UNKNOWN = 2, /* it may have been sent and the server may still act on it */
} ah_client_outcome;

/* What went wrong in a call. Zero-initialise before the first use; the library clears it (freeing what it
 * held) at the start of every call that takes one; release it with ah_client_error_clear(). */
typedef struct ah_client_error {
  ah_client_error_kind kind;
  ah_client_outcome outcome;
  char *method;        /* the request concerned (owned), NULL when none */
  int64_t id;          /* its JSON-RPC id, -1 when it was never sent */
  int64_t code;        /* RPC: the error code */
  char *message;       /* RPC: the server's message; others: a description (owned, may be NULL) */
  json_t *data;        /* RPC: the error's data (a reference, owned), NULL when absent */
  bool exited;         /* TRANSPORT: the child's exit was observed */
  int64_t exit_status; /* TRANSPORT: its exit status when exited */
  int term_signal;     /* TRANSPORT: the signal that ended it, 0 if none */
  char *stderr_tail;   /* TRANSPORT: the last AH_CLIENT_STDERR_LINES stderr lines, "\n"-joined (owned) */
} ah_client_error;

/* Free what `err` holds and zero it. NULL is accepted. Any thread. */
AH_CLIENT_API void ah_client_error_clear(ah_client_error *err);

/* Create a client. Nothing is spawned yet (the first call that talks to the server does it) but the client
 * thread is started. `opts` may be NULL (all defaults). Returns 0 and *out, or AH_EINVAL (NULL out, bad
 * struct_size, bad env_mode), AH_ENOMEM, AH_EIO (the loop or thread could not start). Any thread. */
AH_CLIENT_API int ah_client_new(const ah_client_opts *opts, ah_client **out);

/* opts.data of the client. */
AH_CLIENT_API void *ah_client_data(const ah_client *client);

/* The child's pid, or 0 when it was not spawned. After ah_client_close() returns it stays the (reaped)
 * pid, so that callers can check it is gone. Any thread. */
AH_CLIENT_API pid_t ah_client_pid(ah_client *client);

/* A copy of the kept stderr lines ("\n"-joined, malloc'ed, "" when none; the caller frees), or NULL on
 * AH_ENOMEM. Any thread. */
AH_CLIENT_API char *ah_client_stderr_tail(ah_client *client);

/* Options of ah_client_initialize(). Zero-initialise and set struct_size; NULL strings are left out. */
typedef struct ah_client_init_opts {
  uint32_t struct_size;
  const char *cwd;      /* session cwd; NULL: the caller's current directory */
  const char *provider; /* provider name */
  const char *model;
  int64_t max_tokens;      /* 0: absent */
  const char *client_name; /* clientInfo.name; NULL: "agenthost-client-c" */
  bool answer_requests;    /* capabilities.requests: the server may send request/approval, request/question
                            * (answered by the handler of ah_client_set_request_handler) */
  void *reserved[6];
} ah_client_init_opts;

/* Send `initialize` and wait. Checks that result.serverInfo.name and .version are strings and that
 * protocolVersion is an integer, else returns AH_EPROTO with a PROTOCOL error. `opts` may be NULL.
 * `result` (may be NULL) receives the whole result object (a new reference, the caller decrefs).
 * Returns 0, AH_EINVAL, AH_ESTATE (called from a callback), AH_ENOMEM, AH_EPROTO (RPC or PROTOCOL error),
 * AH_ETIMEDOUT (TIMEOUT, outcome unknown), AH_ECLOSED (TRANSPORT, or the client is closed). `err` may be
 * NULL. Blocking; any thread but the client thread. */
AH_CLIENT_API int ah_client_initialize(ah_client *client, const ah_client_init_opts *opts, json_t **result,
                                       ah_client_error *err);

/* Send request `method` with `params` (stolen, also on error; NULL: no params) and wait at most
 * `timeout_ms` (0: the client's request timeout). On success *result (may be NULL) receives the result (a
 * new reference). On a timeout the local wait is abandoned (a late answer is ignored and logged) and
 * AH_ETIMEDOUT returned with a TIMEOUT error naming method and id. Returns 0, AH_EINVAL, AH_ESTATE,
 * AH_ENOMEM, AH_EPROTO (RPC error: err->code/message/data), AH_ETIMEDOUT, AH_ECLOSED (TRANSPORT, or the
 * client is closed). Blocking; any thread but the client thread. Unknown methods pass through. */
AH_CLIENT_API int ah_client_request(ah_client *client, const char *method, json_t *params,
                                    uint64_t timeout_ms, json_t **result, ah_client_error *err);

/* Completion of ah_client_request_async(): status 0 with `result` (borrowed for the call), or a negative
 * code as ah_client_request() returns with `err` describing it (borrowed for the call). Client thread. */
typedef void (*ah_client_response_fn)(ah_client *client, int status, const json_t *result,
                                      const ah_client_error *err, void *data);

/* Send a request without waiting; `params` is stolen, also on error. `cb` (may be NULL: fire and forget)
 * is called exactly once on the client thread when 0 is returned, never when an error is returned.
 * `timeout_ms` as in ah_client_request(). Returns 0, AH_EINVAL, AH_ENOMEM, AH_ECLOSED (the client is
 * closing). Any thread, including callbacks. */
AH_CLIENT_API int ah_client_request_async(ah_client *client, const char *method, json_t *params,
                                          uint64_t timeout_ms, ah_client_response_fn cb, void *data);

/* session/prompt {sessionId?, text}: the durable receipt. `session_id` may be NULL (a new session).
 * *session_id_out and *message_id_out (each may be NULL) receive malloc'ed copies. Returns as
 * ah_client_request(); AH_EPROTO with a PROTOCOL error when the receipt lacks its string fields. */
AH_CLIENT_API int ah_client_prompt(ah_client *client, const char *session_id, const char *text,
                                   char **session_id_out, char **message_id_out, ah_client_error *err);

/* session/cancel {sessionId} and session/close {sessionId}. Return as ah_client_request(). */
AH_CLIENT_API int ah_client_cancel(ah_client *client, const char *session_id, ah_client_error *err);
AH_CLIENT_API int ah_client_close_session(ah_client *client, const char *session_id, ah_client_error *err);

/* A notification: `method` (e.g. "session.event") and `params` (borrowed for the call, may be NULL).
 * Client thread. */
typedef void (*ah_client_notify_fn)(ah_client *client, const char *method, const json_t *params, void *data);

/* Subscribe to notifications whose method equals `method` (NULL: all). Every subscription sees every
 * matching notification, in wire order. Returns 0 and *sub_id (> 0; may be NULL), AH_EINVAL (NULL cb),
 * AH_ENOMEM. Any thread, also from a callback. */
AH_CLIENT_API int ah_client_subscribe(ah_client *client, const char *method, ah_client_notify_fn cb,
                                      void *data, uint64_t *sub_id);

/* End a subscription. Returns 0 or AH_ENOENT. When called outside its callback, on return the callback is
 * not running and never runs again. Any thread. */
AH_CLIENT_API int ah_client_unsubscribe(ah_client *client, uint64_t sub_id);

/* A server→client request (request/approval, request/question, or any other method). Answer it exactly
 * once with ah_client_respond() or ah_client_respond_error(), now or later, from any thread. */
typedef struct ah_client_inbound ah_client_inbound;
typedef void (*ah_client_request_fn)(ah_client *client, ah_client_inbound *req, const char *method,
                                     const json_t *params, void *data);

/* Install the handler of server requests (NULL: every server request is answered -32601). Only one handler;
 * a new one replaces the old. Returns 0. Any thread. */
AH_CLIENT_API int ah_client_set_request_handler(ah_client *client, ah_client_request_fn cb, void *data);

/* Answer `req` with `result` (stolen, also on error; NULL answers null), or with an error (`data` stolen,
 * may be NULL). The handle is freed: using it again is undefined. Returns 0, AH_EINVAL (NULL req), or
 * AH_ECLOSED when the connection is gone (the handle is freed all the same). Any thread. */
AH_CLIENT_API int ah_client_respond(ah_client_inbound *req, json_t *result);
AH_CLIENT_API int ah_client_respond_error(ah_client_inbound *req, int64_t code, const char *message,
                                          json_t *data);

/* The result of ah_client_run() (SDK-TS-RUN). Release with ah_client_run_result_clear(). */
typedef struct ah_client_run_result {
  char *session_id;     /* the root session (owned) */
  char *message_id;     /* the receipt's message id (owned) */
  char *final_response; /* the last message/committed text of the root session in the interval, NULL when
                         * none: an INTERVAL SUMMARY (what the agent last said before it was next idle),
                         * not a verdict on this prompt alone (owned) */
  char *finish_reason;  /* data.reason of the last root turn/ended: "end", "max-tokens", "cancelled",
                         * "error", "refusal"; NULL when no turn ended (owned) */
  int64_t input_tokens; /* sum of data.usage over the root turn/ended events of the interval */
  int64_t output_tokens;
  json_t *events; /* the root session's events of the interval, from the matching inbox/received to the last
                   * before idle, in wire order (owned array; unknown kinds kept as they are) */
} ah_client_run_result;

AH_CLIENT_API void ah_client_run_result_clear(ah_client_run_result *r);

/* What a run cost, in tokens (docs/usage.md): filled by ah_client_run_with_usage() when the caller passes it.
 * Each usage object is {inputTokens, cachedInputTokens, outputTokens, reasoningTokens, requests} (cached is
 * part of input, reasoning part of output); per turn, its model round trips (model/usage) when the provider
 * reported them, else its turn/ended usage — never both. Release with ah_client_run_usage_clear(). */
typedef struct ah_client_run_usage {
  uint32_t struct_size; /* sizeof(ah_client_run_usage), set by the caller */
  json_t *usage;        /* the root session's own work in the run, + {turns} (owned) */
  json_t *tree_usage;   /* + every session below it that worked in the run, each counted once, + {turns,
                         * sessions} (owned) */
  json_t *turns; /* [{sessionId, parent, turnId, usage, model?, requestedModel?, roundTrips}] of the root
                  * and the sessions below it, in the order their turns ended (owned) */
} ah_client_run_usage;

AH_CLIENT_API void ah_client_run_usage_clear(ah_client_run_usage *u);

/* ah_client_run(), and the run's usage into *usage (cleared first; its struct_size must be set). The
 * sessions below the root are those its turns started (subagent/started), and theirs. Same returns. */
AH_CLIENT_API int ah_client_run_with_usage(ah_client *client, const char *text, const char *session_id,
                                           uint64_t timeout_ms, ah_client_run_result *out,
                                           ah_client_run_usage *usage, ah_client_error *err);

/* Run one prompt to the root session's next idle: subscribe first, send session/prompt (`session_id` NULL:
 * a new session), drop every event before the inbox/received carrying the receipt's messageId, collect the
 * root session's events until its next session.status "idle", and summarise them in *out (which is
 * cleared first). `timeout_ms` bounds the whole run (0: no bound beyond the prompt request's own timeout).
 * Returns 0, AH_EINVAL, AH_ESTATE, AH_ENOMEM, AH_EPROTO (RPC error, or PROTOCOL: an event without a string
 * kind, a receipt without its fields), AH_ETIMEDOUT (TIMEOUT: the run is still going on the server),
 * AH_ECLOSED (TRANSPORT). On an error *out keeps what was collected. Blocking. */
AH_CLIENT_API int ah_client_run(ah_client *client, const char *text, const char *session_id,
                                uint64_t timeout_ms, ah_client_run_result *out, ah_client_error *err);

/* Stop the child and wait for its exit (SDK-TS-DISPOSE): a `shutdown` request bounded by close_step_ms,
 * then stdin EOF and up to close_step_ms for the exit, then SIGTERM to its process group and up to
 * close_step_ms, then SIGKILL to the group; returns only after the exit was observed and reaped. Pending
 * requests end with TRANSPORT errors. Later calls return AH_ECLOSED. Idempotent: returns 0 (also when the
 * child was never spawned). *exit_status and *term_signal (each may be NULL) receive how it ended (0 when
 * never spawned). Blocking; any thread but the client thread. */
AH_CLIENT_API int ah_client_close(ah_client *client, int64_t *exit_status, int *term_signal);

/* Close (as ah_client_close) if not yet closed, stop the client thread and free everything. No other call on
 * the client may be running or follow. NULL is accepted. Not from the client thread. */
AH_CLIENT_API void ah_client_free(ah_client *client);

#ifdef __cplusplus
}
#endif

#endif
