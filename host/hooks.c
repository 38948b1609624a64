/* Hooks: the chain of one point, command hooks and plugin hooks. See hooks.h. */
#include "hooks.h"

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "config.h"
#include "internal.h"

#define HOOKS_LOG "hooks"
#define HOOK_MAX_OUTPUT (1024 * 1024) /* stdout: the answer (replaced arguments may be large) */
#define HOOK_MAX_REASON 4096          /* bytes of a reason or an error kept */
#define HOOK_MAX_CONTEXT (64 * 1024)  /* bytes of context one hook may add */
#define HOOK_KILL_GRACE_MS 1000

static bool is_tool_point(const char *point) {
  return strcmp(point, "before_tool") == 0 || strcmp(point, "after_tool") == 0;
}

static const char *default_on_error(const char *point) {
  return strcmp(point, "before_tool") == 0 || strcmp(point, "prompt_submit") == 0 ? "deny" : "allow";
}

static bool matches(const json_t *match, const char *point, const char *tool) {
  if (!is_tool_point(point) || json_array_size(match) == 0)
    return true;
  size_t i;
  json_t *p;
  json_array_foreach(match, i, p) {
    if (tool && fnmatch(json_string_value(p), tool, 0) == 0)
      return true;
  }
  return false;
}

static json_int_t timeout_of(const json_t *conf) {
  json_int_t t = json_integer_value(json_object_get(conf, "timeout_ms"));
  return t > 0 ? t : AH_HOOK_DEFAULT_TIMEOUT_MS;
}

static const json_t *config_hooks(ah_host *h) {
  const ah_config *cfg = ah__host_config(h);
  return cfg ? cfg->hooks : NULL;
}

static bool entry_live(const ah__entry *e) {
  return e->kind == AH__ENTRY_HOOK && e->state == AH__ST_ACTIVE && e->mount &&
         e->mount->state == AH__MOUNT_ACTIVE;
}

/* Every hook in the order they run: [{source, name, conf (config) | meta (plugin), plugin?}]. */
static json_t *ordered(ah_host *h) {
  json_t *out = json_array();
  const char *name;
  json_t *hk;
  json_object_foreach((json_t *)config_hooks(h), name, hk) {
    json_array_append_new(out, json_pack("{s:s, s:s, s:O}", "source", "config", "name", name, "conf", hk));
  }
  AH__LIST_EACH(mi, &h->mounts) {
    ah_mount *m = AH__CONTAINER(mi, ah_mount, link);
    AH__LIST_EACH(ji, &m->journal) {
      ah__entry *e = AH__CONTAINER(ji, ah__entry, journal);
      if (entry_live(e))
        json_array_append_new(out, json_pack("{s:s, s:s, s:O, s:s}", "source", "plugin", "name", e->name,
                                             "conf", e->meta, "plugin", m->name));
    }
  }
  return out;
}

static bool applies(const json_t *conf, const char *point, const char *tool) {
  const char *ev = json_string_value(json_object_get(conf, "event"));
  return ev && strcmp(ev, point) == 0 && !json_is_false(json_object_get(conf, "enabled")) &&
         matches(json_object_get(conf, "match"), point, tool);
}

bool ah__hooks_any(ah_host *h, const char *point, const char *tool) {
  if (!h || !point)
    return false;
  const char *name;
  json_t *hk;
  json_object_foreach((json_t *)config_hooks(h), name, hk) {
    if (applies(hk, point, tool))
      return true;
  }
  AH__LIST_EACH(mi, &h->mounts) {
    ah_mount *m = AH__CONTAINER(mi, ah_mount, link);
    AH__LIST_EACH(ji, &m->journal) {
      ah__entry *e = AH__CONTAINER(ji, ah__entry, journal);
      if (entry_live(e) && applies(e->meta, point, tool))
        return true;
    }
  }
  return false;
}

static json_t *describe(json_t *all) {
  json_t *out = json_array();
  size_t i;
  json_t *one;
  json_array_foreach(all, i, one) {
    const json_t *c = json_object_get(one, "conf");
    const char *ev = json_string_value(json_object_get(c, "event"));
    json_t *match = json_object_get(c, "match");
    const char *on_error = json_string_value(json_object_get(c, "on_error"));
    json_t *d =
        json_pack("{s:O, s:s, s:O, s:O, s:I, s:s, s:b}", "name", json_object_get(one, "name"), "event", ev,
                  "source", json_object_get(one, "source"), "match", match ? match : json_null(), "timeoutMs",
                  timeout_of(c), "onError", on_error ? on_error : default_on_error(ev), "enabled",
                  !json_is_false(json_object_get(c, "enabled")));
    if (json_object_get(one, "plugin"))
      json_object_set(d, "plugin", json_object_get(one, "plugin"));
    if (json_object_get(c, "command")) /* the program only: args and env may carry secrets */
      json_object_set(d, "command", json_object_get(c, "command"));
    if (!json_object_get(d, "match") || json_is_null(json_object_get(d, "match")))
      json_object_set_new(d, "match", json_array());
    json_array_append_new(out, d);
  }
  json_decref(all);
  return out;
}

