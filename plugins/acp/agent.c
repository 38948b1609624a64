/* agenthost — the agent side of ACP v1 on the process's stdin/stdout (`agenthost acp`).
 *
 * PROTOCOLS.md "ACP" table; docs/protocols/acp.md describes the behaviour capability by capability:
 * - transport (ACP-SDK-*): the core's JSON-RPC peer (api->rpc) frames JSON Lines and answers malformed
 *   input (-32700 / -32600, id null); its diagnostics go to the host's log, so stdout carries ACP only;
 * - handshake (ACP-HANDSHAKE): `initialize` answers protocolVersion 1 and only the capabilities that work;
 * - sessions: `session/new` creates a core session; `session/load` replays it from the store;
 *   `session/resume`, `session/list`, `session/close`, `session/delete`. Only the sessions this connection
 *   created, loaded or resumed ("tracked") get `session/update`s, take prompts and cancels;
 * - prompts (ACP-PROMPT-CANCEL): one prompt per session is given to the core at a time, the others wait
 *   in this connection's queue and are answered in order; the answer of a prompt is the end of the turn
 *   whose messageId is the prompt's own (never "whatever ended next");
 * - output (ACP-OUTPUT-PERMISSION): the session's stored events become updates (codec.c); approvals become
 *   `session/request_permission`, and anything but a selected known option denies;
 * - stdin EOF (ACP-QUIESCE): admission stops, every prompt of this connection is cancelled and answered,
 *   then the peer is flushed and closed and the host asked to stop.
 *
 * All state lives in one `acp_agent` object behind the plugin's state pointer.
 */
#include <agenthost/errors.h>
#include <agenthost/jsonrpc.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define uthash_fatal(msg) abort()
#include <uthash.h>

#include "agent.h"

#define ACP_PROTOCOL_VERSION 1
#define ACP_RESOURCE_NOT_FOUND (-32002)
#define ACP_AUTH_REQUIRED (-32000)
#define ACP_REQUEST_CANCELLED (-32800)
#define HISTORY_PAGE 1000
#define LIST_PAGE 100
#define QUIESCE_WAIT_MS 3000

typedef enum phase {
  PHASE_INVALID = 0,
  PHASE_SERVING,   /* requests are admitted */
  PHASE_QUIESCING, /* stdin ended: prompts are being settled, nothing new is admitted */
  PHASE_CLOSED,    /* the peer is closing or closed */
} phase;

typedef struct asession asession;

/* One session/prompt of the client. */
typedef struct prompt {
  struct prompt *next;
  ah_rpc_inbound *req; /* NULL once answered */
  json_t *content;     /* the core's content blocks */
  char *message_id;    /* the core's receipt */
  bool sent;           /* session.prompt dispatched */
  bool in_call;        /* its session.prompt has not been answered yet */
  bool orphan;         /* answered and detached while in_call: the receipt callback frees it */
  bool cancel_requested;
} prompt;

/* A session this connection created, loaded or resumed. */
struct asession {
  char *id;
  int64_t min_seq; /* live events up to this seq were replayed already */
  prompt *head;    /* head: given to the core; the others wait */
  prompt **tail;
  json_t *ended;       /* messageId → turn/ended data, seen while the head's receipt was outstanding */
  acp_codec_state ctr; /* message numbering, cwd, tool calls in flight (the codec's) */
  json_t *children;    /* ids of the subagent sessions started by its turns (and theirs): id → true */
  char *delta;         /* stream_deltas: text streamed in delta_turn, not yet matched by a commit */
  char delta_turn[80];
  int stream_k;
  bool closing;
  ah_cancel *follow; /* the session.follow that keeps it in the host's memory while tracked here */
  UT_hash_handle hh;
};

typedef enum call_kind {
  CALL_INVALID = 0,
  CALL_NEW,       /* session.create for session/new */
  CALL_PROMPT,    /* session.prompt of a queue's head */
  CALL_FIRE,      /* session.cancel / request.respond: the result is only logged */
  CALL_USAGE,     /* session.get at a turn's end: its cost, for the turn's usage_update */
  CALL_CLOSE,     /* session.close for session/close */
  CALL_GET,       /* session.get for session/load and session/resume */
  CALL_HISTORY,   /* session.history pages of a session/load */
  CALL_LIST,      /* session.list for session/list */
  CALL_DEL_GET,   /* session.get, then close, then delete for session/delete */
  CALL_DEL_CLOSE, /* session.close of a session/delete */
  CALL_DELETE,    /* session.delete */
  CALL_INIT,      /* provider.list for initialize (authMethods) */
  CALL_OPTION,    /* session.set-option for session/set_config_option, session/set_mode or a command */
  CALL_FOLLOW,    /* session.follow of a tracked session: answered when it ends or is tripped */
} call_kind;

/* One core call in flight. */
typedef struct ccall {
  acp_agent *a;
  call_kind kind;
  ah_rpc_inbound *req; /* the client request it answers (NULL for CALL_PROMPT and CALL_FIRE) */
  prompt *p;           /* CALL_PROMPT */
  char *sid;
  bool replay;      /* CALL_GET: load (replay) or resume */
  int64_t last_seq; /* CALL_HISTORY: the replay so far */
  acp_codec_state ctr;
  char *cwd;          /* CALL_LIST filter; the session's cwd for CALL_NEW and CALL_GET */
  json_t *mcp;        /* CALL_NEW, CALL_GET: the client's mcpServers, attached once the session is there */
  json_t *options;    /* CALL_GET, CALL_HISTORY: the session's options, for the load's answer */
  char *option;       /* CALL_OPTION: the option's id */
  const char *answer; /* CALL_OPTION: "options" (set_config_option), "mode" (set_mode) or "command" */
  json_t *init;       /* CALL_INIT: the initialize answer being completed */
  json_t *update;     /* CALL_USAGE: the usage_update to send, and the turn/ended event after it */
  json_t *ended;
  ah_cancel *follow; /* CALL_FOLLOW: its token (the call's), freed with the answer */
} ccall;

/* One session/request_permission in flight. */
typedef struct perm {
  acp_agent *a;
  char *request_id;
  json_t *answers; /* a question: the option labels, by index of "answer/<i>"; NULL for a tool approval */
} perm;

struct acp_agent {
  ah_mount *m;
  const ah_host_api *api;
  ah_rpc_peer *peer;
  bool peer_closed;
  ah_sub *sub;
  ah_cancel *token; /* parent of every core call: tripped at stop */
  phase phase;
  bool stream_deltas;
  json_t *provider;       /* the default provider as provider.list shows it (initialize): its key */
  bool fs_read, fs_write; /* the client reads and writes its own buffers (clientCapabilities.fs) */
  bool terminal;          /* the client runs commands in its terminals (clientCapabilities.terminal) */
  asession *sessions;     /* tracked sessions by id (uthash) */
  json_t *roots;          /* subagent session id → the tracked session whose turns started it */
  size_t outstanding;     /* core calls and permission requests whose callback has not run */
  size_t client_calls;    /* core calls answering a client request */
  ah_timer *quiesce_timer;
  bool stopping;
  bool finished;
  void (*done)(void *arg);
  void *done_arg;
};

static void maybe_finish(acp_agent *a);
static void maybe_quiesced(acp_agent *a);
static void send_head(acp_agent *a, asession *s);

/* ---- helpers ------------------------------------------------------------------------------------------ */

static const char *str_of(const json_t *o, const char *key) {
  return json_string_value(json_object_get(o, key));
}

/* The JSON-RPC code for an AH_E* status. ACP reserves -32002 for "resource not found" and -32000 for
 * "authentication required", so the generic -32000 + code is kept only where it cannot collide. */
static int rpc_code(int status, bool session) {
  switch (status) {
  case AH_ENOENT:
    return session ? ACP_RESOURCE_NOT_FOUND : -32000 + status;
  case AH_ENOMETHOD:
    return AH_RPC_METHOD_NOT_FOUND;
  case AH_EINVAL:
    return AH_RPC_INVALID_PARAMS;
  case AH_ECANCELED:
    return ACP_REQUEST_CANCELLED;
  case AH_ENOMEM:
  case AH_EINTERNAL:
  case AH_EIO:
  case AH_ESTATE:
    return AH_RPC_INTERNAL_ERROR;
  default:
    return ah_err_rpc_code(status);
  }
}

static void respond_status(const acp_agent *a, ah_rpc_inbound *req, int status, const char *message,
                           bool session) {
  json_t *data = json_pack("{s:s, s:s}", "category", ah_err_category(status), "name", ah_err_name(status));
  a->api->rpc->respond_error(req, rpc_code(status, session), message ? message : ah_strerror(status), data);
}

static void bad_params(const acp_agent *a, ah_rpc_inbound *req, const char *message) {
  a->api->rpc->respond_error(req, AH_RPC_INVALID_PARAMS, message, NULL);
}

static void unknown_session(const acp_agent *a, ah_rpc_inbound *req) {
  a->api->rpc->respond_error(req, ACP_RESOURCE_NOT_FOUND, "unknown session", NULL);
}

static asession *find_session(const acp_agent *a, const char *id) {
  asession *s = NULL;
  if (id)
    HASH_FIND_STR(a->sessions, id, s);
  return s;
}

/* The tracked session `id` belongs to: itself, or the one whose turns started it as a subagent. */
static asession *find_root(const acp_agent *a, const char *id) {
  asession *s = find_session(a, id);
  if (s || !id)
    return s;
  return find_session(a, str_of(a->roots, id));
}

static ccall *ccall_new(acp_agent *a, call_kind kind, ah_rpc_inbound *req, const char *sid) {
  ccall *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->a = a;
  c->kind = kind;
  c->req = req;
  if (sid && !(c->sid = strdup(sid))) {
    free(c);
    return NULL;
  }
  return c;
}

static void ccall_free(ccall *c) {
  acp_codec_state_clear(&c->ctr);
  free(c->sid);
  free(c->cwd);
  json_decref(c->mcp);
  json_decref(c->options);
  json_decref(c->update);
  json_decref(c->ended);
  json_decref(c->init);
  free(c->option);
  free(c);
}

/* Dispatch a core method for this connection (authority stdio-owner, surface "acp"). `params` is stolen.
 * On error `c` is left to the caller. */
static int core_with(acp_agent *a, const char *method, json_t *params, ah_cancel *token, ah_reply_fn cb,
                     ccall *c) {
  const ah_caller caller = {
      .struct_size = sizeof caller, .authority = AH_AUTH_STDIO_OWNER, .surface = "acp", .connection_id = 1};
  /* Counted before the dispatch: the host answers on a later loop turn, but may answer at once when it runs
   * out of memory. */
  bool client = c->req != NULL;
  a->outstanding++;
  if (client)
    a->client_calls++;
  int rc = a->api->dispatch(a->m, &caller, method, params, token, cb, c);
  if (rc) {
    a->outstanding--;
    if (client)
      a->client_calls--;
  }
  return rc;
}

static int core(acp_agent *a, const char *method, json_t *params, ah_reply_fn cb, ccall *c) {
  return core_with(a, method, params, a->token, cb, c);
}

static void on_core_reply(const ah_outcome *o, void *arg);
static void usage_reply(acp_agent *a, ccall *c, const ah_outcome *o);

