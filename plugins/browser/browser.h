/* agenthost browser plugin — internal declarations shared by its files.
 *
 * server.c  mount/withdraw, the libwebsockets context on the host's loop, the protocol callback, responses
 * fence.c   the request pipeline of SECURITY.md §2.3 as a pure decision (fence.h)
 * token.c   the token (state_dir/token or --token-file) and the discovery file serve.json
 * api.c     POST /api/<method> and /api/respond: envelopes, bodies, dispatch
 * ws.c      the two downlink WebSockets, /api/ws/mux and /api/ws/host
 * static.c  the static UI and GET /api/sessions/<id>/export
 * follow.c  the sessions the web UI is looking at stay in the host's memory (session.follow)
 *
 * Everything runs on the host's loop thread; all state hangs off one `bp_state` (no statics).
 */
#ifndef AGENTHOST_BROWSER_H
#define AGENTHOST_BROWSER_H

#include <uv.h> /* before libwebsockets.h: its libuv helpers need it */

#include <agenthost/plugin.h>
#include <libwebsockets.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "fence.h"

#define BP_MAX_LISTEN 8
#define BP_HDR_MAX 4096

typedef struct bp_state bp_state;
typedef struct bp_http bp_http;
typedef struct bp_req bp_req;
typedef struct bp_ws bp_ws;
typedef struct bp_follow bp_follow;

/* The sessions followed at most (follow.c): the ones most recently used through the web UI. */
#define BP_FOLLOW_MAX 64

/* A downlink frame: one envelope, serialized once and shared by every socket it is queued on (refcounted).
 * LWS_PRE bytes of headroom, then `len` bytes of JSON text. */
typedef struct bp_frame {
  uint32_t refs;  /* queues holding it */
  int64_t cursor; /* a durable event's cursor, 0 for transient frames */
  char rid[64];   /* request.approval / request.question: the request id (dedup on the host stream) */
  size_t len;
  unsigned char data[];
} bp_frame;

/* A socket's queue of frames: a ring of references, in order. `bytes` is the sum of their lengths. */
typedef struct bp_fq {
  bp_frame **v;
  size_t cap, head, n;
  size_t bytes;
} bp_fq;

/* A response waiting for HTTP_WRITEABLE: headers and body in one buffer with LWS_PRE headroom. */
typedef struct bp_out {
  unsigned char *buf;
  size_t len; /* bytes after LWS_PRE */
  bool close_after;
} bp_out;

/* Per HTTP connection (libwebsockets' per-session data of protocols[0], zeroed per connection). */
struct bp_http {
  bp_state *st;
  uint64_t conn_id;
  ah_record *rec; /* this connection's recording ([host] record_dir), opened at its first POST */
  bp_req *req;    /* the request of this transaction (body being read or call in flight) */
  bp_out out;
  /* Reading is held from the moment an answer is awaited until it is written: a pipelined request waits in
   * libwebsockets' buffer and the end of a half-closed connection in the kernel (read, either would end the
   * transaction or the connection before the answer exists). While reading is held libwebsockets gives no
   * HTTP_WRITEABLE, so the answer is written from a host timer (`flush`), outside its callbacks. */
  bool rx_held;
  ah_timer *flush;
  struct lws *wsi; /* while `flush` runs */
};

typedef enum bp_req_kind {
  BP_REQ_INVALID = 0,
  BP_REQ_API,
  BP_REQ_RESPOND,
  BP_REQ_EXPORT,
} bp_req_kind;

