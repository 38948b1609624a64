/* agenthost — the remote gateway: typed host services for browser code (PROTOCOLS.md "Remote";
 * docs/protocols/remote.md).
 *
 * - `remote.describe` → {descriptors: [...]}: every mounted descriptor (namespace, method, params with
 *   names and types, result type, cancellable, lookup, privileged, plugin);
 * - `remote.invoke {namespace, method, args}` → the function's value, or a typed error (bad-request naming
 *   the field, not-found, unavailable, cancelled, agent-busy, forbidden, internal). The core does the work
 *   (api->remote_invoke: lookup again, exact field set, session/agent resolution, libffi, result check);
 *   this plugin checks the envelope and links the invocation to the call's token, so a caller that goes
 *   away cancels it;
 * - event forwarding (REMOTE-EVENT-ALLOWLIST / FORWARD): exactly the eleven allowlisted core events,
 *   declared here at mount, are re-emitted as `remote.event {name, args}` after a JSON-safety check (valid
 *   UTF-8 and finite numbers are guaranteed by jansson; the depth is capped); the browser plugin carries
 *   them to its host stream as `host/remote-event`;
 * - built-in services in namespace `sessions`, so the UI uses Remote for real: rename, set_tags,
 *   tool_policy (privileged), pending.
 */
#include <agenthost/errors.h>
#include <agenthost/plugin.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EVENT_DEPTH 32

/* The allowlist: the whole list, declared at mount (DECISIONS.md "Event allowlist"). */
static const char *const forwarded[] = {
    "session.created",  "session.closed",    "session.status",      "session.event",
    "subagent.started", "subagent.finished", "request.pending",     "request.resolved",
    "plugin.mounted",   "plugin.withdrawn",  "host.config-changed",
};
#define NFORWARDED (sizeof forwarded / sizeof forwarded[0])

typedef struct remote {
  ah_mount *m;
  const ah_host_api *api;
  ah_sub *subs[NFORWARDED];
  size_t dropped; /* events that failed the safety check */
} remote;

/* ---- remote.describe / remote.invoke ------------------------------------------------------------------ */

