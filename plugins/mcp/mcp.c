/* agenthost mcp plugin — MCP servers' tools for the agent: the tool source "mcp__" (ABI 1.6).
 *
 * Host-wide servers come from `[mcp.NAME]` (this plugin's config key `servers`); a client attaches servers
 * to one session with `mcp.attach` (the acp plugin does it for an editor's mcpServers). A session sees the
 * host-wide servers and its own. Tool names are mcp__SERVER__TOOL, each part sanitised to [A-Za-z0-9_-]; a
 * name longer than 64 bytes is cut and ends in a hash of the whole, so that it stays unique; two servers
 * giving one name is a warning, and the second is left out — never a silent overwrite. Names are derived
 * again at every list and call from the servers in a fixed order (host-wide by name, then the session's in
 * the order given), so a call finds the tool the list offered.
 *
 * Methods: mcp.attach {sessionId, servers, cwd?} → {attached: [name], skipped: [{name, reason}]};
 * mcp.detach {sessionId} → {detached: n}; mcp.status → {servers: [{name, sessionId?, state, protocol?,
 * tools, error?}]} (all privileged). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envname.h"
#include "mcp.h"

/* ---- the servers a session sees ----------------------------------------------------------------------- */

static int by_name(const void *a, const void *b) {
  return strcmp((*(mcp_server *const *)a)->name, (*(mcp_server *const *)b)->name);
}

/* Host-wide by name, then the session's in attach order (the list is newest first). Returns a malloc'ed
 * array (NULL-terminated). */
static mcp_server **visible(mcp_plugin *pl, const char *session_id) {
  size_t n = 0;
  for (mcp_server *s = pl->servers; s; s = s->next)
    n++;
  mcp_server **v = calloc(n + 1, sizeof *v);
  if (!v)
    return NULL;
  size_t k = 0;
  for (mcp_server *s = pl->servers; s; s = s->next)
    if (!s->session_id && !s->removed)
      v[k++] = s;
  qsort(v, k, sizeof *v, by_name);
  size_t first = k;
  for (mcp_server *s = pl->servers; s; s = s->next)
    if (s->session_id && session_id && !s->removed && strcmp(s->session_id, session_id) == 0)
      v[k++] = s;
  for (size_t i = first, j = k ? k - 1 : 0; i < j; i++, j--) { /* attach order */
    mcp_server *x = v[i];
    v[i] = v[j];
    v[j] = x;
  }
  return v;
}

/* The tools of `v` with their full names; `notices` (may be NULL) gets the collisions. Calls `fn` for each
 * tool kept: stop by returning true. */
typedef bool (*each_fn)(mcp_server *s, const json_t *tool, const char *full, void *arg);

static void each_tool(mcp_plugin *pl, mcp_server **v, bool log_collisions, each_fn fn, void *arg) {
  json_t *seen = json_object(); /* full → server name */
  for (size_t i = 0; v[i]; i++) {
    size_t j;
    json_t *t;
    json_array_foreach(v[i]->tools, j, t) {
      char full[MCP_NAME_MAX + 1];
      mcp_full_name(v[i]->name, json_string_value(json_object_get(t, "tool")), full);
      json_t *other = json_object_get(seen, full);
      if (other) {
        if (log_collisions)
          mcp_log(pl, AH_PLOG_WARN,
                  "tool name %s: given by servers %s and %s; the one of %s is left out (rename a server)",
                  full, json_string_value(other), v[i]->name, v[i]->name);
        continue;
      }
      json_object_set_new(seen, full, json_string(v[i]->name));
      if (fn(v[i], t, full, arg)) {
        json_decref(seen);
        return;
      }
    }
  }
  json_decref(seen);
}

/* ---- list -----------------------------------------------------------------------------------------------
 */

typedef struct lister {
  mcp_plugin *pl;
  ah_call *call;
  char *session_id;
  mcp_server **v;
  size_t waiting;
  json_t *notices;
  ah_cancel_watch *watch;
  bool answered;
} lister;

static bool add_listed(mcp_server *s, const json_t *tool, const char *full, void *arg) {
  json_array_append_new(arg, json_pack("{s:s, s:O, s:O, s:s, s:O*}", "name", full, "description",
                                       json_object_get(tool, "description"), "schema",
                                       json_object_get(tool, "schema"), "group", s->name, "kind",
                                       json_object_get(tool, "kind")));
  return false;
}