/* One API request; outlives its connection when the client goes away while the call runs. */
struct bp_req {
  bp_state *st;
  struct lws *wsi; /* NULL once the connection closed */
  bp_http *http;
  bp_req_kind kind;
  char method[BF_METHOD_MAX + 1];
  char session_id[BF_ID_MAX + 1];
  bool loopback;
  uint64_t conn_id;
  uint64_t content_length;
  bool budgeted;       /* content_length counted in st->body_in_flight */
  bool close_after;    /* the answer closes the connection */
  unsigned char *body; /* content_length bytes: malloc'ed, or its own mapping when large (body_mapped) */
  bool body_mapped;
  bool starts_post; /* the body begins with "POST /" (see envelope_read) */
  size_t got;
  char *rpc_id;
  char corr[24]; /* pairs the body and its answer in the recording */
  ah_cancel *token;
  bool dispatched;
  ah_timer *timer; /* the body deadline */
  json_t *env;     /* a large body's envelope, parsed on a pool thread (dispatched is true meanwhile) */
  uint64_t start_ms, last_ms;
  bp_req *prev, *next;
};

typedef enum bp_ws_kind {
  BP_WS_INVALID = 0,
  BP_WS_MUX,
  BP_WS_HOST,
} bp_ws_kind;

#define BP_WS_MAGIC 0x62707773u /* "bpws": tags the opaque user data of our WebSocket wsis */
#define BP_CONN_MAGIC \
  0x62706363u /* "bpcc": an HTTP connection's identity (kept across keep-alive requests) */

/* The opaque user data of an HTTP wsi: libwebsockets' per-session data does not outlive a transaction,
 * but the connection id must (request.respond tells a duplicate from a late answer by it). */
typedef struct bp_conn {
  uint32_t magic;
  uint64_t id;
} bp_conn;

struct bp_ws {
  uint32_t magic;
  bp_state *st;
  ah_record *rec;  /* this socket's recording ([host] record_dir) */
  struct lws *wsi; /* NULL once closed */
  bp_ws_kind kind;
  uint64_t id;
  bool established;
  bool linked; /* in st->ws */
  bool closing;
  bool close_after_flush; /* a stream/error was queued: close (1011) once it is written */
  int close_code;         /* a close waiting for the socket to drain (1013), 0 when none */
  bool close_posted;
  ah_timer *close_timer; /* the deadline of that drain */
  bool destroyed;        /* WSI_DESTROY ran while a call was in flight: the call's reply frees it */
  int calls;             /* core calls in flight for this socket */
  /* send queue */
  bp_fq q;
  bool batch;      /* ?batch=1: each message is a JSON array of the envelopes queued (ws.c) */
  bool want_write; /* lws_callback_on_writable asked and SERVER_WRITEABLE not yet run */
  uint64_t frames_sent;
  /* mux: replay from the store, then live */
  bool has_after;
  int64_t after; /* the client's cursor */
  int64_t sent_cursor;
  bool replaying;
  bool replay_dropped; /* live frames were dropped during the replay: read the store again */
  int replay_limit;    /* events asked per page (REPLAY_PAGE, fewer once large events filled the queue) */
  bp_fq held;          /* live frames held during the replay (mux) or the listing (host) */
  /* host: pending requests first */
  bool listing;
  json_t *listed; /* ids sent from request.list (dedup of request.pending during the listing) */
  bp_ws *prev, *next;
};