json_t *ah__hooks_describe(ah_host *h) {
  return describe(h ? ordered(h) : json_array());
}

json_t *ah__hooks_describe_config(const json_t *hooks) {
  json_t *all = json_array();
  const char *name;
  json_t *hk;
  json_object_foreach((json_t *)hooks, name, hk) {
    json_array_append_new(all, json_pack("{s:s, s:s, s:O}", "source", "config", "name", name, "conf", hk));
  }
  return describe(all);
}

char *ah__hook_denial(const ah_hook_verdict *v) {
  char *out = NULL;
  const char *hook = v->hook ? v->hook : "?";
  int n = v->reason  ? asprintf(&out, "denied by hook %s: %s", hook, v->reason)
          : v->error ? asprintf(&out, "hook %s failed: %s", hook, v->error)
                     : asprintf(&out, "denied by hook %s", hook);
  return n < 0 ? NULL : out;
}

/* ---- the chain --------------------------------------------------------------------------------------- */

typedef struct chain {
  ah_host *h;
  char *point;
  char *tool;
  json_t *doc;
  char *cwd;
  ah_cancel *cancel;
  ah_hook_record_fn record;
  ah_hooks_done_fn done;
  void *arg;
  json_t *list; /* the hooks of the point, snapshot at the start */
  size_t next;
  json_t *arguments; /* replaced by a hook */
  json_t *context;
  bool deny;
  bool cancelled;
  char *deny_hook;
  char *deny_reason;
  char *deny_error;
  /* the hook running now */
  json_t *cur;
  uint64_t started;
  ah_cancel *call_token; /* a plugin hook's call: tripped by its timeout */
  ah_timer *timer;
  bool timed_out;
} chain;

static void chain_free(chain *c) {
  free(c->point);
  free(c->tool);
  json_decref(c->doc);
  free(c->cwd);
  json_decref(c->list);
  json_decref(c->arguments);
  json_decref(c->context);
  free(c->deny_hook);
  free(c->deny_reason);
  free(c->deny_error);
  free(c);
}

static void chain_next(chain *c);

static void chain_finish(void *arg) {
  chain *c = arg;
  ah_hook_verdict v = {
      .deny = c->deny,
      .cancelled = c->cancelled,
      .hook = c->deny_hook,
      .reason = c->deny_reason,
      .error = c->deny_error,
      .arguments = c->arguments,
      .context = c->context,
  };
  c->done(&v, c->arg);
  chain_free(c);
}

static uint64_t now_ms(ah_host *h) {
  uv_update_time(ah__host_loop(h));
  return uv_now(ah__host_loop(h));
}

/* A bounded, valid UTF-8 copy of `n` bytes at `s` with surrounding blanks trimmed (a new string). */
static json_t *text_of(const char *s, size_t n) {
  while (n && (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')) {
    s++;
    n--;
  }
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == '\t'))
    n--;
  if (n > HOOK_MAX_REASON) {
    n = HOOK_MAX_REASON;
    while (n && ((unsigned char)s[n] & 0xC0) == 0x80) /* not inside a character */
      n--;
  }
  return ah__json_lossy_string(s, n);
}