static void lister_free(lister *l) {
  free(l->v);
  free(l->session_id);
  json_decref(l->notices);
  free(l);
}

static void lister_done(lister *l) {
  if (l->watch)
    l->pl->api->token_unwatch(l->watch);
  l->watch = NULL;
  mcp_server **v = visible(l->pl, l->session_id); /* the servers may have changed meanwhile */
  json_t *tools = json_array();
  if (v) {
    size_t k = 0;
    for (size_t i = 0; v[i]; i++)
      if (v[i]->state == MCP_READY)
        v[k++] = v[i];
    v[k] = NULL;
    each_tool(l->pl, v, true, add_listed, tools);
  }
  free(v);
  l->pl->api->call_reply(l->call, json_pack("{s:o, s:O}", "tools", tools, "notices", l->notices));
  lister_free(l);
}

static void server_ready(mcp_server *s, int status, const char *message, void *arg) {
  lister *l = arg;
  if (status)
    json_array_append_new(l->notices, json_string(message ? message : s->name));
  if (--l->waiting == 0)
    lister_done(l);
}

static void list_cancelled(ah_cancel *token, void *arg) {
  (void)token;
  lister *l = arg;
  l->watch = NULL;
  for (size_t i = 0; l->v[i]; i++)
    mcp_server_unwait(l->v[i], server_ready, l);
  l->pl->api->call_error(l->call, AH_ECANCELED, "cancelled", NULL);
  lister_free(l);
}

