/* agenthost mcp plugin — the Streamable HTTP transport (being written: refuses to open for now). */
#include "mcp.h"

static int h_open(mcp_server *s, char **why) {
  *why = mcp_fmt("server %s: the Streamable HTTP transport is not available in this build yet", s->name);
  return AH_EUNAVAILABLE;
}
static int h_request(mcp_server *s, const char *method, json_t *params, mcp_reply_fn cb, void *arg,
                     int64_t *id) {
  (void)s, (void)method, (void)cb, (void)arg, (void)id;
  json_decref(params);
  return AH_ECLOSED;
}
static void h_forget(mcp_server *s, int64_t id) {
  (void)s, (void)id;
}
static int h_notify(mcp_server *s, const char *method, json_t *params) {
  (void)s, (void)method;
  json_decref(params);
  return AH_ECLOSED;
}
static void h_respond(mcp_server *s, void *inbound, json_t *result, int code, const char *message) {
  (void)s, (void)inbound, (void)code, (void)message;
  json_decref(result);
}
static void h_close(mcp_server *s) {
  mcp_server_closed(s);
}
const mcp_transport mcp_http_transport = {h_open, h_request, h_forget, h_notify, h_respond, h_close};
