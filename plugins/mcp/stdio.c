/* agenthost mcp plugin — the stdio transport: the server is a child spawned through the host's process
 * service (environment: the host's allowlist plus the server's own `env`; its own process group; stderr
 * lines on the host's log) and spoken to with the host's JSON-RPC peer, one message per line, at most
 * MCP_MAX_MESSAGE bytes. Closing: stdin EOF once what was written is flushed, SIGTERM to the group after
 * MCP_EOF_GRACE_MS, SIGKILL MCP_KILL_GRACE_MS later; done once the exit was observed and the peer closed. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "mcp.h"

typedef struct pending {
  struct pending *next;
  mcp_server *s;
  int64_t id;
  mcp_reply_fn cb;
  void *arg;
} pending;

typedef struct stdio_t {
  ah_process *proc;
  int pid;
  ah_rpc_peer *peer;
  bool peer_closing;
  bool closing;
  ah_timer *grace;
  pending *pending;
} stdio_t;

#define API(s) ((s)->pl->api)
#define T(s) ((stdio_t *)(s)->t)

static void maybe_closed(mcp_server *s) {
  stdio_t *t = T(s);
  if (t->proc || t->peer || t->grace)
    return;
  free(t);
  s->t = NULL;
  mcp_server_closed(s);
}

static void on_response(ah_rpc_peer *peer, int status, const json_t *result, const json_t *error, void *arg) {
  (void)peer;
  pending *p = arg;
  mcp_server *s = p->s;
  stdio_t *t = T(s);
  for (pending **pp = &t->pending; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      break;
    }
  const char *msg = status == AH_ECLOSED ? "the server's connection closed before it answered" : NULL;
  p->cb(s, status, result, error, msg, p->arg);
  free(p);
}

static void on_request(ah_rpc_peer *peer, ah_rpc_inbound *req, const char *method, const json_t *params,
                       void *data) {
  (void)peer;
  mcp_server_message(data, method, params, req);
}

static void on_notification(ah_rpc_peer *peer, const char *method, const json_t *params, void *data) {
  (void)peer;
  mcp_server_message(data, method, params, NULL);
}

static void on_eof(ah_rpc_peer *peer, int status, void *data) {
  (void)peer;
  (void)status;
  mcp_server *s = data;
  if (!T(s)->closing)
    mcp_server_lost(s, "it closed its standard output");
}

static void on_rpc_log(ah_rpc_peer *peer, const char *msg, void *data) {
  (void)peer;
  mcp_server *s = data;
  mcp_log(s->pl, AH_PLOG_WARN, "[mcp.%s] %s", s->name, msg);
}

static void on_peer_closed(ah_rpc_peer *peer, void *arg) {
  (void)peer;
  mcp_server *s = arg;
  stdio_t *t = T(s);
  t->peer = NULL;
  if (t->proc && t->closing)
    API(s)->process_close_stdin(t->proc); /* what was written is flushed: now EOF */
  maybe_closed(s);
}

static void peer_close(mcp_server *s) {
  stdio_t *t = T(s);
  if (!t->peer || t->peer_closing)
    return;
  t->peer_closing = true;
  if (API(s)->rpc->close(t->peer, on_peer_closed, s) != 0)
    t->peer = NULL;
}

static void on_exit_cb(ah_process *proc, int64_t status, int sig, void *arg) {
  (void)proc;
  mcp_server *s = arg;
  stdio_t *t = T(s);
  if (t->grace) {
    API(s)->timer_stop(t->grace);
    t->grace = NULL;
  }
  /* What of its group outlived it is not left behind. */
  if (t->pid > 0 && kill(-t->pid, 0) == 0)
    kill(-t->pid, SIGKILL);
  bool was_closing = t->closing;
  t->closing = true;
  peer_close(s); /* the pipes go after this callback */
  t->proc = NULL;
  if (!was_closing) {
    char why[96];
    snprintf(why, sizeof why, "it exited (%s %d)", sig ? "signal" : "status", sig ? sig : (int)status);
    mcp_server_lost(s, why); /* its close is a no-op now: the transport is already closing */
  }
  maybe_closed(s);
}

static char **strv_from(const json_t *arr, const char *first) {
  size_t n = json_array_size(arr);
  char **v = calloc(n + 2, sizeof *v);
  if (!v)
    return NULL;
  size_t k = 0;
  if (first)
    v[k++] = (char *)first;
  size_t i;
  json_t *x;
  json_array_foreach(arr, i, x) v[k++] = (char *)json_string_value(x);
  return v;
}