/* Fire-and-forget core call (session.cancel, request.respond): the outcome is logged. */
static void fire(acp_agent *a, const char *method, json_t *params) {
  ccall *c = ccall_new(a, CALL_FIRE, NULL, method);
  int rc = c ? core(a, method, params, on_core_reply, c) : AH_ENOMEM;
  if (!c)
    json_decref(params);
  if (rc) {
    if (c)
      ccall_free(c);
    a->api->log(a->m, AH_PLOG_WARN, "%s could not be sent: %s", method, ah_strerror(rc));
  }
}

/* The editor's MCP servers for a session (session/new, session/load, session/resume): handed to the mcp
 * plugin (mcp.attach), which skips a server it cannot run — logging its name and why — and never fails the
 * session; the same list again keeps the servers running. An empty list detaches what an earlier call gave.
 */
static void attach_servers(acp_agent *a, const char *sid, ccall *from) {
  if (!from->mcp)
    return;
  json_t *params = json_pack("{s:s, s:O, s:s?}", "sessionId", sid, "servers", from->mcp, "cwd", from->cwd);
  ccall *c = ccall_new(a, CALL_FIRE, NULL, "mcp.attach");
  int rc = c ? core(a, "mcp.attach", params, on_core_reply, c) : AH_ENOMEM;
  if (!c)
    json_decref(params);
  if (rc) {
    if (c)
      ccall_free(c);
    if (json_array_size(from->mcp) > 0)
      a->api->log(a->m, AH_PLOG_WARN, "session %s: its %zu MCP server(s) are skipped: %s", sid,
                  json_array_size(from->mcp),
                  rc == AH_ENOMETHOD ? "the mcp plugin is not loaded" : ah_strerror(rc));
  }
}

static void notify_update(acp_agent *a, const char *sid, json_t *update) {
  if (!update)
    return;
  if (!a->peer || a->phase == PHASE_CLOSED) {
    json_decref(update);
    return;
  }
  json_t *params = json_pack("{s:s, s:o}", "sessionId", sid, "update", update);
  if (params)
    a->api->rpc->notify(a->peer, "session/update", params);
}

/* ---- options, modes, commands, authentication --------------------------------------------------------- */

/* The core's session options have the shape of ACP's configOptions; the mode option is also given as the
 * older `modes` for clients that read only those (Zed prefers configOptions when both are there). */
static json_t *modes_of(const json_t *options) {
  size_t i, j;
  json_t *o, *c;
  json_array_foreach(options, i, o) {
    if (!str_of(o, "id") || strcmp(str_of(o, "id"), "mode") != 0)
      continue;
    json_t *avail = json_array();
    json_array_foreach(json_object_get(o, "options"), j, c) {
      json_array_append_new(avail, json_pack("{s:O, s:O, s:O*}", "id", json_object_get(c, "value"), "name",
                                             json_object_get(c, "name"), "description",
                                             json_object_get(c, "description")));
    }
    return json_pack("{s:O, s:o}", "currentModeId", json_object_get(o, "currentValue"), "availableModes",
                     avail);
  }
  return NULL;
}

/* configOptions and modes added to a session/new or session/load answer. */
static json_t *with_options(json_t *res, const json_t *options) {
  if (res && json_is_array(options)) {
    json_object_set_new(res, "configOptions", json_deep_copy(options));
    json_t *m = modes_of(options);
    if (m)
      json_object_set_new(res, "modes", m);
  }
  return res;
}

/* The value `id` has in `options`, and its name. */
static const json_t *option_choice(const json_t *options, const char *id) {
  size_t i, j;
  json_t *o, *c;
  json_array_foreach(options, i, o) {
    if (!str_of(o, "id") || strcmp(str_of(o, "id"), id) != 0)
      continue;
    json_array_foreach(json_object_get(o, "options"), j, c) {
      if (json_equal(json_object_get(c, "value"), json_object_get(o, "currentValue")))
        return c;
    }
  }
  return NULL;
}

