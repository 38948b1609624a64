/* The host API table handed to plugins: registration, calls, tokens, bus, and the work the host tracks
 * for a mount (timers, posted tasks, pool work) so that withdraw can count and stop it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agenthost/provider.h"
#include "config.h"
#include "hooks.h"
#include "http.h"
#include "internal.h"
#include "record.h"
#include "sessions.h"
#include "tools.h"

/* ---- logging ------------------------------------------------------------------------------------- */

static void api_log(ah_mount *m, int level, const char *fmt, ...) {
  if (level < AH_PLOG_ERROR || level > AH_PLOG_DEBUG)
    level = AH_PLOG_INFO;
  char comp[48];
  snprintf(comp, sizeof comp, "plugin.%s", m && m->name ? m->name : "?");
  va_list ap;
  va_start(ap, fmt);
  ah__logv((ah_log_level)level, comp, fmt, ap);
  va_end(ap);
}

/* ---- registration --------------------------------------------------------------------------------- */

static int refuse(ah_mount *m, const char *what, const char *name, const char *field, int rc,
                  const char *why) {
  AH_LOG_E("registry", "plugin %s (%s): refused %s '%s': field %s: %s", m->name, m->path ? m->path : "core",
           what, name ? name : "(null)", field, why);
  if (m->state == AH__MOUNT_MOUNTING)
    m->registration_failed = true;
  return rc;
}

static int gate(ah_mount *m, const char *what, const char *name) {
  if (!m)
    return AH_EINVAL;
  if (m->state != AH__MOUNT_MOUNTING) {
    AH_LOG_E("registry", "plugin %s: refused %s '%s' outside mount()", m->name, what, name ? name : "(null)");
    return AH_ESTATE;
  }
  return 0;
}

int ah__services_register_method(ah_mount *m, const ah_method_def *def) {
  const char *name = def ? def->name : NULL;
  int rc = gate(m, "method", name);
  if (rc)
    return rc;
  if (!def || def->struct_size < offsetof(ah_method_def, reserved))
    return refuse(m, "method", name, "struct_size", AH_EINVAL, "definition smaller than the ABI's");
  if (!ah__valid_method_name(def->name))
    return refuse(m, "method", name, "name", AH_EINVAL,
                  "must be dot-separated segments of [a-z][a-z0-9_-]*, at least two, at most 128 bytes");
  if (!def->handler)
    return refuse(m, "method", name, "handler", AH_EINVAL, "missing handler");
  uint32_t vis = def->flags & (AH_METHOD_PUBLIC | AH_METHOD_PRIVILEGED);
  if (vis != AH_METHOD_PUBLIC && vis != AH_METHOD_PRIVILEGED)
    return refuse(m, "method", name, "flags", AH_EINVAL, "exactly one of PUBLIC or PRIVILEGED is required");
  if (def->flags & ~(uint32_t)(AH_METHOD_PUBLIC | AH_METHOD_PRIVILEGED | AH_METHOD_CANCELLABLE))
    return refuse(m, "method", name, "flags", AH_EINVAL, "unknown flag bits");
  ah__entry *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(def->name))) {
    free(e);
    m->registration_failed = true;
    return AH_ENOMEM;
  }
  e->kind = AH__ENTRY_METHOD;
  e->flags = def->flags;
  e->handler = def->handler;
  e->data = def->data;
  rc = ah__registry_stage(&m->host->reg, m, e);
  if (rc) {
    ah__entry_free(e);
    return refuse(m, "method", name, "name", rc, "already registered (live or staged)");
  }
  return 0;
}

int ah__services_register_event(ah_mount *m, const char *name, uint32_t flags) {
  int rc = gate(m, "event", name);
  if (rc)
    return rc;
  if (!ah__valid_event_name(name))
    return refuse(m, "event", name, "name", AH_EINVAL,
                  "must be dot-separated segments of [a-z][a-z0-9_-]*, at least two");
  if (flags & ~(uint32_t)AH_EVENT_ALLOWLISTED)
    return refuse(m, "event", name, "flags", AH_EINVAL, "unknown flag bits");
  ah__entry *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(name))) {
    free(e);
    m->registration_failed = true;
    return AH_ENOMEM;
  }
  e->kind = AH__ENTRY_EVENT;
  e->flags = flags;
  rc = ah__registry_stage(&m->host->reg, m, e);
  if (rc) {
    ah__entry_free(e);
    return refuse(m, "event", name, "name", rc, "already registered (live or staged)");
  }
  return 0;
}

