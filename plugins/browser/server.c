/* agenthost browser plugin — mount and withdraw, the libwebsockets context on the host's loop, the protocol
 * callback and the responses (PROTOCOLS.md "Browser API", SECURITY.md, STACK-NOTES.md).
 *
 * libwebsockets runs on the host's libuv loop (a foreign loop): one context with explicit vhosts, one vhost
 * per listener (127.0.0.1:7878 and [::1]:7878 by default). Every request's headers go through the fence
 * (fence.c) inside LWS_CALLBACK_HTTP or LWS_CALLBACK_HTTP_CONFIRM_UPGRADE, before any body byte is accepted;
 * a refusal is written there and then, and a connection whose refused request announced a body is closed.
 *
 * Withdraw (STACK-NOTES "Shutdown with a foreign loop"): never from inside an lws callback. WebSockets are
 * closed with 1001, in-flight calls cancelled, then lws_context_destroy() runs from a host timer; the timer
 * then waits until no loop handle has a callback inside libwebsockets or its evlib (uv_walk + dladdr) and no
 * close is pending, and calls lws_context_destroy() the second time, which frees the context.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "browser.h"

#define DEFAULT_LISTEN "127.0.0.1:7878,[::1]:7878"

/* ---- configuration ------------------------------------------------------------------------------------ */

static char **split_list(const char *s, size_t *n) {
  *n = 0;
  if (!s)
    return NULL;
  char **out = NULL;
  const char *p = s;
  while (*p) {
    while (*p == ',' || *p == ' ' || *p == '\t')
      p++;
    const char *start = p;
    while (*p && *p != ',')
      p++;
    const char *end = p;
    while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
      end--;
    if (end > start) {
      char **grown = realloc(out, (*n + 1) * sizeof *out);
      if (!grown)
        break;
      out = grown;
      out[*n] = strndup(start, (size_t)(end - start));
      if (out[*n])
        (*n)++;
    }
  }
  return out;
}

static void free_list(char **l, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(l[i]);
  free(l);
}

static int parse_u64(const json_t *config, const char *key, uint64_t def, uint64_t *out) {
  const json_t *v = json_object_get(config, key);
  if (!v) {
    *out = def;
    return 0;
  }
  if (json_is_integer(v) && json_integer_value(v) >= 0) {
    *out = (uint64_t)json_integer_value(v);
    return 0;
  }
  const char *t = json_string_value(v);
  if (!t || !isdigit((unsigned char)*t))
    return -1;
  char *end = NULL;
  errno = 0;
  unsigned long long x = strtoull(t, &end, 10);
  if (errno || *end)
    return -1;
  *out = x;
  return 0;
}

/* "127.0.0.1:7878", "[::1]:7878", "0.0.0.0:80". */
static int parse_listener(const char *spec, char **addr, int *port) {
  const char *colon = NULL;
  char host[128];
  if (spec[0] == '[') {
    const char *close = strchr(spec, ']');
    if (!close || close[1] != ':' || (size_t)(close - spec - 1) >= sizeof host)
      return -1;
    memcpy(host, spec + 1, (size_t)(close - spec - 1));
    host[close - spec - 1] = '\0';
    colon = close + 1;
  } else {
    colon = strrchr(spec, ':');
    if (!colon || (size_t)(colon - spec) >= sizeof host || colon == spec)
      return -1;
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = '\0';
  }
  unsigned char buf[sizeof(struct in6_addr)];
  if (inet_pton(AF_INET, host, buf) != 1 && inet_pton(AF_INET6, host, buf) != 1)
    return -1;
  char *end = NULL;
  long p = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || p < 0 || p > 65535)
    return -1;
  *addr = strdup(host);
  *port = (int)p;
  return *addr ? 0 : -1;
}

static int load_config(bp_state *st, const json_t *config) {
  const char *listen = json_string_value(json_object_get(config, "listen"));
  bool defaulted = !listen || !*listen;
  size_t n = 0;
  char **specs = split_list(defaulted ? DEFAULT_LISTEN : listen, &n);
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    if (st->nlisten == BP_MAX_LISTEN ||
        parse_listener(specs[i], &st->listen_addr[st->nlisten], &st->listen_port[st->nlisten]) != 0) {
      st->api->log(st->m, AH_PLOG_ERROR, "listen: \"%s\" is not ADDRESS:PORT (IPv6 as [ADDRESS]:PORT)",
                   specs[i]);
      rc = AH_ECONFIG;
    } else {
      st->nlisten++;
    }
  }
  free_list(specs, n);
  if (rc == 0 && st->nlisten == 0) {
    st->api->log(st->m, AH_PLOG_ERROR, "listen: no address");
    rc = AH_ECONFIG;
  }
  if (rc)
    return rc;
  st->hosts = split_list(json_string_value(json_object_get(config, "allowed_hosts")), &st->nhosts);
  st->origins = split_list(json_string_value(json_object_get(config, "allowed_origins")), &st->norigins);
  uint64_t queue = 0, budget = 0, ping = 0, hto = 0, bto = 0, max_ws = 0;
  if (parse_u64(config, "max_body", 1u << 20, &st->max_body) ||
      parse_u64(config, "max_body_prompt", 160u << 20, &st->max_body_prompt) ||
      parse_u64(config, "body_budget", 512u << 20, &st->body_budget) ||
      parse_u64(config, "ws_queue_bytes", 8u << 20, &queue) ||
      parse_u64(config, "ws_budget_bytes", 64u << 20, &budget) || parse_u64(config, "ping_s", 30, &ping) ||
      parse_u64(config, "header_timeout_s", 10, &hto) || parse_u64(config, "body_timeout_s", 10, &bto) ||
      parse_u64(config, "max_websockets", 256, &max_ws)) {
    st->api->log(
        st->m, AH_PLOG_ERROR,
        "max_body, max_body_prompt, body_budget, ws_queue_bytes, ws_budget_bytes, ping_s, header_timeout_s, "
        "body_timeout_s and max_websockets must be non-negative integers");
    return AH_ECONFIG;
  }
  st->ws_queue_max = (size_t)queue;
  st->ws_budget_max = (size_t)budget;
  st->max_ws = (size_t)max_ws;
  st->ping_s = (unsigned)(ping ? ping : 30);
  st->header_timeout_s = (unsigned)(hto ? hto : 10);
  st->body_timeout_s = (unsigned)(bto ? bto : 10);
  return 0;
}

