/* agenthost browser plugin — POST /api/<method> and POST /api/respond (PROTOCOLS.md API-RPC-MODEL,
 * API-RPC-SCHEMAS, API-HTTP-HANDLER, API-HTTP-BRIDGE; DECISIONS.md "Browser envelopes").
 *
 * The fence has admitted the headers and checked Content-Length against the route's limit; here the body is
 * read into a buffer of exactly that size (counted in the global in-flight budget, 503 beyond it) under an
 * idle deadline, then parsed in two stages: the envelope (kind, rpcId, method, payload or value/error),
 * then the method's own params by the method itself. Carrier problems are HTTP statuses; business outcomes
 * are 200 with `error` in the server-response. A client that disconnects cancels its call's token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "browser.h"
#include "envelope.h"

/* A body this large is parsed on a pool thread: parsing a prompt of many MiB took the loop, and every
 * other client with it, for a second or more. */
#define PARSE_OFF_LOOP_BYTES (1u << 20)

static void req_unlink(bp_req *r) {
  bp_state *st = r->st;
  if (r->prev)
    r->prev->next = r->next;
  else if (st->reqs == r)
    st->reqs = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->prev = r->next = NULL;
}

/* A body as large as a parse off the loop gets a mapping of its own: its pages can be given back while it
 * is parsed (read_body), which memory from malloc must not be. */
static size_t body_size(const bp_req *r) {
  return r->content_length ? (size_t)r->content_length : 1;
}

static int body_alloc(bp_req *r) {
  size_t n = body_size(r);
  if (n >= PARSE_OFF_LOOP_BYTES) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r->body = p == MAP_FAILED ? NULL : p;
    r->body_mapped = r->body != NULL;
  } else {
    r->body = malloc(n);
  }
  return r->body ? 0 : -1;
}

static void body_free(bp_req *r) {
  if (r->body && r->body_mapped)
    munmap(r->body, body_size(r));
  else
    free(r->body);
  r->body = NULL;
  r->body_mapped = false;
}

static void release_budget(bp_req *r) {
  if (r->budgeted) {
    r->st->body_in_flight -= r->content_length;
    r->budgeted = false;
  }
}

void bp_req_release(bp_req *r) {
  req_unlink(r);
  if (r->timer)
    r->st->api->timer_stop(r->timer);
  r->timer = NULL;
  release_budget(r);
  if (r->http && r->http->req == r)
    r->http->req = NULL;
  if (r->token)
    r->st->api->token_free(r->token);
  body_free(r);
  free(r->rpc_id);
  json_decref(r->env);
  free(r);
}

void bp_req_detach(bp_req *r) {
  r->wsi = NULL;
  r->http = NULL;
  if (r->dispatched) {
    /* API-HTTP-BRIDGE: the client went away: cancel its call; the reply frees the request. */
    if (r->token)
      r->st->api->token_trip(r->token);
    return;
  }
  bp_req_release(r);
}

bp_req *bp_req_new(bp_state *st, bp_http *h, struct lws *wsi, bp_req_kind kind) {
  bp_req *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->st = st;
  r->wsi = wsi;
  r->http = h;
  r->kind = kind;
  r->conn_id = h->conn_id;
  r->next = st->reqs;
  if (st->reqs)
    st->reqs->prev = r;
  st->reqs = r;
  h->req = r;
  return r;
}

/* Queue a response on the request's connection; the request is done. */
static void respond(bp_req *r, int status, json_t *body) {
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (r->http && r->http->rec && text)
    r->st->api->record(r->http->rec, true, text, strlen(text), r->corr);
  if (r->wsi && r->http) {
    if (!text)
      status = 500;
    if (bp_build_response(r->wsi, &r->http->out, status, "application/json", NULL, text ? text : "{}",
                          text ? strlen(text) : 2, true, r->close_after) == 0)
      bp_send_later(r->http, r->wsi);
  }
  free(text);
  bp_req_release(r);
}

static json_t *error_body(const char *rpc_id, const char *category, const char *message, json_t *data) {
  json_t *err = json_pack("{s:s, s:s}", "code", category, "message", message ? message : category);
  if (err && data)
    json_object_set(err, "data", data);
  json_t *body = json_pack("{s:s, s:o}", "kind", "server-response", "error", err);
  if (body && rpc_id)
    json_object_set_new(body, "rpcId", json_string(rpc_id));
  return body;
}

int bp_answer_error(bp_http *h, struct lws *wsi, int status, const char *rpc_id, const char *category,
                    const char *message, json_t *data) {
  json_t *body = error_body(rpc_id, category, message, data);
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  int rc = bp_build_response(wsi, &h->out, status, "application/json", NULL, text ? text : "{}",
                             text ? strlen(text) : 2, true, false);
  free(text);
  if (rc == 0)
    bp_send_later(h, wsi);
  return rc;
}