static int api_register_tool(ah_mount *m, const ah_tool_def *def) {
  const char *name = def ? def->name : NULL;
  int rc = gate(m, "tool", name);
  if (rc)
    return rc;
  if (!def || def->struct_size < offsetof(ah_tool_def, reserved))
    return refuse(m, "tool", name, "struct_size", AH_EINVAL, "definition smaller than the ABI's");
  if (!ah__tool_name_valid(name))
    return refuse(m, "tool", name, "name", AH_EINVAL, "must match [A-Za-z0-9_-]{1,64}");
  if (ah__tool_builtin(name))
    return refuse(m, "tool", name, "name", AH_EEXIST, "the name of a built-in tool");
  if (ah__tool_source_of(m->host, name, true))
    return refuse(m, "tool", name, "name", AH_EEXIST, "under the prefix of a tool source");
  if (!def->description || !*def->description)
    return refuse(m, "tool", name, "description", AH_EINVAL,
                  "required: the model reads it to choose the tool");
  const char *stype = def->schema ? json_string_value(json_object_get(def->schema, "type")) : "object";
  if (!stype || strcmp(stype, "object") != 0)
    return refuse(m, "tool", name, "schema", AH_EINVAL, "must be a JSON Schema with \"type\": \"object\"");
  if (!def->handler)
    return refuse(m, "tool", name, "handler", AH_EINVAL, "missing handler");
  ah__entry *e = calloc(1, sizeof *e);
  json_t *schema = def->schema ? json_deep_copy(def->schema) : json_pack("{s:s}", "type", "object");
  if (!e || !(e->name = strdup(name)) || !schema ||
      !(e->meta = json_pack("{s:s, s:o}", "description", def->description, "schema", schema))) {
    if (e)
      free(e->name);
    free(e);
    m->registration_failed = true;
    return AH_ENOMEM;
  }
  e->kind = AH__ENTRY_TOOL;
  e->handler = def->handler;
  e->data = def->data;
  rc = ah__registry_stage(&m->host->reg, m, e);
  if (rc) {
    ah__entry_free(e);
    return refuse(m, "tool", name, "name", rc, "already registered by another plugin (live or staged)");
  }
  return 0;
}

static bool valid_source_prefix(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n < 3 || n > 16 || s[0] < 'a' || s[0] > 'z' || strcmp(s + n - 2, "__") != 0)
    return false;
  for (size_t i = 1; i + 2 < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9')))
      return false;
  return true;
}

static int api_register_tool_source(ah_mount *m, const ah_tool_source_def *def) {
  const char *prefix = def ? def->prefix : NULL;
  int rc = gate(m, "tool source", prefix);
  if (rc)
    return rc;
  if (!def || def->struct_size < offsetof(ah_tool_source_def, reserved))
    return refuse(m, "tool source", prefix, "struct_size", AH_EINVAL, "definition smaller than the ABI's");
  if (!valid_source_prefix(prefix))
    return refuse(m, "tool source", prefix, "prefix", AH_EINVAL,
                  "must match [a-z][a-z0-9]*__, at most 16 bytes");
  if (!def->list || !def->call)
    return refuse(m, "tool source", prefix, def->list ? "call" : "list", AH_EINVAL, "missing handler");
  if (ah__registry_tool_under(&m->host->reg, prefix))
    return refuse(m, "tool source", prefix, "prefix", AH_EEXIST,
                  "a plugin's tool already has a name under it");
  ah__entry *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(prefix))) {
    free(e);
    m->registration_failed = true;
    return AH_ENOMEM;
  }
  e->kind = AH__ENTRY_TOOL_SOURCE;
  e->handler = def->call;
  e->list = def->list;
  e->data = def->data;
  rc = ah__registry_stage(&m->host->reg, m, e);
  if (rc) {
    ah__entry_free(e);
    return refuse(m, "tool source", prefix, "prefix", rc,
                  "already registered by another plugin (live or staged)");
  }
  return 0;
}

