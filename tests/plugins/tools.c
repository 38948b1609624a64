/* Fixture "tools": a plugin that registers tools (ABI 1.5).
 *
 *   fx_add   {a, b} → {sum}; other arguments → an error the model reads
 *   fx_where {} → {cwd, sessionId} as the host passed them
 *   fx_wait  {} → never answers by itself: it finishes only when its call's token trips (the turn was
 *            cancelled or the plugin is withdrawn), and counts those in tools.stats {waiting, stopped}
 *
 *   tools.editor-read {sessionId, path} → {content: "buffer of PATH"} ("PATH" ending in "missing": an error)
 *   tools.editor-write {sessionId, path, content} → {}, kept for tools.stats {written: [{path, content}]}
 *   tools.editor-run {sessionId, command, cwd, timeoutMs, …} → {exitCode: 0, signal: null, output: "ran:
 * COMMAND", truncated: false, timedOut: false, terminalId: "t-1"} (an editor for session.set-editor)
 *
 * Config `bad` registers one bad definition instead (to test the checks): "name", "builtin", "schema",
 * "description", "handler", "duplicate" (fx_add twice). */
#include <agenthost/plugin.h>

#include <stdlib.h>
#include <string.h>

typedef struct fx {
  const ah_host_api *api;
  int waiting;
  int stopped;
  json_t *written;
} fx;

typedef struct waiter {
  fx *st;
  ah_call *call;
  ah_cancel_watch *watch;
} waiter;

static void m_add(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  const json_t *args = json_object_get(params, "arguments");
  json_t *a = json_object_get(args, "a"), *b = json_object_get(args, "b");
  if (!json_is_number(a) || !json_is_number(b)) {
    st->api->call_error(call, AH_EINVAL, "arguments: a and b must be numbers", NULL);
    return;
  }
  st->api->call_reply(call, json_pack("{s:f}", "sum", json_number_value(a) + json_number_value(b)));
}

static void m_where(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  st->api->call_reply(call, json_pack("{s:O, s:O}", "cwd", json_object_get(params, "cwd"), "sessionId",
                                      json_object_get(params, "sessionId")));
}

static void wait_stopped(ah_cancel *token, void *arg) {
  (void)token;
  waiter *w = arg;
  w->st->waiting--;
  w->st->stopped++;
  w->st->api->call_error(w->call, AH_ECANCELED, "stopped", NULL); /* the plugin side of the call ends */
  free(w);
}

static void m_wait(ah_call *call, const json_t *params, void *data) {
  (void)params;
  fx *st = data;
  waiter *w = calloc(1, sizeof *w);
  ah_cancel *tok = st->api->call_cancel_token(call);
  if (!w || !tok || st->api->token_watch(tok, wait_stopped, w, &w->watch) != 0) {
    free(w);
    st->api->call_error(call, AH_EINTERNAL, "cannot wait", NULL);
    return;
  }
  w->st = st;
  w->call = call;
  st->waiting++;
}

static void m_stats(ah_call *call, const json_t *params, void *data) {
  (void)params;
  fx *st = data;
  st->api->call_reply(call, json_pack("{s:i, s:i, s:O}", "waiting", st->waiting, "stopped", st->stopped,
                                      "written", st->written));
}

static void m_editor_read(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  const char *path = json_string_value(json_object_get(params, "path"));
  size_t n = path ? strlen(path) : 0;
  if (!path || (n >= 7 && strcmp(path + n - 7, "missing") == 0)) {
    st->api->call_error(call, AH_ENOENT, "no such buffer", NULL);
    return;
  }
  st->api->call_reply(call, json_pack("{s:s+}", "content", "buffer of ", path));
}

static void m_editor_run(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  st->api->call_reply(call, json_pack("{s:i, s:n, s:s+, s:b, s:b, s:s}", "exitCode", 0, "signal", "output",
                                      "ran: ", json_string_value(json_object_get(params, "command")),
                                      "truncated", 0, "timedOut", 0, "terminalId", "t-1"));
}