static void src_list(ah_call *call, const json_t *params, void *data) {
  mcp_plugin *pl = data;
  const char *sid = json_string_value(json_object_get(params, "sessionId"));
  lister *l = calloc(1, sizeof *l);
  if (!l || !(l->v = visible(pl, sid)) || !(l->notices = json_array()) ||
      (sid && !(l->session_id = strdup(sid)))) {
    if (l)
      lister_free(l);
    pl->api->call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  l->pl = pl;
  l->call = call;
  for (size_t i = 0; l->v[i]; i++)
    l->waiting++;
  if (l->waiting == 0) {
    lister_done(l);
    return;
  }
  ah_cancel *tok = pl->api->call_cancel_token(call);
  if (tok && pl->api->token_watch(tok, list_cancelled, l, &l->watch) != 0) {
    pl->api->call_error(call, AH_ECANCELED, "cancelled", NULL);
    lister_free(l);
    return;
  }
  /* Each answers at once (ready, or refused during a backoff) or later; the last one answers the list. One
   * extra count while they are asked, so that an answer at once does not end the list early. */
  l->waiting++;
  size_t n = 0;
  while (l->v[n])
    n++;
  for (size_t i = 0; i < n; i++)
    mcp_server_ensure(l->v[i], server_ready, l);
  if (--l->waiting == 0)
    lister_done(l);
}

/* ---- call -----------------------------------------------------------------------------------------------
 */

typedef struct finder {
  const char *want;
  mcp_server *s;
  const char *tool;
} finder;

static bool find_tool(mcp_server *s, const json_t *tool, const char *full, void *arg) {
  finder *f = arg;
  if (strcmp(full, f->want) != 0)
    return false;
  f->s = s;
  f->tool = json_string_value(json_object_get(tool, "tool"));
  return true;
}

static void src_call(ah_call *call, const json_t *params, void *data) {
  mcp_plugin *pl = data;
  const char *name = json_string_value(json_object_get(params, "tool"));
  mcp_server **v = visible(pl, json_string_value(json_object_get(params, "sessionId")));
  finder f = {.want = name ? name : ""};
  if (v)
    each_tool(pl, v, false, find_tool, &f);
  free(v);
  if (!f.s) {
    char *msg = mcp_fmt("no MCP server of this session offers %s (any more)", f.want);
    pl->api->call_error(call, AH_ENOENT, msg ? msg : "no such tool", NULL);
    free(msg);
    return;
  }
  mcp_server_call(f.s, call, f.tool, json_object_get(params, "arguments"));
}

/* ---- configuration ------------------------------------------------------------------------------------ */

/* ---- attach / detach ---------------------------------------------------------------------------------- */

static void detach_session(mcp_plugin *pl, const char *sid, const json_t *keep, size_t *count) {
  bool again = true;
  while (again) { /* a removal may free the server: start over after each */
    again = false;
    for (mcp_server *s = pl->servers; s; s = s->next) {
      if (s->removed || !s->session_id || strcmp(s->session_id, sid) != 0)
        continue;
      if (keep && json_equal(json_object_get(keep, s->name), s->conf))
        continue;
      if (count)
        (*count)++;
      mcp_server_remove(s, "detached from the session");
      again = true;
      break;
    }
  }
}

static void m_attach(ah_call *call, const json_t *params, void *data) {
  mcp_plugin *pl = data;
  const char *sid = json_string_value(json_object_get(params, "sessionId"));
  json_t *servers = json_object_get(params, "servers");
  json_t *cwd = json_object_get(params, "cwd");
  if (!sid || !json_is_array(servers) ||
      (cwd && (!json_is_string(cwd) || json_string_value(cwd)[0] != '/'))) {
    pl->api->call_error(call, AH_EINVAL, "params: sessionId, servers (an array) and cwd? (absolute)", NULL);
    return;
  }
  json_t *attached = json_array(), *skipped = json_array(), *wanted = json_object();
  size_t i;
  json_t *raw;
  json_array_foreach(servers, i, raw) {
    const char *name = json_string_value(json_object_get(raw, "name"));
    char *why = NULL;
    bool skip = false;
    json_t *conf = name && *name ? mcp_normalize(raw, &skip, &why) : NULL;
    if (!name || !*name)
      why = mcp_fmt("a server needs a name");
    else if (conf && json_object_get(wanted, name))
      why = mcp_fmt("a second server named %s", name);
    if (!conf || why) {
      if (!skip) {
        mcp_log(pl, AH_PLOG_WARN, "session %s: MCP server %s skipped: %s", sid, name ? name : "(no name)",
                why);
        json_array_append_new(skipped,
                              json_pack("{s:s, s:s}", "name", name ? name : "", "reason", why ? why : "?"));
      }
      free(why);
      json_decref(conf);
      continue;
    }
    if (cwd && json_object_get(conf, "command") && !json_object_get(conf, "cwd"))
      json_object_set(conf, "cwd", cwd);
    json_object_set_new(wanted, name, conf);
  }
  /* Servers already attached with the same configuration keep running (session/load with the same list). */
  detach_session(pl, sid, wanted, NULL);
  const char *name;
  json_t *conf;
  json_object_foreach(wanted, name, conf) {
    bool running = false;
    for (mcp_server *s = pl->servers; s; s = s->next)
      running |=
          !s->removed && s->session_id && strcmp(s->session_id, sid) == 0 && strcmp(s->name, name) == 0;
    char *why = NULL;
    if (!running && !mcp_server_new(pl, name, sid, conf, &why)) {
      json_array_append_new(skipped, json_pack("{s:s, s:s}", "name", name, "reason", why ? why : "?"));
      free(why);
      continue;
    }
    json_array_append_new(attached, json_string(name));
  }
  json_decref(wanted);
  pl->api->tools_changed(pl->m, sid);
  pl->api->call_reply(call, json_pack("{s:o, s:o}", "attached", attached, "skipped", skipped));
}

static void m_detach(ah_call *call, const json_t *params, void *data) {
  mcp_plugin *pl = data;
  const char *sid = json_string_value(json_object_get(params, "sessionId"));
  if (!sid) {
    pl->api->call_error(call, AH_EINVAL, "params: sessionId", NULL);
    return;
  }
  size_t n = 0;
  detach_session(pl, sid, NULL, &n);
  if (n)
    pl->api->tools_changed(pl->m, sid);
  pl->api->call_reply(call, json_pack("{s:I}", "detached", (json_int_t)n));
}

static void m_status(ah_call *call, const json_t *params, void *data) {
  (void)params;
  mcp_plugin *pl = data;
  static const char *const names[] = {"idle", "starting", "ready", "closing"};
  json_t *out = json_array();
  for (mcp_server *s = pl->servers; s; s = s->next) {
    if (s->removed)
      continue;
    json_t *o = json_pack("{s:s, s:s, s:s, s:I}", "name", s->name, "transport",
                          json_object_get(s->conf, "url") ? "http" : "stdio", "state", names[s->state],
                          "tools", (json_int_t)json_array_size(s->tools));
    if (s->session_id)
      json_object_set_new(o, "sessionId", json_string(s->session_id));
    if (s->protocol[0])
      json_object_set_new(o, "protocol", json_string(s->protocol));
    if (s->error)
      json_object_set_new(o, "error", json_string(s->error));
    json_array_append_new(out, o);
  }
  pl->api->call_reply(call, json_pack("{s:o}", "servers", out));
}

static void on_session_closed(const char *name, const json_t *data, void *arg) {
  (void)name;
  const char *sid = json_string_value(json_object_get(data, "sessionId"));
  if (sid)
    detach_session(arg, sid, NULL, NULL);
}

void mcp_plugin_tools_changed(mcp_plugin *pl, mcp_server *s) {
  pl->api->tools_changed(pl->m, s->session_id);
}

/* ---- mount / withdraw --------------------------------------------------------------------------------- */

void mcp_plugin_server_gone(mcp_plugin *pl) {
  if (pl->withdrawing && pl->done && !pl->servers) {
    ah_withdraw_done_fn done = pl->done;
    ah_mount *m = pl->m;
    pl->api->unsubscribe(pl->closed_sub);
    free(pl);
    done(m);
  }
}

static void mcp_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  mcp_plugin *pl = state;
  pl->withdrawing = true;
  size_t n = 0;
  for (mcp_server *s = pl->servers; s; s = s->next)
    n++;
  mcp_server **all = calloc(n + 1, sizeof *all);
  n = 0;
  for (mcp_server *s = pl->servers; all && s; s = s->next)
    all[n++] = s;
  for (size_t i = 0; all && i < n; i++)
    mcp_server_remove(all[i], "the mcp plugin is being withdrawn");
  free(all);
  if (!pl->servers) {
    pl->api->unsubscribe(pl->closed_sub);
    free(pl);
    done(m);
    return;
  }
  pl->done = done; /* the last server's close finishes */
}