/* The commands this surface handles itself (a prompt that is "/NAME ARG"): never a turn of the model. */
static const struct {
  const char *name, *description, *hint;
} commands[] = {
    {"mode", "Set what the agent's tools may do without asking", "ask | accept_edits | read_only"},
    {"model", "Set the model of the next turn", "a model the provider offers"},
    {"thinking", "Set how much the model reasons (when the provider offers it)", "a reasoning effort"},
    {"help", "List agenthost's commands", NULL},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void send_commands(acp_agent *a, const char *sid) {
  json_t *list = json_array();
  for (size_t i = 0; i < NCOMMANDS; i++) {
    json_t *c = json_pack("{s:s, s:s}", "name", commands[i].name, "description", commands[i].description);
    if (c && commands[i].hint)
      json_object_set_new(c, "input", json_pack("{s:s}", "hint", commands[i].hint));
    json_array_append_new(list, c);
  }
  notify_update(
      a, sid,
      json_pack("{s:s, s:o}", "sessionUpdate", "available_commands_update", "availableCommands", list));
}

static void fire(acp_agent *a, const char *method, json_t *params);

/* A session this connection now has: its read_file and write_file go through the editor's buffers when the
 * client can read and write them (session.set-editor; docs/protocols/acp.md "The editor's files"). */
static void attach_editor(acp_agent *a, const char *sid) {
  if (!a->fs_read && !a->fs_write && !a->terminal)
    return;
  fire(a, "session.set-editor",
       json_pack("{s:s, s:s?, s:s?, s:s?}", "sessionId", sid, "read", a->fs_read ? "acp.fs-read" : NULL,
                 "write", a->fs_write ? "acp.fs-write" : NULL, "run",
                 a->terminal ? "acp.terminal-run" : NULL));
}

static void say(acp_agent *a, const char *sid, const char *text) {
  notify_update(a, sid,
                json_pack("{s:s, s:{s:s, s:s}}", "sessionUpdate", "agent_message_chunk", "content", "type",
                          "text", "text", text));
}

/* The default provider needs a key it does not have: what the user must do, else NULL. */
static const char *auth_missing(const acp_agent *a) {
  return a->provider && json_is_false(json_object_get(a->provider, "keyReady"))
             ? "authentication required: the provider's API key is not set"
             : NULL;
}

/* initialize's authMethods: the provider's API key, which agenthost reads from its environment or a file
 * (ACP's "agent" method: the agent authenticates itself); none when the provider needs no key. */
static json_t *auth_methods(const acp_agent *a) {
  const char *key = str_of(a->provider, "key");
  if (!key)
    return json_array();
  char desc[300];
  const char *env = str_of(a->provider, "keyEnv");
  if (env)
    snprintf(desc, sizeof desc,
             "agenthost reads the API key of provider %s from the environment variable %s: set it in the "
             "environment the editor starts agenthost with",
             str_of(a->provider, "name"), env);
  else
    snprintf(desc, sizeof desc,
             "agenthost reads the API key of provider %s from its api_key_file: put the key in that file",
             str_of(a->provider, "name"));
  return json_pack("[{s:s, s:s, s:s}]", "id", "agenthost-api-key", "name", "API key", "description", desc);
}

/* ---- prompts ------------------------------------------------------------------------------------------ */

static void prompt_free(prompt *p) {
  json_decref(p->content);
  free(p->message_id);
  free(p);
}

/* Detach and release a prompt that was answered. */
static void prompt_release(prompt *p) {
  if (p->in_call)
    p->orphan = true; /* the receipt callback frees it */
  else
    prompt_free(p);
}

static void prompt_answer_stop(acp_agent *a, prompt *p, const char *stop_reason) {
  if (p->req)
    a->api->rpc->respond(p->req, json_pack("{s:s}", "stopReason", stop_reason));
  p->req = NULL;
}

/* Answer the head with the end of its turn and give the next prompt to the core. */
static void settle_head(acp_agent *a, asession *s, const json_t *ended) {
  prompt *p = s->head;
  if (!p)
    return;
  const char *reason = str_of(ended, "reason");
  const char *stop = acp_codec_stop_reason(reason);
  /* ACP-PROMPT-CANCEL: after session/cancel the answer is `cancelled`, whatever the provider made of it. */
  if (p->cancel_requested)
    stop = "cancelled";
  if (p->req) {
    if (stop) {
      prompt_answer_stop(a, p, stop);
    } else {
      const char *err = str_of(ended, "error");
      json_t *data = json_pack("{s:s}", "reason", reason ? reason : "unknown");
      a->api->rpc->respond_error(p->req, AH_RPC_INTERNAL_ERROR,
                                 err && *err ? err : "the turn ended with an error", data);
      p->req = NULL;
    }
  }
  s->head = p->next;
  if (!s->head)
    s->tail = &s->head;
  prompt_release(p);
  if (s->head)
    send_head(a, s);
  maybe_quiesced(a);
}

/* Mark every prompt waiting behind the head cancelled: they never reach the core, and each is answered
 * `cancelled` when its turn in the queue comes, so the answers keep the order of the requests. */
static void cancel_queued(asession *s) {
  for (prompt *p = s->head ? s->head->next : NULL; p; p = p->next)
    p->cancel_requested = true;
}

/* session/cancel, session/close and the quiesce: queued prompts answered `cancelled`, the running one
 * cancelled in the core (its answer comes with its turn/ended). */
static void cancel_session(acp_agent *a, asession *s) {
  cancel_queued(s);
  prompt *p = s->head;
  if (!p || p->cancel_requested)
    return;
  p->cancel_requested = true;
  fire(a, "session.cancel", json_pack("{s:s}", "sessionId", s->id));
}

static void session_free(asession *s) {
  prompt *p = s->head;
  while (p) {
    prompt *next = p->next;
    prompt_release(p);
    p = next;
  }
  json_decref(s->ended);
  json_decref(s->children);
  acp_codec_state_clear(&s->ctr);
  free(s->delta);
  free(s->id);
  free(s);
}

/* ACP-owned sessions stay in the host's memory while this connection tracks them: their editor settings
 * (session.set-editor) and the replay position live there. session.follow is answered when the session
 * ends (closed elsewhere, lost) or when its token is tripped here (untracked, the connection ends). */
static void follow(acp_agent *a, asession *s) {
  if (a->stopping || a->phase == PHASE_CLOSED || s->follow)
    return;
  ccall *c = ccall_new(a, CALL_FOLLOW, NULL, s->id);
  if (!c || a->api->token_new(a->m, a->token, &c->follow) != 0) {
    if (c)
      ccall_free(c);
    a->api->log(a->m, AH_PLOG_WARN, "%s: not followed (out of memory); it may leave the host's memory",
                s->id);
    return;
  }
  ah_cancel *token = c->follow;
  int rc = core_with(a, "session.follow", json_pack("{s:s}", "sessionId", s->id), token, on_core_reply, c);
  if (rc) {
    a->api->log(a->m, AH_PLOG_WARN, "%s: not followed (%s)", s->id, ah_strerror(rc));
    a->api->token_free(token);
    c->follow = NULL;
    ccall_free(c);
    return;
  }
  s->follow = token;
}

static void unfollow(acp_agent *a, asession *s) {
  if (s->follow)
    a->api->token_trip(s->follow); /* the call answers `cancelled` on a later turn; its token is freed then */
  s->follow = NULL;
}

static void unfollow_all(acp_agent *a) {
  for (asession *s = a->sessions; s; s = s->hh.next)
    unfollow(a, s);
}

/* Stop tracking `s`: every prompt still pending is answered `cancelled`. */
static void untrack(acp_agent *a, asession *s) {
  for (prompt *p = s->head; p; p = p->next)
    prompt_answer_stop(a, p, "cancelled");
  HASH_DEL(a->sessions, s);
  const char *child;
  json_t *v;
  json_object_foreach(s->children, child, v) json_object_del(a->roots, child);
  unfollow(a, s);
  session_free(s);
  maybe_quiesced(a);
}

static asession *track(acp_agent *a, const char *id, int64_t min_seq) {
  asession *s = find_session(a, id);
  if (s)
    return s;
  s = calloc(1, sizeof *s);
  if (!s || !(s->id = strdup(id)) || !(s->ended = json_object()) || !(s->children = json_object())) {
    if (s) {
      json_decref(s->ended);
      free(s->id);
      free(s);
    }
    return NULL;
  }
  s->min_seq = min_seq;
  s->tail = &s->head;
  HASH_ADD_KEYPTR(hh, a->sessions, s->id, strlen(s->id), s);
  follow(a, s);
  return s;
}

static void send_head(acp_agent *a, asession *s) {
  prompt *p = s->head;
  while (p && !p->sent && p->cancel_requested) {
    prompt_answer_stop(a, p, "cancelled");
    s->head = p->next;
    if (!s->head)
      s->tail = &s->head;
    prompt_release(p);
    p = s->head;
  }
  if (!p || p->sent || a->stopping || a->phase == PHASE_CLOSED)
    return;
  p->sent = true;
  ccall *c = ccall_new(a, CALL_PROMPT, NULL, s->id);
  json_t *params = json_pack("{s:s, s:O}", "sessionId", s->id, "content", p->content);
  if (c) {
    c->p = p;
    p->in_call = true;
  }
  int rc = c && params ? core(a, "session.prompt", params, on_core_reply, c) : AH_ENOMEM;
  if (!c || !params)
    json_decref(params);
  if (rc == 0)
    return;
  p->in_call = false;
  if (c)
    ccall_free(c);
  if (p->req)
    respond_status(a, p->req, rc, NULL, true);
  p->req = NULL;
  s->head = p->next;
  if (!s->head)
    s->tail = &s->head;
  prompt_free(p);
  send_head(a, s);
}

/* ---- core call answers -------------------------------------------------------------------------------- */

static void replay_page(acp_agent *a, ccall *c, int64_t after);

static void answer_session_info(acp_agent *a, ccall *c, const ah_outcome *o) {
  json_t *row = json_object_get(o->result, "session");
  if (json_is_true(json_object_get(row, "closed"))) {
    /* A closed session takes no more prompts and is not listed: for ACP it is gone. */
    a->api->rpc->respond_error(c->req, ACP_RESOURCE_NOT_FOUND, "unknown session (it was closed)", NULL);
    return;
  }
  if (!c->replay) {
    /* session/resume: no replay; later events of the session are streamed. */
    json_t *last = json_object_get(row, "lastSeq");
    asession *s = track(a, c->sid, json_is_integer(last) ? json_integer_value(last) : 0);
    if (!s) {
      respond_status(a, c->req, AH_ENOMEM, NULL, false);
      return;
    }
    acp_codec_state_cwd(&s->ctr, str_of(row, "cwd"));
    attach_editor(a, c->sid);
    a->api->rpc->respond(c->req, with_options(json_object(), json_object_get(o->result, "options")));
    send_commands(a, c->sid);
    return;
  }
  /* session/load: page through the history; the ccall lives on across the pages. */
  ccall *h = ccall_new(a, CALL_HISTORY, c->req, c->sid);
  if (!h) {
    respond_status(a, c->req, AH_ENOMEM, NULL, false);
    return;
  }
  c->req = NULL;
  h->options = json_incref(json_object_get(o->result, "options"));
  acp_codec_state_cwd(&h->ctr, str_of(row, "cwd"));
  replay_page(a, h, 0);
}

static void replay_page(acp_agent *a, ccall *h, int64_t after) {
  json_t *params =
      json_pack("{s:s, s:I, s:i}", "sessionId", h->sid, "afterSeq", (json_int_t)after, "limit", HISTORY_PAGE);
  int rc = params ? core(a, "session.history", params, on_core_reply, h) : AH_ENOMEM;
  if (rc) {
    respond_status(a, h->req, rc, NULL, true);
    ccall_free(h);
  }
}

static void history_reply(acp_agent *a, ccall *h, const ah_outcome *o) {
  asession *s = find_session(a, h->sid);
  /* A replay numbers its messages on its own counter (carried across the pages): the live counter of a
   * session already tracked has counted them already. */
  acp_codec_state *ctr = &h->ctr;
  json_t *events = json_object_get(o->result, "events");
  json_t *updates = json_array();
  size_t i = 0;
  json_t *ev = NULL;
  json_array_foreach(events, i, ev) {
    json_t *seq = json_object_get(ev, "seq");
    if (json_is_integer(seq) && json_integer_value(seq) > h->last_seq)
      h->last_seq = json_integer_value(seq);
    if (updates)
      acp_codec_event(ev, true, true, ctr, updates);
  }
  json_t *u = NULL;
  json_array_foreach(updates, i, u) notify_update(a, h->sid, json_incref(u));
  json_decref(updates);
  json_t *next = json_object_get(o->result, "nextAfterSeq");
  if (json_is_integer(next) && json_integer_value(next) > 0 && a->phase != PHASE_CLOSED) {
    /* The next page: a new call with the same record (its count was decremented by the caller). */
    ccall *again = ccall_new(a, CALL_HISTORY, h->req, h->sid);
    if (!again) {
      respond_status(a, h->req, AH_ENOMEM, NULL, false);
      return;
    }
    again->last_seq = h->last_seq;
    again->options = json_incref(h->options);
    acp_codec_state_move(&again->ctr, &h->ctr);
    h->req = NULL;
    replay_page(a, again, json_integer_value(next));
    return;
  }
  if (!s) {
    s = track(a, h->sid, h->last_seq);
    if (s)
      acp_codec_state_move(&s->ctr, &h->ctr); /* the live numbering continues the replayed one */
  }
  if (!s) {
    respond_status(a, h->req, AH_ENOMEM, NULL, false);
    return;
  }
  if (h->last_seq > s->min_seq)
    s->min_seq = h->last_seq;
  attach_editor(a, h->sid);
  a->api->rpc->respond(h->req, with_options(json_object(), h->options));
  send_commands(a, h->sid);
}

static void list_reply(acp_agent *a, ccall *c, const ah_outcome *o) {
  json_t *out = json_array();
  size_t i = 0;
  json_t *row = NULL;
  json_array_foreach(json_object_get(o->result, "sessions"), i, row) {
    const char *id = str_of(row, "id");
    const char *cwd = str_of(row, "cwd");
    /* Root sessions that are still open: subagent sessions belong to their parent's turn, and a closed
     * session takes no more prompts. */
    if (!id || !cwd || !json_is_null(json_object_get(row, "parent")) ||
        json_is_true(json_object_get(row, "closed")) || json_is_true(json_object_get(row, "local")))
      continue;
    if (c->cwd && strcmp(c->cwd, cwd) != 0)
      continue;
    json_t *info = json_pack("{s:s, s:s}", "sessionId", id, "cwd", cwd);
    const char *title = str_of(row, "title");
    const char *updated = str_of(row, "updated");
    if (info && title && *title)
      json_object_set_new(info, "title", json_string(title));
    if (info && updated)
      json_object_set_new(info, "updatedAt", json_string(updated));
    if (info)
      json_array_append_new(out, info);
  }
  json_t *result = json_pack("{s:o}", "sessions", out ? out : json_array());
  const char *next = str_of(o->result, "nextCursor");
  if (result && next)
    json_object_set_new(result, "nextCursor", json_string(next));
  a->api->rpc->respond(c->req, result);
}

static void delete_step(acp_agent *a, ccall *c, call_kind kind, const char *method) {
  ccall *n = ccall_new(a, kind, c->req, c->sid);
  int rc = n ? core(a, method, json_pack("{s:s}", "sessionId", c->sid), on_core_reply, n) : AH_ENOMEM;
  if (rc) {
    if (n)
      ccall_free(n);
    respond_status(a, c->req, rc, NULL, true);
  }
  c->req = NULL;
}

/* A session/delete that failed: the session stays usable. */
static void reopen(acp_agent *a, const char *sid) {
  asession *s = find_session(a, sid);
  if (s)
    s->closing = false;
}

static void prompt_reply(acp_agent *a, ccall *c, const ah_outcome *o) {
  prompt *p = c->p;
  p->in_call = false;
  if (p->orphan) {
    /* Answered and detached while its receipt was outstanding (its session was closed): the core's close
     * cancels what the prompt started. */
    prompt_free(p);
    return;
  }
  asession *s = find_session(a, c->sid);
  if (!s || s->head != p) {
    prompt_answer_stop(a, p, "cancelled");
    prompt_free(p);
    return;
  }
  const char *mid = o->status == 0 ? str_of(o->result, "messageId") : NULL;
  if (!mid) {
    if (p->req)
      respond_status(a, p->req, o->status ? o->status : AH_EINTERNAL,
                     o->status ? o->message : "the prompt receipt has no messageId", true);
    p->req = NULL;
    s->head = p->next;
    if (!s->head)
      s->tail = &s->head;
    prompt_free(p);
    send_head(a, s);
    maybe_quiesced(a);
    return;
  }
  p->message_id = strdup(mid);
  if (!p->message_id) {
    settle_head(a, s, NULL);
    return;
  }
  /* The turn may have ended before the receipt was seen here. */
  json_t *ended = json_object_get(s->ended, mid);
  if (ended) {
    json_incref(ended);
    json_object_del(s->ended, mid);
    settle_head(a, s, ended);
    json_decref(ended);
  }
  json_object_clear(s->ended);
}

static void init_reply(acp_agent *a, ccall *c, const ah_outcome *o);

/* session.set-option answered: for session/set_config_option the full list (the client replaces its
 * state with it), for session/set_mode nothing, for a command a line that says what is set now. */
static void option_reply(acp_agent *a, ccall *c, const ah_outcome *o) {
  json_t *options = json_object_get(o->result, "options");
  if (strcmp(c->answer, "command") == 0) {
    char line[400];
    const json_t *now = o->status ? NULL : option_choice(options, c->option);
    if (o->status)
      snprintf(line, sizeof line, "Not changed: %s", o->message ? o->message : ah_strerror(o->status));
    else
      snprintf(line, sizeof line, "%s is now %s.",
               strcmp(c->option, "mode") == 0    ? "The mode"
               : strcmp(c->option, "model") == 0 ? "The model"
                                                 : "Thinking",
               now && str_of(now, "name") ? str_of(now, "name") : "set");
    say(a, c->sid, line);
    a->api->rpc->respond(c->req, json_pack("{s:s}", "stopReason", "end_turn"));
  } else if (o->status) {
    respond_status(a, c->req, o->status, o->message, true);
  } else if (strcmp(c->answer, "options") == 0) {
    a->api->rpc->respond(c->req, json_pack("{s:O}", "configOptions", options));
  } else {
    a->api->rpc->respond(c->req, json_object());
  }
}

/* session.set-option for session `sid`; `answer` says how the client is answered (option_reply). */
static void set_option(acp_agent *a, ah_rpc_inbound *req, const char *sid, const char *id,
                       const json_t *value, const char *answer) {
  ccall *c = ccall_new(a, CALL_OPTION, req, sid);
  if (c && !(c->option = strdup(id))) {
    ccall_free(c);
    c = NULL;
  }
  if (c)
    c->answer = answer;
  int rc = c ? core(a, "session.set-option",
                    json_pack("{s:s, s:s, s:O}", "sessionId", sid, "configId", id, "value", value),
                    on_core_reply, c)
             : AH_ENOMEM;
  if (rc) {
    if (c)
      ccall_free(c);
    respond_status(a, req, rc, NULL, true);
  }
}

static void on_core_reply(const ah_outcome *o, void *arg) {
  ccall *c = arg;
  acp_agent *a = c->a;
  a->outstanding--;
  if (c->req && a->client_calls > 0)
    a->client_calls--;
  if (o->status && !c->req && c->kind != CALL_PROMPT && !a->stopping &&
      !(c->kind == CALL_FOLLOW && o->status == AH_ECANCELED))
    a->api->log(a->m, AH_PLOG_WARN, "%s failed: %s", c->sid ? c->sid : "core call",
                o->message ? o->message : ah_strerror(o->status));
  switch (c->kind) {
  case CALL_NEW: {
    const char *sid = o->status == 0 ? str_of(o->result, "sessionId") : NULL;
    if (o->status)
      respond_status(a, c->req, o->status, o->message, false);
    else if (!sid || !track(a, sid, 0))
      respond_status(a, c->req, AH_EINTERNAL, "the session could not be created", false);
    else {
      acp_codec_state_cwd(&find_session(a, sid)->ctr, c->cwd);
      attach_servers(a, sid, c);
      attach_editor(a, sid);
      a->api->rpc->respond(
          c->req, with_options(json_pack("{s:s}", "sessionId", sid), json_object_get(o->result, "options")));
      send_commands(a, sid);
    }
    break;
  }
  case CALL_PROMPT:
    prompt_reply(a, c, o);
    break;
  case CALL_FIRE:
    break;
  case CALL_USAGE:
    usage_reply(a, c, o);
    break;
  case CALL_CLOSE: {
    asession *s = find_session(a, c->sid);
    if (o->status) {
      /* Still open (e.g. owned by another process); if the core closed it all the same, its
       * session.closed untracks it. */
      if (s)
        s->closing = false;
      respond_status(a, c->req, o->status, o->message, true);
    } else {
      if (s)
        untrack(a, s); /* the head, if its turn/ended was not seen yet, is answered `cancelled` */
      a->api->rpc->respond(c->req, json_object());
    }
    break;
  }
  case CALL_GET:
    if (o->status)
      respond_status(a, c->req, o->status, o->status == AH_ENOENT ? "unknown session" : o->message, true);
    else {
      attach_servers(a, c->sid, c);
      answer_session_info(a, c, o);
    }
    break;
  case CALL_HISTORY:
    if (o->status)
      respond_status(a, c->req, o->status, o->message, true);
    else
      history_reply(a, c, o);
    break;
  case CALL_LIST:
    if (o->status)
      respond_status(a, c->req, o->status, o->message, false);
    else
      list_reply(a, c, o);
    break;
  case CALL_DEL_GET:
    if (o->status == AH_ENOENT) {
      a->api->rpc->respond(c->req, json_object()); /* deleting what does not exist succeeds (schema) */
    } else if (o->status) {
      reopen(a, c->sid);
      respond_status(a, c->req, o->status, o->message, true);
    } else if (json_is_true(json_object_get(json_object_get(o->result, "session"), "closed"))) {
      delete_step(a, c, CALL_DELETE, "session.delete");
    } else {
      delete_step(a, c, CALL_DEL_CLOSE, "session.close");
    }
    break;
  case CALL_DEL_CLOSE:
    if (o->status) {
      reopen(a, c->sid);
      respond_status(a, c->req, o->status, o->message, true);
    } else
      delete_step(a, c, CALL_DELETE, "session.delete");
    break;
  case CALL_DELETE: {
    asession *s = find_session(a, c->sid);
    if (o->status && o->status != AH_ENOENT) {
      if (s)
        s->closing = false; /* still there: it takes prompts again */
      respond_status(a, c->req, o->status, o->message, true);
    } else {
      if (s)
        untrack(a, s);
      a->api->rpc->respond(c->req, json_object());
    }
    break;
  }
  case CALL_INIT:
    if (o->status) {
      json_object_set_new(c->init, "authMethods", json_array());
      a->api->rpc->respond(c->req, c->init);
      c->init = NULL;
    } else
      init_reply(a, c, o);
    break;
  case CALL_OPTION:
    option_reply(a, c, o);
    break;
  case CALL_FOLLOW: {
    asession *s = find_session(a, c->sid);
    if (s && s->follow == c->follow)
      s->follow = NULL; /* the session ended or was lost: nothing keeps it followed now */
    a->api->token_free(c->follow);
    c->follow = NULL;
    break;
  }
  case CALL_INVALID:
    break;
  }
  ccall_free(c);
  maybe_quiesced(a);
  maybe_finish(a);
}

/* ---- methods ------------------------------------------------------------------------------------------ */

static void m_initialize(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  json_t *version = json_object_get(p, "protocolVersion");
  json_t *caps = json_object_get(p, "clientCapabilities");
  json_t *info = json_object_get(p, "clientInfo");
  if (!json_is_object(p) || !json_is_integer(version)) {
    bad_params(a, req, "params.protocolVersion: an integer is required");
    return;
  }
  if ((caps && !json_is_object(caps) && !json_is_null(caps)) ||
      (info && !json_is_object(info) && !json_is_null(info))) {
    bad_params(a, req, "params: clientCapabilities and clientInfo must be objects");
    return;
  }
  json_t *fs = json_object_get(caps, "fs");
  a->fs_read = json_is_true(json_object_get(fs, "readTextFile"));
  a->fs_write = json_is_true(json_object_get(fs, "writeTextFile"));
  a->terminal = json_is_true(json_object_get(caps, "terminal"));
  /* ACP-HANDSHAKE: this build speaks version 1 only, so 1 is the answer whatever was asked; the client
   * disconnects if it cannot speak it. Capabilities only for what works. */
  json_t *res = json_pack(
      "{s:i, s:{s:b, s:{s:b, s:b, s:b}, s:{s:b, s:b}, s:{s:{}, s:{}, s:{}, s:{}}}, s:[], s:{s:s, s:s, s:s}}",
      "protocolVersion", ACP_PROTOCOL_VERSION, "agentCapabilities", "loadSession", 1, "promptCapabilities",
      "image", 0, "audio", 0, "embeddedContext", 0, "mcpCapabilities", "http",
      AH_HAS(a->api, ah_host_api, http_start), "sse", 0, "sessionCapabilities", "list", "resume", "close",
      "delete", "authMethods", "agentInfo", "name", "agenthost", "title", "agenthost", "version",
      a->api->host_version());
  /* authMethods from the default provider (provider.list): answered when it replied. */
  ccall *c = res ? ccall_new(a, CALL_INIT, req, NULL) : NULL;
  if (c)
    c->init = res;
  int rc = c ? core(a, "provider.list", json_object(), on_core_reply, c) : AH_ENOMEM;
  if (rc) {
    if (c) {
      c->init = NULL;
      ccall_free(c);
    }
    a->api->rpc->respond(req, res);
  }
}

static void init_reply(acp_agent *a, ccall *c, const ah_outcome *o) {
  size_t i;
  json_t *pv;
  json_array_foreach(json_object_get(o->result, "providers"), i, pv) {
    if (json_is_true(json_object_get(pv, "default"))) {
      json_decref(a->provider);
      a->provider = json_incref(pv);
    }
  }
  json_object_set_new(c->init, "authMethods", auth_methods(a));
  a->api->rpc->respond(c->req, c->init);
  c->init = NULL;
}

/* Common checks of session/new, session/load and session/resume: cwd, mcpServers, additionalDirectories. */
static bool check_setup(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  const char *cwd = str_of(p, "cwd");
  json_t *mcp = json_object_get(p, "mcpServers");
  json_t *dirs = json_object_get(p, "additionalDirectories");
  if (!cwd) {
    bad_params(a, req, "params.cwd: an absolute path (string) is required");
    return false;
  }
  if (cwd[0] != '/') {
    bad_params(a, req, "params.cwd: must be an absolute path");
    return false;
  }
  if (mcp && !json_is_array(mcp)) {
    bad_params(a, req, "params.mcpServers: an array is required");
    return false;
  }
  size_t i;
  json_t *srv;
  json_array_foreach(mcp, i, srv) {
    if (!json_is_object(srv) || !json_is_string(json_object_get(srv, "name"))) {
      bad_params(a, req, "params.mcpServers: each server is an object with a name");
      return false;
    }
  }
  if (dirs && !json_is_array(dirs) && !json_is_null(dirs)) {
    bad_params(a, req, "params.additionalDirectories: an array is required");
    return false;
  }
  if (json_array_size(dirs) > 0) {
    bad_params(
        a, req,
        "params.additionalDirectories: not supported (sessionCapabilities.additionalDirectories is not "
        "advertised)");
    return false;
  }
  return true;
}

/* What a session/new or session/load keeps for attach_servers(). */
static bool setup_keep(ccall *c, const json_t *p) {
  json_t *mcp = json_object_get(p, "mcpServers");
  c->mcp = json_is_array(mcp) ? json_deep_copy(mcp) : NULL;
  c->cwd = strdup(str_of(p, "cwd"));
  return c->cwd && (c->mcp || !json_is_array(mcp));
}

static void m_new(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  if (!json_is_object(p)) {
    bad_params(a, req, "params: an object with cwd and mcpServers is required");
    return;
  }
  if (!check_setup(a, req, p))
    return;
  const char *unauthenticated = auth_missing(a);
  if (unauthenticated) {
    a->api->rpc->respond_error(req, ACP_AUTH_REQUIRED, unauthenticated, NULL);
    return;
  }
  ccall *c = ccall_new(a, CALL_NEW, req, NULL);
  if (c && !setup_keep(c, p)) {
    ccall_free(c);
    c = NULL;
  }
  int rc = c ? core(a, "session.create", json_pack("{s:s}", "cwd", str_of(p, "cwd")), on_core_reply, c)
             : AH_ENOMEM;
  if (rc) {
    if (c)
      ccall_free(c);
    respond_status(a, req, rc, NULL, false);
  }
}

/* session/load (replay) and session/resume. */
static void m_load(acp_agent *a, ah_rpc_inbound *req, const json_t *p, bool replay) {
  json_t *sid = json_object_get(p, "sessionId");
  if (!json_is_object(p) || !json_is_string(sid)) {
    bad_params(a, req, "params.sessionId: a string is required");
    return;
  }
  if (!check_setup(a, req, p))
    return;
  ccall *c = ccall_new(a, CALL_GET, req, json_string_value(sid));
  if (c && !setup_keep(c, p)) {
    ccall_free(c);
    c = NULL;
  }
  if (c)
    c->replay = replay;
  int rc = c ? core(a, "session.get", json_pack("{s:O}", "sessionId", sid), on_core_reply, c) : AH_ENOMEM;
  if (rc) {
    if (c)
      ccall_free(c);
    respond_status(a, req, rc, NULL, true);
  }
}

static void m_list(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  json_t *cursor = json_is_object(p) ? json_object_get(p, "cursor") : NULL;
  json_t *cwd = json_is_object(p) ? json_object_get(p, "cwd") : NULL;
  if (p && !json_is_object(p) && !json_is_null(p)) {
    bad_params(a, req, "params: an object is required");
    return;
  }
  if ((cursor && !json_is_string(cursor) && !json_is_null(cursor)) ||
      (cwd && !json_is_string(cwd) && !json_is_null(cwd))) {
    bad_params(a, req, "params: cursor and cwd must be strings");
    return;
  }
  if (json_is_string(cwd) && json_string_value(cwd)[0] != '/') {
    bad_params(a, req, "params.cwd: must be an absolute path");
    return;
  }
  ccall *c = ccall_new(a, CALL_LIST, req, NULL);
  if (c && json_is_string(cwd) && !(c->cwd = strdup(json_string_value(cwd)))) {
    ccall_free(c);
    c = NULL;
  }
  json_t *params = json_pack("{s:i}", "limit", LIST_PAGE);
  if (params && json_is_string(cursor))
    json_object_set(params, "cursor", cursor);
  int rc = c && params ? core(a, "session.list", params, on_core_reply, c) : AH_ENOMEM;
  if (!c || !params)
    json_decref(params);
  if (rc) {
    if (c)
      ccall_free(c);
    respond_status(a, req, rc, NULL, false);
  }
}

static bool slash_command(acp_agent *a, ah_rpc_inbound *req, asession *s, const json_t *blocks);

static void m_prompt(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  json_t *sid = json_object_get(p, "sessionId");
  if (!json_is_object(p) || !json_is_string(sid)) {
    bad_params(a, req, "params.sessionId: a string is required");
    return;
  }
  char why[256] = "";
  json_t *content = acp_codec_prompt(json_object_get(p, "prompt"), why, sizeof why);
  if (!content) {
    bad_params(a, req, why);
    return;
  }
  asession *s = find_session(a, json_string_value(sid));
  if (!s) {
    json_decref(content);
    unknown_session(a, req);
    return;
  }
  if (s->closing) {
    json_decref(content);
    respond_status(a, req, AH_ECLOSED, "the session is being closed", true);
    return;
  }
  if (slash_command(a, req, s, json_object_get(p, "prompt"))) {
    json_decref(content);
    return;
  }
  prompt *np = calloc(1, sizeof *np);
  if (!np) {
    json_decref(content);
    respond_status(a, req, AH_ENOMEM, NULL, false);
    return;
  }
  np->req = req;
  np->content = content;
  *s->tail = np;
  s->tail = &np->next;
  send_head(a, s);
}

/* session/set_config_option {sessionId, configId, value} → {configOptions}: every option after the change;
 * a value the option does not offer → -32602 naming it. */
static void m_set_config_option(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  const char *sid = str_of(p, "sessionId");
  const char *id = str_of(p, "configId");
  json_t *value = json_object_get(p, "value");
  if (!sid || !id) {
    bad_params(a, req, "params: sessionId and configId (strings) are required");
    return;
  }
  if (!json_is_string(value)) {
    bad_params(a, req, "params.value: a value id (string) is required: the session has no boolean options");
    return;
  }
  if (!find_session(a, sid)) {
    unknown_session(a, req);
    return;
  }
  set_option(a, req, sid, id, value, "options");
}

/* session/set_mode {sessionId, modeId} → {}: the mode option, for clients that use modes. */
static void m_set_mode(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  const char *sid = str_of(p, "sessionId");
  json_t *mode = json_object_get(p, "modeId");
  if (!sid || !json_is_string(mode)) {
    bad_params(a, req, "params: sessionId and modeId (strings) are required");
    return;
  }
  if (!find_session(a, sid)) {
    unknown_session(a, req);
    return;
  }
  set_option(a, req, sid, "mode", mode, "mode");
}

/* A prompt that is one text block "/NAME ARG" naming one of the commands: handled here (true), never a
 * turn of the model. Other text that starts with '/' goes to the model as written. */
static bool slash_command(acp_agent *a, ah_rpc_inbound *req, asession *s, const json_t *blocks) {
  const json_t *b = json_array_size(blocks) == 1 ? json_array_get(blocks, 0) : NULL;
  const char *type = str_of(b, "type");
  const char *text = str_of(b, "text");
  if (!type || strcmp(type, "text") != 0 || !text || text[0] != '/')
    return false;
  size_t n = strcspn(text + 1, " \t\r\n");
  size_t which = NCOMMANDS;
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strlen(commands[i].name) == n && strncmp(text + 1, commands[i].name, n) == 0)
      which = i;
  if (which == NCOMMANDS)
    return false;
  const char *arg = text + 1 + n;
  arg += strspn(arg, " \t\r\n");
  size_t len = strlen(arg);
  while (len && strchr(" \t\r\n", arg[len - 1]))
    len--;
  const char *name = commands[which].name;
  if (strcmp(name, "help") == 0 || len == 0) {
    char help[1024] = "";
    size_t at = 0;
    for (size_t i = 0; i < NCOMMANDS && at < sizeof help; i++)
      at += (size_t)snprintf(help + at, sizeof help - at, "/%s%s%s — %s\n", commands[i].name,
                             commands[i].hint ? " " : "", commands[i].hint ? commands[i].hint : "",
                             commands[i].description);
    say(a, s->id, help);
    a->api->rpc->respond(req, json_pack("{s:s}", "stopReason", "end_turn"));
    return true;
  }
  json_t *value = json_stringn(arg, len);
  const char *id = strcmp(name, "thinking") == 0 ? "thought_level" : name;
  if (value)
    set_option(a, req, s->id, id, value, "command");
  else
    respond_status(a, req, AH_EINVAL, "params.prompt: the command's argument is not valid UTF-8", true);
  json_decref(value);
  return true;
}

