/* agenthost browser plugin — the trust fence (see fence.h). Pure: no I/O, no state. */
#include "fence.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define PATH_MAX_BYTES 8192

bool bf_peer_is_loopback(const struct sockaddr *sa) {
  if (!sa)
    return false;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    const uint8_t *a = in6->sin6_addr.s6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
      return true;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(a, mapped, 12) == 0 && a[12] == 127;
  }
  return false;
}

static int b64url_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '-')
    return 62;
  if (c == '_')
    return 63;
  return -1;
}

bool bf_token_decode(const char *text, size_t len, uint8_t out[BF_TOKEN_BYTES]) {
  if (!text || len != BF_TOKEN_CHARS)
    return false;
  uint32_t acc = 0;
  int bits = 0;
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    int v = b64url_value((unsigned char)text[i]);
    if (v < 0)
      return false;
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      if (n < BF_TOKEN_BYTES)
        out[n] = (uint8_t)(acc >> bits);
      n++;
    }
  }
  /* 43 characters carry 258 bits: 32 bytes and two bits that must be zero (canonical encoding). */
  return n == BF_TOKEN_BYTES && (acc & ((1u << bits) - 1)) == 0;
}

void bf_token_encode(const uint8_t in[BF_TOKEN_BYTES], char out[BF_TOKEN_CHARS + 1]) {
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  uint32_t acc = 0;
  int bits = 0;
  size_t o = 0;
  for (size_t i = 0; i < BF_TOKEN_BYTES; i++) {
    acc = (acc << 8) | in[i];
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out[o++] = alphabet[(acc >> bits) & 63];
    }
  }
  if (bits > 0)
    out[o++] = alphabet[(acc << (6 - bits)) & 63];
  out[o] = '\0';
}

bool bf_token_matches(const uint8_t token[BF_TOKEN_BYTES], const char *presented, size_t len) {
  uint8_t got[BF_TOKEN_BYTES];
  /* The length is not secret (every token has 43 characters); the bytes are compared without an early
   * exit. */
  if (!bf_token_decode(presented, len, got))
    return false;
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < BF_TOKEN_BYTES; i++)
    diff |= (uint8_t)(got[i] ^ token[i]);
  return diff == 0;
}

bool bf_host_name(const char *host, char *out, size_t cap) {
  if (!host || !*host || cap < 2)
    return false;
  const char *end = NULL;
  const char *start = host;
  if (host[0] == '[') {
    end = strchr(host, ']');
    if (!end)
      return false;
    start = host + 1;
    const char *after = end + 1;
    if (*after && *after != ':')
      return false;
    if (*after == ':') {
      for (const char *p = after + 1; *p; p++)
        if (!isdigit((unsigned char)*p))
          return false;
    }
  } else {
    const char *colon = strchr(host, ':');
    end = colon ? colon : host + strlen(host);
    if (colon) {
      if (!colon[1])
        return false;
      for (const char *p = colon + 1; *p; p++)
        if (!isdigit((unsigned char)*p))
          return false;
    }
  }
  size_t n = (size_t)(end - start);
  if (n == 0 || n >= cap)
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)start[i];
    if (!(isalnum(c) || c == '-' || c == '.' || c == ':' || c == '_'))
      return false;
    out[i] = (char)tolower(c);
  }
  out[n] = '\0';
  return true;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool is_ip_literal(const char *name) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, name, buf) == 1 || inet_pton(AF_INET6, name, buf) == 1;
}

static bool is_loopback_literal(const char *name) {
  struct in_addr a4;
  struct in6_addr a6;
  if (inet_pton(AF_INET, name, &a4) == 1)
    return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, name, &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&a6);
  return false;
}

/* T1: the Host allowlist — loopback IP literals, localhost and *.localhost (RFC 6761), the listeners' own
 * addresses and the configured names; every IP literal when a listener is a wildcard. */
static bool host_allowed(const bf_policy *pol, const char *host) {
  char name[256];
  if (!bf_host_name(host, name, sizeof name))
    return false;
  if (strcmp(name, "localhost") == 0 || ends_with(name, ".localhost") || is_loopback_literal(name))
    return true;
  if (pol->any_ip_literal && is_ip_literal(name))
    return true;
  for (size_t i = 0; i < pol->nhosts; i++)
    if (pol->hosts[i] && strcasecmp(pol->hosts[i], name) == 0)
      return true;
  return false;
}

