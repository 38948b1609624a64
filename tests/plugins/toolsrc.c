/* Fixture "toolsrc": a tool source (ABI 1.6) with the prefix "fx__".
 *
 * It lists, for every session, fx__echo {text} → {text, tool} and fx__steps {n} → progress 1…n, then {done};
 * fx__wait {} answers only when its call's token trips. toolsrc.add {sessionId, name} adds fx__NAME for that
 * session alone (and says so with tools_changed); toolsrc.stats → {lists, cancelledLists, waiting, stopped,
 * lastSession}.
 *
 * Config: `list_delay_ms` answers every list that much later (cancellable); `list_fail` answers it with an
 * error; `bad` registers one bad definition instead: "prefix", "handler", "tool-under-prefix" (a plugin tool
 * named under the prefix, after the source). */
#include <agenthost/plugin.h>

#include <stdlib.h>
#include <string.h>

typedef struct fx {
  const ah_host_api *api;
  ah_mount *m;
  json_int_t delay_ms;
  bool fail;
  json_t *extra; /* sessionId → [name] */
  int lists;
  int cancelled_lists;
  int waiting;
  int stopped;
  char last_session[64];
} fx;

typedef struct pending {
  fx *st;
  ah_call *call;
  char *session;
  ah_timer *timer;
  ah_cancel_watch *watch;
} pending;

static json_t *tool(const char *name, const char *desc) {
  return json_pack("{s:s, s:s, s:{s:s}, s:s}", "name", name, "description", desc, "schema", "type", "object",
                   "group", "alpha");
}

static void answer_list(fx *st, ah_call *call, const char *session) {
  st->lists++;
  snprintf(st->last_session, sizeof st->last_session, "%s", session ? session : "");
  if (st->fail) {
    st->api->call_error(call, AH_EUNAVAILABLE, "server alpha did not start", NULL);
    return;
  }
  json_t *list =
      json_pack("[o, o, o]", tool("fx__echo", "Echo text."), tool("fx__steps", "Count with progress."),
                tool("fx__wait", "Wait until cancelled."));
  size_t i;
  json_t *n;
  json_array_foreach(json_object_get(st->extra, session ? session : ""), i, n) {
    char name[80];
    snprintf(name, sizeof name, "fx__%s", json_string_value(n));
    json_t *t = tool(name, "Added for one session.");
    json_object_set_new(t, "group", json_string("beta"));
    json_array_append_new(list, t);
  }
  json_array_append_new(list, json_pack("{s:s, s:s}", "name", "outside_prefix", "description", "dropped"));
  st->api->call_reply(call, list);
}

static void pending_free(pending *p) {
  free(p->session);
  free(p);
}

static void delayed(ah_timer *t, void *arg) {
  (void)t;
  pending *p = arg;
  p->st->api->token_unwatch(p->watch);
  answer_list(p->st, p->call, p->session);
  pending_free(p);
}

static void list_cancelled(ah_cancel *token, void *arg) {
  (void)token;
  pending *p = arg;
  p->st->cancelled_lists++;
  p->st->api->timer_stop(p->timer);
  p->st->api->call_error(p->call, AH_ECANCELED, "cancelled", NULL);
  pending_free(p);
}

static void src_list(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  const char *session = json_string_value(json_object_get(params, "sessionId"));
  if (st->delay_ms <= 0) {
    answer_list(st, call, session);
    return;
  }
  pending *p = calloc(1, sizeof *p);
  ah_cancel *tok = st->api->call_cancel_token(call);
  if (!p || !tok) {
    free(p);
    st->api->call_error(call, AH_EINTERNAL, "no token", NULL);
    return;
  }
  p->st = st;
  p->call = call;
  p->session = session ? strdup(session) : NULL;
  if (st->api->timer_start(st->m, (uint64_t)st->delay_ms, 0, delayed, p, &p->timer) != 0 ||
      st->api->token_watch(tok, list_cancelled, p, &p->watch) != 0) {
    if (p->timer)
      st->api->timer_stop(p->timer);
    pending_free(p);
    st->api->call_error(call, AH_ECANCELED, "cancelled", NULL);
  }
}

static void wait_stopped(ah_cancel *token, void *arg) {
  (void)token;
  pending *p = arg;
  p->st->waiting--;
  p->st->stopped++;
  p->st->api->call_error(p->call, AH_ECANCELED, "stopped", NULL);
  pending_free(p);
}

