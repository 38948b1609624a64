/* agenthost — the JSON-RPC peer's C functions (host/jsonrpc.c; not installed).
 *
 * The library target agenthost-jsonrpc: linked into the core and into the C client library. Each function
 * is the entry of ah_rpc_api (agenthost/jsonrpc.h) of the same name, documented there; plugins reach them
 * only through that table. ah_rpc_pending_* are for the host and the client alone.
 */
#ifndef AGENTHOST_HOST_JSONRPC_H
#define AGENTHOST_HOST_JSONRPC_H

#include <stdbool.h>

#include "agenthost/jsonrpc.h"

int ah_rpc_open(uv_stream_t *in, uv_stream_t *out, const ah_rpc_opts *opts, ah_rpc_peer **out_peer);
int ah_rpc_request(ah_rpc_peer *peer, const char *method, json_t *params, ah_rpc_response_fn cb, void *arg,
                   int64_t *id_out);
int ah_rpc_forget(ah_rpc_peer *peer, int64_t id);
int ah_rpc_notify(ah_rpc_peer *peer, const char *method, json_t *params);
int ah_rpc_respond(ah_rpc_inbound *req, json_t *result);
int ah_rpc_respond_error(ah_rpc_inbound *req, int code, const char *message, json_t *data);
const json_t *ah_rpc_inbound_id(const ah_rpc_inbound *req);
ah_rpc_peer *ah_rpc_inbound_peer(const ah_rpc_inbound *req);
int ah_rpc_close(ah_rpc_peer *peer, ah_rpc_closed_fn cb, void *arg);

/* Observe every line the peer sends (sent = true, before it is queued) and every complete line it
 * receives (before it is parsed), without its terminator; NULL stops. For recordings (record.h): the host's
 * stdio surfaces and the C client. */
typedef void (*ah_rpc_observe_fn)(void *arg, bool sent, const char *line, size_t len);
void ah_rpc_observe(ah_rpc_peer *peer, ah_rpc_observe_fn fn, void *arg);

/* Number of inbound requests not yet answered and outbound requests still pending. */
size_t ah_rpc_pending_inbound(const ah_rpc_peer *peer);
size_t ah_rpc_pending_outbound(const ah_rpc_peer *peer);

/* The table filled with the functions above (static storage): what the host hands plugins as api->rpc. */
const ah_rpc_api *ah_rpc_api_get(void);

#endif