/* A generic 500: nothing of the failure reaches the client but a correlation id, which the log carries with
 * the real message (G9). */
static void internal_error(bp_req *r, const char *what) {
  bp_state *st = r->st;
  char corr[40];
  snprintf(corr, sizeof corr, "c-%llx-%llx", (unsigned long long)getpid(),
           (unsigned long long)++st->next_corr);
  st->api->log(st->m, AH_PLOG_ERROR, "internal error in %s (correlation id %s): %s", r->method, corr,
               what ? what : "unknown");
  respond(r, 500,
          error_body(r->rpc_id, "internal", "internal error", json_pack("{s:s}", "correlationId", corr)));
}

/* A server-response with a value: the envelope around the value's serialization, which is reused when the
 * value is the very same one as last time (see bp_state.last_value). */
static void respond_value(bp_req *r, const json_t *value) {
  bp_state *st = r->st;
  if (value != st->last_value || !st->last_value_text) {
    char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
      respond(r, 200,
              json_pack("{s:s, s:s, s:O}", "kind", "server-response", "rpcId", r->rpc_id, "value", value));
      return;
    }
    json_decref(st->last_value);
    free(st->last_value_text);
    st->last_value = json_incref((json_t *)value);
    st->last_value_text = text;
  }
  json_t *id = json_string(r->rpc_id);
  char *id_text = id ? json_dumps(id, JSON_ENCODE_ANY) : NULL;
  json_decref(id);
  char *text = NULL;
  if (!id_text || asprintf(&text, "{\"kind\":\"server-response\",\"rpcId\":%s,\"value\":%s}", id_text,
                           st->last_value_text) < 0)
    text = NULL;
  free(id_text);
  if (r->http && r->http->rec && text)
    st->api->record(r->http->rec, true, text, strlen(text), r->corr);
  if (r->wsi && r->http &&
      bp_build_response(r->wsi, &r->http->out, text ? 200 : 500, "application/json", NULL, text ? text : "{}",
                        text ? strlen(text) : 2, true, false) == 0)
    bp_send_later(r->http, r->wsi);
  free(text);
  bp_req_release(r);
}

static void on_reply(const ah_outcome *o, void *arg) {
  bp_req *r = arg;
  r->dispatched = false;
  r->st->outstanding--;
  if (!r->wsi) {
    bp_req_release(r);
    return;
  }
  if (o->status == 0) {
    if (r->session_id[0])
      bp_follow_touch(r->st, r->session_id); /* the web UI is looking at it */
    if (r->kind == BP_REQ_RESPOND)
      respond(r, 200, json_deep_copy(o->result)); /* the receipt {accepted, reason?} */
    else
      respond_value(r, o->result);
    return;
  }
  switch (o->status) {
  case AH_ENOMETHOD:
    respond(r, 404, error_body(r->rpc_id, "not-found", "no such method", NULL));
    return;
  case AH_EINTERNAL:
  case AH_ENOMEM:
  case AH_ESTATE:
  case AH_EABI:
  case AH_ELOAD:
    internal_error(r, o->message);
    return;
  case AH_EINVAL:
    if (r->kind == BP_REQ_RESPOND) {
      respond(r, 400, error_body(r->rpc_id, "bad-request", o->message, NULL));
      return;
    }
    break;
  default:
    break;
  }
  respond(r, 200, error_body(r->rpc_id, ah_err_category(o->status), o->message, (json_t *)o->data));
}

/* The session a call is about (its params' sessionId), kept for bp_follow_touch; not for calls that end it.
 */
static void note_session(bp_req *r, const char *method, const json_t *params) {
  const char *id = json_string_value(json_object_get(params, "sessionId"));
  size_t n = id ? strlen(id) : 0;
  r->session_id[0] = '\0';
  if (n == 0 || n > BF_ID_MAX || strcmp(method, "session.close") == 0 ||
      strcmp(method, "session.delete") == 0)
    return;
  memcpy(r->session_id, id, n + 1);
}

