/* agenthost browser plugin — the response toolkit every part of the plugin answers with: a complete
 * response (status, the hardening headers of SECURITY.md G8, extra headers, body) built for one lws_write,
 * an immediate refusal, the caller a request is dispatched as, and the escaped log record of a refusal.
 * It calls into no other file of the plugin, so the dispatcher (server.c), the API (api.c), the static UI
 * (static.c) and the WebSockets (ws.c) all depend on it and it on none of them. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "browser.h"

static const char csp_api[] = "default-src 'none'; frame-ancestors 'none'";
static const char csp_ui[] = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                             "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
                             "frame-ancestors 'none'";

const ah_caller *bp_caller(ah_caller *c, bool loopback, uint64_t conn_id) {
  memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  /* Privilege by peer address (getpeername) with a valid token — every caller here presented one. */
  c->authority = loopback ? AH_AUTH_LOOPBACK : AH_AUTH_LAN;
  c->surface = "browser";
  c->connection_id = conn_id;
  return c;
}

/* ---- responses ---------------------------------------------------------------------------------------- */

static int add_header(struct lws *wsi, const char *name, const char *value, unsigned char **p,
                      unsigned char *end) {
  return lws_add_http_header_by_name(wsi, (const unsigned char *)name, (const unsigned char *)value,
                                     (int)strlen(value), p, end);
}

int bp_build_response(struct lws *wsi, bp_out *out, int status, const char *ctype, const char *extra,
                      const void *body, size_t len, bool is_api, bool close_after) {
  size_t extra_len = extra ? strlen(extra) : 0;
  size_t cap = LWS_PRE + 1024 + extra_len * 2 + len;
  unsigned char *buf = malloc(cap);
  if (!buf)
    return -1;
  unsigned char *start = buf + LWS_PRE;
  unsigned char *p = start;
  unsigned char *end = buf + cap - len;
  int bad = lws_add_http_header_status(wsi, (unsigned int)status, &p, end);
  if (!bad && ctype)
    bad = lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, (const unsigned char *)ctype,
                                       (int)strlen(ctype), &p, end);
  if (!bad)
    bad = lws_add_http_header_content_length(wsi, len, &p, end);
  /* G8: on every response. Never any Access-Control-Allow-* header. */
  if (!bad)
    bad = add_header(wsi, "x-content-type-options:", "nosniff", &p, end) ||
          add_header(wsi, "content-security-policy:", is_api ? csp_api : csp_ui, &p, end) ||
          add_header(wsi, "x-frame-options:", "DENY", &p, end) ||
          add_header(wsi, "cache-control:", is_api ? "no-store" : "no-cache", &p, end) ||
          add_header(wsi, "cross-origin-resource-policy:", "same-origin", &p, end) ||
          add_header(wsi, "referrer-policy:", "no-referrer", &p, end);
  /* extra: "name:value\n" lines */
  const char *e = extra;
  while (!bad && e && *e) {
    const char *nl = strchr(e, '\n');
    const char *colon = strchr(e, ':');
    if (!nl || !colon || colon > nl)
      break;
    char name[64];
    char value[512];
    size_t nlen = (size_t)(colon - e) + 1;
    size_t vlen = (size_t)(nl - colon - 1);
    if (nlen >= sizeof name || vlen >= sizeof value)
      break;
    memcpy(name, e, nlen);
    name[nlen] = '\0';
    memcpy(value, colon + 1, vlen);
    value[vlen] = '\0';
    bad = add_header(wsi, name, value, &p, end);
    e = nl + 1;
  }
  if (!bad && close_after)
    bad = add_header(wsi, "connection:", "close", &p, end);
  if (!bad)
    bad = lws_finalize_http_header(wsi, &p, end);
  if (bad) {
    free(buf);
    return -1;
  }
  if (len)
    memcpy(p, body, len);
  p += len;
  free(out->buf);
  out->buf = buf;
  out->len = (size_t)(p - start);
  out->close_after = close_after;
  return 0;
}

void bp_send_later(bp_http *h, struct lws *wsi) {
  (void)h;
  lws_callback_on_writable(wsi);
}

static const char *status_category(int status) {
  switch (status) {
  case 401:
    return "unauthorized";
  case 403:
    return "forbidden";
  case 404:
    return "not-found";
  case 408:
    return "timeout";
  case 500:
    return "internal";
  case 503:
    return "unavailable";
  default:
    return "bad-request";
  }
}

int bp_refuse_now(bp_state *st, struct lws *wsi, int status, const char *reason, const char *allow,
                  bool www_auth, bool close_after) {
  (void)st;
  json_t *body = json_pack("{s:s, s:{s:s, s:s}}", "kind", "server-response", "error", "code",
                           status_category(status), "message", reason);
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  char extra[128] = "";
  if (allow)
    snprintf(extra, sizeof extra, "allow:%s\n", allow);
  else if (status == 426)
    snprintf(extra, sizeof extra, "sec-websocket-version:13\n");
  else if (www_auth)
    snprintf(extra, sizeof extra, "www-authenticate:Bearer realm=\"agenthost\"\n");
  bp_out out = {0};
  int rc = bp_build_response(wsi, &out, status, "application/json", extra, text ? text : "{}",
                             text ? strlen(text) : 2, true, close_after);
  free(text);
  if (rc == 0) {
    if (lws_write(wsi, out.buf + LWS_PRE, out.len, LWS_WRITE_HTTP_FINAL) != (int)out.len)
      rc = -1;
    free(out.buf);
  }
  return rc;
}

static void peer_text(struct lws *wsi, char *buf, size_t cap, struct sockaddr_storage *ss) {
  socklen_t sl = sizeof *ss;
  memset(ss, 0, sizeof *ss);
  snprintf(buf, cap, "?");
  int fd = lws_get_socket_fd(wsi);
  if (fd < 0 || getpeername(fd, (struct sockaddr *)ss, &sl) != 0)
    return;
  char a[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET)
    inet_ntop(AF_INET, &((struct sockaddr_in *)ss)->sin_addr, a, sizeof a);
  else if (ss->ss_family == AF_INET6)
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ss)->sin6_addr, a, sizeof a);
  snprintf(buf, cap, "%s", a);
}

/* T9: one record; the host's logger escapes control characters; header values are never logged except the
 * User-Agent (escaped), never the Authorization, Cookie or Sec-WebSocket-Protocol. */
void bp_log_refusal(bp_state *st, struct lws *wsi, const char *method, const char *path, int status,
                    const char *reason) {
  char peer[INET6_ADDRSTRLEN + 2];
  struct sockaddr_storage ss;
  peer_text(wsi, peer, sizeof peer, &ss);
  char ua[256] = "";
  if (lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_USER_AGENT) > 0)
    lws_hdr_copy(wsi, ua, sizeof ua, WSI_TOKEN_HTTP_USER_AGENT);
  st->api->log(st->m, AH_PLOG_WARN, "refused %s %s: %d %s (peer %s, user-agent \"%s\")", method, path, status,
               reason, peer, ua);
}