static void m_close(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  const char *sid = json_is_object(p) ? str_of(p, "sessionId") : NULL;
  if (!sid) {
    bad_params(a, req, "params.sessionId: a string is required");
    return;
  }
  asession *s = find_session(a, sid);
  if (!s) {
    unknown_session(a, req);
    return;
  }
  s->closing = true;
  cancel_session(a, s);
  ccall *c = ccall_new(a, CALL_CLOSE, req, sid);
  int rc = c ? core(a, "session.close", json_pack("{s:s}", "sessionId", sid), on_core_reply, c) : AH_ENOMEM;
  if (rc) {
    if (c)
      ccall_free(c);
    s->closing = false;
    respond_status(a, req, rc, NULL, true);
  }
}

static void m_delete(acp_agent *a, ah_rpc_inbound *req, const json_t *p) {
  const char *sid = json_is_object(p) ? str_of(p, "sessionId") : NULL;
  if (!sid) {
    bad_params(a, req, "params.sessionId: a string is required");
    return;
  }
  asession *s = find_session(a, sid);
  if (s) {
    s->closing = true;
    cancel_session(a, s);
  }
  ccall *c = ccall_new(a, CALL_DEL_GET, req, sid);
  int rc = c ? core(a, "session.get", json_pack("{s:s}", "sessionId", sid), on_core_reply, c) : AH_ENOMEM;
  if (rc) {
    if (c)
      ccall_free(c);
    respond_status(a, req, rc, NULL, true);
  }
}