static int mcp_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  if (!AH_HAS(api, ah_host_api, register_tool_source) || !AH_HAS(api, ah_host_api, call_progress)) {
    api->log(m, AH_PLOG_ERROR, "this host lacks tool sources (ABI 1.6)");
    return AH_EABI;
  }
  mcp_plugin *pl = calloc(1, sizeof *pl);
  if (!pl)
    return AH_ENOMEM;
  pl->api = api;
  pl->m = m;
  pl->has_http = AH_HAS(api, ah_host_api, http_start);
  *state = pl;
  const char *name;
  json_t *raw;
  json_object_foreach(json_object_get(config, "servers"), name, raw) {
    char *why = NULL;
    bool skip = false;
    json_t *conf = mcp_normalize(raw, &skip, &why);
    if (conf && !mcp_server_new(pl, name, NULL, conf, &why))
      conf = NULL;
    if (!conf && !skip)
      api->log(m, AH_PLOG_ERROR, "[mcp.%s]: %s (the server is left out)", name, why ? why : "?");
    else if (skip)
      api->log(m, AH_PLOG_INFO, "[mcp.%s]: disabled", name);
    free(why);
    json_decref(conf);
  }
  ah_tool_source_def src = {
      .struct_size = sizeof src, .prefix = MCP_PREFIX, .list = src_list, .call = src_call, .data = pl};
  int rc = api->register_tool_source(m, &src);
  const struct {
    const char *name;
    ah_method_fn fn;
  } methods[] = {{"mcp.attach", m_attach}, {"mcp.detach", m_detach}, {"mcp.status", m_status}};
  for (size_t i = 0; !rc && i < sizeof methods / sizeof methods[0]; i++) {
    ah_method_def def = {.struct_size = sizeof def,
                         .name = methods[i].name,
                         .handler = methods[i].fn,
                         .flags = AH_METHOD_PRIVILEGED,
                         .data = pl};
    rc = api->register_method(m, &def);
  }
  if (!rc)
    rc = api->subscribe(m, "session.closed", on_session_closed, pl, &pl->closed_sub);
  if (rc) {
    while (pl->servers) /* none started: each is freed at once */
      mcp_server_remove(pl->servers, "mount failed");
    free(pl);
    *state = NULL;
  }
  return rc;
}

static const ah_plugin_desc desc = {
    .struct_size = sizeof desc,
    .abi = AH_ABI_VERSION,
    .name = "mcp",
    .version = "1.0.0",
    .description = "MCP client: the tools of MCP servers (stdio and Streamable HTTP) for the agent",
    .mount = mcp_mount,
    .withdraw = mcp_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &desc;
}