struct bp_state {
  ah_mount *m;
  const ah_host_api *api;
  uv_loop_t *loop;
  struct lws_context *ctx;
  struct lws_protocols protocols[3];
  lws_retry_bo_t retry;
  /* configuration */
  char *listen_addr[BP_MAX_LISTEN]; /* "127.0.0.1", "::1", … */
  int listen_port[BP_MAX_LISTEN];   /* as configured (0 = ephemeral) */
  int ports[BP_MAX_LISTEN];         /* as bound */
  size_t nlisten;
  size_t nports;
  struct lws_vhost *vhosts[BP_MAX_LISTEN];
  /* The listening sockets are the plugin's own (accept, then lws_adopt_socket_vhost): out of descriptors,
   * accepting pauses instead of spinning on EMFILE (finding 5). */
  int listen_fd[BP_MAX_LISTEN]; /* bound at mount, listened on and watched once lws exists; -1: none */
  uv_poll_t listen_poll[BP_MAX_LISTEN];
  int listeners_open; /* polls whose close callback has not run */
  bool accept_paused;
  uint64_t accept_refused; /* connections left waiting in the backlog during the current episode */
  ah_timer *accept_timer;
  char vhost_names[BP_MAX_LISTEN][8]; /* libwebsockets keeps the pointer, not a copy */
  char **hosts;
  size_t nhosts;
  char **origins;
  size_t norigins;
  bool any_ip;
  uint64_t max_body;
  uint64_t max_body_prompt;
  uint64_t body_budget;
  uint64_t body_in_flight;
  size_t ws_queue_max;
  size_t ws_budget_max; /* downlink bytes queued on all WebSockets together (ws_budget_bytes) */
  size_t ws_bytes;      /* the distinct frames queued or held now, all sockets together */
  size_t ws_peak;       /* the most of them since they last drained to none (ws.c: trim after a burst) */
  unsigned char *wbuf;  /* the message a batched write builds (LWS_PRE headroom), reused */
  size_t wbuf_cap;
  size_t max_ws; /* WebSockets at once (G7) */
  unsigned ping_s;
  unsigned header_timeout_s;
  unsigned body_timeout_s;
  char *ui_dir;
  int ui_fd;
  char *marked_js; /* the system's marked and DOMPurify, served at /vendor/ (static.c) */
  char *dompurify_js;
  char *chartjs_js;
  /* token and discovery */
  uint8_t token[BF_TOKEN_BYTES];
  char *token_path; /* the token file (state_dir/token or token_file) */
  char *serve_json; /* the file we wrote */
  /* the method table (host.describe): name → true when privileged */
  json_t *methods;
  /* The serialization of the last successful value sent (a reference is kept, so the pointer cannot be
   * reused by another value): a result that is the very same value (host.describe, shared by the core
   * until something is mounted or withdrawn) is not serialized again. */
  json_t *last_value;
  char *last_value_text;
  int describe_calls;
  int outstanding; /* core calls in flight for requests and sockets */
  /* connections */
  ah_sub *sub;
  bp_ws *ws;
  size_t nws;
  size_t nmux; /* established /api/ws/mux sockets */
  /* follows (follow.c): session id → its session.follow, and the same from the most recent use */
  bp_follow *follows;
  bp_follow *follow_newest, *follow_oldest;
  size_t nfollows;
  uint64_t recorded_requests; /* the corr of the last recorded request */
  ah_timer *trim_timer;       /* the heap trim after the last WebSocket closed (ws.c) */
  bp_req *reqs;
  uint64_t next_conn;
  uint64_t next_frame;
  uint64_t next_corr;
  int64_t last_cursor;
  /* withdraw */
  bool withdrawing;
  ah_withdraw_done_fn done;
  ah_timer *wd_timer;
  int wd_phase;
  int wd_ticks;
};

/* response.c */
void bp_log_refusal(bp_state *st, struct lws *wsi, const char *method, const char *path, int status,
                    const char *reason);
/* Build a response: status, content type (NULL = none), extra header lines ("name: value\r\n", may be NULL),
 * body (may be NULL). Hardening headers are added to every response. Returns 0 or -1. */
int bp_build_response(struct lws *wsi, bp_out *out, int status, const char *ctype, const char *extra,
                      const void *body, size_t len, bool is_api, bool close_after);
/* The hardening headers of the pages libwebsockets writes itself (the vhosts' `headers`). */
const struct lws_protocol_vhost_options *bp_own_page_headers(void);
/* A connection libwebsockets turned raw (a CONNECT): a complete 405 with the hardening headers. */
void bp_refuse_raw(struct lws *wsi);
/* Hold reading on the connection until its answer is written (see bp_http.rx_held). */
void bp_hold_input(bp_http *h, struct lws *wsi);
/* Write h->out (built by bp_build_response) on the next loop turn, then resume reading and end the
 * transaction (or close the connection when the answer says so). */