static void on_request(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *data) {
  (void)peer;
  acp_agent *a = data;
  if (a->phase != PHASE_SERVING) {
    a->api->rpc->respond_error(req, AH_RPC_INVALID_REQUEST, "the agent is shutting down", NULL);
    return;
  }
  /* Requests before `initialize` are served as usual: ACP has no error code for "not initialized", and
   * every client initializes first. */
  if (strcmp(method, "initialize") == 0)
    m_initialize(a, req, params);
  else if (strcmp(method, "authenticate") == 0) {
    /* The key is the host's to read (the "agent" method): authenticated when the provider has it. */
    const char *unauthenticated = auth_missing(a);
    if (unauthenticated)
      a->api->rpc->respond_error(req, ACP_AUTH_REQUIRED, unauthenticated, NULL);
    else
      a->api->rpc->respond(req, json_object());
  } else if (strcmp(method, "session/set_config_option") == 0)
    m_set_config_option(a, req, params);
  else if (strcmp(method, "session/set_mode") == 0)
    m_set_mode(a, req, params);
  else if (strcmp(method, "session/new") == 0)
    m_new(a, req, params);
  else if (strcmp(method, "session/load") == 0)
    m_load(a, req, params, true);
  else if (strcmp(method, "session/resume") == 0)
    m_load(a, req, params, false);
  else if (strcmp(method, "session/list") == 0)
    m_list(a, req, params);
  else if (strcmp(method, "session/prompt") == 0)
    m_prompt(a, req, params);
  else if (strcmp(method, "session/close") == 0)
    m_close(a, req, params);
  else if (strcmp(method, "session/delete") == 0)
    m_delete(a, req, params);
  else
    a->api->rpc->respond_error(req, AH_RPC_METHOD_NOT_FOUND, "method not found", NULL);
}

static void on_notification(ah_rpc_peer *peer, const char *method, const json_t *params, void *data) {
  (void)peer;
  acp_agent *a = data;
  if (strcmp(method, "session/cancel") == 0) {
    /* ACP-PROMPT-CANCEL: an unknown or foreign session id is ignored. */
    asession *s = find_session(a, json_is_object(params) ? str_of(params, "sessionId") : NULL);
    if (s)
      cancel_session(a, s);
    return;
  }
  a->api->log(a->m, AH_PLOG_DEBUG, "ignored notification %s", method);
}

/* ---- server requests ---------------------------------------------------------------------------------- */

static const char *const option_ids[] = {"allow_once", "allow_always", "reject_once", "reject_always"};
static const char *const option_names[] = {"Allow once", "Always allow", "Reject once", "Always reject"};

static void on_permission(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                          void *arg) {
  (void)peer;
  perm *r = arg;
  acp_agent *a = r->a;
  a->outstanding--;
  /* ACP-OUTPUT-PERMISSION: only a selected option among ours grants; `cancelled`, an unknown option, a
   * malformed answer or an error deny. A closed peer (stop) leaves the request to the core's own cancel. */
  json_t *outcome = json_object_get(result, "outcome");
  const char *kind = str_of(outcome, "outcome");
  const char *option = str_of(outcome, "optionId");
  const char *chosen = NULL;
  const char *answer = NULL;
  bool selected = status == 0 && kind && strcmp(kind, "selected") == 0 && option;
  for (size_t i = 0; selected && !r->answers && i < 4; i++)
    if (strcmp(option, option_ids[i]) == 0)
      chosen = option_ids[i];
  if (selected && r->answers && strncmp(option, "answer/", 7) == 0) {
    char *end = NULL;
    unsigned long i = strtoul(option + 7, &end, 10);
    if (end && *end == '\0' && end != option + 7 && i < json_array_size(r->answers))
      answer = json_string_value(json_array_get(r->answers, i));
  }
  if (status != AH_ECLOSED && !a->stopping) {
    json_t *params = NULL;
    if (chosen)
      params = json_pack("{s:s, s:{s:s}}", "id", r->request_id, "value", "optionId", chosen);
    else if (answer)
      params = json_pack("{s:s, s:{s:s}}", "id", r->request_id, "value", "answer", answer);
    else
      params = json_pack("{s:s, s:{s:s, s:O?}}", "id", r->request_id, "error", "message",
                         status == AH_EPROTO                      ? "the client answered with an error"
                         : kind && strcmp(kind, "cancelled") == 0 ? "cancelled by the client"
                                                                  : "no valid option selected",
                         "clientError", status == AH_EPROTO ? error : NULL);
    fire(a, "request.respond", params);
  }
  json_decref(r->answers);
  free(r->request_id);
  free(r);
  maybe_finish(a);
}

