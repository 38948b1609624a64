/* agenthost browser plugin — the checks of an uplink envelope (DECISIONS.md "Browser envelopes"), pure.
 *
 * be_check() looks only at the parsed body and the route: a client-request to POST /api/<method> becomes a
 * call of that method with the payload as its params; a client-response to POST /api/respond becomes
 * request.respond {id: rpcId, value | error}. Anything else is refused with a constant phrase saying why
 * (answered 400 with the rpcId when one could be read). It reads no socket, so it is unit-tested and
 * fuzzed on its own (tests/fuzz/fuzz_envelope.c).
 */
#ifndef AGENTHOST_BROWSER_ENVELOPE_H
#define AGENTHOST_BROWSER_ENVELOPE_H

#include <jansson.h>
#include <stdbool.h>

#define BE_RPC_ID_MAX 256 /* bytes of an rpcId */

typedef struct be_call {
  const char *why;    /* NULL: accepted; else why not (a constant phrase) */
  const char *rpc_id; /* the envelope's rpcId (borrowed from it) when a string of at most BE_RPC_ID_MAX
                       * bytes, else NULL */
  const char *method; /* accepted: the core method to call (`url_method` or "request.respond") */
  json_t *params;     /* accepted: its params (a new reference: an object or an array) */
} be_call;

/* Check `env` (the parsed body, any JSON value) sent to POST /api/respond (`respond`) or to POST
 * /api/<url_method>. */
void be_check(const json_t *env, bool respond, const char *url_method, be_call *out);

#endif
