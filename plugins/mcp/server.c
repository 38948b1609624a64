/* agenthost mcp plugin — one MCP server: its start, its tools, its calls, its failures.
 *
 * States: IDLE → (first use) STARTING: the transport opens, `initialize` (protocol 2025-11-25 offered;
 * 2025-06-18 and 2025-03-26 accepted), `notifications/initialized`, then `tools/list` page by page → READY.
 * The whole start has startup_ms: past it, or on any failure, the server is closed (CLOSING → IDLE) with its
 * error kept, and a new start is refused until the backoff (1 s, doubling to 30 s) has passed; the next use
 * after that starts it again. A READY server that goes away (the child exits, the connection breaks) fails
 * its calls in flight with a message naming it and is restarted the same way at its next use.
 *
 * A call: `tools/call` with a progress token (progress notifications go to the call's progress), its own
 * timeout (tool_ms) and the call's cancellation token: when the turn is cancelled, or the timeout passes,
 * the server gets `notifications/cancelled` for the request and the call ends at once. Results are mapped
 * for the model: text as text, images and audio as a placeholder naming their type and size, resource links
 * and embedded resources by URI (with an embedded text), `structuredContent` kept, and `isError` → an
 * error of the tool carrying its text. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mcp.h"

typedef struct mcp_wait {
  struct mcp_wait *next;
  mcp_ready_fn cb;
  void *arg;
} mcp_wait;

typedef struct mcp_run {
  struct mcp_run *next;
  mcp_server *s;
  ah_call *call;
  char *tool;
  json_t *arguments;
  int64_t id;
  bool sent;
  bool waiting; /* for the server to be ready */
  char token[48];
  ah_timer *timer;
  ah_cancel_watch *watch;
} mcp_run;

#define API(s) ((s)->pl->api)

void mcp_log(mcp_plugin *pl, int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) >= 0) {
    pl->api->log(pl->m, level, "%s", s);
    free(s);
  }
  va_end(ap);
}

static uint64_t now_ms(mcp_server *s) {
  return uv_now(API(s)->loop(s->pl->m));
}

mcp_server *mcp_server_new(mcp_plugin *pl, const char *name, const char *session_id, const json_t *conf,
                           char **why) {
  bool http = json_object_get(conf, "url") != NULL;
  if (http && !pl->has_http) {
    *why = mcp_fmt("server %s: an HTTP server needs a host built with the HTTP client", name);
    return NULL;
  }
  mcp_server *s = calloc(1, sizeof *s);
  if (!s || !(s->name = strdup(name)) || (session_id && !(s->session_id = strdup(session_id)))) {
    if (s)
      free(s->name);
    free(s);
    *why = mcp_fmt("out of memory");
    return NULL;
  }
  s->pl = pl;
  s->conf = json_deep_copy(conf);
  s->tr = http ? &mcp_http_transport : &mcp_stdio_transport;
  s->enabled_tools = json_incref(json_object_get(s->conf, "enabled_tools"));
  s->disabled_tools = json_incref(json_object_get(s->conf, "disabled_tools"));
  json_int_t st = json_integer_value(json_object_get(s->conf, "startup_timeout_ms"));
  json_int_t tt = json_integer_value(json_object_get(s->conf, "tool_timeout_ms"));
  s->startup_ms = st > 0 ? (uint32_t)st : MCP_DEFAULT_STARTUP_MS;
  s->tool_ms = tt > 0 ? (uint32_t)tt : MCP_DEFAULT_TOOL_MS;
  s->backoff_ms = MCP_BACKOFF_FIRST_MS;
  s->next = pl->servers;
  pl->servers = s;
  return s;
}

