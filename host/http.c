/* The HTTP client service (ABI 1.4, ah_http_request in plugin.h): libcurl's multi-socket API on the host
 * loop. One multi handle per host, made on first use; each socket libcurl asks for is a uv_poll_t, its
 * timer a uv_timer_t. A transfer has a timer of its own for the first-byte and idle timeouts and for an
 * outcome that must arrive on a later loop turn (an abort from outside its callbacks).
 *
 * Callbacks into the plugin run inside curl_multi_socket_action(); what they may do there is kept safe: an
 * abort from inside one only marks the transfer, whose write callback then refuses the next bytes, and
 * the transfer is removed from the multi handle when libcurl reports it done. */
#include "http.h"

#include <ctype.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define LOG "http"
#define BODY_MAX ((size_t)64 << 20)
#define RESPONSE_DEFAULT ((size_t)64 << 20)
#define CONNECT_DEFAULT_MS 30000
#define IDLE_DEFAULT_MS 300000
#define HEADER_BYTES_MAX (256 * 1024) /* of one response's head */

struct ah__http_ctx {
  ah_host *host;
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  ah__link transfers; /* every ah_http not yet freed */
  ah__link sockets;
  bool closing;
  bool in_action;    /* inside curl_multi_socket_action() */
  ah__link deferred; /* transfers started from inside a callback: added to the multi handle after it */
};

typedef struct sock {
  ah__http_ctx *ctx;
  uv_poll_t poll;
  curl_socket_t fd;
  int events; /* what libcurl last asked to wait for (UV_READABLE | UV_WRITABLE) */
  ah__link link;
} sock;

struct ah_http {
  ah__http_ctx *ctx;
  ah_mount *m;
  CURL *easy;
  struct curl_slist *send_headers;
  char url_host[128]; /* for messages: scheme://host[:port] */
  char errbuf[CURL_ERROR_SIZE];
  /* the request's callbacks and limits */
  int (*on_head)(ah_http *h, int status, const json_t *headers, void *arg);
  int (*on_body)(ah_http *h, const char *data, size_t len, void *arg);
  void (*on_done)(ah_http *h, int status, const char *message, void *arg);
  void *arg;
  size_t max_response;
  uint64_t first_byte_ms;
  uint64_t idle_ms;
  ah_cancel_watch *watch;
  /* the response */
  json_t *headers;
  size_t header_bytes;
  long status;
  bool head_seen; /* the final head (status >= 200) ended */
  bool head_sent;
  size_t received;
  /* state */
  uv_timer_t timer;
  bool in_multi;
  bool in_callback;
  bool done;      /* on_done was called or will be, from the timer */
  int fail;       /* an outcome decided by us (abort, cap, timeout): wins over libcurl's */
  char *fail_msg; /* malloc'ed; with fail */
  ah__link link;  /* in ctx->transfers */
  ah__link mlink; /* in the mount's https */
  ah__link dlink; /* in ctx->deferred while `deferred` */
  bool deferred;
};

/* ---- the multi handle on the loop -------------------------------------------------------------------- */

static void finish(ah_http *h, CURLcode code);
static void set_fail(ah_http *h, int status, const char *fmt, const char *detail);
static void deferred_done(uv_timer_t *t);

static void check_done(ah__http_ctx *ctx) {
  CURLMsg *msg = NULL;
  int left = 0;
  while ((msg = curl_multi_info_read(ctx->multi, &left))) {
    if (msg->msg != CURLMSG_DONE)
      continue;
    ah_http *h = NULL;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&h);
    CURLcode code = msg->data.result;
    if (h)
      finish(h, code);
  }
}

/* libcurl refuses curl_multi_add_handle() from inside its own callbacks (a plugin's on_head or on_body that
 * starts the next transfer, as the MCP client does): those wait here until the action returned. */
static void add_deferred(ah__http_ctx *ctx) {
  while (!ah__list_empty(&ctx->deferred)) {
    ah_http *h = AH__CONTAINER(ctx->deferred.next, ah_http, dlink);
    ah__list_remove(&h->dlink);
    h->deferred = false;
    if (h->done)
      continue; /* aborted meanwhile: its timer delivers the outcome */
    if (curl_multi_add_handle(ctx->multi, h->easy) == CURLM_OK) {
      h->in_multi = true;
    } else {
      set_fail(h, AH_ENOMEM, "the transfer to %s could not start%s", NULL);
      h->done = true;
      uv_timer_start(&h->timer, deferred_done, 0, 0);
    }
  }
}