static int api_register_hook(ah_mount *m, const ah_hook_def *def) {
  const char *name = def ? def->name : NULL;
  int rc = gate(m, "hook", name);
  if (rc)
    return rc;
  if (!def || def->struct_size < offsetof(ah_hook_def, reserved))
    return refuse(m, "hook", name, "struct_size", AH_EINVAL, "definition smaller than the ABI's");
  if (!name || !ah__config_name_valid(name))
    return refuse(m, "hook", name, "name", AH_EINVAL, "must match [a-z][a-z0-9-]*, at most 40 bytes");
  if (!ah__hook_point_valid(def->event))
    return refuse(m, "hook", name, "event", AH_EINVAL, "must be " AH_HOOK_POINTS_TEXT);
  if (def->timeout_ms > AH_HOOK_MAX_TIMEOUT_MS)
    return refuse(m, "hook", name, "timeout_ms", AH_EINVAL, "at most 600000");
  if (def->on_error && strcmp(def->on_error, "deny") != 0 && strcmp(def->on_error, "allow") != 0)
    return refuse(m, "hook", name, "on_error", AH_EINVAL, "must be \"deny\", \"allow\" or NULL");
  if (!def->handler)
    return refuse(m, "hook", name, "handler", AH_EINVAL, "missing handler");
  json_t *match = json_array();
  for (size_t i = 0; def->match && def->match[i]; i++) {
    json_t *p = json_string(def->match[i]);
    if (!p) {
      json_decref(match);
      return refuse(m, "hook", name, "match", AH_EINVAL, "patterns must be UTF-8 strings");
    }
    json_array_append_new(match, p);
  }
  bool guards = strcmp(def->event, "before_tool") == 0 || strcmp(def->event, "prompt_submit") == 0;
  ah__entry *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(name)) ||
      !(e->meta = json_pack("{s:s, s:o, s:I, s:s}", "event", def->event, "match", match, "timeout_ms",
                            (json_int_t)(def->timeout_ms ? def->timeout_ms : AH_HOOK_DEFAULT_TIMEOUT_MS),
                            "on_error",
                            def->on_error ? def->on_error
                            : guards      ? "deny"
                                          : "allow"))) {
    if (e)
      free(e->name);
    free(e);
    m->registration_failed = true;
    return AH_ENOMEM;
  }
  e->kind = AH__ENTRY_HOOK;
  e->handler = def->handler;
  e->data = def->data;
  rc = ah__registry_stage(&m->host->reg, m, e);
  if (rc) {
    ah__entry_free(e);
    return refuse(m, "hook", name, "name", rc, "already registered by another plugin (live or staged)");
  }
  return 0;
}

static int api_tools_changed(ah_mount *m, const char *session_id) {
  if (!m || m->state != AH__MOUNT_ACTIVE)
    return AH_ESTATE;
  return ah__host_emit(m->host, "tools.changed", json_pack("{s:s?}", "sessionId", session_id));
}

static int api_call_progress(ah_call *c, const json_t *progress) {
  if (!c || !c->progress || !json_is_object(progress) ||
      !json_is_number(json_object_get(progress, "progress")))
    return AH_EINVAL;
  json_t *total = json_object_get(progress, "total"), *msg = json_object_get(progress, "message");
  if ((total && !json_is_number(total)) || (msg && !json_is_string(msg)))
    return AH_EINVAL;
  if (c->answered)
    return AH_ECANCELED;
  c->progress(progress, c->arg);
  return 0;
}

static bool valid_provider_type(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > 40 || s[0] < 'a' || s[0] > 'z')
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
      return false;
  return true;
}

static int api_register_provider(ah_mount *m, ah_provider *p) {
  const char *name = p && p->struct_size >= offsetof(ah_provider, name) + sizeof p->name ? p->name : NULL;
  int rc = gate(m, "provider", name);
  if (rc)
    return rc;
  if (!p)
    return refuse(m, "provider", NULL, "p", AH_EINVAL, "NULL provider");
  if (!AH_HAS_FIELD(p, ah_provider, data))
    return refuse(m, "provider", name, "struct_size", AH_EINVAL, "smaller than the ABI 1.0 ah_provider");
  if (!valid_provider_type(name))
    return refuse(m, "provider", name, "name", AH_EINVAL, "must match [a-z][a-z0-9-]* (at most 40 bytes)");
  if (strcmp(name, "echo") == 0)
    return refuse(m, "provider", name, "name", AH_EEXIST, "echo is the core's embedded provider");
  if (!p->turn_start || !p->turn_tool_result || !p->turn_answer || !p->turn_subagent_result ||
      !p->turn_cancel || !p->turn_free)
    return refuse(m, "provider", name, "turn_*", AH_EINVAL, "every turn_* entry is required");
  ah__entry *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(name))) {
    free(e);
    m->registration_failed = true;
    return AH_ENOMEM;
  }
  e->kind = AH__ENTRY_PROVIDER;
  e->data = p;
  rc = ah__registry_stage(&m->host->reg, m, e);
  if (rc) {
    ah__entry_free(e);
    return refuse(m, "provider", name, "name", rc, "already registered (live or staged)");
  }
  return 0;
}

static const char *api_host_mode(ah_mount *m) {
  return m && m->host && m->host->mode ? m->host->mode : "serve";
}

static json_t *api_remote_describe(ah_mount *m) {
  return m ? ah__remote_describe(m->host) : json_array();
}