/* A socket of listener `i` bound to its address (SO_REUSEADDR, IPv6 only for an IPv6 address), with
 * `flags` added to its type; -1 with errno. */
static int bound_socket(bp_state *st, size_t i, int flags) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t sl = 0;
  int af = strchr(st->listen_addr[i], ':') ? AF_INET6 : AF_INET;
  if (af == AF_INET) {
    struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)st->listen_port[i]);
    inet_pton(AF_INET, st->listen_addr[i], &in->sin_addr);
    sl = sizeof *in;
  } else {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)st->listen_port[i]);
    inet_pton(AF_INET6, st->listen_addr[i], &in6->sin6_addr);
    sl = sizeof *in6;
  }
  int fd = socket(af, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
  int one = 1;
  if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
                  (af == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) ||
                  bind(fd, (struct sockaddr *)&ss, sl) != 0)) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

/* Bind every listener before libwebsockets exists, so that a port in use is a clear error at mount; the
 * bound sockets are kept (listen_fd) and listened on by listen_on(). */
static int bind_listeners(bp_state *st, bool defaulted_v6_optional) {
  for (size_t i = 0; i < st->nlisten; i++) {
    int af = strchr(st->listen_addr[i], ':') ? AF_INET6 : AF_INET;
    int fd = bound_socket(st, i, SOCK_NONBLOCK);
    if (fd >= 0) {
      st->listen_fd[i] = fd; /* listened on once libwebsockets exists (listen_on) */
      continue;
    }
    int err = errno;
    if (af == AF_INET6 && defaulted_v6_optional && err != EADDRINUSE) {
      st->api->log(st->m, AH_PLOG_WARN, "not listening on [%s]:%d: %s", st->listen_addr[i],
                   st->listen_port[i], strerror(err));
      free(st->listen_addr[i]);
      memmove(&st->listen_addr[i], &st->listen_addr[i + 1],
              (st->nlisten - i - 1) * sizeof st->listen_addr[0]);
      memmove(&st->listen_port[i], &st->listen_port[i + 1],
              (st->nlisten - i - 1) * sizeof st->listen_port[0]);
      st->nlisten--;
      i--;
      continue;
    }
    st->api->log(st->m, AH_PLOG_ERROR, "cannot listen on %s%s%s:%d: %s%s", af == AF_INET6 ? "[" : "",
                 st->listen_addr[i], af == AF_INET6 ? "]" : "", st->listen_port[i], strerror(err),
                 err == EADDRINUSE ? " (the port is in use: is another agenthost running? see --listen)"
                                   : "");
    return AH_EIO;
  }
  return st->nlisten ? 0 : AH_EIO;
}

/* ---- the method table ------------------------------------------------------------------------------- */

bf_method_class bp_classify(const char *method, void *arg) {
  bp_state *st = arg;
  json_t *v = st->methods ? json_object_get(st->methods, method) : NULL;
  if (!v)
    return BF_METHOD_UNKNOWN;
  return json_is_true(v) ? BF_METHOD_PRIVILEGED : BF_METHOD_PUBLIC;
}

static void described(const ah_outcome *o, void *arg) {
  bp_state *st = arg;
  st->describe_calls--;
  if (o->status == 0 && !st->withdrawing) {
    json_t *table = json_object();
    size_t i = 0, j = 0;
    json_t *p = NULL, *mt = NULL;
    json_array_foreach(json_object_get(o->result, "plugins"), i, p) {
      json_array_foreach(json_object_get(p, "methods"), j, mt) {
        const char *name = json_string_value(json_object_get(mt, "name"));
        if (name)
          json_object_set_new(table, name, json_boolean(json_is_true(json_object_get(mt, "privileged"))));
      }
    }
    json_decref(st->methods);
    st->methods = table;
  }
}

void bp_refresh_methods(bp_state *st) {
  ah_caller c;
  if (st->api->dispatch(st->m, bp_caller(&c, true, 0), "host.describe", NULL, NULL, described, st) == 0)
    st->describe_calls++;
}

static void on_event(const char *name, const json_t *data, void *arg) {
  bp_state *st = arg;
  if (st->withdrawing)
    return;
  if (strcmp(name, "plugin.mounted") == 0 || strcmp(name, "plugin.withdrawn") == 0)
    bp_refresh_methods(st);
  bp_ws_on_event(st, name, data);
}