/* The end of one hook's run: `outcome` allow | amend | deny | error | cancelled. */
static void hook_ended(chain *c, const char *outcome, const char *reason, const char *error) {
  const char *name = json_string_value(json_object_get(c->cur, "name"));
  const json_t *conf = json_object_get(c->cur, "conf");
  const char *on_error = json_string_value(json_object_get(conf, "on_error"));
  if (!on_error)
    on_error = default_on_error(c->point);
  json_t *run = json_pack("{s:s, s:s, s:O, s:s, s:I}", "hook", name, "event", c->point, "source",
                          json_object_get(c->cur, "source"), "outcome", outcome, "durationMs",
                          (json_int_t)(now_ms(c->h) - c->started));
  if (json_object_get(c->cur, "plugin"))
    json_object_set(run, "plugin", json_object_get(c->cur, "plugin"));
  if (reason)
    json_object_set_new(run, "reason", json_string(reason));
  if (error) {
    json_object_set_new(run, "error", json_string(error));
    json_object_set_new(run, "onError", json_string(on_error));
  }
  if (strcmp(outcome, "deny") == 0 || (strcmp(outcome, "error") == 0 && strcmp(on_error, "deny") == 0)) {
    c->deny = true;
    c->deny_hook = strdup(name);
    c->deny_reason = ah__strdup(reason);
    c->deny_error = ah__strdup(error);
  } else if (strcmp(outcome, "cancelled") == 0) {
    c->deny = c->cancelled = true;
    c->deny_hook = strdup(name);
    c->deny_error = strdup("cancelled");
  }
  if (strcmp(outcome, "error") == 0)
    AH_LOG_W(HOOKS_LOG, "hook %s (%s): %s; on_error = %s", name, c->point, error, on_error);
  if (c->record)
    c->record(run, c->arg);
  else
    json_decref(run);
  json_decref(c->cur);
  c->cur = NULL;
  chain_next(c);
}

/* Apply a hook's JSON answer; NULL when fine (with *outcome and *reason), else what is wrong with it. */
static const char *apply_answer(chain *c, const json_t *a, const char **outcome, const char **reason) {
  *outcome = "allow";
  *reason = NULL;
  if (json_is_null(a))
    return NULL;
  if (!json_is_object(a))
    return "the answer is not a JSON object";
  const json_t *dec = json_object_get(a, "decision");
  const json_t *why = json_object_get(a, "reason");
  const json_t *args = json_object_get(a, "arguments");
  const json_t *ctx = json_object_get(a, "context");
  if (dec && (!json_is_string(dec) ||
              (strcmp(json_string_value(dec), "allow") != 0 && strcmp(json_string_value(dec), "deny") != 0)))
    return "decision must be \"allow\" or \"deny\"";
  if (why && !json_is_string(why))
    return "reason must be a string";
  if (args && strcmp(c->point, "before_tool") == 0 && !json_is_object(args))
    return "arguments must be a JSON object";
  if (ctx && !json_is_string(ctx))
    return "context must be a string";
  if (ctx && json_string_length(ctx) > HOOK_MAX_CONTEXT)
    return "context is longer than 64 KiB";
  if (dec && strcmp(json_string_value(dec), "deny") == 0) {
    *outcome = "deny";
    *reason = why && json_string_length(why) ? json_string_value(why) : NULL;
    return NULL;
  }
  if (args && strcmp(c->point, "before_tool") == 0) {
    json_decref(c->arguments);
    c->arguments = json_deep_copy(args);
    json_object_set(json_object_get(c->doc, "tool"), "arguments", c->arguments); /* the next hook sees it */
    *outcome = "amend";
  }
  if (ctx && json_string_length(ctx) &&
      (strcmp(c->point, "prompt_submit") == 0 || strcmp(c->point, "after_tool") == 0)) {
    json_array_append(c->context, (json_t *)ctx);
    *outcome = "amend";
  }
  return NULL;
}

/* ---- a command hook ---------------------------------------------------------------------------------- */

static void command_ended(const ah_command_result *r, void *arg) {
  chain *c = arg;
  const json_t *conf = json_object_get(c->cur, "conf");
  char msg[160];
  if (r->cancelled && ah__cancel_tripped(c->cancel)) {
    hook_ended(c, "cancelled", NULL, NULL);
  } else if (r->error || r->cancelled) {
    snprintf(msg, sizeof msg, "cannot run: %s", r->error ? r->error : "the host is stopping");
    hook_ended(c, "error", NULL, msg);
  } else if (r->timed_out) {
    snprintf(msg, sizeof msg, "timed out after %lld ms", (long long)timeout_of(conf));
    hook_ended(c, "error", NULL, msg);
  } else if (r->signal) {
    const char *abbrev = sigabbrev_np(r->signal);
    snprintf(msg, sizeof msg, "killed by SIG%s", abbrev ? abbrev : "?");
    hook_ended(c, "error", NULL, msg);
  } else if (r->exit_code == 2) {
    json_t *why = text_of(r->err, r->err_len);
    hook_ended(c, "deny", json_string_length(why) ? json_string_value(why) : NULL, NULL);
    json_decref(why);
  } else if (r->exit_code != 0) {
    snprintf(msg, sizeof msg, "exited with status %lld", (long long)r->exit_code);
    hook_ended(c, "error", NULL, msg);
  } else if (r->truncated) {
    hook_ended(c, "error", NULL, "its output is longer than 1 MiB");
  } else {
    json_t *out = text_of(r->out, r->out_len); /* only to see whether it is blank */
    bool blank = json_string_length(out) == 0;
    json_decref(out);
    json_t *a = blank ? json_null() : json_loadb(r->out, r->out_len, JSON_DECODE_ANY, NULL);
    const char *outcome = NULL;
    const char *reason = NULL;
    const char *bad = a ? apply_answer(c, a, &outcome, &reason) : "its output is not JSON";
    char *reason_copy = reason ? strdup(reason) : NULL;
    json_decref(a);
    if (bad)
      hook_ended(c, "error", NULL, bad);
    else
      hook_ended(c, outcome, reason_copy, NULL);
    free(reason_copy);
  }
}