static void m_describe(ah_call *call, const json_t *params, void *data) {
  remote *r = data;
  (void)params;
  json_t *d = r->api->remote_describe(r->m);
  if (!d) {
    r->api->call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  r->api->call_reply(call, json_pack("{s:o}", "descriptors", d));
}

typedef struct pending_invoke {
  remote *r;
  ah_call *call;
} pending_invoke;

static void invoked(const ah_outcome *o, void *arg) {
  pending_invoke *p = arg;
  if (o->status == 0)
    p->r->api->call_reply(p->call, json_incref((json_t *)o->result));
  else
    p->r->api->call_error(p->call, o->status, o->message, o->data ? json_incref((json_t *)o->data) : NULL);
  free(p);
}

static void m_invoke(ah_call *call, const json_t *params, void *data) {
  remote *r = data;
  const json_t *ns = json_object_get(params, "namespace");
  const json_t *method = json_object_get(params, "method");
  const json_t *args = json_object_get(params, "args");
  const char *k = NULL;
  json_t *v = NULL;
  json_object_foreach((json_t *)params, k, v) {
    if (strcmp(k, "namespace") != 0 && strcmp(k, "method") != 0 && strcmp(k, "args") != 0) {
      r->api->call_error(call, AH_EINVAL, "params: only namespace, method and args are allowed", NULL);
      return;
    }
  }
  if (!json_is_string(ns) || !json_is_string(method)) {
    r->api->call_error(call, AH_EINVAL, "params.namespace and params.method must be strings", NULL);
    return;
  }
  if (args && !json_is_object(args)) {
    r->api->call_error(call, AH_EINVAL, "params.args must be an object of named fields", NULL);
    return;
  }
  pending_invoke *p = calloc(1, sizeof *p);
  json_t *empty = args ? NULL : json_object();
  if (!p || (!args && !empty)) {
    free(p);
    json_decref(empty);
    r->api->call_error(call, AH_ENOMEM, "out of memory", NULL);
    return;
  }
  p->r = r;
  p->call = call;
  int rc =
      r->api->remote_invoke(r->m, r->api->call_caller(call), json_string_value(ns), json_string_value(method),
                            args ? args : empty, r->api->call_cancel_token(call), invoked, p);
  json_decref(empty);
  if (rc) {
    free(p);
    r->api->call_error(call, rc == AH_ESTATE ? AH_EUNAVAILABLE : rc, ah_strerror(rc), NULL);
  }
}

/* ---- event forwarding --------------------------------------------------------------------------------- */

static bool safe_depth(const json_t *v, int depth) {
  if (depth > MAX_EVENT_DEPTH)
    return false;
  if (json_is_object(v)) {
    const char *k = NULL;
    json_t *x = NULL;
    json_object_foreach((json_t *)v, k, x) {
      if (!safe_depth(x, depth + 1))
        return false;
    }
  } else if (json_is_array(v)) {
    size_t i = 0;
    json_t *x = NULL;
    json_array_foreach(v, i, x) {
      if (!safe_depth(x, depth + 1))
        return false;
    }
  }
  return true;
}

static void on_event(const char *name, const json_t *data, void *arg) {
  remote *r = arg;
  if (!safe_depth(data, 0)) {
    r->dropped++;
    r->api->log(r->m, AH_PLOG_WARN, "not forwarding %s: nested deeper than %d", name, MAX_EVENT_DEPTH);
    return;
  }
  r->api->emit(r->m, "remote.event", json_pack("{s:s, s:O}", "name", name, "args", data));
}

/* ---- built-in services (namespace "sessions") --------------------------------------------------------- */

/* A refusal that names the field (api->call_set_message), returned as bad-request. */
static int refuse(ah_call *call, const char *message) {
  AH_CALL_API(call)->call_set_message(call, message);
  return AH_EINVAL;
}

#define TITLE_MAX 200
#define TAGS_MAX 32
#define TAG_MAX 64

static int s_rename(ah_call *call, ah_session *s, const char *title) {
  if (strlen(title) > TITLE_MAX)
    return refuse(call, "args.title: at most 200 bytes");
  json_t *f = json_pack("{s:s}", "title", title);
  int rc = f ? AH_CALL_API(call)->session_update(s, f) : AH_ENOMEM;
  json_decref(f);
  return rc;
}

static int s_set_tags(ah_call *call, ah_session *s, json_t *tags, json_t **out) {
  if (!json_is_array(tags) || json_array_size(tags) > TAGS_MAX)
    return refuse(call, "args.tags: an array of at most 32 strings");
  size_t i = 0;
  json_t *t = NULL;
  json_array_foreach(tags, i, t) {
    if (!json_is_string(t) || json_string_length(t) == 0 || json_string_length(t) > TAG_MAX)
      return refuse(call, "args.tags: each tag is a non-empty string of at most 64 bytes");
  }
  json_t *f = json_pack("{s:O}", "tags", tags);
  int rc = f ? AH_CALL_API(call)->session_update(s, f) : AH_ENOMEM;
  json_decref(f);
  if (rc == 0)
    *out = json_deep_copy(tags);
  return rc == 0 && !*out ? AH_ENOMEM : rc;
}

static int s_tool_policy(ah_call *call, ah_session *s, const char *tool, const char *policy, json_t **out) {
  const ah_host_api *api = AH_CALL_API(call);
  if (strcmp(policy, "allow") != 0 && strcmp(policy, "ask") != 0 && strcmp(policy, "deny") != 0)
    return refuse(call, "args.policy: allow, ask or deny");
  json_t *f = json_pack("{s:{s:s}}", "policy", tool, policy);
  int rc = f ? api->session_update(s, f) : AH_ENOMEM;
  json_decref(f);
  if (rc == AH_EINVAL)
    return refuse(call, "args.tool: not a known tool");
  if (rc)
    return rc;
  json_t *info = api->session_info(s);
  *out = json_deep_copy(json_object_get(info, "policy"));
  json_decref(info);
  return *out ? 0 : AH_ENOMEM;
}

/* One of the session's options (its model, mode, reasoning effort): every option after the change. */
static int s_set_option(ah_call *call, ah_session *s, const char *option, const char *value, json_t **out) {
  const ah_host_api *api = AH_CALL_API(call);
  json_t *f = json_pack("{s:{s:s}}", "options", option, value);
  int rc = f ? api->session_update(s, f) : AH_ENOMEM;
  json_decref(f);
  if (rc == AH_EINVAL)
    return refuse(call, "args: not an option of the session, or not one of its values");
  if (rc)
    return rc;
  json_t *info = api->session_info(s);
  *out = json_deep_copy(json_object_get(info, "options"));
  json_decref(info);
  return *out ? 0 : AH_ENOMEM;
}

static int s_pending(ah_call *call, ah_session *s, json_t **out) {
  json_t *info = AH_CALL_API(call)->session_info(s);
  json_t *pending = json_object_get(info, "pending");
  size_t approvals = 0, questions = 0, i = 0;
  json_t *q = NULL;
  json_array_foreach(pending, i, q) {
    const char *kind = json_string_value(json_object_get(q, "kind"));
    approvals += kind && strcmp(kind, "approval") == 0;
    questions += kind && strcmp(kind, "question") == 0;
  }
  *out = json_pack("{s:I, s:I, s:O}", "approvals", (json_int_t)approvals, "questions", (json_int_t)questions,
                   "requests", pending ? pending : json_null());
  json_decref(info);
  return *out ? 0 : AH_ENOMEM;
}

static const ah_remote_param p_rename[] = {{"session", AH_TYPE_SESSION, false},
                                           {"title", AH_TYPE_STRING, false}};
static const ah_remote_param p_tags[] = {{"session", AH_TYPE_SESSION, false}, {"tags", AH_TYPE_JSON, false}};
static const ah_remote_param p_policy[] = {
    {"session", AH_TYPE_SESSION, false}, {"tool", AH_TYPE_STRING, false}, {"policy", AH_TYPE_STRING, false}};
static const ah_remote_param p_pending[] = {{"session", AH_TYPE_SESSION, false}};
static const ah_remote_param p_option[] = {
    {"session", AH_TYPE_SESSION, false}, {"option", AH_TYPE_STRING, false}, {"value", AH_TYPE_STRING, false}};

static const ah_remote_def services[] = {
    {.struct_size = sizeof(ah_remote_def),
     .param_size = sizeof(ah_remote_param),
     .ns = "sessions",
     .method = "rename",
     .params = p_rename,
     .nparams = 2,
     .result = AH_TYPE_VOID,
     .lookup = AH_LOOKUP_SESSION,
     .fn = AH_REMOTE_FN(s_rename)},
    {.struct_size = sizeof(ah_remote_def),
     .param_size = sizeof(ah_remote_param),
     .ns = "sessions",
     .method = "set_tags",
     .params = p_tags,
     .nparams = 2,
     .result = AH_TYPE_JSON,
     .lookup = AH_LOOKUP_SESSION,
     .fn = AH_REMOTE_FN(s_set_tags)},
    {.struct_size = sizeof(ah_remote_def),
     .param_size = sizeof(ah_remote_param),
     .ns = "sessions",
     .method = "tool_policy",
     .params = p_policy,
     .nparams = 3,
     .result = AH_TYPE_JSON,
     .flags = AH_REMOTE_PRIVILEGED,
     .lookup = AH_LOOKUP_SESSION,
     .fn = AH_REMOTE_FN(s_tool_policy)},
    {.struct_size = sizeof(ah_remote_def),
     .param_size = sizeof(ah_remote_param),
     .ns = "sessions",
     .method = "pending",
     .params = p_pending,
     .nparams = 1,
     .result = AH_TYPE_JSON,
     .lookup = AH_LOOKUP_SESSION,
     .fn = AH_REMOTE_FN(s_pending)},
    {.struct_size = sizeof(ah_remote_def),
     .param_size = sizeof(ah_remote_param),
     .ns = "sessions",
     .method = "set_option",
     .params = p_option,
     .nparams = 3,
     .result = AH_TYPE_JSON,
     .flags = AH_REMOTE_PRIVILEGED,
     .lookup = AH_LOOKUP_SESSION,
     .fn = AH_REMOTE_FN(s_set_option)},
};

/* ---- mount / withdraw --------------------------------------------------------------------------------- */

static int remote_mount(ah_mount *m, const ah_host_api *api, const json_t *config, void **state) {
  (void)config;
  /* The gateway needs the host's remote entries (ABI 1.1). They filled reserved slots of ah_host_api, so
   * an earlier 1.1 host has the same table size with NULL there: each one is checked, not the size. */
  const char *lacking = !AH_HAS(api, ah_host_api, remote_describe)    ? "remote_describe"
                        : !AH_HAS(api, ah_host_api, remote_invoke)    ? "remote_invoke"
                        : !AH_HAS(api, ah_host_api, session_info)     ? "session_info"
                        : !AH_HAS(api, ah_host_api, session_update)   ? "session_update"
                        : !AH_HAS(api, ah_host_api, call_set_message) ? "call_set_message"
                                                                      : NULL;
  if (lacking) {
    api->log(m, AH_PLOG_ERROR, "the host lacks %s (ABI 1.1): the remote gateway cannot run on it", lacking);
    return AH_EABI;
  }
  remote *r = calloc(1, sizeof *r);
  if (!r)
    return AH_ENOMEM;
  r->m = m;
  r->api = api;
  *state = r;
  ah_method_def defs[] = {
      {.struct_size = sizeof(ah_method_def),
       .name = "remote.describe",
       .handler = m_describe,
       .flags = AH_METHOD_PUBLIC,
       .data = r},
      {.struct_size = sizeof(ah_method_def),
       .name = "remote.invoke",
       .handler = m_invoke,
       .flags = AH_METHOD_PUBLIC | AH_METHOD_CANCELLABLE,
       .data = r},
  };
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++)
    api->register_method(m, &defs[i]);
  api->register_event(m, "remote.event", AH_EVENT_ALLOWLISTED);
  for (size_t i = 0; i < sizeof services / sizeof services[0]; i++)
    api->register_remote(m, &services[i]);
  for (size_t i = 0; i < NFORWARDED; i++) {
    int rc = api->subscribe(m, forwarded[i], on_event, r, &r->subs[i]);
    if (rc) {
      /* A failed mount() is not withdrawn: free what it allocated (its subscriptions end with it). */
      free(r);
      *state = NULL;
      return rc;
    }
  }
  return 0;
}

static void remote_withdraw(ah_mount *m, void *state, ah_withdraw_done_fn done) {
  remote *r = state;
  for (size_t i = 0; i < NFORWARDED; i++)
    if (r->subs[i])
      r->api->unsubscribe(r->subs[i]);
  free(r);
  done(m);
}

static const ah_plugin_desc remote_desc = {
    .struct_size = sizeof(ah_plugin_desc),
    .abi = AH_ABI_VERSION,
    .name = "remote",
    .version = "1.0.0",
    .description = "typed host services for browser code (remote descriptors through libffi) and the event "
                   "allowlist",
    .mount = remote_mount,
    .withdraw = remote_withdraw,
};

AH_EXPORT const ah_plugin_desc *ah_plugin_entry_v1(uint32_t host_abi) {
  (void)host_abi;
  return &remote_desc;
}