/* ---- the protocol callback ---------------------------------------------------------------------------- */

/* A header the fence reads, NULL when absent. One that does not fit `buf` is named in *over (the fence
 * refuses the request: a value that does not fit must never read as a missing header). */
static char *hdr(struct lws *wsi, enum lws_token_indexes t, char *buf, size_t cap, const char **over) {
  int len = lws_hdr_total_length(wsi, t);
  if (len <= 0)
    return NULL;
  if ((size_t)len >= cap || lws_hdr_copy(wsi, buf, (int)cap, t) < 0) {
    if (!*over) {
      const unsigned char *name = lws_token_to_string(t);
      *over = name ? (const char *)name : "a header";
    }
    return NULL;
  }
  return buf;
}

static char *custom_hdr(struct lws *wsi, const char *name, char *buf, size_t cap, const char **over) {
  int n = (int)strlen(name);
  int len = lws_hdr_custom_length(wsi, name, n);
  if (len < 0)
    return NULL;
  if ((size_t)len >= cap || lws_hdr_custom_copy(wsi, buf, (int)cap, name, n) < 0) {
    if (!*over)
      *over = name;
    return NULL;
  }
  return buf;
}

static const char *http_method(struct lws *wsi) {
  static const struct {
    enum lws_token_indexes t;
    const char *name;
  } methods[] = {
      {WSI_TOKEN_GET_URI, "GET"},   {WSI_TOKEN_POST_URI, "POST"},   {WSI_TOKEN_OPTIONS_URI, "OPTIONS"},
      {WSI_TOKEN_PUT_URI, "PUT"},   {WSI_TOKEN_PATCH_URI, "PATCH"}, {WSI_TOKEN_DELETE_URI, "DELETE"},
      {WSI_TOKEN_HEAD_URI, "HEAD"}, {WSI_TOKEN_CONNECT, "CONNECT"},
  };
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
    if (lws_hdr_total_length(wsi, methods[i].t) > 0)
      return methods[i].name;
  return "OTHER";
}

static enum lws_token_indexes uri_token(const char *method) {
  if (strcmp(method, "POST") == 0)
    return WSI_TOKEN_POST_URI;
  if (strcmp(method, "OPTIONS") == 0)
    return WSI_TOKEN_OPTIONS_URI;
  if (strcmp(method, "PUT") == 0)
    return WSI_TOKEN_PUT_URI;
  if (strcmp(method, "PATCH") == 0)
    return WSI_TOKEN_PATCH_URI;
  if (strcmp(method, "DELETE") == 0)
    return WSI_TOKEN_DELETE_URI;
  if (strcmp(method, "HEAD") == 0)
    return WSI_TOKEN_HEAD_URI;
  return WSI_TOKEN_GET_URI;
}

typedef struct hdrs {
  char host[512], origin[512], sfs[64], sfm[64], auth[256], proto[1024], ctype[256], clen[64], te[128],
      upgrade[64], path[BP_HDR_MAX * 2 + 2];
} hdrs;

/* Gather the request for the fence. */
static void gather(bp_state *st, struct lws *wsi, const char *method, const char *in, bool upgrade, hdrs *h,
                   struct sockaddr_storage *peer, bf_request *r) {
  memset(r, 0, sizeof *r);
  r->method = method;
  int total = lws_hdr_total_length(wsi, uri_token(method));
  if (in) {
    snprintf(h->path, sizeof h->path, "%s", in);
  } else if (total > 0) {
    lws_hdr_copy(wsi, h->path, sizeof h->path, uri_token(method));
  } else {
    h->path[0] = '\0';
  }
  r->path = h->path;
  /* The decoded target's length as lws stored it: a NUL decoded from %00 makes it longer than strlen(). */
  r->path_len = total > 0 && (size_t)total >= strlen(h->path) ? (size_t)total : strlen(h->path);
  if (r->path_len >= sizeof h->path)
    r->path_len = sizeof h->path - 1;
  r->upgrade = upgrade;
  const char **over = &r->oversized;
  char *up = hdr(wsi, WSI_TOKEN_UPGRADE, h->upgrade, sizeof h->upgrade, over);
  if (up && strcasecmp(up, "websocket") != 0)
    r->upgrade_other = up;
  else if (up && !upgrade)
    r->upgrade = true;
  r->host = hdr(wsi, WSI_TOKEN_HOST, h->host, sizeof h->host, over);
  r->host_count = r->host ? 1 : 0;
  char extra[8];
  if (r->host && lws_hdr_copy_fragment(wsi, extra, sizeof extra, WSI_TOKEN_HOST, 1) >= 0)
    r->host_count = 2;
  r->origin = hdr(wsi, WSI_TOKEN_ORIGIN, h->origin, sizeof h->origin, over);
  r->sec_fetch_site = custom_hdr(wsi, "sec-fetch-site:", h->sfs, sizeof h->sfs, over);
  r->sec_fetch_mode = custom_hdr(wsi, "sec-fetch-mode:", h->sfm, sizeof h->sfm, over);
  r->authorization = hdr(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, h->auth, sizeof h->auth, over);
  r->ws_protocol = hdr(wsi, WSI_TOKEN_PROTOCOL, h->proto, sizeof h->proto, over);
  r->content_type = hdr(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, h->ctype, sizeof h->ctype, over);
  r->content_length = hdr(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH, h->clen, sizeof h->clen, over);
  r->transfer_encoding = hdr(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING, h->te, sizeof h->te, over);
  socklen_t sl = sizeof *peer;
  memset(peer, 0, sizeof *peer);
  int fd = lws_get_socket_fd(wsi);
  if (fd >= 0)
    getpeername(fd, (struct sockaddr *)peer, &sl);
  r->peer = (const struct sockaddr *)peer;
  (void)st;
}