static int run_command_hook(chain *c, const json_t *conf, const char *input, size_t input_len) {
  const json_t *args = json_object_get(conf, "args");
  const json_t *env = json_object_get(conf, "env");
  size_t na = json_array_size(args), ne = json_array_size(env);
  const char **argv = calloc(na + 2, sizeof *argv);
  const char **envv = calloc(ne + 4, sizeof *envv);
  char *extra[3] = {NULL, NULL, NULL};
  int rc = AH_ENOMEM;
  if (argv && envv &&
      asprintf(&extra[0], "AGENTHOST_HOOK=%s", json_string_value(json_object_get(c->cur, "name"))) >= 0 &&
      asprintf(&extra[1], "AGENTHOST_HOOK_EVENT=%s", c->point) >= 0 &&
      asprintf(&extra[2], "AGENTHOST_SESSION_ID=%s",
               json_string_value(json_object_get(c->doc, "sessionId")) ?: "") >= 0) {
    argv[0] = json_string_value(json_object_get(conf, "command"));
    for (size_t i = 0; i < na; i++)
      argv[i + 1] = json_string_value(json_array_get(args, i));
    for (size_t i = 0; i < ne; i++)
      envv[i] = json_string_value(json_array_get(env, i));
    for (size_t i = 0; i < 3; i++)
      envv[ne + i] = extra[i];
    const char *cwd = json_string_value(json_object_get(conf, "cwd"));
    ah_command_opts o = {
        .argv = argv,
        .env = envv,
        .cwd = cwd ? cwd : c->cwd,
        .input = input,
        .input_len = input_len,
        .max_output = HOOK_MAX_OUTPUT,
        .timeout_ms = (uint64_t)timeout_of(conf),
        .kill_grace_ms = HOOK_KILL_GRACE_MS,
        .cancel = c->cancel,
    };
    rc = ah__command_run(c->h, &o, command_ended, c);
  }
  for (size_t i = 0; i < 3; i++)
    free(extra[i]);
  free(argv);
  free(envv);
  return rc;
}

/* ---- a plugin hook ----------------------------------------------------------------------------------- */

static void plugin_timeout(ah_timer *t, void *arg) {
  (void)t;
  chain *c = arg;
  c->timer = NULL;
  c->timed_out = true;
  ah__cancel_trip(c->call_token);
}

static void plugin_replied(const ah_outcome *o, void *arg) {
  chain *c = arg;
  if (c->timer)
    ah__services_timer_stop(c->timer);
  c->timer = NULL;
  ah__cancel_free(c->call_token);
  c->call_token = NULL;
  const json_t *conf = json_object_get(c->cur, "conf");
  char msg[HOOK_MAX_REASON + 64];
  if (o->status == AH_ECANCELED && ah__cancel_tripped(c->cancel)) {
    hook_ended(c, "cancelled", NULL, NULL);
  } else if (o->status == AH_ECANCELED) {
    if (c->timed_out)
      snprintf(msg, sizeof msg, "timed out after %lld ms", (long long)timeout_of(conf));
    else
      snprintf(msg, sizeof msg, "its plugin was withdrawn during the call");
    hook_ended(c, "error", NULL, msg);
  } else if (o->status) {
    snprintf(msg, sizeof msg, "%.*s", HOOK_MAX_REASON, o->message ? o->message : ah_strerror(o->status));
    hook_ended(c, "error", NULL, msg);
  } else {
    const char *outcome = NULL;
    const char *reason = NULL;
    const char *bad = apply_answer(c, o->result, &outcome, &reason);
    char *reason_copy = reason ? strndup(reason, HOOK_MAX_REASON) : NULL;
    if (bad)
      hook_ended(c, "error", NULL, bad);
    else
      hook_ended(c, outcome, reason_copy, NULL);
    free(reason_copy);
  }
}