static int s_open(mcp_server *s, char **why) {
  stdio_t *t = calloc(1, sizeof *t);
  if (!t)
    return AH_ENOMEM;
  s->t = t;
  const char *command = json_string_value(json_object_get(s->conf, "command"));
  char **args = strv_from(json_object_get(s->conf, "args"), command);
  json_t *env = json_object_get(s->conf, "env");
  char **envv = calloc(json_object_size(env) + 1, sizeof *envv);
  size_t k = 0;
  const char *key;
  json_t *val;
  json_object_foreach(env, key, val) {
    if (envv && asprintf(&envv[k], "%s=%s", key, json_string_value(val)) >= 0)
      k++;
  }
  ah_process_opts po = {
      .struct_size = sizeof po,
      .file = command,
      .args = (const char *const *)args,
      .env = (const char *const *)envv,
      .cwd = json_string_value(json_object_get(s->conf, "cwd")),
      .pipe_stdin = true,
      .pipe_stdout = true,
      .on_exit = on_exit_cb,
      .arg = s,
      .stderr_to_log = true,
      .log_tag = s->name,
  };
  int rc = args && envv ? API(s)->spawn(s->pl->m, &po, &t->proc) : AH_ENOMEM;
  free(args);
  for (size_t i = 0; envv && i < k; i++)
    free(envv[i]);
  free(envv);
  if (rc) {
    *why = mcp_fmt("cannot start %s: %s", command, rc == AH_ENOENT ? "no such program" : ah_strerror(rc));
    free(t);
    s->t = NULL;
    return rc;
  }
  t->pid = API(s)->process_pid(t->proc);
  ah_rpc_opts ro = {.struct_size = sizeof ro,
                    .max_line = MCP_MAX_MESSAGE,
                    .on_request = on_request,
                    .on_notification = on_notification,
                    .on_eof = on_eof,
                    .on_log = on_rpc_log,
                    .data = s};
  rc = API(s)->rpc->open(API(s)->process_stdout(t->proc), API(s)->process_stdin(t->proc), &ro, &t->peer);
  if (rc) {
    *why = mcp_fmt("cannot talk to %s: %s", command, ah_strerror(rc));
    t->closing = true;
    API(s)->process_kill(t->proc, 0);
    return rc; /* on_exit will free the transport and report closed */
  }
  return 0;
}

static int s_request(mcp_server *s, const char *method, json_t *params, mcp_reply_fn cb, void *arg,
                     int64_t *id) {
  stdio_t *t = T(s);
  if (!t || !t->peer || t->peer_closing) {
    json_decref(params);
    return AH_ECLOSED;
  }
  pending *p = calloc(1, sizeof *p);
  if (!p) {
    json_decref(params);
    return AH_ENOMEM;
  }
  p->s = s;
  p->cb = cb;
  p->arg = arg;
  int rc = API(s)->rpc->request(t->peer, method, params, on_response, p, &p->id);
  if (rc) {
    free(p);
    return rc;
  }
  p->next = t->pending;
  t->pending = p;
  if (id)
    *id = p->id;
  return 0;
}

static void s_forget(mcp_server *s, int64_t id) {
  stdio_t *t = T(s);
  for (pending **pp = t ? &t->pending : NULL; pp && *pp; pp = &(*pp)->next)
    if ((*pp)->id == id) {
      pending *p = *pp;
      if (t->peer && API(s)->rpc->forget(t->peer, id) != 0)
        return; /* already being answered: its callback still runs */
      *pp = p->next;
      free(p);
      return;
    }
}

static int s_notify(mcp_server *s, const char *method, json_t *params) {
  stdio_t *t = T(s);
  if (!t || !t->peer || t->peer_closing) {
    json_decref(params);
    return AH_ECLOSED;
  }
  return API(s)->rpc->notify(t->peer, method, params);
}

static void s_respond(mcp_server *s, void *inbound, json_t *result, int code, const char *message) {
  if (code)
    API(s)->rpc->respond_error(inbound, code, message, NULL);
  else
    API(s)->rpc->respond(inbound, result);
}

static void on_grace(ah_timer *timer, void *arg) {
  (void)timer;
  mcp_server *s = arg;
  stdio_t *t = T(s);
  t->grace = NULL;
  if (t->proc) {
    API(s)->process_close_stdin(t->proc); /* in case the flush never ended */
    API(s)->process_kill(t->proc, MCP_KILL_GRACE_MS);
  }
  maybe_closed(s);
}

static void s_close(mcp_server *s) {
  stdio_t *t = T(s);
  if (t->closing)
    return;
  t->closing = true;
  peer_close(s);
  if (t->proc && API(s)->timer_start(s->pl->m, MCP_EOF_GRACE_MS, 0, on_grace, s, &t->grace) != 0) {
    t->grace = NULL;
    API(s)->process_kill(t->proc, MCP_KILL_GRACE_MS);
  }
  maybe_closed(s);
}

const mcp_transport mcp_stdio_transport = {
    .open = s_open,
    .request = s_request,
    .forget = s_forget,
    .notify = s_notify,
    .respond = s_respond,
    .close = s_close,
};