static int api_remote_invoke(ah_mount *m, const ah_caller *caller, const char *ns, const char *method,
                             const json_t *args, ah_cancel *parent, ah_reply_fn cb, void *arg) {
  if (!m)
    return AH_EINVAL;
  return ah__remote_invoke(m->host, caller, ns, method, args, parent, cb, arg);
}

static int api_register_remote(ah_mount *m, const ah_remote_def *def) {
  char full[160] = "";
  if (def && def->ns && def->method)
    snprintf(full, sizeof full, "%s.%s", def->ns, def->method);
  int rc = gate(m, "descriptor", full);
  if (rc)
    return rc;
  if (!def)
    return refuse(m, "descriptor", NULL, "def", AH_EINVAL, "NULL descriptor");
  ah__remote *r = NULL;
  rc = ah__remote_prepare(m, def, &r);
  if (rc) {
    m->registration_failed = true;
    return rc;
  }
  ah__registry *reg = &m->host->reg;
  ah__entry *ns = ah__registry_find(reg, AH__ENTRY_NAMESPACE, r->ns);
  if (ns && ns->mount != m) {
    ah__remote_free(r);
    return refuse(m, "descriptor", full, "ns", AH_EEXIST, "namespace belongs to another plugin");
  }
  ah__entry *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(full))) {
    free(e);
    ah__remote_free(r);
    m->registration_failed = true;
    return AH_ENOMEM;
  }
  e->kind = AH__ENTRY_REMOTE;
  e->flags = r->flags;
  e->remote = r;
  if (ah__registry_find(reg, AH__ENTRY_REMOTE, full)) {
    ah__entry_free(e);
    return refuse(m, "descriptor", full, "method", AH_EEXIST, "already registered (live or staged)");
  }
  if (!ns) {
    ah__entry *n = calloc(1, sizeof *n);
    if (!n || !(n->name = strdup(r->ns))) {
      free(n);
      ah__entry_free(e);
      m->registration_failed = true;
      return AH_ENOMEM;
    }
    n->kind = AH__ENTRY_NAMESPACE;
    ah__registry_stage(reg, m, n);
  }
  ah__registry_stage(reg, m, e);
  return 0;
}

/* ---- calls ---------------------------------------------------------------------------------------- */

static int api_dispatch(ah_mount *m, const ah_caller *caller, const char *method, json_t *params,
                        ah_cancel *parent, ah_reply_fn cb, void *arg) {
  if (!m) {
    json_decref(params);
    return AH_EINVAL;
  }
  return ah__host_dispatch(m->host, caller, method, params, parent, cb, arg);
}

/* ---- tokens --------------------------------------------------------------------------------------- */

static int api_token_new(ah_mount *m, ah_cancel *parent, ah_cancel **out) {
  if (!m || !out)
    return AH_EINVAL;
  ah_cancel *t = ah__cancel_new(parent ? parent : m->token);
  if (!t)
    return AH_ENOMEM;
  t->owner = m;
  ah__list_push(&m->tokens, &t->owner_link);
  *out = t;
  return 0;
}

static void api_token_trip(ah_cancel *t) {
  ah__cancel_trip(t);
}
static void api_token_free(ah_cancel *t) {
  ah__cancel_free(t);
}
static bool api_token_tripped(const ah_cancel *t) {
  return ah__cancel_tripped(t);
}
static int api_token_watch(ah_cancel *t, ah_cancel_fn fn, void *arg, ah_cancel_watch **out) {
  return ah__cancel_watch(t, fn, arg, out);
}
static void api_token_unwatch(ah_cancel_watch *w) {
  ah__cancel_unwatch(w);
}

/* ---- bus ------------------------------------------------------------------------------------------ */

static int api_emit(ah_mount *m, const char *name, json_t *data) {
  if (!m) {
    json_decref(data);
    return AH_EINVAL;
  }
  return ah__bus_emit(m->host, m, name, data);
}

static int api_subscribe(ah_mount *m, const char *pattern, ah_event_fn fn, void *arg, ah_sub **out) {
  if (!m)
    return AH_EINVAL;
  return ah__bus_subscribe(m->host, m, pattern, fn, arg, out);
}

/* ---- timers --------------------------------------------------------------------------------------- */

static void timer_closed(uv_handle_t *h) {
  ah_timer *t = h->data;
  ah_mount *m = t->mount;
  free(t);
  ah__mount_release(m, AH__HOLD_CLOSE);
}

static void timer_release(ah_timer *t) {
  if (t->stopped)
    return;
  t->stopped = true;
  ah__list_remove(&t->link);
  uv_timer_stop(&t->handle);
  ah__mount_hold(t->mount, AH__HOLD_CLOSE);
  uv_close((uv_handle_t *)&t->handle, timer_closed);
}