static int run_plugin_hook(chain *c, json_t *doc) {
  const char *name = json_string_value(json_object_get(c->cur, "name"));
  ah__entry *e = ah__registry_find(&c->h->reg, AH__ENTRY_HOOK, name);
  if (!e || !entry_live(e)) { /* withdrawn while an earlier hook ran */
    json_decref(doc);
    hook_ended(c, "error", NULL, "its plugin was withdrawn");
    return 0;
  }
  c->call_token = ah__cancel_new(c->cancel);
  if (!c->call_token) {
    json_decref(doc);
    return AH_ENOMEM;
  }
  c->timed_out = false;
  const json_t *conf = json_object_get(c->cur, "conf");
  if (ah__services_timer_start(ah__host_core_mount(c->h), (uint64_t)timeout_of(conf), 0, plugin_timeout, c,
                               &c->timer) != 0)
    c->timer = NULL;
  ah_caller core = {.struct_size = sizeof core, .authority = AH_AUTH_ADMIN, .surface = "core"};
  ah_call *call = NULL;
  int rc = ah__call_new(c->h, e, &core, name, doc, true, false, c->call_token, plugin_replied, c, &call);
  if (rc) {
    if (c->timer)
      ah__services_timer_stop(c->timer);
    c->timer = NULL;
    ah__cancel_free(c->call_token);
    c->call_token = NULL;
    return rc;
  }
  if (call) /* NULL: the chain was already cancelled, and the call answered so */
    e->handler(call, call->params, e->data);
  return 0;
}

/* ---- the chain's steps ------------------------------------------------------------------------------- */

static void chain_next(chain *c) {
  while (!c->deny && c->next < json_array_size(c->list)) {
    c->cur = json_incref(json_array_get(c->list, c->next++));
    c->started = now_ms(c->h);
    const json_t *conf = json_object_get(c->cur, "conf");
    json_t *doc = json_copy(c->doc);
    json_object_set_new(doc, "event", json_string(c->point));
    json_object_set(doc, "hook", json_object_get(c->cur, "name"));
    int rc;
    if (strcmp(json_string_value(json_object_get(c->cur, "source")), "config") == 0) {
      char *input = json_dumps(doc, JSON_COMPACT);
      json_decref(doc);
      size_t n = input ? strlen(input) : 0;
      char *line = input ? realloc(input, n + 2) : NULL;
      if (line) {
        line[n] = '\n';
        line[n + 1] = '\0';
      } else {
        free(input);
      }
      rc = line ? run_command_hook(c, conf, line, n + 1) : AH_ENOMEM;
      free(line);
    } else {
      rc = run_plugin_hook(c, doc);
    }
    if (rc == 0)
      return; /* its end calls chain_next again */
    hook_ended(c, "error", NULL, ah_strerror(rc));
    return;
  }
  /* Never from inside ah__hooks_run: the caller sees `done` on a later loop turn. */
  if (ah__services_post(ah__host_core_mount(c->h), chain_finish, c) != 0)
    chain_finish(c);
}

static void chain_start(void *arg) {
  chain_next(arg);
}

int ah__hooks_run(ah_host *h, const char *point, const char *tool, const json_t *doc, const char *cwd,
                  ah_cancel *cancel, ah_hook_record_fn record, ah_hooks_done_fn done, void *arg) {
  if (!h || !point || !done)
    return AH_EINVAL;
  chain *c = calloc(1, sizeof *c);
  if (!c)
    return AH_ENOMEM;
  c->h = h;
  c->point = strdup(point);
  c->tool = ah__strdup(tool);
  /* A copy of the top and of `tool` (whose arguments a hook may replace); the rest is shared, never changed
   * (a large prompt is not copied). */
  c->doc = doc ? json_copy((json_t *)doc) : json_object();
  if (c->doc && json_is_object(json_object_get(c->doc, "tool")))
    json_object_set_new(c->doc, "tool", json_copy(json_object_get(c->doc, "tool")));
  c->cwd = strdup(cwd && cwd[0] == '/' ? cwd : "/");
  c->cancel = cancel;
  c->record = record;
  c->done = done;
  c->arg = arg;
  c->context = json_array();
  c->list = json_array();
  json_t *all = ordered(h);
  size_t i;
  json_t *one;
  json_array_foreach(all, i, one) {
    if (applies(json_object_get(one, "conf"), point, tool))
      json_array_append(c->list, one);
  }
  json_decref(all);
  if (!c->point || !c->doc || !c->cwd || !c->context || (tool && !c->tool)) {
    chain_free(c);
    return AH_ENOMEM;
  }
  if (ah__services_post(ah__host_core_mount(h), chain_start, c) != 0) {
    chain_free(c);
    return AH_ENOMEM;
  }
  return 0;
}
