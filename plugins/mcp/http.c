/* agenthost mcp plugin — the Streamable HTTP transport (MCP 2025-11-25 and 2025-06-18) on the host's HTTP
 * client.
 *
 * Every message the client sends is a POST to the server's URL (Accept: application/json, text/event-stream;
 * MCP-Protocol-Version once negotiated; Mcp-Session-Id once the server gave one). The answer to a request is
 * a JSON body or an event stream that carries it (and anything else the server wants to say first); a
 * notification or a response gets 202. After `notifications/initialized` a GET opens the server's own stream
 * (405: it has none). A stream that breaks before the answer it carries is resumed with a GET carrying
 * Last-Event-ID, after the server's `retry:` (1 s when it gave none), at most MAX_RESUMES times in a row; a
 * stream without event ids cannot be resumed and fails the requests waiting on it. A 404 with a session id
 * means the server forgot the session: the server is lost (started again at its next use). Closing aborts
 * every transfer and ends the session with a DELETE. Bearer tokens are read from the environment at each
 * start and sent only in the Authorization header: never logged, never in an event. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mcp.h"
#include "sse.h"

#define MAX_RESUMES 5
#define DEFAULT_RETRY_MS 1000
#define ERROR_EXCERPT 200

typedef struct hpending {
  struct hpending *next;
  int64_t id;
  mcp_reply_fn cb;
  void *arg;
} hpending;

typedef struct http_t http_t;

typedef struct hstream {
  struct hstream *next;
  http_t *t;
  ah_http *h;
  bool get;   /* the server's own stream or a resumption */
  int64_t id; /* the request this POST carries; -1 for others */
  int status;
  bool is_sse;
  sse_parser sse;
  char *body; /* a JSON body (or an error's excerpt) */
  size_t len;
} hstream;

struct http_t {
  mcp_server *s;
  json_t *headers; /* configured + Authorization */
  char session_id[256];
  hpending *pending;
  hstream *streams;
  int64_t next_id;
  bool closing;
  bool deleting;
  bool initialized; /* notifications/initialized was sent */
  int depth;        /* inside on_done: the transport is not freed under it */
  bool get_open;
  int resumes;
  char last_id[256];
  ah_timer *resume_timer;
};

#define API(s) ((s)->pl->api)
#define T(s) ((http_t *)(s)->t)

static void maybe_closed(http_t *t) {
  if (!t->closing || t->streams || t->resume_timer || t->depth > 0)
    return;
  mcp_server *s = t->s;
  while (t->pending) { /* nothing is left to answer them */
    hpending *p = t->pending;
    t->pending = p->next;
    p->cb(s, AH_ECLOSED, NULL, NULL, "the server's connection closed before it answered", p->arg);
    free(p);
  }
  json_decref(t->headers);
  free(t);
  s->t = NULL;
  mcp_server_closed(s);
}

static hpending *take_pending(http_t *t, int64_t id) {
  for (hpending **pp = &t->pending; *pp; pp = &(*pp)->next)
    if ((*pp)->id == id) {
      hpending *p = *pp;
      *pp = p->next;
      return p;
    }
  return NULL;
}

static void fail_pending(http_t *t, int64_t id, int status, const char *why) {
  hpending *p = take_pending(t, id);
  if (p) {
    p->cb(t->s, status, NULL, NULL, why, p->arg);
    free(p);
  }
}

static int start_transfer(http_t *t, const char *method, json_t *msg, int64_t id, bool get);

/* One message from the server (a JSON body, or one event's data). */
static void on_message(http_t *t, const char *text, size_t len) {
  json_error_t jerr;
  json_t *m = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  mcp_server *s = t->s;
  if (!json_is_object(m)) {
    mcp_log(s->pl, AH_PLOG_WARN, "[mcp.%s] a message that is not a JSON object was ignored", s->name);
    json_decref(m);
    return;
  }
  const char *method = json_string_value(json_object_get(m, "method"));
  json_t *id = json_object_get(m, "id");
  if (method) {
    if (id) {
      json_t *copy = json_deep_copy(id);
      mcp_server_message(s, method, json_object_get(m, "params"), copy);
    } else {
      mcp_server_message(s, method, json_object_get(m, "params"), NULL);
    }
  } else if (json_is_integer(id)) {
    hpending *p = take_pending(t, json_integer_value(id));
    if (p) {
      json_t *err = json_object_get(m, "error");
      p->cb(s, err ? AH_EPROTO : 0, json_object_get(m, "result"), err, NULL, p->arg);
      free(p);
    }
  }
  json_decref(m);
}