static void policy_of(bp_state *st, bf_policy *p) {
  memset(p, 0, sizeof *p);
  p->token = st->token;
  p->hosts = (const char *const *)st->hosts;
  p->nhosts = st->nhosts;
  p->origins = (const char *const *)st->origins;
  p->norigins = st->norigins;
  p->ports = st->ports;
  p->nports = st->nports;
  p->any_ip_literal = st->any_ip;
  p->max_body = st->max_body;
  p->max_body_prompt = st->max_body_prompt;
  p->classify = bp_classify;
  p->classify_arg = st;
}

/* A refused request that announced a body: the connection is closed, the body never read. */
static bool body_announced(const bf_request *r) {
  return r->transfer_encoding || (r->content_length && strcmp(r->content_length, "0") != 0);
}

static uint64_t conn_id_of(bp_state *st, struct lws *wsi) {
  bp_conn *c = lws_get_opaque_user_data(wsi);
  if (c && c->magic == BP_CONN_MAGIC)
    return c->id;
  c = calloc(1, sizeof *c);
  if (!c)
    return ++st->next_conn;
  c->magic = BP_CONN_MAGIC;
  c->id = ++st->next_conn;
  lws_set_opaque_user_data(wsi, c);
  return c->id;
}

static int on_http(bp_state *st, bp_http *h, struct lws *wsi, const char *in) {
  h->conn_id = conn_id_of(st, wsi);
  h->st = st;
  const char *method = http_method(wsi);
  hdrs hb;
  struct sockaddr_storage peer;
  bf_request r;
  gather(st, wsi, method, in, false, &hb, &peer, &r);
  bf_policy pol;
  policy_of(st, &pol);
  bf_decision d;
  bf_decide(&pol, &r, &d);
  if (d.status == 0 && st->withdrawing) {
    d.status = 503;
    d.reason = "the server is stopping";
  }
  if (d.status) {
    bp_log_refusal(st, wsi, method, r.path, d.status, d.reason);
    bool close = body_announced(&r);
    if (bp_refuse_now(st, wsi, d.status, d.reason, d.allow, d.status == 401, close) != 0)
      return -1;
    return close ? -1 : (lws_http_transaction_completed(wsi) ? -1 : 0);
  }
  switch (d.route) {
  case BF_ROUTE_API:
  case BF_ROUTE_RESPOND:
    return bp_api_begin(st, h, wsi, &d);
  case BF_ROUTE_EXPORT:
    return bp_export_begin(st, h, wsi, &d);
  case BF_ROUTE_STATIC:
    return bp_static_serve(st, h, wsi, r.path);
  default:
    /* An upgrade route reached without an upgrade: the fence answers 400 before this. */
    return -1;
  }
}

static int on_confirm_upgrade(bp_state *st, struct lws *wsi) {
  const char *method = http_method(wsi);
  hdrs hb;
  struct sockaddr_storage peer;
  bf_request r;
  gather(st, wsi, method, NULL, true, &hb, &peer, &r);
  bf_policy pol;
  policy_of(st, &pol);
  bf_decision d;
  bf_decide(&pol, &r, &d);
  if (d.status == 0 && d.route != BF_ROUTE_WS_MUX && d.route != BF_ROUTE_WS_HOST) {
    d.status = 404;
    d.reason = "not found";
  }
  if (d.status == 0 && st->withdrawing) {
    d.status = 503;
    d.reason = "the server is stopping";
  }
  if (d.status == 0 && st->nws >= st->max_ws) {
    d.status = 503;
    d.reason = "too many WebSockets";
  }
  /* RFC 6455 4.4: only version 13 is spoken; another is answered 426 naming it. */
  char version[16];
  if (d.status == 0 &&
      (lws_hdr_copy(wsi, version, sizeof version, WSI_TOKEN_VERSION) <= 0 || strcmp(version, "13") != 0)) {
    d.status = 426;
    d.reason = "Sec-WebSocket-Version 13 is required";
  }
  if (d.status) {
    /* T3: refused before 101, never after. */
    bp_log_refusal(st, wsi, method, r.path, d.status, d.reason);
    bp_refuse_now(st, wsi, d.status, d.reason, d.allow, d.status == 401, true);
    return 1;
  }
  return bp_ws_confirm(st, wsi, &d);
}