static void server_free(mcp_server *s) {
  for (mcp_server **pp = &s->pl->servers; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  mcp_plugin *pl = s->pl;
  json_decref(s->conf);
  json_decref(s->enabled_tools);
  json_decref(s->disabled_tools);
  json_decref(s->tools);
  free(s->error);
  free(s->name);
  free(s->session_id);
  free(s);
  mcp_plugin_server_gone(pl);
}

/* ---- waiters ------------------------------------------------------------------------------------------ */

static void wake(mcp_server *s, int status, const char *message) {
  mcp_wait *w = s->waiters;
  s->waiters = NULL;
  while (w) {
    mcp_wait *next = w->next;
    w->cb(s, status, message, w->arg);
    free(w);
    w = next;
  }
}

void mcp_server_unwait(mcp_server *s, mcp_ready_fn cb, void *arg) {
  for (mcp_wait **pp = &s->waiters; *pp; pp = &(*pp)->next)
    if ((*pp)->cb == cb && (*pp)->arg == arg) {
      mcp_wait *w = *pp;
      *pp = w->next;
      free(w);
      return;
    }
}

static bool add_waiter(mcp_server *s, mcp_ready_fn cb, void *arg) {
  mcp_wait *w = calloc(1, sizeof *w);
  if (!w)
    return false;
  w->cb = cb;
  w->arg = arg;
  w->next = s->waiters;
  s->waiters = w;
  return true;
}

/* ---- start -------------------------------------------------------------------------------------------- */

static void start(mcp_server *s);

/* The transport goes away; mcp_server_closed() follows (at once when none was opened). */
static void close_transport(mcp_server *s) {
  if (s->t)
    s->tr->close(s);
  else
    mcp_server_closed(s);
}

static void timer_clear(mcp_server *s, ah_timer **t) {
  if (*t) {
    API(s)->timer_stop(*t);
    *t = NULL;
  }
}

/* Close after a failure: the error is kept, the next start waits for the backoff. */
static void fail(mcp_server *s, char *why) {
  timer_clear(s, &s->startup_timer);
  free(s->error);
  s->error = why ? why : mcp_fmt("failed");
  mcp_log(s->pl, AH_PLOG_WARN, "[mcp.%s] %s", s->name, s->error);
  s->retry_at = now_ms(s) + s->backoff_ms;
  s->backoff_ms = s->backoff_ms * 2 > MCP_BACKOFF_MAX_MS ? MCP_BACKOFF_MAX_MS : s->backoff_ms * 2;
  bool was_starting = s->state == MCP_STARTING;
  s->state = MCP_CLOSING;
  if (was_starting) {
    char *msg = mcp_fmt("MCP server %s: %s", s->name, s->error);
    wake(s, AH_EUNAVAILABLE, msg ? msg : s->error);
    free(msg);
  }
  close_transport(s);
}

static void on_startup_timeout(ah_timer *t, void *arg) {
  (void)t;
  mcp_server *s = arg;
  s->startup_timer = NULL;
  fail(s, mcp_fmt("did not finish starting (initialize and tools/list) within %u ms", s->startup_ms));
}

static bool tool_wanted(mcp_server *s, const char *name) {
  size_t i;
  json_t *x;
  if (s->enabled_tools) {
    bool in = false;
    json_array_foreach(s->enabled_tools, i, x) in |= strcmp(json_string_value(x), name) == 0;
    if (!in)
      return false;
  }
  json_array_foreach(s->disabled_tools, i, x) {
    if (strcmp(json_string_value(x), name) == 0)
      return false;
  }
  return true;
}

typedef struct listing {
  mcp_server *s;
  json_t *tools;
  int pages;
  bool initial; /* part of the start; else a refresh after list_changed */
} listing;

static void list_page(listing *l, const char *cursor);
static void relist(mcp_server *s);

static void listed(listing *l, int status, const char *why) {
  mcp_server *s = l->s;
  json_t *tools = l->tools;
  bool initial = l->initial;
  free(l);
  if (initial) {
    if (status) {
      json_decref(tools);
      fail(s, mcp_fmt("tools/list failed: %s", why));
      return;
    }
    timer_clear(s, &s->startup_timer);
    json_decref(s->tools);
    s->tools = tools;
    s->state = MCP_READY;
    s->backoff_ms = MCP_BACKOFF_FIRST_MS;
    free(s->error);
    s->error = NULL;
    mcp_log(s->pl, AH_PLOG_INFO, "[mcp.%s] ready: protocol %s, %zu tools", s->name, s->protocol,
            json_array_size(tools));
    wake(s, 0, NULL);
    if (s->relist_again && s->state == MCP_READY) {
      s->relist_again = false;
      relist(s);
    }
    return;
  }
  s->relisting = false;
  if (status) {
    json_decref(tools);
    mcp_log(s->pl, AH_PLOG_WARN, "[mcp.%s] refreshing the tool list failed: %s (the old list stays)", s->name,
            why);
  } else if (s->state == MCP_READY) {
    json_decref(s->tools);
    s->tools = tools;
    mcp_log(s->pl, AH_PLOG_INFO, "[mcp.%s] tool list changed: %zu tools", s->name, json_array_size(tools));
    mcp_plugin_tools_changed(s->pl, s);
  } else {
    json_decref(tools);
  }
  if (s->relist_again && s->state == MCP_READY) {
    s->relist_again = false;
    s->relisting = true;
    listing *again = calloc(1, sizeof *again);
    if (again && (again->tools = json_array())) {
      again->s = s;
      list_page(again, NULL);
    } else {
      free(again);
      s->relisting = false;
    }
  }
}

static char *error_text(const json_t *error, const char *message) {
  if (error)
    return mcp_fmt("error %lld: %s", (long long)json_integer_value(json_object_get(error, "code")),
                   json_string_value(json_object_get(error, "message"))
                       ? json_string_value(json_object_get(error, "message"))
                       : "(no message)");
  return mcp_fmt("%s", message ? message : "no answer");
}

static void on_list(mcp_server *s, int status, const json_t *result, const json_t *error, const char *message,
                    void *arg) {
  (void)s;
  listing *l = arg;
  if (status) {
    char *why = error_text(error, message);
    listed(l, status, why ? why : "failed");
    free(why);
    return;
  }
  json_t *tools = json_object_get(result, "tools");
  if (!json_is_array(tools)) {
    listed(l, AH_EPROTO, "the answer has no tools array");
    return;
  }
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    json_t *schema = json_object_get(t, "inputSchema");
    if (!name || !*name) {
      mcp_log(l->s->pl, AH_PLOG_WARN, "[mcp.%s] a listed tool without a name is ignored", l->s->name);
      continue;
    }
    if (!tool_wanted(l->s, name))
      continue;
    if (json_array_size(l->tools) >= MCP_MAX_TOOLS) {
      mcp_log(l->s->pl, AH_PLOG_WARN, "[mcp.%s] more than %d tools: the rest is ignored", l->s->name,
              MCP_MAX_TOOLS);
      break;
    }
    const char *desc = json_string_value(json_object_get(t, "description"));
    /* What it does, from the server's annotations (hints, which a client may not trust for safety: a
     * read-only hint only lets the session's read-only mode run it): read, fetch (reads the open world),
     * else other. */
    json_t *ann = json_object_get(t, "annotations");
    bool read_only = json_is_true(json_object_get(ann, "readOnlyHint"));
    bool open_world = json_is_true(json_object_get(ann, "openWorldHint"));
    const char *kind = !read_only ? "other" : open_world ? "fetch" : "read";
    json_array_append_new(l->tools,
                          json_pack("{s:s, s:s, s:O, s:s}", "tool", name, "description", desc ? desc : "",
                                    "schema", json_is_object(schema) ? schema : json_object(), "kind", kind));
  }
  const char *next = json_string_value(json_object_get(result, "nextCursor"));
  if (next && *next) {
    if (++l->pages >= MCP_MAX_PAGES) {
      listed(l, AH_E2BIG, "more than 100 pages of tools");
      return;
    }
    list_page(l, next);
    return;
  }
  listed(l, 0, NULL);
}