/* A socket error (a reset, a refused connect) is reported by libuv as UV_EBADF with no events, and the
 * handle stopped. libcurl is then told the socket is readable and writable, so that it reads and writes
 * it itself and sees the error: on a reused connection that the server closed just as the request went
 * out, it sends the request again on a fresh connection, and otherwise it says what failed. Told
 * CURL_CSELECT_ERR alone it fails the transfer with "select/poll returned error" (1 request in 20 to 40
 * to a server that closes its connection after each answer). The poll is started again with libcurl's
 * last wish when the socket is still in use after the action. */
static void on_poll(uv_poll_t *p, int status, int events) {
  sock *s = p->data;
  ah__http_ctx *ctx = s->ctx;
  int flags = 0;
  if (status < 0)
    flags = CURL_CSELECT_IN | CURL_CSELECT_OUT;
  if (events & UV_READABLE)
    flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE)
    flags |= CURL_CSELECT_OUT;
  int running = 0;
  ctx->in_action = true;
  curl_multi_socket_action(ctx->multi, s->fd, flags, &running);
  ctx->in_action = false;
  /* s stays allocated until its handle's close callback, a later loop turn. */
  if (status < 0 && !uv_is_closing((uv_handle_t *)&s->poll) && !uv_is_active((uv_handle_t *)&s->poll) &&
      s->events != 0)
    uv_poll_start(&s->poll, s->events, on_poll);
  add_deferred(ctx);
  check_done(ctx);
}

static void sock_closed(uv_handle_t *hd) {
  free(hd->data);
}

static void sock_close(sock *s) {
  ah__list_remove(&s->link);
  uv_poll_stop(&s->poll);
  uv_close((uv_handle_t *)&s->poll, sock_closed);
}

static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp) {
  (void)easy;
  ah__http_ctx *ctx = userp;
  sock *s = socketp;
  if (what == CURL_POLL_REMOVE) {
    if (s) {
      curl_multi_assign(ctx->multi, fd, NULL);
      sock_close(s);
    }
    return 0;
  }
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s)
      return -1;
    s->ctx = ctx;
    s->fd = fd;
    if (uv_poll_init_socket(ctx->loop, &s->poll, fd) != 0) {
      free(s);
      return -1;
    }
    s->poll.data = s;
    ah__list_push(&ctx->sockets, &s->link);
    curl_multi_assign(ctx->multi, fd, s);
  }
  s->events = (what & CURL_POLL_IN ? UV_READABLE : 0) | (what & CURL_POLL_OUT ? UV_WRITABLE : 0);
  uv_poll_start(&s->poll, s->events, on_poll);
  return 0;
}