static int bp_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
  struct lws_context *ctx = wsi ? lws_get_context(wsi) : NULL;
  bp_state *st = ctx ? lws_context_user(ctx) : NULL;
  bp_http *h = user;
  if (!st)
    return 0;
  switch (reason) {
  case LWS_CALLBACK_HTTP:
    return on_http(st, h, wsi, in);
  case LWS_CALLBACK_HTTP_BODY:
    return h && h->req ? bp_api_body(st, h, wsi, in, len) : -1;
  case LWS_CALLBACK_HTTP_BODY_COMPLETION:
    if (h && h->req)
      return bp_api_body_done(st, h, wsi);
    /* Again, without a request: libwebsockets 4.1 repeats the completion, and then closes the connection
     * whatever is answered, when it reads a request pipelined behind another from its own buffer (it hands
     * the new request's header bytes over as its body) or while a large answer is still going out. The
     * pending answer is written now and the connection closes after it (libwebsockets flushes it first). */
    if (h)
      bp_http_write_now(h, wsi);
    return -1;
  case LWS_CALLBACK_HTTP_WRITEABLE:
    return h ? bp_http_writeable(h, wsi) : 0;
  case LWS_CALLBACK_CLOSED_HTTP:
    if (h) {
      if (h->req)
        bp_req_detach(h->req);
      h->req = NULL;
      bp_http_closed(h);
    }
    return 0;
  case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
    return on_confirm_upgrade(st, wsi);
  case LWS_CALLBACK_WSI_DESTROY: {
    bp_ws *w = lws_get_opaque_user_data(wsi);
    if (w && w->magic == BP_WS_MAGIC) {
      lws_set_opaque_user_data(wsi, NULL);
      bp_ws_destroy(w);
    } else if (w && ((bp_conn *)(void *)w)->magic == BP_CONN_MAGIC) {
      lws_set_opaque_user_data(wsi, NULL);
      free(w);
    }
    if (h && h->req) {
      bp_req_detach(h->req);
      h->req = NULL;
    }
    if (h)
      bp_http_closed(h);
    return 0;
  }
  case LWS_CALLBACK_RAW_ADOPT:
    /* libwebsockets 4.1 turns a CONNECT into a raw socket bound to this protocol, with no deadline: it is
     * answered 405 and closed instead of being held for ever. */
    lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, 5);
    lws_callback_on_writable(wsi);
    return 0;
  case LWS_CALLBACK_RAW_WRITEABLE:
    bp_refuse_raw(wsi);
    return -1;
  case LWS_CALLBACK_ESTABLISHED:
  case LWS_CALLBACK_SERVER_WRITEABLE:
  case LWS_CALLBACK_RECEIVE:
  case LWS_CALLBACK_CLOSED:
    return bp_ws_callback(st, wsi, reason, in, len);
  default:
    return 0;
  }
}

/* ---- listening -------------------------------------------------------------------------------------- */

/* Out of descriptors (EMFILE/ENFILE): accepting pauses for ACCEPT_PAUSE_MS and is tried again; the waiting
 * connections stay in the kernel's backlog. One log line when an episode starts and one when it ends. */
#define ACCEPT_PAUSE_MS 250

static void listen_poll_cb(uv_poll_t *p, int status, int events);

static void accept_resume(ah_timer *t, void *arg) {
  (void)t;
  bp_state *st = arg;
  st->accept_timer = NULL;
  if (st->withdrawing)
    return;
  for (size_t i = 0; i < st->nlisten; i++)
    if (st->listen_fd[i] >= 0)
      uv_poll_start(&st->listen_poll[i], UV_READABLE, listen_poll_cb);
}

static void accept_pause(bp_state *st, int err) {
  for (size_t i = 0; i < st->nlisten; i++)
    if (st->listen_fd[i] >= 0)
      uv_poll_stop(&st->listen_poll[i]);
  if (!st->accept_paused) {
    st->accept_paused = true;
    st->accept_refused = 0;
    st->api->log(st->m, AH_PLOG_WARN,
                 "cannot accept connections: %s; accepting pauses and is retried every %d ms", strerror(err),
                 ACCEPT_PAUSE_MS);
  }
  st->accept_refused++;
  if (!st->accept_timer)
    st->api->timer_start(st->m, ACCEPT_PAUSE_MS, 0, accept_resume, st, &st->accept_timer);
}

static void listen_poll_cb(uv_poll_t *p, int status, int events) {
  (void)events;
  bp_state *st = p->data;
  size_t i = (size_t)(p - st->listen_poll);
  if (status < 0 || st->withdrawing)
    return;
  for (int n = 0; n < 64; n++) { /* a bounded batch per wake-up: the loop serves the others in between */
    int fd = accept4(st->listen_fd[i], NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_pause(st, errno);
      else if (errno != EAGAIN && errno != EWOULDBLOCK)
        st->api->log(st->m, AH_PLOG_WARN, "accept: %s", strerror(errno));
      return;
    }
    if (st->accept_paused) {
      st->accept_paused = false;
      st->api->log(st->m, AH_PLOG_INFO, "accepting connections again (paused %llu time(s))",
                   (unsigned long long)st->accept_refused);
    }
    /* No Nagle: a small frame or answer goes out at once, not after the peer's delayed ACK of the one
     * before (tens of milliseconds), as on the sockets libwebsockets accepts itself. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!lws_adopt_socket_vhost(st->vhosts[i], fd))
      close(fd); /* lws refused it (no room in its table): the peer sees the connection closed */
  }
}

/* Listen on listener `i` (bound by bind_listeners) and watch it for connections; the bound port is
 * returned, or -1 with errno (the socket is closed then). */
static int listen_on(bp_state *st, size_t i) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int fd = st->listen_fd[i];
  if (listen(fd, SOMAXCONN) != 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0 ||
      uv_poll_init(st->loop, &st->listen_poll[i], fd) != 0) {
    int err = errno ? errno : EIO;
    close(fd);
    st->listen_fd[i] = -1;
    errno = err;
    return -1;
  }
  st->listen_poll[i].data = st;
  st->listeners_open++;
  uv_poll_start(&st->listen_poll[i], UV_READABLE, listen_poll_cb);
  return ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                 : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