static void timer_fired(uv_timer_t *h) {
  ah_timer *t = h->data;
  t->in_callback = true;
  t->fn(t, t->arg);
  t->in_callback = false;
  if (!t->stopped && uv_timer_get_repeat(&t->handle) == 0)
    timer_release(t);
}

int ah__services_timer_start(ah_mount *m, uint64_t timeout_ms, uint64_t repeat_ms, ah_timer_fn fn, void *arg,
                             ah_timer **out) {
  if (!m || !fn)
    return AH_EINVAL;
  if ((m->state != AH__MOUNT_MOUNTING && m->state != AH__MOUNT_ACTIVE && m->state != AH__MOUNT_WITHDRAWING) ||
      m->done_called)
    return AH_ESTATE;
  ah_timer *t = calloc(1, sizeof *t);
  if (!t)
    return AH_ENOMEM;
  t->mount = m;
  t->fn = fn;
  t->arg = arg;
  uv_timer_init(m->host->loop, &t->handle);
  t->handle.data = t;
  uv_timer_start(&t->handle, timer_fired, timeout_ms, repeat_ms);
  ah__list_push(&m->timers, &t->link);
  if (out)
    *out = t;
  return 0;
}

void ah__services_timer_stop(ah_timer *t) {
  if (t)
    timer_release(t);
}

/* ---- posted tasks --------------------------------------------------------------------------------- */

int ah__services_post(ah_mount *m, ah_task_fn fn, void *arg) {
  if (!m || !fn)
    return AH_EINVAL;
  if ((m->state != AH__MOUNT_MOUNTING && m->state != AH__MOUNT_ACTIVE && m->state != AH__MOUNT_WITHDRAWING) ||
      m->done_called)
    return AH_ESTATE;
  ah__post *p = calloc(1, sizeof *p);
  if (!p)
    return AH_ENOMEM;
  p->mount = m;
  p->fn = fn;
  p->arg = arg;
  ah__list_push(&m->host->posts, &p->link);
  ah__list_push(&m->posts, &p->mount_link);
  ah__pump_kick(&m->host->pump);
  return 0;
}

/* The pump's pass over the tasks posted before it. */
void ah__services_drain_posts(void *host) {
  ah_host *h = host;
  ah__link posts;
  ah__list_take_all(&posts, &h->posts);
  while (!ah__list_empty(&posts)) {
    ah__post *p = AH__CONTAINER(posts.next, ah__post, link);
    ah__list_remove(&p->link);
    ah__list_remove(&p->mount_link);
    p->fn(p->arg);
    free(p);
  }
}

bool ah__services_posts_pending(void *host) {
  return !ah__list_empty(&((ah_host *)host)->posts);
}

/* ---- pool work ------------------------------------------------------------------------------------ */

static void work_run(uv_work_t *req) {
  ah__work *w = req->data;
  w->work(w->arg);
}

static void work_after(uv_work_t *req, int status) {
  ah__work *w = req->data;
  ah_mount *m = w->mount;
  ah__list_remove(&w->link);
  if (w->after)
    w->after(w->arg, status == UV_ECANCELED ? AH_ECANCELED : 0);
  free(w);
  ah__mount_release(m, AH__HOLD_WORK);
}

int ah__services_queue_work(ah_mount *m, ah_work_fn work, ah_after_fn after, void *arg) {
  if (!m || !work)
    return AH_EINVAL;
  if (m->state != AH__MOUNT_MOUNTING && m->state != AH__MOUNT_ACTIVE)
    return AH_ESTATE;
  ah__work *w = calloc(1, sizeof *w);
  if (!w)
    return AH_ENOMEM;
  w->mount = m;
  w->work = work;
  w->after = after;
  w->arg = arg;
  w->req.data = w;
  int rc = uv_queue_work(m->host->loop, &w->req, work_run, work_after);
  if (rc) {
    free(w);
    return AH_EIO;
  }
  ah__list_push(&m->works, &w->link);
  ah__mount_hold(m, AH__HOLD_WORK);
  return 0;
}

void ah__services_cancel_work(ah_mount *m) {
  /* Work that has not started is cancelled (its `after` gets AH_ECANCELED); running work is drained. */
  AH__LIST_EACH(it, &m->works) {
    ah__work *w = AH__CONTAINER(it, ah__work, link);
    uv_cancel((uv_req_t *)&w->req);
  }
}

/* ---- processes (process.c) ------------------------------------------------------------------------ */