/* The kind of an answer shown as a permission option: ACP has only allow/reject kinds, so a label that
 * reads as a refusal is a reject, anything else an allow ("always" makes it the lasting variant). */
static const char *answer_kind(const char *label) {
  static const char *const no[] = {"reject", "deny", "no", "cancel", "decline", "refuse", "don't", "never"};
  bool always = strcasestr(label, "always") != NULL;
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
    if (strncasecmp(label, no[i], strlen(no[i])) == 0)
      return always ? "reject_always" : "reject_once";
  return always ? "allow_always" : "allow_once";
}

#define MAX_QUESTION_OPTIONS 16

/* A question with 1..16 string options as a session/request_permission (*answers: the labels), or NULL. */
static json_t *question_request(const json_t *request, const char *sid, json_t **answers) {
  const json_t *opts = json_object_get(request, "options");
  const char *question = str_of(json_object_get(request, "params"), "question");
  size_t n = json_array_size(opts);
  if (n == 0 || n > MAX_QUESTION_OPTIONS)
    return NULL;
  json_t *options = json_array();
  json_t *labels = json_array();
  for (size_t i = 0; options && labels && i < n; i++) {
    const char *label = json_string_value(json_array_get(opts, i));
    if (!label) {
      json_decref(options);
      json_decref(labels);
      return NULL;
    }
    char oid[32];
    snprintf(oid, sizeof oid, "answer/%zu", i);
    json_array_append_new(
        options, json_pack("{s:s, s:s, s:s}", "optionId", oid, "name", label, "kind", answer_kind(label)));
    json_array_append_new(labels, json_string(label));
  }
  char call_id[192];
  snprintf(call_id, sizeof call_id, "question/%s", str_of(request, "id") ? str_of(request, "id") : "?");
  json_t *msg = json_pack("{s:s, s:{s:s, s:s, s:s, s:s}, s:o}", "sessionId", sid, "toolCall", "toolCallId",
                          call_id, "title", question && *question ? question : "a question", "kind", "other",
                          "status", "pending", "options", options);
  if (!msg) {
    json_decref(labels);
    return NULL;
  }
  *answers = labels;
  return msg;
}

static void forward_request(acp_agent *a, const json_t *request) {
  const char *kind = str_of(request, "kind");
  const char *id = str_of(request, "id");
  /* Approvals of a subagent's tools are asked in the name of the session the client knows: nobody else
   * would answer them, and the parent's turn waits for the subagent. */
  asession *root = find_root(a, str_of(request, "sessionId"));
  const char *sid = root ? root->id : NULL;
  if (!kind || !id || !root)
    return;
  json_t *msg = NULL;
  json_t *answers = NULL;
  if (strcmp(kind, "approval") != 0) {
    /* A question with options (an ACP child agent's own permission request, say) is asked as a
     * request_permission whose options are the answers; a free-text question has no ACP request and is
     * answered `cancelled` at once rather than left waiting for a client that cannot answer it. */
    msg = question_request(request, sid, &answers);
    if (!msg) {
      fire(a, "request.respond",
           json_pack("{s:s, s:{s:s}}", "id", id, "error", "message",
                     "free-text questions are not supported over ACP"));
      return;
    }
  } else {
    json_t *params = json_object_get(request, "params");
    const char *tool = str_of(params, "tool");
    json_t *args = json_object_get(params, "args");
    char call_id[192];
    acp_codec_tool_call_id(call_id, sizeof call_id, str_of(request, "turnId"), str_of(params, "callId"));
    char *title = acp_codec_tool_title(tool, args);
    json_t *options = json_array();
    for (size_t i = 0; options && i < 4; i++)
      json_array_append_new(options, json_pack("{s:s, s:s, s:s}", "optionId", option_ids[i], "name",
                                               option_names[i], "kind", option_ids[i]));
    msg = json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:O}, s:o}", "sessionId", sid, "toolCall", "toolCallId",
                    call_id, "title", title ? title : "tool", "kind", acp_codec_tool_kind(tool, NULL),
                    "status", "pending", "rawInput", args ? args : json_null(), "options", options);
    free(title);
  }
  perm *r = calloc(1, sizeof *r);
  if (!msg || !r || !(r->request_id = strdup(id))) {
    json_decref(msg);
    json_decref(answers);
    free(r);
    a->api->log(a->m, AH_PLOG_ERROR, "cannot forward request %s: out of memory", id);
    return;
  }
  r->a = a;
  r->answers = answers;
  int rc = a->api->rpc->request(a->peer, "session/request_permission", msg, on_permission, r, NULL);
  if (rc) {
    json_decref(r->answers);
    free(r->request_id);
    free(r);
    a->api->log(a->m, AH_PLOG_WARN, "cannot send request %s: %s", id, ah_strerror(rc));
    return;
  }
  a->outstanding++;
}

/* ---- the editor's files (fs/read_text_file, fs/write_text_file) ------------------------------------------
 */

typedef struct fsreq {
  acp_agent *a;
  ah_call *call;
  bool write;
} fsreq;

static void on_fs_answer(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                         void *arg) {
  (void)peer;
  fsreq *f = arg;
  acp_agent *a = f->a;
  a->outstanding--;
  json_t *content = json_object_get(result, "content");
  if (status == 0 && f->write) {
    a->api->call_reply(f->call, json_object());
  } else if (status == 0 && json_is_string(content)) {
    a->api->call_reply(f->call, json_pack("{s:O}", "content", content));
  } else if (status == 0) {
    a->api->call_error(f->call, AH_EPROTO, "the editor answered without a text content", NULL);
  } else {
    /* The client's own message is what the model reads (e.g. "file not found"). */
    const char *msg = str_of(error, "message");
    a->api->call_error(f->call, status == AH_ECLOSED ? AH_ECLOSED : AH_EIO,
                       msg                    ? msg
                       : status == AH_ECLOSED ? "the editor's connection is closed"
                                              : "the editor answered with an error",
                       NULL);
  }
  free(f);
  maybe_finish(a);
}

/* acp.fs-read {sessionId, path} → {content}; acp.fs-write {sessionId, path, content} → {}: the core's
 * read_file and write_file of a session of this connection (the path already confined by the core). */
static void fs_call(ah_call *call, const json_t *params, acp_agent *a, bool write) {
  const char *sid = str_of(params, "sessionId");
  const char *path = str_of(params, "path");
  json_t *content = json_object_get(params, "content");
  asession *s = find_session(a, sid);
  if (!s || !path || (write && !json_is_string(content)) || !a->peer || a->phase != PHASE_SERVING ||
      !(write ? a->fs_write : a->fs_read)) {
    a->api->call_error(call, AH_EUNAVAILABLE, "the editor does not have this session open", NULL);
    return;
  }
  json_t *msg =
      json_pack("{s:s, s:s, s:O?}", "sessionId", sid, "path", path, "content", write ? content : NULL);
  fsreq *f = calloc(1, sizeof *f);
  int rc = msg && f ? 0 : AH_ENOMEM;
  if (f) {
    f->a = a;
    f->call = call;
    f->write = write;
  }
  if (!rc)
    rc = a->api->rpc->request(a->peer, write ? "fs/write_text_file" : "fs/read_text_file", msg, on_fs_answer,
                              f, NULL);
  else
    json_decref(msg);
  if (rc) {
    free(f);
    a->api->call_error(call, rc, ah_strerror(rc), NULL);
    return;
  }
  a->outstanding++;
}

static void m_fs_read(ah_call *call, const json_t *params, void *data) {
  fs_call(call, params, data, false);
}

static void m_fs_write(ah_call *call, const json_t *params, void *data) {
  fs_call(call, params, data, true);
}

/* ---- the editor's terminal (terminal/create → wait_for_exit → output → release) -------------------------
 */

typedef enum term_step { TERM_CREATE, TERM_WAIT, TERM_OUTPUT, TERM_RELEASE } term_step;

/* One run_command in the client's terminal. */
typedef struct term {
  acp_agent *a;
  ah_call *call;
  char *sid;
  char *terminal_id;
  char tool_call_id[160]; /* the call that shows it ("" when the core did not say) */
  ah_cancel_watch *watch;
  ah_timer *timer;
  term_step step;
  bool timed_out, killed;
  json_t *exit;   /* wait_for_exit's answer */
  json_t *output; /* output's answer */
  char *error;
} term;

static void term_send(term *t, const char *method, json_t *params);

static void term_finish(term *t) {
  acp_agent *a = t->a;
  if (t->watch)
    a->api->token_unwatch(t->watch);
  if (t->timer)
    a->api->timer_stop(t->timer);
  if (t->error) {
    a->api->call_error(t->call, AH_EIO, t->error, NULL);
  } else {
    json_t *code = json_object_get(t->exit, "exitCode");
    json_t *sig = json_object_get(t->exit, "signal");
    json_t *out = json_object_get(t->output, "output");
    a->api->call_reply(t->call, json_pack("{s:O, s:O, s:O, s:b, s:b, s:s}", "exitCode",
                                          code ? code : json_null(), "signal", sig ? sig : json_null(),
                                          "output", json_is_string(out) ? out : json_string(""), "truncated",
                                          json_is_true(json_object_get(t->output, "truncated")), "timedOut",
                                          t->timed_out, "terminalId", t->terminal_id));
  }
  json_decref(t->exit);
  json_decref(t->output);
  free(t->error);
  free(t->terminal_id);
  free(t->sid);
  free(t);
  maybe_finish(a);
}

/* Kill the command (the turn was cancelled, or its time is up): wait_for_exit then answers. */
static void term_kill(term *t) {
  if (t->killed || !t->terminal_id || t->step != TERM_WAIT)
    return;
  t->killed = true;
  term_send(t, "terminal/kill", NULL);
}

static void term_cancelled(ah_cancel *token, void *arg) {
  (void)token;
  term *t = arg;
  t->watch = NULL; /* a fired watch is gone */
  term_kill(t);
}

static void term_timeout(ah_timer *timer, void *arg) {
  (void)timer;
  term *t = arg;
  t->timer = NULL; /* a one-shot timer is freed after its callback */
  t->timed_out = true;
  term_kill(t);
}

static void on_term_answer(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                           void *arg) {
  (void)peer;
  term *t = arg;
  acp_agent *a = t->a;
  a->outstanding--;
  const char *msg = str_of(error, "message");
  if (status && !t->error)
    if (asprintf(&t->error, "the editor's terminal: %s", msg ? msg : ah_strerror(status)) < 0)
      t->error = NULL;
  if (status && t->step != TERM_RELEASE && t->step != TERM_CREATE && t->terminal_id && status != AH_ECLOSED) {
    t->step = TERM_RELEASE; /* a failed step: release what was created */
    term_send(t, "terminal/release", NULL);
    return;
  }
  if (status) {
    term_finish(t);
    return;
  }
  switch (t->step) {
  case TERM_CREATE: {
    const char *id = str_of(result, "terminalId");
    if (!id || !(t->terminal_id = strdup(id))) {
      free(t->error);
      t->error = strdup("the editor's terminal: terminal/create answered without a terminalId");
      term_finish(t);
      return;
    }
    t->step = TERM_WAIT;
    if (t->tool_call_id[0])
      notify_update(a, t->sid,
                    json_pack("{s:s, s:s, s:s, s:[{s:s, s:s}]}", "sessionUpdate", "tool_call_update",
                              "toolCallId", t->tool_call_id, "status", "in_progress", "content", "type",
                              "terminal", "terminalId", t->terminal_id));
    term_send(t, "terminal/wait_for_exit", NULL);
    if (a->api->token_tripped(a->api->call_cancel_token(t->call)))
      term_kill(t);
    break;
  }
  case TERM_WAIT:
    t->exit = json_deep_copy(result);
    t->step = TERM_OUTPUT;
    term_send(t, "terminal/output", NULL);
    break;
  case TERM_OUTPUT:
    t->output = json_deep_copy(result);
    t->step = TERM_RELEASE;
    term_send(t, "terminal/release", NULL);
    break;
  case TERM_RELEASE:
    term_finish(t);
    break;
  }
}

