/* agenthost — the SDK surface: JSON-RPC 2.0 (JSON Lines) on the process's stdin/stdout (`agenthost sdk`).
 *
 * PROTOCOLS.md "SDK" table and DECISIONS.md "SDK wire", "Sessions and events":
 * - transport (SDK-JSONL-TRANSPORT): the core's JSON-RPC peer (api->rpc) does the framing and the lenient
 *   inbound classification; its diagnostics go to the host's log, so stdout carries protocol only;
 * - handshake (SDK-SERVER-INIT): before `initialize` every request is answered -32002 "not initialized", a
 *   second `initialize` -32600, and after `shutdown` everything -32600;
 * - sessions (SDK-SERVER-SESSIONS): `session/prompt` without a sessionId uses the connection's default
 *   session, created lazily on the first prompt with initialize's cwd/provider/model; prompts arriving while
 *   that creation runs wait for it (one creation); a sessionId names an existing session (unknown: -32002);
 *   the receipt is the core's durable `session.prompt` receipt;
 * - notifications (SDK-WIRE-METHODS, SDK-SERVER-EVENTS): every session of the host, after initialize;
 *   subagent.finished only for local children;
 * - server requests (SDK-WIRE-LIMITS): approvals and questions become `request/approval` /
 *   `request/question` when the client declared `capabilities.requests`;
 * - shutdown (SDK-SERVER-SHUTDOWN): `{}` is written and flushed (the peer is closed) before the host is asked
 *   to stop; stdin EOF stops the host as well.
 *
 * All state lives in one `sdk` object behind the mount's state pointer.
 */
#include <agenthost/errors.h>
#include <agenthost/jsonrpc.h>
#include <agenthost/plugin.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define SDK_PROTOCOL_VERSION 1
#define SDK_NOT_INITIALIZED (-32002)
#define SDK_UNKNOWN_SESSION (-32002)

typedef enum phase {
  PHASE_NEW,   /* waiting for initialize */
  PHASE_READY, /* initialized */
  PHASE_SHUT,  /* shutdown received, stdin ended or withdrawing: no new work */
} phase;

typedef struct sdk sdk;

/* A prompt without a sessionId waiting for the default session's creation. */
typedef struct waiter {
  struct waiter *next;
  ah_rpc_inbound *req;
  json_t *params; /* {text} or {content}: the prompt's own keys */
} waiter;

typedef enum call_kind {
  CALL_CREATE,  /* session.create for the default session */
  CALL_PROMPT,  /* session.prompt */
  CALL_SIMPLE,  /* session.cancel / session.close: the result as is */
  CALL_RESPOND, /* request.respond for a server request's answer */
  CALL_ATTACH,  /* mcp.attach: the connection's MCP servers for a session it created */
} call_kind;

/* One core call in flight. */
typedef struct core_call {
  sdk *s;
  call_kind kind;
  ah_rpc_inbound *req; /* NULL for CALL_CREATE and CALL_RESPOND */
  char *session_id;    /* the closed session of a session/close (to forget the default one) */
  bool closing;
  bool client_work; /* answers a client request, directly or through the prompts waiting on it */
} core_call;

/* One server→client request in flight. */
typedef struct server_req {
  sdk *s;
  char *request_id;
} server_req;

struct sdk {
  ah_mount *m;
  const ah_host_api *api;
  ah_rpc_peer *peer;
  bool peer_closing;
  bool peer_closed;
  ah_sub *sub;
  ah_cancel *token; /* parent of every core call: tripped at withdraw */
  phase phase;
  /* initialize */
  char *cwd;
  char *provider;
  char *model;
  int64_t max_tokens; /* kept for the record; the core's session.create takes no token limit */
  bool can_requests;
  bool can_deltas;     /* capabilities.deltas: session.delta and session.reasoning are forwarded */
  json_t *mcp_servers; /* initialize's mcpServers (ACP's shape), attached to every session it creates */
  /* the default session */
  char *default_sid;
  bool creating;
  waiter *waiters;
  waiter **waiters_tail;
  /* teardown */
  size_t outstanding;           /* core calls and server requests whose callback has not run */
  size_t client_calls;          /* core calls answering a client request (a subset of outstanding) */
  ah_rpc_inbound *shutdown_req; /* `shutdown` waiting for client_calls to reach 0 */
  ah_timer *shutdown_timer;
  json_t *failures; /* what went wrong during the teardown, reported together in one log record */
  bool withdrawing;
  bool finished;
  ah_withdraw_done_fn done;
};