void bp_send_later(bp_http *h, struct lws *wsi);
/* Inside a callback of a connection about to close: write a pending answer now (libwebsockets flushes it
 * before the close). */
void bp_http_write_now(bp_http *h, struct lws *wsi);
/* HTTP_WRITEABLE: write a pending answer; -1 when the connection is to close. */
int bp_http_writeable(bp_http *h, struct lws *wsi);
/* The connection is closing: forget a pending write. */
void bp_http_closed(bp_http *h);
/* Write a refusal now (header time, inside the HTTP callback) and tell whether the connection must close. */
int bp_refuse_now(bp_state *st, struct lws *wsi, int status, const char *reason, const char *allow,
                  bool www_auth, bool close_after);
bf_method_class bp_classify(const char *method, void *arg);
void bp_refresh_methods(bp_state *st);
const ah_caller *bp_caller(ah_caller *c, bool loopback, uint64_t conn_id);

/* follow.c */
/* A call about `session_id` succeeded: follow it while a mux socket is open (the most recent first). */
void bp_follow_touch(bp_state *st, const char *session_id);
/* The last mux socket closed, or the plugin is withdrawn: every follow ends. */
void bp_follow_drop_all(bp_state *st);

/* api.c */
int bp_api_begin(bp_state *st, bp_http *h, struct lws *wsi, const bf_decision *d);
int bp_api_body(bp_state *st, bp_http *h, struct lws *wsi, const void *in, size_t len);
int bp_api_body_done(bp_state *st, bp_http *h, struct lws *wsi);
void bp_req_detach(bp_req *r);
/* A request of connection `h`, linked in the state's list and set as the connection's current one. */
bp_req *bp_req_new(bp_state *st, bp_http *h, struct lws *wsi, bp_req_kind kind);
void bp_req_release(bp_req *r);
/* An envelope-level answer: server-response JSON for `rpc_id` (may be NULL). */
int bp_answer_error(bp_http *h, struct lws *wsi, int status, const char *rpc_id, const char *category,
                    const char *message, json_t *data);

/* ws.c */
int bp_ws_confirm(bp_state *st, struct lws *wsi, const bf_decision *d);
int bp_ws_callback(bp_state *st, struct lws *wsi, enum lws_callback_reasons reason, void *in, size_t len);
void bp_ws_destroy(bp_ws *w);
void bp_ws_on_event(bp_state *st, const char *name, const json_t *data);
void bp_ws_close_all(bp_state *st, int code, const char *why);

/* static.c */
int bp_static_serve(bp_state *st, bp_http *h, struct lws *wsi, const char *path);
int bp_export_begin(bp_state *st, bp_http *h, struct lws *wsi, const bf_decision *d);
int bp_ui_open(bp_state *st, const json_t *config);

/* token.c */
int bp_token_load(bp_state *st, const json_t *config);
int bp_discovery_write(bp_state *st);
/* Replace the token (new random bytes, the file rewritten atomically). */
int bp_token_rotate(bp_state *st);
void bp_discovery_remove(bp_state *st);
/* The URL of the first listener, "http://HOST:PORT/" (a wildcard address as 127.0.0.1). */
void bp_base_url(const bp_state *st, char *url, size_t cap);
/* Without a mount (the command line, cli.c): the token file of `config` ([plugin.browser] token_file,
 * else STATE_DIR/token), and its atomic replacement with a new token (written to *out when not NULL). */
int bp_token_file_path(const json_t *config, const char *state_dir, char *path, size_t cap);
int bp_token_file_replace(const char *path, uint8_t out[BF_TOKEN_BYTES]);

/* cli.c: the commands `agenthost url` and `agenthost token rotate` (ABI 1.3). */
extern const ah_command_def *const bp_commands[];

#endif