static int sse_event(void *arg, const char *event, const char *data, size_t len) {
  hstream *st = arg;
  if (st->t->s->t != st->t)
    return 1;
  snprintf(st->t->last_id, sizeof st->t->last_id, "%s", st->sse.last_id);
  st->t->resumes = 0; /* the stream is alive */
  if (strcmp(event, "message") == 0 && len > 0)
    on_message(st->t, data, len);
  return 0;
}

static int on_head(ah_http *h, int status, const json_t *headers, void *arg) {
  (void)h;
  hstream *st = arg;
  http_t *t = st->t;
  st->status = status;
  const char *sid = json_string_value(json_object_get(headers, "mcp-session-id"));
  if (sid && *sid && strlen(sid) < sizeof t->session_id) {
    bool visible = true;
    for (const char *c = sid; *c; c++)
      visible &= *c >= 0x21 && *c <= 0x7e;
    if (visible)
      snprintf(t->session_id, sizeof t->session_id, "%s", sid);
  }
  const char *ct = json_string_value(json_object_get(headers, "content-type"));
  st->is_sse = ct && strncasecmp(ct, "text/event-stream", 17) == 0;
  if (st->is_sse)
    sse_init(&st->sse, MCP_MAX_MESSAGE, MCP_MAX_MESSAGE);
  return 0;
}

static int on_body(ah_http *h, const char *data, size_t len, void *arg) {
  (void)h;
  hstream *st = arg;
  if (st->status >= 200 && st->status < 300 && st->is_sse) {
    int rc = sse_feed(&st->sse, data, len, sse_event, st);
    if (rc < 0) {
      mcp_log(st->t->s->pl, AH_PLOG_WARN, "[mcp.%s] the event stream broke: %s", st->t->s->name,
              rc == -1   ? "a line too long"
              : rc == -2 ? "an event too large"
                         : "out of memory");
      return 1;
    }
    return rc;
  }
  size_t cap = st->status >= 300 ? ERROR_EXCERPT : MCP_MAX_MESSAGE;
  if (st->len + len > cap) {
    if (st->status >= 300)
      len = cap > st->len ? cap - st->len : 0;
    else
      return 1; /* a JSON answer over the bound */
  }
  char *b = realloc(st->body, st->len + len + 1);
  if (!b)
    return 1;
  st->body = b;
  memcpy(b + st->len, data, len);
  st->len += len;
  b[st->len] = '\0';
  return 0;
}

static void stream_unlink(hstream *st) {
  for (hstream **pp = &st->t->streams; *pp; pp = &(*pp)->next)
    if (*pp == st) {
      *pp = st->next;
      return;
    }
}

static void on_resume(ah_timer *timer, void *arg) {
  (void)timer;
  http_t *t = arg;
  t->resume_timer = NULL;
  if (t->closing) {
    maybe_closed(t);
    return;
  }
  if (start_transfer(t, "GET", NULL, -1, true) != 0)
    mcp_server_lost(t->s, "cannot resume its event stream");
}

static bool has_pending(http_t *t, int64_t id) {
  for (hpending *p = t->pending; p; p = p->next)
    if (p->id == id)
      return true;
  return false;
}

/* A stream broke (or ended) before the answer it carries: resume it when the server gave event ids; else
 * the request waiting on it (waiting_id ≥ 0) fails with `why`. */
static void resume_later(http_t *t, hstream *st, int64_t waiting_id, int status, const char *why) {
  if (t->closing || t->resume_timer)
    return;
  if (!t->last_id[0] || t->resumes >= MAX_RESUMES) {
    if (waiting_id >= 0)
      fail_pending(t, waiting_id, status ? status : AH_EIO,
                   t->last_id[0] ? "the event stream broke too often" : why);
    return;
  }
  t->resumes++;
  long ms = st->is_sse && st->sse.retry_ms >= 0 ? st->sse.retry_ms : DEFAULT_RETRY_MS;
  if (API(t->s)->timer_start(t->s->pl->m, (uint64_t)ms, 0, on_resume, t, &t->resume_timer) != 0) {
    t->resume_timer = NULL;
    if (waiting_id >= 0)
      fail_pending(t, waiting_id, AH_EIO, "cannot resume the event stream");
  }
}