static void maybe_finish(sdk *s);

/* ---- helpers ------------------------------------------------------------------------------------------ */

static const char *str_of(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

/* A JSON-RPC error for an ah status: ah_err_rpc_code() with data {category, name}; AH_ENOENT for a named
 * session is -32002 (DECISIONS.md "Sessions and events"). */
static void respond_status(const sdk *s, ah_rpc_inbound *req, int status, const char *message, bool session) {
  int code = session && status == AH_ENOENT ? SDK_UNKNOWN_SESSION : ah_err_rpc_code(status);
  json_t *data = json_pack("{s:s, s:s}", "category", ah_err_category(status), "name", ah_err_name(status));
  s->api->rpc->respond_error(req, code, message ? message : ah_strerror(status), data);
}

static void bad_params(const sdk *s, ah_rpc_inbound *req, const char *message) {
  s->api->rpc->respond_error(req, AH_RPC_INVALID_PARAMS, message,
                             json_pack("{s:s, s:s}", "category", "bad-request", "name", "EINVAL"));
}

static int core(sdk *s, const char *method, json_t *params, ah_reply_fn cb, core_call *c) {
  const ah_caller caller = {
      .struct_size = sizeof caller, .authority = AH_AUTH_STDIO_OWNER, .surface = "sdk", .connection_id = 1};
  int rc = s->api->dispatch(s->m, &caller, method, params, s->token, cb, c);
  if (rc == 0) {
    s->outstanding++;
    /* A session creation is client work too: prompts wait on it. */
    if (c && (c->req || c->kind == CALL_CREATE)) {
      c->client_work = true;
      s->client_calls++;
    }
  }
  return rc;
}

static core_call *call_new(sdk *s, call_kind kind, ah_rpc_inbound *req) {
  core_call *c = calloc(1, sizeof *c);
  if (c) {
    c->s = s;
    c->kind = kind;
    c->req = req;
  }
  return c;
}

static void call_free(core_call *c) {
  free(c->session_id);
  free(c);
}

/* ---- core call answers -------------------------------------------------------------------------------- */

static void send_prompt(sdk *s, ah_rpc_inbound *req, const char *session_id, json_t *prompt);

static void shutdown_answer(sdk *s);

static void on_core_reply(const ah_outcome *o, void *arg);

/* initialize's mcpServers for a session this connection created (the mcp plugin skips, by name and with a log
 * line, a server it cannot run; without the plugin the servers are skipped with one line). */
static void attach_servers(sdk *s, const char *sid) {
  if (json_array_size(s->mcp_servers) == 0)
    return;
  core_call *c = call_new(s, CALL_ATTACH, NULL);
  json_t *params = json_pack("{s:s, s:O, s:s}", "sessionId", sid, "servers", s->mcp_servers, "cwd", s->cwd);
  int rc = c && params ? core(s, "mcp.attach", params, on_core_reply, c) : AH_ENOMEM;
  if (!c)
    json_decref(params);
  if (rc) {
    if (c)
      call_free(c);
    s->api->log(s->m, AH_PLOG_WARN, "session %s: its %zu MCP server(s) are skipped: %s", sid,
                json_array_size(s->mcp_servers),
                rc == AH_ENOMETHOD ? "the mcp plugin is not loaded" : ah_strerror(rc));
  }
}

static void on_core_reply(const ah_outcome *o, void *arg) {
  core_call *c = arg;
  sdk *s = c->s;
  s->outstanding--;
  if (c->client_work && s->client_calls > 0)
    s->client_calls--;
  if (s->shutdown_req && o->status != 0 && s->failures)
    json_array_append_new(s->failures, json_sprintf("%s: %s", ah_err_name(o->status),
                                                    o->message ? o->message : ah_strerror(o->status)));
  switch (c->kind) {
  case CALL_PROMPT:
  case CALL_SIMPLE:
    if (o->status == 0) {
      if (c->closing && c->session_id && s->default_sid && strcmp(c->session_id, s->default_sid) == 0) {
        free(s->default_sid);
        s->default_sid = NULL;
      }
      s->api->rpc->respond(c->req, json_deep_copy(o->result));
    } else {
      respond_status(s, c->req, o->status, o->message, true);
    }
    break;
  case CALL_CREATE: {
    s->creating = false;
    const char *sid = o->status == 0 ? str_of(o->result, "sessionId") : NULL;
    if (sid) {
      free(s->default_sid);
      s->default_sid = strdup(sid);
      attach_servers(s, sid); /* before the waiting prompts: their turns see the servers */
    } else if (o->status == 0) {
      s->api->log(s->m, AH_PLOG_ERROR, "session.create answered without a sessionId");
    }
    waiter *w = s->waiters;
    s->waiters = NULL;
    s->waiters_tail = &s->waiters;
    while (w) {
      waiter *next = w->next;
      /* Prompts admitted before a shutdown still go through (the shutdown waits for them); only a
       * withdraw drops them. */
      if (s->default_sid && !s->withdrawing) {
        send_prompt(s, w->req, s->default_sid, w->params); /* steals the params */
      } else {
        if (o->status)
          respond_status(s, w->req, o->status, o->message, false);
        else if (s->withdrawing)
          respond_status(s, w->req, AH_ECLOSED, "the server is shutting down", false);
        else
          respond_status(s, w->req, AH_EINTERNAL, "the session could not be created", false);
        json_decref(w->params);
      }
      free(w);
      w = next;
    }
    break;
  }
  case CALL_RESPOND:
    if (o->status)
      s->api->log(s->m, AH_PLOG_WARN, "request.respond failed: %s", o->message);
    break;
  case CALL_ATTACH:
    if (o->status)
      s->api->log(s->m, AH_PLOG_WARN, "the MCP servers could not be attached: %s", o->message);
    break;
  }
  call_free(c);
  if (s->shutdown_req && s->client_calls == 0)
    shutdown_answer(s);
  maybe_finish(s);
}

/* ---- methods ------------------------------------------------------------------------------------------ */

static void m_initialize(sdk *s, ah_rpc_inbound *req, const json_t *p) {
  if (!json_is_object(p)) {
    bad_params(s, req, "params: an object with cwd is required");
    return;
  }
  const char *cwd = str_of(p, "cwd");
  if (!cwd || cwd[0] != '/') {
    bad_params(s, req, "params.cwd: an absolute path is required");
    return;
  }
  json_t *provider = json_object_get(p, "provider");
  json_t *model = json_object_get(p, "model");
  json_t *max_tokens = json_object_get(p, "maxTokens");
  json_t *version = json_object_get(p, "protocolVersion");
  json_t *client = json_object_get(p, "clientInfo");
  json_t *caps = json_object_get(p, "capabilities");
  json_t *requests = json_is_object(caps) ? json_object_get(caps, "requests") : NULL;
  json_t *deltas = json_is_object(caps) ? json_object_get(caps, "deltas") : NULL;
  if ((provider && !json_is_string(provider)) || (model && !json_is_string(model))) {
    bad_params(s, req, "params: provider and model must be strings");
    return;
  }
  if (max_tokens && (!json_is_integer(max_tokens) || json_integer_value(max_tokens) < 1)) {
    bad_params(s, req, "params.maxTokens: a positive integer is required");
    return;
  }
  if (version && !json_is_integer(version)) {
    bad_params(s, req, "params.protocolVersion: an integer is required");
    return;
  }
  if ((client && !json_is_object(client)) || (caps && !json_is_object(caps))) {
    bad_params(s, req, "params: clientInfo and capabilities must be objects");
    return;
  }
  if (requests && !json_is_boolean(requests)) {
    bad_params(s, req, "params.capabilities.requests: a boolean is required");
    return;
  }
  if (deltas && !json_is_boolean(deltas)) {
    bad_params(s, req, "params.capabilities.deltas: a boolean is required");
    return;
  }
  json_t *mcp = json_object_get(p, "mcpServers");
  bool mcp_ok = !mcp || json_is_array(mcp);
  size_t i;
  json_t *srv;
  json_array_foreach(mcp, i, srv) mcp_ok =
      mcp_ok && json_is_object(srv) && json_is_string(json_object_get(srv, "name"));
  if (!mcp_ok) {
    bad_params(s, req, "params.mcpServers: an array of servers, each an object with a name");
    return;
  }
  s->mcp_servers = mcp ? json_deep_copy(mcp) : NULL;
  s->cwd = strdup(cwd);
  s->provider = provider ? strdup(json_string_value(provider)) : NULL;
  s->model = model ? strdup(json_string_value(model)) : NULL;
  if (!s->cwd || (provider && !s->provider) || (model && !s->model)) {
    respond_status(s, req, AH_ENOMEM, NULL, false);
    return;
  }
  s->max_tokens = max_tokens ? json_integer_value(max_tokens) : 0;
  s->can_requests = json_is_true(requests);
  s->can_deltas = json_is_true(deltas);
  s->phase = PHASE_READY;
  /* One protocol version exists: the answer is 1 whatever the client asked for; the client decides. */
  s->api->rpc->respond(req, json_pack("{s:{s:s, s:s}, s:i, s:{s:b, s:b, s:b, s:b}}", "serverInfo", "name",
                                      "agenthost", "version", s->api->host_version(), "protocolVersion",
                                      SDK_PROTOCOL_VERSION, "capabilities", "cancel", 1, "close", 1,
                                      "requests", 1, "deltas", 1));
}

/* `prompt` ({text} or {content}) is stolen. */
static void send_prompt(sdk *s, ah_rpc_inbound *req, const char *session_id, json_t *prompt) {
  core_call *c = call_new(s, CALL_PROMPT, req);
  json_t *params = json_copy(prompt);
  json_decref(prompt);
  if (!c || !params || json_object_set_new(params, "sessionId", json_string(session_id)) != 0) {
    free(c);
    json_decref(params);
    respond_status(s, req, AH_ENOMEM, NULL, false);
    return;
  }
  int rc = core(s, "session.prompt", params, on_core_reply, c);
  if (rc) {
    call_free(c);
    respond_status(s, req, rc, NULL, true);
  }
}

static void m_prompt(sdk *s, ah_rpc_inbound *req, const json_t *p) {
  if (!json_is_object(p)) {
    bad_params(s, req, "params: an object with text or content is required");
    return;
  }
  json_t *sid = json_object_get(p, "sessionId");
  json_t *text = json_object_get(p, "text");
  json_t *content = json_object_get(p, "content");
  if (sid && !json_is_string(sid)) {
    bad_params(s, req, "params.sessionId: a string is required");
    return;
  }
  if ((text != NULL) == (content != NULL) || (text && !json_is_string(text)) ||
      (content && (!json_is_array(content) || json_array_size(content) == 0))) {
    bad_params(s, req, "params: exactly one of text (string) or content (non-empty array) is required");
    return;
  }
  json_t *prompt = text ? json_pack("{s:O}", "text", text) : json_pack("{s:O}", "content", content);
  if (!prompt) {
    respond_status(s, req, AH_ENOMEM, NULL, false);
    return;
  }
  if (sid) {
    send_prompt(s, req, json_string_value(sid), prompt);
    return;
  }
  if (s->default_sid) {
    send_prompt(s, req, s->default_sid, prompt);
    return;
  }
  waiter *w = calloc(1, sizeof *w);
  if (!w) {
    json_decref(prompt);
    respond_status(s, req, AH_ENOMEM, NULL, false);
    return;
  }
  w->req = req;
  w->params = prompt;
  *s->waiters_tail = w;
  s->waiters_tail = &w->next;
  if (s->creating)
    return; /* coalesced into the creation in flight */
  core_call *c = call_new(s, CALL_CREATE, NULL);
  json_t *params = json_pack("{s:s, s:s*, s:s*}", "cwd", s->cwd, "provider", s->provider, "model", s->model);
  int rc = c && params ? core(s, "session.create", params, on_core_reply, c) : AH_ENOMEM;
  if (!c || !params)
    json_decref(params);
  if (rc) {
    free(c);
    w = s->waiters;
    s->waiters = NULL;
    s->waiters_tail = &s->waiters;
    while (w) {
      waiter *next = w->next;
      respond_status(s, w->req, rc, NULL, false);
      json_decref(w->params);
      free(w);
      w = next;
    }
    return;
  }
  s->creating = true;
}

static void m_session_call(sdk *s, ah_rpc_inbound *req, const json_t *p, const char *method, bool closing) {
  const char *sid = json_is_object(p) ? str_of(p, "sessionId") : NULL;
  if (!sid) {
    bad_params(s, req, "params.sessionId: a string is required");
    return;
  }
  core_call *c = call_new(s, CALL_SIMPLE, req);
  if (c) {
    c->closing = closing;
    c->session_id = strdup(sid);
  }
  if (!c || !c->session_id) {
    if (c)
      call_free(c);
    respond_status(s, req, AH_ENOMEM, NULL, false);
    return;
  }
  int rc = core(s, method, json_pack("{s:s}", "sessionId", sid), on_core_reply, c);
  if (rc) {
    call_free(c);
    respond_status(s, req, rc, NULL, true);
  }
}

static void unsubscribe_all(sdk *s) {
  if (s->sub)
    s->api->unsubscribe(s->sub);
  s->sub = NULL;
}

static void peer_closed(ah_rpc_peer *peer, void *arg) {
  (void)peer;
  sdk *s = arg;
  s->peer_closed = true;
  s->peer = NULL;
  /* SDK-SERVER-SHUTDOWN: the `{}` is flushed; only now is the host asked to stop. */
  if (!s->withdrawing)
    s->api->host_stop(s->m, 0);
  maybe_finish(s);
}

static void close_peer(sdk *s) {
  if (s->peer_closing || !s->peer)
    return;
  s->peer_closing = true;
  if (s->api->rpc->close(s->peer, peer_closed, s) != 0) {
    s->peer_closed = true;
    s->peer = NULL;
  }
}

/* SDK-SERVER-SESSIONS / SDK-SERVER-SHUTDOWN: admission stops at once (later requests get -32600), the
 * requests already accepted are answered (bounded: 2 s), then `{}` is written and flushed, the peer closed,
 * and only then the host asked to stop. What failed on the way is logged together, in one record. */
#define SHUTDOWN_WAIT_MS 2000

static void shutdown_answer(sdk *s) {
  ah_rpc_inbound *req = s->shutdown_req;
  if (!req)
    return;
  s->shutdown_req = NULL;
  if (s->shutdown_timer) {
    s->api->timer_stop(s->shutdown_timer);
    s->shutdown_timer = NULL;
  }
  if (s->client_calls > 0 && s->failures)
    json_array_append_new(s->failures, json_sprintf("%zu request(s) still unanswered after %d ms",
                                                    s->client_calls, SHUTDOWN_WAIT_MS));
  if (s->failures && json_array_size(s->failures) > 0) {
    char *text = json_dumps(s->failures, JSON_COMPACT);
    s->api->log(s->m, AH_PLOG_WARN, "shutdown: %zu failure(s): %s", json_array_size(s->failures),
                text ? text : "?");
    free(text);
  }
  if (s->api->rpc->respond(req, json_object()) != 0 && s->failures)
    s->api->log(s->m, AH_PLOG_WARN, "shutdown: the answer could not be written");
  close_peer(s); /* flushes the answer, then peer_closed() asks the host to stop */
}

static void shutdown_deadline(ah_timer *t, void *arg) {
  (void)t;
  sdk *s = arg;
  s->shutdown_timer = NULL;
  shutdown_answer(s);
}

static void m_shutdown(sdk *s, ah_rpc_inbound *req) {
  s->phase = PHASE_SHUT;
  unsubscribe_all(s);
  s->shutdown_req = req;
  if (!s->failures)
    s->failures = json_array();
  if (s->client_calls == 0 ||
      s->api->timer_start(s->m, SHUTDOWN_WAIT_MS, 0, shutdown_deadline, s, &s->shutdown_timer) != 0)
    shutdown_answer(s);
}

static void on_request(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *data) {
  (void)peer;
  sdk *s = data;
  if (s->phase == PHASE_SHUT) {
    s->api->rpc->respond_error(req, AH_RPC_INVALID_REQUEST, "the server is shut down", NULL);
    return;
  }
  if (strcmp(method, "initialize") == 0) {
    if (s->phase != PHASE_NEW)
      s->api->rpc->respond_error(req, AH_RPC_INVALID_REQUEST, "already initialized", NULL);
    else
      m_initialize(s, req, params);
    return;
  }
  if (s->phase == PHASE_NEW) {
    s->api->rpc->respond_error(req, SDK_NOT_INITIALIZED, "not initialized", NULL);
    return;
  }
  if (strcmp(method, "session/prompt") == 0)
    m_prompt(s, req, params);
  else if (strcmp(method, "session/cancel") == 0)
    m_session_call(s, req, params, "session.cancel", false);
  else if (strcmp(method, "session/close") == 0)
    m_session_call(s, req, params, "session.close", true);
  else if (strcmp(method, "shutdown") == 0)
    m_shutdown(s, req);
  else
    s->api->rpc->respond_error(req, AH_RPC_METHOD_NOT_FOUND, "method not found", NULL);
}

static void on_notification(ah_rpc_peer *peer, const char *method, const json_t *params, void *data) {
  (void)peer;
  (void)params;
  sdk *s = data;
  s->api->log(s->m, AH_PLOG_DEBUG, "ignored notification %s", method);
}

static void on_eof(ah_rpc_peer *peer, int status, void *data) {
  (void)peer;
  sdk *s = data;
  if (status)
    s->api->log(s->m, AH_PLOG_WARN, "stdin failed: %s", ah_strerror(status));
  if (s->phase == PHASE_SHUT || s->withdrawing)
    return;
  s->phase = PHASE_SHUT;
  unsubscribe_all(s);
  s->api->host_stop(s->m, 0); /* orderly: the host withdraws us, which closes the peer */
}

static void on_log(ah_rpc_peer *peer, const char *msg, void *data) {
  (void)peer;
  sdk *s = data;
  s->api->log(s->m, AH_PLOG_WARN, "%s", msg);
}

/* ---- events ------------------------------------------------------------------------------------------- */

static void on_answer(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error, void *arg) {
  (void)peer;
  server_req *r = arg;
  sdk *s = r->s;
  s->outstanding--;
  json_t *params = NULL;
  if (status == 0)
    params = json_pack("{s:s, s:O}", "id", r->request_id, "value", result);
  else if (status == AH_EPROTO)
    params = json_pack("{s:s, s:O}", "id", r->request_id, "error", error);
  /* AH_ECLOSED: no answer; the request stays pending for other surfaces. */
  if (params && !s->withdrawing) {
    core_call *c = call_new(s, CALL_RESPOND, NULL);
    int rc = c ? core(s, "request.respond", params, on_core_reply, c) : AH_ENOMEM;
    if (!c)
      json_decref(params);
    if (rc) {
      free(c);
      s->api->log(s->m, AH_PLOG_WARN, "cannot answer request %s: %s", r->request_id, ah_strerror(rc));
    }
  } else {
    json_decref(params);
  }
  free(r->request_id);
  free(r);
  maybe_finish(s);
}

static void forward_request(sdk *s, const json_t *data) {
  json_t *request = json_object_get(data, "request");
  const char *kind = str_of(request, "kind");
  const char *id = str_of(request, "id");
  const char *method = !kind                           ? NULL
                       : strcmp(kind, "approval") == 0 ? "request/approval"
                       : strcmp(kind, "question") == 0 ? "request/question"
                                                       : NULL;
  if (!method || !id)
    return;
  server_req *r = calloc(1, sizeof *r);
  if (!r || !(r->request_id = strdup(id))) {
    free(r);
    return;
  }
  r->s = s;
  int rc = s->api->rpc->request(s->peer, method, json_incref(request), on_answer, r, NULL);
  if (rc) {
    free(r->request_id);
    free(r);
    return;
  }
  s->outstanding++;
}

static void on_event(const char *name, const json_t *data, void *arg) {
  sdk *s = arg;
  if (strcmp(name, "session.closed") == 0) {
    const char *sid = str_of(data, "sessionId");
    if (sid && s->default_sid && strcmp(sid, s->default_sid) == 0) {
      free(s->default_sid);
      s->default_sid = NULL; /* the next prompt without a sessionId makes a new one */
    }
    return;
  }
  if (s->phase != PHASE_READY || !s->peer || s->peer_closing)
    return;
  if (strcmp(name, "session.event") == 0 || strcmp(name, "session.status") == 0 ||
      strcmp(name, "subagent.started") == 0 ||
      (strcmp(name, "subagent.finished") == 0 && json_is_true(json_object_get(data, "local"))) ||
      (s->can_deltas && (strcmp(name, "session.delta") == 0 || strcmp(name, "session.reasoning") == 0))) {
    s->api->rpc->notify(s->peer, name, json_incref((json_t *)data));
  } else if (strcmp(name, "request.pending") == 0 && s->can_requests) {
    forward_request(s, data);
  }
}

/* ---- mount and withdraw ------------------------------------------------------------------------------- */

static void sdk_free(sdk *s) {
  waiter *w = s->waiters;
  while (w) {
    waiter *next = w->next;
    json_decref(w->params);
    free(w);
    w = next;
  }
  free(s->default_sid);
  json_decref(s->failures);
  free(s->cwd);
  free(s->provider);
  free(s->model);
  json_decref(s->mcp_servers);
  free(s);
}

static void maybe_finish(sdk *s) {
  if (!s->withdrawing || s->finished || !s->peer_closed || s->outstanding)
    return;
  s->finished = true;
  ah_mount *m = s->m;
  ah_withdraw_done_fn done = s->done;
  if (s->token)
    s->api->token_free(s->token);
  sdk_free(s);
  done(m);
}

static int sdk_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  if (!AH_HAS(api, ah_host_api, stdio_rpc) || !AH_HAS(api, ah_host_api, host_stop))
    return AH_EABI;
  sdk *s = calloc(1, sizeof *s);
  if (!s)
    return AH_ENOMEM;
  s->m = m;
  s->api = api;
  s->waiters_tail = &s->waiters;
  /* One subscription for session.*, subagent.* and request.* (filtered in on_event): delivery is ordered
   * per subscriber, so the client sees the events in the order the core emitted them (a request/approval
   * after the tool/call that asked for it, session.status idle after the turn/ended). */
  int rc = api->token_new(m, NULL, &s->token);
  if (rc == 0)
    rc = api->subscribe(m, "*", on_event, s, &s->sub);
  if (rc == 0) {
    ah_rpc_opts opts = {.struct_size = sizeof opts,
                        .on_request = on_request,
                        .on_notification = on_notification,
                        .on_eof = on_eof,
                        .on_log = on_log,
                        .data = s};
    rc = api->stdio_rpc(m, config, &opts, &s->peer);
  }
  if (rc) {
    unsubscribe_all(s);
    if (s->token)
      api->token_free(s->token);
    sdk_free(s);
    return rc;
  }
  *state = s;
  return 0;
}

static void sdk_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  (void)m;
  sdk *s = state;
  s->withdrawing = true;
  s->done = done;
  s->phase = PHASE_SHUT;
  unsubscribe_all(s);
  s->api->token_trip(s->token); /* core calls in flight are answered `cancelled` */
  close_peer(s);
  maybe_finish(s);
}

static const ah_plugin_desc sdk_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "sdk",
    .version = "0.1.0",
    .description = "SDK surface: JSON-RPC 2.0 (JSON Lines) on stdin/stdout",
    .mount = sdk_mount,
    .withdraw = sdk_withdraw,
    .may_withdraw = NULL,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  if (AH_ABI_MAJOR_OF(host_abi) != AH_ABI_MAJOR)
    return NULL;
  return &sdk_desc;
}
