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

/* G8 on the pages libwebsockets writes itself (a method or target it does not serve: TRACE, OPTIONS *, an
 * absolute-form target...): the strict API values, as vhost headers. Those are added by
 * lws_add_http_header_status, which the plugin's own responses do not use (their CSP and cache policy differ
 * by route), so each response carries each header once. */
static const struct lws_protocol_vhost_options own_page_headers[] = {
    {&own_page_headers[1], NULL, "x-content-type-options:", "nosniff"},
    {&own_page_headers[2], NULL, "content-security-policy:", csp_api},
    {&own_page_headers[3], NULL, "x-frame-options:", "DENY"},
    {&own_page_headers[4], NULL, "cache-control:", "no-store"},
    {&own_page_headers[5], NULL, "cross-origin-resource-policy:", "same-origin"},
    {NULL, NULL, "referrer-policy:", "no-referrer"},
};

const struct lws_protocol_vhost_options *bp_own_page_headers(void) {
  return own_page_headers;
}

void bp_refuse_raw(struct lws *wsi) {
  static const char body[] = "{\"kind\":\"server-response\",\"error\":{\"code\":\"bad-request\","
                             "\"message\":\"method not allowed\"}}";
  char text[LWS_PRE + 1024];
  int n =
      snprintf(text + LWS_PRE, sizeof text - LWS_PRE,
               "HTTP/1.1 405 Method Not Allowed\r\ncontent-type: application/json\r\ncontent-length: %zu\r\n"
               "allow: GET, POST\r\n",
               sizeof body - 1);
  for (const struct lws_protocol_vhost_options *h = own_page_headers; h; h = h->next)
    n += snprintf(text + LWS_PRE + n, sizeof text - LWS_PRE - (size_t)n, "%s %s\r\n", h->name, h->value);
  n += snprintf(text + LWS_PRE + n, sizeof text - LWS_PRE - (size_t)n, "connection: close\r\n\r\n%s", body);
  lws_write(wsi, (unsigned char *)text + LWS_PRE, (size_t)n, LWS_WRITE_RAW);
}

/* The statuses the plugin answers with: the reason phrase of the status line and the error code of a
 * refusal's body. */
static const struct {
  int status;
  const char *phrase;
  const char *category;
} statuses[] = {
    {200, "OK", NULL},
    {304, "Not Modified", NULL},
    {400, "Bad Request", "bad-request"},
    {401, "Unauthorized", "unauthorized"},
    {403, "Forbidden", "forbidden"},
    {404, "Not Found", "not-found"},
    {405, "Method Not Allowed", "bad-request"},
    {408, "Request Timeout", "timeout"},
    {411, "Length Required", "bad-request"},
    {413, "Content Too Large", "bad-request"},
    {415, "Unsupported Media Type", "bad-request"},
    {426, "Upgrade Required", "bad-request"},
    {431, "Request Header Fields Too Large", "bad-request"},
    {500, "Internal Server Error", "internal"},
    {503, "Service Unavailable", "unavailable"},
};

static const char *reason_phrase(int status) {
  for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
    if (statuses[i].status == status)
      return statuses[i].phrase;
  return ""; /* RFC 9112 4: the reason phrase may be empty */
}

static const char *status_category(int status) {
  for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
    if (statuses[i].status == status && statuses[i].category)
      return statuses[i].category;
  return "bad-request";
}

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
  char line[64];
  int n = snprintf(line, sizeof line, "HTTP/1.1 %d %s", status, reason_phrase(status));
  int bad = lws_add_http_header_by_name(wsi, NULL, (const unsigned char *)line, n, &p, end);
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

void bp_hold_input(bp_http *h, struct lws *wsi) {
  if (!h->rx_held && lws_rx_flow_control(wsi, 0) == 0)
    h->rx_held = true;
}

static void resume_input(bp_http *h, struct lws *wsi) {
  if (h->rx_held) {
    h->rx_held = false;
    lws_rx_flow_control(wsi, 1);
  }
}

/* Write the pending answer: reading resumes and the transaction ends (libwebsockets then reads a pipelined
 * request, or the end of a half-closed connection). An answer larger than the socket takes at once is
 * finished by libwebsockets; a pipelined request read meanwhile closes the connection once the answer is
 * out (server.c, BODY_COMPLETION without a request). -1: the connection is to be closed. */
static int write_out(bp_http *h, struct lws *wsi) {
  bp_out out = h->out;
  memset(&h->out, 0, sizeof h->out);
  if (!out.buf)
    return 0;
  int n = lws_write(wsi, out.buf + LWS_PRE, out.len, LWS_WRITE_HTTP_FINAL);
  free(out.buf);
  resume_input(h, wsi);
  if (n < 0 || out.close_after)
    return -1;
  return lws_http_transaction_completed(wsi) ? -1 : 0;
}

static void flush_now(ah_timer *t, void *arg) {
  (void)t;
  bp_http *h = arg;
  h->flush = NULL;
  struct lws *wsi = h->wsi;
  /* A host timer, outside libwebsockets' callbacks: a synchronous close is safe here. */
  if (wsi && write_out(h, wsi) != 0)
    lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC);
}

void bp_send_later(bp_http *h, struct lws *wsi) {
  bp_hold_input(h, wsi);
  h->wsi = wsi;
  if (!h->flush && h->st->api->timer_start(h->st->m, 0, 0, flush_now, h, &h->flush) != 0) {
    h->flush = NULL;
    /* No timer: reading resumes and libwebsockets' HTTP_WRITEABLE writes it. */
    resume_input(h, wsi);
    lws_callback_on_writable(wsi);
  }
}

void bp_http_write_now(bp_http *h, struct lws *wsi) {
  if (h->flush)
    h->st->api->timer_stop(h->flush);
  h->flush = NULL;
  h->out.close_after = true;
  write_out(h, wsi);
}

int bp_http_writeable(bp_http *h, struct lws *wsi) {
  return write_out(h, wsi);
}

void bp_http_closed(bp_http *h) {
  if (h->rec && AH_HAS(h->st->api, ah_host_api, record_close))
    h->st->api->record_close(h->rec, false);
  h->rec = NULL;
  if (h->flush)
    h->st->api->timer_stop(h->flush);
  h->flush = NULL;
  h->wsi = NULL;
  free(h->out.buf);
  memset(&h->out, 0, sizeof h->out);
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