/* A request of the terminal's flow; params gets sessionId and terminalId. The step's answer goes on. A
 * kill's answer only counts down (wait_for_exit answers for it). */
static void on_kill_answer(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error,
                           void *arg) {
  (void)peer;
  (void)status;
  (void)result;
  (void)error;
  acp_agent *a = arg;
  a->outstanding--;
  maybe_finish(a);
}

static void term_send(term *t, const char *method, json_t *params) {
  acp_agent *a = t->a;
  if (!params)
    params = json_object();
  json_object_set_new(params, "sessionId", json_string(t->sid));
  if (t->terminal_id)
    json_object_set_new(params, "terminalId", json_string(t->terminal_id));
  bool kill = strcmp(method, "terminal/kill") == 0;
  int rc = a->peer ? a->api->rpc->request(a->peer, method, params, kill ? on_kill_answer : on_term_answer,
                                          kill ? (void *)a : (void *)t, NULL)
                   : AH_ECLOSED;
  if (!a->peer)
    json_decref(params);
  if (rc == 0) {
    a->outstanding++;
    return;
  }
  if (kill)
    return;
  if (!t->error &&
      asprintf(&t->error, "the editor's terminal: %s could not be sent: %s", method, ah_strerror(rc)) < 0)
    t->error = NULL;
  term_finish(t);
}

/* acp.terminal-run {sessionId, turnId?, callId?, command, cwd, timeoutMs} → {exitCode, signal, output,
 * truncated, timedOut, terminalId}: the core's run_command of a session of this connection, in the
 * client's terminal (`/bin/sh -c COMMAND` in the session's cwd), shown live in the tool call. */