int ah__services_spawn(ah_mount *m, const ah_process_opts *opts, ah_process **out) {
  if (!m)
    return AH_EINVAL;
  if (m->state != AH__MOUNT_MOUNTING && m->state != AH__MOUNT_ACTIVE)
    return AH_ESTATE;
  return ah__spawn(m->host, m, opts, out);
}

static int api_process_kill(ah_process *p, uint64_t grace_ms) {
  return ah__process_kill(p, grace_ms);
}
static int api_process_pid(const ah_process *p) {
  return p ? p->pid : 0;
}
static uv_stream_t *proc_stream(ah_process *p, int i) {
  return p && p->has_pipe[i] ? (uv_stream_t *)&p->pipes[i] : NULL;
}
static uv_stream_t *api_process_stdin(ah_process *p) {
  return proc_stream(p, 0);
}
uv_stream_t *ah__process_stdout(ah_process *p) {
  return proc_stream(p, 1);
}
uv_stream_t *ah__process_stderr(ah_process *p) {
  return p && p->err_logged ? NULL : proc_stream(p, 2); /* stderr_to_log: the host's own reader has it */
}

void *ah__process_arg(ah_process *p) {
  return p ? p->arg : NULL;
}
ah_process *ah__process_of_stream(uv_stream_t *s) {
  return s ? s->data : NULL;
}

/* ---- stdio ----------------------------------------------------------------------------------------- */

static void stdio_closed(uv_handle_t *h) {
  ah_host *host = h->data;
  free(h);
  if (--host->stdio_closing == 0 && host->stdio_owner) {
    ah_mount *m = host->stdio_owner;
    host->stdio_owner = NULL;
    ah__mount_release(m, AH__HOLD_CLOSE);
  }
}

static uv_stream_t *stdio_open(ah_host *h, int fd) {
  uv_handle_type t = uv_guess_handle(fd);
  if (t == UV_NAMED_PIPE || t == UV_TCP) {
    uv_pipe_t *p = calloc(1, sizeof *p);
    if (!p || uv_pipe_init(h->loop, p, 0) != 0) {
      free(p);
      return NULL;
    }
    if (uv_pipe_open(p, fd) != 0) {
      p->data = NULL;
      uv_close((uv_handle_t *)p, (uv_close_cb)free);
      return NULL;
    }
    return (uv_stream_t *)p;
  }
  if (t == UV_TTY) {
    uv_tty_t *tty = calloc(1, sizeof *tty);
    if (!tty || uv_tty_init(h->loop, tty, fd, 0) != 0) {
      free(tty);
      return NULL;
    }
    return (uv_stream_t *)tty;
  }
  return NULL;
}

static int api_stdio(ah_mount *m, uv_stream_t **in, uv_stream_t **out) {
  if (!m || !in || !out)
    return AH_EINVAL;
  ah_host *h = m->host;
  if (strcmp(h->mode, "serve") == 0)
    return AH_ENOENT;
  if (h->stdio_owner)
    return AH_EBUSY;
  if (m->state != AH__MOUNT_MOUNTING && m->state != AH__MOUNT_ACTIVE)
    return AH_ESTATE;
  uv_stream_t *i = stdio_open(h, 0);
  uv_stream_t *o = i ? stdio_open(h, 1) : NULL;
  if (!i || !o) {
    if (i) {
      i->data = NULL;
      uv_close((uv_handle_t *)i, (uv_close_cb)free);
    }
    return AH_ENOENT;
  }
  i->data = h;
  o->data = h;
  h->stdio_in = i;
  h->stdio_out = o;
  h->stdio_owner = m;
  *in = i;
  *out = o;
  return 0;
}

/* The stdio surfaces' line cap: [plugin.NAME] max_line, a positive number of bytes (a JSON integer or a
 * decimal string), absent = the peer's default. */
static int parse_max_line(const json_t *v, size_t *out) {
  if (!v) {
    *out = AH_RPC_DEFAULT_MAX_LINE;
    return 0;
  }
  if (json_is_integer(v) && json_integer_value(v) > 0) {
    *out = (size_t)json_integer_value(v);
    return 0;
  }
  const char *t = json_string_value(v);
  if (!t || *t < '0' || *t > '9')
    return AH_ECONFIG;
  char *end = NULL;
  errno = 0;
  unsigned long long n = strtoull(t, &end, 10);
  if (errno || *end || n == 0)
    return AH_ECONFIG;
  *out = (size_t)n;
  return 0;
}

/* ---- recordings of a plugin's connections (ABI 1.9) ---- */

struct ah_record {
  ah__link link;
  ah_recorder *rec;
  char *conn;
};