static void on_done(ah_http *h, int status, const char *message, void *arg) {
  (void)h;
  hstream *st = arg;
  http_t *t = st->t;
  mcp_server *s = t->s;
  stream_unlink(st);
  t->depth++;
  bool ok = status == 0 && st->status >= 200 && st->status < 300;
  if (t->closing) {
    /* nothing more is read */
  } else if (status == 0 && st->status == 404 && t->session_id[0] && !st->get) {
    t->session_id[0] = '\0';
    mcp_server_lost(s, "the server ended the MCP session (HTTP 404)");
  } else if (status == 0 && st->get && st->status == 405) {
    /* the server has no stream of its own */
  } else if (status == 0 && !ok) {
    char *why =
        mcp_fmt("HTTP %d%s%.*s", st->status, st->len ? ": " : "", (int)st->len, st->body ? st->body : "");
    for (char *c = why; c && *c; c++)
      if ((unsigned char)*c < 0x20)
        *c = ' ';
    if (st->id >= 0)
      fail_pending(t, st->id, AH_EPROTO, why ? why : "HTTP error");
    else
      mcp_log(s->pl, AH_PLOG_WARN, "[mcp.%s] %s refused: %s", s->name,
              st->get ? "the event stream was" : "a message was", why ? why : "HTTP error");
    free(why);
  } else {
    if (ok && !st->is_sse && st->len > 0)
      on_message(t, st->body, st->len);
    if (st->is_sse && st->sse.last_id[0])
      snprintf(t->last_id, sizeof t->last_id, "%s", st->sse.last_id);
    bool waiting = st->id >= 0 && has_pending(t, st->id);
    if (st->is_sse || status != 0) {
      if (waiting || (st->get && t->initialized))
        resume_later(t, st, waiting ? st->id : -1, status,
                     status ? message : "the server closed the stream before it answered");
    } else if (waiting) {
      fail_pending(t, st->id, AH_EPROTO, "the server's answer carried no response to the request");
    }
  }
  if (st->is_sse)
    sse_free(&st->sse);
  free(st->body);
  free(st);
  t->depth--;
  maybe_closed(t);
}

static int start_transfer(http_t *t, const char *method, json_t *msg, int64_t id, bool get) {
  mcp_server *s = t->s;
  hstream *st = calloc(1, sizeof *st);
  char *body = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
  json_decref(msg);
  json_t *hd = json_deep_copy(t->headers);
  if (!st || !hd || (!get && !body)) {
    free(st);
    free(body);
    json_decref(hd);
    return AH_ENOMEM;
  }
  st->t = t;
  st->id = id;
  st->get = get;
  json_object_set_new(hd, "Accept",
                      json_string(get ? "text/event-stream" : "application/json, text/event-stream"));
  if (!get)
    json_object_set_new(hd, "Content-Type", json_string("application/json"));
  if (s->protocol[0])
    json_object_set_new(hd, "MCP-Protocol-Version", json_string(s->protocol));
  if (t->session_id[0])
    json_object_set_new(hd, "Mcp-Session-Id", json_string(t->session_id));
  if (get && t->last_id[0])
    json_object_set_new(hd, "Last-Event-ID", json_string(t->last_id));
  ah_http_request req = {
      .struct_size = sizeof req,
      .method = method,
      .url = json_string_value(json_object_get(s->conf, "url")),
      .headers = hd,
      .body = body,
      .body_len = body ? strlen(body) : 0,
      .max_response = 0, /* the stream's own bound: MCP_MAX_MESSAGE per message */
      .connect_timeout_ms = s->startup_ms,
      .on_head = on_head,
      .on_body = on_body,
      .on_done = on_done,
      .arg = st,
  };
  int rc = API(s)->http_start(s->pl->m, &req, &st->h);
  free(body);
  json_decref(hd);
  if (rc) {
    free(st);
    return rc;
  }
  st->next = t->streams;
  t->streams = st;
  return 0;
}

/* ---- the transport ------------------------------------------------------------------------------------ */