static void list_page(listing *l, const char *cursor) {
  json_t *params = cursor ? json_pack("{s:s}", "cursor", cursor) : json_object();
  int rc = l->s->tr->request(l->s, "tools/list", params, on_list, l, NULL);
  if (rc)
    listed(l, rc, ah_strerror(rc));
}

/* We offer 2025-11-25; a server may answer with an older version it speaks. 2025-06-18 and 2025-03-26 (the
 * first with Streamable HTTP) differ from it in nothing this client uses (tools, progress, cancellation). */
static bool version_ok(const char *v) {
  return v && (strcmp(v, "2025-11-25") == 0 || strcmp(v, "2025-06-18") == 0 || strcmp(v, "2025-03-26") == 0);
}

static void on_initialize(mcp_server *s, int status, const json_t *result, const json_t *error,
                          const char *message, void *arg) {
  (void)arg;
  if (s->state != MCP_STARTING)
    return;
  if (status) {
    char *why = error_text(error, message);
    fail(s, mcp_fmt("initialize failed: %s", why ? why : "?"));
    free(why);
    return;
  }
  const char *v = json_string_value(json_object_get(result, "protocolVersion"));
  if (!version_ok(v)) {
    fail(s,
         mcp_fmt("the server speaks protocol %.40s; agenthost speaks 2025-11-25, 2025-06-18 and 2025-03-26",
                 v ? v : "(none)"));
    return;
  }
  snprintf(s->protocol, sizeof s->protocol, "%s", v);
  s->tr->notify(s, "notifications/initialized", NULL);
  listing *l = calloc(1, sizeof *l);
  if (!l || !(l->tools = json_array())) {
    free(l);
    fail(s, mcp_fmt("out of memory"));
    return;
  }
  l->s = s;
  l->initial = true;
  list_page(l, NULL);
}