static void on_multi_timer(uv_timer_t *t) {
  ah__http_ctx *ctx = t->data;
  int running = 0;
  ctx->in_action = true;
  curl_multi_socket_action(ctx->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  ctx->in_action = false;
  add_deferred(ctx);
  check_done(ctx);
}

static int on_timer_change(CURLM *multi, long timeout_ms, void *userp) {
  (void)multi;
  ah__http_ctx *ctx = userp;
  if (timeout_ms < 0)
    uv_timer_stop(&ctx->timer);
  else
    uv_timer_start(&ctx->timer, on_multi_timer, (uint64_t)timeout_ms, 0);
  return 0;
}

static ah__http_ctx *ctx_of(ah_host *host) {
  if (host->http)
    return host->http;
  static bool global_done;
  if (!global_done) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      return NULL;
    global_done = true;
  }
  ah__http_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return NULL;
  ctx->host = host;
  ctx->loop = host->loop;
  ctx->multi = curl_multi_init();
  if (!ctx->multi) {
    free(ctx);
    return NULL;
  }
  ah__list_init(&ctx->transfers);
  ah__list_init(&ctx->deferred);
  ah__list_init(&ctx->sockets);
  uv_timer_init(ctx->loop, &ctx->timer);
  ctx->timer.data = ctx;
  curl_multi_setopt(ctx->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(ctx->multi, CURLMOPT_SOCKETDATA, ctx);
  curl_multi_setopt(ctx->multi, CURLMOPT_TIMERFUNCTION, on_timer_change);
  curl_multi_setopt(ctx->multi, CURLMOPT_TIMERDATA, ctx);
  host->http = ctx;
  return ctx;
}

/* ---- one transfer ------------------------------------------------------------------------------------ */

static void transfer_closed(uv_handle_t *hd) {
  ah_http *h = hd->data;
  ah_mount *m = h->m;
  free(h);
  if (m)
    ah__mount_release(m, AH__HOLD_CLOSE);
}

static void transfer_free(ah_http *h) {
  if (h->deferred) {
    ah__list_remove(&h->dlink);
    h->deferred = false;
  }
  if (h->in_multi) {
    curl_multi_remove_handle(h->ctx->multi, h->easy);
    h->in_multi = false;
  }
  if (h->watch) {
    ah__cancel_unwatch(h->watch);
    h->watch = NULL;
  }
  curl_easy_cleanup(h->easy);
  curl_slist_free_all(h->send_headers);
  json_decref(h->headers);
  free(h->fail_msg);
  ah__list_remove(&h->link);
  if (h->m)
    ah__list_remove(&h->mlink);
  uv_close((uv_handle_t *)&h->timer, transfer_closed);
}

static void set_fail(ah_http *h, int status, const char *fmt, const char *detail) {
  if (h->fail)
    return;
  h->fail = status;
  char *msg = NULL;
  if (asprintf(&msg, fmt, h->url_host, detail ? detail : "") < 0)
    msg = NULL;
  h->fail_msg = msg;
}

static void deliver_done(ah_http *h, int status, const char *message) {
  h->done = true;
  uv_timer_stop(&h->timer);
  if (h->in_multi) {
    curl_multi_remove_handle(h->ctx->multi, h->easy);
    h->in_multi = false;
  }
  /* Out of the mount's list first: on_done may finish the plugin's withdraw (its done()), and the host must
   * not then free this transfer, which is ending here, as one the plugin left behind. */
  if (h->m)
    ah__list_remove(&h->mlink);
  h->on_done(h, status, message ? message : ah_strerror(status), h->arg);
  transfer_free(h);
}

static void deferred_done(uv_timer_t *t) {
  ah_http *h = t->data;
  deliver_done(h, h->fail ? h->fail : AH_ECANCELED, h->fail_msg);
}

/* The outcome libcurl reported, as the caller sees it. */
static int map_code(ah_http *h, CURLcode code, char *msg, size_t cap) {
  const char *detail = h->errbuf[0] ? h->errbuf : curl_easy_strerror(code);
  switch (code) {
  case CURLE_OK:
    return 0;
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY:
  case CURLE_COULDNT_CONNECT:
    snprintf(msg, cap, "cannot connect to %s: %s", h->url_host, detail);
    return AH_EUNAVAILABLE;
  case CURLE_OPERATION_TIMEDOUT:
    snprintf(msg, cap, "%s did not answer in time: %s", h->url_host, detail);
    return AH_ETIMEDOUT;
  case CURLE_PEER_FAILED_VERIFICATION:
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_SSL_CERTPROBLEM:
  case CURLE_SSL_CACERT_BADFILE:
  case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    snprintf(msg, cap, "TLS with %s failed: %s", h->url_host, detail);
    return AH_EIO;
  case CURLE_URL_MALFORMAT:
  case CURLE_UNSUPPORTED_PROTOCOL:
    snprintf(msg, cap, "bad URL for %s: %s", h->url_host, detail);
    return AH_EINVAL;
  default:
    snprintf(msg, cap, "the connection to %s broke: %s", h->url_host, detail);
    return AH_EIO;
  }
}

static void send_head(ah_http *h) {
  if (h->head_sent)
    return;
  h->head_sent = true;
  if (!h->on_head || h->fail)
    return;
  if (!h->headers)
    h->headers = json_object();
  h->in_callback = true;
  int rc = h->on_head(h, (int)h->status, h->headers, h->arg);
  h->in_callback = false;
  if (rc)
    set_fail(h, AH_ECANCELED, "the transfer from %s was aborted%s", NULL);
}

static void finish(ah_http *h, CURLcode code) {
  if (h->done)
    return;
  h->in_multi = false;
  curl_multi_remove_handle(h->ctx->multi, h->easy);
  if (!h->fail && code == CURLE_OK) {
    curl_easy_getinfo(h->easy, CURLINFO_RESPONSE_CODE, &h->status);
    send_head(h); /* a response without a body */
  }
  if (h->fail) {
    deliver_done(h, h->fail, h->fail_msg);
    return;
  }
  char msg[CURL_ERROR_SIZE + 256];
  int status = map_code(h, code, msg, sizeof msg);
  deliver_done(h, status, status ? msg : NULL);
}

/* Our own timers of a transfer: the first byte, then idleness. */
static void on_transfer_timer(uv_timer_t *t) {
  ah_http *h = t->data;
  if (h->done)
    return;
  if (!h->received && !h->head_seen && h->first_byte_ms)
    set_fail(h, AH_ETIMEDOUT, "%s sent no response in time%s", NULL);
  else
    set_fail(h, AH_ETIMEDOUT, "%s stopped sending (idle timeout)%s", NULL);
  if (h->in_multi) {
    curl_multi_remove_handle(h->ctx->multi, h->easy); /* closes the connection */
    h->in_multi = false;
  }
  deliver_done(h, h->fail, h->fail_msg);
}

static void arm_idle(ah_http *h) {
  if (!h->done)
    uv_timer_start(&h->timer, on_transfer_timer, h->idle_ms, 0);
}

static size_t on_header_line(char *data, size_t size, size_t n, void *arg) {
  ah_http *h = arg;
  size_t len = size * n;
  if (h->fail)
    return 0;
  arm_idle(h);
  h->header_bytes += len;
  if (h->header_bytes > HEADER_BYTES_MAX) {
    set_fail(h, AH_E2BIG, "the response head from %s is too large%s", NULL);
    return 0;
  }
  if (len >= 5 && strncmp(data, "HTTP/", 5) == 0) { /* a new head (after 1xx): start over */
    json_decref(h->headers);
    h->headers = json_object();
    h->head_seen = false;
    return len;
  }
  while (len && (data[len - 1] == '\n' || data[len - 1] == '\r'))
    len--;
  if (len == 0) { /* the end of a head */
    long code = 0;
    curl_easy_getinfo(h->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200) {
      h->status = code;
      h->head_seen = true;
      send_head(h);
      if (h->fail)
        return 0;
    }
    return size * n;
  }
  const char *colon = memchr(data, ':', len);
  if (!colon || colon == data)
    return size * n;
  char name[128];
  size_t nl = (size_t)(colon - data);
  if (nl >= sizeof name)
    return size * n;
  for (size_t i = 0; i < nl; i++)
    name[i] = (char)tolower((unsigned char)data[i]);
  name[nl] = '\0';
  const char *v = colon + 1;
  const char *end = data + len;
  while (v < end && (*v == ' ' || *v == '\t'))
    v++;
  if (!h->headers)
    h->headers = json_object();
  const char *old = json_string_value(json_object_get(h->headers, name));
  json_t *val = NULL;
  if (old) {
    char *joined = NULL;
    if (asprintf(&joined, "%s, %.*s", old, (int)(end - v), v) >= 0)
      val = json_stringn(joined, strlen(joined));
    free(joined);
  } else {
    val = json_stringn(v, (size_t)(end - v));
  }
  if (val) /* NULL for a value that is not UTF-8: dropped */
    json_object_set_new(h->headers, name, val);
  return size * n;
}

static size_t on_write(char *data, size_t size, size_t n, void *arg) {
  ah_http *h = arg;
  size_t len = size * n;
  if (h->fail)
    return 0; /* libcurl ends the transfer with CURLE_WRITE_ERROR; our outcome wins */
  arm_idle(h);
  if (!h->head_sent) {
    curl_easy_getinfo(h->easy, CURLINFO_RESPONSE_CODE, &h->status);
    send_head(h);
    if (h->fail)
      return 0;
  }
  h->received += len;
  if (h->received > h->max_response) {
    char cap[32];
    snprintf(cap, sizeof cap, " (%zu bytes)", h->max_response);
    set_fail(h, AH_E2BIG, "the response from %s is larger than allowed%s", cap);
    return 0;
  }
  if (h->on_body && len) {
    h->in_callback = true;
    int rc = h->on_body(h, data, len, h->arg);
    h->in_callback = false;
    if (rc)
      set_fail(h, AH_ECANCELED, "the transfer from %s was aborted%s", NULL);
    if (h->fail)
      return 0;
  }
  return len;
}

static void http_abort_now(ah_http *h) {
  if (!h || h->done)
    return;
  set_fail(h, AH_ECANCELED, "the transfer from %s was cancelled%s", NULL);
  if (h->in_callback)
    return; /* the write or header callback refuses the next bytes; finish() reports it */
  /* Out of the multi handle now (the connection closes), unless libcurl is running: a callback of
   * another transfer may not remove this one; then the deferred outcome removes it. */
  if (h->in_multi && !h->ctx->in_action) {
    curl_multi_remove_handle(h->ctx->multi, h->easy);
    h->in_multi = false;
  }
  h->done = true; /* nothing else may deliver the outcome */
  uv_timer_start(&h->timer, deferred_done, 0, 0);
}

void ah__http_abort(ah_http *h) {
  http_abort_now(h);
}

static void on_cancel(ah_cancel *token, void *arg) {
  (void)token;
  ah_http *h = arg;
  h->watch = NULL; /* a tripped token's watches are gone after it fired */
  http_abort_now(h);
}

/* "scheme://host[:port]" of `url` for messages (no path, no credentials, no query). */
static void url_origin(const char *url, char *out, size_t cap) {
  const char *p = strstr(url, "://");
  const char *start = p ? p + 3 : url;
  const char *end = start + strcspn(start, "/?#");
  const char *at = memchr(start, '@', (size_t)(end - start));
  if (at)
    start = at + 1;
  int scheme = p ? (int)(p - url) : 0;
  snprintf(out, cap, "%.*s%s%.*s", scheme, url, p ? "://" : "", (int)(end - start), start);
}

static bool valid_token(const char *s) {
  if (!s || !*s)
    return false;
  for (; *s; s++)
    if (!(isalnum((unsigned char)*s) || strchr("!#$%&'*+-.^_`|~", *s)))
      return false;
  return true;
}

int ah__http_start(ah_mount *m, const ah_http_request *req, ah_http **out) {
  if (out)
    *out = NULL;
  if (!m || !req || !out || !AH_HAS_FIELD(req, ah_http_request, reserved) || !req->url || !req->on_done)
    return AH_EINVAL;
  if (m->state != AH__MOUNT_MOUNTING && m->state != AH__MOUNT_ACTIVE)
    return AH_ESTATE;
  if (strncmp(req->url, "http://", 7) != 0 && strncmp(req->url, "https://", 8) != 0)
    return AH_EINVAL;
  if (strpbrk(req->url, " \r\n\t") || (req->body && req->body_len > BODY_MAX))
    return AH_EINVAL;
  const char *method = req->method ? req->method : req->body ? "POST" : "GET";
  if (!valid_token(method))
    return AH_EINVAL;
  ah__http_ctx *ctx = ctx_of(m->host);
  if (!ctx || ctx->closing)
    return ctx ? AH_ESTATE : AH_ENOMEM;
  ah_http *h = calloc(1, sizeof *h);
  if (!h)
    return AH_ENOMEM;
  h->ctx = ctx;
  h->easy = curl_easy_init();
  if (!h->easy) {
    free(h);
    return AH_ENOMEM;
  }
  url_origin(req->url, h->url_host, sizeof h->url_host);
  int rc = 0;
  const char *k = NULL;
  json_t *v = NULL;
  json_object_foreach((json_t *)req->headers, k, v) {
    const char *val = json_string_value(v);
    if (!valid_token(k) || !val || strpbrk(val, "\r\n")) {
      rc = AH_EINVAL;
      break;
    }
    char *line = NULL;
    if (asprintf(&line, "%s: %s", k, val) < 0) {
      rc = AH_ENOMEM;
      break;
    }
    struct curl_slist *l = curl_slist_append(h->send_headers, line);
    explicit_bzero(line, strlen(line)); /* an Authorization value is a secret */
    free(line);
    if (!l) {
      rc = AH_ENOMEM;
      break;
    }
    h->send_headers = l;
  }
  if (rc) {
    curl_slist_free_all(h->send_headers);
    curl_easy_cleanup(h->easy);
    free(h);
    return rc;
  }
  CURL *e = h->easy;
  curl_easy_setopt(e, CURLOPT_URL, req->url);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_NOPROGRESS, 1L);
  curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, ""); /* every encoding this libcurl decodes */
  curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, h->errbuf);
  curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)h);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, h);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header_line);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, h);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)(req->connect_timeout_ms ? req->connect_timeout_ms : CONNECT_DEFAULT_MS));
  if (req->total_timeout_ms)
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)req->total_timeout_ms);
  if (req->ca_file)
    curl_easy_setopt(e, CURLOPT_CAINFO, req->ca_file);
  if (h->send_headers)
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h->send_headers);
  if (req->body) {
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, req->body);
  }
  if (strcmp(method, "GET") == 0 && !req->body)
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  else if (strcmp(method, "POST") != 0 || !req->body)
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
  h->on_head = req->on_head;
  h->on_body = req->on_body;
  h->on_done = req->on_done;
  h->arg = req->arg;
  h->max_response = req->max_response ? req->max_response : RESPONSE_DEFAULT;
  h->first_byte_ms = req->first_byte_timeout_ms;
  h->idle_ms = req->idle_timeout_ms ? req->idle_timeout_ms : IDLE_DEFAULT_MS;
  uv_timer_init(ctx->loop, &h->timer);
  h->timer.data = h;
  h->m = m;
  ah__mount_hold(m, AH__HOLD_CLOSE); /* released when the timer's close completes */
  ah__list_push(&ctx->transfers, &h->link);
  ah__list_push(&m->https, &h->mlink);
  if (req->cancel && ah__cancel_watch(req->cancel, on_cancel, h, &h->watch) != 0) {
    h->done = true;
    transfer_free(h);
    return AH_ECANCELED;
  }
  if (h->watch)
    h->watch->fire_on_free = true; /* a token freed under a running transfer aborts it */
  uint64_t first = h->first_byte_ms && h->first_byte_ms < h->idle_ms ? h->first_byte_ms : h->idle_ms;
  /* The loop's clock is the start of its current pass: a caller that worked long since would see its
   * timeouts fire early. */
  uv_update_time(ctx->loop);
  uv_timer_start(&h->timer, on_transfer_timer, first, 0);
  if (ctx->in_action) {
    h->deferred = true;
    ah__list_push(&ctx->deferred, &h->dlink);
    *out = h;
    return 0;
  }
  if (curl_multi_add_handle(ctx->multi, e) != CURLM_OK) {
    h->done = true;
    transfer_free(h);
    return AH_ENOMEM;
  }
  h->in_multi = true;
  *out = h;
  return 0;
}