static void m_terminal_run(ah_call *call, const json_t *params, void *data) {
  acp_agent *a = data;
  const char *sid = str_of(params, "sessionId");
  const char *command = str_of(params, "command");
  const char *cwd = str_of(params, "cwd");
  json_t *timeout = json_object_get(params, "timeoutMs");
  if (!find_session(a, sid) || !command || !cwd || !a->peer || a->phase != PHASE_SERVING || !a->terminal) {
    a->api->call_error(call, AH_EUNAVAILABLE, "the editor does not have this session open", NULL);
    return;
  }
  term *t = calloc(1, sizeof *t);
  if (!t || !(t->sid = strdup(sid))) {
    free(t);
    a->api->call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  t->a = a;
  t->call = call;
  t->step = TERM_CREATE;
  ah_cancel *token = a->api->call_cancel_token(call);
  if (token && a->api->token_watch(token, term_cancelled, t, &t->watch) != 0)
    t->watch = NULL; /* already tripped: the create's answer kills it */
  if (json_is_integer(timeout) && json_integer_value(timeout) > 0)
    (void)a->api->timer_start(a->m, (uint64_t)json_integer_value(timeout), 0, term_timeout, t, &t->timer);
  /* The call shows the terminal while it runs (Zed embeds it). */
  const char *turn = str_of(params, "turnId");
  const char *callid = str_of(params, "callId");
  if (turn && callid)
    acp_codec_tool_call_id(t->tool_call_id, sizeof t->tool_call_id, turn, callid);
  term_send(t, "terminal/create",
            json_pack("{s:s, s:[s, s], s:s, s:I}", "command", "/bin/sh", "args", "-c", command, "cwd", cwd,
                      "outputByteLimit", (json_int_t)(256 * 1024)));
}

/* ---- events ------------------------------------------------------------------------------------------- */

/* stream_deltas: the text streamed in the current turn and not yet matched by a commit. Deltas are
 * published at once while stored events wait for their commit, so a turn's deltas may run ahead of the
 * commits of earlier messages (a tool result): a commit is matched against this buffer, not against
 * "the last deltas". Streamed text carries the message id "<turnId>/s<k>". */
static void delta_reset(asession *s, const char *turn) {
  free(s->delta);
  s->delta = NULL;
  s->stream_k = 0;
  snprintf(s->delta_turn, sizeof s->delta_turn, "%s", turn ? turn : "-");
}

static void stream_id(const asession *s, char *buf, size_t n) {
  snprintf(buf, n, "%s/s%d", s->delta_turn, s->stream_k);
}

static void on_delta(acp_agent *a, const json_t *data) {
  asession *s = find_session(a, str_of(data, "sessionId"));
  const char *text = str_of(data, "text");
  const char *turn = str_of(data, "turnId");
  if (!s || !text || !*text)
    return;
  if (strncmp(s->delta_turn, turn ? turn : "-", sizeof s->delta_turn - 1) != 0)
    delta_reset(s, turn);
  size_t old = s->delta ? strlen(s->delta) : 0, add = strlen(text);
  char *grown = realloc(s->delta, old + add + 1);
  if (grown) {
    memcpy(grown + old, text, add + 1);
    s->delta = grown;
  }
  char mid[192];
  stream_id(s, mid, sizeof mid);
  notify_update(a, s->id, acp_codec_text_chunk("agent_message_chunk", text, mid));
}

/* A tool's progress (session.progress, e.g. an MCP server's notifications/progress): the running tool call's
 * content shows "progress[/total]: message". */
static void on_progress(acp_agent *a, const json_t *data) {
  asession *s = find_session(a, str_of(data, "sessionId"));
  const char *turn = str_of(data, "turnId"), *call = str_of(data, "callId"), *msg = str_of(data, "message");
  json_t *progress = json_object_get(data, "progress"), *total = json_object_get(data, "total");
  if (!s || !turn || !call || !json_is_number(progress))
    return;
  char id[192], text[512];
  acp_codec_tool_call_id(id, sizeof id, turn, call);
  const char *output = str_of(data, "output");
  if (output) { /* run_command's output so far (its tail): the call's content while it runs */
    notify_update(a, s->id,
                  json_pack("{s:s, s:s, s:s, s:[{s:s, s:{s:s, s:s}}]}", "sessionUpdate", "tool_call_update",
                            "toolCallId", id, "status", "in_progress", "content", "type", "content",
                            "content", "type", "text", "text", output));
    return;
  }
  int n = json_is_number(total)
              ? snprintf(text, sizeof text, "%g/%g", json_number_value(progress), json_number_value(total))
              : snprintf(text, sizeof text, "%g", json_number_value(progress));
  if (msg && n > 0 && (size_t)n < sizeof text)
    snprintf(text + n, sizeof text - (size_t)n, ": %s", msg);
  notify_update(a, s->id,
                json_pack("{s:s, s:s, s:s, s:[{s:s, s:{s:s, s:s}}]}", "sessionUpdate", "tool_call_update",
                          "toolCallId", id, "status", "in_progress", "content", "type", "content", "content",
                          "type", "text", "text", text));
}

/* stream_deltas: a committed message whose text was streamed is not repeated (what the deltas missed is
 * sent as one more chunk of the same message); a commit that was not streamed (a directive's result) is
 * sent whole. */
static void committed_after_deltas(acp_agent *a, asession *s, const json_t *ev) {
  const char *text = str_of(json_object_get(ev, "data"), "text");
  const char *turn = str_of(ev, "turnId");
  char mid[192];
  acp_codec_message_id(&s->ctr, turn, mid, sizeof mid);
  s->ctr.n++;
  if (!text)
    return;
  bool same_turn = strncmp(s->delta_turn, turn ? turn : "-", sizeof s->delta_turn - 1) == 0;
  const char *streamed = same_turn && s->delta ? s->delta : "";
  size_t n = strlen(streamed), t = strlen(text);
  if (n > 0 && strncmp(text, streamed, n) == 0) {
    if (text[n]) {
      stream_id(s, mid, sizeof mid);
      notify_update(a, s->id, acp_codec_text_chunk("agent_message_chunk", text + n, mid));
    }
    free(s->delta);
    s->delta = NULL;
    s->stream_k++;
  } else if (n > t && t > 0 && strncmp(streamed, text, t) == 0) {
    memmove(s->delta, s->delta + t, n - t + 1); /* the rest belongs to a later message */
    s->stream_k++;
  } else {
    notify_update(a, s->id, acp_codec_text_chunk("agent_message_chunk", text, mid));
  }
}

static void turn_event_settled(acp_agent *a, asession *s, const json_t *ev);

/* Start session.get for the cost of `update` (a usage_update) at the turn's end `ev`; false when it could
 * not be asked (the update is then sent as it is). */
static bool usage_with_cost(acp_agent *a, asession *s, const json_t *update, const json_t *ev) {
  ccall *c = ccall_new(a, CALL_USAGE, NULL, s->id);
  if (!c)
    return false;
  c->update = json_deep_copy(update);
  c->ended = json_deep_copy(ev);
  if (!c->update || !c->ended ||
      core(a, "session.get", json_pack("{s:s}", "sessionId", s->id), on_core_reply, c)) {
    ccall_free(c);
    return false;
  }
  return true;
}

/* ACP's Cost is {amount: number, currency}: the core's exact decimal, as a JSON number at this edge only. */
static void usage_reply(acp_agent *a, ccall *c, const ah_outcome *o) {
  json_t *cost = o->status == 0 ? json_object_get(json_object_get(o->result, "session"), "cost") : NULL;
  const char *amount = str_of(cost, "amount"), *currency = str_of(cost, "currency");
  if (amount && currency && !json_object_get(cost, "unpricedItems"))
    json_object_set_new(c->update, "cost",
                        json_pack("{s:f, s:s}", "amount", strtod(amount, NULL), "currency", currency));
  asession *s = find_session(a, c->sid);
  if (!s)
    return;
  notify_update(a, s->id, json_incref(c->update));
  turn_event_settled(a, s, c->ended);
}

static void on_session_event(acp_agent *a, const json_t *data) {
  asession *s = find_session(a, str_of(data, "sessionId"));
  json_t *ev = json_object_get(data, "event");
  if (!s || !json_is_object(ev))
    return;
  json_t *seq = json_object_get(ev, "seq");
  if (json_is_integer(seq) && json_integer_value(seq) <= s->min_seq)
    return;
  const char *kind = str_of(ev, "kind");
  if (!kind)
    return;
  if (strcmp(kind, "message/committed") == 0 && a->stream_deltas) {
    committed_after_deltas(a, s, ev);
  } else {
    json_t *updates = json_array();
    if (updates) {
      acp_codec_event(ev, false, true, &s->ctr, updates);
      size_t i = 0;
      json_t *u = NULL;
      json_array_foreach(updates, i, u) {
        /* The meter of a turn's end carries the session's cost, which the core computes (session.get):
         * the update, and the turn's end after it, wait for that answer. */
        if (strcmp(kind, "turn/ended") == 0 && strcmp(str_of(u, "sessionUpdate"), "usage_update") == 0 &&
            usage_with_cost(a, s, u, ev)) {
          json_decref(updates);
          return;
        }
        notify_update(a, s->id, json_incref(u));
      }
      json_decref(updates);
    }
  }
  turn_event_settled(a, s, ev);
}

/* What an event means for the prompt queue, once its updates were sent. */
static void turn_event_settled(acp_agent *a, asession *s, const json_t *ev) {
  const char *kind = str_of(ev, "kind");
  const char *mid = str_of(ev, "messageId");
  prompt *head = s->head;
  if (strcmp(kind, "turn/started") == 0 && head && head->cancel_requested && mid && head->message_id &&
      strcmp(mid, head->message_id) == 0) {
    /* The cancel arrived before the turn was claimed: the core had nothing to cancel then. */
    fire(a, "session.cancel", json_pack("{s:s}", "sessionId", s->id));
  } else if (strcmp(kind, "turn/ended") == 0 && mid && head && head->sent) {
    if (head->message_id && strcmp(mid, head->message_id) == 0)
      settle_head(a, s, json_object_get(ev, "data"));
    else if (!head->message_id)
      json_object_set(s->ended, mid, json_object_get(ev, "data"));
  }
}

static void on_event(const char *name, const json_t *data, void *arg) {
  acp_agent *a = arg;
  if (!a->peer || a->phase == PHASE_CLOSED)
    return;
  if (strcmp(name, "session.event") == 0) {
    on_session_event(a, data);
  } else if (strcmp(name, "session.delta") == 0) {
    if (a->stream_deltas)
      on_delta(a, data);
  } else if (strcmp(name, "session.progress") == 0) {
    on_progress(a, data);
  } else if (strcmp(name, "request.pending") == 0) {
    forward_request(a, json_object_get(data, "request"));
  } else if (strcmp(name, "subagent.started") == 0) {
    asession *root = find_root(a, str_of(data, "parentSessionId"));
    const char *child = str_of(data, "sessionId");
    if (root && child && strcmp(child, root->id) != 0) {
      json_object_set_new(root->children, child, json_true());
      json_object_set_new(a->roots, child, json_string(root->id));
    }
  } else if (strcmp(name, "session.updated") == 0) {
    /* A title from the first prompt, or a rename from another surface: the editor's history list. */
    asession *s = find_session(a, str_of(data, "sessionId"));
    const char *title = str_of(data, "title");
    if (s && !s->closing && title)
      notify_update(a, s->id,
                    json_pack("{s:s, s:s, s:s*}", "sessionUpdate", "session_info_update", "title", title,
                              "updatedAt", str_of(data, "updated")));
  } else if (strcmp(name, "session.options") == 0) {
    /* The model, mode or effort changed (here, in the web UI, through Remote): the selectors follow. */
    asession *s = find_session(a, str_of(data, "sessionId"));
    const json_t *options = json_object_get(data, "options");
    if (s && !s->closing && json_is_array(options)) {
      notify_update(
          a, s->id,
          json_pack("{s:s, s:O}", "sessionUpdate", "config_option_update", "configOptions", options));
      const json_t *mode = option_choice(options, "mode");
      const char *changed = str_of(data, "changed");
      if (mode && changed && strcmp(changed, "mode") == 0)
        notify_update(a, s->id,
                      json_pack("{s:s, s:O}", "sessionUpdate", "current_mode_update", "currentModeId",
                                json_object_get(mode, "value")));
    }
  } else if (strcmp(name, "session.closed") == 0) {
    asession *s = find_session(a, str_of(data, "sessionId"));
    if (s && !s->closing)
      untrack(a, s); /* closed by another surface: its prompts end `cancelled` */
  }
}

/* ---- quiesce, close, stop ----------------------------------------------------------------------------- */

static void unsubscribe_all(acp_agent *a) {
  if (a->sub)
    a->api->unsubscribe(a->sub);
  a->sub = NULL;
}

static void stop_quiesce_timer(acp_agent *a) {
  if (a->quiesce_timer)
    a->api->timer_stop(a->quiesce_timer);
  a->quiesce_timer = NULL;
}

static void peer_closed(ah_rpc_peer *peer, void *arg) {
  (void)peer;
  acp_agent *a = arg;
  a->peer_closed = true;
  a->peer = NULL;
  /* ACP-QUIESCE: every answer is flushed; only now is the host asked to stop. */
  if (!a->stopping)
    a->api->host_stop(a->m, 0);
  maybe_finish(a);
}

static void close_peer(acp_agent *a) {
  if (a->phase == PHASE_CLOSED)
    return;
  a->phase = PHASE_CLOSED;
  stop_quiesce_timer(a);
  unsubscribe_all(a);
  unfollow_all(a);
  if (!a->peer || a->api->rpc->close(a->peer, peer_closed, a) != 0) {
    a->peer_closed = true;
    a->peer = NULL;
    if (!a->stopping)
      a->api->host_stop(a->m, 0);
  }
}

static bool prompts_pending(const acp_agent *a) {
  for (const asession *s = a->sessions; s; s = s->hh.next)
    for (const prompt *p = s->head; p; p = p->next)
      if (p->req)
        return true;
  return false;
}

static void maybe_quiesced(acp_agent *a) {
  if (a->phase != PHASE_QUIESCING || prompts_pending(a) || a->client_calls > 0)
    return;
  close_peer(a);
}

static void answer_all_cancelled(acp_agent *a) {
  for (asession *s = a->sessions; s; s = s->hh.next)
    for (prompt *p = s->head; p; p = p->next)
      prompt_answer_stop(a, p, "cancelled");
}

static void quiesce_deadline(ah_timer *t, void *arg) {
  (void)t;
  acp_agent *a = arg;
  a->quiesce_timer = NULL;
  a->api->log(a->m, AH_PLOG_WARN, "quiesce: turns still running after %d ms; their prompts answer cancelled",
              QUIESCE_WAIT_MS);
  answer_all_cancelled(a);
  close_peer(a);
}

static void on_eof(ah_rpc_peer *peer, int status, void *data) {
  (void)peer;
  acp_agent *a = data;
  if (status)
    a->api->log(a->m, AH_PLOG_WARN, "stdin failed: %s", ah_strerror(status));
  if (a->phase != PHASE_SERVING)
    return;
  /* ACP-QUIESCE: stop admission, cancel this connection's turns, settle every prompt (each answers with its
   * turn's end, `cancelled`), then close the peer and stop the host. Sessions of other surfaces are never
   * touched; this connection's sessions stay open in the store (session/load finds them again). */
  a->phase = PHASE_QUIESCING;
  for (asession *s = a->sessions; s; s = s->hh.next)
    cancel_session(a, s);
  if (prompts_pending(a) || a->client_calls > 0) {
    if (a->api->timer_start(a->m, QUIESCE_WAIT_MS, 0, quiesce_deadline, a, &a->quiesce_timer) != 0) {
      answer_all_cancelled(a);
      close_peer(a);
    }
    return;
  }
  close_peer(a);
}

static void on_log(ah_rpc_peer *peer, const char *msg, void *data) {
  (void)peer;
  acp_agent *a = data;
  a->api->log(a->m, AH_PLOG_WARN, "%s", msg);
}

static void agent_free(acp_agent *a) {
  asession *s, *tmp;
  HASH_ITER(hh, a->sessions, s, tmp) {
    HASH_DEL(a->sessions, s);
    session_free(s);
  }
  json_decref(a->roots);
  json_decref(a->provider);
  free(a);
}

static void maybe_finish(acp_agent *a) {
  if (!a->stopping || a->finished || !a->peer_closed || a->outstanding)
    return;
  a->finished = true;
  void (*done)(void *) = a->done;
  void *arg = a->done_arg;
  if (a->token)
    a->api->token_free(a->token);
  agent_free(a);
  done(arg);
}

void acp_agent_stop(acp_agent *a, void (*done)(void *arg), void *arg) {
  a->stopping = true;
  a->done = done;
  a->done_arg = arg;
  /* The host stops the sessions after the plugins: the turns still running end `cancelled` then, so their
   * prompts are answered `cancelled` now, before the peer closes. */
  answer_all_cancelled(a);
  close_peer(a);
  a->api->token_trip(a->token); /* core calls in flight are answered `cancelled` */
  maybe_finish(a);
}

/* A boolean config value: JSON true/false or the strings "true"/"false" (INI values are strings). */
static int parse_bool(const json_t *v, bool *out) {
  if (!v) {
    *out = false;
    return 0;
  }
  if (json_is_boolean(v)) {
    *out = json_is_true(v);
    return 0;
  }
  const char *t = json_string_value(v);
  if (t && (strcmp(t, "true") == 0 || strcmp(t, "false") == 0)) {
    *out = strcmp(t, "true") == 0;
    return 0;
  }
  return AH_EINVAL;
}

int acp_agent_start(ah_mount *m, const ah_host_api *api, const json_t *config, acp_agent **out) {
  *out = NULL;
  if (!AH_HAS(api, ah_host_api, stdio_rpc) || !AH_HAS(api, ah_host_api, host_stop))
    return AH_EABI;
  bool stream_deltas = false;
  if (parse_bool(json_object_get(config, "stream_deltas"), &stream_deltas) != 0) {
    api->log(m, AH_PLOG_ERROR, "stream_deltas: true or false is required");
    return AH_ECONFIG;
  }
  acp_agent *a = calloc(1, sizeof *a);
  if (!a)
    return AH_ENOMEM;
  a->m = m;
  a->api = api;
  a->stream_deltas = stream_deltas;
  a->phase = PHASE_SERVING;
  if (!(a->roots = json_object())) {
    free(a);
    return AH_ENOMEM;
  }
  /* One subscription for everything: delivery is ordered per subscriber, so updates keep the order in which
   * the core emitted the events. */
  int rc = api->token_new(m, NULL, &a->token);
  if (rc == 0)
    rc = api->subscribe(m, "*", on_event, a, &a->sub);
  /* Privileged: only the core calls them, for the sessions of this connection. */
  const ah_method_def fs_methods[] = {
      {.struct_size = sizeof(ah_method_def),
       .name = "acp.fs-read",
       .handler = m_fs_read,
       .flags = AH_METHOD_PRIVILEGED,
       .data = a},
      {.struct_size = sizeof(ah_method_def),
       .name = "acp.fs-write",
       .handler = m_fs_write,
       .flags = AH_METHOD_PRIVILEGED,
       .data = a},
  };
  for (size_t i = 0; rc == 0 && i < 2; i++)
    rc = api->register_method(m, &fs_methods[i]);
  const ah_method_def run = {.struct_size = sizeof run,
                             .name = "acp.terminal-run",
                             .handler = m_terminal_run,
                             .flags = AH_METHOD_PRIVILEGED | AH_METHOD_CANCELLABLE,
                             .data = a};
  if (rc == 0)
    rc = api->register_method(m, &run);
  if (rc == 0) {
    ah_rpc_opts opts = {.struct_size = sizeof opts,
                        .on_request = on_request,
                        .on_notification = on_notification,
                        .on_eof = on_eof,
                        .on_log = on_log,
                        .data = a};
    rc = api->stdio_rpc(m, config, &opts, &a->peer);
  }
  if (rc) {
    unsubscribe_all(a);
    if (a->token)
      api->token_free(a->token);
    agent_free(a);
    return rc;
  }
  *out = a;
  return 0;
}