static void start(mcp_server *s) {
  s->state = MCP_STARTING;
  s->relist_again = false;
  s->protocol[0] = '\0';
  if (API(s)->timer_start(s->pl->m, s->startup_ms, 0, on_startup_timeout, s, &s->startup_timer) != 0)
    s->startup_timer = NULL;
  char *why = NULL;
  int rc = s->tr->open(s, &why);
  if (rc) {
    bool alive = s->t != NULL;
    timer_clear(s, &s->startup_timer);
    free(s->error);
    s->error = why ? why : mcp_fmt("%s", ah_strerror(rc));
    mcp_log(s->pl, AH_PLOG_WARN, "[mcp.%s] %s", s->name, s->error);
    s->retry_at = now_ms(s) + s->backoff_ms;
    s->state = alive ? MCP_CLOSING : MCP_IDLE;
    char *msg = mcp_fmt("MCP server %s: %s", s->name, s->error);
    wake(s, AH_EUNAVAILABLE, msg ? msg : s->error);
    free(msg);
    return;
  }
  json_t *params =
      json_pack("{s:s, s:{}, s:{s:s, s:s}}", "protocolVersion", MCP_PROTOCOL_LATEST, "capabilities",
                "clientInfo", "name", "agenthost", "version", API(s)->host_version());
  rc = s->tr->request(s, "initialize", params, on_initialize, NULL, NULL);
  if (rc)
    fail(s, mcp_fmt("cannot send initialize: %s", ah_strerror(rc)));
}

void mcp_server_ensure(mcp_server *s, mcp_ready_fn cb, void *arg) {
  if (s->removed) {
    cb(s, AH_EUNAVAILABLE, "the server was removed", arg);
    return;
  }
  if (s->state == MCP_READY) {
    cb(s, 0, NULL, arg);
    return;
  }
  if (s->state == MCP_IDLE && now_ms(s) < s->retry_at) {
    char *msg = mcp_fmt("MCP server %s failed (%s); it is tried again in %llu ms", s->name,
                        s->error ? s->error : "?", (unsigned long long)(s->retry_at - now_ms(s)));
    cb(s, AH_EUNAVAILABLE, msg ? msg : "MCP server unavailable", arg);
    free(msg);
    return;
  }
  if (!add_waiter(s, cb, arg)) {
    cb(s, AH_ENOMEM, "out of memory", arg);
    return;
  }
  if (s->state == MCP_IDLE)
    start(s);
}

/* ---- calls -------------------------------------------------------------------------------------------- */

static void run_unlink(mcp_run *r) {
  for (mcp_run **pp = &r->s->runs; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      return;
    }
}

/* Before the call is answered: the answer frees the call and its token, the watch with it. */
static void run_detach(mcp_run *r) {
  mcp_server *s = r->s;
  timer_clear(s, &r->timer);
  if (r->watch)
    API(s)->token_unwatch(r->watch);
  r->watch = NULL;
  run_unlink(r);
}

static void run_free(mcp_run *r) {
  free(r->tool);
  json_decref(r->arguments);
  free(r);
}

static void run_error(mcp_run *r, int status, const char *msg) {
  run_detach(r);
  API(r->s)->call_error(r->call, status, msg, NULL);
  run_free(r);
}