static void dispatch(bp_req *r, const char *method, json_t *params) {
  bp_state *st = r->st;
  note_session(r, method, params);
  int rc = st->api->token_new(st->m, NULL, &r->token);
  ah_caller c;
  if (rc == 0)
    rc = st->api->dispatch(st->m, bp_caller(&c, r->loopback, r->conn_id), method, params, r->token, on_reply,
                           r);
  else
    json_decref(params);
  if (rc == 0) {
    r->dispatched = true;
    st->outstanding++;
    return;
  }
  switch (rc) {
  case AH_ENOMETHOD:
    respond(r, 404, error_body(r->rpc_id, "not-found", "no such method", NULL));
    break;
  case AH_EPERM:
    respond(r, 403, error_body(r->rpc_id, "forbidden", "not permitted for this caller", NULL));
    break;
  case AH_EINVAL:
    respond(r, 400, error_body(r->rpc_id, "bad-request", "params must be an object or an array", NULL));
    break;
  case AH_ESTATE:
    respond(r, 503, error_body(r->rpc_id, "unavailable", "the host is stopping", NULL));
    break;
  case AH_EUNAVAILABLE:
    respond(r, 200, error_body(r->rpc_id, "unavailable", "the method is withdrawn", NULL));
    break;
  default:
    internal_error(r, ah_strerror(rc));
  }
}

#define BODY_ABSOLUTE_MS 300000

static void body_tick(ah_timer *t, void *arg) {
  (void)t;
  bp_req *r = arg;
  bp_state *st = r->st;
  uint64_t now = uv_now(st->loop);
  if (!r->wsi || r->dispatched)
    return;
  bool idle = now - r->last_ms > (uint64_t)st->body_timeout_s * 1000;
  if (!idle && now - r->start_ms <= BODY_ABSOLUTE_MS)
    return;
  st->api->log(st->m, AH_PLOG_WARN, "closing a connection: the body of POST /api/%s %s (%zu of %llu bytes)",
               r->method, idle ? "stopped coming" : "took too long", r->got,
               (unsigned long long)r->content_length);
  /* Closes at once: CLOSED_HTTP detaches and frees `r` (and stops this timer). */
  lws_set_timeout(r->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_SYNC);
}

int bp_api_begin(bp_state *st, bp_http *h, struct lws *wsi, const bf_decision *d) {
  /* G7: the global in-flight body budget, checked before a byte is read. */
  if (st->body_in_flight + d->content_length > st->body_budget) {
    st->api->log(st->m, AH_PLOG_WARN, "refused POST /api/%s: 503 in-flight body budget exhausted",
                 d->route == BF_ROUTE_RESPOND ? "respond" : d->method);
    bp_refuse_now(st, wsi, 503, "too many request bodies in flight; retry later", NULL, false,
                  d->content_length > 0);
    return d->content_length > 0 ? -1 : (lws_http_transaction_completed(wsi) ? -1 : 0);
  }
  bp_req *r = bp_req_new(st, h, wsi, d->route == BF_ROUTE_RESPOND ? BP_REQ_RESPOND : BP_REQ_API);
  if (!r)
    return -1;
  snprintf(r->method, sizeof r->method, "%s", d->route == BF_ROUTE_RESPOND ? "request.respond" : d->method);
  r->loopback = d->loopback;
  r->content_length = d->content_length;
  if (body_alloc(r) != 0) {
    bp_req_release(r);
    bp_refuse_now(st, wsi, 503, "out of memory", NULL, false, true);
    return -1;
  }
  r->budgeted = true;
  st->body_in_flight += d->content_length;
  if (d->content_length == 0)
    return bp_api_body_done(st, h, wsi);
  /* G7: the body must keep coming: an idle deadline between chunks and an absolute one, checked by a host
   * timer (outside libwebsockets' callbacks, where a synchronous close is safe). */
  r->start_ms = r->last_ms = uv_now(st->loop);
  if (st->api->timer_start(st->m, 250, 250, body_tick, r, &r->timer) != 0)
    r->timer = NULL;
  return 0;
}

int bp_api_body(bp_state *st, bp_http *h, struct lws *wsi, const void *in, size_t len) {
  bp_req *r = h->req;
  if (r->dispatched)
    return -1;
  if (len > r->content_length - r->got) {
    bp_log_refusal(st, wsi, "POST", r->method, 400, "more body than Content-Length");
    return -1;
  }
  memcpy(r->body + r->got, in, len);
  r->got += len;
  r->last_ms = uv_now(st->loop);
  return 0;
}

static int envelope_read(bp_req *r, json_t *env);

/* A large body is read by the parser in order, once: what it has read goes back to the system as it goes,
 * so the body and the value parsed from it are not both whole in memory. jansson copies what this hands it
 * into a buffer of its own. */
typedef struct body_reader {
  bp_req *r;
  size_t pos, released;
} body_reader;

#define RELEASE_STEP ((size_t)1 << 20)