static void listener_closed(uv_handle_t *h) {
  bp_state *st = h->data;
  st->listeners_open--;
}

/* Withdraw: stop accepting (the polls are the plugin's handles: closed before it reports done). */
static void stop_listening(bp_state *st) {
  if (st->accept_timer)
    st->api->timer_stop(st->accept_timer);
  st->accept_timer = NULL;
  for (size_t i = 0; i < st->nlisten; i++) {
    if (st->listen_fd[i] < 0)
      continue;
    uv_close((uv_handle_t *)&st->listen_poll[i], listener_closed);
    close(st->listen_fd[i]);
    st->listen_fd[i] = -1;
  }
}

/* ---- the context -------------------------------------------------------------------------------------- */

static int start_lws(bp_state *st) {
  /* libwebsockets' own log: errors only, on stderr (it never sees a token: nothing here logs headers). */
  lws_set_log_level(LLL_ERR, NULL);
  st->protocols[0] = (struct lws_protocols){
      .name = "http", .callback = bp_callback, .per_session_data_size = sizeof(bp_http), .rx_buffer_size = 0};
  st->protocols[1] = (struct lws_protocols){
      .name = "agenthost.v1", .callback = bp_callback, .per_session_data_size = 0, .rx_buffer_size = 4096};
  memset(&st->protocols[2], 0, sizeof st->protocols[2]);
  st->retry = (lws_retry_bo_t){.secs_since_valid_ping = (uint16_t)st->ping_s,
                               .secs_since_valid_hangup = (uint16_t)(st->ping_s * 2 + 10)};
  void *loops[1] = {st->loop};
  struct lws_context_creation_info info;
  memset(&info, 0, sizeof info);
  info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_EXPLICIT_VHOSTS;
  info.foreign_loops = loops;
  info.pcontext = &st->ctx;
  /* Every descriptor the process may open is a possible connection: lws sizes its descriptor table from
   * this (its entries are indexed by fd) and takes one header table per connection still sending its
   * headers, so a pool smaller than the connections lets idle sockets stall everyone (finding 4: 64 idle
   * connections held the whole pool for the 10 s header deadline). */
  struct rlimit nofile = {0};
  rlim_t fds = getrlimit(RLIMIT_NOFILE, &nofile) == 0 ? nofile.rlim_cur : 1024;
  if (fds == RLIM_INFINITY || fds > 65536)
    fds = 65536;
  if (fds < 256)
    fds = 256;
  info.fd_limit_per_thread = (unsigned int)fds;
  info.port = CONTEXT_PORT_NO_LISTEN;
  info.protocols = st->protocols;
  info.user = st;
  info.count_threads = 1;
  info.timeout_secs = st->header_timeout_s;
  info.timeout_secs_ah_idle = st->header_timeout_s;
  info.keepalive_timeout = 60;
  info.max_http_header_data = 16384;
  info.max_http_header_pool = (unsigned short)(fds > 65535 ? 65535 : fds);
  st->ctx = lws_create_context(&info);
  if (!st->ctx) {
    st->api->log(st->m, AH_PLOG_ERROR,
                 "cannot create the libwebsockets context (is libwebsockets-evlib-uv installed?)");
    return AH_EIO;
  }
  for (size_t i = 0; i < st->nlisten; i++) {
    struct lws_context_creation_info vi;
    memset(&vi, 0, sizeof vi);
    char *name = st->vhost_names[i];
    snprintf(name, sizeof st->vhost_names[i], "bp%u", (unsigned)(i % BP_MAX_LISTEN));
    bool v6 = strchr(st->listen_addr[i], ':') != NULL;
    vi.vhost_name = name;
    vi.port = CONTEXT_PORT_NO_LISTEN_SERVER; /* the plugin listens and adopts what it accepts */
    vi.protocols = st->protocols;
    vi.options = LWS_SERVER_OPTION_LIBUV |
                 (v6 ? LWS_SERVER_OPTION_IPV6_V6ONLY_MODIFY | LWS_SERVER_OPTION_IPV6_V6ONLY_VALUE
                     : LWS_SERVER_OPTION_DISABLE_IPV6);
    vi.retry_and_idle_policy = &st->retry;
    vi.headers = bp_own_page_headers();
    vi.keepalive_timeout = 60;
    vi.timeout_secs = st->header_timeout_s;
    /* G7 / H27: the header deadline is absolute from the connection's start (or the previous request's end):
     * libwebsockets does not restart it for every byte that trickles in. */
    vi.timeout_secs_ah_idle = st->header_timeout_s;
    st->vhosts[i] = lws_create_vhost(st->ctx, &vi);
    if (!st->vhosts[i]) {
      /* Rare: the context is kept and destroyed by withdraw, on later loop turns, as STACK-NOTES
       * requires. */
      st->api->log(st->m, AH_PLOG_ERROR, "cannot listen on %s%s%s:%d", v6 ? "[" : "", st->listen_addr[i],
                   v6 ? "]" : "", st->listen_port[i]);
      close(st->listen_fd[i]);
      st->listen_fd[i] = -1;
      continue;
    }
    int port = listen_on(st, i);
    if (port < 0) {
      st->api->log(st->m, AH_PLOG_ERROR, "cannot listen on %s%s%s:%d: %s", v6 ? "[" : "", st->listen_addr[i],
                   v6 ? "]" : "", st->listen_port[i], strerror(errno));
      continue;
    }
    st->ports[st->nports++] = port;
    if (strcmp(st->listen_addr[i], "0.0.0.0") == 0 || strcmp(st->listen_addr[i], "::") == 0)
      st->any_ip = true;
    else {
      /* The listener's own IP literal is a valid Host (T1). */
      char **grown = realloc(st->hosts, (st->nhosts + 1) * sizeof *grown);
      if (grown) {
        st->hosts = grown;
        st->hosts[st->nhosts] = strdup(st->listen_addr[i]);
        if (st->hosts[st->nhosts])
          st->nhosts++;
      }
    }
    st->api->log(st->m, AH_PLOG_INFO, "listening on http://%s%s%s:%d/", v6 ? "[" : "", st->listen_addr[i],
                 v6 ? "]" : "", port);
  }
  return 0;
}

