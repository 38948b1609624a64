/* agenthost browser plugin — the trust fence (SECURITY.md §2.3) as one pure decision.
 *
 * bf_decide() looks only at what it is given: the request line, the headers, the peer's address, the token
 * and the policy. It reads no socket and no file, so every row of the threat table can be tested by
 * injecting headers and peer addresses (DECISIONS.md "Privilege by peer address is tested by injecting peer
 * addresses into the decision function"). The checks run in the pipeline's order and the first one that
 * fails decides: request line → Host → Sec-Fetch-Site → Origin → token → privilege → route and method →
 * Content-Type → framing (Content-Length). A refused request never reaches a handler and its body is never
 * read.
 */
#ifndef AGENTHOST_BROWSER_FENCE_H
#define AGENTHOST_BROWSER_FENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define BF_TOKEN_BYTES 32
#define BF_TOKEN_CHARS 43 /* base64url without padding */
#define BF_METHOD_MAX 128
#define BF_ID_MAX 128

typedef enum bf_route {
  BF_ROUTE_INVALID = 0,
  BF_ROUTE_API,     /* POST /api/<method> */
  BF_ROUTE_RESPOND, /* POST /api/respond */
  BF_ROUTE_WS_MUX,  /* GET /api/ws/mux (upgrade) */
  BF_ROUTE_WS_HOST, /* GET /api/ws/host (upgrade) */
  BF_ROUTE_EXPORT,  /* GET /api/sessions/<id>/export */
  BF_ROUTE_STATIC,  /* GET outside /api */
} bf_route;

/* What a method is, as far as the plugin's copy of the method table knows. */
typedef enum bf_method_class {
  BF_METHOD_UNKNOWN = 0, /* not in the table: treated as privileged (deny by default) */
  BF_METHOD_PUBLIC,
  BF_METHOD_PRIVILEGED,
} bf_method_class;

typedef struct bf_request {
  const char *method;            /* "GET", "POST", … */
  const char *path;              /* the request target's path (percent-decoded, no query) */
  size_t path_len;               /* bytes of `path` (a NUL inside it is refused) */
  bool upgrade;                  /* a WebSocket upgrade (Upgrade: websocket) */
  const char *upgrade_other;     /* an Upgrade header naming something else (h2c, …), or NULL */
  const char *host;              /* NULL when absent */
  int host_count;                /* Host header fields seen */
  const char *origin;            /* NULL when absent */
  const char *sec_fetch_site;    /* NULL when absent */
  const char *sec_fetch_mode;    /* NULL when absent */
  const char *authorization;     /* NULL when absent */
  const char *ws_protocol;       /* Sec-WebSocket-Protocol, NULL when absent */
  const char *content_type;      /* NULL when absent */
  const char *content_length;    /* NULL when absent */
  const char *transfer_encoding; /* NULL when absent */
  const struct sockaddr *peer;   /* getpeername() of the connection */
  const char *oversized; /* a header the fence reads that did not fit its buffer (its name), or NULL */
} bf_request;

typedef struct bf_policy {
  const uint8_t *token;     /* BF_TOKEN_BYTES */
  const char *const *hosts; /* extra allowed host names (allowed_hosts, listener addresses) */
  size_t nhosts;
  const char *const *origins; /* extra allowed origins (allowed_origins), exact */
  size_t norigins;
  const int *ports; /* the listeners' ports: origins http://{127.0.0.1,localhost,[::1]}:P */
  size_t nports;
  bool any_ip_literal;      /* a wildcard listener: every IP literal is a host of this server */
  uint64_t max_body;        /* default body limit (1 MiB) */
  uint64_t max_body_prompt; /* session.prompt's limit (160 MiB) */
  bf_method_class (*classify)(const char *method, void *arg);
  void *classify_arg;
} bf_policy;

typedef struct bf_decision {
  int status;         /* 0: admitted; else the HTTP status to answer */
  const char *reason; /* a constant phrase for the log and the body ("host not allowed", …) */
  bf_route route;
  char method[BF_METHOD_MAX + 1]; /* BF_ROUTE_API: the method of the URL */
  char session_id[BF_ID_MAX + 1]; /* BF_ROUTE_EXPORT */
  bool loopback;                  /* the peer is a loopback address */
  bool authenticated;             /* a valid token was presented */
  uint64_t content_length;        /* POST: the announced body length */
  const char *allow;              /* 405: the Allow header */
} bf_decision;

void bf_decide(const bf_policy *pol, const bf_request *req, bf_decision *out);

/* ---- pieces, exposed for the tests and the rest of the plugin ------------------------------------- */

/* 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104. */
bool bf_peer_is_loopback(const struct sockaddr *sa);

/* Decode 43 base64url characters into 32 bytes; false for any other input. */
bool bf_token_decode(const char *text, size_t len, uint8_t out[BF_TOKEN_BYTES]);
/* Encode 32 bytes as 43 base64url characters + NUL. */
void bf_token_encode(const uint8_t in[BF_TOKEN_BYTES], char out[BF_TOKEN_CHARS + 1]);
/* Constant-time comparison of `presented` (text, any length) with the token: decodes to exactly 32 bytes
 * and compares every byte whatever differs first. */
bool bf_token_matches(const uint8_t token[BF_TOKEN_BYTES], const char *presented, size_t len);

/* The host part of a Host header value ("[::1]:7878" → "::1", "localhost" → "localhost"), lower-cased
 * into `out`; false when it is malformed. */
bool bf_host_name(const char *host, char *out, size_t cap);

/* The file under the UI's directory for a static route's `path` (which starts with '/'): "/" and a path
 * ending in '/' get "index.html"; false when a segment is empty or starts with '.' (a dotfile, "..") or
 * the result does not fit `cap`. */
bool bf_static_path(const char *path, char *out, size_t cap);

/* The mux's ?after=CURSOR: decimal digits only (no sign, no blank), at most INT64_MAX. */
bool bf_mux_cursor(const char *v, int64_t *out);

#endif