static void on_call_reply(mcp_server *s, int status, const json_t *result, const json_t *error,
                          const char *message, void *arg) {
  mcp_run *r = arg;
  if (status) {
    char *why = error_text(error, message);
    char *msg = mcp_fmt("MCP server %s: tools/call %s: %s", s->name, r->tool, why ? why : "failed");
    run_error(r, status == AH_EPROTO ? AH_EPROTO : AH_EUNAVAILABLE, msg ? msg : "failed");
    free(why);
    free(msg);
    return;
  }
  bool is_error = false;
  char *text = NULL;
  json_t *out = mcp_map_result(result, &is_error, &text);
  if (!out) {
    free(text);
    run_error(r, AH_ENOMEM, "out of memory");
    return;
  }
  run_detach(r);
  if (is_error)
    API(s)->call_error(r->call, AH_EPROTO, text && *text ? text : "the tool reported an error", out);
  else
    API(s)->call_reply(r->call, out);
  run_free(r);
  free(text);
}

static void run_ready(mcp_server *s, int status, const char *message, void *arg);

static void abandon(mcp_run *r, const char *reason) {
  mcp_server *s = r->s;
  if (r->sent) {
    s->tr->forget(s, r->id);
    s->tr->notify(s, "notifications/cancelled",
                  json_pack("{s:I, s:s}", "requestId", (json_int_t)r->id, "reason", reason));
  } else if (r->waiting) {
    mcp_server_unwait(s, run_ready, r);
  }
}

static void on_call_timeout(ah_timer *t, void *arg) {
  (void)t;
  mcp_run *r = arg;
  r->timer = NULL;
  abandon(r, "timed out");
  char *msg =
      mcp_fmt("MCP server %s: tools/call %s timed out after %u ms", r->s->name, r->tool, r->s->tool_ms);
  run_error(r, AH_ETIMEDOUT, msg ? msg : "timed out");
  free(msg);
}

static void on_call_cancelled(ah_cancel *token, void *arg) {
  (void)token;
  mcp_run *r = arg;
  r->watch = NULL; /* a watch ends when it fired */
  abandon(r, "cancelled by the user");
  run_error(r, AH_ECANCELED, "cancelled");
}

static void run_send(mcp_run *r) {
  mcp_server *s = r->s;
  snprintf(r->token, sizeof r->token, "agenthost-%llu", (unsigned long long)++s->progress_seq);
  json_t *params = json_pack("{s:s, s:O, s:{s:s}}", "name", r->tool, "arguments", r->arguments, "_meta",
                             "progressToken", r->token);
  int rc = s->tr->request(s, "tools/call", params, on_call_reply, r, &r->id);
  if (rc) {
    char *msg = mcp_fmt("MCP server %s: cannot send tools/call: %s", s->name, ah_strerror(rc));
    run_error(r, AH_EUNAVAILABLE, msg ? msg : "cannot send");
    free(msg);
    return;
  }
  r->sent = true;
  if (API(s)->timer_start(s->pl->m, s->tool_ms, 0, on_call_timeout, r, &r->timer) != 0)
    r->timer = NULL;
}

static void run_ready(mcp_server *s, int status, const char *message, void *arg) {
  (void)s;
  mcp_run *r = arg;
  r->waiting = false;
  if (status) {
    run_error(r, status, message ? message : "unavailable");
    return;
  }
  run_send(r);
}