/* browser.rotate-token (privileged): a new token; every live WebSocket generation is closed with 1008 so
 * that clients rebuild with the new token (SECURITY.md §2.2 item 5, DECISIONS.md `agenthost token rotate`).
 */
static void m_rotate(ah_call *call, const json_t *params, void *data) {
  (void)params;
  bp_state *st = data;
  int rc = bp_token_rotate(st);
  if (rc) {
    st->api->call_error(call, rc, "the token could not be replaced", NULL);
    return;
  }
  bp_ws_close_all(st, 1008, "token rotated");
  st->api->call_reply(call, json_pack("{s:b}", "rotated", 1));
}

/* browser.launch-url (privileged): {url: "http://HOST:PORT/#k=TOKEN"}, the URL that opens the web UI. The
 * token is in the fragment, which a browser never sends to the server (SECURITY.md §2.2); the host prints
 * it once on stdout at start and `agenthost url` asks for it; it is never logged. */
static void m_launch_url(ah_call *call, const json_t *params, void *data) {
  (void)params;
  bp_state *st = data;
  if (st->nports == 0) {
    st->api->call_error(call, AH_EUNAVAILABLE, "the browser surface is not listening", NULL);
    return;
  }
  char base[256], token[BF_TOKEN_CHARS + 1], url[320];
  bp_base_url(st, base, sizeof base);
  bf_token_encode(st->token, token);
  snprintf(url, sizeof url, "%s#k=%s", base, token);
  st->api->call_reply(call, json_pack("{s:s}", "url", url));
  explicit_bzero(token, sizeof token);
  explicit_bzero(url, sizeof url);
}

/* ---- mount and withdraw -------------------------------------------------------------------------------- */

static void state_free(bp_state *st) {
  /* Sockets still bound here were never watched (a mount that failed): withdraw closed the others. */
  for (size_t i = 0; i < st->nlisten; i++) {
    if (st->listen_fd[i] >= 0)
      close(st->listen_fd[i]);
    free(st->listen_addr[i]);
  }
  free_list(st->hosts, st->nhosts);
  free_list(st->origins, st->norigins);
  free(st->ui_dir);
  free(st->wbuf);
  free(st->marked_js);
  free(st->dompurify_js);
  free(st->chartjs_js);
  if (st->ui_fd >= 0)
    close(st->ui_fd);
  free(st->serve_json);
  free(st->token_path);
  json_decref(st->methods);
  json_decref(st->last_value);
  free(st->last_value_text);
  explicit_bzero(st->token, sizeof st->token);
  free(st);
}

static int bp_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  if (!AH_HAS(api, ah_host_api, loop))
    return AH_EABI;
  bp_state *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  st->m = m;
  st->api = api;
  st->loop = api->loop(m);
  st->ui_fd = -1;
  for (size_t i = 0; i < BP_MAX_LISTEN; i++)
    st->listen_fd[i] = -1;
  const char *listen = json_string_value(json_object_get(config, "listen"));
  int rc = load_config(st, config);
  if (rc == 0)
    rc = bp_token_load(st, config);
  if (rc == 0)
    rc = bp_ui_open(st, config);
  if (rc == 0)
    rc = bind_listeners(st, !listen || !*listen);
  if (rc == 0)
    rc = api->subscribe(m, "*", on_event, st, &st->sub);
  if (rc == 0) {
    const ah_method_def rotate = {.struct_size = sizeof rotate,
                                  .name = "browser.rotate-token",
                                  .handler = m_rotate,
                                  .flags = AH_METHOD_PRIVILEGED,
                                  .data = st};
    rc = api->register_method(m, &rotate);
  }
  if (rc == 0) {
    const ah_method_def launch = {.struct_size = sizeof launch,
                                  .name = "browser.launch-url",
                                  .handler = m_launch_url,
                                  .flags = AH_METHOD_PRIVILEGED,
                                  .data = st};
    rc = api->register_method(m, &launch);
  }
  if (rc == 0)
    rc = start_lws(st);
  if (rc) {
    if (st->sub)
      api->unsubscribe(st->sub);
    state_free(st);
    return rc;
  }
  bp_refresh_methods(st);
  /* The discovery file belongs to the daemon (which holds the runtime directory's lock), not to a stdio
   * child that was configured to serve the browser too. */
  const char *mode = AH_HAS(api, ah_host_api, host_mode) ? api->host_mode(m) : "serve";
  if (st->nports && strcmp(mode ? mode : "", "serve") == 0 && bp_discovery_write(st) != 0)
    api->log(m, AH_PLOG_WARN,
             "the discovery file was not written: `agenthost url` will not find this server");
  *state = st;
  return 0;
}