/* T2/T3 (G3): the serialized origin compared whole after lower-casing, never by prefix; "null" never. */
static bool origin_allowed(const bf_policy *pol, const char *origin) {
  char o[512];
  size_t n = strlen(origin);
  if (n == 0 || n >= sizeof o)
    return false;
  for (size_t i = 0; i <= n; i++)
    o[i] = (char)tolower((unsigned char)origin[i]);
  if (strcmp(o, "null") == 0)
    return false;
  static const char *const loops[] = {"127.0.0.1", "localhost", "[::1]"};
  for (size_t p = 0; p < pol->nports; p++) {
    for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++) {
      char want[64];
      snprintf(want, sizeof want, "http://%s:%d", loops[i], pol->ports[p]);
      if (strcmp(o, want) == 0)
        return true;
    }
  }
  for (size_t i = 0; i < pol->norigins; i++)
    if (pol->origins[i] && strcasecmp(pol->origins[i], o) == 0)
      return true;
  return false;
}

static bool token_in_authorization(const bf_policy *pol, const char *auth) {
  if (!auth || strncasecmp(auth, "Bearer ", 7) != 0)
    return false;
  const char *t = auth + 7;
  while (*t == ' ')
    t++;
  size_t len = strlen(t);
  while (len && t[len - 1] == ' ')
    len--;
  return bf_token_matches(pol->token, t, len);
}

/* Sec-WebSocket-Protocol: a comma-separated list; "agenthost.v1" and "agenthost.bearer.<token>". */
static void scan_ws_protocols(const bf_policy *pol, const char *list, bool *v1, bool *token) {
  *v1 = false;
  *token = false;
  if (!list)
    return;
  const char *p = list;
  while (*p) {
    while (*p == ' ' || *p == ',' || *p == '\t')
      p++;
    const char *start = p;
    while (*p && *p != ',' && *p != ' ' && *p != '\t')
      p++;
    size_t n = (size_t)(p - start);
    if (n == 12 && memcmp(start, "agenthost.v1", 12) == 0)
      *v1 = true;
    else if (n > 17 && memcmp(start, "agenthost.bearer.", 17) == 0 &&
             bf_token_matches(pol->token, start + 17, n - 17))
      *token = true;
  }
}

static bool valid_method_name(const char *s, size_t n) {
  if (n == 0 || n > BF_METHOD_MAX)
    return false;
  bool seg_start = true;
  int dots = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '.') {
      if (seg_start)
        return false;
      seg_start = true;
      dots++;
      continue;
    }
    if (seg_start ? !(c >= 'a' && c <= 'z')
                  : !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
    seg_start = false;
  }
  return !seg_start && dots >= 1;
}

static bool valid_id(const char *s, size_t n) {
  if (n == 0 || n > BF_ID_MAX)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '-' || s[i] == '_'))
      return false;
  return true;
}

static bool json_content_type(const char *ct) {
  if (!ct)
    return false;
  while (*ct == ' ')
    ct++;
  if (strncasecmp(ct, "application/json", 16) != 0)
    return false;
  const char *rest = ct + 16;
  while (*rest == ' ')
    rest++;
  if (!*rest)
    return true;
  if (*rest != ';')
    return false;
  rest++;
  while (*rest == ' ')
    rest++;
  if (strncasecmp(rest, "charset=", 8) != 0)
    return false;
  rest += 8;
  if (*rest == '"')
    rest++;
  if (strncasecmp(rest, "utf-8", 5) != 0)
    return false;
  rest += 5;
  if (*rest == '"')
    rest++;
  while (*rest == ' ')
    rest++;
  return *rest == '\0';
}