void mcp_server_call(mcp_server *s, ah_call *call, const char *tool, const json_t *arguments) {
  mcp_run *r = calloc(1, sizeof *r);
  if (!r || !(r->tool = strdup(tool))) {
    free(r);
    API(s)->call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  r->s = s;
  r->call = call;
  r->arguments = json_is_object(arguments) ? json_deep_copy(arguments) : json_object();
  r->next = s->runs;
  s->runs = r;
  ah_cancel *tok = API(s)->call_cancel_token(call);
  if (tok && API(s)->token_watch(tok, on_call_cancelled, r, &r->watch) != 0) {
    r->watch = NULL;
    run_error(r, AH_ECANCELED, "cancelled");
    return;
  }
  r->waiting = true;
  mcp_server_ensure(s, run_ready, r);
}

/* ---- from the server ---------------------------------------------------------------------------------- */

static void relist(mcp_server *s) {
  if (s->state == MCP_STARTING) { /* the start's own list may predate the change: list again once ready */
    s->relist_again = true;
    return;
  }
  if (s->state != MCP_READY)
    return;
  if (s->relisting) {
    s->relist_again = true;
    return;
  }
  listing *l = calloc(1, sizeof *l);
  if (!l || !(l->tools = json_array())) {
    free(l);
    return;
  }
  l->s = s;
  s->relisting = true;
  list_page(l, NULL);
}

void mcp_server_message(mcp_server *s, const char *method, const json_t *params, void *inbound) {
  if (inbound) {
    if (strcmp(method, "ping") == 0)
      s->tr->respond(s, inbound, json_object(), 0, NULL);
    else
      s->tr->respond(s, inbound, NULL, AH_RPC_METHOD_NOT_FOUND, "method not found");
    return;
  }
  if (strcmp(method, "notifications/tools/list_changed") == 0) {
    relist(s);
  } else if (strcmp(method, "notifications/progress") == 0) {
    json_t *tok = json_object_get(params, "progressToken");
    for (mcp_run *r = s->runs; r && json_is_string(tok); r = r->next)
      if (r->sent && strcmp(r->token, json_string_value(tok)) == 0) {
        json_t *p = json_pack("{s:O}", "progress", json_object_get(params, "progress"));
        json_t *total = json_object_get(params, "total"), *msg = json_object_get(params, "message");
        if (json_is_number(total))
          json_object_set(p, "total", total);
        if (json_is_string(msg))
          json_object_set(p, "message", msg);
        API(s)->call_progress(r->call, p);
        json_decref(p);
        break;
      }
  } else if (strcmp(method, "notifications/message") == 0) {
    char *data = json_dumps(json_object_get(params, "data"), JSON_COMPACT | JSON_ENCODE_ANY);
    const char *level = json_string_value(json_object_get(params, "level"));
    mcp_log(s->pl, AH_PLOG_INFO, "[mcp.%s] %s: %.400s", s->name, level ? level : "log", data ? data : "");
    free(data);
  }
}

/* Every call in flight fails with `why`. */
static void fail_runs(mcp_server *s, const char *why) {
  while (s->runs) {
    mcp_run *r = s->runs;
    if (r->sent)
      s->tr->forget(s, r->id);
    char *msg = mcp_fmt("MCP server %s: %s during the call", s->name, why);
    run_error(r, AH_EUNAVAILABLE, msg ? msg : why);
    free(msg);
  }
}

void mcp_server_lost(mcp_server *s, const char *why) {
  if (s->state == MCP_STARTING) {
    fail(s, mcp_fmt("%s during start-up", why));
    return;
  }
  if (s->state != MCP_READY)
    return;
  mcp_log(s->pl, AH_PLOG_WARN, "[mcp.%s] lost: %s (started again at its next use)", s->name, why);
  fail_runs(s, why);
  free(s->error);
  s->error = mcp_fmt("%s", why);
  s->retry_at = now_ms(s) + s->backoff_ms;
  s->backoff_ms = s->backoff_ms * 2 > MCP_BACKOFF_MAX_MS ? MCP_BACKOFF_MAX_MS : s->backoff_ms * 2;
  s->state = MCP_CLOSING;
  close_transport(s);
}

void mcp_server_closed(mcp_server *s) {
  s->t = NULL;
  s->state = MCP_IDLE;
  if (s->removed) {
    server_free(s);
    return;
  }
  if (s->waiters) { /* uses that came while it was closing */
    if (now_ms(s) < s->retry_at) {
      char *msg = mcp_fmt("MCP server %s failed (%s); it is tried again in %llu ms", s->name,
                          s->error ? s->error : "?", (unsigned long long)(s->retry_at - now_ms(s)));
      wake(s, AH_EUNAVAILABLE, msg ? msg : "unavailable");
      free(msg);
    } else {
      start(s);
    }
  }
}

void mcp_server_remove(mcp_server *s, const char *why) {
  if (s->removed)
    return;
  s->removed = true;
  timer_clear(s, &s->startup_timer);
  fail_runs(s, why);
  char *msg = mcp_fmt("MCP server %s: %s", s->name, why);
  wake(s, AH_EUNAVAILABLE, msg ? msg : why);
  free(msg);
  if (s->state == MCP_IDLE) {
    server_free(s);
    return;
  }
  if (s->state != MCP_CLOSING) {
    s->state = MCP_CLOSING;
    close_transport(s);
  }
}