static void m_editor_write(ah_call *call, const json_t *params, void *data) {
  fx *st = data;
  json_array_append_new(st->written, json_pack("{s:O, s:O}", "path", json_object_get(params, "path"),
                                               "content", json_object_get(params, "content")));
  st->api->call_reply(call, json_object());
}

static int tools_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  if (!AH_HAS(api, ah_host_api, register_tool))
    return AH_EABI;
  fx *st = calloc(1, sizeof *st);
  if (!st)
    return AH_ENOMEM;
  st->api = api;
  st->written = json_array();
  *state = st;
  const char *bad = json_string_value(json_object_get(config, "bad"));
  json_t *schema = json_pack("{s:s, s:{s:{s:s}, s:{s:s}}, s:[s, s]}", "type", "object", "properties", "a",
                             "type", "number", "b", "type", "number", "required", "a", "b");
  ah_tool_def add = {.struct_size = sizeof add,
                     .name = "fx_add",
                     .description = "Add two numbers.",
                     .schema = schema,
                     .handler = m_add,
                     .data = st};
  int rc = 0;
  if (bad) {
    json_t *array_schema = json_pack("{s:s}", "type", "array");
    ah_tool_def d = add;
    if (strcmp(bad, "name") == 0)
      d.name = "has space";
    else if (strcmp(bad, "builtin") == 0)
      d.name = "read_file";
    else if (strcmp(bad, "schema") == 0)
      d.schema = array_schema;
    else if (strcmp(bad, "description") == 0)
      d.description = NULL;
    else if (strcmp(bad, "handler") == 0)
      d.handler = NULL;
    rc = api->register_tool(m, &d);
    if (rc == 0 && strcmp(bad, "duplicate") == 0)
      rc = api->register_tool(m, &d);
    json_decref(array_schema);
    json_decref(schema);
    return rc;
  }
  ah_tool_def where = {.struct_size = sizeof where,
                       .name = "fx_where",
                       .description = "Where the tool runs.",
                       .handler = m_where,
                       .data = st};
  ah_tool_def wait = {.struct_size = sizeof wait,
                      .name = "fx_wait",
                      .description = "Wait until cancelled.",
                      .handler = m_wait,
                      .data = st};
  ah_method_def stats = {.struct_size = sizeof stats,
                         .name = "tools.stats",
                         .handler = m_stats,
                         .flags = AH_METHOD_PUBLIC,
                         .data = st};
  ah_method_def editor[] = {{.struct_size = sizeof(ah_method_def),
                             .name = "tools.editor-read",
                             .handler = m_editor_read,
                             .flags = AH_METHOD_PRIVILEGED,
                             .data = st},
                            {.struct_size = sizeof(ah_method_def),
                             .name = "tools.editor-write",
                             .handler = m_editor_write,
                             .flags = AH_METHOD_PRIVILEGED,
                             .data = st},
                            {.struct_size = sizeof(ah_method_def),
                             .name = "tools.editor-run",
                             .handler = m_editor_run,
                             .flags = AH_METHOD_PRIVILEGED,
                             .data = st}};
  rc = api->register_tool(m, &add);
  if (rc == 0)
    rc = api->register_tool(m, &where);
  if (rc == 0)
    rc = api->register_tool(m, &wait);
  if (rc == 0)
    rc = api->register_method(m, &stats);
  for (size_t i = 0; rc == 0 && i < 3; i++)
    rc = api->register_method(m, &editor[i]);
  json_decref(schema);
  return rc;
}

static void tools_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  fx *st = state;
  json_decref(st->written);
  free(st);
  done(m);
}

static const ah_plugin_desc desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "tools",
    .version = "1.0.0",
    .description = "test fixture: tools of a plugin",
    .mount = tools_mount,
    .withdraw = tools_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  return AH_ABI_MAJOR_OF(host_abi) == 1 ? &desc : NULL;
}