/* ---- mounts and the host ----------------------------------------------------------------------------- */

void ah__http_withdraw(ah_mount *m) {
  while (!ah__list_empty(&m->https)) {
    ah_http *h = AH__CONTAINER(m->https.next, ah_http, mlink);
    AH_LOG_W(LOG, "plugin %s left an HTTP transfer to %s running at withdraw; aborted by the host", m->name,
             h->url_host);
    h->done = true;
    transfer_free(h);
  }
}

static void ctx_timer_closed(uv_handle_t *hd) {
  free(hd->data);
}

void ah__http_close(ah_host *host) {
  ah__http_ctx *ctx = host->http;
  if (!ctx)
    return;
  host->http = NULL;
  ctx->closing = true;
  while (!ah__list_empty(&ctx->transfers)) { /* none should be left: every mount is withdrawn */
    ah_http *h = AH__CONTAINER(ctx->transfers.next, ah_http, link);
    h->done = true;
    transfer_free(h);
  }
  curl_multi_cleanup(ctx->multi); /* closes the cached connections (their sockets are removed) */
  while (!ah__list_empty(&ctx->sockets))
    sock_close(AH__CONTAINER(ctx->sockets.next, sock, link));
  uv_timer_stop(&ctx->timer);
  uv_close((uv_handle_t *)&ctx->timer, ctx_timer_closed);
}