static ah_record *api_record_open(ah_mount *m, const char *conn) {
  ah_recorder *rec = m && conn && *conn ? ah__host_recorder(m->host, m->name) : NULL;
  if (!rec)
    return NULL;
  ah_record *r = calloc(1, sizeof *r);
  if (!r || !(r->conn = strdup(conn))) {
    free(r);
    return NULL;
  }
  r->rec = rec;
  ah__list_push(&m->records, &r->link);
  ah_recorder_mark(rec, conn, "open", NULL);
  return r;
}

static void api_record(ah_record *r, bool sent, const char *data, size_t len, const char *corr) {
  if (r)
    ah_recorder_message(r->rec, r->conn, sent, data, len, corr);
}

static void api_record_close(ah_record *r, bool lost) {
  if (!r)
    return;
  ah_recorder_mark(r->rec, r->conn, lost ? "loss" : "close", NULL);
  ah__list_remove(&r->link);
  free(r->conn);
  free(r);
}

void ah__records_close_all(ah_mount *m) {
  while (!ah__list_empty(&m->records))
    api_record_close(AH__CONTAINER(m->records.next, ah_record, link), false);
}

static void observe_stdio(void *arg, bool sent, const char *line, size_t len) {
  ah_recorder_message(arg, "stdio", sent, line, len, NULL);
}

static int api_stdio_rpc(ah_mount *m, const json_t *config, const ah_rpc_opts *opts, ah_rpc_peer **out) {
  if (!m || !opts || !out || opts->struct_size < offsetof(ah_rpc_opts, reserved))
    return AH_EINVAL;
  ah_rpc_opts o = *opts;
  if (parse_max_line(json_object_get(config, "max_line"), &o.max_line) != 0) {
    AH_LOG_E("plugins", "plugin %s: max_line: a positive number of bytes is required", m->name);
    return AH_ECONFIG;
  }
  uv_stream_t *in = NULL, *outs = NULL;
  int rc = api_stdio(m, &in, &outs);
  if (rc) {
    AH_LOG_E("plugins", "plugin %s: no stdio to serve on: %s", m->name, ah_strerror(rc));
    return rc;
  }
  rc = ah_rpc_open(in, outs, &o, out);
  ah_recorder *rec = rc == 0 ? ah__host_recorder(m->host, m->name) : NULL;
  if (rec) { /* the one connection of a stdio surface: "stdio" */
    ah_recorder_mark(rec, "stdio", "open", NULL);
    ah_rpc_observe(*out, observe_stdio, rec);
  }
  return rc;
}

void ah__stdio_release(ah_mount *m) {
  ah_host *h = m->host;
  if (h->stdio_owner != m || !h->stdio_in)
    return;
  ah_recorder_mark(ah__host_recorder(h, m->name), "stdio", "close", NULL);
  /* Counted as the mount's pending closes: the module is unloaded only after both close callbacks ran. */
  ah__mount_hold(m, AH__HOLD_CLOSE);
  h->stdio_closing = 2;
  uv_close((uv_handle_t *)h->stdio_in, stdio_closed);
  uv_close((uv_handle_t *)h->stdio_out, stdio_closed);
  h->stdio_in = h->stdio_out = NULL;
}

static void api_host_stop(ah_mount *m, int exit_code) {
  if (!m)
    return;
  ah_host *h = m->host;
  AH_LOG_I("host", "plugin %s asks the host to stop (exit %d)", m->name, exit_code);
  if (h->on_stop_request)
    h->on_stop_request(exit_code, h->stop_request_arg);
}

/* ---- information ---------------------------------------------------------------------------------- */

static uv_loop_t *api_loop(ah_mount *m) {
  if (!m)
    return NULL;
  if (!m->used_raw_loop)
    AH_LOG_D("services", "plugin %s took the raw loop", m->name);
  m->used_raw_loop = true;
  return m->host->loop;
}

static const char *api_mount_name(ah_mount *m) {
  return m ? m->name : NULL;
}
static const char *api_host_version(void) {
  return AH_VERSION;
}
static const char *api_state_dir(ah_mount *m) {
  return m && m->host->config ? m->host->config->state_dir : NULL;
}
static const char *api_runtime_dir(ah_mount *m) {
  return m && m->host->config ? m->host->config->runtime_dir : NULL;
}

/* ---- withdraw's clean-up of what the plugin left ---------------------------------------------------- */

/* A plugin that has not reported withdraw done still owns its state and the host objects it points at:
 * freeing them now would let its later token_free, timer_stop or unsubscribe free them again. So the host
 * only stops what would call into it on its own (timers, posted tasks; subscriptions are inactive since
 * the withdraw began; tokens are tripped with the mount's) and leaves every object in place: a late done
 * runs ah__services_withdraw(), otherwise the module stays a zombie and its objects with it. */