static int parse_length(const char *s, uint64_t *out) {
  while (*s == ' ')
    s++;
  if (!*s)
    return -1;
  uint64_t v = 0;
  for (; *s && *s != ' '; s++) {
    if (!isdigit((unsigned char)*s) || v > (UINT64_MAX - 9) / 10)
      return -1;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  while (*s == ' ')
    s++;
  if (*s)
    return -1;
  *out = v;
  return 0;
}

static void refuse(bf_decision *d, int status, const char *reason) {
  d->status = status;
  d->reason = reason;
}

void bf_decide(const bf_policy *pol, const bf_request *req, bf_decision *d) {
  memset(d, 0, sizeof *d);
  d->loopback = bf_peer_is_loopback(req->peer);
  const char *m = req->method ? req->method : "";
  bool is_get = strcmp(m, "GET") == 0;
  bool is_post = strcmp(m, "POST") == 0;
  const char *path = req->path;

  /* 1. The request line: origin-form target, no '#', no NUL, no backslash, bounded. */
  if (!path || path[0] != '/')
    return refuse(d, 400, "bad request target");
  if (req->path_len > PATH_MAX_BYTES)
    return refuse(d, 414, "request target too long");
  if (memchr(path, '\0', req->path_len) || strlen(path) != req->path_len)
    return refuse(d, 400, "bad request target");
  for (size_t i = 0; i < req->path_len; i++) {
    unsigned char c = (unsigned char)path[i];
    if (c == '#' || c == '\\' || c < 0x20 || c == 0x7f)
      return refuse(d, 400, "bad request target");
  }
  if (req->upgrade_other)
    return refuse(d, 400, "unsupported upgrade");
  /* 2. Headers: one the fence reads that did not fit is refused, never taken as absent; exactly one Host
   * (T1). */
  if (req->oversized)
    return refuse(d, 431, "request header field too large");
  if (req->host_count != 1 || !req->host)
    return refuse(d, 400, "exactly one Host header is required");
  if (!host_allowed(pol, req->host))
    return refuse(d, 403, "host not allowed");

  bool is_api = strncmp(path, "/api/", 5) == 0 || strcmp(path, "/api") == 0;
  bool unsafe = is_post || req->upgrade || (is_api && !is_get) || !(is_get || strcmp(m, "HEAD") == 0);
  /* 3. Fetch Metadata (T2, T3, G4): only same-origin for POST, upgrades and the API; a user navigation
   * ("none") or a top-level navigation from elsewhere only for the static UI. */
  const char *sfs = req->sec_fetch_site;
  if (sfs) {
    bool same = strcasecmp(sfs, "same-origin") == 0;
    if (unsafe || is_api) {
      if (!same)
        return refuse(d, 403, "cross-site request refused");
    } else if (!same && strcasecmp(sfs, "none") != 0 &&
               !(req->sec_fetch_mode && strcasecmp(req->sec_fetch_mode, "navigate") == 0)) {
      return refuse(d, 403, "cross-site request refused");
    }
  }
  /* 4. Origin (T2, T3, G3). */
  if (req->origin && !origin_allowed(pol, req->origin))
    return refuse(d, 403, "origin not allowed");

  /* Route. */
  bf_route route = BF_ROUTE_INVALID;
  if (!is_api) {
    route = BF_ROUTE_STATIC;
  } else if (strcmp(path, "/api/respond") == 0) {
    route = BF_ROUTE_RESPOND;
  } else if (strcmp(path, "/api/ws/mux") == 0) {
    route = BF_ROUTE_WS_MUX;
  } else if (strcmp(path, "/api/ws/host") == 0) {
    route = BF_ROUTE_WS_HOST;
  } else if (strncmp(path, "/api/sessions/", 14) == 0 && ends_with(path, "/export")) {
    const char *id = path + 14;
    size_t n = req->path_len - 14 - 7;
    if (req->path_len > 21 && valid_id(id, n) && id[n] == '/') {
      memcpy(d->session_id, id, n);
      d->session_id[n] = '\0';
      route = BF_ROUTE_EXPORT;
    }
  } else if (strchr(path + 5, '/') == NULL && valid_method_name(path + 5, req->path_len - 5)) {
    route = BF_ROUTE_API;
    memcpy(d->method, path + 5, req->path_len - 5);
    d->method[req->path_len - 5] = '\0';
  }
  d->route = route;

  /* 5. The token (T2–T4, §2.2) for everything under /api: Authorization: Bearer, or for an upgrade the
   * subprotocol pair. The static UI is public (it holds no secret; the page reads the token from the
   * launch URL's fragment). */
  if (is_api) {
    bool ok = false;
    if (req->upgrade) {
      bool v1 = false;
      scan_ws_protocols(pol, req->ws_protocol, &v1, &ok);
      if (ok && !v1)
        return refuse(d, 400, "subprotocol agenthost.v1 is required");
    } else {
      ok = token_in_authorization(pol, req->authorization);
    }
    if (!ok)
      return refuse(d, 401, "a valid token is required");
    d->authenticated = true;
  }
  /* 6. Privilege by peer address, never by Host (T4, G2). An unknown method counts as privileged. */
  if (route == BF_ROUTE_API && !d->loopback) {
    bf_method_class c = pol->classify ? pol->classify(d->method, pol->classify_arg) : BF_METHOD_UNKNOWN;
    if (c != BF_METHOD_PUBLIC)
      return refuse(d, 403, "privileged method refused for a non-loopback peer");
  }
  /* 7. Route and method. */
  switch (route) {
  case BF_ROUTE_INVALID:
    return refuse(d, 404, "not found");
  case BF_ROUTE_API:
  case BF_ROUTE_RESPOND:
    if (!is_post || req->upgrade) {
      d->allow = "POST";
      return refuse(d, 405, "method not allowed");
    }
    break;
  case BF_ROUTE_WS_MUX:
  case BF_ROUTE_WS_HOST:
    if (!is_get) {
      d->allow = "GET";
      return refuse(d, 405, "method not allowed");
    }
    if (!req->upgrade)
      return refuse(d, 400, "a WebSocket upgrade is required");
    break;
  case BF_ROUTE_EXPORT:
  case BF_ROUTE_STATIC:
    if (!is_get) {
      d->allow = "GET";
      return refuse(d, 405, "method not allowed");
    }
    if (req->upgrade)
      return refuse(d, 400, "no WebSocket here");
    break;
  }
  /* 8. Framing: GET carries no body; POST needs application/json and a Content-Length within the route's
   * limit (413 before reading; chunked → 411: libwebsockets 4.1.6 decodes no chunked request bodies). */
  if (!is_post) {
    uint64_t cl = 0;
    if (req->transfer_encoding || (req->content_length && (parse_length(req->content_length, &cl) || cl)))
      return refuse(d, 400, "a GET request has no body");
    return;
  }
  if (!json_content_type(req->content_type))
    return refuse(d, 415, "Content-Type application/json is required");
  if (req->transfer_encoding)
    return refuse(d, 411, "Content-Length is required (no chunked bodies)");
  if (!req->content_length)
    return refuse(d, 411, "Content-Length is required");
  uint64_t cl = 0;
  if (parse_length(req->content_length, &cl))
    return refuse(d, 400, "bad Content-Length");
  uint64_t limit = route == BF_ROUTE_API && strcmp(d->method, "session.prompt") == 0 ? pol->max_body_prompt
                                                                                     : pol->max_body;
  if (cl > limit)
    return refuse(d, 413, "body too large");
  d->content_length = cl;
}

bool bf_static_path(const char *path, char *out, size_t cap) {
  const char *p = path + 1;
  if (!*p) {
    snprintf(out, cap, "index.html");
    return true;
  }
  size_t n = strlen(p);
  if (n + 11 >= cap)
    return false;
  const char *seg = p;
  for (const char *c = p;; c++) {
    if (*c == '/' || *c == '\0') {
      if (c == seg && *c == '/')
        return false; /* empty segment */
      if (c > seg && seg[0] == '.')
        return false; /* dotfile or ".." */
      if (!*c)
        break;
      seg = c + 1;
    }
  }
  memcpy(out, p, n + 1);
  if (out[n - 1] == '/')
    memcpy(out + n, "index.html", 11);
  return true;
}

bool bf_mux_cursor(const char *v, int64_t *out) {
  if (!v || !*v)
    return false;
  int64_t n = 0;
  for (const char *c = v; *c; c++) {
    if (*c < '0' || *c > '9' || n > (INT64_MAX - (*c - '0')) / 10)
      return false; /* not a digit, or past INT64_MAX: a stream that would never deliver */
    n = n * 10 + (*c - '0');
  }
  *out = n;
  return true;
}
