/* API-RPC-SCHEMAS, API-HTTP-HANDLER: the browser's uplink envelope checks (plugins/browser/envelope.c). The
 * input's first line is the route (the URL's method, or "respond"); the rest is the body, parsed as the
 * plugin parses it. Any body is either refused with a reason and no call, or becomes exactly one call: the
 * URL's method with an object or array payload as params, or request.respond {id: rpcId, value | error};
 * an rpcId is reported only when it is a string of at most 256 bytes. */
#include <jansson.h>

#include "../../plugins/browser/envelope.h"
#include "fuzz_support.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *f[2] = {0};
  char *buf = NULL;
  size_t n = fuzz_fields(data, size, '\n', f, 2, &buf);
  if (n == 0)
    return 0;
  bool respond = strcmp(f[0], "respond") == 0;
  const char *url_method = respond ? NULL : f[0];
  const char *body = n > 1 ? f[1] : "";
  json_t *env = json_loadb(body, strlen(body), JSON_DECODE_ANY, NULL);
  be_call c;
  be_check(env, respond, url_method, &c);
  if (c.rpc_id) {
    FUZZ_CHECK(json_is_object(env));
    FUZZ_CHECK(c.rpc_id == json_string_value(json_object_get(env, "rpcId")));
    FUZZ_CHECK(strlen(c.rpc_id) <= BE_RPC_ID_MAX);
  }
  if (c.why) {
    FUZZ_CHECK(c.params == NULL && c.method == NULL);
  } else {
    FUZZ_CHECK(json_is_object(env) && c.rpc_id && c.method && c.params);
    if (respond) {
      const char *kind = json_string_value(json_object_get(env, "kind"));
      FUZZ_CHECK(kind && strcmp(kind, "client-response") == 0);
      FUZZ_CHECK(strcmp(c.method, "request.respond") == 0);
      FUZZ_CHECK(json_is_object(c.params) && json_object_size(c.params) == 2);
      FUZZ_CHECK(strcmp(json_string_value(json_object_get(c.params, "id")), c.rpc_id) == 0);
      json_t *value = json_object_get(c.params, "value"), *error = json_object_get(c.params, "error");
      FUZZ_CHECK((value != NULL) != (error != NULL));
      FUZZ_CHECK(!error || (json_is_object(error) && json_is_string(json_object_get(error, "code")) &&
                            json_is_string(json_object_get(error, "message"))));
    } else {
      const char *kind = json_string_value(json_object_get(env, "kind"));
      FUZZ_CHECK(kind && strcmp(kind, "client-request") == 0);
      FUZZ_CHECK(strcmp(c.method, url_method) == 0);
      FUZZ_CHECK(strcmp(json_string_value(json_object_get(env, "method")), url_method) == 0);
      FUZZ_CHECK(json_is_object(c.params) || json_is_array(c.params));
      json_t *payload = json_object_get(env, "payload");
      FUZZ_CHECK(payload && !json_is_null(payload) ? c.params == payload : json_object_size(c.params) == 0);
    }
  }
  json_decref(c.params);
  json_decref(env);
  free(buf);
  return 0;
}