static size_t read_body(void *buffer, size_t buflen, void *data) {
  body_reader *br = data;
  bp_req *r = br->r;
  if (br->pos - br->released >= RELEASE_STEP) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t upto = br->pos / page * page;
    if (upto > br->released && madvise(r->body + br->released, upto - br->released, MADV_DONTNEED) == 0)
      br->released = upto;
  }
  size_t n = r->got - br->pos < buflen ? r->got - br->pos : buflen;
  memcpy(buffer, r->body + br->pos, n);
  br->pos += n;
  return n;
}

static json_t *parse_envelope(bp_req *r) {
  /* Stage 1: the envelope. jansson refuses nesting deeper than 2048 (T6) and duplicate keys. */
  json_error_t jerr;
  if (!r->body_mapped)
    return json_loadb((const char *)r->body, r->got, JSON_REJECT_DUPLICATES, &jerr);
  body_reader br = {.r = r, .pos = 0, .released = 0};
  return json_load_callback(read_body, &br, JSON_REJECT_DUPLICATES, &jerr);
}

static void parse_work(void *arg) {
  bp_req *r = arg;
  r->env = parse_envelope(r);
}

static void parse_after(void *arg, int status) {
  bp_req *r = arg;
  r->st->outstanding--;
  r->dispatched = false;
  json_t *env = r->env;
  r->env = NULL;
  if (!r->wsi) { /* the client went away meanwhile: nothing runs */
    json_decref(env);
    bp_req_release(r);
    return;
  }
  if (status != 0) { /* withdraw cancelled the parse before it started */
    json_decref(env);
    respond(r, 503, error_body(NULL, "unavailable", "the server is stopping", NULL));
    return;
  }
  envelope_read(r, env);
}

int bp_api_body_done(bp_state *st, bp_http *h, struct lws *wsi) {
  bp_req *r = h->req;
  if (r->dispatched)
    return 0;
  /* The recording ([host] record_dir): the body as received, its answer (respond) with the same corr. */
  if (!h->rec && AH_HAS(st->api, ah_host_api, record_open)) {
    char label[40];
    snprintf(label, sizeof label, "http-%llu", (unsigned long long)h->conn_id);
    h->rec = st->api->record_open(st->m, label);
  }
  if (h->rec) {
    snprintf(r->corr, sizeof r->corr, "r%llu", (unsigned long long)++st->recorded_requests);
    st->api->record(h->rec, false, (const char *)r->body, r->got, r->corr);
  }
  r->starts_post = r->got >= 6 && memcmp(r->body, "POST /", 6) == 0;
  lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
  /* Every answer from here on is written later (bp_send_later), which resumes reading. */
  bp_hold_input(h, wsi);
  if (r->timer)
    st->api->timer_stop(r->timer);
  r->timer = NULL;
  if (r->got != r->content_length) {
    respond(r, 400, error_body(NULL, "bad-request", "the body is shorter than Content-Length", NULL));
    return 0;
  }
  if (r->got >= PARSE_OFF_LOOP_BYTES && st->api->queue_work(st->m, parse_work, parse_after, r) == 0) {
    r->dispatched = true; /* a close meanwhile leaves `r` to parse_after */
    st->outstanding++;
    return 0;
  }
  return envelope_read(r, parse_envelope(r));
}

/* The envelope parsed (NULL: not JSON): check it and dispatch its call, or answer why not. */
static int envelope_read(bp_req *r, json_t *env) {
  /* A JSON body never starts with a request line. */
  bool pipelined = !env && r->starts_post;
  body_free(r);
  release_budget(r);
  if (!env) {
    /* jansson's message may quote the input: never echoed, never logged (T9). */
    if (pipelined) {
      /* libwebsockets 4.1 read a request pipelined behind another from its buffer and handed its header
       * bytes over as the body: the request did not run and cannot be read; the client sends it again on
       * a new connection (this one closes after the answer). */
      r->close_after = true;
      respond(r, 400,
              error_body(NULL, "bad-request",
                         "a request pipelined behind another is not read: it did not run; send it again",
                         NULL));
      return 0;
    }
    respond(r, 400, error_body(NULL, "bad-request", "the body is not valid JSON", NULL));
    return 0;
  }
  be_call call;
  be_check(env, r->kind != BP_REQ_API, r->method, &call);
  if (call.rpc_id)
    r->rpc_id = strdup(call.rpc_id);
  const char *why = call.why;
  if (!why && !r->rpc_id)
    why = "out of memory";
  if (!why) {
    json_decref(env);
    dispatch(r, call.method, call.params);
    return 0;
  }
  json_decref(call.params);
  json_decref(env);
  respond(r, 400, error_body(r->rpc_id, "bad-request", why, NULL));
  return 0;
}