static int h_open(mcp_server *s, char **why) {
  http_t *t = calloc(1, sizeof *t);
  if (!t)
    return AH_ENOMEM;
  t->s = s;
  t->headers = json_deep_copy(json_object_get(s->conf, "headers"));
  if (!t->headers)
    t->headers = json_object();
  const char *env = json_string_value(json_object_get(s->conf, "bearer_token_env"));
  if (env) {
    const char *token = getenv(env);
    if (!token || !*token) {
      *why = mcp_fmt("bearer_token_env: %s is not set", env);
      json_decref(t->headers);
      free(t);
      return AH_ECONFIG;
    }
    char *auth = mcp_fmt("Bearer %s", token);
    json_object_set_new(t->headers, "Authorization", json_string(auth ? auth : ""));
    free(auth);
  }
  s->t = t;
  return 0;
}

static int h_request(mcp_server *s, const char *method, json_t *params, mcp_reply_fn cb, void *arg,
                     int64_t *id) {
  http_t *t = T(s);
  if (!t || t->closing) {
    json_decref(params);
    return AH_ECLOSED;
  }
  hpending *p = calloc(1, sizeof *p);
  if (!p) {
    json_decref(params);
    return AH_ENOMEM;
  }
  p->id = ++t->next_id;
  p->cb = cb;
  p->arg = arg;
  json_t *msg = json_pack("{s:s, s:I, s:s}", "jsonrpc", "2.0", "id", (json_int_t)p->id, "method", method);
  if (params)
    json_object_set_new(msg, "params", params);
  p->next = t->pending;
  t->pending = p;
  int rc = start_transfer(t, "POST", msg, p->id, false);
  if (rc) {
    take_pending(t, p->id);
    free(p);
    return rc;
  }
  if (id)
    *id = p->id;
  return 0;
}

static void h_forget(mcp_server *s, int64_t id) {
  http_t *t = T(s);
  if (t)
    free(take_pending(t, id));
}

static int h_notify(mcp_server *s, const char *method, json_t *params) {
  http_t *t = T(s);
  if (!t || t->closing) {
    json_decref(params);
    return AH_ECLOSED;
  }
  json_t *msg = json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", method);
  if (params)
    json_object_set_new(msg, "params", params);
  int rc = start_transfer(t, "POST", msg, -1, false);
  if (rc == 0 && strcmp(method, "notifications/initialized") == 0 && !t->initialized) {
    t->initialized = true;
    start_transfer(t, "GET", NULL, -1, true); /* the server's own stream (405: none) */
  }
  return rc;
}

static void h_respond(mcp_server *s, void *inbound, json_t *result, int code, const char *message) {
  http_t *t = T(s);
  json_t *id = inbound;
  json_t *msg = code ? json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id, "error", "code",
                                 code, "message", message ? message : "error")
                     : json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result",
                                 result ? result : json_null());
  json_decref(id);
  if (t && !t->closing)
    start_transfer(t, "POST", msg, -1, false);
  else
    json_decref(msg);
}

static void h_close(mcp_server *s) {
  http_t *t = T(s);
  if (t->closing)
    return;
  t->closing = true;
  if (t->resume_timer) {
    API(s)->timer_stop(t->resume_timer);
    t->resume_timer = NULL;
  }
  for (hstream *st = t->streams; st; st = st->next)
    API(s)->http_abort(st->h); /* each ends on a later turn (on_done with AH_ECANCELED) */
  if (t->session_id[0] && !s->pl->withdrawing) {
    /* The session ends politely: a DELETE the server may refuse (405). Its answer is not waited for beyond
     * its own short timeout. */
    t->closing = false;
    json_t *hd = json_deep_copy(t->headers);
    json_object_set_new(hd, "Mcp-Session-Id", json_string(t->session_id));
    if (s->protocol[0])
      json_object_set_new(hd, "MCP-Protocol-Version", json_string(s->protocol));
    hstream *st = calloc(1, sizeof *st);
    ah_http_request req = {.struct_size = sizeof req,
                           .method = "DELETE",
                           .url = json_string_value(json_object_get(s->conf, "url")),
                           .headers = hd,
                           .total_timeout_ms = 2000,
                           .on_done = on_done,
                           .arg = st};
    t->closing = true;
    if (st) {
      st->t = t;
      st->id = -1;
      if (API(s)->http_start(s->pl->m, &req, &st->h) == 0) {
        st->next = t->streams;
        t->streams = st;
      } else {
        free(st);
      }
    }
    json_decref(hd);
  }
  maybe_closed(t);
}

const mcp_transport mcp_http_transport = {
    .open = h_open,
    .request = h_request,
    .forget = h_forget,
    .notify = h_notify,
    .respond = h_respond,
    .close = h_close,
};