typedef struct walk_ctx {
  int lws_handles;
} walk_ctx;

static bool in_lws(void *fn) {
  Dl_info info;
  if (!fn || !dladdr(fn, &info) || !info.dli_fname)
    return false;
  return strstr(info.dli_fname, "libwebsockets") != NULL;
}

static void walk_cb(uv_handle_t *h, void *arg) {
  walk_ctx *w = arg;
  void *cb = NULL;
  switch (h->type) {
  case UV_POLL:
    cb = (void *)((uv_poll_t *)h)->poll_cb;
    break;
  case UV_TIMER:
    cb = (void *)((uv_timer_t *)h)->timer_cb;
    break;
  case UV_IDLE:
    cb = (void *)((uv_idle_t *)h)->idle_cb;
    break;
  case UV_PREPARE:
    cb = (void *)((uv_prepare_t *)h)->prepare_cb;
    break;
  case UV_CHECK:
    cb = (void *)((uv_check_t *)h)->check_cb;
    break;
  case UV_SIGNAL:
    cb = (void *)((uv_signal_t *)h)->signal_cb;
    break;
  case UV_ASYNC:
    cb = (void *)((uv_async_t *)h)->async_cb;
    break;
  default:
    break;
  }
  if (in_lws(cb) || (uv_is_closing(h) && in_lws((void *)h->close_cb)))
    w->lws_handles++;
}

static int lws_handles_alive(bp_state *st) {
  walk_ctx w = {0};
  uv_walk(st->loop, walk_cb, &w);
  /* A close still pending in the loop (ours or not) may be one of lws's handles without a close callback,
   * whose memory the second destroy frees: wait for the loop's closing list to empty as well. */
  return w.lws_handles + (st->loop->closing_handles != NULL);
}

static void finish(bp_state *st) {
  ah_mount *m = st->m;
  ah_withdraw_done_fn done = st->done;
  const ah_host_api *api = st->api;
  if (st->wd_timer)
    api->timer_stop(st->wd_timer);
  st->wd_timer = NULL;
  state_free(st);
  done(m);
}

static void wd_tick(ah_timer *t, void *arg) {
  (void)t;
  bp_state *st = arg;
  st->wd_ticks++;
  switch (st->wd_phase) {
  case 0: /* WebSockets closing with 1001: wait for their WSI_DESTROY, at most ~1 s */
    if (st->nws > 0 && st->wd_ticks < 100)
      return;
    if (st->ctx)
      lws_context_destroy(st->ctx);
    st->wd_phase = 1;
    st->wd_ticks = 0;
    return;
  case 1: /* lws closes its handles on the following loop turns */
    if (st->ctx && lws_handles_alive(st) && st->wd_ticks < 500)
      return;
    if (st->ctx && lws_handles_alive(st))
      st->api->log(st->m, AH_PLOG_WARN, "libwebsockets still has loop handles after 5 s; destroying anyway");
    if (st->ctx)
      lws_context_destroy(st->ctx); /* the second time: frees the context (st->ctx becomes NULL) */
    st->ctx = NULL;
    st->wd_phase = 2;
    return;
  default: /* the core calls made for requests and sockets were cancelled: wait for their replies */
    if ((st->describe_calls > 0 || st->outstanding > 0 || st->listeners_open > 0) && st->wd_ticks < 300)
      return;
    if (st->describe_calls > 0 || st->outstanding > 0)
      st->api->log(st->m, AH_PLOG_WARN, "withdraw: %d call(s) still unanswered",
                   st->outstanding + st->describe_calls);
    while (st->reqs)
      bp_req_release(st->reqs);
    finish(st);
  }
}

static void bp_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  (void)m;
  bp_state *st = state;
  st->withdrawing = true;
  st->done = done;
  if (st->trim_timer)
    st->api->timer_stop(st->trim_timer);
  st->trim_timer = NULL;
  if (st->sub)
    st->api->unsubscribe(st->sub);
  st->sub = NULL;
  bp_discovery_remove(st);
  for (bp_req *r = st->reqs; r; r = r->next)
    if (r->token)
      st->api->token_trip(r->token);
  bp_follow_drop_all(st);
  stop_listening(st);
  bp_ws_close_all(st, 1001, "the server is going away");
  if (st->api->timer_start(st->m, 10, 10, wd_tick, st, &st->wd_timer) != 0) {
    st->api->log(st->m, AH_PLOG_ERROR, "withdraw: no timer; libwebsockets is left running");
    done(m);
  }
}

static const ah_plugin_desc bp_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "browser",
    .version = "0.1.0",
    .description =
        "Browser surface: HTTP + two downlink WebSockets behind the trust fence and a token, and the web UI",
    .mount = bp_mount,
    .withdraw = bp_withdraw,
    .may_withdraw = NULL,
    .commands = bp_commands,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  if (AH_ABI_MAJOR_OF(host_abi) != AH_ABI_MAJOR)
    return NULL;
  return &bp_desc;
}
