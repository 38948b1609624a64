/* agenthost browser plugin — the checks of an uplink envelope (envelope.h). */
#include "envelope.h"

#include <string.h>

static const char *str_of(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

static void request_call(const json_t *env, const char *url_method, be_call *out) {
  const char *kind = str_of(env, "kind");
  const char *method = str_of(env, "method");
  json_t *payload = json_object_get(env, "payload");
  if (!kind || strcmp(kind, "client-request") != 0)
    out->why = "kind: \"client-request\" is required";
  else if (!method)
    out->why = "method: a string is required";
  else if (!url_method || strcmp(method, url_method) != 0)
    out->why = "the envelope's method differs from the URL's";
  else if (payload && !json_is_null(payload) && !json_is_object(payload) && !json_is_array(payload))
    out->why = "payload: an object or an array is required";
  if (out->why)
    return;
  out->params = payload && !json_is_null(payload) ? json_incref(payload) : json_object();
  out->method = url_method;
  if (!out->params)
    out->why = "out of memory";
}

static void response_call(const json_t *env, be_call *out) {
  const char *kind = str_of(env, "kind");
  json_t *value = json_object_get(env, "value");
  json_t *error = json_object_get(env, "error");
  if (!kind || strcmp(kind, "client-response") != 0)
    out->why = "kind: \"client-response\" is required";
  else if ((value != NULL) == (error != NULL))
    out->why = "exactly one of value or error is required";
  else if (error && (!json_is_object(error) || !str_of(error, "code") || !str_of(error, "message")))
    out->why = "error: {code, message} is required";
  if (out->why)
    return;
  out->params = json_pack("{s:s, s:O}", "id", out->rpc_id, value ? "value" : "error", value ? value : error);
  out->method = "request.respond";
  if (!out->params)
    out->why = "out of memory";
}

void be_check(const json_t *env, bool respond, const char *url_method, be_call *out) {
  memset(out, 0, sizeof *out);
  const char *rpc = json_is_object(env) ? str_of(env, "rpcId") : NULL;
  if (rpc && strlen(rpc) <= BE_RPC_ID_MAX)
    out->rpc_id = rpc;
  if (!json_is_object(env))
    out->why = "the envelope must be a JSON object";
  else if (!out->rpc_id)
    out->why = "rpcId: a string of at most 256 bytes is required";
  else if (respond)
    response_call(env, out);
  else
    request_call(env, url_method, out);
}