void ah__services_quiesce(ah_mount *m) {
  AH__LIST_EACH(it, &m->timers) {
    ah_timer *t = AH__CONTAINER(it, ah_timer, link);
    uv_timer_stop(&t->handle);
  }
  while (!ah__list_empty(&m->posts)) {
    ah__post *p = AH__CONTAINER(m->posts.next, ah__post, mount_link);
    ah__list_remove(&p->mount_link);
    ah__list_remove(&p->link);
    free(p);
  }
}

void ah__services_withdraw(ah_mount *m) {
  while (!ah__list_empty(&m->timers)) {
    ah_timer *t = AH__CONTAINER(m->timers.next, ah_timer, link);
    AH_LOG_W("services", "plugin %s left a timer running at withdraw; stopped by the host", m->name);
    timer_release(t);
  }
  while (!ah__list_empty(&m->posts)) {
    ah__post *p = AH__CONTAINER(m->posts.next, ah__post, mount_link);
    ah__list_remove(&p->mount_link);
    ah__list_remove(&p->link);
    free(p);
  }
  while (!ah__list_empty(&m->subs))
    ah__bus_unsubscribe(AH__CONTAINER(m->subs.next, ah_sub, mount_link));
  while (!ah__list_empty(&m->procs)) {
    ah_process *p = AH__CONTAINER(m->procs.next, ah_process, link);
    AH_LOG_W("services", "plugin %s left child process %d at withdraw; killed by the host", m->name, p->pid);
    ah__list_remove(&p->link);
    p->orphaned = true;
    ah__process_kill(p, 0);
  }
  while (!ah__list_empty(&m->tokens)) {
    ah_cancel *t = AH__CONTAINER(m->tokens.next, ah_cancel, owner_link);
    ah__cancel_free(t);
  }
  ah__stdio_release(m);
#ifdef AH_HAVE_HTTP
  ah__http_withdraw(m);
#endif
}

ah_host_api ah__api_table = {
    .struct_size = sizeof(ah_host_api),
    .abi = AH_ABI_VERSION,
    .log = api_log,
    .register_method = ah__services_register_method,
    .register_event = ah__services_register_event,
    .register_remote = api_register_remote,
    .call_reply = ah__call_reply,
    .call_error = ah__call_error,
    .call_cancel_token = ah__call_cancel_token,
    .call_caller = ah__call_caller,
    .dispatch = api_dispatch,
    .token_new = api_token_new,
    .token_trip = api_token_trip,
    .token_free = api_token_free,
    .token_tripped = api_token_tripped,
    .token_watch = api_token_watch,
    .token_unwatch = api_token_unwatch,
    .emit = api_emit,
    .subscribe = api_subscribe,
    .unsubscribe = ah__bus_unsubscribe,
    .timer_start = ah__services_timer_start,
    .timer_stop = ah__services_timer_stop,
    .post = ah__services_post,
    .queue_work = ah__services_queue_work,
    .spawn = ah__services_spawn,
    .process_kill = api_process_kill,
    .process_pid = api_process_pid,
    .process_stdin = api_process_stdin,
    .process_stdout = ah__process_stdout,
    .process_stderr = ah__process_stderr,
    .process_close_stdin = ah__process_close_stdin,
    .process_arg = ah__process_arg,
    .process_of_stream = ah__process_of_stream,
    .stdio = api_stdio,
    .host_stop = api_host_stop,
    .register_provider = api_register_provider,
    .host_mode = api_host_mode,
    .remote_describe = api_remote_describe,
    .remote_invoke = api_remote_invoke,
    .session_id = ah__session_id,
    .session_info = ah__session_info,
    .session_update = ah__session_update,
    .call_set_message = ah__call_set_message,
    .stdio_rpc = api_stdio_rpc,
#ifdef AH_HAVE_HTTP
    .http_start = ah__http_start,
    .http_abort = ah__http_abort,
#endif
    .register_tool = api_register_tool,
    .register_tool_source = api_register_tool_source,
    .register_hook = api_register_hook,
    .record_open = api_record_open,
    .record = api_record,
    .record_close = api_record_close,
    .tools_changed = api_tools_changed,
    .call_progress = api_call_progress,
    .rpc = NULL, /* set by ah__host_new (ah_rpc_api_get() is not a constant expression) */
    .loop = api_loop,
    .mount_name = api_mount_name,
    .host_version = api_host_version,
    .state_dir = api_state_dir,
    .runtime_dir = api_runtime_dir,
};