static void src_call(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  const char *name = json_string_value(json_object_get(params, "tool"));
  const json_t *args = json_object_get(params, "arguments");
  if (name && strcmp(name, "fx__steps") == 0) {
    json_int_t n = json_integer_value(json_object_get(args, "n"));
    for (json_int_t i = 1; i <= n; i++) {
      json_t *p = json_pack("{s:I, s:I, s:s}", "progress", i, "total", n, "message", "counting");
      st->api->call_progress(call, p);
      json_decref(p);
    }
    json_t *bad = json_pack("{s:s}", "progress", "not a number");
    int rc = st->api->call_progress(call, bad);
    json_decref(bad);
    st->api->call_reply(call, json_pack("{s:I, s:b}", "done", n, "badProgressRefused", rc == AH_EINVAL));
  } else if (name && strcmp(name, "fx__wait") == 0) {
    pending *p = calloc(1, sizeof *p);
    ah_cancel *tok = st->api->call_cancel_token(call);
    if (!p || !tok || st->api->token_watch(tok, wait_stopped, p, &p->watch) != 0) {
      free(p);
      st->api->call_error(call, AH_EINTERNAL, "cannot wait", NULL);
      return;
    }
    p->st = st;
    p->call = call;
    st->waiting++;
  } else {
    st->api->call_reply(call, json_pack("{s:O, s:s}", "text", json_object_get(args, "text"), "tool", name));
  }
}

static void m_add(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  const char *session = json_string_value(json_object_get(params, "sessionId"));
  const char *name = json_string_value(json_object_get(params, "name"));
  if (!session || !name) {
    st->api->call_error(call, AH_EINVAL, "sessionId and name", NULL);
    return;
  }
  json_t *list = json_object_get(st->extra, session);
  if (!list) {
    list = json_array();
    json_object_set_new(st->extra, session, list);
  }
  json_array_append_new(list, json_string(name));
  int rc = st->api->tools_changed(st->m, session);
  st->api->call_reply(call, json_pack("{s:i}", "rc", rc));
}

static void m_stats(ah_call *call, const json_t *params, void *data) {
  (void)params;
  fx *st = data;
  st->api->call_reply(call, json_pack("{s:i, s:i, s:i, s:i, s:s}", "lists", st->lists, "cancelledLists",
                                      st->cancelled_lists, "waiting", st->waiting, "stopped", st->stopped,
                                      "lastSession", st->last_session));
}

static void noop(ah_call *call, const json_t *params, void *data) {
  (void)params;
  fx *st = data;
  st->api->call_reply(call, NULL);
}

static int src_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  if (!AH_HAS(api, ah_host_api, register_tool_source))
    return AH_EABI;
  fx *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  st->api = api;
  st->m = m;
  st->extra = json_object();
  st->delay_ms = json_integer_value(json_object_get(config, "list_delay_ms"));
  st->fail = json_is_true(json_object_get(config, "list_fail"));
  *state = st;
  const char *bad = json_string_value(json_object_get(config, "bad"));
  ah_tool_source_def src = {
      .struct_size = sizeof src, .prefix = "fx__", .list = src_list, .call = src_call, .data = st};
  if (bad && strcmp(bad, "prefix") == 0)
    src.prefix = "fx_";
  if (bad && strcmp(bad, "handler") == 0)
    src.list = NULL;
  int rc = api->register_tool_source(m, &src);
  if (bad && strcmp(bad, "tool-under-prefix") == 0) {
    ah_tool_def def = {.struct_size = sizeof def, .name = "fx__mine", .description = "x", .handler = noop};
    rc = api->register_tool(m, &def);
  }
  ah_method_def defs[] = {
      {.struct_size = sizeof(ah_method_def),
       .name = "toolsrc.add",
       .handler = m_add,
       .flags = AH_METHOD_PRIVILEGED,
       .data = st},
      {.struct_size = sizeof(ah_method_def),
       .name = "toolsrc.stats",
       .handler = m_stats,
       .flags = AH_METHOD_PRIVILEGED,
       .data = st},
  };
  for (size_t i = 0; !rc && i < sizeof defs / sizeof defs[0]; i++)
    rc = api->register_method(m, &defs[i]);
  if (rc) {
    json_decref(st->extra);
    free(st);
    *state = NULL;
  }
  return rc;
}

static void src_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  fx *st = state;
  if (st)
    json_decref(st->extra);
  free(st);
  done(m);
}

static const ah_plugin_desc desc = {
    .struct_size = sizeof desc,
    .abi = AH_ABI_VERSION,
    .name = "toolsrc",
    .version = "1.0.0",
    .description = "fixture: a tool source",
    .mount = src_mount,
    .withdraw = src_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &desc;
}
